"""Grading across ranks: a multi-GPU problem's candidate runs under torchrun, one grading process per rank.

Parent side (:func:`supervise_ranks`, called by :func:`kbsweep.grader.grade`): the request goes into a private
folder made for this grade, torchrun starts ``python -m kbsweep.grader.distributed <request>`` once per rank
(:func:`kbsweep.torchrun.run_torchrun`), and each rank may leave one result message in that folder. A pipe does
not fit: torchrun's agent closes inherited descriptors before it starts the ranks. Every rank opens its own
message file before the candidate is imported and the request file is deleted once all ranks have read it;
each message carries the grade's nonce, so a candidate that writes into the folder (or into an open file) is
caught as a forged result, as on the single-process path.

Rank side (:class:`RankWorker`, the single-process :class:`~kbsweep.grader.worker.Worker` made rank-aware):

* the device gate refuses ranks on different device models;
* models and inputs are seeded with ``seed + rank * 1_000_003``: every rank gets its own inputs and weights;
* ``torch.distributed`` (its module functions and ``ProcessGroup``'s methods) and every callable of the reference
  join the worker's tamper guard before the candidate is imported; the guard is checked after the import and
  after every correctness case, and a replaced callable disqualifies the candidate;
* every correctness case ends with all ranks agreeing on its result (the all-rank maximum of failure);
* timing: a barrier before every call, then CUDA events (host clock on CPU) per rank; a call's time is the
  slowest rank's, and the stopping rule runs on those maxima, so every rank times the same number of calls;
* a profiler pass per shape lists the c10d collectives and NCCL kernels the candidate's calls run;
  either disqualifies (``c10d_collective``, ``nccl_kernel``). Point-to-point sends are not collectives;
* the eager baseline is the NCCL reference, timed the same way.

A rank whose grade fails writes its own message and exits non-zero (torchrun then stops the others); the parent
keeps the earliest failure, which is the cause, not a peer's broken connection. On success rank 0 gathers every
rank's findings and evidence and writes the one message.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import statistics
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Dict, List, Optional, Sequence

from kbsweep.grader.worker import HARNESS_STAGES, GradeFailure, TamperGuard, Worker, classify, one_line
from kbsweep.sandbox import Sandbox

RANK_SEED_STRIDE = 1_000_003
COMM_FINDINGS = ("c10d_collective", "nccl_kernel")  # dynamic findings that disqualify a multi-GPU candidate
# c10d operations (the profiler's CPU-side names) that are collectives; send/recv are point-to-point
COLLECTIVE_OP = re.compile(r"^(c10d|_c10d_functional|c10d_functional)::(?!(send|recv))|^(nccl|gloo):(?!(send|recv))")
NCCL_KERNEL = re.compile(r"nccl", re.IGNORECASE)
COMM_ENV_PREFIXES = ("NCCL_", "TORCH_SYMM_MEM_", "NVSHMEM_", "GLOO_")


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
    from kbsweep.problems import evaluate

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
    from kbsweep.score import geomean, score_grade

    scored = score_grade(worker, SimpleNamespace(regime="compute", peak=spec.peak, score=spec.score), roofline)
    link = roofline.get("nvlink_gbps")
    link = link / 2 if link else None  # datasheet NVLink figures count both directions; busbw counts one
    ceiling = bus_ceiling(spec.constraints["collective"], world)
    for shape, entry in zip(scored["shapes"], worker["timings"]):
        bus = entry["work"]["bus_bytes"]
        shape["busbw_gbps"] = bus / (shape["ms"] * 1e-3) / 1e9 if bus else None
        shape["comm_fraction"] = shape["busbw_gbps"] / link if shape["busbw_gbps"] and link else None
        known = [f for f in (shape["comm_fraction"], shape["compute_fraction"]) if f is not None]
        shape["fraction"] = max(known) if known else None
        if shape["comm_fraction"] is not None and shape["comm_fraction"] > ceiling:
            scored["findings"].append(
                {"kind": "physics_violation", "shape": entry["shape"], "detail": f"comm_fraction={shape['comm_fraction']:.3f} > {ceiling:.3f}"}
            )
    fractions = [s["fraction"] for s in scored["shapes"]]
    if spec.score == "roofline" and fractions and None not in fractions:
        scored.update(basis="roofline", score=geomean(fractions))
    else:
        scored.update(basis="speedup", score=scored["speedup"].get("eager"))
    if scored["findings"]:
        scored["score"] = None
    return scored


# -- parent side ---------------------------------------------------------------------------------------------
def watch_memory(marker: str, memory_mib: float, stop: threading.Event, verdict: List[str]) -> None:
    """Kill the torchrun tree (our child whose command line names ``marker``) when a rank's RSS passes the cap."""
    import psutil

    from kbsweep.torchrun import kill_tree

    me = psutil.Process()
    while not stop.wait(0.2):
        for child in me.children():
            try:
                if marker not in " ".join(child.cmdline()):
                    continue
                procs = [child, *child.children(recursive=True)]
                if max(p.memory_info().rss for p in procs) / 2**20 > memory_mib:
                    verdict.append(f"a rank exceeded {memory_mib:.0f} MiB of host memory")
                    kill_tree(child.pid)
                    return
            except psutil.Error:
                continue


def read_messages(folder: Path, nonce: str) -> tuple:
    """(messages, forged): every rank's message; a line without the nonce, or a second line, is a forgery."""
    messages, forged = [], False
    for path in sorted(folder.glob("rank*.json")):
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
        try:
            parsed = [json.loads(line) for line in lines]
        except ValueError:
            parsed = [{}]
        if len(parsed) > 1 or any(m.get("nonce") != nonce for m in parsed):
            forged = True
        messages += [m for m in parsed[:1] if m.get("nonce") == nonce]
    return messages, forged


def rank_exits(log_dir: Path) -> Dict[int, str]:
    """Non-zero exits of ranks from torchrun's failure summary: {rank: "exitcode : -11 (pid: ...) (SIGSEGV)"}."""
    exits, rank = {}, None
    for line in (log_dir / "torchrun_stderr.log").read_text(errors="replace").splitlines():
        found = re.match(r"\s*rank\s*:\s*(\d+)", line)
        if found:
            rank = int(found.group(1))
        elif rank is not None and re.match(r"\s*exitcode\s*:", line):
            exits[rank] = " ".join(line.split())
    return exits


def crashed(exits: Dict[int, str]) -> Dict[int, str]:
    """Ranks killed by a signal other than the SIGTERM/SIGKILL of a teardown (a segfault, an abort, ...)."""
    return {rank: line for rank, line in exits.items() if re.search(r": -\d+", line) and not re.search(r": -(9|15)\b", line)}


def supervise_ranks(
    request: Dict[str, Any],
    log_dir: Path,
    timeout_s: float,
    memory_mib: float,
    env: Dict[str, str],
    sandbox: Sandbox,
    readonly: Sequence[Path],
) -> Dict[str, Any]:
    """Run one grade at ``request['world_size']`` ranks under torchrun, torchrun and every rank in ``sandbox`` (as
    :func:`kbsweep.grader.supervise`: ``readonly`` seen, the workdir and the ranks' message folder writable), and
    return its one result message."""
    from kbsweep.torchrun import run_torchrun

    folder = Path(tempfile.mkdtemp(prefix="kbsweep-ranks-"))  # mode 0700, outside the candidate's folder
    nonce = secrets.token_hex(16)
    request_path = folder / "request.json"
    request_path.write_text(json.dumps({**request, "nonce": nonce, "results": str(folder)}))
    stop, hog = threading.Event(), []
    watcher = threading.Thread(target=watch_memory, args=(str(request_path), memory_mib, stop, hog), daemon=True)
    if memory_mib:
        watcher.start()
    # the host's communication-library settings reach the ranks whatever the grade's environment keeps
    # (NCCL_NVLS_ENABLE=0 and the like are operators' safety switches, not secrets)
    comm = {k: v for k, v in os.environ.items() if k.startswith(COMM_ENV_PREFIXES)}
    if sandbox.confined:  # its network namespace has loopback only: the host's interface names mean nothing there
        comm.update(GLOO_SOCKET_IFNAME="lo", NCCL_SOCKET_IFNAME="lo")
    workdir = Path(request["workdir"])
    try:
        run = run_torchrun(
            request["world_size"], __name__, [request_path], log_dir=log_dir, timeout_s=timeout_s,
            cwd=workdir, env={**comm, **env}, sandbox=sandbox, writable=[workdir, folder], readonly=readonly,
        )
    finally:
        stop.set()
        if memory_mib:
            watcher.join()
    messages, forged = read_messages(folder, nonce)
    shutil.rmtree(folder, ignore_errors=True)
    if forged:
        return {"ok": False, "outcome": "runtime_error", "message": "forged or repeated result message on the grader channel", "forged": True}
    failures = sorted((m for m in messages if not m["ok"]), key=lambda m: m["at"])
    exits = rank_exits(log_dir)
    silent = {rank: line for rank, line in crashed(exits).items() if rank not in {m["rank"] for m in messages}}
    if hog:
        return {"ok": False, "outcome": "grade_oom", "message": hog[0]}
    if silent:  # a rank that died by a signal is the cause; its peers only saw a broken connection
        rank = min(silent)
        return {"ok": False, "outcome": "runtime_error", "message": f"rank {rank}: grading process died ({silent[rank]})"}
    if failures:
        message = failures[0]  # the earliest: the cause, not a peer's broken connection
        if not re.search(r"\brank \d+:", message["message"]):
            message["message"] = f"rank {message['rank']}: {message['message']}"
    elif run.timed_out:
        return {"ok": False, "outcome": "grade_timeout", "message": f"grading exceeded {timeout_s:.0f} s"}
    elif run.stopped:  # the disk quota of the writable folders
        return {"ok": False, "outcome": "runtime_error", "message": f"grading processes {run.stopped[1]}"}
    else:
        done = [m for m in messages if m["ok"] and m["rank"] == 0]
        if not done or run.returncode != 0:
            detail = "; ".join(f"rank {rank}: {line}" for rank, line in sorted(exits.items())) or f"torchrun exit code {run.returncode}"
            return {"ok": False, "outcome": "runtime_error", "message": f"grading process died ({detail})"}
        message = done[0]
    for key in ("nonce", "rank", "at"):
        message.pop(key, None)
    return message


# -- rank side -----------------------------------------------------------------------------------------------
def watch_comm(guard: TamperGuard, reference: Any) -> TamperGuard:
    """Widen the worker's guard to ``torch.distributed``, ``ProcessGroup``'s methods and the reference's callables."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    extra = {}
    for owner in (dist, c10d, dist.ProcessGroup, reference.Model, reference):
        label = "reference" if owner is reference else getattr(owner, "__qualname__", owner.__name__)
        for name, value in vars(owner).items():
            mine = owner is not reference or getattr(value, "__module__", None) == reference.__name__
            if callable(value) and not name.startswith("__") and mine:
                extra[f"{label}.{name}"] = (owner, name)
    guard.watched.update(extra)
    guard.original.update({key: getattr(obj, attr) for key, (obj, attr) in extra.items()})
    return guard


class RankWorker(Worker):
    """One rank's grade: the single-process worker's stages, with ranks agreeing on every verdict."""

    def __init__(self, request: Dict[str, Any], rank: int, world: int, control: Any):
        super().__init__(request)
        import torch.distributed as dist

        self.dist, self.rank, self.world, self.control = dist, rank, world, control
        self.device_gate()

    # Worker.run() builds its TamperGuard after loading the reference, before importing the candidate; this
    # setter widens it at that moment, so the snapshot of torch.distributed and the reference predates the candidate.
    @property
    def guard(self) -> TamperGuard:
        return self._guard

    @guard.setter
    def guard(self, guard: TamperGuard) -> None:
        self._guard = watch_comm(guard, self.ref)

    def gather(self, value: Any) -> List[Any]:
        """Every rank's ``value``, in rank order (gloo control group: no NCCL traffic, no GPU work)."""
        out: List[Any] = [None] * self.world
        self.dist.all_gather_object(out, value, group=self.control)
        return out

    def barrier(self) -> None:
        self.dist.barrier(group=self.control)

    def sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()

    def device_gate(self) -> None:
        torch = self.torch
        name = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu"
        names = self.gather(name)
        self.evidence["devices"] = names
        if len(set(names)) > 1:
            raise GradeFailure("harness_error", f"device gate: ranks run on different devices {names}")

    def seeded(self, seed: int) -> None:
        self.torch.manual_seed(seed + self.rank * RANK_SEED_STRIDE)

    # -- verdicts every rank agrees on ----------------------------------------------------------------------
    def agree(self, failure: Optional[tuple]) -> None:
        """All ranks exchange (kind, message) or None; any tamper disqualifies, any check failure fails."""
        failures = [(rank, f) for rank, f in enumerate(self.gather(failure)) if f]
        tampered = [f"rank {rank}: {msg}" for rank, (kind, msg) in failures if kind == "tamper"]
        if tampered:
            raise GradeFailure("disqualified", f"grader_tamper: {'; '.join(tampered)}")
        if failures:
            rank, (_, msg) = failures[0]
            raise self.checks.CheckFailure(f"rank {rank}: {msg}")

    def agreed(self, step: Callable[[], Any]) -> Any:
        result, failure = None, None
        try:
            result = step()
        except self.checks.CheckFailure as exc:
            failure = ("check", str(exc))
        before = len(self.findings)
        self.guard.check(self.findings)
        if len(self.findings) > before:
            failure = ("tamper", ", ".join(f["detail"] for f in self.findings[before:]))
        self.agree(failure)
        return result

    def check_case(self, ref_model, cand_model, inputs, tolerance=None, fill: int = 0xFF):
        return self.agreed(lambda: super(RankWorker, self).check_case(ref_model, cand_model, inputs, tolerance, fill))

    def pointer_cache_probe(self, ref_model, cand_model, shape, seed) -> None:
        self.agreed(lambda: super(RankWorker, self).pointer_cache_probe(ref_model, cand_model, shape, seed))

    def correctness(self) -> Dict[str, Any]:
        self.agreed(lambda: None)  # a candidate that patched something at import is caught before any check
        result = super().correctness()
        for shape in self.req["shapes"]:
            model = self.build(self.cand.ModelNew, shape, 42)
            model.load_state_dict(self.build(self.ref.Model, shape, 42).state_dict(), strict=True)
            self.evidence.setdefault("profile", []).append({"shape": shape, **self.profile(model, self.inputs(shape, 2026))})
        return result

    # -- timing -----------------------------------------------------------------------------------------------
    def timer(self, fn: Callable, input_sets, recheck=None) -> Dict[str, Any]:
        """Barrier, then one call timed on every rank; the call's time is the slowest rank's."""
        from dataclasses import replace

        from kbsweep.grader import timing

        torch, cuda = self.torch, self.device.type == "cuda"
        cfg = timing.TimingConfig(**self.req.get("timing", {}))
        cfg = cfg if cuda else replace(cfg, max_time_s=min(cfg.max_time_s, 2.0))  # the CPU path's bound
        enqueue_us = []
        for i in range(cfg.warmup_runs):
            self.sync()
            self.barrier()
            t0 = time.perf_counter()
            fn(*input_sets[i % len(input_sets)])
            enqueue_us.append((time.perf_counter() - t0) * 1e6)
        self.sync()
        hide = cuda and self.spec.get("regime") != "latency"
        spin_us = max(self.gather(min(2 * statistics.median(enqueue_us) + 20, 5000))) if hide else 0
        result: Dict[str, Any] = {"spin_us": spin_us}
        if cuda:
            flush = timing.L2Flush(self.req["l2_bytes"])
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            result.update(l2_flush_bytes=flush.nbytes, persisting_l2_reset=timing.reset_persisting_l2())
        per_rank: List[List[float]] = [[] for _ in range(self.world)]
        slowest, wall, rechecked, elapsed = [], [], 0, 0.0
        gen = torch.Generator().manual_seed(1234)  # the same draws on every rank
        began = time.perf_counter()
        while not timing.stop(slowest, cfg, elapsed):
            inputs = input_sets[len(slowest) % len(input_sets)]
            if cuda:
                flush()
            self.sync()
            self.barrier()
            t0 = time.perf_counter()
            if spin_us:
                torch.cuda._sleep(int(spin_us * timing.SPIN_CYCLES_PER_US))
            if cuda:
                start.record()
            out = fn(*inputs)
            if cuda:
                end.record()
            self.sync()
            host_ms = (time.perf_counter() - t0) * 1e3 - spin_us / 1e3
            mine = torch.tensor([start.elapsed_time(end) if cuda else host_ms, host_ms, time.perf_counter() - began], dtype=torch.float64)
            rows = torch.empty(self.world * 3, dtype=torch.float64)
            self.dist.all_gather_into_tensor(rows, mine, group=self.control)
            rows = rows.view(self.world, 3)
            for rank, ms in enumerate(rows[:, 0].tolist()):
                per_rank[rank].append(ms)
            slowest.append(rows[:, 0].max().item())
            wall.append(rows[:, 1].max().item())
            elapsed = rows[:, 2].max().item()
            if recheck is not None and (len(slowest) == 1 or torch.rand((), generator=gen).item() < cfg.recheck_fraction):
                recheck(inputs, out)
                rechecked += 1
        medians = [statistics.median(samples) for samples in per_rank]
        result.update(timing.summarize(slowest, wall))
        result.update(rechecked=rechecked, per_rank_median_ms=medians, slowest_rank=medians.index(max(medians)))
        return result

    def profile(self, model, inputs, calls: int = 3) -> Dict[str, Any]:
        """The worker's GPU profile (kernels, streams) plus the c10d ops of ``calls`` candidate calls (CPU side);
        a c10d collective, or an NCCL kernel, is a finding."""
        from torch.profiler import ProfilerActivity, profile

        profiled = super().profile(model, inputs, calls) if self.device.type == "cuda" else {}
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(calls):
                self.run_candidate(model, inputs)
        profiled["collectives"] = sorted({event.name for event in prof.events() if COLLECTIVE_OP.match(event.name)})
        nccl = sorted(name for name in profiled.get("kernels", {}) if NCCL_KERNEL.search(name))
        for kind, names in (("c10d_collective", profiled["collectives"]), ("nccl_kernel", nccl)):
            if names and not any(f["kind"] == kind for f in self.findings):
                self.findings.append({"kind": kind, "detail": ", ".join(names)})
        return profiled

    # -- the whole grade --------------------------------------------------------------------------------------
    def run(self) -> Optional[Dict[str, Any]]:
        """Worker.run on every rank; rank 0 returns the result with every rank's findings (tagged) and evidence."""
        result = super().run()
        self.monitor.close()  # flags undone, files re-hashed: before the evidence travels
        ranks = self.gather({"findings": self.findings, "evidence": self.evidence, "worst": result["correctness"]["worst"]})
        if self.rank != 0:
            return None
        result["findings"] = [{**f, "rank": r} for r, part in enumerate(ranks) for f in part["findings"]]
        # rank 0's evidence where a single-process grade keeps it (the audit reads it there), the others beside it
        result["evidence"] = {**self.evidence, "world_size": self.world, "other_ranks": [part["evidence"] for part in ranks[1:]]}
        worst = result["correctness"]["worst"]
        result["correctness"].update(world_size=self.world, worst={k: max(p["worst"][k] for p in ranks) for k in worst})
        return result


def main() -> None:
    import torch.distributed as dist

    from kbsweep.torchrun import init_distributed

    request_path = Path(sys.argv[1])
    rank, world, device = init_distributed()
    request = json.loads(request_path.read_text())
    nonce = request.pop("nonce")
    fd = os.open(Path(request.pop("results")) / f"rank{rank}.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    channel = os.fdopen(fd, "w")
    control = dist.new_group(backend="gloo")
    dist.barrier(group=control)
    if rank == 0:
        request_path.unlink()  # every rank has read it: the nonce now lives in memory only
    request["device"] = device
    worker, message = None, None
    try:
        worker = RankWorker(request, rank, world, control)
        result = worker.run()
        message = {"ok": True, "result": result} if rank == 0 else None
    except GradeFailure as exc:
        message = {"ok": False, "outcome": exc.outcome, "message": str(exc)}
    except BaseException as exc:  # noqa: BLE001 - report everything, classify by stage
        stage = worker.stage if worker else "load_reference"
        outcome = "harness_error" if stage in HARNESS_STAGES else classify(exc)
        message = {"ok": False, "outcome": outcome, "message": f"{stage}: {one_line(exc)}"}
        traceback.print_exc()
    if worker is not None and message and not message["ok"]:
        if worker.monitor is not None:
            worker.monitor.close()  # flags undone, files re-hashed, as in the single-process worker
        message.update(stage=worker.stage, findings=worker.findings, evidence=worker.evidence)
    if message:
        channel.write(json.dumps({**message, "nonce": nonce, "rank": rank, "at": time.time()}, default=str) + "\n")
        channel.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if message is None or message["ok"] else 1)  # a failing rank makes torchrun stop the others


if __name__ == "__main__":
    main()
