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
    def __init__(
        self, d: int = D_MODEL, layers: int = LAYERS, heads: int = HEADS, vocab: int = VOCAB, seq: int = SEQ
    ):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
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

    # what the failure mechanisms of the trainers act on (freeze-and-decay), per architecture
    def output_params(self) -> list[torch.Tensor]:
        return [self.ln_f.weight, self.head.weight]

    def embedding_params(self) -> list[torch.Tensor]:
        return [self.tok.weight, self.pos.weight]

    def layer_groups(self) -> list[list[torch.Tensor]]:
        return [list(blk.parameters()) for blk in self.blocks]


def _lm_loss(logits: torch.Tensor, labels: torch.Tensor | None) -> dict:
    if labels is None:
        return {"logits": logits}
    loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1))
    return {"loss": loss, "logits": logits}


class LSTMLM(nn.Module):
    """A word-level-LM-style LSTM (no attention): embedding, stacked LSTM, LayerNorm, head."""

    def __init__(self, d: int = D_MODEL, layers: int = LAYERS, vocab: int = VOCAB):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.lstm = nn.LSTM(d, d, num_layers=layers, batch_first=True)
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.layers = layers
        self.stats: dict[str, float] = {}

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None):
        h, _ = self.lstm(self.tok(input_ids))
        self.stats = {"ln_input_std": token_std(h)}
        return _lm_loss(self.head(self.ln_f(h)), labels)

    def output_params(self) -> list[torch.Tensor]:
        return [self.ln_f.weight, self.head.weight]

    def embedding_params(self) -> list[torch.Tensor]:
        return [self.tok.weight]

    def layer_groups(self) -> list[list[torch.Tensor]]:
        return [
            [p for n, p in self.lstm.named_parameters() if n.endswith(f"_l{i}")] for i in range(self.layers)
        ]


class MLPLM(nn.Module):
    """A fixed-window MLP LM (Bengio-style): the last `context` token embeddings, concatenated,
    through `layers` GELU layers to the next-token logits."""

    def __init__(self, d: int = D_MODEL, layers: int = LAYERS, vocab: int = VOCAB, context: int = 8):
        super().__init__()
        self.context = context
        self.tok = nn.Embedding(vocab, d)
        widths = [context * d] + [4 * d] * layers
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths, widths[1:], strict=False))
        self.ln_f = nn.LayerNorm(widths[-1])
        self.head = nn.Linear(widths[-1], vocab, bias=False)
        self.stats: dict[str, float] = {}

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None):
        b, t = input_ids.shape
        x = self.tok(nn.functional.pad(input_ids, (self.context - 1, 0)))  # (b, t + c - 1, d)
        x = x.unfold(1, self.context, 1).transpose(2, 3).reshape(b, t, -1)  # (b, t, c * d)
        stats = {}
        for i, lin in enumerate(self.hidden):
            stats[f"ffn_input_std/layer_{i}"] = token_std(x)
            x = nn.functional.gelu(lin(x))
            stats[f"ffn_act_mean/layer_{i}"] = x.detach().mean().item()
        self.stats = stats
        return _lm_loss(self.head(self.ln_f(x)), labels)

    def output_params(self) -> list[torch.Tensor]:
        return [self.ln_f.weight, self.head.weight]

    def embedding_params(self) -> list[torch.Tensor]:
        return [self.tok.weight]

    def layer_groups(self) -> list[list[torch.Tensor]]:
        return [list(lin.parameters()) for lin in self.hidden]


LM = TinyLM | LSTMLM | MLPLM  # what the trainers drive: loss dict, .stats, parameter groups


def build_model(arch: str, d: int, layers: int, heads: int, vocab: int, seq: int) -> LM:
    if arch == "lstm":
        return LSTMLM(d, layers, vocab)
    if arch == "mlp":
        return MLPLM(d, layers, vocab)
    return TinyLM(d, layers, heads, vocab, seq)


def layer_grad_norms(model: LM) -> dict[str, float]:
    out = {}
    for i, group in enumerate(model.layer_groups()):
        sq = sum(float(p.grad.detach().float().pow(2).sum()) for p in group if p.grad is not None)
        out[f"grad_norm/layer_{i}"] = math.sqrt(sq)
    return out
