"""A sandboxed process on an asyncio loop: stdin fed, stdout/stderr drained and the exit
awaited through fds registered with the loop, with no thread parked in a read or a waitpid."""
from __future__ import annotations

import asyncio
import os

from ..sandbox import SandboxProcess

__all__ = ["communicate"]


async def communicate(loop: asyncio.AbstractEventLoop, proc: SandboxProcess,
                      input: bytes | None, timeout: float | None, max_bytes: int | None
                      ) -> tuple[bytes | None, bytes | None, bool]:
    """Feed stdin, drain stdout/stderr and wait for exit, all on the loop (pidfd), with a
    timeout that kills the whole sandbox. Like the engine's ``communicate``, each stream keeps
    at most ``max_bytes`` (the rest is read and dropped; ``proc.truncated`` names it).
    Returns (out, err, timed_out)."""
    chunks: dict[int, list[bytes]] = {}
    kept: dict[int, int] = {}
    names: dict[int, str] = {}
    waiters: list[asyncio.Future[None]] = []
    registered: list[tuple[str, int]] = []

    def reader(fd: int, fut: asyncio.Future[None]) -> None:
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return
        if data:
            take = len(data) if max_bytes is None else min(len(data), max(0, max_bytes - kept[fd]))
            if take < len(data):
                proc.truncated.add(names[fd])
            if take:
                chunks[fd].append(data[:take])
                kept[fd] += take
        else:
            loop.remove_reader(fd)
            if not fut.done():
                fut.set_result(None)

    for stream, name in ((proc.stdout, "stdout"), (proc.stderr, "stderr")):
        if stream is not None:
            fd = stream.fileno()
            os.set_blocking(fd, False)
            chunks[fd], kept[fd], names[fd] = [], 0, name
            fut = loop.create_future()
            loop.add_reader(fd, reader, fd, fut)
            registered.append(("r", fd))
            waiters.append(fut)
    if proc.stdin is not None:
        to_send = memoryview(input or b"")
        wfd = proc.stdin.fileno()
        wfut = loop.create_future()
        if to_send:
            os.set_blocking(wfd, False)

            def writer() -> None:
                nonlocal to_send
                try:
                    n = os.write(wfd, to_send[:65536])
                except BlockingIOError:
                    return
                except BrokenPipeError:
                    n = len(to_send)
                to_send = to_send[n:]
                if not to_send:
                    loop.remove_writer(wfd)
                    proc.stdin.close()  # type: ignore[union-attr]
                    if not wfut.done():
                        wfut.set_result(None)
            loop.add_writer(wfd, writer)
            registered.append(("w", wfd))
        else:
            proc.stdin.close()
            wfut.set_result(None)
        waiters.append(wfut)
    end_fd, own_end_fd = proc.end_fd()
    exited = loop.create_future()

    def on_exit() -> None:
        if not exited.done():
            exited.set_result(None)
    loop.add_reader(end_fd, on_exit)
    waiters.append(exited)
    timed_out = False
    try:
        _, unfinished = await asyncio.wait(waiters, timeout=timeout)
        if unfinished:
            timed_out = True
            proc.kill()
            # The kill empties the sandbox (pid 1 dies, the kernel kills the rest): the pipes
            # reach EOF and the monitor exits promptly. Bound the wait for pipes anyway.
            await asyncio.wait(unfinished, timeout=5.0)
            if not exited.done():
                await exited
    except BaseException:
        proc.kill()  # cancelled: the caller's cleanup reaps it
        raise
    finally:
        loop.remove_reader(end_fd)
        if own_end_fd:
            os.close(end_fd)
        for kind, fd in registered:
            (loop.remove_reader if kind == "r" else loop.remove_writer)(fd)
    proc.wait()  # the run is over: this does not block
    out = err = None
    if proc.stdout is not None:
        out = b"".join(chunks[proc.stdout.fileno()])
        proc.stdout.close()
    if proc.stderr is not None:
        err = b"".join(chunks[proc.stderr.fileno()])
        proc.stderr.close()
    return out, err, timed_out
