"""Wrong on purpose: a rank-symmetric shortcut. It assumes every rank's experts equal this rank's, so expert
e runs here with local expert e % experts_per_rank and no data moves. Exact at world size 1 only."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, experts_per_rank: int, hidden: int):
        super().__init__()
        self.experts_per_rank = experts_per_rank
        self.expert_scale = nn.Parameter(torch.empty(experts_per_rank, hidden, dtype=torch.bfloat16))

    def forward(self, x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        amax = x.float().abs().amax(dim=-1, keepdim=True)
        _, exponent = torch.frexp(amax)
        scale = torch.ldexp(torch.ones_like(amax), exponent - 8)
        deq = (x.float() / scale).to(torch.float8_e4m3fn).float() * scale
        y = (deq[:, None, :] * self.expert_scale[expert_ids % self.experts_per_rank].float()).to(torch.bfloat16)
        return (y.float() * weights[..., None]).sum(1).to(torch.bfloat16)
