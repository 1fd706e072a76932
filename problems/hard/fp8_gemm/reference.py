"""FP8 (e4m3) GEMM with row-wise scales, bf16 output.

    y[m, n] = (sum_k x[m, k] * w[n, k]) * x_scale[m] * w_scale[n]      -> bfloat16

* ``x``       (M, K) float8_e4m3fn  activations, one scale per row (per token)
* ``x_scale`` (M, 1) float32        dequantisation scale of each activation row
* ``w``       (N, K) float8_e4m3fn  weights (nn.Linear layout), one scale per output channel
* ``w_scale`` (N,)   float32        dequantisation scale of each weight row

Scaling scheme: per-row ("row-wise") on both operands, the layout torch._scaled_mm accepts
with ``scale_a`` of shape (M, 1) and ``scale_b`` of shape (1, N).  The products are summed
exactly in float32 here; the result is rounded once to bfloat16.
"""
import torch
import torch.nn as nn

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0


def quantize_rowwise(t: torch.Tensor):
    """Quantise a float matrix to e4m3 with one float32 scale per row (amax / 448)."""
    amax = t.abs().amax(dim=1, keepdim=True).clamp_min(1e-12)
    scale = (amax / FP8_MAX).float()
    q = (t / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q, scale


class Model(nn.Module):
    def __init__(self, N: int, K: int):
        super().__init__()
        self.N, self.K = N, K
        # Weights with a spread of per-channel magnitudes, so that a kernel that treats the
        # scales as per-tensor (or drops one of them) is visibly wrong.
        channel_gain = torch.exp(0.5 * torch.randn(N, 1))
        w = torch.randn(N, K) * channel_gain / K ** 0.5
        w_q, w_s = quantize_rowwise(w)
        self.register_buffer("w", w_q)                  # (N, K) float8_e4m3fn
        self.register_buffer("w_scale", w_s.view(N))    # (N,)  float32

    def forward(self, x: torch.Tensor, x_scale: torch.Tensor) -> torch.Tensor:
        acc = x.float() @ self.w.float().t()                       # (M, N), exact products, fp32 sums
        y = acc * x_scale.float() * self.w_scale.float()[None, :]  # row scale x column scale
        return y.to(torch.bfloat16)


def _input_generator(device: torch.device) -> torch.Generator:
    """A stream for the inputs, seeded from the global RNG.

    The grader calls torch.manual_seed(seed) both before building the Model and before get_inputs,
    so drawing the inputs straight from the global stream would replay the weights' random numbers
    (x would be a scaled copy of rows of w).  A generator seeded from one global draw keeps the
    inputs deterministic per seed but independent of the weights.
    """
    seed = int(torch.randint(0, 2 ** 62, (1,)).item())
    return torch.Generator(device=device).manual_seed(seed)


def get_init_inputs(shape: dict) -> list:
    return [shape["N"], shape["K"]]


def get_inputs(shape: dict, device: torch.device) -> list:
    M, K = shape["M"], shape["K"]
    gen = _input_generator(device)
    token_gain = torch.exp(0.5 * torch.randn(M, 1, device=device, generator=gen))
    x = torch.randn(M, K, device=device, generator=gen) * token_gain
    x_q, x_s = quantize_rowwise(x)
    return [x_q, x_s]   # (M, K) float8_e4m3fn, (M, 1) float32
