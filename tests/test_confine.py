"""confine(argv, policy): the CLI argv that runs argv under exactly that policy.

For every field of Policy (read from ``dataclasses.fields``, so a field added later fails
here until confine handles it), policies with that field set to values other than its
default are turned into an argv, the argv is parsed back by the CLI's own parser and
``policy_from_args``, and the policy that comes out is compared with the one that went in,
field by field. A policy the CLI cannot express is refused, naming the field. One real run
through a returned argv shows the flags take effect, against a control without them.
"""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

from hcp_linux import Policy, PolicyError
from hcp_linux.cli import cli_args
from hcp_linux.policy.limits import Limits
from hcp_linux.sandbox import confine
from hcp_linux.policy.resolve import resolve
from sandboxing import TIMEOUT

FIELDS = [f.name for f in dataclasses.fields(Policy)]
_CGROUP_LIMITS = {"memory": "64m", "pids": 100, "cpu_quota": 0.5}


def _dirs(tmp: Path, *names: str) -> tuple[str, ...]:
    out = []
    for name in names:
        (tmp / name).mkdir(exist_ok=True)
        out.append(str(tmp / name))
    return tuple(out)


def _file(tmp: Path, name: str) -> str:
    (tmp / name).write_text("x\n")
    return str(tmp / name)


def _sock(tmp: Path, name: str) -> str:
    """A socket inode (bound, then closed: the name stays a socket)."""
    import socket
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(tmp / name))
    return str(tmp / name)


def _allow(**kw: Any) -> dict[str, Any]:
    return {"network": "allow", "allow_hosts": ("example.com",), **kw}


#: field -> the policies (as Policy keyword arguments, given a tmp dir) that set it to
#: something other than its default.
SAMPLES: dict[str, Callable[[Path], list[dict[str, Any]]]] = {
    "jail": lambda t: [{"jail": _dirs(t, "other jail")[0]}],
    "read_only_jail": lambda t: [{"read_only_jail": True,
                                  "write_roots": _dirs(t, "w-for-ro-jail")}],
    "write_roots": lambda t: [{"write_roots": _dirs(t, "w1", "-w2")}],
    "read_only_roots": lambda t: [{"read_only_roots": _dirs(t, "ro", "ro=2")}],
    "system_roots": lambda t: [{"system_roots": ("/usr",)},
                               {"system_roots": ("/etc", "/usr", "/nonexistent")}],
    "network": lambda t: [{"network": "host"}, _allow()],
    "allow_bins": lambda t: [{"allow_bins": ("sh", "/usr/bin/true", "-dash", "a=b")}],
    "env": lambda t: [{"env": {"A": "1", "B": "x=y", "C": "", "D": "--jail=/", "E": "a\nb",
                               "F": "é"}}],
    "allow_degraded": lambda t: [{"allow_degraded": ("landlock",)},
                                 {"allow_degraded": ("namespaces", "seccomp")}],
    "rung": lambda t: [{"rung": "no-namespaces"},
                       {"rung": "no-userns", "allow_degraded": ("landlock",)}],
    "sandbox": lambda t: [{"sandbox": False, "native_local": True}],
    "native_local": lambda t: [{"sandbox": False, "native_local": True}],
    "seccomp_profiles": lambda t: [{"seccomp_profiles": ("baseline",)},
                                   {"seccomp_profiles": ("socket-families", "baseline")}],
    "timeout": lambda t: [{"timeout": 2.5}, {"timeout": 1e-05}, {"timeout": 2147483}],
    "allow_hosts": lambda t: [_allow(allow_hosts=("example.com", "*.example.org:443",
                                                  "10.0.0.0/8", "[::1]:8080"))],
    "deny_hosts": lambda t: [_allow(deny_hosts=("bad.example.com", "10.1.0.0/16"))],
    "proxy_log": lambda t: [_allow(proxy_log=str(t / "proxy log.jsonl"))],
    "limits": lambda t: [{"limits": {"nofile": 64}}, {"limits": {"nproc": "unlimited"}},
                         {"limits": {"fsize": "1m", "as": "4g", "cpu": 30}},
                         {"limits": {"tmp_size": "2m", "shm_size": 4096}},
                         {"limits": {"output": 1000, "nofile": "unlimited"}}]
    + [{"limits": {k: v}} for k, v in _CGROUP_LIMITS.items()],
    "on_exit": lambda t: [{"on_exit": "wait"}],
    "protect_missing": lambda t: [{"protect_missing": "placeholders"}],
    "protect_depth": lambda t: [{"protect_depth": 0}, {"protect_depth": 16}],
    "read_only_paths": lambda t: [{"read_only_paths": _dirs(t, "jail/.git", "jail/-ci dir")},
                                  {"read_only_paths": (_file(t, "jail/a=b.toml"),)}],
    "hidden_paths": lambda t: [{"hidden_paths": (_file(t, "jail/.env"),
                                                 *_dirs(t, "jail/secrets"))}],
    "allow_unix_sockets": lambda t: [{"allow_unix_sockets": (_sock(t, "a.sock"),
                                                             _sock(t, "b c=.sock"))}],
    "allow_dangerous_sockets": lambda t: [{"allow_dangerous_sockets": (_sock(t, "docker.sock"),)},
                                          {"allow_unix_sockets": (_sock(t, "x.sock"),),
                                           "allow_dangerous_sockets": (_sock(t, "-podman.sock"),)}],
    "pty": lambda t: [{"pty": True}],
    "allow_write_protected": lambda t: [{"allow_write_protected": (".git/hooks", ".envrc")},
                                        {"allow_write_protected": ("/a b/.bashrc",)}],
}


def _round_trip(policy: Policy, argv: list[str]) -> Policy:
    """The policy the CLI builds from ``confine``'s argv."""
    out = confine(argv, policy)
    assert out[:4] == [sys.executable, "-m", "hcp_linux", "run"]
    args = cli_args.build_parser().parse_args(out[3:])
    assert cli_args.command_of(args) == argv
    return cli_args.policy_from_args(args)


def _same(a: Policy, b: Policy) -> None:
    for name in FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        if name == "env":
            x, y = dict(x), dict(y)
        assert x == y, name


def test_every_field_has_samples() -> None:
    missing = [n for n in FIELDS if n not in SAMPLES]
    assert not missing, (f"Policy fields {missing} have no sample here: give confine a flag "
                         f"for each (hcp_linux/policy/policy_flags.py FIELDS) or make "
                         f"it refuse them, and add samples")
    assert set(SAMPLES) <= set(FIELDS)


@pytest.mark.parametrize("name", FIELDS)
def test_field_round_trips(name: str, tmp_path: Path) -> None:
    jail = _dirs(tmp_path, "jail")[0]
    samples = SAMPLES.get(name)
    assert samples is not None, f"no sample for Policy.{name}"
    for kw in samples(tmp_path):
        kw = {"jail": jail, **kw}
        limits = kw.get("limits", {})
        if set(limits) & set(_CGROUP_LIMITS):
            # cgroup limits exist in a resolved Policy only where they can be applied:
            # elsewhere resolving refuses them, so confine never sees one
            try:
                policy = resolve(Policy(**kw))
            except PolicyError as e:
                assert "not supported in this version" in str(e)
                continue
        else:
            policy = resolve(Policy(**kw))
        default = resolve(Policy(jail=jail) if name != "jail" else Policy(jail=str(tmp_path)))
        assert getattr(policy, name) != getattr(default, name), (name, kw)  # a real change
        for argv in (["true"], ["sh", "-c", 'echo "$1"', "--", "--jail=/", "-"]):
            _same(_round_trip(policy, argv), policy)


@pytest.mark.parametrize("name", ["system_roots", "seccomp_profiles"])
def test_empty_default_sets_are_refused(name: str, tmp_path: Path) -> None:
    """The CLI flag replaces the default set with the ones given: an empty set cannot be
    said; confine refuses it, naming the field, rather than run under the default set."""
    policy = Policy(jail=str(tmp_path), **{name: ()})
    with pytest.raises(PolicyError, match=rf"confine: {name} is empty"):
        confine(["true"], policy)


def test_confine_writes_nothing(tmp_path: Path) -> None:
    jail = _dirs(tmp_path, "jail")[0]
    log = tmp_path / "proxy.jsonl"
    before = sorted(os.listdir(tmp_path))
    confine(["true"], Policy(jail=jail, **_allow(proxy_log=str(log))))
    assert sorted(os.listdir(tmp_path)) == before and not log.exists()


def test_confine_argv_runs_under_the_policy(tmp_path: Path) -> None:
    """The limits, the environment and the timeout of the policy take effect in a real run
    of the returned argv; the control, the default policy, shows other values."""
    jail = _dirs(tmp_path, "jail")[0]
    script = ["sh", "-c", 'ulimit -n; ulimit -f; echo "$GRANTED"']
    policy = Policy(jail=jail, env={"GRANTED": "yes"}, timeout=30, on_exit="wait",
                    limits={"nofile": 64, "fsize": "1m"})
    p = subprocess.run(confine(script, policy), capture_output=True, timeout=TIMEOUT, cwd="/",
                       stdin=subprocess.DEVNULL)
    blocks = (1 << 20) // 512  # sh's ulimit -f counts 512-byte blocks
    assert (p.returncode, p.stdout.decode()) == (0, f"64\n{blocks}\nyes\n"), p
    control = subprocess.run(confine(script, Policy(jail=jail)), capture_output=True,
                             timeout=TIMEOUT, cwd="/", stdin=subprocess.DEVNULL)
    assert (control.returncode, control.stdout) == (0, b"4096\nunlimited\n\n"), control


def test_limits_have_exact_text() -> None:
    """Every limit value a Policy can hold comes back through its flag's text unchanged
    (no exponent, no rounding): the parser the CLI uses, on the text confine writes."""
    from hcp_linux.policy.policy_flags import BY_NAME
    for key, value in (("cpu_quota", 0.01), ("cpu_quota", 1.5), ("cpu_quota", 175921860.0),
                       ("nofile", 1), ("as", (1 << 63) - 1), ("output", None)):
        field = "as_" if key == "as" else key
        [flag] = BY_NAME["limits"].flags(Limits.from_mapping({key: value}))
        prefix = f"--limit={key}="
        assert flag.startswith(prefix), flag
        text = flag[len(prefix):]
        if key == "cpu_quota":
            assert Limits.from_mapping({key: text}).cpu_quota == value
        else:
            assert getattr(Limits.from_mapping({key: text}), field) == value
