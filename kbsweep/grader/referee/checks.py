"""Correctness checks on a candidate's outputs: types, tolerance, aliasing, input mutation."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence

import torch

from kbsweep.grader.shared.failures import one_line

DEFAULT_TOLERANCE = {
    "float32": {"atol": 1e-4, "rtol": 1e-4},
    "float16": {"atol": 1e-2, "rtol": 1e-2},
    "bfloat16": {"atol": 2e-2, "rtol": 2e-2},
    "float8_e4m3fn": {"atol": 1e-1, "rtol": 1e-1},
}


class CheckFailure(Exception):
    """The candidate's output is wrong; the message says how."""


def as_tuple(out: Any) -> tuple:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def dtype_key(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def tolerance_for(dtype: torch.dtype, table: Dict[str, Any], override: Optional[Dict[str, Any]] = None) -> Dict:
    key = dtype_key(dtype)
    for source in (override or {}, table, DEFAULT_TOLERANCE):
        if key in source:
            tol = source[key]
            return dict(tol) if isinstance(tol, dict) else {"atol": float(tol), "rtol": float(tol)}
    return {"atol": 0.0, "rtol": 0.0}  # integer and bool outputs are exact


def storages(tensors: Sequence[Any]) -> List[tuple]:
    spans = []
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.numel():
            start = t.untyped_storage().data_ptr()
            spans.append((start, start + t.untyped_storage().nbytes()))
    return spans


def check_structure(ref_out: Any, out: Any, inputs: Sequence[Any]) -> None:
    """Exact tensor type, dtype, device and shape; no aliasing of an input."""
    refs, outs = as_tuple(ref_out), as_tuple(out)
    if len(refs) != len(outs):
        raise CheckFailure(f"expected {len(refs)} outputs, got {len(outs)}")
    input_spans = storages(inputs)
    for i, (r, o) in enumerate(zip(refs, outs)):
        if type(o) is not torch.Tensor:
            raise CheckFailure(f"output {i} is {type(o).__name__}, not exactly torch.Tensor")
        if o.dtype != r.dtype or o.shape != r.shape or o.device != r.device:
            raise CheckFailure(
                f"output {i}: got {o.dtype} {tuple(o.shape)} on {o.device}, "
                f"expected {r.dtype} {tuple(r.shape)} on {r.device}"
            )
        for lo, hi in storages([o]):
            if any(lo < ihi and ilo < hi for ilo, ihi in input_spans):
                raise CheckFailure(f"output {i} aliases an input's memory")


def verify(
    ref_out: Any,
    out: Any,
    inputs: Sequence[Any],
    table: Dict[str, Any],
    override: Optional[Dict] = None,
    hook: Optional[Callable[..., Optional[str]]] = None,
) -> Dict[str, float]:
    """The check of every compared call: :func:`compare`, and with the problem's ``check_outputs`` (``hook``, given
    copies of the call's ``inputs``) its verdict too. The hook then decides what the default comparison would hold
    exactly equal, integer and bool outputs: indices, where ties make several answers right (top-k's). Returns the
    worst errors seen."""
    worst = compare(ref_out, out, table, override, exact=hook is None)
    if hook is not None:
        try:
            message = hook(inputs, ref_out, out)
        except Exception as exc:  # noqa: BLE001 - the candidate's output made the problem's own check raise
            message = f"the problem's check_outputs rejected the output ({one_line(exc)})"
        if message:
            raise CheckFailure(message)
    return worst


def compare(
    ref_out: Any, out: Any, table: Dict[str, Any], override: Optional[Dict] = None, exact: bool = True
) -> Dict[str, float]:
    """Values within tolerance (atol/rtol or cosine); NaN/Inf fail; integer and bool outputs equal, unless not
    ``exact`` (a problem's own check judges them). Returns the worst errors seen."""
    worst = {"max_abs": 0.0, "max_rel": 0.0}
    for i, (r, o) in enumerate(zip(as_tuple(ref_out), as_tuple(out))):
        tol = tolerance_for(r.dtype, table, override)
        if not (r.is_floating_point() or r.is_complex()):
            if exact and not torch.equal(r, o):
                raise CheckFailure(f"output {i} ({r.dtype}) differs from the reference")
            continue
        o32, r32 = o.float(), r.float()
        if not torch.isfinite(o32).all():
            raise CheckFailure(f"output {i} has NaN or Inf")
        diff = (o32 - r32).abs()
        max_abs = diff.max().item() if diff.numel() else 0.0
        max_rel = (diff / r32.abs().clamp_min(1e-12)).max().item() if diff.numel() else 0.0
        worst = {"max_abs": max(worst["max_abs"], max_abs), "max_rel": max(worst["max_rel"], max_rel)}
        if "cosine" in tol:
            cos = torch.nn.functional.cosine_similarity(
                o.double().flatten(), r.double().flatten(), dim=0, eps=1e-12
            ).item()
            if cos < tol["cosine"]:
                raise CheckFailure(f"output {i}: cosine {cos:.6f} < {tol['cosine']}")
            continue
        bad = diff > tol["atol"] + tol["rtol"] * r32.abs()
        if bad.any():
            idx = int(bad.flatten().nonzero()[0])
            raise CheckFailure(
                f"output {i}: {int(bad.sum())}/{bad.numel()} elements off (max_abs={max_abs:.3g}, "
                f"first at flat index {idx}: got {o32.flatten()[idx].item():.6g}, "
                f"want {r32.flatten()[idx].item():.6g}; atol={tol['atol']}, rtol={tol['rtol']})"
            )
    return worst


BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def same_values(a: Any, b: Any) -> bool:
    """Bitwise equality of tensors across tuples (NaN equals the same NaN; works for every dtype)."""
    for x, y in zip(as_tuple(a), as_tuple(b)):
        if not isinstance(x, torch.Tensor):
            continue
        if not isinstance(y, torch.Tensor) or x.shape != y.shape or x.dtype != y.dtype:
            return False
        if x.is_floating_point():
            bits = BITS[x.element_size()]
            x, y = x.contiguous().view(bits), y.contiguous().view(bits)
        if not torch.equal(x, y):
            return False
    return True
