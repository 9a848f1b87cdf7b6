"""Install a compiled program: one seccomp(2) call through libc's syscall(), no libseccomp.

PreparedFilter does all the work that allocates (copying the bytes into a C buffer, building the
struct sock_fprog, looking up the syscall number and binding the ctypes function) in the parent.
install() is then a single foreign call, safe between fork and exec: no import, no allocation
beyond ctypes' argument conversion, nothing that can take a lock another thread held at fork.

It does not set no_new_privs: the caller does, in the child, right before (without NNP and
without CAP_SYS_ADMIN the kernel answers EACCES, reported as OSError like any other failure).
"""
from __future__ import annotations

import ctypes
import errno
import os

from .machines import native_machine

SECCOMP_SET_MODE_FILTER = 1
SECCOMP_FILTER_FLAG_TSYNC = 1 << 0
SECCOMP_FILTER_FLAG_LOG = 1 << 1
SECCOMP_FILTER_FLAG_SPEC_ALLOW = 1 << 2
#: seccomp(2) returns a listener fd (close-on-exec) for the filter's SECCOMP_RET_USER_NOTIF.
SECCOMP_FILTER_FLAG_NEW_LISTENER = 1 << 3
BPF_MAXINSNS = 4096
_SOCK_FILTER_SIZE = 8

# Our own handle: argtypes set here do not leak into other users of CDLL(None).syscall.
_libc = ctypes.CDLL(None, use_errno=True)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


class PreparedFilter:
    """A BPF program ready to install with one syscall (build it in the parent, before fork)."""

    __slots__ = ("bpf", "_buf", "_prog", "_prog_addr", "_nr", "_syscall")

    def __init__(self, bpf: bytes) -> None:
        if not isinstance(bpf, (bytes, bytearray)):
            raise TypeError("bpf must be bytes")
        count, rest = divmod(len(bpf), _SOCK_FILTER_SIZE)
        if rest or not 0 < count <= BPF_MAXINSNS:
            raise ValueError(f"not a BPF program: {len(bpf)} bytes (need 8*n, 1 <= n <= {BPF_MAXINSNS})")
        machine = native_machine()
        if machine is None:
            raise OSError(errno.ENOSYS, f"seccomp filters are not supported on {os.uname().machine}")
        self.bpf = bytes(bpf)
        self._buf = ctypes.create_string_buffer(self.bpf, len(self.bpf))  # kept alive with self
        self._prog = _SockFprog(count, ctypes.addressof(self._buf))
        self._prog_addr = ctypes.addressof(self._prog)
        self._nr = machine.seccomp_nr
        fn = _libc.syscall
        fn.argtypes = (ctypes.c_long, ctypes.c_long, ctypes.c_long, ctypes.c_void_p)
        fn.restype = ctypes.c_long
        self._syscall = fn

    def install(self, flags: int = 0) -> int:
        """seccomp(SECCOMP_SET_MODE_FILTER, flags, &prog); OSError(errno) on failure. Returns
        the syscall's value: the listener fd with SECCOMP_FILTER_FLAG_NEW_LISTENER, else 0."""
        ret = self._syscall(self._nr, SECCOMP_SET_MODE_FILTER, flags, self._prog_addr)
        if ret < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        return int(ret)


def install_filter(bpf: bytes, flags: int = 0) -> None:
    """Convenience: PreparedFilter(bpf).install(flags) (allocates: not for the fork-exec path)."""
    PreparedFilter(bpf).install(flags)
