"""A degraded host, simulated honestly (issue 3): `hcp-linux run` itself runs under a seccomp
filter that denies the syscalls a layer needs (unshare; landlock_*; seccomp), exactly as a
container runtime's profile or an old kernel would.

Strict mode must refuse with exit 125 and one line naming the layer and a remedy, running
nothing. With ``--allow-degraded`` it runs, the receipt says "degraded" for what is missing and
"enforced" for the rest, and the confinement that remains really is in force.
"""
from __future__ import annotations

import errno
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from sandboxing import (EXIT_REFUSED, IS_ROOT, TIMEOUT, Listener, assert_ok, deny_run_cli,  # noqa: F401
                        err, jail, kill_by_pid, out, outside, pid_alive, read_receipt, show,
                        single_error_line, snapshot, caller_env)

NAMESPACES = ("userns", "mountns", "netns", "ipcns", "pidns")
LANDLOCK_SYSCALLS = ("landlock_create_ruleset", "landlock_add_rule", "landlock_restrict_self")
SECRET = "hcp-test-secret-degraded-5b1e"


def _refused(p: subprocess.CompletedProcess, layer: str, jail: Path, before: dict) -> str:
    assert p.returncode == EXIT_REFUSED, show(p)
    line = single_error_line(p)
    assert layer in line, line
    assert f"--allow-degraded {layer}" in line, line  # the remedy, or how to accept the loss
    assert p.stdout == b""
    assert not (jail / "ran").exists(), "the command ran"
    assert snapshot(jail) == before
    return line


def _statuses(receipt: dict) -> dict[str, str]:
    return {name: v["status"] for name, v in receipt["layers"].items()}


# --- the filter works at all (negative control for everything below) ----------------------


def test_launcher_really_denies(jail: Path) -> None:
    """Control: the launcher's filter makes unshare fail for a plain command too."""
    import sys
    from sandboxing import deny_syscalls_launcher
    code = "import ctypes; l = ctypes.CDLL(None, use_errno=True); print(l.unshare(0x10000000), ctypes.get_errno())"
    p = subprocess.run(deny_syscalls_launcher(["unshare"], errno.EPERM) + ["-c", code],
                       capture_output=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL)
    assert out(p).split() == ["-1", str(errno.EPERM)], show(p)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=TIMEOUT)
    assert out(p).split()[0] == "0", show(p)  # and without it, unshare works here


# --- no namespaces -------------------------------------------------------------------------


def test_no_unshare_strict_refuses(jail: Path) -> None:
    before = snapshot(jail)
    p = deny_run_cli(["unshare"], errno.EPERM, jail, "sh", "-c", "echo ran > ran")
    line = _refused(p, "userns", jail, before)
    assert "user namespace" in line  # the remedy names what to enable


def test_no_unshare_partial_allowance_still_refuses(jail: Path) -> None:
    """Accepting the loss of userns alone is not enough: the next missing layer is named."""
    before = snapshot(jail)
    p = deny_run_cli(["unshare"], errno.EPERM, jail, "sh", "-c", "echo ran > ran",
                     extra=["--allow-degraded", "userns"])
    line = _refused(p, "mountns", jail, before)
    assert line.startswith("error: sandbox: mountns"), line


def test_no_unshare_allow_degraded_runs_and_says_so(jail: Path, outside: Path,
                                                    tmp_path: Path) -> None:
    receipt = tmp_path / "receipt.json"
    secret = outside / "secret.txt"
    secret.write_text(SECRET + "\n")
    p = deny_run_cli(["unshare"], errno.EPERM, jail, "sh", "-c",
                     f"echo in > inside.txt; echo out > {outside}/new.txt; echo w=$?; "
                     f"cat {secret}; echo r=$?; echo $HCP_SANDBOX",
                     extra=["--allow-degraded", "namespaces", "--receipt", receipt])
    assert_ok(p)
    r = read_receipt(receipt)
    st = _statuses(r)
    for ns in NAMESPACES:
        assert st[ns] == "degraded", r["layers"][ns]
        assert r["layers"][ns].get("reason"), r["layers"][ns]
    for layer in ("landlock", "seccomp", "nnp", "capabilities"):
        assert st[layer] == "enforced", r["layers"][layer]
    assert r["namespaces"] == []
    # what remains is in force: Landlock confines the filesystem
    assert (jail / "inside.txt").read_text() == "in\n"
    assert "w=0" not in out(p) and "r=0" not in out(p), show(p)
    assert "Permission denied" in err(p), show(p)
    assert SECRET not in out(p)
    assert not (outside / "new.txt").exists()
    assert out(p).splitlines()[-1] == "sandbox"


def test_no_unshare_remaining_confinement_network_and_signals(jail: Path) -> None:
    """Without a network or pid namespace, Landlock (TCP rules, signal and abstract-socket
    scopes) and seccomp must stand in for them: the host listener, the host abstract socket
    and an outside process stay out of reach."""
    lst = Listener()
    name = f"hcp-deg-{os.getpid()}-{time.monotonic_ns()}"
    abstract = socket.socket(socket.AF_UNIX)
    abstract.bind(b"\0" + name.encode())
    abstract.listen(4)
    abstract.setblocking(False)
    victim = subprocess.Popen(["sleep", "60"], stdin=subprocess.DEVNULL)
    code = ("import os, socket, sys\n"
            "def attempt(name, fn):\n"
            "    try:\n"
            "        r = fn()\n"
            "        print(name, 'ok' if not r else r)\n"
            "    except OSError as e:\n"
            "        print(name, e.errno)\n"
            "def tcp():\n"
            "    s = socket.socket(); s.settimeout(3)\n"
            f"    return s.connect_ex(('127.0.0.1', {lst.port}))\n"
            "def unix():\n"
            f"    return socket.socket(socket.AF_UNIX).connect_ex(b'\\0{name}')\n"
            "attempt('tcp', tcp)\n"
            "attempt('abstract', unix)\n"
            f"attempt('kill', lambda: os.kill({victim.pid}, 9))\n")
    try:
        p = deny_run_cli(["unshare"], errno.EPERM, jail, "python3", "-c", code,
                         extra=["--allow-degraded", "namespaces"])
        assert_ok(p)
        lines = out(p).splitlines()
        assert len(lines) == 3 and lines[0] != "tcp ok" and lines[1] != "abstract ok", show(p)
        assert lines[2] in (f"kill {errno.EPERM}", f"kill {errno.EACCES}"), show(p)
        assert lst.accepted() == 0
        try:
            abstract.accept()
            raise AssertionError("the sandbox reached a host abstract unix socket")
        except BlockingIOError:
            pass
        time.sleep(0.2)
        assert pid_alive(victim.pid)
        # control: the same code, unconfined, reaches all three
        c = subprocess.run(["/usr/bin/python3", "-c", code], capture_output=True,
                           timeout=TIMEOUT, stdin=subprocess.DEVNULL)
        assert c.stdout.decode().splitlines() == ["tcp ok", "abstract ok", "kill ok"], c
        assert lst.accepted(wait=2) == 1
    finally:
        kill_by_pid(victim)
        lst.close()
        abstract.close()


# --- no Landlock -----------------------------------------------------------------------------

# A kernel built without Landlock answers ENOSYS, one with Landlock off at boot EOPNOTSUPP,
# a container runtime's seccomp profile typically EPERM.
LANDLOCK_ERRNOS = [
    pytest.param(errno.ENOSYS, id="ENOSYS"),
    pytest.param(errno.EOPNOTSUPP, id="EOPNOTSUPP"),
    pytest.param(errno.EPERM, id="EPERM"),
]


@pytest.mark.parametrize("err_", LANDLOCK_ERRNOS)
def test_no_landlock_strict_refuses(jail: Path, err_: int) -> None:
    before = snapshot(jail)
    p = deny_run_cli(LANDLOCK_SYSCALLS, err_, jail, "sh", "-c", "echo ran > ran")
    line = _refused(p, "landlock", jail, before)
    assert "Landlock" in line or "landlock" in line.split("unavailable")[0]


@pytest.mark.parametrize("err_", LANDLOCK_ERRNOS)
def test_no_landlock_allow_degraded_runs_and_says_so(jail: Path, outside: Path, tmp_path: Path,
                                                     err_: int) -> None:
    receipt = tmp_path / "receipt.json"
    secret = outside / "secret.txt"
    secret.write_text(SECRET + "\n")
    p = deny_run_cli(LANDLOCK_SYSCALLS, err_, jail, "sh", "-c",
                     f"echo in > inside.txt; echo out > {outside}/new.txt; echo w=$?; "
                     f"cat {secret}; echo r=$?",
                     extra=["--allow-degraded", "landlock", "--receipt", receipt])
    assert_ok(p)
    r = read_receipt(receipt)
    st = _statuses(r)
    assert st["landlock"] == "degraded", r["layers"]["landlock"]
    assert r["layers"]["landlock"].get("reason")
    for layer in NAMESPACES + ("seccomp", "nnp", "capabilities"):
        assert st[layer] == "enforced", (layer, r["layers"][layer])
    assert "landlock canary" not in " ".join(r["verified"])
    # what remains is in force: the mount view hides the host outside the roots
    assert (jail / "inside.txt").read_text() == "in\n"
    assert "w=0" not in out(p) and "r=0" not in out(p), show(p)
    assert SECRET not in out(p)
    assert not (outside / "new.txt").exists()


# --- no seccomp ------------------------------------------------------------------------------


def test_no_seccomp_strict_refuses(jail: Path) -> None:
    before = snapshot(jail)
    p = deny_run_cli(["seccomp"], errno.EPERM, jail, "sh", "-c", "echo ran > ran")
    _refused(p, "seccomp", jail, before)


def test_no_seccomp_allow_degraded_runs_and_says_so(jail: Path, tmp_path: Path) -> None:
    receipt = tmp_path / "receipt.json"
    p = deny_run_cli(["seccomp"], errno.EPERM, jail, "sh", "-c", "echo in > inside.txt",
                     extra=["--allow-degraded", "seccomp", "--receipt", receipt])
    assert_ok(p)
    st = _statuses(read_receipt(receipt))
    assert st["seccomp"] == "degraded"
    for layer in NAMESPACES + ("landlock", "nnp", "capabilities"):
        assert st[layer] == "enforced", layer
    assert (jail / "inside.txt").exists()


def test_fully_enforced_host_allow_degraded_changes_nothing(jail: Path, tmp_path: Path) -> None:
    """Control for the tests above: on this host, allowing every loss degrades nothing."""
    from sandboxing import run_cli
    receipt = tmp_path / "receipt.json"
    p = run_cli(jail, "true", extra=["--allow-degraded", "namespaces", "--allow-degraded",
                                     "landlock", "--allow-degraded", "seccomp",
                                     "--receipt", receipt])
    assert_ok(p)
    st = _statuses(read_receipt(receipt))
    assert set(st.values()) == {"enforced"}, st


@pytest.mark.parametrize("allow", [False, True], ids=["strict", "allow-degraded"])
def test_no_seccomp_with_a_cold_filter_cache(jail: Path, tmp_path: Path, allow: bool) -> None:
    # libseccomp queries seccomp(2) while compiling: with the call denied and nothing cached,
    # the failure happens at compile time, in the parent, and must still be the seccomp layer.
    cache = tmp_path / "cold-cache"
    cache.mkdir()
    receipt = tmp_path / "receipt.json"
    env = caller_env({"HCP_LINUX_SECCOMP_CACHE": str(cache)})
    extra = ["--receipt", str(receipt)] + (["--allow-degraded", "seccomp"] if allow else [])
    p = deny_run_cli(["seccomp"], errno.EPERM, jail, "touch", "ran", extra=extra, env=env)
    if allow:
        assert p.returncode == 0, show(p)
        assert read_receipt(receipt)["layers"]["seccomp"]["status"] == "degraded"
        assert (jail / "ran").exists()
    else:
        assert p.returncode == 125, show(p)
        assert single_error_line(p).startswith("error: sandbox: seccomp unavailable")
        assert not (jail / "ran").exists() and not receipt.exists()


# --- pivot_root refused: the mount view's last step (issue 31) ----------------------------

def test_no_pivot_root_strict_refuses_naming_the_step(jail: Path) -> None:
    before = snapshot(jail)
    p = deny_run_cli(["pivot_root"], errno.EPERM, jail, "sh", "-c", "echo ran > ran")
    assert "mountns unavailable: pivot-root: " in _refused(p, "mountns", jail, before)


def test_no_pivot_root_allow_degraded_runs_without_the_view(jail: Path, tmp_path: Path) -> None:
    receipt = tmp_path / "receipt.json"
    p = deny_run_cli(["pivot_root"], errno.EPERM, jail, "sh", "-c", "echo in > inside.txt",
                     extra=["--allow-degraded", "mountns", "--receipt", receipt])
    assert_ok(p)
    layers = read_receipt(receipt)["layers"]
    assert layers["mountns"]["status"] == "degraded", layers["mountns"]
    assert layers["mountns"]["reason"].startswith("pivot-root: "), layers["mountns"]
    for layer in ("userns", "landlock", "seccomp"):
        assert layers[layer]["status"] == "enforced", layer
    assert (jail / "inside.txt").exists()
