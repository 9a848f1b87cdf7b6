"""The user's and the system's config (`$XDG_CONFIG_HOME/hcp-linux/policy.toml`,
`/etc/hcp-linux/policy.toml`): read by the CLI when present, in order, shown by `probe` and
the receipt; refused when a sandboxed command could have written it; never read by the
library.

The suite runs with HCP_LINUX_NO_CONFIG=1 (conftest); these tests give their runs an
environment of their own: XDG_CONFIG_HOME and the system config's path in tmp_path.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hcp_linux.policy.policy import Policy
from sandboxing import (EXIT_REFUSED, IS_ROOT, TIMEOUT, assert_ok, caller_env, jail,  # noqa: F401
                        out, read_receipt, run_cli, show, single_error_line)


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o755)
    path.write_text(text)
    os.chmod(path, 0o644)
    return path


@pytest.fixture
def cfg(tmp_path: Path) -> dict:
    """An environment whose configs live in tmp_path (none written yet): ``user`` and
    ``system`` are their paths, ``env`` the environment of a run that reads them."""
    os.chmod(tmp_path, 0o755)
    env = caller_env({"XDG_CONFIG_HOME": str(tmp_path / "xdg"),
                      "HCP_LINUX_SYSTEM_CONFIG": str(tmp_path / "etc" / "policy.toml")})
    env.pop("HCP_LINUX_NO_CONFIG")
    return {"env": env, "user": tmp_path / "xdg" / "hcp-linux" / "policy.toml",
            "system": tmp_path / "etc" / "policy.toml"}


WRITE = "echo x > made.txt; echo rc=$?"


def test_user_config_is_applied_and_named_in_the_receipt(cfg: dict, jail: Path,
                                                         tmp_path: Path) -> None:
    _write(cfg["user"], "read_only_jail = true\n")
    receipt = tmp_path / "r.json"
    proc = run_cli(jail, "/bin/sh", "-c", WRITE, env=cfg["env"], extra=["--receipt", receipt])
    assert_ok(proc)
    assert "rc=0" not in out(proc) and not (jail / "made.txt").exists(), show(proc)
    assert read_receipt(receipt)["policy_layers"] == [f"user config {cfg['user']}"]
    # controls: the same run with configs off writes the file, and says no layers
    for extra, env in ((["--no-config"], cfg["env"]),
                       ([], {**cfg["env"], "HCP_LINUX_NO_CONFIG": "1"})):
        proc = run_cli(jail, "/bin/sh", "-c", WRITE, env=env, extra=[*extra, "--receipt",
                                                                       receipt])
        assert "rc=0" in out(proc), show(proc)
        assert "policy_layers" not in read_receipt(receipt)
        (jail / "made.txt").unlink()


def test_layers_compose_in_order(cfg: dict, jail: Path, tmp_path: Path) -> None:
    """preset < system config < user config < --policy FILE < flags, on one env table."""
    _write(cfg["system"], '[env]\nS = "system"\nU = "system"\nF = "system"\nX = "system"\n')
    _write(cfg["user"], '[env]\nU = "user"\nF = "user"\nX = "user"\n')
    f = _write(tmp_path / "p.toml", '[env]\nF = "file"\nX = "file"\n')
    receipt = tmp_path / "r.json"
    proc = run_cli(jail, "/bin/sh", "-c", 'echo "$S $U $F $X"', env=cfg["env"],
                   extra=["--preset", "workspace-write", "--policy", f, "--env", "X=flag",
                          "--receipt", receipt])
    assert_ok(proc)
    assert out(proc) == "system user file flag\n"
    assert read_receipt(receipt)["policy_layers"] == [
        "preset workspace-write", f"system config {cfg['system']}",
        f"user config {cfg['user']}", f"policy file {f}"]


def test_network_none_over_a_config_that_allows_egress(cfg: dict, jail: Path,
                                                       tmp_path: Path) -> None:
    """A config's egress lists wait for network = "allow": `--network none` over them runs
    with no network (nothing widened), while an egress flag with egress off is refused."""
    _write(cfg["user"], 'network = "allow"\nallow_hosts = ["example.invalid"]\n')
    receipt = tmp_path / "r.json"
    assert_ok(run_cli(jail, "/bin/true", env=cfg["env"], extra=["--receipt", receipt]))
    assert read_receipt(receipt)["network"]["mode"] == "allow"
    assert_ok(run_cli(jail, "/bin/true", env=cfg["env"],
                      extra=["--network", "none", "--receipt", receipt]))
    assert read_receipt(receipt)["network"]["mode"] == "none"
    proc = run_cli(jail, "/bin/true", env=cfg["env"],
                   extra=["--network", "none", "--allow-host", "example.invalid"])
    assert proc.returncode == EXIT_REFUSED and "network" in single_error_line(proc)


def test_a_config_inside_a_writable_root_is_refused(cfg: dict, jail: Path,
                                                    tmp_path: Path) -> None:
    """A config the run could rewrite would widen the next run: refused, naming it, before
    anything runs; the same config outside is read (the control)."""
    inside = _write(jail / "xdg" / "hcp-linux" / "policy.toml", "timeout = 30\n")
    marker = "touch ran"
    for env in ({**cfg["env"], "XDG_CONFIG_HOME": str(jail / "xdg")},
                {**cfg["env"], "HCP_LINUX_SYSTEM_CONFIG": str(inside)}):
        proc = run_cli(jail, "/bin/sh", "-c", marker, env=env)
        assert proc.returncode == EXIT_REFUSED, show(proc)
        line = single_error_line(proc)
        assert str(inside) in line and "writable root" in line
        assert not (jail / "ran").exists()
    # through a symlink that lies in the jail: the link is the command's to re-point
    real = _write(tmp_path / "real" / "hcp-linux" / "policy.toml", "timeout = 30\n")
    (jail / "link").symlink_to(tmp_path / "real")
    proc = run_cli(jail, "/bin/sh", "-c", marker, env={**cfg["env"],
                                                       "XDG_CONFIG_HOME": str(jail / "link")})
    assert proc.returncode == EXIT_REFUSED and "link" in single_error_line(proc)
    # inside a --write-root
    other = tmp_path / "w"
    other.mkdir()
    proc = run_cli(jail, "/bin/sh", "-c", marker, env={**cfg["env"], "XDG_CONFIG_HOME":
                                                       str(tmp_path / "real")},
                   extra=["--write-root", tmp_path / "real"])
    assert proc.returncode == EXIT_REFUSED and str(real) in single_error_line(proc)
    assert not (jail / "ran").exists()
    # control: the same file, read from outside every writable root
    proc = run_cli(jail, "/bin/sh", "-c", marker, env={**cfg["env"], "XDG_CONFIG_HOME":
                                                       str(tmp_path / "real")})
    assert_ok(proc)
    assert (jail / "ran").exists()


@pytest.mark.parametrize("what", ["file", "directory"])
def test_a_config_others_may_write_is_refused(cfg: dict, jail: Path, what: str) -> None:
    path = _write(cfg["user"], "timeout = 30\n")
    os.chmod(path if what == "file" else path.parent, 0o777 if what == "directory" else 0o666)
    proc = run_cli(jail, "/bin/true", env=cfg["env"])
    assert proc.returncode == EXIT_REFUSED, show(proc)
    assert "writable by other users" in single_error_line(proc)
    os.chmod(path if what == "file" else path.parent, 0o755 if what == "directory" else 0o644)
    assert_ok(run_cli(jail, "/bin/true", env=cfg["env"]))


@pytest.mark.root_only
def test_a_config_owned_by_another_user_is_refused(cfg: dict, jail: Path) -> None:
    path = _write(cfg["user"], "timeout = 30\n")
    os.chown(path, 65534, 65534)
    proc = run_cli(jail, "/bin/true", env=cfg["env"])
    assert proc.returncode == EXIT_REFUSED
    assert "owned by uid 65534" in single_error_line(proc)


def test_a_bad_config_is_one_line_naming_it(cfg: dict, jail: Path) -> None:
    _write(cfg["user"], "allow_host = ['x']\n")
    proc = run_cli(jail, "/bin/true", env=cfg["env"])
    assert proc.returncode == EXIT_REFUSED
    line = single_error_line(proc)
    assert f"user config {cfg['user']}" in line and "did you mean 'allow_hosts'?" in line
    _write(cfg["user"], "sandbox = false\nnative_local = true\n")
    proc = run_cli(jail, "/bin/true", env=cfg["env"])
    assert proc.returncode == EXIT_REFUSED
    assert "not taken from a config file" in single_error_line(proc)


def test_probe_shows_the_configs(cfg: dict) -> None:
    _write(cfg["user"], "timeout = 30\n")
    def probe(env: dict) -> dict:
        proc = subprocess.run([sys.executable, "-m", "hcp_linux", "probe", "--json"],
                              capture_output=True, timeout=TIMEOUT, env=env, cwd="/")
        return {c["kind"]: c for c in json.loads(proc.stdout)["configs"]}
    got = probe(cfg["env"])
    assert got["user config"] == {"kind": "user config", "path": str(cfg["user"]),
                                  "status": "read"}
    assert got["system config"]["status"] == "absent"
    off = probe({**cfg["env"], "HCP_LINUX_NO_CONFIG": "1"})
    assert off["user config"]["status"].startswith("not read")


def test_the_library_reads_no_config(cfg: dict, jail: Path, monkeypatch) -> None:
    """Policy(...) is what its caller says: a config in the environment changes nothing
    (nor the driver's, which builds Policy values)."""
    _write(cfg["user"], "read_only_jail = true\n")
    for key in ("XDG_CONFIG_HOME", "HCP_LINUX_SYSTEM_CONFIG"):
        monkeypatch.setenv(key, cfg["env"][key])
    monkeypatch.delenv("HCP_LINUX_NO_CONFIG")
    assert Policy(jail=str(jail)).read_only_jail is False
    import hcp_linux  # the package under test, wherever it is installed (the wheel leg)
    root = Path(hcp_linux.__file__).resolve().parent
    readers = sorted(str(p.relative_to(root)) for p in root.rglob("*.py")
                     if "XDG_CONFIG_HOME" in p.read_text())
    # runtime_files names the path, for every run to keep it read-only, and opens nothing
    assert "cli/config.py" in readers and all(r.startswith("cli/") or r == "runtime_files.py"
                                              for r in readers), readers
    assert "open(" not in (root / "runtime_files.py").read_text()


def test_a_run_with_a_config_is_not_served(cfg: dict, monkeypatch) -> None:
    """The configs are the caller's: a run that reads one runs in-process, never planned by
    a `hcp-linux serve` started under another environment (hcp_linux.cli.launch)."""
    from hcp_linux.cli import launch
    for key in ("XDG_CONFIG_HOME", "HCP_LINUX_SYSTEM_CONFIG"):
        monkeypatch.setenv(key, cfg["env"][key])
    monkeypatch.delenv("HCP_LINUX_NO_CONFIG")
    assert not launch._configs(["run", "--", "/bin/true"])
    _write(cfg["user"], "timeout = 30\n")
    assert launch._configs(["run", "--", "/bin/true"])
    assert not launch._configs(["run", "--no-config", "--", "/bin/true"])
    assert launch._configs(["run", "--", "/bin/echo", "--no-config"])  # the command's own


def test_conformance_is_not_changed_by_a_config(cfg: dict) -> None:
    """The checks' own runs read no config: a user's read-only jail would fail every check
    that writes its jail (hcp_linux.conformance.harness)."""
    _write(cfg["user"], "read_only_jail = true\n")
    proc = subprocess.run([sys.executable, "-m", "hcp_linux", "conformance", "--json"],
                          capture_output=True, timeout=600, env=cfg["env"], cwd="/")
    report = json.loads(proc.stdout)
    failed = [c["id"] for c in report["checks"] if c["status"] == "fail"]
    assert not failed and report["checks"], failed
