"""Soak: many confined runs leak nothing in the runtime process or on the host.

    python bench/soak.py [--sequential 10000] [--threads 8] [--per-thread 1000]
    python bench/soak.py --long-life [--runs 100000] [--fault-every 500] [--seed N]

Counts, before and after (after a warm-up, so caches are filled first): the runtime's open
fds, its mount table, processes left in nested pid namespaces, zombies, the runtime's children, temp dirs named
hcp-*, and the runtime's resident memory. Prints a table and writes JSON; exits 1 if any
count grew (RSS is reported, judged by its growth per 1,000 runs).

``--long-life`` (issue 29): one runtime process (a child of this one, which is its subreaper
and reaps what a killed helper orphans) makes ``--runs`` sequential runs of ``sh -c 'echo
ok'`` (native executor by default); about one run in ``--fault-every`` has a helper SIGKILLed
(bench/long_life.py: an idle spare, the spare at its hand-over or just after, the monitor or
init between start and exec or at the seccomp listener's hand-over). Every other run must
print ok. Samples RSS, fds, threads and children ten times; at the end, after
release_resources, counts the runtime's descendants, processes in nested pid namespaces,
mounts and hcp-* temp dirs. Exits 1 on a failed unfaulted run, a leftover, or RSS growth
over 5 MB.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
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


def _fd_targets() -> list[str]:
    """What this process's fds are (socket:[...] shown as "socket")."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        out.append(target.split(":[")[0] if ":[" in target else target)
    return out


def os_threads() -> int:
    return _status_field("Threads")


def long_life_child(args: argparse.Namespace) -> dict:
    """The runtime: ``args.runs`` runs with faults sprinkled in; the report."""
    import collections
    import random

    import long_life
    from hcp_linux import release_resources
    rng = random.Random(args.seed)
    jail = tempfile.mkdtemp(prefix="soak-jail-")
    sandbox = Sandbox(Policy(jail=jail))
    hooks = long_life.Hooks(rng)
    argv = ["sh", "-c", "echo ok"]
    failures: list[str] = []
    faults: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)

    def one() -> None:
        try:
            r = sandbox.run(argv, capture_output=True, timeout=20)
            if (r.returncode, r.stdout) != (0, b"ok\n"):
                failures.append(f"rc={r.returncode} {r.stderr[-200:]!r}")
        except Exception as e:  # noqa: BLE001 - a failed unfaulted run is the finding
            failures.append(f"{type(e).__name__}: {e}"[:300])

    for _ in range(200):  # warm-up: caches, lazy imports, spares
        one()
    for point in long_life.HELPER_KINDS:  # and what faults start once (the launcher thread)
        long_life.helper_fault(rng, hooks, sandbox, point, ("SIGKILL",))
    for _ in range(200):
        one()
    release_resources()  # fds and threads compared with the spares retired, at both ends
    long_life.on_a_thread(one, 30)  # a spare started on the spot from another thread:
    release_resources()             # the launcher thread, as a fault's run would start it
    time.sleep(0.5)
    before = {**snapshot(), "os_threads": os_threads()}
    names_before = sorted(t.name for t in threading.enumerate())
    fds_before = _fd_targets()
    samples = []
    step = max(1, args.runs // 10)
    t0 = time.perf_counter()
    for i in range(args.runs):
        if rng.random() < 1.0 / args.fault_every:
            point = rng.choice(long_life.HELPER_KINDS)
            name, what = long_life.helper_fault(rng, hooks, sandbox, point, ("SIGKILL",))
            faults[name.split(" (")[0]][what] += 1
        else:
            one()
        if (i + 1) % step == 0:
            samples.append({"runs": i + 1, "seconds": round(time.perf_counter() - t0, 1),
                            "rss_kib": _status_field("VmRSS"),
                            "fds": len(os.listdir("/proc/self/fd")),
                            "threads": threading.active_count(), "os_threads": os_threads()})
            print(json.dumps(samples[-1]), flush=True)
    seconds = time.perf_counter() - t0
    hooks.uninstall()
    time.sleep(0.5)
    after = {**snapshot(), "os_threads": os_threads()}
    names_after = sorted(t.name for t in threading.enumerate())
    release_resources()
    deadline = time.monotonic() + 10
    while True:
        left = long_life.descendants(os.getpid())
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    end = {**snapshot(), "os_threads": os_threads()}
    fds_end = _fd_targets()
    jail_left = os.listdir(jail)
    os.rmdir(jail) if not jail_left else None
    return {"runs": args.runs, "seconds": round(seconds, 1),
            "runs_per_s": round(args.runs / seconds, 1), "seed": args.seed,
            "faults": sum(sum(c.values()) for c in faults.values()),
            "by_fault": {k: dict(v) for k, v in sorted(faults.items())},
            "unfaulted_failures": len(failures), "failure_samples": failures[:10],
            "before": before, "after": after, "after_release": end, "samples": samples,
            "threads_before": names_before, "threads_after": names_after,
            "fds_added": sorted((collections.Counter(fds_end)
                                 - collections.Counter(fds_before)).elements()),
            "rss_growth_kib": after["rss_kib"] - before["rss_kib"],
            "fds_growth": end["fds"] - before["fds"],
            "threads_growth": end["os_threads"] - before["os_threads"],
            "descendants_left": len(left), "jail_left": jail_left[:10]}


def long_life(args: argparse.Namespace) -> int:
    """The supervisor: a child subreaper that runs the runtime and reaps its orphans."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(36, 1, 0, 0, 0) != 0:  # PR_SET_CHILD_SUBREAPER
        raise OSError(ctypes.get_errno(), "PR_SET_CHILD_SUBREAPER")
    mounts_before = _mounts()
    tmp_before = set(_jails())
    fd, out = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    child = subprocess.Popen([sys.executable, __file__, "--long-life", "--child", out,
                              "--runs", str(args.runs), "--fault-every", str(args.fault_every),
                              "--seed", str(args.seed)])
    stop = threading.Event()

    def reap_orphans() -> None:
        while not stop.is_set():
            time.sleep(0.01)
            with open(f"/proc/self/task/{os.getpid()}/children") as f:
                kids = [int(k) for k in f.read().split()]
            for kid in kids:
                if kid == child.pid:
                    continue
                try:
                    os.waitpid(kid, os.WNOHANG)
                except ChildProcessError:
                    pass
    threading.Thread(target=reap_orphans, daemon=True).start()
    child.wait()
    time.sleep(1.0)
    stop.set()
    with open(f"/proc/self/task/{os.getpid()}/children") as f:
        orphans = [int(k) for k in f.read().split()]
    with open(out) as f:
        report = json.load(f)
    os.unlink(out)
    report["orphans_left"] = orphans
    report["mounts_added"] = sorted(set(_mounts()) - set(mounts_before))
    report["tmp_dirs_added"] = sorted(set(_jails()) - tmp_before)
    text = json.dumps(report, indent=2)
    print(text)
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as f:
        f.write(text)
    bad = (report["unfaulted_failures"] or report["descendants_left"] or orphans
           or report["mounts_added"] or report["tmp_dirs_added"] or report["jail_left"]
           or report["rss_growth_kib"] > 5 * 1024 or child.returncode
           or _grown(report))
    return 1 if bad else 0


def _grown(report: dict) -> bool:
    """Threads or fds that grew: a thread name found more often at the end than at the start
    (a service started once on first use, such as the audit reader when audit was turned
    on meanwhile, is a new name once: reported, not a leak), or more fds than the new
    services account for (one each)."""
    import collections
    before = collections.Counter(report["threads_before"])
    after = collections.Counter(report["threads_after"])
    again = [n for n in after if after[n] > max(before[n], 1)]
    started_once = len([n for n in after if n not in before])
    return bool(again) or report["fds_growth"] > started_once


def _jails() -> list[str]:
    """Directories a run of ours may leave in the temp dir (the jail names, reclaim.JAIL_RE),
    and soak-jail-* (this bench's)."""
    from hcp_linux.jails.reclaim import JAIL_RE
    tmp = tempfile.gettempdir()
    return [n for n in os.listdir(tmp) if JAIL_RE.match(n) or n.startswith("soak-jail-")]


def _mounts() -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4] for line in f]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--long-life", action="store_true")
    ap.add_argument("--runs", type=int, default=100_000, help="--long-life: runs")
    ap.add_argument("--fault-every", type=int, default=500,
                    help="--long-life: one run in N (on average) has a helper SIGKILLed")
    ap.add_argument("--seed", type=int, default=29)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--sequential", type=int, default=10_000)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--per-thread", type=int, default=1_000)
    ap.add_argument("--json", default=os.path.join(HERE, "results", "soak.json"))
    args = ap.parse_args()
    if args.long_life and args.child:
        report = long_life_child(args)
        with open(args.child, "w") as f:
            json.dump(report, f)
        return 0
    if args.long_life:
        if args.json == os.path.join(HERE, "results", "soak.json"):
            args.json = os.path.join(HERE, "results", "soak-long-life.json")
        return long_life(args)
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
