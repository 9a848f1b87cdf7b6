"""Nothing outlives its run, nothing exhausts the host.

Survival is observed, not inferred: a daemon (double-forked, setsid'd) appends to a heartbeat
file in the jail; after the run ends the file must stop growing. Each kill path has its
negative control: the same daemon started without the sandbox keeps beating (and is then
killed by the pid it recorded). Resource tests are bounded: small limits, small payloads.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from hcp_linux import Policy, Sandbox
from hcp_linux.proc import teardown

TIMEOUT = 60
DAEMON = ("setsid sh -c 'echo $$ > daemon.pid; "
          "while :; do echo x >> beat; sleep 0.05; done' </dev/null >/dev/null 2>&1 &")


def _wait_for(path: Path, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.stat().st_size > 0):
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} never appeared")
        time.sleep(0.02)


def _beating(beat: Path, window: float = 0.6) -> bool:
    """Whether something still appends to ``beat``, watched for ``window`` seconds."""
    before = beat.stat().st_size if beat.exists() else 0
    time.sleep(window)
    return (beat.stat().st_size if beat.exists() else 0) > before


def _kill_recorded(pidfile: Path) -> None:
    pid = int(pidfile.read_text())
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.fixture
def jail(tmp_path: Path) -> Path:
    d = tmp_path / "jail"
    d.mkdir()
    return d


def _sandbox(jail: Path, **kw) -> Sandbox:
    return Sandbox(Policy(jail=str(jail), **kw))


# --- the tree dies with the run ------------------------------------------------------------

def test_control_daemon_survives_an_unconfined_command(jail: Path) -> None:
    subprocess.run(["sh", "-c", DAEMON + " sleep 0.2"], cwd=jail, timeout=TIMEOUT, check=True)
    try:
        _wait_for(jail / "beat")
        assert _beating(jail / "beat"), "control: the daemon should outlive plain subprocess"
    finally:
        _kill_recorded(jail / "daemon.pid")


def test_daemon_dies_when_the_command_exits(jail: Path) -> None:
    run = _sandbox(jail).run(["sh", "-c", DAEMON + " sleep 0.3"], timeout=TIMEOUT)
    assert run.returncode == 0
    assert (jail / "beat").exists(), "the daemon ran inside the sandbox"
    assert not _beating(jail / "beat")


def _our_child(pid: int) -> bool:
    """Whether ``pid`` is still a child of this process (running, or a zombie unreaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1]) == os.getpid()
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_the_monitor_is_reaped_after_the_run(jail: Path) -> None:
    """wait() returns as soon as the sandbox's init reports that the command and all it
    started are gone, before the namespaces are torn down; the monitor, which tears them
    down, is then reaped in the background: no zombie is left behind."""
    proc = _sandbox(jail).spawn(["sh", "-c", DAEMON + " sleep 0.2"])
    assert proc.wait(TIMEOUT) == 0
    assert not _beating(jail / "beat", window=0.3)
    deadline = time.monotonic() + 10
    while _our_child(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not _our_child(proc.pid), "the monitor was left unreaped"


def test_a_forked_runtime_reaps_its_own_monitors(jail: Path) -> None:
    """The reaper belongs to the process that started it: a fork of the runtime (whose copy
    of the reaper's thread does not exist) runs and reaps on its own."""
    assert _sandbox(jail).run(["true"], timeout=TIMEOUT).returncode == 0  # reaper started
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit status
        code = 1
        try:
            proc = _sandbox(jail).spawn(["true"])
            if proc.wait(TIMEOUT) == 0:
                deadline = time.monotonic() + 10
                while _our_child(proc.pid) and time.monotonic() < deadline:
                    time.sleep(0.01)
                code = 0 if not _our_child(proc.pid) else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_on_exit_wait_waits_for_the_tree(jail: Path) -> None:
    script = "(sleep 0.5; echo done > late) & echo main"
    waited = _sandbox(jail, on_exit="wait").run(["sh", "-c", script], capture_output=True,
                                                timeout=TIMEOUT)
    assert waited.returncode == 0 and waited.stdout == b"main\n"
    assert (jail / "late").read_text() == "done\n"
    (jail / "late").unlink()
    killed = _sandbox(jail).run(["sh", "-c", script], timeout=TIMEOUT)
    assert killed.returncode == 0
    time.sleep(0.8)
    assert not (jail / "late").exists(), "default on_exit=kill: the background job died"


def test_timeout_kills_the_tree(jail: Path) -> None:
    run = _sandbox(jail).run(["sh", "-c", DAEMON + " sleep 30"], timeout=1)
    assert run.timed_out and run.returncode == -signal.SIGKILL
    assert not _beating(jail / "beat")


def test_cancel_kills_the_tree(jail: Path) -> None:
    proc = _sandbox(jail).spawn(["sh", "-c", DAEMON + " sleep 30"])
    _wait_for(jail / "beat")
    proc.kill()
    assert proc.wait(TIMEOUT) == -signal.SIGKILL
    assert not _beating(jail / "beat")


def test_terminate_reaches_the_command_gracefully(jail: Path) -> None:
    script = "trap 'echo term > got; exit 3' TERM; echo ready > ready; while :; do sleep 0.05; done"
    proc = _sandbox(jail).spawn(["sh", "-c", script])
    _wait_for(jail / "ready")
    proc.terminate()
    assert proc.wait(TIMEOUT) == 3
    assert (jail / "got").read_text() == "term\n"


_RUNTIME = textwrap.dedent("""
    import subprocess, sys, time
    jail, confined = sys.argv[1], sys.argv[2] == "1"
    daemon = sys.argv[3]
    if confined:
        from hcp_linux import Policy, Sandbox
        Sandbox(Policy(jail=jail)).spawn(["sh", "-c", daemon + " sleep 60"])
    else:
        subprocess.Popen(["sh", "-c", daemon + " sleep 60"], cwd=jail, start_new_session=True)
    print("spawned", flush=True)
    time.sleep(60)
""")


@pytest.mark.parametrize("confined", [True, False], ids=["sandbox", "control-unconfined"])
def test_runtime_killed_mid_run_leaves_no_survivor(jail: Path, confined: bool) -> None:
    runtime = subprocess.Popen([sys.executable, "-c", _RUNTIME, str(jail), "1" if confined else "0",
                                DAEMON], stdout=subprocess.PIPE, text=True)
    try:
        assert runtime.stdout is not None and runtime.stdout.readline() == "spawned\n"
        _wait_for(jail / "beat")
        os.kill(runtime.pid, signal.SIGKILL)
        runtime.wait(TIMEOUT)
        time.sleep(0.3)  # PDEATHSIG and namespace teardown are asynchronous
        if confined:
            assert not _beating(jail / "beat"), "a sandboxed daemon outlived its runtime"
        else:
            assert _beating(jail / "beat"), "control: an unconfined daemon outlives the runtime"
    finally:
        if runtime.poll() is None:
            runtime.kill()
            runtime.wait(TIMEOUT)
        if not confined and (jail / "daemon.pid").exists():
            _kill_recorded(jail / "daemon.pid")


# --- limits ---------------------------------------------------------------------------------

_FORKER = """
import os, time
n = 0
for _ in range(450):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(5)
        os._exit(0)
    n += 1
print(n)
"""


@pytest.mark.parametrize("limit, expect_all", [(350, False), (None, True)],
                         ids=["nproc=350", "control-default"])
def test_fork_bomb_is_fenced_by_nproc(jail: Path, limit: int | None, expect_all: bool) -> None:
    # 450 sleeping children: more than the fence, few enough to be harmless without it
    # (they die with the run). The fence is above the kernel's pid_max minimum (301), so it
    # is exact as root too, where RLIMIT_NPROC does not bind.
    limits = {} if limit is None else {"nproc": limit}
    run = _sandbox(jail, limits=limits).run(["python3", "-c", _FORKER], capture_output=True,
                                            timeout=TIMEOUT)
    started = int(run.stdout)
    if expect_all:
        assert started == 450, run.stderr
    else:
        assert started < limit, f"{started} processes started with nproc={limit}"  # type: ignore[operator]


@pytest.mark.parametrize("limit, ok", [("256m", False), (None, True)],
                         ids=["as=256m", "control-unlimited"])
def test_memory_balloon_is_stopped(jail: Path, limit: str | None, ok: bool) -> None:
    code = "b = bytearray(512 * 1024 * 1024); print(len(b))"
    limits = {} if limit is None else {"as": limit}
    run = _sandbox(jail, limits=limits).run(["python3", "-c", code], capture_output=True,
                                            timeout=TIMEOUT)
    if ok:
        assert run.returncode == 0, run.stderr
    else:
        assert run.returncode != 0 and b"MemoryError" in run.stderr


@pytest.mark.parametrize("limit", ["1m", None], ids=["fsize=1m", "control-unlimited"])
def test_disk_fill_is_stopped_by_fsize(jail: Path, limit: str | None) -> None:
    limits = {} if limit is None else {"fsize": limit}
    run = _sandbox(jail, limits=limits).run(
        ["sh", "-c", "head -c 2000000 /dev/zero > big"], capture_output=True, timeout=TIMEOUT)
    size = (jail / "big").stat().st_size
    if limit is None:
        assert run.returncode == 0 and size == 2_000_000
    else:
        assert run.returncode != 0 and size <= 1 << 20


@pytest.mark.parametrize("tmp_size, ok", [("2m", False), (None, True)],
                         ids=["tmp_size=2m", "control-default"])
def test_private_tmp_is_capped(jail: Path, tmp_size: str | None, ok: bool) -> None:
    limits = {} if tmp_size is None else {"tmp_size": tmp_size}
    run = _sandbox(jail, limits=limits).run(
        ["sh", "-c", "head -c 4000000 /dev/zero > /tmp/big && echo written"],
        capture_output=True, timeout=TIMEOUT)
    assert (run.returncode == 0) is ok, run.stderr
    if not ok:
        assert b"No space left" in run.stderr


def test_captured_output_is_capped_without_blocking(jail: Path) -> None:
    run = _sandbox(jail, limits={"output": 1000}).run(
        ["sh", "-c", "head -c 1000000 /dev/zero; echo tail >&2"], capture_output=True,
        timeout=TIMEOUT)
    assert run.returncode == 0
    assert len(run.stdout) == 1000 and run.truncated == frozenset({"stdout"})
    assert run.stderr == b"tail\n"


def test_limits_are_in_the_receipt(jail: Path) -> None:
    run = _sandbox(jail, limits={"nproc": 64, "fsize": "10m"}).run(["true"], timeout=TIMEOUT)
    limits = run.receipt["limits"]
    assert limits["rlimits"]["nproc"] == 64 and limits["rlimits"]["fsize"] == 10 << 20
    assert limits["rlimits"]["core"] == 0
    assert limits["cgroup"]  # applied or, with the reason, not


@pytest.mark.parametrize("limits, culprit", [
    ({"nproc": 0}, "limits.nproc"), ({"fsize": "lots"}, "limits.fsize"),
    ({"bogus": 1}, "bogus"), ({"tmp_size": None}, "limits.tmp_size"),
])
def test_bad_limits_are_refused_before_anything_runs(jail: Path, limits: dict,
                                                     culprit: str) -> None:
    from hcp_linux import PolicyError
    with pytest.raises(PolicyError, match=culprit):
        Policy(jail=str(jail), limits=limits)


def test_cgroup_limits_fail_closed_where_they_cannot_apply(jail: Path) -> None:
    from hcp_linux import PolicyError
    from hcp_linux.policy.limits import cgroup_v2_status
    status = cgroup_v2_status()
    if status.startswith("available") and "not yet applied" not in status:
        pytest.skip("this host has a delegated cgroup v2")
    with pytest.raises(PolicyError, match="not supported in this version"):
        Sandbox(Policy(jail=str(jail), limits={"memory": "1g"}))



#: A runtime whose forks of the sandbox's init (ctypes executor: os.fork, which runs the
#: at-fork hooks) wait a second before the child side goes on: the window between the fork
#: and the init's PR_SET_PDEATHSIG, held open so that the test can kill the runtime in it.
#: Only the init waits: it is the fork whose parent is not visible (getppid() 0, the parent
#: is outside its new pid namespace); the monitor, forked from the runtime, does not.
_SLOW_INIT_RUNTIME = textwrap.dedent("""
    import os, sys, time
    from hcp_linux import Policy, Sandbox
    os.register_at_fork(after_in_child=lambda: time.sleep(1.0) if os.getppid() == 0 else None)
    proc = Sandbox(Policy(jail=sys.argv[1]), executor="ctypes").spawn(
        ["sh", "-c", sys.argv[2] + " sleep 60"])
    print("spawned", flush=True)
    proc.wait()
""")


def _grandchildren(pid: int) -> list[int]:
    out: list[int] = []
    for child in teardown._children(pid):
        out += teardown._children(child)
    return out


@pytest.mark.parametrize("kill", [True, False], ids=["killed", "control-not-killed"])
def test_runtime_killed_before_the_init_sets_pdeathsig(jail: Path, kill: bool) -> None:
    """The monitor dies (PDEATHSIG, its runtime SIGKILLed) after forking the sandbox's init
    and before the init's own PR_SET_PDEATHSIG: no signal reaches the init then. It used to
    go on and run the command with nobody left to end it (2 of 60 CLI runs killed early, in
    tests/test_driver_none.py's loop). The init now checks, after that prctl, that the
    monitor still holds its end of the status pipe, and exits. Control: the same held-open
    window without the kill, and the run goes on (the daemon beats). The window is held open
    in the ctypes executor, whose init is a Python fork; hcp-exec's init makes the same check
    (hcp_exec.c monitor_alive), in a window no test can hold open."""
    runtime = subprocess.Popen([sys.executable, "-c", _SLOW_INIT_RUNTIME, str(jail), DAEMON],
                               stdout=subprocess.PIPE, text=True)
    inits: list[int] = []
    try:
        deadline = time.monotonic() + TIMEOUT
        while not inits:  # the init exists, asleep before its prctl
            assert runtime.poll() is None and time.monotonic() < deadline, "no init forked"
            inits = _grandchildren(runtime.pid)
            time.sleep(0.005)
        if kill:
            os.kill(runtime.pid, signal.SIGKILL)
            runtime.wait(TIMEOUT)
            time.sleep(2.0)  # the init's held-open second, then its setup
            assert not (jail / "beat").exists() or not _beating(jail / "beat"), \
                "the sandbox's init outlived its monitor and ran the command"
        else:
            assert runtime.stdout is not None and runtime.stdout.readline() == "spawned\n"
            _wait_for(jail / "beat")
            assert _beating(jail / "beat")
    finally:
        if runtime.poll() is None:
            runtime.kill()
            runtime.wait(TIMEOUT)
        for pid in inits:  # an init that outlived its monitor (the failure): end its sandbox
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
