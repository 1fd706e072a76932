"""kbsweep's whole CLI on a GPU machine, checked: the carried wheels installed, the scripted sweeps of the GPU
tracks, every bundled solution graded directly, ``kbsweep regrade`` (of the track with the fewest problems) and
``kbsweep report``, then the checks.

    python3 scripts/gpu_sweep.py OUT [--gpu auto] [--only hard,mega,proof,multi] [--direct all|scored] [--tolerance 0.02] [--deadline-s 540]

Run with the interpreter that holds CUDA torch, from the repository's root (no package registry needed: where
``.carry/`` exists, scripts/gpu_carry.sh built it, and it is installed first as that script says). ``--only``
takes tracks and ``track/problem`` names. Each track is swept ``-m`` over ``scripted`` (``scripted-p2p`` on
``multi``, whose correct solutions are ``p2p.py``) and ``scripted-lazy``; ``multi`` at world size 1 (torchrun
still starts its ranks). Every solution of the swept problems is graded with ``kbsweep grade`` under the same
settings, one at a time after the sweeps (a launch-bound call's time moves with what else runs on the host:
each direct grade has it to itself, each cell shares it only with its own sweep); ``--direct scored``
grades the solutions meant to score only, the wrong ones left to the ``scripted-lazy`` cells. The checks: every
correct solution passes with a score and no finding (but those in ``FLAGGED``, with their finding), every ``wrong.py`` is ``incorrect``; each cell's outcome
is its final solution's, and its score is within ``--tolerance`` of that file's direct grade (as is each
regrade's of its cell's), a cell that ended on a ``wrong.py`` graded nowhere else is ``incorrect``, a cell of
another solution does not pass; every other command exits 0; the MLflow store
holds a run and a trace per cell. ``multi``'s ``wrong.py`` files are exact at world size 1 (each says so): graded,
not expected incorrect.

Grades use QUICK's settings (2 s of timing a shape, no baseline but a problem's own ``baseline.py``, which the
speedup-scored tracks need). Steps not started by ``--deadline-s`` are skipped and said so, and a running one is
interrupted there, so the summary and outputs still come back from a command limited to 10 minutes.
OUT gets summary.json, log.txt (every command's output), outputs.tar.gz (the MLflow store and its artifacts,
the reports, the direct grades' JSON) and, from before the install, the host's pip_freeze.txt.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent  # kbsweep's entry point lands beside the interpreter that holds torch
TRACKS = ("hard", "mega", "proof", "multi")
QUICK = ["grade.timing.max_time_s=2", "grade.baselines=[baseline]"]
# bundled solutions that are correct but must be flagged (each says why in its docstring), with the finding
FLAGGED = {"mega/dense_decode/graph.py": "launch_count_gate"}
RESERVE_S = 60  # kept for the report, the checks and the archive after the deadline


class Runner:
    """Commands with a shared deadline, their output appended to one log, each a dict in ``steps``."""

    def __init__(self, out: Path, deadline_s: float, env: Dict[str, str]):
        self.log = open(out / "log.txt", "a")
        self.lock = threading.Lock()
        self.end = time.monotonic() + deadline_s
        self.env = env
        self.steps: List[Dict[str, Any]] = []

    def left(self) -> float:
        return self.end - time.monotonic()

    def run(self, words: List[str], name: str, late_ok: bool = False) -> Dict[str, Any]:
        """``words`` run to its end, or interrupted at the deadline (Ctrl-C to its process group, then SIGKILL);
        a step not started before the deadline is skipped. ``late_ok``: may run up to RESERVE_S past it."""
        limit = self.left() + (RESERVE_S * 0.8 if late_ok else 0)
        step: Dict[str, Any] = {"name": name, "command": " ".join(words)}
        if limit <= 1:
            step.update(rc=None, skipped="deadline")
            self.record(step, "")
            return step
        started = time.monotonic()
        proc = subprocess.Popen(
            words,
            cwd=REPO,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            stdout, stderr = proc.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGINT)  # kbsweep closes its runs on Ctrl-C
            try:
                stdout, stderr = proc.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                stdout, stderr = proc.communicate()
            step["interrupted"] = "deadline"
        step.update(rc=proc.returncode, s=round(time.monotonic() - started, 1), stdout=stdout)
        self.record(step, stderr)
        return step

    def record(self, step: Dict[str, Any], stderr: str) -> None:
        with self.lock:
            self.steps.append(step)
            self.log.write(
                f"$ {step['command']}\n{stderr}[rc={step['rc']} {step.get('s', 0)} s {step.get('skipped') or step.get('interrupted') or ''}]\n\n"
            )
            self.log.flush()
        print(
            f"[gpu_sweep] {step['name']}: rc={step['rc']} {step.get('s', '-')} s {step.get('skipped') or step.get('interrupted') or ''}",
            flush=True,
        )


def install(out: Path, runner: Runner) -> None:
    """The carried wheels (and bubblewrap where there is none) into this interpreter, kbsweep editable; the host's
    packages as they were first, in pip_freeze.txt."""
    carry = REPO / ".carry"
    if not carry.is_dir():
        return
    freeze = subprocess.run([sys.executable, "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True)
    (out / "pip_freeze.txt").write_text(freeze.stdout)
    if shutil.which("bwrap") is None:
        for deb in sorted(carry.glob("*.deb")):
            runner.run(["dpkg", "-x", str(deb), "/"], f"unpack {deb.name}")
    wheels = [str(w) for w in sorted(carry.glob("*.whl"))]
    runner.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--no-deps",
            "--no-build-isolation",
            *wheels,
            "-e",
            str(REPO),
        ],
        "install",
    )


def environment(runner: Runner) -> Dict[str, Any]:
    probe = (
        "import json, platform, torch, triton; from kbsweep.sandbox.confine import self_test; "
        "print(json.dumps({'python': platform.python_version(), 'torch': torch.__version__, 'triton': triton.__version__, "
        "'cuda': torch.version.cuda, 'gpu': torch.cuda.get_device_name() if torch.cuda.is_available() else None, "
        "'unconfined': self_test() or None}))"
    )
    step = runner.run([sys.executable, "-c", probe], "environment")
    return json.loads(step["stdout"]) if step["rc"] == 0 else {"error": "probe failed: see log.txt"}


def targets(only: List[str]) -> Dict[str, List[str]]:
    """Track → its problems with bundled solutions, narrowed by ``--only``'s names."""
    chosen: Dict[str, List[str]] = {}
    for name in only:
        track, _, problem = name.partition("/")
        found = sorted(p.parent.name for p in (REPO / "problems" / track).glob("*/solutions"))
        chosen.setdefault(track, []).extend(p for p in found if problem in ("", p))
    return chosen


def track_overrides(track: str, gpu: str, sandbox: List[str]) -> List[str]:
    return [f"gpu={gpu}", f"track={track}", *QUICK, *sandbox, *(["track.world_size=1"] if track == "multi" else [])]


def p2p_model(conf: Path) -> None:
    """``scripted`` playing ``p2p.py`` as its fixed kernel: the multi track's correct solutions."""
    text = (REPO / "conf/model/scripted.yaml").read_text().replace("name: scripted\n", "name: scripted-p2p\n")
    (conf / "model").mkdir(parents=True, exist_ok=True)
    (conf / "model/scripted-p2p.yaml").write_text(text.replace("solution: triton}", "solution: p2p}"))


def sweep(runner: Runner, track: str, problems: List[str], every: List[str], overrides: List[str], conf: Path) -> None:
    model = "scripted-p2p" if track == "multi" else "scripted"
    narrow = [] if problems == every else [f"problem=[{','.join(problems)}]"]
    runner.run(
        [
            str(BIN / "kbsweep"),
            "-cd",
            str(conf),
            "-m",
            f"model={model},scripted-lazy",
            "launcher.concurrency=4",
            *overrides,
            *narrow,
        ],
        f"sweep {track}",
    )


def grade(runner: Runner, track: str, problem: str, solution: Path, overrides: List[str], keep: Path) -> Dict[str, Any]:
    """``kbsweep grade`` of one file, its JSON kept under ``keep``; what the checks read of it."""
    step = runner.run(
        [str(BIN / "kbsweep"), "grade", f"problem={track}/{problem}", f"solution={solution}", *overrides],
        f"grade {track}/{problem}/{solution.name}",
    )
    try:
        result = json.loads(step.get("stdout") or "")  # none from a step skipped at the deadline
    except ValueError:
        result = {}
    keep.mkdir(parents=True, exist_ok=True)
    (keep / f"{track}_{problem}_{solution.stem}.json").write_text(step.get("stdout") or "")
    return {
        "track": track,
        "problem": problem,
        "solution": solution.name,
        "rc": step["rc"],
        "s": step.get("s"),
        "outcome": result.get("outcome"),
        "score": result.get("score"),
        "findings": sorted({f["kind"] for f in result.get("findings") or []}),
        "message": result.get("message"),
        "sha": hashlib.sha256(solution.read_bytes()).hexdigest(),
    }


def cells(outputs: Path, tracks: List[str]) -> List[Dict[str, Any]]:
    """Each swept cell's result as its journal holds it, with its final solution's hash."""
    found = []
    for track in tracks:
        for journal in sorted((outputs / "sweeps" / track).glob("*/result.json")):
            result = json.loads(journal.read_text())
            solution = journal.with_name("solution.py")
            found.append(
                {
                    "track": track,
                    "cell": result.get("cell"),
                    "outcome": result.get("outcome"),
                    "verdict": result.get("verdict"),
                    "score": result.get("score"),
                    "sha": hashlib.sha256(solution.read_bytes()).hexdigest() if solution.exists() else None,
                }
            )
    return found


def store(outputs: Path) -> Dict[str, Any]:
    """Runs and traces per experiment in the MLflow store, their spans (rows or ``traces.json`` files), and each
    regrade's score beside its cell's."""
    path = outputs / "mlflow.db"
    if not path.exists():
        return {"exists": False}
    with sqlite3.connect(path) as db:
        count = lambda sql: dict(db.execute(sql).fetchall())  # noqa: E731
        regrades = db.execute(
            "SELECT c.value, m.value, p.value FROM tags k JOIN tags r ON r.run_uuid = k.run_uuid AND r.key = 'kbsweep.regrade_of' "
            "JOIN tags c ON c.run_uuid = r.value AND c.key = 'mlflow.runName' "
            "LEFT JOIN latest_metrics m ON m.run_uuid = k.run_uuid AND m.key = 'score' "
            "LEFT JOIN latest_metrics p ON p.run_uuid = r.value AND p.key = 'score' WHERE k.key = 'kbsweep.kind' AND k.value = 'regrade'"
        ).fetchall()
        return {
            "exists": True,
            "cell_runs": count(
                "SELECT e.name, count(*) FROM runs u JOIN experiments e USING (experiment_id) JOIN tags t ON t.run_uuid = u.run_uuid "
                "AND t.key = 'kbsweep.kind' AND t.value = 'cell' GROUP BY e.name"
            ),
            "traces": count(
                "SELECT e.name, count(*) FROM trace_info t JOIN experiments e USING (experiment_id) GROUP BY e.name"
            ),
            "spans": db.execute("SELECT count(*) FROM spans").fetchone()[0]  # tracking.trace_spans: store
            + sum(
                len(json.loads(t.read_text()).get("spans", [])) for t in (outputs / "mlartifacts").rglob("traces.json")
            ),  # : artifact
            "regrades": [{"cell": c, "score": s, "cell_score": p} for c, s, p in regrades],
        }


def near(a: Optional[float], b: Optional[float], tolerance: float) -> bool:
    return a is not None and b is not None and abs(a / b - 1) <= tolerance


def wrong_one(label: str, outcome: Optional[str]) -> bool:
    """Whether a bundled ``wrong.py`` graded as it must not be: anything but ``incorrect`` (multi's excepted: they
    assume every rank holds the same data, so they are exact at world size 1, as each says)."""
    return outcome != "incorrect" and not label.startswith("multi/")


def checks(summary: Dict[str, Any], tolerance: float) -> List[str]:
    """What failed, one line each (nothing: every check held)."""
    graded = [
        s for s in summary["steps"] if s["name"].startswith("grade ")
    ]  # their exit codes are the outcomes, checked below
    failed = [
        f"{s['name']}: rc={s['rc']} {s.get('skipped') or s.get('interrupted') or ''}".strip()
        for s in summary["steps"]
        if s["rc"] != 0 and s not in graded
    ]
    direct = {g["sha"]: g for g in summary["grades"]}
    for g in summary["grades"]:
        label = f"{g['track']}/{g['problem']}/{g['solution']}"
        if label in FLAGGED:
            if g["outcome"] != "pass" or FLAGGED[label] not in g["findings"]:
                failed.append(
                    f"{label}: {g['outcome']} findings={g['findings']}, not a pass flagged {FLAGGED[label]} ({g['message']})"
                )
        elif g["solution"] == "wrong.py":
            if wrong_one(label, g["outcome"]):
                failed.append(f"{label}: {g['outcome']}, not incorrect ({g['message']})")
        elif g["outcome"] != "pass" or g["score"] is None or g["findings"]:
            failed.append(f"{label}: {g['outcome']} score={g['score']} findings={g['findings']} ({g['message']})")
    for cell in summary["cells"]:
        twin = direct.get(cell["sha"])
        if twin is None:  # a wrong.py not graded directly, or a script step whose solution the problem lacks
            wrong = summary["bundled"].get(cell["sha"], "")
            if wrong.endswith("/wrong.py") and wrong_one(wrong, cell["outcome"]):
                failed.append(f"{cell['cell']}: {cell['outcome']} on {wrong}, not incorrect")
            elif not wrong and cell["outcome"] == "pass":
                failed.append(f"{cell['cell']}: passes with a solution that is none of the bundled files")
            continue
        scored = twin["outcome"] == "pass" and twin["score"] is not None and not twin["findings"]
        agree = cell["outcome"] == twin["outcome"] and (cell["score"] is None) == (twin["score"] is None)
        if not agree or (scored and (cell["verdict"] != "clean" or not near(cell["score"], twin["score"], tolerance))):
            failed.append(
                f"{cell['cell']}: {cell['outcome']} {cell['verdict']} score={cell['score']}, "
                f"its {twin['solution']} graded directly: {twin['outcome']} score={twin['score']} findings={twin['findings']}"
            )
    mlflow = summary["store"]
    for track in summary["tracks"]:
        swept = sum(c["track"] == track for c in summary["cells"])
        runs, traces = mlflow.get("cell_runs", {}).get(track, 0), mlflow.get("traces", {}).get(track, 0)
        if not swept or runs < swept or traces < swept:
            failed.append(f"sweep {track}: {swept} cells, {runs} cell runs and {traces} traces in the store")
    for regrade in mlflow.get("regrades", []):
        if (regrade["score"], regrade["cell_score"]) != (None, None) and not near(
            regrade["score"], regrade["cell_score"], tolerance
        ):
            failed.append(
                f"regrade of {regrade['cell']}: score {regrade['score']} against the cell's {regrade['cell_score']}"
            )
    return failed


def archive(outputs: Path, target: Path) -> None:
    """The MLflow store with its artifacts (each cell's result, grade, audit, solution, transcript and trace), the
    reports, the baseline cache and the direct grades' JSON, in one tarball."""
    with tarfile.open(target, "w:gz") as tar:
        for name in ("mlflow.db", "mlartifacts", "reports", "baselines", "direct"):
            if (outputs / name).exists():
                tar.add(outputs / name, arcname=name)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--gpu", default="auto")
    parser.add_argument("--only", default=",".join(TRACKS))
    parser.add_argument("--direct", choices=("all", "scored"), default="all")
    parser.add_argument("--tolerance", type=float, default=0.02)
    parser.add_argument("--deadline-s", type=float, default=540)
    parser.add_argument("--work", type=Path, default=Path("/tmp/kbsweep-gpu-sweep"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(args.work, ignore_errors=True)
    outputs, conf = args.work / "outputs", args.work / "conf"
    env = {
        **os.environ,
        "KBSWEEP_OUTPUTS": str(outputs),
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONUNBUFFERED": "1",
    }
    runner = Runner(args.out, args.deadline_s - RESERVE_S, env)
    started = time.monotonic()
    install(args.out, runner)
    summary: Dict[str, Any] = {
        "environment": environment(runner),
        "gpu": args.gpu,
        "quick": QUICK,
        "tolerance": args.tolerance,
    }
    sandbox = ["sandbox.mode=unsafe"] if summary["environment"].get("unconfined") else []
    chosen = targets(args.only.split(","))
    summary["tracks"] = list(chosen)
    p2p_model(conf)
    solutions = [
        (track, problem, path)
        for track, problems in chosen.items()
        for problem in problems
        for path in sorted((REPO / "problems" / track / problem / "solutions").glob("*.py"))
    ]
    summary["bundled"] = {
        hashlib.sha256(path.read_bytes()).hexdigest(): f"{track}/{problem}/{path.name}"
        for track, problem, path in solutions
    }
    for track, problems in chosen.items():
        sweep(runner, track, problems, targets([track])[track], track_overrides(track, args.gpu, sandbox), conf)
    summary["grades"] = [
        grade(runner, track, problem, path, track_overrides(track, args.gpu, sandbox), outputs / "direct")
        for track, problem, path in solutions
        if args.direct == "all" or path.name != "wrong.py"
    ]
    smallest = min(chosen, key=lambda track: len(chosen[track]))  # the regrade's grades run one at a time
    runner.run([str(BIN / "kbsweep"), "regrade", *track_overrides(smallest, args.gpu, sandbox)], f"regrade {smallest}")
    runner.run([str(BIN / "kbsweep"), "report"], "report", late_ok=True)
    summary.update(
        cells=cells(outputs, list(chosen)),
        store=store(outputs),
        steps=[{k: v for k, v in s.items() if k != "stdout"} for s in runner.steps],
    )
    summary["failed"] = checks(summary, args.tolerance)
    summary["wall_s"] = round(time.monotonic() - started, 1)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    archive(outputs, args.out / "outputs.tar.gz")
    print(
        f"[gpu_sweep] {len(summary['cells'])} cells, {len(summary['grades'])} direct grades, {summary['wall_s']} s; "
        + (
            "every check held"
            if not summary["failed"]
            else f"{len(summary['failed'])} failed:\n  " + "\n  ".join(summary["failed"])
        ),
        flush=True,
    )
    return 0 if not summary["failed"] else 1


if __name__ == "__main__":
    sys.exit(main())
