"""Syscall names to numbers, straight from libseccomp's tables through ctypes.

Not through pyseccomp: importing it costs ~20 ms (find_library runs ldconfig), and name checks
happen on paths that must stay fast (load_profile, the disk-cache key). libseccomp.so.2 is opened
by its soname, which is what every Debian/Ubuntu ships.

libseccomp 2.5 answers a name lookup for an architecture with the number, with a negative
"pseudo" number when the call exists elsewhere but not there (iopl on aarch64), or with -1
(__NR_SCMP_ERROR) when it does not know the name at all.
"""
from __future__ import annotations

import ctypes
import functools
from typing import Any, Optional, Sequence

from .errors import SeccompCompileError
from .machines import MACHINES, Machine

_NR_SCMP_ERROR = -1
_lib: Optional[ctypes.CDLL] = None


class _Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint), ("minor", ctypes.c_uint), ("micro", ctypes.c_uint)]


def _libseccomp() -> ctypes.CDLL:
    global _lib
    if _lib is None:
        try:
            lib = ctypes.CDLL("libseccomp.so.2")
        except OSError as exc:
            raise SeccompCompileError(f"libseccomp not found ({exc}); install libseccomp2") from None
        lib.seccomp_syscall_resolve_name_arch.argtypes = (ctypes.c_uint32, ctypes.c_char_p)
        lib.seccomp_syscall_resolve_name_arch.restype = ctypes.c_int
        lib.seccomp_syscall_resolve_num_arch.argtypes = (ctypes.c_uint32, ctypes.c_int)
        lib.seccomp_syscall_resolve_num_arch.restype = ctypes.c_void_p  # malloc'd: freed here
        lib.seccomp_version.argtypes = ()
        lib.seccomp_version.restype = ctypes.POINTER(_Version)
        _lib = lib
    return _lib


def libseccomp_version() -> str:
    """'2.5.4': part of the cache key, since another libseccomp may generate another program."""
    v = _libseccomp().seccomp_version().contents
    return f"{v.major}.{v.minor}.{v.micro}"


def numbers(name: str, fallback: Sequence[tuple[str, int]] = ()) -> dict[str, Optional[int]]:
    """The number of `name` on every supported machine (None where it does not exist).

    `fallback` (machine, number) pairs cover calls newer than the installed libseccomp; where
    libseccomp knows the call its number must agree, or the profile is wrong.
    Returns {} when the name is unknown everywhere: the caller reports it as a typo.
    """
    lib = _libseccomp()
    extra = dict(fallback)
    out: dict[str, Optional[int]] = {}
    known = False
    for machine in MACHINES.values():
        nr = lib.seccomp_syscall_resolve_name_arch(machine.audit_arch, name.encode())
        if nr != _NR_SCMP_ERROR:
            known = True
        own = nr if nr >= 0 else None
        given = extra.get(machine.name)
        if own is not None and given is not None and own != given:
            raise ValueError(f"{name}: number {given} for {machine.name} disagrees with libseccomp's {own}")
        out[machine.name] = own if own is not None else given
    if not known and not extra:
        return {}
    return out


def name_of(nr: int, audit_arch: int) -> Optional[str]:
    """The name of syscall ``nr`` on the machine of ``audit_arch`` (an AUDIT_ARCH_* value, as
    seccomp data and audit records give it), or None when libseccomp does not know it."""
    lib = _libseccomp()
    if not 0 <= nr < 1 << 31:
        return None
    ptr = lib.seccomp_syscall_resolve_num_arch(audit_arch & 0xFFFFFFFF, nr)
    if not ptr:
        return None
    try:
        return ctypes.string_at(ptr).decode("ascii", "replace")
    finally:
        _libc_free()(ptr)


@functools.lru_cache(maxsize=1)
def _libc_free() -> Any:
    """libc's free(), for the strings libseccomp allocates (loaded once)."""
    free = ctypes.CDLL(None).free
    free.argtypes = (ctypes.c_void_p,)
    return free


def native_number(name: str, fallback: Sequence[tuple[str, int]], machine: Machine) -> Optional[int]:
    """The number to filter for `name` on `machine`, or None when the call does not exist there."""
    return numbers(name, fallback).get(machine.name)
