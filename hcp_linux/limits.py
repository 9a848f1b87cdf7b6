"""Resource limits of a run: what one command may consume before the kernel stops it.

rlimits are set in the sandbox right before no_new_privs, so they bind the command and all it
starts. The fork-bomb fence is twofold: RLIMIT_NPROC (counted per user namespace, but the
kernel exempts host root, which a sandbox launched as root maps to) and, on Linux >= 6.14,
kernel.pid_max of the sandbox's own pid namespace, which binds root too. The private /tmp and
/dev/shm are size-capped tmpfs mounts (tmpfs is memory; its default, half of RAM, is a memory
balloon). Captured output is capped in the parent. cgroup v2 limits (memory, pids, cpu) apply
only where a delegated cgroup v2 exists; the receipt says whether they did.
"""
from __future__ import annotations

import dataclasses
import os
import re
import resource
from dataclasses import dataclass
from typing import Any, Mapping

from .errors import PolicyError

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)

#: policy key -> resource constant, for the rlimits set in the child.
RLIMITS = {"nofile": resource.RLIMIT_NOFILE, "nproc": resource.RLIMIT_NPROC,
           "fsize": resource.RLIMIT_FSIZE, "as": resource.RLIMIT_AS,
           "cpu": resource.RLIMIT_CPU}
_SIZE_KEYS = {"fsize", "as", "tmp_size", "shm_size", "output", "memory"}
_CGROUP_KEYS = ("memory", "pids", "cpu_quota")


def parse_size(value: Any, what: str) -> int:
    if isinstance(value, bool):
        raise PolicyError(f"limits.{what}: expected a size, got {value!r}")
    if isinstance(value, int):
        n = value
    elif isinstance(value, str) and (m := _SIZE.match(value)):
        n = int(m.group(1)) * _UNITS[m.group(2).lower()]
    else:
        raise PolicyError(f"limits.{what}: expected bytes or a size like '512m', got {value!r}")
    if n <= 0:
        raise PolicyError(f"limits.{what}: must be positive, got {value!r}")
    return n


def _parse_count(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise PolicyError(f"limits.{what}: expected a positive whole number, got {value!r}")
    return value


@dataclass(frozen=True)
class Limits:
    """Per-run limits. ``None`` means: not limited by this mechanism."""

    nofile: int | None = 4096
    nproc: int | None = 4096
    fsize: int | None = None
    as_: int | None = None
    cpu: int | None = None  # CPU seconds
    tmp_size: int = 1 << 30
    shm_size: int = 64 << 20
    output: int | None = 64 << 20  # bytes kept of each captured stream
    memory: int | None = None  # cgroup v2 memory.max
    pids: int | None = None  # cgroup v2 pids.max
    cpu_quota: float | None = None  # cgroup v2 cpu.max, in CPUs (0.5 = half a core)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> "Limits":
        if isinstance(data, Limits):
            return data
        if not isinstance(data, Mapping):
            raise PolicyError("limits: expected a table of limits")
        known = {("as" if f.name == "as_" else f.name) for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {}
        for key, value in data.items():
            if key not in known:
                raise PolicyError(f"limits: unknown limit {key!r} (known: {', '.join(sorted(known))})")
            name = "as_" if key == "as" else key
            if value is None or value == "unlimited":
                if key in ("tmp_size", "shm_size"):
                    raise PolicyError(f"limits.{key}: a tmpfs needs a size")
                values[name] = None
            elif key == "cpu_quota":
                if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                    raise PolicyError(f"limits.cpu_quota: expected CPUs > 0, got {value!r}")
                values[name] = float(value)
            elif key in _SIZE_KEYS:
                values[name] = parse_size(value, key)
            else:
                values[name] = _parse_count(value, key)
        return cls(**values)

    def rlimits(self) -> list[tuple[str, int, int]]:
        """(key, resource, value) for every rlimit to set, clamped to this process's hard
        limit (an unprivileged process cannot raise it). RLIMIT_CORE is always 0."""
        out = [("core", resource.RLIMIT_CORE, 0)]
        for key, res in RLIMITS.items():
            value = getattr(self, "as_" if key == "as" else key)
            if value is None:
                continue
            hard = resource.getrlimit(res)[1]
            if hard != resource.RLIM_INFINITY and value > hard:
                value = hard
            out.append((key, res, value))
        return out

    def cgroup_requested(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in _CGROUP_KEYS if getattr(self, k) is not None}

    def as_dict(self) -> dict[str, Any]:
        return {("as" if f.name == "as_" else f.name): getattr(self, f.name)
                for f in dataclasses.fields(self)}


#: pid_max cannot go below RESERVED_PIDS + 1 (kernel/pid.c).
PID_MAX_MIN = 301


def per_namespace_pid_max() -> bool:
    """Linux 6.14 made kernel.pid_max a property of each pid namespace."""
    try:
        major, minor = (int(x) for x in os.uname().release.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (6, 14)


def pid_fence(nproc: int | None) -> int | None:
    """pid_max for the sandbox's pid namespace: at most ``nproc`` processes, the kernel's
    minimum permitting. Unlike RLIMIT_NPROC it binds a sandbox launched as root too."""
    if nproc is None or not per_namespace_pid_max():
        return None
    return max(nproc + 1, PID_MAX_MIN)


def cgroup_v2_status() -> str:
    """Why cgroup v2 limits can or cannot be applied here (for the receipt)."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError as e:
        return f"unavailable: /proc/self/cgroup: {e.strerror}"
    if not any(line.startswith("0::") for line in lines):
        return "unavailable: no cgroup v2 hierarchy"
    if len(lines) > 1:
        return "unavailable: the controllers are held by cgroup v1 hierarchies on this host"
    path = lines[0][3:]
    base = os.path.join("/sys/fs/cgroup", path.lstrip("/"))
    try:
        with open(os.path.join(base, "cgroup.subtree_control")) as f:
            delegated = f.read().split()
    except OSError as e:
        return f"unavailable: {base}: {e.strerror}"
    if not os.access(base, os.W_OK) or not {"memory", "pids"} <= set(delegated):
        return f"unavailable: {base} is not a delegated cgroup with memory and pids controllers"
    return "available (not yet applied by this version)"
