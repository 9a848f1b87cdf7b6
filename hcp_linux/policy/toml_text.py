"""A policy table written as TOML: what `hcp-linux policy show` and `policy import` print.

Only the shapes a policy has (strings, booleans, numbers, lists of strings, the ``env`` and
``[limits]`` tables); the standard library reads TOML but does not write it, and a dependency
for forty lines would be one more thing in every install. A test reads each output back with
tomllib and compares.
"""
from __future__ import annotations

import json
import math
import re
from typing import Any, Mapping, Sequence

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+\Z")


def _key(key: str) -> str:
    return key if _BARE_KEY.match(key) else _string(key)


def _string(text: str) -> str:
    # a JSON string is a TOML basic string, with one difference: JSON may leave DEL and the
    # C1 controls raw, which TOML refuses; escape every control character
    out = json.dumps(text, ensure_ascii=False)
    return re.sub(r"[\x7f-\x9f]", lambda m: f"\\u{ord(m.group()):04x}", out)


def value(v: Any) -> str:
    """One value in TOML; ValueError for a shape a policy never has."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError(f"no TOML for {v!r} here")
        return repr(v)
    if isinstance(v, str):
        return _string(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(value(x) for x in v) + "]"
    raise ValueError(f"no TOML for {type(v).__name__} here")


def dump(table: Mapping[str, Any], header: Sequence[str] = ()) -> str:
    """``table`` as a TOML document: the ``header`` lines as comments first, then the
    scalars and lists, then each sub-table (``[env]``, ``[limits]``)."""
    lines = [f"# {line}" if line else "#" for line in header]
    subtables = {k: v for k, v in table.items() if isinstance(v, Mapping)}
    for k, v in table.items():
        if k not in subtables:
            lines.append(f"{_key(k)} = {value(v)}")
    for name, sub in subtables.items():
        lines += ["", f"[{_key(name)}]"]
        lines += [f"{_key(k)} = {value(v)}" for k, v in sub.items()]
    return "\n".join(lines) + "\n"
