"""A tiny decoder-only transformer and the synthetic language it learns (generator only).

The model computes attention by hand so that each forward pass can report what the guides'
detectors watch: attention entropy, the LayerNorm input std and the FFN input/activation
statistics per layer. Torch is needed only to regenerate the corpus, never by the workbench.
"""

from __future__ import annotations

import math

import torch
from torch import nn

VOCAB, SEQ, D_MODEL, HEADS, LAYERS = 32, 32, 32, 2, 2


def make_language(seed: int, vocab: int = VOCAB) -> torch.Tensor:
    """A sparse Markov chain: each token has three likely successors (entropy ~1.1 nats)."""
    g = torch.Generator().manual_seed(seed)
    probs = torch.full((vocab, vocab), 0.02 / vocab)
    for t in range(vocab):
        nxt = torch.randperm(vocab, generator=g)[:3]
        probs[t, nxt] += torch.tensor([0.6, 0.25, 0.13])
    return probs / probs.sum(1, keepdim=True)


def sample_sequences(chain: torch.Tensor, n: int, seed: int, seq: int = SEQ) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    out = torch.empty(n, seq + 1, dtype=torch.long)
    out[:, 0] = torch.randint(0, chain.shape[0], (n,), generator=g)
    for i in range(1, seq + 1):
        out[:, i] = torch.multinomial(chain[out[:, i - 1]], 1, generator=g).squeeze(1)
    return out


def token_std(x: torch.Tensor) -> float:
    """How different the tokens are: std over tokens, per feature, averaged over features.
    LayerNorm keeps each token's own spread near 1, so this is what collapses when every token
    reaches a layer as the same vector."""
    return x.detach().reshape(-1, x.shape[-1]).std(0).mean().item()


class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.heads = heads
        self.attn_temperature = 1.0  # a config knob; the collapse runs turn it up

    def forward(self, x: torch.Tensor, stats: dict, i: int) -> torch.Tensor:
        return self.ffn(self.attend(x, stats, i), stats, i)

    def attend(self, x: torch.Tensor, stats: dict, i: int) -> torch.Tensor:
        b, t, d = x.shape
        stats[f"ln_input_std/layer_{i}"] = token_std(x)
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        logits = (q @ k.transpose(-2, -1)) * (self.attn_temperature / math.sqrt(d // self.heads))
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool), 1)
        att = logits.masked_fill(mask, float("-inf")).softmax(-1)
        ent = -(att * att.clamp_min(1e-12).log()).sum(-1)[:, :, 1:]  # position 0 can only see itself
        stats[f"attn_entropy/layer_{i}"] = ent.detach().mean().item()
        return x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))

    def ffn(self, x: torch.Tensor, stats: dict, i: int) -> torch.Tensor:
        h = self.ln2(x)
        stats[f"ffn_input_std/layer_{i}"] = token_std(h)
        a = torch.nn.functional.gelu(self.fc1(h))
        stats[f"ffn_act_mean/layer_{i}"] = a.detach().mean().item()
        stats[f"ffn_act_std/layer_{i}"] = a.detach().std().item()
        return x + self.fc2(a)


class TinyLM(nn.Module):
    def __init__(self, d: int = D_MODEL, layers: int = LAYERS, heads: int = HEADS, vocab: int = VOCAB):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(SEQ, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.stats: dict[str, float] = {}

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None):
        stats: dict[str, float] = {}
        x = self.tok(input_ids) + self.pos(torch.arange(input_ids.shape[1]))
        for i, blk in enumerate(self.blocks):
            x = blk(x, stats, i)
        logits = self.head(self.ln_f(x))
        stats["attn_entropy"] = min(stats[f"attn_entropy/layer_{i}"] for i in range(len(self.blocks)))
        self.stats = stats
        if labels is None:
            return {"logits": logits}
        loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1))
        return {"loss": loss, "logits": logits}


def layer_grad_norms(model: TinyLM) -> dict[str, float]:
    out = {}
    for i, blk in enumerate(model.blocks):
        sq = sum(float(p.grad.detach().float().pow(2).sum()) for p in blk.parameters() if p.grad is not None)
        out[f"grad_norm/layer_{i}"] = math.sqrt(sq)
    return out
