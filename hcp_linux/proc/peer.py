"""What another process is, from the kernel: its credentials, namespaces and confinement.

The client of `hcp-linux serve` trusts a server (and the server a client) only when it is the
same user in the same place under no confinement the other lacks; /proc/PID/status is read
here for the executors too.
"""
from __future__ import annotations

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
