"""Optimized eager PyTorch for the Kimi-Linear decode step.

Plain PyTorch has no int4 GEMV for this layout, so the int4 weights are dequantized once, here, to float32
(the step's routing needs float32 activations end to end, and PyTorch has no bf16-weight x float32-vector
product; the step reads 8x the bytes an int4 kernel would). Per step: GEMVs, the KDA update as batched
products, MLA with the kv_b weight absorbed into the query and the output (attention over the latent cache
without decompressing it), and the routed experts looped over on the host (one device sync per MoE).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EPS = 1e-6
ROUTED_SCALE = 2.446


class Baseline(nn.Module):
    def __init__(self, ref: nn.Module):
        super().__init__()
        self.ref = ref
        H, K = ref.heads, ref.head_dim
        layers, experts = ref.expert_down.qweight.shape[:2]
        with torch.no_grad():
            self.kda_in, self.kda_f_b, self.kda_g_b, self.kda_o = (
                [w4.weight(i) for i in range(3)] for w4 in (ref.kda_in, ref.kda_f_b, ref.kda_g_b, ref.kda_o))
            self.mla_q, self.mla_kv_a, self.mla_o = ref.mla_q.weight(), ref.mla_kv_a.weight(), ref.mla_o.weight()
            kv_b = ref.mla_kv_b.weight().view(H, 2, K, -1)
            self.w_uk, self.w_uv = kv_b[:, 0], kv_b[:, 1]                                   # (H, K, kv_lora)
            self.router = ref.router.float()
            self.gate_up = [[ref.expert_gate_up.weight(i, e) for e in range(experts)] for i in range(layers)]
            self.down = [[ref.expert_down.weight(i, e) for e in range(experts)] for i in range(layers)]
            self.shared_gate_up = [ref.shared_gate_up.weight(i) for i in range(layers)]
            self.shared_down = [ref.shared_down.weight(i) for i in range(layers)]

    @staticmethod
    def norm(h, gain):
        return F.rms_norm(h, (h.shape[-1],), gain.float(), EPS)

    def kda(self, i, h, S, conv_state):
        r, H, K = self.ref, self.ref.heads, self.ref.head_dim
        q, k, v, f, b, g_in = F.linear(self.norm(h, r.kda_norm[i]), self.kda_in[i])[0].split([H * K] * 3 + [K, H, K])
        new = torch.cat([q, k, v])
        window = torch.cat([conv_state.float(), new[:, None]], dim=1)
        q, k, v = F.silu((window * r.conv_weight[i].float()).sum(-1)).view(3, H, K)
        q = F.normalize(q, dim=-1, eps=EPS) * K ** -0.5
        k = F.normalize(k, dim=-1, eps=EPS)
        g = -r.A_log[i].exp()[:, None] * F.softplus(F.linear(f, self.kda_f_b[i]) + r.dt_bias[i]).view(H, K)
        S = S * g.exp()[..., None]
        S = S + (torch.sigmoid(b)[:, None] * (v - (k[:, None] @ S)[:, 0]))[:, None] * k[..., None]
        o = self.norm((q[:, None] @ S)[:, 0], r.o_norm[i]) * torch.sigmoid(F.linear(g_in, self.kda_g_b[i])).view(H, K)
        return h + F.linear(o.reshape(1, -1), self.kda_o[i]), S, new.to(torch.bfloat16)

    def mla(self, h, latent_cache):
        r, H, K = self.ref, self.ref.heads, self.ref.head_dim
        a = self.norm(h, r.mla_norm)
        q_lat = F.linear(a, self.mla_q).view(H, 1, K) @ self.w_uk                  # (H, 1, kv_lora)
        c = self.norm(F.linear(a, self.mla_kv_a), r.kv_norm)
        cache = latent_cache.float()
        logits = torch.cat([q_lat @ cache.t(), q_lat @ c.t()], dim=-1) / K ** 0.5
        p = logits.softmax(dim=-1)
        o = (p[..., :-1] @ cache + p[..., -1:] * c) @ self.w_uv.transpose(1, 2)    # (H, 1, K)
        return h + F.linear(o.reshape(1, -1), self.mla_o), c.to(torch.bfloat16)

    def moe(self, i, h):
        r = self.ref
        a = self.norm(h, r.moe_norm[i])
        s = torch.sigmoid(a @ self.router[i].t())[0]
        chosen = torch.topk(s + r.router_bias[i], r.top_k).indices
        weight = s[chosen] / s[chosen].sum() * ROUTED_SCALE

        def swiglu(gate_up, down):
            gate, up = F.linear(a, gate_up).chunk(2, dim=-1)
            return F.linear(F.silu(gate) * up, down)

        out = swiglu(self.shared_gate_up[i], self.shared_down[i])
        for e, w in zip(chosen.tolist(), weight):
            out = out + w * swiglu(self.gate_up[i][e], self.down[i][e])
        return h + out

    def forward(self, x, kda_state, conv_state, latent_cache):
        h = x.float()
        states, columns = [], []
        for i in range(3):
            h, S, column = self.kda(i, h, kda_state[i], conv_state[i])
            h = self.moe(i, h)
            states.append(S)
            columns.append(column)
        h, latent = self.mla(h, latent_cache)
        h = self.moe(3, h)
        return self.norm(h, self.ref.final_norm).to(torch.bfloat16), torch.stack(states), torch.stack(columns), latent
