"""Library ceiling: cuBLASLt FP8 GEMM with row-wise scales through torch._scaled_mm (Hopper and newer)."""
import torch

_PADDED_WEIGHTS = {}  # id(model) -> (key, padded weight); kept outside the module so state_dict is untouched


def is_available() -> bool:
    try:
        return (
            torch.cuda.is_available()
            and hasattr(torch, "_scaled_mm")
            and torch.cuda.get_device_capability() >= (9, 0)
        )
    except Exception:
        return False


def _pad_k(t: torch.Tensor, pad: int) -> torch.Tensor:
    """Zero-pad the last (K) dimension of an fp8 tensor; the zero byte is +0.0 in e4m3."""
    if pad == 0:
        return t.contiguous()
    raw = torch.nn.functional.pad(t.contiguous().view(torch.uint8), (0, pad))
    return raw.view(t.dtype)


def sota_forward(model, x: torch.Tensor, x_scale: torch.Tensor) -> torch.Tensor:
    K = x.shape[1]
    pad = (-K) % 16  # cuBLASLt wants K (and N) in multiples of 16; zero columns do not change the sums
    w = model.w
    key = (w.data_ptr(), w._version, pad)
    cached = _PADDED_WEIGHTS.get(id(model))
    if cached is None or cached[0] != key:
        cached = (key, _pad_k(w, pad))
        _PADDED_WEIGHTS[id(model)] = cached
    w_padded = cached[1]
    return torch._scaled_mm(
        _pad_k(x, pad),
        w_padded.t(),                                   # (K, N), column-major as cuBLASLt wants
        scale_a=x_scale.float().reshape(-1, 1).contiguous(),
        scale_b=model.w_scale.float().reshape(1, -1).contiguous(),
        out_dtype=torch.bfloat16,
    )
