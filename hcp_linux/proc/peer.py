"""What another process is, from the kernel: its credentials, namespaces and confinement.

The client of `hcp-linux serve` trusts a server (and the server a client) only when it is the
same user in the same place under no confinement the other lacks; /proc/PID/status is read
here for the executors too.
"""
from __future__ import annotations

import _thread
import os

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


def process_status() -> tuple[int, int, int]:
    """(umask, ignored signals, blocked signals) of this process, as a fork from the calling
    thread would pass them on, which hcp-exec gives the command whenever its spare was
    started (bit n-1 for signal n): the plan's, in-process (hcp_linux.native.wire) or
    served (its client, hcp_linux.cli.serve_client). The umask is read without changing it
    (os.umask would, for every thread), from one read of /proc/self/status; (-1, 0) for it
    and the ignored signals if unreadable. The file stays open (a pread regenerates it); a
    forked child opens its own. The blocked signals are the calling thread's mask."""
    import _signal  # the C half: `signal` imports enum (~2 ms) on the served path
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
    blocked = sum(1 << (int(s) - 1) for s in _signal.pthread_sigmask(_signal.SIG_BLOCK, ()))
    return umask, ignored, blocked


_status_fd = -1
_status_lock = _thread.allocate_lock()


def _forget_status_fd() -> None:
    """In a forked child: /proc/self was resolved to the parent when the fd was opened."""
    global _status_fd, _status_lock
    if _status_fd >= 0:
        try:
            os.close(_status_fd)
        except OSError:
            pass
    _status_fd, _status_lock = -1, _thread.allocate_lock()


os.register_at_fork(after_in_child=_forget_status_fd)


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
