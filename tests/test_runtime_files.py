"""A run cannot change what the runtime trusts on the next run (hcp_linux.runtime_files).

hcp-linux reads some files of its own again on later runs: the compiled seccomp programs, the
CLI's policy configs, its own code and hcp-exec. A command whose writable root held one of them
could rewrite it, and every later run of the user, in any jail, would be wider. Each attack
here is run for real and its effect checked on the next run (a blocked syscall, a write outside
the jail); a control shows the same file, written unconfined, does widen that run, so the test
can tell.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import stat
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from hcp_linux import runtime_files
from sandboxing import (TIMEOUT, caller_env, cli_run_waiting, jail_home_of, out, read_receipt,
                        run_cli, show, wait_for)

#: keyctl(KEYCTL_GET_KEYRING_ID, KEY_SPEC_USER_KEYRING, 0): the baseline profile denies it
#: (EPERM); a filter that allows everything lets it through. Prints "keyctl ok" or "keyctl EN".
KEYCTL = r"""
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
nr = {"x86_64": 250, "aarch64": 219}[__import__("platform").machine()]
r = libc.syscall(nr, 0, -4, 0)
print("keyctl ok" if r >= 0 else "keyctl E%d" % ctypes.get_errno())
"""

#: Replace each named program file in DIR (argv[1]) by one that allows every syscall, with a
#: valid checksum (the cache's format: magic, sha256 of the program, the program); make DIR
#: and the files when missing. Prints "forged N" or the error.
FORGE = r"""
import hashlib, os, struct, sys
d, names = sys.argv[1], sys.argv[2:]
prog = struct.pack("<HBBI", 0x06, 0, 0, 0x7FFF0000)  # BPF_RET|BPF_K, SECCOMP_RET_ALLOW
blob = b"hcp-linux seccomp bpf v1\n" + hashlib.sha256(prog).digest() + prog
try:
    os.makedirs(d, exist_ok=True)
    for n in names:
        with open(os.path.join(d, n + ".x"), "wb") as f:
            f.write(blob)
        os.replace(os.path.join(d, n + ".x"), os.path.join(d, n))
    print("forged", len(names))
except OSError as e:
    print("refused", e.errno)
"""


def _allow_all() -> bytes:
    prog = struct.pack("<HBBI", 0x06, 0, 0, 0x7FFF0000)
    return b"hcp-linux seccomp bpf v1\n" + hashlib.sha256(prog).digest() + prog


def _python(jail: Path, script: str, *args: str, env: dict[str, str],
            extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    (jail / "s.py").write_text(script)
    return run_cli(jail, "python3", str(jail / "s.py"), *args, env=env,
                   extra=["--allow-bin", "python3", *extra])


def _program_names(tmp_path: Path, jail: Path) -> list[str]:
    """The file names a CLI run's programs have in the cache (its keys do not depend on the
    directory): those a reference run stores in an empty cache of its own."""
    ref = tmp_path / "reference-programs"
    ref.mkdir()
    p = _python(jail, KEYCTL, env=caller_env({"HCP_LINUX_SECCOMP_CACHE": str(ref)}))
    assert p.returncode == 0, show(p)
    names = sorted(f.name for f in ref.glob("*.bpf"))
    assert names, "the reference run stored no program"
    return names


def test_a_run_whose_jail_is_home_cannot_weaken_the_next_runs_filter(tmp_path: Path) -> None:
    """The attack that worked: with the jail at $HOME, the command rewrote the programs in
    ~/.cache/hcp-linux/seccomp, and the next run, in another jail, allowed every syscall.
    The cache is no longer there: the forged files are not read."""
    home, other = tmp_path / "home", tmp_path / "other"
    home.mkdir()
    other.mkdir()
    names = _program_names(tmp_path, other)
    env = caller_env({"HOME": str(home)})
    env.pop("XDG_CACHE_HOME", None)
    env.pop("HCP_LINUX_SECCOMP_CACHE", None)
    old = home / ".cache" / "hcp-linux" / "seccomp"
    p = _python(home, FORGE, str(old), *names, env=env)
    assert p.returncode == 0 and f"forged {len(names)}" in p.stdout.decode(), show(p)
    assert sorted(f.name for f in old.iterdir()) == names  # planted, for real
    p = _python(other, KEYCTL, env=env)
    assert p.returncode == 0, show(p)
    assert p.stdout.decode().split() == ["keyctl", "E1"], show(p)
    # control: those very files, where this runtime keeps its programs, are loaded
    env_forged = caller_env({"HCP_LINUX_SECCOMP_CACHE": str(old)})
    p = _python(other, KEYCTL, env=env_forged)
    assert p.stdout.decode().split() == ["keyctl", "ok"], show(p)


def test_a_program_cache_inside_a_writable_root_is_read_only_to_the_run(tmp_path: Path
                                                                        ) -> None:
    """HCP_LINUX_SECCOMP_CACHE inside the jail: the run sees the programs read-only (the
    receipt says so), the forge fails, the bytes on disk are the compiled ones and the next
    run still denies keyctl. Control: the same forge, unconfined, makes that run allow it."""
    jail, other = tmp_path / "jail", tmp_path / "other"
    jail.mkdir()
    other.mkdir()
    programs = jail / "programs"
    env = caller_env({"HCP_LINUX_SECCOMP_CACHE": str(programs)})
    p = _python(other, KEYCTL, env=env)  # compiles and stores, from a jail elsewhere
    assert p.returncode == 0 and p.stdout.decode().split() == ["keyctl", "E1"], show(p)
    before = {f.name: f.read_bytes() for f in programs.glob("*.bpf")}
    assert before
    receipt = tmp_path / "r.json"
    p = _python(jail, FORGE, str(programs), *before, env=env, extra=("--receipt", str(receipt)))
    assert p.returncode == 0 and "refused 30" in p.stdout.decode(), show(p)  # EROFS
    assert {f.name: f.read_bytes() for f in programs.glob("*.bpf")} == before
    assert read_receipt(receipt)["protected"][str(programs)] == "read-only bind"
    p = _python(other, KEYCTL, env=env)
    assert p.stdout.decode().split() == ["keyctl", "E1"], show(p)
    # control: forged by this (unconfined) process, the next run loads them
    for name in before:
        (programs / name).write_bytes(_allow_all())
    p = _python(other, KEYCTL, env=env)
    assert p.stdout.decode().split() == ["keyctl", "ok"], show(p)
    shutil.rmtree(programs)


def test_the_program_cache_a_run_s_own_runtime_makes_is_kept(tmp_path: Path) -> None:
    """HCP_LINUX_SECCOMP_CACHE inside the jail and missing (a project whose virtual
    environment is in it, before its first run): the runtime makes it to store the filter
    it compiles for this very run. It used to be taken for the command's and removed after
    the run (the receipt said so), so every CLI run from there compiled again (~13 ms and
    pyseccomp's import). Made before the run looks, it is read-only to the run, kept, and the
    next run loads the program stored (the same file: nothing compiled or stored again).
    Control: what the command made at a missing protected name, ``.envrc``, is removed."""
    jail = tmp_path / "jail"
    jail.mkdir()
    programs = jail / "venv" / "share" / "hcp-linux" / "seccomp"
    env = caller_env({"HCP_LINUX_SECCOMP_CACHE": str(programs)})
    receipt = tmp_path / "r.json"
    script = "echo planted > .envrc; touch venv/share/hcp-linux/seccomp/x"
    p = run_cli(jail, "/bin/sh", "-c", script, env=env, extra=["--receipt", str(receipt)])
    assert p.returncode != 0 and b"Read-only file system" in p.stderr, show(p)
    assert not (jail / ".envrc").exists()  # the control: the run's sweep ran
    stored = {f.name: f.stat().st_ino for f in programs.glob("*.bpf")}
    assert stored and sorted(os.listdir(programs)) == sorted(stored), os.listdir(programs)
    r = read_receipt(receipt)
    assert r["protected"][str(programs)] == "read-only bind", r["protected"]
    assert str(programs) not in r.get("protected_sweep", {}), r["protected_sweep"]
    p = run_cli(jail, "/bin/true", env=env)
    assert p.returncode == 0, show(p)
    assert {f.name: f.stat().st_ino for f in programs.glob("*.bpf")} == stored


def test_a_workspace_made_while_a_run_holds_the_state_dir_is_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A CLI run whose jail holds the driver's state directory, missing when it starts (a
    home jail, before the first persistent workspace); while it runs, bob's driver run makes
    his workspace there. The CLI run's sweep took the directory for its command's and
    removed it, bob's files with it. Made before that run looks, it is kept, and bob's
    next run finds his file. Control (cli_run_waiting): the run's own ``.envrc`` is
    removed."""
    from hcp_linux.driver.driver import LinuxDriver
    from hcp_linux.policy.pack import load_pack
    from hcp_linux.policy.policy import Policy
    jail, scratch = tmp_path / "jail", tmp_path / "scratch"
    for d in (jail, scratch, tmp_path / "pack"):
        d.mkdir()
    (tmp_path / "pack" / "pack.toml").write_text(
        'name = "pack"\n[wrap]\nbin = ["sh"]\n[wrap.workspace]\nmode = "workspace"\n')
    pack = load_pack(tmp_path / "pack" / "pack.toml")
    state = jail / "state"
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    driver = LinuxDriver(Policy(jail=str(scratch)), tmp_dir=str(scratch))
    with cli_run_waiting(jail, caller_env({"XDG_STATE_HOME": str(state)}),
                         extra=["--no-config"]):
        r = driver.run(pack, ["sh", "-c", "echo mine > notes"], principal="bob",
                       timeout=TIMEOUT)
        assert r.returncode == 0
    bob = state / "hcp-linux" / "workspaces" / "pack" / "bob"
    assert (bob / "notes").read_text() == "mine\n"
    nxt = driver.run(pack, ["sh", "-c", "cat notes"], principal="bob", capture_output=True,
                     timeout=TIMEOUT)
    assert nxt.stdout == b"mine\n", nxt


def _config_env(xdg: Path) -> dict[str, str]:
    env = caller_env({"XDG_CONFIG_HOME": str(xdg),
                      "HCP_LINUX_SYSTEM_CONFIG": str(xdg / "no-system-config.toml")})
    env.pop("HCP_LINUX_NO_CONFIG", None)
    return env


def _writes_outside(jail: Path, outside: Path, env: dict[str, str]) -> bool:
    """Whether a run in ``jail`` (reading the configs) can make a file in ``outside``."""
    target = outside / "planted"
    p = run_cli(jail, "/bin/sh", "-c", f"echo x > {target}", env=env)
    made = target.exists()
    if made:
        target.unlink()
    elif p.returncode not in (0, 1, 2):
        raise AssertionError(show(p))
    return made


def test_a_run_that_reads_no_config_cannot_plant_one_for_the_next(tmp_path: Path) -> None:
    """With the jail holding $XDG_CONFIG_HOME, a run that reads no config (--no-config, as
    the Python API and the driver never read one) writes a user config granting another
    directory: it is removed when the run ends, and the next run is not widened. Control:
    the same config written by the user widens that run."""
    jail, other, outside = tmp_path / "jail", tmp_path / "other", tmp_path / "outside"
    for d in (jail, other, outside):
        d.mkdir()
    os.chmod(tmp_path, 0o755)  # the configs' trust check: no directory others can write
    xdg = jail / "xdg"
    config = xdg / "hcp-linux" / "policy.toml"
    env = _config_env(xdg)
    text = f'write_roots = ["{outside}"]\n'
    receipt = tmp_path / "r.json"
    p = run_cli(jail, "/bin/sh", "-c",
                f"mkdir -p {config.parent} && printf '%s' '{text}' > {config} && cat {config}",
                env=env, extra=["--no-config", "--receipt", str(receipt)])
    assert p.returncode == 0 and p.stdout.decode() == text, show(p)  # it was written
    assert not config.exists(), "the planted config outlived the run"
    assert read_receipt(receipt)["protected_sweep"][str(config)] == "removed"
    assert not _writes_outside(other, outside, env)
    # control: the user's own config, the same text, grants the directory
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(text)
    os.chmod(config, 0o644)
    assert _writes_outside(other, outside, env)


def test_an_existing_config_inside_a_writable_root_is_read_only_to_the_run(tmp_path: Path
                                                                           ) -> None:
    jail = tmp_path / "jail"
    jail.mkdir()
    os.chmod(tmp_path, 0o755)
    config = jail / "xdg" / "hcp-linux" / "policy.toml"
    config.parent.mkdir(parents=True)
    config.write_text("read_only_jail = true\n")
    os.chmod(config, 0o644)
    env = _config_env(jail / "xdg")
    p = run_cli(jail, "/bin/sh", "-c", f"echo 'network = \"allow\"' >> {config}; echo rc=$?",
                env=env, extra=["--no-config"])
    assert p.returncode == 0 and "rc=0" not in p.stdout.decode(), show(p)
    assert config.read_text() == "read_only_jail = true\n"
    # control: unconfined, the same append works
    with open(config, "a") as f:
        f.write("# appended\n")


def _package_parent_writable() -> bool:
    return os.access(os.path.dirname(runtime_files.PACKAGE_DIR), os.W_OK)


@pytest.mark.skipif(not _package_parent_writable(),
                    reason="the directory holding hcp_linux is not writable by this user")
def test_the_runtime_s_own_package_is_read_only_in_a_root_that_holds_it(tmp_path: Path
                                                                        ) -> None:
    """A jail holding hcp_linux (a checkout, a venv's site-packages): the command cannot add
    a file beside the code or hcp-exec; it can beside the package (control)."""
    jail = Path(runtime_files.PACKAGE_DIR).parent
    token = f"hcp-probe-{os.getpid()}"
    inside = Path(runtime_files.PACKAGE_DIR) / "native" / token
    control = jail / token
    receipt = tmp_path / "r.json"
    try:
        p = subprocess.run(
            [sys.executable, "-m", "hcp_linux", "run", "--jail", str(jail),
             "--protect-missing", "sweep", "--receipt", str(receipt), "--", "/bin/sh", "-c",
             f"touch {inside}; echo rc=$?; touch {control}; echo rc2=$?"],
            capture_output=True, timeout=TIMEOUT, cwd="/", env=caller_env())
        assert p.returncode == 0, show(p)
        assert not inside.exists() and "rc=0" not in p.stdout.decode().split(), show(p)
        assert control.exists(), show(p)
        assert read_receipt(receipt)["protected"][os.path.realpath(runtime_files.PACKAGE_DIR)] \
            == "read-only bind"
    finally:
        for path in (inside, control):
            if path.is_file() and not path.is_symlink():
                path.unlink()


#: A profile of the user's own, named by path: keyctl refused.
PROFILE = """[profile]
name = "mine"
description = "keyctl refused"
default_action = "allow"

[[rule]]
syscall = "keyctl"
action = "errno:EPERM"
why = "the test's"
"""


def test_a_profile_the_policy_names_by_path_is_read_only_to_its_run(tmp_path: Path) -> None:
    """``--seccomp-profile JAIL/p.toml``: the command rewrites the profile without its rule,
    and the next run of the same policy would load it. The file is read-only to the run;
    the next run still refuses keyctl. Control: the same rewrite, unconfined, lets it in."""
    jail = tmp_path / "jail"
    jail.mkdir()
    profile = jail / "p.toml"
    profile.write_text(PROFILE)
    weak = PROFILE.replace('syscall = "keyctl"', 'syscall = "acct"')
    flags = ("--seccomp-profile", str(profile))
    p = _python(jail, KEYCTL, env=caller_env(), extra=flags)
    assert p.stdout.decode().split() == ["keyctl", "E1"], show(p)
    rewrite = f"import sys; open({str(profile)!r}, 'w').write(sys.argv[1])"
    p = _python(jail, rewrite, weak, env=caller_env(), extra=flags)
    assert p.returncode != 0 and b"Read-only file system" in p.stderr, show(p)
    assert profile.read_text() == PROFILE
    p = _python(jail, KEYCTL, env=caller_env(), extra=flags)
    assert p.stdout.decode().split() == ["keyctl", "E1"], show(p)
    profile.write_text(weak)  # control: the weakened profile is what the next run loads
    p = _python(jail, KEYCTL, env=caller_env(), extra=flags)
    assert p.stdout.decode().split() == ["keyctl", "ok"], show(p)


def _venv_parent_writable() -> bool:
    return sys.prefix != sys.base_prefix and os.access(os.path.dirname(sys.prefix), os.W_OK)


@pytest.mark.skipif(not _venv_parent_writable(),
                    reason="not in a virtual environment whose parent this user can write")
def test_the_interpreter_s_environment_is_read_only_in_a_root_that_holds_it(tmp_path: Path
                                                                            ) -> None:
    """A jail holding the virtual environment hcp-linux runs in (a project's .venv): a
    ``.pth`` file added to its site-packages would run in every later start of hcp-linux,
    unconfined. The command cannot add one; it can add a file beside the environment."""
    import sysconfig
    jail = Path(sys.prefix).parent
    site = Path(sysconfig.get_path("purelib"))
    token = f"hcp-probe-{os.getpid()}"
    pth, control = site / f"{token}.pth", jail / token
    try:
        p = subprocess.run(
            [sys.executable, "-m", "hcp_linux", "run", "--jail", str(jail),
             "--protect-missing", "sweep", "--", "/bin/sh", "-c",
             f"echo 'import os' > {pth}; echo rc=$?; touch {control}; echo rc2=$?"],
            capture_output=True, timeout=TIMEOUT, cwd="/", env=caller_env())
        assert p.returncode == 0, show(p)
        assert not pth.exists() and "rc=0" not in p.stdout.decode().split(), show(p)
        assert control.exists(), show(p)
    finally:
        for path in (pth, control):
            if path.is_file() and not path.is_symlink():
                path.unlink()


def test_a_link_on_the_config_s_path_is_restored_after_the_run(tmp_path: Path) -> None:
    """``$XDG_CONFIG_HOME/hcp-linux`` a symlink inside the jail (to a dotfiles checkout):
    the command re-points it at a directory holding a config that grants another directory.
    The link is restored after the run; the next run reads the user's config, not that one.
    Control: left re-pointed (the same link made unconfined), the next run is widened."""
    jail, other, outside = tmp_path / "jail", tmp_path / "other", tmp_path / "outside"
    dotfiles = tmp_path / "dotfiles" / "hcp-linux"
    for d in (jail, other, outside, dotfiles):
        d.mkdir(parents=True)
    os.chmod(tmp_path, 0o755)
    (dotfiles / "policy.toml").write_text("read_only_jail = false\n")
    os.chmod(dotfiles / "policy.toml", 0o644)
    xdg = jail / "xdg"
    xdg.mkdir()
    link = xdg / "hcp-linux"
    link.symlink_to(dotfiles)
    env = _config_env(xdg)
    evil = jail / "evil"
    script = (f"mkdir -p {evil} && printf 'write_roots = [\"{outside}\"]\\n' > {evil}/policy.toml"
              f" && ln -sfn {evil} {link}.new && mv -T {link}.new {link} && echo moved")
    p = run_cli(jail, "/bin/sh", "-c", script, env=env, extra=["--no-config"])
    assert p.returncode == 0 and "moved" in p.stdout.decode(), show(p)
    assert os.readlink(link) == str(dotfiles), "the re-pointed link outlived the run"
    assert not _writes_outside(other, outside, env)
    # control: the same link, re-pointed by the user, widens the next run
    os.chmod(evil / "policy.toml", 0o644)
    link.unlink()
    link.symlink_to(evil)
    assert _writes_outside(other, outside, env)


#: Plant a file in bob's workspace, rewrite his file, take his lock's name, make carol's
#: workspace: what a run whose root holds the state dir would do to the next principal.
_TAMPER = ("cd {ws} && echo planted > bob/planted; echo evil > bob/notes;"
           " rm -f bob.lock && mkdir bob.lock; mkdir carol; ls")


def test_a_run_whose_root_holds_the_state_dir_cannot_touch_a_workspace(tmp_path: Path
                                                                       ) -> None:
    """The driver keeps every principal's persistent workspace, and its lock, under
    ``$XDG_STATE_HOME/hcp-linux``. A CLI run whose jail holds that (a home jail) tampers with
    bob's: refused, and bob's next run finds his file as he left it and nothing planted.
    Control: unconfined, the same script does all of it."""
    from hcp_linux.driver.driver import LinuxDriver
    from hcp_linux.policy.pack import load_pack
    from hcp_linux.policy.policy import Policy
    jail, scratch = tmp_path / "jail", tmp_path / "scratch"
    (tmp_path / "pack").mkdir()
    (tmp_path / "pack" / "pack.toml").write_text(
        'name = "pack"\n[wrap]\nbin = ["sh"]\n[wrap.workspace]\nmode = "workspace"\n')
    pack = load_pack(tmp_path / "pack" / "pack.toml")
    for d in (jail, scratch):
        d.mkdir()
    state = jail / "state"
    driver = LinuxDriver(Policy(jail=str(scratch)), state_dir=str(state / "hcp-linux"),
                         tmp_dir=str(scratch))
    r = driver.run(pack, ["sh", "-c", "echo mine > notes"], principal="bob", timeout=TIMEOUT)
    assert r.returncode == 0
    ws = state / "hcp-linux" / "workspaces" / "pack"
    before = sorted(os.listdir(ws))
    p = run_cli(jail, "/bin/sh", "-c", _TAMPER.format(ws=ws),
                env=caller_env({"XDG_STATE_HOME": str(state)}), extra=["--no-config"])
    assert "Read-only file system" in p.stderr.decode(), show(p)
    assert sorted(os.listdir(ws)) == before == ["bob", "bob.lock"]
    nxt = driver.run(pack, ["sh", "-c", "cat notes; ls"], principal="bob",
                     capture_output=True, timeout=TIMEOUT)
    assert nxt.stdout == b"mine\nnotes\n", nxt
    # control: the same script, unconfined, on a copy
    copy = tmp_path / "copy"
    shutil.copytree(ws, copy)
    control = subprocess.run(["/bin/sh", "-c", _TAMPER.format(ws=copy)], capture_output=True)
    assert control.returncode == 0, control
    assert sorted(os.listdir(copy)) == ["bob", "bob.lock", "carol"]
    assert (copy / "bob" / "planted").exists() and (copy / "bob.lock").is_dir()


def test_a_driver_s_own_state_dir_is_kept_from_every_run_of_its_process(tmp_path: Path
                                                                        ) -> None:
    """A driver given a ``state_dir`` of its own: a run of the same process (another
    driver's, or the Python API's) whose writable root holds it cannot make a workspace
    there: the directory, missing, is made before the run looks (the process's own:
    protect_directory) and is read-only to it; the command leaves nothing in it. Control:
    the same command with the state dir elsewhere makes it."""
    from hcp_linux import Sandbox
    from hcp_linux.driver.driver import LinuxDriver
    from hcp_linux.policy.policy import Policy
    jail = tmp_path / "jail"
    jail.mkdir()
    state = jail / "runtime-state"
    LinuxDriver(Policy(jail=str(tmp_path)), state_dir=str(state))
    script = "mkdir -p runtime-state/workspaces/p/mallory && echo x > runtime-state/x; ls -R"
    r = Sandbox(Policy(jail=str(jail))).run(["/bin/sh", "-c", script], capture_output=True,
                                            timeout=TIMEOUT)
    assert b"Read-only file system" in r.stderr, (r.stdout, r.stderr)
    assert state.is_dir() and os.listdir(state) == [], (r.stdout, r.stderr)
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    # control: not a state dir (a sibling name), the same command makes it
    r = Sandbox(Policy(jail=str(jail))).run(
        ["/bin/sh", "-c", script.replace("runtime-state", "other-dir")], capture_output=True,
        timeout=TIMEOUT)
    assert r.returncode == 0 and (jail / "other-dir" / "x").read_text() == "x\n", r


#: Plant a file in each ephemeral jail under DIR (argv: DIR), wherever one is: in the jail
#: home, or beside it. Waits up to 10 s for one to appear (another runtime starts it);
#: prints "planted N" (N jails written) or "none".
_PLANT = r"""
import glob, os, sys, time
d = sys.argv[1]
open(os.path.join(d, "ready"), "w").close()
deadline = time.monotonic() + 10
while True:
    jails = glob.glob(d + "/hcp-linux-jails-*/hcp-linux-*/jail") + glob.glob(d + "/hcp-linux-*/jail")
    if jails or time.monotonic() > deadline:
        break
    time.sleep(0.02)
n = 0
for j in jails:
    try:
        with open(os.path.join(j, "planted"), "w") as f:
            f.write("evil")
        n += 1
    except OSError as e:
        print("refused", e.strerror)
print("planted", n) if jails else print("none")
"""


def _ephemeral(tmp_path: Path) -> tuple[object, object]:
    from hcp_linux.driver.driver import LinuxDriver
    from hcp_linux.policy.pack import load_pack
    from hcp_linux.policy.policy import Policy
    (tmp_path / "pack").mkdir()
    (tmp_path / "pack" / "pack.toml").write_text(
        'name = "pack"\n[wrap]\nbin = ["sh"]\n[wrap.workspace]\nmode = "ephemeral"\n')
    shared = tmp_path / "tmp"
    shared.mkdir()
    return (LinuxDriver(Policy(jail=str(tmp_path / "pack")), tmp_dir=str(shared)),
            load_pack(tmp_path / "pack" / "pack.toml"))


@pytest.mark.parametrize("home", ["made before", "made during the run"])
def test_a_run_in_the_temp_dir_cannot_reach_another_run_s_jail(tmp_path: Path,
                                                                home: str) -> None:
    """A command run in the temp dir (jail /tmp, TMPDIR /tmp: an agent's ``cd /tmp``) while a
    driver runs another principal's ephemeral jail there: it cannot plant a file in that
    jail, whether the user's jail home existed when it started or was made by the driver
    during its run (this run made it when it found its root holding it, and has it
    read-only). The other run sees its jail as it made it. Control: the same plant,
    unconfined, reaches the jail, and the run sees it."""
    import threading
    driver, pack = _ephemeral(tmp_path)
    shared = tmp_path / "tmp"
    if home == "made before":
        jail_home_of(shared).mkdir(mode=0o700)
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "plant.py").write_text(_PLANT)
    script = str(tmp_path / "scripts" / "plant.py")

    def other_run(out: list) -> None:  # another principal's run, started once X is up
        wait_for(lambda: (shared / "ready").exists(), "the command to start")
        out.append(driver.run(pack, ["sh", "-c", "sleep 1; ls -A"], principal="bob",
                              capture_output=True, timeout=TIMEOUT))
    got: list = []
    t = threading.Thread(target=other_run, args=(got,))
    t.start()
    try:
        p = run_cli(shared, "python3", script, str(shared), extra=["--allow-bin", "python3",
                    "--read-only-root", str(tmp_path / "scripts")],
                    env=caller_env({"TMPDIR": str(shared)}))
    finally:
        t.join(TIMEOUT)
    assert "refused Read-only file system" in out(p) and "planted 0" in out(p), show(p)
    assert got[0].returncode == 0 and got[0].stdout == b"", got[0]
    # control: unconfined, the same plant reaches the other run's jail
    (shared / "ready").unlink()
    got.clear()
    t = threading.Thread(target=other_run, args=(got,))
    t.start()
    try:
        control = subprocess.run([sys.executable, script, str(shared)], capture_output=True,
                                 timeout=TIMEOUT)
    finally:
        t.join(TIMEOUT)
    assert control.stdout == b"planted 1\n", control
    assert got[0].stdout == b"planted\n", got[0]
