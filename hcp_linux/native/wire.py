"""The plan as hcp-exec reads it: little-endian u64 fields and length-prefixed strings,
under the header and flags of :mod:`hcp_linux.protocol`.

A plan has a prepared section (``view_bytes``: what the mount view and the confinement read,
the same for every run of one confinement) inside the whole (``plan_bytes``: the run's fds,
signals, umask, argv and environment). A spare compares the prepared section with the one
it was made for.
"""
from __future__ import annotations

import errno
import os
import struct
import threading
from typing import TYPE_CHECKING

from ..proc.peer import parse_status
from ..protocol import FLAGS, LAYER_FLAGS, LL_FLAGS_SHIFT, PLAN_MAGIC, PLAN_VERSION, RunFds

if TYPE_CHECKING:
    from hcp_linux.landlock import CreatedRuleset

    from ..plan.plan import Plan

u64 = struct.Struct("<Q").pack
_MASK = (1 << 64) - 1


def _str(parts: list[bytes], s: bytes) -> None:
    parts.append(u64(len(s) + 1))
    parts.append(s)
    parts.append(b"\0")


def view_bytes(plan: "Plan") -> bytes:
    """The plan's prepared section: all that building the mount view and the confinement
    that is the same for every run (no_new_privs, capabilities, Landlock, seccomp) read, and
    only that. Two plans with the same section get the same view (inodes included) and the
    same confinement, which is what lets a spare do both ahead of time. Made once per
    confinement and the other fields it reads."""
    F = FLAGS
    vf = (F["MOUNTNS"] * ("mountns" in plan.layers) | F["PROC_FRESH"] * plan.proc_fresh
          | F["PID_MAX"] * (plan.pid_max is not None) | F["HOLDS_SETPCAP"] * plan.holds_setpcap
          | F["SECCOMP"] * (plan.seccomp is not None)
          | F["SECCOMP_LISTENER"] * (plan.seccomp is not None and plan.seccomp_listener)
          | F["LANDLOCK"] * (plan.landlock is not None) | F["PTY"] * plan.pty
          | F["PROXY"] * plan.proxy | _ll_flags(plan))
    bpf = plan.seccomp.bpf if plan.seccomp is not None else b""
    return plan.derived(("view-bytes", vf, plan.pid_max, plan.tmp_options, plan.shm_options,
                         plan.cap_last_cap, bpf, plan.capture_ports, tuple(plan.proc_fences)),
                        lambda: _view_bytes(plan, vf, bpf))


def _ll_flags(plan: "Plan") -> int:
    """landlock_restrict_self's flags, as plan flags."""
    return (plan.landlock_restrict << LL_FLAGS_SHIFT) if plan.landlock is not None else 0


def makes_ruleset(plan: "Plan") -> bool:
    """Whether hcp-exec makes the Landlock ruleset itself (with a mount view: a rule on each
    bind it cloned and checked, then the late rules), so the parent creates none."""
    return plan.landlock is not None and "mountns" in plan.layers


def _landlock_bytes(plan: "Plan") -> list[bytes]:
    """The Landlock part of the prepared section: handled rights, the dir-only rights (taken
    from a rule on a non-directory) and the late rules (for mounts that exist only inside),
    each masked as CreatedRuleset.add_path_fd would."""
    import hcp_linux.landlock as landlock
    ruleset = plan.landlock
    assert ruleset is not None
    requested, handled = int(ruleset.requested_fs), int(ruleset.handled_fs)
    parts = [u64(handled), u64(int(ruleset.handled_net)), u64(int(ruleset.scoped)),
             u64(int(landlock.DIR_ONLY_RIGHTS)), u64(len(plan.late_rules))]
    for path, access in plan.late_rules:
        if not access or access & ~requested:  # what CreatedRuleset.add_path_fd refuses
            from ..errors import ChildSetupError
            raise ChildSetupError("internal", errno.EINVAL,
                                  f"late rule {path!r}: rights not in handled_fs")
        _str(parts, path)
        parts.append(u64(access & handled))
    return parts


def _view_bytes(plan: "Plan", vf: int, bpf: bytes) -> bytes:
    parts = [u64(vf), u64(plan.pid_max or 0)]
    _str(parts, plan.tmp_options)
    _str(parts, plan.shm_options)
    parts.append(u64(len(plan.binds)))
    for bd in plan.binds:
        _str(parts, bd.source)
        _str(parts, bd.target)
        parts += [u64(int(bd.is_dir)), u64(bd.dev & _MASK), u64(bd.ino & _MASK),
                  u64(bd.attrs), u64(bd.access)]
    parts.append(u64(len(plan.masks)))
    for path, is_dir in plan.masks:
        _str(parts, path)
        parts.append(u64(int(is_dir)))
    parts.append(u64(len(plan.symlinks)))
    for link, dest in plan.symlinks:
        _str(parts, link)
        _str(parts, dest)
    parts.append(u64(len(plan.proc_fences)))
    for path, masked in plan.proc_fences:
        _str(parts, path)
        parts.append(u64(int(masked)))
    # egress-capture binds these before a spare drops its capabilities (port 53 and the
    # address on lo need them), so they are part of what a spare is prepared for
    parts.append(u64(len(plan.capture_ports)))
    parts += [u64(port) for port in plan.capture_ports]
    parts += [u64(plan.cap_last_cap), u64(len(bpf)), bpf]
    if plan.landlock is not None:
        parts += _landlock_bytes(plan)
    return b"".join(parts)


def plan_bytes(plan: "Plan", fds: RunFds, ruleset: "CreatedRuleset | None",
               set_umask: bool = False, view: bytes | None = None,
               process: tuple[int, int, int] | None = None) -> bytes:
    """The plan as hcp-exec reads it (little-endian u64 fields, length-prefixed strings),
    with the run's channels ``fds`` by number (the error pipe aside: it travels on hcp-exec's
    command line, or with the plan). Call it in the spawning thread: it records that thread's signal mask, and this moment's
    ignored signals and (``set_umask``: for a spare started a while ago) umask; or, given
    ``process`` (umask, ignored, blocked), those of the process that will start hcp-exec."""
    from ..protocol import DEFAULT_SIGNALS, PROXY_ADDRESS

    if process is None:
        umask, ignored = _process_status()
        blocked = _blocked_signals()
    else:
        umask, ignored, blocked = process
    ignored &= ~sum(1 << (int(s) - 1) for s in DEFAULT_SIGNALS)

    F = FLAGS
    flags = 0
    for layer, bit in LAYER_FLAGS:
        if layer in plan.layers:
            flags |= bit
    flags |= (F["CONFINED"] * plan.confined | F["PROXY"] * plan.proxy
              | F["HOLDS_SETPCAP"] * plan.holds_setpcap | F["PROC_FRESH"] * plan.proc_fresh
              | F["WAIT_FOR_TREE"] * plan.wait_for_tree
              | F["LANDLOCK"] * (plan.landlock is not None)
              | F["CANARY"] * (plan.canary is not None)
              | F["SECCOMP"] * (plan.seccomp is not None)
              | F["SECCOMP_LISTENER"] * (plan.seccomp is not None and plan.seccomp_listener)
              | F["PID_MAX"] * (plan.pid_max is not None) | F["PTY"] * plan.pty
              | _ll_flags(plan))
    host, port = PROXY_ADDRESS
    a, b, c, d = (int(x) for x in host.split("."))
    if (ruleset is not None) == makes_ruleset(plan) and plan.landlock is not None:
        from ..errors import ChildSetupError
        raise ChildSetupError("internal", errno.EINVAL, "native executor: a Landlock ruleset "
                              "is made by hcp-exec with a mount view, by the parent without")
    parts = [u64(PLAN_VERSION << 32 | PLAN_MAGIC)]
    parts += [u64(v & _MASK) for v in (
        flags, plan.parent_pid, plan.uid, plan.gid,
        *fds.stdio, ruleset.fd if ruleset is not None else -1, fds.proxy,
        fds.done, fds.notify, a << 24 | b << 16 | c << 8 | d, port, umask if set_umask else -1, ignored,
        blocked)]
    for s in (plan.cwd, plan.exe, os.fsencode(plan.canary) if plan.canary is not None else b"/"):
        _str(parts, s)
    if view is None:
        view = view_bytes(plan)
    parts += [u64(len(view)), view, u64(len(plan.rlimits))]
    for res, limit in plan.rlimits:
        parts += [u64(res), u64(limit & _MASK)]
    parts.append(u64(len(plan.argv)))
    for arg in plan.argv:
        _str(parts, arg)
    parts.append(u64(len(plan.env)))
    for key, value in plan.env.items():
        if not key or b"=" in key:  # what os.execve refuses
            from ..errors import ChildSetupError
            raise ChildSetupError("internal", errno.EINVAL,
                                  f"illegal environment variable name {key!r}")
        _str(parts, key + b"=" + value)
    return b"".join(parts)



def _process_status() -> tuple[int, int]:
    """(umask, ignored signals) of this process, from one read of /proc/self/status: the
    umask read without changing it (os.umask would, for every thread); the ignored signals
    (bit n-1 for signal n) that a fork would pass on, which hcp-exec gives the command
    whenever its spare was started. (-1, 0) if unreadable. The file stays open (a pread
    regenerates it); a forked child opens its own."""
    global _status_fd
    umask, ignored = -1, 0
    try:
        if _status_fd < 0:
            with _status_lock:
                if _status_fd < 0:
                    _status_fd = os.open("/proc/self/status", os.O_RDONLY | os.O_CLOEXEC)
        fields = parse_status(os.pread(_status_fd, 8192, 0), "Umask", "SigIgn")
        umask, ignored = int(fields["Umask"], 8), int(fields["SigIgn"], 16)
    except (OSError, ValueError, KeyError):
        pass
    return umask, ignored


_status_fd = -1
_status_lock = threading.Lock()


def _forget_status_fd() -> None:
    """In a forked child: /proc/self was resolved to the parent when the fd was opened."""
    global _status_fd, _status_lock
    if _status_fd >= 0:
        try:
            os.close(_status_fd)
        except OSError:
            pass
    _status_fd, _status_lock = -1, threading.Lock()


os.register_at_fork(after_in_child=_forget_status_fd)


def _blocked_signals() -> int:
    """The calling thread's signal mask, as a fork from it would have it."""
    import signal
    return sum(1 << (int(s) - 1) for s in signal.pthread_sigmask(signal.SIG_BLOCK, ()))

