"""`hcp-linux conformance --policy FILE`: a user's policy file, fitted to the checks' own
jails, is the base of every check's runs; an srt settings.json and a Codex config.toml,
imported (`policy import`), pass the whole suite. The imports are the fixtures
tests/test_policy_import.py reads (tests/imports/), for a project like its own. One
conformance run per import (module-scoped): each takes ~12 s.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hcp_linux.conformance import CHECK_IDS, FAIL
from hcp_linux.conformance.policy_base import load
from sandboxing import EXIT_REFUSED, assert_ok, out, single_error_line
from test_conformance import _cli
from test_policy_import import make_project, policy_import

FIXTURES = Path(__file__).resolve().parent / "imports"


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project as the import fixtures expect it (test_policy_import's), for the module."""
    return make_project(tmp_path_factory.mktemp("conformance-policy") / "project")


def _import(source: str, settings: Path, project: Path, *extra: str) -> Path:
    """`policy import --from SOURCE SETTINGS` in the project, its output in a file."""
    proc = policy_import(source, settings, project, *extra)
    assert_ok(proc)
    f = project.parent / f"{source}-imported.toml"
    f.write_text(out(proc))
    return f


@pytest.fixture(scope="module", params=["srt", "codex"])
def imported_report(request: pytest.FixtureRequest, project: Path) -> tuple[str, dict]:
    """The import of one fixture, checked from the project: srt's as two commands
    (`policy import` to a file, then `conformance --policy FILE --json`), Codex's in one
    (`conformance --policy config.toml --from codex`)."""
    if request.param == "srt":
        f = _import("srt", FIXTURES / "srt-settings.json", project)
        args = ["--policy", str(f)]
    else:  # a Codex user's network_access, with the host they give (a loopback port no
        # check listens on)
        args = ["--policy", str(FIXTURES / "codex-config.toml"), "--from", "codex",
                "--allow-host", "127.0.0.1:9"]
    p = _cli([*args, "--json"], cwd=str(project))
    assert p.returncode == 0, p.stdout.decode()[-3000:] + p.stderr.decode()
    return request.param, json.loads(p.stdout)


def test_an_imported_policy_passes_conformance(imported_report: tuple[str, dict],
                                               project: Path) -> None:
    source, report = imported_report
    assert report["summary"][FAIL] == 0 and report["summary"]["total"] == len(CHECK_IDS)
    pol = report["config"]["policy"]
    assert pol["project"] == os.path.realpath(project)
    changes = "\n".join(pol["changes"])
    assert "replaced by each check's own jail" in changes
    if source == "srt":
        # kept: what applies outside the project; the hosts of the settings, as written
        assert pol["table"]["hidden_paths"] == ["/etc/shadow"]
        assert pol["table"]["read_only_paths"] == ["**/*.pem"]
        assert pol["table"]["network"] == "allow" and "example.invalid" in \
            pol["table"]["allow_hosts"]
        assert f"hidden_paths: {project / '.env'} dropped" in changes, changes
        assert "rebased onto each check's jail as **/*.pem" in changes
        assert "not applied to the checks' native-local runs" in changes
    else:
        assert pol["table"]["write_roots"] == []
        assert pol["table"]["env"] == {"CI": "1"}
        assert pol["table"]["allow_hosts"] == ["127.0.0.1:9"]
        assert f"write_roots: {project / 'cache'} dropped" in changes, changes
        # imported in the same command: the import's notes lead the changes
        assert pol["changes"][0].startswith("import: "), pol["changes"]


def test_from_goes_with_policy(tmp_path: Path) -> None:
    """`--from` without `--policy`, and `--allow-host` without a preset or `--from codex`:
    one line, exit 125, no check run."""
    for args, fragment in ((["--from", "srt"], "--from srt goes with --policy"),
                           (["--allow-host", "x:1", "--policy", str(FIXTURES / "srt-settings.json"),
                             "--from", "srt"], "--allow-host goes with")):
        p = _cli(args, cwd=str(tmp_path))
        line = single_error_line(p)
        assert p.returncode == EXIT_REFUSED and fragment in line and p.stdout == b"", line


def test_the_fitted_file_keeps_what_applies(tmp_path: Path) -> None:
    """What load keeps, rebases and drops (docs/conformance.md, "Under a policy file")."""
    project, elsewhere, scratch = (tmp_path / "p", tmp_path / "elsewhere", tmp_path / "s")
    for d in (project / "sub", elsewhere / "data", scratch):
        d.mkdir(parents=True)
    f = tmp_path / "p.toml"
    f.write_text(f'jail = "{project}"\nnetwork = "none"\nallow_bins = ["sh"]\n'
                 f'write_roots = ["{elsewhere}", "{project}/sub", "{tmp_path}/missing", '
                 f'"{tmp_path}"]\n'
                 f'read_only_paths = ["{elsewhere}/data", "{project}/sub", "sub/**/*.key"]\n'
                 f'proxy_log = "{tmp_path}/log"\n')
    base = load(str(f), str(scratch), cwd="/")
    assert base.project == os.path.realpath(project)
    assert base.table == {"network": "none", "write_roots": [str(elsewhere)],
                          "read_only_paths": [f"{elsewhere}/data", "sub/**/*.key"]}
    changes = "\n".join(base.changes)
    for fragment in ("allow_bins: ['sh'] dropped", f"write_roots: {project}/sub dropped: it is "
                     "in the project", "missing dropped: it does not exist",
                     f"write_roots: {tmp_path} dropped: it holds the harness's scratch",
                     f"read_only_paths: {project}/sub dropped",
                     "read_only_paths: sub/**/*.key rebased", "proxy_log:"):
        assert fragment in changes, changes


@pytest.mark.parametrize("text, fragment", [
    (None, "No such file or directory"),
    ("network = [", "policy file"),
    ("netwrok = \"none\"\n", "unknown key 'netwrok'"),
    ("sandbox = false\nnativeLocal = true\n", "sets native-local mode"),
    ("network = \"sometimes\"\n", "network"),
    ("write_roots = \"/var\"\n", "write_roots: expected a list"),
])
def test_cli_refuses_a_bad_policy_file(text: str | None, fragment: str,
                                       tmp_path: Path) -> None:
    """One line, exit 125, nothing on stdout, no check run (mirrors the --preset refusals)."""
    f = tmp_path / "policy.toml"
    if text is not None:
        f.write_text(text)
    p = _cli(["--policy", str(f)])
    assert p.returncode == EXIT_REFUSED and p.stdout == b"", p.stdout.decode()[-2000:]
    line = single_error_line(p)
    assert fragment in line, line
    assert "policy file" in line or "--policy" in line, line


def test_cli_refuses_a_bad_preset_and_policy_pair(tmp_path: Path) -> None:
    """--preset under --policy: composed as `run` composes them, and refused before any check
    when they make no policy (workspace-write-net's hosts over a file that says none)."""
    f = tmp_path / "policy.toml"
    f.write_text('network = "none"\ndeny_hosts = ["a.example"]\n')
    p = _cli(["--preset", "workspace-write", "--policy", str(f)])
    assert p.returncode == EXIT_REFUSED and p.stdout == b"", p.stdout.decode()[-2000:]
    line = single_error_line(p)
    assert "conformance: preset workspace-write with policy file" in line, line
