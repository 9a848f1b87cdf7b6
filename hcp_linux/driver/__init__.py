"""The HCP driver (``prepare → rewrite_argv → spawn → writeback → cleanup``, HCP §10.6): the
driver (driver, the ``hcp.drivers`` entry point), what it hands back (results), a process on an
asyncio loop (async_pipes), and the file references in argv, found (fileref) and staged and
written back (staging).

May import: :mod:`hcp_linux.sandbox` and everything below it, :mod:`hcp_linux.jails`; never the
CLI. ``from hcp_linux.driver import LinuxDriver`` loads the driver on first use (PEP 562).
"""
from __future__ import annotations

import importlib

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .driver import LinuxDriver


def __getattr__(name: str) -> Any:
    if name != "LinuxDriver":
        raise AttributeError(f"module 'hcp_linux.driver' has no attribute {name!r}")
    value = importlib.import_module(".driver", __name__).LinuxDriver
    globals()[name] = value
    return value
