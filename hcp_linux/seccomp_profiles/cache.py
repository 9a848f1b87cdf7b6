"""compile_profiles with two caches: in memory per tuple of names, and on disk across processes.

The disk key hashes everything the bytes depend on: the profile files' contents, the libseccomp
version, the machine, and this package's own compiler code (stricter than its version string: an
edited checkout with an unchanged version still gets a fresh key). A hit reads one small file and
imports neither pyseccomp nor tomllib, which keeps CLI start-up fast.

The cached program is what every later run's filter is, so it is kept with the interpreter
environment that runs this code (a virtual environment's ``share/hcp-linux/seccomp``), never
under ``$XDG_CACHE_HOME``: a run whose writable root held the user's cache directory (a jail
at ``$HOME``) could replace a program with one that allows everything, and every later run of
that user, in any jail, would have loaded it. A checksum cannot tell a forged program from a
compiled one, and there is no secret a sandboxed command of the same user could not read; in
the environment, whoever can rewrite the cache can already make every start of its Python run
their code, and every run keeps the directory read-only (hcp_linux.policy.protected: the
runtime's own files). Outside a virtual environment (a system or user install) programs are
kept in memory only. ``HCP_LINUX_SECCOMP_CACHE`` names another directory (tests,
benchmarks), or ``off``.

A cache file or directory is only trusted when owned by root or this effective uid and not
writable by group or others; anything else is ignored (and a corrupt or truncated file is
detected by its checksum). Writes are atomic (temp file + rename). Any failure to create, read
or write the cache degrades to memory-only, silently.
"""
from __future__ import annotations

import os
import stat
import sys
from typing import Iterable, Optional, Sequence

from .._sha256 import sha256
from .errors import SeccompCompileError, SeccompProfileError
from .machines import Machine, native_machine
from .registry import ProfileRef, build_profile, read_source

FORMAT = 1
_MAGIC = b"hcp-linux seccomp bpf v1\n"
_CODE_FILES = ("bpf.py", "compiler.py", "conditions.py", "machines.py", "model.py", "registry.py", "syscalls.py")

_memory: dict[tuple[str, ...], bytes] = {}
# The digest of the very texts each in-memory program was compiled from: a receipt must name
# the text that rules, even when a profile file was edited after the program was cached.
_memory_digests: dict[tuple[str, ...], str] = {}
_code_digest: Optional[str] = None


class CacheStats:
    """Counters, for tests and `probe`: where this process's programs came from."""

    __slots__ = ("memory_hits", "disk_hits", "compiles", "disk_writes")

    def __init__(self) -> None:
        self.memory_hits = self.disk_hits = self.compiles = self.disk_writes = 0


stats = CacheStats()


def compile_profiles(names: Sequence[ProfileRef], notify: bool = False) -> bytes:
    """Raw BPF (struct sock_filter array) enforcing all `names` together on this machine;
    ``notify``: the policy denials go to a listener (SECCOMP_RET_USER_NOTIF) that answers them.

    Every error (unknown profile, malformed file, unknown syscall, libseccomp refusal) is raised
    here, in the caller's process, before anything could be installed.
    """
    names_key = tuple(os.fspath(n) for n in names)
    if not names_key:
        raise SeccompProfileError("compile_profiles needs at least one profile")
    key = names_key + ("\0notify",) if notify else names_key
    cached = _memory.get(key)
    if cached is not None:
        stats.memory_hits += 1
        return cached
    machine = native_machine()
    if machine is None:
        raise SeccompCompileError(f"unsupported machine {os.uname().machine!r} for seccomp filters")
    sources = [read_source(ref) for ref in dict.fromkeys(names_key)]
    disk_key = _disk_key(machine, [data for _, _, data in sources], notify)
    program = _disk_load(disk_key)
    if program is not None:
        stats.disk_hits += 1
    else:
        from .compiler import compile_bpf

        profiles = [build_profile(data, path, expected) for path, expected, data in sources]
        program = compile_bpf(profiles, machine, notify)
        stats.compiles += 1
        _disk_store(disk_key, program)
    _memory[key] = program
    _memory_digests[names_key] = _digest(data for _, _, data in sources)
    return program


def profile_digest(names: Sequence[ProfileRef]) -> str:
    """'sha256:…' of the profiles' file contents, in order: says in a receipt which text ruled.
    For names whose program this process holds, the texts it was compiled from."""
    key = tuple(os.fspath(n) for n in names)
    known = _memory_digests.get(key)
    if known is not None:
        return known
    return _digest(read_source(ref)[2] for ref in dict.fromkeys(key))


def _digest(contents: Iterable[bytes]) -> str:
    h = sha256(b"hcp-linux seccomp profiles\n")
    for data in contents:
        h.update(len(data).to_bytes(8, "big") + data)
    return "sha256:" + h.hexdigest()


def clear_memory_cache() -> None:
    """Forget compiled programs held in this process (the disk cache stays)."""
    _memory.clear()
    _memory_digests.clear()


def cache_dir() -> Optional[str]:
    """Where compiled programs are kept: ``HCP_LINUX_SECCOMP_CACHE`` when it is an absolute
    path (``off``, or anything else: None, memory only), else (unset or empty) the virtual
    environment's ``share/hcp-linux/seccomp``, or None outside one. None under a system
    directory (nothing is made there)."""
    given = os.environ.get("HCP_LINUX_SECCOMP_CACHE", "")
    if not given:
        return DEFAULT_DIR
    if not os.path.isabs(given) or _system_dir(os.path.realpath(given)):
        return None
    return os.path.normpath(given)


#: The default disk cache: in the virtual environment that runs this code (its files are
#: as trusted as the code: see the module's docstring), beside neither the user's caches
#: nor the package (pip uninstall removes exactly what it installed).
DEFAULT_DIR = (os.path.join(sys.prefix, "share", "hcp-linux", "seccomp")
               if sys.prefix != sys.base_prefix else None)

#: Directories of the system itself: a cache named there by HCP_LINUX_SECCOMP_CACHE is
#: never made (the cache is best effort; without a directory it lives in memory).
_SYSTEM_DIRS = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/opt",
                "/proc", "/sbin", "/sys", "/usr")


def _system_dir(path: str) -> bool:
    return path == "/" or any(path == d or path.startswith(d + "/") for d in _SYSTEM_DIRS)


def _disk_key(machine: Machine, contents: Sequence[bytes], notify: bool = False) -> str:
    from .syscalls import libseccomp_version

    h = sha256(f"format={FORMAT}\nmachine={machine.name}\n".encode())
    if notify:
        h.update(b"notify\n")
    h.update(f"libseccomp={libseccomp_version()}\ncode={_code()}\n".encode())
    for data in contents:
        h.update(len(data).to_bytes(8, "big") + data)
    return h.hexdigest()


def _code() -> str:
    global _code_digest
    if _code_digest is None:
        h = sha256()
        here = os.path.dirname(os.path.abspath(__file__))
        for name in _CODE_FILES:
            try:
                with open(os.path.join(here, name), "rb") as f:
                    h.update(name.encode() + b"\0" + f.read())
            except OSError:
                h.update(name.encode() + b"\0missing")
        _code_digest = h.hexdigest()
    return _code_digest


def _trusted(st: os.stat_result) -> bool:
    """Owned by root or us and writable by nobody else: root's programs (in an environment
    root owns) are as trusted as the environment."""
    return st.st_uid in (0, os.geteuid()) and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _disk_load(key: str) -> Optional[bytes]:
    directory = cache_dir()
    if directory is None:
        return None
    try:
        if not _trusted(os.lstat(directory)):
            return None
        fd = os.open(os.path.join(directory, key + ".bpf"), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or not _trusted(st) or st.st_size > 1 << 20:
            return None
        blob = os.read(fd, st.st_size + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    head = len(_MAGIC) + 32
    if not blob.startswith(_MAGIC) or len(blob) <= head:
        return None
    program = blob[head:]
    if sha256(program).digest() != blob[len(_MAGIC):head] or len(program) % 8:
        return None
    return program


def _disk_store(key: str, program: bytes) -> None:
    directory = cache_dir()
    if directory is None:
        return
    tmp = None
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        if not _trusted(os.lstat(directory)):
            return
        import tempfile  # only on a miss

        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".bpf", dir=directory)
        with os.fdopen(fd, "wb") as f:
            f.write(_MAGIC + sha256(program).digest() + program)
        os.replace(tmp, os.path.join(directory, key + ".bpf"))
        tmp = None
        stats.disk_writes += 1
    except OSError:
        pass  # unwritable cache: memory only
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
