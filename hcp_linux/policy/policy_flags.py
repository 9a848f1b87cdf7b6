"""How each field of a Policy is said on the command line of `hcp-linux run`: one entry a field.

Everything that maps Policy fields to flags is derived from `FIELDS`: the options of `run`
(hcp_linux.cli.cli_args), the policy its flags make over a ``--policy`` file's (`merge`), the
flags that make a given policy again (`flags_of`, behind `hcp_linux.confine`), and the table
of TOML keys in docs/policy.md (`doc_table`; a test holds the page to it). A field added to
Policy without an entry here is refused by confine, never dropped, and fails that test.

Imports no argparse: `hcp_linux.confine` is library API, and a library user pays for no
parser. Values are parsed where they always are: by Policy and Limits (hcp_linux.policy.values).
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from . import ladder
from .environment import is_injection_key
from ..errors import PolicyError, SandboxError
from .limits import Limits
from .protected import DEFAULT_DEPTH as DEFAULT_PROTECT_DEPTH, DEFAULT_PROTECT_MISSING
from .values import is_duration_text
from .policy import DEFAULT_SECCOMP_PROFILES, DEFAULT_SYSTEM_ROOTS, NETWORK_MODES, Policy

#: What `--env` accepts as a name: the portable shell name, as a pack's wrap.agent_env
#: (anything else cannot be read by a shell and is most likely a mistake: "A B=1").
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

#: How a flag takes its values: once (a second one is refused), repeatable, or a switch.
ONCE, APPEND, SWITCH = "once", "append", "switch"


class _Keep:
    """What `Field.merge` returns to leave a field as the policy file (or the default) has
    it: None is a value of some fields."""

    def __repr__(self) -> str:
        return "KEEP"


KEEP: Any = _Keep()


@dataclass(frozen=True)
class Field:
    """One Policy field on the command line.

    ``merge(a, old)``: the field's value from the parsed options ``a`` over ``old``, the
    policy file's value (None without a file), or KEEP. ``flags(value)``: the flags that
    say ``value`` to `run` (none for the default); PolicyError when they cannot.
    ``toml_type``, ``default`` and ``meaning`` are the field's row in docs/policy.md.
    """

    name: str
    flag: str
    takes: str
    merge: Callable[[Any, Any], Any]
    flags: Callable[[Any], list[str]]
    toml_type: str
    default: str
    meaning: str
    metavar: str | None = None
    help: str | None = None
    type: Callable[[str], Any] | None = None
    choices: tuple[str, ...] | None = None
    key: str | None = None  # the table's key cell, when it is not `name`

    @property
    def dest(self) -> str:
        """The attribute argparse gives the flag's value."""
        return self.flag.lstrip("-").replace("-", "_")


# --- argv to a field ---------------------------------------------------------------------

def _replace(dest: str) -> Callable[[Any, Any], Any]:
    """A flag given once: its value replaces the file's."""
    return lambda a, old: KEEP if getattr(a, dest) is None else getattr(a, dest)


def _switch_on(dest: str) -> Callable[[Any, Any], Any]:
    return lambda a, old: True if getattr(a, dest) else KEEP


def _add(dest: str) -> Callable[[Any, Any], Any]:
    """A list: the flags' items after the file's."""
    return lambda a, old: tuple(old or ()) + tuple(getattr(a, dest))


def _replace_set(dest: str) -> Callable[[Any, Any], Any]:
    """A set with a default: given, the flags' items replace it (and a file's)."""
    return lambda a, old: tuple(getattr(a, dest)) if getattr(a, dest) else KEEP


def duration_text(text: str) -> float | str:
    """``--timeout``'s value, its syntax checked (a usage error, exit 2, when it is none of
    Policy's spellings); Policy checks the range (exit 125). A number is a float; ``30s``,
    ``1.5m``, ``500ms`` stay text for Policy to read (hcp_linux.policy.values.duration)."""
    try:
        return float(text)
    except ValueError:
        pass
    if is_duration_text(text):
        return text
    raise ValueError(f"invalid duration {text!r}: give seconds, or a number with a unit, "
                     f"like 30s, 1.5m, 1h, 500ms")


def env_pairs(items: Sequence[Any]) -> dict[str, str]:
    """``--env KEY=VALUE`` items as a mapping; PolicyError for a malformed one. Checked
    before a policy file is read (check_args)."""
    env: dict[str, str] = {}
    for item in items:
        if not isinstance(item, str):  # argparse makes the value `--` of an append flag []
            raise PolicyError("--env: expected KEY=VALUE, got '--'")
        key, sep, value = item.partition("=")
        if not sep:
            raise PolicyError(f"--env {item!r}: expected KEY=VALUE")
        if not ENV_NAME.match(key) and not is_injection_key(key):  # that one has its message
            raise PolicyError(f"--env: invalid variable name {key!r} (letters, digits and "
                              f"_, not starting with a digit)")  # not the value: a secret?
        env[key] = value
    return env


def _merge_env(a: Any, old: Any) -> dict[str, str]:
    return {**dict(old or {}), **env_pairs(a.env)}


def _merge_limits(a: Any, old: Any) -> dict[str, Any]:
    # ``old``: a policy file's Limits, or a composed layers' table (hcp_linux.policy.layers)
    limits = dict(old.as_dict()) if isinstance(old, Limits) else dict(old or {})
    for item in a.limit:
        if not isinstance(item, str):  # argparse makes the value `--` of an append flag []
            raise PolicyError("--limit: expected KEY=VALUE, got '--'")
        key, sep, value = item.partition("=")
        if not sep:
            raise SandboxError(f"--limit {item!r}: expected KEY=VALUE")
        limits[key] = value  # Limits parses the text itself (hcp_linux.policy.values)
    return limits


def _mode(a: Any) -> bool:
    """Either of the mode switches given: both fields are set (native-local mode is both)."""
    return bool(a.no_sandbox or a.native_local)


# --- a field to argv ---------------------------------------------------------------------

def _repeated(flag: str) -> Callable[[Sequence[str]], list[str]]:
    return lambda items: [f"{flag}={item}" for item in items]


def _replacing(flag: str, default: tuple[str, ...], name: str
               ) -> Callable[[Sequence[str]], list[str]]:
    """A set with a default, which the flag replaces when given: so an empty set cannot be
    said on the command line."""
    def flags(items: Sequence[str]) -> list[str]:
        if tuple(items) == default:
            return []
        if not items:
            raise PolicyError(f"confine: {name} is empty, which the CLI cannot express "
                              f"({flag} replaces the default set with the ones given)")
        return [f"{flag}={item}" for item in items]
    return flags


def _limit_text(value: Any) -> str:
    """A limit as ``--limit`` reads it back (values.py): exact digits, never an exponent."""
    if value is None:
        return "unlimited"
    text = repr(value)
    if "e" in text or "inf" in text or "nan" in text:
        raise PolicyError(f"confine: limit {text} has no exact decimal form")
    return text


def _limits(limits: Limits) -> list[str]:
    default = Limits().as_dict()
    return [f"--limit={key}={_limit_text(value)}" for key, value in limits.as_dict().items()
            if value != default[key]]


# --- the fields, in the order of `run --help` -----------------------------------------------

_ROOTS = "list of absolute paths"
_CARVE = "list of paths or glob patterns"

FIELDS: tuple[Field, ...] = (
    Field("jail", "--jail", ONCE, _replace("jail"), lambda jail: [f"--jail={jail}"],
          "absolute path", "current directory", "working directory and first writable root",
          help="working directory and first writable root (default: cwd)"),
    Field("read_only_jail", "--read-only-jail", SWITCH, _switch_on("read_only_jail"),
          lambda on: ["--read-only-jail"] if on else [],
          "boolean", "`false`", "the jail is the working directory only, granted read-only "
          "(a write root inside it is a carve-in; the jail inside a write root is refused)",
          help="the jail is the working directory only, read-only (writes go to "
               "the private /tmp and the write roots)"),
    Field("pty", "--tty", SWITCH, _switch_on("tty"), lambda on: ["--tty"] if on else [],
          "boolean", "`false`", "a private devpts instance at /dev/pts: the command can open "
          "pseudo-terminals (`script`, `ssh -t`, Python's `pty`); needs the mount view",
          help="give the sandbox its own /dev/pts so it can open pseudo-terminals"),
    Field("write_roots", "--write-root", APPEND, _add("write_root"),
          _repeated("--write-root"), _ROOTS, "`[]`", "extra writable roots", metavar="DIR",
          help="a directory the command may also write, besides the jail (repeatable)"),
    Field("read_only_roots", "--read-only-root", APPEND, _add("read_only_root"),
          _repeated("--read-only-root"), _ROOTS, "`[]`", "extra read-only roots",
          metavar="DIR", help="a directory the command may read, not write (repeatable)"),
    Field("read_only_paths", "--read-only-path", APPEND, _add("read_only_path"),
          _repeated("--read-only-path"), _CARVE, "`[]`",
          "carve-outs: existing files or directories inside a granted root, or glob "
          "patterns (relative ones from the jail), bound read-only over themselves in the "
          "view (see Carve-outs)", metavar="PATH",
          help="an existing file or directory inside a granted root, or a glob (**/*.lock; "
               "relative: from the jail), shown read-only (repeatable)"),
    Field("hidden_paths", "--hide-path", APPEND, _add("hide_path"),
          _repeated("--hide-path"), _CARVE, "`[]`",
          "carve-outs: existing files or directories inside a granted root or a system "
          "root, or glob patterns (relative ones from the jail), covered by an empty "
          "mode-000 mask in the view (see Carve-outs)", metavar="PATH",
          help="an existing file or directory inside a granted or system root, or a glob "
               "(**/.env; relative: from the jail), hidden (masked by an empty, unreadable "
               "node) (repeatable)"),
    Field("allow_write_protected", "--allow-write-protected", APPEND,
          _add("allow_write_protected"), _repeated("--allow-write-protected"),
          "list of names or absolute paths", "`[]`",
          "protected names (`.git/hooks`, `.envrc`... in every writable root) or paths the "
          "command may write after all (see Protected names)", metavar="NAME|PATH",
          help="let the command write a protected name (.git/hooks, .envrc...; in every "
               "writable root) or path (repeatable)"),
    Field("protect_missing", "--protect-missing", ONCE, _replace("protect_missing"),
          lambda how: [] if how == DEFAULT_PROTECT_MISSING else [f"--protect-missing={how}"],
          r'`"quiet"` \| `"git"` \| `"sweep"` \| `"placeholders"`',
          f'`"{DEFAULT_PROTECT_MISSING}"`',
          "how a missing protected name is kept missing: an empty placeholder made once and "
          "bound read-only where none shows (inside existing git directories, and `.vscode`, "
          "`.idea`, `.claude`, `.cursor` as empty directories in a root holding `.git`) and "
          "the rest removed after "
          "the run (`quiet`), placeholders inside git directories only (`git`), removed "
          "after the run everywhere (`sweep`), or placeholders everywhere (`placeholders`) "
          "(see Protected names)",
          help="missing protected names: placeholders inside git directories and for "
               ".vscode .idea .claude .cursor, the rest removed after the run (quiet, "
               "default); placeholders inside git directories only (git); all removed "
               "after the run (sweep); empty read-only placeholders everywhere, so none "
               "can be created (placeholders)",
          choices=("quiet", "git", "sweep", "placeholders")),
    Field("protect_depth", "--protect-depth", ONCE, _replace("protect_depth"),
          lambda depth: [] if depth == DEFAULT_PROTECT_DEPTH else [f"--protect-depth={depth}"],
          "integer, 0 to 16", f"`{DEFAULT_PROTECT_DEPTH}`",
          "how many directory levels below each writable root's top are searched for "
          "protected names that exist (nested repositories, a subproject's `.envrc`; see "
          "Protected names); 0: the top level only",
          metavar="N", type=int,
          help="search this many directory levels below each writable root for protected "
               f"names that exist (default {DEFAULT_PROTECT_DEPTH}; 0: the top level only)"),
    Field("allow_unix_sockets", "--allow-unix-socket", APPEND, _add("allow_unix_socket"),
          _repeated("--allow-unix-socket"), _ROOTS, "`[]`",
          "existing unix sockets made connectable in the view, each alone (its inode bound "
          "at its path); well-known dangerous ones need `allow_dangerous_sockets` "
          "(see Unix sockets)", metavar="PATH",
          help="an existing unix socket to make connectable inside (repeatable)"),
    Field("allow_dangerous_sockets", "--allow-dangerous-socket", APPEND,
          _add("allow_dangerous_socket"), _repeated("--allow-dangerous-socket"), _ROOTS, "`[]`",
          "sockets granted although they give power outside the sandbox (docker.sock, the "
          "system D-Bus...): the second yes; named in the receipt", metavar="PATH",
          help="grant a socket known to give power outside the sandbox (docker.sock, "
               "containerd, podman, D-Bus); you accept that power (repeatable)"),
    Field("system_roots", "--system-root", APPEND, _replace_set("system_root"),
          _replacing("--system-root", DEFAULT_SYSTEM_ROOTS, "system_roots"),
          _ROOTS, f"`{' '.join(DEFAULT_SYSTEM_ROOTS)}`",
          "read-only system roots (missing ones are absent)", metavar="DIR",
          help="a read-only system root; given, these replace the default set "
               f"({' '.join(DEFAULT_SYSTEM_ROOTS)}) (repeatable)"),
    Field("network", "--network", ONCE, _replace("network"),
          lambda mode: [] if mode == "none" else [f"--network={mode}"],
          r" \| ".join(f'`"{m}"`' for m in NETWORK_MODES), '`"none"`',
          "a network namespace with `lo` only; the host's; or `lo` plus an egress proxy "
          "([network.md](network.md))",
          help=f"one of {', '.join(NETWORK_MODES)} (default none)"),
    Field("allow_hosts", "--allow-host", APPEND, _add("allow_host"),
          _repeated("--allow-host"), "list of host patterns", "`[]`",
          'egress allowed with `network = "allow"`', metavar="HOST[:PORT]",
          help="with --network allow: egress allowed to HOST (repeatable; *.example.com, "
               "IP literals, CIDRs)"),
    Field("deny_hosts", "--deny-host", APPEND, _add("deny_host"),
          _repeated("--deny-host"), "list of host patterns", "`[]`",
          'egress refused with `network = "allow"`, even when an allow entry matches',
          metavar="HOST[:PORT]",
          help="with --network allow: refused even when an allow entry matches"),
    Field("proxy_log", "--proxy-log", ONCE, _replace("proxy_log"),
          lambda path: [] if path is None else [f"--proxy-log={path}"],
          "absolute path", "none", "JSON-lines log of egress decisions", metavar="FILE",
          help="append each egress decision as JSON"),
    Field("allow_bins", "--allow-bin", APPEND, _add("allow_bin"), _repeated("--allow-bin"),
          "list of names or absolute paths", "the command itself", "HCP allow-list",
          metavar="BIN",
          help="a binary the command may be (default: the command itself); a bare name "
               "matches a bare command, a path that path (repeatable)"),
    Field("env", "--env", APPEND, _merge_env,
          lambda env: [f"--env={k}={v}" for k, v in env.items()],
          "table", "`{}`", "variables set in the child", metavar="KEY=VALUE",
          help="set KEY in the command's environment, which is otherwise scrubbed "
               "(repeatable)"),
    Field("timeout", "--timeout", ONCE, _replace("timeout"),
          lambda t: [] if t is None else [f"--timeout={t!r}"],
          "seconds (`30`, `30s`, `1.5m`)", "none", "kill the sandbox after this long",
          metavar="DURATION", type=duration_text,
          help="kill the whole sandbox after this long (30, 30s, 1.5m, 1h; exit 124)"),
    Field("allow_degraded", "--allow-degraded", APPEND, _add("allow_degraded"),
          lambda layers: [f"--allow-degraded={x}" for x in sorted(layers)],
          "list of layers", "`[]`", "layers the run may go without", metavar="LAYER",
          help="run even if this host cannot enforce LAYER (userns, mountns, netns, ipcns, "
               "pidns, landlock, seccomp, namespaces); the receipt says so (repeatable)"),
    Field("rung", "--rung", ONCE, _replace("rung"),
          lambda rung: [] if rung == ladder.DEFAULT else [f"--rung={rung}"],
          r" \| ".join(f'`"{r}"`' for r in ladder.NAMES), f'`"{ladder.DEFAULT}"`',
          "the weakest rung of the fallback ladder the run may fall to; its layers join "
          "`allow_degraded` ([deploying.md](deploying.md))",
          help=f"weakest fallback rung allowed: {', '.join(ladder.NAMES)} (default "
               f"{ladder.DEFAULT}: strict)", choices=ladder.NAMES),
    Field("seccomp_profiles", "--seccomp-profile", APPEND, _replace_set("seccomp_profile"),
          _replacing("--seccomp-profile", DEFAULT_SECCOMP_PROFILES, "seccomp_profiles"),
          "list", "`[" + ", ".join(f'"{p}"' for p in DEFAULT_SECCOMP_PROFILES) + "]`",
          "seccomp profiles from `seccomp_profiles/profiles/` (`network-observe` is the "
          "runtime's: added under `network = \"allow\"`, dropped elsewhere)", metavar="NAME",
          help="a seccomp profile to apply; given, these replace the default set "
               f"({' '.join(DEFAULT_SECCOMP_PROFILES)}) (repeatable)"),
    Field("sandbox", "--no-sandbox", SWITCH,
          lambda a, old: (not a.no_sandbox) if _mode(a) else KEEP,
          lambda on: [] if on else ["--no-sandbox"],
          "boolean", "`true`", "`false` with `native_local = true`: native-local mode",
          help="with --native-local: run on the host unconfined (allow-list, environment, "
               "limits and receipt only; docs/policy.md)"),
    Field("native_local", "--native-local", SWITCH,
          lambda a, old: a.native_local if _mode(a) else KEEP,
          lambda on: ["--native-local"] if on else [],
          "boolean", "`false`", "`true` with `sandbox = false`: native-local mode",
          key="`native_local` (`nativeLocal`)",
          help="with --no-sandbox: native-local mode, the command runs unconfined"),
    Field("limits", "--limit", APPEND, _merge_limits, _limits,
          "table", "below", "resource limits", metavar="KEY=VALUE",
          help="resource limit, e.g. nproc=256 fsize=1g as=4g tmp_size=512m "
               "(repeatable; 'unlimited' lifts one)", key="`[limits]`"),
    Field("on_exit", "--on-exit", ONCE, _replace("on_exit"),
          lambda how: [] if how == "kill" else [f"--on-exit={how}"],
          r'`"kill"` \| `"wait"`', '`"kill"`',
          "what happens to processes the command leaves behind",
          help="when the command exits: kill what it left running (default) or wait",
          choices=("kill", "wait")),
)

BY_NAME: Mapping[str, Field] = {f.name: f for f in FIELDS}


def check_args(a: Any) -> None:
    """What the flags' values alone can be refused for, before a policy file is read."""
    env_pairs(a.env)


def merge(a: Any, base: Mapping[str, Any]) -> dict[str, Any]:
    """Policy's keyword arguments from the parsed options ``a`` over ``base`` (a policy
    file's fields, or empty): lists add to the file's, scalars override it."""
    fields = dict(base)
    for f in FIELDS:
        value = f.merge(a, fields.get(f.name))
        if value is not KEEP:
            fields[f.name] = value
    return fields


def flags_of(policy: Policy) -> list[str]:
    """The flags of `run` that build ``policy`` again, field by field (``--flag=VALUE``, so
    that no value is taken for an option); PolicyError naming a field they cannot say."""
    out: list[str] = []
    for f in dataclasses.fields(Policy):
        field = BY_NAME.get(f.name)
        if field is None:
            raise PolicyError(f"confine: the CLI has no flag for the policy field {f.name}")
        out += field.flags(getattr(policy, f.name))
    return out


def doc_table() -> str:
    """The table of TOML keys in docs/policy.md, one row a field."""
    rows = ["| key | type | default | meaning | flag |", "|---|---|---|---|---|"]
    for f in FIELDS:
        rows.append(f"| {f.key or f'`{f.name}`'} | {f.toml_type} | {f.default} | {f.meaning} "
                    f"| `{f.flag}` |")
    return "\n".join(rows) + "\n"
