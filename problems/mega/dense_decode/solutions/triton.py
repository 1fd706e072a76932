"""The whole decode step as ONE Triton launch: a persistent megakernel with a task queue.

The step is a list of tasks in dependency order: copy x in, then per layer six phases (q/k/v heads with
norm and rope; attention splits over the cache; split combine per head; o-proj rows + residual; gate/up
rows + SiLU; down rows + residual), then the final norm. Every program of the one launch (one per SM)
takes task numbers from an atomic ticket counter and, before a task, spins until the previous phase's
completion counter says all its tasks are done. A task only waits on lower-numbered tasks, which programs
already running hold, so the queue cannot deadlock however many programs are resident; with one program it
degenerates to running the tasks in order (which is what Triton's CPU interpreter does).

Synchronisation: a CTA barrier then a release atomic after each task; an acquire load before; scratch
written inside the launch is read with ``.cg`` loads (from L2, never a stale L1 line). The last program to
leave resets the counters, so every launch (and every CUDA-graph replay) starts from zero. Scratch is
float32; the only roundings are the bf16 outputs, as in the reference. It runs the problem's full shapes (one
launch of one program per SM); speed was not its goal: phases are GEMV tiles with no pipelining across them.
"""
import math

import torch
import torch.nn as nn
import triton
import triton.language as tl

ROPE_THETA = 1.0e6
PHASES = tl.constexpr(6)  # per layer: qkv, attention, combine, o-proj, gate/up, down
BK, BN = 128, 64  # K chunk of the GEMVs, keys per attention block
MAX_SPLITS = 64


@triton.jit
def _wait(counter, target):
    while tl.atomic_add(counter, 0, sem="acquire") < target:
        pass


@triton.jit
def _rstd(x_ptr, N: tl.constexpr, BK: tl.constexpr):
    acc = tl.zeros((BK,), tl.float32)
    for k0 in range(0, N, BK):
        ks = k0 + tl.arange(0, BK)
        v = tl.load(x_ptr + ks, mask=ks < N, other=0.0, cache_modifier=".cg")
        acc += v * v
    return tl.rsqrt(tl.sum(acc, 0) / N + 1e-6)


@triton.jit
def _matvec(w_ptr, row0, nrows, x_ptr, K: tl.constexpr, gain_ptr, rstd, NORM: tl.constexpr,
            ROWS: tl.constexpr, BK: tl.constexpr):
    """W[row0:row0+ROWS] @ v for a float32 scratch vector v (times rstd * gain when NORM)."""
    rows = row0 + tl.arange(0, ROWS)
    acc = tl.zeros((ROWS, BK), tl.float32)
    for k0 in range(0, K, BK):
        ks = k0 + tl.arange(0, BK)
        km = ks < K
        v = tl.load(x_ptr + ks, mask=km, other=0.0, cache_modifier=".cg")
        if NORM:
            v = v * rstd * tl.load(gain_ptr + ks, mask=km, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + rows[:, None].to(tl.int64) * K + ks[None, :],
                    mask=(rows < nrows)[:, None] & km[None, :], other=0.0)
        acc += w.to(tl.float32) * v[None, :]
    return tl.sum(acc, 1)


@triton.jit
def _tasks_in(gp, NG: tl.constexpr, n_qkv, n_att, n_cmb, n_o, n_gu):
    """Number of tasks of global phase gp (0: copy-in, NG-1: final norm, else layer phases)."""
    p = (gp + PHASES - 1) % PHASES
    n = tl.where(p == 0, n_qkv, tl.where(p == 1, n_att, tl.where(p == 2, n_cmb,
        tl.where(p == 3, n_o, tl.where(p == 4, n_gu, n_o)))))
    return tl.where((gp == 0) | (gp == NG - 1), 1, n)


@triton.jit(do_not_specialize=["ctx", "splits", "split_len", "programs"])
def _decode_step(
    x_ptr, kc_ptr, vc_ptr,
    attn_norm_ptr, wqkv_ptr, q_norm_ptr, k_norm_ptr, wo_ptr, mlp_norm_ptr, wgu_ptr, wdown_ptr, final_norm_ptr,
    out_ptr, knew_ptr, vnew_ptr,
    resid_ptr, q_ptr, part_o_ptr, part_ml_ptr, attn_ptr, act_ptr, sync_ptr,
    ctx, splits, split_len, programs, log2_theta, sm_scale,
    L: tl.constexpr, HID: tl.constexpr, H: tl.constexpr, KVH: tl.constexpr, D: tl.constexpr, HALF: tl.constexpr,
    FFN: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr, BN: tl.constexpr, BS: tl.constexpr, NSYNC: tl.constexpr,
):
    NG = PHASES * L + 2
    n_qkv = H + 2 * KVH
    n_o = (HID + BR - 1) // BR
    n_gu = (FFN + BR - 1) // BR
    n_att = H * splits
    b1 = n_qkv
    b2 = b1 + n_att
    b3 = b2 + H
    b4 = b3 + n_o
    b5 = b4 + n_gu
    per_layer = b5 + n_o
    total = 2 + L * per_layer
    d = tl.arange(0, D)
    half = tl.arange(0, HALF)

    t = tl.atomic_add(sync_ptr, 1)
    while t < total:
        is_init = t == 0
        is_final = t == total - 1
        r = tl.maximum(t - 1, 0)
        l = tl.minimum(r // per_layer, L - 1)
        rr = r - l * per_layer
        p = (rr >= b1).to(tl.int32) + (rr >= b2).to(tl.int32) + (rr >= b3).to(tl.int32) \
            + (rr >= b4).to(tl.int32) + (rr >= b5).to(tl.int32)
        j = rr - tl.where(p == 0, 0, tl.where(p == 1, b1, tl.where(p == 2, b2,
                 tl.where(p == 3, b3, tl.where(p == 4, b4, b5)))))
        gp = tl.where(is_init, 0, tl.where(is_final, NG - 1, 1 + PHASES * l + p))
        if gp > 0:
            _wait(sync_ptr + 2 + gp - 1, _tasks_in(gp - 1, NG, n_qkv, n_att, H, n_o, n_gu))
        h_in = resid_ptr + 2 * l * HID          # layer input, after attention, after MLP: 3 rows of HID
        h_mid = h_in + HID
        h_out = h_mid + HID
        lw = l.to(tl.int64)

        if is_init:
            for k0 in range(0, HID, BK):
                ks = k0 + tl.arange(0, BK)
                tl.store(resid_ptr + ks, tl.load(x_ptr + ks, mask=ks < HID, other=0.0).to(tl.float32), mask=ks < HID)
        elif is_final:
            last = resid_ptr + 2 * L * HID
            rstd = _rstd(last, HID, BK)
            for k0 in range(0, HID, BK):
                ks = k0 + tl.arange(0, BK)
                v = tl.load(last + ks, mask=ks < HID, other=0.0, cache_modifier=".cg")
                g = tl.load(final_norm_ptr + ks, mask=ks < HID, other=0.0).to(tl.float32)
                tl.store(out_ptr + ks, (v * rstd * g).to(tl.bfloat16), mask=ks < HID)
        elif p == 0:  # one q, k or v head: norm, projection (two halves, for rope), head norm, rope
            rstd = _rstd(h_in, HID, BK)
            w = wqkv_ptr + lw * (n_qkv * D * HID)
            gain = attn_norm_ptr + l * HID
            lo = _matvec(w, j * D, n_qkv * D, h_in, HID, gain, rstd, True, HALF, BK)
            hi = _matvec(w, j * D + HALF, n_qkv * D, h_in, HID, gain, rstd, True, HALF, BK)
            if j < H + KVH:
                r_head = tl.rsqrt((tl.sum(lo * lo, 0) + tl.sum(hi * hi, 0)) / D + 1e-6)
                head_gain = tl.where(j < H, q_norm_ptr, k_norm_ptr) + l * D
                lo = lo * r_head * tl.load(head_gain + half).to(tl.float32)
                hi = hi * r_head * tl.load(head_gain + HALF + half).to(tl.float32)
                angle = ctx * tl.exp2(-(2.0 * half / D) * log2_theta)
                c = tl.cos(angle)
                s = tl.sin(angle)
                rot_lo = lo * c - hi * s
                rot_hi = hi * c + lo * s
                if j < H:
                    q_row = q_ptr + (l * H + j) * D
                    tl.store(q_row + half, rot_lo)
                    tl.store(q_row + HALF + half, rot_hi)
                else:
                    k_row = knew_ptr + (l * KVH + j - H) * D
                    tl.store(k_row + half, rot_lo.to(tl.bfloat16))
                    tl.store(k_row + HALF + half, rot_hi.to(tl.bfloat16))
            else:
                v_row = vnew_ptr + (l * KVH + j - H - KVH) * D
                tl.store(v_row + half, lo.to(tl.bfloat16))
                tl.store(v_row + HALF + half, hi.to(tl.bfloat16))
        elif p == 1:  # online-softmax attention of one head over one split of the ctx + 1 keys
            h = j // splits
            sp = j - h * splits
            g = h // (H // KVH)
            q = tl.load(q_ptr + (l * H + h) * D + d, cache_modifier=".cg")
            row = (lw * KVH + g) * ctx * D
            new_row = (l * KVH + g) * D
            start = sp * split_len
            end = tl.minimum(start + split_len, ctx + 1)
            m_i = tl.max(tl.full((BN,), -1.0e30, tl.float32), 0)
            l_i = tl.sum(tl.zeros((BN,), tl.float32), 0)
            acc = tl.zeros((D,), tl.float32)
            for n0 in range(start, end, BN):
                pos = n0 + tl.arange(0, BN)
                valid = pos < end
                cached = (valid & (pos < ctx))[:, None]
                new = (valid & (pos == ctx))[:, None]
                offs = pos[:, None].to(tl.int64) * D + d[None, :]
                k = tl.load(kc_ptr + row + offs, mask=cached, other=0.0).to(tl.float32) \
                    + tl.load(knew_ptr + new_row + d[None, :] + 0 * pos[:, None], mask=new, other=0.0,
                              cache_modifier=".cg").to(tl.float32)
                score = tl.where(valid, tl.sum(k * q[None, :], 1) * sm_scale, -float("inf"))
                m_new = tl.maximum(m_i, tl.max(score, 0))
                alpha = tl.exp(m_i - m_new)
                prob = tl.exp(score - m_new)
                v = tl.load(vc_ptr + row + offs, mask=cached, other=0.0).to(tl.float32) \
                    + tl.load(vnew_ptr + new_row + d[None, :] + 0 * pos[:, None], mask=new, other=0.0,
                              cache_modifier=".cg").to(tl.float32)
                l_i = l_i * alpha + tl.sum(prob, 0)
                acc = acc * alpha + tl.sum(prob[:, None] * v, 0)
                m_i = m_new
            slot = (l * H + h) * splits + sp
            tl.store(part_o_ptr + slot * D + d, acc)
            tl.store(part_ml_ptr + 2 * slot, m_i)
            tl.store(part_ml_ptr + 2 * slot + 1, l_i)
        elif p == 2:  # merge the splits of head j
            ss = tl.arange(0, BS)
            sm = ss < splits
            slot = (l * H + j) * splits + ss
            m_s = tl.load(part_ml_ptr + 2 * slot, mask=sm, other=-1.0e30, cache_modifier=".cg")
            l_s = tl.load(part_ml_ptr + 2 * slot + 1, mask=sm, other=0.0, cache_modifier=".cg")
            weight = tl.exp(m_s - tl.max(m_s, 0))
            o_s = tl.load(part_o_ptr + slot[:, None] * D + d[None, :], mask=sm[:, None], other=0.0,
                          cache_modifier=".cg")
            o = tl.sum(weight[:, None] * o_s, 0) / tl.sum(weight * l_s, 0)
            tl.store(attn_ptr + (l * H + j) * D + d, o)
        elif p == 3:  # o-proj rows + residual
            rows = j * BR + tl.arange(0, BR)
            acc = _matvec(wo_ptr + lw * (HID * H * D), j * BR, HID, attn_ptr + l * H * D, H * D,
                          attn_ptr, 1.0, False, BR, BK)
            res = tl.load(h_in + rows, mask=rows < HID, other=0.0, cache_modifier=".cg")
            tl.store(h_mid + rows, res + acc, mask=rows < HID)
        elif p == 4:  # gate/up rows + SiLU(gate) * up
            rows = j * BR + tl.arange(0, BR)
            rstd = _rstd(h_mid, HID, BK)
            w = wgu_ptr + lw * (2 * FFN * HID)
            gain = mlp_norm_ptr + l * HID
            gate = _matvec(w, j * BR, FFN, h_mid, HID, gain, rstd, True, BR, BK)
            up = _matvec(w + FFN * HID, j * BR, FFN, h_mid, HID, gain, rstd, True, BR, BK)
            tl.store(act_ptr + l * FFN + rows, gate / (1.0 + tl.exp(-gate)) * up, mask=rows < FFN)
        else:  # down rows + residual
            rows = j * BR + tl.arange(0, BR)
            acc = _matvec(wdown_ptr + lw * (HID * FFN), j * BR, HID, act_ptr + l * FFN, FFN,
                          act_ptr, 1.0, False, BR, BK)
            res = tl.load(h_mid + rows, mask=rows < HID, other=0.0, cache_modifier=".cg")
            tl.store(h_out + rows, res + acc, mask=rows < HID)

        tl.debug_barrier()
        tl.atomic_add(sync_ptr + 2 + gp, 1, sem="release")
        t = tl.atomic_add(sync_ptr, 1)

    # leave; the last program out zeroes the ticket, exit and phase counters for the next launch
    if tl.atomic_add(sync_ptr + 1, 1) == programs - 1:
        offs = tl.arange(0, NSYNC)
        tl.store(sync_ptr + offs, tl.zeros((NSYNC,), tl.int32), mask=offs < 2 + NG)


class ModelNew(nn.Module):
    def __init__(self, layers: int, hidden: int, heads: int, kv_heads: int, head_dim: int, ffn: int):
        super().__init__()
        self.cfg = dict(L=layers, HID=hidden, H=heads, KVH=kv_heads, D=head_dim, FFN=ffn)

        def param(*size):
            return nn.Parameter(torch.empty(*size, dtype=torch.bfloat16))

        self.attn_norm = param(layers, hidden)
        self.wqkv = param(layers, (heads + 2 * kv_heads) * head_dim, hidden)
        self.q_norm = param(layers, head_dim)
        self.k_norm = param(layers, head_dim)
        self.wo = param(layers, hidden, heads * head_dim)
        self.mlp_norm = param(layers, hidden)
        self.w_gate_up = param(layers, 2 * ffn, hidden)
        self.w_down = param(layers, hidden, ffn)
        self.final_norm = param(hidden)
        self.nsync = triton.next_power_of_2(2 + PHASES.value * layers + 2)
        self.register_buffer("sync", torch.zeros(self.nsync, dtype=torch.int32), persistent=False)

    def forward(self, x, k_cache, v_cache):
        c = self.cfg
        L, H, KVH, D, HID, FFN = c["L"], c["H"], c["KVH"], c["D"], c["HID"], c["FFN"]
        ctx = k_cache.shape[2]
        dev = x.device
        on_gpu = dev.type == "cuda"
        sms = torch.cuda.get_device_properties(dev).multi_processor_count if on_gpu else 2
        BR = 16 if on_gpu else 64  # GEMV rows per task (the interpreter pays per task, not per element)
        # enough (head, split) attention tasks to cover every SM twice, each split a whole number of blocks
        target = min(MAX_SPLITS, max(2, triton.cdiv(2 * sms, H)), triton.cdiv(ctx + 1, BN))
        split_len = BN * triton.cdiv(triton.cdiv(ctx + 1, target), BN)
        splits = triton.cdiv(ctx + 1, split_len)
        f32 = dict(dtype=torch.float32, device=dev)
        out = torch.empty(1, HID, dtype=torch.bfloat16, device=dev)
        k_new = torch.empty(L, KVH, D, dtype=torch.bfloat16, device=dev)
        v_new = torch.empty(L, KVH, D, dtype=torch.bfloat16, device=dev)
        resid = torch.empty(2 * L + 1, HID, **f32)
        q = torch.empty(L, H, D, **f32)
        part_o = torch.empty(L, H, splits, D, **f32)
        part_ml = torch.empty(L, H, splits, 2, **f32)
        attn = torch.empty(L, H * D, **f32)
        act = torch.empty(L, FFN, **f32)
        per_layer = H + 2 * KVH + H * splits + H + 2 * triton.cdiv(HID, BR) + triton.cdiv(FFN, BR)
        programs = min(sms, 2 + L * per_layer)
        _decode_step[(programs,)](
            x.contiguous(), k_cache.contiguous(), v_cache.contiguous(),
            self.attn_norm, self.wqkv, self.q_norm, self.k_norm, self.wo, self.mlp_norm, self.w_gate_up,
            self.w_down, self.final_norm,
            out, k_new, v_new, resid, q, part_o, part_ml, attn, act, self.sync,
            ctx, splits, split_len, programs, math.log2(ROPE_THETA), D ** -0.5,
            L=L, HID=HID, H=H, KVH=KVH, D=D, HALF=D // 2, FFN=FFN, BR=BR, BK=BK, BN=BN,
            BS=triton.next_power_of_2(splits), NSYNC=self.nsync, num_warps=8,
        )
        return out, k_new, v_new
