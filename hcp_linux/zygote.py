"""The program a session runs inside its sandbox: it starts each command the runtime sends.

A session (hcp_linux.session) is one confined run that lasts: this program, started by the
system's ``python3 -I -S`` inside the sandbox, with every layer of the policy already on it
(namespaces, mount view, Landlock, seccomp, no_new_privs, no capability). For each command
the runtime sends (program, argv, environment and working directory, all resolved and
checked by the runtime's plan, plus three fds for stdio) it forks, and the child execs: the
command is confined exactly as this program is, without paying for a new confinement.

Stdlib only, no imports from hcp_linux (it runs from source text, ``-c``, with the sandbox's
interpreter). Its control channel is a SOCK_SEQPACKET socket given as fd 0: one JSON object
per message, the stdio fds as SCM_RIGHTS. Messages out: ``{"ready": pid}`` once, then for each
command ``{"id", "pid"}`` or ``{"id", "error": errno}`` and ``{"id", "status"}`` (exit code,
or -signal). It is not dumpable, so no command (same uid, no capability) can ptrace it or
take its control socket with pidfd_getfd. On EOF of the channel (the runtime gone) it kills
every command it started and exits.
"""
import ctypes
import json
import os
import select
import signal
import socket
import subprocess
import sys

PR_SET_DUMPABLE = 4
MAX_MESSAGE = 1 << 20  # a command's argv and environment: the plan keeps them far smaller


def _send(ctl, obj):
    ctl.send(json.dumps(obj).encode())


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


def main():
    ctl = socket.socket(fileno=os.dup(0))  # close-on-exec copy; fd 0 becomes /dev/null
    null = os.open("/dev/null", os.O_RDWR)
    os.dup2(null, 0)
    os.close(null)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        _send(ctl, {"fatal": "prctl(PR_SET_DUMPABLE): " + os.strerror(ctypes.get_errno())})
        return 1
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    kill_rest = sys.argv[1:] == ["kill-rest"]
    running: dict = {}  # pid -> (command id, Popen)
    _send(ctl, {"ready": os.getpid()})
    try:
        while True:
            ready = select.select([ctl.fileno(), wake_r], [], [])[0]
            if wake_r in ready:
                os.read(wake_r, 4096)
                _reap(ctl, running, kill_rest)
            if ctl.fileno() not in ready:
                continue
            msg, fds, _, _ = socket.recv_fds(ctl, MAX_MESSAGE, 3, socket.MSG_CMSG_CLOEXEC)
            if not msg:
                return 0  # the runtime closed the channel
            req = json.loads(msg)
            try:
                if req.get("op") == "kill":
                    pid = next((p for p, (i, _) in running.items() if i == req["id"]), None)
                    if pid is not None:
                        os.killpg(pid, req.get("signal", signal.SIGKILL))
                    continue
                if len(fds) != 3:
                    _send(ctl, {"id": req.get("id"), "error": 22})  # EINVAL
                    continue
                try:
                    proc = _start(req, fds)
                except OSError as e:
                    _send(ctl, {"id": req["id"], "error": e.errno or 5})
                    continue
                running[proc.pid] = (req["id"], proc)
                _send(ctl, {"id": req["id"], "pid": proc.pid})
            finally:
                for fd in fds:
                    os.close(fd)
    finally:
        for pid in running:
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass


def _reap(ctl, running, kill_rest):
    """Report each command that ended; with ``kill_rest``, kill what it left in its group
    (the policy's on_exit = "kill", as a run's pid namespace ends with it). The group is
    killed while its leader is still a zombie (WNOWAIT): its number cannot be reused yet."""
    for pid, (ident, proc) in list(running.items()):
        try:
            info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            info = None
        if info is None:
            continue
        if kill_rest:
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
        del running[pid]
        _send(ctl, {"id": ident, "status": proc.wait()})


if __name__ == "__main__":
    raise SystemExit(main())
