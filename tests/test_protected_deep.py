"""Protected names below a tree nested deeper than Python's stack: the search stays whole.

The search for protected names below the top level (hcp_linux.policy.protected.search) walks
every git directory's ``modules/`` (a submodule named ``a/b`` has its git directory at
``modules/a/b``) and runs again after each run to remove what the run planted. A run can
make a chain of a thousand empty directories there, within the search's budget of
directories: a walk recursing once per level would raise RecursionError, the after-run
search would remove nothing below the top level (``sub/.envrc`` left for direnv), and no
later run in that jail could start. Each case is a real run, its effect checked on the
host's disk afterwards, with a negative control (``allow_write_protected``) where the very
same command's files stay. Runs as root and as nobody (scripts/test-unprivileged).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from hcp_linux import Policy, Sandbox
from hcp_linux.policy.protected import search as protected_search
from sandboxing import TIMEOUT, jail, read_receipt, run_cli, show  # noqa: F401

#: Deeper than the interpreter's recursion limit, and well within the search's budget.
CHAIN = 1100

#: The attack: a repository whose .git/modules holds a chain of CHAIN empty directories,
#: and a direnv file and an editor task planted in a subproject.
PLANT_DEEP = f"""
git init -q . || exit 3
mkdir -p sub/.vscode && echo 'echo planted' > sub/.envrc
echo '{{"tasks":[]}}' > sub/.vscode/tasks.json
mkdir -p .git/modules && cd .git/modules
i=0; while [ $i -lt {CHAIN} ]; do mkdir a && cd a || exit 4; i=$((i+1)); done
echo made
"""

#: The same plant again, in a jail that holds the chain already (the search before the run
#: walks it too).
PLANT_AGAIN = """
mkdir -p sub/.vscode && echo 'echo planted' > sub/.envrc && echo again
"""


def _remove(tree: Path) -> None:
    """rm -rf: shutil.rmtree (pytest's tmp_path clean-up) recurses per level too."""
    subprocess.run(["rm", "-rf", "--", str(tree)], check=True, timeout=TIMEOUT)


@pytest.fixture
def deep_jail(jail: Path) -> Iterator[Path]:
    yield jail
    _remove(jail / ".git")


def _fds() -> list[str]:
    return sorted(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("allowed", [False, True], ids=["protected", "allowed"])
def test_a_chain_under_git_modules_neither_stops_the_sweep_nor_later_runs(
        deep_jail: Path, tmp_path: Path, allowed: bool) -> None:
    assert CHAIN > sys.getrecursionlimit()  # a walk recursing per level would raise
    jail = deep_jail
    opt_out = (".envrc", ".vscode") if allowed else ()
    box = Sandbox(Policy(jail=str(jail), allow_write_protected=opt_out))
    r = box.run(["sh", "-c", PLANT_DEEP], capture_output=True, timeout=60)
    assert r.returncode == 0 and r.stdout == b"made\n", r
    deepest = jail / ".git" / "modules" / "/".join(["a"] * CHAIN)
    assert deepest.is_dir()  # the chain is there, as deep as made
    assert (jail / "sub" / ".envrc").exists() == allowed
    assert (jail / "sub" / ".vscode").exists() == allowed
    sweep = r.receipt.get("protected_sweep", {})
    if allowed:  # negative control: the very same files stay
        assert (jail / "sub" / ".vscode" / "tasks.json").read_text() == '{"tasks":[]}\n'
    else:
        assert sweep.get(str(jail / "sub" / ".envrc")) == "removed", sweep
        assert sweep.get(str(jail / "sub" / ".vscode")) == "removed", sweep
    # where the walk stopped in the chain is said (what lies below was not searched)
    limit = protected_search.MODULES_DEPTH
    assert sweep.get(str(jail), "").startswith(
        f"failed: below the top level, stopped at {jail}/.git/modules/"
        + "/".join(["a"] * (limit + 1)) + f", more than {limit} directories below"), sweep

    # the next run in the jail (the search before it walks the chain) starts, and its
    # planted file goes as well
    r = box.run(["sh", "-c", PLANT_AGAIN], capture_output=True, timeout=60)
    assert r.returncode == 0 and r.stdout == b"again\n", r
    assert (jail / "sub" / ".envrc").exists() == allowed
    assert "more than" in r.receipt.get("protected_search", {}).get(str(jail), ""), r.receipt

    # and through the CLI (a fresh process: a cold search)
    receipt = tmp_path / "r.json"
    c = run_cli(jail, "sh", "-c", PLANT_AGAIN, extra=[
        *[f"--allow-write-protected={n}" for n in opt_out], "--receipt", receipt])
    assert c.returncode == 0 and c.stdout == b"again\n", show(c)
    assert (jail / "sub" / ".envrc").exists() == allowed
    assert "more than" in read_receipt(receipt)["protected_search"][str(jail)]


#: Submodule git directories the run makes a few levels down: a submodule named a/b, its
#: own submodule c/d (modules/a/b/modules/c/d), each with the config and hook git runs.
PLANT_NESTED = r"""
git init -q . || exit 3
for g in .git/modules/a/b .git/modules/a/b/modules/c/d; do
  mkdir -p $g/hooks $g/refs $g/objects && echo 'ref: refs/heads/main' > $g/HEAD
  printf '[core]\n\tfsmonitor = touch pwned\n' > $g/config
  printf '#!/bin/sh\ntouch pwned\n' > $g/hooks/post-checkout
done
echo made
"""


@pytest.mark.parametrize("allowed", [False, True], ids=["protected", "allowed"])
def test_a_nested_submodule_git_directory_the_run_makes_is_swept(jail: Path,
                                                                 allowed: bool) -> None:
    """The walk of .git/modules finds a git directory under a name with slashes (a/b, no
    HEAD in a/) and a submodule's own (a/b/modules/c/d): their config and hooks, made by
    the run, go after it; HEAD stays. Negative control: opted out, they stay."""
    opt_out = (".git/config", ".git/hooks") if allowed else ()
    box = Sandbox(Policy(jail=str(jail), allow_write_protected=opt_out))
    r = box.run(["sh", "-c", PLANT_NESTED], capture_output=True, timeout=60)
    assert r.returncode == 0 and r.stdout == b"made\n", r
    sweep = r.receipt.get("protected_sweep", {})
    for g in (jail / ".git/modules/a/b", jail / ".git/modules/a/b/modules/c/d"):
        assert (g / "HEAD").is_file()
        assert (g / "config").exists() == allowed, sweep
        assert (g / "hooks").exists() == allowed, sweep
        if not allowed:
            assert sweep.get(str(g / "config")) == "removed", sweep
            assert sweep.get(str(g / "hooks")) == "removed", sweep
    assert str(jail) not in sweep, sweep  # the search did not stop


def _submodule_gitdir(g: Path) -> None:
    (g / "refs").mkdir(parents=True)
    (g / "HEAD").write_text("ref: refs/heads/main\n")
    (g / "config").write_text("[core]\n\tbare = false\n")


#: Writes an existing nested submodule's config, and a hook in it; reports which landed.
WRITE_NESTED = r"""
for g in .git/modules/x/y/z .git/modules/x/y/z/modules/w; do
  printf '[core]\n\tfsmonitor = touch pwned\n' >> $g/config 2>/dev/null \
    && echo $g/config=ok || echo $g/config=denied
  mkdir -p $g/hooks 2>/dev/null; printf '#!/bin/sh\n' > $g/hooks/post-checkout 2>/dev/null \
    && echo $g/hook=ok || echo $g/hook=denied
done
"""


@pytest.mark.parametrize("allowed", [False, True], ids=["protected", "allowed"])
def test_an_existing_nested_submodule_git_directory_is_protected(jail: Path,
                                                                 tmp_path: Path,
                                                                 allowed: bool) -> None:
    """Before the run: a submodule named x/y/z (x/ and x/y/ hold no HEAD) and its own
    submodule w, three and five levels below .git/modules: their config is bound read-only,
    their missing hooks get a placeholder. Negative control: opted out, the writes land."""
    made = subprocess.run(["git", "init", "-q", str(jail)], capture_output=True, timeout=TIMEOUT)
    assert made.returncode == 0, made
    outer, inner = jail / ".git/modules/x/y/z", jail / ".git/modules/x/y/z/modules/w"
    _submodule_gitdir(outer)
    _submodule_gitdir(inner)
    extra = ["--allow-write-protected=.git/config",
             "--allow-write-protected=.git/hooks"] if allowed else []
    receipt = tmp_path / "r.json"
    r = run_cli(jail, "sh", "-c", WRITE_NESTED, extra=[*extra, "--receipt", receipt])
    assert r.returncode == 0, show(r)
    want = "ok" if allowed else "denied"
    statuses = dict(line.split("=", 1) for line in r.stdout.decode().splitlines())
    assert statuses == {f"{g}/{what}": want for g in (".git/modules/x/y/z",
                                                     ".git/modules/x/y/z/modules/w")
                        for what in ("config", "hook")}, show(r)
    protected = read_receipt(receipt)["protected"]
    for g in (outer, inner):
        assert ("fsmonitor" in (g / "config").read_text()) == allowed
        assert (g / "hooks" / "post-checkout").exists() == allowed
        if not allowed:
            assert protected[str(g / "config")] == "read-only bind", protected


# --- the search itself, in this process ------------------------------------------------


def _chain(top: Path, depth: int) -> Path:
    """``depth`` nested directories ``a`` below ``top`` (os.makedirs recurses per level)."""
    subprocess.run(["mkdir", "-p", "--", str(top / "/".join(["a"] * depth))], check=True,
                   timeout=TIMEOUT)
    return top / "/".join(["a"] * depth)


def test_the_walk_of_modules_is_bounded_closes_its_fds_and_still_finds_git_dirs(
        tmp_path: Path) -> None:
    """A git directory MODULES_DEPTH levels below .git/modules is found; one a level
    deeper is not, and ``stopped`` says where; a chain of CHAIN levels costs no recursion;
    every fd the walk opened is closed."""
    limit = protected_search.MODULES_DEPTH
    root = tmp_path / "root"
    modules = root / ".git" / "modules"
    try:
        found_at = _chain(modules, limit - 1) / "found"
        lost_at = _chain(modules / "b", limit - 1) / "lost"
        _chain(modules / "c", CHAIN)
        for g in (found_at, lost_at):
            g.mkdir()
            (g / "HEAD").write_text("ref: refs/heads/main\n")
        (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
        before = _fds()
        search = protected_search.Search(str(root), 3, set())
        paths = {p for p, _, _ in search.run()}
        assert _fds() == before
        assert f"{found_at}/config" in paths and f"{found_at}/hooks" in paths, paths
        assert not [p for p in paths if "/lost/" in p], paths
        assert search.stopped.startswith(f"stopped at {lost_at}, more than {limit} "
                                         f"directories below {modules}:"), search.stopped
        assert search.listed < protected_search.SEARCH_BUDGET
    finally:
        _remove(root)


def test_a_wide_modules_directory_stops_at_the_budget_and_closes_its_fds(
        tmp_path: Path) -> None:
    """More directories under .git/modules than SEARCH_BUDGET: the search stops there and
    says so, as it does in the tree, with no fd left open."""
    root = tmp_path / "root"
    modules = root / ".git" / "modules"
    for i in range(protected_search.SEARCH_BUDGET + 8):
        (modules / f"m{i:05}" / "deeper").mkdir(parents=True)
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    before = _fds()
    protected_search._listings.clear()  # cold: every directory read
    search = protected_search.Search(str(root), 3, set())
    search.run()
    assert _fds() == before
    assert search.stopped.startswith(
        f"stopped after {protected_search.SEARCH_BUDGET} directories, at {modules}/"), \
        search.stopped


def test_the_tree_walk_reaches_the_deepest_protect_depth(tmp_path: Path) -> None:
    """The walk of the tree (iterative as well): an .envrc at protect_depth's maximum is
    found, one a level deeper is not, nothing stops, no fd stays open."""
    from hcp_linux.policy.protected import MAX_DEPTH
    root = tmp_path / "root"
    deep = _chain(root, MAX_DEPTH + 1)
    for d in (deep.parent, deep):
        (d / ".envrc").write_text("export A=1\n")
    before = _fds()
    search = protected_search.Search(str(root), MAX_DEPTH, set())
    paths = [p for p, _, _ in search.run()]
    assert _fds() == before
    assert paths == [f"{deep.parent}/.envrc"] and not search.stopped, (paths, search.stopped)
