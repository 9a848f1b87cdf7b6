"""hcp-linux as the sandbox backend of a Ray cluster (``pip install 'hcp-linux[ray]'``).

Ray 2.60 ships ``ray.experimental.sandbox`` (alpha): a ``BaseSandboxBackend`` contract, a
``SandboxRuntime`` that drives one backend on the local node, and a ``Sandbox`` actor that
places a runtime on the cluster. Its only backend runs gVisor containers. This module gives
the same contract with hcp-linux underneath: a sandbox is a jail directory on the node where
it was created plus a :class:`~hcp_linux.Policy`, and every command is one confined run there
(milliseconds, not a container start).

Ray 2.60 has no way to choose a backend: ``SandboxRuntime.__init__`` builds a
``GVisorSandboxBackend`` and the ``Sandbox`` actor builds a ``SandboxRuntime``. So this module
provides, without editing Ray:

- :class:`HcpSandboxBackend`: the ``BaseSandboxBackend`` implementation.
- :class:`HcpSandboxRuntime`: a ``SandboxRuntime`` whose backend is the one above.
- :class:`HcpSandbox`: an actor with the method names of Ray's ``Sandbox`` actor, and
  :func:`create`, the counterpart of ``ray.experimental.sandbox.create`` that places it
  (``node_id=``: hard node affinity). The jail lives on that node; calls reach it through the
  actor; if the node dies the actor dies with it, and :func:`get` turns that into
  :class:`SandboxLostError` within a bounded wait.

What Ray's ``SandboxConfig`` asks that hcp-linux cannot do (an OCI image, cgroup quotas,
capabilities, a writable root) is refused with an error naming the field; what it maps is
listed by :meth:`HcpSandboxBackend.get_mapping`. docs/ray.md has the table.

This is the only module of hcp_linux that imports Ray; ``import hcp_linux`` never loads it.
"""
from __future__ import annotations

import atexit
import dataclasses
import os
import subprocess
import tempfile
import threading
import time
import uuid
from typing import Any, Dict, List, Optional, Union

# Each Ray import is ignored when Ray is absent: `mypy -p hcp_linux` runs without the extra.
import ray  # type: ignore[import-not-found, unused-ignore]
from ray.experimental.sandbox import (  # type: ignore[import-not-found, unused-ignore]
    BaseImageManager, BaseSandboxBackend, ExecResult, SandboxCreationError, SandboxError,
    SandboxExecError, SandboxNotFoundError, SandboxRuntime, SandboxStatus, SandboxTimeoutError)
from ray.experimental.sandbox.config import (  # type: ignore[import-not-found, unused-ignore]
    SandboxConfig, parse_memory_bytes)
from ray.util.scheduling_strategies import (  # type: ignore[import-not-found, unused-ignore]
    NodeAffinitySchedulingStrategy)

from .policy.policy import Policy
from .sandbox import Sandbox
from .policy.resolve import resolve
from .errors import SandboxError as HcpError
from .jails.jailfiles import open_jail, read_in, write_in
from .jails.locations import make_jail_home
from .jails.reclaim import jail_name
from .session import Session, SessionEnded
from .jails.workspace import remove_tree, sweep_jails

__all__ = ["HOST_IMAGE", "HcpSandboxBackend", "HcpSandboxRuntime", "HcpSandbox",
           "HostImageManager", "SandboxLostError", "create", "get", "check_config"]

#: The one "image" an hcp-linux sandbox has: the node's own programs, seen read-only through
#: the mount view (``Policy.system_roots``). Any other image is refused: nothing is pulled.
HOST_IMAGE = "host"

#: How long :meth:`HcpSandboxBackend.delete_sandbox` waits for a killed command to be reaped.
KILL_WAIT = 10.0

#: What ``get_mapping()["exec"]`` says of how commands run.
IN_SESSION = ("in the sandbox's session: one lasting confinement (namespaces, mount view, "
              "Landlock, seccomp) that each command is forked into; commands share its /tmp "
              "and background processes")
PER_COMMAND = "a confinement of its own per command (nothing shared but the jail)"


class SandboxLostError(SandboxNotFoundError):
    """The sandbox's actor is gone (its node died, or it was killed): the jail went with it."""


# --- what a SandboxConfig becomes ------------------------------------------------------------

def check_config(config: SandboxConfig, policy: Policy) -> Dict[str, str]:
    """Map Ray's ``SandboxConfig`` onto ``policy``: what each field became, by name.

    Raises :class:`SandboxCreationError` naming every field hcp-linux cannot honour, so that
    no field is silently ignored. Pure: no Ray call, no file touched (``create`` runs it on the
    caller's side, before placing anything).
    """
    refused: List[str] = []
    mapped: Dict[str, str] = {}
    if config.image != HOST_IMAGE:
        refused.append(f"image={config.image!r}: hcp-linux pulls no OCI image; it runs the "
                       f"node's own programs through a read-only mount view "
                       f"(image={HOST_IMAGE!r})")
    else:
        mapped["image"] = "the node's system roots, read-only: " + " ".join(policy.system_roots)
    if config.cpu and config.cpu > 0:
        refused.append(f"cpu={config.cpu}: a CPU quota needs cgroup v2, which hcp-linux does "
                       "not apply; reserve CPUs in Ray's scheduler instead (create(num_cpus=))")
    memory = parse_memory_bytes(config.memory)
    if memory and memory > 0:
        refused.append(f"memory={config.memory!r}: a memory quota needs cgroup v2, which "
                       "hcp-linux does not apply; Policy(limits={'as': ...}) caps address space")
    if config.workdir is not None:
        refused.append(f"workdir={config.workdir!r}: the working directory is the sandbox's "
                       "own jail, a fresh directory on the node (get_mapping()['workdir'])")
    if not config.rootless:
        refused.append("rootless=False: hcp-linux runs as the Ray worker's own user")
    if config.capabilities is not None:
        refused.append(f"capabilities={config.capabilities!r}: hcp-linux grants no capability "
                       "list; leave it None")
    if not config.readonly:
        refused.append("readonly=False: no writable copy-on-write root; the jail (and a private "
                       "/tmp) is what the command may write")
    if config._oci_spec_transform_fn is not None:
        refused.append("_oci_spec_transform_fn: there is no OCI spec to transform")
    wanted = {"none": ("none",), "host": ("host",), "public": ("allow",)}.get(config.network, ())
    if policy.network not in wanted:
        refused.append(f"network={config.network!r}: the Policy has network="
                       f"{policy.network!r}; give a Policy whose network is "
                       f"{' or '.join(map(repr, wanted)) or 'one of none/host/allow'}")
    elif config.network == "public":
        mapped["network"] = ("'allow': egress only through hcp-linux's proxy, to the Policy's "
                             f"allow_hosts {list(policy.allow_hosts)}")
    else:
        mapped["network"] = repr(policy.network)
    if config.dns is not None:
        refused.append(f"dns={config.dns!r}: no resolv.conf is generated ('host' uses the "
                       "node's, 'allow' resolves at the proxy)")
    if refused:
        raise SandboxCreationError("hcp-linux cannot honour this sandbox config:\n  "
                                   + "\n  ".join(refused))
    mapped["env"] = f"Policy.env plus {sorted(config.env)}"
    mapped["shell"] = (f"{config.shell} -c COMMAND for string commands, under the allow-list "
                       f"{list(policy.allow_bins) or '(each command its own)'}")
    mapped["ttl_seconds"] = ("delete after that many seconds (SandboxRuntime's timer)"
                             if config.ttl_seconds and config.ttl_seconds > 0 else "none")
    mapped["timeout_seconds"] = "creation makes one directory: no wait to bound"
    if config._ignore_cgroups:
        mapped["_ignore_cgroups"] = "no cgroup is used"
    return mapped


class HostImageManager(BaseImageManager):
    """The image manager of a backend that has one image, the node itself: nothing to pull,
    no OCI bundle. ``SandboxRuntime.create`` asks it to pull first; any image but
    :data:`HOST_IMAGE` is refused there, by name."""

    def pull_image(self, image: str, timeout_seconds: float = 120.0,
                   instance_id: Optional[str] = None) -> str:
        if image != HOST_IMAGE:
            raise SandboxCreationError(f"image={image!r}: hcp-linux pulls no OCI image; use "
                                       f"image={HOST_IMAGE!r} (the node's own programs)")
        return "/"

    def get_image_dir(self, image: str) -> str:
        return self.pull_image(image)

    def get_envs(self, image: str) -> List[str]:
        return []

    def get_workdir(self, image: str) -> Optional[str]:
        return None

    def get_image_config(self, image: str) -> Dict[str, Any]:
        return {}

    def create_oci_spec(self, image: str, *args: Any, **kwargs: Any) -> Dict[str, Any]:
        raise SandboxCreationError("hcp-linux builds no OCI spec")

    def prepare_oci_bundle(self, root_dir: str, *args: Any, **kwargs: Any) -> str:
        raise SandboxCreationError("hcp-linux builds no OCI bundle")


# --- the backend -----------------------------------------------------------------------------

@dataclasses.dataclass
class _Box:
    """One sandbox: its jail (path and descriptor), its confined runner, what runs in it."""

    config: SandboxConfig
    jail: str
    jail_fd: int
    sandbox: Sandbox
    mapping: Dict[str, str]
    running: set = dataclasses.field(default_factory=set)
    # guards running/deleted; notified when a run leaves ``running``
    lock: threading.Condition = dataclasses.field(default_factory=threading.Condition)
    deleted: bool = False
    session: Optional[Session] = None  # the lasting confinement commands run in, if any


class HcpSandboxBackend(BaseSandboxBackend):
    """Ray's ``BaseSandboxBackend`` with hcp-linux underneath.

    ``policy`` is the confinement of every sandbox this backend makes (its ``jail`` is
    replaced by each sandbox's own, a fresh 0700 directory under ``jail_root``, default the
    temp dir); ``executor`` is :class:`~hcp_linux.Sandbox`'s (None: the process default).
    Thread-safe: a Ray actor with ``max_concurrency`` > 1 runs commands in
    parallel, and ``delete_sandbox`` from one thread kills what another is running.

    ``session=True`` (the default): each sandbox is one lasting confinement
    (:class:`hcp_linux.session.Session`) that its commands run in, as ``docker exec`` runs in
    a container: they share its namespaces, private /tmp and background processes, and each
    costs a fork and an exec instead of a new confinement. ``session=False``: every command
    is a confinement of its own (nothing shared but the jail). Either way every layer of the
    policy is on every command; ``get_mapping()["exec"]`` says which applies.
    """

    def __init__(self, policy: Optional[Policy] = None, jail_root: Optional[str] = None,
                 image_manager: Optional[BaseImageManager] = None,
                 executor: Optional[str] = None, session: bool = True) -> None:
        super().__init__(image_manager=image_manager or HostImageManager())
        # checked on this host now, before any jail is made (resolved again per box)
        self.policy = resolve(policy if policy is not None else Policy())
        self.executor = executor
        self.use_session = session
        self.jail_root = jail_root or tempfile.gettempdir()
        # jails of workers killed outright (no cleanup ran): their owner is gone, so they go
        self.swept = sweep_jails(self.jail_root)
        self._boxes: Dict[str, _Box] = {}
        self._lock = threading.Lock()

    def create_sandbox(self, config: SandboxConfig) -> str:
        mapping = check_config(config, self.policy)
        # named for this process (hcp_linux.jails.reclaim): if the worker is killed outright, the
        # next backend on the node (or `hcp-linux gc`) knows the jail's owner is gone
        try:
            jail = os.path.join(make_jail_home(self.jail_root), jail_name("ray"))
            os.mkdir(jail, 0o700)
        except OSError as e:
            where = e.filename if e.filename is not None else self.jail_root
            raise SandboxCreationError(f"hcp-linux sandbox: {where}: {e.strerror}") from e
        except HcpError as e:  # a jail home that is not this user's alone
            raise SandboxCreationError(f"hcp-linux sandbox: {e}") from e
        try:
            env = {**self.policy.env, **config.env}
            policy = dataclasses.replace(self.policy, jail=jail, env=env)
            jail_fd = open_jail(jail)
        except Exception as e:
            remove_tree(jail)
            raise SandboxCreationError(f"hcp-linux sandbox: {e}") from e
        mapping["workdir"] = jail
        box = _Box(config, jail, jail_fd, Sandbox(policy, executor=self.executor), mapping)
        mapping["exec"] = PER_COMMAND
        if self.use_session:
            try:
                box.session = Session(box.sandbox)
                mapping["exec"] = IN_SESSION
            except (HcpError, OSError) as e:  # e.g. no /usr/bin/python3 in the view
                mapping["exec"] = f"{PER_COMMAND} (no session: {e})"
        sandbox_id = f"hcp-{uuid.uuid4().hex[:16]}"
        with self._lock:
            self._boxes[sandbox_id] = box
        return sandbox_id

    def _box(self, sandbox_id: str) -> _Box:
        box = self._boxes.get(sandbox_id)
        if box is None or box.deleted:
            raise SandboxNotFoundError(f"Sandbox ID '{sandbox_id}' not found.")
        return box

    def get_mapping(self, sandbox_id: str) -> Dict[str, str]:
        """What each ``SandboxConfig`` field became in hcp-linux terms (``workdir``: the
        jail's path on the node)."""
        return dict(self._box(sandbox_id).mapping)

    def exec_command(self, sandbox_id: str, command: Union[str, List[str]],
                     timeout: Optional[float] = None, cwd: Optional[str] = None,
                     env: Optional[Dict[str, str]] = None, shell: Optional[str] = None,
                     user: Optional[str] = None) -> ExecResult:
        """One confined run in the sandbox's jail: a string through ``shell -c`` (the
        sandbox's configured shell by default; the allow-list decides, as for any program),
        a list as is. ``timeout`` (default: the Policy's) kills the whole run and raises
        :class:`SandboxTimeoutError`, as the gVisor backend does."""
        box = self._box(sandbox_id)
        if user is not None:
            raise SandboxExecError(f"user={user!r}: the command runs as the Ray worker's ids "
                                   "mapped into its user namespace; it cannot switch user")
        if isinstance(command, str):
            argv = [shell or box.config.shell, "-c", command]
        elif isinstance(command, (list, tuple)) and command and all(
                isinstance(a, str) for a in command):
            argv = list(command)
        else:
            raise SandboxExecError(f"command: expected a string or a non-empty list of "
                                   f"strings, got {command!r}")
        limit = timeout if timeout is not None else box.sandbox.policy.timeout
        start = time.monotonic()
        if box.session is not None:
            return self._exec_in_session(box, sandbox_id, argv, limit, cwd, env, start)
        try:
            proc = box.sandbox.spawn(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, cwd=cwd, env=env,
                                     encoding="utf-8", errors="replace")
        except HcpError as e:
            raise SandboxExecError(f"hcp-linux refused {argv[0]!r}: {e}") from e
        with box.lock:
            if box.deleted:
                proc.kill()
            box.running.add(proc)
        try:
            out, err = proc.communicate(timeout=limit)
        except subprocess.TimeoutExpired as e:
            proc.kill()
            proc.communicate()
            raise SandboxTimeoutError(f"command timed out after {limit} seconds "
                                      "(the whole run was killed)") from e
        finally:
            with box.lock:
                box.running.discard(proc)
                box.lock.notify_all()
        if box.deleted:
            raise SandboxNotFoundError(f"Sandbox ID '{sandbox_id}' was deleted while the "
                                       "command ran; the command was killed")
        return ExecResult(exit_code=proc.wait(), stdout=out, stderr=err,
                          duration_seconds=time.monotonic() - start)

    def _exec_in_session(self, box: _Box, sandbox_id: str, argv: List[str],
                         limit: Optional[float], cwd: Optional[str],
                         env: Optional[Dict[str, str]], start: float) -> ExecResult:
        """:meth:`exec_command` in the sandbox's session. A session that ended (its zygote
        killed by a command, say) is replaced by a new one first: new namespaces, an empty
        /tmp (``get_mapping()["session_restarts"]`` counts them); the jail is the same."""
        with box.lock:
            session = box.session
            assert session is not None
            if not session.alive and not box.deleted:
                session = box.session = Session(box.sandbox)
                box.mapping["session_restarts"] = str(
                    int(box.mapping.get("session_restarts", "0")) + 1)
        try:
            r = session.run(argv, env=env, cwd=cwd, timeout=limit)
        except SessionEnded as e:
            if box.deleted:
                raise SandboxNotFoundError(f"Sandbox ID '{sandbox_id}' was deleted while the "
                                           "command ran; the command was killed") from e
            raise SandboxExecError(f"hcp-linux: {e}") from e
        except HcpError as e:
            raise SandboxExecError(f"hcp-linux refused {argv[0]!r}: {e}") from e
        except OSError as e:
            raise SandboxExecError(f"hcp-linux could not start {argv[0]!r}: "
                                   f"{e.strerror}") from e
        if r.timed_out:
            raise SandboxTimeoutError(f"command timed out after {limit} seconds "
                                      "(its process group was killed)")
        return ExecResult(exit_code=r.returncode,
                          stdout=r.stdout.decode("utf-8", "replace"),
                          stderr=r.stderr.decode("utf-8", "replace"),
                          duration_seconds=time.monotonic() - start)

    def write_file(self, sandbox_id: str, path: str, content: Union[str, bytes],
                   append: bool = False) -> None:
        """Write into the jail (``path`` relative to it; parents made). Refused: absolute
        paths, ``..``, a symlink anywhere on the way, a non-regular or hard-linked file."""
        data = content.encode("utf-8") if isinstance(content, str) else bytes(content)
        try:
            write_in(self._box(sandbox_id).jail_fd, path, data, append)
        except HcpError as e:
            raise SandboxError(str(e)) from e

    def read_file(self, sandbox_id: str, path: str) -> bytes:
        """Read from the jail, under :meth:`write_file`'s rules."""
        try:
            return read_in(self._box(sandbox_id).jail_fd, path)
        except HcpError as e:
            raise SandboxError(str(e)) from e

    def get_status(self, sandbox_id: str) -> SandboxStatus:
        """RUNNING while the jail is there; ERROR if it vanished under us; TERMINATED once
        deleted (or never made), as the gVisor backend answers for an unknown id."""
        box = self._boxes.get(sandbox_id)
        if box is None or box.deleted:
            return SandboxStatus.TERMINATED
        try:
            alive = os.fstat(box.jail_fd).st_nlink > 0
        except OSError:
            alive = False
        return SandboxStatus.RUNNING if alive else SandboxStatus.ERROR

    def delete_sandbox(self, sandbox_id: str) -> None:
        """Kill every command running in the sandbox (each run's whole pid namespace), wait
        (at most :data:`KILL_WAIT` s) until they are reaped, then remove the jail.
        Idempotent."""
        with self._lock:
            box = self._boxes.pop(sandbox_id, None)
        if box is None:
            return
        with box.lock:
            box.deleted = True
            if box.session is not None:
                box.session.close()  # its pid namespace ends: every command in it is killed
            for proc in box.running:
                proc.kill()
            # each run is reaped by the thread running it (a SandboxProcess is waited on by
            # one thread at a time): wait for those threads to let go of them
            box.lock.wait_for(lambda: not box.running, KILL_WAIT)
        os.close(box.jail_fd)
        remove_tree(box.jail)

    def close(self) -> None:
        """Delete every sandbox of this backend."""
        for sandbox_id in list(self._boxes):
            self.delete_sandbox(sandbox_id)


class HcpSandboxRuntime(SandboxRuntime):
    """Ray's ``SandboxRuntime`` with :class:`HcpSandboxBackend` in place of gVisor.

    ``SandboxRuntime.__init__`` hard-codes its backend, so it is not called; the attributes
    its methods read (Ray 2.60: ``_image_manager``, ``_backend``, ``_ttl_timers``) are set
    here, and every other method (create, exec, exec_async, upload_file, download_file,
    write_file, read_file, get_status, delete, terminate, ttl) is Ray's own.
    """

    def __init__(self, policy: Optional[Policy] = None, jail_root: Optional[str] = None,
                 executor: Optional[str] = None, session: bool = True) -> None:
        # Ray types these two as gVisor's classes; any backend and image manager do
        self._image_manager = HostImageManager()  # type: ignore[assignment, unused-ignore]
        self._backend = HcpSandboxBackend(  # type: ignore[assignment, unused-ignore]
            policy, jail_root, self._image_manager, executor, session)
        self._ttl_timers: Dict[str, threading.Timer] = {}

    @property
    def backend(self) -> HcpSandboxBackend:  # type: ignore[override, unused-ignore]
        return self._backend  # type: ignore[return-value, unused-ignore]


# --- the actor -------------------------------------------------------------------------------

@ray.remote(num_cpus=0, max_concurrency=64)  # type: ignore[call-overload, unused-ignore]
class HcpSandbox:
    """One sandbox, held by an actor on the node where its jail lives: the method names of
    ``ray.experimental.sandbox.Sandbox``. Place it with :func:`create`.

    ``max_concurrency`` > 1 so that ``delete`` (or another ``exec``) is served while a
    command runs; ``num_cpus=0`` because the actor mostly waits on its commands (reserve CPUs
    with ``create(num_cpus=)``)."""

    def __init__(self, image: str = HOST_IMAGE, policy: Optional[Policy] = None,
                 jail_root: Optional[str] = None, executor: Optional[str] = None,
                 session: bool = True, **config: Any) -> None:
        self.runtime = HcpSandboxRuntime(policy, jail_root, executor, session)
        self.instance_id = self.runtime.create(image=image, **config)
        # an actor that exits (its last handle dropped) removes its jail; a worker killed
        # outright (its node lost, ray.kill, the cluster shut down) cannot: docs/ray.md
        atexit.register(self.runtime.backend.close)

    def __del__(self) -> None:
        try:
            self.runtime.backend.close()
        except Exception:
            pass

    def get_instance_id(self) -> str:
        return self.instance_id

    def get_node_id(self) -> str:
        """The Ray node the jail lives on."""
        return ray.get_runtime_context().get_node_id()

    def get_config(self) -> SandboxConfig:
        return self.runtime.backend._box(self.instance_id).config

    def get_mapping(self) -> Dict[str, str]:
        return self.runtime.backend.get_mapping(self.instance_id)

    def exec(self, command: Union[str, List[str]], timeout: Optional[float] = None,
             cwd: Optional[str] = None, env: Optional[Dict[str, str]] = None,
             shell: Optional[str] = None) -> ExecResult:
        return self.runtime.exec(self.instance_id, command, timeout=timeout, cwd=cwd,
                                 env=env, shell=shell)

    def upload_file(self, local_path: str, remote_path: str) -> None:
        self.runtime.upload_file(self.instance_id, local_path, remote_path)

    def download_file(self, remote_path: str, local_path: str) -> None:
        self.runtime.download_file(self.instance_id, remote_path, local_path)

    def write_file(self, path: str, content: Union[str, bytes], append: bool = False) -> None:
        self.runtime.write_file(self.instance_id, path, content, append=append)

    def read_file(self, path: str) -> bytes:
        return self.runtime.read_file(self.instance_id, path)

    def get_status(self) -> SandboxStatus:
        return self.runtime.get_status(self.instance_id)

    def delete(self) -> None:
        self.runtime.delete(self.instance_id)

    def terminate(self) -> None:
        self.delete()


def create(image: str = HOST_IMAGE, policy: Optional[Policy] = None, *,
           node_id: Optional[str] = None, num_cpus: float = 0,
           resources: Optional[Dict[str, float]] = None, max_concurrency: int = 64,
           jail_root: Optional[str] = None, executor: Optional[str] = None,
           session: bool = True, **config: Any) -> Any:
    """Place an :class:`HcpSandbox` actor and return its handle: the counterpart of
    ``ray.experimental.sandbox.create``, with the same ``SandboxConfig`` keywords.

    ``node_id`` pins it to that node (hard affinity: it fails rather than run elsewhere). The
    config is checked here first, so a refused field raises :class:`SandboxCreationError` in
    the caller, before anything is placed.
    """
    check_config(SandboxConfig(image=image, **config), policy or Policy())
    options: Dict[str, Any] = {"num_cpus": num_cpus, "max_concurrency": max_concurrency,
                               "max_restarts": 0}
    if resources:
        options["resources"] = resources
    if node_id is not None:
        options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id, soft=False)
    actor = HcpSandbox.options(**options)  # type: ignore[attr-defined, unused-ignore]
    return actor.remote(image, policy, jail_root, executor, session, **config)


def get(ref: Any, timeout: float = 60.0) -> Any:
    """``ray.get`` with a bound, for calls on a sandbox actor: a dead actor (its node lost)
    is :class:`SandboxLostError`, a wait past ``timeout`` :class:`SandboxTimeoutError`."""
    try:
        return ray.get(ref, timeout=timeout)
    except ray.exceptions.GetTimeoutError as e:
        raise SandboxTimeoutError(f"no answer from the sandbox within {timeout} s") from e
    except (ray.exceptions.RayActorError, ray.exceptions.NodeDiedError) as e:
        raise SandboxLostError(f"the sandbox is lost with its actor (its jail lived on that "
                               f"actor's node): {e}") from e
