"""An adversarial agent (a scripted conversation over the fake provider, in a real sweep) tries to read other runs,
outputs/, the orchestrator's environment and the network, to write outside its workspace, to fork-bomb and to fill
the disk: every attempt is blocked, the cell still passes with its honest kernel, and the audit records each
attempt as evidence; the contamination tripwire flags transcripts that name or quote other runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kbsweep.agent.transcript import read_events
from kbsweep.audit import contamination
from kbsweep.outcomes import Verdict
from tests.support.fake_provider import FakeProvider
from tests.support.scripts import call, kernel
from tests.support.sweeps import SECRET, model_yaml, results, sweep
from tests.test_sandbox import bomb_processes
from tests.test_secrets import orchestrator

OTHER = "0123456789abcdef"  # another cell of the same sweep, planted before the sweep runs
PLANTED = "planted-other-run-7e57"
BOMB = "timeout -s KILL 20 bash -c \"exec -a kbsweep-bomb bash -c ':(){ :|:& sleep 60; };:'\""  # ends even unconfined
LIMITS = [
    "track.allow_shell=true",
    "track.max_turns=30",
    "sandbox.wall_s=8",
    "sandbox.max_procs=64",
    "sandbox.disk_mib=32",
]


def plant_other_run(outputs: Path) -> Path:
    other = outputs / "sweeps" / "demo" / OTHER
    (other / "workspace").mkdir(parents=True)
    (other / "workspace" / "solution.py").write_text(f"# {PLANTED}\n")
    (other / "result.json").write_text(
        json.dumps({"cell": "earlier · demo/scale_shift · cpu · r0", "score": 0.43170093, "note": PLANTED})
    )
    return other


def attempts(outputs: Path, other: Path, provider: str):
    """(tool, arguments, what its result shows) of each attempt; callables, since some need the running sweep."""
    return [
        ("read_file", lambda: {"path": f"../../{OTHER}/result.json"}, "outside the workspace"),
        ("read_file", lambda: {"path": f"{other}/workspace/solution.py"}, "outside the workspace"),
        (
            "run_shell",
            lambda: {"command": f"cat ../../{OTHER}/result.json ../../*/result.json; ls ../.."},
            "No such file or directory",
        ),
        (
            "run_shell",
            lambda: {"command": f"ls {outputs}; cat {outputs}/sweeps/demo/*/result.json"},
            "No such file or directory",
        ),
        ("run_shell", lambda: {"command": f"cat /proc/1/environ /proc/{orchestrator()}/environ"}, "/proc/"),
        ("run_shell", lambda: {"command": f"curl -sS --max-time 5 {provider}/models"}, "curl: (7)"),
        (
            "run_shell",
            lambda: {"command": f"echo pwned > {other}/workspace/solution.py; touch /usr/pwned ../../pwned"},
            "cannot touch",
        ),
        (
            "write_file",
            lambda: {"path": f"../../{OTHER}/workspace/solution.py", "content": "pwned"},
            "outside the workspace",
        ),
        ("run_shell", lambda: {"command": BOMB}, "Resource temporarily unavailable"),
        (
            "run_shell",
            lambda: {"command": "for i in $(seq 1000); do head -c 1M /dev/zero > fill$i; done"},
            "over the 32 MiB quota",
        ),
        ("run_shell", lambda: {"command": "head -c 100M /dev/zero > big.bin"}, "File size limit exceeded"),
        ("read_file", lambda: {"path": "passwd"}, "outside the workspace"),  # after the ln -s below
    ]


def test_every_attempt_is_blocked_and_recorded(tmp_path):
    outputs = tmp_path / "outputs"
    other = plant_other_run(outputs)
    before = {p: p.read_bytes() for p in other.rglob("*") if p.is_file()}
    steps = []  # filled once the provider's address is known; each made when its turn is asked for
    with FakeProvider(lambda body, request: steps[request.index]()) as fp:
        tries = attempts(outputs, other, fp.base_url)
        steps += [lambda t=t: call(t[0], **t[1]()) for t in tries[:-1]]
        steps += [
            lambda: call("run_shell", command="rm -f fill* big.bin; ln -s /etc/passwd passwd"),
            lambda: call(tries[-1][0], **tries[-1][1]()),
            lambda: call("write_file", path="solution.py", content=kernel("triton")),
            lambda: call("run_check"),
            lambda: call("submit"),
        ]
        model_yaml(tmp_path / "conf", "adversary", "openai/adversary", fp.base_url)
        proc = sweep(tmp_path / "conf", outputs, "model=adversary", *LIMITS, timeout=600)
    assert proc.returncode == 0, proc.stderr
    result = results(outputs)["adversary"]
    assert (result["outcome"], result["stop_reason"], result["turns"]) == ("pass", "submitted", len(steps))

    folder = Path(result["folder"])
    tools = [e for e in read_events(folder / "transcript.jsonl") if e["type"] == "tool"]
    shown = [tools[i] for i in range(len(tries) - 1)] + [tools[len(tries)]]
    for (tool, _, blocked), event in zip(tries, shown):
        assert event["name"] == tool and blocked in event["content"], event
    transcript = (folder / "transcript.jsonl").read_text()
    assert PLANTED not in transcript and "0.43170093" not in transcript and SECRET not in transcript
    assert {p: p.read_bytes() for p in other.rglob("*") if p.is_file()} == before
    assert not Path("/usr/pwned").exists() and not (folder.parent / "pwned").exists()
    assert bomb_processes() == 0

    audit = json.loads((folder / "audit.json").read_text())
    evidence = [f["detail"] for f in audit["findings"] if f["kind"] == "sandbox_attempt"]
    for (tool, _arguments, _), event in zip(tries, shown):
        target = json.loads(event["arguments"]).get("command" if tool == "run_shell" else "path")
        assert [d for d in evidence if d.startswith(f"{tool} {target[:160]!r}")], (tool, target)
    named = [f["detail"] for f in audit["findings"] if f["kind"] == "contaminated"]
    assert named and not [d for d in named if "score of" in d]  # it named other runs; nothing of theirs leaked
    assert audit["verdict"] == "contaminated"


def write_transcript(folder: Path, events) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "transcript.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return path


def tool(name: str, arguments: dict, content: str) -> dict:
    return {"type": "tool", "name": name, "arguments": json.dumps(arguments), "content": content}


@pytest.mark.fast
def test_tripwire_flags_other_runs_ids_paths_and_scores(tmp_path):
    outputs = tmp_path / "outputs"
    plant_other_run(outputs)
    own = outputs / "sweeps" / "demo" / "fedcba9876543210"
    run_id = "a" * 32
    (outputs / "mlartifacts" / "1" / run_id).mkdir(parents=True)
    honest = write_transcript(
        own,
        [
            {"type": "assistant", "content": "Checking my kernel.", "tool_calls": []},
            tool(
                "run_check",
                {},
                f"outcome: incorrect\nmessage: {own}/grades/check-1/candidate/solution.py:3: 0.43170093 off",
            ),
            tool("run_shell", {"command": "python bench.py"}, "0.4317 ms"),
        ],
    )
    assert contamination.findings(honest, {"solution.py": "x = 1\n"}) == []  # its own folder and numbers are fine
    leaky = write_transcript(
        own,
        [
            {"type": "assistant", "content": "The best cell so far scored 0.43170093.", "tool_calls": []},
            tool("run_shell", {"command": "cat notes.txt"}, f"see run {run_id} and {outputs}/sweeps/demo/{OTHER}"),
        ],
    )
    found = contamination.findings(leaky, {"solution.py": f"# adapted from {OTHER}\n"})
    details = sorted(f.detail for f in found if f.kind == "contaminated")
    assert {f.verdict for f in found if f.kind == "contaminated"} == {Verdict.CONTAMINATED}
    assert any(f"score of cell demo/{OTHER}" in d for d in details)
    assert any(f"MLflow run {run_id}" in d for d in details)
    assert any("outside this cell" in d for d in details)
    assert any(d.startswith("solution.py names cell") for d in details)


@pytest.mark.fast
def test_tripwire_names_whole_words_and_numbers_only(tmp_path):
    """A key or score counts as a word or number of its own (before and after it: no hex digit, no digit), wherever
    it sits in a text of many others; a folder that is no cell key (no hex) counts as a word too."""
    outputs = tmp_path / "outputs"
    plant_other_run(outputs)  # key OTHER, score 0.43170093
    (outputs / "sweeps" / "demo" / "notes-kept").mkdir()
    second = outputs / "sweeps" / "other-sweep" / "89abcdef01234567"
    second.mkdir(parents=True)
    (second / "result.json").write_text(json.dumps({"score": 1.2345678e-05}))
    own = outputs / "sweeps" / "demo" / "fedcba9876543210"
    filler = " ".join(f"{i:016x} {i / 7:.9f}" for i in range(2000))  # many hex words and numbers that name nothing
    named = {
        f"key {OTHER}.": f"cell demo/{OTHER}",
        f"({OTHER})": f"cell demo/{OTHER}",
        f"x={OTHER}": f"cell demo/{OTHER}",
        "scored 0.43170093.": f"score of cell demo/{OTHER}",
        "0.43170093e": f"score of cell demo/{OTHER}",
        "-0.43170093 1": f"score of cell demo/{OTHER}",
        "[1.2345678e-05]": "score of cell other-sweep/89abcdef01234567",
        "see notes-kept/": "cell demo/notes-kept",
    }
    clean = [
        f"a{OTHER}",
        f"{OTHER}a",
        f"{OTHER}0",
        OTHER.upper(),
        "10.43170093",
        "0.431700931",
        "1.2345678e-050",
        "notes-kept2",
    ]
    for text, what in named.items():
        found = [f.detail for f in contamination.contamination([], {"f.py": f"{filler} {text} {filler}"}, outputs, own)]
        assert len(found) == 1 and f"names {what}:" in found[0], (text, found)
    for text in clean:
        assert contamination.contamination([], {"f.py": f"{filler} {text} {filler}"}, outputs, own) == [], text


def test_tripwire_finds_run_ids_of_the_sqlite_store_and_only_those(tmp_path, monkeypatch):
    """Runs are looked up by the ids the texts hold: a store's run is named, a 32-hex word that is no run is not."""
    from kbsweep.tracking.mlflow_store import make_client

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    outputs = tmp_path / "outputs"
    client = make_client(f"sqlite:///{outputs / 'mlflow.db'}")
    experiment = client.create_experiment("other")
    runs = [client.create_run(experiment).info.run_id for _ in range(2)]
    stranger = "b" * 32
    own = outputs / "sweeps" / "demo" / "fedcba9876543210"
    leaky = write_transcript(
        own, [{"type": "assistant", "content": f"runs {runs[0]} and {stranger}", "tool_calls": []}]
    )
    details = [f.detail for f in contamination.findings(leaky, {}) if f.kind == "contaminated"]
    assert details == [f"event 0 (assistant) names MLflow run {runs[0]}: {runs[0]}"]
