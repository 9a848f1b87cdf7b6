"""hcp_linux.policy.protected.git_index: the gitlinks of real indexes git writes (versions 2, 3 and
4, extended flags, names longer than the 12-bit length, SHA-256 repositories) are what
`git ls-files --stage` lists; any bytes (random, or a real index cut or flipped) give None
or a list, never an exception."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from hcp_linux.policy.protected.git_index import gitlinks, hash_size

ENV = {**os.environ, "GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@example.com",
       "GIT_COMMITTER_NAME": "a", "GIT_COMMITTER_EMAIL": "a@example.com"}


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          env=ENV, text=True).stdout


def _make(tmp: Path, object_format: str = "sha1") -> Path:
    """A repository with files, a name longer than 4095 bytes, an intent-to-add entry (the
    extended flag) and three submodules (gitlinks), one deep."""
    repo = tmp / f"repo-{object_format}"
    subprocess.run(["git", "init", "-q", f"--object-format={object_format}", str(repo)],
                   check=True, env=ENV)
    (repo / "a.txt").write_text("a\n")
    deep = repo / "d1" / "d2"
    deep.mkdir(parents=True)
    (deep / "b.txt").write_text("b\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "one")
    head = _git(repo, "rev-parse", "HEAD").strip()
    # a path of more than 4095 bytes (longer than a file system takes: index only)
    blob = subprocess.run(["git", "-C", str(repo), "hash-object", "-w", "--stdin"],
                          input="l\n", check=True, capture_output=True, env=ENV,
                          text=True).stdout.strip()
    long_path = "x" * 250 + ("/" + "y" * 240) * 17 + "/long.txt"
    _git(repo, "update-index", "--add", "--cacheinfo", f"100644,{blob},{long_path}")
    for sub in ("s1", "d1/s2", "d1/d2/d3/s3"):
        _git(repo, "update-index", "--add", "--cacheinfo", f"160000,{head},{sub}")
    (repo / "new.txt").write_text("n\n")
    _git(repo, "add", "-N", "new.txt")  # intent to add: the extended flag (version 3)
    return repo


def _expected(repo: Path) -> list[bytes]:
    out = subprocess.run(["git", "-C", str(repo), "ls-files", "--stage", "-z"], check=True,
                         capture_output=True, env=ENV).stdout
    return [e.split(b"\t", 1)[1] for e in out.split(b"\0") if e.startswith(b"160000 ")]


@pytest.mark.parametrize("version", [2, 3, 4])
@pytest.mark.parametrize("object_format", ["sha1", "sha256"])
def test_real_indexes(tmp_path: Path, version: int, object_format: str) -> None:
    repo = _make(tmp_path, object_format)
    _git(repo, "update-index", "--index-version", str(version))
    data = (repo / ".git" / "index").read_bytes()
    size = hash_size((repo / ".git" / "config").read_bytes())
    assert size == (32 if object_format == "sha256" else 20)
    expected = _expected(repo)
    assert sorted(expected) == [b"d1/d2/d3/s3", b"d1/s2", b"s1"]
    assert gitlinks(data, size) == expected
    # the wrong layout never reads as a different list of submodules
    assert gitlinks(data, 52 - size) in (None, expected)


def test_an_index_without_submodules_is_read_at_memchr_speed(tmp_path: Path) -> None:
    repo = tmp_path / "plain"
    subprocess.run(["git", "init", "-q", str(repo)], check=True, env=ENV)
    (repo / "f").write_text("f\n")
    _git(repo, "add", "f")
    assert gitlinks((repo / ".git" / "index").read_bytes()) == []


def test_hash_size_reads_the_extension() -> None:
    assert hash_size(b"[core]\n\tbare = false\n") == 20
    assert hash_size(b"[extensions]\n\tobjectFormat = sha256\n") == 32
    assert hash_size(b'[extensions]\n\tobjectformat="sha256" ; x\n') == 32
    assert hash_size(b"[extensions]\n\tobjectformat = sha1\n") == 20


@pytest.fixture(scope="module")
def real_index(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    repo = _make(tmp_path_factory.mktemp("fuzz"))
    _git(repo, "update-index", "--index-version", "4")
    return (repo / ".git" / "index").read_bytes()


FUZZ = settings(max_examples=600, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


@FUZZ
@given(st.binary(max_size=512), st.sampled_from([20, 32]))
def test_random_bytes_never_raise(data: bytes, size: int) -> None:
    for blob in (data, b"DIRC" + data, b"DIRC\x00\x00\x00\x02" + data,
                 b"DIRC\x00\x00\x00\x04" + data):
        result = gitlinks(blob, size)
        assert result is None or all(isinstance(p, bytes) and p for p in result)


@FUZZ
@given(st.data())
def test_a_real_index_cut_or_flipped_never_raises(real_index: bytes, data: st.DataObject) -> None:
    blob = bytearray(real_index)
    for _ in range(data.draw(st.integers(0, 4))):
        at = data.draw(st.integers(0, len(blob) - 1))
        blob[at] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(blob)))
    result = gitlinks(bytes(blob[:cut]), 20)
    assert result is None or all(isinstance(p, bytes) and p for p in result)


def _growing_v4(n: int, gitlink: str, hs: int = 20) -> bytes:
    """A version 4 index of ``n`` entries, each path the previous one and one more byte:
    every entry a gitlink (``all``), or only the last (``last``)."""
    import struct
    out = bytearray(b"DIRC" + struct.pack(">II", 4, n))
    for i in range(n):
        mode = 0o160000 if gitlink == "all" or i == n - 1 else 0o100644
        out += b"\0" * 24 + struct.pack(">I", mode) + b"\0" * 12 + b"\0" * hs
        out += struct.pack(">H", 1) + b"\x00a\x00"  # flags; drop nothing, add "a"
    return bytes(out + b"\0" * hs)


def test_a_version_4_index_whose_paths_grow_is_read_in_bounded_memory() -> None:
    """Version 4 makes each path from the previous one: n entries one byte longer each are
    n²/2 bytes of paths (a 7 MB index took 3 GB of the runtime's memory). Past
    MAX_GITLINK_BYTES of gitlinks, or MAX_PATH_BYTES of paths read, the index is not read
    (None: the receipt says its submodules were not checked). Controls: fewer of them are
    read, each path as built."""
    from hcp_linux.policy.protected import git_index
    few = gitlinks(_growing_v4(2000, "all"))
    assert few is not None and len(few) == 2000 and few[-1] == b"a" * 2000
    assert gitlinks(_growing_v4(4000, "all")) is None  # 8 MB of gitlinks
    last = gitlinks(_growing_v4(3000, "last"))
    assert last == [b"a" * 3000]
    n = int((2 * git_index.MAX_PATH_BYTES) ** 0.5) + 10  # past the paths' budget
    assert gitlinks(_growing_v4(n, "last")) is None
