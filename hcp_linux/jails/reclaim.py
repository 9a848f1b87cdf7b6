"""Who owns a driver temp file or ephemeral jail, so that what a dead runtime left can go.

Why this exists: a runtime killed with SIGKILL (the OOM killer, a supervisor's timeout, a
crash) runs no cleanup. It leaves ``.NAME.hcp-….tmp`` files beside the user's destinations
and whole ephemeral jails (with staged outputs and copies of input files) in the temp dir.
A later process may remove them only if it can tell that their owner is dead: a live run's
jail and temp files are in use, and removing them would break that run.

So every such name carries its owner's identity, ``<pid>-<start>-<pidns>``:

- ``pid``: the owner's process id;
- ``start``: that process's start time (field 22 of ``/proc/PID/stat``, clock ticks since
  boot), so that a pid recycled by a later process is never taken for the owner;
- ``pidns``: the inode of the owner's pid namespace. A pid means nothing in another pid
  namespace, so an entry made in another one is never judged, hence never removed.

An owner is *gone* when no process has its pid, or the process with its pid started at
another time. Anything we cannot read for certain counts as alive: reclaiming is best effort
and fails closed. Only names matching our exact patterns are considered, only entries of our
own uid, and never through a symlink (``lstat`` and ``unlinkat`` relative to a directory fd).
The jail sweep itself lives in :mod:`hcp_linux.jails.workspace`, which knows the jail layout.
"""
from __future__ import annotations

import ctypes
import errno
import os
import re
import secrets
import stat
from typing import Callable
from dataclasses import dataclass, field

__all__ = ["owner_id", "owner_gone", "jail_name", "temp_name", "JAIL_RE", "TEMP_RE",
           "Sweep", "sweep_temps", "renameat2", "RENAME_NOREPLACE", "RENAME_EXCHANGE"]

_ID = r"([1-9][0-9]{0,9})-([0-9]{1,20})-([1-9][0-9]{0,19})"
#: ``hcp-linux-<mode>-<pid>-<start>-<pidns>-<12 hex>``: an ephemeral (or mode none) jail's
#: parent directory in the temp dir, a Ray sandbox's jail (hcp_linux.ray) in its root, or a
#: framework sample's jail (hcp_linux.integrations.box).
JAIL_RE = re.compile(rf"hcp-linux-(ephemeral|none|ray|box)-{_ID}-[0-9a-f]{{12}}")
#: ``.<name>.hcp-<pid>-<start>-<pidns>-<12 hex>.tmp`` (a new file being written) or
#: ``.old`` (a destination's previous content, kept until every output is in place).
TEMP_RE = re.compile(rf"\..+\.hcp-{_ID}-[0-9a-f]{{12}}\.(?:tmp|old)", re.DOTALL)
#: Bytes of the destination's name kept in a temp name (the rest of it takes up to ~70).
_NAME_BYTES = 160

_self: tuple[int, str] | None = None  # (pid, identity), recomputed after a fork


def _stat_start(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat; None when no process has that pid; -1 when unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except (FileNotFoundError, ProcessLookupError):
        # Also what hidepid=invisible shows for a process we may not see: ask the kernel.
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except OSError:
            return -1  # EPERM: it exists
        return -1
    except OSError:
        return -1
    # "pid (comm) state ppid ...": comm may hold spaces and ')', so split after the last ')'.
    fields = data[data.rfind(b")") + 2:].split()
    try:
        return int(fields[19])  # field 22; fields[0] is field 3
    except (IndexError, ValueError):
        return -1


_ns: tuple[int, int] | None = None  # (pid, pid namespace inode)


def _pidns() -> int:
    """The inode of our pid namespace (0: unknown). It never changes for a process, only a
    forked child may be in another: cached per pid."""
    global _ns
    pid = os.getpid()
    if _ns is None or _ns[0] != pid:
        try:
            _ns = (pid, os.stat("/proc/self/ns/pid").st_ino)
        except OSError:
            return 0
    return _ns[1]


def owner_id() -> str:
    """This process's identity, ``<pid>-<start>-<pidns>`` (all decimal).

    Without a readable /proc it is ``<pid>-0-0``, which no sweep will ever judge (its pid
    namespace is unknown), so such entries are never reclaimed: fail closed."""
    global _self
    pid = os.getpid()
    if _self is None or _self[0] != pid:
        start, ns = _stat_start(pid), _pidns()
        if start is None or start < 0 or ns == 0:
            start, ns = 0, 0
        _self = (pid, f"{pid}-{start}-{ns}")
    return _self[1]


def owner_gone(pid: int, start: int, ns: int) -> bool:
    """Whether the owner named by an entry is certainly dead (see the module's docstring)."""
    if ns == 0 or ns != _pidns():
        return False  # another (or an unknown) pid namespace: its pids mean nothing here
    now = _stat_start(pid)
    return now is None or (now >= 0 and now != start)


def _owner_of(match: re.Match[str]) -> tuple[int, int, int]:
    pid, start, ns = match.group(match.re.groups - 2, match.re.groups - 1, match.re.groups)
    return int(pid), int(start), int(ns)


def jail_name(mode: str) -> str:
    """A fresh name for an ephemeral jail's directory in the temp dir."""
    return f"hcp-linux-{mode}-{owner_id()}-{secrets.token_hex(6)}"


def temp_name(dest_name: str, suffix: str = "tmp") -> str:
    """A fresh hidden name beside ``dest_name``: ``tmp`` for new content, ``old`` for the
    destination's previous content (kept until every output of the run is in place). Any
    other suffix (``kept``: content that could not be put back) is never swept."""
    short = os.fsdecode(os.fsencode(dest_name)[:_NAME_BYTES])
    return f".{short}.hcp-{owner_id()}-{secrets.token_hex(6)}.{suffix}"


def jail_owner(name: str) -> tuple[int, int, int] | None:
    """(pid, start, pidns) of a jail directory name of ours, else None."""
    m = JAIL_RE.fullmatch(name)
    return _owner_of(m) if m else None


def temp_owner(name: str) -> tuple[int, int, int] | None:
    """(pid, start, pidns) of a temp file name of ours, else None."""
    m = TEMP_RE.fullmatch(name)
    return _owner_of(m) if m else None


@dataclass
class Sweep:
    """What a sweep removed (or, dry, would remove), and what it could not, with why."""

    removed: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)

    def add(self, other: "Sweep") -> None:
        self.removed += other.removed
        self.failed += other.failed


def sweep_dead(dir_fd: int, dir_path: str,
               owner_of: Callable[[str], "tuple[int, int, int] | None"], is_kind: Callable[[int], bool], remove: Callable[[str], None], *,
               dry_run: bool = False) -> Sweep:
    """The one sweep: in one directory, each entry whose name ``owner_of`` parses (our exact
    patterns only), of the kind ``is_kind`` accepts (``stat.S_ISREG``, ``stat.S_ISDIR``:
    ``fstatat`` without following, so never a symlink), of our uid, whose owner is gone, is
    passed to ``remove`` (by name, relative to ``dir_fd``). Errors are recorded, never
    raised; a name gone meanwhile (another sweeper) is skipped."""
    out = Sweep()
    uid = os.geteuid()
    try:
        with os.scandir(dir_fd) as it:
            names = [e.name for e in it]
    except OSError as e:
        out.failed.append((dir_path, os.strerror(e.errno or errno.EIO)))
        return out
    for name in names:
        owner = owner_of(name)
        if owner is None:
            continue
        path = os.path.join(dir_path, name)
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if not is_kind(st.st_mode) or st.st_uid != uid or not owner_gone(*owner):
                continue
            if not dry_run:
                remove(name)
        except FileNotFoundError:
            continue
        except OSError as e:
            out.failed.append((path, os.strerror(e.errno or errno.EIO)))
            continue
        out.removed.append(path)
    return out


def sweep_temps(dir_fd: int, dir_path: str, *, dry_run: bool = False) -> Sweep:
    """Remove our temp files in one directory whose owner is gone: regular files named by
    :data:`TEMP_RE`, removed with ``unlinkat`` relative to ``dir_fd`` (nothing outside the
    directory can be reached)."""
    return sweep_dead(dir_fd, dir_path, temp_owner, stat.S_ISREG,
                      lambda name: os.unlink(name, dir_fd=dir_fd), dry_run=dry_run)


# --- renameat2(2): glibc >= 2.28 wraps it; the os module does not --------------------------

RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
_libc = ctypes.CDLL(None, use_errno=True)
_renameat2 = getattr(_libc, "renameat2", None)
if _renameat2 is not None:
    _renameat2.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                           ctypes.c_uint)
    _renameat2.restype = ctypes.c_int


def renameat2(old_dir: int, old: str, new_dir: int, new: str, flags: int) -> None:
    """``renameat2``; OSError on failure (EINVAL: the file system does not support
    ``flags``; ENOSYS: neither does the kernel or libc)."""
    if _renameat2 is None:
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))
    if _renameat2(old_dir, os.fsencode(old), new_dir, os.fsencode(new), flags) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), new)
