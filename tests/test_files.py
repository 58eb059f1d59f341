"""The one atomic writer (servesim.simcore.files.write_atomic) every result file goes through."""

from __future__ import annotations

import os
import stat

import pytest

from servesim.simcore.files import current_umask, write_atomic


def test_text_bytes_and_writer_functions_land_whole(tmp_path):
    assert write_atomic(tmp_path / "a.txt", "héllo\n").read_bytes() == "héllo\n".encode()
    assert write_atomic(tmp_path / "b.bin", b"\x00\x01").read_bytes() == b"\x00\x01"
    assert write_atomic(tmp_path / "c.bin", lambda fh: fh.write(b"xyz")).read_bytes() == b"xyz"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.bin", "c.bin"]


def test_a_failing_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    target = write_atomic(tmp_path / "table.csv", "old\n")

    def broken(fh):
        fh.write(b"half a ")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_atomic(target, broken)
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["table.csv"]


def test_the_file_gets_the_permissions_open_would_give(tmp_path):
    target = write_atomic(tmp_path / "x.txt", "x")
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o666 & ~current_umask()
