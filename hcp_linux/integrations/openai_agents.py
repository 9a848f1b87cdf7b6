"""hcp-linux as a sandbox client of the OpenAI Agents SDK (``pip install
'hcp-linux[openai-agents]'``): ``HcpSandboxClient()`` where ``UnixLocalSandboxClient()`` was.

The SDK's ``UnixLocalSandboxClient`` runs an agent's commands on the host: its own docs say
that on Linux it adds no OS-level confinement. :class:`HcpSandboxClient` makes the same
sessions (its session is a ``UnixLocalSandboxSession``: the manifest's workspace on the host,
the SDK's own path policy, snapshots, manifest application) and changes what crosses into
the host:

- every ``exec`` runs in the session's :class:`~hcp_linux.integrations.box.Box`, a lasting
  hcp-linux confinement whose jail is the manifest's root: namespaces, the read-only system
  roots, Landlock, seccomp, network per the policy (default none); ``timeout`` kills the
  whole tree and raises the SDK's ``ExecTimeoutError``. The command's environment is the
  manifest's ``environment`` over the policy's, never the host's (the local client passes
  the host's whole environment by default: API keys included).
- pty exec is not offered (``supports_pty()`` is False): the SDK's tools then use ``exec``.
- ``read``/``write`` (and so manifest entries, which are written through them) go through
  the box: a helper in the confinement reads or writes, in the sandbox's own view, walking
  the path the SDK resolved with ``O_NOFOLLOW`` (a link swapped in since is refused); the
  box is made only on the root the session was created on. ``ls``, ``mkdir``, ``rm``,
  ``mv`` stay the SDK's own host-side operations, behind its path policy.
- the manifest: ``root`` is the jail (a fresh temp directory, removed at ``delete``, when
  the manifest keeps the SDK's default root); ``extra_path_grants`` become ``write_roots``
  or ``read_only_roots``; ``host_path`` grants, ``users`` and ``groups`` are refused (by the
  SDK's own checks, by name), as the local client refuses them.

Nothing else in hcp_linux imports this module or the SDK.
"""
from __future__ import annotations

import asyncio
import dataclasses
import functools
import io
import os
import tempfile
import uuid
from pathlib import Path
from typing import Any

# Each SDK import is ignored when it is absent: `mypy -p hcp_linux` runs without the extras.
from agents.sandbox.errors import (  # type: ignore[import-not-found, unused-ignore]
    ExecTimeoutError, ExecTransportError, InvalidManifestPathError, WorkspaceArchiveReadError,
    WorkspaceArchiveWriteError, WorkspaceReadNotFoundError)
from agents.sandbox.manifest import Manifest  # type: ignore[import-not-found, unused-ignore]
from agents.sandbox.sandboxes import unix_local  # type: ignore[import-not-found, unused-ignore]
from agents.sandbox.sandboxes.unix_local import (  # type: ignore[import-not-found, unused-ignore]
    UnixLocalSandboxClient, UnixLocalSandboxClientOptions, UnixLocalSandboxSession,
    UnixLocalSandboxSessionState)
from agents.sandbox.session import sandbox_session  # type: ignore[import-not-found, unused-ignore]
from agents.sandbox.snapshot import (  # type: ignore[import-not-found, unused-ignore]
    SnapshotBase, SnapshotSpec, resolve_snapshot)
from agents.sandbox.types import ExecResult, User  # type: ignore[import-not-found, unused-ignore]

from ..errors import BinNotFoundError, SandboxError
from ..policy.policy import Policy
from ..policy.resolve import resolve
from .box import Box

__all__ = ["HcpSandboxClient", "HcpSandboxSession", "policy_for"]


def policy_for(manifest: Manifest, policy: Policy) -> Policy:
    """``policy`` with the manifest's root as its jail and its path grants as roots."""
    writable = [g.path for g in manifest.extra_path_grants if not g.read_only]
    read_only = [g.path for g in manifest.extra_path_grants if g.read_only]
    return dataclasses.replace(
        policy, jail=str(manifest.root),
        write_roots=tuple(policy.write_roots) + tuple(writable),
        read_only_roots=tuple(policy.read_only_roots) + tuple(read_only))


class HcpSandboxSession(UnixLocalSandboxSession):
    """A ``UnixLocalSandboxSession`` whose commands and file reads and writes are confined
    by hcp-linux (one :class:`Box` per session, made at the first command)."""

    def __init__(self, *, state: UnixLocalSandboxSessionState,
                 policy: Policy | None = None) -> None:
        super().__init__(state=state)
        self._hcp_policy = policy if policy is not None else Policy()
        self._hcp_box: Box | None = None
        # the root's identity when the session was made (None: not there yet): the box is
        # made only on that directory, never on whatever replaced it since (a symlink to
        # elsewhere), as the local client pins its root
        self._hcp_root: tuple[int, int] | None = _identity(str(state.manifest.root))
        # nothing of the host's environment reaches a command (the local client's default
        # passes all of it); the manifest's environment does
        self._host_environment_allowlist: frozenset[str] = frozenset()

    def _box(self) -> Box:
        if self._hcp_box is None or self._hcp_box.closed:
            root = str(self.state.manifest.root)
            now = _identity(root)
            if now is None or (self._hcp_root is not None and now != self._hcp_root):
                raise InvalidManifestPathError(rel=root, reason="escape_root", context={
                    "why": "the workspace root is not the directory the session was made "
                           "on (missing, a symlink, or replaced)"})
            self._hcp_root = now
            self._hcp_box = Box(policy_for(self.state.manifest, self._hcp_policy), jail=root)
        return self._hcp_box

    async def _after_start(self) -> None:
        await super()._after_start()
        box = await asyncio.to_thread(self._box)  # the root exists now
        box.warm()  # the session starts while the agent asks its model

    def supports_pty(self) -> bool:
        return False  # the SDK's tools fall back to exec, which is confined

    async def _exec_internal(self, *command: str | Path,
                             timeout: float | None = None) -> ExecResult:
        argv = [str(c) for c in command]
        env = await self.state.manifest.environment.resolve()
        env["HOME"] = str(self.state.manifest.root)
        try:
            box = await asyncio.to_thread(self._box)
            r = await asyncio.to_thread(functools.partial(box.run, argv, env=env,
                                                          timeout=timeout))
        except BinNotFoundError as e:
            return ExecResult(stdout=b"", stderr=f"{e}\n".encode(), exit_code=127)
        except (SandboxError, OSError) as e:
            raise ExecTransportError(command=command, cause=e) from e
        if r.timed_out:
            raise ExecTimeoutError(command=command, timeout_s=timeout,
                                   cause=TimeoutError("killed with every process it started"))
        return ExecResult(stdout=r.stdout, stderr=r.stderr, exit_code=r.returncode)

    async def pty_exec_start(self, *command: str | Path, **kwargs: Any) -> Any:
        raise ExecTransportError(command=command, context={
            "reason": "hcp-linux offers no pty exec; use exec (confined)"})

    async def read(self, path: Path, *, user: str | User | None = None) -> io.IOBase:
        if user is not None:
            await self._check_read_with_exec(path, user=user)
        target = self.normalize_path(path)
        try:
            box = await asyncio.to_thread(self._box)
            # the SDK resolved the path (normalize_path): a link met now was swapped in since
            data = await asyncio.to_thread(functools.partial(box.read, str(target), 1 << 34,
                                                             follow=False))
        except FileNotFoundError as e:
            raise WorkspaceReadNotFoundError(path=path, cause=e) from e
        except InvalidManifestPathError:
            raise
        except (OSError, SandboxError) as e:
            raise WorkspaceArchiveReadError(path=path, cause=e) from e
        return io.BytesIO(data)

    async def write(self, path: Path, data: io.IOBase, *,
                    user: str | User | None = None) -> None:
        if user is not None:
            raise WorkspaceArchiveWriteError(path=path, cause=PermissionError(
                "hcp-linux runs every command as one user: no write as another"))
        payload = unix_local.coerce_write_payload(path=path, data=data)
        target = self.normalize_path(path, for_write=True)
        content = payload.stream.read()
        if isinstance(content, str):
            content = content.encode("utf-8")
        try:
            box = await asyncio.to_thread(self._box)
            await asyncio.to_thread(functools.partial(box.write, str(target), bytes(content),
                                                      follow=False))
        except InvalidManifestPathError:
            raise
        except (OSError, SandboxError) as e:
            raise WorkspaceArchiveWriteError(path=target, cause=e) from e

    async def _after_shutdown(self) -> None:
        await super()._after_shutdown()
        if self._hcp_box is not None:
            await asyncio.to_thread(self._hcp_box.close)


class HcpSandboxClient(UnixLocalSandboxClient):
    """The SDK's local client, with every command confined by hcp-linux under ``policy``
    (default: the default :class:`~hcp_linux.Policy`, network none)."""

    backend_id = "hcp_linux"

    def __init__(self, policy: Policy | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # checked on this host now, before any root is made (resolved again per session)
        self.policy = resolve(policy if policy is not None else Policy())

    def _session(self, state: UnixLocalSandboxSessionState) -> sandbox_session.SandboxSession:
        inner = HcpSandboxSession(state=state, policy=self.policy)
        return self._wrap_session(inner, instrumentation=self._instrumentation)

    async def create(self, *, snapshot: SnapshotSpec | SnapshotBase | None = None,
                     manifest: Manifest | None = None,
                     options: UnixLocalSandboxClientOptions | None = None
                     ) -> sandbox_session.SandboxSession:
        options = options if options is not None else UnixLocalSandboxClientOptions()
        manifest = manifest if manifest is not None else Manifest()
        unix_local._assert_unix_local_host_path_grants_unsupported(manifest)
        self._validate_manifest_for_create(manifest)
        owned = manifest.root == unix_local._DEFAULT_MANIFEST_ROOT
        if owned:
            root = tempfile.mkdtemp(prefix=unix_local._DEFAULT_WORKSPACE_PREFIX)
            manifest = manifest.model_copy(update={"root": root}, deep=True)
        if os.path.isdir(str(manifest.root)):
            policy_for(manifest, self.policy)  # a bad grant fails here, by name
        session_id = uuid.uuid4()
        state = UnixLocalSandboxSessionState(
            session_id=session_id, manifest=manifest,
            snapshot=resolve_snapshot(snapshot, str(session_id)),
            workspace_root_owned=owned, exposed_ports=options.exposed_ports)
        return self._session(state)

    async def resume(self, state: Any) -> sandbox_session.SandboxSession:
        if not isinstance(state, UnixLocalSandboxSessionState):
            raise TypeError("HcpSandboxClient.resume expects a UnixLocalSandboxSessionState")
        state.assert_path_grants_rebound()
        unix_local._assert_unix_local_host_path_grants_unsupported(state.manifest)
        return self._session(state)

    async def delete(self, session: sandbox_session.SandboxSession
                     ) -> sandbox_session.SandboxSession:
        inner = session._inner
        if isinstance(inner, HcpSandboxSession) and inner._hcp_box is not None:
            await asyncio.to_thread(inner._hcp_box.close)
        return await super().delete(session)


def _identity(path: str) -> tuple[int, int] | None:
    """(device, inode) of the directory at ``path``, not through a symlink; None if none."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        return st.st_dev, st.st_ino
    finally:
        os.close(fd)
