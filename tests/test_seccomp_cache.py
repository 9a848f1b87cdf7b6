"""compile_profiles caching: memory per tuple of names, disk across processes (a disk hit must
not import pyseccomp), untrusted or unwritable cache handled, receipts' profile_digest."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hcp_linux import seccomp_profiles as sp

REPO = Path(__file__).resolve().parent.parent

FRESH_PROCESS = """
import json, sys
from hcp_linux import seccomp_profiles as sp
program = sp.compile_profiles(sys.argv[1:])
print(json.dumps({
    "hex": program.hex(),
    "pyseccomp": "pyseccomp" in sys.modules,
    "tomllib": "tomllib" in sys.modules,
    "disk_hits": sp.stats.disk_hits,
    "compiles": sp.stats.compiles,
}))
"""


@pytest.fixture
def cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "xdg"
    monkeypatch.setenv("HCP_LINUX_SECCOMP_CACHE", str(home / "hcp-linux" / "seccomp"))
    sp.clear_memory_cache()
    yield home
    sp.clear_memory_cache()


def fresh(cache_home: Path, *names: str) -> dict:
    env = dict(os.environ, HCP_LINUX_SECCOMP_CACHE=str(cache_home / "hcp-linux" / "seccomp"),
               PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-c", FRESH_PROCESS, *names], env=env, capture_output=True,
                         text=True, timeout=60, check=True)
    return json.loads(out.stdout)


def cached_files(cache_home: Path) -> list[Path]:
    d = cache_home / "hcp-linux" / "seccomp"
    return sorted(d.glob("*.bpf")) if d.is_dir() else []


def test_cache_dir_is_the_environment_s_unless_named(cache_home: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """HCP_LINUX_SECCOMP_CACHE names the directory; unset or empty, it is the virtual
    environment's share/hcp-linux/seccomp (memory only outside one), never under
    XDG_CACHE_HOME or HOME, where a run whose jail is the home could rewrite every later
    run's filter (tests/test_runtime_files.py)."""
    assert sp.cache_dir() == str(cache_home / "hcp-linux" / "seccomp")
    for value in ("off", "relative/ignored", "/etc/hcp-linux"):
        monkeypatch.setenv("HCP_LINUX_SECCOMP_CACHE", value)
        assert sp.cache_dir() is None, value
    monkeypatch.setenv("HCP_LINUX_SECCOMP_CACHE", "")  # empty: unset
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache_home))
    monkeypatch.setenv("HOME", str(cache_home))
    if sys.prefix != sys.base_prefix:
        assert sp.cache_dir() == os.path.join(sys.prefix, "share", "hcp-linux", "seccomp")
    else:
        assert sp.cache_dir() is None


def test_second_compile_hits_memory(cache_home: Path) -> None:
    before = (sp.stats.compiles, sp.stats.memory_hits)
    first = sp.compile_profiles(["baseline"])
    second = sp.compile_profiles(["baseline"])
    assert second is first
    assert (sp.stats.compiles, sp.stats.memory_hits) == (before[0] + 1, before[1] + 1)
    assert sp.compile_profiles(("baseline",)) is first  # keyed by the tuple of names


def test_disk_hit_in_fresh_process_skips_pyseccomp(cache_home: Path) -> None:
    program = sp.compile_profiles(["baseline", "network-off"])
    files = cached_files(cache_home)
    assert len(files) == 1
    assert files[0].stat().st_mode & 0o077 == 0  # private
    got = fresh(cache_home, "baseline", "network-off")
    assert bytes.fromhex(got["hex"]) == program
    assert got["disk_hits"] == 1 and got["compiles"] == 0
    assert not got["pyseccomp"] and not got["tomllib"]


def test_cold_fresh_process_compiles_and_fills_cache(cache_home: Path) -> None:
    got = fresh(cache_home, "network-off")
    assert got["compiles"] == 1 and got["pyseccomp"]
    assert len(cached_files(cache_home)) == 1
    assert bytes.fromhex(got["hex"]) == sp.compile_profiles(["network-off"])


def test_unwritable_cache_dir_is_fine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the cache directory should be")  # even root cannot mkdir here
    monkeypatch.setenv("HCP_LINUX_SECCOMP_CACHE", str(blocker / "seccomp"))
    sp.clear_memory_cache()
    writes = sp.stats.disk_writes
    program = sp.compile_profiles(["baseline"])
    assert len(program) % 8 == 0 and program
    assert sp.stats.disk_writes == writes
    assert sp.compile_profiles(["baseline"]) is program  # memory still works
    got = fresh(blocker, "baseline")
    assert bytes.fromhex(got["hex"]) == program and got["compiles"] == 1
    sp.clear_memory_cache()


def test_corrupt_or_untrusted_cache_file_is_ignored(cache_home: Path) -> None:
    program = sp.compile_profiles(["baseline"])
    (path,) = cached_files(cache_home)
    path.write_bytes(path.read_bytes()[:-8] + bytes(8))  # flip the last instruction
    got = fresh(cache_home, "baseline")
    assert bytes.fromhex(got["hex"]) == program and got["compiles"] == 1  # recompiled, rewritten
    assert fresh(cache_home, "baseline")["disk_hits"] == 1

    # a file others can write could have been swapped for a weaker program: not trusted
    path.chmod(0o666)
    got = fresh(cache_home, "baseline")
    assert got["compiles"] == 1 and bytes.fromhex(got["hex"]) == program


def test_changed_profile_changes_key(cache_home: Path, tmp_path: Path) -> None:
    text = Path(sp.load_profile("network-off").path).read_text()
    path = tmp_path / "mine.toml"
    path.write_text(text)
    first = sp.compile_profiles([str(path)])
    path.write_text(text.replace('syscall = "io_uring_setup"', 'syscall = ["io_uring_setup", "io_uring_enter"]'))
    sp.clear_memory_cache()
    second = sp.compile_profiles([str(path)])
    assert first != second
    assert len(cached_files(cache_home)) == 2


def test_profile_digest() -> None:
    d = sp.profile_digest(["baseline"])
    assert d.startswith("sha256:") and len(d) == 7 + 64
    assert sp.profile_digest(["baseline"]) == d
    assert sp.profile_digest(["baseline", "network-off"]) not in (d, sp.profile_digest(["network-off"]))
    assert sp.profile_digest([sp.load_profile("baseline").path]) == d  # by content, not by name
    with pytest.raises(sp.ProfileNotFoundError):
        sp.profile_digest(["nope"])


def test_the_builtin_sha256_is_sha256() -> None:
    """The cache keys and the policy digest use the interpreter's own SHA-256 (issue 35:
    hashlib's OpenSSL costs every run ~3 ms of start-up): the same digests as hashlib's."""
    import hashlib

    from hcp_linux._sha256 import sha256
    for data in (b"", b"hcp-linux", bytes(range(256)) * 300):
        assert sha256(data).hexdigest() == hashlib.sha256(data).hexdigest()
