"""What the egress proxy costs: setup time, round-trip latency and throughput, through the proxy
(HTTP CONNECT, SOCKS5, plain HTTP) against a direct loopback connection, measured in one run.

    python bench/proxy.py [--runs N] [--mib M] [--json FILE]

Three processes, as in a real run: this client (the sandboxed command's role), the proxy in a
process of its own (the runtime's role; ProxyThread on a listening socket made here), and the
upstream servers in a third (an echo server, a sink that counts bytes until EOF, a tiny HTTP
server). Everything is on 127.0.0.1. Reports median and p95; for throughput, p95 is the slow
tail (the 95th-percentile transfer time, as MiB/s). Timing only: nothing here asserts a limit.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import socket
import sys
import threading
import time
from typing import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from hcp_linux.egress import EgressPolicy, ProxyThread  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import measure, summary  # noqa: E402

MIB = 1 << 20


# -- upstream servers (their own process) --------------------------------------------------------

def _serve(listener: socket.socket, handle: Callable[[socket.socket], None]) -> None:
    while True:
        conn, _ = listener.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=_guarded, args=(handle, conn), daemon=True).start()


def _guarded(handle: Callable[[socket.socket], None], conn: socket.socket) -> None:
    with conn:
        try:
            handle(conn)
        except OSError:
            pass


def _echo(conn: socket.socket) -> None:
    while data := conn.recv(65536):
        conn.sendall(data)


def _sink(conn: socket.socket) -> None:
    total = 0
    while data := conn.recv(1 << 20):
        total += len(data)
    conn.sendall(total.to_bytes(8, "big"))


def _http(conn: socket.socket) -> None:
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = conn.recv(65536)
        if not chunk:
            return
        buf += chunk
    body = b"ok\n"
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
                 % (len(body), body))


def servers_main(echo: socket.socket, sink: socket.socket, http: socket.socket) -> None:
    for listener, handle in ((echo, _echo), (sink, _sink), (http, _http)):
        threading.Thread(target=_serve, args=(listener, handle), daemon=True).start()
    threading.Event().wait()


def proxy_main(listener: socket.socket, allow: list[str]) -> None:
    ProxyThread(EgressPolicy.parse(allow), listener).start()
    threading.Event().wait()


def _listener() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(512)
    return s


# -- client side ----------------------------------------------------------------------------------

def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed early")
        buf += chunk
    return buf


def _read_head(sock: socket.socket) -> bytes:
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError("closed before the response head")
        buf += chunk
    if not buf.startswith(b"HTTP/1.1 200"):
        raise ConnectionError(buf.split(b"\r\n", 1)[0].decode())
    return buf


class Client:
    """Ways of opening a TCP stream to (127.0.0.1, port): direct, CONNECT, SOCKS5."""

    def __init__(self, proxy_port: int) -> None:
        self.proxy = ("127.0.0.1", proxy_port)

    def direct(self, port: int) -> socket.socket:
        return socket.create_connection(("127.0.0.1", port))

    def connect(self, port: int) -> socket.socket:
        s = socket.create_connection(self.proxy)
        s.sendall(b"CONNECT 127.0.0.1:%d HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n" % (port, port))
        _read_head(s)
        return s

    def socks5(self, port: int) -> socket.socket:
        s = socket.create_connection(self.proxy)
        s.sendall(b"\x05\x01\x00")
        _recv_exact(s, 2)
        s.sendall(b"\x05\x01\x00\x01" + socket.inet_aton("127.0.0.1") + port.to_bytes(2, "big"))
        if _recv_exact(s, 10)[1] != 0:
            raise ConnectionError("SOCKS5 refused")
        return s


def _nodelay(s: socket.socket) -> socket.socket:
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def bench_setup(open_: Callable[[int], socket.socket], echo_port: int, runs: int) -> list[float]:
    """Connection setup until the first byte has made a round trip to the upstream."""
    def once() -> None:
        with _nodelay(open_(echo_port)) as s:
            s.sendall(b"x")
            _recv_exact(s, 1)
    return measure(once, runs, warmup=10)


def bench_rtt(open_: Callable[[int], socket.socket], echo_port: int, runs: int) -> list[float]:
    """64-byte ping-pong on one established stream."""
    s = _nodelay(open_(echo_port))
    payload = b"p" * 64

    def once() -> None:
        s.sendall(payload)
        _recv_exact(s, 64)
    try:
        return measure(once, runs, warmup=100)
    finally:
        s.close()


def bench_throughput(open_: Callable[[int], socket.socket], sink_port: int, mib: int,
                     runs: int) -> list[float]:
    """Send ``mib`` MiB and wait for the sink's byte count; returns milliseconds per run."""
    block = b"\xab" * MIB

    def once() -> None:
        with open_(sink_port) as s:
            for _ in range(mib):
                s.sendall(block)
            s.shutdown(socket.SHUT_WR)
            if int.from_bytes(_recv_exact(s, 8), "big") != mib * MIB:
                raise ConnectionError("sink count mismatch")
    return measure(once, runs, warmup=1)


def bench_http(proxy: tuple[str, int] | None, http_port: int, runs: int) -> list[float]:
    """One GET on a fresh connection: direct (origin-form) or via the proxy (absolute-form)."""
    def once() -> None:
        target = ("127.0.0.1", http_port) if proxy is None else proxy
        with _nodelay(socket.create_connection(target)) as s:
            path = "/" if proxy is None else f"http://127.0.0.1:{http_port}/"
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{http_port}\r\n\r\n".encode())
            while s.recv(65536):
                pass
    return measure(once, runs, warmup=10)


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--runs", type=int, default=300, help="samples per latency row")
    ap.add_argument("--mib", type=int, default=64, help="MiB per throughput transfer")
    ap.add_argument("--transfers", type=int, default=7, help="throughput transfers per row")
    ap.add_argument("--json", default=os.path.join(HERE, "results", "proxy.json"))
    args = ap.parse_args()

    echo, sink, http, listener = _listener(), _listener(), _listener(), _listener()
    ports = {name: s.getsockname()[1] for name, s in (("echo", echo), ("sink", sink),
                                                      ("http", http))}
    client = Client(listener.getsockname()[1])
    allow = [f"127.0.0.1:{p}" for p in ports.values()]
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=servers_main, args=(echo, sink, http), daemon=True),
             ctx.Process(target=proxy_main, args=(listener, allow), daemon=True)]
    for p in procs:
        p.start()
    for s in (echo, sink, http, listener):
        s.close()  # the children hold their copies
    results: dict[str, dict] = {}
    try:
        _wait_ready(client.proxy)
        paths = {"direct": client.direct, "connect": client.connect, "socks5": client.socks5}
        for name, open_ in paths.items():
            results[f"setup/{name}"] = summary(bench_setup(open_, ports["echo"], args.runs), 4)
            results[f"rtt64/{name}"] = summary(bench_rtt(open_, ports["echo"], args.runs * 5), 4)
            ms = bench_throughput(open_, ports["sink"], args.mib, args.transfers)
            results[f"throughput/{name}"] = _throughput(ms, args.mib)
        results["http_get/direct"] = summary(bench_http(None, ports["http"], args.runs), 4)
        results["http_get/proxy"] = summary(bench_http(client.proxy, ports["http"], args.runs), 4)
    finally:
        for p in procs:
            p.terminate()
            p.join(5)
    _print_table(results)
    results["_meta"] = {"python": sys.version.split()[0], "cpus": os.cpu_count(),
                        "runs": args.runs, "mib": args.mib, "transfers": args.transfers,
                        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2, sort_keys=True)
        f.write("\n")
    print(f"\nwritten: {args.json}")
    return 0


def _wait_ready(address: tuple[str, int]) -> None:
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(address, timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _throughput(ms: list[float], mib: int) -> dict[str, float]:
    s = summary(ms, 4)
    return {**s, "median_mib_s": round(mib / (s["median_ms"] / 1000.0), 1),
            "p95_mib_s": round(mib / (s["p95_ms"] / 1000.0), 1)}


def _print_table(results: dict[str, dict]) -> None:
    print(f"{'measure':<12} {'path':<9} {'median':>12} {'p95':>12} {'vs direct':>12}")
    order = ["setup", "rtt64", "http_get", "throughput"]
    for key, row in sorted(results.items(), key=lambda kv: order.index(kv[0].split("/")[0])):
        measure_, path = key.split("/")
        direct_key = f"{measure_}/direct"
        if measure_ == "throughput":
            med, p95, unit = row["median_mib_s"], row["p95_mib_s"], "MiB/s"
            base = results[direct_key]["median_mib_s"]
            versus = f"{med / base:.2f}x"
        else:
            med, p95, unit = row["median_ms"], row["p95_ms"], "ms"
            base = results[direct_key]["median_ms"]
            versus = "" if path == "direct" else f"+{med - base:.3f} ms"
        print(f"{measure_:<12} {path:<9} {med:>8.3f} {unit:<3} {p95:>8.3f} {unit:<3} {versus:>12}")


if __name__ == "__main__":
    raise SystemExit(main())
