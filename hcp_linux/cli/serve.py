"""`hcp-linux serve --socket PATH`: plans for `hcp-linux run`, compiled in a warm process.

A client (hcp_linux.cli.serve_client, with ``HCP_LINUX_SERVER=PATH``) sends its `run` arguments and
its process state: cwd, environment, umask, ignored and blocked signals, hard limits, the
terminals on its fds 0-2, and the fd number of its done pipe. The server answers
with what the in-process run would do: the plan hcp-exec reads (compiled as if in the
client: the client's pid as the parent, its umask and signals), the receipt (for a run that
writes one), or the refusal the CLI would print. The client starts hcp-exec itself, so the
sandbox descends from it; a setup failure comes back here and is answered as Sandbox.spawn
answers it (the error, or a plan without a layer the policy lets degrade).

The server runs nothing and writes nothing on a client's behalf: a request whose run would
need that (a pack, a policy file read here, a jail-side temp dir without a mount view, the
egress proxy) is answered "fallback", and the client runs in-process. It serves only its own
user, in its own mount, pid and user namespaces and cgroup, with its hard limits (the plan's
paths, pids, rlimits and the receipt's facts mean the same there), under no confinement it
lacks itself (no_new_privs, seccomp), one request at a time: each takes the client's cwd and
environment as this process's own while it is compiled. The seccomp programs are compiled
when it starts, so that a request never touches the program cache.
"""
from __future__ import annotations

import contextlib
import dataclasses
import errno
import io
import json
import os
import signal
import socket
import stat
import sys
from typing import Any, Callable

from .. import receipt_keys as keys
from .. import native, protocol
from ..ctypes_executor import child
from ..observe import landlock_log
from .cli_args import build_parser, check_outputs, command_of, policy_from_args
from ..errors import ChildSetupError, SandboxError, printable
from ..proc.hcp_spawn import hard_limits
from ..proc.peer import MAX_SOCKET_PATH, more_confined, peer, same_place
from ..observe.denials import complete, denial_layers
from ..plan.plan import Plan
from ..plan.rulesets import answered_by_filter
from ..policy.policy import DEFAULT_SECCOMP_PROFILES, NATIVE_LOCAL
from ..policy.protected import After, SweepEntry
from ..policy.protected.pending import owe, owner_of, paid
from ..sandbox import Sandbox
from .serve_wire import PROTOCOL, encode, encode_after, encode_sweep, recv_frame

#: A client that says nothing for this long is dropped (the server is sequential).
REQUEST_TIMEOUT = 10.0
#: The layers a served plan must have: a mount view (no temp dir in the jail, the Landlock
#: ruleset made by hcp-exec), a pid namespace (the done pipe, the kill request) and a user
#: namespace (the capability drop does not depend on the server's capabilities).
SERVED_LAYERS = frozenset({"userns", "mountns", "pidns"})


def serve(path: str | None, idle_exit: float | None = None, auto: bool = False) -> int:
    """Listen on ``path`` until SIGTERM or SIGINT, or ``idle_exit`` seconds without a
    request, or until this server's code changes; then remove it. ``auto``: the user's own
    server's socket instead (hcp_linux.cli.auto_server), started by a run."""
    if auto:
        server = _auto_server(idle_exit)
        if server is None:
            return 0  # another one is there, or starting: the runs have a server
    else:
        assert path is not None
        server = _Server(_socket_path(path), idle_exit)
    shown = printable(server.path)
    # before it says it listens: a SIGTERM sent on that line must remove the socket too
    signal.signal(signal.SIGTERM, lambda *_: server.stop())
    print(f"hcp-linux serve: listening on {shown} (clients: HCP_LINUX_SERVER={shown})",
          file=sys.stderr, flush=True)
    try:
        server.loop()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
    return 0


def _socket_path(path: str) -> str:
    """``--socket`` as the absolute path the server binds and clients are told; refused
    when empty or too long for a unix socket (bind's own error says neither)."""
    if not path:
        raise SandboxError("serve: --socket: empty path")
    try:
        absolute = os.path.abspath(path)
    except OSError as e:  # a relative path, from a directory that was removed
        raise SandboxError(f"serve: {printable(path)}: the current directory: "
                           f"{e.strerror}") from None
    if len(os.fsencode(absolute)) > MAX_SOCKET_PATH:
        raise SandboxError(f"serve: {printable(absolute)}: longer than {MAX_SOCKET_PATH} "
                           f"bytes, the limit of a unix socket's path")
    return absolute


def _auto_server(idle_exit: float | None) -> "_Server | None":
    """The user's own server (`serve --auto`), listening; None when another one listens
    or is starting (it holds the lock): two runs that found none each start one."""
    import fcntl

    from ..runtime_files import make_private_directory
    from .auto_server import IDLE_EXIT, directory, lock_path, socket_path
    os.chdir("/")  # hold no directory of the run that started it
    where = directory()
    try:
        make_private_directory(where)
    except (OSError, ValueError) as e:
        why = e.strerror if isinstance(e, OSError) else str(e)
        raise SandboxError(f"serve: {printable(where)}: {why}") from None
    lock = [os.open(lock_path(),
                    os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)]

    def unlock() -> None:  # listening (or not): a later server finds the socket answered
        if lock:
            os.close(lock.pop())
    try:
        try:
            fcntl.flock(lock[0], fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None
        try:  # unlocked before the warm-up: a server stopped then must not keep others out
            return _Server(socket_path(), IDLE_EXIT if idle_exit is None else idle_exit,
                           listening=unlock)
        except _Listening:
            return None
    finally:
        unlock()


class _Server:
    def __init__(self, path: str, idle_exit: float | None = None,
                 listening: "Callable[[], None] | None" = None) -> None:
        self.code = _code_identity()  # before a client can see it listen
        self.path = path
        self.listener, self.inode = _listen(path)
        if listening is not None:
            listening()
        self.idle_exit = idle_exit
        self.parser = build_parser()  # holds no state between parses
        # token -> (the sweep, the after-run search, the run's start, the record of that
        # sweep: hcp_linux.policy.protected.pending) of each plan sent, for the end of its
        # run (:func:`_end`); the oldest forgotten past MAX_ENDS (its client then ends the
        # run itself: hcp_linux.cli.serve_client.finish)
        self.ends: dict[bytes, tuple[tuple[SweepEntry, ...], After | None, int, str]] = {}
        self.stopping = False
        try:
            _warm()
        except BaseException:
            self.close()
            raise

    def loop(self) -> None:
        while not self.stopping:
            try:
                if self.idle_exit is not None and not _readable(self.listener,
                                                                self.idle_exit):
                    return  # idle for --idle-exit seconds
                # blocking: after stop()'s shutdown it fails at once (a listener with a
                # timeout is non-blocking, and its accept would retry EAGAIN, spinning)
                conn, _ = self.listener.accept()
            except OSError:
                if self.stopping:
                    return
                raise
            with conn:
                if _code_identity() != self.code:
                    # upgraded or rebuilt under it: plans of the old code for the new
                    # hcp-exec (or none) are not its to make; the client runs in-process
                    conn.sendall(encode([b"fallback", b"the server's code changed"]))
                    return
                try:
                    self.serve_one(conn)
                except ConnectionError:  # the client went away (gone, or falling back)
                    pass
                except Exception as e:  # the client falls back; the server goes on
                    print(f"hcp-linux serve: a request failed: {type(e).__name__}: {e}",
                          file=sys.stderr, flush=True)

    def stop(self) -> None:
        self.stopping = True
        self.listener.shutdown(socket.SHUT_RDWR)  # accept() returns

    def close(self) -> None:
        """Stop listening; remove the socket, if what is at the path is still the one we
        bound (whatever replaced it meanwhile is not ours to delete)."""
        self.listener.close()
        with contextlib.suppress(OSError):
            st = os.lstat(self.path)
            if (st.st_dev, st.st_ino) == self.inode:
                os.unlink(self.path)

    def serve_one(self, conn: socket.socket) -> None:
        conn.settimeout(REQUEST_TIMEOUT)
        pid, uid, gid = peer(conn)
        if (uid, gid) != (os.geteuid(), os.getegid()):
            print(f"hcp-linux serve: refused pid {pid}: uid {uid} gid {gid}", file=sys.stderr,
                  flush=True)
            return
        request = recv_frame(conn)
        if request[:2] == [PROTOCOL, b"end"] and len(request) == 4:
            # the end of a run this server planned: the token alone names it (a secret only
            # that run's client was sent), and the server does only what it planned for it
            return _end(self, conn, request[2], request[3])
        # a client under a confinement we lack would have us read or write on its behalf
        # what it may not; one that sees other paths or processes, or sits in another
        # cgroup, would get a plan (and a receipt) that is not its own
        try:
            why = same_place(pid) or more_confined(pid) or _other_cgroup(pid)
        except FileNotFoundError:  # /proc/PID: the client is gone already
            return
        if why is not None:
            conn.sendall(encode([b"fallback", why.encode()]))
            return
        if request[:2] != [PROTOCOL, b"run"] or len(request) < 12:
            raise ValueError("not a run request of this protocol")
        with _as_client(request) as (state, args):
            _answer(self, conn, pid, state, args)


def _listen(path: str) -> tuple[socket.socket, tuple[int, int]]:
    """A listening socket bound at ``path`` (mode 0600), and its (device, inode).

    Something already at ``path`` is removed only when it is a stale socket: a socket inode
    of ours that nobody answers on (a server that died). Anything else (a file, a directory,
    another user's socket, one a server listens on) is refused and left as it is."""
    shown = printable(path)
    _remove_stale_socket(path, shown)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)  # the socket is born 0600: only this user can connect
    try:
        listener.bind(path)
        st = os.lstat(path)
    except OSError as e:
        listener.close()
        raise SandboxError(f"serve: {shown}: {e.strerror or e}") from None
    finally:
        os.umask(old)
    listener.listen(16)
    return listener, (st.st_dev, st.st_ino)


def _remove_stale_socket(path: str, shown: str) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as e:
        raise SandboxError(f"serve: {shown}: {e.strerror}") from None
    if not stat.S_ISSOCK(st.st_mode):
        what = "a directory" if stat.S_ISDIR(st.st_mode) else "not a socket"
        raise SandboxError(f"serve: {shown}: exists and is {what} (left as it is)")
    if st.st_uid != os.geteuid():
        raise SandboxError(f"serve: {shown}: a socket of uid {st.st_uid}, not ours "
                           f"(left as it is)")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(REQUEST_TIMEOUT)
        probe.connect(path)
    except ConnectionRefusedError:  # a socket nobody serves: left by a server that died
        try:
            again = os.lstat(path)  # still that inode: not one swapped in meanwhile
        except FileNotFoundError:
            return
        if (again.st_dev, again.st_ino) != (st.st_dev, st.st_ino):
            raise SandboxError(f"serve: {shown}: replaced while it was checked") from None
        try:
            os.unlink(path)
        except OSError as e:
            raise SandboxError(f"serve: {shown}: {e.strerror}") from None
    except OSError as e:
        raise SandboxError(f"serve: {shown}: {e.strerror or e}") from None
    else:
        raise _Listening(f"serve: {shown}: another server is listening there")
    finally:
        probe.close()


def _readable(listener: socket.socket, seconds: float) -> bool:
    """Whether a client (or stop()'s shutdown) comes within ``seconds``."""
    import select
    poller = select.poll()
    poller.register(listener, select.POLLIN)
    return bool(poller.poll(seconds * 1000))


class _Listening(SandboxError):
    """Another server answers at the socket's path (left as it is)."""


def _code_identity() -> list[tuple[int, int, int] | None]:
    """(device, inode, mtime) of hcp-exec and of this module's and the package's files: a
    server outlives an upgrade of the package it was started from, which it must not
    serve for (its plans are for its own hcp-exec and code)."""
    out: list[tuple[int, int, int] | None] = []
    for path in (native.binary(), __file__, protocol.__file__, native.__file__):
        try:
            st = os.stat(path) if path else None
        except OSError:
            st = None
        out.append(None if st is None else (st.st_dev, st.st_ino, st.st_mtime_ns))
    return out


#: The receipt's denial_layers.seccomp for a served run.
SERVED_UNRECORDED = ("unavailable: served run (hcp-linux serve): the client starts hcp-exec "
                     "and runs no listener; the filter answers denials itself")


def _warm() -> None:
    """Compile the seccomp programs a served plan can name, now, in the server's own
    environment: a request then finds them in memory and never reads or writes the disk
    cache where a client's environment (XDG_CACHE_HOME) would point."""
    import hcp_linux.seccomp_profiles as seccomp_profiles
    # a policy made from flags names the default profiles (others need a policy file, which
    # is not served); without a network namespace its plan adds network-off
    for names in (DEFAULT_SECCOMP_PROFILES, DEFAULT_SECCOMP_PROFILES + ("network-off",)):
        seccomp_profiles.compile_profiles(names)
        seccomp_profiles.compile_profiles(names, notify=True)


def _other_cgroup(pid: int) -> str | None:
    """The receipt says what cgroup limits could do here: the client must be in our cgroup."""
    with open(f"/proc/{pid}/cgroup", "rb") as f, open("/proc/self/cgroup", "rb") as g:
        return None if f.read() == g.read() else "another cgroup"


@contextlib.contextmanager
def _as_client(request: list[bytes]):  # type: ignore[no-untyped-def]
    """Take the client's cwd and environment as ours while its plan is compiled."""
    cwd, umask, ignored, blocked, done_w, tty0, tty1, tty2, limits, nargs = request[2:12]
    n = int(nargs)
    args = [os.fsdecode(a) for a in request[12:12 + n]]
    env = dict(item.split(b"=", 1) for item in request[12 + n:] if b"=" in item)
    state = {"process": (int(umask), int(ignored), int(blocked)), "done_w": int(done_w),
             "terminals": [os.fsdecode(t) for t in (tty0, tty1, tty2) if t], "limits": limits}
    old_cwd, old_env = os.open(".", os.O_PATH | os.O_CLOEXEC), dict(os.environb)
    try:
        os.chdir(cwd)
        _become(env)
        yield state, args
    finally:
        _become(old_env)
        os.fchdir(old_cwd)
        os.close(old_cwd)


def _become(env: dict[bytes, bytes]) -> None:
    """Make this process's environment (``os.environb`` and the C ``environ`` under it)
    ``env``, exactly, by changing only the variables that differ: a client's environment
    is mostly the server's own, and clearing and refilling ~70 variables, each a putenv or
    an unsetenv, cost ~0.25 ms of every request (issue 35)."""
    current = os.environb
    for name in [n for n in current if n not in env]:
        del current[name]
    for name, value in env.items():
        if current.get(name) != value:
            current[name] = value


def _answer(server: _Server, conn: socket.socket, pid: int, state: dict[str, Any],
            args: list[str]) -> None:
    """What the in-process `run` would do with ``args``, as far as it is planning."""
    def say(*items: bytes) -> None:
        conn.sendall(encode(list(items)))

    def refuse(code: int, text: str) -> None:
        say(b"exit", b"%d" % code, text.encode())

    if state["limits"] != hard_limits():  # the plan's rlimits are clamped to them
        return say(b"fallback", b"other hard limits")
    stderr, stdout = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(stdout):
            a = server.parser.parse_args(args)
    except SystemExit as e:  # a usage error: the parser printed its line
        if not e.code:  # --help: printed to stdout, which is the client's to print
            return say(b"fallback", b"help")
        return refuse(int(e.code), stderr.getvalue())
    if (a.cmd != "run" or a.pack is not None or a.principal is not None or a.policy
            or a.preset is not None
            or a.executor == "ctypes" or native.binary() is None):
        return say(b"fallback", b"not served here")
    if a.explain:  # denials are recorded by a listener in the process that runs it
        return say(b"fallback", b"--explain")
    try:
        argv = command_of(a)
        check_outputs(a)
        # never this server's own configs: a client with configs runs in-process (launch)
        policy = policy_from_args(a, configs=False)
        check_outputs(a, policy)
    except SandboxError as e:
        return refuse(e.exit_code, f"error: sandbox: {printable(str(e))}\n")
    if policy.network == "allow":  # the egress proxy lives in the process that runs it
        return say(b"fallback", b"network allow")
    if policy.mode == NATIVE_LOCAL:  # its plan makes a temp dir in the jail
        return say(b"fallback", b"native-local")
    hinted: list[int] = []  # the namespace flags of the spare the client was told of

    def allowed(layers: frozenset[str]) -> None:
        """The command is allowed: the client may start hcp-exec's plan-independent steps
        (a spare: hcp_linux.native.spares) while the confinement is compiled, ~1 ms here.
        Only once, and never before: a refused run starts nothing."""
        if not hinted:
            hinted.append(protocol.namespace_flags(layers))
            say(b"spare", os.fsencode(native.binary() or ""), b"%d" % hinted[0],
                b"%d" % os.getuid(), b"%d" % os.getgid())

    # Stop before compiling a plan without a mount view: that one makes a temp dir in the jail
    attempts = Sandbox(policy, executor="native").attempts(argv, terminals=state["terminals"],
                                                          only_with=SERVED_LAYERS,
                                                          allowed=allowed)
    owed = ""  # the record of the sweep of the plan last sent, while its run may start
    try:
        plan, make_receipt = next(attempts)
        while True:
            if not _servable(plan):
                return say(b"fallback", b"a plan this server does not serve")
            served = _served_plan(plan, pid)
            fds = protocol.RunFds(-1, (0, 1, 2), done=state["done_w"])
            blob = native.plan_bytes(served, fds, None, set_umask=True, process=state["process"])
            # A receipt only for a run that writes one (--receipt): the client has no other
            # use for it, and making and encoding it cost ~0.35 ms of every request
            receipt: dict[str, Any] = {}
            if a.receipt:
                receipt = make_receipt()
                keys.set_served_by(receipt, os.getpid(), server.path)
                keys.set_executor(receipt, "native")  # the client starts hcp-exec with it
                keys.set_denial_layers(receipt, denial_layers(served))
                complete(receipt, None)  # none recorded: see denial_layers
            swept = encode_sweep(plan.protect.sweep if plan.protect is not None else ())
            made = encode_after(plan.protect.after if plan.protect is not None else None,
                                plan.protect_since)
            token = os.urandom(16).hex()
            owed = _owe(plan, pid, token, receipt)
            try:
                say(b"plan", os.fsencode(native.binary() or ""), blob,
                    json.dumps(receipt).encode() if a.receipt else b"",
                    b"" if policy.timeout is None else repr(policy.timeout).encode(),
                    b"%d" % child.KILL_REQUEST, (a.receipt or "").encode(), swept, made,
                    _remember_end(server, token.encode(), plan, owed),
                    os.fsencode(owed), b"1" if _spare_takes(hinted, served) else b"")
            except OSError:  # the client is gone: it never had the plan
                paid(owed)
                raise
            try:
                report = recv_frame(conn)
            except ConnectionError:  # it ran: the client closed
                return None
            if report[:1] != [b"failed"] or len(report) != 5:
                raise ValueError("expected a setup failure report")
            step_i, err, detail, done_w = report[1:]
            paid(owed)  # a setup step failed: nothing ran
            owed = ""
            state["done_w"] = int(done_w)
            step = protocol.step_name(int(step_i))
            failure = ChildSetupError(step, int(err) or errno.EIO, detail.decode(errors="replace"))
            plan, make_receipt = attempts.throw(failure)
    except StopIteration:  # the next plan would lack a layer a served plan needs
        return say(b"fallback", b"a plan this server does not serve")
    except SandboxError as e:
        return refuse(e.exit_code, f"error: sandbox: {printable(str(e))}\n")
    finally:
        attempts.close()


#: How many planned runs' ends the server keeps for their clients (a few hundred bytes each).
MAX_ENDS = 256


def _owe(plan: Plan, pid: int, token: str, receipt: dict) -> str:
    """The record of the run's sweep (hcp_linux.policy.protected.pending), written before
    the client can start the command, its owner the client (its runtime): a client killed
    during the run leaves it to a later run. Its path, or "" (none to write, or none
    written: the receipt says why)."""
    found = plan.protect
    if found is None or not (found.sweep or found.after is not None):
        return ""
    try:
        return owe(found.sweep, found.after, plan.protect_since, owner_of(pid), token)
    except (OSError, ValueError) as e:
        keys.set_protected_pending(receipt, e.strerror if isinstance(e, OSError)
                                   and e.strerror else str(e))
        return ""


def _remember_end(server: _Server, token: bytes, plan: Plan, owed: str) -> bytes:
    """``token`` names the end of the run ``plan`` is for: the native client asks the
    server to sweep it (:func:`_end`), and the server sweeps only what it planned, never
    paths a client names (and removes its record, ``owed``). Kept as the values the plan
    holds (frozen), not as sent: decoding them again cost ~0.1 ms of every run's end."""
    found = plan.protect
    server.ends[token] = (found.sweep if found is not None else (),
                          found.after if found is not None else None, plan.protect_since,
                          owed)
    while len(server.ends) > MAX_ENDS:
        del server.ends[next(iter(server.ends))]
    return token


def _end(server: _Server, conn: socket.socket, token: bytes, status: bytes) -> None:
    """The end of a served run whose command is over (every process of it gone): the sweep
    of the protected names and the after-run search the plan named, then the exit code, as
    the Python client does them (hcp_linux.cli.serve_client._end) for a run that writes no
    receipt. A token this server did not give, or forgot, is answered "fallback": the client
    sweeps itself. Only the native client asks (hcp_linux/native/hcp_client.c): it has no
    Python of its own to do it in."""
    from ..policy.protected import sweep_run
    from .run_end import end_of_run
    planned = server.ends.pop(token, None)
    if planned is None or not status.lstrip(b"-").isdigit():
        conn.sendall(encode([b"fallback", b"no such run"]))
        return
    sweep, after, since, owed = planned
    sweep_run(sweep, after, since)
    paid(owed)
    code = end_of_run({}, None, os.waitstatus_to_exitcode(int(status)), False, None)
    conn.sendall(encode([b"ended", b"%d" % code]))


def _served_plan(plan: Plan, pid: int) -> Plan:
    """``plan`` as the client runs it: the client (``pid``) starts hcp-exec, and has no
    listener: the filter answers its denials itself, as before, and the receipt says they
    are not recorded; nor does it read the Landlock domain's records."""
    changes: dict[str, Any] = {"parent_pid": pid}
    if plan.seccomp is not None and plan.seccomp_listener:
        changes.update(seccomp=answered_by_filter(plan.seccomp_names), seccomp_listener=False,
                       seccomp_unrecorded=SERVED_UNRECORDED)
    if plan.landlock_log:
        changes.update(landlock_log=False, landlock_restrict=landlock_log.restrict_flags(False))
    return dataclasses.replace(plan, **changes)


def _spare_takes(hinted: list[int], plan: Plan) -> bool:
    """Whether the spare the client was told of (its namespace flags ``hinted``) takes
    ``plan``: hcp-exec refuses a plan it was not started for. Its uid and gid are the
    server's, as every plan compiled here has them (compile_plan)."""
    return hinted == [protocol.namespace_flags(plan.layers)]


def _servable(plan: Plan) -> bool:
    return plan.confined and SERVED_LAYERS <= plan.layers and not plan.proxy
