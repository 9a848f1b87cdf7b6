"""A Policy is a pure value; resolving it is what asks the host (issue 30).

``Policy(...)`` checks each value's form and reads nothing on the host, so the same fields
make the same policy whatever the host holds: checked here with paths that do not exist, a
current directory that was removed, a jail replaced between making and resolving. What the
paths mean is :func:`resolve`'s, which ``Sandbox(policy)`` calls once: the same errors as
before, raised there, before anything is made; only a resolved policy compiles."""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hcp_linux import Policy, PolicyError, Sandbox
from hcp_linux.plan.plan import compile_plan
from hcp_linux.policy.resolve import resolve
from sandboxing import jail, snapshot  # noqa: F401


def test_a_policy_of_paths_that_do_not_exist_is_a_value(tmp_path: Path) -> None:
    gone = tmp_path / "gone"
    kwargs = dict(jail=str(gone), write_roots=(str(gone / "w"),),
                  hidden_paths=("**/.env", "secret.txt"), allow_unix_sockets=(str(gone / "s"),))
    p = Policy(**kwargs)  # type: ignore[arg-type]
    assert not p.resolved
    assert p.jail == str(gone) and p.write_roots == (str(gone / "w"),)
    assert tuple(p.hidden_paths) == ("**/.env", "secret.txt")  # as written
    assert Policy(**kwargs) == p and Policy(**kwargs).digest() == p.digest()  # type: ignore
    assert not gone.exists()  # nothing made
    with pytest.raises(PolicyError, match=r"^jail: .*gone is not an existing directory$"):
        resolve(p)
    # control: the same value resolves once the path is there
    (gone / "w").mkdir(parents=True)
    (gone / "secret.txt").write_text("x")
    os.mkfifo(gone / "s")  # not a socket: refused by name, at resolve
    with pytest.raises(PolicyError, match=r"allow_unix_sockets: .* is not a unix socket"):
        resolve(p)
    r = resolve(dataclasses.replace(p, allow_unix_sockets=()))
    assert r.resolved and r.jail == os.path.realpath(gone)
    assert tuple(r.hidden_paths) == (os.path.realpath(gone / "secret.txt"),)
    assert r.hidden_paths.given == ("**/.env", "secret.txt")


def test_no_current_directory_needed_until_resolved(tmp_path: Path) -> None:
    """A policy without a jail made in a removed directory: a value; resolving it says
    what the current directory is not (in a child, so that this process keeps its cwd)."""
    code = ("import os, sys\n"
            "from hcp_linux import Policy, PolicyError\n"
            "from hcp_linux.policy.resolve import resolve\n"
            "os.chdir(sys.argv[1]); os.rmdir(sys.argv[1])\n"
            "p = Policy()\n"
            "print(p.jail, p.resolved)\n"
            "try:\n    resolve(p)\nexcept PolicyError as e:\n    print(e)\n")
    d = tmp_path / "cwd"
    d.mkdir()
    out = subprocess.run([sys.executable, "-c", code, str(d)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "None False", "jail: not given, and the current directory cannot be used "
        "(No such file or directory)"]


def test_the_jail_means_what_it_named_when_resolved(tmp_path: Path) -> None:
    a, b, link = tmp_path / "a", tmp_path / "b", tmp_path / "jail"
    a.mkdir()
    b.mkdir()
    link.symlink_to(a)
    p = Policy(jail=str(link))
    assert p.jail == str(link)  # as written: no lookup
    first = resolve(p)
    link.unlink()
    link.symlink_to(b)
    second = resolve(p)
    assert (first.jail, second.jail) == (str(a), str(b))
    assert resolve(first) is first  # resolved once: a Sandbox keeps what it resolved
    assert Sandbox(first).policy is first


def test_sandbox_raises_the_path_errors_before_anything(jail: Path, tmp_path: Path) -> None:
    before = snapshot(jail)
    cases = [(Policy(jail=str(tmp_path / "missing")), "jail: "),
             (Policy(jail="/sys"), "jail: "),
             (Policy(jail=str(jail), network="allow", allow_hosts=("example.com",),
                     proxy_log=str(tmp_path / "no-dir" / "log")), "proxy_log: "),
             (Policy(jail=str(jail), read_only_paths=("absent.txt",)), "read_only_paths: ")]
    for policy, prefix in cases:
        with pytest.raises(PolicyError) as info:
            Sandbox(policy)
        assert str(info.value).startswith(prefix) and "\n" not in str(info.value)
    assert snapshot(jail) == before
    assert not (tmp_path / "missing").exists() and not (tmp_path / "no-dir").exists()


def test_host_errors_name_the_file_the_policy_came_from(tmp_path: Path) -> None:
    p = Policy.from_mapping({"jail": str(tmp_path / "missing")}, source="policy file x.toml")
    assert p.source == "policy file x.toml"
    with pytest.raises(PolicyError, match=r"^policy file x\.toml: jail: "):
        resolve(p)


def test_only_a_resolved_policy_compiles(jail: Path) -> None:
    p = Policy(jail=str(jail))
    with pytest.raises(ValueError, match="not resolved"):
        compile_plan(p, ["true"], layers=frozenset())
    plan = compile_plan(resolve(p), ["true"], layers=frozenset())  # control
    plan.close()


def test_a_copy_is_written_again_and_resolves_for_its_own_jail(tmp_path: Path) -> None:
    """dataclasses.replace of a resolved policy gives a written one (patterns kept, host
    facts dropped): resolving it expands the patterns under the new jail."""
    one, two = tmp_path / "one", tmp_path / "two"
    for d in (one, two):
        (d / "sub").mkdir(parents=True)
        (d / "sub" / "k.pem").write_text("k")
    r = resolve(Policy(jail=str(one), hidden_paths=("**/*.pem",)))
    assert tuple(r.hidden_paths) == (str(one / "sub" / "k.pem"),)
    copy = dataclasses.replace(r, jail=str(two))
    assert not copy.resolved and copy.unix_socket_binds == ()
    assert tuple(copy.hidden_paths) == ("**/*.pem",)
    assert tuple(resolve(copy).hidden_paths) == (str(two / "sub" / "k.pem"),)


def test_runtimes_check_their_base_policy_before_making_anything(tmp_path: Path) -> None:
    """A driver or an integration replaces the jail per exec, but checks the base policy's
    paths when it is made: a missing root is refused then, not after a jail was made.
    Control: the same driver with the root present."""
    from hcp_linux.driver.driver import LinuxDriver
    tmp_dir, missing = tmp_path / "tmp", tmp_path / "missing"
    tmp_dir.mkdir()
    base = Policy(write_roots=(str(missing),))  # a value: nothing checked yet
    with pytest.raises(PolicyError, match=r"^write_roots: .*missing is not an existing "):
        LinuxDriver(base, tmp_dir=str(tmp_dir))
    assert os.listdir(tmp_dir) == []
    missing.mkdir()
    LinuxDriver(base, tmp_dir=str(tmp_dir))
