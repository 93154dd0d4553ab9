"""An iteration's sends, in flight together.

A plan step sends up to three things after its backward pass: the gradients of
co-trained rows, the dense gradient, and write-backs. Each leaves as soon as it
is computed: the PS client's calls are futures already, and ``push_dense`` (one
blocking call, whatever carries the dense gradient) runs on a small thread
pool. ``wait`` returns once every send is done and raises the first error, so
a step never reports an iteration whose sends failed or are still in flight.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, ParamSpec

Args = ParamSpec("Args")

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _threads() -> ThreadPoolExecutor:
    """The process's pool for blocking sends (created on first use; a worker process
    runs one step at a time, tests a few in turn)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="send")
        return _pool


class Sends:
    """Futures of one iteration's sends."""

    def __init__(self) -> None:
        self._futures: list[Future[Any]] = []

    def add(self, future: Future[Any]) -> None:
        self._futures.append(future)

    @staticmethod
    def in_thread(
        call: Callable[Args, object], *args: Args.args, **kwargs: Args.kwargs
    ) -> Future[Any]:
        """Run a blocking ``call`` on the send pool; its future."""
        return _threads().submit(call, *args, **kwargs)

    def wait(self) -> None:
        """Block until every send is done; then raise the first failed one's error."""
        futures, self._futures = self._futures, []
        concurrent.futures.wait(futures)
        for future in futures:
            future.result()
