"""The child side of a confined spawn: a fixed list of steps, then execve.

Everything here runs in the monitor the runtime started, until exec. It only executes what
the Plan precomputed: no configuration is read, nothing is imported, nothing is logged. A
failing step writes (step, errno, detail) to the error pipe and exits 125; the parent turns
that into ``error: sandbox: <step>: <strerror>``.

The monitor is a fork of the runtime only while the runtime has a single thread; otherwise a
fresh helper interpreter, posix_spawn'd (:mod:`hcp_linux.ctypes_executor.child_main`): Python never runs in
a fork of a multi-threaded process. So this module imports only what that helper can afford
at start-up: no typing, and ``_signal`` and ``_socket`` rather than their Python wrappers,
which import enum (~4 ms of the helper's start).

Process shape (the pid namespace needs a fork after unshare):

    parent ──fork (or the helper)──► monitor (C1): session, namespaces, uid/gid maps
                        └──fork──► payload (C2): pid 1 of the new pid namespace; mount view,
                                   loopback, no_new_privs, capabilities, Landlock, seccomp, exec

The monitor mirrors the payload's exit status to the parent. When the payload (pid 1) exits,
the kernel kills everything left in its pid namespace, so no process outlives the run; when the
monitor dies, PDEATHSIG kills the payload and with it the namespace.
"""
from __future__ import annotations

import errno
import fcntl
import os
import resource
import select  # here, not in the init: by then its view may not hold this Python's modules
import stat
import struct

import _signal
import _socket

from .. import _libc as L
from ..protocol import (CANARY, PROXY_ADDRESS, RESOLVER_ADDRESS, STATUS_ALWAYS, STATUS_SECCOMP,
                       STATUS_SETPCAP, SYNTHETIC_NET)
from ..protocol import (DEFAULT_SIGNALS, DETAILS, HANDOVER_MARK, VIEW_LOST, encode_error_record,
                        status_lacks)

TYPE_CHECKING = False  # typing.TYPE_CHECKING: the helper process (child_main) never imports typing
if TYPE_CHECKING:
    from typing import NoReturn, Sequence

    from hcp_linux.landlock import CreatedRuleset

    from ..plan.plan import Plan
    from ..protocol import RunFds

NEWROOT = b"/tmp"  # where the new root is assembled before pivot_root (any existing dir works)

_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
_SIOCSIFADDR, _SIOCSIFNETMASK = 0x8916, 0x891C


class _StepFailed(Exception):
    def __init__(self, step: str, err: int, detail: str = "") -> None:
        self.step, self.err, self.detail = step, err, detail


def _step(step: str, fn, *args, detail: str = ""):  # type: ignore[no-untyped-def]
    try:
        return fn(*args)
    except OSError as e:
        raise _StepFailed(step, e.errno or errno.EIO, detail) from None


def _report(errfd: int, step: str, err: int, detail: str) -> NoReturn:
    record = encode_error_record(step, err, detail)
    try:
        os.write(errfd, record)
    finally:
        os._exit(125)


def run(plan: "Plan", fds: "RunFds", ruleset: "CreatedRuleset | None") -> NoReturn:
    """Entry point in the forked child (the monitor), with the run's channels ``fds``: a
    failing step's record goes to ``fds.err``; the sandbox's init reports the command's
    status on ``fds.done`` once the run's processes are all gone; the seccomp filter's
    listener is sent on ``fds.notify`` (plan.seccomp_listener). Never returns."""
    global _chld_ignored, _command_umask
    try:
        # A runtime that ignores SIGCHLD (its caller's, inherited) would have the kernel
        # reap our children: the init's and this monitor's waits would find no status. Ours
        # at default; the command gets the runtime's disposition back (_exec).
        _chld_ignored = _signal.getsignal(_signal.SIGCHLD) == _signal.SIG_IGN
        _signal.signal(_signal.SIGCHLD, _signal.SIG_DFL)
        # Our steps under 022 (a caller's 0377 would make the view's directories
        # untraversable); the command gets the caller's back (_exec).
        _command_umask = os.umask(0o022)
        _monitor(plan, fds, ruleset)
    except _StepFailed as f:
        _report(fds.err, f.step, f.err, f.detail)
    except BaseException as e:  # noqa: BLE001 - a bug must still fail closed, with a reason
        _report(fds.err, "internal", errno.EIO, f"{type(e).__name__}: {e}")
    os._exit(125)


def _monitor(plan: "Plan", fds: "RunFds", ruleset: "CreatedRuleset | None") -> None:
    # Standard streams first, so that every later step sees the final fds 0-2.
    for target, fd in enumerate(fds.stdio):
        if fd != target:
            _step("stdio", os.dup2, fd, target, True)
    # A new session: no controlling terminal, so TIOCSTI/TIOCLINUX on an inherited tty
    # cannot inject input (seccomp refuses them too), and the run is its own process group.
    _step("setsid", os.setsid)
    # Die with the parent; a parent that already died before prctl is caught by the check.
    _step("pdeathsig", L.prctl, L.PR_SET_PDEATHSIG, _signal.SIGKILL)
    if os.getppid() != plan.parent_pid:
        os._exit(125)
    layers = plan.layers
    if "userns" in layers:
        _step("unshare-user", L.unshare, L.CLONE_NEWUSER)
        # setgroups must be denied before an unprivileged process may write its gid_map.
        _step("uid-map", _write_id_maps, plan.uid, plan.gid)
    for layer, step, flag in (("mountns", "unshare-mount", L.CLONE_NEWNS),
                              ("netns", "unshare-net", L.CLONE_NEWNET),
                              ("ipcns", "unshare-ipc", L.CLONE_NEWIPC),
                              ("pidns", "unshare-pid", L.CLONE_NEWPID)):
        if layer in layers:
            _step(step, L.unshare, flag)
    if "mountns" in layers:
        # Nothing we mount may propagate back to the host's mount namespace.
        _step("mount-private", L.mount, None, b"/", None, L.MS_REC | L.MS_PRIVATE)
    if "pidns" not in layers:
        _payload(plan, fds, ruleset, -1)
    status_r, status_w = _step("fork-pid1", os.pipe2, os.O_CLOEXEC)
    pid = _step("fork-pid1", os.fork)
    if pid == 0:
        os.close(status_r)
        try:
            _payload(plan, fds, ruleset, status_w)
        except _StepFailed as f:
            _report(fds.err, f.step, f.err, f.detail)
        except BaseException as e:  # noqa: BLE001
            _report(fds.err, "internal", errno.EIO, f"{type(e).__name__}: {e}")
        os._exit(125)
    _mirror(pid, status_r)


def _mirror(pid: int, status_r: int) -> NoReturn:
    """Monitor: hold nothing of the run's, wait for the sandbox's init, exit as the command did.

    The init (pid 1 of the sandbox) cannot die of a signal by its own hand, so it sends the
    command's raw wait status over ``status_r``; without it (init killed, setup failed) the
    init's own status stands.
    """
    _close_all_but(status_r)
    # A graceful stop (terminate()) reaches the command through the init, which forwards it.
    for sig in (_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP):
        _signal.signal(sig, lambda s, _f: _kill_quietly(pid, s))
    # KILL_REQUEST: kill the init; its exit waits until the kernel has killed and reaped every
    # process of the namespace, so when we exit (and the parent's wait() returns) all is gone.
    _signal.signal(KILL_REQUEST, lambda _s, _f: _kill_quietly(pid, _signal.SIGKILL))
    data = b""
    while chunk := os.read(status_r, 4):
        data += chunk
    _, status = os.waitpid(pid, 0)
    if len(data) == 4:
        status = struct.unpack("<i", data)[0]
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if signum != _signal.SIGKILL:  # SIGKILL's action cannot be changed (and needs no reset)
            _signal.signal(signum, _signal.SIG_DFL)
            _signal.pthread_sigmask(_signal.SIG_UNBLOCK, [signum])
        os.kill(os.getpid(), signum)
        os._exit(128 + signum)  # signals whose default action is not to terminate
    os._exit(os.waitstatus_to_exitcode(status))


def _monitor_alive(status_w: int) -> None:
    """OSError ESRCH once the monitor (the status pipe's only reader) is gone."""
    if L.poll_error(status_w):
        raise OSError(errno.ESRCH, "the monitor is gone")


def _write_id_maps(uid: int, gid: int) -> None:
    for name, text in ((b"/proc/self/setgroups", b"deny"),
                       (b"/proc/self/uid_map", b"%d %d 1" % (uid, uid)),
                       (b"/proc/self/gid_map", b"%d %d 1" % (gid, gid))):
        _write_file(name, text)


def _payload(plan: "Plan", fds: "RunFds", ruleset: "CreatedRuleset | None",
             status_w: int) -> NoReturn:
    if "pidns" in plan.layers:
        # pid 1 of the sandbox dies with the monitor; the kernel then empties the namespace.
        _step("pdeathsig", L.prctl, L.PR_SET_PDEATHSIG, _signal.SIGKILL)
        # A monitor that died between the fork and that prctl sent no signal: it alone holds
        # the status pipe's read end, so the write end polls POLLERR once it is gone.
        _step("pdeathsig", _monitor_alive, status_w, detail="the monitor is gone")
    mountinfo = -1
    if "mountns" in plan.layers:
        _build_mount_view(plan)
        if plan.watch:
            # the watch on the view's carve-outs: their mounts are on the host's own names,
            # which the kernel takes away when a host process replaces the file. A change
            # from now on wakes the fd's poll (the init's); one before it is looked for here
            mountinfo = _step("watch", os.open, "/proc/self/mountinfo",
                              os.O_RDONLY | os.O_CLOEXEC)
            if _view_changed(mountinfo, plan.watch):
                raise _StepFailed("watch", errno.ESTALE, DETAILS["VIEW_LOST"])
    if "netns" in plan.layers:
        _step("loopback-up", _loopback_up)
    if plan.proxy:
        _egress_capture(fds.proxy, plan.capture_ports, plan.capture_nets)
        _step("proxy-listen", _proxy_listen, fds.proxy)
    _step("chdir", os.chdir, plan.cwd)
    if not plan.confined:  # native-local (HCP §10.3): a trust decision, not a confinement
        _exec(plan)
    for res, value in plan.rlimits:  # before the forks below, so they bind everything
        _step("rlimits", resource.setrlimit, res, (value, value), detail=str(res))
    # no_new_privs: setuid/file-capability binaries cannot raise privileges after exec, and
    # Landlock and seccomp may be installed without CAP_SYS_ADMIN.
    _step("no-new-privs", L.prctl, L.PR_SET_NO_NEW_PRIVS, 1)
    _step("drop-capabilities", _drop_capabilities, plan.cap_last_cap, plan.holds_setpcap)
    if ruleset is not None:
        _step("landlock-rules", _add_late_rules, plan, ruleset)
        _step("landlock-restrict", ruleset.restrict_self, plan.landlock_restrict)
    if plan.seccomp is not None and plan.seccomp_listener:
        # Last before exec, so the filter need not allow any of the setup calls above. The
        # listener that answers its denials goes to the runtime, and only there: a process
        # of the sandbox holding it could answer its own calls.
        listener = _step("seccomp", plan.seccomp.install, L.SECCOMP_FILTER_FLAG_NEW_LISTENER)
        _step("seccomp", _send_listener, fds.notify, listener)
    elif plan.seccomp is not None:
        _step("seccomp", plan.seccomp.install)
    # Nothing inherited beyond 0-2 survives exec (the error pipe is already close-on-exec).
    _step("close-fds", L.close_range, 3, 0xFFFFFFFF, L.CLOSE_RANGE_CLOEXEC)
    if status_w < 0:
        _verify(plan)
        _exec(plan)
    # With a pid namespace we are its pid 1, which the kernel shields from signals it has no
    # handler for, even self-sent ones. So the command runs as pid 2 and we stay as init,
    # as confined as the command (forked after every step above) and non-dumpable so that
    # nothing in the sandbox can read or write our memory: /proc/1/mem, fds and environ are
    # then root-owned and need CAP_SYS_PTRACE, which nothing in the sandbox holds (a fence on
    # every rung, Landlock or not). Set before the fork: a command that opened /proc/1/mem
    # while we were still dumpable would keep its fd. Its execve makes it dumpable again.
    _step("fork-command", L.prctl, L.PR_SET_DUMPABLE, 0, detail="PR_SET_DUMPABLE")
    pid = _step("fork-command", os.fork)
    if pid == 0:
        _step("pdeathsig", L.prctl, L.PR_SET_PDEATHSIG, _signal.SIGKILL)
        # A session of its own, so a scheduler autogroup of its own: a fork bomb in the
        # command's tree then shares the CPU among itself, and the init and monitor, which
        # must run to end the run, are not starved by it (as bubblewrap's --new-session).
        _step("setsid", os.setsid)
        _verify(plan)
        _exec(plan)
    # The init keeps nothing but its status pipes: fds it inherited (this run's pipes, and
    # any other concurrent run's) would otherwise stay open for the whole run.
    _close_all_but(status_w, fds.done, mountinfo)
    _init(pid, status_w, fds.done, plan.wait_for_tree, mountinfo, tuple(plan.watch))


def _close_all_but(*keep: int) -> None:
    """Close every fd but those in ``keep`` (-1 entries ignored)."""
    kept = sorted(fd for fd in keep if fd >= 0)
    for lo, hi in zip([0] + [fd + 1 for fd in kept], kept + [0xFFFFFFFF + 1]):
        if lo < hi:
            L.close_range(lo, hi - 1, 0)


#: Sent to the monitor by SandboxProcess.kill(): "kill the whole sandbox, then exit".
KILL_REQUEST = _signal.SIGUSR1

_FORWARDED = (_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP, _signal.SIGQUIT, _signal.SIGUSR1,
              _signal.SIGUSR2, _signal.SIGWINCH, _signal.SIGCONT)


def _mount_points(fd: int) -> set[bytes]:
    """The mount points /proc/self/mountinfo (``fd``) lists now (its fifth field, with the
    kernel's \\ooo escapes of space, tab, newline and backslash undone)."""
    os.lseek(fd, 0, os.SEEK_SET)
    parts = []
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        parts.append(chunk)
    out = set()
    for line in b"".join(parts).split(b"\n"):
        fields = line.split(b" ", 5)
        if len(fields) > 4:
            point = fields[4]
            if b"\\" in point:
                point = _unescape(point)
            out.add(point)
    return out


def _unescape(field: bytes) -> bytes:
    """``field`` with the kernel's \\ooo escapes undone, as hcp_exec.c's mount_point_is
    reads them: a backslash and three octal digits of one byte (\\000-\\377); anything
    else, itself."""
    out, i = bytearray(), 0
    while i < len(field):
        octal = field[i + 1:i + 4]
        if (field[i] == 0x5C and len(octal) == 3 and 0x30 <= octal[0] <= 0x33
                and all(0x30 <= c <= 0x37 for c in octal)):
            out.append(int(octal, 8))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return bytes(out)


def _view_changed(fd: int, watch: "Sequence[bytes]") -> bool:
    """Whether a watched path (a mask, a read-only carve-out) is no longer a mount point of
    the view: the host unlinked or renamed over its file, and the kernel took the mount away.
    Not the path's inode: the kernel wakes the poll when it takes the mount away, before the
    rename gives the name its new file. True when mountinfo cannot be read (fail closed)."""
    try:
        points = _mount_points(fd)
    except OSError:
        return True
    return any(path not in points for path in watch)


def _view_watch(mountinfo: int) -> "tuple[object, int] | None":
    """The init's watch on the view: a poll on /proc/self/mountinfo (``mountinfo``: POLLPRI
    when the mount table changes, as when the kernel takes a mount away) and on a wakeup pipe
    SIGCHLD writes to (no child's end is missed between a waitpid and the poll): (the poll,
    the pipe's read end), None when nothing is watched. OSError when it cannot be set up."""
    if mountinfo < 0:
        return None
    r, w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    _signal.set_wakeup_fd(w)
    _signal.signal(_signal.SIGCHLD, lambda _s, _f: None)
    poll = select.poll()
    poll.register(mountinfo, select.POLLPRI)
    poll.register(r, select.POLLIN)
    return poll, r


def _init(command: int, status_w: int, done: int, wait_for_tree: bool, mountinfo: int = -1,
          watch: "tuple[bytes, ...]" = ()) -> NoReturn:
    """pid 1 of the sandbox: forward signals to the command, reap orphans, report the
    command's wait status. When the command has exited: by default kill what is left, at
    once; with ``wait_for_tree``, wait until it has all exited. Either way every process of
    the run is gone (reaped: in a pid namespace every process descends from pid 1, and a
    process's orphans are ours before it is a zombie) when the status is written: to the
    runtime first, on its "done" pipe, so it need not wait for the namespaces to be torn
    down, then to the monitor. ``watch``: the view's paths whose mount the host can take
    away (a mask, a read-only carve-out), through ``mountinfo`` (-1: none): when one has,
    every process of the run is killed at once, and the report to the runtime carries
    VIEW_LOST."""
    for sig in _FORWARDED:
        _signal.signal(sig, lambda s, _f: _kill_quietly(command, s))
    command_status = None
    lost = False
    try:  # looked at before the command started: a change since wakes the first poll
        watching = _view_watch(mountinfo)
    except OSError:  # fail closed: a view that cannot be watched ends the run
        watching, lost = None, True
        _kill_quietly(-1, _signal.SIGKILL)
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG if watching is not None else 0)
        except ChildProcessError:  # nothing left to wait for
            break
        if pid == 0 and watching is not None:  # children left, none ended: wait for either
            poll, wakeup = watching
            events = dict(poll.poll())  # type: ignore[attr-defined]
            if wakeup in events:
                try:
                    os.read(wakeup, 512)
                except BlockingIOError:
                    pass
            if mountinfo in events and _view_changed(mountinfo, watch):
                # a watched path lost its mount: what took its place is the host's file, and
                # the command sees it (readable where hidden, writable where read-only)
                lost, watching = True, None
                _kill_quietly(-1, _signal.SIGKILL)
            continue
        if pid == command:
            command_status = status
            for sig in _FORWARDED:
                _signal.signal(sig, lambda s, _f: _kill_quietly(-1, s))  # to all that remain
            if not wait_for_tree:
                try:
                    os.kill(-1, _signal.SIGKILL)
                except ProcessLookupError:  # nothing else runs
                    pass
    if command_status is None:
        os._exit(125)
    ok = True
    for fd, what in ((done, command_status | (VIEW_LOST if lost else 0)),
                     (status_w, command_status)):  # EPIPE on the first: the runtime stopped
        try:  # listening
            if fd >= 0:
                os.write(fd, struct.pack("<i", what))
        except OSError:
            ok = False
    os._exit(0 if ok else 125)


def _kill_quietly(pid: int, sig: int) -> None:
    """os.kill from a signal handler: nobody left to take the signal is no error (raised in a
    handler it would end this process, and with it the report of the command's status)."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass



#: Whether the runtime ignored SIGCHLD when it forked this child, and its umask then (set
#: in :func:`run`).
_chld_ignored = False
_command_umask = 0o022


def _exec(plan: "Plan") -> NoReturn:
    for sig in DEFAULT_SIGNALS:
        _step("execve", _signal.signal, sig, _signal.SIG_DFL)
    if _chld_ignored:  # as a fork of the runtime would have it
        _step("execve", _signal.signal, _signal.SIGCHLD, _signal.SIG_IGN)
    os.umask(_command_umask)
    try:
        os.execve(plan.exe, plan.argv, plan.env)
    except OSError as e:
        raise _StepFailed("execve", e.errno or errno.EIO, plan.exe.decode(errors="replace"))
    raise AssertionError("unreachable")


def _build_mount_view(plan: "Plan") -> None:
    """A new root that holds only what the policy grants, as bubblewrap builds one."""
    # 1. Clone every granted tree while the host's paths are still visible. The clone must
    #    be the very object the parent validated and gave Landlock rules to: compare inodes.
    trees = []
    for b in plan.binds:
        detail = b.source.decode(errors="replace")
        fd = _step("bind-clone", L.open_tree, L.AT_FDCWD, b.source,
                   L.OPEN_TREE_CLONE | L.OPEN_TREE_CLOEXEC | L.AT_RECURSIVE
                   | L.AT_SYMLINK_NOFOLLOW, detail=detail)
        st = _step("bind-clone", os.fstat, fd, detail=detail)
        if (st.st_dev, st.st_ino) != (b.dev, b.ino):
            raise _StepFailed("bind-clone", errno.ESTALE, DETAILS["STALE"].format(detail))
        _step("bind-clone", L.mount_setattr, fd, b"", L.AT_EMPTY_PATH | L.AT_RECURSIVE,
              b.attrs, detail=detail)
        trees.append((b, fd))
    # 2. The new root: an empty tmpfs, read-only once assembled.
    _step("root-tmpfs", L.mount, b"tmpfs", NEWROOT, b"tmpfs", L.MS_NOSUID | L.MS_NODEV,
          b"mode=0755,size=1m")
    # Private tmpfs mounts come before the binds: a granted path may lie beneath them
    # (a jail in /tmp), and must be attached on top, not hidden underneath.
    _step("tmp", _mount_tmpfs, NEWROOT + b"/tmp", plan.tmp_options)
    _step("dev", _mount_tmpfs, NEWROOT + b"/dev/shm", plan.shm_options)
    for b, fd in trees:
        target = NEWROOT + b.target
        detail = b.target.decode(errors="replace")
        if b.is_dir:
            _step("bind-attach", os.makedirs, target, 0o755, True, detail=detail)
        else:
            _step("bind-attach", _make_file, target, detail=detail)  # a device node or file
        _step("bind-attach", L.move_mount, fd, b"", L.AT_FDCWD, target,
              L.MOVE_MOUNT_F_EMPTY_PATH, detail=detail)
        os.close(fd)
    if plan.masks:
        _step("mask", _mask_secrets, plan.masks)
    for link, dest in plan.symlinks:
        _step("symlink", os.symlink, dest, NEWROOT + link, detail=link.decode(errors="replace"))
    _step("dev", _dev_links)
    if plan.pty:
        _step("devpts", _mount_devpts)
    _step("proc", _mount_proc, plan.proc_fresh)
    if plan.pid_max is not None:
        # A fork bomb runs out of pids in this namespace, even when launched as root.
        _step("pid-max", _write_file, NEWROOT + b"/proc/sys/kernel/pid_max",
              b"%d" % plan.pid_max)
    for path, masked in plan.proc_fences:  # after pid-max: it writes /proc/sys
        _step("proc-fence", _fence_proc, path, masked, detail=path.decode(errors="replace"))
    _step("canary", _make_file, NEWROOT + CANARY.encode())
    # 3. Switch roots and drop the old one: pivot_root(".", ".") stacks the old root on
    #    the new one; detaching it leaves no path back to the host tree.
    _step("pivot-root", os.chdir, NEWROOT)
    _step("pivot-root", L.pivot_root, b".", b".")
    _step("pivot-root", L.umount2, b".", L.MNT_DETACH)
    _step("pivot-root", os.chdir, b"/")
    _step("root-readonly", L.mount, None, b"/", None,
          L.MS_REMOUNT | L.MS_BIND | L.MS_RDONLY | L.MS_NOSUID | L.MS_NODEV)


def _mask_secrets(masks: list[tuple[bytes, bool]]) -> None:
    """Cover each secret with a read-only, mode-000 empty file or directory."""
    for path, is_dir in masks:
        src = _empty_node(is_dir)
        L.mount(src, NEWROOT + path, None, L.MS_BIND)
        L.mount(None, NEWROOT + path, None,
                L.MS_REMOUNT | L.MS_BIND | L.MS_RDONLY | L.MS_NOSUID | L.MS_NODEV | L.MS_NOEXEC)


def _fence_proc(path: bytes, masked: bool) -> None:
    """One of confinement.PROC_FENCES: the /proc entry bound over itself and made read-only
    with everything mounted beneath it (recursively: a bind of the host's /proc brings
    binfmt_misc along), or covered by an empty, mode-000 node. Absent on this kernel:
    nothing to fence."""
    target = NEWROOT + path
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        return
    if masked:
        source = _empty_node(stat.S_ISDIR(st.st_mode))
        L.mount(source, target, None, L.MS_BIND)
    else:
        L.mount(target, target, None, L.MS_BIND | L.MS_REC)
    L.mount_setattr(L.AT_FDCWD, target, L.AT_RECURSIVE | L.AT_SYMLINK_NOFOLLOW,
                    L.MOUNT_ATTR_RDONLY | L.MOUNT_ATTR_NOSUID | L.MOUNT_ATTR_NODEV
                    | L.MOUNT_ATTR_NOEXEC)


def _empty_node(is_dir: bool) -> bytes:
    """The new root's empty, mode-000 file or directory that masks cover a path with (made
    by the first mask that needs it)."""
    path = NEWROOT + (b"/.hcp-masked.d" if is_dir else b"/.hcp-masked")
    try:
        if is_dir:
            os.mkdir(path, 0)
        else:
            os.mknod(path, stat.S_IFREG)
    except FileExistsError:
        pass
    return path


def _write_file(path: bytes, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def _make_file(path: bytes) -> None:
    """An empty file to mount a file on, unless one is there: mknod, not open(O_CREAT), so
    an existing target in a read-only bind (/etc/resolv.conf) is EEXIST, not EROFS."""
    os.makedirs(os.path.dirname(path), 0o755, exist_ok=True)
    try:
        os.mknod(path, stat.S_IFREG | 0o644)
    except FileExistsError:
        pass


def _mount_tmpfs(path: bytes, options: bytes) -> None:
    os.makedirs(path, 0o755, exist_ok=True)
    L.mount(b"tmpfs", path, b"tmpfs", L.MS_NOSUID | L.MS_NODEV, options)


def _dev_links() -> None:
    dev = NEWROOT + b"/dev"
    os.makedirs(dev, 0o755, exist_ok=True)
    for name, dest in ((b"fd", b"/proc/self/fd"), (b"stdin", b"/proc/self/fd/0"),
                       (b"stdout", b"/proc/self/fd/1"), (b"stderr", b"/proc/self/fd/2")):
        os.symlink(dest, dev + b"/" + name)


#: The private devpts instance of ``pty = true``: only its own ptys are visible in /dev/pts.
DEVPTS_OPTIONS = b"newinstance,ptmxmode=0666,mode=0620"


def _mount_devpts() -> None:
    """A devpts instance of the sandbox's own on /dev/pts (over the caller's terminal bind,
    if any) and /dev/ptmx pointing into it, so openpty() works inside."""
    target = NEWROOT + b"/dev/pts"
    os.makedirs(target, 0o755, exist_ok=True)
    L.mount(b"devpts", target, b"devpts", L.MS_NOSUID | L.MS_NOEXEC, DEVPTS_OPTIONS)
    os.symlink(b"pts/ptmx", NEWROOT + b"/dev/ptmx")


def _mount_proc(fresh: bool) -> None:
    target = NEWROOT + b"/proc"
    if fresh:  # only pid 1 of a new pid namespace may mount a procfs of its own
        os.makedirs(target, 0o555, exist_ok=True)
        L.mount(b"proc", target, b"proc", L.MS_NOSUID | L.MS_NODEV | L.MS_NOEXEC)


def _loopback_up() -> None:
    s = _socket.socket(_socket.AF_INET, _socket.SOCK_DGRAM, 0)
    try:
        req = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s.fileno(), _SIOCGIFFLAGS, req))[1]
        fcntl.ioctl(s.fileno(), _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | _IFF_UP))
    finally:
        s.close()


def _set_lo_address(s: _socket.socket, request: int, address: str,
                    label: bytes = b"lo:hcp") -> None:
    # a label of its own: SIOCSIFADDR on "lo" itself would replace 127.0.0.1
    ifreq = struct.pack("16sH2s4s8x", label, _socket.AF_INET, b"\0\0",
                        _socket.inet_aton(address))
    fcntl.ioctl(s.fileno(), request, ifreq)


def _mask(prefix: int) -> str:
    return _socket.inet_ntoa(struct.pack("!I", (0xFFFFFFFF << (32 - prefix)) & 0xFFFFFFFF))


def _add_lo_address6(address: str, prefix: int) -> None:
    """An IPv6 address on lo (struct in6_ifreq: address, prefix length, ifindex): a local
    route for that address."""
    s = _socket.socket(_socket.AF_INET6, _socket.SOCK_DGRAM | _socket.SOCK_CLOEXEC)
    try:
        req = struct.pack("16sIi", _socket.inet_pton(_socket.AF_INET6, address), prefix,
                          _socket.if_nametoindex("lo"))
        fcntl.ioctl(s.fileno(), _SIOCSIFADDR, req)
    finally:
        s.close()


def _egress_capture(channel: int, ports: "tuple[int, ...]",
                    nets: "tuple[tuple[bytes, int], ...]" = ()) -> None:
    """Transparent egress: make the synthetic range local on lo (an address with that prefix
    on a loopback device adds a ``local`` route for the whole range, so a connect() to any
    synthetic address is accepted here, its destination kept), and so each allow-list
    network (``nets``: hcp_linux.egress.capture.capture_nets; labels lo:hcp1...), bind the
    resolver's UDP socket and a TCP listener for each capture port (on 0.0.0.0, or on ::
    taking IPv4 too when an IPv6 address is captured), and hand them all to the parent in
    one message ("C", resolver first). Every other address keeps having no route."""
    net, prefix = SYNTHETIC_NET
    socks: list[_socket.socket] = []
    detail = f"address {net}/{prefix} on lo"
    six = any(b":" in a for a, _ in nets)
    try:
        s = _socket.socket(_socket.AF_INET, _socket.SOCK_DGRAM | _socket.SOCK_CLOEXEC)
        socks.append(s)
        _set_lo_address(s, _SIOCSIFADDR, net)
        _set_lo_address(s, _SIOCSIFNETMASK, _mask(prefix))
        for i, (raw, length) in enumerate(nets, 1):
            address = raw.decode()
            detail = f"address {address}/{length} on lo"
            if ":" in address:
                _add_lo_address6(address, length)
                continue
            label = b"lo:hcp%d" % i
            _set_lo_address(s, _SIOCSIFADDR, address, label)
            _set_lo_address(s, _SIOCSIFNETMASK, _mask(length), label)
        socks.pop().close()
        detail = "resolver %s:%d" % RESOLVER_ADDRESS
        udp = _socket.socket(_socket.AF_INET, _socket.SOCK_DGRAM | _socket.SOCK_CLOEXEC)
        socks.append(udp)
        udp.bind(RESOLVER_ADDRESS)
        for port in ports:
            detail = f"listen {'[::]' if six else '0.0.0.0'}:{port}"
            tcp = _socket.socket(_socket.AF_INET6 if six else _socket.AF_INET,
                                 _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
            socks.append(tcp)
            tcp.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
            if six:
                tcp.setsockopt(_socket.IPPROTO_IPV6, _socket.IPV6_V6ONLY, 0)
            tcp.bind(("::" if six else "0.0.0.0", port))
            tcp.listen(128)
        detail = f"hand over {len(socks)} sockets"
        fds = struct.pack("%di" % len(socks), *(t.fileno() for t in socks))
        ch = _socket.socket(fileno=channel)
        try:
            ch.sendmsg([b"C"], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fds)])
        finally:
            ch.detach()  # proxy-listen still needs it
    except OSError as e:
        raise _StepFailed("egress-capture", e.errno or errno.EIO, detail) from None
    finally:
        for t in socks:
            t.close()


def _proxy_listen(channel: int) -> None:
    """Listen for the egress proxy inside this network namespace and hand the listening
    socket to the parent (SCM_RIGHTS): the proxy accepts connections from inside the sandbox
    and dials out from the host's namespace. The sandbox gets no route of its own."""
    s = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
    ch = _socket.socket(fileno=channel)
    try:
        s.bind(PROXY_ADDRESS)
        s.listen(128)
        ch.sendmsg([b"L"], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, struct.pack("i", s.fileno()))])
    finally:
        s.close()
        ch.close()


def _send_listener(channel: int, listener: int) -> None:
    """Hand the seccomp listener to the runtime (SCM_RIGHTS) and close our copies: once
    sendmsg returns, the runtime's copy is in flight and this one may go. Marked
    (protocol.HANDOVER_MARK): the filter, installed, hands every other sendmsg() to the
    listener, which no one could answer before the runtime holds it."""
    try:
        while True:
            try:  # marked: the filter hands every other sendmsg() to this very listener
                L.sendmsg_fds(channel, b"N", (listener,), HANDOVER_MARK)
                break
            except InterruptedError:
                continue
    finally:
        os.close(listener)
        os.close(channel)


def _drop_capabilities(last_cap: int, holds_setpcap: bool) -> None:
    # Lock root out of capability semantics first (needs CAP_SETPCAP, so before the drops),
    # then empty the bounding set, the ambient set, and the effective/permitted/inheritable sets.
    # A process without CAP_SETPCAP (unprivileged, no user namespace) can do neither; it holds
    # nothing, and no_new_privs already bars regaining anything through exec.
    if holds_setpcap:
        L.prctl(L.PR_SET_SECUREBITS, L.SECURE_ALL_LOCKED)
        for cap in range(last_cap + 1):
            L.prctl(L.PR_CAPBSET_DROP, cap)
    L.prctl(L.PR_CAP_AMBIENT, L.PR_CAP_AMBIENT_CLEAR_ALL)
    L.capset_empty()


def _add_late_rules(plan: "Plan", ruleset: "CreatedRuleset") -> None:
    """Rules for mounts that only exist in the child (the new root, /proc, /tmp, /dev/shm)."""
    for path, access in plan.late_rules:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        try:
            ruleset.add_path_fd(fd, access)
        finally:
            os.close(fd)


def _verify(plan: "Plan") -> None:
    """Prove the confinement is in force before exec; refuse otherwise."""
    if plan.canary is not None:
        try:
            os.close(os.open(plan.canary, os.O_RDONLY | os.O_CLOEXEC))
        except PermissionError:
            pass  # EACCES: Landlock denied an access the mount view allows. Good.
        else:
            raise _StepFailed("verify", errno.EPERM,
                              DETAILS["CANARY_READABLE"].format(plan.canary))
    with open("/proc/self/status", "rb") as f:
        status = f.read()
    expect = list(STATUS_ALWAYS)
    if plan.holds_setpcap:
        expect.append(STATUS_SETPCAP)
    if plan.seccomp is not None:
        expect.append(STATUS_SECCOMP)
    for line in expect:
        if line not in status:
            raise _StepFailed("verify", errno.EPERM, status_lacks(line))
