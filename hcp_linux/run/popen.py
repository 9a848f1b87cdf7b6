"""subprocess's arguments, taken as subprocess takes them, for Sandbox.spawn and Sandbox.run.

Every parameter of :class:`subprocess.Popen` and :func:`subprocess.run` either keeps its
meaning in a sandbox or is refused here, before anything is compiled or started, with an
error that names it and says why (docs/popen.md has the table). Misuse subprocess itself
refuses (a bufsize that is not an int, text and universal_newlines that disagree, Windows-only
arguments) raises what subprocess raises; a parameter the sandbox cannot honour raises
:class:`~hcp_linux.errors.PolicyError`, a ValueError, as subprocess does for an argument it
cannot honour on this platform.
"""
from __future__ import annotations

import locale
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, Mapping

from ..policy.environment import check_explicit
from ..errors import PolicyError
from ..policy.policy import check_env_text
from ..policy.values import show

#: Parameters a sandbox does not offer: name -> (the value that means "not used", why).
#: Given that value (the subprocess default) they are accepted; any other is refused.
REFUSED: Mapping[str, tuple[Any, str]] = {
    "preexec_fn": (None, "it would run Python code in the confined child between fork and "
                         "exec, where only the sandbox's own setup may run (and, in a "
                         "threaded runtime, forked Python can deadlock)"),
    "close_fds": (True, "the sandbox closes every fd above 2 before exec: an inherited fd "
                        "is a capability outside the policy"),
    "pass_fds": ((), "an fd passed in is a capability outside the policy (a directory fd "
                     "escapes the mount view); pass data through stdin/stdout or a granted "
                     "root"),
    "restore_signals": (True, "the command always starts with SIGPIPE and SIGXFSZ at their "
                              "default actions"),
    "user": (None, "the command runs as the caller's uid, mapped into the sandbox's user "
                   "namespace; it cannot switch to another"),
    "group": (None, "the command runs as the caller's gid, mapped into the sandbox's user "
                    "namespace; it cannot switch to another"),
    "extra_groups": (None, "setgroups is denied in the sandbox's user namespace"),
    "umask": (-1, "the command takes this process's umask"),
    "process_group": (None, "the run has a session and process group of its own (setsid); "
                            "it cannot join another"),
}

#: Windows-only parameters: refused as subprocess refuses them on POSIX (ValueError).
WINDOWS_ONLY: Mapping[str, Any] = {"startupinfo": None, "creationflags": 0}


def refuse_unsupported(given: Mapping[str, Any]) -> None:
    """Raise for the first parameter of ``given`` (name -> value) that is not at its
    "not used" value: ValueError for a Windows-only one (as subprocess), PolicyError for one
    the sandbox does not offer."""
    for name, unused in WINDOWS_ONLY.items():
        value = given[name]
        if (value is not None) if unused is None else (value != unused):
            raise ValueError(f"{name} is only supported on Windows platforms")
    for name, (unused, why) in REFUSED.items():
        value = given[name]
        if name == "pass_fds":
            used = bool(tuple(value))
        elif name in ("close_fds", "restore_signals"):
            used = not value
        elif unused is None:
            used = value is not None
        else:
            used = value != unused
        if used:
            raise PolicyError(f"{name}={show(value)} refused: {why}")


def _fs_text(value: Any, what: str) -> str:
    """A str, bytes or os.PathLike item as text, as subprocess takes it (os.fsencode); any
    other type is a TypeError, as in subprocess."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if isinstance(value, bytes):
        return os.fsdecode(value)
    if isinstance(value, str):
        return value
    raise TypeError(f"{what}: expected str, bytes or os.PathLike object, not "
                    f"{type(value).__name__}")


def command(args: Any, shell: bool, executable: Any) -> tuple[list[str], str | None]:
    """(argv, the program to execute or None for argv[0]) as Popen makes them.

    A str, bytes or path-like ``args`` is one program name, whole (``"/bin/echo hi"`` is a
    program of that name, as without ``shell``); with ``shell`` it is the script of
    ``/bin/sh -c`` (the sandbox's allow-list applies to the shell). Items may be str, bytes or
    path-like."""
    items: list[Any]
    if isinstance(args, (str, bytes)):
        items = [args]
    elif isinstance(args, os.PathLike):
        if shell:
            raise TypeError("path-like args is not allowed when shell is true")
        items = [args]
    else:
        try:
            items = list(args)
        except TypeError:
            raise TypeError(f"args: expected a sequence of str, bytes or os.PathLike, not "
                            f"{type(args).__name__}") from None
    argv = [_fs_text(a, f"args[{i}]") for i, a in enumerate(items)]
    exe = None if executable is None else _fs_text(executable, "executable")
    if shell:
        argv = ["/bin/sh", "-c", *argv]
        if exe is not None:
            argv[0] = exe
    if not argv:
        raise PolicyError("args: empty command (expected at least the program to run)")
    return argv, exe


def text_encoding() -> str:
    """The encoding text mode uses when none is given, as subprocess chooses it."""
    if sys.flags.utf8_mode:
        return "utf-8"
    getencoding = getattr(locale, "getencoding", None)  # 3.11; before: the same, by this name
    return getencoding() if getencoding is not None else locale.getpreferredencoding(False)


@dataclass(frozen=True)
class Stdio:
    """How the parent's ends of the pipes are opened, as Popen opens them: ``bufsize`` for
    the binary files (0: unbuffered, 1: line-buffered, text only), and in text mode a
    TextIOWrapper over each with ``encoding``/``errors``. ``pipesize``: F_SETPIPE_SZ on each
    pipe made (<= 0: the kernel's default)."""

    bufsize: int = -1
    text: bool = False
    encoding: str | None = None
    errors: str | None = None
    line_buffering: bool = False
    pipesize: int = -1

    @classmethod
    def of(cls, bufsize: Any, text: Any, universal_newlines: Any, encoding: str | None,
           errors: str | None, pipesize: Any) -> "Stdio":
        """From Popen's arguments, refused as Popen refuses them."""
        bufsize = -1 if bufsize is None else bufsize
        if not isinstance(bufsize, int):
            raise TypeError("bufsize must be an integer")
        pipesize = -1 if pipesize is None else pipesize
        if not isinstance(pipesize, int):
            raise TypeError("pipesize must be an integer")
        if text is not None and universal_newlines is not None \
                and bool(universal_newlines) != bool(text):
            raise subprocess.SubprocessError(
                "Cannot disambiguate when both text and universal_newlines are supplied but "
                "different. Pass one or the other.")
        text_mode = bool(encoding or errors or text or universal_newlines)
        line_buffering = False
        if text_mode:
            if encoding is None:
                encoding = text_encoding()
            if bufsize == 1:  # the binary files under a line-buffered text file
                line_buffering, bufsize = True, -1
        return cls(bufsize, text_mode, encoding, errors, line_buffering, pipesize)


def granted_env(env: Any) -> dict[str, str] | None:
    """``env`` of a call: the variables the caller grants the command (None: no ``env``).

    ``os.environ`` itself means what it means to subprocess, the default: None. Keys and
    values may be str or bytes (decoded as the file system does); each is checked as a
    policy's ``env`` is (a name a shell can use, no NUL, UTF-8, not one that injects code)."""
    if env is None or env is os.environ or env is getattr(os, "environb", None):
        return None
    if not isinstance(env, Mapping):
        raise TypeError(f"env: expected a mapping, not {type(env).__name__}")
    out: dict[str, str] = {}
    for key, value in env.items():
        k, v = _fs_text(key, "env key"), _fs_text(value, f"env[{show(key)}]")
        check_explicit({k: v})
        check_env_text(k, v)
        out[k] = v
    return out


def working_dir(cwd: Any) -> str | None:
    """``cwd`` as text (the plan checks it against the sandbox's view)."""
    if cwd is None:
        return None
    text = _fs_text(cwd, "cwd")
    if not text or "\0" in text:
        raise PolicyError(f"cwd: invalid path {show(text)}")
    return text


def stdio_checks(stdin: Any, stdout: Any, stderr: Any) -> None:
    """The misuse Popen would only notice as a failed dup2 in the child: STDOUT given for
    stdin or stdout, a negative fd."""
    for name, spec in (("stdin", stdin), ("stdout", stdout), ("stderr", stderr)):
        if isinstance(spec, bool) or not isinstance(spec, int):
            continue
        if spec == subprocess.STDOUT and name != "stderr":
            raise ValueError(f"{name}=STDOUT: only stderr can be sent to stdout")
        if spec < 0 and spec not in (subprocess.PIPE, subprocess.DEVNULL, subprocess.STDOUT):
            raise ValueError(f"{name}: invalid file descriptor {spec}")


__all__ = ["REFUSED", "WINDOWS_ONLY", "Stdio", "command", "granted_env", "refuse_unsupported",
           "stdio_checks", "text_encoding", "working_dir"]
