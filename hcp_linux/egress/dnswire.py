"""The few DNS messages the sandbox's resolver reads and writes (RFC 1035), by hand.

The resolver answers one question per query, for names only: it never follows compression
pointers (a question has none), never reads the answer, authority or additional sections
(an EDNS OPT record there is ignored, and the answer carries none), and writes at most one A
record. What it reads is untrusted bytes from inside the sandbox, so parsing is bounded and
fails with `DnsError` only (fuzzed in tests/test_fuzz_egress.py).
"""
from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass

from .hostnames import HostError, normalize_name

_HEADER = struct.Struct("!HHHHHH")  # id, flags, qdcount, ancount, nscount, arcount
_QR, _AA, _RD, _RA = 0x8000, 0x0400, 0x0100, 0x0080

#: Record types and the class the resolver knows by name.
TYPE_A, TYPE_AAAA, CLASS_IN = 1, 28, 1
#: Response codes (RCODE).
NOERROR, FORMERR, SERVFAIL, NXDOMAIN, NOTIMP, REFUSED = 0, 1, 2, 3, 4, 5
RCODE_NAMES = {NOERROR: "NOERROR", FORMERR: "FORMERR", SERVFAIL: "SERVFAIL",
               NXDOMAIN: "NXDOMAIN", NOTIMP: "NOTIMP", REFUSED: "REFUSED"}
#: A query longer than this is not read (a UDP query with one question is far smaller).
MAX_QUERY = 1232


class DnsError(Exception):
    """A query the resolver cannot read; ``rcode`` is the answer to send if the header (and
    so the id) was readable, None if nothing should be sent."""

    def __init__(self, reason: str, rcode: int | None) -> None:
        super().__init__(reason)
        self.rcode = rcode


@dataclass(frozen=True)
class Question:
    """One query: its id, the RD bit, the question's wire bytes (echoed in the answer), the
    name (lower-case LDH, no trailing dot, or None when not a valid host name), type, class."""

    id: int
    rd: bool
    wire: bytes
    name: str | None
    qtype: int
    qclass: int
    raw_name: str  # printable spelling of the name as sent, for the log


def parse_query(data: bytes) -> Question:
    """The query's question; `DnsError` when the message is not a standard query with exactly
    one well-formed question."""
    if len(data) < _HEADER.size:
        raise DnsError("shorter than a DNS header", None)
    if len(data) > MAX_QUERY:
        raise DnsError(f"longer than {MAX_QUERY} bytes", None)
    qid, flags, qd, an, ns, _ = _HEADER.unpack_from(data)
    if flags & _QR:
        raise DnsError("a response, not a query", None)  # never answer an answer
    if (flags >> 11) & 0xF:
        raise DnsError(f"opcode {(flags >> 11) & 0xF} is not a standard query", NOTIMP)
    if qd != 1 or an or ns:
        raise DnsError(f"{qd} questions, {an} answers, {ns} authority records "
                       "(one question and nothing else expected)", FORMERR)
    pos, labels, total = _HEADER.size, [], 0
    while True:
        if pos >= len(data):
            raise DnsError("name runs past the end", FORMERR)
        length = data[pos]
        pos += 1
        if length == 0:
            break
        if length > 63:
            raise DnsError("compressed or over-long label in the question", FORMERR)
        total += length + 1
        if total > 254 or pos + length > len(data):
            raise DnsError("name longer than 255 bytes or past the end", FORMERR)
        labels.append(data[pos:pos + length])
        pos += length
    if pos + 4 > len(data):
        raise DnsError("question has no type and class", FORMERR)
    qtype, qclass = struct.unpack_from("!HH", data, pos)
    pos += 4
    raw = ".".join(label.decode("ascii", "backslashreplace") for label in labels)
    raw = "".join(c if c.isprintable() else repr(c)[1:-1] for c in raw)[:300]
    name: str | None
    try:
        name = normalize_name(b".".join(labels).decode("ascii")) if labels else None
    except (HostError, UnicodeDecodeError):
        name = None
    if name is not None and any(b"." in label for label in labels):
        name = None  # a dot inside a label is not the name it spells
    return Question(qid, bool(flags & _RD), data[_HEADER.size:pos], name, qtype, qclass, raw)


def answer(q: Question, rcode: int, address: ipaddress.IPv4Address | None = None,
           ttl: int = 60) -> bytes:
    """The response to ``q``: ``rcode``, and one A record for ``address`` if given."""
    flags = _QR | _AA | _RA | (_RD if q.rd else 0) | (rcode & 0xF)
    out = _HEADER.pack(q.id, flags, 1, 1 if address is not None else 0, 0, 0) + q.wire
    if address is not None:
        out += struct.pack("!HHHIH", 0xC00C, TYPE_A, CLASS_IN, ttl, 4) + address.packed
    return out


def error_answer(data: bytes, rcode: int) -> bytes:
    """A bare response (header only) to a query whose question could not be read."""
    qid, flags = struct.unpack_from("!HH", data)
    return _HEADER.pack(qid, _QR | _RA | (flags & _RD) | (rcode & 0xF), 0, 0, 0, 0)
