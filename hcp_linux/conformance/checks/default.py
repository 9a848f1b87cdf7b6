"""§10.1 Default: with no configuration a run is sandboxed; native-local only by an explicit,
positive action.
"""
from __future__ import annotations

from ...errors import PolicyError
from ...policy.policy import Policy
from ..harness import Evidence, Harness, proc_summary, shown
from .base import _ran, _stderr, _stdout, _verdict, check


@check("10.1-default-mode", "§10.1", "No configuration yields sandbox mode",
       requirement="A runtime MUST execute Adapters in sandbox mode unless the harness has "
                   "explicitly opted into native-local. Absence of configuration MUST yield "
                   "sandbox.",
       enforced_by="policy defaults (no layer)")
def default_mode(h: Harness, ev: Evidence) -> str:
    jail = h.mkdir("jail")
    # The library: a Policy, a policy file and a driver built without any mode setting.
    p = Policy(jail=str(jail))
    ev.try_("Policy(jail=...) with no mode fields; Policy.from_toml of a file without "
            "sandbox/nativeLocal; LinuxDriver() with no policy")
    ev.require(p.mode == "sandbox", f"Policy() mode is {p.mode!r}")
    f = h.write(h.dir / "policy.toml", 'network = "none"\n')
    pf = Policy.from_toml(f, jail=str(jail))
    ev.require(pf.mode == "sandbox", f"policy file without mode keys: mode {pf.mode!r}")
    from ...driver.driver import LinuxDriver
    dmode = LinuxDriver().policy.mode
    ev.require(dmode == "sandbox", f"LinuxDriver() base policy mode is {dmode!r}")
    ev.saw(f"modes: Policy()={p.mode}, policy file={pf.mode}, LinuxDriver()={dmode}")
    # The CLI with no configuration at all (jail = its cwd); only the host-degradation flags
    # of the configuration under test, which say nothing about the mode.
    ev.try_("hcp-linux run -- sh -c 'echo $HCP_SANDBOX' with no option, cwd = an empty dir")
    c = h.cli(["run", "--", "sh", "-c", 'echo "$HCP_SANDBOX"'], cwd=str(jail), expect_run=True)
    if _ran(ev, "CLI, no configuration", c):
        ev.require(_stdout(c) == "sandbox\n",
                   f"CLI without configuration: child saw HCP_SANDBOX={_stdout(c).strip()!r}")
    # The Python API and the driver: the child is in sandbox mode too.
    r = h.run(["sh", "-c", 'echo "$HCP_SANDBOX"'], jail=jail)
    if _ran(ev, "Sandbox(Policy()).run", r):
        ev.require(r.receipt.get("mode") == "sandbox" and r.stdout == b"sandbox\n",
                   f"API: receipt mode {r.receipt.get('mode')!r}, child saw {shown(r.stdout)!r}")
    manifest = h.pack("pack", ["sh"])
    d = h.drive(h.driver(), manifest, ["sh", "-c", 'echo "$HCP_SANDBOX"'])
    if _ran(ev, "driver, pack without wrap.workspace", d):
        ev.require(d.stdout == b"sandbox\n", f"driver: child saw {shown(d.stdout)!r}")
    return _verdict(ev, "library, CLI, API and driver all default to sandbox")


@check("10.1-native-local-opt-in", "§10.1", "native-local only by an explicit, positive action "
       "on both switches",
       requirement="Opting into native-local MUST require an explicit, positive configuration "
                   "action (§10.5: both sandbox: false and nativeLocal: true).",
       enforced_by="policy validation (no layer)")
def native_local_opt_in(h: Harness, ev: Evidence) -> str:
    jail = h.mkdir("jail")
    for kw in ({"sandbox": False}, {"native_local": True}, {"native_local": "true"},
               {"sandbox": 0, "native_local": 1}):
        ev.try_(f"Policy({', '.join(f'{k}={v!r}' for k, v in kw.items())})")
        try:
            got = Policy(jail=str(jail), **kw).mode  # type: ignore[arg-type]
            ev.require(False, f"Policy({kw}) was accepted (mode {got!r})")
        except PolicyError as e:
            ev.saw(f"Policy({kw}) refused: {e}")
    for text in ("sandbox = false\n", "nativeLocal = true\n", 'nativeLocal = "yes"\n'):
        f = h.write(h.dir / "p.toml", text)
        try:
            got = Policy.from_toml(f, jail=str(jail)).mode
            ev.require(False, f"policy file {text.strip()!r} was accepted (mode {got!r})")
        except PolicyError as e:
            ev.saw(f"policy file {text.strip()!r} refused: {e}")
    both = Policy(jail=str(jail), sandbox=False, native_local=True).mode
    ev.require(both == "native-local", f"both switches give mode {both!r}")
    # the marker: in the jail, or (read-only jail) in the check's outbox, a write root
    box, box_flags = h.outbox(jail)
    marker = box / "ran"
    target = "ran" if box == jail else str(marker)
    for flags in (["--no-sandbox"], ["--native-local"]):
        ev.try_(f"hcp-linux run {' '.join(flags)} -- sh -c 'echo ran > {target}'")
        c = h.cli(["run", "--jail", jail, *box_flags, *flags, "--", "sh", "-c",
                   f"echo ran > {target}"])
        ev.saw(f"CLI {' '.join(flags)} alone: {proc_summary(c)}")
        ev.require(c.returncode == 125, f"CLI {' '.join(flags)} alone: exit {c.returncode}, "
                                        "expected 125 (refused)")
        ev.require(_stderr(c).startswith("error: sandbox: ") and _stderr(c).count("\n") == 1,
                   f"CLI {' '.join(flags)} alone: not a one-line refusal: {_stderr(c)!r}")
        ev.require(not marker.exists(), f"CLI {' '.join(flags)} alone: the command ran")
    c = h.cli(["run", "--jail", jail, *box_flags, "--no-sandbox", "--native-local", "--",
               "sh", "-c", f'echo "$HCP_SANDBOX" > {target}'])
    if _ran(ev, "CLI --no-sandbox --native-local", c):
        seen = marker.read_text() if marker.exists() else None
        ev.require(seen == "native-local\n", f"both flags: child saw HCP_SANDBOX={seen!r}")
    return _verdict(ev, "each switch alone is refused (library, policy file, CLI); both "
                        "together give native-local")
