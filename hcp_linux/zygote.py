"""The program a session runs inside its sandbox: it starts each command the runtime sends.

A session (hcp_linux.session) is one confined run that lasts: this program, started by the
system's ``python3 -I -S`` inside the sandbox, with every layer of the policy already on it
(namespaces, mount view, Landlock, seccomp, no_new_privs, no capability). For each command
the runtime sends (program, argv, environment and working directory, all resolved and
checked by the runtime's plan, plus three fds for stdio) it starts a thread, and the thread
starts the command (vfork/exec): the command is confined exactly as this program is, without
paying for a new confinement, plus a Landlock domain of its own.

**A Landlock domain per command**, nested in the session's: the command's thread calls
``landlock_restrict_self`` (which restricts the calling thread only, and makes a new domain
each time, from one ruleset made at start, :func:`_command_ruleset`) and then starts the
command, which inherits the thread's domain. Landlock lets a process ptrace-access another
(/proc/<pid>/environ, mem, fd/N, maps; pidfd_getfd; process_vm_readv) only if the target is
in its own domain or one nested in it, whatever their uids, and (ABI 6,
``LANDLOCK_SCOPE_SIGNAL``) signal only those. So no process of one command, left behind or
running beside it, can read another command's environment, memory or fds. The alternatives
do not hold here: a process made non-dumpable is dumpable again after its execve; a user
namespace per command keeps the same kernel uid, and a same-uid reader passes the ptrace
check whatever the namespace; a pid namespace per command needs CAP_SYS_ADMIN and a /proc of
its own (the session's /proc shows every nested pid), and Landlock and seccomp forbid both
here. This program stays non-dumpable, so a command cannot read it through its thread either.

**What a command leaves**: with ABI 6 its thread kills the command's whole domain with
``kill(-1, SIGKILL)``, which the scope limits to the domain (the command's tree, setsid'd
processes too, and nothing else): when the command exits (``kill-rest``, the policy's
on_exit = "kill", as a run's init kills its pid namespace) and on a SIGKILL request (the
runtime's timeout). ``kill(-1, 0)`` tells whether anything of the domain is left. Below ABI 6
only the command's process group is killed, and what left it is not found ("unknown").
Orphans are reaped by the run's init.

Stdlib only, no imports from hcp_linux (it runs from source text, ``-c``, with the sandbox's
interpreter). Its control channel is a SOCK_SEQPACKET socket given as fd 0, one message per
packet, the stdio fds as SCM_RIGHTS: the runtime's requests are marshal data (version 4, read
by every Python 3 the sandbox may have; the runtime is the trusted side), the messages out
JSON objects (:func:`encode`; the runtime parses them with json). Messages out: ``{"ready": pid}`` once (or
``{"fatal": why}``), then for each command ``{"id", "pid"}`` or ``{"id", "error": errno}``,
and ``{"id", "status", "leftovers"}`` (exit code or -signal; "none", "killed", "running" or
"unknown"). It is not dumpable, so no command can ptrace it or take its control socket with
pidfd_getfd. On EOF of the channel (the runtime gone) it exits, and the run ends with it.
"""
import ctypes
import marshal
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

PR_SET_DUMPABLE = 4
SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1
LANDLOCK_ACCESS_FS_EXECUTE, LANDLOCK_ACCESS_FS_REFER = 1 << 0, 1 << 13
LANDLOCK_SCOPE_SIGNAL = 1 << 1
MAX_MESSAGE = 1 << 20  # a command's argv and environment: the plan keeps them far smaller
EIO, EINVAL = 5, 22
#: How long a command's thread waits for what it killed to have exited before it reports
#: (the runtime gives a timeout's kill 1 s in all)
KILL_WAIT = 0.5


class Fatal(Exception):
    """This program cannot keep commands apart: it says so and exits (the session fails)."""


def _check(libc, ret, what):
    if ret < 0:
        raise Fatal(f"{what}: {os.strerror(ctypes.get_errno())}")
    return ret


def _command_ruleset(libc):
    """(The fd of the ruleset each command's domain is made from, whether it scopes
    signals.)

    A ruleset must handle some access: it handles execute (and, from ABI 2, refer, which any
    file-system ruleset denies unless granted) and grants both beneath "/", so the command's
    domain takes away no file access the session's allows (on ABI 1, a file-system ruleset
    always denies linking or renaming into another directory; the session's own domain, when
    in force, does too). From ABI 6 it also scopes signals to the domain."""
    abi = libc.syscall(SYS_LANDLOCK_CREATE_RULESET, None, 0, LANDLOCK_CREATE_RULESET_VERSION)
    if abi < 1:
        raise Fatal("a session keeps its commands apart with Landlock, which this kernel "
                    f"does not offer: {os.strerror(ctypes.get_errno())}")
    fs = LANDLOCK_ACCESS_FS_EXECUTE | (LANDLOCK_ACCESS_FS_REFER if abi >= 2 else 0)
    if abi >= 6:  # struct landlock_ruleset_attr: handled_access_fs, _net, scoped
        attr = struct.pack("=QQQ", fs, 0, LANDLOCK_SCOPE_SIGNAL)
    else:
        attr = struct.pack("=Q", fs)
    fd = _check(libc, libc.syscall(SYS_LANDLOCK_CREATE_RULESET, attr, len(attr), 0),
                "landlock_create_ruleset")
    os.set_inheritable(fd, False)
    root = os.open("/", os.O_PATH | os.O_CLOEXEC)
    try:  # struct landlock_path_beneath_attr (packed): allowed_access, parent_fd
        rule = struct.pack("=Qi", fs, root)
        _check(libc, libc.syscall(SYS_LANDLOCK_ADD_RULE, fd, LANDLOCK_RULE_PATH_BENEATH,
                                  rule, 0), "landlock_add_rule")
    finally:
        os.close(root)
    return fd, abi >= 6


def _send(ctl, obj):
    ctl.send(encode(obj))


def encode(obj):
    """The JSON text of ``obj``, a flat dict of strings and ints (every message out). Not
    the json module: it imports re, a fifth of this program's start."""
    return ("{" + ",".join(_string(k) + ":" + (_string(v) if isinstance(v, str) else str(int(v)))
                           for k, v in obj.items()) + "}").encode()


def _string(text):
    out = []
    for c in text:
        n = ord(c)
        if 0x20 <= n < 0x7F and c not in '"\\':
            out.append(c)
        elif n > 0xFFFF:  # a JSON escape is UTF-16: a surrogate pair
            n -= 0x10000
            out.append("\\u%04x\\u%04x" % (0xD800 + (n >> 10), 0xDC00 + (n & 0x3FF)))
        else:
            out.append("\\u%04x" % n)
    return '"' + "".join(out) + '"'


def main():
    ctl = socket.socket(fileno=os.dup(0))  # close-on-exec copy; fd 0 becomes /dev/null
    null = os.open("/dev/null", os.O_RDWR)
    os.dup2(null, 0)
    os.close(null)
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        _check(libc, libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl(PR_SET_DUMPABLE)")
        ruleset, scoped = _command_ruleset(libc)
    except (Fatal, OSError) as e:
        _send(ctl, {"fatal": str(e)})
        return 1
    kill_rest = sys.argv[1:] == ["kill-rest"]
    running: dict[int, int] = {}  # command id -> the write end of its thread's kill pipe
    lock = threading.Lock()  # guards running
    _send(ctl, {"ready": os.getpid()})
    while True:
        msg, fds, _, _ = socket.recv_fds(ctl, MAX_MESSAGE, 3, socket.MSG_CMSG_CLOEXEC)
        if not msg:
            return 0  # the runtime closed the channel: the run ends with this program
        req = marshal.loads(msg)  # from the runtime (see session._send)
        if req.get("op") == "kill":
            with lock:
                kill_w = running.get(req["id"])
                if kill_w is not None:
                    try:
                        os.write(kill_w, bytes([int(req.get("signal", signal.SIGKILL))]))
                    except OSError:
                        pass  # its thread is ending: so is the command
        elif len(fds) != 3:
            _send(ctl, {"id": req.get("id"), "error": EINVAL})
        else:
            kill_r, kill_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
            with lock:
                running[req["id"]] = kill_w
            cmd = Command(req, fds, kill_r, ctl, libc, ruleset, scoped, kill_rest)
            threading.Thread(target=cmd.run, args=(running, lock), daemon=True).start()
            continue  # the fds are the thread's now
        for fd in fds:
            os.close(fd)


def _start(req, fds):
    """Start the command with ``fds`` on 0-2, in a session of its own (so that it is killed
    as a group), signals as exec leaves them; subprocess's vfork/exec path, which reports a
    failed exec as OSError here. Returns the Popen."""
    env = {os.fsencode(k): os.fsencode(v) for k, v in req["env"]}
    return subprocess.Popen([os.fsencode(a) for a in req["argv"]],
                            executable=os.fsencode(req["exe"]), env=env,
                            cwd=os.fsencode(req["cwd"]), stdin=fds[0], stdout=fds[1],
                            stderr=fds[2], close_fds=True, start_new_session=True,
                            restore_signals=True)


class Command:
    """One command and the thread that starts it in its own Landlock domain, waits for it,
    and kills what it leaves (see the module's docstring)."""

    def __init__(self, req, fds, kill_r, ctl, libc, ruleset, scoped, kill_rest):
        self.req, self.fds, self.kill_r, self.ctl = req, fds, kill_r, ctl
        self.libc, self.ruleset, self.scoped, self.kill_rest = libc, ruleset, scoped, kill_rest

    def run(self, running, lock):
        ident = self.req["id"]
        try:
            _send(self.ctl, {"id": ident, **self._run()})
        except OSError:
            pass  # the channel is gone: so is the session
        finally:
            with lock:
                os.close(running.pop(ident))
            os.close(self.kill_r)

    def _run(self):
        try:
            # this thread only, for good: the command inherits its domain
            if self.libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, self.ruleset, 0) != 0:
                return {"error": ctypes.get_errno() or EIO}
            try:
                proc = _start(self.req, self.fds)
            except OSError as e:
                return {"error": e.errno or EIO}
        finally:
            for fd in self.fds:
                os.close(fd)
        _send(self.ctl, {"id": self.req["id"], "pid": proc.pid})
        pidfd = os.pidfd_open(proc.pid)
        killed = False  # processes of the domain other than the command were killed
        try:
            while True:
                ready = select.select([pidfd, self.kill_r], [], [])[0]
                if self.kill_r in ready:
                    for sig in os.read(self.kill_r, 64):
                        if sig == signal.SIGKILL:
                            killed = self._kill_domain(proc.pid) or killed
                        else:
                            _killpg(proc.pid, sig)
                if pidfd in ready:
                    break
        finally:
            os.close(pidfd)
        status = proc.wait()  # reaped: it no longer counts in kill(-1, 0)
        if not self.scoped:
            if self.kill_rest:
                _killpg(proc.pid, signal.SIGKILL)
            return {"status": status, "leftovers": "unknown"}
        if self.kill_rest:
            killed = self._kill_domain(proc.pid) or killed
        left = "killed" if killed else ("running" if self._domain_pids(proc.pid) else "none")
        return {"status": status, "leftovers": left}

    def _domain_pidfds(self, cmd):
        """Pidfds of this thread's domain's processes but ``cmd``: those it may signal
        (kill(-1, 0) cannot tell: it succeeds when others are there, refused). Zombies not
        yet reaped by the run's init count."""
        me, out = os.getpid(), []
        for p in os.listdir("/proc"):
            if not p.isdigit() or int(p) in (me, cmd):
                continue
            try:
                fd = os.pidfd_open(int(p))
            except OSError:
                continue  # gone
            try:
                signal.pidfd_send_signal(fd, 0)
                out.append(fd)
            except OSError:
                os.close(fd)  # not ours to signal: another command's, or gone
        return out

    def _domain_pids(self, cmd):
        fds = self._domain_pidfds(cmd)
        for fd in fds:
            os.close(fd)
        return len(fds)

    def _kill_domain(self, cmd):
        """SIGKILL every process of this thread's domain (all at once: the kernel holds the
        task list while kill(-1) runs, so none forks past it; the scope keeps it to the
        domain), and wait (at most KILL_WAIT s) until those found before have exited; below
        ABI 6, the command's group only. Returns whether anything but ``cmd`` was there."""
        if not self.scoped:
            _killpg(cmd, signal.SIGKILL)
            return False
        fds = self._domain_pidfds(cmd)
        try:
            if self.libc.kill(-1, signal.SIGKILL) != 0:
                _killpg(cmd, signal.SIGKILL)  # cannot fail with the scope; be sure anyway
            deadline = time.monotonic() + KILL_WAIT
            todo = list(fds)
            while todo and time.monotonic() < deadline:
                done = select.select(todo, [], [], max(0.0, deadline - time.monotonic()))[0]
                todo = [fd for fd in todo if fd not in done]
        finally:
            for fd in fds:
                os.close(fd)
        return bool(fds)


def _killpg(pgid, sig):
    try:
        os.killpg(pgid, sig)
    except OSError:
        pass  # the group is gone


if __name__ == "__main__":
    raise SystemExit(main())
