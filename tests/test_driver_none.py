"""Mode ``none`` (and a pack with no ``wrap.workspace``) on the real kernel: HCP §10.6's
"none — pack root". The working directory is the pack root, read-only; the run writes only
its private /tmp and a fresh scratch (the driver's staging, ``home_env``), made under the
temp dir and removed in cleanup.

Every denial is checked on disk (the pack root's entries, sizes, modes and mtimes unchanged)
with a negative control: the same script in mode ``ephemeral`` changes its jail.
"""
from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hcp_linux.driver.driver import LinuxDriver
from hcp_linux.errors import PolicyError
from hcp_linux.policy.pack import load_pack
from hcp_linux.policy.policy import Policy
from sandboxing import (TIMEOUT, EXECUTOR_ARGS, deny_syscalls_launcher, jail_home_of, jails_in, kill_by_pid,
                        processes_with, read_receipt, sleep_token, snapshot, wait_for)


def sh(script: str, *args: str) -> list[str]:
    return ["sh", "-c", script, "sh", *args]


class Env:
    """A pack root, the temp dir scratch dirs are made in, and a host dir for file
    references."""

    def __init__(self, base: Path) -> None:
        self.base, self.tmp, self.host = base, base / "tmp", base / "host"
        self.tmp.mkdir()
        self.host.mkdir()

    def pack(self, mode: str | None = "none", *, name: str = "pack", extra: str = ""):
        root = self.base / name
        (root / "bin").mkdir(parents=True)
        (root / "data.txt").write_text("pack data\n")
        (root / "bin" / "tool").write_text("#!/bin/sh\necho tool ran\n")
        os.chmod(root / "bin" / "tool", 0o755)
        workspace = f'[wrap.workspace]\nmode = "{mode}"\n{extra}' if mode else ""
        (root / "pack.toml").write_text(
            f'name = "{name}"\n[wrap]\nbin = ["sh", "cat", "bin/tool"]\n{workspace}')
        return load_pack(root / "pack.toml")

    def driver(self, **policy) -> LinuxDriver:
        return LinuxDriver(Policy(jail=str(self.tmp), **policy), tmp_dir=str(self.tmp),
                           state_dir=str(self.base / "state"))

    def leftovers(self) -> list[str]:
        return jails_in(self.tmp)


@pytest.fixture
def env(tmp_path: Path) -> Env:
    return Env(tmp_path)


@pytest.mark.parametrize("mode", ["none", None])
def test_cwd_is_the_pack_root_and_its_own_files_read_relative(env: Env, mode) -> None:
    """``cat data.txt``, the pack's own file by a relative path, works (the failure this
    fixes); ``pwd`` is the pack root; with no ``wrap.workspace`` too (the default mode)."""
    pack = env.pack(mode)
    r = env.driver().run(pack, sh("pwd; cat data.txt; bin/tool"), capture_output=True,
                         timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode().splitlines() == [pack.root, "pack data", "tool ran"]
    assert r.mode == "none" and r.jail == pack.root
    assert r.receipt["jail"] == {"path": pack.root, "access": "read-only", "tmp": "/tmp",
                                 "enforced_by": ["mountns", "landlock"]}
    assert r.receipt["driver"]["jail"] == pack.root
    assert env.leftovers() == []  # the scratch went with cleanup


WRITES = (
    "(echo x > new.txt) 2>/dev/null; echo create=$?\n"
    "(echo x >> data.txt) 2>/dev/null; echo modify=$?\n"
    "(echo evil > bin/tool) 2>/dev/null; echo tool=$?\n"
    "chmod 777 bin/tool 2>/dev/null; echo chmod=$?\n"
    "mv data.txt moved.txt 2>/dev/null; echo rename=$?\n"
    "rm pack.toml 2>/dev/null; echo delete=$?\n"
    "mkdir sub 2>/dev/null; echo mkdir=$?\n"
    "echo t > \"$TMPDIR/t\" && cat \"$TMPDIR/t\" >/dev/null; echo tmp=$?\n"
)


def _statuses(stdout: bytes) -> dict[str, int]:
    return {k: int(v) for k, _, v in (line.partition("=") for line in
                                      stdout.decode().splitlines())}


def test_writes_into_the_pack_root_are_refused(env: Env) -> None:
    pack = env.pack("none")
    before = snapshot(pack.root)
    assert os.access(pack.root, os.W_OK)  # we could write there: the child must not
    r = env.driver().run(pack, sh(WRITES), capture_output=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    st = _statuses(r.stdout)
    assert st.pop("tmp") == 0  # its private /tmp is writable
    assert st and all(v != 0 for v in st.values()), r.stdout
    assert snapshot(pack.root) == before  # on disk: nothing created, changed or removed
    assert (Path(pack.root) / "bin" / "tool").read_text() == "#!/bin/sh\necho tool ran\n"

    # negative control: the same script in mode ephemeral changes its (writable) jail
    other = env.pack("ephemeral", name="other")
    ex = env.driver().prepare(other)
    try:
        Path(ex.jail, "data.txt").write_text("jail data\n")
        Path(ex.jail, "pack.toml").write_text("")
        Path(ex.jail, "bin").mkdir()
        Path(ex.jail, "bin", "tool").write_text("tool\n")
        env.driver()._execute(ex, sh(WRITES), capture_output=True, timeout=TIMEOUT)
        assert ex.process is not None and ex.process.returncode == 0
        assert set(os.listdir(ex.jail)) == {"new.txt", "moved.txt", "bin", "sub"}
        assert Path(ex.jail, "bin", "tool").read_text() == "evil\n"
    finally:
        env.driver().cleanup(ex)


def test_outputs_written_back_and_inputs_copied(env: Env) -> None:
    """``--file`` is copied into the scratch, ``-o`` staged there and written back after
    exit 0: the read-only pack root is never a staging place."""
    pack = env.pack("none")
    (env.host / "in.txt").write_text("input\n")
    before = snapshot(pack.root)
    d = env.driver()
    ex = d.prepare(pack, cwd=str(env.host))
    try:
        argv = d.rewrite_argv(ex, sh('cat "$2" data.txt > "$4"', "--file", "in.txt",
                                     "-o", "out.txt"))
        scratch = ex.scratch
        assert scratch is not None and scratch.startswith(str(env.tmp) + "/")
        assert argv[5] == f"{scratch}/.hcp-io/in/0/in.txt"
        assert argv[7] == f"{scratch}/.hcp-io/out/1/out.txt"
        assert ex.policy.read_only_jail and ex.policy.jail == pack.root
        assert ex.policy.writable_roots[0] == scratch
        proc = d.spawn(ex)
        assert proc.wait(TIMEOUT) == 0
        report = d.writeback(ex)
        assert report.written == (str(env.host / "out.txt"),)
    finally:
        d.cleanup(ex)
    assert (env.host / "out.txt").read_text() == "input\npack data\n"
    assert snapshot(pack.root) == before
    assert env.leftovers() == [] and not os.path.exists(scratch)


def test_home_env_points_at_the_writable_scratch(env: Env) -> None:
    """Without ``home_env`` HOME is the private /tmp; with it, the keys name the run's
    scratch (writable, private, removed in cleanup), never the read-only pack root."""
    script = 'echo "$HOME"; echo h > "$HOME/h" && cat "$HOME/h"; echo "$TMPDIR"'
    plain = env.driver().run(env.pack("none"), sh(script), capture_output=True,
                             timeout=TIMEOUT)
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.decode().splitlines() == ["/tmp", "h", "/tmp"]
    pack = env.pack("none", name="homed", extra='home_env = ["HOME", "XDG_CACHE_HOME"]\n')
    r = env.driver().run(pack, sh(script + '; echo "$XDG_CACHE_HOME"'), capture_output=True,
                         timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    home, wrote, tmpdir, cache = r.stdout.decode().splitlines()
    assert home == cache == r.receipt["driver"]["scratch"]
    assert home.startswith(f"{jail_home_of(env.tmp)}/hcp-linux-none-") and wrote == "h"
    assert tmpdir == "/tmp"
    assert env.leftovers() == [] and not os.path.exists(home)
    assert "h" not in os.listdir(pack.root)


def test_workspace_refs_name_files_in_the_pack_root(env: Env) -> None:
    """HCP §10.6: ``workspace:`` is rewritten into the jail, which in mode none is the pack
    root: readable; as an output it cannot be written (read-only); ``..`` still refused."""
    pack = env.pack("none")
    before = snapshot(pack.root)
    r = env.driver().run(pack, ["cat", "workspace:data.txt"], capture_output=True,
                         timeout=TIMEOUT)
    assert (r.returncode, r.stdout) == (0, b"pack data\n"), r.stderr
    r = env.driver().run(pack, sh('echo x > "$1"; echo w=$?', "workspace:made.txt"),
                         capture_output=True, timeout=TIMEOUT)
    assert r.stdout == b"w=2\n" and snapshot(pack.root) == before
    with pytest.raises(PolicyError):
        env.driver().run(pack, ["cat", "workspace:../host/x"], timeout=TIMEOUT)
    assert env.leftovers() == []


def test_a_write_root_over_the_pack_root_is_refused(env: Env) -> None:
    """A runtime base policy whose write root holds the pack would make the read-only jail
    writable: refused before anything is made."""
    pack = env.pack("none")
    with pytest.raises(PolicyError, match="read-only jail .* is inside writable root"):
        env.driver(write_roots=(str(env.base),)).run(pack, ["cat", "data.txt"],
                                                     timeout=TIMEOUT)
    assert env.leftovers() == []


# --- the CLI, and a host without a mount view ----------------------------------------------


def _cli(pack: str, *cmd: str, launcher: list[str] | None = None, extra: tuple = (),
         cwd: Path, tmp: Path) -> subprocess.CompletedProcess:
    argv = [*(launcher or [sys.executable]), "-m", "hcp_linux", "run", *EXECUTOR_ARGS,
            "--pack", pack, *extra, "--", *cmd]
    env = dict(os.environ, TMPDIR=str(tmp))
    return subprocess.run(argv, capture_output=True, timeout=TIMEOUT, cwd=cwd, env=env,
                          stdin=subprocess.DEVNULL)


def test_cli_mode_none_reads_relative_and_writes_back(env: Env) -> None:
    pack = env.pack(None)
    before = snapshot(pack.root)
    r = _cli(os.path.join(pack.root, "pack.toml"), "sh", "-c",
             'cat data.txt > "$2"; echo x > new.txt', "sh", "-o", "out.txt",
             cwd=env.host, tmp=env.tmp)
    assert r.returncode == 2 and b"Read-only file system" in r.stderr, r.stderr
    assert not (env.host / "out.txt").exists()  # exit 2: nothing written back
    r = _cli(os.path.join(pack.root, "pack.toml"), "sh", "-c", 'cat data.txt > "$2"', "sh",
             "-o", "out.txt", cwd=env.host, tmp=env.tmp)
    assert r.returncode == 0, r.stderr
    assert (env.host / "out.txt").read_text() == "pack data\n"
    assert snapshot(pack.root) == before and env.leftovers() == []


def test_cli_read_only_jail_flag_is_refused_with_a_pack(env: Env) -> None:
    """The pack's mode chooses the jail and its access: --read-only-jail with --pack is
    refused like --jail, before anything is made."""
    pack = env.pack("ephemeral")
    r = _cli(os.path.join(pack.root, "pack.toml"), "sh", "-c", "echo ran > /dev/null",
             extra=("--read-only-jail",), cwd=env.host, tmp=env.tmp)
    assert (r.returncode, r.stdout) == (125, b""), r.stderr
    assert r.stderr == (b"error: sandbox: --read-only-jail: not with --pack (the pack's "
                        b"wrap.workspace chooses the jail; mode none's is read-only)\n")
    assert env.leftovers() == []


def test_no_mount_view_tmp_goes_to_the_scratch_not_the_pack(env: Env) -> None:
    """unshare denied, namespaces allowed to degrade: Landlock alone keeps the pack root
    read-only, and HOME/TMPDIR live in the scratch, never in the pack root."""
    pack = env.pack("none")
    before = snapshot(pack.root)
    receipt = env.host / "receipt.json"
    r = _cli(os.path.join(pack.root, "pack.toml"), "sh", "-c",
             'cat data.txt; (echo x > new.txt) 2>/dev/null; echo w=$?; '
             'echo t > "$TMPDIR/t" && echo "$TMPDIR"', launcher=deny_syscalls_launcher(
                 ["unshare"], errno.EPERM), cwd=env.host, tmp=env.tmp,
             extra=("--allow-degraded", "namespaces", "--receipt", str(receipt)))
    assert r.returncode == 0, r.stderr
    data, wrote, tmpdir = r.stdout.decode().splitlines()
    assert (data, wrote) == ("pack data", "w=2")
    rec = read_receipt(receipt)
    assert rec["layers"]["mountns"]["status"] == "degraded"
    assert tmpdir == rec["jail"]["tmp"] == rec["driver"]["scratch"] + "/.hcp-tmp"
    assert snapshot(pack.root) == before  # no .hcp-tmp, no new.txt
    assert env.leftovers() == []


def test_a_killed_runtimes_scratch_is_reclaimed_not_the_pack(env: Env) -> None:
    """The runtime SIGKILLed mid-run runs no cleanup: its mode-none scratch stays in the
    temp dir (named for its owner) and the next driver run's sweep removes it; the pack
    root, the jail of that run, is never touched."""
    pack = env.pack("none")
    before = snapshot(pack.root)
    token = sleep_token(30)
    argv = [sys.executable, "-m", "hcp_linux", "run", *EXECUTOR_ARGS, "--pack",
            os.path.join(pack.root, "pack.toml"), "--", "sh", "-c", f"sleep {token}"]
    runtime = subprocess.Popen(argv, cwd=env.host, stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env=dict(os.environ, TMPDIR=str(env.tmp)))
    try:
        wait_for(lambda: processes_with(token, but=runtime.pid), "the sandboxed sleep")
        left = env.leftovers()
        assert len(left) == 1 and left[0].startswith("hcp-linux-none-"), left
        assert os.listdir(jail_home_of(env.tmp) / left[0]) == ["scratch"]
    finally:
        kill_by_pid(runtime)  # SIGKILL: no cleanup; PDEATHSIG ends the sandbox
    wait_for(lambda: not processes_with(token), "the sandbox to die with its runtime", 10.0)
    assert env.leftovers() == left  # what a dead runtime leaves
    r = env.driver().run(pack, ["cat", "data.txt"], capture_output=True, timeout=TIMEOUT)
    assert r.returncode == 0 and r.stdout == b"pack data\n"
    assert env.leftovers() == []  # swept by that run's prepare, and its own cleaned up
    assert snapshot(pack.root) == before
