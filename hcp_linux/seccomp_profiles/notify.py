"""The listener side of SECCOMP_RET_USER_NOTIF: receive a notification, answer it.

A filter installed with SECCOMP_FILTER_FLAG_NEW_LISTENER hands the installing process an fd;
each syscall the program answers SECCOMP_RET_USER_NOTIF then waits in the kernel until the
fd's holder answers it (SECCOMP_IOCTL_NOTIF_SEND). A denial is answered with an error
(:func:`refuse`): a listener that let a denied call through would make the filter a
suggestion. Only an observing rule ("notify") is answered "continue" (:func:`let_run`), after
the listener has looked at the call (:func:`read_memory`): the kernel then runs it as usual
and decides; the look is never a decision, as the call's memory may change before the kernel
reads it (nor is a look at one of its fds, through :func:`borrow_fd`'s copy). When every
holder of the fd has closed it, the kernel answers pending and later notified calls ENOSYS
itself: the call is refused. Knows nothing of HCP.

Layouts (include/uapi/linux/seccomp.h): struct seccomp_notif {u64 id; u32 pid; u32 flags;
struct seccomp_data data} (80 bytes) and struct seccomp_notif_resp {u64 id; s64 val;
s32 error; u32 flags} (24 bytes); the ioctl numbers are _IOWR('!', 0 and 1, ...) and
_IOW('!', 2, u64), the same on every architecture Linux supports seccomp on.
"""
from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import struct
from typing import NamedTuple

_NOTIF = struct.Struct("=QIIiIQ6Q")
_RESP = struct.Struct("=QqiI")
_ID = struct.Struct("=Q")


def _iowr(nr: int, size: int, write_only: bool = False) -> int:
    direction = 1 if write_only else 3  # _IOC_WRITE, _IOC_READ|_IOC_WRITE
    return direction << 30 | size << 16 | ord("!") << 8 | nr


IOCTL_NOTIF_RECV = _iowr(0, _NOTIF.size)
IOCTL_NOTIF_SEND = _iowr(1, _RESP.size)
#: After reading the caller's memory by its pid: whether the notification is still pending,
#: so that the pid was still that caller's when it was read (a pid is recycled; ids, a 64-bit
#: counter per filter, are not). Answers to a gone caller fail (ENOENT) by themselves.
IOCTL_NOTIF_ID_VALID = _iowr(2, _ID.size, write_only=True)
#: SECCOMP_USER_NOTIF_FLAG_CONTINUE: the kernel runs the call as if the filter allowed it.
FLAG_CONTINUE = 1


class Notification(NamedTuple):
    """One syscall waiting for an answer: the kernel's cookie, the caller's pid (as the
    listener's pid namespace sees it; 0 when it is not visible there) and its seccomp_data."""

    id: int
    pid: int
    nr: int
    arch: int
    args: tuple[int, ...]


def receive(listener: int) -> Notification:
    """The next notification (blocks; poll the fd for POLLIN first). OSError: ENOENT when
    the caller was killed or interrupted before we read it (nothing to answer)."""
    buf = bytearray(_NOTIF.size)  # the kernel requires it zeroed
    fcntl.ioctl(listener, IOCTL_NOTIF_RECV, buf, True)
    nid, pid, _flags, nr, arch, _ip, *args = _NOTIF.unpack(buf)
    return Notification(nid, pid, nr, arch, tuple(args))


def refuse(listener: int, nid: int, err: int) -> bool:
    """Answer ``nid`` with -``err``. False when the caller is gone (ENOENT: killed or
    interrupted by a signal meanwhile; the kernel has dropped the notification)."""
    try:
        fcntl.ioctl(listener, IOCTL_NOTIF_SEND, _RESP.pack(nid, 0, -err, 0))
    except OSError as e:
        if e.errno == errno.ENOENT:
            return False
        raise
    return True


def let_run(listener: int, nid: int) -> bool:
    """Answer ``nid`` "continue": the kernel runs the call itself (for observing rules only).
    False when the caller is gone (ENOENT)."""
    try:
        fcntl.ioctl(listener, IOCTL_NOTIF_SEND, _RESP.pack(nid, 0, 0, FLAG_CONTINUE))
    except OSError as e:
        if e.errno == errno.ENOENT:
            return False
        raise
    return True


def still_pending(listener: int, nid: int) -> bool:
    """SECCOMP_IOCTL_NOTIF_ID_VALID: whether ``nid`` still waits for its answer (so its pid
    was still the caller's when the listener read its memory)."""
    try:
        fcntl.ioctl(listener, IOCTL_NOTIF_ID_VALID, _ID.pack(nid))
    except OSError as e:
        if e.errno == errno.ENOENT:
            return False
        raise
    return True


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


_libc: "ctypes.CDLL | None" = None


def read_memory(pid: int, address: int, size: int) -> bytes:
    """Up to ``size`` bytes at ``address`` in process ``pid`` (process_vm_readv: the caller
    needs ptrace-attach rights over it, as the creator of its user namespace has). OSError
    with the kernel's errno (EFAULT: not mapped; ESRCH: gone; EPERM: not ours). Check
    :func:`still_pending` after it: the pid may have been another process's by then."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(size)
    local = _Iovec(ctypes.cast(buf, ctypes.c_void_p), size)
    remote = _Iovec(address, size)
    got = _libc.process_vm_readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
    if got < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return buf.raw[:got]


#: pidfd_getfd(2)'s number: the same on every machine this package supports (since 5.6).
_PIDFD_GETFD = 438


def borrow_fd(pid: int, fd: int) -> int:
    """A copy, in this process, of process ``pid``'s open file ``fd`` (pidfd_open, then
    pidfd_getfd: the same ptrace-attach rights as :func:`read_memory`); the caller closes
    it. Look, never act: the copy shares the caller's open file (its offset, its socket).
    OSError with the kernel's errno (EBADF: no such fd; ESRCH: gone; EPERM: not ours;
    ENOSYS: a kernel before 5.6). Check :func:`still_pending` after it, as after a read."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    pidfd = os.pidfd_open(pid)
    try:
        got = _libc.syscall(_PIDFD_GETFD, pidfd, fd, 0)
        if got < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        return int(got)
    finally:
        os.close(pidfd)
