"""What the parent and both executors agree on, written once.

The ctypes executor (:mod:`hcp_linux.ctypes_executor.child`) and the C one (``native/hcp_exec.c``) perform the
same steps and report a failing one the same way; the parent serialises a Plan for hcp-exec
and reads both executors' error records. Every constant they share is here: the C program
includes a header generated from this module at build time (:func:`c_header`), so changing a
step or a flag here changes both executors, and a binary built from other values is never
used (its file name carries a digest of the header).

This module imports the standard library only, and little of it: the ctypes executor's
helper interpreter (:mod:`hcp_linux.ctypes_executor.child_main`) imports it at start-up.
"""
from __future__ import annotations

import struct

import _signal

#: The steps of a confined spawn, in the order they run; a failure travels as the index.
#: "helper" is the ctypes executor's own: its helper interpreter could not start the steps.
STEPS = (
    "internal", "stdio", "setsid", "pdeathsig", "unshare-user", "uid-map", "unshare-mount",
    "unshare-net", "unshare-ipc", "unshare-pid", "mount-private", "fork-pid1", "bind-clone",
    "root-tmpfs", "bind-attach", "mask", "symlink", "dev", "devpts", "proc", "pid-max",
    "proc-fence", "tmp", "canary",
    "pivot-root", "root-readonly", "watch", "loopback-up", "egress-capture", "proxy-listen", "chdir", "rlimits",
    "no-new-privs", "drop-capabilities", "landlock-rules", "landlock-restrict", "seccomp",
    "close-fds", "fork-command", "verify", "execve", "helper",
)
STEP_INDEX = {name: i for i, name in enumerate(STEPS)}

#: The plan's flags (hcp_exec.c: ``F_<name>``).
FLAGS = {
    "USERNS": 1 << 0, "MOUNTNS": 1 << 1, "NETNS": 1 << 2, "IPCNS": 1 << 3, "PIDNS": 1 << 4,
    "CONFINED": 1 << 5, "PROXY": 1 << 6, "HOLDS_SETPCAP": 1 << 7, "PROC_FRESH": 1 << 8,
    "WAIT_FOR_TREE": 1 << 9, "LANDLOCK": 1 << 10, "CANARY": 1 << 11, "SECCOMP": 1 << 12,
    "PID_MAX": 1 << 13, "PTY": 1 << 14, "SECCOMP_LISTENER": 1 << 15,
    # landlock_restrict_self's flags (LANDLOCK_RESTRICT_SELF_*, bits 0-2), shifted by 16
    "LL_LOG_SAME_EXEC_OFF": 1 << 16, "LL_LOG_NEW_EXEC_ON": 1 << 17,
    "LL_LOG_SUBDOMAINS_OFF": 1 << 18,
}
#: Where landlock_restrict_self's flags sit in the plan's flags.
LL_FLAGS_SHIFT = 16
#: The namespace layers of a Plan and their flags.
LAYER_FLAGS = (("userns", FLAGS["USERNS"]), ("mountns", FLAGS["MOUNTNS"]),
               ("netns", FLAGS["NETNS"]), ("ipcns", FLAGS["IPCNS"]), ("pidns", FLAGS["PIDNS"]))


def namespace_flags(layers: "frozenset[str] | set[str]") -> int:
    """The plan flags of the namespaces among ``layers``: what a spare must be started with
    to take a plan of those layers (hcp_exec.c: receive)."""
    flags = 0
    for layer, bit in LAYER_FLAGS:
        if layer in layers:
            flags |= bit
    return flags


#: The header of every plan: u64 ``PLAN_VERSION << 32 | PLAN_MAGIC`` ("HCPX" little-endian).
PLAN_MAGIC, PLAN_VERSION = 0x58504348, 13

class RunFds:
    """The run's channels, by name: the fds its monitor gets from the parent (besides the
    Landlock ruleset, which is the confinement's, not a channel). One value instead of five
    loose arguments through every signature from the spawn to the child side; hcp_exec.c holds
    the same in ``struct run_fds``, generated from :data:`RUN_FDS`. -1: the run has none.

    A plain class, not a dataclass: the ctypes executor's helper interpreter imports this
    module at start-up, and ``dataclasses`` would cost it ~10 ms. Frozen all the same."""

    __slots__ = ("err", "stdio", "proxy", "done", "notify")

    err: int  #: the close-on-exec error pipe's write end (a failing step's record)
    stdio: "tuple[int, int, int]"  #: what becomes the command's fds 0, 1 and 2
    proxy: int  #: our end of the socketpair to the parent's egress proxy (plan.proxy)
    done: int  #: the runtime's "run over" pipe, written by the sandbox's init (pid namespace)
    notify: int  #: where the seccomp listener goes to the runtime (plan.seccomp_listener)

    def __init__(self, err: int, stdio: "tuple[int, int, int]", proxy: int = -1,
                 done: int = -1, notify: int = -1) -> None:
        if len(stdio) != 3:
            raise ValueError(f"RunFds: stdio is three fds, not {len(stdio)}")
        for name, value in zip(self.__slots__, (err, tuple(stdio), proxy, done, notify)):
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"RunFds is frozen: cannot set {name}")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RunFds) and self.fields() == other.fields()

    def __hash__(self) -> int:
        return hash(self.fields())

    def __repr__(self) -> str:
        return "RunFds(" + ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__slots__) + ")"

    def fields(self) -> "tuple[int, tuple[int, int, int], int, int, int]":
        """The fields in order, as plain values (what crosses to the ctypes helper)."""
        return (self.err, self.stdio, self.proxy, self.done, self.notify)

    def all(self) -> "tuple[int, ...]":
        """Every fd the run has (none of the -1s): what a spawn keeps open for the child."""
        return tuple(fd for fd in (self.err, *self.stdio, self.proxy, self.done, self.notify)
                     if fd >= 0)


#: The members of hcp_exec.c's ``struct run_fds`` (RunFds's fields, in order): how many fds
#: each holds, and the MESSAGE_BITS bit that says a spare's message carries it (None: always).
RUN_FDS = (("err", 1, None), ("stdio", 3, None), ("proxy", 1, "PROXY"), ("done", 1, "DONE"),
           ("notify", 1, "NOTIFY"))
assert tuple(name for name, _, _ in RUN_FDS) == RunFds.__slots__

#: The plan's wire layout, field by field, in order: written by native/wire.py from these
#: tuples, read by hcp_exec.c's parse_plan_fields and parse_view_fields, generated from them
#: (:func:`c_header`), so the two cannot disagree on an order. Every value is a little-endian
#: u64; a string its length (its NUL included), its bytes and a NUL; bytes their length and
#: them; a list its count and its items. (name, kind), kind one of: "u64", "i64", "u32",
#: "u16", "int" (a u64 on the wire, the C member's type in C); "str"; "strs" (a list of
#: strings: a NULL-terminated ``char **`` in C); "bytes"; "ports" (a list of TCP ports, at
#: most CAPTURE_PORTS_MAX, none 0); "magic" (u64 ``PLAN_VERSION << 32 | PLAN_MAGIC``); "view"
#: (bytes: the prepared section, VIEW_LAYOUT); ("list", fields) (a list of records, each
#: its strings, then its u64s); ("if", flags field, flag, fields) (present only when that
#: flag is set). C: the member
#: of hcp_exec.c's plan ``P`` of the same name (C_MEMBERS: of another), ``n_<name>`` the count.
VIEW_LAYOUT: tuple = (
    ("view_flags", "u32"), ("pid_max", "i64"), ("tmp_options", "str"), ("shm_options", "str"),
    ("binds", ("list", (("source", "str"), ("target", "str"), ("is_dir", "int"), ("dev", "u64"),
                        ("ino", "u64"), ("attrs", "u64"), ("access", "u64")))),
    ("masks", ("list", (("path", "str"), ("is_dir", "int")))),
    ("watch", "strs"),
    ("symlinks", ("list", (("link", "str"), ("dest", "str")))),
    ("fences", ("list", (("path", "str"), ("masked", "int")))),
    ("capture_ports", "ports"),
    ("capture_nets", ("list", (("address", "str"), ("prefix", "u64")))),
    ("cap_last_cap", "i64"), ("bpf", "bytes"),
    ("landlock", ("if", "view_flags", "LANDLOCK", (
        ("ll_fs", "u64"), ("ll_net", "u64"), ("ll_scoped", "u64"), ("dir_only", "u64"),
        ("rules", ("list", (("path", "str"), ("access", "u64"))))))),
)
#: The whole plan: the run's own fields around the prepared section.
PLAN_LAYOUT: tuple = (
    ("magic", "magic"), ("flags", "u32"), ("parent_pid", "i64"), ("uid", "i64"), ("gid", "i64"),
    ("stdin", "int"), ("stdout", "int"), ("stderr", "int"), ("ruleset", "int"), ("proxy", "int"),
    ("done", "int"), ("notify", "int"), ("proxy_addr", "u32"), ("proxy_port", "u16"),
    ("umask", "u64"), ("sig_ignored", "u64"), ("sig_blocked", "u64"),
    ("cwd", "str"), ("exe", "str"), ("canary", "str"),
    ("view", "view"),
    ("rlimits", ("list", (("resource", "u64"), ("value", "u64")))),
    ("argv", "strs"), ("env", "strs"),
)
#: Plan fields whose C member has another name (the run's channels sit in ``P.fds``).
C_MEMBERS = {"stdin": "fds.stdio[0]", "stdout": "fds.stdio[1]", "stderr": "fds.stdio[2]",
             "ruleset": "ruleset_fd", "proxy": "fds.proxy", "done": "fds.done",
             "notify": "fds.notify"}

#: What comes with a plan handed to a spare (hcp_exec.c: ``M_<name>``): which optional fds the
#: message carries, and whether the plan is in the message itself rather than in a memfd.
MESSAGE_BITS = {"RULESET": 1, "PROXY": 2, "DONE": 4, "INLINE": 8, "NOTIFY": 16}
#: Bytes: a larger plan goes to a spare in a memfd (a long argv or environment).
INLINE_MAX = 60 << 10

#: The error record a failing step writes to the close-on-exec error pipe, then exits 125:
#: (index in STEPS, errno) as little-endian u16s, then up to DETAIL_MAX bytes of detail.
ERROR_RECORD = struct.Struct("<HH")
DETAIL_MAX = 512

#: A file made in the mount view's root that Landlock must refuse to open (the proof that the
#: ruleset is in force).
CANARY = "/.hcp-canary"
#: Where the egress proxy listens inside the sandbox's own network namespace.
PROXY_ADDRESS = ("127.0.0.1", 3128)
#: Transparent egress (network = "allow"): the sandbox's resolver, on UDP inside its own
#: namespace (the view's /etc/resolv.conf names it). Port 53 is below the namespace's
#: ip_unprivileged_port_start, so no command in the sandbox can bind it first.
RESOLVER_ADDRESS = ("127.0.0.53", 53)
#: The synthetic addresses the resolver answers with, one per allowed name per run: the
#: benchmarking range (RFC 2544), never a real destination. The egress-capture step makes the
#: whole range local on lo, so a connect() to any of its addresses is accepted inside the
#: namespace with its destination kept (getsockname); every other address has no route.
SYNTHETIC_NET = ("198.18.0.0", 15)
#: At most this many TCP ports are captured (one listener on 0.0.0.0 per allowed port).
CAPTURE_PORTS_MAX = 32
#: The most allow-list networks (IP and CIDR entries) the egress-capture step makes local on
#: lo, each as an address of its own (labels lo:hcp1... on IPv4).
CAPTURE_NETS_MAX = 16

#: Set in the flags of the executors' own sendmsg()s (the fds they hand to the runtime: the
#: capture and proxy sockets, the seccomp listener), past the 32 bits the kernel reads
#: (sendmsg's flags are an unsigned int: it ignores the upper half). Some of them run after the
#: filter is installed and before the runtime holds its listener; the network-observe
#: profile hands every sendmsg() whose flags fit in 32 bits, as every libc passes them, to
#: that listener, so these, which it could not answer yet, stay in the kernel.
HANDOVER_MARK = 1 << 32

#: Set in the command's wait status the init writes on the runtime's done pipe (never in
#: one the monitor mirrors) when a watched path of the view (the plan's ``watch``: a hidden
#: path, a read-only carve-out) lost its mount during the run and the init killed the run:
#: the host replaced the file, and the kernel took the mount over it away. No wait status
#: has the bit (they fit in 16 bits); readers clear it.
VIEW_LOST = 1 << 30


def init_report(data: bytes) -> "tuple[int | None, str]":
    """The init's report, as read off the done pipe (up to 4 bytes): the command's wait
    status (None when the init ended without one: it or the monitor was killed from outside)
    and how the run ended as far as the report tells, for ``end.by`` when nobody in the
    runtime ended it: "exit", "view-lost" (the init killed it: :data:`VIEW_LOST`, cleared
    from the status) or "lost". The one reading of the report, in-process and served."""
    if len(data) != 4:
        return None, "lost"
    status = struct.unpack("<i", data)[0]
    if status & VIEW_LOST:
        return status & ~VIEW_LOST, "view-lost"
    return status, "exit"


#: The lines of /proc/self/status that the verify step requires before exec (the last two
#: only when the plan holds CAP_SETPCAP, resp. installs seccomp).
STATUS_ALWAYS = (b"NoNewPrivs:\t1\n", b"CapEff:\t0000000000000000\n",
                 b"CapPrm:\t0000000000000000\n", b"CapAmb:\t0000000000000000\n")
STATUS_SETPCAP = b"CapBnd:\t0000000000000000\n"
STATUS_SECCOMP = b"Seccomp:\t2\n"


#: Details both executors write, as templates of one path: ``STALE`` (bind-clone: the tree
#: cloned is not the object the parent checked), ``CANARY_READABLE`` (verify: Landlock is
#: not in force). hcp_exec.c gets them as printf formats (``DETAIL_<name>``).
DETAILS = {"STALE": "{} changed since it was checked",
           "CANARY_READABLE": "Landlock canary {} was readable",
           "VIEW_LOST": "a hidden or read-only path lost its mount (its file was replaced on "
                        "the host)"}


def _ipv4(text: str) -> int:
    a, b, c, d = (int(x) for x in text.split("."))
    return a << 24 | b << 16 | c << 8 | d


def status_lacks(line: bytes) -> str:
    """The verify step's detail when /proc/self/status lacks ``line`` (both executors)."""
    return f"/proc/self/status lacks {line.strip().decode()!r}"


def encode_error_record(step: str, err: int, detail: str) -> bytes:
    return ERROR_RECORD.pack(STEP_INDEX.get(step, 0), err & 0xFFFF) \
        + detail.encode()[:DETAIL_MAX]


def step_name(index: int) -> str:
    """The step an error record names; an index out of range is "internal"."""
    return STEPS[index] if 0 <= index < len(STEPS) else "internal"


def decode_error_record(record: bytes) -> tuple[str, int, str]:
    """(step, errno, detail) of an error record of either executor (at least 4 bytes)."""
    index, err = ERROR_RECORD.unpack_from(record)
    return step_name(index), err, record[ERROR_RECORD.size:].decode(errors="replace")


def table() -> str:
    """The protocol as text, one value a line: what ``hcp-exec --protocol`` prints, so a test
    can tell that a binary was built against exactly these values."""
    lines = [f"version {PLAN_VERSION} magic {PLAN_MAGIC:#x}", f"inline_max {INLINE_MAX}",
             f"detail_max {DETAIL_MAX}", "resolver %s:%d" % RESOLVER_ADDRESS,
             "synthetic %s/%d" % SYNTHETIC_NET, f"capture_ports_max {CAPTURE_PORTS_MAX}",
             f"handover_mark {HANDOVER_MARK:#x}"]
    lines += [f"step {i} {name}" for i, name in enumerate(STEPS)]
    lines += [f"flag {name} {bit}" for name, bit in FLAGS.items()]
    lines += [f"message {name} {bit}" for name, bit in MESSAGE_BITS.items()]
    lines += [f"run_fds {name} {count}" for name, count, _ in RUN_FDS]
    lines += layout_lines()
    return "\n".join(lines) + "\n"


def layout_lines() -> list[str]:
    """PLAN_LAYOUT and VIEW_LAYOUT as lines, one field a line, nested ones by their path:
    ``plan view view``, ``view binds.source str``, ``view landlock.rules.path str``."""
    def walk(section: str, prefix: str, fields: tuple) -> list[str]:
        out = []
        for name, kind in fields:
            if isinstance(kind, str):
                out.append(f"{section} {prefix}{name} {kind}")
            elif kind[0] == "list":
                out.append(f"{section} {prefix}{name} list")
                out += walk(section, f"{prefix}{name}.", kind[1])
            else:
                out.append(f"{section} {prefix}{name} if {kind[1]} {kind[2]}")
                out += walk(section, f"{prefix}{name}.", kind[3])
        return out
    return walk("plan", "", PLAN_LAYOUT) + walk("view", "", VIEW_LAYOUT)


def _c_string(data: bytes) -> str:
    return '"' + "".join(chr(b) if 0x20 <= b < 0x7F and b not in b'"\\' else f"\\{b:03o}"
                         for b in data) + '"'


#: Signals the command gets at their default action whatever the runtime does with them: the
#: Python runtime ignores these, ignored stays ignored across execve, and subprocess resets
#: them (restore_signals). Both executors apply it (hcp-exec through the plan's ignored set).
DEFAULT_SIGNALS = (_signal.SIGPIPE, _signal.SIGXFSZ)


def c_header() -> str:
    """hcp_exec_protocol.h: this module's values for hcp_exec.c (written by the build, next to
    the compiler's output, never committed)."""
    out = ["/* Generated from hcp_linux/protocol.py by hcp_linux/native/build.py: do not edit. */",
           "#ifndef HCP_EXEC_PROTOCOL_H", "#define HCP_EXEC_PROTOCOL_H", "",
           f"#define PLAN_MAGIC {PLAN_MAGIC:#x}u", f"#define PLAN_VERSION {PLAN_VERSION}",
           f"#define INLINE_MAX {INLINE_MAX}", f"#define DETAIL_MAX {DETAIL_MAX}",
           f"#define LL_FLAGS_SHIFT {LL_FLAGS_SHIFT}",
           f"#define RESOLVER_ADDR {_ipv4(RESOLVER_ADDRESS[0]):#x}u",
           f"#define RESOLVER_PORT {RESOLVER_ADDRESS[1]}",
           f"#define SYNTHETIC_ADDR {_ipv4(SYNTHETIC_NET[0]):#x}u",
           f"#define SYNTHETIC_PREFIX {SYNTHETIC_NET[1]}",
           f"#define CAPTURE_PORTS_MAX {CAPTURE_PORTS_MAX}",
           f"#define CAPTURE_NETS_MAX {CAPTURE_NETS_MAX}",
           f"#define HANDOVER_MARK {HANDOVER_MARK:#x}ull",
           f"#define VIEW_LOST {VIEW_LOST:#x}u", "",
           "enum step {"]
    out += [f"    S_{name.upper().replace('-', '_')} = {i}," for i, name in enumerate(STEPS)]
    out += ["    N_STEPS", "};", "", "static const char *const step_names[N_STEPS] = {"]
    out += [f"    {_c_string(name.encode())}," for name in STEPS]
    out += ["};", ""]
    out += [f"#define F_{name} {bit}u" for name, bit in FLAGS.items()]
    out += [f"#define M_{name} {bit}u" for name, bit in MESSAGE_BITS.items()]
    out += ["", "static const struct { const char *name; unsigned bit; } flag_names[] = {"]
    out += [f"    {{{_c_string(name.encode())}, F_{name}}}," for name in FLAGS]
    out += ["};", "static const struct { const char *name; unsigned bit; } message_names[] = {"]
    out += [f"    {{{_c_string(name.encode())}, M_{name}}}," for name in MESSAGE_BITS]
    out += ["};", ""]
    out += [f"#define DETAIL_{name} "
            f"{_c_string(text.replace('%', '%%').replace('{}', '%s').encode())}"
            for name, text in DETAILS.items()]
    out += ["", "/* verify: a line /proc/self/status must have, and the detail without it */",
            "struct status_line { const char *line, *lacks; };"]
    for name, lines in (("status_always", STATUS_ALWAYS), ("status_setpcap", (STATUS_SETPCAP,)),
                        ("status_seccomp", (STATUS_SECCOMP,))):
        out.append(f"static const struct status_line {name}[] = {{")
        out += [f"    {{{_c_string(line)}, {_c_string(status_lacks(line).encode())}}},"
                for line in lines]
        out.append("};")
    out += ["", "/* The run's channels (protocol.RunFds): -1 where the run has none. */",
            "struct run_fds {"]
    out += [f"    int {name}{'' if count == 1 else f'[{count}]'};" for name, count, _ in RUN_FDS]
    count = sum(n for _, n, _ in RUN_FDS)
    out += ["};", f"#define RUN_FDS_COUNT {count} /* the fds a struct run_fds holds */",
            "#define RUN_FDS_NONE {" + ", ".join(
                "-1" if n == 1 else "{" + ", ".join(["-1"] * n) + "}" for _, n, _ in RUN_FDS)
            + "}",
            "/* a spare's message: the plan's memfd (unless M_INLINE), the run's channels, the",
            " * parent's Landlock ruleset (M_RULESET) */",
            "#define MESSAGE_FDS_MAX (1 + RUN_FDS_COUNT + 1)",
            "static const struct { const char *name; int count; } run_fds_names[] = {"]
    out += [f"    {{{_c_string(name.encode())}, {count}}}," for name, count, _ in RUN_FDS]
    out += ["};", ""]
    out.append("static const char *const layout_lines[] = {")
    out += [f"    {_c_string(line.encode())}," for line in layout_lines()]
    out += ["};", "", "#endif", ""]
    out += _c_parsers()
    return "\n".join(out) + "\n"


#: A u64 field's conversion to its C member's type.
_C_CASTS = {"u64": "", "i64": "(int64_t)", "u32": "(uint32_t)", "u16": "(uint16_t)",
            "int": "(int)(int64_t)"}


def _wire_min(kind: "str | tuple") -> int:
    """The fewest bytes a field takes on the wire (what bounds a list's count)."""
    if kind == "str":
        return 9  # its length and its NUL
    if isinstance(kind, tuple):
        return sum(_wire_min(k) for _, k in kind[1]) if kind[0] == "list" else 0
    return 8


def _c_fields(fields: tuple, lvalue: str, depth: int, indent: str) -> list[str]:
    """C statements reading ``fields`` into the members of ``lvalue``."""
    out = []
    for name, kind in fields:
        dst = f"{lvalue}{C_MEMBERS.get(name, name) if lvalue == 'P.' else name}"
        i = "ijk"[depth]
        if kind in _C_CASTS:
            out.append(f"{indent}{dst} = {_C_CASTS[kind]}get_u64();")
        elif kind == "magic":
            out.append(f"{indent}if (get_u64() != ((uint64_t)PLAN_VERSION << 32 | PLAN_MAGIC))")
            out.append(f'{indent}    malformed("version");')
        elif kind == "str":
            out.append(f"{indent}{dst} = get_str();")
        elif kind in ("bytes", "view"):
            out.append(f"{indent}{dst} = get_bytes(&{dst}_len);")
            if kind == "view":
                out.append(f"{indent}parse_section({dst}, {dst}_len, parse_view);")
        elif kind == "strs":
            count = f"{lvalue}n_{name}"
            out += [f"{indent}{count} = get_count({_wire_min('str')});",
                    f"{indent}{dst} = alloc({count}, sizeof *{dst}); /* NULL-terminated */",
                    f"{indent}for ({i} = 0; {i} < {count}; {i}++)",
                    f"{indent}    {dst}[{i}] = (char *)get_str();"]
        elif kind == "ports":
            count = f"{lvalue}n_{name}"
            out += [f"{indent}{count} = get_u64();",
                    f"{indent}if ({count} > CAPTURE_PORTS_MAX)",
                    f'{indent}    malformed("capture ports");',
                    f"{indent}for ({i} = 0; {i} < {count}; {i}++) {{",
                    f"{indent}    uint64_t port = get_u64();",
                    f"{indent}    if (port == 0 || port > 65535)",
                    f'{indent}        malformed("capture port");',
                    f"{indent}    {dst}[{i}] = (uint16_t)port;",
                    f"{indent}}}"]
        elif kind[0] == "list":
            count = f"{lvalue}n_{name}"
            out += [f"{indent}{count} = get_count({_wire_min(kind)});",
                    f"{indent}{dst} = alloc({count}, sizeof *{dst});",
                    f"{indent}for ({i} = 0; {i} < {count}; {i}++) {{"]
            out += _c_fields(kind[1], f"{dst}[{i}].", depth + 1, indent + "    ")
            out.append(f"{indent}}}")
        else:  # ("if", flags field, flag, fields): the fields' members are P's own
            _, flags, flag, sub = kind
            out.append(f"{indent}if ({lvalue}{flags} & F_{flag}) {{")
            out += _c_fields(sub, lvalue, depth, indent + "    ")
            out.append(f"{indent}}}")
    return out


def _c_dump(fields: tuple, lvalue: str, label: str, depth: int, indent: str) -> list[str]:
    """C statements printing what the parser read into ``lvalue``, one field a line:
    ``<label><name> <value>``, strings and bytes in hex, a list's count before its items
    (``hcp-exec --dump-plan``: what a test compares with the values wire.py wrote)."""
    out = []
    for name, kind in fields:
        dst = f"{lvalue}{C_MEMBERS.get(name, name) if lvalue == 'P.' else name}"
        i = "ijk"[depth]
        text = _c_string(f"{label}{name}".encode())
        if kind in ("u64", "u32", "u16"):
            out.append(f'{indent}printf("%s %llu\\n", {text}, (unsigned long long){dst});')
        elif kind in ("i64", "int"):
            out.append(f'{indent}printf("%s %lld\\n", {text}, (long long){dst});')
        elif kind == "magic":
            out.append(f'{indent}printf("%s %llu\\n", {text}, '
                       f'(unsigned long long)PLAN_VERSION << 32 | PLAN_MAGIC);')
        elif kind == "str":
            out.append(f"{indent}dump_hex({text}, {dst}, strlen({dst}));")
        elif kind == "bytes":
            out.append(f"{indent}dump_hex({text}, {dst}, {dst}_len);")
        elif kind == "view":
            out += [f'{indent}printf("%s %zu\\n", {text}, {dst}_len);',
                    f"{indent}dump_view_fields();"]
        elif kind in ("strs", "ports"):
            count = f"{lvalue}n_{name}"
            item = (f"dump_hex({text}, {dst}[{i}], strlen({dst}[{i}]))" if kind == "strs" else
                    f'printf("%s %u\\n", {text}, (unsigned){dst}[{i}])')
            out += [f'{indent}printf("%s %zu\\n", {text}, {count});',
                    f"{indent}for ({i} = 0; {i} < {count}; {i}++)", f"{indent}    {item};"]
        elif kind[0] == "list":
            count = f"{lvalue}n_{name}"
            out += [f'{indent}printf("%s %zu\\n", {text}, {count});',
                    f"{indent}for ({i} = 0; {i} < {count}; {i}++) {{"]
            out += _c_dump(kind[1], f"{dst}[{i}].", f"{label}{name}.", depth + 1, indent + "    ")
            out.append(f"{indent}}}")
        else:
            _, flags, flag, sub = kind
            out.append(f"{indent}if ({lvalue}{flags} & F_{flag}) {{")
            out += _c_dump(sub, lvalue, f"{label}{name}.", depth, indent + "    ")
            out.append(f"{indent}}}")
    return out


def _c_parsers() -> list[str]:
    """parse_view_fields and parse_plan_fields (and their dump_*_fields), for hcp_exec.c to
    include a second time (with HCP_EXEC_PLAN_PARSERS defined) once its plan ``P`` and
    get_u64/get_count/get_bytes/get_str/alloc/malformed/parse_section/dump_hex are declared."""
    out = ["#if defined(HCP_EXEC_PLAN_PARSERS) && !defined(HCP_EXEC_PLAN_PARSERS_H)",
           "#define HCP_EXEC_PLAN_PARSERS_H", "static void parse_view(void);"]
    for name, layout in (("view", VIEW_LAYOUT), ("plan", PLAN_LAYOUT)):
        out += ["", f"/* protocol.{name.upper()}_LAYOUT */",
                f"static void parse_{name}_fields(void) {{", "    size_t i, j;"]
        out += _c_fields(layout, "P.", 0, "    ")
        out += ["    (void)i;", "    (void)j;", "}"]
    for name, layout in (("view", VIEW_LAYOUT), ("plan", PLAN_LAYOUT)):
        out += ["", f"static void dump_{name}_fields(void) {{", "    size_t i, j;"]
        out += _c_dump(layout, "P.", f"{name} ", 0, "    ")
        out += ["    (void)i;", "    (void)j;", "}"]
    out += ["", "#endif"]
    return out
