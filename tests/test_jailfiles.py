"""Files in a jail read and written by descriptor (hcp_linux.jails.jailfiles), without Ray.

Each refusal is shown on disk: what a planted symlink, FIFO or hard link points at is
untouched, next to the negative control that a plain open() through the same path does
follow it.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import pytest

from hcp_linux.errors import PolicyError
from hcp_linux.jails.jailfiles import open_jail, read_in, write_in


@pytest.fixture
def jail(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    d = tmp_path / "jail"
    d.mkdir()
    fd = open_jail(str(d))
    try:
        yield d, fd
    finally:
        os.close(fd)


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    v = tmp_path / "outside" / "victim.txt"
    v.parent.mkdir()
    v.write_text("outside\n")
    return v


def test_round_trip_makes_parents(jail) -> None:
    d, fd = jail
    write_in(fd, "a/b/c.txt", b"hello")
    write_in(fd, "a/b/c.txt", b" world", append=True)
    assert (d / "a" / "b" / "c.txt").read_bytes() == b"hello world"
    assert read_in(fd, "./a//b/c.txt") == b"hello world"
    write_in(fd, "a/b/c.txt", b"x")  # not append: replaced, not grown
    assert read_in(fd, "a/b/c.txt") == b"x"


@pytest.mark.parametrize("path", ["", "/etc/passwd", "../x", "a/../../x", ".", "a/\0b"])
def test_paths_that_leave_or_name_no_file_are_refused(jail, path) -> None:
    _, fd = jail
    with pytest.raises(PolicyError):
        write_in(fd, path, b"x")
    with pytest.raises(PolicyError):
        read_in(fd, path)


def test_a_symlink_planted_anywhere_on_the_path_is_not_followed(jail, victim) -> None:
    d, fd = jail
    os.symlink(victim, d / "link.txt")                # the file itself
    os.symlink(victim.parent, d / "dirlink")          # a directory on the way
    (d / "sub").mkdir()
    os.symlink("../../outside/victim.txt", d / "sub" / "rel.txt")  # relative, climbing out
    for path in ("link.txt", "dirlink/victim.txt", "sub/rel.txt"):
        with pytest.raises(PolicyError):
            write_in(fd, path, b"owned\n")
        with pytest.raises(PolicyError):
            read_in(fd, path)
    assert victim.read_text() == "outside\n"
    # negative control: an ordinary open through the same path follows the link and writes
    with open(d / "link.txt", "w") as f:
        f.write("owned\n")
    assert victim.read_text() == "owned\n"


def test_a_hard_link_to_an_outside_file_is_refused(jail, victim) -> None:
    d, fd = jail
    os.link(victim, d / "hard.txt")
    with pytest.raises(PolicyError):
        write_in(fd, "hard.txt", b"owned\n")
    with pytest.raises(PolicyError):
        read_in(fd, "hard.txt")
    assert victim.read_text() == "outside\n"


def test_a_fifo_is_refused_without_blocking(jail) -> None:
    d, fd = jail
    os.mkfifo(d / "fifo")
    with pytest.raises(PolicyError):
        read_in(fd, "fifo")  # would block forever in open() without O_NONBLOCK
    with pytest.raises(PolicyError):
        write_in(fd, "fifo", b"x")


def test_a_jail_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "link")
    with pytest.raises(OSError):
        open_jail(str(tmp_path / "link"))
    os.close(open_jail(str(tmp_path / "real")))  # control: the directory itself opens
