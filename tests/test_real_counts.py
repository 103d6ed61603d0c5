"""tests/data/real/expected_counts.json is what tests/data/real/count_independently.py counts
in the files committed beside it: a changed or added file without a recount fails here."""

from __future__ import annotations

import importlib.util

from real_counts import EXPECTED, REAL


def test_expected_counts_are_the_independent_counts_of_the_committed_files():
    spec = importlib.util.spec_from_file_location("count_independently", REAL / "count_independently.py")
    counter = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(counter)
    assert counter.counts() == EXPECTED


def test_every_real_folder_says_where_its_files_come_from():
    folders = {p.parent for p in REAL.rglob("*") if p.is_file() and p.parent.parent == REAL}
    assert folders and all((f / "PROVENANCE.md").is_file() for f in folders)
