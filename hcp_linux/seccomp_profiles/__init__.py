"""seccomp profiles as data, their compiler and a raw loader. Knows nothing of HCP.

    from hcp_linux import seccomp_profiles as sp
    bpf = sp.compile_profiles(["baseline"])      # parent: validate + compile (cached)
    prepared = sp.PreparedFilter(bpf)            # parent: C buffers, before fork
    ...                                          # child: prctl(PR_SET_NO_NEW_PRIVS, 1)
    prepared.install()                           # child: one seccomp(2) call

Profiles are TOML files in profiles/ (one `why` per rule). Compilation uses libseccomp through
pyseccomp, in the parent only; installation is a single syscall through ctypes. Every profile
error is raised before anything is installed.
"""
from __future__ import annotations

from .cache import cache_dir, clear_memory_cache, compile_profiles, profile_digest, stats
from .errors import (
    ProfileFormatError,
    ProfileNotFoundError,
    SeccompCompileError,
    SeccompLibraryError,
    SeccompProfileError,
    UnknownSyscallError,
)
from .loader import (
    SECCOMP_FILTER_FLAG_LOG,
    SECCOMP_FILTER_FLAG_SPEC_ALLOW,
    SECCOMP_FILTER_FLAG_TSYNC,
    PreparedFilter,
    install_filter,
)
from .machines import Machine, native_machine
from .model import ArgCondition, Profile, Rule
from .registry import available_profiles, load_profile

__all__ = [
    "ArgCondition",
    "Machine",
    "PreparedFilter",
    "Profile",
    "ProfileFormatError",
    "ProfileNotFoundError",
    "Rule",
    "SECCOMP_FILTER_FLAG_LOG",
    "SECCOMP_FILTER_FLAG_SPEC_ALLOW",
    "SECCOMP_FILTER_FLAG_TSYNC",
    "SeccompCompileError",
    "SeccompLibraryError",
    "SeccompProfileError",
    "UnknownSyscallError",
    "available_profiles",
    "cache_dir",
    "clear_memory_cache",
    "compile_profiles",
    "install_filter",
    "load_profile",
    "native_machine",
    "profile_digest",
    "stats",
]
