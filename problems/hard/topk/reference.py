"""Top-k per row.

    values, indices = topk(x, k) along the last dimension, largest first

* ``x``       (batch, n) float32
* ``values``  (batch, k) float32, sorted in descending order
* ``indices`` (batch, k) int64, positions in ``x`` of those values

When a row holds equal values, several index sets are correct; ``check_outputs`` therefore
checks indices through ``x`` (gather) instead of comparing them with the reference's indices.
"""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, k: int):
        super().__init__()
        self.k = k

    def forward(self, x: torch.Tensor):
        values, indices = torch.topk(x, self.k, dim=-1, largest=True, sorted=True)
        return values, indices


def get_init_inputs(shape: dict) -> list:
    return [shape["k"]]


def get_inputs(shape: dict, device: torch.device) -> list:
    batch, n = shape["batch"], shape["n"]
    # Logit-like rows: a per-row offset and spread, so rows differ and the top values are not a
    # fixed pattern; continuous values make exact ties (practically) absent.
    offset = 4.0 * torch.randn(batch, 1, device=device)
    spread = torch.exp(0.5 * torch.randn(batch, 1, device=device))
    x = offset + spread * torch.randn(batch, n, device=device)
    return [x]


def check_outputs(inputs, ref_out, out):
    """Index checks that do not depend on how ties are broken. Returns a message on failure."""
    (x,) = inputs[:1]
    ref_values, _ = ref_out
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        return "expected a (values, indices) tuple"
    values, indices = out
    if indices.dtype != torch.int64:
        return f"indices must be int64, got {indices.dtype}"
    if values.shape != ref_values.shape or indices.shape != ref_values.shape:
        return f"expected shapes {tuple(ref_values.shape)}, got {tuple(values.shape)} and {tuple(indices.shape)}"
    n = x.shape[-1]
    if bool(((indices < 0) | (indices >= n)).any()):
        return "an index is out of range"
    if indices.shape[-1] > 1:
        srt, _ = torch.sort(indices, dim=-1)
        if bool((srt[..., 1:] == srt[..., :-1]).any()):
            return "an index repeats within a row"
    gathered = torch.gather(x, -1, indices)
    if not torch.equal(gathered, values):
        bad = (gathered != values).sum().item()
        return f"x[indices] differs from the returned values at {bad} positions"
    if not torch.equal(values, ref_values):
        bad = (values != ref_values).sum().item()
        return f"returned values differ from the true top-k values at {bad} positions"
    return None
