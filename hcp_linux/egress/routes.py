"""Which connect() destinations find no route in the sandbox's network namespace.

Under network = "allow" the namespace has ``lo`` only: 127.0.0.0/8 and ::1 on it, and the
egress-capture step makes the synthetic range (``SYNTHETIC_NET``) local on it too. Every other
address has no route, and connect() fails ENETUNREACH: raw IPs never reach the network, only
allowed names do (through the resolver and the capture). The listener records those attempts
(:class:`hcp_linux.denials.SeccompListener`); this module says which they are, from the
sockaddr the call named. Measured in such a namespace (TCP and UDP connect, non-blocking):

* reached: 0.0.0.0 (the local host), 127.0.0.0/8, 198.18.0.0/15, ::, ::1, and the
  v4-mapped ::ffff:a.b.c.d of those; their broadcast addresses (127.255.255.255 ...) fail
  otherwise (ENETUNREACH for TCP, EACCES for UDP), as local broadcasts, not as raw egress;
* no route (ENETUNREACH): every other IPv4 address (multicast and 255.255.255.255 too), every
  other IPv6 address but link-local fe80::/10 (EINVAL: no scope) and multicast ff00::/8
  (EINVAL for UDP), which are left to the kernel, unrecorded.

Conservative by construction: an address this module does not name is not recorded, and
nothing here decides the call (the kernel does, by its routes).
"""
from __future__ import annotations

import socket
import struct

from ..protocol import SYNTHETIC_NET

#: The bytes of a sockaddr worth reading: sockaddr_in6's 28 (sockaddr_in is 16).
SOCKADDR_MAX = 28
_V4_MIN, _V6_MIN = 16, 24  # shorter ones the kernel refuses (EINVAL) before any route
_SYN_NET = struct.unpack("!I", socket.inet_aton(SYNTHETIC_NET[0]))[0]
_SYN_MASK = (0xFFFFFFFF << (32 - SYNTHETIC_NET[1])) & 0xFFFFFFFF
_MAPPED = b"\0" * 10 + b"\xff\xff"


def _v4_reached(addr: int) -> bool:
    return addr == 0 or addr >> 24 == 127 or addr & _SYN_MASK == _SYN_NET


def unrouted(sockaddr: bytes) -> tuple[str, int] | None:
    """(address, port) when a connect() to ``sockaddr`` (the call's own bytes, its length
    as the call gave it, at most :data:`SOCKADDR_MAX`) finds no route in the sandbox's
    namespace; None for every other destination (AF_UNIX, loopback, synthetic, a sockaddr
    too short, an address this module leaves to the kernel)."""
    if len(sockaddr) < 2:
        return None
    family = struct.unpack_from("=H", sockaddr)[0]
    if family == socket.AF_INET and len(sockaddr) >= _V4_MIN:
        port, addr = struct.unpack_from("!HI", sockaddr, 2)
        if _v4_reached(addr):
            return None
        return socket.inet_ntoa(sockaddr[4:8]), port
    if family == socket.AF_INET6 and len(sockaddr) >= _V6_MIN:
        port = struct.unpack_from("!H", sockaddr, 2)[0]
        raw = sockaddr[8:24]
        if raw.startswith(_MAPPED):
            if _v4_reached(struct.unpack_from("!I", raw, 12)[0]):
                return None
        elif raw[:15] == b"\0" * 15 and raw[15] in (0, 1):  # :: and ::1
            return None
        elif raw[0] == 0xFF or (raw[0] == 0xFE and raw[1] & 0xC0 == 0x80):
            return None  # multicast, link-local: the kernel's own errors, not "no route"
        return socket.inet_ntop(socket.AF_INET6, raw), port
    return None
