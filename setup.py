"""The wheel carries hcp-exec, the native executor, and the native `hcp-linux` command,
compiled when the wheel is built.

Everything else about the package is in pyproject.toml; this file only adds two steps to
setuptools' commands:

- ``build_py`` compiles ``hcp_linux/native/hcp_exec.c`` with the recipes of
  ``hcp_linux.native.build`` (musl static first) into the built package's
  ``hcp_linux/native/_build/hcp-exec-<digest>``, where the runtime looks for it; a wheel's
  RECORD lists it, so ``pip uninstall`` removes it. With no C compiler (an sdist installed on a
  machine without one) it says so and the package installs without it: hcp-linux then uses the
  ctypes executor and says so once per process. ``HCP_LINUX_NATIVE=1`` makes that an error
  (platform wheels, CI); ``HCP_LINUX_NATIVE=0`` skips the build.
- ``bdist_wheel`` tags the wheel for what it carries: ``py3-none-any`` without the binary;
  with a static one (it needs a Linux kernel, no libc and no Python ABI)
  ``py3-none-manylinux_2_17_<arch>.manylinux2014_<arch>.musllinux_1_1_<arch>``, the oldest
  glibc and musl lines pip knows for the architecture; with a dynamic one (no libc.a here),
  ``py3-none-linux_<arch>``, which no index accepts and auditwheel would have to repair.

- ``build_scripts`` installs the commands: the native client (``hcp_client.c``, the same
  recipes) as ``hcp-linux`` when hcp-exec was built, and the Python command as
  ``hcp-linux-py`` (and as ``hcp-linux`` without the client). See BuildScriptsWithClient.

Editable installs (``make setup``) build nothing here: ``make native`` builds into the clone.
"""
from __future__ import annotations

import os
import platform
import shutil
import sys
from types import ModuleType

from setuptools import setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_py import build_py

from distutils.command.build_scripts import build_scripts  # setuptools' own, once it is imported

HERE = os.path.dirname(os.path.abspath(__file__))


def _native_build() -> tuple[ModuleType, ModuleType]:
    """hcp_linux.native.build from this source tree (it imports the standard library only)."""
    sys.path.insert(0, HERE)
    try:
        from hcp_linux import native
        from hcp_linux.native import build
    finally:
        sys.path.remove(HERE)
    return native, build


class BuildPyWithHcpExec(build_py):
    """build_py, then hcp-exec compiled into the built package."""

    hcp_exec: tuple[str, str] | None = None  # (path, recipe) once built

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        native, build = _native_build()
        directory = os.path.join(self.build_lib, "hcp_linux", "native", "_build")
        shutil.rmtree(directory, ignore_errors=True)  # no binary of an earlier source
        try:
            self.hcp_exec = build.build_into(os.path.join(directory, native.artifact_name()))
        except build.CannotWrite as e:
            raise SystemExit(f"error: hcp-exec: {e}") from None
        if self.hcp_exec is None and os.environ.get(build.ENV) == "1":
            raise SystemExit(f"error: hcp-exec: {build.ENV}=1 and it was not built")

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        out = super().get_outputs(include_bytecode)
        return out + ([self.hcp_exec[0]] if self.hcp_exec else [])


def platform_tag(recipe: str) -> str:
    """The wheel's platform tag for hcp-exec built by ``recipe`` on this machine."""
    arch = platform.machine()
    if "static" in recipe:
        return (f"manylinux_2_17_{arch}.manylinux2014_{arch}.musllinux_1_1_{arch}")
    return f"linux_{arch}"


class BuildScriptsWithClient(build_scripts):
    """build_scripts, then the commands as a wheel installs them: ``hcp-linux-py``, the Python
    command (bin/hcp-linux: pip points its ``#!python`` at the environment's interpreter), and
    ``hcp-linux``, the native client (hcp_linux/native/hcp_client.c) when it builds and hcp-exec
    did, else the Python command again. The client execs ``hcp-linux-py`` beside it for
    everything it does not do itself. setuptools' own step cannot take a binary (it reads the
    first line as Python for an encoding cookie); a file in the wheel's ``.data/scripts`` is
    installed byte for byte, executable. An editable install (``make setup``) keeps the Python
    command under both names: ``make native`` builds the client into the clone for the tests."""

    editable_mode = False  # set by setuptools' editable_wheel

    def run(self) -> None:
        super().run()
        python = os.path.join(self.build_dir, "hcp-linux")
        shutil.copy2(python, os.path.join(self.build_dir, "hcp-linux-py"))
        if self.editable_mode or self.get_finalized_command("build_py").hcp_exec is None:
            return
        _, build = _native_build()
        try:
            built = build.build_into(python + ".native", target=build.CLIENT)
        except build.CannotWrite as e:
            raise SystemExit(f"error: hcp-linux: {e}") from None
        if built is None:
            if os.environ.get(build.ENV) == "1":
                raise SystemExit(f"error: hcp-linux: {build.ENV}=1 and it was not built")
            return
        os.replace(built[0], python)


class BdistWheelWithHcpExec(bdist_wheel):
    """bdist_wheel, tagged py3-none-<platform> when the wheel carries hcp-exec."""

    def run(self) -> None:
        self.run_command("build_py")
        built = self.get_finalized_command("build_py").hcp_exec
        self.root_is_pure = built is None
        self._hcp_recipe = built[1] if built else None
        if built:  # the install step puts the package in platlib, the wheel's root
            self.distribution.has_ext_modules = lambda: True  # type: ignore[method-assign]
        super().run()

    def get_tag(self) -> tuple[str, str, str]:
        if self.root_is_pure:
            return "py3", "none", "any"
        return "py3", "none", platform_tag(self._hcp_recipe or "")


setup(cmdclass={"build_py": BuildPyWithHcpExec, "build_scripts": BuildScriptsWithClient,
                "bdist_wheel": BdistWheelWithHcpExec})
