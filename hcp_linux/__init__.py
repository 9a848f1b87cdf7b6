"""hcp-linux: run a command the way HCP §10 Sandbox asks, confined by the Linux kernel.

    from hcp_linux import Policy, Sandbox
    run = Sandbox(Policy(jail="/path/to/jail")).run(["git", "status"], capture_output=True)
"""
from .errors import (BinNotExecutableError, BinNotFoundError, ChildSetupError, HostPathError,
                     LayerUnavailableError, NotAllowlistedError, PolicyError, SandboxError)
from .policy import Policy
from .probe import ProbeReport, probe
from .sandbox import DEVNULL, PIPE, CompletedRun, Sandbox, SandboxProcess, confine

__all__ = [
    "Policy", "Sandbox", "CompletedRun", "SandboxProcess", "confine", "probe", "ProbeReport", "PIPE", "DEVNULL",
    "SandboxError", "PolicyError", "NotAllowlistedError", "BinNotFoundError",
    "BinNotExecutableError", "HostPathError", "LayerUnavailableError", "ChildSetupError",
]
__version__ = "0.1.0"
