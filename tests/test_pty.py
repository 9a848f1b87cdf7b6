"""`pty = true` (`--tty`): a private devpts instance, so the command can open pseudo-terminals.

Each test runs as the suite's user and, from root, as nobody (runuser); both executors through
``pytest --executor``. Negative controls: the same command without --tty (no /dev/ptmx, the
host's terminal bound into /dev/pts, SIGWINCH not passed on) and TIOCSTI outside the sandbox.
"""
from __future__ import annotations

import errno
import fcntl
import os
import shutil
import signal
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from sandboxing import (EXIT_REFUSED, IS_ROOT, TIMEOUT, as_nobody, assert_ok, caller_env,
                        deny_run_cli, hcp_argv, jail, nobody_jail, out, read_receipt, show,
                        single_error_line, var_jail)

__all__ = ["jail", "nobody_jail", "var_jail"]  # fixtures

USERS = ["self", "nobody"] if IS_ROOT else ["self"]

#: pty.fork inside; the child prints its terminal's name, the parent everything it read,
#: the child's status and /dev/pts as listed before the pty was made.
FORK = """import os, pty
before = sorted(os.listdir("/dev/pts"))
pid, fd = pty.fork()
if pid == 0:
    print("child on", os.ttyname(0), flush=True)
    os._exit(7)
data = b""
while True:
    try:
        chunk = os.read(fd, 1024)
    except OSError:
        break
    if not chunk:
        break
    data += chunk
print(repr(data), os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), before)
"""

#: What opening a pty does here: "ok" or the errno's name, for /dev/ptmx and pty.openpty.
PROBE = """import errno, os, pty
try:
    os.close(os.open("/dev/ptmx", os.O_RDWR | os.O_NOCTTY))
    print("ptmx ok")
except OSError as e:
    print("ptmx", errno.errorcode[e.errno])
try:
    pty.openpty()
    print("openpty ok")
except OSError as e:
    print("openpty", e)
print("pts", sorted(os.listdir("/dev/pts")) if os.path.isdir("/dev/pts") else "absent")
"""

#: On a pty of its own making, as its controlling terminal: TIOCSTI 'x' and what arrives.
TIOCSTI_PROBE = """import errno, fcntl, os, select, termios, tty
master, slave = os.openpty()
tty.setraw(slave)
try:
    os.setsid()
except OSError:
    pass  # the sandboxed command is a session leader already
fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
try:
    fcntl.ioctl(slave, termios.TIOCSTI, b"x")
    res = "ok"
except OSError as e:
    res = errno.errorcode[e.errno]
r, _, _ = select.select([slave], [], [], 0.2)
print(res, repr(os.read(slave, 16) if r else b""))
"""


def _prefix(user: str) -> list[str]:
    return as_nobody() if user == "nobody" else []


def _run(user: str, jail: Path, *cmd: str, tty: bool, extra: tuple = (),
         stdin: int | None = None) -> subprocess.CompletedProcess:
    argv = _prefix(user) + hcp_argv(jail, *cmd, extra=(["--tty"] if tty else []) + list(extra))
    return subprocess.run(argv, capture_output=True, timeout=TIMEOUT, cwd="/", env=caller_env(),
                          stdin=subprocess.DEVNULL if stdin is None else stdin)


@pytest.mark.parametrize("user", USERS)
def test_pty_fork_works_with_tty(user: str, nobody_jail: Path) -> None:
    p = _run(user, nobody_jail, sys.executable, "-I", "-c", FORK, tty=True)
    assert_ok(p)
    # the child ran on the instance's first pty; /dev/pts held only ptmx before it
    assert out(p) == "b'child on /dev/pts/0\\r\\n' 7 ['ptmx']\n", show(p)


@pytest.mark.parametrize("user", USERS)
def test_script_works_with_tty(user: str, nobody_jail: Path) -> None:
    script = shutil.which("script")
    if script is None:
        pytest.skip("util-linux script is not installed")
    p = _run(user, nobody_jail, script, "-qc", "tty; echo in-script", "/dev/null", tty=True)
    assert_ok(p)
    assert out(p).replace("\r", "").splitlines() == ["/dev/pts/0", "in-script"], show(p)


@pytest.mark.parametrize("user", USERS)
def test_without_tty_no_ptmx(user: str, nobody_jail: Path) -> None:
    """Today's behaviour, and why: /dev/ptmx is absent from the view (ENOENT), nothing else."""
    p = _run(user, nobody_jail, sys.executable, "-I", "-c", PROBE, tty=False)
    assert_ok(p)
    assert out(p).splitlines() == ["ptmx ENOENT", "openpty out of pty devices", "pts absent"], \
        show(p)
    with_tty = _run(user, nobody_jail, sys.executable, "-I", "-c", PROBE, tty=True)
    assert_ok(with_tty)
    assert out(with_tty).splitlines() == ["ptmx ok", "openpty ok", "pts ['0', 'ptmx']"], \
        show(with_tty)


@pytest.mark.parametrize("user", USERS)
def test_host_ptys_invisible(user: str, nobody_jail: Path) -> None:
    """A host pty as the command's stdin: bound in (and listed) without --tty; with --tty the
    private instance covers /dev/pts and lists none of the host's."""
    master, slave = os.openpty()
    try:
        host_name = os.path.basename(os.ttyname(slave))
        # another host pty, not given to the command: never visible either way
        other_m, other_s = os.openpty()
        other = os.path.basename(os.ttyname(other_s))
        try:
            assert {host_name, other} <= set(os.listdir("/dev/pts"))
            code = "import os; print(sorted(os.listdir('/dev/pts')))"
            without = _run(user, nobody_jail, sys.executable, "-I", "-c", code, tty=False,
                           stdin=slave)
            assert_ok(without)
            assert out(without) == f"[{host_name!r}]\n", show(without)
            with_tty = _run(user, nobody_jail, sys.executable, "-I", "-c", code, tty=True,
                            stdin=slave)
            assert_ok(with_tty)
            assert out(with_tty) == "['ptmx']\n", show(with_tty)
        finally:
            os.close(other_m)
            os.close(other_s)
    finally:
        os.close(master)
        os.close(slave)


@pytest.mark.parametrize("user", USERS)
def test_tiocsti_refused_on_inner_pty(user: str, nobody_jail: Path) -> None:
    p = _run(user, nobody_jail, sys.executable, "-I", "-c", TIOCSTI_PROBE, tty=True)
    assert_ok(p)
    assert out(p) == "EPERM b''\n", show(p)


def test_tiocsti_control_outside() -> None:
    legacy = Path("/proc/sys/dev/tty/legacy_tiocsti")
    if legacy.exists() and legacy.read_text().strip() == "0":
        pytest.skip("dev.tty.legacy_tiocsti=0: the kernel refuses TIOCSTI itself")
    c = subprocess.run([sys.executable, "-I", "-c", TIOCSTI_PROBE], capture_output=True,
                       timeout=TIMEOUT, stdin=subprocess.DEVNULL)
    assert c.returncode == 0, c
    assert c.stdout == b"ok b'x'\n", c


def test_refused_without_mount_view(tmp_path: Path) -> None:
    jail = tmp_path / "jail"
    jail.mkdir()
    extra = ["--allow-degraded", "namespaces"]
    p = deny_run_cli(["unshare"], errno.EPERM, jail, "true", extra=extra + ["--tty"])
    assert p.returncode == EXIT_REFUSED, show(p)
    assert "pty = true" in single_error_line(p)
    control = deny_run_cli(["unshare"], errno.EPERM, jail, "true", extra=extra)
    assert_ok(control)


@pytest.mark.parametrize("user", USERS)
def test_receipt(user: str, nobody_jail: Path) -> None:
    receipt = nobody_jail / "receipt.json"
    for tty in (True, False):
        p = _run(user, nobody_jail, "true", tty=tty, extra=("--receipt", str(receipt)))
        assert_ok(p)
        r = read_receipt(receipt)
        assert r["pty"] is tty
        assert ("devpts" in r["pty_by"]) if tty else "pty_by" not in r, r


#: Waits for one SIGWINCH (30 s at most), then prints stdin's window size.
WINCH = """import fcntl, signal, struct, sys, termios
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGWINCH])
print("ready", flush=True)
got = signal.sigtimedwait([signal.SIGWINCH], float(sys.argv[1]))
rows, cols = struct.unpack("HHHH", fcntl.ioctl(0, termios.TIOCGWINSZ, bytes(8)))[:2]
print("winch" if got else "none", rows, cols, flush=True)
"""


def _winch(user: str, jail: Path, tty: bool, wait: str) -> str:
    master, slave = os.openpty()
    try:
        fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
        argv = _prefix(user) + hcp_argv(jail, sys.executable, "-I", "-c", WINCH, wait,
                                        extra=["--tty"] if tty else [])
        proc = subprocess.Popen(argv, stdin=slave, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, cwd="/", env=caller_env())
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line == b"ready\n", (line, proc.stderr.read() if proc.stderr else b"")
            # the terminal is resized; its foreground group (the CLI's, in a shell) gets SIGWINCH
            fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", 33, 99, 0, 0))
            os.kill(proc.pid if not _prefix(user) else _cli_pid(proc.pid), signal.SIGWINCH)
            stdout, stderr = proc.communicate(timeout=TIMEOUT)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 0, (stdout, stderr)
        return stdout.decode()
    finally:
        os.close(master)
        os.close(slave)


def _cli_pid(runuser_pid: int) -> int:
    """The CLI's pid under runuser (its only child)."""
    children = Path(f"/proc/{runuser_pid}/task/{runuser_pid}/children").read_text().split()
    assert len(children) == 1, children
    return int(children[0])


@pytest.mark.parametrize("user", USERS)
def test_sigwinch_forwarded(user: str, nobody_jail: Path) -> None:
    assert _winch(user, nobody_jail, True, "30") == "winch 33 99\n"
    # control: without --tty the CLI ignores SIGWINCH (its default), the command never sees it
    # (it stops waiting after 2 s; the new size is there to read, the signal is not)
    assert _winch(user, nobody_jail, False, "2") == "none 33 99\n"



def test_devpts_step_between_dev_and_proc() -> None:
    """Both executors report a failing mount by this name (protocol.STEPS, the C header)."""
    from hcp_linux.protocol import STEPS
    assert STEPS.index("dev") < STEPS.index("devpts") < STEPS.index("proc")


def test_library_api(jail: Path) -> None:
    """The same through hcp_linux.Sandbox: pty=True alternating with the default, so a spare
    prepared for one view is never handed the other (the PTY flag is in the view section)."""
    from hcp_linux import Policy, Sandbox
    from hcp_linux.errors import PolicyError
    code = "import os, pty; pty.openpty(); print(sorted(os.listdir('/dev/pts')))"
    for _ in range(3):
        for pty_on, want in ((True, b"['0', 'ptmx']\n"), (False, None)):
            r = Sandbox(Policy(jail=str(jail), pty=pty_on)).run(
                [sys.executable, "-I", "-c", code], capture_output=True, timeout=TIMEOUT)
            if want is None:
                assert r.returncode == 1 and b"out of pty devices" in r.stderr, r
            else:
                assert (r.returncode, r.stdout) == (0, want), r
    with pytest.raises(PolicyError, match="pty: expected true or false"):
        Policy(jail=str(jail), pty="yes")  # type: ignore[arg-type]
