"""The native executor: one Plan, run by a small C program instead of a forked Python.

The parent serialises the Plan (``plan_bytes``) into a memfd and hands it to ``hcp-exec``,
started with ``posix_spawn`` (vfork + exec: the cost does not grow with the runtime's RSS,
nothing runs in Python after the fork, and it is safe in a multi-threaded runtime) either now
or ahead of time (a *spare*). ``hcp-exec`` performs the steps of :mod:`hcp_linux.ctypes_executor.child` and
reports a failing step over the same close-on-exec error pipe, in the same error record
(:mod:`hcp_linux.protocol`): the parent's mapping to errors, and the degraded-host logic of
:mod:`hcp_linux.sandbox`, are shared with the ctypes executor.

The program is built by ``python -m hcp_linux.native.build`` (``make setup`` runs it when a C
compiler is there) into ``_build/hcp-exec-<digest of the source>``: a binary built from
another version of the source is never used. Without it, ``auto`` (the default) uses the
ctypes executor; ``native`` refuses.

By concern: :mod:`.selection` (which executor ``auto`` picks, the binary and whether to trust
it, the one-time fallback warning), :mod:`.wire` (the plan as hcp-exec reads it),
:mod:`.spares` (hcp-exec started ahead of the plan), :mod:`.build` (compiling hcp-exec);
this module is the spawn that uses them.
"""
from __future__ import annotations

import errno
import os
from typing import TYPE_CHECKING

from ..proc.hcp_spawn import memfd, spawn_hcp_exec
from ..proc.spawner import on_lasting_thread
from ..protocol import RunFds
from . import selection, spares
from .selection import (BUILD_DIR, EXECUTORS, FALLBACK_WARNING, SOURCE, artifact_name,
                        artifact_path, available, binary, check, get_default, selected,
                        set_default, source_digest, status, untrusted)
from .spares import SPARES, set_spares
from .wire import makes_ruleset, plan_bytes, view_bytes

if TYPE_CHECKING:
    from hcp_linux.landlock import CreatedRuleset

    from ..plan.plan import Plan

#: How native spawns went in this process: a ready spare, one started on the spot, or hcp-exec
#: with the plan on its command line (native-local plans, set_spares("never")).
stats = {"ready": 0, "on_the_spot": 0, "direct": 0}


def spawn(executor: str | None, plan: "Plan", fds: RunFds,
          ready_ok: bool = True) -> tuple[int, bool] | None:
    """Start the monitor through hcp-exec, with the run's channels ``fds``: (its pid, whether
    a ready spare took the plan); None: use the ctypes executor.

    A confined plan goes to a spare: a ready one when the pool has it (and ``ready_ok``:
    the caller may refuse one, after a ready spare did not answer), else one started now
    (see :mod:`.spares`). A native-local plan (or any, with ``set_spares("never")``) is
    handed to a fresh hcp-exec on its command line, its fds inherited by number. The
    Landlock ruleset is hcp-exec's to make with a mount view; without one it is made here and
    passed (makes_ruleset).
    """
    if selected(executor) == "ctypes":
        if (executor or get_default()) == "auto":
            selection.warn_fallback()
        return None
    exe = binary()
    if exe is None or not available():
        raise selection.unavailable_error()
    # a copy (0.6 us): create() uses a ruleset up, and a plan is started again when an
    # attempt is abandoned (a spare that did not answer, a helper that died before the exec)
    ruleset = (plan.landlock.copy().create()
               if plan.landlock is not None and not makes_ruleset(plan) else None)
    try:
        return _spawn(executor, exe, plan, fds, ruleset, ready_ok)
    finally:
        if ruleset is not None:
            ruleset.close()


def _spawn(executor: str | None, exe: str, plan: "Plan", fds: RunFds,
           ruleset: "CreatedRuleset | None", ready_ok: bool) -> tuple[int, bool] | None:
    if not plan.confined or spares.mode() == "never":
        stats["direct"] += 1
        pid = _spawn_direct(executor, exe, plan, fds, ruleset)
        return None if pid is None else (pid, False)
    view = view_bytes(plan)
    # A ready spare was started a while ago: it takes this moment's umask from the plan.
    blob = plan_bytes(plan, fds, ruleset, True, view)
    key = spares.spare_key(plan, exe)
    pool = spares.pool()
    spare = pool.take(key, view if "mountns" in plan.layers else None) if ready_ok else None
    if spare is not None:
        if spares.hand_over(spare, blob, fds, ruleset):
            stats["ready"] += 1
            pool.kick()
            return spare.pid, True
        pool.discard(spare)  # it died idle (killed?), or takes no message: start one now
    try:  # from a thread that lasts: the run must not die with the spawning thread
        spare = on_lasting_thread(lambda: spares.make(key + (None,)))
    except OSError as e:
        selection.cannot_exec(executor, exe, e)
        return None
    if spares.hand_over(spare, blob, fds, ruleset):
        stats["on_the_spot"] += 1
        pool.kick()
        return spare.pid, False
    pool.discard(spare)
    from ..errors import ChildSetupError
    raise ChildSetupError("internal", errno.EPIPE, "native executor: hcp-exec exited early")


def _spawn_direct(executor: str | None, exe: str, plan: "Plan", fds: RunFds,
                  ruleset: "CreatedRuleset | None") -> int | None:
    fd = memfd(plan_bytes(plan, fds, ruleset))
    try:
        keep = {*fds.all(), ruleset.fd if ruleset is not None else -1}
        try:  # from a thread that lasts: the run must not die with the spawning thread
            return on_lasting_thread(lambda: spawn_hcp_exec(exe, fd, fds.err, keep))
        except OSError as e:
            selection.cannot_exec(executor, exe, e)
            return None
    finally:
        os.close(fd)


__all__ = ["BUILD_DIR", "EXECUTORS", "FALLBACK_WARNING", "SOURCE", "SPARES", "artifact_name",
           "artifact_path", "available", "binary", "check", "get_default",
           "makes_ruleset", "plan_bytes", "selected", "set_default", "set_spares",
           "source_digest", "spares", "spawn", "stats", "status", "untrusted",
           "view_bytes"]
