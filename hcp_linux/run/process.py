"""A running confined command, shaped like :class:`subprocess.Popen`: what a spawn hands back.

Its ``pid`` is the run's monitor, whichever executor started it; waiting, killing and
communicating go through :mod:`hcp_linux.proc.teardown`, so they do not depend on the executor.
"""
from __future__ import annotations

import codecs
import os
import selectors
import signal
import subprocess
import time
from typing import IO, Any

from .. import receipt_keys as keys
from ..protocol import init_report
from ..policy import protected
from ..proc import teardown
from ..observe.denials import complete
from .popen import Stdio

#: The parent's ends as spawn made them before Popen's options existed: unbuffered binary.
RAW = Stdio(bufsize=0)


class SandboxProcess:
    """A running confined command, shaped like :class:`subprocess.Popen`.

    ``pid`` is the monitor process. ``send_signal`` asks: the monitor forwards SIGTERM,
    SIGINT and SIGHUP to the command through the sandbox's init. ``kill`` (and a timeout)
    acts: the runtime SIGKILLs the init itself, whatever state the monitor is in, and the
    kernel empties the pid namespace (see :mod:`hcp_linux.proc.teardown`).
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
        self._denials: Any = None  # the seccomp listener answering this run's denials
        self._landlock: Any = None  # the watch on this run's Landlock audit records
        self._monitor = teardown.Monitor(pid, pidns)
        # with a pid namespace: the init writes the command's wait status here once every
        # process of the run is gone, before the namespaces are torn down
        self._done = done
        self._ended_by: str | None = None  # "kill", "timeout": who ended the run early
        # how the run ended as the init's report tells (hcp_linux.protocol.init_report), when
        # nobody here ended it: "lost" when the init ended without one (killed from outside)
        self._init_said = "exit"
        # the protected names to sweep once the run is over (hcp_linux.policy.protected.sweep),
        # and the search for what it made below the top level (sweep_made), since when
        self._sweep: tuple = ()
        self._after: Any = None
        self._since = 0
        # the record of that sweep, for a later run should this runtime die before it
        # (hcp_linux.policy.protected.pending): removed once the sweep is done
        self._owed: str | None = None

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
                teardown.reaper().reap(self.pid, escalate=False)
            self._monitor.close()
            if self._done is not None:
                os.close(self._done)
        except Exception:  # noqa: BLE001 - interpreter shutdown: nothing left to do
            pass

    def observe(self, *, sweep: tuple | None = None, after: Any = None, since: int = 0,
                owed: str | None = None, denials: Any = None, landlock: Any = None,
                proxy: Any = None) -> None:
        """Attach what watches this run, as the spawn makes it (each given once): the
        protected names to sweep at its end, the seccomp listener answering its denials,
        the watch on its Landlock audit records, the egress proxy serving it. Each is
        finished when the run's end is seen (:meth:`_set_status`)."""
        if sweep is not None:
            self._sweep = sweep
        if after is not None:
            self._after = after
        if since:
            self._since = since
        if owed is not None:
            self._owed = owed
        if denials is not None:
            self._denials = denials
        if landlock is not None:
            self._landlock = landlock
        if proxy is not None:
            self._proxy = proxy

    def helper_status(self, timeout: float) -> int | None:
        """The run's monitor's raw wait status if it has ended within ``timeout`` s (died
        on its own: the OOM killer, an operator), else None."""
        return self._monitor.wait(timeout)

    def sweep_protected(self) -> dict[str, str]:
        """Sweep the run's missing protected names now, while it goes on (a session, after
        each command); the run's end sweeps again. Returns each path acted on and what was
        done (hcp_linux.policy.protected.sweep)."""
        return protected.sweep_run(self._sweep, self._after, self._since)

    def _set_status(self, status: int) -> int:
        self.returncode = os.waitstatus_to_exitcode(status)
        if self._monitor.status is not None:  # reaped here, not by the reaper: its fds go
            self._monitor.close()
        if self._proxy is not None:  # the run is over: so is its way out
            self._proxy.stop()
            self._proxy = None
        if "denial_layers" in self.receipt and "denials" not in self.receipt:  # once
            complete(self.receipt, self._denials, self._landlock)
            self._denials = self._landlock = None
        sweep, self._sweep = self._sweep, ()
        after, self._after = self._after, None
        if sweep or after is not None:  # every process of the run is gone: what it left at
            # a protected name goes
            done = protected.sweep_run(sweep, after, self._since)
            keys.set_protected_sweep(self.receipt, done)
        owed, self._owed = self._owed, None
        if owed is not None:
            from ..policy.protected.pending import paid
            paid(owed)
        keys.set_end(self.receipt, self._ended_by or self._init_said, self._monitor.notes)
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
        raw, self._init_said = init_report(data)
        if raw is None:
            return None
        status = self._set_status(raw)
        self._monitor.close()
        teardown.reaper().reap(self.pid)
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
