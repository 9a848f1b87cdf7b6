"""Which connect() and send destinations find no route in the sandbox's network namespace.

Under network = "allow" the namespace has ``lo`` only: 127.0.0.0/8 and ::1 on it, and the
egress-capture step makes the synthetic range (``SYNTHETIC_NET``) local on it too. Every other
address has no route, and connect() fails ENETUNREACH: raw IPs never reach the network, only
allowed names do (through the resolver and the capture). The listener records those attempts
(:class:`hcp_linux.observe.denials.SeccompListener`); this module says which they are, from the
sockaddr the call named. Measured in such a namespace (TCP and UDP connect, non-blocking):

* reached: 0.0.0.0 (the local host), 127.0.0.0/8, 198.18.0.0/15, ::, ::1, and the
  v4-mapped ::ffff:a.b.c.d of those; their broadcast addresses (127.255.255.255 ...) fail
  otherwise (ENETUNREACH for TCP, EACCES for UDP), as local broadcasts, not as raw egress;
* no route (ENETUNREACH): every other IPv4 address (multicast and 255.255.255.255 too), every
  other IPv6 address but link-local fe80::/10 (EINVAL: no scope) and multicast ff00::/8
  (EINVAL for UDP), which are left to the kernel, unrecorded.

Conservative by construction: an address this module does not name is not recorded, and
nothing here decides the call (the kernel does, by its routes).

The sends that name a destination (sendto(), sendmsg(), sendmmsg()) reach the same routes,
but only some sockets use it: :func:`send_uses_address` says which (measured there). A
sendmsg()'s destination is behind a ``struct msghdr`` in the caller's memory, untrusted
bytes that :func:`msg_names` reads without ever raising.
"""
from __future__ import annotations

import ipaddress
import socket
import struct

from ..protocol import SYNTHETIC_NET

#: The bytes of a sockaddr worth reading: sockaddr_in6's 28 (sockaddr_in is 16).
SOCKADDR_MAX = 28
#: sizeof(struct sockaddr_storage): a longer address the kernel refuses (EINVAL) unread.
SOCKADDR_STORAGE = 128
#: struct msghdr {void *msg_name; socklen_t msg_namelen; struct iovec *msg_iov; ...} and
#: struct mmsghdr {struct msghdr msg_hdr; unsigned int msg_len;} on the 64-bit machines
#: this package supports (seccomp_profiles.machines): the name pointer at 0, its length (a
#: u32) at 8, in the machine's byte order.
MSGHDR_SIZE = 56
MMSGHDR_SIZE = 64
#: sendmmsg() entries read per call: the first 8 (a vector may hold 1024, UIO_MAXIOV).
MMSG_READ = 8
_NAME = struct.Struct("=QI")
_MSG_FASTOPEN = 0x20000000
_V4_MIN, _V6_MIN = 16, 24  # shorter ones the kernel refuses (EINVAL) before any route
_SYN_NET = struct.unpack("!I", socket.inet_aton(SYNTHETIC_NET[0]))[0]
_SYN_MASK = (0xFFFFFFFF << (32 - SYNTHETIC_NET[1])) & 0xFFFFFFFF
_MAPPED = b"\0" * 10 + b"\xff\xff"


def _v4_reached(addr: int) -> bool:
    return addr == 0 or addr >> 24 == 127 or addr & _SYN_MASK == _SYN_NET


def _local(address: str, local: tuple[tuple[bytes, int], ...]) -> bool:
    """Whether ``address`` lies in one of ``local`` (the plan's ``capture_nets``: the allow
    list's networks the egress-capture step made local on lo)."""
    if not local:
        return False
    parsed = ipaddress.ip_address(address)
    return any(parsed in ipaddress.ip_network("%s/%d" % (net.decode(), prefix))
               for net, prefix in local)


def unrouted(sockaddr: bytes, local: tuple[tuple[bytes, int], ...] = ()
             ) -> tuple[str, int] | None:
    """(address, port) when a connect() to ``sockaddr`` (the call's own bytes, its length
    as the call gave it, at most :data:`SOCKADDR_MAX`) finds no route in the sandbox's
    namespace; None for every other destination (AF_UNIX, loopback, synthetic, the allow
    list's captured networks ``local``, a sockaddr too short, an address this module leaves
    to the kernel)."""
    if len(sockaddr) < 2:
        return None
    family = struct.unpack_from("=H", sockaddr)[0]
    if family == socket.AF_INET and len(sockaddr) >= _V4_MIN:
        port, addr = struct.unpack_from("!HI", sockaddr, 2)
        text = socket.inet_ntoa(sockaddr[4:8])
        if _v4_reached(addr) or _local(text, local):
            return None
        return text, port
    if family == socket.AF_INET6 and len(sockaddr) >= _V6_MIN:
        port = struct.unpack_from("!H", sockaddr, 2)[0]
        raw = sockaddr[8:24]
        if raw.startswith(_MAPPED):
            v4 = struct.unpack_from("!I", raw, 12)[0]
            if _v4_reached(v4) or _local(socket.inet_ntoa(raw[12:]), local):
                return None
        elif raw[:15] == b"\0" * 15 and raw[15] in (0, 1):  # :: and ::1
            return None
        elif raw[0] == 0xFF or (raw[0] == 0xFE and raw[1] & 0xC0 == 0x80):
            return None  # multicast, link-local: the kernel's own errors, not "no route"
        text = socket.inet_ntop(socket.AF_INET6, raw)
        if _local(text, local):
            return None
        return text, port
    return None


def msg_names(data: bytes, stride: int) -> list[tuple[int, int]]:
    """(msg_name, msg_namelen) of each whole ``struct msghdr`` (``stride`` MSGHDR_SIZE) or
    ``struct mmsghdr`` (MMSGHDR_SIZE) in ``data``, bytes read from the caller's memory:
    untrusted, possibly cut short (a partial read), never raising. An entry without a name
    (a NULL pointer or a zero length: the socket's peer is used) is (0, 0), and so is one
    whose length is negative as the kernel's int (EINVAL); a length past sockaddr_storage is
    cut to it, as the kernel cuts it (measured: msg_namelen 200 to 192.0.2.1 is ENETUNREACH;
    sendto() refuses such a length EINVAL instead)."""
    if stride < _NAME.size:
        return []
    out = []
    for offset in range(0, len(data) - stride + 1, stride):
        pointer, length = _NAME.unpack_from(data, offset)
        if not pointer or not length or length >= 1 << 31:
            out.append((0, 0))
        else:
            out.append((pointer, min(length, SOCKADDR_STORAGE)))
    return out


def send_uses_address(sock_type: int, domain: int, family: int, flags: int,
                      connected: bool) -> bool:
    """Whether a send with a destination of ``family`` on a socket of ``sock_type`` and
    ``domain`` goes where the destination says, so that no route refuses it ENETUNREACH.
    Measured in the sandbox's namespace (192.0.2.1 and 2001:db8::1):

    * UDP (SOCK_DGRAM): always, connected or not (the destination overrides the peer):
      ENETUNREACH;
    * TCP (SOCK_STREAM): only with MSG_FASTOPEN on a socket not yet connected (a connect
      with data): ENETUNREACH; without it the destination is ignored (connected: the data
      goes to the peer; not: EPIPE), with it on a connected socket EISCONN;
    * anything else (raw, SCTP, another family than the socket's): not recorded, the
      kernel answers it (an AF_INET socket refuses an AF_INET6 address EAFNOSUPPORT)."""
    if domain not in (socket.AF_INET, socket.AF_INET6) or family != domain:
        return False
    if sock_type == socket.SOCK_DGRAM:
        return True
    return sock_type == socket.SOCK_STREAM and bool(flags & _MSG_FASTOPEN) and not connected


def sockaddr_family(sockaddr: bytes) -> int:
    """The family of a sockaddr's bytes (AF_UNSPEC when too short to say)."""
    return struct.unpack_from("=H", sockaddr)[0] if len(sockaddr) >= 2 else socket.AF_UNSPEC
