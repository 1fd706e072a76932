"""The package layout (docs/architecture.md): stages that import only downward, a short top level, a docstring per
package, and the grader's trust boundary. :data:`RANKS` is the one statement of the import order: the docs and the
packages' docstrings refer to it."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_imports import PACKAGE, imports, modules

pytestmark = pytest.mark.fast

REPO = PACKAGE.parent
RECORDS = ("kbsweep.errors", "kbsweep.paths", "kbsweep.outcomes", "kbsweep.registry")
# bottom first: a module imports its own stage and the stages ranked below it, never one above (every import
# counts, function-local ones too; ``if TYPE_CHECKING:`` ones never run and draw no arrow)
RANKS = [
    ("records", RECORDS),
    ("config", ("kbsweep.config",)),
    ("score", ("kbsweep.score",)),
    ("sandbox", ("kbsweep.sandbox",)),
    ("agent", ("kbsweep.agent",)),
    ("harness", ("kbsweep.harness",)),
    ("grader", ("kbsweep.grader",)),
    ("planner", ("kbsweep.planner",)),
    ("tracking", ("kbsweep.tracking",)),
    ("audit", ("kbsweep.audit",)),
    ("cell", ("kbsweep.cell",)),
    ("launch", ("kbsweep.launch",)),
    ("reporting", ("kbsweep.reporting",)),
    ("entry", ("kbsweep.compose", "kbsweep.cli", "kbsweep.api", "kbsweep")),
]
RANK = {stage: rank for rank, (stage, _) in enumerate(RANKS)}
MAX_TOP_LEVEL = 8  # modules beside __init__: the entry points (cli, api, compose), cell, and the records
API_NAMES = ("plan", "run", "grade", "report")  # kbsweep.plan/run/grade/report are the API's functions

# the grader's trust boundary: the candidate's process (runner/) and what both processes import (shared/) reach
# nothing but these; the referee never reaches the runner's side nor the orchestrator's modules (grader/*.py)
RUNNER, SHARED, REFEREE = "kbsweep.grader.runner", "kbsweep.grader.shared", "kbsweep.grader.referee"
MAY_IMPORT = {RUNNER: (RUNNER, SHARED, *RECORDS), SHARED: (SHARED, *RECORDS)}
# what the candidate's process must never hold: the referee and its request, the config, the sandbox's policy,
# the audit, the agent and the tracking store
UNREACHABLE = (REFEREE, "kbsweep.config", "kbsweep.sandbox", "kbsweep.audit", "kbsweep.agent", "kbsweep.tracking")


def under(module: str, prefix: str) -> bool:
    return module == prefix or (prefix != "kbsweep" and module.startswith(prefix + "."))


def stage(module: str) -> str:
    """The stage of the longest prefix in RANKS that holds ``module``."""
    found = max(((len(p), name) for name, prefixes in RANKS for p in prefixes if under(module, p)), default=None)
    assert found, f"{module} belongs to no stage: add it to RANKS"
    return found[1]


def side(module: str) -> str | None:
    """Where a grader module runs: referee, runner, shared, or the orchestrator (grader/*.py); None outside grader."""
    for prefix in (REFEREE, RUNNER, SHARED):
        if under(module, prefix):
            return prefix.rpartition(".")[2]
    return "orchestrator" if under(module, "kbsweep.grader") else None


def edges():
    """(importer, imported, 'file:line') of every kbsweep import in the package."""
    known = modules()
    for name, path in sorted(known.items()):
        for target, line in imports(name, path, set(known)):
            yield name, target, f"{path.relative_to(REPO)}:{line}"


def test_every_module_has_a_stage():
    for name in modules():
        stage(name)


def test_stages_import_downward():
    upward = [
        f"{where}: {a} ({stage(a)}) imports {b} ({stage(b)}, ranked above)"
        for a, b, where in edges()
        if RANK[stage(b)] > RANK[stage(a)]
    ]
    assert not upward, "\n".join(upward)


def test_the_top_level_holds_entry_points_and_records_only():
    top = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__")
    assert len(top) <= MAX_TOP_LEVEL, f"{len(top)} top-level modules (at most {MAX_TOP_LEVEL}): {top}"
    clashing = sorted(p.name for p in PACKAGE.iterdir() if p.stem in API_NAMES and (p.suffix == ".py" or p.is_dir()))
    assert not clashing, f"named like an API function of kbsweep/__init__.py: {clashing}"


def test_every_package_says_its_job_and_rank():
    """A non-empty docstring in every package; a stage's package names its rank in RANKS (the grader's sides, the
    grader's)."""
    for init in sorted(PACKAGE.rglob("__init__.py")):
        name = ".".join(init.parent.relative_to(REPO).parts)
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert doc.strip(), f"{init.relative_to(REPO)}: no docstring"
        if name != "kbsweep":
            rank = RANK[stage(name)]
            assert re.search(rf"\brank {rank}\b", doc, re.I), (
                f"{init.relative_to(REPO)}: its docstring does not give rank {rank}"
            )


def test_the_trust_boundary_holds_in_the_imports():
    """Statically, function-local imports included: the referee never imports the runner's side or the
    orchestrator's modules; the runner imports only runner, shared and record modules; shared only shared and
    record modules."""
    crossing = []
    for a, b, where in edges():
        if side(a) == "referee" and side(b) in ("runner", "orchestrator"):
            crossing.append(f"{where}: the referee's {a} imports {b} ({side(b)})")
        for prefix, allowed in MAY_IMPORT.items():
            if under(a, prefix) and not any(under(b, p) for p in allowed):
                crossing.append(
                    f"{where}: {a} imports {b}; {prefix.rpartition('.')[2]}/ may import only {', '.join(allowed)}"
                )
    assert not crossing, "\n".join(crossing)


def loaded_by(boot: str) -> tuple[str, list[str]]:
    """(kbsweep's file, the kbsweep modules loaded) in a fresh isolated interpreter once ``boot`` has run."""
    report = "; import json; print(json.dumps([sys.modules['kbsweep'].__file__, sorted(sys.modules)]))"
    proc = subprocess.run(
        [sys.executable, "-I", "-c", boot + report], capture_output=True, text=True, timeout=120, cwd="/"
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    origin, names = json.loads(proc.stdout.splitlines()[-1])
    return origin, [m for m in names if m == "kbsweep" or m.startswith("kbsweep.")]


def boots():
    """The two ways a candidate's process starts, each cut before it runs: the cold runner (processes.RUNNER_BOOT,
    less its ``main()``) and the runner's zygote (zygote.BOOT, less its ``serve()``)."""
    from kbsweep.grader.processes import RUNNER_BOOT
    from kbsweep.grader.shared.zygote import BOOT

    for command, call in ((RUNNER_BOOT, "main()"), (BOOT, "serve()")):
        text = command.format(root=str(REPO))
        assert text.endswith("; " + call), text
        yield text[: -len("; " + call)]


@pytest.mark.parametrize("boot", list(boots()), ids=["runner", "zygote"])
def test_the_candidates_process_loads_nothing_that_holds_a_secret(boot):
    origin, loaded = loaded_by(boot)
    assert Path(origin).is_relative_to(PACKAGE), origin
    reached = [m for m in loaded if any(under(m, p) for p in UNREACHABLE)]
    assert not reached, f"the candidate's process loads {reached}"
    parents = ("kbsweep", "kbsweep.grader")
    beyond = [m for m in loaded if m not in parents and not any(under(m, p) for p in MAY_IMPORT[RUNNER])]
    assert not beyond, f"the candidate's process loads more than runner/, shared/ and the records: {beyond}"
