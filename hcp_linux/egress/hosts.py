"""Egress allow/deny patterns and the policy decision.

Pattern syntax (``--allow-host`` / ``--deny-host``, ``allow_hosts`` / ``deny_hosts`` in TOML)::

    example.com            that host name exactly (not its subdomains)
    *.example.com          any subdomain of example.com, at any depth -- NOT example.com itself
                           (write both patterns to get both)
    203.0.113.7            an IPv4 literal (strict dotted quad)
    [2001:db8::7]          an IPv6 literal; brackets are needed only to add a port, so
    2001:db8::7            is the same rule
    10.0.0.0/8             a CIDR (host bits must be zero); fd00::/8 or [fd00::/8]:443 for IPv6

each optionally followed by a port: ``:443`` (1..65535, no leading zeros) or ``:*`` (any port).

Port rule -- the safe default for each list:

* in the allow list, a pattern without a port allows ports 80 and 443 only; any other port
  must be written (``:8080``) or opened explicitly with ``:*``;
* in the deny list, a pattern without a port denies every port.

The deny list wins over the allow list. Name patterns match names, never IP literals: a request
for ``http://203.0.113.7/`` needs an IP/CIDR rule. IP/CIDR rules in the allow list also *unlock*
non-public addresses (loopback, private, link-local, CGNAT, cloud metadata, ...) that a name
resolves to: allowing ``db.internal`` is not enough to reach 10.1.2.3 -- ``10.1.2.3`` or
``10.0.0.0/8`` (with a matching port) must be listed too; see `addresses` for the table.

Host names are validated by :mod:`.hostnames`, in patterns and in requests alike.

`EgressPolicy.check` resolves a name once and returns the addresses it allowed; the proxy dials
only those, so the answer that was judged is the answer that is used. Every address a name
resolves to must be allowed, with one exception: when the allow list unlocks one of the name's
loopback addresses (``127.0.0.1``), its other loopback addresses (``::1``, as a stock
/etc/hosts gives ``localhost`` both) are left out rather than refusing the name.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import ipaddress
import socket
import threading
from dataclasses import dataclass, field
from typing import Callable, Iterable, Literal, Sequence

from ..errors import PolicyError
from .addresses import LOOPBACK, IPAddress, IPNetwork, canonical, classify, unlocked_by
from .hostnames import (DECIMAL, DOTTED_CHARS, HostError, format_host, normalize_name, parse_host,
                        parse_ipv4, parse_ipv6, parse_port, safe_text, short_number)

#: The ports a port-less allow pattern opens.
DEFAULT_PORTS: frozenset[int] = frozenset({80, 443})

#: A resolver maps (name, port) to IP address strings; `system_resolver` by default. Tests
#: inject one to make "evil.test resolves to 127.0.0.1" true without DNS.
Resolver = Callable[[str, int], Sequence[str]]


def system_resolver(name: str, port: int) -> list[str]:
    """Resolve with the host's getaddrinfo (TCP only).

    The name is passed as ASCII bytes so that Python's IDNA codec never gets to reinterpret it.
    """
    infos = socket.getaddrinfo(name.encode("ascii"), port, type=socket.SOCK_STREAM,
                               proto=socket.IPPROTO_TCP)
    return [str(info[4][0]) for info in infos]


# -- patterns --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Pattern:
    """One parsed allow or deny rule. ``ports`` None means any port."""

    text: str                                   # as written, for messages
    kind: Literal["name", "suffix", "net"]
    name: str | None = None                     # "name": the host; "suffix": the parent domain
    net: IPNetwork | None = None
    ports: frozenset[int] | None = None

    def port_ok(self, port: int) -> bool:
        return self.ports is None or port in self.ports

    def matches_name(self, name: str, port: int) -> bool:
        if not self.port_ok(port):
            return False
        if self.kind == "name":
            return name == self.name
        if self.kind == "suffix":
            return name.endswith("." + str(self.name))
        return False

    def matches_address(self, address: IPAddress, port: int) -> bool:
        return (self.kind == "net" and self.net is not None and self.port_ok(port)
                and self.net.version == address.version and address in self.net)

    def canonical(self) -> str:
        """Normalised spelling, ports spelled out (``example.com:80,443``)."""
        if self.kind == "net":
            assert self.net is not None
            host = (str(self.net.network_address) if self.net.num_addresses == 1
                    else str(self.net))
            host = f"[{host}]" if self.net.version == 6 else host
        else:
            host = ("*." if self.kind == "suffix" else "") + str(self.name)
        ports = "*" if self.ports is None else ",".join(str(p) for p in sorted(self.ports))
        return f"{host}:{ports}"


def parse_pattern(text: str, *, deny: bool = False) -> Pattern:
    """Parse one rule; `PolicyError` naming the rule and the reason when it is malformed."""
    which = "deny" if deny else "allow"
    if not isinstance(text, str):
        raise PolicyError(f"egress {which} pattern must be a string, not {type(text).__name__}")
    try:
        return _parse_pattern(text, deny)
    except HostError as exc:
        raise PolicyError(f"invalid egress {which} pattern {safe_text(text, 1024)}: {exc}") from None


def _parse_pattern(text: str, deny: bool) -> Pattern:
    if not text:
        raise HostError("empty pattern")
    if "://" in text:
        raise HostError(_not_a_url(text))
    if "@" in text:
        raise HostError("user@host (userinfo) is not allowed")
    is_v6 = False
    port_spec: str | None = None
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise HostError("unclosed '['")
        body, rest, is_v6 = text[1:end], text[end + 1:], True
        if rest:
            if not rest.startswith(":"):
                raise HostError("unexpected text after ']'")
            port_spec = rest[1:]
    elif text.count(":") >= 2:
        body, is_v6 = text, True  # an unbracketed IPv6 literal or CIDR carries no port
    else:
        body, sep, after = text.partition(":")
        port_spec = after if sep else None
    ports = _parse_port_spec(port_spec, deny)
    if "/" in body:
        return Pattern(text, "net", net=_parse_cidr(body), ports=ports)
    if is_v6:
        return Pattern(text, "net", net=ipaddress.ip_network(parse_ipv6(body)), ports=ports)
    if body.startswith("*."):
        return Pattern(text, "suffix", name=normalize_name(body[2:]), ports=ports)
    if "*" in body:
        raise HostError("'*' is allowed only as a whole leading label, as in *.example.com "
                        "(a bare '*' is refused: list the hosts)")
    host = parse_host(body)
    if isinstance(host, str):
        return Pattern(text, "name", name=host, ports=ports)
    return Pattern(text, "net", net=ipaddress.ip_network(host), ports=ports)


def _not_a_url(text: str) -> str:
    """What to write instead of a URL (``https://example.com:8443/x``): its host, and port
    when it names one; the scheme's port is what a port-less pattern opens (80, 443)."""
    import urllib.parse
    try:
        url = urllib.parse.urlsplit(text)
        host, port = url.hostname, url.port
    except ValueError:
        host, port = None, None
    if not host:
        return "give a host, not a URL"
    shown = (f"[{host}]" if ":" in host else host) + (f":{port}" if port else "")
    return (f"give a host, not a URL: {safe_text(shown)}"
            + ("" if port else " (ports 80 and 443; add :PORT for another)"))


def _parse_port_spec(spec: str | None, deny: bool) -> frozenset[int] | None:
    if spec is None:
        return None if deny else DEFAULT_PORTS
    if spec == "*":
        return None
    return frozenset({parse_port(spec)})


def _parse_cidr(text: str) -> IPNetwork:
    address_text, _, prefix = text.partition("/")
    if not address_text or not set(address_text) <= DOTTED_CHARS | set("0123456789abcdefABCDEF:%"):
        raise HostError("only an IP address may precede '/' (CIDR); host names take no path")
    address: IPAddress = (parse_ipv6(address_text) if ":" in address_text
                          else parse_ipv4(address_text))
    if ":" in prefix:
        raise HostError("to give an IPv6 CIDR a port, bracket it: [fd00::/8]:443")
    if not DECIMAL.match(prefix) or (len(prefix) > 1 and prefix[0] == "0"):
        raise HostError(f"prefix length {safe_text(prefix, 20)} is not a decimal number")
    if len(prefix) > 3 or int(prefix) > address.max_prefixlen:  # int() of 4301+ digits raises
        raise HostError(f"prefix length {short_number(prefix)} exceeds {address.max_prefixlen}")
    try:
        return ipaddress.ip_network(f"{address}/{prefix}", strict=True)
    except ValueError:
        base = ipaddress.ip_network(f"{address}/{prefix}", strict=False)
        raise HostError(f"host bits set (did you mean {base}?)") from None


# -- decisions -------------------------------------------------------------------------------

DecisionKind = Literal["allowed", "denied", "invalid", "unresolved", "timeout"]


@dataclass(frozen=True)
class Decision:
    """The verdict on one (host, port) request.

    ``addresses`` are the addresses checked (for an allowed request: exactly those the proxy
    may dial, in resolver order). ``kind`` tells the proxy which error to answer: ``denied``
    → 403, ``invalid`` → 400, ``unresolved`` → 502, ``timeout`` → 504.
    """

    allowed: bool
    reason: str
    addresses: tuple[str, ...] = ()
    kind: DecisionKind = "denied"
    rule: str | None = None  # the pattern (as written) that allowed or denied, if any


@dataclass(frozen=True)
class _Pending:
    """A name that passed the name rules and must now be resolved and its addresses checked."""

    name: str
    port: int
    rule: Pattern


@dataclass(frozen=True)
class EgressPolicy:
    """Immutable allow/deny rules plus the resolver used to check names."""

    allow: tuple[Pattern, ...]
    deny: tuple[Pattern, ...] = ()
    resolver: Resolver = field(default=system_resolver, compare=False, repr=False)
    resolve_timeout: float = 5.0

    @classmethod
    def parse(cls, allow: Sequence[str], deny: Sequence[str] = (), *,
              resolver: Resolver | None = None, resolve_timeout: float = 5.0) -> EgressPolicy:
        """Parse every rule, reporting the first malformed one with `PolicyError`."""
        for seq, which in ((allow, "allow"), (deny, "deny")):
            if isinstance(seq, (str, bytes)):
                raise PolicyError(f"egress {which} list must be a list of patterns, "
                                  "not a single string")
            if not isinstance(seq, Iterable):
                raise PolicyError(f"egress {which} list must be a list of patterns, "
                                  f"not {type(seq).__name__}")
        # Bounded: a thread's join() overflows past threading.TIMEOUT_MAX.
        if isinstance(resolve_timeout, bool) or not isinstance(resolve_timeout, (int, float)) \
                or not 0 < resolve_timeout <= threading.TIMEOUT_MAX:
            raise PolicyError(f"resolve timeout must be positive seconds (at most "
                              f"{threading.TIMEOUT_MAX:g}), not {resolve_timeout!r}")
        return cls(tuple(parse_pattern(p) for p in allow),
                   tuple(parse_pattern(p, deny=True) for p in deny),
                   resolver or system_resolver, float(resolve_timeout))

    def describe(self) -> dict[str, list[str]]:
        """The rules in canonical spelling, for a receipt."""
        return {"allow": [p.canonical() for p in self.allow],
                "deny": [p.canonical() for p in self.deny]}

    # The check is split so that the sync and async callers share everything except how the
    # resolver is waited for.

    def check(self, host: str, port: int) -> Decision:
        """Decide on ``host:port``, resolving a name at most once (bounded by resolve_timeout)."""
        step = self._precheck(host, port)
        if isinstance(step, Decision):
            return step
        box: dict[str, object] = {}

        def run() -> None:
            try:
                box["ok"] = self.resolver(step.name, step.port)
            except Exception as exc:  # noqa: BLE001 - reported in the decision
                box["err"] = exc

        worker = threading.Thread(target=run, name="egress-resolve", daemon=True)
        worker.start()
        worker.join(self.resolve_timeout)
        if worker.is_alive():
            return self._timed_out(step)
        if "err" in box:
            return self._unresolved(step, box["err"])
        return self._postcheck(step, box["ok"])  # type: ignore[arg-type]

    async def check_async(self, host: str, port: int,
                          executor: concurrent.futures.Executor | None = None) -> Decision:
        """`check` for an event loop: the resolver runs in ``executor`` (default: the loop's)."""
        step = self._precheck(host, port)
        if isinstance(step, Decision):
            return step
        loop = asyncio.get_running_loop()
        try:
            found = await asyncio.wait_for(
                loop.run_in_executor(executor, self.resolver, step.name, step.port),
                self.resolve_timeout)
        except asyncio.TimeoutError:
            return self._timed_out(step)
        except Exception as exc:  # noqa: BLE001 - reported in the decision
            return self._unresolved(step, exc)
        return self._postcheck(step, found)

    def _precheck(self, host: str, port: int) -> Decision | _Pending:
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            return Decision(False, f"invalid port {port!r}", kind="invalid")
        if not isinstance(host, str):
            return Decision(False, f"invalid host {host!r}", kind="invalid")
        try:
            parsed = parse_host(host)
        except HostError as exc:
            return Decision(False, f"invalid host {safe_text(host)}: {exc}", kind="invalid")
        if isinstance(parsed, str):
            for rule in self.deny:
                if rule.matches_name(parsed, port):
                    return _denied(f"{parsed}:{port} denied by rule {rule.text!r}", rule)
            for rule in self.allow:
                if rule.matches_name(parsed, port):
                    return _Pending(parsed, port, rule)
            return _denied(f"no allow rule matches {parsed}:{port}")
        address = canonical(parsed)
        target = f"{format_host(address)}:{port}"
        for rule in self.deny:
            if rule.matches_address(address, port):
                return _denied(f"{target} denied by rule {rule.text!r}", rule, address)
        for rule in self.allow:
            if rule.matches_address(address, port):
                refusal = self._special_refusal(address, port, target)
                if refusal is not None:
                    return refusal
                return Decision(True, f"{target} allowed by rule {rule.text!r}", (str(address),),
                                "allowed", rule.text)
        return _denied(f"no allow rule matches {target}", address=address)

    def _postcheck(self, step: _Pending, found: Sequence[str]) -> Decision:
        addresses: list[IPAddress] = []
        for text in found:
            try:
                address = canonical(ipaddress.ip_address(str(text).split("%", 1)[0]))
            except ValueError:
                return Decision(False, f"{step.name} resolves to an unparsable address "
                                       f"{safe_text(str(text))}", kind="unresolved")
            if address not in addresses:
                addresses.append(address)
        if not addresses:
            return Decision(False, f"{step.name} resolves to no address", kind="unresolved")
        shown = tuple(str(a) for a in addresses)
        refused: list[tuple[IPAddress, Decision]] = []
        for address in addresses:
            where = f"{step.name} resolves to {address}"
            for rule in self.deny:
                if rule.matches_address(address, step.port):
                    return Decision(False, f"{where}, denied by rule {rule.text!r}", shown,
                                    "denied", rule.text)
            refusal = self._special_refusal(address, step.port, where)
            if refusal is not None:
                refused.append((address, refusal))
        # The host's loopback has two names, 127.0.0.1 and ::1, and a stock /etc/hosts gives
        # `localhost` both: when the allow list unlocks one of a name's loopback addresses,
        # its other loopback addresses are the same host's, so they are left undialled
        # rather than refusing the name. Any other refused address still refuses the name.
        skipped = [a for a, _ in refused if _loopback(a) and any(
            _loopback(b) for b in addresses if all(b != r for r, _ in refused))]
        for address, refusal in refused:
            if address not in skipped:
                return Decision(False, refusal.reason, shown, "denied")
        reason = f"{step.name}:{step.port} allowed by rule {step.rule.text!r}"
        if skipped:
            reason += (f" (not dialled: {', '.join(str(a) for a in skipped)}, loopback the "
                       f"allow list does not name with port {step.port})")
        return Decision(True, reason, tuple(str(a) for a in addresses if a not in skipped),
                        "allowed", step.rule.text)

    def _special_refusal(self, address: IPAddress, port: int, what: str) -> Decision | None:
        special = classify(address)
        if special is None:
            return None
        for rule in self.allow:
            if rule.net is not None and rule.port_ok(port) and unlocked_by(address, special,
                                                                           rule.net):
                return None
        return _denied(f"{what}: a {special.category} address ({special.block}), refused unless "
                       f"the allow list names it as an IP or a CIDR inside {special.block} "
                       f"with port {port}", address=address)

    def _timed_out(self, step: _Pending) -> Decision:
        return Decision(False, f"resolving {step.name} timed out after "
                               f"{self.resolve_timeout:g} s", kind="timeout")

    def _unresolved(self, step: _Pending, exc: object) -> Decision:
        return Decision(False, f"cannot resolve {step.name}: {exc}", kind="unresolved")


def _loopback(address: IPAddress) -> bool:
    special = classify(address)
    return special is not None and special.category == LOOPBACK


def _denied(reason: str, rule: Pattern | None = None,
            address: IPAddress | None = None) -> Decision:
    return Decision(False, reason, (str(address),) if address is not None else (), "denied",
                    rule.text if rule else None)
