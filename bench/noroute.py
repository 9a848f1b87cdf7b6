"""The cost of recording connect() attempts that find no route (network = "allow").

    python bench/noroute.py [--runs N] [--connects N] [--executor native|ctypes] [--json FILE]

Under network = "allow" the filter hands every connect() to the runtime's listener, which
reads the destination, records it if it has no route, and answers "continue". Rows, measured
in interleaved passes (timing.measure_rows), each mode set before every call:
- a python3 command making N UDP connect()s to 127.0.0.1 (the "continue" path: the kernel
  runs each, nothing is recorded), observed (the default) and not (set_denial_records(False):
  today's program, connect() allowed in the kernel): the whole run, and the command's own
  timing of its loop, per connect (in microseconds);
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

from hcp_linux import Policy, Sandbox, rulesets  # noqa: E402
from timing import measure_rows, report  # noqa: E402

CONNECTS = r"""
import socket, sys, time
n = int(sys.argv[1])
socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(n)]
t = time.perf_counter()
for s in socks:
    s.connect(("127.0.0.1", 9))
print((time.perf_counter() - t) / max(n, 1) * 1e6)
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--connects", type=int, default=1000)
    ap.add_argument("--executor", default="native")
    ap.add_argument("--json")
    a = ap.parse_args()
    jail = tempfile.mkdtemp(prefix="hcp-bench-noroute-")
    allow = Sandbox(Policy(jail=jail, network="allow", allow_hosts=("example.com",)),
                    executor=a.executor)
    default = Sandbox(Policy(jail=jail), executor=a.executor)
    per_call: dict[str, list[float]] = {"observed": [], "not observed": []}

    def connects(mode: bool):  # type: ignore[no-untyped-def]
        def call() -> None:
            rulesets.set_denial_records(mode)
            r = allow.run(["python3", "-c", CONNECTS, str(a.connects)], capture_output=True)
            assert r.returncode == 0, r.stderr
            assert r.receipt["denials"] == []
            per_call["observed" if mode else "not observed"].append(float(r.stdout))
        return call

    def true(mode: bool):  # type: ignore[no-untyped-def]
        def call() -> None:
            rulesets.set_denial_records(mode)
            r = default.run(["/bin/true"])
            assert r.returncode == 0
        return call

    rows = [(f"allow: {a.connects} loopback connects, observed", connects(True), a.runs // 4),
            (f"allow: {a.connects} loopback connects, not observed", connects(False),
             a.runs // 4),
            ("default policy /bin/true, listener", true(True), a.runs),
            ("default policy /bin/true, no listener", true(False), a.runs)]
    samples = measure_rows(rows, warmup=2)
    report(f"executor {a.executor}, runs {a.runs}, {a.connects} connects per run", samples, per_call,
           "per loopback connect, {} (us, in the command)", a.json)

if __name__ == "__main__":
    main()
