"""Where per-run work runs: in this process, in a process per core, or on a Ray cluster.

The driver plans (discovery, what changed) and commits; an executor only maps a top-level
function over picklable items and hands the results back in the order of the items, so every
executor gives the same rows in the same order. Ray is imported only when asked for."""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from multiprocessing import get_context
from typing import Protocol, TypeVar

from workbench.errors import WorkbenchError

T = TypeVar("T")
R = TypeVar("R")

EXECUTORS = ("local", "ray")


class Executor(Protocol):
    name: str
    workers: int

    def map(self, fn: Callable[[T], R], items: Sequence[T]) -> Iterator[R]:
        """`fn` over `items`, results in the order of `items`, yielded as soon as each is ready."""
        ...


class LocalExecutor:
    """`workers` == 1: in this process (no pickling, no start-up), on `threads` threads (at most
    one item per thread and one more in flight: memory stays bounded). More: a pool of spawned
    processes (fork would copy polars' and DuckDB's threads in an unknown state)."""

    name = "local"

    def __init__(self, workers: int | None = None, threads: int = 1):
        self.workers = max(1, workers if workers is not None else (os.cpu_count() or 1))
        self.threads = max(1, threads)

    def map(self, fn: Callable[[T], R], items: Sequence[T]) -> Iterator[R]:
        if self.workers == 1 and self.threads > 1 and len(items) > 1:
            yield from threaded_map(fn, items, self.threads)
            return
        if self.workers == 1 or len(items) < 2:
            yield from map(fn, items)
            return
        with ProcessPoolExecutor(min(self.workers, len(items)), mp_context=get_context("spawn")) as pool:
            yield from pool.map(fn, items, chunksize=max(1, len(items) // (self.workers * 8)))


def threaded_map(fn: Callable[[T], R], items: Sequence[T], threads: int) -> Iterator[R]:
    """`fn` over `items` on `threads` threads, in order, with at most threads + 1 in flight: the
    next items are worked on while the caller works on this one's result."""
    with ThreadPoolExecutor(threads, thread_name_prefix="map") as pool:
        waiting: deque[Future[R]] = deque()
        for item in items:
            waiting.append(pool.submit(fn, item))
            if len(waiting) > threads:
                yield waiting.popleft().result()
        while waiting:
            yield waiting.popleft().result()


def make_executor(name: str = "local", address: str | None = None, workers: int | None = None) -> Executor:
    """The executor called `name`; `address` is a Ray cluster's (None: start or join a local one)."""
    if name == "local":
        if address:
            raise WorkbenchError("--address is for --executor ray")
        return LocalExecutor(workers)
    if name == "ray":
        from workbench.ray_executor import RayExecutor  # Ray only when asked for

        return RayExecutor(address, workers)
    raise WorkbenchError(f"unknown executor {name!r}: choose one of {', '.join(EXECUTORS)}")
