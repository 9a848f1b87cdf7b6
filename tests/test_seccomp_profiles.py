"""seccomp_profiles as data: the shipped profiles, validation errors, condition expansion, and
what the compiled program decides for each rule (read with the package's BPF interpreter; the
kernel tests in test_seccomp.py are the proof, these go through every value cheaply)."""
from __future__ import annotations

from pathlib import Path

import pyseccomp
import pytest

from hcp_linux import seccomp_profiles as sp
from hcp_linux.seccomp_profiles import bpf
from hcp_linux.seccomp_profiles.conditions import Comparison, expand
from hcp_linux.seccomp_profiles.model import ArgCondition

MACHINE = sp.native_machine()
HEADER = '[profile]\nname = "t"\ndescription = "test"\ndefault_action = "allow"\n'


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HCP_LINUX_SECCOMP_CACHE", str(tmp_path / "programs"))


def write(tmp_path: Path, body: str, header: str = HEADER) -> Path:
    path = tmp_path / "p.toml"
    path.write_text(header + body)
    return path


def rule(syscall: str = '"unshare"', action: str = '"errno:EPERM"', extra: str = "", why: str = '"because"') -> str:
    lines = ["", "[[rule]]", f"syscall = {syscall}", f"action = {action}"]
    if why is not None:
        lines.append(f"why = {why}")
    if extra:
        lines.append(extra)
    return "\n".join(lines) + "\n"


def nr(name: str) -> int:
    return pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name)


# --- shipped profiles ---------------------------------------------------------------------


def test_available_profiles() -> None:
    assert {"baseline", "network-off"} <= set(sp.available_profiles())


@pytest.mark.parametrize("name", ["baseline", "network-off"])
def test_shipped_profiles_are_valid_and_explained(name: str) -> None:
    p = sp.load_profile(name)
    assert isinstance(p, sp.Profile)
    assert p.name == name and p.description and p.default_action == "allow"
    assert p.rules and all(isinstance(r, sp.Rule) for r in p.rules)
    for r in p.rules:
        assert r.why and "\n" not in r.why
        assert r.action.startswith("errno:")
        assert r.syscalls and all(isinstance(s, str) for s in r.syscalls)


def test_baseline_contents() -> None:
    names = set(sp.load_profile("baseline").syscalls())
    required = {
        "unshare", "setns", "clone", "clone3", "mount", "umount2", "pivot_root", "move_mount",
        "open_tree", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr", "ptrace",
        "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp", "bpf", "perf_event_open",
        "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register", "add_key",
        "request_key", "keyctl", "init_module", "finit_module", "delete_module", "kexec_load",
        "kexec_file_load", "reboot", "swapon", "swapoff", "settimeofday", "clock_settime",
        "clock_adjtime", "adjtimex", "stime", "acct", "quotactl", "quotactl_fd", "personality", "ioctl",
    }
    assert required <= names


def test_clone_flags_one_rule_per_flag() -> None:
    p = sp.load_profile("baseline")
    masks = sorted(r.args[0].mask for r in p.rules if r.syscalls == ("clone",))
    assert masks == sorted([0x20000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000])
    for r in p.rules:
        if r.syscalls == ("clone",):
            assert r.args[0].for_machine("x86_64").arg == 0
            assert r.args[0].for_machine("s390x").arg == 1  # clone(stack, flags, ...) there


def test_clone3_is_enosys() -> None:
    p = sp.load_profile("baseline")
    assert [r.action for r in p.rules if "clone3" in r.syscalls] == ["errno:ENOSYS"]


def test_load_profile_by_path_and_pathlike() -> None:
    path = Path(sp.load_profile("baseline").path)
    assert sp.load_profile(path).rules == sp.load_profile("baseline").rules
    assert sp.load_profile(str(path)).name == "baseline"


# --- what the compiled program decides ------------------------------------------------------


@pytest.fixture(scope="module")
def program() -> bytes:
    return sp.compile_profiles(["baseline", "network-off"])


def decide(program: bytes, name: str, *args: int) -> str:
    return bpf.describe(bpf.run(program, nr(name), MACHINE.audit_arch, args))


def test_every_unconditional_rule_decides_its_action(program: bytes) -> None:
    for ref in ("baseline", "network-off"):
        p = sp.load_profile(ref)
        for r in p.rules:
            if r.args:
                continue
            for name in r.syscalls:
                if name in p.unavailable:
                    continue
                number = nr(name) if nr(name) >= 0 else dict(r.nr)[MACHINE.name]
                assert bpf.describe(bpf.run(program, number, MACHINE.audit_arch)) == r.action, name


@pytest.mark.parametrize("name", ["read", "write", "openat", "execve", "mmap", "futex", "getpid",
                                  "exit_group", "prctl", "seccomp", "landlock_restrict_self"])
def test_ordinary_calls_allowed(program: bytes, name: str) -> None:
    assert decide(program, name, 0, 0, 0) == "allow"


def test_clone_decisions(program: bytes) -> None:
    sigchld = 17
    thread = 0x3D0F00  # what pthread_create passes
    assert decide(program, "clone", sigchld) == "allow"
    assert decide(program, "clone", thread) == "allow"
    for flag in (0x20000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000):
        assert decide(program, "clone", flag | sigchld) == "errno:EPERM", hex(flag)
        assert decide(program, "clone", (1 << 40) | flag) == "errno:EPERM"


def test_ioctl_decisions(program: bytes) -> None:
    for req in (0x5412, 0x541C, 0xFFFFFFFF_00005412, 0x00000001_0000541C):
        assert decide(program, "ioctl", 0, req) == "errno:EPERM", hex(req)
    for req in (0x5413, 0x5401, 0x541B, 0x5411, 0x1_5412_0000):
        assert decide(program, "ioctl", 0, req) == "allow", hex(req)


def test_personality_decisions(program: bytes) -> None:
    for value in (0, 8, 0x20000, 0x20008, 0xFFFFFFFF, 0x5_FFFFFFFF, 0x8000008):
        assert decide(program, "personality", value) == "allow", hex(value)
    dangerous = (0x0400000, 0x0040000, 0x0200000, 0x0100000)
    for flag in dangerous:
        for extra in (0, 8, 0x80000000, 0xFFFFFFFF & ~flag & ~1, 0x7_00000000):
            value = flag | extra
            if value & 0xFFFFFFFF == 0xFFFFFFFF:
                continue
            assert decide(program, "personality", value) == "errno:EPERM", hex(value)
    # every single-bit hole in the query still carries the other flags: refused
    for bit in range(32):
        value = 0xFFFFFFFF & ~(1 << bit)
        assert decide(program, "personality", value) == "errno:EPERM", hex(value)


def test_socket_decisions(program: bytes) -> None:
    assert decide(program, "socket", 1, 1, 0) == "allow"
    assert decide(program, "socketpair", 1, 1, 0) == "allow"
    for family in (0, 2, 3, 10, 16, 17, 30, 40, 44, 0x1_00000001):
        assert decide(program, "socket", family, 1, 0) == "errno:EAFNOSUPPORT", family
        assert decide(program, "socketpair", family, 1, 0) == "errno:EAFNOSUPPORT", family


def test_foreign_arch_and_x32_killed(program: bytes) -> None:
    assert bpf.describe(bpf.run(program, 20, 0x40000003)) == "kill_process"  # i386
    assert bpf.describe(bpf.run(program, 0, 0xDEAD)) == "kill_process"
    if MACHINE.name == "x86_64":
        for n in (0, 39, 59, 272, 512, 547):
            assert bpf.describe(bpf.run(program, n | 0x40000000, MACHINE.audit_arch)) == "kill_process"


def test_program_checks_arch_first(program: bytes) -> None:
    insns = bpf.decode(program)
    assert (insns[0].code, insns[0].k) == (0x20, 4)  # ld [arch]
    assert insns[1].code == 0x15 and insns[1].k == MACHINE.audit_arch


# --- condition expansion ------------------------------------------------------------------


def test_expand_single_conditions() -> None:
    assert expand([], "x86_64") == [()]
    assert expand([ArgCondition(0, "ne", 1)], "x86_64") == [(Comparison(0, "ne", 1),)]
    assert expand([ArgCondition(1, "eq", 5, bits=32)], "x86_64") == [(Comparison(1, "masked_eq", 0xFFFFFFFF, 5),)]
    assert len(expand([ArgCondition(0, "ne", 7, bits=32)], "x86_64")) == 32


def test_expand_flag_unless_query_is_exact() -> None:
    conds = [ArgCondition(0, "masked_eq", 0x400000, 0x400000, bits=32), ArgCondition(0, "ne", 0xFFFFFFFF, bits=32)]
    cover = expand(conds, "x86_64")
    assert len(cover) == 31

    def matches(v: int) -> bool:
        return any(all((v & c.a) == c.b for c in conj) for conj in cover)

    for v in (0x400000, 0x400008, 0xFFFFFFFE, 0x1_00400000, 0xFFBFFFFF, 0x80000000):
        assert matches(v) == (bool(v & 0x400000) and (v & 0xFFFFFFFF) != 0xFFFFFFFF), hex(v)
    assert not matches(0xFFFFFFFF) and not matches(0x3_FFFFFFFF) and not matches(0)


def test_expand_machine_override() -> None:
    cond = ArgCondition(0, "masked_eq", 0x10000000, 0x10000000, on=(("s390x", (("index", 1),)),))
    assert expand([cond], "s390x") == [(Comparison(1, "masked_eq", 0x10000000, 0x10000000),)]
    assert expand([cond], "aarch64") == [(Comparison(0, "masked_eq", 0x10000000, 0x10000000),)]


# --- bad input ----------------------------------------------------------------------------


def test_unknown_profile_name() -> None:
    for name in ("nope", "Base Line"):
        with pytest.raises(sp.ProfileNotFoundError) as info:
            sp.load_profile(name)
        assert info.value.name == name and repr(name) in str(info.value)
        with pytest.raises(sp.ProfileNotFoundError):
            sp.compile_profiles([name])
    assert isinstance(info.value, sp.SeccompProfileError)


def test_missing_path(tmp_path: Path) -> None:
    with pytest.raises(sp.ProfileNotFoundError):
        sp.load_profile(tmp_path / "absent.toml")


def test_not_toml(tmp_path: Path) -> None:
    path = write(tmp_path, "[[rule]\nsyscall = ")
    with pytest.raises(sp.ProfileFormatError) as info:
        sp.load_profile(path)
    assert str(path) in str(info.value) and "TOML" in str(info.value)
    with pytest.raises(sp.ProfileFormatError):
        sp.compile_profiles([str(path)])


@pytest.mark.parametrize(
    "body, index, field",
    [
        (rule(why='""'), 0, "why"),
        (rule() + rule(action='"deny"'), 1, "action"),
        (rule(action='"errno:EWHAT"'), 0, "action"),
        (rule(action='"allow"'), 0, "action"),  # same as the default
        (rule(extra='args = [{ index = 0, op = "contains", value = 1 }]'), 0, "args[0].op"),
        (rule(extra='args = [{ index = 6, op = "eq", value = 1 }]'), 0, "args[0].index"),
        (rule(extra='args = [{ index = 0, op = "masked_eq", value = 1 }]'), 0, "args[0].mask"),
        (rule(extra='args = [{ index = 0, op = "eq", value = 1, mask = 1 }]'), 0, "args[0].mask"),
        (rule(extra='args = [{ index = 0, op = "eq", value = "x" }]'), 0, "args[0].value"),
        (rule(extra='args = [{ index = 0, op = "lt", value = 1, bits = 32 }]'), 0, "args[0].bits"),
        (rule(extra='args = [{ index = 0, op = "eq", value = 0x100000000, bits = 32 }]'), 0, "args[0].value"),
        (rule(extra='args = [{ index = 0, op = "masked_eq", mask = 1, value = 2 }]'), 0, "args"),
        (rule(extra='args = [{ index = 0, op = "eq", value = 1 }, { index = 0, op = "eq", value = 2 }]'), 0, "args"),
        (rule(extra='args = [{ index = 0, op = "eq", value = 1, on = { amd64 = { index = 1 } } }]'), 0, "args[0].on.amd64"),
        (rule(extra='arg = []'), 0, "arg"),
        (rule(syscall="[]"), 0, "syscall"),
        (rule(syscall='["unshare", "unshare"]'), 0, "syscall"),
        (rule(syscall='["unshare", "setns"]', extra="nr = { x86_64 = 1 }"), 0, "nr"),
        (rule(extra="nr = { x86_64 = 999 }"), 0, "nr"),  # disagrees with libseccomp
    ],
)
def test_malformed_rule(tmp_path: Path, body: str, index: int, field: str) -> None:
    path = write(tmp_path, body)
    with pytest.raises(sp.ProfileFormatError) as info:
        sp.load_profile(path)
    err = info.value
    assert (err.path, err.rule_index, err.field) == (str(path), index, field)
    assert str(path) in str(err) and f"rule[{index}]" in str(err) and field in str(err)


@pytest.mark.parametrize(
    "header, field",
    [
        ("", "profile"),
        ('[profile]\nname = "t"\n', "profile.default_action"),
        ('[profile]\nname = "T T"\ndefault_action = "allow"\n', "profile.name"),
        ('[profile]\nname = "t"\ndefault_action = "permit"\n', "profile.default_action"),
        ('[profile]\nname = "t"\ndefault_action = "allow"\nincludes = ["x"]\n', "profile.includes"),
    ],
)
def test_malformed_header(tmp_path: Path, header: str, field: str) -> None:
    with pytest.raises(sp.ProfileFormatError) as info:
        sp.load_profile(write(tmp_path, rule(), header=header))
    assert info.value.field == field and info.value.rule_index is None


def test_unknown_syscall(tmp_path: Path) -> None:
    path = write(tmp_path, rule() + rule(syscall='["setns", "unshar"]'))
    for attempt in (lambda: sp.load_profile(path), lambda: sp.compile_profiles([str(path)])):
        with pytest.raises(sp.UnknownSyscallError) as info:
            attempt()
        assert info.value.syscall == "unshar" and info.value.rule_index == 1
        assert "'unshar'" in str(info.value) and str(path) in str(info.value)


def test_syscall_of_another_arch_only_is_skipped_not_an_error(tmp_path: Path) -> None:
    # iopl exists on x86_64 only; stime on ppc64le only: absent here means skipped + recorded.
    other = "iopl" if MACHINE.name != "x86_64" else "stime"
    p = sp.load_profile(write(tmp_path, rule(syscall=f'["unshare", "{other}"]')))
    assert p.unavailable == (other,)
    program = sp.compile_profiles([p.path])
    assert bpf.describe(bpf.run(program, nr("unshare"), MACHINE.audit_arch)) == "errno:EPERM"


def test_nr_fallback_for_calls_newer_than_libseccomp(tmp_path: Path) -> None:
    p = sp.load_profile(write(tmp_path, rule(syscall='"open_tree_attr"', extra="nr = { x86_64 = 467, aarch64 = 467 }")))
    assert p.unavailable == ()
    program = sp.compile_profiles([p.path])
    assert bpf.describe(bpf.run(program, 467, MACHINE.audit_arch)) == "errno:EPERM"


def test_conflicting_profiles_refused(tmp_path: Path) -> None:
    a = tmp_path / "a.toml"
    a.write_text(HEADER + rule(action='"errno:EPERM"'))
    b = tmp_path / "b.toml"
    b.write_text(HEADER + rule(action='"errno:ENOSYS"'))
    with pytest.raises(sp.SeccompCompileError, match="conflicts"):
        sp.compile_profiles([str(a), str(b)])


def test_same_rule_in_two_profiles_is_fine(tmp_path: Path) -> None:
    # baseline and network-off both refuse io_uring_setup with EPERM
    program = sp.compile_profiles(["network-off", "baseline"])
    assert bpf.describe(bpf.run(program, nr("io_uring_setup"), MACHINE.audit_arch)) == "errno:EPERM"


def test_default_actions_must_agree(tmp_path: Path) -> None:
    other = tmp_path / "deny.toml"
    other.write_text(HEADER.replace('"allow"', '"errno:EPERM"') + rule(syscall='"read"', action='"allow"'))
    with pytest.raises(sp.SeccompCompileError, match="default action"):
        sp.compile_profiles(["baseline", str(other)])


def test_empty_profile_list() -> None:
    with pytest.raises(sp.SeccompProfileError):
        sp.compile_profiles([])


def test_errors_are_typed() -> None:
    for cls in (sp.ProfileNotFoundError, sp.ProfileFormatError, sp.UnknownSyscallError, sp.SeccompCompileError):
        assert issubclass(cls, sp.SeccompProfileError)


def test_notify_is_a_rules_action_only(tmp_path: Path) -> None:
    """"notify" (observe: the listener looks, the kernel runs the call) is for rules: as a
    default it would send every syscall to the listener."""
    bad = tmp_path / "observe-all.toml"
    bad.write_text(HEADER.replace('"allow"', '"notify"') + rule(syscall='"read"', action='"errno:EPERM"'))
    with pytest.raises(sp.ProfileFormatError, match="unknown action"):
        sp.compile_profiles([str(bad)])
    ok = tmp_path / "observe-read.toml"
    ok.write_text(HEADER + rule(syscall='"read"', action='"notify"'))
    read = nr("read")
    assert bpf.run(sp.compile_profiles([str(ok)], notify=True), read, MACHINE.audit_arch) == \
        bpf.RET_USER_NOTIF
    # without a listener the rule is left out: read is allowed, as by the default
    assert bpf.run(sp.compile_profiles([str(ok)]), read, MACHINE.audit_arch) == bpf.RET_ALLOW


def test_notify_when_a_pointer_is_not_null(tmp_path: Path) -> None:
    """network-observe's sendto() rule: "ne 0" on argument 4 compiles to a 64-bit compare
    (libseccomp SCMP_CMP_NE), so a sendto() without a destination (send() on a connected
    socket: NULL) stays in the kernel, and any non-NULL pointer, high half alone included,
    goes to the listener."""
    path = tmp_path / "observe-addressed.toml"
    path.write_text(HEADER + rule(syscall='"sendto"', action='"notify"',
                                  extra='args = [{ index = 4, op = "ne", value = 0 }]'))
    program = bpf.decode(sp.compile_profiles([str(path)], notify=True))
    sendto = nr("sendto")

    def run(dest: int) -> int:
        return bpf.run(program, sendto, MACHINE.audit_arch, (3, 0x1000, 5, 0, dest, 16))

    assert run(0) == bpf.RET_ALLOW
    for dest in (1, 0x7FFC_0000_1000, 1 << 32, 1 << 63, 0xFFFF_FFFF_FFFF_FFFF):
        assert run(dest) == bpf.RET_USER_NOTIF, hex(dest)
    assert bpf.run(program, nr("sendmsg"), MACHINE.audit_arch, (3, 0x1000, 0)) == bpf.RET_ALLOW
    shipped = bpf.decode(sp.compile_profiles(["network-observe"], notify=True))
    assert bpf.run(shipped, sendto, MACHINE.audit_arch, (3, 1, 1, 0, 0, 0)) == bpf.RET_ALLOW
    assert bpf.run(shipped, sendto, MACHINE.audit_arch, (3, 1, 1, 0, 8, 16)) == \
        bpf.RET_USER_NOTIF
