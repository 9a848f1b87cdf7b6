"""`hcp-linux serve`: `hcp-linux run` with its plan compiled by a warm server (issue 8).

What must hold: a served run is the in-process run (same output, status, refusals, receipt
but for `served_by`); the command descends from the client, never from the server, which
starts nothing; ^C and timeouts leave nothing behind; a server the client cannot trust (in
another mount namespace, or confined where the client is not: a sandboxed command posing as
the server) is not used, nor is a client the server cannot plan for served; in every such
case the client runs in-process and the result is the same.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from sandboxing import (IS_ROOT, TIMEOUT, ancestors, caller_env,  # noqa: F401
                        default_stop_signals, hcp_argv, imported_by_run, jail, kill_by_pid,
                        out, processes_running, processes_with, run_cli, show, sleep_token,
                        wait_for)

@pytest.fixture(autouse=True)
def default_executor(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The server plans for the native executor (`--executor ctypes` runs in-process): these
    tests run the CLI with its default executor in every leg of the suite."""
    import sandboxing
    monkeypatch.setattr(sandboxing, "EXECUTOR_ARGS", [])


@pytest.fixture(autouse=True, params=["python", "native"])
def client(request, monkeypatch) -> str:  # type: ignore[no-untyped-def]
    """Every test with each client: the Python command (`python -m hcp_linux`) and the
    native one (hcp_linux/native/hcp_client.c), which must give the same results, falling
    back to the Python command for what it does not do itself."""
    if request.param == "native":
        import sandboxing
        command = sandboxing.native_client()
        if command is None:
            pytest.skip("the native client is not built (make native)")
        monkeypatch.setattr(sandboxing, "CLI", [command])
    return request.param


class Server:
    def __init__(self, proc: subprocess.Popen, path: Path) -> None:
        self.proc, self.path = proc, path

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        return caller_env({"HCP_LINUX_SERVER": str(self.path), **(extra or {})})

    def children(self) -> list[int]:
        out = []
        for tid in os.listdir(f"/proc/{self.proc.pid}/task"):
            with open(f"/proc/{self.proc.pid}/task/{tid}/children") as f:
                out += [int(c) for c in f.read().split()]
        return out


def start_server(tmp_path: Path, prefix: list[str] | None = None,
                 env: dict[str, str] | None = None) -> Server:
    path = tmp_path / "serve.sock"
    proc = subprocess.Popen([*(prefix or []), sys.executable, "-m", "hcp_linux", "serve",
                             "--socket", str(path)], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd="/",
                            env=env)
    line = proc.stderr.readline()  # it says so once it listens (or why it cannot)
    if not line.startswith(b"hcp-linux serve: listening on"):
        kill_by_pid(proc)
        pytest.fail(f"the server did not start: {line.decode()}{proc.stderr.read().decode()}")
    return Server(proc, path)


def stop_server(server: Server) -> None:
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGTERM)
    try:
        server.proc.wait(timeout=TIMEOUT)
    finally:
        kill_by_pid(server.proc)
        server.proc.stderr.close()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    s = start_server(tmp_path)
    yield s
    stop_server(s)
    assert not s.path.exists(), "the socket outlived its server"


def both(server: Server, jail: Path, *cmd: str, extra: list[str] | None = None,
         **kw) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    """The same `hcp-linux run`, in-process and through the server."""
    plain = run_cli(jail, *cmd, extra=extra or [], **kw)
    served = run_cli(jail, *cmd, extra=extra or [], env=server.env(), **kw)
    return plain, served


def test_a_served_run_imports_only_the_light_path(server: Server, jail: Path,
                                                  client: str) -> None:
    """Issue 35: the served client's start-up is the point of the server. None of the
    engine, nor dataclasses, typing, argparse, subprocess, threading or hashlib, which the
    in-process run needs and the client does not (the sweep's module included)."""
    if client == "native":
        pytest.skip("the Python client's imports (the native one starts no Python: "
                    "tests/test_native_client.py)")
    done, imported = imported_by_run(jail, "true", env=server.env())
    assert done.returncode == 0, show(done)
    assert "hcp_linux.cli.serve_client" in imported, imported
    heavy = {"hcp_linux.sandbox", "hcp_linux.cli.cli", "dataclasses", "typing", "argparse",
             "subprocess", "threading", "hashlib", "_hashlib", "inspect", "json", "re", "enum"}
    assert not heavy & set(imported), sorted(heavy & set(imported))


def test_the_sweep_crosses_the_wire_as_it_was() -> None:
    """The server sends the run's sweep beside the receipt (protocol 2), so that a client
    writing no receipt never parses JSON: every entry comes back as it was, and anything
    else is refused with ValueError (the client then runs nothing of it)."""
    from hypothesis import given, settings, strategies as st

    from hcp_linux.cli.serve_wire import decode_sweep, encode_sweep
    name = st.text(min_size=1).map(lambda t: "/" + t.replace("\0", ""))
    target = (st.none() | st.text(min_size=1).map(lambda t: t.replace("\0", "") or "x")
              | st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1)))
    entries = st.lists(st.tuples(name, target, st.booleans()), max_size=6).map(tuple)

    @settings(max_examples=300, deadline=None)
    @given(entries)
    def round_trip(e: tuple) -> None:
        assert decode_sweep(encode_sweep(e)) == e

    @settings(max_examples=500, deadline=None)
    @given(st.binary(max_size=64) | entries.map(encode_sweep).flatmap(
        lambda b: st.integers(0, max(0, len(b) - 1)).map(lambda n: b[:n])))
    def refused_or_read(blob: bytes) -> None:
        try:
            decode_sweep(blob)
        except ValueError:
            pass

    round_trip()
    refused_or_read()
    surrogate = os.fsdecode(b"/j/\xff.envrc")
    assert decode_sweep(encode_sweep(((surrogate, None, False),))) == ((surrogate, None, False),)


PROBE = ("id -u; id -g; pwd; umask; echo \"HCP_SANDBOX=$HCP_SANDBOX\"; "
         "grep -E '^(NoNewPrivs|Seccomp|CapEff|CapBnd|Cpus_allowed_list|SigIgn|SigBlk):' "
         "/proc/self/status; wc -l < /proc/self/mountinfo; ls /; echo to-stderr >&2; exit 3")


def test_a_served_run_is_the_in_process_run(server: Server, jail: Path, tmp_path: Path) -> None:
    plain_receipt, served_receipt = tmp_path / "plain.json", tmp_path / "served.json"
    # the same environment (HCP_LINUX_SERVER is scrubbed, and the receipt says so), with
    # nobody listening: in-process
    absent = caller_env({"HCP_LINUX_SERVER": str(tmp_path / "nobody-listens.sock")})
    plain = run_cli(jail, "sh", "-c", PROBE, extra=["--receipt", str(plain_receipt)],
                    env=absent)
    served = run_cli(jail, "sh", "-c", PROBE, extra=["--receipt", str(served_receipt)],
                     env=server.env())
    assert plain.returncode == 3, show(plain)
    assert (served.returncode, served.stdout, served.stderr) == \
        (plain.returncode, plain.stdout, plain.stderr), (show(plain), show(served))
    a, b = json.loads(plain_receipt.read_text()), json.loads(served_receipt.read_text())
    assert "served_by" not in a  # control: the in-process run says nothing of a server
    assert b.pop("served_by") == {"pid": server.proc.pid, "socket": str(server.path)}
    # a served run's seccomp filter answers denials itself: nothing listens in the client
    assert a["denial_layers"].pop("seccomp").startswith("recorded")
    assert b["denial_layers"].pop("seccomp").startswith("unavailable: served run")
    # nor does the server read the Landlock domain's audit records (where this process may)
    assert b["denial_layers"].pop("landlock").startswith("unavailable: ")
    a["denial_layers"].pop("landlock")
    assert a == b


def test_a_served_run_takes_the_callers_stdin_umask_and_environment(server: Server,
                                                                    jail: Path) -> None:
    script = "cat; umask; echo \"LANG=$LANG\""
    env = server.env({"LANG": "C.UTF-8"})
    served = subprocess.run(["sh", "-c", "umask 077; exec \"$@\"", "sh",
                             *hcp_argv(jail, "sh", "-c", script)], input=b"from stdin\n",
                            capture_output=True, env=env, timeout=TIMEOUT, cwd="/")
    assert served.returncode == 0, show(served)
    assert out(served) == "from stdin\n0077\nLANG=C.UTF-8\n", show(served)


def test_each_request_plans_with_the_clients_environment_alone(tmp_path: Path,
                                                                jail: Path) -> None:
    """The server takes each client's environment as its own while it plans, and gives
    its own back after: a variable only the server has never reaches a command, one a
    client changes or adds does, and the next client sees none of the last one's."""
    server = start_server(tmp_path, env={k: v for k, v in caller_env(
        {"LC_ALL": "C", "LANG": "server-lang"}).items() if k != "TZ"})
    try:
        script = 'echo "LANG=${LANG-unset} LC_ALL=${LC_ALL-unset} TZ=${TZ-unset}"'
        seen = []
        for extra in ({"LANG": "C.UTF-8"}, {"TZ": "UTC", "LC_ALL": "POSIX"}, {}):
            env = {k: v for k, v in server.env().items() if k not in ("LANG", "LC_ALL", "TZ")}
            env.update(extra)
            served = subprocess.run(hcp_argv(jail, "sh", "-c", script), capture_output=True,
                                    env=env, timeout=TIMEOUT, cwd="/")
            assert served.returncode == 0, show(served)
            seen.append(out(served))
        assert seen == ["LANG=C.UTF-8 LC_ALL=unset TZ=unset\n",
                        "LANG=unset LC_ALL=POSIX TZ=UTC\n",
                        "LANG=unset LC_ALL=unset TZ=unset\n"]
        # control: the server's own variables reach a command it plans as its own
        plain = subprocess.run(hcp_argv(jail, "sh", "-c", script), capture_output=True,
                               env={k: v for k, v in caller_env({"LC_ALL": "C", "LANG":
                                    "server-lang"}).items() if k != "TZ"},
                               timeout=TIMEOUT, cwd="/")
        assert out(plain) == "LANG=server-lang LC_ALL=C TZ=unset\n", show(plain)
    finally:
        stop_server(server)


def test_taking_a_clients_environment_changes_the_c_environment_exactly() -> None:
    """What the planning code, and C code it calls (getenv), read while a request is
    planned is the client's environment exactly, and the server's again after."""
    import ctypes

    from hcp_linux.cli.serve import _become
    getenv = ctypes.CDLL(None).getenv
    getenv.restype = ctypes.c_char_p
    before = dict(os.environb)
    client = {k: v for k, v in before.items() if k != b"PATH"}
    client.update({b"HCP_TEST_ADDED": b"1", b"HOME": b"/client-home"})
    try:
        _become(client)
        assert dict(os.environb) == client
        assert getenv(b"PATH") is None and getenv(b"HCP_TEST_ADDED") == b"1"
        assert getenv(b"HOME") == b"/client-home"
    finally:
        _become(before)
    assert dict(os.environb) == before
    assert getenv(b"HCP_TEST_ADDED") is None and getenv(b"PATH") == before[b"PATH"]


@pytest.mark.parametrize("args", [
    ["--bogus"],
    ["--jail", "JAIL", "--"],
    ["--jail", "JAIL", "--allow-bin", "ls", "--", "cat"],
    ["--jail", "JAIL", "--", "/nonexistent-bin"],
    ["--jail", "/nonexistent-jail", "--", "true"],
    ["--jail", "JAIL", "--network", "sideways", "--", "true"],
    ["--jail", "JAIL", "--limit", "nproc", "--", "true"],
    ["--jail", "JAIL", "--", "sh", "-c", "exit 0", "--", "x"],
], ids=["usage", "no-command", "not-allowlisted", "no-bin", "no-jail", "bad-network",
        "bad-limit", "dashes-in-argv"])
def test_refusals_and_status_are_the_same_through_the_server(server: Server, jail: Path,
                                                             args: list[str]) -> None:
    argv = [sys.executable, "-m", "hcp_linux", "run",
            *(str(jail) if a == "JAIL" else a for a in args)]
    plain = subprocess.run(argv, capture_output=True, timeout=TIMEOUT, env=caller_env(),
                           cwd="/", stdin=subprocess.DEVNULL)
    served = subprocess.run(argv, capture_output=True, timeout=TIMEOUT, env=server.env(),
                            cwd="/", stdin=subprocess.DEVNULL)
    assert (served.returncode, served.stdout, served.stderr) == \
        (plain.returncode, plain.stdout, plain.stderr), (show(plain), show(served))


def test_an_exec_failure_comes_back_through_the_server(server: Server, jail: Path) -> None:
    """A script whose interpreter is not in the sandbox fails at execve inside: the client
    reports it to the server, which answers with the error the in-process run prints."""
    script = jail / "script"
    script.write_text("#!/nonexistent/interpreter\n")
    script.chmod(0o755)
    plain, served = both(server, jail, str(script))
    assert plain.returncode == 127, show(plain)
    assert (served.returncode, served.stderr) == (plain.returncode, plain.stderr), show(served)


def test_the_command_descends_from_the_client_and_the_server_starts_nothing(
        server: Server, jail: Path) -> None:
    token = sleep_token(30)
    client = subprocess.Popen(hcp_argv(jail, "sleep", token), env=server.env(),
                              stdin=subprocess.DEVNULL, cwd="/")
    try:
        # the command itself, exec'd: not the client's child before its exec of hcp-exec
        # (a posix_spawn child, its command line still the client's, the token in it)
        wait_for(lambda: processes_running("sleep", token), "the command never started")
        [command] = processes_running("sleep", token)
        assert client.pid in ancestors(command), ancestors(command)
        with open(f"/proc/{client.pid}/task/{client.pid}/children") as f:
            monitors = [int(c) for c in f.read().split()]
        assert len(monitors) == 1, monitors  # hcp-exec, the client's own child
        with open(f"/proc/{monitors[0]}/comm") as f:
            assert f.read().startswith("hcp-exec")  # comm: the binary's name, cut
        assert server.children() == []
    finally:
        kill_by_pid(client)
    wait_for(lambda: not processes_with(token), "the command outlived its client")


def test_the_server_is_free_while_a_served_command_runs(server: Server, jail: Path,
                                                        tmp_path: Path) -> None:
    """The server plans and is done: a second client is served while the first one's
    command still runs (the server is sequential, so holding it would refuse the second)."""
    token = sleep_token(30)
    first = subprocess.Popen(hcp_argv(jail, "sleep", token), env=server.env(),
                             stdin=subprocess.DEVNULL, cwd="/")
    try:
        wait_for(lambda: processes_running("sleep", token), "the first command never started")
        _, receipt = _one_run(server, jail, tmp_path)
        assert receipt["served_by"]["pid"] == server.proc.pid
        assert first.poll() is None and processes_running("sleep", token)  # still running
    finally:
        kill_by_pid(first)


@pytest.mark.parametrize("how", ["SIGINT", "timeout"])
def test_interrupt_and_timeout_leave_nothing_behind(server: Server, jail: Path,
                                                    how: str) -> None:
    token = sleep_token(30)
    extra = ["--timeout", "1"] if how == "timeout" else []
    argv = hcp_argv(jail, "sh", "-c", f"sleep {token} & exec sleep {token}", extra=extra)
    results = []
    for env in (caller_env(), server.env()):  # control: the in-process run, then served
        client = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, cwd="/",
                                  stderr=subprocess.PIPE, preexec_fn=default_stop_signals)
        try:
            wait_for(lambda: len(processes_with(f"sleep\0{token}", client.pid)) >= 2,
                      "the command never started")
            if how == "SIGINT":
                client.send_signal(signal.SIGINT)
            rc = client.wait(timeout=TIMEOUT)
            results.append((rc, client.stderr.read()))
        finally:
            kill_by_pid(client)
            client.stderr.close()
        assert processes_with(token) == [], "a process of the run survived"
    assert results[0] == results[1], results
    if how == "timeout":
        assert results[1][0] == 124, results


def _one_run(server: Server, jail: Path, tmp_path: Path,
             prefix: list[str] | None = None) -> tuple[subprocess.CompletedProcess, dict]:
    receipt = tmp_path / f"receipt-{time.monotonic_ns()}.json"
    argv = [*(prefix or []), *hcp_argv(jail, "sh", "-c", "echo ran",
                                       extra=["--receipt", str(receipt)])]
    p = subprocess.run(argv, env=server.env(), capture_output=True, timeout=TIMEOUT, cwd="/",
                       stdin=subprocess.DEVNULL)
    assert p.returncode == 0 and out(p) == "ran\n", show(p)
    return p, json.loads(receipt.read_text())


UNTRUSTED = {
    # it does not see our paths (its own mount namespace): it could not plan for us
    "another-mount-namespace": (["unshare", "-m"] if IS_ROOT else ["unshare", "-r", "-m"],
                                "namespace"),
    # under no_new_privs where the client is not: what every sandboxed command is, posing
    # as the server
    "no-new-privs": (["setpriv", "--no-new-privs"], "NoNewPrivs"),
}


@pytest.mark.parametrize("case", sorted(UNTRUSTED))
def test_an_untrusted_server_is_not_used(tmp_path: Path, jail: Path, case: str) -> None:
    """The client says why and runs in-process. Control: the same server started without
    the difference is used."""
    prefix, why = UNTRUSTED[case]
    if not shutil.which(prefix[0]):
        pytest.skip(f"{prefix[0]}(1) is not installed")
    untrusted = start_server(tmp_path, prefix)
    try:
        p, receipt = _one_run(untrusted, jail, tmp_path)
        assert "served_by" not in receipt
        assert "not using the server" in p.stderr.decode() and why in p.stderr.decode(), show(p)
    finally:
        stop_server(untrusted)
    (tmp_path / "control").mkdir()
    trusted = start_server(tmp_path / "control")
    try:
        p, receipt = _one_run(trusted, jail, tmp_path)
        assert receipt["served_by"]["pid"] == trusted.proc.pid, show(p)
        assert p.stderr == b""
    finally:
        stop_server(trusted)


def test_a_client_with_other_hard_limits_is_not_served(server: Server, jail: Path,
                                                       tmp_path: Path) -> None:
    """The plan's rlimits are clamped to the hard limits of the process that starts the
    sandbox: the server's are not the client's, so such a client runs in-process, where its
    own clamp holds. Control: the same client without the lower limit is served."""
    lower = ["sh", "-c", 'ulimit -n 512 && exec "$@"', "sh"]
    receipt = tmp_path / "lower.json"
    p = subprocess.run([*lower, *hcp_argv(jail, "sh", "-c", "ulimit -Hn",
                                          extra=["--receipt", str(receipt)])],
                       env=server.env(), capture_output=True, timeout=TIMEOUT, cwd="/",
                       stdin=subprocess.DEVNULL)
    assert p.returncode == 0 and out(p) == "512\n", show(p)
    assert "served_by" not in json.loads(receipt.read_text())
    _, served = _one_run(server, jail, tmp_path)
    assert served["served_by"]["pid"] == server.proc.pid


def test_a_client_more_confined_than_the_server_is_not_served(server: Server, jail: Path,
                                                              tmp_path: Path) -> None:
    """A client under no_new_privs where the server is not (a sandboxed command, say) could
    have the server read or write on its behalf what it may not: it is not served, and runs
    in-process, as confined as it was. Control: the same client without it is served."""
    if not shutil.which("setpriv"):
        pytest.skip("setpriv(1) is not installed")
    p, receipt = _one_run(server, jail, tmp_path, ["setpriv", "--no-new-privs"])
    assert "served_by" not in receipt and p.stderr == b"", show(p)
    _, receipt = _one_run(server, jail, tmp_path)
    assert receipt["served_by"]["pid"] == server.proc.pid


def test_the_server_writes_nothing_where_a_client_points_it(server: Server, jail: Path,
                                                            tmp_path: Path) -> None:
    """The seccomp programs are compiled when the server starts: a served run does not
    read or write the program cache where the client's HCP_LINUX_SECCOMP_CACHE points. Control: an
    in-process run, a fresh process, stores its program there."""
    served_cache, plain_cache = tmp_path / "served-cache", tmp_path / "plain-cache"
    served_cache.mkdir()
    plain_cache.mkdir()
    p = run_cli(jail, "true", extra=["--receipt", str(tmp_path / "r.json")],
                env=server.env({"HCP_LINUX_SECCOMP_CACHE": str(served_cache)}))
    assert p.returncode == 0, show(p)
    assert "served_by" in json.loads((tmp_path / "r.json").read_text())
    assert list(served_cache.rglob("*")) == []
    p = run_cli(jail, "true", env=caller_env({"HCP_LINUX_SECCOMP_CACHE": str(plain_cache)}))
    assert p.returncode == 0, show(p)
    assert list(plain_cache.glob("*.bpf")), \
        "control: the in-process run did not store its program"


def test_serve_refuses_a_socket_another_server_listens_on(server: Server) -> None:
    p = subprocess.run([sys.executable, "-m", "hcp_linux", "serve", "--socket",
                        str(server.path)], capture_output=True, timeout=TIMEOUT, cwd="/")
    assert p.returncode == 125, show(p)
    assert p.stderr.decode() == (f"error: sandbox: serve: {server.path}: another server is "
                                 "listening there\n")
    assert server.proc.poll() is None  # the first one goes on


def test_serve_takes_over_a_stale_socket(tmp_path: Path, jail: Path) -> None:
    first = start_server(tmp_path)
    first.proc.kill()  # no clean-up: the socket file stays, nobody listens
    first.proc.wait(timeout=TIMEOUT)
    first.proc.stderr.close()
    assert first.path.exists()
    second = start_server(tmp_path)
    try:
        _, receipt = _one_run(second, jail, tmp_path)
        assert receipt["served_by"]["pid"] == second.proc.pid
    finally:
        stop_server(second)


def test_no_server_listening_runs_in_process(tmp_path: Path, jail: Path) -> None:
    env = caller_env({"HCP_LINUX_SERVER": str(tmp_path / "nobody-listens.sock")})
    p = run_cli(jail, "sh", "-c", "echo ran", env=env)
    assert p.returncode == 0 and out(p) == "ran\n" and p.stderr == b"", show(p)


def test_timeout_with_the_monitor_stopped_served_and_not(server: Server, jail: Path) -> None:
    """The served client ends a run by its own hand too (hcp_linux.proc.teardown): with the
    monitor stopped from outside, `--timeout 1` still returns 124 and leaves nothing."""
    token = sleep_token(30)
    argv = hcp_argv(jail, "sh", "-c", f"exec sleep {token}", extra=["--timeout", "1"])
    for env in (caller_env(), server.env()):  # control: the in-process run, then served
        client = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, cwd="/",
                                  stderr=subprocess.PIPE, preexec_fn=default_stop_signals)
        monitor = -1
        try:
            wait_for(lambda: processes_with(f"sleep\0{token}", client.pid) != [],
                     "the command never started")
            with open(f"/proc/{client.pid}/task/{client.pid}/children") as f:
                monitor = int(f.read().split()[0])
            os.kill(monitor, signal.SIGSTOP)
            rc = client.wait(timeout=TIMEOUT)
            assert rc == 124, client.stderr.read()  # type: ignore[union-attr]
        finally:
            if monitor > 0:
                try:
                    os.kill(monitor, signal.SIGCONT)
                except ProcessLookupError:
                    pass
            kill_by_pid(client)
            client.stderr.close()  # type: ignore[union-attr]
        wait_for(lambda: processes_with(token) == [], "a process of the run survived")


_BLOCKED = ("import ctypes, errno\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "print(libc.unshare(0x20000), errno.errorcode[ctypes.get_errno()])")


def test_a_served_run_refuses_blocked_calls_unrecorded(server: Server, jail: Path,
                                                       tmp_path: Path) -> None:
    """Served, the filter answers its denials itself (no listener in the client): the call
    is refused all the same, and the receipt says the denials are not recorded. With
    --explain the run is not served: in-process, the denial is recorded and explained."""
    receipt = tmp_path / "served.json"
    served = run_cli(jail, "python3", "-c", _BLOCKED, extra=["--receipt", str(receipt)],
                     env=server.env())
    assert served.stdout == b"-1 EPERM\n", show(served)
    r = json.loads(receipt.read_text())
    assert "served_by" in r
    assert r["denials"] == []
    assert r["denial_layers"]["seccomp"].startswith("unavailable: served run")
    explained = run_cli(jail, "python3", "-c", _BLOCKED,
                        extra=["--receipt", str(receipt), "--explain"], env=server.env())
    assert explained.stdout == b"-1 EPERM\n", show(explained)
    assert explained.stderr.startswith(b"blocked: unshare (pid "), show(explained)
    r = json.loads(receipt.read_text())
    assert "served_by" not in r
    assert [d["syscall"] for d in r["denials"]] == ["unshare"]


def test_a_receipt_goes_where_it_was_named_whatever_the_command_does(server: Server,
                                                                      tmp_path: Path) -> None:
    """``--receipt`` inside the jail: the command renames the receipt's directory and leaves
    a symlink to another directory in its place. The runtime writes the receipt unconfined,
    after the run: it goes to the directory named before the run (renamed now), never
    through the symlink, or the command would choose where the runtime writes. In-process
    and served. Control: the same path written after the swap, as it was written before,
    lands in the other directory."""
    from hcp_linux.run.receipt import write_receipt
    for how, env in (("in-process", None), ("served", server.env())):
        jail, target = tmp_path / how / "jail", tmp_path / how / "target"
        (jail / "out").mkdir(parents=True)
        target.mkdir()
        p = run_cli(jail, "/bin/sh", "-c", f"mv out out2 && ln -s {target} out",
                    extra=["--receipt", str(jail / "out" / "r.json")], env=env)
        assert p.returncode == 0, show(p)
        assert os.listdir(target) == [], how
        receipt = json.loads((jail / "out2" / "r.json").read_text())
        assert ("served_by" in receipt) == (how == "served"), receipt.get("served_by")
    write_receipt({"control": True}, str(jail / "out" / "r.json"))
    assert os.listdir(target) == ["r.json"]


def test_a_client_that_leaves_before_its_request_is_no_error(tmp_path: Path,
                                                           jail: Path) -> None:
    """A client that connects and leaves (gone, or falling back before its request: a cwd
    that no longer exists) is nothing the server reports; the run says why in one line, as
    in-process, and the next run is served."""
    import socket
    import sandboxing
    (tmp_path / "server").mkdir()
    server = start_server(tmp_path / "server")
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(str(server.path))  # and closes
        gone = tmp_path / "gone"
        gone.mkdir()
        p = subprocess.run(["sh", "-c", 'cd "$1" && rmdir "$1" && shift && exec "$@"', "sh",
                            str(gone), *sandboxing.CLI, "run", "--", "true"],
                           env=server.env(), capture_output=True, timeout=TIMEOUT)
        assert p.returncode == 125, show(p)
        assert p.stderr.decode().splitlines() == [
            "error: sandbox: run: the current directory: No such file or directory "
            "(give --jail DIR)"], show(p)
        receipt = tmp_path / "r.json"
        ok = run_cli(jail, "true", extra=["--receipt", str(receipt)], env=server.env())
        assert ok.returncode == 0, show(ok)
        assert json.loads(receipt.read_text())["served_by"]["pid"] == server.proc.pid
        server.proc.send_signal(signal.SIGTERM)
        server.proc.wait(timeout=TIMEOUT)
        said = server.proc.stderr.read()
    finally:
        stop_server(server)
    assert server.proc.returncode == 0 and said == b"", said  # no "a request failed"
