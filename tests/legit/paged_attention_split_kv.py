"""Paged decode attention in Triton, flash-decoding style: the pages of each sequence are split across programs
(grid batch x heads x splits), each writes a partial output with its running max and sum, and a second kernel
merges the splits (two launches per call; more parallelism for few long sequences).

Problem: hard/paged_attention
"""
import math

import torch
import torch.nn as nn
import triton
import triton.language as tl

SPLITS = 4


@triton.jit
def _partial(q_ptr, k_ptr, v_ptr, bt_ptr, len_ptr, part_ptr, stat_ptr, scale, sqb, sqh, skp, sks, skh, sbt,
             GROUP: tl.constexpr, PAGE: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, SPLITS: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    split = tl.program_id(2)
    H = tl.num_programs(1)
    d = tl.arange(0, BD)
    slots = tl.arange(0, PAGE)
    q = tl.load(q_ptr + b * sqb + h * sqh + d, mask=d < D, other=0.0).to(tl.float32)
    n = tl.load(len_ptr + b)
    pages = (n + PAGE - 1) // PAGE
    per_split = (pages + SPLITS - 1) // SPLITS
    m = -float("inf")
    l = 0.0
    acc = tl.zeros((BD,), dtype=tl.float32)
    for p in range(split * per_split, tl.minimum((split + 1) * per_split, pages)):
        page = tl.load(bt_ptr + b * sbt + p).to(tl.int64)
        ok = (p * PAGE + slots) < n
        offs = page * skp + slots[:, None] * sks + (h // GROUP) * skh + d[None, :]
        mask = ok[:, None] & (d[None, :] < D)
        k = tl.load(k_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        s = tl.where(ok, tl.sum(k * q[None, :], axis=1) * scale, -float("inf"))
        m_new = tl.maximum(m, tl.max(s, axis=0))
        w = tl.exp(s - m_new)
        alpha = tl.exp(m - m_new)
        l = l * alpha + tl.sum(w, axis=0)
        acc = acc * alpha + tl.sum(w[:, None] * v, axis=0)
        m = m_new
    row = (b * H + h) * SPLITS + split
    tl.store(part_ptr + row * BD + d, acc)
    tl.store(stat_ptr + row * 2, m)
    tl.store(stat_ptr + row * 2 + 1, l)


@triton.jit
def _merge(part_ptr, stat_ptr, o_ptr, sob, soh, D: tl.constexpr, BD: tl.constexpr, SPLITS: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    H = tl.num_programs(1)
    d = tl.arange(0, BD)
    rows = (b * H + h) * SPLITS + tl.arange(0, SPLITS)
    m = tl.load(stat_ptr + rows * 2)
    l = tl.load(stat_ptr + rows * 2 + 1)
    m_all = tl.max(m, axis=0)
    weight = tl.where(l > 0, tl.exp(m - m_all), 0.0)
    parts = tl.load(part_ptr + rows[:, None] * BD + d[None, :])
    out = tl.sum(parts * weight[:, None], axis=0) / tl.sum(l * weight, axis=0)
    tl.store(o_ptr + b * sob + h * soh + d, out.to(tl.bfloat16), mask=d < D)


class ModelNew(nn.Module):
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, page_size: int):
        super().__init__()
        self.group, self.page_size, self.scale = num_heads // num_kv_heads, page_size, 1.0 / math.sqrt(head_dim)

    def forward(self, q, k_cache, v_cache, block_table, seq_lens):
        q, k_cache, v_cache = q.contiguous(), k_cache.contiguous(), v_cache.contiguous()
        block_table, seq_lens = block_table.contiguous(), seq_lens.contiguous()
        B, H, D = q.shape
        BD = triton.next_power_of_2(D)
        parts = torch.empty(B * H * SPLITS, BD, dtype=torch.float32, device=q.device)
        stats = torch.empty(B * H * SPLITS, 2, dtype=torch.float32, device=q.device)
        out = torch.empty_like(q)
        _partial[(B, H, SPLITS)](q, k_cache, v_cache, block_table, seq_lens, parts, stats, self.scale, q.stride(0), q.stride(1),
                                 k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_table.stride(0),
                                 GROUP=self.group, PAGE=self.page_size, D=D, BD=BD, SPLITS=SPLITS)
        _merge[(B, H)](parts, stats, out, out.stride(0), out.stride(1), D=D, BD=BD, SPLITS=SPLITS)
        return out
