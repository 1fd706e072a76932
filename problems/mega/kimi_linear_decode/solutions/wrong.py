"""Wrong on purpose: the KDA state is decayed AFTER the delta-rule write instead of before it (so the write
reads the undecayed state and is itself decayed). Everything else matches the reference."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class W4(nn.Module):
    def __init__(self, lead, n, k, group):
        super().__init__()
        self.group = group
        self.register_buffer("qweight", torch.empty(*lead, n, k // 8, dtype=torch.int32))
        self.register_buffer("scales", torch.empty(*lead, n, k // group, dtype=torch.bfloat16))
        self.register_buffer("zeros", torch.empty(*lead, n, k // group, dtype=torch.bfloat16))

    def forward(self, x, *index):
        shifts = torch.arange(8, dtype=torch.int32, device=x.device) * 4
        codes = ((self.qweight[index][..., None] >> shifts) & 0xF).flatten(-2).float()
        scales = self.scales[index].float().repeat_interleave(self.group, -1)
        zeros = self.zeros[index].float().repeat_interleave(self.group, -1)
        return x @ ((codes - zeros) * scales).t()


def norm(x, gain):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * gain.float()


class ModelNew(nn.Module):
    def __init__(self, hidden, heads, head_dim, experts, top_k, moe_ffn, kv_lora, group):
        super().__init__()
        H, K = heads, head_dim
        self.heads, self.head_dim, self.top_k = H, K, top_k
        p = lambda *size, dtype=torch.bfloat16: nn.Parameter(torch.empty(*size, dtype=dtype))  # noqa: E731
        self.kda_norm, self.conv_weight, self.o_norm = p(3, hidden), p(3, 3 * H * K, 4), p(3, K)
        self.kda_in = W4((3,), 3 * H * K + 2 * K + H, hidden, group)
        self.kda_f_b, self.kda_g_b = W4((3,), H * K, K, group), W4((3,), H * K, K, group)
        self.A_log, self.dt_bias = p(3, H, dtype=torch.float32), p(3, H * K, dtype=torch.float32)
        self.kda_o = W4((3,), hidden, H * K, group)
        self.mla_norm, self.kv_norm = p(hidden), p(kv_lora)
        self.mla_q, self.mla_kv_a = W4((), H * K, hidden, group), W4((), kv_lora, hidden, group)
        self.mla_kv_b, self.mla_o = W4((), 2 * H * K, kv_lora, group), W4((), hidden, H * K, group)
        self.moe_norm, self.router = p(4, hidden), p(4, experts, hidden)
        self.router_bias = p(4, experts, dtype=torch.float32)
        self.expert_gate_up = W4((4, experts), 2 * moe_ffn, hidden, group)
        self.expert_down = W4((4, experts), hidden, moe_ffn, group)
        self.shared_gate_up, self.shared_down = W4((4,), 2 * moe_ffn, hidden, group), W4((4,), hidden, moe_ffn, group)
        self.final_norm = p(hidden)

    def moe(self, i, h):
        a = norm(h, self.moe_norm[i])
        s = torch.sigmoid(a @ self.router[i].float().t())[0]
        chosen = torch.topk(s + self.router_bias[i], self.top_k).indices
        weight = s[chosen] / s[chosen].sum() * 2.446
        pairs = [(None, 1.0)] + list(zip(chosen.tolist(), weight))
        for e, w in pairs:
            index = (i,) if e is None else (i, e)
            gate_up, down = (self.shared_gate_up, self.shared_down) if e is None else (self.expert_gate_up, self.expert_down)
            gate, up = gate_up(a, *index).chunk(2, -1)
            h = h + w * down(F.silu(gate) * up, *index)
        return h

    def forward(self, x, kda_state, conv_state, latent_cache):
        H, K = self.heads, self.head_dim
        h, states, columns = x.float(), [], []
        for i in range(3):
            q, k, v, f, b, r = self.kda_in(norm(h, self.kda_norm[i]), i)[0].split([H * K] * 3 + [K, H, K])
            new = torch.cat([q, k, v])
            conv = (torch.cat([conv_state[i].float(), new[:, None]], 1) * self.conv_weight[i].float()).sum(-1)
            q, k, v = F.silu(conv).view(3, H, K)
            q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6) * K ** -0.5
            k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
            g = -self.A_log[i].exp()[:, None] * F.softplus(self.kda_f_b(f, i) + self.dt_bias[i]).view(H, K)
            S = kda_state[i]
            S = S + torch.sigmoid(b)[:, None, None] * k[..., None] * (v - torch.einsum("hkv,hk->hv", S, k))[:, None]
            S = S * g.exp()[..., None]  # the bug: decay belongs before the write
            o = norm(torch.einsum("hkv,hk->hv", S, q), self.o_norm[i]) * torch.sigmoid(self.kda_g_b(r, i)).view(H, K)
            h = self.moe(i, h + self.kda_o(o.reshape(1, -1), i))
            states.append(S)
            columns.append(new.to(torch.bfloat16))
        a = norm(h, self.mla_norm)
        c = norm(self.mla_kv_a(a), self.kv_norm)
        kv = self.mla_kv_b(torch.cat([latent_cache.float(), c])).view(-1, H, 2, K)
        p = torch.softmax(torch.einsum("hd,nhd->hn", self.mla_q(a).view(H, K), kv[:, :, 0]) / K ** 0.5, -1)
        h = self.moe(3, h + self.mla_o(torch.einsum("hn,nhd->hd", p, kv[:, :, 1]).reshape(1, -1)))
        return norm(h, self.final_norm).to(torch.bfloat16), torch.stack(states), torch.stack(columns), c.to(torch.bfloat16)
