"""The tiny transformer of model.py with a routed mixture-of-experts FFN (generator only).

Each block's FFN becomes `experts` small GELU FFNs behind a linear router, top-k routing without
capacity limits (dropless, as Megablocks and DeepSeek-MoE), Switch-style gating for top-1 (the
expert output is scaled by its router probability) and Mixtral-style renormalised gates for
top-k > 1. Each layer keeps the Switch Transformer load-balancing loss

    aux = E * sum_i f_i * P_i      (f_i: share of routed tokens, P_i: mean router probability)

which is 1.0 when the load is uniform and approaches E when every token goes to one expert; the trainer
adds coefficient * sum over layers to the LM loss. The experts run densely on every token and
are masked afterwards: wasteful, but exact and cheap at this size.
"""

from __future__ import annotations

import torch
from model import Block, TinyLM, token_std
from torch import nn


class MoEFFN(nn.Module):
    def __init__(self, d: int, experts: int, top_k: int, hidden: int):
        super().__init__()
        self.experts, self.top_k = experts, top_k
        self.router = nn.Linear(d, experts, bias=False)
        self.w1 = nn.Parameter(torch.randn(experts, d, hidden) * d**-0.5)
        self.b1 = nn.Parameter(torch.zeros(experts, hidden))
        self.w2 = nn.Parameter(torch.randn(experts, hidden, d) * hidden**-0.5)
        self.b2 = nn.Parameter(torch.zeros(experts, d))
        # DeepSeek-V3's aux-loss-free balancing: a per-expert bias that only steers the top-k choice
        self.register_buffer("bias", torch.zeros(experts))
        self.aux = torch.zeros(())
        self.load = torch.zeros(experts)
        self.entropy = 0.0

    @torch.no_grad()
    def update_bias(self, rate: float) -> None:
        """After each step: raise underloaded experts' bias by `rate`, lower overloaded ones'."""
        self.bias += rate * torch.sign(self.load.mean() - self.load)

    def forward(self, h: torch.Tensor) -> torch.Tensor:  # h: (tokens, d)
        probs = self.router(h).float().softmax(-1)
        top_i = (probs.detach() + self.bias).topk(self.top_k, dim=-1).indices
        top_p = probs.gather(1, top_i)
        gates = top_p if self.top_k == 1 else top_p / top_p.sum(-1, keepdim=True)
        combine = torch.zeros_like(probs).scatter(1, top_i, gates).to(h.dtype)
        routed = torch.zeros_like(probs).scatter(1, top_i, 1.0)
        a = nn.functional.gelu(torch.einsum("nd,edh->enh", h, self.w1) + self.b1[:, None])
        y = torch.einsum("enh,ehd->end", a, self.w2) + self.b2[:, None]
        load = routed.sum(0)  # tokens (assignments) per expert
        share = load / load.sum()
        self.aux = self.experts * (share.detach() * probs.mean(0)).sum()
        self.load = load.detach()
        self.entropy = float(-(probs * probs.clamp_min(1e-12).log()).sum(-1).mean().detach())
        return torch.einsum("ne,end->nd", combine, y)


class MoEBlock(Block):
    def __init__(self, d: int, heads: int, experts: int, top_k: int, hidden: int):
        super().__init__(d, heads)
        del self.fc1, self.fc2
        self.moe = MoEFFN(d, experts, top_k, hidden)

    def ffn(self, x: torch.Tensor, stats: dict, i: int) -> torch.Tensor:
        b, t, d = x.shape
        h = self.ln2(x)
        stats[f"ffn_input_std/layer_{i}"] = token_std(h)
        return x + self.moe(h.reshape(b * t, d)).view(b, t, d)


class MoETinyLM(TinyLM):
    def __init__(
        self,
        d: int = 32,
        experts: int = 8,
        top_k: int = 1,
        hidden: int | None = None,
        layers: int = 2,
        vocab: int = 32,
    ):
        super().__init__(d=d, layers=layers, vocab=vocab)
        hidden = hidden or 2 * d
        self.blocks = nn.ModuleList(MoEBlock(d, blk.heads, experts, top_k, hidden) for blk in self.blocks)

    def moe_layers(self) -> list[MoEFFN]:
        return [blk.moe for blk in self.blocks]

    def aux_loss(self) -> torch.Tensor:
        return sum(m.aux for m in self.moe_layers())

    def router_parameters(self) -> list[nn.Parameter]:
        return [m.router.weight for m in self.moe_layers()]
