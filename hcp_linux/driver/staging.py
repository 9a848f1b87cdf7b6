"""Staging and writeback of the file references :func:`hcp_linux.driver.fileref.scan` found.

An input is copied into the jail's staging dir (the mount view does not contain it); an output
is staged in the jail and written back after a successful run, never through a symlink, all
outputs or none (:meth:`Staging.writeback`). Staging and writeback go through directory file
descriptors opened before the child starts, with ``O_NOFOLLOW`` on every name we create or read
in a directory the child could write.
"""
from __future__ import annotations

import errno
import os
import signal
import stat
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator, Sequence

from ..errors import HostPathError, PolicyError, WritebackError
from .fileref import INPUT, JAIL, FileRef, is_host_path, resolve_jail_ref
from ..jails.reclaim import RENAME_EXCHANGE, RENAME_NOREPLACE, renameat2, sweep_temps, temp_name
from ..jails.workspace import IO_DIR, remove_tree

__all__ = ["Staging"]

_COPY_CHUNK = 1 << 20


@dataclass(eq=False)
class _Output:
    ref: FileRef
    dest_dir_fd: int
    dest_name: str
    stage_fd: int
    stage_name: str


@dataclass(eq=False)
class Staging:
    """The driver's I/O area in one jail (``<jail>/.hcp-io``): inputs copied in, outputs
    staged. Owns directory fds until :meth:`close`. ``io_root``, when given, holds
    ``.hcp-io`` instead of the jail (a read-only jail: mode ``none``'s pack root);
    ``workspace:`` references still name files in the jail."""

    jail: str
    outputs: list[_Output] = field(default_factory=list)
    io_root: str | None = None
    _fds: list[int] = field(default_factory=list, repr=False)
    _io_fd: int | None = field(default=None, repr=False)
    _dirs: dict[str, int] = field(default_factory=dict, repr=False)

    @property
    def _root(self) -> str:
        return self.jail if self.io_root is None else self.io_root

    def _open(self, path: str, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        fd = os.open(path, flags | os.O_CLOEXEC, mode, dir_fd=dir_fd)
        self._fds.append(fd)
        return fd

    def clear(self) -> None:
        """Remove a ``.hcp-io`` left in a persistent jail (a crashed run, or the child)."""
        path = os.path.join(self._root, IO_DIR)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(st.st_mode):
            remove_tree(path)
        else:
            os.unlink(path)

    def _io(self) -> int:
        """Create ``.hcp-io`` afresh (a leftover, or whatever the child put there, goes)."""
        if self._io_fd is None:
            jail_fd = self._open(self._root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            try:
                st = os.stat(IO_DIR, dir_fd=jail_fd, follow_symlinks=False)
            except FileNotFoundError:
                st = None
            if st is not None:
                if stat.S_ISDIR(st.st_mode):
                    remove_tree(os.path.join(self._root, IO_DIR))
                else:
                    os.unlink(IO_DIR, dir_fd=jail_fd)
            os.mkdir(IO_DIR, 0o700, dir_fd=jail_fd)
            self._io_fd = self._open(IO_DIR, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW,
                                     dir_fd=jail_fd)
        return self._io_fd

    def _subdir(self, kind: str, n: int) -> tuple[int, str]:
        io = self._io()
        if kind not in self._dirs:
            os.mkdir(kind, 0o700, dir_fd=io)
            self._dirs[kind] = self._open(kind, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW,
                                          dir_fd=io)
        kfd = self._dirs[kind]
        os.mkdir(str(n), 0o700, dir_fd=kfd)
        fd = self._open(str(n), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=kfd)
        return fd, os.path.join(self._root, IO_DIR, kind, str(n))

    def rewrite(self, argv: Sequence[str], refs: Sequence[FileRef]) -> list[str]:
        """``argv`` with every reference pointing into the jail; inputs copied in."""
        out = list(argv)
        for n, ref in enumerate(refs):
            if ref.kind == JAIL:
                new = resolve_jail_ref(self.jail, ref)
            elif ref.kind == INPUT:
                new = self._copy_in(n, ref)
            else:
                new = self._stage_output(n, ref)
            out[ref.index] = ref.head + new
        return out

    def _copy_in(self, n: int, ref: FileRef) -> str:
        # Follow the caller's own symlinks, then ask the kernel what was actually opened.
        src = os.open(ref.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            st = os.fstat(src)
            if not stat.S_ISREG(st.st_mode):
                raise PolicyError(f"{ref.flag} {ref.path}: not a regular file")
            if is_host_path(os.readlink(f"/proc/self/fd/{src}"), file_ref=True):
                raise HostPathError(ref.path)
            os.set_blocking(src, True)
            dfd, dpath = self._subdir("in", n)
            name = os.path.basename(ref.path)
            dst = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                          | os.O_CLOEXEC, 0o600, dir_fd=dfd)
            try:
                _copy(src, dst)
            finally:
                os.close(dst)
        finally:
            os.close(src)
        return os.path.join(dpath, name)

    def _stage_output(self, n: int, ref: FileRef) -> str:
        parent, name = os.path.split(ref.path)
        try:
            # O_NOFOLLOW: the directory itself must not be a symlink (checked in scan too;
            # this pins the very directory that was checked until writeback).
            dest_dir_fd = self._open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError as e:
            raise PolicyError(f"{ref.flag} {ref.path}: directory {parent}: "
                              f"{os.strerror(e.errno or errno.EIO)}") from None
        sfd, spath = self._subdir("out", n)
        self.outputs.append(_Output(ref, dest_dir_fd, name, sfd, name))
        return os.path.join(spath, name)

    def writeback(self) -> tuple[list[str], list[str]]:
        """Write every staged output to its destination, all or none: (written, missing).

        First every staged file is opened (``O_NOFOLLOW``: the child may have planted a
        symlink to a file only we can read) and every destination re-checked. Then phase 1
        writes and fsyncs a temp file beside each destination; any failure removes every
        temp made so far, and no destination has changed. Phase 2 puts them in place one by
        one (``renameat2``), keeping each previous content under a temp name until all are
        in; a failure there puts back the destinations already replaced. Every failure is a
        :class:`WritebackError` naming the destination and the cause. Temp files a dead
        run left in a destination's directory are reclaimed first.
        """
        ready: list[_Pending] = []
        missing: list[str] = []
        try:
            for o in self.outputs:
                src = _open_staged(o)
                if src is None:
                    missing.append(o.ref.path)
                    continue
                ready.append(_Pending(o, src))
                ready[-1].old = _dest_stat(o)
            _reclaim_beside(ready)
            _commit(ready)
            return [p.out.ref.path for p in ready], missing
        finally:
            for p in ready:
                os.close(p.src)

    def close(self, *, remove: bool) -> None:
        """Close the fds; with ``remove``, delete ``.hcp-io`` (a persistent jail keeps no
        staging between runs)."""
        for fd in self._fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self._fds.clear()
        if remove and self._io_fd is not None:
            path = os.path.join(self._root, IO_DIR)
            try:
                if stat.S_ISDIR(os.lstat(path).st_mode):
                    remove_tree(path)
                else:
                    os.unlink(path)
            except FileNotFoundError:
                pass
        self._io_fd = None
        self._dirs.clear()


def _open_staged(o: _Output) -> int | None:
    """The staged output, opened without following (None when the tool did not write it):
    only a regular file with one link is written back."""
    path = o.ref.path
    try:
        src = os.open(o.stage_name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                      dir_fd=o.stage_fd)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise WritebackError(path, "the tool left a symlink, not a file; "
                                       "not written back") from None
        raise WritebackError(path, _strerror(e)) from None
    try:
        st = os.fstat(src)
        if not stat.S_ISREG(st.st_mode):
            raise WritebackError(path, "the tool left something that is not a regular file; "
                                       "not written back")
        if st.st_nlink != 1:
            raise WritebackError(path, "the tool left a hard link; not written back")
        os.set_blocking(src, True)
    except OSError as e:
        os.close(src)
        raise WritebackError(path, _strerror(e)) from None
    except BaseException:
        os.close(src)
        raise
    return src


def _dest_stat(o: _Output) -> os.stat_result | None:
    try:
        st = os.stat(o.dest_name, dir_fd=o.dest_dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise WritebackError(o.ref.path, _strerror(e)) from None
    if stat.S_ISLNK(st.st_mode):
        raise WritebackError(o.ref.path, "became a symlink during the run; not written back")
    if stat.S_ISDIR(st.st_mode):
        raise WritebackError(o.ref.path, "became a directory during the run; not written back")
    if not stat.S_ISREG(st.st_mode):
        raise WritebackError(o.ref.path, "not a regular file; not written back")
    return st


def _strerror(e: OSError, dir_fd: int | None = None) -> str:
    """The cause of a failed call, as strerror says it; for ENOENT in a directory that is
    no longer linked anywhere, also that (a directory removed during the run)."""
    text = os.strerror(e.errno) if e.errno else str(e)
    if e.errno == errno.ENOENT and dir_fd is not None:
        try:
            if os.fstat(dir_fd).st_nlink == 0:
                text += " (the directory was removed during the run)"
        except OSError:
            pass
    return text


def _reclaim_beside(pending: list[_Pending]) -> None:
    """Remove temp files that dead runs left in the destinations' directories, each scanned
    once (best effort: a failure here does not stop the writeback; hcp_linux.jails.reclaim says
    what may be removed)."""
    seen: set[tuple[int, int]] = set()
    for p in pending:
        try:
            st = os.fstat(p.out.dest_dir_fd)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            sweep_temps(p.out.dest_dir_fd, os.path.dirname(p.out.ref.path))


@dataclass(eq=False)
class _Pending:
    """One output on its way: ``tmp`` names our new content while it is a temp file;
    ``backup`` names the destination's previous content once ours is in place."""

    out: _Output
    src: int
    old: os.stat_result | None = None
    tmp: str | None = None
    ino: tuple[int, int] | None = None
    backup: str | None = None
    placed: bool = False


_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


@contextmanager
def _signals_deferred() -> Iterator[None]:
    """Hold SIGINT/SIGTERM/SIGHUP (this thread) while destinations are swapped: a handler
    that raises (^C, the CLI's) then runs after the swaps and their undo are complete, never
    between a rename and the note that it happened."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _commit(pending: list[_Pending]) -> None:
    """Phase 1 (temp files, fsynced) then phase 2 (in place); see Staging.writeback."""
    try:
        for p in pending:
            _write_temp(p)
        with _signals_deferred():
            _place_all(pending)
    finally:
        for p in pending:  # temps never placed (a failure); nothing left on success
            if p.tmp is not None:
                _unlink_quietly(p.out.dest_dir_fd, p.tmp)
                p.tmp = None


def _write_temp(p: _Pending) -> None:
    o, old = p.out, p.old
    mode = (old.st_mode & 0o777) if old is not None else 0o666
    name = temp_name(o.dest_name)
    try:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     mode, dir_fd=o.dest_dir_fd)
    except OSError as e:
        raise WritebackError(o.ref.path, _strerror(e, o.dest_dir_fd)) from None
    p.tmp = name
    try:
        try:
            if old is not None:
                os.fchmod(fd, mode)
                if os.geteuid() == 0 and (old.st_uid, old.st_gid) != (0, 0):
                    os.fchown(fd, old.st_uid, old.st_gid)
            _copy(p.src, fd)
            os.fsync(fd)
            st = os.fstat(fd)
            p.ino = (st.st_dev, st.st_ino)
        finally:
            os.close(fd)  # on NFS, close reports a failed write-back too
    except OSError as e:
        raise WritebackError(o.ref.path, _strerror(e, o.dest_dir_fd)) from None


def _place_all(pending: list[_Pending]) -> None:
    """Phase 2: each temp over its destination; on a failure, undo the ones placed. On
    success the previous contents kept aside are removed and the directories fsynced."""
    try:
        for p in pending:
            _place(p)
    except BaseException as e:
        lost = _undo([p for p in pending if p.placed])
        if lost and isinstance(e, WritebackError):
            raise WritebackError(e.path, f"{e.cause}; and {'; '.join(lost)}") from None
        raise
    for p in pending:
        if p.backup is not None:
            _unlink_quietly(p.out.dest_dir_fd, p.backup)
            p.backup = None
    for fd in {p.out.dest_dir_fd for p in pending}:
        try:
            os.fsync(fd)  # the renames' durability; they are done and cannot be undone now
        except OSError:
            pass


def _place(p: _Pending) -> None:
    o = p.out
    d, name, tmp = o.dest_dir_fd, o.dest_name, p.tmp
    assert tmp is not None
    try:
        if p.old is not None:
            try:
                # Atomic swap: the destination gets ours, our temp name its previous content.
                renameat2(d, tmp, d, name, RENAME_EXCHANGE)
            except FileNotFoundError:
                p.old = None  # removed meanwhile: nothing to keep
            except OSError as e:
                if e.errno not in (errno.EINVAL, errno.ENOSYS):
                    raise
                _place_by_link(p)  # a file system without RENAME_EXCHANGE
                return
            else:
                p.tmp, p.backup, p.placed = None, tmp, True
                st = os.stat(tmp, dir_fd=d, follow_symlinks=False)
                if not stat.S_ISREG(st.st_mode):
                    what = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
                    raise WritebackError(o.ref.path, f"became {what} during writeback; "
                                                     f"not written back")
                return
        try:
            renameat2(d, tmp, d, name, RENAME_NOREPLACE)
        except OSError as e:
            if e.errno == errno.EEXIST:
                raise WritebackError(o.ref.path, "appeared during writeback; "
                                                 "not written back") from None
            if e.errno not in (errno.EINVAL, errno.ENOSYS):
                raise
            os.rename(tmp, name, src_dir_fd=d, dst_dir_fd=d)  # no RENAME_NOREPLACE here
        p.tmp, p.placed = None, True
    except OSError as e:
        raise WritebackError(o.ref.path, _strerror(e, d)) from None


def _place_by_link(p: _Pending) -> None:
    """Without RENAME_EXCHANGE: hard-link the previous content aside, then rename over it.
    Where even a hard link fails, there is no backup, and a later failure cannot put this
    destination back (the error says so)."""
    o = p.out
    d, name, tmp = o.dest_dir_fd, o.dest_name, p.tmp
    assert tmp is not None
    aside = temp_name(name, "old")
    backup: str | None = aside
    try:
        os.link(name, aside, src_dir_fd=d, dst_dir_fd=d, follow_symlinks=False)
    except OSError:
        backup = None
    try:
        os.rename(tmp, name, src_dir_fd=d, dst_dir_fd=d)
    except BaseException:
        if backup is not None:
            _unlink_quietly(d, backup)
        raise
    p.tmp, p.backup, p.placed = None, backup, True


def _undo(placed: list[_Pending]) -> list[str]:
    """Put back the destinations already replaced, last first; what could not be, said."""
    lost = []
    for p in reversed(placed):
        o = p.out
        d, name = o.dest_dir_fd, o.dest_name
        try:
            st = os.stat(name, dir_fd=d, follow_symlinks=False)
            if (st.st_dev, st.st_ino) != p.ino:
                raise OSError(errno.ESTALE, "replaced by someone else meanwhile")
            if p.backup is None and p.old is not None:
                raise OSError(errno.ENOTSUP, "no previous content was kept")
            if p.backup is None:  # it did not exist: remove ours
                os.unlink(name, dir_fd=d)
            else:
                try:
                    renameat2(d, p.backup, d, name, RENAME_EXCHANGE)
                except OSError as e:
                    if e.errno not in (errno.EINVAL, errno.ENOSYS):
                        raise
                    os.rename(p.backup, name, src_dir_fd=d, dst_dir_fd=d)  # ours goes
                else:
                    _unlink_quietly(d, p.backup)  # the swap back left ours there
                p.backup = None
            p.placed = False
        except OSError as e:
            lost.append(f"{o.ref.path} was replaced and could not be put back: "
                        f"{e.strerror or e}{_keep(p)}")
    return lost


def _keep(p: _Pending) -> str:
    """Move a destination's previous content that could not be put back to a name no sweep
    removes (``….kept``); where it is, for the message."""
    if p.backup is None:
        return ""
    d, kept = p.out.dest_dir_fd, temp_name(p.out.dest_name, "kept")
    try:
        renameat2(d, p.backup, d, kept, RENAME_NOREPLACE)
    except OSError:
        kept = p.backup  # stays under a temp name, reclaimed once this process is gone
    p.backup = None
    return f" (its previous content is in {os.path.join(os.path.dirname(p.out.ref.path), kept)})"


def _unlink_quietly(dir_fd: int, name: str) -> None:
    """Remove a temp name of ours; a failure leaves it for the sweep (its owner is named in
    it), so it is not worth failing a run that already succeeded or failed for a reason."""
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass


def _copy(src: int, dst: int) -> None:
    while True:
        chunk = os.read(src, _COPY_CHUNK)
        if not chunk:
            return
        view = memoryview(chunk)
        while view:
            view = view[os.write(dst, view):]
