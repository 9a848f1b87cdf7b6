"""File references in argv (HCP §10.6): find them, refuse the dangerous ones, stage, write back.

The argv a runtime hands over is written in the *caller's* namespace; the child sees another
one (its jail, read-only system roots, nothing of /home). This module translates:

- ``workspace:REL`` (a whole token, or the value of ``--flag=workspace:REL``) names a file in
  the jail. REL must be relative; ``..`` out of the jail and symlinks resolving outside it are
  refused. It is rewritten to the absolute jail path, which the child sees at the same place.
- The value of a ``file_flags`` flag (``--flag VALUE``, ``--flag=VALUE``, ``-o VALUE``; not
  the attached ``-oVALUE``, which a getopt cluster such as ``grep -oE`` also spells) without
  that prefix is a *host* file, relative to the caller's cwd:
  an input is copied into the jail's staging dir (the mount view does not contain it); an
  output (``--output``/``-o``) is staged in the jail and written back after a successful run,
  never through a symlink, all outputs or none (:meth:`Staging.writeback`).
- Every other token is left as it is, but one that is (or ends, after any ``=``, in) a
  host-absolute path under /etc, /home, /root or /Users, or a ``/proc/*/root``-style route to
  the host, is refused: ``error: sandbox: host path not allowed``.

All checks that need no jail run in :func:`scan`, before anything is created or spawned.
Staging and writeback go through directory file descriptors opened before the child starts,
with ``O_NOFOLLOW`` on every name we create or read in a directory the child could write.
"""
from __future__ import annotations

import errno
import os
import re
import signal
import stat
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Sequence

from .errors import HostPathError, PolicyError, WritebackError, printable
from .pack import OUTPUT_FLAGS
from .reclaim import RENAME_EXCHANGE, RENAME_NOREPLACE, renameat2, sweep_temps, temp_name
from .workspace import IO_DIR, remove_tree

__all__ = ["FileRef", "OffLimits", "Staging", "WritebackError", "scan", "check_host_path", "is_host_path",
           "resolve_jail_ref", "WORKSPACE_PREFIX", "HOST_PREFIXES", "JAIL", "INPUT", "OUTPUT"]

WORKSPACE_PREFIX = "workspace:"
#: HCP §10.6: host-absolute paths under these are refused.
HOST_PREFIXES: tuple[str, ...] = ("/etc", "/home", "/root", "/Users")
#: Also refused as *file references*: the driver (not the child) would read or write them, and
#: /proc/self/environ of the driver holds the runtime's own credentials.
_FILE_REF_PREFIXES: tuple[str, ...] = HOST_PREFIXES + ("/proc", "/sys", "/dev")
#: Routes from /proc back to the host tree or to open files (refused in any token).
_PROC_ESCAPE = re.compile(r"^/proc/(?:[^/]+/)+(?:root|cwd|fd|fdinfo|map_files|exe)(?:/|$)")

JAIL, INPUT, OUTPUT = "jail", "input", "output"
#: File-flag values left as they are: the tool's stdio conventions, which the child resolves in
#: its own view (the sandbox has its own /dev/null and /dev/std*), never the driver.
PASSTHROUGH = frozenset({"-", "/dev/null", "/dev/stdin", "/dev/stdout", "/dev/stderr"})
_COPY_CHUNK = 1 << 20


@dataclass(frozen=True)
class FileRef:
    """One file reference found in argv.

    ``index`` is the argv position of the token holding the path; ``head`` is the text kept in
    front of the path in that token (``""``, ``"--out="`` or ``"-o"``). ``path`` is relative
    to the jail for ``kind == "jail"``, else the absolute host path.
    """

    index: int
    head: str
    flag: str | None
    kind: str
    value: str
    path: str

    @property
    def label(self) -> str:
        return f"{self.flag} {self.value}" if self.flag else self.value


# --- host paths ------------------------------------------------------------------------

def _normalize(path: str) -> str:
    p = os.path.normpath(path)
    return "/" + p.lstrip("/") if p.startswith("//") else p  # POSIX keeps a leading //


def _under(path: str, prefixes: Iterable[str]) -> bool:
    return any(path == p or path.startswith(p + "/") for p in prefixes)


def is_host_path(path: str, *, file_ref: bool = False) -> bool:
    """Whether an absolute ``path`` is one HCP forbids (lexically, without touching disk)."""
    p = _normalize(path)
    if _PROC_ESCAPE.match(p):
        return True
    return _under(p, _FILE_REF_PREFIXES if file_ref else HOST_PREFIXES)


def check_host_path(path: str, *, file_ref: bool = False) -> None:
    """Refuse a forbidden host path, as written and as the host resolves it (symlinks)."""
    if is_host_path(path, file_ref=file_ref):
        raise HostPathError(path)
    if is_host_path(os.path.realpath(path), file_ref=file_ref):
        raise HostPathError(path)


# --- scanning (pure: no jail needed, nothing created) ----------------------------------

@dataclass(frozen=True)
class OffLimits:
    """Host places a file reference may not name, though they are no system secret: the
    driver's own. The pack root holds the executables the allow-list approves (an output
    there would replace the next run's tool); the state directory holds every principal's
    workspace; ``<tmp>/hcp-linux-*`` are other runs' jails. The command reaches its own
    workspace as ``workspace:REL``."""

    roots: tuple[tuple[str, str], ...] = ()  # (canonical directory, what it is)
    jail_parent: str | None = None  # the temp dir whose hcp-linux-* entries are jails

    def why(self, path: str) -> str | None:
        """What ``path`` (absolute, normalised) would reach, lexically or as it resolves."""
        for p in dict.fromkeys((path, os.path.realpath(path))):
            for root, what in self.roots:
                if _under(p, (root,)):
                    return what
            if self.jail_parent is not None and _under(p, (self.jail_parent,)):
                first = p[len(self.jail_parent):].lstrip("/").split("/", 1)[0]
                if first.startswith(JAIL_DIR_PREFIX):
                    return "another run's jail"
        return None


#: The temp-dir entries that are the driver's jails (hcp_linux.reclaim.jail_name).
JAIL_DIR_PREFIX = "hcp-linux-"


def scan(argv: Sequence[str], file_flags: Sequence[str], *, cwd: str,
         off_limits: OffLimits = OffLimits()) -> list[FileRef]:
    """Every file reference in ``argv[1:]``; raises before anything is created.

    After a bare ``--`` no token is taken as a flag (POSIX end of options), but
    ``workspace:`` tokens are still rewritten and host paths still refused.
    """
    flags = set(file_flags)
    eq_flags = sorted((f for f in flags if f.startswith("--")), key=len, reverse=True)
    short = [f for f in flags if len(f) == 2 and f[0] == "-" and f[1] != "-"]
    refs: list[FileRef] = []
    options = True
    i = 1
    while i < len(argv):
        tok = argv[i]
        if options and tok == "--":
            options = False
        elif options and tok in flags:
            if i + 1 >= len(argv):
                raise PolicyError(f"argv[{i}]: {tok} expects a file name after it")
            _add(refs, _file_value(i + 1, "", tok, argv[i + 1], cwd, off_limits))
            i += 2
            continue
        elif options and tok.startswith("--") and _match_eq(tok, eq_flags):
            flag = _match_eq(tok, eq_flags)
            assert flag is not None
            _add(refs, _file_value(i, flag + "=", flag, tok[len(flag) + 1:], cwd, off_limits))
        elif options and any(tok.startswith(f) and len(tok) > 2 for f in short):
            _add(refs, _attached(i, tok))
        else:
            _add(refs, _plain_token(i, tok))
        i += 1
    outputs: dict[str, FileRef] = {}
    for ref in refs:
        if ref.kind == OUTPUT:
            first = outputs.setdefault(ref.path, ref)
            if first is not ref:  # all-or-nothing writeback needs one writer per file
                raise PolicyError(f"argv[{ref.index}]: {ref.flag} {printable(ref.path)}: "
                                  f"the same destination as argv[{first.index}]")
    return refs


def _match_eq(tok: str, flags: list[str]) -> str | None:
    for f in flags:
        if tok.startswith(f + "="):
            return f
    return None


def _add(refs: list[FileRef], ref: FileRef | None) -> None:
    if ref is not None:
        refs.append(ref)


def _plain_token(index: int, tok: str) -> FileRef | None:
    """A token that is not a file-flag value: rewrite ``workspace:`` (the whole token, or the
    value of ``--name=``), refuse a token that is a host path or ends in one after any ``=``
    (``if=/etc/passwd``, ``--x=a=/root/k``: what follows an ``=`` is a value to some parser,
    and we do not guess which)."""
    head, value = "", tok
    if not tok.startswith(WORKSPACE_PREFIX) and tok.startswith("-") and "=" in tok:
        head, _, value = tok.partition("=")
        head += "="
    _check_host_values(tok)
    if value.startswith(WORKSPACE_PREFIX):
        return _jail_ref(index, head, None, value)
    return None


def _check_host_values(tok: str) -> None:
    """Refuse ``tok`` when it, or its text after any ``=``, is a forbidden host path."""
    if tok.startswith("/"):
        check_host_path(tok)
    at = tok.find("=")
    while at >= 0:
        if tok.startswith("/", at + 1):
            check_host_path(tok[at + 1:])
        at = tok.find("=", at + 1)


def _attached(index: int, tok: str) -> FileRef | None:
    """``-oVALUE`` for a one-letter file flag ``-o``: not rewritten. Whether a program reads
    VALUE as ``-o``'s value or as more flags in a getopt cluster (``grep -oE``) depends on
    the program, and ``-o=V`` gives getopt the value ``=V``; only ``-o VALUE`` and
    ``--name=VALUE`` say which token is the file. Two exceptions, on the safe side: a
    ``workspace:`` value is rewritten (no cluster of flags spells it), and a value that would
    be a forbidden host path is refused as in any other token."""
    rest = tok[2:]
    if rest.startswith(WORKSPACE_PREFIX):
        return _jail_ref(index, tok[:2], None, rest)
    _check_host_values(tok)
    bare = rest[1:] if rest.startswith("=") else rest
    if bare.startswith("/"):
        check_host_path(bare)
    return None


def _file_value(index: int, head: str, flag: str, value: str, cwd: str,
                off_limits: OffLimits) -> FileRef | None:
    if value == "":
        raise PolicyError(f"argv[{index}]: {flag}: empty file name")
    if value in PASSTHROUGH:
        return None
    if "\0" in value:
        raise PolicyError(f"argv[{index}]: {flag}: file name contains a NUL byte")
    if value.startswith(WORKSPACE_PREFIX):
        return _jail_ref(index, head, flag, value)
    path = _normalize(os.path.join(cwd, value))
    if not is_host_path(path, file_ref=True):  # those get HCP's own message, below
        what = off_limits.why(path)
        if what is not None:
            raise PolicyError(f"argv[{index}]: {flag} {printable(value)}: inside {what} "
                              f"(file references may not name the driver's own files; "
                              f"use workspace:REL for the jail)")
    if flag in OUTPUT_FLAGS:
        _check_output_dest(flag, path)
        return FileRef(index, head, flag, OUTPUT, value, path)
    _check_input(flag, path)
    return FileRef(index, head, flag, INPUT, value, path)


def _jail_ref(index: int, head: str, flag: str | None, value: str) -> FileRef:
    rel = value[len(WORKSPACE_PREFIX):]
    if "\0" in rel:
        raise PolicyError(f"argv[{index}]: {value!r}: contains a NUL byte")
    if rel.startswith("/"):
        raise PolicyError(f"argv[{index}]: {value}: expected a path relative to the workspace")
    norm = os.path.normpath(rel) if rel else "."
    if norm == ".." or norm.startswith("../"):
        raise PolicyError(f"argv[{index}]: {value}: escapes the workspace (..)")
    return FileRef(index, head, flag, JAIL, value, norm)


def _check_input(flag: str, path: str) -> None:
    check_host_path(path, file_ref=True)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise PolicyError(f"{flag} {path}: no such file") from None
    except OSError as e:
        raise PolicyError(f"{flag} {path}: {e.strerror}") from None
    if stat.S_ISDIR(st.st_mode):
        raise PolicyError(f"{flag} {path}: is a directory (only files are copied in)")
    if not stat.S_ISREG(st.st_mode):
        raise PolicyError(f"{flag} {path}: not a regular file")


def _check_output_dest(flag: str, dest: str) -> None:
    """The destination of an output: its directory exists and is no symlink; the file itself
    is absent or a regular file, never a symlink or a directory."""
    if is_host_path(dest, file_ref=True):
        raise HostPathError(dest)
    parent, name = os.path.split(dest)
    if not name:
        raise PolicyError(f"{flag} {dest}: not a file name")
    try:
        pst = os.lstat(parent)
    except FileNotFoundError:
        raise PolicyError(f"{flag} {dest}: directory {parent} does not exist") from None
    if stat.S_ISLNK(pst.st_mode):
        raise PolicyError(f"{flag} {dest}: directory {parent} is a symlink "
                          f"(outputs are never written through a symlink)")
    if not stat.S_ISDIR(pst.st_mode):
        raise PolicyError(f"{flag} {dest}: {parent} is not a directory")
    try:
        st = os.lstat(dest)
    except FileNotFoundError:
        st = None
    if st is not None:
        if stat.S_ISLNK(st.st_mode):
            raise PolicyError(f"{flag} {dest}: is a symlink "
                              f"(outputs are never written through a symlink)")
        if stat.S_ISDIR(st.st_mode):
            raise PolicyError(f"{flag} {dest}: is a directory")
        if not stat.S_ISREG(st.st_mode):
            raise PolicyError(f"{flag} {dest}: not a regular file")
    check_host_path(parent, file_ref=True)


def resolve_jail_ref(jail: str, ref: FileRef) -> str:
    """The absolute path of a ``workspace:`` reference; refuses a symlink out of the jail."""
    full = os.path.normpath(os.path.join(jail, ref.path))
    real_jail = os.path.realpath(jail)
    real = os.path.realpath(full)
    if not (real == real_jail or real.startswith(real_jail + "/")):
        raise PolicyError(f"argv[{ref.index}]: {ref.value}: escapes the workspace (symlink)")
    return full


# --- staging and writeback -------------------------------------------------------------

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
    once (best effort: a failure here does not stop the writeback; hcp_linux.reclaim says
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
