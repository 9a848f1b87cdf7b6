"""Where the runtime's processes are started from: a thread that lives as long as the process.

A run's monitor dies with its parent (PR_SET_PDEATHSIG: nothing of a run may outlive the
runtime), and for the kernel the parent is the *thread* that started it: a run spawned from a
worker thread would be killed when that thread exits, while a run handed to a ready spare
(started by the spare pool's long-lived thread) would go on. So every start — hcp-exec for a
run or a spare, and the ctypes executor's fork — happens on a thread that lasts: the calling
thread when it is the main thread (it lasts until the interpreter ends), else one launcher
thread, started on first use, which runs the start with the caller's signal mask (the
started process inherits the mask of the thread that starts it).

The behaviour, then, for every executor and whether a spare was ready or not: a run lives
until it ends, is killed, times out, or the runtime *process* dies — never because the thread
that spawned it exited.
"""
from __future__ import annotations

import os
import signal
import threading
from typing import Callable, TypeVar

_T = TypeVar("_T")


def on_lasting_thread(fn: Callable[[], _T]) -> _T:
    """``fn()`` on a thread that lives as long as the process, with the caller's signal mask;
    its result, or its exception raised here."""
    if threading.current_thread() is threading.main_thread():
        return fn()
    return _launcher().call(fn, signal.pthread_sigmask(signal.SIG_BLOCK, ()))


class _Launcher:
    """One daemon thread that runs the starts it is handed, one at a time."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.jobs: list[_Job] = []
        self.thread = threading.Thread(target=self._run, name="hcp-linux launcher", daemon=True)
        self.thread.start()

    def call(self, fn: Callable[[], _T], mask: "set[int | signal.Signals]") -> _T:
        job = _Job(fn, mask)
        with self.cond:
            self.jobs.append(job)
            self.cond.notify()
        job.done.wait()
        if job.error is not None:
            raise job.error
        return job.result  # type: ignore[return-value]

    def _run(self) -> None:
        # Between jobs every signal is blocked: they are for the runtime's own threads.
        signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        while True:
            with self.cond:
                while not self.jobs:
                    self.cond.wait()
                job = self.jobs.pop(0)
            old = signal.pthread_sigmask(signal.SIG_SETMASK, job.mask)
            try:
                job.result = job.fn()
            except BaseException as e:  # noqa: BLE001 - handed back to the caller
                job.error = e
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, old)
                job.done.set()


class _Job:
    __slots__ = ("fn", "mask", "done", "result", "error")

    def __init__(self, fn: Callable[[], object], mask: "set[int | signal.Signals]") -> None:
        self.fn, self.mask = fn, mask
        self.done = threading.Event()
        self.result: object = None
        self.error: BaseException | None = None


_the_launcher: _Launcher | None = None
_owner = 0
_lock = threading.Lock()


def _launcher() -> _Launcher:
    """This process's launcher (a forked child starts its own: threads do not cross a fork)."""
    global _the_launcher, _owner, _lock
    if _owner != os.getpid():
        _lock = threading.Lock()  # the parent's may have been held by a thread not here
    with _lock:
        if _the_launcher is None or _owner != os.getpid():
            _the_launcher, _owner = _Launcher(), os.getpid()
        return _the_launcher
