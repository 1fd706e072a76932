"""Baseline timings (eager, torch.compile, SOTA) kept per problem, baseline code, GPU, card, software versions and shape.

Two places hold them: a sweep's cache file (``outputs/baselines/<gpu>.json``: every grade that writes to the same
outputs folder shares it, and a grade reads it again before it decides what to time, so no grade times a baseline
another has stored), and seeds recorded on a card and shipped with a checkout (``baselines/<gpu>.json``, the format of
:func:`load_seed`, written by ``scripts/store_baselines.py``). A record is served only to a grade whose key
(:func:`key_of`) is the record's exactly; the grade says which record each baseline came from (:func:`settle`).
"""

from __future__ import annotations

import fcntl
import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

# The method of kbsweep/grader/shared/timing.py; a new one re-times baselines. 3: the referee's batches; 4: baselines
# profiled as the candidate; 5: graph replays scored; 6: the referee's clock scored, a captured replay always; 7: GPU
# baselines timed on a quiet host, its load recorded; 8: ci95_ms the median's interval, not the mean's; 9: GPU
# baselines stop once their median's interval is within grade.timing.ci_rel.
TIMER_VERSION = "9"
SEED_FORMAT = "kbsweep-baseline-seed/1"
# what a record's conditions hold: the card, the software and the timer; a seed record lacking one is refused
CONDITIONS = ("card", "torch", "triton", "cuda", "driver", "runtime", "timer")
BASELINE_NAMES = ("eager", "compile", "sota", "baseline")


def card(env: Dict[str, Any]) -> str:
    """The GPU model a grade ran on, from its ``env`` record: the names of the GPUs it could take (``graded_on``),
    ``cpu`` for a grade off GPUs (an empty ``graded_on``); a record older than ``graded_on``: every GPU it listed."""
    devices = env["graded_on"] if "graded_on" in env else env.get("gpus") or []
    return ",".join(sorted({str(g.get("name")) for g in devices})) or "cpu"


def conditions(env: Dict[str, Any]) -> Dict[str, str]:
    """What a timing depends on besides the problem, shape and GPU config, from a grade's ``env`` record: the card,
    software versions, the driver, and the host runtime (a hypervisor moves launch costs: a number measured under
    one must not be served under another)."""
    drivers = sorted({str(g.get("driver")) for g in env.get("gpus") or []})
    return {
        "card": card(env),
        "torch": str(env.get("torch")),
        "triton": str(env.get("triton")),
        "cuda": str(env.get("cuda")),
        "driver": ",".join(drivers) or "none",
        "runtime": str(env.get("runtime")),
        "timer": TIMER_VERSION,
    }


def key_of(
    problem: str,
    deck: str,
    gpu: str,
    conds: Dict[str, str],
    shape: Dict[str, Any],
    name: str,
    compile_mode: Optional[str] = None,
) -> str:
    """The key of one baseline timing: everything that changes it (``deck``: the hash of the code baselines run;
    ``compile_mode`` for the compile baseline only)."""
    shape_text = ",".join(f"{k}={shape[k]}" for k in sorted(shape))
    software = "|".join(f"{k}={conds.get(k)}" for k in CONDITIONS)
    mode = f"|mode={compile_mode or 'default'}" if name == "compile" else ""
    return f"{problem}|{deck}|{gpu}|{software}|{shape_text}|{name}{mode}"


def record_key(record: Dict[str, Any], gpu: str) -> str:
    """:func:`key_of` of a seed record (:func:`load_seed`'s format) for GPU config ``gpu``."""
    return key_of(
        record["problem"],
        record["deck"],
        gpu,
        record["conditions"],
        record["shape"],
        record["baseline"],
        record.get("compile_mode"),
    )


def entry_key(
    problem: str,
    deck: str,
    gpu: str,
    env: Dict[str, Any],
    shape: Dict[str, Any],
    name: str,
    compile_mode: Optional[str] = None,
) -> str:
    """:func:`key_of` under the conditions of a grade's ``env`` record."""
    return key_of(problem, deck, gpu, conditions(env), shape, name, compile_mode)


def load_seed(path: Path, gpu: str) -> Tuple[Dict[str, Dict[str, Any]], List[str]]:
    """(entries by key, why each refused record was refused) of a seed file for GPU config ``gpu``::

        {"format": "kbsweep-baseline-seed/1", "gpu": "h100", "recorded": {...where, when, what checkout...},
         "records": [{"problem": "demo/scale_shift", "deck": "<code hash>", "shape": {...}, "baseline": "eager",
                      "compile_mode": null, "conditions": {"card": ..., "driver": ..., "torch": ..., "triton": ...,
                      "cuda": ..., "runtime": ..., "timer": ...}, "timing": {"median_ms": ..., ...}}]}

    A record's key is made from its own fields (never read from the file), so it serves only a grade whose key is
    the same: card, driver, torch, Triton, CUDA, runtime, timer, problem, deck, shape, baseline and compile mode. A
    record missing any of them, of another GPU config or timer, or without a positive median is refused."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        return {}, [f"{path}: unreadable ({exc})"]
    if not isinstance(data, dict) or data.get("format") != SEED_FORMAT or data.get("gpu") != gpu:
        return {}, [f"{path}: not a {SEED_FORMAT} file for gpu {gpu}"]
    entries, refused = {}, []
    for index, record in enumerate(data.get("records") or []):
        why = seed_fault(record, gpu)
        if why:
            refused.append(f"{path}: record {index}: {why}")
            continue
        key = record_key(record, gpu)
        entries[key] = {**record["timing"], "conditions": dict(record["conditions"]), "of": of(record, gpu)}
    return entries, refused


def seed_fault(record: Any, gpu: str) -> Optional[str]:
    """Why a seed record cannot be served, or None."""
    if not isinstance(record, dict):
        return "not an object"
    conditions = record.get("conditions")
    conds = conditions if isinstance(conditions, dict) else {}
    missing = [k for k in ("problem", "deck", "baseline") if not isinstance(record.get(k), str) or not record[k]]
    missing += [f"conditions.{k}" for k in CONDITIONS if conds.get(k) in (None, "", "None")]
    if missing or not isinstance(record.get("shape"), dict) or not record["shape"]:
        return f"missing {', '.join(missing or ['shape'])}"
    if record["baseline"] not in BASELINE_NAMES:
        return f"unknown baseline {record['baseline']!r}"
    if conds["timer"] != TIMER_VERSION:
        return f"timer {conds['timer']}, this checkout's is {TIMER_VERSION}"
    median = (record.get("timing") or {}).get("median_ms") if isinstance(record.get("timing"), dict) else None
    if not isinstance(median, (int, float)) or median <= 0:
        return "no positive timing.median_ms"
    return None


def of(parts: Dict[str, Any], gpu: str) -> Dict[str, Any]:
    """What a record is the timing of (its key's parts but the conditions), kept with it so a cache file converts to
    seed records (``scripts/store_baselines.py``)."""
    return {
        "problem": parts["problem"],
        "deck": parts["deck"],
        "gpu": gpu,
        "shape": dict(parts["shape"]),
        "baseline": parts["baseline"],
        "compile_mode": parts.get("compile_mode") if parts["baseline"] == "compile" else None,
    }


class BaselineCache:
    """A JSON file of baseline timings shared by every grade that names it, read again whenever another process has
    written it; ``seed_files`` (:func:`load_seed`) are read-only, served where the file holds no record of the key.
    ``fresh``: nothing is served, every baseline is timed afresh and replaces the file's record."""

    def __init__(self, path: Path, seed_files: Sequence[Path] = (), gpu: Optional[str] = None, fresh: bool = False):
        self.path, self.fresh = Path(path), fresh
        self.gpu = gpu or self.path.stem
        self.entries: Dict[str, Any] = {}
        self.seeds: Dict[str, Tuple[Dict[str, Any], str]] = {}
        self.refused: List[str] = []  # seed records refused, and why
        for seed in seed_files or []:
            if Path(seed).exists():
                found, refused = load_seed(Path(seed), self.gpu)
                self.seeds.update({key: (entry, str(seed)) for key, entry in found.items()})
                self.refused += refused
        self.stamp: Optional[Tuple[int, int]] = None
        self.refresh()

    def refresh(self) -> None:
        """Read the file again if it changed since this process last read it (another grade stored into it)."""
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            return
        if (stat.st_mtime_ns, stat.st_size) != self.stamp:
            self.entries = json.loads(self.path.read_text())
            self.stamp = (stat.st_mtime_ns, stat.st_size)

    def lookup(self, key: str) -> Optional[Tuple[Dict[str, Any], str, str]]:
        """(the record, ``cache`` or ``seed``, the file) of ``key``, or None (always None when ``fresh``)."""
        if self.fresh:
            return None
        if key in self.entries:
            return self.entries[key], "cache", str(self.path)
        if key in self.seeds:
            entry, where = self.seeds[key]
            return entry, "seed", where
        return None

    def get(self, key: str) -> Optional[Dict[str, Any]]:
        found = self.lookup(key)
        return found[0] if found else None

    def missing(self, keys_by_name: Dict[str, List[str]]) -> List[str]:
        """The baselines some of whose keys no record holds (read after :meth:`refresh`)."""
        self.refresh()
        return [name for name, keys in keys_by_name.items() if not all(self.lookup(k) for k in keys)]

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
            tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(current, indent=1, sort_keys=True))
            tmp.replace(self.path)
            self.stamp = None
        self.refresh()


def settle(
    timings: List[Dict[str, Any]],
    keys: Dict[str, List[str]],
    cache: Optional[BaselineCache],
    host_env: Dict[str, Any],
    compile_mode: Optional[str],
    parts: Dict[str, Any],
) -> None:
    """Baselines the referee timed go into the cache; the ones it did not time come from it or a seed. Every served
    baseline says which record it is (``record``: its key, ``timed``, ``cache`` or ``seed``, and the file).
    ``parts``: the problem, deck, GPU config and shapes (as keyed) of the keys (:func:`of`)."""
    fresh = {}
    for index, entry in enumerate(timings):
        for name in keys:
            key = keys[name][index]
            if name in entry["baselines"]:
                timed = entry["baselines"][name]
                if timed and "median_ms" in timed:
                    stored = {
                        **timed,
                        "conditions": conditions(host_env),
                        **({"compile_mode": compile_mode} if name == "compile" else {}),
                        "of": of(
                            {**parts, "shape": parts["shapes"][index], "baseline": name, "compile_mode": compile_mode},
                            parts["gpu"],
                        ),
                    }
                    fresh[key] = stored
                    entry["baselines"][name] = {
                        **stored,
                        "record": {"key": key, "source": "timed", "file": str(cache.path) if cache else None},
                    }
                elif not (timed or {}).get(
                    "retry"
                ):  # an error, a skip or an absent SOTA is kept too (a budget skip is timed later)
                    fresh[key] = {**(timed or {}), "conditions": conditions(host_env)}
            elif cache is not None:
                found = cache.lookup(key)
                entry["baselines"][name] = (
                    {**found[0], "record": {"key": key, "source": found[1], "file": found[2]}} if found else None
                )
    if cache is not None:
        cache.store(fresh)
