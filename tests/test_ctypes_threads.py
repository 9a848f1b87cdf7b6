"""The ctypes executor in a threaded runtime: no Python runs in a fork of a threaded process.

Observed from outside, on real processes: the run's monitor (the process that ran the
child-side steps) is a fresh ``sys.executable -I -S`` helper with one thread when the
runtime has other threads (Python and C), and a fork of the runtime (its very command line)
only when the runtime had one thread: the negative control that shows the observation can
tell the two apart. Then runs from a runtime with 8 busy threads and a C thread, the setup
failure, timeout and kill paths, and the helper's own faults: stopped or killed mid-setup,
its runtime killed mid-setup, an interpreter that cannot start or cannot import us.
"""
from __future__ import annotations

import ctypes
import errno
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Iterator

import pytest

from hcp_linux import Policy, Sandbox
from hcp_linux.ctypes_executor import child_main
from hcp_linux.proc import teardown
from hcp_linux.errors import BinNotFoundError, ChildSetupError, SetupTimeoutError
from hcp_linux.policy.resolve import resolve
from sandboxing import (TIMEOUT, jail, pid_alive, processes_with, ro_root,  # noqa: F401
                        sleep_token, wait_for)

ROOT = Path(__file__).resolve().parent.parent


def _cmdline(pid: int) -> bytes:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read()


def _threads_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(f.read().split("\nThreads:")[1].split()[0])


def _children(pid: int) -> list[int]:
    """Children of every thread of ``pid`` (a child started by the launcher thread is that
    thread's, in /proc)."""
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(x) for x in f.read().split()]
        except OSError:
            pass
    return out


# --- a C thread, started through libc (not a Python thread: /proc/self/task shows it) --------

class CThread:
    """A thread Python does not know of: pthread_create(sleep, 10000); cancelled at close."""

    def __init__(self) -> None:
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.tid = ctypes.c_ulong()
        start = ctypes.cast(self.libc.sleep, ctypes.c_void_p)
        rc = self.libc.pthread_create(ctypes.byref(self.tid), None, start, ctypes.c_void_p(10000))
        assert rc == 0, os.strerror(rc)

    def close(self) -> None:
        assert self.libc.pthread_cancel(self.tid) == 0  # sleep() is a cancellation point
        assert self.libc.pthread_join(self.tid, None) == 0


@pytest.fixture
def busy_runtime() -> Iterator[None]:
    """This process with 8 Python threads spinning and one C thread: 10+ tasks."""
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass
    spinners = [threading.Thread(target=spin, daemon=True) for _ in range(8)]
    # The spinners hold the GIL in turn; with the default 5 ms switch interval the main thread
    # waits ~40 ms for it after every blocking call, and one test took ~100 s. 0.5 ms keeps all
    # eight spinning (the helper still forks from a runtime whose threads run Python at that
    # moment) at a tenth of the wait.
    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.0005)
    for t in spinners:
        t.start()
    c_thread = CThread()
    before = child_main.threads()
    try:
        assert before >= 10, before
        yield
    finally:
        stop.set()
        for t in spinners:
            t.join()
        sys.setswitchinterval(interval)
        c_thread.close()


# --- who runs the steps ------------------------------------------------------------------------

RUNTIME = r"""
import os, sys, threading, ctypes
sys.path.insert(0, sys.argv[3])
from hcp_linux import Policy, Sandbox
jail, threads, token = sys.argv[1], int(sys.argv[2]), sys.argv[4]
if threads:
    ev = threading.Event()
    for _ in range(threads):
        threading.Thread(target=ev.wait, daemon=True).start()
    libc = ctypes.CDLL(None)
    tid = ctypes.c_ulong()
    assert libc.pthread_create(ctypes.byref(tid), None,
                               ctypes.cast(libc.sleep, ctypes.c_void_p), ctypes.c_void_p(600)) == 0
print(len(os.listdir("/proc/self/task")), flush=True)
p = Sandbox(Policy(jail=jail), executor="ctypes").spawn(["/bin/sleep", token])
print(p.pid, flush=True)
sys.stdin.read()  # until the test has looked
p.kill()
p.wait()
"""


@pytest.mark.parametrize("threads", [8, 0], ids=["threaded-runtime", "control-one-thread"])
def test_the_steps_run_in_a_fresh_helper_unless_the_runtime_has_one_thread(
        jail: Path, threads: int) -> None:
    token = sleep_token(60)
    runtime = subprocess.Popen([sys.executable, "-c", RUNTIME, str(jail), str(threads),
                                str(ROOT), token], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    try:
        tasks = int(runtime.stdout.readline())  # type: ignore[union-attr]
        monitor = int(runtime.stdout.readline())  # type: ignore[union-attr]
        assert monitor in _children(runtime.pid)  # a direct child of the runtime, either way
        theirs, ours = _cmdline(monitor), _cmdline(runtime.pid)
        if threads:
            assert tasks >= 10  # 8 Python threads, a C thread, the main thread
            args = theirs.split(b"\0")
            assert args[0] == os.fsencode(sys.executable) and args[1:4] == [b"-I", b"-S", b"-c"]
            assert child_main.MARKER.encode() in args and theirs != ours
            assert _threads_of(monitor) == 1
        else:
            assert tasks == 1
            assert theirs == ours  # a fork of the runtime: safe, nothing else ran in it
        assert processes_with(token)  # the command runs
    finally:
        runtime.communicate("", timeout=TIMEOUT)
    assert runtime.returncode == 0
    assert not processes_with(token)


@pytest.mark.skipif(sys.version_info < (3, 12), reason="CPython warns of a threaded fork from 3.12")
@pytest.mark.parametrize("start", ["helper", "control-forced-fork"])
def test_cpython_sees_no_fork_of_a_threaded_runtime(jail: Path, start: str, busy_runtime: None,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """CPython's own detector (3.12+: a DeprecationWarning when os.fork() runs while the
    process has other threads, counted by the kernel) says nothing of a run from a busy
    runtime; the control, the old behaviour (a fork whatever the threads, forced here),
    trips it."""
    if start != "helper":
        monkeypatch.setattr(child_main, "threads", lambda: 1)
    sb = Sandbox(Policy(jail=str(jail)), executor="ctypes")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DeprecationWarning)
        r = sb.run(["/bin/true"], timeout=TIMEOUT)
    assert r.returncode == 0
    forks = [w for w in caught if issubclass(w.category, DeprecationWarning)
             and "multi-threaded" in str(w.message) and "fork()" in str(w.message)]
    assert bool(forks) == (start != "helper"), [str(w.message) for w in caught]


# --- runs from a busy runtime ------------------------------------------------------------------

def test_runs_from_a_busy_runtime_succeed_repeatedly(jail: Path, busy_runtime: None) -> None:
    sb = Sandbox(Policy(jail=str(jail)), executor="ctypes")
    (jail / "noint").write_text("#!/nonexistent/interpreter\n")
    (jail / "noint").chmod(0o755)
    for i in range(5):
        r = sb.run(["/bin/echo", f"run {i}"], capture_output=True, timeout=TIMEOUT)
        assert (r.returncode, r.stdout, r.stderr) == (0, f"run {i}\n".encode(), b"")
        assert r.receipt["end"] == {"by": "exit"}
        # a setup failure inside the helper: execve ENOENT, reported on the error pipe
        with pytest.raises(BinNotFoundError, match="interpreter must be inside"):
            sb.run(["./noint"], timeout=TIMEOUT)


def test_the_confinement_holds_from_a_busy_runtime(jail: Path, ro_root: Path,
                                                   busy_runtime: None) -> None:
    """What the helper installs is in force in the command: no_new_privs, seccomp, no
    capabilities, and a read-only root that refuses a write (absent on the host after),
    while the same write, unconfined, lands (control)."""
    sb = Sandbox(Policy(jail=str(jail), read_only_roots=(str(ro_root),)), executor="ctypes")
    target = ro_root / "written"
    script = f"grep -E '^(NoNewPrivs|Seccomp|CapEff):' /proc/self/status; echo x > {target}"
    r = sb.run(["/bin/sh", "-c", script], capture_output=True, timeout=TIMEOUT)
    lines = r.stdout.decode().split("\n")
    assert "NoNewPrivs:\t1" in lines and "Seccomp:\t2" in lines
    assert "CapEff:\t0000000000000000" in lines
    assert r.returncode != 0 and b"Read-only file system" in r.stderr
    assert not target.exists()
    control = subprocess.run(["/bin/sh", "-c", f"echo x > {target}"], timeout=TIMEOUT)
    assert control.returncode == 0 and target.read_text() == "x\n"


def test_landlock_without_a_mount_view_holds_from_a_busy_runtime(jail: Path, tmp_path: Path,
                                                                 busy_runtime: None) -> None:
    """Without a mount view only Landlock fences the host's files: the ruleset the runtime
    made and checked, handed to the helper by its fd, with the rule the helper adds for
    /proc, restricts the command: a write beside the jail is refused and absent after, while
    a read of /proc/self works; the same write unconfined lands (control)."""
    from hcp_linux.run import executor
    from hcp_linux.plan.plan import compile_plan
    from hcp_linux.policy.policy import LAYERS
    beside = tmp_path / "beside"
    script = f"head -c0 /proc/self/status && echo proc-ok; touch {beside}"
    plan = compile_plan(resolve(Policy(jail=str(jail))), ["/bin/sh", "-c", script],
                        layers=frozenset(LAYERS) - {"mountns"})
    assert plan.landlock is not None and plan.late_rules
    try:
        p = executor.spawn(plan, stdout=executor.PIPE, stderr=executor.PIPE, executor="ctypes")
        out, err = p.communicate(timeout=TIMEOUT)
    finally:
        plan.close()
    assert out == b"proc-ok\n" and b"Permission denied" in err and p.returncode != 0
    assert not beside.exists()
    assert subprocess.run(["/bin/sh", "-c", f"touch {beside}"], timeout=TIMEOUT).returncode == 0
    assert beside.exists()


def test_the_command_gets_the_signal_dispositions_a_fork_would_give(jail: Path,
                                                                    busy_runtime: None) -> None:
    """posix_spawn leaves glibc's internal signals 32 and 33 ignored in the helper, and
    ignored survives execve: the helper restores the runtime's set. Compared with what
    subprocess gives the same command (SIGPIPE and SIGXFSZ at default in both)."""
    script = ["grep", "-E", "^Sig(Ign|Blk):", "/proc/self/status"]
    plain = subprocess.run(script, capture_output=True, check=True, timeout=TIMEOUT).stdout
    r = Sandbox(Policy(jail=str(jail)), executor="ctypes").run(script, capture_output=True,
                                                               timeout=TIMEOUT)
    assert r.returncode == 0 and r.stdout == plain


def test_timeout_and_kill_from_a_busy_runtime(jail: Path, busy_runtime: None) -> None:
    sb = Sandbox(Policy(jail=str(jail)), executor="ctypes")
    for _ in range(3):
        token = sleep_token(60)
        r = sb.run(["/bin/sleep", token], timeout=0.5)
        assert r.timed_out and r.returncode == -signal.SIGKILL
        assert r.receipt["end"]["by"] == "timeout"
        assert not processes_with(token)
        token = sleep_token(60)
        p = sb.spawn(["/bin/sleep", token])
        wait_for(lambda: bool(processes_with(token)), "the command")
        p.kill()
        assert p.wait(TIMEOUT) == -signal.SIGKILL
        assert p.receipt["end"]["by"] == "kill"
        assert not processes_with(token)  # the command is gone once wait() returns
        # the monitor exits after the init's report, and is reaped in the background when
        # the report came (the init was not killed before it saw the command die): wait
        # for its exit rather than catch it still on its way out
        wait_for(lambda: not pid_alive(p.pid), "the monitor to exit")


# --- the helper's faults -----------------------------------------------------------------------

def _helper_child_of(pid: int, deadline: float) -> int:
    """The helper, caught while it is still the helper (before the command's exec)."""
    while time.monotonic() < deadline:
        for c in _children(pid):
            try:
                if child_main.MARKER.encode() in _cmdline(c).split(b"\0"):
                    return c
            except OSError:
                pass
    raise AssertionError("no helper appeared")


def _in_thread(fn):  # type: ignore[no-untyped-def]
    box: dict = {}

    def run() -> None:
        try:
            box["result"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            box["error"] = e
    t = threading.Thread(target=run)
    t.start()
    return t, box


@pytest.mark.parametrize("fault", ["stop", "kill"])
def test_a_helper_stopped_or_killed_mid_setup_ends_the_run(
        jail: Path, fault: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stopped: the setup timeout kills it (SetupTimeoutError); killed: the run ends by
    SIGKILL. Either way the command never runs and the helper is gone (reaped)."""
    monkeypatch.setattr(teardown, "SETUP_TIMEOUT", 3.0)
    sb = Sandbox(Policy(jail=str(jail)), executor="ctypes")
    token = sleep_token(60)
    for _attempt in range(20):  # the helper must be caught before it execs the command
        t, box = _in_thread(lambda: sb.spawn(["/bin/sleep", token]))
        helper = _helper_child_of(os.getpid(), time.monotonic() + TIMEOUT)
        os.kill(helper, signal.SIGSTOP if fault == "stop" else signal.SIGKILL)
        t.join(TIMEOUT)
        assert not t.is_alive()
        if fault == "stop" and "result" in box:  # too late: the command ran; try again
            os.kill(helper, signal.SIGCONT)
            box["result"].kill()
            box["result"].wait()
            continue
        if fault == "stop":
            assert isinstance(box.get("error"), SetupTimeoutError)
        elif "result" in box:  # EOF on the error pipe, as for any child that died
            assert box["result"].wait(TIMEOUT) == -signal.SIGKILL
        else:
            assert isinstance(box.get("error"), ChildSetupError)
        wait_for(lambda: not pid_alive(helper), "the helper to go")
        assert not processes_with(token)
        return
    pytest.skip("the helper always reached exec before it could be stopped")


RUNTIME_DIES = r"""
import os, sys, threading
sys.path.insert(0, sys.argv[2])
from hcp_linux import Policy, Sandbox
threading.Thread(target=threading.Event().wait, daemon=True).start()
Sandbox(Policy(jail=sys.argv[1]), executor="ctypes").spawn(["/bin/sleep", sys.argv[3]])
"""


def test_a_runtime_killed_mid_setup_leaves_no_helper(jail: Path) -> None:
    """The helper, stopped mid-setup, outlives its runtime's SIGKILL; resumed, it finds its
    parent gone (PDEATHSIG, or its parent check) and exits: no orphan, no command."""
    token = sleep_token(60)
    runtime = subprocess.Popen([sys.executable, "-c", RUNTIME_DIES, str(jail), str(ROOT),
                                token])
    try:
        helper = _helper_child_of(runtime.pid, time.monotonic() + TIMEOUT)
        os.kill(helper, signal.SIGSTOP)
        os.kill(runtime.pid, signal.SIGKILL)
        runtime.wait(TIMEOUT)
        assert pid_alive(helper)  # stopped, orphaned
        os.kill(helper, signal.SIGCONT)
        wait_for(lambda: not pid_alive(helper), "the orphaned helper to exit")
        assert not processes_with(token)
    finally:
        if runtime.poll() is None:
            runtime.kill()
            runtime.wait()


def test_a_helper_that_cannot_start_fails_closed(jail: Path, busy_runtime: None,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    sb = Sandbox(Policy(jail=str(jail)), executor="ctypes")
    assert sb.run(["/bin/true"], timeout=TIMEOUT).returncode == 0  # control
    monkeypatch.setattr(sys, "executable", str(jail / "no-python"))
    with pytest.raises(ChildSetupError) as e:
        sb.run(["/bin/true"], timeout=TIMEOUT)
    assert (e.value.step, e.value.errno) == ("helper", errno.ENOENT)
    monkeypatch.setattr(sys, "executable", "")
    with pytest.raises(ChildSetupError) as e:
        sb.run(["/bin/true"], timeout=TIMEOUT)
    assert e.value.step == "helper"
    # an executable that is no Python exits without starting the helper: not an exec
    marker = jail / "ran"
    monkeypatch.setattr(sys, "executable", "/bin/true")
    with pytest.raises(ChildSetupError) as e:
        sb.run(["/bin/sh", "-c", f"touch {marker}"], timeout=TIMEOUT)
    assert e.value.step == "helper" and "exited before it ran the helper" in str(e.value)
    assert not marker.exists()


def test_a_helper_that_cannot_import_us_reports_it(jail: Path, busy_runtime: None,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """An interpreter that starts but does not find this package (here: pointed at an empty
    directory) answers on the error pipe: never read as a command that ran."""
    sb = Sandbox(Policy(jail=str(jail)), executor="ctypes")
    marker = jail / "ran"
    monkeypatch.setattr(child_main, "_ROOT", str(jail / "empty"))
    with pytest.raises(ChildSetupError) as e:
        sb.run(["/bin/sh", "-c", f"touch {marker}"], timeout=TIMEOUT)
    assert e.value.step == "helper" and "hcp_linux" in e.value.detail
    assert not marker.exists()
    monkeypatch.undo()
    assert sb.run(["/bin/sh", "-c", f"touch {marker}"], timeout=TIMEOUT).returncode == 0
    assert marker.exists()  # control: the same run, with the helper found
