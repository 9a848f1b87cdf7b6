"""Where runs keep their directories: the state dir (persistent workspaces) and the temp dir
(ephemeral jails), read from the environment as the XDG spec and Python's ``tempfile`` do,
and checked before anything is made there: absolute, writable, ours, and apart from the
system roots every sandbox can read. A bad value is refused with the variable it came from.
"""
from __future__ import annotations

import os
import tempfile

from ..errors import PolicyError, SandboxError, printable
from ..policy.protected import protect_directory
from ..policy.values import dir_problem
from ..runtime_files import TMP_VARIABLES, jail_home, make_private_directory, \
    state_directory, user_home

__all__ = ["default_state_dir", "state_dir_path", "check_state_dir", "default_tmp_dir",
           "check_tmp_dir", "make_jail_home"]


def default_state_dir() -> str:
    """``$XDG_STATE_HOME/hcp-linux``, else ``$HOME/.local/state/hcp-linux`` (XDG Base
    Directory), validated as :func:`check_state_dir` does, with the variable it came from
    named in the refusal. ``$XDG_STATE_HOME`` is made on first use when missing (the XDG
    spec says so); ``$HOME`` must exist (a home is never ours to make, and a missing one,
    such as nobody's /nonexistent, is a misconfiguration)."""
    path, base, label = _state_dir_from_env()
    return check_state_dir(path, label, base=base)


def state_dir_path() -> str:
    """Where :func:`default_state_dir` would be, unchecked and not made (to recognise paths
    into it)."""
    return _state_dir_from_env()[0]


def _state_dir_from_env() -> tuple[str, str | None, str]:
    """(the default state dir, the directory that must exist or None, the variable). The
    path is :func:`hcp_linux.runtime_files.state_directory`'s, which the runs protect, once
    the variables it is read from are valid: the XDG spec ignores a relative value; we
    refuse it (a workspace silently kept elsewhere than asked is a surprise), and a relative
    or missing home too."""
    xdg = os.environ.get("XDG_STATE_HOME", "")
    home: str | None = None
    if xdg:
        if not os.path.isabs(xdg):
            raise PolicyError(f"XDG_STATE_HOME={printable(xdg)}: not an absolute path")
        label = f"XDG_STATE_HOME={xdg}"
    elif "HOME" in os.environ:
        home = os.environ["HOME"]
        if not os.path.isabs(home):
            raise PolicyError(f"HOME={printable(home)}: not an absolute path (the state dir "
                              f"is $HOME/.local/state/hcp-linux when XDG_STATE_HOME is unset)")
        label = f"HOME={home}"
    else:
        home = user_home()
        if home is None:
            raise PolicyError(f"HOME is unset and uid {os.geteuid()} has no home directory; "
                              f"set XDG_STATE_HOME")
        label = f"HOME (unset; the home directory of uid {os.geteuid()} is {home})"
    path = state_directory()
    assert path is not None  # None only for a relative XDG_STATE_HOME, refused above
    return path, home, label


def check_state_dir(path: str, label: str, *, base: str | None = None) -> str:
    """``path`` as the state dir, where persistent workspaces (writable jails) are made;
    ``label`` says where it came from (``XDG_STATE_HOME=...``, ``state_dir ...``). Absolute,
    outside the system roots, and a directory we can write in, or creatable (made 0700 on
    first use) under the nearest existing one, which must be such a directory; ``base``,
    when given, must exist. Checked before anything is made: a bad value creates nothing."""
    path = _absolute(path, label)
    if base is not None:
        try:
            os.stat(base)
        except OSError as e:
            raise PolicyError(f"{printable(label)}: {e.strerror}") from None
    existing = path
    while True:
        try:
            st = os.stat(existing)
            break
        except FileNotFoundError:
            up = os.path.dirname(existing)
            if up == existing:
                raise PolicyError(f"{printable(label)}: no existing parent directory") from None
            existing = up
        except OSError as e:
            raise PolicyError(f"{printable(label)}: {printable(existing)}: {e.strerror}") \
                from None
    why = dir_problem(existing, st)
    if why is not None:
        raise PolicyError(f"{printable(label)}: {printable(existing)} is {why}")
    _outside_system_roots(path, label, "workspaces")
    return path


#: The stand-in jail of a driver's base policy, which every exec replaces with the jail it
#: makes: this package's own directory, which exists, is searchable by whoever imports the
#: package, and holds no mount. Never granted to a run. Not TMPDIR: other software mounts
#: things there (docker, podman, chroots), and a base policy that named TMPDIR as its jail
#: was refused for mounts inside a directory no run is ever granted.
PLACEHOLDER_JAIL = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def default_tmp_dir() -> str:
    """The directory ephemeral jails are made in: ``TMPDIR``, ``TEMP`` or ``TMP`` (the first
    one set, as Python's ``tempfile`` reads them) validated by :func:`check_tmp_dir`, else
    the system's (``/tmp``). Python falls back silently past a bad value; we name it and
    refuse, as ``mktemp`` does."""
    for name in TMP_VARIABLES:
        value = os.environ.get(name)
        if value:
            return check_tmp_dir(value, f"{name}={value}")
    try:
        found = tempfile.gettempdir()
    except OSError as e:  # none of /tmp, /var/tmp, /usr/tmp, the cwd takes a file
        raise PolicyError(f"no usable temporary directory ({e.strerror or e}: a read-only "
                          f"or full file system?); set TMPDIR to a writable directory") \
            from None
    return check_tmp_dir(found, "the temp dir")


def check_tmp_dir(path: str, label: str) -> str:
    """``path`` as a place for ephemeral jails (``label`` says where it came from): an
    absolute path to an existing directory we can write in, outside the system roots."""
    path = _absolute(path, label)
    why = dir_problem(path)
    if why is not None:
        raise PolicyError(f"{printable(label)}: {why}")
    _outside_system_roots(path, label, "jails")
    return path


def make_jail_home(base: str) -> str:
    """This user's jail home in the temp dir ``base`` (hcp_linux.runtime_files.jail_home),
    made mode 0700 when missing; every ephemeral jail (the driver's, a Ray or framework
    sandbox's) is made inside it, never beside it: a run whose writable root holds ``base``
    (a command run in /tmp) has the home bound read-only, with the jails made in it later,
    so no run reaches another's live jail. Protected in every later run of this process
    (``base`` may be a ``tmp_dir`` no other process knows). OSError when it cannot be made;
    SandboxError, naming it, when it is not this user's alone (another user made it
    first: nothing is made in it)."""
    home = jail_home(base)
    try:
        make_private_directory(home)
    except ValueError as e:
        raise SandboxError(f"jail: {printable(home)}: {e} (not this user's alone); remove it "
                           f"or set TMPDIR to a directory of your own") from None
    protect_directory(home)
    return home


def _absolute(path: object, label: str) -> str:
    """``path`` normalised, when it is an absolute text path (from the API it may be any
    object); else one line naming ``label``."""
    if not isinstance(path, str):
        try:
            path = os.fspath(path)  # type: ignore[arg-type, call-overload]
        except TypeError:
            path = None
        if not isinstance(path, str):
            raise PolicyError(f"{printable(label)}: expected a text path")
    if not path:
        raise PolicyError(f"{printable(label)}: empty path")
    if "\0" in path:
        raise PolicyError(f"{printable(label)}: contains a NUL byte")
    if not os.path.isabs(path):
        raise PolicyError(f"{printable(label)}: not an absolute path")
    return os.path.normpath(path)


def _outside_system_roots(path: str, label: str, what: str) -> None:
    """Refuse a place for jails inside a system root of the default policy (every sandbox
    sees those, read-only: its jails, a principal's workspace, would be readable from all of
    them) or containing one (a jail there overlaps the read-only system view)."""
    from ..policy.policy import DEFAULT_SYSTEM_ROOTS
    real = os.path.realpath(path)
    for root in DEFAULT_SYSTEM_ROOTS:
        root_real = os.path.realpath(root)
        if _within(real, root_real):
            where = "is" if real == root_real else "is inside"
            raise PolicyError(f"{printable(label)}: {printable(path)} {where} the system root "
                              f"{root}, which every sandbox can read ({what} there would be "
                              f"visible to all of them)")
        if _within(root_real, real):
            raise PolicyError(f"{printable(label)}: {printable(path)} contains the system "
                              f"root {root}")


def _within(inner: str, outer: str) -> bool:
    return inner == outer or inner.startswith(outer.rstrip("/") + "/")
