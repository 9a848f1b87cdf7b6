"""The machines a filter can be compiled for and installed on.

One table answers every per-architecture question the package has: the libseccomp/audit arch
token the program checks first, and the number of seccomp(2) itself (the loader calls it through
libc's syscall(), without libseccomp). The key is what os.uname().machine says, which is also the
key profiles use for per-machine overrides (e.g. clone's flags are its second argument on s390x).
"""
from __future__ import annotations

import os
import sys
from typing import NamedTuple, Optional


class Machine(NamedTuple):
    name: str         # os.uname().machine
    audit_arch: int   # AUDIT_ARCH_* == libseccomp SCMP_ARCH_* token; seccomp_data.arch
    seccomp_nr: int   # __NR_seccomp


MACHINES: dict[str, Machine] = {
    m.name: m
    for m in (
        Machine("x86_64", 0xC000003E, 317),
        Machine("aarch64", 0xC00000B7, 277),
        Machine("riscv64", 0xC00000F3, 277),
        Machine("s390x", 0x80000016, 348),
        Machine("ppc64le", 0xC0000015, 358),
    )
}

#: x86_64 numbers with this bit set are the x32 ABI; the program must kill them.
X32_SYSCALL_BIT = 0x40000000


def native_machine() -> Optional[Machine]:
    """The machine this process runs as, or None when unsupported.

    A 32-bit interpreter on a 64-bit kernel reports the kernel's machine in uname but makes
    32-bit syscalls: a 64-bit filter would kill it on its first call, so it counts as unsupported.
    """
    if sys.maxsize <= 2**32:
        return None
    return MACHINES.get(os.uname().machine)
