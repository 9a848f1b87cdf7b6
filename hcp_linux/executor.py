"""The parent side of a spawn: fork, learn whether the child reached exec, hand back a process.

Modelled on CPython's _posixsubprocess protocol: the child reports a failing step and its
errno over a close-on-exec pipe; EOF on that pipe means execve succeeded.
"""
from __future__ import annotations

import codecs
import errno
import fcntl
import io
import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import time
from typing import IO, Any, Callable

from . import child_main, native, spawner, teardown
from .errors import ChildSetupError, SetupTimeoutError
from .plan import Plan
from .popen import Stdio
from .protocol import PROXY_ADDRESS, decode_error_record

PIPE = subprocess.PIPE
DEVNULL = subprocess.DEVNULL
STDOUT = subprocess.STDOUT

#: The parent's ends as spawn made them before Popen's options existed: unbuffered binary.
RAW = Stdio(bufsize=0)


class SandboxProcess:
    """A running confined command, shaped like :class:`subprocess.Popen`.

    ``pid`` is the monitor process. ``send_signal`` asks: the monitor forwards SIGTERM,
    SIGINT and SIGHUP to the command through the sandbox's init. ``kill`` (and a timeout)
    acts: the runtime SIGKILLs the init itself, whatever state the monitor is in, and the
    kernel empties the pid namespace (see :mod:`hcp_linux.teardown`).
    """

    def __init__(self, pid: int, stdin: IO[Any] | None, stdout: IO[Any] | None,
                 stderr: IO[Any] | None, receipt: dict[str, Any], *,
                 pidns: bool = False, done: int | None = None, args: Any = None,
                 stdio: Stdio = RAW) -> None:
        self.pid = pid
        self.args = args  # as the caller gave them, as Popen.args
        self.stdin, self.stdout, self.stderr = stdin, stdout, stderr
        self.receipt = receipt
        self.returncode: int | None = None
        self.truncated: set[str] = set()
        # text mode (Popen's text/universal_newlines/encoding/errors): the streams are
        # TextIOWrappers, communicate() takes and returns str
        self.text_mode = stdio.text
        self.encoding, self.errors = stdio.encoding, stdio.errors
        self._chunks: dict[str, list[bytes]] = {}  # communicate() state across calls
        self._pending_in: memoryview | None = None
        self._proxy: Any = None  # the egress proxy serving this run (network = "allow")
        self._monitor = teardown.Monitor(pid, pidns)
        # with a pid namespace: the init writes the command's wait status here once every
        # process of the run is gone, before the namespaces are torn down
        self._done = done
        self._ended_by: str | None = None  # "kill", "timeout": who ended the run early

    @property
    def universal_newlines(self) -> bool:
        """Popen's alias of :attr:`text_mode`."""
        return self.text_mode

    def __repr__(self) -> str:
        return f"<SandboxProcess: returncode: {self.returncode} args: {self.args!r}>"

    def __enter__(self) -> "SandboxProcess":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        """As Popen's: close the pipes, then wait for the run to end. On KeyboardInterrupt
        Popen waits a moment for a child that got the terminal's SIGINT too; a sandboxed
        command is in a session of its own and never got it, so the whole sandbox is
        killed instead (no path out of the block leaves it running unseen)."""
        try:
            for stream in (self.stdout, self.stderr):
                if stream is not None:
                    stream.close()
            if self.stdin is not None:
                try:  # flushing a buffered writer may raise (BrokenPipeError)
                    self.stdin.close()
                except BrokenPipeError:
                    pass
        finally:
            if exc_type is not None and issubclass(exc_type, KeyboardInterrupt):
                self.kill()
            self.wait()

    def __del__(self) -> None:
        """Dropped without a wait: the run goes on (as a Popen's child would); the reaper
        reaps its monitor when it ends, so it never stays a zombie."""
        try:
            if self.returncode is None and self._monitor.status is None:
                _reaper().reap(self.pid, escalate=False)
            self._monitor.close()
            if self._done is not None:
                os.close(self._done)
        except Exception:  # noqa: BLE001 - interpreter shutdown: nothing left to do
            pass

    def _set_status(self, status: int) -> int:
        self.returncode = os.waitstatus_to_exitcode(status)
        if self._monitor.status is not None:  # reaped here, not by the reaper: its fds go
            self._monitor.close()
        if self._proxy is not None:  # the run is over: so is its way out
            self._proxy.stop()
            self._proxy = None
        end: dict[str, Any] = {"by": self._ended_by or "exit"}
        if self._monitor.notes:
            end["notes"] = list(self._monitor.notes)
        self.receipt["end"] = end
        return self.returncode

    def _reported(self) -> int | None:
        """The init's report on the done pipe (readable): the command's wait status, or None
        when the init ended without one (killed, failed); then the monitor's status stands.
        The monitor, still tearing the namespaces down, is reaped in the background."""
        assert self._done is not None
        try:
            data = os.read(self._done, 4)
        finally:
            os.close(self._done)
            self._done = None
        self._monitor.over()  # the init is gone: the monitor's time to exit counts
        if len(data) != 4:
            return None
        status = self._set_status(struct.unpack("<i", data)[0])
        self._monitor.close()
        _reaper().reap(self.pid)
        return status

    def poll(self) -> int | None:
        if self.returncode is None and self._done is not None:
            if not teardown.readable(self._done, 0) or self._reported() is not None:
                return self.returncode
        if self.returncode is None:
            status = self._monitor.poll()
            if status is not None:
                self._set_status(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is not None:
            return self.returncode
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._done is not None:
            if not teardown.readable(self._done, timeout):
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            if self._reported() is not None:
                return self.returncode  # type: ignore[return-value]
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        status = self._monitor.wait(remaining)
        if status is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return self._set_status(status)

    def end_fd(self) -> tuple[int, bool]:
        """An fd that turns readable when the run is over, for an event loop to watch, and
        whether the caller must close it: the init's report pipe, else a pidfd of the
        monitor. Then call :meth:`wait`, which does not block."""
        if self._done is not None:
            return self._done, False
        return os.pidfd_open(self.pid), True

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """Kill the whole sandbox, by the runtime's own hand (no helper is asked). With a pid
        namespace ``wait()`` returning means no process of the run is left (up to
        ``teardown.TEARDOWN_WAIT``; the receipt's ``end.notes`` says when not). Without one,
        SIGKILL the run's session."""
        self._end("kill")

    def _end(self, by: str) -> None:
        if self.returncode is not None:
            return
        self._ended_by = self._ended_by or by
        self._monitor.kill()

    def communicate(self, input: Any = None, timeout: float | None = None,
                    max_bytes: int | None = None) -> tuple[Any, Any]:
        """Feed stdin, collect stdout/stderr until EOF, then wait. Like Popen.communicate,
        including a second call after TimeoutExpired that goes on where the first stopped
        (the exception carries the output so far, as bytes, as Popen's does), and text mode:
        ``input`` is then a str, encoded as ``stdin`` is, and the output is decoded as each
        stream is, with newlines translated.

        With ``max_bytes``, each stream keeps at most that much and the rest is read and
        discarded (the command is never blocked on a full pipe); ``truncated`` names the
        streams that were cut (in text mode a character cut in two is dropped).
        """
        if self._pending_in is not None and input:
            raise ValueError("Cannot send input after starting communication")
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._pending_in is None:
            if input is not None and self.text_mode and self.stdin is not None:
                stdin: Any = self.stdin  # a TextIOWrapper
                input = input.encode(stdin.encoding, stdin.errors)
            self._pending_in = memoryview(input or b"")
            if self.stdin is not None and not self.stdin.closed:
                try:  # what the caller wrote to a buffered stdin goes first, as with Popen
                    self.stdin.flush()
                except BrokenPipeError:
                    pass
        names = {id(s): n for s, n in ((self.stdout, "stdout"), (self.stderr, "stderr"))}
        with selectors.DefaultSelector() as sel:
            if self.stdin is not None and not self.stdin.closed:
                if self._pending_in:
                    os.set_blocking(self.stdin.fileno(), False)
                    sel.register(self.stdin, selectors.EVENT_WRITE)
                else:
                    _close(self.stdin)
            for stream in (self.stdout, self.stderr):
                if stream is not None and not stream.closed:
                    self._chunks.setdefault(names[id(stream)], [])
                    sel.register(stream, selectors.EVENT_READ)
            while sel.get_map():
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise subprocess.TimeoutExpired(self.args, timeout or 0,
                                                    *self._collected())
                for key, _ in sel.select(remaining):
                    ready: Any = key.fileobj
                    if ready is self.stdin:
                        self._write_some(sel)
                        continue
                    data = os.read(key.fd, 65536)
                    if not data:
                        sel.unregister(ready)
                        ready.close()
                        continue
                    name = names[id(ready)]
                    kept = sum(map(len, self._chunks[name]))
                    room = len(data) if max_bytes is None else max(0, max_bytes - kept)
                    if room < len(data):
                        self.truncated.add(name)
                    if room:
                        self._chunks[name].append(data[:room])
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            self.wait(remaining)
        except subprocess.TimeoutExpired as e:
            e.output, e.stderr = self._collected()
            raise
        return self._output()

    def _collected(self) -> tuple[bytes | None, bytes | None]:
        """The bytes read so far from stdout and stderr (None: not a pipe, or nothing yet),
        as Popen puts them in a TimeoutExpired."""
        return tuple(b"".join(self._chunks[n]) if self._chunks.get(n) else None  # type: ignore
                     for n in ("stdout", "stderr"))

    def _output(self) -> tuple[Any, Any]:
        """communicate()'s result: each piped stream's bytes, or text in text mode."""
        out: list[Any] = []
        for stream, name in ((self.stdout, "stdout"), (self.stderr, "stderr")):
            if stream is None:
                out.append(None)
                continue
            data = b"".join(self._chunks.get(name, []))
            if self.text_mode:
                out.append(_decode(data, stream, cut=name in self.truncated))
            else:
                out.append(data)
        return out[0], out[1]

    def finish(self, input: Any = None, timeout: float | None = None,
               max_bytes: int | None = None) -> tuple[Any, Any, bool]:
        """Run to the end: communicate, and kill the whole sandbox on timeout or on any
        exception (a cancel), so no path leaves it running. Returns (stdout, stderr,
        timed_out). After a kill, what the streams still hold is read for
        ``teardown.TEARDOWN_WAIT`` at most (a process that cannot die yet may hold them)."""
        try:
            out, err = self.communicate(input, timeout=timeout, max_bytes=max_bytes)
            return out, err, False
        except subprocess.TimeoutExpired:
            self._end("timeout")
            out, err = self._drain(max_bytes)
            return out, err, True
        except BaseException:
            self.kill()
            self.wait()
            raise

    def _drain(self, max_bytes: int | None) -> tuple[Any, Any]:
        """After a kill: the rest of the output, within bounds; then the status."""
        try:
            return self.communicate(max_bytes=max_bytes, timeout=teardown.TEARDOWN_WAIT)
        except subprocess.TimeoutExpired:
            for stream in (self.stdin, self.stdout, self.stderr):
                if stream is not None:
                    _close(stream)
            self.wait()
            return self._output()

    def _write_some(self, sel: selectors.BaseSelector) -> None:
        assert self.stdin is not None and self._pending_in is not None
        try:
            n = os.write(self.stdin.fileno(), self._pending_in[:65536])
        except BrokenPipeError:  # the command stopped reading: drop the rest, like Popen
            n = len(self._pending_in)
        self._pending_in = self._pending_in[n:]
        if not self._pending_in:
            sel.unregister(self.stdin)
            _close(self.stdin)


def _close(stream: IO[Any]) -> None:
    """Close a stream whose reader may be gone: a buffered writer's flush would raise."""
    try:
        stream.close()
    except BrokenPipeError:
        pass


def _decode(data: bytes, stream: Any, cut: bool) -> str:
    """Text mode: ``data`` decoded as ``stream`` (a TextIOWrapper) decodes, newlines
    translated, as Popen.communicate does. A stream ``cut`` at max_bytes may end inside a
    character: that partial character is dropped, not an error."""
    if cut:
        text = codecs.getincrementaldecoder(stream.encoding)(stream.errors).decode(data)
    else:
        text = data.decode(stream.encoding, stream.errors)
    return text.replace("\r\n", "\n").replace("\r", "\n")


_reaper = teardown.reaper  # this process's reaper


def _stdio_fd(spec: Any, index: int, to_close: list[int], pipesize: int = -1
              ) -> tuple[int, int | None]:
    """(fd for the child, parent's end of a pipe or None). ``pipesize`` > 0: the capacity
    asked of a pipe made here (F_SETPIPE_SZ, as Popen's pipesize)."""
    if spec is None:
        return index, None
    if spec == PIPE:
        r, w = os.pipe2(os.O_CLOEXEC)
        if index == 0:
            to_close.append(r)
            end = w
        else:
            to_close.append(w)
            end = r
        try:
            if pipesize > 0:
                fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, pipesize)
        except BaseException:
            os.close(end)
            raise
        return (r, w) if index == 0 else (w, r)
    if spec == DEVNULL:
        fd = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        to_close.append(fd)
        return fd, None
    if isinstance(spec, int):
        if spec < 0:
            raise ValueError(f"{('stdin', 'stdout', 'stderr')[index]}: invalid file "
                             f"descriptor {spec}")
        return spec, None
    if hasattr(spec, "fileno"):
        return spec.fileno(), None
    raise TypeError(f"unsupported stdio value: {spec!r}")


def _open_streams(ends: list[int | None], stdio: Stdio) -> list[IO[Any] | None]:
    """The parent's ends of the standard streams' pipes as file objects, as Popen opens
    them: binary with ``bufsize``, then, in text mode, a TextIOWrapper over each (stdin's
    writes through)."""
    streams: list[IO[Any] | None] = []
    for i, end in enumerate(ends):
        if end is None:
            streams.append(None)
            continue
        f: Any = io.open(end, "wb" if i == 0 else "rb", stdio.bufsize)
        if stdio.text and i == 0:
            f = io.TextIOWrapper(f, encoding=stdio.encoding, errors=stdio.errors,
                                 write_through=True, line_buffering=stdio.line_buffering)
        elif stdio.text:
            f = io.TextIOWrapper(f, encoding=stdio.encoding, errors=stdio.errors)
        streams.append(f)
    return streams


def spawn(plan: Plan, *, stdin: Any = None, stdout: Any = None, stderr: Any = None,
          receipt: dict[str, Any] | Callable[[], dict[str, Any]] | None = None,
          executor: str | None = None, setup_timeout: float | None = None,
          stdio: Stdio = RAW, args: Any = None) -> SandboxProcess:
    """Start the confined command. Raises ChildSetupError when a setup step failed.
    ``stdin``/``stdout``/``stderr`` as Popen's (``stderr=STDOUT``: the command's stderr is
    its stdout, whatever that is); ``stdio``: how the parent's ends are opened (buffering,
    text mode, pipe size); ``args``: the process's ``args`` (default: the plan's argv).
    ``executor``: "native", "ctypes" or "auto" (None: the process default, see native).
    ``receipt``, given as the function that makes it, is made once the child has the plan,
    while it sets up (it is a function of the plan alone): off the spawn's critical path.

    The setup is bounded: a ready spare that does not confirm the exec within
    ``teardown.SPARE_ANSWER`` seconds is killed and the run started afresh; a setup not done
    within ``setup_timeout`` seconds (default ``teardown.SETUP_TIMEOUT``) is killed and
    raises :class:`SetupTimeoutError`."""
    setup_by = time.monotonic() + (teardown.SETUP_TIMEOUT if setup_timeout is None
                                   else setup_timeout)
    to_close: list[int] = []
    ends: list[int | None] = []
    fds: list[int] = []
    pidns = plan.confined and "pidns" in plan.layers
    try:
        for i, spec in enumerate((stdin, stdout, stderr)):
            if isinstance(spec, int) and not isinstance(spec, bool) and spec == STDOUT:
                if i != 2:
                    raise ValueError(f"{('stdin', 'stdout')[i]}=STDOUT: only stderr can be "
                                     f"sent to stdout")
                fds.append(fds[1])  # the same open file as stdout: one pipe, in order
                ends.append(None)
                continue
            fd, end = _stdio_fd(spec, i, to_close, stdio.pipesize)
            fds.append(fd)
            ends.append(end)
        proxy_end = child_end = -1
        if plan.proxy:
            proxy_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM
                                                      | socket.SOCK_CLOEXEC)
            proxy_end, child_end = proxy_sock.detach(), child_sock.detach()
            ends.append(proxy_end)
            to_close.append(child_end)
        ready_ok = True
        while True:
            pid, ready, err_r, done_r, ran = _start(plan, executor, fds, child_end, pidns,
                                                    ready_ok)
            try:
                if callable(receipt):
                    receipt = receipt()
                answer_by = min(setup_by, time.monotonic() + teardown.SPARE_ANSWER) \
                    if ready else setup_by
                record = _answer(err_r, answer_by)
            except BaseException:  # interrupted (^C) before exec was confirmed: no run left
                _abandon(pid, pidns)
                os.close(err_r)
                if done_r >= 0:
                    os.close(done_r)
                raise
            os.close(err_r)
            if record and ready and _stale_spare(record):
                _abandon(pid, pidns)  # its view predates a change (a mount on the jail)
                if done_r >= 0:
                    os.close(done_r)
                ready_ok = False
                continue
            if record is not None:
                break
            _abandon(pid, pidns)  # no answer in time: it never gets to run the command
            if done_r >= 0:
                os.close(done_r)
            if not ready or time.monotonic() >= setup_by:
                raise SetupTimeoutError(teardown.SETUP_TIMEOUT if setup_timeout is None
                                        else setup_timeout)
            ready_ok = False  # a ready spare did not answer: start one now
    except BaseException:
        for fd in to_close + [e for e in ends if e is not None]:
            os.close(fd)
        raise
    for fd in to_close:
        os.close(fd)
    if record:
        monitor = teardown.Monitor(pid, pidns)
        monitor.over()  # it exits 125 after its report; bounded if it does not
        monitor.wait(None)
        monitor.close()
        for end in ends:
            if end is not None:
                os.close(end)
        if done_r >= 0:
            os.close(done_r)
        step, err, detail = decode_error_record(record)
        raise ChildSetupError(step, err or errno.EIO, detail)
    stdin_f, stdout_f, stderr_f = _open_streams(ends[:3], stdio)
    proc = SandboxProcess(pid, stdin_f, stdout_f, stderr_f,
                          receipt=receipt or {},  # type: ignore[arg-type]
                          pidns="pidns" in plan.layers, done=done_r if done_r >= 0 else None,
                          args=[a.decode() for a in plan.argv] if args is None else args,
                          stdio=stdio)
    proc.receipt["executor"] = ran
    if ready_ok is False:
        proc.receipt.setdefault("spawn", {})["notes"] = [
            f"a ready spare did not answer within {teardown.SPARE_ANSWER:g}s; it was killed "
            f"and the run started afresh"]
    if plan.proxy:
        try:
            proc._proxy = _start_proxy(plan, proxy_end, proc.receipt)
        except BaseException:
            proc.kill()  # no proxy, no run: the command must not go on without its way out
            proc.wait()
            raise
    return proc


def _start(plan: Plan, executor: str | None, fds: list[int], child_end: int, pidns: bool,
           ready_ok: bool) -> tuple[int, bool, int, int, str]:
    """Start one attempt: (monitor pid, whether a ready spare took it, error pipe's read end,
    done pipe's read end or -1, the executor that started it: the receipt's ``executor``). Each attempt has its own error and done pipes: a spare that
    was given up on may hold the last ones until it is gone."""
    done_r = done_w = -1
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    ruleset = None
    try:
        if pidns:
            done_r, done_w = os.pipe2(os.O_CLOEXEC)
        # hcp-exec through posix_spawn; None: the ctypes executor (child_main: a fork of
        # this process while it has one thread, else a fresh helper process)
        started = native.spawn(executor, plan, err_w, fds, child_end, done_w, ready_ok)
        if started is not None:
            (pid, ready), ran = started, "native"
        else:  # the ctypes executor: the child restricts itself with our ruleset
            if plan.landlock is not None:
                ruleset = plan.landlock.create()

            def start() -> int:
                return child_main.start(plan, err_w, (fds[0], fds[1], fds[2]), ruleset,
                                        child_end, done_w, err_r)
            # from a thread that lasts: the run must not die with the spawning thread
            pid, ready, ran = spawner.on_lasting_thread(start), False, "ctypes"
    except BaseException:
        for fd in (err_r, done_r):
            if fd >= 0:
                os.close(fd)
        raise
    finally:
        for fd in (err_w, done_w):
            if fd >= 0:
                os.close(fd)
        if ruleset is not None:
            ruleset.close()
    return pid, ready, err_r, done_r, ran


def _answer(err_r: int, by: float) -> bytes | None:
    """The child's answer on the error pipe: b"" (EOF: it reached exec), a failure record,
    or None when neither came by ``by`` (time.monotonic())."""
    parts: list[bytes] = []
    while True:
        if not teardown.readable(err_r, max(0.0, by - time.monotonic())):
            return None
        chunk = os.read(err_r, 4096)
        if not chunk:
            return b"".join(parts)
        parts.append(chunk)


def _stale_spare(record: bytes) -> bool:
    """Whether a ready spare's failure is its age, not the plan's: a tree it cloned is not
    the one the plan checked (a file system mounted on a granted path since the spare made
    its mount namespace). A spare started now sees what the plan saw."""
    step, err, _ = decode_error_record(record)
    return step == "bind-clone" and err in (errno.ESTALE, errno.ENOENT)


def _abandon(pid: int, pidns: bool) -> None:
    """SIGKILL a run no SandboxProcess owns (a setup that was interrupted or never answered):
    its init, whose exit empties the namespace (the monitor then exits; the reaper reaps it,
    and kills it if it does not). Waits for nothing."""
    monitor = teardown.Monitor(pid, pidns)
    monitor.kill()
    monitor.close()
    _reaper().reap(pid)


def _start_proxy(plan: Plan, channel: int, receipt: dict[str, Any]) -> Any:
    """Receive the listening socket the sandbox made in its namespace; serve the proxy."""
    from .egress import ProxyThread  # off the spawn path unless network = "allow"

    with socket.socket(fileno=channel) as ch:
        _, fds, _, _ = socket.recv_fds(ch, 1, 1)
    if not fds:
        raise ChildSetupError("proxy-listen", errno.EPROTO, "no listening socket received")
    listener = socket.socket(fileno=fds[0])
    decisions: list[dict[str, Any]] = []
    receipt.setdefault("network", {}).update(mode="allow", proxy="%s:%d" % PROXY_ADDRESS,
                                             decisions=decisions,
                                             **plan.policy.egress().describe())
    log_path = plan.policy.proxy_log

    def log(decision: dict[str, Any]) -> None:
        if len(decisions) < 10_000:
            decisions.append(decision)
        if log_path:
            with open(log_path, "a") as f:
                f.write(json.dumps(decision, sort_keys=True) + "\n")

    proxy = ProxyThread(plan.policy.egress(), listener, log=log)
    proxy.start()
    return proxy
