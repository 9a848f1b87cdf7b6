"""The package as a user gets it: wheels that carry hcp-exec, an sdist that builds it when it
can, a fallback that says so, the executor in `probe` and in every receipt, `--version`.

Everything here is real: the sdist and wheels are built with `python -m build` and `pip
wheel` from this tree, installed into fresh virtual environments and run; the fallback is
caused for real (no binary where the runtime looks, no compiler on PATH). The tests that
build need the source tree and are skipped in the installed-wheel leg (scripts/test-wheel),
which runs this file from a copy of tests/ against site-packages.
"""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from typing import Iterator

import pytest

from hcp_linux import native
from sandboxing import TIMEOUT, _mkdtemp_outside_tmp, as_nobody

ROOT = Path(__file__).resolve().parents[1]
IN_TREE = (ROOT / "setup.py").is_file() and (ROOT / "hcp_linux" / "native").is_dir()
needs_tree = pytest.mark.skipif(not IN_TREE, reason="builds from the source tree")
BUILD_TIMEOUT = 300  # a wheel build installs setuptools into an isolated environment first

#: Runs /bin/true twice through the API, with the native executor looked for in argv[1]
#: (the real directory, or an empty one) and the executor argv[2] ("-": the default).
TWO_RUNS = """
import sys, tempfile
from hcp_linux import Policy, Sandbox, native
if sys.argv[1] != "-":
    native.selection.BUILD_DIR = sys.argv[1]
executor = None if sys.argv[2] == "-" else sys.argv[2]
for _ in range(2):
    with tempfile.TemporaryDirectory() as jail:
        run = Sandbox(Policy(jail=jail), executor=executor).run(["/bin/true"])
    print(run.receipt["executor"], run.returncode)
"""


def _python(python: str, code: str, *args: str, env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([python, "-c", code, *args], capture_output=True, text=True,
                          timeout=TIMEOUT, cwd="/", stdin=subprocess.DEVNULL, env=env)


# --- the fallback announces itself; the receipt and probe name the executor ------------------


def test_auto_without_a_binary_warns_once_and_the_receipt_says_ctypes(tmp_path: Path) -> None:
    p = _python(sys.executable, TWO_RUNS, str(tmp_path), "-")
    assert p.returncode == 0, p.stderr
    assert p.stdout == "ctypes 0\nctypes 0\n"
    lines = p.stderr.splitlines()
    assert len(lines) == 1, p.stderr  # two runs, one warning
    missing = tmp_path / native.artifact_name()
    assert lines[0] == native.FALLBACK_WARNING.format(
        why=f"no binary for this source: {missing} does not exist")
    assert "~3x slower" in lines[0] and "python -m hcp_linux.native.build" in lines[0]


def test_asking_for_ctypes_is_not_warned_about(tmp_path: Path) -> None:
    p = _python(sys.executable, TWO_RUNS, str(tmp_path), "ctypes")
    assert (p.returncode, p.stdout, p.stderr) == (0, "ctypes 0\nctypes 0\n", "")


@pytest.mark.skipif(native.binary() is None, reason="native executor not built")
def test_auto_with_the_binary_is_native_and_quiet() -> None:
    p = _python(sys.executable, TWO_RUNS, "-", "-")
    assert (p.returncode, p.stdout, p.stderr) == (0, "native 0\nnative 0\n", "")


PROBE_JSON = """
import sys
from hcp_linux import native
if sys.argv[1] != "-":
    native.selection.BUILD_DIR = sys.argv[1]
from hcp_linux.cli.cli import main
sys.exit(main(["probe", "--json"]))
"""


def test_probe_names_the_executor_and_why(tmp_path: Path) -> None:
    p = _python(sys.executable, PROBE_JSON, str(tmp_path))
    assert p.returncode == 0, p.stderr
    verdict = json.loads(p.stdout)["executor"]
    assert verdict["name"] == "ctypes"
    assert verdict["detail"] == (f"no binary for this source: "
                                 f"{tmp_path / native.artifact_name()} does not exist")
    if native.binary() is not None:  # control: the real lookup finds it
        p = _python(sys.executable, PROBE_JSON, "-")
        assert p.returncode == 0, p.stderr
        assert json.loads(p.stdout)["executor"] == {"name": "native",
                                                    "detail": native.binary()}
        table = subprocess.run([sys.executable, "-m", "hcp_linux", "probe"], cwd="/",
                               capture_output=True, text=True, timeout=TIMEOUT).stdout
        assert f"executor  native  {native.binary()}" in table.splitlines()


def test_group_writable_binary_is_trusted_only_beside_group_writable_code(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pip installs a wheel under umask 002 (Ubuntu's default for users) as 0o775/0o664:
    the binary is then as safe as the Python next to it, and only then trusted."""
    exe, code = tmp_path / "hcp-exec", tmp_path / "code.py"
    exe.write_bytes(b"#!/bin/sh\n")
    code.write_text("")
    monkeypatch.setattr(native.selection, "__file__", str(code))
    exe.chmod(0o775)
    code.chmod(0o644)
    assert "writable by others (mode 775)" in (native.untrusted(str(exe)) or "")
    code.chmod(0o664)
    assert native.untrusted(str(exe)) is None
    exe.chmod(0o777)  # writable by everyone: never, whatever the code's mode
    code.chmod(0o666)
    assert "writable by others (mode 777)" in (native.untrusted(str(exe)) or "")


# --- building hcp-exec where the package is not ours to write -------------------------------

UNWRITABLE_BUILD = """
import sys
from hcp_linux.native import build
build.artifact_path = lambda: sys.argv[1] + "/_build/hcp-exec-test"
sys.exit(build.main(["--force"]))
"""


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_build_into_a_package_dir_we_cannot_write_is_one_line_and_exit_1() -> None:
    """Root installed the package, a user runs the build: one line that says where and why,
    exit 1, nothing written. As root the user is `nobody`; as a user, a 0o555 directory."""
    base = Path(_mkdtemp_outside_tmp())
    try:
        base.chmod(0o555)
        # as root: skipped, with the reason, when nobody cannot run this interpreter and
        # tree (a clone under a mode-0700 /root)
        prefix = as_nobody()
        argv = [*prefix, sys.executable, "-c", UNWRITABLE_BUILD, str(base)]
        p = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT, cwd="/")
        assert p.returncode == 1, p.stderr
        assert p.stderr == (f"hcp-linux native executor: cannot write {base}/_build: "
                            f"Permission denied (the package belongs to another user: run "
                            f"this as that user, or install a platform wheel, which carries "
                            f"hcp-exec); the ctypes executor will be used\n")
        assert os.listdir(base) == []
        base.chmod(0o755)  # control: where it may write, the same build succeeds
        argv = argv[len(prefix):]
        p = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT, cwd="/")
        assert p.returncode == 0, p.stderr
        assert (base / "_build" / "hcp-exec-test").is_file()
    finally:
        base.chmod(0o755)
        shutil.rmtree(base)


# --- --version ------------------------------------------------------------------------------


def test_version_from_the_command_and_the_module() -> None:
    import importlib.metadata

    import hcp_linux
    assert importlib.metadata.version("hcp-linux") == hcp_linux.__version__
    expected = f"hcp-linux {hcp_linux.__version__}\n"
    script = Path(sys.executable).parent / "hcp-linux"
    for argv in ([sys.executable, "-m", "hcp_linux", "--version"], [str(script), "--version"]):
        p = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT, cwd="/")
        assert (p.returncode, p.stdout, p.stderr) == (0, expected, ""), argv


# --- the source tree imports as it installs -------------------------------------------------

#: Run by `python -I -S` (no site: no install of ours, or of anything, is visible), with the
#: tree's copy in argv[1] the only addition to sys.path: the modules the argv names import from
#: that copy, and hcp_linux.landlock alone brings nothing of hcp_linux but its (lazy) face.
FROM_THE_TREE = """
import sys
root = sys.argv[1]
sys.path.insert(0, root)
import hcp_linux.landlock
alone = sorted(m for m in sys.modules if m.startswith("hcp_linux") and m != "hcp_linux"
               and not m.startswith("hcp_linux.landlock"))
import hcp_linux.observe.denials, hcp_linux.seccomp_profiles
for name in ("hcp_linux", "hcp_linux.landlock", "hcp_linux.observe.denials",
             "hcp_linux.seccomp_profiles"):
    assert sys.modules[name].__file__.startswith(root + "/"), sys.modules[name].__file__
print(alone)
"""


@needs_tree
def test_a_copy_of_the_tree_imports_as_installed_without_an_install(tmp_path: Path) -> None:
    """A checkout on sys.path, with nothing installed, is the package: landlock and
    seccomp_profiles are subpackages of hcp_linux in the tree, not only once installed."""
    copy = tmp_path / "tree"
    copy.mkdir()
    shutil.copytree(ROOT / "hcp_linux", copy / "hcp_linux", symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__", "_build"))
    python = [sys.executable, "-I", "-S", "-c"]
    p = subprocess.run([*python, FROM_THE_TREE, str(copy)], capture_output=True, text=True,
                       timeout=TIMEOUT, cwd="/")
    assert (p.returncode, p.stdout, p.stderr) == (0, "[]\n", "")
    # control: the same interpreter without the copy finds no hcp_linux at all
    p = subprocess.run([*python, "import hcp_linux"], capture_output=True, text=True,
                       timeout=TIMEOUT, cwd="/")
    assert p.returncode == 1 and "No module named 'hcp_linux'" in p.stderr, p.stderr


# --- the sdist, the wheels, a fresh environment -------------------------------------------


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """The sdist built from this tree, and two wheels built from that sdist: with the C
    compilers on PATH, and with none."""
    out = tmp_path_factory.mktemp("dists")
    subprocess.run([sys.executable, "-m", "build", "--sdist", "--outdir", str(out), str(ROOT)],
                   check=True, capture_output=True, timeout=BUILD_TIMEOUT)
    (sdist,) = out.glob("*.tar.gz")
    found = {"sdist": sdist}
    for name, path in (("wheel", os.environ["PATH"]), ("pure", "/nonexistent")):
        d = out / name
        p = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w",
                            str(d), str(sdist)], capture_output=True, text=True,
                           timeout=BUILD_TIMEOUT, env={**os.environ, "PATH": path})
        assert p.returncode == 0, p.stderr
        (found[name],) = d.glob("*.whl")
    yield found


@needs_tree
def test_sdist_carries_the_project(dists: dict[str, Path]) -> None:
    with tarfile.open(dists["sdist"]) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
        modes = {m.name.split("/", 1)[1]: m.mode for m in tar.getmembers() if "/" in m.name}
    for path in ("LICENSE", "Makefile", "setup.py", "pyproject.toml", ".ci/run",
                 "docs/inputs.md", "examples/hello-pack/pack.toml", "tests/conftest.py",
                 "tests/csrc/x32_getpid.c", "bench/spawn.py", "scripts/test-unprivileged",
                 "scripts/test-wheel", "hcp_linux/native/hcp_exec.c",
                 "hcp_linux/seccomp_profiles/py.typed", "hcp_linux/landlock/py.typed",
                 "hcp_linux/py.typed", "hcp_linux/egress/resolv.conf"):
        assert path in names, path
    assert modes["scripts/test-wheel"] & 0o111
    assert not [n for n in names if "_build" in n or "__pycache__" in n]


@needs_tree
def test_wheel_is_a_platform_wheel_carrying_a_static_hcp_exec(dists: dict[str, Path]) -> None:
    wheel = dists["wheel"]
    machine = os.uname().machine
    assert wheel.name == (f"hcp_linux-{_version()}-py3-none-manylinux_2_17_{machine}."
                          f"manylinux2014_{machine}.musllinux_1_1_{machine}.whl")
    member = f"hcp_linux/native/_build/{native.artifact_name()}"
    with zipfile.ZipFile(wheel) as z:
        info = z.getinfo(member)
        elf = z.read(member)
        record = z.read(f"hcp_linux-{_version()}.dist-info/RECORD").decode()
        wheel_meta = z.read(f"hcp_linux-{_version()}.dist-info/WHEEL").decode()
        assert "licenses/LICENSE" in " ".join(z.namelist())
        # the view's /etc/resolv.conf under network = "allow" (confinement.RESOLV_CONF)
        assert "hcp_linux/egress/resolv.conf" in z.namelist()
    assert stat.S_IMODE(info.external_attr >> 16) == 0o755
    assert f"\n{member},sha256=" in record  # listed: pip uninstall removes it
    assert "Root-Is-Purelib: false" in wheel_meta
    assert elf[:4] == b"\x7fELF" and not _has_interpreter(elf)  # static: no dynamic loader
    assert _has_interpreter(Path(sys.executable).resolve().read_bytes())  # control: dynamic
    # the commands: the native client as `hcp-linux` (static too), the Python one beside it
    scripts = f"hcp_linux-{_version()}.data/scripts"
    with zipfile.ZipFile(wheel) as z:
        client = z.read(f"{scripts}/hcp-linux")
        python = z.read(f"{scripts}/hcp-linux-py")
        client_mode = stat.S_IMODE(z.getinfo(f"{scripts}/hcp-linux").external_attr >> 16)
    assert client[:4] == b"\x7fELF" and not _has_interpreter(client) and client_mode == 0o755
    assert python.startswith(b"#!python\n") and b"hcp_linux.cli.launch" in python


@needs_tree
def test_sdist_without_a_compiler_gives_a_pure_wheel_without_hcp_exec(
        dists: dict[str, Path]) -> None:
    pure = dists["pure"]
    assert pure.name == f"hcp_linux-{_version()}-py3-none-any.whl"
    with zipfile.ZipFile(pure) as z:
        assert not [n for n in z.namelist() if "_build" in n]
        assert "hcp_linux/native/hcp_exec.c" in z.namelist()  # a later build can make it
        # no native client either: `hcp-linux` is the Python command, as `hcp-linux-py` is
        scripts = f"hcp_linux-{_version()}.data/scripts"
        assert z.read(f"{scripts}/hcp-linux") == z.read(f"{scripts}/hcp-linux-py")
        assert z.read(f"{scripts}/hcp-linux").startswith(b"#!python\n")


@needs_tree
def test_wheels_installed_fresh_run_native_or_say_why_and_uninstall_clean(
        dists: dict[str, Path], tmp_path: Path) -> None:
    """Each wheel in a fresh virtual environment: the platform wheel runs native, quietly;
    the pure one runs ctypes and warns once. `pip uninstall` then leaves no file of the
    package (the binary included) in site-packages."""
    for name, expected, warned in (("wheel", "native", False), ("pure", "ctypes", True)):
        venv = tmp_path / name
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                       timeout=TIMEOUT)
        py = str(venv / "bin" / "python")
        pip = [sys.executable, "-m", "pip", "--python", py]
        subprocess.run([*pip, "install", "-q", "--no-deps", str(dists[name])], check=True,
                       capture_output=True, timeout=BUILD_TIMEOUT)
        site = Path(_python(py, "import sysconfig; print(sysconfig.get_path('platlib'))")
                    .stdout.strip())
        # its dependencies (pyseccomp), from this environment, after its own site-packages
        (site / "deps.pth").write_text(_python(sys.executable, "import pyseccomp, os; print("
                                               "os.path.dirname(pyseccomp.__file__))").stdout)
        p = _python(py, "import hcp_linux; print(hcp_linux.__file__)")
        assert p.stdout.strip() == str(site / "hcp_linux" / "__init__.py"), p.stderr
        p = _python(py, TWO_RUNS, "-", "-")
        assert p.returncode == 0, p.stderr
        assert p.stdout == f"{expected} 0\n{expected} 0\n"
        assert ("native executor not available" in p.stderr) is warned, p.stderr
        assert len(p.stderr.splitlines()) == int(warned), p.stderr
        commands = [venv / "bin" / "hcp-linux", venv / "bin" / "hcp-linux-py"]
        for command in commands:  # the native one by way of the Python one
            v = subprocess.run([str(command), "--version"], capture_output=True, text=True,
                               timeout=TIMEOUT, cwd="/")
            assert (v.returncode, v.stdout) == (0, f"hcp-linux {_version()}\n"), v.stderr
        assert (commands[0].read_bytes()[:4] == b"\x7fELF") is (expected == "native")
        (site / "deps.pth").unlink()
        subprocess.run([*pip, "uninstall", "-y", "-q", "hcp-linux"], check=True,
                       capture_output=True, timeout=TIMEOUT)
        left = [str(f) for f in site.rglob("*") if "hcp_linux" in f.name or
                "hcp_linux" in str(f.relative_to(site))]
        assert left == [], left
        assert not any(c.exists() for c in commands)


def _version() -> str:
    import hcp_linux
    return hcp_linux.__version__


def _has_interpreter(elf: bytes) -> bool:
    """Whether a 64-bit little-endian ELF has a PT_INTERP program header (dynamic loader)."""
    import struct
    phoff, = struct.unpack_from("<Q", elf, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", elf, 0x36)
    return any(struct.unpack_from("<I", elf, phoff + i * phentsize)[0] == 3  # PT_INTERP
               for i in range(phnum))
