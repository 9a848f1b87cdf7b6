"""When the runtime's own helpers misbehave, a run still ends, on time, and leaves nothing.

The helpers of a run are real processes (the monitor, the sandbox's init, spares); these
tests stop them from outside (SIGSTOP, as a debugger, a job-control accident or an attacker
on the same uid would), and check by /proc that every process of the run is gone afterwards —
not a zombie, not stopped. Each has its control: the same run with nothing stopped, or the
same stop without the action under test, showing the stop is real and the check can fail.
Run under whichever executor the suite was started with (CI: ctypes and native, as root and
as nobody).
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import pytest

from hcp_linux import Policy, Sandbox, native
from hcp_linux.proc import teardown
from hcp_linux.conformance.observers import (on_a_thread, proc_children, proc_state,
                                             processes_in_namespace, resume_and_kill)
from hcp_linux.proc.teardown import reaper as _reaper

TIMEOUT = 60


@pytest.fixture
def jail(tmp_path: Path) -> Path:
    d = tmp_path / "jail"
    d.mkdir()
    return d


# --- observing processes from /proc ---------------------------------------------------------

def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (state first), None when gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None


def _run_tree(monitor: int, depth: int = 3) -> list[int]:
    """The monitor, the init and the command (waits until all three are there)."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        chain = [monitor]
        while len(chain) < depth:
            kids = proc_children(chain[-1])
            if not kids:
                break
            chain.append(kids[0])
        if len(chain) == depth:
            return chain
        assert time.monotonic() < deadline, f"the run's processes never all appeared: {chain}"
        time.sleep(0.01)


def _wait_state(pid: int, want: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while proc_state(pid) != want:
        assert time.monotonic() < deadline, f"{pid} never reached state {want}"
        time.sleep(0.005)


def _left(pids: list[int], within: float = 15.0) -> list[int]:
    """Those of ``pids`` still present (running, stopped or zombie) after up to ``within``
    seconds of waiting for them to go."""
    deadline = time.monotonic() + within
    while True:
        left = [p for p in pids if proc_state(p) is not None]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.02)


def _within(seconds: float, fn: Callable[[], object]) -> object:
    """``fn()``'s result, or AssertionError if it has not returned in ``seconds`` (the hang
    this file is about: the call is left behind on its thread, the test fails)."""
    returned, result = on_a_thread(fn, seconds)
    assert returned, f"still waiting after {seconds}s"
    return result


# --- kill and timeout do not depend on the monitor --------------------------------------------

@pytest.mark.parametrize("who", ["monitor", "init"])
def test_kill_ends_the_run_whatever_helper_is_stopped(jail: Path, who: str) -> None:
    proc = Sandbox(Policy(jail=str(jail))).spawn(["sleep", "1000"])
    tree = _run_tree(proc.pid)
    stopped = tree[0] if who == "monitor" else tree[1]
    try:
        os.kill(stopped, signal.SIGSTOP)
        _wait_state(stopped, "T")
        proc.kill()
        rc = _within(TIMEOUT, proc.wait)
        assert rc == -signal.SIGKILL
        assert _left(tree) == [], "a process of the run is left"
        assert proc.receipt["end"]["by"] == "kill"
        if who == "monitor":  # it had to be resumed to reap the init and exit
            assert any("SIGCONT" in n for n in proc.receipt["end"]["notes"])
    finally:
        resume_and_kill(tree)


def test_control_a_stopped_monitor_keeps_its_run_without_a_kill(jail: Path) -> None:
    """The stop is real: without a kill the command runs on and wait() times out."""
    proc = Sandbox(Policy(jail=str(jail))).spawn(["sleep", "1000"])
    tree = _run_tree(proc.pid)
    try:
        os.kill(tree[0], signal.SIGSTOP)
        _wait_state(tree[0], "T")
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(0.5)
        assert proc_state(tree[2]) in ("S", "R"), "the command should still be running"
    finally:
        os.kill(tree[0], signal.SIGCONT)
        proc.kill()
        proc.wait()
    assert _left(tree) == []


def test_timeout_ends_the_run_with_the_monitor_stopped(jail: Path) -> None:
    proc = Sandbox(Policy(jail=str(jail))).spawn(["sleep", "1000"], stdout=subprocess.PIPE)
    tree = _run_tree(proc.pid)
    try:
        os.kill(tree[0], signal.SIGSTOP)
        _wait_state(tree[0], "T")
        out, _, timed_out = _within(TIMEOUT, lambda: proc.finish(timeout=0.5))  # type: ignore
        assert timed_out and out == b""
        assert proc.returncode == -signal.SIGKILL
        assert proc.receipt["end"]["by"] == "timeout"
        assert _left(tree) == []
    finally:
        resume_and_kill(tree)


def test_cli_timeout_with_the_monitor_stopped(jail: Path) -> None:
    cli = subprocess.Popen([sys.executable, "-m", "hcp_linux", "run", "--jail", str(jail),
                            "--timeout", "1", "--", "sleep", "1000"],
                           stderr=subprocess.PIPE, text=True)
    tree: list[int] = []
    try:
        tree = _run_tree(cli.pid, 4)  # the CLI, the monitor, the init, sleep
        os.kill(tree[1], signal.SIGSTOP)
        _, err = cli.communicate(timeout=TIMEOUT)
        assert cli.returncode == 124, err
        assert "timed out after 1s" in err
        assert _left(tree[1:]) == []
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
        resume_and_kill(tree[1:])


# --- a run that ended with its monitor stopped ------------------------------------------------

def test_a_stopped_monitor_whose_command_ended_is_resumed_and_reaped(jail: Path) -> None:
    proc = Sandbox(Policy(jail=str(jail))).spawn(["sh", "-c", "cat >/dev/null"],
                                                 stdin=subprocess.PIPE)
    tree = _run_tree(proc.pid)
    sent = _reaper().sent["SIGCONT"]
    try:
        os.kill(tree[0], signal.SIGSTOP)
        _wait_state(tree[0], "T")
        proc.stdin.close()  # type: ignore[union-attr]  # the command ends: EOF on read
        assert _within(TIMEOUT, proc.wait) == 0  # the init's report: the command's status
        assert proc_state(tree[0]) == "T", "control: the monitor was still stopped at the report"
        assert _left(tree) == [], "the monitor or a zombie init is left"
        assert _reaper().sent["SIGCONT"] > sent
    finally:
        resume_and_kill(tree)


def test_one_stuck_monitor_does_not_hold_up_the_reaping_of_others(
        jail: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(teardown, "MONITOR_GRACE", 60.0)  # it stays stopped meanwhile
    sb = Sandbox(Policy(jail=str(jail)))
    proc = sb.spawn(["sh", "-c", "cat >/dev/null"], stdin=subprocess.PIPE)
    tree = _run_tree(proc.pid)
    try:
        os.kill(tree[0], signal.SIGSTOP)
        _wait_state(tree[0], "T")
        proc.stdin.close()  # type: ignore[union-attr]
        assert proc.wait(TIMEOUT) == 0
        later = []
        for _ in range(20):
            p = sb.spawn(["true"])
            later.append(p.pid)
            assert p.wait(TIMEOUT) == 0
        assert _left(later) == [], "later monitors were left unreaped (zombies)"
        assert proc_state(tree[0]) == "T", "control: the first monitor was still stopped"
    finally:
        resume_and_kill(tree)
    assert _left(tree) == []


# --- spawning is bounded ----------------------------------------------------------------------

def _native() -> str:
    """Spares are the native executor's: these tests ask for it whatever the suite's
    default executor is (CI's ctypes leg included)."""
    assert native.available(), "hcp-exec is not built (make setup)"
    return "native"


def _ready_spares(sb: Sandbox) -> list[int]:
    """Warm the pool for ``sb``'s policy until it holds ready spares; their pids. The pool is
    emptied first: spares an earlier test left for another policy would be counted here and
    never be taken by this policy's run."""
    native.spares.clear()
    for _ in range(3):
        assert sb.run(["true"], timeout=TIMEOUT).returncode == 0
    deadline = time.monotonic() + TIMEOUT
    while True:
        pids = native.spares.idle_pids()
        if len(pids) >= native.spares.SPARE_TARGET:
            return pids
        assert time.monotonic() < deadline, "no ready spare appeared"
        time.sleep(0.02)


@pytest.mark.parametrize("stop", [True, False], ids=["stuck-spares", "control-healthy"])
def test_a_ready_spare_that_does_not_answer_is_passed_over(
        jail: Path, stop: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    # the stopped spares must still be the ready ones when the run comes, however slow the
    # machine: not replaced for their age meanwhile
    monkeypatch.setattr(native.spares, "SPARE_MAX_AGE", 300.0)
    sb = Sandbox(Policy(jail=str(jail)), executor=_native())
    spares = _ready_spares(sb)
    inits = [_run_tree(pid, 2)[1] for pid in spares]  # the spare's init takes the plan
    try:
        if stop:
            for pid in inits:
                os.kill(pid, signal.SIGSTOP)
                _wait_state(pid, "T")
        ready = native.stats["ready"]
        run = _within(TIMEOUT, lambda: sb.run(["echo", "ran"], capture_output=True,
                                              timeout=TIMEOUT))
        assert run.returncode == 0 and run.stdout == b"ran\n"  # type: ignore[attr-defined]
        notes = run.receipt.get("spawn", {}).get("notes", [])  # type: ignore[attr-defined]
        if stop:
            assert any("did not answer" in n for n in notes)
            # the one that took the run was killed (the others wait in the pool, stopped)
            deadline = time.monotonic() + TIMEOUT
            while all(proc_state(s) is not None or proc_state(i) is not None
                      for s, i in zip(spares, inits)):
                assert time.monotonic() < deadline, "the stuck spare was not killed"
                time.sleep(0.02)
        else:
            assert notes == [] and native.stats["ready"] == ready + 1
    finally:
        resume_and_kill(spares + inits if stop else [])
        native.spares.clear()


def test_a_stopped_idle_spare_does_not_hold_up_the_pool(jail: Path) -> None:
    sb = Sandbox(Policy(jail=str(jail)), executor=_native())
    spares = _ready_spares(sb)
    try:
        for pid in spares:
            os.kill(pid, signal.SIGSTOP)
            _wait_state(pid, "T")
        native.spares.clear()  # retires them: EOF, then the reaper's escalation
        assert _left(spares) == []
        assert sb.run(["true"], timeout=TIMEOUT).returncode == 0
    finally:
        resume_and_kill(spares)
        native.spares.clear()


@pytest.mark.parametrize("kill", [True, False], ids=["killed-after-hand-over", "control"])
def test_a_spare_killed_after_the_hand_over_is_replaced_not_lost(
        jail: Path, kill: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ready spare SIGKILLed once the plan is in its socket (the OOM killer, a storm of
    kills) releases the run's error pipe unread: EOF, which meant "exec'd". No seccomp
    listener came (it is sent right before the exec), so nothing ran: the run is started
    afresh and succeeds, and its receipt says so. It used to fail with HelperLostError.
    Control: a spare left alone takes the run, with no note."""
    monkeypatch.setattr(native.spares, "SPARE_MAX_AGE", 300.0)
    sb = Sandbox(Policy(jail=str(jail)), executor=_native())
    spares = _ready_spares(sb)
    inits = {pid: _run_tree(pid, 2)[1] for pid in spares}
    for pid in inits.values():  # each waits for a plan: stopped, it cannot take one yet
        os.kill(pid, signal.SIGSTOP)
        _wait_state(pid, "T")
    real = native.spares.hand_over
    killed: list[int] = []

    def hand_over_then_kill(spare, plan, fds, ruleset):  # type: ignore[no-untyped-def]
        sent = real(spare, plan, fds, ruleset)
        init = inits.get(spare.pid)
        if init is not None:
            if kill:
                os.kill(init, signal.SIGKILL)  # the plan and the run's fds unread
                killed.append(init)
            else:
                os.kill(init, signal.SIGCONT)
        return sent
    monkeypatch.setattr(native.spares, "hand_over", hand_over_then_kill)
    try:
        run = sb.run(["echo", "ran"], capture_output=True, timeout=TIMEOUT)
        assert (run.returncode, run.stdout) == (0, b"ran\n"), run
        notes = run.receipt.get("spawn", {}).get("notes", [])
        if kill:
            assert killed and any("died before the command started" in n for n in notes), notes
        else:
            assert not killed and notes == [], notes
    finally:
        resume_and_kill(list(spares) + list(inits.values()))
        native.spares.clear()


# --- a fork bomb does not make the timeout late -----------------------------------------------

BOMB = "#include <unistd.h>\nint main(void) { for (;;) fork(); }\n"


def _session(pid: int) -> int:
    fields = _stat(pid)
    assert fields is not None
    return int(fields[3])  # state ppid pgrp session


@pytest.mark.parametrize("executor", ["native", "ctypes"])
def test_a_fork_bomb_is_killed_at_its_timeout_and_nothing_of_it_is_left(jail: Path,
                                                                        executor: str) -> None:
    """The order of events, not a wall-clock bound (bench/faults.py measures how late): the
    command runs in a session (so a scheduler autogroup) of its own, apart from the init and
    the monitor; at the timeout the run is killed; when finish() returns no process of the
    run's pid namespace is left."""
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        pytest.skip("no C compiler (scripts/install-system-deps installs gcc)")
    (jail / "bomb.c").write_text(BOMB)
    subprocess.run([gcc, "-O1", "-o", str(jail / "bomb"), str(jail / "bomb.c")], check=True,
                   timeout=TIMEOUT)
    if executor == "native":
        _native()
    proc = Sandbox(Policy(jail=str(jail), allow_bins=("./bomb",)),
                   executor=executor).spawn(["./bomb"])
    tree = _run_tree(proc.pid)
    try:
        # the namespace, from the command (the init is not dumpable: its /proc/PID/ns is
        # root's, unreadable as nobody)
        ns = os.readlink(f"/proc/{tree[2]}/ns/pid")
        assert _session(tree[2]) != _session(tree[1]) == _session(tree[0])
        deadline = time.monotonic() + TIMEOUT
        while len(processes_in_namespace(ns)) < 100:  # control: the bomb forks
            assert time.monotonic() < deadline, "the bomb never forked"
            time.sleep(0.05)
        _, _, timed_out = proc.finish(timeout=2)
        assert timed_out and proc.returncode == -signal.SIGKILL
        assert processes_in_namespace(ns) == [], "a process of the run outlived finish()"
        assert [p for p in tree if proc_state(p) not in (None, "Z")] == [], "a helper is left"
    finally:
        resume_and_kill(tree)


# --- the spawning thread's exit ---------------------------------------------------------------

@pytest.mark.parametrize("warm", [False, True], ids=["no-spare", "ready-spare"])
def test_a_run_outlives_the_thread_that_spawned_it(jail: Path, warm: bool) -> None:
    """Documented behaviour: a run belongs to the runtime process, not to a thread. The
    kernel's PDEATHSIG follows the parent *thread*, so without care a run spawned from a
    worker thread would die with it, and one handed to a ready spare would not."""
    sb = Sandbox(Policy(jail=str(jail)), executor=_native() if warm else None)
    if warm:
        _ready_spares(sb)
    else:
        native.spares.clear()
    box: dict[str, object] = {}
    t = threading.Thread(target=lambda: box.setdefault("proc", sb.spawn(
        ["sh", "-c", "sleep 1; echo done"], stdout=subprocess.PIPE)))
    t.start()
    t.join(TIMEOUT)
    assert not t.is_alive()
    proc = box["proc"]
    out, _ = proc.communicate(timeout=TIMEOUT)  # type: ignore[attr-defined]
    assert (proc.returncode, out) == (0, b"done\n")  # type: ignore[attr-defined]


def test_a_run_dropped_without_a_wait_goes_on_and_is_reaped(jail: Path) -> None:
    """As with Popen, dropping the handle does not end the run; unlike a dropped Popen it
    leaves no zombie: the reaper reaps its monitor when it ends."""
    import gc
    proc = Sandbox(Policy(jail=str(jail))).spawn(["sh", "-c", "sleep 0.5; echo x > done"])
    monitor = proc.pid
    del proc
    gc.collect()
    deadline = time.monotonic() + TIMEOUT
    while not (jail / "done").exists():  # it went on
        assert time.monotonic() < deadline, "the dropped run was ended"
        time.sleep(0.02)
    assert _left([monitor]) == [], "the monitor stayed (a zombie)"


# --- an interrupt while a run is handed back --------------------------------------------------

#: Where a ^C (KeyboardInterrupt) can land once the command may have been exec'd and before
#: Sandbox.spawn returns the SandboxProcess that would own it: the exec's confirmation read,
#: the seccomp listener's hand-over, the run's streams opened, its observers attached.
_HAND_BACK_POINTS = ("exec-confirmed", "listener", "streams", "observers")


def _records() -> set[str]:
    """The names of this process's pending-sweep records (hcp_linux.policy.protected.pending)."""
    from hcp_linux.policy.protected.pending import _me
    from hcp_linux.runtime_files import pending_directory
    where = pending_directory()
    mine = f"{_me()}-"
    return {n for n in os.listdir(where) if n.startswith(mine)} if where and \
        os.path.isdir(where) else set()


@pytest.mark.parametrize("point", [*_HAND_BACK_POINTS, "control"])
def test_an_interrupt_before_spawn_returns_ends_the_run_and_sweeps_it(
        jail: Path, point: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """^C at each point between the exec and the hand-back, once the command has planted a
    protected name (``.envrc``, seen on the host): KeyboardInterrupt reaches the caller, and
    the run it never got is ended as a run's end does: its command gone, its monitor reaped
    (no zombie of the runtime's), the planted name swept, the sweep's record removed. Before,
    an interrupt there left the command running and its monitor a zombie, or killed it and
    removed the record unswept: the ``.envrc`` stayed for the host's direnv. Control: nothing
    interrupted, the same run killed by its owner ends the same way."""
    from hcp_linux.run import executor
    from hcp_linux.conformance.observers import processes_with
    needle = f"{time.monotonic_ns() % 10**9}.25"  # a unique sleep, found by its argv
    planted = jail / ".envrc"
    started: list[int] = []
    start = executor._start
    records = _records()

    def recorded(*a, **k):  # type: ignore[no-untyped-def]
        out = start(*a, **k)
        started.append(out[0])
        return out

    def interrupting(real):  # type: ignore[no-untyped-def]
        def call(*a, **k):  # type: ignore[no-untyped-def]
            out = real(*a, **k)
            if out == b"" or point != "exec-confirmed":  # the exec's EOF, not a record
                deadline = time.monotonic() + TIMEOUT
                while not planted.exists():  # the command's first act, on the host
                    assert time.monotonic() < deadline, "the command never planted"
                    time.sleep(0.005)
                raise KeyboardInterrupt
            return out
        return call

    monkeypatch.setattr(executor, "_start", recorded)
    target = {"exec-confirmed": (teardown, "read_to_eof"),
              "listener": (executor, "receive_listener"),
              "streams": (executor, "_open_streams"),
              "observers": (executor, "denial_layers")}.get(point)
    if target is not None:
        monkeypatch.setattr(*target, interrupting(getattr(*target)))
    argv = ["/bin/sh", "-c", f"touch .envrc; exec sleep {needle}"]
    sb = Sandbox(Policy(jail=str(jail)))
    if target is None:
        proc = sb.spawn(argv)
        try:
            wait_for_planted = time.monotonic() + TIMEOUT
            while not (planted.exists() and processes_with(needle)):
                assert time.monotonic() < wait_for_planted, "the control never planted"
                time.sleep(0.005)
        finally:
            proc.kill()
            proc.wait()
    else:
        with pytest.raises(KeyboardInterrupt):
            sb.spawn(argv)
    assert started, "no attempt was started"
    deadline = time.monotonic() + 15
    while processes_with(needle) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not processes_with(needle), "the interrupted run's command is still running"
    assert _left(started) == [], "a monitor of the run is left (running or a zombie)"
    assert not planted.exists(), "what the run planted was not swept"
    assert _records() == records, "the run's sweep record was left"


@pytest.mark.parametrize("how", ["interrupt-as-it-returns", "start-failed"])
def test_a_start_whose_pid_is_lost_keeps_the_runs_sweep_record(
        jail: Path, how: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """^C as the call that starts hcp-exec returns (CPython raises it there, before the pid
    is stored): the run goes on unowned, and the spawn cannot tell whether one started, so
    the record of its sweep stays for a later run once this runtime is gone (before, it was
    removed: a command that went on to plant a protected name kept it). Control: a start
    that fails by itself (OSError: nothing was started) removes the record."""
    from hcp_linux.run import executor
    records = _records()
    leaked: list[int] = []
    start = executor._start

    def failing(*a, **k):  # type: ignore[no-untyped-def]
        if how == "start-failed":
            raise OSError(12, "injected: cannot start")
        leaked.append(start(*a, **k)[0])
        raise KeyboardInterrupt

    monkeypatch.setattr(executor, "_start", failing)
    with pytest.raises(KeyboardInterrupt if how != "start-failed" else OSError):
        Sandbox(Policy(jail=str(jail))).spawn(["sleep", "30"])
    kept = _records() - records
    try:
        if how == "start-failed":
            assert kept == set(), kept
        else:
            assert len(kept) == 1, kept  # the run's: a later run's collection sweeps it
    finally:  # what the test leaked: the run (by the pid its start returned), the record
        for pid in leaked:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        from hcp_linux.policy.protected.pending import paid
        from hcp_linux.runtime_files import pending_directory
        for name in kept:
            paid(os.path.join(pending_directory() or "", name))


def test_an_interrupt_while_a_failed_setup_is_waited_for_leaves_no_zombie(
        jail: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A setup step failed (the command's interpreter is missing: step execve) and ^C comes
    while the runtime waits for the monitor to exit after its report: KeyboardInterrupt
    reaches the caller, and the reaper still reaps the monitor (before, it stayed a zombie of
    the runtime's). Control: the same failure, not interrupted, is the usual error."""
    from hcp_linux.errors import SandboxError
    from hcp_linux.run import executor
    script = jail / "script"
    script.write_text("#!/nonexistent/interpreter\n")
    script.chmod(0o755)
    started: list[int] = []
    start = executor._start

    def recorded(*a, **k):  # type: ignore[no-untyped-def]
        out = start(*a, **k)
        started.append(out[0])
        return out

    monkeypatch.setattr(executor, "_start", recorded)
    sb = Sandbox(Policy(jail=str(jail)))
    with pytest.raises(SandboxError):  # control: the failure itself
        sb.run([str(script)], timeout=TIMEOUT)
    assert _left(started) == []
    started.clear()
    wait = teardown.Monitor.wait

    def interrupted(self, timeout):  # type: ignore[no-untyped-def]
        monkeypatch.setattr(teardown.Monitor, "wait", wait)  # once
        raise KeyboardInterrupt

    monkeypatch.setattr(teardown.Monitor, "wait", interrupted)
    with pytest.raises(KeyboardInterrupt):
        sb.run([str(script)], timeout=TIMEOUT)
    assert started, "no attempt was started"
    assert _left(started) == [], "the failed setup's monitor stayed (a zombie)"
