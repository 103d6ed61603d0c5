"""Generic progress lines of custom training loops: `step 120 | loss 2.31 |
...`, `step: 120 loss: 2.31 ...`, `step=120 loss=2.31 ...`, the real consoles of one run of
tests/data/real/custom_names/train_custom.py, counted independently; and the fallback claims no
line any other dialect reads."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from conftest import DATA, SAMPLE_RUNS
from real_counts import assert_matches, expected, real_tree_store

from ingest.base import ReadContext
from ingest.textlog import progress
from ingest.textlog.ingestor import DIALECTS, TextLogIngestor, TextLogParser

STYLES = ("pipes", "colon", "equals")
TEXT = (".log", ".txt", ".out", ".log.gz")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return real_tree_store(tmp_path_factory, {s: f"custom_names/console_{s}" for s in STYLES})


@pytest.mark.parametrize("style", STYLES)
def test_progress_lines_match_the_independent_count(store, style):
    assert_matches(store, style, expected(f"custom_names/console_{style}/stdout.log"))
    kinds = json.loads(store.query(f"SELECT contents FROM files WHERE run_id = '{style}'")["contents"][0])
    assert kinds["progress_line"] == 66  # 60 training lines and 6 validation lines; the header is none


def test_their_names_map_to_metrics(store):
    metrics = dict(store.query("SELECT DISTINCT tag, metric FROM scalars").rows())
    assert metrics == {
        "loss": "loss",
        "val_loss": "eval_loss",
        "lr": "lr",
        "gnorm": "grad_norm",
        "grad_norm": "grad_norm",
    }


class WithoutFallback(TextLogParser):
    dialects = tuple(d for d in DIALECTS if d is not progress.DIALECT)


def kinds(parser: type[TextLogParser], path: Path) -> Counter:
    """What each dialect read in a file: the records by kind."""
    ingestor = TextLogIngestor()
    ingestor.parser = parser
    out: Counter = Counter()
    for batch in ingestor.read(path, 0, ReadContext("run")):
        out.update(batch.counts)
    out.pop("values_before_first_step", None)
    return out


def test_no_other_dialects_line_is_read_as_a_progress_line():
    files = [p for root in (DATA, SAMPLE_RUNS) for p in sorted(root.rglob("*")) if p.name.endswith(TEXT)]
    claimed = {}
    for path in files:
        rel = path.relative_to(DATA.parent.parent).as_posix()
        if "custom_names/" in rel:
            continue
        every, without = kinds(TextLogParser, path), kinds(WithoutFallback, path)
        if n := every.pop("progress_line", 0):
            claimed[rel] = n
        assert every == without, rel  # the fallback took no line another dialect reads
    assert len(files) > 60
    # the only other custom loop: the W&B runs' console (tests/data/real/wandb_offline/train_wandb.py
    # prints `step N loss X grad_norm Y lr Z`), 12 lines of a clean run, 7 of one that crashed
    assert {Path(p).parts[-5]: n for p, n in claimed.items()} == {
        "wandb-0.31.0_clean": 12,
        "wandb-0.31.0_crash_exit1": 7,
    }
