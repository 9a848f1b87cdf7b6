"""hcp_linux.ray on a real local Ray cluster: a head and a worker node on this machine.

Every denial is checked for real, with its negative control: the same command run as a plain
Ray task through ``subprocess`` succeeds where the sandboxed one is refused. Nothing of Ray or
the kernel is mocked. Skipped when Ray is not installed (``scripts/test-ray`` installs it in a
venv of its own: it is large).
"""
from __future__ import annotations

import os
import random
import subprocess
import sys
import time
import uuid

import pytest

from hcp_linux.conformance.observers import processes_with
from sandboxing import jails_in

# Ray on loopback only: without this it binds the host's interface address.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

try:
    import ray
    from ray.cluster_utils import Cluster
    from ray.experimental.sandbox import (SandboxCreationError, SandboxError, SandboxExecError,
                                          SandboxNotFoundError, SandboxRuntime, SandboxStatus,
                                          SandboxTimeoutError)
    HAVE_RAY = True
except ImportError:
    HAVE_RAY = False

needs_ray = pytest.mark.skipif(not HAVE_RAY, reason="Ray is not installed (scripts/test-ray "
                               "installs hcp-linux[ray] in its own venv)")
OBJECT_STORE = 80 * 1024 * 1024
BOUND = 60.0  # seconds: no wait in this file is longer


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(name))
    return kids


def _tree(roots: list[int]) -> set[int]:
    """The pids of ``roots`` and of all their descendants now."""
    kids, seen, stack = _children(), set(), list(roots)
    while stack:
        pid = stack.pop()
        if pid not in seen:
            seen.add(pid)
            stack.extend(kids.get(pid, []))
    return seen


def _alive(pids: set[int]) -> set[int]:
    out = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    out.add(pid)
        except OSError:
            pass
    return out


def _node_pids(node) -> list[int]:
    return [p.process.pid for procs in node.all_processes.values() for p in procs]


def _wait_for(pred, what: str, bound: float = BOUND):
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"not within {bound} s: {what}")


@pytest.fixture(scope="module")
def cluster():
    """A head (1 CPU) and a worker (2 CPUs), small object stores; after the module, every
    process of them (and their descendants) must be gone."""
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "object_store_memory": OBJECT_STORE, "include_dashboard": False})
    worker = cluster.add_node(num_cpus=2, object_store_memory=OBJECT_STORE)
    ray.init(address=cluster.address)
    roots = _node_pids(cluster.head_node) + _node_pids(worker)
    started: set[int] = set()
    cluster.started = started
    try:
        cluster.wait_for_nodes()
        yield cluster, cluster.head_node.node_id, worker.node_id
    finally:
        started |= _tree(roots)
        ray.shutdown()
        cluster.shutdown()
        _wait_for(lambda: not _alive(started), f"Ray processes gone: {_alive(started)}")


@pytest.fixture
def hr(request):
    """hcp_linux.ray, with ``create`` and ``HcpSandboxRuntime`` on this run's --executor (the
    Ray workers do not see the pytest process's default)."""
    import functools
    import types

    import hcp_linux.ray as hr
    name = request.config.getoption("--executor")
    executor = None if name == "auto" else name
    names = {k: getattr(hr, k) for k in hr.__all__}
    names["create"] = functools.partial(hr.create, executor=executor)
    names["HcpSandboxRuntime"] = functools.partial(hr.HcpSandboxRuntime, executor=executor)
    return types.SimpleNamespace(**names)


def test_import_hcp_linux_does_not_import_ray(tmp_path):
    """hcp_linux, a Sandbox and a run never load Ray: only hcp_linux.ray does."""
    code = ("import sys; import hcp_linux; from hcp_linux import Policy, Sandbox\n"
            f"r = Sandbox(Policy(jail={str(tmp_path)!r})).run(['/bin/true'], timeout=30)\n"
            "assert r.returncode == 0, r\n"
            "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=BOUND)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
    if HAVE_RAY:  # negative control: the check does see Ray when it is loaded
        out = subprocess.run([sys.executable, "-c", code.replace(
            "import hcp_linux;", "import hcp_linux, hcp_linux.ray;")],
            capture_output=True, text=True, timeout=BOUND)
        assert "'ray'" in out.stdout, out.stderr


# --- the contract on this node, through Ray's own SandboxRuntime methods ----------------------

@needs_ray
def test_runtime_is_a_sandbox_runtime_and_config_refusals_name_the_field(hr, tmp_path):
    rt = hr.HcpSandboxRuntime(jail_root=str(tmp_path))
    assert isinstance(rt, SandboxRuntime) and isinstance(rt.backend, hr.HcpSandboxBackend)
    with pytest.raises(SandboxCreationError, match="image='python:3.12'"):
        rt.create("python:3.12")
    for field, value in [("cpu", 1.0), ("memory", "1Gi"), ("workdir", "/w"),
                         ("rootless", False), ("capabilities", []), ("readonly", False),
                         ("network", "public"), ("network", "host")]:
        with pytest.raises(SandboxCreationError, match=f"{field}="):
            rt.create(hr.HOST_IMAGE, **{field: value})
    assert os.listdir(tmp_path) == []  # nothing made for a refused config
    sid = rt.create(hr.HOST_IMAGE, env={"GREETING": "hi"}, shell="/bin/sh")
    assert rt.get_status(sid) == SandboxStatus.RUNNING
    assert rt.exec(sid, "echo $GREETING").stdout == "hi\n"
    with pytest.raises(SandboxTimeoutError):
        rt.exec(sid, ["sleep", "5"], timeout=0.3)
    with pytest.raises(SandboxError, match="user="):
        rt.exec(sid, "id", user="0")
    rt.delete(sid)
    assert rt.get_status(sid) == SandboxStatus.TERMINATED
    with pytest.raises(SandboxNotFoundError):
        rt.exec(sid, "true")


@needs_ray
def test_every_method_of_ray_s_runtime_works_over_the_backend(hr, tmp_path):
    """Ray's own SandboxRuntime methods, inherited unchanged, over HcpSandboxBackend."""
    import asyncio
    rt = hr.HcpSandboxRuntime(jail_root=str(tmp_path / "jails"))
    os.mkdir(tmp_path / "jails")
    sid = rt.create(hr.HOST_IMAGE)
    (tmp_path / "up.txt").write_bytes(b"uploaded")
    rt.upload_file(sid, str(tmp_path / "up.txt"), "in/up.txt")
    assert rt.exec(sid, ["cat", "in/up.txt"]).stdout == "uploaded"
    rt.download_file(sid, "in/up.txt", str(tmp_path / "down" / "d.txt"))
    assert (tmp_path / "down" / "d.txt").read_bytes() == b"uploaded"
    assert asyncio.run(rt.exec_async(sid, "echo async")).stdout == "async\n"
    rt.write_file(sid, "w.txt", "a")
    rt.write_file(sid, "w.txt", "b", append=True)
    assert rt.read_file(sid, "w.txt") == b"ab"
    rt.terminate(sid)
    assert rt.get_status(sid) == SandboxStatus.TERMINATED
    assert jails_in(tmp_path / "jails") == []
    short = rt.create(hr.HOST_IMAGE, ttl_seconds=1)   # Ray's TTL timer deletes it
    assert rt.get_status(short) == SandboxStatus.RUNNING
    _wait_for(lambda: rt.get_status(short) == SandboxStatus.TERMINATED, "the TTL ran out", 10)
    _wait_for(lambda: jails_in(tmp_path / "jails") == [], "the TTL removed the jail", 10)


@needs_ray
def test_allow_list_decides_the_shell(hr, tmp_path):
    from hcp_linux import Policy
    rt = hr.HcpSandboxRuntime(Policy(allow_bins=["echo"]), jail_root=str(tmp_path))
    sid = rt.create(hr.HOST_IMAGE)
    assert rt.exec(sid, ["echo", "ok"]).stdout == "ok\n"
    with pytest.raises(SandboxError, match="bash"):
        rt.exec(sid, "echo through a shell")   # /bin/bash is not on the list
    rt.delete(sid)


# --- on the cluster ---------------------------------------------------------------------------

@needs_ray
def test_create_on_a_chosen_node_exec_and_files(cluster, hr):
    _, head, worker = cluster
    for node in (head, worker):
        sb = hr.create(node_id=node)
        assert hr.get(sb.get_node_id.remote()) == node
        r = hr.get(sb.exec.remote("echo out; echo err >&2; exit 3"))
        assert (r.exit_code, r.stdout, r.stderr) == (3, "out\n", "err\n")
        r = hr.get(sb.exec.remote(["/bin/echo", "a b", "$HOME"]))
        assert (r.exit_code, r.stdout) == (0, "a b $HOME\n")
        hr.get(sb.write_file.remote("d/e/f.bin", bytes(range(256))))
        hr.get(sb.write_file.remote("d/e/f.bin", b"!", append=True))
        assert hr.get(sb.read_file.remote("d/e/f.bin")) == bytes(range(256)) + b"!"
        assert hr.get(sb.exec.remote("wc -c < d/e/f.bin")).stdout.strip() == "257"
        hr.get(sb.exec.remote("printf made > made.txt"))
        assert hr.get(sb.read_file.remote("made.txt")) == b"made"
        assert hr.get(sb.get_status.remote()) == SandboxStatus.RUNNING
        hr.get(sb.delete.remote())
        assert hr.get(sb.get_status.remote()) == SandboxStatus.TERMINATED


@needs_ray
def test_a_refused_config_raises_in_the_caller(cluster, hr):
    with pytest.raises(SandboxCreationError, match="cpu=2"):
        hr.create(cpu=2)


@needs_ray
def test_write_file_refuses_a_symlink_planted_by_the_command(cluster, hr, tmp_path):
    """The command plants symlinks out of its jail; write_file/read_file refuse each, and
    the targets on disk are untouched. Control: the same write through plain open() follows
    the link and does change the target."""
    _, _, worker = cluster
    target = tmp_path / "target.txt"
    target.write_text("original")
    sb = hr.create(node_id=worker)
    jail = hr.get(sb.get_mapping.remote())["workdir"]
    r = hr.get(sb.exec.remote(f"ln -s {target} link && ln -s {tmp_path} dirlink && "
                              "mkdir -p sub && ln -s .. sub/up && ln -s / root"))
    assert r.exit_code == 0, r.stderr
    for path in ["link", "dirlink/target.txt", "sub/up/link", "root/tmp/x", "../x",
                 f"{tmp_path}/target.txt", "sub/../link"]:
        with pytest.raises(SandboxError, match="path"):
            hr.get(sb.write_file.remote(path, "pwned"))
        with pytest.raises(SandboxError, match="path"):
            hr.get(sb.read_file.remote(path))
    assert target.read_text() == "original"
    assert sorted(os.listdir(tmp_path)) == ["target.txt"]
    with open(os.path.join(jail, "link"), "w") as f:  # negative control: open() follows it
        f.write("followed")
    assert target.read_text() == "followed"
    hr.get(sb.delete.remote())


@needs_ray
def test_concurrent_sandboxes(cluster, hr):
    _, head, worker = cluster
    boxes = [hr.create(node_id=(head, worker)[i % 2]) for i in range(8)]
    runs = [sb.exec.remote(f"echo {i} > n.txt && sleep 0.2 && cat n.txt && pwd")
            for i, sb in enumerate(boxes)]
    outs = [hr.get(r) for r in runs]
    assert [o.stdout.split()[0] for o in outs] == [str(i) for i in range(8)]
    assert len({o.stdout.split()[1] for o in outs}) == 8  # eight jails
    assert [hr.get(sb.read_file.remote("n.txt")) for sb in boxes] == [
        f"{i}\n".encode() for i in range(8)]
    hr.get([sb.delete.remote() for sb in boxes])


@needs_ray
def test_delete_kills_what_runs_and_removes_the_jail(cluster, hr):
    _, _, worker = cluster
    sb = hr.create(node_id=worker)
    jail = hr.get(sb.get_mapping.remote())["workdir"]
    marker = f"3600.{random.randrange(10**6):06d}"
    running = sb.exec.remote(f"sleep {marker}; echo survived > after.txt")
    pids = _wait_for(lambda: processes_with(marker, but=os.getpid()), "the sleeping command started")
    assert os.path.isdir(jail)
    t0 = time.monotonic()
    hr.get(sb.delete.remote())
    assert time.monotonic() - t0 < 15
    with pytest.raises(SandboxNotFoundError, match="deleted while the command ran"):
        hr.get(running)
    _wait_for(lambda: not _alive(set(pids)) and not processes_with(marker, but=os.getpid()),
              "no process of the deleted sandbox survives", bound=10)
    assert not os.path.exists(jail)
    with pytest.raises(SandboxNotFoundError):
        hr.get(sb.exec.remote("true"))


@needs_ray
def test_confinement_holds_inside_a_ray_worker(cluster, hr):
    """A sandboxed command cannot read a secret planted in the host's $HOME, nor write beside
    its jail. Control: the very same command as a plain Ray task (subprocess) does both."""
    _, _, worker = cluster
    home = os.path.expanduser("~")
    secret = os.path.join(home, f".hcp-ray-secret-{uuid.uuid4().hex}")
    with open(secret, "w") as f:
        f.write("s3cret")
    try:
        sb = hr.create(node_id=worker)
        jail = hr.get(sb.get_mapping.remote())["workdir"]
        beside = os.path.join(os.path.dirname(jail), f"beside-{uuid.uuid4().hex}")
        cmd = f"cat {secret}; echo pwned > {beside}"
        r = hr.get(sb.exec.remote(cmd))
        assert "s3cret" not in r.stdout and not os.path.exists(beside), r

        @ray.remote(num_cpus=0)
        def plain(command: str, cwd: str):
            p = subprocess.run(["/bin/bash", "-c", command], capture_output=True, text=True,
                               cwd=cwd, timeout=30)
            return p.returncode, p.stdout
        code, out = ray.get(plain.options(scheduling_strategy=ray.util.scheduling_strategies
                                          .NodeAffinitySchedulingStrategy(worker, soft=False))
                            .remote(cmd, jail), timeout=BOUND)
        assert "s3cret" in out and os.path.exists(beside), (code, out)
        os.unlink(beside)
        hr.get(sb.delete.remote())
    finally:
        os.unlink(secret)


@needs_ray
def test_losing_the_node_loses_the_sandbox_with_a_clear_error(cluster, hr):
    """A third node is added and killed: calls on its sandbox (one in flight, one after)
    fail with SandboxLostError well within the bound, and its running command dies too."""
    c, _, _ = cluster
    doomed = c.add_node(num_cpus=1, object_store_memory=OBJECT_STORE)
    c.wait_for_nodes()
    c.started |= _tree(_node_pids(doomed))
    sb = hr.create(node_id=doomed.node_id)
    assert hr.get(sb.exec.remote("echo alive")).stdout == "alive\n"
    jail = hr.get(sb.get_mapping.remote())["workdir"]
    marker = f"3600.{random.randrange(10**6):06d}"
    in_flight = sb.exec.remote(f"sleep {marker}")
    _wait_for(lambda: processes_with(marker, but=os.getpid()), "the sleeping command started")
    c.started |= _tree(_node_pids(doomed))
    t0 = time.monotonic()
    c.remove_node(doomed, allow_graceful=False)
    with pytest.raises(hr.SandboxLostError, match="lost"):
        hr.get(in_flight, timeout=BOUND)
    with pytest.raises(hr.SandboxLostError):
        hr.get(sb.exec.remote("echo again"), timeout=BOUND)
    took = time.monotonic() - t0
    assert took < BOUND
    print(f"node loss noticed in {took:.1f} s")
    _wait_for(lambda: not processes_with(marker, but=os.getpid()), "the dead node's command is gone", bound=30)
    # the jail stays on the dead node's disk (here: this machine's): nobody was left to
    # delete it; docs/ray.md says so
    if os.path.isdir(jail):
        from hcp_linux.jails.workspace import remove_tree
        remove_tree(jail)


@needs_ray
@pytest.mark.parametrize("session", [True, False])
def test_a_sandbox_says_how_its_commands_run(cluster, hr, session):
    """In a session (the default) commands share the sandbox's /tmp, as in a container; with
    session=False each has a confinement of its own. A command that kills the session's
    zygote fails; the next one runs in a new session, counted in the mapping."""
    _, _, worker = cluster
    zygote_mark = "The program a session runs inside its sandbox"  # in its command line
    before = set(processes_with(zygote_mark))
    sb = hr.create(node_id=worker, session=session)
    try:
        mapping = hr.get(sb.get_mapping.remote())
        assert mapping["exec"].startswith("in the sandbox's session" if session
                                          else "a confinement of its own"), mapping
        assert hr.get(sb.exec.remote("echo kept > /tmp/x")).exit_code == 0
        r = hr.get(sb.exec.remote("cat /tmp/x"))
        assert (r.stdout == "kept\n") == session, r
        if session:
            # a command cannot signal the zygote (a Landlock domain of its own): the host
            # kills it while a command runs
            token = f"hcp-ray-session-{uuid.uuid4().hex}"
            ref = sb.exec.remote(f"sleep 30; : {token}")
            deadline = time.monotonic() + 60
            while not processes_with(token) and time.monotonic() < deadline:
                time.sleep(0.05)
            zygotes = set(processes_with(zygote_mark)) - before
            assert zygotes, "the sandbox's zygote was not found"
            for pid in zygotes:
                os.kill(pid, 9)
            with pytest.raises(SandboxExecError, match="session"):
                hr.get(ref)
            assert hr.get(sb.exec.remote("echo again")).stdout == "again\n"
            assert hr.get(sb.get_mapping.remote())["session_restarts"] == "1"
    finally:
        hr.get(sb.delete.remote())


@needs_ray
def test_a_killed_workers_jail_is_reclaimed_by_the_next_sandbox(cluster, hr):
    """ray.kill runs no cleanup: the jail stays. It is named for its owner (the worker), so
    the next backend on that node removes it once the owner is gone; a live one stays."""
    from hcp_linux.jails.reclaim import jail_owner, owner_gone
    _, _, worker = cluster
    doomed, alive = hr.create(node_id=worker), hr.create(node_id=worker)
    jails = [hr.get(sb.get_mapping.remote())["workdir"] for sb in (doomed, alive)]
    owner = jail_owner(os.path.basename(jails[0]))
    assert owner is not None, jails[0]
    ray.kill(doomed)
    _wait_for(lambda: owner_gone(*owner), "the killed worker to be gone")
    assert os.path.isdir(jails[0])  # control: nothing removed it yet
    fresh = hr.create(node_id=worker)
    try:
        hr.get(fresh.get_status.remote())
        assert not os.path.exists(jails[0]), "the dead worker's jail was not reclaimed"
        assert os.path.isdir(jails[1]), "a live sandbox's jail was removed"
    finally:
        hr.get([fresh.delete.remote(), alive.delete.remote()])
