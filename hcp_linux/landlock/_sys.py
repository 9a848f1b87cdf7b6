"""Raw Landlock system calls through ctypes.

glibc has no wrappers for the three Landlock calls, so they go through ``syscall(2)``. This module
is deliberately thin: it packs the kernel structures, makes the call, and turns every ``-1`` into a
:class:`~landlock.errors.SyscallError` (an ``OSError``) whose message says what that errno means
for *that* call. Policy (ABI masking, stripping, compatibility) lives in :mod:`landlock.ruleset`.

All functions here are safe to call in a forked child: no allocation beyond small ctypes
objects, no locks, no imports.
"""
from __future__ import annotations

import ctypes
import errno as E
import os

from .errors import SyscallError

# Every architecture that joined the unified syscall table (since Linux 5.1) numbers these
# the same; the odd ones (alpha, ia64, mips ABIs) are simply not supported here.
_UNIFIED_ARCHES = frozenset({
    "x86_64", "amd64", "i386", "i486", "i586", "i686", "aarch64", "arm64", "armv7l", "armv8l",
    "riscv64", "ppc64", "ppc64le", "s390x", "loongarch64",
})
_ARCH_SUPPORTED = os.uname().machine.lower() in _UNIFIED_ARCHES  # platform.machine(), cheaper
SYS_CREATE_RULESET = 444
SYS_ADD_RULE = 445
SYS_RESTRICT_SELF = 446

CREATE_RULESET_VERSION = 1 << 0
CREATE_RULESET_ERRATA = 1 << 1
RULE_PATH_BENEATH = 1
RULE_NET_PORT = 2

_U64_MAX = (1 << 64) - 1
_S32_MIN, _S32_MAX = -(1 << 31), (1 << 31) - 1
_U32_MAX = (1 << 32) - 1


class RulesetAttr(ctypes.Structure):
    """``struct landlock_ruleset_attr``; the size passed tells the kernel which fields exist."""

    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class PathBeneathAttr(ctypes.Structure):
    """``struct landlock_path_beneath_attr``: packed in the uapi, so 12 bytes, not 16."""

    _pack_ = 1
    _fields_ = [
        ("allowed_access", ctypes.c_uint64),
        ("parent_fd", ctypes.c_int32),
    ]


class NetPortAttr(ctypes.Structure):
    """``struct landlock_net_port_attr`` (port is a u64 in host byte order)."""

    _fields_ = [
        ("allowed_access", ctypes.c_uint64),
        ("port", ctypes.c_uint64),
    ]


# Sizes of landlock_ruleset_attr as it grew: fs only (ABI 1-3), + net (ABI 4-5), + scoped (6+).
ATTR_SIZE_FS = 8
ATTR_SIZE_NET = 16
ATTR_SIZE_SCOPED = 24

assert ctypes.sizeof(PathBeneathAttr) == 12
assert ctypes.sizeof(NetPortAttr) == 16
assert ctypes.sizeof(RulesetAttr) == ATTR_SIZE_SCOPED

# A private prototype of syscall(2): every argument and the result as C long, so pointers and
# 64-bit masks are never truncated to int, and nobody else's argtypes on libc.syscall matter.
_SyscallProto = ctypes.CFUNCTYPE(
    ctypes.c_long, ctypes.c_long, ctypes.c_long, ctypes.c_long, ctypes.c_long, ctypes.c_long,
    use_errno=True,
)
_syscall = _SyscallProto(("syscall", ctypes.CDLL(None, use_errno=True)))

# What each errno means for each call, from landlock(7) and security/landlock/syscalls.c.
_HINTS: dict[str, dict[int, str]] = {
    "landlock_create_ruleset": {
        E.ENOSYS: "Landlock is not supported by this kernel or architecture",
        E.EOPNOTSUPP: "Landlock is supported by the kernel but disabled at boot (lsm=)",
        E.EINVAL: "unknown flags, or access rights unknown to this kernel (mask by ABI)",
        E.E2BIG: "ruleset attribute larger than this kernel knows, with non-zero tail",
        E.EFAULT: "bad attribute pointer",
        E.ENOMSG: "empty ruleset: nothing is handled",
        E.EMFILE: "too many open files",
        E.ENFILE: "system file table full",
        E.ENOMEM: "out of memory",
    },
    "landlock_add_rule": {
        E.EOPNOTSUPP: "Landlock is disabled, or this rule type is not supported by the kernel",
        E.EAFNOSUPPORT: "network rule on a kernel built without TCP support",
        E.EINVAL: "flags non-zero, access not handled by the ruleset, or directory-only "
                  "rights on a non-directory, or port above 65535",
        E.ENOMSG: "empty allowed access",
        E.EBADF: "ruleset fd or parent fd is not an open file descriptor",
        E.EBADFD: "ruleset fd is not a ruleset, or parent fd is an internal/pseudo file",
        E.EPERM: "ruleset fd was not opened for writing",
        E.EFAULT: "bad rule attribute pointer",
        E.ENOMEM: "out of memory",
    },
    "landlock_restrict_self": {
        E.EOPNOTSUPP: "Landlock is disabled",
        E.EINVAL: "unknown flags for this kernel (mask by ABI)",
        E.EBADF: "ruleset fd is not an open file descriptor",
        E.EBADFD: "fd is not a Landlock ruleset",
        E.EPERM: "no_new_privs is not set and the caller lacks CAP_SYS_ADMIN: call "
                 "prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) first; this binding never sets it "
                 "itself (or the ruleset fd lacks read access)",
        E.E2BIG: "too many stacked Landlock domains (the kernel allows 16)",
        E.ENOMEM: "out of memory",
    },
}


def _check(result: int, syscall: str) -> int:
    """Return ``result``, or raise the errno of a failed call with that call's hint."""
    if result >= 0:
        return result
    err = ctypes.get_errno()
    if err == 0:  # cannot happen per syscall(2); never report a failure as success
        err = E.EIO
    raise SyscallError(err, syscall, _HINTS.get(syscall, {}).get(err, ""))


def _call(nr: int, a: int = 0, b: int = 0, c: int = 0, d: int = 0) -> int:
    if not _ARCH_SUPPORTED:
        ctypes.set_errno(E.ENOSYS)
        return -1
    ctypes.set_errno(0)
    return int(_syscall(nr, a, b, c, d))


def _in_range(value: int, lo: int, hi: int, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise ValueError(f"{what} {value!r} out of range {lo}..{hi}")
    return int(value)


def attr_size(fs: int, net: int, scoped: int) -> int:
    """The smallest attribute size that carries every non-zero field.

    Old kernels reject a larger struct only when its unknown tail is non-zero, but passing the
    minimal size keeps the call valid on every kernel that knows the fields in use.
    """
    if scoped:
        return ATTR_SIZE_SCOPED
    if net:
        return ATTR_SIZE_NET
    return ATTR_SIZE_FS


def abi_version() -> int:
    """``landlock_create_ruleset(NULL, 0, VERSION)``: the kernel's ABI, uncached; raises."""
    return _check(_call(SYS_CREATE_RULESET, 0, 0, CREATE_RULESET_VERSION), "landlock_create_ruleset")


def errata() -> int:
    """``landlock_create_ruleset(NULL, 0, ERRATA)``: bitmask of fixed issues; raises."""
    return _check(_call(SYS_CREATE_RULESET, 0, 0, CREATE_RULESET_ERRATA), "landlock_create_ruleset")


def create_ruleset(fs: int, net: int = 0, scoped: int = 0, flags: int = 0,
                   size: int | None = None) -> int:
    """Create a ruleset and return its fd (the kernel opens it O_CLOEXEC).

    ``size`` defaults to :func:`attr_size`; pass it only to exercise the kernel's size checks.
    """
    attr = RulesetAttr(
        _in_range(fs, 0, _U64_MAX, "handled_access_fs"),
        _in_range(net, 0, _U64_MAX, "handled_access_net"),
        _in_range(scoped, 0, _U64_MAX, "scoped"),
    )
    length = attr_size(fs, net, scoped) if size is None else _in_range(size, 0, 4096, "size")
    flags = _in_range(flags, 0, _U32_MAX, "flags")
    result = _call(SYS_CREATE_RULESET, ctypes.addressof(attr), length, flags)
    return _check(result, "landlock_create_ruleset")


def add_path_beneath(ruleset_fd: int, access: int, parent_fd: int) -> None:
    """Allow ``access`` beneath the file or directory open as ``parent_fd`` (O_PATH is fine)."""
    attr = PathBeneathAttr(
        _in_range(access, 0, _U64_MAX, "allowed_access"),
        _in_range(parent_fd, _S32_MIN, _S32_MAX, "parent_fd"),
    )
    rfd = _in_range(ruleset_fd, _S32_MIN, _S32_MAX, "ruleset_fd")
    _check(_call(SYS_ADD_RULE, rfd, RULE_PATH_BENEATH, ctypes.addressof(attr), 0),
           "landlock_add_rule")


def add_net_port(ruleset_fd: int, access: int, port: int) -> None:
    """Allow ``access`` (bind/connect TCP) on ``port``; the kernel rejects ports above 65535."""
    attr = NetPortAttr(
        _in_range(access, 0, _U64_MAX, "allowed_access"),
        _in_range(port, 0, _U64_MAX, "port"),
    )
    rfd = _in_range(ruleset_fd, _S32_MIN, _S32_MAX, "ruleset_fd")
    _check(_call(SYS_ADD_RULE, rfd, RULE_NET_PORT, ctypes.addressof(attr), 0),
           "landlock_add_rule")


def restrict_self(ruleset_fd: int, flags: int = 0) -> None:
    """Enforce the ruleset on the calling thread and its future children. Irreversible.

    Needs no_new_privs (or CAP_SYS_ADMIN); the EPERM message says so.
    """
    rfd = _in_range(ruleset_fd, _S32_MIN, _S32_MAX, "ruleset_fd")
    flags = _in_range(flags, 0, _U32_MAX, "flags")
    _check(_call(SYS_RESTRICT_SELF, rfd, flags), "landlock_restrict_self")
