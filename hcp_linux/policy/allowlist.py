"""HCP §10.2.1 / §10.5: which binary a request may run, and where it is.

Entries are bare names or absolute paths (a pack's ``bin/tool`` is made absolute, inside the
pack root, when the manifest is read). The allow-list names *binaries*, not file names:

- a bare entry ``sh`` means the binary of that name on the sandbox's fixed PATH. A bare
  request resolves there; a path request (``/bin/sh``) matches it only when that path is
  that binary (the same file, symlinks followed: ``/bin/sh`` and ``/usr/bin/sh`` on a
  merged /usr). ``./sh``, ``workspace:sh`` copied from /usr/bin/dash, or ``../outside/sh``
  do not: a file the command or the pack's user can write would otherwise become an
  allow-listed "sh";
- an absolute entry matches exactly that path (normalised), wherever it is; a relative one
  with a slash (``./tool``) the same, relative to the jail;
- nothing in a writable root (the jail, ``write_roots``) satisfies an entry unless the entry
  names that path: a bare name is never resolved to a file the sandboxed command could
  have planted.

An unlisted bare name is never looked up on any PATH. In native-local mode a bare name may
resolve on the host PATH (§10.3.1), but the allow-list still applies. (§10.5's reference
runtime matches a bare name against any path ending in ``/<name>``; that is the file-name
reading this module refuses.)
"""
from __future__ import annotations

import os
from typing import Iterator, Sequence

from ..errors import (BinNotExecutableError, BinNotFoundError, NotAllowlistedError, PolicyError,
                     printable)

#: The PATH of the sandbox: only the read-only system roots.
SANDBOX_PATH: tuple[str, ...] = ("/usr/local/bin", "/usr/bin", "/bin",
                                 "/usr/local/sbin", "/usr/sbin", "/sbin")


def _within(path: str, roots: Sequence[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _candidates(name: str, search: Sequence[str], writable: Sequence[str]) -> Iterator[str]:
    """Every file ``name`` in the ``search`` directories, in order, except those that are
    (as written or as they resolve) inside a writable root. Lazy: resolving a bare name
    stops at the first (this runs on every spawn)."""
    for d in search:
        candidate = os.path.join(d, name)
        if not os.path.isfile(candidate):
            continue
        if _within(candidate, writable) or _within(os.path.realpath(candidate), writable):
            continue
        yield candidate


def is_allowlisted(bin_: str, allow: Sequence[str], *, search: Sequence[str] = SANDBOX_PATH,
                   writable: Sequence[str] = (), cwd: str | None = None) -> bool:
    """Whether the request ``bin_`` (a bare name, or a path made absolute by the caller) is
    a binary the allow-list names. ``writable``: the roots the command may write, canonical.
    ``cwd``: what a relative entry with a slash (``./tool``) is relative to (the jail)."""
    if "/" not in bin_:
        return bin_ in allow  # a bare request matches only a bare entry
    path = os.path.normpath(bin_)
    name = os.path.basename(path)
    base = cwd if cwd is not None else ""
    if any("/" in e and os.path.normpath(os.path.join(base, e)) == path for e in allow):
        return True
    if name not in allow:
        return False
    real = os.path.realpath(path)
    if _within(path, writable) or _within(real, writable):
        return False
    return any(os.path.realpath(c) == real for c in _candidates(name, search, writable))


def resolve_bin(bin_: str, allow: Sequence[str], *, cwd: str, native_local: bool = False,
                host_path: str | None = None, writable: Sequence[str] = ()) -> str:
    """The absolute path to execute for ``bin_``, or the error HCP prescribes.

    In native-local mode only absolute entries of the host PATH are searched: a relative one
    ("." or "bin") would be looked up from the runtime's directory here and from the jail at
    exec, two different files. ``writable``: the policy's writable roots (canonical), whose
    files satisfy only an entry that names them. Names in messages are escaped (one line
    each)."""
    if not isinstance(bin_, str) or not bin_ or "\0" in bin_:
        raise PolicyError(f"invalid bin {printable(repr(bin_))}")
    search = SANDBOX_PATH
    if native_local:
        search = tuple(p for p in (host_path or "").split(os.pathsep)
                       if os.path.isabs(p)) or SANDBOX_PATH
    path = os.path.normpath(os.path.join(cwd, bin_)) if "/" in bin_ else bin_
    shown = printable(bin_)
    if not is_allowlisted(path, allow, search=search, writable=writable, cwd=cwd):
        if "/" in bin_ and os.path.basename(path) in allow and not os.path.lexists(path):
            raise BinNotFoundError(f'bin "{shown}" not found')  # no file to judge
        raise NotAllowlistedError(bin_)
    if "/" not in bin_:
        found = next(_candidates(bin_, search, writable), None)
        if found is None:
            raise BinNotFoundError(f'bin "{shown}" not found on the sandbox PATH '
                                   f'({printable(":".join(search))})')
        path = found
    if not os.path.exists(path):
        raise BinNotFoundError(f'bin "{shown}" not found')
    if os.path.isdir(path) or not os.access(path, os.X_OK):
        raise BinNotExecutableError(f'bin "{shown}" is not executable')
    return path


def _home_dirs() -> set[str]:
    homes = {"/root"}
    for value in (os.environ.get("HOME"), _pw_home()):
        if value and os.path.isabs(value):  # "" or a relative HOME names no home
            homes.add(os.path.realpath(value))
    return homes


def _pw_home() -> str | None:
    uid = os.getuid()
    if uid not in _pw_homes:  # the passwd database is read once per uid, not per spawn
        import pwd
        try:
            _pw_homes[uid] = pwd.getpwuid(uid).pw_dir
        except KeyError:
            _pw_homes[uid] = None
    return _pw_homes[uid]


_pw_homes: dict[int, str | None] = {}


def _is_install_prefix(prefix: str) -> bool:
    """A directory that holds a software install, not just a bin/ among other things.

    Under a home directory only a venv counts: ~/bin/tool must not expose ~/.ssh, and
    ~/.local/bin/tool must not expose ~/.local/share (keyrings, tokens).
    """
    if os.path.exists(os.path.join(prefix, "pyvenv.cfg")):
        return prefix not in _home_dirs()
    homes = _home_dirs()
    if any(prefix == h or prefix.startswith(h.rstrip("/") + "/") for h in homes) \
            or prefix.startswith("/home/"):
        return False
    return any(os.path.exists(os.path.join(prefix, marker)) for marker in ("lib", "lib64"))


def install_prefixes(exe: str) -> tuple[str, ...]:
    """Directories a binary needs beside the system roots: its own install prefix.

    ``/x/venv/bin/python`` needs ``/x/venv`` (site-packages, pyvenv.cfg), and the interpreter
    it links to needs its own prefix too. The parent of a ``bin``/``sbin`` directory counts
    as a prefix only when it looks like one (a venv, or a ``lib`` beside ``bin``) and is not
    a home directory; otherwise the binary gets just its own directory.
    """
    out: list[str] = []
    # The directory as reached (a venv's bin/, whose python is a symlink elsewhere) and the
    # binary's real location, both canonical: grants are opened and cloned by real path.
    # The second is the first unless the binary itself is a symlink (one lstat, not a walk).
    here = os.path.realpath(os.path.dirname(os.path.abspath(exe)))
    reached = os.path.join(here, os.path.basename(exe))
    real = os.path.dirname(os.path.realpath(reached)) if os.path.islink(reached) else here
    for d in dict.fromkeys((here, real)):
        parent = os.path.dirname(d)
        use_parent = os.path.basename(d) in ("bin", "sbin") and parent != "/" \
            and _is_install_prefix(parent)
        prefix = parent if use_parent else d
        if prefix != "/" and prefix not in out:
            out.append(prefix)
    return tuple(out)
