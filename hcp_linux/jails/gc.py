"""``hcp-linux gc [--dry-run] [--tmp-dir DIR] [--state-dir DIR] [PATH...]``: reclaim on demand.

A runtime killed with SIGKILL leaves what its cleanup would have removed. Every driver run
already sweeps the temp dir's dead jails before it starts, and a writeback sweeps the
directory it writes to; this does the same on demand, and for places no run visits again:

- ephemeral jails in the temp dir whose owner process is gone (hcp_linux.jails.reclaim);
- the driver's staging dir (``.hcp-io``) in persistent workspaces whose lock is free;
- temp files beside outputs (``.NAME.hcp-….tmp``/``.old``) in each PATH given;
- the protected names' sweeps owed by runs whose runtime died (what their commands made at
  a missing protected name is moved aside: hcp_linux.policy.protected.pending; not with
  ``--dry-run``, and every run's lookup does it too).

Entries of live runs, of other uids, not matching our exact names, or symlinks are never
touched. Prints each path removed (with ``--dry-run``: that would be), one per line; each
failure is one ``error: sandbox: gc PATH: CAUSE`` line, and the exit status is then 125.
"""
from __future__ import annotations

import os
import sys
from typing import Sequence

from ..errors import EXIT_REFUSED, SandboxError, printable
from .reclaim import Sweep, sweep_temps
from .workspace import sweep_jails, sweep_workspaces


def gc(paths: Sequence[str], *, tmp_dir: str | None = None, state_dir: str | None = None,
       workspaces: bool = True, dry_run: bool = False) -> int:
    """Sweep and report; 0, or 125 when something could not be removed. ``workspaces``:
    False when there can be none to sweep (no state dir)."""
    fds: list[tuple[str, int]] = []
    try:
        for path in paths:  # every PATH checked before anything is removed
            try:
                fds.append((path, os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)))
            except OSError as e:
                raise SandboxError(f"gc {printable(path)}: {e.strerror}") from None
        done = Sweep()
        done.add(sweep_jails(tmp_dir, dry_run=dry_run))
        if workspaces:
            done.add(sweep_workspaces(state_dir, dry_run=dry_run))
        for path, fd in fds:
            done.add(sweep_temps(fd, os.path.abspath(path), dry_run=dry_run))
        if not dry_run:
            from ..policy.protected.pending import collect
            for path, what in collect().items():
                if what.startswith("failed"):
                    done.failed.append((path, what))
                else:
                    done.removed.append(path)
    finally:
        for _, fd in fds:
            os.close(fd)
    for path in done.removed:
        print(printable(path))
    for path, cause in done.failed:
        print(f"error: sandbox: gc {printable(path)}: {printable(cause)}", file=sys.stderr)
    return EXIT_REFUSED if done.failed else 0
