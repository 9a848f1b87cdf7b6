"""One check per normative rule of HCP §10, plus hardening canaries.

The rules are those of https://harnesscontextprotocol.io/docs/specification/sandbox, quoted
in each check's ``requirement``.

Every check does the thing for real through the public surfaces (the Python API, the
``hcp-linux`` CLI, the HCP driver) and judges what happened on the host: files on disk, bytes
on the wire, processes in the process table, exact exit statuses and messages. Every denial
has a negative control: the same action, unconfined, must succeed; when it does not, the
check cannot be judged here and is "not applicable", never "pass". A violation observed in
the sandbox fails the check whatever the control did: it is proven.

Each check returns a one-line summary (pass) or raises :class:`Fail` /
:class:`NotApplicable`; its :class:`Evidence` records what was tried, what happened and what
the control did.
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


__all__ = ["CHECKS", "Check", "check"]
