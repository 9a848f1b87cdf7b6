"""Spawn cost of confined commands, beside the alternatives, measured in one run.

    python bench/spawn.py [--runs N] [--quick] [--json FILE]
    python bench/spawn.py --cpu-only [--runs N]   # CPU per run against the floor, alone

For each command (/bin/true, `git --version`, this venv's `python -c pass`): plain
subprocess.run, os.posix_spawn, `unshare -rn`, `unshare -Urnmpi --fork --mount-proc` (the
default policy's namespaces and a fresh /proc, nothing else: the kernel's floor for that
isolation), bubblewrap with isolation equivalent to our
default policy (user/mount/net/ipc/pid namespaces, the same read-only roots, private /tmp,
minimal /dev, fresh /proc, new session, die-with-parent, no capabilities, and our baseline
seccomp program through --seccomp), and hcp-linux through the Python API (Sandbox.run, default
policy) with each executor: native (hcp-exec, with its spares), native without spares, ctypes;
for /bin/true also native with the default policy plus two carve-outs (a read-only `.git`, a
hidden `.env`) and one granted unix socket (ratio `carve_outs_socket_over_default_native`),
and the default policy in a jail that is a git repository (its protected .git/hooks and
.git/config bound read-only; ratio `git_jail_over_default_native`), and that jail with
``protect_missing = "placeholders"`` (ratio `placeholders_over_git_jail_native`).
Then: the /bin/true rows again with 5 ms of idleness before each call (as between an agent's
commands: the spare for the next run is made in the gap, not while the run runs); the CPU a
/bin/true run costs the whole machine (every CPU, kernel threads included; on a small machine
it bounds back-to-back runs); throughput with 8 concurrent callers; the same /bin/true rows
from a runtime holding ~500 MB of resident memory (fork's cost grows with it, vfork/posix_spawn's does not); and the
`hcp-linux run` CLI beside `python -c pass` from the same venv, in-process and with its plan
from a warm `hcp-linux serve`.

Each table is measured in four passes over its rows (a block of back-to-back calls per row and
pass), so that the host's drift during the run falls on every row alike. Reports median and
p95 in milliseconds, and the ratios the goals are stated in, as a table and as JSON. Timing
only: nothing here asserts a limit (tests/test_native.py does, loosely).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable, Iterator

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from hcp_linux import Policy, Sandbox, native  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import cpu_per_run, measure_rows, summary, tree_cpu_per_run  # noqa: E402

TRUE = "/bin/true"
#: util-linux unshare making the namespaces the default policy has (user, mount, net, pid, ipc)
#: and a fresh /proc, then fork + exec: the kernel's cost of that isolation with no mount view,
#: no lo, no Landlock, no seccomp: a floor for any sandbox that gives each run its namespaces
NAMESPACES_ALONE = "unshare -Urnmpi --fork --mount-proc (namespaces alone)"
#: The default policy plus two carve-outs (a read-only .git, a hidden .env) and one granted
#: unix socket, in the same run as the default (issue #19: at most +5% median).
CARVED = "hcp-linux native, + 2 carve-outs + 1 socket"
#: The default policy in a jail that is a git repository (`git init`: .git/hooks and
#: .git/config exist): two protected names bound read-only, .git pinned (issue 28).
GIT_JAIL = "hcp-linux native, jail with a git repo"
#: The same git jail with protect_missing = "placeholders": every missing protected name has
#: its placeholder (made once), bound read-only, 20 more binds (issue 28).
PLACEHOLDERS = "hcp-linux native, git jail, protect_missing=placeholders"
PY = sys.executable  # this venv's interpreter (not the pyenv shim)
COMMANDS = {"/bin/true": [TRUE], "git --version": ["git", "--version"],
            "python -c pass": [PY, "-c", "pass"]}


def posix_spawn(argv: list[str]) -> Callable[[], None]:
    exe = shutil.which(argv[0]) or argv[0]

    def run() -> None:
        pid = os.posix_spawn(exe, argv, os.environ, file_actions=[
            (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0)])
        _, status = os.waitpid(pid, 0)
        assert status == 0, status
    return run


def checked(argv: list[str], **kw) -> Callable[[], None]:
    def run() -> None:
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, **kw)
    return run


def bwrap_argv(jail: str, seccomp_fd: int | None, argv: list[str]) -> list[str]:
    # bwrap mounts in argument order: the private /tmp goes first, so that a venv or jail
    # under /tmp (a checkout there, mkdtemp's jail) is bound on top of it, not hidden by it
    out = ["bwrap", "--unshare-user", "--unshare-ipc", "--unshare-pid", "--unshare-net",
           "--unshare-uts", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
           "--tmpfs", "/tmp", "--dev", "/dev", "--proc", "/proc"]
    for root in ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/etc", "/opt"):
        if os.path.islink(root):
            out += ["--symlink", os.readlink(root), root]
        elif os.path.isdir(root):
            out += ["--ro-bind", root, root]
    venv = os.path.dirname(os.path.dirname(PY))  # python -c pass needs its venv, as ours does
    if argv[0] == PY and not venv.startswith(("/usr/", "/opt/")):
        out += ["--ro-bind", venv, venv]
    out += ["--bind", jail, jail, "--chdir", jail]
    if seccomp_fd is not None:
        out += ["--seccomp", str(seccomp_fd)]
    return out + ["--", *argv]


def bwrap(jail: str, bpf: bytes, argv: list[str]) -> Callable[[], None]:
    def run() -> None:
        r, w = os.pipe()
        os.write(w, bpf)
        os.close(w)
        try:
            subprocess.run(bwrap_argv(jail, r, argv), check=True, pass_fds=(r,),
                           stdout=subprocess.DEVNULL)
        finally:
            os.close(r)
    return run


def confined(sandbox: Sandbox, argv: list[str], spares: str = "auto") -> Callable[[], None]:
    def run() -> None:
        native.set_spares(spares)
        try:
            r = sandbox.run(argv, stdout=subprocess.DEVNULL)
        finally:
            native.set_spares("auto")
        assert r.returncode == 0, r
    return run


@contextlib.contextmanager
def _server(where: str, py: str = PY) -> Iterator[dict[str, str]]:
    """A `hcp-linux serve` (of ``py``'s install) for the CLI rows; the environment that
    makes `run` use it."""
    path = os.path.join(where, ".serve.sock")
    proc = subprocess.Popen([py, "-m", "hcp_linux", "serve", "--socket", path],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        line = proc.stderr.readline()  # once it listens
        if not line.startswith(b"hcp-linux serve: listening"):
            raise RuntimeError(f"hcp-linux serve did not start: {line!r}")
        yield dict(os.environ, HCP_LINUX_SERVER=path)
    finally:
        proc.terminate()
        proc.wait()
        proc.stderr.close()


def throughput(fn: Callable[[], object], threads: int, seconds: float) -> float:
    """Runs per second with ``threads`` callers looping on ``fn`` for ``seconds``."""
    done = [0] * threads
    stop = time.perf_counter() + seconds

    def loop(i: int) -> None:
        while time.perf_counter() < stop:
            fn()
            done[i] += 1
    ts = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return round(sum(done) / (time.perf_counter() - t0), 1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200, help="samples per fast row")
    ap.add_argument("--quick", action="store_true", help="fewer samples, /bin/true only")
    ap.add_argument("--ballast-mb", type=int, default=500)
    ap.add_argument("--json", default=os.path.join(HERE, "results", "spawn.json"))
    ap.add_argument("--cpu-only", action="store_true",
                    help="only the CPU per /bin/true run of the namespaces alone and of "
                         "hcp-linux native, in --runs runs per row and pass, and the ratio")
    args = ap.parse_args()
    if args.cpu_only:
        return cpu_only(args.runs)
    runs = 40 if args.quick else args.runs
    commands = {"/bin/true": COMMANDS["/bin/true"]} if args.quick else COMMANDS
    jail = tempfile.mkdtemp(prefix="hcp-bench-")
    sockets_dir = ""
    results: dict[str, dict[str, dict]] = {}
    extra: dict[str, object] = {"executor_default": native.selected(),
                                "native_binary": native.binary()}
    try:
        policy = Policy(jail=jail)
        executors = {"native": Sandbox(policy, executor="native"),
                     "ctypes": Sandbox(policy, executor="ctypes")}
        # the default policy plus two carve-outs and one granted socket (issue #19's row),
        # in a jail of its own (its .git would be protected in the default row's)
        carved_jail = tempfile.mkdtemp(prefix="hcp-bench-carved-", dir=jail)
        os.mkdir(os.path.join(carved_jail, ".git"))
        open(os.path.join(carved_jail, ".env"), "w").close()
        git_jail = tempfile.mkdtemp(prefix="hcp-bench-git-", dir=jail)
        subprocess.run(["git", "init", "-q", git_jail], check=True)
        in_git = {name: Sandbox(Policy(jail=git_jail), executor=name) for name in executors}
        placed_jail = tempfile.mkdtemp(prefix="hcp-bench-placed-", dir=jail)
        subprocess.run(["git", "init", "-q", placed_jail], check=True)
        placed = Sandbox(Policy(jail=placed_jail, protect_missing="placeholders"),
                         executor="native")
        sockets_dir = tempfile.mkdtemp(prefix="hcp-bench-sock-")
        agent = socket.socket(socket.AF_UNIX)
        agent.bind(os.path.join(sockets_dir, "agent.sock"))
        agent.listen(1)
        carved = dataclasses.replace(
            policy, jail=carved_jail, read_only_paths=(os.path.join(carved_jail, ".git"),),
            hidden_paths=(os.path.join(carved_jail, ".env"),),
            allow_unix_sockets=(os.path.join(sockets_dir, "agent.sock"),))
        extended = {name: Sandbox(carved, executor=name) for name in executors}
        if native.binary() is None:
            print("note: the native executor is not built (make setup): its rows are skipped",
                  file=sys.stderr)
            del executors["native"]
        bpf = None
        if shutil.which("bwrap"):
            from hcp_linux import seccomp_profiles
            bpf = seccomp_profiles.compile_profiles(("baseline",))

        def rows_for(argv: list[str], slow: bool, carve_outs: bool = False
                     ) -> list[tuple[str, Callable[[], None], int]]:
            n = max(20, runs // 4) if slow else runs
            rows = [("subprocess.run", checked(argv), n),
                    ("os.posix_spawn", posix_spawn(argv), n)]
            if shutil.which("unshare"):
                rows.append(("unshare -rn", checked(["unshare", "-rn", *argv]), n))
                rows.append((NAMESPACES_ALONE, checked(["unshare", "-Urnmpi", "--fork",
                                                         "--kill-child", "--mount-proc",
                                                         *argv]), n))
            if bpf is not None:
                rows.append(("bubblewrap (equivalent isolation + seccomp)",
                             bwrap(jail, bpf, argv), n))
            if "native" in executors:
                rows.append(("hcp-linux native", confined(executors["native"], argv), n))
                rows.append(("hcp-linux native, no spares",
                             confined(executors["native"], argv, "never"), n))
            rows.append(("hcp-linux ctypes", confined(executors["ctypes"], argv),
                         max(20, n // 2)))
            if carve_outs and "native" in executors:
                rows.append((CARVED, confined(extended["native"], argv), n))
                rows.append((GIT_JAIL, confined(in_git["native"], argv), n))
                rows.append((PLACEHOLDERS, confined(placed, argv), n))
            return rows

        for label, argv in commands.items():
            samples = measure_rows(rows_for(argv, slow=label == "python -c pass",
                                            carve_outs=label == "/bin/true"))
            results[label] = {name: summary(s) for name, s in samples.items()}

        # the same /bin/true rows with 5 ms of idleness before each call: commands as an
        # agent runs them (with think time between), where a spare made between runs does
        # not compete with the next run for the CPUs
        rows = [(name, fn, n) for name, fn, n in rows_for([TRUE], slow=False)
                if "ctypes" not in name]
        results["/bin/true, 5 ms between calls"] = {
            name: summary(s) for name, s in measure_rows(rows, gap=0.005).items()}

        # CPU per run, every CPU together: on a small machine this, not latency, bounds
        # back-to-back runs (a spare for the next run is made while this one runs)
        n = 100 if args.quick else 300
        cpu = {name: round(cpu_per_run(fn, n), 3) for name, fn, _ in rows_for([TRUE], slow=False)
               if "ctypes" not in name}
        extra["cpu_ms_per_run_true"] = cpu

        # 8 concurrent callers, /bin/true
        seconds = 2.0 if args.quick else 4.0
        tp = {"subprocess.run": throughput(checked([TRUE]), 8, seconds)}
        for name, sb in executors.items():
            tp[f"hcp-linux {name}"] = throughput(confined(sb, [TRUE]), 8, seconds)
        extra["throughput_8_callers_per_s"] = tp

        # the same /bin/true rows from a large runtime
        ballast = bytearray(b"\x01") * (args.ballast_mb << 20)  # touched: resident
        with open("/proc/self/status") as f:
            rss = next(int(line.split()[1]) // 1024 for line in f if line.startswith("VmRSS:"))
        label = f"/bin/true, runtime RSS {rss} MB"
        rows = [(name, fn, n if "ctypes" not in name else 20)
                for name, fn, n in rows_for([TRUE], slow=False)
                if name not in ("unshare -rn", NAMESPACES_ALONE)]
        results[label] = {name: summary(s) for name, s in measure_rows(rows).items()}
        del ballast

        # the CLI, a fresh process each time, beside the interpreter alone; and with its
        # plan from a warm `hcp-linux serve`
        cli = os.path.join(os.path.dirname(PY), "hcp-linux")
        if os.path.exists(cli):
            n = max(20, runs // 5)
            run_true = [cli, "run", "--jail", jail, "--", TRUE]
            with _server(jail) as served_env:
                samples = measure_rows([
                    ("python -c pass (same venv)", checked([PY, "-c", "pass"]), n),
                    ("hcp-linux run -- /bin/true", checked(run_true), n),
                    ("hcp-linux run -- /bin/true, served", checked(run_true, env=served_env),
                     n)])
            results["CLI (fresh process)"] = {name: summary(s) for name, s in samples.items()}
    finally:
        shutil.rmtree(jail, ignore_errors=True)
        if sockets_dir:
            agent.close()
            shutil.rmtree(sockets_dir, ignore_errors=True)

    extra["native_spawns"] = dict(native.stats)  # ready spare / started on the spot / direct
    ratios = _ratios(results)
    _print(results, extra, ratios)
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"results": results, "ratios": ratios, **extra, "uname": os.uname().release,
                   "euid": os.geteuid(), "cpus": os.cpu_count()}, f, indent=2)
    print(f"(json: {args.json})")
    return 0


def cpu_only(runs: int, rounds: int = 4) -> int:
    """CPU per /bin/true run of the namespaces alone and of hcp-linux native (default
    policy): machine-wide (every CPU, kernel threads: what the goal is stated in, issue 35
    <= 1.2x) and this process's tree alone (blind to kernel threads, and to the other users
    of a shared machine), in ``rounds`` passes over both rows, printed with the ratios as
    JSON. One short process per tree lets two trees be compared in one interleaved run
    (call it alternately for each)."""
    jail = tempfile.mkdtemp(prefix="hcp-bench-")
    time.sleep(1.2)  # a jail as a user's is: not changed this very second (its listing kept)
    try:
        rows = {NAMESPACES_ALONE: checked(["unshare", "-Urnmpi", "--fork", "--kill-child",
                                           "--mount-proc", TRUE]),
                "hcp-linux native": confined(Sandbox(Policy(jail=jail), executor="native"),
                                             [TRUE])}
        machine = {name: 0.0 for name in rows}
        tree = {name: 0.0 for name in rows}
        for _ in range(rounds):
            for name, fn in rows.items():
                machine[name] += cpu_per_run(fn, runs) / rounds
                tree[name] += tree_cpu_per_run(fn, runs) / rounds
    finally:
        shutil.rmtree(jail, ignore_errors=True)
    out: dict[str, float] = {}
    for label, cpu in (("machine", machine), ("tree", tree)):
        out.update({f"{label}: {name}": round(v, 3) for name, v in cpu.items()})
        out[f"{label}: native_over_namespaces_alone_cpu"] = round(
            cpu["hcp-linux native"] / cpu[NAMESPACES_ALONE], 3)
    print(json.dumps(out))
    return 0


def _ratios(results: dict[str, dict[str, dict]]) -> dict[str, float]:
    out: dict[str, float] = {}

    def med(label: str, row: str) -> float | None:
        return results.get(label, {}).get(row, {}).get("median_ms")

    for label in results:
        if not label.startswith("/bin/true"):
            continue
        tag = ("" if label == "/bin/true" else "_paced" if "between calls" in label
               else "_large_runtime")
        plain = med(label, "subprocess.run")
        bw = med(label, "bubblewrap (equivalent isolation + seccomp)")
        floor = med(label, NAMESPACES_ALONE)
        for ex in ("native", "ctypes"):
            hcp = med(label, f"hcp-linux {ex}")
            if hcp and bw:
                out[f"{ex}_over_bwrap{tag}"] = round(hcp / bw, 3)
            if hcp and plain:
                out[f"{ex}_minus_subprocess_ms{tag}"] = round(hcp - plain, 3)
            if hcp and floor and ex == "native":
                out[f"native_over_namespaces_alone{tag}"] = round(hcp / floor, 3)
    carved, native_ = med("/bin/true", CARVED), med("/bin/true", "hcp-linux native")
    if carved and native_:
        out["carve_outs_socket_over_default_native"] = round(carved / native_, 3)
    in_git = med("/bin/true", GIT_JAIL)
    if in_git and native_:
        out["git_jail_over_default_native"] = round(in_git / native_, 3)
    placed = med("/bin/true", PLACEHOLDERS)
    if placed and in_git:
        out["placeholders_over_git_jail_native"] = round(placed / in_git, 3)
    cli = med("CLI (fresh process)", "hcp-linux run -- /bin/true")
    served = med("CLI (fresh process)", "hcp-linux run -- /bin/true, served")
    py = med("CLI (fresh process)", "python -c pass (same venv)")
    if cli and py:
        out["cli_over_python_c_pass"] = round(cli / py, 3)
    if served and py:
        out["cli_served_over_python_c_pass"] = round(served / py, 3)
    return out


def _print(results: dict[str, dict[str, dict]], extra: dict, ratios: dict[str, float]) -> None:
    w = max(len(r) for rows in results.values() for r in rows) + 2
    for label, rows in results.items():
        print(f"\n{label:<{w}}  {'median ms':>9}  {'p95 ms':>8}  runs")
        for name, r in rows.items():
            print(f"  {name:<{w - 2}}  {r['median_ms']:>9.3f}  {r['p95_ms']:>8.3f}  {r['runs']}")
    cpu = extra.get("cpu_ms_per_run_true")
    if cpu:
        print(f"\nCPU per /bin/true run, all {os.cpu_count()} CPUs together, kernel threads "
              "included (ms):")
        for name, v in cpu.items():
            print(f"  {name:<{w - 2}}  {v:>9.3f}")
        floor = cpu.get(NAMESPACES_ALONE)
        if floor:  # back to back, n CPUs cannot finish runs faster than CPU per run / n
            print(f"  back-to-back bound of the namespaces alone on {os.cpu_count()} CPUs: "
                  f"{floor / (os.cpu_count() or 1):.3f} ms per run")
    tp = extra.get("throughput_8_callers_per_s")
    if tp:
        print("\nthroughput, 8 concurrent callers of /bin/true (runs/s):")
        for name, v in tp.items():
            print(f"  {name:<{w - 2}}  {v:>9.1f}")
    print()
    for k, v in ratios.items():
        print(f"{k}: {v}")


if __name__ == "__main__":
    sys.exit(main())
