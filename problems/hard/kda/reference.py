"""Kimi Delta Attention (KDA) forward: the gated delta rule with per-channel decay.

Per batch b and head h, with a state S of shape (K, V) that starts at zero, for t = 0 .. T-1:

    q_t = l2norm(q[b, t, h]) * K**-0.5        k_t = l2norm(k[b, t, h])        (over the K channels)
    beta_t = sigmoid(b[b, t, h])              a_t = exp(g[b, t, h])            (a_t in (0, 1]^K)

    S   = diag(a_t) @ S                                   # per-channel forgetting
    S   = S + beta_t * k_t (v_t - S^T k_t)^T               # delta-rule write of v_t under key k_t
    o_t = S^T q_t                                         # read out

* ``q``, ``k`` (B, T, H, K) bfloat16;  ``v`` (B, T, H, V) bfloat16
* ``g``        (B, T, H, K) float32, log-decay per channel (<= 0)
* ``b``        (B, T, H)    bfloat16, beta logits (beta = sigmoid(b))
* output ``o`` (B, T, H, V) bfloat16

This is what Kimi Linear calls with ``use_qk_l2norm_in_kernel=True`` and the beta sigmoid fused in.
l2norm(x) = x / sqrt(sum(x^2) + 1e-6).  The loop below is the plain token-by-token recurrence in
float32; fast implementations process chunks of tokens in parallel, which gives the same result.
"""
import torch
import torch.nn as nn


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, q, k, v, g, b):
        B, T, H, K = q.shape
        V = v.shape[-1]
        q = l2norm(q.float()) * K ** -0.5
        k = l2norm(k.float())
        v = v.float()
        decay = torch.exp(g.float())            # (B, T, H, K)
        beta = torch.sigmoid(b.float())          # (B, T, H)

        S = torch.zeros(B, H, K, V, dtype=torch.float32, device=q.device)
        o = torch.empty(B, T, H, V, dtype=torch.float32, device=q.device)
        for t in range(T):
            k_t, v_t = k[:, t], v[:, t]                                   # (B, H, K), (B, H, V)
            S = S * decay[:, t, :, :, None]                               # forget, channel by channel
            predicted = torch.einsum("bhkv,bhk->bhv", S, k_t)             # what the state recalls for k_t
            update = beta[:, t, :, None] * (v_t - predicted)              # (B, H, V)
            S = S + torch.einsum("bhk,bhv->bhkv", k_t, update)            # rank-1 correction
            o[:, t] = torch.einsum("bhkv,bhk->bhv", S, q[:, t])
        return o.to(torch.bfloat16)


def get_init_inputs(shape: dict) -> list:
    return []


def get_inputs(shape: dict, device: torch.device) -> list:
    B, T, H, K, V = shape["B"], shape["T"], shape["H"], shape["K"], shape["V"]
    q = torch.randn(B, T, H, K, device=device).to(torch.bfloat16)
    k = torch.randn(B, T, H, K, device=device).to(torch.bfloat16)
    v = torch.randn(B, T, H, V, device=device).to(torch.bfloat16)
    # Per-channel decay: each (sequence, head, channel) has its own base rate, log-uniform in
    # [1e-3, 0.5] per token, modulated token by token.  Slow channels remember ~1000 tokens (so the
    # state carried across chunks matters); fast ones forget within a few tokens.
    base = torch.exp(torch.empty(B, 1, H, K, device=device).uniform_(-6.9, -0.69))
    modulation = torch.exp(0.5 * torch.randn(B, T, H, K, device=device) - 0.125)
    g = -(base * modulation).clamp(max=1.0)                       # float32, log-decay in [-1, 0)
    b = (torch.randn(B, T, H, device=device) + 1.0).to(torch.bfloat16)   # beta mostly in 0.5..0.9
    return [q, k, v, g, b]
