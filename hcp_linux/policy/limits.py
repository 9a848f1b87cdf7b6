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
import resource
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from . import values
from ..errors import PolicyError

#: policy key -> resource constant, for the rlimits set in the child.
RLIMITS = {"nofile": resource.RLIMIT_NOFILE, "nproc": resource.RLIMIT_NPROC,
           "fsize": resource.RLIMIT_FSIZE, "as": resource.RLIMIT_AS,
           "cpu": resource.RLIMIT_CPU}
_CGROUP_KEYS = ("memory", "pids", "cpu_quota")

#: The kernel's largest pid_max (PID_MAX_LIMIT on 64-bit: 4 * 1024 * 1024). The pid fence
#: sets a sandbox's pid_max to nproc + 1, so nproc stays below it; no more processes than
#: that can exist anyway, and a larger value is spelled 'unlimited'.
PID_MAX_LIMIT = 4 * 1024 * 1024
#: RLIMIT_CPU is in seconds and the kernel multiplies it by 10**9 into a u64 of nanoseconds
#: (kernel/time/posix-cpu-timers.c): beyond this it would wrap to a shorter limit.
CPU_SECONDS_MAX = ((1 << 64) - 1) // 10**9
#: cgroup v2 cpu.max: quota and period in microseconds. The quota is cpu_quota * period;
#: the kernel takes a quota from 1 ms up to 2**44 - 1 us (kernel/sched: min_cfs_quota_period,
#: max_cfs_runtime), so with the default 100 ms period, 0.01 to ~1.76e8 CPUs.
CPU_PERIOD_US = 100_000
CPU_QUOTA_MIN = 1_000 / CPU_PERIOD_US
CPU_QUOTA_MAX = ((1 << 44) - 1) / CPU_PERIOD_US
#: fs.nr_open's default, the bound on RLIMIT_NOFILE where the sysctl cannot be read.
NR_OPEN_DEFAULT = 1 << 20


def nr_open() -> int:
    """The most files a process may be allowed to open (fs.nr_open): the kernel refuses a
    larger RLIMIT_NOFILE (EPERM). Read once per process: should the sysctl be lowered
    later, the child's setrlimit fails and the run is refused (exit 125) all the same."""
    global _nr_open
    if _nr_open is None:
        try:
            with open("/proc/sys/fs/nr_open") as f:
                _nr_open = int(f.read())
        except (OSError, ValueError):
            _nr_open = NR_OPEN_DEFAULT
    return _nr_open


_nr_open: int | None = None


_Parser = Callable[[Any, str, str], Any]  # (value, field, hint) -> normalised value


def _count(lo: int, hi: Callable[[], int]) -> _Parser:
    return lambda value, field, hint: values.bounded_int(value, field, lo, hi(), hint=hint)


def _bytes(value: Any, field: str, hint: str) -> int:
    return values.size(value, field, hint=hint)


def _cpu_seconds(value: Any, field: str, hint: str) -> int:
    return int(values.duration(value, field, CPU_SECONDS_MAX, whole=True, hint=hint))


def _cpus(value: Any, field: str, hint: str) -> float:
    return values.decimal(value, field, CPU_QUOTA_MIN, CPU_QUOTA_MAX, hint=hint)


#: key -> (parser, may be 'unlimited'). Each parser range-checks against what the kernel takes.
_PARSERS: dict[str, tuple[_Parser, bool]] = {
    "nofile": (_count(1, nr_open), True),
    "nproc": (_count(1, lambda: PID_MAX_LIMIT - 1), True),
    "fsize": (_bytes, True),
    "as": (_bytes, True),
    "cpu": (_cpu_seconds, True),
    "tmp_size": (_bytes, False),
    "shm_size": (_bytes, False),
    "output": (_bytes, True),
    "memory": (_bytes, True),
    "pids": (_count(1, lambda: PID_MAX_LIMIT), True),
    "cpu_quota": (_cpus, True),
}


def _key(name: str) -> str:
    return "as" if name == "as_" else name


@dataclass(frozen=True)
class Limits:
    """Per-run limits. ``None`` means: not limited by this mechanism.

    Every field is parsed and range-checked here, whether it comes from ``Limits(...)``,
    :meth:`from_mapping` (a policy file's ``[limits]``, ``--limit KEY=VALUE``) or
    ``Policy(limits={...})``: counts are whole numbers, sizes are bytes or text like
    ``'512m'``, ``cpu`` is whole CPU seconds (or text like ``'2m'``), ``cpu_quota`` is a
    number of CPUs and may be fractional (``0.5`` is half of one CPU's time), and the text
    ``'unlimited'`` lifts a limit (not the tmpfs sizes: a tmpfs always has one). A value
    outside what the kernel takes is refused, never wrapped or clamped into a weaker limit.
    """

    nofile: int | None = 4096  # RLIMIT_NOFILE, 1 .. fs.nr_open
    nproc: int | None = 4096  # RLIMIT_NPROC and the pid fence, 1 .. PID_MAX_LIMIT - 1
    fsize: int | None = None  # RLIMIT_FSIZE, bytes
    as_: int | None = None  # RLIMIT_AS, bytes
    cpu: int | None = None  # RLIMIT_CPU, whole CPU seconds
    tmp_size: int = 1 << 30  # bytes of the private /tmp tmpfs
    shm_size: int = 64 << 20  # bytes of the private /dev/shm tmpfs
    output: int | None = 64 << 20  # bytes kept of each captured stream
    memory: int | None = None  # cgroup v2 memory.max, bytes
    pids: int | None = None  # cgroup v2 pids.max
    cpu_quota: float | None = None  # cgroup v2 cpu.max, in CPUs (0.5 = half a core)

    def __post_init__(self) -> None:
        for f in _FIELDS:
            value = getattr(self, f.name)
            if value is not f.default:  # a default is valid by construction
                object.__setattr__(self, f.name, _parse(_key(f.name), value))

    @classmethod
    def from_mapping(cls, data: "Mapping[str, Any] | Limits") -> "Limits":
        """From a table of ``key: value`` (``as`` for ``as_``); unknown keys are refused."""
        if isinstance(data, Limits):
            return data
        if not isinstance(data, Mapping):
            raise PolicyError(f"limits: expected a table of limits, got {type(data).__name__}")
        values_: dict[str, Any] = {}
        for key, value in data.items():
            if key not in _PARSERS:
                raise PolicyError(f"limits: unknown limit {values.show(key)}"
                                  f"{values.did_you_mean(key, sorted(_PARSERS))} "
                                  f"(known: {', '.join(sorted(_PARSERS))})")
            values_["as_" if key == "as" else key] = value
        return cls(**values_)

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

    def cpu_max(self) -> str | None:
        """cgroup v2 ``cpu.max`` for ``cpu_quota`` ("$QUOTA $PERIOD", microseconds)."""
        if self.cpu_quota is None:
            return None
        return f"{max(1_000, round(self.cpu_quota * CPU_PERIOD_US))} {CPU_PERIOD_US}"

    def as_dict(self) -> dict[str, Any]:
        return {_key(f.name): getattr(self, f.name) for f in dataclasses.fields(self)}


_FIELDS = dataclasses.fields(Limits)


def _parse(key: str, value: Any) -> Any:
    """One limit's value, normalised, or PolicyError naming ``limits.<key>`` and the range."""
    parser, may_lift = _PARSERS[key]
    field = f"limits.{key}"
    if value is None or (isinstance(value, str) and value.strip() == "unlimited"):
        if not may_lift:
            raise PolicyError(f"{field}: a tmpfs needs a size (it cannot be 'unlimited')")
        return None
    return parser(value, field, ", or 'unlimited'" if may_lift else "")


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
