"""Named policies shipped with the package: `hcp-linux policy list`, `policy show NAME`,
`run --preset NAME`.

A preset is the bottom layer of a composed policy (hcp_linux.policy.layers): a table of the
same keys as a ``--policy`` file, so that `policy show NAME` prints a file that `--policy`
accepts and that reads back to the same table. They are data, not code, and few: each names a
habit users bring from other sandboxes (Codex's modes), spelled in this policy's own keys.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping, Sequence

from ..errors import PolicyError
from .values import did_you_mean, show


@dataclass(frozen=True)
class Preset:
    """One named policy: a one-line ``description`` and its ``table`` of policy keys.
    ``needs_hosts``: the table turns egress on and names no host; the hosts are the
    caller's (``--allow-host``, or ``allow_hosts`` in a layer above)."""

    name: str
    description: str
    table: Mapping[str, Any]
    needs_hosts: bool = False


PRESETS: Mapping[str, Preset] = MappingProxyType({p.name: p for p in (
    Preset("read-only", "the jail read-only (writes only to the private /tmp), no network",
           MappingProxyType({"read_only_jail": True, "network": "none"})),
    Preset("workspace-write", "the jail writable, no network (the default policy)",
           MappingProxyType({"read_only_jail": False, "network": "none"})),
    Preset("workspace-write-net", "the jail writable, egress only to the hosts given "
           "(--allow-host HOST[:PORT], at least one)",
           MappingProxyType({"read_only_jail": False, "network": "allow"}), needs_hosts=True),
)})


def get(name: Any, what: str = "--preset") -> Preset:
    """The preset called ``name``; PolicyError naming the nearest one and every name."""
    preset = PRESETS.get(name) if isinstance(name, str) else None
    if preset is None:
        raise PolicyError(f"{what}: unknown preset {show(name)}{did_you_mean(name, list(PRESETS))}"
                          f" (known: {', '.join(PRESETS)}; 'hcp-linux policy list')")
    return preset


def table_with_hosts(preset: Preset, hosts: Sequence[str], what: str = "--preset") -> dict:
    """The preset's table, with ``hosts`` as its ``allow_hosts`` when it takes hosts;
    PolicyError when it needs them and none is given (one line naming the preset)."""
    table = dict(preset.table)
    if preset.needs_hosts:
        if not hosts:
            raise PolicyError(f"{what} {preset.name}: no host to allow; give at least one "
                              f"with --allow-host HOST[:PORT]")
        table["allow_hosts"] = list(hosts)
    elif hosts:
        raise PolicyError(f"{what} {preset.name}: takes no hosts (--allow-host is for "
                          f"workspace-write-net)")
    return table
