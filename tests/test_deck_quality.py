"""Deck quality gate (robust-kbench's filters; KernelBench #165): on every shape a problem is graded at on CPU,
held-out ones included, its reference output must not be near zero, near constant, or insensitive to its inputs or
its weights."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from kbsweep.config.problems import load_problem

REPO = Path(__file__).resolve().parent.parent
DECKS = ("hard", "demo", "mega")
PROBLEMS = [p for deck in DECKS for p in sorted((REPO / "problems" / deck).iterdir()) if (p / "problem.yaml").exists()]


def reference(problem):
    spec = importlib.util.spec_from_file_location(f"quality_{problem.track}_{problem.name}", problem.reference)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def flat(out) -> torch.Tensor:
    parts = out if isinstance(out, (tuple, list)) else (out,)
    return torch.cat([p.detach().double().flatten() for p in parts if p.is_floating_point()])


def perturbed(values, scale=0.5):
    """Floating tensors shifted by noise of half their own spread; others unchanged (indices, fp8 left alone)."""
    out = []
    for v in values:
        if isinstance(v, torch.Tensor) and v.dtype in (torch.float32, torch.float16, torch.bfloat16):
            noise = torch.randn(v.shape, generator=torch.Generator().manual_seed(7)).to(v.dtype)
            out.append(v + noise * (v.float().std().nan_to_num(1.0).clamp_min(1e-3) * scale).to(v.dtype))
        else:
            out.append(v)
    return out


def changed(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / a.norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("folder", PROBLEMS, ids=[f"{p.parent.name}/{p.name}" for p in PROBLEMS])
def test_reference_output_is_informative(folder):
    check_informative(load_problem(folder, folder.parent.name))


@pytest.mark.fast
@pytest.mark.parametrize(
    "forward, complaint",
    [
        ("return x * 0", "near zero"),
        ("return x * 0 + 1", "near constant"),
        ("return x.sum() * 0 + self.w.sum() + torch.arange(4.0)", "insensitive to the inputs"),
        ("return x + 1", "insensitive to the weights"),
    ],
)
def test_the_gate_rejects_uninformative_references(tmp_path, forward, complaint):
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "problem.yaml").write_text("shapes: [{n: 4}]\nsmoke_shapes: [{n: 4}]\n")
    (folder / "reference.py").write_text(
        "import torch\n"
        "class Model(torch.nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.w = torch.nn.Parameter(torch.randn(4))\n"
        f"    def forward(self, x):\n        {forward}\n"
        "def get_init_inputs(shape):\n    return []\n"
        "def get_inputs(shape, device):\n    return [torch.randn(shape['n'], device=device)]\n"
    )
    with pytest.raises(AssertionError, match=complaint):
        check_informative(load_problem(folder, "tmp"))


def check_informative(problem):
    ref = reference(problem)
    device = torch.device("cpu")
    for shape in problem.shapes("smoke_shapes") + problem.held_out_shapes("smoke_shapes"):
        torch.manual_seed(0)
        model = ref.Model(*ref.get_init_inputs(dict(shape))).eval()
        torch.manual_seed(1)
        inputs = list(ref.get_inputs(dict(shape), device))
        with torch.no_grad():
            base = flat(model(*[v.clone() if isinstance(v, torch.Tensor) else v for v in inputs]))
            assert torch.isfinite(base).all(), f"{shape}: non-finite reference output"
            magnitude = base.abs().mean().item()
            assert magnitude > 1e-6, f"{shape}: output is near zero (mean |y| = {magnitude:.2e})"
            assert base.std().item() > 1e-3 * magnitude, f"{shape}: output is near constant"
            moved = changed(base, flat(model(*perturbed(inputs))))
            assert moved > 1e-3, f"{shape}: output insensitive to the inputs ({moved:.2e})"
            weights = [
                p
                for p in list(model.parameters()) + list(model.buffers())
                if p.dtype in (torch.float32, torch.float16, torch.bfloat16)
            ]
            if weights:
                saved = [w.clone() for w in weights]
                for w, noisy in zip(weights, perturbed(weights)):
                    w.copy_(noisy)
                moved = changed(base, flat(model(*inputs)))
                for w, old in zip(weights, saved):
                    w.copy_(old)
                assert moved > 1e-3, f"{shape}: output insensitive to the weights ({moved:.2e})"


@pytest.mark.fast
@pytest.mark.parametrize("batch", [1, 4, 8, 32])
def test_paged_attention_draws_the_same_lengths_every_seed(batch):
    """Timed calls run on freshly drawn inputs and the longest sequence sets a decode kernel's time: every seed
    must draw the same multiset of lengths (only their order differs), summing to batch x seq_len."""
    module = reference(load_problem(REPO / "problems/hard/paged_attention", "hard"))
    shape = {"batch": batch, "num_heads": 4, "num_kv_heads": 2, "head_dim": 16, "seq_len": 256, "page_size": 16}
    drawn = []
    for seed in (1, 2, 3):
        torch.manual_seed(seed)
        drawn.append(module.get_inputs(shape, torch.device("cpu"))[-1].tolist())
    assert all(sorted(d) == sorted(drawn[0]) and sum(d) == batch * 256 for d in drawn)
    assert batch < 4 or len({tuple(d) for d in drawn}) > 1  # the order is still drawn


@pytest.mark.fast
def test_every_hard_problem_holds_out_shapes():
    """Each hard problem grades held-out shapes on the GPU and on the CPU (its smoke grades); the deck holds out an
    off-alignment size (a dimension that is no multiple of 16) somewhere."""
    hard = [load_problem(p, "hard") for p in PROBLEMS if p.parent.name == "hard"]
    assert hard and all(p.spec.held_out_shapes and p.spec.held_out_smoke_shapes for p in hard), [
        p.id for p in hard if not p.spec.held_out_shapes
    ]
    sizes = [
        v for p in hard for shape in p.spec.held_out_shapes for k, v in shape.items() if isinstance(v, int) and v > 16
    ]
    assert any(v % 16 for v in sizes)
