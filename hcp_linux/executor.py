"""The parent side of a spawn: fork, learn whether the child reached exec, hand back a process.

Modelled on CPython's _posixsubprocess protocol: the child reports a failing step and its
errno over a close-on-exec pipe; EOF on that pipe means execve succeeded.
"""
from __future__ import annotations

import errno
import io
import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import threading
import time
from typing import IO, Any, Callable

from . import child, native
from .errors import ChildSetupError
from .plan import Plan

PIPE = subprocess.PIPE
DEVNULL = subprocess.DEVNULL


class SandboxProcess:
    """A running confined command, shaped like :class:`subprocess.Popen`.

    ``pid`` is the monitor process; signalling it reaches the whole sandbox: SIGKILL to the
    monitor kills pid 1 of the sandbox (PDEATHSIG) and with it every process in its namespace.
    """

    def __init__(self, pid: int, stdin: IO[bytes] | None, stdout: IO[bytes] | None,
                 stderr: IO[bytes] | None, receipt: dict[str, Any]) -> None:
        self.pid = pid
        self.stdin, self.stdout, self.stderr = stdin, stdout, stderr
        self.receipt = receipt
        self.returncode: int | None = None
        self.truncated: set[str] = set()
        self._chunks: dict[str, list[bytes]] = {}  # communicate() state across calls
        self._pending_in: memoryview | None = None
        self._proxy: Any = None  # the egress proxy serving this run (network = "allow")
        self._pidns = False  # set by spawn(): the run has a pid namespace and an init
        # set by spawn() with a pid namespace: the init writes the command's wait status here
        # once every process of the run is gone, before the namespaces are torn down
        self._done: int | None = None

    def _set_status(self, status: int) -> int:
        self.returncode = os.waitstatus_to_exitcode(status)
        if self._proxy is not None:  # the run is over: so is its way out
            self._proxy.stop()
            self._proxy = None
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
        if len(data) != 4:
            return None
        _reaper().reap(self.pid)
        return self._set_status(struct.unpack("<i", data)[0])

    def poll(self) -> int | None:
        if self.returncode is None and self._done is not None:
            if not _readable(self._done, 0) or self._reported() is not None:
                return self.returncode
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self._set_status(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is not None:
            return self.returncode
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._done is not None:
            if timeout is not None and not _readable(self._done, timeout):
                raise subprocess.TimeoutExpired(self.pid, timeout)
            if self._reported() is not None:  # without a timeout: a blocking read
                return self.returncode  # type: ignore[return-value]
        if deadline is None:
            _, status = os.waitpid(self.pid, 0)
            return self._set_status(status)
        # pidfd: sleep in the kernel until the monitor exits, no polling loop.
        pidfd = os.pidfd_open(self.pid)
        try:
            if not _readable(pidfd, max(0.0, deadline - time.monotonic())):
                raise subprocess.TimeoutExpired(self.pid, timeout or 0)
        finally:
            os.close(pidfd)
        _, status = os.waitpid(self.pid, 0)
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
        """Kill the whole sandbox. With a pid namespace the monitor kills the sandbox's init
        and exits only once the kernel has emptied the namespace, so ``wait()`` returning
        means no process of the run is left. Without one, SIGKILL the run's session."""
        if self.returncode is not None:
            return
        if self._pidns:
            self.send_signal(child.KILL_REQUEST)
            return
        try:
            os.killpg(self.pid, signal.SIGKILL)  # the session made by setsid
        except ProcessLookupError:
            pass

    def communicate(self, input: bytes | None = None, timeout: float | None = None,
                    max_bytes: int | None = None) -> tuple[bytes | None, bytes | None]:
        """Feed stdin, collect stdout/stderr until EOF, then wait. Like Popen.communicate,
        including a second call after TimeoutExpired that goes on where the first stopped.

        With ``max_bytes``, each stream keeps at most that much and the rest is read and
        discarded (the command is never blocked on a full pipe); ``truncated`` names the
        streams that were cut.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._pending_in is None:
            self._pending_in = memoryview(input or b"")
        names = {id(s): n for s, n in ((self.stdout, "stdout"), (self.stderr, "stderr"))}
        with selectors.DefaultSelector() as sel:
            if self.stdin is not None and not self.stdin.closed:
                if self._pending_in:
                    os.set_blocking(self.stdin.fileno(), False)
                    sel.register(self.stdin, selectors.EVENT_WRITE)
                else:
                    self.stdin.close()
            for stream in (self.stdout, self.stderr):
                if stream is not None and not stream.closed:
                    self._chunks.setdefault(names[id(stream)], [])
                    sel.register(stream, selectors.EVENT_READ)
            while sel.get_map():
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise subprocess.TimeoutExpired(self.pid, timeout or 0)
                for key, _ in sel.select(remaining):
                    stream = key.fileobj
                    if stream is self.stdin:
                        self._write_some(sel)
                        continue
                    data = os.read(key.fd, 65536)
                    if not data:
                        sel.unregister(stream)
                        stream.close()  # type: ignore[union-attr]
                        continue
                    name = names[id(stream)]
                    kept = sum(map(len, self._chunks[name]))
                    room = len(data) if max_bytes is None else max(0, max_bytes - kept)
                    if room < len(data):
                        self.truncated.add(name)
                    if room:
                        self._chunks[name].append(data[:room])
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        self.wait(remaining)
        return tuple(None if stream is None else b"".join(self._chunks.get(name, []))  # type: ignore[return-value]
                     for stream, name in ((self.stdout, "stdout"), (self.stderr, "stderr")))

    def finish(self, input: bytes | None = None, timeout: float | None = None,
               max_bytes: int | None = None) -> tuple[bytes | None, bytes | None, bool]:
        """Run to the end: communicate, and kill the whole sandbox on timeout or on any
        exception (a cancel), so no path leaves it running. Returns (stdout, stderr,
        timed_out)."""
        try:
            out, err = self.communicate(input, timeout=timeout, max_bytes=max_bytes)
            return out, err, False
        except subprocess.TimeoutExpired:
            self.kill()
            out, err = self.communicate(max_bytes=max_bytes)
            return out, err, True
        except BaseException:
            self.kill()
            self.wait()
            raise

    def _write_some(self, sel: selectors.BaseSelector) -> None:
        assert self.stdin is not None and self._pending_in is not None
        try:
            n = os.write(self.stdin.fileno(), self._pending_in[:65536])
        except BrokenPipeError:  # the command stopped reading: drop the rest, like Popen
            n = len(self._pending_in)
        self._pending_in = self._pending_in[n:]
        if not self._pending_in:
            sel.unregister(self.stdin)
            self.stdin.close()


def _readable(fd: int, timeout: float | None) -> bool:
    """Whether ``fd`` is readable (or at EOF) within ``timeout`` seconds (None: no limit)."""
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        return bool(sel.select(timeout))


class _Reaper:
    """Reaps monitors after their run is over. The init reports a run's end as soon as its
    processes are gone; its monitor still has the namespaces to tear down (~0.3 ms), which
    the caller need not wait for. One thread per process, started on first use; it blocks
    every signal so that they reach the runtime's own threads."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.pids: list[int] = []
        self.thread: threading.Thread | None = None

    def reap(self, pid: int) -> None:
        try:
            if os.waitpid(pid, os.WNOHANG)[0]:
                return
        except ChildProcessError:  # someone else reaped it (a waitpid(-1) of the runtime's)
            return
        with self.cond:
            self.pids.append(pid)
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="hcp-linux reaper",
                                               daemon=True)
                self.thread.start()
            self.cond.notify()

    def _run(self) -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        while True:
            with self.cond:
                while not self.pids:
                    self.cond.wait()
                pid = self.pids.pop(0)
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass


_the_reaper: _Reaper | None = None
_reaper_lock = threading.Lock()


def _reaper() -> _Reaper:
    """This process's reaper, started on first use."""
    global _the_reaper
    with _reaper_lock:
        if _the_reaper is None:
            _the_reaper = _Reaper()
        return _the_reaper


def _forget_reaper() -> None:
    """In a forked child: the monitors are not its children, the thread is not there, and
    the lock may have been held by a thread that is gone."""
    global _the_reaper, _reaper_lock
    _the_reaper, _reaper_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_reaper)


def _stdio_fd(spec: Any, index: int, to_close: list[int]) -> tuple[int, int | None]:
    """(fd for the child, parent's end of a pipe or None)."""
    if spec is None:
        return index, None
    if spec == PIPE:
        r, w = os.pipe2(os.O_CLOEXEC)
        if index == 0:
            to_close.append(r)
            return r, w
        to_close.append(w)
        return w, r
    if spec == DEVNULL:
        fd = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        to_close.append(fd)
        return fd, None
    if isinstance(spec, int):
        return spec, None
    if hasattr(spec, "fileno"):
        return spec.fileno(), None
    raise TypeError(f"unsupported stdio value: {spec!r}")


def spawn(plan: Plan, *, stdin: Any = None, stdout: Any = None, stderr: Any = None,
          receipt: dict[str, Any] | Callable[[], dict[str, Any]] | None = None,
          executor: str | None = None) -> SandboxProcess:
    """Fork the confined command. Raises ChildSetupError when a setup step failed.
    ``executor``: "native", "ctypes" or "auto" (None: the process default, see native).
    ``receipt``, given as the function that makes it, is made once the child has the plan,
    while it sets up (it is a function of the plan alone): off the spawn's critical path."""
    to_close: list[int] = []
    ends: list[int | None] = []
    fds: list[int] = []
    ruleset = None
    try:
        for i, spec in enumerate((stdin, stdout, stderr)):
            fd, end = _stdio_fd(spec, i, to_close)
            fds.append(fd)
            ends.append(end)
        proxy_end = child_end = -1
        if plan.proxy:
            proxy_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM
                                                      | socket.SOCK_CLOEXEC)
            proxy_end, child_end = proxy_sock.detach(), child_sock.detach()
            ends.append(proxy_end)
            to_close.append(child_end)
        done_r = done_w = -1
        if plan.confined and "pidns" in plan.layers:
            done_r, done_w = os.pipe2(os.O_CLOEXEC)
            ends.append(done_r)
            to_close.append(done_w)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        to_close.append(err_w)
        try:  # hcp-exec through posix_spawn; None: this process forks the ctypes executor
            pid = native.spawn(executor, plan, err_w, fds, child_end, done_w)
        except BaseException:
            os.close(err_r)
            raise
        if pid is None:  # the ctypes executor: the child restricts itself with our ruleset
            if plan.landlock is not None:
                ruleset = plan.landlock.create()
            pid = os.fork()
        if pid == 0:
            os.close(err_r)
            child.run(plan, err_w, (fds[0], fds[1], fds[2]), ruleset, child_end, done_w)
    except BaseException:
        for fd in to_close + [e for e in ends if e is not None]:
            os.close(fd)
        if ruleset is not None:
            ruleset.close()
        raise
    for fd in to_close:
        os.close(fd)
    if ruleset is not None:
        ruleset.close()
    with io.FileIO(err_r, "r") as f:
        try:
            if callable(receipt):
                receipt = receipt()
            record = f.readall()
        except BaseException:  # interrupted (^C) before exec was confirmed: leave no run behind
            _kill_unowned(pid, ends)
            raise
    if record:
        os.waitpid(pid, 0)
        for end in ends:
            if end is not None:
                os.close(end)
        step_i, err = struct.unpack("<HH", record[:4])
        step = child.STEPS[step_i] if step_i < len(child.STEPS) else "internal"
        raise ChildSetupError(step, err or errno.EIO, record[4:].decode(errors="replace"))
    streams = [None if e is None else os.fdopen(e, "wb" if i == 0 else "rb", buffering=0)
               for i, e in enumerate(ends[:3])]
    proc = SandboxProcess(pid, *streams, receipt=receipt or {})  # type: ignore[arg-type]
    proc._pidns = "pidns" in plan.layers
    proc._done = done_r if done_r >= 0 else None
    if plan.proxy:
        try:
            proc._proxy = _start_proxy(plan, proxy_end, proc.receipt)
        except BaseException:
            proc.kill()  # no proxy, no run: the command must not go on without its way out
            proc.wait()
            raise
    return proc


def _kill_unowned(pid: int, ends: list[int | None]) -> None:
    """SIGKILL a run no SandboxProcess owns yet (its session: the monitor, the sandbox's init
    and with it the namespace), reap it, close our ends of its pipes."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:  # not yet its own session
        os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    for end in ends:
        if end is not None:
            os.close(end)


def _start_proxy(plan: Plan, channel: int, receipt: dict[str, Any]) -> Any:
    """Receive the listening socket the sandbox made in its namespace; serve the proxy."""
    from .egress import ProxyThread  # off the spawn path unless network = "allow"

    with socket.socket(fileno=channel) as ch:
        _, fds, _, _ = socket.recv_fds(ch, 1, 1)
    if not fds:
        raise ChildSetupError("proxy-listen", errno.EPROTO, "no listening socket received")
    listener = socket.socket(fileno=fds[0])
    decisions: list[dict[str, Any]] = []
    receipt.setdefault("network", {}).update(mode="allow", proxy="%s:%d" % child.PROXY_ADDRESS,
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
