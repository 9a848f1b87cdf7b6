"""A policy composed of layers: a preset, the system and user configs, a ``--policy`` file.

Each layer is a table of the same keys as a ``--policy`` file. Composed bottom to top
(preset < system config < user config < policy file, and then the flags of `run`), with the
rules the flags already follow over a file (hcp_linux.policy.policy_flags), so that one rule
holds at every step: a list adds to the layers below it (``write_roots``, ``allow_hosts``,
``hidden_paths``...), a scalar replaces theirs, ``env`` and ``[limits]`` merge key by key, and
the two sets that have a default (``system_roots``, ``seccomp_profiles``) replace it whole, as
their flags do. The composition is checked once, as one Policy, by the caller; each layer's
keys and shapes are checked here, naming the layer.

Pure: nothing here reads a file or the environment (hcp_linux.cli.config finds the configs).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ..errors import PolicyError, printable
from .policy import field_table
from .policy_flags import APPEND, FIELDS
from .values import show

#: Merged key by key.
TABLES = ("env", "limits")
#: A set with a default: a layer's list replaces the one below (as ``--system-root`` does).
REPLACING = ("system_roots", "seccomp_profiles")
#: Every other list field: a layer's items are added after the ones below.
ADDING = tuple(f.name for f in FIELDS if f.takes == APPEND and f.name not in TABLES + REPLACING)

#: Kinds of layer, bottom to top.
PRESET, SYSTEM_CONFIG, USER_CONFIG, POLICY_FILE = ("preset", "system config", "user config",
                                                   "policy file")
#: What a config file (read without being named on the command line) may not set: native-local
#: mode runs every command unconfined, a decision made per run (HCP §10.3), never by a file
#: found on the disk.
NOT_IN_CONFIG = ("sandbox", "native_local")


@dataclass(frozen=True)
class Layer:
    """One layer: its kind, its name (a preset's name, a file's path) and its table."""

    kind: str
    name: str
    table: Mapping[str, Any]

    @property
    def source(self) -> str:
        """How messages and the receipt name it: ``user config /home/u/.config/...``."""
        return f"{self.kind} {printable(self.name)}"


def _list(value: Any, source: str, name: str) -> list[Any]:
    if not isinstance(value, (list, tuple)):
        raise PolicyError(f"{source}: {name}: expected a list, got {show(value)}")
    return list(value)


def combine(layers: Sequence[Layer]) -> dict[str, Any]:
    """Policy's keyword arguments from ``layers``, bottom first; their values unchecked
    but for their shape (a list where a list belongs, a table where a table does)."""
    out: dict[str, Any] = {}
    for layer in layers:
        for name, value in field_table(layer.table, layer.source).items():
            if name in NOT_IN_CONFIG and layer.kind in (SYSTEM_CONFIG, USER_CONFIG):
                raise PolicyError(f"{layer.source}: {name}: not taken from a config file "
                                  f"(native-local mode is chosen per run: --no-sandbox "
                                  f"--native-local, or a --policy file)")
            if name in ADDING:
                items = list(out.get(name, ())) + _list(value, layer.source, name)
                out[name] = _unique(items)
            elif name in REPLACING:
                out[name] = _list(value, layer.source, name)
            elif name in TABLES:
                if not isinstance(value, Mapping):
                    raise PolicyError(f"{layer.source}: {name}: expected a table, got "
                                      f"{show(value)}")
                out[name] = {**out.get(name, {}), **value}
            else:
                out[name] = value
    return out


def _unique(items: list[Any]) -> list[Any]:
    """The items once each, in order (the same host from a config and a flag)."""
    seen: set[str] = set()
    out = []
    for item in items:
        if isinstance(item, str):
            if item in seen:
                continue
            seen.add(item)
        out.append(item)
    return out
