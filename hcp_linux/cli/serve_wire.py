"""The wire of `hcp-linux serve`: frames of length-prefixed items, client and server alike.

A frame is a u32 length, then items (u32 length + bytes each), little-endian. Only the
C-level struct module is used: the client imports this on the start-up path of a run.
"""
from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing on the start-up path
if TYPE_CHECKING:
    from typing import Sequence

    from ..policy.protected import SweepEntry

#: The protocol's name and version; a server that does not say it is not talked to.
#: 2: a plan's reply carries the run's sweep (encode_sweep), so that a client that writes no
#: receipt never parses it (json, with re and enum: ~7 ms of a served run's start-up).
#: 3: and the after-run search for what the run made below the top level (encode_after).
#: 4: and a token naming the run, for its end asked of the server (the native client:
#: hcp_linux/native/hcp_client.c, which has no Python of its own to sweep in).
#: 5: the sweep names each bound file's inode (``@DEV:INO``): what replaced it is moved aside.
#: 6: before the plan, once the command is allowed, a "spare" frame: the hcp-exec to start
#: with the plan's namespace flags, uid and gid while the confinement is compiled (a
#: client may ignore it); the plan says whether that spare may take it.
PROTOCOL = b"hcp-linux/serve 6"
MAX_FRAME = 16 << 20


def encode(items: "Sequence[bytes]") -> bytes:
    from _struct import pack
    body = b"".join(pack("<I", len(i)) + i for i in items)
    return pack("<I", len(body)) + body


def decode(body: bytes) -> list[bytes]:
    from _struct import unpack_from
    out, pos = [], 0
    while pos < len(body):
        if pos + 4 > len(body):
            raise ValueError("truncated item header")
        (n,) = unpack_from("<I", body, pos)
        pos += 4
        if pos + n > len(body):
            raise ValueError("truncated item")
        out.append(body[pos:pos + n])
        pos += n
    return out


def encode_sweep(entries: "Sequence[SweepEntry]") -> bytes:
    """The protected names' sweep (hcp_linux.policy.protected.SweepEntry) as one item: per
    entry its path, ``-`` (remove what appears), ``=`` and the link's target (restore it) or
    ``@DEV:INO`` (the bound inode: move aside another), and ``1`` when only a non-directory
    is removed."""
    import os
    items = []
    for path, target, file_only in entries:
        if target is None:
            how = b"-"
        elif isinstance(target, tuple):
            how = b"@%d:%d" % target
        else:
            how = b"=" + os.fsencode(target)
        items += [os.fsencode(path), how, b"1" if file_only else b"0"]
    return encode(items)[4:]


def decode_sweep(item: bytes) -> "tuple[SweepEntry, ...]":
    """encode_sweep's entries back (ValueError on anything else: nothing is run then)."""
    import os
    items = decode(item)
    if len(items) % 3:
        raise ValueError("a sweep of incomplete entries")
    out: "list[SweepEntry]" = []
    for i in range(0, len(items), 3):
        path, how, flag = items[i:i + 3]
        if how[:1] not in (b"-", b"=", b"@") or (how == b"-") != (how[:1] == b"-") \
                or flag not in (b"0", b"1") or not path.startswith(b"/"):
            raise ValueError("a malformed sweep entry")
        target: "str | tuple[int, int] | None" = None
        if how[:1] == b"=":
            target = os.fsdecode(how[1:])
        elif how[:1] == b"@":
            target = _inode(how[1:])
        out.append((os.fsdecode(path), target, flag == b"1"))
    return tuple(out)


def _inode(text: bytes) -> tuple[int, int]:
    """``DEV:INO`` (decimal) as (st_dev, st_ino); ValueError on anything else."""
    dev, sep, ino = text.partition(b":")
    if not sep or not dev.isdigit() or not ino.isdigit() or len(dev) > 20 or len(ino) > 20:
        raise ValueError("a malformed inode in a sweep entry")
    return int(dev), int(ino)


def encode_after(after, since: int) -> bytes:  # type: ignore[no-untyped-def]
    """The after-run search (hcp_linux.policy.protected.After, or None) and the run's start
    as one item: the start, then the roots (each: root, depth, skipped paths), the known
    paths and the opted-out names, each a nested list of items."""
    import os
    if after is None:
        return encode([b"%d" % since])[4:]
    roots = [encode([os.fsencode(r), b"%d" % d, encode([os.fsencode(p) for p in skip])[4:]])[4:]
             for r, d, skip in after.roots]
    return encode([b"%d" % since, encode(roots)[4:],
                   encode([os.fsencode(p) for p in after.known])[4:],
                   encode([os.fsencode(p) for p in after.allowed])[4:]])[4:]


def decode_after(item: bytes):  # type: ignore[no-untyped-def]
    """encode_after's (After or None, start) back (ValueError on anything else)."""
    import os

    from ..policy.protected import After
    items = decode(item)
    if not items or not items[0].lstrip(b"-").isdigit():
        raise ValueError("a malformed after-run search")
    since = int(items[0])
    if len(items) == 1:
        return None, since
    if len(items) != 4:
        raise ValueError("a malformed after-run search")
    roots = []
    for entry in decode(items[1]):
        parts = decode(entry)
        if len(parts) != 3 or not parts[1].isdigit() or not parts[0].startswith(b"/"):
            raise ValueError("a malformed after-run root")
        roots.append((os.fsdecode(parts[0]), int(parts[1]),
                      tuple(os.fsdecode(p) for p in decode(parts[2]))))
    known = tuple(os.fsdecode(p) for p in decode(items[2]))
    allowed = tuple(os.fsdecode(p) for p in decode(items[3]))
    return After(tuple(roots), known, allowed), since


def recv_frame(sock) -> list[bytes]:  # type: ignore[no-untyped-def]
    from _struct import unpack
    head = _recv_exact(sock, 4)
    (n,) = unpack("<I", head)
    if n > MAX_FRAME:
        raise ValueError(f"frame of {n} bytes")
    return decode(_recv_exact(sock, n))


def _recv_exact(sock, n: int) -> bytes:  # type: ignore[no-untyped-def]
    parts, got = [], 0
    while got < n:
        chunk = sock.recv(min(n - got, 1 << 20))
        if not chunk:
            raise ConnectionError("the peer closed the connection")
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)
