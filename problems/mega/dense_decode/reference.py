"""One decode step of a small dense transformer (Qwen3-0.6B-like, a few layers), batch 1, KV cache.

The KV cache holds the keys and values of the `ctx` previous tokens (positions 0 .. ctx-1, keys already
rotated); the new token sits at position `ctx`. Every layer l does, on the residual stream h (float32):

    a        = rms_norm(h) * attn_norm[l]
    q, k, v  = split(a @ wqkv[l].T)                          # heads, kv_heads, kv_heads vectors of head_dim
    q        = rope(rms_norm(q) * q_norm[l], ctx)            # per head, over head_dim
    k        = rope(rms_norm(k) * k_norm[l], ctx) -> bf16    # the new cache entries, in the cache's dtype
    v        = v -> bf16
    o[h]     = softmax(q[h] . K[g]^T / sqrt(head_dim)) @ V[g] # K, V: cache of kv head g = h // (heads // kv_heads)
                                                            #       with the new k, v appended (ctx + 1 keys)
    h        = h + o @ wo[l].T
    m        = rms_norm(h) * mlp_norm[l]
    gate, up = split(m @ w_gate_up[l].T)
    h        = h + (silu(gate) * up) @ w_down[l].T

and the step returns rms_norm(h) * final_norm (the hidden state the LM head would read) plus the new cache
entries. rms_norm(x) = x / sqrt(mean(x^2) + 1e-6). rope rotates halves (Qwen/Llama convention) by angles
pos * theta^(-2i/head_dim), theta = 1e6.

* ``x``       (1, hidden) bfloat16: the new token's embedding
* ``k_cache`` (layers, kv_heads, ctx, head_dim) bfloat16; ``v_cache`` likewise
* outputs: hidden (1, hidden) bfloat16, k_new (layers, kv_heads, head_dim) bfloat16, v_new likewise

Weights are bfloat16; everything is computed in float32 and rounded once at the end (k and v are rounded
before attention reads them, as a real cache write-then-read does). The weights are random, with q/k norm
gains that make attention logits have std ~3: as peaked as a trained model's, so that attention over the
whole cache matters (with unit logits it would be a near-uniform average that skipping the cache fakes).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EPS = 1e-6
ROPE_THETA = 1.0e6


def rms_norm(x: torch.Tensor, gain: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + EPS) * gain.float()


def rope(x: torch.Tensor, pos: int) -> torch.Tensor:
    """Rotate (..., head_dim) vectors to position ``pos`` (rotate-half convention)."""
    half = x.shape[-1] // 2
    inv_freq = ROPE_THETA ** (-torch.arange(half, dtype=torch.float32, device=x.device) * 2 / x.shape[-1])
    angle = pos * inv_freq
    cos, sin = angle.cos(), angle.sin()
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def gains(*size: int, scale: float = 1.0) -> nn.Parameter:
    return nn.Parameter((scale * (1.0 + 0.1 * torch.randn(*size))).to(torch.bfloat16))


def dense(layers: int, rows: int, cols: int) -> nn.Parameter:
    return nn.Parameter((torch.randn(layers, rows, cols) / cols ** 0.5).to(torch.bfloat16))


class Model(nn.Module):
    def __init__(self, layers: int, hidden: int, heads: int, kv_heads: int, head_dim: int, ffn: int):
        super().__init__()
        assert heads % kv_heads == 0 and head_dim % 2 == 0
        self.heads, self.kv_heads, self.head_dim, self.ffn = heads, kv_heads, head_dim, ffn
        self.attn_norm = gains(layers, hidden)
        self.wqkv = dense(layers, (heads + 2 * kv_heads) * head_dim, hidden)
        self.q_norm = gains(layers, head_dim)
        self.k_norm = gains(layers, head_dim, scale=3.0)
        self.wo = dense(layers, hidden, heads * head_dim)
        self.mlp_norm = gains(layers, hidden)
        self.w_gate_up = dense(layers, 2 * ffn, hidden)        # rows [0, ffn): gate, [ffn, 2 ffn): up
        self.w_down = dense(layers, hidden, ffn)
        self.final_norm = gains(hidden)

    def forward(self, x, k_cache, v_cache):
        H, G, D = self.heads, self.kv_heads, self.head_dim
        ctx = k_cache.shape[2]
        h = x.float()
        k_new, v_new = [], []
        for l in range(self.wqkv.shape[0]):
            a = rms_norm(h, self.attn_norm[l])
            q, k, v = (a @ self.wqkv[l].float().t()).view(H + 2 * G, D).split([H, G, G])
            q = rope(rms_norm(q, self.q_norm[l]), ctx)
            k = rope(rms_norm(k, self.k_norm[l]), ctx).to(torch.bfloat16)
            v = v.to(torch.bfloat16)
            keys = torch.cat([k_cache[l], k[:, None]], dim=1).float().repeat_interleave(H // G, dim=0)
            values = torch.cat([v_cache[l], v[:, None]], dim=1).float().repeat_interleave(H // G, dim=0)
            scores = torch.einsum("hd,hnd->hn", q, keys) / D ** 0.5          # (heads, ctx + 1)
            o = torch.einsum("hn,hnd->hd", scores.softmax(dim=-1), values)
            h = h + o.reshape(1, H * D) @ self.wo[l].float().t()
            gate, up = (rms_norm(h, self.mlp_norm[l]) @ self.w_gate_up[l].float().t()).chunk(2, dim=-1)
            h = h + (F.silu(gate) * up) @ self.w_down[l].float().t()
            k_new.append(k)
            v_new.append(v)
        return rms_norm(h, self.final_norm).to(torch.bfloat16), torch.stack(k_new), torch.stack(v_new)


def get_init_inputs(shape: dict) -> list:
    return [shape[k] for k in ("layers", "hidden", "heads", "kv_heads", "head_dim", "ffn")]


def get_inputs(shape: dict, device: torch.device) -> list:
    L, G, D, ctx = shape["layers"], shape["kv_heads"], shape["head_dim"], shape["ctx"]
    x = torch.randn(1, shape["hidden"], device=device).to(torch.bfloat16)
    k_cache = (3.0 * torch.randn(L, G, ctx, D, device=device)).to(torch.bfloat16)   # like k_norm's gain
    v_cache = torch.randn(L, G, ctx, D, device=device).to(torch.bfloat16)
    return [x, k_cache, v_cache]
