"""The after-run search (hcp_linux.policy.protected): what a run made at a protected name
below a writable root's top level, or in a submodule's git directory at any depth, is
removed once the run is over. The search before the run (.search) protects what exists;
this finds what the run made, by searching again and comparing, and by reading each
repository's index for submodules (.git_index). Light at import (the served client runs
it after its run): the search and the index reader are imported when it runs."""
from __future__ import annotations

import os
import stat
import time

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing (the served client)
if TYPE_CHECKING:
    from .search import Search

from .names import FILE_ONLY, GIT_DIR_NAMES
from .walk import join, make_usable, open_dir_path, real_dir, remove, within


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


def sweep_made(after: After | None, since: int, aside: bool = False) -> dict[str, str]:
    """Once every process of the run is gone: search each writable root again as the
    search before the run did (:class:`After`), and remove each protected name below the
    top level that the run made or changed: one that search did not consider, that is
    not opted out, and whose ctime is ``since`` or later (a run can set an mtime back,
    never a ctime; what was there before and left alone is not touched). So a repository
    a run makes in ``sub/`` keeps no ``config`` or ``hooks`` for the host's git (the
    superproject's ``git status`` runs a registered submodule's ``core.fsmonitor``), nor a
    ``.envrc`` or ``.vscode`` for a tool entering ``sub/``. Left: a ``.git`` directory (its
    names are searched), and a worktree's or a submodule's link home (:func:`_points_home`),
    so that ``git worktree add`` in the jail still works. ``aside``: moved aside instead
    (the sweep of a run whose runtime died, done later: :mod:`.pending`). Returns each path
    acted on (and, for a root whose search stopped early, where: ``failed: stopped ...``)."""
    if after is None or not after.roots:
        return {}
    from .search import Search  # here: only a run with writable roots pays for it
    known = set(after.known)
    allowed = set(after.allowed)
    homes = tuple(g for g in (join(r, ".git") for r, _, _ in after.roots) if real_dir(g))
    done: dict[str, str] = {}
    dirs: dict[str, int | None] = {}
    try:
        for root, depth, skip in after.roots:
            # what the run left can make the search itself fail (a tree it cannot enter):
            # that root's search is said to have failed, and the others still run
            try:
                search = Search(root, depth, set(skip), since)
                _sweep_root(search, root, skip, known, allowed, since, homes, dirs, done,
                            aside)
            except (OSError, RecursionError) as e:
                done[root] = f"failed: below the top level, {_why(e)}"
        try:
            _sweep_submodules(after, known, allowed, since, homes, dirs, done, aside)
        except (OSError, RecursionError) as e:
            done[after.roots[0][0]] = f"failed: submodules, {_why(e)}"
    finally:
        for fd in dirs.values():
            if fd is not None:
                os.close(fd)
    return done


def _sweep_root(search: "Search", root: str, skip: tuple[str, ...], known: set[str],
                allowed: set[str], since: int, homes: tuple[str, ...],
                dirs: dict[str, int | None], done: dict[str, str], aside: bool) -> None:
    """:func:`sweep_made` in one writable root."""
    for path, key, _ in search.run():
        if path in known or key in allowed or path in allowed \
                or any(within(path, c) for c in skip if c != root):
            continue
        parent, name = path.rsplit("/", 1)
        try:
            fd = open_dir_path(parent or "/", dirs, since)
            result = "" if fd is None else _sweep_made_one(fd, name, key, path, since, homes,
                                                           aside)
        except OSError as e:
            result = f"failed: {e.strerror or e}"
        if result:
            done[path] = result
    if search.stopped:
        done[root] = f"failed: below the top level, {search.stopped}"


def _why(e: BaseException) -> str:
    if isinstance(e, RecursionError):
        return "a tree nested too deep to search"
    return (e.strerror if isinstance(e, OSError) and e.strerror else str(e)) or type(e).__name__


#: The after-run check of submodules: how deep it follows submodules of submodules, and how
#: many it looks at in all (a forged index could name millions).
SUBMODULE_DEPTH = 8
SUBMODULE_BUDGET = 1024


def _sweep_submodules(after: After, known: set[str], allowed: set[str], since: int,
                      homes: tuple[str, ...], dirs: dict[str, int | None],
                      done: dict[str, str], aside: bool) -> None:
    """The host's ``git status`` runs ``git status`` in each populated submodule its index
    names, at any depth, with that submodule's config: so each repository's index (the
    roots', their linked worktrees', the nested ones the search found) is read
    (.git_index), and each submodule's ``.git`` is kept as the search's
    finds are: what the run made or changed there goes, however deep it lies. Submodules
    of submodules are followed down to :data:`SUBMODULE_DEPTH`."""
    roots = tuple(r for r, _, _ in after.roots)
    covered = tuple(c for _, _, skip in after.roots for c in skip if c not in roots)
    work: list[tuple[str, str, int]] = [(r, join(r, ".git"), 0) for r in roots
                                        if real_dir(join(r, ".git"))]
    for home in homes:  # linked worktrees: their own index, their worktree where gitdir says
        for wt_gitdir in _listdir(home + "/worktrees", dirs):
            where = _read_small(f"{home}/worktrees/{wt_gitdir}/gitdir", dirs)
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
        for link in _index_gitlinks(gitdir, done, dirs):
            if looked == SUBMODULE_BUDGET:
                done[gitdir + "/index"] = (f"failed: more than {SUBMODULE_BUDGET} submodules "
                                           "in all: the rest were not checked")
                return
            looked += 1
            # the index is the run's to write: a path git could never check out (a name
            # too long, a directory the runtime cannot enter) fails this one submodule only
            where = os.path.join(worktree, link)
            try:
                target = os.path.realpath(where)
                if not _in_roots(target, roots, covered) or target in roots:
                    continue
                nested = _submodule_git(target, since, homes, known, allowed,
                                        (roots, covered), dirs, done, aside)
            except OSError as e:
                done[where] = f"failed: {e.strerror or e}"
                continue
            if nested is not None and level + 1 < SUBMODULE_DEPTH:
                work.append((target, nested, level + 1))


def _submodule_git(target: str, since: int, homes: tuple[str, ...], known: set[str],
                   allowed: set[str], scope: tuple[tuple[str, ...], tuple[str, ...]],
                   dirs: dict[str, int | None], done: dict[str, str],
                   aside: bool) -> str | None:
    """Keep the submodule at ``target`` as the search keeps a nested repository: its
    ``.git`` (a pointer or link the run made that does not lead home goes) and, in its git
    directory, what the run made or changed of :data:`GIT_DIR_NAMES`. Returns that git
    directory (for its own submodules), or None. ``scope``: (the writable roots, the
    carve-outs), which a git directory must lie in to be looked at."""
    dot_git = target + "/.git"
    fd = open_dir_path(target, dirs, since)
    if fd is None or dot_git in known or ".git" in allowed or dot_git in allowed:
        return None
    try:
        st = os.stat(".git", dir_fd=fd, follow_symlinks=False)
    except OSError:
        return None  # not populated: git does not enter it
    if not stat.S_ISDIR(st.st_mode):
        try:
            result = _sweep_made_one(fd, ".git", ".git", dot_git, since, homes, aside)
        except OSError as e:
            result = f"failed: {e.strerror or e}"
        if result:
            done[dot_git] = result
            return None
        if not stat.S_ISREG(st.st_mode):
            return None
        pointed = _read_small(dot_git, dirs)
        if pointed is None or not pointed.startswith("gitdir: "):
            return None
        gitdir = os.path.realpath(os.path.join(target, pointed[len("gitdir: "):].strip()))
    else:
        gitdir = dot_git
    if not _in_roots(gitdir, *scope):
        return None  # a git directory the run could not write: its names are as they were
    inner = open_dir_path(gitdir, dirs, since)
    if inner is None:
        return None
    for name, key in GIT_DIR_NAMES.items():
        path = gitdir + "/" + name
        if path in known or key in allowed or path in allowed:
            continue
        try:
            result = _sweep_made_one(inner, name, key, path, since, homes, aside)
        except OSError as e:
            result = f"failed: {e.strerror or e}"
        if result:
            done[path] = result
    return gitdir


def _index_gitlinks(gitdir: str, done: dict[str, str],
                    dirs: dict[str, int | None]) -> list[str]:
    """The submodule paths ``gitdir``'s index names (none when it has no index); an index
    this reader cannot read is said in ``done`` (its submodules go unchecked)."""
    from .git_index import MAX_INDEX, gitlinks, hash_size
    data = _read_bytes(gitdir + "/index", MAX_INDEX, dirs)
    if data is None:
        return []
    if data is _TOO_BIG:
        done[gitdir + "/index"] = f"failed: larger than {MAX_INDEX} bytes: its submodules " \
                                  "were not checked"
        return []
    config = _read_bytes(gitdir + "/config", 1 << 20, dirs)
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


def _read_bytes(path: str, limit: int, dirs: dict[str, int | None]) -> bytes | None:
    """The file at ``path``, reached from / through no symlink (a run could plant one
    anywhere on the way: ``.git/worktrees`` as a link out of the root), None when there is
    none, :data:`_TOO_BIG` when it holds more than ``limit`` bytes. ``dirs``: the walk's
    directory fds (:func:`open_dir_path`)."""
    parent, name = path.rsplit("/", 1)
    try:
        at = open_dir_path(parent or "/", dirs)
        if at is None:
            return None
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                     dir_fd=at)
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
    except OSError:
        return None
    finally:
        os.close(fd)


def _read_small(path: str, dirs: dict[str, int | None]) -> str | None:
    data = _read_bytes(path, 4096, dirs)
    if not data or data is _TOO_BIG:
        return None
    return data.decode("utf-8", "surrogateescape").strip()


def _listdir(path: str, dirs: dict[str, int | None]) -> list[str]:
    """The names in the directory ``path``, reached through no symlink; none when it
    cannot be listed."""
    try:
        at = open_dir_path(path, dirs)
        if at is None:
            return []
        fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=at)
    except OSError:
        return []
    try:
        return sorted(os.listdir(fd))
    except OSError:
        return []
    finally:
        os.close(fd)


def _in_roots(path: str, roots: tuple[str, ...], covered: tuple[str, ...]) -> bool:
    return any(within(path, r) for r in roots) and not any(within(path, c) for c in covered)


def _sweep_made_one(fd: int, name: str, key: str, path: str, since: int,
                    homes: tuple[str, ...], aside: bool = False) -> str:
    # a directory the run left readable but not searchable (0400, 0600) lists its names,
    # and stats none of them: its owner's rwx back first
    make_usable(fd, since)
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return ""
    if st.st_ctime_ns < since:
        return ""  # there before the run, and left alone by it
    if key in FILE_ONLY and stat.S_ISDIR(st.st_mode):
        return ""  # a repository's .git directory: its hooks and config are searched
    if key in (".git", ".git/commondir") and stat.S_ISREG(st.st_mode) \
            and _points_home(fd, name, key, path, homes, st):
        return ""
    if aside:  # a run whose runtime died: done later, when the user may have made it
        from . import UNSWEPT, move_aside
        return move_aside(fd, name, st, "unswept", UNSWEPT)
    remove(fd, name, st)
    return "removed"


def _points_home(fd: int, name: str, key: str, path: str, homes: tuple[str, ...],
                 st: os.stat_result) -> bool:
    """Whether a ``.git`` file (``gitdir: X``) names a git directory inside a root's own
    ``.git/worktrees`` or ``.git/modules``, or a ``commondir`` names a root's ``.git``:
    what ``git worktree add`` and ``git submodule add`` write. Their hooks and config are
    the protected ones (bound, or swept when the run made them). Through no symlink (a
    later run could re-point one): the path as written must be the real path. ``st``: the
    file as it was looked at; another process with the root (a concurrent run) could have
    put a FIFO in its place since, whose open would wait for a writer for ever: opened
    without waiting, and read only when it is still that file."""
    try:
        held = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                       dir_fd=fd)
    except OSError:
        return False
    try:
        now = os.fstat(held)
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino) or not stat.S_ISREG(now.st_mode):
            return False
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
