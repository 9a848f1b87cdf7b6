"""``hcp-linux run --pack FILE [--principal NAME] -- BIN [ARG...]``: the driver from a shell.

Kept out of cli.py so the CLI itself stays a thin parser. The other run options keep their
meaning and form the runtime's base policy: ``--allow-bin`` is the runtime's allow-list (a bin
must be in it *and* in the pack's ``wrap.bin``), ``--env`` values reach the child as explicitly
passed credentials, ``--timeout``, ``--network``, ``--write-root``, ``--read-only-root``,
``--allow-degraded``, ``--no-sandbox --native-local`` and ``--receipt`` as without a pack.
``--jail`` is refused: the pack's ``wrap.workspace.mode`` chooses the jail.
"""
from __future__ import annotations

import argparse
import copy
import signal
import sys
import tempfile
from typing import Any, Sequence

from .errors import EXIT_TIMEOUT, SandboxError


class _Terminated(BaseException):
    """SIGTERM/SIGHUP: unwind like ^C so that cleanup runs, then exit 128+N."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def run_pack(a: argparse.Namespace, argv: Sequence[str]) -> int:
    from .cli import policy_from_args
    from .driver import LinuxDriver
    from .receipt import write_receipt

    if a.pack is None:
        raise SandboxError("--principal: only with --pack")
    if a.jail is not None:
        raise SandboxError("--jail: not with --pack (the pack's wrap.workspace chooses the jail)")
    b = copy.copy(a)
    b.jail = tempfile.gettempdir()  # replaced per exec by the driver
    policy = policy_from_args(b)
    driver = LinuxDriver(policy)
    principal = a.principal if a.principal is not None else "default"

    def _on_signal(signum: int, _frame: Any) -> None:
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)  # one unwind is enough; let cleanup finish
        raise _Terminated(signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _on_signal)
    try:
        result = driver.run(a.pack, list(argv), principal=principal)
    except _Terminated as t:
        return 128 + t.signum
    receipt = dict(result.receipt)
    receipt["exit"] = {"returncode": result.returncode, "timed_out": result.timed_out}
    if a.receipt == "-":
        write_receipt(receipt, sys.stderr)
    elif a.receipt:
        write_receipt(receipt, a.receipt)
    if result.timed_out:
        print(f"error: sandbox: timed out after {policy.timeout:g}s; the sandbox was killed",
              file=sys.stderr)
        return EXIT_TIMEOUT
    status = result.returncode
    return 128 - status if status < 0 else status
