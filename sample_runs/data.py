"""What a run learns (spec.dataset): the synthetic Markov language of model.py, or text that ships
with Python or Debian on every machine that runs the generator (nothing downloaded):

    markov           model.make_language(1234): vocabulary 32, entropy ~1.1 nats
    python_stdlib    the sources of Python's standard library (top-level *.py, sorted, first 2 MB)
    debian_licenses  /usr/share/common-licenses/* (each file once, links resolved)
    debian_copyright /usr/share/doc/*/copyright (sorted, first 2 MB)
    zen_of_python    the `this` module's text (857 characters): a tiny corpus, memorised fast

Text is read as bytes, one token per byte (non-ASCII bytes are token 127): vocabulary 128.
Training sequences are `n` windows of seq + 1 tokens at seeded offsets in the first 90 % of the
text, evaluation sequences 256 windows of the last 10 % (the zen's eval part is 86 characters,
so its windows overlap). `text_sha256` says which text a machine actually used.
"""

from __future__ import annotations

import codecs
import hashlib
import sysconfig
from functools import cache
from pathlib import Path

import torch
from model import SEQ, VOCAB, make_language, sample_sequences

TEXT_VOCAB = 128
LIMIT = 2_000_000


def _stdlib() -> bytes:
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    return b"".join(f.read_bytes() for f in files)[:LIMIT]


def _licenses() -> bytes:
    files = sorted({f.resolve() for f in Path("/usr/share/common-licenses").iterdir() if f.is_file()})
    return b"".join(f.read_bytes() for f in files)


def _copyright() -> bytes:
    return b"".join(f.read_bytes() for f in sorted(Path("/usr/share/doc").glob("*/copyright")))[:LIMIT]


def _zen() -> bytes:
    src = (Path(sysconfig.get_paths()["stdlib"]) / "this.py").read_text()
    return codecs.decode(src.split('s = """')[1].split('"""')[0], "rot13").encode()


TEXTS = {
    "python_stdlib": _stdlib,
    "debian_licenses": _licenses,
    "debian_copyright": _copyright,
    "zen_of_python": _zen,
}
DATASETS = ["markov", *TEXTS]


@cache
def text_tokens(name: str) -> torch.Tensor:
    raw = torch.frombuffer(bytearray(TEXTS[name]()), dtype=torch.uint8).long()
    return raw.clamp_max(TEXT_VOCAB - 1)


def text_sha256(name: str) -> str:
    return "" if name == "markov" else hashlib.sha256(TEXTS[name]()).hexdigest()


def vocab_size(name: str) -> int:
    return VOCAB if name == "markov" else TEXT_VOCAB


def _windows(tokens: torch.Tensor, n: int, seed: int, seq: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(tokens) - seq - 1, (n,), generator=g)
    return torch.stack([tokens[s : s + seq + 1] for s in starts.tolist()])


def sequences(name: str, n_train: int, seed: int, seq: int = SEQ) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, eval) sequences of seq + 1 tokens."""
    if name == "markov":
        chain = make_language(1234)
        return sample_sequences(chain, n_train, seed=seed, seq=seq), sample_sequences(chain, 256, 999, seq)
    tokens = text_tokens(name)
    cut = int(0.9 * len(tokens))
    return _windows(tokens[:cut], n_train, seed, seq), _windows(tokens[cut:], 256, 999, seq)
