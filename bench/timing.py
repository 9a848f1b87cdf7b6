"""Timing helpers shared by the benchmarks: samples in milliseconds, median and p95."""
from __future__ import annotations

import statistics
import time
from typing import Callable


def measure(fn: Callable[[], object], runs: int, warmup: int = 5) -> list[float]:
    """``runs`` timings of ``fn`` in ms, after ``warmup`` untimed calls (caches filled)."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000.0)
    return out


def measure_rows(rows: list[tuple[str, Callable[[], object], int]], rounds: int = 4,
                 warmup: int = 5) -> dict[str, list[float]]:
    """Samples (ms) for each (name, fn, runs) row, taken in ``rounds`` passes over all rows,
    each pass timing a block of consecutive calls per row. The host's speed drifts over a
    run (a VM: by a third within minutes); in passes the drift falls on every row alike, so
    the ratios between rows hold, while each block still measures back-to-back calls."""
    out: dict[str, list[float]] = {name: [] for name, _, _ in rows}
    for i in range(rounds):
        for name, fn, runs in rows:
            share = runs // rounds + (1 if i < runs % rounds else 0)
            out[name] += measure(fn, share, warmup if i == 0 else 1)
    return out


def summary(samples: list[float], digits: int = 3) -> dict[str, float]:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]
    return {"median_ms": round(statistics.median(ordered), digits),
            "p95_ms": round(p95, digits), "runs": len(ordered)}
