"""Writeback when things go wrong (docs/failure-paths.md), and reclaiming what a killed runtime left.

Real file systems, real processes: a full tmpfs (mounted on the host as root; in a mount
namespace of our own otherwise), a destination directory removed during the run, an immutable
destination, the runtime SIGKILLed while it writes and while its command runs. Each failure
must be one line ``error: sandbox: writeback PATH: CAUSE``, exit 125, every destination as it
was, no temp file left; each has its control (the same run without the fault replaces every
output). Reclaiming must remove what dead owners left and never what a live run uses, nor
entries of another uid or pid namespace, symlinks, or names that are not exactly ours.
"""
from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from hcp_linux import Policy
from hcp_linux.driver.driver import LinuxDriver
from hcp_linux.errors import WritebackError
from sandboxing import (EXECUTOR_ARGS, IS_ROOT, TIMEOUT, jail_home_of, jails_in, kill_by_pid, processes_with,
                        sleep_token, wait_for)

PACK = '[wrap]\nbin = "sh"\nworkspace = { mode = "MODE" }\n'
#: Run by every command: "$1" is the shared dir; the command says it started, then waits
#: (boundedly) for the test's go-ahead there.
WAIT_FOR_GO = ('touch "$1/started"; i=0; while [ ! -e "$1/go" ] && [ $i -lt 6000 ]; do '
               'sleep 0.01; i=$((i+1)); done; ')
HEX = "0123456789ab"
NS = os.stat("/proc/self/ns/pid").st_ino


class Cli:
    """`hcp-linux run --pack` and `hcp-linux gc`, with their own temp dir, state dir, cwd."""

    def __init__(self, base: Path, mode: str = "ephemeral") -> None:
        self.base = base
        self.tmp, self.state, self.work, self.shared = (base / n for n in
                                                        ("tmp", "state", "work", "shared"))
        for d in (self.tmp, self.state, self.work, self.shared):
            d.mkdir()
        (base / "pack").mkdir()
        (base / "pack" / "pack.toml").write_text(PACK.replace("MODE", mode))
        self.pack = str(base / "pack" / "pack.toml")
        self.env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "TMPDIR": str(self.tmp),
                    "XDG_STATE_HOME": str(self.state), "HOME": str(base)}

    def argv(self, script: str, *args: str, extra: tuple[str, ...] = ()) -> list[str]:
        """The command is ``sh -c SCRIPT sh SHARED ARGS...``: "$1" is the shared dir."""
        return [sys.executable, "-m", "hcp_linux", "run", *EXECUTOR_ARGS, "--pack", self.pack,
                "--timeout", str(TIMEOUT), "--write-root", str(self.shared), *extra, "--",
                "sh", "-c", script, "sh", str(self.shared), *args]

    def run(self, script: str, *args: str, extra: tuple[str, ...] = ()
            ) -> subprocess.CompletedProcess:
        return subprocess.run(self.argv(script, *args, extra=extra), cwd=self.work,
                              env=self.env, capture_output=True, timeout=TIMEOUT)

    def popen(self, script: str, *args: str) -> subprocess.Popen:
        return subprocess.Popen(self.argv(script, *args), cwd=self.work, env=self.env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def gc(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "hcp_linux", "gc", "--tmp-dir",
                               str(self.tmp), "--state-dir", str(self.state / "hcp-linux"),
                               *args], env=self.env, capture_output=True, timeout=TIMEOUT)

    def jails(self) -> list[str]:
        return [n for n in jails_in(self.tmp) if n.startswith("hcp-linux-")]


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    return Cli(tmp_path)


def temps(d: Path) -> list[str]:
    return sorted(n for n in os.listdir(d) if ".hcp-" in n)


def start_time(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return int(f.read().rsplit(b")", 1)[1].split()[19])


def dead_owner() -> str:
    """The identity of a process that has exited (started, timed, killed and reaped here)."""
    p = subprocess.Popen(["sleep", "60"])
    try:
        start = start_time(p.pid)
    finally:
        kill_by_pid(p)
    return f"{p.pid}-{start}-{NS}"


def lines(r: subprocess.CompletedProcess) -> list[str]:
    return sorted(r.stdout.decode().splitlines())


# --- all or nothing ---------------------------------------------------------------------------

#: Two outputs: $3 gets "new1", $5 gets $6 zero bytes.
TWO = 'printf new1 > "$3"; head -c "$6" /dev/zero > "$5"'


@pytest.mark.root_only
def test_a_full_file_system_fails_the_whole_writeback(cli: Cli) -> None:
    """ENOSPC for the second output: exit 125, one line, and the first output (in another
    directory, with room) is not replaced either. Control: a second output that fits."""
    d1, full = cli.work / "d1", cli.base / "full"
    d1.mkdir()
    full.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "hcp-test-full", str(full)],
                   check=True, timeout=TIMEOUT)
    try:
        old1, old2 = b"old1\0\xff\n", b"old2" * 100
        for size in (200_000, 1000):
            (d1 / "out1").write_bytes(old1)
            (full / "out2").write_bytes(old2)
            r = cli.run(TWO, "-o", "d1/out1", "-o", str(full / "out2"), str(size))
            if size == 1000:  # control
                assert r.returncode == 0, r.stderr
                assert (d1 / "out1").read_bytes() == b"new1"
                assert (full / "out2").read_bytes() == b"\0" * size
            else:
                assert (r.returncode, r.stderr.decode()) == (
                    125, f"error: sandbox: writeback {full}/out2: No space left on device\n")
                assert (d1 / "out1").read_bytes() == old1
                assert (full / "out2").read_bytes() == old2
            assert temps(d1) == [] and temps(full) == [] and cli.jails() == []
    finally:
        subprocess.run(["umount", str(full)], check=True, timeout=TIMEOUT)


_IN_OWN_MOUNT_NS = r'''
full=$1; size=$2; shift 2
mount -t tmpfs -o size=64k hcp-test-full "$full" || exit 99
printf old2 > "$full/out2"
"$@"
printf 'rc=%s\n' "$?"
printf 'out2=%s %s\n' "$(wc -c < "$full/out2")" \
  "$(head -c 8 "$full/out2" | od -An -tx1 | tr -d ' \n')"
printf 'ls=%s\n' "$(ls -A "$full" | tr '\n' ' ')"
'''


def test_a_full_file_system_in_a_mount_namespace_of_our_own(cli: Cli) -> None:
    """The same ENOSPC where no host mount is possible (as nobody): a tmpfs in a private
    mount namespace (unprivileged, in a user namespace of ours) that the CLI runs in.
    Control: a second output that fits."""
    d1, full = cli.work / "d1", cli.base / "full"
    d1.mkdir()
    full.mkdir()
    # unprivileged: also a user namespace mapping us to root there (mount(8) wants euid 0)
    unshare = ["unshare", "-m", "--propagation", "private"] + ([] if IS_ROOT else ["-r"])
    probe = subprocess.run(unshare + ["true"], capture_output=True, timeout=TIMEOUT)
    if probe.returncode != 0:
        pytest.skip(f"no mount namespace here: {probe.stderr.decode().strip()}")
    for size in (200_000, 1000):
        (d1 / "out1").write_bytes(b"old1")
        r = subprocess.run(
            unshare + ["sh", "-c", _IN_OWN_MOUNT_NS, "sh", str(full), str(size),
                       *cli.argv(TWO, "-o", "d1/out1", "-o", str(full / "out2"), str(size))],
            cwd=cli.work, env=cli.env, capture_output=True, timeout=TIMEOUT)
        report = r.stdout.decode().splitlines()
        if size == 1000:  # control
            assert report[0] == "rc=0", r.stderr
            assert (d1 / "out1").read_bytes() == b"new1"
            assert report[1:] == ["out2=1000 0000000000000000", "ls=out2 "]
        else:
            assert r.stderr.decode() == (f"error: sandbox: writeback {full}/out2: "
                                         f"No space left on device\n")
            assert report == ["rc=125", "out2=4 6f6c6432", "ls=out2 "]  # "old2"
            assert (d1 / "out1").read_bytes() == b"old1"
        assert temps(d1) == [] and cli.jails() == []
    assert os.listdir(full) == []  # the tmpfs went with its namespace


def test_a_destination_directory_removed_during_the_run(cli: Cli) -> None:
    """The second output's directory is removed while the command runs: exit 125, one
    line naming it, the first output unchanged, the receipt keeps the command's status
    and says what failed. Control: the same run with the directory left in place."""
    d1, d2 = cli.work / "d1", cli.work / "d2"
    receipt = cli.base / "receipt.json"
    for remove in (True, False):
        d1.mkdir()
        d2.mkdir()
        (d1 / "out1").write_bytes(b"old1\n")
        for f in ("started", "go"):
            (cli.shared / f).unlink(missing_ok=True)
        p = subprocess.Popen(
            cli.argv(WAIT_FOR_GO + 'printf new1 > "$3"; printf new2 > "$5"',
                     "-o", "d1/out1", "-o", "d2/out2", extra=("--receipt", str(receipt))),
            cwd=cli.work, env=cli.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            wait_for(lambda: (cli.shared / "started").exists(), "the command to start")
            if remove:
                d2.rmdir()
            (cli.shared / "go").touch()
            _, err = p.communicate(timeout=TIMEOUT)
        finally:
            kill_by_pid(p)
        got = json.loads(receipt.read_text())
        assert got["exit"] == {"returncode": 0, "timed_out": False}
        if remove:
            assert (p.returncode, err.decode()) == (
                125, f"error: sandbox: writeback {d2}/out2: No such file or directory "
                     f"(the directory was removed during the run)\n")
            assert (d1 / "out1").read_bytes() == b"old1\n"
            assert got["driver"]["writeback"] == {
                "status": "failed", "path": f"{d2}/out2", "written": [],
                "error": "No such file or directory (the directory was removed during the run)"}
            assert not d2.exists()
        else:
            assert p.returncode == 0, err
            assert (d1 / "out1").read_bytes() == b"new1"
            assert (d2 / "out2").read_bytes() == b"new2"
            assert got["driver"]["writeback"]["status"] == "written"
            (d2 / "out2").unlink()
            d2.rmdir()
        assert temps(d1) == [] and cli.jails() == []
        (d1 / "out1").unlink()
        d1.rmdir()


@pytest.mark.root_only
def test_a_rename_that_fails_puts_back_the_outputs_already_replaced(cli: Cli) -> None:
    """Phase 2 fails on the second output (immutable: its temp file is written, but it
    cannot be replaced): the first output, already swapped in, is put back, the very same
    file (inode, mode, bytes). Control: the same run once the flag is cleared."""
    d = cli.work / "d"
    d.mkdir()
    (d / "out1").write_bytes(b"old1\0")
    os.chmod(d / "out1", 0o640)
    (d / "out2").write_bytes(b"old2")
    before = os.stat(d / "out1")
    chattr = subprocess.run(["chattr", "+i", str(d / "out2")], capture_output=True,
                            timeout=TIMEOUT)
    if chattr.returncode != 0:
        pytest.skip(f"chattr +i unsupported here: {chattr.stderr.decode().strip()}")
    try:
        r = cli.run(TWO, "-o", "d/out1", "-o", "d/out2", "10")
        assert (r.returncode, r.stderr.decode()) == (
            125, f"error: sandbox: writeback {d}/out2: Operation not permitted\n")
        after = os.stat(d / "out1")
        assert (after.st_ino, after.st_mode, (d / "out1").read_bytes()) == (
            before.st_ino, before.st_mode, b"old1\0")
        assert (d / "out2").read_bytes() == b"old2" and temps(d) == []
    finally:
        subprocess.run(["chattr", "-i", str(d / "out2")], check=True, timeout=TIMEOUT)
    r = cli.run(TWO, "-o", "d/out1", "-o", "d/out2", "10")  # control
    assert r.returncode == 0, r.stderr
    assert (d / "out1").read_bytes() == b"new1" and (d / "out2").read_bytes() == b"\0" * 10
    assert os.stat(d / "out1").st_mode == before.st_mode and temps(d) == []


def test_the_python_api_raises_writeback_error_with_the_result(tmp_path: Path) -> None:
    """From LinuxDriver.run: a WritebackError (exit code 125) whose ``result`` keeps the
    command's status and a receipt saying what failed. Control: the directory kept."""
    (tmp_path / "pack").mkdir()
    (tmp_path / "pack" / "pack.toml").write_text(PACK.replace("MODE", "ephemeral"))
    shared, tmp = tmp_path / "shared", tmp_path / "tmp"
    shared.mkdir()
    tmp.mkdir()
    driver = LinuxDriver(Policy(jail=str(tmp_path), write_roots=(str(shared),),
                                timeout=TIMEOUT), tmp_dir=str(tmp))
    for remove in (True, False):
        d = tmp_path / "d"
        d.mkdir()
        for f in ("started", "go"):
            (shared / f).unlink(missing_ok=True)

        def go() -> None:
            wait_for(lambda: (shared / "started").exists(), "the command to start")
            if remove:
                d.rmdir()
            (shared / "go").touch()
        t = threading.Thread(target=go)
        t.start()
        argv = ["sh", "-c", WAIT_FOR_GO + 'printf new > "$3"', "sh", str(shared), "-o",
                str(d / "out")]
        try:
            if remove:
                with pytest.raises(WritebackError) as info:
                    driver.run(str(tmp_path / "pack" / "pack.toml"), argv)
                e = info.value
                assert e.exit_code == 125 and e.path == str(d / "out")
                assert e.cause.startswith("No such file or directory")
                assert e.result.returncode == 0 and e.result.writeback.written == ()
                assert e.result.receipt["driver"]["writeback"]["status"] == "failed"
            else:
                r = driver.run(str(tmp_path / "pack" / "pack.toml"), argv)
                assert r.returncode == 0 and (d / "out").read_bytes() == b"new"
                (d / "out").unlink()
                d.rmdir()
        finally:
            t.join(TIMEOUT)
        assert jails_in(tmp) == []


# --- a runtime killed ---------------------------------------------------------------------

def _kill_while_writing(cli: Cli, d: Path, old: bytes) -> tuple[int, str]:
    """Start a run with a large output, and SIGKILL the CLI while its temp file exists
    (stopped first, so what it left is seen for sure). Returns (pid, temp name)."""
    for size in (64 << 20, 256 << 20):  # larger if the writeback was over before we saw it
        (d / "big").write_bytes(old)
        p = cli.popen('head -c "$4" /dev/zero > "$3"', "-o", "d/big", str(size))
        seen: list[str] = []
        try:
            while p.poll() is None:
                if temps(d):
                    os.kill(p.pid, signal.SIGSTOP)
                    seen = temps(d)
                    break
        finally:
            kill_by_pid(p)
        if seen:
            assert p.returncode == -signal.SIGKILL
            return p.pid, seen[0]
    pytest.fail("the writeback never left a temp file long enough to be seen")


@pytest.mark.parametrize("reclaimer", ["gc", "next-run"])
def test_sigkill_during_writeback_is_reclaimed(cli: Cli, reclaimer: str) -> None:
    """The runtime killed mid-writeback: the destination is the old file or the whole new
    one, and the temp file and the jail it left are removed by `gc` or by the next run
    (the jail at its start, the temp file by its writeback into the same directory)."""
    d = cli.work / "d"
    d.mkdir()
    old = b"old content\n" * 10
    pid, tmp = _kill_while_writing(cli, d, old)
    assert tmp.startswith(f".big.hcp-{pid}-") and tmp.endswith(".tmp")
    [jail] = cli.jails()
    assert jail.startswith(f"hcp-linux-ephemeral-{pid}-")
    data = (d / "big").read_bytes()
    assert data == old or data == b"\0" * len(data) and len(data) >= 64 << 20
    if reclaimer == "gc":
        r = cli.gc(str(d))
        assert r.returncode == 0 and r.stderr == b""
        assert lines(r) == sorted([str(jail_home_of(cli.tmp) / jail), str(d / tmp)])
    else:
        r = cli.run('printf small > "$3"', "-o", "d/small")
        assert r.returncode == 0, r.stderr
        assert (d / "small").read_bytes() == b"small"
    assert temps(d) == [] and cli.jails() == []
    assert (d / "big").read_bytes() == data


def test_sigkill_during_an_ephemeral_run_is_reclaimed_by_the_next_run(cli: Cli) -> None:
    """The runtime killed while its command runs: the sandbox dies with it (nothing of the
    run is left running), its jail is left, and the next run removes it before starting."""
    token = sleep_token(30)
    p = cli.popen(f'touch "$1/started"; exec sleep {token}')
    try:
        wait_for(lambda: (cli.shared / "started").exists() and processes_with(
            f"sleep\0{token}", p.pid), "the command to start")
        [jail] = cli.jails()
    finally:
        kill_by_pid(p)
    wait_for(lambda: processes_with(f"sleep\0{token}") == [], "the sandbox to die")
    assert cli.jails() == [jail] and jail.startswith(f"hcp-linux-ephemeral-{p.pid}-")
    r = cli.run("true")
    assert r.returncode == 0, r.stderr
    assert cli.jails() == []


def test_a_live_runs_jail_and_temp_files_are_never_reclaimed(cli: Cli) -> None:
    """While run A is alive, neither `gc` nor another run (sweeping the same temp dir and
    writing into the same directory) removes A's jail or a temp file A owns. Control: once
    A is gone, its temp file is removed."""
    d = cli.work / "d"
    d.mkdir()
    a = cli.popen(WAIT_FOR_GO)
    try:
        wait_for(lambda: (cli.shared / "started").exists(), "run A to start")
        [jail] = cli.jails()
        assert jail.startswith(f"hcp-linux-ephemeral-{a.pid}-")
        live = d / f".out.hcp-{a.pid}-{start_time(a.pid)}-{NS}-{HEX}.tmp"
        live.write_text("A's")
        r = cli.gc("--dry-run", str(d))
        assert (r.returncode, r.stdout, r.stderr) == (0, b"", b"")
        r = cli.gc(str(d))
        assert (r.returncode, r.stdout, r.stderr) == (0, b"", b"")
        r = cli.run('printf b > "$3"', "-o", "d/other")
        assert r.returncode == 0, r.stderr
        assert cli.jails() == [jail] and live.read_text() == "A's"
        (cli.shared / "go").touch()
        assert a.wait(timeout=TIMEOUT) == 0
    finally:
        kill_by_pid(a)
    assert cli.jails() == []  # A's own cleanup
    r = cli.gc(str(d))  # control: A is gone now
    assert (r.returncode, lines(r)) == (0, [str(live)]) and not live.exists()


# --- what a sweep may touch -------------------------------------------------------------------

def test_only_our_exact_names_of_dead_owners_are_reclaimed(cli: Cli, tmp_path: Path) -> None:
    """Removed: regular files / real directories of ours, named exactly as we name them,
    whose owner is dead or whose pid now belongs to a process started at another time.
    Kept: a live owner, another pid namespace, near-miss names, symlinks (and what they
    point to), a directory with a temp file's name. `--dry-run` lists the same, removes
    nothing. A name with a newline is printed escaped, on one line."""
    d, t = cli.work / "d", cli.tmp
    d.mkdir()
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_text("keep")
    dead = dead_owner()
    me = os.getpid()
    live = f"{me}-{start_time(me)}-{NS}"
    recycled = f"{me}-{start_time(me) + 1}-{NS}"
    other_ns = dead.rsplit("-", 1)[0] + f"-{NS + 1}"
    gone_temps = [f".a.hcp-{dead}-{HEX}.tmp", f".b.hcp-{dead}-{HEX}.old",
                  f".c.hcp-{recycled}-{HEX}.tmp", f".new\nline.hcp-{dead}-{HEX}.tmp"]
    kept_temps = [f".d.hcp-{live}-{HEX}.tmp", f".e.hcp-{other_ns}-{HEX}.tmp",
                  f".f.hcp-{dead}-{HEX[:-1]}.tmp", f".g.hcp-{dead}-{HEX}.tmpx",
                  f"h.hcp-{dead}-{HEX}.tmp", f".i.hcp-{dead}-{HEX}.kept",
                  f".j.HCP-{dead}-{HEX}.tmp", f".k.hcp-0-{dead.split('-', 1)[1]}-{HEX}.tmp"]
    for name in gone_temps + kept_temps:
        (d / name).write_text("x")
    os.symlink(victim / "precious", d / f".l.hcp-{dead}-{HEX}.tmp")
    (d / f".m.hcp-{dead}-{HEX}.tmp").mkdir()
    gone_jails = [f"hcp-linux-ephemeral-{dead}-{HEX}", f"hcp-linux-none-{recycled}-{HEX}"]
    kept_jails = [f"hcp-linux-ephemeral-{live}-{HEX}", f"hcp-linux-ephemeral-{other_ns}-{HEX}",
                  f"hcp-linux-workspace-{dead}-{HEX}", f"hcp-linux-ephemeral-{dead}-{HEX}0"]
    for name in gone_jails + kept_jails:
        (t / name / "jail" / "sub").mkdir(parents=True)
        (t / name / "jail" / "sub" / "f").write_text("x")
    os.chmod(t / gone_jails[0] / "jail" / "sub", 0)  # a child may leave that
    os.symlink(victim, t / f"hcp-linux-ephemeral-{dead}-{HEX[::-1]}")
    (t / f"hcp-linux-none-{dead}-{HEX}").write_text("a file, not a jail")
    before_d, before_t = sorted(os.listdir(d)), sorted(os.listdir(t))
    expected = sorted([str(t / n) for n in gone_jails]
                      + [str(d / n).replace("\n", "\\x0a") for n in gone_temps])
    r = cli.gc("--dry-run", str(d))
    assert (r.returncode, r.stderr, lines(r)) == (0, b"", expected)
    assert sorted(os.listdir(d)) == before_d and sorted(os.listdir(t)) == before_t
    r = cli.gc(str(d))
    assert (r.returncode, r.stderr, lines(r)) == (0, b"", expected)
    assert sorted(os.listdir(d)) == sorted(set(before_d) - set(gone_temps))
    assert sorted(os.listdir(t)) == sorted(set(before_t) - set(gone_jails))
    assert (victim / "precious").read_text() == "keep" and os.listdir(victim) == ["precious"]


@pytest.mark.root_only
def test_another_uids_entries_are_never_reclaimed(cli: Cli) -> None:
    """Dead-owner names, but owned by nobody: left alone by root's sweep. Control: the same
    names owned by us are removed."""
    d = cli.work / "d"
    d.mkdir()
    dead = dead_owner()
    temp, jail = d / f".x.hcp-{dead}-{HEX}.tmp", cli.tmp / f"hcp-linux-ephemeral-{dead}-{HEX}"
    for owner, removed in ((65534, False), (0, True)):
        temp.write_text("x")
        jail.mkdir()
        os.chown(temp, owner, owner)
        os.chown(jail, owner, owner)
        r = cli.gc(str(d))
        assert r.returncode == 0, r.stderr
        assert lines(r) == (sorted([str(jail), str(temp)]) if removed else [])
        assert temp.exists() != removed and jail.exists() != removed
        if not removed:
            temp.unlink()
            jail.rmdir()


def test_gc_clears_staging_only_in_idle_workspaces(tmp_path: Path) -> None:
    """A `.hcp-io` left in a persistent workspace is removed by gc when the workspace's lock
    is free, and left alone while a run holds the lock (here: we hold it)."""
    cli = Cli(tmp_path, mode="workspace")
    r = cli.run("true")
    assert r.returncode == 0, r.stderr
    pack_dir = cli.state / "hcp-linux" / "workspaces" / "pack"
    io = pack_dir / "default" / ".hcp-io"
    (io / "out" / "0").mkdir(parents=True)
    (io / "out" / "0" / "half").write_text("a dead run's")
    fd = os.open(pack_dir / "default.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        r = cli.gc()
        assert (r.returncode, r.stdout, r.stderr) == (0, b"", b"") and io.exists()
    finally:
        os.close(fd)
    r = cli.gc()  # control: the lock is free
    assert (r.returncode, lines(r), r.stderr) == (0, [str(io)], b"") and not io.exists()


def test_gc_refuses_a_path_that_is_not_a_directory(cli: Cli) -> None:
    """Every PATH is checked before anything is removed: one line, exit 125."""
    dead = dead_owner()
    jail = cli.tmp / f"hcp-linux-ephemeral-{dead}-{HEX}"
    jail.mkdir()
    r = cli.gc(str(cli.base / "no\nsuch"))
    assert (r.returncode, r.stdout, r.stderr.decode()) == (
        125, b"", f"error: sandbox: gc {cli.base}/no\\x0asuch: No such file or directory\n")
    assert jail.exists()
    r = cli.gc()  # control
    assert (r.returncode, lines(r)) == (0, [str(jail)]) and not jail.exists()


def test_gc_with_a_home_that_does_not_exist_still_reclaims_jails(tmp_path: Path) -> None:
    """A service user (nobody: HOME=/nonexistent) has no default state dir, so no workspace
    to sweep: gc sweeps the jails and says nothing of the state dir. It refused at once."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    dead = tmp / f"hcp-linux-ephemeral-{dead_owner()}-0123456789ab"
    (dead / "jail").mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k != "XDG_STATE_HOME"}
    env["HOME"] = "/nonexistent-hcp-linux-test-home"
    r = subprocess.run([sys.executable, "-m", "hcp_linux", "gc", "--tmp-dir", str(tmp)],
                       capture_output=True, text=True, env=env, cwd="/", timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    assert not dead.exists(), "the dead run's jail was left"
    # control: a HOME that exists but is not a directory is still an input error
    env["HOME"] = str(tmp_path / "file")
    (tmp_path / "file").write_text("")
    r = subprocess.run([sys.executable, "-m", "hcp_linux", "gc", "--tmp-dir", str(tmp)],
                       capture_output=True, text=True, env=env, cwd="/", timeout=TIMEOUT)
    assert r.returncode == 125 and r.stderr.startswith("error: sandbox: HOME="), r.stderr
