"""Property-based fuzzing of what the native client (hcp_linux/native/hcp_client.c) reads from
a server: the reply frame, parsed by hand in C.

A server of the user's own passes the client's checks, so a test's own socket can answer
anything. The client must then either take a well-formed refusal (``exit``, its status and
its text) or hand the run to the Python command, here a stub that exits 99 and runs nothing;
never die by a signal (an out-of-bounds read), never hang, never start a program a reply
names (the plan's binary is a path that does not exist: posix_spawn fails, and that falls
back too). Profiles: tests/fuzzing.py (``HYPOTHESIS_PROFILE=long``: 10,000 examples).
"""
from __future__ import annotations

import os
import socket
import struct
import subprocess
import threading
from pathlib import Path
from typing import Iterator

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import example, given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import sandboxing  # noqa: E402
from fuzzing import fuzz  # noqa: E402
from sandboxing import TIMEOUT, caller_env  # noqa: E402

FALLBACK = 99  # the stub Python command's status


class FakeServer:
    """Answers every connection's first frame with ``reply`` (raw bytes, length included),
    then closes it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.reply = b""
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen(8)
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                try:
                    conn.settimeout(TIMEOUT)
                    (n,) = struct.unpack("<I", _exact(conn, 4))
                    _exact(conn, n)
                    conn.sendall(self.reply)
                except (OSError, struct.error):
                    pass

    def close(self) -> None:
        self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        self.thread.join(TIMEOUT)


def _exact(conn: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = conn.recv(n - len(out))
        if not chunk:
            raise OSError("closed")
        out += chunk
    return out


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> Iterator[tuple[str, FakeServer]]:  # type: ignore[no-untyped-def]
    built = sandboxing.native_client()
    if built is None:
        pytest.skip("the native client is not built (make native)")
    where = tmp_path_factory.mktemp("fuzz-client")
    command = where / "hcp-linux"
    command.write_bytes(Path(built).read_bytes())
    command.chmod(0o755)
    stub = where / "hcp-linux-py"
    stub.write_text(f"#!/bin/sh\nexit {FALLBACK}\n")
    stub.chmod(0o755)
    server = FakeServer(where / "s.sock")
    yield str(command), server
    server.close()


def frame(items: list[bytes]) -> bytes:
    body = b"".join(struct.pack("<I", len(i)) + i for i in items)
    return struct.pack("<I", len(body)) + body


KINDS = st.sampled_from([b"plan", b"exit", b"fallback", b"ended", b"", b"plan\0"])
ITEM = st.binary(max_size=40) | st.sampled_from([b"0", b"2", b"255", b"256", b"-1", b"1.5",
                                                 b"inf", b"nan", b"1e400", b"7", b"x"])


@st.composite
def replies(draw) -> bytes:  # type: ignore[no-untyped-def]
    how = draw(st.sampled_from(["items", "items", "raw", "lying-length"]))
    if how == "raw":
        return draw(st.binary(max_size=200))
    items = [draw(KINDS)] + draw(st.lists(ITEM, max_size=12))
    if items[0] == b"plan" and len(items) > 1:
        items[1] = b"/nonexistent/hcp-exec"  # never a program that runs
    out = frame(items)
    if how == "lying-length":
        claimed = draw(st.integers(0, 2 ** 32 - 1))
        out = struct.pack("<I", claimed) + out[4:]
    return out


@fuzz(ci=200)
@given(reply=replies())
@example(reply=frame([b"exit", b"2", b"error: sandbox: no\n"]))
@example(reply=frame([b"plan"] + [b"/nonexistent/hcp-exec"] + [b""] * 9))
@example(reply=struct.pack("<I", 16 << 20) + b"x" * 8)
@example(reply=frame([b"exit", b"300", b"too big"]))
def test_any_reply_is_a_refusal_or_a_fallback(setup: tuple[str, FakeServer],
                                              reply: bytes) -> None:
    command, server = setup
    server.reply = reply
    p = subprocess.run([command, "run", "--", "/bin/true"], capture_output=True,
                       timeout=TIMEOUT, stdin=subprocess.DEVNULL, cwd="/",
                       env=caller_env({"HCP_LINUX_SERVER": str(server.path),
                                       "HCP_LINUX_NO_CONFIG": "1"}))
    assert p.returncode >= 0, f"killed by signal {-p.returncode}"
    items = _items(reply)
    if items is not None and len(items) == 3 and items[0] == b"exit" \
            and items[1].isdigit() and int(items[1]) <= 255:
        assert (p.returncode, p.stderr) == (int(items[1]), items[2])
    else:
        assert p.returncode == FALLBACK and p.stdout == b"", (p.returncode, p.stderr)


def _items(reply: bytes) -> list[bytes] | None:
    """The reply's items as the client should read them, or None when malformed."""
    if len(reply) < 4:
        return None
    (n,) = struct.unpack_from("<I", reply)
    body = reply[4:]
    if n != len(body):  # truncated (the server closes), or more than said (ignored)
        if n > len(body):
            return None
        body = body[:n]
    out, pos = [], 0
    while pos < len(body):
        if pos + 4 > len(body):
            return None
        (k,) = struct.unpack_from("<I", body, pos)
        pos += 4
        if pos + k > len(body):
            return None
        out.append(body[pos:pos + k])
        pos += k
    return out


def test_the_stub_is_what_a_fallback_runs(setup: tuple[str, FakeServer]) -> None:
    """Control: with no server at all the client falls back, and the stub's status is what
    a fallback looks like (so the property above can tell the two apart)."""
    command, _ = setup
    p = subprocess.run([command, "run", "--", "/bin/true"], capture_output=True,
                       timeout=TIMEOUT, env=caller_env({"HCP_LINUX_SERVER": "/nonexistent.sock"}),
                       stdin=subprocess.DEVNULL, cwd="/")
    assert p.returncode == FALLBACK
    assert os.path.exists(command)
