"""What a repository's git config makes git read or run from elsewhere: the hooks directory
``core.hooksPath`` names, and the files ``include.path`` and ``includeIf.*.path`` pull in.

hcp_linux.policy.protected keeps ``.git/hooks`` and ``.git/config`` read-only; these are the
same thing under another name. husky sets ``core.hooksPath = .husky/_``, a directory of the
work tree; a shared config is often included from a tracked file (``include.path =
../.gitconfig``). Inside a writable root either lets a run plant what the host's next
``git commit`` or ``git status`` runs, so the protected names grow by what this finds.

A small reader of git's config syntax (git-config(1), "CONFIGURATION FILE"): sections
``[name]``, ``[name "sub"]`` and the old ``[name.sub]``; ``key = value`` with quotes,
backslash escapes, ``#``/``;`` comments and line continuation; a key alone means true.
Names are case-insensitive, subsections not. What it cannot read it skips. Includes are
followed (an included file's own includes and hooksPath count) down to :data:`MAX_DEPTH`,
each file read up to :data:`MAX_BYTES`. The bytes may have been written by a sandboxed
command before they were protected, so it is fuzzed (tests/test_git_config.py).
"""
from __future__ import annotations

import os
import stat

MAX_DEPTH = 10  # git's own limit on nested includes
MAX_BYTES = 1 << 20


def entries(data: bytes) -> list[tuple[str, str, str]]:
    """(section with its subsection as ``name.sub``, lowercase key, value) of each
    variable in ``data``, in order. Never raises on bytes."""
    # git reads CRLF as LF everywhere (config.c, get_next_char)
    text = data.decode("utf-8", "surrogateescape").replace("\r\n", "\n")
    out: list[tuple[str, str, str]] = []
    section = ""
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in " \t\r\n":
            i += 1
        elif c in "#;":
            i = _line_end(text, i)
        elif c == "[":
            section, i = _section(text, i)
        else:
            key, value, i = _variable(text, i)
            if key and section:
                out.append((section, key, value))
    return out


#: What git's isspace() calls a blank inside a value (an unquoted run of them: as many
#: spaces inside, none at the ends).
_BLANK = " \t\r\v\f"


def _line_end(text: str, i: int) -> int:
    end = text.find("\n", i)
    return len(text) if end < 0 else end + 1


def _section(text: str, i: int) -> tuple[str, int]:
    """``[name]``, ``[name "sub"]`` or ``[name.sub]`` at ``i``; ("", end of line) when
    malformed (the variables under it are skipped, as git would refuse the file)."""
    line_end = _line_end(text, i)
    j = i + 1
    while j < line_end and (text[j].isalnum() or text[j] in "-."):
        j += 1
    name = text[i + 1:j]
    if not name:
        return "", line_end
    if j < line_end and text[j] == "]":
        head, dot, sub = name.partition(".")
        return (head.lower() + "." + sub.lower()) if dot else head.lower(), j + 1
    if j >= line_end or text[j] != " " or "." in name:
        return "", line_end
    while j < line_end and text[j] == " ":
        j += 1
    if j >= line_end or text[j] != '"':
        return "", line_end
    j += 1
    chars: list[str] = []
    while j < line_end and text[j] != '"':
        if text[j] == "\\" and j + 1 < line_end:
            j += 1
        if text[j] == "\n":
            return "", line_end
        chars.append(text[j])
        j += 1
    if j + 1 >= line_end or text[j] != '"' or text[j + 1] != "]":
        return "", line_end
    return name.lower() + "." + "".join(chars), j + 2


def _variable(text: str, i: int) -> tuple[str, str, int]:
    """``key = value`` (or ``key`` alone: true) at ``i``: (lowercase key, value, next)."""
    j = i
    while j < len(text) and (text[j].isalnum() or text[j] == "-"):
        j += 1
    key = text[i:j].lower()
    while j < len(text) and text[j] in " \t":
        j += 1
    if j >= len(text) or text[j] in "\r\n#;":
        return key, "true", _line_end(text, j) if j < len(text) else j
    if text[j] != "=" or not key:
        return "", "", _line_end(text, j)
    j += 1
    value: list[str] = []
    begun = False  # any(value), kept as it goes: asked at each blank, it was quadratic
    quoted = False
    pending_space = ""
    while j < len(text):
        ch = text[j]
        if ch == "\n" and not quoted:
            j += 1
            break
        if ch == "\n":  # a newline inside quotes: git refuses the line
            return "", "", j + 1
        if not quoted and ch in "#;":
            j = _line_end(text, j)
            break
        if ch == "\\":
            nxt = text[j + 1] if j + 1 < len(text) else ""
            if nxt == "\n":  # continuation: git writes out the blanks before it
                value.append(pending_space)
                begun = begun or bool(pending_space)
                pending_space = ""
                j += 2
                continue
            value.append(pending_space + {"n": "\n", "t": "\t", "b": "\b"}.get(nxt, nxt))
            begun = begun or bool(value[-1])
            pending_space = ""
            j += 2
            continue
        if ch == '"':
            quoted = not quoted
            j += 1
            continue
        if ch in _BLANK and not quoted:
            if begun:
                pending_space += " "  # git keeps each inner blank, as a space
            j += 1
            continue
        value.append(pending_space + ch)
        begun = True
        pending_space = ""
        j += 1
    return key, "".join(value), j


def redirects(config: str, worktree: str) -> tuple[list[str], list[str]]:
    """(hooks directories, included files) the repository config at ``config`` names,
    following includes; each absolute and normalised (``~/`` expanded; a relative include
    from the including file's directory, a relative hooksPath from ``worktree``, where git
    runs hooks). Missing or unreadable files are skipped, but an include that names one is
    still listed (a run could make it)."""
    hooks: list[str] = []
    included: list[str] = []
    todo = [(config, 0)]
    seen = set()
    while todo:
        path, depth = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        data = _read(path)
        if data is None:
            continue
        for section, key, value in entries(data):
            if not value:
                continue
            if section == "core" and key == "hookspath":
                hooks.append(_absolute(value, worktree))
            elif key == "path" and (section == "include" or section.startswith("includeif.")):
                target = _absolute(value, os.path.dirname(path))
                included.append(target)
                if depth + 1 < MAX_DEPTH:
                    todo.append((target, depth + 1))
    return list(dict.fromkeys(hooks)), list(dict.fromkeys(included))


def _absolute(value: str, base: str) -> str:
    if value.startswith("~/") or value == "~":
        value = os.path.expanduser(value)
    return os.path.normpath(os.path.join(base, value))


def _read(path: str) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, MAX_BYTES)
    except OSError:
        return None
    finally:
        os.close(fd)
