"""Transparent egress under `network = "allow"`: the sandbox's resolver and TCP capture, for
tools that ignore HTTP_PROXY (issue #20, item 2).

Servers run on the host's 127.0.0.1 and nowhere else; the sandbox's namespace is the only
other network involved. The allowed name is ``localhost``, which the proxy resolves outside
with the host's /etc/hosts (no DNS query leaves the machine); a ``127.0.0.1:PORT`` entry
unlocks the loopback address it resolves to. Inside, /etc/hosts would answer ``localhost``
itself, so the clients here ask the resolver /etc/resolv.conf names by hand, as Go's pure
resolver does, and then connect with plain sockets, every proxy variable removed first.
Each denial has a control: the same client reaches the same server when unconfined or when
the name is allowed, and the server counts what reached it.
"""
from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from hcp_linux import Policy, Sandbox
from hcp_linux.protocol import RESOLVER_ADDRESS, SYNTHETIC_NET
from sandboxing import EXECUTOR_ARGS, LoopbackServer, jail  # noqa: F401

TIMEOUT = 60

#: A client that ignores the proxy: resolves with its own DNS query (to the resolver named
#: in /etc/resolv.conf), connects with a bare socket, speaks a line protocol. Prints JSON.
_CLIENT = r"""
import json, os, socket, struct, sys
for key in list(os.environ):
    if key.lower().endswith("_proxy"):
        del os.environ[key]
def ask(name, qtype=1):
    ns = [l.split()[1] for l in open("/etc/resolv.conf") if l.startswith("nameserver")][0]
    q = struct.pack("!HHHHHH", 0x4242, 0x0100, 1, 0, 0, 0) + b"".join(
        bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0" + struct.pack("!HH", qtype, 1)
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.settimeout(10)
    u.sendto(q, (ns, 53))
    r = u.recv(512)
    assert r[:2] == b"\x42\x42" and r[2] & 0x80, r
    rcode, answers = r[3] & 15, struct.unpack("!H", r[6:8])[0]
    return rcode, socket.inet_ntoa(r[-4:]) if answers and qtype == 1 else None
def talk(address, port):
    try:
        c = socket.create_connection((address, port), timeout=10)
    except OSError as e:
        return "connect errno %d" % e.errno
    try:
        f = c.makefile("rb")
        banner = f.readline()
        c.sendall(b"hello\n")
        return (banner + f.readline()).decode()
    except OSError as e:
        return "io errno %d" % e.errno
    finally:
        c.close()
out = {"env": sorted(k for k in os.environ if "proxy" in k.lower())}
port = int(sys.argv[1])
for name in sys.argv[2:]:
    if name.startswith("@"):  # connect to this address itself, no lookup
        out[name] = talk(name[1:], port)
        continue
    rcode, address = ask(name)
    out[name] = {"rcode": rcode, "address": address, "aaaa": ask(name, 28),
                 "talk": talk(address, port) if address else None}
print(json.dumps(out))
"""


class LineServer(LoopbackServer):
    """An ssh-like server on the host's 127.0.0.1: it speaks first (a banner), then echoes one
    line; it counts the connections it accepted."""

    def handle(self, conn: socket.socket) -> None:
        conn.sendall(b"SSH-2.0-line-server\r\n")
        conn.sendall(b"echo " + conn.makefile("rb").readline())


@pytest.fixture
def server():
    srv = LineServer()
    yield srv
    srv.close()


def _run(jail: Path, tmp_path: Path, port: int, *names: str, **policy) -> tuple[dict, list]:
    log = tmp_path / "egress.jsonl"
    run = Sandbox(Policy(jail=str(jail), network="allow", proxy_log=str(log), **policy)).run(
        ["python3", "-c", _CLIENT, str(port), *names], capture_output=True, timeout=TIMEOUT)
    assert run.returncode == 0, run.stderr.decode()
    decisions = [json.loads(line) for line in log.read_text().splitlines()] \
        if log.exists() else []
    return json.loads(run.stdout), decisions


def _synthetic(address: str | None) -> bool:
    import ipaddress
    return address is not None and ipaddress.ip_address(address) in ipaddress.ip_network(
        "%s/%d" % SYNTHETIC_NET)


def test_line_protocol_through_the_capture(jail: Path, tmp_path: Path,
                                           server: LineServer) -> None:
    out, decisions = _run(jail, tmp_path, server.port, "localhost",
                          allow_hosts=(f"localhost:{server.port}", f"127.0.0.1:{server.port}"))
    assert out["env"] == []  # no proxy variable: the client could not have used the proxy
    got = out["localhost"]
    assert got["rcode"] == 0 and _synthetic(got["address"])
    assert got["aaaa"] == [0, None]  # NODATA: the name is allowed, IPv6 is never given
    assert got["talk"] == "SSH-2.0-line-server\r\necho hello\n"
    assert server.accepted == 1
    dns = [d for d in decisions if d["protocol"] == "dns"]
    assert [d["response"] for d in dns] == [f"NOERROR A {got['address']}", "NOERROR AAAA"]
    [tcp] = [d for d in decisions if d["protocol"] == "captured"]
    assert (tcp["host"], tcp["port"], tcp["allowed"], tcp["address"]) == (
        "localhost", server.port, True, "127.0.0.1")


def test_denied_name_is_nxdomain_and_reaches_nothing(jail: Path, tmp_path: Path,
                                                     server: LineServer) -> None:
    # denied by the deny list, and by absence; the synthetic address an allowed name would
    # get, tried by a client that guesses it, is refused too (no name was given it)
    first = "%s" % (SYNTHETIC_NET[0].rsplit(".", 1)[0] + ".1")
    out, decisions = _run(jail, tmp_path, server.port, "localhost", "other.test",
                          f"@{first}",
                          allow_hosts=(f"localhost:{server.port}", "other-allowed.test",
                                       f"127.0.0.1:{server.port}"),
                          deny_hosts=("localhost",))
    assert out["localhost"] == {"rcode": 3, "address": None, "aaaa": [3, None], "talk": None}
    assert out["other.test"]["rcode"] == 3
    assert not out[f"@{first}"].startswith("SSH-2.0")  # accepted inside, closed by the proxy
    assert server.accepted == 0
    refused = [d for d in decisions if not d["allowed"]]
    assert {(d["protocol"], d["host"]) for d in refused} >= {
        ("dns", "localhost"), ("dns", "other.test"), ("captured", first)}
    # control: the same client, unconfined, with the server's address, reaches it
    control = subprocess.run([sys.executable, "-c", _CLIENT, str(server.port), "@127.0.0.1"],
                             capture_output=True, timeout=TIMEOUT, check=True)
    assert json.loads(control.stdout)["@127.0.0.1"].startswith("SSH-2.0-line-server")
    assert server.accepted == 1


def test_allowed_name_still_needs_its_port(jail: Path, tmp_path: Path,
                                           server: LineServer) -> None:
    # the name resolves (it is allowed on another port), but this port is not captured
    # for it: the proxy refuses, and the server sees nothing; control: the port allowed
    out, decisions = _run(jail, tmp_path, server.port, "localhost",
                          allow_hosts=("localhost:1", f"127.0.0.1:{server.port}",
                                       f"other.test:{server.port}"))
    assert _synthetic(out["localhost"]["address"])
    assert not out["localhost"]["talk"].startswith("SSH-2.0")
    assert server.accepted == 0
    [tcp] = [d for d in decisions if d["protocol"] == "captured"]
    assert tcp["allowed"] is False and tcp["host"] == "localhost"


def test_raw_addresses_do_not_leave(jail: Path, tmp_path: Path, server: LineServer) -> None:
    # The server's port is captured (a name is allowed on it), but its address is not in the
    # allow list: raw TCP to 127.0.0.1 from inside reaches the capture, which refuses it (no
    # allow rule for that address); IPv6 loopback has no listener; the server sees nothing.
    # Documentation addresses (RFC 5737, RFC 3849) find no route in the sandbox's namespace:
    # the capture added a local range, not a way out; nothing is sent anywhere.
    out, decisions = _run(jail, tmp_path, server.port, "@127.0.0.1", "@::1", "@192.0.2.1",
                          "@2001:db8::1", allow_hosts=(f"localhost:{server.port}",))
    assert not out["@127.0.0.1"].startswith("SSH-2.0")
    assert out["@::1"].startswith("connect errno")
    assert out["@192.0.2.1"] == f"connect errno {errno.ENETUNREACH}"
    assert out["@2001:db8::1"] == f"connect errno {errno.ENETUNREACH}"
    assert server.accepted == 0
    assert any(d["protocol"] == "captured" and not d["allowed"] and d["host"] == "127.0.0.1"
               and "no allow rule matches 127.0.0.1" in d["reason"] for d in decisions)


def test_an_allowed_address_literal_is_captured_and_relayed(jail: Path, tmp_path: Path,
                                                            server: LineServer) -> None:
    """``--allow-host 127.0.0.1:PORT``: a tool with no proxy variables connecting to that
    address reaches the proxy and is relayed to the host's 127.0.0.1:PORT (issue 34 item 5).
    Another loopback address on the same port is captured and refused; IPv6 loopback, not
    in the list, finds no listener. The previous test is the negative control (the same
    address, not allowed: the server sees nothing)."""
    out, decisions = _run(jail, tmp_path, server.port, "@127.0.0.1", "@127.0.0.2", "@::1",
                          allow_hosts=(f"127.0.0.1:{server.port}",))
    assert out["env"] == []  # no proxy variable left to the client
    assert out["@127.0.0.1"] == "SSH-2.0-line-server\r\necho hello\n", out
    assert not out["@127.0.0.2"].startswith("SSH-2.0")
    assert out["@::1"].startswith("connect errno")
    assert server.accepted == 1
    captured = {d["host"]: d for d in decisions if d["protocol"] == "captured"}
    assert captured["127.0.0.1"]["allowed"] is True
    assert captured["127.0.0.1"]["response"] == "relayed"
    assert captured["127.0.0.2"]["allowed"] is False


_UDP = r"""
import socket, struct, sys
port = int(sys.argv[1])
q = struct.pack("!HHHHHH", 1, 0x0100, 1, 0, 0, 0) + b"\x09localhost\x00\x00\x01\x00\x01"
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.settimeout(10)
u.sendto(q, ("127.0.0.53", 53))
address = socket.inet_ntoa(u.recv(512)[-4:])
results = []
for target in ((address, port), ("127.0.0.1", port)):
    try:
        results.append(u.sendto(b"datagram", target))
    except OSError as e:
        results.append(-e.errno)
print(address, *results)
"""


def test_udp_other_than_the_resolver_stays_inside(jail: Path, tmp_path: Path) -> None:
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    udp.settimeout(1.0)
    try:
        port = udp.getsockname()[1]
        run = Sandbox(Policy(jail=str(jail), network="allow",
                             allow_hosts=(f"localhost:{port}", f"127.0.0.1:{port}"))).run(
            ["python3", "-c", _UDP, str(port)], capture_output=True, timeout=TIMEOUT)
        assert run.returncode == 0, run.stderr.decode()
        address, *_ = run.stdout.decode().split()
        assert _synthetic(address)
        with pytest.raises(socket.timeout):
            udp.recvfrom(100)  # neither datagram left the sandbox's namespace
        # control: the same datagram sent from the host arrives
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"datagram", ("127.0.0.1", port))
        assert udp.recvfrom(100)[0] == b"datagram"
    finally:
        udp.close()


def test_glibc_resolves_through_the_resolver(jail: Path, tmp_path: Path) -> None:
    # getaddrinfo in the sandbox reads the view's /etc/resolv.conf: an allowed name not in
    # /etc/hosts gets a synthetic address, a denied one fails; AF_INET6 finds nothing.
    code = ("import socket\n"
            "for n in ('allowed.test', 'denied.test'):\n"
            "    try:\n"
            "        print(n, socket.getaddrinfo(n, 80, socket.AF_INET, socket.SOCK_STREAM)"
            "[0][4][0])\n"
            "    except socket.gaierror as e:\n"
            "        print(n, 'gaierror', e.errno)\n"
            "print(open('/etc/resolv.conf').read().split('nameserver ')[1].split()[0])\n")
    run = Sandbox(Policy(jail=str(jail), network="allow", allow_hosts=("allowed.test",))).run(
        ["python3", "-c", code], capture_output=True, timeout=TIMEOUT)
    assert run.returncode == 0, run.stderr.decode()
    lines = run.stdout.decode().splitlines()
    name, address = lines[0].split()
    assert name == "allowed.test" and _synthetic(address)
    assert lines[1].startswith("denied.test gaierror")
    assert lines[2] == RESOLVER_ADDRESS[0]


def test_resolv_conf_names_the_resolver() -> None:
    from hcp_linux.plan.confinement import RESOLV_CONF
    text = Path(RESOLV_CONF).read_text()
    assert [line.split()[1] for line in text.splitlines() if line.startswith("nameserver")] \
        == [RESOLVER_ADDRESS[0]] and RESOLVER_ADDRESS[1] == 53
    assert os.stat(RESOLV_CONF).st_mode & 0o004  # readable by a sandbox of any user


def test_every_run_of_a_sandbox_is_captured(jail: Path, tmp_path: Path,
                                            server: LineServer) -> None:
    # Repeated runs of one policy: the native executor hands them to spares prepared ahead,
    # which bind the capture before they drop their capabilities. Each run gets its own
    # sockets and its own synthetic addresses.
    from hcp_linux import native
    sandbox = Sandbox(Policy(jail=str(jail), network="allow",
                             allow_hosts=(f"localhost:{server.port}", f"127.0.0.1:{server.port}")))
    ready = native.stats["ready"]
    executors = set()
    for _ in range(6):
        proc = sandbox.spawn(["python3", "-c", _CLIENT, str(server.port), "localhost"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = proc.communicate(timeout=TIMEOUT)
        assert proc.returncode == 0, err.decode()
        assert json.loads(out)["localhost"]["talk"] == "SSH-2.0-line-server\r\necho hello\n"
        executors.add(proc.receipt["executor"])
    assert server.accepted == 6
    if executors == {"native"}:
        assert native.stats["ready"] > ready  # the spare path was taken


class RecordingServer(LoopbackServer):
    """A server on the host's 127.0.0.1 that keeps every byte each connection sent it."""

    def __init__(self) -> None:
        self.received: list[bytes] = []
        super().__init__()

    def handle(self, conn: socket.socket) -> None:
        got = b""
        try:
            while chunk := conn.recv(4096):
                got += chunk
        finally:
            self.received.append(got)


#: Sends what argv[2] names to the synthetic address of "localhost": a ClientHello for a
#: server name, or an HTTP request with a Host header; prints what came back (nothing: EOF).
_FIRST_BYTES = r"""
import socket, struct, sys
port, kind, name = int(sys.argv[1]), sys.argv[2], sys.argv[3].encode()
q = struct.pack("!HHHHHH", 1, 0x0100, 1, 0, 0, 0) + b"\x09localhost\x00\x00\x01\x00\x01"
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.settimeout(10)
u.sendto(q, ("127.0.0.53", 53))
address = socket.inet_ntoa(u.recv(512)[-4:])
if kind == "sni":
    entry = b"\0" + len(name).to_bytes(2, "big") + name
    ext = b"\0\0" + (len(entry) + 2).to_bytes(2, "big") + len(entry).to_bytes(2, "big") + entry
    body = (b"\x03\x03" + bytes(32) + b"\0" + b"\0\x02\x13\x01" + b"\x01\0"
            + len(ext).to_bytes(2, "big") + ext)
    data = b"\x16\x03\x01" + (len(body) + 4).to_bytes(2, "big") + b"\x01" \
        + len(body).to_bytes(3, "big") + body
else:
    data = b"GET / HTTP/1.1\r\nHost: " + name + b":%d\r\n\r\n" % port
c = socket.create_connection((address, port), timeout=10)
c.sendall(data)
c.shutdown(socket.SHUT_WR)
print(repr(c.recv(100)))
"""


@pytest.mark.parametrize("kind", ["sni", "host"])
def test_first_bytes_naming_another_host_are_not_sent(jail: Path, tmp_path: Path,
                                                      kind: str) -> None:
    srv = RecordingServer()
    try:
        log = tmp_path / "egress.jsonl"
        sandbox = Sandbox(Policy(jail=str(jail), network="allow", proxy_log=str(log),
                                 allow_hosts=(f"localhost:{srv.port}", f"127.0.0.1:{srv.port}",
                                              f"other.test:{srv.port}")))
        for name in ("other.test", "localhost"):  # the second is the control: it arrives
            run = sandbox.run(["python3", "-c", _FIRST_BYTES, str(srv.port), kind, name],
                              capture_output=True, timeout=TIMEOUT)
            assert run.returncode == 0, run.stderr.decode()
        deadline = 50
        while len(srv.received) < 2 and deadline:
            threading.Event().wait(0.1)
            deadline -= 1
        # the upstream was dialled for each (the destination is decided first), but the
        # bytes naming another host never reached it; the control's did
        assert len(srv.received) == 2
        assert srv.received[0] == b""
        assert (b"localhost" in srv.received[1]) and len(srv.received[1]) > 20
        decisions = [json.loads(line) for line in log.read_text().splitlines()]
        refused = [d for d in decisions if d["protocol"] == "captured" and not d["allowed"]]
        assert len(refused) == 1 and "other.test" in refused[0]["reason"]
    finally:
        srv.close()


#: OpenSSH itself, with no proxy setting, to the synthetic address of an allowed name (asked
#: by hand: inside, /etc/hosts answers "localhost" as the sandbox's own loopback).
_SSH = r"""
import os, socket, struct, subprocess, sys
for key in list(os.environ):
    if key.lower().endswith("_proxy"):
        del os.environ[key]
q = struct.pack("!HHHHHH", 1, 0x0100, 1, 0, 0, 0) + b"\x09localhost\x00\x00\x01\x00\x01"
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.settimeout(10)
u.sendto(q, ("127.0.0.53", 53))
address = socket.inet_ntoa(u.recv(512)[-4:])
subprocess.run(["ssh", "-v", "-F", "/dev/null", "-o", "BatchMode=yes",
                "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                "-o", "ConnectTimeout=10", "-p", sys.argv[1], address, "true"])
"""


@pytest.mark.skipif(not os.path.exists("/usr/bin/ssh"), reason="no OpenSSH client here")
def test_openssh_reaches_an_allowed_host_through_the_capture(jail: Path, tmp_path: Path,
                                                             server: LineServer) -> None:
    # The line server is no ssh server: ssh gets as far as the banners and key exchange,
    # which is the proof that its TCP went through the capture, the proxy and out.
    run = Sandbox(Policy(jail=str(jail), network="allow",
                         allow_hosts=(f"localhost:{server.port}", f"127.0.0.1:{server.port}"))
                  ).run(["python3", "-c", _SSH, str(server.port)], capture_output=True,
                        timeout=TIMEOUT)
    err = run.stderr.decode(errors="replace")
    assert "Connection established" in err, err
    assert "remote software version line-server" in err, err
    assert server.accepted == 1


def test_capture_ports() -> None:
    from hcp_linux.egress import EgressPolicy
    from hcp_linux.egress.capture import capture_ports
    from hcp_linux.protocol import CAPTURE_PORTS_MAX, PROXY_ADDRESS
    # an IP or CIDR entry's ports are captured too (issue 34), one too broad is not
    assert capture_ports(EgressPolicy.parse(["a.test", "*.b.test:22", "c.test:*",
                                             "10.0.0.0/8:5432", "0.0.0.0/0:8443"])) \
        == (22, 80, 443, 5432)
    many = [f"n.test:{p}" for p in range(1000, 1100)]
    assert capture_ports(EgressPolicy.parse(many)) == tuple(range(1000, 1000 + CAPTURE_PORTS_MAX))
    # never the proxy's own port: it is listening there already
    assert capture_ports(EgressPolicy.parse([f"a.test:{PROXY_ADDRESS[1]}"])) == ()


def test_a_name_on_the_proxy_port_does_not_break_the_run(jail: Path) -> None:
    # it did: the capture listener took 0.0.0.0:3128 and proxy-listen failed (EADDRINUSE)
    run = Sandbox(Policy(jail=str(jail), network="allow",
                         allow_hosts=("example.com:3128", "example.com"))).run(
        ["python3", "-c", "print('ran')"], capture_output=True, timeout=TIMEOUT)
    assert (run.returncode, run.stdout) == (0, b"ran\n"), run.stderr.decode()


_RESOLVED_HOST = r"""
set -e
cp -a /etc "$W/etc"
rm -f "$W/etc/resolv.conf"
ln -s ../run/systemd/resolve/stub-resolv.conf "$W/etc/resolv.conf"
mount --bind "$W/etc" /etc
mkdir -p "$W/run"
mount --bind "$W/run" /run
mkdir -p /run/systemd/resolve
echo "nameserver 10.9.9.9" > /run/systemd/resolve/stub-resolv.conf
cd "$W/jail"
"$PY" -m hcp_linux run $EXECUTOR --network allow --allow-host example.com -- \
    sh -c 'grep -c "^nameserver 127.0.0.53" /etc/resolv.conf; getent hosts example.com'
echo "host: $(cat /run/systemd/resolve/stub-resolv.conf)"
"""


@pytest.mark.root_only
@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a systemd-resolved /etc in a namespace")
def test_a_symlinked_resolv_conf_is_replaced_in_the_view(tmp_path: Path) -> None:
    """Ubuntu's /etc/resolv.conf is a symlink into /run (systemd-resolved): the view's is the
    sandbox's resolver all the same, and the host's stub file is untouched. Simulated in a
    private mount namespace of the test's own, with /etc and /run bound over copies."""
    (tmp_path / "jail").mkdir()
    env = {**os.environ, "W": str(tmp_path), "PY": sys.executable,
           "EXECUTOR": " ".join(EXECUTOR_ARGS)}
    p = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                        _RESOLVED_HOST], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0] == "1", p.stdout  # our resolver, not the host's stub
    assert lines[1].startswith("198.18.") and lines[1].split()[1] == "example.com", p.stdout
    assert lines[2] == "host: nameserver 10.9.9.9", p.stdout  # control: the host's, as it was


#: Like _FIRST_BYTES, but the message is sent in pieces (TCP_NODELAY, a pause between sends)
#: so that no piece alone holds the whole Host header or server name. argv: port, kind, name.
_SPLIT = r"""
import socket, struct, sys, time
port, kind, name = int(sys.argv[1]), sys.argv[2], sys.argv[3].encode()
q = struct.pack("!HHHHHH", 1, 0x0100, 1, 0, 0, 0) + b"\x09localhost\x00\x00\x01\x00\x01"
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.settimeout(10)
u.sendto(q, ("127.0.0.53", 53))
address = socket.inet_ntoa(u.recv(512)[-4:])
here = b"localhost:%d" % port
there = name + b":%d" % port
if kind == "sni":
    entry = b"\0" + len(name).to_bytes(2, "big") + name
    ext = b"\0\0" + (len(entry) + 2).to_bytes(2, "big") + len(entry).to_bytes(2, "big") + entry
    pad = b"\x00\x15" + (300).to_bytes(2, "big") + bytes(300)  # padding before the SNI
    exts = pad + ext
    body = (b"\x03\x03" + bytes(32) + b"\0" + b"\0\x02\x13\x01" + b"\x01\0"
            + len(exts).to_bytes(2, "big") + exts)
    data = b"\x16\x03\x01" + (len(body) + 4).to_bytes(2, "big") + b"\x01" \
        + len(body).to_bytes(3, "big") + body
    pieces = [data[:5], data[5:200], data[200:-len(name) // 2], data[-len(name) // 2:]]
elif kind == "host":
    data = b"GET / HTTP/1.1\r\nUser-Agent: split\r\nHo" + b"st: " + there + b"\r\n\r\n"
    pieces = [data[:20], data[20:36], data[36:-6], data[-6:]]
elif kind == "keepalive":  # the first request names localhost, the second the name
    pieces = [b"GET /1 HTTP/1.1\r\nHost: " + here + b"\r\n\r\n",
              b"GET /2 HTTP/1.1\r\nHo", b"st: " + there + b"\r\n\r\n"]
elif kind == "two-hosts":
    pieces = [b"GET / HTTP/1.1\r\nHost: " + here + b"\r\n", b"Host: " + there + b"\r\n\r\n"]
else:  # "absolute": an absolute-form target naming the name, Host naming localhost
    pieces = [b"GET http://" + there + b"/ HTTP/1.1\r\n", b"Host: " + here + b"\r\n\r\n"]
c = socket.create_connection((address, port), timeout=10)
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
try:
    for piece in pieces:
        c.sendall(piece)
        time.sleep(0.2)
    c.shutdown(socket.SHUT_WR)
    print(repr(c.recv(100)))
except OSError as e:
    print("errno", e.errno)
"""


def _split_runs(jail: Path, tmp_path: Path, kind: str, names: tuple[str, ...]
                ) -> tuple[list[bytes], list[dict]]:
    """What the upstream received from each run of _SPLIT (one per name, in order), and the
    proxy's decisions."""
    srv = RecordingServer()
    try:
        log = tmp_path / "egress.jsonl"
        sandbox = Sandbox(Policy(jail=str(jail), network="allow", proxy_log=str(log),
                                 allow_hosts=(f"localhost:{srv.port}", f"127.0.0.1:{srv.port}",
                                              f"other.test:{srv.port}")))
        for name in names:
            run = sandbox.run(["python3", "-c", _SPLIT, str(srv.port), kind, name],
                              capture_output=True, timeout=TIMEOUT)
            assert run.returncode == 0, run.stderr.decode()
            deadline = 50
            while len(srv.received) < names.index(name) + 1 and deadline:
                threading.Event().wait(0.1)
                deadline -= 1
        assert len(srv.received) == len(names)
        return srv.received, [json.loads(line) for line in log.read_text().splitlines()]
    finally:
        srv.close()


@pytest.mark.parametrize("kind", ["sni", "host"])
def test_a_split_first_message_naming_another_host_is_not_sent(jail: Path, tmp_path: Path,
                                                               kind: str) -> None:
    received, decisions = _split_runs(jail, tmp_path, kind, ("other.test", "localhost"))
    assert received[0] == b""  # dialled (the destination decides first), sent nothing
    assert b"localhost" in received[1] and len(received[1]) > 40  # control: the whole message
    refused = [d for d in decisions if d["protocol"] == "captured" and not d["allowed"]]
    assert len(refused) == 1 and "other.test" in refused[0]["reason"], decisions


@pytest.mark.parametrize("kind", ["keepalive", "two-hosts", "absolute"])
def test_a_request_naming_another_host_later_or_twice_is_not_sent(jail: Path, tmp_path: Path,
                                                                  kind: str) -> None:
    received, decisions = _split_runs(jail, tmp_path, kind, ("other.test", "localhost"))
    if kind == "keepalive":  # the first request went on, the second did not
        assert received[0] == b"GET /1 HTTP/1.1\r\nHost: localhost:%d\r\n\r\n" % int(
            received[0].split(b":")[-1].split(b"\r")[0])
        assert received[1].count(b"GET /") == 2  # control: both requests name localhost
    elif kind == "two-hosts":  # refused even when both name localhost (servers differ on
        # which one counts); the control with one Host header is the "host" test above
        assert received == [b"", b""]
        refused = [d for d in decisions if d["protocol"] == "captured" and not d["allowed"]]
        assert len(refused) == 2 and all("Host" in d["reason"] for d in refused), decisions
        return
    else:
        assert received[0] == b""
        assert received[1].startswith(b"GET ") and received[1].endswith(b"\r\n\r\n")
    refused = [d for d in decisions if d["protocol"] == "captured" and not d["allowed"]]
    assert len(refused) == 1, decisions
