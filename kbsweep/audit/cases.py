"""Audit cases: solution files whose docstring says what they are, graded and audited the way a cell would be.

A case's docstring carries ``Key: value`` lines: ``Problem:`` (track/name), and for exploits ``Family:``,
``Caught by:`` (static, dynamic, contamination, grader; ``a|b``: either), optionally ``Mode:``, ``Verdict:``
and ``World:`` (ranks of a multi-track grade, 1 by default). Modules named
``_*.py`` beside a case that it imports are staged with it as workspace helpers. Used by the exploit and legit
test suites (CPU) and by scripts/audit_gpu_check.py (GPU).
"""

from __future__ import annotations

import ast
import hashlib
import shutil
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from kbsweep.audit import audit, workspace_helpers
from kbsweep.config.gpus import GpuSpec
from kbsweep.config.problems import load_problem
from kbsweep.grader import grade
from kbsweep.grader.request import GradeRequest
from kbsweep.outcomes import Outcome


def header(path: Path) -> Dict[str, str]:
    """The ``Key: value`` lines of a file's docstring, keys lowercased."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    return {
        k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in doc.splitlines() if ":" in line)
    }


def staged_files(path: Path) -> List[Path]:
    """What is staged beside a case: the ``_*.py`` modules of its folder that it imports, and the files its
    ``Stage:`` line names (relative to its folder, staged under their base name)."""
    extra = [path.parent / name.strip() for name in header(path).get("stage", "").split(",") if name.strip()]
    return local_imports(path) + extra


def local_imports(path: Path) -> List[Path]:
    """The ``_*.py`` modules of the file's folder that it imports."""
    tree = ast.parse(path.read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    return sorted(path.with_name(f"{n}.py") for n in names if n.startswith("_") and path.with_name(f"{n}.py").exists())


def private_deck(problems: Path, problem_id: str, folder: Path, max_shapes: Optional[int] = None):
    """A copy of one problem under ``folder`` (a case may write to its deck: never the repository's), its shape
    lists cut to ``max_shapes``; an earlier copy there is reused while its files are as copied."""
    from omegaconf import DictConfig, OmegaConf

    track, name = problem_id.split("/")
    deck = folder / (f"deck-{max_shapes}-shapes" if max_shapes else "deck") / name  # the folder's name is the problem's
    stamp = deck.with_name(f".{deck.name}.digest")
    if deck.exists() and stamp.exists() and stamp.read_text() == deck_digest(deck):
        return load_problem(deck, track)
    if deck.exists():  # changed by a case: out of use, and its zygotes with it (their view holds the old folder)
        from kbsweep.grader import zygotes

        zygotes.close_all()
        shutil.rmtree(deck)
    shutil.copytree(problems / track / name, deck, ignore=shutil.ignore_patterns("solutions", ".grade"))
    if max_shapes:
        spec = OmegaConf.load(deck / "problem.yaml")
        if isinstance(spec, DictConfig):  # a problem.yaml that is no mapping is load_problem's to refuse
            for key in ("shapes", "smoke_shapes"):
                if spec.get(key):
                    spec[key] = spec[key][:max_shapes]
            OmegaConf.save(spec, deck / "problem.yaml")
    stamp.write_text(deck_digest(deck))
    return load_problem(deck, track)


def deck_digest(deck: Path) -> str:
    """Every file's path and bytes under ``deck``, hashed."""
    digest = hashlib.sha256()
    for path in sorted(p for p in deck.rglob("*") if p.is_file()):
        digest.update(f"{path.relative_to(deck)}\0".encode() + path.read_bytes())
    return digest.hexdigest()


def run_case(
    path: Path,
    folder: Path,
    gpu: GpuSpec,
    roofline: Dict[str, Any],
    problems: Path,
    problem_id: str = "",
    mode: Optional[str] = None,
    timing: Optional[Dict[str, Any]] = None,
    max_shapes: Optional[int] = None,
    timeout_s: float = 600,
    sandbox: Any = None,
    max_world: Optional[int] = None,
    shared: Optional[Path] = None,
) -> Tuple[Dict[str, str], Dict[str, Any], Dict[str, Any]]:
    """Stage ``path`` as solution.py (with its helpers) in ``folder`` against a private copy of its problem (the
    docstring's, else ``problem_id``), grade it (``mode``: the docstring's, else check; ``sandbox``: the grader's
    SandboxPolicy, default its own; at the docstring's ``World:``, at most ``max_world`` ranks) and audit it.
    ``shared``: a folder kept across cases for the problem copies and the runner zygote's home, so that cases of a
    problem fork from the same warm zygotes as a sweep's cells do (else each case starts its own). Returns
    (header, grade, audit)."""
    meta = header(path)
    problem = private_deck(problems, meta.get("problem", problem_id), shared or folder, max_shapes)
    workspace = folder / "workspace"
    workspace.mkdir()
    for helper in staged_files(path):
        shutil.copy2(helper, workspace / helper.name)
    shutil.copy2(path, workspace / "solution.py")
    result = grade(
        GradeRequest(
            problem,
            workspace / "solution.py",
            gpu,
            roofline,
            mode=mode or meta.get("mode", "check"),
            baselines=[],
            timeout_s=timeout_s,
            log_dir=folder / "grade",
            timing=timing or {},
            sandbox=sandbox,
            zygote_home=shared / "zygotes" if shared else None,
            world_size=min(int(meta.get("world", 1)), max_world or int(meta.get("world", 1))),
        )
    ).to_json()
    helpers = workspace_helpers(workspace, problem.reference.read_text())
    return meta, result, audit(path.read_text(), problem.spec.forbidden, result, problem=problem, helpers=helpers)


def catching_layers(result: Dict[str, Any], audited: Dict[str, Any]) -> set:
    """The layers with a verdict-bearing finding on the case itself, and "grader" when the grade failed."""
    layers = {f["layer"] for f in audited["findings"] if f["verdict"] and f.get("file", "solution.py") == "solution.py"}
    return layers | ({"grader"} if result["outcome"] != Outcome.PASS else set())


def summary(result: Dict[str, Any], audited: Dict[str, Any]) -> str:
    """One line: outcome, message, verdict and the findings behind it."""
    findings = "; ".join(f"{f['layer']}/{f['kind']} {f['detail'][:80]}" for f in audited["findings"] if f["verdict"])
    return f"{result['outcome']}: {result.get('message')}; verdict {audited['verdict']}: {findings}"
