"""The ctypes executor's child side in a process of its own: a fresh, single-threaded Python.

Why: the child side (:mod:`hcp_linux.ctypes_executor.child`) is Python. Run in a ``fork()`` of the runtime,
it runs in a copy of a possibly multi-threaded interpreter in which only the forking thread
survives: a lock another thread held at the fork (a module's import lock, an I/O buffer's
lock, one inside a C extension or libc) stays held for good, the hazard CPython documents
for ``preexec_fn`` (and warns about from 3.12). So, when the runtime has another thread
(counted in ``/proc/self/task``: C threads count as much as Python ones), the runtime does
not fork: it starts ``sys.executable -I -S -c BOOT`` with ``posix_spawn`` (vfork + exec:
nothing runs between the two), from the lasting thread (:mod:`hcp_linux.proc.spawner`), so the
helper is the runtime's direct child exactly as a forked monitor or hcp-exec is. The helper
imports only :mod:`hcp_linux.ctypes_executor.child` and :mod:`hcp_linux._libc` (no site, no typing, no
Landlock or seccomp package), reads the run from a memfd and becomes the run's monitor:
Monitor, pidfds, the error pipe, the done pipe, kill() and the setup timeout see the same
process shape as before.

What crosses: exactly what the child side reads of the Plan (bytes, ints, tuples, through
``marshal``: no code, no class), the Landlock ruleset the *parent* created (its fd, with the
rights it handles: the parent's inode checks of each granted path stand), the compiled
seccomp program, and the run's fds, inherited by number (posix_spawn's dup2 onto itself
clears close-on-exec; the helper sets it again at once). The mount view's binds carry the
(dev, ino) the parent checked; the helper compares them to what it clones, as the fork did.

A single-threaded runtime still forks (:data:`FORK_WHEN_ALONE`): with no other thread there
is nothing a lock could be held by, the count is exact (only the counting thread could start
another), and the fork is cheaper. Measured (bench/ctypes_helper.py, median per /bin/true
run, default policy, 2-CPU VM, Python 3.11): fork 13.5 ms, helper 19.9 ms in-process;
`hcp-linux run` 87 vs 91 ms. The helper's extra is the interpreter's start without site
(7.5 ms; 19 ms with it) and child.py's imports (~3 ms). An API runtime has a thread more
(the reaper) from its second run on, so the fork is the CLI's and a first run's; the helper,
the API's. docs/executors.md has the table.

A helper that cannot start (``sys.executable`` empty, missing, not executable; ENOMEM) fails
the run closed as :class:`ChildSetupError` with step ``helper``; so does an interpreter that
exits before its first line (it writes one byte on a start pipe first: EOF on the error pipe
alone would read as an exec); one that runs but cannot import this package or read its run
reports step ``helper`` on the error pipe.
"""
from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing in the helper (~3 ms)
if TYPE_CHECKING:
    from typing import Any, NoReturn

    from hcp_linux.landlock import CreatedRuleset

    from ..plan.plan import Plan
    from ..protocol import RunFds

#: Fork the runtime when it has no other thread (cheaper); else start the helper.
FORK_WHEN_ALONE = True

#: The helper's program: say it runs (one byte on the start pipe), put this package's
#: directory first on sys.path (no site: its start-up costs ~12 ms, and the package is found
#: without it), run main(); an import that fails still answers on the error pipe, as step
#: "helper", so it never reads as an exec.
_BOOT = ("import os,sys\n"
         "try:\n"
         " a=int(sys.argv[4]);os.write(a,b'+');os.close(a)\n"
         "except OSError:\n"
         " os._exit(125)\n"  # the runtime is gone (EPIPE): nothing to say, nobody to say it to
         "try:\n"
         " sys.path.insert(0,sys.argv[1]);from hcp_linux.ctypes_executor.child_main import main\n"
         "except BaseException as e:\n"
         " os.write(int(sys.argv[2]),%r+repr(e).encode()[:512]);os._exit(125)\n"
         "main(sys.argv[2:])\n")
#: Where the hcp_linux package lives: the helper imports the runtime's own copy.
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: Marks the helper's command line (tests and ps find it by this).
MARKER = "hcp-linux-child"


def threads() -> int:
    """This process's threads, as the kernel counts them (C threads included); 0 if /proc
    cannot tell (then no fork: the caller must assume others)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0


def start(plan: "Plan", fds: "RunFds", ruleset: "CreatedRuleset | None",
          close_in_child: int) -> int:
    """Start the child side of one run, with its channels ``fds``; its pid (the run's
    monitor, our child). Call it on the lasting thread
    (:func:`hcp_linux.proc.spawner.on_lasting_thread`). ``close_in_child``: the error pipe's
    read end, which a forked child closes."""
    if FORK_WHEN_ALONE and threads() == 1:
        from . import child
        pid = os.fork()
        if pid == 0:
            os.close(close_in_child)
            child.run(plan, fds, ruleset)
        return pid
    return spawn_helper(plan, fds, ruleset)


def spawn_helper(plan: "Plan", fds: "RunFds", ruleset: "CreatedRuleset | None") -> int:
    """posix_spawn the helper with the run; its pid. ChildSetupError (step ``helper``) when
    it cannot be started."""
    import errno
    import marshal

    from ..errors import ChildSetupError
    from ..proc.hcp_spawn import memfd
    from ..protocol import encode_error_record

    exe = sys.executable
    if not exe:
        raise ChildSetupError("helper", errno.ENOENT, "sys.executable is empty")
    blob = marshal.dumps(message(plan, fds, ruleset))
    fd = memfd(blob)
    started_r, started_w = os.pipe2(os.O_CLOEXEC)
    try:
        keep = {fd, started_w, *fds.all(), -1 if ruleset is None else ruleset.fd}
        actions = [(os.POSIX_SPAWN_DUP2, k, k) for k in sorted(keep) if k > 2]
        head = encode_error_record("helper", errno.EIO, "")  # the detail follows in _BOOT
        argv = [exe, "-I", "-S", "-c", _BOOT % head, _ROOT, str(fds.err), str(fd),
                str(started_w), MARKER]
        try:
            pid = os.posix_spawn(exe, argv, os.environ, file_actions=actions)
        except OSError as e:
            raise ChildSetupError("helper", e.errno or errno.EIO, exe) from None
        os.close(started_w)
        started_w = -1
        _started(pid, started_r, exe)
        return pid
    finally:
        for end in (fd, started_r, started_w):
            if end >= 0:
                os.close(end)


def _started(pid: int, started_r: int, exe: str) -> None:
    """Wait until the helper runs our first line: an interpreter that dies in its own
    start-up (no memory, a broken install, a sys.executable that is no Python) must not
    read as an exec (EOF on the error pipe). Bounded by SETUP_TIMEOUT; killed and reaped
    if it does not say it runs, or on an interrupt (^C) meanwhile."""
    import errno
    import signal

    from ..proc import teardown
    from ..errors import ChildSetupError, SetupTimeoutError
    try:
        if not teardown.readable(started_r, teardown.SETUP_TIMEOUT):
            raise SetupTimeoutError(teardown.SETUP_TIMEOUT)
        if os.read(started_r, 1) == b"+":
            return
        raise ChildSetupError("helper", errno.EIO, f"{exe} exited before it ran the helper")
    except BaseException:
        os.kill(pid, signal.SIGKILL)  # our child, not yet reaped: the pid is still its own
        os.waitpid(pid, 0)
        raise


def message(plan: "Plan", fds: "RunFds", ruleset: "CreatedRuleset | None") -> dict[str, Any]:
    """What the helper needs of the run, as marshal-able values: the Plan's fields that
    :mod:`hcp_linux.ctypes_executor.child` reads, and the fds."""
    import errno

    from ..errors import ChildSetupError
    rules: tuple = ()
    if ruleset is not None:
        import hcp_linux.landlock as landlock
        requested, handled = int(ruleset.requested_fs), int(ruleset.handled_fs)
        for path, access in plan.late_rules:
            if not access or access & ~requested:  # what CreatedRuleset.add_path_fd refuses
                raise ChildSetupError("internal", errno.EINVAL,
                                      f"late rule {path!r}: rights not in handled_fs")
        rules = (ruleset.fd, handled, int(landlock.DIR_ONLY_RIGHTS))
    seccomp: tuple = ()
    if plan.seccomp is not None:
        from hcp_linux.seccomp_profiles import native_machine
        from hcp_linux.seccomp_profiles.loader import SECCOMP_SET_MODE_FILTER
        machine = native_machine()
        if machine is None:
            raise ChildSetupError("seccomp", errno.ENOSYS, os.uname().machine)
        seccomp = (plan.seccomp.bpf, machine.seccomp_nr, SECCOMP_SET_MODE_FILTER)
    from ..proc.peer import status_fields
    return {
        "fds": fds.fields(),  # the error pipe's number, too, is on the helper's command line
        "ignored": int(status_fields("self", "SigIgn")["SigIgn"], 16),
        "ruleset": rules,
        "seccomp": seccomp,
        "binds": tuple((b.source, b.target, b.is_dir, b.dev, b.ino, b.attrs)
                       for b in plan.binds),
        "layers": frozenset(plan.layers), "parent_pid": plan.parent_pid,
        "uid": plan.uid, "gid": plan.gid, "cap_last_cap": plan.cap_last_cap,
        "holds_setpcap": plan.holds_setpcap, "confined": plan.confined,
        "exe": plan.exe, "argv": tuple(plan.argv), "env": dict(plan.env), "cwd": plan.cwd,
        "symlinks": tuple(plan.symlinks), "masks": tuple(plan.masks),
        "watch": tuple(plan.watch),
        "proc_fences": tuple(plan.proc_fences),
        "rlimits": tuple(plan.rlimits), "tmp_options": plan.tmp_options,
        "shm_options": plan.shm_options, "wait_for_tree": plan.wait_for_tree,
        "pid_max": plan.pid_max, "proxy": plan.proxy,
        "capture_ports": tuple(plan.capture_ports),
        "capture_nets": tuple(plan.capture_nets), "proc_fresh": plan.proc_fresh,
        "pty": plan.pty, "late_rules": tuple(plan.late_rules), "canary": plan.canary,
        "seccomp_listener": plan.seccomp_listener, "landlock_restrict": plan.landlock_restrict,
    }


# --- in the helper ---------------------------------------------------------------------------

class _Bind:
    __slots__ = ("source", "target", "is_dir", "dev", "ino", "attrs")

    def __init__(self, source: bytes, target: bytes, is_dir: bool, dev: int, ino: int,
                 attrs: int) -> None:
        self.source, self.target, self.is_dir = source, target, is_dir
        self.dev, self.ino, self.attrs = dev, ino, attrs


class _Plan:
    """The Plan as the child side reads it (attributes of the same names)."""

    def __init__(self, fields: dict[str, Any]) -> None:
        self.__dict__.update(fields)
        self.binds = [_Bind(*b) for b in fields["binds"]]
        self.argv = list(fields["argv"])


class _Ruleset:
    """The parent's Landlock ruleset, by its inherited fd: the two calls the child side
    makes (rules for the mounts only the child has, then restrict_self), with the masking
    of CreatedRuleset.add_path_fd (handled rights; dir-only rights off a non-directory).
    The parent checked each late rule's rights against the requested ones."""

    def __init__(self, fd: int, handled: int, dir_only: int) -> None:
        self.fd, self.handled, self.dir_only = fd, handled, dir_only

    def add_path_fd(self, fd: int, access: int) -> None:
        import stat
        import struct
        effective = int(access) & self.handled
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            effective &= ~self.dir_only
        if effective:  # struct landlock_path_beneath_attr is packed: u64, s32
            attr = struct.pack("<Qi", effective, fd)
            _call(_NR_LANDLOCK_ADD_RULE, self.fd, _LANDLOCK_RULE_PATH_BENEATH, attr, 0)

    def restrict_self(self, flags: int = 0) -> None:
        _call(_NR_LANDLOCK_RESTRICT_SELF, self.fd, flags)


class _Filter:
    """The compiled seccomp program, installed with one seccomp(2) call."""

    def __init__(self, bpf: bytes, nr: int, op: int) -> None:
        import ctypes
        self.nr, self.op = nr, op
        self._buf = ctypes.create_string_buffer(bpf, len(bpf))

        class SockFprog(ctypes.Structure):
            _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
        self._prog = SockFprog(len(bpf) // 8, ctypes.addressof(self._buf))

    def install(self, flags: int = 0) -> int:
        import ctypes
        return _call(self.nr, self.op, flags, ctypes.addressof(self._prog))


def _ignore_as(runtime: int) -> None:
    """Ignore what the runtime ignores (bit n-1: signal n), as a fork would, and nothing
    more: posix_spawn made glibc's internal signals 32 and 33 ignored (the runtime had
    handlers for them), or left one at its default while the runtime ignores it (a runtime
    started by make ignores both), and ignored stays ignored across the command's execve.
    The raw syscall: glibc's sigaction() refuses 32 and 33. A zeroed kernel sigaction is
    SIG_DFL; one whose handler is 1, SIG_IGN."""
    import ctypes
    with open("/proc/self/status", "rb") as f:
        status = f.read()
    ours = int(status.split(b"\nSigIgn:")[1].split()[0], 16)
    nr = 13 if os.uname().machine == "x86_64" else 134  # as _libc: x86_64, else asm-generic
    default = (ctypes.c_ulong * 4)()
    ignore = (ctypes.c_ulong * 4)(1)
    for sig in range(1, 65):
        if sig in (9, 19):  # SIGKILL, SIGSTOP: never ignored
            continue
        mine, theirs = ours >> (sig - 1) & 1, runtime >> (sig - 1) & 1
        if mine != theirs:
            _call(nr, sig, ctypes.addressof(ignore if theirs else default), 0, 8)


_NR_LANDLOCK_ADD_RULE, _NR_LANDLOCK_RESTRICT_SELF = 445, 446  # one number on every arch
_LANDLOCK_RULE_PATH_BENEATH = 1


def _call(nr: int, *args: "int | bytes") -> int:
    import ctypes

    from .._libc import _syscall  # restype c_long
    cargs = [a if isinstance(a, bytes) else ctypes.c_long(a) for a in args]
    ret = _syscall(ctypes.c_long(nr), *cargs)
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return int(ret)


def main(args: list[str]) -> "NoReturn":
    """The helper: ``ERR_FD PLAN_FD STARTED_FD MARKER``. Becomes the run's monitor."""
    import errno
    import marshal

    from ..protocol import RunFds
    from . import child
    err = int(args[0])
    try:
        fd = int(args[1])
        parts: list[bytes] = []
        while chunk := os.pread(fd, 1 << 20, sum(len(p) for p in parts)):
            parts.append(chunk)
        os.close(fd)
        fields = marshal.loads(b"".join(parts))
        fds = RunFds(*fields.pop("fds"))
        # Inherited by number, so not close-on-exec here: make them so at once (0-2 aside:
        # those are ours, the runtime's, as for hcp-exec).
        for inherited in (*fds.all(), *fields["ruleset"][:1]):
            if inherited > 2:
                os.set_inheritable(inherited, False)
        _ignore_as(fields.pop("ignored"))
        ruleset = _Ruleset(*fields["ruleset"]) if fields["ruleset"] else None
        fields["seccomp"] = _Filter(*fields["seccomp"]) if fields["seccomp"] else None
        plan = _Plan(fields)
    except BaseException as e:  # noqa: BLE001 - a malformed run fails closed, named
        child._report(err, "helper", getattr(e, "errno", None) or errno.EIO,
                     f"{type(e).__name__}: {e}")
    child.run(plan, fds, ruleset)  # type: ignore[arg-type]
