"""One check per normative rule of HCP §10, plus hardening canaries.

The rules are those of https://harnesscontextprotocol.io/docs/specification/sandbox, quoted
in each check's ``requirement``.

Every check does the thing for real through the public surfaces (the Python API, the
``hcp-linux`` CLI, the HCP driver) and judges what happened on the host: files on disk, bytes
on the wire, processes in the process table, exact exit statuses and messages. Every denial
has a negative control: the same action, unconfined, must succeed; when it does not, the
check cannot be judged here and is "not applicable", never "pass". A violation observed in
the sandbox fails the check whatever the control did: it is proven.

Each check returns a one-line summary (pass) or raises :class:`Fail` /
:class:`NotApplicable`; its :class:`Evidence` records what was tried, what happened and what
the control did.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import platform
import secrets
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..errors import HostPathError, NotAllowlistedError, PolicyError, SandboxError
from ..policy import Policy
from .harness import Evidence, Fail, Harness, NotApplicable, layer_refusal, proc_summary, shown
from .observers import drain, pid_alive

CheckFn = Callable[[Harness, Evidence], str]


@dataclass(frozen=True)
class Check:
    id: str
    rule: str           # "§10.2.1", or "hardening" for a canary
    title: str
    requirement: str    # the rule, in the spec's words where it has them
    enforced_by: str    # which layers of this engine uphold it (for readers; see docs)
    fn: CheckFn


CHECKS: list[Check] = []


def check(id: str, rule: str, title: str, *, requirement: str,
          enforced_by: str) -> Callable[[CheckFn], CheckFn]:
    def register(fn: CheckFn) -> CheckFn:
        if any(c.id == id for c in CHECKS):
            raise ValueError(f"duplicate check id {id}")
        CHECKS.append(Check(id, rule, title, requirement, enforced_by, fn))
        return fn
    return register


def _token() -> str:
    return "hcp-conformance-" + secrets.token_hex(8)


def _stderr(p: object) -> str:
    data = getattr(p, "stderr", b"") or b""
    return data.decode(errors="replace") if isinstance(data, bytes) else str(data)


def _stdout(p: object) -> str:
    data = getattr(p, "stdout", b"") or b""
    return data.decode(errors="replace") if isinstance(data, bytes) else str(data)


def _exact_refusal(ev: Evidence, what: str, p: subprocess.CompletedProcess, code: int,
                   message: str) -> None:
    """``p`` is a CLI run that must have been refused with ``code`` and exactly one line,
    ``error: sandbox: <message>``, and nothing on stdout."""
    expected = f"error: sandbox: {message}\n"
    ev.saw(f"{what}: {proc_summary(p)}")
    ev.require(p.returncode == code, f"{what}: exit status {p.returncode}, expected {code}")
    ev.require(_stderr(p) == expected,
               f"{what}: stderr was {_stderr(p)!r}, expected exactly {expected!r}")
    ev.require(p.stdout == b"", f"{what}: wrote to stdout: {shown(p.stdout)!r}")


def _ran(ev: Evidence, what: str, r: object, code: int = 0) -> bool:
    """A run that must have run (and exited ``code``)."""
    ev.saw(f"{what}: {proc_summary(r)}")
    rc = getattr(r, "returncode")
    why = ""
    if rc != code:
        refusal = [ln for ln in _stderr(r).splitlines() if ln.startswith("error: sandbox: ")]
        if refusal:
            why = f" (the sandbox refused a run this configuration allows: {refusal[-1]})"
    return ev.require(rc == code, f"{what}: exit status {rc}, expected {code}{why}")


def _env_lines(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out.setdefault(key, []).append(value)
    return out


def _verdict(ev: Evidence, summary: str) -> str:
    if ev.problems:
        raise Fail("; ".join(ev.problems))
    if ev.control_failures:
        raise NotApplicable("the unconfined control did not behave, so the denial cannot be "
                            "judged here: " + "; ".join(ev.control_failures))
    return summary


PY_ARGV = "import json, sys; print(json.dumps(sys.argv[1:]))"


# ============================================================================================
# §10.1 Default
# ============================================================================================


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
    from ..driver import LinuxDriver
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
    marker = jail / "ran"
    for flags in (["--no-sandbox"], ["--native-local"]):
        ev.try_(f"hcp-linux run {' '.join(flags)} -- sh -c 'echo ran > ran'")
        c = h.cli(["run", "--jail", jail, *flags, "--", "sh", "-c", "echo ran > ran"])
        ev.saw(f"CLI {' '.join(flags)} alone: {proc_summary(c)}")
        ev.require(c.returncode == 125, f"CLI {' '.join(flags)} alone: exit {c.returncode}, "
                                        "expected 125 (refused)")
        ev.require(_stderr(c).startswith("error: sandbox: ") and _stderr(c).count("\n") == 1,
                   f"CLI {' '.join(flags)} alone: not a one-line refusal: {_stderr(c)!r}")
        ev.require(not marker.exists(), f"CLI {' '.join(flags)} alone: the command ran")
    c = h.cli(["run", "--jail", jail, "--no-sandbox", "--native-local", "--", "sh", "-c",
               'echo "$HCP_SANDBOX" > ran'])
    if _ran(ev, "CLI --no-sandbox --native-local", c):
        seen = marker.read_text() if marker.exists() else None
        ev.require(seen == "native-local\n", f"both flags: child saw HCP_SANDBOX={seen!r}")
    return _verdict(ev, "each switch alone is refused (library, policy file, CLI); both "
                        "together give native-local")


# ============================================================================================
# §10.2 Sandbox requirements
# ============================================================================================


@check("10.2.1-allowlist", "§10.2.1", "An unlisted bin is refused: exit 127, exact message, "
       "nothing runs",
       requirement='Spawn only wrap.bin values on the allow-list. A bin not on the list MUST be '
                   'refused with exit 127 and `error: sandbox: bin "<bin>" not allowlisted`.',
       enforced_by="allow-list check before anything is created (no layer)")
def allowlist(h: Harness, ev: Evidence) -> str:
    jail, shared = h.mkdir("jail"), h.mkdir("shared")
    marker = shared / "ran"
    touch = shutil.which("touch", path="/usr/bin:/bin") or "/usr/bin/touch"
    for bin_ in ("touch", touch):
        ev.try_(f"hcp-linux run --allow-bin sh -- {bin_} {marker}")
        c = h.cli(["run", "--jail", jail, "--write-root", shared, "--allow-bin", "sh", "--",
                   bin_, marker])
        _exact_refusal(ev, f"CLI, unlisted {bin_}", c, 127, f'bin "{bin_}" not allowlisted')
    ev.try_("Sandbox(Policy(allow_bins=('sh',))).run(['touch', marker])")
    try:
        h.run(["touch", str(marker)], jail=jail, write_roots=(str(shared),), allow_bins=("sh",))
        ev.require(False, "API: an unlisted bin was spawned")
    except NotAllowlistedError as e:
        ev.saw(f"API: NotAllowlistedError exit_code={e.exit_code} message={str(e)!r}")
        ev.require(e.exit_code == 127 and str(e) == 'bin "touch" not allowlisted',
                   f"API: exit_code {e.exit_code}, message {str(e)!r}")
    manifest = h.pack("pack", ["sh"], mode="ephemeral")
    ev.try_("driver and `hcp-linux run --pack` with wrap.bin = ['sh'], argv ['touch', marker]")
    try:
        h.drive(h.driver(write_roots=(str(shared),)), manifest, ["touch", str(marker)])
        ev.require(False, "driver: an unlisted bin was spawned")
    except NotAllowlistedError as e:
        ev.saw(f"driver: NotAllowlistedError exit_code={e.exit_code} message={str(e)!r}")
        ev.require(e.exit_code == 127 and str(e) == 'bin "touch" not allowlisted',
                   f"driver: exit_code {e.exit_code}, message {str(e)!r}")
    c = h.cli(["run", "--pack", manifest, "--write-root", shared, "--", "touch", marker])
    _exact_refusal(ev, "CLI --pack, unlisted touch", c, 127, 'bin "touch" not allowlisted')
    ev.require(not marker.exists(), "an unlisted bin ran: the marker exists")
    # Control: the very same command with the bin on the list runs and leaves the marker.
    c = h.cli(["run", "--jail", jail, "--write-root", shared, "--allow-bin", "touch", "--",
               "touch", marker], expect_run=True)
    ev.ctl(f"CLI --allow-bin touch -- touch marker: {proc_summary(c)}, "
           f"marker {'created' if marker.exists() else 'absent'}")
    ev.control_ok(c.returncode == 0 and marker.exists(), "the listed bin did not run")
    return _verdict(ev, "CLI, CLI --pack, API and driver refuse with 127 and the exact "
                        "message; nothing ran; the listed bin runs")


@check("10.2.1-no-path-lookup", "§10.2.1", "An unlisted bare name is never resolved via PATH",
       requirement="The runtime MUST NOT resolve an unlisted bare name via PATH.",
       enforced_by="allow-list check before resolution; fixed sandbox PATH (no layer)")
def no_path_lookup(h: Harness, ev: Evidence) -> str:
    jail, pathdir, shared = h.mkdir("jail"), h.mkdir("callerbin"), h.mkdir("shared")
    marker = shared / "path-lookup-ran"
    name = f"hcp-conformance-probe-{secrets.token_hex(4)}"
    h.write(pathdir / name, f"#!/bin/sh\necho ran > {marker}\n", mode=0o755)
    env = dict(os.environ, PATH=f"{pathdir}:{os.environ.get('PATH', '/usr/bin:/bin')}")
    ev.try_(f"{name} on the caller's PATH ({pathdir}) would write {marker}")
    c = h.cli(["run", "--jail", jail, "--write-root", shared, "--allow-bin", "sh", "--", name],
              env=env)
    _exact_refusal(ev, "CLI, unlisted bare name", c, 127, f'bin "{name}" not allowlisted')
    try:
        h.run([name], jail=jail, env=env, write_roots=(str(shared),), allow_bins=("sh",))
        ev.require(False, "API: the unlisted bare name was spawned")
    except NotAllowlistedError as e:
        ev.saw(f"API: NotAllowlistedError {str(e)!r}")
    manifest = h.pack("pack", ["sh"])
    c = h.cli(["run", "--pack", manifest, "--write-root", shared, "--", name], env=env)
    _exact_refusal(ev, "CLI --pack, unlisted bare name", c, 127, f'bin "{name}" not allowlisted')
    # Even listed, a bare name resolves on the sandbox's fixed PATH, never the caller's.
    ev.try_(f"hcp-linux run --allow-bin {name} -- {name} (listed: resolves on the fixed PATH "
            "only)")
    c = h.cli(["run", "--jail", jail, "--write-root", shared, "--allow-bin", name, "--", name],
              env=env)
    ev.saw(f"CLI, listed bare name: {proc_summary(c)}")
    ev.require(c.returncode == 127, f"listed bare name: exit {c.returncode}, expected 127 "
                                    "(not found on the sandbox's PATH)")
    ev.require(not marker.exists(), "the caller's PATH was used: the probe on it ran")
    # Control: unconfined, the caller's PATH does find and run it.
    ctl = h.unconfined(["sh", "-c", name], env=env, cwd=str(jail))
    ev.ctl(f"unconfined sh -c {name} with that PATH: {proc_summary(ctl)}, marker "
           f"{'created' if marker.exists() else 'absent'}")
    ev.control_ok(ctl.returncode == 0 and marker.exists(), "the probe on PATH did not run "
                                                           "unconfined")
    return _verdict(ev, "unlisted bare name refused (127, exact) without running the PATH "
                        "entry; a listed one resolves on the fixed PATH only")


@check("10.2.1-allowlist-binaries", "§10.2.1", "The allow-list names binaries: a file "
       "called like a listed bin does not run",
       requirement="Spawn only wrap.bin values that are on the runtime's allow-list.",
       enforced_by="allow-list matching by file identity on the fixed PATH (no layer)")
def allowlist_binaries(h: Harness, ev: Evidence) -> str:
    jail, outside = h.mkdir("jail"), h.mkdir("outside")
    marker = h.mkdir("shared") / "planted-shell-ran"
    shell = shutil.which("dash", path="/usr/bin:/bin") or "/bin/sh"
    script = f"echo ran > {marker}"
    ev.try_(f"allow_bins = (cp, printf); cp {shell} printf in the jail; run ./printf -c ...")
    r = h.run(["cp", shell, "printf"], jail=jail, allow_bins=("cp", "printf"))
    if not _ran(ev, "cp of a shell into the jail as printf", r):
        return _verdict(ev, "")
    for request in ("./printf", str(jail / "printf")):
        try:
            h.run([request, "-c", script], jail=jail, allow_bins=("cp", "printf"),
                  write_roots=(str(marker.parent),))
            ev.require(False, f"API: {request} (a shell named printf) was spawned")
        except NotAllowlistedError as e:
            ev.saw(f"API {request}: {str(e)!r}")
            ev.require(e.exit_code == 127, f"{request}: exit code {e.exit_code}")
    ev.try_("pack with wrap.bin = ['sh'], argv ['./../outside/sh', ...] (a shell outside "
            "the pack)")
    shutil.copy(shell, outside / "sh")
    manifest = h.pack("pack", ["sh"], mode="ephemeral")
    c = h.cli(["run", "--pack", manifest, "--write-root", marker.parent, "--",
               "./../outside/sh", "-c", script])
    _exact_refusal(ev, "CLI --pack ./../outside/sh", c, 127,
                   'bin "./../outside/sh" not allowlisted')
    ev.require(not marker.exists(), "a file named like a listed bin ran")
    # Control: the planted file is a shell, and runs when the policy names its path.
    r = h.run([str(jail / "printf"), "-c", script], jail=jail,
              allow_bins=(str(jail / "printf"),), write_roots=(str(marker.parent),))
    ev.ctl(f"allow_bins naming {jail / 'printf'}: {proc_summary(r)}, marker "
           f"{'created' if marker.exists() else 'absent'}")
    ev.control_ok(r.returncode == 0 and marker.exists(), "the planted shell did not run "
                                                           "even when named")
    return _verdict(ev, "a shell copied into the jail as a listed name, and one outside the "
                        "pack named like a listed bin, are refused (127); named, it runs")


@check("10.2.2-cwd-jail", "§10.2.2", "The child's cwd is the jail; writes beside it fail",
       requirement="Set the child's working directory to the pack root or a per-pack jail.",
       enforced_by="mount view (mountns) or Landlock; either alone suffices")
def cwd_jail(h: Harness, ev: Evidence) -> str:
    tok = secrets.token_hex(4)
    script = (f'pwd; echo in > inside.txt; (echo out > ../beside-{tok}.txt) 2>/dev/null '
              f'&& echo beside-written || echo beside-refused; '
              f'(echo out > /beside-{tok}.txt) 2>/dev/null && echo root-written '
              f'|| echo root-refused')
    jail = h.mkdir("jail")
    beside = jail.parent / f"beside-{tok}.txt"
    real = os.path.realpath(jail)
    ev.try_(f"sh -c {script!r} with jail {jail} (API, then CLI)")
    for what, r in (("API", lambda: h.run(["sh", "-c", script], jail=jail)),
                    ("CLI", lambda: h.cli(["run", "--jail", jail, "--", "sh", "-c", script],
                                          expect_run=True))):
        res = r()
        if _ran(ev, what, res):
            lines = _stdout(res).splitlines()
            ev.require(lines[:1] == [real], f"{what}: cwd was {lines[:1]}, expected {real}")
            ev.require((jail / "inside.txt").exists(), f"{what}: a write in the jail did not "
                                                       "land in the jail")
        ev.require(not beside.exists(), f"{what}: a write beside the jail reached the host "
                                        f"({beside})")
        if not ev.require(not os.path.exists(f"/beside-{tok}.txt"),
                          f"{what}: a write to / reached the host"):
            os.unlink(f"/beside-{tok}.txt")  # the violation is recorded; do not leave it there
        (jail / "inside.txt").unlink(missing_ok=True)
    manifest = h.pack("pack", ["sh"], mode="none")
    d = h.drive(h.driver(), manifest, ["sh", "-c", script])
    if not ev.require(not os.path.exists(f"/beside-{tok}.txt"),
                      "driver: a write to / reached the host"):
        os.unlink(f"/beside-{tok}.txt")
    if _ran(ev, "driver (mode none)", d):
        cwd = _stdout(d).splitlines()[:1]
        pack_root = os.path.realpath(manifest.parent)
        ev.require(cwd in ([os.path.realpath(d.jail)], [pack_root]),
                   f"driver: cwd {cwd}, expected the jail {d.jail} or the pack root")
    ev.require(not (Path(d.jail).parent / f"beside-{tok}.txt").exists(),
               "driver: a write beside the jail reached the host")
    # Control: the same snippet, unconfined, writes beside its cwd. (Not the write to /: it
    # would really land in the host's root.)
    ctl_dir = h.mkdir("control/jail")
    c = h.unconfined(["sh", "-c", script.split("; (echo out > /")[0]], cwd=str(ctl_dir))
    ev.ctl(f"unconfined in {ctl_dir}: {proc_summary(c)}")
    ev.control_ok((ctl_dir.parent / f"beside-{tok}.txt").exists(),
                  "unconfined, the write beside the directory failed too")
    return _verdict(ev, "cwd is the jail (API, CLI, driver); writes beside it never reach "
                        "the host")


def _restore(key: str, value: str | None) -> None:
    """Put back a variable of this process's environment as it was (None: absent)."""
    if value is None:
        os.environ.pop(key, None)
    else:
        os.environ[key] = value


@check("10.2.3-no-ambient-credentials", "§10.2.3", "Secrets in the caller's environment and "
       "$HOME never reach the child",
       requirement="Inherit no ambient credentials: provide only credentials minted through "
                   "Binding and the pack's wrap.agent_env.",
       enforced_by="environment allowlist (no layer) for env; mount view or Landlock for $HOME")
def no_ambient_credentials(h: Harness, ev: Evidence) -> str:
    secret = _token()
    jail, home = h.mkdir("jail"), h.mkdir("home", 0o700)
    h.write(home / ".ssh" / "id_rsa", f"-----BEGIN KEY----- {secret}\n")
    h.write(home / ".netrc", f"machine example.invalid login x password {secret}\n")
    h.write(home / ".aws" / "credentials", f"[default]\naws_secret_access_key = {secret}\n")
    keys = ("AWS_SECRET_ACCESS_KEY", "GITHUB_TOKEN", "GH_TOKEN", "OPENAI_API_KEY",
            "ANTHROPIC_API_KEY", "NPM_TOKEN", "HCP_CONFORMANCE_AMBIENT")
    env = dict(os.environ, HOME=str(home), SSH_AUTH_SOCK=str(home / "agent.sock"),
               **{k: secret for k in keys})
    script = ('env; echo "HOME=$HOME"; ls -la "$1" "$HOME"; cat "$1/.ssh/id_rsa" '
              '"$1/.netrc" "$1/.aws/credentials" ~/.netrc ~/.ssh/id_rsa; true')
    ev.try_(f"caller env with {', '.join(keys)}, SSH_AUTH_SOCK and HOME={home} holding "
            f".ssh/id_rsa, .netrc, .aws/credentials; the child runs env, ls and cat on them")

    def judge(what: str, r: object, explicit: dict[str, str]) -> None:
        if not _ran(ev, what, r):
            return
        text = _stdout(r) + _stderr(r)
        ev.require(secret not in text, f"{what}: the secret reached the child")
        child = _env_lines(_stdout(r))
        leaked = [k for k in keys + ("SSH_AUTH_SOCK",) if k in child]
        ev.require(not leaked, f"{what}: caller keys reached the child: {leaked}")
        ev.require(child.get("HOME", [""])[0] != str(home),
                   f"{what}: the caller's HOME was passed through")
        for k, v in explicit.items():
            ev.require(child.get(k) == [v], f"{what}: explicitly passed {k} missing")

    c = h.cli(["run", "--jail", jail, "--env", "EXPLICIT=passed", "--", "sh", "-c", script,
               "sh", home], env=env, expect_run=True)
    judge("CLI", c, {"EXPLICIT": "passed"})
    # The API and the driver read the runtime's own environment (os.environ): put the
    # secrets there (an env= argument of the API is a grant, as Popen's env: docs/popen.md).
    manifest = h.pack("pack", ["sh"], mode="ephemeral",
                      extra='agent_env = { PACK_SETTING = "from-pack" }')
    ambient = {"HOME": str(home), "SSH_AUTH_SOCK": str(home / "agent.sock")}
    saved = {k: os.environ.get(k) for k in keys + tuple(ambient)}
    try:
        os.environ.update({k: secret for k in keys}, **ambient)
        r = h.run(["sh", "-c", script, "sh", str(home)], jail=jail)
        for k in ambient:  # the driver's workspaces live under the real HOME
            _restore(k, saved[k])
        d = h.drive(h.driver(), manifest, ["sh", "-c", script, "sh", str(home)],
                    credentials={"MINTED_TOKEN": "minted"})
    finally:
        for k, v in saved.items():
            _restore(k, v)
    judge("API", r, {})
    judge("driver", d, {"PACK_SETTING": "from-pack", "MINTED_TOKEN": "minted"})
    # Control: the same snippet, unconfined, sees the secrets.
    c = h.unconfined(["sh", "-c", script, "sh", str(home)], env=env, cwd=str(jail))
    seen = (_stdout(c) + _stderr(c)).count(secret)
    ev.ctl(f"unconfined: the secret appears {seen} times")
    ev.control_ok(seen >= len(keys) + 3, "unconfined, the secrets were not all visible")
    return _verdict(ev, "no caller secret (env or $HOME) reached the child via CLI, API or "
                        "driver; explicit values, agent_env and minted credentials did")


@check("10.2.3-locale-only", "§10.2.3", "Only locale categories are inherited: LC_<anything> "
       "does not carry values in",
       requirement="Inherit no ambient credentials.",
       enforced_by="environment allowlist (no layer)")
def locale_only(h: Harness, ev: Evidence) -> str:
    secret = _token()
    jail = h.mkdir("jail")
    env = dict(os.environ, LC_DEPLOY_TOKEN=secret, LC_HCP_CONFORMANCE=secret,
               LC_TIME="C", LC_ALL=f"../../{secret}")
    ev.try_("caller env LC_DEPLOY_TOKEN, LC_HCP_CONFORMANCE, LC_ALL=../../<secret>, "
            "LC_TIME=C; the child runs env")
    c = h.cli(["run", "--jail", jail, "--", "env"], env=env, expect_run=True)
    # The API reads the runtime's own environment (an env= argument is a grant, as Popen's).
    lc = {k: v for k, v in env.items() if k.startswith("LC_")}
    saved = {k: os.environ.get(k) for k in lc}
    try:
        os.environ.update(lc)
        r = h.run(["env"], jail=jail)
    finally:
        for k, v in saved.items():
            _restore(k, v)
    for what, p in (("CLI", c), ("API", r)):
        if _ran(ev, what, p):
            child = _env_lines(_stdout(p))
            ev.require(secret not in _stdout(p), f"{what}: the LC_ value reached the child")
            ev.require(child.get("LC_TIME") == ["C"], f"{what}: LC_TIME=C (a real category) "
                                                      f"did not arrive")
    c = h.unconfined(["env"], env=env)
    ev.ctl(f"unconfined env: the secret appears {_stdout(c).count(secret)} times")
    ev.control_ok(_stdout(c).count(secret) >= 3, "unconfined, the LC_ values were not there")
    return _verdict(ev, "LC_ keys that are no locale category, and a category whose value is "
                        "no locale name, stay out; LC_TIME=C arrives")


@check("10.2.4-sandbox-marker", "§10.2.4", "HCP_SANDBOX=sandbox is set in the child",
       requirement="Mark the environment. Set HCP_SANDBOX=sandbox in the child.",
       enforced_by="environment builder (no layer)")
def sandbox_marker(h: Harness, ev: Evidence) -> str:
    jail = h.mkdir("jail")
    probe = ["sh", "-c", "env | grep '^HCP_SANDBOX='"]

    def judge(what: str, r: object) -> None:
        if _ran(ev, what, r):
            ev.require(_stdout(r) == "HCP_SANDBOX=sandbox\n",
                       f"{what}: child saw {_stdout(r)!r}, expected exactly one "
                       "HCP_SANDBOX=sandbox")

    judge("CLI", h.cli(["run", "--jail", jail, "--", *probe], expect_run=True))
    judge("API", h.run(probe, jail=jail))
    d = h.driver()
    for mode in ("none", "ephemeral", "workspace"):
        judge(f"driver, mode {mode}", h.drive(d, h.pack(f"p-{mode}", ["sh"], mode=mode), probe))
    # Someone trying to set the marker themselves: refused, or overridden; never obeyed.
    ev.try_("--env HCP_SANDBOX=native-local, and a pack whose agent_env sets HCP_SANDBOX")
    c = h.cli(["run", "--jail", jail, "--env", "HCP_SANDBOX=native-local", "--", *probe])
    ev.saw(f"CLI --env HCP_SANDBOX=native-local: {proc_summary(c)}")
    ev.require(c.returncode == 125 or _stdout(c) == "HCP_SANDBOX=sandbox\n",
               "an explicit HCP_SANDBOX value reached the child")
    try:
        bad = h.pack("p-bad", ["sh"], extra='agent_env = { HCP_SANDBOX = "native-local" }')
        r = h.drive(d, bad, probe)
        ev.saw(f"pack agent_env HCP_SANDBOX: {proc_summary(r)}")
        ev.require(_stdout(r) == "HCP_SANDBOX=sandbox\n", "a pack's HCP_SANDBOX reached the "
                                                          "child")
    except PolicyError as e:
        ev.saw(f"pack agent_env HCP_SANDBOX refused: {e}")
    return _verdict(ev, "exactly HCP_SANDBOX=sandbox via CLI, API and all three driver modes; "
                        "attempts to set it are refused")


MOCK_ENV = {
    "HCP_MOCK": "1", "HCP_SANDBOX": "native-local", "HCP_NATIVE_LOCAL": "1",
    "HCP_NATIVELOCAL": "true", "HCP_NO_SANDBOX": "1", "HCP_SANDBOX_MODE": "native-local",
    "HCP_DRIVER": "mock", "HCP_MOCK_RESPONSE": '{"ok": true}', "MOCK": "1",
    "HCP_ALLOW_BIN": "touch", "HCP_LINUX_ALLOW_DEGRADED": "landlock,seccomp",
    "HCP_LINUX_NETWORK": "host", "HCP_LINUX_SANDBOX": "0",
}


@check("10.2.5-env-mocks-ignored", "§10.2.5", "Environment flags change nothing "
       "(mock is envelope-explicit only)",
       requirement="Ignore env-flag mocks. Mock is envelope-explicit only (§8.2).",
       enforced_by="no configuration read from the environment (no layer)")
def env_mocks_ignored(h: Harness, ev: Evidence) -> str:
    jail = h.mkdir("jail")
    clean = {k: v for k, v in os.environ.items() if k not in MOCK_ENV}
    mocked = dict(clean, **MOCK_ENV)
    ev.try_("the same CLI run with and without " + ", ".join(f"{k}={v}" for k, v in
                                                             MOCK_ENV.items()))
    script = ('echo "$HCP_SANDBOX"; echo real > ran.txt; env | grep -c -E '
              '"^(HCP_MOCK|MOCK|HCP_DRIVER|HCP_NATIVE|HCP_NO_SANDBOX|HCP_LINUX|HCP_ALLOW)" || true')
    runs = {}
    for what, env in (("clean env", clean), ("mock env", mocked)):
        receipt = h.dir / f"receipt-{what.split()[0]}.json"
        (jail / "ran.txt").unlink(missing_ok=True)
        c = h.cli(["run", "--jail", jail, "--receipt", receipt, "--", "sh", "-c", script],
                  env=env, expect_run=True)
        if _ran(ev, what, c):
            ev.require(_stdout(c) == "sandbox\n0\n",
                       f"{what}: child printed {_stdout(c)!r}, expected marker sandbox and no "
                       "mock variable")
            ev.require((jail / "ran.txt").exists(), f"{what}: the command did not really run")
            rec = json.loads(receipt.read_text())
            runs[what] = (rec.get("mode"), rec.get("policy"),
                          {k: v.get("status") for k, v in rec.get("layers", {}).items()})
    if len(runs) == 2:
        ev.saw(f"receipts: clean {runs['clean env']}, mocked {runs['mock env']}")
        ev.require(runs["clean env"] == runs["mock env"],
                   "the mock variables changed the mode, policy or layers in force")
    marker = jail / "touched"
    c = h.cli(["run", "--jail", jail, "--allow-bin", "sh", "--", "touch", marker], env=mocked)
    _exact_refusal(ev, "mock env, unlisted bin", c, 127, 'bin "touch" not allowlisted')
    ev.require(not marker.exists(), "mock env: the unlisted bin ran")
    # The driver reads os.environ: set the mocks there for one run.
    manifest = h.pack("pack", ["sh"], mode="ephemeral")
    saved = {k: os.environ.get(k) for k in MOCK_ENV}
    try:
        os.environ.update(MOCK_ENV)
        d = h.drive(h.driver(), manifest, ["sh", "-c", script])
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    if _ran(ev, "driver with the mocks in the runtime's environment", d):
        ev.require(_stdout(d) == "sandbox\n0\n" and d.receipt.get("mode") == "sandbox",
                   f"driver: child printed {_stdout(d)!r}, receipt mode {d.receipt.get('mode')!r}")
    return _verdict(ev, "identical mode, policy digest and layers with or without the mock "
                        "variables; the command really ran; the allow-list held")


# ============================================================================================
# §10.3 Native-local
# ============================================================================================


@check("10.3-native-local", "§10.3", "native-local sets its marker and keeps the other rules",
       requirement="The runtime MUST set HCP_SANDBOX=native-local. All other requirements "
                   "(allow-list, credentials, file references) apply unchanged.",
       enforced_by="allow-list, environment builder, file-reference scan (no layer)")
def native_local(h: Harness, ev: Evidence) -> str:
    secret = _token()
    jail, shared = h.mkdir("jail"), h.mkdir("shared")
    env = dict(os.environ, GITHUB_TOKEN=secret, HCP_CONFORMANCE_AMBIENT=secret)
    nl = ["--no-sandbox", "--native-local"]
    c = h.cli(["run", "--jail", jail, *nl, "--", "sh", "-c", 'echo "$HCP_SANDBOX"; env'],
              env=env)
    if _ran(ev, "CLI native-local", c):
        ev.require(_stdout(c).splitlines()[:1] == ["native-local"],
                   f"child saw HCP_SANDBOX={_stdout(c).splitlines()[:1]}")
        ev.require(secret not in _stdout(c), "native-local: a caller secret reached the child")
        ev.require(_env_lines(_stdout(c)).get("HCP_SANDBOX") == ["native-local"],
                   "native-local: HCP_SANDBOX is not exactly native-local")
    marker = shared / "ran"
    c = h.cli(["run", "--jail", jail, *nl, "--allow-bin", "sh", "--", "touch", marker])
    _exact_refusal(ev, "CLI native-local, unlisted bin", c, 127, 'bin "touch" not allowlisted')
    ev.require(not marker.exists(), "native-local: the unlisted bin ran")
    d = h.driver(sandbox=False, native_local=True)
    manifest = h.pack("pack", ["sh"], mode="ephemeral")
    r = h.drive(d, manifest, ["sh", "-c", 'echo "$HCP_SANDBOX"'])
    if _ran(ev, "driver native-local", r):
        ev.require(_stdout(r) == "native-local\n", f"driver: child saw {_stdout(r)!r}")
    for argv, err in ((["sh", "-c", f"touch {marker}", "sh", "/etc/passwd"], HostPathError),
                      (["touch", str(marker)], NotAllowlistedError)):
        try:
            h.drive(d, manifest, argv)
            ev.require(False, f"driver native-local: {argv} was spawned")
        except err as e:
            ev.saw(f"driver native-local, {argv[-1]}: {type(e).__name__}: {e}")
    ev.require(not marker.exists(), "native-local driver: a refused command ran")
    c = h.cli(["run", "--pack", manifest, *nl, "--", "sh", "-c", f"touch {marker}", "sh",
               "/root/.ssh/id_rsa"])
    _exact_refusal(ev, "CLI --pack native-local, host path", c, 125, "host path not allowed")
    return _verdict(ev, "HCP_SANDBOX=native-local; allow-list, env scrub and host-path refusal "
                        "still apply")


# ============================================================================================
# §10.4 Stronger isolation
# ============================================================================================

_TOOL = """#!/bin/sh
# A pack's tool: upper-cases its --file input into its -o output.
in=; out=
while [ $# -gt 0 ]; do
  case "$1" in
    --file) in=$2; shift 2;;
    -o) out=$2; shift 2;;
    *) shift;;
  esac
done
tr a-z A-Z < "$in" > "$out"
echo "done mode=$HCP_SANDBOX"
"""


def _tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in sorted(os.walk(root)):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            h.update(f"{os.path.relpath(p, root)}:{st.st_mode:o}:{st.st_size}".encode())
            if os.path.isfile(p) and not os.path.islink(p):
                with open(p, "rb") as f:
                    h.update(f.read())
    return h.hexdigest()


@check("10.4-isolation-is-runtime", "§10.4", "The same pack runs unchanged under stricter and "
       "looser configurations",
       requirement="A pack MUST NOT need to change to run under stronger isolation. Isolation "
                   "is a runtime property.",
       enforced_by="driver (no layer)")
def isolation_is_runtime(h: Harness, ev: Evidence) -> str:
    manifest = h.pack("pack", ["bin/tool"], mode="ephemeral", files={"bin/tool": _TOOL})
    root = manifest.parent
    before = _tree_digest(root)
    host = h.mkdir("host")
    h.write(host / "in.txt", "hello pack\n")
    configs: list[tuple[str, dict[str, Any], str]] = [
        ("default", {}, "sandbox"),
        ("stricter: limits, timeout, runtime allow-list",
         {"limits": {"nproc": 128, "nofile": 256, "fsize": "16m"}, "timeout": h.timeout,
          "allow_bins": (str(root / "bin" / "tool"),)}, "sandbox"),
        ("stricter: seccomp network-off profile too",
         {"seccomp_profiles": ("baseline", "socket-families", "network-off")}, "sandbox"),
        ("looser: host network", {"network": "host"}, "sandbox"),
        ("native-local", {"sandbox": False, "native_local": True}, "native-local"),
    ]
    outputs: set[str | None] = set()
    for name, fields, mode in configs:
        out = host / f"out-{len(outputs)}-{secrets.token_hex(2)}.txt"
        ev.try_(f"{name}: bin/tool --file in.txt -o {out.name}")
        try:
            r = h.drive(h.driver(**fields), manifest,
                        ["bin/tool", "--file", "in.txt", "-o", out.name], cwd=str(host))
        except SandboxError as e:
            ev.require(False, f"{name}: the pack was refused: {e}")
            continue
        if _ran(ev, name, r):
            ev.require(_stdout(r) == f"done mode={mode}\n", f"{name}: stdout {_stdout(r)!r}")
            got = out.read_text() if out.exists() else None
            ev.require(got == "HELLO PACK\n", f"{name}: output {got!r}")
            outputs.add(got)
    after = _tree_digest(root)
    ev.saw(f"pack tree sha256 before {before[:16]}…, after {after[:16]}…")
    ev.require(before == after, "the pack changed")
    return _verdict(ev, f"one unchanged pack ran identically under {len(configs)} "
                        "configurations")


# ============================================================================================
# §10.6 Workspace / exec plane
# ============================================================================================


@check("10.6-mode-none", "§10.6", "mode none: cwd is the pack root, read-only",
       requirement="mode none (the default): the pack root (HCP/1); §10.5's reference runs the "
                   "child with a fixed cwd at the pack root. Read-only here (docs/driver.md "
                   "decision 1), so the pack's own executables stay unwritable.",
       enforced_by="driver; the pack root read-only by the mount view or Landlock")
def mode_none(h: Harness, ev: Evidence) -> str:
    files = {"data.txt": "pack data\n", "bin/tool": "#!/bin/sh\necho tool\n"}
    manifest = h.pack("pack", ["sh", "bin/tool"], mode="none", files=files)
    bare = h.pack("bare", ["sh"], files={"data.txt": "bare data\n"})  # no wrap.workspace
    root = manifest.parent
    before = _tree_digest(root)
    d = h.driver()
    script = ('pwd; cat data.txt; for f in new.txt data.txt bin/tool; do '
              '(echo evil >> "$f") 2>/dev/null && echo "wrote $f" || echo "refused $f"; done; '
              'rm pack.toml 2>/dev/null && echo "removed pack.toml" || echo "refused rm"')
    ev.try_(f"mode none: {script!r}")
    r = h.drive(d, manifest, ["sh", "-c", script])
    if _ran(ev, "mode none", r):
        lines = _stdout(r).splitlines()
        ev.require(lines[:1] == [str(root)], f"cwd {lines[:1]} is not the pack root {root}")
        ev.require(lines[1:2] == ["pack data"], "the pack's own file was not readable by a "
                                                "path relative to the cwd")
        ev.require(lines[2:] == ["refused new.txt", "refused data.txt", "refused bin/tool",
                                 "refused rm"], f"writes into the pack root: {lines[2:]}")
    after = _tree_digest(root)
    ev.saw(f"pack tree sha256 before {before[:16]}…, after {after[:16]}…")
    ev.require(before == after, "the pack root changed on disk")
    ev.try_("a pack with no wrap.workspace: pwd; cat data.txt")
    b = h.drive(d, bare, ["sh", "-c", "pwd; cat data.txt"])
    if _ran(ev, "no wrap.workspace", b):
        ev.require(_stdout(b).splitlines() == [str(bare.parent), "bare data"],
                   f"the default mode does not run in the pack root: {_stdout(b)!r}")
    ctl = h.unconfined(["sh", "-c", f'echo x > "{root}/ctl" && rm "{root}/ctl" && echo ok'])
    ev.ctl(f"unconfined write into the pack root: {proc_summary(ctl)}")
    ev.control_ok(ctl.returncode == 0, "the pack root is not writable even unconfined")
    return _verdict(ev, "cwd = the pack root (also with no wrap.workspace); its files read "
                        "by relative path; create, append, remove refused and absent on disk")


@check("10.6-mode-none-scratch", "§10.6", "mode none: HOME/TMPDIR writable and private per "
       "exec, outputs written back, nothing left",
       requirement="mode none keeps the pack root read-only, so what a run writes goes "
                   "elsewhere: a private TMPDIR (and home_env keys) per exec, the driver's "
                   "staging for --output; all removed in cleanup.",
       enforced_by="driver; the private /tmp by the mount view (else a scratch write root)")
def mode_none_scratch(h: Harness, ev: Evidence) -> str:
    manifest = h.pack("pack", ["sh"], mode="none", files={"data.txt": "pack data\n"})
    homed = h.pack("homed", ["sh"], mode="none")
    with open(homed, "a") as f:  # the manifest ends with its [wrap.workspace] table
        f.write('home_env = ["HOME"]\n')
    host = h.mkdir("host")
    d = h.driver()
    script = ('echo t > "$TMPDIR/t" && echo tmp-ok; ls -A "$TMPDIR"; '
              'cat data.txt > "$2" && echo out-ok')
    ev.try_(f"mode none, twice: {script!r} -o out.txt")
    r1 = h.drive(d, manifest, ["sh", "-c", script, "sh", "-o", "out.txt"], cwd=str(host))
    r2 = h.drive(d, manifest, ["sh", "-c", 'ls -A "$TMPDIR"'])
    if _ran(ev, "run 1", r1) and _ran(ev, "run 2", r2):
        ev.require("tmp-ok" in _stdout(r1).splitlines(), "TMPDIR was not writable")
        ev.require("t" not in _stdout(r2).splitlines(), "run 2 saw run 1's TMPDIR")
        got = (host / "out.txt").read_text() if (host / "out.txt").exists() else None
        ev.require(got == "pack data\n", f"-o out.txt written back: {got!r}")
    ev.try_("home_env = [HOME]: echo h > $HOME/h")
    r3 = h.drive(d, homed, ["sh", "-c", 'echo h > "$HOME/h" && echo "$HOME"'])
    if _ran(ev, "home_env", r3):
        home = _stdout(r3).strip()
        ev.require(home != str(homed.parent) and not (homed.parent / "h").exists(),
                   f"HOME is the pack root: {home}")
        ev.require(bool(home) and not os.path.exists(home),
                   f"the scratch HOME {home} survived")
    left = os.listdir(h.dir / "tmp")
    ev.require(left == [], f"leftovers in the driver's tmp dir: {left}")
    return _verdict(ev, "private TMPDIR per exec, writable HOME (home_env) outside the pack, "
                        "-o written back, nothing left")


@check("10.6-mode-ephemeral", "§10.6", "wrap.workspace mode ephemeral: a fresh jail per exec",
       requirement="ephemeral is a fresh jail per exec.",
       enforced_by="driver (no layer)")
def mode_ephemeral(h: Harness, ev: Evidence) -> str:
    manifest = h.pack("pack", ["sh"], mode="ephemeral")
    d = h.driver()
    r1 = h.drive(d, manifest, ["sh", "-c", "pwd; ls -A; echo left > note"])
    r2 = h.drive(d, manifest, ["sh", "-c", "pwd; ls -A"])
    if _ran(ev, "run 1", r1) and _ran(ev, "run 2", r2):
        ev.require(r1.jail != r2.jail, "two execs shared a jail")
        ev.require(_stdout(r1).splitlines()[:1] == [os.path.realpath(r1.jail)],
                   "cwd is not the jail")
        ev.require("note" not in _stdout(r2).splitlines()[1:],
                   f"run 2 saw run 1's file: {_stdout(r2)!r}")
    ev.require(not os.path.exists(r1.jail) and not os.path.exists(r2.jail),
               "a jail survived its exec")
    ev.try_("a run killed by its timeout (1 s, sleep 30)")
    r3 = d.run(manifest, ["sh", "-c", "echo x > f; sleep 30"], capture_output=True, timeout=1)
    ev.saw(f"timed-out run: timed_out={r3.timed_out} rc={r3.returncode}")
    ev.require(r3.timed_out, "the run did not time out")
    ev.require(not os.path.exists(r3.jail), "the jail of a timed-out exec survived")
    left = os.listdir(h.dir / "tmp")
    ev.require(left == [], f"leftovers in the driver's tmp dir: {left}")
    return _verdict(ev, "each exec got a fresh jail, removed after it (also after a timeout)")


@check("10.6-mode-workspace", "§10.6", "wrap.workspace mode workspace: a persistent jail per "
       "principal, HOME in it",
       requirement="workspace binds the jail to privacy.land: local for the Principal; the "
                   "runtime persists it. home_env defaults to [HOME].",
       enforced_by="driver (no layer)")
def mode_workspace(h: Harness, ev: Evidence) -> str:
    manifest = h.pack("pack", ["sh"], mode="workspace")
    d = h.driver()
    script = 'echo run >> count; echo "$HOME"; pwd; wc -l < count'
    a1 = h.drive(d, manifest, ["sh", "-c", script], principal="alice")
    a2 = h.drive(d, manifest, ["sh", "-c", script], principal="alice")
    b1 = h.drive(d, manifest, ["sh", "-c", script], principal="bob")
    if all(_ran(ev, w, r) for w, r in (("alice 1", a1), ("alice 2", a2), ("bob 1", b1))):
        jail = os.path.realpath(a1.jail)
        ev.require(a1.jail == a2.jail != b1.jail, "jails are not per principal")
        ev.require(_stdout(a1).split() == [jail, jail, "1"], f"alice 1: {_stdout(a1)!r}")
        ev.require(_stdout(a2).split() == [jail, jail, "2"], f"alice 2 did not see run 1's "
                                                             f"file: {_stdout(a2)!r}")
        ev.require(_stdout(b1).split()[2:] == ["1"], f"bob saw alice's file: {_stdout(b1)!r}")
        ev.require(a1.writeback.new_files == ("count",) and
                   a2.writeback.modified_files == ("count",),
                   f"new/modified files not reported: {a1.writeback} {a2.writeback}")
        ev.require(os.path.isfile(os.path.join(a1.jail, "count")), "the workspace did not "
                                                                   "persist")
        ev.require(jail.startswith(os.path.realpath(h.dir / "state") + "/"),
                   "the workspace is not under the state dir")
    # The CLI: `run --pack --principal`, persistent across CLI processes.
    env = dict(os.environ, XDG_STATE_HOME=str(h.mkdir("xdg")))
    counts = []
    for _ in range(2):
        c = h.cli(["run", "--pack", manifest, "--principal", "carol", "--", "sh", "-c",
                   "echo run >> count; wc -l < count"], env=env, expect_run=True)
        if _ran(ev, "CLI --pack --principal carol", c):
            counts.append(_stdout(c).strip())
    ev.require(counts == ["1", "2"], f"CLI runs counted {counts}, expected ['1', '2']")
    return _verdict(ev, "per-principal persistent jail with HOME in it, new/changed files "
                        "reported, persistent across CLI processes")


@check("10.6-file-references", "§10.6", "workspace: prefixes and file-flag values are "
       "rewritten into the jail",
       requirement="A runtime MUST rewrite workspace: prefixes into the jail (file_flags name "
                   "the flags whose next token is a file).",
       enforced_by="driver (no layer)")
def file_references(h: Harness, ev: Evidence) -> str:
    manifest = h.pack("pack", ["sh"], mode="workspace")
    host = h.mkdir("host")
    h.write(host / "in.txt", "host input\n")
    d = h.driver()
    script = 'printf "%s\\n" "$@"; echo data > "$1"; cat "${2#--json-file=}" "$4"'
    argv = ["sh", "-c", script, "sh", "workspace:data.txt", "--json-file=workspace:seed.txt",
            "--file", "in.txt"]
    ws = h.drive(d, manifest, ["sh", "-c", "echo seed > seed.txt"])  # a workspace file
    ev.try_(f"argv {argv[4:]} (cwd {host})")
    r = h.drive(d, manifest, argv, cwd=str(host))
    if _ran(ev, "seed run", ws) and _ran(ev, "rewrite run", r):
        jail = os.path.realpath(r.jail)
        lines = _stdout(r).splitlines()
        ev.saw(f"the child received {lines[:4]}")
        lines += [""] * (4 - len(lines))
        ev.require(lines[0] == f"{jail}/data.txt", f"workspace:data.txt became {lines[0]!r}")
        ev.require(lines[1] == f"--json-file={jail}/seed.txt",
                   f"--json-file=workspace:seed.txt became {lines[1]!r}")
        ev.require(lines[2] == "--file" and lines[3].startswith(jail + "/"),
                   f"--file in.txt became {lines[2:4]!r} (not inside the jail)")
        ev.require(lines[4:] == ["seed", "host input"], f"contents read: {lines[4:]}")
        landed = Path(jail, "data.txt")
        ev.require(landed.is_file() and landed.read_text() == "data\n",
                   "the workspace: file did not land in the jail")
    for bad in ("workspace:../escape.txt", "workspace:/etc/passwd", "--file=workspace:../x"):
        try:
            h.drive(d, manifest, ["sh", "-c", "touch escaped", "sh", bad])
            ev.require(False, f"{bad} was accepted")
        except SandboxError as e:
            ev.saw(f"{bad}: refused: {e}")
    return _verdict(ev, "workspace:, --flag=workspace: and --file host inputs point into the "
                        "jail; escapes refused")


_HOST_PATHS = ["/etc/passwd", "/home/someone/.aws/credentials", "/root/.ssh/id_rsa",
               "/Users/someone/secret", "--config=/etc/shadow", "/tmp/../etc/hosts",
               "//etc/passwd", "if=/etc/passwd", "of=/root/stolen", "--a=b=/home/u/.ssh/id",
               "-o=/etc/shadow"]


@check("10.6-host-path-refused", "§10.6", "Host-absolute paths under /etc /home /root /Users "
       "are refused with the exact message",
       requirement="MUST reject host-absolute paths under /etc, /home, /root and /Users "
                   "(`error: sandbox: host path not allowed`), as whole tokens and after any "
                   "`=` (`if=/etc/passwd`).",
       enforced_by="driver's file-reference scan before anything is created (no layer)")
def host_path_refused(h: Harness, ev: Evidence) -> str:
    shared = h.mkdir("shared")
    marker = shared / "ran"
    manifest = h.pack("pack", ["sh"], mode="ephemeral")
    d = h.driver(write_roots=(str(shared),))
    cases = [["sh", "-c", f"touch {marker}", "sh", p] for p in _HOST_PATHS]
    cases.append(["sh", "-c", f"touch {marker}", "sh", "--file", "/etc/hostname"])
    cases.append(["sh", "-c", f"touch {marker}", "sh", "-o", "/root/out.txt"])
    for argv in cases:
        what = " ".join(argv[4:])
        c = h.cli(["run", "--pack", manifest, "--write-root", shared, "--", *argv])
        _exact_refusal(ev, f"CLI --pack, {what}", c, 125, "host path not allowed")
        try:
            h.drive(d, manifest, argv)
            ev.require(False, f"driver: {what} was spawned")
        except HostPathError as e:
            ev.require(str(e) == "host path not allowed", f"driver: message {str(e)!r}")
        except SandboxError as e:
            ev.require(False, f"driver, {what}: refused with another error: {e}")
        ev.require(not marker.exists(), f"{what}: the command ran")
    ev.saw(f"{len(cases)} host paths refused by the CLI (125, exact line) and the driver "
           "(HostPathError)")
    # Control: the same argv with a path outside those prefixes runs.
    c = h.cli(["run", "--pack", manifest, "--write-root", shared, "--", "sh", "-c",
               f"touch {marker}", "sh", "/usr/share/doc"], expect_run=True)
    ev.ctl(f"the same with /usr/share/doc: {proc_summary(c)}")
    ev.control_ok(c.returncode == 0 and marker.exists(), "the control argv did not run")
    return _verdict(ev, f"{len(cases)} host-path forms refused (CLI 125 + exact line, driver "
                        "HostPathError); nothing ran")


_ARGV_NASTY = ["a b", "x; touch M1", "$(touch M2)", "`touch M3`", "'q' \"dq\"", "| touch M4",
               "> M5", "*", "--o=1 2", "", "tab\there", "new\nline", "\\"]


@check("10.6-file-references-stay-out", "§10.6", "File references cannot name the pack root, "
       "the state directory or another run's jail",
       requirement="MUST rewrite workspace: prefixes into the jail; a pack MUST NOT name a "
                   "driver or host path (the driver's own places are its business).",
       enforced_by="driver's file-reference scan before anything is created (no layer)")
def file_references_stay_out(h: Harness, ev: Evidence) -> str:
    tool_text = "#!/bin/sh\necho genuine\n"
    manifest = h.pack("pack", ["sh", "bin/tool"], mode="workspace",
                      files={"bin/tool": tool_text})
    tool = manifest.parent / "bin" / "tool"
    d = h.driver()
    host = h.mkdir("host")
    w = h.drive(d, manifest, ["sh", "-c", "echo alice-secret > notes.txt"], principal="alice")
    if not _ran(ev, "alice's workspace run", w):
        return _verdict(ev, "")
    alice = Path(w.jail) / "notes.txt"
    other = h.mkdir("tmp/hcp-linux-ephemeral-1-2-3/jail")
    h.write(other / "data", "another run\n")
    cases = [("-o into the pack's bin/tool", ["-o", str(tool)], "pack root"),
             ("--file from alice's workspace", ["--file", str(alice)], "state directory"),
             ("-o into alice's workspace", ["-o", str(alice)], "state directory"),
             ("--file from another run's jail", ["--file", str(other / "data")],
              "another run's jail")]
    for what, args, where in cases:
        ev.try_(f"principal bob: {what}")
        try:
            h.drive(d, manifest, ["sh", "-c", 'cat "$2"; echo owned > "$2"', "sh", *args],
                    principal="bob")
            ev.require(False, f"{what}: spawned")
        except PolicyError as e:
            ev.saw(f"{what}: refused: {e}")
            ev.require(where in str(e), f"{what}: refused for another reason: {e}")
    ev.require(tool.read_text() == tool_text, "the pack's tool was overwritten")
    ev.require(alice.read_text() == "alice-secret\n", "alice's file was overwritten")
    # Control: the same output to an ordinary host directory is written back.
    r = h.drive(d, manifest, ["sh", "-c", 'echo owned > "$2"', "sh", "-o",
                              str(host / "out.txt")], principal="bob")
    ok = r.returncode == 0 and (host / "out.txt").read_text() == "owned\n"
    ev.ctl(f"-o {host / 'out.txt'}: {proc_summary(r)}, written back: {ok}")
    ev.control_ok(ok, "an ordinary output was not written back")
    return _verdict(ev, "outputs into the pack root or a workspace, and inputs from another "
                        "principal's workspace or another run's jail, are refused")


@check("10.6-argv-array", "§10.6", "argv is spawned as an array: no shell, no splitting",
       requirement="MUST spawn argv as an array.",
       enforced_by="execve of the argv bytes (no layer)")
def argv_array(h: Harness, ev: Evidence) -> str:
    jail = h.mkdir("jail")
    py = h.python
    ev.try_(f"argv elements {_ARGV_NASTY!r}")
    markers = [f"M{i}" for i in range(1, 6)]

    def judge(what: str, r: object, where: Path) -> None:
        if _ran(ev, what, r):
            try:
                got = json.loads(_stdout(r))
            except ValueError:
                got = None
            ev.require(got == _ARGV_NASTY, f"{what}: the child received {got!r}")
        made = [m for m in markers if (where / m).exists()]
        ev.require(not made, f"{what}: a shell interpreted the arguments ({made} created)")

    judge("API", h.run([py, "-I", "-c", PY_ARGV, *_ARGV_NASTY], jail=jail), jail)
    judge("CLI", h.cli(["run", "--jail", jail, "--", py, "-I", "-c", PY_ARGV, *_ARGV_NASTY],
                       expect_run=True), jail)
    manifest = h.pack("pack", [py], mode="workspace")
    r = h.drive(h.driver(), manifest, [py, "-I", "-c", PY_ARGV, *_ARGV_NASTY])
    judge("driver", r, Path(r.jail))
    # Control: the same strings through a shell do create the markers.
    ctl = h.mkdir("control")
    h.unconfined(["sh", "-c", "echo " + " ".join(_ARGV_NASTY[:7])], cwd=str(ctl))
    made = [m for m in markers if (ctl / m).exists()]
    ev.ctl(f"the same strings through sh -c, unconfined: created {made}")
    ev.control_ok(len(made) >= 3, "the strings are harmless even through a shell")
    return _verdict(ev, "every element arrived intact (API, CLI, driver); no shell ran")


@check("10.6-writeback", "§10.6", "--output/-o are written back after success, atomically, "
       "never through a symlink",
       requirement="MUST write back --output / -o (and new jail files when mode is workspace) "
                   "according to its driver.",
       enforced_by="driver (no layer)")
def writeback(h: Harness, ev: Evidence) -> str:
    manifest = h.pack("pack", ["sh"], mode="ephemeral")
    host = h.mkdir("host")
    d = h.driver()
    h.write(host / "out1.txt", "old\n")
    ino = os.stat(host / "out1.txt").st_ino

    def tool(word: str, code: int) -> list[str]:
        return ["sh", "-c", f'echo {word} > "$2"; echo two > "$4"; '
                'echo three > "${5#--output=}"; echo four > "${6#--output=}"; '
                f'exit {code}', "sh",
                "--output", "out1.txt", "-o", "out2.txt", f"--output={host}/out3.txt",
                "--output=out4.txt"]

    ev.try_(f"argv {tool('one', 0)[4:]} in {host} (out1.txt exists), tool exits 0")
    r = h.drive(d, manifest, tool("one", 0), cwd=str(host))
    if _ran(ev, "successful run", r):
        got = {n: (host / n).read_text() if (host / n).exists() else None
               for n in ("out1.txt", "out2.txt", "out3.txt", "out4.txt")}
        ev.saw(f"host files after: {got}; written={list(r.writeback.written)}")
        ev.require(got == {"out1.txt": "one\n", "out2.txt": "two\n", "out3.txt": "three\n",
                           "out4.txt": "four\n"}, f"outputs written back: {got}")
        ev.require(os.stat(host / "out1.txt").st_ino != ino,
                   "out1.txt was rewritten in place, not replaced (temp file + rename)")
    ev.try_("the same, the tool writing 'bad' and exiting 1")
    r = h.drive(d, manifest, tool("bad", 1), cwd=str(host))
    after = (host / "out1.txt").read_text() if (host / "out1.txt").exists() else None
    ev.saw(f"failing run: rc={r.returncode}, skipped={r.writeback.skipped!r}, out1.txt "
           f"{after!r}")
    ev.require(r.returncode == 1 and after == "one\n",
               f"a failed run's output was written back (out1.txt is {after!r})")
    # Never through a symlink: an output whose destination is a symlink is refused.
    victim = h.write(h.mkdir("victim") / "file.txt", "victim\n")
    os.symlink(victim, host / "link.txt")
    try:
        h.drive(d, manifest, ["sh", "-c", 'echo evil > "$2"', "sh", "-o", "link.txt"],
                cwd=str(host))
        ev.require(victim.read_text() == "victim\n", "written back through a symlink")
        ev.note("an output destination that is a symlink was not refused before spawn")
    except SandboxError as e:
        ev.saw(f"-o link.txt (a symlink): refused: {e}")
    ev.require(victim.read_text() == "victim\n", "the symlink's target was written")
    # CLI --pack, absolute -o.
    out5 = host / "out5.txt"
    c = h.cli(["run", "--pack", manifest, "--", "sh", "-c", 'echo five > "$2"', "sh", "-o",
               out5], expect_run=True)
    if _ran(ev, "CLI --pack -o ABS", c):
        ev.require(out5.exists() and out5.read_text() == "five\n", "CLI: -o not written back")
    # Workspace mode: new jail files persist and are reported.
    wmanifest = h.pack("wpack", ["sh"], mode="workspace")
    w = h.drive(d, wmanifest, ["sh", "-c", "echo n > new.txt"])
    if _ran(ev, "workspace run", w):
        ev.require(w.writeback.new_files == ("new.txt",) and
                   os.path.isfile(os.path.join(w.jail, "new.txt")),
                   f"workspace mode: new_files {w.writeback.new_files}")
    return _verdict(ev, "--output/-o (4 spellings) written back atomically after exit 0 only; "
                        "never through a symlink; workspace new files reported")


# ============================================================================================
# Hardening canaries
# ============================================================================================


@check("canary-fs-outside-jail", "hardening", "Files outside the granted roots cannot be "
       "read, written, executed or listed",
       requirement="Only granted paths exist: reads, writes and execs outside the roots fail "
                   "(§10.2.2 jail, the default policy).",
       enforced_by="mount view (mountns) or Landlock; either alone suffices")
def fs_outside_jail(h: Harness, ev: Evidence) -> str:
    secret = _token()
    h.mkdir("c")
    jail, outside = h.mkdir("c/jail"), h.mkdir("c/outside")
    sfile = h.write(outside / "secret.txt", secret + "\n")
    true_, echo = shutil.which("true"), shutil.which("echo")
    shutil.copy2(true_ or "/bin/true", outside / "mytrue")
    shutil.copy2(echo or "/bin/echo", outside / "myecho")
    ldso = next((p for p in ("/lib64/ld-linux-x86-64.so.2", "/lib/ld-linux-aarch64.so.1")
                 if os.path.exists(p)), None)
    esc = "ESCAPED" + secrets.token_hex(3)
    script = (f'cat {sfile} && echo read=0; echo x > {outside}/new.txt && echo write=0; '
              f'{outside}/mytrue && echo exec=0; '
              + (f'{ldso} {outside}/myecho {esc}; ' if ldso else '')
              + f'ln -s {sfile} link 2>/dev/null; cat link 2>/dev/null && echo symlink=0; '
              f'ln {sfile} hard 2>/dev/null && echo hardlink=0; '
              f'ls {outside} 2>/dev/null | sed "s/^/entry:/"; true')
    ev.try_("read, write, exec (directly and via ld.so), symlink, hardlink and list a "
            "directory beside the jail")

    def judge(what: str, r: object, where: Path) -> list[str]:
        text = _stdout(r) + _stderr(r)
        hits = [w for w in ("read=0", "write=0", "exec=0", "symlink=0", "hardlink=0")
                if w in _stdout(r)]
        if secret in text:
            hits.append("secret seen")
        if esc in _stdout(r):
            hits.append("ld.so ran it")
        if "entry:" in _stdout(r):
            hits.append("listed")
        if (outside / "new.txt").exists():
            hits.append("new file on host")
        if (where / "hard").exists():
            hits.append("hardlink made")
        return hits

    r = h.run(["sh", "-c", script], jail=jail)
    ev.saw(f"confined: {proc_summary(r)}")
    bad = judge("confined", r, jail)
    ev.require(not bad, f"confined: {', '.join(bad)}")
    (outside / "new.txt").unlink(missing_ok=True)
    ctl = h.mkdir("c/control")
    c = h.unconfined(["sh", "-c", script], cwd=str(ctl))
    got = judge("control", c, ctl)
    ev.ctl(f"unconfined: {', '.join(got)}")
    need = {"read=0", "write=0", "exec=0", "listed", "secret seen"}
    ev.control_ok(need <= set(got), "unconfined, these did not succeed: "
                  + ", ".join(sorted(need - set(got))))
    return _verdict(ev, "read, write, exec, ld.so, symlink, hardlink and listing outside the "
                        "roots all failed; unconfined they work")


_META = """import json, os, sys
res = {}
for path in sys.argv[1:]:
    out = {}
    try:
        st = os.stat(path)
    except OSError as e:
        res[path] = {"stat": e.errno}; continue
    ops = [("chmod", lambda: os.chmod(path, 0o600)),
           ("chown", lambda: os.chown(path, st.st_uid, st.st_gid)),
           ("utime", lambda: os.utime(path, (946684800, 946684800))),
           ("setxattr", lambda: os.setxattr(path, "user.hcp", b"1"))]
    for name, op in ops:
        try:
            op(); out[name] = "ok"
        except OSError as e:
            out[name] = e.errno
    res[path] = out
print(json.dumps(res))
"""


def _meta_state(p: Path) -> tuple:
    st = os.stat(p)
    try:
        x = os.getxattr(p, "user.hcp")
    except OSError:
        x = None
    return (st.st_mode, st.st_uid, st.st_gid, st.st_mtime_ns, st.st_ctime_ns, x)


@check("canary-metadata-outside-jail", "hardening", "chmod, chown, utime and xattrs outside "
       "the writable roots fail",
       requirement="Metadata writes outside the writable roots fail (Landlock does "
                   "not mediate them; the read-only mount view does).",
       enforced_by="mount view (mountns) only: Landlock does not mediate metadata")
def metadata_outside(h: Harness, ev: Evidence) -> str:
    jail, outside, ro = h.mkdir("jail"), h.mkdir("outside"), h.mkdir("ro")
    targets = [h.write(outside / "meta.txt", "x\n"), h.write(ro / "ro.txt", "x\n")]
    controls = [h.write(outside / "meta-ctl.txt", "x\n"), h.write(ro / "ro-ctl.txt", "x\n")]
    for p in targets + controls:
        os.chmod(p, 0o644)
    time.sleep(0.02)
    before = {p: _meta_state(p) for p in targets}
    ev.try_(f"chmod, chown (to the same ids), utime, setxattr on {targets[0]} (outside every "
            f"root) and {targets[1]} (in a --read-only-root)")
    r = h.run([h.python, "-I", "-c", _META, *map(str, targets)], jail=jail,
              read_only_roots=(str(ro),))
    if _ran(ev, "confined", r):
        res = json.loads(_stdout(r))
        for path, ops in res.items():
            done = [k for k, v in ops.items() if v == "ok"]
            ev.require(not done, f"confined: {', '.join(done)} succeeded on {path}")
    for p in targets:
        ev.require(_meta_state(p) == before[p], f"the metadata of {p} changed on the host")
    c = h.unconfined([h.python, "-I", "-c", _META, *map(str, controls)])
    try:
        cres = json.loads(_stdout(c))
    except ValueError:
        cres = {}
    ev.ctl(f"unconfined on identical files: {cres}")
    for path, ops in cres.items():
        for name in ("chmod", "chown", "utime"):
            ev.control_ok(ops.get(name) == "ok", f"unconfined {name} on {path} failed")
        if ops.get("setxattr") != "ok":
            ev.note(f"setxattr unsupported here even unconfined ({ops.get('setxattr')}); "
                    "judged on the other operations")
    ev.control_ok(len(cres) == 2, "the unconfined control did not run")
    return _verdict(ev, "no metadata change outside the writable roots; unconfined they work")


_CONNECT = """import socket, sys
args = sys.argv[1:]
for host, port in zip(args[::2], args[1::2]):
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        s = socket.socket(fam, socket.SOCK_STREAM)
        s.settimeout(3)
        print(host, s.connect_ex((host, int(port))))
    except OSError as e:
        print(host, "socket", e.errno)
"""


@check("canary-host-loopback", "hardening", "A host loopback listener gets no connection",
       requirement="No network: host loopback services, the LAN and the internet are "
                   "unreachable.",
       enforced_by="network namespace, or Landlock TCP rules, or seccomp network-off; any "
                   "one suffices")
def host_loopback(h: Harness, ev: Evidence) -> str:
    jail = h.mkdir("jail")
    listeners = []
    for host in ("127.0.0.1", "::1"):
        try:
            listeners.append(h.listener(host))
        except OSError as e:
            ev.note(f"cannot listen on {host} here ({e}); not tried")
    if not listeners:
        raise NotApplicable("cannot open a loopback listener on this host")
    args = [str(x) for lst in listeners for x in (lst.host, lst.port)]
    ev.try_("connect to " + ", ".join(f"{lst.host} port {lst.port}" for lst in listeners))
    r = h.run([h.python, "-I", "-c", _CONNECT, *args], jail=jail)
    ev.saw(f"confined: {proc_summary(r)}")
    for lst in listeners:
        n = lst.accepted()
        ev.require(n == 0, f"the listener on {lst.host} accepted {n} connection(s) from the "
                           "sandbox")
        ev.saw(f"listener {lst.host}: {n} connection(s)")
    ev.require(" 0\n" not in _stdout(r), "a connect() reported success")
    c = h.unconfined([h.python, "-I", "-c", _CONNECT, *args])
    ev.ctl(f"unconfined: {proc_summary(c)}")
    for lst in listeners:
        n = lst.accepted(wait=2)
        ev.control_ok(n >= 1, f"unconfined, the listener on {lst.host} got no connection")
    return _verdict(ev, f"{len(listeners)} loopback listener(s) got no connection; unconfined "
                        "they do")


_UNSHARE = """import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
NEWUSER, NEWNET, NEWNS, NEWPID, NEWIPC, NEWUTS = (0x10000000, 0x40000000, 0x00020000,
                                                  0x20000000, 0x08000000, 0x04000000)
attempts = [("unshare user", NEWUSER), ("unshare user+net", NEWUSER | NEWNET),
            ("unshare user+mount", NEWUSER | NEWNS), ("unshare user+pid", NEWUSER | NEWPID),
            ("unshare user+ipc+uts", NEWUSER | NEWIPC | NEWUTS)]
for name, flags in attempts:
    pid = os.fork()
    if pid == 0:
        r = libc.unshare(flags)
        os._exit(0 if r == 0 else min(ctypes.get_errno(), 255) or 255)
    _, st = os.waitpid(pid, 0)
    print(name, os.waitstatus_to_exitcode(st))
# clone(CLONE_NEWUSER | SIGCHLD) without libc's wrapper
r = libc.syscall(ctypes.c_long(56), ctypes.c_long(NEWUSER | 17), ctypes.c_long(0),
                 ctypes.c_long(0), ctypes.c_long(0), ctypes.c_long(0))
if r == 0:
    os._exit(0)
if r > 0:
    os.waitpid(r, 0)
    print("clone newuser", 0)
else:
    print("clone newuser", ctypes.get_errno())
"""


@check("canary-nested-namespaces", "hardening", "The command cannot create namespaces",
       requirement="Namespaces (unshare, clone flags) are refused inside the sandbox "
                   "(the default policy's seccomp blocklist, docs/policy.md).",
       enforced_by="seccomp (unshare, clone flags, clone3)")
def nested_namespaces(h: Harness, ev: Evidence) -> str:
    jail = h.mkdir("jail")
    ev.try_("unshare(2) with user, user+net, user+mount, user+pid, user+ipc+uts; raw "
            "clone(CLONE_NEWUSER)")

    def parse(text: str) -> dict[str, int]:
        out = {}
        for line in text.splitlines():
            name, _, code = line.rpartition(" ")
            if name:
                out[name] = int(code)
        return out

    r = h.run([h.python, "-I", "-c", _UNSHARE], jail=jail)
    got = parse(_stdout(r)) if _ran(ev, "confined", r) else {}
    for name, code in got.items():
        ev.require(code != 0, f"confined: {name} succeeded")
    ev.require(len(got) == 6, f"confined: the probe reported {len(got)} of 6 attempts")
    c = h.unconfined([h.python, "-I", "-c", _UNSHARE])
    ctl = parse(_stdout(c))
    ev.ctl(f"unconfined: {ctl}")
    # Each attempt whose control works here is judged; the others say nothing either way.
    ev.control_ok(any(code == 0 for code in ctl.values()),
                  "unconfined, this user cannot create a namespace here by any of these means")
    for name, code in ctl.items():
        if code != 0:
            ev.note(f"unconfined {name} fails here too (errno {code}): not evidence either way")
    return _verdict(ev, "every namespace-creating call failed (" + ", ".join(
        f"{k}: {errno.errorcode.get(v, v)}" for k, v in got.items()) + ")")


_INT80_C = r"""
#include <stdio.h>
#include <unistd.h>
/* One i386 system call from 64-bit code: getpid (i386 number 20) through int $0x80. */
int main(void)
{
	long ret;
	__asm__ volatile("int $0x80" : "=a"(ret) : "a"(20L) : "r8", "r9", "r10", "r11", "memory");
	printf("%ld %ld\n", ret, (long)getpid());
	return ret == (long)getpid() ? 0 : 3;
}
"""

_X32_C = r"""
#include <stdio.h>
/* One x32-ABI system call: getpid (39) with the x32 bit 0x40000000 set. */
int main(void)
{
	long ret;
	__asm__ volatile("syscall" : "=a"(ret) : "a"(39L | 0x40000000L) : "rcx", "r11", "memory");
	printf("%ld\n", ret);
	return 0;
}
"""


def _foreign_abi(h: Harness, ev: Evidence, name: str, source: str, what: str) -> str:
    if platform.machine() != "x86_64":
        raise NotApplicable(f"{what} is an x86_64 matter; this host is {platform.machine()}")
    exe = h.c_program(name, source)
    jail = h.mkdir("jail")
    c = h.unconfined([exe])
    ev.ctl(f"unconfined {name}: {proc_summary(c)}")
    ev.control_ok(c.returncode == 0, f"unconfined, {name} did not complete (IA32 emulation "
                                     "off?)")
    r = h.run([exe], jail=jail)
    ev.try_(f"run {exe} (compiled from the embedded C source) confined")
    ev.saw(f"confined: {proc_summary(r)}")
    if name.startswith("x32") and _stdout(c).strip() == str(-errno.ENOSYS):
        ev.note("this kernel has no x32 ABI (unconfined the call returns -ENOSYS): the filter "
                "must kill the process all the same, since a kernel with x32 would run it")
    killed = r.returncode == -signal.SIGSYS
    ev.require(killed, f"the process was not killed by SIGSYS (rc {r.returncode}): {what} "
                       "reached the kernel")
    return _verdict(ev, f"{what}: the process was killed by SIGSYS; unconfined it completes")


@check("canary-i386-int80", "hardening", "An i386 system call (int 0x80) kills the process",
       requirement="Foreign-arch (i386 int 0x80) calls kill the process.",
       enforced_by="seccomp (arch check, KILL_PROCESS)")
def i386_int80(h: Harness, ev: Evidence) -> str:
    return _foreign_abi(h, ev, "int80_getpid", _INT80_C, "an i386 int 0x80 call")


@check("canary-x32-syscall", "hardening", "An x32-ABI system call kills the process",
       requirement="x32 numbers kill the process.",
       enforced_by="seccomp (x32 bit check, KILL_PROCESS)")
def x32_syscall(h: Harness, ev: Evidence) -> str:
    return _foreign_abi(h, ev, "x32_getpid", _X32_C, "an x32 call")


_IO_URING = """import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
params = ctypes.create_string_buffer(120)
r = libc.syscall(ctypes.c_long(425), ctypes.c_long(4), params)
print(r, 0 if r >= 0 else ctypes.get_errno())
if r >= 0:
    os.close(r)
"""


@check("canary-io-uring", "hardening", "io_uring_setup is refused",
       requirement="io_uring is blocked: its operations bypass seccomp.",
       enforced_by="seccomp")
def io_uring(h: Harness, ev: Evidence) -> str:
    if platform.machine() not in ("x86_64", "aarch64"):
        raise NotApplicable(f"syscall number of io_uring_setup not known for "
                            f"{platform.machine()}")
    nr = 425
    jail = h.mkdir("jail")
    ev.try_(f"io_uring_setup(4, &params) (syscall {nr})")
    r = h.run([h.python, "-I", "-c", _IO_URING], jail=jail)
    if _ran(ev, "confined", r):
        fd, err = (_stdout(r).split() + ["?", "?"])[:2]
        ev.require(fd == "-1", f"confined: io_uring_setup returned fd {fd}")
        ev.saw(f"confined: errno {errno.errorcode.get(int(err), err) if err.isdigit() else err}")
    c = h.unconfined([h.python, "-I", "-c", _IO_URING])
    ev.ctl(f"unconfined: {proc_summary(c)}")
    disabled = Path("/proc/sys/kernel/io_uring_disabled")
    ev.control_ok(_stdout(c).split()[:1] not in ([], ["-1"]),
                  "unconfined io_uring_setup failed too (kernel.io_uring_disabled="
                  f"{disabled.read_text().strip() if disabled.exists() else 'n/a'})")
    return _verdict(ev, "io_uring_setup refused; unconfined it returns a ring fd")


_TIOCSTI = """import ctypes, fcntl, os, termios
res = []
try:
    os.setsid()
except OSError:
    pass
try:
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
except OSError:
    pass
try:
    fcntl.ioctl(0, termios.TIOCSTI, b"X"); res.append("ok")
except OSError as e:
    res.append(str(e.errno))
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
c = ctypes.c_char(b"Y")
# the same request with high bits set: the kernel compares only the low 32 bits
r = libc.syscall(ctypes.c_long(16), ctypes.c_long(0), ctypes.c_long(0x100000000 | termios.TIOCSTI),
                 ctypes.byref(c))
res.append("ok" if r == 0 else str(ctypes.get_errno()))
print(" ".join(res))
"""


@check("canary-tiocsti", "hardening", "TIOCSTI cannot inject input into the terminal",
       requirement="No terminal injection: TIOCSTI/TIOCLINUX refused, low 32 bits "
                   "compared.",
       enforced_by="seccomp (the command can make the terminal its controlling tty again, so "
                   "setsid alone does not stop it)")
def tiocsti(h: Harness, ev: Evidence) -> str:
    import tty
    jail = h.mkdir("jail")
    try:
        master, slave = os.openpty()
    except OSError as e:
        raise NotApplicable(f"no pseudo-terminal here: {e}") from None
    h.fd(master)
    h.fd(slave)
    tty.setraw(slave)
    ev.try_("on a pty given as stdin: setsid, TIOCSCTTY, then TIOCSTI 'X' and the same "
            "request with high bits set")
    r = h.run([h.python, "-I", "-c", _TIOCSTI], jail=jail, stdin=slave)
    time.sleep(0.1)
    injected = drain(slave)
    ev.saw(f"confined: {proc_summary(r)}; bytes injected into the terminal: {injected!r}")
    ev.require(injected == b"", f"characters were injected into the terminal: {injected!r}")
    ev.require("ok" not in _stdout(r).split(), f"confined: TIOCSTI succeeded ({_stdout(r)!r})")
    os.set_blocking(slave, True)
    c = h.unconfined([h.python, "-I", "-c", _TIOCSTI], stdin=slave)
    time.sleep(0.1)
    got = drain(slave)
    legacy = Path("/proc/sys/dev/tty/legacy_tiocsti")
    ev.ctl(f"unconfined: {proc_summary(c)}; injected {got!r}")
    ev.control_ok(b"X" in got, "unconfined TIOCSTI injected nothing (dev.tty.legacy_tiocsti="
                  f"{legacy.read_text().strip() if legacy.exists() else 'n/a'})")
    return _verdict(ev, "TIOCSTI refused (" + _stdout(r).strip() + "), nothing injected; "
                        "unconfined it injects")


@check("canary-proc-environ", "hardening", "The runtime's /proc/<pid>/environ is unreadable",
       requirement="Other processes' environments (the launcher's, the sandbox init's) are "
                   "unreadable.",
       enforced_by="pid namespace (outside pids invisible), or Landlock (ptrace scoping); "
                   "the init is non-dumpable")
def proc_environ(h: Harness, ev: Evidence) -> str:
    secret = _token()
    jail = h.mkdir("jail")
    pidfile = jail / "runtime.pid"
    me = os.getpid()
    with open(f"/proc/{me}/environ", "rb") as f:
        my_digest = hashlib.sha256(f.read()).hexdigest()
    # The runtime here is `hcp-linux run` itself, started with a secret in its environment;
    # the sandboxed command learns the runtime's host pid from a file we write after spawn.
    probe = ("import glob, hashlib, json, os, sys, time\n"
             "deadline = time.monotonic() + 20\n"
             "while not os.path.exists('runtime.pid') and time.monotonic() < deadline:\n"
             "    time.sleep(0.02)\n"
             "time.sleep(0.05)\n"
             "rt = open('runtime.pid').read().strip()\n"
             f"paths = ['/proc/' + rt + '/environ', '/proc/{me}/environ', "
             "'/proc/%d/environ' % os.getppid(), '/proc/1/environ'] + "
             "sorted(glob.glob('/proc/[0-9]*/environ'))\n"
             "out = {}\n"
             "own = '/proc/%d/environ' % os.getpid()\n"
             "for p in dict.fromkeys(paths):\n"
             "    if p == own:\n"
             "        continue  # its own environment is not another process's\n"
             "    try:\n"
             "        data = open(p, 'rb').read()\n"
             "        out[p] = {'sha256': hashlib.sha256(data).hexdigest(), "
             "'text': data.decode(errors='replace')}\n"
             "    except OSError as e:\n"
             "        out[p] = {'errno': e.errno}\n"
             "print(json.dumps({'runtime': rt, 'files': out}))\n")
    argv, env = h.cli_argv(["run", "--jail", jail, "--", h.python, "-I", "-c", probe])
    env["HCP_CONFORMANCE_RUNTIME_SECRET"] = secret
    ev.try_("the runtime (`hcp-linux run`) holds a secret in its environment; the command "
            "reads /proc/<runtime pid>/environ, /proc/<this process>/environ, its parent's, "
            "pid 1's and every /proc/*/environ")
    proc = h.start(argv, env=env, cwd="/", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    pidfile.write_text(str(proc.pid))
    try:
        out, err = proc.communicate(timeout=h.timeout)
    except subprocess.TimeoutExpired:
        h.stop(proc)
        raise
    if proc.returncode == 125 and layer_refusal(err):
        raise NotApplicable(f"the sandbox refuses to run here: {layer_refusal(err)}")
    ev.saw(f"confined: rc={proc.returncode} stderr={shown(err)!r}")
    try:
        res = json.loads(out.decode())
    except ValueError:
        res = None
    if ev.require(proc.returncode == 0 and res is not None,
                  f"the probe did not run: rc={proc.returncode} stdout={shown(out)!r}"):
        files = res["files"]
        readable = [p for p, v in files.items() if "sha256" in v]
        ev.saw(f"readable environ files: {readable}; runtime pid {res['runtime']}")
        leaked = [p for p, v in files.items() if secret in v.get("text", "")]
        ev.require(not leaked, f"the runtime's secret was read from {leaked}")
        rt = files.get(f"/proc/{res['runtime']}/environ", {})
        ev.require("sha256" not in rt or secret not in rt.get("text", ""),
                   f"/proc/{res['runtime']}/environ (the runtime) was readable")
        mine = files.get(f"/proc/{me}/environ", {})
        ev.require(mine.get("sha256") != my_digest,
                   f"/proc/{me}/environ (the conformance process) was readable")
    # Control: an unconfined process reads a same-user process's environ.
    victim = h.start(["sleep", "60"], env=dict(os.environ,
                                               HCP_CONFORMANCE_RUNTIME_SECRET=secret))
    time.sleep(0.05)
    c = h.unconfined(["sh", "-c", f"tr '\\0' '\\n' < /proc/{victim.pid}/environ; "
                                  f"cat /proc/{me}/environ | sha256sum"])
    ev.ctl(f"unconfined read of /proc/{victim.pid}/environ and /proc/{me}/environ: "
           f"secret {'seen' if secret in _stdout(c) else 'not seen'}, "
           f"own environ {'readable' if my_digest in _stdout(c) else 'not readable'}")
    ev.control_ok(secret in _stdout(c) and my_digest in _stdout(c),
                  "unconfined, the environ files were not readable")
    return _verdict(ev, "neither the runtime's nor this process's environ was readable; "
                        "unconfined both are")


@check("canary-signals", "hardening", "Signals cannot reach a process outside the sandbox",
       requirement="No signals, ptrace or abstract sockets outward.",
       enforced_by="pid namespace (outside pids invisible), or Landlock signal scope (ABI 6)")
def signals(h: Harness, ev: Evidence) -> str:
    jail = h.mkdir("jail")
    victim = h.start(["sleep", "60"])
    pid, me = victim.pid, os.getpid()
    time.sleep(0.05)
    script = (f"kill -KILL {pid} 2>/dev/null; echo kill=$?; kill -STOP {pid} 2>/dev/null; "
              f"echo stop=$?; kill -0 {pid} 2>/dev/null; echo probe=$?; kill -0 {me} "
              f"2>/dev/null; echo probe-runtime=$?")
    ev.try_(f"kill -KILL, kill -STOP and kill -0 on an outside `sleep` (pid {pid}); kill -0 "
            f"on this process (pid {me})")
    r = h.run(["sh", "-c", script], jail=jail)
    ev.saw(f"confined: {proc_summary(r)}")
    time.sleep(0.2)
    for word in ("kill=0", "stop=0", "probe=0", "probe-runtime=0"):
        ev.require(word not in _stdout(r).split(), f"confined: {word} (the signal was allowed)")
    alive = pid_alive(pid)
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        state = "?"
    ev.saw(f"victim alive: {alive}, state {state}")
    ev.require(alive and state != "T", "the outside process was killed or stopped")
    c = h.unconfined(["sh", "-c", f"kill -0 {pid} && kill -KILL {pid} && echo killed"])
    try:
        victim.wait(timeout=h.timeout)
    except subprocess.TimeoutExpired:
        pass
    ev.ctl(f"unconfined kill: {proc_summary(c)}; victim alive after: {pid_alive(pid)}")
    ev.control_ok(c.returncode == 0 and not pid_alive(pid), "unconfined, the kill failed")
    return _verdict(ev, "no signal reached the outside process; unconfined it does")


__all__ = ["CHECKS", "Check", "check"]
