"""Carve-outs inside granted roots: ``read_only_paths`` (``--read-only-path``) and
``hidden_paths`` (``--hide-path``), enforced by the mount view.

Each denial is done for real inside the sandbox (errno printed by the command itself) and its
effect checked absent on disk; each is paired with a negative control, the very same script on
a copy of the project without the carve-outs, where every action succeeds. The file runs under
both executors (``--executor native|ctypes``) and as root and nobody
(``scripts/test-unprivileged``).
"""
from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from hcp_linux import Policy
from hcp_linux.plan.confinement import cache_stats, clear_cache, shared_confinement
from hcp_linux.errors import PolicyError
from hcp_linux.policy.resolve import resolve
from sandboxing import (EXIT_REFUSED, assert_ok, deny_run_cli, out, read_receipt, run_cli,
                        show, single_error_line, snapshot)

#: Runs inside the sandbox (the system python3): one ``name=ok|ERRNO`` line per action.
ACTIONS = r"""
import os, sys
def t(name, fn):
    try:
        fn()
        print(name + "=ok")
    except OSError as e:
        print(name + "=" + __import__("errno").errorcode[e.errno])
def append(path):
    with open(path, "a") as f:
        f.write("changed\n")
"""

READ_ONLY_SCRIPT = ACTIONS + r"""
t("read", lambda: open("guard/f").read())
t("write", lambda: append("guard/f"))
t("create", lambda: open("guard/new", "w").close())
t("unlink", lambda: os.unlink("guard/u"))
t("chmod", lambda: os.chmod("guard/c", 0o600))
t("rename_out", lambda: os.rename("guard/r", "moved"))
t("link_out", lambda: os.link("guard/l", "linked"))
t("rename_sub", lambda: os.rename("guard/sub", "sub2"))
t("rename_self", lambda: os.rename("guard", "guard2"))
t("file_write", lambda: append("conf.txt"))
t("file_rename", lambda: os.rename("conf.txt", "conf2.txt"))
t("deep_write", lambda: append("deep/er/lock"))
t("rename_grandparent_child", lambda: os.rename("deep/er", "er2"))
t("beside", lambda: append("beside.txt"))
t("beside_pinned", lambda: append("deep/other.txt"))
t("rename_parent", lambda: os.rename("deep", "deep2"))
"""
#: Denied with a carve-out, and the errno allowed for each (any of them).
DENIED = {
    "write": {"EROFS"}, "create": {"EROFS"}, "unlink": {"EROFS"}, "chmod": {"EROFS"},
    "rename_out": {"EXDEV", "EROFS"}, "link_out": {"EXDEV", "EROFS"},
    "rename_self": {"EBUSY"}, "rename_sub": {"EXDEV", "EROFS"},
    "file_write": {"EROFS"}, "file_rename": {"EBUSY"},
    "deep_write": {"EROFS"}, "rename_parent": {"EBUSY"},
    "rename_grandparent_child": {"EBUSY", "EXDEV"},
}
ALLOWED = ("read", "beside", "beside_pinned")


def _statuses(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def _project(root: Path) -> Path:
    (root / "guard" / "sub").mkdir(parents=True)
    for name in ("f", "u", "c", "r", "l"):
        (root / "guard" / name).write_text(f"guarded {name}\n")
    os.chmod(root / "guard" / "c", 0o644)
    (root / "guard" / "sub" / "g").write_text("deeper\n")
    (root / "conf.txt").write_text("conf\n")
    (root / "deep" / "er").mkdir(parents=True)
    (root / "deep" / "er" / "lock").write_text("lock\n")
    (root / "beside.txt").write_text("beside\n")
    return root


def _contents(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def test_read_only_paths_refuse_writes_moves_and_links(tmp_path: Path) -> None:
    project = _project(tmp_path / "project")
    control = _project(tmp_path / "control")
    receipt = tmp_path / "receipt.json"
    protected = ("guard", "conf.txt", "deep/er/lock")
    before, data = snapshot(project), _contents(project)
    p = run_cli(project, "python3", "-c", READ_ONLY_SCRIPT,
                extra=[x for path in protected for x in ("--read-only-path", project / path)]
                + ["--receipt", receipt])
    assert_ok(p)
    st = _statuses(out(p))
    for name, errnos in DENIED.items():
        assert st[name] in errnos, (name, show(p))
    for name in ALLOWED:
        assert st[name] == "ok", (name, show(p))
    # on disk: every protected entry as it was (no rename, link, copy-out or write landed)
    after = snapshot(project)
    changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
    assert changed == {"beside.txt", "deep", "deep/other.txt"}, changed  # deep: its mtime
    now = _contents(project)
    for path in ("guard/f", "guard/u", "guard/c", "guard/r", "guard/l", "guard/sub/g",
                 "conf.txt", "deep/er/lock"):
        assert now[path] == data[path], path
    r = read_receipt(receipt)
    carve = r["carve_outs"]
    assert carve["read_only_paths"] == {
        str(project / path): "read-only bind over itself (mount view)" for path in protected}
    assert carve["pinned"] == [str(project / "deep"), str(project / "deep" / "er")]
    assert set(map(str, (project / p for p in protected))) <= \
        set(r["layers"]["mountns"]["read_only"])

    # negative control: the same script, the same tree, no carve-outs: every action succeeds
    c = run_cli(control, "python3", "-c", READ_ONLY_SCRIPT)
    assert_ok(c)
    cst = _statuses(out(c))
    assert all(v == "ok" for v in cst.values()), show(c)
    assert not (control / "guard").exists() and (control / "guard2").exists()
    assert not (control / "deep").exists() and (control / "deep2").exists()


def test_mv_of_a_parent_directory_is_refused(tmp_path: Path) -> None:
    """The `mv` tool itself (rename, and its copy-then-delete fallback) on the carve-out's
    parent, the carve-out and a file in it."""
    project = _project(tmp_path / "project")
    control = _project(tmp_path / "control")
    script = ("mv deep moved-deep; echo parent=$?; mv deep/er/lock lock2; echo file=$?; "
              "mv guard g2; echo self=$?")
    before = _contents(project)
    p = run_cli(project, "sh", "-c", script,
                extra=["--read-only-path", project / "deep" / "er" / "lock",
                       "--read-only-path", project / "guard"])
    assert_ok(p)
    st = _statuses(out(p))
    assert st == {"parent": "1", "file": "1", "self": "1"}, show(p)
    # mv falls back to copy-then-delete across mounts: the copy (a read) lands, the delete
    # does not; the protected file is where it was, unchanged
    now = _contents(project)
    assert now.pop("lock2", b"lock\n") == b"lock\n"
    assert now == before
    assert not (project / "moved-deep").exists()
    c = run_cli(control, "sh", "-c", script)
    assert_ok(c)
    assert _statuses(out(c)) == {"parent": "0", "file": "1", "self": "0"}, show(c)
    assert (control / "moved-deep" / "er" / "lock").exists()  # the parent moved: no pin


HIDDEN_SCRIPT = ACTIONS + r"""
import stat
def show_stat(path):
    st = os.stat(path)
    print(path + ".mode=%o" % stat.S_IMODE(st.st_mode), path + ".size=%d" % st.st_size,
          sep="\n")
def read(path):
    data = open(path).read()
    print(path + ".content=" + data.strip())
t("read_env", lambda: read(".env"))
t("list_secrets", lambda: print("listing=" + ",".join(sorted(os.listdir("secrets")))))
t("read_key", lambda: read("secrets/key"))
t("stat_env", lambda: show_stat(".env"))
t("stat_secrets", lambda: show_stat("secrets"))
t("write_env", lambda: append(".env"))
t("rename_env", lambda: os.rename(".env", "env2"))
t("rename_secrets", lambda: os.rename("secrets", "s2"))
t("read_other", lambda: read("other.txt"))
"""


def _secrets(root: Path) -> Path:
    (root / "secrets").mkdir(parents=True)
    (root / "secrets" / "key").write_text("SECRET-KEY\n")
    (root / ".env").write_text("TOKEN=SECRET-TOKEN\n")
    (root / "other.txt").write_text("other\n")
    return root


@pytest.mark.parametrize("read_only_jail", [False, True], ids=["rw-jail", "ro-jail"])
def test_hidden_paths_are_empty_unreadable_nodes(tmp_path: Path, read_only_jail: bool) -> None:
    project = _secrets(tmp_path / "project")
    control = _secrets(tmp_path / "control")
    receipt = tmp_path / "receipt.json"
    mode = ["--read-only-jail"] if read_only_jail else []
    data = _contents(project)
    p = run_cli(project, "python3", "-c", HIDDEN_SCRIPT,
                extra=mode + ["--hide-path", project / ".env", "--hide-path",
                              project / "secrets", "--receipt", receipt])
    assert_ok(p)
    assert "SECRET" not in out(p) + p.stderr.decode(errors="replace"), show(p)
    st = _statuses(out(p))
    # what a hidden path looks like: stat works and shows an empty mode-000 node
    assert st["read_env"] == "EACCES" and st["list_secrets"] == "EACCES", show(p)
    assert st["read_key"] in ("EACCES", "ENOENT"), show(p)
    assert (st["stat_env"], st[".env.mode"], st[".env.size"]) == ("ok", "0", "0"), show(p)
    assert (st["stat_secrets"], st["secrets.mode"]) == ("ok", "0"), show(p)
    assert st["write_env"] in ("EROFS", "EACCES"), show(p)
    assert {st["rename_env"], st["rename_secrets"]} <= {"EBUSY", "EROFS"}, show(p)
    assert st["read_other"] == "ok" and st["other.txt.content"] == "other", show(p)
    assert _contents(project) == data
    r = read_receipt(receipt)
    assert set(r["carve_outs"]["hidden_paths"]) == {str(project / ".env"),
                                                    str(project / "secrets")}
    assert {str(project / ".env"), str(project / "secrets")} <= set(
        r["layers"]["mountns"]["masked"])

    # negative control: the same script sees everything
    c = run_cli(control, "python3", "-c", HIDDEN_SCRIPT, extra=mode)
    assert_ok(c)
    cst = _statuses(out(c))
    assert cst[".env.content"] == "TOKEN=SECRET-TOKEN" and cst["listing"] == "key", show(c)
    assert cst["secrets/key.content"] == "SECRET-KEY", show(c)


def test_hidden_file_inside_read_only_path(tmp_path: Path) -> None:
    """Both kinds nested: the read-only bind first (by depth), the mask over it."""
    project = _secrets(tmp_path / "project")
    p = run_cli(project, "python3", "-c", HIDDEN_SCRIPT,
                extra=["--read-only-path", project / "secrets",
                       "--hide-path", project / "secrets" / "key"])
    assert_ok(p)
    st = _statuses(out(p))
    assert st["listing"] == "key" and st["read_key"] == "EACCES", show(p)
    assert "SECRET-KEY" not in out(p)


def _refused(p) -> str:  # type: ignore[no-untyped-def]
    assert p.returncode == EXIT_REFUSED, show(p)
    return single_error_line(p)


def test_missing_outside_and_root_carve_outs_are_refused(tmp_path: Path) -> None:
    project = _secrets(tmp_path / "project")
    outside = tmp_path / "outside"
    outside.mkdir()
    before = snapshot(project)
    line = _refused(run_cli(project, "true", extra=["--read-only-path", project / ".git"]))
    assert "read_only_paths" in line and "create it first" in line, line
    assert snapshot(project) == before  # nothing pre-created
    line = _refused(run_cli(project, "true", extra=["--hide-path", outside]))
    assert "hidden_paths" in line and "not inside a granted root" in line, line
    line = _refused(run_cli(project, "true", extra=["--hide-path", project]))
    assert "is a granted root itself" in line, line
    line = _refused(run_cli(project, "true", extra=["--hide-path", "/proc/self/environ"]))
    assert "hidden_paths" in line, line
    line = _refused(run_cli(project, "true", extra=["--hide-path", project / ".env",
                                                    "--read-only-path", project / ".env"]))
    assert "hidden_paths" in line and "read_only_paths too" in line, line
    with pytest.raises(PolicyError, match="native-local has none"):
        resolve(Policy(jail=str(project), sandbox=False, native_local=True,
                       hidden_paths=(str(project / ".env"),)))


def test_without_a_mount_view_carve_outs_refuse_the_run(tmp_path: Path) -> None:
    """Fail closed: no mount namespace (unshare denied), mountns allowed to degrade, and
    still refused; the same run without the carve-out goes ahead (the control)."""
    project = _secrets(tmp_path / "project")
    p = deny_run_cli(["unshare"], errno.EPERM, project, "cat", ".env",
                     extra=["--allow-degraded", "namespaces", "--hide-path", project / ".env"])
    line = _refused(p)
    assert "hidden_paths" in line and "mount view" in line, line
    assert b"SECRET" not in p.stdout
    c = deny_run_cli(["unshare"], errno.EPERM, project, "cat", ".env",
                     extra=["--allow-degraded", "namespaces"])
    assert_ok(c)
    assert out(c) == "TOKEN=SECRET-TOKEN\n"


def test_toml_keys_and_canonical_paths(tmp_path: Path) -> None:
    project = _secrets(tmp_path / "project")
    # a link outside every writable root is followed once, here (one inside the jail is
    # refused: test_pinned_paths.py)
    os.symlink(project / "secrets", tmp_path / "link")
    toml = tmp_path / "p.toml"
    toml.write_text(f'jail = "{project}"\nread_only_paths = ["{tmp_path}/link"]\n'
                    f'hidden_paths = ["{project}/.env", "{project}/.env"]\n')
    policy = resolve(Policy.from_toml(toml))
    assert policy.read_only_paths == (str(project / "secrets"),)
    assert policy.hidden_paths == (str(project / ".env"),)


def test_the_confinement_is_cached_per_carve_outs(tmp_path: Path) -> None:
    """Carve-outs are in the cache key: a repeat reuses, a different set makes anew."""
    project = _secrets(tmp_path / "project")
    layers = frozenset({"userns", "mountns"})
    plain = resolve(Policy(jail=str(project)))
    carved = resolve(plain.replace(hidden_paths=(str(project / ".env"),),
                                   read_only_paths=(str(project / "secrets"),)))
    clear_cache()
    a = shared_confinement(carved, (), layers, ())
    reused = cache_stats["reused"]
    b = shared_confinement(carved, (), layers, ())
    assert b is a and cache_stats["reused"] == reused + 1
    c = shared_confinement(plain, (), layers, ())
    assert c is not a
    assert (os.fsencode(project / ".env"), False) in a.masks
    assert (os.fsencode(project / ".env"), False) not in c.masks
    assert [bd.target for bd in a.binds if bd.target == os.fsencode(project / "secrets")]
    # a carve-out replaced on disk (file -> directory) is noticed: a new confinement
    (project / ".env").unlink()
    (project / ".env").mkdir()
    d = shared_confinement(carved, (), layers, ())
    assert d is not a and (os.fsencode(project / ".env"), True) in d.masks
