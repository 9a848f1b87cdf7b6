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
  never through a symlink, all outputs or none (:mod:`hcp_linux.driver.staging`).
- Every other token is left as it is, but one that is (or ends, after any ``=``, in) a
  host-absolute path under /etc, /home, /root or /Users, or a ``/proc/*/root``-style route to
  the host, is refused: ``error: sandbox: host path not allowed``.

All checks that need no jail run here, in :func:`scan`, before anything is created or
spawned; :mod:`hcp_linux.driver.staging` copies, stages and writes back.
"""
from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from typing import Iterable, Sequence

from ..errors import HostPathError, PolicyError, WritebackError, printable
from ..policy.pack import OUTPUT_FLAGS

__all__ = ["FileRef", "OffLimits", "WritebackError", "scan", "check_host_path", "is_host_path",
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


#: The temp-dir entries that are the driver's jails (hcp_linux.jails.reclaim.jail_name).
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
