"""The runtime's own files that a later run trusts: kept out of every run's reach.

hcp-linux reads or runs some files of its own again on a later run: its code and the hcp-exec
binary (this package, with ``native/_build``), the Python environment it starts in (a ``.pth``
file there runs at every start), the compiled seccomp programs
(:mod:`hcp_linux.seccomp_profiles.cache`, in the virtual environment) and the CLI's configs
(``/etc/hcp-linux/policy.toml``, ``$XDG_CONFIG_HOME/hcp-linux/policy.toml``), the socket
of the user's own planner (:func:`server_directory`), and the driver's persistent
workspaces (:func:`state_directory`). A run whose
writable root holds one of them could rewrite it, and the next run of this user, in any jail
and through any runtime (one that reads no config itself, too), would be wider: a seccomp
program that allows everything, a config that grants ``/`` or the network, another binary.
:func:`hcp_linux.policy.protected.find` keeps each of :func:`protected_paths` that lies in a
writable root as it keeps ``.git/hooks``: bound read-only in the mount view, and when it is
missing, what a run made there is removed after it; the directories the runtime makes
itself (:func:`own_directories`) it makes first, so that one made during the run is
never taken for the command's.

Only os (with stat, which os imports) is imported: the CLI looks for its configs on every run.
"""
from __future__ import annotations

import os
import stat
import sys

#: This package's directory: its code, and native/_build (hcp-exec).
PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
#: The system config, read before the user's (so the user's wins).
SYSTEM_CONFIG = "/etc/hcp-linux/policy.toml"
#: The system config's path, for tests and packagers that cannot write /etc (unset: /etc).
SYSTEM_CONFIG_ENV = "HCP_LINUX_SYSTEM_CONFIG"


def user_home() -> str | None:
    """$HOME when it is absolute, else the passwd entry's home; None when neither is."""
    home = os.environ.get("HOME", "")
    if not os.path.isabs(home):
        try:
            import pwd
            home = pwd.getpwuid(os.geteuid()).pw_dir
        except (KeyError, ImportError):
            return None
    return home if os.path.isabs(home) else None


def user_config_path() -> str | None:
    """``$XDG_CONFIG_HOME/hcp-linux/policy.toml``; an unset or relative XDG_CONFIG_HOME
    means ``~/.config`` (the XDG spec ignores a relative one). None: no home to look in."""
    base = os.environ.get("XDG_CONFIG_HOME", "")
    if not os.path.isabs(base):
        home = user_home()
        if home is None:
            return None
        base = os.path.join(home, ".config")
    return os.path.join(base, "hcp-linux", "policy.toml")


def state_directory() -> str | None:
    """The driver's default state directory, ``$XDG_STATE_HOME/hcp-linux`` or
    ``~/.local/state/hcp-linux``, where every principal's persistent workspace and its lock
    live; None when XDG_STATE_HOME is relative (hcp_linux.jails.locations refuses it, so
    nothing is kept there). A run that could write there could plant files in another
    principal's workspace or take its lock's name; a driver with a ``state_dir`` of its own
    protects that one too (hcp_linux.policy.protected.protect_file)."""
    base = os.environ.get("XDG_STATE_HOME", "")
    if base:
        return os.path.join(base, "hcp-linux") if os.path.isabs(base) else None
    home = user_home()
    return None if home is None else os.path.join(home, ".local", "state", "hcp-linux")


def config_candidates() -> list[tuple[str, str]]:
    """(kind, path) of every config the CLI looks for, system first."""
    out = [("system config", os.environ.get(SYSTEM_CONFIG_ENV) or SYSTEM_CONFIG)]
    user = user_config_path()
    if user is not None:
        out.append(("user config", user))
    return out


#: Where a temporary directory is named, the first one set wins (as Python's tempfile reads
#: them): ephemeral jails (hcp_linux.jails.locations) and the user's server when it has no
#: runtime directory.
TMP_VARIABLES = ("TMPDIR", "TEMP", "TMP")


def temp_directory() -> str:
    """The user's temporary directory as this process's environment names it: the first of
    :data:`TMP_VARIABLES` set, when it is absolute, else ``/tmp``."""
    tmp = next((os.environ[name] for name in TMP_VARIABLES if os.environ.get(name)), "")
    return os.path.normpath(tmp) if tmp.startswith("/") else "/tmp"


def jail_home(base: str) -> str:
    """``BASE/hcp-linux-jails-UID``: where this user's ephemeral jails are made under the
    temp dir ``base`` (the driver's, a Ray or framework sandbox's: hcp_linux.jails.locations).
    One directory, kept once made, so that a run whose writable root holds ``base`` (a
    command run in /tmp) has it bound read-only, with every jail made in it later: another
    run's live jail is never within its reach."""
    return os.path.join(base, f"hcp-linux-jails-{os.geteuid()}")


def private_directory_problem(path: str) -> str | None:
    """Why the directory ``path`` is not this user's alone, or None (None too when it does
    not exist: :func:`make_private_directory` makes it)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        return e.strerror or str(e)
    if not stat.S_ISDIR(st.st_mode):
        return "a symlink, not a directory" if stat.S_ISLNK(st.st_mode) else "not a directory"
    if st.st_uid != os.geteuid():
        return f"owned by uid {st.st_uid}"
    if st.st_mode & 0o077:
        return f"mode {stat.S_IMODE(st.st_mode):04o} lets others in"
    return None


def make_private_directory(path: str) -> None:
    """Make ``path`` mode 0700 if it is missing; OSError, or ValueError with why when it
    is not the user's alone (made by someone else meanwhile, or before)."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    why = private_directory_problem(path)
    if why is not None:
        raise ValueError(why)
    if not os.path.isdir(path):  # removed between the mkdir and the look
        raise FileNotFoundError(2, os.strerror(2), path)


def server_directory() -> str:
    """Where the user's own `hcp-linux serve --auto` listens (hcp_linux.cli.auto_server):
    ``$XDG_RUNTIME_DIR/hcp-linux`` when XDG_RUNTIME_DIR is an absolute path to a directory
    of this user's, else ``$TMPDIR/hcp-linux-UID`` (the first of :data:`TMP_VARIABLES` set,
    when it is absolute, else /tmp). Not another user's runtime directory: root under `su`
    keeps the user's XDG_RUNTIME_DIR, and a directory of root's made there would turn away
    the user's own runs. A later run
    connects to the socket there; one that a run could replace would at best cost the next
    runs their server (the client refuses a server under a confinement it lacks), so no run
    may write there."""
    base = os.environ.get("XDG_RUNTIME_DIR", "")
    if base.startswith("/"):
        try:
            st = os.stat(base)
        except OSError:
            st = None
        if st is not None and st.st_uid == os.geteuid() and stat.S_ISDIR(st.st_mode):
            return os.path.join(os.path.normpath(base), "hcp-linux")
    return os.path.join(temp_directory(), f"hcp-linux-{os.geteuid()}")


def pending_directory() -> str | None:
    """Where the sweeps owed by runs whose runtime died are written down
    (:mod:`hcp_linux.policy.protected.pending`): the virtual environment's
    ``share/hcp-linux/pending-UID``, None outside one. A record there tells a later run
    what to move aside: one a run could forge would move the user's files, or restore a
    symlink of its choosing. So it lives with the code, as the compiled seccomp programs
    do: the environment exists before any run, every run keeps it read-only (it is
    :func:`interpreter_environment`), and whoever can write it can already make every
    start of its Python run their code. Not in the temp dir: a run of another
    configuration (another TMPDIR) that could write there is not one this runtime sees."""
    if sys.prefix == sys.base_prefix:
        return None
    return os.path.join(sys.prefix, "share", "hcp-linux", f"pending-{os.geteuid()}")


def interpreter_environment() -> list[str]:
    """Where the Python that runs hcp-linux takes code from at every start: its prefix (a
    virtual environment: its ``bin``, its ``site-packages`` and their ``.pth`` files, the
    packages hcp-linux imports) and the user's site-packages when Python reads it. A run
    that could add a ``.pth`` file there would run its code in the next ``hcp-linux``."""
    out = [sys.prefix]
    site = sys.modules.get("site")  # imported at start-up (not under -S)
    if site is not None and getattr(site, "ENABLE_USER_SITE", False):
        user_site = getattr(site, "USER_SITE", None)
        if user_site:
            out.append(user_site)
    return out


def own_directories() -> list[str]:
    """The directories among :func:`protected_paths` that hcp-linux makes itself, when it
    first needs one: the seccomp program cache, the user's server's directory, the user's
    jail home in the temp dir and the driver's state directory. What appears at a missing
    protected path during a run is taken for the command's and removed after it, with all
    it holds; one of these made during a run (by this runtime caching the run's filter, by
    another starting the user's server, an ephemeral jail or a persistent workspace) would
    be. So :func:`hcp_linux.policy.protected.find` makes each one a writable root holds
    (:func:`make_own_directory`) before it looks: then it is kept as the rest are."""
    from .seccomp_profiles.cache import cache_dir
    programs = cache_dir()
    out = [] if programs is None else [programs]
    out += [server_directory(), jail_home(temp_directory())]
    state = state_directory()
    if state is not None:
        out.append(state)
    return out


def make_own_directory(path: str) -> None:
    """Make one of :func:`own_directories` if it is missing: mode 0700, its missing parents
    0755 (as the code that uses it makes it). OSError, or ValueError with why when it is
    there but not the user's alone (the code that uses it refuses it, or degrades)."""
    os.makedirs(os.path.dirname(path), 0o755, exist_ok=True)
    make_private_directory(path)


def protected_paths(own: list[str] | None = None) -> list[str]:
    """Canonical paths of the files above, as this process names them now (its environment
    says where the configs and the program cache are): this package's directory, the
    interpreter's environment, each config the CLI would look for, and
    :func:`own_directories` (the seccomp program cache, the user's server's directory, the
    user's jail home, the driver's state directory), whether or not it exists (a run must
    not make one either: :func:`hcp_linux.policy.protected.find` makes them first).
    ``own``: :func:`own_directories` as the caller read it already (once a run)."""
    paths = [PACKAGE_DIR, *interpreter_environment()]
    paths += [path for _, path in config_candidates()]
    paths += own_directories() if own is None else own
    out: list[str] = []
    looked: dict[str, bool] = {}  # component -> is a symlink (the paths share prefixes)
    for path in paths:
        # what the path leads to, and each symlink on the way as written: a run that could
        # re-point one (~/.config/hcp-linux -> a dotfiles checkout) would choose what the
        # next run reads there; a protected symlink is restored after the run. With no
        # symlink and no "..", the path as written is where it leads (one lstat a component)
        links = _links_on(os.path.abspath(path), looked)
        plain = not links and ".." not in path.split("/")
        for found in (*links, os.path.abspath(path) if plain else os.path.realpath(path)):
            if found not in out:
                out.append(found)
    return out


def _links_on(path: str, looked: dict[str, bool]) -> list[str]:
    """The symlinks among ``path``'s components, each as the path that names it."""
    out, current = [], "/"
    for part in path.strip("/").split("/"):
        current = os.path.join(current, part)
        link = looked.get(current)
        if link is None:
            link = looked[current] = os.path.islink(current)
        if link:
            out.append(current)
    return out
