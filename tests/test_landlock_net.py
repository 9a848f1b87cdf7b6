"""TCP port rules (ABI 4) and IPC scopes (ABI 6) on the real kernel, each with a control.

Network tests use 127.0.0.1 only. Listeners and the process to signal live in the test
process, outside any domain; the restricted side is always a forked child.
"""
from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import uuid
from typing import Iterator

import pytest

from hcp_linux.landlock import AccessNet, Ruleset, Scope
from test_landlock_helpers import OK, child, enforced, err, needs_abi

LOOPBACK = "127.0.0.1"


def free_ports(n: int) -> list[int]:
    """n distinct ports free on 127.0.0.1 right now (bound to 0, read back, released)."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(n)]
    try:
        for s in socks:
            s.bind((LOOPBACK, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def bind_port(port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((LOOPBACK, port))


def connect_port(port: int) -> None:
    with socket.create_connection((LOOPBACK, port), timeout=5):
        pass


@pytest.fixture
def listeners() -> Iterator[list[int]]:
    """Two TCP listeners on 127.0.0.1 in the test process; yields their ports."""
    socks = []
    try:
        for _ in range(2):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((LOOPBACK, 0))
            s.listen(8)
            socks.append(s)
        yield [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@needs_abi(4)
def test_tcp_bind_by_port() -> None:
    allowed, denied = free_ports(2)
    rs = Ruleset(handled_net=AccessNet.BIND_TCP).add_port(allowed, AccessNet.BIND_TCP)
    attempt = lambda: (err(lambda: bind_port(allowed)), err(lambda: bind_port(denied)))  # noqa: E731
    assert child(attempt) == (OK, OK)  # control
    with rs.create() as created:
        assert enforced(created, attempt) == (OK, errno.EACCES)


@needs_abi(4)
def test_tcp_connect_by_port(listeners: list[int]) -> None:
    allowed, denied = listeners
    rs = Ruleset(handled_net=AccessNet.CONNECT_TCP).add_port(allowed, AccessNet.CONNECT_TCP)
    attempt = lambda: (err(lambda: connect_port(allowed)),  # noqa: E731
                       err(lambda: connect_port(denied)))
    assert child(attempt) == (OK, OK)  # control
    with rs.create() as created:
        assert enforced(created, attempt) == (OK, errno.EACCES)


@needs_abi(4)
def test_connect_rule_does_not_allow_bind(listeners: list[int]) -> None:
    """Rights are per port *and* per operation."""
    port = free_ports(1)[0]
    rs = Ruleset(handled_net=AccessNet.BIND_TCP | AccessNet.CONNECT_TCP)
    rs.add_port(port, AccessNet.CONNECT_TCP)
    with rs.create() as created:
        assert enforced(created, lambda: err(lambda: bind_port(port))) == errno.EACCES


@pytest.fixture
def outsider() -> Iterator[int]:
    """A process started by the test process, outside any Landlock domain."""
    proc = subprocess.Popen(["sleep", "60"])
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def _signal_in_domain() -> int:
    """Start a child inside the domain and signal it; its exit status (-SIGTERM expected)."""
    proc = subprocess.Popen(["sleep", "60"])
    os.kill(proc.pid, signal.SIGTERM)
    return proc.wait()


@needs_abi(6)
def test_signal_scope(outsider: int) -> None:
    assert child(lambda: err(lambda: os.kill(outsider, 0))) == OK  # control
    with Ruleset(scoped=Scope.SIGNAL).create() as created:
        got = enforced(created, lambda: (err(lambda: os.kill(outsider, 0)),
                                         err(lambda: os.kill(outsider, signal.SIGTERM)),
                                         _signal_in_domain()))
    assert got == (errno.EPERM, errno.EPERM, -signal.SIGTERM)
    assert os.waitpid(outsider, os.WNOHANG) == (0, 0)  # still running


def _abstract_connect(name: bytes) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(name)


def _abstract_in_domain() -> int:
    """Listen and connect on a new abstract name, both inside the domain."""
    name = b"\0hcp-landlock-inner-" + uuid.uuid4().hex.encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as srv:
        srv.bind(name)
        srv.listen(1)
        return err(lambda: _abstract_connect(name))


@needs_abi(6)
def test_abstract_unix_socket_scope() -> None:
    name = b"\0hcp-landlock-test-" + uuid.uuid4().hex.encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as srv:
        srv.bind(name)
        srv.listen(8)
        assert child(lambda: err(lambda: _abstract_connect(name))) == OK  # control
        with Ruleset(scoped=Scope.ABSTRACT_UNIX_SOCKET).create() as created:
            got = enforced(created, lambda: (err(lambda: _abstract_connect(name)),
                                             _abstract_in_domain()))
    assert got == (errno.EPERM, OK)
