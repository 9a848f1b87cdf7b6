"""The client side of `hcp-linux serve`: the plan from a warm server, run here.

See hcp_linux.cli.launch for why, and when a run falls back to the in-process path. Imported on
the start-up path of a served run: only what that path needs, the rest on first use.
"""
from __future__ import annotations

import os
import sys

from ..proc.hcp_spawn import hard_limits, memfd, spawn_hcp_exec
from ..proc.peer import bad_server_path, more_confined, peer, process_status, same_place
from .run_end import end_of_run, open_receipt_dir
from .serve_wire import PROTOCOL, decode_after, decode_sweep, encode, recv_frame

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing on the start-up path
if TYPE_CHECKING:
    from typing import Sequence

    from ..policy.protected import SweepEntry

#: How long the client waits for the server (connect, each reply) before falling back.
SERVER_TIMEOUT = 5.0
#: Set by run_via_server when no server was there to ask (no socket, nobody listening on
#: it, or, with ``auto``, one that did not answer in time): an ``auto`` run then starts one.
absent = False


def not_using(what: str, why: str) -> None:
    """The one line that says a server is not used, and why (the run goes on in-process,
    with the same result); control characters in the path are escaped."""
    from ..errors import printable
    print(f"hcp-linux: not using {printable(what)}: {printable(why)}; running in-process",
          file=sys.stderr)


def _unreachable(path: str, error: OSError) -> str | None:
    """Why a failed connect to ``path`` is worth a word, or None: no socket there, or a
    socket nobody listens on (a server that stopped), is the documented quiet case;
    anything else there (a file, a directory) or in the way is a misconfiguration."""
    import errno
    if error.errno == errno.ENOENT:
        return None
    try:
        st = os.stat(path)
    except OSError as e:
        return e.strerror or str(e)
    from stat import S_ISSOCK
    if not S_ISSOCK(st.st_mode):
        return "not a socket"
    return None if error.errno == errno.ECONNREFUSED else (error.strerror or str(error))


def run_via_server(path: str, args: list[str], auto: bool = False) -> int | None:
    """`hcp-linux run ARGS` with the plan from the server at ``path``; None: run in-process
    instead (and nothing was started). A path that cannot name a server's socket is said
    so, once. ``auto``: ``path`` is the user's own server's (hcp_linux.cli.auto_server),
    and one that accepts but does not answer in time is unlinked there (only that one)."""
    global absent
    absent = False
    why = bad_server_path(path)
    if why is not None:
        not_using(f"HCP_LINUX_SERVER={path}", why)
        return None
    try:
        os.getcwd()  # else the request cannot be made: the in-process run says why
    except OSError:
        return None
    import _socket
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
    try:
        sock.settimeout(SERVER_TIMEOUT)
        try:
            identity = _identity(path) if auto else None
            sock.connect(path)
        except OSError as e:  # no server there: nothing to say (unless a misconfiguration)
            if isinstance(e, TimeoutError) and identity is not None:
                from .auto_server import forget
                forget(path, identity)  # its backlog is full: stopped or starved
                absent = True
                return None
            why = _unreachable(path, e)
            if why is not None:
                not_using(f"HCP_LINUX_SERVER={path}", why)
            else:
                absent = True
            return None
        pid, uid, gid = peer(sock)
        why = None
        if (uid, gid) != (os.geteuid(), os.getegid()):
            why = f"it runs as uid {uid} gid {gid}"
        else:
            why = same_place(pid) or more_confined(pid)
        if why is not None:
            not_using(f"the server at {path}", why)
            return None
        client = _Client(sock)
        try:
            return client.run(args)
        except Exception as e:
            if client.started:  # never run a command twice: this is the run's end
                raise
            if isinstance(e, TimeoutError) and identity is not None:
                from .auto_server import forget
                forget(path, identity)  # stopped or starved: the next run starts another
                absent = True
            return None  # a server that went away, or spoke nonsense: nothing was started
    except OSError:
        return None
    finally:
        sock.close()


def unanswered(path: str, identity: str, auto: bool) -> None:
    """The native client took ``path`` for a server, sent its request and had no answer in
    time (``identity``: the socket's ``DEV:INO`` then, from ``HCP_LINUX_UNANSWERED``): as if
    this client had waited (:func:`run_via_server`), without waiting again. None: the run
    goes on in-process; ``auto``: that socket is forgotten and the run starts a server."""
    global absent
    absent = False
    dev, _, ino = identity.partition(":")
    if auto and dev.isdigit() and ino.isdigit():
        from .auto_server import forget
        forget(path, (int(dev), int(ino)))
        absent = True
    return None


def _identity(path: str) -> tuple[int, int] | None:
    """(device, inode) of the socket at ``path``; None when there is none (connect says)."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


class _Client:
    def __init__(self, sock) -> None:  # type: ignore[no-untyped-def]
        self.sock = sock
        self.started = False  # a command may have run: falling back would run it again

    def ask(self, items: "Sequence[bytes]") -> list[bytes]:
        self.sock.sendall(encode(items))
        _import_the_rest()  # while the server plans: on another CPU, or idle time here
        reply = recv_frame(self.sock)
        if reply[:1] == [b"spare"]:  # for the native client; this one spawns with the plan
            reply = recv_frame(self.sock)
        if not reply:
            raise ValueError("empty reply")
        return reply

    def run(self, args: list[str]) -> int | None:
        """One request, then plans until one reaches exec (a setup failure goes back to the
        server, which answers with the error it means or a plan without a missing layer the
        policy lets degrade), then the run, as cli._run does it."""
        pipes = _Pipes()
        receipt_dir = None
        try:
            reply = self.ask(_request(args, pipes))
            while True:
                kind = reply[0]
                if kind == b"fallback":
                    return None
                if kind == b"exit":  # refused: what the in-process run would print
                    sys.stderr.write(reply[2].decode(errors="replace"))
                    sys.stderr.flush()
                    return int(reply[1])
                if kind != b"plan" or len(reply) != 12:
                    raise ValueError(f"unexpected reply {kind!r}")
                # the token names the run's end for a client with no Python (finish)
                exe, plan, receipt, timeout, _kill_request, receipt_to, swept, made = reply[1:9]
                owed = os.fsdecode(reply[10])  # the record of this sweep, ours to remove
                try:  # until hcp-exec is started nothing runs: a failure here pays it
                    entries = decode_sweep(swept)
                    after = decode_after(made)
                    if receipt_dir is None:  # fixed before the command can change the path;
                        # one that cannot be opened: the in-process run refuses it in a line
                        receipt_dir = open_receipt_dir(receipt_to.decode())
                    import time
                    from ..proc.teardown import SETUP_TIMEOUT, Monitor, read_to_eof
                    pid = _spawn(exe, plan, pipes)
                except BaseException:
                    if owed:
                        from ..policy.protected.pending import paid
                        paid(owed)
                    raise
                monitor = Monitor(pid, True)
                self.started = True
                pipes.close_ours()
                try:  # EOF: the command was exec'd; None: no answer in time
                    record = read_to_eof(pipes.err_r, time.monotonic() + SETUP_TIMEOUT)
                except BaseException:  # ^C before the wait took over: leave nothing behind
                    monitor.kill()
                    monitor.wait(None)
                    err_r, pipes.err_r = pipes.err_r, -1
                    _settle_setup(err_r, entries, after, owed)  # it may have planted first
                    raise
                if record is None:
                    monitor.kill()
                    monitor.wait(None)
                    if owed:  # nothing ran
                        from ..policy.protected.pending import paid
                        paid(owed)
                    from ..errors import SetupTimeoutError
                    error = SetupTimeoutError(SETUP_TIMEOUT)
                    sys.stderr.write(f"error: sandbox: {error}\n")
                    return error.exit_code
                if not record:
                    self.sock.close()  # the server is free for the next client
                    return _wait(monitor, pipes.done_r, float(timeout) if timeout else None,
                                 receipt, receipt_to.decode(), entries, after, receipt_dir,
                                 owed)
                monitor.over()  # it exits 125 after its report: nothing ran
                monitor.wait(None)
                monitor.close()
                self.started = False
                from ..protocol import ERROR_RECORD
                step, errno_ = ERROR_RECORD.unpack_from(record)
                pipes.close()
                pipes = _Pipes()
                reply = self.ask([b"failed", b"%d" % step, b"%d" % errno_, record[4:],
                                  b"%d" % pipes.done_w])
        finally:
            pipes.close()


def _import_the_rest() -> None:
    """Import what the run's end needs (the sweep, the teardown) while the server plans:
    imported after the command exits instead, they add to every served run's wall time
    (issue 35). A reply that ends in the in-process run wastes them; that run imports them
    too. The receipt's JSON is parsed only when it is written (--receipt)."""
    from ..policy import protected  # noqa: F401
    from ..proc import teardown  # noqa: F401


class _Pipes:
    """The error pipe (EOF at exec, else the failed step) and the done pipe (the init
    writes the command's status) of one attempt; our write ends close once hcp-exec has
    them."""

    def __init__(self) -> None:
        self.err_r, self.err_w = os.pipe2(os.O_CLOEXEC)
        self.done_r, self.done_w = os.pipe2(os.O_CLOEXEC)

    def close_ours(self) -> None:
        for name in ("err_w", "done_w"):
            fd = getattr(self, name)
            if fd >= 0:
                os.close(fd)
                setattr(self, name, -1)

    def close(self) -> None:
        self.close_ours()
        for name in ("err_r", "done_r"):
            fd = getattr(self, name)
            if fd >= 0:
                os.close(fd)
                setattr(self, name, -1)


def _request(args: list[str], pipes: _Pipes) -> list[bytes]:
    umask, ignored, blocked = process_status()
    ttys = []
    for fd in (0, 1, 2):
        try:
            ttys.append(os.fsencode(os.ttyname(fd)) if os.isatty(fd) else b"")
        except OSError:
            ttys.append(b"")
    items = [PROTOCOL, b"run", os.fsencode(os.getcwd()), b"%d" % umask, b"%d" % ignored,
             b"%d" % blocked, b"%d" % pipes.done_w, *ttys, hard_limits(),
             b"%d" % len(args), *(os.fsencode(a) for a in args)]
    items += [k + b"=" + v for k, v in os.environb.items()]
    return items


def _spawn(exe: bytes, plan: bytes, pipes: _Pipes) -> int:
    """hcp-exec with the plan, our fds 0-2 its stdio."""
    fd = memfd(plan)
    try:
        return spawn_hcp_exec(exe, fd, pipes.err_w, {pipes.done_w})
    finally:
        os.close(fd)


def _wait(monitor, done_r: int, timeout: float | None, receipt: bytes,  # type: ignore
          receipt_to: str, entries: "tuple[SweepEntry, ...]",
          after: tuple, receipt_dir: int | None = None, owed: str = "") -> int:
    """What cli._run does once the command runs: ^C, TERM or HUP kill the whole sandbox,
    and so does the timeout (the runtime's own SIGKILL, hcp_linux.proc.teardown); then
    :func:`_end`."""
    import _signal
    import time

    from ..proc.teardown import readable

    class Killed(Exception):
        pass

    def on_signal(signum: int, _frame: object) -> None:
        monitor.kill()
        raise Killed(signum)  # out of the wait: from now on it is bounded
    for sig in (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP):
        if _signal.getsignal(sig) != _signal.SIG_IGN:  # ignored when we started (nohup, a
            _signal.signal(sig, on_signal)  # background job's INT): stays so, as in-process
    by, signum = "exit", 0
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        while not readable(done_r, None if deadline is None
                           else max(0.0, deadline - time.monotonic())):
            if deadline is not None and time.monotonic() >= deadline:
                by = "timeout"
                monitor.kill()
                break
    except Killed as k:
        by, signum = "kill", k.args[0]
    return _end(monitor, done_r, by, signum, timeout, receipt, receipt_to, entries, after,
                receipt_dir, owed=owed)


def _end(monitor, done_r: int, by: str, signum: int,  # type: ignore[no-untyped-def]
         timeout: float | None, receipt: bytes, receipt_to: str,
         entries: "tuple[SweepEntry, ...]", after: tuple,
         receipt_dir: int | None = None, status: int | None = None, owed: str = "") -> int:
    """The end of a run ``by`` "exit", "timeout" or "kill" (``signum``): the command's
    status (from the done pipe, unless ``status`` says it: read already), the monitor waited
    for (``monitor`` None: reaped already), the sweep of ``entries`` (the protected names')
    and the after-run search (``after``: the After and the run's start), then its record
    removed (``owed``: hcp_linux.policy.protected.pending), the receipt when it is written,
    and the exit status."""
    import _signal

    from ..proc.teardown import TEARDOWN_WAIT, readable
    from ..protocol import init_report
    for sig in (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP):
        _signal.signal(sig, _signal.SIG_IGN)  # the run is ending already
    if status is None:
        status, said = init_report(os.read(done_r, 4) if readable(done_r, TEARDOWN_WAIT)
                                   else b"")
        by = said if by == "exit" else by  # the init's word, unless the run was ended here
    notes: list[str] = []
    if monitor is not None:
        monitor.over()  # the init reported, or is gone: the monitor's time to exit counts
        waited = monitor.wait(None)
        monitor.close()
        notes = monitor.notes
        if status is None:
            status = waited
    assert status is not None
    timed_out = by == "timeout"
    from ..policy.protected import sweep_run
    done = sweep_run(entries, *after)  # every process of the run is gone (the init said)
    if owed:
        from ..policy.protected.pending import paid
        paid(owed)
    rec: dict = {}  # end_of_run writes it only with somewhere to write it to
    from ..receipt_keys import set_end, set_protected_sweep
    if receipt_to:
        import json
        rec = json.loads(receipt)
        set_protected_sweep(rec, done)
    set_end(rec, by, notes)  # end_of_run says the line of a run lost or killed by its init
    if signum:  # as the in-process run: the receipt, then die by that signal
        from .interrupt import end_by_signal
        end_by_signal(signum, rec, receipt_to, os.waitstatus_to_exitcode(status), receipt_dir)
    return end_of_run(rec, receipt_to, os.waitstatus_to_exitcode(status), timed_out, timeout,
                      receipt_dir=receipt_dir)


#: What hcp_linux/native/hcp_client.c says when it hands a run over (FINISH_VERSION).
FINISH_VERSION = b"finish 2"


def finish(fd: int) -> int | None:
    """Take over a run the native client (hcp_linux/native/hcp_client.c) started, then
    exec'd this program (``HCP_LINUX_FINISH=FD``): a memfd saying where the run stands,
    hcp-exec still our child (an exec keeps the process), its pipes still open. The phases:

    - ``setup``: no exec yet, and a signal came (it is died by, once the run is killed) or
      the setup's time ran out (its line, its exit status);
    - ``failed``: a step failed, nothing ran: hcp-exec is waited for, then None: the run
      is made again here, as if the native client had never been (its errors, its fallbacks);
    - ``run``: the command runs, and a signal or the timeout ends it;
    - ``over``: the command's end came, and its monitor has not exited in a second;
    - ``end``: all is over and reaped, and the server could not end the run.

    Then as the Python client ends a run (:func:`_end`). A handover that is not one (not a
    memfd of ours, a pid not our child, a malformed state) is one line and exit 125; its
    pid is not touched."""
    from ..errors import EXIT_REFUSED
    from .serve_wire import decode
    try:
        items = decode(_read_handover(fd))
        if items[:1] != [FINISH_VERSION] or len(items) != 11:
            raise ValueError("not a handover of this version")
        phase = items[1].decode()
        pid, done_r, err_r, signum, status = (int(i) for i in items[2:5] + items[6:8])
        timeout = float(items[5]) if items[5] else None
        entries, after = decode_sweep(items[8]), decode_after(items[9])
        owed = os.fsdecode(items[10])  # the sweep's record (the server wrote it)
        if phase not in ("setup", "failed", "run", "over", "end") \
                or (pid != -1) != (phase != "end") or (pid != -1 and not _our_child(pid)):
            raise ValueError(f"phase {phase!r} of pid {pid}")
    except (OSError, ValueError) as e:
        sys.stderr.write(f"error: sandbox: {FINISH_ENV}: {e}\n")
        return EXIT_REFUSED
    from ..proc.teardown import Monitor
    monitor = Monitor(pid, True) if pid != -1 else None
    if err_r >= 0 and phase != "setup":
        os.close(err_r)
    if phase in ("setup", "failed"):
        assert monitor is not None
        if phase == "setup":
            monitor.kill()
        monitor.over()
        monitor.wait(None)
        monitor.close()
        os.close(done_r)
        # "setup": no exec when the client's signal or timeout came, but the setup went on
        # while this program started: every process of it is gone now
        if phase == "setup":
            _settle_setup(err_r, entries, after, owed)
        elif owed:
            from ..policy.protected.pending import paid
            paid(owed)
        if phase == "failed":
            return None
        if signum:
            from .interrupt import die_by
            die_by(signum)
        from ..errors import SetupTimeoutError
        from ..proc.teardown import SETUP_TIMEOUT
        error = SetupTimeoutError(SETUP_TIMEOUT)
        sys.stderr.write(f"error: sandbox: {error}\n")
        return error.exit_code
    by = "exit"
    if phase == "run":
        assert monitor is not None
        monitor.kill()
        by = "kill" if signum else "timeout"
    return _end(monitor, done_r, by, signum, timeout, b"", "", entries, after, owed=owed,
                status=None if status == -1 else status)


def _settle_setup(err_r: int, entries: "tuple[SweepEntry, ...]", after: tuple,
                  owed: str) -> None:
    """The end of a run killed during its setup, once every process of it is gone: unless
    its error pipe (``err_r``, closed here) holds a failure record (a failed step always
    writes one; the exec, or a helper's death, closes the pipe with none), the command may
    have run, and what it made at the protected names goes; then the sweep's record."""
    if _exec_not_ruled_out(err_r):
        from ..policy.protected import sweep_run
        sweep_run(entries, *after)
    if owed:
        from ..policy.protected.pending import paid
        paid(owed)


def _exec_not_ruled_out(err_r: int) -> bool:
    """Whether the error pipe ``err_r`` (closed here) of a run whose processes are all gone
    holds no failure record."""
    if err_r < 0:
        return True
    try:
        os.set_blocking(err_r, False)  # never wait: a writer left would be a surprise
        return not os.read(err_r, 4096)
    except OSError:  # BlockingIOError among them
        return True
    finally:
        os.close(err_r)


#: The variable that names the handover (hcp_linux/native/hcp_client.c's FINISH_ENV).
FINISH_ENV = "HCP_LINUX_FINISH"


def _read_handover(fd: int) -> bytes:
    """The handover's bytes: ``fd`` must be the client's memfd, which is then closed."""
    link = os.readlink(f"/proc/self/fd/{fd}")
    if not link.startswith("/memfd:hcp-finish "):
        raise ValueError(f"fd {fd} is not the native client's handover")
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        parts = []
        while True:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            parts.append(chunk)
    finally:
        os.close(fd)
    body = b"".join(parts)
    from _struct import unpack_from
    if len(body) < 4 or unpack_from("<I", body)[0] != len(body) - 4:
        raise ValueError("a truncated handover")
    return body[4:]


def _our_child(pid: int) -> bool:
    """Whether ``pid`` is a child of this process (which the Monitor's pidfd is for)."""
    from ..proc.teardown import _parent
    try:
        return _parent(pid) == os.getpid()
    except OSError:
        return False
