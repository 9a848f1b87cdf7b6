"""The cost of recording connect() and send attempts that find no route (network = "allow").

    python bench/noroute.py [--runs N] [--calls N] [--executor native|ctypes] [--json FILE]

Under network = "allow" the filter hands every connect(), every sendto() with a
destination and every sendmsg()/sendmmsg() to the runtime's listener, which reads the
destination, records it if it has no route, and answers "continue". Rows, measured in
interleaved passes (timing.measure_rows), each mode set before every call:
- a python3 command making N calls of one kind to 127.0.0.1 (the "continue" path: the kernel
  runs each, nothing is recorded): UDP connect(), UDP sendto() with the address, UDP
  sendmsg() with the address (every sendmsg() is handed over, addressed or not), and, as the
  control that is never handed over, send() on a connected UDP socket (sendto() with a NULL
  address); observed (the default) and not (set_denial_records(False): the program without
  the rules, the calls allowed in the kernel): the whole run, and the command's own timing
  of its loop, per call (in microseconds);
- /bin/true under the default policy (network none), whose program has no connect rule:
  both modes, which differ only by the denial listener (bench/denials.py measures that).
Timing only: nothing is asserted but what each run must record.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from hcp_linux import Policy, Sandbox  # noqa: E402
from hcp_linux.plan import rulesets  # noqa: E402
from timing import measure_rows, report  # noqa: E402

#: argv: kind, n. The receiver's buffer holds every datagram (1 byte each): no drop, no
#: ICMP answer that would fail a later send.
CALLS = r"""
import socket, sys, time
kind, n = sys.argv[1], int(sys.argv[2])
rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
rx.bind(("127.0.0.1", 0))
to = rx.getsockname()
tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
if kind == "connect":
    socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(n)]
    call = iter(socks)
    def one():
        next(call).connect(to)
elif kind == "sendto":
    def one():
        tx.sendto(b"x", to)
elif kind == "sendmsg":
    def one():
        tx.sendmsg([b"x"], [], 0, to)
elif kind == "send":
    tx.connect(to)
    def one():
        tx.send(b"x")
t = time.perf_counter()
for _ in range(n):
    one()
print((time.perf_counter() - t) / max(n, 1) * 1e6)
"""

KINDS = ("connect", "sendto", "sendmsg", "send")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--calls", "--connects", dest="connects", type=int, default=1000)
    ap.add_argument("--executor", default="native")
    ap.add_argument("--json")
    a = ap.parse_args()
    jail = tempfile.mkdtemp(prefix="hcp-bench-noroute-")
    allow = Sandbox(Policy(jail=jail, network="allow", allow_hosts=("example.com",)),
                    executor=a.executor)
    default = Sandbox(Policy(jail=jail), executor=a.executor)
    per_call: dict[str, list[float]] = {f"{kind}, {mode}": [] for kind in KINDS
                                        for mode in ("observed", "not observed")}

    def calls(kind: str, mode: bool):  # type: ignore[no-untyped-def]
        def call() -> None:
            rulesets.set_denial_records(mode)
            r = allow.run(["python3", "-c", CALLS, kind, str(a.connects)], capture_output=True)
            assert r.returncode == 0, r.stderr
            assert r.receipt["denials"] == []
            per_call[f"{kind}, {'observed' if mode else 'not observed'}"].append(
                float(r.stdout))
        return call

    def true(mode: bool):  # type: ignore[no-untyped-def]
        def call() -> None:
            rulesets.set_denial_records(mode)
            r = default.run(["/bin/true"])
            assert r.returncode == 0
        return call

    rows = [(f"allow: {a.connects} loopback {kind}s, {'observed' if mode else 'not observed'}",
             calls(kind, mode), a.runs // 4) for kind in KINDS for mode in (True, False)]
    rows += [("default policy /bin/true, listener", true(True), a.runs),
             ("default policy /bin/true, no listener", true(False), a.runs)]
    samples = measure_rows(rows, warmup=2)
    report(f"executor {a.executor}, runs {a.runs}, {a.connects} calls per run", samples, per_call,
           "per loopback call: {} (us, in the command)", a.json)

if __name__ == "__main__":
    main()
