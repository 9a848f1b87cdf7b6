"""Build the native executor: ``python -m hcp_linux.native.build [--force] [--quiet]``.

Compiles ``hcp_exec.c`` with the system C compiler (statically when libc.a is there: exec of
a static binary skips the dynamic loader) into ``_build/hcp-exec-<digest of the source>``.
Optional by design: with no compiler, or when compiling fails, it says so and exits 0, and
hcp-linux uses the ctypes executor. ``--check`` exits 1 when no binary is built.
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

CFLAGS = ["-O2", "-std=gnu11", "-Wall", "-Wextra", "-fstack-protector-strong",
          "-D_FORTIFY_SOURCE=2"]


def compiler() -> str | None:
    for name in ("cc", "gcc", "clang"):
        path = shutil.which(name)
        if path:
            return path
    return None


def build(force: bool = False, quiet: bool = False) -> str | None:
    """Path of the built binary, or None (with the reason on stderr unless quiet)."""
    def say(msg: str) -> None:
        if not quiet:
            print(f"hcp-linux native executor: {msg}", file=sys.stderr)

    out = artifact_path()
    if not force and _trusted(out):
        say(f"up to date ({out})")
        return out
    cc = compiler()
    if cc is None:
        say("no C compiler found (cc, gcc, clang); the ctypes executor will be used")
        return None
    os.makedirs(BUILD_DIR, mode=0o755, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".hcp-exec-", dir=BUILD_DIR)
    os.close(fd)
    try:
        errors = ""
        for link in (["-static"], []):  # static first; dynamic when there is no libc.a
            p = subprocess.run([cc, *CFLAGS, *link, "-o", tmp, SOURCE], capture_output=True,
                               text=True)
            if p.returncode == 0:
                break
            errors = p.stderr
        else:
            say(f"compiling failed; the ctypes executor will be used\n{errors}")
            return None
        os.chmod(tmp, 0o755)
        os.replace(tmp, out)
        tmp = ""
    finally:
        if tmp:
            os.unlink(tmp)
    # Keep a few older builds: a running process may still hold the previous path.
    builds = sorted(glob.glob(os.path.join(BUILD_DIR, "hcp-exec-*")), key=os.path.getmtime)
    for old in builds[:-3]:
        os.unlink(old)
    say(f"built {out}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hcp_linux.native.build",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--force", action="store_true", help="rebuild even when up to date")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--check", action="store_true", help="exit 1 when nothing is built")
    a = ap.parse_args(argv)
    path = build(force=a.force, quiet=a.quiet)
    return 1 if a.check and path is None else 0


if __name__ == "__main__":
    sys.exit(main())
