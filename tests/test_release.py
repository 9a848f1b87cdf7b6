"""Between runs the runtime does not keep the jail's file system busy (issue #14 item 5).

The confinement cache keeps identities (device, inode) only, never an fd: with no spare
alive, a plain umount of the jail's file system succeeds right after the runs, and the file
system is gone. The native executor's idle spares wait with the mount view built (clones of
the jail's mount) or a private copy of the host's mounts: umount then succeeds, yet the file
system lives on in them; ``hcp_linux.release_resources()`` retires them, and then nothing of
this process holds it. Real mounts (a tmpfs, and ext4 on a loop device when the host has
one), real umount2(2); nothing mocked.
"""
from __future__ import annotations

import errno
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Iterator, NamedTuple

import pytest

from sandboxing import TIMEOUT, jail  # noqa: F401

from hcp_linux import Policy, Sandbox, native, release_resources
from hcp_linux.plan import confinement, plan
from hcp_linux.run import executor
from hcp_linux import _libc as L
from hcp_linux.errors import ChildSetupError
from hcp_linux.policy.resolve import resolve

class MountedJail(NamedTuple):
    path: Path
    dev: str  # "major:minor" as in /proc/PID/mountinfo
    loop: str | None  # the loop device under it, if any


def _loop_possible() -> bool:
    return bool(shutil.which("losetup") and shutil.which("mkfs.ext4")
                and os.path.exists("/dev/loop-control"))


@pytest.fixture(params=["tmpfs", "ext4-on-loop"])
def mounted_jail(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MountedJail]:
    """A jail that is the root of a file system of its own; unmounted (lazily if it must)
    and its loop device detached afterwards, whatever the test did."""
    if os.geteuid() != 0:
        pytest.skip("needs root on the host")
    release_resources()  # no spare of an earlier test holds a copy of what we mount next
    path = tmp_path / "mnt"
    path.mkdir()
    loop = None
    if request.param == "tmpfs":
        L.mount(b"tmpfs", os.fsencode(path), b"tmpfs", 0, b"size=4m,mode=0755")
    else:
        if not _loop_possible():
            pytest.skip("no loop devices or mkfs.ext4 here")
        image = tmp_path / "fs.img"
        with open(image, "wb") as f:
            f.truncate(8 << 20)
        subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True, timeout=TIMEOUT,
                       capture_output=True)
        made = subprocess.run(["losetup", "--find", "--show", str(image)], check=True,
                              timeout=TIMEOUT, capture_output=True, text=True)
        loop = made.stdout.strip()
        try:
            L.mount(os.fsencode(loop), os.fsencode(path), b"ext4", 0)
        except OSError:
            subprocess.run(["losetup", "-d", loop], timeout=TIMEOUT)
            raise
    st = os.stat(path)
    try:
        yield MountedJail(path, f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}", loop)
    finally:
        try:
            if os.stat(path).st_dev == st.st_dev:  # still mounted (the test failed early)
                try:
                    L.umount2(os.fsencode(path), 0)
                except OSError:
                    L.umount2(os.fsencode(path), L.MNT_DETACH)
        finally:
            if loop is not None:
                subprocess.run(["losetup", "-d", loop], timeout=TIMEOUT)


def _umount(path: Path) -> int:
    """A plain umount2(path, 0): 0, or the errno it failed with."""
    try:
        L.umount2(os.fsencode(path), 0)
    except OSError as e:
        return e.errno or errno.EIO
    return 0


def _descendants() -> set[int]:
    """Every live process below this one (spares, their pid 1s, runs being torn down)."""
    parent: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
                parent[int(name)] = int(fields[1])
            except (OSError, IndexError, ValueError):
                pass  # gone meanwhile
    out: set[int] = set()
    frontier = {os.getpid()}
    while frontier:
        frontier = {pid for pid, ppid in parent.items() if ppid in frontier} - out
        out |= frontier
    return out


def _holders(dev: str) -> set[int]:
    """Processes of ours whose mount namespace holds a mount of the file system ``dev``."""
    out = set()
    for pid in _descendants():
        try:
            with open(f"/proc/{pid}/mountinfo") as f:
                if any(line.split()[2] == dev for line in f):
                    out.add(pid)
        except OSError:
            pass  # gone meanwhile
    return out


def _foreign_holders(dev: str) -> set[int]:
    """Processes not ours (other users of this host) that hold a copy of the mount: a mount
    namespace made while it was mounted copies it."""
    ours, me = _descendants() | {os.getpid()}, os.readlink("/proc/self/ns/mnt")
    out = set()
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) not in ours:
            try:
                if os.readlink(f"/proc/{name}/ns/mnt") == me:
                    continue
                with open(f"/proc/{name}/mountinfo") as f:
                    if any(line.split()[2] == dev for line in f):
                        out.add(int(name))
            except OSError:
                pass
    return out


def _block_device_claimed(loop: str) -> bool:
    """True while a mounted file system (anywhere) still holds the block device: an
    exclusive open is refused with EBUSY then."""
    try:
        fd = os.open(loop, os.O_RDONLY | os.O_EXCL | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.EBUSY:
            return True
        raise
    os.close(fd)
    return False


def _released(loop: str, dev: str) -> bool:
    """The block device is no longer claimed, or only by other software of this host: a
    mount namespace another process made while the file system was mounted holds a copy
    until that process is gone, which may be a moment after the umount. Waits, bounded."""
    deadline = time.monotonic() + TIMEOUT
    while _block_device_claimed(loop):
        if _foreign_holders(dev) or time.monotonic() >= deadline:
            return bool(_foreign_holders(dev))
        time.sleep(0.05)
    return True


def _open_fds_on(dev: str) -> list[int]:
    """This process's fds on the file system ``dev``."""
    out = []
    for name in os.listdir("/proc/self/fd"):
        try:
            st = os.stat(int(name))
        except OSError:
            continue  # the fd listdir itself used
        if f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}" == dev:
            out.append(int(name))
    return out


def _warm(jail_: MountedJail, runs: int = 4) -> Sandbox:
    """Runs in the jail until the cache is warm and, with the native executor, spares of
    this jail's view wait (the pool has them, and nothing else of ours is still running)."""
    sb = Sandbox(Policy(jail=str(jail_.path)))
    ready = native.stats["ready"]
    for i in range(runs):
        run = sb.run(["sh", "-c", f"echo {i} >> log"], timeout=TIMEOUT)
        assert run.returncode == 0, run
        time.sleep(0.02)  # as between an agent's commands: the keeper refills
    assert (jail_.path / "log").read_text() == "".join(f"{i}\n" for i in range(runs))
    if native.selected() == "native" and native.spares.mode() == "auto":
        assert native.stats["ready"] > ready, native.stats  # runs went to prepared spares
        pool = native.spares.pool()
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            spares = set(pool.idle_pids())
            settled = spares and not pool.busy
            if settled and all(pid in spares or _ppid(pid) in spares
                               for pid in _descendants()):
                break
            time.sleep(0.01)
        else:
            raise AssertionError("no idle spare, or runs still going")
    return sb


def _ppid(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


@pytest.mark.root_only  # mounting a file system needs root on the host
def test_after_release_the_jail_unmounts_and_its_file_system_is_gone(
        mounted_jail: MountedJail) -> None:
    """Warm cache (and spares, natively), then release_resources(): a plain umount succeeds
    and no process of ours still holds the file system (a loop device is free again).
    Negative control: an O_PATH fd on the jail makes the same umount fail with EBUSY."""
    _warm(mounted_jail)
    if native.selected() == "native":
        assert _holders(mounted_jail.dev), "the idle spares should hold the jail's mount"
    assert _open_fds_on(mounted_jail.dev) == []  # the cache holds identities, not fds
    fd = os.open(mounted_jail.path, os.O_PATH | os.O_CLOEXEC)
    try:
        assert _umount(mounted_jail.path) == errno.EBUSY  # the check can fail
    finally:
        os.close(fd)
    assert release_resources() is True
    assert _holders(mounted_jail.dev) == set()  # at once: the spares are gone, reaped
    assert _umount(mounted_jail.path) == 0
    assert _holders(mounted_jail.dev) == set()
    if mounted_jail.loop is not None:
        assert _released(mounted_jail.loop, mounted_jail.dev)  # the file system is released


@pytest.mark.root_only
def test_without_spares_nothing_holds_the_jail_between_runs(mounted_jail: MountedJail) -> None:
    """No release call: with no spare (the ctypes executor, or native ones turned off), the
    runtime holds nothing of the jail once the runs have returned, the warm cache included."""
    native.set_spares("never")
    try:
        before = dict(confinement.cache_stats)
        _warm(mounted_jail, runs=3)
        assert confinement.cache_stats["reused"] - before["reused"] == 2  # the cache was warm
        assert _open_fds_on(mounted_jail.dev) == []
        deadline = time.monotonic() + TIMEOUT  # a run's monitor may still be tearing down
        while _holders(mounted_jail.dev) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _holders(mounted_jail.dev) == set()
        assert _umount(mounted_jail.path) == 0
        if mounted_jail.loop is not None:
            assert _released(mounted_jail.loop, mounted_jail.dev)
    finally:
        native.set_spares("auto")


@pytest.mark.root_only
def test_idle_spares_keep_an_unmounted_file_system_alive_until_released(
        mounted_jail: MountedJail) -> None:
    """Why release_resources exists: with spares waiting, umount succeeds, yet the file system
    lives on in their mount namespaces (the loop device stays claimed) until they go."""
    if native.selected() != "native":
        pytest.skip("spares are the native executor's")
    _warm(mounted_jail)
    assert _umount(mounted_jail.path) == 0
    held = _holders(mounted_jail.dev)
    assert held, "the idle spares should still hold the unmounted file system"
    if mounted_jail.loop is not None:
        assert _block_device_claimed(mounted_jail.loop)
    assert release_resources() is True
    assert _holders(mounted_jail.dev) == set()
    assert not any(os.path.exists(f"/proc/{pid}") for pid in held)
    if mounted_jail.loop is not None:
        assert _released(mounted_jail.loop, mounted_jail.dev)


@pytest.mark.root_only
def test_the_next_run_after_a_release_works(mounted_jail: MountedJail) -> None:
    """The cache is rebuilt (made afresh, then reused) and, natively, spares come back."""
    sb = _warm(mounted_jail)
    assert release_resources() is True
    before, ready = dict(confinement.cache_stats), native.stats["ready"]
    for _ in range(4):
        run = sb.run(["sh", "-c", "echo again >> log; cat log | wc -l"], capture_output=True,
                     timeout=TIMEOUT)
        assert run.returncode == 0, run
        time.sleep(0.02)
    assert run.stdout.strip() == b"8"
    assert confinement.cache_stats["made"] - before["made"] == 1
    assert confinement.cache_stats["reused"] - before["reused"] == 3
    if native.selected() == "native":
        assert native.stats["ready"] > ready  # spares were made again, once the kind repeated
    assert release_resources() is True


@pytest.mark.root_only
def test_release_waits_for_the_spare_being_made(mounted_jail: MountedJail,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A spare the keeper is making at the moment of the release (its view built, not yet in
    the pool) is waited for and retired too: none is left holding the jail afterwards."""
    if native.selected() != "native":
        pytest.skip("spares are the native executor's")
    import select
    import threading
    made, go = threading.Event(), threading.Event()
    real = native.spares.make
    pidfds: list[int] = []  # of the spares held back (taken while they are our children)

    def held_back(kind: tuple, sigmask: "set[int] | None" = None) -> "native.spares.Spare":
        spare = real(kind, sigmask)
        if sigmask is not None and kind[-1] is not None:  # the keeper, a spare with a view
            pidfds.append(os.pidfd_open(spare.pid))
            made.set()
            go.wait(TIMEOUT)
        return spare

    monkeypatch.setattr(native.spares, "make", held_back)
    try:
        sb = Sandbox(Policy(jail=str(mounted_jail.path)))
        for _ in range(3):  # the view repeats: the keeper makes spares of it
            assert sb.run(["true"], timeout=TIMEOUT).returncode == 0
        assert made.wait(TIMEOUT), "the keeper made no spare"
        assert _holders(mounted_jail.dev)  # the new spare holds the jail's mount already
        result: list[bool] = []
        releasing = threading.Thread(target=lambda: result.append(release_resources()))
        releasing.start()
        releasing.join(0.2)
        assert releasing.is_alive()  # it waits for the keeper
        go.set()
        releasing.join(TIMEOUT)
        assert result == [True]
        # exited already (not left to exit in the background): a pidfd reads ready
        assert pidfds and all(select.select([fd], [], [], 0)[0] for fd in pidfds)
        assert _holders(mounted_jail.dev) == set()
        assert _umount(mounted_jail.path) == 0
    finally:
        go.set()
        for fd in pidfds:
            os.close(fd)


def test_release_is_safe_while_runs_go_on(jail: Path) -> None:  # noqa: F811
    """Releasing while other threads run (spares taken, made, handed over meanwhile): every
    run succeeds, and each release retires what was idle then."""
    import threading
    sb = Sandbox(Policy(jail=str(jail)))
    failures: list[object] = []
    stop = threading.Event()

    def runner() -> None:
        for _ in range(15):
            run = sb.run(["true"], timeout=TIMEOUT)
            if run.returncode != 0:
                failures.append(run)

    results: list[bool] = []

    def releaser() -> None:
        while not stop.is_set():
            results.append(release_resources())
            time.sleep(0.002)

    threads = [threading.Thread(target=runner) for _ in range(4)]
    churn = threading.Thread(target=releaser)
    churn.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    churn.join()
    assert not failures, failures[:3]
    assert results and all(results)
    assert release_resources() is True
    assert not native.spares.idle_pids()


def test_a_root_swapped_before_the_ruleset_is_made_refuses_the_run(jail: Path,  # noqa: F811
                                                                   tmp_path: Path) -> None:
    """The parent makes the Landlock ruleset (the ctypes executor; any executor without a
    mount view) from fds opened at that moment, each checked against the inode the plan
    recorded, and closed once it is made: a jail renamed away and replaced between planning
    and the ruleset is refused (ESTALE), never given the rule. Control: the same steps with the
    jail left in place run, and leave no fd behind."""
    policy = resolve(Policy(jail=str(jail)))
    layers = Sandbox(policy)._wanted_layers()
    st = os.stat(jail)
    dev = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    fds = len(_open_fds_on(dev))

    control = plan.compile_plan(policy, ["true"], layers=layers)
    try:
        assert control.landlock is not None
        proc = executor.spawn(control, stdout=subprocess.DEVNULL, executor="ctypes")
        assert proc.wait(TIMEOUT) == 0
    finally:
        control.close()
    assert len(_open_fds_on(dev)) == fds

    for how in ("create", "spawn"):
        p = plan.compile_plan(policy, ["true"], layers=layers)
        try:
            jail.rename(tmp_path / f"old-{how}")
            jail.mkdir()
            with pytest.raises(ChildSetupError) as e:
                if how == "create":
                    p.landlock.create()  # type: ignore[union-attr]
                else:
                    executor.spawn(p, stdout=subprocess.DEVNULL, executor="ctypes")
            assert (e.value.step, e.value.errno) == ("landlock-rules", errno.ESTALE), e.value
            assert e.value.detail == f"{jail} changed since it was checked"
        finally:
            p.close()
    assert len(_open_fds_on(dev)) == fds


def test_release_refuses_a_bad_timeout() -> None:
    from hcp_linux import PolicyError
    for bad in (-1, float("nan"), float("inf"), True, "5"):
        with pytest.raises(PolicyError):
            release_resources(bad)  # type: ignore[arg-type]
    assert release_resources(0.5) is True  # control: a good one
