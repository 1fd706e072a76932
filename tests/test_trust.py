"""The trust boundary on CPU (docs/grading.md, threat model): what the candidate's process can see, shadow and
change. Each test fails when its mechanism is removed: a runner that shares the referee's interpreter, reads the
request, runs with the candidate's folder on sys.path, shares weights, or compares in the candidate's process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.grading import CPU, graded

HONEST = """
import torch


class ModelNew(torch.nn.Module):
    def __init__(self, cols):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(cols))
        self.bias = torch.nn.Parameter(torch.empty(cols))

    def forward(self, x):
        return {expression}
"""


def candidate(folder: Path, prelude: str = "", expression: str = "x * self.weight + self.bias", **helpers: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in helpers.items():
        (folder / f"{name}.py").write_text(text)
    (folder / "solution.py").write_text(prelude + HONEST.format(expression=expression))
    return folder / "solution.py"


def check(problem, roofline, solution: Path, tmp_path: Path, mode: str = "check"):  # noqa: F811
    return graded(problem, solution, CPU, roofline, mode=mode, timeout_s=180, log_dir=tmp_path / "grade")


def test_runner_never_sees_the_request_reference_or_deck(problem, roofline, tmp_path):  # noqa: F811
    spy = f"""
import gc, json, os, sys
from pathlib import Path
here = Path(__file__).resolve().parent
json.dump({{
    "isolated": sys.flags.isolated,
    "folder_on_path": any(p and Path(p).resolve() == here for p in sys.path),
    "reference_modules": sorted(m for m in sys.modules if m.startswith("kbsweep_reference") or m.endswith("referee")),
    "secret_keys": sorted({{k for o in gc.get_objects() if isinstance(o, dict) for k in list(o)[:50]
                           if k in ("secret_seed", "baseline_budget_s", "compile_mode")}}),
    "deck_readable": os.path.exists({str(problem.root / "reference.py")!r}),
}}, open(here / "seen.json", "w"))
"""
    result = check(problem, roofline, candidate(tmp_path / "ws", spy), tmp_path)
    assert result["outcome"] == "pass", result.get("message")
    seen = json.loads((tmp_path / "grade/candidate/seen.json").read_text())
    assert seen["isolated"] == 1 and not seen["folder_on_path"]
    assert seen["reference_modules"] == [] and seen["secret_keys"] == []
    assert not seen["deck_readable"]  # bubblewrap: the runner's view holds kbsweep and the candidate's folder only


def test_helpers_never_shadow_standard_modules(problem, roofline, tmp_path):  # noqa: F811
    """Helpers named like modules the harness imports would break it if imported; the candidate's own helper
    module still imports by its name."""
    poison = "raise SystemExit('a candidate helper shadowed the standard library')\n"
    prelude = "import json, statistics\nfrom _scale import scale\nassert not json.__file__.endswith('ws/json.py')\n"
    solution = candidate(
        tmp_path / "ws",
        prelude,
        "scale(x, self.weight, self.bias)",
        json=poison,
        statistics=poison,
        socket=poison,
        _scale="def scale(x, w, b):\n    return x * w + b\n",
    )
    result = check(problem, roofline, solution, tmp_path)
    assert result["outcome"] == "pass", result.get("message")


def test_comparison_runs_outside_the_candidate(problem, roofline, tmp_path):  # noqa: F811
    """NaN outputs behind patched comparison helpers are still NaN to the referee."""
    prelude = (
        "import torch\nimport statistics\n"
        "torch.isfinite = lambda t: torch.ones_like(t, dtype=torch.bool)\n"
        "torch.allclose = lambda *a, **k: True\ntorch.Tensor.__sub__ = lambda a, b: a * 0\n"
    )
    result = check(problem, roofline, candidate(tmp_path / "ws", prelude, "torch.full_like(x, float('nan'))"), tmp_path)
    assert result["outcome"] == "incorrect" and "NaN" in result["message"]


def test_weights_handed_over_are_copies(problem, roofline, tmp_path):  # noqa: F811
    """A candidate that keeps the tensors it is loaded from and zeroes them (making a zeros kernel 'right' when
    they are the reference's own) only zeroes its copies."""
    keep = """
import torch
_grabbed = []
_load = torch.nn.Module.load_state_dict
def _keep(self, state, *a, **k):
    _grabbed.extend(state.values())
    for t in state.values():
        t.zero_()
    return _load(self, state, *a, **k)
torch.nn.Module.load_state_dict = _keep
"""
    result = check(problem, roofline, candidate(tmp_path / "ws", keep, "torch.zeros_like(x)"), tmp_path)
    assert result["outcome"] == "incorrect", result.get("message")


# correctness makes 24 calls here (the stale-memory probe's two among them) and calibration 3: replays start in the
# first timed batch, or fill the second (a CPU shape is timed in two batches of 8, so a later start could fall past
# the first shape's picked calls)
@pytest.mark.parametrize("replayed_after", [25, 32])
def test_timed_calls_see_fresh_inputs(problem, roofline, tmp_path, replayed_after):  # noqa: F811
    """Serving the last output once timing starts (a call counter) fails: inputs are new every batch and picked
    calls are compared after it."""
    counter = """
import torch
_state = {"calls": 0, "last": None}
"""
    expression = (
        f"_state.update(calls=_state['calls'] + 1) or (_state['last'] if _state['calls'] > {replayed_after} and "
        "_state['last'] is not None else _state.update(last=x * self.weight + self.bias) or _state['last'])"
    )
    result = check(problem, roofline, candidate(tmp_path / "ws", counter, expression), tmp_path, mode="full")
    assert result["outcome"] == "incorrect" and "timed call" in result["message"], result.get("message")


@pytest.mark.fast
def test_the_runner_resolves_only_top_level_helpers_from_the_candidate_folder(tmp_path):
    """The runner's import hook (kbsweep/grader/runner/runner.py): the candidate's folder is one package, and a top-level
    name falls through to its helper file; a dotted name or a submodule search never does."""
    from kbsweep.grader.runner.runner import PACKAGE, CandidateFinder

    (tmp_path / "_kernels.py").write_text("X = 1\n")
    finder = CandidateFinder(tmp_path)
    assert finder.find_spec(PACKAGE, None).submodule_search_locations == [str(tmp_path)]
    assert finder.find_spec("_kernels", None).origin == str(tmp_path / "_kernels.py")
    assert finder.find_spec("_kernels", ["/elsewhere"]) is None and finder.find_spec("pkg._kernels", None) is None
    assert finder.find_spec("_missing", None) is None
