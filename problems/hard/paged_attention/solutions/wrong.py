"""Deliberately wrong first attempt: maps query heads to kv heads round-robin (h % num_kv_heads)
instead of in contiguous groups (h // group).

Paged decode attention in Triton: one program per (sequence, query head), online softmax over pages."""
import math

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _paged_decode_kernel(
    q_ptr, k_ptr, v_ptr, bt_ptr, len_ptr, o_ptr,
    scale,
    stride_qb, stride_qh,
    stride_kp, stride_ks, stride_kh,
    stride_bt,
    stride_ob, stride_oh,
    GROUP: tl.constexpr, NUM_KV: tl.constexpr, PAGE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    kvh = h % NUM_KV  # BUG: grouped-query heads share kv head h // GROUP

    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    slots = tl.arange(0, PAGE)

    q = tl.load(q_ptr + b * stride_qb + h * stride_qh + d, mask=d_ok, other=0.0).to(tl.float32)
    n = tl.load(len_ptr + b)
    n_pages = (n + PAGE - 1) // PAGE

    m = -float("inf")
    l = 0.0
    acc = tl.zeros((BLOCK_D,), dtype=tl.float32)
    for p in range(0, n_pages):
        page = tl.load(bt_ptr + b * stride_bt + p).to(tl.int64)
        tok_ok = (p * PAGE + slots) < n
        offs = page * stride_kp + slots[:, None] * stride_ks + kvh * stride_kh + d[None, :]
        kv_mask = tok_ok[:, None] & d_ok[None, :]
        k = tl.load(k_ptr + offs, mask=kv_mask, other=0.0).to(tl.float32)      # (PAGE, D)
        v = tl.load(v_ptr + offs, mask=kv_mask, other=0.0).to(tl.float32)
        s = tl.sum(k * q[None, :], axis=1) * scale                              # (PAGE,)
        s = tl.where(tok_ok, s, -float("inf"))
        m_new = tl.maximum(m, tl.max(s, axis=0))
        alpha = tl.exp(m - m_new)
        w = tl.exp(s - m_new)
        l = l * alpha + tl.sum(w, axis=0)
        acc = acc * alpha + tl.sum(w[:, None] * v, axis=0)
        m = m_new
    out = acc / l
    tl.store(o_ptr + b * stride_ob + h * stride_oh + d, out.to(tl.bfloat16), mask=d_ok)


class ModelNew(nn.Module):
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, page_size: int):
        super().__init__()
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.head_dim, self.page_size = head_dim, page_size
        self.scale = 1.0 / math.sqrt(head_dim)

    def forward(self, q, k_cache, v_cache, block_table, seq_lens):
        q = q.contiguous()
        k_cache = k_cache.contiguous()
        v_cache = v_cache.contiguous()
        block_table = block_table.contiguous()
        seq_lens = seq_lens.contiguous()
        B, H, D = q.shape
        out = torch.empty_like(q)
        _paged_decode_kernel[(B, H)](
            q, k_cache, v_cache, block_table, seq_lens, out,
            self.scale,
            q.stride(0), q.stride(1),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            block_table.stride(0),
            out.stride(0), out.stride(1),
            GROUP=H // self.num_kv_heads, NUM_KV=self.num_kv_heads, PAGE=self.page_size, HEAD_DIM=D,
            BLOCK_D=triton.next_power_of_2(D), num_warps=4,
        )
        return out
