"""The cost of recording seccomp denials (SECCOMP_RET_USER_NOTIF answered by the runtime).

    python bench/denials.py [--runs N] [--executor native|ctypes] [--json FILE]

Rows, measured in interleaved passes (timing.measure_rows), each mode before every call:
- /bin/true under the default policy, denials recorded (the filter notifies a listener) and
  not (set_denial_records(False): the filter answers RET_ERRNO itself, today's program):
  what every run pays for the listener (a socketpair, a thread, one recvmsg);
- a python3 command that makes N blocked unshare(CLONE_NEWNS) calls, both modes: the whole
  run's time, and the command's own timing of its loop, per blocked call (in microseconds):
  RET_ERRNO answers in the kernel; USER_NOTIF costs a round trip to the runtime's thread.
  That per-call cost is also what each thread creation would pay if clone3's ENOSYS probe
  were notified (it is not). Timing only: nothing is asserted.
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

FLOOD = r"""
import ctypes, sys, time
unshare = ctypes.CDLL(None, use_errno=True).unshare
n = int(sys.argv[1])
t = time.perf_counter()
for _ in range(n):
    unshare(0x00020000)
print((time.perf_counter() - t) / max(n, 1) * 1e6)
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--blocked", type=int, default=1000)
    ap.add_argument("--executor", default="native")
    ap.add_argument("--json")
    a = ap.parse_args()
    jail = tempfile.mkdtemp(prefix="hcp-bench-denials-")
    sandbox = Sandbox(Policy(jail=jail), executor=a.executor)
    per_call: dict[str, list[float]] = {"recorded": [], "not recorded": []}

    def true(mode: bool):  # type: ignore[no-untyped-def]
        def call() -> None:
            rulesets.set_denial_records(mode)
            r = sandbox.run(["/bin/true"])
            assert r.returncode == 0
        return call

    def flood(mode: bool):  # type: ignore[no-untyped-def]
        def call() -> None:
            rulesets.set_denial_records(mode)
            r = sandbox.run(["python3", "-c", FLOOD, str(a.blocked)], capture_output=True)
            assert r.returncode == 0, r.stderr
            per_call["recorded" if mode else "not recorded"].append(float(r.stdout))
            n = len(r.receipt.get("denials", ())) + sum(
                r.receipt.get("denials_not_recorded", {}).values())
            assert n == (a.blocked if mode else 0), n
        return call

    rows = [("/bin/true, denials recorded (USER_NOTIF)", true(True), a.runs),
            ("/bin/true, not recorded (RET_ERRNO)", true(False), a.runs),
            (f"{a.blocked} blocked calls, recorded (USER_NOTIF)", flood(True), a.runs // 4),
            (f"{a.blocked} blocked calls, not recorded (RET_ERRNO)", flood(False), a.runs // 4)]
    samples = measure_rows(rows, warmup=2)
    report(f"executor {a.executor}, runs {a.runs}, {a.blocked} blocked calls per flood run", samples, per_call,
           "per blocked call, {} (us, in the command)", a.json)

if __name__ == "__main__":
    main()
