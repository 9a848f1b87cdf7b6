"""Starting hcp-exec: the plan in a memfd, posix_spawn, and the hard limits a plan is
clamped to. Used by the native executor and by the client of `hcp-linux serve`; imports
nothing of the package.
"""
from __future__ import annotations

import os


def hard_limits() -> bytes:
    """This process's hard limits, which a plan's rlimits are clamped to (Limits.rlimits):
    a server serves a client only when they are the same."""
    import resource
    return b",".join(b"%s=%d" % (name.encode(), resource.getrlimit(getattr(resource, name))[1])
                     for name in sorted(dir(resource)) if name.startswith("RLIMIT_"))


def memfd(blob: bytes) -> int:
    """A close-on-exec memfd holding ``blob`` (a plan, a view template)."""
    fd = os.memfd_create("hcp-plan", os.MFD_CLOEXEC)
    try:
        view = memoryview(blob)
        while view:
            view = view[os.write(fd, view):]
    except BaseException:
        os.close(fd)
        raise
    return fd


def spawn_hcp_exec(exe: "str | bytes", plan_fd: int, err_w: int, keep: "set[int]") -> int:
    """hcp-exec with the plan on its command line (``hcp-exec PLAN_FD ERR_FD``), started
    with posix_spawn; the fds in ``keep`` (and those two) are inherited by number, 0-2 as
    they are. OSError as posix_spawn raises it."""
    actions = [(os.POSIX_SPAWN_DUP2, k, k) for k in sorted(keep | {plan_fd, err_w}) if k > 2]
    return os.posix_spawn(exe, ["hcp-exec", str(plan_fd), str(err_w)], {},
                          file_actions=actions)
