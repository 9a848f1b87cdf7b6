"""The native executor: one Plan, run by a small C program instead of a forked Python.

The parent serialises the Plan (``plan_bytes``) into a memfd and hands it to ``hcp-exec``,
started with ``posix_spawn`` (vfork + exec: the cost does not grow with the runtime's RSS,
nothing runs in Python after the fork, and it is safe in a multi-threaded runtime) either now
or ahead of time (a *spare*, see below). ``hcp-exec`` performs the steps of
:mod:`hcp_linux.child` and reports a failing step over the same close-on-exec error pipe, in the same error record
(:mod:`hcp_linux.protocol`): the parent's mapping to errors, and the
degraded-host logic of :mod:`hcp_linux.sandbox`, are shared with the ctypes executor.

The program is built by ``python -m hcp_linux.native.build`` (``make setup`` runs it when a C
compiler is there) into ``_build/hcp-exec-<digest of the source>``: a binary built from
another version of the source is never used. Without it, ``auto`` (the default) uses the
ctypes executor; ``native`` refuses.
"""
from __future__ import annotations

import errno
import os
import stat
import struct
import threading
import time
from typing import TYPE_CHECKING, Sequence

from ..launch import memfd, parse_status, spawn_hcp_exec
from ..protocol import FLAGS, INLINE_MAX, LAYER_FLAGS, MESSAGE_BITS, PLAN_MAGIC, PLAN_VERSION
from ..spawner import on_lasting_thread

if TYPE_CHECKING:
    import socket

    from hcp_linux.landlock import CreatedRuleset

    from ..plan import Plan

#: Executors a Sandbox can be asked for; "auto" is native when built, else ctypes.
EXECUTORS = ("auto", "native", "ctypes")

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "hcp_exec.c")
BUILD_DIR = os.path.join(HERE, "_build")

_U64 = struct.Struct("<Q").pack
_MASK = (1 << 64) - 1

_default = "auto"
_lock = threading.Lock()
_binary: "str | None | bool" = False  # False: not looked up yet
_missing = ""  # why _binary is None
_broken: str | None = None  # why auto stopped using the native executor in this process
#: How native spawns went in this process: a ready spare, one started on the spot, or hcp-exec
#: with the plan on its command line (native-local plans, set_spares("never")).
stats = {"ready": 0, "on_the_spot": 0, "direct": 0}


def set_default(name: str) -> None:
    """Process-wide default executor for Sandboxes that do not name one (tests, the CLI)."""
    global _default
    _default = check(name)


def get_default() -> str:
    return _default


def check(name: str) -> str:
    if name not in EXECUTORS:
        from ..errors import PolicyError
        raise PolicyError(f"executor: expected one of {', '.join(EXECUTORS)}, got {name!r}")
    return name


def source_digest() -> str:
    """Of hcp_exec.c and the protocol header the build generates for it."""
    import hashlib

    from ..protocol import c_header
    with open(SOURCE, "rb") as f:
        return hashlib.sha256(f.read() + c_header().encode()).hexdigest()[:16]


def artifact_name() -> str:
    """The binary's file name for the current source: a build of other source is not used."""
    return "hcp-exec-" + source_digest()


def artifact_path() -> str:
    """Where the build puts the binary for the current source (a platform wheel carries it
    there too, listed in the wheel's RECORD, so that ``pip uninstall`` removes it)."""
    return os.path.join(BUILD_DIR, artifact_name())


def untrusted(path: str) -> str | None:
    """Why ``path`` must not be run as hcp-exec, or None: it must be a regular, executable
    file, owned by root or by us, and writable by nobody else, except the group when the
    group can write this very module too (pip installs a wheel's files as 0o775/0o664 under
    umask 002, Ubuntu's default for users: whoever can rewrite the binary then can already
    rewrite the Python that runs it, so refusing it protects nothing)."""
    try:
        st = os.stat(path)
    except OSError as e:
        return f"{path}: {e.strerror}"
    if not stat.S_ISREG(st.st_mode):
        return f"{path}: not a regular file"
    if st.st_uid not in (0, os.geteuid()):
        return f"{path}: owned by uid {st.st_uid}, neither root nor us"
    loose = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if loose:
        try:
            own = os.stat(__file__)
        except OSError:
            own = None
        if (loose & stat.S_IWOTH or own is None or not own.st_mode & stat.S_IWGRP
                or (own.st_uid, own.st_gid) != (st.st_uid, st.st_gid)):
            return f"{path}: writable by others (mode {stat.S_IMODE(st.st_mode):o})"
    if not os.access(path, os.X_OK):
        return f"{path}: not executable"
    return None


def _trusted(path: str) -> bool:
    return untrusted(path) is None


def binary() -> str | None:
    """The built hcp-exec for this source, or None (looked up once per process)."""
    return _lookup()[0]


def _lookup() -> tuple[str | None, str]:
    """(the trusted binary or None, why not), looked up once per process."""
    global _binary, _missing
    if _binary is False:
        with _lock:
            if _binary is False:
                try:
                    path = artifact_path()
                    why = untrusted(path)
                except OSError as e:
                    path, why = None, f"source {SOURCE}: {e.strerror}"
                if why is not None and why.endswith(os.strerror(errno.ENOENT)):
                    why = f"no binary for this source: {path} does not exist"
                _missing = why or ""
                _binary = path if why is None else None
    return _binary, _missing  # type: ignore[return-value]


def available() -> bool:
    return binary() is not None and _broken is None


def status() -> tuple[str, str]:
    """What ``auto`` uses and why: ("native", the binary's path) or ("ctypes", the reason
    no native executor can run: no binary for this source, an untrusted one, or one the
    kernel refused to exec in this process)."""
    path, why = _lookup()
    if path is None:
        return "ctypes", why
    if _broken is not None:
        return "ctypes", _broken
    return "native", path


def selected(name: str | None = None) -> str:
    """The executor a spawn asking for ``name`` (None: the default) uses: native or ctypes."""
    name = check(name or _default)
    if name == "ctypes":
        return "ctypes"
    if name == "native":
        return "native"
    return "native" if available() else "ctypes"


#: The fallback's cost, measured on the 2-vCPU development VM: /bin/true through the ctypes
#: executor 12.8-14.7 ms, through hcp-exec 3.6-3.9 ms (issue #16).
FALLBACK_WARNING = ("hcp-linux: warning: native executor not available ({why}); using the ctypes "
                    "fallback, ~3x slower per run: pip install a platform wheel, or run "
                    "`python -m hcp_linux.native.build`")
_warned = False


def _warn_fallback() -> None:
    """Say once per process that ``auto`` fell back to ctypes for want of a binary it can run
    (never when the caller asked for ctypes): the slowdown must not be silent."""
    global _warned
    why = status()[1]  # before the lock: the lookup takes it
    with _lock:
        if _warned:
            return
        _warned = True
    import sys
    from ..errors import printable
    print(FALLBACK_WARNING.format(why=printable(why)), file=sys.stderr)


def _unavailable() -> Exception:
    from ..errors import SandboxError
    why = _broken or (f"{_lookup()[1]} (install a platform wheel, or run `make setup` or "
                      "`python -m hcp_linux.native.build`: it needs a C compiler)")
    return SandboxError(f"native executor unavailable: {why}")


def _str(parts: list[bytes], s: bytes) -> None:
    parts.append(_U64(len(s) + 1))
    parts.append(s)
    parts.append(b"\0")


def view_bytes(plan: "Plan") -> bytes:
    """The plan's prepared section: all that building the mount view and the confinement
    that is the same for every run (no_new_privs, capabilities, Landlock, seccomp) read, and
    only that. Two plans with the same section get the same view (inodes included) and the
    same confinement, which is what lets a spare do both ahead of time. Made once per
    confinement and the other fields it reads."""
    F = FLAGS
    vf = (F["MOUNTNS"] * ("mountns" in plan.layers) | F["PROC_FRESH"] * plan.proc_fresh
          | F["PID_MAX"] * (plan.pid_max is not None) | F["HOLDS_SETPCAP"] * plan.holds_setpcap
          | F["SECCOMP"] * (plan.seccomp is not None)
          | F["LANDLOCK"] * (plan.landlock is not None))
    bpf = plan.seccomp.bpf if plan.seccomp is not None else b""
    return plan.derived(("view-bytes", vf, plan.pid_max, plan.tmp_options, plan.shm_options,
                         plan.cap_last_cap, bpf), lambda: _view_bytes(plan, vf, bpf))


def makes_ruleset(plan: "Plan") -> bool:
    """Whether hcp-exec makes the Landlock ruleset itself (with a mount view: a rule on each
    bind it cloned and checked, then the late rules), so the parent creates none."""
    return plan.landlock is not None and "mountns" in plan.layers


def _landlock_bytes(plan: "Plan") -> list[bytes]:
    """The Landlock part of the prepared section: handled rights, the dir-only rights (taken
    from a rule on a non-directory) and the late rules (for mounts that exist only inside),
    each masked as CreatedRuleset.add_path_fd would."""
    from hcp_linux import landlock
    ruleset = plan.landlock
    assert ruleset is not None
    requested, handled = int(ruleset.requested_fs), int(ruleset.handled_fs)
    parts = [_U64(handled), _U64(int(ruleset.handled_net)), _U64(int(ruleset.scoped)),
             _U64(int(landlock.DIR_ONLY_RIGHTS)), _U64(len(plan.late_rules))]
    for path, access in plan.late_rules:
        if not access or access & ~requested:  # what CreatedRuleset.add_path_fd refuses
            from ..errors import ChildSetupError
            raise ChildSetupError("internal", errno.EINVAL,
                                  f"late rule {path!r}: rights not in handled_fs")
        _str(parts, path)
        parts.append(_U64(access & handled))
    return parts


def _view_bytes(plan: "Plan", vf: int, bpf: bytes) -> bytes:
    parts = [_U64(vf), _U64(plan.pid_max or 0)]
    _str(parts, plan.tmp_options)
    _str(parts, plan.shm_options)
    parts.append(_U64(len(plan.binds)))
    for bd in plan.binds:
        _str(parts, bd.source)
        _str(parts, bd.target)
        parts += [_U64(int(bd.is_dir)), _U64(bd.dev & _MASK), _U64(bd.ino & _MASK),
                  _U64(bd.attrs), _U64(bd.access)]
    parts.append(_U64(len(plan.masks)))
    for path, is_dir in plan.masks:
        _str(parts, path)
        parts.append(_U64(int(is_dir)))
    parts.append(_U64(len(plan.symlinks)))
    for link, dest in plan.symlinks:
        _str(parts, link)
        _str(parts, dest)
    parts += [_U64(plan.cap_last_cap), _U64(len(bpf)), bpf]
    if plan.landlock is not None:
        parts += _landlock_bytes(plan)
    return b"".join(parts)


def plan_bytes(plan: "Plan", stdio: Sequence[int], ruleset: "CreatedRuleset | None",
               proxy_fd: int, done_fd: int = -1, set_umask: bool = False,
               view: bytes | None = None,
               process: tuple[int, int, int] | None = None) -> bytes:
    """The plan as hcp-exec reads it (little-endian u64 fields, length-prefixed strings).
    Call it in the spawning thread: it records that thread's signal mask, and this moment's
    ignored signals and (``set_umask``: for a spare started a while ago) umask; or, given
    ``process`` (umask, ignored, blocked), those of the process that will start hcp-exec."""
    from ..child import DEFAULT_SIGNALS
    from ..protocol import PROXY_ADDRESS

    if process is None:
        umask, ignored = _process_status()
        blocked = _blocked_signals()
    else:
        umask, ignored, blocked = process
    ignored &= ~sum(1 << (int(s) - 1) for s in DEFAULT_SIGNALS)

    F = FLAGS
    flags = 0
    for layer, bit in LAYER_FLAGS:
        if layer in plan.layers:
            flags |= bit
    flags |= (F["CONFINED"] * plan.confined | F["PROXY"] * plan.proxy
              | F["HOLDS_SETPCAP"] * plan.holds_setpcap | F["PROC_FRESH"] * plan.proc_fresh
              | F["WAIT_FOR_TREE"] * plan.wait_for_tree
              | F["LANDLOCK"] * (plan.landlock is not None)
              | F["CANARY"] * (plan.canary is not None)
              | F["SECCOMP"] * (plan.seccomp is not None)
              | F["PID_MAX"] * (plan.pid_max is not None))
    host, port = PROXY_ADDRESS
    a, b, c, d = (int(x) for x in host.split("."))
    if (ruleset is not None) == makes_ruleset(plan) and plan.landlock is not None:
        from ..errors import ChildSetupError
        raise ChildSetupError("internal", errno.EINVAL, "native executor: a Landlock ruleset "
                              "is made by hcp-exec with a mount view, by the parent without")
    parts = [_U64(PLAN_VERSION << 32 | PLAN_MAGIC)]
    parts += [_U64(v & _MASK) for v in (
        flags, plan.parent_pid, plan.uid, plan.gid,
        stdio[0], stdio[1], stdio[2], ruleset.fd if ruleset is not None else -1, proxy_fd,
        done_fd, a << 24 | b << 16 | c << 8 | d, port, umask if set_umask else -1, ignored,
        blocked)]
    for s in (plan.cwd, plan.exe, os.fsencode(plan.canary) if plan.canary is not None else b"/"):
        _str(parts, s)
    if view is None:
        view = view_bytes(plan)
    parts += [_U64(len(view)), view, _U64(len(plan.rlimits))]
    for res, limit in plan.rlimits:
        parts += [_U64(res), _U64(limit & _MASK)]
    parts.append(_U64(len(plan.argv)))
    for arg in plan.argv:
        _str(parts, arg)
    parts.append(_U64(len(plan.env)))
    for key, value in plan.env.items():
        if not key or b"=" in key:  # what os.execve refuses
            from ..errors import ChildSetupError
            raise ChildSetupError("internal", errno.EINVAL,
                                  f"illegal environment variable name {key!r}")
        _str(parts, key + b"=" + value)
    return b"".join(parts)


def spawn(executor: str | None, plan: "Plan", err_w: int, stdio: Sequence[int],
          proxy_fd: int, done_fd: int = -1, ready_ok: bool = True) -> tuple[int, bool] | None:
    """Start the monitor through hcp-exec: (its pid, whether a ready spare took the plan);
    None: use the ctypes executor.

    A confined plan goes to a spare: a ready one when the pool has it (and ``ready_ok``:
    the caller may refuse one, after a ready spare did not answer), else one started now
    (see "spares" below). A native-local plan (or any, with ``set_spares("never")``) is
    handed to a fresh hcp-exec on its command line, its fds inherited by number. The
    Landlock ruleset is hcp-exec's to make with a mount view; without one it is made here and
    passed (makes_ruleset).
    """
    if selected(executor) == "ctypes":
        if (executor or _default) == "auto":
            _warn_fallback()
        return None
    exe = binary()
    if exe is None or _broken is not None:
        raise _unavailable()
    ruleset = (plan.landlock.create() if plan.landlock is not None and not makes_ruleset(plan)
               else None)
    try:
        return _spawn(executor, exe, plan, err_w, stdio, ruleset, proxy_fd, done_fd,
                      ready_ok)
    finally:
        if ruleset is not None:
            ruleset.close()


def _spawn(executor: str | None, exe: str, plan: "Plan", err_w: int, stdio: Sequence[int],
           ruleset: "CreatedRuleset | None", proxy_fd: int, done_fd: int,
           ready_ok: bool) -> tuple[int, bool] | None:
    if not plan.confined or _spares == "never":
        stats["direct"] += 1
        pid = _spawn_direct(executor, exe, plan, err_w, stdio, ruleset, proxy_fd, done_fd)
        return None if pid is None else (pid, False)
    view = view_bytes(plan)
    # A ready spare was started a while ago: it takes this moment's umask from the plan.
    blob = plan_bytes(plan, stdio, ruleset, proxy_fd, done_fd, True, view)
    key = _spare_key(plan, exe)
    pool = _pool()
    spare = pool.take(key, view if "mountns" in plan.layers else None) if ready_ok else None
    if spare is not None:
        if _hand_over(spare, blob, err_w, stdio, ruleset, proxy_fd, done_fd):
            stats["ready"] += 1
            pool.kick()
            return spare.pid, True
        pool.discard(spare)  # it died idle (killed?), or takes no message: start one now
    try:  # from a thread that lasts: the run must not die with the spawning thread
        spare = on_lasting_thread(lambda: _make_spare(key + (None,)))
    except OSError as e:
        _cannot_exec(executor, exe, e)
        return None
    if _hand_over(spare, blob, err_w, stdio, ruleset, proxy_fd, done_fd):
        stats["on_the_spot"] += 1
        pool.kick()
        return spare.pid, False
    pool.discard(spare)
    from ..errors import ChildSetupError
    raise ChildSetupError("internal", errno.EPIPE, "native executor: hcp-exec exited early")


def _spawn_direct(executor: str | None, exe: str, plan: "Plan", err_w: int,
                  stdio: Sequence[int], ruleset: "CreatedRuleset | None",
                  proxy_fd: int, done_fd: int) -> int | None:
    fd = memfd(plan_bytes(plan, stdio, ruleset, proxy_fd, done_fd))
    try:
        keep = {proxy_fd, done_fd, ruleset.fd if ruleset is not None else -1, *stdio}
        try:  # from a thread that lasts: the run must not die with the spawning thread
            return on_lasting_thread(lambda: spawn_hcp_exec(exe, fd, err_w, keep))
        except OSError as e:
            _cannot_exec(executor, exe, e)
            return None
    finally:
        os.close(fd)


def _cannot_exec(executor: str | None, exe: str, e: OSError) -> None:
    """posix_spawn of hcp-exec failed: "auto" goes on with ctypes (for good), else raise."""
    global _broken
    if e.errno not in (errno.ENOENT, errno.EACCES, errno.ENOEXEC, errno.EPERM):
        raise e  # EAGAIN, ENOMEM...: as os.fork() would
    if (executor or _default) != "auto":
        from ..errors import SandboxError
        raise SandboxError(f"native executor {exe}: {os.strerror(e.errno)}") from None
    _broken = f"{exe}: {os.strerror(e.errno)}"  # e.g. a noexec mount
    _warn_fallback()
    return None


# --- spares -----------------------------------------------------------------------------------
#
# Most of a confined spawn's cost that does not depend on the plan (exec of hcp-exec, the user,
# network and IPC namespaces, uid/gid maps, the pid namespace's init, loopback) can be paid
# before the plan exists; so can the mount view and the confinement that is the same for every
# run (no_new_privs, capabilities, Landlock, seccomp), when the next plan's prepared section is
# the same as the last one's (same grants, same inodes, same masks, same rules, same seccomp
# program): such a spare waits already confined, and only rlimits follow the plan. A spare is
# an hcp-exec started with ``--spare``: it does those steps of child.py, then waits on a socket for one plan and the
# run's fds, refuses a plan it was not prepared for, and reports a step that failed meanwhile on
# that run's error pipe as if it had just failed. Each spare serves one run: no namespace is
# ever shared. Every confined spawn goes through a spare (started on the spot when none is
# ready); ready ones are made by one thread that lives as long as the process (PDEATHSIG
# follows the thread that spawned a process), once a kind of plan repeats. An idle spare holds
# no fd of the runtime's (stdio /dev/null, cwd "/").

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


def _spare_key(plan: "Plan", exe: str) -> tuple:
    flags = 0
    for layer, bit in LAYER_FLAGS:
        if layer in plan.layers:
            flags |= bit
    return flags, plan.uid, plan.gid, exe


def _process_status() -> tuple[int, int]:
    """(umask, ignored signals) of this process, from one read of /proc/self/status: the
    umask read without changing it (os.umask would, for every thread); the ignored signals
    (bit n-1 for signal n) that a fork would pass on, which hcp-exec gives the command
    whenever its spare was started. (-1, 0) if unreadable. The file stays open (a pread
    regenerates it); a forked child opens its own."""
    global _status_fd
    umask, ignored = -1, 0
    try:
        if _status_fd < 0:
            with _status_lock:
                if _status_fd < 0:
                    _status_fd = os.open("/proc/self/status", os.O_RDONLY | os.O_CLOEXEC)
        fields = parse_status(os.pread(_status_fd, 8192, 0), "Umask", "SigIgn")
        umask, ignored = int(fields["Umask"], 8), int(fields["SigIgn"], 16)
    except (OSError, ValueError, KeyError):
        pass
    return umask, ignored


_status_fd = -1
_status_lock = threading.Lock()


def _forget_status_fd() -> None:
    """In a forked child: /proc/self was resolved to the parent when the fd was opened."""
    global _status_fd, _status_lock
    if _status_fd >= 0:
        try:
            os.close(_status_fd)
        except OSError:
            pass
    _status_fd, _status_lock = -1, threading.Lock()


os.register_at_fork(after_in_child=_forget_status_fd)


def _blocked_signals() -> int:
    """The calling thread's signal mask, as a fork from it would have it."""
    import signal
    return sum(1 << (int(s) - 1) for s in signal.pthread_sigmask(signal.SIG_BLOCK, ()))


class _Spare:
    __slots__ = ("pid", "sock", "born")

    def __init__(self, pid: int, sock: "socket.socket") -> None:
        self.pid, self.sock, self.born = pid, sock, time.monotonic()


def _hand_over(spare: _Spare, plan: bytes, err_w: int, stdio: Sequence[int],
               ruleset: "CreatedRuleset | None", proxy_fd: int, done_fd: int) -> bool:
    """Send the plan and the run's fds to a spare, in one message; False if it is gone (or
    its socket is full: never block on a spare). The plan travels in the message up to
    INLINE_MAX (and the socket's send buffer), else in a memfd."""
    import array
    from socket import MSG_DONTWAIT, SCM_RIGHTS, SOL_SOCKET
    bits = 0
    fds = [err_w, *stdio]
    if ruleset is not None and ruleset.fd >= 0:
        fds.append(ruleset.fd)
        bits |= MESSAGE_BITS["RULESET"]
    if proxy_fd >= 0:
        fds.append(proxy_fd)
        bits |= MESSAGE_BITS["PROXY"]
    if done_fd >= 0:
        fds.append(done_fd)
        bits |= MESSAGE_BITS["DONE"]
    magic = _U64(PLAN_VERSION << 32 | PLAN_MAGIC)
    sent = False
    try:
        if len(plan) <= INLINE_MAX:
            try:
                spare.sock.sendmsg([magic, _U64(bits | MESSAGE_BITS["INLINE"]), plan],
                                   [(SOL_SOCKET, SCM_RIGHTS, array.array("i", fds))],
                                   MSG_DONTWAIT)
                sent = True
            except OSError as e:
                if e.errno != errno.EMSGSIZE:  # EMSGSIZE: a small send buffer; nothing sent
                    raise
        if not sent:
            fd = memfd(plan)
            try:
                spare.sock.sendmsg([magic, _U64(bits)],
                                   [(SOL_SOCKET, SCM_RIGHTS, array.array("i", [fd, *fds]))],
                                   MSG_DONTWAIT)
            finally:
                os.close(fd)
    except OSError:
        return False
    spare.sock.close()  # it has all it needs: from now on it is this run's monitor
    return True


def _make_spare(kind: tuple, sigmask: "set[int] | None" = None) -> _Spare:
    """A spare for ``kind``: (namespace flags, uid, gid, binary, view section or None).
    ``sigmask``: its signal mask (default: the calling thread's, as for any spawn)."""
    import socket
    flags, uid, gid, exe, view = kind
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
        if min(theirs, devnull, 3 if view_fd < 0 else view_fd) < 3:
            raise OSError(errno.EBADF, "fds 0-2 are not open")
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
    return _Spare(pid, socket.socket(fileno=ours))


def _retire(spare: _Spare, deadline: float | None = None) -> bool:
    """An unused spare: EOF on its socket makes it exit; reap it. With ``deadline`` (a
    time.monotonic() value), one still running then is killed, through a pidfd taken before
    (never a pid that could have been reused), and reaped; returns False then (its pid 1,
    killed by PDEATHSIG, may outlive the reaping by a moment), else True."""
    spare.sock.close()
    if deadline is None:  # never wait on a spare here: the reaper kills one that hangs on
        from ..teardown import reaper
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


class _Pool:
    """Idle spares per kind (namespace layers, uid, gid, binary, view section or None), kept
    by one thread. The kind made is a guess at the next plan: the same view as this one when
    the last two plans (of these namespaces, uid, gid) had the same, else namespaces only."""

    def __init__(self) -> None:
        self.owner = os.getpid()
        self.cond = threading.Condition()
        self.idle: dict[tuple, list[_Spare]] = {}
        self.wanted: dict[tuple, float] = {}  # kinds to keep warm (last wanted), LRU first
        self.seen: dict[tuple, int] = {}
        self.last_view: dict[tuple, bytes | None] = {}
        self.doomed: list[_Spare] = []
        self.thread: threading.Thread | None = None
        self.sigmask: set[int] = set()  # of the thread that started the keeper
        self.busy = False  # the keeper is retiring or making spares, out of the lock
        self.clearing = 0  # clear()s waiting: the doomed are theirs to retire, not the keeper's

    def take(self, key: tuple, view: bytes | None) -> _Spare | None:
        """A ready spare for this plan (its view built, else namespaces only), or None."""
        full, bare = key + (view,), key + (None,)
        with self.cond:
            seen = self.seen[key] = self.seen.get(key, 0) + 1
            same = view is not None and self.last_view.get(key) == view
            self.last_view[key] = view
            if len(self.seen) > 64:  # forget rare kinds
                self.seen, self.last_view = {key: seen}, {key: view}
            spare = None
            for kind in (full, bare) if view is not None else (bare,):
                if self.idle.get(kind):
                    spare = self.idle[kind].pop(0)
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
            done = _retire(spare, deadline) and done
        return done

    def discard(self, spare: _Spare) -> None:
        with self.cond:
            if self.thread is not None:  # the keeper reaps it
                self.doomed.append(spare)
                self.cond.notify()
                return
        _retire(spare)

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
                doomed: list[_Spare] = []
                if not self.clearing:  # else the waiting clear() retires them, and waits
                    doomed, self.doomed = self.doomed, []
                key = self._short()
                self.busy = True
            time.sleep(0.001)  # the spawning thread that kicked us is on its way to block
            for old in doomed:
                _retire(old)
            if key is None:
                continue
            try:
                spare: _Spare | None = _make_spare(key, self.sigmask)
            except OSError:
                spare = None
            with self.cond:
                if spare is None:
                    self.wanted.pop(key, None)  # cannot make one: stop trying for this kind
                elif key in self.wanted:
                    self.idle.setdefault(key, []).append(spare)
                else:
                    self.doomed.append(spare)


_the_pool: _Pool | None = None
_pool_lock = threading.Lock()


def _pool() -> _Pool:
    """This process's pool (a forked child starts an empty one: the spares are not its own)."""
    global _the_pool, _pool_lock
    pool = _the_pool
    if pool is not None and pool.owner == os.getpid():
        return pool
    if pool is not None:  # forked: the lock may have been held by a thread that is gone
        _pool_lock = threading.Lock()
    with _pool_lock:
        if _the_pool is None or _the_pool.owner != os.getpid():
            _the_pool = _Pool()
        return _the_pool


__all__ = ["EXECUTORS", "SPARES", "available", "binary", "get_default",
           "makes_ruleset", "plan_bytes", "selected", "set_default", "set_spares", "spawn"]
