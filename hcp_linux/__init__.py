"""hcp-linux: run a command the way HCP §10 Sandbox asks, confined by the Linux kernel.

    from hcp_linux import Policy, Sandbox
    run = Sandbox(Policy(jail="/path/to/jail")).run(["git", "status"], capture_output=True)

The names below are imported on first use (PEP 562), so that ``hcp-linux run`` and a runtime
that needs only the engine do not pay for the probe or the driver at start-up.
"""
from __future__ import annotations

import importlib

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing (~2 ms) at start-up
if TYPE_CHECKING:
    from typing import Any

    from .errors import (BinNotExecutableError, BinNotFoundError, ChildSetupError,
                         HostPathError, LayerUnavailableError, NotAllowlistedError,
                         PolicyError, SandboxError)
    from ._version import __version__
    from .policy.policy import Policy
    from .probe import ProbeReport, probe
    from .sandbox import (DEVNULL, PIPE, CompletedRun, Sandbox, SandboxProcess, confine,
                          release_resources)

_WHERE = {
    "Policy": "policy.policy", "Sandbox": "sandbox", "CompletedRun": "sandbox",
    "SandboxProcess": "sandbox", "confine": "sandbox", "PIPE": "sandbox", "DEVNULL": "sandbox",
    "probe": "probe", "ProbeReport": "probe", "release_resources": "sandbox",
    "SandboxError": "errors", "PolicyError": "errors", "NotAllowlistedError": "errors",
    "BinNotFoundError": "errors", "BinNotExecutableError": "errors", "HostPathError": "errors",
    "LayerUnavailableError": "errors", "ChildSetupError": "errors",
    "__version__": "_version",
}
__all__ = [name for name in _WHERE if not name.startswith("_")]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'hcp_linux' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])
