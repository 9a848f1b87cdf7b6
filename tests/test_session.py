"""Sessions: one lasting confinement that many commands run in (hcp_linux.session).

Each command of a session must be confined exactly as a run of its own is: every denial here
is done for real by the command and checked absent on the host, with a control that the same
action succeeds unconfined. And the session's own machinery must fail closed: a zygote
killed, stopped or left behind ends the session and everything in it (checked in the host's
process table). Runs under both executors and as root and nobody like the rest of the suite.
"""
from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from hcp_linux import Policy, Sandbox
from hcp_linux.errors import NotAllowlistedError
from hcp_linux.session import Session, SessionEnded
from hcp_linux.conformance.observers import processes_with
from sandboxing import TIMEOUT, jail, outside, wait_for  # noqa: F401

pytestmark = pytest.mark.skipif(not os.path.exists("/usr/bin/python3"),
                                reason="a session's zygote runs the system's python3")


@pytest.fixture
def session(jail: Path):
    s = Session(Sandbox(Policy(jail=str(jail))))
    yield s
    s.close()


def _token() -> str:
    return f"hcp-session-test-{os.getpid()}-{time.monotonic_ns()}"


def _bg(token: str) -> str:
    """Shell text that leaves a process (a subshell whose command line holds ``token``) in
    the background, its output off the command's pipes."""
    return f"(sleep 300; : {token}) >/dev/null 2>&1 &"


def _alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_commands_run_and_report_like_subprocess(session: Session) -> None:
    r = session.run(["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert (r.returncode, r.stdout, r.stderr, r.timed_out) == (3, b"out\n", b"err\n", False)
    r = session.run(["sh", "-c", "kill -TERM $$"])
    assert r.returncode == -signal.SIGTERM
    r = session.run(["sh", "-c", 'echo "$HCP_SANDBOX $PWD"'])
    assert r.stdout.decode().split() == ["sandbox", session.policy.jail]


def test_each_command_is_confined_as_a_run_of_its_own(session: Session, jail: Path,
                                                      outside: Path) -> None:
    target = outside / "escape.txt"
    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen(1)
    lst.setblocking(False)
    port = lst.getsockname()[1]
    script = (f"import os, socket\n"
              f"try:\n    open({str(target)!r}, 'w').write('x'); print('write ok')\n"
              f"except OSError as e:\n    print('write', e.errno)\n"
              f"s = socket.socket()\nprint('connect', s.connect_ex(('127.0.0.1', {port})))\n"
              f"import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
              f"print('unshare', libc.unshare(0x10000000), ctypes.get_errno())\n")
    try:
        r = session.run(["python3", "-c", script])
        lines = r.stdout.decode().splitlines()
        assert lines[0] == f"write {errno.ENOENT}", r  # the outside is not in the view
        assert lines[1] in (f"connect {errno.ECONNREFUSED}", f"connect {errno.ENETUNREACH}"), r
        assert lines[2] == f"unshare -1 {errno.EPERM}", r
        assert not target.exists()
        with pytest.raises(BlockingIOError):
            lst.accept()
        # control: unconfined, the same script writes and connects
        c = subprocess.run(["/usr/bin/python3", "-c", script], capture_output=True,
                           timeout=TIMEOUT)
        assert c.stdout.decode().splitlines()[:2] == ["write ok", "connect 0"]
        assert target.exists()
    finally:
        lst.close()


def test_the_allow_list_is_asked_for_every_command(jail: Path) -> None:
    marker = jail / "ran"
    with Session(Sandbox(Policy(jail=str(jail), allow_bins=("echo",)))) as s:
        assert s.run(["echo", "yes"]).stdout == b"yes\n"
        with pytest.raises(NotAllowlistedError):
            s.run(["sh", "-c", f"touch {marker}"])
        assert not marker.exists()
        # the zygote itself is not held to the list: it is ours, and it is still there
        assert s.alive and s.run(["echo", "again"]).returncode == 0


def test_commands_share_the_sessions_tmp(session: Session) -> None:
    assert session.run(["sh", "-c", "echo kept > /tmp/shared"]).returncode == 0
    assert session.run(["cat", "/tmp/shared"]).stdout == b"kept\n"


def test_what_a_command_leaves_in_its_group_is_killed(jail: Path) -> None:
    token = _token()
    with Session(Sandbox(Policy(jail=str(jail)))) as s:
        r = s.run(["sh", "-c", f"{_bg(token)} echo started"])
        assert r.stdout == b"started\n"
        wait_for(lambda: not processes_with(token), "the background sleep to be killed")
    # control: with on_exit = "wait" it is left running (the session's end kills it)
    with Session(Sandbox(Policy(jail=str(jail), on_exit="wait"))) as s:
        r = s.run(["sh", "-c", f"{_bg(token)} echo started"])
        time.sleep(0.5)
        assert processes_with(token), "on_exit=wait: the background process should live on"
    wait_for(lambda: not processes_with(token), "the session's end to kill it")


def test_timeout_kills_the_command_group(session: Session) -> None:
    token = _token()
    r = session.run(["sh", "-c", f"sleep 300; echo never {token}"], timeout=0.5)
    assert r.timed_out and r.returncode == -signal.SIGKILL and r.stdout == b""
    assert not processes_with(token)
    assert session.alive and session.run(["true"]).returncode == 0


def test_output_is_capped(session: Session) -> None:
    r = session.run(["sh", "-c", "head -c 100000 /dev/zero"], output_cap=1000)
    assert r.truncated and len(r.stdout) == 1000 and r.returncode == 0


def test_a_failed_exec_is_reported(session: Session, jail: Path) -> None:
    """The plan checks what it can (exists, executable); an exec that still fails inside
    (here: a script whose interpreter is not in the view) is the zygote's to report."""
    script = jail / "orphan-script"
    script.write_text("#!/nonexistent/interpreter\n")
    os.chmod(script, 0o755)
    with pytest.raises(OSError) as info:
        session.run([str(script)])
    assert info.value.errno == errno.ENOENT
    assert session.alive and session.run(["true"]).returncode == 0


def test_the_zygote_cannot_be_reached_by_its_commands(session: Session) -> None:
    """Not dumpable: a command (same uid, no capability) can neither ptrace it nor take its
    control socket; its own /proc entries stay readable (the control)."""
    script = ("import os, ctypes\npp = os.getppid()\n"
              "libc = ctypes.CDLL(None, use_errno=True)\n"
              "def tr(name, f):\n"
              "    try:\n        f(); print(name, 0)\n"
              "    except OSError as e:\n        print(name, e.errno)\n"
              "tr('environ', lambda: open(f'/proc/{pp}/environ').read())\n"
              "tr('fd', lambda: os.readlink(f'/proc/{pp}/fd/3'))\n"
              "tr('self', lambda: os.readlink('/proc/self/fd/0'))\n"
              "pidfd = libc.syscall(434, pp, 0)\n"
              "print('getfd', libc.syscall(438, pidfd, 3, 0), ctypes.get_errno())\n"
              "print('ptrace', libc.syscall(101, 16, pp, 0, 0), ctypes.get_errno())\n")
    r = session.run(["python3", "-c", script])
    got = dict(line.split(" ", 1) for line in r.stdout.decode().splitlines())
    assert got["environ"] in (str(errno.EACCES), str(errno.EPERM)), r
    assert got["fd"] in (str(errno.EACCES), str(errno.EPERM)), r
    assert got["self"] == "0", r
    assert got["getfd"].startswith("-1 "), r
    assert got["ptrace"].startswith("-1 "), r


def test_a_killed_zygote_ends_the_session_and_everything_in_it(jail: Path) -> None:
    token = _token()
    s = Session(Sandbox(Policy(jail=str(jail), on_exit="wait")))
    try:
        zygote = s.zygote_pid
        assert _alive(zygote)
        s.run(["sh", "-c", f"{_bg(token)} exit 0"])
        assert processes_with(token)
        with pytest.raises(SessionEnded):
            s.run(["sh", "-c", "kill -9 $PPID; sleep 30"])
        assert not s.alive
        wait_for(lambda: not processes_with(token) and not _alive(zygote),
                 "the session's processes to be gone")
        with pytest.raises(SessionEnded):
            s.run(["true"])
    finally:
        s.close()


def test_a_stopped_zygote_fails_closed(jail: Path) -> None:
    token = _token()
    s = Session(Sandbox(Policy(jail=str(jail), on_exit="wait")))
    try:
        s.run(["sh", "-c", f"{_bg(token)} exit 0"])
        assert s.zygote_pid is not None
        os.kill(s.zygote_pid, signal.SIGSTOP)
        with pytest.raises(SessionEnded, match="did not start"):
            s.run(["true"], timeout=1)
        assert not s.alive
        wait_for(lambda: not processes_with(token) and not _alive(s.zygote_pid),
                 "the stopped session to be killed")
    finally:
        s.close()


def test_close_ends_every_command(jail: Path) -> None:
    import threading
    token = _token()
    s = Session(Sandbox(Policy(jail=str(jail))))
    errors: list[BaseException] = []

    def long_run() -> None:
        try:
            s.run(["sh", "-c", f"sleep 300; : {token}"])
        except BaseException as e:  # noqa: BLE001 - recorded for the assertion
            errors.append(e)

    t = threading.Thread(target=long_run)
    t.start()
    wait_for(lambda: processes_with(token), "the command to start")
    s.close()
    t.join(TIMEOUT)
    assert not t.is_alive()
    assert errors and isinstance(errors[0], SessionEnded)
    wait_for(lambda: not processes_with(token), "the command to be gone")
