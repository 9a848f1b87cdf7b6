"""Real containers (issue 31): hcp-linux, installed from its wheel in a Debian 12 image, in
Docker, rootful Podman and rootless Podman, each with its defaults and with the recipe
docs/deploying.md gives. In each: what `probe` says (rung, remedy), the strict run, the run
at the rung probe names, and attacks at that rung on what lies outside the sandbox; then the
wheel's native `hcp-linux` against a server in the container (issue 35)
(tests/containers/inside.py runs them in the container and reports; this module judges).

Driven by scripts/test-containers, which builds the image, starts the engines and sets the
HCP_CT_* variables; without HCP_TEST_CONTAINERS=1 the module is skipped (the normal suite
runs no container). Every container runs with --network none: the only listener the attacks
try is on the container's own loopback.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest

if os.environ.get("HCP_TEST_CONTAINERS") != "1":
    pytest.skip("the real-container leg: run scripts/test-containers (sets "
                "HCP_TEST_CONTAINERS=1 and the engines up)", allow_module_level=True)

IMAGE = os.environ["HCP_CT_IMAGE"]
PROFILE = os.environ["HCP_CT_PROFILE"]
INSIDE = os.environ["HCP_CT_INSIDE"]
SECCOMP = ["--security-opt", f"seccomp={PROFILE}"]
SYSTEMPATHS = ["--security-opt", "systempaths=unconfined"]
UNMASK = ["--security-opt", "unmask=/proc/*"]
USER = ["--user", "1000"]


def _engine(name: str) -> list[str]:
    """The engine's `run` command, with this host's adaptations (scripts/test-containers)."""
    if name == "docker":
        return [*shlex.split(os.environ["HCP_CT_DOCKER"]), "run"]
    if name == "ctr":
        return [*shlex.split(os.environ["HCP_CT_CTR"]), "run"]
    opts = shlex.split(os.environ.get("HCP_CT_PODMAN_OPTS", ""))
    if name == "podman":
        return ["podman", "run", *opts]
    run = os.environ["HCP_CT_ROOTLESS_RUN"]
    user = os.environ["HCP_CT_ROOTLESS_USER"]
    home = os.path.expanduser(f"~{user}")
    return ["runuser", "-u", user, "--", "env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin",
            f"HOME={home}", f"XDG_RUNTIME_DIR={run}", "podman", "run", *opts]


@dataclass(frozen=True)
class Env:
    engine: str  # docker, podman (rootful), rootless (podman as an unprivileged user), ctr
    opts: tuple[str, ...]
    rung: str  # the rung probe must name
    fixed_by: str | None = None  # the environment that applies this one's remedy
    remedy_has: tuple[str, ...] = ()  # what the strict refusal's remedy must say


ENVS = {
    "docker-root": Env("docker", (), "no-namespaces", "docker-recipe",
                       ("hcp-linux profile seccomp", "--security-opt seccomp=hcp-linux.json",
                        "systempaths=unconfined", "--user 1000")),
    "docker-user": Env("docker", (*USER,), "no-namespaces", "docker-recipe",
                       ("hcp-linux profile seccomp", "systempaths=unconfined")),
    # the recipe before issue 31: the profile alone (the masked /proc refuses the procfs)
    "docker-profile-root": Env("docker", (*SECCOMP,), "no-pidns", "docker-recipe",
                               ("systempaths=unconfined", "--user 1000", "core_pattern")),
    # root without CAP_SETFCAP cannot map uid 0 (Linux >= 5.12)
    "docker-capdrop-root": Env("docker", ("--cap-drop", "ALL", *SECCOMP, *SYSTEMPATHS),
                               "no-namespaces", "docker-recipe", ("--user 1000", "SETFCAP")),
    "docker-recipe": Env("docker", (*USER, "--cap-drop", "ALL", *SECCOMP, *SYSTEMPATHS), "full"),
    "podman-root": Env("podman", (), "no-pidns", "podman-recipe",
                       ("unmask=/proc/*", "--user 1000", "core_pattern")),
    "podman-recipe": Env("podman", (*USER, *UNMASK), "full"),
    # why the recipe says non-root: shown by podman-root-unmasked's core_pattern check
    "podman-root-unmasked": Env("podman", (*UNMASK,), "full"),
    "rootless-podman": Env("rootless", (), "no-pidns", "rootless-podman-recipe",
                           ("unmask=/proc/*",)),
    "rootless-podman-recipe": Env("rootless", (*UNMASK,), "full"),
    # containerd as a stand-in for a Kubernetes pod (root: ctr has no --user): no seccomp
    # filter, RuntimeDefault (--seccomp), a Localhost profile (--seccomp-profile); /proc is
    # masked in each and ctr cannot unmask it (procMount: Unmasked is the pod's remedy).
    # Not detected as a container (no marker): the host's remedies, which must still be true
    "ctr-unconfined": Env("ctr", (), "no-pidns", None, ("--rung no-pidns", "/proc")),
    "ctr-runtime-default": Env("ctr", ("--seccomp",), "no-namespaces", None,
                               ("a seccomp filter on this process",)),
    "ctr-localhost-profile": Env("ctr", ("--seccomp", "--seccomp-profile", PROFILE),
                                 "no-pidns", None, ("--rung no-pidns", "/proc")),
}

#: What an attack wins at a rung, by whether the container's user is the host's root
#: (rootful, uid 0): the losses docs/deploying.md's rung table lists. Every other attack
#: must be held; each of these must still win (so the table stays true).
LOSSES: dict[tuple[str, bool], frozenset[str]] = {
    # no mount view, no user namespace: the host's root is root to file permissions; and
    # RLIMIT_NPROC never binds the host's uid 0: only a pid namespace's pid_max does
    ("no-namespaces", True): frozenset({"read_shadow", "nproc"}),
    ("no-pidns", True): frozenset({"nproc"}),
}


def _run(name: str) -> dict[str, Any]:
    env = ENVS[name]
    if env.engine == "ctr":  # the unpacked image as its rootfs, /tmp a tmpfs of its own
        argv = [*_engine("ctr"), "--rm", "--mount",
                "type=tmpfs,src=tmpfs,dst=/tmp,options=nosuid:nodev", "--mount",
                f"type=bind,src={INSIDE},dst=/inside.py,options=rbind:ro", *env.opts,
                "--rootfs", os.environ["HCP_CT_ROOTFS"], f"hcp-ct-{name}",
                "/opt/hcp/bin/python", "/inside.py"]
    else:
        argv = [*_engine(env.engine), "--rm", "--network", "none", "--label", "hcp-ct=1",
                "-v", f"{INSIDE}:/inside.py:ro", *env.opts, IMAGE if env.engine == "docker"
                else f"localhost/{IMAGE}", "/opt/hcp/bin/python", "/inside.py"]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd="/")
    try:
        return json.loads(p.stdout)
    except ValueError:
        return {"error": f"rc {p.returncode}: {p.stdout[-2000:]} {p.stderr[-2000:]}",
                "argv": argv}


@pytest.fixture(scope="module")
def results() -> dict[str, dict[str, Any]]:
    """Every environment's report, the containers run three at a time."""
    with ThreadPoolExecutor(3) as pool:
        return dict(zip(ENVS, pool.map(_run, ENVS)))


def _result(results: dict[str, dict[str, Any]], name: str) -> dict[str, Any]:
    r = results[name]
    assert "error" not in r, r
    assert r.get("probe") is not None, r.get("probe_output")
    return r


@pytest.mark.parametrize("name", list(ENVS))
def test_probe_names_the_rung(results: dict[str, dict[str, Any]], name: str) -> None:
    r = _result(results, name)
    probe = r["probe"]
    assert probe["error"] is None, probe["error"]
    assert r["rung"] == ENVS[name].rung, (probe["rung"], probe["layers"])
    assert r["probe_rc"] == (0 if r["rung"] == "full" else 1)
    assert probe["executor"]["name"] == "native", probe["executor"]
    text = r["probe_text"]
    assert "unless the missing layers are allowed to degrade" not in text
    for v in probe["layers"].values():  # never a kernel to boot: this one has them all
        assert not v["remedy"] or "boot a kernel" not in v["remedy"], v
        assert not v["remedy"] or "CONFIG_SECCOMP_FILTER" not in v["remedy"], v
    print(f"{name}: rung {r['rung']}, uid {r['uid']}")


@pytest.mark.parametrize("name", list(ENVS))
def test_strict_run_or_its_remedy(results: dict[str, dict[str, Any]], name: str) -> None:
    r, env = _result(results, name), ENVS[name]
    strict = r["strict"]
    if env.rung == "full":
        assert strict["rc"] == 0, strict
        return
    assert strict["rc"] == 125, strict
    for text in env.remedy_has:
        assert text in strict["stderr"], (text, strict["stderr"])
    if env.fixed_by is None:  # ctr: no option unmasks /proc; the rung probe names runs
        return
    # the remedy printed is applied by the environment that fixes this one, and it works
    fixed = _result(results, env.fixed_by)
    assert fixed["rung"] == "full" and fixed["strict"]["rc"] == 0, fixed["probe"]["rung"]
    print(f"{name}: refused, {strict['stderr'].strip()[:400]}...; applied in {env.fixed_by}")


@pytest.mark.parametrize("name", list(ENVS))
def test_the_rung_probe_names_runs(results: dict[str, dict[str, Any]], name: str) -> None:
    r = _result(results, name)
    assert r["rung_run"]["rc"] == 0, r["rung_run"]
    pidns = "pidns" not in r["probe"]["rung"]["missing"]
    # no-pidns really has no pid namespace and the outer /proc: the sibling is visible there
    assert r["rung_run_new_pidns"] == pidns, r["rung_run"]
    assert r["rung_run_sees_sibling"] == (not pidns), r["rung_run"]


@pytest.mark.parametrize("name", list(ENVS))
def test_attacks_at_the_rung(results: dict[str, dict[str, Any]], name: str) -> None:
    r = _result(results, name)
    lost = LOSSES.get((r["rung"], r["host_root"]), frozenset())
    won = {a for a, v in r["attacks"].items() if v["escaped"]}
    assert won == lost, {a: r["attacks"][a] for a in won ^ lost}
    print(f"{name} at {r['rung']} (uid {r['uid']}): {len(r['attacks']) - len(won)} held"
          + (f", lost as documented: {sorted(won)}" if won else ""))


@pytest.mark.parametrize("name", [n for n, e in ENVS.items() if e.rung == "full"])
def test_conformance_at_full(results: dict[str, dict[str, Any]], name: str) -> None:
    """Where the recipe reaches the full rung, every HCP §10 conformance check passes in
    the container (each check tries its rule by doing it)."""
    conf = _result(results, name)["conformance"]
    assert conf.get("conformant") is True, conf
    print(f"{name}: conformance {conf['summary']}")


@pytest.mark.parametrize("name", list(ENVS))
def test_the_native_client_served_in_the_container(results: dict[str, dict[str, Any]],
                                                   name: str) -> None:
    """The wheel's `hcp-linux` (the native program) against an `hcp-linux serve` in the
    same container, then `HCP_LINUX_SERVER=auto`: at the full rung a run starts no Python
    (its fallback is never run) and is confined as an in-process run is (a pid namespace of
    its own, the attacks held, each of which works outside the sandbox); at a rung the server does not serve, the program falls back
    to the Python command, which holds them too."""
    r = _result(results, name)
    s = r["served"]
    assert s["native"], "the wheel's hcp-linux is not the native program"
    assert s["listening"].startswith("hcp-linux serve: listening on"), s
    assert "a request failed" not in s["server_said"], s["server_said"]
    python = r["rung"] != "full"  # only the full rung has every layer a server serves
    view = s["view"]
    assert view["rc"] == 0 and view["python"] == python, view
    pidns = "pidns" not in r["probe"]["rung"]["missing"]
    assert ("SEES-SIBLING" in view["stdout"]) == (not pidns), view
    assert s["controls"] == dict.fromkeys(s["attacks"], True), s["controls"]  # unconfined
    for attack, v in s["attacks"].items():  # the same attacks, held in-process (above)
        assert not v["escaped"] and v["python"] == python, (attack, v)
        assert not r["attacks"][attack]["escaped"], r["attacks"][attack]
    auto = s["auto"]
    assert auto["rcs"] == [0] and auto["last"]["python"] == python, auto
    print(f"{name} at {r['rung']}: served runs {'by Python' if python else 'native'}, "
          f"{len(s['attacks'])} attacks held; auto: {auto['runs']} run(s)")


def test_unmasked_proc_lets_container_root_write_core_pattern(
        results: dict[str, dict[str, Any]]) -> None:
    """Why the recipes say non-root: with /proc unmasked, the container's root (outside
    any sandbox) may open the host's /proc/sys/kernel/core_pattern for writing (opened,
    never written); the non-root recipes may not, nor may rootless Podman's root."""
    assert _result(results, "podman-root-unmasked")["core_pattern_writable_by_container"]
    for name in ("docker-recipe", "podman-recipe", "rootless-podman-recipe"):
        assert not _result(results, name)["core_pattern_writable_by_container"], name
