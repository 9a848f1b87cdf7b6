"""One sandbox of an agent framework (an Inspect sample, an Agents SDK session): a jail
directory plus a :class:`~hcp_linux.Policy`, with a :class:`~hcp_linux.session.Session` in it.

Frameworks ask the same four things of a sandbox: run a command (with stdin, env, cwd, a
timeout that kills the whole tree, bounded output), read a file, write a file, go away. A box
answers them the same way for every adapter:

- **Commands** run in the box's session (started at the first command, ~50 ms here; each
  command then costs a fork and an exec in the lasting confinement, docs/session.md says
  what commands of one session share). Where no session can start (no ``/usr/bin/python3``
  in the view, no Landlock), each command is a confinement of its own and :attr:`Box.exec`
  says why. A session killed by a command is replaced at the next command.
- **Files** are read and written *by a command in the box*, a small stdlib helper run by the
  sandbox's own ``python3``, never by this process: the path is resolved in the sandbox's
  own mount view with the sandbox's own credentials (no capability, Landlock, the read-only
  system roots), so a symlink the agent planted leads only where the agent itself can go,
  and a file it made unreadable (``chmod -r``) is unreadable to the framework too, even when
  the runtime is root on the host. Relative paths are relative to the jail; ``/tmp`` is the
  sandbox's private one. The helper is ours, not the agent's: the allow-list is not asked
  about it (``Session.run(ours=True)``), every layer still confines it.
- **Going away**: :meth:`Box.close` ends the session (everything in it is killed) and
  removes the jail when the box made it. Jails are named for their owner
  (hcp_linux.jails.reclaim), so what a killed runtime left is swept by the next box made in
  the same directory and by ``hcp-linux gc``.
"""
from __future__ import annotations

import dataclasses
import os
import re
import tempfile
import threading
from dataclasses import dataclass
from typing import Mapping, Sequence

from ..errors import PolicyError, SandboxError
from ..plan.plan import working_dir as plan_working_dir
from ..run import popen
from ..jails.locations import make_jail_home
from ..jails.reclaim import jail_name
from ..jails.workspace import remove_tree, sweep_jails
from ..policy.policy import Policy
from ..sandbox import Sandbox
from ..session import PYTHON, Session, SessionEnded

__all__ = ["Box", "BoxResult", "FileTooLargeError", "FILE_HELPER"]

#: The file helper: run inside the box by the sandbox's own interpreter (``python3 -I -S``,
#: stdlib only). ``read PATH MODE LIMIT``: the regular file's bytes on stdout, or exit 4 with
#: its size when it is larger than LIMIT (never read a FIFO or a device: it could block or
#: never end). ``write PATH MODE``: stdin into PATH, parents made. MODE ``follow`` resolves
#: PATH as open(2) does (in the sandbox's view); ``nofollow`` walks it one component at a
#: time with O_NOFOLLOW and refuses a symlink anywhere (ELOOP), for callers that resolved the
#: path already and must not be sent elsewhere by a link swapped in since. Any OSError:
#: exit 3, "errno N" on stderr, so the runtime raises the same OSError subclass
#: (FileNotFoundError, PermissionError, IsADirectoryError...) with the caller's path in it.
FILE_HELPER = r'''
import errno, os, stat, sys
DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
def walk(path, create):
    """(the fd of the directory holding path's last name, that name), one component at a
    time with O_NOFOLLOW: no symlink is followed anywhere on the way."""
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        raise OSError(errno.EINVAL, "")
    fd = os.open("/" if path.startswith("/") else ".", DIR)
    for name in parts[:-1]:
        try:
            nfd = os.open(name, DIR, dir_fd=fd)
        except FileNotFoundError:
            if not create:
                raise
            try:
                os.mkdir(name, 0o777, dir_fd=fd)
            except FileExistsError:
                pass
            nfd = os.open(name, DIR, dir_fd=fd)
        os.close(fd)
        fd = nfd
    return fd, parts[-1]
def opener(path, flags, create, nofollow):
    if not nofollow:
        if create and os.path.dirname(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
        return os.open(path, flags, 0o644)
    dfd, name = walk(path, create)
    try:
        return os.open(name, flags | os.O_NOFOLLOW, 0o644, dir_fd=dfd)
    finally:
        os.close(dfd)
def copy(src, dst):
    while True:
        chunk = os.read(src, 1 << 20)
        if not chunk:
            return
        view = memoryview(chunk)
        while view:
            view = view[os.write(dst, view):]
def main(op, path, nofollow, *rest):
    nofollow = nofollow == "nofollow"
    try:
        if op == "read":
            fd = opener(path, os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK | os.O_CLOEXEC, False,
                        nofollow)
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                raise IsADirectoryError(21, "")
            if not stat.S_ISREG(st.st_mode):
                raise OSError(22, "")
            if st.st_size > int(rest[0]):
                sys.stderr.write("size %d\n" % st.st_size)
                return 4
            os.set_blocking(fd, True)
            copy(fd, 1)
        else:
            fd = opener(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOCTTY
                        | os.O_NONBLOCK | os.O_CLOEXEC, True, nofollow)
            os.set_blocking(fd, True)
            copy(0, fd)
            os.close(fd)
    except OSError as e:
        sys.stderr.write("errno %d\n" % (e.errno or 5))
        return 3
    return 0
sys.exit(main(*sys.argv[1:]))
'''
_HELPER_ARGV = [PYTHON, "-I", "-S", "-X", "utf8", "-c", FILE_HELPER]
_ERRNO = re.compile(rb"errno (\d+)\n\Z")
_SIZE = re.compile(rb"size (\d+)\n\Z")

#: Bytes of argv and environment above which a command runs in a confinement of its own
#: instead of the session: one control message carries them, and a SOCK_SEQPACKET message
#: must fit the socket's send buffer (~208 KiB by default; Inspect's own checks send 1 MiB
#: of argv). Such a command does not see the session's private /tmp.
MAX_SESSION_COMMAND = 128 * 1024

#: What :attr:`Box.exec` says of how commands run.
IN_SESSION = "session"
PER_COMMAND = "per-command"


class FileTooLargeError(SandboxError):
    """:meth:`Box.read`: the file is larger than the caller's limit (nothing was read)."""

    def __init__(self, path: str, size: int, limit: int) -> None:
        super().__init__(f"{path}: {size} bytes, more than the limit of {limit}")
        self.path, self.size, self.limit = path, size, limit


@dataclass
class BoxResult:
    """A command's end. ``returncode``: its exit status, or 128 + N when signal N killed it
    (as a shell, and a container's exec, report it); ``truncated``: a stream was cut at
    ``output_cap``."""

    returncode: int
    stdout: bytes
    stderr: bytes
    timed_out: bool = False
    truncated: bool = False


class Box:
    """A jail and a policy; commands and file operations confined by it. Thread-safe.

    ``policy``: the confinement (its ``jail`` is replaced by the box's). ``jail``: a directory
    to use as is (kept at close); default a fresh 0700 directory under ``jail_root`` (default
    the temp dir), removed at close. ``session=False``: a confinement per command.
    """

    def __init__(self, policy: Policy | None = None, *, jail: str | None = None,
                 jail_root: str | None = None, executor: str | None = None,
                 session: bool = True) -> None:
        policy = policy if policy is not None else Policy()
        self.owned = jail is None
        if jail is None:
            root = jail_root or tempfile.gettempdir()
            _sweep_once(root)
            jail = os.path.join(make_jail_home(root), jail_name("box"))
            os.mkdir(jail, 0o700)
        self.jail = jail
        try:
            self.policy = dataclasses.replace(policy, jail=jail)
            self.sandbox = Sandbox(self.policy, executor=executor)
            self._ours = Sandbox(dataclasses.replace(self.policy, allow_bins=()),
                                 executor=executor)
        except BaseException:
            self._remove()
            raise
        self._use_session = session
        self._session: Session | None = None
        self._capped: dict[tuple[bool, int], Sandbox] = {}  # see _per_command
        self._lock = threading.Lock()  # guards _session, closed
        self.closed = False
        #: how commands run: IN_SESSION, or PER_COMMAND with the reason
        self.exec = IN_SESSION if session else f"{PER_COMMAND} (asked)"
        #: sessions started after the first ended (a command killed its zygote)
        self.restarts = 0

    # --- commands ----------------------------------------------------------------------------

    def warm(self) -> None:
        """Start the box's session now, in a thread of its own, so that its start (~50 ms)
        overlaps what the framework does before the first command (a model call, at least)
        instead of delaying that command. A command that comes first waits for it."""
        threading.Thread(target=self._warm, name="hcp-box-warm", daemon=True).start()

    def _warm(self) -> None:
        try:
            self._current()
        except Exception:  # closed meanwhile, or the session cannot start: the first
            pass           # command meets (and reports) the same

    def _current(self) -> Session | None:
        """The box's session, started (or restarted) now if needed; None: per command."""
        with self._lock:
            if self.closed:
                raise SandboxError("the sandbox was closed")
            if not self._use_session:
                return None
            if self._session is not None and self._session.alive:
                return self._session
            try:
                fresh = Session(self.sandbox)
            except (SandboxError, OSError) as e:  # no python3 in the view, no Landlock...
                if self._session is not None:
                    raise
                self._use_session = False
                self.exec = f"{PER_COMMAND} (no session: {e})"
                return None
            if self._session is not None:
                self.restarts += 1
            self._session = fresh
            return fresh

    def run(self, argv: Sequence[str], *, input: bytes | None = None,
            env: Mapping[str, str] | None = None, cwd: str | None = None,
            timeout: float | None = None, output_cap: int | None = None,
            ours: bool = False) -> BoxResult:
        """Run ``argv`` confined (``cwd`` relative to the jail, ``env`` granted over the
        policy's, ``input`` on stdin). ``timeout`` (default the policy's) kills the command
        and everything it started; the result says ``timed_out``. At most ``output_cap``
        bytes of each stream are kept (default the policy's output limit). Raises what
        :meth:`Sandbox.run` raises for a refused command (NotAllowlistedError,
        BinNotFoundError, BinNotExecutableError, PolicyError)."""
        if cwd is not None and not _in_host_view(self.policy, cwd):
            argv, cwd, ours = self._cd_inside(argv, env, cwd, ours), None, True
        session = self._current()
        if session is not None and _size(argv, env) > MAX_SESSION_COMMAND:
            session = None  # too large for the session's control message: a run of its own
        if session is not None:
            try:
                r = session.run(argv, env=env, cwd=cwd, timeout=timeout, output_cap=output_cap,
                                input=input, ours=ours)
            except SessionEnded:
                if self.closed:
                    raise SandboxError("the sandbox was closed while the command ran") from None
                raise
            return BoxResult(_status(r.returncode), r.stdout, r.stderr, r.timed_out,
                             r.truncated)
        c = self._per_command(ours, output_cap).run(
            list(argv), input=input, capture_output=True, env=env, cwd=cwd, timeout=timeout)
        return BoxResult(_status(c.returncode), c.stdout or b"", c.stderr or b"", c.timed_out,
                         bool(c.truncated))

    def _per_command(self, ours: bool, cap: int | None) -> Sandbox:
        """The Sandbox that runs a command in a confinement of its own: the box's, or its
        helper's (no allow-list), with ``cap`` as the output limit (Sandbox.run keeps
        ``limits.output`` bytes of each stream)."""
        box = self._ours if ours else self.sandbox
        if cap is None or cap == box.policy.limits.output:
            return box
        with self._lock:
            made = self._capped.get((ours, cap))
            if made is None:
                limits = dataclasses.replace(box.policy.limits, output=cap)
                made = self._capped[(ours, cap)] = Sandbox(
                    dataclasses.replace(box.policy, limits=limits), executor=box.executor)
            return made

    def _cd_inside(self, argv: Sequence[str], env: Mapping[str, str] | None, cwd: str,
                   ours: bool) -> list[str]:
        """``argv`` run from ``cwd``, a directory only the sandbox sees (its private /tmp):
        the plan checks a working directory on the host, so a shell in the box changes to it
        and execs the program the allow-list resolved (by its path: argv[0] becomes it)."""
        exe = argv[0]
        if not ours:
            attempts = self.sandbox.attempts(list(argv), env=popen.granted_env(env))
            try:
                plan, _ = next(attempts)  # raises what the allow-list and env checks raise
                exe = os.fsdecode(plan.exe)
            finally:
                attempts.close()
        return ["/bin/sh", "-c", 'cd -- "$1" || exit 1; shift; exec "$@"', "sh", cwd, exe,
                *argv[1:]]

    # --- files -------------------------------------------------------------------------------

    def _file(self, op: str, path: str, follow: bool, *args: str, data: bytes | None = None,
              cap: int | None = None) -> BoxResult:
        if not isinstance(path, str) or not path or "\0" in path:
            raise ValueError(f"path {path!r}: expected a non-empty path")
        return self.run([*_HELPER_ARGV, op, path, "follow" if follow else "nofollow", *args],
                        input=data, output_cap=cap, ours=True, env={})

    def read(self, path: str, limit: int, *, follow: bool = True) -> bytes:
        """The bytes of the regular file at ``path`` as the sandbox sees it (relative: in the
        jail), read by a command in the box. Raises the OSError the read raised in there
        (FileNotFoundError, PermissionError, IsADirectoryError...), :class:`FileTooLargeError`
        past ``limit`` bytes. ``follow=False``: a symlink anywhere on the path is refused
        (ELOOP) instead of followed (in the view)."""
        r = self._file("read", path, follow, str(limit), cap=limit + 1)
        self._check(r, path)
        m = _SIZE.match(r.stderr)
        if r.returncode == 4 and m:
            raise FileTooLargeError(path, int(m.group(1)), limit)
        if len(r.stdout) > limit:  # grew while it was read
            raise FileTooLargeError(path, len(r.stdout), limit)
        return r.stdout

    def write(self, path: str, data: bytes, *, follow: bool = True) -> None:
        """Write ``data`` to ``path`` as the sandbox sees it (parents made), by a command in
        the box; raises the OSError the write raised in there. ``follow``: as for
        :meth:`read`."""
        self._check(self._file("write", path, follow, data=bytes(data)), path)

    @staticmethod
    def _check(r: BoxResult, path: str) -> None:
        if r.timed_out:
            raise TimeoutError(f"{path}: the file operation timed out")
        m = _ERRNO.match(r.stderr)
        if r.returncode == 3 and m:
            n = int(m.group(1))
            raise OSError(n, os.strerror(n), path)
        if r.returncode not in (0, 4):
            raise SandboxError(f"{path}: the file helper failed (status {r.returncode}): "
                               f"{r.stderr[-300:].decode('utf-8', 'replace')}")

    # --- the end -----------------------------------------------------------------------------

    def close(self) -> None:
        """End the session (every process in it is killed) and remove the jail if the box
        made it. Idempotent."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            session, self._session = self._session, None
        if session is not None:
            session.close()
        self._remove()

    def _remove(self) -> None:
        if self.owned:
            remove_tree(self.jail)

    def __enter__(self) -> "Box":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _in_host_view(policy: Policy, cwd: str) -> bool:
    """Whether the plan can take ``cwd`` itself: a directory the view holds at its host path."""
    try:
        plan_working_dir(policy, cwd)
    except PolicyError:
        return False
    return True


_swept: set[str] = set()
_swept_lock = threading.Lock()


def _sweep_once(root: str) -> None:
    """Remove, once per process and directory, the box jails whose runtime is gone (killed
    outright: no cleanup ran); not at every box, which would scan the temp dir per sample."""
    with _swept_lock:
        if root in _swept:
            return
        _swept.add(root)
    sweep_jails(root)


def _size(argv: Sequence[str], env: Mapping[str, str] | None) -> int:
    n = sum(len(a) + 8 for a in argv)
    return n + sum(len(k) + len(v) + 8 for k, v in (env or {}).items())


def _status(code: int) -> int:
    """An exit status as a shell reports it: 128 + N for a death by signal N."""
    return 128 - code if code < 0 else code

