"""A read-only jail (``Policy.read_only_jail``, ``--read-only-jail``), enforced by the kernel.

The jail stays the working directory but is granted like a read-only root: bound read-only in
the mount view and given read/execute rights only by Landlock. The command reads and lists
its project and writes only its private /tmp (and any write roots). Every denial is checked
on disk (the jail's entries, sizes, modes and mtimes unchanged) and paired with a negative
control: the very same script with a writable jail, which changes all of it.
"""
from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest

from hcp_linux import Policy, Sandbox
from hcp_linux.errors import PolicyError
from sandboxing import (EXIT_REFUSED, TIMEOUT, assert_ok, deny_run_cli, out, read_receipt,
                        run_cli, show, single_error_line, snapshot)

#: One line per action, ``name=<exit status>``; each action works on its own file so that the
#: control (everything succeeds) does not change what a later action sees.
SCRIPT = r"""
cat data.txt >/dev/null; echo read=$?
ls . >/dev/null; echo list=$?
(echo new > new.txt) 2>/dev/null; echo create=$?
(echo more >> mod.txt) 2>/dev/null; echo modify=$?
truncate -s 0 trunc.txt 2>/dev/null; echo truncate=$?
rm del.txt 2>/dev/null; echo delete=$?
mv ren.txt renamed.txt 2>/dev/null; echo rename=$?
ln data.txt hard.txt 2>/dev/null; echo link=$?
ln -s data.txt soft.txt 2>/dev/null; echo symlink=$?
mkdir sub 2>/dev/null; echo mkdir=$?
chmod 600 ch.txt 2>/dev/null; echo chmod=$?
touch -d 2001-01-01 utime.txt 2>/dev/null; echo utime=$?
echo t > "$TMPDIR/t" && test "$(cat "$TMPDIR/t")" = t; echo tmp=$?
echo h > "$HOME/h" && test "$(cat "$HOME/h")" = h; echo home=$?
pwd
"""
READS = ("read", "list", "tmp", "home")
WRITES = ("create", "modify", "truncate", "delete", "rename", "link", "symlink", "mkdir",
          "chmod", "utime")
#: Metadata writes Landlock does not mediate (without a mount view they are not prevented:
#: receipt.LOST["mountns"] says so).
METADATA = ("chmod", "utime")


def _project(root: Path) -> Path:
    """A jail holding one file per action of SCRIPT."""
    root.mkdir()
    for name in ("data", "mod", "trunc", "del", "ren", "ch", "utime"):
        (root / f"{name}.txt").write_text(f"{name}\n")
    os.chmod(root / "ch.txt", 0o644)
    return root


def _statuses(p: subprocess.CompletedProcess) -> dict[str, int]:
    lines = out(p).splitlines()
    return {k: int(v) for k, _, v in (line.partition("=") for line in lines if "=" in line)}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return _project(tmp_path / "project")


@pytest.fixture
def control(tmp_path: Path) -> Path:
    return _project(tmp_path / "control")


def test_reads_and_lists_but_writes_nothing(project: Path, control: Path,
                                            tmp_path: Path) -> None:
    before = snapshot(project)
    receipt = tmp_path / "receipt.json"
    p = run_cli(project, "sh", "-c", SCRIPT, extra=["--read-only-jail", "--receipt", receipt])
    assert_ok(p)
    st = _statuses(p)
    assert {k: st[k] for k in READS} == dict.fromkeys(READS, 0), show(p)
    assert all(st[k] != 0 for k in WRITES), show(p)
    assert out(p).splitlines()[-1] == str(project)  # the cwd is the jail
    assert snapshot(project) == before  # on disk: nothing created, changed or removed
    r = read_receipt(receipt)
    assert r["jail"] == {"path": str(project), "access": "read-only", "tmp": "/tmp",
                       "enforced_by": ["mountns", "landlock"]}
    view = r["layers"]["mountns"]
    assert str(project) in view["read_only"] and str(project) not in view["read_write"]

    # negative control: the same script, the jail writable, changes every one of them
    before = snapshot(control)
    c = run_cli(control, "sh", "-c", SCRIPT, extra=["--receipt", receipt])
    assert_ok(c)
    assert _statuses(c) == dict.fromkeys(READS + WRITES, 0), show(c)
    after = snapshot(control)
    assert {"new.txt", "hard.txt", "soft.txt", "sub", "renamed.txt"} <= set(after)
    assert "del.txt" not in after and "ren.txt" not in after
    for name in ("mod.txt", "trunc.txt", "ch.txt", "utime.txt"):
        assert after[name] != before[name], name
    assert read_receipt(receipt)["jail"]["access"] == "read-write"


def test_policy_file_key(project: Path, tmp_path: Path) -> None:
    """``read_only_jail = true`` in a --policy file (Policy.from_mapping takes every field)."""
    policy = tmp_path / "policy.toml"
    policy.write_text(f'jail = "{project}"\nread_only_jail = true\n')
    before = snapshot(project)
    p = run_cli(None, "sh", "-c", "cat data.txt; echo x > new.txt; echo w=$?",
                extra=["--policy", policy])
    assert_ok(p)
    assert out(p).splitlines() == ["data", "w=2"], show(p)
    assert snapshot(project) == before
    policy.write_text(f'jail = "{project}"\nread_only_jail = "yes"\n')
    p = run_cli(None, "true", extra=["--policy", policy])
    assert p.returncode == EXIT_REFUSED, show(p)
    assert "read_only_jail: expected true or false" in single_error_line(p)


def test_read_only_jail_inside_a_write_root_is_refused(tmp_path: Path) -> None:
    """Landlock only adds rights: a read-only jail inside a writable root would be writable.
    Refused like a read-only root there; nothing runs."""
    outer = tmp_path / "outer"
    outer.mkdir()
    jail = _project(outer / "jail")
    for write_root in (outer, jail):
        p = run_cli(jail, "sh", "-c", "echo ran > ran",
                    extra=["--read-only-jail", "--write-root", write_root])
        assert p.returncode == EXIT_REFUSED, show(p)
        line = single_error_line(p)
        assert f"read-only jail {jail} is inside writable root {write_root}" in line, line
        assert not (jail / "ran").exists() and not (outer / "ran").exists()
    with pytest.raises(PolicyError, match="read-only jail"):
        Sandbox(Policy(jail=str(jail), read_only_jail=True, write_roots=(str(outer),)))


def test_write_root_inside_the_read_only_jail_is_a_carve_in(project: Path) -> None:
    """A writable root inside a read-only jail (a build dir in a read-only checkout) is
    allowed, as inside any read-only root: writes land there and nowhere else."""
    out_dir = project / "out"
    out_dir.mkdir()
    before = snapshot(project)
    p = run_cli(project, "sh", "-c", "echo a > out/a.txt; echo in=$?; echo b > b.txt; "
                "echo jail=$?", extra=["--read-only-jail", "--write-root", out_dir])
    assert_ok(p)
    assert out(p).splitlines() == ["in=0", "jail=2"], show(p)
    assert (out_dir / "a.txt").read_text() == "a\n"
    after = snapshot(project)
    del after["out/a.txt"]
    assert after.keys() == before.keys() and not (project / "b.txt").exists()


def test_the_flag_is_part_of_the_cached_confinement(project: Path) -> None:
    """Two in-process runs with the same roots, writable then read-only: the second must not
    reuse the first's confinement (the cache key includes the flag), nor the reverse."""
    script = "echo x > new.txt; echo w=$?"
    writable = Sandbox(Policy(jail=str(project))).run(["sh", "-c", script],
                                                      capture_output=True, timeout=TIMEOUT)
    assert writable.stdout == b"w=0\n", writable
    (project / "new.txt").unlink()
    before = snapshot(project)
    ro = Sandbox(Policy(jail=str(project), read_only_jail=True)).run(
        ["sh", "-c", script], capture_output=True, timeout=TIMEOUT)
    assert ro.stdout == b"w=2\n", ro
    assert snapshot(project) == before
    again = Sandbox(Policy(jail=str(project))).run(["sh", "-c", script], capture_output=True,
                                                   timeout=TIMEOUT)
    assert again.stdout == b"w=0\n", again


# --- without a mount view: Landlock alone, and the private tmp outside the jail ------------


def test_no_mount_view_landlock_refuses_writes(project: Path, control: Path,
                                               tmp_path: Path) -> None:
    """unshare denied (a host without namespaces), namespaces allowed to degrade: Landlock
    alone keeps the jail read-only, and HOME/TMPDIR go to the first write root, never into
    the jail."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    receipt = tmp_path / "receipt.json"
    before = snapshot(project)
    p = deny_run_cli(["unshare"], errno.EPERM, project, "sh", "-c", SCRIPT,
                     extra=["--allow-degraded", "namespaces", "--read-only-jail",
                            "--write-root", scratch, "--receipt", receipt])
    assert_ok(p)
    st = _statuses(p)
    assert {k: st[k] for k in READS} == dict.fromkeys(READS, 0), show(p)
    assert all(st[k] != 0 for k in WRITES if k not in METADATA), show(p)
    # chmod and utime are not Landlock's to refuse: their files are left out of the check
    metadata_files = ("ch.txt", "utime.txt")
    after = snapshot(project)
    assert {k: v for k, v in after.items() if k not in metadata_files} == \
        {k: v for k, v in before.items() if k not in metadata_files}
    r = read_receipt(receipt)
    assert r["layers"]["mountns"]["status"] == "degraded"
    assert r["layers"]["landlock"]["status"] == "enforced"
    assert r["jail"] == {"path": str(project), "access": "read-only",
                         "tmp": str(scratch / ".hcp-tmp"), "enforced_by": ["landlock"]}
    assert (scratch / ".hcp-tmp" / "t").read_text() == "t\n"

    # negative control: the same host, the jail writable
    c = deny_run_cli(["unshare"], errno.EPERM, control, "sh", "-c", SCRIPT,
                     extra=["--allow-degraded", "namespaces"])
    assert_ok(c)
    assert _statuses(c) == dict.fromkeys(READS + WRITES, 0), show(c)
    assert (control / "new.txt").exists() and (control / ".hcp-tmp" / "t").exists()


def test_no_mount_view_and_no_write_root_is_refused(project: Path) -> None:
    """With no mount view there is no private /tmp; a read-only jail cannot hold one, and
    without a write root there is no place: refused, nothing runs or is created."""
    before = snapshot(project)
    p = deny_run_cli(["unshare"], errno.EPERM, project, "sh", "-c", "echo ran > /tmp/ran-$$",
                     extra=["--allow-degraded", "namespaces", "--read-only-jail"])
    assert p.returncode == EXIT_REFUSED, show(p)
    line = single_error_line(p)
    assert "read_only_jail" in line and "--write-root" in line, line
    assert p.stdout == b""
    assert snapshot(project) == before  # no .hcp-tmp made in the jail


LANDLOCK_SYSCALLS = ("landlock_create_ruleset", "landlock_add_rule", "landlock_restrict_self")


def test_nothing_to_enforce_it_the_receipt_says_so(project: Path, tmp_path: Path) -> None:
    """Neither a mount view nor Landlock (both denied, both allowed to degrade, as for any
    read-only root): the receipt must not claim the jail is read-only."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    receipt = tmp_path / "receipt.json"
    p = deny_run_cli(["unshare", *LANDLOCK_SYSCALLS], errno.EPERM, project, "sh", "-c",
                     "echo ran > ran", extra=["--allow-degraded", "namespaces",
                                              "--allow-degraded", "landlock",
                                              "--read-only-jail", "--write-root", scratch,
                                              "--receipt", receipt])
    assert_ok(p)
    r = read_receipt(receipt)
    assert r["layers"]["landlock"]["status"] == r["layers"]["mountns"]["status"] == "degraded"
    assert r["jail"]["enforced_by"] == []
    assert r["jail"]["access"].startswith("read-write: read-only asked, but neither")
    assert (project / "ran").exists()  # what the receipt says: only permissions remained


def test_native_local_says_nothing_is_enforced(project: Path, tmp_path: Path) -> None:
    """Native-local confines nothing: the receipt says so, and the driver's own tmp still
    goes to the write root, never into the read-only jail."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    receipt = tmp_path / "receipt.json"
    before = snapshot(project)
    p = run_cli(project, "sh", "-c", 'echo "$TMPDIR"', extra=[
        "--no-sandbox", "--native-local", "--read-only-jail", "--write-root", scratch,
        "--receipt", receipt])
    assert_ok(p)
    assert out(p).strip() == str(scratch / ".hcp-tmp")
    assert read_receipt(receipt)["jail"]["access"].startswith("read-write: native-local")
    assert snapshot(project) == before
