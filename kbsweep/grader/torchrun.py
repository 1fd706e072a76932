"""Multi-GPU grades: a module run under torchrun on one node, inside the cell's own allocation.

A multi-track cell (``track.world_size: N``) runs where its launcher put it: locally, a process whose GPU pool is
every GPU the sweep may use; under Slurm, one task on one node with ``--gpus-per-node=N``
(:meth:`kbsweep.launch.launchers.SlurmLauncher.parameters`). Either way its grade does the same thing::

    with device_lock(gpu.device, count=n):            # n GPUs held machine-wide, pinned in CUDA_VISIBLE_DEVICES
        run = run_torchrun(n, "package.module", [args], log_dir=..., timeout_s=..., env=...,
                           sandbox=..., writable=[...], readonly=[...])   # torchrun and every rank in one sandbox
    run.timed_out, run.returncode, run.stdout()        # a hung rank or collective is killed with its group

(a grade starts two such torchruns with :func:`spawn_torchrun` and watches them itself: the referee ranks and the
candidate's runner ranks, :mod:`kbsweep.grader.distributed`), and the module, started once per rank, begins with::

    rank, world, device = init_distributed()          # NCCL when CUDA is available, gloo on CPU

``python -m kbsweep.grader.torchrun`` is itself such a worker: an all_reduce smoke check whose rank 0 prints one JSON
line (``kbsweep.grader.torchrun.smoke``), for a rented node or a Slurm allocation (``docs/launch.md``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from kbsweep.grader.shared.ranks import init_distributed
from kbsweep.sandbox.confine import Sandbox
from kbsweep.sandbox.watch import POLL_S, Watch


def kill_tree(pid: int) -> None:
    """SIGKILL a process, its descendants and their process groups (other than the caller's): torchrun puts each
    rank in a session of its own, and a cell's leftovers may have been reparented away from it."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    own = os.getpgrp()
    for proc in procs:
        try:
            group = os.getpgid(proc.pid)
            if group != own:
                os.killpg(group, signal.SIGKILL)
            proc.kill()
        except (ProcessLookupError, psutil.NoSuchProcess):
            pass


def launcher(nproc: int) -> List[str]:
    """``torchrun --standalone --nproc_per_node=N`` with this interpreter (a free port per run). The launcher runs
    isolated (``-I``): its working folder (a candidate's, for runner ranks) never shadows a module it imports."""
    return [sys.executable, "-I", "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]


def torchrun_command(nproc: int, module: str, args: Sequence[str] = ()) -> List[str]:
    """:func:`launcher` running ``python -m module args`` per rank."""
    return [*launcher(nproc), "-m", module, *map(str, args)]


@dataclass
class TorchrunResult:
    returncode: Optional[int]  # None when it was stopped (time or disk)
    timed_out: bool
    wall_s: float
    log_dir: Path
    stopped: Optional[Tuple[str, str]] = None  # the sandbox watch's breach: ("wall" | "disk", message)

    def stdout(self) -> str:
        return (self.log_dir / "torchrun_stdout.log").read_text(errors="replace")

    def stderr(self) -> str:
        return (self.log_dir / "torchrun_stderr.log").read_text(errors="replace")


def spawn_torchrun(
    command: Sequence[str],
    *,
    log_dir: Path,
    name: str = "torchrun",
    cwd: Optional[Path] = None,
    env: Optional[Dict[str, str]] = None,
    sandbox: Optional[Sandbox] = None,
    writable: Sequence[Path] = (),
    readonly: Sequence[Path] = (),
) -> subprocess.Popen:
    """Start a torchrun ``command`` (:func:`torchrun_command`, or :func:`launcher` plus ``--no-python`` and a rank
    command line), its output in ``log_dir/<name>_{stdout,stderr}.log``; the caller watches it and ends it with
    :func:`kill_tree`.

    With a ``sandbox`` (:class:`kbsweep.sandbox.confine.Sandbox`), torchrun and all its ranks run in it, seeing ``readonly``
    and ``writable`` (same paths; ``cwd`` should be one of them) and exactly ``env``. The ranks rendezvous on the
    sandbox's own loopback."""
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ if env is None else env)
    env.setdefault("OMP_NUM_THREADS", "1")
    with open(log_dir / f"{name}_stdout.log", "wb") as out, open(log_dir / f"{name}_stderr.log", "wb") as err:
        if sandbox is None:
            return subprocess.Popen(
                list(command),
                cwd=cwd,
                env=env,
                start_new_session=True,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
            )
        binds = [(Path(p), str(p)) for p in writable]
        return sandbox.popen(
            list(command),
            cwd=str(cwd or writable[0]),
            env=env,
            writable=binds,
            readonly=readonly,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
        )


def run_torchrun(
    nproc: int,
    module: str,
    args: Sequence[str] = (),
    *,
    log_dir: Path,
    timeout_s: float,
    cwd: Optional[Path] = None,
    env: Optional[Dict[str, str]] = None,
    sandbox: Optional[Sandbox] = None,
    writable: Sequence[Path] = (),
    readonly: Sequence[Path] = (),
) -> TorchrunResult:
    """Run :func:`torchrun_command` (:func:`spawn_torchrun`) and wait; past ``timeout_s`` torchrun and every rank
    are killed. With a ``sandbox``, the growth of ``writable`` is held to the policy's disk quota."""
    started = time.monotonic()
    proc = spawn_torchrun(
        torchrun_command(nproc, module, args),
        log_dir=log_dir,
        cwd=cwd,
        env=env,
        sandbox=sandbox,
        writable=writable,
        readonly=readonly,
    )
    watch = Watch(proc, timeout_s, None, sandbox.policy.disk_mib if sandbox else 0, list(writable) if sandbox else [])
    stopped = None
    try:  # not Watch.wait: it kills torchrun's group first, and ranks in groups of their own would then be orphans
        while proc.poll() is None and not (stopped := watch.breach()):
            time.sleep(POLL_S)
    finally:
        kill_tree(proc.pid)  # a hung launcher and its ranks (the sandbox's too); nothing once it has exited
        proc.wait()
    code = None if stopped else proc.returncode
    return TorchrunResult(
        code, bool(stopped and stopped[0] == "wall"), time.monotonic() - started, Path(log_dir), stopped
    )


def smoke() -> Dict[str, object]:
    """Every rank adds rank + 1 through all_reduce; the expected sum is world * (world + 1) / 2."""
    import torch
    import torch.distributed as dist

    rank, world, device = init_distributed()
    total = torch.tensor([rank + 1.0], device=device)
    dist.all_reduce(total)
    report = {
        "rank": rank,
        "world": world,
        "backend": dist.get_backend(),
        "sum": total.item(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "host": os.uname().nodename,
    }
    dist.destroy_process_group()
    return report


if __name__ == "__main__":
    result = smoke()
    if result["rank"] == 0:
        print(json.dumps(result), flush=True)
