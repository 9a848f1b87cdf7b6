"""Exception types of the Landlock binding.

Every error a caller may want to react to differently has its own class, and each carries the
culprit (the offending bits, the missing rights, the path) as attributes, not only in its
message: a sandbox that fails to build should say exactly which promise it could not keep.

Hierarchy::

    LandlockError
    ├── SyscallError (also OSError)      a Landlock syscall failed; .errno, .syscall
    ├── RulesetError (also ValueError)   the caller asked for something malformed; .bits
    │   └── PortError                    a port outside 0..65535; .port
    ├── PathError                        a rule's path could not be opened; .path, .errno
    └── IncompatibleError                the kernel lacks required rights; .missing, .abi
        └── UnsupportedError             Landlock itself is unavailable (ABI 0)
"""
from __future__ import annotations

import os
from typing import Sequence


class LandlockError(Exception):
    """Base class of every error raised by this package."""


class SyscallError(LandlockError, OSError):
    """A Landlock system call returned -1.

    It is an ``OSError`` (``.errno`` and ``.strerror`` are set as usual) so callers that only
    know the syscall contract can still catch it as one; ``.syscall`` names the call.
    """

    def __init__(self, errno: int, syscall: str, hint: str = "") -> None:
        message = f"{syscall}: {os.strerror(errno)}"
        if hint:
            message += f" ({hint})"
        super().__init__(errno, message)
        self.syscall = syscall
        self.hint = hint


class RulesetError(LandlockError, ValueError):
    """The ruleset description itself is wrong: empty, unknown bits, rights not handled.

    ``bits`` is the integer value of the offending rights (0 when the problem is not a bit set).
    """

    def __init__(self, message: str, bits: int = 0) -> None:
        super().__init__(message)
        self.bits = bits


class PortError(RulesetError):
    """A network rule names a port outside 0..65535 (or not an integer)."""

    def __init__(self, message: str, port: object) -> None:
        super().__init__(message)
        self.port = port


class PathError(LandlockError):
    """A rule's path could not be opened (missing, or otherwise unusable).

    ``path`` is what the caller passed (a path, or an ``int`` file descriptor); ``errno`` is the
    error from opening or inspecting it.
    """

    def __init__(self, message: str, path: object, errno: int = 0) -> None:
        super().__init__(message)
        self.path = path
        self.errno = errno


class IncompatibleError(LandlockError):
    """The running (or simulated) ABI lacks rights the caller declared indispensable.

    ``missing`` holds one non-zero flag value per flag type (``AccessFs``, ``AccessNet``,
    ``Scope``, ``RestrictFlags``) that could not be honoured; ``abi`` is the ABI checked against.
    """

    def __init__(self, message: str, missing: Sequence[int], abi: int) -> None:
        super().__init__(message)
        self.missing = tuple(missing)
        self.abi = abi


class UnsupportedError(IncompatibleError):
    """Landlock is not available at all (ABI 0: not built in, disabled at boot, or blocked)."""
