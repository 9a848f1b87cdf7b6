"""The registry of conformance checks (:func:`check` adds one to :data:`CHECKS`) and the
helpers the checks of every section share: exact refusals, runs that must have run, the
verdict from the evidence.
"""
from __future__ import annotations

import hashlib
import os
import secrets
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..harness import Evidence, Fail, Harness, NotApplicable, proc_summary, shown

CheckFn = Callable[[Harness, Evidence], str]


@dataclass(frozen=True)
class Check:
    id: str
    rule: str           # "§10.2.1", or "hardening" for a canary
    title: str
    requirement: str    # the rule, in the spec's words where it has them
    enforced_by: str    # which layers of this engine uphold it (for readers; see docs)
    fn: CheckFn


CHECKS: list[Check] = []


def check(id: str, rule: str, title: str, *, requirement: str,
          enforced_by: str) -> Callable[[CheckFn], CheckFn]:
    def register(fn: CheckFn) -> CheckFn:
        if any(c.id == id for c in CHECKS):
            raise ValueError(f"duplicate check id {id}")
        CHECKS.append(Check(id, rule, title, requirement, enforced_by, fn))
        return fn
    return register


def _token() -> str:
    return "hcp-conformance-" + secrets.token_hex(8)


def _stderr(p: object) -> str:
    data = getattr(p, "stderr", b"") or b""
    return data.decode(errors="replace") if isinstance(data, bytes) else str(data)


def _stdout(p: object) -> str:
    data = getattr(p, "stdout", b"") or b""
    return data.decode(errors="replace") if isinstance(data, bytes) else str(data)


def _exact_refusal(ev: Evidence, what: str, p: subprocess.CompletedProcess, code: int,
                   message: str) -> None:
    """``p`` is a CLI run that must have been refused with ``code`` and exactly one line,
    ``error: sandbox: <message>``, and nothing on stdout."""
    expected = f"error: sandbox: {message}\n"
    ev.saw(f"{what}: {proc_summary(p)}")
    ev.require(p.returncode == code, f"{what}: exit status {p.returncode}, expected {code}")
    ev.require(_stderr(p) == expected,
               f"{what}: stderr was {_stderr(p)!r}, expected exactly {expected!r}")
    ev.require(p.stdout == b"", f"{what}: wrote to stdout: {shown(p.stdout)!r}")


def _ran(ev: Evidence, what: str, r: object, code: int = 0) -> bool:
    """A run that must have run (and exited ``code``)."""
    ev.saw(f"{what}: {proc_summary(r)}")
    rc = getattr(r, "returncode")
    why = ""
    if rc != code:
        refusal = [ln for ln in _stderr(r).splitlines() if ln.startswith("error: sandbox: ")]
        if refusal:
            why = f" (the sandbox refused a run this configuration allows: {refusal[-1]})"
    return ev.require(rc == code, f"{what}: exit status {rc}, expected {code}{why}")


def _env_lines(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out.setdefault(key, []).append(value)
    return out


def _verdict(ev: Evidence, summary: str) -> str:
    if ev.problems:
        raise Fail("; ".join(ev.problems))
    if ev.control_failures:
        raise NotApplicable("the unconfined control did not behave, so the denial cannot be "
                            "judged here: " + "; ".join(ev.control_failures))
    return summary


PY_ARGV = "import json, sys; print(json.dumps(sys.argv[1:]))"


def _tree_digest(root: Path) -> str:
    """A digest of every name, mode, size and file content under ``root``: equal digests, an
    unchanged tree (the isolation and mode-none checks compare a pack before and after)."""
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


__all__ = ["CHECKS", "Check", "check"]
