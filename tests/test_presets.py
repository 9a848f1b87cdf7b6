"""Presets (`hcp-linux policy list|show`, `run --preset NAME`) and how layers compose.

Each preset's promise is checked on the kernel (a write refused in the read-only jail, on
disk; egress refused without hosts), with the default as the control; `policy show` prints
TOML that reads back to the preset and that `--policy` takes to the same Policy.
"""
from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from hcp_linux.errors import PolicyError
from hcp_linux.policy import layers as L
from hcp_linux.policy import presets, toml_text
from hcp_linux.policy.policy import Policy
from sandboxing import (EXIT_REFUSED, TIMEOUT, assert_ok, jail, out, read_receipt, run_cli, show,  # noqa: F401
                        single_error_line)


def policy_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hcp_linux", "policy", *args],
                          capture_output=True, timeout=TIMEOUT, cwd="/",
                          stdin=subprocess.DEVNULL)


def test_list_names_every_preset_with_one_line() -> None:
    proc = policy_cli("list")
    assert_ok(proc)
    lines = out(proc).splitlines()
    assert [line.split()[0] for line in lines] == list(presets.PRESETS)
    assert {"read-only", "workspace-write", "workspace-write-net"} <= set(presets.PRESETS)
    for line, p in zip(lines, presets.PRESETS.values()):
        assert p.description in line and "\n" not in p.description


@pytest.mark.parametrize("name", [n for n, p in presets.PRESETS.items() if not p.needs_hosts])
def test_show_round_trips(name: str, tmp_path: Path) -> None:
    """`policy show` is TOML that reads back to the preset's table, and `--policy` of it
    is the same Policy as `--preset`."""
    proc = policy_cli("show", name)
    assert_ok(proc)
    assert tomllib.loads(out(proc)) == dict(presets.PRESETS[name].table)
    f = tmp_path / "p.toml"
    f.write_text(out(proc))
    jail = tmp_path / "j"
    jail.mkdir()
    assert Policy.from_toml(f, jail=str(jail)) == \
        Policy(**L.combine([L.Layer(L.PRESET, name, presets.PRESETS[name].table)]),
               jail=str(jail))


def test_show_net_takes_hosts_and_refuses_without(tmp_path: Path) -> None:
    proc = policy_cli("show", "workspace-write-net", "--allow-host", "pypi.org:443")
    assert_ok(proc)
    assert tomllib.loads(out(proc)) == {"read_only_jail": False, "network": "allow",
                                        "allow_hosts": ["pypi.org:443"]}
    f = tmp_path / "net.toml"
    f.write_text(out(proc))
    jail = tmp_path / "j"
    jail.mkdir()
    table = presets.table_with_hosts(presets.PRESETS["workspace-write-net"], ["pypi.org:443"])
    assert Policy.from_toml(f, jail=str(jail)) == Policy(**table, jail=str(jail))
    proc = policy_cli("show", "workspace-write-net")
    assert proc.returncode == EXIT_REFUSED and out(proc) == ""
    assert "--allow-host" in single_error_line(proc)


def test_unknown_preset_says_the_nearest(jail: Path) -> None:
    proc = policy_cli("show", "read-onyl")
    assert proc.returncode == EXIT_REFUSED
    assert "did you mean 'read-only'?" in single_error_line(proc)
    proc = run_cli(jail, "/bin/true", extra=["--preset", "worksapce-write"])
    assert proc.returncode == EXIT_REFUSED
    assert "did you mean 'workspace-write'?" in single_error_line(proc)


def test_read_only_preset_refuses_a_write_and_the_default_allows_it(jail: Path) -> None:
    script = "echo x > made.txt; echo rc=$?; echo t > $TMPDIR/t && echo tmp=ok"
    proc = run_cli(jail, "/bin/sh", "-c", script, extra=["--preset", "read-only"])
    assert_ok(proc)
    assert "rc=0" not in out(proc) and "tmp=ok" in out(proc), show(proc)
    assert not (jail / "made.txt").exists()
    control = run_cli(jail, "/bin/sh", "-c", script, extra=["--preset", "workspace-write"])
    assert "rc=0" in out(control), show(control)
    assert (jail / "made.txt").read_text() == "x\n"


def test_net_preset_needs_a_host(jail: Path, tmp_path: Path) -> None:
    proc = run_cli(jail, "/bin/true", extra=["--preset", "workspace-write-net"])
    assert proc.returncode == EXIT_REFUSED
    line = single_error_line(proc)
    assert "workspace-write-net" in line and "--allow-host" in line
    receipt = tmp_path / "r.json"
    proc = run_cli(jail, "/bin/true", extra=["--preset", "workspace-write-net", "--allow-host",
                                             "example.invalid", "--receipt", receipt])
    assert_ok(proc)
    r = read_receipt(receipt)
    assert r["network"]["mode"] == "allow"
    assert r["policy_layers"] == ["preset workspace-write-net"]


def test_flags_and_file_stand_above_the_preset(jail: Path, tmp_path: Path) -> None:
    """preset < --policy FILE < flags: the file makes the read-only preset's jail writable
    again; a flag then adds its write root; the receipt names the layers."""
    f = tmp_path / "p.toml"
    f.write_text("read_only_jail = false\n")
    receipt = tmp_path / "r.json"
    proc = run_cli(jail, "/bin/sh", "-c", "echo x > made.txt",
                   extra=["--preset", "read-only", "--policy", f, "--receipt", receipt])
    assert_ok(proc)
    assert (jail / "made.txt").exists()
    assert read_receipt(receipt)["policy_layers"] == ["preset read-only", f"policy file {f}"]


def test_composition_rules() -> None:
    """Lists add (once each), scalars replace, tables merge, default sets replace."""
    got = L.combine([
        L.Layer(L.PRESET, "p", {"network": "allow", "allow_hosts": ["a.example"],
                                "env": {"A": "1"}, "system_roots": ["/usr"]}),
        L.Layer(L.USER_CONFIG, "/u", {"allow_hosts": ["b.example", "a.example"],
                                      "env": {"B": "2"}, "limits": {"nproc": 10}}),
        L.Layer(L.POLICY_FILE, "/f", {"network": "none", "system_roots": ["/bin"],
                                      "limits": {"nofile": 20}}),
    ])
    assert got == {"network": "none", "allow_hosts": ["a.example", "b.example"],
                   "env": {"A": "1", "B": "2"}, "system_roots": ["/bin"],
                   "limits": {"nproc": 10, "nofile": 20}}


@pytest.mark.parametrize("table, fragment", [
    ({"write_roots": "/x"}, "write_roots: expected a list"),
    ({"env": ["A=1"]}, "env: expected a table"),
    ({"allow_host": ["x"]}, "did you mean 'allow_hosts'?"),
    ({"sandbox": False}, "not taken from a config file"),
])
def test_a_bad_layer_is_named(table: dict, fragment: str) -> None:
    with pytest.raises(PolicyError) as e:
        L.combine([L.Layer(L.USER_CONFIG, "/home/u/.config/hcp-linux/policy.toml", table)])
    assert fragment in str(e.value) and "user config /home/u/" in str(e.value)


def test_toml_text_reads_back() -> None:
    table = {"jail": "/a b/\"q\"", "timeout": 1.5, "pty": True, "allow_bins": ["sh", "é"],
             "env": {"K": "v\x7f\n"}, "limits": {"nproc": 5}}
    assert tomllib.loads(toml_text.dump(table, ["a header"])) == table
