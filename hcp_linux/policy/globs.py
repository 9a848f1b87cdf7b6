"""Glob patterns in carve-outs (``hidden_paths``, ``read_only_paths``): expanded once, by a
walk that follows no symlink.

A pattern is a path with ``*``, ``?`` or ``[...]`` in a component; ``**`` alone as a
component matches any number of directories (none included). ``*`` matches names that begin
with a dot too (a hidden ``*.pem`` should not spare ``.key.pem``). Relative patterns are
relative to the jail. Expansion starts at the pattern's fixed prefix (its components before
the first one with a wildcard), which the caller resolves and checks like any path of the
policy, and walks below it from directory fds, each opened ``O_NOFOLLOW``: a symlinked
directory inside the walk is never entered (a command could point it anywhere, and the next
run would expand the pattern there), and a symlink that matches is returned as a match, for
the caller to judge as it judges an explicit carve-out that is a symlink.

Why bounds: every match is a mount in the sandbox's view, and the walk runs before every
run; a pattern that matches thousands of files, or a tree a command made deep or wide, must
refuse the policy (fail closed, naming the pattern), never be cut short silently: a hidden
pattern that looked at part of the tree would leave the rest readable.
"""
from __future__ import annotations

import errno
import fnmatch
import os
from dataclasses import dataclass

from ..errors import PolicyError, printable

#: The most paths one pattern may match (each is a bind or a mask in the view).
MAX_MATCHES = 256
#: The deepest directory below the pattern's fixed prefix the walk enters.
MAX_DEPTH = 32
#: The most directory entries one pattern's walk may read.
MAX_ENTRIES = 100_000

_MAGIC = frozenset("*?[")


def is_glob(entry: str) -> bool:
    """True when ``entry`` has a wildcard in some component."""
    return any(c in _MAGIC for c in entry)


@dataclass(frozen=True)
class Expansion:
    """What one pattern matched: the absolute paths (as found: their directories canonical,
    their own names as listed), sorted, and the number of entries read to find them."""

    pattern: str
    prefix: str
    matches: tuple[str, ...]
    entries_read: int


def split(pattern: str) -> tuple[str, list[str]]:
    """(fixed prefix, the components from the first wildcard one on) of an absolute,
    normalised pattern."""
    parts = [c for c in pattern.split("/") if c]
    for i, part in enumerate(parts):
        if is_glob(part):
            return "/" + "/".join(parts[:i]), parts[i:]
    return pattern, []


def expand(field: str, pattern: str, prefix_real: str, rest: list[str]) -> Expansion:
    """Every path below the directory ``prefix_real`` (canonical, checked by the caller) that
    ``rest`` matches, walked without following a symlink. PolicyError, naming ``field`` and
    ``pattern``, beyond :data:`MAX_MATCHES`, :data:`MAX_DEPTH` or :data:`MAX_ENTRIES`."""
    try:
        top = os.open(prefix_real, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ENOTDIR):
            return Expansion(pattern, prefix_real, (), 0)  # nothing there: no match
        raise PolicyError(f"{field}: pattern {printable(pattern)}: cannot read "
                          f"{printable(prefix_real)}: {e.strerror}") from None
    found: dict[str, None] = {}
    state = {"entries": 0}
    seen: set[tuple[str, int]] = set()
    try:
        _walk(field, pattern, top, prefix_real, rest, 0, 0, found, state, seen)
    finally:
        os.close(top)
    return Expansion(pattern, prefix_real, tuple(sorted(found)), state["entries"])


def _refuse(field: str, pattern: str, why: str) -> PolicyError:
    return PolicyError(f"{field}: pattern {printable(pattern)} {why}; name fewer paths (a "
                       f"narrower pattern, or the directory itself)")


def _walk(field: str, pattern: str, fd: int, path: str, rest: list[str], index: int,
          depth: int, found: dict[str, None], state: dict[str, int],
          seen: set[tuple[str, int]]) -> None:
    """Match ``rest[index:]`` below the directory ``fd`` (at ``path``)."""
    if (path, index) in seen:  # "**/**" reaches a directory twice
        return
    seen.add((path, index))
    part = rest[index]
    last = index == len(rest) - 1
    if part == "**":
        if last:  # a trailing "**": everything below, directories included
            pass
        else:
            _walk(field, pattern, fd, path, rest, index + 1, depth, found, state, seen)
    entries = _list(field, pattern, fd, path, state)
    for name, kind in entries:
        child = path.rstrip("/") + "/" + name
        if part == "**":
            if last:
                _add(field, pattern, child, found)
            if kind == "dir":
                _descend(field, pattern, fd, name, child, rest, index, depth, found, state,
                         seen)
            continue
        if not fnmatch.fnmatchcase(name, part):
            continue
        if last:
            _add(field, pattern, child, found)
        elif kind == "dir":
            _descend(field, pattern, fd, name, child, rest, index + 1, depth, found, state,
                     seen)


def _descend(field: str, pattern: str, fd: int, name: str, child: str, rest: list[str],
             index: int, depth: int, found: dict[str, None], state: dict[str, int],
             seen: set[tuple[str, int]]) -> None:
    if depth + 1 > MAX_DEPTH:
        raise _refuse(field, pattern, f"reaches deeper than {MAX_DEPTH} directories below "
                                      f"its fixed part (at {printable(child)})")
    try:
        sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                      dir_fd=fd)
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
            return  # gone, or replaced by a file or a link meanwhile: not entered
        raise PolicyError(f"{field}: pattern {printable(pattern)}: cannot read "
                          f"{printable(child)}: {e.strerror}") from None
    try:
        _walk(field, pattern, sub, child, rest, index, depth + 1, found, state, seen)
    finally:
        os.close(sub)


def _list(field: str, pattern: str, fd: int, path: str,
          state: dict[str, int]) -> list[tuple[str, str]]:
    """(name, kind) of each entry of the directory ``fd``; kind: dir (a real directory, never
    a link to one), or other."""
    out = []
    try:
        with os.scandir(fd) as it:
            for entry in it:
                state["entries"] += 1
                if state["entries"] > MAX_ENTRIES:
                    raise _refuse(field, pattern, f"reads more than {MAX_ENTRIES} directory "
                                                  f"entries")
                try:
                    is_dir = entry.is_dir(follow_symlinks=False)
                except OSError:
                    is_dir = False
                out.append((entry.name, "dir" if is_dir else "other"))
    except OSError as e:
        raise PolicyError(f"{field}: pattern {printable(pattern)}: cannot list "
                          f"{printable(path)}: {e.strerror}") from None
    out.sort()
    return out


def _add(field: str, pattern: str, path: str, found: dict[str, None]) -> None:
    if path in found:
        return
    found[path] = None
    if len(found) > MAX_MATCHES:
        raise _refuse(field, pattern, f"matches more than {MAX_MATCHES} paths")
