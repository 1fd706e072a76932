"""Baseline timings (eager, torch.compile, SOTA) cached per problem, deck version, GPU and software versions."""
from __future__ import annotations

import fcntl
import json
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional


TIMER_VERSION = "8"  # the method of kbsweep/grader/shared/timing.py (3: the referee's batches; 4: baselines profiled as the candidate; 5: graph replays scored; 6: the referee's clock scored, a captured replay always; 7: GPU baselines timed on a quiet host, its load recorded; 8: ci95_ms the median's interval, not the mean's); a new one re-times baselines


def conditions(env: Dict[str, Any]) -> Dict[str, str]:
    """What a timing depends on besides the problem, shape and GPU model, from a grade's ``env`` record: software
    versions, the driver, and the host runtime (a hypervisor moves launch costs: a number measured under one must
    not be served under another)."""
    drivers = sorted({str(g.get("driver")) for g in env.get("gpus") or []})
    return {
        "torch": str(env.get("torch")),
        "triton": str(env.get("triton")),
        "cuda": str(env.get("cuda")),
        "driver": ",".join(drivers) or "none",
        "runtime": str(env.get("runtime")),
        "timer": TIMER_VERSION,
    }


def entry_key(problem: str, deck: str, gpu: str, env: Dict[str, Any], shape: Dict[str, Any], name: str, compile_mode: Optional[str] = None) -> str:
    """The cache key of one baseline timing: everything that changes it (``compile_mode`` for the compile baseline)."""
    shape_text = ",".join(f"{k}={shape[k]}" for k in sorted(shape))
    software = "|".join(f"{k}={v}" for k, v in conditions(env).items())
    mode = f"|mode={compile_mode or 'default'}" if name == "compile" else ""
    return f"{problem}|{deck}|{gpu}|{software}|{shape_text}|{name}{mode}"


class BaselineCache:
    """A JSON file of baseline timings; ``seed_files`` (e.g. the repo's measured baselines) are read-only."""

    def __init__(self, path: Path, seed_files: Optional[List[Path]] = None):
        self.path = Path(path)
        self.entries: Dict[str, Any] = {}
        for seed in seed_files or []:
            if Path(seed).exists():
                self.entries.update(json.loads(Path(seed).read_text()))
        if self.path.exists():
            self.entries.update(json.loads(self.path.read_text()))

    def missing(self, keys_by_name: Dict[str, List[str]]) -> List[str]:
        return [name for name, keys in keys_by_name.items() if not all(k in self.entries for k in keys)]

    def get(self, key: str) -> Optional[Dict[str, Any]]:
        return self.entries.get(key)

    @contextmanager
    def locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def store(self, new: Dict[str, Any]) -> None:
        if not new:
            return
        with self.locked():
            current = json.loads(self.path.read_text()) if self.path.exists() else {}
            current.update(new)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(current, indent=1, sort_keys=True))
            tmp.replace(self.path)
        self.entries.update(new)
