"""The native `hcp-linux` (hcp_linux/native/hcp_client.c): a served run with no Python (issue 35).

What must hold: a served run through it starts no Python (its fallback, `hcp-linux-py`, is
not run); everything it does not do itself goes to that Python command, with the same result
(tests/test_serve.py runs every served test with both clients); the run's end (the protected
names' sweep) happens whether the server that planned the run does it or has gone; the
server sweeps only what it planned, never what a request names; `HCP_LINUX_SERVER=auto` finds
the user's server through the link the Python command leaves; a handover that is not one is
refused in one line.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

import sandboxing
from sandboxing import (TIMEOUT, caller_env, default_stop_signals, jail,  # noqa: F401
                        kill_by_pid, out, process_tree, show, wait_for)
from test_auto_server import answers
from test_serve import Server, start_server, stop_server


@pytest.fixture(autouse=True)
def default_executor(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A server plans for the native executor only (`--executor ctypes` runs in-process)."""
    monkeypatch.setattr(sandboxing, "EXECUTOR_ARGS", [])


@pytest.fixture
def command(tmp_path: Path) -> Path:
    """The native client in a directory of its own, beside a `hcp-linux-py` that notes each
    time it runs (in ``python-ran``), then runs the Python command."""
    built = sandboxing.native_client()
    if built is None:
        pytest.skip("the native client is not built (make native)")
    where = tmp_path / "bin"
    where.mkdir()
    where.chmod(0o755)
    shutil.copy2(built, where / "hcp-linux")
    python = where / "hcp-linux-py"
    python.write_text(f"#!{sys.executable}\n"
                      f"import sys\n"
                      f"with open({str(where / 'python-ran')!r}, 'a') as f:\n"
                      f"    f.write(' '.join(sys.argv[1:]) + '\\n')\n"
                      f"from hcp_linux.cli.launch import entry\n"
                      f"sys.exit(entry())\n")
    python.chmod(0o755)
    return where / "hcp-linux"


def python_ran(command: Path) -> list[str]:
    try:
        return (command.parent / "python-ran").read_text().splitlines()
    except FileNotFoundError:
        return []


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    (tmp_path / "server").mkdir()
    s = start_server(tmp_path / "server")
    yield s
    stop_server(s)


def run(command: Path, jail: Path, *cmd: str, extra: tuple[str, ...] = (),
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(command), "run", "--jail", str(jail), *extra, "--", *cmd],
                          env=env, capture_output=True, timeout=TIMEOUT, cwd="/",
                          stdin=subprocess.DEVNULL)


def test_a_served_run_starts_no_python(command: Path, server: Server, jail: Path,
                                       tmp_path: Path) -> None:
    """The plan from the server, hcp-exec started here, the status back: the Python
    command never runs. Control: a run with a receipt (the Python command's to write) runs
    it, and so does any run without a server."""
    p = run(command, jail, "sh", "-c", "echo served; exit 3", env=server.env())
    assert p.returncode == 3 and out(p) == "served\n" and p.stderr == b"", show(p)
    assert python_ran(command) == []
    receipt = tmp_path / "r.json"
    p = run(command, jail, "true", extra=("--receipt", str(receipt)), env=server.env())
    assert p.returncode == 0 and receipt.exists(), show(p)
    assert len(python_ran(command)) == 1
    p = run(command, jail, "true", env=caller_env())
    assert p.returncode == 0 and len(python_ran(command)) == 2, show(p)


def test_a_refusal_comes_from_the_server_as_the_cli_says_it(command: Path, server: Server,
                                                            jail: Path) -> None:
    p = run(command, jail, "true", extra=("--bogus",), env=server.env())
    plain = sandboxing.run_cli(jail, "true", extra=["--bogus"])
    assert (p.returncode, p.stderr) == (plain.returncode, plain.stderr), show(p)
    assert p.returncode == 2 and python_ran(command) == []


@pytest.mark.parametrize("server_there", [True, False], ids=["server", "server-gone"])
def test_the_run_s_end_sweeps_what_the_command_planted(command: Path, server: Server,
                                                       jail: Path, server_there: bool) -> None:
    """A file planted at a missing protected name (.envrc: direnv runs it in the host's
    shell) is removed once the run is over: by the server that planned the run, or, when it
    has gone meanwhile, by the Python command the client hands the end to. Control: the
    same plant by an unconfined process stays."""
    gate = jail / "gate"
    script = f"echo planted > .envrc; while [ ! -e {gate.name} ]; do sleep 0.05; done; exit 5"
    client = subprocess.Popen([str(command), "run", "--jail", str(jail), "--", "sh", "-c",
                               script], env=server.env(), cwd="/", stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: (jail / ".envrc").exists(), "the plant")
        if not server_there:
            stop_server(server)
        gate.touch()
        assert client.wait(timeout=TIMEOUT) == 5, client.stderr.read()
    finally:
        kill_by_pid(client)
        client.stdout.close()
        client.stderr.close()
    assert not (jail / ".envrc").exists(), "the plant outlived the run"
    assert len(python_ran(command)) == (0 if server_there else 1)
    subprocess.run(["sh", "-c", "echo planted > .envrc"], cwd=jail, check=True)
    assert (jail / ".envrc").exists()  # control: the same plant, unconfined


def _ask(server: Server, *items: bytes) -> list[bytes]:
    from hcp_linux.cli.serve_wire import encode, recv_frame
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(TIMEOUT)
        s.connect(str(server.path))
        s.sendall(encode(list(items)))
        return recv_frame(s)


def test_a_plan_handed_to_python_leaves_no_record_of_its_sweep(command: Path, server: Server,
                                                                jail: Path, tmp_path: Path
                                                                ) -> None:
    """The server writes a record of each plan's sweep, naming the client, before the client
    can start it (hcp_linux.policy.protected.pending). A plan the native client does not
    start (a receipt to write: the Python command's) has that record removed: left, once
    the client has exited a later run takes it for a run whose runtime died and does its
    sweep, moving aside what the user made since: here a `git init`'s config and hooks.
    Control: the repository made after the run is there before the next run."""
    from hcp_linux.runtime_files import pending_directory
    where = pending_directory()
    assert where is not None
    receipt = tmp_path / "r.json"
    client = subprocess.Popen([str(command), "run", "--jail", str(jail), "--receipt",
                               str(receipt), "--", "true"], env=server.env(), cwd="/",
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
    stdout, stderr = client.communicate(timeout=TIMEOUT)
    assert client.returncode == 0 and receipt.exists(), stderr
    assert json.loads(receipt.read_text()).get("served_by"), "not served: nothing shown"
    assert len(python_ran(command)) == 1  # the native client handed it over
    left = [n for n in os.listdir(where) if n.startswith(f"{client.pid}-")]
    assert left == [], left
    subprocess.run(["git", "init", "-q", "sub"], cwd=jail, check=True)
    assert (jail / "sub/.git/config").is_file()  # control: the user's repository is there
    p = run(command, jail, "true", env=server.env())
    assert p.returncode == 0, show(p)
    names = sorted(os.listdir(jail / "sub/.git"))
    assert "config" in names and "hooks" in names, names
    assert not [n for n in names if ".hcp-linux-" in n], names


def test_the_server_sweeps_only_what_it_planned(server: Server, jail: Path) -> None:
    """An end request names its run by the token the plan came with: one the server did not
    give, or gave and was used, sweeps nothing. Control: the file an unplanned sweep would
    have removed is still there."""
    from hcp_linux.cli.serve_wire import PROTOCOL
    (jail / ".envrc").write_text("the user's own\n")
    for token in (b"0" * 32, b"", os.urandom(16).hex().encode()):
        assert _ask(server, PROTOCOL, b"end", token, b"0")[0] == b"fallback"
    assert (jail / ".envrc").read_text() == "the user's own\n"


def test_auto_finds_the_server_through_the_python_command_s_link(command: Path, jail: Path,
                                                                  tmp_path: Path) -> None:
    """`auto` names the user's server by a checksum the client cannot compute: the first
    runs fall back to the Python command, which starts the server and leaves the link;
    the runs after it start no Python."""
    from test_auto_server import servers_of
    runtime = tmp_path / "run-user"
    runtime.mkdir(mode=0o700)
    env = caller_env({"HCP_LINUX_SERVER": "auto", "XDG_RUNTIME_DIR": str(runtime)})
    try:
        assert run(command, jail, "true", env=env).returncode == 0
        assert len(python_ran(command)) == 1
        links = [n for n in os.listdir(runtime / "hcp-linux") if n.startswith("client-")]
        assert len(links) == 1, os.listdir(runtime / "hcp-linux")
        sock = runtime / "hcp-linux" / os.readlink(runtime / "hcp-linux" / links[0])
        wait_for(lambda: answers(sock), "the server to listen")
        for _ in range(3):
            p = run(command, jail, "sh", "-c", "echo hi", env=env)
            assert p.returncode == 0 and out(p) == "hi\n", show(p)
        assert len(python_ran(command)) == 1
    finally:
        for pid in servers_of(runtime):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("case", ["not-a-memfd", "not-a-number", "not-our-child"])
def test_a_handover_that_is_not_one_is_refused(tmp_path: Path, case: str) -> None:
    """HCP_LINUX_FINISH names the native client's memfd, and its pid is our child: anything
    else is one line, exit 125, and no process is signalled. Control: the process named
    lives on."""
    victim = subprocess.Popen(["sleep", "30"])
    try:
        r, w = os.pipe()
        if case == "not-our-child":
            fd = os.memfd_create("hcp-finish", 0)
            from hcp_linux.cli.serve_wire import encode
            body = encode([b"finish 2", b"run", b"%d" % victim.pid, b"%d" % r, b"-1", b"",
                           b"15", b"-1", encode([])[4:], encode([b"0"])[4:], b""])
            os.write(fd, body)
        else:
            fd = r
        value = "x" if case == "not-a-number" else str(fd)
        p = subprocess.run([sys.executable, "-m", "hcp_linux", "run", "--", "true"],
                           env=caller_env({"HCP_LINUX_FINISH": value}), capture_output=True,
                           timeout=TIMEOUT, pass_fds=(fd,) if case != "not-a-number" else (),
                           stdin=subprocess.DEVNULL, cwd="/")
        assert p.returncode == 125, show(p)
        assert p.stderr.decode().startswith("error: sandbox: HCP_LINUX_FINISH: "), show(p)
        assert p.stderr.decode().count("\n") == 1, show(p)
        assert victim.poll() is None  # control: it lives
    finally:
        kill_by_pid(victim)


def test_a_stopped_server_is_waited_for_once(command: Path, jail: Path, tmp_path: Path) -> None:
    """A user's server that accepts and never answers (stopped): the native client waits
    for it, then tells the Python command (which therefore does not wait a second time: a
    matter of time, not asserted here); that socket is forgotten, the run goes on
    in-process, and it starts a fresh server. Control: before the stop, the same run is
    served with no Python."""
    from test_auto_server import servers_of
    runtime = tmp_path / "run-user"
    runtime.mkdir(mode=0o700)
    env = caller_env({"HCP_LINUX_SERVER": "auto", "XDG_RUNTIME_DIR": str(runtime)})
    stopped = None
    try:
        assert run(command, jail, "true", env=env).returncode == 0
        where = runtime / "hcp-linux"
        link = next(n for n in os.listdir(where) if n.startswith("client-"))
        sock = where / os.readlink(where / link)
        wait_for(lambda: answers(sock), "the server to listen")
        assert run(command, jail, "true", env=env).returncode == 0
        assert len(python_ran(command)) == 1  # control: served by it, no Python
        (stopped,) = servers_of(runtime)
        before = sock.stat().st_ino
        os.kill(stopped, signal.SIGSTOP)
        p = run(command, jail, "sh", "-c", "echo ran", env=env)
        assert p.returncode == 0 and out(p) == "ran\n" and p.stderr == b"", show(p)
        assert len(python_ran(command)) == 2
        # the stopped one's socket is gone; the run started another, which binds anew
        wait_for(lambda: len(servers_of(runtime)) == 2 and answers(sock)
                 and sock.stat().st_ino != before, "a fresh server")
    finally:
        for pid in servers_of(runtime):
            os.kill(pid, signal.SIGKILL)
        if stopped is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(stopped, signal.SIGCONT)


#: Covers /proc with an empty tmpfs in a mount namespace of the test's, then runs the rest.
NO_PROC = 'mount -t tmpfs none /proc || exit 99; test -e /proc/self && exit 98; exec "$@"'


@pytest.mark.parametrize("how", ["its path", "a link's path", "a link on PATH"])
def test_without_proc_the_python_command_is_found_through_argv0(command: Path,
                                                                tmp_path: Path,
                                                                how: str) -> None:
    """Where no /proc is mounted (a chroot, a container that mounts none), the program
    finds `hcp-linux-py` through argv[0] as the shell found it (a path, or the first of that
    name on PATH), links resolved, as /proc/self/exe would have found it. Without
    `hcp-linux-py` beside it, one line, exit 127."""
    unshare = ["unshare", "-m"] if os.geteuid() == 0 else ["unshare", "-Urm"]
    control = subprocess.run([*unshare, "sh", "-c", NO_PROC, "sh", "true"],
                             capture_output=True, timeout=TIMEOUT)
    if control.returncode != 0:
        pytest.skip(f"cannot cover /proc here: {control.returncode} {control.stderr!r}")
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "hcp-linux").symlink_to(command)
    argv0 = {"its path": str(command), "a link's path": str(other / "hcp-linux"),
             "a link on PATH": "hcp-linux"}[how]
    env = dict(os.environ, PATH=f"{tmp_path / 'empty'}:{other}:/usr/bin:/bin")

    def version() -> subprocess.CompletedProcess:
        return subprocess.run([*unshare, "sh", "-c", NO_PROC, "sh", argv0, "--version"],
                              env=env, capture_output=True, timeout=TIMEOUT, cwd="/",
                              stdin=subprocess.DEVNULL)

    p = version()
    assert p.returncode == 0 and p.stdout.startswith(b"hcp-linux "), show(p)
    assert python_ran(command) == ["--version"]
    (command.parent / "hcp-linux-py").unlink()  # the control: nothing to find beside it
    p = version()
    assert p.returncode == 127 and p.stdout == b"", show(p)
    assert p.stderr.decode().count("\n") == 1 and "hcp-linux-py" in p.stderr.decode(), show(p)


def _c_defines() -> dict[str, object]:
    """hcp_client.c's #defines of strings and numbers, as the C compiler reads them
    (adjacent string literals joined, backslash-newline continued)."""
    import ast
    import re
    from hcp_linux.native.selection import CLIENT_SOURCE  # the package's: installed too
    source = Path(CLIENT_SOURCE).read_text().replace("\\\n", " ")
    out: dict[str, object] = {}
    for name, value in re.findall(r"^#define (\w+)[ \t]+(.+)$", source, re.M):
        value = value.strip()
        if value.startswith('"'):
            out[name] = "".join(ast.literal_eval(s) for s in re.findall(r'"(?:[^"\\]|\\.)*"',
                                                                        value))
        elif re.fullmatch(r"0x[0-9a-f]+u?|\d+", value):
            out[name] = int(value.rstrip("u"), 0)
    return out


def test_the_native_client_says_what_the_python_command_says() -> None:
    """The constants hcp_client.c copies from Python (it is built without the package's
    generated header): the serve protocol, the handover, the report's VIEW_LOST bit and the
    lines of a run that ended so. A change on one side only fails here, not in a user's run."""
    from hcp_linux.cli.launch import CLIENT_ENV
    from hcp_linux.cli.serve_client import FINISH_ENV, FINISH_VERSION
    from hcp_linux.cli.serve_wire import PROTOCOL
    from hcp_linux.protocol import VIEW_LOST
    from hcp_linux.receipt_keys import END_LINES
    c = _c_defines()
    assert (c["PROTOCOL"], c["FINISH_VERSION"]) == (PROTOCOL.decode(), FINISH_VERSION.decode())
    assert (c["CLIENT_ENV"], c["FINISH_ENV"]) == (CLIENT_ENV, FINISH_ENV)
    assert c["VIEW_LOST"] == VIEW_LOST
    assert {"lost": c["END_LINE_LOST"], "view-lost": c["END_LINE_VIEW_LOST"]} == END_LINES


def _stopped_in_setup_poll(pid: int) -> bool | None:
    """Whether the stopped client ``pid`` waits in the setup's poll (its timeout, the third
    argument, is the setup's bound in ms; the run's poll has none or the run's timeout):
    None where /proc/PID/syscall cannot tell (not x86_64's poll)."""
    fields = Path(f"/proc/{pid}/syscall").read_text().split()  # "running" while it runs
    if not fields or not fields[0].isdigit() or int(fields[0]) != 7:  # x86_64's poll
        return None
    return 0 < int(fields[3], 16) <= 30000


@pytest.mark.parametrize("how", ["native served", "python served"])
def test_a_signal_during_setup_still_sweeps_what_the_exec_planted(
        jail: Path, tmp_path: Path, how: str) -> None:
    """A served run's client gets ^C while it waits for the exec and hcp-exec goes on: the
    command is exec'd and plants ``.envrc`` before the kill (the native client's Python
    command, handed the run as "setup", takes ~50 ms to start; the Python client kills at
    once, but the exec may come first). That run did reach its command: what it planted is
    swept and the sweep's record removed, and the client ends by the signal. (Before, the
    native client's "setup" was taken for "nothing ran": the record was removed and the
    plant stayed for the host's direnv; the Python client left the record to a later run.)
    The client is stopped while hcp-exec sets up (found in the setup's poll), the plant
    seen on the host, then SIGINT and SIGCONT."""
    import platform
    import time
    if platform.machine() != "x86_64":
        pytest.skip("reads poll's arguments as x86_64's /proc/PID/syscall gives them")
    from hcp_linux.conformance.observers import proc_children, proc_state, processes_with
    from hcp_linux.runtime_files import pending_directory
    from test_caller_state import way
    needle = f"{time.monotonic_ns() % 10**9}.75"
    where = pending_directory()
    caught = False
    with way(how, tmp_path) as (cli, env):
        for _ in range(20):  # until the client is caught in its setup's wait
            client = subprocess.Popen(
                [*cli, "run", "--jail", str(jail), "--", "sh", "-c",
                 f"echo planted > .envrc; exec sleep {needle}"],
                env=env, cwd="/", stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, preexec_fn=default_stop_signals)
            try:
                deadline = time.monotonic() + TIMEOUT
                while not proc_children(client.pid) and client.poll() is None:
                    assert time.monotonic() < deadline, "hcp-exec never started"
                with contextlib.suppress(OSError):  # until it waits in a poll, or is past
                    while client.poll() is None and time.monotonic() < deadline \
                            and _stopped_in_setup_poll(client.pid) is None:
                        pass
                os.kill(client.pid, signal.SIGSTOP)
                wait_for(lambda: proc_state(client.pid) == "T", "the client to stop")
                caught = bool(_stopped_in_setup_poll(client.pid))
                if caught:
                    wait_for(lambda: (jail / ".envrc").exists(), "the command's plant")
                os.kill(client.pid, signal.SIGINT)  # caught or not, the run ends by ^C
                os.kill(client.pid, signal.SIGCONT)
                try:
                    _, stderr = client.communicate(timeout=TIMEOUT)
                except subprocess.TimeoutExpired:
                    raise AssertionError(f"the client did not end on SIGINT (caught in its "
                                         f"setup: {caught}):\n{process_tree(client.pid)}"
                                         ) from None
            finally:
                kill_by_pid(client)
                client.stdout.close()
                client.stderr.close()
            if caught:
                break
            (jail / ".envrc").unlink(missing_ok=True)  # a run past its setup: not the case
        else:
            pytest.skip("the client was never caught in its setup's wait (20 tries)")
    assert client.returncode in (-signal.SIGINT, 128 + signal.SIGINT), stderr
    wait_for(lambda: not processes_with(needle), "the run's command to be gone")
    assert not (jail / ".envrc").exists(), "what the exec'd command planted was not swept"
    assert where is None or not [n for n in os.listdir(where)
                                 if n.startswith(f"{client.pid}-")], "its record was left"


# ---- the spare: hcp-exec started while the server compiles the confinement ----------------

def _pid1_cmdline(p: subprocess.CompletedProcess) -> list[str]:
    """The run's pid 1 as its command `tr '\\0' ' ' < /proc/1/cmdline` printed it."""
    return out(p).split()


PID1 = ("sh", "-c", "tr '\\0' ' ' < /proc/1/cmdline")


def test_a_native_served_run_is_set_up_by_a_spare(command: Path, server: Server,
                                                  jail: Path) -> None:
    """The native client starts hcp-exec as a spare when the server says the command is
    allowed, and hands it the plan: the run's pid 1 is that spare. Control: the Python
    client, served by the same server, starts hcp-exec with the plan."""
    p = run(command, jail, *PID1, env=server.env())
    assert p.returncode == 0, show(p)
    assert _pid1_cmdline(p)[:2] == ["hcp-exec", "--spare"], show(p)
    assert python_ran(command) == []
    python = subprocess.run([str(command.parent / "hcp-linux-py"), "run", "--jail", str(jail),
                             "--", *PID1], env=server.env(), capture_output=True,
                            timeout=TIMEOUT, cwd="/", stdin=subprocess.DEVNULL)
    assert python.returncode == 0 and "--spare" not in _pid1_cmdline(python), show(python)


@contextlib.contextmanager
def _traced_server(tmp_path: Path, monkeypatch, before_plan=None,  # type: ignore
                   rewrite=None) -> Iterator[tuple[dict[str, str], Path, list[bytes]]]:
    """A real server, in a thread of this process, whose hcp-exec is a script that notes
    each start (its arguments, a line in the log) and execs the real one; ``before_plan``
    runs as a plan is about to be sent, ``rewrite`` may change the plan's frame. Yields the
    clients' environment, the log and the kind of each frame the server sent."""
    import threading

    from hcp_linux import native
    from hcp_linux.cli import serve
    real = native.binary()
    assert real is not None
    log = tmp_path / "hcp-exec-started"
    wrapper = tmp_path / "hcp-exec"
    wrapper.write_text(f'#!/bin/sh\necho "$*" >> {log}\nexec {real} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setattr(native, "binary", lambda: str(wrapper))
    encode = serve.encode

    sent: list[bytes] = []

    def traced(items):  # type: ignore[no-untyped-def]
        sent.append(items[0])
        if items[:1] == [b"plan"]:
            if before_plan is not None:
                before_plan()
            if rewrite is not None:
                items = rewrite(items)
        return encode(items)
    monkeypatch.setattr(serve, "encode", traced)
    path = tmp_path / "traced.sock"
    srv = serve._Server(str(path))
    thread = threading.Thread(target=srv.loop, daemon=True)
    thread.start()
    try:
        yield caller_env({"HCP_LINUX_SERVER": str(path)}), log, sent
    finally:
        srv.stop()
        thread.join(TIMEOUT)
        srv.close()


def _started(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def _spares_of(client_pid: int) -> list[int]:
    """The spares ``client_pid`` started, once exec'd (hcp-exec's own argv: ``--spare``)."""
    from hcp_linux.conformance.observers import proc_children
    found = []
    for pid in proc_children(client_pid):
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[1:2] == [b"--spare"]:
                found.append(pid)
    return found


#: Runs a command as a child subreaper, and says what of its processes it left: a process
#: its parent did not reap before it exited is reparented to us at that exit (before the
#: exit is reported), so whatever the client leaves, alive or dead, is listed; then reaped.
_LEFT_BEHIND = r"""
import ctypes, json, os, subprocess, sys
if ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) != 0:  # PR_SET_CHILD_SUBREAPER
    sys.exit("prctl: %s" % os.strerror(ctypes.get_errno()))
p = subprocess.run(sys.argv[1:], capture_output=True, stdin=subprocess.DEVNULL)
me = os.getpid()
left = []
for tid in os.listdir("/proc/%d/task" % me):
    with open("/proc/%d/task/%s/children" % (me, tid)) as f:
        left += [int(pid) for pid in f.read().split()]
for pid in left:
    os.kill(pid, 9)
    os.waitpid(pid, 0)
print(json.dumps([p.returncode, p.stdout.decode(), p.stderr.decode(), len(left)]))
"""


def _run_left(argv: list[str], env: dict[str, str]) -> tuple[int, str, str, int]:
    """``argv``'s exit status, stdout and stderr, and how many processes it left behind."""
    p = subprocess.run([sys.executable, "-c", _LEFT_BEHIND, *argv], env=env,
                       capture_output=True, timeout=TIMEOUT, cwd="/")
    assert p.returncode == 0, show(p)
    rc, stdout, stderr, left = json.loads(p.stdout)
    return rc, stdout, stderr, left


@pytest.mark.parametrize("args", [("--bogus", "--", "true"), ("--", "/nonexistent-bin"),
                                  ("--allow-bin", "ls", "--", "cat")],
                         ids=["usage", "no-bin", "not-allowlisted"])
def test_a_refused_run_starts_no_hcp_exec(command: Path, jail: Path, tmp_path: Path,
                                          monkeypatch, args: tuple[str, ...]) -> None:
    """A refusal (bad input, a command not allowed) is answered before the server says a
    spare may start: nothing is started. Control: an allowed run starts one, the spare."""
    with _traced_server(tmp_path, monkeypatch) as (env, log, sent):
        refused = subprocess.run([str(command), "run", "--jail", str(jail), *args], env=env,
                                 capture_output=True, timeout=TIMEOUT, cwd="/",
                                 stdin=subprocess.DEVNULL)
        plain = sandboxing.run_cli(jail, *args[args.index("--") + 1:],
                                   extra=list(args[:args.index("--")]))
        assert (refused.returncode, refused.stderr) == (plain.returncode, plain.stderr)
        assert refused.returncode != 0 and _started(log) == [], show(refused)
        assert b"spare" not in sent
        allowed = run(command, jail, "true", env=env)
        assert allowed.returncode == 0, show(allowed)
    assert [line.split()[0] for line in _started(log)] == ["--spare"]


def test_a_spare_gone_before_the_plan_is_replaced(command: Path, jail: Path, tmp_path: Path,
                                                  monkeypatch) -> None:
    """The spare dies (killed, with its pid 1) before the plan is sent: the hand-over
    fails, and the client starts hcp-exec with the plan, as without a spare. The run is
    the same."""
    import time

    from hcp_linux.conformance.observers import proc_children, proc_state
    clients: list[int] = []

    def kill_the_spare() -> None:
        deadline = time.monotonic() + TIMEOUT
        while True:  # exec'd (its argv the real one's) and its pid 1 forked
            spares = _spares_of(clients[0])
            if spares and proc_children(spares[0]):
                break
            assert time.monotonic() < deadline, "no spare was started"
            time.sleep(0.002)
        doomed = [spares[0], *proc_children(spares[0])]
        for pid in doomed:
            os.kill(pid, signal.SIGKILL)
        wait_for(lambda: all(proc_state(pid) in (None, "Z") for pid in doomed),
                 "the spare to die")

    with _traced_server(tmp_path, monkeypatch, before_plan=kill_the_spare) as (env, log, sent):
        client = subprocess.Popen([str(command), "run", "--jail", str(jail), "--", *PID1],
                                  env=env, cwd="/", stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        clients.append(client.pid)
        try:
            stdout, stderr = client.communicate(timeout=TIMEOUT)
        finally:
            kill_by_pid(client)
    assert client.returncode == 0, stderr
    pid1 = stdout.decode().split()
    assert os.path.basename(pid1[0]).startswith("hcp-exec") and "--spare" not in pid1, stdout
    assert [line.split()[0] == "--spare" for line in _started(log)] == [True, False]
    assert python_ran(command) == []


def test_a_plan_the_spare_does_not_take_goes_to_a_fresh_hcp_exec(
        command: Path, jail: Path, tmp_path: Path, monkeypatch) -> None:
    """The server says the spare does not take the plan (a plan of other namespaces than it
    was started for): the client ends and reaps it, and starts hcp-exec with the plan."""
    def untaken(items: list[bytes]) -> list[bytes]:
        assert items[-1] == b"1"  # control: this plan was the spare's
        return [*items[:-1], b""]

    with _traced_server(tmp_path, monkeypatch, rewrite=untaken) as (env, log, sent):
        rc, stdout, stderr, left = _run_left(
            [str(command), "run", "--jail", str(jail), "--", *PID1], env)
    assert rc == 0, stderr
    pid1 = stdout.split()
    assert os.path.basename(pid1[0]).startswith("hcp-exec") and "--spare" not in pid1, stdout
    assert [line.split()[0] == "--spare" for line in _started(log)] == [True, False]
    assert left == 0, "the unused spare was not reaped by its client"


def test_a_refusal_after_the_spare_started_leaves_no_spare(command: Path, jail: Path,
                                                           tmp_path: Path, monkeypatch) -> None:
    """A refusal found once the command was allowed (here, the confinement's compiling
    fails) comes back as the CLI says it; the spare started meanwhile is ended and reaped
    by the client before it exits: nothing of the run is left."""
    from hcp_linux.errors import PolicyError
    from hcp_linux.plan import plan as plan_module

    def refuse(*_args: object) -> None:
        raise PolicyError("a refusal found late")
    monkeypatch.setattr(plan_module, "shared_confinement", refuse)
    with _traced_server(tmp_path, monkeypatch) as (env, log, sent):
        rc, _, stderr, left = _run_left(
            [str(command), "run", "--jail", str(jail), "--", "true"], env)
    assert (rc, stderr) == (PolicyError.exit_code, "error: sandbox: a refusal found late\n")
    assert sent == [b"spare", b"exit"]  # the spare, killed at once, may not have noted it
    assert left == 0, "the spare was not reaped by its refused client"


def test_a_client_killed_while_its_spare_waits_leaves_nothing(command: Path, jail: Path,
                                                             tmp_path: Path,
                                                             monkeypatch) -> None:
    """The client is killed (SIGKILL: nothing of it runs after) once its spare is up and
    before the plan comes: the spare's socket closes with the client, and the spare and its
    pid 1 exit; nothing of the run is left, and nothing ran."""
    import time

    from hcp_linux.conformance.observers import proc_children, proc_state
    clients: list[subprocess.Popen] = []
    doomed: list[int] = []

    def kill_the_client() -> None:
        client = clients[0]
        deadline = time.monotonic() + TIMEOUT
        while True:  # the spare exec'd and its pid 1 forked
            spares = _spares_of(client.pid)
            if spares and proc_children(spares[0]):
                break
            assert time.monotonic() < deadline, "no spare was started"
            time.sleep(0.002)
        doomed.extend([spares[0], *proc_children(spares[0])])
        client.kill()
        client.wait()

    with _traced_server(tmp_path, monkeypatch, before_plan=kill_the_client) as (env, _, _):
        client = subprocess.Popen([str(command), "run", "--jail", str(jail), "--", "touch",
                                   "ran"], env=env, cwd="/", stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        clients.append(client)
        try:
            client.wait(timeout=TIMEOUT)
        finally:
            kill_by_pid(client)
    assert client.returncode == -signal.SIGKILL and len(doomed) == 2
    # gone, or a zombie its new parent (init, a subreaper) has yet to reap: exited either way
    wait_for(lambda: all(proc_state(pid) in (None, "Z") for pid in doomed),
             "the spare and its pid 1 to exit")
    assert not (jail / "ran").exists()
