"""Denial records: what a run was refused, by which layer, in the receipt and with --explain.

Each denial is done for real inside the sandbox, and its effect is checked absent (the
namespace unchanged, the mount not made); each has its control (the same calls succeed
unconfined, a run with nothing blocked records nothing). Both executors, root and nobody.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sandboxing import TIMEOUT, hcp_argv, stuck_seccomp_listener

from hcp_linux import Policy, Sandbox
from hcp_linux.observe import denials as denials_mod
from hcp_linux.native import binary

EXECUTORS = ["ctypes"] + (["native"] if binary() is not None else [])

# unshare(CLONE_NEWUSER | CLONE_NEWNS), then mount a tmpfs on ./cover, which holds a marker:
# prints each call's errno (0: it worked) and whether the namespace and the marker are as
# before (the effect, seen from inside).
_BLOCKED = r"""
import ctypes, errno, os, sys
libc = ctypes.CDLL(None, use_errno=True)
before = os.readlink("/proc/self/ns/mnt")
r = libc.unshare(0x10000000 | 0x00020000)
print("unshare", 0 if r == 0 else errno.errorcode[ctypes.get_errno()])
if r == 0:  # unconfined: map ourselves, as a user namespace's creator may, to mount below
    uid, gid = os.geteuid(), os.getegid()
    open("/proc/self/setgroups", "w").write("deny")
    open("/proc/self/uid_map", "w").write(f"0 {uid} 1")
    open("/proc/self/gid_map", "w").write(f"0 {gid} 1")
r = libc.mount(b"none", b"cover", b"tmpfs", 0, None)
print("mount", 0 if r == 0 else errno.errorcode[ctypes.get_errno()])
print("same-ns", os.readlink("/proc/self/ns/mnt") == before)
print("marker", os.path.exists("cover/marker"))
"""


@pytest.fixture
def jail(tmp_path: Path) -> Path:
    d = tmp_path / "jail"
    (d / "cover").mkdir(parents=True)
    (d / "cover" / "marker").write_text("here")
    (d / "blocked.py").write_text(_BLOCKED)
    if os.geteuid() == 0:
        os.chmod(tmp_path, 0o755)
    return d


def _run(jail: Path, executor: str, *argv: str, **kw) -> "object":
    return Sandbox(Policy(jail=str(jail)), executor=executor).run(
        list(argv), capture_output=True, timeout=kw.pop("timeout", TIMEOUT), **kw)


def _lines(stdout: bytes) -> dict[str, str]:
    return dict(line.split(" ", 1) for line in stdout.decode().splitlines())


@pytest.mark.parametrize("executor", EXECUTORS)
def test_blocked_syscalls_are_recorded_and_refused(jail: Path, executor: str) -> None:
    run = _run(jail, executor, "python3", "blocked.py")
    assert run.returncode == 0, run.stderr
    got = _lines(run.stdout)
    # refused with the profile's errno, and the effect is absent
    assert got == {"unshare": "EPERM", "mount": "EPERM", "same-ns": "True", "marker": "True"}
    records = run.receipt["denials"]
    assert [(d["layer"], d["syscall"], d["errno"], d["profile"]) for d in records] == [
        ("seccomp", "unshare", "EPERM", "baseline"), ("seccomp", "mount", "EPERM", "baseline")]
    for d in records:
        assert d["pid"] > 0 and d["why"]
    assert len({d["pid"] for d in records}) == 1  # the same process made both calls
    assert run.receipt["denial_layers"]["seccomp"].startswith("recorded")


def test_control_same_calls_succeed_unconfined(jail: Path) -> None:
    """The script's calls do work outside the sandbox (in a user namespace of its own)."""
    p = subprocess.run([sys.executable, "blocked.py"], cwd=jail, capture_output=True,
                       timeout=TIMEOUT)
    if b"unshare EPERM" in p.stdout or b"unshare EINVAL" in p.stdout:
        pytest.skip("no user namespaces for this user here: " + p.stdout.decode())
    assert _lines(p.stdout) == {"unshare": "0", "mount": "0", "same-ns": "False",
                                "marker": "False"}, p.stdout


@pytest.mark.parametrize("executor", EXECUTORS)
def test_run_with_nothing_blocked_records_nothing(jail: Path, executor: str) -> None:
    # a thread: glibc tries clone3 first, which the filter answers ENOSYS itself (a
    # fallback probe, not recorded), then clone
    code = "import threading; t = threading.Thread(target=print, args=('t',)); t.start(); t.join()"
    run = _run(jail, executor, "python3", "-c", code)
    assert run.returncode == 0, run.stderr
    assert run.stdout == b"t\n"
    assert run.receipt["denials"] == []
    assert "denials_not_recorded" not in run.receipt


_FLOOD = r"""
import ctypes, errno, sys
libc = ctypes.CDLL(None, use_errno=True)
codes = set()
for _ in range(int(sys.argv[1])):
    libc.unshare(0x00020000)
    codes.add(errno.errorcode[ctypes.get_errno()])
print(sorted(codes))
"""


@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_flood_is_bounded(jail: Path, executor: str) -> None:
    n = 1500
    run = _run(jail, executor, "python3", "-c", _FLOOD, str(n))
    assert run.returncode == 0, run.stderr
    assert run.stdout == b"['EPERM']\n"  # every one refused, with the rule's errno
    records = run.receipt["denials"]
    assert len(records) == denials_mod.MAX_RECORDED
    assert run.receipt["denials_not_recorded"] == {"seccomp": n - denials_mod.MAX_RECORDED}


@pytest.mark.parametrize("executor", EXECUTORS)
def test_stuck_listener_the_timeout_still_kills(jail: Path, executor: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The runtime's listener does not answer: the blocked call waits, and the run's timeout
    kills the sandbox all the same; nothing of the call happened."""
    code = ("import ctypes; print('before', flush=True); "
            "ctypes.CDLL(None).unshare(0x00020000); print('after', flush=True)")
    with stuck_seccomp_listener(monkeypatch):
        run = _run(jail, executor, "python3", "-c", code, timeout=3)
    assert run.timed_out
    assert run.stdout == b"before\n"  # never returned from unshare
    assert run.receipt["denial_layers"]["seccomp"].startswith("incomplete: ")


@pytest.mark.parametrize("executor", EXECUTORS)
def test_listener_gone_calls_still_refused(jail: Path, executor: str,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The listener fd is closed (its thread ended, as when the runtime dies): the kernel
    answers ENOSYS to the notified calls: still refused, the effect absent."""
    def drop(self):  # type: ignore[no-untyped-def]
        os.close(self.listener)  # as the kernel sees a runtime that died
        self.listener = -1

    monkeypatch.setattr(denials_mod.SeccompListener, "start", drop)
    run = _run(jail, executor, "python3", "blocked.py")
    assert run.returncode == 0, run.stderr
    assert _lines(run.stdout) == {"unshare": "ENOSYS", "mount": "ENOSYS", "same-ns": "True",
                                  "marker": "True"}
    assert run.receipt["denials"] == []


def test_landlock_denial_said_unavailable(jail: Path) -> None:
    """A real Landlock denial (the canary at the view's root: in the view, not granted) is
    not recorded where audit is off (this host's default) or not readable (as nobody), and
    the receipt says why instead of an empty silence (tests/test_landlock_audit.py reads
    them with audit on)."""
    code = ("import errno\ntry:\n    open('/.hcp-canary')\nexcept OSError as e:\n"
            "    print(errno.errorcode[e.errno])\nelse:\n    print('opened')")
    run = _run(jail, EXECUTORS[0], "python3", "-c", code)
    assert run.stdout == b"EACCES\n", run.stdout
    why = run.receipt["denial_layers"]["landlock"]
    assert why.startswith("unavailable: ") and "audit" in why
    assert [d for d in run.receipt["denials"] if d["layer"] == "landlock"] == []


def test_explain_prints_a_line_per_denial(jail: Path) -> None:
    p = subprocess.run(hcp_argv(jail, "python3", "blocked.py", extra=["--explain"]),
                       capture_output=True, timeout=TIMEOUT, cwd=jail)
    assert p.returncode == 0, p.stderr
    lines = p.stderr.decode().splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith("blocked: unshare (pid ") and "seccomp profile baseline" in lines[0]
    assert lines[1].startswith("blocked: mount (pid ")
    # control: without --explain, nothing on stderr
    q = subprocess.run(hcp_argv(jail, "python3", "blocked.py"), capture_output=True,
                       timeout=TIMEOUT, cwd=jail)
    assert q.stderr == b""


def test_explain_after_a_failed_run_shows_the_view(jail: Path) -> None:
    p = subprocess.run(hcp_argv(jail, "cat", "/root/.profile", extra=["--explain"]),
                       capture_output=True, timeout=TIMEOUT, cwd=jail)
    assert p.returncode == 1
    err = p.stderr.decode()
    assert "note: the sandbox sees only its view (read-only: " in err
    assert str(jail) in err


def test_denied_host_through_the_proxy_is_recorded(jail: Path) -> None:
    import socket
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]
    srv.settimeout(0.5)
    code = ("import socket\ns = socket.create_connection(('127.0.0.1', 3128), timeout=10)\n"
            "t = b'127.0.0.1:%d'\n"
            "s.sendall(b'GET http://' + t + b'/ HTTP/1.1\\r\\nHost: ' + t + b'\\r\\n"
            "Connection: close\\r\\n\\r\\n')\n"
            "print(s.recv(100).split(b'\\r\\n')[0].decode())" % port)
    try:
        run = Sandbox(Policy(jail=str(jail), network="allow",
                             allow_hosts=(f"127.0.0.1:{port + 1}",))).run(
            ["python3", "-c", code], capture_output=True, timeout=TIMEOUT)
        with pytest.raises(OSError):  # nothing reached the server (timeout)
            srv.accept()
    finally:
        srv.close()
    assert b" 403" in run.stdout, run.stdout
    net = [d for d in run.receipt["denials"] if d["layer"] == "network"]
    assert [(d["host"], d["port"]) for d in net] == [("127.0.0.1", port)]
    line = denials_mod.explain(net[0])
    assert line.startswith(f"blocked: connect to 127.0.0.1:{port} — ")
    assert f"--allow-host 127.0.0.1:{port}" in line
    assert run.receipt["denial_layers"]["network"].startswith("recorded")


#: A DNS lookup of a name the allow list does not hold (glibc, through the sandbox's
#: resolver), a connection to the proxy that sends nothing, and a connection to an allowed
#: name's synthetic address that sends nothing: three refusals with no request behind them.
_NO_REQUEST = r"""
import socket, struct
try:
    socket.getaddrinfo("not-allowed.test", 443, socket.AF_INET, socket.SOCK_STREAM)
    print("resolved")
except socket.gaierror as e:
    print("gaierror", e.errno)
socket.create_connection(("127.0.0.1", 3128), timeout=10).close()
"""


def test_explain_names_dns_refusals_and_empty_connections(jail: Path) -> None:
    p = subprocess.run(hcp_argv(jail, "python3", "-c", _NO_REQUEST,
                                extra=["--network", "allow", "--allow-host", "allowed.test",
                                       "--explain"]),
                       capture_output=True, timeout=TIMEOUT, cwd=jail)
    assert p.returncode == 0, p.stderr
    assert p.stdout.decode().startswith("gaierror"), p.stdout  # the name did not resolve
    err = p.stderr.decode()
    assert "None" not in err, err
    dns = [line for line in err.splitlines() if "not-allowed.test" in line]
    assert dns and all(line.startswith("blocked: DNS lookup of not-allowed.test — ")
                       and line.endswith("add --allow-host not-allowed.test") for line in dns), dns
    empty = [line for line in err.splitlines() if "without sending" in line]
    assert len(empty) == 1 and empty[0].startswith(
        "blocked: a connection to the egress proxy that named no host — "), err
    assert "--allow-host" not in empty[0]
