"""One decode step of a Kimi-Linear-style hybrid model: 3 KDA layers, 1 MLA layer, a top-k MoE after each.

Batch 1. Every linear layer is W4A16 (asymmetric int4, group-wise along the input dimension, AWQ-style):

    w[n, k] = (code[n, k] - zeros[n, k // group]) * scales[n, k // group]      code in 0..15
    qweight[n, j] packs the codes of k = 8j .. 8j+7, code of k = 8j + i in bits 4i .. 4i+3

Layers, on the float32 residual stream h (rms_norm(x) = x / sqrt(mean(x^2) + 1e-6) * gain):

KDA (Kimi Delta Attention) layer i = 0, 1, 2, with H heads of size K (= V), state S (H, K, V):
    a = rms_norm(h);  q, k, v, f, b, r = split(kda_in(a))         # q, k, v: H*K each; f, r: K; b: H
    window = [conv_state (3 previous steps), new q|k|v]                         # (3*H*K, 4), oldest first
    q, k, v = silu(sum(window * conv_weight, -1))                               # causal depthwise conv, kernel 4
    q = l2norm(q) * K**-0.5;  k = l2norm(k)                                     # per head
    g = -exp(A_log[head]) * softplus(kda_f_b(f) + dt_bias)                      # log-decay per channel (H, K)
    S = exp(g)[..., None] * S;  S = S + sigmoid(b) * k (v - S^T k)^T;  o = S^T q   # per head
    o = rms_norm(o) per head * sigmoid(kda_g_b(r));  h = h + kda_o(o)
MLA layer (no rope, as in Kimi Linear), H heads of size K, latent cache of kv_lora per token:
    a = rms_norm(h);  q = mla_q(a);  c = rms_norm(mla_kv_a(a))                       # c: the new latent
    k, v = split(mla_kv_b([latent_cache; c]))  per head                            # ctx + 1 keys
    o = softmax(q . k / sqrt(K)) v;  h = h + mla_o(o)
MoE after every layer (E experts, top_k routed + 1 shared, SwiGLU of width moe_ffn):
    a = rms_norm(h);  s = sigmoid(a @ router^T)                                 # float32, (E,)
    chosen = top_k of (s + router_bias);  weight = s[chosen] / sum(s[chosen]) * 2.446
    h = h + shared(a) + sum(weight[e] * expert_e(a)),   expert(a) = down(silu(gate(a)) * up(a))
Then out = rms_norm(h) with final_norm.

Inputs: x (1, hidden) bf16; kda_state (3, H, K, K) float32; conv_state (3, 3*H*K, 3) bf16, the last three
projected q|k|v vectors, oldest first; latent_cache (ctx, kv_lora) bf16.
Outputs (fresh tensors): out (1, hidden) bf16; the new kda_state (3, H, K, K) float32; the new conv column
of each KDA layer (3, 3*H*K) bf16 (the conv state shifts it in); the new latent (1, kv_lora) bf16.

Everything is computed in float32 from the int4/bf16 weights and rounded once, at the outputs (the new conv
column and latent are used in float32 by this step and returned rounded to bf16, the caches' dtype). Expert
choice depends on the router's float32 scores: a step that rounds activations to bf16 on the way picks a
different expert now and then, and one different expert early changes everything after it. The latent-norm
gain (~3) makes attention logits have std ~3.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EPS = 1e-6
ROUTED_SCALE = 2.446
KDA_LAYERS = 3
LAYERS = KDA_LAYERS + 1
CONV = 4


class W4(nn.Module):
    """A stack of int4 weights (*lead, n, k) with bf16 scales and zero points per group of k."""

    def __init__(self, lead: tuple, n: int, k: int, group: int):
        super().__init__()
        assert k % group == 0 and group % 8 == 0
        self.group = group
        words = torch.randint(0, 256, (*lead, n, k // 8 * 4), dtype=torch.uint8)
        self.register_buffer("qweight", words.view(torch.int32))                   # uniform random codes
        scale = torch.empty(*lead, n, k // group).uniform_(0.75, 1.25) / (4.64 * k ** 0.5)
        self.register_buffer("scales", scale.to(torch.bfloat16))                    # weight std ~ 1/sqrt(k)
        self.register_buffer("zeros", torch.randint(7, 9, (*lead, n, k // group)).to(torch.bfloat16))

    def weight(self, *index) -> torch.Tensor:
        """The float32 (n, k) matrix at ``index`` of the leading dimensions."""
        packed = self.qweight[index]
        shifts = torch.arange(8, dtype=torch.int32, device=packed.device) * 4
        codes = ((packed[..., None] >> shifts) & 0xF).flatten(-2).float()
        scales = self.scales[index].float().repeat_interleave(self.group, dim=-1)
        zeros = self.zeros[index].float().repeat_interleave(self.group, dim=-1)
        return (codes - zeros) * scales

    def forward(self, x: torch.Tensor, *index) -> torch.Tensor:
        return x @ self.weight(*index).t()


def rms_norm(x: torch.Tensor, gain: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + EPS) * gain.float()


def l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + EPS)


def gains(*size: int, scale: float = 1.0) -> nn.Parameter:
    return nn.Parameter((scale * (1.0 + 0.1 * torch.randn(*size))).to(torch.bfloat16))


class Model(nn.Module):
    def __init__(self, hidden: int, heads: int, head_dim: int, experts: int, top_k: int, moe_ffn: int,
                 kv_lora: int, group: int):
        super().__init__()
        H, K, n = heads, head_dim, KDA_LAYERS
        self.heads, self.head_dim, self.top_k = H, K, top_k
        # KDA layers
        self.kda_norm = gains(n, hidden)
        self.kda_in = W4((n,), 3 * H * K + 2 * K + H, hidden, group)    # q | k | v | f | b | r
        self.conv_weight = nn.Parameter((0.5 * torch.randn(n, 3 * H * K, CONV)).to(torch.bfloat16))
        self.kda_f_b = W4((n,), H * K, K, group)
        self.A_log = nn.Parameter(torch.empty(n, H).uniform_(0.0, 2.77))             # exp(A) in 1 .. 16
        self.dt_bias = nn.Parameter(torch.log(torch.expm1(torch.empty(n, H * K).uniform_(1e-3, 0.1))))
        self.kda_g_b = W4((n,), H * K, K, group)
        self.o_norm = gains(n, K)
        self.kda_o = W4((n,), hidden, H * K, group)
        # MLA layer
        self.mla_norm = gains(hidden)
        self.mla_q = W4((), H * K, hidden, group)
        self.mla_kv_a = W4((), kv_lora, hidden, group)
        self.kv_norm = gains(kv_lora, scale=3.0)
        self.mla_kv_b = W4((), 2 * H * K, kv_lora, group)               # per head: k (K) | v (K)
        self.mla_o = W4((), hidden, H * K, group)
        # MoE after every layer
        self.moe_norm = gains(LAYERS, hidden)
        self.router = nn.Parameter((torch.randn(LAYERS, experts, hidden) / hidden ** 0.5).to(torch.bfloat16))
        self.router_bias = nn.Parameter(0.5 * torch.randn(LAYERS, experts))     # spread: few near-ties at the top-k cut
        self.expert_gate_up = W4((LAYERS, experts), 2 * moe_ffn, hidden, group)   # rows: gate | up
        self.expert_down = W4((LAYERS, experts), hidden, moe_ffn, group)
        self.shared_gate_up = W4((LAYERS,), 2 * moe_ffn, hidden, group)
        self.shared_down = W4((LAYERS,), hidden, moe_ffn, group)
        self.final_norm = gains(hidden)

    def kda(self, i, h, S, conv_state):
        H, K = self.heads, self.head_dim
        q, k, v, f, b, r = self.kda_in(rms_norm(h, self.kda_norm[i]), i)[0].split([H * K] * 3 + [K, H, K])
        new = torch.cat([q, k, v])
        window = torch.cat([conv_state.float(), new[:, None]], dim=1)
        q, k, v = F.silu((window * self.conv_weight[i].float()).sum(-1)).view(3, H, K)
        q, k = l2norm(q) * K ** -0.5, l2norm(k)
        g = -self.A_log[i].exp()[:, None] * F.softplus(self.kda_f_b(f, i) + self.dt_bias[i]).view(H, K)
        S = S * g.exp()[..., None]
        S = S + torch.sigmoid(b)[:, None, None] * k[..., None] * (v - torch.einsum("hkv,hk->hv", S, k))[:, None]
        o = torch.einsum("hkv,hk->hv", S, q)
        o = rms_norm(o, self.o_norm[i]) * torch.sigmoid(self.kda_g_b(r, i)).view(H, K)
        return h + self.kda_o(o.reshape(1, -1), i), S, new.to(torch.bfloat16)

    def mla(self, h, latent_cache):
        H, K = self.heads, self.head_dim
        a = rms_norm(h, self.mla_norm)
        q = self.mla_q(a).view(H, K)
        c = rms_norm(self.mla_kv_a(a), self.kv_norm)
        k, v = self.mla_kv_b(torch.cat([latent_cache.float(), c])).view(-1, H, 2, K).unbind(2)
        p = torch.softmax(torch.einsum("hd,nhd->hn", q, k) / K ** 0.5, dim=-1)
        return h + self.mla_o(torch.einsum("hn,nhd->hd", p, v).reshape(1, -1)), c.to(torch.bfloat16)

    def moe(self, i, h):
        a = rms_norm(h, self.moe_norm[i])
        s = torch.sigmoid(a @ self.router[i].float().t())[0]
        chosen = torch.topk(s + self.router_bias[i], self.top_k).indices
        weight = s[chosen] / s[chosen].sum() * ROUTED_SCALE

        def swiglu(gate_up, down, *index):
            gate, up = gate_up(a, *index).chunk(2, dim=-1)
            return down(F.silu(gate) * up, *index)

        out = swiglu(self.shared_gate_up, self.shared_down, i)
        for e, w in zip(chosen.tolist(), weight):
            out = out + w * swiglu(self.expert_gate_up, self.expert_down, i, e)
        return h + out

    def forward(self, x, kda_state, conv_state, latent_cache):
        h = x.float()
        states, columns = [], []
        for i in range(KDA_LAYERS):
            h, S, column = self.kda(i, h, kda_state[i], conv_state[i])
            h = self.moe(i, h)
            states.append(S)
            columns.append(column)
        h, latent = self.mla(h, latent_cache)
        h = self.moe(KDA_LAYERS, h)
        return rms_norm(h, self.final_norm).to(torch.bfloat16), torch.stack(states), torch.stack(columns), latent


def get_init_inputs(shape: dict) -> list:
    return [shape[k] for k in ("hidden", "heads", "head_dim", "experts", "top_k", "moe_ffn", "kv_lora", "group")]


def get_inputs(shape: dict, device: torch.device) -> list:
    H, K = shape["heads"], shape["head_dim"]
    x = torch.randn(1, shape["hidden"], device=device).to(torch.bfloat16)
    kda_state = 0.5 * torch.randn(KDA_LAYERS, H, K, K, device=device)
    conv_state = (0.5 * torch.randn(KDA_LAYERS, 3 * H * K, CONV - 1, device=device)).to(torch.bfloat16)
    latent_cache = (3.0 * torch.randn(shape["ctx"], shape["kv_lora"], device=device)).to(torch.bfloat16)  # like kv_norm
    return [x, kda_state, conv_state, latent_cache]
