"""Glob patterns in carve-outs, and hidden paths inside the system roots.

``hidden_paths`` / ``read_only_paths`` entries with wildcards (``**/.env``, ``*.pem``,
``secrets/*``; relative ones from the jail) are expanded when the policy is made, by a walk
that follows no symlink (hcp_linux.policy.globs); ``hidden_paths`` may name a secret inside
a system root (``/etc/docker/key.json``). Every denial is done by the command inside the
sandbox and paired with a negative control (the same script without the carve-out, or the
file read unconfined). Runs under both executors and as root and nobody.
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from hcp_linux import Policy
from hcp_linux.errors import PolicyError
from hcp_linux.policy import globs
from hcp_linux.policy.policy import DEFAULT_SYSTEM_ROOTS
from hcp_linux.policy.resolve import resolve
from sandboxing import (EXIT_REFUSED, assert_ok, out, read_receipt, run_cli, sh, show,
                        single_error_line)

#: Reads each path given; one ``path=content|ERRNO`` line each.
READ = r"""
import errno, sys
for path in sys.argv[1:]:
    try:
        with open(path) as f:
            print(path + "=" + f.read().strip())
    except OSError as e:
        print(path + "=" + errno.errorcode[e.errno])
"""

SECRETS = (".env", "a/.env", "a/b/.env", "x.pem", "secrets/k1", "secrets/k2")
PLAIN = ("a/y.pem", "a/readme", "other.txt")


def _statuses(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def _project(root: Path) -> Path:
    for rel in SECRETS:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(f"SECRET {rel}\n")
    for rel in PLAIN:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(f"plain {rel}\n")
    return root


def _refused(p) -> str:  # type: ignore[no-untyped-def]
    assert p.returncode == EXIT_REFUSED, show(p)
    return single_error_line(p)


def test_hidden_globs_mask_every_match_and_the_receipt_lists_them(tmp_path: Path) -> None:
    project = _project(tmp_path / "project")
    receipt = tmp_path / "receipt.json"
    paths = SECRETS + PLAIN
    p = run_cli(project, "python3", "-c", READ, *paths,
                extra=["--hide-path", "**/.env", "--hide-path", "*.pem",
                       "--hide-path", f"{project}/secrets/*", "--receipt", receipt])
    assert_ok(p)
    st = _statuses(out(p))
    assert "SECRET" not in out(p), show(p)
    for rel in SECRETS:
        assert st[rel] == "EACCES", (rel, show(p))
    for rel in PLAIN:  # a/y.pem: "*.pem" is the jail's top level only
        assert st[rel] == f"plain {rel}", (rel, show(p))
    carve = read_receipt(receipt)["carve_outs"]
    assert carve["patterns"]["hidden_paths"] == {
        f"{project}/**/.env": [str(project / r) for r in (".env", "a/.env", "a/b/.env")],
        f"{project}/*.pem": [str(project / "x.pem")],
        f"{project}/secrets/*": [str(project / "secrets/k1"), str(project / "secrets/k2")]}
    assert set(carve["hidden_paths"]) == {str(project / r) for r in SECRETS}
    # negative control: the same reads, no carve-out
    c = run_cli(project, "python3", "-c", READ, *paths)
    assert_ok(c)
    cst = _statuses(out(c))
    for rel in SECRETS:
        assert cst[rel] == f"SECRET {rel}", (rel, show(c))


def test_read_only_glob_refuses_writes_to_each_match(tmp_path: Path) -> None:
    project = _project(tmp_path / "project")
    script = ("for f in a/.env a/b/.env other.txt; do "
              "if echo x >> $f 2>/dev/null; then echo $f=ok; else echo $f=denied; fi; done")
    p = run_cli(project, "sh", "-c", script, extra=["--read-only-path", "a/**/.env"])
    assert_ok(p)
    assert _statuses(out(p)) == {"a/.env": "denied", "a/b/.env": "denied",
                                 "other.txt": "ok"}, show(p)
    assert (project / "a/.env").read_text() == "SECRET a/.env\n"
    c = run_cli(project, "sh", "-c", script)  # negative control
    assert_ok(c)
    assert set(_statuses(out(c)).values()) == {"ok"}, show(c)


def test_a_pattern_matching_nothing_runs_and_says_so(tmp_path: Path) -> None:
    project = _project(tmp_path / "project")
    receipt = tmp_path / "receipt.json"
    p = run_cli(project, "cat", ".env", extra=["--hide-path", "**/*.key",
                                                "--receipt", receipt])
    assert_ok(p)
    assert out(p) == "SECRET .env\n"
    assert read_receipt(receipt)["carve_outs"]["patterns"] == {
        "hidden_paths": {f"{project}/**/*.key": []}}


def test_a_matched_symlink_in_a_writable_root_is_refused_next_run(tmp_path: Path) -> None:
    """Two runs: a matched secret cannot be swapped during the first (a mount point:
    EBUSY), so the first run plants a new match that is a link (to a decoy); the second,
    with the same pattern, is refused naming the link and the pattern, as an explicit
    carve-out that is a link is: a link's meaning is the command's to change."""
    project = _project(tmp_path / "project")
    first = run_cli(project, "sh", "-c", "rm a/.env; echo $?; echo decoy > decoy; "
                    "mkdir c && ln -s ../decoy c/.env", extra=["--hide-path", "**/.env"])
    assert_ok(first)
    assert out(first) == "1\n", show(first)  # the match itself could not be removed
    assert (project / "a/.env").read_text() == "SECRET a/.env\n"
    assert os.path.islink(project / "c/.env")
    line = _refused(run_cli(project, "cat", "a/b/.env", extra=["--hide-path", "**/.env"]))
    assert "hidden_paths" in line and f"{project}/c/.env is a symlink" in line, line
    assert f"matched by pattern {project}/**/.env" in line, line


def test_the_walk_never_enters_a_symlinked_directory(tmp_path: Path) -> None:
    """A link to a directory elsewhere is not walked: a command cannot point a pattern at
    another tree; the match set is what lies under the jail itself."""
    project = _project(tmp_path / "project")
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "deep").mkdir(parents=True)
    (elsewhere / "deep" / ".env").write_text("ELSEWHERE\n")
    os.symlink(elsewhere, project / "linked")
    policy = resolve(Policy(jail=str(project), hidden_paths=["**/.env"]))
    assert str(elsewhere / "deep" / ".env") not in policy.hidden_paths
    assert all(p.startswith(str(project) + "/") for p in policy.hidden_paths)


def test_bounds_refuse_naming_the_pattern(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    project = tmp_path / "project"
    many = project / "many"
    many.mkdir(parents=True)
    for i in range(globs.MAX_MATCHES + 1):
        (many / f"f{i}.pem").write_text("")
    line = _refused(run_cli(project, "true", extra=["--hide-path", "many/*.pem"]))
    assert f"pattern {project}/many/*.pem matches more than {globs.MAX_MATCHES}" in line, line
    # exactly the bound is accepted
    (many / "f0.pem").unlink()
    assert len(resolve(Policy(jail=str(project), hidden_paths=["many/*.pem"])).hidden_paths) \
        == globs.MAX_MATCHES
    deep = project / "deep"
    d = deep
    for i in range(globs.MAX_DEPTH + 2):
        d = d / "d"
    d.mkdir(parents=True)
    line = _refused(run_cli(project, "true", extra=["--hide-path", "deep/**/.env"]))
    assert f"pattern {project}/deep/**/.env reaches deeper than {globs.MAX_DEPTH}" in line, line
    monkeypatch.setattr(globs, "MAX_ENTRIES", 100)
    with pytest.raises(PolicyError, match=r"hidden_paths: pattern .*/many/\*\*/x reads more than "
                                          r"100 directory entries"):
        resolve(Policy(jail=str(project), hidden_paths=["many/**/x"]))


def test_matches_are_fixed_at_run_start(tmp_path: Path) -> None:
    """A file made during a run is not hidden in that run (the match set is made before it
    starts); the next run's expansion finds and hides it. Within one Sandbox the set is the
    one made when it resolved its policy."""
    project = _project(tmp_path / "project")
    p = run_cli(project, "sh", "-c", "echo NEW > a/b/new.pem && cat a/b/new.pem",
                extra=["--hide-path", "**/*.pem"])
    assert_ok(p)
    assert out(p) == "NEW\n", show(p)
    line = "cat a/b/new.pem 2>/dev/null || echo denied"
    p2 = run_cli(project, "sh", "-c", line, extra=["--hide-path", "**/*.pem"])
    assert_ok(p2)
    assert out(p2) == "denied\n", show(p2)


def test_relative_patterns_follow_the_jail(tmp_path: Path) -> None:
    """A relative entry is the jail's: replaced with another jail (the driver does), the
    pattern is expanded again there; TOML takes the same entries."""
    project = _project(tmp_path / "project")
    other = _project(tmp_path / "other")
    toml = tmp_path / "p.toml"
    toml.write_text(f'jail = "{project}"\nhidden_paths = ["**/.env", "{project}/x.pem"]\n')
    policy = resolve(Policy.from_toml(toml))
    assert policy.hidden_paths == tuple(str(project / r) for r in
                                        (".env", "a/.env", "a/b/.env", "x.pem"))
    moved = resolve(dataclasses.replace(policy, jail=str(other), hidden_paths=("**/.env",)))
    assert moved.hidden_paths == tuple(str(other / r) for r in (".env", "a/.env", "a/b/.env"))
    again = resolve(dataclasses.replace(resolve(Policy(jail=str(project),
                                                       hidden_paths=["**/.env"])),
                                        jail=str(other)))
    assert again.hidden_paths == moved.hidden_paths
    assert again.hidden_paths.patterns == ((f"{other}/**/.env", moved.hidden_paths),)


def _system_root(tmp_path: Path) -> Path:
    """A system root of the test's own (like /etc): a key readable by its owner only, as
    /etc/docker/key.json is, and a directory of them."""
    sysroot = tmp_path / "sysroot"
    (sysroot / "docker").mkdir(parents=True)
    key = sysroot / "docker" / "key.json"
    key.write_text('{"SECRET": "docker"}\n')
    key.chmod(0o600)
    (sysroot / "keys").mkdir()
    (sysroot / "keys" / "a.pem").write_text("SECRET pem\n")
    (sysroot / "public.txt").write_text("public\n")
    return sysroot


def _with_system_root(sysroot: Path) -> list:
    return [x for r in DEFAULT_SYSTEM_ROOTS + (str(sysroot),) for x in ("--system-root", r)]


def test_hidden_paths_inside_system_roots_are_masked(tmp_path: Path) -> None:
    project = _project(tmp_path / "project")
    sysroot = _system_root(tmp_path)
    receipt = tmp_path / "receipt.json"
    reads = (sysroot / "docker" / "key.json", sysroot / "keys" / "a.pem",
             sysroot / "public.txt", "/etc/hostname")
    # negative control: readable unconfined, and inside without the carve-outs
    u = sh(f"cat {sysroot}/docker/key.json {sysroot}/keys/a.pem /etc/hostname")
    assert u.returncode == 0 and b"SECRET" in u.stdout, show(u)
    c = run_cli(project, "python3", "-c", READ, *reads, extra=_with_system_root(sysroot))
    assert_ok(c)
    cst = _statuses(out(c))
    assert cst[str(reads[0])] == '{"SECRET": "docker"}' and cst[str(reads[1])] == "SECRET pem"
    assert cst["/etc/hostname"] not in ("EACCES", "ENOENT"), show(c)
    p = run_cli(project, "python3", "-c", READ, *reads,
                extra=_with_system_root(sysroot)
                + ["--hide-path", sysroot / "docker" / "key.json",
                   "--hide-path", f"{sysroot}/keys/*.pem", "--hide-path", "/etc/hostname",
                   "--receipt", receipt])
    assert_ok(p)
    st = _statuses(out(p))
    assert "SECRET" not in out(p), show(p)
    assert st[str(reads[0])] == st[str(reads[1])] == st["/etc/hostname"] == "EACCES", show(p)
    assert st[str(reads[2])] == "public", show(p)
    r = read_receipt(receipt)
    assert {str(reads[0]), str(reads[1]), "/etc/hostname"} <= set(r["layers"]["mountns"]["masked"])
    # the file on the host is untouched
    assert (sysroot / "docker" / "key.json").read_text() == '{"SECRET": "docker"}\n'


def test_a_hidden_system_directory_and_the_builtin_masks_together(tmp_path: Path) -> None:
    """A hidden directory of a system root (listing refused), an entry that is one of the
    built-in masked secrets (/etc/shadow: masked once), and a system root itself (refused)."""
    project = _project(tmp_path / "project")
    sysroot = _system_root(tmp_path)
    script = (f"ls {sysroot}/keys >/dev/null 2>&1 && echo keys=listed || echo keys=denied; "
              f"cat /etc/shadow >/dev/null 2>&1 && echo shadow=read || echo shadow=denied")
    p = run_cli(project, "sh", "-c", script,
                extra=_with_system_root(sysroot) + ["--hide-path", sysroot / "keys",
                                                    "--hide-path", "/etc/shadow"])
    assert_ok(p)
    assert _statuses(out(p)) == {"keys": "denied", "shadow": "denied"}, show(p)
    c = run_cli(project, "sh", "-c", script, extra=_with_system_root(sysroot))
    assert_ok(c)
    assert _statuses(out(c))["keys"] == "listed", show(c)
    line = _refused(run_cli(project, "true", extra=["--hide-path", "/etc"]))
    assert "is a granted root itself" in line, line
    # read_only_paths stay inside the jail and the granted roots: a system root is read-only
    line = _refused(run_cli(project, "true", extra=["--read-only-path", "/etc/hostname"]))
    assert "read_only_paths" in line and "not inside a granted root" in line, line
