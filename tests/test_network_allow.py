"""`network = "allow"`: a private network namespace whose only way out is the egress proxy.

Everything talks to servers this test starts on the host's loopback (127.0.0.1) and nothing
else. The sandbox reaches them only through the proxy and only where the allow-list says;
raw TCP, UDP and ICMP around the proxy find no route. Each denial has its control: the same
server is reachable from the host, and through the proxy when listed.
"""
from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from sandboxing import EXECUTOR_ARGS, LoopbackServer, jail  # noqa: F401

from hcp_linux import Policy, PolicyError, Sandbox

TIMEOUT = 60

_CLIENT = r"""
import socket, sys
def ask(req):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
    s.sendall(req)
    data = b""
    while chunk := s.recv(4096):
        data += chunk
    s.close()
    return data
for target in sys.argv[1:]:
    reply = ask(b"GET http://%s/ HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n"
                % (target.encode(), target.encode()))
    print(target, reply.split(b"\r\n")[0].decode(), reply.endswith(b"hello-from-host"))
"""


class HostServer(LoopbackServer):
    """A tiny HTTP server on the host's 127.0.0.1 that counts the connections it accepted."""

    def handle(self, conn: socket.socket) -> None:
        conn.recv(4096)
        conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 15\r\n\r\nhello-from-host")


@pytest.fixture
def server():
    srv = HostServer()
    yield srv
    srv.close()


def _run(jail: Path, code: str, *args: str, **policy) -> "object":
    return Sandbox(Policy(jail=str(jail), network="allow", **policy)).run(
        ["python3", "-c", code, *args], capture_output=True, timeout=TIMEOUT)


def test_allowed_host_reachable_only_through_the_proxy(jail: Path, server: HostServer) -> None:
    allowed, other = f"127.0.0.1:{server.port}", f"127.0.0.1:{server.port + 1}"
    run = _run(jail, _CLIENT, allowed, other, allow_hosts=(allowed,))
    assert run.returncode == 0, run.stderr
    lines = run.stdout.decode().splitlines()
    assert lines[0] == f"{allowed} HTTP/1.0 200 OK True"
    assert lines[1].startswith(f"{other} HTTP/1.1 403"), lines
    assert server.accepted == 1
    decisions = run.receipt["network"]["decisions"]
    assert [(d["port"], d["allowed"]) for d in decisions] == [(server.port, True),
                                                             (server.port + 1, False)]


def test_denied_host_gets_no_connection(jail: Path, server: HostServer) -> None:
    target = f"127.0.0.1:{server.port}"
    run = _run(jail, _CLIENT, target, allow_hosts=(f"127.0.0.1:{server.port + 1}",))
    assert run.stdout.decode().startswith(f"{target} HTTP/1.1 403"), run.stdout
    assert server.accepted == 0
    # control: the host reaches the same server directly
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        s.sendall(b"GET / HTTP/1.0\r\n\r\n")
        assert s.recv(100).startswith(b"HTTP/1.0 200")


def test_deny_list_wins(jail: Path, server: HostServer) -> None:
    target = f"127.0.0.1:{server.port}"
    run = _run(jail, _CLIENT, target, allow_hosts=("127.0.0.0/8",), deny_hosts=(target,))
    assert "403" in run.stdout.decode()
    assert server.accepted == 0


_AROUND = r"""
import socket, sys
tcp_port, udp_port = int(sys.argv[1]), int(sys.argv[2])
out = {}
s = socket.socket(); s.settimeout(3)
out["tcp-host-loopback"] = s.connect_ex(("127.0.0.1", tcp_port))
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
out["udp-sent"] = u.sendto(b"x" * 8, ("127.0.0.1", udp_port))  # lands on its own lo
for name, args in (("icmp-raw", (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)),
                   ("icmp-dgram", (socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP))):
    try:
        socket.socket(*args)
        out[name] = 0
    except OSError as e:
        out[name] = e.errno
out["routes"] = open("/proc/net/route").read().count("\n") - 1  # header line excluded
print(out)
"""


def test_no_route_around_the_proxy(jail: Path, server: HostServer) -> None:
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    udp.settimeout(0.5)
    try:
        # the host's loopback address is allowed, on another port: an address entry is
        # captured and relayed on the ports it names only (tests/test_egress_literals.py)
        other = server.port + 1 if server.port < 65535 else server.port - 1
        run = _run(jail, _AROUND, str(server.port), str(udp.getsockname()[1]),
                   allow_hosts=(f"127.0.0.1:{other}",))
        assert run.returncode == 0, run.stderr
        out = eval(run.stdout.decode())  # a dict literal printed by the child
        assert out["tcp-host-loopback"] != 0  # ECONNREFUSED: its own loopback, not the host's
        assert out["udp-sent"] == 8  # sent... to the sandbox's own lo:
        with pytest.raises(socket.timeout):
            udp.recvfrom(100)  # ...the host's UDP server received nothing
        assert out["icmp-raw"] != 0 and out["icmp-dgram"] != 0
        assert out["routes"] == 0  # no IPv4 route at all: only lo, which needs none listed
        assert server.accepted == 0
        # control: the same datagram from the host arrives
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", udp.getsockname())
        assert udp.recvfrom(100)[0] == b"x"
    finally:
        udp.close()


def test_names_resolve_at_the_proxy(jail: Path, server: HostServer) -> None:
    # "localhost" is resolved by the proxy (outside), which then dials the checked address.
    target = f"localhost:{server.port}"
    run = _run(jail, _CLIENT, target, allow_hosts=(target, f"127.0.0.1:{server.port}"))
    assert run.stdout.decode().startswith(f"{target} HTTP/1.0 200 OK True"), run.stdout
    assert server.accepted == 1


def test_proxy_environment_is_set(jail: Path) -> None:
    code = "import os; print(' '.join(os.environ.get(k, '-') for k in " \
           "('HTTP_PROXY', 'https_proxy', 'ALL_PROXY', 'NO_PROXY')))"
    run = _run(jail, code, allow_hosts=("example.com",))
    assert run.stdout.decode().split() == ["http://127.0.0.1:3128"] * 3 + \
        ["localhost,127.0.0.1,::1"]


def test_a_granted_no_proxy_is_merged_not_overwritten(jail: Path) -> None:
    """A NO_PROXY the policy grants keeps its entries after the sandbox's loopback ones
    (a direct connection has no route out, so an entry widens nothing)."""
    code = "import os; print(os.environ['NO_PROXY'], os.environ['no_proxy'])"
    run = _run(jail, code, allow_hosts=("example.com",),
               env={"NO_PROXY": "internal.test,localhost", "no_proxy": "other.test"})
    merged = "localhost,127.0.0.1,::1,internal.test,other.test"
    assert run.stdout.decode().split() == [merged, merged], run.stderr


def test_proxy_log_file(jail: Path, tmp_path: Path, server: HostServer) -> None:
    log = tmp_path / "egress.jsonl"
    target = f"127.0.0.1:{server.port}"
    _run(jail, _CLIENT, target, allow_hosts=(target,), proxy_log=str(log))
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(entries) == 1 and entries[0]["allowed"] is True and entries[0]["port"] == server.port


@pytest.mark.parametrize("fields, culprit", [
    ({"network": "none", "allow_hosts": ("example.com",)}, 'network = "allow"'),
    ({"network": "allow"}, "at least one allow_hosts"),
    ({"network": "allow", "allow_hosts": ("exa mple.com",)}, "exa mple.com"),
    ({"network": "allow", "allow_hosts": ("example.com:70000",)}, "70000"),
    ({"network": "allow", "allow_hosts": ("user@example.com",)}, "user@example.com"),
    ({"network": "allow", "allow_hosts": ("0x7f.1",)}, "0x7f.1"),
])
def test_bad_egress_policy_is_refused_before_anything_runs(jail: Path, fields: dict,
                                                           culprit: str) -> None:
    with pytest.raises(PolicyError) as e:
        Policy(jail=str(jail), **fields)
    assert culprit in str(e.value)


def test_cli_refuses_allow_host_without_network_allow(jail: Path) -> None:
    marker = jail / "ran"
    p = subprocess.run([sys.executable, "-m", "hcp_linux", "run", *EXECUTOR_ARGS, "--jail",
                        str(jail), "--allow-host", "example.com", "--", "touch", str(marker)],
                       capture_output=True, text=True, timeout=TIMEOUT)
    assert p.returncode == 125
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: sandbox: ") and "allow" in lines[0]
    assert not marker.exists()


# --- no network namespace on this host: the fallback, only when allowed -----------------

_DENY_NETNS = r"""
import ctypes, os, sys
import pyseccomp
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl(38, ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)):
    raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
f = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
CLONE_NEWNET = 0x40000000
f.add_rule(pyseccomp.ERRNO(1), "unshare",
           pyseccomp.Arg(0, pyseccomp.MASKED_EQ, CLONE_NEWNET, CLONE_NEWNET))
f.load()
os.execv(sys.executable, [sys.executable] + sys.argv[1:])
"""

_PROBE_NET = r"""
import socket, sys
try:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(3)
    print("connect", s.connect_ex(("127.0.0.1", int(sys.argv[1]))))
except OSError as e:
    print("socket", e.errno)
"""


def _run_without_netns(jail: Path, receipt: Path, port: int, *extra: str):
    argv = [sys.executable, "-c", _DENY_NETNS, "-m", "hcp_linux", "run", *EXECUTOR_ARGS,
            "--jail", str(jail), "--receipt", str(receipt), *extra, "--", "python3", "-c", _PROBE_NET, str(port)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT, cwd="/")


def test_without_netns_strict_refuses(jail: Path, tmp_path: Path, server: HostServer) -> None:
    p = _run_without_netns(jail, tmp_path / "r.json", server.port)
    assert p.returncode == 125, p.stderr
    assert p.stderr.startswith("error: sandbox: netns unavailable: unshare-net"), p.stderr
    assert not (tmp_path / "r.json").exists() and server.accepted == 0


def test_without_netns_fallback_denies_network(jail: Path, tmp_path: Path,
                                               server: HostServer) -> None:
    receipt = tmp_path / "r.json"
    p = _run_without_netns(jail, receipt, server.port, "--allow-degraded", "netns")
    assert p.returncode == 0, p.stderr
    # seccomp network-off answers EAFNOSUPPORT (97) before any TCP can happen
    assert p.stdout.split() == ["socket", "97"], p.stdout
    assert server.accepted == 0
    r = json.loads(receipt.read_text())
    assert r["layers"]["netns"]["status"] == "degraded"
    assert "network-off" in r["layers"]["seccomp"]["profiles"]
    assert r["layers"]["landlock"]["handled_net"] == ["bind_tcp", "connect_tcp"]
    # control: the host reaches the listener; and with a netns the same probe gets ECONNREFUSED
    with socket.create_connection(("127.0.0.1", server.port), timeout=5):
        pass
    run = Sandbox(Policy(jail=str(jail))).run(["python3", "-c", _PROBE_NET, str(server.port)],
                                              capture_output=True, timeout=TIMEOUT)
    assert run.stdout.split() == [b"connect", b"111"]


def test_allow_mode_never_runs_without_netns(jail: Path, tmp_path: Path,
                                             server: HostServer) -> None:
    target = f"127.0.0.1:{server.port}"
    p = _run_without_netns(jail, tmp_path / "r.json", server.port, "--allow-degraded", "netns",
                           "--network", "allow", "--allow-host", target)
    assert p.returncode == 125, p.stdout + p.stderr
    assert p.stderr.startswith("error: sandbox: netns unavailable"), p.stderr
    assert 'network = "allow"' in p.stderr
    assert server.accepted == 0 and not (tmp_path / "r.json").exists()
