"""What a confined command may do: one validated, immutable value.

A ``Policy`` is built from defaults, a TOML file and call-site overrides, and validated once
here; nothing below it reads configuration. Every error names the offending field or path.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import sys
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Iterable, Mapping

from .errors import PolicyError
from .limits import Limits, cgroup_v2_status

#: Read-only system roots of the default policy (DESIGN §4). Missing ones are simply absent.
DEFAULT_SYSTEM_ROOTS: tuple[str, ...] = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/etc", "/opt")

#: Layers a policy can require; each one can be given up with ``allow_degraded``.
NAMESPACE_LAYERS = ("userns", "mountns", "netns", "ipcns", "pidns")
LAYERS = NAMESPACE_LAYERS + ("landlock", "seccomp")
LAYER_ALIASES = {"namespaces": NAMESPACE_LAYERS}

NETWORK_MODES = ("none", "host", "allow")
#: What happens to the rest of the process tree when the command exits.
ON_EXIT = ("kill", "wait")
#: The longest wait the kernel's poll/epoll timeouts can express (2**31 - 1 ms), in seconds.
MAX_TIMEOUT = 2_147_483
SANDBOX, NATIVE_LOCAL = "sandbox", "native-local"


def _abs_path(value: Any, what: str) -> str:
    if not isinstance(value, (str, os.PathLike)):
        raise PolicyError(f"{what}: expected a path, got {type(value).__name__}")
    path = os.fspath(value)
    if not isinstance(path, str):
        raise PolicyError(f"{what}: expected a text path")
    if "\0" in path:
        raise PolicyError(f"{what}: path contains a NUL byte")
    if not os.path.isabs(path):
        raise PolicyError(f"{what}: {path!r} is not an absolute path")
    return os.path.normpath(path)


def _existing_dir(path: str, what: str) -> str:
    """The canonical form of an existing directory (symlinks resolved once, here)."""
    real = os.path.realpath(path)
    if not os.path.isdir(real):
        raise PolicyError(f"{what}: {path} is not an existing directory")
    return real


def _is_within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _str_tuple(value: Any, what: str) -> tuple[str, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise PolicyError(f"{what}: expected a list of strings")
    items = tuple(value)
    for item in items:
        if not isinstance(item, (str, os.PathLike)):
            raise PolicyError(f"{what}: expected strings, got {type(item).__name__}")
    return tuple(os.fspath(i) for i in items)


def expand_layers(names: Iterable[str]) -> frozenset[str]:
    out: set[str] = set()
    for name in names:
        if name in LAYER_ALIASES:
            out.update(LAYER_ALIASES[name])
        elif name in LAYERS:
            out.add(name)
        else:
            known = ", ".join(LAYERS + tuple(LAYER_ALIASES))
            raise PolicyError(f"allow_degraded: unknown layer {name!r} (known: {known})")
    return frozenset(out)


def check_env_text(key: str, value: str) -> None:
    if not isinstance(key, str) or not isinstance(value, str):
        raise PolicyError(f"env: {key!r}: keys and values must be strings")
    if not key or "=" in key or "\0" in key:
        raise PolicyError(f"env: invalid variable name {key!r}")
    if "\0" in value:
        raise PolicyError(f"env: {key}: value contains a NUL byte")
    for text in (key, value):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise PolicyError(f"env: {key!r}: not valid UTF-8") from None


#: The seccomp profiles a policy names unless it says otherwise.
DEFAULT_SECCOMP_PROFILES = ("baseline", "socket-families")


@dataclass(frozen=True)
class Policy:
    """The confinement of one command. Construct it; it validates itself.

    ``jail`` is the working directory and first writable root (default: the current
    directory). Paths must be absolute; they are canonicalised once, here, so the plan
    opens exactly what was validated.
    """

    jail: str | None = None
    write_roots: tuple[str, ...] = ()
    read_only_roots: tuple[str, ...] = ()
    system_roots: tuple[str, ...] = DEFAULT_SYSTEM_ROOTS
    network: str = "none"
    allow_bins: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    allow_degraded: frozenset[str] = frozenset()
    sandbox: bool = True
    native_local: bool = False
    seccomp_profiles: tuple[str, ...] = DEFAULT_SECCOMP_PROFILES
    timeout: float | None = None
    allow_hosts: tuple[str, ...] = ()
    deny_hosts: tuple[str, ...] = ()
    proxy_log: str | None = None
    limits: Limits = field(default_factory=Limits)
    on_exit: str = "kill"

    def __post_init__(self) -> None:
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731
        if not isinstance(self.sandbox, bool) or not isinstance(self.native_local, bool):
            raise PolicyError("sandbox/native_local: expected true or false")
        if self.sandbox == self.native_local:
            # HCP §10.1/10.5: native-local only by an explicit, positive action on both switches.
            raise PolicyError("native-local needs both sandbox=false and native_local=true "
                              "(--no-sandbox --native-local); give both or neither")
        jail = os.getcwd() if self.jail is None else _abs_path(self.jail, "jail")
        set_("jail", _existing_dir(jail, "jail"))
        set_("write_roots", tuple(_existing_dir(_abs_path(p, "write_roots"), "write_roots")
                                  for p in _str_tuple(self.write_roots, "write_roots")))
        set_("read_only_roots", tuple(
            _existing_dir(_abs_path(p, "read_only_roots"), "read_only_roots")
            for p in _str_tuple(self.read_only_roots, "read_only_roots")))
        set_("system_roots", tuple(_abs_path(p, "system_roots")
                                   for p in _str_tuple(self.system_roots, "system_roots")))
        if self.network not in NETWORK_MODES:
            raise PolicyError(f"network: unknown mode {self.network!r} "
                              f"(expected one of: {', '.join(NETWORK_MODES)})")
        self._check_egress(set_)
        bins = _str_tuple(self.allow_bins, "allow_bins")
        for b in bins:
            if not b or "\0" in b:
                raise PolicyError(f"allow_bins: invalid entry {b!r}")
        set_("allow_bins", bins)
        if not isinstance(self.env, Mapping):
            raise PolicyError("env: expected a table of KEY = VALUE")
        for k, v in self.env.items():
            check_env_text(k, v)
        set_("env", MappingProxyType(dict(self.env)))
        set_("allow_degraded", expand_layers(_str_tuple(self.allow_degraded, "allow_degraded")))
        set_("seccomp_profiles", _str_tuple(self.seccomp_profiles, "seccomp_profiles"))
        if self.timeout is not None:
            t = self.timeout
            if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) \
                    or not 0 < t <= MAX_TIMEOUT:
                raise PolicyError(f"timeout: expected seconds in (0, {MAX_TIMEOUT}], got {t!r}")
        set_("limits", Limits.from_mapping(self.limits))
        if self.limits.cgroup_requested():
            status = cgroup_v2_status()
            if not status.startswith("available") or "not yet applied" in status:
                keys = ", ".join(sorted(self.limits.cgroup_requested()))
                raise PolicyError(f"limits {keys}: cgroup v2 limits cannot be applied here "
                                  f"({status.split(': ', 1)[-1]})")
        if self.on_exit not in ON_EXIT:
            raise PolicyError(f"on_exit: expected one of {', '.join(ON_EXIT)}, got {self.on_exit!r}")
        self._check_overlaps()

    def _check_egress(self, set_) -> None:  # type: ignore[no-untyped-def]
        allow = _str_tuple(self.allow_hosts, "allow_hosts")
        deny = _str_tuple(self.deny_hosts, "deny_hosts")
        set_("allow_hosts", allow)
        set_("deny_hosts", deny)
        if self.network != "allow":
            if allow or deny or self.proxy_log:
                raise PolicyError("allow_hosts/deny_hosts/proxy_log need network = \"allow\" "
                                  "(--network allow)")
            return
        if not allow:
            raise PolicyError("network = \"allow\" needs at least one allow_hosts entry "
                              "(--allow-host HOST[:PORT])")
        from .egress import EgressPolicy  # validates every pattern, naming the culprit
        EgressPolicy.parse(allow, deny)
        if self.proxy_log is not None:
            set_("proxy_log", _abs_path(self.proxy_log, "proxy_log"))

    def egress(self):  # type: ignore[no-untyped-def]
        """The parsed allow/deny lists (network = "allow" only)."""
        from .egress import EgressPolicy
        return EgressPolicy.parse(self.allow_hosts, self.deny_hosts)

    def _check_overlaps(self) -> None:
        # Landlock rules only add rights: a read-only root inside a writable one would be
        # writable after all. Refuse the combination instead of silently granting it.
        writable = self.writable_roots
        for ro in self.read_only_roots + tuple(os.path.realpath(p) for p in self.system_roots):
            for rw in writable:
                if _is_within(ro, rw):
                    raise PolicyError(f"overlapping roots: read-only root {ro} is inside "
                                      f"writable root {rw}")

    @property
    def writable_roots(self) -> tuple[str, ...]:
        assert self.jail is not None
        return (self.jail,) + tuple(p for p in self.write_roots if p != self.jail)

    @property
    def mode(self) -> str:
        return SANDBOX if self.sandbox else NATIVE_LOCAL

    def replace(self, **changes: Any) -> "Policy":
        return dataclasses.replace(self, **changes)

    def digest(self) -> str:
        """A stable hash of the policy, for receipts. A Policy is immutable (frozen, its env
        a read-only mapping, its limits frozen): computed once per instance."""
        cached = self.__dict__.get("_digest")
        if cached is not None:
            return cached
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["env"] = dict(sorted(self.env.items()))
        data["allow_degraded"] = sorted(self.allow_degraded)
        data["limits"] = self.limits.as_dict()
        blob = json.dumps(data, sort_keys=True, default=list).encode()
        digest = "sha256:" + hashlib.sha256(blob).hexdigest()
        object.__setattr__(self, "_digest", digest)
        return digest

    # --- construction from files -------------------------------------------------------

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, source: str = "policy",
                     **overrides: Any) -> "Policy":
        """Build from a parsed config table (TOML keys = field names; ``nativeLocal`` too)."""
        known = {f.name for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            name = "native_local" if key == "nativeLocal" else key
            if name not in known:
                raise PolicyError(f"{source}: unknown key {key!r}")
            kwargs[name] = value
        kwargs.update({k: v for k, v in overrides.items() if v is not None})
        try:
            return cls(**kwargs)
        except PolicyError as e:
            raise PolicyError(f"{source}: {e}") from None

    @classmethod
    def from_toml(cls, path: str | os.PathLike[str], **overrides: Any) -> "Policy":
        if sys.version_info >= (3, 11):  # imported here: `hcp-linux run` without a file
            import tomllib               # does not pay ~3 ms for it
        else:  # pragma: no cover - exercised on 3.10 only
            import tomli as tomllib
        path = os.fspath(path)
        try:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except OSError as e:
            raise PolicyError(f"policy file {path}: {e.strerror}") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise PolicyError(f"policy file {path}: malformed TOML: {e}") from None
        return cls.from_mapping(data, source=f"policy file {path}", **overrides)
