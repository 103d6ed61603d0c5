"""Compiled kernels are cached per version of the source, not per checkout: a second clone
(another path, new mtimes) loads what the first compiled; a changed kernel file compiles anew."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent
PROBE = """
import json, numpy as np
from ingest.framing import CRC_TABLES, crc32c
buf = np.frombuffer(b"123456789", np.uint8)
value = int(crc32c(buf, 0, 9, CRC_TABLES))
print(json.dumps({"crc": value, "hits": sum(crc32c.stats.cache_hits.values()),
                  "misses": sum(crc32c.stats.cache_misses.values())}))
"""


def clone(dst: Path) -> Path:
    for pkg in ("workbench", "ingest", "detectors"):
        shutil.copytree(ROOT / pkg, dst / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    return dst


def probe(checkout: Path, cache: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(checkout), "WORKBENCH_CACHE": str(cache)}
    env.pop("NUMBA_CACHE_DIR", None)
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=checkout, env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


def test_a_second_clone_loads_the_kernels_the_first_compiled(tmp_path):
    cache = tmp_path / "cache"
    first = probe(clone(tmp_path / "a"), cache)
    assert first["crc"] == 0xE3069283  # CRC-32C of "123456789"
    assert (first["hits"], first["misses"]) == (0, 1)
    second = probe(clone(tmp_path / "b"), cache)
    assert (second["hits"], second["misses"]) == (1, 0)
    assert not list((tmp_path / "b").rglob("*.nbi"))  # nothing written beside the source

    changed = clone(tmp_path / "c")
    framing = changed / "ingest" / "framing.py"
    framing.write_text(framing.read_text() + "\n# a change\n")
    assert probe(changed, cache)["misses"] == 1
