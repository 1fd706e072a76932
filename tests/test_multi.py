"""The multi track on CPU: grades under torchrun with gloo at 2 and 4 ranks (docs/multi.md): referee ranks and
runner ranks, each set under its own torchrun in its own sandbox (docs/sandbox.md).

Each grade starts torchrun and a Python per rank, so grades that belong together run concurrently.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, Optional, Tuple

import pytest

from kbsweep.audit.static import analyze
from kbsweep.config.problems import load_problem
from kbsweep.grader.distributed import COMM_FINDINGS
from kbsweep.score.roofline import load_roofline
from tests.support.grading import CPU, graded

REPO = Path(__file__).resolve().parent.parent
PROBLEMS = ["allreduce_residual", "gemm_allreduce", "allgather_gemm", "ring_attention", "moe_dispatch_combine"]
ROOFLINE = load_roofline([str(REPO / "roofline_specs")], "cpu")
SHORT_TIMING = {"min_runs": 3, "max_runs": 8, "max_time_s": 1.0}


def problem(name: str):
    return load_problem(REPO / "problems/multi" / name, "multi")


def grade_many(name: str, jobs: Dict[str, Tuple[Path, int]], folder: Path, **kwargs) -> Dict[str, dict]:
    """Grade {label: (solution, world size)} concurrently; check mode unless kwargs say otherwise."""
    prob = problem(name)
    kwargs = {"mode": "check", "timeout_s": 300, **kwargs}

    def one(label: str) -> dict:
        solution, world = jobs[label]
        return graded(prob, solution, CPU, ROOFLINE, world_size=world, log_dir=folder / label, **kwargs)

    with ThreadPoolExecutor(len(jobs)) as pool:
        return dict(zip(jobs, pool.map(one, jobs)))


def candidate(folder: Path, source: str, helpers: Optional[Dict[str, Path]] = None) -> Path:
    """A solution.py (and helper modules beside it) in a folder of its own."""
    folder.mkdir(parents=True)
    for module, path in (helpers or {}).items():
        (folder / f"{module}.py").write_text(path.read_text())
    (folder / "solution.py").write_text(source)
    return folder / "solution.py"


@pytest.mark.parametrize("name", PROBLEMS)
def test_example_passes_at_2_and_4_ranks_the_reference_at_2_and_the_shortcut_fails(name, tmp_path):
    """The example's point-to-point algorithm at 2 ranks and at 4 (where a ring is no longer a swap). The reference
    (torch's own collectives, trusted) is graded at 2 only: a 4-rank grade is ten processes, each importing torch."""
    prob = problem(name)
    reference = candidate(tmp_path / "reference", prob.reference.read_text() + "\n\nModelNew = Model\n")
    example, shortcut = prob.root / "solutions/p2p.py", prob.root / "solutions/wrong.py"
    jobs = {"reference@2": (reference, 2), "p2p@2": (example, 2), "p2p@4": (example, 4), "wrong@2": (shortcut, 2)}
    results = grade_many(name, jobs, tmp_path / "grades")
    for label, (_, world) in jobs.items():
        if label.startswith("wrong"):
            continue
        result = results[label]
        assert result["outcome"] == "pass", (label, result.get("message"))
        assert result["correctness"]["world_size"] == world
        assert result["evidence"]["devices"] == ["cpu"] * world  # what the device gate compared
        if label.startswith("p2p"):
            assert not [f for f in result["findings"] if f["kind"] in COMM_FINDINGS]
    # the profiler pass sees the reference's own collective on every rank
    assert {f["rank"] for f in results["reference@2"]["findings"] if f["kind"] == "c10d_collective"} == {0, 1}
    wrong = results["wrong@2"]
    assert wrong["outcome"] == "incorrect", wrong.get("message")
    assert "rank " in wrong["message"] and wrong["score"] is None


@pytest.mark.parametrize("name", PROBLEMS)
def test_example_is_scored_with_kernels_of_its_own(name, tmp_path):
    """The multi track scores the candidate's own kernels: the example's compute is Triton (the interpreter here),
    launched every call, so a timed grade has no no_kernel finding and a score. At one rank: the cheapest timed
    grade, and no slowest-rank figure for the host's load to skew."""
    prob = problem(name)
    result = graded(
        prob,
        prob.root / "solutions/p2p.py",
        CPU,
        ROOFLINE,
        mode="bench",
        baselines=["eager"],
        timing=SHORT_TIMING,
        timeout_s=300,
        world_size=1,
        log_dir=tmp_path / "grade",
    )
    assert result["outcome"] == "pass", result.get("message")
    assert not [f for f in result["findings"] if f["kind"] == "no_kernel"], result["findings"]
    assert result["score"] is not None, result.get("score_note")


def test_c10d_collectives_are_flagged_statically_and_point_to_point_is_not():
    source = (
        "import torch.distributed as dist\n"
        "from torch.distributed import all_gather_into_tensor\n"
        "def f(x, out):\n"
        "    dist.all_reduce(x)\n"
        "    all_gather_into_tensor(out, x)\n"
        "    dist.group.WORLD.allreduce([x])\n"
    )
    for name in PROBLEMS:
        prob = problem(name)
        flagged = {f.where["line"] for f in analyze(source, prob.spec.forbidden) if f.kind == "forbidden_name"}
        assert {4, 5, 6} <= flagged, (name, flagged)
        example = analyze((prob.root / "solutions/p2p.py").read_text(), prob.spec.forbidden)
        assert not [f for f in example if f.kind == "forbidden_name"], (name, example)


PATCHER = """
import torch
import torch.distributed as dist

dist.all_reduce = lambda tensor, *args, **kwargs: None  # the reference's sum becomes this rank's own x


class ModelNew(torch.nn.Module):
    def forward(self, x, residual):
        return x + residual
"""

SLOW_RANK = """
import time

import torch.distributed as dist
from _p2p import ModelNew as Example


class ModelNew(Example):
    def forward(self, x, residual):
        out = super().forward(x, residual)
        if dist.get_rank() == 1:
            time.sleep(0.03)  # after the exchange: rank 0 is done long before rank 1
        return out
"""

CRASH = """
import ctypes

import torch
import torch.distributed as dist


class ModelNew(torch.nn.Module):
    def forward(self, x, residual):
        if dist.get_rank() == 1:
            ctypes.string_at(0)
        return x + residual
"""

HOG = """
import time

import torch
import torch.distributed as dist


class ModelNew(torch.nn.Module):
    def forward(self, x, residual):
        if dist.get_rank() == 1:
            self.held = [torch.ones(1 << 28) for _ in range(3)]  # 3 GiB on one rank
            time.sleep(600)  # past the grade's 300 s: only the memory watch ends it as grade_oom
        return x + residual
"""


@pytest.fixture(scope="module")
def adversarial(tmp_path_factory):
    """The monkey-patching, crashing, memory-hogging and slow-rank candidates on allreduce_residual at 2 ranks,
    graded together (with a 1500 MiB cap per rank)."""
    folder = tmp_path_factory.mktemp("multi-adversarial")
    example = REPO / "problems/multi/allreduce_residual/solutions/p2p.py"
    jobs = {
        "patch": (candidate(folder / "patch", PATCHER), 2),
        "crash": (candidate(folder / "crash", CRASH), 2),
        "hog": (candidate(folder / "hog", HOG), 2),
        "slow": (candidate(folder / "slow", SLOW_RANK, {"_p2p": example}), 2),
    }
    return grade_many(
        "allreduce_residual",
        jobs,
        folder / "grades",
        mode="bench",
        baselines=["eager"],
        timing=SHORT_TIMING,
        memory_mib=1500,
    )


def test_a_patched_collective_never_reaches_the_reference(adversarial):
    """The candidate's no-op all_reduce lives in its own processes: the referee ranks' reference still sums."""
    result = adversarial["patch"]
    assert result["outcome"] == "incorrect" and result["message"].startswith("shape "), result.get("message")
    assert "rank 0:" in result["message"] and result["score"] is None


def test_a_crashed_rank_is_the_cause_not_its_peers_broken_connection(adversarial):
    result = adversarial["crash"]
    assert result["outcome"] == "runtime_error"
    assert result["message"].startswith("rank 1: the candidate's process died") and "SIGSEGV" in result["message"], (
        result["message"]
    )


def test_a_rank_over_the_memory_cap_ends_the_grade(adversarial):
    result = adversarial["hog"]
    assert result["outcome"] == "grade_oom" and "1500 MiB" in result["message"]
    assert result["grade_s"] < 200  # killed when seen, long before its sleep or the grade's timeout


def test_the_slowest_rank_is_what_is_reported(adversarial):
    result = adversarial["slow"]
    assert result["outcome"] == "pass", result.get("message")
    for entry, shape in zip(result["timings"], result["shapes"]):
        timed = entry["candidate"]
        fast, slow = timed["per_rank_median_ms"]
        assert slow >= 30 and fast < slow - 20, timed
        assert timed["slowest_rank"] == 1 and timed["median_ms"] >= slow * 0.9
        assert shape["ms"] == timed["median_ms"] and shape["speedup"]["eager"] < 1


def test_cli_grades_at_the_track_world_size(cli, outputs):
    example = REPO / "problems/multi/allreduce_residual/solutions/p2p.py"
    run = cli(
        "grade",
        "problem=multi/allreduce_residual",
        f"solution={example}",
        "gpu=cpu",
        "track=multi",
        "track.world_size=2",
    )
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(run.stdout)
    assert result["outcome"] == "pass" and result["world_size"] == 2
    assert [s["busbw_gbps"] > 0 for s in result["shapes"]] == [True, True, True]
    assert [s.get("held_out", False) for s in result["shapes"]] == [False, False, True]  # the held-out smoke shape last


# -- the sandbox around torchrun and its ranks (docs/sandbox.md) --------------------------------------------------
SNOOP = """
import gc, json, os, socket, sys

import torch.distributed as dist
from _p2p import ModelNew  # otherwise the honest p2p example


def _attempts():
    def read(path):
        try:
            with open(path) as fh:
                return fh.read()
        except OSError:
            return None

    def write(path):
        try:
            with open(path, "w") as fh:
                fh.write("escaped")
            return True
        except OSError:
            return False

    def reach(port):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=3).close()
            return True
        except OSError:
            return False

    rank = dist.get_rank()
    grader = {{"isolated": sys.flags.isolated,  # the trusted side lives in other processes, in either mode
              "grader_modules": sorted(m for m in sys.modules if m.startswith(
                  ("kbsweep_reference", "kbsweep.grader.referee.referee", "kbsweep.grader.distributed"))),
              "secret_keys": sorted({{k for o in gc.get_objects() if isinstance(o, dict) for k in list(o)[:50] if k in ("secret_seed", "baseline_budget_s")}})}}
    return {{"rank": rank, **grader, "secret": read({secret!r}), "solution": read({solution!r}) is not None,
            "outside": write(f"{outside}/escape-{{rank}}"), "grade_folder": write(f"{grade_folder}/escape-{{rank}}"),
            "workdir": write(f"inside-{{rank}}"), "host_port": reach({port})}}


print("SEEN " + json.dumps(_attempts()), flush=True)
"""

FILL = """
from _p2p import ModelNew

for i in range(400):  # 400 MiB in 1 MiB files: each under the file-size limit, together over the 16 MiB quota
    with open(f"fill{i}", "wb") as fh:
        fh.write(bytes(1 << 20))
"""


def seen(log_dir: Path) -> Dict[int, dict]:
    """Every rank's SEEN line (the ranks' stdout is torchrun's)."""
    lines = (log_dir / "torchrun_stdout.log").read_text().splitlines()
    return {r["rank"]: r for r in (json.loads(line[5:]) for line in lines if line.startswith("SEEN "))}


def test_ranks_are_confined_and_unsafe_mode_still_grades(tmp_path):
    """Every rank of a confined grade tries to read a planted secret and a bundled solution, to write outside its
    workdir and to reach a port on the host's loopback: all denied, while it still passes. The same candidate under
    sandbox.mode=unsafe (no namespaces) passes too, and there every attempt succeeds, which is what the confined
    assertions would see without the sandbox."""
    import socket

    from kbsweep.sandbox.confine import SandboxPolicy

    prob = problem("allreduce_residual")
    example = prob.root / "solutions/p2p.py"
    secret = f"planted-{os.getpid()}-7c1e"
    (tmp_path / "secret.txt").write_text(secret)
    listener = socket.create_server(("127.0.0.1", 0))  # connect() succeeds from the host's network namespace only
    jobs = {}
    for mode in ("bwrap", "unsafe"):
        outside = tmp_path / f"outside-{mode}"
        outside.mkdir()
        log_dir = tmp_path / "grades" / mode
        source = SNOOP.format(
            secret=str(tmp_path / "secret.txt"),
            solution=str(example),
            outside=outside,
            grade_folder=log_dir,
            port=listener.getsockname()[1],
        )
        jobs[mode] = (candidate(tmp_path / mode, source, {"_p2p": example}), log_dir, outside)
    fill = candidate(tmp_path / "fill", FILL, {"_p2p": example})
    runs = {
        **{mode: (path, log_dir, SandboxPolicy(mode=mode)) for mode, (path, log_dir, _) in jobs.items()},
        "fill": (fill, tmp_path / "grades/fill", SandboxPolicy(disk_mib=16)),
    }

    def one(label: str) -> dict:
        path, log_dir, policy = runs[label]
        return graded(
            prob, path, CPU, ROOFLINE, mode="check", timeout_s=300, world_size=2, log_dir=log_dir, sandbox=policy
        )

    with ThreadPoolExecutor(len(runs)) as pool:
        results = dict(zip(runs, pool.map(one, runs)))
    listener.close()

    confined, unsafe = results["bwrap"], results["unsafe"]
    for result in (confined, unsafe):
        assert result["outcome"] == "pass" and result["world_size"] == 2, result.get("message")
    grader = {"isolated": 1, "grader_modules": [], "secret_keys": []}
    denied = {
        **grader,
        "secret": None,
        "solution": False,
        "outside": False,
        "grade_folder": False,
        "workdir": True,
        "host_port": False,
    }
    assert seen(jobs["bwrap"][1]) == {rank: {"rank": rank, **denied} for rank in (0, 1)}
    assert not list(jobs["bwrap"][2].iterdir()) and not list(jobs["bwrap"][1].glob("escape-*"))
    leaked = [p for p in (tmp_path / "grades/bwrap").rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
    assert not leaked and secret not in json.dumps(confined)
    assert sorted(p.name for p in (jobs["bwrap"][1] / "candidate").glob("inside-*")) == [
        "inside-0",
        "inside-1",
    ]  # the workdir
    allowed = {
        **grader,
        "secret": secret,
        "solution": True,
        "outside": True,
        "grade_folder": True,
        "workdir": True,
        "host_port": True,
    }
    assert seen(jobs["unsafe"][1]) == {rank: {"rank": rank, **allowed} for rank in (0, 1)}
    assert sorted(p.name for p in jobs["unsafe"][2].iterdir()) == ["escape-0", "escape-1"]

    filled = results["fill"]  # the writable folders' quota holds across ranks, as on the single-process path
    assert filled["outcome"] == "runtime_error" and "over the 16 MiB quota" in filled["message"], filled.get("message")


def test_only_a_runner_rank_with_the_grade_token_reaches_its_referee_rank(tmp_path):
    """A process that dials a referee rank's socket without this grade's token, or as another rank, is dropped."""
    import socket
    import threading

    from kbsweep.grader.shared.channel import Channel, ChannelError, accept_rank, connect_rank, listen, rank_socket

    listener = listen(tmp_path, 1)
    accepted = []
    server = threading.Thread(target=lambda: accepted.append(accept_rank(listener, "right", 1, timeout_s=20)))
    server.start()
    poser = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    poser.connect(str(rank_socket(tmp_path, 1)))
    strays = [connect_rank(tmp_path, 1, "wrong"), Channel(poser)]
    strays[1].send({"token": "right", "rank": 0})  # the right token, as another rank
    rank = connect_rank(tmp_path, 1, "right")
    server.join()
    accepted[0].send({"hello": "rank 1"})
    assert rank.receive()[0] == {"hello": "rank 1"}
    for stray in strays:
        with pytest.raises(ChannelError):
            stray.receive()
    with pytest.raises(ChannelError):  # nobody else dials in
        accept_rank(listener, "right", 1, timeout_s=0.5)
