"""The cost of reading Landlock's denials from the kernel's audit records (root only).

    sudo python bench/landlock_audit.py [--runs N] [--denied N] [--executor native|ctypes]
                                         [--json FILE]

Landlock logs its denials to the audit subsystem only, and only while audit is on. This
bench turns audit on for the rows that need it and restores the state it found (AUDIT_SET
enabled=...; nothing else of the host's audit configuration changes). Rows, measured in
interleaved passes (timing.measure_rows), each mode set before every call:
- /bin/true under the default policy, audit on (the runtime reads: one status read and the
  end-of-run marker's round trip through the kernel's audit thread) and audit off (a status
  read at most once a second);
- a python3 command that makes N opens Landlock refuses (the canary at the view's root), audit
  on and off: the whole run's time, and the command's own time per refused open (in
  microseconds): with audit on the kernel formats and queues records for each; without
  auditd it also prints them to the kernel log, and drops what passes its backlog limit
  (the receipt then says "incomplete"). Timing only: nothing is asserted but the counts.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))  # runtime_hooks

from hcp_linux import Policy, Sandbox  # noqa: E402
from hcp_linux.observe import audit, landlock_log  # noqa: E402
from runtime_hooks import audit_changed, set_audit  # noqa: E402
from timing import measure_rows, report  # noqa: E402

FLOOD = r"""
import sys, time
n = int(sys.argv[1])
t = time.perf_counter()
for _ in range(n):
    try:
        open("/.hcp-canary")
    except PermissionError:
        pass
print((time.perf_counter() - t) / max(n, 1) * 1e6)
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--denied", type=int, default=1000)
    ap.add_argument("--executor", default="native")
    ap.add_argument("--json")
    a = ap.parse_args()
    why = landlock_log.available()
    if why:
        sys.exit(f"bench/landlock_audit.py: Landlock's records are not readable here ({why})")
    before = audit.status().enabled
    if before == 2:
        sys.exit("bench/landlock_audit.py: audit's configuration is locked (enabled=2)")
    jail = tempfile.mkdtemp(prefix="hcp-bench-landlock-audit-")
    sandbox = Sandbox(Policy(jail=jail), executor=a.executor)
    per_call: dict[str, list[float]] = {"audit on": [], "audit off": []}
    said: dict[str, set[str]] = {"audit on": set(), "audit off": set()}

    current: list[bool] = []

    def mode(on: bool) -> str:
        """Set audit on or off, only when it changes: in each block of a row that is its
        first call, which measure_rows does not time."""
        if current != [on]:
            set_audit(int(on))
            audit_changed()
            current[:] = [on]
        return "audit on" if on else "audit off"

    def true(on: bool):  # type: ignore[no-untyped-def]
        def call() -> None:
            mode(on)
            r = sandbox.run(["/bin/true"])
            assert r.returncode == 0
        return call

    def flood(on: bool):  # type: ignore[no-untyped-def]
        def call() -> None:
            name = mode(on)
            r = sandbox.run(["python3", "-c", FLOOD, str(a.denied)], capture_output=True)
            assert r.returncode == 0, r.stderr
            per_call[name].append(float(r.stdout))
            said[name].add(r.receipt["denial_layers"]["landlock"].split(":")[0])
        return call

    rows = [("/bin/true, audit on: records read", true(True), a.runs),
            ("/bin/true, audit off", true(False), a.runs),
            (f"{a.denied} refused opens, audit on", flood(True), a.runs // 4),
            (f"{a.denied} refused opens, audit off", flood(False), a.runs // 4)]
    try:
        samples = measure_rows(rows, warmup=2)
    finally:
        set_audit(before)
    report(f"executor {a.executor}, runs {a.runs}, {a.denied} refused opens per flood run; "
           f"the layer said: {dict((k, sorted(v)) for k, v in said.items())}", samples,
           per_call, "per refused open, {} (us, in the command)", a.json)


if __name__ == "__main__":
    main()
