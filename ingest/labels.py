"""`labels.toml` at the root of an ingested tree: the user's word on how each run ended.

    [runs."group/run_a"]
    outcome = "failed"        # failed | healthy | unknown (required)
    onset = 424               # the step where the failure starts (failed runs)
    kind = "divergence_nan"   # optional
    note = "lr too high"      # optional
    trainer = "hf"            # any other key with a string, number or boolean value: an
    optimizer = "sgd"         #   attribute of the run (its family for leave-one-family-out scores)

Runs are named by their folder relative to the file (as run ids are named relative to PATH).
A malformed entry is reported with what to fix and the rest are still read; an attribute whose
value is not a string, number or boolean (a table, a list) is left out and reported.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

from ingest.base import Problem
from workbench.store.config import toml_error_line, toml_error_text
from workbench.store.schema import OUTCOMES

KNOWN = ("outcome", "onset", "kind", "note")


def read_labels_toml(path: Path) -> tuple[list[dict], list[Problem]]:
    """(rows keyed by folder name relative to the file, problems)."""
    try:
        text = path.read_text(encoding="utf-8")
        data = tomllib.loads(text)
    except UnicodeDecodeError as e:
        return [], [
            Problem(
                0, "bad_toml", f"not UTF-8 text (byte at offset {e.start}); no labels read from this file"
            )
        ]
    except tomllib.TOMLDecodeError as e:
        line = toml_error_line(e, text)
        return [], [
            Problem(line, "bad_toml", f"line {line}: {toml_error_text(e)}; no labels read from this file")
        ]
    rows, problems = [], []
    runs = data.get("runs", {})
    if not isinstance(runs, dict):
        return [], [
            Problem(0, "bad_labels", '[runs] must be a table of runs: [runs."name"] with outcome = ...')
        ]
    for name, entry in runs.items():
        where = f'[runs."{name}"]'
        if not isinstance(entry, dict) or entry.get("outcome") not in OUTCOMES:
            problems.append(
                Problem(
                    0, "bad_label", f"{where}: outcome must be one of {', '.join(OUTCOMES)}; entry skipped"
                )
            )
            continue
        onset = entry.get("onset")
        if onset is not None and (not isinstance(onset, int) or isinstance(onset, bool)):
            problems.append(
                Problem(0, "bad_label", f"{where}: onset must be a step number, got {onset!r}; entry skipped")
            )
            continue
        attrs, bad = _attributes(entry)
        problems += [
            Problem(0, "bad_label", f"{where}: attribute {k} must be a string, number or boolean; left out")
            for k in bad
        ]
        rows.append(
            {
                "folder": name,
                "outcome": entry["outcome"],
                "onset": onset,
                "kind": entry.get("kind"),
                "note": entry.get("note"),
                "attrs": json.dumps(attrs, sort_keys=True) if attrs else None,
            }
        )
    return rows, problems


def _attributes(entry: dict) -> tuple[dict, list[str]]:
    """The entry's keys beyond outcome, onset, kind and note whose values are scalars, and the
    names of the others (tables, lists, dates)."""
    attrs, bad = {}, []
    for k, v in entry.items():
        if k in KNOWN:
            continue
        if isinstance(v, str | int | float | bool):
            attrs[k] = v
        else:
            bad.append(k)
    return attrs, bad
