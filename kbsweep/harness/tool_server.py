"""kbsweep's tools inside a CLI harness's sandbox; each call is run by the model proxy (the built-in loop's tool).

Copied into the sandbox as ``kbsweep-check`` beside a ``tools.json`` (the proxy's URL, the cell's token, the
tools' schemas); standard library only, since kbsweep itself is not in the sandbox. Two ways in:

* ``kbsweep-check`` / ``kbsweep-check --bench`` / ``kbsweep-check --profile``: a shell command, ``run_check`` /
  ``run_benchmark`` / ``run_profile``; exit code 0 when the solution passes.
* ``kbsweep-check --mcp``: an MCP server on stdin/stdout (JSON-RPC, one message a line) offering the tools of
  ``tools.json``: how a CLI without a shell (``track.allow_shell: false``) writes, reads and checks.
"""

import json
import sys
import urllib.request
from pathlib import Path


def call(conf, name, arguments):
    """The proxy's answer to one tool call: ``{"output": text, "outcome": the grade's outcome or null}``."""
    data = json.dumps({"name": name, "arguments": arguments}).encode()
    request = urllib.request.Request(conf["url"] + "/kbsweep/tool", data=data, headers={"x-api-key": conf["token"]})
    return json.load(urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request))


def answer(conf, message):
    """The JSON-RPC result of one request."""
    method, params = message.get("method"), message.get("params") or {}
    if method == "initialize":
        return {
            "protocolVersion": params.get("protocolVersion", "2025-06-18"),
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "kbsweep", "version": "1"},
        }
    if method == "tools/list":
        return {
            "tools": [
                {"name": t["name"], "description": t["description"], "inputSchema": t["parameters"]}
                for t in conf["tools"]
            ]
        }
    if method == "tools/call":
        output = call(conf, params["name"], params.get("arguments") or {})["output"]
        return {"content": [{"type": "text", "text": output}], "isError": output.startswith("error:")}
    return {}  # ping, and anything else the server has nothing to say about


def serve(conf):
    for line in sys.stdin:
        message = json.loads(line)
        if "id" not in message:  # a notification: no reply
            continue
        try:
            reply = {"jsonrpc": "2.0", "id": message["id"], "result": answer(conf, message)}
        except Exception as exc:  # noqa: BLE001 - the client shows the error to the model; the server keeps serving
            reply = {
                "jsonrpc": "2.0",
                "id": message["id"],
                "error": {"code": -32603, "message": f"{type(exc).__name__}: {exc}"},
            }
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    CONF = json.loads(Path(__file__).resolve().with_name("tools.json").read_text())
    if "--mcp" in sys.argv[1:]:
        serve(CONF)
    else:
        flags = {"--bench": "run_benchmark", "--profile": "run_profile"}
        result = call(CONF, next((flags[a] for a in sys.argv[1:] if a in flags), "run_check"), {})
        print(result["output"])
        sys.exit(0 if result["outcome"] == "pass" else 1)
