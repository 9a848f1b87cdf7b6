"""The fallback ladder (issue 22): rungs, detection of where hcp-linux runs, the remedy for
each place, the shipped seccomp and AppArmor profiles, and each environment simulated for real.

Each environment is a real seccomp filter installed by tests/ladder_launcher.py before
`hcp-linux` starts: Docker's default profile (data: the shipped OCI profile without its
"hcp-linux:" rules, compiled for Docker's default capabilities), the same with the shipped
allowances, AppArmor's userns refusal (EACCES), a kernel without Landlock (ENOSYS), no pid
namespace. Only file markers are faked (a fake root named by HCP_LINUX_MARKER_ROOT: a
.dockerenv, a service-account dir, an osrelease, the AppArmor sysctl); never a kernel answer.
In each: `probe` names the environment, the rung and the remedy; the strict default refuses
with that remedy, running nothing; the rung offered runs and enforces what its receipt says,
with an unconfined control (same filter, no sandbox) showing the denied write succeeds.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import ladder_launcher
from hcp_linux.host import hostenv, remedies
from hcp_linux.policy import ladder
from hcp_linux.errors import PolicyError
from hcp_linux.policy.policy import LAYERS, Policy
from hcp_linux.policy.policy_flags import flags_of
from sandboxing import (EXIT_REFUSED, EXIT_USAGE, IS_ROOT, TIMEOUT, EXECUTOR_ARGS,  # noqa: F401
                        Listener, caller_env, hcp_argv, jail, out, outside, read_receipt, show,
                        single_error_line, snapshot)

ROOT = Path(__file__).resolve().parents[1]
LAUNCHER = str(Path(__file__).with_name("ladder_launcher.py"))
NAMESPACES = ("userns", "mountns", "netns", "ipcns", "pidns")


# --- the ladder itself ------------------------------------------------------------------


def test_rungs_name_real_layers_strongest_first() -> None:
    assert ladder.NAMES[0] == ladder.DEFAULT == "full"
    assert ladder.BY_NAME["full"].loses == frozenset()
    for rung in ladder.RUNGS:
        assert rung.loses <= set(LAYERS), rung
        assert "seccomp" not in rung.loses  # no rung goes without the syscall filter
    assert ladder.BY_NAME["no-namespaces"].loses == set(NAMESPACES)


@pytest.mark.parametrize("gone,name,up", [
    ((), "full", None), (("userns",), "no-userns", "full"), (("pidns",), "no-pidns", "full"),
    (("landlock",), "no-landlock", "full"), (NAMESPACES, "no-namespaces", "no-pidns"),
    (("mountns",), "no-namespaces", "no-pidns"), (("seccomp",), None, "no-namespaces"),
    (("landlock", "pidns"), None, "no-namespaces")])
def test_reached_and_next_up(gone: tuple, name: str | None, up: str | None) -> None:
    rung = ladder.reached(gone)
    assert (rung.name if rung else None) == name
    nxt = ladder.next_up(rung)
    assert (nxt.name if nxt else None) == up


def test_policy_rung_is_an_allow_degraded_set(jail: Path) -> None:
    assert Policy(jail=str(jail)).allow_degraded == frozenset()
    p = Policy(jail=str(jail), rung="no-namespaces", allow_degraded=["landlock"])
    assert p.allow_degraded == set(NAMESPACES) | {"landlock"}
    assert p.rung == "no-namespaces"
    assert p.digest() != Policy(jail=str(jail), allow_degraded=list(p.allow_degraded)).digest()
    again = flags_of(p)
    assert "--rung=no-namespaces" in again
    with pytest.raises(PolicyError, match="rung: expected one of full, no-userns"):
        Policy(jail=str(jail), rung="none")
    with pytest.raises(PolicyError, match="rung"):
        Policy(jail=str(jail), rung=3)


def test_policy_file_rung_key(jail: Path, tmp_path: Path) -> None:
    f = tmp_path / "p.toml"
    f.write_text('rung = "no-userns"\n')
    assert Policy.from_toml(f, jail=str(jail)).allow_degraded == {"userns"}


def test_cli_unknown_rung_is_one_line_and_runs_nothing(jail: Path) -> None:
    before = snapshot(jail)
    p = subprocess.run(hcp_argv(jail, "touch", "ran", extra=["--rung", "nope"]),
                       capture_output=True, timeout=TIMEOUT, cwd="/", env=caller_env())
    assert p.returncode == EXIT_USAGE, show(p)
    assert "--rung" in single_error_line(p)
    assert snapshot(jail) == before


# --- detection: file markers under a fake root -----------------------------------------


def _root(tmp_path: Path, files: dict[str, str]) -> str:
    root = tmp_path / "fakeroot"
    root.mkdir(exist_ok=True)
    for rel, text in files.items():
        path = root / rel.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        if text == "<dir>":
            path.mkdir(exist_ok=True)
        else:
            path.write_text(text)
    return str(root)


@pytest.mark.parametrize("files,environ,kind", [
    ({"/.dockerenv": ""}, {}, "docker"),
    ({"/run/.containerenv": ""}, {}, "podman"),
    ({"/var/run/secrets/kubernetes.io/serviceaccount": "<dir>", "/.dockerenv": ""}, {},
     "kubernetes"),
    ({}, {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, "kubernetes"),
    ({"/proc/1/cgroup": "0::/system.slice/docker-0123abcd.scope\n"}, {}, "docker"),
    ({"/proc/1/cgroup": "0::/kubepods/besteffort/pod1/cri-containerd-ab\n"}, {}, "containerd"),
    ({"/proc/sys/kernel/osrelease": "4.4.0\n"}, {}, "gvisor"),
    ({"/proc/sys/kernel/osrelease": "5.15.153.1-microsoft-standard-WSL2\n"}, {}, "wsl2"),
    ({"/proc/sys/kernel/apparmor_restrict_unprivileged_userns": "1\n"}, {}, "ubuntu-apparmor"),
    ({"/proc/sys/kernel/apparmor_restrict_unprivileged_userns": "0\n"}, {}, None),
])
def test_detect_file_markers(tmp_path: Path, files: dict, environ: dict, kind: str | None
                             ) -> None:
    where = hostenv.detect(_root(tmp_path, files), environ)
    if kind is None:  # nothing marked: the host, or only what this process's kernel says
        assert where.kind in ("host", "seccomp-filtered"), where
    else:
        assert where.kind == kind, where
        assert where.evidence[kind]
    # the kernel facts of this process are the real ones, whatever the root
    status = Path("/proc/self/status").read_text()
    assert where.seccomp_filtered == ("Seccomp:\t2" in status)


def test_marker_root_env_var(tmp_path: Path) -> None:
    root = _root(tmp_path, {"/run/.containerenv": ""})
    assert hostenv.detect(environ={hostenv.MARKER_ROOT_ENV: root}).kind == "podman"


def _where(*kinds: str, **kw: object) -> hostenv.Where:
    return hostenv.Where(tuple(kinds), {k: "test" for k in kinds}, **kw)  # type: ignore[arg-type]


def test_a_zero_max_user_namespaces_is_named_before_the_container(tmp_path: Path) -> None:
    """In a container on a host with user.max_user_namespaces = 0 the seccomp profile would
    not help: the remedy names the sysctl, and who can set it (issue 32)."""
    where = hostenv.detect(_root(tmp_path, {"/.dockerenv": "",
                                            "/proc/sys/user/max_user_namespaces": "0\n"}), {})
    assert where.kind == "docker" and hostenv.NO_USERNS_SYSCTL in where.evidence
    text = remedies.remedy("userns", where)
    assert "user.max_user_namespaces is 0" in text and "whoever runs the host" in text, text
    assert remedies.SECCOMP_PROFILE not in text
    assert "it needs a user namespace" in remedies.remedy("netns", where)
    # control: a non-zero value is no evidence, and (under a seccomp filter, as Docker's
    # default) the container's profile is the remedy
    (tmp_path / "other").mkdir()
    files = {"/.dockerenv": "", "/proc/sys/user/max_user_namespaces": "96362\n"}
    where = hostenv.detect(_root(tmp_path / "other", files), {})
    assert hostenv.NO_USERNS_SYSCTL not in where.evidence
    where = dataclasses.replace(where, seccomp_filtered=True)
    assert remedies.SECCOMP_PROFILE in remedies.remedy("userns", where)


def test_remedies_by_environment() -> None:
    for layer in NAMESPACES:
        for kinds in (("docker",), ("podman",), ("kubernetes", "containerd"), ("containerd",)):
            text = remedies.remedy(layer, _where(*kinds, seccomp_filtered=True))
            assert "sysctl" not in text, (kinds, text)  # no host advice inside a container
            assert remedies.SECCOMP_PROFILE in text
    filtered = {"seccomp_filtered": True}
    docker = remedies.remedy("userns", _where("docker", **filtered))
    assert "docker run --security-opt seccomp=hcp-linux.json --security-opt " \
        "systempaths=unconfined --user 1000" in docker
    assert "hcp-linux profile seccomp > hcp-linux.json" in docker  # how to get it out
    assert "podman run --security-opt seccomp=" in remedies.remedy("netns",
                                                                   _where("podman", **filtered))
    # issue 31: computed from what was observed. No seccomp filter: not the profile's fault.
    unconfined = remedies.remedy("userns", _where("docker"), reason="unshare-user: x")
    assert "not the runtime's seccomp profile" in unconfined and "seccomp=" not in unconfined
    # the masked /proc refused the fresh procfs: unmask it, as non-root, per runtime
    for kinds, flag in ((("docker",), "systempaths=unconfined"), (("podman",), "unmask=/proc/*"),
                        (("kubernetes", "containerd"), "procMount: Unmasked")):
        text = remedies.remedy("pidns", _where(*kinds, **filtered),
                               reason="proc: Operation not permitted")
        assert flag in text and "core_pattern" in text and "seccomp=" not in text, text
        assert "--rung no-pidns" in text
    # the other namespaces follow from a refused user namespace without CAP_SYS_ADMIN
    follows = remedies.remedy("mountns", _where("docker", **filtered),
                              reason="unshare-mount: x", userns_reason="unshare-user: y")
    assert follows.startswith("it needs the user namespace (refused: unshare-user: y")
    k8s = remedies.remedy("userns", _where("kubernetes", **filtered))
    assert "type: Localhost" in k8s and "privileged" in k8s
    assert "--rung no-userns" in remedies.remedy("userns", _where("docker", cap_sys_admin=True))
    ubuntu = remedies.remedy("userns", _where("ubuntu-apparmor"), "/opt/x/native/_build")
    assert "sudo install -m644" in ubuntu and "apparmor_parser -r /etc/apparmor.d/hcp-exec" \
        in ubuntu and "sysctl" not in ubuntu
    assert "apparmor_parser" in remedies.remedy("mountns", _where("ubuntu-apparmor"), "/d")
    assert "hcp-linux probe` prints" in remedies.remedy("userns", _where("ubuntu-apparmor"))
    assert "--rung no-landlock" in remedies.remedy("landlock", _where("gvisor"))
    wsl = remedies.remedy("landlock", _where("wsl2", kernel="5.15.1-microsoft-standard-WSL2"))
    assert ".wslconfig" in wsl and "wsl --update" in wsl
    assert "sysctl" in remedies.remedy("userns", _where("host"))  # a bare host: its switch


# --- the shipped files ------------------------------------------------------------------


def test_profile_command_prints_the_shipped_files() -> None:
    """`hcp-linux profile seccomp|apparmor` (issue 31): how a profile gets out of an image
    onto the host whose runtime needs it, byte for byte (AppArmor: its build dir filled)."""
    def out(kind: str) -> str:
        p = subprocess.run([sys.executable, "-m", "hcp_linux", "profile", kind],
                           capture_output=True, text=True, timeout=TIMEOUT)
        assert p.returncode == 0, p
        return p.stdout
    assert out("seccomp") == Path(remedies.SECCOMP_PROFILE).read_text()
    json.loads(out("seccomp"))
    from hcp_linux.native import BUILD_DIR
    apparmor = out("apparmor")
    assert f"profile hcp-exec {BUILD_DIR}/hcp-exec-*" in apparmor, apparmor
    assert "HCP_EXEC_DIR" not in apparmor


def test_shipped_files_are_package_data() -> None:
    for path in (remedies.SECCOMP_PROFILE, remedies.APPARMOR_PROFILE):
        assert os.path.isfile(path), path
    pyproject = ROOT / "pyproject.toml"
    if not pyproject.is_file():
        pytest.skip("installed package: the wheel leg checks its files by the paths above")
    data = tomllib.loads(pyproject.read_text())["tool"]["setuptools"]["package-data"]
    globs = data["hcp_linux"]
    assert "share/seccomp/*.json" in globs and "share/apparmor/*" in globs, globs


def test_apparmor_profile_and_install_command(tmp_path: Path) -> None:
    text = Path(remedies.APPARMOR_PROFILE).read_text()
    assert "abi <abi/4.0>," in text
    assert re.search(r"^\s*userns,\s*$", text, re.M)
    assert "profile hcp-exec HCP_EXEC_DIR/hcp-exec-* flags=(unconfined)" in text
    from hcp_linux.native import BUILD_DIR
    cmd = remedies.apparmor_install_command(BUILD_DIR)
    sed = cmd.split(" | ")[0]  # the substitution, run for real (not the sudo part)
    made = subprocess.run(sed, shell=True, capture_output=True, timeout=TIMEOUT, check=True)
    assert f"profile hcp-exec {BUILD_DIR}/hcp-exec-* " in made.stdout.decode()
    parser = shutil.which("apparmor_parser")
    if parser and not Path("/etc/apparmor.d/abi/4.0").exists():
        pytest.skip(f"{parser} has no abi/4.0 (AppArmor 3, e.g. Debian 12's 3.0.8): the "
                    f"profile is written for AppArmor 4 (Ubuntu 23.10+), the hosts whose "
                    f"userns restriction it lifts; AppArmor 3 has neither the restriction "
                    f"nor the `userns,` rule")
    if parser:  # syntax only: -Q skips loading into the kernel
        f = tmp_path / "hcp-exec"
        f.write_bytes(made.stdout)
        p = subprocess.run([parser, "-Q", "-K", str(f)], capture_output=True, timeout=TIMEOUT)
        assert p.returncode == 0, show(p)


#: Calls the executors make or could be told to, looked for in their sources.
CANDIDATES = ("unshare", "mount", "umount2", "umount", "pivot_root", "open_tree", "move_mount",
              "mount_setattr", "fsopen", "fsconfig", "fsmount", "fspick", "setns", "sethostname",
              "setdomainname", "chroot", "clone3", "keyctl", "bpf", "ptrace", "syslog",
              "landlock_create_ruleset", "landlock_add_rule", "landlock_restrict_self",
              "seccomp", "prctl", "capset", "close_range", "pidfd_open", "personality")


def test_shipped_seccomp_profile_adds_exactly_what_the_executors_call() -> None:
    """Derived from the sources: the calls hcp_exec.c, child.py and _libc.py make that
    Docker's default profile refuses a container without CAP_SYS_ADMIN are exactly the
    names of the profile's "hcp-linux:" rules."""
    profile = json.loads(Path(remedies.SECCOMP_PROFILE).read_text())
    src = ""
    for rel in ("hcp_linux/native/hcp_exec.c", "hcp_linux/ctypes_executor/child.py", "hcp_linux/_libc.py"):
        path = ROOT / rel
        if not path.is_file():
            pytest.skip("needs the source tree")
        src += path.read_text()
    used = {n for n in CANDIDATES if re.search(rf"(\bSYS_{n}\b|\b{n}\s*\()", src)}
    docker_allowed = set()
    for rule in profile["syscalls"]:
        if rule.get("comment", "").startswith("hcp-linux:") or rule.get("args"):
            continue  # conditional on arguments (clone, socket...): not a plain allowance
        if rule["action"] == "SCMP_ACT_ALLOW" and ladder_launcher._applies(
                rule, ladder_launcher.DOCKER_CAPS):
            docker_allowed.update(rule["names"])
    added = {n for rule in profile["syscalls"]
             if rule.get("comment", "").startswith("hcp-linux:") for n in rule["names"]}
    assert used - docker_allowed == added, (sorted(used - docker_allowed), sorted(added))
    assert {"landlock_create_ruleset", "seccomp", "prctl"} <= used & docker_allowed


# --- each environment, simulated for real --------------------------------------------------

#: name -> (launcher filter, marker files, environment, expected kind, remedy text)
ENVS = {
    "docker": ("docker", {"/.dockerenv": ""}, {}, "docker", "--security-opt seccomp="),
    "kubernetes": ("docker", {"/var/run/secrets/kubernetes.io/serviceaccount": "<dir>"},
                   {"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, "kubernetes", "type: Localhost"),
    "ubuntu": ("userns-denied",
               {"/proc/sys/kernel/apparmor_restrict_unprivileged_userns": "1\n"}, {},
               "ubuntu-apparmor", "apparmor_parser -r"),
    "gvisor": ("no-landlock", {"/proc/sys/kernel/osrelease": "4.4.0\n"}, {}, "gvisor",
               "gVisor implements no Landlock"),
    "wsl2": ("no-landlock",
             {"/proc/sys/kernel/osrelease": "5.15.153.1-microsoft-standard-WSL2\n"}, {},
             "wsl2", ".wslconfig"),
    "no-pidns": ("no-pidns", {}, {}, "seccomp-filtered", "must allow the user namespace"),
}


def _rung_here(name: str) -> tuple[str, set[str]]:
    """The rung each simulated environment offers, and the layers it misses, for this euid."""
    if name in ("docker", "kubernetes"):
        return "no-namespaces", set(NAMESPACES)
    if name == "ubuntu":  # root makes the other namespaces without a user namespace
        return ("no-userns", {"userns"}) if IS_ROOT else ("no-namespaces", set(NAMESPACES))
    if name in ("gvisor", "wsl2"):
        return "no-landlock", {"landlock"}
    return "no-pidns", {"pidns"}


def _env(tmp_path: Path, name: str) -> tuple[str, dict[str, str]]:
    filt, files, extra, _, _ = ENVS[name]
    env = caller_env({hostenv.MARKER_ROOT_ENV: _root(tmp_path, files), **extra})
    env.pop("KUBERNETES_SERVICE_HOST", None) if not extra else None
    return filt, env


def _under(filt: str, argv: list, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, LAUNCHER, filt, "--", *argv], capture_output=True,
                          timeout=TIMEOUT, stdin=subprocess.DEVNULL, env=env, cwd="/")


def _probe(filt: str, env: dict[str, str]) -> dict:
    p = _under(filt, [sys.executable, "-m", "hcp_linux", "probe", "--json", *EXECUTOR_ARGS],
               env)
    assert p.returncode in (0, 1), show(p)
    return json.loads(p.stdout)


def _write_cmd(jail: Path, outside: Path, name: str) -> list[str]:
    return ["sh", "-c", f"echo in > {jail}/inside.txt; echo out > {outside}/{name}; "
                        f"echo w=$?"]


@pytest.mark.parametrize("name", list(ENVS))
def test_probe_names_environment_rung_and_remedy(tmp_path: Path, name: str) -> None:
    filt, env = _env(tmp_path, name)
    report = _probe(filt, env)
    kind, remedy_text = ENVS[name][3], ENVS[name][4]
    rung, missing = _rung_here(name)
    assert report["where"]["kind"] == kind, report["where"]
    assert report["rung"]["name"] == rung, report["rung"]
    assert set(report["rung"]["missing"]) == missing
    assert report["rung"]["opt_in"].startswith(f"--rung {rung}")
    for layer, v in report["layers"].items():
        assert v["available"] == (layer not in missing), (layer, v)
    gone = [report["layers"][m]["remedy"] for m in missing]
    assert any(remedy_text in text for text in gone), gone
    if kind in hostenv.CONTAINERS:
        assert not any("sysctl" in text for text in gone), gone
    assert report["rung"]["next_up"]["change"], report["rung"]
    if EXECUTOR_ARGS:
        assert report["executor"]["name"] == EXECUTOR_ARGS[1]


@pytest.mark.parametrize("name", list(ENVS))
def test_strict_default_refuses_with_the_remedy(tmp_path: Path, jail: Path, outside: Path,
                                                name: str) -> None:
    filt, env = _env(tmp_path, name)
    before = snapshot(jail)
    p = _under(filt, hcp_argv(jail, *_write_cmd(jail, outside, "new.txt")), env)
    assert p.returncode == EXIT_REFUSED, show(p)
    line = single_error_line(p)
    assert ENVS[name][4] in line, line
    if ENVS[name][3] in hostenv.CONTAINERS:
        assert "sysctl" not in line, line
    assert p.stdout == b"" and snapshot(jail) == before
    assert not (outside / "new.txt").exists()


@pytest.mark.parametrize("name", list(ENVS))
def test_offered_rung_enforces_what_the_receipt_says(tmp_path: Path, jail: Path,
                                                     outside: Path, name: str) -> None:
    filt, env = _env(tmp_path, name)
    rung, missing = _rung_here(name)
    receipt = tmp_path / "receipt.json"
    p = _under(filt, hcp_argv(jail, *_write_cmd(jail, outside, "new.txt"),
                              extra=["--rung", rung, "--receipt", str(receipt)]), env)
    assert p.returncode == 0, show(p)
    r = read_receipt(receipt)
    assert r["rung"]["name"] == rung and r["rung"]["allowed"] == rung, r["rung"]
    assert set(r["rung"]["degraded"]) == missing
    for layer in LAYERS:
        want = "degraded" if layer in missing else "enforced"
        assert r["layers"][layer]["status"] == want, (layer, r["layers"][layer])
    assert r["layers"]["nnp"]["status"] == "enforced"
    # the write inside the jail happened; the one outside did not (Landlock without a
    # mount view; the mount view without Landlock)
    assert (jail / "inside.txt").read_text() == "in\n"
    assert "w=0" not in out(p), show(p)
    assert not (outside / "new.txt").exists()
    # control: the same write under the same filter, without the sandbox, succeeds
    ctl = _under(filt, _write_cmd(jail, outside, "control.txt"), env)
    assert ctl.returncode == 0 and "w=0" in out(ctl), show(ctl)
    assert (outside / "control.txt").read_text() == "out\n"


@pytest.mark.parametrize("name", ["docker", "ubuntu"])
def test_no_namespaces_rung_refuses_tcp_to_the_host(tmp_path: Path, jail: Path,
                                                    name: str) -> None:
    """Without a network namespace the host's loopback is reachable by address: the rung
    refuses TCP (seccomp network-off, Landlock net rules); control: the same connect under
    the same filter, unconfined, is accepted."""
    rung, missing = _rung_here(name)
    if "netns" not in missing:
        pytest.skip("root on this simulated host keeps its network namespace")
    filt, env = _env(tmp_path, name)
    code = ("import socket,sys\ntry:\n socket.create_connection(('127.0.0.1', int(sys.argv[1])),"
            " 5).close(); print('connected')\nexcept OSError as e: print('refused', e.errno)")
    lst = Listener()
    try:
        port = str(lst.port)
        p = _under(filt, hcp_argv(jail, sys.executable, "-c", code, port,
                                  extra=["--rung", rung]), env)
        assert p.returncode == 0 and "refused" in out(p), show(p)
        assert lst.accepted() == 0
        ctl = _under(filt, [sys.executable, "-c", code, port], env)
        assert "connected" in out(ctl), show(ctl)
        assert lst.accepted() == 1
    finally:
        lst.close()


def test_goal_shipped_profile_gives_full_confinement(tmp_path: Path, jail: Path,
                                                     outside: Path) -> None:
    """The goal of issue 22: the Docker-like filter WITH the shipped profile's allowances:
    the strict default runs, every layer enforced; and the same filter without them refuses
    (the control that the allowances are what makes the difference)."""
    env = caller_env({hostenv.MARKER_ROOT_ENV: _root(tmp_path, {"/.dockerenv": ""})})
    report = _probe("docker-hcp", env)
    assert report["fully_enforceable"] and report["rung"]["name"] == "full", report
    receipt = tmp_path / "receipt.json"
    p = _under("docker-hcp", hcp_argv(jail, *_write_cmd(jail, outside, "new.txt"),
                                      extra=["--receipt", str(receipt)]), env)
    assert p.returncode == 0, show(p)
    r = read_receipt(receipt)
    for layer in LAYERS + ("nnp", "capabilities"):
        assert r["layers"][layer]["status"] == "enforced", (layer, r["layers"][layer])
    assert r["rung"]["name"] == "full" and r["namespaces"] == list(NAMESPACES)
    assert (jail / "inside.txt").exists() and not (outside / "new.txt").exists()
    assert "w=0" not in out(p)
    without = _under("docker", hcp_argv(jail, "true"), env)
    assert without.returncode == EXIT_REFUSED, show(without)


def test_conformance_judges_the_rung_under_docker(tmp_path: Path) -> None:
    """`conformance` under the Docker-like filter with rung no-namespaces: it names the rung
    reached; what the rung keeps passes (file access and host loopback, by Landlock and
    seccomp), and what it says it loses (metadata writes outside the roots, which only the
    mount view stops) fails: the report and the rung's words agree."""
    filt, env = _env(tmp_path, "docker")
    code = ("import json\nfrom hcp_linux.conformance import run_conformance\n"
            "r = run_conformance(only=['canary-fs-outside-jail', 'canary-host-loopback',"
            " 'canary-metadata-outside-jail'], rung='no-namespaces')\n"
            "print(json.dumps({'rung': r.config['rung'],"
            " 'results': {x.id: x.status for x in r.results}}))")
    p = _under(filt, [sys.executable, "-c", code], env)
    assert p.returncode == 0, show(p)
    report = json.loads(p.stdout.splitlines()[-1])
    assert report["rung"]["reached"] == "no-namespaces", report
    assert report["rung"]["allowed"] == "no-namespaces"
    assert "metadata writes outside the roots are not prevented" in report["rung"]["loses"]
    assert report["results"] == {"canary-fs-outside-jail": "pass",
                                 "canary-host-loopback": "pass",
                                 "canary-metadata-outside-jail": "fail"}, report
