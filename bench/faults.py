"""Randomised fault injection: whatever happens to hcp-linux's own processes, a run ends, on
time, and leaves nothing behind.

    python bench/faults.py [--runs 1000] [--seed N] [--bombs 10] [--as-nobody] [--json FILE]
    python bench/faults.py --suite long-life [--runs 1000] [--seed N] [--executor E]
                           [--as-nobody] [--json FILE]          (as root)

``--suite classic`` (the default): each of ``--runs`` iterations picks a fault and a moment at random and checks the outcome:

- in-process (the Python API): SIGSTOP or SIGKILL of the monitor or the sandbox's init at a
  random moment, followed by kill(), a timeout, or the command ending by itself; SIGSTOP or
  SIGKILL of an idle spare before a run (native executor);
- another process: a runtime using the API SIGKILLed at a random moment; `hcp-linux run
  --pack` SIGKILLed at a random moment while it stages and writes back two outputs (then
  `hcp-linux gc` runs, as the next run's sweep would); a served run through the native
  client (when built: `make native`), the client or the spare it started while the server
  plans SIGKILLed at a random moment.

Counted per fault: *hangs* (a call that did not return within 30 s), *late* (a timeout that
returned more than 1 s after its deadline), *left* (a process of the run — monitor, init,
command, anything in its pid namespace — still there, zombie or not, 5 s after the call
returned), *files* (a temp file beside a destination or an ephemeral jail left after gc),
*torn* (a destination that is neither its old nor its new content). Runtimes are killed under a
supervisor process that is a child subreaper, as systemd, tini or docker-init are: a killed
runtime's monitor goes to it, not to a pid 1 that may not reap (this machine's does not).

``--suite long-life`` (issue 29, bench/long_life.py): one runtime process (under a
subreaper, as above) takes ``--runs`` faults that must cost at most the run they hit: a spare,
monitor or init SIGKILLed or SIGSTOPped (then resumed, killed, or held) at a point of the
spawn protocol (the plan's hand-over to a spare, just after it, between start and exec, the
seccomp listener's hand-over; an idle spare), EMFILE (RLIMIT_NOFILE lowered for one run),
ENOSPC (a full tmpfs as the jail, or as the driver's TMPDIR; then freed), foreign proc and
nsfs mounts appearing in the driver's TMPDIR during a driver run (as nobody: made by root
before). After each fault a new Sandbox must run ``sh -c 'echo ok'`` with every layer
enforced (and the driver too, after a driver fault): any other result is a *degradation*.
Counted: outcomes of the faulted runs, degradations, hangs, processes left (the runtime's
descendants after release_resources, orphans at the subreaper), files and mounts left.
Root makes the tmpfs mounts and unmounts them in a finally, then checks that none is left.

``--bombs N``: N runs of `hcp-linux run --timeout 5` of a C fork bomb filling the default
process limit; reports how late each returned (median, worst). Exit 1 when any count is not 0.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from hcp_linux import Policy, Sandbox, native  # noqa: E402
from hcp_linux.proc import teardown  # noqa: E402
from hcp_linux.conformance.observers import (on_a_thread, processes_in_namespace,  # noqa: E402
                                             processes_with)
from hcp_linux.conformance.observers import proc_children as children  # noqa: E402
from hcp_linux.conformance.observers import proc_state as state  # noqa: E402
from hcp_linux.conformance.observers import resume_and_kill as force_end  # noqa: E402

HANG = 30.0  # seconds: a call not back by then is a hang
SETTLE = 5.0  # seconds a run's processes get to be gone after the call returned
PR_SET_CHILD_SUBREAPER = 36
OWN: set[int] = set()  # the supervisor's own subprocesses (not orphans to reap)


# --- /proc -------------------------------------------------------------------------------------

def tree(monitor: int) -> list[int]:
    """Monitor, init, command — as far as they exist now."""
    chain = [monitor]
    while len(chain) < 3:
        kids = children(chain[-1])
        if not kids:
            break
        chain.append(kids[0])
    return chain


def pidns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def left(pids: list[int], ns: str | None, settle: float = SETTLE) -> list[int]:
    """What is still there after up to ``settle`` seconds."""
    deadline = time.monotonic() + settle
    while True:
        rest = [p for p in pids if state(p) is not None]
        if ns is not None:
            rest += [p for p in processes_in_namespace(ns) if p not in rest]
        if not rest or time.monotonic() >= deadline:
            return rest
        time.sleep(0.02)


# --- in-process faults -------------------------------------------------------------------------

class Tally:
    def __init__(self) -> None:
        self.counts: dict[str, dict[str, int]] = {}
        self.late: list[float] = []
        self.stray: list[str] = []  # names of files left, for a look

    def add(self, fault: str, **outcome: int) -> None:
        c = self.counts.setdefault(fault, {"runs": 0, "hangs": 0, "late": 0, "left": 0,
                                           "files": 0, "torn": 0, "errors": 0})
        c["runs"] += 1
        for k, v in outcome.items():
            c[k] += v

    def bad(self) -> int:
        return sum(v for c in self.counts.values() for k, v in c.items() if k != "runs")


def in_process(rng: random.Random, sb: Sandbox, tally: Tally) -> None:
    target = rng.choice(["monitor", "init"])
    action = rng.choice(["SIGSTOP", "SIGKILL"])
    then = rng.choice(["kill", "timeout", "exits"])
    fault = f"{action} {target}, then {then}"
    argv = ["sh", "-c", "sleep 0.05"] if then == "exits" else ["sleep", "1000"]
    proc = sb.spawn(argv)
    pids = tree(proc.pid)
    ns = pidns(pids[1]) if len(pids) > 1 else None
    time.sleep(rng.uniform(0, 0.06))
    victim = pids[0] if target == "monitor" else pids[min(1, len(pids) - 1)]
    try:
        os.kill(victim, getattr(signal, action))
    except ProcessLookupError:
        pass
    start = time.monotonic()
    timeout = 0.3
    try:
        if then == "kill":
            proc.kill()
            ok, _ = on_a_thread(proc.wait, HANG)
        elif then == "timeout":
            ok, _ = on_a_thread(lambda: proc.finish(timeout=timeout), HANG)
        else:  # the command ends by itself; a stopped init holds the run, as a stopped
            # Popen child would: the caller's timeout is what bounds it
            timeout = 1.0
            ok, _ = on_a_thread(lambda: proc.finish(timeout=timeout), HANG)
    except Exception:  # noqa: BLE001
        tally.add(fault, errors=1)
        force_end(pids)
        return
    took = time.monotonic() - start
    if not ok:
        force_end(pids)
    timed_out = ok and took >= timeout
    late = timed_out and took > timeout + 1.0
    if timed_out:
        tally.late.append(took - timeout)
    rest = left(pids, ns)
    force_end(rest)
    tally.add(fault, hangs=int(not ok), late=int(late), left=int(bool(rest)))


def spare_fault(rng: random.Random, sb: Sandbox, tally: Tally) -> None:
    action = rng.choice(["SIGSTOP", "SIGKILL"])
    who = rng.choice(["monitor", "init"])
    fault = f"{action} of an idle spare's {who}, then a run"
    spares = native.spares.idle_pids()
    victims = []
    for pid in spares:
        chain = tree(pid)
        victims.append(chain[0] if who == "monitor" else chain[-1])
    for pid in victims:
        try:
            os.kill(pid, getattr(signal, action))
        except ProcessLookupError:
            pass
    try:
        ok, run = on_a_thread(lambda: sb.run(["true"], timeout=10), HANG)
    except Exception:  # noqa: BLE001
        tally.add(fault, errors=1)
        force_end(victims)
        return
    # idle spares not taken are retired at their age (native.spares.SPARE_MAX_AGE), then
    # given the reaper's two graces
    rest = left(victims, None,
                native.spares.SPARE_MAX_AGE + 3 * teardown.MONITOR_GRACE + SETTLE)
    force_end(rest)
    # a run handed to a spare killed meanwhile ends killed (-9), and says so: not an error
    tally.add(fault, hangs=int(not ok), left=int(bool(rest)))


# --- faults in another process (run under a subreaper) -------------------------------------------

RUNTIME = """
import sys, time
from hcp_linux import Policy, Sandbox
p = Sandbox(Policy(jail=sys.argv[1])).spawn(["sh", "-c", "sleep 1000; : " + sys.argv[2]])
print(p.pid, flush=True)
time.sleep(1000)
"""


def runtime_killed(rng: random.Random, work: str, tally: Tally) -> None:
    token = "hcp-fault-%016x" % rng.getrandbits(64)
    rt = subprocess.Popen([sys.executable, "-c", RUNTIME, work, token], stdout=subprocess.PIPE,
                          text=True)
    OWN.add(rt.pid)
    time.sleep(rng.uniform(0.0, 0.25))
    rt.kill()
    rt.wait()
    rest = left(processes_with(token), None)
    force_end(rest)
    rt.stdout.close()  # type: ignore[union-attr]
    tally.add("runtime SIGKILLed at a random moment", left=int(bool(rest)))


PACK = """name = "faults"
[wrap]
bin = ["sh"]
[wrap.workspace]
mode = "ephemeral"
"""


def writeback_killed(rng: random.Random, work: str, tally: Tally) -> None:
    """`hcp-linux run --pack` writing two 4 MiB outputs back, SIGKILLed at a random moment;
    then `hcp-linux gc`. Each destination must be its old or its new content, whole."""
    dest = os.path.join(work, "dest")
    tmp = os.path.join(work, "tmp")
    os.makedirs(dest, exist_ok=True)
    os.makedirs(tmp, exist_ok=True)
    outs = [os.path.join(dest, n) for n in ("a.out", "b.out")]
    old = {p: b"old %s\n" % p.encode() for p in outs}
    for p, data in old.items():
        with open(p, "wb") as f:
            f.write(data)
    new = b"n" * (4 << 20)
    # argv: sh -c SCRIPT sh --output A --output B: the staged paths are $2 and $4
    script = "head -c %d /dev/zero | tr '\\0' n > \"$2\"; cp \"$2\" \"$4\"" % len(new)
    cli = subprocess.Popen([sys.executable, "-m", "hcp_linux", "run", "--pack",
                            os.path.join(work, "pack.toml"), "--", "sh", "-c", script, "sh",
                            "--output", outs[0], "--output", outs[1]],
                           env={**os.environ, "TMPDIR": tmp}, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    OWN.add(cli.pid)
    time.sleep(rng.uniform(0.0, 0.6))
    cli.kill()
    cli.wait()
    # the next run's sweep, on demand
    subprocess.run([sys.executable, "-m", "hcp_linux", "gc", "--tmp-dir", tmp, dest],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=HANG)
    stray = [n for n in os.listdir(dest) if n not in ("a.out", "b.out")] + os.listdir(tmp)
    torn = 0
    for p in outs:
        with open(p, "rb") as f:
            data = f.read()
        torn += data not in (old[p], new)
    tally.add("CLI SIGKILLed during a run with two outputs", files=int(bool(stray)),
              torn=int(bool(torn)))
    if stray and len(tally.stray) < 20:
        tally.stray += stray
    for d in (dest, tmp):  # a clean slate for the next iteration (what was left is counted)
        for name in os.listdir(d):
            path = os.path.join(d, name)
            if name in ("a.out", "b.out"):
                continue
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.unlink(path)


def native_client(work: str) -> str | None:
    """The native `hcp-linux` (make native) in ``work``/bin beside a `hcp-linux-py` of this
    Python (what it hands a run to: the finish of a run it cannot end itself), or None."""
    from hcp_linux.native.selection import client_path, trusted
    built = client_path()
    if not trusted(built):
        return None
    where = os.path.join(work, "bin")
    os.makedirs(where, exist_ok=True)
    command = os.path.join(where, "hcp-linux")
    shutil.copy2(built, command)
    with open(os.path.join(where, "hcp-linux-py"), "w") as f:
        f.write(f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {ROOT!r})\n"
                "from hcp_linux.cli.launch import entry\nsys.exit(entry())\n")
    os.chmod(os.path.join(where, "hcp-linux-py"), 0o755)
    return command


def served_killed(rng: random.Random, work: str, command: str, env: dict[str, str],
                  tally: Tally) -> None:
    """A served run through the native client, which starts hcp-exec as a spare while the
    server plans: the client SIGKILLed at a random moment of its first ~30 ms (before, while
    or after its spare takes the plan), or its spare's monitor SIGKILLed at a random moment
    once it is up (before or after the hand-over). Nothing of the run may be left, and a
    client whose spare was killed must end (the run afresh, or `lost`), not hang."""
    token = "hcp-fault-%016x" % rng.getrandbits(64)
    target = rng.choice(["client", "spare"])
    # the client killed: the run must go with it (a command that would outlive the check);
    # its spare killed: the run goes on (afresh) or ends `lost`, and the client must end
    sleep = "1000" if target == "client" else "0.2"
    client = subprocess.Popen([command, "run", "--jail", os.path.join(work, "jail"), "--",
                               "sh", "-c", f"sleep {sleep}; : " + token], env=env,
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    OWN.add(client.pid)
    spares: list[int] = []
    if target == "client":
        time.sleep(rng.uniform(0.0, 0.03))
        client.kill()
    else:
        deadline = time.monotonic() + 5.0
        while not spares and client.poll() is None and time.monotonic() < deadline:
            for pid in children(client.pid):
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        if f.read().split(b"\0")[1:2] == [b"--spare"]:
                            spares.append(pid)
                except OSError:
                    pass
        time.sleep(rng.uniform(0.0, 0.004))
        for pid in spares:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    ok, _ = on_a_thread(client.wait, HANG)
    if not ok:
        client.kill()
        client.wait()
    spared = [p for p in processes_with("--spare")
              if _ends_with(p, str(client.pid))]
    rest = left(processes_with(token) + spared, None)
    force_end(rest)
    what = "client" if target == "client" else "spare" if spares else "spare (none seen)"
    tally.add(f"native served client: its {what} SIGKILLed at a random moment",
              hangs=int(not ok), left=int(bool(rest)))


def _ends_with(pid: int, last: str) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")[-2:-1] == [last.encode()]
    except OSError:
        return False


def supervise(n: int, seed: int, work: str, out: str) -> None:
    """The other-process faults, as a child subreaper that reaps whatever is orphaned."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "PR_SET_CHILD_SUBREAPER")
    stop = threading.Event()

    def reap_orphans() -> None:  # zombies of orphans only: our own Popens reap themselves
        while not stop.is_set():
            time.sleep(0.01)
            for child in children(os.getpid()):
                if child not in OWN and state(child) == "Z":
                    try:
                        os.waitpid(child, os.WNOHANG)
                    except ChildProcessError:
                        pass
    threading.Thread(target=reap_orphans, daemon=True).start()
    rng = random.Random(seed)
    with open(os.path.join(work, "pack.toml"), "w") as f:
        f.write(PACK)
    tally = Tally()
    command = native_client(work)
    server = None
    if command is not None:  # a server for the native client's faults
        sock = os.path.join(work, "serve.sock")
        server = subprocess.Popen([sys.executable, "-m", "hcp_linux", "serve", "--socket",
                                   sock], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, cwd="/")
        OWN.add(server.pid)
        server.stderr.readline()  # type: ignore[union-attr]  # once it listens
        env = {**os.environ, "HCP_LINUX_SERVER": sock}
    try:
        for _ in range(n):
            kind = rng.random()
            if command is not None and kind < 1 / 3:
                served_killed(rng, work, command, env, tally)
            elif kind < 2 / 3:
                runtime_killed(rng, os.path.join(work, "jail"), tally)
            else:
                writeback_killed(rng, work, tally)
    finally:
        if server is not None:
            server.terminate()
            server.wait()
            server.stderr.close()  # type: ignore[union-attr]
    stop.set()
    with open(out, "w") as f:
        json.dump({"counts": tally.counts, "stray": tally.stray}, f)


# --- the long-life suite -----------------------------------------------------------------------

def subreaper() -> threading.Event:
    """Make this process a child subreaper that reaps orphans' zombies (not OWN's); set the
    event returned to stop."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "PR_SET_CHILD_SUBREAPER")
    stop = threading.Event()

    def reap_orphans() -> None:
        while not stop.is_set():
            time.sleep(0.01)
            for child in children(os.getpid()):
                if child not in OWN and state(child) == "Z":
                    try:
                        os.waitpid(child, os.WNOHANG)
                    except ChildProcessError:
                        pass
    threading.Thread(target=reap_orphans, daemon=True).start()
    return stop


def long_life_supervised(a: argparse.Namespace, seed: int, work: str) -> dict:
    """The suite's runtime in a child process, under this subreaper; the report, with the
    orphans still alive once it exited."""
    stop = subreaper()
    out = os.path.join(work, "report.json")
    argv = [sys.executable, __file__, "--suite", "long-life", "--work", work, "--runtime",
            str(a.runs), str(seed), out]
    if a.executor:
        argv += ["--executor", a.executor]
    rt = subprocess.Popen(argv)
    OWN.add(rt.pid)
    rt.wait()
    orphans = left([c for c in children(os.getpid()) if c not in OWN], None)
    force_end(orphans)
    stop.set()
    with open(out) as f:
        report = json.load(f)
    os.unlink(out)
    report["orphans_left"] = len(orphans)
    report["runtime_status"] = rt.returncode
    return report


def mounts_under(path: str) -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4] for line in f if line.split()[4].startswith(path + "/")]


def long_life_main(a: argparse.Namespace) -> int:
    import long_life
    if a.runtime:
        report = long_life.run_suite(int(a.runtime[0]), int(a.runtime[1]), a.work)
        with open(a.runtime[2], "w") as f:
            json.dump(report, f)
        return 0
    seed = a.seed if a.seed is not None else random.randrange(1 << 32)
    reports = []
    if a.work:  # as nobody, in a tree root prepared
        reports.append(long_life_supervised(a, seed, a.work))
    else:
        if os.geteuid() != 0:
            print("--suite long-life: run as root (it mounts the tmpfs jails; --as-nobody "
                  "runs it again as nobody)", file=sys.stderr)
            return 2
        for owner in ([None, 65534] if a.as_nobody else [None]):
            work = tempfile.mkdtemp(prefix="hcp-faults-", dir="/var/tmp")
            os.chmod(work, 0o755)
            mounts: list[str] = []
            try:
                mounts = long_life.prepare(work, owner)
                if owner is None:
                    reports.append(long_life_supervised(a, seed, work))
                else:
                    out = os.path.join(work, "nobody.json")
                    argv = ["runuser", "-u", "nobody", "--", sys.executable, __file__,
                            "--suite", "long-life", "--runs", str(a.runs), "--seed",
                            str(seed), "--work", work, "--json", out]
                    if a.executor:
                        argv += ["--executor", a.executor]
                    done = subprocess.run(argv, check=False, cwd="/")
                    try:
                        with open(out) as f:
                            reports += json.load(f)
                    except (OSError, ValueError) as e:  # counted: a run that did not finish
                        reports.append({"uid": 65534, "error": f"{e} (exit {done.returncode})",
                                        "degradations": 1, "hangs": 0, "processes_left": 0,
                                        "orphans_left": 0, "files_left": {},
                                        "mounts_left": []})
            finally:
                stuck = long_life.unprepare(mounts)
                still = mounts_under(work)  # counted; then unmounted all the same (a
                long_life.unprepare(still)  # runtime that died mid-fault left them)
                stuck += mounts_under(work)
                if not stuck:
                    shutil.rmtree(work, ignore_errors=True)
                if reports:
                    reports[-1]["mounts_left"] = reports[-1].get("mounts_left", []) + still
                    reports[-1]["work_left"] = os.path.exists(work)
    text = json.dumps(reports, indent=2)
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text)
    bad = sum(r["degradations"] + r["hangs"] + r["processes_left"] + r["orphans_left"]
              + len(r["files_left"]) + len(r["mounts_left"]) + bool(r.get("work_left"))
              for r in reports)
    return 1 if bad else 0


# --- the fork bomb --------------------------------------------------------------------------------

def bombs(n: int, work: str, executor: str) -> list[float]:
    """How late `hcp-linux run --timeout 5` of a fork bomb returns, n times."""
    src = os.path.join(work, "bomb.c")
    exe = os.path.join(work, "jail", "bomb")
    with open(src, "w") as f:
        f.write("#include <unistd.h>\nint main(void) { for (;;) fork(); }\n")
    subprocess.run(["cc", "-O1", "-o", exe, src], check=True)
    late = []
    for _ in range(n):
        start = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "hcp_linux", "run", "--executor", executor,
                            "--jail", os.path.join(work, "jail"), "--timeout", "5", "--",
                            "./bomb"],
                           stderr=subprocess.DEVNULL, timeout=120)
        late.append(time.monotonic() - start - 5)
        assert r.returncode == 124, r.returncode
    return late


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--bombs", type=int, default=10)
    ap.add_argument("--as-nobody", action="store_true",
                    help="(as root) run the whole bench again as nobody")
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--supervise", nargs=3, metavar=("N", "SEED", "OUT"),
                    help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    ap.add_argument("--suite", choices=["classic", "long-life"], default="classic")
    ap.add_argument("--executor", choices=["native", "ctypes"], default=None)
    ap.add_argument("--runtime", nargs=3, metavar=("N", "SEED", "OUT"),
                    help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.executor:
        native.set_default(a.executor)
    if a.suite == "long-life":
        return long_life_main(a)
    if a.supervise:
        supervise(int(a.supervise[0]), int(a.supervise[1]), a.work, a.supervise[2])
        return 0
    seed = a.seed if a.seed is not None else random.randrange(1 << 32)
    rng = random.Random(seed)
    work = tempfile.mkdtemp(prefix="hcp-faults-", dir="/var/tmp")
    os.chmod(work, 0o755)
    os.mkdir(os.path.join(work, "jail"))
    report: dict = {"seed": seed, "uid": os.geteuid(), "executor": native.selected()}
    try:
        tally = Tally()
        sb = Sandbox(Policy(jail=os.path.join(work, "jail")))
        n_in = a.runs * 3 // 4
        t0 = time.monotonic()
        for i in range(n_in):
            if native.selected() == "native" and i % 10 == 9:
                spare_fault(rng, sb, tally)
            else:
                in_process(rng, sb, tally)
        out = os.path.join(work, "supervised.json")
        subprocess.run([sys.executable, __file__, "--work", work, "--supervise",
                        str(a.runs - n_in), str(rng.getrandbits(32)), out], check=True)
        with open(out) as f:
            supervised = json.load(f)
        tally.counts.update(supervised["counts"])
        if supervised["stray"]:
            report["files_left"] = supervised["stray"]
        report["seconds"] = round(time.monotonic() - t0, 1)
        report["faults"] = tally.counts
        report["totals"] = {k: sum(c[k] for c in tally.counts.values())
                            for k in ("runs", "hangs", "late", "left", "files", "torn",
                                      "errors")}
        if tally.late:
            report["timeout_lateness_s"] = {"median": round(statistics.median(tally.late), 3),
                                            "worst": round(max(tally.late), 3)}
        if a.bombs:
            report["fork_bomb_timeout_5s"] = {}
            for executor in ("native", "ctypes"):
                if executor == "native" and not native.available():
                    continue
                late = bombs(a.bombs, work, executor)
                report["fork_bomb_timeout_5s"][executor] = {
                    "runs": len(late), "median_late_s": round(statistics.median(late), 3),
                    "worst_late_s": round(max(late), 3)}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    reports = [report]
    if a.as_nobody and os.geteuid() == 0:
        fd, path = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        os.chmod(path, 0o666)
        subprocess.run(["runuser", "-u", "nobody", "--", sys.executable, __file__, "--runs",
                        str(a.runs), "--seed", str(seed), "--bombs", str(a.bombs), "--json",
                        path], check=False)
        with open(path) as f:
            reports += json.load(f)
        os.unlink(path)
    text = json.dumps(reports, indent=2)
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text)
    bad = sum(r["totals"][k] for r in reports for k in r["totals"] if k != "runs")
    bad += sum(b["worst_late_s"] > 1 for r in reports
               for b in r.get("fork_bomb_timeout_5s", {}).values())
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
