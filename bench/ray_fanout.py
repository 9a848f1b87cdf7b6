"""1,000 confined commands fanned out over a local two-node Ray cluster, beside plain Ray tasks.

    python bench/ray_fanout.py [--commands N] [--rounds R] [--per-cpu K] [--json FILE]

Starts a Ray cluster on this machine (a head with 1 CPU and a worker node with 2, object
stores of 80 MB, loopback only), then, in alternating rounds so that the host's drift falls
on both alike:

- plain: N Ray tasks (``num_cpus=1``), each ``subprocess.run(["/bin/echo", i])``;
- hcp: N ``exec`` calls on hcp-linux sandboxes (``hcp_linux.ray.create``), one sandbox per
  CPU of the cluster (``max_concurrency=1``: the same three commands in flight as the plain
  tasks; ``num_cpus=0``, or the sandboxes would hold the CPUs the plain tasks need), the same
  argv under the default Policy, in each sandbox's session (the default: one confinement per
  sandbox, a fork and exec per command);
- hcp-per-command: the same with ``session=False``: a confinement of its own per command.

Reports per mode the median over rounds of: wall time for the N commands, throughput, wall
time per command (the overhead a caller sees, amortised over the cluster), and the median
time of one command inside its worker (``subprocess.run`` vs hcp-linux's confined run); and
the ratio hcp/plain of the wall times (the issue's goal: <= 1.5x in the same run).
``--per-cpu K`` puts K commands in flight per CPU in both modes (plain tasks ask
``num_cpus=1/K``, each sandbox serves ``max_concurrency=K``). Timing only:
nothing asserts a limit. Needs ``hcp-linux[ray]`` (scripts/test-ray makes such a venv).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # Ray on loopback only

import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

import hcp_linux.ray as hr  # noqa: E402

OBJECT_STORE = 80 * 1024 * 1024
#: plain Ray tasks; sandboxes with a session each (the default); a confinement per command
MODES = ("plain", "hcp", "hcp-per-command")


@ray.remote
def plain(argv: list[str]) -> tuple[int, float]:
    """The control: the same command as a plain Ray task, unconfined."""
    t0 = time.perf_counter()
    p = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    return p.returncode, time.perf_counter() - t0


def run_plain(n: int, per_cpu: int) -> tuple[float, list[float]]:
    t0 = time.perf_counter()
    task = plain.options(num_cpus=1 / per_cpu)
    out = ray.get([task.remote(["/bin/echo", str(i)]) for i in range(n)], timeout=300)
    wall = time.perf_counter() - t0
    assert all(code == 0 for code, _ in out), "a plain command failed"
    return wall, [d for _, d in out]


def run_hcp(boxes: list, n: int) -> tuple[float, list[float]]:
    t0 = time.perf_counter()
    refs = [boxes[i % len(boxes)].exec.remote(["/bin/echo", str(i)]) for i in range(n)]
    out = ray.get(refs, timeout=300)
    wall = time.perf_counter() - t0
    assert all(r.exit_code == 0 and r.stdout == f"{i}\n" for i, r in enumerate(out)), \
        "a confined command failed"
    return wall, [r.duration_seconds for r in out]


def summary(walls: list[float], inner: list[float], n: int) -> dict[str, float]:
    wall = statistics.median(walls)
    return {"wall_s": round(wall, 3), "commands_per_s": round(n / wall, 1),
            "wall_ms_per_command": round(1000 * wall / n, 3),
            "in_worker_median_ms": round(1000 * statistics.median(inner), 3),
            "in_worker_p95_ms": round(1000 * statistics.quantiles(inner, n=20)[18], 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--commands", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--per-cpu", type=int, default=1)
    ap.add_argument("--json", help="write the results here too")
    args = ap.parse_args()

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "object_store_memory": OBJECT_STORE, "include_dashboard": False})
    worker = cluster.add_node(num_cpus=2, object_store_memory=OBJECT_STORE)
    ray.init(address=cluster.address, log_to_driver=False)
    boxes: list = []
    try:
        cluster.wait_for_nodes()
        head_id, worker_id = cluster.head_node.node_id, worker.node_id
        # num_cpus=0: an actor holding a CPU would starve the plain tasks of it
        nodes = (head_id, worker_id, worker_id)
        sets = {mode: [hr.create(node_id=node, num_cpus=0, max_concurrency=args.per_cpu,
                                 session=mode == "hcp")
                       for node in nodes] for mode in MODES[1:]}
        boxes += [b for bs in sets.values() for b in bs]
        # warm-up: the worker pools, the sandboxes' executors, sessions and spares
        run_plain(60, args.per_cpu)
        for bs in sets.values():
            run_hcp(bs, 60)
        walls: dict[str, list[float]] = {m: [] for m in MODES}
        inner: dict[str, list[float]] = {m: [] for m in MODES}
        for r in range(args.rounds):
            order = MODES if r % 2 == 0 else MODES[::-1]
            for mode in order:
                wall, durations = (run_plain(args.commands, args.per_cpu) if mode == "plain"
                                   else run_hcp(sets[mode], args.commands))
                walls[mode].append(wall)
                inner[mode].extend(durations)
                print(f"round {r + 1} {mode:5s}: {wall:.2f} s", file=sys.stderr)
    finally:
        if boxes:
            ray.get([b.delete.remote() for b in boxes], timeout=60)
        ray.shutdown()
        cluster.shutdown()
    result: dict = {"commands": args.commands, "rounds": args.rounds, "cpus": 3,
                    "per_cpu": args.per_cpu}
    for mode in MODES:
        result[mode] = summary(walls[mode], inner[mode], args.commands)
    for mode in MODES[1:]:
        result[f"ratio_wall_{mode.replace('-', '_')}_over_plain"] = round(
            result[mode]["wall_s"] / result["plain"]["wall_s"], 3)
    print(f"{'':16s} {'wall s':>8s} {'cmd/s':>8s} {'ms/cmd':>8s} {'in-worker median ms':>20s}")
    for mode in MODES:
        s = result[mode]
        print(f"{mode:16s} {s['wall_s']:8.2f} {s['commands_per_s']:8.1f} "
              f"{s['wall_ms_per_command']:8.2f} {s['in_worker_median_ms']:20.2f}")
    print(f"ratio hcp/plain (wall, same run): {result['ratio_wall_hcp_over_plain']:.2f}x "
          f"(goal <= 1.5x); a confinement per command: "
          f"{result['ratio_wall_hcp_per_command_over_plain']:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
