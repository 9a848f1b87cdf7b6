"""Transparent egress: the sandbox's resolver and what the captured connections are.

For tools that ignore the proxy variables (ssh, git://, Go and Rust binaries without proxy
support). The sandbox's setup (step ``egress-capture``) makes the synthetic range local on its
``lo``, binds a UDP socket for the resolver and a TCP listener on 0.0.0.0 for each capture
port, and hands them to the runtime. Then:

* the resolver answers an A query for a name the allow list can match with a synthetic address
  of its own (one per name per run, from ``SYNTHETIC_NET``), AAAA and other types for it with
  no record (NODATA), and every other name NXDOMAIN; each answer is a logged decision;
* a connect() to a synthetic address on a capture port is accepted inside the namespace,
  destination kept; the proxy (``EgressProxy``) maps the address back to its name and decides
  on (name, port) with the same rules as a proxied request, then dials from the host;
* an allow entry that is an IP address or a CIDR (``10.1.2.3:5432``, ``10.0.0.0/8:443``,
  ``[2001:db8::7]:22``) is captured too (:func:`capture_nets`): its addresses are made local
  on lo the same way, its ports are capture ports, and a connection to it is decided by its
  address, as a proxied request to that address would be, then relayed to that address;
  loopback (127.0.0.0/8, ::1) is local already, and a connection to it on a capture port is
  decided the same way (the host's loopback, reached only when the allow list names it);
* every other address still has no route (ENETUNREACH): raw IPs not in the allow list, UDP
  other than the resolver, fail closed, as before.
"""
from __future__ import annotations

import datetime
import ipaddress
import threading
from typing import Any, Callable

from ..protocol import CAPTURE_NETS_MAX, CAPTURE_PORTS_MAX, PROXY_ADDRESS, SYNTHETIC_NET
from . import dnswire
from .hosts import DEFAULT_PORTS, EgressPolicy

#: The time-to-live of a synthetic answer: the mapping lasts the run, so any is safe; short
#: keeps a stale cache (a tool kept across runs) from outliving its run by much.
TTL = 60


def capture_ports(policy: EgressPolicy) -> tuple[int, ...]:
    """The TCP ports to capture: every port a name pattern of the allow list opens (80 and
    443 for one written without a port), sorted, at most CAPTURE_PORTS_MAX (the lowest). A
    ``:*`` pattern captures only the ports other patterns name: a listener per port of 65535
    is not made; such tools use the proxy variables. The proxy's own port is never captured
    (the proxy listens there; a name on that port is reached through the proxy)."""
    ports: set[int] = set()
    for rule in policy.allow:
        if rule.kind in ("name", "suffix") or rule.net is not None and capturable(rule.net):
            ports |= DEFAULT_PORTS if rule.ports is None else rule.ports
    ports.discard(PROXY_ADDRESS[1])
    return tuple(sorted(ports))[:CAPTURE_PORTS_MAX]


#: IPv4 blocks never made local on lo: "this network", loopback (local already), multicast
#: and the reserved 240/4 (which cannot be a unicast destination), the synthetic range.
_NOT_LOCAL_V4 = tuple(ipaddress.IPv4Network(n) for n in (
    "0.0.0.0/8", "127.0.0.0/8", "224.0.0.0/4", "240.0.0.0/4", "%s/%d" % SYNTHETIC_NET))
#: The shortest IPv4 prefix made local: a broader entry (0.0.0.0/0) would make every address
#: local and swallow the no-route answer of every other one; use the proxy variables for it.
MIN_PREFIX_V4 = 8


def capturable(net: "ipaddress.IPv4Network | ipaddress.IPv6Network") -> bool:
    """Whether connections to ``net`` (an allow entry's) are captured: loopback (local
    already), an IPv4 block of at least /MIN_PREFIX_V4 outside :data:`_NOT_LOCAL_V4`, or a
    single IPv6 address that is not multicast or link-local (an IPv6 prefix on lo makes
    only its one address local, so a /64 cannot be captured this way)."""
    if isinstance(net, ipaddress.IPv4Network):
        if net.subnet_of(ipaddress.IPv4Network("127.0.0.0/8")):
            return True
        return net.prefixlen >= MIN_PREFIX_V4 and not any(net.overlaps(n) for n in _NOT_LOCAL_V4)
    address = net.network_address
    if address.ipv4_mapped is not None:
        return capturable(ipaddress.IPv4Network(address.ipv4_mapped))
    return net.prefixlen == 128 and not (address.is_multicast or address.is_link_local
                                         or address.is_unspecified)


def capture_nets(policy: EgressPolicy) -> tuple[tuple[bytes, int], ...]:
    """The allow entries' networks the egress-capture step makes local on lo (address text,
    prefix length), at most CAPTURE_NETS_MAX, in the allow list's order; loopback is left out
    (local already), and so is what :func:`capturable` refuses."""
    out: dict[tuple[bytes, int], None] = {}
    for rule in policy.allow:
        net = rule.net
        if net is None or not capturable(net):
            continue
        if isinstance(net, ipaddress.IPv6Network) and net.network_address.ipv4_mapped:
            net = ipaddress.IPv4Network(net.network_address.ipv4_mapped)
        if net.is_loopback or (isinstance(net, ipaddress.IPv4Network)
                               and net.subnet_of(ipaddress.IPv4Network("127.0.0.0/8"))):
            continue
        out[(str(net.network_address).encode(), net.prefixlen)] = None
    return tuple(out)[:CAPTURE_NETS_MAX]


class SyntheticNames:
    """The run's fake-IP map: one synthetic IPv4 address per name, handed out in order from
    the range's first host address, never reused within the run."""

    def __init__(self, net: str = "%s/%d" % SYNTHETIC_NET) -> None:
        self.net = ipaddress.IPv4Network(net)
        self._by_name: dict[str, ipaddress.IPv4Address] = {}
        self._by_address: dict[ipaddress.IPv4Address, str] = {}
        self._next = int(self.net.network_address) + 1
        self._lock = threading.Lock()

    def address_of(self, name: str) -> ipaddress.IPv4Address | None:
        """``name``'s synthetic address (a new one the first time); None when the range is
        used up (the broadcast address is never handed out)."""
        with self._lock:
            found = self._by_name.get(name)
            if found is not None:
                return found
            if self._next >= int(self.net.broadcast_address):
                return None
            address = ipaddress.IPv4Address(self._next)
            self._next += 1
            self._by_name[name], self._by_address[address] = address, name
            return address

    def name_of(self, address: str) -> str | None:
        """The name a synthetic address was given to in this run, if any."""
        try:
            key = ipaddress.IPv4Address(address)
        except ValueError:
            return None
        with self._lock:
            return self._by_address.get(key)

    def holds(self, address: str) -> bool:
        try:
            return ipaddress.IPv4Address(address) in self.net
        except ValueError:
            return False


def name_allowed(policy: EgressPolicy, name: str) -> str | None:
    """Why the resolver may answer ``name`` (the allow rule that can match it on some port),
    or None. A deny rule for every port of the name wins; a port-specific deny is left to the
    connection's own decision."""
    for rule in policy.deny:
        if rule.ports is None and rule.matches_name(name, 1):
            return None
    for rule in policy.allow:
        if rule.kind in ("name", "suffix") and (
                rule.matches_name(name, next(iter(rule.ports)) if rule.ports else 1)):
            return rule.text
    return None


class Resolver:
    """Answers the sandbox's DNS queries (one datagram in, at most one out) and logs each
    answer as a decision, with the keys of the proxy's records (protocol ``dns``)."""

    def __init__(self, policy: EgressPolicy, names: SyntheticNames,
                 log: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.policy, self.names, self.log = policy, names, log
        self.queries = 0

    def respond(self, data: bytes, client: str) -> bytes | None:
        """The answer to one query datagram (None: send nothing)."""
        self.queries += 1
        try:
            q = dnswire.parse_query(data)
        except dnswire.DnsError as exc:
            self._log(client, None, None, False, f"unreadable DNS query: {exc}",
                      None if exc.rcode is None else dnswire.RCODE_NAMES[exc.rcode])
            return None if exc.rcode is None else dnswire.error_answer(data, exc.rcode)
        qtype = {dnswire.TYPE_A: "A", dnswire.TYPE_AAAA: "AAAA"}.get(q.qtype, f"TYPE{q.qtype}")
        if q.qclass != dnswire.CLASS_IN:
            return self._reply(q, client, qtype, dnswire.REFUSED, None, False,
                               f"class {q.qclass} is not IN")
        if q.name is None:
            return self._reply(q, client, qtype, dnswire.NXDOMAIN, None, False,
                               f"{q.raw_name!r} is not a valid host name")
        rule = name_allowed(self.policy, q.name)
        if rule is None:
            return self._reply(q, client, qtype, dnswire.NXDOMAIN, None, False,
                               f"{q.name} is not in allow_hosts")
        if q.qtype != dnswire.TYPE_A:
            return self._reply(q, client, qtype, dnswire.NOERROR, None, True,
                               f"{q.name} allowed by rule {rule!r}; {qtype}: no record "
                               "(only IPv4 synthetic addresses are given)")
        address = self.names.address_of(q.name)
        if address is None:
            return self._reply(q, client, qtype, dnswire.SERVFAIL, None, False,
                               f"no synthetic address left in {self.names.net}")
        return self._reply(q, client, qtype, dnswire.NOERROR, address, True,
                           f"{q.name} allowed by rule {rule!r}")

    def _reply(self, q: dnswire.Question, client: str, qtype: str, rcode: int,
               address: ipaddress.IPv4Address | None, allowed: bool, reason: str) -> bytes:
        response = f"{dnswire.RCODE_NAMES[rcode]} {qtype}" + (
            f" {address}" if address is not None else "")
        self._log(client, q.name or q.raw_name, str(address) if address else None, allowed,
                  reason, response)
        return dnswire.answer(q, rcode, address, TTL)

    def _log(self, client: str, host: str | None, address: str | None, allowed: bool,
             reason: str, response: str | None) -> None:
        if self.log is None:
            return
        now = datetime.datetime.now(datetime.timezone.utc)
        self.log({"time": now.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                  "client": client, "protocol": "dns", "host": host, "port": None,
                  "allowed": allowed, "reason": reason, "address": address,
                  "response": response or "none"})
