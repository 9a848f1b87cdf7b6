"""File references (HCP §10.6): each rewrite form, each refused path, staging and writeback.

The scanner is pure (nothing is created before it has accepted argv); staging and writeback
work on real directories. Whole runs through the kernel are in test_driver.py.
"""
from __future__ import annotations

import os

import pytest

from hcp_linux.errors import HostPathError, PolicyError
from hcp_linux.driver.fileref import (INPUT, JAIL, OUTPUT, WritebackError, check_host_path, is_host_path,
                               scan)
from hcp_linux.policy.pack import DEFAULT_FILE_FLAGS
from hcp_linux.driver.staging import Staging

FLAGS = DEFAULT_FILE_FLAGS


@pytest.fixture
def host(tmp_path):
    d = tmp_path / "host"
    d.mkdir()
    (d / "in.json").write_text('{"a": 1}')
    return d


def kinds(refs):
    return [(r.index, r.head, r.flag, r.kind, r.path) for r in refs]


def test_each_rewrite_form_is_found(host):
    cwd = str(host)
    argv = ["tool", "--file", "in.json", "--json-file=in.json", "-o", "out1", "-oout2",
            "--output=out3", "workspace:notes/a.txt", "--cfg=workspace:c.toml", "-o=out4",
            "plain", "--flag=value", "-oworkspace:w"]
    refs = scan(argv, FLAGS, cwd=cwd)
    h = os.path.join(cwd, "")
    assert kinds(refs) == [
        (2, "", "--file", INPUT, h + "in.json"),            # --flag value
        (3, "--json-file=", "--json-file", INPUT, h + "in.json"),  # --flag=value
        (5, "", "-o", OUTPUT, h + "out1"),                  # -o value
        (7, "--output=", "--output", OUTPUT, h + "out3"),
        (8, "", None, JAIL, "notes/a.txt"),                 # workspace: anywhere
        (9, "--cfg=", None, JAIL, "c.toml"),                # --any=workspace:...
        (13, "-o", None, JAIL, "w"),                        # -oworkspace: (no cluster spells it)
    ]


@pytest.mark.parametrize("argv", [
    ["grep", "-oE", "a|b", "file"],       # a getopt cluster: -o takes nothing in grep
    ["grep", "-Eo", "pattern"],
    ["tool", "-oout2"],                   # -oVALUE: the program decides; not rewritten
    ["tool", "-o=out4"],                  # getopt's value would be "=out4"
])
def test_attached_short_flags_are_left_to_the_program(host, argv):
    assert scan(argv, FLAGS, cwd=str(host)) == []
    assert sorted(os.listdir(host)) == ["in.json"]  # nothing staged, nothing created


@pytest.mark.parametrize("tok", [
    "if=/etc/passwd", "of=/root/x", "x=a=/home/u/.ssh/id", "--x=y=/Users/me", "-o=/etc/shadow",
    "-o/etc/shadow", "-o//root/k", "k=/proc/self/root/etc/passwd", "a=/tmp/../etc/hosts",
])
def test_a_host_path_after_any_equals_sign_is_refused(host, tok):
    with pytest.raises(HostPathError):
        scan(["tool", tok], FLAGS, cwd=str(host))


@pytest.mark.parametrize("tok", ["if=/tmp/x", "of=/usr/share/dict", "a=b", "x=workspace:y",
                                 "-o/tmp/ok", "--x=/var/tmp/ok", "/usr/bin/env"])
def test_paths_outside_the_forbidden_roots_after_equals_pass(host, tok):
    # the negative control of the test above: the same shapes, other roots
    scan(["tool", tok], FLAGS, cwd=str(host))


def test_workspace_prefix_as_file_flag_value_is_a_jail_ref(host):
    refs = scan(["t", "--output", "workspace:out.txt", "--file=workspace:"], FLAGS, cwd=str(host))
    assert kinds(refs) == [(2, "", "--output", JAIL, "out.txt"), (3, "--file=", "--file", JAIL, ".")]


def test_stdio_conventions_and_end_of_options(host):
    # "-" and /dev/std* are the tool's stdio (the child has its own /dev): left alone.
    # After "--" nothing is a flag (but workspace: still is).
    refs = scan(["t", "--file", "-", "-o", "/dev/null", "--output=/dev/stdout",
                 "--file=/dev/stdin", "--", "--file", "x", "workspace:y"], FLAGS, cwd=str(host))
    assert kinds(refs) == [(10, "", None, JAIL, "y")]


def test_custom_file_flags(host):
    refs = scan(["t", "--file", "whatever", "-i", "in.json"], ("-i",), cwd=str(host))
    assert [r.flag for r in refs] == ["-i"]


HOST_PATHS = ["/etc/passwd", "/etc", "/home/user/.ssh/id_rsa", "/root/.bashrc", "/Users/me/x",
              "//etc/shadow", "/./etc/x", "/tmp/../etc/passwd", "/proc/self/root/etc/passwd",
              "/proc/1/root", "/proc/self/cwd/x", "/proc/thread-self/root/home"]


@pytest.mark.parametrize("path", HOST_PATHS)
@pytest.mark.parametrize("form", ["positional", "eq", "flag", "flag-eq"])
def test_host_paths_are_refused_in_every_form(host, path, form):
    argv = {"positional": ["t", path], "eq": ["t", f"--config={path}"],
            "flag": ["t", "--file", path], "flag-eq": ["t", f"--output={path}"]}[form]
    with pytest.raises(HostPathError) as info:
        scan(argv, FLAGS, cwd=str(host))
    assert str(info.value) == "host path not allowed"
    assert info.value.exit_code == 125


def test_relative_file_refs_resolve_against_the_callers_cwd():
    # From /etc, "passwd" is /etc/passwd: refused like the absolute path.
    with pytest.raises(HostPathError):
        scan(["t", "--file", "passwd"], FLAGS, cwd="/etc")
    with pytest.raises(HostPathError):
        scan(["t", "--file", "../etc/passwd"], FLAGS, cwd="/usr")


def test_host_symlink_into_forbidden_tree_is_refused(host):
    os.symlink("/etc/passwd", host / "link")
    with pytest.raises(HostPathError):
        scan(["t", "--file", "link"], FLAGS, cwd=str(host))
    with pytest.raises(HostPathError):
        scan(["t", str(host / "link")], FLAGS, cwd=str(host))  # positional too


def test_file_refs_into_proc_are_refused(host):
    # The driver itself would read these: /proc/self/environ holds the runtime's secrets.
    for p in ("/proc/self/environ", "/dev/fd/0", "/dev/tty", "/sys/kernel/notes"):
        with pytest.raises(HostPathError):
            scan(["t", "--file", p], FLAGS, cwd=str(host))
    # As a plain argument the child reads its own /proc, which the kernel scopes.
    assert scan(["t", "/proc/self/status"], FLAGS, cwd=str(host)) == []


def test_allowed_absolute_paths_pass(host):
    assert scan(["t", "/usr/share", "--cfg=/opt/x", "/tmp/x"], FLAGS, cwd=str(host)) == []
    assert not is_host_path("/etcetera") and not is_host_path("/homer")
    check_host_path("/usr/bin/env")


@pytest.mark.parametrize("value", ["workspace:../x", "workspace:a/../../x", "workspace:..",
                                   "workspace:/etc/passwd", "workspace:/proc/self/root/etc"])
def test_workspace_escapes_are_refused(host, value):
    with pytest.raises(PolicyError, match="escapes the workspace|relative to the workspace"):
        scan(["t", value], FLAGS, cwd=str(host))
    with pytest.raises(PolicyError):
        scan(["t", "--file", value], FLAGS, cwd=str(host))


def test_workspace_dotdot_that_stays_inside_is_fine(host):
    assert kinds(scan(["t", "workspace:a/../b"], FLAGS, cwd=str(host))) == [(1, "", None, JAIL, "b")]


def test_bad_outputs_are_refused_naming_the_path(host):
    (host / "dir").mkdir()
    (host / "target").write_text("keep")
    os.symlink(host / "target", host / "link")
    os.symlink(host / "dir", host / "linkdir")
    cases = {
        "dir": f"--output {host}/dir: is a directory",
        "link": f"--output {host}/link: is a symlink",
        "linkdir/x": f"--output {host}/linkdir/x: directory {host}/linkdir is a symlink",
        "nodir/x": f"--output {host}/nodir/x: directory {host}/nodir does not exist",
        "in.json/x": f"{host}/in.json is not a directory",
    }
    for value, message in cases.items():
        with pytest.raises(PolicyError) as info:
            scan(["t", "--output", value], FLAGS, cwd=str(host))
        assert message in str(info.value)
    assert (host / "target").read_text() == "keep"


def test_bad_inputs_are_refused_naming_the_path(host):
    (host / "dir").mkdir()
    with pytest.raises(PolicyError, match=f"--file {host}/missing: no such file"):
        scan(["t", "--file", "missing"], FLAGS, cwd=str(host))
    with pytest.raises(PolicyError, match="is a directory"):
        scan(["t", "--file", "dir"], FLAGS, cwd=str(host))
    with pytest.raises(PolicyError, match="expects a file name after it"):
        scan(["t", "--file"], FLAGS, cwd=str(host))
    with pytest.raises(PolicyError, match="empty file name"):
        scan(["t", "--file="], FLAGS, cwd=str(host))


# --- staging and writeback on real directories -----------------------------------------

@pytest.fixture
def jail(tmp_path):
    d = tmp_path / "jail"
    d.mkdir()
    return d


def test_staging_copies_inputs_and_stages_outputs(host, jail):
    argv = ["t", "--file", "in.json", "-o", "out.txt", "workspace:w.txt"]
    refs = scan(argv, FLAGS, cwd=str(host))
    st = Staging(str(jail))
    try:
        new = st.rewrite(argv, refs)
        assert new[0] == "t"
        assert new[2] == f"{jail}/.hcp-io/in/0/in.json"
        assert open(new[2]).read() == '{"a": 1}'
        assert new[4] == f"{jail}/.hcp-io/out/1/out.txt"
        assert new[5] == f"{jail}/w.txt"
        with open(new[4], "w") as f:
            f.write("result")
        written, missing = st.writeback()
        assert written == [f"{host}/out.txt"] and missing == []
        assert (host / "out.txt").read_text() == "result"
    finally:
        st.close(remove=True)
    assert not (jail / ".hcp-io").exists()
    assert sorted(os.listdir(host)) == ["in.json", "out.txt"]  # no temp file left


def test_writeback_preserves_mode_and_reports_missing(host, jail):
    dest = host / "keep.txt"
    dest.write_text("old")
    os.chmod(dest, 0o640)
    refs = scan(["t", "-o", "keep.txt", "--output", "never.txt"], FLAGS, cwd=str(host))
    st = Staging(str(jail))
    try:
        new = st.rewrite(["t", "-o", "keep.txt", "--output", "never.txt"], refs)
        with open(new[2], "w") as f:
            f.write("new")
        written, missing = st.writeback()
    finally:
        st.close(remove=False)
    assert written == [str(dest)] and missing == [str(host / "never.txt")]
    assert dest.read_text() == "new" and (os.stat(dest).st_mode & 0o777) == 0o640
    assert not (host / "never.txt").exists()


def test_jail_symlink_escape_is_refused(host, jail):
    os.symlink("/etc", jail / "etc")
    os.symlink(host, jail / "out")
    os.mkdir(jail / "sub")
    os.symlink("sub", jail / "inside")
    st = Staging(str(jail))
    try:
        for value in ("workspace:etc/passwd", "workspace:out", "workspace:out/x"):
            with pytest.raises(PolicyError, match="escapes the workspace \\(symlink\\)"):
                st.rewrite(["t", value], scan(["t", value], FLAGS, cwd=str(host)))
        # A symlink that stays inside the jail is fine.
        assert st.rewrite(["t", "workspace:inside/f"],
                          scan(["t", "workspace:inside/f"], FLAGS, cwd=str(host))) == \
            ["t", f"{jail}/inside/f"]
    finally:
        st.close(remove=True)


def test_writeback_refuses_what_the_tool_left_in_staging(host, jail, tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("only the driver can read this")
    for planted in ("symlink", "hardlink", "fifo", "dir"):
        dest = host / "out.txt"
        dest.write_text("old")
        argv = ["t", "-o", "out.txt"]
        st = Staging(str(jail))
        try:
            staged = st.rewrite(argv, scan(argv, FLAGS, cwd=str(host)))[2]
            if planted == "symlink":
                os.symlink(secret, staged)
            elif planted == "hardlink":
                os.link(secret, staged)
            elif planted == "fifo":
                os.mkfifo(staged)
            else:
                os.mkdir(staged)
            with pytest.raises(WritebackError, match=f"writeback {dest}: the tool left"):
                st.writeback()
        finally:
            st.close(remove=True)
        assert dest.read_text() == "old", planted
        assert sorted(os.listdir(host)) == ["in.json", "out.txt"]


def test_writeback_refuses_a_destination_that_became_a_symlink(host, jail, tmp_path):
    target = tmp_path / "target"
    target.write_text("untouched")
    argv = ["t", "--output", "out.txt"]
    st = Staging(str(jail))
    try:
        staged = st.rewrite(argv, scan(argv, FLAGS, cwd=str(host)))[2]
        with open(staged, "w") as f:
            f.write("new")
        os.symlink(target, host / "out.txt")  # swapped in after the checks
        with pytest.raises(WritebackError, match="became a symlink"):
            st.writeback()
        os.unlink(host / "out.txt")
        os.mkdir(host / "out.txt")
        with pytest.raises(WritebackError, match="became a directory"):
            st.writeback()
    finally:
        st.close(remove=True)
    assert target.read_text() == "untouched"
    assert os.listdir(host / "out.txt") == []


def test_staging_resets_a_planted_io_dir(host, jail, tmp_path):
    # A previous run's child may leave .hcp-io as a symlink: it is removed, never followed.
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "f").write_text("x")
    os.symlink(victim, jail / ".hcp-io")
    argv = ["t", "--file", "in.json"]
    st = Staging(str(jail))
    try:
        st.rewrite(argv, scan(argv, FLAGS, cwd=str(host)))
        assert not os.path.islink(jail / ".hcp-io")
    finally:
        st.close(remove=True)
    assert (victim / "f").read_text() == "x" and os.listdir(victim) == ["f"]
