"""`hcp-linux policy list|show|import`: the shipped presets, and policies imported from srt
and Codex, printed as TOML that ``run --policy FILE`` takes.

Refusals are one line, ``error: sandbox: ...``, exit 125 (an unknown preset, an unreadable
or malformed file), as for `run`; nothing is written but stdout. An import's notes (each
setting not carried over, and why) go to stderr, one line each, ``hcp-linux: import: ...``.
"""
from __future__ import annotations

import argparse
import os
import sys

from ..errors import PolicyError, printable


def policy_command(a: argparse.Namespace) -> int:
    """Run `policy list|show|import` (its parser is cli_args'; this module, the presets,
    the importers and the TOML writer are imported for these commands only)."""
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
    return _import(a)


def _import(a: argparse.Namespace) -> int:
    from ..policy import imports, toml_text, values
    from ..policy.policy import Policy
    from ..policy.resolve import resolve
    path = values.file_name(a.file, "policy import")
    source = f"{a.source} settings {printable(path)}"
    kind = "json" if a.source == "srt" else "toml"
    doc = values.parse_document(values.read_document(path, source), source, kind)
    try:
        jail = os.getcwd()
    except OSError as e:
        raise PolicyError(f"policy import: the current directory: {e.strerror}") from None
    if a.source == "srt":
        if a.allow_host:
            raise PolicyError("--allow-host: only with --from codex (srt names its hosts)")
        table, notes = imports.from_srt(doc, jail)
    else:
        table, notes = imports.from_codex(doc, jail, tuple(a.allow_host))
    # the result must be a policy `run --policy` takes here: checked now, not at the run
    try:
        resolve(Policy.from_mapping(table, source="imported policy", fallback={"jail": jail}))
    except PolicyError as e:
        raise PolicyError(f"policy import: {e} (a bug of the importer: please report it)") \
            from None
    for note in notes:
        print(f"hcp-linux: import: {printable(note)}", file=sys.stderr)
    sys.stdout.write(toml_text.dump(table, [
        f"imported from {a.source} settings {path} by hcp-linux policy import",
        f"for the jail {jail} (relative paths started there);",
        "use: hcp-linux run --policy THIS_FILE -- BIN [ARG...]"]))
    return 0

