"""Names in a writable root that make the host run code later: protected by default.

A sandboxed command may write its jail; the user's own tools read some of what it holds
afterwards, on the host, unconfined: git runs ``.git/hooks/*`` and the commands named in
``.git/config``, a shell sources its rc files, direnv runs ``.envrc``, editors and agents run
tasks and MCP servers named in their settings. So, at the top level of every writable root
(the jail, each write root), the names in :data:`NAMES` are protected unless the policy's
``allow_write_protected`` opts out (docs/policy.md, "Protected names"):

- an existing file or directory is bound read-only over itself in the mount view (the
  carve-out machinery of hcp_linux.plan.confinement), its parents inside the root pinned;
- a missing one cannot be a mount point without creating a file in the user's tree. By
  default (``protect_missing = "quiet"``) a missing name inside an existing git directory
  (``hooks``, ``commondir``...: git never shows what is there) and a missing editor or agent
  directory at the top level of a repository (``.vscode``, ``.claude``...: git lists no
  empty directory)
  gets an empty placeholder, made once (and left: a new inode each run would defeat the
  confinement cache and the spares) and bound read-only like an existing one, so nothing
  can be created there during the run; whatever appears at any other missing name is
  removed once the run has ended (every process of it gone), without following a symlink.
  ``"placeholders"`` makes them at every missing name; ``"git"`` inside git directories
  only; ``"sweep"`` at none;
- a symlink is restored to what it named (and its target, when inside a writable root, is
  bound read-only).

What exists is found per run (:func:`find`): ``git init`` makes ``.git`` between two runs.
Without a mount view only the after-run sweep is left, and the receipt says so. With the
sweep, during the run the host should not run its tools in the jail (a file planted at a
missing name exists until the run ends). Only stdlib, imported on the served client's path
(its sweep).

The package: this module (the lookup before a run, placeholders, the sweep), ``names``
(the names, each with why), ``search`` (below the top level), ``git_config`` (where a
repository's config points: hooksPath, includes), ``after`` (what a run made below the top
level, and in submodules, removed after it), ``git_index`` (the submodules an index names),
``walk`` (paths walked without following a symlink; trees removed through fds). Each
imports only the stdlib and its siblings; ``search``, ``git_config`` and ``git_index`` are
imported when they run, so the served client's sweep stays light.
"""
from __future__ import annotations

import errno
import os
import stat
import _thread  # threading.Lock without importing threading (the served path)

from .after import CTIME_SLACK, After, now, sweep_made
from .names import FILE_ONLY, NAMES
from .walk import join, make_usable, open_dir_path, remove, within

__all__ = ["CTIME_SLACK", "After", "Found", "SweepEntry", "check_allowed", "find", "now",
           "protect_directory", "protect_file", "sweep", "sweep_made"]

#: One path the after-run sweep looks at: (path, what it must hold, file_only). What it must
#: hold: None, nothing (what appeared is removed); a str, the symlink to that target
#: (restored); (st_dev, st_ino), the file or directory bound read-only over itself, which a
#: run cannot have written: anything else there once the run is over was put there during
#: it, when that bind was gone, and is moved aside (:func:`sweep`). ``file_only``: a
#: directory at a removed name is left (a repository's ``.git``).
SweepEntry = tuple[str, "str | tuple[int, int] | None", bool]

#: ``protect_missing``: what keeps a missing name missing during a run (docs/policy.md):
#: ``quiet`` (the default) makes placeholders only where nobody sees them: inside existing
#: git directories (git never shows what is there) and, at the top level, the directories
#: an editor or agent reads while it runs beside the sandbox (:data:`_QUIET_NAMES`: an empty
#: directory is invisible to git, and none of these tools reads an empty one as anything);
#: the rest is swept. ``git``: inside git directories only; ``sweep``: none;
#: ``placeholders``: at every missing name of the top level.
PROTECT_MISSING = ("quiet", "git", "sweep", "placeholders")
DEFAULT_PROTECT_MISSING = "quiet"

#: ``protect_depth``: how many directory levels below each writable root's top are searched
#: for names that exist (nested repositories, a subproject's ``.envrc`` or ``.vscode``). The
#: default matches the search depth peers use (3); 0 protects the top level only.
DEFAULT_DEPTH = 3
MAX_DEPTH = 16

#: Names whose placeholder is an empty directory (the tools that read them expect one).
_DIR_NAMES = frozenset({".git/hooks", ".vscode", ".idea", ".claude", ".cursor", ".ssh",
                        ".config/fish/conf.d", ".config/systemd/user",
                        ".config/environment.d", ".config/autostart", ".local/bin",
                        ".config/direnv", ".vim", ".config/nvim", ".emacs.d", ".codex",
                        ".gemini", ".config/opencode"})

#: The top-level names ``quiet`` gives a placeholder in a root holding ``.git`` (a project
#: an editor may have open; a bare jail gets none, so what a driver lists there is its own):
#: read live by an editor or an agent harness open on the project while a sandboxed command
#: runs (VS Code applies a changed ``.vscode/settings.json`` at once, an agent re-reads
#: ``.claude/settings.json`` hooks), so a window until the after-run sweep is one they can
#: act in. Directories: git lists no empty directory, so nothing shows in ``git status`` or
#: ``git add -A``. Left to the sweep: files
#: (an empty ``.envrc`` or ``.mcp.json`` shows in git and direnv blocks it), ``.ssh`` (a
#: project has none), ``.git`` (a placeholder would stop ``git init`` in the jail).
_QUIET_NAMES = frozenset({".vscode", ".idea", ".claude", ".cursor"})

#: A placeholder's content where empty is not what the tool reads as absent: ``.`` makes
#: git's common dir the repository itself (an empty commondir makes git die).
_CONTENT = {".git/commondir": b".\n"}

#: Names never given a placeholder: an empty ``.git`` file or directory would break git in
#: the jail (``git init`` included); the sweep is left for it.
_NO_PLACEHOLDER = frozenset({".git"})

#: How each protected path is kept (the receipt's ``protected`` values).
BOUND = "read-only bind"
PLACED = "read-only bind (placeholder made by protect_missing)"
REMOVED = "removed after the run"
RESTORED = "restored after the run"
REMOVED_NO_VIEW = "removed after the run (no mount view: the sweep is the only protection)"
RESTORED_NO_VIEW = "restored after the run (no mount view: the sweep is the only protection)"
WRITABLE_NO_VIEW = "writable: no mount view to make it read-only"
ALLOWED = "writable: allow_write_protected"
INSIDE_BOUND = "read-only: inside a protected directory bound read-only"

#: Files this process's own configuration came from (the CLI's --policy and --pack): they
#: would widen the next run, so they are protected like the names, in every run of this
#: process, while they lie in a writable root (:func:`protect_file`).
_config_files: list[str] = []
#: Directories of this process's own it makes when it needs one (a driver's ``state_dir``, a
#: ``tmp_dir``'s jail home): made before a run whose root holds one looks
#: (:func:`protect_directory`), as :func:`hcp_linux.runtime_files.own_directories` are.
_own_directories: list[str] = []
_config_lock = _thread.allocate_lock()


def protect_file(path: str) -> None:
    """Protect ``path`` (a configuration file this process read) in every later run."""
    real = os.path.realpath(path)
    with _config_lock:
        if real not in _config_files:
            _config_files.append(real)


def protect_directory(path: str) -> None:
    """Protect ``path``, a directory this process makes when it needs one (a driver's
    ``state_dir``, where every principal's workspace goes), in every later run as
    :func:`protect_file` does; and have it made, when a writable root holds it, before the
    run looks (:func:`find`): made during the run, by a workspace another principal's run
    starts, it would be taken for the command's and removed after it, with that workspace."""
    real = os.path.realpath(path)
    protect_file(real)
    with _config_lock:
        if real not in _own_directories:
            _own_directories.append(real)


def check_allowed(entries: tuple[str, ...], error: type[Exception]) -> tuple[str, ...]:
    """``allow_write_protected``: names of :data:`NAMES` or absolute paths, kept as given
    (a path normalised); an unknown name is refused with the list of known ones."""
    out = []
    for entry in entries:
        if entry.startswith("/"):
            out.append(os.path.normpath(entry))
        elif entry in NAMES:
            out.append(entry)
        else:
            raise error(f"allow_write_protected: unknown name {entry!r} (known: "
                        f"{' '.join(NAMES)}; or an absolute path)")
    return tuple(dict.fromkeys(out))


class Found:
    """What one run protects, found right before it (hashable: part of the confinement
    cache's key). ``read_only``: existing files and directories to bind read-only;
    ``pins``: existing directories between a protected path and its root, bound over
    themselves so that none can be renamed away; ``how``: each path and how it is kept;
    ``sweep``: :data:`SweepEntry` for the sweep;
    ``stopped``: (root, why) for each writable root whose nested search stopped early;
    ``after``: the search again once the run is over, for what it made below the top level
    (:func:`sweep_made`); ``recovered``: what the owed sweeps of runs whose runtime died
    moved aside right before (:mod:`.pending`), each path and what was done.

    A frozen value written out rather than a dataclass: the served client imports this
    module for the sweep, and dataclasses (with inspect) cost it ~5 ms at start-up."""

    __slots__ = ("read_only", "pins", "how", "sweep", "stopped", "after", "recovered")
    read_only: tuple[str, ...]
    pins: tuple[str, ...]
    how: tuple[tuple[str, str], ...]
    sweep: tuple[SweepEntry, ...]
    stopped: tuple[tuple[str, str], ...]
    after: "After | None"
    recovered: tuple[tuple[str, str], ...]

    def __init__(self, read_only: tuple[str, ...] = (), pins: tuple[str, ...] = (),
                 how: tuple[tuple[str, str], ...] = (),
                 sweep: tuple[SweepEntry, ...] = (),
                 stopped: tuple[tuple[str, str], ...] = (),
                 after: "After | None" = None,
                 recovered: tuple[tuple[str, str], ...] = ()) -> None:
        for name, value in zip(self.__slots__, (read_only, pins, how, sweep, stopped, after,
                                                recovered)):
            object.__setattr__(self, name, value)

    def _fields(self) -> tuple:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"cannot assign to field {name!r}")  # frozen, as it was

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"cannot delete field {name!r}")

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._fields() == other._fields()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        inner = ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__slots__)
        return f"Found({inner})"

    def __reduce__(self) -> tuple:
        return (Found, self._fields())  # pickle and copy: through __init__ (frozen)


def find(policy, view: bool) -> Found:  # type: ignore[no-untyped-def]
    """The protected paths of ``policy``'s writable roots as they are now. A path inside a
    carve-out of the policy (read-only or hidden already) or opted out is skipped. With a
    mount view and ``protect_missing = "placeholders"``, a missing name gets its placeholder
    here (PolicyError, naming it, when it cannot be made: fail closed)."""
    # here, not at the top: the served client imports this module for the sweep alone
    from . import pending, search as protected_search
    from ...runtime_files import make_own_directory, own_directories, protected_paths
    # first the sweeps that runs whose runtime died still owe: else what their commands
    # planted would be found here existing, taken for the user's, and kept
    recovered = tuple(pending.collect().items())
    allowed = policy.allow_write_protected
    mode = policy.protect_missing
    place = view and mode == "placeholders"
    place_quiet = view and mode == "quiet"
    place_git = view and mode in ("quiet", "git", "placeholders")
    covered = policy.read_only_paths + policy.hidden_paths
    read_only: list[str] = []
    ro_dirs: list[str] = []  # the directories among them
    pins: list[str] = []
    how: list[tuple[str, str]] = []
    sweep: list[SweepEntry] = []
    stopped: list[tuple[str, str]] = []
    roots = policy.writable_roots
    with _config_lock:
        configs = [(None, p, p, True) for p in _config_files]
        registered = list(_own_directories)
    # the directories the runtime makes itself when it needs one (runtime_files.
    # own_directories: the seccomp program cache, the user's server's, the jail home, the
    # driver's state; and this process's own: protect_directory), made now when a root
    # holds one. Made during this run (this runtime caching the filter it is about to
    # compile, another starting the user's server or a jail), it would be taken for the
    # command's and removed after it, with what it holds then (another run's live jail, a
    # persistent workspace). Made now, it is kept as the rest are (bound read-only), and
    # what another runtime makes in it later is under that bind. One that cannot be made
    # (no room, another user's name) stays missing, and swept
    owned = own_directories()
    for own in (*owned, *registered):
        if any(within(own, r) and own != r for r in roots):
            try:
                make_own_directory(own)
            except (OSError, ValueError):
                pass
    # the runtime's own files a later run trusts (its code, the seccomp programs, the CLI's
    # configs: hcp_linux.runtime_files), kept as the configuration files above are
    configs += [(None, p, p, True) for p in protected_paths(owned)]
    # and the seccomp profiles this policy names by path: its next run loads them again
    configs += [(None, p, p, True) for p in _profile_files(policy.seccomp_profiles)]
    # (root, path, key of NAMES or the path, whether a missing one is swept): the top level's
    # names (missing ones swept), then what the nested search finds existing
    entries: list[tuple[str | None, str, str, bool]] = []
    # the roots ``quiet`` makes top-level placeholders in: a project (a repository, where git
    # hides an empty directory), not a bare jail a driver fills and lists
    projects = {r for r in roots if place_quiet and os.path.lexists(join(r, ".git"))}
    skip = tuple(dict.fromkeys(roots + covered))
    for root in roots:
        entries.extend((root, join(root, n), n, True) for n in NAMES)
        search = protected_search.Search(root, policy.protect_depth, set(skip))
        entries.extend((root, p, n, sweep_missing) for p, n, sweep_missing in search.run())
        if search.stopped:
            stopped.append((root, search.stopped))
    entries.extend(configs)
    derived = _redirected(entries)
    entries.extend((None, path, key, True) for path, key in derived.items())
    seen: set[str] = set()
    dirs: dict[str, str] = {}  # the directories on the way, looked at once (_look)
    for root, path, name, sweep_missing in entries:
        if path in seen:
            continue
        seen.add(path)
        if root is None:  # a configuration file: inside a writable root, or nothing
            root = next((r for r in roots if within(path, r) and path != r), None)
            if root is None:
                continue
        if any(within(path, c) for c in covered):
            continue
        if name in allowed or path in allowed:
            how.append((path, ALLOWED))
            continue
        kind, target, parents = _look(root, path, dirs)
        if not sweep_missing and kind in ("missing", "missing-parent"):
            continue  # a nested name that is not there: the search found it, then it went
        placed = False
        top = path == join(root, name)
        if kind == "missing" and name in NAMES and name not in _NO_PLACEHOLDER \
                and path not in derived and (
                (place and top) or (top and root in projects and name in _QUIET_NAMES)
                or (place_git and name.startswith(".git/"))):  # in an existing git dir
            placed = _make_placeholder(path, name)
            dirs.clear()  # a placeholder directory may lie on the way to a later name
            kind, target, parents = _look(root, path)  # made, or what appeared meanwhile
        if parents is None or (kind == "dir" and name in FILE_ONLY):
            # under a file or symlink (a gitdir-pointer .git: itself protected), or the .git
            # directory (its hooks and config are listed): nothing of its own to protect
            continue
        if kind in ("missing", "missing-parent"):
            how.append((path, REMOVED if view else REMOVED_NO_VIEW))
            sweep.append((path, None, name in FILE_ONLY))
            pins.extend(parents or ())
        elif kind == "symlink":
            how.append((path, RESTORED if view else RESTORED_NO_VIEW))
            sweep.append((path, target, False))
            pins.extend(parents or ())
            real = os.path.realpath(path)
            holder = next((r for r in roots if within(real, r) and real != r), None)
            if view and holder is not None and not any(within(real, c) for c in covered):
                _, _, real_parents = _look(holder, real)
                is_dir = os.path.isdir(real)
                if is_dir or os.path.isfile(real):
                    read_only.append(real)
                    if is_dir:
                        ro_dirs.append(real)
                    pins.extend(real_parents or ())
                    _keep(sweep, real)
        elif kind in ("file", "dir"):
            if view:
                how.append((path, PLACED if placed else BOUND))
                read_only.append(path)
                if kind == "dir":
                    ro_dirs.append(path)
                pins.extend(parents or ())
                _keep(sweep, path)
            else:
                how.append((path, WRITABLE_NO_VIEW))
        # anything else (a fifo, a socket, a device) is left as it is: no code in it
    if ro_dirs:
        read_only, sweep, how = _inside_bound(ro_dirs, read_only, sweep, how)
    ro = tuple(dict.fromkeys(read_only))
    after = After(tuple((r, policy.protect_depth, skip) for r in roots), tuple(sorted(seen)),
                  tuple(allowed)) if roots else None
    return Found(read_only=ro, pins=tuple(p for p in dict.fromkeys(pins) if p not in ro),
                 how=tuple(how), sweep=tuple(sweep), stopped=tuple(stopped), after=after,
                 recovered=recovered)


def _inside_bound(ro_dirs: list[str], read_only: list[str], sweep: list[SweepEntry],
                  how: list[tuple[str, str]]
                  ) -> tuple[list[str], list[SweepEntry], list[tuple[str, str]]]:
    """Drop what lies inside a protected directory bound read-only (the runtime's package
    in a project's bound ``.venv``, a name the search found in ``.vscode``): no bind, no
    inode check, no sweep of its own. The command cannot change anything there: the
    directory's bind holds, or, taken away by the host's rename, its own check moves the
    whole directory that replaced it aside. What does change there during the run is the
    host's (``pip install -U`` in the user's shell replacing the package), and its own
    check moved that aside after the run; each was one more mount too. Such a path is
    read-only in the receipt, inside its directory's bind."""
    def inside(path: str) -> bool:
        return any(within(path, d) and path != d for d in ro_dirs)
    return ([p for p in read_only if not inside(p)], [e for e in sweep if not inside(e[0])],
            [(p, INSIDE_BOUND if inside(p) and h != ALLOWED else h) for p, h in how])


def _keep(sweep: list[SweepEntry], path: str) -> None:
    """Have the sweep check that ``path`` still holds the inode bound read-only over it now.
    A bind is on the host's name, not on the file: when another process unlinks or renames
    it during the run (a concurrent run's sweep, the user's editor or git replacing a file
    by rename), the kernel takes the bind away in every other mount namespace, and the
    command can make a file there that this run's bind was to keep out."""
    try:
        st = os.lstat(path)
    except OSError:
        return  # gone already: nothing was bound; whatever appears is the next run's
    sweep.append((path, (st.st_dev, st.st_ino), False))


def _profile_files(profiles: tuple[str, ...]) -> list[str]:
    """The canonical paths of the profiles named by path (hcp_linux.seccomp_profiles'
    registry: a reference with a ``/`` or ending in ``.toml``), not the shipped ones by name
    (in the package, protected with it)."""
    return [os.path.realpath(ref) for ref in profiles if "/" in ref or ref.endswith(".toml")]


def _redirected(entries: list[tuple[str | None, str, str, bool]]) -> dict[str, str]:
    """What each repository's config (a root's, a nested one's, a submodule's) makes git
    read or run from elsewhere (.git_config): the directory
    ``core.hooksPath`` names, kept as ``.git/hooks`` is, and each included config file,
    kept as ``.git/config`` is (opted out under those names). Path -> key."""
    from . import git_config
    out: dict[str, str] = {}
    for root, path, name, _ in entries:
        if name != ".git/config" or root is None:
            continue
        gitdir = os.path.dirname(path)
        # git runs hooks in the work tree's top: the directory holding .git (a submodule's
        # git directory under .git/modules says where in core.worktree: its hooksPath is
        # not followed, its includes are)
        worktree = os.path.dirname(gitdir) if os.path.basename(gitdir) == ".git" else None
        hooks, included = git_config.redirects(path, worktree or gitdir)
        for hook_dir in hooks if worktree is not None else ():
            out.setdefault(hook_dir, ".git/hooks")
        for config in included:
            out.setdefault(config, ".git/config")
    return out


def _make_placeholder(path: str, name: str) -> bool:
    """Make ``name``'s placeholder at ``path``, its parent reached from / without following
    a symlink (:func:`open_dir_path`, the sweep's walk): an empty directory or file, or a
    file holding :data:`_CONTENT`. False when nothing was made: something is there already,
    or a parent is gone or became a link meanwhile (the caller looks again)."""
    from ...errors import PolicyError  # here: the served client imports this module light
    parent, last = path.rsplit("/", 1)
    dirs: dict[str, int | None] = {}
    try:
        fd = open_dir_path(parent or "/", dirs)
        if fd is None:
            return False
        if name in _DIR_NAMES:
            os.mkdir(last, 0o755, dir_fd=fd)
        else:
            out = os.open(last, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                          | os.O_CLOEXEC, 0o644, dir_fd=fd)
            try:
                content = _CONTENT.get(name, b"")
                if os.write(out, content) != len(content):
                    raise OSError(errno.EIO, "short write")
            finally:
                os.close(out)
        _own_like_parent(fd, last)
        return True
    except FileExistsError:
        return False
    except OSError as e:
        raise PolicyError(f"protect_missing: cannot make the placeholder {path}: "
                          f"{e.strerror or e}") from None
    finally:
        for held in dirs.values():
            if held is not None:
                os.close(held)


def _own_like_parent(fd: int, name: str) -> None:
    """A placeholder made by a root runtime in a user's tree belongs to the user, as the
    directory holding it does: else the user's own git could not add a hook to a
    root-owned ``.git/hooks`` later. Not following a link (the name was just made)."""
    if os.geteuid() != 0:
        return
    st = os.fstat(fd)
    if (st.st_uid, st.st_gid) != (0, 0):
        os.chown(name, st.st_uid, st.st_gid, dir_fd=fd, follow_symlinks=False)


def _look(root: str, path: str, dirs: dict[str, str] | None = None
          ) -> tuple[str, str | None, list[str] | None]:
    """(kind, symlink target, the existing real directories strictly between ``root`` and
    ``path``; None when one of them is not a real directory). Kind: file, dir, symlink,
    other, missing (the parent exists), missing-parent. Most names are missing: one
    faccessat each (no exception raised), an lstat only for what exists. ``dirs``: what
    this pass found of each directory on the way ("dir", "missing", "other"), shared by the
    names of one lookup (``.config/git/config``, ``.config/nvim``... look at ``.config`` once)."""
    parents: list[str] = []
    rel = path[len(root):].strip("/").split("/")
    at = root
    for part in rel[:-1]:
        at = at.rstrip("/") + "/" + part
        kind = dirs.get(at) if dirs is not None else None
        if kind is None:
            kind = _dir_kind(at)
            if dirs is not None:
                dirs[at] = kind
        if kind == "missing":
            return "missing-parent", None, parents
        if kind != "dir":
            return "missing-parent", None, None
        parents.append(at)
    if not os.access(path, os.F_OK, follow_symlinks=False):
        return "missing", None, parents
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "missing", None, parents
    if stat.S_ISLNK(st.st_mode):
        return "symlink", os.readlink(path), parents
    if stat.S_ISREG(st.st_mode):
        return "file", None, parents
    if stat.S_ISDIR(st.st_mode):
        return "dir", None, parents
    return "other", None, parents


def _dir_kind(path: str) -> str:
    """"dir" (a real directory), "missing", or "other" (a file, a symlink...)."""
    if not os.access(path, os.F_OK, follow_symlinks=False):
        return "missing"
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "missing"
    return "dir" if stat.S_ISDIR(st.st_mode) else "other"


# --- after the run -------------------------------------------------------------------------

def sweep(entries: tuple[SweepEntry, ...], since: int | None = None,
          aside: bool = False) -> dict[str, str]:
    """Once every process of the run is gone: remove what appeared at each missing path,
    restore each changed symlink, move aside what replaced a bound file or directory
    (:data:`SweepEntry`). Walks from / without following a symlink (a directory
    swapped for a link leads nowhere), each directory opened once. ``since``: the run's
    start (:func:`now`): a directory it locked is given back its owner's rwx (:func:`make_usable`).
    ``aside``: what appeared at a missing name is moved aside rather than removed (the
    sweep of a run whose runtime died, done later: :mod:`.pending`). Returns each path acted on and what was done
    (or why it could not be)."""
    done: dict[str, str] = {}
    dirs: dict[str, int | None] = {}
    usable: set[int] = set()
    try:
        for path, target, file_only in entries:
            parent, name = path.rsplit("/", 1)
            try:
                fd = open_dir_path(parent or "/", dirs, since)
                if fd is not None and since is not None and fd not in usable:
                    make_usable(fd, since)
                    usable.add(fd)
                result = "" if fd is None else _sweep_one(fd, name, target, file_only, aside)
            except OSError as e:
                result = f"failed: {e.strerror or e}"
            if result:
                done[path] = result
    finally:
        for fd in dirs.values():
            if fd is not None:
                os.close(fd)
    return done


def sweep_run(entries: tuple[SweepEntry, ...], after: After | None,
              since: int) -> dict[str, str]:
    """A run's whole sweep, once every process of it is gone: its missing protected names
    (:func:`sweep`) and what it made below the top level (:func:`sweep_made`); ``since``:
    its start (0: not known). Each path acted on and what was done."""
    done = sweep(entries, since or None) if entries else {}
    if after is not None:
        done.update(sweep_made(after, since))
    return done


#: The sweep's word for a bound name found holding another inode (the receipt's
#: ``protected_sweep``), followed by the name it was moved to.
MOVED_ASIDE = "replaced during the run (its read-only bind went with the old file): moved to"


def _sweep_one(fd: int, name: str, target: "str | tuple[int, int] | None",
               file_only: bool, aside: bool = False) -> str:
    """The sweep of ``name`` in the directory ``fd``: what was done, or "" for nothing."""
    if not os.access(name, os.F_OK, dir_fd=fd, follow_symlinks=False):
        st = None  # the usual case: nothing appeared (no exception raised for it)
    else:
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
    if target is None:
        if st is None or (file_only and stat.S_ISDIR(st.st_mode)):
            return ""
        if aside:
            return move_aside(fd, name, st, "unswept", UNSWEPT)
        remove(fd, name, st)
        return "removed"
    if isinstance(target, tuple):
        if st is None or (st.st_dev, st.st_ino) == target:
            return ""  # the bound file, or nothing (deleted on the host)
        # the user's tools could have put it there as well as the command: not removed,
        # but no longer at a name they run
        return move_aside(fd, name, st, "replaced", MOVED_ASIDE)
    if st is not None and stat.S_ISLNK(st.st_mode) and os.readlink(name, dir_fd=fd) == target:
        return ""
    if st is not None:
        if aside:
            move_aside(fd, name, st, "unswept", UNSWEPT)
        else:
            remove(fd, name, st)
    os.symlink(target, name, dir_fd=fd)
    return "restored"


#: The sweep's word for what a run whose runtime died left at a missing name, moved aside by
#: a later run (:mod:`.pending`), followed by the name it was moved to.
UNSWEPT = ("left by a run whose runtime died before its sweep (the user may have made it "
           "since): moved to")


def move_aside(fd: int, name: str, st: os.stat_result, why: str, said: str) -> str:
    """Move ``name`` (in ``fd``) to ``NAME.hcp-linux-WHY-RANDOM`` beside it: no longer at a
    name the host's tools run, and not lost if it was the user's. Removed when it cannot be
    moved (no room for the longer name): never left where it is."""
    aside = f"{name[:200]}.hcp-linux-{why}-{os.urandom(6).hex()}"
    try:
        os.rename(name, aside, src_dir_fd=fd, dst_dir_fd=fd)
    except OSError:
        remove(fd, name, st)
        return f"removed: {said.split(':')[0]}, and could not be moved aside"
    return f"{said} {aside}"

