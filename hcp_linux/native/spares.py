"""Spares: hcp-exec processes started ahead of the plan they will run.

Most of a confined spawn's cost that does not depend on the plan (exec of hcp-exec, the user,
network and IPC namespaces, uid/gid maps, the pid namespace's init, loopback) can be paid
before the plan exists; so can the mount view and the confinement that is the same for every
run (no_new_privs, capabilities, Landlock, seccomp), when the next plan's prepared section is
the same as the last one's (same grants, same inodes, same masks, same rules, same seccomp
program): such a spare waits already confined, and only rlimits follow the plan. A spare is an
hcp-exec started with ``--spare``: it does those steps of child.py, then waits on a socket for
one plan and the run's fds, refuses a plan it was not prepared for, and reports a step that
failed meanwhile on that run's error pipe as if it had just failed. A spare keeps the resource
limits of the moment it was started: one started under other limits than the runtime's now is
retired, never handed a run (a RLIMIT_NOFILE lowered for a moment left spares that could not
take a run's fds after it was restored); so is one whose monitor has exited (killed while
idle: its init, killed before it set its parent-death signal, lives on with the socket). Each spare serves one run:
no namespace is ever shared. Every confined spawn goes through a spare (started on the spot
when none is ready); ready ones are made by one thread that lives as long as the process
(PDEATHSIG follows the thread that spawned a process), once a kind of plan repeats. An idle
spare holds no fd of the runtime's (stdio /dev/null, cwd "/").

The pool is this process's (a forked child starts an empty one). :func:`clear` retires every
idle spare (``release_resources``); :func:`idle_pids` lists them; :func:`make`,
:func:`hand_over` and :func:`retire` are one spare's life, for the spawn path and for tests.
"""
from __future__ import annotations

import errno
import os
import resource
import threading
import time
from typing import TYPE_CHECKING

from ..proc.hcp_spawn import memfd
from ..proc.stdio import fill_closed
from ..protocol import (INLINE_MAX, MESSAGE_BITS, PLAN_MAGIC, PLAN_VERSION, RUN_FDS,
                        RunFds, namespace_flags)
from .wire import u64

if TYPE_CHECKING:
    import socket

    from hcp_linux.landlock import CreatedRuleset

    from ..plan.plan import Plan

_spares = "auto"  # "auto": ready spares once a kind of plan repeats; "never": no spares
SPARES = ("auto", "never")
SPARE_TARGET = 2  # idle spares per kind
SPARE_KINDS = 2  # kinds kept warm at once (least recently used goes)
SPARE_MAX_AGE = 5.0  # seconds: an older idle spare is replaced (bounds how stale it can be:
#                      rlimits the plan leaves unset, mounts made under a granted tree since it
#                      was built; umask and signal dispositions come with the plan)
KIND_IDLE = 60.0  # seconds without a spawn of a kind: stop keeping spares for it


def set_spares(mode: str) -> None:
    """Process-wide: "auto" (default: confined plans always go through a spare, made ahead of
    time once a kind of plan repeats, else on the spot), or "never" (hcp-exec gets the plan
    on its command line: slower, the same steps)."""
    global _spares
    if mode not in SPARES:
        from ..errors import PolicyError
        raise PolicyError(f"spares: expected one of {', '.join(SPARES)}, got {mode!r}")
    _spares = mode


def mode() -> str:
    """The process-wide mode set by :func:`set_spares`."""
    return _spares


def spare_key(plan: "Plan", exe: str) -> tuple:
    """What a spare for ``plan`` must share with it before the plan exists: (namespace
    flags, uid, gid, binary). A spare's kind is this plus its view section, or None."""
    return namespace_flags(plan.layers), plan.uid, plan.gid, exe


_RLIMITS = tuple(getattr(resource, name) for name in sorted(dir(resource))
                 if name.startswith("RLIMIT_"))


def limits() -> tuple:
    """This process's resource limits, which a spare started now inherits."""
    return tuple(resource.getrlimit(r) for r in _RLIMITS)


def exited(pid: int) -> bool:
    """Whether our child ``pid`` has exited: a zombie not reaped yet (waitid with WNOWAIT,
    which leaves it to be reaped as ever), or reaped."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


class Spare:
    """One hcp-exec started with ``--spare``: its pid, our end of its socket, and the
    resource limits it was started with (None: unknown, they changed meanwhile)."""

    __slots__ = ("pid", "sock", "born", "limits")

    def __init__(self, pid: int, sock: "socket.socket", limits: tuple | None = None) -> None:
        self.pid, self.sock, self.born = pid, sock, time.monotonic()
        self.limits = limits


def hand_over(spare: Spare, plan: bytes, fds: RunFds,
              ruleset: "CreatedRuleset | None") -> bool:
    """Send the plan and the run's fds (its channels, and the parent's Landlock ruleset) to a
    spare, in one message; False if it is gone (or its socket is full: never block on a
    spare). The plan travels in the message up to INLINE_MAX (and the socket's send buffer),
    else in a memfd. The fds go in RUN_FDS's order, the ruleset after stdio; an optional one
    is there when its MESSAGE_BITS bit says so (hcp_exec.c: receive)."""
    import array
    from socket import MSG_DONTWAIT, SCM_RIGHTS, SOL_SOCKET
    bits = 0
    sent_fds = [fds.err, *fds.stdio]
    if ruleset is not None and ruleset.fd >= 0:
        sent_fds.append(ruleset.fd)
        bits |= MESSAGE_BITS["RULESET"]
    for name, _, bit in RUN_FDS:
        fd = getattr(fds, name)
        if bit is not None and fd >= 0:
            sent_fds.append(fd)
            bits |= MESSAGE_BITS[bit]
    magic = u64(PLAN_VERSION << 32 | PLAN_MAGIC)
    sent = False
    try:
        if len(plan) <= INLINE_MAX:
            try:
                spare.sock.sendmsg([magic, u64(bits | MESSAGE_BITS["INLINE"]), plan],
                                   [(SOL_SOCKET, SCM_RIGHTS, array.array("i", sent_fds))],
                                   MSG_DONTWAIT)
                sent = True
            except OSError as e:
                if e.errno != errno.EMSGSIZE:  # EMSGSIZE: a small send buffer; nothing sent
                    raise
        if not sent:
            fd = memfd(plan)
            try:
                spare.sock.sendmsg([magic, u64(bits)],
                                   [(SOL_SOCKET, SCM_RIGHTS, array.array("i", [fd, *sent_fds]))],
                                   MSG_DONTWAIT)
            finally:
                os.close(fd)
    except OSError:
        return False
    spare.sock.close()  # it has all it needs: from now on it is this run's monitor
    return True


def make(kind: tuple, sigmask: "set[int] | None" = None) -> Spare:
    """A spare for ``kind``: (namespace flags, uid, gid, binary, view section or None).
    ``sigmask``: its signal mask (default: the calling thread's, as for any spawn)."""
    import socket
    flags, uid, gid, exe, view = kind
    fill_closed()  # its control socket must not be where a run's command inherits stdio
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    ours, theirs = a.detach(), b.detach()
    devnull = view_fd = -1
    try:
        devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        argv = ["hcp-exec", "--spare", str(theirs), str(flags), str(uid), str(gid),
                str(os.getpid())]
        actions = [(os.POSIX_SPAWN_DUP2, devnull, 0), (os.POSIX_SPAWN_DUP2, devnull, 1),
                   (os.POSIX_SPAWN_DUP2, devnull, 2), (os.POSIX_SPAWN_DUP2, theirs, theirs)]
        if view is not None:
            view_fd = memfd(view)
            argv.append(str(view_fd))
            actions.append((os.POSIX_SPAWN_DUP2, view_fd, view_fd))
        # the caller closed one since: a command that inherited the control socket could
        # send this unconfined hcp-exec a plan of its own
        if min(ours, theirs, devnull, 3 if view_fd < 0 else view_fd) < 3:
            raise OSError(errno.EBADF, "fds 0-2 are not open")
        before = limits()
        if sigmask is None:
            pid = os.posix_spawn(exe, argv, {}, file_actions=actions)
        else:
            pid = os.posix_spawn(exe, argv, {}, file_actions=actions, setsigmask=sigmask)
    except OSError:
        os.close(ours)
        raise
    finally:
        for fd in (theirs, devnull, view_fd):
            if fd >= 0:
                os.close(fd)
    after = limits()
    return Spare(pid, socket.socket(fileno=ours), before if before == after else None)


def retire(spare: Spare, deadline: float | None = None) -> bool:
    """An unused spare: EOF on its socket makes it exit; reap it. With ``deadline`` (a
    time.monotonic() value), one still running then is killed, through a pidfd taken before
    (never a pid that could have been reused), and reaped; returns False then (its pid 1,
    killed by PDEATHSIG, may outlive the reaping by a moment), else True."""
    spare.sock.close()
    if deadline is None:  # never wait on a spare here: the reaper kills one that hangs on
        from ..proc.teardown import reaper
        reaper().reap(spare.pid)
        return True
    exited = True
    if deadline is not None:
        import select
        import signal
        try:
            pidfd = os.pidfd_open(spare.pid)
        except ProcessLookupError:  # reaped already
            return True
        try:
            exited = bool(select.select([pidfd], [], [],
                                        max(0.0, deadline - time.monotonic()))[0])
            if not exited:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        finally:
            os.close(pidfd)
    try:
        os.waitpid(spare.pid, 0)
    except ChildProcessError:
        pass
    return exited


class Pool:
    """Idle spares per kind (namespace layers, uid, gid, binary, view section or None), kept
    by one thread. The kind made is a guess at the next plan: the same view as this one when
    the last two plans (of these namespaces, uid, gid) had the same, else namespaces only."""

    def __init__(self) -> None:
        self.owner = os.getpid()
        self.cond = threading.Condition()
        self.idle: dict[tuple, list[Spare]] = {}
        self.wanted: dict[tuple, float] = {}  # kinds to keep warm (last wanted), LRU first
        self.seen: dict[tuple, int] = {}
        self.last_view: dict[tuple, bytes | None] = {}
        self.doomed: list[Spare] = []
        self.thread: threading.Thread | None = None
        self.sigmask: set[int] = set()  # of the thread that started the keeper
        self.busy = False  # the keeper is retiring or making spares, out of the lock
        self.clearing = 0  # clear()s waiting: the doomed are theirs to retire, not the keeper's

    def take(self, key: tuple, view: bytes | None) -> Spare | None:
        """A ready spare for this plan (its view built, else namespaces only), or None."""
        full, bare = key + (view,), key + (None,)
        now = limits()
        stale: list[Spare] = []
        with self.cond:
            seen = self.seen[key] = self.seen.get(key, 0) + 1
            same = view is not None and self.last_view.get(key) == view
            self.last_view[key] = view
            if len(self.seen) > 64:  # forget rare kinds
                self.seen, self.last_view = {key: seen}, {key: view}
            spare = None
            for kind in (full, bare) if view is not None else (bare,):
                while spare is None and self.idle.get(kind):
                    spare = self.idle[kind].pop(0)
                    # started under other limits, or its monitor is gone (killed while
                    # idle: its init may live on, holding the socket): retired
                    if spare.limits != now or exited(spare.pid):
                        stale.append(spare)
                        spare = None
                if spare is not None:
                    break
            if _spares == "auto" and seen >= 2:
                kind = full if same else bare
                self.wanted.pop(kind, None)
                self.wanted[kind] = time.monotonic()
                while len(self.wanted) > SPARE_KINDS:
                    old = next(iter(self.wanted))
                    del self.wanted[old]
                    self.doomed += self.idle.pop(old, [])
                if self.thread is None:
                    import signal
                    self.sigmask = set(signal.pthread_sigmask(signal.SIG_BLOCK, ()))
                    self.thread = threading.Thread(target=self._keep, name="hcp-linux spares",
                                                   daemon=True)
                    self.thread.start()
        for gone in stale:
            self.discard(gone)
        return spare

    def kick(self) -> None:
        """A spawn is handed over: the keeper may refill now (not earlier: it would compete
        for the GIL with the spawning thread on its way to wait for the run)."""
        if self.thread is not None:
            with self.cond:
                self.cond.notify()

    def clear(self, timeout: float = 5.0) -> bool:
        """Forget every kind and retire every spare that is not a run (idle, doomed, and one
        the keeper is making or retiring at this moment, waited for); spares come back once a
        kind repeats. Bounded by ``timeout`` seconds: a spare that has not exited by then is
        killed. True when every spare was seen to exit, so that none is left holding a mount
        (release_resources)."""
        deadline = time.monotonic() + timeout
        with self.cond:
            self.wanted.clear()
            self.seen.clear()
            self.last_view.clear()
            self.clearing += 1
            try:
                while self.busy:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self.cond.wait(left)
            finally:
                self.clearing -= 1
            spares = [s for kind in self.idle.values() for s in kind] + self.doomed
            self.idle.clear()
            self.doomed = []
            done = not self.busy
        for spare in spares:  # EOF to all first: they exit side by side
            spare.sock.close()
        for spare in spares:
            done = retire(spare, deadline) and done
        return done

    def idle_pids(self) -> list[int]:
        """The pids of the idle spares, of every kind."""
        with self.cond:
            return [s.pid for kind in self.idle.values() for s in kind]

    def discard(self, spare: Spare) -> None:
        with self.cond:
            if self.thread is not None:  # the keeper reaps it
                self.doomed.append(spare)
                self.cond.notify()
                return
        retire(spare)

    def _short(self) -> tuple | None:
        for key in self.wanted:
            if len(self.idle.get(key, ())) < SPARE_TARGET:
                return key
        return None

    def _expire(self) -> float | None:
        """Doom spares past their age and kinds no longer asked for; seconds to the next."""
        now = time.monotonic()
        for kind, last in list(self.wanted.items()):
            if now - last > KIND_IDLE:
                del self.wanted[kind]
        nxt = None
        for kind in list(self.idle):
            keep = []
            for spare in self.idle[kind]:
                age = now - spare.born
                if kind in self.wanted and age < SPARE_MAX_AGE:
                    keep.append(spare)
                    left = SPARE_MAX_AGE - age
                    nxt = left if nxt is None else min(nxt, left)
                else:
                    self.doomed.append(spare)
            if keep:
                self.idle[kind] = keep
            else:
                del self.idle[kind]
        for last in self.wanted.values():
            left = KIND_IDLE - (now - last)
            nxt = left if nxt is None else min(nxt, left)
        return nxt

    def _keep(self) -> None:
        """The keeper thread: make spares where short, retire the doomed and the stale.
        Never exits. It blocks every signal, so that a signal meant for the runtime (SIGINT:
        KeyboardInterrupt) reaches a thread of the runtime's and interrupts what it waits on;
        the spares it makes get the mask of the thread that started it."""
        import signal
        signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        while True:
            with self.cond:
                if self.busy:
                    self.busy = False
                    self.cond.notify_all()  # clear() may wait for it
                while True:
                    timeout = self._expire()
                    if (self.doomed and not self.clearing) or self._short() is not None:
                        break
                    self.cond.wait(None if timeout is None else timeout + 0.01)
                doomed: list[Spare] = []
                if not self.clearing:  # else the waiting clear() retires them, and waits
                    doomed, self.doomed = self.doomed, []
                key = self._short()
                self.busy = True
            time.sleep(0.001)  # the spawning thread that kicked us is on its way to block
            for old in doomed:
                retire(old)
            if key is None:
                continue
            try:
                spare: Spare | None = make(key, self.sigmask)
            except OSError:
                spare = None
            with self.cond:
                if spare is None:
                    self.wanted.pop(key, None)  # cannot make one: stop trying for this kind
                elif key in self.wanted:
                    self.idle.setdefault(key, []).append(spare)
                else:
                    self.doomed.append(spare)


_the_pool: Pool | None = None
_pool_lock = threading.Lock()


def pool() -> Pool:
    """This process's pool (a forked child starts an empty one: the spares are not its own)."""
    global _the_pool, _pool_lock
    pool = _the_pool
    if pool is not None and pool.owner == os.getpid():
        return pool
    if pool is not None:  # forked: the lock may have been held by a thread that is gone
        _pool_lock = threading.Lock()
    with _pool_lock:
        if _the_pool is None or _the_pool.owner != os.getpid():
            _the_pool = Pool()
        return _the_pool


def clear(timeout: float = 5.0) -> bool:
    """Retire every spare of this process's pool that is not a run (see :meth:`Pool.clear`)."""
    return pool().clear(timeout)


def idle_pids() -> list[int]:
    """The pids of this process's idle spares."""
    return pool().idle_pids()
