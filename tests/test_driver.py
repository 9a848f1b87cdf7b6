"""The HCP driver on the real kernel: the five stages, the three workspace modes, file
references end to end, writeback atomicity, cleanup on every path, locking, asyncio.

Every run is bounded (TIMEOUT); refusals are proven by a command that would have left a
marker in a writable root had it been spawned.
"""
from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from importlib.metadata import entry_points

import pytest

from hcp_linux.driver.driver import DriverResult, Execution, LinuxDriver
from hcp_linux.errors import HostPathError, NotAllowlistedError, PolicyError
from hcp_linux.policy.pack import Pack, load_pack
from hcp_linux.policy.policy import Policy
from hcp_linux.sandbox import PIPE
from hcp_linux.jails.workspace import WorkspaceBusyError
from sandboxing import jails_in, processes_with, sleep_token, wait_for

TIMEOUT = 30.0


S30_0101, S30_0202, S30_0303, S30_0404, S30_0505, S30_0606, S30_0909 = (
    sleep_token(30) for _ in range(7))
S3_0808 = sleep_token(3)


class Env:
    """A test's directories: ephemeral jails (tmp), state dir, a host dir for file
    references, and a shared writable root for markers and logs."""

    def __init__(self, tmp_path):
        self.base = tmp_path
        self.tmp = tmp_path / "tmp"
        self.state = tmp_path / "state"
        self.host = tmp_path / "host"
        self.shared = tmp_path / "shared"
        for d in (self.tmp, self.state, self.host, self.shared):
            d.mkdir()
        self.marker = self.shared / "marker"

    def pack(self, mode: str = "ephemeral", bins=("sh",), extra: str = "", name: str = "pack",
             files: dict | None = None) -> Pack:
        root = self.base / name
        root.mkdir(exist_ok=True)
        for rel, text in (files or {}).items():
            p = root / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
            if rel.startswith("bin/"):
                os.chmod(p, 0o755)
        bin_list = ", ".join(f'"{b}"' for b in bins)
        (root / "pack.toml").write_text(
            f'name = "{name}"\n[wrap]\nbin = [{bin_list}]\n{extra}\n'
            f'[wrap.workspace]\nmode = "{mode}"\n')
        return load_pack(root / "pack.toml")

    def driver(self, **policy) -> LinuxDriver:
        policy.setdefault("write_roots", (str(self.shared),))
        return LinuxDriver(Policy(jail=str(self.base), **policy), state_dir=str(self.state),
                           tmp_dir=str(self.tmp))

    def leftovers(self) -> list[str]:
        return jails_in(self.tmp)


@pytest.fixture
def env(tmp_path):
    return Env(tmp_path)


def sh(script: str, *args: str) -> list[str]:
    return ["sh", "-c", script, "sh", *args]


def gone(needle: str) -> bool:
    """No process left with ``needle`` in its command line. SIGKILL is delivered to the whole
    sandbox at once, but its processes exit asynchronously after the monitor is reaped, so
    allow them a moment."""
    wait_for(lambda: not processes_with(needle), f"processes with {needle!r} to exit", 5.0)
    return True


def test_registered_as_the_linux_driver():
    (ep,) = [e for e in entry_points(group="hcp.drivers") if e.name == "linux"]
    assert ep.load() is LinuxDriver
    assert LinuxDriver.name == "linux"


# --- the five stages, one by one -------------------------------------------------------

def test_each_stage(env):
    pack = env.pack("ephemeral")
    (env.host / "in.txt").write_text("input data")
    d = env.driver()
    # 1. prepare: a fresh private jail, a policy built for it; nothing spawned yet.
    ex = d.prepare(pack, cwd=str(env.host))
    assert isinstance(ex, Execution) and ex.stage == "prepared"
    assert os.path.isdir(ex.jail) and ex.jail.startswith(str(env.tmp) + "/")
    assert os.stat(os.path.dirname(ex.jail)).st_mode & 0o777 == 0o700
    assert ex.policy.jail == os.path.realpath(ex.jail)
    assert pack.root in ex.policy.read_only_roots
    with pytest.raises(PolicyError, match="expected an execution at stage 'rewritten'"):
        d.spawn(ex)
    # 2. rewrite_argv: the input is copied in, the output staged, workspace: into the jail.
    argv = d.rewrite_argv(ex, sh('cat "$2" > "$4"; pwd > "$5"', "--file", "in.txt", "-o",
                                 "out.txt", "workspace:cwd.txt"))
    assert argv[5] == f"{ex.jail}/.hcp-io/in/0/in.txt"
    assert open(argv[5]).read() == "input data"
    assert argv[7] == f"{ex.jail}/.hcp-io/out/1/out.txt"
    assert argv[8] == f"{ex.jail}/cwd.txt"
    assert ex.stage == "rewritten" and ex.argv == argv
    # 3. spawn: confined, cwd = the jail.
    proc = d.spawn(ex)
    assert proc.wait(TIMEOUT) == 0
    assert proc.receipt["mode"] == "sandbox"
    assert open(f"{ex.jail}/cwd.txt").read().strip() == ex.jail
    assert not (env.host / "out.txt").exists()  # not before writeback
    # 4. writeback: the staged output reaches its host destination.
    report = d.writeback(ex)
    assert report.written == (str(env.host / "out.txt"),) and report.skipped is None
    assert (env.host / "out.txt").read_text() == "input data"
    # 5. cleanup: the ephemeral jail is gone; cleanup is idempotent.
    d.cleanup(ex)
    assert ex.cleaned and not os.path.exists(ex.jail) and env.leftovers() == []
    d.cleanup(ex)
    assert sorted(os.listdir(env.host)) == ["in.txt", "out.txt"]


# --- modes -----------------------------------------------------------------------------

# mode none (the pack root, read-only, as cwd): tests/test_driver_none.py


def test_mode_ephemeral_is_fresh_per_exec(env):
    pack = env.pack("ephemeral")
    d = env.driver()
    r1 = d.run(pack, sh("ls -A; echo left > note"), capture_output=True, timeout=TIMEOUT)
    r2 = d.run(pack, sh("ls -A"), capture_output=True, timeout=TIMEOUT)
    assert (r1.returncode, r2.returncode) == (0, 0)
    assert r1.jail != r2.jail
    assert "note" not in r2.stdout.decode()
    assert env.leftovers() == []


def test_mode_workspace_persists_per_principal_with_home(env):
    pack = env.pack("workspace")
    d = env.driver()
    script = 'echo run >> count; echo "$HOME"; pwd; wc -l < count'
    a1 = d.run(pack, sh(script), principal="alice", capture_output=True, timeout=TIMEOUT)
    a2 = d.run(pack, sh(script), principal="alice", capture_output=True, timeout=TIMEOUT)
    b1 = d.run(pack, sh(script), principal="bob", capture_output=True, timeout=TIMEOUT)
    jail = str(env.state / "workspaces" / "pack" / "alice")
    assert a1.jail == a2.jail == jail != b1.jail
    assert a1.stdout.decode().split() == [jail, jail, "1"]
    assert a2.stdout.decode().split() == [jail, jail, "2"]
    assert b1.stdout.decode().split()[2] == "1"
    # "new jail files": they persist in place and are reported.
    assert a1.writeback.new_files == ("count",) and a1.writeback.modified_files == ()
    assert a2.writeback.new_files == () and a2.writeback.modified_files == ("count",)
    assert sorted(os.listdir(jail)) == ["count"]  # no staging left behind
    assert os.path.exists(jail + ".lock")  # the lock lives beside the jail, not in it


def test_workspace_refs_and_outputs_in_workspace_mode(env):
    pack = env.pack("workspace")
    d = env.driver()
    (env.host / "in.csv").write_text("a,b\n")
    r = d.run(pack, sh('cp "$2" "$4"; cp "$2" "$6"', "--file", "in.csv", "--output",
                       "workspace:kept.csv", "-o", "out.csv"),
              cwd=str(env.host), timeout=TIMEOUT)
    assert r.returncode == 0
    assert (env.host / "out.csv").read_text() == "a,b\n"
    assert open(os.path.join(r.jail, "kept.csv")).read() == "a,b\n"
    assert r.writeback.new_files == ("kept.csv",)
    assert sorted(os.listdir(r.jail)) == ["kept.csv"]


def test_only_agent_env_and_credentials_reach_the_child(env, monkeypatch):
    monkeypatch.setenv("HCP_TEST_AMBIENT_TOKEN", "ambient-secret")
    pack = env.pack("none", extra='agent_env = { PACK_SETTING = "from-pack" }')
    r = env.driver().run(pack, ["sh", "-c", "env"], credentials={"MINTED_TOKEN": "minted"},
                         capture_output=True, timeout=TIMEOUT)
    child = dict(line.split("=", 1) for line in r.stdout.decode().splitlines() if "=" in line)
    assert child["PACK_SETTING"] == "from-pack" and child["MINTED_TOKEN"] == "minted"
    assert child["HCP_SANDBOX"] == "sandbox"
    assert "ambient-secret" not in r.stdout.decode()
    with pytest.raises(PolicyError, match='credentials: variable "LD_PRELOAD" not allowed'):
        env.driver().run(pack, ["sh", "-c", f"touch {env.marker}"],
                         credentials={"LD_PRELOAD": "/x.so"}, timeout=TIMEOUT)
    assert not env.marker.exists() and env.leftovers() == []


def test_native_local_marks_the_child_and_keeps_the_rules(env):
    pack = env.pack("ephemeral")
    d = env.driver(sandbox=False, native_local=True)
    r = d.run(pack, ["sh", "-c", 'echo "$HCP_SANDBOX"'], capture_output=True, timeout=TIMEOUT)
    assert r.stdout == b"native-local\n"
    with pytest.raises(HostPathError):
        d.run(pack, ["sh", "-c", "true", "/etc/passwd"], timeout=TIMEOUT)
    with pytest.raises(NotAllowlistedError):
        d.run(pack, ["true"], timeout=TIMEOUT)


# --- rewrite forms, end to end ---------------------------------------------------------

def test_every_rewrite_form_reaches_the_child(env):
    pack = env.pack("workspace")
    d = env.driver()
    (env.host / "a.txt").write_text("A")
    (env.host / "b.txt").write_text("B")
    d.run(pack, sh("echo W > w.txt"), timeout=TIMEOUT)  # a workspace file
    script = ('for a in "$@"; do case "$a" in --json-file=*) cat "${a#*=}";; '
              '--output=*) echo O3 > "${a#*=}";; -o/*) cat "${a#-o}";; '
              '--cfg=*) cat "${a#*=}";; esac; done; '
              'cat "$2"; echo O1 > "$4"; cat "$5"')
    r = d.run(pack, sh(script, "--file", "a.txt", "-o", "o1.txt", "workspace:w.txt",
                       "--json-file=b.txt", "-oworkspace:w.txt", "--output=o3.txt",
                       "--cfg=workspace:w.txt"),
              cwd=str(env.host), capture_output=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    assert r.stdout == b"BW\nW\nAW\n"  # b.txt and a.txt have no newline; w.txt has
    assert [(env.host / f).read_text() for f in ("o1.txt", "o3.txt")] == ["O1\n", "O3\n"]
    assert set(r.writeback.written) == {str(env.host / f) for f in ("o1.txt", "o3.txt")}


# --- refusals: nothing spawned, nothing written ----------------------------------------

def refused_cases(env):
    (env.host / "dir").mkdir()
    (env.host / "target").write_text("keep")
    os.symlink(env.host / "target", env.host / "link")
    os.symlink("/etc/passwd", env.host / "to-etc")
    return {
        "host /etc": (HostPathError, ["--file", "/etc/passwd"]),
        "host /home": (HostPathError, ["/home/someone/.ssh/id_rsa"]),
        "host /root": (HostPathError, ["--output=/root/out"]),
        "host /Users": (HostPathError, ["--x=/Users/me/secret"]),
        "proc root": (HostPathError, ["--file", "/proc/self/root/etc/passwd"]),
        "symlink to /etc": (HostPathError, ["--file", str(env.host / "to-etc")]),
        "dotdot": (PolicyError, ["workspace:../../escape"]),
        "output symlink": (PolicyError, ["-o", str(env.host / "link")]),
        "output directory": (PolicyError, ["--output", str(env.host / "dir")]),
    }


@pytest.mark.parametrize("case", ["host /etc", "host /home", "host /root", "host /Users",
                                  "proc root", "symlink to /etc", "dotdot", "output symlink",
                                  "output directory"])
def test_refused_references_spawn_nothing(env, case):
    pack = env.pack("workspace")
    d = env.driver()
    error, args = refused_cases(env)[case]
    before = sorted(os.listdir(env.host))
    cmd = sh(f"touch {env.marker}", *args)
    with pytest.raises(error) as info:
        d.run(pack, cmd, timeout=TIMEOUT)
    if error is HostPathError:
        assert str(info.value) == "host path not allowed"
    else:
        assert any(a.split("=")[-1] in str(info.value) for a in args)  # names the path
    assert not env.marker.exists()
    assert env.leftovers() == [] and os.listdir(env.state) == []  # nothing prepared
    assert sorted(os.listdir(env.host)) == before
    assert (env.host / "target").read_text() == "keep"
    # Control: the same command with harmless arguments does leave the marker.
    assert d.run(pack, sh(f"touch {env.marker}"), timeout=TIMEOUT).returncode == 0
    assert env.marker.exists()


def test_symlink_out_of_a_persistent_workspace_is_refused(env):
    pack = env.pack("workspace")
    d = env.driver()
    assert d.run(pack, sh("ln -s /etc esc; ln -s sub inside; mkdir sub"),
                 timeout=TIMEOUT).returncode == 0
    with pytest.raises(PolicyError, match=r"workspace:esc/passwd: escapes the workspace \(symlink\)"):
        d.run(pack, sh(f"touch {env.marker}", "--file", "workspace:esc/passwd"), timeout=TIMEOUT)
    assert not env.marker.exists()
    assert not os.path.exists(os.path.join(env.state, "workspaces", "pack", "default", ".hcp-io"))
    # a symlink that stays inside the workspace is fine
    r = d.run(pack, sh('echo ok > "$1"', "workspace:inside/f"), timeout=TIMEOUT)
    assert r.returncode == 0


@pytest.mark.parametrize("principal", ["a/b", "../x", "..", ".", "", "a\0b", "a\\b"])
def test_bad_principal_spawns_and_creates_nothing(env, principal):
    pack = env.pack("workspace")
    with pytest.raises(PolicyError, match="principal"):
        env.driver().run(pack, sh(f"touch {env.marker}"), principal=principal, timeout=TIMEOUT)
    assert not env.marker.exists() and os.listdir(env.state) == []


def test_not_allowlisted_bins_get_127_and_the_exact_message(env):
    pack = env.pack("ephemeral", bins=("sh", "true"))
    d = env.driver()
    with pytest.raises(NotAllowlistedError) as info:  # not in the pack's wrap.bin
        d.run(pack, ["touch", str(env.marker)], timeout=TIMEOUT)
    assert str(info.value) == 'bin "touch" not allowlisted' and info.value.exit_code == 127
    # In wrap.bin but not on the runtime's allow-list.
    runtime = env.driver(allow_bins=("true",))
    with pytest.raises(NotAllowlistedError, match='^bin "sh" not allowlisted$'):
        runtime.run(pack, sh(f"touch {env.marker}"), timeout=TIMEOUT)
    # A bare entry never admits another path by PATH lookup; an absolute entry is exact.
    abs_pack = env.pack("ephemeral", bins=("/bin/sh",), name="abs")
    with pytest.raises(NotAllowlistedError, match='^bin "sh" not allowlisted$'):
        d.run(abs_pack, sh(f"touch {env.marker}"), timeout=TIMEOUT)
    assert not env.marker.exists() and env.leftovers() == []
    # Controls: on both lists it runs.
    assert env.driver(allow_bins=("sh",)).run(pack, sh(f"touch {env.marker}"),
                                              timeout=TIMEOUT).returncode == 0
    assert env.marker.exists()


def test_pack_shipped_bin_relative_to_the_pack_root(env):
    pack = env.pack("ephemeral", bins=("bin/tool",),
                    files={"bin/tool": '#!/bin/sh\necho "tool in $(pwd) from $0"\n'})
    d = env.driver()
    for argv0 in ("bin/tool", "./bin/tool", os.path.join(pack.root, "bin/tool")):
        r = d.run(pack, [argv0], capture_output=True, timeout=TIMEOUT)
        assert r.returncode == 0, r.stderr
        assert r.stdout.decode().strip() == f"tool in {r.jail} from {pack.root}/bin/tool"
    with pytest.raises(NotAllowlistedError, match='^bin "tool" not allowlisted$'):
        d.run(pack, ["tool"], timeout=TIMEOUT)


# --- writeback atomicity ---------------------------------------------------------------

HALF_THEN_SLEEP = 'printf half > "$2"; sleep {sleep}; printf rest >> "$2"'


def test_child_killed_mid_write_leaves_the_destination_untouched(env):
    pack = env.pack("ephemeral")
    d = env.driver()
    dest = env.host / "result.txt"
    dest.write_text("old content")
    ex = d.prepare(pack, cwd=str(env.host))
    try:
        argv = d.rewrite_argv(ex, sh(HALF_THEN_SLEEP.format(sleep=S30_0101), "-o", "result.txt"))
        staged = argv[-1]
        proc = d.spawn(ex)
        wait_for(lambda: os.path.exists(staged) and open(staged).read() == "half",
                 "the child's half-written output")
        proc.kill()
        rc = proc.wait(TIMEOUT)
        report = d.writeback(ex, rc)
        assert report.skipped == "killed by signal 9" and report.written == ()
    finally:
        d.cleanup(ex)
    assert dest.read_text() == "old content"
    assert os.listdir(env.host) == ["result.txt"]  # no temp file beside it
    assert env.leftovers() == [] and gone(S30_0101)


def test_timeout_mid_write_leaves_the_destination_untouched_and_cleans_up(env):
    pack = env.pack("ephemeral")
    dest = env.host / "result.txt"
    dest.write_text("old content")
    r = env.driver().run(pack, sh(HALF_THEN_SLEEP.format(sleep=S30_0202), "--output",
                                  "result.txt"), cwd=str(env.host), timeout=1.0)
    assert r.timed_out and r.returncode != 0
    assert r.writeback.skipped == "timed out" and r.writeback.written == ()
    assert dest.read_text() == "old content" and os.listdir(env.host) == ["result.txt"]
    assert env.leftovers() == [] and gone(S30_0202)


def test_failed_run_is_not_written_back(env):
    pack = env.pack("ephemeral")
    dest = env.host / "result.txt"
    dest.write_text("old content")
    r = env.driver().run(pack, sh('echo new > "$2"; exit 3', "-o", "result.txt"),
                         cwd=str(env.host), timeout=TIMEOUT)
    assert r.returncode == 3 and r.writeback.skipped == "exit status 3"
    assert dest.read_text() == "old content"


# --- cleanup on every path -------------------------------------------------------------

def test_cleanup_after_an_exception(env):
    pack = env.pack("ephemeral")
    with pytest.raises(TypeError, match="unsupported stdio value"):
        env.driver().run(pack, sh("true"), stdout=object(), timeout=TIMEOUT)
    assert env.leftovers() == []
    # workspace mode: the lock is released and the staging area removed.
    wpack = env.pack("workspace", name="w")
    (env.host / "in").write_text("x")
    d = LinuxDriver(Policy(jail=str(env.base)), state_dir=str(env.state), lock_timeout=0)
    with pytest.raises(TypeError):
        d.run(wpack, sh("true", "--file", "in"), cwd=str(env.host), stdout=object(),
              timeout=TIMEOUT)
    ex = d.prepare(wpack)  # would raise WorkspaceBusyError if the lock had leaked
    assert os.listdir(ex.jail) == []
    d.cleanup(ex)


def test_cleanup_after_a_timeout(env):
    pack = env.pack("ephemeral")
    r = env.driver().run(pack, sh(f"echo x > inside; sleep {S30_0303}"), timeout=0.5)
    assert r.timed_out and r.returncode == -signal.SIGKILL
    assert env.leftovers() == [] and gone(S30_0303)


def test_cleanup_after_keyboard_interrupt(env):
    pack = env.pack("ephemeral")
    main = threading.main_thread()
    assert threading.current_thread() is main
    # ^C raises KeyboardInterrupt, as in a terminal, even when this suite was started with
    # SIGINT ignored (a background job of a non-interactive shell, nohup ... &)
    old = signal.signal(signal.SIGINT, signal.default_int_handler)  # restored below

    def interrupt() -> None:
        wait_for(lambda: processes_with(S30_0404), "the child to start")
        os.kill(os.getpid(), signal.SIGINT)

    t = threading.Thread(target=interrupt, daemon=True)
    t.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            env.driver().run(pack, sh(f"sleep {S30_0404}"), timeout=TIMEOUT)
    finally:
        signal.signal(signal.SIGINT, old)
    t.join(TIMEOUT)
    assert env.leftovers() == [] and gone(S30_0404)


def test_cleanup_removes_a_jail_the_child_made_unfriendly(env):
    pack = env.pack("ephemeral")
    r = env.driver().run(pack, sh("mkdir -p d/e; touch d/e/f; chmod 000 d/e d; chmod 500 ."),
                         timeout=TIMEOUT)
    assert r.returncode == 0 and env.leftovers() == []


# --- concurrency -----------------------------------------------------------------------

SERIAL = 'echo "start $1" >> "$2"; sleep 0.6; echo "end $1" >> "$2"'
# The control: each run waits (at most 10 s) until both have started, so two runs that do
# overlap always show it, however loaded the machine is.
MEET = ('echo "start $1" >> "$2"; i=0; while [ "$(grep -c start "$2")" -lt 2 ] && '
        '[ $i -lt 1000 ]; do sleep 0.01; i=$((i+1)); done; echo "end $1" >> "$2"')


def run_two(env, principals, script=SERIAL):
    pack = env.pack("workspace")
    d = env.driver()
    log = env.shared / "log"
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def one(tag: str, principal: str) -> None:
        try:
            barrier.wait(TIMEOUT)
            r = d.run(pack, sh(script, tag, str(log)), principal=principal, timeout=TIMEOUT)
            assert r.returncode == 0
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=one, args=(t, p)) for t, p in zip("AB", principals)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(2 * TIMEOUT)
    assert not errors and not any(t.is_alive() for t in threads)
    return log.read_text().split("\n")[:-1]


def test_concurrent_runs_in_one_workspace_are_serialised(env):
    lines = run_two(env, ("alice", "alice"))
    first = lines[0].split()[1]
    other = "B" if first == "A" else "A"
    assert lines == [f"start {first}", f"end {first}", f"start {other}", f"end {other}"]


def test_control_runs_in_two_workspaces_overlap(env):
    # Negative control: without the shared lock the same two runs interleave, so the test
    # above would see it if serialisation failed.
    lines = run_two(env, ("alice", "bob"), MEET)
    assert [line.split()[0] for line in lines] == ["start", "start", "end", "end"]


def test_lock_timeout(env):
    pack = env.pack("workspace")
    d = LinuxDriver(Policy(jail=str(env.base)), state_dir=str(env.state), lock_timeout=0.2)
    ex = d.prepare(pack, principal="alice")
    try:
        with pytest.raises(WorkspaceBusyError, match="still held by another run after 0.2s"):
            d.prepare(pack, principal="alice")
        d.cleanup(d.prepare(pack, principal="bob"))  # another workspace is free
    finally:
        d.cleanup(ex)
    d.cleanup(d.prepare(pack, principal="alice"))


def test_a_released_lock_is_not_held_by_another_running_sandbox(env):
    # flock belongs to the open file description: a sandbox forked by another thread while
    # the lock fd was open must not keep it (O_CLOEXEC + the engine closing inherited fds).
    pack = env.pack("workspace")
    d = LinuxDriver(Policy(jail=str(env.base)), state_dir=str(env.state), lock_timeout=5)
    held = d.prepare(pack, principal="alice")
    other = threading.Thread(target=lambda: d.run(pack, sh(f"sleep {S3_0808}"), principal="bob",
                                                  timeout=TIMEOUT))
    other.start()
    try:
        wait_for(lambda: processes_with(S3_0808), "bob's run to start")
        d.cleanup(held)
        d.cleanup(d.prepare(pack, principal="alice"))
        # the order of events, not a time: alice got the lock while bob's run still ran
        assert processes_with(S3_0808), "the lock was free only once bob's run had ended"
    finally:
        other.join(TIMEOUT)


def test_many_runs_from_threads(env):
    pack = env.pack("ephemeral")
    d = env.driver()
    results: dict[int, DriverResult] = {}

    def one(i: int) -> None:
        results[i] = d.run(pack, sh('echo "$1" > f; cat f', str(i)), capture_output=True,
                           timeout=TIMEOUT)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(2 * TIMEOUT)
    assert sorted(results) == list(range(6))
    assert all(results[i].stdout == f"{i}\n".encode() for i in range(6))
    assert len({r.jail for r in results.values()}) == 6
    assert env.leftovers() == []


# --- asyncio ---------------------------------------------------------------------------

def test_run_async_with_io(env):
    pack = env.pack("ephemeral")
    (env.host / "in.txt").write_text("from host")

    async def main() -> DriverResult:
        return await env.driver().run_async(
            pack, sh('cat; cat "$2"; echo err >&2; echo done > "$4"', "--file", "in.txt",
                     "-o", "out.txt"),
            input=b"from stdin\n", capture_output=True, cwd=str(env.host), timeout=TIMEOUT)

    r = asyncio.run(asyncio.wait_for(main(), 2 * TIMEOUT))
    assert r.returncode == 0 and r.stdout == b"from stdin\nfrom host" and r.stderr == b"err\n"
    assert (env.host / "out.txt").read_text() == "done\n"
    assert env.leftovers() == []


def test_run_async_concurrent_in_one_workspace_are_serialised(env):
    pack = env.pack("workspace")
    d = env.driver()
    log = env.shared / "log"

    async def main() -> list[DriverResult]:
        return await asyncio.gather(*[
            d.run_async(pack, sh(SERIAL, tag, str(log)), timeout=TIMEOUT) for tag in "AB"])

    results = asyncio.run(asyncio.wait_for(main(), 3 * TIMEOUT))
    assert [r.returncode for r in results] == [0, 0]
    lines = log.read_text().split("\n")[:-1]
    first = lines[0].split()[1]
    other = "B" if first == "A" else "A"
    assert lines == [f"start {first}", f"end {first}", f"start {other}", f"end {other}"]


def test_run_async_timeout(env):
    pack = env.pack("ephemeral")
    r = asyncio.run(asyncio.wait_for(
        env.driver().run_async(pack, sh(f"sleep {S30_0505}"), capture_output=True, timeout=0.5),
        TIMEOUT))
    assert r.timed_out and env.leftovers() == [] and gone(S30_0505)


def test_run_async_timeout_while_stdin_is_still_being_fed(env):
    # The child never reads its 4 MiB of input: the writer is still registered at the timeout.
    pack = env.pack("ephemeral")
    r = asyncio.run(asyncio.wait_for(
        env.driver().run_async(pack, sh(f"sleep {S30_0909}"), input=b"x" * (4 << 20),
                               capture_output=True, timeout=0.5), TIMEOUT))
    assert r.timed_out and env.leftovers() == [] and gone(S30_0909)


def test_run_async_cancel_kills_and_cleans_up(env):
    pack = env.pack("ephemeral")

    async def main() -> None:
        task = asyncio.create_task(env.driver().run_async(pack, sh(f"sleep {S30_0606}"),
                                                          capture_output=True))
        deadline = time.monotonic() + TIMEOUT
        while not processes_with(S30_0606):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(asyncio.wait_for(main(), 2 * TIMEOUT))
    assert env.leftovers() == [] and gone(S30_0606)


def test_run_async_cancel_while_waiting_for_the_lock(env):
    pack = env.pack("workspace")
    d = env.driver()
    holder = d.prepare(pack)

    async def main() -> None:
        task = asyncio.create_task(d.run_async(pack, sh(f"touch {env.marker}")))
        await asyncio.sleep(0.3)  # it is now waiting for the lock
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    try:
        asyncio.run(asyncio.wait_for(main(), TIMEOUT))
    finally:
        d.cleanup(holder)
    assert not env.marker.exists()
    # the abandoned wait did not leave the lock taken
    quick = LinuxDriver(Policy(jail=str(env.base)), state_dir=str(env.state), lock_timeout=5)
    quick.cleanup(quick.prepare(pack))


def test_captured_output_is_capped_by_the_policy(env):
    pack = env.pack("ephemeral")
    d = env.driver(limits={"output": 1000})
    script = "head -c 5000 /dev/zero; head -c 10 /dev/zero >&2"
    r = d.run(pack, sh(script), capture_output=True, timeout=TIMEOUT)
    assert (len(r.stdout), len(r.stderr), r.truncated) == (1000, 10, frozenset({"stdout"}))
    ra = asyncio.run(asyncio.wait_for(
        d.run_async(pack, sh(script), capture_output=True, timeout=TIMEOUT), TIMEOUT))
    assert (len(ra.stdout), len(ra.stderr), ra.truncated) == (1000, 10, frozenset({"stdout"}))
    assert r.returncode == ra.returncode == 0


def test_receipt_names_the_driver(env):
    pack = env.pack("ephemeral")
    r = env.driver().run(pack, sh("true"), timeout=TIMEOUT)
    assert r.receipt["driver"]["name"] == "linux"
    assert r.receipt["driver"]["mode"] == "ephemeral"
    assert r.receipt["driver"]["pack_root"] == pack.root
    assert r.receipt["layers"]["seccomp"]["status"] == "enforced"
    r.check_returncode()
    assert PIPE is not None


@pytest.mark.parametrize("made", ["open to others", "a symlink"])
def test_a_jail_home_not_the_user_s_alone_is_refused(env, made):
    """The jail home (every ephemeral jail: hcp_linux.runtime_files.jail_home) made first
    by someone else, or in a way others can enter: one line naming it, nothing spawned,
    nothing made in it. Control: once it is the user's alone, the same run runs there."""
    from sandboxing import jail_home_of
    from hcp_linux.errors import SandboxError
    home = jail_home_of(env.tmp)
    elsewhere = env.base / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    if made == "a symlink":
        home.symlink_to(elsewhere)
    else:
        home.mkdir()
        os.chmod(home, 0o755)
    pack = env.pack("ephemeral")
    with pytest.raises(SandboxError, match=r"^jail: .*hcp-linux-jails-\d+: (a symlink, not a "
                                           r"directory|mode 0755 lets others in)"):
        env.driver().run(pack, sh(f"touch {env.marker}"), timeout=TIMEOUT)
    assert not env.marker.exists() and os.listdir(elsewhere) == []
    assert (os.listdir(home) == []) if made != "a symlink" else home.is_symlink()
    if made == "a symlink":
        home.unlink()
    else:
        os.chmod(home, 0o700)
    r = env.driver().run(pack, sh(f"touch {env.marker}"), timeout=TIMEOUT)
    assert r.returncode == 0 and env.marker.exists() and env.leftovers() == []
