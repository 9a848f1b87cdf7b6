"""``hcp-linux run --pack FILE`` end to end: the README's example pack, exit statuses, and the
exact one-line messages. Each run is a real process with a bounded timeout."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sandboxing import EXECUTOR_ARGS, jails_in

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "hello-pack" / "pack.toml"
TIMEOUT = 60


@pytest.fixture
def cli(tmp_path):
    state = tmp_path / "state"
    work = tmp_path / "work"
    shared = tmp_path / "shared"
    for d in (state, work, shared):
        d.mkdir()
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "XDG_STATE_HOME": str(state),
           "TMPDIR": str(tmp_path), "HOME": str(tmp_path)}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "hcp_linux", "run", *EXECUTOR_ARGS, *args],
                              cwd=work,
                              env=env, capture_output=True, timeout=TIMEOUT)

    run.state, run.work, run.shared, run.base = state, work, shared, tmp_path  # type: ignore[attr-defined]
    return run


def write_pack(dirpath: Path, body: str, name: str = "pack.toml") -> str:
    dirpath.mkdir(exist_ok=True)
    (dirpath / name).write_text(body)
    return str(dirpath / name)


def test_readme_example_pack(cli):
    out = cli.work / "hello.txt"
    first = cli("--pack", str(EXAMPLE), "--principal", "alice", "--", "bin/hello",
                "--output", str(out))
    assert first.returncode == 0, first.stderr
    text = first.stdout.decode()
    assert "hello from a sandboxed pack (HCP_SANDBOX=sandbox)" in text
    jail = cli.state / "hcp-linux" / "workspaces" / "hello" / "alice"
    assert f"cwd: {jail}" in text and "visit number 1" in text
    assert out.read_text() == "visits=1\n"
    second = cli("--pack", str(EXAMPLE), "--principal", "alice", "--", "bin/hello", "-o",
                 "hello.txt")  # relative to the caller's cwd
    assert second.returncode == 0 and "visit number 2" in second.stdout.decode()
    assert out.read_text() == "visits=2\n"
    assert sorted(os.listdir(jail)) == ["visits"]
    # The pack root is read-only in the sandbox.
    r = cli("--pack", str(EXAMPLE), "--", "sh", "-c", f'echo x > "{EXAMPLE.parent}/new"')
    assert r.returncode != 0 and not (EXAMPLE.parent / "new").exists()


def test_not_allowlisted_exit_127_exact_message(cli):
    pack = write_pack(cli.base / "p", '[wrap]\nbin = "sh"\n')
    marker = cli.shared / "marker"
    r = cli("--pack", pack, "--write-root", str(cli.shared), "--", "touch", str(marker))
    assert (r.returncode, r.stderr, r.stdout) == (127, b'error: sandbox: bin "touch" not allowlisted\n', b"")
    # on wrap.bin but not on the runtime's --allow-bin list
    r = cli("--pack", pack, "--allow-bin", "true", "--write-root", str(cli.shared), "--",
            "sh", "-c", f"touch {marker}")
    assert (r.returncode, r.stderr) == (127, b'error: sandbox: bin "sh" not allowlisted\n')
    assert not marker.exists()


def test_host_path_exit_125_exact_message(cli):
    pack = write_pack(cli.base / "p", '[wrap]\nbin = "sh"\n')
    marker = cli.shared / "marker"
    for args in (["--file", "/etc/passwd"], ["--output=/home/x"], ["/root/.ssh/id_rsa"],
                 ["--file", "/proc/self/root/srv/x"]):
        r = cli("--pack", pack, "--write-root", str(cli.shared), "--", "sh", "-c",
                f"touch {marker}", "sh", *args)
        assert (r.returncode, r.stderr) == (125, b"error: sandbox: host path not allowed\n")
    assert not marker.exists()


@pytest.mark.parametrize("body,field", [
    ('[wrap]\nbin = 1\n', "wrap.bin: expected a string or a list of strings"),
    ('[wrap]\nbin = ""\n', "wrap.bin: expected a bin name or path, got an empty string"),
    ('[wrap]\nbin = "sh"\nworkspace = { mode = "vm" }\n', "wrap.workspace.mode: expected one of"),
    ('[wrap]\nbin = "sh"\nworkspace = { file_flags = ["-o", "-o"] }\n', "duplicate entry '-o'"),
])
def test_malformed_manifest_one_line_naming_the_field(cli, body, field):
    pack = write_pack(cli.base / "p", body)
    marker = cli.shared / "marker"
    r = cli("--pack", pack, "--write-root", str(cli.shared), "--", "sh", "-c", f"touch {marker}")
    assert r.returncode == 125
    lines = r.stderr.decode().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: sandbox: pack {pack}: ")
    assert field in lines[0]
    assert not marker.exists() and os.listdir(cli.state) == []


def test_missing_pack_root_and_bad_principal_and_bad_output(cli):
    marker = cli.shared / "marker"
    missing = cli.base / "nowhere" / "pack.toml"
    r = cli("--pack", str(missing), "--", "sh", "-c", f"touch {marker}")
    assert (r.returncode, r.stderr.decode()) == (
        125, f"error: sandbox: pack {missing}: pack root {missing.parent} does not exist\n")
    pack = write_pack(cli.base / "p", '[wrap]\nbin = "sh"\nworkspace = { mode = "workspace" }\n')
    r = cli("--pack", pack, "--principal", "../admin", "--write-root", str(cli.shared), "--",
            "sh", "-c", f"touch {marker}")
    assert (r.returncode, r.stderr) == (
        125, b"error: sandbox: principal '../admin': contains a path separator\n")
    (cli.work / "adir").mkdir()
    os.symlink(cli.base / "elsewhere", cli.work / "alink")
    for out, why in (("adir", "is a directory"), ("alink", "is a symlink")):
        r = cli("--pack", pack, "--write-root", str(cli.shared), "--", "sh", "-c",
                f"touch {marker}", "sh", "-o", out)
        assert r.returncode == 125
        assert r.stderr.decode() == f"error: sandbox: -o {cli.work / out}: {why}" + (
            " (outputs are never written through a symlink)\n" if why == "is a symlink" else "\n")
    assert not marker.exists() and os.listdir(cli.state) == []
    assert not (cli.base / "elsewhere").exists()


def test_option_conflicts(cli):
    pack = write_pack(cli.base / "p", '[wrap]\nbin = "sh"\n')
    r = cli("--pack", pack, "--jail", str(cli.work), "--", "sh", "-c", "true")
    assert r.returncode == 125 and b"--jail: not with --pack" in r.stderr
    r = cli("--principal", "alice", "--", "sh", "-c", "true")
    assert (r.returncode, r.stderr) == (125, b"error: sandbox: --principal: only with --pack\n")


def test_timeout_exit_124_keeps_the_old_output(cli):
    pack = write_pack(cli.base / "p", '[wrap]\nbin = "sh"\nworkspace = { mode = "ephemeral" }\n')
    dest = cli.work / "out.txt"
    dest.write_text("old")
    r = cli("--pack", pack, "--timeout", "0.5", "--", "sh", "-c",
            'printf half > "$2"; sleep 30.0707', "sh", "-o", "out.txt")
    assert r.returncode == 124
    assert r.stderr == b"error: sandbox: timed out after 0.5s; the sandbox was killed\n"
    assert dest.read_text() == "old" and os.listdir(cli.work) == ["out.txt"]
    assert [n for n in jails_in(cli.base) if n.startswith("hcp-linux-")] == []


def test_receipt_and_exit_status(cli):
    pack = write_pack(cli.base / "p", '[wrap]\nbin = "sh"\n', name="pack.json")
    (cli.base / "p" / "pack.json").write_text(json.dumps({"wrap": {"bin": "sh"}}))
    r = cli("--pack", pack, "--receipt", "-", "--", "sh", "-c", "exit 7")
    assert r.returncode == 7
    receipt = json.loads(r.stderr)
    assert receipt["driver"]["name"] == "linux" and receipt["driver"]["mode"] == "none"
    assert receipt["exit"] == {"returncode": 7, "timed_out": False}
    r = cli("--pack", pack, "--", "sh", "-c", "kill -TERM $$")
    assert r.returncode == 128 + 15
