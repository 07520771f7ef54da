"""One call on a thread of its own, not waited for."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

__all__ = ["on_worker"]


def on_worker(name: str, fn, *args) -> Future:
    """The future of ``fn(*args)`` run on a new thread named ``name`` (its executor
    shut down at once: the thread ends with the call)."""
    ex = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
    try:
        return ex.submit(fn, *args)
    finally:
        ex.shutdown(wait=False)
