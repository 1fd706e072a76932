"""Wrong on purpose: rotates the new q and k to position ctx - 1 instead of ctx (the classic off-by-one
between "tokens cached" and "position of the new token"). Everything else matches the reference."""
import torch
import torch.nn as nn
import torch.nn.functional as F


def rms_norm(x, gain):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * gain.float()


def rope(x, pos):
    half = x.shape[-1] // 2
    angle = pos * 1.0e6 ** (-torch.arange(half, dtype=torch.float32, device=x.device) * 2 / x.shape[-1])
    return torch.cat([x[..., :half] * angle.cos() - x[..., half:] * angle.sin(),
                      x[..., half:] * angle.cos() + x[..., :half] * angle.sin()], -1)


class ModelNew(nn.Module):
    def __init__(self, layers: int, hidden: int, heads: int, kv_heads: int, head_dim: int, ffn: int):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        shapes = dict(attn_norm=(layers, hidden), wqkv=(layers, (heads + 2 * kv_heads) * head_dim, hidden),
                      q_norm=(layers, head_dim), k_norm=(layers, head_dim), wo=(layers, hidden, heads * head_dim),
                      mlp_norm=(layers, hidden), w_gate_up=(layers, 2 * ffn, hidden), w_down=(layers, hidden, ffn),
                      final_norm=(hidden,))
        for name, size in shapes.items():
            self.register_parameter(name, nn.Parameter(torch.empty(*size, dtype=torch.bfloat16)))

    def forward(self, x, k_cache, v_cache):
        H, G, D = self.heads, self.kv_heads, self.head_dim
        pos = k_cache.shape[2] - 1  # the bug: should be k_cache.shape[2]
        h, k_new, v_new = x.float(), [], []
        for l in range(k_cache.shape[0]):
            q, k, v = (rms_norm(h, self.attn_norm[l]) @ self.wqkv[l].float().t()).view(-1, D).split([H, G, G])
            q = rope(rms_norm(q, self.q_norm[l]), pos).view(G, H // G, D)
            k, v = rope(rms_norm(k, self.k_norm[l]), pos).to(x.dtype), v.to(x.dtype)
            keys = torch.cat([k_cache[l], k[:, None]], 1).float()
            values = torch.cat([v_cache[l], v[:, None]], 1).float()
            o = torch.softmax(q @ keys.transpose(1, 2) / D ** 0.5, -1) @ values
            h = h + o.reshape(1, -1) @ self.wo[l].float().t()
            gate, up = (rms_norm(h, self.mlp_norm[l]) @ self.w_gate_up[l].float().t()).chunk(2, -1)
            h = h + (F.silu(gate) * up) @ self.w_down[l].float().t()
            k_new.append(k)
            v_new.append(v)
        return rms_norm(h, self.final_norm).to(x.dtype), torch.stack(k_new), torch.stack(v_new)
