"""hcp-linux: run a command the way HCP §10 Sandbox asks, confined by the Linux kernel.

    from hcp_linux import Policy, Sandbox
    run = Sandbox(Policy(jail="/path/to/jail")).run(["git", "status"], capture_output=True)
"""
from .errors import (BinNotExecutableError, BinNotFoundError, ChildSetupError, HostPathError,
                     LayerUnavailableError, NotAllowlistedError, PolicyError, SandboxError)
from .policy import Policy
from .sandbox import DEVNULL, PIPE, CompletedRun, Sandbox, SandboxProcess, confine


def probe():  # noqa: D103 - documented in probe.probe
    from .probe import probe as _probe
    return _probe()


probe.__doc__ = "What this host can enforce, probed functionally once per process (cached)."

__all__ = [
    "Policy", "Sandbox", "CompletedRun", "SandboxProcess", "confine", "probe", "PIPE", "DEVNULL",
    "SandboxError", "PolicyError", "NotAllowlistedError", "BinNotFoundError",
    "BinNotExecutableError", "HostPathError", "LayerUnavailableError", "ChildSetupError",
]
__version__ = "0.1.0"
