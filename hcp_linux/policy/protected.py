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
"""
from __future__ import annotations

import errno
import os
import stat
import time
import _thread  # threading.Lock without importing threading (the served path)

from .protected_names import NAMES

#: A name protected only when it is not a directory (its protected children are listed).
_FILE_ONLY = frozenset({".git"})

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
_DIR_NAMES = frozenset({".git/hooks", ".vscode", ".idea", ".claude", ".cursor", ".ssh"})

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

#: Files this process's own configuration came from (the CLI's --policy and --pack): they
#: would widen the next run, so they are protected like the names, in every run of this
#: process, while they lie in a writable root (:func:`protect_file`).
_config_files: list[str] = []
_config_lock = _thread.allocate_lock()


def protect_file(path: str) -> None:
    """Protect ``path`` (a configuration file this process read) in every later run."""
    real = os.path.realpath(path)
    with _config_lock:
        if real not in _config_files:
            _config_files.append(real)


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


class After:
    """The after-run search (:func:`sweep_made`): ``roots``: (root, depth, skip) as the
    search before the run had them; ``known``: every path that search considered (what
    it protected, swept or let be); ``allowed``: the policy's ``allow_write_protected``.
    A frozen value written out, as :class:`Found` is (the served client decodes one)."""

    __slots__ = ("roots", "known", "allowed")
    roots: tuple[tuple[str, int, tuple[str, ...]], ...]
    known: tuple[str, ...]
    allowed: tuple[str, ...]

    def __init__(self, roots: tuple[tuple[str, int, tuple[str, ...]], ...],
                 known: tuple[str, ...], allowed: tuple[str, ...]) -> None:
        object.__setattr__(self, "roots", roots)
        object.__setattr__(self, "known", known)
        object.__setattr__(self, "allowed", allowed)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"cannot assign to field {name!r}")

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return (self.roots, self.known, self.allowed) == (
            other.roots, other.known, other.allowed)  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((self.roots, self.known, self.allowed))

    def __repr__(self) -> str:
        return f"After(roots={self.roots!r}, known=<{len(self.known)}>, allowed={self.allowed!r})"

    def __reduce__(self) -> tuple:
        return (After, (self.roots, self.known, self.allowed))


class Found:
    """What one run protects, found right before it (hashable: part of the confinement
    cache's key). ``read_only``: existing files and directories to bind read-only;
    ``pins``: existing directories between a protected path and its root, bound over
    themselves so that none can be renamed away; ``how``: each path and how it is kept;
    ``sweep``: (path, symlink target or None for missing, file_only) for the sweep;
    ``stopped``: (root, why) for each writable root whose nested search stopped early;
    ``after``: the search again once the run is over, for what it made below the top level
    (:func:`sweep_made`).

    A frozen value written out rather than a dataclass: the served client imports this
    module for the sweep, and dataclasses (with inspect) cost it ~5 ms at start-up."""

    __slots__ = ("read_only", "pins", "how", "sweep", "stopped", "after")
    read_only: tuple[str, ...]
    pins: tuple[str, ...]
    how: tuple[tuple[str, str], ...]
    sweep: tuple[tuple[str, str | None, bool], ...]
    stopped: tuple[tuple[str, str], ...]
    after: "After | None"

    def __init__(self, read_only: tuple[str, ...] = (), pins: tuple[str, ...] = (),
                 how: tuple[tuple[str, str], ...] = (),
                 sweep: tuple[tuple[str, str | None, bool], ...] = (),
                 stopped: tuple[tuple[str, str], ...] = (),
                 after: "After | None" = None) -> None:
        for name, value in zip(self.__slots__, (read_only, pins, how, sweep, stopped, after)):
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


def _within(path: str, tree: str) -> bool:
    return path == tree or path.startswith(tree.rstrip("/") + "/")


def find(policy, view: bool) -> Found:  # type: ignore[no-untyped-def]
    """The protected paths of ``policy``'s writable roots as they are now. A path inside a
    carve-out of the policy (read-only or hidden already) or opted out is skipped. With a
    mount view and ``protect_missing = "placeholders"``, a missing name gets its placeholder
    here (PolicyError, naming it, when it cannot be made: fail closed)."""
    # here, not at the top: the served client imports this module for the sweep alone
    from . import protected_search
    allowed = policy.allow_write_protected
    mode = policy.protect_missing
    place = view and mode == "placeholders"
    place_quiet = view and mode == "quiet"
    place_git = view and mode in ("quiet", "git", "placeholders")
    covered = policy.read_only_paths + policy.hidden_paths
    read_only: list[str] = []
    pins: list[str] = []
    how: list[tuple[str, str]] = []
    sweep: list[tuple[str, str | None, bool]] = []
    stopped: list[tuple[str, str]] = []
    roots = policy.writable_roots
    with _config_lock:
        configs = [(None, p, p, True) for p in _config_files]
    # (root, path, key of NAMES or the path, whether a missing one is swept): the top level's
    # names (missing ones swept), then what the nested search finds existing
    entries: list[tuple[str | None, str, str, bool]] = []
    # the roots ``quiet`` makes top-level placeholders in: a project (a repository, where git
    # hides an empty directory), not a bare jail a driver fills and lists
    projects = {r for r in roots if place_quiet and os.path.lexists(_join(r, ".git"))}
    skip = tuple(dict.fromkeys(roots + covered))
    for root in roots:
        entries.extend((root, _join(root, n), n, True) for n in NAMES)
        search = protected_search.Search(root, policy.protect_depth, set(skip))
        entries.extend((root, p, n, sweep_missing) for p, n, sweep_missing in search.run())
        if search.stopped:
            stopped.append((root, search.stopped))
    entries.extend(configs)
    derived = _redirected(entries)
    entries.extend((None, path, key, True) for path, key in derived.items())
    seen: set[str] = set()
    for root, path, name, sweep_missing in entries:
        if path in seen:
            continue
        seen.add(path)
        if root is None:  # a configuration file: inside a writable root, or nothing
            root = next((r for r in roots if _within(path, r) and path != r), None)
            if root is None:
                continue
        if any(_within(path, c) for c in covered):
            continue
        if name in allowed or path in allowed:
            how.append((path, ALLOWED))
            continue
        kind, target, parents = _look(root, path)
        if not sweep_missing and kind in ("missing", "missing-parent"):
            continue  # a nested name that is not there: the search found it, then it went
        placed = False
        top = path == _join(root, name)
        if kind == "missing" and name in NAMES and name not in _NO_PLACEHOLDER \
                and path not in derived and (
                (place and top) or (top and root in projects and name in _QUIET_NAMES)
                or (place_git and name.startswith(".git/"))):  # in an existing git dir
            placed = _make_placeholder(path, name)
            kind, target, parents = _look(root, path)  # made, or what appeared meanwhile
        if parents is None or (kind == "dir" and name in _FILE_ONLY):
            # under a file or symlink (a gitdir-pointer .git: itself protected), or the .git
            # directory (its hooks and config are listed): nothing of its own to protect
            continue
        if kind in ("missing", "missing-parent"):
            how.append((path, REMOVED if view else REMOVED_NO_VIEW))
            sweep.append((path, None, name in _FILE_ONLY))
            pins.extend(parents or ())
        elif kind == "symlink":
            how.append((path, RESTORED if view else RESTORED_NO_VIEW))
            sweep.append((path, target, False))
            pins.extend(parents or ())
            real = os.path.realpath(path)
            holder = next((r for r in roots if _within(real, r) and real != r), None)
            if view and holder is not None and not any(_within(real, c) for c in covered):
                _, _, real_parents = _look(holder, real)
                if os.path.isdir(real) or os.path.isfile(real):
                    read_only.append(real)
                    pins.extend(real_parents or ())
        elif kind in ("file", "dir"):
            if view:
                how.append((path, PLACED if placed else BOUND))
                read_only.append(path)
                pins.extend(parents or ())
            else:
                how.append((path, WRITABLE_NO_VIEW))
        # anything else (a fifo, a socket, a device) is left as it is: no code in it
    ro = tuple(dict.fromkeys(read_only))
    after = After(tuple((r, policy.protect_depth, skip) for r in roots), tuple(sorted(seen)),
                  tuple(allowed)) if roots else None
    return Found(read_only=ro, pins=tuple(p for p in dict.fromkeys(pins) if p not in ro),
                 how=tuple(how), sweep=tuple(sweep), stopped=tuple(stopped), after=after)


def _redirected(entries: list[tuple[str | None, str, str, bool]]) -> dict[str, str]:
    """What each repository's config (a root's, a nested one's, a submodule's) makes git
    read or run from elsewhere (hcp_linux.policy.git_config): the directory
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


def _join(root: str, name: str) -> str:
    return root + "/" + name if root != "/" else "/" + name


def _make_placeholder(path: str, name: str) -> bool:
    """Make ``name``'s placeholder at ``path``, its parent reached from / without following
    a symlink (:func:`_open_dir_path`, the sweep's walk): an empty directory or file, or a
    file holding :data:`_CONTENT`. False when nothing was made: something is there already,
    or a parent is gone or became a link meanwhile (the caller looks again)."""
    from ..errors import PolicyError  # here: the served client imports this module light
    parent, last = path.rsplit("/", 1)
    dirs: dict[str, int | None] = {}
    try:
        fd = _open_dir_path(parent or "/", dirs)
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


def _look(root: str, path: str) -> tuple[str, str | None, list[str] | None]:
    """(kind, symlink target, the existing real directories strictly between ``root`` and
    ``path``; None when one of them is not a real directory). Kind: file, dir, symlink,
    other, missing (the parent exists), missing-parent. Most names are missing: one
    faccessat each (no exception raised), an lstat only for what exists."""
    parents: list[str] = []
    rel = path[len(root):].strip("/").split("/")
    at = root
    for part in rel[:-1]:
        at = at.rstrip("/") + "/" + part
        if not os.access(at, os.F_OK, follow_symlinks=False):
            return "missing-parent", None, parents
        try:
            st = os.lstat(at)
        except FileNotFoundError:
            return "missing-parent", None, parents
        if not stat.S_ISDIR(st.st_mode):
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


# --- after the run -------------------------------------------------------------------------

def sweep(entries: tuple[tuple[str, str | None, bool], ...]) -> dict[str, str]:
    """Once every process of the run is gone: remove what appeared at each missing path,
    restore each changed symlink. Walks from / without following a symlink (a directory
    swapped for a link leads nowhere), each directory opened once. Returns each path acted
    on and what was done (or why it could not be)."""
    done: dict[str, str] = {}
    dirs: dict[str, int | None] = {}
    try:
        for path, target, file_only in entries:
            parent, name = path.rsplit("/", 1)
            try:
                fd = _open_dir_path(parent or "/", dirs)
                result = "" if fd is None else _sweep_one(fd, name, target, file_only)
            except OSError as e:
                result = f"failed: {e.strerror or e}"
            if result:
                done[path] = result
    finally:
        for fd in dirs.values():
            if fd is not None:
                os.close(fd)
    return done


def sweep_of_receipt(receipt: dict) -> tuple[tuple[str, str | None, bool], ...]:
    """The sweep a served run's client does, from the receipt the server made."""
    links = receipt.get("protected_links") or {}
    out = []
    for path, how in (receipt.get("protected") or {}).items():
        if how.startswith(REMOVED):
            out.append((path, None, os.path.basename(path) in _FILE_ONLY))
        elif how.startswith(RESTORED) and path in links:
            out.append((path, links[path], False))
    return tuple(out)


def now() -> int:
    """The time a run starts, for :func:`sweep_made`: CLOCK_REALTIME_COARSE, the clock the
    kernel stamps a file's ctime from (a fine clock can read ahead of the stamp of a
    change made after it), less :data:`CTIME_SLACK`."""
    return time.clock_gettime_ns(_COARSE) - CTIME_SLACK


#: CLOCK_REALTIME_COARSE (Linux's number; the time module does not name it).
_COARSE = getattr(time, "CLOCK_REALTIME_COARSE", 5)
#: Taken off the start: file systems that stamp whole seconds (or a server's clock, a
#: little apart) could stamp a change made during the run before the start read here.
CTIME_SLACK = 1_000_000_000


def sweep_made(after: After | None, since: int) -> dict[str, str]:
    """Once every process of the run is gone: search each writable root again as the
    search before the run did (:class:`After`), and remove each protected name below the
    top level that the run made or changed: one that search did not consider, that is
    not opted out, and whose ctime is ``since`` or later (a run can set an mtime back,
    never a ctime; what was there before and left alone is not touched). So a repository
    a run makes in ``sub/`` keeps no ``config`` or ``hooks`` for the host's git (the
    superproject's ``git status`` runs a registered submodule's ``core.fsmonitor``), nor a
    ``.envrc`` or ``.vscode`` for a tool entering ``sub/``. Left: a ``.git`` directory (its
    names are searched), and a worktree's or a submodule's link home (:func:`_points_home`),
    so that ``git worktree add`` in the jail still works. Returns each path acted on (and,
    for a root whose search stopped early, where: ``failed: stopped ...``)."""
    if after is None or not after.roots:
        return {}
    from .protected_search import Search  # here: only a run with writable roots pays for it
    known = set(after.known)
    allowed = set(after.allowed)
    homes = tuple(g for g in (_join(r, ".git") for r, _, _ in after.roots) if _real_dir(g))
    done: dict[str, str] = {}
    dirs: dict[str, int | None] = {}
    try:
        for root, depth, skip in after.roots:
            search = Search(root, depth, set(skip))
            for path, key, _ in search.run():
                if path in known or key in allowed or path in allowed \
                        or any(_within(path, c) for c in skip if c != root):
                    continue
                parent, name = path.rsplit("/", 1)
                try:
                    fd = _open_dir_path(parent or "/", dirs)
                    result = "" if fd is None else _sweep_made_one(fd, name, key, path,
                                                                   since, homes)
                except OSError as e:
                    result = f"failed: {e.strerror or e}"
                if result:
                    done[path] = result
            if search.stopped:
                done[root] = f"failed: below the top level, {search.stopped}"
        _sweep_submodules(after, known, allowed, since, homes, dirs, done)
    finally:
        for fd in dirs.values():
            if fd is not None:
                os.close(fd)
    return done


#: The after-run check of submodules: how deep it follows submodules of submodules, and how
#: many it looks at in all (a forged index could name millions).
SUBMODULE_DEPTH = 8
SUBMODULE_BUDGET = 1024


def _sweep_submodules(after: After, known: set[str], allowed: set[str], since: int,
                      homes: tuple[str, ...], dirs: dict[str, int | None],
                      done: dict[str, str]) -> None:
    """The host's ``git status`` runs ``git status`` in each populated submodule its index
    names, at any depth, with that submodule's config: so each repository's index (the
    roots', their linked worktrees', the nested ones the search found) is read
    (hcp_linux.policy.git_index), and each submodule's ``.git`` is kept as the search's
    finds are: what the run made or changed there goes, however deep it lies. Submodules
    of submodules are followed down to :data:`SUBMODULE_DEPTH`."""
    roots = tuple(r for r, _, _ in after.roots)
    covered = tuple(c for _, _, skip in after.roots for c in skip if c not in roots)
    work: list[tuple[str, str, int]] = [(r, _join(r, ".git"), 0) for r in roots
                                        if _real_dir(_join(r, ".git"))]
    for home in homes:  # linked worktrees: their own index, their worktree where gitdir says
        for wt_gitdir in _listdir(home + "/worktrees"):
            where = _read_small(f"{home}/worktrees/{wt_gitdir}/gitdir")
            if where is not None and where.endswith("/.git"):
                work.append((where[:-len("/.git")], f"{home}/worktrees/{wt_gitdir}", 0))
    for path in sorted(known | set(done)):  # nested repositories (a removed config's too)
        if path.endswith("/.git/config") and path[:-len("/.git/config")] not in roots:
            work.append((path[:-len("/.git/config")], path[:-len("/config")], 0))
    seen: set[str] = set()
    looked = 0
    while work:
        worktree, gitdir, level = work.pop()
        if gitdir in seen or not _in_roots(gitdir, roots, covered):
            continue
        seen.add(gitdir)
        for link in _index_gitlinks(gitdir, done):
            if looked == SUBMODULE_BUDGET:
                done[gitdir + "/index"] = (f"failed: more than {SUBMODULE_BUDGET} submodules "
                                           "in all: the rest were not checked")
                return
            looked += 1
            target = os.path.realpath(os.path.join(worktree, link))
            if not _in_roots(target, roots, covered) or target in roots:
                continue
            nested = _submodule_git(target, since, homes, known, allowed, (roots, covered),
                                    dirs, done)
            if nested is not None and level + 1 < SUBMODULE_DEPTH:
                work.append((target, nested, level + 1))


def _submodule_git(target: str, since: int, homes: tuple[str, ...], known: set[str],
                   allowed: set[str], scope: tuple[tuple[str, ...], tuple[str, ...]],
                   dirs: dict[str, int | None], done: dict[str, str]) -> str | None:
    """Keep the submodule at ``target`` as the search keeps a nested repository: its
    ``.git`` (a pointer or link the run made that does not lead home goes) and, in its git
    directory, what the run made or changed of :data:`GIT_DIR_NAMES`. Returns that git
    directory (for its own submodules), or None. ``scope``: (the writable roots, the
    carve-outs), which a git directory must lie in to be looked at."""
    from .protected_names import GIT_DIR_NAMES
    dot_git = target + "/.git"
    fd = _open_dir_path(target, dirs)
    if fd is None or dot_git in known or ".git" in allowed or dot_git in allowed:
        return None
    try:
        st = os.stat(".git", dir_fd=fd, follow_symlinks=False)
    except OSError:
        return None  # not populated: git does not enter it
    if not stat.S_ISDIR(st.st_mode):
        try:
            result = _sweep_made_one(fd, ".git", ".git", dot_git, since, homes)
        except OSError as e:
            result = f"failed: {e.strerror or e}"
        if result:
            done[dot_git] = result
            return None
        if not stat.S_ISREG(st.st_mode):
            return None
        pointed = _read_small(dot_git)
        if pointed is None or not pointed.startswith("gitdir: "):
            return None
        gitdir = os.path.realpath(os.path.join(target, pointed[len("gitdir: "):].strip()))
    else:
        gitdir = dot_git
    if not _in_roots(gitdir, *scope):
        return None  # a git directory the run could not write: its names are as they were
    inner = _open_dir_path(gitdir, dirs)
    if inner is None:
        return None
    for name, key in GIT_DIR_NAMES.items():
        path = gitdir + "/" + name
        if path in known or key in allowed or path in allowed:
            continue
        try:
            result = _sweep_made_one(inner, name, key, path, since, homes)
        except OSError as e:
            result = f"failed: {e.strerror or e}"
        if result:
            done[path] = result
    return gitdir


def _index_gitlinks(gitdir: str, done: dict[str, str]) -> list[str]:
    """The submodule paths ``gitdir``'s index names (none when it has no index); an index
    this reader cannot read is said in ``done`` (its submodules go unchecked)."""
    from .git_index import MAX_INDEX, gitlinks, hash_size
    data = _read_bytes(gitdir + "/index", MAX_INDEX)
    if data is None:
        return []
    if data is _TOO_BIG:
        done[gitdir + "/index"] = f"failed: larger than {MAX_INDEX} bytes: its submodules " \
                                  "were not checked"
        return []
    config = _read_bytes(gitdir + "/config", 1 << 20)
    links = gitlinks(data, hash_size(config if isinstance(config, bytes) else b""))
    if links is None:
        done[gitdir + "/index"] = "failed: not an index this reader understands: its " \
                                  "submodules were not checked"
        return []
    out = []
    for link in links:
        parts = link.split(b"/")
        if link.startswith(b"/") or b"" in parts or b"." in parts or b".." in parts:
            continue  # git refuses such a path too
        out.append(os.fsdecode(link))
    return out


_TOO_BIG = b"\x00too big"


def _read_bytes(path: str, limit: int) -> bytes | None:
    """The file at ``path`` (not through a symlink at its last component), None when there
    is none, :data:`_TOO_BIG` when it holds more than ``limit`` bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        if st.st_size > limit:
            return _TOO_BIG
        chunks: list[bytes] = []
        total = 0
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return b"".join(chunks)
            total += len(chunk)
            if total > limit:
                return _TOO_BIG
            chunks.append(chunk)
    finally:
        os.close(fd)


def _read_small(path: str) -> str | None:
    data = _read_bytes(path, 4096)
    if not data or data is _TOO_BIG:
        return None
    return data.decode("utf-8", "surrogateescape").strip()


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def _in_roots(path: str, roots: tuple[str, ...], covered: tuple[str, ...]) -> bool:
    return any(_within(path, r) for r in roots) and not any(_within(path, c) for c in covered)


def _sweep_made_one(fd: int, name: str, key: str, path: str, since: int,
                    homes: tuple[str, ...]) -> str:
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return ""
    if st.st_ctime_ns < since:
        return ""  # there before the run, and left alone by it
    if key in _FILE_ONLY and stat.S_ISDIR(st.st_mode):
        return ""  # a repository's .git directory: its hooks and config are searched
    if key in (".git", ".git/commondir") and stat.S_ISREG(st.st_mode) \
            and _points_home(fd, name, key, path, homes):
        return ""
    _remove(fd, name, st)
    return "removed"


def _points_home(fd: int, name: str, key: str, path: str, homes: tuple[str, ...]) -> bool:
    """Whether a ``.git`` file (``gitdir: X``) names a git directory inside a root's own
    ``.git/worktrees`` or ``.git/modules``, or a ``commondir`` names a root's ``.git``:
    what ``git worktree add`` and ``git submodule add`` write. Their hooks and config are
    the protected ones (bound, or swept when the run made them). Through no symlink (a
    later run could re-point one): the path as written must be the real path."""
    try:
        held = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
    except OSError:
        return False
    try:
        text = os.read(held, 4097)
    finally:
        os.close(held)
    if len(text) > 4096:
        return False
    line = text.decode("utf-8", "surrogateescape").strip()
    if key == ".git":
        if not line.startswith("gitdir: "):
            return False
        line = line[len("gitdir: "):].strip()
    if not line or "\n" in line:
        return False
    target = os.path.normpath(os.path.join(os.path.dirname(path), line))
    if os.path.realpath(target) != target:
        return False
    if key == ".git/commondir":
        return target in homes
    return any(target.startswith(h + "/worktrees/") or target.startswith(h + "/modules/")
               for h in homes)


def _real_dir(path: str) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _sweep_one(fd: int, name: str, target: str | None, file_only: bool) -> str:
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
        _remove(fd, name, st)
        return "removed"
    if st is not None and stat.S_ISLNK(st.st_mode) and os.readlink(name, dir_fd=fd) == target:
        return ""
    if st is not None:
        _remove(fd, name, st)
    os.symlink(target, name, dir_fd=fd)
    return "restored"


def _open_dir_path(path: str, dirs: dict[str, int | None]) -> int | None:
    """An O_PATH fd of the directory ``path``, reached from / one component at a time, none
    of them a symlink (O_NOFOLLOW), kept in ``dirs``; None when a component is missing or
    is not a directory (nothing can be at a path below it)."""
    if path in dirs:
        return dirs[path]
    if path == "/":
        fd: int | None = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    else:
        parent, name = path.rsplit("/", 1)
        up = _open_dir_path(parent or "/", dirs)
        fd = None
        if up is not None:
            try:
                fd = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                             dir_fd=up)
            except (FileNotFoundError, NotADirectoryError):
                fd = None
            except OSError as e:
                if e.errno != errno.ELOOP:  # a symlink where a directory was: nothing there
                    raise
    dirs[path] = fd
    return fd


def _remove(dir_fd: int, name: str, st: os.stat_result) -> None:
    """Remove ``name`` under ``dir_fd``: a file or link unlinked, a directory emptied
    through fds (each opened O_NOFOLLOW and checked to be the inode listed), made
    searchable and writable first (the run may have left it mode 000), then removed.
    Iterative: a deep tree costs one fd per level, not the interpreter's stack."""
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=dir_fd)
        return
    stack: list[tuple[int, str, int, list[str]]] = []  # (parent fd, name, fd, entries left)
    stack.append((dir_fd, name, _open_dir(dir_fd, name, st), []))
    stack[-1][3].extend(os.listdir(stack[-1][2]))
    try:
        while stack:
            parent, dname, fd, left = stack[-1]
            if not left:
                stack.pop()
                os.close(fd)
                os.rmdir(dname, dir_fd=parent)
                continue
            entry = left.pop()
            est = os.stat(entry, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISDIR(est.st_mode):
                child = _open_dir(fd, entry, est)
                stack.append((fd, entry, child, os.listdir(child)))
            else:
                os.unlink(entry, dir_fd=fd)
    finally:
        for _, _, fd, _ in stack:
            os.close(fd)


def _open_dir(dir_fd: int, name: str, st: os.stat_result) -> int:
    if stat.S_IMODE(st.st_mode) & 0o700 != 0o700:
        os.chmod(name, 0o700, dir_fd=dir_fd)  # a directory (lstat): chmod follows nothing
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                 dir_fd=dir_fd)
    now = os.fstat(fd)
    if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
        os.close(fd)
        raise OSError(f"{name}: changed while it was removed")
    return fd
