"""`hcp-linux policy import --from srt|codex FILE`: an equivalent policy on stdout, and on
stderr every setting not carried over with why. The fixtures (tests/imports/) are written
in the published formats: sandbox-runtime's SandboxRuntimeConfigSchema
(src/sandbox/sandbox-config.ts) and Codex's config.toml (sandbox_mode,
[sandbox_workspace_write], [shell_environment_policy]). One import of each is run for real:
the secret it hides is unreadable, the path it makes read-only unwritable, and the jail
writable, each checked against the same command run unconfined.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from hcp_linux.policy import imports
from sandboxing import (EXIT_REFUSED, TIMEOUT, assert_ok, err, out, run_cli, sh,  # noqa: F401
                        show, single_error_line)

FIXTURES = Path(__file__).resolve().parent / "imports"


def policy_import(source: str, path: Path, cwd: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hcp_linux", "policy", "import", "--from",
                           source, str(path), *extra], capture_output=True, timeout=TIMEOUT,
                          cwd=cwd, stdin=subprocess.DEVNULL)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return make_project(tmp_path / "project")


def make_project(p: Path) -> Path:
    """A project as the fixtures expect it: a secret, a git dir, a CI file, a cache."""
    (p / "secrets").mkdir(parents=True)
    (p / "secrets" / "key").write_text("s3cret\n")
    (p / ".env").write_text("TOKEN=s3cret\n")
    (p / ".git").mkdir()
    (p / "ci.yml").write_text("steps: []\n")
    (p / "cache").mkdir()
    return p


def test_srt_import_maps_or_names_every_setting(project: Path) -> None:
    proc = policy_import("srt", FIXTURES / "srt-settings.json", project)
    assert_ok(proc)
    table = tomllib.loads(out(proc))
    assert table == {
        "network": "allow",
        "allow_hosts": ["example.invalid", "*.npmjs.org", "registry.example.invalid:443"],
        "deny_hosts": ["private.example.invalid"],
        "hidden_paths": [str(project / ".env"), str(project / "secrets"), "/etc/shadow"],
        "read_only_paths": [str(project / ".git"), str(project / "ci.yml"),
                            str(project / "**/*.pem")],
    }
    notes = err(proc)
    assert "/etc/shadow" not in notes and ".pem" not in notes, notes  # both carried over
    for fragment in (
                     "docker.sock", "/tmp: the command has a private", "*:22: a port refused",
                     "network.httpProxyPort", "network.allowLocalBinding", "ignoreViolations",
                     "mandatoryDenySearchDepth", "read the whole file system"):
        assert fragment in notes, notes
    assert all(line.startswith("hcp-linux: import: srt: ") for line in notes.splitlines())
    # not noted: false switches that say what hcp-linux does anyway, and the ~/.ssh the view
    # does not hold (hidden by not being there)
    assert "enableWeakerNestedSandbox" not in notes
    assert ".ssh" not in notes


def test_codex_import_maps_or_names_every_setting(project: Path) -> None:
    proc = policy_import("codex", FIXTURES / "codex-config.toml", project,
                         "--allow-host", "api.example.invalid")
    assert_ok(proc)
    assert tomllib.loads(out(proc)) == {
        "read_only_jail": False, "network": "allow", "allow_hosts": ["api.example.invalid"],
        "write_roots": [str(project / "cache")], "env": {"CI": "1"}}
    notes = err(proc)
    for fragment in ("network_access: Codex opens the whole network",
                     "shell_environment_policy.set.LD_PRELOAD", "shell_environment_policy.inherit",
                     "model, approval_policy, mcp_servers: not sandbox settings",
                     "private /tmp"):
        assert fragment in notes, notes
    # without hosts, network_access is not widened to the whole network
    proc = policy_import("codex", FIXTURES / "codex-config.toml", project)
    assert_ok(proc)
    assert tomllib.loads(out(proc))["network"] == "none"
    assert "--allow-host" in err(proc)


@pytest.mark.parametrize("doc, table", [
    ({}, {"read_only_jail": True, "network": "none"}),
    ({"sandbox_mode": "read-only", "sandbox_workspace_write": {"network_access": True}},
     {"read_only_jail": True, "network": "none"}),
    ({"sandbox_mode": "danger-full-access"}, {"read_only_jail": False, "network": "none"}),
    ({"profile": "ro", "sandbox_mode": "workspace-write",
      "profiles": {"ro": {"sandbox_mode": "read-only"}}},
     {"read_only_jail": True, "network": "none"}),
])
def test_codex_modes(doc: dict, table: dict, tmp_path: Path) -> None:
    got, notes = imports.from_codex(doc, str(tmp_path))
    assert got == table
    assert notes


def test_srt_deny_all_wins(tmp_path: Path) -> None:
    got, notes = imports.from_srt({"network": {"allowedDomains": ["a.example"],
                                               "deniedDomains": ["*"]},
                                   "filesystem": {"allowWrite": ["."], "denyRead": [],
                                                  "denyWrite": []}}, str(tmp_path))
    assert got == {"network": "none"}
    assert any("refuses every host" in n for n in notes)


def test_srt_without_cwd_in_allow_write_is_read_only(tmp_path: Path) -> None:
    got, notes = imports.from_srt({"network": {"allowedDomains": []},
                                   "filesystem": {"allowWrite": [], "denyRead": [],
                                                  "denyWrite": []}}, str(tmp_path))
    assert got == {"read_only_jail": True, "network": "none"}
    assert any("read_only_jail = true" in n for n in notes)


@pytest.mark.parametrize("source, text, fragment", [
    ("srt", "{not json", "malformed JSON"),
    ("srt", "[1]", "expected a table"),
    ("codex", 'sandbox_mode = "yolo"', "expected one of read-only"),
])
def test_bad_input_is_one_line(source: str, text: str, fragment: str, tmp_path: Path) -> None:
    f = tmp_path / "in"
    f.write_text(text)
    proc = policy_import(source, f, tmp_path)
    assert proc.returncode == EXIT_REFUSED and out(proc) == ""
    assert fragment in single_error_line(proc)


SCRIPT = ("cat secrets/key >/dev/null 2>&1; echo secret=$?; "
          "(echo x >> ci.yml) 2>/dev/null; echo ci=$?; "
          "(echo x >> sub/cert.pem) 2>/dev/null; echo pem=$?; "
          "echo y > new.txt; echo jail=$?")


def test_srt_import_runs_for_real(project: Path, tmp_path: Path) -> None:
    """The imported policy, run: the hidden secret unreadable, the read-only file unchanged,
    the jail writable; unconfined, the same script reads and writes all of it."""
    # the run has no network here: this checks the file system; egress is network.md's
    settings = json.loads((FIXTURES / "srt-settings.json").read_text())
    settings["network"]["allowedDomains"] = []
    f = tmp_path / "s.json"
    f.write_text(json.dumps(settings))
    proc = policy_import("srt", f, project)
    assert_ok(proc)
    policy = tmp_path / "imported.toml"
    policy.write_text(out(proc))
    (project / "sub").mkdir()
    (project / "sub" / "cert.pem").write_text("cert\n")  # srt's denyWrite "**/*.pem"
    before = (project / "ci.yml").read_text()
    run = run_cli(project, "/bin/sh", "-c", SCRIPT, extra=["--policy", policy])
    assert_ok(run)
    assert out(run).split() == ["secret=1", "ci=2", "pem=2", "jail=0"], show(run)
    assert (project / "ci.yml").read_text() == before
    assert (project / "sub" / "cert.pem").read_text() == "cert\n"
    control = sh(SCRIPT, cwd=project)
    assert out(control).split() == ["secret=0", "ci=0", "pem=0", "jail=0"], show(control)


def test_codex_import_runs_for_real(project: Path, tmp_path: Path) -> None:
    proc = policy_import("codex", FIXTURES / "codex-config.toml", project)
    assert_ok(proc)
    policy = tmp_path / "imported.toml"
    policy.write_text(out(proc))
    run = run_cli(project, "/bin/sh", "-c", "echo a > cache/a && echo b > b && echo $CI",
                  extra=["--policy", policy])
    assert_ok(run)
    assert out(run) == "1\n"
    assert (project / "cache" / "a").exists() and (project / "b").exists()
    shutil.rmtree(project / "cache")
