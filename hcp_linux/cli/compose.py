"""`run`'s policy when a preset or a config is in play: the layers read, composed, checked.

Imported only then (hcp_linux.cli.cli_args): a plain `run` never loads it, nor the presets.
The order, bottom to top, is preset < system config < user config < ``--policy`` file <
flags (hcp_linux.policy.layers says how each kind of key composes): the more specific and
the more recent the choice, the higher it stands; a config is a default for every run, a
file and the flags say what this run is.
"""
from __future__ import annotations

import argparse

from ..errors import PolicyError, printable
from ..policy import layers as L
from ..policy import policy_flags, presets, protected, values
from ..policy.policy import Policy
from ..policy.resolve import resolve
from . import config

#: What only network = "allow" reads.
EGRESS_KEYS = ("allow_hosts", "deny_hosts", "proxy_log")


def composed_policy(a: argparse.Namespace, found: list[tuple[str, str]]
                    ) -> tuple[Policy, list[str]]:
    """The policy of `run`'s flags over its ``--policy`` file over the configs ``found``
    ((kind, path), system first) over its ``--preset``; and the layers applied, named, for
    the receipt. Every input is read and checked before anything is spawned or written."""
    preset = presets.get(a.preset) if a.preset is not None else None
    stack: list[L.Layer] = []
    if preset is not None:
        stack.append(L.Layer(L.PRESET, preset.name, preset.table))
    for kind, path in found:
        config.check_trusted(kind, path)
        source = f"{kind} {printable(path)}"
        raw = values.read_document(path, source)
        stack.append(L.Layer(kind, path, values.parse_document(raw, source, "toml")))
    if a.policy:
        name = values.file_name(a.policy, "policy file")
        source = f"policy file {printable(name)}"
        raw = values.read_document(name, source)
        stack.append(L.Layer(L.POLICY_FILE, name, values.parse_document(raw, source, "toml")))
    table = L.combine(stack)
    if "jail" not in table and a.jail is not None:
        table["jail"] = a.jail
    kwargs = policy_flags.merge(a, table)
    if kwargs.get("network", "none") != "allow" and not (a.allow_host or a.deny_host
                                                         or a.proxy_log):
        # the layers' egress settings belong to network = "allow": a layer (or --network)
        # above them that turns egress off leaves them nothing to say; dropping them only
        # narrows (flags that name hosts with egress off are still refused, by Policy)
        for key in EGRESS_KEYS:
            kwargs.pop(key, None)
    if preset is not None and preset.needs_hosts and kwargs.get("network") == "allow" \
            and not kwargs.get("allow_hosts"):
        raise PolicyError(f"--preset {preset.name}: no host to allow; give at least one with "
                          f"--allow-host HOST[:PORT] (or allow_hosts in a config)")
    names = [layer.source for layer in stack]
    try:
        policy = resolve(Policy(**kwargs))
    except PolicyError as e:
        raise PolicyError(f"policy of {' < '.join(names + ['flags'])}: {e}") from None
    for layer in stack:
        if layer.kind in (L.SYSTEM_CONFIG, L.USER_CONFIG):
            config.check_outside(layer.kind, layer.name, policy.writable_roots)
    if a.policy:
        # it would widen the next run: protected in this process's runs (policy.protected)
        protected.protect_file(a.policy)
    return policy, names
