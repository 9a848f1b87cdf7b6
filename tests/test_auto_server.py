"""``HCP_LINUX_SERVER=auto``: the user's own planner, started by a run, gone when idle (issue 35).

What must hold: a run with no server runs in-process, as ever, and then starts one that the
next run is served by; that server is detached (its own session, cwd /, no fd of the run's:
a pipe the caller waits on gets its EOF when the run ends), exits when idle or when its code
changes, and two that start at once leave one; a server killed or stopped costs at most one
run its speed, never its result; a refused run starts nothing; a socket directory that is not
the user's alone is not used (one line, an in-process run, nothing made); and no run can
write in that directory. Every server a test starts is found by its own environment (this
test's XDG_RUNTIME_DIR) and ended by its pid.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from hcp_linux.cli.auto_server import install_name
from sandboxing import (IS_ROOT, TIMEOUT, caller_env, cli_run_waiting, out, read_receipt,
                        run_cli, show, wait_for)


#: The server's socket and lock in its directory: one pair per installation, and the CLI
#: these tests run is this Python environment's, with this package.
SOCK, LOCK = f"serve-{install_name()}.sock", f"serve-{install_name()}.lock"


@pytest.fixture(autouse=True)
def default_executor(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A server plans for the native executor only (`--executor ctypes` runs in-process)."""
    import sandboxing
    monkeypatch.setattr(sandboxing, "EXECUTOR_ARGS", [])


@pytest.fixture
def runtime_dir(tmp_path: Path) -> Iterator[Path]:
    """This test's XDG_RUNTIME_DIR (mode 0700, as systemd makes it); every auto server that
    lives in it is ended afterwards, by pid."""
    d = tmp_path / "run-user"
    d.mkdir(mode=0o700)
    yield d
    for pid in servers_of(d):
        _end(pid)


def auto_env(runtime: Path, **extra: str) -> dict[str, str]:
    return caller_env({"HCP_LINUX_SERVER": "auto", "XDG_RUNTIME_DIR": str(runtime), **extra})


def servers_of(runtime: Path) -> list[int]:
    """Pids of `hcp-linux serve --auto` processes started with ``runtime`` as their
    XDG_RUNTIME_DIR (this test's alone), running or stopped."""
    want = b"XDG_RUNTIME_DIR=" + os.fsencode(runtime)
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if not f.read().endswith(b"\0serve\0--auto\0"):
                    continue
            with open(f"/proc/{name}/environ", "rb") as f:
                if want not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{name}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    continue  # exited, not yet reaped by whoever adopted it
        except OSError:
            continue
        found.append(int(name))
    return found


def _end(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    wait_for(lambda: not _alive(pid), f"server {pid} to end")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def answers(path: Path) -> bool:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        s.close()


def one_server(runtime: Path) -> int:
    """The single auto server of ``runtime``, once it answers on its socket."""
    sock = runtime / "hcp-linux" / SOCK
    wait_for(lambda: len(servers_of(runtime)) == 1 and answers(sock), "one server to answer")
    (pid,) = servers_of(runtime)
    return pid


def served_by(receipt: Path) -> dict | None:
    return read_receipt(receipt).get("served_by")


def test_a_run_starts_the_user_s_server_and_the_next_run_is_served(tmp_path: Path,
                                                                     runtime_dir: Path) -> None:
    env = auto_env(runtime_dir)
    jail = tmp_path / "jail"
    jail.mkdir()
    # the caller hands the run a pipe it waits on (as a runtime capturing output does):
    # the server the run leaves behind must not hold it open
    r, w = os.pipe()
    try:
        first = run_cli(jail, "/bin/echo", "first", extra=["--receipt", tmp_path / "1.json"],
                        env=env, pass_fds=[w])
        os.close(w)
        w = -1
        assert first.returncode == 0 and out(first) == "first\n", show(first)
        assert first.stderr == b"", show(first)  # no server yet is the quiet case
        assert served_by(tmp_path / "1.json") is None  # it ran in-process
        pid = one_server(runtime_dir)
        os.set_blocking(r, False)
        assert os.read(r, 1) == b"", "the server holds the caller's pipe open"
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)
    # detached: a session of its own, cwd /, stdio on /dev/null, not the test's child
    assert os.getsid(pid) == pid
    assert os.readlink(f"/proc/{pid}/cwd") == "/"
    for fd in (0, 1, 2):
        assert os.readlink(f"/proc/{pid}/fd/{fd}") == "/dev/null"
    where = runtime_dir / "hcp-linux"
    assert (where.stat().st_mode & 0o777) == 0o700
    assert ((where / SOCK).stat().st_mode & 0o777) == 0o600

    second = run_cli(jail, "/bin/echo", "second", extra=["--receipt", tmp_path / "2.json"],
                     env=env)
    assert second.returncode == 0 and out(second) == "second\n", show(second)
    by = served_by(tmp_path / "2.json")
    assert by == {"pid": pid, "socket": str(where / SOCK)}, by
    assert servers_of(runtime_dir) == [pid]  # a served run starts no other


def test_without_auto_no_server_is_started(tmp_path: Path, runtime_dir: Path) -> None:
    """The control: the same run without HCP_LINUX_SERVER=auto starts no server and leaves
    no socket, so the test above sees what auto does. (The server's directory, which the
    jail holds, is made empty before the run looks: runtime_files.own_directories.)"""
    env = caller_env({"XDG_RUNTIME_DIR": str(runtime_dir)})
    env.pop("HCP_LINUX_SERVER", None)
    for _ in range(2):
        p = run_cli(tmp_path, "/bin/true", env=env)
        assert p.returncode == 0, show(p)
    time.sleep(0.5)
    assert servers_of(runtime_dir) == []
    assert not (runtime_dir / "hcp-linux").exists() or os.listdir(runtime_dir / "hcp-linux") == []


@pytest.mark.parametrize("argv", [["--network", "sideways", "--", "/bin/true"],
                                  ["--", "/no/such/binary"]])
def test_a_refused_run_starts_nothing(tmp_path: Path, runtime_dir: Path,
                                      argv: list[str]) -> None:
    p = subprocess.run([sys.executable, "-m", "hcp_linux", "run", "--jail", str(tmp_path),
                        *argv], capture_output=True, env=auto_env(runtime_dir), cwd="/",
                       timeout=TIMEOUT, stdin=subprocess.DEVNULL)
    assert p.returncode in (2, 125, 127), show(p)
    assert p.stderr.decode().count("\n") == 1, show(p)
    time.sleep(0.5)
    assert servers_of(runtime_dir) == []
    assert not (runtime_dir / "hcp-linux").exists() or os.listdir(runtime_dir / "hcp-linux") == []


def _not_alone(kind: str, where: Path, tmp_path: Path) -> None:
    if kind == "mode":
        where.mkdir(mode=0o755)
        os.chmod(where, 0o755)
    elif kind == "symlink":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        where.symlink_to(tmp_path / "elsewhere")
    else:
        where.mkdir(mode=0o700)
        os.chown(where, 65534, 65534)


@pytest.mark.parametrize("kind", ["mode", "symlink",
                                  pytest.param("owner", marks=pytest.mark.skipif(
                                      not IS_ROOT, reason="chown to another uid: root"))])
def test_a_directory_not_the_user_s_alone_is_not_used(tmp_path: Path, runtime_dir: Path,
                                                      kind: str) -> None:
    where = runtime_dir / "hcp-linux"
    _not_alone(kind, where, tmp_path)
    before = sorted(os.listdir(where))
    p = run_cli(tmp_path, "/bin/echo", "ran", env=auto_env(runtime_dir))
    assert p.returncode == 0 and out(p) == "ran\n", show(p)
    lines = p.stderr.decode().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"hcp-linux: not using HCP_LINUX_SERVER=auto ({where}): "), show(p)
    assert lines[0].endswith("; running in-process"), show(p)
    time.sleep(0.5)
    assert servers_of(runtime_dir) == [] and sorted(os.listdir(where)) == before
    # and the server itself refuses to make its socket there
    s = subprocess.run([sys.executable, "-m", "hcp_linux", "serve", "--auto"],
                       capture_output=True, env=auto_env(runtime_dir), timeout=TIMEOUT,
                       stdin=subprocess.DEVNULL, cwd="/")
    assert s.returncode == 125, show(s)
    assert s.stderr.decode().startswith(f"error: sandbox: serve: {where}: "), show(s)
    assert sorted(os.listdir(where)) == before


@contextmanager
def _auto_serve(runtime: Path, *flags: str) -> Iterator[subprocess.Popen]:
    """`serve --auto FLAGS` for ``runtime``, once it says it listens; killed (by its pid)
    if it is still running when the test is over."""
    proc = subprocess.Popen([sys.executable, "-m", "hcp_linux", "serve", "--auto", *flags],
                            env=auto_env(runtime), cwd="/", stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        line = proc.stderr.readline()
        assert line.startswith(b"hcp-linux serve: listening on"), line
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()


def test_an_idle_server_exits_and_removes_its_socket(runtime_dir: Path) -> None:
    with _auto_serve(runtime_dir, "--idle-exit", "1") as proc:
        sock = runtime_dir / "hcp-linux" / SOCK
        assert answers(sock)  # a request resets the idle clock: none is made here
        assert proc.wait(timeout=TIMEOUT) == 0
        assert not sock.exists()


def test_a_server_waiting_to_idle_out_ends_on_sigterm(runtime_dir: Path) -> None:
    """SIGTERM while it waits for a client: it exits at once (not after the idle time,
    nor spinning until then), and removes its socket."""
    with _auto_serve(runtime_dir, "--idle-exit", "600") as proc:
        cpu = _cpu_ticks(proc.pid)
        time.sleep(0.5)
        assert _cpu_ticks(proc.pid) - cpu <= 5, "it spins while idle"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=TIMEOUT) == 0
        assert not (runtime_dir / "hcp-linux" / SOCK).exists()


def _cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def test_servers_started_together_leave_one(runtime_dir: Path) -> None:
    env = auto_env(runtime_dir)
    procs = [subprocess.Popen([sys.executable, "-m", "hcp_linux", "serve", "--auto"],
                              env=env, cwd="/", stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for _ in range(4)]
    try:
        sock = runtime_dir / "hcp-linux" / SOCK
        wait_for(lambda: sum(p.poll() is None for p in procs) <= 1 and answers(sock),
                 "all but one to exit")
        time.sleep(0.5)  # none of the others is still coming
        running = [p for p in procs if p.poll() is None]
        assert len(running) == 1
        assert all(p.returncode == 0 for p in procs if p is not running[0])
        assert servers_of(runtime_dir) == [running[0].pid]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


def test_a_killed_server_is_replaced_and_costs_no_run(tmp_path: Path,
                                                      runtime_dir: Path) -> None:
    env = auto_env(runtime_dir)
    assert run_cli(tmp_path, "/bin/true", env=env).returncode == 0
    old = one_server(runtime_dir)
    _end(old)  # as the OOM killer would: no cleanup, the socket left behind
    assert (runtime_dir / "hcp-linux" / SOCK).exists()
    p = run_cli(tmp_path, "/bin/echo", "ran", extra=["--receipt", tmp_path / "r.json"],
                env=env)
    assert p.returncode == 0 and out(p) == "ran\n" and p.stderr == b"", show(p)
    assert served_by(tmp_path / "r.json") is None
    new = one_server(runtime_dir)
    assert new != old
    p = run_cli(tmp_path, "/bin/true", extra=["--receipt", tmp_path / "s.json"], env=env)
    assert p.returncode == 0 and served_by(tmp_path / "s.json")["pid"] == new


def test_a_stopped_server_is_forgotten_after_one_slow_run(tmp_path: Path,
                                                          runtime_dir: Path) -> None:
    env = auto_env(runtime_dir)
    assert run_cli(tmp_path, "/bin/true", env=env).returncode == 0
    old = one_server(runtime_dir)
    sock = runtime_dir / "hcp-linux" / SOCK
    inode = sock.stat().st_ino
    os.kill(old, signal.SIGSTOP)
    try:
        p = run_cli(tmp_path, "/bin/echo", "ran", extra=["--receipt", tmp_path / "r.json"],
                    env=env)
        assert p.returncode == 0 and out(p) == "ran\n", show(p)
        assert served_by(tmp_path / "r.json") is None  # in-process, after the wait
        # its socket is gone, and a fresh server answers in its place
        wait_for(lambda: len(servers_of(runtime_dir)) == 2 and answers(sock),
                 "a fresh server")
        assert sock.stat().st_ino != inode
        p = run_cli(tmp_path, "/bin/true", extra=["--receipt", tmp_path / "s.json"], env=env)
        assert p.returncode == 0
        assert served_by(tmp_path / "s.json")["pid"] not in (None, old)
    finally:
        _end(old)  # SIGKILL ends a stopped process too


def test_a_server_whose_code_changed_serves_no_more(tmp_path: Path,
                                                    runtime_dir: Path) -> None:
    """An upgrade under a running server: the next run is in-process (same result), and
    the server ends; the run after it starts a fresh one."""
    import hcp_linux.protocol as protocol
    source = Path(protocol.__file__)
    if not os.access(source, os.W_OK):
        pytest.skip("the package is not ours to touch (an installed wheel, not root)")
    env = auto_env(runtime_dir)
    assert run_cli(tmp_path, "/bin/true", env=env).returncode == 0
    old = one_server(runtime_dir)
    st = source.stat()
    os.utime(source, ns=(st.st_atime_ns, st.st_mtime_ns + 1))  # what an upgrade changes
    try:
        p = run_cli(tmp_path, "/bin/echo", "ran", extra=["--receipt", tmp_path / "r.json"],
                    env=env)
    finally:
        os.utime(source, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert p.returncode == 0 and out(p) == "ran\n", show(p)
    assert served_by(tmp_path / "r.json") is None
    wait_for(lambda: not _alive(old), "the old server to exit")


def test_no_run_can_write_in_the_server_s_directory(tmp_path: Path) -> None:
    """XDG_RUNTIME_DIR inside the run's writable jail: the server's directory (there, or
    not yet) is the runtime's own; what the run does there is undone or refused. Control:
    the same script unconfined does replace the socket and plant a file."""
    jail = tmp_path / "jail"
    runtime = jail / "run-user"
    runtime.mkdir(parents=True, mode=0o700)
    env = auto_env(runtime)
    try:
        assert run_cli(jail, "/bin/true", env=env).returncode == 0
        pid = one_server(runtime)
        sock = runtime / "hcp-linux" / SOCK
        inode = sock.stat().st_ino
        script = (f"rm -f run-user/hcp-linux/{SOCK}; echo x > run-user/hcp-linux/planted;"
                  " mkdir run-user/hcp-linux/d")
        p = run_cli(jail, "/bin/sh", "-c", script, env=caller_env(
            {"XDG_RUNTIME_DIR": str(runtime)}), cwd="/")
        assert p.returncode != 0, show(p)
        assert sock.stat().st_ino == inode and answers(sock)
        assert sorted(os.listdir(runtime / "hcp-linux")) == sorted([LOCK, SOCK])
        # the control, on a copy: unconfined, the same script does it
        copy = tmp_path / "copy"
        (copy / "run-user" / "hcp-linux").mkdir(parents=True, mode=0o700)
        (copy / "run-user" / "hcp-linux" / LOCK).touch()
        bound = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        bound.bind(str(copy / "run-user" / "hcp-linux" / SOCK))
        bound.close()
        control = subprocess.run(["/bin/sh", "-c", script], cwd=copy, capture_output=True)
        assert control.returncode == 0, control
        assert sorted(os.listdir(copy / "run-user" / "hcp-linux")) == sorted(
            ["d", "planted", LOCK])
        assert servers_of(runtime) == [pid]
    finally:
        for pid in servers_of(runtime):
            _end(pid)


def test_a_server_started_while_a_run_holds_its_directory_keeps_its_socket(
        tmp_path: Path) -> None:
    """A run (not ``auto``) whose jail holds XDG_RUNTIME_DIR, with no server directory yet;
    while it runs, the user's server starts there (another caller's ``auto`` run). The
    run's sweep took the directory for its command's and removed it, socket and all: the
    server listened on nothing. Made before the run looks, it is kept: the server answers
    after the run. Control (cli_run_waiting): the run's own ``.envrc`` is removed."""
    jail = tmp_path / "jail"
    runtime = jail / "run-user"
    runtime.mkdir(parents=True, mode=0o700)
    env = caller_env({"XDG_RUNTIME_DIR": str(runtime)})
    env.pop("HCP_LINUX_SERVER", None)
    sock = runtime / "hcp-linux" / SOCK
    with ExitStack() as server:  # entered during the run, left (the server ended) after it
        with cli_run_waiting(jail, env):
            proc = server.enter_context(_auto_serve(runtime, "--idle-exit", "60"))
            assert answers(sock)
        # the run is over, its sweep done: the server's socket is where it was
        assert answers(sock) and proc.poll() is None


def test_an_auto_run_imports_what_a_served_run_does(tmp_path: Path, runtime_dir: Path) -> None:
    """The point of auto is the served client's start-up: finding the user's server adds
    no import the served run avoids (tests/test_serve.py pins those)."""
    from sandboxing import imported_by_run
    env = auto_env(runtime_dir)
    assert run_cli(tmp_path, "/bin/true", env=env).returncode == 0
    one_server(runtime_dir)
    done, imported = imported_by_run(tmp_path, "true", env=env)
    assert done.returncode == 0, show(done)
    assert {"hcp_linux.cli.serve_client", "hcp_linux.cli.auto_server"} <= set(imported)
    heavy = {"hcp_linux.sandbox", "hcp_linux.cli.cli", "dataclasses", "typing", "argparse",
             "subprocess", "threading", "hashlib", "_hashlib", "inspect", "json", "re", "enum"}
    assert not heavy & set(imported), sorted(heavy & set(imported))


def test_each_installation_has_a_server_of_its_own(monkeypatch,  # type: ignore
                                                    runtime_dir: Path) -> None:
    """Another virtual environment (another interpreter, another copy of the package)
    gets another socket: a run is never planned by another version's code."""
    from hcp_linux.cli import auto_server
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime_dir))
    here = auto_server.socket_path()
    assert os.path.dirname(here) == str(runtime_dir / "hcp-linux")
    monkeypatch.setattr(sys, "executable", sys.executable + "3")  # python3: the same one
    assert auto_server.socket_path() == here
    monkeypatch.setattr(sys, "prefix", "/srv/other-venv")
    assert auto_server.socket_path() != here
    assert auto_server.lock_path() != here


def _elsewhere(tmp_path: Path, runtime: Path) -> None:
    """An XDG_RUNTIME_DIR that is not the user's own: the server goes to $TMPDIR, and the
    runs after it find it there; nothing is made in ``runtime``."""
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    env = auto_env(runtime, TMPDIR=str(tmpdir))
    before = sorted(os.listdir(runtime)) if runtime.exists() else None
    try:
        p = run_cli(tmp_path, "/bin/echo", "ran", env=env)
        assert p.returncode == 0 and out(p) == "ran\n" and p.stderr == b"", show(p)
        where = tmpdir / f"hcp-linux-{os.geteuid()}"
        wait_for(lambda: answers(where / SOCK), "the server in $TMPDIR")
        p = run_cli(tmp_path, "/bin/true", extra=["--receipt", tmp_path / "r.json"], env=env)
        assert p.returncode == 0
        assert served_by(tmp_path / "r.json")["socket"] == str(where / SOCK)
        assert (sorted(os.listdir(runtime)) if runtime.exists() else None) == before
    finally:
        for pid in servers_of(runtime):
            _end(pid)


def test_a_runtime_dir_that_does_not_exist_sends_it_to_tmpdir(tmp_path: Path) -> None:
    _elsewhere(tmp_path, tmp_path / "no-such-dir")


@pytest.mark.skipif(not IS_ROOT, reason="a directory of another uid: root makes it")
def test_another_user_s_runtime_dir_is_left_alone(tmp_path: Path) -> None:
    """root under `su` keeps the user's XDG_RUNTIME_DIR: its server must not make a
    directory there, which would turn away the user's own runs."""
    theirs = tmp_path / "run-user-65534"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 65534, 65534)
    _elsewhere(tmp_path, theirs)


def test_the_installed_command_imports_no_wrapper_s_modules(tmp_path: Path,
                                                            runtime_dir: Path) -> None:
    """`hcp-linux` as installed (bin/hcp-linux, not a generated entry-point wrapper, which
    imports re: ~6 ms of a served run's ~25 in a plain install): a served run through it
    imports neither re nor anything of the engine (nor json: no receipt is written)."""
    command = os.path.join(os.path.dirname(sys.executable), "hcp-linux")
    if os.path.exists(command + "-py"):  # a wheel's: `hcp-linux` is the native client
        command += "-py"
    env = auto_env(runtime_dir)
    assert run_cli(tmp_path, "/bin/true", env=env).returncode == 0
    one_server(runtime_dir)
    baseline = subprocess.run([sys.executable, "-X", "importtime", "-c", "pass"],
                              capture_output=True, env=env, timeout=TIMEOUT)
    done = subprocess.run([sys.executable, "-X", "importtime", command, "run", "--jail",
                           str(tmp_path), "--", "/bin/true"], capture_output=True, env=env,
                          timeout=TIMEOUT, cwd="/", stdin=subprocess.DEVNULL)
    assert done.returncode == 0, show(done)

    def names(p: subprocess.CompletedProcess) -> set[str]:
        return {line.rsplit("|", 1)[1].strip() for line in p.stderr.decode().splitlines()
                if line.startswith("import time:") and line.count("|") == 2}
    added = names(done) - names(baseline)  # the interpreter's start-up is not its doing
    heavy = {"re", "enum", "hcp_linux.sandbox", "hcp_linux.cli.cli", "argparse", "typing",
             "dataclasses", "subprocess", "json"}
    assert {"hcp_linux.cli.launch", "hcp_linux.cli.serve_client"} <= added  # served
    assert not heavy & added, sorted(heavy & added)


def test_the_fallback_directory_follows_the_temp_variables(monkeypatch,  # type: ignore
                                                           tmp_path: Path) -> None:
    """No runtime directory of the user's: TMPDIR, TEMP or TMP, the first set (as Python's
    tempfile and the jails read them), when absolute; else /tmp."""
    from hcp_linux.runtime_files import server_directory
    uid = os.geteuid()
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    for name in ("TMPDIR", "TEMP", "TMP"):
        monkeypatch.delenv(name, raising=False)
    assert server_directory() == f"/tmp/hcp-linux-{uid}"
    monkeypatch.setenv("TMP", str(tmp_path / "c"))
    monkeypatch.setenv("TEMP", str(tmp_path / "b"))
    assert server_directory() == str(tmp_path / "b" / f"hcp-linux-{uid}")
    monkeypatch.setenv("TMPDIR", "relative/dir")  # set, but not absolute: /tmp
    assert server_directory() == f"/tmp/hcp-linux-{uid}"
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))  # the user's own: it wins
    assert server_directory() == str(tmp_path / "hcp-linux")


def test_forget_unlinks_only_under_a_starting_server_s_lock(runtime_dir: Path,
                                                           monkeypatch) -> None:  # type: ignore
    """A client that gave up on a stuck server unlinks its socket under the lock a
    starting server holds until it listens: while that lock is held it unlinks nothing (a
    server may be binding there), and a socket bound while it waited is left. Before, a
    server that bound between the client's look and its unlink lost its socket and idled
    out unreached. Control: with the lock free, the stuck server's socket goes."""
    import fcntl
    import threading

    from hcp_linux.cli import auto_server
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime_dir))
    monkeypatch.setattr(auto_server, "FORGET_WAIT", 0.2, raising=False)
    d = runtime_dir / "hcp-linux"
    d.mkdir(mode=0o700)
    sock = d / SOCK
    listeners = []

    def bind() -> tuple[int, int]:  # a server that accepts and never answers
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(str(sock))
        s.listen()
        listeners.append(s)
        st = sock.stat()
        return st.st_dev, st.st_ino

    lock = os.open(d / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        stuck = bind()
        fcntl.flock(lock, fcntl.LOCK_EX)  # a server starting
        auto_server.forget(str(sock), stuck)
        assert (sock.stat().st_dev, sock.stat().st_ino) == stuck, "unlinked under the lock"
        monkeypatch.setattr(auto_server, "FORGET_WAIT", TIMEOUT, raising=False)
        waiting = threading.Thread(target=auto_server.forget, args=(str(sock), stuck))
        waiting.start()
        time.sleep(0.1)
        sock.unlink()  # the starting server found the stuck one gone, and binds
        fresh = bind()
        fcntl.flock(lock, fcntl.LOCK_UN)  # it listens
        waiting.join(TIMEOUT)
        assert not waiting.is_alive()
        assert (sock.stat().st_dev, sock.stat().st_ino) == fresh, "a fresh server's socket went"
        # control: the lock free, the socket of a server that does not answer goes
        auto_server.forget(str(sock), fresh)
        assert not sock.exists()
    finally:
        os.close(lock)
        for s in listeners:
            s.close()


#: In a mount namespace of its own, as a subreaper (each process the run leaves behind
#: becomes its child): a tmpfs of 8 inodes as XDG_RUNTIME_DIR, filled with empty files when
#: argv[2] is "full", then one auto run. Prints the run's status and how many servers it
#: left (alive or exited: a Python, where a spare the run made is hcp-exec), then ends
#: everything it left by pid.
_FULL_TMPFS = r"""
import ctypes, os, signal, subprocess, sys
mnt, fill, cli, jail = sys.argv[1:5]
assert ctypes.CDLL(None).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
subprocess.run(["mount", "--make-rprivate", "/"], check=True)
subprocess.run(["mount", "-t", "tmpfs", "-o", "nr_inodes=8,size=1m,mode=0700", "tmpfs", mnt],
               check=True)
i = 0
while fill == "full":
    try:
        open(os.path.join(mnt, "f%d" % i), "wb").close()
    except OSError:
        break
    i += 1
env = dict(os.environ, HCP_LINUX_SERVER="auto", XDG_RUNTIME_DIR=mnt)
p = subprocess.run([cli, "run", "--no-config", "--jail", jail, "--", "/bin/true"], env=env,
                   cwd="/")
left, servers = [], 0
for name in os.listdir("/proc"):
    try:
        with open("/proc/%s/stat" % name, "rb") as f:
            if name.isdigit() and int(f.read().rsplit(b")", 1)[1].split()[1]) == os.getpid():
                left.append(int(name))
                with open("/proc/%s/comm" % name) as c:
                    servers += c.read().startswith("python")
    except OSError:
        pass
print(p.returncode, servers)
for pid in left:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    os.waitpid(pid, 0)
"""


@pytest.mark.skipif(not IS_ROOT, reason="mounts a tmpfs (in a mount namespace of its own)")
def test_no_server_is_started_where_it_could_not_make_its_socket(tmp_path: Path) -> None:
    """A runtime dir with no inode left: an auto run runs in-process and starts no server
    (one would fail to make its socket, and every run would start another). Control: the
    same tmpfs with room, and the run starts one."""
    mnt, jail = tmp_path / "mnt", tmp_path / "jail"
    mnt.mkdir()
    jail.mkdir()
    script = tmp_path / "full.py"
    script.write_text(_FULL_TMPFS)
    cli = os.path.join(os.path.dirname(sys.executable), "hcp-linux")
    results = {}
    for fill in ("full", "room"):
        p = subprocess.run(["unshare", "--mount", sys.executable, str(script), str(mnt), fill,
                            cli, str(jail)], capture_output=True, timeout=TIMEOUT * 2)
        assert p.returncode == 0, show(p)
        results[fill] = p.stdout.split()
    assert results == {"full": [b"0", b"0"], "room": [b"0", b"1"]}
