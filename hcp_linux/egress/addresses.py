"""Which IP addresses are not "the public internet", and why.

The egress proxy runs in the host's network namespace, so every address it dials is seen from
the host: 127.0.0.1 there is the host's own loopback (its databases, its Docker API, the
runtime's own ports), 169.254.169.254 is the cloud metadata service holding the machine's
credentials, 10.0.0.0/8 is the office LAN. A sandbox allowed to reach ``example.com`` must not
reach those because example.com's DNS says so (DNS rebinding), nor by writing the address in an
odd way. So every address the proxy would dial is classified here; a non-public one is refused
unless the allow list names it (or a block inside its range) as an IP or CIDR.

The table is ours rather than ``ipaddress``'s ``is_private``/``is_global``: those changed meaning
across Python patch releases (3.11.10, 3.12.4), and a security decision must not move with the
interpreter. Ranges follow the IANA special-purpose registries (RFC 6890 and successors), plus the
cloud metadata endpoints, which get their own category so that only listing the exact address
unlocks them (a broad ``169.254.0.0/16`` does not).

IPv6 forms that carry an IPv4 address (IPv4-mapped ``::ffff:a.b.c.d``, NAT64 ``64:ff9b::/96``,
6to4 ``2002::/16``) are judged by the IPv4 address they carry: a NAT64 gateway would turn
``64:ff9b::a9fe:a9fe`` into 169.254.169.254.
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Union

IPAddress = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]
IPNetwork = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]

#: Categories a caller may want to name in a message or count in a receipt.
METADATA = "cloud metadata"
LOOPBACK = "loopback"
PRIVATE = "private"
LINK_LOCAL = "link-local"
SHARED = "shared address space (CGNAT)"
UNSPECIFIED = "unspecified"
MULTICAST = "multicast"
BROADCAST = "broadcast"
RESERVED = "reserved"
DOCUMENTATION = "documentation"


@dataclass(frozen=True)
class Special:
    """Why an address is not public: its category and the registry block it falls in.

    ``block`` is what an allow rule must lie inside to unlock the address (see `unlocked_by`).
    """

    category: str
    block: IPNetwork


def _table(rows: list[tuple[str, str]]) -> tuple[tuple[IPNetwork, str], ...]:
    return tuple((ipaddress.ip_network(net), cat) for net, cat in rows)


# Order matters: the first containing block names the category (metadata before link-local,
# broadcast before the reserved 240/4, loopback before the IPv4-compatible ::/96).
_V4 = _table([
    ("169.254.169.254/32", METADATA),   # AWS, GCP, Azure, OpenStack, Oracle, DigitalOcean
    ("169.254.170.2/32", METADATA),     # AWS ECS task credentials
    ("100.100.100.200/32", METADATA),   # Alibaba Cloud
    ("192.0.0.192/32", METADATA),       # Oracle Cloud (classic)
    ("0.0.0.0/8", UNSPECIFIED),         # "this network"; 0.0.0.0 reaches the local host on Linux
    ("10.0.0.0/8", PRIVATE),
    ("100.64.0.0/10", SHARED),
    ("127.0.0.0/8", LOOPBACK),
    ("169.254.0.0/16", LINK_LOCAL),
    ("172.16.0.0/12", PRIVATE),
    ("192.0.0.0/24", RESERVED),         # IETF protocol assignments
    ("192.0.2.0/24", DOCUMENTATION),
    ("192.88.99.0/24", RESERVED),       # 6to4 relay anycast (deprecated)
    ("192.168.0.0/16", PRIVATE),
    ("198.18.0.0/15", RESERVED),        # benchmarking
    ("198.51.100.0/24", DOCUMENTATION),
    ("203.0.113.0/24", DOCUMENTATION),
    ("224.0.0.0/4", MULTICAST),
    ("255.255.255.255/32", BROADCAST),
    ("240.0.0.0/4", RESERVED),
])

_V6 = _table([
    ("fd00:ec2::254/128", METADATA),    # AWS IMDS over IPv6
    ("::/128", UNSPECIFIED),
    ("::1/128", LOOPBACK),
    ("::/96", RESERVED),                # IPv4-compatible (deprecated)
    ("64:ff9b:1::/48", PRIVATE),        # NAT64, local use
    ("100::/64", RESERVED),             # discard-only
    ("2001::/23", RESERVED),            # IETF protocol assignments (Teredo, ORCHID, ...)
    ("2001:db8::/32", DOCUMENTATION),
    ("3fff::/20", DOCUMENTATION),
    ("5f00::/16", RESERVED),            # SRv6 SIDs
    ("fc00::/7", PRIVATE),              # unique local
    ("fe80::/10", LINK_LOCAL),
    ("fec0::/10", PRIVATE),             # site-local (deprecated)
    ("ff00::/8", MULTICAST),
])

_GLOBAL_UNICAST_V6 = ipaddress.IPv6Network("2000::/3")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_SIX_TO_FOUR = ipaddress.IPv6Network("2002::/16")


def canonical(address: IPAddress) -> IPAddress:
    """The address as it will be dialled: an IPv4-mapped IPv6 address becomes its IPv4 form."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def classify(address: IPAddress) -> Special | None:
    """`Special` when ``address`` is not a public unicast address, else None."""
    address = canonical(address)
    if isinstance(address, ipaddress.IPv4Address):
        for net, cat in _V4:
            if address in net:
                return Special(cat, net)
        return None
    for net, cat in _V6:
        if address in net:
            return Special(cat, net)
    for wrapper, inner in ((_NAT64, _nat64_inner), (_SIX_TO_FOUR, _six_to_four_inner)):
        if address in wrapper:
            carried = classify(inner(address))
            if carried is not None:
                return Special(f"{carried.category} (carried in {wrapper})", wrapper)
            return None
    if address not in _GLOBAL_UNICAST_V6:
        # Unallocated space: only the exact address, listed, unlocks it.
        return Special(f"{RESERVED} (outside global unicast 2000::/3)",
                       ipaddress.IPv6Network(address))
    return None


def unlocked_by(address: IPAddress, special: Special, net: IPNetwork) -> bool:
    """Whether an allow rule for ``net`` explicitly lists ``address`` despite ``special``.

    The rule must contain the address and lie inside the special block: ``127.0.0.1`` or
    ``127.0.0.0/8`` unlock loopback, ``0.0.0.0/0`` does not (it names "everything", not the
    host's loopback), and a metadata endpoint is unlocked only by its own exact address.
    """
    address = canonical(address)
    if net.version != address.version or address not in net:
        return False
    block = special.block
    if block.version != net.version:
        return False
    return net.subnet_of(block)  # type: ignore[arg-type]  # same version checked above


def _nat64_inner(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address:
    return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)


def _six_to_four_inner(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address:
    inner = address.sixtofour
    assert inner is not None  # only called for addresses inside 2002::/16
    return inner
