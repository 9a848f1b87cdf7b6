"""Typed errors of the profile loader and compiler.

Everything here is raised in the parent, while a profile is read or compiled, so a caller that
catches SeccompProfileError knows nothing has been installed anywhere: there is no half-applied
state to undo.
"""
from __future__ import annotations

from typing import Optional


class SeccompProfileError(Exception):
    """Base class: a profile could not be found, parsed, validated or compiled."""


class ProfileNotFoundError(SeccompProfileError, LookupError):
    """No profile of that name (or no file at that path)."""

    def __init__(self, name: str, available: tuple[str, ...] = ()) -> None:
        self.name = name
        self.available = available
        hint = f" (available: {', '.join(available)})" if available else ""
        super().__init__(f"seccomp profile {name!r} not found{hint}")


class ProfileFormatError(SeccompProfileError, ValueError):
    """A profile file is malformed: names the file, the rule index (if any) and the field."""

    def __init__(
        self,
        path: str,
        message: str,
        rule_index: Optional[int] = None,
        field: Optional[str] = None,
    ) -> None:
        self.path = path
        self.rule_index = rule_index
        self.field = field
        where = path
        if rule_index is not None:
            where += f": rule[{rule_index}]"
        if field is not None:
            where += f": {field}"
        super().__init__(f"{where}: {message}")


class UnknownSyscallError(SeccompProfileError, ValueError):
    """A syscall name is unknown on every supported architecture (most likely a typo)."""

    def __init__(self, syscall: str, path: str = "", rule_index: Optional[int] = None) -> None:
        self.syscall = syscall
        self.path = path
        self.rule_index = rule_index
        where = f"{path}: rule[{rule_index}]: " if path and rule_index is not None else ""
        super().__init__(f"{where}unknown syscall {syscall!r} (not known on any supported architecture)")


class SeccompCompileError(SeccompProfileError):
    """libseccomp refused the profiles, or the machine/libseccomp cannot compile them."""


class SeccompLibraryError(SeccompProfileError):
    """libseccomp could not be loaded (pyseccomp's import failed): nothing about the kernel's
    seccomp, so no layer to degrade."""
