"""Scoring: achieved FLOP/s and bytes/s per shape over the GPU's roofline, geomean over shapes."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, cast

from omegaconf import OmegaConf

from kbsweep.errors import KbsweepError

FRACTION_FLOOR = 1e-9


def find_roofline(roots: List[str], name: str) -> Path:
    """roofline_specs/<name>.yaml from the last root that has it."""
    for root in reversed(roots):
        path = Path(root) / f"{name}.yaml"
        if path.exists():
            return path
    raise KbsweepError(f"key 'gpu.roofline': no roofline spec '{name}' (no {name}.yaml in {', '.join(roots)})")


def load_roofline(roots: List[str], name: str) -> Dict[str, Any]:
    """roofline_specs/<name>.yaml, checked: datasheet peaks are finite positive numbers (a typo would score every
    kernel against nonsense, and only after its grade); parsed once per version of the file."""
    from kbsweep.config.file_versions import parsed

    return parsed(find_roofline(roots, name), parse_roofline)


def parse_roofline(path: Path) -> Dict[str, Any]:
    import yaml

    from kbsweep.config.schema import broken_yaml, positive

    try:
        spec = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    except yaml.YAMLError as exc:
        raise broken_yaml(path, exc) from None
    except Exception as exc:  # a bad interpolation
        raise KbsweepError(f"{path}: {str(exc).splitlines()[0]}") from None
    if not isinstance(spec, dict):
        raise KbsweepError(f"{path}: not a mapping of keys")
    peaks = spec.get("peaks_tflops")
    if not isinstance(peaks, dict) or not peaks:
        raise KbsweepError(f"{path}: key 'peaks_tflops' is required: a mapping of precision to TFLOP/s")
    for precision, value in peaks.items():
        if not positive(value):
            raise KbsweepError(
                f"{path}: key 'peaks_tflops.{precision}': must be a number of TFLOP/s > 0, got {value!r}"
            )
    if not positive(spec.get("dram_gbps")):
        raise KbsweepError(f"{path}: key 'dram_gbps' is required: a number of GB/s > 0, got {spec.get('dram_gbps')!r}")
    for key in ("l2_mib", "nvlink_gbps", "sm_count"):
        if spec.get(key) is not None and not positive(spec[key]):
            raise KbsweepError(f"{path}: key '{key}': must be a number > 0 or null, got {spec[key]!r}")
    return cast(Dict[str, Any], spec)  # a YAML mapping's keys, named above


def shape_speedups(entry: Dict[str, Any]) -> Dict[str, float]:
    """Each baseline's median time over the candidate's, for one timed shape."""
    ms = entry["candidate"]["median_ms"]
    return {
        name: base["median_ms"] / ms
        for name, base in (entry.get("baselines") or {}).items()
        if base and base.get("median_ms")
    }


def geomean(values: Sequence[Optional[float]]) -> Optional[float]:
    """The geometric mean of the values present (None: none is)."""
    present = [v for v in values if v is not None]
    if not present:
        return None
    return math.exp(sum(math.log(max(v, FRACTION_FLOOR)) for v in present) / len(present))


# GPU MODE's leaderboard criteria (a task.yml's ``ranking_by``; geometric mean where it names none)
RANKINGS = {
    "geom": geomean,
    "mean": lambda ms: sum(ms) / len(ms),
    "last": lambda ms: ms[-1],
}


def gpumode_ranking(shapes: Sequence["ShapeScore"], ranking_by: Optional[str]) -> Dict[str, Any]:
    """A GPU MODE problem's leaderboard figure from kbsweep's timings: ``ranking_by`` over the benchmark shapes'
    times (held-out ones left out, as their leaderboard never times them), in ms, lower is better. A criterion
    kbsweep does not know is named and left uncomputed."""
    by = (ranking_by or "geom").lower()
    ms = [s.ms for s in shapes if not s.held_out]
    if by not in RANKINGS:
        return {"ranking_by": by, "ms": None, "note": f"ranking_by {by!r} is not one of {', '.join(RANKINGS)}"}
    return {"ranking_by": by, "ms": RANKINGS[by](ms) if ms else None, "benchmarks": len(ms)}


@dataclass
class ShapeScore:
    """One timed shape's score (an entry of a grade's ``shapes``): achieved rates, the fractions of the datasheet
    peaks and the governing one, each baseline's speedup; stored by :meth:`to_json` as the grader has always
    written it."""

    shape: Dict[str, Any]
    ms: float
    tflops: Optional[float]
    gbps: Optional[float]
    compute_fraction: Optional[float]
    memory_fraction: Optional[float]
    fraction: Optional[float]
    speedup: Dict[str, float] = field(default_factory=dict)
    baselines_outside_tolerance: List[str] = field(default_factory=list)  # stored only when any
    # a collective (the multi track): bus bandwidth and its fraction of one NVLink direction, stored with it
    collective: bool = False
    busbw_gbps: Optional[float] = None
    comm_fraction: Optional[float] = None
    held_out: bool = False  # a held-out shape (never shown to the agent), stored only when true

    def to_json(self) -> Dict[str, Any]:
        out = {key: getattr(self, key) for key in ALWAYS_STORED}
        if self.baselines_outside_tolerance:
            out["baselines_outside_tolerance"] = self.baselines_outside_tolerance
        if self.collective:
            out.update(busbw_gbps=self.busbw_gbps, comm_fraction=self.comm_fraction)
        if self.held_out:
            out["held_out"] = True
        return out

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> "ShapeScore":
        """A stored entry; a rate it lacks reads as None."""
        values: Dict[str, Any] = {key: data.get(key) for key in ALWAYS_STORED}  # stored JSON
        optional = {f.name: data[f.name] for f in fields(cls) if f.name not in ALWAYS_STORED and f.name in data}
        return cls(**values, **{**optional, "collective": "busbw_gbps" in data})


ALWAYS_STORED = ("shape", "ms", "tflops", "gbps", "compute_fraction", "memory_fraction", "fraction", "speedup")


def shape_label(shape: Any) -> str:
    """A shape as one line, ``k=v, ...`` (a cell run's ``shape<i>`` params)."""
    return ", ".join(f"{k}={v}" for k, v in shape.items()) if isinstance(shape, dict) else str(shape)


def shape_score(
    ms: float,
    work: Dict[str, Optional[float]],
    regime: str,
    peak_key: Optional[str],
    roofline: Dict[str, Any],
    shape: Dict[str, Any],
) -> ShapeScore:
    """Achieved rates and the fraction of the governing datasheet peak for one shape."""
    seconds = ms * 1e-3
    flops, nbytes = work.get("flops"), work.get("bytes")
    tflops = flops / seconds / 1e12 if flops else None
    gbps = nbytes / seconds / 1e9 if nbytes else None
    peak_tflops = roofline["peaks_tflops"].get(peak_key) if peak_key else None
    compute_frac = tflops / peak_tflops if tflops and peak_tflops else None
    memory_frac = gbps / roofline["dram_gbps"] if gbps else None
    if regime == "compute":
        fraction = compute_frac
    elif regime == "memory":
        fraction = memory_frac
    else:  # latency: whichever roof is closer
        fraction = max((f for f in (compute_frac, memory_frac) if f is not None), default=None)
    return ShapeScore(shape, ms, tflops, gbps, compute_frac, memory_frac, fraction)


def score_grade(grade: Dict[str, Any], problem_spec: Any, roofline: Dict[str, Any]) -> Dict[str, Any]:
    """Turn the grader's timings into per-shape scores (:class:`ShapeScore`), speedups, the geomean and physics
    findings (the grader's finding dicts)."""
    shapes_out: List[ShapeScore] = []
    findings = []
    for entry in grade.get("timings", []):
        ms = entry["candidate"]["median_ms"]
        scored = shape_score(ms, entry["work"], problem_spec.regime, problem_spec.peak, roofline, entry["shape"])
        for kind in ("compute_fraction", "memory_fraction"):
            value = getattr(scored, kind)
            if value is not None and value > 1.0:
                findings.append(
                    {"kind": "physics_violation", "shape": entry["shape"], "detail": f"{kind}={value:.3f} > 1.0"}
                )
        scored.speedup = shape_speedups(entry)
        scored.baselines_outside_tolerance = sorted(
            name for name, base in entry.get("baselines", {}).items() if (base or {}).get("outside_tolerance")
        )
        shapes_out.append(scored)
    fractions = [s.fraction for s in shapes_out]
    has_roofline = bool(fractions) and all(f is not None for f in fractions)
    speedup_names = sorted({k for s in shapes_out for k in s.speedup})
    speedups = {name: geomean([s.speedup.get(name) for s in shapes_out]) for name in speedup_names}
    if problem_spec.score == "speedup" or not has_roofline:
        basis = "speedup"
        value = speedups.get("baseline") or speedups.get("eager")
    else:
        basis = "roofline"
        value = geomean(fractions)
    if findings:
        value = None  # a fraction above the datasheet peak is never a score
    return {"score": value, "basis": basis, "shapes": shapes_out, "speedup": speedups, "findings": findings}


def score_note(result: Dict[str, Any]) -> Optional[str]:
    """Why a passing grade (the grader's result) has no score, in one line; None for a scored grade or another
    outcome (which says why itself). Nothing timed, a speedup score without a baseline to compare with, or findings
    that void the figures (a rate above the datasheet's, figures the grader does not believe, no kernel of the
    candidate's own on a kernel track: the grader names each in the result's ``findings``)."""
    if result.get("score") is not None or result.get("outcome") != "pass":
        return None
    if not result.get("timings"):
        return "nothing was timed"
    if result.get("basis") == "speedup" and not any(v is not None for v in (result.get("speedup") or {}).values()):
        return "the problem is scored by speedup (no FLOP/byte formulas for the roofline) and no baseline was timed"
    findings = result.get("findings") or []
    named = "; ".join(f"{f['kind']}" + (f" ({f['detail']})" if f.get("detail") else "") for f in findings)
    return f"findings void the figures: {named}" if findings else "no figure to score"
