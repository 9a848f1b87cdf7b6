"""Unix sockets granted by path: ``allow_unix_sockets`` (``--allow-unix-socket``) and the
second yes for dangerous ones, ``allow_dangerous_sockets`` (``--allow-dangerous-socket``).

Every connect is made for real inside the sandbox (errno printed by the command) and checked
on the listener's side (what it accepted); each denial is paired with a negative control,
the same connect unconfined, which the listener accepts. The file runs under both executors
(``--executor native|ctypes``) and as root and nobody (``scripts/test-unprivileged``).
"""
from __future__ import annotations

import errno
import socket
import subprocess
from pathlib import Path

import pytest

from hcp_linux import Policy, Sandbox, landlock
from hcp_linux.errors import PolicyError
from sandboxing import (EXIT_REFUSED, TIMEOUT, assert_ok, jail, out, outside,  # noqa: F401
                        accepted_unix, listen_unix, read_receipt, ro_root, run_cli, show,
                        single_error_line)

#: Runs inside the sandbox: the listing of the first socket's directory, then one
#: ``path errno`` line per connect (0: connected).
CONNECT = r"""
import os, socket, sys
try:
    print("listing", sorted(os.listdir(os.path.dirname(sys.argv[1]))))
except OSError as e:
    print("listing", e.errno)
for p in sys.argv[1:]:
    s = socket.socket(socket.AF_UNIX)
    print(p, s.connect_ex(p))
"""




def _results(text: str) -> dict[str, str]:
    return dict(line.rsplit(" ", 1) for line in text.splitlines() if line.startswith("/"))


def _listing(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("listing ")).split(" ", 1)[1]


def _unconfined(*paths: Path) -> dict[str, str]:
    c = subprocess.run(["/usr/bin/python3", "-c", CONNECT, *map(str, paths)],
                       capture_output=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL)
    return _results(c.stdout.decode())


def _connects_when_granted(jail: Path, sock: Path, lst: socket.socket, flag: str,
                           receipt: Path) -> dict:
    """Run a connect to ``sock`` granted by ``flag``: it connects, the listener sees it;
    the receipt's entry for it."""
    p = run_cli(jail, "python3", "-c", CONNECT, sock, extra=[flag, sock, "--receipt", receipt])
    assert_ok(p)
    assert _results(out(p)) == {str(sock): "0"}, show(p)
    assert accepted_unix(lst, wait=2) == 1
    entry, = read_receipt(receipt)["unix_sockets"]
    return entry


def test_granted_socket_alone_is_connectable(jail: Path, outside: Path, tmp_path: Path) -> None:
    a, b = outside / "agent.sock", outside / "other.sock"
    la, lb = listen_unix(a), listen_unix(b)
    receipt = tmp_path / "receipt.json"
    try:
        p = run_cli(jail, "python3", "-c", CONNECT, a, b,
                    extra=["--allow-unix-socket", a, "--receipt", receipt])
        assert_ok(p)
        got = _results(out(p))
        assert got == {str(a): "0", str(b): str(errno.ENOENT)}, show(p)
        # nothing else of its directory: the sibling is absent, not merely refused
        assert _listing(out(p)) == "['agent.sock']", show(p)
        assert accepted_unix(la, wait=2) == 1
        assert accepted_unix(lb) == 0, "the sandbox reached a socket it was not granted"
        # the same run without the grant: the socket is absent too (the grant did it)
        p = run_cli(jail, "python3", "-c", CONNECT, a)
        assert_ok(p)
        assert _results(out(p)) == {str(a): str(errno.ENOENT)}, show(p)
        assert accepted_unix(la) == 0
        # control: unconfined, both are reachable
        assert _unconfined(a, b) == {str(a): "0", str(b): "0"}
        assert accepted_unix(la, wait=2) == 1 and accepted_unix(lb, wait=2) == 1
    finally:
        la.close()
        lb.close()
    entry, = read_receipt(receipt)["unix_sockets"]
    assert entry["path"] == entry["socket"] == str(a)
    assert entry["by"].startswith("bind of its inode at " + str(a))
    assert "dangerous" not in entry
    if landlock.abi_version() < 9:
        assert "before ABI 9" in entry["landlock"]
    else:
        assert "RESOLVE_UNIX" in entry["landlock"]


def test_a_socket_named_through_a_symlink_is_reachable_by_both_names(
        jail: Path, outside: Path, tmp_path: Path) -> None:
    """As /var/run -> /run: the program uses the name it was told; both names lead to the
    one inode that was checked."""
    link = tmp_path / "run-link"
    link.symlink_to(outside)
    sock = outside / "d.sock"
    lst = listen_unix(sock)
    try:
        p = run_cli(jail, "python3", "-c", CONNECT, link / "d.sock", sock,
                    extra=["--allow-unix-socket", link / "d.sock"])
        assert_ok(p)
        assert _results(out(p)) == {str(link / "d.sock"): "0", str(sock): "0"}, show(p)
        assert accepted_unix(lst, wait=2) == 2
    finally:
        lst.close()


def test_a_socket_inside_the_jail_is_granted_as_it_lies(jail: Path, tmp_path: Path) -> None:
    sock = jail / "dev.sock"
    lst = listen_unix(sock)
    try:
        entry = _connects_when_granted(jail, sock, lst, "--allow-unix-socket",
                                       tmp_path / "receipt.json")
    finally:
        lst.close()
    assert entry["by"] == "inside a granted root (in the view already)"


def test_dangerous_socket_needs_the_second_yes(jail: Path, outside: Path,
                                               tmp_path: Path) -> None:
    sock = outside / "docker.sock"
    lst = listen_unix(sock)
    marker = jail / "ran"
    receipt = tmp_path / "receipt.json"
    try:
        p = run_cli(jail, "sh", "-c", f"touch {marker}", extra=["--allow-unix-socket", sock])
        assert p.returncode == EXIT_REFUSED, show(p)
        line = single_error_line(p)
        assert "Docker Engine API" in line and "--allow-dangerous-socket" in line, line
        assert not marker.exists(), "the command ran although the policy was refused"
        assert accepted_unix(lst) == 0
        entry = _connects_when_granted(jail, sock, lst, "--allow-dangerous-socket", receipt)
    finally:
        lst.close()
    assert "Docker Engine API" in entry["dangerous"] and "root on the host" in entry["dangerous"]


@pytest.mark.parametrize("name", ["run/user/1000/bus", "var/run/dbus/system_bus_socket",
                                  "containerd/containerd.sock", "podman/podman.sock"])
def test_other_dangerous_names_are_refused(tmp_path: Path, name: str) -> None:
    from hcp_linux.policy.unix_sockets import danger
    assert danger("/" + name) is not None
    # a real socket at such a name (under tmp_path for the glob-shaped ones)
    if not name.startswith("run/"):
        path = tmp_path / name
        path.parent.mkdir(parents=True)
        lst = listen_unix(path)
        try:
            with pytest.raises(PolicyError, match="allow_dangerous_sockets"):
                Sandbox(Policy(jail=str(tmp_path), allow_unix_sockets=(str(path),)))
            Sandbox(Policy(jail=str(tmp_path), allow_dangerous_sockets=(str(path),)))  # yes
        finally:
            lst.close()
    assert danger("/run/user/1000/ssh-agent.sock") is None
    assert danger("/home/u/.docker.sock.bak") is None


def test_bad_socket_grants_are_refused_with_no_side_effect(jail: Path, outside: Path,
                                                          tmp_path: Path) -> None:
    regular = outside / "file"
    regular.write_text("x")
    hidden = jail / "secret"
    hidden.mkdir()
    hsock = hidden / "h.sock"
    lst = listen_unix(hsock)
    marker = jail / "ran"
    cases = {
        str(outside / "missing.sock"): "No such file or directory",
        str(regular): "is not a unix socket",
        "relative.sock": "not an absolute path",
        str(hsock): "inside hidden path",
    }
    try:
        for path, words in cases.items():
            p = run_cli(jail, "sh", "-c", f"touch {marker}",
                        extra=["--allow-unix-socket", path, "--hide-path", hidden])
            assert p.returncode == EXIT_REFUSED, show(p)
            line = single_error_line(p)
            assert words in line and "allow_unix_sockets" in line, line
            assert not marker.exists()
    finally:
        lst.close()


def test_a_restarted_server_is_reached_through_the_same_policy(jail: Path,
                                                               outside: Path) -> None:
    """An ssh-agent restarted between two runs makes a new socket inode at the same path: the
    cached confinement notices (its stamp) and binds the new one."""
    sock = outside / "agent.sock"
    sock_first = listen_unix(sock)
    sandbox = Sandbox(Policy(jail=str(jail), allow_unix_sockets=(str(sock),)))
    for server in ("first", "restarted"):
        lst = sock_first if server == "first" else listen_unix(sock)
        try:
            r = sandbox.run(["python3", "-c", CONNECT, str(sock)], capture_output=True)
            assert r.returncode == 0 and _results(r.stdout.decode()) == {str(sock): "0"}, \
                (server, r)
            assert accepted_unix(lst, wait=2) == 1, server
        finally:
            lst.close()
        sock.unlink()  # the server stops (its socket file goes with it, as ssh-agent's)
    # the server gone: the run is refused (the bind needs the checked inode), not pointed
    # at whatever might take the name later
    with pytest.raises(PolicyError, match="allow_unix_sockets: .*No such file"):
        sandbox.run(["true"])
    sock.write_text("")  # a file took the name: refused as well
    with pytest.raises(PolicyError, match="no longer a unix socket"):
        sandbox.run(["true"])


@pytest.mark.skipif(landlock.abi_version() < 9, reason="needs Landlock ABI 9 (RESOLVE_UNIX); "
                    f"this kernel has {landlock.abi_version()}")
def test_landlock_abi9_refuses_sockets_of_read_only_roots_unless_granted(
        jail: Path, ro_root: Path) -> None:
    """Where the kernel mediates connect() by path, a socket the view shows (inside a
    read-only root) is refused unless granted; the grant is a RESOLVE_UNIX rule."""
    sock = ro_root / "daemon.sock"
    lst = listen_unix(sock)
    try:
        p = run_cli(jail, "python3", "-c", CONNECT, sock, extra=["--read-only-root", ro_root])
        assert_ok(p)
        assert _results(out(p)) == {str(sock): str(errno.EACCES)}, show(p)
        assert accepted_unix(lst) == 0
        p = run_cli(jail, "python3", "-c", CONNECT, sock,
                    extra=["--read-only-root", ro_root, "--allow-unix-socket", sock])
        assert_ok(p)
        assert _results(out(p)) == {str(sock): "0"}, show(p)
        assert accepted_unix(lst, wait=2) == 1
    finally:
        lst.close()


def test_probe_says_what_mediates_unix_sockets() -> None:
    from hcp_linux.probe import host_facts
    said = host_facts()["unix_sockets_by_path"]
    if landlock.abi_version() >= 9:
        assert said == "the mount view and Landlock RESOLVE_UNIX"
    else:
        assert said.startswith("the mount view only") and f"ABI {landlock.abi_version()}" in said
