"""A runtime killed during a run still gets its protected names swept.

The sweep of what a run made at a missing protected name (``.envrc``, a nested
``.vscode``...) is the runtime's, once the run is over. A runtime killed meanwhile (the OOM
killer, a harness's SIGKILL on cancel) took its sandbox with it, and the planted files
stayed; the next run found them existing, took them for the user's and kept them. Now the
sweep is written down before the command starts (hcp_linux.policy.protected.pending) and the
next run's lookup does it, moving aside what it finds. Each test kills a real `hcp-linux run`
and checks the jail on disk; the control is the jail right after the kill (the plant is
there). As nobody (a virtual environment it cannot write) there is no record, and the
receipt says so.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

import sandboxing
from sandboxing import (TIMEOUT, assert_ok, caller_env, jail, out, read_receipt,  # noqa: F401
                        run_cli, show, wait_for)
from hcp_linux.runtime_files import pending_directory

PLANT = ("echo 'echo planted' > .envrc && mkdir -p sub/.vscode && touch ready && "
         "while [ ! -e go ]; do sleep 0.02; done")


def _records() -> list[str]:
    where = pending_directory()
    try:
        return sorted(os.listdir(where)) if where else []
    except FileNotFoundError:
        return []


def _names(record: str, jail: Path) -> bool:
    """Whether ``record`` is of a run in ``jail`` (other runs may write theirs meanwhile)."""
    where = pending_directory()
    assert where is not None
    try:
        return str(jail).encode() in Path(where, record).read_bytes()
    except FileNotFoundError:
        return False


def _can_keep_records() -> bool:
    where = pending_directory()
    if where is None:
        return False
    probe = where if os.path.isdir(where) else os.path.dirname(where)
    while not os.path.isdir(probe):
        probe = os.path.dirname(probe)
    return os.access(probe, os.W_OK)


needs_records = pytest.mark.skipif(not _can_keep_records(),
                                   reason="no virtual environment this uid can write: no "
                                          "records (test_without_a_place_the_receipt_says_so)")


def _start(jail: Path, cli: list[str] | None = None,
           env: dict[str, str] | None = None) -> subprocess.Popen:
    argv = sandboxing.hcp_argv(jail, "/bin/sh", "-c", PLANT)
    if cli is not None:  # another way to run it (test_caller_state.WAYS)
        argv = [*cli, *argv[len(sandboxing.CLI):]]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, env=caller_env() if env is None else env,
                            cwd="/")


def _killed_mid_run(jail: Path, cli: list[str] | None = None,
                    env: dict[str, str] | None = None) -> None:
    proc = _start(jail, cli, env)
    try:
        wait_for(lambda: (jail / "ready").exists(), "the command to plant")
    finally:
        os.kill(proc.pid, signal.SIGKILL)  # the runtime: its sandbox dies with it
        proc.communicate(timeout=TIMEOUT)
    (jail / "ready").unlink()


@needs_records
@pytest.mark.parametrize("how", ["python", "native", "native served", "python served"])
def test_a_run_after_a_killed_runtime_moves_its_plants_aside(jail: Path, tmp_path: Path,
                                                             how: str) -> None:
    """The ways to run the CLI: in-process the runtime writes the record; served, the
    server does, naming the client (which starts the command) as its owner."""
    from test_caller_state import way
    before = set(_records())  # (others' dead ones are collected by the next lookup)
    with way(how, tmp_path) as (cli, env):
        _killed_mid_run(jail, cli, env)
    # control: the runtime died before its sweep; what was planted is there
    assert (jail / ".envrc").read_text() == "echo planted\n"
    assert (jail / "sub" / ".vscode").is_dir()
    owed = {r for r in set(_records()) - before if _names(r, jail)}
    assert len(owed) == 1  # its sweep, written before the command
    receipt = tmp_path / "r.json"
    p = run_cli(jail, "/bin/sh", "-c", "cat .envrc 2>/dev/null || echo no-envrc",
                extra=["--receipt", str(receipt)])
    assert_ok(p)
    assert "no-envrc" in out(p), show(p)
    assert not os.path.lexists(jail / ".envrc")
    assert not os.path.lexists(jail / "sub" / ".vscode")
    aside = sorted(p.name for p in jail.glob(".envrc.hcp-linux-unswept-*"))
    assert len(aside) == 1 and (jail / aside[0]).read_text() == "echo planted\n"
    assert list((jail / "sub").glob(".vscode.hcp-linux-unswept-*"))
    # said in the receipt of the run that collected it: this one, unless another runtime of
    # the user's looked up protected names first (it may, as any later run does)
    recovered = read_receipt(receipt).get("protected_recovered")
    if recovered is not None:
        assert recovered[str(jail / ".envrc")].endswith(aside[0])
    assert owed.isdisjoint(_records())


@needs_records
def test_a_run_that_ends_leaves_no_record(jail: Path) -> None:
    """The record is the run's until its sweep is done: a plain run and a refused one (its
    setup fails: nothing ran) leave none."""
    before = set(_records())
    (jail / "go").touch()
    p = run_cli(jail, "/bin/sh", "-c", PLANT)
    assert_ok(p)
    assert not (jail / ".envrc").exists()
    assert set(_records()) <= before
    p = run_cli(jail, "/nonexistent/tool")
    assert p.returncode != 0
    assert set(_records()) <= before


@needs_records
def test_a_live_runtime_s_record_is_left_to_it(jail: Path, tmp_path: Path) -> None:
    """Another run's lookup meanwhile (in another jail) does not sweep a run that is still
    going: its runtime is alive. That run's own end sweeps, as ever."""
    proc = _start(jail)
    try:
        wait_for(lambda: (jail / "ready").exists(), "the command to plant")
        other = tmp_path / "other"
        other.mkdir()
        assert_ok(run_cli(other, "/bin/true"))
        assert (jail / ".envrc").exists()  # not moved aside under the live run
        (jail / "go").touch()
        proc.communicate(timeout=TIMEOUT)
    finally:
        sandboxing.kill_by_pid(proc)
    assert proc.returncode == 0
    assert not os.path.lexists(jail / ".envrc")
    assert not list(jail.glob(".envrc.hcp-linux-unswept-*"))


@needs_records
def test_a_record_cut_short_is_dropped_without_acting(jail: Path) -> None:
    """A record written only in part (its runtime killed while it wrote, before the command
    existed) names nothing to trust: it is removed, and nothing is moved."""
    where = pending_directory()
    assert where is not None
    os.makedirs(where, exist_ok=True)
    (jail / ".envrc").write_text("the user's\n")
    cut = Path(where) / "999999999-1-0123456789ab.json"
    cut.write_text(json.dumps({"since": 0, "sweep": [[str(jail / ".envrc"), None, False]]})[:30])
    # and one that parses but is not what a runtime writes (a target no sweep knows)
    odd = Path(where) / "999999999-1-0123456789ac.json"
    odd.write_text(json.dumps({"since": 0, "sweep": [[str(jail / ".envrc"), 7, False]],
                               "after": None}))
    assert_ok(run_cli(jail, "/bin/true"))
    assert not cut.exists() and not odd.exists()
    assert (jail / ".envrc").read_text() == "the user's\n"


def test_without_a_place_the_receipt_says_so(jail: Path, tmp_path: Path) -> None:
    """No place to keep the record (here: a file where its directory goes; elsewhere no
    virtual environment, or one this uid cannot write): the run goes on, and its receipt
    says that a runtime killed during it would leave its plants. Control: with the
    directory back, a run's receipt says nothing of it."""
    where = pending_directory()
    if where is None:
        pytest.skip("outside a virtual environment every run says so")
    kept = where + ".kept-by-test"
    moved = os.path.isdir(where)
    if moved:
        os.rename(where, kept)
    receipt = tmp_path / "r.json"
    (jail / "go").touch()
    try:
        os.makedirs(os.path.dirname(where), exist_ok=True)
        Path(where).write_text("not a directory\n")
        p = run_cli(jail, "/bin/sh", "-c", PLANT, extra=["--receipt", str(receipt)])
    finally:
        if os.path.isfile(where):
            os.unlink(where)
        if moved:
            os.rename(kept, where)
    assert_ok(p)
    assert read_receipt(receipt)["protected_pending"].startswith("not written ("), show(p)
    assert not (jail / ".envrc").exists()  # its own sweep, as ever
    if _can_keep_records():
        p = run_cli(jail, "/bin/sh", "-c", PLANT, extra=["--receipt", str(receipt)])
        assert_ok(p)
        assert "protected_pending" not in read_receipt(receipt)


@needs_records
def test_a_record_directory_removed_meanwhile_is_made_again(jail: Path) -> None:
    """A runtime makes the records' directory once, not before every run; removed since (a
    user's cleanup), the next run's record makes it again rather than going unwritten.
    Control: the run before the removal has its record there too."""
    from hcp_linux import Policy, Sandbox
    where = pending_directory()
    assert where is not None
    sb = Sandbox(Policy(jail=str(jail)))
    wait = "touch ready; while [ ! -e go ]; do sleep 0.02; done; rm ready go"

    def run_and_look() -> tuple[list[str], dict]:
        p = sb.spawn(["/bin/sh", "-c", wait])
        try:
            wait_for(lambda: (jail / "ready").exists(), "the command")
            mine = [r for r in _records() if _names(r, jail)]
        finally:
            (jail / "go").touch()
            p.wait(TIMEOUT)
        return mine, p.receipt
    mine, receipt = run_and_look()
    assert mine and "protected_pending" not in receipt  # control
    kept = where + ".kept-by-test"
    os.rename(where, kept)
    try:
        mine, receipt = run_and_look()
        assert mine and "protected_pending" not in receipt, receipt.get("protected_pending")
    finally:
        if os.path.isdir(where):
            for name in os.listdir(where):  # written meanwhile: back with the others
                os.rename(os.path.join(where, name), os.path.join(kept, name))
            os.rmdir(where)
        os.rename(kept, where)
    assert not [r for r in _records() if _names(r, jail)]  # each paid at its end
