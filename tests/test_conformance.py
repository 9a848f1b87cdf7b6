"""The HCP §10 conformance suite (hcp_linux.conformance) in pytest.

- One test per check id: the same code `python -m hcp_linux conformance` runs, on the real
  kernel; "not applicable" becomes a skip with the check's reason.
- The CLI: its table, its JUnit file and its exit status.
- Weakened configurations, simulated honestly: the conformance command itself runs under a
  seccomp filter that denies the syscalls a layer needs (landlock_*, unshare, seccomp) and is
  told to let that layer degrade. Exactly the checks that depend on the lost layer, and that no
  remaining layer covers, must fail; everything else must still pass (defence in depth).
"""
from __future__ import annotations

import errno
import json
import os
import platform
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from hcp_linux.conformance import (CHECK_IDS, CHECKS, FAIL, NOT_APPLICABLE, PASS, Harness,
                                   run_check)

IS_ROOT = os.geteuid() == 0
SUITE_TIMEOUT = 900  # seconds for one whole `conformance` run (each step inside is bounded)


@pytest.fixture(scope="module")
def harness():
    with Harness() as h:
        yield h


def _explain(r) -> str:
    lines = [f"{r.id} [{r.status}] {r.reason}", f"rule: {r.requirement}"]
    for key, items in r.evidence.items():
        lines += [f"  {key}: {item}" for item in items]
    return "\n".join(lines)


@pytest.mark.parametrize("check", CHECKS, ids=CHECK_IDS)
def test_check(harness, check) -> None:
    r = run_check(harness, check)
    if r.status == NOT_APPLICABLE:
        pytest.skip(f"not applicable here: {r.reason}")
    assert r.status == PASS, _explain(r)


def test_check_ids_are_unique_and_cover_the_rules() -> None:
    assert len(set(CHECK_IDS)) == len(CHECK_IDS)
    rules = {c.rule for c in CHECKS}
    assert {"§10.1", "§10.2.1", "§10.2.2", "§10.2.3", "§10.2.4", "§10.2.5", "§10.3",
            "§10.4", "§10.6", "hardening"} <= rules


# --- the CLI -----------------------------------------------------------------------------


def _cli(args: list[str], *, env: dict | None = None, prefix: list[str] | None = None,
         cwd: str = "/") -> subprocess.CompletedProcess:
    """`hcp-linux conformance ARGS`, with the suite's executor (--executor ctypes: every run
    of every check uses it)."""
    import sandboxing
    argv = (prefix or [sys.executable]) + ["-m", "hcp_linux", "conformance", *args,
                                           *sandboxing.EXECUTOR_ARGS]
    return subprocess.run(argv, capture_output=True, timeout=SUITE_TIMEOUT, cwd=cwd,
                          stdin=subprocess.DEVNULL, env=env)


def _junit(path: Path) -> dict[str, str]:
    """testcase name -> pass | fail | not-applicable."""
    root = ET.parse(path).getroot()
    out = {}
    for case in root.iter("testcase"):
        if case.find("failure") is not None:
            out[case.get("name")] = FAIL
        elif case.find("skipped") is not None:
            out[case.get("name")] = NOT_APPLICABLE
        else:
            out[case.get("name")] = PASS
    return out


def test_cli_table_and_junit(tmp_path: Path) -> None:
    junit = tmp_path / "conformance.junit.xml"
    p = _cli(["--junit", str(junit)])
    text = p.stdout.decode()
    cases = _junit(junit)
    assert list(cases) == list(CHECK_IDS)
    assert FAIL not in cases.values(), text
    assert p.returncode == 0, text + p.stderr.decode()
    for cid in CHECK_IDS:
        assert any(line.startswith(cid + " ") for line in text.splitlines()), cid
    assert f"{len(CHECK_IDS)} checks: " in text and "CONFORMANT on this host" in text


def test_cli_refuses_unknown_layer() -> None:
    p = _cli(["--allow-degraded", "nosuchlayer"])
    assert p.returncode == 125
    assert p.stderr.decode().startswith("error: sandbox: allow_degraded: unknown layer "
                                        "'nosuchlayer'"), p.stderr


@pytest.mark.parametrize("preset", ["read-only", "workspace-write", "workspace-write-net"])
def test_a_preset_passes_conformance(preset: str) -> None:
    """Every check's runs start from the preset (its network and hosts included): every
    check passes, none is left unjudged. workspace-write-net allows one loopback port no
    check listens on. Under read-only the checks take their evidence out through a write
    root of their own, and 10.2.2-cwd-jail judges the opposite promise: the write in the
    jail is refused (against an unconfined control that writes)."""
    hosts = ["--allow-host", "127.0.0.1:9"] if preset == "workspace-write-net" else []
    p = _cli(["--preset", preset, *hosts, "--json"])
    report = json.loads(p.stdout)
    assert p.returncode == 0, p.stdout.decode()[-3000:] + p.stderr.decode()
    assert report["summary"] == {PASS: len(CHECK_IDS), FAIL: 0, NOT_APPLICABLE: 0,
                                 "total": len(CHECK_IDS)}, report["summary"]
    assert report["config"]["preset"]["name"] == preset, report["config"]
    cwd = next(r for r in report["checks"] if r["id"] == "10.2.2-cwd-jail")
    read_only = preset == "read-only"
    assert ("read-only jail refuses writes" in cwd["reason"]) == read_only, cwd["reason"]
    assert ("read_only_jail" in report["config"]) == read_only, report["config"]


@pytest.mark.parametrize("args, fragment", [
    (["--preset", "read-onyl"], "unknown preset 'read-onyl'"),
    (["--preset", "workspace-write-net"], "no host to allow"),
    (["--allow-host", "example.invalid"], "--allow-host goes with --preset"),
])
def test_cli_refuses_a_bad_preset(args: list, fragment: str) -> None:
    p = _cli(args)
    lines = p.stderr.decode().splitlines()
    assert p.returncode == 125 and len(lines) == 1 and fragment in lines[0], p.stderr
    assert lines[0].startswith("error: sandbox: "), lines


# --- weakened configurations ---------------------------------------------------------------

_LAUNCHER = r"""
import ctypes, os, platform, sys
import pyseccomp
from hcp_linux import seccomp_profiles
names, err = sys.argv[1].split(","), int(sys.argv[2])
# Compile the engine's BPF while seccomp(2) still works: libseccomp needs it to compile, and
# the engine does not yet treat that failure as "seccomp unavailable" (see the report). The
# program lands in the disk cache (HCP_LINUX_SECCOMP_CACHE), where the runs below find it.
for profiles in (("baseline", "socket-families"), ("baseline", "socket-families", "network-off")):
    seccomp_profiles.compile_profiles(profiles)
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl(38, ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)):
    raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
f = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
if platform.machine() == "x86_64":
    # Allow the i386 and x32 ABIs too (libseccomp kills foreign arches by default), so the
    # unconfined controls of the int 0x80 / x32 canaries still work under this filter.
    f.add_arch(pyseccomp.Arch.X86)
    f.add_arch(pyseccomp.Arch.X32)
for name in names:
    f.add_rule(pyseccomp.ERRNO(err), name)
f.load()
os.execv(sys.executable, [sys.executable] + sys.argv[3:])
"""

LANDLOCK_SYSCALLS = ("landlock_create_ruleset", "landlock_add_rule", "landlock_restrict_self")


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def _host_can_judge(check_id: str) -> bool:
    """Whether this host lets the check's unconfined control work at all."""
    if check_id in ("canary-i386-int80", "canary-x32-syscall"):
        return platform.machine() == "x86_64" and shutil.which("gcc") is not None
    if check_id == "canary-tiocsti":
        return _read("/proc/sys/dev/tty/legacy_tiocsti") != "0"
    if check_id == "canary-io-uring":
        return _read("/proc/sys/kernel/io_uring_disabled") in (None, "0")
    return True


SECCOMP_ONLY = {"canary-nested-namespaces", "canary-i386-int80", "canary-x32-syscall",
                "canary-io-uring", "canary-tiocsti"}

# (syscalls denied to the whole conformance process, --allow-degraded layers,
#  layers the receipts must report degraded, check ids that must fail)
WEAKENED = {
    # The mount view stands in for Landlock everywhere: nothing fails (defence in depth).
    "landlock": (LANDLOCK_SYSCALLS, ("landlock",), {"landlock"}, set()),
    # Landlock (files, TCP, signal and ptrace scopes) and seccomp stand in for the namespaces,
    # except for metadata writes, which Landlock does not mediate: only the mount view's
    # read-only binds and absent paths stop chmod/chown/utime/setxattr.
    "namespaces": (("unshare",), ("namespaces",),
                   {"userns", "mountns", "netns", "ipcns", "pidns"},
                   {"canary-metadata-outside-jail"}),
    # Nothing else filters system calls: namespaces, foreign ABIs, io_uring and TIOCSTI.
    "seccomp": (("seccomp",), ("seccomp",), {"seccomp"}, SECCOMP_ONLY),
    # Only seccomp is left: every file, metadata and process boundary falls; the network
    # holds (seccomp's network-off profile refuses inet sockets). As root, the runtime's
    # /proc/<pid>/environ stays unreadable to a capability-less process (the kernel's
    # ptrace check wants the reader's capabilities to cover the target's); as nobody not.
    # /proc falls too (below the ladder): root writes core_pattern, nobody its parent's mem.
    "landlock+namespaces": (("unshare",) + LANDLOCK_SYSCALLS, ("namespaces", "landlock"),
                            {"userns", "mountns", "netns", "ipcns", "pidns", "landlock"},
                            {"10.2.2-cwd-jail", "10.2.3-no-ambient-credentials",
                             "10.6-mode-none", "canary-fs-outside-jail",
                             "canary-metadata-outside-jail", "canary-signals",
                             "canary-proc-fences"}
                            | (set() if IS_ROOT else {"canary-proc-environ"})),
}


@pytest.mark.parametrize("name", list(WEAKENED))
def test_weakened_configuration_fails_exactly_the_dependent_checks(name: str,
                                                                   tmp_path: Path) -> None:
    syscalls, layers, degraded, expected = WEAKENED[name]
    expected = {c for c in expected if _host_can_judge(c)}
    junit = tmp_path / "weak.junit.xml"
    args = ["--json", "--junit", str(junit)]
    for layer in layers:
        args += ["--allow-degraded", layer]
    env = dict(os.environ, HCP_LINUX_SECCOMP_CACHE=str(tmp_path / "cache"))
    prefix = [sys.executable, "-c", _LAUNCHER, ",".join(syscalls), str(errno.EPERM)]
    p = _cli(args, env=env, prefix=prefix)
    report = json.loads(p.stdout)
    status = {c["id"]: c["status"] for c in report["checks"]}
    failed = {i for i, s in status.items() if s == FAIL}
    na = {i for i, s in status.items() if s == NOT_APPLICABLE}
    detail = "\n".join(f"{c['id']} [{c['status']}] {c['reason']}" for c in report["checks"]
                       if c["status"] != PASS)
    # The layer really was off in the runs the checks made (the receipts say so).
    assert degraded <= set(report["config"]["degraded_in_runs"]), report["config"]
    assert failed == expected, f"{name}: unexpected failures or passes:\n{detail}"
    assert p.returncode == (1 if expected else 0), detail
    # Not applicable only where the unconfined control cannot work on this host at all. (With
    # unshare denied to the whole tree, the nested-namespace canary is still judged: its raw
    # clone(CLONE_NEWUSER) control works, and the sandbox's seccomp refuses it.)
    assert na <= {c for c in CHECK_IDS if not _host_can_judge(c)}, detail
    assert _junit(junit) == status
    assert report["conformant"] is (not expected)
