"""The egress proxy: the sandbox's only way out of its private network namespace.

One listening socket serves three protocols, told apart by the first byte: SOCKS5 (0x05),
HTTP CONNECT and plain-HTTP forward proxying (an upper-case method). The listening socket is
normally created *inside* the sandbox's network namespace and handed to the runtime over
SCM_RIGHTS, so every client is the sandbox and every upstream connection is made from the
host's namespace -- which is why every upstream address goes through `EgressPolicy` first.

Security properties, each with its reason:

* Names are resolved once, by the policy, and the proxy dials only the addresses that were
  checked (as numeric addresses: no second lookup, no DNS rebinding between check and use).
* A tunnel to an address is opaque: after CONNECT (or SOCKS5 CONNECT) bytes are relayed to
  the checked upstream and never interpreted. A tunnel to a name carries only messages for
  that name: its first message (ClientHello, HTTP/1 head) is held whole and refused if it
  names another host, as on a captured connection (:mod:`.sniff`). A CONNECT whose target is
  the proxy's own listening address is refused, so the proxy never serves itself.
* Plain HTTP: the request target's authority is the only thing routed on; a Host header that
  disagrees with it is refused (400), the request is rewritten to origin-form with hop-by-hop
  headers dropped and ``Connection: close`` forced both ways, so one client connection carries
  one request to one checked upstream; a later request on it is refused, never sent.
* Hostile clients: the whole request head must arrive within ``header_timeout`` and fit in
  ``max_header_bytes``; garbage gets 400; at most ``max_connections`` clients are served at once
  (extra ones are closed at accept); an idle tunnel is closed after ``idle_timeout``; relaying
  uses bounded stream buffers with drain() back-pressure, handles half-close, and closes both
  sides on any error.

Transparent egress (:mod:`.capture`): listeners made by the sandbox's ``egress-capture`` step
on the ports the allow list opens accept connections to the synthetic addresses the resolver
handed out, to the allow list's own IP and CIDR entries (made local inside) and to loopback;
there the destination is the request (a synthetic one mapped back to its name), decided as a
proxied (host, port) would be; what that refuses (a synthetic address not handed out, the
sandbox's own loopback unless the allow list names it) is closed. The client's first message is held whole and not sent on if its
TLS server name, HTTP Host or target names another host, nor any later HTTP/1 request that
does (:mod:`.sniff`). The resolver's UDP socket is served on the same loop.

Every decision is passed to ``log`` as a dict with the keys ``time client protocol host port
allowed reason address`` (plus ``response``, the answer sent). The byte relay lives in
:mod:`.relay`; :class:`~.thread.ProxyThread` runs the proxy on a loop of its own.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import datetime
import errno
import ipaddress
import os
import socket
import sys
from dataclasses import dataclass
from typing import Any, Callable

from . import socks
from .capture import Resolver, SyntheticNames
from .hostnames import HostError, format_host, normalize_name, parse_authority
from .hosts import Decision, EgressPolicy
from .httpwire import (HeadError, RequestHead, check_framing, host_header, origin_request,
                       parse_request_head, read_head, simple_response, split_absolute_url)
from .relay import abort, abort_unless_closing, close_streams, discard, pump
from .sniff import FIRST_MESSAGE_TIMEOUT, Refused, StreamGuard

LogFn = Callable[[dict[str, Any]], None]

_PHRASES = {400: "Bad Request", 403: "Forbidden", 408: "Request Timeout",
            431: "Request Header Fields Too Large", 502: "Bad Gateway", 504: "Gateway Timeout"}

#: Decision.kind → (HTTP status, SOCKS5 reply code).
_REFUSALS = {"denied": (403, socks.NOT_ALLOWED), "invalid": (400, socks.NOT_ALLOWED),
             "unresolved": (502, socks.HOST_UNREACHABLE), "timeout": (504, socks.TTL_EXPIRED)}

_CONNECT_OK = b"HTTP/1.1 200 Connection established\r\nProxy-Agent: hcp-linux-egress\r\n\r\n"


class _Refusal(Exception):
    """Ends a session before any relaying: answer, log, close."""

    def __init__(self, reason: str, status: int, socks_reply: int | None = socks.GENERAL_FAILURE,
                 *, host: str | None = None, port: int | None = None,
                 address: str | None = None) -> None:
        super().__init__(reason)
        self.reason, self.status, self.socks_reply = reason, status, socks_reply
        self.host, self.port, self.address = host, port, address


@dataclass
class _Conn:
    """An accepted socket, and its stream writer once the session has wrapped it."""

    sock: socket.socket
    writer: asyncio.StreamWriter | None = None

    def close(self) -> None:
        if self.writer is not None:
            abort_unless_closing(self.writer)
        else:
            self.sock.close()


@dataclass
class _Session:
    """What is known about one client connection so far (for answers and the log)."""

    client: str
    protocol: str = "unknown"   # unknown | socks5 | socks4 | http | connect | captured
    host: str | None = None
    port: int | None = None
    leftover: bytes = b""       # client bytes read past the request head
    upstream_head: bytes = b""  # plain HTTP: the rewritten request for the origin
    body: tuple[str, int] = ("length", 0)  # plain HTTP: the request body's framing


class EgressProxy:
    """An asyncio HTTP CONNECT / HTTP / SOCKS5 proxy enforcing an `EgressPolicy`.

    Counters (plain ints, readable from any thread): ``connections`` accepted,
    ``upstream_connects`` dial attempts (a refused request leaves it unchanged), ``active``.
    """

    def __init__(self, policy: EgressPolicy, *, log: LogFn | None = None,
                 connect_timeout: float = 10.0, idle_timeout: float = 60.0,
                 header_timeout: float = 10.0, max_header_bytes: int = 16384,
                 max_connections: int = 256, stream_limit: int = 65536,
                 resolver_threads: int = 4, drain_timeout: float = 0.5) -> None:
        for name, value in (("connect_timeout", connect_timeout), ("idle_timeout", idle_timeout),
                            ("header_timeout", header_timeout)):
            if not value > 0:
                raise ValueError(f"{name} must be positive, not {value!r}")
        if not drain_timeout >= 0:
            raise ValueError(f"drain_timeout must be 0 or more, not {drain_timeout!r}")
        for name, count in (("max_header_bytes", max_header_bytes),
                            ("max_connections", max_connections), ("stream_limit", stream_limit),
                            ("resolver_threads", resolver_threads)):
            if count < 1:
                raise ValueError(f"{name} must be at least 1, not {count!r}")
        self.policy = policy
        self.log = log
        self.connect_timeout = float(connect_timeout)
        self.idle_timeout = float(idle_timeout)
        self.header_timeout = float(header_timeout)
        self.max_header_bytes = max_header_bytes
        self.max_connections = max_connections
        self.stream_limit = stream_limit
        self.resolver_threads = resolver_threads
        self.drain_timeout = float(drain_timeout)
        self.connections = 0
        self.upstream_connects = 0
        self._tasks: dict[asyncio.Task[None], _Conn] = {}  # live sessions
        self._listening: list[tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]] = []
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._closing = False
        self._draining = False  # stopping: decide and record what is queued, dial nothing
        self._captured: set[int] = set()  # fds of the capture listeners
        self.names = SyntheticNames()  # the run's fake-IP map (transparent egress)
        self.resolver = Resolver(policy, self.names, log)

    @property
    def active(self) -> int:
        return len(self._tasks)

    # -- serving ---------------------------------------------------------------------------

    async def serve(self, *listening_socks: socket.socket,
                    ready: Callable[[], None] | None = None,
                    captured: tuple[socket.socket, ...] = (),
                    resolver: socket.socket | None = None) -> None:
        """Serve on already-listening TCP sockets until cancelled; takes ownership of them.

        ``captured``: listening sockets of transparent egress, whose connections are decided
        by their destination (a synthetic address the resolver gave out) rather than by a
        request; ``resolver``: the bound UDP socket the sandbox's resolver answers on.
        Cancelling closes the sockets and every client and upstream connection.
        """
        if not listening_socks:
            raise ValueError("serve() needs at least one listening socket")
        for sock in listening_socks:
            self._listening.append(_listen_address(sock))
        self._captured = {sock.fileno() for sock in captured}
        listening_socks = listening_socks + tuple(captured)
        for sock in listening_socks:
            sock.setblocking(False)
        self._executor = concurrent.futures.ThreadPoolExecutor(
            self.resolver_threads, thread_name_prefix="hcp-egress-resolve")
        loop = asyncio.get_running_loop()
        for sock in listening_socks:
            loop.add_reader(sock.fileno(), self._accept, sock)
        if resolver is not None:
            resolver.setblocking(False)
            loop.add_reader(resolver.fileno(), self._answer_queries, resolver)
            listening_socks += (resolver,)
        try:
            if ready is not None:
                ready()
            await loop.create_future()  # until cancelled
        finally:
            await self._drain(listening_socks, resolver)
            self._closing = True
            for sock in listening_socks:
                if sock.fileno() != -1:
                    loop.remove_reader(sock.fileno())
                    sock.close()
            await self._cancel_sessions()
            self._executor.shutdown(wait=False, cancel_futures=True)

    async def _drain(self, listening_socks: tuple[socket.socket, ...],
                     resolver: socket.socket | None) -> None:
        """Stopping: the run is over, but what its processes sent before they ended is still
        queued (a connection in the listen backlog, a request not yet read, a DNS query). Decide
        and record each, so that the receipt and ``--explain`` miss none of the run's refusals;
        dial nothing (the run's way out ends with it: an allowed request gets "the run ended
        first"). Bounded by ``drain_timeout``; what is left then is cancelled unrecorded."""
        if self.drain_timeout == 0:
            return
        self._draining = True
        for sock in listening_socks:
            if sock.fileno() == -1:
                continue
            if sock is resolver:
                self._answer_queries(sock)
            else:
                self._accept(sock, limit=self.max_connections)
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=self.drain_timeout)

    def _accept(self, listening: socket.socket, limit: int = 64) -> None:
        """Readiness callback of a listening socket: accept what is queued, start sessions.

        A plain reader callback rather than asyncio's Server or sock_accept(): with those, a
        connection accepted at the moment of a stop can be stranded half set up (an assertion
        swallowed inside asyncio, or a cancelled future), leaking its socket. Here each
        accepted socket is ours at once, and remove_reader() cancels any pending callback.
        """
        for _ in range(limit):  # bounded per loop turn, for fairness with the sessions
            try:
                conn, _ = listening.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as exc:  # EMFILE and friends: pause accepting, keep serving
                print(f"hcp-linux egress: accept failed: {exc}", file=sys.stderr)
                loop = asyncio.get_running_loop()
                loop.remove_reader(listening.fileno())
                loop.call_later(0.1, self._resume_accepting, listening)
                return
            conn.setblocking(False)
            self._start_session(conn, listening.fileno() in self._captured)

    def _resume_accepting(self, listening: socket.socket) -> None:
        if not self._closing and listening.fileno() != -1:
            asyncio.get_running_loop().add_reader(listening.fileno(), self._accept, listening)

    def _answer_queries(self, sock: socket.socket) -> None:
        """Readiness callback of the resolver's socket: answer what is queued (bounded)."""
        for _ in range(64):
            try:
                data, peer = sock.recvfrom(4096)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # a queued ICMP error from an earlier answer: nothing to read
                continue
            reply = self.resolver.respond(data, _hostport(str(peer[0]), int(peer[1])))
            if reply is not None:
                try:
                    sock.sendto(reply, peer)
                except OSError:
                    pass  # the asker left; UDP promises nothing

    def _start_session(self, conn: socket.socket, captured: bool = False) -> None:
        if self._closing:
            conn.close()
            return
        self.connections += 1
        if len(self._tasks) >= self.max_connections:
            self._log(_Session(_peer_of(conn)), False,
                      f"too many connections (max {self.max_connections})", response="closed")
            conn.close()
            return
        holder = _Conn(conn)
        task = asyncio.get_running_loop().create_task(self._client(holder, captured))
        self._tasks[task] = holder
        task.add_done_callback(self._session_done)

    async def _cancel_sessions(self) -> None:
        while self._tasks:
            sessions = list(self._tasks.items())
            for task, _ in sessions:
                task.cancel()
            await asyncio.gather(*(task for task, _ in sessions), return_exceptions=True)
            for task, holder in sessions:
                holder.close()
                self._tasks.pop(task, None)

    def _session_done(self, task: asyncio.Task[None]) -> None:
        holder = self._tasks.pop(task, None)
        if holder is not None:
            holder.close()  # also covers a task cancelled before it ever ran

    async def _client(self, holder: _Conn, captured: bool = False) -> None:
        conn = holder.sock
        session = _Session(_peer_of(conn))
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            reader, writer = await asyncio.open_connection(sock=conn, limit=self.stream_limit)
            holder.writer = writer
            if captured:
                await self._captured_session(session, conn, reader, writer)
            else:
                await self._session(session, reader, writer)
        except Exception as exc:  # noqa: BLE001 - a session must never take the server down
            if not isinstance(exc, (ConnectionError, OSError)):
                print(f"hcp-linux egress: session error: {exc!r}", file=sys.stderr)
        finally:
            holder.close()

    async def _session(self, s: _Session, reader: asyncio.StreamReader,
                       writer: asyncio.StreamWriter) -> None:
        try:
            try:
                await asyncio.wait_for(self._read_request(s, reader, writer), self.header_timeout)
            except asyncio.TimeoutError:
                raise _Refusal(f"no complete request within {self.header_timeout:g} s", 408,
                               None) from None
            except asyncio.IncompleteReadError:
                raise _Refusal("client closed during the handshake", 400, None) from None
            decision = await self.policy.check_async(s.host or "", s.port or 0, self._executor)
            if not decision.allowed:
                status, code = _REFUSALS.get(decision.kind, (403, socks.NOT_ALLOWED))
                raise _Refusal(decision.reason, status, code,
                               address=decision.addresses[0] if decision.addresses else None)
            self._refuse_self(decision, s.port or 0)
            up_reader, up_writer, address = await self._dial(decision, s.port or 0)
        except _Refusal as refusal:
            await self._answer_refusal(s, reader, writer, refusal)
            return
        self._log(s, True, decision.reason, address, response=self._ok_response(s))
        try:
            await self._relay(s, reader, writer, up_reader, up_writer, address,
                              self._guard_for(s))
        finally:
            abort(up_writer)

    async def _captured_session(self, s: _Session, conn: socket.socket,
                                reader: asyncio.StreamReader,
                                writer: asyncio.StreamWriter) -> None:
        """A connection captured inside the sandbox: its destination is the request. A
        synthetic address the resolver gave out in this run names a host; the decision on
        (that name, port) is the one a proxied request for it gets. Any other address (an
        allow entry's IP or CIDR, made local inside, or loopback) is decided as a proxied
        request to that very address is, and relayed there, opaque (no name to hold it to)."""
        s.protocol = "captured"
        try:
            address, port = conn.getsockname()[:2]
            s.port = int(port)
            address = _unmapped(str(address))  # a listener on [::] sees IPv4 as ::ffff:a.b.c.d
            name = self.names.name_of(address)
            if name is None and self.names.holds(address):
                raise _Refusal(f"captured connection to {_hostport(address, s.port)}: no name "
                               f"was resolved to it in this run", 403, None, host=address,
                               port=s.port)
            s.host = name if name is not None else address
            decision = await self.policy.check_async(s.host, s.port, self._executor)
            if not decision.allowed:
                raise _Refusal(decision.reason, 403, None,
                               address=decision.addresses[0] if decision.addresses else None)
            self._refuse_self(decision, s.port)
            up_reader, up_writer, upstream = await self._dial(decision, s.port)
        except _Refusal as refusal:
            await self._answer_refusal(s, reader, writer, refusal)
            return
        self._log(s, True, decision.reason, upstream, response="relayed")
        try:
            await self._relay(s, reader, writer, up_reader, up_writer, upstream,
                              StreamGuard(name, s.port) if name is not None else None)
        finally:
            abort(up_writer)

    # -- request heads ----------------------------------------------------------------------

    async def _read_request(self, s: _Session, reader: asyncio.StreamReader,
                            writer: asyncio.StreamWriter) -> None:
        first = await reader.read(1)
        if not first:
            raise _Refusal("client closed without sending a request", 400, None)
        if first == b"\x05":
            s.protocol = "socks5"
            try:
                s.host, s.port = await socks.handshake(reader, writer)
            except socks.SocksError as exc:
                raise _Refusal(str(exc), 400, exc.reply, host=exc.host, port=exc.port) from None
            return
        if first == b"\x04":
            s.protocol = "socks4"
            raise _Refusal("SOCKS4 is not supported (use SOCKS5)", 400, None)
        s.protocol = "http"
        if not b"A" <= first <= b"Z":
            raise _Refusal("not an HTTP request", 400)
        try:
            head_bytes, s.leftover = await read_head(reader, first, self.max_header_bytes,
                                                     request=True)
            head = parse_request_head(head_bytes)
            if head.method == "CONNECT":
                s.protocol = "connect"
                self._connect_target(s, head)
            else:
                self._forward_target(s, head)
        except HeadError as exc:
            raise _Refusal(str(exc), exc.status, host=s.host, port=s.port) from None

    def _connect_target(self, s: _Session, head: RequestHead) -> None:
        s.host = head.target
        try:
            host, port = parse_authority(head.target)
        except HostError as exc:
            raise HeadError(f"invalid CONNECT target: {exc}") from None
        s.host, s.port = format_host(host), port
        written = host_header(head)
        if written is not None and (written[0] != host or written[1] not in (None, port)):
            raise HeadError(f"Host header {head.values('host')[0]!r} does not match the "
                            f"CONNECT target {head.target!r}")

    def _forward_target(self, s: _Session, head: RequestHead) -> None:
        authority, path = split_absolute_url(head.target)
        s.host = authority
        try:
            host, port = parse_authority(authority, 80)
        except HostError as exc:
            raise HeadError(f"invalid request target host: {exc}") from None
        s.host, s.port = format_host(host), port
        check_framing(head)
        codings = [t.strip().lower() for v in head.values("transfer-encoding")
                   for t in v.split(",") if t.strip()]
        if codings and codings[-1] != "chunked":
            raise HeadError("a request body whose last transfer coding is not chunked")
        lengths = head.values("content-length")
        s.body = ("chunked", 0) if codings else ("length", int(lengths[0]) if lengths else 0)
        written = host_header(head)
        if written is not None and (written[0] != host or (written[1] or 80) != port):
            raise HeadError(f"Host header {head.values('host')[0]!r} does not match the "
                            f"request target authority {authority!r}")
        s.upstream_head = origin_request(head, path, host, port)

    # -- upstream -------------------------------------------------------------------------------

    def _refuse_self(self, decision: Decision, port: int) -> None:
        """Refuse a target that is this proxy's own listening address (nested proxying)."""
        for text in decision.addresses:
            address = ipaddress.ip_address(text)
            for own, own_port in self._listening:
                if port != own_port or address.version != own.version:
                    continue
                if (address == own or own.is_unspecified or address.is_unspecified):
                    raise _Refusal(f"{format_host(address)}:{port} is the proxy's own listening "
                                   "address (nested proxying refused)", 403,
                                   socks.NOT_ALLOWED, address=text)

    async def _dial(self, decision: Decision, port: int
                    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, str]:
        """Connect to the checked addresses in order, by number only; first success wins."""
        if self._draining:
            raise _Refusal(f"not connected to {_hostport(decision.addresses[0], port)}: the run "
                           f"ended before the proxy dialled", 502, socks.GENERAL_FAILURE,
                           address=decision.addresses[0])
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.connect_timeout
        failure: OSError | None = None
        for text in decision.addresses:
            family = socket.AF_INET6 if ":" in text else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setblocking(False)
            self.upstream_connects += 1
            try:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise asyncio.TimeoutError
                await asyncio.wait_for(loop.sock_connect(sock, (text, port)), remaining)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                reader, writer = await asyncio.open_connection(sock=sock, limit=self.stream_limit)
                return reader, writer, text
            except asyncio.TimeoutError:
                sock.close()
                raise _Refusal(f"connecting to {_hostport(text, port)} timed out after "
                               f"{self.connect_timeout:g} s", 504, socks.TTL_EXPIRED,
                               address=text) from None
            except OSError as exc:
                sock.close()
                failure = exc
            except BaseException:
                sock.close()
                raise
        code = {errno.ECONNREFUSED: socks.CONNECTION_REFUSED,
                errno.ENETUNREACH: socks.NETWORK_UNREACHABLE,
                errno.EHOSTUNREACH: socks.HOST_UNREACHABLE}.get(
                    getattr(failure, "errno", None) or 0, socks.GENERAL_FAILURE)
        # asyncio's message ("Connect call failed (...)") hides the errno's meaning.
        detail = (os.strerror(failure.errno) if failure is not None and failure.errno
                  else str(failure))
        raise _Refusal(f"connecting to {_hostport(decision.addresses[-1], port)} failed: "
                       f"{detail}", 502, code, address=decision.addresses[-1])

    # -- answers --------------------------------------------------------------------------------

    def _ok_response(self, s: _Session) -> str:
        return {"connect": "HTTP 200", "socks5": "SOCKS 0x00"}.get(s.protocol, "forwarded")

    async def _answer_refusal(self, s: _Session, reader: asyncio.StreamReader,
                              writer: asyncio.StreamWriter, refusal: _Refusal) -> None:
        if refusal.host is not None and s.host is None:
            s.host, s.port = refusal.host, refusal.port
        if s.protocol in ("http", "connect"):
            status = refusal.status
            payload = simple_response(status, _PHRASES.get(status, "Error"),
                                      f"hcp-linux egress proxy: {refusal.reason}\n")
            response = f"HTTP {status}"
        elif s.protocol == "socks5" and refusal.socks_reply is not None:
            payload = socks.reply(refusal.socks_reply)
            response = f"SOCKS 0x{refusal.socks_reply:02x}"
        elif s.protocol == "socks4":
            payload, response = bytes([0, 0x5B, 0, 0, 0, 0, 0, 0]), "SOCKS4 0x5b"
        else:
            payload, response = b"", "closed"
        self._log(s, False, refusal.reason, refusal.address, response=response)
        if payload and not writer.transport.is_closing():
            try:
                writer.write(payload)
                await asyncio.wait_for(writer.drain(), 1.0)
                writer.write_eof()
                # Lingering close: closing a socket with unread input sends RST, which can
                # destroy the answer before the client reads it (a header flood, say). So
                # read and discard what is still coming, briefly and boundedly.
                await asyncio.wait_for(discard(reader, 1 << 20), min(1.0, self.header_timeout))
            except (OSError, asyncio.TimeoutError, RuntimeError):
                pass
        writer.close()

    def _log(self, s: _Session, allowed: bool, reason: str, address: str | None = None, *,
             response: str) -> None:
        if self.log is None:
            return
        now = datetime.datetime.now(datetime.timezone.utc)
        host = s.host if s.host is None or len(s.host) <= 255 else s.host[:255] + "..."
        record = {"time": now.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                  "client": s.client, "protocol": s.protocol, "host": host, "port": s.port,
                  "allowed": allowed, "reason": reason, "address": address,
                  "response": response}
        try:
            self.log(record)
        except Exception as exc:  # noqa: BLE001 - a broken log sink must not stop the proxy
            print(f"hcp-linux egress: log callback failed: {exc!r}", file=sys.stderr)

    # -- relaying -----------------------------------------------------------------------------

    async def _relay(self, s: _Session, c_reader: asyncio.StreamReader,
                     c_writer: asyncio.StreamWriter, u_reader: asyncio.StreamReader,
                     u_writer: asyncio.StreamWriter, upstream: str,
                     guard: StreamGuard | None) -> None:
        """Copy both ways until both sides finished, one failed, or nothing moved for
        idle_timeout. Plain HTTP ends when the origin's response ends. ``guard``: what the
        client sends passes it first (see :mod:`.sniff`); its refusal ends the relay."""
        loop = asyncio.get_running_loop()
        activity = [loop.time()]
        if s.protocol == "connect":
            c_writer.write(_CONNECT_OK)
        elif s.protocol == "socks5":
            c_writer.write(socks.reply(socks.SUCCEEDED))
        forward_http = s.protocol == "http"
        up = asyncio.create_task(
            pump(c_reader, u_writer, activity, s.upstream_head + s.leftover) if guard is None
            else self._guarded_pump(s, c_reader, u_writer, activity, guard, upstream))
        down = asyncio.create_task(pump(u_reader, c_writer, activity,
                                        response_heads=forward_http))
        pending: set[asyncio.Task[None]] = {up, down}
        try:
            while pending:
                left = activity[0] + self.idle_timeout - loop.time()
                if left <= 0:
                    break
                done, pending = await asyncio.wait(pending, timeout=left,
                                                   return_when=asyncio.FIRST_COMPLETED)
                if any(t.exception() is not None for t in done):
                    break
                if forward_http and down in done:
                    break
        finally:
            for task in (up, down):
                task.cancel()
            await asyncio.gather(up, down, return_exceptions=True)
            await close_streams(c_writer, u_writer)

    def _guard_for(self, s: _Session) -> StreamGuard | None:
        """The guard of a proxied session: plain HTTP carries its one request; a tunnel to a
        name carries only messages for that name; a tunnel to an address is opaque (the
        address was what the allow list decided, whatever names it serves)."""
        if s.protocol == "http":
            return StreamGuard(s.host or "", s.port or 0, mode="one_request", body=s.body)
        host = (s.host or "").strip("[]")
        try:
            ipaddress.ip_address(host.split("%", 1)[0])
            return None
        except ValueError:
            pass
        try:
            return StreamGuard(normalize_name(host), s.port or 0)
        except HostError:
            return None  # the policy refused such a name before any dial

    async def _guarded_pump(self, s: _Session, src: asyncio.StreamReader,
                            dst: asyncio.StreamWriter, activity: list[float],
                            guard: StreamGuard, upstream: str) -> None:
        """pump() through ``guard``: bytes go upstream only once it passed them. A first
        message not whole within FIRST_MESSAGE_TIMEOUT of its first byte, a refusal, or a
        message cut by the client's EOF ends the connection with nothing more sent; each is
        logged as a refused decision. Meanwhile the server may speak first: the other
        direction runs already."""
        loop = asyncio.get_running_loop()
        if s.upstream_head:
            dst.write(s.upstream_head)
            await dst.drain()
        data, deadline = s.leftover, None
        while True:
            if data:
                activity[0] = loop.time()
                try:
                    passed = guard.feed(data)
                except Refused as exc:
                    if exc.passed:
                        dst.write(exc.passed)
                        await dst.drain()
                    if guard.mode != "one_request":
                        self._refuse_relay(s, str(exc), upstream)
                    # plain HTTP: the first request's answer still comes back, then the
                    # relay ends with the origin's response; nothing more goes upstream
                    self._log(s, False, str(exc), upstream, response="closed")
                    return
                if passed:
                    dst.write(passed)
                    await dst.drain()
            if guard.deciding and guard.started:
                deadline = deadline or loop.time() + FIRST_MESSAGE_TIMEOUT
                try:
                    data = await asyncio.wait_for(src.read(65536),
                                                  max(0.0, deadline - loop.time()))
                except asyncio.TimeoutError:
                    self._refuse_relay(s, f"connection to {guard.host}:{guard.port}: first "
                                       f"message not complete within {FIRST_MESSAGE_TIMEOUT:g} s",
                                       upstream)
            else:
                data = await src.read(65536)
            if not data:
                break
        if guard.buf:
            self._refuse_relay(s, f"connection to {guard.host}:{guard.port}: the client "
                               "closed within a message (its start was not sent on)", upstream)
        if dst.can_write_eof() and not dst.transport.is_closing():
            dst.write_eof()

    def _refuse_relay(self, s: _Session, reason: str, upstream: str) -> None:
        """Log a refusal found while relaying and end the relay (both sides are closed)."""
        self._log(s, False, reason, upstream, response="closed")
        raise ConnectionAbortedError(reason)


def _listen_address(sock: socket.socket) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address,
                                                   int]:
    if sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET, socket.AF_INET6):
        raise ValueError("the egress proxy needs a listening TCP socket (AF_INET/AF_INET6)")
    name = sock.getsockname()
    return ipaddress.ip_address(name[0].split("%", 1)[0]), int(name[1])


def _peer_of(conn: socket.socket) -> str:
    try:
        peer = conn.getpeername()
    except OSError:
        return "unknown"
    return _hostport(str(peer[0]), int(peer[1]))


def _unmapped(address: str) -> str:
    """An IPv4-mapped IPv6 address as its IPv4 text; any other address as it is."""
    try:
        parsed = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return address
    if isinstance(parsed, ipaddress.IPv6Address) and parsed.ipv4_mapped is not None:
        return str(parsed.ipv4_mapped)
    return address


def _hostport(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
