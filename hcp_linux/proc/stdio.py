"""Fds 0, 1 and 2 are never left closed while the runtime makes fds of its own.

A process whose standard fd is closed gives that number to the next fd it makes. Had the
runtime's own pipes, sockets and memfds landed there, a run that inherits its caller's stdin,
stdout or stderr would hand the command one of them: seen, a pipe of the runtime's as the
command's fd 0, and a run's capture pipe as both its stdin and its stdout; a spare's
control socket there would let the command send that unconfined hcp-exec a plan of its own.
And the CLI would print its lines into whatever landed on fd 2.

So, as OpenSSH, sudo and glibc's start of a set-user-ID program do, each closed one is opened
on /dev/null before the runtime makes an fd: at the command's start (hcp_linux.cli.launch;
hcp_client.c does the same), at each spawn, each spare and each session. A command whose
caller had nothing there finds /dev/null. Imports nothing but the standard library's
built-ins: the served client's start-up path calls it.
"""
from __future__ import annotations

import _thread
import errno
import os

_lock = _thread.allocate_lock()  # two threads of the runtime filling at once


def fill_closed() -> None:
    """Open /dev/null on each of fds 0, 1, 2 that is closed (read-write, inheritable, as a
    standard fd is). The lowest free fd is the one filled; if another thread took it first,
    that fd is its own and is left as it is."""
    with _lock:
        for fd in (0, 1, 2):
            try:
                os.fstat(fd)
                continue
            except OSError as e:
                if e.errno != errno.EBADF:
                    raise
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:  # taken meanwhile by a thread of the caller's: not ours to touch
                os.close(null)
                continue
            os.set_inheritable(null, True)
