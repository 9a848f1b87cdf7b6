"""The submodule paths (gitlinks) a git index records, read without git.

The after-run search (hcp_linux.policy.protected.sweep_made) needs them: the host's
``git status`` runs ``git status`` in every populated submodule the index names, at any
depth, with that submodule's config (its ``core.fsmonitor``), and a sandboxed command can
write the index (``git add`` must work) and make the submodule's repository where the
nested search does not reach. The index is the command's bytes, so this reader is small,
bounded and fuzzed (tests/test_git_index.py): it returns None for anything it does not
understand, never raises on input, reads at most :data:`MAX_INDEX` bytes, builds at most
:data:`MAX_PATH_BYTES` of paths, and keeps at most :data:`MAX_GITLINK_BYTES` of them.

Format (git's Documentation/gitformat-index.txt): ``DIRC``, version 2, 3 or 4, the entry
count; then each entry: ctime, mtime, dev, ino, mode, uid, gid, size (4 bytes each), the
object name (20 bytes, or 32 in a SHA-256 repository), 16 bits of flags (12 of them the
name's length, 0xFFF when longer), in version 3 and later 16 more bits when the extended
flag is set, then the path: NUL-padded to a multiple of 8 bytes in versions 2 and 3,
prefix-compressed (a varint of bytes to drop from the previous path, then the rest,
NUL-terminated) in version 4.
"""
from __future__ import annotations

from _struct import unpack_from

#: The largest index read (a kernel tree's is ~8 MiB): a larger one is not checked, and the
#: receipt says so.
MAX_INDEX = 64 << 20
#: A gitlink's mode: S_IFGITLINK, 0160000 (big-endian in the index).
GITLINK = 0o160000
_GITLINK_BYTES = b"\x00\x00\xe0\x00"
_EXTENDED = 0x4000
_NAME_MASK = 0x0FFF
#: The most bytes of paths read in all. In version 4 each path is the previous one's
#: prefix and a suffix: paths one byte longer each make n entries n²/2 bytes (a 7 MB index
#: took 3 GB). Real indexes hold a few MB of paths (a kernel tree's ~3).
MAX_PATH_BYTES = 256 << 20
#: At most this many bytes of gitlink paths are kept (the caller checks 1024 submodules).
MAX_GITLINK_BYTES = 4 << 20


def gitlinks(data: bytes, hash_size: int = 20) -> list[bytes] | None:
    """The path of each gitlink in the index ``data``, or None when it is not an index
    this reader understands (a truncated or forged one included). ``hash_size``: 20, or 32
    in a SHA-256 repository (:func:`hash_size`: the repository says, not the index, which
    the command wrote)."""
    if len(data) < 12 or data[:4] != b"DIRC" or hash_size not in (20, 32):
        return None
    if _GITLINK_BYTES not in data:
        return []  # no entry can have the mode: most repositories have no submodule
    return _entries(data, hash_size)


def hash_size(config: bytes) -> int:
    """The object name's size of a repository whose config is ``config``: 32 when it sets
    ``extensions.objectFormat = sha256``, else 20. Read from a config the command could not
    write (a protected one); a loose reading errs towards the layout git would use."""
    for line in config.lower().splitlines():
        key, _, value = line.partition(b"=")
        if key.strip() == b"objectformat" and value.split(b"#")[0].split(b";")[0].strip() \
                .strip(b'"') == b"sha256":
            return 32
    return 20


def _entries(data: bytes, hash_size: int) -> list[bytes] | None:
    version, count = unpack_from(">II", data, 4)
    if version not in (2, 3, 4):
        return None
    pos, end = 12, len(data)
    fixed = 40 + hash_size + 2  # stat fields, object name, flags
    out: list[bytes] = []
    previous = b""
    kept = read = 0
    for _ in range(count):
        if pos + fixed > end:
            return None
        start = pos
        (mode,) = unpack_from(">I", data, pos + 24)
        (flags,) = unpack_from(">H", data, pos + 40 + hash_size)
        pos += fixed
        if flags & _EXTENDED:
            if version < 3 or pos + 2 > end:
                return None
            pos += 2
        if version == 4:
            drop, pos = _varint(data, pos)
            if drop is None or drop > len(previous):
                return None
            nul = data.find(b"\x00", pos)
            if nul < 0:
                return None
            path = previous[:len(previous) - drop] + data[pos:nul]
            pos = nul + 1
        else:
            length = flags & _NAME_MASK
            if length == _NAME_MASK:
                nul = data.find(b"\x00", pos)
                if nul < 0:
                    return None
                length = nul - pos
            if pos + length >= end or data[pos + length] != 0:
                return None
            path = data[pos:pos + length]
            pos = start + ((pos - start + length + 8) & ~7)  # 1 to 8 NULs pad the entry
            if pos > end:
                return None
        read += len(path)
        if not path or read > MAX_PATH_BYTES:
            return None
        if mode == GITLINK:
            kept += len(path)
            if kept > MAX_GITLINK_BYTES:
                return None
            out.append(path)
        previous = path
    # what follows the entries: extensions and the trailing checksum, at least the latter
    if end - pos < hash_size:
        return None
    return out


def _varint(data: bytes, pos: int) -> tuple[int | None, int]:
    """git's offset varint (varint.c): 7 bits a byte, high bit set on all but the last,
    each continuation adding one before the shift (so each value has one encoding)."""
    if pos >= len(data):
        return None, pos
    c = data[pos]
    pos += 1
    value = c & 0x7F
    while c & 0x80:
        if pos >= len(data) or value > (1 << 40):
            return None, pos
        c = data[pos]
        pos += 1
        value = ((value + 1) << 7) | (c & 0x7F)
    return value, pos
