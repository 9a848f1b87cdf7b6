"""The kernel's audit netlink interface, as far as this runtime uses it.

Landlock (ABI >= 7) logs its denials through the audit subsystem only. Reading them takes
three things of NETLINK_AUDIT, each behind a capability of the initial user namespace:

- the status (AUDIT_GET, CAP_AUDIT_CONTROL): whether audit is enabled at all, and the count
  of records the kernel has dropped (backlog or rate limit), to say when records are missing;
- the read-only multicast of every record (group AUDIT_NLGRP_READLOG, CAP_AUDIT_READ), which
  leaves auditd, if there is one, undisturbed;
- a user message (AUDIT_USER, CAP_AUDIT_WRITE) used as a marker: records reach readers in
  the order they were queued, through one kernel thread (kauditd) from one queue, and a
  message joins the same queue; once it comes back, every record queued before it has been
  delivered. That is what makes a run's records complete at its end, not "probably there".

The multicast goes to sockets of the initial network namespace only. Records are text:
``audit(SECONDS.MILLIS:SERIAL): key=value key=value ...``; a value the kernel does not trust
(a path, a command name) is either in double quotes, holding no space, quote or control
character, or unquoted hexadecimal (kernel/audit.c, audit_log_n_untrustedstring). Parsed
here by hand, small and total: any bytes give a result or None, never an exception
(tests/test_fuzz_audit.py).
"""
from __future__ import annotations

import socket
import struct
from dataclasses import dataclass
from typing import Iterator

NETLINK_AUDIT = 9
AUDIT_GET, AUDIT_SET, AUDIT_USER = 1000, 1001, 1005
AUDIT_SYSCALL = 1300
AUDIT_LANDLOCK_ACCESS, AUDIT_LANDLOCK_DOMAIN = 1423, 1424
#: AUDIT_NLGRP_READLOG, as a bind() group mask: group 1 is bit 0.
READLOG_GROUPS = 1

_NLMSG_ERROR = 2
_NLM_F_REQUEST, _NLM_F_ACK = 1, 4
_HEADER = struct.Struct("=IHHII")  # struct nlmsghdr: len, type, flags, seq, pid
#: struct audit_status: mask, enabled, failure, pid, rate_limit, backlog_limit, lost, backlog
_STATUS = struct.Struct("=8I")

#: Fields whose values the kernel logs as untrusted strings: quoted, or hex when unquoted.
UNTRUSTED = frozenset({"path", "dev", "comm", "exe", "ocomm", "name", "cwd", "proctitle"})


@dataclass(frozen=True)
class Status:
    """What AUDIT_GET says: ``enabled`` (0 off, 1 on, 2 on and locked), ``lost`` (records the
    kernel dropped since boot) and ``backlog_limit``."""
    enabled: int
    lost: int
    backlog_limit: int


def _exchange(kind: int, payload: bytes = b"", reply: bool = False,
              timeout: float = 1.0) -> bytes:
    """Send one request and wait for its answer: with ``reply``, the message of the same
    type (AUDIT_GET's status; no acknowledgement is asked for, as the kernel may send it
    before the reply), else the kernel's acknowledgement (b""). An error acknowledgement
    raises OSError with its errno; no answer within ``timeout``, TimeoutError."""
    flags = _NLM_F_REQUEST | (0 if reply else _NLM_F_ACK)
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC,
                       NETLINK_AUDIT) as s:
        s.settimeout(timeout)
        s.sendto(_HEADER.pack(_HEADER.size + len(payload), kind, flags, 1, 0) + payload,
                 (0, 0))
        for _ in range(8):
            for got, body in messages(s.recv(8192)):
                if got == _NLMSG_ERROR:
                    err = -struct.unpack_from("=i", body)[0] if len(body) >= 4 else 0
                    if err:
                        raise OSError(err, f"audit netlink request {kind}")
                    if not reply:
                        return b""
                elif reply and got == kind:
                    return body
    raise OSError(0, f"audit netlink request {kind}: no answer")


def status() -> Status:
    """The kernel's audit status. OSError: no audit netlink here (no CONFIG_AUDIT), or no
    CAP_AUDIT_CONTROL in the initial user namespace (EPERM, ECONNREFUSED)."""
    body = _exchange(AUDIT_GET, reply=True)
    if len(body) < _STATUS.size:
        raise OSError(0, "AUDIT_GET: no status in the reply")
    _, enabled, _, _, _, backlog_limit, lost, _ = _STATUS.unpack_from(body)
    return Status(enabled, lost, backlog_limit)


def subscribe(rcvbuf: int = 4 << 20) -> socket.socket:
    """A socket that receives every record the kernel logs from now on (the read-only
    multicast group), with a large receive buffer: a burst of records that overflows it is
    lost to this reader, and recv() then fails ENOBUFS once, which the reader must report.
    OSError EPERM without CAP_AUDIT_READ."""
    s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_AUDIT)
    try:
        try:  # as root the buffer may exceed net.core.rmem_max; without, it is capped there
            s.setsockopt(socket.SOL_SOCKET, 33, rcvbuf)  # SO_RCVBUFFORCE
        except OSError:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        s.bind((0, READLOG_GROUPS))
    except BaseException:
        s.close()
        raise
    return s


def send_user(text: str) -> None:
    """Log ``text`` as a user message (AUDIT_USER); the kernel records it as ``msg='TEXT'``.
    Dropped silently by the kernel while audit is disabled. OSError EPERM without
    CAP_AUDIT_WRITE."""
    _exchange(AUDIT_USER, text.encode() + b"\0")


def messages(data: bytes) -> Iterator[tuple[int, bytes]]:
    """The (type, payload) of each netlink message in one datagram; stops at the first
    malformed header."""
    at = 0
    while at + _HEADER.size <= len(data):
        length, kind = _HEADER.unpack_from(data, at)[:2]
        if length < _HEADER.size or at + length > len(data):
            return
        yield kind, data[at + _HEADER.size:at + length]
        at += (length + 3) & ~3  # NLMSG_ALIGN


def record(payload: bytes) -> tuple[str, dict[str, str]] | None:
    """``(serial, fields)`` of one record's text: ``serial`` is the event's ``SECONDS.MILLIS:
    SERIAL`` (records of one event share it); None when the text is not a record."""
    text = payload.split(b"\0", 1)[0]
    serial = serial_of(text)
    if serial is None:
        return None
    return serial, fields(text[text.find(b"): ", 6) + 3:])


def serial_of(payload: bytes) -> str | None:
    """The event's ``SECONDS.MILLIS:SERIAL`` alone, without reading the fields: for a
    reader that keeps few of the host's records."""
    if not payload.startswith(b"audit("):
        return None
    end = payload.find(b"): ", 6)
    if end < 0:
        return None
    return payload[6:end].decode("ascii", "replace")


def fields(body: bytes) -> dict[str, str]:
    """``key=value`` pairs of a record's body. Quoted values lose their quotes; unquoted
    values of :data:`UNTRUSTED` keys that are hexadecimal are decoded; a key seen twice
    keeps its first value. Tokens that are not ``key=value`` are skipped."""
    out: dict[str, str] = {}
    for token in body.split(b" "):
        key, sep, value = token.partition(b"=")
        if not sep or not key:
            continue
        name = key.decode("ascii", "replace")
        if name in out:
            continue
        out[name] = _value(name, value)
    return out


def _value(name: str, value: bytes) -> str:
    if len(value) >= 2 and value[:1] == value[-1:] == b'"':
        return value[1:-1].decode("utf-8", "backslashreplace")
    if name in UNTRUSTED and value and len(value) % 2 == 0:
        try:
            return bytes.fromhex(value.decode("ascii")).decode("utf-8", "backslashreplace")
        except ValueError:  # not hex (UnicodeDecodeError is one): a plain token
            pass
    return value.decode("utf-8", "backslashreplace")
