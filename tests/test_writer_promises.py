"""Black-box attacks on the Writer: each test quotes the promise it checks."""

from __future__ import annotations

import os
import time

import pytest

import evalue_store as evs


def test_forked_child_does_not_keep_the_writer_lock_after_the_parent_closes(tmp_path):
    """README: "One writer per file: a second gets evs.WriterLockedError" and THREAT_MODEL:
    "A forked child inherits it but cannot use it ... the child's abort(), close() or garbage
    collection leaves the parent's file alone".

    A child forked while a Writer is open (a DataLoader worker, a multiprocessing pool) and
    that never touches it keeps the inherited descriptor, and with it the flock: after the
    parent closes its Writer, reopening the file gets WriterLockedError ("another writer has
    this file open") although no writer exists anywhere.
    """
    path = tmp_path / "d.evs"
    w = evs.Writer(path, "w")
    w.append([1])
    w.commit()
    r, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # a worker that does unrelated work for a while
        os.close(wfd)
        os.read(r, 1)
        os._exit(0)
    os.close(r)
    try:
        w.append([2])
        w.close()
        # no Writer is open anywhere now: the parent closed its one, the child never used it
        with evs.Writer(path, "a") as w2:
            w2.append([3])
    finally:
        os.write(wfd, b"x")
        os.close(wfd)
        os.waitpid(pid, 0)
    assert [rec[0] for rec in evs.open(path)] == [1, 2, 3]


def test_recover_is_not_blocked_by_a_forked_child_that_never_used_the_writer(tmp_path):
    """Same defect seen through `evs.recover`: a file whose writer closed cleanly is reported
    as held by "another writer" as long as any child forked during the writer's life runs."""
    path = tmp_path / "d.evs"
    w = evs.Writer(path, "w")
    pid = os.fork()
    if pid == 0:
        time.sleep(3)
        os._exit(0)
    try:
        w.append([1])
        w.close()
        evs.recover(path)  # nothing to recover, but it must not say a writer holds it
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)


def _nested(depth: int) -> list:
    x: list = []
    for _ in range(depth):
        x = [x]
    return x


@pytest.mark.parametrize("where", ["constructor", "set_metadata"])
def test_deeply_nested_metadata_raises_encode_error_not_recursion_error(tmp_path, where):
    """README: "Values that cannot be stored raise evs.EncodeError" and "Every error is an
    evs.Error". Metadata nested 1000 deep (or 5000) escapes as a bare RecursionError."""
    path = tmp_path / "m.evs"
    md = {"a": _nested(5000)}
    with pytest.raises(evs.EncodeError):
        if where == "constructor":
            evs.Writer(path, "w", metadata=md).close()
        else:
            with evs.Writer(path, "w") as w:
                w.set_metadata(md)
                w.commit()


def test_a_reader_never_sees_a_new_file_before_its_header(tmp_path):
    """THREAT_MODEL: "Readers take no lock. They see the last commit as of open()/refresh()
    and never a partly written one"; FORMAT.md §11 rule 1: a writer "SHOULD commit once
    when it creates a file (commit 1, no records), so that a new file is at once a valid
    container".

    A new file is created in place (O_CREAT|O_EXCL under its own name), then its header and
    first commit are written: a reader that opens it in between (a consumer polling for the
    next shard, `open_shards` on a folder a job is writing, `evalue-store info` in a loop)
    gets "FormatError: empty file, not an evalue_store container" (24 of 300 opens here).
    A writer killed in that window leaves such a file for good. (Replacement with mode "w"
    already goes through a temporary name and a rename.)"""
    n = 300
    pid = os.fork()
    if pid == 0:
        try:
            for i in range(n):
                with evs.Writer(tmp_path / f"f{i}.evs", "x") as w:
                    w.append([i])
                time.sleep(0.002)
        finally:
            os._exit(0)
    errors = []
    try:
        for i in range(n):
            path = tmp_path / f"f{i}.evs"
            while not path.exists():
                pass
            try:
                evs.open(path)
            except evs.FormatError as e:
                errors.append(str(e))
    finally:
        os.waitpid(pid, 0)
    assert not errors, f"{len(errors)} of {n} opens of a new file failed, e.g. {errors[0]}"


def test_a_dataset_opened_by_a_relative_path_stays_on_its_file_after_chdir(tmp_path):
    """README: "`refresh()` picks up newer commits; pickling sends only the path"; THREAT_MODEL:
    refresh() "reports a change when the path now names another file".

    A Dataset opened with a relative path keeps it relative: after `os.chdir` (Hydra changes
    the working directory of every run, so do many launchers), `refresh()` silently switches
    to whatever file that name means in the new directory, and a pickled copy (a DataLoader
    worker under spawn) opens that other file too. `open_shards` and `EValueDataset` resolve
    the path at open and keep reading the right file."""
    import pickle

    for name, value in (("a", "A"), ("b", "B")):
        (tmp_path / name).mkdir()
        with evs.Writer(tmp_path / name / "t.evs", "w") as w:
            w.append([value])
    old = os.getcwd()
    try:
        os.chdir(tmp_path / "a")
        ds = evs.open("t.evs")
        os.chdir(tmp_path / "b")
        copy = pickle.loads(pickle.dumps(ds))
        ds.refresh()
        assert ds[0] == ["A"], "refresh() moved to another directory's file"
        assert copy[0] == ["A"], "the pickled dataset opened another directory's file"
    finally:
        os.chdir(old)


@pytest.mark.parametrize("alignment", [64.0, "64", True])
def test_an_alignment_that_is_no_int_is_a_clear_error(tmp_path, alignment):
    """Writer(alignment=64.0) or "64" failed inside the power-of-two check with an unrelated
    TypeError about operands; True was taken for the int 1."""
    with pytest.raises((TypeError, ValueError), match="alignment must be"):
        evs.Writer(tmp_path / "a.evs", "w", alignment=alignment)
    assert not (tmp_path / "a.evs").exists()


@pytest.mark.parametrize(
    "created, asked",
    [
        ({"alignment": 4096}, {"alignment": 64}),
        ({}, {"alignment": 4096}),
        ({"format_version": "1.0"}, {"format_version": "1.1"}),
        ({}, {"format_version": "1.0"}),
        ({}, {"compression": "zstd"}),
        ({"compression": "zstd"}, {"alignment": 128}),
    ],
)
def test_append_refuses_options_the_file_contradicts(tmp_path, created, asked):
    """README: mode "a" keeps the file's alignment, format version and compression; an
    explicit option that differs raises ValueError and leaves the file as it was."""
    path = tmp_path / "f.evs"
    with evs.Writer(path, **created) as w:
        w.append([1])
    before = path.read_bytes()
    name = next(iter(asked))
    with pytest.raises(ValueError, match=f"{name}=.*appending keeps it"):
        evs.Writer(path, "a", **asked)
    assert path.read_bytes() == before
    with evs.Writer(path, "a", **created) as w:  # the file's own values are fine
        w.append([2])
    with evs.open(path) as ds:
        assert [r[0] for r in ds] == [1, 2]
        assert ds.header.alignment == created.get("alignment", 64)
