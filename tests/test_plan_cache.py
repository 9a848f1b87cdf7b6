"""The confinement cache (confinement.py): a policy's mount view and Landlock rules are made once and
reused while every host path they were made from is unchanged; a swapped root or a new secret
is seen by the very next run. Real runs, real files, nothing mocked below the Python API.
"""
from __future__ import annotations

import fcntl
import os
import subprocess
import time
from pathlib import Path

import pytest

from sandboxing import TIMEOUT, jail  # noqa: F401

from hcp_linux import Policy, Sandbox
from hcp_linux.plan import confinement, plan
from hcp_linux.policy.resolve import resolve


def _counts() -> dict[str, int]:
    return dict(confinement.cache_stats)


def _delta(before: dict[str, int]) -> dict[str, int]:
    return {k: confinement.cache_stats[k] - before[k] for k in before}


@pytest.fixture(autouse=True)
def _fresh_cache():
    confinement.clear_cache()
    yield
    confinement.clear_cache()


def test_a_repeated_policy_reuses_its_confinement(jail: Path) -> None:
    sb = Sandbox(Policy(jail=str(jail)))
    before = _counts()
    for _ in range(3):
        assert sb.run(["true"], timeout=TIMEOUT).returncode == 0
    assert _delta(before) == {"made": 1, "reused": 2, "not_kept": 0}


def test_a_swapped_jail_is_seen_by_the_next_run(tmp_path: Path) -> None:
    """Renaming the jail away and making a new one at the same path: the next run works in the
    new directory (a stale view would fail on the old inode, or worse write into the old)."""
    jail = tmp_path / "jail"
    jail.mkdir()
    sb = Sandbox(Policy(jail=str(jail)))
    first = sb.run(["sh", "-c", "echo one > f"], timeout=TIMEOUT)
    assert first.returncode == 0, first
    jail.rename(tmp_path / "old")
    jail.mkdir()
    before = _counts()
    second = sb.run(["sh", "-c", "echo two > f && cat f"], capture_output=True, timeout=TIMEOUT)
    assert (second.returncode, second.stdout) == (0, b"two\n"), second
    assert (jail / "f").read_text() == "two\n"
    assert (tmp_path / "old" / "f").read_text() == "one\n"  # the old directory untouched
    assert _delta(before)["made"] == 1  # remade, not reused


def _secrets_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, age: float) -> Path:
    """A read-only root whose ``*_key`` files are masked like /etc/ssh's host keys."""
    secrets = tmp_path / "keys"
    secrets.mkdir()
    monkeypatch.setattr(confinement, "MASKED_PATHS",
                        confinement.MASKED_PATHS + (f"{secrets}/*_key",))
    monkeypatch.setattr(confinement, "_MASK_DIRS", confinement._MASK_DIRS + (str(secrets),))
    if age:
        then = time.time() - age
        os.utime(secrets, (then, then))
    return secrets


def test_a_secret_added_after_a_run_is_masked_in_the_next(jail: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    secrets = _secrets_dir(tmp_path, monkeypatch, age=60)
    sb = Sandbox(Policy(jail=str(jail), read_only_roots=(str(secrets),)))
    key = secrets / "host_key"
    read = ["sh", "-c", f"cat {key} 2>/dev/null; true"]
    assert sb.run(read, timeout=TIMEOUT).returncode == 0  # cached, no key yet
    key.write_text("SECRET\n")
    before = _counts()
    run = sb.run(read, capture_output=True, timeout=TIMEOUT)
    assert run.returncode == 0, run
    assert b"SECRET" not in run.stdout
    assert str(key) in run.receipt["layers"]["mountns"]["masked"]
    assert _delta(before)["reused"] == 0  # remade (and, its listing just changed, not kept)
    # controls: the file is readable on the host, and inside when no pattern masks it
    assert subprocess.run(["cat", str(key)], capture_output=True).stdout == b"SECRET\n"
    monkeypatch.setattr(confinement, "MASKED_PATHS", confinement.MASKED_PATHS[:-1])
    plain = sb.run(read, capture_output=True, timeout=TIMEOUT)
    assert plain.stdout == b"SECRET\n", plain


def test_a_listing_changed_just_now_is_not_kept(jail: Path, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A directory modified within the file system's clock tick could change again without
    its mtime changing: a confinement made from it serves its own run only."""
    secrets = _secrets_dir(tmp_path, monkeypatch, age=0)
    sb = Sandbox(Policy(jail=str(jail), read_only_roots=(str(secrets),)))
    before = _counts()
    assert sb.run(["true"], timeout=TIMEOUT).returncode == 0
    assert _delta(before) == {"made": 0, "reused": 0, "not_kept": 1}


def _open_fds() -> set[int]:
    """This process's O_PATH fds: what a confinement holds (the spare pool's sockets, pipes,
    memfds and /dev/null come and go on their own)."""
    out = set()
    for n in os.listdir("/proc/self/fd"):
        try:
            if fcntl.fcntl(int(n), fcntl.F_GETFL) & os.O_PATH:
                out.add(int(n))
        except OSError:
            pass  # the fd listdir itself used
    return out


def test_a_plan_of_a_forgotten_confinement_runs_and_holds_no_fd(jail: Path) -> None:
    """A plan holds no fd (its Landlock rules' fds are opened when its ruleset is made, and
    closed then): clearing the cache while a plan is being spawned (another thread) takes
    nothing from under it, and nothing is left open."""
    from hcp_linux.run import executor
    fds = _open_fds()
    policy = resolve(Policy(jail=str(jail)))
    sb = Sandbox(policy)
    p = plan.compile_plan(policy, ["true"], layers=sb._wanted_layers())
    confinement.clear_cache()
    assert _open_fds() <= fds
    proc = executor.spawn(p, stdout=subprocess.DEVNULL)
    assert proc.wait(TIMEOUT) == 0
    p.close()
    assert _open_fds() <= fds  # nothing left open by the plan or the cache


def test_the_cache_holds_no_fd(jail: Path) -> None:
    """The cached confinement keeps identities (device, inode), never an fd: nothing of a
    granted root stays open between runs (tests/test_release.py unmounts one)."""
    fds = _open_fds()
    sb = Sandbox(Policy(jail=str(jail)))
    before = _counts()
    for _ in range(2):
        assert sb.run(["true"], timeout=TIMEOUT).returncode == 0
    assert _delta(before)["reused"] == 1  # the cache is warm
    assert _open_fds() <= fds
    control = os.open(jail, os.O_PATH | os.O_CLOEXEC)  # the check sees an fd that is there
    try:
        assert control in _open_fds() - fds
    finally:
        os.close(control)


def test_concurrent_runs_while_the_cache_is_cleared(jail: Path) -> None:
    """Eight threads run while another keeps clearing the cache: every run succeeds (no fd
    closed under a plan) and nothing is left open afterwards (no use count lost)."""
    import threading
    fds = _open_fds()
    sb = Sandbox(Policy(jail=str(jail)))
    failures: list[object] = []
    stop = threading.Event()

    def runner() -> None:
        for _ in range(15):
            run = sb.run(["sh", "-c", "test -d /usr/bin && echo ok"], capture_output=True,
                         timeout=TIMEOUT)
            if (run.returncode, run.stdout) != (0, b"ok\n"):
                failures.append(run)

    def clearer() -> None:
        while not stop.is_set():
            confinement.clear_cache()
            time.sleep(0.001)

    threads = [threading.Thread(target=runner) for _ in range(8)]
    churn = threading.Thread(target=clearer)
    churn.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    churn.join()
    assert not failures, failures[:3]
    confinement.clear_cache()
    assert _open_fds() <= fds


def test_the_environment_is_read_afresh_for_each_run(jail: Path, monkeypatch) -> None:
    """The child environment built from os.environ is reused while os.environ is unchanged:
    a change between runs (set, changed, removed) shows in the next run, and a secret set
    between runs is dropped as ever (the receipt names it among the removed)."""
    sb = Sandbox(Policy(jail=str(jail)))

    def env_of() -> tuple[str, list[str]]:
        r = sb.run(["sh", "-c", 'echo "LC_TIME=${LC_TIME-unset} TOKEN=${HCP_T_TOKEN-unset}"'],
                   capture_output=True, timeout=TIMEOUT)
        assert r.returncode == 0, r.stderr
        return r.stdout.decode().strip(), r.receipt["env"]["removed"]

    monkeypatch.delenv("LC_TIME", raising=False)
    first = env_of()
    assert first == env_of()  # same environment: same child environment
    assert first[0] == "LC_TIME=unset TOKEN=unset"
    monkeypatch.setenv("LC_TIME", "C")
    monkeypatch.setenv("HCP_T_TOKEN", "secret")
    out, removed = env_of()
    assert out == "LC_TIME=C TOKEN=unset" and "HCP_T_TOKEN" in removed
    monkeypatch.setenv("LC_TIME", "POSIX")
    assert env_of()[0] == "LC_TIME=POSIX TOKEN=unset"
    monkeypatch.delenv("LC_TIME")
    monkeypatch.delenv("HCP_T_TOKEN")
    out, removed = env_of()
    assert out == "LC_TIME=unset TOKEN=unset" and "HCP_T_TOKEN" not in removed
