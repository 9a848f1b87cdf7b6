"""Strict host parsing: names, IP literals, ports and authorities, each spelled one way only.

Host names are validated, in patterns and in requests alike, so that no alternative spelling of a
host slips past a rule:

* ASCII letters, digits, ``-`` and ``.`` only (LDH): NUL, ``%``, ``_``, ``\\``, spaces and any
  other byte are refused; so is ``user@host``;
* non-ASCII names are refused (IDN look-alikes such as a Cyrillic "а" in "аpple.com"); write the
  punycode ``xn--`` form, which is matched exactly as written;
* case is folded to lower case; ONE trailing dot is dropped (``example.com.`` is
  ``example.com``), in patterns and in requests, so both spellings meet the same rules;
* a name whose last label is all digits, or that libc's ``inet_aton`` would read as an address
  (``0x7f.1``, ``0x7f000001``), is refused; IPv4 literals must be strict dotted quads
  (``127.1``, ``0177.0.0.1`` and ``2130706433`` are refused);
* IPv6 literals are parsed by the strict ``ipaddress`` module; zone indices (``%eth0``),
  IPv4-mapped (``::ffff:127.0.0.1``) and IPv4-compatible (``::127.0.0.1``) forms are refused --
  write the IPv4 form.
"""
from __future__ import annotations

import ipaddress
import re
import socket
from typing import Union

from ..errors import PolicyError
from .addresses import IPAddress

__all__ = ["DECIMAL", "DOTTED_CHARS", "Host", "HostError", "format_host", "normalize_name",
           "parse_authority", "parse_host", "parse_ipv4", "parse_ipv6", "parse_port", "safe_text",
           "short_number"]

Host = Union[str, IPAddress]  # a normalised host name, or an address

_LDH = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-.")
_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\Z")
#: A decimal number (leading zeros are refused by each caller).
DECIMAL = re.compile(r"[0-9]+\Z")
#: What a dotted-quad IPv4 literal may contain.
DOTTED_CHARS = frozenset("0123456789.")


class HostError(PolicyError):
    """A host or authority is malformed; the message says why (without the host itself)."""


def normalize_name(text: str) -> str:
    """A validated, lower-case host name without a trailing dot; `HostError` if not one."""
    if not text:
        raise HostError("empty host name")
    if not text.isascii():
        raise HostError("non-ASCII host name (IDN look-alikes are refused; "
                        "write the xn-- punycode form)")
    for ch in text:
        if ch not in _LDH:
            raise HostError(f"character {ch!r} is not allowed in a host name "
                            "(letters, digits, '-' and '.' only)")
    name = text.lower()
    if name.endswith("."):
        name = name[:-1]
    if not name:
        raise HostError("empty host name")
    if len(name) > 253:
        raise HostError("host name longer than 253 characters")
    labels = name.split(".")
    for label in labels:
        if not label:
            raise HostError("empty label (leading, doubled or trailing dots)")
        if not _LABEL.match(label):
            raise HostError(f"label {label!r} must be 1..63 letters, digits or '-', "
                            "not starting or ending with '-'")
    if DECIMAL.match(labels[-1]):
        raise HostError("all-numeric last label: neither a host name nor a strict "
                        "dotted-quad IPv4 address (forms such as 127.1, 0x7f.1 or "
                        "2130706433 are refused)")
    try:
        socket.inet_aton(name)
    except OSError:
        return name
    raise HostError("libc would read this name as an IPv4 address in an odd encoding")


def parse_ipv4(text: str) -> ipaddress.IPv4Address:
    """A strict dotted quad: four decimal parts, no leading zeros."""
    try:
        return ipaddress.IPv4Address(text)
    except ValueError:
        raise HostError("not a strict dotted-quad IPv4 address (forms such as 127.1, "
                        "0177.0.0.1 or 2130706433 are refused)") from None


def parse_ipv6(text: str) -> ipaddress.IPv6Address:
    """A strict IPv6 literal without zone; IPv4-mapped and -compatible forms refused."""
    if "%" in text:
        raise HostError("IPv6 zone index (%...) is not allowed")
    try:
        address = ipaddress.IPv6Address(text)
    except ValueError:
        raise HostError("not a valid IPv6 address") from None
    if address.ipv4_mapped is not None:
        raise HostError("IPv4-mapped IPv6 address; write the IPv4 form")
    if int(address) >> 32 == 0 and int(address) > 1:
        raise HostError("IPv4-compatible IPv6 address (deprecated); write the IPv4 form")
    return address


def parse_host(text: str) -> Host:
    """A request's host part: a name, a strict IPv4 dotted quad, or an IPv6 literal
    (bracketed or not -- a host part has no port to confuse it with)."""
    if text.startswith("[") and text.endswith("]"):
        return parse_ipv6(text[1:-1])
    if ":" in text:
        return parse_ipv6(text)
    if text and set(text) <= DOTTED_CHARS:
        return parse_ipv4(text)
    return normalize_name(text)


def parse_port(text: str) -> int:
    """A decimal port 1..65535 without sign, spaces or leading zeros."""
    if not DECIMAL.match(text) or (len(text) > 1 and text[0] == "0"):
        raise HostError(f"port {safe_text(text, 20)} is not a decimal number without leading zeros")
    # Length first: int() of more than 4300 digits raises a ValueError of its own.
    if len(text) > 5 or not 1 <= int(text) <= 65535:
        raise HostError(f"port {short_number(text)} out of range 1..65535")
    return int(text)


def parse_authority(text: str, default_port: int | None = None) -> tuple[Host, int]:
    """``host[:port]`` as in a CONNECT target, a URL or a Host header.

    IPv6 literals must be bracketed here (``[::1]:443``); userinfo (``user@host``) is refused
    because proxies and origins have disagreed on which side of the ``@`` is the host.
    """
    if "@" in text:
        raise HostError("user@host (userinfo) is not allowed")
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise HostError("unclosed '[' in IPv6 literal")
        host: Host = parse_ipv6(text[1:end])
        rest = text[end + 1:]
        if rest and not rest.startswith(":"):
            raise HostError("unexpected text after ']'")
        port_text: str | None = rest[1:] if rest else None
    else:
        if text.count(":") > 1:
            raise HostError("IPv6 literal must be in brackets, e.g. [::1]:443")
        host_text, sep, after = text.partition(":")
        if not host_text:
            raise HostError("empty host")
        host = parse_host(host_text)
        port_text = after if sep else None
    if port_text is None:
        if default_port is None:
            raise HostError("port required (host:port)")
        return host, default_port
    return host, parse_port(port_text)


def format_host(host: Host) -> str:
    """Host for messages and URLs: IPv6 in brackets."""
    if isinstance(host, ipaddress.IPv6Address):
        return f"[{host}]"
    return str(host)


def short_number(text: str, limit: int = 20) -> str:
    """A decimal number for a message, shortened when it is absurdly long."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} digits)"


def safe_text(text: str, limit: int = 120) -> str:
    """A request-supplied string made safe for messages and logs: escaped and truncated."""
    shown = repr(text[:limit])
    return shown + "..." if len(text) > limit else shown
