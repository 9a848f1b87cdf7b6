"""Where a pack's process may write: the jail of each workspace mode (HCP §10.6).

- ``ephemeral``: a fresh, private (0700) directory per exec under the temp dir, removed in
  cleanup whatever happened to the child. Its name carries the owner's identity
  (:mod:`hcp_linux.jails.reclaim`), so one left by a runtime that was killed is removed by a later
  sweep (:func:`sweep_jails`, run at the start of every driver run, and ``hcp-linux gc``).
- ``none``: the jail is the pack root itself (HCP §10.6: "none — pack root"), granted
  read-only (``Policy.read_only_jail``), so the pack's own executables stay unwritable. What
  the run may write goes to a fresh private *scratch* directory made, named and reclaimed
  exactly like an ephemeral jail: the driver's staging (``.hcp-io``) and the ``home_env``
  keys. (Why read-only: docs/driver.md, decision 1.)
- ``workspace``: a persistent directory per (pack, principal) under the state dir
  (``$XDG_STATE_HOME/hcp-linux`` or ``~/.local/state/hcp-linux``). Concurrent execs in one
  workspace are serialised by ``flock`` on a lock file kept *beside* the jail, not in it: the
  child can write anywhere in its jail and could otherwise delete or swap the lock.

Paths below the state dir are created one component at a time and checked with ``lstat``:
every one must be a real directory owned by us, so a planted symlink cannot move a workspace
elsewhere. Where the state dir and the temp dir are, and what makes either acceptable:
:mod:`hcp_linux.jails.locations`.
"""
from __future__ import annotations

import errno
import fcntl
import os
import stat
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping

from ..errors import PolicyError, SandboxError, printable
from .locations import (check_state_dir, check_tmp_dir, default_state_dir, default_tmp_dir,
                        make_jail_home)
from ..policy.pack import EPHEMERAL, NONE, WORKSPACE, Pack
from .reclaim import RENAME_NOREPLACE, Sweep, jail_name, jail_owner, renameat2, sweep_dead
from ..runtime_files import jail_home, private_directory_problem

__all__ = ["Workspace", "WorkspaceBusyError", "check_principal", "default_state_dir",
           "default_tmp_dir", "check_state_dir", "check_tmp_dir",
           "open_workspace", "remove_tree", "snapshot", "diff_snapshots", "DEFAULT_PRINCIPAL",
           "IO_DIR", "ENGINE_TMP_DIR", "sweep_jails", "sweep_workspaces"]

#: The principal of a workspace-mode exec when the caller names none.
DEFAULT_PRINCIPAL = "default"
#: The driver's staging directory inside a jail (host inputs copied in, outputs staged).
IO_DIR = ".hcp-io"
#: The engine's private tmp inside the jail when there is no mount namespace.
ENGINE_TMP_DIR = ".hcp-tmp"
#: Walking a workspace to list new files stops here (the listing is then "unknown").
SNAPSHOT_LIMIT = 100_000
#: ... and at a path longer than this (bytes; PATH_MAX: no tool opens it by name). It also
#: bounds what a listing of a very deep tree may hold.
SNAPSHOT_PATH_MAX = 4096

_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-@+")


class WorkspaceBusyError(SandboxError):
    """Another exec held the workspace's lock for longer than the caller would wait."""


class _Cancelled(Exception):
    """Lock acquisition was abandoned because the caller was cancelled."""


def check_principal(name: object) -> str:
    """A principal name is one path component: refuse anything that could leave its dir."""
    if not isinstance(name, str):
        raise PolicyError(f"principal: expected a string, got {type(name).__name__}")
    if not name:
        raise PolicyError("principal: empty name")
    if name in (".", ".."):
        raise PolicyError(f"principal {name!r}: not a name")
    if "/" in name or "\\" in name:
        raise PolicyError(f"principal {name!r}: contains a path separator")
    if "\0" in name:
        raise PolicyError("principal: contains a NUL byte")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        raise PolicyError(f"principal {name!r}: contains a control character")
    if len(name.encode("utf-8", "surrogatepass")) > 128:
        raise PolicyError("principal: longer than 128 bytes")
    return name


def _component(text: str) -> str:
    """A name as one safe directory component (injective: % is escaped too)."""
    out = "".join(c if c in _SAFE else "".join(f"%{b:02X}" for b in c.encode("utf-8"))
                  for c in text)
    if out in (".", ".."):
        out = out.replace(".", "%2E")
    return out[:200]


@dataclass(eq=False)
class Workspace:
    """The jail of one exec. ``release()`` unlocks it and removes what this exec made.

    ``jail``: the working directory (in mode ``none`` the pack root, read-only).
    ``scratch``: where the run writes besides its private /tmp, and where the driver
    stages its I/O: the jail itself, but in mode ``none`` a fresh private directory.
    ``owned``: the directory made for this exec alone, removed by :meth:`release` (None for a
    persistent workspace)."""

    mode: str
    jail: str
    persistent: bool
    principal: str
    scratch: str = ""
    owned: str | None = None
    lock_path: str | None = None
    _lock_fd: int | None = field(default=None, repr=False)
    _released: bool = field(default=False, repr=False)
    _mutex: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        if not self.scratch:
            self.scratch = self.jail

    @property
    def read_only(self) -> bool:
        """True when the jail is granted read-only (mode ``none``: the pack root)."""
        return self.mode == NONE

    def release(self) -> None:
        """Idempotent; safe to call from any thread."""
        with self._mutex:
            if self._released:
                return
            self._released = True
            try:
                if self.owned is not None:
                    remove_tree(self.owned)
            finally:
                if self._lock_fd is not None:
                    os.close(self._lock_fd)  # closing the description drops the flock
                    self._lock_fd = None

    @property
    def released(self) -> bool:
        return self._released


def open_workspace(pack: Pack, principal: str, *, state_dir: str | None = None,
                   tmp_dir: str | None = None, lock_timeout: float | None = None,
                   cancel: threading.Event | None = None) -> Workspace:
    """Allocate the jail for one exec of ``pack`` in its declared mode.

    For ``workspace`` mode this blocks until the workspace's lock is free (or ``lock_timeout``
    seconds pass: :class:`WorkspaceBusyError`; or ``cancel`` is set).
    """
    check_principal(principal)
    mode = pack.workspace.mode
    if mode in (NONE, EPHEMERAL):
        parent = _new_jail_parent(mode, tmp_dir)
        try:
            # none: the pack root is the (read-only) jail; only the scratch is made here
            scratch = os.path.join(parent, "scratch" if mode == NONE else "jail")
            os.mkdir(scratch, 0o700)
        except BaseException as e:
            remove_tree(parent)
            if isinstance(e, OSError):
                raise _cannot_make(os.path.dirname(parent), e) from None
            raise
        return Workspace(mode=mode, jail=pack.root if mode == NONE else scratch,
                         persistent=False, principal=principal, scratch=scratch, owned=parent)
    assert mode == WORKSPACE
    root = (check_state_dir(state_dir, f"state_dir {state_dir}") if state_dir
            else default_state_dir())
    os.makedirs(root, mode=0o700, exist_ok=True)
    pack_dir = _private_dir(_private_dir(root, "workspaces"), _component(pack.key))
    lock_path = os.path.join(pack_dir, _component(principal) + ".lock")
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        _acquire(fd, lock_path, lock_timeout, cancel)
        jail = _private_dir(pack_dir, _component(principal))
    except BaseException:
        os.close(fd)
        raise
    return Workspace(mode=mode, jail=jail, persistent=True, principal=principal,
                     lock_path=lock_path, _lock_fd=fd)


def _new_jail_parent(mode: str, tmp_dir: str | None) -> str:
    """A fresh 0700 directory ``<tmp>/hcp-linux-jails-UID/hcp-linux-<mode>-<owner>-<rand>``:
    in the user's jail home (:func:`~hcp_linux.jails.locations.make_jail_home`: no other
    run reaches it), named for the process that owns it, so that a later sweep can reclaim
    it once that process is gone."""
    base = default_tmp_dir() if tmp_dir is None else check_tmp_dir(tmp_dir, f"tmp_dir {tmp_dir}")
    try:
        home = make_jail_home(base)
    except OSError as e:  # ENOSPC, EDQUOT, EROFS...: this run cannot have a jail
        raise _cannot_make(base, e) from None
    for _ in range(100):
        path = os.path.join(home, jail_name(mode))
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            continue
        except OSError as e:  # ENOSPC, EDQUOT, EROFS, EMFILE...: this run cannot have a jail
            raise _cannot_make(home, e) from None
        return path
    raise FileExistsError(errno.EEXIST, "no unused jail name", home)


def _cannot_make(base: str, e: OSError) -> SandboxError:
    """One line for a jail that cannot be made in ``base`` (a full or read-only file
    system, a quota): the directory, why, and the remedy. Nothing is left behind."""
    why = os.strerror(e.errno) if e.errno else str(e)
    return SandboxError(f"jail: cannot make a directory in {printable(base)}: {why}; free "
                        f"space there or set TMPDIR to a directory with room")


def sweep_jails(tmp_dir: str | None = None, *, dry_run: bool = False) -> Sweep:
    """Remove the ephemeral jails in ``tmp_dir`` whose owner process is gone: those in the
    user's jail home there, and those an earlier version made in ``tmp_dir`` itself.

    One ``scandir`` of each; only names matching :data:`~hcp_linux.jails.reclaim.JAIL_RE`,
    only real directories (``lstat``) of our uid, whose owner is certainly dead. A jail is
    first *claimed*: renamed (``RENAME_NOREPLACE``, in place) to a jail name owned by this
    process, so a concurrent sweep sees a live owner and leaves it, and a sweep killed half-way
    leaves a name the next one reclaims. Errors are recorded, never raised, but for a bad
    ``TMPDIR`` (PolicyError, naming it, before anything is touched). A jail home that is not
    this user's alone is not looked in.
    """
    out = Sweep()
    base = tmp_dir if tmp_dir is not None else default_tmp_dir()
    home = jail_home(base)
    out.add(_sweep_jails_in(base, dry_run))
    if private_directory_problem(home) is None and os.path.isdir(home):
        out.add(_sweep_jails_in(home, dry_run))
    return out


def _sweep_jails_in(where: str, dry_run: bool) -> Sweep:
    """sweep_jails in one directory: each dead owner's jail claimed, then removed."""
    try:
        dfd = os.open(where, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        out = Sweep()
        out.failed.append((where, os.strerror(e.errno or errno.EIO)))
        return out
    try:
        return sweep_dead(dfd, where, jail_owner, stat.S_ISDIR,
                          lambda name: remove_tree(os.path.join(where, _claim(dfd, name))),
                          dry_run=dry_run)
    finally:
        os.close(dfd)


def _claim(dfd: int, name: str) -> str:
    """Rename a dead owner's jail to a name of ours (its mode kept); the new name."""
    mine = jail_name(name.split("-")[2])
    try:
        renameat2(dfd, name, dfd, mine, RENAME_NOREPLACE)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOSYS):  # EINVAL: the fs lacks the flag
            raise
        os.rename(name, mine, src_dir_fd=dfd, dst_dir_fd=dfd)  # mine is fresh: no replace
    return mine


def sweep_workspaces(state_dir: str | None = None, *, dry_run: bool = False) -> Sweep:
    """Remove the driver's staging dir (``.hcp-io``) left in persistent workspaces by a run
    that died, in each workspace whose lock is free (taken without waiting, held meanwhile:
    a live run keeps its lock, so its staging is never touched). The next run in a workspace
    clears it too; this is for workspaces nobody runs in any more."""
    out = Sweep()
    if not state_dir:  # a bad XDG_STATE_HOME or HOME: PolicyError, naming it
        state_dir = default_state_dir()
    root = os.path.join(os.path.abspath(state_dir), "workspaces")
    uid = os.geteuid()
    try:
        packs = sorted(os.listdir(root))
    except FileNotFoundError:
        return out
    except OSError as e:
        out.failed.append((root, os.strerror(e.errno or errno.EIO)))
        return out
    for pack in packs:
        pack_dir = os.path.join(root, pack)
        try:
            st = os.lstat(pack_dir)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid:
                continue
            locks = sorted(n for n in os.listdir(pack_dir) if n.endswith(".lock"))
        except OSError as e:
            out.failed.append((pack_dir, os.strerror(e.errno or errno.EIO)))
            continue
        for lock in locks:
            _sweep_one_workspace(os.path.join(pack_dir, lock[:-len(".lock")]), uid, dry_run,
                                 out)
    return out


def _sweep_one_workspace(jail: str, uid: int, dry_run: bool, out: Sweep) -> None:
    io = os.path.join(jail, IO_DIR)
    try:
        fd = os.open(jail + ".lock", os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        out.failed.append((jail + ".lock", os.strerror(e.errno or errno.EIO)))
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # a run is using it
        jst = os.lstat(jail)
        if not stat.S_ISDIR(jst.st_mode) or jst.st_uid != uid:
            return
        st = os.lstat(io)
        if st.st_uid != uid:
            return
        if not dry_run:
            if stat.S_ISDIR(st.st_mode):
                remove_tree(io)
            else:
                os.unlink(io)
        out.removed.append(io)
    except FileNotFoundError:
        pass
    except OSError as e:
        out.failed.append((io, os.strerror(e.errno or errno.EIO)))
    finally:
        os.close(fd)


def _private_dir(parent: str, name: str) -> str:
    """``parent/name`` as a real directory (not a symlink) owned by us; created 0700."""
    path = os.path.join(parent, name)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise PolicyError(f"workspace {path}: not a directory (a symlink or file is in the way)")
    if st.st_uid != os.geteuid():
        raise PolicyError(f"workspace {path}: owned by uid {st.st_uid}, not by us")
    return path


def _acquire(fd: int, path: str, timeout: float | None, cancel: threading.Event | None) -> None:
    if timeout is None and cancel is None:
        fcntl.flock(fd, fcntl.LOCK_EX)  # a signal (^C) interrupts it
        return
    deadline = None if timeout is None else time.monotonic() + timeout
    delay = 0.002
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        if cancel is not None and cancel.is_set():
            raise _Cancelled()
        if deadline is not None and time.monotonic() >= deadline:
            raise WorkspaceBusyError(f"workspace lock {path}: still held by another run "
                                     f"after {timeout:g}s")
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


#: A directory is opened by descriptor, relative to its parent, never through a symlink.
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: Directory fds a walk keeps open: the deepest levels. Above them a walk climbs back with
#: ``..``, checked to be the directory it left, so a tree of any depth takes this many fds.
_FD_WINDOW = 32


class _Moved(OSError):
    """A directory was moved while a walk was in it (its ``..`` is not where it was)."""


@dataclass(eq=False)
class _Level:
    """One directory on a walk's stack: its fd (None once out of the window), its identity,
    its path below the top, its name in its parent, the subdirectories left to enter."""

    fd: int | None
    ident: tuple[int, int]
    rel: str
    name: str
    todo: list[str] = field(default_factory=list)


def _walk(fd: int, visit: Callable[[int, str], list[str]],
          open_child: Callable[[int, str], int | None],
          leave: Callable[[int, str], None] | None = None) -> None:
    """Walk the tree below the directory ``fd`` (taken over, closed here) with an explicit
    stack, never recursing, whatever its depth: ``visit(dir_fd, rel)`` once per directory
    (``rel``: its path below the top, "" for the top) returns the names of the
    subdirectories to enter, each opened by ``open_child(dir_fd, name)`` (None: skip it);
    ``leave(dir_fd, name)`` once a subdirectory is done. Only the deepest
    :data:`_FD_WINDOW` levels keep their fds; the walk climbs back above them through
    ``..``, and raises :class:`_Moved` if that is not the directory it came down from."""
    try:
        st = os.fstat(fd)
    except BaseException:
        os.close(fd)
        raise
    stack = [_Level(fd, (st.st_dev, st.st_ino), "", "")]
    try:
        stack[0].todo = visit(fd, "")[::-1]
        while True:
            top = stack[-1]
            assert top.fd is not None
            if top.todo:
                name = top.todo.pop()
                child = open_child(top.fd, name)
                if child is None:
                    continue
                rel = f"{top.rel}/{name}" if top.rel else name
                stack.append(_Level(child, (0, 0), rel, name))
                cst = os.fstat(child)
                stack[-1].ident = (cst.st_dev, cst.st_ino)
                if len(stack) > _FD_WINDOW:
                    out = stack[-_FD_WINDOW - 1]
                    if out.fd is not None:
                        old, out.fd = out.fd, None
                        os.close(old)
                stack[-1].todo = visit(child, rel)[::-1]
                continue
            if len(stack) == 1:
                return
            parent = stack[-2]
            if parent.fd is None:
                parent.fd = os.open("..", _DIR_FLAGS, dir_fd=top.fd)
                ust = os.fstat(parent.fd)
                if (ust.st_dev, ust.st_ino) != parent.ident:
                    raise _Moved(errno.ESTALE, "moved while it was walked", parent.rel or ".")
            stack.pop()
            done, top.fd = top.fd, None
            os.close(done)
            if leave is not None:
                leave(parent.fd, top.name)
    finally:
        for level in stack:
            if level.fd is not None:
                os.close(level.fd)


def remove_tree(path: str) -> None:
    """Remove a jail the child may have left unfriendly (directories chmod 000), to any
    depth (an explicit stack: :func:`_walk`).

    Every directory is opened by descriptor relative to its parent with ``O_NOFOLLOW``;
    symlinks are unlinked, never followed. A directory without owner rights gets them back
    by descriptor (``fchmod``, or ``chmod`` of ``/proc/self/fd/N`` of an ``O_PATH`` fd:
    :func:`_open_for_removal`), so a symlink swapped in cannot redirect a chmod. A missing
    ``path`` is not an error; a symlink or a non-directory at ``path`` is (``OSError``, as
    ``shutil.rmtree`` says), and so is anything that could not be removed.
    """
    path = os.path.abspath(path)
    parent, name = os.path.split(path)
    if not name:
        raise OSError(errno.EBUSY, "not removing the root directory", path)
    try:
        pfd = os.open(parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        try:
            st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
        except FileNotFoundError:
            return
        if stat.S_ISLNK(st.st_mode):
            raise OSError(errno.ELOOP, "Cannot call rmtree on a symbolic link", path)
        if not stat.S_ISDIR(st.st_mode):
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
        try:
            fd = _open_for_removal(pfd, name)
        except FileNotFoundError:
            return
        try:
            _walk(fd, _clear_files, _open_child_for_removal, _rmdir)
        except _Moved as e:  # name the directory in full: the walk knows it relative
            raise OSError(e.errno, e.strerror, os.path.join(path, e.filename)) from None
        _rmdir(pfd, name)
    finally:
        os.close(pfd)


def _open_for_removal(dir_fd: int, name: str) -> int:
    """The directory ``name`` under ``dir_fd`` opened to be emptied, never through a
    symlink; one the child left unlistable (chmod 000) is given owner rights first,
    through an O_PATH fd: the magic link acts on that very inode, whatever is at the name
    by then."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except PermissionError:
        pass
    held = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                   dir_fd=dir_fd)
    try:
        os.chmod(f"/proc/self/fd/{held}", 0o700)
        return os.open(f"/proc/self/fd/{held}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    finally:
        os.close(held)


def _open_child_for_removal(dir_fd: int, name: str) -> int | None:
    try:
        return _open_for_removal(dir_fd, name)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno not in (errno.ENOTDIR, errno.ELOOP):
            raise
    _unlink(dir_fd, name)  # no longer a directory (a symlink, a file): unlinked as such
    return None


def _clear_files(fd: int, rel: str) -> list[str]:
    """Unlink every non-directory in the directory ``fd`` (owner rights restored first, by
    descriptor); its subdirectories, by name."""
    if stat.S_IMODE(os.fstat(fd).st_mode) & 0o700 != 0o700:
        try:
            os.fchmod(fd, 0o700)
        except OSError:
            pass  # not ours: the unlinks say whether it matters
    subdirs = []
    with os.scandir(fd) as it:
        entries = list(it)
    for entry in entries:
        try:
            is_dir = entry.is_dir(follow_symlinks=False)
        except FileNotFoundError:
            continue
        if is_dir:
            subdirs.append(entry.name)
            continue
        try:
            _unlink(fd, entry.name)
        except IsADirectoryError:  # replaced by a directory meanwhile
            subdirs.append(entry.name)
    return subdirs


def _unlink(dir_fd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass


def _rmdir(dir_fd: int, name: str) -> None:
    try:
        os.rmdir(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass


Snapshot = Mapping[str, tuple[int, int, int]]


class _TooLarge(Exception):
    """A snapshot's tree is past its bounds: its listing is unknown."""


def snapshot(jail: str, *, limit: int = SNAPSHOT_LIMIT, dir_limit: int = SNAPSHOT_LIMIT,
             path_max: int = SNAPSHOT_PATH_MAX) -> dict[str, tuple[int, int, int]] | None:
    """(inode, size, mtime) of every non-directory in ``jail``, by relative path; symlinks
    are recorded, never followed. ``None`` ("too large to list") when the tree holds more
    than ``limit`` non-directories or ``dir_limit`` directories, or a path longer than
    ``path_max`` bytes, or a directory was moved during the walk.

    The walk (:func:`_walk`) keeps no recursion and a bounded number of fds, whatever the
    tree's depth: every directory is opened relative to its parent with ``O_NOFOLLOW``, so
    a symlink the command left is recorded as itself, never entered. Directories that
    cannot be opened or listed are skipped, as ``os.walk`` does."""
    out: dict[str, tuple[int, int, int]] = {}
    dirs = 0

    def visit(fd: int, rel: str) -> list[str]:
        nonlocal dirs
        dirs += 1
        if dirs > dir_limit or len(os.fsencode(rel)) > path_max:
            raise _TooLarge()
        subdirs = []
        try:
            with os.scandir(fd) as it:
                entries = list(it)
        except OSError:
            return []
        for entry in entries:
            if not rel and entry.name in (IO_DIR, ENGINE_TMP_DIR):
                continue
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                is_dir = False
            if is_dir:
                subdirs.append(entry.name)
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            name = entry.name if not rel else f"{rel}/{entry.name}"
            if len(os.fsencode(name)) > path_max:
                raise _TooLarge()
            out[name] = (st.st_ino, st.st_size, st.st_mtime_ns)
            if len(out) > limit:
                raise _TooLarge()
        return subdirs

    def open_child(fd: int, name: str) -> int | None:
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=fd)
        except OSError:
            return None

    try:
        top = os.open(jail, _DIR_FLAGS)
    except OSError:
        return out
    try:
        _walk(top, visit, open_child)
    except (_TooLarge, OSError):
        return None
    return out


def diff_snapshots(before: Snapshot | None, after: Snapshot | None
                   ) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """(new, modified) relative paths, sorted; ``None`` when either side is unknown."""
    if before is None or after is None:
        return None
    new = tuple(sorted(p for p in after if p not in before))
    modified = tuple(sorted(p for p in after if p in before and after[p] != before[p]))
    return new, modified
