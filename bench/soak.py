"""Soak: many confined runs leak nothing in the runtime process or on the host.

    python bench/soak.py [--sequential 10000] [--threads 8] [--per-thread 1000]

Counts, before and after (after a warm-up, so caches are filled first): the runtime's open
fds, its mount table, processes left in nested pid namespaces, zombies, the runtime's children, temp dirs named
hcp-*, and the runtime's resident memory. Prints a table and writes JSON; exits 1 if any
count grew (RSS is reported, judged by its growth per 1,000 runs).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from hcp_linux import Policy, Sandbox  # noqa: E402


def _status_field(name: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(name + ":"):
                return int(line.split()[1])
    return 0


def snapshot() -> dict[str, int]:
    pids = [p for p in os.listdir("/proc") if p.isdigit()]
    zombies = sandboxed = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as f:
                state, ppid = f.read().rsplit(")", 1)[1].split()[:2]
            zombies += state == "Z" and int(ppid) == os.getpid()  # ours, unreaped
            with open(f"/proc/{p}/status") as f:
                nspid = next((l for l in f if l.startswith("NSpid:")), "")
            sandboxed += len(nspid.split()) > 2  # lives in a nested pid namespace
        except OSError:
            pass
    children = 0
    for task in glob.glob("/proc/self/task/*/children"):
        with open(task) as f:
            children += len(f.read().split())
    with open("/proc/self/mountinfo") as f:
        mounts = len(f.readlines())
    return {
        "fds": len(os.listdir("/proc/self/fd")),
        "mounts": mounts,
        "sandboxed_processes": sandboxed,
        "zombies": zombies,
        "children": children,
        "threads": threading.active_count(),
        "tmp_hcp_dirs": len(glob.glob(os.path.join(tempfile.gettempdir(), "hcp-*"))),
        "rss_kib": _status_field("VmRSS"),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sequential", type=int, default=10_000)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--per-thread", type=int, default=1_000)
    ap.add_argument("--json", default=os.path.join(HERE, "results", "soak.json"))
    args = ap.parse_args()
    jail = tempfile.mkdtemp(prefix="soak-jail-")
    sandbox = Sandbox(Policy(jail=jail))
    argv = ["/bin/true"]
    failures: list[str] = []

    def one() -> None:
        run = sandbox.run(argv)
        if run.returncode != 0:
            failures.append(f"exit {run.returncode}")

    for _ in range(100):  # warm-up: caches, lazy imports
        one()
    time.sleep(0.2)
    before = snapshot()
    t0 = time.perf_counter()
    for _ in range(args.sequential):
        one()
    seq_s = time.perf_counter() - t0
    time.sleep(0.5)
    after_seq = snapshot()

    def worker() -> None:
        for _ in range(args.per_thread):
            one()
    threads = [threading.Thread(target=worker) for _ in range(args.threads)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    conc_s = time.perf_counter() - t0
    time.sleep(0.5)
    after_conc = snapshot()
    report_jail = sorted(os.listdir(jail))

    total = args.sequential + args.threads * args.per_thread
    report = {
        "runs": {"sequential": args.sequential,
                 "concurrent": f"{args.threads} x {args.per_thread}", "failures": len(failures)},
        "seconds": {"sequential": round(seq_s, 1), "concurrent": round(conc_s, 1)},
        "throughput_per_s": {"sequential": round(args.sequential / seq_s, 1),
                             "concurrent": round(args.threads * args.per_thread / conc_s, 1)},
        "before": before, "after_sequential": after_seq, "after_concurrent": after_conc,
        "rss_growth_kib_per_1000_runs": round((after_conc["rss_kib"] - before["rss_kib"])
                                              / total * 1000, 1),
    }
    keys = [k for k in before if k != "rss_kib"]
    leaked = {k: (before[k], after_conc[k]) for k in keys
              if after_seq[k] > before[k] or after_conc[k] > before[k]}
    report["leaked"] = leaked
    report["jail_left"] = report_jail  # the runs write nothing: expect []
    print(f"{'count':<16}{'before':>10}{'after seq':>12}{'after conc':>12}")
    for k in before:
        print(f"{k:<16}{before[k]:>10}{after_seq[k]:>12}{after_conc[k]:>12}")
    print(f"runs: {total} ({len(failures)} failed); sequential {seq_s:.1f}s "
          f"({report['throughput_per_s']['sequential']}/s), concurrent {conc_s:.1f}s "
          f"({report['throughput_per_s']['concurrent']}/s)")
    print(f"RSS growth: {report['rss_growth_kib_per_1000_runs']} KiB per 1,000 runs")
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(report, f, indent=2)
    print(f"(json: {args.json})")
    if leaked or failures:
        print(f"LEAK or FAILURE: {leaked} {failures[:5]}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
