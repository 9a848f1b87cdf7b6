"""Property-based fuzzing of the audit record reader (hcp_linux/observe/audit.py), which parses
bytes a sandboxed command shapes: the paths and names in Landlock's records are its own.

Invariants: any datagram splits into netlink messages without an exception, each within the
datagram; any payload gives a record or None, never an exception; a record the kernel would
write (each untrusted value quoted when it has no space, quote, control character or byte
above 0x7e, else upper-case hex: kernel/audit.c audit_log_n_untrustedstring) reads back as
the values written. Profiles: tests/fuzzing.py (``HYPOTHESIS_PROFILE=long``: 10,000 each).
"""
from __future__ import annotations

import struct

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import example, given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from fuzzing import fuzz  # noqa: E402

from hcp_linux.observe import audit  # noqa: E402


def _kernel_value(raw: bytes) -> bytes:
    """How the kernel logs an untrusted string."""
    if any(b == 0x22 or b < 0x21 or b > 0x7E for b in raw):
        return raw.hex().upper().encode()
    return b'"' + raw + b'"'


@fuzz()
@given(st.binary(max_size=512))
@example(b"\x10\x00\x00\x00\xe8\x03" + b"\0" * 10)
@example(struct.pack("=IHHII", 0xFFFFFFFF, 1423, 0, 0, 0))
def test_any_datagram_splits_safely(data: bytes) -> None:
    total = 0
    for kind, payload in audit.messages(data):
        assert 0 <= kind < 1 << 16
        total += 16 + len(payload)
        assert total <= len(data)
        audit.record(payload)  # never raises


@fuzz()
@given(st.binary(max_size=1024))
@example(b"audit(): =")
@example(b"audit(1.1:1): path= comm=\"\" ocomm=\"x path=ZZ exe=0G")
def test_any_payload_gives_a_record_or_none(payload: bytes) -> None:
    got = audit.record(payload)
    if got is not None:
        serial, fields = got
        assert isinstance(serial, str)
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in fields.items())
    audit.record(b"audit(1.2:3): " + payload)


_NAMES = st.sampled_from(sorted(audit.UNTRUSTED))


@fuzz()
@given(st.lists(st.tuples(_NAMES, st.binary(min_size=1, max_size=64)), min_size=1,
                max_size=6, unique_by=lambda kv: kv[0]),
       st.integers(min_value=0, max_value=2**40))
def test_what_the_kernel_writes_reads_back(pairs: list[tuple[str, bytes]], serial: int) -> None:
    body = b" ".join(k.encode() + b"=" + _kernel_value(v) for k, v in pairs)
    got = audit.record(b"audit(1729738800.268:%d): domain=1a blockers=fs.read_file " % serial
                       + body + b"\0")
    assert got is not None
    assert got[0] == f"1729738800.268:{serial}"
    fields = got[1]
    assert fields["domain"] == "1a" and fields["blockers"] == "fs.read_file"
    for k, v in pairs:
        assert fields[k] == v.decode("utf-8", "backslashreplace"), (k, v, body)
