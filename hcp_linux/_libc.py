"""Raw Linux syscalls the executor needs, through ctypes, each one errno-checked.

Every wrapper raises ``OSError(errno, ...)`` on failure and never retries or ignores an error:
the child-side step runner turns the exception into a (step, errno) report. Numbers are given
explicitly for calls glibc may not wrap (or wraps only in new releases); calls numbered 424 and
above share one number on every architecture.
"""
from __future__ import annotations

import ctypes
import os
import struct

import _socket

_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long  # without explicit types ctypes truncates to 32 bits

_MACHINE = os.uname().machine  # what platform.machine() reads, without importing it (2 ms)
_OLD_NUMBERS = {
    # name: (x86_64, aarch64/asm-generic)
    "pivot_root": (155, 41),
    "capset": (126, 91),
    "sendmsg": (46, 211),
}
_ARCH_INDEX = 0 if _MACHINE == "x86_64" else 1

NR = {name: nums[_ARCH_INDEX] for name, nums in _OLD_NUMBERS.items()}
NR.update(open_tree=428, move_mount=429, fsopen=430, fsconfig=431, fsmount=432,
          close_range=436, openat2=437, mount_setattr=442)

# Namespaces (linux/sched.h)
CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

# mount(2) flags
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MNT_DETACH = 2

# new mount API
AT_FDCWD = -100
AT_SYMLINK_NOFOLLOW = 0x100
AT_EMPTY_PATH = 0x1000
AT_RECURSIVE = 0x8000
OPEN_TREE_CLONE = 1
OPEN_TREE_CLOEXEC = os.O_CLOEXEC
MOVE_MOUNT_F_EMPTY_PATH = 0x4

# openat2(2) resolve flags (linux/openat2.h)
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2
MOUNT_ATTR_NODEV = 0x4
MOUNT_ATTR_NOEXEC = 0x8

# prctl(2)
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_CAPBSET_DROP = 24
PR_SET_SECUREBITS = 28
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4

# securebits: root gets no special capability treatment, and the bits are locked.
SECBIT_NOROOT = 1 << 0
SECBIT_NOROOT_LOCKED = 1 << 1
SECBIT_NO_SETUID_FIXUP = 1 << 2
SECBIT_NO_SETUID_FIXUP_LOCKED = 1 << 3
SECBIT_KEEP_CAPS_LOCKED = 1 << 5
SECBIT_NO_CAP_AMBIENT_RAISE = 1 << 6
SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED = 1 << 7
SECURE_ALL_LOCKED = (SECBIT_NOROOT | SECBIT_NOROOT_LOCKED | SECBIT_NO_SETUID_FIXUP
                     | SECBIT_NO_SETUID_FIXUP_LOCKED | SECBIT_KEEP_CAPS_LOCKED
                     | SECBIT_NO_CAP_AMBIENT_RAISE | SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED)

CLOSE_RANGE_CLOEXEC = 1 << 2
SECCOMP_FILTER_FLAG_NEW_LISTENER = 1 << 3  # seccomp(2) returns the USER_NOTIF listener

_LINUX_CAPABILITY_VERSION_3 = 0x20080522


def _fail(what: str) -> OSError:
    err = ctypes.get_errno()
    return OSError(err, f"{what}: {os.strerror(err)}")


def _check(ret: int, what: str) -> int:
    if ret < 0:
        raise _fail(what)
    return ret


def _sys(name: str, *args: int | bytes | None) -> int:
    cargs = [a if a is None or isinstance(a, bytes) else ctypes.c_long(a) for a in args]
    return _check(_syscall(ctypes.c_long(NR[name]), *cargs), name)


def unshare(flags: int) -> None:
    _check(_libc.unshare(ctypes.c_int(flags)), "unshare")


def mount(source: bytes | None, target: bytes, fstype: bytes | None, flags: int,
          data: bytes | None = None) -> None:
    _check(_libc.mount(source, target, fstype, ctypes.c_ulong(flags), data), "mount")


def umount2(target: bytes, flags: int) -> None:
    _check(_libc.umount2(target, ctypes.c_int(flags)), "umount2")


def pivot_root(new_root: bytes, put_old: bytes) -> None:
    _sys("pivot_root", new_root, put_old)


def open_tree(dirfd: int, path: bytes, flags: int) -> int:
    return _sys("open_tree", dirfd, path, flags)


def move_mount(from_fd: int, from_path: bytes, to_fd: int, to_path: bytes, flags: int) -> None:
    _sys("move_mount", from_fd, from_path, to_fd, to_path, flags)


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                ("resolve", ctypes.c_uint64)]


def openat2(dirfd: int, path: bytes, flags: int, resolve: int) -> int:
    """openat2(2) with ``resolve`` (RESOLVE_*): the lookup itself refuses what the flags
    forbid (ELOOP for a symlink under RESOLVE_NO_SYMLINKS), with no window between a check
    and the open."""
    how = _OpenHow(flags, 0, resolve)
    ret = _syscall(ctypes.c_long(NR["openat2"]), ctypes.c_long(dirfd), path,
                   ctypes.byref(how), ctypes.c_long(ctypes.sizeof(how)))
    return _check(ret, "openat2")


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def mount_setattr(fd: int, path: bytes, flags: int, attr_set: int) -> None:
    attr = _MountAttr(attr_set, 0, 0, 0)
    ret = _syscall(ctypes.c_long(NR["mount_setattr"]), ctypes.c_long(fd), path,
                   ctypes.c_long(flags), ctypes.byref(attr), ctypes.c_long(ctypes.sizeof(attr)))
    _check(ret, "mount_setattr")


class _Pollfd(ctypes.Structure):
    _fields_ = [("fd", ctypes.c_int), ("events", ctypes.c_short), ("revents", ctypes.c_short)]


_POLLOUT, _POLLERR = 0x4, 0x8


def poll_error(fd: int) -> bool:
    """Whether ``fd`` polls POLLERR now (a pipe's write end whose readers are all gone):
    poll(2) by ctypes, for the child side, which imports nothing between fork and exec."""
    p = _Pollfd(fd, _POLLOUT, 0)
    _check(_libc.poll(ctypes.byref(p), 1, 0), "poll")
    return bool(p.revents & _POLLERR)


def close_range(first: int, last: int, flags: int) -> None:
    _sys("close_range", first, last, flags)


def prctl(option: int, arg2: int = 0, arg3: int = 0, arg4: int = 0, arg5: int = 0) -> int:
    return _check(_libc.prctl(ctypes.c_int(option), ctypes.c_ulong(arg2), ctypes.c_ulong(arg3),
                              ctypes.c_ulong(arg4), ctypes.c_ulong(arg5)), "prctl")


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class _Msghdr(ctypes.Structure):
    _fields_ = [("name", ctypes.c_void_p), ("namelen", ctypes.c_uint32),
                ("iov", ctypes.POINTER(_Iovec)), ("iovlen", ctypes.c_size_t),
                ("control", ctypes.c_void_p), ("controllen", ctypes.c_size_t),
                ("flags", ctypes.c_int)]


SOL_SOCKET, SCM_RIGHTS = 1, 1


def sendmsg_fds(channel: int, data: bytes, fds: tuple[int, ...], flags: int) -> int:
    """sendmsg(2) of ``data`` with ``fds`` (SCM_RIGHTS), by the raw syscall with ``flags``
    as given, all 64 bits: the socket module's sendmsg() cannot pass the upper half, which
    the kernel ignores and a seccomp filter sees (protocol.HANDOVER_MARK)."""
    body = ctypes.create_string_buffer(data, len(data))
    iov = _Iovec(ctypes.cast(body, ctypes.c_void_p), len(data))
    rights = struct.pack(f"@{len(fds)}i", *fds)
    space = _socket.CMSG_SPACE(len(rights))
    control = ctypes.create_string_buffer(
        struct.pack("@Nii", _socket.CMSG_LEN(len(rights)), SOL_SOCKET, SCM_RIGHTS) + rights,
        space)
    msg = _Msghdr(None, 0, ctypes.pointer(iov), 1, ctypes.cast(control, ctypes.c_void_p),
                  space, 0)
    return _check(_syscall(ctypes.c_long(NR["sendmsg"]), ctypes.c_long(channel),
                           ctypes.byref(msg), ctypes.c_ulong(flags)), "sendmsg")


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def capset_empty() -> None:
    """Clear the effective, permitted and inheritable sets of the calling thread."""
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    ret = _syscall(ctypes.c_long(NR["capset"]), ctypes.byref(header), ctypes.byref(data))
    _check(ret, "capset")


CAP_SETPCAP = 8


def has_capability(cap: int) -> bool:
    """Whether this process holds ``cap`` in its effective set (from /proc/self/status)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> cap & 1)
    return False


def cap_last_cap() -> int:
    """The highest capability number this kernel knows (bounding-set drops go up to it).
    Fixed for the kernel's lifetime: read once per process."""
    global _cap_last_cap
    if _cap_last_cap is None:
        with open("/proc/sys/kernel/cap_last_cap", "rb") as f:
            _cap_last_cap = int(f.read())
    return _cap_last_cap


_cap_last_cap: int | None = None
