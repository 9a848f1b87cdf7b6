"""A session: one confinement that lasts, in which many commands run (as `docker exec` into a
running container).

A confined run pays for its namespaces, mount view and rulesets every time (~3.9 ms of CPU
per /bin/true here, of which the kernel's namespaces alone are ~2.6). Where commands belong to
one sandbox that lives on between them (a Ray sandbox, an agent's workspace), they need not
each get new ones: a session starts one confined run of hcp_linux/zygote.py (the sandbox's
own ``python3 -I -S``) and sends it each command to fork and exec. Each command is still
planned here, by the same :func:`~hcp_linux.plan.plan.compile_plan` as a run of its own: the
allow-list, the environment scrub and marker, the working directory in the view; only the
already-made confinement is shared.

What sharing means, and what it does not change (docs/session.md): commands of one session
share the file system (the jail, /tmp, /dev/shm), the network, IPC and pid namespaces, and
see each other's pids and command lines; each runs in a Landlock domain of its own (made by
the zygote, see hcp_linux/zygote.py), so no other command's process can read its
environment, memory or fds, or (Landlock ABI 6) signal it. With ``on_exit = "kill"`` what a
command started is killed when it exits, setsid'd or not, as a run's pid namespace would
be; a timeout kills it all too, and :meth:`Session.run` comes back within ``timeout`` +
:data:`GRACE` s whatever holds the pipes (the result says ``leftovers`` and ``abandoned``).
The session ends when :meth:`Session.close` is called, its runtime dies (the run's
parent-death signal), or the zygote is killed: then each command in flight fails with
:class:`SessionEnded`, and a new session must be started.
"""
from __future__ import annotations

import dataclasses
import json
import marshal
import os
import selectors
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from .run import popen
from .errors import SandboxError
from .plan.plan import compile_plan, prepare
from .proc.stdio import fill_closed
from .policy.policy import LAYERS, Policy
from .policy.resolve import resolve
from .sandbox import Sandbox

__all__ = ["Session", "SessionEnded", "SessionResult"]

#: The interpreter the zygote runs with: the sandbox's own (a system root), never the
#: runtime's venv, which the view does not hold.
PYTHON = "/usr/bin/python3"
#: How long the zygote may take to say it is ready.
START_TIMEOUT = 30.0
#: After a command ended, how long its output is still read while something else (a leftover
#: left running, or a process it passed its stdout to) holds the pipes open.
DRAIN = 1.0
#: After a timeout's kill, how long the run waits for the command's end and the pipes' EOF.
GRACE = 1.0
_SOURCE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "zygote.py")


class SessionEnded(SandboxError):
    """The session's confined run ended (closed, killed, or its zygote died)."""


@dataclass
class SessionResult:
    """One command's end: like :class:`subprocess.CompletedProcess`, plus what it left.

    ``leftovers``: what became of the processes the command started that were still there
    when it ended (or timed out): "none"; "killed" (on_exit = "kill", or a timeout: its whole
    tree, setsid'd processes too); "running" (on_exit = "wait": they live on, in the command's
    Landlock domain, until they exit or the session ends); "unknown" (its keeper was killed).
    ``abandoned``: the output pipes were still held open :data:`DRAIN` s after the command
    ended (or :data:`GRACE` s after its timeout kill), by a leftover left running or by a
    process the command passed them to; the read stopped there, and what they write later is
    lost (they get EPIPE). ``protected_sweep``: what the command (or anything else in the
    session) left at a missing protected name, removed once the command ended (path: what
    was done), as a run's receipt has it (docs/policy.md, "Protected names")."""

    args: list[str]
    returncode: int
    stdout: bytes
    stderr: bytes
    timed_out: bool = False
    truncated: bool = False
    leftovers: str = "none"
    abandoned: bool = False
    protected_sweep: dict[str, str] = field(default_factory=dict)


@dataclass
class _Pending:
    pid: int | None = None
    status: int | None = None
    leftovers: str = "unknown"
    error: int | None = None
    done: threading.Event = field(default_factory=threading.Event)
    started: threading.Event = field(default_factory=threading.Event)
    # written once when done is set, so that a read blocked on the pipes wakes up; closed
    # under the lock, so that a late finish() never writes to a reused fd number
    wake: tuple[int, int] = field(default_factory=os.pipe)
    lock: threading.Lock = field(default_factory=threading.Lock)
    closed: bool = False

    def finish(self) -> None:
        with self.lock:
            if not self.done.is_set():
                self.done.set()
                if not self.closed:
                    os.write(self.wake[1], b"x")

    def close(self) -> None:
        with self.lock:
            if not self.closed:
                self.closed = True
                os.close(self.wake[0])
                os.close(self.wake[1])


class Session:
    """One lasting confinement under ``sandbox``'s policy; :meth:`run` runs a command in it.

    Thread-safe: commands run in parallel. Starting costs one confined run (plus the
    interpreter's start, ~20 ms); each command then costs a plan, a fork and an exec.
    """

    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox
        self.policy = sandbox.policy
        fill_closed()  # the control socket below must not be where the zygote's stdio is
        self._unlisted: Policy | None = None  # the policy of run(ours=True), made once
        with open(_SOURCE_PATH, encoding="utf-8") as f:
            source = f.read()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._ctl = ours
        self._lock = threading.Lock()  # guards _pending, _next_id, _ended
        self._send_lock = threading.Lock()
        self._sweep_lock = threading.Lock()  # one sweep at a time (commands end in parallel)
        self._pending: dict[int, _Pending] = {}
        self._next_id = 1
        self._ended: str | None = None
        argv = [PYTHON, "-I", "-S", "-c", source]
        if self.policy.on_exit == "kill":
            argv.append("kill-rest")
        # the zygote itself is ours, not the agent's: run whatever the allow-list says (every
        # command it starts is checked against the allow-list here, in run())
        zygote_box = Sandbox(dataclasses.replace(self.policy, allow_bins=()),
                             executor=sandbox.executor)
        try:
            self._proc = zygote_box.spawn(argv, stdin=theirs.fileno(),
                                          stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL)
        finally:
            theirs.close()
        receipt = self._proc.receipt
        self.receipt = receipt
        self.layers = frozenset(name for name in LAYERS
                                if receipt["layers"][name]["status"] == "enforced")
        ours.settimeout(START_TIMEOUT)
        try:
            hello = json.loads(ours.recv(4096) or b"{}")
        except (OSError, ValueError) as e:
            self._kill()
            raise SessionEnded(f"session: the zygote did not start ({e})") from None
        finally:
            ours.settimeout(None)
        if "ready" not in hello:
            self._kill()
            raise SessionEnded(f"session: the zygote did not start: "
                               f"{hello.get('fatal', 'it ended')}")
        #: the zygote's pid here (outside the sandbox's pid namespace), for observers
        self.zygote_pid = _host_pid(self._proc.pid, int(hello["ready"]))
        self._reader = threading.Thread(target=self._read, name="hcp-session", daemon=True)
        self._reader.start()

    # --- the runtime's side of the channel ------------------------------------------------

    def _read(self) -> None:
        """Dispatch each message to the command it is about; at EOF, end every command."""
        why = "the session's zygote ended"
        try:
            while True:
                data = self._ctl.recv(65536)
                if not data:
                    break
                msg = json.loads(data)
                with self._lock:
                    p = self._pending.get(msg.get("id"))
                if p is None:
                    continue
                if "pid" in msg:
                    p.pid = msg["pid"]
                    p.started.set()
                elif "error" in msg:
                    p.error = int(msg["error"])
                    p.started.set()
                    p.finish()
                elif "status" in msg:
                    p.status = int(msg["status"])
                    p.leftovers = str(msg.get("leftovers", "unknown"))
                    p.started.set()
                    p.finish()
        except (OSError, ValueError) as e:
            why = f"the session's channel failed ({e})"
        with self._lock:
            self._ended = self._ended or why
            pending = list(self._pending.values())
        # whatever ended the channel, end the run: nothing may outlive its session (with
        # on_exit = "wait" a run would otherwise wait for what its commands left behind)
        try:
            self._proc.kill()
        except OSError:
            pass
        for p in pending:
            p.started.set()
            p.finish()

    def _send(self, obj: dict, fds: Sequence[int] = ()) -> None:
        # marshal, version 4: the zygote reads it without importing json (and re); every
        # Python 3 since 3.4 reads it, whatever version runs the runtime
        data = marshal.dumps(obj, 4)
        with self._send_lock:
            if fds:
                socket.send_fds(self._ctl, [data], list(fds))
            else:
                self._ctl.send(data)

    # --- commands -----------------------------------------------------------------------------

    def run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
            cwd: str | None = None, timeout: float | None = None,
            output_cap: int | None = None, input: bytes | None = None,
            ours: bool = False) -> SessionResult:
        """Run ``argv`` in the session: planned as :meth:`Sandbox.run` plans it (allow-list,
        env, cwd; PolicyError when refused), stdin /dev/null (or a pipe that ``input`` is
        written to, then closed; a command that does not read it all gets EOF or EPIPE, not
        a hang), output captured (at most ``output_cap`` bytes of each stream are kept;
        default the policy's output limit). ``timeout`` (default the policy's) kills the
        command and every process it started; the result says ``timed_out``, and it comes
        back within ``timeout`` + :data:`GRACE` s whatever holds the pipes. Raises
        :class:`SessionEnded` if the session ends first.

        ``ours``: the command is the runtime's own helper, not the agent's (a framework
        adapter's file reader, say): the allow-list is not asked about it, as it is not
        about the zygote; every layer of the session still confines it."""
        req = self._request(argv, env, cwd, ours)
        cap = output_cap if output_cap is not None else self.policy.limits.output
        limit = timeout if timeout is not None else self.policy.timeout
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        in_w = None
        if input is None:
            null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        else:
            null, in_w = os.pipe2(os.O_CLOEXEC)
            os.set_blocking(in_w, False)
        stdin = [in_w]  # _collect owns in_w once called, and closes it (stdin[0] = None)
        pending = _Pending()
        ident = self._register(pending, (out_r, out_w, err_r, err_w, null, in_w))
        try:
            try:
                self._send({**req, "id": ident}, (null, out_w, err_w))
            except OSError as e:
                raise SessionEnded(f"session: cannot reach the zygote ({e.strerror})") from None
            finally:
                for fd in (null, out_w, err_w):
                    os.close(fd)
            if not pending.started.wait(limit):
                # a zygote that does not even say it forked (stopped, starved): end the
                # session, which kills every process in it; fail closed
                self.close()
                raise SessionEnded(f"session: the zygote did not start {argv[0]} within "
                                   f"{limit} s; the session was ended")
            if pending.error is not None:
                raise OSError(pending.error, f"{os.strerror(pending.error)}: {argv[0]}")
            if pending.pid is None:
                raise SessionEnded(f"session: {self._ended}")
            out, err, timed_out, truncated, abandoned = self._collect(
                ident, pending, out_r, err_r, limit, cap, stdin, input)
            if pending.status is None:
                raise SessionEnded(f"session: {self._ended} while {argv[0]} ran")
            # the command has ended: what it planted at a missing protected name goes now,
            # not when the session ends (a leftover left running can plant again: the
            # session's end sweeps once more)
            with self._sweep_lock:
                swept = self._proc.sweep_protected()
            return SessionResult(list(argv), pending.status, out, err, timed_out, truncated,
                                 pending.leftovers, abandoned, swept)
        finally:
            for left in (out_r, err_r, stdin[0]):
                try:
                    if left is not None:
                        os.close(left)
                except OSError:
                    pass
            pending.close()
            with self._lock:
                self._pending.pop(ident, None)

    def _request(self, argv: Sequence[str], env: Mapping[str, str] | None,
                 cwd: str | None, ours: bool) -> dict[str, Any]:
        """The zygote's run request for ``argv``: the same checks and plan as
        Sandbox.spawn's (env granted, cwd inside the view, the allow-list asked about
        argv[0], unless ``ours``); PolicyError when refused."""
        policy = self.policy
        if ours and policy.allow_bins:
            if self._unlisted is None:
                self._unlisted = resolve(dataclasses.replace(policy, allow_bins=()))
            policy = self._unlisted
        plan = compile_plan(policy, list(argv), layers=self.layers,
                            env=popen.granted_env(env), cwd=popen.working_dir(cwd))
        try:
            prepare(plan)  # without a view: its HOME and TMPDIR, as a run's spawn makes them
            return {"op": "run", "exe": os.fsdecode(plan.exe),
                    "argv": [os.fsdecode(a) for a in plan.argv],
                    "env": [[os.fsdecode(k), os.fsdecode(v)] for k, v in plan.env.items()],
                    "cwd": os.fsdecode(plan.cwd)}
        finally:
            plan.close()

    def _register(self, pending: _Pending, fds: tuple[int | None, ...]) -> int:
        """A new command's id, with ``pending`` waiting for the zygote's answers; when the
        session has ended, ``fds`` and ``pending`` are closed and SessionEnded raised."""
        with self._lock:
            if self._ended:
                for fd in fds:
                    if fd is not None:
                        os.close(fd)
                pending.close()
                raise SessionEnded(f"session: {self._ended}")
            ident = self._next_id
            self._next_id += 1
            self._pending[ident] = pending
            return ident

    def _collect(self, ident: int, pending: _Pending, out_r: int, err_r: int,
                 limit: float | None, cap: int | None,
                 stdin: list[int | None] | None = None, data: bytes | None = None
                 ) -> tuple[bytes, bytes, bool, bool, bool]:
        """Read both streams until they end and the command has ended, keeping at most
        ``cap`` bytes of each, while ``data`` is written to ``stdin[0]`` (non-blocking, in
        the same loop, so that a command that writes before it reads cannot deadlock us); at
        its end, or once the command stops reading (EPIPE) or has ended, that fd is closed
        and ``stdin[0]`` set to None. Past ``limit`` s, kill the command (its keeper kills
        its whole tree) and give it :data:`GRACE` s more; once it has ended, give whatever
        still holds the pipes :data:`DRAIN` s. Then stop reading (the pipes are abandoned); a
        command that has not ended by then ends the session (fail closed: everything in it
        is killed). Returns (stdout, stderr, timed out, truncated, abandoned)."""
        bufs = {out_r: bytearray(), err_r: bytearray()}
        truncated = timed_out = abandoned = False
        deadline = None if limit is None else time.monotonic() + limit
        give_up: float | None = None  # when the read stops, whatever holds the pipes
        todo = memoryview(data if data is not None else b"")
        in_w = stdin[0] if stdin else None

        def close_stdin() -> None:
            assert stdin is not None and in_w is not None
            if in_w in sel.get_map():
                sel.unregister(in_w)
            os.close(in_w)
            stdin[0] = None

        with selectors.DefaultSelector() as sel:
            for fd in (out_r, err_r, pending.wake[0]):
                sel.register(fd, selectors.EVENT_READ)
            if in_w is not None:
                if todo:
                    sel.register(in_w, selectors.EVENT_WRITE)
                else:
                    close_stdin()  # empty input: EOF at once
            while True:
                now = time.monotonic()
                ended = pending.done.is_set()
                if ended and stdin and stdin[0] is not None:
                    close_stdin()  # nobody reads it any more
                if ended and not any(fd in bufs for fd in sel.get_map()):
                    break
                if deadline is not None and now >= deadline and not timed_out:
                    timed_out = True
                    self.kill(ident)
                    give_up = now + GRACE
                if ended and give_up is None:
                    give_up = now + DRAIN
                if give_up is not None and now >= give_up:
                    if not ended:
                        self.close()
                        raise SessionEnded(f"session: command {ident} did not end within "
                                           f"{GRACE} s of its kill; the session was ended")
                    abandoned = True
                    break
                wake = [t for t in (None if timed_out else deadline, give_up) if t is not None]
                for key, _ in sel.select(min(wake) - now if wake else None):
                    if key.fd == pending.wake[0]:
                        sel.unregister(key.fd)
                        continue
                    if key.fd == in_w:
                        try:
                            todo = todo[os.write(in_w, todo[:65536]):]
                        except BlockingIOError:
                            continue
                        except OSError:  # EPIPE: the command no longer reads its stdin
                            todo = todo[:0]
                        if not todo:
                            close_stdin()
                        continue
                    chunk = os.read(key.fd, 65536)
                    if not chunk:
                        sel.unregister(key.fd)
                        continue
                    buf = bufs[key.fd]
                    room = len(chunk) if cap is None else max(0, cap - len(buf))
                    truncated = truncated or room < len(chunk)
                    buf += chunk[:room]
        return bytes(bufs[out_r]), bytes(bufs[err_r]), timed_out, truncated, abandoned

    def kill(self, ident: int, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to one command's process group (by its keeper, inside); SIGKILL
        kills every process the command started, whatever its group."""
        try:
            self._send({"op": "kill", "id": ident, "signal": int(sig)})
        except OSError:
            pass  # the session is gone: so is the command

    @property
    def alive(self) -> bool:
        with self._lock:
            return self._ended is None

    def close(self) -> None:
        """End the session: every command still running is killed with it (its pid namespace
        ends), and the zygote is reaped."""
        with self._lock:
            self._ended = self._ended or "the session was closed"
        try:
            self._ctl.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._kill()
        self._reader.join(timeout=5)
        self._ctl.close()

    def _kill(self) -> None:
        self._proc.kill()
        self._proc.wait()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()



def _host_pid(root: int, inner: int) -> int | None:
    """The pid, as this process sees it, of the descendant of ``root`` whose pid in its own
    (innermost) pid namespace is ``inner``; None when there is none (it ended)."""
    todo, seen = [root], set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            with open(f"/proc/{pid}/status") as f:
                nspid = next((line.split()[1:] for line in f if line.startswith("NSpid:")), [])
            if pid != root and nspid and int(nspid[-1]) == inner:
                return pid
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            continue
    return None
