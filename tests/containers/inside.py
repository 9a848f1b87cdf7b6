"""Runs inside one container of the real-engine leg (tests/containers/test_real_engines.py):
what `hcp-linux` says and does there, as JSON on stdout.

Started by the leg as the container's command, with the image's venv python. It asks the
installed package, through its CLI (the entry point users run): `probe --json`, a strict
run, a run at the rung probe names; then, at that rung, attacks on what lies outside the
sandbox, each a confined python that prints ESCAPED when its attack worked: read and write
outside the jail, TCP to a listener on the container's loopback (the container's own network
namespace, made by the engine with --network none: no outside host is ever tried), ptrace
and a signal to a sibling process started here, outside the sandbox, and opening /proc/sys
and /proc/sysrq-trigger for writing (opened only, never written: an unmasked /proc reaches
the host's kernel). At the full rung, also `hcp-linux conformance`. Nothing here judges: the leg's assertions do, so that its failures say
which environment and what.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time

HCP = [sys.executable, "-m", "hcp_linux"]
TMP = "/tmp/hcp-leg"
JAIL = f"{TMP}/jail"
OUTSIDE = f"{TMP}/outside"

ATTACKS = {
    "read_shadow": "print('ESCAPED', len(open('/etc/shadow').read()))",
    "read_outside": f"print('ESCAPED', open('{OUTSIDE}/secret').read())",
    "write_outside": f"open('{OUTSIDE}/written', 'w').write('x'); print('ESCAPED')",
    "tcp_loopback": "import socket; socket.create_connection(('127.0.0.1', PORT), 2); "
                    "print('ESCAPED')",
    "ptrace_sibling": "import ctypes; libc = ctypes.CDLL(None, use_errno=True); "
                      "r = libc.ptrace(16, PID, 0, 0); "
                      "print('ESCAPED' if r == 0 else 'HELD', ctypes.get_errno())",
    "signal_sibling": "import os, signal; os.kill(PID, signal.SIGTERM); print('ESCAPED')",
    "proc_sys_write": "import os; os.close(os.open('/proc/sys/kernel/core_pattern', "
                      "os.O_WRONLY)); print('ESCAPED')",
    "sysrq_write": "import os; os.close(os.open('/proc/sysrq-trigger', os.O_WRONLY)); "
                   "print('ESCAPED')",
    # 400 forks under limits.nproc=301 (the pid namespace's pid_max cannot go below 301):
    # all 400 made is the limit not binding
    "nproc": "import os, time\nn = 0\nfor _ in range(400):\n    try:\n        pid = os.fork()\n"
             "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(3)\n"
             "        os._exit(0)\n    n += 1\nprint('ESCAPED' if n == 400 else 'HELD', n)",
}
#: Flags an attack's run takes beyond the rung.
ATTACK_FLAGS = {"nproc": ["--limit", "nproc=301"]}


def hcp(*args: str, timeout: float = 60) -> dict:
    p = subprocess.run([*HCP, *args], capture_output=True, text=True, timeout=timeout,
                       cwd=JAIL)
    return {"rc": p.returncode, "stdout": p.stdout, "stderr": p.stderr[-4000:]}


def can_open_for_writing(path: str) -> bool:
    """Whether this process (the container's own user, outside any sandbox) may open
    ``path`` for writing. Opened and closed, nothing written."""
    try:
        os.close(os.open(path, os.O_WRONLY))
        return True
    except OSError:
        return False


def listener() -> int:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)

    def serve() -> None:
        while True:
            try:
                srv.accept()[0].close()
            except OSError:
                return
    threading.Thread(target=serve, daemon=True).start()
    return srv.getsockname()[1]


#: The attacks a served run tries too (each names files or a process outside the sandbox).
SERVED_ATTACKS = ("read_outside", "write_outside", "signal_sibling")


def served(flags: list[str], sibling: "subprocess.Popen[bytes]") -> dict:
    """The image's native `hcp-linux` (the wheel's: a static program) served by an
    `hcp-linux serve` in this container, then by the user's `auto` server: whether a run
    starts Python (a copy of the program beside a `hcp-linux-py` that notes each time it
    runs, then runs the Python command), its pid namespace, and the attacks of
    SERVED_ATTACKS through it. A rung the server does not serve falls back to Python."""
    installed = "/opt/hcp/bin/hcp-linux"
    with open(installed, "rb") as f:
        out: dict = {"native": f.read(4) == b"\x7fELF"}
    if not out["native"]:
        return out
    where, ran = f"{TMP}/bin", f"{TMP}/python-ran"
    os.makedirs(where)
    shutil.copy2(installed, f"{where}/hcp-linux")
    with open(f"{where}/hcp-linux-py", "w") as f:
        f.write(f"#!{sys.executable}\nimport sys\nopen({ran!r}, 'a').write('ran\\n')\n"
                "from hcp_linux.cli.launch import entry\nsys.exit(entry())\n")
    os.chmod(f"{where}/hcp-linux-py", 0o755)

    def python_runs() -> int:
        try:
            with open(ran) as f:
                return len(f.read().splitlines())
        except FileNotFoundError:
            return 0

    def run(server: str, *argv: str) -> dict:
        before = python_runs()
        p = subprocess.run([f"{where}/hcp-linux", "run", *flags, "--", *argv],
                           env=dict(os.environ, HCP_LINUX_SERVER=server),
                           capture_output=True, text=True, timeout=60, cwd=JAIL)
        return {"rc": p.returncode, "stdout": p.stdout, "stderr": p.stderr[-2000:],
                "python": python_runs() > before}

    def unconfined(name: str) -> bool:  # the control: outside any sandbox, it works
        victim = subprocess.Popen(["sleep", "300"])
        try:
            p = subprocess.run([sys.executable, "-c",
                                ATTACKS[name].replace("PID", str(victim.pid))],
                               capture_output=True, text=True, timeout=30, cwd=JAIL)
            return "ESCAPED" in p.stdout
        finally:
            victim.kill()
            victim.wait()
            if os.path.exists(f"{OUTSIDE}/written"):
                os.unlink(f"{OUTSIDE}/written")

    out["controls"] = {name: unconfined(name) for name in SERVED_ATTACKS}
    sock = f"{TMP}/serve.sock"
    server = subprocess.Popen([*HCP, "serve", "--socket", sock], stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd="/")
    try:
        assert server.stderr is not None
        out["listening"] = server.stderr.readline().decode()
        out["view"] = run(sock, "sh", "-c", f"readlink /proc/self/ns/pid; if test -e "
                                            f"/proc/{sibling.pid}; then echo SEES-SIBLING; fi")
        attacks = {}
        for name in SERVED_ATTACKS:
            code = ATTACKS[name].replace("PID", str(sibling.pid))
            r = run(sock, "python3", "-c", code)
            escaped = "ESCAPED" in r["stdout"] or sibling.poll() is not None
            if name == "write_outside":
                escaped = escaped or os.path.exists(f"{OUTSIDE}/written")
            attacks[name] = {"escaped": escaped, "rc": r["rc"], "python": r["python"],
                             "detail": (r["stdout"] + r["stderr"])[-300:]}
        out["attacks"] = attacks
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    out["server_said"] = server.stderr.read().decode()[-2000:] if server.stderr else ""
    # auto: the first run (Python) starts the user's server and leaves the program its
    # link; the runs after it, once that server listens, are the program's alone
    autos = [run("auto", "true")]
    for _ in range(20):  # a rung the server does not serve: each run is Python's
        time.sleep(0.1)
        autos.append(run("auto", "true"))
        if not autos[-1]["python"] or autos[-1]["rc"] != 0:
            break
    out["auto"] = {"runs": len(autos), "rcs": sorted({a["rc"] for a in autos}),
                   "last": autos[-1]}
    return out


def main() -> None:
    shutil.rmtree(TMP, ignore_errors=True)
    os.makedirs(JAIL)
    os.makedirs(OUTSIDE)
    with open(f"{OUTSIDE}/secret", "w") as f:
        f.write("s3cret")
    with open("/proc/self/uid_map") as f:  # "0 0 4294967295": no user namespace around us
        host_root = os.getuid() == 0 and f.read().split()[:2] == ["0", "0"]
    out: dict = {"uid": os.getuid(), "host_root": host_root,
                 "core_pattern_writable_by_container": can_open_for_writing(
                     "/proc/sys/kernel/core_pattern")}
    probe = hcp("probe", "--json")
    out["probe_rc"] = probe["rc"]
    try:
        out["probe"] = json.loads(probe["stdout"])
    except ValueError:
        out["probe"] = None
        out["probe_output"] = probe
        print(json.dumps(out))
        return
    out["probe_text"] = hcp("probe")["stdout"]
    out["strict"] = hcp("run", "--", "/bin/true")
    rung = out["probe"]["rung"]["name"]
    out["rung"] = rung
    if rung == "below-ladder":
        print(json.dumps(out))
        return
    flags = ["--rung", rung]
    own_pidns = os.readlink("/proc/self/ns/pid")
    sibling = subprocess.Popen(["sleep", "300"])
    out["sibling"] = sibling.pid
    view = hcp("run", *flags, "--", "sh", "-c",
               f"readlink /proc/self/ns/pid; if test -e /proc/{sibling.pid}; then "
               f"echo SEES-SIBLING; fi")
    out["rung_run"] = view
    # a pid namespace of its own: the link names another namespace than this process's
    out["rung_run_new_pidns"] = own_pidns not in view["stdout"] and "pid:[" in view["stdout"]
    out["rung_run_sees_sibling"] = "SEES-SIBLING" in view["stdout"]
    port = listener()
    attacks = {}
    for name, code in ATTACKS.items():
        code = code.replace("PORT", str(port)).replace("PID", str(sibling.pid))
        r = hcp("run", *flags, *ATTACK_FLAGS.get(name, []), "--", "python3", "-c", code)
        escaped = "ESCAPED" in r["stdout"]
        if name == "write_outside":
            escaped = escaped or os.path.exists(f"{OUTSIDE}/written")
        if name == "signal_sibling":
            escaped = escaped or sibling.poll() is not None
        attacks[name] = {"escaped": escaped, "rc": r["rc"],
                         "detail": (r["stdout"] + r["stderr"])[-300:]}
        if sibling.poll() is not None:  # a signal got through: a fresh sibling for the rest
            sibling = subprocess.Popen(["sleep", "300"])
    out["attacks"] = attacks
    out["served"] = served(flags, sibling)
    if rung == "full":  # the HCP §10 conformance checks, every one by doing it, here
        conf = hcp("conformance", "--json", timeout=240)
        try:
            report = json.loads(conf["stdout"])
            out["conformance"] = {"conformant": report["conformant"],
                                  "summary": report["summary"],
                                  "failed": [c["id"] + ": " + str(c.get("reason"))[:200]
                                             for c in report["checks"]
                                             if c["status"] == "fail"]}
        except (ValueError, KeyError):
            out["conformance"] = {"error": conf}
    sibling.kill()
    sibling.wait()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
