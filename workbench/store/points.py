"""Points in flight from an ingestor to the store, and the preemption rule applied to them.

Tags travel as dictionary codes (a list of names plus an int32 code per point): a file with
millions of points names a handful of tags, so strings are never materialised per point.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Points:
    """Points of one batch, in the order they were logged."""

    tags: list[str]
    tag_code: np.ndarray  # int32, index into `tags`
    step: np.ndarray  # int64
    wall_time: np.ndarray  # float64 (seconds since the epoch; NaN when the format has none)
    value: np.ndarray  # float64, NaN/±Inf kept

    def __post_init__(self):
        self.tag_code = np.ascontiguousarray(self.tag_code, dtype=np.int32)
        self.step = np.ascontiguousarray(self.step, dtype=np.int64)
        self.wall_time = np.ascontiguousarray(self.wall_time, dtype=np.float64)
        self.value = np.ascontiguousarray(self.value, dtype=np.float64)
        n = len(self.tag_code)
        if not (len(self.step) == len(self.wall_time) == len(self.value) == n):
            raise ValueError("Points: columns differ in length")

    def __len__(self) -> int:
        return len(self.tag_code)

    @classmethod
    def empty(cls) -> Points:
        return cls([], np.empty(0, np.int32), np.empty(0, np.int64), np.empty(0), np.empty(0))

    @classmethod
    def concat(cls, parts: list[Points]) -> Points:
        """One Points from several, in order; tag dictionaries are merged."""
        if len(parts) == 1:
            return parts[0]
        names: dict[str, int] = {}
        for p in parts:
            for t in p.tags:
                names.setdefault(t, len(names))
        codes = [
            np.array([names[t] for t in p.tags], np.int32)[p.tag_code] if len(p) else p.tag_code
            for p in parts
        ]
        return cls(
            list(names),
            np.concatenate(codes),
            np.concatenate([p.step for p in parts]),
            np.concatenate([p.wall_time for p in parts]),
            np.concatenate([p.value for p in parts]),
        )


_INT64 = 1 << 63


class PointsBuilder:
    """Collects points one at a time (text and JSON readers) and hands them over as Points."""

    def __init__(self):
        self._reset()

    def _reset(self) -> None:
        self.tags: dict[str, int] = {}
        self.codes: list[int] = []
        self.steps: list[int] = []
        self.walls: list[float] = []
        self.values: list[float] = []

    def add(self, tag: str, step: int, value: float, wall_time: float = np.nan) -> None:
        """Raises ValueError for a step outside int64 (before anything is added)."""
        if not -_INT64 <= step < _INT64:
            raise ValueError(f"step {step} is outside the 64-bit range of steps")
        self.codes.append(self.tags.setdefault(tag, len(self.tags)))
        self.steps.append(step)
        self.walls.append(wall_time)
        self.values.append(value)

    def take(self) -> Points:
        """The points collected so far; the builder starts over."""
        pts = Points(
            list(self.tags),
            np.array(self.codes, np.int32),
            np.array(self.steps, np.int64),
            np.array(self.walls, np.float64),
            np.array(self.values, np.float64),
        )
        self._reset()
        return pts


_COMPILED: list = []  # numba is imported on the first write: reading the store never pays for it


def _supersede(order, codes, steps):
    if not _COMPILED:
        from workbench.jit import njit

        _COMPILED.append(njit(cache=True, nogil=True)(_supersede_loop))
    return _COMPILED[0](order, codes, steps)


def _supersede_loop(order, codes, steps):
    """Walk each tag's points from last to first: a point is superseded when a later point of
    the same tag has a step <= its own."""
    n = order.shape[0]
    sup = np.zeros(n, np.bool_)
    i = n - 1
    while i >= 0:
        c = codes[order[i]]
        later_min = steps[order[i]]
        i -= 1
        while i >= 0 and codes[order[i]] == c:
            s = steps[order[i]]
            if s >= later_min:
                sup[order[i]] = True
            else:
                later_min = s
            i -= 1
    return sup


def stretch_starts(a: np.ndarray) -> np.ndarray:
    """Where each stretch of equal neighbouring values of `a` begins (a sorted column's groups)."""
    return np.flatnonzero(np.r_[True, a[1:] != a[:-1]]) if len(a) else np.zeros(0, np.int64)


def order_and_supersede(points: Points) -> tuple[np.ndarray, np.ndarray]:
    """(row order sorted by tag then step, local_superseded flag per original row)."""
    by_tag = np.argsort(points.tag_code, kind="stable")  # keeps logged order within a tag
    codes, steps = points.tag_code[by_tag], points.step[by_tag]
    if not ((codes[1:] == codes[:-1]) & (steps[1:] <= steps[:-1])).any():
        # steps rise within every tag (the common case): nothing superseded, no compiled loop
        return by_tag, np.zeros(len(points), np.bool_)
    sup = _supersede(by_tag, points.tag_code, points.step)
    if not sup.any():  # steps rise within every tag: already in (tag, step) order
        return by_tag, sup
    seq = np.arange(len(points))
    return np.lexsort((seq, points.step, points.tag_code)), sup
