"""Exceptions a caller can catch, each carrying the exit status the CLI reports for it.

The CLI prints every one of them as a single ``error: sandbox: <message>`` line.
"""
from __future__ import annotations

# Exit statuses of `hcp-linux run` (DESIGN §5; the README lists them).
EXIT_USAGE = 2
EXIT_TIMEOUT = 124
EXIT_REFUSED = 125
EXIT_NOT_EXECUTABLE = 126
EXIT_NOT_FOUND = 127


class SandboxError(Exception):
    """Base class: the sandbox refused or failed before the command ran."""

    exit_code = EXIT_REFUSED

    def __str__(self) -> str:  # the text after "error: sandbox: "
        return self.args[0] if self.args else self.__class__.__name__


class PolicyError(SandboxError, ValueError):
    """The policy, the command line or a policy file is invalid; nothing was run."""


class NotAllowlistedError(SandboxError):
    """HCP §10.2.1: the bin is not on the allow-list (exit 127, exact message)."""

    exit_code = EXIT_NOT_FOUND

    def __init__(self, bin_: str) -> None:
        super().__init__(f'bin "{bin_}" not allowlisted')
        self.bin = bin_


class BinNotFoundError(SandboxError):
    exit_code = EXIT_NOT_FOUND


class BinNotExecutableError(SandboxError):
    exit_code = EXIT_NOT_EXECUTABLE


class HostPathError(SandboxError):
    """HCP §10.6: a host-absolute path under /etc, /home, /root or /Users (exact message)."""

    def __init__(self, path: str) -> None:
        super().__init__("host path not allowed")
        self.path = path


class LayerUnavailableError(SandboxError):
    """A confinement layer the policy requires cannot be put in force on this host."""

    def __init__(self, layer: str, reason: str, remedy: str) -> None:
        super().__init__(f"{layer} unavailable: {reason}; {remedy} "
                         f"(or accept the loss with --allow-degraded {layer})")
        self.layer, self.reason, self.remedy = layer, reason, remedy


class ChildSetupError(SandboxError):
    """A step of the child's setup failed; the command never ran."""

    def __init__(self, step: str, errno_: int, detail: str = "") -> None:
        import os
        where = f"{step} {detail}".strip()
        super().__init__(f"{where}: {os.strerror(errno_)}")
        self.step, self.errno, self.detail = step, errno_, detail
