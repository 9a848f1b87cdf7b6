"""Landlock access rights, scopes and flags, each knowing the ABI that introduced it.

A kernel rejects a ruleset naming any right it does not know (EINVAL), so every right must be
masked by the running ABI before it reaches the kernel; that needs a table from right to ABI,
kept here beside the values so they cannot drift apart. Values are from
``include/uapi/linux/landlock.h``.
"""
from __future__ import annotations

import enum
from typing import TypeVar

from .errors import RulesetError

#: The newest ABI this binding knows the rights of.
LATEST_ABI = 9

F = TypeVar("F", bound="_AbiFlag")


class _AbiFlag(enum.IntFlag):
    """Shared behaviour of the four flag types; has no members, so it can be subclassed."""

    @classmethod
    def _introduced(cls) -> dict[int, int]:
        return _INTRODUCED[cls]

    @classmethod
    def from_abi(cls: type[F], abi: int) -> F:
        """Every right of this type that a kernel with Landlock ABI ``abi`` knows (0 → none)."""
        bits = 0
        for bit, introduced in cls._introduced().items():
            if introduced <= abi:
                bits |= bit
        return cls(bits)

    @classmethod
    def known(cls: type[F]) -> F:
        """Every right of this type this binding knows, up to :data:`LATEST_ABI`."""
        return cls.from_abi(LATEST_ABI)

    @classmethod
    def introduced_in(cls, rights: int) -> int:
        """The ABI a kernel needs to know all of ``rights`` (the highest one among them).

        Raises :class:`RulesetError` for bits this binding does not know.
        """
        checked = cls.check(rights)
        abi = 0
        for bit, introduced in cls._introduced().items():
            if checked & bit:
                abi = max(abi, introduced)
        return abi

    @classmethod
    def check(cls: type[F], value: int, what: str = "") -> F:
        """Coerce ``value`` to this type, refusing unknown bits and other flag types.

        A plain ``int`` is accepted (its bits are checked); a value of another flag type is
        refused, because ``AccessNet.BIND_TCP`` would otherwise silently mean ``EXECUTE``.
        """
        label = what or cls.__name__
        if isinstance(value, enum.Flag) and not isinstance(value, cls):
            raise RulesetError(f"{label}: expected {cls.__name__}, got {type(value).__name__}",
                               int(value))
        if not isinstance(value, int) or isinstance(value, bool):
            raise RulesetError(f"{label}: expected {cls.__name__}, got {value!r}")
        if value < 0:
            raise RulesetError(f"{label}: negative rights value {value}", int(value))
        unknown = int(value) & ~int(cls.known())
        if unknown:
            raise RulesetError(f"{label}: unknown {cls.__name__} bits {unknown:#x}", unknown)
        return cls(int(value))

    def describe(self) -> str:
        """``"READ_FILE|WRITE_FILE"``-style names, for messages (``str()`` of an IntFlag is
        just the number on Python 3.11)."""
        names = [name for name, member in type(self).__members__.items()
                 if int(member) & int(self)]
        unknown = int(self) & ~int(type(self).known())
        if unknown:
            names.append(f"{unknown:#x}")
        return "|".join(names) if names else "0"


class AccessFs(_AbiFlag):
    """Filesystem access rights (``LANDLOCK_ACCESS_FS_*``)."""

    EXECUTE = 1 << 0
    WRITE_FILE = 1 << 1
    READ_FILE = 1 << 2
    READ_DIR = 1 << 3
    REMOVE_DIR = 1 << 4
    REMOVE_FILE = 1 << 5
    MAKE_CHAR = 1 << 6
    MAKE_DIR = 1 << 7
    MAKE_REG = 1 << 8
    MAKE_SOCK = 1 << 9
    MAKE_FIFO = 1 << 10
    MAKE_BLOCK = 1 << 11
    MAKE_SYM = 1 << 12
    REFER = 1 << 13
    TRUNCATE = 1 << 14
    IOCTL_DEV = 1 << 15
    RESOLVE_UNIX = 1 << 16  # connect/sendmsg to a pathname unix socket (ABI 9)


class AccessNet(_AbiFlag):
    """Network access rights (``LANDLOCK_ACCESS_NET_*``): TCP ports only, not addresses."""

    BIND_TCP = 1 << 0
    CONNECT_TCP = 1 << 1


class Scope(_AbiFlag):
    """IPC scopes (``LANDLOCK_SCOPE_*``): deny reaching processes outside the domain."""

    ABSTRACT_UNIX_SOCKET = 1 << 0
    SIGNAL = 1 << 1


class RestrictFlags(_AbiFlag):
    """``landlock_restrict_self`` flags (``LANDLOCK_RESTRICT_SELF_*``)."""

    LOG_SAME_EXEC_OFF = 1 << 0
    LOG_NEW_EXEC_ON = 1 << 1
    LOG_SUBDOMAINS_OFF = 1 << 2
    TSYNC = 1 << 3


_FS_ABI1 = (AccessFs.EXECUTE, AccessFs.WRITE_FILE, AccessFs.READ_FILE, AccessFs.READ_DIR,
            AccessFs.REMOVE_DIR, AccessFs.REMOVE_FILE, AccessFs.MAKE_CHAR, AccessFs.MAKE_DIR,
            AccessFs.MAKE_REG, AccessFs.MAKE_SOCK, AccessFs.MAKE_FIFO, AccessFs.MAKE_BLOCK,
            AccessFs.MAKE_SYM)

_INTRODUCED: dict[type, dict[int, int]] = {
    AccessFs: {
        **{int(r): 1 for r in _FS_ABI1},
        int(AccessFs.REFER): 2,
        int(AccessFs.TRUNCATE): 3,
        int(AccessFs.IOCTL_DEV): 5,
        int(AccessFs.RESOLVE_UNIX): 9,
    },
    AccessNet: {int(AccessNet.BIND_TCP): 4, int(AccessNet.CONNECT_TCP): 4},
    Scope: {int(Scope.ABSTRACT_UNIX_SOCKET): 6, int(Scope.SIGNAL): 6},
    RestrictFlags: {
        int(RestrictFlags.LOG_SAME_EXEC_OFF): 7,
        int(RestrictFlags.LOG_NEW_EXEC_ON): 7,
        int(RestrictFlags.LOG_SUBDOMAINS_OFF): 7,
        int(RestrictFlags.TSYNC): 8,
    },
}


def introduced_in(right: _AbiFlag) -> int:
    """The ABI that introduced ``right`` (of any of the four flag types)."""
    return type(right).introduced_in(right)


#: Reading files and listing directories.
ACCESS_FS_READ = AccessFs.READ_FILE | AccessFs.READ_DIR
#: Reading plus executing (what a read-only system directory needs).
ACCESS_FS_READ_EXECUTE = ACCESS_FS_READ | AccessFs.EXECUTE
#: Every filesystem right, including IOCTL_DEV: what a fully writable directory needs.
ACCESS_FS_READ_WRITE = AccessFs.known()
#: Everything in ACCESS_FS_READ_WRITE that modifies the filesystem.
ACCESS_FS_WRITE = ACCESS_FS_READ_WRITE & ~ACCESS_FS_READ_EXECUTE
#: Rights that only make sense on a directory; the kernel refuses them (EINVAL) in a rule whose
#: parent fd is not a directory, so file rules must not carry them.
DIR_ONLY_RIGHTS = (
    AccessFs.READ_DIR | AccessFs.REMOVE_DIR | AccessFs.REMOVE_FILE | AccessFs.MAKE_CHAR
    | AccessFs.MAKE_DIR | AccessFs.MAKE_REG | AccessFs.MAKE_SOCK | AccessFs.MAKE_FIFO
    | AccessFs.MAKE_BLOCK | AccessFs.MAKE_SYM | AccessFs.REFER
)
