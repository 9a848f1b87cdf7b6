"""hcp-linux as an Inspect AI sandbox (hcp_linux.integrations.inspect), against Inspect itself.

Inspect's own portable contract, ``inspect_ai.util._sandbox.self_check`` (44 checks), runs
against a sample's sandbox, each check xfailed only where Inspect's own ``local`` provider
fails it too (Inspect's tests/tools/test_sandbox_docker_and_local.py lists those). Then
confinement by attack, each with Inspect's unconfined ``local`` as the control, and a real
``inspect eval`` (mockllm model, the bash() tool) in a fresh interpreter that never imports
hcp_linux: the provider is found through the entry point.

Skipped, with the reason printed, when Inspect is not installed (the main venv):
scripts/test-frameworks installs the pinned version in a venv of its own.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import AsyncIterator, Iterator

import pytest

pytest.importorskip("inspect_ai", reason="Inspect AI is not installed: scripts/test-frameworks "
                    "runs these tests in a venv of its own")

from inspect_ai.util import SandboxEnvironment, SandboxUserUnsupportedError  # noqa: E402
from inspect_ai.util._sandbox.local import LocalSandboxEnvironment  # noqa: E402
from inspect_ai.util._sandbox.self_check import *  # noqa: E402, F401, F403

from hcp_linux.integrations.inspect import HcpLinuxConfig, HcpLinuxSandbox  # noqa: E402

pytestmark = pytest.mark.anyio
IS_ROOT = os.geteuid() == 0

#: The checks Inspect's own ``local`` provider fails too, and why ours does.
XFAILS = {
    "test_exec_as_user": (
        "no other user: every command runs as the runtime's user with no capability (adduser "
        "cannot run); Inspect's local xfails it too ('local sandbox ignores the user= "
        "parameter')"),
}


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def _sample() -> AsyncIterator[HcpLinuxSandbox]:
    """One sample's sandbox shared by the checks (as Inspect's runner shares one per
    provider; each check cleans up after itself)."""
    config = HcpLinuxConfig()
    await HcpLinuxSandbox.task_init("self_check", config)
    envs = await HcpLinuxSandbox.sample_init("self_check", config, {})
    env = envs["default"].as_type(HcpLinuxSandbox)
    try:
        yield env
    finally:
        await HcpLinuxSandbox.sample_cleanup("self_check", config, envs, False)
        assert not os.path.exists(env.box.jail), "the sample's jail outlived its cleanup"


@pytest.fixture
def sandbox_env(request: pytest.FixtureRequest, _sample: HcpLinuxSandbox) -> SandboxEnvironment:
    reason = XFAILS.get(request.node.originalname)
    if reason is not None:
        request.node.add_marker(pytest.mark.xfail(reason=reason, strict=True))
    return _sample


# --- confinement, each with Inspect's local provider as the control -------------------------

@pytest.fixture
def secret() -> Iterator[Path]:
    """A host file outside every root of the sandbox (/var/tmp is not in its view; /tmp is
    its private one), readable by the runtime's user."""
    base = Path(tempfile.mkdtemp(prefix="hcp-fw-secret-", dir="/var/tmp"))
    os.chmod(base, 0o755)
    f = base / "secret.txt"
    f.write_text("host secret\n")
    os.chmod(f, 0o644)
    try:
        yield f
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
async def pair() -> AsyncIterator[tuple[SandboxEnvironment, SandboxEnvironment]]:
    """(hcp-linux, local): one sample of each."""
    ours = await HcpLinuxSandbox.sample_init("attack", None, {})
    theirs = await LocalSandboxEnvironment.sample_init("attack", None, {})
    try:
        yield ours["default"], theirs["default"]
    finally:
        await HcpLinuxSandbox.sample_cleanup("attack", None, ours, False)
        await LocalSandboxEnvironment.sample_cleanup("attack", None, theirs, False)


async def test_host_file_outside_the_jail(pair, secret: Path) -> None:
    ours, local = pair
    r = await local.exec(["cat", str(secret)])
    assert r.stdout == "host secret\n"  # the control: local reads it
    r = await ours.exec(["cat", str(secret)])
    assert not r.success and "host secret" not in r.stdout, r
    with pytest.raises(FileNotFoundError):
        await ours.read_file(str(secret))


async def test_symlink_planted_in_the_jail(pair, secret: Path) -> None:
    """read_file of a link the agent made to a host file: local follows it out; ours
    resolves it in the sandbox's view, where the target is not."""
    ours, local = pair
    for env in pair:
        assert (await env.exec(["ln", "-s", str(secret), "link"])).success
    assert await local.read_file("link") == "host secret\n"
    with pytest.raises(FileNotFoundError):
        await ours.read_file("link")
    # writing through it does not reach the host file either
    with pytest.raises(OSError):
        await ours.write_file("link", "overwritten")
    assert secret.read_text() == "host secret\n"


async def test_marker_network_and_user(pair) -> None:
    ours, local = pair
    r = await ours.exec(["sh", "-c", "echo $HCP_SANDBOX; cut -d: -f1 /proc/net/dev | "
                                     "tail -n +3 | tr -d ' '"])
    assert r.stdout.split() == ["sandbox", "lo"], r  # the marker; no interface but loopback
    r = await local.exec(["sh", "-c", "echo ${HCP_SANDBOX:-unset}"])
    assert r.stdout.strip() == "unset"
    with pytest.raises(SandboxUserUnsupportedError):
        await ours.exec(["id"], user="nobody" if IS_ROOT else "root")


async def test_allow_list_refusal_is_a_permission_error() -> None:
    config = HcpLinuxConfig(policy={"allow_bins": ["sh", "cat"]})
    envs = await HcpLinuxSandbox.sample_init("allow", config, {})
    env = envs["default"]
    try:
        assert (await env.exec(["cat"], input="hi")).stdout == "hi"
        with pytest.raises(PermissionError):
            await env.exec(["id"])
        # the file helper is ours: the allow-list is not asked about it
        await env.write_file("f.txt", "x")
        assert await env.read_file("f.txt") == "x"
    finally:
        await HcpLinuxSandbox.sample_cleanup("allow", config, envs, False)


# --- a real eval ------------------------------------------------------------------------------

EVAL = r'''
import json, sys
from inspect_ai import Task, eval
from inspect_ai.dataset import Sample
from inspect_ai.model import ModelOutput, ModelUsage, get_model
from inspect_ai.solver import generate, use_tools
from inspect_ai.tool import bash

sandbox, secret, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
cmd = ("echo marker=${HCP_SANDBOX:-unset}; "
       "echo ifaces=$(cut -d: -f1 /proc/net/dev | tail -n +3 | tr -d ' ' | tr '\n' ,); "
       f"cat {secret} 2>&1 | head -1")
outputs = []
for _ in range(n):
    outputs += [ModelOutput.for_tool_call("mockllm/model", "bash", {"command": cmd}),
                ModelOutput.from_content("mockllm/model", "done")]
for o in outputs:  # else mockllm counts tokens with tiktoken, which downloads its tables
    o.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
model = get_model("mockllm/model", custom_outputs=outputs)
task = Task(dataset=[Sample(input=f"sample {i}") for i in range(n)],
            solver=[use_tools(bash(timeout=30)), generate()], sandbox=sandbox)
log = eval(task, model=model, log_dir=sys.argv[4], display="none", max_samples=1)[0]
tools = [m.text for s in log.samples for m in s.messages if m.role == "tool"]
print(json.dumps({"status": log.status, "tools": tools,
                  "hcp_linux_imported": "hcp_linux" in sys.modules
                  and "hcp_linux.integrations.inspect" in sys.modules}))
'''


def _eval(sandbox: str, secret: Path, tmp: Path, n: int = 2) -> dict:
    script = tmp / "eval_task.py"
    script.write_text(EVAL)
    r = subprocess.run([sys.executable, str(script), sandbox, str(secret), str(n),
                        str(tmp / f"logs-{sandbox}")], capture_output=True, text=True,
                       timeout=300, cwd=tmp, env={**os.environ, "INSPECT_LOG_LEVEL": "warning"})
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_inspect_eval_with_bash_runs_confined(secret: Path, tmp_path: Path) -> None:
    """`eval` of a task with sandbox="hcp-linux", the mockllm model calling bash(): the task's
    script never imports hcp_linux (the entry point does); each tool call ran confined."""
    os.chmod(tmp_path, 0o755)
    ours = _eval("hcp-linux", secret, tmp_path)
    assert ours["status"] == "success" and len(ours["tools"]) == 2, ours
    assert ours["hcp_linux_imported"], "the provider was not loaded through the entry point"
    for out in ours["tools"]:
        assert "marker=sandbox" in out and "ifaces=lo," in out, out
        assert "host secret" not in out and "No such file" in out, out
    local = _eval("local", secret, tmp_path)  # the control
    assert local["status"] == "success" and len(local["tools"]) == 2, local
    for out in local["tools"]:
        assert "marker=unset" in out and "host secret" in out, out


def test_import_hcp_linux_does_not_load_inspect() -> None:
    code = ("import sys, hcp_linux; hcp_linux.Policy; import hcp_linux.integrations; "
            "print(sorted(m for m in sys.modules if m.startswith(('inspect_ai', 'agents'))))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "[]", (r.stdout, r.stderr)


async def test_a_killed_session_fails_one_command_and_is_replaced() -> None:
    """The sample's session ends under a running command (its zygote killed, as a command
    can do through its own thread): that command fails, the next starts a new session in
    the same jail."""
    import anyio
    import signal
    envs = await HcpLinuxSandbox.sample_init("killed", None, {})
    env = envs["default"].as_type(HcpLinuxSandbox)
    try:
        await env.write_file("kept.txt", "jail content")
        session = env.box._session
        assert session is not None and session.zygote_pid is not None

        async def kill_soon() -> None:
            await anyio.sleep(0.5)
            os.kill(session.zygote_pid, signal.SIGKILL)

        async with anyio.create_task_group() as tg:
            tg.start_soon(kill_soon)
            r = await env.exec(["sleep", "10"], timeout=20)
        assert not r.success and "session" in r.stderr, r
        assert await env.read_file("kept.txt") == "jail content"
        assert env.box.restarts == 1
    finally:
        await HcpLinuxSandbox.sample_cleanup("killed", None, envs, False)


async def test_a_confinement_per_command() -> None:
    """HcpLinuxConfig(session=False): no session; each command (and file operation) is a
    confinement of its own, which shares the jail and nothing else (not /tmp)."""
    config = HcpLinuxConfig(session=False)
    envs = await HcpLinuxSandbox.sample_init("per-command", config, {})
    env = envs["default"].as_type(HcpLinuxSandbox)
    try:
        await env.write_file("f.txt", "in the jail\n")
        r = await env.exec(["sh", "-c", "cat f.txt; echo x > /tmp/t; echo $HCP_SANDBOX"],
                           input="ignored")
        assert r.stdout == "in the jail\nsandbox\n", r
        assert not (await env.exec(["cat", "/tmp/t"])).success  # a /tmp of its own
        assert env.box._session is None and env.box.exec.startswith("per-command")
        with pytest.raises(TimeoutError):
            await env.exec(["sleep", "5"], timeout=1)
    finally:
        await HcpLinuxSandbox.sample_cleanup("per-command", config, envs, False)


async def test_configs_a_policy_file_and_a_table(tmp_path: Path) -> None:
    """sandbox=("hcp-linux", "policy.toml") and ("hcp-linux", HcpLinuxConfig(policy={...})):
    both name a Policy (hashable, as Inspect keys task setup by config); a `jail` key is
    refused by name (each sample has a jail of its own)."""
    toml = tmp_path / "policy.toml"
    toml.write_text('[env]\nGREETING = "from the file"\n')
    table = HcpLinuxConfig(policy={"env": {"GREETING": "from the table"}})
    hash(table)
    for config, said in ((str(toml), "from the file"), (table, "from the table")):
        envs = await HcpLinuxSandbox.sample_init("config", config, {})
        try:
            r = await envs["default"].exec(["sh", "-c", "echo $GREETING"])
            assert r.stdout == said + "\n", r
        finally:
            await HcpLinuxSandbox.sample_cleanup("config", config, envs, False)
    toml.write_text(f'jail = "{tmp_path}"\n')
    for config in (str(toml), HcpLinuxConfig(policy={"jail": str(tmp_path)})):
        with pytest.raises(ValueError, match="jail: each sample has a jail of its own"):
            await HcpLinuxSandbox.task_init("config", config)
