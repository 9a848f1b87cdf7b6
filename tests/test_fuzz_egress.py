"""Property-based fuzzing of the egress proxy's parsers (issue #15, item 3).

Targets: the HTTP request line and headers, CONNECT targets and Host headers, absolute-form
URLs, the request rewrite for the origin, the response-head rewrite, the SOCKS5 handshake,
the resolver's DNS queries (transparent egress: parse, decide, answer), the first bytes of a
captured connection (TLS SNI, HTTP Host), a send's destination as read from a sandboxed
caller's memory (msghdr/mmsghdr vectors, sockaddrs: egress.routes),
host/port/authority parsing, allow/deny patterns, address classification, the policy decision,
and the whole proxy over loopback.

Invariants: each parser returns a well-formed result or raises its documented error
(`HeadError`, `SocksError` or asyncio's `IncompleteReadError` for a short handshake,
`HostError`/`PolicyError`), never another exception; every input is bounded, so nothing
hangs; results stay within their documented bounds (ports 1..65535, host names lower-case
LDH, no IPv4-mapped or zoned IPv6) and round-trip through their own formatting.

No DNS and no network beyond loopback: every resolver is a table of loopback addresses, and
the proxy fuzz allow-lists only an upstream this file starts on 127.0.0.1 (a guard around
the policy refuses, and records, any other verdict before the proxy could dial it).

Example counts: the ``ci`` profile (default; derandomized, so CI is reproducible) runs 200
examples per parser target and 60 through the proxy; ``HYPOTHESIS_PROFILE=long`` runs 10,000
per target (2,000 through the proxy). Add ``--hypothesis-show-statistics`` to see the counts.
"""
from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
import string
import struct
import threading
import time
from typing import Any, Iterator

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import event, example, given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from hcp_linux.egress import dnswire, httpwire, routes, socks  # noqa: E402
from hcp_linux.egress.capture import Resolver, SyntheticNames  # noqa: E402
from hcp_linux.egress.sniff import MAX_MESSAGE, Refused, StreamGuard  # noqa: E402
from hcp_linux.egress.addresses import canonical, classify, unlocked_by  # noqa: E402
from hcp_linux.egress.hostnames import (HostError, format_host, normalize_name,  # noqa: E402
                                        parse_authority, parse_host, parse_ipv4, parse_ipv6,
                                        parse_port)
from hcp_linux.egress.hosts import Decision, EgressPolicy, Pattern, parse_pattern  # noqa: E402
from hcp_linux.egress.httpwire import HeadError  # noqa: E402
from hcp_linux.egress.thread import ProxyThread  # noqa: E402
from hcp_linux.errors import PolicyError  # noqa: E402

# -- profiles -------------------------------------------------------------------------------------

from fuzzing import fuzz  # noqa: E402  (the profiles)


# -- strategies -----------------------------------------------------------------------------------

def one_in(n: int, draw: st.DrawFn) -> bool:
    """True with probability about 1/n."""
    return draw(st.sampled_from(range(n))) == 0


def mostly(valid: st.SearchStrategy[Any], nasty: st.SearchStrategy[Any],
           n: int = 5) -> st.SearchStrategy[Any]:
    """``valid`` four times in five, else ``nasty``: near-valid inputs reach the deep paths."""
    @st.composite
    def pick(draw: st.DrawFn) -> Any:
        return draw(nasty if one_in(n, draw) else valid)
    return pick()


def _mostly_10(valid: st.SearchStrategy[Any], nasty: st.SearchStrategy[Any]
               ) -> st.SearchStrategy[Any]:
    return mostly(valid, nasty, 10)


LDH = string.ascii_letters + string.digits + "-."
_label = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,12}[a-z0-9])?", fullmatch=True)
_tld = st.from_regex(r"[a-z]([a-z0-9-]{0,8}[a-z0-9])?", fullmatch=True)
good_names = st.builds(lambda labels, tld: ".".join(labels + [tld]),
                       st.lists(_label, max_size=4), _tld)
ldh_text = st.text(alphabet=LDH, max_size=80)
ipv4 = st.ip_addresses(v=4).map(str)
ipv6 = st.ip_addresses(v=6).map(str)
odd_hosts = st.sampled_from([
    "", ".", "..", "-", "a-", "-a", "a..b", "a.", "A.B.", "localhost", "LOCALHOST.",
    "127.1", "0x7f.1", "0x7f000001", "2130706433", "0177.0.0.1", "127.0.0.1.", "1.2.3.4.5",
    "01.2.3.4", "256.1.1.1", "1.0x1", "1.2.3", "0", "0.0.0.0", "255.255.255.255",
    "::", "::1", "::2", "::ffff:127.0.0.1", "::ffff:7f00:1", "::127.0.0.1", "64:ff9b::a9fe:a9fe",
    "2002:a9fe:a9fe::1", "fe80::1%eth0", "fe80::1%25eth0", "[::1]", "[::1", "::1]", "[]", "[[::1]]",
    "[127.0.0.1]", "1:2:3:4:5:6:7:8:9", "1::2::3", "fd00:ec2::254", "169.254.169.254",
    "user@example.com", "example.com@evil.test", "exa%6dple.com", "%00", "a\x00b", "a b", "a\tb",
    "a\r\nb", "a\nb", "ex_ample.com", "example.com\\@evil", "аpple.com", "ｅxample.com",
    "example.com\u3002", "EXAMPLE.com", "xn--80ak6aa92e.com", "xn--", "xn--.com", "*",
    "*.example.com", "*.", "**.example.com", "a.*.b", "K.com", "\u212a.com", "ß.de",
    "a" * 63 + ".com", "a" * 64 + ".com", ".".join(["a" * 63] * 4), "a." * 127 + "a",
    "1" * 300, "9" * 5000, "1." * 2000,
])
nasty_text = st.text(st.characters(codec="latin-1"), max_size=40)
unicode_text = st.text(max_size=30)
hosts = st.one_of(good_names, ldh_text, ipv4, ipv6, odd_hosts, nasty_text, unicode_text,
                  st.builds("{}.{}".format, good_names, unicode_text),
                  good_names.map(lambda n: n.upper() + "."),
                  ipv4.map(lambda a: "::ffff:" + a), ipv6.map(lambda a: a + "%eth0"))
ports = st.one_of(
    st.integers(0, 100_000).map(str),
    st.sampled_from(["", "0", "1", "80", "443", "65535", "65536", "99999", "080", "+80", "-1",
                     " 80", "80 ", "8_0", "0x50", "٨٠", "８０", "*", "80,443", "1e3",
                     "9" * 4301, "1" + "0" * 5000]),
    st.text(alphabet="0123456789", min_size=1, max_size=6000),
)


def bracket(host: str) -> str:
    return f"[{host}]"


def _v6_ok(text: str) -> bool:
    a = ipaddress.IPv6Address(text)
    return a.ipv4_mapped is None and not (int(a) >> 32 == 0 and int(a) > 1)


valid_hosts = st.one_of(good_names, good_names.map(str.upper), ipv4,
                        ipv6.filter(_v6_ok).map(bracket))
valid_ports = st.integers(1, 65535).map(str)
valid_authorities = st.builds("{}:{}".format, valid_hosts, valid_ports)


authorities = st.one_of(
    st.builds(lambda h, p: f"{h}:{p}", hosts, ports),
    st.builds(lambda h, p: f"[{h}]:{p}", hosts, ports),
    hosts, hosts.map(bracket),
    st.builds(lambda u, h, p: f"{u}@{h}:{p}", st.text(max_size=8), hosts, ports),
    st.text(max_size=60),
)


def _well_formed_host(host: Any) -> None:
    """What a parsed host may be: a normalised LDH name, or an address as it will be dialled."""
    if isinstance(host, str):
        assert host == host.lower() and 0 < len(host) <= 253, host
        assert set(host) <= set(string.ascii_lowercase + string.digits + "-."), host
        labels = host.split(".")
        assert all(0 < len(lb) <= 63 and lb[0] != "-" and lb[-1] != "-" for lb in labels), host
        assert not labels[-1].isdigit(), host
        assert not host[0].isspace() and host.isprintable()
    elif isinstance(host, ipaddress.IPv6Address):
        assert host.ipv4_mapped is None and host.scope_id is None, host
        assert not (int(host) >> 32 == 0 and int(host) > 1), host
    else:
        assert isinstance(host, ipaddress.IPv4Address), host


# -- hosts, ports, authorities --------------------------------------------------------------------

@fuzz()
@given(hosts)
@example("9" * 5000)
@example("1." * 2000)
def test_parse_host(text: str) -> None:
    try:
        host = parse_host(text)
    except HostError as exc:
        assert "\n" not in str(exc) and str(exc)
        event("HostError")
        return
    event(type(host).__name__)
    _well_formed_host(host)
    assert parse_host(format_host(host)) == host  # round trip
    if isinstance(host, str):
        assert normalize_name(host) == host


@fuzz()
@given(ports)
@example("9" * 4301)
@example("1" + "0" * 5000)
def test_parse_port(text: str) -> None:
    try:
        port = parse_port(text)
    except HostError:
        assert not re.fullmatch(r"[1-9][0-9]{0,4}", text) or not 1 <= int(text) <= 65535
        return
    assert 1 <= port <= 65535 and str(port) == text


@fuzz()
@given(authorities, st.sampled_from([None, 80, 443]))
@example("example.com:" + "9" * 5000, None)
@example("[::1]:" + "1" * 4400, None)
def test_parse_authority(text: str, default: int | None) -> None:
    try:
        host, port = parse_authority(text, default)
    except HostError as exc:
        assert "\n" not in str(exc)
        event("HostError")
        return
    event(f"parsed: {type(host).__name__}")
    _well_formed_host(host)
    assert "@" not in text
    assert 1 <= port <= 65535
    assert parse_authority(f"{format_host(host)}:{port}") == (host, port)


@fuzz()
@given(st.one_of(hosts, st.text(max_size=50)))
def test_ip_literals(text: str) -> None:
    for parse in (parse_ipv4, parse_ipv6):
        try:
            address = parse(text)
        except HostError:
            continue
        _well_formed_host(address)
        assert str(address) == text or parse is parse_ipv6  # IPv4: the strict dotted quad


# -- patterns and decisions -----------------------------------------------------------------------

valid_patterns = st.one_of(
    valid_authorities, good_names, good_names.map(lambda n: f"*.{n}"),
    st.builds(lambda n, p: f"*.{n}:{p}", good_names, st.one_of(valid_ports, st.just("*"))),
    st.builds(lambda a, n: str(ipaddress.ip_network(f"{a}/{n}", strict=False)),
              st.ip_addresses(v=4), st.integers(0, 32)),
    st.builds(lambda a, n: f"[{ipaddress.ip_network(f'{a}/{n}', strict=False)}]:*",
              st.ip_addresses(v=6), st.integers(0, 128)),
    st.sampled_from(sorted(f"{n}:*" for n in ("allowed.test", "rebind.test", "meta.test")))
    | st.just("*.wild.test:*") | st.just("127.0.0.1:80") | st.just("127.0.0.0/8:*"),
)
patterns = st.one_of(
    valid_patterns,
    authorities,
    st.builds(lambda h, p: f"*.{h}:{p}", hosts, ports),
    st.builds(lambda h: f"*.{h}", hosts),
    st.builds(lambda a, n: f"{a}/{n}", st.one_of(ipv4, ipv6, hosts), st.one_of(
        st.integers(-1, 200).map(str), st.sampled_from(["", "08", "9" * 5000, "1_0", "٨"]))),
    st.builds(lambda a, n, p: f"[{a}/{n}]:{p}", ipv6, st.integers(0, 129), ports),
    st.builds(lambda a, n, p: f"{a}/{n}:{p}", ipv4, st.integers(0, 33), ports),
    st.builds(lambda h: f"{h}:*", hosts),
)


@fuzz()
@given(patterns, st.booleans())
@example("10.0.0.0/" + "9" * 5000, False)
@example("[fd00::/8]:" + "9" * 5000, True)
@example("example.com:" + "9" * 5000, False)
def test_parse_pattern(text: str, deny: bool) -> None:
    try:
        pattern = parse_pattern(text, deny=deny)
    except PolicyError as exc:
        assert str(exc).startswith(f"invalid egress {'deny' if deny else 'allow'} pattern")
        assert "\n" not in str(exc) and "\r" not in str(exc) and len(str(exc)) < 1600
        event("PolicyError")
        return
    event(f"pattern: {pattern.kind}")
    assert isinstance(pattern, Pattern) and pattern.text == text
    if pattern.ports is not None:
        assert pattern.ports and all(1 <= p <= 65535 for p in pattern.ports)
    elif not deny:
        assert text.endswith(":*")
    if pattern.kind == "net":
        assert pattern.net is not None and pattern.name is None
    else:
        assert pattern.net is None and pattern.name is not None
        _well_formed_host(pattern.name)
    # The canonical spelling (one port, or '*') parses back to the same rule.
    host_part = pattern.canonical().rsplit(":", 1)[0]
    for spec, expected in (("*", None), ("8443", frozenset({8443}))):
        again = parse_pattern(f"{host_part}:{spec}", deny=deny)
        assert (again.kind, again.name, again.net, again.ports) == \
            (pattern.kind, pattern.name, pattern.net, expected)


#: Every name a policy below can resolve maps to loopback only: nothing leaves this host.
NAMES = {"allowed.test": ["127.0.0.1"], "a.wild.test": ["127.0.0.1", "::1"],
         "rebind.test": ["127.0.0.2"], "meta.test": ["::ffff:127.0.0.1"],
         "odd.test": ["not-an-address"], "empty.test": []}


def table_resolver(name: str, port: int) -> list[str]:
    if name not in NAMES:
        raise OSError(-2, "Name or service not known")
    return list(NAMES[name])


@fuzz()
@given(st.builds(lambda base, more: base + more,
                st.sampled_from([[], ["allowed.test:*", "127.0.0.0/8:*"],
                                 ["*.wild.test:*", "127.0.0.1:80", "::1"], ["203.0.113.0/24"]]),
                st.lists(mostly(valid_patterns, patterns), max_size=3)),
       st.lists(mostly(valid_patterns, patterns), max_size=3),
       mostly(st.one_of(st.sampled_from(sorted(NAMES)), st.just("a.b.wild.test"),
                        st.just("127.0.0.1"), st.just("::1"), st.just("ALLOWED.test."),
                        valid_hosts.map(lambda h: h.strip("[]"))),
              st.one_of(hosts, st.none(), st.integers())),
       mostly(st.sampled_from([80, 443, 8080, 1, 65535]),
              st.one_of(st.integers(-2, 70_000),
                        st.sampled_from([True, 80.0, "80", None, 2 ** 70]))))
def test_policy_check(allow: list[str], deny: list[str], host: Any, port: Any) -> None:
    try:
        policy = EgressPolicy.parse(allow, deny, resolver=table_resolver)
    except PolicyError:
        return
    decision = policy.check(host, port)
    assert isinstance(decision, Decision)
    event(f"decision: {decision.kind}")
    assert decision.kind in ("allowed", "denied", "invalid", "unresolved", "timeout")
    assert decision.allowed == (decision.kind == "allowed")
    if decision.allowed:
        assert 1 <= port <= 65535 and decision.addresses and decision.rule
        for text in decision.addresses:
            address = ipaddress.ip_address(text)
            assert not any(r.matches_address(address, port) for r in policy.deny)
            special = classify(address)
            assert special is None or any(
                r.net is not None and r.port_ok(port) and unlocked_by(address, special, r.net)
                for r in policy.allow), (address, special)


@fuzz()
@given(st.one_of(st.text(max_size=20), st.integers(), st.none(), st.lists(st.integers()),
                 st.binary(max_size=8)),
       st.one_of(st.floats(allow_nan=True), st.integers(-5, 5), st.text(max_size=3)))
def test_policy_parse_bad_values(value: Any, timeout: Any) -> None:
    """Wrong types where lists of patterns and a timeout belong: PolicyError, nothing else."""
    for args in (([value],), (value,), (["example.com"], value)):
        try:
            EgressPolicy.parse(*args, resolver=table_resolver)
        except PolicyError:
            pass
    try:
        policy = EgressPolicy.parse(["example.com"], resolver=table_resolver,
                                    resolve_timeout=timeout)
    except PolicyError:
        return
    assert 0 < policy.resolve_timeout < float("inf")


@fuzz()
@given(st.one_of(st.ip_addresses(), st.ip_addresses(v=4).map(
    lambda a: ipaddress.IPv6Address("::ffff:" + str(a)))), st.one_of(
    st.ip_addresses(v=4).flatmap(lambda a: st.integers(0, 32).map(
        lambda n: ipaddress.ip_network(f"{a}/{n}", strict=False))),
    st.ip_addresses(v=6).flatmap(lambda a: st.integers(0, 128).map(
        lambda n: ipaddress.ip_network(f"{a}/{n}", strict=False)))))
def test_classify(address: Any, net: Any) -> None:
    special = classify(address)
    if special is None:
        return
    assert canonical(address) in special.block or special.block.version == 6
    unlocked = unlocked_by(address, special, net)
    if unlocked:
        assert canonical(address) in net and net.subnet_of(special.block)


# -- HTTP request heads ---------------------------------------------------------------------------

methods = st.one_of(st.sampled_from(["GET", "POST", "CONNECT", "HEAD", "PUT", "OPTIONS", "get",
                                     "CONNECT ", "G\x00T", "GÉT", ""]),
                    st.text(alphabet=string.ascii_uppercase, min_size=1, max_size=8))
versions = st.sampled_from(["HTTP/1.1", "HTTP/1.0", "HTTP/2", "HTTP/1.1 ", "http/1.1",
                            "HTTP/1.2", "HTTP/1.1\x00", ""])
paths = st.one_of(st.sampled_from(["", "/", "/a?b#c", "?q", "#f", "/%00", "/%2e%2e/",
                                   "/a b", "/\x00", "/é", "//evil.test/"]),
                  st.text(st.characters(codec="ascii"), max_size=30))
targets = st.one_of(
    authorities,
    st.builds(lambda s, a, p: f"{s}://{a}{p}",
              st.sampled_from(["http", "HTTP", "https", "ftp", "http:", ""]), authorities, paths),
    paths, st.text(max_size=40),
    st.just("x" * 17000),
)
header_names = st.one_of(
    st.sampled_from(["Host", "host", "HOST", "Content-Length", "Transfer-Encoding",
                     "Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authorization",
                     "Upgrade", "TE", "X-Forwarded-For", "Host ", " Host", "Ho\x00st", ""]),
    st.text(alphabet=string.ascii_letters + "-", min_size=1, max_size=12))
header_values = st.one_of(
    authorities,
    st.sampled_from(["0", "5", "05", "-1", "²", "¹²", "٣", "5, 5", " 5 ", "chunked",
                     "close", "keep-alive, Host", "Host", "host, content-length",
                     "a\x00b", "a\rb", "a\nb", "\x7f", "é"]),
    st.integers(0, 10 ** 30).map(str),
    st.text(st.characters(codec="latin-1"), max_size=40),
)
eols = st.sampled_from(["\r\n"] * 8 + ["\n", "\r", "\r\r\n", "\n\r"])


valid_paths = st.from_regex(r"/[A-Za-z0-9._~/?=&%+-]{0,24}", fullmatch=True)
valid_values = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=30).map(
    str.strip)
valid_headers = st.lists(st.tuples(
    st.sampled_from(["Accept", "User-Agent", "X-Trace", "Content-Type", "Connection",
                     "Keep-Alive", "Proxy-Authorization", "Content-Length"]),
    valid_values), max_size=4)


@st.composite
def request_heads(draw: st.DrawFn) -> bytes:
    """Near-valid request heads: each part valid four times in five, else odd."""
    eol = draw(mostly(st.just("\r\n"), eols))
    method = draw(mostly(st.sampled_from(["GET", "CONNECT", "POST", "HEAD"]), methods))
    authority = draw(mostly(valid_authorities, authorities))
    if method == "CONNECT":
        target = draw(mostly(st.just(authority), targets))
    else:
        target = draw(mostly(st.builds(lambda p: f"http://{authority}{p}", valid_paths),
                             targets))
    line = f"{method} {target} {draw(mostly(st.just('HTTP/1.1'), versions))}"
    headers = draw(mostly(valid_headers, st.lists(st.tuples(header_names, header_values),
                                                  max_size=6)))
    if not one_in(3, draw):
        host = draw(mostly(st.just(authority), header_values))
        headers.insert(draw(st.integers(0, len(headers))), ("Host", host))
    sep = draw(mostly(st.just(": "), st.sampled_from([":", " : ", ":\t", ""])))
    text = eol.join([line] + [f"{k}{sep}{v}" for k, v in headers]) + eol + draw(
        mostly(st.just("\r\n"), eols))
    if one_in(3, draw):
        text += draw(st.text(max_size=20))
    if draw(st.booleans()):
        try:
            return text.encode("latin-1")
        except UnicodeEncodeError:
            pass
    return text.encode("utf-8", "surrogatepass")


raw_heads = mostly(request_heads(), st.one_of(
    st.binary(max_size=2048),
    st.binary(max_size=64).map(lambda b: b"GET " + b + b" HTTP/1.1\r\n\r\n")))

MAX_HEAD = 16384
_loop = asyncio.new_event_loop()


@pytest.fixture(scope="module", autouse=True)
def _close_loop() -> Iterator[None]:
    yield
    _loop.close()


def run(coro: Any) -> Any:
    """Run a parser coroutine on this file's loop; bounded (its input is already complete)."""
    return _loop.run_until_complete(asyncio.wait_for(coro, 30))


async def _read_head_of(data: bytes, chunked: bool) -> tuple[bytes, bytes]:
    reader = asyncio.StreamReader(limit=65536)
    if chunked:  # the initial byte, as the proxy passes it, and the rest from the stream
        reader.feed_data(data[1:])
        reader.feed_eof()
        return await httpwire.read_head(reader, data[:1], MAX_HEAD, request=True)
    reader.feed_data(data)
    reader.feed_eof()
    return await httpwire.read_head(reader, b"", MAX_HEAD, request=True)


def _check_request(head: httpwire.RequestHead) -> None:
    assert re.fullmatch(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+", head.method)
    assert head.target and all(0x21 <= ord(c) <= 0x7E for c in head.target)
    assert head.version in ("HTTP/1.0", "HTTP/1.1")
    for name, value in head.headers:
        assert re.fullmatch(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+", name)
        assert not any(ord(c) < 0x20 and c != "\t" or ord(c) == 0x7F for c in value)
        assert value == value.strip(" \t")


@fuzz()
@given(raw_heads, st.booleans())
@example(b"GET http://a.test/ HTTP/1.1\r\nContent-Length: \xb2\r\n\r\n", False)
@example(b"CONNECT a.test:" + b"9" * 5000 + b" HTTP/1.1\r\n\r\n", False)
@example(b"G" * (MAX_HEAD + 10) + b"\r\n\r\n", True)
def test_request_head(data: bytes, chunked: bool) -> None:
    """read_head → parse_request_head → the proxy's routing steps, as proxy.py chains them."""
    try:
        head_bytes, rest = run(_read_head_of(data, chunked))
    except HeadError as exc:
        assert exc.status in (400, 431) and "\n" not in str(exc)
        event(f"read_head: {exc.status}")
        return
    assert head_bytes.endswith(b"\r\n\r\n") and len(head_bytes) <= MAX_HEAD
    assert data.startswith(head_bytes + rest)  # what was not read yet stays in the reader
    try:
        head = httpwire.parse_request_head(head_bytes)
    except HeadError as exc:
        assert exc.status == 400 and "\n" not in str(exc)
        event("parse_request_head: 400")
        return
    _check_request(head)
    what = "CONNECT" if head.method == "CONNECT" else "absolute-form"
    try:
        if head.method == "CONNECT":
            _connect_route(head)
        else:
            _forward_route(head)
    except HeadError as exc:
        assert exc.status == 400 and "\n" not in str(exc)
        event(f"{what}: refused (400)")
    else:
        event(f"{what}: routed")


def _connect_route(head: httpwire.RequestHead) -> None:
    """What EgressProxy._connect_target checks, with the public functions."""
    try:
        host, port = parse_authority(head.target)
    except HostError as exc:
        raise HeadError(f"invalid CONNECT target: {exc}") from None
    _well_formed_host(host)
    assert 1 <= port <= 65535
    written = httpwire.host_header(head)
    if written is not None:
        _well_formed_host(written[0])
        assert written[1] is None or 1 <= written[1] <= 65535


def _forward_route(head: httpwire.RequestHead) -> None:
    """What EgressProxy._forward_target does, then: the origin's request parses back."""
    authority, path = httpwire.split_absolute_url(head.target)
    assert head.target.lower().startswith("http://")
    try:
        host, port = parse_authority(authority, 80)
    except HostError as exc:
        raise HeadError(f"invalid request target host: {exc}") from None
    _well_formed_host(host)
    assert 1 <= port <= 65535
    httpwire.check_framing(head)
    for value in head.values("content-length"):
        assert re.fullmatch(r"[0-9]+", value), value
    assert not (head.values("content-length") and head.values("transfer-encoding"))
    written = httpwire.host_header(head)
    if written is not None and (written[0] != host or (written[1] or 80) != port):
        return  # the proxy refuses this one (400)
    out = httpwire.origin_request(head, path, host, port)
    event("absolute-form: rewritten and parsed back")
    again = httpwire.parse_request_head(out)
    assert (again.method, again.version) == (head.method, head.version)
    assert again.target == path and path.startswith("/") and "#" not in path
    assert again.values("host") == [format_host(host) if port == 80
                                    else f"{format_host(host)}:{port}"]
    assert httpwire.host_header(again) == (host, None if port == 80 else port)
    assert again.values("connection") == ["close"]
    names = {k.lower() for k, _ in again.headers}
    assert not names & (httpwire.HOP_BY_HOP - {"connection"})
    assert again.values("content-length") == head.values("content-length")
    assert again.values("transfer-encoding") == head.values("transfer-encoding")


@fuzz()
@given(st.one_of(st.binary(max_size=1024), request_heads().map(
    lambda b: b.replace(b"GET", b"HTTP/1.1 200 OK", 1))),
    st.sampled_from([b"HTTP/1.1 200 OK", b"HTTP/1.0 101 Switching", b"HTTP/1.1 100 Continue",
                     b"HTTP/1.1 999", b"HTTP/1.1 20", b"HTTP/2 200", b""]))
def test_response_head(data: bytes, status_line: bytes) -> None:
    for raw in (data, status_line + b"\r\n" + data):
        out, status = httpwire.rewrite_response_head(raw)
        if status is None:
            assert out == raw
            continue
        assert 100 <= status <= 999
        assert out.endswith(b"\r\nConnection: close\r\n\r\n")
        lines = out[:-4].split(b"\r\n")
        connection = [ln for ln in lines[1:]
                      if ln.partition(b":")[0].strip().lower() in
                      (b"connection", b"keep-alive", b"proxy-connection")]
        assert connection == [b"Connection: close"]


# -- SOCKS5 ---------------------------------------------------------------------------------------

class _Writer:
    """The writer half the handshake writes its method choice to (bytes kept, not sent)."""

    def __init__(self) -> None:
        self.data = bytearray()

    def write(self, data: bytes) -> None:
        self.data += data

    async def drain(self) -> None:
        return None


@st.composite
def socks_requests(draw: st.DrawFn) -> bytes:
    """After the version byte: a greeting, then a request; each part valid nine times in ten."""
    mostly = _mostly_10
    methods_ = draw(mostly(st.sampled_from([b"\x00", b"\x02\x00", b"\x00\x01"]),
                           st.binary(max_size=6)))
    count = draw(mostly(st.just(len(methods_)), st.integers(0, 255)))
    greeting = bytes([count]) + methods_
    version = draw(mostly(st.just(5), st.sampled_from([4, 0, 6, 255])))
    command = draw(mostly(st.just(1), st.sampled_from([2, 3, 0, 255])))
    reserved = draw(mostly(st.just(0), st.sampled_from([1, 255])))
    atyp = draw(mostly(st.sampled_from([1, 3, 4]), st.sampled_from([0, 2, 5, 255])))
    if atyp == 1:
        address = draw(mostly(st.ip_addresses(v=4).map(lambda a: a.packed),
                              st.binary(max_size=6)))
    elif atyp == 4:
        address = draw(mostly(st.ip_addresses(v=6).map(lambda a: a.packed),
                              st.binary(max_size=18)))
    else:
        name = draw(mostly(st.one_of(good_names, st.sampled_from(sorted(NAMES))),
                           hosts).map(lambda h: h.encode("utf-8", "surrogatepass")[:255]))
        length = draw(mostly(st.just(len(name)), st.integers(0, 255)))
        address = bytes([length]) + name
    port = draw(mostly(st.integers(0, 65535).map(lambda p: p.to_bytes(2, "big")),
                       st.binary(max_size=3)))
    tail = bytes([version, command, reserved, atyp]) + address + port
    return greeting + draw(mostly(st.just(tail), st.binary(max_size=40)))


async def _socks(data: bytes) -> tuple[tuple[str, int], bytes]:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    writer = _Writer()
    try:
        return await socks.handshake(reader, writer), bytes(writer.data)  # type: ignore[arg-type]
    finally:
        assert writer.data[:1] in (b"", b"\x05")
        assert len(writer.data) in (0, 2)


@fuzz()
@given(mostly(socks_requests(), st.binary(max_size=300)))
def test_socks5_handshake(data: bytes) -> None:
    try:
        (host, port), written = run(_socks(data))
    except socks.SocksError as exc:
        assert exc.reply is None or 0 <= exc.reply <= 255
        assert exc.port is None or 0 <= exc.port <= 65535
        event(f"SocksError reply={exc.reply}")
        return
    except asyncio.IncompleteReadError:
        event("short handshake")
        return  # a short handshake: the proxy closes ("client closed during the handshake")
    event("CONNECT target")
    assert written == b"\x05\x00"
    assert isinstance(host, str) and len(host) <= 255 and 0 <= port <= 65535
    # What the proxy does next: the policy judges the target; never an exception.
    decision = EgressPolicy.parse(["127.0.0.1:1"], resolver=table_resolver).check(host, port)
    assert isinstance(decision, Decision)


# -- the resolver's DNS queries ------------------------------------------------------------------

@st.composite
def dns_queries(draw: st.DrawFn) -> bytes:
    """A query with one question, mostly well-formed: header fields, labels (lengths that lie,
    compression pointers, dots and NULs inside labels), type and class drawn near-valid."""
    qid = draw(st.integers(0, 0xFFFF))
    flags = draw(_mostly_10(st.sampled_from([0x0100, 0x0000]), st.integers(0, 0xFFFF)))
    counts = draw(_mostly_10(st.sampled_from([(1, 0, 0, 0), (1, 0, 0, 1)]),
                             st.tuples(*[st.integers(0, 3)] * 4)))
    name = draw(mostly(st.one_of(good_names, st.sampled_from(["allowed.test", "x.sub.test",
                                                               "denied.test"])),
                       st.text(max_size=70)))
    labels = []
    for label in name.split("."):
        raw = label.encode("utf-8", "surrogatepass")
        length = draw(mostly(st.just(len(raw)), st.integers(0, 255), 30))
        labels.append(bytes([length]) + raw)
    qname = b"".join(labels) + draw(_mostly_10(st.just(b"\0"), st.binary(max_size=3)))
    tail = draw(_mostly_10(st.tuples(st.sampled_from([1, 1, 28, 15, 255]),
                                     _mostly_10(st.just(1), st.just(3)))
                       .map(lambda t: t[0].to_bytes(2, "big") + t[1].to_bytes(2, "big")),
                       st.binary(max_size=6)))
    extra = draw(mostly(st.just(b""), st.binary(max_size=40)))
    header = b"".join(v.to_bytes(2, "big") for v in (qid, flags, *counts))
    return header + qname + tail + extra


_DNS_POLICY = EgressPolicy.parse(["allowed.test", "*.sub.test:22"], ["denied.test"],
                                 resolver=lambda name, port: ["127.0.0.1"])


@fuzz()
@given(mostly(dns_queries(), st.binary(max_size=600)))
def test_dns_query(data: bytes) -> None:
    try:
        q = dnswire.parse_query(data)
    except dnswire.DnsError as exc:
        assert exc.rcode in (None, dnswire.FORMERR, dnswire.NOTIMP)
        event(f"DnsError rcode={exc.rcode}")
    else:
        event("question")
        assert q.name is None or q.name == normalize_name(q.name)
        assert data[12:12 + len(q.wire)] == q.wire and 0 <= q.qtype <= 0xFFFF
    # What the resolver does with it: an answer or silence, never an exception; an answer
    # is a response to this very query, with at most one A record from the synthetic range.
    names = SyntheticNames()
    logged: list[dict[str, Any]] = []
    reply = Resolver(_DNS_POLICY, names, logged.append).respond(data, "fuzz")
    assert len(logged) == 1
    if reply is None:
        assert logged[0]["allowed"] is False
        return
    assert reply[:2] == data[:2] and reply[2] & 0x80
    rcode, answers = reply[3] & 0xF, int.from_bytes(reply[6:8], "big")
    event(f"answered {dnswire.RCODE_NAMES[rcode]} with {answers} record(s)")
    assert answers in (0, 1)
    if answers:
        assert rcode == dnswire.NOERROR and logged[0]["allowed"] is True
        address = socket.inet_ntoa(reply[-4:])
        assert names.name_of(address) == logged[0]["host"]
        assert logged[0]["host"] == "allowed.test" or logged[0]["host"].endswith(".sub.test")
    if logged[0]["allowed"] is False:
        assert answers == 0


# -- a send's destination, read from the caller's memory (egress.routes) -------------------------

@st.composite
def msghdr_vectors(draw: st.DrawFn) -> tuple[bytes, int]:
    """(bytes, stride): msghdr/mmsghdr vectors of up to MMSG_READ + 1 entries, each with a name
    pointer (NULL or not) and a length (0, a sockaddr's, past sockaddr_storage, negative as an
    int, any u32), the rest random; the whole cut anywhere, as a partial read leaves it."""
    stride = draw(st.sampled_from((routes.MSGHDR_SIZE, routes.MMSGHDR_SIZE)))
    out = b""
    for _ in range(draw(st.integers(0, routes.MMSG_READ + 1))):
        pointer = draw(st.sampled_from((0, 8, 0x7FFC_0000_1000, 2**64 - 1)))
        length = draw(st.one_of(st.sampled_from((0, 16, 28, 128, 129, 200, 2**31, 2**32 - 1)),
                                st.integers(0, 2**32 - 1)))
        out += struct.pack("=QI", pointer, length) + draw(st.binary(min_size=stride - 12,
                                                                    max_size=stride - 12))
    cut = draw(mostly(st.just(len(out)), st.integers(0, len(out))))
    return out[:cut], stride


@fuzz(long=10_000)
@given(mostly(msghdr_vectors(), st.tuples(st.binary(max_size=700),
                                          st.sampled_from((0, 1, 11, 12, 56, 64)))))
def test_msg_names(case: tuple[bytes, int]) -> None:
    """Untrusted bytes: never an exception; one entry per whole msghdr read, each (0, 0) or
    a pointer with a length the kernel would read (1..sockaddr_storage)."""
    data, stride = case
    names = routes.msg_names(data, stride)
    if stride < 12:
        assert names == []
        return
    assert len(names) == len(data) // stride
    for i, (pointer, length) in enumerate(names):
        raw_pointer, raw_length = struct.unpack_from("=QI", data, i * stride)
        if (pointer, length) == (0, 0):
            assert not raw_pointer or not raw_length or raw_length >= 2**31
            event("no name")
        else:
            assert pointer == raw_pointer and 0 < length <= routes.SOCKADDR_STORAGE
            assert length == min(raw_length, routes.SOCKADDR_STORAGE)
            event("a name")


@fuzz(long=10_000)
@given(st.one_of(st.binary(max_size=40),
                 st.tuples(st.sampled_from((socket.AF_INET, socket.AF_INET6, socket.AF_UNIX, 0)),
                           st.binary(max_size=30)).map(
                     lambda t: struct.pack("=H", t[0]) + t[1])))
def test_unrouted(sockaddr: bytes) -> None:
    """A sockaddr's bytes, as read from the caller: never an exception; a destination named
    is an address the namespace has no route to, with a port."""
    found = routes.unrouted(sockaddr)
    family = routes.sockaddr_family(sockaddr)
    if found is None:
        event("routed or not an address")
        return
    address, port = found
    assert family in (socket.AF_INET, socket.AF_INET6) and 0 <= port <= 0xFFFF
    parsed = ipaddress.ip_address(address)
    if isinstance(parsed, ipaddress.IPv6Address):
        # link-local and multicast IPv6 are the kernel's own errors (EINVAL), not recorded
        assert not parsed.is_link_local and not parsed.is_multicast
        assert parsed not in (ipaddress.ip_address("::"), ipaddress.ip_address("::1"))
        parsed = parsed.ipv4_mapped or parsed
    if isinstance(parsed, ipaddress.IPv4Address):  # lo's, 0.0.0.0 and the synthetic range
        assert parsed not in ipaddress.ip_network("127.0.0.0/8")
        assert parsed not in ipaddress.ip_network("198.18.0.0/15")
        assert parsed != ipaddress.ip_address("0.0.0.0")
    event(f"no route, family {family}")


# -- the first bytes of a captured connection ----------------------------------------------------

def client_hello(name: bytes, *, session: bytes = b"", before: bytes = b"",
                 after: bytes = b"") -> bytes:
    """A TLS ClientHello record with ``name`` as its SNI host_name, between other extensions."""
    entry = b"\0" + len(name).to_bytes(2, "big") + name
    sni = b"\0\0" + (len(entry) + 2).to_bytes(2, "big") + len(entry).to_bytes(2, "big") + entry
    extensions = before + sni + after
    body = (b"\x03\x03" + bytes(32) + bytes([len(session)]) + session + b"\0\x02\x13\x01"
            + b"\x01\0" + len(extensions).to_bytes(2, "big") + extensions)
    handshake = b"\x01" + len(body).to_bytes(3, "big") + body
    return b"\x16\x03\x01" + len(handshake).to_bytes(2, "big") + handshake


@st.composite
def first_messages(draw: st.DrawFn) -> tuple[bytes, str | None]:
    """(bytes, the host they name or None): ClientHellos and request heads, whole."""
    name = draw(mostly(good_names, st.text(max_size=40)))
    raw = name.encode("utf-8", "surrogatepass")
    if draw(st.booleans()):
        other = draw(st.binary(max_size=20))
        ext = b"\x00\x17" + len(other).to_bytes(2, "big") + other
        data = client_hello(raw, session=draw(st.binary(max_size=32)),
                            before=ext if draw(st.booleans()) else b"",
                            after=ext if draw(st.booleans()) else b"")
    else:
        data = b"GET / HTTP/1.1\r\nUser-Agent: x\r\nHost: " + raw + b"\r\n\r\n"
    return data, name


def _feed(guard: StreamGuard, data: bytes, cuts: list[int]) -> tuple[bytes, str | None]:
    """Feed ``data`` cut at ``cuts``; (all bytes passed, the refusal or None)."""
    passed = b""
    bounds = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    for a, b in zip(bounds, bounds[1:]):
        try:
            passed += guard.feed(data[a:b])
        except Refused as exc:
            return passed + exc.passed, str(exc)
    return passed, None


@fuzz()
@given(st.one_of(first_messages().map(lambda m: m[0]), st.binary(max_size=400),
                 st.builds(lambda a, b: a + b, first_messages().map(lambda m: m[0]),
                           st.binary(max_size=200))),
       st.lists(st.integers(0, 2000), max_size=8), st.sampled_from(["per_request",
                                                                    "one_request"]))
def test_stream_guard_on_any_bytes(data: bytes, cuts: list[int], mode: str) -> None:
    """Untrusted bytes, cut anywhere: only Refused comes out, what passes is a prefix of the
    input, and where the cuts fall changes nothing."""
    body = ("length", 3) if mode == "one_request" else None
    passed, refused = _feed(StreamGuard("a.test", 443, mode=mode, body=body), data, cuts)
    whole, whole_refused = _feed(StreamGuard("a.test", 443, mode=mode, body=body), data, [])
    assert data.startswith(passed)
    assert (passed, refused is None) == (whole, whole_refused is None)
    event("refused" if refused else "passed")


@fuzz()
@given(first_messages(), st.lists(st.integers(0, 2000), max_size=8))
def test_stream_guard_decides_on_the_whole_message(message: tuple[bytes, str], cuts: list[int]
                                                   ) -> None:
    """A message naming a host passes whole for that host, however it is cut, and nothing of
    it passes for another host."""
    data, name = message
    try:
        host = normalize_name(name)
    except HostError:
        host = None
    if host is not None and host != "other.test":
        passed, refused = _feed(StreamGuard(host, 443), data, cuts)
        if refused is None:  # (a Host header with odd bytes is refused as a bad head)
            assert passed == data
            event("passed for its own host")
    passed, refused = _feed(StreamGuard("other.test", 443), data, cuts)
    assert passed == b"" and refused is not None


def test_stream_guard_bounds() -> None:
    guard = StreamGuard("a.test", 80)
    assert guard.feed(b"GET / HTTP/1.1\r\nX: " + b"a" * 1000) == b""
    with pytest.raises(Refused, match="larger than"):
        guard.feed(b"a" * MAX_MESSAGE)
    assert StreamGuard("a.test", 22).feed(b"SSH-2.0-x y\r\n") == b"SSH-2.0-x y\r\n"
    chunked = (b"POST / HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"3;x=1\r\nabc\r\n0\r\nT: 1\r\n\r\n")
    later = b"GET / HTTP/1.1\r\nHost: b.test\r\n\r\n"
    guard = StreamGuard("a.test", 80)
    with pytest.raises(Refused, match="b.test") as info:
        guard.feed(chunked + later)
    assert info.value.passed == chunked


# -- the whole proxy, over loopback ---------------------------------------------------------------

class _Upstream:
    """A loopback TCP server this file owns: reads what comes (bounded), answers, closes."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.accepts = 0
        self._stop = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepts += 1
            with conn:
                conn.settimeout(2.0)
                data = b""
                try:
                    while b"\r\n\r\n" not in data and len(data) < 65536:
                        chunk = conn.recv(65536)
                        if not chunk:
                            break
                        data += chunk
                    conn.sendall(b"HTTP/1.1 200 OK\r\nConnection: keep-alive\r\n"
                                 b"Content-Length: 2\r\n\r\nok")
                except OSError:
                    pass

    def close(self) -> None:
        self._stop = True
        self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self.thread.join(5)


class _GuardedPolicy(EgressPolicy):
    """The policy under test, plus a guard: a verdict allowing anything but the test's own
    upstream is recorded and turned into a refusal, so the proxy cannot dial it."""

    violations: list = []  # noqa: RUF012 - shared on purpose, read by the test
    upstream_port = 0

    async def check_async(self, host: str, port: int, executor: Any = None) -> Decision:
        decision = await super().check_async(host, port, executor)
        if decision.allowed and (port != self.upstream_port
                                 or set(decision.addresses) != {"127.0.0.1"}):
            self.violations.append((host, port, decision))
            return Decision(False, "test guard: not the test's upstream", kind="denied")
        return decision


class _Harness:
    def __init__(self) -> None:
        self.upstream = _Upstream()
        allow = [f"127.0.0.1:{self.upstream.port}", f"allowed.test:{self.upstream.port}",
                 "*.wild.test:*", "rebind.test:*", "meta.test:*"]
        base = EgressPolicy.parse(allow, ["deny.allowed.test"], resolver=table_resolver,
                                  resolve_timeout=2.0)
        self.policy = _GuardedPolicy(base.allow, base.deny, table_resolver, 2.0)
        _GuardedPolicy.upstream_port = self.upstream.port
        _GuardedPolicy.violations = []
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.address = self.sock.getsockname()
        self.log: list[dict] = []
        self.thread = ProxyThread(self.policy, self.sock, log=self.log.append,
                                  header_timeout=2.0, connect_timeout=2.0, idle_timeout=2.0)
        self.thread.start()
        self.proxy = self.thread.proxy

    def close(self) -> None:
        try:
            self.thread.stop()
        finally:
            self.upstream.close()


@pytest.fixture(scope="module")
def harness() -> Iterator[_Harness]:
    h = _Harness()
    yield h
    h.close()


def _exchange(address: tuple[str, int], data: bytes) -> bytes:
    """Send ``data``, half-close, read the answer to its end (bounded in size and time)."""
    with socket.create_connection(address, timeout=10) as s:
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the proxy may answer and close before reading everything
        out = b""
        try:
            while len(out) < 1 << 20:
                chunk = s.recv(65536)
                if not chunk:
                    break
                out += chunk
        except ConnectionResetError:
            pass
        return out


@st.composite
def proxy_inputs(draw: st.DrawFn, port: int) -> bytes:
    """Requests aimed at the test's upstream (allowed), at refused names and addresses, and
    garbage. The CONNECT and absolute-form targets reuse the fuzzed authorities."""
    allowed = st.sampled_from([f"127.0.0.1:{port}", f"allowed.test:{port}",
                               f"ALLOWED.test.:{port}"])
    refused = st.sampled_from([f"deny.allowed.test:{port}", f"rebind.test:{port}",
                               f"meta.test:{port}", f"a.wild.test:{port}", f"odd.test:{port}",
                               f"empty.test:{port}", f"[::1]:{port}", f"127.0.0.2:{port}",
                               f"127.0.0.1:{port + 1 if port < 65535 else 1}",
                               f"127.1:{port}", f"0x7f.1:{port}", f"2130706433:{port}",
                               f"127.0.0.1:0{port}", f"user@127.0.0.1:{port}",
                               "nowhere.test:80", f"127.0.0.1:{port}0"])
    target = draw(mostly(allowed, st.one_of(refused, authorities), 3))
    kind = draw(st.sampled_from(["connect"] * 3 + ["absolute"] * 3 + ["socks"] * 2
                                + ["head", "raw"]))
    if kind in ("connect", "absolute"):
        host = draw(mostly(st.sampled_from(["", f"Host: {target}\r\n"]),
                           header_values.map(lambda v: f"Host: {v}\r\n")))
        extra = draw(mostly(st.just(""), st.lists(st.tuples(header_names, header_values),
                                                  max_size=3).map(
            lambda hs: "".join(f"{k}: {v}\r\n" for k, v in hs))))
        if kind == "connect":
            line = f"CONNECT {target} HTTP/1.1"
        else:
            line = f"GET http://{target}{draw(mostly(valid_paths, paths))} HTTP/1.1"
        body = draw(mostly(st.just(""), st.text(max_size=20)))
        return f"{line}\r\n{host}{extra}\r\n{body}".encode("utf-8", "surrogatepass")
    if kind == "socks":
        good = b"\x01\x00" + bytes([5, 1, 0, 1, 127, 0, 0, 1]) + port.to_bytes(2, "big")
        named = (b"\x01\x00" + bytes([5, 1, 0, 3, len(b"allowed.test")]) + b"allowed.test"
                 + port.to_bytes(2, "big"))
        return b"\x05" + draw(mostly(st.sampled_from([good, named]), socks_requests(), 2))
    if kind == "head":
        return draw(request_heads())
    return draw(st.binary(max_size=512))


_STATUS = re.compile(rb"HTTP/1\.1 ([0-9]{3}) ")


@fuzz(ci=60, long=2000)
@given(data=st.data())
@example(data=None)
def test_proxy_over_loopback(harness: _Harness, data: Any) -> None:
    """The real proxy thread: every connection gets an answer or a close, and one log record;
    nothing but the test's own upstream is ever dialled; the thread survives all of it."""
    port = harness.upstream.port
    payload = (b"CONNECT a.test:" + b"9" * 5000 + b" HTTP/1.1\r\n\r\n" if data is None
               else data.draw(proxy_inputs(port)))
    records = len(harness.log)
    connections = harness.proxy.connections
    dials = harness.proxy.upstream_connects
    answer = _exchange(harness.address, payload)
    deadline = time.monotonic() + 10
    while (harness.proxy.active or len(harness.log) == records) and time.monotonic() < deadline:
        time.sleep(0.002)
    assert harness.thread._thread.is_alive(), "the proxy thread died"
    assert harness.proxy.active == 0
    assert harness.proxy.connections == connections + 1
    new = harness.log[records:]
    assert len(new) == 1, f"expected one log record, got {new!r} (a session error?)"
    record = new[0]
    event(f"{record['protocol']}: {record['response']}")
    assert not _GuardedPolicy.violations, _GuardedPolicy.violations
    if record["allowed"]:
        assert record["address"] == "127.0.0.1" and record["port"] == port
        assert harness.proxy.upstream_connects == dials + 1
    else:
        assert harness.proxy.upstream_connects in (dials, dials + 1)  # a failed dial
    first = payload[:1]
    if first == b"\x05":
        assert answer[:2] in (b"", b"\x05\x00", b"\x05\xff"), answer[:12]
    elif first == b"\x04":
        assert answer in (b"", bytes([0, 0x5B, 0, 0, 0, 0, 0, 0]))
    elif answer:
        match = _STATUS.match(answer)
        assert match, answer[:80]
        status = int(match.group(1))
        if record["allowed"]:
            assert status == 200
        else:
            assert status in (400, 403, 408, 431, 502, 504), status
            body = answer.split(b"\r\n\r\n", 1)[1]
            assert body.startswith(b"hcp-linux egress proxy: ") and body.count(b"\n") == 1
    else:  # nothing came back: only when nothing was sent (no protocol to answer in)
        assert not payload and record["response"] == "closed", (payload[:80], record)
