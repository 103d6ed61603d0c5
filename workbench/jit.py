"""numba's `njit`, with compiled kernels cached per version of the workbench's source rather
than per checkout.

numba keys its on-disk cache by a source file's path and mtime, so every fresh clone (new path,
new mtimes) compiled every kernel again on its first ingest (~20 s). Here a kernel of the
workbench is cached under `$WORKBENCH_CACHE` (default `~/.cache/training-log-workbench`)/numba,
keyed by a digest of every kernel-defining source file together (a kernel calls kernels of other
files, so a change to any of them recompiles all): compiled once per version, shared by every
clone and install of it. Everything else about numba's cache (CPU, numba version, signatures)
is numba's. With `$NUMBA_CACHE_DIR` set, numba's own placement is left alone.
"""

from __future__ import annotations

import hashlib
import os
import sys
from functools import cache
from pathlib import Path

from numba import njit
from numba.core.caching import CacheImpl, _CacheLocator


def _load_numpy_support_without_blas() -> None:
    """numba probes for BLAS (importing scipy.linalg, half a second) when it first loads a
    kernel, and uses it only for np.dot, np.cov and the like, which no kernel here calls: load
    its numpy support with the probe answered "no BLAS" (scipy itself stays importable)."""
    probe = "scipy.linalg"
    if "numba.np.arraymath" in sys.modules or probe in sys.modules:
        return
    sys.modules[probe] = None  # type: ignore[assignment]  # None there makes an import of it raise ImportError
    try:
        import numba.np.arraymath  # noqa: F401
    finally:
        del sys.modules[probe]


_load_numpy_support_without_blas()

PACKAGES = tuple(Path(__file__).resolve().parents[1] / p for p in ("workbench", "ingest", "detectors"))


def cache_dir() -> Path:
    root = os.environ.get("WORKBENCH_CACHE") or Path.home() / ".cache" / "training-log-workbench"
    return Path(root) / "numba"


@cache
def source_digest() -> str:
    """One digest of the files that define kernels (and only them: editing a page recompiles nothing)."""
    h = hashlib.sha256()
    for pkg in PACKAGES:
        for p in sorted(pkg.rglob("*.py")):
            text = p.read_bytes()
            if b"njit" in text:
                h.update(p.relative_to(pkg.parent).as_posix().encode() + b"\0" + text)
    return h.hexdigest()[:20]


class SourceDigestLocator(_CacheLocator):
    """Places the workbench's kernels by source digest; other code's by numba's own locators."""

    def __init__(self, py_func, py_file: Path):
        self._lineno = py_func.__code__.co_firstlineno
        self._path = str(cache_dir() / source_digest() / py_file.stem)

    def get_cache_path(self) -> str:
        return self._path

    def get_source_stamp(self) -> str:
        return source_digest()

    def get_disambiguator(self) -> str:
        return str(self._lineno)

    @classmethod
    def from_function(cls, py_func, py_file):
        path = Path(py_file).resolve()
        if os.environ.get("NUMBA_CACHE_DIR") or not any(pkg in path.parents for pkg in PACKAGES):
            return None
        locator = cls(py_func, path)
        try:
            locator.ensure_cache_path()
        except OSError:  # no writable home: numba's own locators (next to the source) take it
            return None
        return locator


if SourceDigestLocator not in CacheImpl._locator_classes:
    CacheImpl._locator_classes.insert(0, SourceDigestLocator)


def njit_without_refcounts(**options):
    """`njit` for a kernel that makes no array and returns none, compiled without numba's
    reference counting. A compiled function counts a reference to each array argument it is
    called with (an atomic add and subtract); called per record, those took 40 % of TensorBoard
    decoding, and more with threads sharing one buffer, whose count then moves between cores."""
    return njit(_nrt=False, **options)  # type: ignore[call-overload]  # numba's (unannotated) option


__all__ = ["njit", "njit_without_refcounts"]
