"""hcp-linux as a sandbox client of the OpenAI Agents SDK (hcp_linux.integrations.openai_agents).

The parts of the SDK's own local-client contract (its tests/sandbox/test_unix_local*.py) that
apply to a Linux client: create() with default options and Manifest(root=DIR), exec (exit
code, stdout/stderr, shell strings, timeout), manifest environment, read/write round trips,
delete removing an owned root and keeping a given one, host_path grants refused. Then
confinement by attack, with the SDK's UnixLocalSandboxClient as the unconfined control.

Skipped, with the reason printed, when the SDK is not installed (the main venv):
scripts/test-frameworks installs the pinned version in a venv of its own.
"""
from __future__ import annotations

import io
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

pytest.importorskip("agents.sandbox", reason="the OpenAI Agents SDK is not installed: "
                    "scripts/test-frameworks runs these tests in a venv of its own")

from agents.sandbox.errors import (ExecTimeoutError, InvalidManifestPathError,  # noqa: E402
                                   WorkspaceArchiveReadError, WorkspaceArchiveWriteError,
                                   WorkspaceReadNotFoundError)
from agents.sandbox.manifest import Environment, Manifest  # noqa: E402
from agents.sandbox.sandboxes.unix_local import (UnixLocalSandboxClient,  # noqa: E402
                                                 UnixLocalSandboxSessionState)
from agents.sandbox.snapshot import NoopSnapshot  # noqa: E402
from agents.sandbox.workspace_paths import SandboxPathGrant  # noqa: E402

from hcp_linux.integrations.openai_agents import (HcpSandboxClient,  # noqa: E402
                                                  HcpSandboxSession)

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def secret() -> Iterator[Path]:
    """A host file outside the sandbox's view (/var/tmp), readable by the runtime's user."""
    base = Path(tempfile.mkdtemp(prefix="hcp-fw-secret-", dir="/var/tmp"))
    os.chmod(base, 0o755)
    (base / "secret.txt").write_text("host secret\n")
    os.chmod(base / "secret.txt", 0o644)
    try:
        yield base / "secret.txt"
    finally:
        shutil.rmtree(base, ignore_errors=True)


# --- the SDK's contract -----------------------------------------------------------------------

async def test_create_with_default_options_runs_and_deletes_its_root() -> None:
    client = HcpSandboxClient()
    session = await client.create()
    root = Path(session._inner.state.manifest.root)
    async with session:
        r = await session.exec("echo out; echo err >&2; exit 3")
        assert (r.exit_code, r.stdout, r.stderr) == (3, b"out\n", b"err\n")
        r = await session.exec("printf", "%s|", "a b", "c", shell=False)
        assert r.stdout == b"a b|c|"
        assert (await session.exec("pwd")).stdout.decode().strip() == str(root)
    await client.delete(session)
    assert not root.exists()


async def test_manifest_root_is_kept_and_is_the_working_directory(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "given.txt").write_text("from the host\n")
    client = HcpSandboxClient()
    session = await client.create(manifest=Manifest(root=str(root)))
    async with session:
        assert (await session.exec("cat given.txt")).stdout == b"from the host\n"
        await session.write(Path("sub/new.txt"), io.BytesIO(b"written"))
        assert (await session.read(Path("sub/new.txt"))).read() == b"written"
        assert (await session.exec("cat sub/new.txt")).stdout == b"written"
    await client.delete(session)
    assert (root / "sub" / "new.txt").read_bytes() == b"written"  # not owned: kept


async def test_manifest_environment_reaches_commands() -> None:
    client = HcpSandboxClient()
    session = await client.create(manifest=Manifest(environment=Environment(
        value={"GREETING": "hello"})))
    async with session:
        assert (await session.exec("echo $GREETING")).stdout == b"hello\n"
    await client.delete(session)


async def test_timeout_kills_the_tree() -> None:
    client = HcpSandboxClient()
    session = await client.create()
    async with session:
        with pytest.raises(ExecTimeoutError):
            await session.exec("sleep 30 & sleep 30", timeout=1)
        ps = await session.exec("ps -eo args | grep '[s]leep 30' || true")
        assert ps.stdout == b"", ps
    await client.delete(session)


async def test_host_path_grant_refused_and_grants_map_to_roots(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="host_path"):
        await HcpSandboxClient().create(manifest=Manifest(extra_path_grants=(
            SandboxPathGrant(path=str(tmp_path), host_path="/etc"),)))
    ro = tmp_path / "ro"
    ro.mkdir()
    (ro / "f.txt").write_text("granted\n")
    client = HcpSandboxClient()
    session = await client.create(manifest=Manifest(extra_path_grants=(
        SandboxPathGrant(path=str(ro), read_only=True),)))
    async with session:
        assert (await session.exec(f"cat {ro}/f.txt")).stdout == b"granted\n"
        r = await session.exec(f"touch {ro}/new")
        assert r.exit_code != 0 and not (ro / "new").exists()
    await client.delete(session)


# --- confinement, with the SDK's own local client as the control ------------------------------

@pytest.mark.parametrize("client_type", [HcpSandboxClient, UnixLocalSandboxClient])
async def test_attacks(client_type: type, secret: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HCP_FW_HOST_TOKEN", "sk-host-secret")
    client = client_type()
    session = await client.create()
    confined = client_type is HcpSandboxClient
    async with session:
        r = await session.exec(f"cat {secret}")
        assert (b"host secret" in r.stdout) is not confined, r
        r = await session.exec("echo ${HCP_FW_HOST_TOKEN:-none}")
        assert (r.stdout == b"none\n") is confined, r  # the host's environment
        r = await session.exec("cut -d: -f1 /proc/net/dev | tail -n +3 | tr -d ' '")
        assert (r.stdout.split() == [b"lo"]) is confined, r
        r = await session.exec("echo ${HCP_SANDBOX:-unset}")
        assert (r.stdout == b"sandbox\n") is confined, r
        assert session._inner.supports_pty() is not confined
    await client.delete(session)


# --- ported from the SDK's tests/sandbox/test_unix_local*.py ----------------------------------
# The checks of its local client that apply to a Linux client confined by hcp-linux, run
# against HcpSandboxSession. Not ported: the pty tests (no pty here), the macOS sandbox-exec
# ones, the host-environment inheritance ones (inheriting the host's environment is what this
# client refuses: test_attacks), and those that patch os.open in this process (file I/O
# happens in the box, not here).

def _session(root: Path) -> HcpSandboxSession:
    return HcpSandboxSession(state=UnixLocalSandboxSessionState(
        manifest=Manifest(root=str(root)), snapshot=NoopSnapshot(id="file-io")))


async def _operate(session: HcpSandboxSession, operation: str, path: Path) -> object:
    if operation == "read":
        with await session.read(path) as stream:
            return stream.read()
    await session.write(path, io.BytesIO(b"new"))
    return None


FILE_ERRORS = (OSError, WorkspaceArchiveReadError, WorkspaceArchiveWriteError,
               WorkspaceReadNotFoundError, InvalidManifestPathError)


@pytest.mark.parametrize("operation", ["read", "write"])
async def test_parent_swap_after_validation_cannot_access_outside(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, operation: str) -> None:
    workspace, outside = tmp_path / "workspace", tmp_path / "outside"
    parent = workspace / "parent"
    parent.mkdir(parents=True)
    outside.mkdir()
    for root in (parent, outside):
        (root / "target").write_bytes(b"original content")
    session = _session(workspace)
    normalize = session.normalize_path
    swapped = False

    def swap(path: Path | str, *, for_write: bool = False) -> Path:
        nonlocal swapped
        result = normalize(path, for_write=for_write)
        if not swapped:
            swapped = True
            parent.rename(workspace / "original")
            parent.symlink_to(outside, target_is_directory=True)
        return result

    monkeypatch.setattr(session, "normalize_path", swap)
    try:
        with pytest.raises(FILE_ERRORS):
            await _operate(session, operation, Path("parent/target"))
    finally:
        await session._after_shutdown()
    assert swapped
    assert (outside / "target").read_bytes() == b"original content"


@pytest.mark.parametrize("operation", ["read", "write"])
async def test_leaf_swap_does_not_follow_new_symlink(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, operation: str) -> None:
    workspace, outside = tmp_path / "workspace", tmp_path / "outside"
    workspace.mkdir()
    target = workspace / "target"
    for path in (target, outside):
        path.write_bytes(b"original content")
    session = _session(workspace)
    normalize = session.normalize_path

    def swap(path: Path | str, *, for_write: bool = False) -> Path:
        result = normalize(path, for_write=for_write)
        target.rename(workspace / "original")
        target.symlink_to(outside)
        return result

    monkeypatch.setattr(session, "normalize_path", swap)
    try:
        with pytest.raises(FILE_ERRORS):
            await _operate(session, operation, Path("target"))
    finally:
        await session._after_shutdown()
    assert outside.read_bytes() == b"original content"


async def test_root_replacement_cannot_reauthorize_an_outside_directory(tmp_path: Path) -> None:
    root, outside = tmp_path / "workspace", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "file").write_bytes(b"original content")
    session = _session(root)
    root.rename(tmp_path / "original")
    root.symlink_to(outside, target_is_directory=True)
    with pytest.raises(InvalidManifestPathError):
        await session.write(Path("file"), io.BytesIO(b"new"))
    assert (outside / "file").read_bytes() == b"original content"


async def test_manifest_environment_and_home(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "host-secret")
    workspace = tmp_path / "workspace"
    manifest = Manifest(root=str(workspace), environment=Environment(value={
        "LC_CTYPE": "POSIX", "MANIFEST_ONLY": "configured"}))
    client = HcpSandboxClient()
    async with await client.create(manifest=manifest, snapshot=None, options=None) as session:
        r = await session.exec("sh", "-c", "printf '%s|%s|%s|%s|%s' "
                               '"${OPENAI_API_KEY-unset}" "$MANIFEST_ONLY" "$HOME" '
                               '"${PATH:+set}" "$LC_CTYPE"', shell=False)
    assert r.exit_code == 0
    # the SDK's local client gives "host-secret" for the first: the host's environment
    assert r.stdout.decode() == f"unset|configured|{workspace}|set|POSIX"


async def test_rejects_host_path_before_creating_workspace(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def unexpected(*args: object, **kwargs: object) -> str:
        raise AssertionError(f"unexpected mkdtemp call: {args!r} {kwargs!r}")

    monkeypatch.setattr("agents.sandbox.sandboxes.unix_local.tempfile.mkdtemp", unexpected)
    with pytest.raises(ValueError, match="does not support sandbox path grant host_path"):
        await HcpSandboxClient().create(manifest=Manifest(extra_path_grants=(
            SandboxPathGrant(path="/mnt/shared-data", host_path=str(tmp_path)),)),
            snapshot=None, options=None)
