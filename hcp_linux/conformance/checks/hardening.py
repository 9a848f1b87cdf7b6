"""Hardening canaries: what the layers must stop beyond the letter of §10 (files and metadata
outside the roots, host loopback, namespaces, foreign ABIs, io_uring, TIOCSTI, /proc, signals).
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import platform
import secrets
import shutil
import signal
import subprocess
import time
from pathlib import Path

from ..harness import Evidence, Harness, NotApplicable, layer_refusal, proc_summary, shown
from ..observers import drain, pid_alive
from .base import _ran, _stderr, _stdout, _token, _verdict, check


@check("canary-fs-outside-jail", "hardening", "Files outside the granted roots cannot be "
       "read, written, executed or listed",
       requirement="Only granted paths exist: reads, writes and execs outside the roots fail "
                   "(§10.2.2 jail, the default policy).",
       enforced_by="mount view (mountns) or Landlock; either alone suffices")
def fs_outside_jail(h: Harness, ev: Evidence) -> str:
    secret = _token()
    h.mkdir("c")
    jail, outside = h.mkdir("c/jail"), h.mkdir("c/outside")
    sfile = h.write(outside / "secret.txt", secret + "\n")
    true_, echo = shutil.which("true"), shutil.which("echo")
    shutil.copy2(true_ or "/bin/true", outside / "mytrue")
    shutil.copy2(echo or "/bin/echo", outside / "myecho")
    ldso = next((p for p in ("/lib64/ld-linux-x86-64.so.2", "/lib/ld-linux-aarch64.so.1")
                 if os.path.exists(p)), None)
    esc = "ESCAPED" + secrets.token_hex(3)
    script = (f'cat {sfile} && echo read=0; echo x > {outside}/new.txt && echo write=0; '
              f'{outside}/mytrue && echo exec=0; '
              + (f'{ldso} {outside}/myecho {esc}; ' if ldso else '')
              + f'ln -s {sfile} link 2>/dev/null; cat link 2>/dev/null && echo symlink=0; '
              f'ln {sfile} hard 2>/dev/null && echo hardlink=0; '
              f'ls {outside} 2>/dev/null | sed "s/^/entry:/"; true')
    ev.try_("read, write, exec (directly and via ld.so), symlink, hardlink and list a "
            "directory beside the jail")

    def judge(what: str, r: object, where: Path) -> list[str]:
        text = _stdout(r) + _stderr(r)
        hits = [w for w in ("read=0", "write=0", "exec=0", "symlink=0", "hardlink=0")
                if w in _stdout(r)]
        if secret in text:
            hits.append("secret seen")
        if esc in _stdout(r):
            hits.append("ld.so ran it")
        if "entry:" in _stdout(r):
            hits.append("listed")
        if (outside / "new.txt").exists():
            hits.append("new file on host")
        if (where / "hard").exists():
            hits.append("hardlink made")
        return hits

    r = h.run(["sh", "-c", script], jail=jail)
    ev.saw(f"confined: {proc_summary(r)}")
    bad = judge("confined", r, jail)
    ev.require(not bad, f"confined: {', '.join(bad)}")
    (outside / "new.txt").unlink(missing_ok=True)
    ctl = h.mkdir("c/control")
    c = h.unconfined(["sh", "-c", script], cwd=str(ctl))
    got = judge("control", c, ctl)
    ev.ctl(f"unconfined: {', '.join(got)}")
    need = {"read=0", "write=0", "exec=0", "listed", "secret seen"}
    ev.control_ok(need <= set(got), "unconfined, these did not succeed: "
                  + ", ".join(sorted(need - set(got))))
    return _verdict(ev, "read, write, exec, ld.so, symlink, hardlink and listing outside the "
                        "roots all failed; unconfined they work")


_META = """import json, os, sys
res = {}
for path in sys.argv[1:]:
    out = {}
    try:
        st = os.stat(path)
    except OSError as e:
        res[path] = {"stat": e.errno}; continue
    ops = [("chmod", lambda: os.chmod(path, 0o600)),
           ("chown", lambda: os.chown(path, st.st_uid, st.st_gid)),
           ("utime", lambda: os.utime(path, (946684800, 946684800))),
           ("setxattr", lambda: os.setxattr(path, "user.hcp", b"1"))]
    for name, op in ops:
        try:
            op(); out[name] = "ok"
        except OSError as e:
            out[name] = e.errno
    res[path] = out
print(json.dumps(res))
"""


def _meta_state(p: Path) -> tuple:
    st = os.stat(p)
    try:
        x = os.getxattr(p, "user.hcp")
    except OSError:
        x = None
    return (st.st_mode, st.st_uid, st.st_gid, st.st_mtime_ns, st.st_ctime_ns, x)


@check("canary-metadata-outside-jail", "hardening", "chmod, chown, utime and xattrs outside "
       "the writable roots fail",
       requirement="Metadata writes outside the writable roots fail (Landlock does "
                   "not mediate them; the read-only mount view does).",
       enforced_by="mount view (mountns) only: Landlock does not mediate metadata")
def metadata_outside(h: Harness, ev: Evidence) -> str:
    jail, outside, ro = h.mkdir("jail"), h.mkdir("outside"), h.mkdir("ro")
    targets = [h.write(outside / "meta.txt", "x\n"), h.write(ro / "ro.txt", "x\n")]
    controls = [h.write(outside / "meta-ctl.txt", "x\n"), h.write(ro / "ro-ctl.txt", "x\n")]
    for p in targets + controls:
        os.chmod(p, 0o644)
    time.sleep(0.02)
    before = {p: _meta_state(p) for p in targets}
    ev.try_(f"chmod, chown (to the same ids), utime, setxattr on {targets[0]} (outside every "
            f"root) and {targets[1]} (in a --read-only-root)")
    r = h.run([h.python, "-I", "-c", _META, *map(str, targets)], jail=jail,
              read_only_roots=(str(ro),))
    if _ran(ev, "confined", r):
        res = json.loads(_stdout(r))
        for path, ops in res.items():
            done = [k for k, v in ops.items() if v == "ok"]
            ev.require(not done, f"confined: {', '.join(done)} succeeded on {path}")
    for p in targets:
        ev.require(_meta_state(p) == before[p], f"the metadata of {p} changed on the host")
    c = h.unconfined([h.python, "-I", "-c", _META, *map(str, controls)])
    try:
        cres = json.loads(_stdout(c))
    except ValueError:
        cres = {}
    ev.ctl(f"unconfined on identical files: {cres}")
    for path, ops in cres.items():
        for name in ("chmod", "chown", "utime"):
            ev.control_ok(ops.get(name) == "ok", f"unconfined {name} on {path} failed")
        if ops.get("setxattr") != "ok":
            ev.note(f"setxattr unsupported here even unconfined ({ops.get('setxattr')}); "
                    "judged on the other operations")
    ev.control_ok(len(cres) == 2, "the unconfined control did not run")
    return _verdict(ev, "no metadata change outside the writable roots; unconfined they work")


_CONNECT = """import socket, sys
args = sys.argv[1:]
for host, port in zip(args[::2], args[1::2]):
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        s = socket.socket(fam, socket.SOCK_STREAM)
        s.settimeout(3)
        print(host, s.connect_ex((host, int(port))))
    except OSError as e:
        print(host, "socket", e.errno)
"""


@check("canary-host-loopback", "hardening", "A host loopback listener gets no connection",
       requirement="No network: host loopback services, the LAN and the internet are "
                   "unreachable.",
       enforced_by="network namespace, or Landlock TCP rules, or seccomp network-off; any "
                   "one suffices")
def host_loopback(h: Harness, ev: Evidence) -> str:
    jail = h.mkdir("jail")
    listeners = []
    for host in ("127.0.0.1", "::1"):
        try:
            listeners.append(h.listener(host))
        except OSError as e:
            ev.note(f"cannot listen on {host} here ({e}); not tried")
    if not listeners:
        raise NotApplicable("cannot open a loopback listener on this host")
    args = [str(x) for lst in listeners for x in (lst.host, lst.port)]
    ev.try_("connect to " + ", ".join(f"{lst.host} port {lst.port}" for lst in listeners))
    r = h.run([h.python, "-I", "-c", _CONNECT, *args], jail=jail)
    ev.saw(f"confined: {proc_summary(r)}")
    for lst in listeners:
        n = lst.accepted()
        ev.require(n == 0, f"the listener on {lst.host} accepted {n} connection(s) from the "
                           "sandbox")
        ev.saw(f"listener {lst.host}: {n} connection(s)")
    ev.require(" 0\n" not in _stdout(r), "a connect() reported success")
    c = h.unconfined([h.python, "-I", "-c", _CONNECT, *args])
    ev.ctl(f"unconfined: {proc_summary(c)}")
    for lst in listeners:
        n = lst.accepted(wait=2)
        ev.control_ok(n >= 1, f"unconfined, the listener on {lst.host} got no connection")
    return _verdict(ev, f"{len(listeners)} loopback listener(s) got no connection; unconfined "
                        "they do")


_UNSHARE = """import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
NEWUSER, NEWNET, NEWNS, NEWPID, NEWIPC, NEWUTS = (0x10000000, 0x40000000, 0x00020000,
                                                  0x20000000, 0x08000000, 0x04000000)
attempts = [("unshare user", NEWUSER), ("unshare user+net", NEWUSER | NEWNET),
            ("unshare user+mount", NEWUSER | NEWNS), ("unshare user+pid", NEWUSER | NEWPID),
            ("unshare user+ipc+uts", NEWUSER | NEWIPC | NEWUTS)]
for name, flags in attempts:
    pid = os.fork()
    if pid == 0:
        r = libc.unshare(flags)
        os._exit(0 if r == 0 else min(ctypes.get_errno(), 255) or 255)
    _, st = os.waitpid(pid, 0)
    print(name, os.waitstatus_to_exitcode(st))
# clone(CLONE_NEWUSER | SIGCHLD) without libc's wrapper
r = libc.syscall(ctypes.c_long(56), ctypes.c_long(NEWUSER | 17), ctypes.c_long(0),
                 ctypes.c_long(0), ctypes.c_long(0), ctypes.c_long(0))
if r == 0:
    os._exit(0)
if r > 0:
    os.waitpid(r, 0)
    print("clone newuser", 0)
else:
    print("clone newuser", ctypes.get_errno())
"""


@check("canary-nested-namespaces", "hardening", "The command cannot create namespaces",
       requirement="Namespaces (unshare, clone flags) are refused inside the sandbox "
                   "(the default policy's seccomp blocklist, docs/policy.md).",
       enforced_by="seccomp (unshare, clone flags, clone3)")
def nested_namespaces(h: Harness, ev: Evidence) -> str:
    jail = h.mkdir("jail")
    ev.try_("unshare(2) with user, user+net, user+mount, user+pid, user+ipc+uts; raw "
            "clone(CLONE_NEWUSER)")

    def parse(text: str) -> dict[str, int]:
        out = {}
        for line in text.splitlines():
            name, _, code = line.rpartition(" ")
            if name:
                out[name] = int(code)
        return out

    r = h.run([h.python, "-I", "-c", _UNSHARE], jail=jail)
    got = parse(_stdout(r)) if _ran(ev, "confined", r) else {}
    for name, code in got.items():
        ev.require(code != 0, f"confined: {name} succeeded")
    ev.require(len(got) == 6, f"confined: the probe reported {len(got)} of 6 attempts")
    c = h.unconfined([h.python, "-I", "-c", _UNSHARE])
    ctl = parse(_stdout(c))
    ev.ctl(f"unconfined: {ctl}")
    # Each attempt whose control works here is judged; the others say nothing either way.
    ev.control_ok(any(code == 0 for code in ctl.values()),
                  "unconfined, this user cannot create a namespace here by any of these means")
    for name, code in ctl.items():
        if code != 0:
            ev.note(f"unconfined {name} fails here too (errno {code}): not evidence either way")
    return _verdict(ev, "every namespace-creating call failed (" + ", ".join(
        f"{k}: {errno.errorcode.get(v, v)}" for k, v in got.items()) + ")")


_INT80_C = r"""
#include <stdio.h>
#include <unistd.h>
/* One i386 system call from 64-bit code: getpid (i386 number 20) through int $0x80. */
int main(void)
{
	long ret;
	__asm__ volatile("int $0x80" : "=a"(ret) : "a"(20L) : "r8", "r9", "r10", "r11", "memory");
	printf("%ld %ld\n", ret, (long)getpid());
	return ret == (long)getpid() ? 0 : 3;
}
"""

_X32_C = r"""
#include <stdio.h>
/* One x32-ABI system call: getpid (39) with the x32 bit 0x40000000 set. */
int main(void)
{
	long ret;
	__asm__ volatile("syscall" : "=a"(ret) : "a"(39L | 0x40000000L) : "rcx", "r11", "memory");
	printf("%ld\n", ret);
	return 0;
}
"""


def _foreign_abi(h: Harness, ev: Evidence, name: str, source: str, what: str) -> str:
    if platform.machine() != "x86_64":
        raise NotApplicable(f"{what} is an x86_64 matter; this host is {platform.machine()}")
    exe = h.c_program(name, source)
    jail = h.mkdir("jail")
    c = h.unconfined([exe])
    ev.ctl(f"unconfined {name}: {proc_summary(c)}")
    ev.control_ok(c.returncode == 0, f"unconfined, {name} did not complete (IA32 emulation "
                                     "off?)")
    r = h.run([exe], jail=jail)
    ev.try_(f"run {exe} (compiled from the embedded C source) confined")
    ev.saw(f"confined: {proc_summary(r)}")
    if name.startswith("x32") and _stdout(c).strip() == str(-errno.ENOSYS):
        ev.note("this kernel has no x32 ABI (unconfined the call returns -ENOSYS): the filter "
                "must kill the process all the same, since a kernel with x32 would run it")
    killed = r.returncode == -signal.SIGSYS
    ev.require(killed, f"the process was not killed by SIGSYS (rc {r.returncode}): {what} "
                       "reached the kernel")
    return _verdict(ev, f"{what}: the process was killed by SIGSYS; unconfined it completes")


@check("canary-i386-int80", "hardening", "An i386 system call (int 0x80) kills the process",
       requirement="Foreign-arch (i386 int 0x80) calls kill the process.",
       enforced_by="seccomp (arch check, KILL_PROCESS)")
def i386_int80(h: Harness, ev: Evidence) -> str:
    return _foreign_abi(h, ev, "int80_getpid", _INT80_C, "an i386 int 0x80 call")


@check("canary-x32-syscall", "hardening", "An x32-ABI system call kills the process",
       requirement="x32 numbers kill the process.",
       enforced_by="seccomp (x32 bit check, KILL_PROCESS)")
def x32_syscall(h: Harness, ev: Evidence) -> str:
    return _foreign_abi(h, ev, "x32_getpid", _X32_C, "an x32 call")


_IO_URING = """import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
params = ctypes.create_string_buffer(120)
r = libc.syscall(ctypes.c_long(425), ctypes.c_long(4), params)
print(r, 0 if r >= 0 else ctypes.get_errno())
if r >= 0:
    os.close(r)
"""


@check("canary-io-uring", "hardening", "io_uring_setup is refused",
       requirement="io_uring is blocked: its operations bypass seccomp.",
       enforced_by="seccomp")
def io_uring(h: Harness, ev: Evidence) -> str:
    if platform.machine() not in ("x86_64", "aarch64"):
        raise NotApplicable(f"syscall number of io_uring_setup not known for "
                            f"{platform.machine()}")
    nr = 425
    jail = h.mkdir("jail")
    ev.try_(f"io_uring_setup(4, &params) (syscall {nr})")
    r = h.run([h.python, "-I", "-c", _IO_URING], jail=jail)
    if _ran(ev, "confined", r):
        fd, err = (_stdout(r).split() + ["?", "?"])[:2]
        ev.require(fd == "-1", f"confined: io_uring_setup returned fd {fd}")
        ev.saw(f"confined: errno {errno.errorcode.get(int(err), err) if err.isdigit() else err}")
    c = h.unconfined([h.python, "-I", "-c", _IO_URING])
    ev.ctl(f"unconfined: {proc_summary(c)}")
    disabled = Path("/proc/sys/kernel/io_uring_disabled")
    ev.control_ok(_stdout(c).split()[:1] not in ([], ["-1"]),
                  "unconfined io_uring_setup failed too (kernel.io_uring_disabled="
                  f"{disabled.read_text().strip() if disabled.exists() else 'n/a'})")
    return _verdict(ev, "io_uring_setup refused; unconfined it returns a ring fd")


_TIOCSTI = """import ctypes, fcntl, os, termios
res = []
try:
    os.setsid()
except OSError:
    pass
try:
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
except OSError:
    pass
try:
    fcntl.ioctl(0, termios.TIOCSTI, b"X"); res.append("ok")
except OSError as e:
    res.append(str(e.errno))
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
c = ctypes.c_char(b"Y")
# the same request with high bits set: the kernel compares only the low 32 bits
r = libc.syscall(ctypes.c_long(16), ctypes.c_long(0), ctypes.c_long(0x100000000 | termios.TIOCSTI),
                 ctypes.byref(c))
res.append("ok" if r == 0 else str(ctypes.get_errno()))
print(" ".join(res))
"""


@check("canary-tiocsti", "hardening", "TIOCSTI cannot inject input into the terminal",
       requirement="No terminal injection: TIOCSTI/TIOCLINUX refused, low 32 bits "
                   "compared.",
       enforced_by="seccomp (the command can make the terminal its controlling tty again, so "
                   "setsid alone does not stop it)")
def tiocsti(h: Harness, ev: Evidence) -> str:
    import tty
    jail = h.mkdir("jail")
    try:
        master, slave = os.openpty()
    except OSError as e:
        raise NotApplicable(f"no pseudo-terminal here: {e}") from None
    h.fd(master)
    h.fd(slave)
    tty.setraw(slave)
    ev.try_("on a pty given as stdin: setsid, TIOCSCTTY, then TIOCSTI 'X' and the same "
            "request with high bits set")
    r = h.run([h.python, "-I", "-c", _TIOCSTI], jail=jail, stdin=slave)
    time.sleep(0.1)
    injected = drain(slave)
    ev.saw(f"confined: {proc_summary(r)}; bytes injected into the terminal: {injected!r}")
    ev.require(injected == b"", f"characters were injected into the terminal: {injected!r}")
    ev.require("ok" not in _stdout(r).split(), f"confined: TIOCSTI succeeded ({_stdout(r)!r})")
    os.set_blocking(slave, True)
    c = h.unconfined([h.python, "-I", "-c", _TIOCSTI], stdin=slave)
    time.sleep(0.1)
    got = drain(slave)
    legacy = Path("/proc/sys/dev/tty/legacy_tiocsti")
    ev.ctl(f"unconfined: {proc_summary(c)}; injected {got!r}")
    ev.control_ok(b"X" in got, "unconfined TIOCSTI injected nothing (dev.tty.legacy_tiocsti="
                  f"{legacy.read_text().strip() if legacy.exists() else 'n/a'})")
    return _verdict(ev, "TIOCSTI refused (" + _stdout(r).strip() + "), nothing injected; "
                        "unconfined it injects")


@check("canary-proc-environ", "hardening", "The runtime's /proc/<pid>/environ is unreadable",
       requirement="Other processes' environments (the launcher's, the sandbox init's) are "
                   "unreadable.",
       enforced_by="pid namespace (outside pids invisible), or Landlock (ptrace scoping); "
                   "the init is non-dumpable")
def proc_environ(h: Harness, ev: Evidence) -> str:
    secret = _token()
    jail = h.mkdir("jail")
    pidfile = jail / "runtime.pid"
    me = os.getpid()
    with open(f"/proc/{me}/environ", "rb") as f:
        my_digest = hashlib.sha256(f.read()).hexdigest()
    # The runtime here is `hcp-linux run` itself, started with a secret in its environment;
    # the sandboxed command learns the runtime's host pid from a file we write after spawn.
    probe = ("import glob, hashlib, json, os, sys, time\n"
             "deadline = time.monotonic() + 20\n"
             "while not os.path.exists('runtime.pid') and time.monotonic() < deadline:\n"
             "    time.sleep(0.02)\n"
             "time.sleep(0.05)\n"
             "rt = open('runtime.pid').read().strip()\n"
             f"paths = ['/proc/' + rt + '/environ', '/proc/{me}/environ', "
             "'/proc/%d/environ' % os.getppid(), '/proc/1/environ'] + "
             "sorted(glob.glob('/proc/[0-9]*/environ'))\n"
             "out = {}\n"
             "own = '/proc/%d/environ' % os.getpid()\n"
             "for p in dict.fromkeys(paths):\n"
             "    if p == own:\n"
             "        continue  # its own environment is not another process's\n"
             "    try:\n"
             "        data = open(p, 'rb').read()\n"
             "        out[p] = {'sha256': hashlib.sha256(data).hexdigest(), "
             "'text': data.decode(errors='replace')}\n"
             "    except OSError as e:\n"
             "        out[p] = {'errno': e.errno}\n"
             "print(json.dumps({'runtime': rt, 'files': out}))\n")
    argv, env = h.cli_argv(["run", "--jail", jail, "--", h.python, "-I", "-c", probe])
    env["HCP_CONFORMANCE_RUNTIME_SECRET"] = secret
    ev.try_("the runtime (`hcp-linux run`) holds a secret in its environment; the command "
            "reads /proc/<runtime pid>/environ, /proc/<this process>/environ, its parent's, "
            "pid 1's and every /proc/*/environ")
    proc = h.start(argv, env=env, cwd="/", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    pidfile.write_text(str(proc.pid))
    try:
        out, err = proc.communicate(timeout=h.timeout)
    except subprocess.TimeoutExpired:
        h.stop(proc)
        raise
    if proc.returncode == 125 and layer_refusal(err):
        raise NotApplicable(f"the sandbox refuses to run here: {layer_refusal(err)}")
    ev.saw(f"confined: rc={proc.returncode} stderr={shown(err)!r}")
    try:
        res = json.loads(out.decode())
    except ValueError:
        res = None
    if ev.require(proc.returncode == 0 and res is not None,
                  f"the probe did not run: rc={proc.returncode} stdout={shown(out)!r}"):
        files = res["files"]
        readable = [p for p, v in files.items() if "sha256" in v]
        ev.saw(f"readable environ files: {readable}; runtime pid {res['runtime']}")
        leaked = [p for p, v in files.items() if secret in v.get("text", "")]
        ev.require(not leaked, f"the runtime's secret was read from {leaked}")
        rt = files.get(f"/proc/{res['runtime']}/environ", {})
        ev.require("sha256" not in rt or secret not in rt.get("text", ""),
                   f"/proc/{res['runtime']}/environ (the runtime) was readable")
        mine = files.get(f"/proc/{me}/environ", {})
        ev.require(mine.get("sha256") != my_digest,
                   f"/proc/{me}/environ (the conformance process) was readable")
    # Control: an unconfined process reads a same-user process's environ.
    victim = h.start(["sleep", "60"], env=dict(os.environ,
                                               HCP_CONFORMANCE_RUNTIME_SECRET=secret))
    time.sleep(0.05)
    c = h.unconfined(["sh", "-c", f"tr '\\0' '\\n' < /proc/{victim.pid}/environ; "
                                  f"cat /proc/{me}/environ | sha256sum"])
    ev.ctl(f"unconfined read of /proc/{victim.pid}/environ and /proc/{me}/environ: "
           f"secret {'seen' if secret in _stdout(c) else 'not seen'}, "
           f"own environ {'readable' if my_digest in _stdout(c) else 'not readable'}")
    ev.control_ok(secret in _stdout(c) and my_digest in _stdout(c),
                  "unconfined, the environ files were not readable")
    return _verdict(ev, "neither the runtime's nor this process's environ was readable; "
                        "unconfined both are")


@check("canary-signals", "hardening", "Signals cannot reach a process outside the sandbox",
       requirement="No signals, ptrace or abstract sockets outward.",
       enforced_by="pid namespace (outside pids invisible), or Landlock signal scope (ABI 6)")
def signals(h: Harness, ev: Evidence) -> str:
    jail = h.mkdir("jail")
    victim = h.start(["sleep", "60"])
    pid, me = victim.pid, os.getpid()
    time.sleep(0.05)
    script = (f"kill -KILL {pid} 2>/dev/null; echo kill=$?; kill -STOP {pid} 2>/dev/null; "
              f"echo stop=$?; kill -0 {pid} 2>/dev/null; echo probe=$?; kill -0 {me} "
              f"2>/dev/null; echo probe-runtime=$?")
    ev.try_(f"kill -KILL, kill -STOP and kill -0 on an outside `sleep` (pid {pid}); kill -0 "
            f"on this process (pid {me})")
    r = h.run(["sh", "-c", script], jail=jail)
    ev.saw(f"confined: {proc_summary(r)}")
    time.sleep(0.2)
    for word in ("kill=0", "stop=0", "probe=0", "probe-runtime=0"):
        ev.require(word not in _stdout(r).split(), f"confined: {word} (the signal was allowed)")
    alive = pid_alive(pid)
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        state = "?"
    ev.saw(f"victim alive: {alive}, state {state}")
    ev.require(alive and state != "T", "the outside process was killed or stopped")
    c = h.unconfined(["sh", "-c", f"kill -0 {pid} && kill -KILL {pid} && echo killed"])
    try:
        victim.wait(timeout=h.timeout)
    except subprocess.TimeoutExpired:
        pass
    ev.ctl(f"unconfined kill: {proc_summary(c)}; victim alive after: {pid_alive(pid)}")
    ev.control_ok(c.returncode == 0 and not pid_alive(pid), "unconfined, the kill failed")
    return _verdict(ev, "no signal reached the outside process; unconfined it does")


_PROC_FENCE_PROBE = r"""
import errno, json, os, sys
def tried(path, flags):
    try:
        fd = os.open(path, flags)
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
    os.close(fd)  # opened only: nothing is ever written
    return "open"
out = {}
for path in ("/proc/sys/kernel/core_pattern", "/proc/sysrq-trigger", "/proc/sys/vm/drop_caches"):
    out["write " + path] = tried(path, os.O_WRONLY)
for pid in sorted({1, os.getppid()} - {os.getpid()}):
    out["rw /proc/%d/mem" % pid] = tried("/proc/%d/mem" % pid, os.O_RDWR)
try:
    fd = os.open("/proc/self/fd/1", os.O_RDONLY | os.O_NONBLOCK)
    try:
        out["reread"] = os.read(fd, 65536).decode(errors="replace")
    finally:
        os.close(fd)
except OSError as e:
    out["reread"] = errno.errorcode.get(e.errno, str(e.errno))
with open(sys.argv[1], "w") as f:
    json.dump(out, f)
"""


@check("canary-proc-fences", "hardening", "/proc's kernel knobs, the init's memory and the "
       "runtime's stdio file stay out of reach",
       requirement="On every rung: no /proc/sys or /proc/sysrq-trigger entry opens for "
                   "writing (not even for root), no other process's /proc/<pid>/mem opens "
                   "read-write, and a host file given as stdout does not re-open through "
                   "/proc/self/fd/1.",
       enforced_by="the mount view's read-only /proc/sys etc. (PROC_FENCES), or Landlock's "
                   "read-only /proc rule; a non-dumpable init; Landlock, or without it a "
                   "refusal of a file as stdio")
def proc_fences(h: Harness, ev: Evidence) -> str:
    secret = _token()
    jail = h.mkdir("jail")
    box, box_flags = h.outbox(jail)  # the jail, or (read-only jail) a write root of its own
    found = box / "found.json"
    log = h.write(h.mkdir("host") / "stdout.log", secret + "\n")
    core = "/proc/sys/kernel/core_pattern"
    with open(core) as f:
        core_before = f.read()
    argv, env = h.cli_argv(["run", "--jail", jail, *box_flags, "--", h.python, "-I", "-c",
                            _PROC_FENCE_PROBE, found])
    ev.try_("the command opens /proc/sys/kernel/core_pattern, /proc/sysrq-trigger and "
            "/proc/sys/vm/drop_caches O_WRONLY and /proc/1/mem and its parent's mem O_RDWR "
            "(open only, nothing written), and re-reads its stdout, a host file holding a "
            "secret, through /proc/self/fd/1")
    with open(log, "ab") as fh:
        p = subprocess.run(argv, env=env, cwd="/", stdin=subprocess.DEVNULL, stdout=fh,
                           stderr=subprocess.PIPE, timeout=h.timeout)
    err = p.stderr.decode(errors="replace")
    if p.returncode == 125 and layer_refusal(p.stderr):
        raise NotApplicable(f"the sandbox refuses to run here: {layer_refusal(p.stderr)}")
    if p.returncode == 125 and "stdout is a file the command could re-open" in err:
        ev.saw(f"stdout as a host file refused: {shown(p.stderr)!r}")
        ev.require(log.read_text() == secret + "\n", "the host file changed")
        ev.try_("again with stdout a pipe")
        p = subprocess.run(argv, env=env, cwd="/", stdin=subprocess.DEVNULL,
                           capture_output=True, timeout=h.timeout)
        ev.require(secret.encode() not in p.stdout, "the secret reached the command's stdout")
    ev.saw(f"confined: rc={p.returncode} stderr={shown(p.stderr)!r}")
    with open(core) as f:
        ev.require(f.read() == core_before, f"{core} changed on the host")
    if ev.require(p.returncode == 0 and found.exists(), "the probe did not run"):
        res = json.loads(found.read_text())
        ev.saw(", ".join(f"{k}: {v}" for k, v in res.items() if k != "reread"))
        opened = [k for k, v in res.items() if v == "open"]
        ev.require(not opened, f"opened: {opened}")
        ev.require(secret not in res["reread"], "the host stdout file was re-read")
        ev.require(log.read_text().startswith(secret + "\n"), "the host file was rewritten")
    # Controls: unconfined, the same stdout re-opens and reads the secret; root may write
    # core_pattern (access(2): nothing is opened for writing).
    found.unlink(missing_ok=True)
    log.write_text(secret + "\n")
    with open(log, "ab") as fh:
        c = h.unconfined([h.python, "-I", "-c", _PROC_FENCE_PROBE, found], stdout=fh,
                         capture_output=False, stderr=subprocess.PIPE)
    res = json.loads(found.read_text()) if found.exists() else {}
    ev.ctl(f"unconfined: rc={c.returncode}, stdout re-read "
           f"{'holds' if secret in res.get('reread', '') else 'lacks'} the secret; "
           f"access({core}, W_OK) = {os.access(core, os.W_OK)} as euid {os.geteuid()}")
    ev.control_ok(secret in res.get("reread", ""), "unconfined, stdout did not re-open")
    ev.control_ok(os.access(core, os.W_OK) == (os.geteuid() == 0),
                  f"unconfined, {core}'s write permission is not root's alone")
    return _verdict(ev, "no kernel knob opened for writing, no other process's memory, "
                        "and the host stdout file did not re-open; unconfined it does")
