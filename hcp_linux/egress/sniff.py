"""What a connection decided by name carries: its first message, whole, and for HTTP/1 every
request after it.

A captured connection (transparent egress), and a CONNECT or SOCKS5 tunnel to a *name*, reach
the addresses that name resolved to; the server behind them may host other names too. So
before a byte goes upstream, the client's first message is read whole -- a TLS ClientHello
(all its records) or an HTTP/1 request head (through the blank line) -- and refused when its
server name (SNI), Host header or absolute-form target names another host. On HTTP/1 the
stream is followed after that: each request's body is passed on by its framing
(Content-Length, chunked), and every later request head on the connection is checked the same
way (``per_request``) or refused outright (``one_request``: the forward proxy, which forced
``Connection: close``). Split segments change nothing: bytes are held until the message they
belong to is complete.

Bounds: a first message (or a later request head) larger than MAX_MESSAGE bytes is refused;
the caller refuses a first message not complete within FIRST_MESSAGE_TIMEOUT seconds of its
first byte. Bytes that begin neither TLS nor an HTTP/1 request line (ssh, a protocol whose
server speaks first) are relayed untouched, as before. The parser is pure (no I/O) and reads
untrusted bytes: every length is checked, nothing but a result or `Refused` comes out
(fuzzed in tests/test_fuzz_egress.py).
"""
from __future__ import annotations

import re

from .hostnames import HostError, format_host, normalize_name, parse_authority
from .httpwire import HeadError, check_framing, host_header, parse_request_head

#: The largest first message (a ClientHello with its records; a request head) held before
#: deciding: real ClientHellos are under 2 KiB (8 KiB with post-quantum key shares), request
#: heads under 16 KiB; a client that needs more is refused, not waited for.
MAX_MESSAGE = 65536
#: Seconds from the first byte of a first message to its last: a client that trickles one
#: (or stops half way) is refused, not waited for while the upstream's line stays open.
FIRST_MESSAGE_TIMEOUT = 5.0

#: An HTTP/1 method and its space, after optional empty lines (servers skip those); letters,
#: '_' and '-' only, so that an ssh banner ("SSH-2.0-...") is not taken for one.
_METHOD = re.compile(rb"[A-Z][A-Z_-]{0,19} ")
_METHOD_PREFIX = re.compile(rb"[A-Z][A-Z_-]{0,19}\Z")
_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,15})(?:[ \t]*;[^\r\n]*)?\r\n")
_MAX_LINE = 4096  # a chunk-size line with its extensions; a trailer line counts in the head


class Refused(Exception):
    """The stream is refused here; str() is the reason (for the log)."""

    passed = b""  # set by StreamGuard.feed: what came before the refused message


def server_name(hello: bytes) -> str | None:
    """The SNI host_name of a complete ClientHello handshake message (type byte first), None
    when it has no server_name extension. Malformed: `Refused`."""
    end = len(hello)
    if end < 4 or hello[0] != 1 or int.from_bytes(hello[1:4], "big") != end - 4:
        raise Refused("not a ClientHello")
    pos = 4 + 2 + 32  # type, length; client_version, random
    for width in (1, 2, 1):  # session_id, cipher_suites, compression_methods
        if pos + width > end:
            raise Refused("ClientHello cut short")
        pos += width + int.from_bytes(hello[pos:pos + width], "big")
    if pos == end:
        return None  # no extensions
    if pos + 2 > end or pos + 2 + int.from_bytes(hello[pos:pos + 2], "big") != end:
        raise Refused("ClientHello extensions do not fill the message")
    pos += 2
    found: str | None = None
    seen = False
    while pos < end:
        if pos + 4 > end:
            raise Refused("ClientHello extension cut short")
        kind = int.from_bytes(hello[pos:pos + 2], "big")
        size = int.from_bytes(hello[pos + 2:pos + 4], "big")
        pos += 4
        if pos + size > end:
            raise Refused("ClientHello extension overruns the message")
        if kind == 0:
            if seen:
                raise Refused("two server_name extensions")
            seen = True
            found = _host_name(hello[pos:pos + size])
        pos += size
    return found


def _host_name(ext: bytes) -> str | None:
    """The one host_name entry of a server_name extension's body."""
    if len(ext) < 2 or int.from_bytes(ext[:2], "big") != len(ext) - 2:
        raise Refused("malformed server_name extension")
    pos, found = 2, None
    while pos < len(ext):
        if pos + 3 > len(ext):
            raise Refused("malformed server_name entry")
        kind, length = ext[pos], int.from_bytes(ext[pos + 1:pos + 3], "big")
        pos += 3
        if pos + length > len(ext):
            raise Refused("malformed server_name entry")
        if kind == 0:
            if found is not None:
                raise Refused("two host_name entries in server_name")
            found = ext[pos:pos + length].decode("latin-1")
        pos += length
    return found


def _client_hello(buf: bytes) -> tuple[bytes, int] | None:
    """(the ClientHello handshake message, bytes of records it took) once the TLS records at
    the start of ``buf`` hold it whole; None while they do not yet."""
    message = b""
    pos = 0
    while True:
        if len(message) >= 4:
            need = 4 + int.from_bytes(message[1:4], "big")
            if need > MAX_MESSAGE:
                raise Refused(f"ClientHello larger than {MAX_MESSAGE} bytes")
            if len(message) >= need:
                if len(message) != need:
                    raise Refused("data after the ClientHello in its record")
                return message, pos
        if pos + 5 > len(buf):
            return None
        if buf[pos] != 0x16 or buf[pos + 1] != 3:
            raise Refused("not a TLS handshake record")
        size = int.from_bytes(buf[pos + 3:pos + 5], "big")
        if size == 0 or size > 16384:
            raise Refused("TLS record length out of range")
        if pos + 5 + size > len(buf):
            return None
        message += buf[pos + 5:pos + 5 + size]
        pos += 5 + size
        if message[0] != 1:
            raise Refused("the first TLS handshake message is not a ClientHello")


class StreamGuard:
    """Follows what a client sends on a connection to ``host``:``port`` and says which bytes
    may go upstream. ``feed`` returns them (possibly none yet) or raises `Refused`; nothing
    of a refused message is ever returned.

    ``mode``: "per_request" (a connection decided by name: each HTTP/1 request must name
    ``host``), "one_request" (the forward proxy: the first head was read and rewritten by the
    proxy, ``body`` is its framing; any later request is refused).
    """

    def __init__(self, host: str, port: int, *, mode: str = "per_request",
                 body: tuple[str, int] | None = None) -> None:
        self.host, self.port, self.mode = host, port, mode
        self.buf = b""
        #: first | head | length | chunk-size | chunk-data | chunk-end | trailers | opaque
        self.kind = "first"
        self.left = 0  # bytes of the body (length) or of the chunk (chunk-data) still to pass
        self.started = False  # a first message has begun (the caller's timer runs)
        self.passed_first = False
        if body is not None:
            self.passed_first = True
            self._enter_body(*body)

    @property
    def deciding(self) -> bool:
        """Whether the first message is still being held."""
        return self.kind == "first" or (self.kind == "head" and not self.passed_first)

    def feed(self, data: bytes) -> bytes:
        """The bytes that may go upstream now. On `Refused`, its ``passed`` holds those of
        ``data`` that came before the refused message (a body, an earlier request): they
        may still go on; nothing after them."""
        self.buf += data
        out = bytearray()
        while self.buf:
            try:
                step = self._step()
            except Refused as exc:
                exc.passed = bytes(out)
                self.buf = b""
                raise
            if step is None:
                break
            out += step
        return bytes(out)

    def _step(self) -> bytes | None:
        """Move past what the buffer's start allows; the bytes passed, None for "need more"."""
        buf = self.buf
        if self.kind == "opaque":
            return self._take(len(buf), None)
        if self.kind == "first":
            self.started = True
            if buf[0] == 0x16:
                found = _client_hello(buf)
                if found is None:
                    self._bound("ClientHello")
                    return None
                self._check_name(server_name(found[0]), "TLS server name")
                return self._take(len(buf), "opaque")
            rest = buf.lstrip(b"\r\n")
            if len(buf) - len(rest) > 64:
                raise Refused("more than 64 empty lines before a request")
            if not rest or (_METHOD_PREFIX.match(rest) and not _METHOD.match(rest)):
                return None
            if _METHOD.match(rest):
                self.kind = "head"
                return b""
            return self._take(len(buf), "opaque")  # neither TLS nor HTTP/1: relayed as it is
        if self.kind == "head":
            return self._head()
        if self.kind in ("length", "chunk-data"):
            n = min(self.left, len(buf))
            self.left -= n
            if self.left:
                return self._take(n, None)
            return self._take(n, "head" if self.kind == "length" else "chunk-end")
        if self.kind == "chunk-size":
            line = _CHUNK_SIZE.match(buf)
            if line is None:
                if b"\n" in buf[:_MAX_LINE] or len(buf) > _MAX_LINE:
                    raise Refused("malformed chunk-size line")
                return None
            size = int(line.group(1), 16)
            self.left = size
            return self._take(line.end(), "chunk-data" if size else "trailers")
        if self.kind == "chunk-end":
            if len(buf) < 2:
                return None
            if buf[:2] != b"\r\n":
                raise Refused("chunk data not followed by CRLF")
            return self._take(2, "chunk-size")
        if self.kind == "trailers":
            end = buf.find(b"\r\n")
            if end < 0:
                if len(buf) > MAX_MESSAGE:
                    raise Refused(f"trailers larger than {MAX_MESSAGE} bytes")
                return None
            return self._take(end + 2, "head" if end == 0 else "trailers")
        raise AssertionError(self.kind)

    def _head(self) -> bytes | None:
        """A request head: held until complete, checked, passed whole (with any empty lines
        before it, which servers skip)."""
        buf = self.buf
        skip = len(buf) - len(buf.lstrip(b"\r\n"))
        if self.passed_first and self.mode == "one_request" and buf[skip:]:
            raise Refused("a second request on a proxied connection (each carries one: "
                          "Connection: close)")
        if skip > 64:
            raise Refused("more than 64 empty lines before a request")
        if skip == len(buf):
            return None
        end = buf.find(b"\r\n\r\n", skip)
        if end < 0:
            self._bound("request head")
            return None
        end += 4
        if end > MAX_MESSAGE:
            raise Refused(f"request head larger than {MAX_MESSAGE} bytes")
        try:
            head = parse_request_head(buf[skip:end])
            check_framing(head)
            written = host_header(head)
        except HeadError as exc:
            raise Refused(f"request head: {exc}") from None
        if head.method == "CONNECT" or head.values("upgrade"):
            raise Refused(f"{'CONNECT' if head.method == 'CONNECT' else 'an Upgrade request'}"
                          f" on a connection to {self.host}:{self.port} (not relayed: what "
                          "follows would not be HTTP/1 the guard can read)")
        if written is not None:
            self._check_authority(format_host(written[0]), written[1], "HTTP Host header",
                                  head.values("host")[0])
        scheme, sep, rest = head.target.partition("://")
        if sep:
            authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
            try:
                host, port = parse_authority(authority, 0)
            except HostError:
                raise Refused(f"request target {head.target[:255]!r}: invalid host") from None
            self._check_authority(format_host(host), port or None, "request target",
                                  authority)
        encodings = [t.strip().lower() for v in head.values("transfer-encoding")
                     for t in v.split(",") if t.strip()]
        if encodings and encodings[-1] != "chunked":
            raise Refused("a request body whose last transfer coding is not chunked")
        lengths = head.values("content-length")
        passed = self._take(end, None)
        self.passed_first = True
        self._enter_body("chunked" if encodings else "length",
                         int(lengths[0]) if lengths else 0)
        return passed

    def _enter_body(self, framing: str, length: int) -> None:
        if framing == "chunked":
            self.kind = "chunk-size"
        elif length:
            self.kind, self.left = "length", length
        else:
            self.kind = "head"

    def _check_name(self, name: str | None, what: str) -> None:
        if name is None:
            return  # no SNI: the destination, which was decided, is all there is
        try:
            same = normalize_name(name) == self.host
        except HostError:
            same = False
        if not same:
            raise Refused(f"connection to {self.host}:{self.port}: its {what} "
                          f"{name[:255]!r} names another host")

    def _check_authority(self, host: str, port: int | None, what: str, text: str) -> None:
        try:
            same = normalize_name(host) == self.host
        except HostError:
            same = host == self.host
        if not same or port not in (None, self.port):
            raise Refused(f"connection to {self.host}:{self.port}: its {what} "
                          f"{text[:255]!r} names another host")

    def _bound(self, what: str) -> None:
        if len(self.buf) > MAX_MESSAGE:
            raise Refused(f"{what} larger than {MAX_MESSAGE} bytes")

    def _take(self, n: int, kind: str | None) -> bytes:
        """Pass the buffer's first ``n`` bytes; then be in state ``kind`` (None: unchanged)."""
        passed, self.buf = self.buf[:n], self.buf[n:]
        if kind is not None:
            self.kind = kind
        return passed
