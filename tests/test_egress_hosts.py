"""Egress patterns, strict host parsing, address classification and policy decisions.

No network: names resolve through an injected resolver that records every call, so a test
can also assert that a refusal happened before any resolution.
"""
from __future__ import annotations

import ipaddress
import time
from typing import Sequence

import pytest

from hcp_linux.egress import EgressPolicy, classify, parse_authority, parse_host, parse_pattern
from hcp_linux.egress.addresses import METADATA, unlocked_by
from hcp_linux.errors import PolicyError


class StubResolver:
    """Maps names to fixed address lists and records every lookup."""

    def __init__(self, table: dict[str, Sequence[str]]) -> None:
        self.table = table
        self.calls: list[tuple[str, int]] = []

    def __call__(self, name: str, port: int) -> list[str]:
        self.calls.append((name, port))
        if name not in self.table:
            raise OSError(-2, "Name or service not known")
        return list(self.table[name])


def policy(allow: Sequence[str], deny: Sequence[str] = (), **table: Sequence[str]):
    resolver = StubResolver({k.replace("_", "."): v for k, v in table.items()})
    return EgressPolicy.parse(allow, deny, resolver=resolver), resolver


# -- pattern syntax -------------------------------------------------------------------------

@pytest.mark.parametrize("text, canonical", [
    ("example.com", "example.com:80,443"),
    ("Example.COM.", "example.com:80,443"),
    ("example.com:8443", "example.com:8443"),
    ("example.com:*", "example.com:*"),
    ("*.example.com", "*.example.com:80,443"),
    ("*.Example.com.:22", "*.example.com:22"),
    ("xn--80ak6aa92e.com", "xn--80ak6aa92e.com:80,443"),
    ("203.0.113.7", "203.0.113.7:80,443"),
    ("203.0.113.7:8080", "203.0.113.7:8080"),
    ("10.0.0.0/8", "10.0.0.0/8:80,443"),
    ("10.0.0.0/8:*", "10.0.0.0/8:*"),
    ("[::1]", "[::1]:80,443"),
    ("[::1]:443", "[::1]:443"),
    ("::1", "[::1]:80,443"),
    ("2001:db8::7", "[2001:db8::7]:80,443"),
    ("fd00::/8", "[fd00::/8]:80,443"),
    ("[fd00::/8]:443", "[fd00::/8]:443"),
])
def test_pattern_syntax(text: str, canonical: str) -> None:
    assert parse_pattern(text).canonical() == canonical


def test_deny_pattern_without_port_means_every_port() -> None:
    assert parse_pattern("example.com", deny=True).canonical() == "example.com:*"
    assert parse_pattern("example.com:22", deny=True).canonical() == "example.com:22"


@pytest.mark.parametrize("text, why", [
    ("", "empty"),
    ("exa\0mple.com", "'\\x00'"),
    ("exam_ple.com", "'_'"),
    ("exa mple.com", "' '"),
    ("example.com/", "only an IP address may precede '/'"),
    ("example.com/8", "only an IP address may precede '/'"),
    ("fd00::/8:443", "bracket it"),
    ("ex%41mple.com", "'%'"),
    ("user@example.com", "user@host"),
    ("example..com", "empty label"),
    (".example.com", "empty label"),
    ("example.com..", "empty label"),
    ("-example.com", "label"),
    ("example-.com", "label"),
    ("a" * 64 + ".com", "label"),
    (".".join(["a" * 60] * 5), "253"),
    ("exämple.com", "non-ASCII"),
    ("аpple.com", "non-ASCII"),  # Cyrillic а
    ("*", "'*'"),
    ("*example.com", "'*'"),
    ("foo.*.com", "'*'"),
    ("*.*.com", "'*'"),
    ("example.com:0", "out of range"),
    ("example.com:65536", "out of range"),
    ("example.com:080", "leading zeros"),
    ("example.com:+80", "decimal"),
    ("example.com:", "decimal"),
    ("example.com:http", "decimal"),
    ("127.1", "dotted-quad"),
    ("0177.0.0.1", "dotted-quad"),
    ("2130706433", "dotted-quad"),
    ("0x7f.1", "all-numeric"),
    ("0x7f000001", "odd encoding"),
    ("1.2.3.4.5", "dotted-quad"),
    ("256.1.1.1", "dotted-quad"),
    ("::ffff:127.0.0.1", "IPv4-mapped"),
    ("[::ffff:7f00:1]:443", "IPv4-mapped"),
    ("::127.0.0.1", "IPv4-compatible"),
    ("fe80::1%eth0", "zone"),
    ("[::1", "unclosed"),
    ("[::1]x", "after ']'"),
    ("[example.com]:443", "IPv6"),
    ("10.0.0.1/8", "host bits set (did you mean 10.0.0.0/8?)"),
    ("10.0.0.0/33", "exceeds 32"),
    ("10.0.0.0/08", "prefix length"),
    ("010.0.0.0/8", "dotted-quad"),
    ("*.127.0.0.1", "all-numeric"),
])
def test_malformed_patterns_name_the_culprit(text: str, why: str) -> None:
    with pytest.raises(PolicyError) as err:
        EgressPolicy.parse(["ok.example", text])
    message = str(err.value)
    assert repr(text) in message and why in message
    assert isinstance(err.value, ValueError)


def test_deny_list_errors_say_deny() -> None:
    with pytest.raises(PolicyError, match="invalid egress deny pattern 'a..b'"):
        EgressPolicy.parse(["example.com"], ["a..b"])


def test_a_single_string_is_not_a_list() -> None:
    with pytest.raises(PolicyError, match="list of patterns"):
        EgressPolicy.parse("example.com")  # type: ignore[arg-type]


# -- request hosts and authorities ----------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("Example.COM", "example.com"),
    ("example.com.", "example.com"),
    ("xn--80ak6aa92e.com", "xn--80ak6aa92e.com"),
    ("127.0.0.1", ipaddress.ip_address("127.0.0.1")),
    ("::1", ipaddress.ip_address("::1")),
    ("[::1]", ipaddress.ip_address("::1")),
])
def test_parse_host(text: str, expected: object) -> None:
    assert parse_host(text) == expected


@pytest.mark.parametrize("text, default, expected", [
    ("example.com:443", None, ("example.com", 443)),
    ("EXAMPLE.com.:443", None, ("example.com", 443)),
    ("example.com", 80, ("example.com", 80)),
    ("[::1]:8080", None, (ipaddress.ip_address("::1"), 8080)),
    ("[::1]", 80, (ipaddress.ip_address("::1"), 80)),
])
def test_parse_authority(text: str, default: int | None, expected: tuple) -> None:
    assert parse_authority(text, default) == expected


@pytest.mark.parametrize("text", [
    "example.com", "user@example.com:443", "user:pw@example.com:443", "::1:443",
    "[::1]443", "example.com:", "example.com:99999", ":443", "[::ffff:127.0.0.1]:443",
    "127.1:80", "0x7f.1:80", "2130706433:80", "0177.0.0.1:80", "exam\0ple.com:443",
])
def test_bad_authorities_refused(text: str) -> None:
    with pytest.raises(PolicyError):
        parse_authority(text)


# -- address classification -----------------------------------------------------------------

@pytest.mark.parametrize("address, category", [
    ("127.0.0.1", "loopback"), ("127.255.0.9", "loopback"), ("::1", "loopback"),
    ("10.1.2.3", "private"), ("172.16.0.1", "private"), ("172.31.255.255", "private"),
    ("192.168.1.1", "private"), ("fd12::1", "private"), ("fc00::1", "private"),
    ("169.254.1.1", "link-local"), ("fe80::1", "link-local"),
    ("100.64.0.1", "shared address space (CGNAT)"),
    ("0.0.0.0", "unspecified"), ("::", "unspecified"),
    ("224.0.0.1", "multicast"), ("ff02::1", "multicast"),
    ("255.255.255.255", "broadcast"),
    ("169.254.169.254", METADATA), ("fd00:ec2::254", METADATA),
    ("100.100.100.200", METADATA), ("169.254.170.2", METADATA),
    ("::ffff:127.0.0.1", "loopback"),                     # mapped: judged as IPv4
    ("64:ff9b::a9fe:a9fe", f"{METADATA} (carried in 64:ff9b::/96)"),  # NAT64
    ("2002:7f00:1::1", "loopback (carried in 2002::/16)"),  # 6to4
    ("2001::1", "reserved"),                               # Teredo
])
def test_non_public_addresses(address: str, category: str) -> None:
    special = classify(ipaddress.ip_address(address))
    assert special is not None and special.category == category


@pytest.mark.parametrize("address", ["93.184.216.34", "8.8.8.8", "172.32.0.1", "100.128.0.1",
                                     "2606:4700::1111", "2002:5db8:d822::1"])
def test_public_addresses(address: str) -> None:
    assert classify(ipaddress.ip_address(address)) is None


def test_unlocking_needs_a_rule_inside_the_block() -> None:
    loop = ipaddress.ip_address("127.0.0.1")
    special = classify(loop)
    assert special is not None
    assert unlocked_by(loop, special, ipaddress.ip_network("127.0.0.1/32"))
    assert unlocked_by(loop, special, ipaddress.ip_network("127.0.0.0/8"))
    assert not unlocked_by(loop, special, ipaddress.ip_network("0.0.0.0/0"))
    meta = ipaddress.ip_address("169.254.169.254")
    special = classify(meta)
    assert special is not None
    assert unlocked_by(meta, special, ipaddress.ip_network("169.254.169.254/32"))
    assert not unlocked_by(meta, special, ipaddress.ip_network("169.254.0.0/16"))


# -- decisions --------------------------------------------------------------------------------

def test_allowed_name_resolves_once_and_reports_addresses() -> None:
    pol, res = policy(["api.test"], api_test=["93.184.216.34", "93.184.216.34"])
    decision = pol.check("api.test", 443)
    assert decision.allowed and decision.kind == "allowed" and decision.rule == "api.test"
    assert decision.addresses == ("93.184.216.34",)  # de-duplicated, in resolver order
    assert res.calls == [("api.test", 443)]
    assert "'api.test'" in decision.reason


def test_public_resolution_is_allowed() -> None:
    pol, _ = policy(["api.test"], api_test=["93.184.216.34", "2606:2800:220:1::1"])
    decision = pol.check("api.test", 443)
    assert decision.allowed
    assert decision.addresses == ("93.184.216.34", "2606:2800:220:1::1")


def test_default_ports_are_80_and_443_only() -> None:
    pol, res = policy(["api.test"], api_test=["93.184.216.34"])
    assert pol.check("api.test", 80).allowed
    assert pol.check("api.test", 443).allowed
    refused = pol.check("api.test", 8080)
    assert not refused.allowed and "no allow rule matches api.test:8080" in refused.reason
    assert res.calls == [("api.test", 80), ("api.test", 443)]  # no lookup for the refusal


def test_star_port_and_explicit_port() -> None:
    pol, _ = policy(["a.test:*", "b.test:8080"], a_test=["93.184.216.34"],
                    b_test=["93.184.216.34"])
    assert pol.check("a.test", 22).allowed
    assert pol.check("b.test", 8080).allowed
    assert not pol.check("b.test", 443).allowed


def test_wildcard_matches_subdomains_not_apex() -> None:
    pol, _ = policy(["*.example.test"], a_example_test=["93.184.216.34"],
                    b_a_example_test=["93.184.216.34"], example_test=["93.184.216.34"])
    assert pol.check("a.example.test", 443).allowed
    assert pol.check("b.a.example.test", 443).allowed
    assert not pol.check("example.test", 443).allowed
    assert not pol.check("badexample.test", 443).allowed


def test_deny_beats_allow() -> None:
    pol, res = policy(["*.example.test:*", "203.0.113.0/24:*"],
                      ["evil.example.test", "203.0.113.66"],
                      good_example_test=["93.184.216.34"], evil_example_test=["93.184.216.34"],
                      rebind_example_test=["203.0.113.66"])
    assert pol.check("good.example.test", 443).allowed
    by_name = pol.check("evil.example.test", 443)
    assert not by_name.allowed and "denied by rule 'evil.example.test'" in by_name.reason
    assert ("evil.example.test", 443) not in res.calls  # denied before any lookup
    by_literal = pol.check("203.0.113.66", 22)
    assert not by_literal.allowed and "'203.0.113.66'" in by_literal.reason
    by_address = pol.check("rebind.example.test", 443)
    assert not by_address.allowed and "resolves to 203.0.113.66" in by_address.reason


@pytest.mark.parametrize("address", ["127.0.0.1", "10.0.0.5", "192.168.0.10", "169.254.169.254",
                                     "100.100.100.200", "::1", "fd00:ec2::254", "fe80::1",
                                     "0.0.0.0", "100.64.1.1"])
def test_name_resolving_to_non_public_address_is_refused(address: str) -> None:
    pol, _ = policy(["evil.test:*"], evil_test=[address])
    decision = pol.check("evil.test", 443)
    assert not decision.allowed and decision.kind == "denied"
    assert f"resolves to {address}" in decision.reason
    assert decision.addresses == (address,)


def test_one_bad_address_among_good_ones_refuses_the_name() -> None:
    pol, _ = policy(["mixed.test"], mixed_test=["93.184.216.34", "127.0.0.1"])
    assert not pol.check("mixed.test", 443).allowed


def test_localhost_with_both_loopbacks_dials_the_unlocked_one() -> None:
    """Debian's stock /etc/hosts gives localhost 127.0.0.1 and ::1: unlocking one loopback
    address allows the name, and the other (the same host's loopback) is never dialled."""
    pol, _ = policy(["localhost:8080", "127.0.0.1:8080"], localhost=["127.0.0.1", "::1"])
    decision = pol.check("localhost", 8080)
    assert decision.allowed and decision.addresses == ("127.0.0.1",), decision
    assert "not dialled: ::1" in decision.reason
    pol, _ = policy(["localhost:8080", "[::1]:8080"], localhost=["127.0.0.1", "::1"])
    assert pol.check("localhost", 8080).addresses == ("::1",)
    # nothing unlocked: refused, as before
    pol, _ = policy(["localhost:8080"], localhost=["127.0.0.1", "::1"])
    assert not pol.check("localhost", 8080).allowed
    # the unlocking rule must cover the port
    pol, _ = policy(["localhost:8080", "127.0.0.1:9090"], localhost=["127.0.0.1", "::1"])
    assert not pol.check("localhost", 8080).allowed
    # a refused address of another kind still refuses the name
    pol, _ = policy(["odd.test:8080", "127.0.0.1:8080"], odd_test=["127.0.0.1", "::1", "10.0.0.5"])
    decision = pol.check("odd.test", 8080)
    assert not decision.allowed and "resolves to 10.0.0.5" in decision.reason


def test_listing_the_address_or_its_cidr_unlocks_it() -> None:
    for unlock in ("127.0.0.1:8080", "127.0.0.0/8:*", "127.0.0.1:*"):
        pol, _ = policy(["local.test:8080", unlock], local_test=["127.0.0.1"])
        assert pol.check("local.test", 8080).allowed, unlock
    # the unlocking rule must cover the port too
    pol, _ = policy(["local.test:8080", "127.0.0.1:9090"], local_test=["127.0.0.1"])
    assert not pol.check("local.test", 8080).allowed
    # "everything" is not "the host's loopback"
    pol, _ = policy(["local.test:8080", "0.0.0.0/0:*"], local_test=["127.0.0.1"])
    assert not pol.check("local.test", 8080).allowed


def test_metadata_needs_its_exact_address() -> None:
    pol, res = policy(["169.254.0.0/16:*"])
    refused = pol.check("169.254.169.254", 80)
    assert not refused.allowed and "cloud metadata" in refused.reason
    pol, _ = policy(["169.254.169.254:80"])
    assert pol.check("169.254.169.254", 80).allowed
    assert res.calls == []


@pytest.mark.parametrize("literal", ["10.0.0.1", "169.254.169.254", "127.0.0.1", "::1",
                                     "fd00:ec2::254", "192.168.1.1"])
def test_private_literals_refused_without_lookup(literal: str) -> None:
    pol, res = policy(["0.0.0.0/0:*", "[::/0]:*"])
    decision = pol.check(literal, 80)
    assert not decision.allowed and decision.kind == "denied"
    assert "refused unless the allow list names it" in decision.reason
    assert res.calls == []


def test_name_patterns_never_match_literals() -> None:
    pol, _ = policy(["example.test:*"])
    assert "no allow rule matches 203.0.113.5:443" in pol.check("203.0.113.5", 443).reason


@pytest.mark.parametrize("host", [
    "exa\0mple.test", "exam_ple.test", "ex ample.test", "user@example.test", "exämple.test",
    "аpple.test", "0x7f.1", "0x7f000001", "2130706433", "127.1", "0177.0.0.1", "127.0.0.01",
    "::ffff:127.0.0.1", "::127.0.0.1", "fe80::1%lo", "example.test..", "example.test/x",
    "example.test:443", "", "*.example.test",
])
def test_bypass_hosts_refused_as_invalid(host: str) -> None:
    pol, res = policy(["*.test:*", "example.test:*", "0.0.0.0/0:*", "127.0.0.0/8:*"],
                      example_test=["93.184.216.34"])
    decision = pol.check(host, 443)
    assert not decision.allowed and decision.kind == "invalid", decision
    assert res.calls == []


def test_case_and_trailing_dot_match_consistently() -> None:
    pol, res = policy(["Example.TEST."], example_test=["93.184.216.34"])
    for spelling in ("example.test", "EXAMPLE.test", "example.test.", "eXaMpLe.TeSt."):
        assert pol.check(spelling, 443).allowed, spelling
    assert {name for name, _ in res.calls} == {"example.test"}  # resolved as normalised
    deny, _ = policy(["*.test"], ["Evil.Test."], evil_test=["93.184.216.34"])
    for spelling in ("evil.test", "EVIL.TEST.", "evil.test."):
        assert not deny.check(spelling, 443).allowed, spelling


def test_punycode_matched_as_written() -> None:
    pol, _ = policy(["xn--80ak6aa92e.test"], **{"xn--80ak6aa92e_test": ["93.184.216.34"]})
    assert pol.check("XN--80AK6AA92E.test", 443).allowed
    assert pol.check("аррӏе.test", 443).kind == "invalid"


def test_bad_ports_refused() -> None:
    pol, _ = policy(["example.test:*"], example_test=["93.184.216.34"])
    for port in (0, -1, 65536, True):
        assert pol.check("example.test", port).kind == "invalid"  # type: ignore[arg-type]


def test_resolution_failure_and_timeout() -> None:
    pol, _ = policy(["missing.test"])
    failed = pol.check("missing.test", 443)
    assert not failed.allowed and failed.kind == "unresolved"

    def slow(name: str, port: int) -> list[str]:
        time.sleep(2)
        return ["93.184.216.34"]

    slow_policy = EgressPolicy.parse(["slow.test"], resolver=slow, resolve_timeout=0.2)
    started = time.monotonic()
    timed_out = slow_policy.check("slow.test", 443)
    assert time.monotonic() - started < 1.5
    assert timed_out.kind == "timeout" and not timed_out.allowed


def test_resolver_garbage_refused() -> None:
    pol, _ = policy(["odd.test"], odd_test=["not-an-address"])
    assert pol.check("odd.test", 443).kind == "unresolved"
    pol, _ = policy(["none.test"], none_test=[])
    assert pol.check("none.test", 443).kind == "unresolved"


def test_resolved_mapped_and_scoped_addresses_are_canonicalised() -> None:
    pol, _ = policy(["m.test", "127.0.0.1:443"], m_test=["::ffff:127.0.0.1"])
    decision = pol.check("m.test", 443)
    assert decision.allowed and decision.addresses == ("127.0.0.1",)
    pol, _ = policy(["s.test"], s_test=["fe80::1%2"])
    assert "link-local" in pol.check("s.test", 443).reason


def test_localhost_through_the_system_resolver_is_refused() -> None:
    try:
        with open("/etc/hosts", encoding="utf-8") as hosts:
            listed = any("localhost" in line.split()[1:] for line in hosts
                         if line.strip() and not line.startswith("#"))
    except OSError:
        listed = False
    if not listed:
        pytest.skip("localhost is not in /etc/hosts (would need DNS)")
    decision = EgressPolicy.parse(["localhost"]).check("localhost", 80)
    assert not decision.allowed and "loopback" in decision.reason


def test_describe_for_the_receipt() -> None:
    pol, _ = policy(["Example.test", "10.0.0.0/8:5432"], ["bad.example.test"])
    assert pol.describe() == {"allow": ["example.test:80,443", "10.0.0.0/8:5432"],
                              "deny": ["bad.example.test:*"]}
