"""Promises of the docs that no other test attacked (docs/promises.md maps every one).

Each test does the forbidden thing for real inside the sandbox and checks that its effect is
absent on the host (on disk, in the mount table, in the process table), with a negative
control where the same action succeeds unconfined, or with the limit lifted. Both executors
(``--executor native|ctypes``), as root and as nobody (scripts/test-unprivileged).
"""
from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from sandboxing import (EXIT_REFUSED, IS_ROOT, TIMEOUT, assert_ok, caller_env,  # noqa: F401
                        err, hcp_argv, jail, kill_by_pid, out, outside, pid_alive,
                        read_receipt, run_cli, sh, show, single_error_line, wait_for)

LAUNCHER = str(Path(__file__).with_name("ladder_launcher.py"))
SECRET = "hcp-test-secret-promises-5e1b"


def _launch(filt: str, argv: list, **kw) -> subprocess.CompletedProcess:  # type: ignore[no-untyped-def]
    """``argv`` under tests/ladder_launcher.py's seccomp filter ``filt`` (a degraded host)."""
    return subprocess.run([sys.executable, LAUNCHER, filt, "--", *argv], capture_output=True,
                          timeout=TIMEOUT, stdin=subprocess.DEVNULL, env=caller_env(), cwd="/",
                          **kw)


# --- threat-model.md: only granted paths exist ------------------------------------------------


def test_home_root_run_var_cannot_be_named(jail: Path) -> None:
    """`$HOME`, `/root`, `/run`, `/var` are not in the view: stat gives ENOENT for each (and
    for the host's docker/D-Bus socket directories under them)."""
    names = [p for p in (os.path.expanduser("~"), "/root", "/run", "/var", "/run/dbus",
                         "/var/run") if os.path.lexists(p) and p not in ("/", "/tmp")]
    assert "/run" in names and "/var" in names  # control: they exist on this host
    code = ("import os, sys\nfor p in sys.argv[1:]:\n"
            "    try:\n        os.lstat(p); print(p, 'exists')\n"
            "    except OSError as e:\n        print(p, e.errno)\n")
    p = run_cli(jail, "python3", "-c", code, *names)
    assert_ok(p)
    got = dict(line.rsplit(" ", 1) for line in out(p).splitlines())
    assert got == {n: str(errno.ENOENT) for n in names}, show(p)


def test_a_mount_inside_reaches_no_host_mount_table(jail: Path) -> None:
    """mount(2) of a tmpfs in the jail is refused (EPERM) and the host's mount table gains
    nothing. Control: the same call in a user+mount namespace the test makes succeeds (so the
    call itself is sound; nothing is mounted in the host's namespace)."""
    (jail / "mnt").mkdir()
    code = ("import ctypes, os, sys\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "r = libc.mount(b'none', sys.argv[1].encode(), b'tmpfs', 0, None)\n"
            "print(r, ctypes.get_errno())\n")
    with open("/proc/self/mountinfo") as f:
        before = f.read()
    p = run_cli(jail, "python3", "-c", code, str(jail / "mnt"))
    assert_ok(p)
    assert out(p).split() == ["-1", str(errno.EPERM)], show(p)
    with open("/proc/self/mountinfo") as f:
        after = f.read()
    assert str(jail / "mnt") not in after and before.count("\n") == after.count("\n")
    c = subprocess.run(["unshare", "-rm", "/usr/bin/python3", "-c", code, str(jail / "mnt")],
                       capture_output=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL)
    assert c.stdout.split() == [b"0", b"0"], c


# --- policy.md: Limits --------------------------------------------------------------------------


def test_core_dumps_cannot_be_turned_back_on(jail: Path) -> None:
    """RLIMIT_CORE is always 0, soft and hard: raising it fails inside. Control: unconfined
    the same raise succeeds (this host's hard limit is above 0)."""
    script = "ulimit -c; ulimit -Hc; ulimit -c 1024 && echo raised || echo refused"
    p = run_cli(jail, "sh", "-c", script)
    assert p.returncode == 0, show(p)
    assert out(p).split() == ["0", "0", "refused"], show(p)
    c = sh("ulimit -Hc; ulimit -c 1024 && echo raised")
    if c.stdout.split()[:1] == [b"0"]:
        pytest.skip("the host's hard core limit is 0: no control possible")
    assert b"raised" in c.stdout, c


_OPEN_ALL = ("import os\nfds = []\ntry:\n    while len(fds) < 100000:\n"
             "        fds.append(os.open('/dev/null', os.O_RDONLY))\n"
             "except OSError as e:\n    print(len(fds) + 3, e.errno)\n")


def test_nofile_default_caps_open_files(jail: Path) -> None:
    """The default nofile is 4096: the 4097th fd fails with EMFILE. Control: with
    ``--limit nofile=8192`` the same program opens more than 4096."""
    p = run_cli(jail, "python3", "-c", _OPEN_ALL)
    assert_ok(p)
    count, code = out(p).split()
    assert int(count) <= 4096 and code == str(errno.EMFILE), show(p)
    if int(sh("ulimit -Hn").stdout or b"0") < 8192:
        pytest.skip("the caller's hard nofile is below 8192: no control possible")
    p = run_cli(jail, "python3", "-c", _OPEN_ALL, extra=["--limit", "nofile=8192"])
    assert_ok(p)
    assert 4096 < int(out(p).split()[0]) <= 8192, show(p)


_FILL_SHM = ("import errno\nn = 0\ntry:\n    with open('/dev/shm/fill', 'wb') as f:\n"
             "        for _ in range(100):\n            f.write(bytes(1 << 20)); f.flush(); n += 1\n"
             "except OSError as e:\n    print(n, e.errno)\nelse:\n    print(n, 0)\n")


def test_dev_shm_is_capped_at_64_mib(jail: Path) -> None:
    """/dev/shm is a private tmpfs of shm_size (64 MiB default): writing 100 MiB stops with
    ENOSPC at 64. Control: with ``--limit shm_size=128m`` all 100 MiB are written."""
    p = run_cli(jail, "python3", "-c", _FILL_SHM)
    assert_ok(p)
    written, code = out(p).split()
    assert int(written) <= 64 and code == str(errno.ENOSPC), show(p)
    p = run_cli(jail, "python3", "-c", _FILL_SHM, extra=["--limit", "shm_size=128m"])
    assert_ok(p)
    assert out(p).split() == ["100", "0"], show(p)


def test_cpu_limit_ends_a_busy_loop(jail: Path) -> None:
    """``--limit cpu=1``: a busy loop is killed by the kernel after about one CPU second
    (SIGXCPU, then SIGKILL), long before the run's timeout. Control: without the limit the
    same loop runs into the timeout (exit 124)."""
    loop = ["python3", "-c", "while True: pass"]
    p = run_cli(jail, *loop, extra=["--limit", "cpu=1", "--timeout", "40"])
    assert p.returncode in (128 + signal.SIGXCPU, 128 + signal.SIGKILL), show(p)
    c = run_cli(jail, *loop, extra=["--timeout", "3"])
    assert c.returncode == 124, show(c)


# --- policy.md: Paths a command can change (proxy log) -----------------------------------------

_DENIED_REQUEST = ("import urllib.request\ntry:\n"
                   "    urllib.request.urlopen('http://denied.test/', timeout=10)\n"
                   "except Exception as e:\n    print('request:', e)\n")


def test_a_proxy_log_replaced_by_a_link_while_running_writes_nothing_through_it(
        jail: Path, outside: Path) -> None:
    """The proxy log is opened once, O_NOFOLLOW: a command that replaces it by a link to a
    host file, then makes a request the proxy logs, leaves that host file unchanged. Control:
    without the swap the same request's decision lands in the log."""
    log = jail / "egress.jsonl"
    log.write_text("")
    target = outside / "target"
    target.write_text(SECRET + "\n")
    extra = ["--network", "allow", "--allow-host", "allowed.invalid", "--proxy-log", log]
    p = run_cli(jail, "python3", "-c", _DENIED_REQUEST, extra=extra)
    assert_ok(p)
    assert "403" in out(p), show(p)
    decisions = [json.loads(line) for line in log.read_text().splitlines()]
    assert any("denied.test" in json.dumps(d) for d in decisions), decisions  # control
    swap = (f"import os\nos.unlink('egress.jsonl'); os.symlink({str(target)!r}, 'egress.jsonl')\n"
            + _DENIED_REQUEST)
    p = run_cli(jail, "python3", "-c", swap, extra=extra)
    assert_ok(p)
    assert "403" in out(p), show(p)
    assert target.read_text() == SECRET + "\n"
    assert os.readlink(log) == str(target)  # the swap happened; nothing went through it


# --- policy.md: Protected names -------------------------------------------------------------------


def test_dot_git_cannot_be_renamed_away(jail: Path) -> None:
    """An existing ``.git`` holds protected names, so it is pinned: ``mv .git`` fails with
    EBUSY and the repository stays where the user's git looks. Control: a directory holding
    nothing protected is renamed by the same command."""
    assert subprocess.run(["git", "init", "-q", str(jail)], timeout=TIMEOUT).returncode == 0
    (jail / "src").mkdir()
    p = run_cli(jail, "python3", "-c",
                "import os\nfor a, b in (('.git', 'moved'), ('src', 'src2')):\n"
                "    try:\n        os.rename(a, b); print(a, 0)\n"
                "    except OSError as e:\n        print(a, e.errno)\n")
    assert_ok(p)
    assert out(p).split() == [".git", str(errno.EBUSY), "src", "0"], show(p)
    assert (jail / ".git" / "HEAD").is_file() and not (jail / "moved").exists()
    assert (jail / "src2").is_dir()


# --- deploying.md: the ladder's rungs -------------------------------------------------------------

_REACH_OUT = r"""
import ctypes, errno, os, sys
pid = int(sys.argv[1])
res = {}
for name, sig in (("kill0", 0), ("term", 15)):
    try:
        os.kill(pid, sig); res[name] = "ok"
    except OSError as e:
        res[name] = errno.errorcode[e.errno]
try:
    with open("/proc/%d/environ" % pid, "rb") as f:
        res["environ"] = "secret" if sys.argv[2].encode() in f.read() else "read"
except OSError as e:
    res["environ"] = errno.errorcode[e.errno]
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
r = libc.ptrace(16, pid, None, None)  # PTRACE_ATTACH
res["ptrace"] = "ok" if r == 0 else errno.errorcode[ctypes.get_errno()]
print(" ".join("%s=%s" % kv for kv in sorted(res.items())))
"""


def test_no_pidns_rung_cannot_signal_trace_or_read_outside_processes(jail: Path) -> None:
    """`--rung no-pidns` (CLONE_NEWPID refused): outside processes are visible, but a
    process of the caller's own uid cannot be signalled (Landlock's signal scope), traced, or
    have its environment read. Control: unconfined, the same code signals it and reads it."""
    victim = subprocess.Popen(["sleep", "120"], stdin=subprocess.DEVNULL,
                              env={"PATH": "/usr/bin:/bin", "VICTIM_TOKEN": SECRET})
    try:
        receipt = jail.parent / "receipt.json"
        p = _launch("no-pidns", hcp_argv(jail, "python3", "-c", _REACH_OUT, str(victim.pid),
                                         SECRET, extra=["--rung", "no-pidns",
                                                        "--receipt", receipt]))
        assert p.returncode == 0, show(p)
        assert read_receipt(receipt)["rung"]["name"] == "no-pidns"
        got = dict(kv.split("=") for kv in out(p).split())
        assert got["kill0"] in ("EPERM", "EACCES") and got["term"] in ("EPERM", "EACCES"), got
        assert got["environ"] in ("EACCES", "EPERM", "ENOENT"), got
        assert got["ptrace"] in ("EPERM", "EACCES", "ENOSYS"), got
        assert pid_alive(victim.pid) and victim.poll() is None
        c = subprocess.run(["/usr/bin/python3", "-c", _REACH_OUT.replace('("term", 15)', ""),
                            str(victim.pid), SECRET], capture_output=True, timeout=TIMEOUT)
        assert b"kill0=ok" in c.stdout and b"environ=secret" in c.stdout, c
    finally:
        kill_by_pid(victim)


_CAPS = r"""
import os, sys
st = dict(l.split(":\t", 1) for l in open("/proc/self/status").read().splitlines() if ":\t" in l)
print("uid", st["Uid"].split()[0], "eff", st["CapEff"], "prm", st["CapPrm"], "amb", st["CapAmb"])
for what, fn in (("chown", lambda: os.chown("victim", 4242, 4242)),
                 ("read000", lambda: open("locked").read())):
    try:
        fn(); print(what, "ok")
    except OSError as e:
        print(what, e.errno)
"""


@pytest.mark.root_only
def test_no_userns_rung_without_setpcap_regains_no_capability(jail: Path) -> None:
    """`--rung no-userns` as root whose bounding set lacks CAP_SETPCAP (a container): the
    bounding set cannot be dropped and stays as it was, yet the command (uid 0, a fresh exec
    of python) holds no capability: chown to another uid and reading a mode-000 file of
    another uid fail. Control: the same code, same bounding set, unconfined, does both."""
    (jail / "victim").write_text("x\n")
    (jail / "locked").write_text(SECRET + "\n")
    os.chown(jail / "locked", 4343, 4343)
    os.chmod(jail / "locked", 0)
    drop = ["setpriv", "--bounding-set", "-setpcap", "--"]
    receipt = jail.parent / "receipt.json"
    p = _launch("userns-denied", drop + hcp_argv(
        jail, "/usr/bin/python3", "-c", _CAPS, extra=["--rung", "no-userns",
                                                      "--receipt", receipt]))
    assert p.returncode == 0, show(p)
    r = read_receipt(receipt)
    assert r["rung"]["name"] == "no-userns", r["rung"]
    assert str(r["layers"]["capabilities"]["bounding"]).startswith("kept"), r["layers"]
    lines = out(p).splitlines()
    zero = "0" * 16
    assert lines[0] == f"uid 0 eff {zero} prm {zero} amb {zero}", show(p)
    assert lines[1:] == [f"chown {errno.EPERM}", f"read000 {errno.EACCES}"], show(p)
    assert os.stat(jail / "victim").st_uid == 0
    c = subprocess.run(drop + ["/usr/bin/python3", "-c", _CAPS], capture_output=True,
                       timeout=TIMEOUT, cwd=jail)
    assert c.stdout.decode().splitlines()[1:] == ["chown ok", "read000 ok"], c


def test_a_faked_container_marker_costs_no_layer(jail: Path, outside: Path,
                                                 tmp_path: Path) -> None:
    """deploying.md, Detection: marks only give hints. A fake root with `/.dockerenv` and a
    Kubernetes service-account directory (HCP_LINUX_MARKER_ROOT) makes `probe` say docker,
    but the run keeps every layer and the write outside the jail fails."""
    from hcp_linux.host import hostenv
    root = tmp_path / "fakeroot"
    (root / "var/run/secrets/kubernetes.io/serviceaccount").mkdir(parents=True)
    (root / ".dockerenv").write_text("")
    env = caller_env({hostenv.MARKER_ROOT_ENV: str(root)})
    probe = subprocess.run([sys.executable, "-m", "hcp_linux", "probe", "--json"],
                           capture_output=True, timeout=TIMEOUT, env=env, cwd="/",
                           stdin=subprocess.DEVNULL)
    assert probe.returncode == 0, probe
    assert json.loads(probe.stdout)["where"]["kind"] in ("docker", "kubernetes")  # control
    receipt = tmp_path / "r.json"
    p = run_cli(jail, "sh", "-c", f"echo x > {outside}/new; echo in > inside",
                extra=["--receipt", receipt], env=env)
    r = read_receipt(receipt)
    for layer in ("userns", "mountns", "netns", "ipcns", "pidns", "landlock", "seccomp"):
        assert r["layers"][layer]["status"] == "enforced", (layer, r["layers"][layer])
    assert r["rung"]["name"] == "full"
    assert (jail / "inside").exists() and not (outside / "new").exists(), show(p)


# --- policy.md: Unix sockets ----------------------------------------------------------------------


def test_native_local_refuses_a_socket_grant(jail: Path, outside: Path) -> None:
    """native-local has no mount view to grant one socket through: the field is refused
    (exit 125, nothing runs). Control: the same grant in a sandboxed run is accepted."""
    import socket
    path = outside / "s.sock"
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(path))
    srv.listen(1)
    try:
        cmd = ["sh", "-c", "echo ran > ran"]
        p = run_cli(jail, *cmd, extra=["--no-sandbox", "--native-local",
                                       "--allow-unix-socket", path])
        assert p.returncode == EXIT_REFUSED, show(p)
        assert "allow_unix_sockets" in single_error_line(p)
        assert not (jail / "ran").exists()
        assert_ok(run_cli(jail, *cmd, extra=["--allow-unix-socket", path]))
        assert (jail / "ran").exists()
    finally:
        srv.close()
