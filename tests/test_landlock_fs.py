"""Filesystem rights enforced by the real kernel, each denial paired with a control.

Each test builds allowed/ and denied/ siblings in tmp_path, enforces in a forked child, and
compares with the same actions in an unrestricted child (the control).
"""
from __future__ import annotations

import errno
import os
import socket
import subprocess
from functools import partial
from typing import Callable, Mapping

import pytest

from hcp_linux import landlock
from hcp_linux.landlock import ACCESS_FS_READ_WRITE, AccessFs, FactKind, Ruleset, RulesetStatus
from test_landlock_helpers import (ABI, OK, append, child, copy_true, elf_interpreter, enforced,
                                   err, make_tree, needs_abi, read, write_file)

pytestmark = needs_abi(1)


Actions = Mapping[str, Callable[[], object]]


def outcomes(actions: Actions) -> Callable[[], dict[str, int]]:
    """A child body running each action and reporting its errno (0 = success)."""
    return lambda: {name: err(fn) for name, fn in actions.items()}


def both(created: landlock.CreatedRuleset, make_actions: Callable[[], Actions]
         ) -> tuple[dict[str, int], dict[str, int]]:
    """(unrestricted, restricted) outcomes of freshly made actions (each run gets new names)."""
    free = child(outcomes(make_actions()))
    jailed = enforced(created, outcomes(make_actions()))
    return free, jailed


def test_read(tmp_path: os.PathLike[str]) -> None:
    allowed, denied = make_tree(tmp_path)
    rs = Ruleset(handled_fs=landlock.ACCESS_FS_READ).add_path(allowed, landlock.ACCESS_FS_READ)
    actions = lambda: {  # noqa: E731
        "read allowed": lambda: read(os.path.join(allowed, "f")),
        "list allowed": lambda: os.listdir(allowed),
        "read denied": lambda: read(os.path.join(denied, "f")),
        "list denied": lambda: os.listdir(denied),
    }
    with rs.create() as created:
        free, jailed = both(created, actions)
    assert free == dict.fromkeys(free, OK)
    assert jailed == {"read allowed": OK, "list allowed": OK,
                      "read denied": errno.EACCES, "list denied": errno.EACCES}


def test_write(tmp_path: os.PathLike[str]) -> None:
    allowed, denied = make_tree(tmp_path)
    rs = Ruleset(handled_fs=AccessFs.WRITE_FILE).add_path(allowed, AccessFs.WRITE_FILE)
    actions = lambda: {  # noqa: E731
        "allowed": lambda: append(os.path.join(allowed, "f")),
        "denied": lambda: append(os.path.join(denied, "f")),
        "read denied": lambda: read(os.path.join(denied, "f")),  # not handled: still allowed
    }
    with rs.create() as created:
        free, jailed = both(created, actions)
    assert free == dict.fromkeys(free, OK)
    assert jailed == {"allowed": OK, "denied": errno.EACCES, "read denied": OK}


def _run(path: str) -> None:
    subprocess.run([path], check=True, stdin=subprocess.DEVNULL)


def test_exec_needs_the_elf_interpreter(tmp_path: os.PathLike[str]) -> None:
    """EXECUTE must cover the program *and* its ELF interpreter (opened with FMODE_EXEC).

    The interpreter's directory is taken after resolving symlinks: on a merged-/usr Debian,
    /lib64/ld-linux-x86-64.so.2 is a link into /usr/lib/x86_64-linux-gnu, and Landlock
    judges the file actually opened.
    """
    bindir = os.path.join(tmp_path, "bin")
    os.mkdir(bindir)
    prog = copy_true(bindir)
    interp = elf_interpreter(prog)
    if interp is None:
        pytest.skip("true is not a dynamic 64-bit ELF")
    interp_dir = os.path.dirname(os.path.realpath(interp))
    assert child(lambda: err(lambda: _run(prog))) == OK  # control

    def jail(*dirs: str) -> landlock.CreatedRuleset:
        rs = Ruleset(handled_fs=AccessFs.EXECUTE)
        for d in dirs:
            rs.add_path(d, AccessFs.EXECUTE)
        return rs.create()

    with jail(bindir) as created:  # the program, but not ld.so
        assert enforced(created, lambda: err(lambda: _run(prog))) == errno.EACCES
    with jail(bindir, interp_dir) as created:  # both
        assert enforced(created, lambda: err(lambda: _run(prog))) == OK
    with jail(interp_dir) as created:  # ld.so, but not the program
        assert enforced(created, lambda: err(lambda: _run(prog))) == errno.EACCES
    link_dir = os.path.dirname(interp)  # e.g. /lib64, before resolving
    if os.path.realpath(link_dir) != interp_dir:
        with jail(bindir, link_dir) as created:  # the symlink's directory is not enough
            assert enforced(created, lambda: err(lambda: _run(prog))) == errno.EACCES


@needs_abi(3)
def test_truncate(tmp_path: os.PathLike[str]) -> None:
    allowed, denied = make_tree(tmp_path)
    rs = Ruleset(handled_fs=AccessFs.TRUNCATE).add_path(allowed, AccessFs.TRUNCATE)
    actions = lambda: {  # noqa: E731
        "truncate allowed": lambda: os.truncate(os.path.join(allowed, "f"), 1),
        "truncate denied": lambda: os.truncate(os.path.join(denied, "f"), 1),
        "O_TRUNC denied": lambda: write_file(os.path.join(denied, "f")),
        "append denied": lambda: append(os.path.join(denied, "f")),  # no O_TRUNC: allowed
    }
    with rs.create() as created:
        free, jailed = both(created, actions)
    assert free == dict.fromkeys(free, OK)
    assert jailed == {"truncate allowed": OK, "truncate denied": errno.EACCES,
                      "O_TRUNC denied": errno.EACCES, "append denied": OK}


def _refer_actions(root: str) -> Callable[[], Actions]:
    """Fresh files per run: a/ and b/ under root; rename and link across them, and in place."""
    counter = iter(range(1000))

    def make() -> Actions:
        n = next(counter)
        a, b = os.path.join(root, "a"), os.path.join(root, "b")
        for d in (a, b):
            os.makedirs(d, exist_ok=True)
        for name in (f"r{n}", f"l{n}", f"s{n}"):
            write_file(os.path.join(a, name))
        return {
            "rename across": lambda: os.rename(os.path.join(a, f"r{n}"), os.path.join(b, f"r{n}")),
            "link across": lambda: os.link(os.path.join(a, f"l{n}"), os.path.join(b, f"l{n}")),
            "rename in place": lambda: os.rename(os.path.join(a, f"s{n}"),
                                                 os.path.join(a, f"s{n}.new")),
        }
    return make


@needs_abi(2)
@pytest.mark.parametrize("refer", ["allowed", "handled, not allowed", "not handled"])
def test_refer(tmp_path: os.PathLike[str], refer: str) -> None:
    """Cross-directory rename/link is EXDEV unless a rule allows REFER; even when REFER is not
    handled at all the kernel denies reparenting (it is implicitly handled)."""
    root = str(tmp_path)
    base = AccessFs.MAKE_REG | AccessFs.REMOVE_FILE
    handled = base if refer == "not handled" else base | AccessFs.REFER
    rs = Ruleset(handled_fs=handled)
    rs.add_path(root, base | AccessFs.REFER if refer == "allowed" else base)
    with rs.create() as created:
        free, jailed = both(created, _refer_actions(root))
    assert free == dict.fromkeys(free, OK)
    across = OK if refer == "allowed" else errno.EXDEV
    assert jailed == {"rename across": across, "link across": across, "rename in place": OK}


def _unix_bind(path: str) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(path)


def _make_actions(where: str, p: str) -> Actions:
    return {
        f"mkdir {where}": lambda: os.mkdir(p + "d"),
        f"mkfifo {where}": lambda: os.mkfifo(p + "p"),
        f"symlink {where}": lambda: os.symlink("f", p + "l"),
        f"bind {where}": lambda: _unix_bind(p + "s"),
        f"create {where}": lambda: write_file(p + "r"),
    }


def test_make_rights(tmp_path: os.PathLike[str]) -> None:
    allowed, denied = make_tree(tmp_path)
    make = (AccessFs.MAKE_DIR | AccessFs.MAKE_FIFO | AccessFs.MAKE_SYM | AccessFs.MAKE_SOCK
            | AccessFs.MAKE_REG)
    rs = Ruleset(handled_fs=make).add_path(allowed, make)
    counter = iter(range(1000))

    def actions() -> Actions:
        n = next(counter)
        out: dict[str, Callable[[], object]] = {}
        for where, d in (("allowed", allowed), ("denied", denied)):
            out.update(_make_actions(where, os.path.join(d, f"{n}")))
        return out
    with rs.create() as created:
        free, jailed = both(created, actions)
    assert free == dict.fromkeys(free, OK)
    assert {k: v for k, v in jailed.items() if "allowed" in k} == {
        k: OK for k in jailed if "allowed" in k}
    assert {k: v for k, v in jailed.items() if "denied" in k} == {
        k: errno.EACCES for k in jailed if "denied" in k}


def test_remove(tmp_path: os.PathLike[str]) -> None:
    allowed, denied = make_tree(tmp_path)
    rights = AccessFs.REMOVE_FILE | AccessFs.REMOVE_DIR
    rs = Ruleset(handled_fs=rights).add_path(allowed, rights)
    counter = iter(range(1000))

    def actions() -> Actions:
        n = next(counter)
        out: dict[str, Callable[[], object]] = {}
        for where, d in (("allowed", allowed), ("denied", denied)):
            f, sub = os.path.join(d, f"file{n}"), os.path.join(d, f"dir{n}")
            write_file(f)
            os.mkdir(sub)
            out[f"unlink {where}"] = partial(os.unlink, f)
            out[f"rmdir {where}"] = partial(os.rmdir, sub)
        return out
    with rs.create() as created:
        free, jailed = both(created, actions)
    assert free == dict.fromkeys(free, OK)
    assert jailed == {"unlink allowed": OK, "rmdir allowed": OK,
                      "unlink denied": errno.EACCES, "rmdir denied": errno.EACCES}


def test_file_rule_strips_dir_rights_and_works(tmp_path: os.PathLike[str]) -> None:
    """A rule on a single file: dir-only rights are stripped (recorded, status unchanged) and
    the file is usable while its sibling is not."""
    allowed, denied = make_tree(tmp_path)
    target, sibling = os.path.join(allowed, "f"), os.path.join(allowed, "g")
    write_file(sibling)
    handled = AccessFs.from_abi(ABI)
    rs = Ruleset(handled_fs=ACCESS_FS_READ_WRITE).add_path(target, ACCESS_FS_READ_WRITE)
    with rs.create() as created:
        stripped = [f for f in created.facts if f.kind is FactKind.DIR_RIGHTS_STRIPPED]
        assert [(f.subject, f.bits) for f in stripped] == [
            (target, int(landlock.DIR_ONLY_RIGHTS & handled))]
        assert created.status is RulesetStatus.FULLY_ENFORCED \
            or ABI < AccessFs.introduced_in(ACCESS_FS_READ_WRITE)  # RESOLVE_UNIX: ABI 9
        actions = lambda: {  # noqa: E731
            "read file": lambda: read(target), "append file": lambda: append(target),
            "read sibling": lambda: read(sibling), "append sibling": lambda: append(sibling),
        }
        free, jailed = both(created, actions)
    assert free == dict.fromkeys(free, OK)
    assert jailed == {"read file": OK, "append file": OK,
                      "read sibling": errno.EACCES, "append sibling": errno.EACCES}


def test_rules_only_add(tmp_path: os.PathLike[str]) -> None:
    """A read-only rule nested under a writable one does not take write away."""
    allowed, _ = make_tree(tmp_path)
    inner = os.path.join(allowed, "inner")
    os.mkdir(inner)
    write_file(os.path.join(inner, "f"))
    rights = AccessFs.READ_FILE | AccessFs.WRITE_FILE
    rs = Ruleset(handled_fs=rights).add_path(allowed, rights).add_path(inner, AccessFs.READ_FILE)
    with rs.create() as created:
        assert enforced(created, lambda: err(lambda: append(os.path.join(inner, "f")))) == OK


def test_symlinked_path_rule_follows_target(tmp_path: os.PathLike[str]) -> None:
    """add_path follows symlinks: the rule lands on the target directory."""
    allowed, denied = make_tree(tmp_path)
    link = os.path.join(tmp_path, "link")
    os.symlink(allowed, link)
    rs = Ruleset(handled_fs=AccessFs.WRITE_FILE).add_path(link, AccessFs.WRITE_FILE)
    with rs.create() as created:
        got = enforced(created, lambda: (err(lambda: append(os.path.join(allowed, "f"))),
                                         err(lambda: append(os.path.join(denied, "f")))))
    assert got == (OK, errno.EACCES)


def test_a_copy_makes_the_same_ruleset_again(tmp_path: os.PathLike[str]) -> None:
    """Ruleset.copy() (how a cached plan makes a fresh kernel ruleset per run): each copy
    creates and enforces the same rules, the fds stay the caller's, the original stays usable."""
    allowed, denied = make_tree(tmp_path)
    fd = os.open(allowed, os.O_PATH | os.O_CLOEXEC)
    try:
        template = Ruleset(handled_fs=landlock.ACCESS_FS_READ).add_path(fd, landlock.ACCESS_FS_READ)
        actions = lambda: {  # noqa: E731
            "read allowed": lambda: read(os.path.join(allowed, "f")),
            "read denied": lambda: read(os.path.join(denied, "f")),
        }
        for _ in range(2):
            with template.copy().create() as created:
                free, jailed = both(created, actions)
            assert free == dict.fromkeys(free, OK)
            assert jailed == {"read allowed": OK, "read denied": errno.EACCES}
        os.fstat(fd)  # still open: a copy borrows
        owning = Ruleset(handled_fs=landlock.ACCESS_FS_READ).add_path(allowed,
                                                                       landlock.ACCESS_FS_READ)
        with pytest.raises(landlock.RulesetError):
            owning.copy()
        owning.close()
    finally:
        os.close(fd)
