"""Writes the baselines timed on a card into the checkout's seed for its GPU config (docs/grading.md, "Baselines and score").

    python3 scripts/store_baselines.py GPU SOURCE [SOURCE ...] [--out FILE]

Each SOURCE is a baseline cache file (``outputs/baselines/<GPU>.json``, as grades on that card left it) or one grade's
JSON (``kbsweep grade`` prints it). Every timed baseline of GPU config GPU in them becomes a record of the seed file
(default ``baselines/<GPU>.json``; the format of :func:`kbsweep.grader.baselines.load_seed`), merged with the records
already there (a record of the same key is replaced). The file is then loaded as a grade would load it, and the
records it would refuse are listed. To record a seed on a card, grade each problem's bundled solution there with an
empty outputs folder, then store that folder's cache:

    KBSWEEP_OUTPUTS=/tmp/seed kbsweep grade problem=demo/scale_shift solution=problems/demo/scale_shift/solutions/triton.py gpu=h100
    python3 scripts/store_baselines.py h100 /tmp/seed/baselines/h100.json
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kbsweep.grader.baselines import SEED_FORMAT, load_seed, record_key  # noqa: E402


def timings_in(data: Any) -> Iterator[Dict[str, Any]]:
    """The stored baseline timings of a cache file (a dict of entries) or of a grade's JSON (its timings' baselines)."""
    if isinstance(data, dict) and "timings" in data and "outcome" in data:
        for entry in data.get("timings") or []:
            yield from (b for b in (entry.get("baselines") or {}).values() if isinstance(b, dict))
    elif isinstance(data, dict):
        yield from (entry for entry in data.values() if isinstance(entry, dict))


def record_of(timed: Dict[str, Any]) -> Dict[str, Any]:
    """A seed record from a stored timing that says what it is the timing of (``of``) and under which conditions."""
    parts = timed["of"]
    timing = {k: v for k, v in timed.items() if k not in ("of", "conditions", "record", "compile_mode")}
    return {
        "problem": parts["problem"],
        "deck": parts["deck"],
        "shape": parts["shape"],
        "baseline": parts["baseline"],
        "compile_mode": parts.get("compile_mode"),
        "conditions": timed["conditions"],
        "timing": timing,
    }


def seed_records(gpu: str, sources: List[Path]) -> Dict[str, Dict[str, Any]]:
    found = {}
    for source in sources:
        for timed in timings_in(json.loads(source.read_text())):
            if (
                isinstance(timed.get("of"), dict)
                and timed["of"].get("gpu") == gpu
                and isinstance(timed.get("median_ms"), (int, float))
            ):
                record = record_of(timed)
                found[record_key(record, gpu)] = record
    return found


def checkout() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: List[str]) -> None:
    out = Path(argv[argv.index("--out") + 1]) if "--out" in argv else None
    args = [a for i, a in enumerate(argv) if a != "--out" and (i == 0 or argv[i - 1] != "--out")]
    gpu, sources = args[0], [Path(a) for a in args[1:]]
    out = out or REPO / "baselines" / f"{gpu}.json"
    records: Dict[str, Dict[str, Any]] = {}
    if out.exists():
        old = json.loads(out.read_text())
        for record in old.get("records") or []:
            records[record_key(record, gpu)] = record
    new = seed_records(gpu, sources)
    records.update(new)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "format": SEED_FORMAT,
                "gpu": gpu,
                "recorded": {"date": time.strftime("%Y-%m-%d"), "checkout": checkout()},
                "records": [records[k] for k in sorted(records)],
            },
            indent=1,
            sort_keys=True,
        )
        + "\n"
    )
    accepted, refused = load_seed(out, gpu)
    print(
        f"{len(new)} baseline timings stored in {out} ({len(accepted)} records served to grades, {len(refused)} refused)"
    )
    for why in refused:
        print(f"  refused: {why}")


if __name__ == "__main__":
    main(sys.argv[1:])
