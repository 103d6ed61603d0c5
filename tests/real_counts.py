"""The real logs of tests/data/real/ ingested into a store, and their independent counts
(tests/data/real/expected_counts.json, made by tests/data/real/count_independently.py)."""

from __future__ import annotations

import json
import math
import os
import shutil

from conftest import DATA, ingest_paths
from real_samples import settle

from workbench.store import Store

REAL = DATA / "real"
EXPECTED = json.loads((REAL / "expected_counts.json").read_text())


def expected(rel: str) -> dict:
    """The independent counts of one file, by its path under tests/data/real/."""
    return EXPECTED[f"tests/data/real/{rel}"]


def real_tree_store(tmp_path_factory, runs: dict[str, str]) -> Store:
    """A store of copies of tests/data/real/ paths: run folder name -> file or folder under real/,
    every file settled (finished writing)."""
    root = tmp_path_factory.mktemp("real") / "runs"
    for name, rel in runs.items():
        src, dst = REAL / rel, root / name
        if src.is_dir():
            shutil.copytree(src, dst, symlinks=True)
        else:
            dst.mkdir(parents=True, exist_ok=True)
            shutil.copy(src, dst / src.name)
    for dirpath, _, names in os.walk(root):
        settle(*(os.path.join(dirpath, n) for n in names))
    store = Store(root.parent / "store")
    ingest_paths(store, root)
    return store


def stored(store: Store, run: str, tag: str, view: str = "scalars_all") -> dict[int, float]:
    rows = store.query(
        f"SELECT step, value FROM {view} WHERE run_id = '{run}' AND tag = '{tag}' ORDER BY step"
    ).rows()
    return dict(rows)


def _stored_by_tag(store: Store, run: str, view: str) -> dict[str, dict[int, float]]:
    """What `stored` gives, for every tag of the run at once."""
    rows = store.query(
        f"SELECT tag, step, value FROM {view} WHERE run_id = '{run}' ORDER BY tag, step"
    ).rows()
    out: dict[str, dict[int, float]] = {}
    for tag, step, value in rows:
        out.setdefault(tag, {})[step] = value
    return out


def assert_matches(
    store: Store, run: str, counts: dict, tags: dict[str, str] | None = None, view: str = "scalars_all"
) -> None:
    """Every counted tag (renamed by `tags`: counted name -> stored tag) has the counted number
    of points, first and last step, and the spot values (in `view`: `scalars` for a log that
    writes a step more than once, where the last write is current, as the counts take it)."""
    every = _stored_by_tag(store, run, view)  # one query for all the run's tags
    for name, want in counts.items():
        if name.startswith("_"):
            continue
        tag = (tags or {}).get(name, name)
        got = every.get(tag, {})
        assert len(got) == want["points"], f"{run} {tag}: {len(got)} points, counted {want['points']}"
        assert min(got) == want["first_step"] and max(got) == want["last_step"], f"{run} {tag} steps"
        for step, value in want["spot"].items():
            v = got[int(step)]
            if isinstance(value, str):  # nan / inf written as text
                assert str(v) == value or (value == "nan" and math.isnan(v)), f"{run} {tag} @{step}"
            else:
                assert math.isclose(v, value, rel_tol=1e-6), f"{run} {tag} @{step}: {v} != {value}"
