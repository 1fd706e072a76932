"""Deliberately wrong first attempt: writes the new token into the state before applying the decay,
so the delta-rule prediction reads an undecayed state and the fresh write is decayed at once.

KDA forward in Triton, token-by-token: one program per (batch, head, block of V columns).

The (K x BLOCK_V) slice of the state stays in registers in float32 for the whole sequence; each
step forgets per channel, applies the delta-rule correction and reads out.  The columns of the
state are independent, so splitting V across programs is exact.  Sequential in T: correct, not fast.
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _kda_recurrent_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, b_ptr, o_ptr,
    T, H, scale,
    K: tl.constexpr, V: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
):
    pid_bh = tl.program_id(0)
    pid_v = tl.program_id(1)
    bb = pid_bh // H
    hh = pid_bh % H

    kk = tl.arange(0, BLOCK_K)
    vv = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    k_ok = kk < K
    v_ok = vv < V

    S = tl.zeros((BLOCK_K, BLOCK_V), dtype=tl.float32)
    for t in range(0, T):
        row = (bb * T + t) * H + hh                       # index of (b, t, h) in the (B, T, H) grid
        q = tl.load(q_ptr + row * K + kk, mask=k_ok, other=0.0).to(tl.float32)
        k = tl.load(k_ptr + row * K + kk, mask=k_ok, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + row * V + vv, mask=v_ok, other=0.0).to(tl.float32)
        g = tl.load(g_ptr + row * K + kk, mask=k_ok, other=0.0).to(tl.float32)
        blogit = tl.load(b_ptr + row).to(tl.float32)

        q = q / tl.sqrt(tl.sum(q * q, axis=0) + 1e-6) * scale
        k = k / tl.sqrt(tl.sum(k * k, axis=0) + 1e-6)
        beta = 1.0 / (1.0 + tl.exp(-blogit))

        recalled = tl.sum(S * k[:, None], axis=0)         # S^T k      (BLOCK_V,)
        u = beta * (v - recalled)
        S = S + k[:, None] * u[None, :]
        S = S * tl.exp(g)[:, None]                        # BUG: decay belongs before the update
        o = tl.sum(S * q[:, None], axis=0)                # S^T q      (BLOCK_V,)
        tl.store(o_ptr + row * V + vv, o.to(tl.bfloat16), mask=v_ok)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, q, k, v, g, b):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        g, b = g.contiguous(), b.contiguous()
        B, T, H, K = q.shape
        V = v.shape[-1]
        o = torch.empty(B, T, H, V, dtype=torch.bfloat16, device=q.device)
        BLOCK_K = triton.next_power_of_2(K)
        BLOCK_V = min(32, triton.next_power_of_2(V))
        grid = (B * H, triton.cdiv(V, BLOCK_V))
        _kda_recurrent_kernel[grid](q, k, v, g, b, o, T, H, K ** -0.5,
                                    K=K, V=V, BLOCK_K=BLOCK_K, BLOCK_V=BLOCK_V, num_warps=4)
        return o
