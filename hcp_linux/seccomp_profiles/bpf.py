"""Read a classic-BPF seccomp program: decode it, and run it on a given syscall.

The compiler uses run() to check what libseccomp produced before anyone installs it (a foreign
architecture and, on x86_64, an x32 number must reach KILL_PROCESS), so a future libseccomp that
changed its prologue could not silently weaken the filter. Tests use it to go through every rule
cheaply; the kernel tests remain the proof.

Only what seccomp programs may contain is implemented (the kernel's seccomp_check_filter list).
"""
from __future__ import annotations

import struct
from typing import NamedTuple, Sequence

RET_KILL_PROCESS = 0x80000000
RET_KILL_THREAD = 0x00000000
RET_TRAP = 0x00030000
RET_ERRNO = 0x00050000
RET_USER_NOTIF = 0x7FC00000
RET_LOG = 0x7FFC0000
RET_ALLOW = 0x7FFF0000
RET_ACTION_FULL = 0xFFFF0000
RET_DATA = 0x0000FFFF

_INSN = struct.Struct("=HBBI")
_U32 = 0xFFFFFFFF


class Insn(NamedTuple):
    code: int
    jt: int
    jf: int
    k: int


def decode(bpf: bytes) -> list[Insn]:
    """The program as instructions (struct sock_filter, native byte order)."""
    if len(bpf) % _INSN.size:
        raise ValueError(f"BPF program length {len(bpf)} is not a multiple of {_INSN.size}")
    return [Insn(*_INSN.unpack_from(bpf, off)) for off in range(0, len(bpf), _INSN.size)]


def seccomp_data(nr: int, arch: int, args: Sequence[int] = (), ip: int = 0) -> bytes:
    """struct seccomp_data as the kernel lays it out (native byte order)."""
    full = [a & 0xFFFFFFFFFFFFFFFF for a in args] + [0] * (6 - len(args))
    return struct.pack("=iIQ6Q", _s32(nr), arch, ip, *full)


def run(bpf: "bytes | Sequence[Insn]", nr: int, arch: int, args: Sequence[int] = ()) -> int:
    """The SECCOMP_RET_* value the program returns for this syscall (bytes or decoded)."""
    prog = decode(bytes(bpf)) if isinstance(bpf, (bytes, bytearray, memoryview)) else bpf
    data = seccomp_data(nr, arch, args)
    a = x = 0
    mem = [0] * 16
    pc = 0
    while 0 <= pc < len(prog):
        code, jt, jf, k = prog[pc]
        cls = code & 0x07
        pc += 1
        if cls == 0x00:  # LD
            mode = code & 0xE0
            if mode == 0x20:  # ABS, word
                a = struct.unpack_from("=I", data, k)[0]
            elif mode == 0x00:  # IMM
                a = k
            elif mode == 0x60:  # MEM
                a = mem[k]
            elif mode == 0x80:  # LEN
                a = len(data)
            else:
                raise ValueError(f"unsupported LD {code:#x}")
        elif cls == 0x01:  # LDX
            mode = code & 0xE0
            if mode == 0x00:
                x = k
            elif mode == 0x60:
                x = mem[k]
            elif mode == 0x80:
                x = len(data)
            else:
                raise ValueError(f"unsupported LDX {code:#x}")
        elif cls == 0x02:  # ST
            mem[k] = a
        elif cls == 0x03:  # STX
            mem[k] = x
        elif cls == 0x04:  # ALU
            a = _alu(code & 0xF0, a, x if code & 0x08 else k)
        elif cls == 0x05:  # JMP
            op = code & 0xF0
            if op == 0x00:
                pc += k
                continue
            operand = x if code & 0x08 else k
            taken = {
                0x10: a == operand,
                0x20: a > operand,
                0x30: a >= operand,
                0x40: bool(a & operand),
            }.get(op)
            if taken is None:
                raise ValueError(f"unsupported JMP {code:#x}")
            pc += jt if taken else jf
        elif cls == 0x06:  # RET
            return (a if code & 0x18 == 0x10 else k) & _U32
        else:  # MISC
            if code == 0x07:
                x = a
            elif code == 0x87:
                a = x
            else:
                raise ValueError(f"unsupported MISC {code:#x}")
    raise ValueError("program ran off its end")


def _alu(op: int, a: int, b: int) -> int:
    if op == 0x00:
        return (a + b) & _U32
    if op == 0x10:
        return (a - b) & _U32
    if op == 0x20:
        return (a * b) & _U32
    if op == 0x30:
        return a // b if b else 0
    if op == 0x40:
        return a | b
    if op == 0x50:
        return a & b
    if op == 0x60:
        return (a << b) & _U32 if b < 32 else 0
    if op == 0x70:
        return a >> b if b < 32 else 0
    if op == 0x80:
        return (-a) & _U32
    if op == 0xA0:
        return a ^ b
    raise ValueError(f"unsupported ALU op {op:#x}")


def _s32(n: int) -> int:
    n &= _U32
    return n - (1 << 32) if n >= 1 << 31 else n


def describe(ret: int) -> str:
    """'errno:EPERM', 'allow', 'kill_process', ... for a SECCOMP_RET_* value."""
    import errno

    action, data = ret & RET_ACTION_FULL, ret & RET_DATA
    if action == RET_ERRNO:
        return "errno:" + errno.errorcode.get(data, str(data))
    names = {RET_KILL_PROCESS: "kill_process", RET_KILL_THREAD: "kill_thread", RET_TRAP: "trap",
             RET_LOG: "log", RET_ALLOW: "allow", RET_USER_NOTIF: "user_notif"}
    return names.get(action, f"{ret:#x}")

