"""The ctypes executor's two starts, side by side: a fork of the runtime vs the helper process.

    python bench/ctypes_helper.py [--runs N] [--json FILE]

Rows (Sandbox.run(["/bin/true"]), default policy, executor="ctypes"): the child side in a
fork of this process, and in a fresh helper process (hcp_linux.ctypes_executor.child_main), each from a
runtime with no busy thread and with 8 threads spinning in Python; then `hcp-linux run`
(one run per process, which has one thread when it spawns) with each. "fork" from a threaded
runtime is the old behaviour, the hazard the helper removes; it is timed for reference only
(child_main.threads is replaced for those rows, to force the fork). Samples are taken in
passes over all rows (bench/timing.py), median and p95 in ms. Timing only: nothing asserted.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
from typing import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from hcp_linux import Policy, Sandbox  # noqa: E402
from hcp_linux.ctypes_executor import child_main  # noqa: E402
from timing import measure_rows, summary  # noqa: E402


def row(sandbox: Sandbox, how: str) -> Callable[[], None]:
    real = child_main.threads

    def run() -> None:
        # "fork": forced whatever the thread count; "helper": never a fork
        child_main.threads = (lambda: 1) if how == "fork" else real  # type: ignore[assignment]
        child_main.FORK_WHEN_ALONE = how == "fork"
        try:
            r = sandbox.run(["/bin/true"])
        finally:
            child_main.threads, child_main.FORK_WHEN_ALONE = real, True  # type: ignore
        if r.returncode != 0:
            raise SystemExit(f"/bin/true failed: {r.returncode}")
    return run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=60)
    ap.add_argument("--json")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as jail:
        sandbox = Sandbox(Policy(jail=jail), executor="ctypes")
        results = {}
        for label, busy in (("no busy thread", 0), ("8 busy threads", 8)):
            stop = threading.Event()

            def spin() -> None:
                while not stop.is_set():
                    pass
            spinners = [threading.Thread(target=spin, daemon=True) for _ in range(busy)]
            for t in spinners:
                t.start()
            try:
                samples = measure_rows([(f"fork, {label}", row(sandbox, "fork"), args.runs),
                                        (f"helper, {label}", row(sandbox, "helper"), args.runs)])
            finally:
                stop.set()
                for t in spinners:
                    t.join()
            results.update({name: summary(s) for name, s in samples.items()})
        # the CLI: one run per process, single-threaded at its spawn: fork unless told not to
        cli = ("import sys; from hcp_linux.ctypes_executor import child_main; "
               "child_main.FORK_WHEN_ALONE = %s; "
               "from hcp_linux.cli.launch import entry; sys.argv[0] = 'hcp-linux'; entry()")
        rows = []
        for how, fork in (("fork", True), ("helper", False)):
            argv = [sys.executable, "-c", cli % fork, "run", "--executor", "ctypes", "--jail",
                    jail, "--", "/bin/true"]
            rows.append((f"CLI run, {how}",
                         lambda argv=argv: subprocess.run(argv, check=True), args.runs // 2))
        samples = measure_rows(rows)
        results.update({name: summary(s) for name, s in samples.items()})
    for name, s in results.items():
        print(f"{name:28} median {s['median_ms']:7.2f} ms   p95 {s['p95_ms']:7.2f} ms   "
              f"({s['runs']} runs)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
