"""§10.4 Stronger isolation: the same pack runs unchanged under stricter and looser
configurations.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import platform
import secrets
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ...errors import HostPathError, NotAllowlistedError, PolicyError, SandboxError
from ...policy import Policy
from ..harness import Evidence, Fail, Harness, NotApplicable, layer_refusal, proc_summary, shown
from ..observers import drain, pid_alive
from .base import (PY_ARGV, Check, _env_lines, _exact_refusal, _ran, _stderr, _stdout, _token,
                   _verdict, check)


# ============================================================================================
# §10.4 Stronger isolation
# ============================================================================================

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


def _tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in sorted(os.walk(root)):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            h.update(f"{os.path.relpath(p, root)}:{st.st_mode:o}:{st.st_size}".encode())
            if os.path.isfile(p) and not os.path.islink(p):
                with open(p, "rb") as f:
                    h.update(f.read())
    return h.hexdigest()


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
