"""The child's environment: built from an allowlist, never inherited wholesale.

HCP §10.2.3: no ambient credentials, so only locale and terminal keys are taken from the
caller, and locale keys only when their value looks like a locale name: ``LC_*`` is a
known way to carry other values across a boundary (sshd's ``AcceptEnv LC_*`` made
``LC_DEPLOY_TOKEN`` a classic), so only the categories POSIX and glibc define are inherited.
Everything else must be passed explicitly (``--env``, a pack's ``wrap.agent_env``).
Variables that make an allow-listed binary run other code (the loader's LD_*, shells' startup
files, interpreters' option variables, git's hooks and helpers) are refused even when passed
explicitly: they would turn "run /usr/bin/git" into "run anything".
"""
from __future__ import annotations

import re
from typing import Mapping

from ..errors import PolicyError

#: The locale categories (POSIX's and glibc's, locale(7)) and LANG/LANGUAGE.
LOCALE_KEYS = frozenset({
    "LANG", "LANGUAGE", "LC_ALL", "LC_ADDRESS", "LC_COLLATE", "LC_CTYPE", "LC_IDENTIFICATION",
    "LC_MEASUREMENT", "LC_MESSAGES", "LC_MONETARY", "LC_NAME", "LC_NUMERIC", "LC_PAPER",
    "LC_TELEPHONE", "LC_TIME",
})
#: A locale name (``C``, ``C.UTF-8``, ``de_DE.ISO-8859-15@euro``), or for LANGUAGE a
#: colon-separated list of them: nothing longer, nothing else.
_LOCALE_VALUE = re.compile(r"[A-Za-z0-9_.@-]{1,64}(?::[A-Za-z0-9_.@-]{1,64}){0,15}")
INHERITED_KEYS = frozenset({"TERM", "TZ", "COLORTERM", "NO_COLOR"}) | LOCALE_KEYS

INJECTION_KEYS = frozenset({
    # dynamic loader and libc
    "GCONV_PATH", "LOCPATH", "NLSPATH", "HOSTALIASES", "RESOLV_HOST_CONF", "MALLOC_TRACE",
    # shells
    "BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "PS4", "PROMPT_COMMAND", "IFS", "CDPATH",
    # interpreters
    "PYTHONSTARTUP", "PYTHONPATH", "PYTHONHOME", "PYTHONINSPECT", "PYTHONWARNINGS",
    "PYTHONBREAKPOINT", "PYTHONUSERBASE", "NODE_OPTIONS", "NODE_PATH", "PERL5OPT", "PERL5LIB",
    "PERLLIB", "PERL5DB", "RUBYOPT", "RUBYLIB", "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS",
    "JDK_JAVA_OPTIONS", "CLASSPATH", "LUA_INIT", "TCLLIBPATH",
    # git runs these as commands or reads configuration that does
    "GIT_SSH", "GIT_SSH_COMMAND", "GIT_ASKPASS", "GIT_EDITOR", "GIT_PAGER", "GIT_EXEC_PATH",
    "GIT_EXTERNAL_DIFF", "GIT_PROXY_COMMAND", "GIT_TEMPLATE_DIR", "GIT_CONFIG",
    "GIT_CONFIG_GLOBAL", "GIT_CONFIG_SYSTEM", "GIT_CONFIG_PARAMETERS", "GIT_CONFIG_COUNT",
    "SSH_ASKPASS", "EDITOR", "VISUAL", "PAGER",
    # the marker is ours to set
    "HCP_SANDBOX",
})
INJECTION_PREFIXES = ("LD_", "BASH_FUNC_", "GIT_CONFIG_KEY_", "GIT_CONFIG_VALUE_", "DYLD_")


def is_injection_key(key: str) -> bool:
    return key in INJECTION_KEYS or key.startswith(INJECTION_PREFIXES)


def is_inherited(key: str, value: str) -> bool:
    """Whether the caller's ``key=value`` reaches the child without being asked for."""
    if key not in INHERITED_KEYS:
        return False
    return key not in LOCALE_KEYS or _LOCALE_VALUE.fullmatch(value) is not None


def check_explicit(env: Mapping[str, str], source: str = "env") -> None:
    for key in env:
        if is_injection_key(key):
            what = "is set by the sandbox" if key == "HCP_SANDBOX" else "injects code"
            raise PolicyError(f'{source}: variable "{key}" not allowed ({what})')


def build_env(caller: Mapping[str, str], explicit: Mapping[str, str], *, marker: str,
              path: str, home: str, tmpdir: str
              ) -> tuple[dict[str, str], tuple[str, ...], tuple[str, ...]]:
    """The child's environment, and for the receipt the caller keys that were dropped and
    those whose caller value was replaced by the sandbox's own (PATH, HOME...)."""
    check_explicit(explicit)
    env = {k: v for k, v in caller.items() if is_inherited(k, v)}
    env.update(PATH=path, HOME=home, TMPDIR=tmpdir, TMP=tmpdir, TEMP=tmpdir)
    env.update(explicit)
    env["HCP_SANDBOX"] = marker
    removed = tuple(sorted(k for k in caller if k not in env))
    replaced = tuple(sorted(k for k in caller if k in env and env[k] != caller[k]))
    return env, removed, replaced
