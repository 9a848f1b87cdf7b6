"""Spawn cost of a confined /bin/true, beside the alternatives, measured in one run.

    python bench/spawn.py [--runs N] [--json FILE]

Rows: plain subprocess.run, os.posix_spawn, `unshare -rn`, bubblewrap with isolation
equivalent to our default policy (user/mount/net/ipc/pid namespaces, the same read-only
roots, private /tmp, minimal /dev, fresh /proc, new session, die-with-parent, no
capabilities, and our baseline seccomp program through --seccomp), hcp-linux through the
Python API, and the `hcp-linux run` CLI beside `python -c pass` from the same venv.
Reports median and p95 in milliseconds and the ratios that matter. Timing only: nothing
here asserts a limit.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from hcp_linux import Policy, Sandbox  # noqa: E402

TRUE = "/bin/true"


def measure(fn: Callable[[], object], runs: int, warmup: int = 5) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000.0)
    return out


def summary(samples: list[float]) -> dict[str, float]:
    samples = sorted(samples)
    p95 = samples[min(len(samples) - 1, int(round(0.95 * (len(samples) - 1))))]
    return {"median_ms": round(statistics.median(samples), 3), "p95_ms": round(p95, 3),
            "runs": len(samples)}


def posix_spawn_true() -> None:
    pid = os.posix_spawn(TRUE, [TRUE], {})
    os.waitpid(pid, 0)


def bwrap_argv(jail: str, seccomp_fd: int | None) -> list[str]:
    argv = ["bwrap", "--unshare-user", "--unshare-ipc", "--unshare-pid", "--unshare-net",
            "--unshare-uts", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    for root in ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/etc", "/opt"):
        if os.path.islink(root):
            argv += ["--symlink", os.readlink(root), root]
        elif os.path.isdir(root):
            argv += ["--ro-bind", root, root]
    argv += ["--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", "--bind", jail, jail,
             "--chdir", jail]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    return argv + ["--", TRUE]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--json", default=os.path.join(HERE, "results", "spawn.json"))
    args = ap.parse_args()
    runs = args.runs
    results: dict[str, dict] = {}
    jail = tempfile.mkdtemp(prefix="hcp-bench-")
    try:
        sandbox = Sandbox(Policy(jail=jail))
        first = sandbox.run([TRUE])
        if first.returncode != 0:
            print(f"hcp-linux run of {TRUE} failed: {first.returncode}", file=sys.stderr)
            return 1
        rows: list[tuple[str, Callable[[], object]]] = [
            ("subprocess.run", lambda: subprocess.run([TRUE], check=True)),
            ("os.posix_spawn", posix_spawn_true),
            ("hcp-linux (Sandbox.run, default policy)", lambda: sandbox.run([TRUE])),
        ]
        if shutil.which("unshare"):
            rows.append(("unshare -rn", lambda: subprocess.run(["unshare", "-rn", TRUE],
                                                               check=True)))
        if shutil.which("bwrap"):
            import seccomp_profiles
            bpf = seccomp_profiles.compile_profiles(("baseline",))

            def bwrap_run() -> None:
                r, w = os.pipe()
                os.write(w, bpf)
                os.close(w)
                subprocess.run(bwrap_argv(jail, r), check=True, pass_fds=(r,))
                os.close(r)
            rows.append(("bubblewrap (equivalent isolation + seccomp)", bwrap_run))
        venv_bin = os.path.dirname(sys.executable)
        cli = os.path.join(venv_bin, "hcp-linux")
        if os.path.exists(cli):
            rows.append(("python -c pass (same venv)",
                         lambda: subprocess.run([sys.executable, "-c", "pass"], check=True)))
            rows.append(("hcp-linux run -- /bin/true (CLI)",
                         lambda: subprocess.run([cli, "run", "--jail", jail, "--", TRUE],
                                                check=True)))
        for name, fn in rows:
            n = runs if "CLI" not in name and "python -c" not in name else max(20, runs // 5)
            results[name] = summary(measure(fn, n))
    finally:
        shutil.rmtree(jail, ignore_errors=True)

    def med(key: str) -> float | None:
        for name, r in results.items():
            if name.startswith(key):
                return r["median_ms"]
        return None

    hcp, plain, bw = med("hcp-linux (Sandbox"), med("subprocess.run"), med("bubblewrap")
    cli, py = med("hcp-linux run"), med("python -c pass")
    ratios = {}
    if hcp and plain:
        ratios["hcp_minus_subprocess_ms"] = round(hcp - plain, 3)
    if hcp and bw:
        ratios["hcp_over_bwrap"] = round(hcp / bw, 3)
    if cli and py:
        ratios["cli_over_python_c_pass"] = round(cli / py, 3)
    w = max(len(n) for n in results)
    print(f"{'spawn of /bin/true':<{w}}  {'median ms':>9}  {'p95 ms':>7}  runs")
    for name, r in results.items():
        print(f"{name:<{w}}  {r['median_ms']:>9.3f}  {r['p95_ms']:>7.3f}  {r['runs']}")
    for k, v in ratios.items():
        print(f"{k}: {v}")
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"results": results, "ratios": ratios, "uname": os.uname().release,
                   "euid": os.geteuid()}, f, indent=2)
    print(f"(json: {args.json})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
