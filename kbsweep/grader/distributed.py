"""Grading across ranks: a multi-GPU problem's grade as N referee ranks and N runner ranks, each set under torchrun.

The trust boundary of a single-process grade (docs/grading.md), per rank. The **referee ranks** (trusted, this
module's :func:`main`, never importing candidate code) hold the request and the secret seed, run the NCCL
reference among themselves (its inputs may ask ``torch.distributed`` for the world, and its forward is a
collective, so it needs ranks of its own rather than an emulation in one process), compare, own the clock and
write the result. The **runner ranks** (:mod:`kbsweep.grader.runner.runner` under torchrun, isolated interpreters in a
sandbox of their own) import the candidate and talk among themselves for its communication. Runner rank r dials
referee rank r on a unix socket in the grade's rendezvous folder with the grade's token (torchrun's agent closes
inherited descriptors, so no socket pair survives it); from there the referee rank drives it exactly as a
single-process grade's referee drives its runner (arenas on the rank's device, JSON commands).

What ranks add to a single-process grade (:class:`RankReferee`):

* the device gate refuses ranks on different device models;
* models and inputs are seeded with ``seed + rank * 1_000_003``: every rank gets its own inputs and weights;
* every correctness case ends with the referee ranks agreeing on its result (the all-rank maximum of failure);
* timing is the referee's batch protocol on every rank at once: the same calls per batch and spin, a barrier
  before each go, a call's time is the slowest rank's, and the stopping rule runs on those maxima; each referee
  rank corroborates its own runner's figures with its own clock;
* the runner's profiler session lists the torch.distributed ops and GPU kernels of every candidate call: a c10d
  collective or an NCCL kernel is a finding (``c10d_collective``, ``nccl_kernel``) that leaves the score empty;
* the eager baseline is the NCCL reference, timed by the referee ranks with the same batches.

A referee rank whose grade fails writes its own message (with the time it failed) and exits non-zero, which makes
its torchrun stop the other referee ranks; the parent then ends the runner ranks, and keeps the earliest failure
(the cause, not a peer's broken connection). On success referee rank 0 gathers every rank's findings and evidence
and writes the one message. Results live in a folder the runner ranks never see.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
import torch.distributed as dist

from kbsweep.grader.processes import BREACH_OUTCOMES, RUNNER_BOOT, Supervision, runner_env
from kbsweep.grader.referee import checks
from kbsweep.grader.referee.referee import Referee, referee_message
from kbsweep.grader.referee.request import RefereeRequest
from kbsweep.grader.shared.channel import Channel, ChannelError, accept_rank, listen
from kbsweep.grader.shared.failures import COMM_FINDINGS, GradeFailure  # noqa: F401 - COMM_FINDINGS: this module's findings
from kbsweep.outcomes import Outcome
from kbsweep.paths import REPO_ROOT, owned_tempdir
from kbsweep.sandbox.watch import POLL_S, Watch

RANK_SEED_STRIDE = 1_000_003
# c10d operations (the profiler's CPU-side names) that are collectives; send/recv are point-to-point
COLLECTIVE_OP = re.compile(r"^(c10d|_c10d_functional|c10d_functional)::(?!(send|recv))|^(nccl|gloo):(?!(send|recv))")
NCCL_KERNEL = re.compile(r"nccl", re.IGNORECASE)
COMM_ENV_PREFIXES = ("NCCL_", "TORCH_SYMM_MEM_", "NVSHMEM_", "GLOO_")
ACCEPT_TIMEOUT_S = 600.0  # for the runner rank to start (torch's import on a loaded host) and dial in
RUNNER_GRACE_S = 5.0  # for the runner ranks' torchrun to end (and name a crashed rank) once the referee ranks have


# -- the busbw convention ------------------------------------------------------------------------------------
def bus_factor(collective: str, world: int) -> float:
    """NCCL's bus-bandwidth factor (nccl-tests PERFORMANCE.md): busbw = algbw * factor, algbw = S / time.

    all_reduce moves 2(n-1)/n of S per rank; all_gather, reduce_scatter and all_to_all move (n-1)/n of S, and
    so does ``ring`` (a ring exchange of every rank's block, all-gather traffic)."""
    factors = {"all_reduce": 2.0, "all_gather": 1.0, "reduce_scatter": 1.0, "all_to_all": 1.0, "ring": 1.0}
    if collective not in factors:
        raise ValueError(f"unknown collective {collective!r} (one of {', '.join(factors)})")
    return factors[collective] * (world - 1) / world


def bus_ceiling(collective: str, world: int) -> float:
    """The largest physical busbw fraction of the one-direction link figure: 1, except for all_reduce, where an
    in-switch reduction (NVLink SHARP) sends S and receives S per rank, so algbw <= link, busbw <= 2(n-1)/n link."""
    return bus_factor(collective, world) if collective == "all_reduce" else 1.0


def multi_work(problem: Any, shape: Dict[str, Any], world: int) -> Dict[str, Optional[float]]:
    """Per-rank FLOPs and bus bytes of one shape at ``world`` ranks (formulas see ``world``)."""
    from kbsweep.config.problems import evaluate

    multi = problem.spec.constraints
    values = {**shape, "world": world}
    comm = evaluate(multi.get("comm_bytes"), values, problem.id)
    return {
        "flops": evaluate(multi.get("flops"), values, problem.id),
        "bytes": None,
        "comm_bytes": comm,
        "bus_bytes": comm * bus_factor(multi["collective"], world) if comm is not None else None,
    }


def score_multi(worker: Dict[str, Any], spec: Any, roofline: Dict[str, Any], world: int) -> Dict[str, Any]:
    """Per shape: bus bandwidth over the one-direction NVLink figure, compute over the peak where the problem has
    FLOPs; the shape's fraction is the larger (the roofline of ideal overlap). Speedups over the NCCL reference
    beside it. No fraction (world size 1, no link figure): the speedup is the score."""
    from kbsweep.score.roofline import geomean, score_grade

    scored = score_grade(worker, SimpleNamespace(regime="compute", peak=spec.peak, score=spec.score), roofline)
    link = roofline.get("nvlink_gbps")
    link = link / 2 if link else None  # datasheet NVLink figures count both directions; busbw counts one
    ceiling = bus_ceiling(spec.constraints["collective"], world)
    for shape, entry in zip(scored["shapes"], worker["timings"]):
        bus = entry["work"]["bus_bytes"]
        shape.collective = True
        shape.busbw_gbps = bus / (shape.ms * 1e-3) / 1e9 if bus else None
        shape.comm_fraction = shape.busbw_gbps / link if shape.busbw_gbps and link else None
        known = [f for f in (shape.comm_fraction, shape.compute_fraction) if f is not None]
        shape.fraction = max(known) if known else None
        if shape.comm_fraction is not None and shape.comm_fraction > ceiling:
            scored["findings"].append(
                {
                    "kind": "physics_violation",
                    "shape": entry["shape"],
                    "detail": f"comm_fraction={shape.comm_fraction:.3f} > {ceiling:.3f}",
                }
            )
    fractions = [s.fraction for s in scored["shapes"]]
    if spec.score == "roofline" and fractions and None not in fractions:
        scored.update(basis="roofline", score=geomean(fractions))
    else:
        scored.update(basis="speedup", score=scored["speedup"].get("eager"))
    if scored["findings"]:
        scored["score"] = None
    return scored


# -- parent side ---------------------------------------------------------------------------------------------
def rank_exits(stderr: Path) -> Dict[int, str]:
    """Non-zero exits of ranks from torchrun's failure summary: {rank: "exitcode : -11 (pid: ...) (SIGSEGV)"}."""
    exits, rank = {}, None
    for line in stderr.read_text(errors="replace").splitlines() if stderr.exists() else []:
        found = re.match(r"\s*rank\s*:\s*(\d+)", line)
        if found:
            rank = int(found.group(1))
        elif rank is not None and re.match(r"\s*exitcode\s*:", line):
            exits[rank] = " ".join(line.split())
    return exits


def crashed(exits: Dict[int, str]) -> Dict[int, str]:
    """Ranks killed by a signal other than the SIGTERM/SIGKILL of a teardown (a segfault, an abort, ...)."""
    return {
        rank: line for rank, line in exits.items() if re.search(r": -\d+", line) and not re.search(r": -(9|15)\b", line)
    }


def rank_over(procs: Sequence[Any], memory_mib: float) -> Optional[str]:
    """The cap is per rank: any one process of the torchrun trees past it."""
    import psutil

    for proc in procs:
        try:
            tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        except psutil.Error:
            continue
        for member in tree:
            try:
                if member.memory_info().rss / 2**20 > memory_mib:
                    return f"a rank exceeded {memory_mib:.0f} MiB of host memory"
            except psutil.Error:
                continue
    return None


def watch_ranks(referee, runner, timeout_s: float, memory_mib: float, disk_mib: float, folders: Sequence[Path]):
    """Until the referee ranks' torchrun ends (then the runner ranks' gets RUNNER_GRACE_S to end on its own, so its
    agent names a crashed rank) or either passes a limit; both trees are killed on the way out. A runner torchrun
    that ends first leaves the referee ranks RUNNER_GRACE_S to report it. Returns the breach, if any."""
    from kbsweep.grader.torchrun import kill_tree

    watches = [Watch(referee, timeout_s, None, 0, []), Watch(runner, timeout_s, None, disk_mib, folders)]
    breach, runner_ended = None, None
    try:
        while referee.poll() is None:
            for watch in watches:
                breach = breach or (watch.breach() if watch.proc.poll() is None else None)
            if memory_mib and not breach and (hog := rank_over((referee, runner), memory_mib)):
                breach = ("memory", hog)
            if breach:
                return breach
            if runner.poll() is not None:
                runner_ended = runner_ended or time.monotonic()
                if time.monotonic() - runner_ended > RUNNER_GRACE_S:
                    return None
            time.sleep(POLL_S)
        ended = time.monotonic()
        while runner.poll() is None and time.monotonic() - ended < RUNNER_GRACE_S:
            time.sleep(POLL_S)
        return None
    finally:  # the referee ranks first: past a limit, a broken line is all they could report, not the cause
        for proc in (referee, runner):
            kill_tree(proc.pid)
            proc.wait()


def supervise_ranks(request: RefereeRequest, how: Supervision) -> Dict[str, Any]:
    """One grade at ``request.world_size`` ranks: the referee ranks' torchrun (``how.readonly`` seen; its private
    request/result folder and the rendezvous folder writable) and the runner ranks' torchrun (kbsweep's package and
    the rendezvous folder read-only, the candidate's folder writable), each in a sandbox of its own like the two
    processes of :func:`kbsweep.grader.processes.supervise`; returns the one result message."""
    from kbsweep.grader.torchrun import launcher, spawn_torchrun, torchrun_command

    log_dir, env, sandbox = how.log_dir, how.env, how.sandbox
    world, workdir = request.world_size, Path(request.workdir)
    private = owned_tempdir("referee")  # mode 0700: the request (secret seed) and the results
    rendezvous = owned_tempdir("ranks")  # only the referee ranks' sockets
    token = secrets.token_hex(
        16
    )  # a process that can reach the sockets but was not started by this grade cannot pose as a rank
    request_path = private / "request.json"
    request_path.write_text(json.dumps({**request.to_json(), "token": token, "rendezvous": str(rendezvous)}))
    # the host's communication-library settings reach the ranks whatever the grade's environment keeps
    # (NCCL_NVLS_ENABLE=0 and the like are operators' safety switches, not secrets)
    comm = {k: v for k, v in os.environ.items() if k.startswith(COMM_ENV_PREFIXES)}
    if sandbox.confined:  # its network namespace has loopback only: the host's interface names mean nothing there
        comm.update(GLOO_SOCKET_IFNAME="lo", NCCL_SOCKET_IFNAME="lo")
    ranks_env = {**runner_env(env), **comm, "KBSWEEP_RANK_TOKEN": token}
    runner_command = [
        *launcher(world),
        "--no-python",
        sys.executable,
        "-I",
        "-B",
        "-c",
        RUNNER_BOOT.format(root=str(REPO_ROOT)),
        "ranks",
        str(rendezvous),
    ]
    try:
        referee = spawn_torchrun(
            torchrun_command(world, __name__, [str(request_path)]),
            log_dir=log_dir,
            name="referee",
            cwd=private,
            env={**env, **comm},
            sandbox=sandbox,
            writable=[private, rendezvous],
            readonly=how.readonly,
        )
        runner = spawn_torchrun(
            runner_command,
            log_dir=log_dir,
            name="torchrun",
            cwd=workdir,
            env=ranks_env,
            sandbox=sandbox,
            writable=[workdir],
            readonly=[REPO_ROOT / "kbsweep", rendezvous],
        )
        breach = watch_ranks(
            referee, runner, how.timeout_s, how.memory_mib, sandbox.policy.disk_mib, [workdir, log_dir]
        )
        messages = [json.loads(path.read_text()) for path in sorted(private.glob("rank*.json"))]
    finally:
        shutil.rmtree(private, ignore_errors=True)
        shutil.rmtree(rendezvous, ignore_errors=True)
    failures = sorted((m for m in messages if not m["ok"]), key=lambda m: m["at"])
    exits = rank_exits(log_dir / "torchrun_stderr.log")
    if breach and breach[0] == "memory":
        return {"ok": False, "outcome": Outcome.GRADE_OOM, "message": breach[1]}
    if crashed(exits):  # a runner rank killed by a signal is the cause; its peers and referee only saw a broken line
        rank = min(crashed(exits))
        return {
            "ok": False,
            "outcome": Outcome.RUNTIME_ERROR,
            "message": f"rank {rank}: the candidate's process died ({exits[rank]})",
        }
    if failures:
        message = failures[0]  # the earliest: the cause, not a peer's broken connection
        if not re.search(r"\brank \d+:", message["message"]):
            message["message"] = f"rank {message['rank']}: {message['message']}"
    elif breach:
        kind, text = breach
        return {"ok": False, "outcome": BREACH_OUTCOMES[kind], "message": f"grading processes {text}"}
    else:
        done = [m for m in messages if m["ok"] and m["rank"] == 0]
        if not done:  # the candidate's processes failing show in a referee rank's message: this is the harness's
            detail = "; ".join(f"runner rank {rank}: {line}" for rank, line in sorted(exits.items()))
            return {
                "ok": False,
                "outcome": Outcome.HARNESS_ERROR,
                "message": f"the referee ranks ended without a result (torchrun exit code {referee.returncode}{'; ' + detail if detail else ''})",
            }
        message = done[0]
    for key in ("rank", "at"):
        message.pop(key, None)
    return message


# -- the referee ranks (trusted: no candidate code in here) --------------------------------------------------
class RankReferee(Referee):
    """One referee rank: the single-process referee's grade, its verdicts and timing agreed with its peers over a
    gloo group of their own (no NCCL traffic, no GPU work), its reference run with them."""

    def __init__(self, request: RefereeRequest, runner: Channel, rank: int, world: int, control: Any):
        super().__init__(request, runner)
        self.rank, self.world, self.control = rank, world, control
        self.barrier = self.rank_barrier
        self.per_rank: List[List[float]] = [[] for _ in range(world)]
        self.device_gate()

    def rank_barrier(self) -> None:
        dist.barrier(group=self.control)

    def gather(self, value: Any) -> List[Any]:
        """Every rank's ``value``, in rank order."""
        out: List[Any] = [None] * self.world
        dist.all_gather_object(out, value, group=self.control)
        return out

    def device_gate(self) -> None:
        name = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu"
        names = self.gather(name)
        self.evidence["devices"] = names
        if len(set(names)) > 1:
            raise GradeFailure(Outcome.HARNESS_ERROR, f"device gate: ranks run on different devices {names}")

    def rank_seed(self, seed: int) -> int:
        return seed + self.rank * RANK_SEED_STRIDE

    # -- agreement ---------------------------------------------------------------------------------------------
    def any_rank(self, flag: bool) -> bool:
        return any(self.gather(flag))

    def agreed_batch(self, shape_: Dict[str, float]) -> Dict[str, float]:
        shapes = self.gather(shape_)
        return {
            **shape_,
            "per_batch": min(s["per_batch"] for s in shapes),
            "spin_us": max(s["spin_us"] for s in shapes),
            "warm_calls": max(s.get("warm_calls", 0) for s in shapes),
        }

    def replays(self, mode: str, kernelbench: bool = False) -> bool:
        """Never across ranks: a rank whose capture failed would strand its peers in a captured collective."""
        return False

    def slowest(self, ms: List[float], elapsed_s: float, runner_ms: Sequence[float] = ()) -> tuple:
        rows = self.gather([ms, elapsed_s, list(runner_ms) or ms])
        for rank, (_, _, own) in enumerate(rows):
            self.per_rank[rank] += own
        return [max(call) for call in zip(*(times for times, _, _ in rows))], max(e for _, e, _ in rows)

    def timed_go(self, *args: Any) -> tuple:
        self.rank_barrier()  # the runner ranks start the batch together
        return super().timed_go(*args)

    def agreed(self, step: Callable[[], Any]) -> Any:
        """``step`` on every rank; a check that fails on any rank fails on all, naming the first such rank."""
        result, failure = None, None
        try:
            result = step()
        except checks.CheckFailure as exc:
            failure = str(exc)
        failed = [(rank, text) for rank, text in enumerate(self.gather(failure)) if text]
        if failed:
            raise checks.CheckFailure(f"rank {failed[0][0]}: {failed[0][1]}")
        return result

    def check_case(self, *args: Any, **kwargs: Any):
        return self.agreed(lambda: super(RankReferee, self).check_case(*args, **kwargs))

    def pointer_cache_probe(self, *args: Any) -> None:
        self.agreed(lambda: super(RankReferee, self).pointer_cache_probe(*args))

    # -- stages ------------------------------------------------------------------------------------------------
    def time_shape(self, shape: Dict[str, Any], kernelbench: bool = False) -> Dict[str, Any]:
        self.per_rank = [[] for _ in range(self.world)]
        entry = super().time_shape(shape, kernelbench)
        medians = [statistics.median(samples) for samples in self.per_rank]
        entry["candidate"].update(per_rank_median_ms=medians, slowest_rank=medians.index(max(medians)))
        return entry

    def audit_probes(self) -> None:
        if self.world == 1:
            super().audit_probes()
        # no ghost replays across ranks: a rank whose output breaks without its kernels may never reach the
        # exchange its peers wait in

    def collect_evidence(self, timings: Sequence[Dict[str, Any]] = (), complete: bool = False) -> None:
        """The runner's evidence, and from its profiler session the gate: a c10d collective or an NCCL kernel in
        any candidate call."""
        super().collect_evidence(timings, complete)
        probe = self.evidence.get("probe") or {}
        gate = {
            "collectives": sorted(name for name in probe.get("comm_ops", {}) if COLLECTIVE_OP.match(name)),
            "nccl_kernels": sorted(name for name in probe.get("gpu_kernels", []) if NCCL_KERNEL.search(name)),
        }
        self.evidence["communication"] = gate
        for kind, names in (("c10d_collective", gate["collectives"]), ("nccl_kernel", gate["nccl_kernels"])):
            if names and not any(f["kind"] == kind for f in self.findings):
                self.findings.append({"kind": kind, "detail": ", ".join(names)})

    def run(self) -> Dict[str, Any]:
        """The referee's grade on every rank; rank 0's with every rank's findings (tagged) and evidence, the one
        :func:`main` reports (another rank's is its own alone)."""
        result = super().run()
        ranks = self.gather(
            {"findings": self.findings, "evidence": self.evidence, "worst": result["correctness"]["worst"]}
        )
        if self.rank != 0:
            return result
        result["findings"] = [{**f, "rank": r} for r, part in enumerate(ranks) for f in part["findings"]]
        # rank 0's evidence where a single-process grade keeps it (the audit reads it there), the others beside it
        result["evidence"] = {
            **self.evidence,
            "world_size": self.world,
            "other_ranks": [part["evidence"] for part in ranks[1:]],
        }
        worst = result["correctness"]["worst"]
        result["correctness"].update(world_size=self.world, worst={k: max(p["worst"][k] for p in ranks) for k in worst})
        return result


def main() -> None:
    """One referee rank: join the reference's process group, wait for runner rank r, grade, report."""
    from kbsweep.grader.shared.ranks import init_distributed

    request_path = Path(sys.argv[1])
    rank, world, device = init_distributed()  # NCCL on GPUs (the reference's collectives), gloo on CPU
    fields = json.loads(request_path.read_text())
    control = dist.new_group(backend="gloo")
    listener = listen(Path(fields.pop("rendezvous")), rank)
    token = fields.pop("token")
    request = RefereeRequest(**{**fields, "device": device})
    try:
        runner = accept_rank(listener, token, rank, ACCEPT_TIMEOUT_S)
        message = referee_message(request, runner, lambda req, channel: RankReferee(req, channel, rank, world, control))
    except ChannelError as exc:
        message = {
            "ok": False,
            "outcome": Outcome.HARNESS_ERROR,
            "message": f"the candidate's process never dialled in ({exc})",
            "at": time.time(),
        }
    if rank == 0 or not message["ok"]:
        partial = request_path.with_name(f".rank{rank}.json")
        partial.write_text(json.dumps({**message, "rank": rank}, default=str))
        partial.rename(request_path.with_name(f"rank{rank}.json"))  # whole, or not there
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if message["ok"] else 1)  # a failing rank makes torchrun stop the others


if __name__ == "__main__":
    main()
