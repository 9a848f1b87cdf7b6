"""A command that leaves a very deep directory tree in its jail (deeper than Python's
recursion limit, ~1000): the driver lists it and removes it with an explicit stack, through
directory fds opened relative to their parent with ``O_NOFOLLOW``, so the run ends with the
command's exit status, the next run in the workspace works, and a symlink the command
planted in the tree is never followed.

Every run is bounded (TIMEOUT). Deep trees are made and inspected through fds (their paths
may be longer than PATH_MAX), and each test removes what it made (pytest's own cleanup
recurses per level).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hcp_linux.driver.driver import LinuxDriver
from hcp_linux.jails import workspace
from hcp_linux.jails.workspace import (IO_DIR, SNAPSHOT_PATH_MAX, remove_tree, snapshot,
                                       sweep_workspaces)
from hcp_linux.policy.pack import Pack, load_pack
from hcp_linux.policy.policy import Policy
from sandboxing import EXECUTOR_ARGS, jails_in

TIMEOUT = 60.0
DEPTH = 1100  # deeper than sys.getrecursionlimit(): os.walk and shutil.rmtree of 3.11 fail
#: ``sh -c DEEP sh N ...``: N nested directories ``d`` below the cwd, the shell left in the
#: deepest (then the rest of the script runs there).
DEEP = 'i=0; while [ $i -lt "$1" ]; do mkdir d && cd d || exit 9; i=$((i+1)); done'


def sh(script: str, *args: object) -> list[str]:
    return ["sh", "-c", script, "sh", *map(str, args)]


def chain(depth: int) -> str:
    return "/".join(["d"] * depth)


def open_deep(top: Path | str, depth: int) -> int:
    """An fd of ``top/d/d/...`` (``depth`` levels), opened one level at a time."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):
        nxt = os.open("d", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
        os.close(fd)
        fd = nxt
    return fd


def make_deep(top: Path, depth: int, modes: dict[int, int] | None = None) -> None:
    """``top/d/d/...`` (``depth`` levels, a file at the bottom), made here through fds (the
    few levels in ``modes`` kept open); ``modes``: level -> mode, applied deepest first (a
    chmod 000 level left by an unfriendly command)."""
    modes = modes or {}
    held: dict[int, int] = {}
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for level in range(depth + 1):
            if level in modes:
                held[level] = os.dup(fd)
            if level == depth:
                os.close(os.open("bottom", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd))
                break
            os.mkdir("d", dir_fd=fd)
            nxt = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nxt
        for level in sorted(held, reverse=True):
            os.fchmod(held[level], modes[level])
    finally:
        os.close(fd)
        for f in held.values():
            os.close(f)


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


class Env:
    """A test's directories: ephemeral jails (tmp), the state dir, the host dir outside
    every grant (``outside``, holding ``keep`` and ``dir/keep``), a writable root."""

    def __init__(self, tmp_path: Path) -> None:
        self.base = tmp_path
        self.tmp = tmp_path / "tmp"
        self.state = tmp_path / "state"
        self.shared = tmp_path / "shared"
        self.outside = tmp_path / "outside"
        for d in (self.tmp, self.state, self.shared, self.outside, self.outside / "dir"):
            d.mkdir()
        (self.outside / "keep").write_text("precious")
        (self.outside / "dir" / "keep").write_text("precious too")

    def pack(self, mode: str = "workspace", name: str = "pack") -> Pack:
        root = self.base / name
        root.mkdir(exist_ok=True)
        (root / "pack.toml").write_text(
            f'name = "{name}"\n[wrap]\nbin = ["sh"]\n[wrap.workspace]\nmode = "{mode}"\n')
        return load_pack(root / "pack.toml")

    def driver(self) -> LinuxDriver:
        return LinuxDriver(Policy(jail=str(self.base), write_roots=(str(self.shared),)),
                           state_dir=str(self.state), tmp_dir=str(self.tmp))

    def jail(self, principal: str = "default", pack: str = "pack") -> Path:
        return self.state / "workspaces" / pack / principal

    def outside_untouched(self) -> bool:
        return ((self.outside / "keep").read_text() == "precious"
                and (self.outside / "dir" / "keep").read_text() == "precious too")


def _remove_all(tmp_path: Path) -> None:
    for name in os.listdir(tmp_path):
        path = tmp_path / name
        if path.is_dir() and not path.is_symlink():
            remove_tree(str(path))
        else:
            path.unlink()


@pytest.fixture
def tmp(tmp_path):
    """``tmp_path``, emptied here after the test, whatever happened to it."""
    yield tmp_path
    _remove_all(tmp_path)


@pytest.fixture
def env(tmp_path):
    yield Env(tmp_path)
    _remove_all(tmp_path)


@pytest.fixture
def cli(tmp_path):
    """``hcp-linux run`` as a process (as tests/test_driver_cli.py): XDG_STATE_HOME, TMPDIR
    and HOME in ``tmp_path``."""
    state, work = tmp_path / "state", tmp_path / "work"
    for d in (state, work):
        d.mkdir()
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "XDG_STATE_HOME": str(state),
           "TMPDIR": str(tmp_path), "HOME": str(tmp_path)}

    def run(*args: str, cmd: str = "run") -> subprocess.CompletedProcess:
        extra = EXECUTOR_ARGS if cmd == "run" else []
        return subprocess.run([sys.executable, "-m", "hcp_linux", cmd, *extra, *args],
                              cwd=work, env=env, capture_output=True, timeout=TIMEOUT)

    run.state, run.base = state, tmp_path  # type: ignore[attr-defined]
    yield run
    _remove_all(tmp_path)


def write_pack(cli, mode: str = "workspace") -> str:
    root = cli.base / "p"
    root.mkdir(exist_ok=True)
    (root / "pack.toml").write_text(f'name = "deep"\n[wrap]\nbin = "sh"\n'
                                    f'[wrap.workspace]\nmode = "{mode}"\n')
    return str(root / "pack.toml")


def no_traceback(r: subprocess.CompletedProcess) -> bool:
    return b"Traceback" not in r.stderr and b"RecursionError" not in r.stderr


# --- (a) a run that leaves a deep tree ends normally; the next run works -----------------

def test_cli_run_leaving_a_deep_tree_ends_with_its_status_and_the_next_run_works(cli):
    pack = write_pack(cli)
    r = cli("--pack", pack, "--", *sh(DEEP + "; echo made; exit 3", DEPTH))
    assert (r.returncode, r.stdout, r.stderr) == (3, b"made\n", b""), r.stderr[-2000:]
    # every later run in that workspace: it lists the tree again before and after the run
    r = cli("--pack", pack, "--", *sh("echo hi"))
    assert (r.returncode, r.stdout, r.stderr) == (0, b"hi\n", b""), r.stderr[-2000:]
    r = cli("--pack", pack, "--", *sh(f"test -d {chain(DEPTH)} && echo kept"))
    assert (r.returncode, r.stdout) == (0, b"kept\n") and no_traceback(r)


def test_deep_tree_is_listed_and_a_too_deep_one_is_unknown_not_an_error(env):
    pack, d = env.pack(), env.driver()
    bottom = chain(DEPTH) + "/bottom"
    r = d.run(pack, sh(DEEP + "; echo 1 > bottom", DEPTH), timeout=TIMEOUT)
    assert r.returncode == 0 and r.writeback.new_files == (bottom,)
    r = d.run(pack, sh(f"echo 2 >> {bottom}; exit 4"), timeout=TIMEOUT)
    assert r.returncode == 4
    assert r.writeback.new_files == () and r.writeback.modified_files == (bottom,)
    # a path longer than PATH_MAX: the listing is unknown ("too large": None), the run
    # itself as usual, and so is the next one
    # (two chains of DEPTH, the second moved to the bottom of the first: a shell cannot cd
    # to a path longer than PATH_MAX)
    assert 2 * len(chain(DEPTH)) > SNAPSHOT_PATH_MAX
    script = (f"(mkdir e && cd e && {DEEP}) && (mkdir f && cd f && {DEEP} && touch far) && "
              f"mv f e/{chain(DEPTH)}/")
    r = d.run(pack, sh(script, DEPTH), timeout=TIMEOUT)
    assert r.returncode == 0 and r.writeback.new_files is None
    r = d.run(pack, sh("echo x > x; exit 5"), timeout=TIMEOUT)
    assert r.returncode == 5 and r.writeback.new_files is None
    assert snapshot(str(env.jail())) is None
    # once the command removes it, the workspace is listed again (from the next run on:
    # this one's "before" is unknown)
    r = d.run(pack, sh("rm -rf e; echo y > y"), timeout=TIMEOUT)
    assert r.returncode == 0 and r.writeback.new_files is None
    assert set(snapshot(str(env.jail())) or ()) == {bottom, "x", "y"}
    r = d.run(pack, sh("echo z > z"), timeout=TIMEOUT)
    assert r.returncode == 0 and r.writeback.new_files == ("z",)


# --- (b) removal of a deep tree, to any depth ------------------------------------------

def test_ephemeral_jail_with_a_deep_unfriendly_tree_is_removed(env):
    pack, d = env.pack("ephemeral"), env.driver()
    script = DEEP + "; touch f; cd ..; chmod 500 .; cd ..; chmod 000 d"
    r = d.run(pack, sh(script, DEPTH), timeout=TIMEOUT)
    assert r.returncode == 0 and not os.path.lexists(r.jail) and jails_in(env.tmp) == []


def test_deep_staging_dir_is_removed_by_gc_and_by_the_next_run(cli):
    # the command fills the workspace's staging dir (it can: it is in its jail)
    pack = write_pack(cli)
    script = f"mkdir -p {IO_DIR} && cd {IO_DIR} && " + DEEP + "; touch f; chmod 000 .."
    assert cli("--pack", pack, "--", *sh(script, DEPTH)).returncode == 0
    io = cli.state / "hcp-linux" / "workspaces" / "deep" / "default" / IO_DIR
    assert io.is_dir()
    r = cli(cmd="gc")  # the workspace sweep (hcp_linux.jails.workspace.sweep_workspaces)
    assert (r.returncode, r.stdout, r.stderr) == (0, f"{io}\n".encode(), b""), r.stderr[-2000:]
    assert not os.path.lexists(io)
    # again; now the next run's own staging clears it before the command starts
    assert cli("--pack", pack, "--", *sh(script, DEPTH)).returncode == 0 and io.is_dir()
    r = cli("--pack", pack, "--", *sh(f"test -e {IO_DIR}/d && echo left || echo clear"))
    assert (r.returncode, r.stdout, r.stderr) == (0, b"clear\n", b"")
    assert not os.path.lexists(io)


def test_sweep_workspaces_removes_a_deep_staging_dir(env):
    pack, d = env.pack(), env.driver()
    script = f"mkdir {IO_DIR} && cd {IO_DIR} && " + DEEP
    assert d.run(pack, sh(script, DEPTH), timeout=TIMEOUT).returncode == 0
    io = env.jail() / IO_DIR
    out = sweep_workspaces(str(env.state))
    assert (out.removed, out.failed) == ([str(io)], []) and not os.path.lexists(io)


def test_remove_tree_any_depth_every_fd_closed(tmp):
    top = tmp / "top"
    top.mkdir()
    depth = 5000  # five times the recursion limit, and more levels than fds we may open
    make_deep(top, depth, {0: 0o500, 1500: 0o000, 3000: 0o300, depth: 0o500})
    before = fd_count()
    remove_tree(str(top))
    assert fd_count() == before and not os.path.lexists(top)
    remove_tree(str(top))  # gone: not an error


def test_snapshot_of_a_deep_tree_matches_its_contents_every_fd_closed(tmp):
    top = tmp / "top"
    top.mkdir()
    make_deep(top, DEPTH)
    (top / "f").write_text("x")
    before = fd_count()
    snap = snapshot(str(top))
    assert fd_count() == before and snap is not None
    assert sorted(snap) == [chain(DEPTH) + "/bottom", "f"]
    remove_tree(str(top))
    assert not os.path.lexists(top)


# --- (c) a symlink planted in the deep tree is never followed ----------------------------

def test_symlink_in_a_deep_tree_is_not_followed_by_listing_or_removal(env):
    pack, d = env.pack(), env.driver()
    links = DEEP + '; ln -s "$2" out; ln -s "$3" outdir'
    args = (DEPTH, env.outside / "keep", env.outside / "dir")
    # in the workspace: listed as themselves, never entered (nothing below outdir/)
    r = d.run(pack, sh(links, *args), timeout=TIMEOUT)
    base = chain(DEPTH)
    assert r.returncode == 0 and r.writeback.new_files == (f"{base}/out", f"{base}/outdir")
    # and in its staging dir, which the workspace sweep removes
    r = d.run(pack, sh(f"mkdir {IO_DIR} && cd {IO_DIR} && " + links, *args), timeout=TIMEOUT)
    assert r.returncode == 0 and r.writeback.new_files == ()
    # the negative control: unconfined, the links do reach the outside files
    for where in (env.jail(), env.jail() / IO_DIR):
        fd = open_deep(where, DEPTH)
        try:
            assert os.readlink("outdir", dir_fd=fd) == str(env.outside / "dir")
            with open(os.open("out", os.O_RDONLY, dir_fd=fd)) as f:
                assert f.read() == "precious"
            with open(os.open("outdir/keep", os.O_RDONLY, dir_fd=fd)) as f:
                assert f.read() == "precious too"
        finally:
            os.close(fd)
    out = sweep_workspaces(str(env.state))
    assert out.failed == [] and not os.path.lexists(env.jail() / IO_DIR)
    assert env.outside_untouched()
    remove_tree(str(env.jail() / "d"))
    assert os.listdir(env.jail()) == [] and env.outside_untouched()
    assert sorted(os.listdir(env.outside)) == ["dir", "keep"]


def test_symlink_in_a_deep_ephemeral_jail_is_not_followed_by_cleanup(env):
    pack, d = env.pack("ephemeral"), env.driver()
    ex = d.prepare(pack)
    try:
        d.rewrite_argv(ex, sh(DEEP + '; ln -s "$2" outdir; ln -s "$3" out; chmod 000 .', DEPTH,
                              env.outside / "dir", env.outside / "keep"))
        assert d.spawn(ex).wait(TIMEOUT) == 0
        d.writeback(ex)
        # the negative control: unconfined, the link leads to the outside files
        bottom = os.path.join(ex.jail, chain(DEPTH))
        os.chmod(bottom, 0o700)
        fd = open_deep(ex.jail, DEPTH)
        try:
            with open(os.open("outdir/keep", os.O_RDONLY, dir_fd=fd)) as f:
                assert f.read() == "precious too"
        finally:
            os.close(fd)
        os.chmod(bottom, 0o000)  # as the command left it
    finally:
        d.cleanup(ex)
    assert not os.path.lexists(ex.jail) and jails_in(env.tmp) == []
    assert env.outside_untouched() and sorted(os.listdir(env.outside)) == ["dir", "keep"]


def test_a_directory_moved_out_during_removal_stops_it_there(tmp, monkeypatch):
    """Above the fd window the walk climbs with ``..``: a directory moved elsewhere
    meanwhile (its ``..`` is no longer the one it came down from) stops the removal with
    an OSError instead of emptying the new parent."""
    top, elsewhere = tmp / "top", tmp / "elsewhere"
    top.mkdir()
    elsewhere.mkdir()
    (elsewhere / "keep").write_text("precious")
    depth = 3 * workspace._FD_WINDOW
    make_deep(top, depth)
    clear = workspace._clear_files
    moved = []

    def clear_and_move(fd: int, rel: str) -> list[str]:
        if rel.count("/") + 1 == depth and not moved:  # at the bottom: move level 2 away
            os.rename(top / "d" / "d", elsewhere / "d")
            moved.append(rel)
        return clear(fd, rel)

    monkeypatch.setattr(workspace, "_clear_files", clear_and_move)
    with pytest.raises(OSError, match=f"moved while it was walked: .{top}/d"):
        remove_tree(str(top))
    assert moved and (elsewhere / "keep").read_text() == "precious"
    monkeypatch.undo()
    remove_tree(str(top))
    remove_tree(str(elsewhere / "d"))
    assert os.listdir(elsewhere) == ["keep"] and not os.path.lexists(top)
