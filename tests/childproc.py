"""Run a test function in a forked child, so kernel restrictions stay out of pytest.

Landlock domains, seccomp filters and no_new_privs are irreversible for a process, so every
test that enforces one does it in a child made here. The child's return value (or exception)
travels back pickled over a pipe; a child killed by a signal is reported as such, which is how
seccomp KILL_PROCESS is observed.
"""
from __future__ import annotations

import os
import pickle
import signal
import traceback
from dataclasses import dataclass
from typing import Any, Callable


@dataclass
class ChildResult:
    value: Any = None
    error: str | None = None  # formatted traceback when the child raised
    exit_code: int | None = None
    signal: int | None = None

    def unwrap(self) -> Any:
        """The child's return value; fail loudly when the child raised or died."""
        if self.signal is not None:
            raise AssertionError(f"child killed by {signal.Signals(self.signal).name}")
        if self.error is not None:
            raise AssertionError(f"child raised:\n{self.error}")
        return self.value


def run_in_child(fn: Callable[[], Any]) -> ChildResult:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(r)
        code = 0
        try:
            payload = pickle.dumps(("ok", fn()))
        except BaseException:  # noqa: BLE001 - report everything to the parent
            payload = pickle.dumps(("err", traceback.format_exc()))
            code = 1
        try:
            os.write(w, payload)
        finally:
            os._exit(code)
    os.close(w)
    chunks = []
    with os.fdopen(r, "rb") as f:
        chunks.append(f.read())
    _, status = os.waitpid(pid, 0)
    res = ChildResult()
    if os.WIFSIGNALED(status):
        res.signal = os.WTERMSIG(status)
        return res
    res.exit_code = os.WEXITSTATUS(status)
    data = b"".join(chunks)
    if data:
        kind, obj = pickle.loads(data)
        if kind == "ok":
            res.value = obj
        else:
            res.error = obj
    return res
