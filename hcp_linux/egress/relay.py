"""Moving bytes between a client and its upstream: bounded buffers with drain() back-pressure,
half-close, an idle timeout, and a graceful close within a second, else an abort."""
from __future__ import annotations

import asyncio

from .httpwire import HeadError, read_head, rewrite_response_head, simple_response

__all__ = ["abort", "abort_unless_closing", "close_streams", "discard", "forward_response_heads",
           "pump"]

_CHUNK = 262144
_MAX_RESPONSE_HEAD = 65536  # origins' heads (cookies) can exceed what we accept from clients


async def discard(reader: asyncio.StreamReader, limit: int) -> None:
    """Read and drop up to ``limit`` bytes (until EOF)."""
    while limit > 0:
        data = await reader.read(min(limit, _CHUNK))
        if not data:
            return
        limit -= len(data)


async def close_streams(*writers: asyncio.StreamWriter) -> None:
    """Close gracefully (flushing what is buffered) within a second, else abort."""
    for writer in writers:
        writer.close()
    for writer in writers:
        try:
            await asyncio.wait_for(writer.wait_closed(), 1.0)
        except asyncio.CancelledError:
            abort(writer)
            raise
        except Exception:  # noqa: BLE001 - reset, timeout: nothing more to do than abort
            abort(writer)


def abort_unless_closing(writer: asyncio.StreamWriter) -> None:
    """Abort ``writer``'s transport unless a close is already under way."""
    if not writer.transport.is_closing():
        abort(writer)


def abort(writer: asyncio.StreamWriter) -> None:
    """Drop the connection at once (no flush); quiet when it is closed already."""
    try:
        writer.transport.abort()
    except Exception:  # noqa: BLE001 - already closed
        pass


async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, activity: list[float],
               first: bytes = b"", *, response_heads: bool = False) -> None:
    """Copy ``src`` to ``dst`` (after ``first``) until EOF, then half-close ``dst``; each
    chunk moved stamps ``activity[0]`` for the idle timeout. With ``response_heads``, the
    origin's response head(s) are rewritten first (see :func:`forward_response_heads`)."""
    loop = asyncio.get_running_loop()
    if first:
        dst.write(first)
        await dst.drain()
    if response_heads:
        if not await forward_response_heads(src, dst):
            return
        activity[0] = loop.time()
    while True:
        data = await src.read(_CHUNK)
        if not data:
            break
        activity[0] = loop.time()
        dst.write(data)
        await dst.drain()
    if dst.can_write_eof() and not dst.transport.is_closing():
        dst.write_eof()  # half-close: the peer still may answer

async def forward_response_heads(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> bool:
    """Forward the origin's response head(s) with ``Connection: close`` forced.
    Returns False when the relay should stop (the origin sent no usable head)."""
    pending = b""
    while True:
        try:
            head, pending = await read_head(src, pending, _MAX_RESPONSE_HEAD, request=False)
        except HeadError as exc:
            dst.write(simple_response(502, "Bad Gateway",
                                      f"hcp-linux egress proxy: upstream response: {exc}\n"))
            await dst.drain()
            return False
        head, status = rewrite_response_head(head)
        dst.write(head)
        if status is None or not 100 <= status < 200 or status == 101:
            break
    if pending:
        dst.write(pending)
    await dst.drain()
    return True
