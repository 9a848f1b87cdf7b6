"""``hcp-linux run --pack FILE [--principal NAME] -- BIN [ARG...]``: the driver from a shell.

Kept out of cli.py so the CLI itself stays a thin parser. The other run options keep their
meaning and form the runtime's base policy: ``--allow-bin`` is the runtime's allow-list (a bin
must be in it *and* in the pack's ``wrap.bin``), ``--env`` values reach the child as explicitly
passed credentials, ``--timeout``, ``--network``, ``--write-root``, ``--read-only-root``,
``--allow-degraded``, ``--no-sandbox --native-local`` and ``--receipt`` as without a pack.
``--jail`` is refused: the pack's ``wrap.workspace.mode`` chooses the jail.

SIGINT, SIGTERM and SIGHUP end the run as without a pack (hcp_linux.cli.interrupt): the sandbox
is killed, cleanup runs, nothing is written back, the receipt says which signal, and the CLI
dies by that signal. A failed writeback is one ``error: sandbox: writeback PATH: CAUSE`` line
and exit 125; the receipt still records the command's own status.
"""
from __future__ import annotations

import argparse
import copy
import sys
from typing import Any, Sequence

from ..errors import EXIT_TIMEOUT, SandboxError, WritebackError, printable
from .interrupt import SIGNAL_NAMES, EndOnSignal, end_by_signal


def run_pack(a: argparse.Namespace, argv: Sequence[str]) -> int:
    from .cli_args import check_cwd, check_outputs, policy_from_args
    from ..driver.driver import DriverResult, Execution, LinuxDriver, WritebackReport
    from ..policy.pack import WORKSPACE
    from ..jails.locations import PLACEHOLDER_JAIL
    from ..jails.workspace import default_state_dir, default_tmp_dir

    if a.pack is None:
        raise SandboxError("--principal: only with --pack")
    if a.jail is not None:
        raise SandboxError("--jail: not with --pack (the pack's wrap.workspace chooses the jail)")
    if a.read_only_jail:
        raise SandboxError("--read-only-jail: not with --pack (the pack's wrap.workspace "
                           "chooses the jail; mode none's is read-only)")
    if not a.pack:
        raise SandboxError("--pack: empty path")
    check_cwd()  # relative file references and the pack path are resolved from it
    # Where jails are made, from the environment, checked before anything is: TMPDIR (every
    # mode: the sweep, the jails of none and ephemeral), the state dir (workspace mode).
    tmp_dir = default_tmp_dir()
    b = copy.copy(a)
    b.jail = PLACEHOLDER_JAIL  # replaced per exec by the driver (never TMPDIR itself)
    policy = policy_from_args(b)
    check_outputs(a, policy)
    from .run_end import open_receipt_dir
    try:  # where the receipt goes, fixed before the command can change the path
        receipt_dir = open_receipt_dir(a.receipt)
    except OSError as e:
        raise SandboxError(f"receipt {printable(a.receipt)}: {e.strerror or e}") from None
    principal = a.principal if a.principal is not None else "default"
    pack = LinuxDriver.load_pack(a.pack)
    # it would widen the next run: protected in this process's runs (hcp_linux.policy.protected)
    from ..policy.protected import protect_file
    protect_file(a.pack)
    state_dir = default_state_dir() if pack.workspace.mode == WORKSPACE else None
    driver = LinuxDriver(policy, state_dir=state_dir, tmp_dir=tmp_dir)

    end = EndOnSignal()
    ex: Execution | None = None
    result: DriverResult | None = None
    failed: WritebackError | None = None
    with end:
        driver.check(pack, argv, principal=principal)
        try:
            ex = driver.prepare(pack, principal=principal)
            result = driver._execute(ex, argv, spawn_guard=end.deferred(then_raise=True))
        except WritebackError as e:
            failed = e
        finally:
            with end.deferred():
                if ex is not None:
                    driver.cleanup(ex)
    if end.signum is not None:
        receipt = None
        if result is not None:
            receipt = dict(result.receipt)
        elif ex is not None and ex.process is not None:
            why = f"ended by {SIGNAL_NAMES.get(end.signum, end.signum)}"
            receipt = driver._receipt(ex, WritebackReport(skipped=why))
        returncode = ex.process.returncode if ex is not None and ex.process else None
        end_by_signal(end.signum, receipt, a.receipt, returncode, receipt_dir)
    if failed is not None:
        assert isinstance(failed.result, DriverResult)
        try:
            _write_receipt(failed.result, a.receipt, receipt_dir)
        except SandboxError:
            pass  # one line: the writeback's, the failure that matters
        raise failed  # main prints its one line; exit 125
    assert result is not None
    _write_receipt(result, a.receipt, receipt_dir)
    if a.explain:
        from ..observe.denials import explain_lines
        for line in explain_lines(result.receipt, result.returncode):
            print(printable(line), file=sys.stderr)
    if result.timed_out:
        print(f"error: sandbox: timed out after {policy.timeout:g}s; the sandbox was killed",
              file=sys.stderr)
        return EXIT_TIMEOUT
    status = result.returncode
    return 128 - status if status < 0 else status


def _write_receipt(result: Any, receipt_to: str | None, receipt_dir: int | None) -> None:
    """The run's receipt with its exit (the command's own status, also when the writeback
    failed: the ``driver.writeback`` entry says what failed), in ``receipt_dir`` (opened
    before the run: hcp_linux.cli.run_end.open_receipt_dir)."""
    if not receipt_to:
        return
    from ..run.receipt import write_receipt
    receipt = dict(result.receipt)
    from ..receipt_keys import set_exit
    set_exit(receipt, result.returncode, result.timed_out)
    try:
        write_receipt(receipt, sys.stderr if receipt_to == "-" else receipt_to, receipt_dir)
    except OSError as e:
        raise SandboxError(f"receipt {printable(receipt_to)}: {e.strerror}") from None
