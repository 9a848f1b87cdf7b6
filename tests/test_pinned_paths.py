"""An earlier run never steers a later one: no path of a policy means what a command made it
mean (DESIGN.md §3, §8; docs/policy.md, "Paths a command can change").

Agents run many commands in one jail. Each test is two runs: the first, confined, tampers
with an entry inside a writable root (a symlink where a granted directory, carve-out or socket
was; a renamed parent); the second, with the same policy made afresh as every CLI run makes
it, is refused (exit 125, one line naming the entry) and its target is untouched on the host.
Each has a negative control: the same second run over an untampered tree does what the
policy says (writes land, the secret is hidden, the socket connects). A reused ``Sandbox``
(one Policy object, its cached confinement) refuses the same way. Runs under both executors
and as root and nobody (scripts/test-unprivileged).
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from hcp_linux import Policy, Sandbox
from hcp_linux.errors import PolicyError
from hcp_linux.policy.values import symlinks_followed, unpinned_link
from sandboxing import (EXIT_REFUSED, TIMEOUT, assert_ok, jail, out, outside,  # noqa: F401
                        accepted_unix, listen_unix, run_cli, show, single_error_line)


def _refused(p: subprocess.CompletedProcess, *words: str) -> str:
    assert p.returncode == EXIT_REFUSED, show(p)
    line = single_error_line(p)
    for w in words:
        assert w in line, line
    return line


# --- the resolution rule itself --------------------------------------------------------


def test_symlinks_followed_lists_each_link_where_it_lies(tmp_path: Path) -> None:
    (tmp_path / "real" / "sub").mkdir(parents=True)
    (tmp_path / "a").symlink_to("real")
    (tmp_path / "real" / "b").symlink_to(tmp_path / "real" / "sub")
    links = symlinks_followed(str(tmp_path / "a" / "b" / "missing"))
    assert links == [str(tmp_path / "a"), str(tmp_path / "real" / "b")]
    assert unpinned_link(str(tmp_path / "a" / "b"), (str(tmp_path / "real"),)) == \
        (str(tmp_path / "real" / "b"), str(tmp_path / "real"))
    # a link outside every writable root is the user's, not a command's: followed
    assert unpinned_link(str(tmp_path / "a"), (str(tmp_path / "real"),)) is None


def test_a_symlink_loop_is_refused_not_followed_forever(tmp_path: Path) -> None:
    (tmp_path / "x").symlink_to("y")
    (tmp_path / "y").symlink_to("x")
    with pytest.raises(PolicyError, match="too many levels"):
        symlinks_followed(str(tmp_path / "x"))


# --- write roots: a renamed parent and a link in its place ------------------------------


def test_a_write_root_re_pointed_by_a_run_is_refused_next_run(jail: Path, outside: Path) -> None:
    (jail / "build" / "cache").mkdir(parents=True)
    target = outside / "data"
    target.write_text("host\n")
    flags = ["--write-root", jail / "build" / "cache"]
    # negative control: the grant works while the tree is as the user made it
    assert_ok(run_cli(jail, "sh", "-c", "echo ok > build/cache/f", extra=flags))
    assert (jail / "build" / "cache" / "f").read_text() == "ok\n"
    # run 1 moves the root's parent away and leaves a link to a host directory in its place
    assert_ok(run_cli(jail, "sh", "-c", f"mv build build.old && mkdir build && "
                      f"ln -s {outside} build/cache", extra=flags))
    assert (jail / "build" / "cache").is_symlink()
    # run 2, the same policy made afresh: refused, and the host directory is untouched
    p = run_cli(jail, "sh", "-c", f"echo pwned >> {target}", extra=flags)
    _refused(p, "write_roots", str(jail / "build" / "cache"), "symlink")
    assert target.read_text() == "host\n"
    assert sorted(os.listdir(outside)) == ["data"]


def test_a_reused_sandbox_refuses_a_root_turned_into_a_link(jail: Path, outside: Path) -> None:
    (jail / "build" / "cache").mkdir(parents=True)
    target = outside / "data"
    target.write_text("host\n")
    sandbox = Sandbox(Policy(jail=str(jail), write_roots=(str(jail / "build" / "cache"),)))
    ok = sandbox.run(["sh", "-c", "echo ok > build/cache/f"], capture_output=True)
    assert ok.returncode == 0, ok.stderr  # negative control
    # another command in the same jail (any policy that grants the jail) leaves a link
    tamper = Sandbox(Policy(jail=str(jail))).run(
        ["sh", "-c", f"mv build build.old && mkdir build && ln -s {outside} build/cache"],
        capture_output=True)
    assert tamper.returncode == 0, tamper.stderr
    with pytest.raises(PolicyError, match="symlink stands on this granted path") as e:
        sandbox.run(["sh", "-c", f"echo pwned >> {target}"], capture_output=True)
    assert e.value.exit_code == EXIT_REFUSED
    assert target.read_text() == "host\n"


def test_the_jail_named_through_a_link_in_a_write_root_is_refused(tmp_path: Path,
                                                                    outside: Path) -> None:
    shared = tmp_path / "shared"
    (shared / "work").mkdir(parents=True)
    flags = ["--write-root", shared]
    assert_ok(run_cli(shared / "work", "true", extra=flags))  # negative control
    # a command with the shared root as its jail replaces work by a link to a host directory
    assert_ok(run_cli(shared, "sh", "-c", f"mv work work.old && ln -s {outside} work"))
    p = run_cli(shared / "work", "sh", "-c", "echo pwned > f", extra=flags)
    _refused(p, "jail", "symlink", str(shared))
    assert os.listdir(outside) == []


# --- read-only roots named through a link in the jail -----------------------------------


def test_a_read_only_root_through_a_link_in_the_jail_is_refused(jail: Path, outside: Path,
                                                                 tmp_path: Path) -> None:
    public = tmp_path / "public"
    public.mkdir()
    (public / "doc").write_text("public\n")
    (outside / "secret").write_text("secret\n")
    (jail / "docs").symlink_to(public)
    # the user's own link, before any run: refused all the same (a command could re-point
    # it); naming the directory itself works (negative control)
    p = run_cli(jail, "cat", jail / "docs" / "doc", extra=["--read-only-root", jail / "docs"])
    _refused(p, "read_only_roots", str(jail / "docs"), "symlink")
    ok = run_cli(jail, "cat", public / "doc", extra=["--read-only-root", public])
    assert_ok(ok)
    assert out(ok) == "public\n"
    # what a command could make of it: a link to a secret directory
    assert_ok(run_cli(jail, "sh", "-c", f"rm docs && ln -s {outside} docs"))
    p = run_cli(jail, "cat", jail / "docs" / "secret",
                extra=["--read-only-root", jail / "docs"])
    _refused(p, "read_only_roots")
    assert "secret" not in out(p)


# --- carve-outs ---------------------------------------------------------------------------


def test_a_hidden_path_swapped_for_a_link_is_refused_next_run(jail: Path) -> None:
    (jail / "secrets").mkdir()
    (jail / "secrets" / "real.env").write_text("TOKEN=s3cret\n")
    (jail / ".env").write_text("TOKEN=s3cret\n")
    flags = ["--hide-path", jail / ".env"]
    # negative control: a regular file is hidden, and the run cannot move or replace it
    p = run_cli(jail, "sh", "-c", "cat .env; rm -f .env || echo rm-refused; "
                "mv .env x 2>/dev/null || echo mv-refused", extra=flags)
    assert "s3cret" not in out(p) and "rm-refused" in out(p) and "mv-refused" in out(p), show(p)
    assert (jail / ".env").read_text() == "TOKEN=s3cret\n"
    # a run under a policy without the carve-out replaces it by a link to a decoy
    assert_ok(run_cli(jail, "sh", "-c", "rm .env && echo decoy > decoy && ln -s decoy .env"))
    p = run_cli(jail, "cat", ".env", "secrets/real.env", extra=flags)
    _refused(p, "hidden_paths", str(jail / ".env"), "symlink")
    assert "s3cret" not in out(p)


def test_a_carve_out_that_is_a_link_is_refused_even_the_first_time(jail: Path) -> None:
    (jail / "secrets").mkdir()
    (jail / "secrets" / "real.env").write_text("TOKEN=s3cret\n")
    (jail / ".env").symlink_to("secrets/real.env")
    for flag, field in (("--hide-path", "hidden_paths"), ("--read-only-path", "read_only_paths")):
        p = run_cli(jail, "cat", "secrets/real.env", extra=[flag, jail / ".env"])
        _refused(p, field, "symlink")
        assert "s3cret" not in out(p)
    # the target named itself: hidden (negative control of the refusal's advice)
    p = run_cli(jail, "cat", "secrets/real.env", extra=["--hide-path",
                                                        jail / "secrets" / "real.env"])
    assert p.returncode != 0 and "s3cret" not in out(p), show(p)


def test_a_carve_out_under_a_linked_directory_is_refused(jail: Path) -> None:
    (jail / "real" / "git").mkdir(parents=True)
    (jail / "real" / "git" / "config").write_text("[core]\n")
    (jail / "repo").symlink_to("real")
    p = run_cli(jail, "true", extra=["--read-only-path", jail / "repo" / "git" / "config"])
    _refused(p, "read_only_paths", str(jail / "repo"))


# --- unix sockets ---------------------------------------------------------------------------




CONNECT = "import socket, sys; s = socket.socket(socket.AF_UNIX); print(s.connect_ex(sys.argv[1]))"


def test_a_socket_grant_swapped_for_a_link_to_another_daemon_is_refused(
        jail: Path, outside: Path) -> None:
    (jail / "sockdir").mkdir()
    app = listen_unix(jail / "sockdir" / "app.sock")
    agent = listen_unix(outside / "agent.sock")  # another daemon's socket, outside every root
    grant = jail / "sockdir" / "app.sock"
    try:
        # negative control: the granted socket file itself connects
        p = run_cli(jail, "python3", "-c", CONNECT, grant,
                    extra=["--allow-unix-socket", grant])
        assert_ok(p)
        assert out(p).strip() == "0" and accepted_unix(app, 1.0) == 1, show(p)
        # run 1 replaces the socket by a link to the other daemon's
        assert_ok(run_cli(jail, "sh", "-c", f"rm sockdir/app.sock && "
                          f"ln -s {outside / 'agent.sock'} sockdir/app.sock"))
        p = run_cli(jail, "python3", "-c", CONNECT, grant,
                    extra=["--allow-unix-socket", grant])
        _refused(p, "allow_unix_sockets", "symlink")
        assert accepted_unix(agent, 0.5) == 0  # nothing reached the other daemon
    finally:
        app.close()
        agent.close()


# --- files the runtime writes -----------------------------------------------------------


def test_a_proxy_log_through_a_link_in_the_jail_is_refused(jail: Path, outside: Path) -> None:
    (outside / "profile").write_text("# host file\n")
    (jail / "logs").symlink_to(outside)
    with pytest.raises(PolicyError, match="proxy_log: .* symlink"):
        Sandbox(Policy(jail=str(jail), network="allow", allow_hosts=("127.0.0.1:1",),
                       proxy_log=str(jail / "logs" / "profile")))
    assert (outside / "profile").read_text() == "# host file\n"


def test_a_receipt_through_a_link_in_the_jail_is_refused_before_the_run(
        jail: Path, outside: Path) -> None:
    (jail / "out").mkdir()
    receipt = jail / "out" / "receipt.json"
    assert_ok(run_cli(jail, "true", extra=["--receipt", receipt]))  # negative control
    assert receipt.exists()
    # a run leaves a link where the receipt's directory was
    assert_ok(run_cli(jail, "sh", "-c", f"rm -r out && ln -s {outside} out"))
    p = run_cli(jail, "sh", "-c", "echo ran > ran", extra=["--receipt", receipt])
    _refused(p, "--receipt", "symlink")
    assert os.listdir(outside) == [] and not (jail / "ran").exists()


def test_a_bin_re_pointed_by_a_run_brings_no_install_prefix(jail: Path, tmp_path: Path) -> None:
    # a host toolchain with a secret beside it: an install prefix (bin/ and lib/)
    home = tmp_path / "home" / ".local"
    (home / "lib").mkdir(parents=True)
    (home / "bin").mkdir()
    (home / "bin" / "tool").write_text('#!/bin/sh\ncat "$@"\n')
    (home / "bin" / "tool").chmod(0o755)
    (home / "secret").write_text("HOMESECRET\n")
    (jail / "tool").write_text("#!/bin/sh\necho hi\n")
    (jail / "tool").chmod(0o755)
    flags = ["--allow-bin", jail / "tool"]
    p = run_cli(jail, jail / "tool", extra=flags)
    assert_ok(p)
    assert out(p) == "hi\n"
    # negative control: the toolchain allow-listed itself brings its prefix, secret and all
    p = run_cli(jail, home / "bin" / "tool", home / "secret",
                extra=["--allow-bin", home / "bin" / "tool"])
    assert out(p) == "HOMESECRET\n", show(p)
    # a run replaces the allow-listed file by a link into the toolchain
    assert_ok(run_cli(jail, "sh", "-c", f"rm tool && ln -s {home / 'bin' / 'tool'} tool"))
    p = run_cli(jail, jail / "tool", home / "secret", extra=flags)
    assert "HOMESECRET" not in out(p), show(p)
    assert p.returncode == 127, show(p)


def test_no_view_private_tmp_through_a_planted_link_is_refused(jail: Path,
                                                                outside: Path) -> None:
    """Without a mount view HOME and TMPDIR live in the jail's .hcp-tmp, which the runtime
    makes: a link a command left there must not have the runtime create files where it
    points, nor hand that directory to the next command."""
    import errno as errno_
    from sandboxing import deny_run_cli
    flags = ["--rung", "no-namespaces"]
    # negative control: the private tmp is made in the jail, self-ignored
    p = deny_run_cli(["unshare"], errno_.EPERM, jail, "sh", "-c", "echo $HOME", extra=flags)
    assert_ok(p)
    assert out(p).strip() == str(jail / ".hcp-tmp")
    assert (jail / ".hcp-tmp" / ".gitignore").read_text() == "*\n"
    # an earlier command replaces it by a link to a host directory
    assert_ok(deny_run_cli(["unshare"], errno_.EPERM, jail, "sh", "-c",
                           f"rm -r .hcp-tmp && ln -s {outside} .hcp-tmp", extra=flags))
    p = deny_run_cli(["unshare"], errno_.EPERM, jail, "sh", "-c", "echo x > $HOME/f",
                     extra=flags)
    _refused(p, ".hcp-tmp", "symlink")
    assert os.listdir(outside) == []
