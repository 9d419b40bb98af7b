"""The eBPF probe's lock, with the poll thread last in line.

Python's locks are not fair: a poll thread that drains full batches back to back re-takes the lock the moment it
lets go, so a thread waiting for it (the tick, add_pid) could wait out the whole stream (tens of seconds in a
loaded P/D decode). Those threads take it with :meth:`PollLock.ahead`, and the poll thread yields between batches
while :attr:`PollLock.waited` is true.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class PollLock:
    """A re-entrant lock (``with lock:``) that threads other than the poll thread take ahead of it."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._waiting = 0  # threads in ahead(), waiting for the lock
        self._waiting_lock = threading.Lock()

    def __enter__(self) -> bool:
        return self._lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()

    @property
    def waited(self) -> bool:
        """Does a thread wait in :meth:`ahead` (the poll thread lets it have the lock first)?"""
        return self._waiting > 0

    @contextmanager
    def ahead(self) -> Iterator[None]:
        """The lock, taken ahead of the poll thread (which yields between batches while anyone waits)."""
        with self._waiting_lock:
            self._waiting += 1
        try:
            self._lock.acquire()
        finally:
            with self._waiting_lock:
                self._waiting -= 1
        try:
            yield
        finally:
            self._lock.release()
