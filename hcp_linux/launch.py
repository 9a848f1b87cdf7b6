"""The `hcp-linux` command's entry point, and the client side of `hcp-linux serve`.

Python's start-up and the engine's imports cost `hcp-linux run` ~40 ms before the command
runs. With ``HCP_LINUX_SERVER`` set to the socket of a running ``hcp-linux serve``, `run`
asks that warm process for the plan instead (the policy, the bin, the environment, the mount
view, the confinement: compiled there, from this process's arguments, environment, cwd, umask
and signal state) and runs it *here*: hcp-exec is started by this process, so the sandbox
descends from the caller and inherits the caller's own confinement (its Landlock domain,
seccomp filters, cgroup, limits), never the server's. The server runs nothing.

Anything unexpected (no server, a server that is not this user's or lives in other
namespaces or under a confinement this process does not have, a policy file, a pack,
``--network allow``, a host without the layers the fast path needs) falls back to the
ordinary in-process run, which gives the same result. This module imports only what that
path needs (no dataclasses, subprocess, argparse...): that is the point of it.
"""
from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing on the start-up path
if TYPE_CHECKING:
    from typing import Sequence

#: The protocol's name and version; a server that does not say it is not talked to.
PROTOCOL = b"hcp-linux/serve 1"
MAX_FRAME = 16 << 20
#: How long the client waits for the server (connect, each reply) before falling back.
SERVER_TIMEOUT = 5.0


def entry() -> None:
    """The program (`hcp-linux`, `python -m hcp_linux`). A served run ends at once: it
    imported next to nothing and started no thread, and Python's finalisation alone would
    cost ~3 ms more than the run's own overhead."""
    code = main()
    if _served:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except OSError:
                pass
        os._exit(code)
    sys.exit(code)


_served = False


def main(argv: "Sequence[str] | None" = None) -> int:
    global _served
    args = list(sys.argv[1:] if argv is None else argv)
    server = os.environ.get("HCP_LINUX_SERVER")
    if server and args[:1] == ["run"]:
        why = bad_server_path(server)
        if why is not None:
            _not_using(f"HCP_LINUX_SERVER={server}", why)
        else:
            try:
                code = run_via_server(server, args)
            except KeyboardInterrupt:  # as cli.main: nothing of the run is left by then
                from .interrupt import die_by
                die_by(2)
            if code is not None:
                _served = True
                return code
    from .cli import main as cli_main
    return cli_main(args)


#: The longest path a unix socket can have (sun_path, with its NUL).
MAX_SOCKET_PATH = 107


def bad_server_path(path: str) -> str | None:
    """Why ``HCP_LINUX_SERVER`` cannot name a server's socket, or None. A relative path
    would depend on the caller's cwd (the server prints the absolute one to use)."""
    if not path.startswith("/"):
        return "not an absolute path"
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        return f"longer than {MAX_SOCKET_PATH} bytes, the limit of a unix socket's path"
    return None


def _not_using(what: str, why: str) -> None:
    """The one line that says a server is not used, and why (the run goes on in-process,
    with the same result); control characters in the path are escaped."""
    from .errors import printable
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


# --- framing: u32 length, then items (u32 length + bytes each) -----------------------------

def encode(items: "Sequence[bytes]") -> bytes:
    from _struct import pack
    body = b"".join(pack("<I", len(i)) + i for i in items)
    return pack("<I", len(body)) + body


def decode(body: bytes) -> list[bytes]:
    from _struct import unpack_from
    out, pos = [], 0
    while pos < len(body):
        if pos + 4 > len(body):
            raise ValueError("truncated item header")
        (n,) = unpack_from("<I", body, pos)
        pos += 4
        if pos + n > len(body):
            raise ValueError("truncated item")
        out.append(body[pos:pos + n])
        pos += n
    return out


def recv_frame(sock) -> list[bytes]:  # type: ignore[no-untyped-def]
    from _struct import unpack
    head = _recv_exact(sock, 4)
    (n,) = unpack("<I", head)
    if n > MAX_FRAME:
        raise ValueError(f"frame of {n} bytes")
    return decode(_recv_exact(sock, n))


def _recv_exact(sock, n: int) -> bytes:  # type: ignore[no-untyped-def]
    parts, got = [], 0
    while got < n:
        chunk = sock.recv(min(n - got, 1 << 20))
        if not chunk:
            raise ConnectionError("the peer closed the connection")
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


# --- what a peer is -----------------------------------------------------------------------

NAMESPACES = ("mnt", "pid", "user")


def peer(sock) -> tuple[int, int, int]:  # type: ignore[no-untyped-def]
    """(pid, uid, gid) of the process at the other end, from the kernel (SO_PEERCRED)."""
    import _socket
    from _struct import unpack
    return unpack("3i", sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12))


def same_place(pid: int) -> str | None:
    """Why process ``pid`` does not see the file system and processes as we do (its mount,
    pid or user namespace is another), or None."""
    for ns in NAMESPACES:
        try:
            theirs = os.stat(f"/proc/{pid}/ns/{ns}")
            ours = os.stat(f"/proc/self/ns/{ns}")
        except OSError as e:
            return f"/proc/{pid}/ns/{ns}: {e.strerror}"
        if (theirs.st_dev, theirs.st_ino) != (ours.st_dev, ours.st_ino):
            return f"another {ns} namespace"
    return None


def status_fields(pid: "int | str", *names: str) -> dict[str, str]:
    with open(f"/proc/{pid}/status", "rb") as f:
        return parse_status(f.read(), *names)


def parse_status(data: bytes, *names: str) -> dict[str, str]:
    """``names``' values in the text of a /proc/PID/status file (one search per name, not a
    split of its ~60 lines: it is read on every spawn)."""
    out = {}
    text = "\n" + data.decode(errors="replace")
    for name in names:
        start = text.find("\n" + name + ":")
        if start >= 0:
            start += len(name) + 2
            end = text.find("\n", start)
            out[name] = text[start:end if end >= 0 else len(text)].strip()
    return out


#: A server under any of these (and we not) is confined: maybe a command of a sandbox,
#: posing as the server. Its plan is not taken.
CONFINEMENT_FIELDS = ("NoNewPrivs", "Seccomp", "Seccomp_filters")


def more_confined(pid: int) -> str | None:
    """Why process ``pid`` runs under a confinement we do not have, or None."""
    theirs = status_fields(pid, *CONFINEMENT_FIELDS)
    ours = status_fields("self", *CONFINEMENT_FIELDS)
    for key in CONFINEMENT_FIELDS:
        if key in theirs and int(theirs[key] or 0) > int(ours.get(key) or 0):
            return f"{key} {theirs[key]} (ours {ours.get(key)})"
    return None


# --- the client ----------------------------------------------------------------------------

def run_via_server(path: str, args: list[str]) -> int | None:
    """`hcp-linux run ARGS` with the plan from the server at ``path``; None: run in-process
    instead (and nothing was started)."""
    import _socket
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
    try:
        sock.settimeout(SERVER_TIMEOUT)
        try:
            sock.connect(path)
        except OSError as e:  # no server there: nothing to say (unless a misconfiguration)
            why = _unreachable(path, e)
            if why is not None:
                _not_using(f"HCP_LINUX_SERVER={path}", why)
            return None
        pid, uid, gid = peer(sock)
        why = None
        if (uid, gid) != (os.geteuid(), os.getegid()):
            why = f"it runs as uid {uid} gid {gid}"
        else:
            why = same_place(pid) or more_confined(pid)
        if why is not None:
            _not_using(f"the server at {path}", why)
            return None
        client = _Client(sock)
        try:
            return client.run(args)
        except Exception:
            if client.started:  # never run a command twice: this is the run's end
                raise
            return None  # a server that went away, or spoke nonsense: nothing was started
    except OSError:
        return None
    finally:
        sock.close()


class _Client:
    def __init__(self, sock) -> None:  # type: ignore[no-untyped-def]
        self.sock = sock
        self.started = False  # a command may have run: falling back would run it again

    def ask(self, items: "Sequence[bytes]") -> list[bytes]:
        self.sock.sendall(encode(items))
        reply = recv_frame(self.sock)
        if not reply:
            raise ValueError("empty reply")
        return reply

    def run(self, args: list[str]) -> int | None:
        """One request, then plans until one reaches exec (a setup failure goes back to the
        server, which answers with the error it means or a plan without a missing layer the
        policy lets degrade), then the run, as cli._run does it."""
        pipes = _Pipes()
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
                if kind != b"plan" or len(reply) != 7:
                    raise ValueError(f"unexpected reply {kind!r}")
                exe, plan, receipt, timeout, _kill_request, receipt_to = reply[1:]
                from .teardown import SETUP_TIMEOUT, Monitor
                pid = _spawn(exe, plan, pipes)
                monitor = Monitor(pid, True)
                self.started = True
                pipes.close_ours()
                try:  # EOF: the command was exec'd; None: no answer in time
                    record = _read_all(pipes.err_r, SETUP_TIMEOUT)
                except BaseException:  # ^C before the wait took over: leave nothing behind
                    monitor.kill()
                    monitor.wait(None)
                    raise
                if record is None:
                    monitor.kill()
                    monitor.wait(None)
                    from .errors import SetupTimeoutError
                    error = SetupTimeoutError(SETUP_TIMEOUT)
                    sys.stderr.write(f"error: sandbox: {error}\n")
                    return error.exit_code
                if not record:
                    self.sock.close()  # the server is free for the next client
                    return _wait(monitor, pipes.done_r, float(timeout) if timeout else None,
                                 receipt, receipt_to.decode())
                monitor.over()  # it exits 125 after its report: nothing ran
                monitor.wait(None)
                monitor.close()
                self.started = False
                from _struct import unpack_from
                step, errno_ = unpack_from("<HH", record)
                pipes.close()
                pipes = _Pipes()
                reply = self.ask([b"failed", b"%d" % step, b"%d" % errno_, record[4:],
                                  b"%d" % pipes.done_w])
        finally:
            pipes.close()


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
    umask, ignored, blocked = _process_status()
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


def _process_status() -> tuple[int, int, int]:
    """(umask, ignored signals, blocked signals) of this process, as the plan records them
    for an in-process run (hcp_linux.native._process_status, _blocked_signals)."""
    fields = status_fields("self", "Umask", "SigIgn", "SigBlk")
    return int(fields["Umask"], 8), int(fields["SigIgn"], 16), int(fields["SigBlk"], 16)


def hard_limits() -> bytes:
    """This process's hard limits, which a plan's rlimits are clamped to (Limits.rlimits):
    a server serves a client only when they are the same."""
    import resource
    return b",".join(b"%s=%d" % (name.encode(), resource.getrlimit(getattr(resource, name))[1])
                     for name in sorted(dir(resource)) if name.startswith("RLIMIT_"))


def memfd(blob: bytes) -> int:
    """A close-on-exec memfd holding ``blob`` (a plan, a view template)."""
    fd = os.memfd_create("hcp-plan", os.MFD_CLOEXEC)
    try:
        view = memoryview(blob)
        while view:
            view = view[os.write(fd, view):]
    except BaseException:
        os.close(fd)
        raise
    return fd


def spawn_hcp_exec(exe: "str | bytes", plan_fd: int, err_w: int, keep: "set[int]") -> int:
    """hcp-exec with the plan on its command line (``hcp-exec PLAN_FD ERR_FD``), started
    with posix_spawn; the fds in ``keep`` (and those two) are inherited by number, 0-2 as
    they are. OSError as posix_spawn raises it."""
    actions = [(os.POSIX_SPAWN_DUP2, k, k) for k in sorted(keep | {plan_fd, err_w}) if k > 2]
    return os.posix_spawn(exe, ["hcp-exec", str(plan_fd), str(err_w)], {},
                          file_actions=actions)


def _spawn(exe: bytes, plan: bytes, pipes: _Pipes) -> int:
    """hcp-exec with the plan, our fds 0-2 its stdio."""
    fd = memfd(plan)
    try:
        return spawn_hcp_exec(exe, fd, pipes.err_w, {pipes.done_w})
    finally:
        os.close(fd)


def _read_all(fd: int, timeout: float) -> bytes | None:
    """Everything until EOF, or None when EOF has not come within ``timeout`` seconds."""
    import time
    from .teardown import readable
    parts: list[bytes] = []
    deadline = time.monotonic() + timeout
    while True:
        if not readable(fd, max(0.0, deadline - time.monotonic())):
            return None
        chunk = os.read(fd, 4096)
        if not chunk:
            return b"".join(parts)
        parts.append(chunk)


def _wait(monitor, done_r: int, timeout: float | None, receipt: bytes,  # type: ignore
          receipt_to: str) -> int:
    """What cli._run does once the command runs: ^C, TERM or HUP kill the whole sandbox,
    and so does the timeout (the runtime's own SIGKILL, hcp_linux.teardown); then the
    receipt, and the exit status."""
    import _signal
    import time
    from _struct import unpack

    from .teardown import TEARDOWN_WAIT, readable

    class Killed(Exception):
        pass

    def on_signal(signum: int, _frame: object) -> None:
        monitor.kill()
        raise Killed(signum)  # out of the wait: from now on it is bounded
    for sig in (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP):
        _signal.signal(sig, on_signal)
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
    for sig in (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP):
        _signal.signal(sig, _signal.SIG_IGN)  # the run is ending already
    data = os.read(done_r, 4) if readable(done_r, TEARDOWN_WAIT) else b""
    monitor.over()  # the init reported, or is gone: the monitor's time to exit counts
    status = monitor.wait(None)
    monitor.close()
    if len(data) == 4:
        status = unpack("<i", data)[0]
    timed_out = by == "timeout"
    import json
    rec = json.loads(receipt) if receipt_to else {}
    rec["end"] = {"by": by, **({"notes": monitor.notes} if monitor.notes else {})}
    if signum:  # as the in-process run: the receipt, then die by that signal
        from .interrupt import end_by_signal
        end_by_signal(signum, rec, receipt_to, os.waitstatus_to_exitcode(status))
    return end_of_run(rec, receipt_to, os.waitstatus_to_exitcode(status), timed_out, timeout)


def end_of_run(receipt: dict, receipt_to: "str | None", returncode: int, timed_out: bool,
               timeout: float | None) -> int:
    """How `hcp-linux run` ends, served or not: the receipt with the run's exit (to
    ``receipt_to``: a path, or "-" for stderr), the timeout's line, the exit status."""
    if receipt_to:
        from .receipt import write_receipt
        receipt["exit"] = {"returncode": returncode, "timed_out": timed_out}
        try:
            write_receipt(receipt, sys.stderr if receipt_to == "-" else receipt_to)
        except OSError as e:  # checked before the run; this is a race with its removal
            from .errors import EXIT_REFUSED, printable
            print(f"error: sandbox: receipt {printable(receipt_to)}: "
                  f"{e.strerror or e}", file=sys.stderr)
            return EXIT_REFUSED
    if timed_out:
        from .errors import EXIT_TIMEOUT
        print(f"error: sandbox: timed out after {timeout:g}s; the sandbox was killed",
              file=sys.stderr)
        return EXIT_TIMEOUT
    return 128 - returncode if returncode < 0 else returncode
