"""Issue #16's goal: a fresh venv from the built wheel runs as fast as the `make setup` clone.

    python bench/installed.py [--runs N] [--rounds R] [--wheel-python PY] [--clone-python PY]
                              [--json FILE]

Times ``Sandbox(Policy(jail=J)).run(["/bin/true"])`` (the Policy and the Sandbox made anew
each call, as a runtime does per command) in two long-lived processes: one with the clone's
venv (``.venv/bin/python``, an editable install with ``make native``'s hcp-exec) and one with
a fresh venv into which the platform wheel was installed (built here, from this tree, unless
``--wheel-python`` names one, e.g. scripts/test-wheel's). Both run from ``/`` so that neither
imports the tree by accident, and each says where hcp_linux and hcp-exec came from and which
executor ran. The two take turns, a block of runs each per round, so that the host's drift
falls on both alike. Prints the medians, p95s and the ratio wheel/clone (the goal: <= 1.1).
Timing only: nothing here asserts a limit.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from typing import IO

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from timing import summary  # noqa: E402

#: The timed loop, in the venv under test: reads a count per line, answers with the times (ms).
WORKER = r"""
import json, sys, tempfile, time
import hcp_linux
from hcp_linux import Policy, Sandbox, native
jail = tempfile.mkdtemp(prefix="hcp-bench-installed-")
first = Sandbox(Policy(jail=jail)).run(["/bin/true"])
print(json.dumps({"hcp_linux": hcp_linux.__file__, "hcp_exec": native.binary(),
                  "executor": first.receipt["executor"]}), flush=True)
for line in sys.stdin:
    times = []
    for _ in range(int(line)):
        t0 = time.perf_counter()
        run = Sandbox(Policy(jail=jail)).run(["/bin/true"])
        times.append((time.perf_counter() - t0) * 1000.0)
        assert run.returncode == 0, run.returncode
    print(json.dumps(times), flush=True)
"""


def wheel_venv(base: str) -> str:
    """Build the platform wheel from this tree and install it into a fresh venv: its python."""
    dist, venv = os.path.join(base, "dist"), os.path.join(base, "venv")
    quiet = ["-q", "--disable-pip-version-check"]
    subprocess.run([sys.executable, "-m", "pip", "wheel", *quiet, "--no-deps", "-w", dist,
                    ROOT], check=True, env={**os.environ, "HCP_LINUX_NATIVE": "1"})
    (wheel,) = [os.path.join(dist, f) for f in os.listdir(dist) if f.endswith(".whl")]
    subprocess.run(["/usr/bin/python3" if os.path.exists("/usr/bin/python3") else
                    sys.executable, "-m", "venv", venv], check=True)
    subprocess.run([os.path.join(venv, "bin", "pip"), "install", *quiet, wheel], check=True)
    return os.path.join(venv, "bin", "python")


class Worker:
    def __init__(self, python: str) -> None:
        self.proc = subprocess.Popen([python, "-c", WORKER], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, cwd="/")
        self.about = json.loads(self._line())
        self.times: list[float] = []

    def _line(self) -> str:
        out: IO[str] | None = self.proc.stdout
        assert out is not None
        line = out.readline()
        if not line:
            raise SystemExit(f"bench worker exited {self.proc.wait()}")
        return line

    def block(self, n: int) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{n}\n")
        self.proc.stdin.flush()
        self.times += json.loads(self._line())

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=400, help="timed runs per venv (default 400)")
    ap.add_argument("--rounds", type=int, default=20, help="turns each venv takes (default 20)")
    ap.add_argument("--wheel-python", help="python of a venv the wheel is installed in")
    ap.add_argument("--clone-python", default=os.path.join(ROOT, ".venv", "bin", "python"))
    ap.add_argument("--json", help="write the results here too")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="hcp-bench-wheel-") as base:
        wheel_python = a.wheel_python or wheel_venv(base)
        workers = {"wheel": Worker(wheel_python), "clone": Worker(a.clone_python)}
        try:
            for w in workers.values():
                w.block(20)  # warm-up: spares, caches; discarded
                w.times.clear()
            for i in range(a.rounds):
                share = a.runs // a.rounds + (1 if i < a.runs % a.rounds else 0)
                for name in (("wheel", "clone") if i % 2 == 0 else ("clone", "wheel")):
                    workers[name].block(share)
        finally:
            for w in workers.values():
                w.close()
    results = {name: {**w.about, **summary(w.times)} for name, w in workers.items()}
    ratio = results["wheel"]["median_ms"] / results["clone"]["median_ms"]
    for name, r in results.items():
        print(f"{name:<6} median {r['median_ms']:6.3f} ms  p95 {r['p95_ms']:6.3f} ms  "
              f"runs {r['runs']}  executor {r['executor']}  hcp_linux {r['hcp_linux']}  "
              f"hcp-exec {r['hcp_exec']}")
    print(f"ratio wheel/clone (median): {ratio:.3f} (goal <= 1.1)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"results": results, "ratio": ratio}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
