"""The cluster executor's link to a server in this process: what tests of
Node and ParameterServer use in place of Ray's calls."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

from iasgd.executors import cluster as C


def in_process_link(pool: ThreadPoolExecutor, server: C.ParameterServer) -> C.Link:
    """A Link whose exchanges run on `pool` against `server`; a poll that
    times out returns None, as a Ray call still in flight does."""
    def link(push: C.Push, want: int):
        future = pool.submit(server.exchange, push, want)

        def poll(timeout_s: float):
            try:
                return future.result(timeout=timeout_s)
            except FutureTimeout:
                return None
        return poll
    return link
