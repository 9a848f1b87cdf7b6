"""Policies people already wrote for other sandboxes, said in this policy's keys:
`hcp-linux policy import --from srt settings.json` and `--from codex config.toml`.

Each importer takes the parsed document and the directory the imported policy is for (the
jail: relative paths start there, as they do for srt) and returns the policy table and one
note per setting it could not carry over, or carried over with a difference worth knowing,
each saying why. Nothing is dropped in silence; nothing is widened: when a setting has no
faithful equivalent, the stricter reading is taken and the note says what to add.

Formats, as published: sandbox-runtime's ``SandboxRuntimeConfigSchema``
(src/sandbox/sandbox-config.ts: ``network.allowedDomains``/``deniedDomains``/
``allowUnixSockets``/``allowLocalBinding``..., ``filesystem.denyRead``/``allowRead``/
``allowWrite``/``denyWrite``/``allowGitConfig``, ``credentials``, ``ignoreViolations``...), and
Codex's config.toml (``sandbox_mode``, ``[sandbox_workspace_write]`` ``writable_roots``,
``network_access``, ``exclude_tmpdir_env_var``, ``exclude_slash_tmp``,
``[shell_environment_policy]``, ``profile``/``[profiles.NAME]``).
"""
from __future__ import annotations

import os
import stat
from typing import Any, Callable, Mapping

from ..errors import PolicyError
from . import globs
from .environment import is_injection_key
from .policy import DEFAULT_SYSTEM_ROOTS
from .unix_sockets import danger
from .values import is_within, show

Notes = list[str]


class _Import:
    """What one import builds: the table, the notes, and the roots granted so far (to tell
    a carve-out from a path that is out of the view anyway)."""

    def __init__(self, jail: str, fmt: str) -> None:
        self.jail = jail
        self.fmt = fmt
        self.table: dict[str, Any] = {}
        self.deny_all = False  # srt's deniedDomains "*"
        self.notes: Notes = []

    def note(self, setting: str, why: str) -> None:
        self.notes.append(f"{self.fmt}: {setting}: {why}")

    def add(self, key: str, item: Any) -> None:
        items = self.table.setdefault(key, [])
        if item not in items:
            items.append(item)

    def path(self, setting: str, text: Any) -> str | None:
        """``text`` as an absolute, normalised path or glob pattern (``~`` expanded,
        relative to the jail); None, noted, for a non-string."""
        if not isinstance(text, str) or not text:
            self.note(setting, f"{show(text)} is not a path; skipped")
            return None
        path = os.path.expanduser(text)
        return os.path.normpath(os.path.join(self.jail, path))

    @property
    def writable(self) -> list[str]:
        jail = [] if self.table.get("read_only_jail") else [self.jail]
        return jail + list(self.table.get("write_roots", ()))

    @property
    def granted(self) -> list[str]:
        return [self.jail] + list(self.table.get("write_roots", ())) \
            + list(self.table.get("read_only_roots", ()))


def _in(path: str, roots: list[str] | tuple[str, ...]) -> bool:
    return any(is_within(path, r) for r in roots)


def _kind(path: str) -> str:
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return "missing"
    return "dir" if stat.S_ISDIR(mode) else "socket" if stat.S_ISSOCK(mode) else \
        "file" if stat.S_ISREG(mode) else "other"


def _list(imp: _Import, where: Mapping[str, Any], key: str, setting: str) -> list[Any]:
    value = where.get(key, [])
    if not isinstance(value, list):
        imp.note(setting, f"expected a list, got {show(value)}; skipped")
        return []
    return value


def _table(doc: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(doc, Mapping):
        raise PolicyError(f"{what}: expected a table (an object), got {show(doc)}")
    return doc


# --- srt (sandbox-runtime) ----------------------------------------------------------------

def from_srt(doc: Any, jail: str) -> tuple[dict[str, Any], Notes]:
    """An srt settings object (``~/.srt-settings.json``) as a policy table, and the notes."""
    doc = _table(doc, "srt settings")
    imp = _Import(jail, "srt")
    fs = doc.get("filesystem", {})
    net = doc.get("network", {})
    if not isinstance(fs, Mapping) or not isinstance(net, Mapping):
        raise PolicyError("srt settings: filesystem and network must be objects")
    _srt_filesystem(imp, fs)
    _srt_credentials(imp, doc.get("credentials"))
    _srt_network(imp, net)
    for key, value in doc.items():
        if key in ("filesystem", "network", "credentials"):
            continue
        why = _SRT_TOP.get(key)
        if key == "allowPty":
            if value is True:
                imp.table["pty"] = True
            continue
        if key in _SRT_OFF_BY_DEFAULT and value is False:
            continue  # off: what hcp-linux does anyway
        imp.note(key, why or "not an srt setting this importer knows; skipped")
    return imp.table, imp.notes


#: Switches that only weaken srt when true.
_SRT_OFF_BY_DEFAULT = ("enableWeakerNestedSandbox", "enableWeakerNetworkIsolation",
                       "allowAppleEvents")
_SRT_TOP = {
    "ignoreViolations": "no equivalent: every denial is recorded in the receipt (--explain "
                        "prints them); none is hidden",
    "enableWeakerNestedSandbox": "no equivalent: a layer the host lacks refuses the run; "
                                 "allow its loss explicitly with --allow-degraded LAYER or "
                                 "--rung (docs/deploying.md)",
    "enableWeakerNetworkIsolation": "macOS only; nothing to import",
    "allowAppleEvents": "macOS only; nothing to import",
    "ripgrep": "srt's own tool for finding files; nothing to import",
    "mandatoryDenySearchDepth": "no equivalent: the protected names (.git/hooks, .bashrc, "
                                ".envrc...) are kept at the top of every writable root "
                                "(docs/policy.md, Protected names)",
    "seccomp": "srt's own seccomp helper; hcp-linux loads its profiles itself",
    "bwrapPath": "srt's own helper binary; nothing to import",
    "socatPath": "srt's own helper binary; nothing to import",
    "javaAgentJarPath": "srt's proxy agent for Java; hcp-linux's egress needs none",
    "windows": "Windows only; nothing to import",
    "git": "no equivalent: hcp-linux sets no git configuration in the command's environment",
}


def _srt_filesystem(imp: _Import, fs: Mapping[str, Any]) -> None:
    if fs.get("disabled") is True:
        imp.note("filesystem.disabled", "no equivalent: the file system is always confined "
                                        "(native-local mode, --no-sandbox --native-local, "
                                        "confines nothing at all); ignored")
    write = [p for p in (imp.path("filesystem.allowWrite", x)
                         for x in _list(imp, fs, "allowWrite", "filesystem.allowWrite")) if p]
    if imp.jail not in write:
        imp.table["read_only_jail"] = True
        imp.note("filesystem.allowWrite", f"does not name the current directory "
                                          f"({imp.jail}): the jail is read-only "
                                          f"(read_only_jail = true)")
    for w in write:
        if w == imp.jail or is_within(w, imp.jail) and imp.jail in write:
            continue
        if w == "/tmp" or is_within(w, "/tmp"):
            imp.note("filesystem.allowWrite", f"{w}: the command has a private, writable "
                                              f"/tmp of its own; the host's is not shared")
            continue
        kind = _kind(w)
        if kind == "dir":
            imp.add("write_roots", w)
        else:
            imp.note("filesystem.allowWrite", f"{w}: {kind}; a writable root is an existing "
                                              f"directory, skipped")
    hidden: list[str] = []
    for x in _list(imp, fs, "denyRead", "filesystem.denyRead"):
        p = imp.path("filesystem.denyRead", x)
        if p is not None:
            _hide(imp, "filesystem.denyRead", p, hidden)
    for x in _list(imp, fs, "allowRead", "filesystem.allowRead"):
        p = imp.path("filesystem.allowRead", x)
        if p is None:
            continue
        if _in(p, hidden):
            imp.note("filesystem.allowRead", f"{p}: inside a hidden path; a hidden path is "
                                             f"hidden whole, skipped")
        elif not _in(p, imp.granted) and not _in(p, DEFAULT_SYSTEM_ROOTS):
            if _kind(p) == "dir":
                imp.add("read_only_roots", p)
            else:
                imp.note("filesystem.allowRead", f"{p}: not an existing directory; a "
                                                 f"read-only root is one, skipped")
    for x in _list(imp, fs, "denyWrite", "filesystem.denyWrite"):
        p = imp.path("filesystem.denyWrite", x)
        if p is None:
            continue
        if not _in(globs.split(p)[0] if globs.is_glob(p) else p, imp.writable):
            continue  # outside every writable root: not writable here anyway
        if globs.is_glob(p):  # a carve-out pattern, expanded when the policy is made
            imp.add("read_only_paths", p)
        elif p in imp.writable:
            imp.note("filesystem.denyWrite", f"{p}: a writable root itself; skipped (drop it "
                                             f"from allowWrite)")
        elif _kind(p) in ("dir", "file"):
            if not _in(p, hidden):
                imp.add("read_only_paths", p)
        else:
            imp.note("filesystem.denyWrite", f"{p}: does not exist; a carve-out is an existing "
                                             f"file or directory (the protected names, "
                                             f".envrc, .git/hooks..., are kept anyway)")
    if fs.get("allowGitConfig") is True:
        imp.add("allow_write_protected", ".git/config")
    imp.note("filesystem", "srt lets a command read the whole file system but denyRead; "
                           "hcp-linux shows only the system roots, the jail and the roots "
                           "granted: add read_only_roots for anything else it must read")
    for key in fs:
        if key not in ("disabled", "allowWrite", "denyRead", "allowRead", "denyWrite",
                       "allowGitConfig"):
            imp.note(f"filesystem.{key}", "not an srt setting this importer knows; skipped")


def _hide(imp: _Import, setting: str, p: str, hidden: list[str]) -> None:
    """A path the command must not read: a carve-out when it is in the view, nothing when
    the view does not hold it."""
    if globs.is_glob(p):
        prefix = globs.split(p)[0]
        if _in(prefix, imp.granted) or _in(prefix, DEFAULT_SYSTEM_ROOTS):
            hidden.append(p)
            imp.add("hidden_paths", p)  # expanded when the policy is made
        else:
            imp.note(setting, f"{p}: outside the view already (hcp-linux shows the system "
                              f"roots, the jail and the roots granted); nothing to hide")
    elif _in(p, imp.granted):
        if p in imp.granted:
            imp.note(setting, f"{p}: a granted root itself; skipped (a hidden path lies "
                              f"inside one)")
        elif _kind(p) in ("dir", "file"):
            if not _in(p, hidden):
                hidden.append(p)
                imp.add("hidden_paths", p)
        else:
            imp.note(setting, f"{p}: does not exist; a hidden path must exist when the "
                              f"policy is made, skipped")
    elif _in(p, DEFAULT_SYSTEM_ROOTS):
        if p in DEFAULT_SYSTEM_ROOTS:
            imp.note(setting, f"{p}: a system root itself; hiding it would break every "
                              f"program, skipped (drop it from system_roots instead)")
        elif _kind(p) in ("dir", "file"):
            if not _in(p, hidden):
                hidden.append(p)
                imp.add("hidden_paths", p)  # masked in the system root's view
        else:
            imp.note(setting, f"{p}: does not exist; nothing to hide, skipped")


def _srt_credentials(imp: _Import, creds: Any) -> None:
    if creds is None:
        return
    if not isinstance(creds, Mapping):
        imp.note("credentials", f"expected an object, got {show(creds)}; skipped")
        return
    hidden = list(imp.table.get("hidden_paths", ()))
    for i, entry in enumerate(creds.get("files") or []):
        where = f"credentials.files[{i}]"
        if not isinstance(entry, Mapping):
            imp.note(where, "expected an object; skipped")
            continue
        p = imp.path(where, entry.get("path"))
        if p is None:
            continue
        if entry.get("mode") == "mask":
            imp.note(where, f"{p}: mask has no equivalent (no credential substitution); "
                            f"hidden instead")
        _hide(imp, where, p, hidden)
    for i, entry in enumerate(creds.get("envVars") or []):
        name = entry.get("name") if isinstance(entry, Mapping) else None
        if isinstance(entry, Mapping) and entry.get("mode") == "mask":
            imp.note(f"credentials.envVars[{i}]", f"{show(name)}: mask has no equivalent; "
                                                  f"the variable is not passed (the "
                                                  f"environment is never inherited)")
    for key in creds:
        if key not in ("files", "envVars"):
            imp.note(f"credentials.{key}", "no equivalent (no credential substitution)")


_SRT_NET = {
    "deniedDomainReasons": "no equivalent: a refusal's reason is the proxy's, in the receipt",
    "strictAllowlist": "always strict here: a host that no allow entry matches is refused, "
                       "nobody is asked",
    "allowLocalBinding": "binding is allowed inside the sandbox's own network namespace; "
                         "nothing outside can connect to it",
    "allowMachLookup": "macOS only; nothing to import",
    "httpProxyPort": "no equivalent: the egress proxy is hcp-linux's own",
    "socksProxyPort": "no equivalent: the egress proxy is hcp-linux's own",
    "mitmProxy": "no equivalent: no TLS interception",
    "tlsTerminate": "no equivalent: no TLS interception",
    "filterRequest": "no equivalent: egress is judged by host and port, not by request",
    "parentProxy": "no equivalent: the egress proxy connects directly",
    "allowAllUnixSockets": "no equivalent: unix sockets are granted one by one "
                           "(allow_unix_sockets)",
}


def _srt_network(imp: _Import, net: Mapping[str, Any]) -> None:
    from ..egress import parse_pattern
    allow = _hosts(imp, net, "allowedDomains", parse_pattern, deny=False)
    if allow:
        imp.table["network"] = "allow"
        imp.table["allow_hosts"] = allow
    else:
        imp.table["network"] = "none"
    deny = _hosts(imp, net, "deniedDomains", parse_pattern, deny=True)
    if imp.deny_all and allow:
        # srt: a deny entry wins over every allow entry, so "*" leaves no egress at all
        imp.note("network.deniedDomains", "'*' refuses every host, the allowed ones too: "
                                          "network = \"none\"")
        imp.table["network"] = "none"
        del imp.table["allow_hosts"]
    elif deny and allow:
        imp.table["deny_hosts"] = deny
    for i, text in enumerate(_list(imp, net, "allowUnixSockets", "network.allowUnixSockets")):
        p = imp.path(f"network.allowUnixSockets[{i}]", text)
        if p is None:
            continue
        if _kind(p) != "socket":
            imp.note("network.allowUnixSockets", f"{p}: not an existing unix socket; skipped")
        elif danger(p):
            imp.note("network.allowUnixSockets", f"{p}: {danger(p)}; not granted (grant it "
                                                 f"knowingly: allow_dangerous_sockets)")
        else:
            imp.add("allow_unix_sockets", p)
    for key, value in net.items():
        if key in ("allowedDomains", "deniedDomains", "allowUnixSockets"):
            continue
        if key in ("allowLocalBinding", "allowAllUnixSockets", "strictAllowlist") \
                and value is not True:
            continue  # false: what hcp-linux does anyway
        imp.note(f"network.{key}", _SRT_NET.get(key, "not an srt setting this importer "
                                                      "knows; skipped"))


def _hosts(imp: _Import, net: Mapping[str, Any], key: str,
           parse: Callable[..., Any], deny: bool) -> list[str]:
    out = []
    for text in _list(imp, net, key, f"network.{key}"):
        if deny and text == "*":
            imp.deny_all = True
            continue
        if deny and isinstance(text, str) and text.split(":", 1)[0] == "*":
            imp.note(f"network.{key}", f"{text}: a port refused on every host has no "
                                       f"equivalent (a deny entry names hosts); give the "
                                       f"allow entries their ports instead; skipped")
            continue
        try:
            parse(text, deny=deny)
        except PolicyError as e:
            imp.note(f"network.{key}", f"{e}; skipped")
            continue
        if text not in out:
            out.append(text)
    return out


# --- Codex --------------------------------------------------------------------------------

_CODEX_MODES = ("read-only", "workspace-write", "danger-full-access")


def from_codex(doc: Any, jail: str, hosts: tuple[str, ...] = ()) -> tuple[dict[str, Any], Notes]:
    """A Codex config.toml as a policy table, and the notes. ``hosts``: where a
    ``network_access = true`` may connect (Codex's switch opens the whole network; this
    import opens only what is named, with network = "allow")."""
    doc = _table(doc, "codex config")
    imp = _Import(jail, "codex")
    mode = doc.get("sandbox_mode")
    profile_name = doc.get("profile")
    if isinstance(profile_name, str):
        profile = (doc.get("profiles") or {}).get(profile_name)
        if isinstance(profile, Mapping) and "sandbox_mode" in profile:
            mode = profile["sandbox_mode"]
            imp.note("profile", f"{profile_name}: its sandbox_mode ({show(mode)}) is used")
    if mode is None:
        mode = "read-only"
        imp.note("sandbox_mode", "not set: Codex's default, read-only")
    if mode not in _CODEX_MODES:
        raise PolicyError(f"codex config: sandbox_mode: expected one of "
                          f"{', '.join(_CODEX_MODES)}, got {show(mode)}")
    ws = doc.get("sandbox_workspace_write", {})
    if not isinstance(ws, Mapping):
        raise PolicyError("codex config: [sandbox_workspace_write] must be a table")
    if mode == "danger-full-access":
        imp.note("sandbox_mode", "danger-full-access confines nothing; not imported (its "
                                 "equivalent is native-local mode, --no-sandbox "
                                 "--native-local, a choice made per run): the policy below "
                                 "is workspace-write")
        mode = "workspace-write"
    imp.table["read_only_jail"] = mode == "read-only"
    imp.table["network"] = "none"
    if mode == "read-only":
        if ws:
            imp.note("sandbox_workspace_write", "Codex ignores it in read-only mode; so does "
                                                "this import")
        imp.note("sandbox_mode", "read-only: Codex lets a command read the whole file "
                                 "system; hcp-linux shows the system roots and the jail: add "
                                 "read_only_roots for anything else it must read")
    else:
        _codex_workspace_write(imp, ws, hosts)
    if hosts and imp.table["network"] != "allow":
        raise PolicyError("--allow-host: only for a config with network_access = true")
    _codex_env(imp, doc.get("shell_environment_policy"))
    other = [k for k in doc if k not in ("sandbox_mode", "sandbox_workspace_write", "profile",
                                          "profiles", "shell_environment_policy")]
    if other:
        imp.note(", ".join(other), "not sandbox settings; nothing to import")
    if "profiles" in doc:
        imp.note("profiles", "only the selected profile's sandbox_mode is imported")
    return imp.table, imp.notes


def _codex_workspace_write(imp: _Import, ws: Mapping[str, Any], hosts: tuple[str, ...]) -> None:
    where = "sandbox_workspace_write"
    for text in _list(imp, ws, "writable_roots", f"{where}.writable_roots"):
        p = imp.path(f"{where}.writable_roots", text)
        if p is None or p == imp.jail:
            continue
        if _kind(p) == "dir":
            imp.add("write_roots", p)
        else:
            imp.note(f"{where}.writable_roots", f"{p}: not an existing directory; skipped")
    if ws.get("network_access") is True:
        if hosts:
            imp.table["network"] = "allow"
            imp.table["allow_hosts"] = list(hosts)
            imp.note(f"{where}.network_access", f"Codex opens the whole network; egress is "
                                                f"allowed to {', '.join(hosts)} only")
        else:
            imp.note(f"{where}.network_access", "Codex opens the whole network; not imported "
                                                "(network = \"none\"): name the hosts with "
                                                "--allow-host HOST (network allow), or set "
                                                "network = \"host\" knowingly")
    if ws.get("exclude_slash_tmp") is not True or ws.get("exclude_tmpdir_env_var") is not True:
        imp.note(where, "Codex lets a command write the host's /tmp and $TMPDIR unless "
                        "excluded; here it has a private /tmp of its own (TMPDIR points "
                        "there), the host's is not shared")
    for key in ws:
        if key not in ("writable_roots", "network_access", "exclude_slash_tmp",
                       "exclude_tmpdir_env_var"):
            imp.note(f"{where}.{key}", "not a Codex setting this importer knows; skipped")


def _codex_env(imp: _Import, policy: Any) -> None:
    if policy is None:
        return
    where = "shell_environment_policy"
    if not isinstance(policy, Mapping):
        imp.note(where, f"expected a table, got {show(policy)}; skipped")
        return
    for key, value in (policy.get("set") or {}).items():
        if not isinstance(key, str) or not isinstance(value, str) or is_injection_key(key):
            imp.note(f"{where}.set.{key}", "refused in a sandbox's environment (it injects "
                                           "code) or not text; skipped")
            continue
        imp.table.setdefault("env", {})[key] = value
    for key in policy:
        if key != "set":
            imp.note(f"{where}.{key}", "no equivalent: the environment is built from a short "
                                       "allowlist (PATH, HOME, LANG, TERM, TZ, TMPDIR) plus "
                                       "env, never inherited")

