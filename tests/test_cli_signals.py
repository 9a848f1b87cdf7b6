"""`hcp-linux run` told to stop (SIGINT, SIGTERM, SIGHUP) ends as shells expect: it kills the
sandbox, cleans up (the ephemeral jail goes, nothing is written back), writes the receipt
saying which signal, and then dies by that same signal (a Python caller sees -N, a shell
128+N). With and without ``--pack``. Controls: the same commands, unsignalled, end with
their own status and write their output back."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from sandboxing import (EXECUTOR_ARGS, TIMEOUT, default_stop_signals, jails_in, kill_by_pid, processes_with,
                        sleep_token, wait_for)

SIGNALS = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP]
PACK = '[wrap]\nbin = "sh"\nworkspace = { mode = "ephemeral" }\n'


class Setup:
    def __init__(self, base: Path) -> None:
        self.base = base
        self.tmp, self.jail, self.out = base / "tmp", base / "jail", base / "out"
        for d in (self.tmp, self.jail, self.out):
            d.mkdir()
        (base / "pack").mkdir()
        (base / "pack" / "pack.toml").write_text(PACK)
        self.receipt = base / "receipt.json"
        self.env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "TMPDIR": str(self.tmp),
                    "XDG_STATE_HOME": str(base / "state"), "HOME": str(base)}

    def argv(self, pack: bool, script: str) -> list[str]:
        where = (["--pack", str(self.base / "pack" / "pack.toml")] if pack
                 else ["--jail", str(self.jail)])
        # With a pack, "$2" is the staged output of -o out/result; without, a jail file.
        target = ["-o", str(self.out / "result")] if pack else [str(self.jail / "result")]
        return [sys.executable, "-m", "hcp_linux", "run", *EXECUTOR_ARGS, *where,
                "--timeout", str(TIMEOUT), "--receipt", str(self.receipt), "--",
                "sh", "-c", script, "sh", *target]

    def result_file(self, pack: bool) -> Path:
        return (self.out if pack else self.jail) / "result"


@pytest.fixture
def setup(tmp_path: Path) -> Setup:
    return Setup(tmp_path)


def _script(pack: bool, token: str) -> str:
    """Writes its output, then sleeps (its own process, ours to find by the token)."""
    out = '"$2"' if pack else '"$1"'
    return f"printf done > {out}; sleep {token}; exit 3"


@pytest.mark.parametrize("pack", [False, True], ids=["engine", "pack"])
@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_the_cli_dies_by_the_signal_it_was_sent(setup: Setup, pack: bool, sig: int) -> None:
    token = sleep_token(30)
    p = subprocess.Popen(setup.argv(pack, _script(pack, token)), env=setup.env, cwd=setup.base,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         preexec_fn=default_stop_signals)
    try:
        wait_for(lambda: processes_with(f"sleep\0{token}", p.pid), "the command to start")
        os.kill(p.pid, sig)
        p.wait(timeout=TIMEOUT)
    finally:
        kill_by_pid(p)
    err = p.stderr.read()
    p.stderr.close()
    assert p.returncode == -sig, err
    assert err == b""
    assert processes_with(token) == [], "a process of the run survived"
    assert jails_in(setup.tmp) == []  # the ephemeral jail (pack) is gone
    if pack:
        assert not setup.result_file(pack).exists()  # a killed run writes nothing back
    receipt = json.loads(setup.receipt.read_text())
    assert receipt["exit"] == {"returncode": -signal.SIGKILL, "timed_out": False,
                               "ended_by": signal.Signals(sig).name}
    if pack:
        assert receipt["driver"]["writeback"] == {
            "status": "skipped", "reason": f"ended by {signal.Signals(sig).name}",
            "written": []}


@pytest.mark.parametrize("pack", [False, True], ids=["engine", "pack"])
def test_without_a_signal_the_command_ends_with_its_own_status(setup: Setup,
                                                               pack: bool) -> None:
    """Control: the same command, not signalled, ends with its own status, 3 (so nothing
    is written back in pack mode, as for any failing tool), and exit 0 writes back."""
    r = subprocess.run(setup.argv(pack, "printf done > \"$%d\"; sleep 0.1; exit 3"
                                  % (2 if pack else 1)),
                       env=setup.env, cwd=setup.base, capture_output=True, timeout=TIMEOUT)
    assert (r.returncode, r.stderr) == (3, b"")
    assert json.loads(setup.receipt.read_text())["exit"] == {"returncode": 3,
                                                             "timed_out": False}
    r = subprocess.run(setup.argv(pack, "printf done > \"$%d\"" % (2 if pack else 1)),
                       env=setup.env, cwd=setup.base, capture_output=True, timeout=TIMEOUT)
    assert (r.returncode, r.stderr) == (0, b"")
    assert setup.result_file(pack).read_bytes() == b"done"
    assert jails_in(setup.tmp) == []


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(c) for c in f.read().split()]


@pytest.mark.parametrize("pack", [False, True], ids=["engine", "pack"])
@pytest.mark.parametrize("sig", SIGNALS + [None], ids=lambda s: signal.Signals(s).name
                         if s else "control")
def test_a_shell_sees_128_plus_n(setup: Setup, pack: bool, sig: int | None) -> None:
    """``sh -c 'hcp-linux run ...; echo $?'``, the signal sent to the CLI (the shell's
    foreground child) by its pid: the shell prints 128+N and goes on. Control: unsignalled,
    it prints the command's own status."""
    token = sleep_token(30) if sig else "0.1"
    script = _script(pack, token)
    shell = subprocess.Popen(["sh", "-c", '"$@"; echo "status=$?"', "sh",
                              *setup.argv(pack, script)],
                             env=setup.env, cwd=setup.base, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, preexec_fn=default_stop_signals)
    try:
        if sig:
            wait_for(lambda: processes_with(f"sleep\0{token}", shell.pid), "the command")
            [cli] = _children(shell.pid)
            os.kill(cli, sig)
        out, err = shell.communicate(timeout=TIMEOUT)
    finally:
        kill_by_pid(shell)
    assert shell.returncode == 0, err
    assert out == f"status={128 + sig if sig else 3}\n".encode()
    if sig:
        assert processes_with(token) == []
    assert jails_in(setup.tmp) == []


def _blocked_on_a_lock(pid: int) -> bool:
    """Whether ``pid`` waits for a flock (a "->" line of /proc/locks)."""
    with open("/proc/locks") as f:
        return any(line.split()[1:2] == ["->"] and line.split()[5] == str(pid) for line in f)


def test_a_signal_while_waiting_for_a_workspace_lock(tmp_path: Path) -> None:
    """A run still waiting for its workspace's lock (nothing spawned yet) ends by the
    signal too, with no receipt (like a refused run); the run holding the lock is not
    disturbed. Control: that run then completes with its own status."""
    setup = Setup(tmp_path)
    (tmp_path / "pack" / "pack.toml").write_text(
        '[wrap]\nbin = "sh"\nworkspace = { mode = "workspace" }\n')
    ws = tmp_path / "state" / "hcp-linux" / "workspaces" / "pack" / "default"
    holder = subprocess.Popen(
        setup.argv(True, 'touch started; i=0; while [ ! -e go ] && [ $i -lt 6000 ]; do '
                         'sleep 0.01; i=$((i+1)); done; exit 4'),
        env=setup.env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: (ws / "started").exists(), "the first run to hold the lock")
        waiting = subprocess.Popen(setup.argv(True, "exit 0"), env=setup.env, cwd=tmp_path,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                   preexec_fn=default_stop_signals)
        try:
            wait_for(lambda: _blocked_on_a_lock(waiting.pid), "the second run to wait")
            os.kill(waiting.pid, signal.SIGTERM)
            waiting.wait(timeout=TIMEOUT)
        finally:
            kill_by_pid(waiting)
        assert waiting.returncode == -signal.SIGTERM
        assert waiting.stderr.read() == b""
        waiting.stderr.close()
        assert holder.poll() is None and not setup.receipt.exists()
        (ws / "go").touch()
        assert holder.wait(timeout=TIMEOUT) == 4
        assert json.loads(setup.receipt.read_text())["exit"]["returncode"] == 4
    finally:
        kill_by_pid(holder)
