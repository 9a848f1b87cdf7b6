"""§10.2 Sandbox requirements: the allow-list, the jail as cwd, no ambient credentials, the
sandbox marker, environment flags that change nothing.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
from pathlib import Path

from ...errors import NotAllowlistedError, PolicyError
from ..harness import Evidence, Harness, proc_summary
from .base import _env_lines, _exact_refusal, _ran, _stderr, _stdout, _token, _verdict, check


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
    if h.read_only_jail:
        # the command cannot plant it in a read-only jail: the harness does, from outside;
        # the rule judged is the same (a file named like a listed bin does not run)
        ev.try_(f"allow_bins = (cp, printf); the jail is read-only: {shell} copied into it "
                "as printf from outside; run ./printf -c ...")
        shutil.copy(shell, jail / "printf")
    else:
        ev.try_(f"allow_bins = (cp, printf); cp {shell} printf in the jail; run ./printf "
                "-c ...")
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
    # §10's workspace is writable; a read-only jail (preset read-only) promises the opposite,
    # and that promise is what is judged then: the write in the jail is refused
    writable = not h.read_only_jail
    ev.try_(f"sh -c {script!r} with jail {jail} (API, then CLI)"
            + ("" if writable else "; the jail is read-only: the write in it must be refused"))
    for what, r in (("API", lambda: h.run(["sh", "-c", script], jail=jail)),
                    ("CLI", lambda: h.cli(["run", "--jail", jail, "--", "sh", "-c", script],
                                          expect_run=True))):
        res = r()
        if _ran(ev, what, res):
            lines = _stdout(res).splitlines()
            ev.require(lines[:1] == [real], f"{what}: cwd was {lines[:1]}, expected {real}")
            if writable:
                ev.require((jail / "inside.txt").exists(), f"{what}: a write in the jail did "
                                                           "not land in the jail")
            else:
                ev.require(not (jail / "inside.txt").exists(),
                           f"{what}: a write in the read-only jail landed in the jail")
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
    if not writable:
        ev.control_ok((ctl_dir / "inside.txt").exists(),
                      "unconfined, the write in the directory failed too")
        return _verdict(ev, "cwd is the jail (API, CLI, driver); the read-only jail refuses "
                            "writes, and writes beside it never reach the host")
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
    script = ('echo "$HCP_SANDBOX"; echo real > {ran}; env | grep -c -E '
              '"^(HCP_MOCK|MOCK|HCP_DRIVER|HCP_NATIVE|HCP_NO_SANDBOX|HCP_LINUX|HCP_ALLOW)" || true')
    # the proof that it ran: in the jail, or (read-only jail) in the check's outbox
    box, box_flags = h.outbox(jail)
    ran = box / "ran.txt"
    runs = {}
    for what, env in (("clean env", clean), ("mock env", mocked)):
        receipt = h.dir / f"receipt-{what.split()[0]}.json"
        ran.unlink(missing_ok=True)
        c = h.cli(["run", "--jail", jail, *box_flags, "--receipt", receipt, "--", "sh", "-c",
                   script.format(ran="ran.txt" if box == jail else ran)],
                  env=env, expect_run=True)
        if _ran(ev, what, c):
            ev.require(_stdout(c) == "sandbox\n0\n",
                       f"{what}: child printed {_stdout(c)!r}, expected marker sandbox and no "
                       "mock variable")
            ev.require(ran.exists(), f"{what}: the command did not really run")
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
        d = h.drive(h.driver(), manifest, ["sh", "-c", script.format(ran="ran.txt")])
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
