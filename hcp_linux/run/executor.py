"""The parent side of a spawn: fork, learn whether the child reached exec, hand back a process.

Modelled on CPython's _posixsubprocess protocol: the child reports a failing step and its
errno over a close-on-exec pipe; EOF on that pipe means execve succeeded. The process handed
back is a :class:`hcp_linux.run.process.SandboxProcess`.
"""
from __future__ import annotations

import errno
import fcntl
import io
import json
import os
import socket
import stat
import subprocess
import time
from dataclasses import dataclass, field
from typing import IO, Any, Callable, Sequence

from .. import receipt_keys as keys
from .. import native
from ..ctypes_executor import child_main
from ..observe import landlock_log
from ..proc import spawner, teardown
from ..proc import stdio as stdio_fds
from ..observe.denials import MAX_RECORDED, SeccompListener, denial_layers, receive_listener
from ..errors import (ChildSetupError, HelperLostError, SandboxError, SetupTimeoutError,
                     printable)
from ..plan.plan import Plan, prepare
from .popen import Stdio
from .process import RAW, SandboxProcess
from ..protocol import (CAPTURE_PORTS_MAX, PROXY_ADDRESS, RESOLVER_ADDRESS, SYNTHETIC_NET,
                       RunFds, decode_error_record)

PIPE = subprocess.PIPE
DEVNULL = subprocess.DEVNULL
STDOUT = subprocess.STDOUT


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


def _refuse_reopenable_stdio(plan: Plan, fds: Sequence[int]) -> None:
    """Without Landlock, refuse standard streams that the command could re-open by path.

    /proc/self/fd/N is a magic link: opening it reaches the very file behind fd N, wherever
    that is, with a fresh open mode; the mount view does not stop it (the jump needs no path
    in the view) and a file's owner passes its own mode bits, so a stdout appended to a
    host log re-opens for reading (and read-write). Landlock stops it: the jump lands on a
    path no rule grants. A plan without Landlock (rung no-landlock) takes only streams that
    re-open to nothing new: pipes, sockets (no open through /proc) and character devices (a
    terminal, /dev/null). A regular file, directory or block device is refused, before
    anything is spawned, with the remedy (a pipe)."""
    if not plan.confined or plan.landlock is not None:
        return
    for i, fd in enumerate(fds):
        try:
            mode = os.fstat(fd).st_mode
        except OSError:
            continue  # not open: the stdio step reports it
        if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or stat.S_ISCHR(mode):
            continue
        name = ("stdin", "stdout", "stderr")[i]
        raise SandboxError(f"{name} is a file the command could re-open through "
                           f"/proc/self/fd/{i} and read or rewrite: without Landlock (this "
                           f"run's rung) nothing stops that; give it a pipe "
                           f"(e.g. {'cat FILE |' if i == 0 else '| cat >FILE'})")


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
    limit = teardown.SETUP_TIMEOUT if setup_timeout is None else setup_timeout
    stdio_fds.fill_closed()  # else a pipe of this run's could land where stdin is inherited
    prepare(plan)  # what the run needs on disk (compile_plan writes nothing)
    if plan.landlock_log:
        landlock_log.prepare()  # subscribed before the run can log anything
    owed, unowed = _owe(plan)
    ran = False
    # the attempt started and owned by nothing yet (its pid, pidns, done pipe): at most one,
    # from its start until a SandboxProcess takes it or it is abandoned
    unowned: list[tuple[int, bool, int]] = []
    try:
        chans = _open_channels(plan, (stdin, stdout, stderr), stdio)
        began = time.time()  # before the run's domain can exist (landlock_log.Watch)
        try:
            started = _start_answered(plan, executor, chans, time.monotonic() + limit, limit,
                                      receipt, unowned)
        except BaseException:
            chans.close()
            raise
        if started.record:  # a step failed: nothing ran
            unowned.clear()
            chans.close_childs()
            _report_failure(started, chans)
        ran = True  # exec'd: from here its record is its sweep's to remove, or a later run's
        proc = _hand_back(plan, started, chans, stdio, args, began, owed, unowned)
    except BaseException:
        if unowned:  # interrupted (^C) or failed while an attempt may have reached its exec
            attempt = unowned.pop()
            if attempt is not UNKNOWN:
                _end_unowned(plan, *attempt, owed)
            # else its record stays, for a later run to sweep once this runtime is gone
        elif owed is not None and not ran:  # nothing ran: nothing to sweep
            from ..policy.protected.pending import paid
            paid(owed)
        raise
    if unowed:
        keys.set_protected_pending(proc.receipt, unowed)
    return proc


#: In spawn's list of the attempt owned by nothing: one may have been started, its pid not
#: known (an interrupt as its start returned).
UNKNOWN = (-1, False, -1)


def _owe(plan: Plan) -> tuple[str | None, str]:
    """The record of the run's sweep, written before its command exists, for a later run
    to do should this runtime die before it (hcp_linux.policy.protected.pending): (its
    path, "") or (None, why there is none). (None, "") for a run with nothing to sweep."""
    found = plan.protect
    if found is None or not (found.sweep or found.after is not None):
        return None, ""
    from ..policy.protected.pending import owe
    try:
        return owe(found.sweep, found.after, plan.protect_since), ""
    except (OSError, ValueError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        return None, why


@dataclass
class _Channels:
    """One run's standard streams and proxy channel, the parent's side. ``fds``: what the
    child gets as 0, 1, 2; ``ends``: the parent's ends (the three streams' pipes or None,
    then the proxy's); ``childs``: the child's ends made here, closed once it has them."""

    fds: list[int] = field(default_factory=list)
    ends: list[int | None] = field(default_factory=list)
    childs: list[int] = field(default_factory=list)
    proxy_end: int = -1
    child_end: int = -1
    # the proxy's log, opened before anything is spawned: a refusal (a link where the log
    # was) means nothing ran; the proxy owns it once it serves
    proxy_log: IO[str] | None = None

    def close_childs(self) -> None:
        for fd in self.childs:
            os.close(fd)
        self.childs = []

    def close(self) -> None:
        self.close_childs()
        for fd in self.ends:
            if fd is not None:
                os.close(fd)
        self.ends = []
        if self.proxy_log is not None:
            self.proxy_log.close()
            self.proxy_log = None


def _open_channels(plan: Plan, specs: Sequence[Any], stdio: Stdio) -> _Channels:
    """The child's standard streams (as Popen makes them from ``specs``), refused when the
    command could re-open them by path, and the egress proxy's socketpair."""
    chans = _Channels()
    try:
        for i, spec in enumerate(specs):
            if isinstance(spec, int) and not isinstance(spec, bool) and spec == STDOUT:
                if i != 2:
                    raise ValueError(f"{('stdin', 'stdout')[i]}=STDOUT: only stderr can be "
                                     f"sent to stdout")
                chans.fds.append(chans.fds[1])  # the same open file as stdout: one pipe
                chans.ends.append(None)
                continue
            fd, end = _stdio_fd(spec, i, chans.childs, stdio.pipesize)
            chans.fds.append(fd)
            chans.ends.append(end)
        _refuse_reopenable_stdio(plan, chans.fds)
        if plan.proxy:
            chans.proxy_log = _open_proxy_log(plan.policy.proxy_log)
            proxy_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM
                                                      | socket.SOCK_CLOEXEC)
            chans.proxy_end, chans.child_end = proxy_sock.detach(), child_sock.detach()
            chans.ends.append(chans.proxy_end)
            chans.childs.append(chans.child_end)
    except BaseException:
        chans.close()
        raise
    return chans


@dataclass
class _Started:
    """One attempt that answered: its monitor's pid, whether the run has a pid namespace,
    the done pipe's read end (or -1), the
    executor that started it, its answer (b"": it reached exec; else the failure record),
    whether a ready spare was still usable, the seccomp listener's channel (or -1), and the
    receipt; once the exec is confirmed, the seccomp listener and the pid that sent it
    (receive_listener; None: the plan has none), and whether an attempt before this one
    lost its helper before the exec (the run was started afresh)."""

    pid: int
    pidns: bool
    done_r: int
    ran: str
    record: bytes
    ready_ok: bool
    notify_end: int
    receipt: dict[str, Any]
    listener: tuple[int, int] | None = None
    lost_one: bool = False


def _start_answered(plan: Plan, executor: str | None, chans: _Channels, setup_by: float,
                    limit: float, receipt: Any, unowned: list[tuple[int, bool, int]]
                    ) -> _Started:
    """Start attempts until one answers: a ready spare that does not answer in time, or
    whose view predates a change, is abandoned and the run started afresh (once); so is an
    attempt whose helper died before the exec (once). The attempt going is in ``unowned``
    (the caller's to end should this raise), and so is the one returned."""
    pidns = plan.confined and "pidns" in plan.layers
    ready_ok = True
    lost_one = False
    notify_end = notify_child = -1
    listener: tuple[int, int] | None = None
    try:
        while True:
            # one channel per attempt: an abandoned one may have sent its listener
            for fd in (notify_end, notify_child):
                if fd >= 0:
                    os.close(fd)
            notify_end = notify_child = -1
            if plan.confined and plan.seccomp is not None and plan.seccomp_listener:
                notify_end, notify_child = _channel()
            try:
                pid, ready, err_r, done_r, ran = _start(plan, executor, chans.fds,
                                                        chans.child_end, pidns,
                                                        ready_ok and not lost_one,
                                                        notify_child)
            except Exception:  # the start's own failure: nothing was started
                raise
            except BaseException:  # ^C: CPython raises it as the call that started one
                unowned.append(UNKNOWN)  # returns, before its pid is ours: whether one is
                raise  # running is not known
            unowned.append((pid, pidns, done_r))
            if notify_child >= 0:
                os.close(notify_child)
                notify_child = -1
            try:
                if callable(receipt):
                    receipt = receipt()
                answer_by = min(setup_by, time.monotonic() + teardown.SPARE_ANSWER) \
                    if ready else setup_by
                record = teardown.read_to_eof(err_r, answer_by)
            finally:
                os.close(err_r)
            if record is not None and not (record and ready and _stale_spare(record)):
                if not record and notify_end >= 0:
                    # the channel is receive_listener's to close from here: an interrupt in
                    # it may leak the fd, never close it twice (its number may be reused)
                    channel, notify_end = notify_end, -1
                    listener = receive_listener(channel)  # there if it was sent
                    # It is sent right before the exec, after the seccomp filter: without it
                    # nothing ran. The helper died first (a spare SIGKILLed while it waited,
                    # the OOM killer): the error pipe's EOF was its death, not an exec. Once
                    # more, afresh (not with a proxy: the dead attempt may have sent its
                    # socket on the channel the next one uses).
                    if listener[0] < 0 and not lost_one and not plan.proxy:
                        unowned.clear()
                        _abandon(pid, pidns, done_r)
                        listener = None
                        lost_one = True
                        continue
                return _Started(pid, pidns, done_r, ran, record, ready_ok, notify_end,
                                receipt or {}, listener, lost_one)
            unowned.clear()
            _abandon(pid, pidns, done_r)  # a stale view, or no answer in time: never runs
            if record is None and (not ready or time.monotonic() >= setup_by):
                raise SetupTimeoutError(limit)
            ready_ok = False  # start one now
    except BaseException:  # the attempt going, if any, is the caller's to end (unowned)
        if listener is not None and listener[0] >= 0:
            os.close(listener[0])
        for fd in (notify_end, notify_child):
            if fd >= 0:
                os.close(fd)
        raise


def _report_failure(started: _Started, chans: _Channels) -> None:
    """A setup step failed: wait for the monitor (it exits 125 after its report; bounded if
    it does not), let go of the run's fds, raise the step's ChildSetupError."""
    if started.notify_end >= 0:
        os.close(started.notify_end)
    monitor = teardown.Monitor(started.pid, started.pidns)
    try:
        monitor.over()
        monitor.wait(None)
    finally:  # interrupted (^C) while waiting: the reaper's, or it stays a zombie
        if monitor.status is None:
            teardown.reaper().reap(started.pid)
        monitor.close()
        chans.close()
        if started.done_r >= 0:
            os.close(started.done_r)
    step, err, detail = decode_error_record(started.record)
    raise ChildSetupError(step, err or errno.EIO, detail)


def _hand_back(plan: Plan, started: _Started, chans: _Channels, stdio: Stdio,
               args: Any, began: float, owed: str | None,
               unowned: list[tuple[int, bool, int]]) -> SandboxProcess:
    """The running command as a SandboxProcess, with what observes it attached: the
    protected names' sweep, the seccomp listener and the Landlock watch (their hand-over
    lost: the run is killed, HelperLostError), the egress proxy (none: killed too). Interrupted
    (^C) or failing before it is returned, the run is killed and its end swept: until the
    SandboxProcess exists, by the caller (``unowned``), then by the process's kill and wait."""
    try:
        chans.close_childs()
        stdin_f, stdout_f, stderr_f = _open_streams(chans.ends[:3], stdio)
    except BaseException:
        if started.listener is not None and started.listener[0] >= 0:
            os.close(started.listener[0])
        raise
    unowned.clear()  # the SandboxProcess's from here (its done pipe: never closed twice)
    proc = SandboxProcess(started.pid, stdin_f, stdout_f, stderr_f, receipt=started.receipt,
                          pidns="pidns" in plan.layers,
                          done=started.done_r if started.done_r >= 0 else None,
                          args=[a.decode() for a in plan.argv] if args is None else args,
                          stdio=stdio)
    try:
        if plan.protect is not None:  # first: a kill from here on sweeps, then pays
            proc.observe(sweep=plan.protect.sweep, after=plan.protect.after,
                         since=plan.protect_since, owed=owed)
        _observe(plan, started, chans, proc, began)
    except BaseException:
        if proc.returncode is None:
            proc.kill()
            proc.wait()
        raise
    return proc


def _observe(plan: Plan, started: _Started, chans: _Channels, proc: SandboxProcess,
             began: float) -> None:
    """:func:`_hand_back`'s attachments and receipt notes, on the running ``proc``."""
    keys.set_executor(proc.receipt, started.ran)
    if started.listener is not None:
        listener, maker = started.listener
        if listener < 0:  # its blocked calls would wait for an answer that never comes
            # before our kill: did the monitor die on its own (the OOM killer, an operator)?
            died = proc.helper_status(0.05)  # its raw wait status, or None: still there
            proc.kill()
            proc.wait()
            why = "closed the hand-over channel" if died is None else _ended_text(died)
            raise HelperLostError("seccomp", errno.EPROTO,
                                  f"hand-over: the sandbox's monitor (pid {proc.pid}) {why} "
                                  f"before handing over the seccomp listener; this run alone "
                                  f"failed, the next starts afresh")
        denials = SeccompListener(listener, plan.seccomp_names, plan.capture_nets)
        denials.start()
        # the Landlock records, where the init (or monitor) that made the domain is known
        watch = landlock_log.watch(maker, MAX_RECORDED, began) \
            if plan.landlock_log and maker > 0 else None
        proc.observe(denials=denials, landlock=watch)
    keys.set_denial_layers(proc.receipt, denial_layers(plan))
    if started.lost_one:
        keys.add_spawn_note(proc.receipt,
                            "a helper died before the command started (no seccomp listener "
                            "came from it); it was killed and the run started afresh")
    if started.ready_ok is False:
        keys.add_spawn_note(proc.receipt,
                            f"a ready spare did not answer within {teardown.SPARE_ANSWER:g}s; "
                            f"it was killed and the run started afresh")
    if plan.proxy:  # no proxy, no run (_hand_back kills it): not without its way out
        log_file, chans.proxy_log = chans.proxy_log, None  # the proxy's from here
        proc.observe(proxy=_start_proxy(plan, chans.proxy_end, proc.receipt, log_file))


def _ended_text(status: int) -> str:
    """A raw wait status as words: "was killed by SIGKILL", "exited with status 1"."""
    if os.WIFSIGNALED(status):
        import signal
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return f"was killed by {name}"
    return f"exited with status {os.waitstatus_to_exitcode(status)}"


def _channel() -> tuple[int, int]:
    """A socketpair (ours, the child's) for the seccomp listener, both close-on-exec. Ours
    passes credentials: the kernel attaches the sender's pid to what the child sends, which
    tells the Landlock domain's maker (landlock_log)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    return ours.detach(), theirs.detach()


def _start(plan: Plan, executor: str | None, fds: list[int], child_end: int, pidns: bool,
           ready_ok: bool, notify_fd: int = -1) -> tuple[int, bool, int, int, str]:
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
        run_fds = RunFds(err_w, (fds[0], fds[1], fds[2]), child_end, done_w, notify_fd)
        started = native.spawn(executor, plan, run_fds, ready_ok)
        if started is not None:
            (pid, ready), ran = started, "native"
        else:  # the ctypes executor: the child restricts itself with our ruleset
            if plan.landlock is not None:  # a copy (0.6 us): create() uses a ruleset up,
                ruleset = plan.landlock.copy().create()  # and an attempt may be the 2nd

            def start() -> int:
                return child_main.start(plan, run_fds, ruleset, err_r)
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


def _stale_spare(record: bytes) -> bool:
    """Whether a ready spare's failure is its age, not the plan's: a tree it cloned is not
    the one the plan checked (a file system mounted on a granted path since the spare made
    its mount namespace), or a hidden or read-only path lost its mount since (the host
    replaced the file: ``watch``). A spare started now sees what the plan saw."""
    step, err, _ = decode_error_record(record)
    return (step == "bind-clone" and err in (errno.ESTALE, errno.ENOENT)) \
        or (step == "watch" and err == errno.ESTALE)


def _abandon(pid: int, pidns: bool, done_r: int) -> None:
    """SIGKILL a run no SandboxProcess owns (a setup that was interrupted or never answered):
    its init, whose exit empties the namespace (the monitor then exits; the reaper reaps it,
    and kills it if it does not); its done pipe closed. Waits for nothing."""
    if done_r >= 0:
        os.close(done_r)
    monitor = teardown.Monitor(pid, pidns)
    monitor.kill()
    monitor.close()
    teardown.reaper().reap(pid)


def _end_unowned(plan: Plan, pid: int, pidns: bool, done_r: int, owed: str | None) -> None:
    """End an attempt that an interrupt (^C) or a failure left with no SandboxProcess, at a
    point where its command may have been exec'd: SIGKILL it and wait until every process
    of it is gone (bounded: teardown.Monitor), then sweep its protected names and remove
    the sweep's record, as a run's end does. Interrupted again while waiting, the reaper
    takes the monitor, and the record stays for a later run to sweep."""
    if done_r >= 0:
        os.close(done_r)
    monitor = teardown.Monitor(pid, pidns)
    try:
        monitor.kill()
        monitor.wait(None)
    finally:
        gone = monitor.status is not None
        monitor.close()
        if not gone:
            teardown.reaper().reap(pid)
    if plan.protect is not None:
        from ..policy.protected import sweep_run
        sweep_run(plan.protect.sweep, plan.protect.after, plan.protect_since)
    if owed is not None:
        from ..policy.protected.pending import paid
        paid(owed)


def _start_proxy(plan: Plan, channel: int, receipt: dict[str, Any],
                 log_file: IO[str] | None) -> Any:
    """Receive the listening socket the sandbox made in its namespace; serve the proxy,
    logging to ``log_file`` (closed here when the proxy does not start)."""
    try:
        return _serve_proxy(plan, channel, receipt, log_file)
    except BaseException:
        if log_file is not None:
            log_file.close()
        raise


def _serve_proxy(plan: Plan, channel: int, receipt: dict[str, Any],
                 log_file: IO[str] | None) -> Any:
    from ..egress import ProxyThread  # off the spawn path unless network = "allow"

    with socket.socket(fileno=channel) as ch:
        # egress-capture's message ("C": the resolver's socket, then the capture listeners),
        # then proxy-listen's ("L": the proxy's listener)
        got_c, capture, _, _ = socket.recv_fds(ch, 1, 1 + CAPTURE_PORTS_MAX)
        got_l, fds, _, _ = socket.recv_fds(ch, 1, 1)
    socks = [socket.socket(fileno=fd) for fd in capture + fds]
    if got_c != b"C" or len(capture) != 1 + len(plan.capture_ports):
        for sock in socks:
            sock.close()
        raise ChildSetupError("egress-capture", errno.EPROTO,
                              f"{len(capture)} sockets received, {1 + len(plan.capture_ports)} "
                              "expected")
    if got_l != b"L" or len(fds) != 1:
        for sock in socks:
            sock.close()
        raise ChildSetupError("proxy-listen", errno.EPROTO, "no listening socket received")
    resolver, captured, listener = socks[0], socks[1:-1], socks[-1]
    decisions = keys.set_egress(receipt, dict(proxy="%s:%d" % PROXY_ADDRESS,
                                              resolver="%s:%d" % RESOLVER_ADDRESS,
                                              synthetic="%s/%d" % SYNTHETIC_NET,
                                              captured_ports=list(plan.capture_ports),
                                              captured_nets=[f"{a.decode()}/{n}" for a, n
                                                             in plan.capture_nets],
                                              **plan.policy.egress().describe()))

    def log(decision: dict[str, Any]) -> None:
        if len(decisions) < 10_000:
            decisions.append(decision)
        if log_file is not None:
            log_file.write(json.dumps(decision, sort_keys=True) + "\n")
            log_file.flush()

    proxy = ProxyThread(plan.policy.egress(), listener, log=log, captured=captured,
                        resolver=resolver)
    proxy.start()
    return _ProxyRun(proxy, log_file)


class _ProxyRun:
    """The egress proxy of one run and its log file, stopped and closed together."""

    def __init__(self, proxy: Any, log_file: IO[str] | None) -> None:
        self._proxy, self._log_file = proxy, log_file

    def stop(self) -> None:
        try:
            self._proxy.stop()
        finally:
            if self._log_file is not None:
                self._log_file.close()
                self._log_file = None


def _open_proxy_log(path: str | None) -> IO[str] | None:
    """The proxy log, opened once for the run: appended to through this fd only, so a
    command that replaces the file (or a directory above it) by a link while it runs cannot
    make the runtime write elsewhere; an existing link is refused (O_NOFOLLOW: ELOOP)."""
    if not path:
        return None
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
                     | os.O_CLOEXEC, 0o666)
    except OSError as e:
        why = "a symlink (not followed)" if e.errno == errno.ELOOP else e.strerror
        raise SandboxError(f"proxy_log: {printable(path)}: {why}") from None
    return open(fd, "a", closefd=True)
