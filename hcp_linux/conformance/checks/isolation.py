"""§10.4 Stronger isolation: the same pack runs unchanged under stricter and looser
configurations.
"""
from __future__ import annotations

import secrets
from typing import Any

from ...errors import SandboxError
from ..harness import Evidence, Harness
from .base import _ran, _stdout, _tree_digest, _verdict, check


_TOOL = """#!/bin/sh
# A pack's tool: upper-cases its --file input into its -o output.
in=; out=
while [ $# -gt 0 ]; do
  case "$1" in
    --file) in=$2; shift 2;;
    -o) out=$2; shift 2;;
    *) shift;;
  esac
done
tr a-z A-Z < "$in" > "$out"
echo "done mode=$HCP_SANDBOX"
"""

@check("10.4-isolation-is-runtime", "§10.4", "The same pack runs unchanged under stricter and "
       "looser configurations",
       requirement="A pack MUST NOT need to change to run under stronger isolation. Isolation "
                   "is a runtime property.",
       enforced_by="driver (no layer)")
def isolation_is_runtime(h: Harness, ev: Evidence) -> str:
    manifest = h.pack("pack", ["bin/tool"], mode="ephemeral", files={"bin/tool": _TOOL})
    root = manifest.parent
    before = _tree_digest(root)
    host = h.mkdir("host")
    h.write(host / "in.txt", "hello pack\n")
    configs: list[tuple[str, dict[str, Any], str]] = [
        ("default", {}, "sandbox"),
        ("stricter: limits, timeout, runtime allow-list",
         {"limits": {"nproc": 128, "nofile": 256, "fsize": "16m"}, "timeout": h.timeout,
          "allow_bins": (str(root / "bin" / "tool"),)}, "sandbox"),
        ("stricter: seccomp network-off profile too",
         {"seccomp_profiles": ("baseline", "socket-families", "network-off")}, "sandbox"),
        ("looser: host network", {"network": "host"}, "sandbox"),
        ("native-local", {"sandbox": False, "native_local": True}, "native-local"),
    ]
    outputs: set[str | None] = set()
    for name, fields, mode in configs:
        out = host / f"out-{len(outputs)}-{secrets.token_hex(2)}.txt"
        ev.try_(f"{name}: bin/tool --file in.txt -o {out.name}")
        try:
            r = h.drive(h.driver(**fields), manifest,
                        ["bin/tool", "--file", "in.txt", "-o", out.name], cwd=str(host))
        except SandboxError as e:
            ev.require(False, f"{name}: the pack was refused: {e}")
            continue
        if _ran(ev, name, r):
            ev.require(_stdout(r) == f"done mode={mode}\n", f"{name}: stdout {_stdout(r)!r}")
            got = out.read_text() if out.exists() else None
            ev.require(got == "HELLO PACK\n", f"{name}: output {got!r}")
            outputs.add(got)
    after = _tree_digest(root)
    ev.saw(f"pack tree sha256 before {before[:16]}…, after {after[:16]}…")
    ev.require(before == after, "the pack changed")
    return _verdict(ev, f"one unchanged pack ran identically under {len(configs)} "
                        "configurations")
