"""Which executor a spawn uses: the built hcp-exec for this source when there is one this
process can trust and exec, else the ctypes executor (``auto``, said once on stderr);
``native`` refuses without it, ``ctypes`` never looks.
"""
from __future__ import annotations

import errno
import os
import stat
import threading

#: Executors a Sandbox can be asked for; "auto" is native when built, else ctypes.
EXECUTORS = ("auto", "native", "ctypes")

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "hcp_exec.c")
#: The native `hcp-linux` command for served runs (not the executor: see hcp_client.c).
CLIENT_SOURCE = os.path.join(HERE, "hcp_client.c")
BUILD_DIR = os.path.join(HERE, "_build")

_default = "auto"
_lock = threading.Lock()
_binary: "str | None | bool" = False  # False: not looked up yet
_missing = ""  # why _binary is None
_broken: str | None = None  # why auto stopped using the native executor in this process


def set_default(name: str) -> None:
    """Process-wide default executor for Sandboxes that do not name one (tests, the CLI)."""
    global _default
    _default = check(name)


def get_default() -> str:
    return _default


def check(name: str) -> str:
    if name not in EXECUTORS:
        from ..errors import PolicyError
        raise PolicyError(f"executor: expected one of {', '.join(EXECUTORS)}, got {name!r}")
    return name


def source_digest() -> str:
    """Of hcp_exec.c and the protocol header the build generates for it."""
    from .._sha256 import sha256
    from ..protocol import c_header
    with open(SOURCE, "rb") as f:
        return sha256(f.read() + c_header().encode()).hexdigest()[:16]


def artifact_name() -> str:
    """The binary's file name for the current source: a build of other source is not used."""
    return "hcp-exec-" + source_digest()


def client_path() -> str:
    """Where ``make native`` puts the native `hcp-linux` command built from the current
    ``hcp_client.c`` (a wheel installs it as the `hcp-linux` script instead: setup.py).
    The runtime never runs it; tests do."""
    from .._sha256 import sha256
    from ..protocol import c_header  # it includes the generated header too
    with open(CLIENT_SOURCE, "rb") as f:
        digest = sha256(f.read() + c_header().encode()).hexdigest()[:16]
    return os.path.join(BUILD_DIR, "hcp-linux-" + digest)


def artifact_path() -> str:
    """Where the build puts the binary for the current source (a platform wheel carries it
    there too, listed in the wheel's RECORD, so that ``pip uninstall`` removes it)."""
    return os.path.join(BUILD_DIR, artifact_name())


def untrusted(path: str) -> str | None:
    """Why ``path`` must not be run as hcp-exec, or None: it must be a regular, executable
    file, owned by root or by us, and writable by nobody else, except the group when the
    group can write this very module too (pip installs a wheel's files as 0o775/0o664 under
    umask 002, Ubuntu's default for users: whoever can rewrite the binary then can already
    rewrite the Python that runs it, so refusing it protects nothing)."""
    try:
        st = os.stat(path)
    except OSError as e:
        return f"{path}: {e.strerror}"
    if not stat.S_ISREG(st.st_mode):
        return f"{path}: not a regular file"
    if st.st_uid not in (0, os.geteuid()):
        return f"{path}: owned by uid {st.st_uid}, neither root nor us"
    loose = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if loose:
        try:
            own = os.stat(__file__)
        except OSError:
            own = None
        if (loose & stat.S_IWOTH or own is None or not own.st_mode & stat.S_IWGRP
                or (own.st_uid, own.st_gid) != (st.st_uid, st.st_gid)):
            return f"{path}: writable by others (mode {stat.S_IMODE(st.st_mode):o})"
    if not os.access(path, os.X_OK):
        return f"{path}: not executable"
    return None


def trusted(path: str) -> bool:
    return untrusted(path) is None


def binary() -> str | None:
    """The built hcp-exec for this source, or None (looked up once per process)."""
    return _lookup()[0]


def _lookup() -> tuple[str | None, str]:
    """(the trusted binary or None, why not), looked up once per process."""
    global _binary, _missing
    if _binary is False:
        with _lock:
            if _binary is False:
                try:
                    path = artifact_path()
                    why = untrusted(path)
                except OSError as e:
                    path, why = None, f"source {SOURCE}: {e.strerror}"
                if why is not None and why.endswith(os.strerror(errno.ENOENT)):
                    why = f"no binary for this source: {path} does not exist"
                _missing = why or ""
                _binary = path if why is None else None
    return _binary, _missing  # type: ignore[return-value]


def available() -> bool:
    return binary() is not None and _broken is None


def status() -> tuple[str, str]:
    """What ``auto`` uses and why: ("native", the binary's path) or ("ctypes", the reason
    no native executor can run: no binary for this source, an untrusted one, or one the
    kernel refused to exec in this process)."""
    path, why = _lookup()
    if path is None:
        return "ctypes", why
    if _broken is not None:
        return "ctypes", _broken
    return "native", path


def selected(name: str | None = None) -> str:
    """The executor a spawn asking for ``name`` (None: the default) uses: native or ctypes."""
    name = check(name or _default)
    if name == "ctypes":
        return "ctypes"
    if name == "native":
        return "native"
    return "native" if available() else "ctypes"


#: The fallback's cost, measured on the 2-vCPU development VM: /bin/true through the ctypes
#: executor 12.8-14.7 ms, through hcp-exec 3.6-3.9 ms (issue #16).
FALLBACK_WARNING = ("hcp-linux: warning: native executor not available ({why}); using the ctypes "
                    "fallback, ~3x slower per run: pip install a platform wheel, or run "
                    "`python -m hcp_linux.native.build`")
_warned = False


def warn_fallback() -> None:
    """Say once per process that ``auto`` fell back to ctypes for want of a binary it can run
    (never when the caller asked for ctypes): the slowdown must not be silent."""
    global _warned
    why = status()[1]  # before the lock: the lookup takes it
    with _lock:
        if _warned:
            return
        _warned = True
    import sys
    from ..errors import printable
    print(FALLBACK_WARNING.format(why=printable(why)), file=sys.stderr)


def unavailable_error() -> Exception:
    from ..errors import SandboxError
    why = _broken or (f"{_lookup()[1]} (install a platform wheel, or run `make setup` or "
                      "`python -m hcp_linux.native.build`: it needs a C compiler)")
    return SandboxError(f"native executor unavailable: {why}")


def cannot_exec(executor: str | None, exe: str, e: OSError) -> None:
    """posix_spawn of hcp-exec failed: "auto" goes on with ctypes (for good), else raise."""
    global _broken
    if e.errno not in (errno.ENOENT, errno.EACCES, errno.ENOEXEC, errno.EPERM):
        raise e  # EAGAIN, ENOMEM...: as os.fork() would
    if (executor or _default) != "auto":
        from ..errors import SandboxError
        raise SandboxError(f"native executor {exe}: {os.strerror(e.errno)}") from None
    _broken = f"{exe}: {os.strerror(e.errno)}"  # e.g. a noexec mount
    warn_fallback()
    return None

