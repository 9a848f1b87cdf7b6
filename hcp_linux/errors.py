"""Exceptions a caller can catch, each carrying the exit status the CLI reports for it.

The CLI prints every one of them as a single ``error: sandbox: <message>`` line.
"""
from __future__ import annotations

# Exit statuses of `hcp-linux run` (the README lists them).
EXIT_USAGE = 2
EXIT_TIMEOUT = 124
EXIT_REFUSED = 125
EXIT_NOT_EXECUTABLE = 126
EXIT_NOT_FOUND = 127


def printable(text: str) -> str:
    """``text`` fit for a one-line message: control characters (and the lone surrogates that
    stand for undecodable bytes in file names) are shown as escapes, never emitted, so a file
    name cannot add a line to a message or move a terminal's cursor."""
    if text.isprintable():
        return text
    out = []
    for c in text:
        o = ord(c)
        if 0xDC80 <= o <= 0xDCFF:  # os.fsdecode's stand-in for the byte o - 0xDC00
            out.append(f"\\x{o - 0xDC00:02x}")
        elif c.isprintable():
            out.append(c)
        elif o < 0x100:
            out.append(f"\\x{o:02x}")
        else:
            out.append(f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}")
    return "".join(out)


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


class WritebackError(SandboxError):
    """An output could not be written back (exit 125). Writeback is all-or-nothing: no
    destination of the run was changed (docs/driver.md says what a crash can leave).

    ``path`` is the destination that failed, ``cause`` why (strerror, or what was found).
    From the driver, ``report`` is the :class:`~hcp_linux.driver.driver.WritebackReport` and, from
    ``LinuxDriver.run``/``run_async``, ``result`` the whole
    :class:`~hcp_linux.driver.driver.DriverResult`: the command's own status, output and receipt
    are not lost because its outputs were.
    """

    def __init__(self, path: str, cause: str) -> None:
        super().__init__(f"writeback {printable(path)}: {printable(cause)}")
        self.path, self.cause = path, cause
        self.report: object = None
        self.result: object = None


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


def limit_hint(err: int | None, making_a_process: bool = False) -> str:
    """For running out of fds (EMFILE), or of processes (EAGAIN where one is made), the
    limit that may have done it and the remedy; else ""."""
    import errno
    import resource
    if err == errno.EMFILE:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        return f" (this process may have {soft} open: RLIMIT_NOFILE; raise it, e.g. ulimit -n)"
    if err == errno.EAGAIN and making_a_process:
        soft = resource.getrlimit(resource.RLIMIT_NPROC)[0]
        return (f" (no process could be made: this user may have "
                f"{'no limit on' if soft == resource.RLIM_INFINITY else soft} processes: "
                f"RLIMIT_NPROC, ulimit -u; or its cgroup's pids.max is reached)")
    return ""


class ChildSetupError(SandboxError):
    """A step of the child's setup failed; the command never ran."""

    def __init__(self, step: str, errno_: int, detail: str = "") -> None:
        import os
        where = f"{step} {detail}".strip()
        hint = limit_hint(errno_, step.startswith(("fork", "clone", "spawn")))
        super().__init__(f"{where}: {os.strerror(errno_)}{hint}")
        self.step, self.errno, self.detail = step, errno_, detail


class HelperLostError(ChildSetupError):
    """A helper of this run (its monitor, init or spare) died, was stopped or lost a message
    before the command ran. This run alone failed: nothing is learned about the host, and
    the next run starts afresh (DESIGN.md §8)."""


class SetupTimeoutError(ChildSetupError):
    """The sandbox's setup did not reach exec in time; it was killed (nothing ran)."""

    def __init__(self, seconds: float) -> None:
        import errno
        super().__init__("setup", errno.ETIMEDOUT,
                         f"not done after {seconds:g}s (a stopped or starved hcp-exec?); "
                         f"killed")
