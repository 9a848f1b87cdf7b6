"""A runtime that lives for days: a helper killed in one run costs that run alone (DESIGN.md
§8; issue 29).

Helpers (spares, monitors, inits) are SIGKILLed for real, by pid, while the runtime spawns;
afterwards every run of the same process must succeed, a new ``Sandbox`` included: nothing
may be learned process-wide from a run whose helper died. Both executors, root and nobody.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hcp_linux import Policy, Sandbox
from hcp_linux.run import executor
from hcp_linux.errors import HelperLostError
from sandboxing import TIMEOUT, jail, wait_for  # noqa: F401

#: This directory, for the scripts run in a fresh interpreter that import runtime_hooks.
TESTS = os.path.dirname(os.path.abspath(__file__))


def test_a_monitor_killed_at_the_listener_hand_over_fails_that_run_alone(
        jail: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The monitor dies (SIGKILL, for real) with its listener message unread. No listener
    means no exec (it is sent right before it), so the run is started afresh once; its
    monitor killed the same way, that run fails naming the helper and the step; the next
    runs, a new Sandbox among them, succeed."""
    real = executor.receive_listener
    real_start = executor._start
    monitors: list[int] = []
    killed: list[int] = []

    def recorded(*args, **kwargs):  # type: ignore[no-untyped-def]
        started = real_start(*args, **kwargs)
        monitors.append(started[0])
        return started

    def killed_before_hand_over(channel: int) -> tuple[int, int]:
        if len(killed) == 2:
            return real(channel)
        # the run's monitor SIGKILLed, its message lost: a hand-over a killed helper never
        # completes (the OOM killer, an operator, a pids limit)
        os.kill(monitors[-1], signal.SIGKILL)
        killed.append(monitors[-1])
        fd, _ = real(channel)
        if fd >= 0:
            os.close(fd)
        return -1, 0

    monkeypatch.setattr(executor, "_start", recorded)
    monkeypatch.setattr(executor, "receive_listener", killed_before_hand_over)
    sandbox = Sandbox(Policy(jail=str(jail)))
    with pytest.raises(HelperLostError) as e:  # a command that outlives the kill
        sandbox.run(["sh", "-c", "sleep 5; echo ok"], capture_output=True, timeout=TIMEOUT)
    assert len(killed) == 2 and killed[0] != killed[1], killed  # once afresh, then failed
    text = str(e.value)
    assert "monitor" in text and "seccomp" in text and "SIGKILL" in text, text
    assert "CONFIG_SECCOMP" not in text and "allow-degraded" not in text, text
    assert e.value.exit_code == 125
    for s in (sandbox, Sandbox(Policy(jail=str(jail)))):  # the same object, and a new one
        r = s.run(["sh", "-c", "echo ok"], capture_output=True, timeout=TIMEOUT)
        assert (r.returncode, r.stdout) == (0, b"ok\n"), r
        assert r.receipt["layers"]["seccomp"]["status"] == "enforced"
        assert r.receipt.get("degraded", {}) == {} or not r.receipt["degraded"]


STORM = textwrap.dedent(r"""
    import collections, os, random, signal, sys, threading, time
    from hcp_linux import Policy, Sandbox
    jail, seconds = sys.argv[1], float(sys.argv[2])
    me = os.getpid()

    def descendants():
        kids = collections.defaultdict(list)
        for p in os.listdir("/proc"):
            if p.isdigit():
                try:
                    with open(f"/proc/{p}/stat") as f:
                        ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                except (OSError, ValueError, IndexError):
                    continue
                kids[ppid].append(int(p))
        out, todo = [], [me]
        while todo:
            for c in kids.get(todo.pop(), []):
                out.append(c)
                todo.append(c)
        return out

    stop = threading.Event()

    def killer():
        rng = random.Random(29)
        while not stop.wait(rng.uniform(0.002, 0.03)):
            d = descendants()
            if d:
                try:
                    os.kill(rng.choice(d), signal.SIGKILL)
                except OSError:
                    pass

    def one():
        try:
            r = Sandbox(Policy(jail=jail)).run(["sh", "-c", "echo ok"], capture_output=True,
                                                timeout=20)
            return "ok" if (r.returncode, r.stdout) == (0, b"ok\n") else f"rc={r.returncode}"
        except Exception as e:
            return f"{type(e).__name__}: {e}"

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    during = collections.Counter()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        during[one()] += 1
    stop.set()
    t.join()
    after = collections.Counter(one() for _ in range(10))
    for k, v in during.items():
        print("during", v, k.replace("\n", " ")[:300])
    for k, v in after.items():
        print("after", v, k.replace("\n", " ")[:300])
""")


def test_helpers_killed_at_random_leave_the_process_working(jail: Path) -> None:
    """Three seconds of SIGKILLs at random helpers of a runtime spawning back to back; then
    ten runs of the same process all succeed, and no run in the storm said a layer was
    unavailable (nothing was learned from a killed helper)."""
    p = subprocess.run([sys.executable, "-c", STORM, str(jail), "3"], capture_output=True,
                       timeout=120, stdin=subprocess.DEVNULL, cwd="/")
    text = p.stdout.decode()
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    after = [line for line in text.splitlines() if line.startswith("after ")]
    assert after == ["after 10 ok"], text
    assert "unavailable" not in text and "LayerUnavailable" not in text, text


@pytest.fixture
def tmpdir_with_foreign_mounts(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A TMPDIR holding what docker, podman and chroots leave there: a proc mount and an
    nsfs bind (a namespace file) in subdirectories. Root only (mount)."""
    tmpdir = tmp_path / "tmp"
    proc = tmpdir / "chroot" / "proc"
    proc.mkdir(parents=True)
    ns = tmpdir / "netns-x"
    ns.touch()
    mounts: list[Path] = []
    try:
        subprocess.run(["mount", "-t", "proc", "proc", str(proc)], check=True, timeout=TIMEOUT)
        mounts.append(proc)
        subprocess.run(["mount", "--bind", "/proc/self/ns/net", str(ns)], check=True,
                       timeout=TIMEOUT)
        mounts.append(ns)
        yield tmpdir
    finally:
        for m in reversed(mounts):
            subprocess.run(["umount", "-l", str(m)], timeout=TIMEOUT)


@pytest.mark.root_only
def test_foreign_mounts_under_tmpdir_leave_packs_and_the_driver_working(
        tmpdir_with_foreign_mounts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
        ) -> None:
    from hcp_linux.driver.driver import LinuxDriver
    tmpdir = tmpdir_with_foreign_mounts
    root = tmp_path / "pack"
    root.mkdir()
    (root / "pack.toml").write_text('name = "p"\n[wrap]\nbin = ["sh"]\n'
                                    '[wrap.workspace]\nmode = "ephemeral"\n')
    env = dict(os.environ, TMPDIR=str(tmpdir))
    p = subprocess.run([sys.executable, "-m", "hcp_linux", "run", "--pack", str(root / "pack.toml"),
                        "--", "sh", "-c", "pwd; echo ok"], capture_output=True, timeout=TIMEOUT,
                       env=env, cwd="/", stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stderr.decode()
    jail, ok = p.stdout.decode().split()
    assert ok == "ok" and jail.startswith(str(tmpdir) + "/")  # the jail it made, in TMPDIR
    monkeypatch.setenv("TMPDIR", str(tmpdir))
    result = LinuxDriver().run(str(root / "pack.toml"), ["sh", "-c", "echo ok"],
                               capture_output=True)
    assert (result.returncode, result.stdout) == (0, b"ok\n"), result
    # the rule itself still holds: a granted directory holding a proc mount is refused
    p = subprocess.run([sys.executable, "-m", "hcp_linux", "run", "--jail", str(tmpdir / "chroot"),
                        "--", "true"], capture_output=True, timeout=TIMEOUT, env=env, cwd="/",
                       stdin=subprocess.DEVNULL)
    assert p.returncode == 125 and b"proc is mounted inside it" in p.stderr, p.stderr


def _read_only_tmp(*argv: str) -> subprocess.CompletedProcess:
    """``hcp-linux ARGV`` where no temporary directory takes a file: a mount namespace with
    read-only bind of /tmp and /var/tmp over themselves (their files, this tree's copy for
    the unprivileged leg among them, still there), TMPDIR unset, the cwd /proc (a container
    with a read-only root and no tmpfs)."""
    unshare = ["unshare", "-m"] if os.geteuid() == 0 else ["unshare", "-Urm"]
    script = ('for d in /tmp /var/tmp; do mount --bind "$d" "$d" && '
              'mount -o remount,bind,ro "$d" || exit 97; done; cd /proc && exec "$@"')
    env = {k: v for k, v in os.environ.items() if k not in ("TMPDIR", "TEMP", "TMP")}
    return subprocess.run([*unshare, "sh", "-c", script, "sh", sys.executable, "-m",
                           "hcp_linux", *argv], capture_output=True, timeout=TIMEOUT, env=env,
                          stdin=subprocess.DEVNULL, cwd="/")


def test_no_writable_tmp_probe_reports_gc_and_pack_say_one_line(tmp_path: Path) -> None:
    control = subprocess.run(["unshare", "-m" if os.geteuid() == 0 else "-Urm", "true"],
                             capture_output=True, timeout=TIMEOUT)
    if control.returncode != 0:
        pytest.skip(f"cannot make a mount namespace here: {control.stderr.decode()[-200:]}")
    p = _read_only_tmp("probe", "--json")
    assert b"Traceback" not in p.stderr, p.stderr.decode()
    import json
    report = json.loads(p.stdout)
    assert "no writable temporary directory" in report["facts"]["probe_jail"]
    assert report["layers"]["seccomp"]["available"], report  # the probe still probed
    for argv in (["gc"], ["run", "--pack", str(tmp_path / "pack.toml"), "--", "true"]):
        (tmp_path / "pack.toml").write_text('name = "p"\n[wrap]\nbin = ["true"]\n'
                                            '[wrap.workspace]\nmode = "ephemeral"\n')
        p = _read_only_tmp(*argv)
        assert p.returncode == 125, (argv, p.stderr.decode())
        lines = p.stderr.decode().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: sandbox: "), lines
        assert "TMPDIR" in lines[0], lines


LIMITS = textwrap.dedent(r"""
    import json, os, resource, sys
    from hcp_linux import Policy, Sandbox, native
    executor, jail = sys.argv[1], sys.argv[2]
    sys.path.insert(0, sys.argv[3])  # tests/
    from runtime_hooks import put_spare
    native.set_default(executor)
    sandbox = Sandbox(Policy(jail=jail))

    def ulimit_n():
        try:
            r = sandbox.run(["sh", "-c", "ulimit -n"], capture_output=True, timeout=20)
            return [r.returncode, r.stdout.decode()]
        except Exception as e:
            return [type(e).__name__, str(e)]

    for _ in range(3):  # the kind repeats: the pool keeps spares of it
        before = ulimit_n()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)

    def lowest():  # the lowest limit under which a spare can still be made (4 fds)
        used = {int(fd) for fd in os.listdir("/proc/self/fd")}
        tight, free = 0, 0
        while free < 4:
            free += tight not in used
            tight += 1
        return tight

    out = {"before": before, "runs": []}
    for low in (None, 256):  # too low to take a run's fds; merely lower
        if executor == "native":
            # The keeper makes and retires the kind's spares in its own time, with fds of
            # its own: hold its lock while it is between two, so that the fds counted are
            # the fds there are while the spare is made.
            import time
            pool = native.spares.pool()
            deadline = time.monotonic() + 60
            pool.cond.acquire()
            while (not pool.idle or pool.busy) and time.monotonic() < deadline:
                pool.cond.wait(0.01)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (low or lowest(), hard))
            try:  # while the limit is low, a spare is made (as the pool's keeper would)
                if executor == "native":
                    kind = next(iter(pool.idle))
                    put_spare(pool, kind, native.spares.make(kind))
            finally:
                resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        finally:
            if executor == "native":
                pool.cond.release()
        out["runs"].append(ulimit_n())  # the limit is back: the next run is as ever
    print(json.dumps(out))
""")


@pytest.mark.parametrize("executor", ["native", "ctypes"])
def test_a_run_after_rlimit_nofile_was_lowered_and_restored_is_as_ever(
        jail: Path, executor: str) -> None:
    """The runtime's RLIMIT_NOFILE lowered for a moment (EMFILE in the runtime) while a
    spare is made, then restored: the next run must not go to that spare. A spare keeps
    the limits of the moment it was started: one too low to take a run's fds failed the
    next run (its monitor exited 125), and one merely lower gave the command a limit the
    runtime no longer had. The command gets the runtime's limit of the moment, as a fresh
    hcp-exec (and Popen) would give it."""
    from hcp_linux import native
    if executor == "native" and not native.available():
        pytest.skip("native executor not built")
    p = subprocess.run([sys.executable, "-c", LIMITS, executor, str(jail), TESTS],
                       capture_output=True, timeout=120, stdin=subprocess.DEVNULL, cwd="/")
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    import json
    out = json.loads(p.stdout)
    want = out["before"]  # the policy's limit (below the runtime's), as before the fault
    assert want[0] == 0 and int(want[1]) > 256, out
    assert out["runs"] == [want, want], out


FULL_TMPDIR = r"""
T="$1"; shift
mount -t tmpfs -o size=256k,nr_inodes=16 tmpfs "$T" || exit 99
head -c 1M /dev/zero > "$T/fill" 2>/dev/null
i=0; while true > "$T/f$i" 2>/dev/null; do i=$((i+1)); done
TMPDIR="$T" "$@" 2>&1; echo "status $?"
echo ---
rm -f "$T"/fill "$T"/f*
TMPDIR="$T" "$@"
"""


def test_a_full_tmpdir_fails_a_pack_run_in_one_line_and_the_next_run_works(
        tmp_path: Path) -> None:
    """`hcp-linux run --pack` whose TMPDIR is a full file system (blocks and inodes, a tmpfs
    in a mount namespace of the test's): one line naming the directory and the remedy,
    exit 125, no traceback; the space freed, the same command runs."""
    unshare = ["unshare", "-m"] if os.geteuid() == 0 else ["unshare", "-Urm"]
    control = subprocess.run([*unshare, "true"], capture_output=True, timeout=TIMEOUT)
    if control.returncode != 0:
        pytest.skip(f"cannot make a mount namespace here: {control.stderr.decode()[-200:]}")
    (tmp_path / "full").mkdir()
    (tmp_path / "pack").mkdir()
    pack = tmp_path / "pack" / "pack.toml"
    pack.write_text('name = "p"\n[wrap]\nbin = ["sh"]\n[wrap.workspace]\nmode = "ephemeral"\n')
    p = subprocess.run([*unshare, "sh", "-c", FULL_TMPDIR, "sh", str(tmp_path / "full"),
                        sys.executable, "-m", "hcp_linux", "run", "--pack", str(pack), "--",
                        "sh", "-c", "echo ok"],
                       capture_output=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL, cwd="/")
    assert p.returncode == 0, (p.stdout.decode(), p.stderr.decode())
    full, freed = p.stdout.decode().split("---\n")
    lines = full.splitlines()
    assert lines[-1] == "status 125", lines
    assert len(lines) == 2 and lines[0].startswith("error: sandbox: "), lines
    assert "No space left on device" in lines[0] and "TMPDIR" in lines[0], lines
    assert freed == "ok\n", (freed, p.stderr.decode())


IDLE_KILLS = textwrap.dedent(r"""
    import collections, os, signal, sys, time
    from hcp_linux import Policy, Sandbox, native
    jail, n = sys.argv[1], int(sys.argv[2])
    sys.path.insert(0, sys.argv[3])  # tests/
    from runtime_hooks import put_spare
    sandbox = Sandbox(Policy(jail=jail))
    for _ in range(3):
        sandbox.run(["true"], timeout=20)
    pool = native.spares.pool()
    kind = next(iter(pool.idle))

    def zombie(pid):
        with open(f"/proc/{pid}/stat") as f:  # our unreaped child
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"

    out = collections.Counter()
    for i in range(n):
        spare = native.spares.make(kind)
        time.sleep(0.006 * i / n)  # at a moment of its early steps, or once it waits
        os.kill(spare.pid, signal.SIGKILL)  # the OOM killer, an operator
        while not zombie(spare.pid):
            time.sleep(0.0002)
        put_spare(pool, kind, spare)  # the next spare handed out
        try:
            r = sandbox.run(["sh", "-c", "echo ok"], capture_output=True, timeout=20)
            out["ok" if (r.returncode, r.stdout) == (0, b"ok\n") else f"rc {r.returncode}"] += 1
        except Exception as e:
            out[f"{type(e).__name__}: {e}"[:50]] += 1
    print(dict(out))
""")


def test_a_spare_whose_monitor_died_idle_is_never_handed_a_run(jail: Path) -> None:
    """An idle spare's monitor SIGKILLed (for real) at a moment of its early steps: its init
    may live on (killed between its fork and its parent-death signal: it holds the spare's
    socket, the monitor's death noted as a failure for the next plan). The run handed to it
    failed ("pdeathsig ... the monitor is gone"), a run after the fault. A spare whose
    monitor has exited is retired, never handed a run: every run succeeds."""
    from hcp_linux import native
    if not native.available():
        pytest.skip("native executor not built (spares are the native executor's)")
    p = subprocess.run([sys.executable, "-c", IDLE_KILLS, str(jail), "400", TESTS],
                       capture_output=True, timeout=300, stdin=subprocess.DEVNULL, cwd="/")
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    assert p.stdout.decode().strip() == "{'ok': 400}", p.stdout.decode()


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(c) for c in f.read().split()]


@pytest.mark.parametrize("victim", ["monitor", "init"])
def test_a_run_killed_from_outside_says_it_was_lost(jail: Path, victim: str) -> None:
    """The sandbox's monitor or init SIGKILLed mid-run (the OOM killer, an operator): the
    run ends with it, and the receipt says the run was lost (``end.by``), not that the
    command exited by SIGKILL: no status of the command's came. Control: a command that
    SIGKILLs itself reads ``exit``, with the same returncode."""
    from hcp_linux.receipt_keys import END_NOTES
    sb = Sandbox(Policy(jail=str(jail)))
    p = sb.spawn(["/bin/sh", "-c", "touch ready; exec sleep 30"])
    try:
        wait_for(lambda: (jail / "ready").exists(), "the command")
        target = p.pid if victim == "monitor" else _children(p.pid)[0]
        os.kill(target, signal.SIGKILL)
        assert p.wait(TIMEOUT) == -signal.SIGKILL
    finally:
        if p.returncode is None:
            p.kill()
            p.wait()
    assert p.receipt["end"]["by"] == "lost" and END_NOTES["lost"] in p.receipt["end"]["notes"], \
        p.receipt["end"]
    control = sb.run(["/bin/sh", "-c", "kill -9 $$"], timeout=TIMEOUT)
    assert control.returncode == -signal.SIGKILL
    assert control.receipt["end"] == {"by": "exit"}, control.receipt["end"]


@pytest.mark.parametrize("how", ["python", "python served", "native served"])
def test_the_cli_says_a_run_killed_from_outside_was_lost(jail: Path, tmp_path: Path,
                                                         how: str) -> None:
    """The same through `hcp-linux run`, in-process and served (by the Python client, and
    by the native one, which runs the command itself when no receipt is asked for): one line
    says the exit status is not the command's, and the receipt says ``lost``. Control: the
    command's own SIGKILL prints no such line."""
    import sandboxing
    from test_caller_state import way
    receipt = tmp_path / "r.json"
    # a receipt sends the native client's run to Python: without one it is the native's
    extra = [] if how.startswith("native") else ["--receipt", str(receipt)]
    with way(how, tmp_path) as (cli_argv, env):
        cli = subprocess.Popen([*cli_argv, "run", *sandboxing.EXECUTOR_ARGS, "--jail",
                                str(jail), *extra, "--", "/bin/sh", "-c",
                                "touch ready; exec sleep 30"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, cwd="/",
                               env=env)
        try:
            wait_for(lambda: (jail / "ready").exists(), "the command")
            monitor = _children(cli.pid)[0]  # the runtime's one child: the sandbox's monitor
            os.kill(monitor, signal.SIGKILL)
            _, stderr = cli.communicate(timeout=TIMEOUT)
        finally:
            sandboxing.kill_by_pid(cli)
        control = subprocess.run([*cli_argv, "run", *sandboxing.EXECUTOR_ARGS, "--jail",
                                  str(jail), "--", "/bin/sh", "-c", "kill -9 $$"],
                                 capture_output=True, stdin=subprocess.DEVNULL, cwd="/",
                                 env=env, timeout=TIMEOUT)
    assert cli.returncode == 128 + signal.SIGKILL, stderr
    assert b"killed from outside the run" in stderr and stderr.count(b"\n") == 1, stderr
    assert control.returncode == 128 + signal.SIGKILL, control.stderr
    assert b"killed from outside" not in control.stderr, control.stderr
    if extra:
        import json
        rec = json.loads(receipt.read_text())
        assert rec["end"]["by"] == "lost", rec["end"]
        # a server plans for the native executor only: CI's ctypes leg runs in-process
        served = how == "python served" and "ctypes" not in sandboxing.EXECUTOR_ARGS
        assert ("served_by" in rec) == served, rec.get("served_by")
