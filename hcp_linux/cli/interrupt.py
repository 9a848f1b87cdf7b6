"""How `hcp-linux run` ends when it is told to: SIGINT, SIGTERM, SIGHUP.

A shell reads a child's death by a signal and acts on it (``$?`` is 130, 143, 129; a loop
stops on ^C; a Python caller sees -2, -15, -1). A program that catches the signal to clean up
and then *exits* 128+N, or 137 because it SIGKILLed the sandbox, breaks that. So the CLI
catches the signal, kills the sandbox, finishes its cleanup (ephemeral jail removed, nothing
written back), writes the receipt if asked (saying which signal ended the run), and then
ends itself by the same signal: default disposition, unblocked, raised.

One helper for both `run` paths (cli._run, and driver_cli.run_pack for ``--pack``): enter
:class:`EndOnSignal` around the run, wrap the cleanup in :meth:`EndOnSignal.deferred`, and
call :func:`end_by_signal` when :attr:`EndOnSignal.signum` is set.
"""
from __future__ import annotations

import _signal  # signal's C half: the `signal` module imports enum (~2 ms) for nothing here
import os
import sys
from contextlib import contextmanager
from typing import Any, Iterator, NoReturn

__all__ = ["EndOnSignal", "Interrupted", "end_by_signal", "die_by", "SIGNAL_NAMES"]

#: The signals that end a run, and how the receipt names them.
SIGNAL_NAMES = {_signal.SIGHUP: "SIGHUP", _signal.SIGINT: "SIGINT", _signal.SIGTERM: "SIGTERM"}


class Interrupted(BaseException):
    """Raised (in the main thread) by the first of those signals: it unwinds like ^C, so every
    ``finally`` on the way (the driver's cleanup, the sandbox's kill and reap) runs."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class EndOnSignal:
    """Catch SIGINT/SIGTERM/SIGHUP for the duration of a run (a context manager).

    The first one is recorded in :attr:`signum` and raised as :class:`Interrupted`, which the
    ``with`` swallows; later ones are only recorded as having come (one unwind is enough, and
    cleanup must not be cut short). Inside :meth:`deferred` the first one is recorded and not
    raised. A signal ignored when we start (``nohup``) stays ignored.
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self._deferred = 0
        self._pending = False  # noted inside a deferred section, not raised yet
        self._old: dict[int, Any] = {}

    def __enter__(self) -> "EndOnSignal":
        for sig in SIGNAL_NAMES:
            old = _signal.getsignal(sig)
            if old is not None and old != _signal.SIG_IGN:  # None: set outside Python
                self._old[sig] = old
                _signal.signal(sig, self._on_signal)
        return self

    def _on_signal(self, signum: int, _frame: object) -> None:
        if self.signum is None:
            self.signum = signum
            if self._deferred:
                self._pending = True
            else:
                raise Interrupted(signum)

    @contextmanager
    def deferred(self, *, then_raise: bool = False) -> Iterator[None]:
        """A section that a signal must not cut: it is noted, not raised. Cleanup is one;
        starting the sandbox is another (``then_raise``: the signal is raised as the section
        ends, once the caller holds the process it must kill and the receipt it reports)."""
        self._deferred += 1
        try:
            yield
        finally:
            self._deferred -= 1
        if then_raise and self._pending and not self._deferred:
            self._pending = False
            assert self.signum is not None
            raise Interrupted(self.signum)

    def __exit__(self, typ: object, value: object, tb: object) -> bool:
        if self.signum is None:  # no signal: the previous handlers, as they were
            for sig, old in self._old.items():
                _signal.signal(sig, old)
        # With a signal, ours stay (ignoring more of them) until end_by_signal.
        return isinstance(value, Interrupted)


def end_by_signal(signum: int, receipt: dict[str, Any] | None, receipt_to: str | None,
                  returncode: int | None, receipt_dir: int | None = None) -> NoReturn:
    """Write the receipt of a run a signal ended (when there is one: a run ended before its
    sandbox started has none, like a refused one), in ``receipt_dir`` when it was opened
    before the run (hcp_linux.cli.run_end.open_receipt_dir), then die by that signal."""
    if receipt is not None and receipt_to:
        from ..errors import printable
        from ..run.receipt import write_receipt
        from ..receipt_keys import set_exit
        set_exit(receipt, returncode, False, SIGNAL_NAMES.get(signum, str(signum)))
        try:
            write_receipt(receipt, sys.stderr if receipt_to == "-" else receipt_to,
                          receipt_dir)
        except OSError as e:
            print(f"error: sandbox: receipt {printable(receipt_to)}: "
                  f"{os.strerror(e.errno or 5)}", file=sys.stderr)
    die_by(signum)


def die_by(signum: int) -> NoReturn:
    """End this process by ``signum``, as if it had never been caught: flush stdio, reset the
    disposition, unblock it, raise it. Exit 128+N only if we somehow survive it."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    _signal.signal(signum, _signal.SIG_DFL)
    _signal.pthread_sigmask(_signal.SIG_UNBLOCK, {signum})
    _signal.raise_signal(signum)
    os.kill(os.getpid(), signum)  # raise() went to this thread; try the whole process
    os._exit(128 + signum)
