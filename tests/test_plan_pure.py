"""Compiling a plan writes nothing, and a plan is never patched after it is made (issue 30).

Without a mount view the command's HOME and TMPDIR live in the jail's ``.hcp-tmp``: it is
made at the spawn (``plan.prepare``), not by ``compile_plan``, so a plan compiled and never
run (a refused attempt, a served plan that falls back, a session's checks) leaves the jail
as it was. Checked on disk, with the run itself as the control that does make it."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from hcp_linux import Policy, Sandbox
from hcp_linux.plan.plan import PRIVATE_TMP, compile_plan
from hcp_linux.policy.resolve import resolve
from sandboxing import jail, snapshot  # noqa: F401


def _without_view(sb: Sandbox) -> frozenset[str]:
    return sb._wanted_layers() - {"mountns"}


def test_compiling_without_a_view_writes_nothing(jail: Path) -> None:
    sb = Sandbox(Policy(jail=str(jail), allow_degraded=frozenset({"mountns"})))
    before = snapshot(jail)
    plan = compile_plan(sb.policy, ["true"], layers=_without_view(sb))
    try:
        assert plan.private_tmp == str(jail / PRIVATE_TMP)
        assert dict(plan.env)[b"HOME"] == str(jail / PRIVATE_TMP).encode()
        assert snapshot(jail) == before
        assert not (jail / PRIVATE_TMP).exists()
    finally:
        plan.close()


def test_the_spawn_makes_the_private_tmp(jail: Path) -> None:
    """Control: the run itself makes it (self-ignored), and the command writes there
    (native-local: no view at all)."""
    policy = resolve(Policy(jail=str(jail), sandbox=False, native_local=True))
    before = snapshot(jail)
    plan = compile_plan(policy, ["true"], layers=frozenset())
    plan.close()
    assert snapshot(jail) == before
    r = Sandbox(policy).run(["sh", "-c", "echo hi > \"$HOME/f\""])
    assert r.returncode == 0, r
    assert (jail / PRIVATE_TMP / ".gitignore").read_text() == "*\n"
    assert (jail / PRIVATE_TMP / "f").read_text() == "hi\n"


def test_a_plan_is_frozen(jail: Path) -> None:
    sb = Sandbox(Policy(jail=str(jail)))
    plan = compile_plan(sb.policy, ["true"], layers=sb._wanted_layers())
    try:
        with pytest.raises(dataclasses.FrozenInstanceError):
            plan.cwd = b"/"  # type: ignore[misc]
        variant = dataclasses.replace(plan, cwd=b"/")
        assert variant.cwd == b"/" and plan.cwd == str(jail).encode()
    finally:
        plan.close()
