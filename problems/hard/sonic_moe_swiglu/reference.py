"""MoE expert up-projection with fused SwiGLU: a grouped GEMM over tokens already sorted by expert.

Rows x[expert_offsets[e] : expert_offsets[e+1]] were routed to expert e.  For each such row:

    h      = x_row @ w[e]                      # (2*I,)   w[e] is (H, 2*I): [gate | up] columns
    out    = silu(h[:I]) * h[I:]               # (I,)     silu(z) = z * sigmoid(z)

* ``x``              (R, H) bfloat16, R = T*top_k routed rows, grouped by expert
* ``expert_offsets`` (E+1,) int32, expert_offsets[0] = 0, expert_offsets[E] = R, non-decreasing
                     (an expert may receive no rows at all)
* ``w``              (E, H, 2*I) bfloat16 parameter, gate columns first, then up columns
* output             (R, I) bfloat16

The matmul runs in bf16 with float32 accumulation (as torch does); gate and up are rounded to bf16
by that matmul and the SwiGLU is evaluated in float32 before the final rounding to bf16.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, num_experts: int, hidden: int, intermediate: int):
        super().__init__()
        self.num_experts, self.hidden, self.intermediate = num_experts, hidden, intermediate
        w = torch.randn(num_experts, hidden, 2 * intermediate) / hidden ** 0.5
        self.w = nn.Parameter(w.to(torch.bfloat16), requires_grad=False)

    def forward(self, x: torch.Tensor, expert_offsets: torch.Tensor) -> torch.Tensor:
        I = self.intermediate
        out = torch.empty(x.shape[0], I, dtype=torch.bfloat16, device=x.device)
        offs = expert_offsets.tolist()
        for e in range(self.num_experts):
            start, end = offs[e], offs[e + 1]
            if end == start:
                continue
            h = (x[start:end] @ self.w[e]).float()            # (rows, 2I)
            out[start:end] = (F.silu(h[:, :I]) * h[:, I:]).to(torch.bfloat16)
        return out


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
    return [shape["E"], shape["H"], shape["I"]]


def get_inputs(shape: dict, device: torch.device) -> list:
    T, H, E, top_k = shape["T"], shape["H"], shape["E"], shape["top_k"]
    skew = float(shape.get("skew", 0.0))
    # Routing: each token picks top_k distinct experts.  Expert popularity follows a Zipf law with
    # exponent `skew` over a random ranking of the experts.  skew 0 is uniform; skew 2 with 128
    # experts and top-8 sends ~70% of the rows to the 8 hottest experts (~85% to the hottest 16);
    # skew 2.5 over 8 experts with top-2 usually leaves an expert with no rows.
    route_gen = _input_generator(torch.device("cpu"))
    ranks = torch.randperm(E, generator=route_gen).float() + 1.0
    popularity = ranks.pow(-skew)
    choice = torch.multinomial(popularity.expand(T, E), top_k, replacement=False,
                               generator=route_gen)                                  # (T, top_k)
    counts = torch.bincount(choice.flatten(), minlength=E)
    offsets = torch.zeros(E + 1, dtype=torch.int32)
    offsets[1:] = torch.cumsum(counts, 0).to(torch.int32)
    R = T * top_k
    x = torch.randn(R, H, device=device, generator=_input_generator(device)).to(torch.bfloat16)
    return [x, offsets.to(device)]
