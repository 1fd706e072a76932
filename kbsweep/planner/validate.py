"""Validation at plan time: everything a sweep's cells will read, checked before anything is launched or paid for.

Configs are checked by their schemas and :data:`kbsweep.config.schema.RULES`; here: the roofline spec each GPU points at
(:func:`kbsweep.score.roofline.load_roofline`), each problem against the cell's shape set and roofline (shape values,
tolerance keys, the peak and formulas it is scored with), and each reference. A reference is deck code that
may hang or crash, so it is probed in a subprocess of its own (``python -m kbsweep.planner.validate``): import,
``Model``, ``get_init_inputs``/``get_inputs`` and one forward on the smallest shape, on the meta device (shapes
only: no compute, no GPU needed). A reference that passed is remembered by content hash in the user's cache
(``~/.cache/kbsweep/validated.json``, for any outputs folder), so a plan stays quick. Every error is one line
naming the file and key.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Optional, Tuple

from kbsweep.config.problems import HELD_OUT, Problem, load_problem
from kbsweep.config.schema import is_number
from kbsweep.errors import KbsweepError
from kbsweep.paths import REPO_ROOT, user_cache
from kbsweep.score.roofline import load_roofline

if TYPE_CHECKING:  # a type only: the matrix calls this module, so a runtime import would run back
    from kbsweep.planner.matrix import Cell

# torch dtype names a tolerance may be keyed by (checks.dtype_key of an output's dtype)
DTYPES = (
    "float64",
    "float32",
    "float16",
    "bfloat16",
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
    "complex64",
    "complex128",
)
TOLERANCE_KEYS = ("atol", "rtol", "cosine")
PROBE_TIMEOUT_S = 120.0  # torch's import dominates; a reference that hangs past it is an error
PROBE_EACH_S = 10.0  # and this much more per reference probed (a KernelBench level probes 100 in one process)
# a forward that fails for the probe's device, not the reference's code: data-dependent ops on meta, GPU-only ops
DEVICE_BOUND = re.compile(r"meta|cpu|cuda|not implemented|not supported|accelerator", re.I)


def check_cells(cells: List[Cell]) -> None:
    """Raise a KbsweepError (one line) for the first thing any cell would trip over."""
    probes: Dict[str, Tuple[Path, Dict[str, Any], bool]] = {}
    checked = set()
    for cell in cells:
        what = (
            cell.problem_dir,
            cell.track["name"],
            cell.gpu.shape_set,
            tuple(cell.paths["roofline_specs"]),
            cell.gpu.roofline,
        )
        if what in checked:  # a sweep's repeats and models check the same problems
            continue
        checked.add(what)
        roofline = load_roofline(cell.paths["roofline_specs"], cell.gpu.roofline)
        problem = load_problem(Path(cell.problem_dir), cell.track["name"])
        check_problem(problem, cell.gpu.shape_set, roofline, cell.gpu.roofline)
        probes[str(problem.grader_reference)] = reference_probe(problem)
    if cells:
        check_references(probes.values())


def reference_probe(problem: Problem) -> Tuple[Path, Dict[str, Any], bool]:
    """(reference, its smallest shape, whether to build and run it): a collective's model and inputs need its
    ranks' process group, so only its import is probed."""
    return problem.grader_reference, smallest(problem), not problem.spec.constraints.get("collective")


def check_problem(problem: Problem, shape_set: str, roofline: Dict[str, Any], roofline_name: str) -> None:
    """Shape values, tolerances, stress scales, score, seeds and peak of one problem, against the shape set it is
    graded on and the roofline it is scored on (:func:`~kbsweep.config.problems.load_problem` checked regime and formulas)."""
    path = problem.root / "problem.yaml"
    spec = problem.spec
    for group in ("shapes", shape_set, "held_out_shapes", HELD_OUT[shape_set]):
        for i, shape in enumerate(getattr(spec, group)):
            for key, value in shape.items():
                size = isinstance(value, int) and not isinstance(value, bool)
                if (size and value < 1) or (isinstance(value, float) and not (math.isfinite(value) and value >= 0)):
                    raise KbsweepError(
                        f"{path}: key '{group}[{i}].{key}': must be a size >= 1 (a float >= 0), got {value!r}"
                    )
    tables = [("tolerance", spec.tolerance)] + [
        (f"stress[{i}].tolerance", case.tolerance) for i, case in enumerate(spec.stress)
    ]
    for where, table in tables:
        for dtype, tolerance in (table or {}).items():
            check_tolerance(path, f"{where}.{dtype}", dtype, tolerance)
    for i, case in enumerate(spec.stress):
        for key in ("input_scale", "weight_scale"):
            if not (math.isfinite(getattr(case, key)) and getattr(case, key) > 0):
                raise KbsweepError(f"{path}: key 'stress[{i}].{key}': must be a number > 0, got {getattr(case, key)!r}")
    if spec.score not in ("roofline", "speedup"):
        raise KbsweepError(f"{path}: key 'score': must be roofline or speedup, got {spec.score!r}")
    if spec.seeds < 1:
        raise KbsweepError(f"{path}: key 'seeds': must be an integer >= 1, got {spec.seeds!r}")
    if spec.peak and spec.peak not in roofline["peaks_tflops"]:
        raise KbsweepError(
            f"{path}: key 'peak': '{spec.peak}' is not a peak of roofline spec '{roofline_name}' ({', '.join(roofline['peaks_tflops'])})"
        )


def check_tolerance(path: Path, where: str, dtype: str, tolerance: Any) -> None:
    if dtype not in DTYPES:
        raise KbsweepError(f"{path}: key '{where}': '{dtype}' is not a dtype name ({', '.join(DTYPES)})")
    values = tolerance if isinstance(tolerance, dict) else {"atol": tolerance}
    for key, value in values.items():
        if key not in TOLERANCE_KEYS:
            raise KbsweepError(f"{path}: key '{where}.{key}': unknown (one of {', '.join(TOLERANCE_KEYS)})")
        top = 1.0 if key == "cosine" else math.inf
        if not (is_number(value) and 0 <= value <= top):
            raise KbsweepError(f"{path}: key '{where}.{key}': must be a number in [0, {top}], got {value!r}")


def smallest(problem: Problem) -> Dict[str, Any]:
    """The shape with the fewest elements (product of its integer values) of either shape set: the cheapest probe.
    A KernelBench problem's shapes are overrides of its file's sizes (``{}`` is the file as written, its largest):
    its smoke shape, sized to fit the CPU budget, is the probe's."""
    shapes = (
        problem.shapes("smoke_shapes")
        if problem.spec.kernelbench
        else problem.shapes("shapes") + problem.shapes("smoke_shapes")
    )
    return min(shapes, key=lambda s: math.prod(v for v in s.values() if isinstance(v, int) and not isinstance(v, bool)))


def cache_file() -> Path:
    return user_cache() / "validated.json"


def check_references(probes: Iterable[Tuple[Path, Dict[str, Any], bool]], prober: Optional[Callable] = None) -> None:
    """Probe every reference not already known good (one process for all: forked by ``prober``, see
    :func:`kbsweep.grader.processes.referee_prober`, else a subprocess); remember the good ones."""
    cache = cache_file()
    known = known_good(cache)
    todo = [(path, shape, forward, digest(path, shape)) for path, shape, forward in probes]
    todo = [t for t in todo if t[3] not in known]
    if not todo:
        return
    request = json.dumps(
        [{"reference": str(path), "shape": shape, "forward": forward} for path, shape, forward, _ in todo]
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "CUDA_VISIBLE_DEVICES": ""}
    limit = PROBE_TIMEOUT_S + PROBE_EACH_S * len(todo)
    try:
        ran = prober(request, limit) if prober else None
        if ran is None:
            proc = subprocess.run(
                [sys.executable, "-m", "kbsweep.planner.validate"],
                input=request,
                capture_output=True,
                text=True,
                env=env,
                timeout=limit,
                cwd=REPO_ROOT,
            )
            ran = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired:
        raise KbsweepError(
            f"{todo[0][0]}: probing the references took over {limit:.0f} s (a reference hangs on import or forward?)"
        ) from None
    code, stdout, stderr = ran
    lines = stdout.strip().splitlines()
    if code != 0 or not lines:
        tail = (stderr.strip().splitlines() or [f"exit code {code}"])[-1]
        raise KbsweepError(f"{todo[0][0]}: the reference probe died ({tail[:300]})")
    for (path, _, _, key), error in zip(todo, json.loads(lines[-1])):
        if error:
            raise KbsweepError(f"{path}: {error}")
        known.add(key)
    cache.parent.mkdir(parents=True, exist_ok=True)
    with open(cache.with_name(f".{cache.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # what other processes added since the read is merged, not overwritten
        partial = cache.with_name(f".{cache.name}.{os.getpid()}")
        partial.write_text(json.dumps(sorted(known | known_good(cache))))
        partial.replace(cache)


def known_good(cache: Path) -> set:
    try:
        return set(json.loads(cache.read_text()))
    except (OSError, ValueError):  # none yet, or unreadable: probe again
        return set()


def digest(reference: Path, shape: Dict[str, Any]) -> str:
    """The probe's identity: the reference's code (an adapter's too: the files beside it) and the shape."""
    hasher = hashlib.sha256(json.dumps(shape, sort_keys=True).encode())
    for path in sorted(reference.parent.glob("*.py")):
        hasher.update(path.name.encode() + b"\0" + path.read_bytes())
    return hasher.hexdigest()[:24]


def one_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


def probe(reference: str, shape: Dict[str, Any], forward: bool) -> Optional[str]:
    """(in the probe's process) None if the reference imports, defines the contract's names and
    (``forward``) builds its model and inputs for ``shape`` and runs one forward, else why not."""
    import importlib.util

    import torch

    try:
        spec = importlib.util.spec_from_file_location("kbsweep_probed_reference", reference)
        if spec is None or spec.loader is None:  # a path whose suffix no loader reads
            raise ImportError(f"no module loader for {reference}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except BaseException as exc:  # noqa: BLE001 - a SyntaxError, an ImportError, a sys.exit in deck code
        return f"the reference does not import: {one_line(exc)}"
    for name in ("Model", "get_init_inputs", "get_inputs"):
        if not callable(getattr(module, name, None)):
            return f"key '{name}': the reference defines no {name}"
    if not forward:
        return None
    built, errors = None, []
    for device in (torch.device("meta"), torch.device("cpu")):  # shapes only; CPU where an input cannot be meta
        try:
            with device:
                model = module.Model(*module.get_init_inputs(dict(shape)))
            built = model, list(module.get_inputs(dict(shape), device))
            break
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)
    if built is None:
        return f"key 'get_inputs': building the model and inputs of shape {shape} fails: {one_line(errors[-1])}"
    try:
        with torch.no_grad():
            built[0](*built[1])
    except NotImplementedError:
        pass  # an op without a meta or CPU kernel: the forward can only be checked on the device itself
    except Exception as exc:  # noqa: BLE001
        if not DEVICE_BOUND.search(str(exc)):
            return f"key 'forward': one forward on shape {shape} fails: {one_line(exc)}"
    return None


def main() -> None:
    """The probe's process: a JSON list of {reference, shape, forward} on stdin, a JSON list of errors (or null) on
    stdout."""
    requests = json.loads(sys.stdin.read())
    print(json.dumps([probe(r["reference"], r["shape"], r["forward"]) for r in requests]))


if __name__ == "__main__":
    main()
