"""Black-box attacks on recovery (`evs.recover`, `Writer(mode="a")`) of plain files."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import textwrap

import evalue_store as evs


def test_recovering_a_torn_big_record_does_not_hold_the_tail_in_memory(tmp_path):
    """THREAT_MODEL: "Opening, reading, iterating and verifying any file ... ends in a result or
    an evs.FormatError in bounded time and memory. The same holds ... for evs.recover /
    Writer(mode="a") on any file"; RELIABILITY/THREAT_MODEL show verify reading "1 MiB at a
    time" so that a 1 GiB run is no MemoryError.

    A writer killed while writing one big tensor (README: big records are written directly,
    5 GiB tensors are a benchmark case) leaves a torn frame; recovering it copies the torn
    bytes to the side file, and does so by holding all of them in memory at once: a 384 MiB
    torn tail raises peak RSS by ~384 MiB (1 GiB: +1024 MiB), so a machine with less free
    memory than the torn record cannot recover the file, nor append to it.
    """
    path = tmp_path / "t.evs"
    with evs.Writer(path, "w") as w:
        w.append(["x"])
    size = os.path.getsize(path)
    tail = 384 << 20
    with open(path, "r+b") as f:
        f.seek(size)
        f.write(b"EVR1" + struct.pack("<IQ", 0, 1 << 31))  # frame header of a 2 GiB record
        f.truncate(size + 16 + tail)  # of which 384 MiB reached the file (sparse: fast)
    script = textwrap.dedent(
        f"""
        import resource, evalue_store as evs
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        evs.recover({str(path)!r})
        print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr
    grew_mib = int(out.stdout.split()[-1])
    assert len(evs.open(path)) == 1
    side = [p for p in tmp_path.iterdir() if ".tail-" in p.name]
    assert len(side) == 1 and side[0].stat().st_size == 16 + tail
    assert grew_mib < 128, f"recover's peak RSS grew by {grew_mib} MiB for a {tail >> 20} MiB tail"


def test_recover_appends_a_counter_when_the_side_file_name_is_taken_by_a_symlink(tmp_path):
    """FORMAT.md §12: the side file is "<path>.tail-<keep> (decimal; if the name exists,
    .1, .2, ... is appended)"; THREAT_MODEL: recover on any file ends in a result or a
    FormatError. A dangling symlink at that name (left by a cleanup script, or planted) makes
    recover fail with a bare FileExistsError instead of taking the next name. (Refusing to
    follow it is right; giving up is not.)"""
    path = tmp_path / "t.evs"
    with evs.Writer(path, "w") as w:
        w.append(["x"])
    size = os.path.getsize(path)
    with open(path, "ab") as f:
        f.write(b"GARBAGE!" * 10)
    for off in range(size - 64, size + 65):
        os.symlink(tmp_path / f"elsewhere-{off}", tmp_path / f"t.evs.tail-{off}")
    result = evs.recover(path)
    assert result.side_file is not None
    assert not any(p.name.startswith("elsewhere-") for p in tmp_path.iterdir())
    assert len(evs.open(path)) == 1
