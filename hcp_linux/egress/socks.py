"""The SOCKS5 handshake (RFC 1928), server side: no authentication, CONNECT only.

BIND and UDP ASSOCIATE are refused: the first would open a listening port on the host for the
sandbox, the second a UDP path around the proxy. A domain-name target (ATYP 3) is passed to the
policy as text and validated like any other host; an IPv4-mapped IPv6 target (ATYP 4) is refused
there too. The success reply reports 0.0.0.0:0 as the bound address rather than the host's real
outgoing address, which the sandbox has no need to learn.
"""
from __future__ import annotations

import asyncio
import ipaddress

VERSION = 5
NO_AUTH = 0x00
NO_ACCEPTABLE = 0xFF

CMD_CONNECT = 0x01

ATYP_IPV4 = 0x01
ATYP_DOMAIN = 0x03
ATYP_IPV6 = 0x04

# Reply codes.
SUCCEEDED = 0x00
GENERAL_FAILURE = 0x01
NOT_ALLOWED = 0x02
NETWORK_UNREACHABLE = 0x03
HOST_UNREACHABLE = 0x04
CONNECTION_REFUSED = 0x05
TTL_EXPIRED = 0x06
COMMAND_NOT_SUPPORTED = 0x07
ADDRESS_TYPE_NOT_SUPPORTED = 0x08


class SocksError(Exception):
    """The handshake failed; ``reply`` is the code to send (None: the client gets no reply)."""

    def __init__(self, reason: str, reply: int | None, host: str | None = None,
                 port: int | None = None) -> None:
        super().__init__(reason)
        self.reply, self.host, self.port = reply, host, port


def reply(code: int) -> bytes:
    """A reply with the bound address hidden (0.0.0.0:0)."""
    return bytes([VERSION, code, 0, ATYP_IPV4, 0, 0, 0, 0, 0, 0])


async def handshake(reader: asyncio.StreamReader,
                    writer: asyncio.StreamWriter) -> tuple[str, int]:
    """Run the handshake after the version byte was read; return the CONNECT target.

    The caller sends the final reply (success, or a refusal from the policy).
    """
    count = (await reader.readexactly(1))[0]
    methods = await reader.readexactly(count)
    if NO_AUTH not in methods:
        writer.write(bytes([VERSION, NO_ACCEPTABLE]))
        raise SocksError("no acceptable authentication method (only 'no authentication')", None)
    writer.write(bytes([VERSION, NO_AUTH]))
    await writer.drain()
    version, command, reserved, atyp = await reader.readexactly(4)
    if version != VERSION or reserved != 0:
        raise SocksError("malformed SOCKS5 request", GENERAL_FAILURE)
    if atyp == ATYP_IPV4:
        host = str(ipaddress.IPv4Address(await reader.readexactly(4)))
    elif atyp == ATYP_IPV6:
        host = str(ipaddress.IPv6Address(await reader.readexactly(16)))
    elif atyp == ATYP_DOMAIN:
        length = (await reader.readexactly(1))[0]
        # latin-1 maps every byte to one character, so the policy sees (and refuses) NUL,
        # non-ASCII and every other odd byte instead of a decoding error hiding them.
        host = (await reader.readexactly(length)).decode("latin-1")
    else:
        raise SocksError(f"address type {atyp} not supported", ADDRESS_TYPE_NOT_SUPPORTED)
    port = int.from_bytes(await reader.readexactly(2), "big")
    if command != CMD_CONNECT:
        name = {0x02: "BIND", 0x03: "UDP ASSOCIATE"}.get(command, f"command {command}")
        raise SocksError(f"SOCKS5 {name} refused (CONNECT only)", COMMAND_NOT_SUPPORTED,
                         host, port)
    return host, port
