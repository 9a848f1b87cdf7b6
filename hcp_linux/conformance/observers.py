"""Watching processes and sockets from outside, for the conformance checks, the tests and the
bench: /proc readers (alive, state, children, by command line, by pid namespace), a loopback
listener that counts connections, and calls bounded by a thread.
"""
from __future__ import annotations

import os
import signal
import socket
import time
from typing import Any


def drain(fd: int) -> bytes:
    """What can be read from ``fd`` right now (it is left non-blocking)."""
    os.set_blocking(fd, False)
    data = b""
    try:
        while True:
            chunk = os.read(fd, 1024)
            if not chunk:
                break
            data += chunk
    except OSError:  # BlockingIOError: nothing more now; EIO: a pty whose other end closed
        pass
    return data


def accepted(sock: socket.socket, wait: float = 0.3) -> int:
    """Connections a non-blocking listening socket accepted since the last call (waiting
    ``wait`` s for late ones), each closed at once."""
    n = 0
    deadline = time.monotonic() + wait
    while True:
        try:
            conn, _ = sock.accept()
            conn.close()
            n += 1
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return n
            time.sleep(0.02)


class Listener:
    """A TCP listener on a loopback address that counts the connections it accepts."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        if host not in ("127.0.0.1", "::1"):
            raise ValueError("loopback only")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            self.sock.bind((host, 0))
            self.sock.listen(16)
        except OSError:
            self.sock.close()
            raise
        self.sock.setblocking(False)
        self.host = host
        self.port = self.sock.getsockname()[1]

    def accepted(self, wait: float = 0.3) -> int:
        """Connections accepted since the last call (waiting ``wait`` s for late ones)."""
        return accepted(self.sock, wait)

    def close(self) -> None:
        self.sock.close()


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie counts as dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def proc_state(pid: int) -> str | None:
    """The state letter of ``pid`` in /proc (``Z`` a zombie, ``T`` stopped), None when gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def proc_children(pid: int) -> list[int]:
    """The children of ``pid`` (/proc/PID/task/PID/children); [] when gone."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def processes_with(needle: str, but: int = -1) -> list[int]:
    """Pids whose command line contains ``needle``, but ``but`` (say, the CLI that was given
    the command: its own argv holds the needle too)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != but:
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if needle.encode() in f.read():
                        found.append(int(entry))
            except OSError:
                pass
    return found


def processes_in_namespace(ns: str) -> list[int]:
    """Pids whose pid namespace link reads ``ns`` (those we may not read are not counted)."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.readlink(f"/proc/{name}/ns/pid") == ns:
                    out.append(int(name))
            except OSError:
                continue
    return out


def resume_and_kill(pids: list[int]) -> None:
    """SIGCONT, then SIGKILL, each of ``pids`` (processes the caller started), by pid."""
    for pid in pids:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass


def on_a_thread(fn: Any, seconds: float) -> tuple[bool, Any]:
    """(returned, result): ``fn()`` on a daemon thread given ``seconds``; its exception is
    raised here. A call that hangs is left behind on its thread and reported as not
    returned: the hang is the finding, not a reason to hang the caller."""
    import threading
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed back to the caller
            box["error"] = e
    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        return False, None
    if "error" in box:
        raise box["error"]
    return True, box.get("result")


__all__ = ["Listener", "accepted", "drain", "pid_alive", "proc_state", "proc_children",
           "processes_with", "processes_in_namespace", "resume_and_kill", "on_a_thread"]
