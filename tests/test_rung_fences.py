"""Every rung of the fallback ladder keeps a fence of its own (issue 28, item 3).

Each rung is reached for real: `hcp-linux run --rung NAME` under tests/ladder_launcher.py's
seccomp filter that takes the rung's layer away (Landlock -> ENOSYS, CLONE_NEWPID -> EPERM,
CLONE_NEWUSER -> EACCES, Docker's default profile), and the receipt must name the rung. In it
the command attacks what a degraded rung used to leave open:

- opens /proc/sys/kernel/core_pattern and /proc/sysrq-trigger for writing (open only: no byte
  is ever written; a successful open fails the test before any harm), and asks whether the
  fenced /proc entries are read-only mounts;
- opens /proc/1/mem (the sandbox's init, or the host's pid 1 without a pid namespace) and its
  parent's /proc/<ppid>/mem read-write (open only);
- re-opens its own stdout, a host file holding a secret, through /proc/self/fd/1 and reads.

The host checks the effect: core_pattern unchanged, the secret neither in the command's
output nor changed on disk. Controls: unconfined, the same re-open of stdout reads the secret
and core_pattern is writable for root (access(2), never an open for writing).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sandboxing import (IS_ROOT, TIMEOUT, caller_env, hcp_argv, jail, outside,  # noqa: F401
                        read_receipt, show)

LAUNCHER = str(Path(__file__).with_name("ladder_launcher.py"))
SECRET = "hcp-test-secret-procfence-7c2d"
CORE_PATTERN = "/proc/sys/kernel/core_pattern"

#: rung -> the launcher's filter that leaves exactly that rung (None: the host as it is)
RUNGS = {"full": None, "no-userns": "userns-denied", "no-pidns": "no-pidns",
         "no-landlock": "no-landlock", "no-namespaces": "docker"}

ATTACK = r"""
import errno, json, os, sys
ST_RDONLY = 1
out = {}
def try_open(path, flags):
    try:
        fd = os.open(path, flags)
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
    os.close(fd)  # never written: the test fails on "open"
    return "open"
for path in ("/proc/sys/kernel/core_pattern", "/proc/sysrq-trigger", "/proc/sys/vm/drop_caches"):
    out["w:" + path] = try_open(path, os.O_WRONLY)
for path in ("/proc/sys", "/proc/irq", "/proc/bus", "/proc/fs"):
    try:
        out["ro:" + path] = bool(os.statvfs(path).f_flag & ST_RDONLY)
    except OSError as e:
        out["ro:" + path] = errno.errorcode.get(e.errno, str(e.errno))
for pid in sorted({1, os.getppid()} - {os.getpid()}):
    out["mem:%d" % pid] = try_open("/proc/%d/mem" % pid, os.O_RDWR)
try:  # non-blocking: a pipe re-opened for reading would wait for our own writes
    fd = os.open("/proc/self/fd/1", os.O_RDONLY | os.O_NONBLOCK)
    try:
        out["stdout-reread"] = os.read(fd, 1 << 16).decode(errors="replace")
    finally:
        os.close(fd)
except OSError as e:
    out["stdout-reread"] = errno.errorcode.get(e.errno, str(e.errno))
out["stdout-rw"] = try_open("/proc/self/fd/1", os.O_RDWR)
with open(sys.argv[1], "w") as f:
    json.dump(out, f)
print("attacked")
"""


def _reached(rung: str) -> str | None:
    """Why ``rung`` cannot be reached by this user here, or None."""
    if rung == "no-userns" and not IS_ROOT:
        return "without a user namespace an unprivileged caller can make no namespace: " \
               "its rung is no-namespaces (tested there)"
    return None


def _attack(jail: Path, outside: Path, tmp_path: Path, rung: str, stdout: str = "file"
            ) -> tuple[subprocess.CompletedProcess, dict | None, str, dict | None]:
    """Run the attack at ``rung`` with stdout on a host file holding the secret (``stdout``
    "file"), or a pipe ("pipe"); return (the run, the command's findings, the host file's
    content after, the receipt)."""
    (jail / "attack.py").write_text(ATTACK)
    host_out = outside / "stdout.log"
    host_out.write_text(SECRET + "\n")
    receipt = tmp_path / "receipt.json"
    argv = hcp_argv(jail, "/usr/bin/python3", "attack.py", str(jail / "found.json"),
                    extra=["--rung", rung, "--receipt", str(receipt)])
    filt = RUNGS[rung]
    if filt is not None:
        argv = [sys.executable, LAUNCHER, filt, "--", *argv]
    with open(host_out, "ab") as fh:
        p = subprocess.run(argv, stdout=fh if stdout == "file" else subprocess.PIPE,
                           stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                           timeout=TIMEOUT, env=caller_env(), cwd="/")
    found = jail / "found.json"
    r = read_receipt(receipt) if receipt.exists() else None
    return (p, json.loads(found.read_text()) if found.exists() else None, host_out.read_text(),
            r)


@pytest.mark.parametrize("rung", list(RUNGS))
def test_rung_keeps_proc_and_fd_fences(jail: Path, outside: Path, tmp_path: Path,
                                       rung: str) -> None:
    why = _reached(rung)
    if why:
        pytest.skip(why)
    with open(CORE_PATTERN) as f:
        core_before = f.read()
    p, found, host_text, r = _attack(jail, outside, tmp_path, rung)
    if rung == "no-landlock":
        # without Landlock nothing stops the re-open: a host file as stdout is refused
        assert p.returncode == 125 and found is None, show(p)
        line = p.stderr.decode().strip()
        assert line.startswith("error: sandbox: stdout ") and "\n" not in line, line
        assert host_text == SECRET + "\n"
        p, found, host_text, r = _attack(jail, outside, tmp_path, rung, stdout="pipe")
        assert b"attacked" in p.stdout and SECRET.encode() not in p.stdout, show(p)
        host_text += "attacked\n"  # nothing reached the host file: judged below as a file
    assert p.returncode == 0, show(p)
    assert r is not None and r["rung"]["name"] == rung, r
    assert found is not None
    with open(CORE_PATTERN) as f:
        assert f.read() == core_before
    # /proc's kernel knobs: no open for writing succeeds, whatever uid 0 inside is
    for key, value in found.items():
        if key.startswith("w:"):
            assert value in ("EACCES", "EROFS", "EPERM", "ENOENT"), (key, value, found)
    assert found["w:" + CORE_PATTERN] != "ENOENT", found  # it exists: the fence is tested
    if "mountns" not in r["rung"]["degraded"]:
        for key in ("ro:/proc/sys", "ro:/proc/irq", "ro:/proc/bus", "ro:/proc/fs"):
            if os.path.exists(key[3:]):
                assert found[key] is True, (key, found)
    # no other process's memory: the init (pid 1 of the sandbox) or the host's pid 1, the parent
    for key, value in found.items():
        if key.startswith("mem:"):
            assert value in ("EACCES", "EPERM", "ENOENT"), (key, value, found)
    # stdout, a host file, does not re-open: the secret stays unread and the file unchanged
    assert SECRET not in found["stdout-reread"], found
    if rung != "no-landlock":  # a pipe re-opens to itself: nothing new
        assert found["stdout-rw"] != "open", found
    assert host_text.startswith(SECRET + "\n"), host_text
    assert "attacked" in host_text and SECRET not in host_text[len(SECRET) + 1:]


def test_control_unconfined_reopen_reads_the_host_file(jail: Path, outside: Path) -> None:
    """Control: a plain subprocess with the same stdout re-opens it and reads the secret."""
    (jail / "attack.py").write_text(ATTACK)
    host_out = outside / "stdout.log"
    host_out.write_text(SECRET + "\n")
    with open(host_out, "ab") as fh:
        p = subprocess.run([sys.executable, str(jail / "attack.py"), str(jail / "found.json")],
                           stdout=fh, stderr=subprocess.PIPE, timeout=TIMEOUT)
    assert p.returncode == 0, p.stderr.decode()
    found = json.loads((jail / "found.json").read_text())
    assert SECRET in found["stdout-reread"] and found["stdout-rw"] == "open", found


def test_control_core_pattern_writable_to_root_unconfined() -> None:
    """Control: core_pattern exists and root may write it outside the sandbox (access(2)
    only: nothing is opened for writing)."""
    assert os.path.exists(CORE_PATTERN)
    assert os.access(CORE_PATTERN, os.W_OK) == IS_ROOT
    p = subprocess.run(["sh", "-c", f"test -w {CORE_PATTERN} && echo writable"],
                       capture_output=True, timeout=TIMEOUT)
    assert (b"writable" in p.stdout) == IS_ROOT, show(p)
