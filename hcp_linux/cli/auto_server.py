"""``HCP_LINUX_SERVER=auto``: the user's own `hcp-linux serve`, started by a run, ended when idle.

A served run costs ~1.3x ``python -c pass``, an in-process one ~3.6x (docs/performance.md), but
``HCP_LINUX_SERVER=PATH`` needs a server somebody started. With ``auto``, a run looks for the
user's server at one fixed socket (:func:`socket_path`); when there is none there, it runs
in-process as ever and, once it is over, starts one (``hcp-linux serve --auto``) for the runs
after it. That server serves exactly as ``serve --socket`` does (hcp_linux.cli.serve: the same
peer checks both ways, the same fallbacks) and exits after :data:`IDLE_EXIT` seconds without a
request, or when its code changes under it.

The directory is the user's alone: ``$XDG_RUNTIME_DIR/hcp-linux`` (an XDG_RUNTIME_DIR of the
user's, else ``$TMPDIR/hcp-linux-UID`` or ``/tmp/hcp-linux-UID``: hcp_linux.runtime_files), a
directory (not a link) owned by the user that no one else may enter. One that is not (another user made it first, its mode lets others in)
is not used: a line says why and the run goes on in-process; nothing is made or started.
It is one of the runtime's files (hcp_linux.runtime_files): no run's writable root reaches it.

Imported on the start-up path of every ``auto`` run: only os.
"""
from __future__ import annotations

import os

from ..runtime_files import server_directory as directory

#: The value of HCP_LINUX_SERVER that asks for the user's own server.
AUTO = "auto"
#: A server started by a run exits after this long without a request (seconds).
IDLE_EXIT = 300.0
#: How long a client waits for the user's server (connect, each reply) before it runs
#: in-process; a server that does not answer in time is no longer named (see forget).
TIMEOUT = 5.0
#: How long :func:`forget` waits for a starting server's lock (seconds).
FORGET_WAIT = 1.0


def install_name() -> str:
    """This installation's name among the user's servers: each Python environment with
    hcp-linux in it (another virtual environment, another version) has a server of its own,
    so a run is never planned by other code than its own, and one environment has one
    whichever name its interpreter was started by (python, python3). A checksum of where
    the package and the environment are, not a secret (the server is trusted by the
    kernel's word on its peer, hcp_linux.proc.peer, not by its name)."""
    from binascii import crc32

    import sys

    from ..runtime_files import PACKAGE_DIR
    return "%08x" % crc32(os.fsencode(PACKAGE_DIR + "\0" + sys.prefix))


def socket_path() -> str:
    return os.path.join(directory(), f"serve-{install_name()}.sock")


def lock_path() -> str:
    """Held by a server from before it looks at the socket until it listens: two runs that
    both found no server start two, and the second finds the first's lock or its socket,
    and exits."""
    return os.path.join(directory(), f"serve-{install_name()}.lock")


def name_client(key: str) -> None:
    """Leave ``client-KEY``, a link to this environment's socket's name, in the directory:
    the native client (hcp_linux/native/hcp_client.c) cannot compute :func:`install_name`
    (it knows neither this package's directory nor ``sys.prefix``), so the Python command it
    falls back to tells it, under the key it passed (a checksum of its own path and of what
    chooses the Python code it runs). Best effort: until the link is there, the client's
    ``auto`` runs fall back to this program, which serves them all the same. The directory is
    made as the server makes it; one that is not the user's alone gets nothing."""
    if len(key) != 8 or key.strip("0123456789abcdef"):
        return
    from ..runtime_files import make_private_directory
    target = os.path.basename(socket_path())
    link = os.path.join(directory(), f"client-{key}")
    try:
        if os.readlink(link) == target:
            return
    except OSError:
        pass
    try:
        make_private_directory(directory())
        tmp = f"{link}.{os.getpid()}"
        os.symlink(target, tmp)
        os.replace(tmp, link)
    except (OSError, ValueError):
        pass


def forget(path: str, identity: tuple[int, int]) -> None:
    """Unlink the socket of a server that accepted but did not answer (stopped, starved):
    later runs then find no server and start a fresh one, instead of each waiting
    :data:`TIMEOUT` for it. Only the socket that was connected to (``identity``: device,
    inode), never one bound there since: the look and the unlink are made under the lock a
    starting server holds until it listens (:func:`lock_path`), so none can bind between
    them. A lock held past :data:`FORGET_WAIT` (a server starting, itself starved) leaves the
    socket: the next run that waits for it tries again."""
    import fcntl
    import time
    try:
        fd = os.open(lock_path(), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError:
        return
    try:
        deadline = time.monotonic() + FORGET_WAIT
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    return
                time.sleep(0.01)
        st = os.lstat(path)
        if (st.st_dev, st.st_ino) == identity:
            os.unlink(path)
    except OSError:
        pass
    finally:
        os.close(fd)  # the lock with it


def full(path: str) -> bool:
    """Whether a server could not make its directory ``path``, its lock and its socket
    for want of room: no inode left for this user where they go, or ``path`` missing and
    no block left to make it in (a directory takes one on a disk; on a tmpfs it does not,
    and the server is then not started until there is room: the runs stay in-process).
    A file system that counts no inodes (btrfs: ``f_files`` 0) has them."""
    for where, missing in ((path, False), (os.path.dirname(path), True)):
        try:
            st = os.statvfs(where)
        except FileNotFoundError:
            continue
        except OSError:
            return False  # not ours to judge: the server says what is wrong, or starts
        root = os.geteuid() == 0  # root may use the blocks kept back for it (ext4's 5%)
        blocks, inodes = (st.f_bfree, st.f_ffree) if root else (st.f_bavail, st.f_favail)
        return (st.f_files > 0 and inodes == 0) or (missing and blocks == 0)
    return False


def start() -> None:
    """Start ``hcp-linux serve --auto`` for the runs after this one, detached: a session of
    its own (a terminal's ^C or hang-up is not for it), cwd ``/``, stdio on /dev/null and no
    other fd of ours (a pipe the caller waits on must not stay open in it), this Python and
    this environment. It descends from this process, so it has this process's confinement,
    namespaces and cgroup, which are what its clients must share. Whether it comes up is not
    this run's business: a server that cannot start leaves the next run in-process."""
    import subprocess
    import sys
    if not os.path.isdir(os.path.dirname(directory())):
        return  # TMPDIR names nothing: a server could not make its directory
    if full(directory()):
        return  # it could not make its socket: every run would start one that fails
    try:
        # PYTHONSAFEPATH (3.11+): no cwd on its sys.path, though "/" is not the run's
        env = dict(os.environ, PYTHONSAFEPATH="1")
        subprocess.Popen([sys.executable, "-m", "hcp_linux", "serve", "--auto"], cwd="/", env=env,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, close_fds=True, start_new_session=True)
    except OSError:
        pass
