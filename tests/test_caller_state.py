"""What a caller leaves its process in: fd 0, 1 or 2 closed (hcp_linux/proc/stdio.py), SIGCHLD
ignored (inherited through exec, or set by a runtime that wants no zombies).

What must hold, for a closed fd: no fd of the runtime's (a run's capture pipe, a spare's control socket, a
pipe it keeps) lands where a command inherits its standard streams; the command finds
/dev/null where its caller had nothing; the CLI, Python or native, in-process or served,
runs the command and exits with its status, no traceback. Each case first shows the hole is
real: the closed fd is EBADF in the process that then uses the runtime.

For SIGCHLD ignored: the run's status is the command's (the kernel reaps an ignoring process's
children, and the runtime's, hcp-exec's and the init's waits found none: 137 or -9 was
reported for an exit 3), at every rung, through the API and the CLI; the command finds
SIGCHLD as a fork of the caller would (ignored through the API; at default through the CLI,
which resets it for itself, as coreutils' timeout does). Each case first shows the kernel
really reaps: a plain child's exit status is lost there.
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Iterator

import pytest

import sandboxing
from sandboxing import TIMEOUT, caller_env, jail, kill_by_pid, show, wait_for  # noqa: F401
from test_serve import start_server, stop_server

#: Closes fd 0 after a spawn and before its end (when the runtime makes the lasting fds of a
#: run's end: the reaper's pipe), then runs 3 commands that inherit stdin.
LATE = textwrap.dedent(r"""
    import json, os, subprocess, sys
    from hcp_linux import Policy, Sandbox, native
    native.set_default(sys.argv[1])
    sandbox = Sandbox(Policy(jail=sys.argv[2]))
    p = sandbox.spawn(["true"], stdin=subprocess.DEVNULL)
    os.close(0)
    p.wait()
    seen = [sandbox.run(["readlink", "/proc/self/fd/0"], capture_output=True,
                        timeout=20).stdout.decode().strip() for _ in range(3)]
    print(json.dumps({"seen": seen, "ours": os.readlink("/proc/self/fd/0")}))
""")


@pytest.mark.parametrize("executor", ["native", "ctypes"])
def test_fd_0_closed_between_a_spawn_and_its_end_is_filled(jail: Path, executor: str) -> None:
    """The caller closes fd 0 while a run goes on: the fds the run's end makes to last (the
    reaper's) do not land there, and later runs' commands find /dev/null on stdin."""
    from hcp_linux import native
    if executor == "native" and not native.available():
        pytest.skip("native executor not built")
    p = subprocess.run([sys.executable, "-c", LATE, executor, str(jail)], capture_output=True,
                       timeout=120, stdin=subprocess.DEVNULL, cwd="/")
    assert p.returncode == 0, show(p)
    out = json.loads(p.stdout)
    assert out == {"seen": ["/dev/null"] * 3, "ours": "/dev/null"}, out


#: A command (a shell) that writes what its fds 0-2 are into `fds` in the jail, and exits 3.
SHOW = ('exec 3>fds; for f in 0 1 2; do x=$(readlink /proc/$$/fd/$f) || x=closed; '
        'echo "$x" >&3; done; exit 3')  # dash redirects a command's fds in the shell itself

#: Closes fd K, checks it is closed, then runs the command 6 times (the pool's spares are
#: made meanwhile): slot K inherited, the others captured; prints what fds 0-2 of each run's
#: command were, and this process's fd K afterwards.
API = textwrap.dedent(r"""
    import errno, json, os, subprocess, sys
    from hcp_linux import Policy, Sandbox, native
    k, jail, executor, SHOW = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    os.close(k)
    try:
        os.fstat(k)
        sys.exit("fd %d is still open" % k)
    except OSError as e:
        assert e.errno == errno.EBADF
    native.set_default(executor)
    sandbox = Sandbox(Policy(jail=jail))
    show = SHOW
    runs = []
    for _ in range(6):
        stdio = [subprocess.DEVNULL, subprocess.PIPE, subprocess.PIPE]
        stdio[k] = None  # inherited: what this process has there
        r = sandbox.run(["sh", "-c", show], stdin=stdio[0], stdout=stdio[1],
                        stderr=stdio[2], timeout=20)
        with open(os.path.join(jail, "fds")) as f:
            runs.append([r.returncode, f.read().split()])
    out = {"runs": runs, "ours": os.readlink("/proc/self/fd/%d" % k)}
    os.write(3 - k if k else 1, json.dumps(out).encode())
""")


@pytest.mark.parametrize("executor", ["native", "ctypes"])
@pytest.mark.parametrize("k", [0, 1, 2])
def test_the_api_fills_a_closed_standard_fd_with_dev_null(jail: Path, k: int,
                                                          executor: str) -> None:
    from hcp_linux import native
    if executor == "native" and not native.available():
        pytest.skip("native executor not built")
    p = subprocess.run([sys.executable, "-c", API, str(k), str(jail), executor, SHOW],
                       capture_output=True, timeout=120, stdin=subprocess.DEVNULL, cwd="/")
    assert p.returncode == 0, show(p)
    out = json.loads(p.stderr if k == 1 else p.stdout)
    assert out["ours"] == "/dev/null", out
    for returncode, fds in out["runs"]:
        assert returncode == 3, out
        assert fds[k] == "/dev/null", out  # not a pipe or socket of the runtime's
        assert all(fd == "/dev/null" or fd.startswith("pipe:") for fd in fds), out
        if k != 0:  # stdin is DEVNULL; the other captured stream is a pipe of its own
            assert fds[3 - k].startswith("pipe:"), out




def _closed(k: int, argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """``argv`` started with fd ``k`` closed (a shell closes it, then execs it); the
    other two of 0-2 are a pipe each (stdin an empty one)."""
    return subprocess.run(["sh", "-c", f'exec "$@" {k}>&-', "sh", *argv], env=env,
                          capture_output=True, timeout=TIMEOUT, cwd="/", input=b"")


#: The ways to run the CLI: the Python command or the native one, in-process or served.
WAYS = ["python", "native", "native served", "python served"]


@contextlib.contextmanager
def way(how: str, tmp_path: Path) -> Iterator[tuple[list[str], dict[str, str]]]:
    """The command line and environment of one of WAYS, with a server of its own for the
    served ones (stopped after)."""
    client = sandboxing.native_client() if how.startswith("native") else None
    if how.startswith("native") and client is None:
        pytest.skip("the native client is not built (make native)")
    env = caller_env()
    env.pop("HCP_LINUX_SERVER", None)
    server = None
    if how.endswith("served"):
        (tmp_path / "server").mkdir()
        server = start_server(tmp_path / "server")
        env["HCP_LINUX_SERVER"] = str(server.path)
    try:
        yield ([client] if client else sandboxing.CLI), env
    finally:
        if server is not None:
            stop_server(server)


@pytest.mark.parametrize("how", WAYS)
@pytest.mark.parametrize("k", [0, 1, 2])
def test_the_cli_runs_with_a_closed_standard_fd(jail: Path, tmp_path: Path, k: int,
                                                how: str) -> None:
    control = _closed(k, ["sh", "-c", f"readlink /proc/self/fd/{k} || echo closed >&{3 - k}"
                          if k else "readlink /proc/self/fd/0 || echo closed"], caller_env())
    assert b"closed" in control.stdout + control.stderr, show(control)  # the hole is real
    with way(how, tmp_path) as (cli, env):
        p = _closed(k, [*cli, "run", "--jail", str(jail), "--", "sh", "-c", SHOW], env)
    assert p.returncode == 3, show(p)
    assert b"Traceback" not in p.stderr, show(p)
    fds = (jail / "fds").read_text().split()
    assert fds[k] == "/dev/null", (fds, show(p))
    assert all(fd == "/dev/null" or fd.startswith("pipe:") for fd in fds), (fds, show(p))


#: Ignores SIGCHLD, shows the kernel then reaps (a plain child's status is lost), then runs
#: a command that exits 3 at the rung asked, and prints the statuses and the command's
#: SigIgn.
IGNORING = textwrap.dedent(r"""
    import json, signal, subprocess, sys
    from hcp_linux import Policy, Sandbox, native
    executor, rung, jail = sys.argv[1:4]
    native.set_default(executor)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    plain = subprocess.run(["sh", "-c", "exit 3"]).returncode  # ECHILD: Popen says 0
    sandbox = Sandbox(Policy(jail=jail, rung=rung))
    r = sandbox.run(["sh", "-c", "exit 3"], timeout=20)
    # not through a shell: dash sets SIGCHLD to default for itself
    seen = sandbox.run(["grep", "SigIgn", "/proc/self/status"], capture_output=True,
                       timeout=20)
    print(json.dumps({"plain": plain, "run": r.returncode, "out": seen.stdout.decode()}))
""")

SIGCHLD_BIT = 1 << 16  # SIGCHLD (17) in /proc/PID/status's SigIgn


def _sig_ign(text: str) -> int:
    return int(text.split("SigIgn:")[1].split()[0], 16)


@pytest.mark.parametrize("rung", ["full", "no-pidns"])
@pytest.mark.parametrize("executor", ["native", "ctypes"])
def test_the_api_reports_the_status_when_sigchld_is_ignored(jail: Path, executor: str,
                                                           rung: str) -> None:
    from hcp_linux import native
    if executor == "native" and not native.available():
        pytest.skip("native executor not built")
    p = subprocess.run([sys.executable, "-c", IGNORING, executor, rung, str(jail)],
                       capture_output=True, timeout=120, stdin=subprocess.DEVNULL, cwd="/")
    assert p.returncode == 0, show(p)
    out = json.loads(p.stdout)
    assert out["plain"] == 0, out  # the control: the kernel reaped it, its 3 is lost
    assert out["run"] == 3, out
    assert _sig_ign(out["out"]) & SIGCHLD_BIT, out  # as a fork of the caller has it


#: Ignores SIGCHLD, then execs the rest: a caller that passes it on.
EXEC_IGNORING = ("import os, signal, sys; signal.signal(signal.SIGCHLD, signal.SIG_IGN); "
                 "os.execvp(sys.argv[1], sys.argv[1:])")


@pytest.mark.parametrize("rung", ["full", "no-pidns"])
@pytest.mark.parametrize("how", WAYS)
def test_the_cli_reports_the_status_when_sigchld_is_ignored(jail: Path, tmp_path: Path,
                                                           how: str, rung: str) -> None:
    control = subprocess.run([sys.executable, "-c", EXEC_IGNORING, "grep", "SigIgn",
                              "/proc/self/status"], capture_output=True, timeout=TIMEOUT)
    assert _sig_ign(control.stdout.decode()) & SIGCHLD_BIT, show(control)  # passed on
    with way(how, tmp_path) as (cli, env):
        def run(*argv: str) -> subprocess.CompletedProcess:
            return subprocess.run([sys.executable, "-c", EXEC_IGNORING, *cli, "run", "--jail",
                                   str(jail), "--rung", rung, "--", *argv],
                                  env=env, capture_output=True, timeout=TIMEOUT, cwd="/",
                                  stdin=subprocess.DEVNULL)
        p = run("sh", "-c", "exit 3")
        seen = run("grep", "SigIgn", "/proc/self/status")  # not through dash: it resets it
    assert p.returncode == 3, show(p)
    assert seen.returncode == 0, show(seen)
    assert not _sig_ign(seen.stdout.decode()) & SIGCHLD_BIT, show(seen)  # the CLI's default


#: Sets SIG (argv[1]) ignored or default (argv[2]), then execs the rest: a caller that
#: passes it on (nohup's HUP, a background job's INT in a script).
EXEC_WITH = ("import os, signal, sys; sig = getattr(signal, sys.argv[1]); "
             "signal.signal(sig, signal.SIG_IGN if sys.argv[2] == 'ignored' "
             "else signal.SIG_DFL); os.execvp(sys.argv[3], sys.argv[3:])")


@pytest.mark.parametrize("name", ["SIGINT", "SIGTERM", "SIGHUP"])
@pytest.mark.parametrize("how", WAYS)
def test_a_signal_ignored_by_the_caller_stays_ignored(jail: Path, tmp_path: Path, how: str,
                                                      name: str) -> None:
    """INT, TERM and HUP end a run (the CLI dies by the signal) unless the caller ignored them (the
    control); ignored, the run goes on to the command's own exit, served or not, as a plain
    command would."""
    import signal
    codes = {}
    with way(how, tmp_path) as (cli, env):
        for disposition in ("default", "ignored"):
            started = jail / "started"
            p = subprocess.Popen([sys.executable, "-c", EXEC_WITH, name, disposition, *cli,
                                  "run", "--jail", str(jail), "--", "sh", "-c",
                                  "touch started; sleep 1; exit 3"],
                                 env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, cwd="/")
            try:
                wait_for(started.exists, "the command to start")
                p.send_signal(getattr(signal, name))
                out, err = p.communicate(timeout=TIMEOUT)
            finally:
                kill_by_pid(p)
            started.unlink()
            codes[disposition] = (p.returncode, err.decode()[-300:])
    assert codes["default"][0] == -getattr(signal, name), codes  # the control: dies by it
    assert codes["ignored"][0] == 3, codes


@pytest.mark.parametrize("how", WAYS)
def test_too_few_fds_is_one_line_naming_the_limit(jail: Path, tmp_path: Path,
                                                  how: str) -> None:
    """RLIMIT_NOFILE too low for a run (the planner, the spawn or the child's setup runs out
    of fds, depending on how low): one line naming the limit and the remedy, exit 125, no
    traceback, nothing left in the jail; with room (the control) the same run runs. Served
    runs end in the same line: the program falls back when it cannot make its own fds."""
    with way(how, tmp_path) as (cli, env):
        _too_few_fds(jail, cli, env)


def _too_few_fds(jail: Path, cli: list[str], env: dict[str, str]) -> None:
    import resource

    def run(limit: int) -> subprocess.CompletedProcess:
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        return subprocess.run([*cli, "run", "--jail", str(jail), "--", "sh", "-c",
                               "touch ran; exit 3"], env=env, capture_output=True,
                              timeout=TIMEOUT, cwd="/", stdin=subprocess.DEVNULL,
                              preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE,
                                                                    (limit, hard)))
    for limit in (5, 8, 12):
        _refused_in_one_line(run(limit), jail, "Too many open files", "RLIMIT_NOFILE")
    control = run(256)
    assert control.returncode == 3 and (jail / "ran").exists(), show(control)


#: A uid no process has (checked), for a process limit that only the test's processes count
#: against.
LONE_UID = 54321


def test_too_few_processes_is_one_line_naming_the_limit() -> None:
    """RLIMIT_NPROC too low for a run (the CLI's thread, hcp-exec, its init, the command:
    whichever cannot be made): one line naming the limit, exit 125; with room (the control)
    the run runs. As a uid of its own, so that no other process counts against the limit."""
    import shutil
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root's setpriv, to run as a uid of its own")
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            assert os.stat(f"/proc/{pid}").st_uid != LONE_UID, f"pid {pid} has uid {LONE_UID}"
        except FileNotFoundError:
            pass
    check = subprocess.run(["setpriv", f"--reuid={LONE_UID}", f"--regid={LONE_UID}",
                            "--clear-groups", sys.executable, "-c", "import hcp_linux.cli"],
                           capture_output=True, timeout=TIMEOUT, cwd="/",
                           stdin=subprocess.DEVNULL)
    if check.returncode != 0:  # a checkout under a mode-700 directory (/root/...)
        pytest.skip(f"uid {LONE_UID} cannot run this interpreter/tree: "
                    f"{check.stderr.decode()[-300:]}")
    import tempfile
    home = Path(tempfile.mkdtemp(prefix="hcp-lone-uid-", dir="/tmp"))  # tmp_path is root's
    try:
        _too_few_processes(home)
    finally:
        shutil.rmtree(home)


def _too_few_processes(home: Path) -> None:
    jail = home / "jail"
    jail.mkdir()
    for d in (home, jail):
        os.chown(d, LONE_UID, LONE_UID)
    env = caller_env({"HOME": str(home), "TMPDIR": str(home)})
    env.pop("HCP_LINUX_SERVER", None)

    def run(limit: int) -> subprocess.CompletedProcess:
        import resource
        return subprocess.run(["setpriv", f"--reuid={LONE_UID}", f"--regid={LONE_UID}",
                               "--clear-groups", *sandboxing.CLI, "run", "--jail", str(jail),
                               "--", "sh", "-c", "touch ran; exit 3"], env=env,
                              capture_output=True,
                              timeout=TIMEOUT, cwd="/", stdin=subprocess.DEVNULL,
                              preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NPROC,
                                                                    (limit, limit)))
    for limit in (1, 2, 3):
        _refused_in_one_line(run(limit), jail, "RLIMIT_NPROC")
    control = run(64)
    assert control.returncode == 3 and (jail / "ran").exists(), show(control)


def _refused_in_one_line(p: subprocess.CompletedProcess, jail: Path, *words: str) -> None:
    """Exit 125, one `error: sandbox:` line with each of ``words``, nothing in the jail."""
    lines = p.stderr.decode().splitlines()
    assert p.returncode == 125, show(p)
    assert len(lines) == 1 and lines[0].startswith("error: sandbox: "), lines
    assert all(w in lines[0] for w in words), (words, lines)
    assert os.listdir(jail) == [], os.listdir(jail)


#: A command that prints its umask and the mode of a file it makes.
UMASK_SHOW = "umask; touch made; stat -c %a made"


@pytest.mark.parametrize("mask", [0o377, 0o777])
@pytest.mark.parametrize("how", WAYS)
def test_a_caller_s_umask_is_the_command_s_not_the_setup_s(jail: Path, tmp_path: Path,
                                                          how: str, mask: int) -> None:
    """A caller's umask that takes the owner's search bit away (0377, 0777): the runtime's
    own steps (the view's directories) are not made under it, so the run runs (it was
    refused at its first Landlock rule: `/dev/shm: Permission denied`), and the command
    has it, as a plain child of the caller does (the control)."""
    def preexec() -> None:
        os.umask(mask)
    control = subprocess.run(["sh", "-c", f"cd {jail} && {UMASK_SHOW} && rm made"],
                             capture_output=True, timeout=TIMEOUT, preexec_fn=preexec)
    with way(how, tmp_path) as (cli, env):
        p = subprocess.run([*cli, "run", "--jail", str(jail), "--", "sh", "-c", UMASK_SHOW],
                           env=env, capture_output=True, timeout=TIMEOUT, cwd="/",
                           stdin=subprocess.DEVNULL, preexec_fn=preexec)
    assert p.returncode == 0, show(p)
    assert p.stdout == control.stdout, (show(p), show(control))
    assert p.stdout.split() == [b"%04o" % mask, b"%o" % (0o666 & ~mask)], show(p)


@pytest.mark.parametrize("executor", ["native", "ctypes"])
def test_the_api_gives_the_command_the_caller_s_umask(jail: Path, executor: str) -> None:
    """The same through the API, 4 runs in a row (the later ones through the pool's spares,
    made before the umask changed): each command has the caller's umask of its run."""
    from hcp_linux import native
    if executor == "native" and not native.available():
        pytest.skip("native executor not built")
    script = textwrap.dedent(r"""
        import json, os, sys
        from hcp_linux import Policy, Sandbox, native
        native.set_default(sys.argv[1])
        sandbox = Sandbox(Policy(jail=sys.argv[2]))
        out = []
        for mask in (0o022, 0o022, 0o377, 0o777, 0o022):
            os.umask(mask)
            r = sandbox.run(["sh", "-c", "umask"], capture_output=True, timeout=20)
            out.append([r.returncode, r.stdout.decode().strip(), r.stderr.decode()[-200:]])
        print(json.dumps(out))
    """)
    p = subprocess.run([sys.executable, "-c", script, executor, str(jail)],
                       capture_output=True, timeout=120, stdin=subprocess.DEVNULL, cwd="/")
    assert p.returncode == 0, show(p)
    assert json.loads(p.stdout) == [[0, m, ""] for m in ("0022", "0022", "0377", "0777",
                                                          "0022")], p.stdout
