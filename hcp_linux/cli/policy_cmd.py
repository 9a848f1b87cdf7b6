"""`hcp-linux policy list|show`: the shipped presets, printed as TOML that ``run --policy
FILE`` takes.

Refusals are one line, ``error: sandbox: ...``, exit 125 (an unknown preset), as for `run`;
nothing is written but stdout.
"""
from __future__ import annotations

import argparse
import sys



def policy_command(a: argparse.Namespace) -> int:
    """Run `policy list|show` (its parser is cli_args'; this module, the presets and the
    TOML writer are imported for these commands only)."""
    from ..policy import presets, toml_text
    if a.policy_cmd == "list":
        width = max(len(n) for n in presets.PRESETS)
        for p in presets.PRESETS.values():
            print(f"{p.name:<{width}}  {p.description}")
        return 0
    if a.policy_cmd == "show":
        preset = presets.get(a.name, "policy show")
        hosts = tuple(a.allow_host)
        if hosts or preset.needs_hosts:
            table = presets.table_with_hosts(preset, hosts, "policy show")
        else:
            table = dict(preset.table)
        sys.stdout.write(toml_text.dump(table, [
            f"hcp-linux preset {preset.name}: {preset.description}",
            f"the same as: hcp-linux run --preset {preset.name}"
            + ("" if not preset.needs_hosts else " --allow-host HOST ..."),
            "use: hcp-linux run --policy THIS_FILE -- BIN [ARG...]"]))
        return 0
    raise AssertionError(a.policy_cmd)  # argparse allows no other

