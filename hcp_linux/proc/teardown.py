"""How a run ends, whatever its helper processes do.

A confined run is three processes deep: the monitor (our child), the sandbox's init (pid 1 of
its pid namespace, the monitor's child) and the command. The monitor and the init are ours,
but they can be stopped (SIGSTOP from outside), starved, or stuck like any process, so the
runtime never *asks* them to end a run and waits: it acts itself, and every wait has a bound.

- A kill is SIGKILL, sent by the runtime through pidfds to the init (the kernel then kills
  and reaps every process of the namespace before the init's exit completes) and to the
  monitor. Neither needs to be scheduled to receive it; a stopped process dies too.
- "The namespace is empty" is learned from the init's pidfd, which turns readable only once
  the init's exit is complete (kernel/pid_namespace.c zap_pid_ns_processes runs before).
- Monitors are reaped by one thread that polls their pidfds, so one stuck monitor never
  holds up the others; a monitor that has not exited ``MONITOR_GRACE`` after its run was
  over is killed.

Only the standard library's lightest modules are imported here at import time: the served
client (serve_client.py) uses this module on the start-up path of `hcp-linux run`.
"""
from __future__ import annotations

import _signal as signal  # the C half: `signal` imports enum (~2 ms) on the served path
import _thread
import os
import select

from .stdio import fill_closed

#: Seconds a monitor has to exit once its run is over (the init reported, or is gone) before
#: it is killed: normally it exits within a millisecond; only a stopped or stuck one is late.
MONITOR_GRACE = 1.0
#: Seconds a ready spare has to confirm the exec (or report a failed step) after it has been
#: handed a plan: it has only the run's last steps left (~1 ms). Past that it is killed and
#: the run is started afresh.
SPARE_ANSWER = 2.0
#: Seconds hcp-exec (or the ctypes executor's child) has to reach exec, when the caller gives
#: no deadline of its own: the setup of a run never waits unbounded.
SETUP_TIMEOUT = 30.0
#: Seconds a wait after a kill gives the kernel to empty the pid namespace (each of the
#: run's processes must be scheduled once to die); a process stuck in an uninterruptible
#: sleep (a hung NFS read) can outlast it, and the receipt then says so.
TEARDOWN_WAIT = 10.0


def readable(fd: int, timeout: float | None) -> bool:
    """Whether ``fd`` is readable (data, EOF, a pidfd whose process ended) within
    ``timeout`` seconds (None: no limit). EINTR is retried by poll() itself (PEP 475)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    if timeout is None:
        return bool(poller.poll())
    return bool(poller.poll(max(0, int(timeout * 1000 + 0.999))))


def read_to_eof(fd: int, by: float) -> bytes | None:
    """Everything on ``fd`` until EOF, or None when EOF has not come by ``by``
    (time.monotonic()): how the parent reads a child's answer on its error pipe (b"": it
    reached exec; else its failure record), in-process or served."""
    import time
    parts: list[bytes] = []
    while True:
        if not readable(fd, max(0.0, by - time.monotonic())):
            return None
        chunk = os.read(fd, 4096)
        if not chunk:
            return b"".join(parts)
        parts.append(chunk)


def sigkill(pidfd: int | None) -> bool:
    """SIGKILL the process behind ``pidfd``; False when it is gone already (reaped)."""
    if pidfd is None:
        return False
    try:
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True


def pidfd_of_child(pid: int) -> int | None:
    """A pidfd of our own child ``pid`` (None if it is reaped already). A child's pid cannot
    be reused until we reap it, so the pidfd is the child's own."""
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        return None


def find_child(parent: int, parent_fd: int | None = None) -> tuple[int, int] | None:
    """(pid, pidfd) of the first child of ``parent`` — a process whose pid is its own while
    the check runs: our unreaped child, or one ``parent_fd`` (its pidfd) shows unreaped.

    The child's pid is read from /proc, then a pidfd opened on it, then its parent checked in
    /proc *after* the pidfd was opened, then both pidfds shown to still name unreaped
    processes: a pid is reused only once its process is reaped, so the /proc read in between
    was of the process the pidfd names, and its parent was ``parent``. A pid recycled before
    the pidfd was opened fails the parent check (only ``parent``'s children have it)."""
    for pid in _children(parent):
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            continue
        try:
            if _parent(pid) == parent:
                if parent_fd is not None:
                    signal.pidfd_send_signal(parent_fd, 0)  # ESRCH: parent reaped meanwhile
                signal.pidfd_send_signal(fd, 0)  # ESRCH: reaped since the check
                return pid, fd
        except OSError:
            pass
        os.close(fd)
    return None


#: pidfd_send_signal(2) flag (Linux 6.9): the target's whole process group.
PIDFD_SIGNAL_PROCESS_GROUP = 1 << 2


def _kill_command_group(init: int, init_fd: int) -> None:
    """First strike, before the init's own SIGKILL: the command's process group (the command
    is a session and group leader; what it forks stays in its group unless it moves out).
    The init's exit empties the namespace only after its own memory is torn down, and that
    waits on the locks of every file it maps — libc's too, which a fork bomb's thousands of
    fork()s hold in turn (a Python init waited minutes for them). With the forkers gone first
    it does not. Best effort: a kernel before 6.9 lacks the flag, and what left the group is
    the init's exit's to kill."""
    found = find_child(init, init_fd)
    if found is None:
        return
    fd = found[1]
    try:
        signal.pidfd_send_signal(fd, signal.SIGKILL, None, PIDFD_SIGNAL_PROCESS_GROUP)
    except OSError:  # EINVAL: no such flag here; ESRCH: gone
        pass
    finally:
        os.close(fd)


def _children(pid: int) -> list[int]:
    """The children of ``pid``: /proc/PID/task/PID/children (CONFIG_PROC_CHILDREN), else a
    scan of /proc for processes whose parent is ``pid``."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children", "rb") as f:
            return [int(x) for x in f.read().split()]
    except FileNotFoundError:
        pass
    except (OSError, ValueError):
        return []
    out = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if name.isdigit():
            try:
                if _parent(int(name)) == pid:
                    out.append(int(name))
            except OSError:
                continue
    return out


def _stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped (by a signal, or traced), as /proc shows it now."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return False
    return data[data.rindex(b")") + 2:][:1] in (b"T", b"t")


def _parent(pid: int) -> int:
    """The parent pid of ``pid`` as this process's /proc shows it (OSError when gone)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        data = f.read()
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses; the last ")" ends it
    try:
        return int(data[data.rindex(b")") + 2:].split(None, 2)[1])
    except (ValueError, IndexError):
        raise OSError(f"/proc/{pid}/stat: unexpected format") from None


def _ignores_sigchld() -> bool:
    """Whether this process ignores SIGCHLD (then the kernel reaps its children)."""
    return signal.getsignal(signal.SIGCHLD) == signal.SIG_IGN


class Monitor:
    """The runtime's handle on one run's monitor (our child): ends the run by itself and
    waits for it with bounds.

    Once the run is over (the init reported or is gone, or the runtime killed it), the
    monitor has ``MONITOR_GRACE`` to exit; then it is sent SIGCONT (a stopped monitor resumes,
    reaps the init and exits as it should), and after another ``MONITOR_GRACE`` SIGKILL (its
    init, if it still has one, then goes to the system's reaper). ``notes`` says what had to
    be done, for the receipt."""

    def __init__(self, pid: int, pidns: bool) -> None:
        self.pid, self.pidns = pid, pidns
        self.fd = pidfd_of_child(pid)
        self.init_fd: int | None = None
        self._looked = False
        self.over_since: float | None = None
        self.status: int | None = None  # the raw wait status, once reaped
        self.notes: list[str] = []
        self._sent: set[int] = set()

    def over(self) -> None:
        """The run is over: from now on the monitor's time to exit counts."""
        if self.over_since is None:
            import time
            self.over_since = time.monotonic()

    def kill(self) -> None:
        """End the run now. With a pid namespace: SIGKILL its init, whose exit takes every
        process of the namespace with it, and SIGCONT the monitor if it is stopped, so that
        it reaps the init and exits as it died. Without one the monitor is the command:
        SIGKILL its session."""
        self.over()
        if self.status is not None:
            return
        if not self.pidns:
            try:
                os.killpg(self.pid, signal.SIGKILL)  # the session made by setsid
            except ProcessLookupError:
                pass
            return
        if not self._looked:
            self._looked = True
            init = find_child(self.pid)
            if init is not None:
                self.init_fd = init[1]
                _kill_command_group(*init)
        if not sigkill(self.init_fd):  # no init found: PDEATHSIG takes it with the monitor
            sigkill(self.fd)
            return
        # A stopped monitor would keep the dead init unreaped and the caller waiting for its
        # grace: the run is over by our decision, so it resumes now.
        if self.fd is not None and _stopped(self.pid):
            try:
                signal.pidfd_send_signal(self.fd, signal.SIGCONT)
                self.notes.append("monitor: stopped at the kill; sent SIGCONT")
            except ProcessLookupError:
                pass

    def poll(self) -> int | None:
        """The raw wait status if the monitor has exited (reaped now), else None."""
        return self.wait(0.0)

    def wait(self, timeout: float | None) -> int | None:
        """Wait up to ``timeout`` seconds (None: as long as the run lasts) for the monitor
        to exit, escalating as described above once the run is over; the raw wait status,
        or None if it has not exited in time. After a kill, also wait (``TEARDOWN_WAIT`` at
        most) until the kernel has emptied the pid namespace."""
        import time
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.status is None:
            now = time.monotonic()
            limit = _earliest(deadline, self._escalate(now))
            if self.fd is None or readable(self.fd, None if limit is None else limit - now):
                self._reap()
                continue
            if deadline is not None and time.monotonic() >= deadline:
                return None
        self._settle()
        return self.status

    def _reap(self) -> None:
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:  # reaped by someone else (a waitpid(-1) of the runtime's)
            pid, status = self.pid, signal.SIGKILL
            self.notes.append("monitor: reaped by the kernel (this process ignores SIGCHLD); "
                              "status lost" if _ignores_sigchld() else
                              "monitor: reaped by another part of the runtime; status lost")
        if pid:
            self.status = status

    def _escalate(self, now: float) -> float | None:
        """Send what is due; the time the next step is due (None: nothing more)."""
        if self.over_since is None or self.fd is None:
            return None
        for n, sig in ((1, signal.SIGCONT), (2, signal.SIGKILL)):
            at = self.over_since + n * MONITOR_GRACE
            if sig in self._sent:
                continue
            if now < at:
                return at
            self._sent.add(sig)
            try:
                signal.pidfd_send_signal(self.fd, sig)
            except ProcessLookupError:
                return None
            self.notes.append(f"monitor: still there {n * MONITOR_GRACE:g}s after the run "
                              f"was over; sent {_NAMES[sig]}")
        return None

    def _settle(self) -> None:
        """After a kill: wait until the init's exit is complete (the namespace is empty)."""
        fd, self.init_fd = self.init_fd, None
        if fd is None:
            return
        if not readable(fd, TEARDOWN_WAIT):
            self.notes.append(f"teardown: processes of the run still there {TEARDOWN_WAIT:g}s "
                              f"after the kill (an uninterruptible sleep?)")
        os.close(fd)

    def close(self) -> None:
        for fd in (self.fd, self.init_fd):
            if fd is not None:
                os.close(fd)
        self.fd = self.init_fd = None


_NAMES = {signal.SIGCONT: "SIGCONT", signal.SIGKILL: "SIGKILL"}


def _earliest(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


class Reaper:
    """Reaps our helper processes (monitors once their run is over, retired spares) without
    ever blocking on one of them: one thread polls a pidfd per process and reaps whichever
    exits. A process still there ``grace`` seconds after it was handed over is sent SIGCONT
    (a stopped one resumes and exits by itself, reaping its own child), and SIGKILL after
    another ``grace``. Started on first use; it blocks every signal, so that they reach the
    runtime's own threads."""

    def __init__(self) -> None:
        import threading
        self.lock = threading.Lock()
        self.entries: dict[int, list] = {}  # pid: [pidfd, handed over at, grace, signals sent]
        # made on a run's end, maybe after the caller closed an fd 0-2 since the run's spawn:
        # the pipe lasts, and in a standard fd's place it would be every later run's stdio
        fill_closed()
        self.wake_r, self.wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self.thread: threading.Thread | None = None
        self.sent = {"SIGCONT": 0, "SIGKILL": 0}  # escalations so far (tests, bench)

    def reap(self, pid: int, grace: float | None = None, *, escalate: bool = True) -> None:
        """Reap ``pid`` (our child) once it exits, escalating after ``grace`` seconds
        (default ``MONITOR_GRACE``); with ``escalate=False`` only reap it, whenever it
        exits (a run its owner dropped without waiting: it goes on, as a Popen would)."""
        import threading
        import time
        if grace is None:
            grace = MONITOR_GRACE
        sent0 = 0 if escalate else 2  # 2: both escalation steps counted as done
        try:
            if os.waitpid(pid, os.WNOHANG)[0]:
                return
        except ChildProcessError:  # someone else reaped it (a waitpid(-1) of the runtime's)
            return
        fd = pidfd_of_child(pid)
        if fd is None:
            return
        with self.lock:
            old = self.entries.pop(pid, None)
            if old is not None:
                os.close(old[0])
            self.entries[pid] = [fd, time.monotonic(), grace, sent0]
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="hcp-linux reaper",
                                               daemon=True)
                self.thread.start()
        try:
            os.write(self.wake_w, b"x")
        except BlockingIOError:  # the pipe is full: the thread is awake anyway
            pass

    def _run(self) -> None:
        import time
        signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        while True:
            with self.lock:
                entries = {pid: list(e) for pid, e in self.entries.items()}
            now = time.monotonic()
            due = [since + (sent + 1) * grace for _, since, grace, sent in entries.values()
                   if sent < 2]
            poller = select.poll()
            poller.register(self.wake_r, select.POLLIN)
            for fd, *_ in entries.values():
                poller.register(fd, select.POLLIN)
            timeout = None if not due else max(0, int((min(due) - now) * 1000 + 0.999))
            ready = {fd for fd, _ in poller.poll(timeout)}
            if self.wake_r in ready:
                try:
                    while os.read(self.wake_r, 4096):
                        pass
                except BlockingIOError:
                    pass
            now = time.monotonic()
            for pid, (fd, since, grace, sent) in entries.items():
                if fd in ready:
                    self._try_reap(pid, fd)
                elif sent < 2 and now >= since + (sent + 1) * grace:
                    sig = (signal.SIGCONT, signal.SIGKILL)[sent]
                    try:
                        signal.pidfd_send_signal(fd, sig)
                        self.sent[_NAMES[sig]] += 1
                    except ProcessLookupError:
                        pass
                    with self.lock:
                        entry = self.entries.get(pid)
                        if entry is not None and entry[0] == fd:
                            entry[3] = sent + 1

    def _try_reap(self, pid: int, fd: int) -> None:
        try:
            done = os.waitpid(pid, os.WNOHANG)[0] != 0
        except ChildProcessError:
            done = True
        if done:
            with self.lock:
                entry = self.entries.get(pid)
                if entry is not None and entry[0] == fd:
                    del self.entries[pid]
            os.close(fd)


_the_reaper: Reaper | None = None
_reaper_lock = _thread.allocate_lock()


def reaper() -> Reaper:
    """This process's reaper, made on first use."""
    global _the_reaper
    with _reaper_lock:
        if _the_reaper is None:
            _the_reaper = Reaper()
        return _the_reaper


def _forget_reaper() -> None:
    """In a forked child: the helpers are not its children, the thread is not there, and the
    lock may have been held by a thread that is gone."""
    global _the_reaper, _reaper_lock
    _the_reaper, _reaper_lock = None, _thread.allocate_lock()


os.register_at_fork(after_in_child=_forget_reaper)
