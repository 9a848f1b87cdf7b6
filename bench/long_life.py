"""The faults of a runtime that lives for days (issue 29), for bench/faults.py --suite
long-life and bench/soak.py --faults: helpers SIGKILLed or SIGSTOPped at points of the spawn
protocol, foreign mounts appearing under TMPDIR, ENOSPC on a jail's file system, EMFILE in the
runtime. After each fault a run must succeed as if nothing had happened.

The helpers are the real processes (a spare, which becomes a run's monitor, and its init),
struck by pid. To strike at a point of the protocol, the runtime's own Python functions are
wrapped (:class:`Hooks`): ``native.spares.hand_over`` (the plan handed to a spare: before the
send, or just after it while the spare sets up), ``executor._start`` (a timer strikes at a
random moment between the start and the exec) and ``executor.receive_listener`` (the seccomp
listener's hand-over). Nothing of the kernel is mocked.

A fault's run may fail (its own error, or a signal status): it is tallied by outcome. A
*degradation* is a run after the fault (a fresh ``Sandbox``, the whole policy) that did not
print ``ok`` with every layer enforced: a refusal, an error, a degraded receipt.
"""
from __future__ import annotations

import collections
import errno
import os
import random
import resource
import signal
import subprocess
import threading
import time
from typing import Any, Callable

from hcp_linux import Policy, Sandbox, native  # noqa: E402
from hcp_linux.run import executor  # noqa: E402
from hcp_linux.conformance.observers import on_a_thread
from hcp_linux.conformance.observers import proc_children as children
from hcp_linux.conformance.observers import proc_state as state

HANG = 45.0  # seconds: above the runtime's own longest bound (SETUP_TIMEOUT, 30 s)
RUN_TIMEOUT = 3.0  # the faulted run's timeout: a helper held stopped after exec ends there
CHECK = ["sh", "-c", "echo ok"]
HELPER_KINDS = ("hand-over", "after hand-over", "setup to exec", "listener hand-over",
                "idle spare")


def descendants(root: int) -> list[int]:
    """Every process below ``root`` now (one scan of /proc)."""
    kids: dict[int, list[int]] = collections.defaultdict(list)
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        kids[ppid].append(int(p))
    out, todo = [], [root]
    while todo:
        for c in kids.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


class Strike:
    """One fault on one helper: SIGKILL; or SIGSTOP, then after ``delay`` SIGCONT or SIGKILL
    (an operator, the OOM killer), or nothing (``held``: the runtime's own bounds must end
    it; the bench resumes it once the run returned). ``target``: "monitor" or "init" (the
    monitor's child when there is one yet, else the monitor)."""

    def __init__(self, rng: random.Random, target: str,
                 actions: tuple[str, ...] = ("SIGKILL", "SIGSTOP")) -> None:
        self.target = target
        self.action = rng.choice(actions)
        self.then = ""
        if self.action == "SIGSTOP":
            self.then = rng.choices(["SIGCONT", "SIGKILL", "held"], [45, 45, 10])[0]
        self.delay = rng.uniform(0.0, 0.3)
        self.hit: list[int] = []

    def name(self) -> str:
        then = f", then {self.then}" if self.then else ""
        return f"{self.action} {self.target}{then}"

    def __call__(self, monitor: int) -> None:
        victim = monitor
        if self.target == "init":
            kids = children(monitor)
            victim = kids[0] if kids else monitor
        self.hit.append(victim)
        _signal(victim, getattr(signal, self.action))
        if self.then in ("SIGCONT", "SIGKILL"):
            sig = getattr(signal, self.then)
            t = threading.Timer(self.delay, _signal, (victim, sig))
            t.daemon = True
            t.start()

    def release(self) -> None:
        """After the run returned: a helper held stopped is resumed (nothing of the run may
        wait on it any more)."""
        for pid in self.hit:
            _signal(pid, signal.SIGCONT)


class Hooks:
    """Wrappers around the runtime's spawn steps that strike a helper at one point, once.
    ``arm(point, strike)``; the wrapped function calls ``strike(monitor pid)`` there."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.point: str | None = None
        self.strike: Callable[[int], None] | None = None
        self.local = threading.local()
        self.real_hand_over = native.spares.hand_over
        self.real_start = executor._start
        self.real_receive = executor.receive_listener
        native.spares.hand_over = self._hand_over
        executor._start = self._start
        executor.receive_listener = self._receive

    def uninstall(self) -> None:
        native.spares.hand_over = self.real_hand_over
        executor._start = self.real_start
        executor.receive_listener = self.real_receive

    def arm(self, point: str, strike: Callable[[int], None]) -> None:
        self.point, self.strike = point, strike

    def _take(self, point: str) -> Callable[[int], None] | None:
        if self.point != point or self.strike is None:
            return None
        strike, self.strike, self.point = self.strike, None, None
        return strike

    def _hand_over(self, spare: Any, *args: Any, **kwargs: Any) -> bool:
        strike = self._take("hand-over")
        if strike is not None:
            strike(spare.pid)
        ok = self.real_hand_over(spare, *args, **kwargs)
        strike = self._take("after hand-over")
        if strike is not None:
            time.sleep(self.rng.uniform(0.0, 0.002))
            strike(spare.pid)
        return ok

    def _start(self, *args: Any, **kwargs: Any) -> Any:
        started = self.real_start(*args, **kwargs)
        self.local.monitor = started[0]
        strike = self._take("setup to exec")
        if strike is not None:  # at a random moment of the setup (its few ms), from a timer
            t = threading.Timer(self.rng.uniform(0.0, 0.004), strike, (started[0],))
            t.daemon = True
            t.start()
        return started

    def _receive(self, channel: int) -> tuple[int, int]:
        strike = self._take("listener hand-over")
        if strike is not None:
            strike(getattr(self.local, "monitor", 0))
        return self.real_receive(channel)


def outcome(call: Callable[[], Any]) -> tuple[bool, str]:
    """(returned within HANG, what the run did): "ok", "exit N", "signal N", "timed out",
    or "error Class: first words"."""
    def run() -> str:
        try:
            r = call()
        except Exception as e:  # noqa: BLE001 - every failure is an outcome to tally
            text = str(e).split(":")[0][:60]
            return f"error {type(e).__name__}: {text}"
        if getattr(r, "timed_out", False):
            return "timed out"
        rc = r.returncode
        if rc == 0:
            return "ok"
        return f"signal {-rc}" if rc < 0 else f"exit {rc}"
    ok, value = on_a_thread(run, HANG)
    return ok, (value if ok else "hang")


def healthy(jail: str) -> str | None:
    """A run after a fault, through a new Sandbox: None when it printed ok with every layer
    enforced and nothing degraded, else what was wrong."""
    def run() -> str | None:
        try:
            r = Sandbox(Policy(jail=jail)).run(CHECK, capture_output=True, timeout=20)
        except Exception as e:  # noqa: BLE001
            return f"{type(e).__name__}: {e}"
        if (r.returncode, r.stdout) != (0, b"ok\n"):
            return f"rc={r.returncode} out={r.stdout[:80]!r} err={r.stderr[-200:]!r}"
        layers = {k: v.get("status") for k, v in r.receipt["layers"].items()}
        weak = {k: v for k, v in layers.items() if v != "enforced"}
        if weak or r.receipt.get("degraded"):
            return f"degraded: {weak} {r.receipt.get('degraded')}"
        return None
    ok, value = on_a_thread(run, HANG)
    return value if ok else "hang"


# --- the faults ------------------------------------------------------------------------------------

def helper_fault(rng: random.Random, hooks: Hooks, sandbox: Sandbox, point: str,
                 actions: tuple[str, ...] = ("SIGKILL", "SIGSTOP")) -> tuple[str, str]:
    """A helper struck at ``point`` of one run's spawn. (fault name, outcome)."""
    strike = Strike(rng, rng.choice(["monitor", "init"]), actions)
    if point == "idle spare":  # a spare that dies (or stops) while idle, before the run:
        spares = native.spares.idle_pids()  # the kill is over (the victim dead) first, so
        if spares:  # that it hits no later run's hand-over (that is the next point)
            if strike.then == "SIGKILL":
                strike.delay = 0.0
            strike(rng.choice(spares))
            if "SIGKILL" in (strike.action, strike.then):
                dead_by = time.monotonic() + 5.0
                while time.monotonic() < dead_by and any(
                        state(p) not in (None, "Z") for p in strike.hit):
                    time.sleep(0.001)
    else:
        hooks.arm(point, strike)
    argv = rng.choice([CHECK, ["sh", "-c", "sleep 0.2; echo ok"]])
    try:
        returned, what = outcome(lambda: sandbox.run(argv, capture_output=True,
                                                     timeout=RUN_TIMEOUT))
    finally:
        hooks.arm("", None)  # type: ignore[arg-type]
        strike.release()
    struck = "" if strike.hit else " (not reached)"
    return f"{point}: {strike.name()}{struck}", what if returned else "hang"


def emfile_fault(rng: random.Random, sandbox: Sandbox) -> tuple[str, str]:
    """RLIMIT_NOFILE lowered to the fds open now plus 0-12, a run, the limit restored."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    open_now = len(os.listdir("/proc/self/fd"))
    spare = rng.randint(0, 12)
    resource.setrlimit(resource.RLIMIT_NOFILE, (open_now + spare, hard))
    try:
        returned, what = outcome(lambda: sandbox.run(CHECK, capture_output=True,
                                                     timeout=RUN_TIMEOUT))
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return f"EMFILE: RLIMIT_NOFILE = open fds + {spare // 4 * 4}-{spare // 4 * 4 + 3}", what


def fill(directory: str) -> list[str]:
    """Fill ``directory``'s file system: blocks, then inodes. The files made."""
    made = []
    big = os.path.join(directory, ".fill-blocks")
    made.append(big)
    with open(big, "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise
    i = 0
    while True:
        name = os.path.join(directory, f".fill-{i}")
        try:
            os.close(os.open(name, os.O_CREAT | os.O_WRONLY, 0o600))
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise
            break
        made.append(name)
        i += 1
    return made


def enospc_jail_fault(rng: random.Random, small: str) -> tuple[str, str]:
    """A jail on a full file system: a run that writes there; then the space is freed and a
    run on that jail must write, read and remove its file."""
    made = fill(small)
    sb = Sandbox(Policy(jail=small))
    script = rng.choice(["echo data > f; echo ok", "echo ok", "mkdir d && echo ok"])
    try:
        returned, what = outcome(lambda: sb.run(["sh", "-c", script], capture_output=True,
                                                timeout=RUN_TIMEOUT))
    finally:
        for name in made:
            os.unlink(name)
    for leftover in ("f", "d"):
        path = os.path.join(small, leftover)
        if os.path.isdir(path):
            os.rmdir(path)
        elif os.path.lexists(path):
            os.unlink(path)
    return f"ENOSPC on the jail's file system ({script.split()[0]})", \
        what if returned else "hang"


def enospc_driver_fault(pack: str, full_tmp: str) -> tuple[str, str]:
    """The driver's ephemeral jail in a full TMPDIR: the run fails in one line or runs;
    the space freed, the next driver run there must succeed."""
    from hcp_linux.driver import LinuxDriver
    made = fill(full_tmp)
    try:
        returned, what = outcome(lambda: LinuxDriver(tmp_dir=full_tmp).run(
            pack, CHECK, capture_output=True))
    finally:
        for name in made:
            os.unlink(name)
    return "ENOSPC in the driver's TMPDIR", what if returned else "hang"


def driver_healthy(pack: str, tmp: str) -> str | None:
    from hcp_linux.driver import LinuxDriver

    def run() -> str | None:
        try:
            r = LinuxDriver(tmp_dir=tmp).run(pack, CHECK, capture_output=True)
        except Exception as e:  # noqa: BLE001
            return f"{type(e).__name__}: {e}"
        return None if (r.returncode, r.stdout) == (0, b"ok\n") else f"rc={r.returncode}"
    ok, value = on_a_thread(run, HANG)
    return value if ok else "hang"


class ForeignMounts:
    """A proc mount and an nsfs bind (what docker, podman and chroots leave) made in ``tmp``
    while a driver run goes on there (root only); :meth:`remove` unmounts what was made."""

    def __init__(self, tmp: str, n: int) -> None:
        self.base = os.path.join(tmp, f"foreign-{n}")
        self.mounts: list[str] = []

    def make(self) -> None:
        proc = os.path.join(self.base, "proc")
        ns = os.path.join(self.base, "netns")
        os.makedirs(proc)
        open(ns, "w").close()
        for argv, where in ((["mount", "-t", "proc", "proc", proc], proc),
                            (["mount", "--bind", "/proc/self/ns/net", ns], ns)):
            subprocess.run(argv, check=True, timeout=20)
            self.mounts.append(where)

    def remove(self) -> list[str]:
        """Unmount and delete; what could not be unmounted."""
        stuck = []
        for where in reversed(self.mounts):
            if subprocess.run(["umount", where], timeout=20).returncode != 0:
                stuck.append(where)
        self.mounts = []
        if not stuck and os.path.isdir(self.base):
            for name in os.listdir(self.base):
                path = os.path.join(self.base, name)
                os.rmdir(path) if os.path.isdir(path) else os.unlink(path)
            os.rmdir(self.base)
        return stuck


def foreign_mount_fault(rng: random.Random, pack: str, tmp: str, n: int
                        ) -> tuple[str, str, ForeignMounts]:
    """Foreign mounts appear in the driver's TMPDIR at a random moment of a driver run. The
    mounts stay until the caller removes them (after its check runs)."""
    from hcp_linux.driver import LinuxDriver
    foreign = ForeignMounts(tmp, n)
    t = threading.Timer(rng.uniform(0.0, 0.02), foreign.make)
    t.start()
    try:
        returned, what = outcome(lambda: LinuxDriver(tmp_dir=tmp).run(
            pack, CHECK, capture_output=True))
    finally:
        t.join()
    return "foreign mounts appear in TMPDIR during a driver run", \
        what if returned else "hang", foreign


# --- the suite ---------------------------------------------------------------------------------------

SMALL_SIZE = "1m"  # the tmpfs made a jail (ENOSPC), and the driver's full TMPDIR
LAYOUT = ("jail", "small", "fulltmp", "tmp", "pack")  # the pack's root apart from tmp
PACK = 'name = "faults"\n[wrap]\nbin = ["sh"]\n[wrap.workspace]\nmode = "ephemeral"\n'


def prepare(work: str, owner: int | None) -> list[str]:
    """As root: the work tree, with tmpfs mounts of SMALL_SIZE at small/ and fulltmp/ (owned
    by ``owner``, the uid the suite runs as), and for another owner, a proc and an nsfs
    mount already in tmp/ (nobody cannot mount them during its runs). The mounts made,
    innermost last: :func:`unprepare` them in a finally."""
    mounts: list[str] = []
    for name in LAYOUT:
        os.makedirs(os.path.join(work, name), exist_ok=True)
    with open(os.path.join(work, "pack", "pack.toml"), "w") as f:
        f.write(PACK)
    uid = os.geteuid() if owner is None else owner
    try:
        for name in ("small", "fulltmp"):
            where = os.path.join(work, name)
            subprocess.run(["mount", "-t", "tmpfs", "-o",
                            f"size={SMALL_SIZE},nr_inodes=256,mode=0755,uid={uid},gid={uid}",
                            "tmpfs", where], check=True, timeout=20)
            mounts.append(where)
        if owner is not None and owner != 0:
            foreign = ForeignMounts(os.path.join(work, "tmp"), 0)
            try:
                foreign.make()
            finally:
                mounts += foreign.mounts
        for name in ("", "jail", "tmp", "pack", "pack/pack.toml"):
            os.chown(os.path.join(work, name), uid, uid)
    except BaseException:
        unprepare(mounts)
        raise
    return mounts


def unprepare(mounts: list[str]) -> list[str]:
    """Unmount, innermost first; the mount points that could not be unmounted."""
    stuck = []
    for where in reversed(mounts):
        if subprocess.run(["umount", where], timeout=20).returncode != 0:
            stuck.append(where)
    return stuck


def run_suite(n: int, seed: int, work: str) -> dict[str, Any]:
    """``n`` faults in this process (the runtime), each followed by the runs that must
    succeed. Returns the tallies; leftovers of processes and files are counted at the end."""
    rng = random.Random(seed)
    root = os.geteuid() == 0
    jail, small, full_tmp, tmp, _ = (os.path.join(work, name) for name in LAYOUT)
    pack = os.path.join(work, "pack", "pack.toml")
    premounted = not root and os.path.isdir(os.path.join(tmp, "foreign-0"))
    sandbox = Sandbox(Policy(jail=jail))
    hooks = Hooks(rng)
    kinds = [(k, 12) for k in HELPER_KINDS] + [("emfile", 12), ("enospc jail", 10),
                                                ("enospc driver", 8), ("foreign mounts", 10)]
    names, weights = zip(*kinds)
    faults: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    degradations: list[str] = []
    hangs = 0
    mounts_stuck: list[str] = []
    for _ in range(20):  # warm: spares kept, caches filled
        sandbox.run(CHECK, capture_output=True)
    t0 = time.monotonic()
    try:
        for i in range(n):
            kind = rng.choices(names, weights)[0]
            foreign = None
            after: list[Callable[[], str | None]] = [lambda: healthy(jail)]
            if kind in HELPER_KINDS:
                name, what = helper_fault(rng, hooks, sandbox, kind)
            elif kind == "emfile":
                name, what = emfile_fault(rng, sandbox)
            elif kind == "enospc jail":
                name, what = enospc_jail_fault(rng, small)
                after.append(lambda: healthy(small))
            elif kind == "enospc driver":
                name, what = enospc_driver_fault(pack, full_tmp)
                after.append(lambda: driver_healthy(pack, full_tmp))
            elif root:
                name, what, foreign = foreign_mount_fault(rng, pack, tmp, i + 1)
                after.append(lambda: driver_healthy(pack, tmp))
            elif premounted:  # nobody: the mounts root made before are there all along
                name = "foreign mounts (made by root) in TMPDIR during a driver run"
                _, what = outcome(lambda: __import__("hcp_linux.driver").driver.LinuxDriver(
                    tmp_dir=tmp).run(pack, CHECK, capture_output=True))
            else:
                continue
            try:
                faults[name][what] += 1
                hangs += what == "hang"
                for check in after:
                    wrong = check()
                    if wrong is not None:
                        hangs += wrong == "hang"
                        degradations.append(f"after {name} ({what}): {wrong}"[:400])
            finally:
                if foreign is not None:
                    mounts_stuck += foreign.remove()
    finally:
        hooks.uninstall()
    seconds = time.monotonic() - t0
    # the end: idle spares retired, every helper of every run gone within a settle
    from hcp_linux import release_resources
    release_resources()
    deadline = time.monotonic() + 10.0
    while True:
        procs = [p for p in descendants(os.getpid()) if state(p) is not None]
        if not procs or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    files = {}
    from hcp_linux.runtime_files import jail_home
    home = os.path.basename(jail_home(""))  # the user's jail home stays (runtime_files)
    for name, path in (("jail", jail), ("small", small), ("fulltmp", full_tmp), ("tmp", tmp)):
        left = [e for e in os.listdir(path) if not (premounted and e == "foreign-0")]
        if home in left:  # what is in it is left, not the home itself
            left.remove(home)
            left += [f"{home}/{e}" for e in os.listdir(os.path.join(path, home))]
        if left:
            files[name] = left[:10]
    outcomes = collections.Counter()
    for c in faults.values():
        outcomes.update(c)
    return {"seed": seed, "uid": os.geteuid(), "executor": native.selected(),
            "faults": n, "seconds": round(seconds, 1),
            "by_fault": {k: dict(v) for k, v in sorted(faults.items())},
            "outcomes": dict(outcomes.most_common()),
            "degradations": len(degradations), "degradation_samples": degradations[:10],
            "hangs": hangs, "processes_left": len(procs),
            "files_left": files, "mounts_left": mounts_stuck}
