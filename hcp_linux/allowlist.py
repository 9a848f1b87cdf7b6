"""HCP §10.2.1 / §10.5: which binary a request may run, and where it is.

Entries are bare names or absolute paths. A bare entry matches a path ending in ``/<name>``;
a listed bare name resolves on the sandbox's fixed PATH; an unlisted bare name is never
looked up on any PATH. In native-local mode a bare name may resolve on the host PATH
(§10.3.1), but the allow-list still applies.
"""
from __future__ import annotations

import os
from typing import Sequence

from .errors import (BinNotExecutableError, BinNotFoundError, NotAllowlistedError, PolicyError,
                     printable)

#: The PATH of the sandbox: only the read-only system roots.
SANDBOX_PATH: tuple[str, ...] = ("/usr/local/bin", "/usr/bin", "/bin",
                                 "/usr/local/sbin", "/usr/sbin", "/sbin")


def is_allowlisted(bin_: str, allow: Sequence[str]) -> bool:
    if "/" not in bin_:
        return bin_ in allow  # a bare request matches only a bare entry
    name = os.path.basename(bin_)
    for entry in allow:
        if "/" in entry:
            if os.path.normpath(entry) == os.path.normpath(bin_):
                return True
        elif entry == name:
            return True
    return False


def _search(name: str, path: Sequence[str]) -> str | None:
    for d in path:
        candidate = os.path.join(d, name)
        if os.path.isfile(candidate):
            return candidate
    return None


def resolve_bin(bin_: str, allow: Sequence[str], *, cwd: str, native_local: bool = False,
                host_path: str | None = None) -> str:
    """The absolute path to execute for ``bin_``, or the error HCP prescribes.

    In native-local mode only absolute entries of the host PATH are searched: a relative one
    ("." or "bin") would be looked up from the runtime's directory here and from the jail at
    exec, two different files. Names in messages are escaped (one line each)."""
    if not isinstance(bin_, str) or not bin_ or "\0" in bin_:
        raise PolicyError(f"invalid bin {printable(repr(bin_))}")
    if not is_allowlisted(bin_, allow):
        raise NotAllowlistedError(bin_)
    shown = printable(bin_)
    if "/" in bin_:
        path = os.path.normpath(os.path.join(cwd, bin_))
    else:
        search = SANDBOX_PATH
        if native_local:
            search = tuple(p for p in (host_path or "").split(os.pathsep)
                           if os.path.isabs(p)) or SANDBOX_PATH
        found = _search(bin_, search)
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
