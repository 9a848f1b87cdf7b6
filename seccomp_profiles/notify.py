"""The listener side of SECCOMP_RET_USER_NOTIF: receive a notification, answer it.

A filter installed with SECCOMP_FILTER_FLAG_NEW_LISTENER hands the installing process an fd;
each syscall the program answers SECCOMP_RET_USER_NOTIF then waits in the kernel until the
fd's holder answers it (SECCOMP_IOCTL_NOTIF_SEND) — here always with an error, never with
"continue": a listener that let a call through would make the filter a suggestion. When every
holder of the fd has closed it, the kernel answers pending and later notified calls ENOSYS
itself: the call is still refused. Knows nothing of HCP.

Layouts (include/uapi/linux/seccomp.h): struct seccomp_notif {u64 id; u32 pid; u32 flags;
struct seccomp_data data} (80 bytes) and struct seccomp_notif_resp {u64 id; s64 val;
s32 error; u32 flags} (24 bytes); the ioctl numbers are _IOWR('!', 0 and 1, ...) and
_IOW('!', 2, u64), the same on every architecture Linux supports seccomp on.
"""
from __future__ import annotations

import errno
import fcntl
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
#: Not needed here: a listener that reads nothing of the caller's memory between receive and
#: answer has no check to make, since SEND itself fails (ENOENT) for a caller gone meanwhile
#: and ids are unique per filter (a 64-bit counter), never recycled.
IOCTL_NOTIF_ID_VALID = _iowr(2, _ID.size, write_only=True)


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
