"""The wire of `hcp-linux serve`: frames of length-prefixed items, client and server alike.

A frame is a u32 length, then items (u32 length + bytes each), little-endian. Only the
C-level struct module is used: the client imports this on the start-up path of a run.
"""
from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing on the start-up path
if TYPE_CHECKING:
    from typing import Sequence

#: The protocol's name and version; a server that does not say it is not talked to.
PROTOCOL = b"hcp-linux/serve 1"
MAX_FRAME = 16 << 20


def encode(items: "Sequence[bytes]") -> bytes:
    from _struct import pack
    body = b"".join(pack("<I", len(i)) + i for i in items)
    return pack("<I", len(body)) + body


def decode(body: bytes) -> list[bytes]:
    from _struct import unpack_from
    out, pos = [], 0
    while pos < len(body):
        if pos + 4 > len(body):
            raise ValueError("truncated item header")
        (n,) = unpack_from("<I", body, pos)
        pos += 4
        if pos + n > len(body):
            raise ValueError("truncated item")
        out.append(body[pos:pos + n])
        pos += n
    return out


def recv_frame(sock) -> list[bytes]:  # type: ignore[no-untyped-def]
    from _struct import unpack
    head = _recv_exact(sock, 4)
    (n,) = unpack("<I", head)
    if n > MAX_FRAME:
        raise ValueError(f"frame of {n} bytes")
    return decode(_recv_exact(sock, n))


def _recv_exact(sock, n: int) -> bytes:  # type: ignore[no-untyped-def]
    parts, got = [], 0
    while got < n:
        chunk = sock.recv(min(n - got, 1 << 20))
        if not chunk:
            raise ConnectionError("the peer closed the connection")
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)
