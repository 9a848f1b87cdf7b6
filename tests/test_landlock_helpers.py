"""Shared helpers for the Landlock tests (no tests here).

Everything that enforces runs in a forked child (tests/childproc.py): a Landlock domain can
never be lifted, and pytest must stay free. Children return plain ints (errno values, 0 for
success) so nothing in them needs a file the domain may deny.
"""
from __future__ import annotations

import ctypes
import errno
import os
import shutil
import struct
from typing import Any, Callable

import pytest

from hcp_linux import landlock
from childproc import run_in_child

PR_SET_NO_NEW_PRIVS = 38
_libc = ctypes.CDLL(None, use_errno=True)
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                        ctypes.c_ulong]
_libc.prctl.restype = ctypes.c_int

ABI = landlock.abi_version()
OK = 0


def needs_abi(n: int) -> pytest.MarkDecorator:
    return pytest.mark.skipif(ABI < n, reason=f"needs Landlock ABI {n}, kernel has {ABI}")


def set_nnp() -> None:
    """no_new_privs: restrict_self needs it for non-root, and the binding never sets it."""
    if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def err(fn: Callable[[], Any]) -> int:
    """Run fn; 0 when it succeeds, else the errno of the OSError it raised."""
    try:
        fn()
    except OSError as e:
        return e.errno or -1
    return OK


def child(fn: Callable[[], Any]) -> Any:
    """Run fn in a forked child and return its value (fail on exception or signal)."""
    return run_in_child(fn).unwrap()


def enforced(created: landlock.CreatedRuleset, fn: Callable[[], Any],
             flags: landlock.RestrictFlags = landlock.RestrictFlags(0)) -> Any:
    """In a child: set NNP, enforce ``created``, then return fn()."""
    def body() -> Any:
        set_nnp()
        created.restrict_self(flags)
        return fn()
    return child(body)


def write_file(path: os.PathLike[str] | str, data: str = "x") -> None:
    with open(path, "w") as f:
        f.write(data)


def append(path: os.PathLike[str] | str) -> None:
    with open(path, "a") as f:
        f.write("y")


def read(path: os.PathLike[str] | str) -> None:
    with open(path) as f:
        f.read()


def make_tree(root: os.PathLike[str] | str) -> tuple[str, str]:
    """Two sibling directories, allowed/ and denied/, each holding a file f."""
    allowed, denied = os.path.join(root, "allowed"), os.path.join(root, "denied")
    for d in (allowed, denied):
        os.mkdir(d)
        write_file(os.path.join(d, "f"), "data")
    return allowed, denied


def elf_interpreter(path: str) -> str | None:
    """PT_INTERP of a 64-bit little-endian ELF file (None when static or another format)."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return None
    phoff = struct.unpack_from("<Q", data, 0x20)[0]
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    for i in range(phnum):
        off = phoff + i * phentsize
        if struct.unpack_from("<I", data, off)[0] == 3:  # PT_INTERP
            start, size = struct.unpack_from("<Q", data, off + 8)[0], \
                struct.unpack_from("<Q", data, off + 32)[0]
            return data[start:start + size].rstrip(b"\0").decode()
    return None


def copy_true(dest_dir: str) -> str:
    """Copy /bin/true into dest_dir, executable by everyone."""
    src = shutil.which("true") or "/bin/true"
    dst = os.path.join(dest_dir, "true")
    shutil.copyfile(src, dst)
    os.chmod(dst, 0o755)
    return dst


def drop_to_nobody() -> None:
    """As root, become nobody (no capabilities); as anyone else, do nothing."""
    if os.geteuid() == 0:
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)


__all__ = ["ABI", "OK", "errno", "needs_abi", "set_nnp", "err", "child", "enforced",
           "write_file", "append", "read", "make_tree", "elf_interpreter", "copy_true",
           "drop_to_nobody", "run_in_child"]
