"""HCP §10 to the letter (issue #17): the allow-list names binaries, not file names; only
locale categories are inherited; a host path after any ``=`` is refused.

Each refusal is shown on the real kernel with the effect absent (the planted shell did not
run: no marker on disk; the smuggled value is not in the child's environment), next to a
negative control where the same action succeeds because the policy names it.
"""
from __future__ import annotations

import os
import shutil

import pytest

from hcp_linux.policy.allowlist import resolve_bin
from hcp_linux.errors import (BinNotFoundError, HostPathError, NotAllowlistedError,
                              PolicyError)
from hcp_linux.policy.policy import Policy
from hcp_linux.sandbox import Sandbox
from sandboxing import jail  # noqa: F401
from test_driver import TIMEOUT, Env, sh

SHELL = shutil.which("dash") or "/bin/sh"


@pytest.fixture
def env(tmp_path):
    return Env(tmp_path)


# --- the allow-list names binaries -----------------------------------------------------------

def test_a_shell_copied_into_the_jail_under_a_listed_name_does_not_run(jail):
    """`bin = ["cp", "printf"]`: `cp dash printf`, then `./printf` would be a shell."""
    sb = Sandbox(Policy(jail=str(jail), allow_bins=("cp", "printf")))
    r = sb.run(["cp", SHELL, "printf"], capture_output=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    planted = jail / "printf"
    assert planted.exists()
    marker = jail / "pwned"
    for request in ("./printf", str(planted)):
        with pytest.raises(NotAllowlistedError) as info:
            sb.run([request, "-c", f"echo pwned > {marker}"], timeout=TIMEOUT)
        assert info.value.exit_code == 127
        assert str(info.value) == f'bin "{request}" not allowlisted'
    assert not marker.exists()
    # the bare name still means the system's printf, not the jail's file
    r = sb.run(["printf", "%s", "-c"], capture_output=True, timeout=TIMEOUT)
    assert (r.returncode, r.stdout) == (0, b"-c") and not marker.exists()
    # negative control: an entry that names the planted path lets it run, and it is a shell
    named = Sandbox(Policy(jail=str(jail), allow_bins=(str(planted),)))
    r = named.run([str(planted), "-c", f"echo pwned > {marker}"], timeout=TIMEOUT)
    assert r.returncode == 0 and marker.read_text() == "pwned\n"


def test_a_listed_name_matches_the_same_binary_by_any_path(jail):
    sb = Sandbox(Policy(jail=str(jail), allow_bins=("sh",)))
    for path in ("/bin/sh", "/usr/bin/sh"):
        if os.path.exists(path):
            r = sb.run([path, "-c", "echo ok"], capture_output=True, timeout=TIMEOUT)
            assert (r.returncode, r.stdout) == (0, b"ok\n")
    # another binary that is not the PATH's sh, whatever it is called
    with pytest.raises(NotAllowlistedError):
        sb.run(["/usr/bin/env", "sh"], timeout=TIMEOUT)


def test_a_pack_bin_outside_the_pack_is_refused_by_name(env):
    """A bare `sh` entry; `./../outside/sh` is a shell outside the pack root."""
    outside = env.base / "outside"
    outside.mkdir()
    shutil.copy(SHELL, outside / "sh")
    pack = env.pack("ephemeral", bins=("sh",))
    d = env.driver()
    with pytest.raises(NotAllowlistedError) as info:
        d.run(pack, ["./../outside/sh", "-c", f"touch {env.marker}"], timeout=TIMEOUT)
    assert str(info.value) == 'bin "./../outside/sh" not allowlisted'
    assert not env.marker.exists() and env.leftovers() == []
    # negative control: the PATH's sh, by its bare name, runs and leaves the marker
    r = d.run(pack, sh(f"touch {env.marker}"), timeout=TIMEOUT)
    assert r.returncode == 0 and env.marker.exists()


def test_a_bare_name_never_resolves_into_a_writable_root(tmp_path):
    """On a PATH that holds a writable directory (native-local's host PATH), the listed
    name's file there is skipped: the command could have planted it."""
    w = tmp_path / "w"
    w.mkdir()
    tool = w / "true"
    tool.write_bytes(b"#!/bin/sh\necho planted\n")
    tool.chmod(0o755)
    host_path = f"{w}:/usr/bin:/bin"
    # negative control: without the writable root, the first file on the PATH wins
    assert resolve_bin("true", ("true",), cwd=str(tmp_path), native_local=True,
                       host_path=host_path) == str(tool)
    got = resolve_bin("true", ("true",), cwd=str(tmp_path), native_local=True,
                      host_path=host_path, writable=(str(w),))
    assert got != str(tool) and os.path.dirname(got) in ("/usr/bin", "/bin")
    # an entry naming the writable file's path is honoured: the policy said so
    assert resolve_bin(str(tool), (str(tool),), cwd=str(tmp_path),
                       writable=(str(w),)) == str(tool)
    with pytest.raises(NotAllowlistedError):
        resolve_bin(str(tool), ("true",), cwd=str(tmp_path), writable=(str(w),))
    with pytest.raises(BinNotFoundError):  # a PATH of only the writable dir: not the plant
        resolve_bin("true", ("true",), cwd=str(tmp_path), native_local=True, host_path=str(w),
               writable=(str(w),))


# --- locale categories only -------------------------------------------------------------------

def test_only_locale_categories_are_inherited(jail, monkeypatch):
    caller = {"LC_TIME": "C", "LC_DEPLOY_TOKEN": "s3cret-deploy",
              "LC_ALL": "../../../tmp/evil", "LANG": "C.UTF-8", "LC_MESSAGES": "x" * 200,
              "LC_CTYPE": "de_DE.ISO-8859-15@euro"}
    for key, value in caller.items():  # the runtime's own environment
        monkeypatch.setenv(key, value)
    sb = Sandbox(Policy(jail=str(jail), allow_bins=("env",)))
    r = sb.run(["env"], capture_output=True, timeout=TIMEOUT)
    got = dict(line.split("=", 1) for line in r.stdout.decode().splitlines())
    assert got["LC_TIME"] == "C" and got["LANG"] == "C.UTF-8"
    assert got["LC_CTYPE"] == "de_DE.ISO-8859-15@euro"
    for key in ("LC_DEPLOY_TOKEN", "LC_ALL", "LC_MESSAGES"):
        assert key not in got, got
    assert "s3cret-deploy" not in r.stdout.decode()
    assert "LC_DEPLOY_TOKEN" in r.receipt["env"]["removed"]
    # negative control: the same key passed explicitly (a deliberate grant) does arrive
    explicit = Sandbox(Policy(jail=str(jail), allow_bins=("env",),
                              env={"LC_DEPLOY_TOKEN": "granted"}))
    r = explicit.run(["env"], capture_output=True, timeout=TIMEOUT)
    assert b"LC_DEPLOY_TOKEN=granted\n" in r.stdout


# --- host paths after any "=" -----------------------------------------------------------------

@pytest.mark.parametrize("token", ["if=/etc/passwd", "of=/root/stolen", "x=y=/home/u/.ssh/id"])
def test_a_host_path_after_an_equals_sign_is_refused_before_spawn(env, token):
    pack = env.pack("ephemeral", bins=("sh",))
    d = env.driver()
    with pytest.raises(HostPathError) as info:
        d.run(pack, sh(f"touch {env.marker}", token), timeout=TIMEOUT)
    assert str(info.value) == "host path not allowed" and info.value.exit_code == 125
    assert not env.marker.exists() and env.leftovers() == []
    # negative control: the same token shape naming another root runs
    r = d.run(pack, sh(f"touch {env.marker}", "if=/usr/share"), timeout=TIMEOUT)
    assert r.returncode == 0 and env.marker.exists()


# --- file references stay out of the driver's own places ---------------------------------------

TOOL = "#!/bin/sh\necho genuine tool\n"


def test_an_output_into_the_pack_root_is_refused(env):
    pack = env.pack("ephemeral", bins=("sh", "bin/tool"), files={"bin/tool": TOOL})
    tool = env.base / "pack" / "bin" / "tool"
    d = env.driver()
    evil = 'printf "#!/bin/sh\\necho owned\\n" > "$2"'
    for spelling in (["-o", str(tool)], [f"--output={tool}"], ["--output", "bin/tool"]):
        cwd = str(env.base / "pack") if spelling[-1] == "bin/tool" else str(env.host)
        with pytest.raises(PolicyError) as info:
            d.run(pack, sh(evil, *spelling), cwd=cwd, timeout=TIMEOUT)
        assert "inside the pack root" in str(info.value), info.value
    assert tool.read_text() == TOOL and env.leftovers() == []
    r = d.run(pack, ["bin/tool"], capture_output=True, timeout=TIMEOUT)
    assert r.stdout == b"genuine tool\n"
    # negative control: the same output to a host dir outside the driver's places is written
    r = d.run(pack, sh(evil, "-o", str(env.host / "tool")), timeout=TIMEOUT)
    assert r.returncode == 0 and "owned" in (env.host / "tool").read_text()


def test_a_file_reference_into_another_principals_workspace_is_refused(env):
    pack = env.pack("workspace", bins=("sh",))
    d = env.driver()
    r = d.run(pack, sh("echo alice-secret > notes.txt"), principal="alice", timeout=TIMEOUT)
    alice = r.jail
    secret = os.path.join(alice, "notes.txt")
    assert open(secret).read() == "alice-secret\n"
    link = env.host / "innocent.txt"
    os.symlink(secret, link)
    for args in (["--file", secret], ["--file", str(link)], ["-o", secret]):
        with pytest.raises(PolicyError) as info:
            d.run(pack, sh('cat "$2"; echo bob > "$2"', *args), principal="bob",
                  capture_output=True, timeout=TIMEOUT)
        assert "state directory" in str(info.value)
    assert open(secret).read() == "alice-secret\n"
    # negative control: alice reaches her own file through workspace:
    r = d.run(pack, sh('cat "$1"', "workspace:notes.txt"), principal="alice",
              capture_output=True, timeout=TIMEOUT)
    assert r.stdout == b"alice-secret\n"


def test_a_file_reference_into_another_runs_jail_is_refused(env):
    pack = env.pack("ephemeral", bins=("sh",))
    d = env.driver()
    other = env.tmp / "hcp-linux-ephemeral-1-2-3" / "jail"
    other.mkdir(parents=True)
    (other / "data").write_text("other run\n")
    with pytest.raises(PolicyError) as info:
        d.run(pack, sh('cat "$2"', "--file", str(other / "data")), timeout=TIMEOUT)
    assert "another run's jail" in str(info.value)
    # negative control: a file beside those jails, not in one, is copied in
    (env.tmp / "plain.txt").write_text("plain\n")
    r = d.run(pack, sh('cat "$2"', "--file", str(env.tmp / "plain.txt")),
              capture_output=True, timeout=TIMEOUT)
    assert r.stdout == b"plain\n"


# --- a pack another runtime accepts runs unchanged ---------------------------------------------

def test_unknown_wrap_keys_are_ignored_and_named_in_the_receipt(env):
    extra = 'description = "made for another runtime"\ntimeout_hint = 30\n'
    pack = env.pack("ephemeral", bins=("sh",), extra=extra)
    assert pack.ignored_keys == ("wrap.description", "wrap.timeout_hint")
    d = env.driver()
    r = d.run(pack, sh(f"touch {env.marker}"), timeout=TIMEOUT)
    assert r.returncode == 0 and env.marker.exists()
    assert r.receipt["driver"]["ignored_keys"] == ["wrap.description", "wrap.timeout_hint"]
    # negative control: a pack without them has nothing to name
    plain = env.pack("ephemeral", bins=("sh",), name="plain")
    r = d.run(plain, sh("true"), timeout=TIMEOUT)
    assert r.receipt["driver"]["ignored_keys"] == []

