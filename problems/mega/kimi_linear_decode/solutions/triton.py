"""The Kimi-Linear decode step in Triton, MULTI-kernel: correct, but ~45 launches per step (fails the gate).

A correct reference point for the track, not a megakernel. Kernels: a W4A16 GEMV family (int4 codes
unpacked per group, optional fused input RMSNorm, residual add, SwiGLU pair, routed-expert weighted sum),
one KDA recurrent step per head, the MoE router with an in-kernel top-k, and MLA decode with the kv_b weight
absorbed (query into latent space, attention over the latent cache split across programs, merge, values
out of latent space). Activations stay float32 between kernels, as the routing requires.
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl

ROUTED_SCALE = 2.446
KDA_LAYERS = 3
BLOCK_KEYS = 32
MAX_SPLITS = 32


@triton.jit
def _rstd(x_ptr, K, BK: tl.constexpr):
    acc = tl.zeros((BK,), tl.float32)
    for k0 in range(0, K, BK):
        ks = k0 + tl.arange(0, BK)
        v = tl.load(x_ptr + ks, mask=ks < K, other=0.0)
        acc += v * v
    return tl.rsqrt(tl.sum(acc, 0) / K + 1e-6)


@triton.jit
def _w4_rows(qw_ptr, s_ptr, z_ptr, rows, rmask, x_ptr, gain_ptr, rstd, K, NORM: tl.constexpr,
             GROUP: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """sum_k W[rows, k] * v[k] for an int4 matrix (K columns) and float32 v (times rstd * gain when NORM)."""
    rows64 = rows.to(tl.int64)
    acc = tl.zeros((BN, BK), tl.float32)
    for k0 in range(0, K, BK):
        ks = k0 + tl.arange(0, BK)
        km = ks < K
        v = tl.load(x_ptr + ks, mask=km, other=0.0)
        if NORM:
            v = v * rstd * tl.load(gain_ptr + ks, mask=km, other=0.0).to(tl.float32)
        m = rmask[:, None] & km[None, :]
        words = tl.load(qw_ptr + rows64[:, None] * (K // 8) + (ks // 8)[None, :], mask=m, other=0)
        codes = ((words >> ((ks % 8) * 4)[None, :]) & 0xF).to(tl.float32)
        group = rows64[:, None] * (K // GROUP) + (ks // GROUP)[None, :]
        scale = tl.load(s_ptr + group, mask=m, other=0.0).to(tl.float32)
        zero = tl.load(z_ptr + group, mask=m, other=0.0).to(tl.float32)
        acc += (codes - zero) * scale * v[None, :]
    return tl.sum(acc, 1)


@triton.jit
def _gemv(x_ptr, gain_ptr, qw_ptr, s_ptr, z_ptr, res_ptr, y_ptr, N, K,
          NORM: tl.constexpr, RES: tl.constexpr, GROUP: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """y = [res +] W @ [rms_norm](x)."""
    rows = tl.program_id(0) * BN + tl.arange(0, BN)
    rstd = 1.0
    if NORM:
        rstd = _rstd(x_ptr, K, BK)
    y = _w4_rows(qw_ptr, s_ptr, z_ptr, rows, rows < N, x_ptr, gain_ptr, rstd, K, NORM, GROUP, BN, BK)
    if RES:
        y += tl.load(res_ptr + rows, mask=rows < N, other=0.0)
    tl.store(y_ptr + rows, y, mask=rows < N)


@triton.jit
def _swiglu(x_ptr, gain_ptr, ids_ptr, qw_ptr, s_ptr, z_ptr, act_ptr, I, K,
            ROUTED: tl.constexpr, GROUP: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """act[m] = silu(gate) * up of matrix ids[m] (or the one matrix) applied to rms_norm(x)."""
    m = tl.program_id(1)
    e = tl.load(ids_ptr + m).to(tl.int64) if ROUTED else tl.zeros((), tl.int64)
    qw, s, z = qw_ptr + e * (2 * I * K // 8), s_ptr + e * (2 * I * K // GROUP), z_ptr + e * (2 * I * K // GROUP)
    rows = tl.program_id(0) * BN + tl.arange(0, BN)
    rstd = _rstd(x_ptr, K, BK)
    gate = _w4_rows(qw, s, z, rows, rows < I, x_ptr, gain_ptr, rstd, K, True, GROUP, BN, BK)
    up = _w4_rows(qw, s, z, I + rows, rows < I, x_ptr, gain_ptr, rstd, K, True, GROUP, BN, BK)
    tl.store(act_ptr + m * I + rows, gate / (1.0 + tl.exp(-gate)) * up, mask=rows < I)


@triton.jit
def _moe_down(act_ptr, ids_ptr, w_ptr, qw_ptr, s_ptr, z_ptr, res_ptr, y_ptr, N, I,
              TOP_K: tl.constexpr, GROUP: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """y = res + sum_j weight[j] * down_{ids[j]} @ act[j], experts summed in a fixed order."""
    rows = tl.program_id(0) * BN + tl.arange(0, BN)
    y = tl.load(res_ptr + rows, mask=rows < N, other=0.0)
    for j in range(TOP_K):
        e = tl.load(ids_ptr + j).to(tl.int64)
        out = _w4_rows(qw_ptr + e * (N * I // 8), s_ptr + e * (N * I // GROUP), z_ptr + e * (N * I // GROUP),
                       rows, rows < N, act_ptr + j * I, act_ptr, 1.0, I, False, GROUP, BN, BK)
        y += tl.load(w_ptr + j) * out
    tl.store(y_ptr + rows, y, mask=rows < N)


@triton.jit
def _router(x_ptr, gain_ptr, router_ptr, bias_ptr, ids_ptr, w_ptr, E, K, scale,
            TOP_K: tl.constexpr, BT: tl.constexpr, BE: tl.constexpr, BK: tl.constexpr):
    """Sigmoid scores of rms_norm(x), top-k of score + bias, weights normalised over the chosen."""
    experts = tl.arange(0, BE)
    rstd = _rstd(x_ptr, K, BK)
    acc = tl.zeros((BE, BK), tl.float32)
    for k0 in range(0, K, BK):
        ks = k0 + tl.arange(0, BK)
        v = tl.load(x_ptr + ks, mask=ks < K, other=0.0) * rstd * tl.load(gain_ptr + ks, mask=ks < K, other=0.0).to(tl.float32)
        r = tl.load(router_ptr + experts[:, None] * K + ks[None, :], mask=(experts < E)[:, None] & (ks < K)[None, :], other=0.0)
        acc += r.to(tl.float32) * v[None, :]
    s = 1.0 / (1.0 + tl.exp(-tl.sum(acc, 1)))
    key = tl.where(experts < E, s + tl.load(bias_ptr + experts, mask=experts < E, other=0.0), -float("inf"))
    slots = tl.arange(0, BT)
    chosen = tl.zeros((BT,), tl.float32)
    for j in range(TOP_K):
        best = tl.argmax(key, 0)
        chosen = tl.where(slots == j, tl.sum(tl.where(experts == best, s, 0.0), 0), chosen)
        tl.store(ids_ptr + j, best)
        key = tl.where(experts == best, -float("inf"), key)
    tl.store(w_ptr + slots, chosen / tl.sum(chosen, 0) * scale, mask=slots < TOP_K)


@triton.jit
def _conv_silu(proj_ptr, conv_ptr, conv_w_ptr, col_ptr, c):
    """Causal depthwise conv (kernel 4) of channels c over 3 stored steps and the new value, SiLU."""
    new = tl.load(proj_ptr + c)
    tl.store(col_ptr + c, new.to(tl.bfloat16))
    y = new * tl.load(conv_w_ptr + c * 4 + 3).to(tl.float32)
    for t in tl.static_range(3):
        y += tl.load(conv_ptr + c * 3 + t).to(tl.float32) * tl.load(conv_w_ptr + c * 4 + t).to(tl.float32)
    return y / (1.0 + tl.exp(-y))


@triton.jit
def _kda_head(proj_ptr, conv_ptr, conv_w_ptr, fb_ptr, gb_ptr, a_log_ptr, dt_ptr, o_norm_ptr, s_in_ptr,
              s_out_ptr, col_ptr, o_ptr, H, K: tl.constexpr):
    """One head: short conv + SiLU of q, k, v, l2 norms, decay, delta-rule update, read-out, gated norm."""
    h = tl.program_id(0)
    d = tl.arange(0, K)
    HK = H * K
    q = _conv_silu(proj_ptr, conv_ptr, conv_w_ptr, col_ptr, h * K + d)
    k = _conv_silu(proj_ptr, conv_ptr, conv_w_ptr, col_ptr, HK + h * K + d)
    v = _conv_silu(proj_ptr, conv_ptr, conv_w_ptr, col_ptr, 2 * HK + h * K + d)
    q = q * tl.rsqrt(tl.sum(q * q, 0) + 1e-6) * (K ** -0.5)
    k = k * tl.rsqrt(tl.sum(k * k, 0) + 1e-6)
    z = tl.load(fb_ptr + h * K + d) + tl.load(dt_ptr + h * K + d)
    softplus = tl.where(z > 20.0, z, tl.log(1.0 + tl.exp(tl.minimum(z, 20.0))))
    decay = tl.exp(-tl.exp(tl.load(a_log_ptr + h)) * softplus)
    beta = 1.0 / (1.0 + tl.exp(-tl.load(proj_ptr + 3 * HK + K + h)))
    offs = h * K * K + d[:, None] * K + d[None, :]
    S = tl.load(s_in_ptr + offs) * decay[:, None]
    u = beta * (v - tl.sum(S * k[:, None], 0))
    S = S + k[:, None] * u[None, :]
    tl.store(s_out_ptr + offs, S)
    o = tl.sum(S * q[:, None], 0)
    o = o * tl.rsqrt(tl.sum(o * o, 0) / K + 1e-6) * tl.load(o_norm_ptr + d).to(tl.float32)
    o = o / (1.0 + tl.exp(-tl.load(gb_ptr + h * K + d)))
    tl.store(o_ptr + h * K + d, o)


@triton.jit
def _latent(x_ptr, gain_ptr, lat_ptr, out_ptr, C, BC: tl.constexpr):
    """The new latent: float32 for this step's attention, bf16 for the cache."""
    cs = tl.arange(0, BC)
    x = tl.load(x_ptr + cs, mask=cs < C, other=0.0)
    y = x * tl.rsqrt(tl.sum(x * x, 0) / C + 1e-6) * tl.load(gain_ptr + cs, mask=cs < C, other=0.0).to(tl.float32)
    tl.store(lat_ptr + cs, y, mask=cs < C)
    tl.store(out_ptr + cs, y.to(tl.bfloat16), mask=cs < C)


@triton.jit
def _mla_absorb(q_ptr, qw_ptr, s_ptr, z_ptr, q_lat_ptr, C, K: tl.constexpr, GROUP: tl.constexpr, BC: tl.constexpr):
    """q_lat[h, c] = sum_d q[h, d] * W_uk[h][d, c], W_uk[h] = rows h*2K .. h*2K+K of kv_b (C columns)."""
    h = tl.program_id(0)
    cs = tl.program_id(1) * BC + tl.arange(0, BC)
    d = tl.arange(0, K)
    rows = (h * 2 * K + d).to(tl.int64)[:, None]
    m = (cs < C)[None, :]
    words = tl.load(qw_ptr + rows * (C // 8) + (cs // 8)[None, :], mask=m, other=0)
    scale = tl.load(s_ptr + rows * (C // GROUP) + (cs // GROUP)[None, :], mask=m, other=0.0).to(tl.float32)
    zero = tl.load(z_ptr + rows * (C // GROUP) + (cs // GROUP)[None, :], mask=m, other=0.0).to(tl.float32)
    w = (((words >> ((cs % 8) * 4)[None, :]) & 0xF).to(tl.float32) - zero) * scale
    tl.store(q_lat_ptr + h * C + cs, tl.sum(tl.load(q_ptr + h * K + d)[:, None] * w, 0), mask=cs < C)


@triton.jit
def _mla_attn(q_lat_ptr, cache_ptr, new_ptr, part_o_ptr, part_ml_ptr, ctx, split_len, splits, C, sm_scale,
              BC: tl.constexpr, BLOCK: tl.constexpr):
    """Online softmax of one head over one split of the ctx + 1 latent keys (values are the latents too)."""
    h = tl.program_id(0)
    sp = tl.program_id(1)
    cs = tl.arange(0, BC)
    q = tl.load(q_lat_ptr + h * C + cs, mask=cs < C, other=0.0)
    start = sp * split_len
    end = tl.minimum(start + split_len, ctx + 1)
    m_i = tl.max(tl.full((BLOCK,), -1.0e30, tl.float32), 0)
    l_i = tl.sum(tl.zeros((BLOCK,), tl.float32), 0)
    acc = tl.zeros((BC,), tl.float32)
    for n0 in range(start, end, BLOCK):
        pos = n0 + tl.arange(0, BLOCK)
        valid = pos < end
        cached = (valid & (pos < ctx))[:, None] & (cs < C)[None, :]
        new = (valid & (pos == ctx))[:, None] & (cs < C)[None, :]
        lat = tl.load(cache_ptr + pos[:, None].to(tl.int64) * C + cs[None, :], mask=cached, other=0.0).to(tl.float32) \
            + tl.load(new_ptr + cs[None, :] + 0 * pos[:, None], mask=new, other=0.0)
        score = tl.where(valid, tl.sum(lat * q[None, :], 1) * sm_scale, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(score, 0))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(score - m_new)
        l_i = l_i * alpha + tl.sum(p, 0)
        acc = acc * alpha + tl.sum(p[:, None] * lat, 0)
        m_i = m_new
    slot = h * splits + sp
    tl.store(part_o_ptr + slot * C + cs, acc, mask=cs < C)
    tl.store(part_ml_ptr + 2 * slot, m_i)
    tl.store(part_ml_ptr + 2 * slot + 1, l_i)


@triton.jit
def _mla_out(part_o_ptr, part_ml_ptr, lat_ptr, qw_ptr, s_ptr, z_ptr, o_ptr, splits, C, K: tl.constexpr,
             GROUP: tl.constexpr, BC: tl.constexpr, BS: tl.constexpr, BK: tl.constexpr):
    """Merge the splits of head h into its latent output, then o[h] = W_uv[h] @ latent (kv_b rows h*2K+K ..)."""
    h = tl.program_id(0)
    cs = tl.arange(0, BC)
    ss = tl.arange(0, BS)
    sm = ss < splits
    m_s = tl.load(part_ml_ptr + 2 * (h * splits + ss), mask=sm, other=-1.0e30)
    l_s = tl.load(part_ml_ptr + 2 * (h * splits + ss) + 1, mask=sm, other=0.0)
    weight = tl.exp(m_s - tl.max(m_s, 0))
    parts = tl.load(part_o_ptr + (h * splits + ss)[:, None] * C + cs[None, :], mask=sm[:, None] & (cs < C)[None, :], other=0.0)
    tl.store(lat_ptr + h * C + cs, tl.sum(weight[:, None] * parts, 0) / tl.sum(weight * l_s, 0), mask=cs < C)
    tl.debug_barrier()
    rows = h * 2 * K + K + tl.arange(0, K)
    o = _w4_rows(qw_ptr, s_ptr, z_ptr, rows, rows < (h + 1) * 2 * K, lat_ptr + h * C, lat_ptr, 1.0, C, False, GROUP, K, BK)
    tl.store(o_ptr + h * K + tl.arange(0, K), o)


@triton.jit
def _final_norm(x_ptr, gain_ptr, out_ptr, N, BK: tl.constexpr):
    rstd = _rstd(x_ptr, N, BK)
    for k0 in range(0, N, BK):
        ks = k0 + tl.arange(0, BK)
        v = tl.load(x_ptr + ks, mask=ks < N, other=0.0) * rstd * tl.load(gain_ptr + ks, mask=ks < N, other=0.0).to(tl.float32)
        tl.store(out_ptr + ks, v.to(tl.bfloat16), mask=ks < N)


class W4(nn.Module):
    def __init__(self, lead: tuple, n: int, k: int, group: int):
        super().__init__()
        self.n, self.k, self.group = n, k, group
        self.register_buffer("qweight", torch.empty(*lead, n, k // 8, dtype=torch.int32))
        self.register_buffer("scales", torch.empty(*lead, n, k // group, dtype=torch.bfloat16))
        self.register_buffer("zeros", torch.empty(*lead, n, k // group, dtype=torch.bfloat16))

    def at(self, *index):
        return self.qweight[index], self.scales[index], self.zeros[index]


class ModelNew(nn.Module):
    def __init__(self, hidden: int, heads: int, head_dim: int, experts: int, top_k: int, moe_ffn: int,
                 kv_lora: int, group: int):
        super().__init__()
        H, K, n, L = heads, head_dim, KDA_LAYERS, KDA_LAYERS + 1
        self.hidden, self.heads, self.head_dim, self.experts, self.top_k = hidden, H, K, experts, top_k
        self.moe_ffn, self.kv_lora, self.group = moe_ffn, kv_lora, group

        def param(*size, dtype=torch.bfloat16):
            return nn.Parameter(torch.empty(*size, dtype=dtype))

        self.kda_norm = param(n, hidden)
        self.kda_in = W4((n,), 3 * H * K + 2 * K + H, hidden, group)
        self.conv_weight = param(n, 3 * H * K, 4)
        self.kda_f_b = W4((n,), H * K, K, group)
        self.A_log = param(n, H, dtype=torch.float32)
        self.dt_bias = param(n, H * K, dtype=torch.float32)
        self.kda_g_b = W4((n,), H * K, K, group)
        self.o_norm = param(n, K)
        self.kda_o = W4((n,), hidden, H * K, group)
        self.mla_norm = param(hidden)
        self.mla_q = W4((), H * K, hidden, group)
        self.mla_kv_a = W4((), kv_lora, hidden, group)
        self.kv_norm = param(kv_lora)
        self.mla_kv_b = W4((), 2 * H * K, kv_lora, group)
        self.mla_o = W4((), hidden, H * K, group)
        self.moe_norm = param(L, hidden)
        self.router = param(L, experts, hidden)
        self.router_bias = param(L, experts, dtype=torch.float32)
        self.expert_gate_up = W4((L, experts), 2 * moe_ffn, hidden, group)
        self.expert_down = W4((L, experts), hidden, moe_ffn, group)
        self.shared_gate_up = W4((L,), 2 * moe_ffn, hidden, group)
        self.shared_down = W4((L,), hidden, moe_ffn, group)
        self.final_norm = param(hidden)

    @staticmethod
    def tiles(dev, n, k):
        """GEMV tile: rows per program, columns per step (the interpreter pays per program and step, not per element)."""
        if dev.type == "cuda":
            return dict(BN=32, BK=128)
        return dict(BN=min(128, triton.next_power_of_2(n)), BK=min(256, triton.next_power_of_2(k)))

    def gemv(self, w4, index, x, gain=None, res=None):
        qw, s, z = w4.at(*index)
        t = self.tiles(x.device, w4.n, w4.k)
        y = torch.empty(w4.n, dtype=torch.float32, device=x.device)
        _gemv[(triton.cdiv(w4.n, t["BN"]),)](x, x if gain is None else gain, qw, s, z, x if res is None else res, y,
                                             w4.n, w4.k, NORM=gain is not None, RES=res is not None, GROUP=self.group, **t)
        return y

    def moe(self, i, h):
        dev, k, I = h.device, self.top_k, self.moe_ffn
        ids = torch.empty(k, dtype=torch.int32, device=dev)
        weights = torch.empty(k, dtype=torch.float32, device=dev)
        _router[(1,)](h, self.moe_norm[i], self.router[i], self.router_bias[i], ids, weights, self.experts, self.hidden,
                      ROUTED_SCALE, TOP_K=k, BT=triton.next_power_of_2(k), BE=triton.next_power_of_2(self.experts), BK=128)
        act = torch.empty(k, I, dtype=torch.float32, device=dev)
        shared_act = torch.empty(1, I, dtype=torch.float32, device=dev)
        t = self.tiles(dev, I, self.hidden)
        blocks = triton.cdiv(I, t["BN"])
        _swiglu[(blocks, k)](h, self.moe_norm[i], ids, *self.expert_gate_up.at(i), act, I, self.hidden, ROUTED=True,
                             GROUP=self.group, **t)
        _swiglu[(blocks, 1)](h, self.moe_norm[i], ids, *self.shared_gate_up.at(i), shared_act, I, self.hidden,
                             ROUTED=False, GROUP=self.group, **t)
        h = self.gemv(self.shared_down, (i,), shared_act, res=h)
        out = torch.empty_like(h)
        t = self.tiles(dev, self.hidden, I)
        _moe_down[(triton.cdiv(self.hidden, t["BN"]),)](act, ids, weights, *self.expert_down.at(i), h, out, self.hidden, I,
                                                        TOP_K=k, GROUP=self.group, **t)
        return out

    def kda(self, i, h, S, conv_state, S_out, column):
        H, K = self.heads, self.head_dim
        HK = H * K
        proj = self.gemv(self.kda_in, (i,), h, gain=self.kda_norm[i])
        fb = self.gemv(self.kda_f_b, (i,), proj[3 * HK:3 * HK + K])
        gb = self.gemv(self.kda_g_b, (i,), proj[3 * HK + K + H:])
        o = torch.empty(HK, dtype=torch.float32, device=h.device)
        _kda_head[(H,)](proj, conv_state, self.conv_weight[i], fb, gb, self.A_log[i], self.dt_bias[i], self.o_norm[i],
                        S, S_out, column, o, H, K=K, num_warps=8)
        return self.gemv(self.kda_o, (i,), o, res=h)

    def mla(self, h, latent_cache, latent):
        H, K, C, dev = self.heads, self.head_dim, self.kv_lora, h.device
        ctx = latent_cache.shape[0]
        BC = triton.next_power_of_2(C)
        q = self.gemv(self.mla_q, (), h, gain=self.mla_norm)
        new = torch.empty(C, dtype=torch.float32, device=dev)
        _latent[(1,)](self.gemv(self.mla_kv_a, (), h, gain=self.mla_norm), self.kv_norm, new, latent, C, BC=BC)
        q_lat = torch.empty(H, C, dtype=torch.float32, device=dev)
        _mla_absorb[(H, triton.cdiv(C, 128))](q, *self.mla_kv_b.at(), q_lat, C, K=K, GROUP=self.group, BC=128)
        split_len = BLOCK_KEYS * triton.cdiv(triton.cdiv(ctx + 1, MAX_SPLITS), BLOCK_KEYS)
        splits = triton.cdiv(ctx + 1, split_len)
        part_o = torch.empty(H, splits, C, dtype=torch.float32, device=dev)
        part_ml = torch.empty(H, splits, 2, dtype=torch.float32, device=dev)
        _mla_attn[(H, splits)](q_lat, latent_cache, new, part_o, part_ml, ctx, split_len, splits, C, K ** -0.5,
                               BC=BC, BLOCK=BLOCK_KEYS, num_warps=8)
        o_lat = torch.empty(H, C, dtype=torch.float32, device=dev)
        o = torch.empty(H * K, dtype=torch.float32, device=dev)
        _mla_out[(H,)](part_o, part_ml, o_lat, *self.mla_kv_b.at(), o, splits, C, K=K, GROUP=self.group, BC=BC,
                       BS=triton.next_power_of_2(splits), BK=self.tiles(dev, K, C)["BK"], num_warps=8)
        return self.gemv(self.mla_o, (), o, res=h)

    def forward(self, x, kda_state, conv_state, latent_cache):
        dev = x.device
        S_out = torch.empty_like(kda_state)
        columns = torch.empty(KDA_LAYERS, 3 * self.heads * self.head_dim, dtype=torch.bfloat16, device=dev)
        latent = torch.empty(1, self.kv_lora, dtype=torch.bfloat16, device=dev)
        h = x.float().view(-1)
        for i in range(KDA_LAYERS):
            h = self.kda(i, h, kda_state[i], conv_state[i], S_out[i], columns[i])
            h = self.moe(i, h)
        h = self.moe(KDA_LAYERS, self.mla(h, latent_cache, latent))
        out = torch.empty(1, self.hidden, dtype=torch.bfloat16, device=dev)
        _final_norm[(1,)](h, self.final_norm, out, self.hidden, BK=128)
        return out, S_out, columns, latent
