"""hcp_linux.policy.protected.git_config reads git's config syntax as git does: on generated files
that `git config --list` accepts, the variables are git's own, in order; on any bytes it
returns, never raises; redirects() follows includes as git would and says where hooks go."""
from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

from hypothesis import example, given, settings, strategies as st

from hcp_linux.policy.protected.git_config import entries, redirects


def _git_list(data: bytes) -> list[tuple[str, str]] | None:
    with tempfile.NamedTemporaryFile() as f:
        f.write(data)
        f.flush()
        p = subprocess.run(["git", "config", "--file", f.name, "--list", "--null",
                            "--no-includes"], capture_output=True,
                           env={**os.environ, "GIT_CONFIG_NOSYSTEM": "1"})
    if p.returncode != 0:
        return None
    out = []
    for item in p.stdout.split(b"\0")[:-1]:
        key, newline, value = item.decode("utf-8", "surrogateescape").partition("\n")
        out.append((key, value if newline else "true"))  # a key alone: true
    return out


def _ours(data: bytes) -> list[tuple[str, str]]:
    return [(f"{section}.{key}", value) for section, key, value in entries(data)]


SECTIONS = st.sampled_from(["[core]", "[Core]", "[include]", '[includeIf "gitdir:~/w/"]',
                            '[remote "Origin"]', "[a.B]", '[x "q\\"s"]', "[bad", "[]",
                            '[s "a]b"]', "[ core ]"])
KEYS = st.sampled_from(["hooksPath", "path", "url", "bare", "k-2", "fsmonitor", "2bad", ""])
VALUE_CHARS = st.sampled_from(list("ab ~./_\t") + ['"', "\\", "#", ";", "=", "\\n", "\\t",
                                                   "\\\n", "\\\"", "\r"])
VALUES = st.lists(VALUE_CHARS, max_size=12).map("".join)
LINES = st.one_of(
    SECTIONS,
    st.tuples(st.sampled_from(["", " ", "\t"]), KEYS, st.sampled_from(["", " "]),
              st.sampled_from(["=", " = ", ""]), VALUES).map("".join),
    st.sampled_from(["# comment", "; comment", "", "   "]),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(LINES, max_size=8))
# blanks before a continuation are written out even when nothing follows it (git 2.39;
# found by this test on a stock Debian): a hooksPath of "a " is not "a"
@example(["[core]", "hooksPath=a \\"])
@example(["[core]", "hooksPath=a \t\\", "# c", "bare"])
@example(["[core]", "hooksPath= \\", " a"])
@example(["[core]", 'hooksPath="" \\', "a \\", ""])
def test_it_reads_what_git_reads(lines: list[str]) -> None:
    data = ("\n".join(lines) + "\n").encode()
    expected = _git_list(data)
    if expected is None:
        return  # git refuses the file: so does git itself, whatever we read
    # a variable before any section has no name git looks up (git lists it bare)
    assert _ours(data) == [(k, v) for k, v in expected if "." in k], data


@settings(max_examples=600, deadline=None)
@given(st.binary(max_size=400))
def test_any_bytes_never_raise(data: bytes) -> None:
    for blob in (data, b"[core]\n" + data, b"[core]\nhooksPath = " + data):
        for section, key, value in entries(blob):
            assert isinstance(section, str) and isinstance(key, str) and isinstance(value, str)


def test_redirects_follow_includes(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "shared.gitconfig").write_text("[include]\n\tpath = more.gitconfig\n")
    (repo / "more.gitconfig").write_text("[core]\n\thooksPath = hooks-from-include\n")
    (repo / ".git" / "config").write_text(
        '[core]\n\thooksPath = .husky/_\n[include]\n\tpath = ../shared.gitconfig\n'
        '[includeIf "gitdir:/nowhere/"]\n\tpath = /abs/missing.gitconfig\n')
    hooks, included = redirects(str(repo / ".git" / "config"), str(repo))
    assert hooks == [str(repo / ".husky" / "_"), str(repo / "hooks-from-include")]
    assert included == [str(repo / "shared.gitconfig"), "/abs/missing.gitconfig",
                        str(repo / "more.gitconfig")]


def test_an_include_loop_ends(tmp_path: Path) -> None:
    (tmp_path / "a").write_text("[include]\n\tpath = b\n")
    (tmp_path / "b").write_text("[include]\n\tpath = a\n[core]\n\thooksPath = /h\n")
    hooks, included = redirects(str(tmp_path / "a"), str(tmp_path))
    assert hooks == ["/h"] and included == [str(tmp_path / "b"), str(tmp_path / "a")]


def test_a_value_of_many_continuations_and_blanks_is_read_in_linear_time() -> None:
    """A config is the run's to write (a nested repository's), and the runtime reads it
    unconfined before the next run. A value of N continuations (each an empty piece) then
    M blanks was read in N*M steps: a 1 MiB one held every later run in that jail for
    minutes. Read here in a child with the suite's timeout (a hang detector, not a speed
    limit), and what it reads of a smaller one is git's reading."""
    import sys
    from sandboxing import TIMEOUT
    big = b"[core]\n\tk = " + b"\\\n" * 262_000 + b" " * 524_000 + b"x\n"
    code = ("import sys\nfrom hcp_linux.policy.protected.git_config import entries\n"
            "print(len(entries(sys.stdin.buffer.read())))")
    p = subprocess.run([sys.executable, "-c", code], input=big, capture_output=True,
                       timeout=TIMEOUT)
    assert p.stdout.strip() == b"1", p.stderr
    small = b"[core]\n\tk = " + b"\\\n" * 50 + b" " * 50 + b"x \\\n y\n"
    assert _ours(small) == _git_list(small)
