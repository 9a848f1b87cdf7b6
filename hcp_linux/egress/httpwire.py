"""Just enough HTTP/1.x for a forward proxy: read a bounded head, parse it strictly, rewrite it.

Strict because a proxy that parses a request differently from the origin behind it is how
smuggling and host confusion happen: obs-folded headers, bare LF, NUL, two Host headers, or
Content-Length beside Transfer-Encoding are refused with 400 instead of being "understood".
Bodies are never parsed: after the head, bytes are relayed as they are, to the one upstream
address that was checked, so whatever the body contains cannot reach anywhere else.
"""
from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass

from .hostnames import Host, HostError, format_host, parse_authority

_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")
_VERSION = re.compile(r"HTTP/1\.[01]\Z")
_STATUS_LINE = re.compile(r"HTTP/1\.[01] ([0-9]{3})(?: .*)?\Z")
_DECIMAL = re.compile(r"[0-9]+\Z")

#: Hop-by-hop headers a proxy must not forward (RFC 9110 7.6.1), plus the proxy's own.
#: Transfer-Encoding stays: the body is relayed as it is, so its framing must travel with it.
HOP_BY_HOP = frozenset({"connection", "proxy-connection", "keep-alive", "te", "trailer",
                        "upgrade", "proxy-authorization", "proxy-authenticate"})
_NEVER_DROPPED = frozenset({"host", "content-length", "transfer-encoding"})


class HeadError(Exception):
    """The head is malformed (400) or too large (431); str() is the reason."""

    def __init__(self, reason: str, status: int = 400) -> None:
        super().__init__(reason)
        self.status = status


@dataclass
class RequestHead:
    method: str
    target: str
    version: str
    headers: list[tuple[str, str]]

    def values(self, name: str) -> list[str]:
        name = name.lower()
        return [v for k, v in self.headers if k.lower() == name]


async def read_head(reader: asyncio.StreamReader, initial: bytes, max_bytes: int, *,
                    request: bool) -> tuple[bytes, bytes]:
    """Read up to the blank line ending a head; return (head, bytes read past it).

    At most ``max_bytes`` of head are accepted. For a request the first line is validated as
    soon as it is complete, so garbage with a newline gets its 400 without waiting for a
    blank line that will never come. Responses (from origins, which are often lax) may end
    lines with a bare LF.
    """
    buf = bytearray(initial)
    checked_first_line = False
    while True:
        end = _head_end(buf, bare_lf=not request)
        if end is not None:
            if end > max_bytes:
                raise HeadError(f"head larger than {max_bytes} bytes", 431)
            return bytes(buf[:end]), bytes(buf[end:])
        if len(buf) > max_bytes:
            raise HeadError(f"head larger than {max_bytes} bytes", 431)
        if request and not checked_first_line:
            newline = buf.find(b"\n")
            if newline >= 0:
                _request_line(bytes(buf[:newline + 1]))
                checked_first_line = True
        chunk = await reader.read(4096)
        if not chunk:
            raise HeadError("connection closed before the end of the head")
        buf += chunk


def _head_end(buf: bytearray, *, bare_lf: bool) -> int | None:
    found = buf.find(b"\r\n\r\n")
    if found >= 0:
        return found + 4
    if bare_lf:
        found = buf.find(b"\n\n")
        if found >= 0:
            return found + 2
    return None


def _request_line(line: bytes) -> tuple[str, str, str]:
    if not line.endswith(b"\r\n"):
        raise HeadError("request line must end with CRLF")
    text = line[:-2].decode("latin-1")
    parts = text.split(" ")
    if len(parts) != 3:
        raise HeadError("malformed request line")
    method, target, version = parts
    if not _TOKEN.match(method):
        raise HeadError("malformed method")
    if not target or any(not 0x21 <= ord(c) <= 0x7E for c in target):
        raise HeadError("request target must be visible ASCII")
    if not _VERSION.match(version):
        raise HeadError("unsupported HTTP version (HTTP/1.0 or HTTP/1.1 only)")
    return method, target, version


def parse_request_head(head: bytes) -> RequestHead:
    """Parse a request head read by `read_head` (CRLF line endings)."""
    lines = head[:-4].split(b"\r\n")
    method, target, version = _request_line(lines[0] + b"\r\n")
    return RequestHead(method, target, version, _headers(lines[1:]))


def _headers(lines: list[bytes]) -> list[tuple[str, str]]:
    headers: list[tuple[str, str]] = []
    for raw in lines:
        line = raw.decode("latin-1")
        if not line or line[0] in " \t":
            raise HeadError("obsolete line folding or empty header line")
        name, sep, value = line.partition(":")
        if not sep or not _TOKEN.match(name):
            raise HeadError("malformed header line")
        value = value.strip(" \t")
        if any((ord(c) < 0x20 and c != "\t") or ord(c) == 0x7F for c in value):
            raise HeadError(f"control character in header {name!r}")
        headers.append((name, value))
    return headers


def check_framing(head: RequestHead) -> None:
    """Refuse the request-smuggling ambiguities outright."""
    lengths = head.values("content-length")
    if lengths and head.values("transfer-encoding"):
        raise HeadError("both Content-Length and Transfer-Encoding")
    # ASCII digits only: str.isdigit() also takes '²' or '³' (latin-1 bytes 0xB2, 0xB3).
    if len(set(lengths)) > 1 or any(not _DECIMAL.match(v) for v in lengths):
        raise HeadError("invalid or conflicting Content-Length")


def host_header(head: RequestHead) -> tuple[Host, int | None] | None:
    """The single Host header as (host, port), None when absent; port None if not written."""
    values = head.values("host")
    if not values:
        return None
    if len(values) > 1:
        raise HeadError("more than one Host header")
    try:
        value = values[0]
        if (value.startswith("[") and value.endswith("]")) or ":" not in value:
            host, _ = parse_authority(value, 0)
            return host, None
        return parse_authority(value)
    except HostError as exc:
        raise HeadError(f"invalid Host header: {exc}") from None


def split_absolute_url(target: str) -> tuple[str, str]:
    """``http://authority/path?q`` → (authority, origin-form path). Only http:// is proxied
    this way; https goes through CONNECT."""
    scheme, sep, rest = target.partition("://")
    if not sep or scheme.lower() != "http":
        raise HeadError("request target must be an absolute http:// URL (use CONNECT for TLS)")
    cut = min((i for i in (rest.find("/"), rest.find("?"), rest.find("#")) if i >= 0),
              default=len(rest))
    authority, path = rest[:cut], rest[cut:]
    path = path.split("#", 1)[0]
    if not path.startswith("/"):
        path = "/" + path
    return authority, path


def origin_request(head: RequestHead, path: str, host: Host, port: int) -> bytes:
    """The request as the origin must see it: origin-form target, hop-by-hop headers removed,
    Host set to the checked authority, and ``Connection: close`` so that one client
    connection carries one request to one checked upstream."""
    drop = set(HOP_BY_HOP)
    for value in head.values("connection"):
        drop.update(t.strip().lower() for t in value.split(",") if t.strip())
    drop -= _NEVER_DROPPED
    authority = format_host(host) if port == 80 else f"{format_host(host)}:{port}"
    lines = [f"{head.method} {path} {head.version}", f"Host: {authority}"]
    lines += [f"{k}: {v}" for k, v in head.headers
              if k.lower() not in drop and k.lower() != "host"]
    lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def rewrite_response_head(head: bytes) -> tuple[bytes, int | None]:
    """Force ``Connection: close`` on an origin's response head; returns (head, status).

    The client must learn that this connection ends with the response, or it would send its
    next request into a tunnel the origin is closing. A head that does not parse is passed
    through untouched (status None): the proxy does not police origins.
    """
    text = head.decode("latin-1")
    lines = text.replace("\r\n", "\n").split("\n")
    while lines and lines[-1] == "":
        lines.pop()
    match = _STATUS_LINE.match(lines[0]) if lines else None
    if match is None:
        return head, None
    drop = {"connection", "proxy-connection", "keep-alive"}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "connection":
            drop.update(t.strip().lower() for t in value.split(",") if t.strip())
    drop -= _NEVER_DROPPED
    kept = [lines[0]] + [ln for ln in lines[1:]
                         if ln.partition(":")[0].strip().lower() not in drop]
    kept.append("Connection: close")
    return ("\r\n".join(kept) + "\r\n\r\n").encode("latin-1"), int(match.group(1))


def simple_response(status: int, reason_phrase: str, body: str) -> bytes:
    """A complete, closing response from the proxy itself."""
    payload = body.encode("utf-8", "replace")
    return (f"HTTP/1.1 {status} {reason_phrase}\r\n"
            "Content-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(payload)}\r\n"
            "Connection: close\r\n"
            "Proxy-Agent: hcp-linux-egress\r\n\r\n").encode("latin-1") + payload
