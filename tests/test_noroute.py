"""Connect and send attempts that find no route under `network = "allow"` are recorded (#20).

Inside the sandbox's own network namespace a raw address outside loopback and the synthetic
range has no route: the kernel refuses connect() ENETUNREACH and nothing is sent anywhere.
The filter hands connect(), every sendto() that names a destination, and every sendmsg() and
sendmmsg() to the runtime's listener, which records those attempts and lets the kernel run
every call ("continue"). Raw destinations are documentation addresses
(192.0.2.1, 2001:db8::1: RFC 5737, 3849) that have no route inside; servers are the
sandbox's own loopback or the host's 127.0.0.1. Each refusal has its control: the same
client's loopback connect inside works, and the filter without the observer gives the same
errno (the kernel decides, not the listener). Both executors, root and nobody.
"""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from sandboxing import TIMEOUT, hcp_argv, jail, stuck_seccomp_listener  # noqa: F401

import hcp_linux.seccomp_profiles as seccomp_profiles
from hcp_linux import Policy, Sandbox, native
from hcp_linux.plan import rulesets
from hcp_linux.observe import denials as denials_mod
from hcp_linux.egress.routes import MMSG_READ, unrouted
from hcp_linux.protocol import HANDOVER_MARK
from hcp_linux.seccomp_profiles import bpf
from hcp_linux.seccomp_profiles.machines import native_machine
from hcp_linux.seccomp_profiles.syscalls import native_number

EXECUTORS = ["ctypes"] + (["native"] if native.binary() is not None else [])

#: A client: for each "tcp:ADDR:PORT" / "udp:ADDR:PORT" a connect(), its errno name ("ok");
#: "echo" first serves a line on the sandbox's own 127.0.0.1 and reaches it by connect().
#: Prints JSON: {target: result}.
_CLIENT = r"""
import errno, json, socket, sys, threading
out = {}
def connect(kind, address, port):
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM if kind == "tcp" else socket.SOCK_DGRAM)
    s.settimeout(5)
    try:
        s.connect((address, port))
        return s, "ok"
    except OSError as e:
        s.close()
        return None, errno.errorcode.get(e.errno, str(e.errno))
for target in sys.argv[1:]:
    if target == "echo":
        srv = socket.create_server(("127.0.0.1", 0))
        srv.settimeout(5)
        got = []
        def serve():
            try:
                c, _ = srv.accept()
            except OSError as e:
                got.append("accept " + type(e).__name__)
                return
            got.append(c.recv(10).decode())
            c.close()
        t = threading.Thread(target=serve)
        t.start()
        s, r = connect("tcp", "127.0.0.1", srv.getsockname()[1])
        if s is not None:
            s.sendall(b"hello")
            s.close()
        t.join()
        out[target] = [r] + got
        continue
    kind, rest = target.split(":", 1)
    address, port = rest.rsplit(":", 1)
    s, out[target] = connect(kind, address, int(port))
    if s is not None:
        s.close()
print(json.dumps(out))
"""

_RAW = ["tcp:192.0.2.1:9", "udp:192.0.2.1:53", "tcp:2001:db8::1:443", "tcp:::ffff:192.0.2.7:80"]


def _policy(jail: Path, **kw) -> Policy:
    return Policy(jail=str(jail), network="allow", allow_hosts=("example.com",), **kw)


def _run(jail: Path, executor: str, *targets: str, **kw):  # type: ignore[no-untyped-def]
    run = Sandbox(_policy(jail), executor=executor).run(
        ["python3", "-c", _CLIENT, *targets], capture_output=True, timeout=TIMEOUT, **kw)
    assert run.returncode == 0, run.stderr.decode()
    return json.loads(run.stdout), run.receipt


def _no_route(receipt: dict) -> list[tuple]:
    return [(d["address"], d["port"]) for d in receipt["denials"]
            if d["layer"] == "network" and d.get("what") == "connect"]


@pytest.mark.parametrize("executor", EXECUTORS)
def test_raw_connects_are_refused_and_recorded(jail: Path, executor: str) -> None:
    out, receipt = _run(jail, executor, "echo", *_RAW)
    # control in the same run: the sandbox's own loopback is reached (the listener let it run)
    assert out["echo"] == ["ok", "hello"]
    assert {t: out[t] for t in _RAW} == dict.fromkeys(_RAW, "ENETUNREACH")
    assert _no_route(receipt) == [("192.0.2.1", 9), ("192.0.2.1", 53), ("2001:db8::1", 443),
                                  ("::ffff:192.0.2.7", 80)]
    records = [d for d in receipt["denials"] if d.get("what") == "connect"]
    assert len({d["pid"] for d in records}) == 1 and records[0]["pid"] > 0
    for d in records:
        assert d["errno"] == "ENETUNREACH" and d["reason"] == denials_mod.NO_ROUTE
        assert "--allow-host" in d["hint"]
    assert "no route" in receipt["denial_layers"]["network"]
    assert "network-observe" in receipt["layers"]["seccomp"]["profiles"]


@pytest.mark.parametrize("executor", EXECUTORS)
def test_the_kernel_decides_the_same_without_the_observer(
        jail: Path, executor: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The filter without notifications (today's, byte for byte): the same errnos, so the
    listener's "continue" changes no answer; and nothing is recorded."""
    monkeypatch.setattr(rulesets, "_recording", False)  # set_denial_records(False)
    out, receipt = _run(jail, executor, "echo", *_RAW)
    assert out["echo"] == ["ok", "hello"]
    assert {t: out[t] for t in _RAW} == dict.fromkeys(_RAW, "ENETUNREACH")
    assert _no_route(receipt) == []
    assert "no seccomp listener" in receipt["denial_layers"]["network"]


@pytest.mark.parametrize("executor", EXECUTORS)
def test_loopback_connects_record_nothing(jail: Path, executor: str) -> None:
    out, receipt = _run(jail, executor, "echo", "udp:127.0.0.53:53", "tcp:::1:9",
                        "tcp:0.0.0.0:9", "tcp:198.18.0.1:9", "udp:::ffff:127.0.0.1:9")
    assert out["echo"] == ["ok", "hello"]
    assert out["udp:127.0.0.53:53"] == "ok" and out["udp:::ffff:127.0.0.1:9"] == "ok"
    assert out["tcp:::1:9"] == "ECONNREFUSED" and out["tcp:0.0.0.0:9"] == "ECONNREFUSED"
    assert out["tcp:198.18.0.1:9"] == "ECONNREFUSED"  # local, no capture on port 9
    assert receipt["denials"] == []


@pytest.mark.parametrize("executor", EXECUTORS)
def test_an_allowed_name_through_the_capture_records_nothing(jail: Path, tmp_path: Path,
                                                             executor: str) -> None:
    from test_egress_capture import _CLIENT as NAME_CLIENT
    from test_egress_capture import LineServer

    server = LineServer()
    try:
        run = Sandbox(Policy(jail=str(jail), network="allow", allow_hosts=(
            f"localhost:{server.port}", f"127.0.0.1:{server.port}")), executor=executor).run(
            ["python3", "-c", NAME_CLIENT, str(server.port), "localhost"],
            capture_output=True, timeout=TIMEOUT)
    finally:
        server.close()
    assert run.returncode == 0, run.stderr.decode()
    assert json.loads(run.stdout)["localhost"]["talk"] == "SSH-2.0-line-server\r\necho hello\n"
    assert server.accepted == 1
    assert run.receipt["denials"] == []


@pytest.mark.parametrize("executor", EXECUTORS)
def test_an_unreadable_sockaddr_is_the_kernels_to_answer(
        jail: Path, executor: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """connect() with a sockaddr pointer nothing is mapped at: the listener cannot read it
    (EFAULT), records nothing, and lets the kernel answer: EFAULT, as without the observer;
    the run's other connect is recorded as ever."""
    code = ("import ctypes, errno, socket\n"
            "s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            "r = libc.connect(s.fileno(), ctypes.c_void_p(8), 16)\n"
            "print(r, errno.errorcode[ctypes.get_errno()])\n"
            "try:\n    socket.create_connection(('192.0.2.1', 9))\n"
            "except OSError as e:\n    print(errno.errorcode[e.errno])\n")
    run = Sandbox(_policy(jail), executor=executor).run(
        ["python3", "-c", code], capture_output=True, timeout=TIMEOUT)
    assert run.returncode == 0, run.stderr.decode()
    assert run.stdout == b"-1 EFAULT\nENETUNREACH\n"
    assert _no_route(run.receipt) == [("192.0.2.1", 9)]
    assert run.receipt["denial_layers"]["network"].startswith("recorded")
    monkeypatch.setattr(rulesets, "_recording", False)  # control: today's filter, same answers
    control = Sandbox(_policy(jail), executor=executor).run(
        ["python3", "-c", code], capture_output=True, timeout=TIMEOUT)
    assert control.stdout == run.stdout and _no_route(control.receipt) == []


@pytest.mark.parametrize("executor", EXECUTORS)
def test_listener_gone_connects_still_refused(jail: Path, executor: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The listener fd is closed (as when the runtime dies): the kernel answers every
    notified connect() ENOSYS itself: the raw one is refused, and so is the loopback one,
    which reaches nothing (the server inside accepts no connection)."""
    def drop(self):  # type: ignore[no-untyped-def]
        import os
        os.close(self.listener)
        self.listener = -1

    monkeypatch.setattr(denials_mod.SeccompListener, "start", drop)
    out, receipt = _run(jail, executor, "echo", "tcp:192.0.2.1:9")
    assert out == {"echo": ["ENOSYS", "accept TimeoutError"], "tcp:192.0.2.1:9": "ENOSYS"}
    assert receipt["denials"] == []


@pytest.mark.parametrize("executor", EXECUTORS)
def test_stuck_listener_the_timeout_still_kills(jail: Path, executor: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The listener does not answer: the connect() waits in the kernel, never made, and the
    run's timeout kills the sandbox all the same."""
    code = ("import socket; print('before', flush=True); "
            "socket.socket(socket.AF_INET, socket.SOCK_DGRAM).connect(('127.0.0.1', 9)); "
            "print('after', flush=True)")
    with stuck_seccomp_listener(monkeypatch):
        run = Sandbox(_policy(jail), executor=executor).run(
            ["python3", "-c", code], capture_output=True, timeout=3)
    assert run.timed_out
    assert run.stdout == b"before\n"  # never returned from connect
    assert run.receipt["denial_layers"]["seccomp"].startswith("incomplete: ")


@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_flood_of_raw_connects_is_bounded(jail: Path, executor: str) -> None:
    n = denials_mod.MAX_RECORDED + 50
    out, receipt = _run(jail, executor, *(f"udp:192.0.2.{i % 250 + 1}:{i + 1}" for i in range(n)))
    assert set(out.values()) == {"ENETUNREACH"} and len(out) == n
    assert len(_no_route(receipt)) == denials_mod.MAX_RECORDED
    assert receipt["denials_not_recorded"] == {"network": 50}


#: A sender: for each "udp:ADDR:PORT" a sendto() of one datagram, "tfo:ADDR:PORT" a TCP Fast
#: Open sendto() (MSG_FASTOPEN on an unconnected socket: a connect with data), "tcp:ADDR:PORT"
#: a sendto() on an unconnected TCP socket (the kernel ignores the address: EPIPE); "loop"
#: first: a UDP server on the sandbox's own 127.0.0.1 gets a sendto() (and says what it got),
#: then a TCP peer there gets 20 send()s and a sendto() naming a raw address, which the
#: kernel ignores on a connected socket (the data goes to the peer). Prints JSON.
_SENDER = r"""
import errno, json, socket, sys
out = {}
def name(e):
    return errno.errorcode.get(e.errno, str(e.errno))
for target in sys.argv[1:]:
    if target == "loop":
        srv = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        srv.bind(("127.0.0.1", 0))
        srv.settimeout(5)
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.sendto(b"to-loopback", srv.getsockname())
        out["udp-loop"] = srv.recv(100).decode()
        lst = socket.create_server(("127.0.0.1", 0))
        c = socket.create_connection(lst.getsockname(), timeout=5)
        peer, _ = lst.accept()
        for _ in range(20):
            c.send(b"s")
        c.sendto(b"T", ("192.0.2.1", 80))
        c.close()
        got = b""
        while len(got) < 21:
            chunk = peer.recv(100)
            if not chunk:
                break
            got += chunk
        out["tcp-loop"] = got.decode()
        continue
    kind, rest = target.split(":", 1)
    address, port = rest.rsplit(":", 1)
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    s = socket.socket(family, socket.SOCK_DGRAM if kind == "udp" else socket.SOCK_STREAM)
    try:
        if kind == "tfo":
            s.sendto(b"x", socket.MSG_FASTOPEN, (address, int(port)))
        else:
            s.sendto(b"x", (address, int(port)))
        out[target] = "ok"
    except OSError as e:
        out[target] = name(e)
    s.close()
print(json.dumps(out))
"""

_RAW_SENDS = ["udp:192.0.2.1:53", "udp:2001:db8::1:123", "udp:::ffff:192.0.2.9:53",
              "tfo:192.0.2.1:443", "tfo:2001:db8::1:22"]


def _send_records(receipt: dict) -> list[tuple]:
    return [(d["what"], d["address"], d["port"]) for d in receipt["denials"]
            if d["layer"] == "network" and d.get("what") != "connect" and "what" in d]


def _send(jail: Path, executor: str, *targets: str):  # type: ignore[no-untyped-def]
    run = Sandbox(_policy(jail), executor=executor).run(
        ["python3", "-c", _SENDER, *targets], capture_output=True, timeout=TIMEOUT)
    assert run.returncode == 0, run.stderr.decode()
    return json.loads(run.stdout), run.receipt


@pytest.mark.parametrize("executor", EXECUTORS)
def test_raw_sendtos_are_refused_and_recorded(jail: Path, executor: str) -> None:
    out, receipt = _send(jail, executor, "loop", *_RAW_SENDS, "tcp:192.0.2.1:80")
    # controls in the same run: loopback datagrams and a connected TCP peer are reached
    assert out["udp-loop"] == "to-loopback"
    assert out["tcp-loop"] == "s" * 20 + "T"
    assert {t: out[t] for t in _RAW_SENDS} == dict.fromkeys(_RAW_SENDS, "ENETUNREACH")
    assert out["tcp:192.0.2.1:80"] == "EPIPE"  # the address is ignored: not recorded
    assert _send_records(receipt) == [
        ("sendto", "192.0.2.1", 53), ("sendto", "2001:db8::1", 123),
        ("sendto", "::ffff:192.0.2.9", 53), ("sendto", "192.0.2.1", 443),
        ("sendto", "2001:db8::1", 22)]
    assert _no_route(receipt) == []  # no connect()
    records = [d for d in receipt["denials"] if d["layer"] == "network"]
    assert len(records) == 5 and len({d["pid"] for d in records}) == 1
    for d in records:
        assert d["errno"] == "ENETUNREACH" and d["reason"] == denials_mod.NO_ROUTE
    assert [d["hint"] for d in records] == [denials_mod.NO_ROUTE_UDP_HINT] * 3 + \
        [denials_mod.NO_ROUTE_HINT] * 2
    assert "connect() and send attempts" in receipt["denial_layers"]["network"]


@pytest.mark.parametrize("executor", EXECUTORS)
def test_sendto_the_kernel_decides_the_same_without_the_observer(
        jail: Path, executor: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rulesets, "_recording", False)  # set_denial_records(False)
    out, receipt = _send(jail, executor, "loop", *_RAW_SENDS, "tcp:192.0.2.1:80")
    assert out["udp-loop"] == "to-loopback" and out["tcp-loop"] == "s" * 20 + "T"
    assert {t: out[t] for t in _RAW_SENDS} == dict.fromkeys(_RAW_SENDS, "ENETUNREACH")
    assert out["tcp:192.0.2.1:80"] == "EPIPE"
    assert receipt["denials"] == []


@pytest.mark.parametrize("executor", EXECUTORS)
def test_send_without_a_destination_is_not_handed_over(
        jail: Path, executor: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """send() is sendto() with a NULL destination: the filter keeps it in the kernel. The
    listener sees the run's 2 addressed sendto()s (loopback UDP, the connected TCP socket's
    raw address) and not one of its 20 send()s."""
    seen: list[str] = []
    observe = denials_mod.SeccompListener._observe

    def counted(self, n, what):  # type: ignore[no-untyped-def]
        seen.append(what)
        return observe(self, n, what)

    monkeypatch.setattr(denials_mod.SeccompListener, "_observe", counted)
    out, receipt = _send(jail, executor, "loop")
    assert out == {"udp-loop": "to-loopback", "tcp-loop": "s" * 20 + "T"}
    assert seen.count("sendto") == 2
    assert receipt["denials"] == []


@pytest.mark.parametrize("executor", EXECUTORS)
def test_an_unreadable_sendto_address_is_the_kernels_to_answer(
        jail: Path, executor: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """sendto() with a destination pointer nothing is mapped at: EFAULT, as without the
    observer, and no record; the run's raw sendto() is recorded as ever."""
    code = ("import ctypes, errno, socket\n"
            "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            "r = libc.sendto(s.fileno(), b'x', 1, 0, ctypes.c_void_p(8), 16)\n"
            "print(r, errno.errorcode[ctypes.get_errno()])\n"
            "try:\n    s.sendto(b'x', ('192.0.2.1', 9))\n"
            "except OSError as e:\n    print(errno.errorcode[e.errno])\n")
    run = Sandbox(_policy(jail), executor=executor).run(
        ["python3", "-c", code], capture_output=True, timeout=TIMEOUT)
    assert run.returncode == 0, run.stderr.decode()
    assert run.stdout == b"-1 EFAULT\nENETUNREACH\n"
    assert _send_records(run.receipt) == [("sendto", "192.0.2.1", 9)]
    assert run.receipt["denial_layers"]["network"].startswith("recorded")
    monkeypatch.setattr(rulesets, "_recording", False)  # control: today's filter, same answers
    control = Sandbox(_policy(jail), executor=executor).run(
        ["python3", "-c", code], capture_output=True, timeout=TIMEOUT)
    assert control.stdout == run.stdout and control.receipt["denials"] == []


#: sendmsg() and sendmmsg() (through ctypes: the socket module has no sendmmsg, and its
#: sendmsg cannot pass a bad pointer). argv: tests "name=kind:ADDR:PORT[,kind:ADDR:PORT...]"
#: where a kind is "udp" (a sendmsg, or a sendmmsg of the list), "tfo" (sendmsg
#: MSG_FASTOPEN on a TCP socket), "mmsg" (one sendmmsg of every address in the list, "loop"
#: standing for the own 127.0.0.1 receiver), "badmsg" (sendmsg with a msghdr at address 8),
#: "badname" (a msghdr whose msg_name is at 8), "longname" (msg_namelen 200: the kernel
#: reads the first 128 bytes), "negname" (msg_namelen negative as an int), "marked"
#: (sendmsg with HANDOVER_MARK in its flags), "unix" (fds over a socketpair); prints JSON
#: {name: result}, a result "ok N" or the errno's name; "received": what the receiver got.
_MSG_SENDER = r"""
import ctypes, errno, json, socket, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
class Iov(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
class Msg(ctypes.Structure):
    _fields_ = [("name", ctypes.c_void_p), ("namelen", ctypes.c_uint32),
                ("iov", ctypes.POINTER(Iov)), ("iovlen", ctypes.c_size_t),
                ("control", ctypes.c_void_p), ("controllen", ctypes.c_size_t),
                ("flags", ctypes.c_int)]
class MMsg(ctypes.Structure):
    _fields_ = [("hdr", Msg), ("len", ctypes.c_uint)]
rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
rx.bind(("127.0.0.1", 0))
rx.settimeout(0.5)
keep = []
def sockaddr(address, port):
    if address == "loop":
        address, port = rx.getsockname()
    if ":" in address:
        raw = struct.pack("=H", socket.AF_INET6) + struct.pack("!HI", port, 0) + \
            socket.inet_pton(socket.AF_INET6, address) + bytes(4)
    else:
        raw = struct.pack("=H", socket.AF_INET) + struct.pack("!H", port) + \
            socket.inet_aton(address) + bytes(8)
    buf = ctypes.create_string_buffer(raw, len(raw))
    keep.append(buf)
    return ctypes.cast(buf, ctypes.c_void_p).value, len(raw)
def header(target, name=None):
    data = ctypes.create_string_buffer(b"x", 1)
    iov = Iov(ctypes.cast(data, ctypes.c_void_p), 1)
    keep.extend((data, iov))
    msg = Msg(None, 0, ctypes.pointer(iov), 1, None, 0, 0)
    if name is not None:
        msg.name, msg.namelen = name
    elif target:
        address, port = target.rsplit(":", 1)
        msg.name, msg.namelen = sockaddr(address, int(port))
    return msg
def result(r):
    return "ok %d" % r if r >= 0 else errno.errorcode[ctypes.get_errno()]
def family(target):
    return socket.AF_INET6 if ":" in target.rsplit(":", 1)[0] else socket.AF_INET
out = {}
for arg in sys.argv[1:]:
    name, spec = arg.split("=", 1)
    kind, _, rest = spec.partition(":")
    targets = rest.split(",") if rest else []
    if kind == "unix":
        a, b = socket.socketpair()
        r, w = __import__("os").pipe()
        a.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", w))])
        _, fds, _, _ = socket.recv_fds(b, 1, 1)
        out[name] = "ok %d" % len(fds)
        continue
    if kind == "tfo":
        s = socket.socket(family(targets[0]), socket.SOCK_STREAM)
        msg = header(targets[0])
        out[name] = result(libc.sendmsg(s.fileno(), ctypes.byref(msg), socket.MSG_FASTOPEN))
        continue
    s = socket.socket(family(targets[0]) if targets else socket.AF_INET, socket.SOCK_DGRAM)
    if kind == "udp":
        msg = header(targets[0])
        out[name] = result(libc.sendmsg(s.fileno(), ctypes.byref(msg), 0))
    elif kind == "mmsg":
        vec = (MMsg * len(targets))()
        for i, t in enumerate(targets):
            vec[i].hdr = header(t if t != "loop" else "loop:0")
        out[name] = result(libc.sendmmsg(s.fileno(), vec, len(targets), 0))
    elif kind == "badmsg":
        out[name] = result(libc.sendmsg(s.fileno(), ctypes.c_void_p(8), 0))
    elif kind == "badname":
        msg = header(None, (8, 16))
        out[name] = result(libc.sendmsg(s.fileno(), ctypes.byref(msg), 0))
    elif kind in ("longname", "negname"):
        msg = header(targets[0])
        msg.namelen = 200 if kind == "longname" else 0x80000000
        out[name] = result(libc.sendmsg(s.fileno(), ctypes.byref(msg), 0))
    elif kind == "marked":
        msg = header(targets[0])
        out[name] = result(libc.syscall(ctypes.c_long(int(sys.argv[0] and NR)), s.fileno(),
                                        ctypes.byref(msg), ctypes.c_ulong(MARK)))
got = 0
try:
    while True:
        rx.recv(10)
        got += 1
except socket.timeout:
    pass
out["received"] = got
print(json.dumps(out))
"""


def _msg_send(jail: Path, executor: str, *tests: str):  # type: ignore[no-untyped-def]
    machine = native_machine()
    assert machine is not None
    code = _MSG_SENDER.replace("int(sys.argv[0] and NR)", str(
        native_number("sendmsg", (), machine))).replace("MARK", str(HANDOVER_MARK))
    run = Sandbox(_policy(jail), executor=executor).run(
        ["python3", "-c", code, *tests], capture_output=True, timeout=TIMEOUT)
    assert run.returncode == 0, run.stderr.decode()
    return json.loads(run.stdout), run.receipt


_MSG_TESTS = ["v4=udp:192.0.2.1:53", "v6=udp:2001:db8::1:123", "loop=mmsg:loop",
              "tfo=tfo:192.0.2.1:443", "unix=unix", "mmsg=mmsg:loop,192.0.2.2:53,192.0.2.3:53",
              "mmsg-raw=mmsg:2001:db8::2:53"]


@pytest.mark.parametrize("executor", EXECUTORS)
def test_raw_sendmsgs_are_refused_and_recorded(jail: Path, executor: str) -> None:
    out, receipt = _msg_send(jail, executor, *_MSG_TESTS)
    assert out == {"v4": "ENETUNREACH", "v6": "ENETUNREACH", "loop": "ok 1",
                   "tfo": "ENETUNREACH", "unix": "ok 1",
                   "mmsg": "ok 1",  # the loopback entry sent, the kernel stopped at the next
                   "mmsg-raw": "ENETUNREACH", "received": 2}
    # one record per call: sendmmsg's first entry with no route (the kernel stopped there)
    assert _send_records(receipt) == [
        ("sendmsg", "192.0.2.1", 53), ("sendmsg", "2001:db8::1", 123),
        ("sendmsg", "192.0.2.1", 443), ("sendmmsg", "192.0.2.2", 53),
        ("sendmmsg", "2001:db8::2", 53)]
    hints = [d["hint"] for d in receipt["denials"]]
    assert hints == [denials_mod.NO_ROUTE_UDP_HINT] * 2 + [denials_mod.NO_ROUTE_HINT] + \
        [denials_mod.NO_ROUTE_UDP_HINT] * 2
    assert all(d["errno"] == "ENETUNREACH" for d in receipt["denials"])


@pytest.mark.parametrize("executor", EXECUTORS)
def test_sendmsg_the_kernel_decides_the_same_without_the_observer(
        jail: Path, executor: str, monkeypatch: pytest.MonkeyPatch) -> None:
    observed, _ = _msg_send(jail, executor, *_MSG_TESTS)
    monkeypatch.setattr(rulesets, "_recording", False)  # set_denial_records(False)
    out, receipt = _msg_send(jail, executor, *_MSG_TESTS)
    assert out == observed
    assert receipt["denials"] == []


@pytest.mark.parametrize("executor", EXECUTORS)
def test_malformed_msghdrs_are_the_kernels_to_answer(
        jail: Path, executor: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A msghdr pointer nothing is mapped at (EFAULT), a msg_name there (EFAULT), a
    negative msg_namelen (EINVAL): no record, the kernel's answer unchanged (control: the
    program without the observer); one past sockaddr_storage is cut to it by the kernel,
    which refuses the address ENETUNREACH: recorded. A sendmmsg() whose entry with no route
    comes after the first MMSG_READ is sent up to it and not recorded (the bound); a
    sendmsg() carrying the executors' mark is refused by the kernel all the same, unrecorded
    (the mark hides a call from the records, never from the routes)."""
    late = "late=mmsg:" + ",".join(["loop"] * MMSG_READ + ["192.0.2.4:53"])
    tests = ["fault=badmsg", "name=badname", "neg=negname:192.0.2.1:53",
             "long=longname:192.0.2.1:53", "marked=marked:192.0.2.1:53", late,
             "v4=udp:192.0.2.1:9"]
    out, receipt = _msg_send(jail, executor, *tests)
    assert out == {"fault": "EFAULT", "name": "EFAULT", "neg": "EINVAL",
                   "long": "ENETUNREACH", "marked": "ENETUNREACH", "late": f"ok {MMSG_READ}",
                   "v4": "ENETUNREACH", "received": MMSG_READ}
    assert _send_records(receipt) == [("sendmsg", "192.0.2.1", 53), ("sendmsg", "192.0.2.1", 9)]
    assert receipt["denial_layers"]["network"].startswith("recorded")
    monkeypatch.setattr(rulesets, "_recording", False)
    control, plain = _msg_send(jail, executor, *tests)
    assert control == out and plain["denials"] == []


def _explain_lines(jail: Path, script: str, *targets: str) -> list[str]:
    """The --explain lines of a run of ``script`` at ``targets`` under --network allow."""
    p = subprocess.run(hcp_argv(jail, "python3", "-c", script, *targets,
                                extra=["--network", "allow", "--allow-host", "example.com",
                                       "--explain"]),
                       capture_output=True, timeout=TIMEOUT, cwd=jail)
    assert p.returncode == 0, p.stderr
    lines = p.stderr.decode().splitlines()
    assert len(lines) == len(targets), lines
    return lines


def test_explain_prints_the_no_route_line(jail: Path) -> None:
    lines = _explain_lines(jail, _CLIENT, "tcp:192.0.2.1:22", "tcp:2001:db8::1:443")
    assert lines[0].startswith("blocked: connect to 192.0.2.1:22 (pid ")
    assert lines[1].startswith("blocked: connect to [2001:db8::1]:443 (pid ")
    for line in lines:
        assert "no route" in line and "--allow-host NAME:PORT" in line


def test_explain_prints_the_send_line(jail: Path) -> None:
    lines = _explain_lines(jail, _SENDER, "udp:192.0.2.1:53", "tfo:2001:db8::1:443")
    assert lines[0].startswith("blocked: send to 192.0.2.1:53 (pid ")
    assert "ENETUNREACH) — no route" in lines[0] and "--network host" in lines[0]
    assert lines[1].startswith("blocked: send to [2001:db8::1]:443 (pid ")
    assert "--allow-host NAME:PORT" in lines[1]


def _connect_answers(policy: Policy, layers: frozenset[str]) -> tuple[tuple[str, ...], bytes]:
    found = rulesets.seccomp_filter(policy, layers)
    assert found is not None
    prepared, names, _ = found
    return names, prepared.bpf


def test_only_allow_mode_programs_notify_connect(jail: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """network none (the default) and host: the very program they had (no connect rule);
    allow: the same program but for connect(), addressed sendto(), sendmsg() and sendmmsg(),
    which go to the listener."""
    machine = native_machine()
    assert machine is not None
    connect = native_number("connect", (), machine)
    layers = frozenset({"seccomp", "netns"})
    base = seccomp_profiles.compile_profiles(("baseline", "socket-families"), notify=True)
    for network in ("none", "host"):
        names, program = _connect_answers(Policy(jail=str(jail), network=network), layers)
        assert "network-observe" not in names
        assert program == base
    names, program = _connect_answers(_policy(jail), layers)
    assert names[-1] == "network-observe"
    assert bpf.run(program, connect, machine.audit_arch) == bpf.RET_USER_NOTIF
    assert bpf.run(base, connect, machine.audit_arch) == bpf.RET_ALLOW
    # sendto(): handed over only with a destination (argument 4); send() stays in the kernel
    sendto = native_number("sendto", (), machine)
    addressed, unaddressed = (3, 1, 1, 0, 0x7FFC0000, 16), (3, 1, 1, 0, 0, 0)
    assert bpf.run(program, sendto, machine.audit_arch, addressed) == bpf.RET_USER_NOTIF
    assert bpf.run(program, sendto, machine.audit_arch, unaddressed) == bpf.RET_ALLOW
    assert bpf.run(base, sendto, machine.audit_arch, addressed) == bpf.RET_ALLOW
    # sendmsg(), sendmmsg(): every one, but the executors' marked hand-overs
    sendmsg = native_number("sendmsg", (), machine)
    sendmmsg = native_number("sendmmsg", (), machine)
    for flags in (0, 0x4000, 0x20000000, 0xFFFFFFFF):
        assert bpf.run(program, sendmsg, machine.audit_arch, (3, 1, flags)) == \
            bpf.RET_USER_NOTIF, hex(flags)
    for flags in (HANDOVER_MARK, HANDOVER_MARK | 0x4000, 1 << 63):
        assert bpf.run(program, sendmsg, machine.audit_arch, (3, 1, flags)) == bpf.RET_ALLOW
    assert bpf.run(program, sendmmsg, machine.audit_arch, (3, 1, 2, 0)) == bpf.RET_USER_NOTIF
    assert bpf.run(program, sendmmsg, machine.audit_arch,
                   (3, 1, 2, HANDOVER_MARK)) == bpf.RET_USER_NOTIF
    for nr in (sendmsg, sendmmsg):
        assert bpf.run(base, nr, machine.audit_arch, (3, 1, 0, 0)) == bpf.RET_ALLOW
    insns = bpf.decode(program)
    base_insns = bpf.decode(base)
    for nr in range(0, 460):
        if nr not in (connect, sendmsg, sendmmsg):
            assert bpf.run(insns, nr, machine.audit_arch) == bpf.run(base_insns, nr,
                                                                     machine.audit_arch), nr
    # named in a policy, it is dropped where the runtime would not add it
    names, program = _connect_answers(Policy(jail=str(jail), seccomp_profiles=(
        "baseline", "socket-families", "network-observe")), layers)
    assert "network-observe" not in names and program == base
    # without its own network namespace, or without a listener: no observer
    names, _ = _connect_answers(_policy(jail), frozenset({"seccomp"}))
    assert "network-observe" not in names
    monkeypatch.setattr(rulesets, "_recording", False)  # set_denial_records(False)
    names, program = _connect_answers(_policy(jail), layers)
    assert "network-observe" not in names
    assert program == seccomp_profiles.compile_profiles(("baseline", "socket-families"))


def test_unrouted_matches_the_namespace() -> None:
    """The addresses the listener calls unrouted, as sockaddrs; the kernel's answers for
    them are the tests above (and egress.routes' docstring)."""
    import socket
    import struct

    def v4(a: str, port: int = 80) -> bytes:
        return struct.pack("=H", socket.AF_INET) + struct.pack("!H", port) + \
            socket.inet_aton(a) + bytes(8)

    def v6(a: str, port: int = 80) -> bytes:
        return struct.pack("=H", socket.AF_INET6) + struct.pack("!HI", port, 0) + \
            socket.inet_pton(socket.AF_INET6, a) + bytes(4)

    for reached in ("127.0.0.1", "127.9.9.9", "0.0.0.0", "198.18.0.1", "198.19.255.254"):
        assert unrouted(v4(reached)) is None, reached
    for reached in ("::1", "::", "::ffff:127.0.0.1", "::ffff:198.18.3.4", "::ffff:0.0.0.0",
                    "fe80::1", "ff02::1"):
        assert unrouted(v6(reached)) is None, reached
    assert unrouted(v4("192.0.2.1", 22)) == ("192.0.2.1", 22)
    assert unrouted(v4("198.20.0.1")) == ("198.20.0.1", 80)
    assert unrouted(v4("1.0.0.1")) == ("1.0.0.1", 80)
    assert unrouted(v6("2001:db8::1", 443)) == ("2001:db8::1", 443)
    assert unrouted(v6("::ffff:192.0.2.1")) == ("::ffff:192.0.2.1", 80)
    assert unrouted(v6("::127.0.0.1")) == ("::127.0.0.1", 80)  # v4-compatible: no route
    assert unrouted(v4("192.0.2.1")[:15]) is None  # too short: the kernel says EINVAL
    assert unrouted(v6("2001:db8::1")[:23]) is None
    assert unrouted(struct.pack("=H", socket.AF_UNIX) + b"/tmp/x\0") is None
    assert unrouted(b"") is None


@pytest.mark.skipif(native.binary() is None, reason="no hcp-exec")
def test_ready_spares_of_allow_plans_record_too(jail: Path) -> None:
    """An allow-mode plan repeats: ready spares, prepared with its program (which notifies
    connect), take it, and their raw connects are recorded like a direct spawn's."""
    native.set_spares("auto")
    native.spares.clear()
    try:
        before = dict(native.stats)
        outs = []
        for _ in range(6):
            outs.append(_run(jail, "native", "tcp:192.0.2.1:9"))
            time.sleep(0.05)  # let the keeper have one ready
        assert native.stats["ready"] > before["ready"], native.stats
    finally:
        native.spares.clear()
    for out, receipt in outs:
        assert out == {"tcp:192.0.2.1:9": "ENETUNREACH"}
        assert _no_route(receipt) == [("192.0.2.1", 9)]

