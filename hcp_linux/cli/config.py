"""Where the CLI finds the user's and the system's policy config, and when it refuses one.

`hcp-linux run` (and `run --pack`) read ``/etc/hcp-linux/policy.toml`` and
``$XDG_CONFIG_HOME/hcp-linux/policy.toml`` (``~/.config`` by default) when they exist, as
layers under a ``--policy`` file (hcp_linux.policy.layers). Only the CLI does: the Python API's
``Policy(...)`` and the HCP driver are pure values of what their caller says, and read no file
of their own accord (docs/policy.md, "Presets and configs").

A config is refused, one line naming it, exit 125, when a sandboxed command could have
written it: inside a root the run can write, through a symlink inside one, or in a file or
directory that another user may write or own. Otherwise run 1 could widen run 2 by writing a
config. ``--no-config`` or ``HCP_LINUX_NO_CONFIG=1`` turns the reading off.

Every run keeps these paths read-only, or removes what it made there
(hcp_linux.runtime_files), so that a run that reads no config cannot write one either.

Imported on every `run`: only os (a run with no config pays two stat calls, nothing more).
"""
from __future__ import annotations

import os

from ..runtime_files import config_candidates as candidates

#: Set (to anything but "" or "0"): read no config; as ``--no-config``.
NO_CONFIG_ENV = "HCP_LINUX_NO_CONFIG"


def disabled(no_config: bool = False) -> bool:
    """Whether configs are off for this run (``--no-config`` or HCP_LINUX_NO_CONFIG)."""
    return no_config or os.environ.get(NO_CONFIG_ENV, "") not in ("", "0")


def present(no_config: bool = False) -> list[tuple[str, str]]:
    """The configs this run reads: those that exist (a dangling link too: reading it then
    says so), none when they are turned off."""
    if disabled(no_config):
        return []
    return [(kind, path) for kind, path in candidates() if os.path.lexists(path)]


def check_trusted(kind: str, path: str) -> None:
    """Refuse a config that another user could have written: the file or its directory
    (after symlinks) owned by someone other than this user or root, or writable by group or
    others. PolicyError naming the file."""
    from ..errors import PolicyError, printable
    real = os.path.realpath(path)
    for what, p in (("", real), (" directory", os.path.dirname(real))):
        try:
            st = os.stat(p)
        except OSError as e:
            raise PolicyError(f"{kind} {printable(path)}: {e.strerror}") from None
        if st.st_uid not in (os.geteuid(), 0):
            raise PolicyError(f"{kind} {printable(path)}: its{what} {printable(p)} is owned "
                              f"by uid {st.st_uid}, not by you or root; not read (fix it, or "
                              f"--no-config)")
        if st.st_mode & 0o022:
            raise PolicyError(f"{kind} {printable(path)}: its{what} {printable(p)} is "
                              f"writable by other users (mode {st.st_mode & 0o7777:04o}); "
                              f"not read (chmod go-w, or --no-config)")


def check_outside(kind: str, path: str, writable_roots: tuple[str, ...]) -> None:
    """Refuse a config a command of this run could rewrite: the file (after symlinks)
    inside one of the run's writable roots, or a symlink on its path inside one."""
    from ..errors import PolicyError, printable
    from ..policy.values import is_within, unpinned_link
    given = os.path.normpath(os.path.abspath(path))
    real = os.path.realpath(given)
    for root in writable_roots:
        if is_within(real, root) or is_within(given, root):
            raise PolicyError(f"{kind} {printable(path)} lies inside writable root "
                              f"{printable(root)}: a command of this run could rewrite it "
                              f"to widen the next run; not read (move it, or --no-config)")
    found = unpinned_link(given, writable_roots)
    if found is not None:
        raise PolicyError(f"{kind} {printable(path)} passes through the symlink "
                          f"{printable(found[0])} inside writable root {printable(found[1])},"
                          f" which a command can re-point; not read (or --no-config)")


def describe() -> list[dict[str, str]]:
    """For `probe`: each config looked for, and what a run would do with it: ``read`` (it
    parses, its keys are known, its owner and mode pass), ``absent``, ``not read: ...``
    (turned off, or refused: the reason), ``error: ...``. Whether it lies inside a run's
    writable root depends on the run, and is checked there."""
    from ..errors import SandboxError
    out = []
    for kind, path in candidates():
        entry = {"kind": kind, "path": path}
        if disabled():
            entry["status"] = f"not read: {NO_CONFIG_ENV} is set"
        elif not os.path.lexists(path):
            entry["status"] = "absent"
        else:
            try:
                check_trusted(kind, path)
                from ..policy.layers import Layer, combine
                from ..policy.values import parse_document, read_document
                source = f"{kind} {path}"
                combine([Layer(kind, path, parse_document(read_document(path, source),
                                                          source, "toml"))])
                entry["status"] = "read"
            except SandboxError as e:
                entry["status"] = f"error: {e}"
        out.append(entry)
    return out
