"""W4A16 GEMM: bf16 activations times AWQ-style asymmetric int4 weights (group size 128).

    w[n, k] = (q[n, k] - zeros[n, k // 128]) * scales[n, k // 128]         q in 0..15
    y       = x @ w.T                                                        -> bfloat16

* ``x``       (M, K) bfloat16 activations (M is small: decode)
* ``qweight`` (N, K // 8) int32 buffer: 8 int4 codes per int32 along K, code for k = 8*j + i in
              bits [4*i, 4*i + 4) of qweight[n, j] (plain little-end-first nibble order, NOT
              AutoAWQ's interleaved 0,2,4,6,1,3,5,7 order)
* ``scales``  (N, K // 128) bfloat16 buffer
* ``zeros``   (N, K // 128) bfloat16 buffer, zero point per group in code units (integers 0..15
              for freshly quantised weights; any real value is valid)
* output      (M, N) bfloat16

The reference dequantises in float32 and multiplies in float32; a kernel may round the dequantised
weights to bf16 for tensor cores (the tolerance allows for that).
"""
import torch
import torch.nn as nn

GROUP = 128
PACK = 8  # int4 codes per int32


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """(N, K) integer codes in 0..15 -> (N, K // 8) int32, code k = 8*j + i in bits 4i..4i+3."""
    N, K = codes.shape
    c = codes.to(torch.int64).view(N, K // PACK, PACK)
    shifts = torch.arange(PACK, dtype=torch.int64) * 4
    packed = (c << shifts).sum(dim=-1)                     # 0 .. 2^32 - 1
    packed = torch.where(packed >= 2 ** 31, packed - 2 ** 32, packed)
    return packed.to(torch.int32)


def unpack_int4(qweight: torch.Tensor) -> torch.Tensor:
    """(N, K // 8) int32 -> (N, K) int32 codes in 0..15."""
    shifts = torch.arange(PACK, dtype=torch.int32, device=qweight.device) * 4
    codes = (qweight[:, :, None] >> shifts) & 0xF
    return codes.reshape(qweight.shape[0], -1)


class Model(nn.Module):
    def __init__(self, N: int, K: int):
        super().__init__()
        assert K % GROUP == 0
        self.N, self.K = N, K
        # Quantise a random weight the way AWQ/GPTQ-style asymmetric int4 does: per group of 128
        # input channels, map [min, max] onto the 16 codes.
        w = torch.randn(N, K) / K ** 0.5
        wg = w.view(N, K // GROUP, GROUP)
        lo, hi = wg.amin(dim=-1), wg.amax(dim=-1)
        scales = ((hi - lo) / 15.0).to(torch.bfloat16)
        zeros = torch.round(-lo / scales.float()).clamp(0, 15).to(torch.bfloat16)
        codes = torch.round(wg / scales.float()[..., None] + zeros.float()[..., None]).clamp(0, 15)
        self.register_buffer("qweight", pack_int4(codes.view(N, K).to(torch.int32)))
        self.register_buffer("scales", scales)
        self.register_buffer("zeros", zeros)

    def dequantize(self) -> torch.Tensor:
        codes = unpack_int4(self.qweight).float()                        # (N, K)
        scales = self.scales.float().repeat_interleave(GROUP, dim=1)     # (N, K)
        zeros = self.zeros.float().repeat_interleave(GROUP, dim=1)
        return (codes - zeros) * scales

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x.float() @ self.dequantize().t()).to(torch.bfloat16)


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
    gen = _input_generator(device)
    x = torch.randn(shape["M"], shape["K"], device=device, generator=gen).to(torch.bfloat16)
    return [x]
