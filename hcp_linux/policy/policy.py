"""What a confined command may do: one validated, immutable value.

A ``Policy`` is built from defaults, a TOML file and call-site overrides, and its values are
validated once here, without looking at the host; :mod:`.resolve` checks it against the host.
Nothing below them reads configuration. Every error names the offending field or path.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Iterable, Mapping

from . import ladder, protected, values
from .environment import check_explicit
from ..errors import PolicyError, printable
from .limits import Limits
from .._sha256 import sha256

#: Read-only system roots of the default policy (docs/policy.md). Missing ones are simply absent.
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


#: Whether ``path`` is ``root`` or beneath it (plan.py uses it too).
_is_within = values.is_within


def _items(value: Any, what: str, expected: str = "a list of strings") -> tuple[Any, ...]:
    """The items of a list-like field; a string (a list of its characters to Python) or a
    mapping is refused."""
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        raise PolicyError(f"{what}: expected {expected}, got {_kind(value)}")
    try:
        return tuple(value)
    except Exception:  # a generator raising half-way: one line, not its traceback
        raise PolicyError(f"{what}: expected {expected}, could not read the items") from None


def _str_tuple(value: Any, what: str) -> tuple[str, ...]:
    out = []
    for item in _items(value, what):
        text = item
        if isinstance(item, os.PathLike):
            try:
                text = os.fspath(item)
            except Exception:
                text = None
        if not isinstance(text, str):
            raise PolicyError(f"{what}: expected strings, got {_kind(item)} {values.show(item)}")
        out.append(text)
    return tuple(out)


def _path_tuple(value: Any, what: str) -> tuple[str, ...]:
    """A list of absolute paths (``str``, ``bytes`` or ``os.PathLike`` each), normalised."""
    return tuple(values.text_path(p, what) for p in _items(value, what, "a list of paths"))


def _kind(value: Any) -> str:
    return {str: "a string", bytes: "bytes", bool: "a boolean", int: "an integer",
            float: "a number", list: "a list", tuple: "a tuple", dict: "a table"
            }.get(type(value), type(value).__name__)


def _choice(value: Any, what: str, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise PolicyError(f"{what}: expected one of {', '.join(choices)}, got {values.show(value)}"
                          f"{values.did_you_mean(value, choices)}")
    return value


def expand_layers(names: Iterable[str]) -> frozenset[str]:
    out: set[str] = set()
    for name in names:
        if name in LAYER_ALIASES:
            out.update(LAYER_ALIASES[name])
        elif name in LAYERS:
            out.add(name)
        else:
            known = ", ".join(LAYERS + tuple(LAYER_ALIASES))
            raise PolicyError(f"allow_degraded: unknown layer {name!r}"
                              f"{values.did_you_mean(name, LAYERS + tuple(LAYER_ALIASES))} "
                              f"(known: {known})")
    return frozenset(out)


#: The longest single "KEY=VALUE" string execve takes (MAX_ARG_STRLEN, 32 pages, with the
#: NUL): a longer one fails the exec with E2BIG after everything was set up.
MAX_ARG_STRLEN = 32 * os.sysconf("SC_PAGE_SIZE")


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def check_env_text(key: str, value: str) -> None:
    """One variable for the child: text keys and values, a name execve can carry (no '=',
    no NUL), valid UTF-8, and short enough for the kernel."""
    if not isinstance(key, str) or not isinstance(value, str):
        raise PolicyError(f"env: {values.show(key)}: keys and values must be strings")
    if not _ENV_NAME.match(key):  # what a shell can name; the CLI and packs say the same
        raise PolicyError(f"env: invalid variable name {values.show(key)} (letters, digits "
                          f"and _, not starting with a digit)")
    if "\0" in value:
        raise PolicyError(f"env: {values.show(key)}: value contains a NUL byte")
    try:
        length = len(key.encode("utf-8")) + len(value.encode("utf-8")) + 2
    except UnicodeEncodeError:
        raise PolicyError(f"env: {values.show(key)}: not valid UTF-8") from None
    if length > MAX_ARG_STRLEN:
        raise PolicyError(f"env: {values.show(key)}: {length} bytes with its name, more than "
                          f"the kernel takes for one variable ({MAX_ARG_STRLEN})")


def field_table(data: Any, source: str) -> dict[str, Any]:
    """A parsed config table as Policy's keyword arguments (TOML keys are the field names;
    ``nativeLocal`` is ``native_local``); PolicyError naming ``source`` for a value that is
    no table or a key no field has (with the nearest one). The values are not checked here:
    Policy checks them."""
    if not isinstance(data, Mapping):
        raise PolicyError(f"{source}: expected a table, got {_kind(data)}")
    known = {f.name for f in dataclasses.fields(Policy)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        name = "native_local" if key == "nativeLocal" else key
        if name not in known:
            meant = values.near_miss(str(key), sorted(known))
            raise PolicyError(f"{source}: unknown key {values.show(key)}"
                              + (f" (did you mean {meant!r}?)" if meant else
                                 " (the keys: docs/policy.md)"))
        kwargs[name] = value
    return kwargs


#: The seccomp profiles a policy names unless it says otherwise.
DEFAULT_SECCOMP_PROFILES = ("baseline", "socket-families")


class CarveOuts(tuple):  # type: ignore[type-arg]
    """A carve-out list as a Policy holds it: the canonical paths (the tuple's items), with
    the entries as written (``given``: patterns kept, so that ``dataclasses.replace`` with
    another jail expands them again) and what each pattern matched (``patterns``: (pattern,
    canonical paths)), for the receipt."""

    given: tuple[str, ...] = ()
    patterns: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @classmethod
    def written(cls, given: tuple[str, ...]) -> "CarveOuts":
        """A list as written, not yet resolved: its items are the entries themselves."""
        value = cls(given)
        value.given = given
        return value

    @classmethod
    def resolved(cls, paths: list[str], given: tuple[str, ...],
                 patterns: tuple[tuple[str, tuple[str, ...]], ...]) -> "CarveOuts":
        value = cls(paths)
        value.given, value.patterns = given, patterns
        return value


@dataclass(frozen=True)
class Policy:
    """The confinement of one command, as its caller wrote it: a pure value.

    Constructing one checks every value and touches nothing on the host; two equal inputs
    give equal policies anywhere. :func:`hcp_linux.policy.resolve.resolve` (which
    ``Sandbox(policy)`` calls) then checks it against this host and makes its paths
    canonical: only a resolved policy is compiled into a plan.

    ``jail`` is the working directory and first writable root (default: the current
    directory); with ``read_only_jail`` it is the working directory only, shown and granted
    read-only like a ``read_only_roots`` entry (the command reads its project and writes
    its private /tmp and the ``write_roots``). ``read_only_paths`` and ``hidden_paths`` are
    carve-outs: existing paths inside a granted root (hidden ones inside a system root too),
    or glob patterns (relative ones from the jail) expanded when resolved, shown read-only or
    masked by the mount view (docs/policy.md, "Carve-outs"). Other paths must be absolute;
    all are canonicalised once, when resolved, so the plan opens exactly what was validated.
    """

    jail: str | None = None
    read_only_jail: bool = False
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
    read_only_paths: tuple[str, ...] = ()
    hidden_paths: tuple[str, ...] = ()
    allow_unix_sockets: tuple[str, ...] = ()
    allow_dangerous_sockets: tuple[str, ...] = ()
    pty: bool = False
    rung: str = ladder.DEFAULT
    allow_write_protected: tuple[str, ...] = ()
    protect_missing: str = protected.DEFAULT_PROTECT_MISSING
    protect_depth: int = protected.DEFAULT_DEPTH

    def __post_init__(self) -> None:
        """Check every field's value, in one pass, touching nothing outside this process (no
        file, no mount table, no current directory): a Policy is a pure value, equal for
        equal input on any host. Normalise each (absolute normalised paths, tuples, a
        read-only env, parsed limits). What the host says about the paths (they exist, are
        canonical, are pinned, lie on no kernel file system...) is :func:`resolve`'s."""
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731
        if not isinstance(self.sandbox, bool) or not isinstance(self.native_local, bool):
            raise PolicyError("sandbox/native_local: expected true or false, got "
                              f"{values.show(self.sandbox)}/{values.show(self.native_local)}")
        if self.sandbox == self.native_local:
            # HCP §10.1/10.5: native-local only by an explicit, positive action on both switches.
            raise PolicyError("native-local needs both sandbox=false and native_local=true "
                              "(--no-sandbox --native-local); give both or neither")
        if not isinstance(self.pty, bool):
            raise PolicyError(f"pty: expected true or false, got {values.show(self.pty)}")
        if not isinstance(self.read_only_jail, bool):
            raise PolicyError(f"read_only_jail: expected true or false, got "
                              f"{values.show(self.read_only_jail)}")
        if self.jail is not None:
            set_("jail", values.text_path(self.jail, "jail"))
        for name in ("write_roots", "read_only_roots", "system_roots",
                     "allow_unix_sockets", "allow_dangerous_sockets"):
            set_(name, _path_tuple(getattr(self, name), name))
        for name in ("read_only_paths", "hidden_paths"):
            raw = getattr(self, name)
            entries = raw.given if isinstance(raw, CarveOuts) else raw
            given = tuple(values.file_name(item, name)  # relative kept: the jail's
                          for item in _items(entries, name, "a list of paths or patterns"))
            set_(name, CarveOuts.written(given))
        set_("network", _choice(self.network, "network", NETWORK_MODES))
        self._check_egress(set_)
        bins = _str_tuple(self.allow_bins, "allow_bins")
        for b in bins:
            if not b or "\0" in b:
                raise PolicyError(f"allow_bins: invalid entry {values.show(b)}")
        set_("allow_bins", bins)
        if not isinstance(self.env, Mapping):
            raise PolicyError(f"env: expected a table of KEY = VALUE, got {_kind(self.env)}")
        for k, v in self.env.items():
            # code-injection names refused here, not at the spawn (before a driver makes a
            # jail, or a plan a tmp dir), with their own message
            if isinstance(k, str):
                check_explicit({k: v})
            check_env_text(k, v)
        set_("env", MappingProxyType(dict(self.env)))
        # a rung is a name for a set of layers that may degrade (hcp_linux.policy.ladder): the same
        # machinery as layers named one by one, so there is one way to degrade
        set_("rung", _choice(self.rung, "rung", ladder.NAMES))
        set_("allow_degraded", expand_layers(_str_tuple(self.allow_degraded, "allow_degraded"))
             | ladder.BY_NAME[self.rung].loses)
        set_("seccomp_profiles", _str_tuple(self.seccomp_profiles, "seccomp_profiles"))
        if self.timeout is not None:
            set_("timeout", values.duration(self.timeout, "timeout", MAX_TIMEOUT))
        set_("limits", Limits.from_mapping(self.limits))
        set_("on_exit", _choice(self.on_exit, "on_exit", ON_EXIT))
        # names of hcp_linux.policy.protected (in every writable root) or absolute paths
        set_("allow_write_protected", protected.check_allowed(
            _str_tuple(self.allow_write_protected, "allow_write_protected"), PolicyError))
        set_("protect_missing", _choice(self.protect_missing, "protect_missing",
                                        protected.PROTECT_MISSING))
        if (not isinstance(self.protect_depth, int) or isinstance(self.protect_depth, bool)
                or not 0 <= self.protect_depth <= protected.MAX_DEPTH):
            raise PolicyError(f"protect_depth: expected an integer from 0 to "
                              f"{protected.MAX_DEPTH}, got {values.show(self.protect_depth)}")

    @property
    def resolved(self) -> bool:
        """Whether :func:`resolve` made this one (its paths canonical and checked on this
        host): what a plan is compiled from."""
        return bool(self.__dict__.get("_resolved"))

    @property
    def unix_socket_binds(self) -> tuple[tuple[str, str], ...]:
        """(path in the view, canonical socket) for each granted socket: the canonical path,
        and the path as written when it went through a symlink (/var/run -> /run). Empty
        until resolved."""
        return self.__dict__.get("_socket_binds", ())

    @property
    def source(self) -> str | None:
        """Where the policy was read from (a policy file, a pack), for :func:`resolve`'s
        messages; None for one made in code."""
        return self.__dict__.get("_source")

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
        from ..egress import EgressPolicy  # validates every pattern, naming the culprit
        EgressPolicy.parse(allow, deny)
        if self.proxy_log is not None:
            set_("proxy_log", values.text_path(self.proxy_log, "proxy_log"))

    def egress(self):  # type: ignore[no-untyped-def]
        """The parsed allow/deny lists (network = "allow" only)."""
        from ..egress import EgressPolicy
        return EgressPolicy.parse(self.allow_hosts, self.deny_hosts)

    @property
    def writable_roots(self) -> tuple[str, ...]:
        """The jail (unless ``read_only_jail``), then the ``write_roots``."""
        assert self.jail is not None
        if self.read_only_jail:
            return self.write_roots
        return (self.jail,) + tuple(p for p in self.write_roots if p != self.jail)

    @property
    def readable_roots(self) -> tuple[str, ...]:
        """The roots granted read and execute only, beside the system roots: the jail when
        ``read_only_jail`` (first, once), then the ``read_only_roots``."""
        assert self.jail is not None
        if not self.read_only_jail:
            return self.read_only_roots
        return (self.jail,) + tuple(p for p in self.read_only_roots if p != self.jail)

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
        digest = "sha256:" + sha256(blob).hexdigest()
        object.__setattr__(self, "_digest", digest)
        return digest

    # --- construction from files -------------------------------------------------------

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, source: str = "policy",
                     fallback: Mapping[str, Any] | None = None, **overrides: Any) -> "Policy":
        """Build from a parsed config table (TOML keys = field names; ``nativeLocal`` too).
        ``fallback``: values for the fields the table does not set (each value the table
        does set is still checked); ``overrides`` replace the table's."""
        kwargs = field_table(data, source)
        for k, v in (fallback or {}).items():
            kwargs.setdefault(k, v)
        kwargs.update({k: v for k, v in overrides.items() if v is not None})
        try:
            policy = cls(**kwargs)
        except PolicyError as e:
            raise PolicyError(f"{source}: {e}") from None
        policy.__dict__["_source"] = source  # resolve()'s messages name it too
        return policy

    @classmethod
    def from_toml(cls, path: str | os.PathLike[str], *,
                  fallback: Mapping[str, Any] | None = None, **overrides: Any) -> "Policy":
        """Read a TOML policy file (at most values.MAX_DOCUMENT bytes, values.MAX_DEPTH
        levels deep); every failure is one line naming the file. ``fallback`` and
        ``overrides`` as for :meth:`from_mapping`."""
        text = values.file_name(path, "policy file")
        source = f"policy file {printable(text)}"
        data = values.parse_document(values.read_document(text, source), source, "toml")
        return cls.from_mapping(data, source=source, fallback=fallback, **overrides)
