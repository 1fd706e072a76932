"""NOT a megakernel: the baseline's ~20 kernels per layer captured once into a CUDA graph and replayed.

This is what the anchor's audit found behind most "megakernels". It is correct and fast, and the launch
gate fails it: the profiler counts every kernel inside a graph replay. The graph is keyed on the input
pointers (a replay reads whatever those tensors hold now) and the outputs are cloned, so each call is a
pure function of its inputs. On the CPU, where there are no graphs, the step runs eagerly.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EPS = 1e-6
ROPE_THETA = 1.0e6


class ModelNew(nn.Module):
    def __init__(self, layers: int, hidden: int, heads: int, kv_heads: int, head_dim: int, ffn: int):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim

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
        self.graphs = {}

    def step(self, x, k_cache, v_cache):
        H, G, D = self.heads, self.kv_heads, self.head_dim
        L, ctx, hidden = k_cache.shape[0], k_cache.shape[2], x.shape[-1]
        half = D // 2
        angle = ctx * ROPE_THETA ** (-torch.arange(half, dtype=torch.float32, device=x.device) * 2 / D)
        cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)

        def rope(t):
            return torch.cat([t[..., :half] * cos - t[..., half:] * sin, t[..., half:] * cos + t[..., :half] * sin], -1)

        h, k_new, v_new = x, [], []
        for l in range(L):
            q, k, v = F.linear(F.rms_norm(h, (hidden,), self.attn_norm[l], EPS), self.wqkv[l]).view(-1, D).split([H, G, G])
            q = rope(F.rms_norm(q, (D,), self.q_norm[l], EPS)).view(G, H // G, D) * D ** -0.5
            k = rope(F.rms_norm(k, (D,), self.k_norm[l], EPS))
            logits = torch.cat([q @ k_cache[l].transpose(1, 2), (q * k[:, None]).sum(-1, keepdim=True)], -1)
            p = logits.float().softmax(-1).to(x.dtype)
            o = p[..., :ctx] @ v_cache[l] + p[..., ctx:] * v[:, None]
            h = h + F.linear(o.view(1, H * D), self.wo[l])
            gate, up = F.linear(F.rms_norm(h, (hidden,), self.mlp_norm[l], EPS), self.w_gate_up[l]).chunk(2, -1)
            h = h + F.linear(F.silu(gate) * up, self.w_down[l])
            k_new.append(k)
            v_new.append(v)
        return F.rms_norm(h, (hidden,), self.final_norm, EPS), torch.stack(k_new), torch.stack(v_new)

    def forward(self, x, k_cache, v_cache):
        if not x.is_cuda:
            return self.step(x, k_cache, v_cache)
        key = tuple((t.data_ptr(), tuple(t.shape)) for t in (x, k_cache, v_cache))
        if key not in self.graphs:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self.step(x, k_cache, v_cache)  # warm-up outside the capture
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                outputs = self.step(x, k_cache, v_cache)
            self.graphs[key] = (graph, outputs)
        graph, outputs = self.graphs[key]
        graph.replay()
        return tuple(o.clone() for o in outputs)
