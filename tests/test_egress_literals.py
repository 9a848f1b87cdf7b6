"""Transparent egress for allow entries that are IP literals or CIDRs (issue 34, item 5).

A tool with no proxy variables connecting to ``10.213.0.2:5432`` under
``--allow-host 10.213.0.0/24:5432`` reaches the proxy (the address is made local inside the
sandbox's namespace, its port captured) and is relayed to the real address. The real address
lives in a network namespace this test makes (``unshare --net``, as root; ``unshare -r
--net`` as nobody): the runtime, its proxy and the servers all run there, so nothing is sent
to another host and the host's own network is untouched. Loopback literals are covered in
tests/test_egress_capture.py. Each allowed connection has its negative controls in the same
run: an address outside the entries (no route), a port the entry does not name (refused
inside), an address the deny list names (captured, refused, the server sees nothing).
"""
from __future__ import annotations

import ipaddress
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from hcp_linux.egress import EgressPolicy
from hcp_linux.egress import routes
from hcp_linux.egress.capture import capturable, capture_nets, capture_ports
from sandboxing import EXECUTOR_ARGS, TIMEOUT

#: Runs in the test's network namespace: lo up, the addresses on it, one counting server per
#: address, then `hcp-linux run` (argv after the script's own), then prints what each server
#: accepted and the run's output and exit status as JSON.
_NETNS = r"""
import json, socket, subprocess, sys, threading
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
subprocess.run(["ip", "addr", "add", "10.213.0.2/32", "dev", "lo"], check=True)
subprocess.run(["ip", "addr", "add", "10.213.0.9/32", "dev", "lo"], check=True)
subprocess.run(["ip", "addr", "add", "fd00:213::2/128", "dev", "lo", "nodad"], check=True)
counts = {}
def serve(address):
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    s = socket.create_server((address, 5432), family=family)
    counts[address] = 0
    def loop():
        while True:
            c, _ = s.accept()
            counts[address] += 1
            c.sendall(b"hello from " + address.encode() + b"\n")
            c.close()
    threading.Thread(target=loop, daemon=True).start()
for a in ("10.213.0.2", "10.213.0.9", "fd00:213::2"):
    serve(a)
run = subprocess.run(sys.argv[1:], capture_output=True, timeout=120)
print(json.dumps({"counts": counts, "rc": run.returncode, "stdout": run.stdout.decode(),
                  "stderr": run.stderr.decode()}))
"""

#: The client, inside the sandbox: every proxy variable removed, a bare connect per target.
_CLIENT = r"""
import json, os, socket, sys
out = {"no_proxy": [os.environ.get("NO_PROXY"), os.environ.get("no_proxy")]}
for key in list(os.environ):
    if key.lower().endswith("_proxy"):
        del os.environ[key]
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    try:
        c = socket.create_connection((host.strip("[]"), int(port)), timeout=10)
        out[target] = c.recv(100).decode()
        c.close()
    except OSError as e:
        out[target] = "errno %d" % e.errno
print(json.dumps(out))
"""


def _unshare() -> list[str]:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.skip("needs unshare(1) and ip(8)")
    return ["unshare", "--net"] if os.geteuid() == 0 else ["unshare", "-r", "--net"]


def _in_netns(tmp_path: Path, *hcp: str) -> tuple[dict, dict]:
    jail = tmp_path / "jail"
    jail.mkdir()
    receipt = tmp_path / "receipt.json"
    argv = [*_unshare(), sys.executable, "-c", _NETNS,
            sys.executable, "-m", "hcp_linux", "run", *EXECUTOR_ARGS, "--jail", str(jail),
            "--network", "allow", "--receipt", str(receipt), *hcp]
    p = subprocess.run(argv, capture_output=True, timeout=TIMEOUT * 2, cwd="/")
    if p.returncode != 0 and b"unshare" in p.stderr and os.geteuid() != 0:
        pytest.skip(f"no network namespace for the test: {p.stderr.decode().strip()}")
    assert p.returncode == 0, p.stderr.decode()
    result = json.loads(p.stdout)
    assert result["rc"] == 0, result
    return result, json.loads(receipt.read_text())


def test_an_allowed_cidr_and_v6_address_are_captured_and_relayed(tmp_path: Path) -> None:
    targets = ("10.213.0.2:5432", "[fd00:213::2]:5432", "10.213.0.9:5432",
               "10.213.0.2:5433", "10.214.0.2:5432")
    result, receipt = _in_netns(
        tmp_path, "--allow-host", "10.213.0.0/24:5432", "--allow-host", "[fd00:213::2]:5432",
        "--deny-host", "10.213.0.9", "--env", "NO_PROXY=internal.test,10.213.0.2",
        "--", "python3", "-c", _CLIENT, *targets)
    got = json.loads(result["stdout"])
    # a granted NO_PROXY (here from the CLI) is merged after the sandbox's own, both spellings
    merged = "localhost,127.0.0.1,::1,internal.test,10.213.0.2"
    assert got.pop("no_proxy") == [merged, merged], result
    # allowed: captured inside, relayed by the proxy to the real address
    assert got["10.213.0.2:5432"] == "hello from 10.213.0.2\n", result
    assert got["[fd00:213::2]:5432"] == "hello from fd00:213::2\n", result
    # denied by the deny list: captured, refused, never dialled (the server saw nothing)
    assert got["10.213.0.9:5432"] in ("", "errno 104"), result
    # a port the entry does not name: nothing listens inside for it
    assert got["10.213.0.2:5433"] == "errno 111", result
    # an address outside every entry: no route, as before
    assert got["10.214.0.2:5432"] == "errno 101", result
    assert result["counts"] == {"10.213.0.2": 1, "10.213.0.9": 0, "fd00:213::2": 1}, result
    network = receipt["network"]
    assert network["captured_nets"] == ["10.213.0.0/24", "fd00:213::2/128"]
    assert 5432 in network["captured_ports"]
    decided = {d["host"]: d for d in network["decisions"] if d["protocol"] == "captured"}
    assert decided["10.213.0.2"]["allowed"] and decided["10.213.0.2"]["response"] == "relayed"
    assert decided["fd00:213::2"]["allowed"]
    assert not decided["10.213.0.9"]["allowed"]
    assert "denied by rule" in decided["10.213.0.9"]["reason"]
    # the no-route records name only what had no route (the captured networks are local)
    no_route = {d["address"] for d in receipt["denials"] if d.get("errno") == "ENETUNREACH"}
    assert no_route == {"10.214.0.2"}, receipt["denials"]


def test_without_the_entry_the_address_has_no_route(tmp_path: Path) -> None:
    """Negative control: the same namespace and servers, the address not in the allow list
    (a name holds the port captured): no route, and the server sees nothing."""
    result, receipt = _in_netns(
        tmp_path, "--allow-host", "db.test:5432", "--", "python3", "-c", _CLIENT,
        "10.213.0.2:5432", "[fd00:213::2]:5432")
    got = json.loads(result["stdout"])
    got.pop("no_proxy")
    assert got == {"10.213.0.2:5432": "errno 101", "[fd00:213::2]:5432": "errno 101"}, result
    assert result["counts"] == {"10.213.0.2": 0, "10.213.0.9": 0, "fd00:213::2": 0}
    assert receipt["network"]["captured_nets"] == []


def test_which_entries_are_captured() -> None:
    net = ipaddress.ip_network
    assert capturable(net("10.1.2.3/32")) and capturable(net("10.0.0.0/8"))
    assert capturable(net("127.0.0.1/32"))  # loopback: local already, captured by port
    assert not capturable(net("0.0.0.0/0")) and not capturable(net("8.0.0.0/7"))
    assert not capturable(net("198.18.0.0/16"))  # the synthetic range's own
    assert not capturable(net("224.0.0.0/4")) and not capturable(net("0.0.0.0/8"))
    assert capturable(net("2001:db8::7/128")) and capturable(net("::ffff:10.1.2.3/128"))
    assert not capturable(net("2001:db8::/64"))  # an IPv6 prefix on lo is one address
    assert not capturable(net("fe80::1/128")) and not capturable(net("ff02::1/128"))
    policy = EgressPolicy.parse(["10.1.2.3:5432", "127.0.0.1:8080", "[2001:db8::7]:22",
                                 "10.0.0.0/8:443", "example.com:22", "0.0.0.0/0:8443",
                                 "[2001:db8::/64]:80"])
    assert capture_nets(policy) == ((b"10.1.2.3", 32), (b"2001:db8::7", 128),
                                    (b"10.0.0.0", 8))
    assert capture_ports(policy) == (22, 443, 5432, 8080)


def _sockaddr_in(address: str, port: int) -> bytes:
    return struct.pack("=H", socket.AF_INET) + struct.pack("!H", port) \
        + socket.inet_aton(address) + b"\0" * 8


def _sockaddr_in6(address: str, port: int) -> bytes:
    return struct.pack("=H", socket.AF_INET6) + struct.pack("!HI", port, 0) \
        + socket.inet_pton(socket.AF_INET6, address) + b"\0" * 4


def test_captured_networks_are_not_recorded_as_no_route() -> None:
    local = ((b"10.213.0.0", 24), (b"fd00:213::2", 128))
    assert routes.unrouted(_sockaddr_in("10.213.0.2", 1), local) is None
    assert routes.unrouted(_sockaddr_in("10.213.0.2", 1)) == ("10.213.0.2", 1)
    assert routes.unrouted(_sockaddr_in("10.214.0.2", 1), local) == ("10.214.0.2", 1)
    assert routes.unrouted(_sockaddr_in6("fd00:213::2", 2), local) is None
    assert routes.unrouted(_sockaddr_in6("::ffff:10.213.0.7", 2), local) is None
    assert routes.unrouted(_sockaddr_in6("fd00:213::3", 2), local) == ("fd00:213::3", 2)
