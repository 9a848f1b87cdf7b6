"""The host a captured connection's first bytes name, where they name one: the server name
(SNI) of a TLS ClientHello, or the Host header of an HTTP/1 request.

Transparent egress decides by destination; this is the second look the proxy takes when the
client speaks first, so that a connection to an allowed name's address cannot carry a TLS
handshake or a request for another host (domain fronting through the capture). Only the first
chunk the client sent is read, never waited for beyond it, never buffered: a handshake or head
split across chunks names nothing here. The bytes are untrusted; every read is bounded and
nothing but a result comes out (fuzzed in tests/test_fuzz_egress.py).
"""
from __future__ import annotations

import re

#: An HTTP/1 request line's method and the Host header (first one) of the same chunk.
_METHOD = re.compile(rb"[A-Z]{3,10} [^ \r\n]{1,8192} HTTP/1\.[01]\r\n")
_HOST = re.compile(rb"\r\nhost:[ \t]*([^\r\n]{0,300})\r\n", re.IGNORECASE)


def named_host(data: bytes) -> tuple[str, str] | None:
    """("sni", name) or ("host", authority) as written in ``data``, or None when it names no
    host (not TLS or HTTP/1, no SNI, no Host header, or cut short)."""
    if data[:1] == b"\x16":
        name = _sni(data)
        return None if name is None else ("sni", name)
    if _METHOD.match(data):
        head_end = data.find(b"\r\n\r\n")
        found = _HOST.search(data, 0, head_end + 2 if head_end >= 0 else len(data))
        if found is not None:
            return "host", found.group(1).strip().decode("latin-1")
    return None


def _sni(data: bytes) -> str | None:
    """The host_name of the server_name extension of a ClientHello in the first TLS record."""
    if len(data) < 5 or data[1] != 3:
        return None
    end = min(len(data), 5 + int.from_bytes(data[3:5], "big"))
    pos = 5
    if pos + 4 > end or data[pos] != 1:  # handshake type 1: ClientHello
        return None
    end = min(end, pos + 4 + int.from_bytes(data[pos + 1:pos + 4], "big"))
    pos += 4 + 2 + 32  # client_version, random
    for width in (1, 2, 1):  # session_id, cipher_suites, compression_methods
        if pos + width > end:
            return None
        pos += width + int.from_bytes(data[pos:pos + width], "big")
    if pos + 2 > end:
        return None
    end = min(end, pos + 2 + int.from_bytes(data[pos:pos + 2], "big"))
    pos += 2
    while pos + 4 <= end:
        kind = int.from_bytes(data[pos:pos + 2], "big")
        size = int.from_bytes(data[pos + 2:pos + 4], "big")
        pos += 4
        if pos + size > end:
            return None
        if kind == 0:  # server_name: a list of (type, name); type 0 is host_name
            inner, stop = pos + 2, min(pos + size, pos + 2 + int.from_bytes(
                data[pos:pos + 2], "big"))
            while inner + 3 <= stop:
                name_type = data[inner]
                length = int.from_bytes(data[inner + 1:inner + 3], "big")
                inner += 3
                if inner + length > stop:
                    return None
                if name_type == 0:
                    return data[inner:inner + length].decode("latin-1")
                inner += length
            return None
        pos += size
    return None
