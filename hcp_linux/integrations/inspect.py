"""hcp-linux as an Inspect AI sandbox (``pip install 'hcp-linux[inspect]'``):
``Task(..., sandbox="hcp-linux")``.

Inspect finds providers through its ``inspect_ai`` entry point, which hcp-linux's
pyproject.toml points at this module: importing it registers :class:`HcpLinuxSandbox` under
the name ``hcp-linux``, so a task needs no import of ours. Each sample gets a
:class:`~hcp_linux.integrations.box.Box`: a fresh jail (removed at the sample's cleanup) and
a session in it, under the policy the task's sandbox config names (:class:`HcpLinuxConfig`,
or a policy TOML path, or nothing: the default Policy, network none).

What Inspect's contract asks and what it becomes (docs/frameworks.md):

- ``exec``: a command in the sample's session; ``input`` on stdin, ``env`` granted over the
  policy's (checked as a policy's is), ``cwd`` relative to the jail; ``timeout`` kills the
  command and everything it started and raises ``TimeoutError``; a stream past Inspect's
  ``MAX_EXEC_OUTPUT_SIZE`` raises ``OutputLimitExceededError``; a command the policy refuses
  (not on the allow-list, not executable) raises ``PermissionError``, one not found is a
  failed result with status 127. ``user``: only the runtime's own user (as Inspect's
  ``local``): any other raises ``SandboxUserUnsupportedError`` (no capability in the sandbox).
- ``read_file`` / ``write_file``: by a command in the sample's box (hcp_linux.integrations.box):
  the sandbox's own view and credentials; Inspect's ``MAX_READ_FILE_SIZE`` is checked in there
  before anything is read.
- ``connection``: not offered (nothing can attach to a session from outside).

Nothing else in hcp_linux imports this module or Inspect.
"""
from __future__ import annotations

import functools
import os
from typing import Any, Literal, Union, overload

# Each framework import is ignored when it is absent: `mypy -p hcp_linux` runs without the
# extras (as for hcp_linux.ray).
import anyio  # type: ignore[import-not-found, unused-ignore]
from pydantic import BaseModel, ConfigDict  # type: ignore[import-not-found, unused-ignore]
from inspect_ai.util import (  # type: ignore[import-not-found, unused-ignore]
    ExecResult, OutputLimitExceededError, SandboxEnvironment, SandboxEnvironmentConfigType,
    SandboxEnvironmentLimits, SandboxUserUnsupportedError, sandboxenv)

from ..errors import (BinNotExecutableError, BinNotFoundError, NotAllowlistedError,
                      PolicyError)
from ..jails.workspace import sweep_jails
from ..policy import values
from ..policy.policy import Policy
from ..policy.resolve import resolve
from ..session import SessionEnded
from .box import Box, FileTooLargeError

__all__ = ["HcpLinuxSandbox", "HcpLinuxConfig", "policy_of"]


class HcpLinuxConfig(BaseModel):
    """A task's ``sandbox=("hcp-linux", HcpLinuxConfig(...))``.

    ``policy``: a policy TOML file's path, or a table of Policy fields as the TOML has them
    (``network``, ``allow_hosts``, ``write_roots``, ``read_only_roots``, ``allow_bins``,
    ``env``, ``limits``, ``timeout``...); not ``jail``, which is the sample's own.
    ``session``: commands of a sample share one lasting confinement (default) or each get one
    of their own. ``jail_root``: where the samples' jails are made (default the temp dir).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    policy: Union[str, dict[str, Any], None] = None
    session: bool = True
    jail_root: Union[str, None] = None
    executor: Union[str, None] = None

    def __hash__(self) -> int:  # Inspect keys its task setup by config; a dict is unhashable
        return hash(self.model_dump_json())


def _config(config: SandboxEnvironmentConfigType | None) -> HcpLinuxConfig:
    if config is None:
        return HcpLinuxConfig()
    if isinstance(config, str):
        return HcpLinuxConfig(policy=config)
    if isinstance(config, HcpLinuxConfig):
        return config
    if isinstance(config, BaseModel):
        return HcpLinuxConfig(**config.model_dump())
    raise TypeError(f"hcp-linux sandbox config: expected a policy TOML path or an "
                    f"HcpLinuxConfig, got {type(config).__name__}")


def policy_of(config: HcpLinuxConfig) -> Policy:
    """The Policy a config names (its ``jail`` is left to each sample's box)."""
    source = config.policy
    if source is None:
        return Policy()
    if isinstance(source, str):
        text = values.file_name(source, "policy file")
        name = f"policy file {text}"
        data = values.parse_document(values.read_document(text, name), name, "toml")
    else:
        data, name = source, "hcp-linux sandbox config"
    if isinstance(data, dict) and "jail" in data:
        raise PolicyError(f"{name}: jail: each sample has a jail of its own; remove the key")
    # checked on this host now, before any sample's jail is made (resolved again per box)
    return resolve(Policy.from_mapping(data, source=name))


@sandboxenv(name="hcp-linux")
class HcpLinuxSandbox(SandboxEnvironment):
    """One sample's sandbox: a :class:`Box` (a fresh jail, a session in it)."""

    def __init__(self, box: Box) -> None:
        super().__init__()
        self.box = box

    # --- lifecycle ---------------------------------------------------------------------------

    @classmethod
    async def task_init(cls, task_name: str,
                        config: SandboxEnvironmentConfigType | None) -> None:
        policy_of(_config(config))  # a bad config fails the task once, before any sample

    @classmethod
    async def sample_init(cls, task_name: str, config: SandboxEnvironmentConfigType | None,
                          metadata: dict[str, str]) -> dict[str, SandboxEnvironment]:
        cfg = _config(config)
        box = await anyio.to_thread.run_sync(functools.partial(
            Box, policy_of(cfg), jail_root=cfg.jail_root, executor=cfg.executor,
            session=cfg.session))
        box.warm()  # the session starts while Inspect sets the sample up and asks the model
        return {"default": cls(box)}

    @classmethod
    async def sample_cleanup(cls, task_name: str, config: SandboxEnvironmentConfigType | None,
                             environments: dict[str, SandboxEnvironment],
                             interrupted: bool) -> None:
        for env in environments.values():
            await anyio.to_thread.run_sync(env.as_type(HcpLinuxSandbox).box.close)

    @classmethod
    async def cli_cleanup(cls, id: str | None) -> None:
        """``inspect sandbox cleanup hcp-linux``: remove the jails of runtimes that are gone
        (in the temp dir)."""
        sweep_jails()

    @classmethod
    def config_deserialize(cls, config: dict[str, Any]) -> BaseModel:
        return HcpLinuxConfig(**config)

    def default_polling_interval(self) -> float:
        return 0.2

    # --- commands ----------------------------------------------------------------------------

    async def exec(self, cmd: list[str], input: str | bytes | None = None,
                   cwd: str | None = None, env: dict[str, str] | None = None,
                   user: str | None = None, timeout: int | None = None,
                   timeout_retry: bool = True, concurrency: bool = True) -> ExecResult[str]:
        if user is not None and not _is_current_user(user):
            raise SandboxUserUnsupportedError(
                f"hcp-linux cannot run a command as {user!r}: commands run as the runtime's "
                "own user, mapped into the sandbox's user namespace, with no capability")
        data = input.encode("utf-8") if isinstance(input, str) else input
        cap = SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE
        try:
            r = await anyio.to_thread.run_sync(functools.partial(
                self.box.run, cmd, input=data, env=env, cwd=cwd, timeout=timeout,
                output_cap=cap))
        except BinNotFoundError as e:
            return ExecResult(success=False, returncode=127, stdout="", stderr=f"{e}\n")
        except SessionEnded as e:
            if self.box.closed:
                raise
            # a command killed the sample's session (its zygote): that command's failure;
            # the next one starts a new session (same jail, a new /tmp)
            return ExecResult(success=False, returncode=137, stdout="",
                              stderr=f"hcp-linux: {e}; the next command starts a new one\n")
        except (NotAllowlistedError, BinNotExecutableError, PolicyError) as e:
            raise PermissionError(f"hcp-linux refused {cmd[:1]}: {e}") from e
        if r.timed_out:
            raise TimeoutError(f"command timed out after {timeout} s (killed, with every "
                               "process it started)")
        stdout = r.stdout.decode("utf-8", "replace")
        if r.truncated:
            raise OutputLimitExceededError(SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE_STR,
                                           truncated_output=stdout)
        return ExecResult(success=r.returncode == 0, returncode=r.returncode, stdout=stdout,
                          stderr=r.stderr.decode("utf-8", "replace"))

    # --- files -------------------------------------------------------------------------------

    async def write_file(self, file: str, contents: str | bytes) -> None:
        data = contents.encode("utf-8") if isinstance(contents, str) else contents
        await anyio.to_thread.run_sync(self.box.write, file, data)

    @overload
    async def read_file(self, file: str, text: Literal[True] = True) -> str: ...

    @overload
    async def read_file(self, file: str, text: Literal[False]) -> bytes: ...

    async def read_file(self, file: str, text: bool = True) -> Union[str, bytes]:
        try:
            data = await anyio.to_thread.run_sync(
                self.box.read, file, SandboxEnvironmentLimits.MAX_READ_FILE_SIZE)
        except FileTooLargeError:
            raise OutputLimitExceededError(SandboxEnvironmentLimits.MAX_READ_FILE_SIZE_STR,
                                           truncated_output=None) from None
        # newline="" as Inspect asks: bytes decoded, line ends kept as they are
        return data.decode("utf-8") if text else data


def _is_current_user(user: str) -> bool:
    """``user`` names (or numbers) the runtime's own effective user: the one every command
    runs as (mapped into the sandbox's user namespace)."""
    import pwd
    try:
        uid = int(user) if user.isdecimal() else pwd.getpwnam(user).pw_uid
    except KeyError:
        return False
    return uid == os.geteuid()
