"""Files inside a jail, read and written by the runtime on a caller's behalf, by descriptor.

A jail is writable by the sandboxed command, which may swap any path component for a symlink
(or plant a FIFO, or a hard link to a file outside) at any moment. So a path is never
checked first and opened later: each component is opened from the jail's directory
descriptor with ``O_NOFOLLOW``, and the file itself must be a regular file with one link.
Used by hcp_linux.ray's write_file/read_file; nothing here imports Ray.
"""
from __future__ import annotations

import errno
import os
import stat

from ..errors import PolicyError

__all__ = ["open_jail", "read_in", "write_in"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def open_jail(path: str) -> int:
    """The jail's directory descriptor, which every later access starts from (the jail
    itself must not be a symlink either)."""
    return os.open(path, _DIR_FLAGS)


def _parts(path: str) -> list[str]:
    """The components of a path inside the jail: relative, no ``..``, no NUL."""
    if not isinstance(path, str) or not path or "\0" in path:
        raise PolicyError(f"path {path!r}: expected a non-empty relative path")
    if path.startswith("/"):
        raise PolicyError(f"path {path!r}: absolute; paths are relative to the sandbox's jail")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise PolicyError(f"path {path!r}: '..' would leave the jail")
    if not parts:
        raise PolicyError(f"path {path!r}: names the jail itself, not a file")
    return parts


def _walk(jail_fd: int, parts: list[str], create: bool) -> int:
    """Open the directory holding ``parts[-1]``, one component at a time from the jail's
    descriptor, never following a symlink (``O_NOFOLLOW``): the command in the jail may swap
    any component for a symlink at any moment, and a path checked first and opened later
    would follow it."""
    fd = os.dup(jail_fd)
    try:
        for name in parts[:-1]:
            try:
                nfd = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(name, 0o755, dir_fd=fd)  # mkdirat never follows a symlink
                except FileExistsError:
                    pass
                nfd = os.open(name, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nfd
        return fd
    except BaseException:
        os.close(fd)
        raise


def _open_regular(jail_fd: int, path: str, flags: int, create: bool) -> int:
    """A descriptor of the regular file at ``path`` in the jail, or :class:`SandboxError`."""
    parts = _parts(path)
    try:
        dfd = _walk(jail_fd, parts, create)
        try:
            # O_NONBLOCK: a FIFO planted under the name opens at once (and is refused below)
            fd = os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                         0o644, dir_fd=dfd)
        finally:
            os.close(dfd)
    except OSError as e:
        why = ("a symlink (or not a directory) on the way"
               if e.errno in (errno.ELOOP, errno.ENOTDIR) else e.strerror)
        raise PolicyError(f"path {path!r}: {why}") from e
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
        os.close(fd)
        raise PolicyError(f"path {path!r}: not a regular file with one link (a hard link may "
                           "be shared with a file outside the jail)")
    os.set_blocking(fd, True)
    return fd


def write_in(jail_fd: int, path: str, data: bytes, append: bool = False) -> None:
    """Write ``data`` to ``path`` inside the jail, making missing parent directories."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else 0)
    fd = _open_regular(jail_fd, path, flags, create=True)
    try:
        if not append:
            os.ftruncate(fd, 0)  # after the checks: O_TRUNC would cut a file before them
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def read_in(jail_fd: int, path: str) -> bytes:
    """The bytes of the regular file at ``path`` inside the jail."""
    fd = _open_regular(jail_fd, path, os.O_RDONLY, create=False)
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)
