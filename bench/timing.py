"""Timing helpers shared by the benchmarks: samples in milliseconds, median and p95."""
from __future__ import annotations

import os
import statistics
import time
from typing import Callable


def measure(fn: Callable[[], object], runs: int, warmup: int = 5,
            gap: float = 0.0) -> list[float]:
    """``runs`` timings of ``fn`` in ms, after ``warmup`` untimed calls (caches filled).
    ``gap``: seconds of idleness before each call (untimed), as between an agent's commands."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(runs):
        if gap:
            time.sleep(gap)
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000.0)
    return out


def measure_rows(rows: list[tuple[str, Callable[[], object], int]], rounds: int = 4,
                 warmup: int = 5, gap: float = 0.0) -> dict[str, list[float]]:
    """Samples (ms) for each (name, fn, runs) row, taken in ``rounds`` passes over all rows,
    each pass timing a block of consecutive calls per row. The host's speed drifts over a
    run (a VM: by a third within minutes); in passes the drift falls on every row alike, so
    the ratios between rows hold, while each block still measures back-to-back calls."""
    out: dict[str, list[float]] = {name: [] for name, _, _ in rows}
    for i in range(rounds):
        for name, fn, runs in rows:
            share = runs // rounds + (1 if i < runs % rounds else 0)
            out[name] += measure(fn, share, warmup if i == 0 else 1, gap)
    return out


def _busy_seconds() -> float:
    """CPU time spent by the whole machine (every CPU, every process, kernel threads
    included) since boot, from the first line of /proc/stat."""
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq = (
            int(v) for v in f.readline().split()[1:8])
    # not steal (the hypervisor's), nor guest (already in user)
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def cpu_per_run(fn: Callable[[], object], runs: int, settle: float = 0.5) -> float:
    """Machine-wide CPU milliseconds per call of ``fn``: what a run costs every CPU together,
    work deferred to kernel threads (a network namespace's teardown) included, which is what
    bounds back-to-back runs on a small machine. ``settle`` seconds after the last call let
    deferred work finish (the idle machine's own use in them is counted too: keep it short)."""
    fn()
    before = _busy_seconds()
    for _ in range(runs):
        fn()
    time.sleep(settle)
    return (_busy_seconds() - before) * 1000.0 / runs


def _tree_seconds() -> float:
    """CPU time of this process (every thread) and of its descendants reaped so far."""
    import resource
    own, reaped = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(
        resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime


def tree_cpu_per_run(fn: Callable[[], object], runs: int, settle: float = 0.5) -> float:
    """CPU milliseconds per call of ``fn`` spent by this process and the processes it
    started (once reaped): unlike :func:`cpu_per_run`, blind to the kernel's threads, but
    also to other users of a shared machine."""
    fn()
    before = _tree_seconds()
    for _ in range(runs):
        fn()
    time.sleep(settle)
    return (_tree_seconds() - before) * 1000.0 / runs


def summary(samples: list[float], digits: int = 3) -> dict[str, float]:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]
    return {"median_ms": round(statistics.median(ordered), digits),
            "p95_ms": round(p95, digits), "runs": len(ordered)}


def report(header: str, samples: dict[str, list[float]], per_call: dict[str, list[float]],
           per_call_label: str, json_path: str | None) -> None:
    """Print a bench's rows (median/p95 of each) and the median of each per-call series
    (measured inside the command), one line each under ``header``; also to ``json_path``."""
    import json
    import statistics
    out: dict[str, dict[str, float]] = {name: summary(s) for name, s in samples.items()}
    for mode, values in per_call.items():
        out[per_call_label.format(mode)] = {"median": round(statistics.median(values), 2)}
    print(header)
    for name, s in out.items():
        print(f"{name:55} {json.dumps(s)}")
    if json_path:
        with open(json_path, "w") as f:
            json.dump(out, f, indent=1)
