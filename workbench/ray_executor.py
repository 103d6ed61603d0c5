"""Per-run work as Ray tasks: the `ray` executor (`--executor ray [--address ...]`).

Imported only when asked for (`workbench.executor.make_executor`), so nothing else in the
workbench pays Ray's import. Items are sent in batches, one Ray task per batch, so that a task
costs a few milliseconds of scheduling against tens of milliseconds of work; results come back
in the order of the items, as with every executor. Tasks return small results (paths, counts,
alert frames); whatever is large they write to the store themselves.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

from workbench.errors import WorkbenchError

T = TypeVar("T")
R = TypeVar("R")

TASKS_PER_WORKER = 4  # enough batches per worker to even out uneven runs, few enough to stay cheap


def _import_ray():
    try:
        import ray
    except ImportError:
        raise WorkbenchError(
            "--executor ray needs Ray, which is not installed: pip install -e '.[ray]'"
        ) from None
    return ray


def _run_batch(fn: Callable[[T], R], items: list[T]) -> list[R]:
    return [fn(item) for item in items]


class RayExecutor:
    """Joins the cluster at `address` (None: the one named by $RAY_ADDRESS, or a local cluster
    of `workers` CPUs started for this process)."""

    name = "ray"
    batch_size: int | None = None  # items per task; None: about TASKS_PER_WORKER tasks per worker

    def __init__(self, address: str | None = None, workers: int | None = None):
        ray = self.ray = _import_ray()
        if not ray.is_initialized():
            kw = {"address": address} if address else {"num_cpus": workers}
            try:
                ray.init(ignore_reinit_error=True, include_dashboard=False, log_to_driver=False, **kw)
            except ConnectionError as e:
                raise WorkbenchError(f"cannot join the Ray cluster at {address}: {e}") from None
        self.workers = max(1, int(ray.cluster_resources().get("CPU", 1)))
        self._remote = ray.remote(num_cpus=1)(_run_batch)

    def map(self, fn: Callable[[T], R], items: Sequence[T]) -> Iterator[R]:
        items = list(items)
        if not items:
            return
        size = self.batch_size or max(1, math.ceil(len(items) / (self.workers * TASKS_PER_WORKER)))
        fn_ref = self.ray.put(fn)
        refs = [self._remote.remote(fn_ref, items[i : i + size]) for i in range(0, len(items), size)]
        done = 0
        try:
            for ref in refs:  # in item order; later batches run meanwhile
                yield from self.ray.get(ref)
                done += 1
        finally:
            for ref in refs[done:]:  # a caller that stops early (an error) leaves nothing running
                self.ray.cancel(ref)
