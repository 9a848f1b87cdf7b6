"""`hcp-linux probe`: a functional verdict per layer, honest on a degraded host.

A degraded host is simulated for real: the probe runs under a seccomp filter that refuses
unshare (no namespaces) or the landlock_* calls, and must then say exactly that layer is
missing, with its remedy, and exit 1. The same probe unfiltered is the control.
"""
from __future__ import annotations

import errno
import json
import subprocess
import sys

import pytest

from sandboxing import TIMEOUT, caller_env, deny_syscalls_launcher

PROBE = ["-m", "hcp_linux", "probe"]
NAMESPACES = ("userns", "mountns", "netns", "ipcns", "pidns")


def _probe(*extra: str, deny: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    argv = ([*deny_syscalls_launcher(deny, errno.EPERM), *PROBE, *extra] if deny
            else [sys.executable, *PROBE, *extra])
    return subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT,
                          stdin=subprocess.DEVNULL, env=caller_env(), cwd="/")


def test_probe_on_this_host_enforces_every_layer() -> None:
    proc = _probe("--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["fully_enforceable"] is True
    assert all(v["available"] for v in report["layers"].values()), report["layers"]
    assert report["facts"]["landlock_abi"] >= 3
    assert "ABI" in report["layers"]["landlock"]["detail"]


def test_probe_table_names_each_layer_and_the_verdict() -> None:
    proc = _probe()
    assert proc.returncode == 0, proc.stderr
    for layer in (*NAMESPACES, "landlock", "seccomp"):
        assert layer in proc.stdout
    assert "verdict: the default policy is fully enforceable here" in proc.stdout


def test_probe_without_unshare_reports_namespaces_missing() -> None:
    proc = _probe("--json", deny=("unshare",))
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    assert report["fully_enforceable"] is False
    layers = report["layers"]
    for ns in NAMESPACES:
        assert layers[ns]["available"] is False, layers[ns]
        assert layers[ns]["remedy"]
    assert "unshare" in layers["userns"]["detail"]
    # The rest still works and is reported as such (control within the same run).
    assert layers["landlock"]["available"] is True
    assert layers["seccomp"]["available"] is True


def test_probe_without_landlock_reports_landlock_missing() -> None:
    proc = _probe(deny=("landlock_create_ruleset", "landlock_add_rule",
                        "landlock_restrict_self"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    line = next(l for l in proc.stdout.splitlines() if l.startswith("landlock"))
    assert "MISSING" in line
    assert "remedy for landlock:" in proc.stdout
    assert "NOT fully enforceable" in proc.stdout
    userns = next(l for l in proc.stdout.splitlines() if l.startswith("userns"))
    assert " ok " in userns


def test_probe_verdict_is_cached_per_process() -> None:
    code = ("import hcp_linux, sys; a = hcp_linux.probe(); b = hcp_linux.probe(); "
            "sys.exit(0 if a is b and a.fully_enforceable else 1)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=TIMEOUT, env=caller_env(), cwd="/")
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("bad", [["--jsn"], ["extra"]])
def test_probe_usage_errors_are_one_line(bad: list[str]) -> None:
    proc = _probe(*bad)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: sandbox: ")
