"""HCP pack manifests: ``wrap.bin``, ``wrap.agent_env`` and ``wrap.workspace`` (HCP §10.2, §10.6).

A manifest is read once, validated here, and becomes an immutable :class:`Pack`. Everything
below this module trusts a ``Pack``; nothing else reads the manifest. Every error names the
manifest, the field and what was expected, so a pack author can fix it without reading code.

What is validated strictly and why:

- ``wrap`` and ``wrap.workspace`` accept only the keys HCP defines. An unknown key is a typo
  (``agentEnv``) or an attempt to steer the runtime (``driver``: HCP §10.6 says packs MUST NOT
  name a driver); silently ignoring either would run the pack under rules its author did not
  write.
- Top-level keys other than ``name`` and ``wrap`` belong to other parts of HCP (tools, binding,
  privacy, ...) and are left alone, so that real packs load unchanged.
- ``wrap.agent_env`` may not set variables that make the allow-listed bin run other code
  (``LD_PRELOAD``, ``BASH_ENV``, ...): they would turn the allow-list into "run anything".
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

from . import values
from .environment import is_injection_key
from ..errors import PolicyError, printable
from .policy import check_env_text

__all__ = ["Pack", "WorkspaceSpec", "PackError", "load_pack", "MODES", "NONE", "EPHEMERAL",
           "WORKSPACE", "DEFAULT_FILE_FLAGS", "OUTPUT_FLAGS"]

NONE, EPHEMERAL, WORKSPACE = "none", "ephemeral", "workspace"
#: The values of ``wrap.workspace.mode`` (HCP §10.6 table).
MODES: tuple[str, ...] = (NONE, EPHEMERAL, WORKSPACE)
#: ``file_flags`` default (HCP §10.6 table): flags whose next argv token is a file.
DEFAULT_FILE_FLAGS: tuple[str, ...] = ("--file", "--json-file", "--output", "-o", "--env-file")
#: The file flags whose file is an output, written back after the run (HCP §10.6).
OUTPUT_FLAGS: frozenset[str] = frozenset({"--output", "-o"})

_WRAP_KEYS = ("bin", "agent_env", "workspace")
_WORKSPACE_KEYS = ("mode", "home_env", "file_flags")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_FLAG = re.compile(r"-{1,2}[A-Za-z0-9][A-Za-z0-9_.-]*\Z")


class PackError(PolicyError):
    """A pack manifest is missing or invalid; nothing was prepared or spawned (exit 125)."""


@dataclass(frozen=True)
class WorkspaceSpec:
    """``wrap.workspace`` with HCP's defaults filled in."""

    mode: str = NONE
    home_env: tuple[str, ...] = ()
    file_flags: tuple[str, ...] = DEFAULT_FILE_FLAGS
    ignored_keys: tuple[str, ...] = ()  # keys of another runtime's, named in the receipt


@dataclass(frozen=True)
class Pack:
    """A validated pack: where it lives, which bins it wraps, what reaches the child.

    ``root`` is the directory holding the manifest (HCP: the pack root), canonical.
    ``bins`` keeps bare names as given; an entry with a slash is made absolute against the
    root (a pack-shipped executable), so the allow-list compares exact paths.
    ``key`` names the pack's persistent workspaces: the manifest's ``name`` when it has one
    (so a workspace survives the pack moving or being upgraded), else the root's directory name.
    """

    root: str
    bins: tuple[str, ...]
    agent_env: Mapping[str, str] = field(default_factory=dict)
    workspace: WorkspaceSpec = field(default_factory=WorkspaceSpec)
    name: str | None = None
    manifest: str | None = None
    #: ``wrap`` / ``wrap.workspace`` keys this driver does not know and ignored (receipt)
    ignored_keys: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        where = f"pack {printable(self.manifest)}" if isinstance(self.manifest, str) else "pack"
        if not isinstance(self.root, str) or not os.path.isabs(self.root):
            raise PackError(f"{where}: pack root {values.show(self.root)} is not an absolute path")
        if not os.path.isdir(self.root):
            raise PackError(f"{where}: pack root {printable(self.root)} does not exist")
        object.__setattr__(self, "root", os.path.realpath(self.root))
        if isinstance(self.bins, str) or not self.bins or \
                not all(isinstance(b, str) and b for b in self.bins):
            raise PackError(f"{where}: wrap.bin: expected at least one bin name")
        object.__setattr__(self, "bins", tuple(self.bins))
        object.__setattr__(self, "agent_env", MappingProxyType(dict(self.agent_env)))

    @property
    def key(self) -> str:
        return self.name if self.name else os.path.basename(self.root.rstrip("/")) or "root"

    @classmethod
    def from_mapping(cls, data: Any, *, root: str | os.PathLike[str],
                     manifest: str | None = None) -> "Pack":
        """Validate a parsed manifest (the top-level table) whose pack root is ``root``."""
        source = f"pack {printable(manifest)}" if manifest else "pack"
        try:
            root = values.file_name(root, "pack root")
        except PolicyError as e:
            raise PackError(f"{source}: {e}") from None
        if not os.path.isabs(root):
            raise PackError(f"{source}: pack root {values.show(root)} is not an absolute path")
        if not os.path.isdir(root):
            raise PackError(f"{source}: pack root {printable(root)} does not exist")
        root = os.path.realpath(root)
        try:  # it becomes a read-only root of every run: refused now, before any workspace
            values.check_grantable(root, "pack root")
        except PolicyError as e:
            raise PackError(f"{source}: {e}") from None
        if not isinstance(data, Mapping):
            raise PackError(f"{source}: expected a table at the top level, "
                            f"got {_type(data)}")
        name = _name(data.get("name"), source)
        wrap = data.get("wrap")
        if wrap is None:
            raise PackError(f"{source}: wrap: missing (expected a table with wrap.bin)")
        if not isinstance(wrap, Mapping):
            raise PackError(f"{source}: wrap: expected a table, got {_type(wrap)}")
        ignored = _unknown_keys(wrap, _WRAP_KEYS, "wrap", source)
        if "bin" not in wrap:
            raise PackError(f"{source}: wrap.bin: missing (expected a bin name or a list of them)")
        bins = _bins(wrap["bin"], root, source)
        agent_env = _agent_env(wrap.get("agent_env", {}), source)
        workspace = _workspace(wrap.get("workspace"), source)
        for key in workspace.home_env:
            if key in agent_env:
                raise PackError(f"{source}: wrap.agent_env: {key} is also in "
                                f"wrap.workspace.home_env (the runtime points it at the jail)")
        return cls(root=root, bins=bins, agent_env=agent_env, workspace=workspace,
                   name=name, manifest=manifest,
                   ignored_keys=ignored + workspace.ignored_keys)


def load_pack(path: str | os.PathLike[str]) -> Pack:
    """Read and validate a manifest (``.json`` or ``.toml``); its directory is the pack root.
    At most values.MAX_DOCUMENT bytes and values.MAX_DEPTH levels deep; every failure is one
    line naming the manifest."""
    try:
        path = os.path.abspath(values.file_name(path, "pack"))
    except PolicyError as e:
        raise PackError(str(e)) from None
    source = f"pack {printable(path)}"
    root = os.path.dirname(path)
    if not os.path.isdir(root):
        raise PackError(f"{source}: pack root {printable(root)} does not exist")
    ext = os.path.splitext(path)[1].lower()
    if ext not in (".json", ".toml"):
        raise PackError(f"{source}: expected a .json or .toml manifest")
    raw = values.read_document(path, source, PackError)
    data = values.parse_document(raw, source, ext[1:], PackError)
    return Pack.from_mapping(data, root=root, manifest=path)


# --- field validators --------------------------------------------------------------------

def _type(value: Any) -> str:
    return {str: "a string", bool: "a boolean", int: "an integer", float: "a number",
            list: "a list", dict: "a table"}.get(type(value), type(value).__name__)


def _show(value: Any) -> str:
    if isinstance(value, (str, int, float)):
        return f"{_type(value)} {values.show(value)}"
    return _type(value)


def _unknown_keys(table: Mapping[str, Any], known: tuple[str, ...], where: str,
                  source: str) -> tuple[str, ...]:
    """The keys of ``table`` this driver does not know, to be ignored and named in the
    receipt (HCP §10.4.2, §10.6: a pack another conforming runtime accepts must run
    unchanged here). Refused instead, because ignoring them would change what the pack
    means or break §10.6: a key that names a driver, a key whose value names a host path,
    and a misspelling of a known key (``agentEnv``, ``file_flag``: ignored, the pack would
    silently run without what its author asked for)."""
    ignored = []
    for key in table:
        if key in known:
            continue
        shown = values.show(key)
        if "driver" in str(key).lower():
            raise PackError(f"{source}: {where}: key {shown}: packs must not name a driver "
                            f"(HCP §10.6)")
        meant = values.near_miss(str(key), known)
        if meant is not None:
            raise PackError(f"{source}: {where}: unknown key {shown} (did you mean "
                            f"{meant!r}? expected: {', '.join(known)})")
        path = _host_path_in(table[key])
        if path is not None:
            raise PackError(f"{source}: {where}.{key}: names the host path {values.show(path)} "
                            f"(packs must not name a host path, HCP §10.6)")
        ignored.append(f"{where}.{key}")
    return tuple(ignored)


def _host_path_in(value: Any, depth: int = 0) -> str | None:
    """The first string in ``value`` (nested lists and tables too) that is an absolute
    path."""
    if isinstance(value, str):
        return value if value.startswith("/") else None
    if depth > values.MAX_DEPTH:
        return None
    items = value.values() if isinstance(value, Mapping) else \
        value if isinstance(value, list) else ()
    for item in items:
        found = _host_path_in(item, depth + 1)
        if found is not None:
            return found
    return None


def _str_list(value: Any, what: str, source: str, *, allow_str: bool = False) -> list[str]:
    if isinstance(value, str) and allow_str:
        value = [value]
    expected = "a string or a list of strings" if allow_str else "a list of strings"
    if not isinstance(value, list):
        raise PackError(f"{source}: {what}: expected {expected}, got {_show(value)}")
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise PackError(f"{source}: {what}[{i}]: expected a string, got {_show(item)}")
    seen: set[str] = set()
    for item in value:
        if item in seen:
            raise PackError(f"{source}: {what}: duplicate entry {values.show(item)}")
        seen.add(item)
    return list(value)


def _bins(value: Any, root: str, source: str) -> tuple[str, ...]:
    items = _str_list(value, "wrap.bin", source, allow_str=True)
    if not items:
        raise PackError(f"{source}: wrap.bin: expected at least one bin, got an empty list")
    out: list[str] = []
    for i, b in enumerate(items):
        what = "wrap.bin" if isinstance(value, str) else f"wrap.bin[{i}]"
        if not b.strip():
            raise PackError(f"{source}: {what}: expected a bin name or path, got an empty string")
        if "\0" in b:
            raise PackError(f"{source}: {what}: contains a NUL byte")
        if "/" in b and not os.path.isabs(b):
            b = _pack_bin(b, root, f"{source}: {what}")
        elif "/" in b:
            b = os.path.normpath(b)
        if b in out:
            raise PackError(f"{source}: wrap.bin: duplicate entry {values.show(b)}")
        out.append(b)
    return tuple(out)


def _name(value: Any, source: str) -> str | None:
    """The manifest's ``name``, which names the pack's workspaces on disk: printable text
    that encodes as UTF-8 (a lone surrogate from a JSON ``\\udc80`` would not)."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip() or "\0" in value:
        raise PackError(f"{source}: name: expected a non-empty string, got {_show(value)}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise PackError(f"{source}: name: {values.show(value)} is not valid UTF-8") from None
    if not value.isprintable():
        raise PackError(f"{source}: name: {values.show(value)} contains a control character")
    return value


def _pack_bin(b: str, root: str, where: str) -> str:
    """A pack-shipped executable (``bin/tool``): relative to the pack root, and inside it
    both as written and as it resolves, symlinks followed. ``bin/x -> /bin/sh`` would put a
    shell on the allow-list under a name the pack chose. Returned as written, made absolute
    (the allow-list compares exact paths)."""
    resolved = os.path.normpath(os.path.join(root, b))
    if not values.is_within(resolved, root):
        raise PackError(f"{where}: {values.show(b)} points outside the pack root")
    real = os.path.realpath(resolved)
    if not values.is_within(real, root):
        raise PackError(f"{where}: {values.show(b)} resolves to {printable(real)}, outside the "
                        f"pack root (symlinks are followed)")
    return resolved


def _agent_env(value: Any, source: str) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise PackError(f"{source}: wrap.agent_env: expected a table of NAME = \"value\" "
                        f"strings, got {_show(value)}")
    out: dict[str, str] = {}
    for key, val in value.items():
        if not isinstance(val, str):
            raise PackError(f"{source}: wrap.agent_env.{printable(str(key))}: expected a string, "
                            f"got {_show(val)}")
        if not isinstance(key, str) or not _ENV_NAME.match(key):
            raise PackError(f"{source}: wrap.agent_env: invalid variable name {values.show(key)} "
                            f"(expected letters, digits and _)")
        if is_injection_key(key):
            what = "is set by the sandbox" if key == "HCP_SANDBOX" else "injects code"
            raise PackError(f"{source}: wrap.agent_env: variable \"{key}\" not allowed ({what})")
        try:
            check_env_text(key, val)
        except PolicyError as e:
            raise PackError(f"{source}: wrap.agent_env.{key}: {e}") from None
        out[key] = val
    return out


def _workspace(value: Any, source: str) -> WorkspaceSpec:
    if value is None:
        return WorkspaceSpec()
    if not isinstance(value, Mapping):
        raise PackError(f"{source}: wrap.workspace: expected a table, got {_show(value)}")
    ignored = _unknown_keys(value, _WORKSPACE_KEYS, "wrap.workspace", source)
    mode = value.get("mode", NONE)
    if not isinstance(mode, str) or mode not in MODES:
        raise PackError(f"{source}: wrap.workspace.mode: expected one of "
                        f"{', '.join(MODES)}, got {_show(mode)}")
    if "home_env" in value:
        home_env = _str_list(value["home_env"], "wrap.workspace.home_env", source)
    else:
        home_env = ["HOME"] if mode == WORKSPACE else []
    for key in home_env:
        if not _ENV_NAME.match(key):
            raise PackError(f"{source}: wrap.workspace.home_env: invalid variable name "
                            f"{values.show(key)}")
        if is_injection_key(key) or key == "PATH":
            raise PackError(f"{source}: wrap.workspace.home_env: variable \"{key}\" not allowed "
                            f"(it is not a home directory)")
    if "file_flags" in value:
        flags = _str_list(value["file_flags"], "wrap.workspace.file_flags", source)
    else:
        flags = list(DEFAULT_FILE_FLAGS)
    for flag in flags:
        if not _FLAG.match(flag):
            raise PackError(f"{source}: wrap.workspace.file_flags: {values.show(flag)} is not a "
                            f"flag (expected -x or --name, without '=')")
    return WorkspaceSpec(mode=mode, home_env=tuple(home_env), file_flags=tuple(flags),
                         ignored_keys=ignored)
