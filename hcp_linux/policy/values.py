"""Every single input value, checked in one place: sizes, durations, bounded numbers, paths,
granted roots and parsed configuration documents.

Why one module: the same value reaches the engine from ``--limit KEY=VALUE`` (an ``int`` when
the text is all digits, else the text), from TOML files (ints, floats, strings, tables) and
from the Python API (anything at all). Parsed in one place it means the same thing from each
of them, and a range check cannot be forgotten on one path. Every function returns the
normalised value or raises :class:`~hcp_linux.errors.PolicyError` with one line that names
the field, what is allowed (with the range) and what was given, control characters escaped.

Bounds come from what the kernel takes, so that no value is wrapped or silently clamped into
a weaker limit on the way down (an rlimit of 2**64 + 1 would reach the kernel as 1; a tmpfs
``size=`` of 2**64 parses as 0, which is "no limit"). Numbers are never taken modulo anything:
a value outside its range is refused, naming the range.
"""
from __future__ import annotations

import math
import os
import re
import stat
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from ..errors import PolicyError, printable

if TYPE_CHECKING:
    from fractions import Fraction

__all__ = ["show", "bounded_int", "size", "duration", "decimal", "file_name", "text_path",
           "is_within", "pseudo_fs_reason", "mount_table", "existing_dir", "check_grantable",
           "granted_root", "output_file", "symlinks_followed", "unpinned_link", "check_depth",
           "read_document", "parse_document",
           "RLIM_MAX", "SIZE_MAX", "PATH_MAX", "MAX_DEPTH", "MAX_DOCUMENT"]

#: The largest finite value an rlimit or a size may take: rlim_t is a u64 whose top value is
#: RLIM_INFINITY ("unlimited", spelled so), but Python's ``resource.setrlimit`` (the ctypes
#: executor) takes a signed 64-bit value, and nothing a command uses comes near 2**63 bytes
#: (files stop at MAX_LFS_FILESIZE = 2**63 - 1, address spaces at 2**57).
RLIM_MAX = (1 << 63) - 1
#: Sizes (tmpfs ``size=``, captured output, cgroup memory) share that bound: tmpfs rounds its
#: size up to pages, and a size within a page of 2**64 would wrap to 0, which tmpfs reads as
#: "unlimited".
SIZE_MAX = RLIM_MAX
#: The kernel refuses a path longer than this (bytes, with the terminating NUL: ENAMETOOLONG).
PATH_MAX = 4096
#: Deepest nesting a policy file or a pack manifest may have. Neither needs more than four
#: levels; the bound refuses a hostile file with one line, before a parser recurses itself to
#: death (RecursionError) or a later walk does.
MAX_DEPTH = 32
#: Largest policy file or pack manifest read (bytes): a sane one is a few hundred bytes; the
#: bound keeps a mistaken ``--policy /dev/zero`` from eating memory forever.
MAX_DOCUMENT = 1 << 20

_DIGITS = 40  # longer digit strings are out of every range here (and int() of 4300+ raises)
_INT = re.compile(r"\s*([+-]?[0-9]+)\s*", re.ASCII)
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgt]?)(i?b?)\s*", re.ASCII | re.IGNORECASE)
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_DURATION = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(ms|s|m|h)?\s*", re.ASCII)
#: seconds per unit, as (numerator, denominator): exact
_DURATION_UNITS: dict[str | None, tuple[int, int]] = {None: (1, 1), "ms": (1, 1000),
                                                     "s": (1, 1), "m": (60, 1), "h": (3600, 1)}
_DECIMAL = re.compile(r"\s*([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))\s*", re.ASCII)
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


# --- messages ------------------------------------------------------------------------------

def show(value: Any, limit: int = 80) -> str:
    """``value`` for a one-line message: its repr with control characters escaped, cut to
    ``limit`` characters (a 10 MB string must not become a 10 MB message)."""
    try:
        text = repr(value)
    except Exception:  # a hostile __repr__ must not replace the error it is part of
        text = f"<{type(value).__name__}>"
    text = printable(text)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _num(x: float | int | Fraction) -> str:
    """A bound as exact text: ``2147483``, ``0.01``, never ``2.14748e+06``."""
    if not isinstance(x, (int, float)):  # a Fraction
        x = int(x) if x.denominator == 1 else float(x)
    if isinstance(x, float) and x.is_integer():
        x = int(x)
    return repr(x)


def _range(lo: Any, hi: Any, unit: str = "") -> str:
    return f"from {_num(lo)} to {_num(hi)}{unit}"


def _refuse(field: str, expected: str, value: Any, hint: str = "") -> PolicyError:
    return PolicyError(f"{field}: expected {expected}{hint}, got {show(value)}")


# --- numbers -------------------------------------------------------------------------------

def bounded_int(value: Any, field: str, lo: int, hi: int, *, hint: str = "") -> int:
    """A whole number in ``[lo, hi]``: an ``int`` (never a ``bool``) or its decimal text.

    Floats are refused even when whole: a count written ``1e3`` is a typo more often than not,
    and float text has no exact meaning past 2**53."""
    expected = f"a whole number {_range(lo, hi)}"
    n = _whole(value)
    if n is None:
        raise _refuse(field, expected, value, hint)
    if not lo <= n <= hi:
        raise _refuse(field, expected, value, hint)
    return n


def _whole(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and (m := _INT.fullmatch(value)) and len(m.group(1)) <= _DIGITS:
        return int(m.group(1))
    return None


def size(value: Any, field: str, lo: int = 1, hi: int = SIZE_MAX, *, hint: str = "") -> int:
    """Bytes in ``[lo, hi]``: an ``int``, or text like ``4096``, ``512k``, ``1.5g``, ``2GiB``.

    Suffixes are binary (k = 1024), case-insensitive, with an optional ``i`` and ``b``. A
    fraction is exact and must come to a whole number of bytes (``1.5k`` is 1536, ``0.3k``
    is refused)."""
    expected = f"a size {_range(lo, hi, ' bytes')} (bytes, or like '512m')"
    n: int | None = None
    if isinstance(value, bool):
        n = None
    elif isinstance(value, int):
        n = value
    elif isinstance(value, str) and (m := _SIZE.fullmatch(value)) and len(m.group(1)) <= _DIGITS:
        from fractions import Fraction  # here: 2 ms of imports, rarely needed
        exact = Fraction(m.group(1)) * _SIZE_UNITS[m.group(2).lower()]
        if exact.denominator == 1:
            n = int(exact)
    if n is None or not lo <= n <= hi:
        raise _refuse(field, expected, value, hint)
    return n


def is_duration_text(text: str) -> bool:
    """Whether ``text`` is spelled as `duration` reads text (``30``, ``30s``, ``1.5m``...);
    its range is not checked."""
    m = _DURATION.fullmatch(text)
    return m is not None and len(m.group(1)) <= _DIGITS


def duration(value: Any, field: str, hi: float, *, whole: bool = False,
             hint: str = "") -> float:
    """Seconds in ``(0, hi]``: an ``int``/``float`` or text like ``30``, ``1.5``, ``30s``,
    ``2m``, ``1h``, ``500ms``. Never NaN, never infinite, never zero or negative (a zero
    timeout is "expire at once" to one API and "no timeout" to another).

    ``whole``: only whole seconds (RLIMIT_CPU counts seconds), returned as an ``int``."""
    unit = "whole seconds" if whole else "seconds"
    expected = f"{unit} > 0 and <= {_num(hi)} (a number, or like '30s', '2m', '1h')"
    from fractions import Fraction  # here: 2 ms of imports (decimal), off a default run
    seconds: Fraction | None = None
    if isinstance(value, bool):
        seconds = None
    elif isinstance(value, int):
        seconds = Fraction(value)
    elif isinstance(value, float):
        seconds = Fraction(value) if math.isfinite(value) else None
    elif isinstance(value, str) and (m := _DURATION.fullmatch(value)) \
            and len(m.group(1)) <= _DIGITS:
        seconds = Fraction(m.group(1)) * Fraction(*_DURATION_UNITS[m.group(2)])
    if seconds is None or not 0 < seconds <= Fraction(hi) \
            or (whole and seconds.denominator != 1):
        raise _refuse(field, expected, value, hint)
    return int(seconds) if whole else float(seconds)


def decimal(value: Any, field: str, lo: float, hi: float, *, hint: str = "") -> float:
    """A finite number in ``[lo, hi]``: an ``int``/``float`` (never a ``bool``) or its decimal
    text (``0.5``). For quantities that are naturally fractional, such as CPUs."""
    expected = f"a number {_range(lo, hi)}"
    x: float | None = None
    if isinstance(value, bool):
        x = None
    elif isinstance(value, (int, float)):
        try:
            x = float(value)
        except OverflowError:  # an int beyond float's range
            x = None
    elif isinstance(value, str) and (m := _DECIMAL.fullmatch(value)) \
            and len(m.group(1)) <= _DIGITS:
        x = float(m.group(1))
    if x is None or not math.isfinite(x) or not lo <= x <= hi:
        raise _refuse(field, expected, value, hint)
    return x


# --- paths ---------------------------------------------------------------------------------

def file_name(value: Any, field: str) -> str:
    """A path as text, as given (relative or not): ``str``, ``bytes`` (decoded as the file
    system does) or ``os.PathLike``, without NUL bytes, which no system call can take."""
    if isinstance(value, os.PathLike):
        try:
            value = os.fspath(value)
        except Exception:
            raise PolicyError(f"{field}: expected a path, got {type(value).__name__}") from None
    if isinstance(value, bytes):
        value = os.fsdecode(value)
    if not isinstance(value, str):
        raise PolicyError(f"{field}: expected a path, got {type(value).__name__}")
    if "\0" in value:
        raise PolicyError(f"{field}: {show(value)}: path contains a NUL byte")
    return value


def text_path(value: Any, field: str) -> str:
    """An absolute path as text, normalised (``..`` and ``//`` folded, not resolved).

    Accepted: as :func:`file_name`. Refused besides: control characters (a path is shown in
    every message and in the receipt; a newline in it would forge a line), relative paths and
    paths longer than the kernel takes."""
    value = file_name(value, field)
    if _CONTROL.search(value):
        raise PolicyError(f"{field}: {show(value)}: path contains a control character")
    if not os.path.isabs(value):
        raise PolicyError(f"{field}: {show(value)} is not an absolute path"
                          + (" (give one, e.g. starting with $PWD/)" if value else ""))
    if len(os.fsencode(value)) >= PATH_MAX:
        raise PolicyError(f"{field}: path longer than {PATH_MAX - 1} bytes")
    return os.path.normpath(value)


def is_within(path: str, root: str) -> bool:
    """``path`` is ``root`` or beneath it (both canonical)."""
    return path == root or path.startswith(root.rstrip("/") + "/")


#: statfs f_type of the kernel's pseudo file systems (linux/magic.h and the file systems'
#: sources). None holds data a command should write to, and several write straight into the
#: kernel (sysfs, procfs's /proc/sys, cgroupfs, debugfs, efivarfs, configfs, bpf).
PSEUDO_FS_MAGIC: Mapping[int, str] = {
    0x9FA0: "proc", 0x62656572: "sysfs", 0x1CD1: "devpts", 0x27E0EB: "cgroup",
    0x63677270: "cgroup2", 0x64626720: "debugfs", 0x74726163: "tracefs",
    0x73636673: "securityfs", 0xCAFE4A11: "bpf", 0x62656570: "configfs",
    0xDE5E81E4: "efivarfs", 0x6165676C: "pstore", 0xF97CFF8C: "selinuxfs",
    0x43415D53: "smackfs", 0x42494E4D: "binfmt_misc", 0x65735543: "fusectl",
    0x19800202: "mqueue", 0x958458F6: "hugetlbfs", 0x6E736673: "nsfs",
    0x07655821: "resctrl", 0x6C6F6F70: "binder", 0x67596969: "rpc_pipefs",
    0x6E667364: "nfsd", 0xABBA1974: "xenfs", 0x9FA2: "usbdevfs",
}
#: The same file systems by the type name /proc/self/mountinfo gives, plus devtmpfs, whose
#: statfs type is tmpfs's and which only the mount table tells apart.
PSEUDO_FS_NAMES = frozenset(PSEUDO_FS_MAGIC.values()) | {"devtmpfs", "usbfs"}
#: Host trees that hold nothing but pseudo file systems and device nodes, refused by path
#: too: a bind mount of, say, a tmpfs over a part of /sys must not make it grantable.
PSEUDO_TREES = ("/proc", "/sys", "/dev")


_statfs: Any = None  # libc's statfs, looked up once (ctypes is off the import path till then)
_MACHINE = os.uname().machine


def _fs_magic(path: str) -> int | None:
    """statfs(2) f_type of ``path``, or None when it cannot be asked."""
    global _statfs
    import ctypes
    if _statfs is None:
        try:
            _statfs = ctypes.CDLL(None, use_errno=True).statfs
        except (OSError, AttributeError):
            _statfs = False
    if _statfs is False:
        return None
    buf = ctypes.create_string_buffer(256)  # struct statfs is 120 bytes on 64-bit Linux
    if _statfs(os.fsencode(path), buf) != 0:
        return None
    # f_type is the first field, a __fsword_t: a long, but an unsigned int on s390x.
    word = ctypes.c_uint if _MACHINE == "s390x" else ctypes.c_long
    return word.from_buffer(buf).value & 0xFFFFFFFF


_ESCAPE = re.compile(rb"\\([0-7]{3})")


def mount_table() -> list[tuple[str, str]]:
    """(mount point, file system type) of every mount this process sees, in mount order.
    Empty when /proc is not there to ask (the path and statfs checks still apply). Read once
    per policy, not per root."""
    try:
        with open("/proc/self/mountinfo", "rb") as f:
            text = os.fsdecode(f.read())
    except OSError:
        return []
    table = []
    for line in text.splitlines():
        fields = line.split(" ")
        try:
            sep = fields.index("-", 6)
        except ValueError:
            continue
        point = fields[4]
        if "\\" in point:  # space, tab, newline and backslash are octal escapes
            point = os.fsdecode(_ESCAPE.sub(lambda m: bytes([int(m.group(1), 8)]),
                                            os.fsencode(point)))
        table.append((point, fields[sep + 1]))
    return table


#: tmpfs's f_type, which devtmpfs shares: only the mount table tells them apart.
TMPFS_MAGIC = 0x01021994


def pseudo_fs_reason(real: str, mounts: list[tuple[str, str]] | None = None) -> str | None:
    """Why the canonical directory ``real`` must not be granted, or None.

    Granting it would hand the command a kernel interface, not files: it is under /proc, /sys
    or /dev; it is on a pseudo file system (statfs f_type; the mount table for devtmpfs);
    or a pseudo file system is mounted inside it, which the recursive bind of a root would
    carry into the sandbox (``/`` always holds /proc)."""
    for tree in PSEUDO_TREES:
        if is_within(real, tree):
            return f"it is under {tree}"
    magic = _fs_magic(real)
    if magic is not None and magic in PSEUDO_FS_MAGIC:
        return f"it is on {PSEUDO_FS_MAGIC[magic]}, a kernel pseudo file system"
    mounts = mount_table() if mounts is None else mounts
    inside = real.rstrip("/") + "/"
    for point, fstype in mounts:
        if fstype in PSEUDO_FS_NAMES and point.startswith(inside):
            return f"{fstype} is mounted inside it at {printable(point)}"
    if magic in (TMPFS_MAGIC, None):
        containing: tuple[str, str] | None = None
        for point, fstype in mounts:  # the deepest, and of equal ones the last (on top)
            if is_within(real, point) and (containing is None
                                           or len(point) >= len(containing[0])):
                containing = (point, fstype)
        if containing is not None and containing[1] in PSEUDO_FS_NAMES:
            return f"it is on {containing[1]}, a kernel pseudo file system"
    return None


def dir_problem(path: str, st: os.stat_result | None = None) -> str | None:
    """Why ``path`` is not a directory we can create files in ("not a directory", "not
    writable", or the stat error), None when it is one. ``st``: its stat, if taken."""
    if st is None:
        try:
            st = os.stat(path)
        except OSError as e:
            return e.strerror or "cannot be examined"
    if not stat.S_ISDIR(st.st_mode):
        return "not a directory"
    if not os.access(path, os.W_OK | os.X_OK, effective_ids=True):
        return "not writable"
    return None


def existing_dir(value: Any, field: str) -> str:
    """An absolute path to an existing directory, returned canonical (symlinks resolved
    once, here, so the plan opens exactly what was checked)."""
    path = text_path(value, field)
    real = os.path.realpath(path)
    if not os.path.isdir(real):
        raise PolicyError(f"{field}: {printable(path)} is not an existing directory")
    return real


#: How many symlinks one path may pass through before it is refused (the kernel's
#: MAXSYMLINKS for a whole lookup): a loop is refused, not followed forever.
MAX_SYMLINKS = 40


def symlinks_followed(given: str) -> list[str]:
    """The symlinks that resolving ``given`` (absolute, normalised) passes through, each as
    the canonical path of the link itself (its directory resolved, its own name not), in the
    order they are met; the walk of ``realpath``, kept. A component that does not exist ends
    the walk (the rest is taken as written). Raises PolicyError on a loop."""
    links: list[str] = []
    here = "/"
    pending = [c for c in given.split("/") if c]
    while pending:
        name = pending.pop(0)
        if name == ".":
            continue
        if name == "..":
            here = os.path.dirname(here)
            continue
        path = os.path.join(here, name)
        try:
            st = os.lstat(path)
        except OSError:
            return links  # absent (or unreadable): nothing further is followed
        if not stat.S_ISLNK(st.st_mode):
            here = path
            continue
        links.append(path)
        if len(links) > MAX_SYMLINKS:
            raise PolicyError(f"{printable(given)}: too many levels of symbolic links")
        target = os.readlink(path)
        if target.startswith("/"):
            here = "/"
        pending[:0] = [c for c in target.split("/") if c]
    return links


def unpinned_link(given: str, writable: tuple[str, ...]) -> tuple[str, str] | None:
    """The first symlink that resolving ``given`` passes through which lies strictly inside
    one of the ``writable`` roots (canonical), with that root; None when there is none.

    Why: a command can replace such a link between runs (or rename a directory on the path
    and put a link in its place), and the next run that resolves ``given`` again would grant
    whatever the link then names: a host directory read-write, a secret's decoy masked
    instead of the secret, another daemon's socket. A path whose every link lies outside the
    writable roots means the same thing in every run (DESIGN.md §3, §8)."""
    for link in symlinks_followed(given):
        for root in writable:
            if link != root and is_within(link, root):
                return link, root
    return None


def resolved(given: str, field: str, if_missing: str) -> tuple[str, str, os.stat_result]:
    """``given`` (absolute, normalised) resolved once: its canonical path, how to show it in
    a message (both names when a symlink was followed) and its stat. A path that does not
    exist is refused naming the field, with ``if_missing`` as the remedy."""
    real = os.path.realpath(given)
    shown = printable(given) if given == real else f"{printable(given)} ({printable(real)})"
    try:
        return real, shown, os.stat(real)
    except OSError as e:
        raise PolicyError(f"{field}: {shown}: {e.strerror}; {if_missing}") from None


def check_grantable(real: str, field: str, mounts: list[tuple[str, str]] | None = None,
                    given: str | None = None) -> None:
    """Refuse the canonical directory ``real`` as a root when it is, holds or lies on a
    kernel pseudo file system (:func:`pseudo_fs_reason`). ``given``: the path as written."""
    reason = pseudo_fs_reason(real, mounts)
    if reason is not None:
        shown = printable(real) if given in (None, real) \
            else f"{printable(given)} ({printable(real)})"
        raise PolicyError(f"{field}: {shown} cannot be granted: {reason}")


def granted_root(value: Any, field: str, mounts: list[tuple[str, str]] | None = None) -> str:
    """A directory the sandbox is granted (jail, write or read-only root): an absolute path
    to an existing directory on a real file system, returned canonical."""
    path = text_path(value, field)
    real = existing_dir(path, field)
    check_grantable(real, field, mounts, path)
    return real


def output_file(value: Any, field: str) -> str:
    """A file the runtime itself appends to (a log): an absolute path (text, no control
    characters) in an existing directory, and not a directory itself. What else it may be
    (a regular file, a pipe, /dev/stderr) is the caller's choice; the CLI checks that it is
    writable before the run (receipt.check_output_path)."""
    path = text_path(value, field)
    if not os.path.isdir(os.path.dirname(path)):
        raise PolicyError(f"{field}: {printable(os.path.dirname(path))} is not an existing "
                          f"directory")
    if os.path.isdir(path):
        raise PolicyError(f"{field}: {printable(path)} is a directory")
    return path


# --- documents (policy files, pack manifests) ---------------------------------------------

def check_depth(data: Any, source: str, limit: int = MAX_DEPTH,
                error: type[PolicyError] = PolicyError) -> None:
    """Refuse a parsed document nested deeper than ``limit`` tables/arrays (iterative: the
    check itself cannot recurse too deep)."""
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, Mapping) else \
            node if isinstance(node, list) else None
        if children is None:
            continue
        if depth > limit:
            raise error(f"{source}: nested deeper than {limit} levels")
        stack.extend((child, depth + 1) for child in children)


def read_document(path: str, source: str, error: type[PolicyError] = PolicyError) -> bytes:
    """The bytes of a policy file or manifest, at most MAX_DOCUMENT of them. A pipe
    (``--policy <(...)``) works; a file larger than the bound is refused, not truncated."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_DOCUMENT + 1)
    except IsADirectoryError:
        raise error(f"{source}: is a directory, not a file") from None
    except OSError as e:
        raise error(f"{source}: {e.strerror}") from None
    if len(raw) > MAX_DOCUMENT:
        raise error(f"{source}: larger than {MAX_DOCUMENT} bytes")
    return raw


def near_miss(key: str, known: Sequence[str], cutoff: float = 0.8) -> str | None:
    """The known key ``key`` is a misspelling of: camelCase or dashed spelling, another case,
    or one edit away (difflib ratio >= ``cutoff``). For packs' and policy files' keys, and
    the names a value may take (layers, limits, modes)."""
    import difflib
    snake = re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", key).replace("-", "_").lower()
    if snake in known:
        return snake
    close = difflib.get_close_matches(snake, list(known), n=1, cutoff=cutoff)
    return close[0] if close else None


def did_you_mean(value: Any, known: Sequence[str], cutoff: float = 0.6) -> str:
    """`` (did you mean 'x'?)`` when ``value`` is a near miss of one of ``known``, else ""."""
    meant = near_miss(value, known, cutoff) if isinstance(value, str) and value else None
    return f" (did you mean {meant!r}?)" if meant else ""


def _is_json_object(text: str) -> bool:
    """Whether ``text``, which TOML refused, is a JSON object (a policy written as JSON)."""
    import json
    if not text.lstrip().startswith("{"):
        return False
    try:
        return isinstance(json.loads(text), dict)
    except (ValueError, RecursionError):
        return False


def parse_document(raw: bytes, source: str, kind: str,
                   error: type[PolicyError] = PolicyError) -> Any:
    """Parse ``raw`` as ``kind`` ("toml" or "json"), then bound its depth. Every failure is
    one line: bad UTF-8, bad syntax (the parser's own message, escaped), or nesting deep
    enough to exhaust the parser's recursion."""
    import json
    import sys
    if sys.version_info >= (3, 11):  # imported here: a run without a file does not pay it
        import tomllib
    else:  # pragma: no cover - exercised on 3.10 only
        import tomli as tomllib
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise error(f"{source}: not valid UTF-8") from None
    try:
        data = json.loads(text) if kind == "json" else tomllib.loads(text)
    except RecursionError:
        raise error(f"{source}: nested deeper than {MAX_DEPTH} levels") from None
    except json.JSONDecodeError as e:
        raise error(f"{source}: malformed JSON: {printable(str(e))}") from None
    except tomllib.TOMLDecodeError as e:
        if _is_json_object(text):
            raise error(f"{source}: is JSON; it must be TOML: `key = value` lines "
                        f"(jail = \"/srv/jail\", allow_bins = [\"sh\"])") from None
        raise error(f"{source}: malformed TOML: {printable(str(e))}") from None
    except ValueError as e:  # a parser's other refusals (an integer of 5000 digits)
        raise error(f"{source}: malformed {kind.upper()}: {show(str(e))}") from None
    check_depth(data, source, error=error)
    return data
