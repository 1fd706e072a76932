"""A sandbox's only ways out: a forwarder inside it (127.0.0.1:PROXY_PORT to a unix socket bound in), and on the
host the servers behind that socket: :class:`Relay` (to a harness's model proxy) and :class:`AllowProxy` (an HTTP
CONNECT proxy to the ``network_allow`` hosts). Without them a confined command has no network at all."""

from __future__ import annotations

import inspect
import os
import shutil
import socket
import socketserver
import sys
import threading
from typing import List, Sequence, Tuple
from urllib.parse import urlsplit

from kbsweep.paths import owned_tempdir

BASH = "/bin/bash"


PROXY_PORT = 3128


PROXY_SOCKET = "/tmp/.kbsweep-proxy.sock"


PROXY_READY = "/tmp/.kbsweep-proxy-ready"


def pump(source, sink) -> None:
    """Copy one socket into another until EOF, then half-close the sink."""
    try:
        while True:
            data = source.recv(65536)
            if not data:
                break
            sink.sendall(data)
    except OSError:
        pass
    try:
        sink.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def splice(client, upstream) -> None:
    """Copy both ways until both sides are done."""
    back = threading.Thread(target=pump, args=(upstream, client), daemon=True)
    back.start()
    pump(client, upstream)
    back.join()


FORWARDER = (
    inspect.getsource(pump)
    + f"""
import socket, threading
listener = socket.create_server(("127.0.0.1", {PROXY_PORT}))
open("{PROXY_READY}", "w").close()
while True:
    client, _ = listener.accept()
    upstream = socket.socket(socket.AF_UNIX)
    upstream.connect("{PROXY_SOCKET}")
    threading.Thread(target=pump, args=(client, upstream), daemon=True).start()
    threading.Thread(target=pump, args=(upstream, client), daemon=True).start()
"""
)  # runs inside the sandbox: 127.0.0.1:PROXY_PORT -> the proxy's unix socket


WITH_FORWARDER = f'"{sys.executable}" -c "$1" & until [ -e {PROXY_READY} ]; do sleep 0.02; done; exec {BASH} -c "$2"'


class UnixSocketServer:
    """A threaded server on a unix socket any uid may connect to (a sandbox binds it at PROXY_SOCKET, where
    :data:`FORWARDER` reaches it); :meth:`serve` handles one connection."""

    def __init__(self):
        self.folder = owned_tempdir("proxy")
        self.path = self.folder / "proxy.sock"
        owner = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self):
                owner.serve(self.request)

        self.server = socketserver.ThreadingUnixStreamServer(str(self.path), Handler)
        self.server.daemon_threads = True
        os.chmod(self.folder, 0o755)
        os.chmod(self.path, 0o666)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def serve(self, client) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        shutil.rmtree(self.folder, ignore_errors=True)


class Relay(UnixSocketServer):
    """Carries each connection to one TCP address of this host: how a sandbox without network reaches a server
    the orchestrator runs on loopback (the model proxy of a CLI harness)."""

    def __init__(self, address: Tuple[str, int]):
        self.address = address
        super().__init__()

    def serve(self, client) -> None:
        with socket.create_connection(self.address) as upstream:
            splice(client, upstream)


class AllowProxy(UnixSocketServer):
    """An HTTP proxy (CONNECT and absolute-URI requests) on a unix socket that dials only allowed hosts
    (``host`` or ``host:port``) and records the others in ``refused``."""

    def __init__(self, allow: Sequence[str]):
        self.allow = set(allow)
        self.refused: List[str] = []  # host:port
        super().__init__()

    def serve(self, client) -> None:
        head = b""
        while b"\r\n\r\n" not in head and len(head) < 65536:
            chunk = client.recv(4096)
            if not chunk:
                return
            head += chunk
        method, target = (head.split(b"\r\n", 1)[0].decode("latin-1").split(" ") + ["", ""])[:2]
        if method == "CONNECT":
            host, _, port = target.rpartition(":")
        else:
            url = urlsplit(target)
            host, port = url.hostname or "", str(url.port or 80)
        if host not in self.allow and f"{host}:{port}" not in self.allow:
            self.refused.append(f"{host}:{port}")
            client.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            return
        try:
            upstream = socket.create_connection((host, int(port)), timeout=30)
        except (OSError, ValueError):
            client.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            return
        with upstream:
            upstream.settimeout(None)
            if method == "CONNECT":
                client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                upstream.sendall(head)
            splice(client, upstream)
