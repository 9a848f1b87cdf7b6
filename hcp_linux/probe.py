"""What this host can enforce, found by doing it.

The probe runs ``true`` through the real spawn path in a throwaway jail, with every layer
allowed to degrade, and reads the receipt: a layer is available exactly when a real run put it
in force (the child verifies no_new_privs, seccomp and a Landlock canary before exec). Beside
that verdict it reports the host switches that decide each layer, so a missing layer comes
with its cause and remedy. The verdict is cached for the life of the process.
"""
from __future__ import annotations

import contextlib
import functools
import os
import platform
import tempfile
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator

from .host import hostenv
from .policy import ladder
from .policy.policy import LAYERS
from .run.receipt import lost_text
from .host.remedies import remedy


@dataclass(frozen=True)
class LayerVerdict:
    name: str
    available: bool
    detail: str
    remedy: str | None = None


@dataclass(frozen=True)
class ProbeReport:
    layers: dict[str, LayerVerdict]
    facts: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    #: The executor runs use here: {"name": "native", "detail": its path} or
    #: {"name": "ctypes", "detail": why (no binary for this source, or asked for)}.
    executor: dict[str, str] = field(default_factory=dict)
    #: Where this runs (hostenv.Where.as_dict()).
    where: dict[str, Any] = field(default_factory=dict)
    #: The rung reached ({"name", "keeps", "loses"}) and the one above with what it needs.
    rung: dict[str, Any] = field(default_factory=dict)

    @property
    def fully_enforceable(self) -> bool:
        return self.error is None and all(v.available for v in self.layers.values())

    def as_dict(self) -> dict[str, Any]:
        return {"fully_enforceable": self.fully_enforceable, "error": self.error,
                "layers": {k: asdict(v) for k, v in self.layers.items()}, "facts": self.facts,
                "executor": self.executor, "where": self.where, "rung": self.rung}


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def host_facts() -> dict[str, Any]:
    """The switches that decide each layer, read from /proc and /sys."""
    import hcp_linux.landlock as landlock

    status = _read("/proc/self/status") or ""
    try:
        abi: int | str = landlock.abi_version()
    except landlock.SyscallError as e:  # refused, e.g. by a seccomp filter on this process
        abi = f"unknown (landlock_create_ruleset: {e.strerror})"
    return {
        "kernel": platform.release(),
        "arch": platform.machine(),
        "euid": os.geteuid(),
        "landlock_abi": abi,
        # connect() to a pathname unix socket: Landlock mediates it from ABI 9 (RESOLVE_UNIX)
        "unix_sockets_by_path": "the mount view and Landlock RESOLVE_UNIX"
        if isinstance(abi, int) and abi >= 9 else f"the mount view only (Landlock ABI {abi} "
        "does not mediate connect())",
        # whether runs' receipts hold Landlock's denials (the kernel's audit records)
        "landlock_denials": _landlock_denials(),
        "max_user_namespaces": _read("/proc/sys/user/max_user_namespaces"),
        "unprivileged_userns_clone": _read("/proc/sys/kernel/unprivileged_userns_clone"),
        "apparmor_restrict_unprivileged_userns":
            _read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns"),
        "yama_ptrace_scope": _read("/proc/sys/kernel/yama/ptrace_scope"),
        "legacy_tiocsti": _read("/proc/sys/dev/tty/legacy_tiocsti"),
        "cgroup_v2": os.path.exists("/sys/fs/cgroup/cgroup.controllers"),
        "seccomp_in_kernel": "Seccomp:" in status,
        "already_seccomp_filtered": "Seccomp:\t2" in status,
        "no_new_privs_already": "NoNewPrivs:\t1" in status,
    }


def _landlock_denials() -> str:
    from .observe import audit, landlock_log
    why = landlock_log.available()
    if why:
        return why
    try:
        on = audit.status().enabled
    except OSError as e:
        return f"readable; the audit status could not be read now ({e})"
    return "recorded (audit is enabled)" if on else landlock_log.DISABLED


def _partial_hint(entry: dict) -> str:
    """What ``partially_enforced`` means here: the rights this kernel's Landlock ABI does not
    know, which it leaves allowed (the policy asks for them; other layers still hold)."""
    from hcp_linux.landlock.rights import AccessFs, introduced_in
    abi = entry.get("abi")
    if not isinstance(abi, int):
        return ""
    newer = [f"{r.name.lower()} (ABI {introduced_in(r)})" for r in AccessFs
             if r.name and introduced_in(r) > abi]
    if not newer:
        return ""
    return (f": Landlock ABI {abi} lacks {', '.join(newer)}, left unmediated by Landlock "
            f"(docs/receipt.md)")


def _userns_hint(facts: dict[str, Any]) -> str:
    if facts.get("max_user_namespaces") == "0":
        return "user.max_user_namespaces is 0"
    if facts.get("unprivileged_userns_clone") == "0":
        return "kernel.unprivileged_userns_clone is 0 (Debian switch)"
    if facts.get("apparmor_restrict_unprivileged_userns") == "1":
        return "AppArmor restricts unprivileged user namespaces (Ubuntu)"
    return "refused by the kernel or a seccomp filter on this process"


def _exec_dir() -> str:
    """The native executor's build directory (the shipped AppArmor profile attaches there)."""
    from .native import BUILD_DIR
    return BUILD_DIR


def executor_verdict(ran: str | None = None) -> dict[str, str]:
    """Which executor runs use (``ran``: the one a run just used, as its receipt says) and
    why: the binary's path, or why there is none."""
    from . import native

    name, detail = native.status()
    if native.get_default() != "auto":
        name = native.get_default()
        detail = f"asked for ({name}); " + ("built: " if native.binary() else "") + detail
    if ran is not None and ran != name:  # the run found out more (e.g. exec refused)
        name, detail = ran, native.status()[1]
    return {"name": name, "detail": detail}


@contextlib.contextmanager
def _probe_jail(facts: dict[str, Any]) -> Iterator[tuple[str, bool]]:
    """A throwaway jail for the probe's run, and whether it is read-only. Where no temporary
    directory takes a file (a container with a read-only root and no tmpfs), the probe runs
    in a read-only jail (this package's directory) instead of failing: the layers it checks
    do not depend on the jail being writable. ``facts["probe_jail"]`` says which."""
    try:
        tmp = tempfile.TemporaryDirectory(prefix="hcp-linux-probe-")
    except OSError as e:
        from .jails.locations import PLACEHOLDER_JAIL
        facts["probe_jail"] = (f"read-only ({PLACEHOLDER_JAIL}): no writable temporary "
                               f"directory ({e.strerror or e}); set TMPDIR to run in one")
        yield PLACEHOLDER_JAIL, True
        return
    with tmp as jail:
        facts["probe_jail"] = "a fresh temporary directory"
        yield jail, False


@functools.lru_cache(maxsize=1)
def probe() -> ProbeReport:
    """Probe once per process; later calls return the same report."""
    from .errors import SandboxError
    from .policy.policy import Policy
    from .sandbox import Sandbox

    facts = host_facts()
    where = hostenv.detect()
    with _probe_jail(facts) as (jail, read_only):
        try:
            policy = Policy(jail=jail, read_only_jail=read_only,
                            allow_degraded=frozenset(LAYERS))
            run = Sandbox(policy).run(["true"], capture_output=True)
        except (SandboxError, OSError) as e:  # OSError: a full or read-only file system
            failed = _failed_verdicts(e, where)
            return ProbeReport(failed, facts, error=str(e), executor=executor_verdict(),
                               where=where.as_dict(), rung=rung_verdict(LAYERS, where))
    layers = run.receipt["layers"]
    verdicts: dict[str, LayerVerdict] = {}
    reasons: dict[str, str] = {}
    for name in LAYERS:
        entry = layers[name]
        ok = entry["status"] == "enforced" and run.returncode == 0
        if ok:
            detail = "in force"
            if name == "landlock":
                detail = f"ABI {entry.get('abi')}, ruleset {entry.get('ruleset')}"
                if entry.get("ruleset") == "partially_enforced":
                    detail += _partial_hint(entry)
            elif name == "seccomp":
                detail = "filter installed, verified Seccomp=2"
        else:
            reason = entry.get("reason")
            if reason:
                reasons[name] = reason
            detail = reason or f"probe command exited {run.returncode}"
            if name == "userns" and entry["status"] == "degraded":
                detail += f" ({_userns_hint(facts)})"
        verdicts[name] = LayerVerdict(name, ok, detail, None if ok else
                                      remedy(name, where, _exec_dir(), reason=reason,
                                             userns_reason=reasons.get("userns")))
    missing = [n for n, v in verdicts.items() if not v.available]
    return ProbeReport(verdicts, facts, executor=executor_verdict(run.receipt.get("executor")),
                       where=where.as_dict(), rung=rung_verdict(missing, where, reasons))


def _failed_verdicts(e: Exception, where: hostenv.Where) -> dict[str, LayerVerdict]:
    """The verdicts when the probe's run failed although every layer was allowed to degrade:
    nothing was learned about the layers but the step that failed. The layer that step
    belongs to (sandbox.STEP_LAYER) gets the remedy for that refusal; the others are "not
    tried", with no remedy (none is known to be needed: naming one would be a guess)."""
    from .sandbox import STEP_LAYER

    step = getattr(e, "step", None)
    culprit = STEP_LAYER.get(step) if isinstance(step, str) else None
    code = getattr(e, "errno", None)
    reason = f"{step}: {os.strerror(code)}" if culprit and isinstance(code, int) else None
    out = {}
    for n in LAYERS:
        fix = remedy(n, where, _exec_dir(), reason=reason) if n == culprit else None
        if culprit is None and n == LAYERS[0]:
            fix = (f"the run failed at a step no layer's absence explains ({e}), with every "
                   f"layer allowed to degrade: no rung runs here; report it with the output "
                   f"of `hcp-linux probe --json`")
        out[n] = LayerVerdict(n, False, f"probe run failed: {e}", fix)
    return out


def rung_verdict(missing: Any, where: hostenv.Where,
                 reasons: dict[str, str] | None = None) -> dict[str, Any]:
    """The rung a run reaches with ``missing`` layers gone, the policy setting that opts
    into it, and the rung above it with the layers it needs and their remedies here
    (``reasons``: how each missing layer was refused, "step: strerror", when known)."""
    reasons = reasons or {}
    rung = ladder.reached(missing)
    out: dict[str, Any] = {"name": rung.name if rung else "below-ladder",
                           "missing": sorted(missing)}
    if rung is not None:
        out.update(keeps=rung.keeps_text, loses=lost_text(rung, missing),
                   opt_in="none: the default policy runs" if rung.name == ladder.DEFAULT
                   else f"--rung {rung.name} (policy: rung = \"{rung.name}\")")
    up = ladder.next_up(rung)
    if up is not None:
        needs = sorted(set(missing) - up.loses)
        out["next_up"] = {"name": up.name, "needs": needs,
                          "change": sorted({remedy(n, where, _exec_dir(), reason=reasons.get(n),
                                                 userns_reason=reasons.get("userns"))
                                          for n in needs})}
    return out


def format_table(report: ProbeReport) -> str:
    rows = [("layer", "status", "detail")]
    for v in report.layers.values():
        rows.append((v.name, "ok" if v.available else "MISSING", v.detail))
    if report.executor:
        rows.append(("executor", report.executor["name"], report.executor["detail"]))
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    lines = [f"{a:<{w0}}  {b:<{w1}}  {c}" for a, b, c in rows]
    remedies: dict[str, list[str]] = {}  # one line a remedy, naming every layer it serves
    for v in report.layers.values():
        if v.remedy:
            remedies.setdefault(v.remedy, []).append(v.name)
    for text, names in remedies.items():
        lines.append(f"  remedy for {', '.join(names)}: {text}")
    if report.where:
        w = report.where
        lines.append("")
        lines.append(f"environment: {w['kind']}" + (
            f" ({', '.join(k for k in w['kinds'][1:])} too)" if len(w["kinds"]) > 1 else ""))
        for k, why in w["evidence"].items():
            lines.append(f"  {k}: {why}")
    if report.rung:
        r = report.rung
        lines.append(f"rung: {r['name']}" + (f"; opt in: {r['opt_in']}" if "opt_in" in r else
                                             ": no rung of the ladder runs here"))
        if "loses" in r and r["name"] != ladder.DEFAULT:
            lines.append(f"  loses: {r['loses']}")
        up = r.get("next_up")
        if up:
            lines.append(f"next rung up: {up['name']}, needs {', '.join(up['needs'])}")
            for change in up["change"]:
                lines.append(f"  change: {change}")
    lines.append("")
    for k, val in report.facts.items():
        lines.append(f"{k}: {val}")
    lines.append("")
    rung = report.rung.get("name") if report.rung else None
    if report.fully_enforceable:
        lines.append("verdict: the default policy is fully enforceable here")
    elif report.error is not None or rung in (None, "below-ladder"):
        # allowing every layer to degrade would not help: say so, never "unless degraded"
        lines.append("verdict: NOT enforceable: runs are refused (exit 125) at every rung, "
                     "even with every layer allowed to degrade, until the remedy above is "
                     "applied")
    else:
        lines.append(f"verdict: NOT fully enforceable: strict runs will be refused (exit 125); "
                     f"--rung {rung} runs here (what it loses: above), or apply the remedies")
    return "\n".join(lines)
