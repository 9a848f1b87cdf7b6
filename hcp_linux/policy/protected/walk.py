"""The file-system walks of the protected names' code, shared by the lookup and sweep
(hcp_linux.policy.protected) and the after-run search (.after): paths reached from / one
component at a time without following a symlink, and trees removed through fds. Only os
and stat: the served client imports this for its sweep."""
from __future__ import annotations

import errno
import os
import stat


def within(path: str, tree: str) -> bool:
    return path == tree or path.startswith(tree.rstrip("/") + "/")


def join(root: str, name: str) -> str:
    return root + "/" + name if root != "/" else "/" + name


def open_dir_path(path: str, dirs: dict[str, int | None],
                  since: int | None = None) -> int | None:
    """An O_PATH fd of the directory ``path``, reached from / one component at a time, none
    of them a symlink (O_NOFOLLOW), kept in ``dirs``; None when a component is missing or
    is not a directory (nothing can be at a path below it). ``since`` (after a run, its
    start): a directory on the way that the run locked (no search permission left) gets
    its owner's rwx back (:func:`make_usable`), and the way goes on."""
    if path in dirs:
        return dirs[path]
    if path == "/":
        fd: int | None = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    else:
        parent, name = path.rsplit("/", 1)
        up = open_dir_path(parent or "/", dirs, since)
        fd = None
        if up is not None:
            try:
                fd = _open_below(up, name, since)
            except (FileNotFoundError, NotADirectoryError):
                fd = None
            except OSError as e:
                if e.errno != errno.ELOOP:  # a symlink where a directory was: nothing there
                    raise
    dirs[path] = fd
    return fd


def _open_below(up: int, name: str, since: int | None) -> int:
    flags = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(name, flags, dir_fd=up)
    except PermissionError:
        if since is None:
            raise
        make_usable(up, since)
        return os.open(name, flags, dir_fd=up)


def remove(dir_fd: int, name: str, st: os.stat_result) -> None:
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
    """``name`` under ``dir_fd``, the directory ``st`` describes, opened to be listed. The
    chmod that makes a mode-000 directory listable goes through an O_PATH fd checked to be
    that inode: by name it would follow a symlink another process (a concurrent run with
    the root) put there since the lstat, and chmod the link's target, anywhere."""
    if stat.S_IMODE(st.st_mode) & 0o700 != 0o700:
        held = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                       dir_fd=dir_fd)
        try:
            _same(held, name, st)
            # the magic link acts on the inode behind the fd, whatever is at the name now
            os.chmod(f"/proc/self/fd/{held}", 0o700)
        finally:
            os.close(held)
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                 dir_fd=dir_fd)
    try:
        _same(fd, name, st)
    except OSError:
        os.close(fd)
        raise
    return fd


def _same(fd: int, name: str, st: os.stat_result) -> None:
    now = os.fstat(fd)
    if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
        raise OSError(errno.ESTALE, f"{name}: changed while it was removed")


def make_usable(fd: int, since: int) -> None:
    """Give the directory ``fd`` (any fd of it, O_PATH too) back its owner's rwx when the
    run took them: a command that is not root's can ``chmod 000`` (or 100, 500) the
    directory it planted in, the jail's top included, and a runtime of the same uid could
    then neither see nor remove what it planted, while the user, who chmods it back, gets
    it. Only a directory the run changed (ctime at or after ``since``, its start) and this
    uid owns; root needs no mode."""
    st = os.fstat(fd)
    if st.st_mode & 0o700 == 0o700 or st.st_ctime_ns < since or os.geteuid() == 0 \
            or st.st_uid != os.geteuid():
        return
    # the magic link acts on the inode behind the fd (reached through no symlink)
    os.chmod(f"/proc/self/fd/{fd}", (st.st_mode & 0o7777) | 0o700)


def real_dir(path: str) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False
