"""TensorBoard's Distributions and Histograms views from stored histograms (the `histograms`
view: buckets as [left, right, count] per tag and step): percentiles as TensorBoard's
Distributions dashboard draws them, and a sample of steps for the Histograms dashboard."""

from __future__ import annotations

import numpy as np

# TensorBoard's Distributions dashboard: the basis points of a normal's -inf, ±1.5σ, ±σ, ±0.5σ
# and the median, drawn as nested bands
BASIS_POINTS = (0, 668, 1587, 3085, 5000, 6915, 8413, 9332, 10000)


def percentiles(left, right, count, basis_points=BASIS_POINTS) -> np.ndarray:
    """The values below which these shares (in basis points) of the histogram's mass lie, by
    linear interpolation inside the bucket that holds each; NaN for an empty histogram."""
    left, right, count = (np.asarray(a, dtype=np.float64) for a in (left, right, count))
    bps = np.asarray(basis_points, dtype=np.float64)
    keep = count > 0  # an empty bucket holds no mass (a legacy proto's first one may have left > right)
    left, right, count = left[keep], right[keep], count[keep]
    if count.size == 0:
        return np.full(bps.shape, np.nan)
    cum = np.cumsum(count)
    target = bps / 10_000 * cum[-1]
    i = np.minimum(np.searchsorted(cum, target, side="left"), cum.size - 1)
    before = np.where(i > 0, cum[np.maximum(i - 1, 0)], 0.0)
    frac = np.clip((target - before) / count[i], 0.0, 1.0)
    return left[i] + frac * (right[i] - left[i])


def distribution(steps, lefts, rights, counts) -> tuple[np.ndarray, np.ndarray]:
    """Steps (sorted) and their percentiles, one row per step and one column per basis point."""
    steps = np.asarray(steps)
    order = np.argsort(steps, kind="stable")
    rows = [percentiles(lefts[j], rights[j], counts[j]) for j in order]
    return steps[order], np.array(rows).reshape(len(rows), len(BASIS_POINTS))


def sample_steps(steps, most: int) -> np.ndarray:
    """Indices of at most `most` of these steps, evenly spread over them, the first and the last
    kept (as TensorBoard keeps a reservoir of a tag's histograms)."""
    n = len(steps)
    if n <= most:
        return np.arange(n)
    return np.unique(np.round(np.linspace(0, n - 1, most)).astype(np.int64))


def rebin(left, right, count, edges) -> np.ndarray:
    """A histogram's counts on common bins (`edges`, ascending), each bucket's count shared among
    the bins it overlaps in proportion to the overlap (a bucket of no width goes whole to the
    bin holding it), as TensorBoard's Histograms view puts every step on the same bins."""
    left, right, count = (np.asarray(a, dtype=np.float64) for a in (left, right, count))
    edges = np.asarray(edges, dtype=np.float64)
    keep = count > 0
    left, right, count = left[keep, None], right[keep, None], count[keep, None]
    lo, hi = edges[None, :-1], edges[None, 1:]
    width = right - left
    overlap = np.clip(np.minimum(right, hi) - np.maximum(left, lo), 0.0, None)
    share = np.divide(overlap, width, out=np.zeros(overlap.shape), where=width > 0)
    point = np.clip(np.searchsorted(edges, left[:, 0], side="right") - 1, 0, len(edges) - 2)
    share[(width[:, 0] <= 0), :] = 0.0
    share[np.flatnonzero(width[:, 0] <= 0), point[width[:, 0] <= 0]] = 1.0
    return (share * count).sum(axis=0)
