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

from agents.sandbox.errors import ExecTimeoutError  # noqa: E402
from agents.sandbox.manifest import Environment, Manifest  # noqa: E402
from agents.sandbox.sandboxes.unix_local import UnixLocalSandboxClient  # noqa: E402
from agents.sandbox.workspace_paths import SandboxPathGrant  # noqa: E402

from hcp_linux.integrations.openai_agents import HcpSandboxClient  # noqa: E402

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
