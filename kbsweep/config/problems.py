"""Problems as data: a folder with problem.yaml, reference.py, prompt.md (see docs/problem-format.md)."""

from __future__ import annotations

import hashlib
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from string import Template
from typing import Any, Dict, List, Optional

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from kbsweep.config.file_versions import parsed
from kbsweep.errors import KbsweepError

DECK_FILES = ("problem.yaml", "reference.py", "prompt.md", "sota.py", "baseline.py")
BASELINE_FILES = ("reference.py", "sota.py", "baseline.py")
HELD_OUT = {"shapes": "held_out_shapes", "smoke_shapes": "held_out_smoke_shapes"}  # public set -> its held-out set
FORMULA_NAMES = {"min": min, "max": max, "ceil": math.ceil, "floor": math.floor, "log2": math.log2}


@dataclass
class StressCase:
    name: str = "nominal"
    input_scale: float = 1.0
    weight_scale: float = 1.0
    tolerance: Optional[Dict[str, Any]] = None


@dataclass
class SotaSpec:
    name: str = ""
    packages: List[str] = field(default_factory=list)


@dataclass
class ProblemSpec:
    """The schema of problem.yaml."""

    name: str = ""
    display_name: str = ""
    precision: str = "fp32"
    regime: str = "compute"  # compute | memory | latency
    peak: Optional[str] = None  # key of roofline peaks_tflops
    flops: Optional[str] = None
    bytes: Optional[str] = None
    tolerance: Dict[str, Any] = field(default_factory=dict)
    forbidden: List[str] = field(default_factory=list)
    shapes: List[Dict[str, Any]] = field(default_factory=list)
    smoke_shapes: List[Dict[str, Any]] = field(default_factory=list)
    # graded by full grades only, never shown to the agent (docs/problem-format.md, held-out shapes)
    held_out_shapes: List[Dict[str, Any]] = field(default_factory=list)
    held_out_smoke_shapes: List[Dict[str, Any]] = field(default_factory=list)
    no_held_out: str = ""  # why a problem holds out no shape (a KernelBench file with no batch to scale)
    stress: List[StressCase] = field(default_factory=list)
    seeds: int = 3
    sota: Optional[SotaSpec] = None
    constraints: Dict[str, Any] = field(default_factory=dict)
    score: str = "roofline"  # roofline | speedup (speedup over the eager reference or baseline.py)
    skip_baselines: Dict[str, str] = field(default_factory=dict)  # baseline name -> why it is not timed
    kernelbench: Dict[str, Any] = field(default_factory=dict)  # {version, precision}: graded by KernelBench's eval too
    gpumode: Dict[str, Any] = field(
        default_factory=dict
    )  # a GPU MODE problem's task.yml timing keys (kbsweep.config.gpumode)


@dataclass
class Problem:
    """One problem folder, validated."""

    track: str
    name: str
    root: Path
    spec: ProblemSpec
    format: str = "kbsweep"

    @property
    def id(self) -> str:
        return f"{self.track}/{self.name}"

    @property
    def reference(self) -> Path:
        """The readable reference the model sees."""
        return self.root / "reference.py"

    @property
    def grader_reference(self) -> Path:
        """The module the grader loads (an adapter for foreign formats, else the reference)."""
        adapter = self.root / "kbsweep_adapter.py"
        return adapter if adapter.exists() else self.reference

    def shapes(self, shape_set: str) -> List[Dict[str, Any]]:
        """The public shapes of ``shape_set`` (what the prompt, checks and benchmarks show)."""
        shapes = getattr(self.spec, shape_set) or self.spec.shapes
        return [dict(s) for s in shapes]

    def held_out_shapes(self, shape_set: str) -> List[Dict[str, Any]]:
        """The held-out shapes beside ``shape_set``'s public ones: graded by full grades only (``shapes`` pairs
        with ``held_out_shapes``, ``smoke_shapes`` with ``held_out_smoke_shapes``, falling back to it)."""
        shapes = getattr(self.spec, HELD_OUT[shape_set]) or self.spec.held_out_shapes
        return [dict(s) for s in shapes]

    def solutions(self) -> Dict[str, Path]:
        folder = self.root / "solutions"
        return {p.stem: p for p in sorted(folder.glob("*.py"))} if folder.is_dir() else {}

    def deck_hash(self, files=DECK_FILES) -> str:
        """Content hash of the files that define the problem (its deck version)."""
        digest = hashlib.sha256()
        for name in files:
            path = self.root / name
            if path.exists():
                digest.update(name.encode() + b"\0" + path.read_bytes())
        return digest.hexdigest()[:12]

    def code_hash(self) -> str:
        """Hash of the code baselines run (reference, SOTA, baseline): their timings stay valid across
        changes to tolerances or prompts."""
        return self.deck_hash(BASELINE_FILES)

    def work(self, shape: Dict[str, Any]) -> Dict[str, Optional[float]]:
        """Dense-equivalent FLOPs and bytes of one shape (None where no formula is given)."""
        return {
            "flops": evaluate(self.spec.flops, shape, self.id),
            "bytes": evaluate(self.spec.bytes, shape, self.id),
        }

    def render_prompt(self, gpu: Any, shape_set: str = "shapes") -> str:
        template_path = self.root / "prompt.md"
        text = template_path.read_text() if template_path.exists() else DEFAULT_PROMPT
        shapes = "\n".join(f"- {', '.join(f'{k}={v}' for k, v in s.items())}" for s in self.shapes(shape_set))
        return Template(text).safe_substitute(
            gpu_description=gpu.description,
            gpu_name=gpu.name,
            shapes=shapes,
            tolerance=OmegaConf.to_yaml(OmegaConf.create(self.spec.tolerance)).strip(),
            forbidden=", ".join(f"`{f}`" for f in self.spec.forbidden) or "none",
            problem_name=self.spec.display_name or self.name,
        )


DEFAULT_PROMPT = """Write a fast kernel for the operation in `reference.py` on ${gpu_description}.
Put your answer in `solution.py`: a class `ModelNew` with `Model`'s constructor and forward.
Shapes:
${shapes}
Tolerance: ${tolerance}
Forbidden: ${forbidden}
"""


def evaluate(formula: Optional[str], shape: Dict[str, Any], where: str) -> Optional[float]:
    if not formula:
        return None
    try:
        return float(eval(formula, {"__builtins__": {}}, {**FORMULA_NAMES, **shape}))  # noqa: S307 - deck data
    except Exception as exc:
        raise KbsweepError(f"{where}: formula {formula!r} fails on shape {shape}: {exc}") from None


def load_spec(path: Path) -> ProblemSpec:
    """problem.yaml, checked against ProblemSpec; parsed once per version of the file (:mod:`kbsweep.config.file_versions`)."""
    return parsed(path, parse_spec)


def parse_spec(path: Path) -> ProblemSpec:
    try:
        merged = OmegaConf.merge(OmegaConf.structured(ProblemSpec), OmegaConf.load(path))
        spec = OmegaConf.to_object(merged)
        assert isinstance(spec, ProblemSpec)  # a structured config's object is its dataclass's instance
        return spec
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or ""
        raise KbsweepError(f"{path}: key '{key}': {str(exc).splitlines()[0]}") from None
    except yaml.YAMLError as exc:
        from kbsweep.config.schema import broken_yaml

        raise broken_yaml(path, exc) from None
    except Exception as exc:  # not YAML at all (unreadable, binary)
        raise KbsweepError(f"{path}: {str(exc).splitlines()[0]}") from None


def load_problem(root: Path, track: str) -> Problem:
    if not (root / "problem.yaml").exists():
        raise KbsweepError(f"{root}: not a problem folder (no problem.yaml)")
    if not (root / "reference.py").exists():
        raise KbsweepError(f"{root}: problem has no reference.py")
    spec = load_spec(root / "problem.yaml")
    spec.name = spec.name or root.name
    if spec.regime not in ("compute", "memory", "latency"):
        raise KbsweepError(f"{root / 'problem.yaml'}: key 'regime': must be compute, memory or latency")
    if not spec.shapes:
        raise KbsweepError(f"{root / 'problem.yaml'}: key 'shapes': at least one shape is required")
    check_held_out(spec, root / "problem.yaml")
    problem = Problem(track=track, name=root.name, root=root, spec=spec)
    for shape in [
        *problem.shapes("shapes"),
        *problem.shapes("smoke_shapes"),
        *spec.held_out_shapes,
        *spec.held_out_smoke_shapes,
    ]:
        problem.work(shape)  # formulas must evaluate on every shape
    return problem


def check_held_out(spec: ProblemSpec, path: Path) -> None:
    """Each held-out shape has the keys of its public set's shapes and is none of them (a held-out shape the agent
    is shown is not held out). A KernelBench problem's shapes override its file's module-level sizes: a held-out
    one overrides some, each a size the file assigns."""
    for public_set, held_set in HELD_OUT.items():
        public = getattr(spec, public_set) or spec.shapes
        for i, shape in enumerate(getattr(spec, held_set)):
            where = f"{path}: key '{held_set}[{i}]'"
            if spec.kernelbench:
                from kbsweep.config.kernelbench_sizing import size_constants

                known = size_constants((path.parent / "reference.py").read_text(), least=1)
                if not shape or set(shape) - set(known):
                    raise KbsweepError(
                        f"{where}: overrides {sorted(set(shape) - set(known)) or 'nothing'}: a KernelBench "
                        f"held-out shape overrides sizes its file assigns ({', '.join(sorted(known)) or 'none'})"
                    )
            elif set(shape) != set(public[0]):
                raise KbsweepError(
                    f"{where}: keys {sorted(shape)} differ from the {public_set}' keys {sorted(public[0])}"
                )
            if dict(shape) in [dict(s) for s in public]:
                raise KbsweepError(f"{where}: {dict(shape)} is also a public shape ({public_set})")


def asdict_spec(spec: ProblemSpec) -> Dict[str, Any]:
    """The spec as plain data (what the grading process receives), its held-out shapes left out: a grade gets the
    shapes it grades in its request, and no other. The spec came through ``OmegaConf.to_object``, so its fields are
    plain already: a dataclass copy gives what a structured config's container would, without building one per grade
    (8.7 s of py-spy samples over a 100-cell demo sweep)."""
    return {key: value for key, value in asdict(spec).items() if key not in HELD_OUT.values()}
