"""The search for protected names below a writable root's top level (hcp_linux.policy.protected).

A run's protected names are found right before it (:func:`hcp_linux.policy.protected.find`):
those at the top level of each writable root are looked up by name; this module finds the
rest, by listing directories: every git directory (a submodule's, a worktree's, a nested
repository's) and the names that exist down to ``protect_depth`` levels. Listings are kept
between runs of a process while their directory's ctime holds, so a runtime, a session or
``hcp-linux serve`` reads each directory once. Imported by ``find`` only: the served client,
which imports hcp_linux.policy.protected for the after-run sweep, loads it only once the
run is over (:func:`hcp_linux.policy.protected.sweep_made`), and then only the stdlib's
lightest modules.
"""
from __future__ import annotations

import errno
import os
import time
import _thread  # threading.Lock without importing threading (the served client's sweep)

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing (the served client)
if TYPE_CHECKING:
    from typing import Iterator

from .names import GIT_DIR_NAMES, NAMES, TOP_ONLY
from .walk import make_usable

#: Directories the nested search does not enter: dependency trees, virtual environments and
#: caches, where no tool of the user's looks for settings to run, and which hold most of a
#: project's directories (entering them would cost every run milliseconds).
_PRUNE = frozenset({"node_modules", ".venv", "venv", "__pycache__", ".tox", ".nox",
                    ".mypy_cache", ".pytest_cache", ".ruff_cache", ".hcp-tmp", ".git"})

#: The nested search lists at most this many directories, and reads at most ENTRY_BUDGET
#: entries, per writable root (with the git directories' submodules and worktrees); where
#: it stopped, the receipt says (``protected_search``), and what lies beyond is protected
#: at the top level only. They bound a cold search's cost (~1.4 us an entry here).
SEARCH_BUDGET = 2048
ENTRY_BUDGET = 20_000

#: How many directories deep below a git directory's ``modules`` the search follows (a
#: submodule named ``a/b`` has its git directory at ``modules/a/b``, a submodule's own at
#: ``modules/a/modules/c``); deeper is said in ``stopped``, as a budget spent is, and not
#: entered. Real submodules lie a few levels down; it bounds the fds a search holds (one a
#: level), which a run could otherwise spend with a chain of empty directories.
MODULES_DEPTH = 128

#: The errors of an open that mean this process (or the system) is out of something, not
#: that the directory is gone or is not one: said in ``stopped`` rather than skipped.
_OUT_OF = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM})

#: Listings kept between runs of this process: (st_dev, st_ino) -> (st_ctime_ns, when it
#: was read, its entries). A directory's ctime changes with every entry made, removed or
#: renamed in it (and with utimes: a run can set its mtime back, never its ctime), so an
#: unchanged ctime means unchanged entries, provided the listing was read after the ctime
#: plus the clock's coarseness (a change in the same tick would not move it): RACY_NS, as
#: git's index treats racily clean files.
_listings: dict[tuple[int, int], tuple[int, int, "Listing"]] = {}
_listings_lock = _thread.allocate_lock()
_LISTINGS_MAX = 65_536
RACY_NS = 1_000_000_000

#: The entry names a search looks at (the rest of a directory matters only as
#: subdirectories to enter): the first component of each name, a git directory's names.
_WATCHED = frozenset({n.split("/", 1)[0] for n in NAMES if n not in TOP_ONLY}
                     | set(GIT_DIR_NAMES)
                     | {"HEAD", "modules", "worktrees"})
#: The names of NAMES looked for below the top level: those a directory itself holds
#: (a ``.git`` directory's own are looked for in it, :meth:`Search._git`).
_NESTED = tuple((n, n.split("/", 1)[0]) for n in NAMES
                if not n.startswith(".git/") and n not in TOP_ONLY)


class Listing:
    """What a search needs of one directory: which watched names it holds, its
    subdirectories (not links) sorted, and how many entries it read. A plain class, not a
    dataclass: the served client's after-run search imports this module, and dataclasses
    (with inspect) cost ~7 ms to import."""

    __slots__ = ("present", "dirs", "dir_set", "size")

    def __init__(self, present: frozenset[str], dirs: tuple[str, ...],
                 dir_set: frozenset[str], size: int) -> None:
        self.present = present
        self.dirs = dirs
        self.dir_set = dir_set
        self.size = size


def _listing(fd: int) -> Listing:
    """The :class:`Listing` of the directory ``fd``: from :data:`_listings` when its ctime
    says it has not changed since it was read there."""
    st = os.fstat(fd)
    key = (st.st_dev, st.st_ino)
    with _listings_lock:
        kept = _listings.get(key)
    if kept is not None and kept[0] == st.st_ctime_ns and kept[1] - kept[0] > RACY_NS:
        return kept[2]
    read_at = time.time_ns()  # before reading: a change after this moves the ctime past it
    present, dirs, size = [], [], 0
    with os.scandir(fd) as it:
        for e in it:
            size += 1
            if e.name in _WATCHED:
                present.append(e.name)
            if e.is_dir(follow_symlinks=False):
                dirs.append(e.name)
    dirs.sort()
    listing = Listing(frozenset(present), tuple(dirs), frozenset(dirs), size)
    with _listings_lock:
        if len(_listings) >= _LISTINGS_MAX:
            _listings.clear()
        _listings[key] = (st.st_ctime_ns, read_at, listing)
    return listing


class Search:
    """The protected names below a writable root's top level, and in its git directories.

    :meth:`run` yields (path, key of :data:`NAMES`, swept when missing):

    - every git directory's :data:`GIT_DIR_NAMES` (the root's ``.git``, a nested
      repository's, and under each the submodules' ``modules/**`` and the linked worktrees'
      ``worktrees/*``): all of them, a missing one swept (or given its placeholder) like a
      top-level name;
    - in each directory down to ``depth`` levels below the root (not entering a symlink,
      :data:`_PRUNE`, a carve-out or another writable root), the names of :data:`NAMES`
      that exist there: bound read-only, a symlink restored; a missing nested name is not
      swept (each directory of a tree would cost a lookup per name every run).

    Directories are opened one component at a time from the root's fd with ``O_NOFOLLOW``,
    so a symlink swapped in while it looks leads nowhere. The walks are iterative, depth
    first in name order (a stack of frames, each holding its directory's fd, as
    :func:`hcp_linux.policy.protected.walk.remove` does): a deep tree costs one fd a level,
    not the interpreter's stack. At most :data:`SEARCH_BUDGET` directories and
    :data:`ENTRY_BUDGET` entries are read, and a git directory's ``modules`` is followed
    :data:`MODULES_DEPTH` directories deep; ``stopped`` then says where it stopped.
    Listings are kept between runs while their directory's ctime holds (:data:`_listings`)."""

    def __init__(self, root: str, depth: int, skip: set[str], since: int | None = None) -> None:
        self.root = root
        self.since = since  # after the run: its start (after.now), else None
        self.depth = depth
        self.skip = skip
        self.listed = 0
        self.entries = 0
        self.stopped = ""

    def run(self) -> list[tuple[str, str, bool]]:
        out: list[tuple[str, str, bool]] = []
        try:
            top = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except PermissionError:  # the run locked the root itself (after it: reopened)
            reopened = self._reopen_root()
            if reopened is None:
                return out
            top = reopened
        except OSError:
            return out  # the policy checked it exists; gone now: the bind will say so
        try:
            listing = self._list(top, self.root)
            if listing is not None and ".git" in listing.dir_set:
                self._git(top, self.root, ".git", out)
            if listing is not None and self.depth > 0:
                self._walk(top, self.root, listing, out)
        finally:
            os.close(top)
        return out

    def _list(self, fd: int, path: str) -> Listing | None:
        """The listing of the directory ``fd``; None once a budget is spent or when it
        cannot be read (said in ``stopped``)."""
        if self.listed >= SEARCH_BUDGET or self.entries >= ENTRY_BUDGET:
            what = (f"{SEARCH_BUDGET} directories" if self.listed >= SEARCH_BUDGET
                    else f"{ENTRY_BUDGET} entries")
            self.stopped = self.stopped or (
                f"stopped after {what}, at {path}: protected names below it and in later "
                "directories are not protected")
            return None
        self.listed += 1
        try:
            listing = _listing(fd)
        except OSError as e:
            self.stopped = self.stopped or f"cannot list {path}: {e.strerror or e}"
            return None
        self.entries += listing.size
        return listing

    def _open(self, fd: int, name: str, path: str) -> tuple[int, Listing] | None:
        """The directory ``name`` in ``fd`` (at ``path``), opened, and its listing; None:
        gone, swapped for a link or a file meanwhile (opened with ``O_NOFOLLOW``),
        unreadable, or over budget. The caller closes the fd. Out of fds (a process near
        its RLIMIT_NOFILE) is said in ``stopped``: what lies below is not searched."""
        try:
            child = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                            dir_fd=fd)
        except PermissionError:
            reopened = self._reopen_made(fd, name, path)
            if reopened is None:
                return None
            child = reopened
        except OSError as e:
            if e.errno in _OUT_OF:
                self.stopped = self.stopped or f"cannot open {path}: {e.strerror or e}"
            return None
        try:
            listing = self._list(child, path)
        except BaseException:
            os.close(child)
            raise
        if listing is None:
            os.close(child)
            return None
        return child, listing

    def _reopen_root(self) -> int | None:
        parent, name = self.root.rsplit("/", 1)
        try:
            up = os.open(parent or "/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            return self._reopen_made(up, name, self.root)
        finally:
            os.close(up)

    def _reopen_made(self, fd: int, name: str, path: str) -> int | None:
        """After the run (``since`` given): a directory it made or changed that this process
        cannot list (a run that is not root's leaves ``sub`` mode 000 or 0100, and the user's
        ``cd sub`` still reads the ``.envrc`` or ``.git/config`` it planted there, by name)
        is made listable again, u+rwx, through an fd (never a symlink put in its place), and
        opened; None for a directory the run left alone (what it holds predates the run) or
        one that still cannot be opened (said in ``stopped``)."""
        if self.since is None:
            return None
        try:
            held = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                           dir_fd=fd)
        except OSError:
            return None
        try:
            if os.fstat(held).st_ctime_ns < self.since:
                return None
            make_usable(held, self.since)
            return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                           dir_fd=fd)
        except OSError as e:
            self.stopped = self.stopped or f"cannot list {path}: {e.strerror or e}"
            return None
        finally:
            os.close(held)

    def _enter(self, fd: int, name: str, path: str) -> "_Entered":
        return _Entered(self, fd, name, path)

    def _walk(self, top: int, root: str, listing: Listing,
              out: list[tuple[str, str, bool]]) -> None:
        """Each directory down to ``depth`` levels below the root (``top``, its fd, listed as
        ``listing``): the names of :data:`_NESTED` it holds, its ``.git`` (:meth:`_git`).
        A frame per level: (its fd, its path, its subdirectories left, its level); the
        root's fd is the caller's."""
        stack: list[tuple[int, str, Iterator[str], int]] = [(top, root, iter(listing.dirs), 0)]
        try:
            while stack:
                fd, path, names, level = stack[-1]
                name = next(names, None)
                if name is None:
                    stack.pop()
                    if stack:  # not the root's
                        os.close(fd)
                    continue
                sub = path.rstrip("/") + "/" + name
                if name in _PRUNE or sub in self.skip:
                    continue
                entered = self._open(fd, name, sub)
                if entered is None:
                    continue
                child, inner = entered
                try:
                    if inner.present:
                        out.extend((sub + "/" + key, key, False) for key, first in _NESTED
                                   if first in inner.present)
                        if ".git" in inner.dir_set:
                            self._git(child, sub, ".git", out, nested=True)
                except BaseException:
                    os.close(child)
                    raise
                if level + 1 < self.depth:
                    stack.append((child, sub, iter(inner.dirs), level + 1))
                else:
                    os.close(child)
        finally:
            for fd, _, _, _ in stack[1:]:
                os.close(fd)

    def _git(self, fd: int, path: str, name: str, out: list[tuple[str, str, bool]],
             nested: bool = False) -> None:
        """The git directory ``name`` in ``fd`` (at ``path``), its submodules' and its
        worktrees' git directories. The top level's own ``.git`` names come from
        :data:`NAMES` already; a nested repository's are listed here (all of them: a
        missing one is swept, or gets its placeholder)."""
        here = path.rstrip("/") + "/" + name
        with self._enter(fd, name, here) as entered:
            if entered is None:
                return
            gitdir, inner = entered
            if nested:
                out.extend((here + "/" + n, key, True) for n, key in GIT_DIR_NAMES.items())
            for group in ("modules", "worktrees"):
                if group in inner.dir_set:
                    self._inner_gitdirs(gitdir, here, group, out, group == "modules")

    def _inner_gitdirs(self, fd: int, path: str, name: str, out: list[tuple[str, str, bool]],
                       recurse: bool) -> None:
        """Each git directory in ``name`` (a submodule's may be nested under a name with
        slashes, and has submodules of its own: ``recurse``); a directory holding ``HEAD``
        is one. Its :data:`GIT_DIR_NAMES` are all listed, a missing one swept. Depth first
        in name order, a frame per directory entered: (its fd, its path, its subdirectories
        left, how deep below ``name`` it lies); no deeper than :data:`MODULES_DEPTH`."""
        here = path + "/" + name
        entered = self._open(fd, name, here)
        if entered is None:
            return
        stack: list[tuple[int, str, Iterator[str], int]] = [
            (entered[0], here, iter(entered[1].dirs), 0)]
        try:
            while stack:
                held, at, names, level = stack[-1]
                sub = next(names, None)
                if sub is None:
                    stack.pop()
                    os.close(held)
                    continue
                where = at + "/" + sub
                if self._too_deep(level + 1, where, here):
                    continue
                found = self._open(held, sub, where)
                if found is None:
                    continue
                child, listing = found
                try:
                    if "HEAD" in listing.present:
                        out.extend((where + "/" + n, key, True)
                                   for n, key in GIT_DIR_NAMES.items())
                        if recurse and "modules" in listing.dir_set \
                                and not self._too_deep(level + 2, where + "/modules", here):
                            modules = self._open(child, "modules", where + "/modules")
                            if modules is not None:
                                stack.append((modules[0], where + "/modules",
                                              iter(modules[1].dirs), level + 2))
                    elif recurse:  # a submodule named a/b: its git directory is modules/a/b
                        stack.append((child, where, iter(listing.dirs), level + 1))
                        child = -1  # the frame's now
                finally:
                    if child >= 0:
                        os.close(child)
        finally:
            for held, _, _, _ in stack:
                os.close(held)

    def _too_deep(self, level: int, path: str, below: str) -> bool:
        """Whether ``path``, ``level`` directories below ``below``, lies deeper than
        :data:`MODULES_DEPTH` (said in ``stopped``: it is not entered)."""
        if level <= MODULES_DEPTH:
            return False
        self.stopped = self.stopped or (
            f"stopped at {path}, more than {MODULES_DEPTH} directories below {below}: "
            "protected names in it and below it are not protected")
        return True


class _Entered:
    """``with search._enter(fd, name, path) as entered``: the directory ``name`` in ``fd``
    (at ``path``) and its listing, or None (:meth:`Search._open`). Closed on leaving. (A
    class, not contextlib: the served client imports this module and pays for each
    import.)"""

    def __init__(self, search: Search, fd: int, name: str, path: str) -> None:
        self.search, self.fd, self.name, self.path = search, fd, name, path
        self.child: int | None = None

    def __enter__(self) -> tuple[int, Listing] | None:
        entered = self.search._open(self.fd, self.name, self.path)
        if entered is not None:
            self.child = entered[0]
        return entered

    def __exit__(self, *exc: object) -> None:
        if self.child is not None:
            os.close(self.child)
