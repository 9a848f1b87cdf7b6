"""Shared helpers and fixtures of the kernel tests of `hcp-linux run` (tests/test_run_*.py).

Every helper runs a real process: the CLI through ``sys.executable -m hcp_linux``, negative
controls through plain ``subprocess``. Nothing is mocked. Every call is bounded by a timeout.

Fixtures are imported by the test modules (``from sandboxing import jail, ...``).
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
import threading
import time
from pathlib import Path
from typing import Iterable, Iterator, Mapping, Sequence

import pytest

# The conformance harness's observers serve the tests too: one Listener, one pid_alive.
from hcp_linux.conformance.observers import (Listener, accepted, drain, pid_alive,  # noqa: F401
                                             processes_with)

IS_ROOT = os.geteuid() == 0
TIMEOUT = 60  # seconds, for every subprocess a test starts

ERROR_PREFIX = "error: sandbox: "

# exit statuses of `hcp-linux run` (the README's table)
EXIT_USAGE, EXIT_TIMEOUT, EXIT_REFUSED, EXIT_NOT_EXECUTABLE, EXIT_NOT_FOUND = 2, 124, 125, 126, 127

Arg = "str | bytes | os.PathLike[str]"


# --- fixtures ---------------------------------------------------------------------------


@pytest.fixture
def jail(tmp_path: Path) -> Path:
    """An empty jail directory (the sandbox's working directory and first writable root)."""
    d = tmp_path / "jail"
    d.mkdir()
    return d


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A host directory beside the jail, outside every root: absent from the sandbox's view."""
    d = tmp_path / "outside"
    d.mkdir()
    return d


@pytest.fixture
def ro_root(tmp_path: Path) -> Path:
    """A directory granted with --read-only-root (visible inside, must not be writable)."""
    d = tmp_path / "ro"
    d.mkdir()
    (d / "file.txt").write_text("read-only content\n")
    return d


@pytest.fixture
def var_jail() -> Iterator[Path]:
    """A jail outside /tmp (whose parent is not covered by the sandbox's private /tmp), so a
    write beside it must fail inside the sandbox, not just land in a private tmpfs."""
    base = Path(_mkdtemp_outside_tmp())
    try:
        (base / "jail").mkdir()
        yield base / "jail"
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def nobody_jail(var_jail: Path) -> Path:
    """A jail `nobody` can reach and write (outside root's mode-700 pytest tmp dir)."""
    if IS_ROOT:
        import pwd
        pw = pwd.getpwnam("nobody")
        os.chown(var_jail, pw.pw_uid, pw.pw_gid)
    return var_jail


def as_nobody() -> list[str]:
    """argv prefix that runs a command as `nobody`: empty when the test already runs
    unprivileged; ``runuser -u nobody --`` as root (the test is skipped when nobody cannot
    run this interpreter and tree, e.g. a checkout under a mode-700 directory)."""
    if not IS_ROOT:
        return []
    prefix = ["runuser", "-u", "nobody", "--"]
    code = "import hcp_linux.landlock, hcp_linux.seccomp_profiles, pyseccomp"
    check = subprocess.run(prefix + [sys.executable, "-c", code],
                           capture_output=True, timeout=TIMEOUT, cwd="/", stdin=subprocess.DEVNULL)
    if check.returncode != 0:
        pytest.skip("nobody cannot run this interpreter/tree: " + check.stderr.decode()[-300:])
    return prefix


def _mkdtemp_outside_tmp() -> str:
    import tempfile
    for d in ("/var/tmp", os.path.expanduser("~")):
        if os.path.isdir(d) and os.access(d, os.W_OK | os.X_OK):
            path = tempfile.mkdtemp(prefix="hcp-run-test-", dir=d)
            os.chmod(path, 0o755)
            return path
    pytest.skip("no writable directory outside /tmp (/var/tmp, $HOME) for a jail")
    raise AssertionError("unreachable")


# --- running the CLI ----------------------------------------------------------------------


#: ``--executor NAME`` when the suite runs with ``pytest --executor NAME`` (set by conftest):
#: every test that builds a `hcp-linux run` argv puts it right after ``run``.
EXECUTOR_ARGS: list[str] = []


#: The command the argv below start: ``python -m hcp_linux``; the native client's tests
#: (tests/test_serve.py) set the native `hcp-linux` (:func:`native_client`) instead.
CLI: list[str] = [sys.executable, "-m", "hcp_linux"]


def native_client() -> str | None:
    """The native `hcp-linux` (hcp_linux/native/hcp_client.c) beside a `hcp-linux-py` of
    this Python, as a wheel installs them: the installed pair when this environment has
    it, else the one `make native` built, copied with such a script into a directory of its
    own (once per session). None when none is built."""
    global _native_client
    if _native_client is None:
        _native_client = _find_native_client() or ""
    return _native_client or None


_native_client: str | None = None


def _find_native_client() -> str | None:
    installed = os.path.join(os.path.dirname(sys.executable), "hcp-linux")
    try:
        with open(installed, "rb") as f:
            if f.read(4) == b"\x7fELF":
                return installed
    except OSError:
        pass
    from hcp_linux.native.selection import client_path, trusted
    built = client_path()
    if not trusted(built):
        return None
    import atexit
    where = _mkdtemp_outside_tmp()  # 0755: the unprivileged leg's user runs it too
    atexit.register(shutil.rmtree, where, True)
    command = os.path.join(where, "hcp-linux")
    shutil.copy2(built, command)
    with open(os.path.join(where, "hcp-linux-py"), "w") as f:
        f.write(f"#!{sys.executable}\nimport sys\n\nfrom hcp_linux.cli.launch import entry\n\n"
                f"if __name__ == \"__main__\":\n    sys.exit(entry())\n")
        os.fchmod(f.fileno(), 0o755)
    return command


def hcp_argv(jail: "Arg | None", *cmd: Arg, extra: Sequence[Arg] = ()) -> list:
    """argv of ``python -m hcp_linux run [--jail JAIL] EXTRA... -- CMD...`` (:data:`CLI`)."""
    argv: list = [*CLI, "run", *EXECUTOR_ARGS]
    if jail is not None:
        argv += ["--jail", os.fspath(jail)]
    argv += [os.fspath(a) if isinstance(a, os.PathLike) else a for a in extra]
    if cmd:
        argv += ["--", *(os.fspath(a) if isinstance(a, os.PathLike) else a for a in cmd)]
    return argv


def caller_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra or {})
    return env


def run_cli(jail: "Arg | None", *cmd: Arg, extra: Sequence[Arg] = (),
            env: Mapping[str, str] | None = None, timeout: float = TIMEOUT,
            input: bytes | None = None, pass_fds: Iterable[int] = (),
            stdin: "int | None" = None, cwd: str = "/") -> subprocess.CompletedProcess:
    """Run ``hcp-linux run`` as a separate process (the CLI of the README), capturing output.

    ``cwd`` defaults to ``/``: ``python -m`` puts the cwd first on sys.path, and the jail is
    writable by the sandboxed command, so it must never be the CLI's cwd.
    """
    return subprocess.run(hcp_argv(jail, *cmd, extra=extra), capture_output=True,
                          timeout=timeout, input=input,
                          stdin=(subprocess.DEVNULL if stdin is None else stdin)
                          if input is None else None,
                          env=caller_env() if env is None else dict(env),
                          pass_fds=tuple(pass_fds), cwd=cwd)


def sh(script: str, *, env: Mapping[str, str] | None = None, cwd: "Arg | None" = None,
       timeout: float = TIMEOUT, **kw) -> subprocess.CompletedProcess:
    """Negative control: the same shell snippet, unconfined."""
    kw.setdefault("stdin", subprocess.DEVNULL)
    return subprocess.run(["sh", "-c", script], capture_output=True, timeout=timeout,
                          env=caller_env() if env is None else dict(env), cwd=cwd, **kw)


def out(proc: subprocess.CompletedProcess) -> str:
    return proc.stdout.decode(errors="replace")


def err(proc: subprocess.CompletedProcess) -> str:
    return proc.stderr.decode(errors="replace")


def show(proc: subprocess.CompletedProcess) -> str:
    """For assertion messages."""
    return f"rc={proc.returncode}\n--- stdout\n{out(proc)}\n--- stderr\n{err(proc)}"


def assert_ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, show(proc)


def single_error_line(proc: subprocess.CompletedProcess) -> str:
    """The one ``error: sandbox: ...`` line a refusal prints; fails if there is anything else."""
    text = err(proc)
    lines = text.splitlines()
    assert len(lines) == 1 and text.endswith("\n"), f"expected exactly one line:\n{show(proc)}"
    assert lines[0].startswith(ERROR_PREFIX), show(proc)
    return lines[0]


def read_receipt(path: "Arg") -> dict:
    with open(path) as f:
        return json.load(f)


# --- host-side observers ------------------------------------------------------------------


def sleep_token(seconds: int) -> str:
    """A sleep argument unique to this test run (``30.123456789``): tests find their own
    commands by command line, and other copies of this suite may run on the same machine."""
    import secrets
    return f"{seconds}.{secrets.randbelow(10**9):09d}"


def processes_running(*argv: str) -> list[int]:
    """Pids whose command line is ``argv`` exactly: the command itself, once it has exec'd.
    :func:`processes_with` finds more: the CLI that was given the command, and the CLI's
    child between its clone and its exec (posix_spawn's child shares the CLI's memory, so
    its /proc cmdline is the CLI's until the exec), which a test would take for the command."""
    want = "\0".join(argv).encode() + b"\0"
    found = []
    for pid in processes_with(argv[-1]):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read() == want:
                    found.append(pid)
        except OSError:
            pass
    return found


def ancestors(pid: int) -> list[int]:
    """The parent of ``pid``, its parent, and so on up to pid 1 (as this pid namespace sees
    them); the chain read so far if a process in it has ended."""
    chain = []
    while pid > 1:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                pid = int(f.read().rsplit(b")", 1)[1].split()[1])  # field 4: ppid
        except (OSError, ValueError, IndexError):
            break
        chain.append(pid)
    return chain


def process_tree(pid: int) -> str:
    """What ``pid`` and every process below it are doing, a line each (state, wchan, the
    syscall it is in, argv): for the message of a test whose process did not end."""
    from hcp_linux.conformance.observers import proc_children
    lines, todo = [], [(pid, 0)]
    while todo:
        p, depth = todo.pop()
        fields = []
        for name in ("stat", "wchan", "syscall", "cmdline"):
            try:
                with open(f"/proc/{p}/{name}", "rb") as f:
                    data = f.read()
            except OSError as e:
                data = f"({e.strerror})".encode()
            if name == "stat":
                data = data.rsplit(b")", 1)[-1].split()[:1][0] if b")" in data else data
            fields.append(data.replace(b"\0", b" ").decode(errors="replace").strip()[:120])
        lines.append("  " * depth + f"{p}: " + " | ".join(fields))
        todo += [(c, depth + 1) for c in reversed(proc_children(p))]
    return "\n".join(lines)


def wait_for(cond, what: str, limit: float = TIMEOUT) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + limit
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def default_stop_signals() -> None:
    """``preexec_fn`` of a child the test will send SIGINT, SIGTERM or SIGHUP: dispositions
    are inherited across exec, and `hcp-linux run` keeps a signal ignored when it starts
    (hcp_linux.cli.interrupt: ``nohup`` means it). Under ``nohup make test`` SIGHUP is
    ignored, after a non-interactive shell's ``&`` SIGINT is: reset here, the child starts
    as a terminal's job would, whatever the suite inherited."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def kill_by_pid(proc: subprocess.Popen) -> None:
    """End a process this test started, by its pid, and reap it."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=TIMEOUT)


#: A command that plants ``.envrc`` at its jail's top (a missing protected name: removed
#: after the run, the control that its sweep ran), makes ``ready``, then waits up to 20 s
#: for ``go`` there.
_WAIT_FOR_GO = ("echo planted > .envrc; : > ready; i=0;"
                " while [ ! -e go ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done")


@contextlib.contextmanager
def cli_run_waiting(jail: Path, env: Mapping[str, str],
                    extra: Sequence[Arg] = ()) -> Iterator[subprocess.Popen]:
    """`hcp-linux run` in ``jail`` of a command that waits, once it is running (``ready``);
    on leaving, ``go`` is made and the run waited for (its status checked: 0), and its
    ``.envrc`` is checked gone (the run's sweep ran, and would have removed what the body
    made at a missing protected name)."""
    proc = subprocess.Popen(hcp_argv(jail, "/bin/sh", "-c", _WAIT_FOR_GO, extra=extra),
                            env=dict(env), cwd="/", stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: (jail / "ready").exists() or proc.poll() is not None,
                 "the command to start")
        assert proc.poll() is None, proc.communicate()
        yield proc
        (jail / "go").touch()
        stdout, stderr = proc.communicate(timeout=TIMEOUT)
        assert proc.returncode == 0, (stdout, stderr)
        assert not (jail / ".envrc").exists(), "the run's sweep did not run"
    finally:
        kill_by_pid(proc)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


# --- a degraded host, simulated honestly --------------------------------------------------

_DENY_LAUNCHER = r"""
import ctypes, os, sys
import pyseccomp
names, err = sys.argv[1].split(","), int(sys.argv[2])
libc = ctypes.CDLL(None, use_errno=True)
PR_SET_NO_NEW_PRIVS = 38
if libc.prctl(PR_SET_NO_NEW_PRIVS, ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0),
              ctypes.c_ulong(0)) != 0:
    raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
f = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
for name in names:
    f.add_rule(pyseccomp.ERRNO(err), name)
f.load()
os.execv(sys.executable, [sys.executable] + sys.argv[3:])
"""


def deny_syscalls_launcher(syscalls: Sequence[str], errno_: int) -> list[str]:
    """argv prefix that runs the rest of the command line (``-m hcp_linux run ...``) under a
    seccomp filter: default allow, ``errno_`` for ``syscalls``, with no_new_privs set.

    The launcher execs ``sys.executable`` with the arguments that follow these; see
    :func:`deny_run_cli`.
    """
    return [sys.executable, "-c", _DENY_LAUNCHER, ",".join(syscalls), str(errno_)]


def deny_run_cli(syscalls: Sequence[str], errno_: int, jail: "Arg", *cmd: Arg,
                 extra: Sequence[Arg] = (), env: Mapping[str, str] | None = None,
                 timeout: float = TIMEOUT) -> subprocess.CompletedProcess:
    argv = deny_syscalls_launcher(syscalls, errno_) + hcp_argv(jail, *cmd, extra=extra)[1:]
    return subprocess.run(argv, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL,
                          env=caller_env() if env is None else dict(env), cwd="/")


def snapshot(path: "Arg") -> dict[str, tuple]:
    """Every entry under ``path`` with its type, size, mode and mtime: "nothing written"."""
    root = os.fspath(path)
    result = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            result[os.path.relpath(p, root)] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return result


class LoopbackServer:
    """A TCP server on the host's 127.0.0.1 (port chosen by the kernel), one connection at a
    time on a thread of its own; counts what it accepted. Subclasses say what to do with each
    connection (:meth:`handle`, errors on it ignored)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def handle(self, conn: socket.socket) -> None:
        raise NotImplementedError

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            with conn:
                conn.settimeout(5)
                try:
                    self.handle(conn)
                except OSError:
                    pass

    def close(self) -> None:
        # shutdown() wakes the thread's accept() (EINVAL): closing alone would leave it
        # blocked, and a later server given the same fd number could lose a connection to it
        self.sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(5)
        self.sock.close()


@contextlib.contextmanager
def stuck_seccomp_listener(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Within the block the runtime's seccomp listener answers nothing (a stopped or starved
    thread): a notified call waits in the kernel. Released (answering again) on leaving."""
    from hcp_linux.observe import denials
    release = threading.Event()
    answer = denials.SeccompListener.answer_one

    def stuck(self):  # type: ignore[no-untyped-def]
        release.wait(TIMEOUT)
        return answer(self)

    monkeypatch.setattr(denials.SeccompListener, "answer_one", stuck)
    try:
        yield
    finally:
        release.set()


# --- unix sockets ---------------------------------------------------------------------------


def listen_unix(path: "Arg") -> socket.socket:
    """A non-blocking listener at ``path``, connectable by anyone (mode 777)."""
    s = socket.socket(socket.AF_UNIX)
    s.bind(os.fspath(path))
    os.chmod(path, 0o777)
    s.listen(8)
    s.setblocking(False)
    return s


def accepted_unix(s: socket.socket, wait: float = 0.0) -> int:
    """How many connections the listener has waiting (each accepted and closed), waiting up
    to ``wait`` seconds for the first."""
    import select
    n = 0
    while select.select([s], [], [], wait)[0]:
        conn, _ = s.accept()
        conn.close()
        n += 1
        wait = 0.0
    return n


def imported_by_run(jail: "Arg", *cmd: Arg, env: Mapping[str, str] | None = None
                    ) -> tuple[subprocess.CompletedProcess, list[str]]:
    """``hcp-linux run`` as run_cli runs it, under ``python -X importtime``: the result, and
    the modules it imported from its own package's first import on (what the interpreter's
    start-up imported is not its doing)."""
    argv = hcp_argv(jail, *cmd)
    argv[1:1] = ["-X", "importtime"]
    done = subprocess.run(argv, capture_output=True, timeout=TIMEOUT,
                          stdin=subprocess.DEVNULL,
                          env=caller_env() if env is None else dict(env), cwd="/")
    names = [line.rsplit("|", 1)[1].strip() for line in done.stderr.decode().splitlines()
             if line.startswith("import time:") and line.count("|") == 2]
    start = names.index("hcp_linux") if "hcp_linux" in names else len(names)
    return done, names[start:]


def jail_home_of(tmp: "Arg") -> Path:
    """The user's jail home in the temp dir ``tmp`` (hcp_linux.runtime_files.jail_home):
    where every ephemeral jail is made."""
    from hcp_linux.runtime_files import jail_home
    return Path(jail_home(os.fspath(tmp)))


def jails_in(tmp: "Arg") -> list[str]:
    """What the runtime left in the temp dir ``tmp``: its entries, with each jail home there
    (kept once made, empty) replaced by the jails it holds. Any uid's: a run in a user
    namespace names its home by its uid there (``hcp-linux-jails-0`` as nobody mapped to
    root)."""
    names = []
    for name in os.listdir(tmp):
        path = Path(tmp) / name
        if name.startswith("hcp-linux-jails-") and name[16:].isdigit() and path.is_dir():
            names += os.listdir(path)
        else:
            names.append(name)
    return sorted(names)
