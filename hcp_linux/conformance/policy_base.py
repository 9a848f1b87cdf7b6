"""`conformance --policy FILE`: a user's policy file made the base of every check's runs.

A policy file names its user's project: the jail, and write roots, read-only roots and
carve-outs under it (an imported srt or Codex policy names them by absolute path). The checks
run in jails of their own, fresh directories of the harness's scratch space, so those paths
cannot apply as written. What happens to each key, decided once here and listed in the report
(docs/conformance.md, "Under a policy file"):

- ``jail``: replaced by each check's own jail. ``read_only_jail`` and every key that names
  no path (network, hosts, env, limits, seccomp profiles...) are kept as written.
- ``allow_bins``: dropped: each check names the bins it runs (the allow-list itself is what
  the 10.2.1 checks judge).
- Roots (``write_roots``, ``read_only_roots``), socket grants and absolute
  ``allow_write_protected`` paths: kept when they exist outside the project; dropped when
  they lie in the project (the check's jail has no such file) or when they hold the
  harness's scratch space (every "outside the jail" of the checks would be granted, and the
  checks would judge the policy's grant instead of the engine).
- Carve-outs (``read_only_paths``, ``hidden_paths``): a glob pattern in the project is
  rebased onto each check's jail (made relative: it matches there what the check creates); a
  path or pattern outside it is kept when it lies in a kept root (or, hidden, a system root);
  every other one is dropped. A check's native-local runs go without them (native-local
  has no mount view to enforce them, and refuses a policy that has some), as a check that
  sets its own network goes without the hosts.
- ``proxy_log``: dropped (the checks' runs would append to the user's log).
- ``sandbox = false`` with ``nativeLocal = true``: refused: native-local confines nothing,
  there is no sandbox to check (10.3-native-local checks that mode on every run).

The project is the file's ``jail`` when it names one, else the current directory (where
`run --policy FILE` would take its jail, and where `policy import` wrote it for).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..errors import PolicyError, printable
from ..policy import globs, values
from ..policy.policy import DEFAULT_SYSTEM_ROOTS, field_table

#: Keys whose entries are roots of the view (kept when they exist outside the project).
ROOTS = ("write_roots", "read_only_roots")
#: Carve-outs: rebased (patterns in the project) or kept inside a kept root.
CARVE_OUTS = ("read_only_paths", "hidden_paths")
#: Other path lists: kept when they exist outside the project.
PATH_LISTS = ("allow_unix_sockets", "allow_dangerous_sockets")
#: Dropped whatever they say, with why.
DROPPED = {"allow_bins": "each check names the bins it runs (10.2.1 judges the allow-list)",
           "proxy_log": "the checks' runs would append to the user's log"}


@dataclass(frozen=True)
class PolicyBase:
    """A policy file as the base of a conformance run: ``table`` is what every check's runs
    start from (over a preset, if any); ``changes`` says, one line per key or entry, what was
    replaced, rebased or dropped and why."""

    path: str
    project: str
    table: Mapping[str, Any]
    changes: tuple[str, ...] = field(default_factory=tuple)

    def as_dict(self) -> dict[str, Any]:
        return {"file": self.path, "project": self.project, "table": dict(self.table),
                "changes": list(self.changes)}


def _within(path: str, root: str) -> bool:
    return values.is_within(path, root)


def load(path: str, scratch: str, cwd: str | None = None, *, source_kind: str | None = None,
         hosts: tuple[str, ...] = ()) -> PolicyBase:
    """Read the policy file at ``path`` and fit it to the harness, whose scratch directories
    are made under ``scratch``. PolicyError (one line naming the file) for a file `run
    --policy` would refuse to read, or for a native-local policy. ``source_kind``: "srt" or
    "codex" when the file is that tool's settings, imported first as `hcp-linux policy
    import --from KIND FILE` would (``hosts``: codex's, as its ``--allow-host``), so that
    a user checks an existing configuration in one command; the import's notes lead the
    report's changes."""
    text = values.file_name(path, "conformance: --policy")
    imported: list[str] = []
    if source_kind is None:
        source = f"policy file {printable(text)}"
        data = values.parse_document(values.read_document(text, source), source, "toml")
    else:
        from ..policy import imports
        source = f"{source_kind} settings {printable(text)}"
        doc = values.parse_document(values.read_document(text, source), source,
                                    "json" if source_kind == "srt" else "toml")
        here = os.getcwd() if cwd is None else cwd
        if source_kind == "srt":
            data, notes = imports.from_srt(doc, here)
        else:
            data, notes = imports.from_codex(doc, here, hosts)
        imported = [f"import: {printable(n)}" for n in notes]
    kwargs = field_table(data, source)
    if kwargs.get("sandbox") is False or kwargs.get("native_local") is True:
        raise PolicyError(f"conformance: {source}: sets native-local mode (sandbox = false, "
                          f"nativeLocal = true): it confines nothing, there is no sandbox to "
                          f"check")
    jail = kwargs.pop("jail", None)
    if jail is not None and not isinstance(jail, str):
        raise PolicyError(f"conformance: {source}: jail: expected a path, got "
                          f"{values.show(jail)}")
    if cwd is None:
        cwd = os.getcwd()
    project = os.path.realpath(os.path.join(cwd, os.path.expanduser(jail or ".")))
    changes = imported + [f"jail: {printable(jail or project)} replaced by each check's own "
                          f"jail"]
    scratch = os.path.realpath(scratch)
    table: dict[str, Any] = {}

    def drop(key: str, item: Any, why: str) -> None:
        changes.append(f"{key}: {printable(str(item))} dropped: {why}")

    def absolute(item: Any, key: str) -> str:
        if not isinstance(item, str) or not item:
            raise PolicyError(f"conformance: {source}: {key}: expected a list of paths, got "
                              f"{values.show(item)}")
        return os.path.normpath(os.path.join(project, os.path.expanduser(item)))

    for key, value in kwargs.items():
        if key in DROPPED:
            if value not in (None, (), []):
                drop(key, value, DROPPED[key])
            continue
        if key not in ROOTS + PATH_LISTS + CARVE_OUTS + ("allow_write_protected",):
            table[key] = value
            continue
        if not isinstance(value, (list, tuple)):
            raise PolicyError(f"conformance: {source}: {key}: expected a list, got "
                              f"{values.show(value)}")
        if key in CARVE_OUTS:
            continue  # below, once the roots are known
        kept: list[str] = []
        for item in value:
            if key == "allow_write_protected" and isinstance(item, str) \
                    and not item.startswith("/"):
                kept.append(item)  # a protected name: it applies in every writable root
                continue
            p = absolute(item, key)
            real = os.path.realpath(p)
            if _within(real, project):
                drop(key, item, "it is in the project, which the checks' jails replace")
            elif not os.path.lexists(p):
                drop(key, item, "it does not exist")
            elif key in ROOTS and (_within(scratch, real) or _within(real, scratch)):
                drop(key, item, f"it holds the harness's scratch space {scratch}: every "
                                f"'outside the jail' of the checks would be granted")
            else:
                kept.append(item)
        table[key] = kept
    roots = [os.path.realpath(absolute(r, "roots")) for k in ROOTS for r in table.get(k, ())]
    system = [os.path.realpath(r) for r in kwargs.get("system_roots", DEFAULT_SYSTEM_ROOTS)
              if isinstance(r, str)]
    for key in CARVE_OUTS:
        if key not in kwargs:
            continue
        kept = []
        inside = roots + (system if key == "hidden_paths" else [])
        for item in kwargs[key]:
            p = absolute(item, key)
            prefix = globs.split(p)[0] if globs.is_glob(p) else p
            real = os.path.realpath(prefix)
            if _within(real, project):
                if globs.is_glob(p):
                    rel = os.path.relpath(p, project)
                    kept.append(rel)
                    changes.append(f"{key}: {printable(item)} rebased onto each check's jail "
                                   f"as {printable(rel)}")
                else:
                    drop(key, item, "it is in the project, which the checks' jails replace")
            elif not any(_within(real, r) and (real != r or globs.is_glob(p)) for r in inside):
                drop(key, item, "it is in no root the checks' runs grant")
            elif not globs.is_glob(p) and not os.path.lexists(p):
                drop(key, item, "it does not exist")
            else:
                kept.append(item)
        table[key] = kept
    if any(table.get(k) for k in CARVE_OUTS):
        changes.append("read_only_paths, hidden_paths: not applied to the checks' native-local "
                       "runs (native-local has no mount view, and refuses carve-outs)")
    return PolicyBase(text, project, table, tuple(changes))


__all__ = ["PolicyBase", "load"]
