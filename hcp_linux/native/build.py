"""Build the native executor: ``python -m hcp_linux.native.build [--force] [--quiet]``.

Compiles ``hcp_exec.c`` into ``_build/hcp-exec-<digest of the source>``, with the first of
these that builds a binary that runs:

- musl-gcc, static (Debian's musl-tools), with the system's kernel headers. A spare is one
  exec of hcp-exec, and glibc's start-up probes the CPU with some forty cpuid instructions,
  each a trap to the hypervisor on a virtual machine; musl's start-up has none. Measured on
  the 2-vCPU VM this project is developed on: ~0.3 ms less machine CPU per run (of ~4).
- the system C compiler, static (exec of a static binary skips the dynamic loader);
- the system C compiler, dynamic (no libc.a).

Optional by design: with no compiler, or when compiling fails, it says so and exits 0, and
hcp-linux uses the ctypes executor. ``--check`` exits 1 when no binary is built. A package
directory this user cannot write (hcp-linux installed by root, run by a user) is one line and
exit 1: the binary is looked for only next to the source it was built from, owned by root or
by its user (see ``untrusted``), so there is nowhere else to put it.

The wheel build (setup.py) calls ``build_into`` to put the binary in the wheel.
"""
from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile

from . import BUILD_DIR, SOURCE, _trusted, artifact_path

#: Set to 0 to build without hcp-exec even when a C compiler is there (a wheel or an
#: install that is to use the ctypes executor); 1 makes a failed build an error
#: (platform wheels, CI). Unset: build when possible.
ENV = "HCP_LINUX_NATIVE"

CFLAGS = ["-O2", "-std=gnu11", "-Wall", "-Wextra", "-fstack-protector-strong",
          "-D_FORTIFY_SOURCE=2"]


def compiler() -> str | None:
    for name in ("cc", "gcc", "clang"):
        path = shutil.which(name)
        if path:
            return path
    return None


def kernel_headers(cc: str) -> dict[str, str] | None:
    """The system's linux/, asm/ and asm-generic/ header directories, which musl does not
    ship (hcp_exec.c includes linux/capability.h, linux/filter.h, linux/seccomp.h)."""
    try:
        arch = subprocess.run([cc, "-print-multiarch"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        arch = ""
    asm = [os.path.join("/usr/include", arch, "asm")] if arch else []
    found = {"linux": "/usr/include/linux", "asm-generic": "/usr/include/asm-generic",
             "asm": next((d for d in [*asm, "/usr/include/asm"] if os.path.isdir(d)), "")}
    return found if all(os.path.isdir(d) for d in found.values()) else None


def recipes(cc: str, include_dir: str) -> list[tuple[str, list[str]]]:
    """(name, compiler argv) in the order to try; ``include_dir`` is an empty directory the
    musl recipe may fill with links to the kernel headers."""
    out = []
    musl = shutil.which("musl-gcc")
    headers = kernel_headers(cc) if musl else None
    if musl and headers:
        for name, target in headers.items():
            os.symlink(target, os.path.join(include_dir, name))
        # musl has no _FORTIFY_SOURCE: the define is harmless there, kept for one CFLAGS
        out.append(("musl, static", [musl, "-isystem", include_dir, *CFLAGS, "-static"]))
    out.append(("static", [cc, *CFLAGS, "-static"]))  # needs libc.a
    out.append(("dynamic", [cc, *CFLAGS]))
    return out


def _runs(path: str) -> bool:
    """The binary starts and answers as hcp-exec does when misused (usage, exit 2)."""
    try:
        p = subprocess.run([path], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return p.returncode == 2 and p.stderr.startswith(b"hcp-exec: ")


class CannotWrite(Exception):
    """The build directory cannot be written by this user."""


def build(force: bool = False, quiet: bool = False) -> str | None:
    """Path of the built binary, or None (with the reason on stderr unless quiet); raises
    CannotWrite when the package's build directory is not this user's to write."""
    out = artifact_path()
    if not force and _trusted(out):
        _say(quiet, f"up to date ({out})")
        return out
    built = build_into(out, quiet)
    if built is None:
        return None
    # Keep a few older builds: a running process may still hold the previous path.
    builds = sorted(glob.glob(os.path.join(BUILD_DIR, "hcp-exec-*")), key=os.path.getmtime)
    for old in builds[:-3]:
        os.unlink(old)
    return built[0]


def _say(quiet: bool, msg: str) -> None:
    if not quiet:
        print(f"hcp-linux native executor: {msg}", file=sys.stderr)


def build_into(out: str, quiet: bool = False) -> tuple[str, str] | None:
    """Compile hcp-exec to ``out`` with the first recipe that makes a binary that runs:
    (``out``, the recipe's name), or None when there is no compiler, ``HCP_LINUX_NATIVE=0``
    or no recipe worked (said on stderr unless quiet)."""
    if os.environ.get(ENV) == "0":
        _say(quiet, f"{ENV}=0: not built; the ctypes executor will be used")
        return None
    cc = compiler()
    if cc is None:
        _say(quiet, "no C compiler found (cc, gcc, clang); the ctypes executor will be used")
        return None
    directory = os.path.dirname(out)
    try:
        os.makedirs(directory, mode=0o755, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".hcp-exec-", dir=directory)
    except OSError as e:
        raise CannotWrite(f"cannot write {directory}: {e.strerror}") from None
    os.close(fd)
    try:
        errors = ""
        with tempfile.TemporaryDirectory(prefix="hcp-exec-include-") as include_dir:
            for name, argv in recipes(cc, include_dir):
                p = subprocess.run([*argv, "-o", tmp, SOURCE], capture_output=True, text=True)
                if p.returncode == 0:
                    os.chmod(tmp, 0o755)
                    if _runs(tmp):
                        break
                why = p.stderr if p.returncode else "the binary did not answer as hcp-exec"
                errors += f"[{name}] {why}\n"
            else:
                _say(quiet, f"compiling failed; the ctypes executor will be used\n{errors}")
                return None
        os.replace(tmp, out)
        tmp = ""
    finally:
        if tmp:
            os.unlink(tmp)
    _say(quiet, f"built {out} ({name})")
    return out, name


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hcp_linux.native.build",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--force", action="store_true", help="rebuild even when up to date")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--check", action="store_true", help="exit 1 when nothing is built")
    a = ap.parse_args(argv)
    try:
        path = build(force=a.force, quiet=a.quiet)
    except CannotWrite as e:
        from ..errors import printable
        print(f"hcp-linux native executor: {printable(str(e))} (the package belongs to "
              f"another user: run this as that user, or install a platform wheel, which "
              f"carries hcp-exec); the ctypes executor will be used", file=sys.stderr)
        return 1
    if path is None and os.environ.get(ENV) == "1":
        print(f"hcp-linux native executor: {ENV}=1 and nothing was built", file=sys.stderr)
        return 1
    return 1 if a.check and path is None else 0


if __name__ == "__main__":
    sys.exit(main())
