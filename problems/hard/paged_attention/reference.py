"""Single-token decode attention over a paged KV cache (grouped-query attention).

For every sequence b and query head h (kv head g = h // (num_heads // num_kv_heads)):

    K_b, V_b = the first seq_lens[b] cached tokens of sequence b, gathered page by page:
               token t lives in page block_table[b, t // page_size], slot t % page_size
    out[b, h] = softmax(q[b, h] . K_b[:, g]^T * head_dim**-0.5) @ V_b[:, g]

* ``q``           (batch, num_heads, head_dim) bfloat16    one new query token per sequence
* ``k_cache``     (num_pages, page_size, num_kv_heads, head_dim) bfloat16
* ``v_cache``     (num_pages, page_size, num_kv_heads, head_dim) bfloat16
* ``block_table`` (batch, max_pages_per_seq) int32   page ids; entries past a sequence's last page are
                                                      arbitrary valid page ids and must be ignored
* ``seq_lens``    (batch,) int32                      tokens cached for each sequence (>= 1)
* output          (batch, num_heads, head_dim) bfloat16

Scores, softmax and the weighted sum are computed in float32; the result is rounded to bf16.
"""
import math

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, page_size: int):
        super().__init__()
        assert num_heads % num_kv_heads == 0
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.head_dim, self.page_size = head_dim, page_size
        self.scale = 1.0 / math.sqrt(head_dim)

    def forward(self, q, k_cache, v_cache, block_table, seq_lens):
        batch = q.shape[0]
        group = self.num_heads // self.num_kv_heads
        out = torch.empty_like(q)
        for b in range(batch):
            n = int(seq_lens[b])
            pages = block_table[b, : (n + self.page_size - 1) // self.page_size].long()
            k = k_cache[pages].flatten(0, 1)[:n].float()          # (n, num_kv_heads, head_dim)
            v = v_cache[pages].flatten(0, 1)[:n].float()
            k = k.repeat_interleave(group, dim=1)                  # (n, num_heads, head_dim)
            v = v.repeat_interleave(group, dim=1)
            scores = torch.einsum("hd,nhd->hn", q[b].float(), k) * self.scale
            probs = torch.softmax(scores, dim=-1)
            out[b] = torch.einsum("hn,nhd->hd", probs, v).to(q.dtype)
        return out


def get_init_inputs(shape: dict) -> list:
    return [shape["num_heads"], shape["num_kv_heads"], shape["head_dim"], shape["page_size"]]


def get_inputs(shape: dict, device: torch.device) -> list:
    B, H, Hkv, D = shape["batch"], shape["num_heads"], shape["num_kv_heads"], shape["head_dim"]
    L, P = shape["seq_len"], shape["page_size"]

    # Ragged lengths around seq_len whose total is exactly batch*seq_len (pairs of +d / -d, d spread
    # evenly up to L/4), so the formulas in problem.yaml stay exact while every sequence ends somewhere
    # different. Every seed draws the same lengths, only which sequence gets which: the longest one
    # sets a decode kernel's time, and timed calls run on freshly drawn inputs (a drawn maximum moved
    # the scored median of batch 4 by 6% against one fixed draw on the H200).
    pairs = B // 2
    half = torch.tensor([round((i + 1) * (L // 4) / pairs) for i in range(pairs)], dtype=torch.long)
    offsets = torch.cat([half, -half, torch.zeros(B % 2, dtype=torch.long)])
    seq_lens = (L + offsets[torch.randperm(B)]).clamp_min(1).to(torch.int32)

    # Tensor shapes depend on the shape dict only (not on the drawn lengths), so every seed gives
    # inputs of the same sizes: room for the longest possible sequence in the block table, and a
    # pool with enough pages for any draw plus a few that nobody owns.
    pages_per_seq = (seq_lens + P - 1) // P
    max_pages = (L + L // 4 + P - 1) // P
    num_pages = (B * L + P - 1) // P + B + 8             # >= sum(pages_per_seq) for every draw
    perm = torch.randperm(num_pages)                      # pages are scattered through the pool
    block_table = torch.randint(0, num_pages, (B, max_pages), dtype=torch.int32)   # junk padding
    cursor = 0
    for b in range(B):
        n_p = int(pages_per_seq[b])
        block_table[b, :n_p] = perm[cursor: cursor + n_p].to(torch.int32)
        cursor += n_p

    # q is scaled so scores have a std of ~2: attention is peaked enough that the output is far
    # from the mean of V (which would be close to zero and insensitive to the scores).
    q = (2.0 * torch.randn(B, H, D, device=device)).to(torch.bfloat16)
    k_cache = torch.randn(num_pages, P, Hkv, D, device=device).to(torch.bfloat16)
    v_cache = torch.randn(num_pages, P, Hkv, D, device=device).to(torch.bfloat16)
    return [q, k_cache, v_cache, block_table.to(device), seq_lens.to(device)]
