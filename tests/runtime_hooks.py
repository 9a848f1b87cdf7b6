"""What only the tests (and bench/landlock_audit.py) do to the runtime's state.

The runtime never does these itself, so they live here rather than in ``hcp_linux``: turn the
host's audit on or off and make the next run read that afresh; put a spare first in the
pool's line; make this process see another hcp-exec, or none. Each touches the state its
module keeps, by name, as that module would.

From a shell, to turn host audit off again after an interrupted test or bench (as root)::

    .venv/bin/python tests/runtime_hooks.py audit 0
"""
from __future__ import annotations

import struct
import sys
import time

from hcp_linux.native import selection, spares
from hcp_linux.observe import audit, landlock_log

#: struct audit_status as AUDIT_SET takes it: mask, enabled, failure, pid, rate_limit,
#: backlog_limit, lost, backlog, backlog_wait_time, backlog_wait_time_actual.
_STATUS_SET = struct.Struct("=10I")
_STATUS_ENABLED = 1  # AUDIT_STATUS_ENABLED: the mask bit of ``enabled``


def set_audit(value: int) -> None:
    """AUDIT_SET enabled=``value`` (0 off, 1 on). OSError EPERM without CAP_AUDIT_CONTROL.
    The runtime may have read audit's state less than landlock_log.RECHECK ago: call
    :func:`audit_changed` for its next run to see the change."""
    audit._exchange(audit.AUDIT_SET, _STATUS_SET.pack(_STATUS_ENABLED, value, *(0,) * 8))


def audit_changed() -> None:
    """Audit's state was changed by this process: the next run reads it afresh rather than
    trusting the status landlock_log read less than RECHECK ago."""
    landlock_log._last_at = float("-inf")


def put_spare(pool: spares.Pool, kind: tuple, spare: spares.Spare) -> None:
    """Make ``spare`` (made by hand, :func:`hcp_linux.native.spares.make`) the next one
    ``pool.take`` hands out for ``kind``, and keep the kind wanted (else the keeper would
    retire it as unwanted)."""
    with pool.cond:
        pool.wanted[kind] = time.monotonic()
        pool.idle.setdefault(kind, []).insert(0, spare)


def set_binary(path: "str | None | bool" = False) -> None:
    """Forget the hcp-exec this process looked up, and a failed exec of it: look again on
    next use (False), or take ``path`` as this process's hcp-exec (None: there is none)."""
    with selection._lock:
        selection._binary, selection._broken = path, None
        selection._missing = "" if path else "no binary (reset)"


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "audit" or sys.argv[2] not in ("0", "1"):
        sys.exit("usage: python tests/runtime_hooks.py audit 0|1")
    set_audit(int(sys.argv[2]))
