"""A masked /proc (issue 31): where an entry of the outer /proc is covered by a mount, as a
container runtime covers /proc/keys and /proc/timer_list, the kernel refuses the fresh
procfs a pid namespace asks for (mount_too_revealing), in every user namespace. No
simulation: each test runs the CLI in a mount namespace of its own where /dev/null is bound
over /proc/keys, exactly as Docker and Podman mask it.

The strict default refuses, naming the step, the layer (pidns) and the remedy for this
refusal; --rung no-pidns (and --allow-degraded pidns) runs without a pid namespace, over the
outer /proc bound with the fences; probe names that rung. Root only: the mask is a mount.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sandboxing import EXECUTOR_ARGS, EXIT_REFUSED, IS_ROOT, TIMEOUT

pytestmark = pytest.mark.skipif(not IS_ROOT or not os.path.exists("/proc/keys"),
                                reason="masking /proc/keys takes a mount (root)")


def _masked(jail: Path, *args: str) -> subprocess.CompletedProcess:
    """`hcp-linux ARGS` in a mount namespace of its own where /proc/keys is masked."""
    script = 'mount --bind /dev/null /proc/keys && exec "$@"'
    return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script,
                           "sh", sys.executable, "-m", "hcp_linux", *args],
                          capture_output=True, text=True, timeout=TIMEOUT, cwd=jail,
                          stdin=subprocess.DEVNULL)


def _run(jail: Path, *flags: str, cmd: str) -> subprocess.CompletedProcess:
    return _masked(jail, "run", *EXECUTOR_ARGS, *flags, "--", "sh", "-c", cmd)


def test_strict_refuses_with_the_step_and_its_remedy(tmp_path: Path) -> None:
    p = _run(tmp_path, cmd="true")
    assert p.returncode == EXIT_REFUSED, p
    assert "pidns unavailable: proc: Operation not permitted" in p.stderr, p.stderr
    assert "--rung no-pidns" in p.stderr, p.stderr


@pytest.mark.parametrize("flags", [("--rung", "no-pidns"), ("--allow-degraded", "pidns")])
def test_no_pidns_runs_without_a_pid_namespace_over_the_fenced_outer_proc(
        tmp_path: Path, flags: tuple[str, str]) -> None:
    own = os.readlink("/proc/self/ns/pid")
    # no pid namespace: the same as this process's, and pid 1 is the host's init; /proc's
    # kernel knobs still fenced (opened for writing, never written: refused)
    p = _run(tmp_path, *flags, "--receipt", "-", cmd=(
        "readlink /proc/self/ns/pid; test -e /proc/1 && echo SEES-INIT; "
        "(: > /proc/sys/kernel/core_pattern) 2>/dev/null && echo CORE-WRITABLE; exit 0"))
    assert p.returncode == 0, p
    assert own in p.stdout and "SEES-INIT" in p.stdout, p.stdout
    assert "CORE-WRITABLE" not in p.stdout
    receipt = json.loads(p.stderr[p.stderr.index("{"):])
    assert receipt["layers"]["pidns"]["status"] == "degraded", receipt["layers"]["pidns"]
    assert receipt["layers"]["pidns"]["reason"].startswith("proc: "), receipt["layers"]["pidns"]


def test_probe_names_no_pidns_and_the_remedy(tmp_path: Path) -> None:
    p = _masked(tmp_path, "probe", "--json", *EXECUTOR_ARGS)
    report = json.loads(p.stdout)
    assert report["error"] is None, report["error"]
    assert report["rung"]["name"] == "no-pidns", report["rung"]
    pidns = report["layers"]["pidns"]
    assert pidns["detail"].startswith("proc: ") and "--rung no-pidns" in pidns["remedy"], pidns
    text = _masked(tmp_path, "probe", *EXECUTOR_ARGS).stdout
    assert "--rung no-pidns runs here" in text and "unless the missing" not in text, text
