"""The ``evalue-store`` command line, run as a subprocess on real (and damaged) files."""

from __future__ import annotations

import errno
import io
import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys
import warnings
import zipfile
from contextlib import redirect_stderr, redirect_stdout
from html.parser import HTMLParser

import numpy as np
import pytest

import evalue_store as evs
from evalue_store import cli, java

ENV = {**os.environ, "PYTHONUTF8": "1"}


def run(
    *args: object, code: int = 0, env: dict | None = None, inprocess: bool = False
) -> subprocess.CompletedProcess:
    """``python -m evalue_store ARGS``; checks the exit code and the one-line error rule.

    ``inprocess`` calls ``cli.main`` directly instead: the same checks, without the
    interpreter start-up, for the many variations of a command already run for real.
    """
    if inprocess:
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            try:
                returncode = cli.main([str(a) for a in args])
            except SystemExit as exc:  # argparse's exits
                returncode = exc.code
        proc = subprocess.CompletedProcess(args, returncode, out.getvalue(), err.getvalue())
    else:
        proc = subprocess.run(
            [sys.executable, "-m", "evalue_store", *map(str, args)],
            capture_output=True,
            text=True,
            timeout=60,
            env=env or ENV,
        )
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    if code and not (code == 1 and proc.stdout and not proc.stderr):  # else a problem report
        assert proc.stderr.startswith("evalue-store: "), proc.stderr
        assert proc.stderr.count("\n") == 1, proc.stderr
    return proc


def w1_record(i: int) -> list:
    rng = np.random.default_rng(i)
    return [
        rng.integers(0, 1000, 8, dtype=np.int64),
        rng.standard_normal(4).astype(np.float32),
        int(i % 3),
        f"id-{i}",
    ]


def write_npz_dir(folder, n: int = 12) -> list[list]:
    """n .npz files named 1.npz .. n.npz; keys in a non-alphabetical stored order."""
    folder.mkdir()
    records = [w1_record(i) for i in range(n)]
    for i, (tokens, features, label, ident) in enumerate(records):
        np.savez(folder / f"{i + 1}.npz", tokens=tokens, features=features, label=label, id=ident)
    (folder / "README.txt").write_text("not data")
    return records


def same_record(got: list, want: list) -> bool:
    if len(got) != len(want):
        return False
    for g, w in zip(got, want):
        if isinstance(w, np.ndarray):
            if not (isinstance(g, np.ndarray) and g.dtype == w.dtype and np.array_equal(g, w)):
                return False
        elif type(g) is not type(w) or g != w:
            return False
    return True


@pytest.fixture
def packed(tmp_path):
    """A container packed from a folder of .npz files, and the records it must hold."""
    records = write_npz_dir(tmp_path / "samples")
    out = tmp_path / "train.evs"
    proc = run("pack", tmp_path / "samples", "-o", out, "--metadata", '{"split": "train"}')
    assert "packed 12 records from 12 files" in proc.stdout
    return out, records


def flip_byte(path, record: int, at: int = 40) -> None:
    with evs.open(path) as ds:
        offset = int(ds.entries()["offset"][record]) + 16 + at
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0x10]))


def test_copy_leaves_out_damaged_records_only_when_asked(packed, tmp_path):
    out, records = packed
    flip_byte(out, 3)
    flip_byte(out, 7)
    assert "next: `evalue-store copy" in run("verify", out, code=1).stdout
    clean = tmp_path / "clean.evs"
    error = run("copy", out, "-o", clean, code=1).stderr
    assert "record 3: record checksum mismatch (--skip-bad leaves such records out)" in error
    assert not clean.exists(), "a failed copy writes no OUT"
    text = run("copy", out, "-o", clean, "--skip-bad", code=1).stdout
    assert "copied 10 records" in text and "left out 2 damaged records:" in text
    assert "record 7: record checksum mismatch" in text
    with evs.open(out) as damaged, evs.open(clean) as ds:
        assert ds.verify().ok and ds.metadata == damaged.metadata
        kept = [i for i in range(len(records)) if i not in (3, 7)]
        assert [bytes(ds.raw(j)) for j in range(len(ds))] == [bytes(damaged.raw(i)) for i in kept]
    report = json.loads(
        run("copy", out, "-o", clean, "--skip-bad", "--force", "--json", code=1).stdout
    )
    assert report["records_copied"] == 10
    assert [s["index"] for s in report["skipped"]] == [3, 7]


def test_copy_keeps_compression_and_dictionary_and_can_realign(packed, tmp_path):
    out, _ = packed
    zst, again, wide = tmp_path / "a.evs.zst", tmp_path / "b.evs.zst", tmp_path / "wide.evs"
    run("compress", out, "-o", zst, "--dictionary", "--dict-samples", "12")
    assert "copied 12 records" in run("copy", zst, "-o", again).stdout
    assert evs.read_dictionary(again) == evs.read_dictionary(zst) is not None
    run("copy", out, "-o", wide, "--alignment", "4096")
    with evs.open(zst) as a, evs.open(again) as b, evs.open(wide) as c:
        assert b.compressed and c.alignment == 4096 and c.verify().ok
        assert [bytes(b.raw(i)) for i in range(12)] == [bytes(a.raw(i)) for i in range(12)]
        for i in range(12):
            for x, y in zip(a[i], c[i]):
                if isinstance(x, np.ndarray):
                    assert x.tobytes() == y.tobytes() and y.ctypes.data % 4096 == 0
                else:
                    assert x == y


# ----------------------------------------------------------------------------- help, errors


def test_every_command_has_help_with_an_example(capsys):
    names = [c.name for c in cli.registry.COMMANDS]
    assert {"demo", "info", "head", "show", "stats", "verify", "recover", "pack", "export"} <= set(
        names
    ) and "merge" in names
    for name in names:
        with pytest.raises(SystemExit) as exit_info:
            cli.main([name, "--help"])
        assert exit_info.value.code == 0
        text = capsys.readouterr().out
        assert "example:\n  evalue-store " + name in text and "--quiet" in text
    assert "exit codes" in run("--help").stdout


def test_errors_are_one_line_with_exit_2(tmp_path):
    missing = run("info", tmp_path / "missing.evs", code=2)
    assert "missing.evs: No such file or directory" in missing.stderr
    for command in ("info", "head", "stats", "verify"):  # named as typed, not made absolute
        typed = subprocess.run(
            [sys.executable, "-m", "evalue_store", command, "missing.evs"],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=ENV,
        )
        assert typed.stderr == "evalue-store: missing.evs: No such file or directory\n"
    not_ours = tmp_path / "notes.txt"
    not_ours.write_text("hello")
    assert "bad magic" in run("verify", not_ours, code=2, inprocess=True).stderr
    assert "is a directory" in run("head", tmp_path, code=2, inprocess=True).stderr
    assert "required: FILE" in run("verify", code=2, inprocess=True).stderr
    assert "invalid choice" in run("frobnicate", code=2, inprocess=True).stderr
    assert "no command given" in run(code=2, inprocess=True).stderr
    debug = subprocess.run(
        [sys.executable, "-m", "evalue_store", "info", tmp_path / "missing.evs", "--debug"],
        capture_output=True,
        text=True,
    )
    assert debug.returncode != 0 and "Traceback" in debug.stderr


def test_installed_script_runs():
    script = shutil.which("evalue-store")
    if script is None:
        pytest.skip("evalue-store script not on PATH (pip install -e . installs it)")
    proc = subprocess.run([script, "--version"], capture_output=True, text=True)
    assert proc.returncode == 0 and evs.__version__ in proc.stdout


# ----------------------------------------------------------------------------- demo


def test_demo_packs_reads_verifies_and_shows(tmp_path):
    proc = run("demo", "--dir", tmp_path)
    out = tmp_path / "demo.evs"
    assert f"the demo file is {os.path.abspath(out)}" in proc.stdout
    assert "identical to the samples" in proc.stdout and "OK" in proc.stdout
    assert "[0] tokens: Tensor int64[128]" in proc.stdout and "[3] id: String" in proc.stdout
    with evs.open(out) as ds:
        assert len(ds) == cli.demo.DEMO_RECORDS and ds.verify().ok
        assert ds.fields == ("tokens", "features", "label", "id")
        assert ds[5][3] == "w1-00005" and ds[5][0].dtype == np.int64


# ----------------------------------------------------------------------------- looking


def test_info_head_show(packed):
    out, records = packed
    text = run("info", out).stdout
    assert "records        12" in text and "[0] tokens: Tensor int64[8]" in text
    info = json.loads(run("info", out, "--json", inprocess=True).stdout)
    assert {
        "file",
        "records",
        "file_bytes",
        "compressed",
        "logical_bytes",
        "compression_ratio",
        "data_bytes",
        "index_bytes",
        "metadata_bytes",
        "overhead_bytes",
        "uncommitted_bytes",
        "commits",
        "last_commit",
        "segments",
        "alignment",
        "format_version",
        "checksum",
        "writer",
        "created",
        "file_id",
        "metadata",
        "schema_sampled_records",
        "schema",
        "problems",
    } == set(info)
    assert info["records"] == 12 and info["file_bytes"] == os.path.getsize(out)
    assert (info["format_version"], info["checksum"]) == ("1.1", "crc32c")
    assert "format         1.1, CRC-32C checksums\n" in text
    # One pack is one commit; the empty commit that creates every file is not counted.
    assert info["commits"] == 1 and info["last_commit"] == 2 and "commits        1\n" in text
    assert not info["compressed"] and info["logical_bytes"] == info["file_bytes"]
    parts = ("data_bytes", "index_bytes", "metadata_bytes", "overhead_bytes")
    assert sum(info[k] for k in parts) == info["file_bytes"]
    names = ["tokens", "features", "label", "id"]
    assert info["metadata"] == {"split": "train", "evalue_store.fields": names}
    assert [row["field"] for row in info["schema"]] == names
    assert [row["types"] for row in info["schema"]] == [
        ["Tensor int64[8]"],
        ["Tensor float32[4]"],
        ["Int"],
        ["String"],
    ]
    head = run("head", out, "-n", "2").stdout
    assert head.count("record ") == 2 and "min " in head and "'id-1'" in head
    last = run("show", out, "-1").stdout
    assert last.startswith("record 11: 4 values") and "'id-11'" in last
    assert np.array2string(records[11][0]) in last  # whole tensor, as numpy prints it
    assert "out of range" in run("show", out, "12", code=2, inprocess=True).stderr


# ----------------------------------------------------------------------------- stats


class _WellFormed(HTMLParser):
    """Checks that every element closes in order; collects tag names."""

    VOID = {"meta", "br", "img", "hr", "link", "input"}

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.tags: list[str] = []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self.tags.append(tag)
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag: str, attrs: list) -> None:
        self.tags.append(tag)

    def handle_endtag(self, tag: str) -> None:
        assert self.stack and self.stack[-1] == tag, (tag, self.stack)
        self.stack.pop()


@pytest.fixture
def varied(tmp_path):
    """Records with NaN/Inf, ragged tensors, lists, bfloat16, complex, bytes and None."""
    path = tmp_path / "varied.evs"
    with evs.Writer(path) as w:
        for i in range(40):
            floats = np.arange(i % 5 + 1, dtype=np.float32)
            if i % 10 == 0:
                floats[0] = np.nan
            if i == 3:
                floats[-1] = np.inf
            w.append(
                [
                    floats,
                    [i, i + 1],
                    evs.float32_to_bfloat16(np.full(2, 1.5, np.float32)),
                    np.array([1 + 2j]),
                    b"\x00" * (i % 4),
                    None if i % 2 else "even",
                    bool(i % 3),
                    [np.zeros((2, 2)), None],
                    [],
                ]
            )
    return path


def test_stats_text_json_and_sample(varied):
    text = run("stats", varied).stdout
    assert "40 records (all records read)" in text and "█" in text
    assert "nan 4" in text and "posinf 1" in text
    report = json.loads(run("stats", varied, "--json", inprocess=True).stdout)
    assert {
        "file",
        "records",
        "records_read",
        "unreadable_records",
        "unreadable_examples",
        "problems",
        "record_bytes",
        "positions",
    } == set(report)
    assert report["problems"] == []
    pos = report["positions"]
    assert [p["position"] for p in pos] == list(range(9))
    assert set(pos[0]) == {
        "position",
        "field",
        "count",
        "kinds",
        "dtypes",
        "shapes",
        "other_shapes",
        "elements",
        "values",
        "string_lengths",
    }
    values = pos[0]["values"]
    assert set(values) == {"count", "min", "max", "mean", "nan", "posinf", "neginf", "histogram"}
    assert values["nan"] == 4 and values["posinf"] == 1 and values["min"] == 0.0
    assert pos[0]["shapes"] == {f"[{k}]": 8 for k in range(1, 6)}
    assert pos[0]["elements"]["histogram"]["counts"] == [8] * 5
    assert sum(values["histogram"]["counts"]) == values["count"]
    assert pos[1]["kinds"] == {"ListInt": 40} and pos[1]["values"]["max"] == 40
    assert pos[2]["dtypes"] == {"bfloat16": 40} and pos[2]["values"]["mean"] == 1.5
    assert pos[3]["dtypes"] == {"complex128": 40} and pos[3]["values"] is None
    assert pos[4]["kinds"] == {"Bytes": 40} and pos[4]["string_lengths"]["max"] == 3
    assert pos[5]["kinds"] == {"String": 20, "None": 20}
    assert pos[6]["kinds"] == {"Bool": 40} and pos[6]["values"]["histogram"]["counts"] == [14, 26]
    assert pos[7]["kinds"] == {"ListOptionalTensor": 40} and pos[7]["shapes"] == {"[2, 2]": 40}
    assert pos[8]["kinds"] == {"List(empty)": 40} and pos[8]["values"] is None
    sizes = report["record_bytes"]
    with evs.open(varied) as ds:
        assert sizes["count"] == 40 and sizes["max"] == int(ds.entries()["length"].max()) + 16
    sampled = json.loads(run("stats", varied, "--json", "--sample", "3", inprocess=True).stdout)
    assert sampled["records_read"] == 3 and sampled["positions"][0]["count"] == 3
    ascii_only = run("stats", varied, env={**os.environ, "PYTHONIOENCODING": "ascii"}).stdout
    assert "#" in ascii_only


def test_head_and_show_every_kind(varied):
    head = run("head", varied, "-n", "1", inprocess=True).stdout
    for text in (
        "[0] Tensor float32[1] [nan]  min - max - nan 1",
        "[1] ListInt[2] [0, 1]",
        "[2] Tensor bfloat16[2] [1.5 1.5]  min 1.5 max 1.5",
        "[3] Tensor complex128[1] [1.+2.j]",
        "[4] Bytes[0] b''",
        "[5] String 'even'",
        "[6] Bool False",
        "[7] ListOptionalTensor[2] float64[2, 2] [0. 0. 0. 0.]  min 0 max 0; None",
        "[8] List(empty) []",
    ):
        assert text in head
    shown = run("show", varied, "3", inprocess=True).stdout
    assert (
        "[7] ListOptionalTensor[2]\n      item 0: Tensor float64[2, 2]\n        [[0. 0.]" in shown
    )
    assert "[0] Tensor float32[4]\n      [ 0.  1.  2. inf]" in shown and "[5] None" in shown
    schema = json.loads(run("info", varied, "--json", inprocess=True).stdout)["schema"]
    assert schema[7]["types"] == ["ListOptionalTensor[float64[2, 2], None]"]
    assert schema[8]["types"] == ["List(empty)"] and len(schema[0]["types"]) == 5


def test_stats_html_is_a_well_formed_page_with_svg(varied, tmp_path):
    page = tmp_path / "report.html"
    run("stats", varied, "--html", page, "--quiet")
    text = page.read_text(encoding="utf-8")
    parser = _WellFormed()
    parser.feed(text)
    parser.close()
    assert parser.stack == [] and text.startswith("<!DOCTYPE html>")
    assert parser.tags.count("svg") >= 5 and "rect" in parser.tags and "table" in parser.tags
    assert "<script" not in text and "http://" not in text.replace("http://www.w3.org/2000/svg", "")
    chromium = "/usr/bin/chromium"
    if not os.path.exists(chromium):
        pytest.skip("no /usr/bin/chromium: headless render check not run")
    shot = tmp_path / "shot.png"
    subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            f"--screenshot={shot}",
            "--window-size=900,1400",
            page.as_uri(),
        ],
        capture_output=True,
        timeout=60,
    )
    png = shot.read_bytes()
    assert png.startswith(b"\x89PNG") and len(set(png[100:])) > 50  # not one flat colour


def test_histogram_counts_every_value_exactly():
    rng = np.random.default_rng(7)
    numbers = cli.tally.Numbers()
    chunks = [rng.standard_normal(n) * scale for n, scale in ((10, 1), (5000, 30), (70000, 0.1))]
    chunks.append(np.array([1e6, -5e5]))
    for chunk in chunks:
        numbers.add_array(chunk)
    stats = numbers.to_json()
    everything = np.concatenate(chunks)
    edges, counts = np.array(stats["histogram"]["edges"]), stats["histogram"]["counts"]
    assert len(numbers.bins.counts) == cli.tally.BINS  # memory stays fixed
    assert sum(counts) == stats["count"] == everything.size
    index = np.searchsorted(edges, everything, side="right") - 1
    assert np.bincount(index, minlength=len(counts)).tolist() == counts
    assert stats["min"] == everything.min() and stats["max"] == everything.max()
    assert stats["mean"] == pytest.approx(everything.mean())
    labels = cli.tally.Numbers()
    for i in range(1000):
        labels.add_scalar(i % 10)
    assert labels.to_json()["histogram"] == {
        "edges": list(range(11)),
        "counts": [100] * 10,
        "integer": True,
    }


def _strict_json(text: str) -> dict:
    def refuse(token: str) -> None:
        raise AssertionError(f"not JSON: {token}")

    return json.loads(text, parse_constant=refuse)


def _bin_of(edges: list, value: int | float) -> int:
    """The bin holding ``value`` by the documented rule, exactly (Python ints and floats)."""
    for k in range(len(edges) - 1):
        if edges[k] <= value < edges[k + 1]:
            return k
    assert value == edges[-1] == float(np.finfo(np.float64).max), (value, edges[-2:])
    return len(edges) - 2  # the documented exception: a last edge clamped to the largest double


def test_stats_counts_integers_of_any_size_exactly(tmp_path):
    """min/max/edges of Int values and int64/uint64 tensors went through doubles: 2**53 + 1
    was reported as 2**53 in a bin of width 0, and 2**63 - 1 as 2**63 (attacker finding,
    session 10, fourth run, C02)."""
    cases = [
        [2**53 + 1, 2**53 + 1],
        [-(2**63), 2**63 - 1, 0, 5],
        [2**64 - 1, 2**63, 1],
        [-(2**63), 2**64 - 1, 7],  # int64 and uint64 in one position: 1.5 * 2**64 wide
    ]
    for values in cases:
        path = tmp_path / "ints.evs"
        with evs.Writer(path, "w") as w:
            for v in values:
                w.append([np.array([v], np.uint64 if v >= 2**63 else np.int64)])
            w.append([values[0]] if values[0] < 2**63 else [np.array(values[0], np.uint64)])
        stats = _strict_json(run("stats", path, "--json", inprocess=True).stdout)
        numbers = stats["positions"][0]["values"]
        hist = numbers["histogram"]
        every = values + [values[0]]
        assert (numbers["min"], numbers["max"], numbers["count"]) == (
            min(every),
            max(every),
            len(every),
        )
        assert hist["integer"] and all(type(e) is int for e in hist["edges"])
        assert all(b > a for a, b in zip(hist["edges"], hist["edges"][1:]))
        counts = [0] * len(hist["counts"])
        for v in every:
            counts[_bin_of(hist["edges"], v)] += 1
        assert counts == hist["counts"], values


def test_stats_json_holds_only_finite_numbers_for_extreme_doubles(tmp_path):
    """Finite doubles near 1.8e308 made stats --json write NaN and Infinity (not JSON) for
    edges and mean, and numpy warnings on stderr (attacker finding, session 10, fourth run,
    C01)."""
    big = float(np.finfo(np.float64).max)
    cases = {
        "span": [np.array([big, -big]), np.array([0.0])],
        "sum": [np.array([1e308, 1e308]), np.array([1e308])],
        "top": [np.array([big]), np.array([big]), np.array([1.0])],
    }
    for name, arrays in cases.items():
        path = tmp_path / f"{name}.evs"
        with evs.Writer(path, "w") as w:
            for a in arrays:
                w.append([a])
        proc = run("stats", path, "--json")
        assert proc.stderr == "", proc.stderr
        numbers = _strict_json(proc.stdout)["positions"][0]["values"]
        every = np.concatenate(arrays)
        assert (numbers["min"], numbers["max"]) == (every.min(), every.max())
        assert numbers["mean"] == pytest.approx(np.mean(every / 16) * 16)
        counts = [0] * len(numbers["histogram"]["counts"])
        for v in every.tolist():
            counts[_bin_of(numbers["histogram"]["edges"], v)] += 1
        assert counts == numbers["histogram"]["counts"], name
        assert "inf" not in run("stats", path).stdout.lower()


def test_info_and_stats_report_a_compressed_index_they_cannot_read(tmp_path):
    """A compressed file whose map frame is damaged still gives every record through its
    locators; info and stats stopped with one error line and no report (attacker finding,
    session 10, fourth run, C04). They now report the index as a problem (exit 1)."""
    plain, packed = tmp_path / "p.evs", tmp_path / "c.evs.zst"
    with evs.Writer(plain, metadata={"a": 1}) as w:
        for i in range(300):
            w.append([i, "s" * (i % 7)])
    run("compress", plain, "-o", packed, "--quiet")
    data = bytearray(packed.read_bytes())
    data[data.rindex((0x184D2A59).to_bytes(4, "little")) + 8] ^= 0x10  # a map frame's body
    packed.write_bytes(data)
    info = _strict_json(run("info", packed, "--json", code=1, inprocess=True).stdout)
    assert info["data_bytes"] is info["overhead_bytes"] is None and info["records"] == 300
    assert [p for p in info["problems"] if "map frame" in p] == info["problems"] != []
    assert "data         unknown (the index is unreadable)" in run("info", packed, code=1).stdout
    stats = _strict_json(run("stats", packed, "--json", code=1, inprocess=True).stdout)
    assert stats["record_bytes"] is None and stats["unreadable_records"] == 0
    assert "map frame" in stats["problems"][0] and stats["positions"][0]["count"] == 300
    assert stats["positions"][0]["values"]["max"] == 299
    text = run("stats", packed, "--html", tmp_path / "page.html", code=1).stdout
    assert (
        "problem: index: map frame" in text and "map frame" in (tmp_path / "page.html").read_text()
    )


# ----------------------------------------------------------------------------- verify, recover


def test_verify_names_a_flipped_record(packed, tmp_path):
    out, _ = packed
    assert "OK, 12 records" in run("verify", out).stdout
    clean = json.loads(run("verify", out, "--json", inprocess=True).stdout)
    assert clean == {
        "file": str(out),
        "ok": True,
        "records": 12,
        "bytes_checked": clean["bytes_checked"],
        "bad_records": [],
        "problems": [],
        "uncommitted_bytes": 0,
    }
    flip_byte(out, 7)
    text = run("verify", out, code=1).stdout
    assert "1 bad record," in text and "record 7: record checksum mismatch" in text
    report = json.loads(run("verify", out, "--json", code=1, inprocess=True).stdout)
    assert report["ok"] is False
    assert report["bad_records"] == [{"index": 7, "reason": "record checksum mismatch"}]
    error = run("show", out, "7", code=1).stderr
    assert "train.evs: record 7: record checksum mismatch (at byte" in error
    head = run("head", out, "-n", "9", code=1, inprocess=True).stdout
    assert "record 7: unreadable: record checksum mismatch" in head and "'id-8'" in head
    stats = json.loads(run("stats", out, "--json", code=1, inprocess=True).stdout)
    assert stats["unreadable_records"] == 1 and stats["positions"][0]["count"] == 11
    assert (
        "record 7"
        in run(
            "export", out, "--to", tmp_path / "x", "--format", "npz", code=1, inprocess=True
        ).stderr
    )


KILLED_WRITER = """
import os, signal, sys
import numpy as np
import evalue_store as evs
w = evs.Writer(sys.argv[1])
for i in range(350):
    w.append([np.full(4096, i, np.float32), f"step {i}"])
    if i == 49:
        w.commit()
os.kill(os.getpid(), signal.SIGKILL)  # mid-run: ~4 MiB of records flushed, none committed
"""


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")
def test_recover_after_a_killed_writer(tmp_path):
    path = tmp_path / "run.evs"
    proc = subprocess.run([sys.executable, "-c", KILLED_WRITER, path], capture_output=True)
    assert proc.returncode == -9
    with open(path, "r+b") as f:  # and the last write was torn
        f.truncate(os.path.getsize(path) - 1000)
    before = path.read_bytes()
    info = json.loads(run("info", path, "--json").stdout)
    assert info["records"] == 50 and info["uncommitted_bytes"] > 4_000_000
    assert "bytes after the last commit" in run("verify", path, code=1).stdout
    text = run("recover", path).stdout
    assert "kept 50 committed records" in text
    with evs.open(path) as ds:
        salvaged = len(ds) - 50
        assert salvaged > 200 and ds.verify().ok
        assert all(ds[i][1] == f"step {i}" and ds[i][0][0] == i for i in range(len(ds)))
    assert f"salvaged {salvaged} complete records" in text
    side = text.split("damaged tail bytes to ")[1].split(" (nothing deleted)")[0]
    assert os.path.exists(side) and before.endswith(open(side, "rb").read())
    assert path.read_bytes()[:1000] == before[:1000]
    assert "nothing to recover" in run("recover", path).stdout
    assert "OK" in run("verify", path).stdout


# ----------------------------------------------------------------------------- pack, export, merge


def test_pack_rules_for_npz_npy_and_globs(packed, tmp_path):
    out, records = packed
    with evs.open(out) as ds:  # natural order: 2.npz before 10.npz
        assert all(same_record(ds[i], records[i]) for i in range(12))
    assert (
        "already exists"
        in run("pack", tmp_path / "samples", "-o", out, code=2, inprocess=True).stderr
    )
    npy = tmp_path / "npy"
    npy.mkdir()
    np.save(npy / "a.npy", np.eye(3, dtype=np.float16))
    np.save(npy / "b.npy", np.array(5))
    glob_out = tmp_path / "npy.evs"
    run("pack", str(npy / "*.npy"), "-o", glob_out, inprocess=True)
    with evs.open(glob_out) as ds:
        assert ds[0][0].dtype == np.float16 and ds[0][0].shape == (3, 3) and ds[1] == [5]
    # pack named the fields after the .npz arrays: a record of other fields does not fit
    bad = run("pack", npy / "a.npy", "-o", out, "--append", code=2, inprocess=True).stderr
    assert "needs 4 values (tokens, features, label, id), not 1" in bad
    run("pack", sorted((tmp_path / "samples").glob("*.npz"))[0], "-o", out, "--append")
    with evs.open(out) as ds:
        assert len(ds) == 13 and ds.metadata["split"] == "train"
    # Appended .npz arrays go by name: the same names in another order land under their
    # fields; other names are refused. They went by position, silently (attacker finding,
    # session 11, eighth run, C01).
    tokens, features, label, ident = w1_record(50)
    np.savez(tmp_path / "shuffled.npz", id=ident, label=label, features=features, tokens=tokens)
    run("pack", tmp_path / "shuffled.npz", "-o", out, "--append")
    with evs.open(out) as ds:
        assert len(ds) == 14 and same_record(ds[13], [tokens, features, label, ident])
    np.savez(tmp_path / "other.npz", tokens=tokens, features=features, label=label, name=ident)
    bad = run("pack", tmp_path / "other.npz", "-o", out, "--append", code=2, inprocess=True)
    assert "must have the file's fields" in bad.stderr and len(evs.open(out)) == 14
    run("pack", npy / "a.npy", "-o", out, "--force", inprocess=True)
    assert len(evs.open(out)) == 1
    assert (
        "unknown input type"
        in run(
            "pack",
            tmp_path / "samples" / "README.txt",
            "-o",
            tmp_path / "r.evs",
            code=2,
            inprocess=True,
        ).stderr
    )
    assert (
        "no such file"
        in run(
            "pack", tmp_path / "none*.npz", "-o", tmp_path / "n.evs", code=2, inprocess=True
        ).stderr
    )
    pickled = tmp_path / "obj.npy"
    np.save(pickled, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    assert (
        "obj.npy: cannot read"
        in run("pack", pickled, "-o", tmp_path / "p.evs", code=2, inprocess=True).stderr
    )
    assert not (tmp_path / "p.evs").exists()


def test_pack_jsonl_rule(tmp_path):
    src = tmp_path / "data.jsonl"
    line = [[1, 2, 3], [1.5, 2], [[1, 2], [3, 4]], [True, False], "s", 7, 2.5, True, None, []]
    src.write_text(json.dumps(line) + "\n\n" + json.dumps(line) + "\n")
    out = tmp_path / "j.evs"
    run("pack", src, "-o", out)
    with evs.open(out) as ds:
        assert len(ds) == 2
        got = ds[0]
        assert [type(v).__name__ for v in got[4:9]] == ["str", "int", "float", "bool", "NoneType"]
        assert [a.dtype.name for a in got[:4]] == ["int64", "float32", "int64", "bool"]
        assert got[2].shape == (2, 2) and got[9].dtype == np.int64 and got[9].shape == (0,)
    run("pack", src, "-o", out, "--dtype", "bfloat16", "--force", inprocess=True)
    assert evs.open(out)[0][1].dtype == evs.BFLOAT16
    src.write_text("[NaN, Infinity, -Infinity, [NaN, 1]]\r\n")  # as Python's json writes them
    run("pack", src, "-o", out, "--force", inprocess=True)
    got = evs.open(out)[0]
    assert math.isnan(got[0]) and got[1:3] == [math.inf, -math.inf]
    assert math.isnan(got[3][0]) and got[3].dtype == np.float32
    src.write_text(json.dumps(line) + "\n\n" + json.dumps(line) + "\n")
    run("pack", src, "-o", out, "--force", inprocess=True)
    for bad, message in (
        ('{"a": 1}', "line 2: each line must be a JSON list"),
        ("[[[1, 2], [3]]]", "line 2: value 0: nested lists must be rectangular"),
        ('[[1, "x"]]', "line 2: value 0: a list must hold only numbers or only bools, not str"),
        ("[[true, 1]]", "value 0: a list mixes bools and numbers"),
        ("[{}]", "value 0: JSON objects have no EValue kind"),
        ("[123456789012345678901234567890]", "does not fit in int64"),
        ("[1, 2", "line 2: Expecting"),
        # Bad UTF-8 was named without its line; Python's 4300-digit cap by its own advice
        # (round 18 remarks).
        (b'["\xe9t\xe9"]', "line 2: not UTF-8 (byte 3 of the line)"),
        ("[" + "9" * 5000 + "]", "line 2: an integer of over 4300 digits (an Int is int64)"),
    ):
        src.write_bytes(b"[1]\n" + (bad if isinstance(bad, bytes) else bad.encode()) + b"\n")
        error = run("pack", src, "-o", tmp_path / "bad.evs", code=2, inprocess=True).stderr
        assert message in error and "data.jsonl" in error, error
        assert not (tmp_path / "bad.evs").exists()  # a failed pack leaves no output
    src.write_text("[1]\n[[[1, 2], [3]]]\n")
    run(
        "pack", tmp_path / "j.evs", "-o", out, code=2, inprocess=True
    )  # a container is not an input
    error = run("pack", src, "-o", out, "--append", code=2, inprocess=True).stderr
    assert "nothing was appended" in error
    assert len(evs.open(out)) == 2  # a failed --append leaves the file as it was


def test_java_bin_pack_and_export_are_byte_exact(tmp_path):
    src = tmp_path / "android"
    src.mkdir()
    rng = np.random.default_rng(3)
    originals = []
    for i in range(6):
        record = [
            np.frombuffer(rng.bytes(4 * 64), ">f4").reshape(8, 8),  # NaN payloads included
            np.frombuffer(rng.bytes(2 * 5), ">f2"),
            np.arange(i, dtype=">i8"),
            np.array([0, 255, i], np.uint8),
            np.array([-128, 127], np.int8),
            np.zeros((0, 3), ">i4"),
            "héllo ✓ " * i,
            None,
            i % 2 == 0,
            -(2**63) + i,
            float(np.frombuffer(rng.bytes(8), ">f8")[0]),
        ]
        data = java.dumps_record(record)
        originals.append(data)
        (src / f"{i:06d}.bin").write_bytes(data)
    out = tmp_path / "android.evs"
    run("pack", src, "-o", out)
    assert "[2] Tensor int64[0]" in run("head", out, "-n", "1").stdout
    run("export", out, "--to", tmp_path / "back", "--format", "java")
    back = sorted(os.listdir(tmp_path / "back"))
    assert back == [f"{i:06d}.bin" for i in range(6)]
    assert [(tmp_path / "back" / n).read_bytes() for n in back] == originals
    error = run(
        "export", out, "--to", tmp_path / "back", "--format", "java", code=2, inprocess=True
    ).stderr
    assert "000000.bin: already exists" in error
    run("export", out, "--to", tmp_path / "back", "--format", "java", "--force", inprocess=True)
    (src / "000002.bin").write_bytes(originals[2][:-3])
    error = run("pack", src, "-o", tmp_path / "torn.evs", code=2, inprocess=True).stderr
    assert "000002.bin: not an EVJ1 record" in error
    listed = tmp_path / "listed.evs"
    with evs.Writer(listed) as w:
        w.append([[1, 2, 3]])
    error = run(
        "export", listed, "--to", tmp_path / "j", "--format", "java", code=2, inprocess=True
    ).stderr
    assert "record 0: record value 0: Java's EValue has no list kinds" in error


def test_export_npz_and_jsonl_round_trip(packed, tmp_path):
    out, records = packed
    run("export", out, "--to", tmp_path / "npz", "--format", "npz")
    names = sorted(os.listdir(tmp_path / "npz"))
    assert names == [f"{i:06d}.npz" for i in range(12)]
    with np.load(tmp_path / "npz" / names[3]) as npz:
        assert npz.files == ["tokens", "features", "label", "id"]
    again = tmp_path / "again.evs"
    run("pack", tmp_path / "npz", "-o", again, inprocess=True)
    run("export", out, "--to", tmp_path / "jsonl", "--format", "jsonl")
    lines = (tmp_path / "jsonl" / "train.jsonl").read_text().splitlines()
    assert len(lines) == 12 and json.loads(lines[0])[3] == "id-0"
    from_json = tmp_path / "from_json.evs"
    run("pack", tmp_path / "jsonl" / "train.jsonl", "-o", from_json, inprocess=True)
    with evs.open(again) as a, evs.open(from_json) as b:
        assert all(same_record(a[i], records[i]) for i in range(12))
        assert all(same_record(b[i], records[i]) for i in range(12))


def test_export_jsonl_refuses_nan_and_infinity(tmp_path):
    """JSON has no NaN or infinity: a record holding one is refused with exit 2 (a value the
    format cannot hold), naming the record, and no file is left; json.dumps wrote NaN and
    Infinity tokens, which JSON readers reject (attacker finding, session 10)."""
    src = tmp_path / "f.evs"
    with evs.Writer(src) as w:
        w.append([1.5, np.array([1.0, 2.0])])
        w.append([float("nan"), np.array([1.0, float("inf")])])
    error = run("export", src, "--to", tmp_path / "out", "--format", "jsonl", code=2).stderr
    assert "record 1: NaN and infinities have no JSON form" in error
    assert os.listdir(tmp_path / "out") == []


def test_export_refuses_values_that_would_pack_back_as_others(tmp_path):
    """npz: a string ending in NUL packed back cut ('a\\0' -> 'a'), b'' as b'\\0', a 0-d
    tensor as a number; java: b'ab' as the String 'ab', and b'\\xff' as a .bin pack
    refused. Export now refuses them with exit 2 naming the record (attacker findings,
    session 11, seventh run, C06-C08); what it writes packs back as it was."""
    cases = {
        "npz": [["a\0"], [b""], [np.array(2.5, np.float32)], [np.array(True)]],
        "java": [[b"ab"], [b"\xff\xfe", "s"]],
    }
    for fmt, records in cases.items():
        for k, record in enumerate(records):
            src = tmp_path / f"{fmt}{k}.evs"
            with evs.Writer(src) as w:
                w.append(["fine"])
                w.append(record)
            error = run("export", src, "--to", tmp_path / f"o{fmt}{k}", "--format", fmt, code=2)
            assert "record 1: " in error.stderr and "form" in error.stderr, error.stderr
    kept = [["a\0b", b"\0", b"y\0", np.array([2.5], np.float32), np.array(3 + 1j)], ["", 0]]
    src = tmp_path / "kept.evs"
    with evs.Writer(src) as w:
        w.extend(kept)
    run("export", src, "--to", tmp_path / "kept", "--format", "npz")
    run("pack", tmp_path / "kept", "-o", tmp_path / "back.evs")
    with evs.open(tmp_path / "back.evs") as back:
        for got, want in zip(back, kept):
            assert len(got) == len(want)
            for g, w in zip(got, want):
                assert type(g) is type(w) and (
                    np.array_equal(g, w) and g.dtype == w.dtype
                    if isinstance(w, np.ndarray)
                    else g == w
                )


def test_outputs_that_are_devices_fifos_or_inputs_are_refused(tmp_path):
    """Outputs are replaced by a rename: copy -o /dev/full --force, run as root, replaced
    the device with a file, and -o FIFO (stats --html, dictionary) waited forever reading it;
    pack x.jsonl -o x.jsonl --force and export F.jsonl --to . --force destroyed their only
    input (attacker findings, session 11, eighth run, C05, C09). The library's Writer(...,
    "w") replaced a FIFO too."""
    import stat

    src = tmp_path / "a.evs"
    with evs.Writer(src) as w:
        w.extend([[i, f"s{i}", np.arange(i % 5)] for i in range(300)])
    packed = tmp_path / "a.evs.zst"
    run("compress", src, "-o", packed, "--quiet")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for args in (
        ["stats", src, "--html", fifo],
        ["dictionary", packed, "-o", fifo],
        ["copy", src, "-o", fifo, "--force"],
        ["compress", src, "-o", fifo, "--force"],
        ["merge", src, src, "-o", fifo, "--force"],
    ):
        error = run(*args, code=2).stderr
        assert "fifo: is not a regular file" in error, (args, error)
        assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    with pytest.raises(evs.FormatError, match="not a regular file"):
        evs.Writer(fifo, "w")
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    lines = tmp_path / "x.jsonl"
    lines.write_text('[1, "a"]\n')
    assert (
        "is an input of this command" in run("pack", lines, "-o", lines, "--force", code=2).stderr
    )
    assert lines.read_text() == '[1, "a"]\n'
    named = tmp_path / "rec.jsonl"  # a container named like the export's output
    shutil.copyfile(src, named)
    error = run("export", named, "--to", tmp_path, "--format", "jsonl", "--force", code=2).stderr
    assert "is an input of this command" in error and evs.open(named).verify().ok


def test_an_output_that_is_a_symlink_stays_one(packed, tmp_path):
    """pack --append and copy --force through a symlink replaced the link with a new file:
    the file it named kept its old records, the link's path had others (attacker finding,
    session 11, eighth run, C08)."""
    out, records = packed
    real = tmp_path / "real" / "data.evs"
    real.parent.mkdir()
    shutil.copyfile(out, real)
    link = tmp_path / "current.evs"
    link.symlink_to(real)
    run("pack", sorted((tmp_path / "samples").glob("*.npz"))[0], "-o", link, "--append")
    assert link.is_symlink() and len(evs.open(real)) == len(records) + 1
    run("copy", out, "-o", link, "--force")
    assert link.is_symlink() and len(evs.open(real)) == len(records)
    assert not [p for p in real.parent.iterdir() if p.name != "data.evs"]  # no leftovers


def test_pack_append_keeps_a_torn_tail_under_out_s_name(tmp_path):
    """pack --append into a file with a torn tail kept the damaged bytes under the name of
    its temporary copy (OUT.<pid>-<hex>.partial.tail-N, which looks like a leftover that is
    safe to delete), and a failed run left one each time (attacker finding, session 11,
    eighth run, C03)."""
    out = tmp_path / "torn.evs"
    pid = os.fork()
    if pid == 0:  # a writer killed after a commit and more appends
        w = evs.Writer(out)
        w.extend([[i, np.full(4096, i, np.float32)] for i in range(20)])
        w.commit()
        w.extend([[i, np.full(4096, i, np.float32)] for i in range(20, 40)])
        w._sink.flush()
        os._exit(0)
    os.waitpid(pid, 0)
    out.write_bytes(out.read_bytes()[:-1000])  # the last record torn
    before = out.read_bytes()
    lines = tmp_path / "one.jsonl"
    lines.write_text('[5, [1.0, 2.0]]\n[1, "x", \n')  # the second line is not JSON
    run("pack", lines, "-o", out, "--append", code=2)
    assert out.read_bytes() == before and sorted(os.listdir(tmp_path)) == ["one.jsonl", "torn.evs"]
    lines.write_text("[5, [1.0, 2.0]]\n")
    proc = run("pack", lines, "-o", out, "--append")
    sides = [p for p in os.listdir(tmp_path) if ".tail-" in p]
    assert len(sides) == 1 and re.fullmatch(r"torn\.evs\.tail-\d+", sides[0]), sides
    assert f"damaged tail kept in {out}.tail-" in proc.stderr
    assert len(evs.open(out)) == 40  # 20 committed, 19 salvaged, 1 packed


def test_converting_commands_errors_name_the_file_or_the_help(tmp_path):
    """Error lines of the converting commands that named no file, a temporary file or an
    absolute path, or no help (attacker finding, session 11, eighth run, C06)."""
    src = tmp_path / "a.evs"
    with evs.Writer(src) as w:
        w.append([1, "x", 2.5])

    def line(*args: object) -> str:
        proc = subprocess.run(
            [sys.executable, "-m", "evalue_store", *map(str, args)],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=ENV,
        )
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc
        return proc.stderr

    assert line("merge", "a.evs", "missing.evs", "-o", "m.evs").startswith(
        "evalue-store: missing.evs: No such file"
    )
    assert "(see evalue-store copy --help)" in line(
        "copy", "a.evs", "-o", "c.evs", "--alignment", 3
    )
    nan = line("merge", "a.evs", "-o", "m.evs", "--metadata", '{"a": NaN}')
    assert "(see evalue-store merge --help)" in nan
    assert "evalue-store: a.evs: a record" in line(
        "merge", "a.evs", "-o", "m.evs", "--metadata", '{"evalue_store.fields": ["x"]}'
    )
    assert line("copy", "a.evs", "-o", "").startswith('evalue-store: "": no file name given')
    assert line("export", "a.evs", "--to", "", "--format", "jsonl").startswith(
        'evalue-store: "": no folder name given'
    )
    assert not [p for p in os.listdir(tmp_path) if p != "a.evs"]


def test_merge(packed, tmp_path):
    out, records = packed
    other = tmp_path / "other.evs"
    with evs.Writer(other, metadata={"split": "extra"}) as w:
        w.append(["extra", 1.5])
    merged = tmp_path / "merged.evs"
    assert "merged 13 records from 2 files" in run("merge", out, other, "-o", merged).stdout
    with evs.open(merged) as ds:
        assert len(ds) == 13 and ds.metadata["split"] == "train"
        assert same_record(ds[11], records[11]) and ds[12] == ["extra", 1.5]
        with evs.open(out) as first:  # re-encoded to the very same payload bytes
            assert (ds.entries()["crc"][:12] == first.entries()["crc"]).all()
    run(
        "merge",
        other,
        out,
        "-o",
        merged,
        "--force",
        "--metadata",
        '{"split": "all"}',
        inprocess=True,
    )
    with evs.open(merged) as ds:
        assert ds[0] == ["extra", 1.5] and ds.metadata == {"split": "all"}
    assert "already exists" in run("merge", out, "-o", merged, code=2, inprocess=True).stderr
    assert (
        "must be a JSON object"
        in run("merge", out, "-o", merged, "--metadata", "[1]", code=2, inprocess=True).stderr
    )
    flip_byte(other, 0, at=4)
    assert (
        "record 0"
        in run("merge", out, other, "-o", tmp_path / "m2.evs", code=1, inprocess=True).stderr
    )
    leftovers = [n for n in os.listdir(tmp_path) if n.startswith("m2.evs")]
    assert leftovers == []  # the partial output was removed


def stderr_on_a_terminal(*args: object) -> str:
    """Run the command with stderr on a pseudo-terminal; returns what appeared there."""
    pty = pytest.importorskip("pty")
    fcntl = pytest.importorskip("fcntl")
    termios = pytest.importorskip("termios")
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))  # 80 columns
    proc = subprocess.run(
        [sys.executable, "-m", "evalue_store", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=slave,
        timeout=60,
        env=ENV,
    )
    os.close(slave)
    assert proc.returncode == 0
    chunks = []
    while True:
        try:
            data = os.read(master, 1 << 16)
        except OSError:  # EIO: the terminal has no writer left
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    return b"".join(chunks).decode("utf-8", "replace")


@pytest.mark.skipif(sys.platform == "win32", reason="needs a pseudo-terminal")
def test_progress_bars_only_on_a_terminal_and_not_quiet(packed):
    out, _ = packed
    assert "stats" in stderr_on_a_terminal("stats", out)  # tqdm's bar, labelled "stats"
    assert stderr_on_a_terminal("stats", out, "--quiet") == ""
    assert run("stats", out).stderr == ""  # stderr is a pipe here: no bar


def test_compress_decompress_and_dictionary(tmp_path):
    zstd = shutil.which("zstd")
    if zstd is None:
        pytest.fail("the zstd CLI is missing: CI must install Debian's zstd package")
    src = tmp_path / "plain.evs"
    with evs.Writer(src, metadata={"m": 1}) as w:
        w.extend(w1_record(i) for i in range(400))
    packed = tmp_path / "packed.evs.zst"
    out = run("compress", src, "-o", packed, "--dictionary", "--dict-samples", "200").stdout
    assert "compressed" in out and packed.exists()
    with evs.open(packed) as ds, evs.open(src) as plain:
        assert ds.compressed and len(ds) == 400 and ds.metadata == {"m": 1}
        assert all(np.array_equal(ds[i][0], plain[i][0]) for i in range(0, 400, 37))
    info = json.loads(run("info", packed, "--json").stdout)
    assert info["compressed"] and 0 < info["compression_ratio"] < 1
    run("compress", src, "-o", packed, code=2)  # never overwrites without --force
    dictionary = tmp_path / "d.zdict"
    run("dictionary", packed, "-o", dictionary)
    by_zstd, by_cli = tmp_path / "zstd.evs", tmp_path / "cli.evs"
    subprocess.run(
        [zstd, "-q", "-d", "-D", str(dictionary), str(packed), "-o", str(by_zstd)], check=True
    )
    run("decompress", packed, "-o", by_cli)
    assert by_zstd.read_bytes() == by_cli.read_bytes()  # the same logical stream
    run("verify", by_cli)
    run("decompress", src, "-o", tmp_path / "x.evs", code=2)  # not compressed
    run("dictionary", src, "-o", tmp_path / "y", code=1)  # holds no dictionary


def test_decompress_of_a_file_with_a_tail_says_the_tail_is_left_out(tmp_path):
    """The help promises the logical stream up to the last commit; an uncommitted tail
    (a writer killed) is not copied, and a note names it and recover, so records it holds
    are not dropped without a word."""
    packed = tmp_path / "t.evs.zst"
    pid = os.fork()
    if pid == 0:  # a writer killed after a commit and more appends
        w = evs.Writer(packed, compression="zstd", frame_size=1024)
        w.extend([[np.arange(50) * i] for i in range(30)])
        w.commit()
        w.extend([[np.arange(50) * i, "tail"] for i in range(30)])
        os._exit(0)
    os.waitpid(pid, 0)
    with evs.open(packed) as ds:
        tail = ds.uncommitted_bytes
    assert tail > 0
    proc = run("decompress", packed, "-o", tmp_path / "out.evs", inprocess=True)
    assert f"uncommitted tail ({tail:,} bytes" in proc.stderr and "recover" in proc.stderr
    with evs.open(tmp_path / "out.evs") as ds:
        assert len(ds) == 30 and ds.uncommitted_bytes == 0
    # copy, compress and merge say so too, and refuse to replace such an input with its
    # copy: the tail's records were lost with exit 0 and no word (attacker finding,
    # session 11, eighth run, C04)
    for command, extra in (("copy", []), ("compress", []), ("merge", [packed])):
        out = tmp_path / f"{command}.evs"
        proc = run(command, packed, *extra, "-o", out, inprocess=True)
        assert f"{packed}: its uncommitted tail ({tail:,} bytes" in proc.stderr
        before = packed.read_bytes()
        error = run(command, packed, *extra, "-o", packed, "--force", code=2).stderr
        assert "has an uncommitted tail" in error and packed.read_bytes() == before
    assert evs.recover(packed).salvaged_records > 0  # the tail is still there to salvage


# ----------------------------------------------------------------------------- outputs


def replacing_commands(tmp_path) -> dict[str, list]:
    """Arguments (but ``-o OUT --force``) of every command that replaces an output file."""
    plain, packed = tmp_path / "in.evs", tmp_path / "in.evs.zst"
    with evs.Writer(plain, metadata={"m": 1}) as w:
        w.extend(w1_record(i) for i in range(5))
    with evs.Writer(packed, compression="zstd") as w:
        w.extend(w1_record(i) for i in range(5))
    write_npz_dir(tmp_path / "npz", n=3)
    return {
        "copy": ["copy", plain],
        "merge": ["merge", plain, plain],
        "compress": ["compress", plain],
        "decompress": ["decompress", packed],
        "pack": ["pack", tmp_path / "npz"],
    }


def test_force_never_replaces_a_file_a_running_writer_holds(tmp_path):
    """--force over a live Writer's file would send its later commits to an unlinked inode."""
    out = tmp_path / "live.evs"
    for name, args in replacing_commands(tmp_path).items():
        writer = evs.Writer(out, "w")
        writer.append([name])
        writer.commit()
        before = out.read_bytes()
        error = run(*args, "-o", out, "--force", code=2, inprocess=True).stderr
        assert f"{out}: a running writer has this file open" in error, (name, error)
        assert out.read_bytes() == before, name
        writer.append(["after"])  # the writer's next commit still reaches the file
        writer.close()
        with evs.open(out) as ds:
            assert ds[:] == [[name], ["after"]], name
        assert [p for p in os.listdir(tmp_path) if p.endswith(".partial")] == [], name


def test_a_writer_cannot_start_on_out_while_a_run_replaces_it(tmp_path):
    """The check before the work is not enough: a writer may try to open OUT while the copy
    runs. OUT's lock is held from the check to the rename, so that writer is refused (its
    commit would otherwise be lost to the replacement)."""
    out = tmp_path / "out.evs"
    with evs.Writer(out) as w:
        w.append(["old"])
    with cli.output.output_writer(str(out), append=False, force=True, metadata=None) as writer:
        writer.append(["new"])
        with pytest.raises(evs.WriterLockedError):
            evs.Writer(out, "a")
    with evs.open(out) as ds:
        assert ds[:] == [["new"]]
    assert sorted(os.listdir(tmp_path)) == ["out.evs"]
    with evs.Writer(out, "a") as late:  # the lock went with the run
        late.append(["late"])


# ----------------------------------------------------------------------------- new users


def test_errors_suggest_only_flags_the_command_has(packed, tmp_path):
    out, _ = packed
    copy_error = run("copy", out, "-o", out, code=2, inprocess=True).stderr
    assert "already exists; use --force to replace it" in copy_error
    pack_error = run("pack", tmp_path / "samples", "-o", out, code=2, inprocess=True).stderr
    assert "use --append to add to it or --force to replace it" in pack_error
    for name, args in replacing_commands(tmp_path).items():
        if name != "pack":
            error = run(*args, "-o", out, code=2, inprocess=True).stderr
            assert "--append" not in error, (name, error)
    wrong = run("copy", out, "-o", tmp_path / "c.evs", "--append", code=2, inprocess=True).stderr
    assert wrong == (
        "evalue-store: copy: unrecognized arguments: --append (see evalue-store copy --help)\n"
    )
    assert "(see evalue-store --help)" in run("--frobnicate", code=2, inprocess=True).stderr


def test_counts_and_levels_are_checked_before_any_work(packed, tmp_path):
    out, _ = packed
    for args in (("head", out, "-n", "-3"), ("head", out, "-n", "0")):
        error = run(*args, code=2, inprocess=True).stderr
        assert "argument -n: must be at least 1" in error
        assert "see evalue-store head --help" in error
    assert "must be at least 1" in run("stats", out, "--sample", "0", code=2).stderr
    zst = tmp_path / "x.evs.zst"
    for level in ("99", "23", "-200000"):
        error = run("compress", out, "-o", zst, "--level", level, code=2, inprocess=True).stderr
        assert "argument --level: must be from -131072 to 22" in error, error
        assert str(out) not in error  # the input is fine
    assert not zst.exists()
    for flag in ("--frame-size", "--dict-samples"):
        run("compress", out, "-o", zst, flag, "0", code=2, inprocess=True)
    run("compress", out, "-o", zst, "--level", "-5", inprocess=True)  # zstd's fast levels
    run("compress", out, "-o", zst, "--level", "22", "--force", inprocess=True)


def test_outputs_in_missing_folders_folders_and_files(packed, tmp_path):
    out, _ = packed
    nowhere = tmp_path / "no" / "such" / "c.evs"
    error = run("copy", out, "-o", nowhere, code=2, inprocess=True).stderr
    assert f"{nowhere}: no such folder {nowhere.parent}" in error and ".partial" not in error
    assert "is a directory" in run("copy", out, "-o", tmp_path, "--force", code=2).stderr
    assert (
        "is a file; --to takes a folder"
        in run("export", out, "--to", out, "--format", "npz", code=2, inprocess=True).stderr
    )
    assert sorted(os.listdir(tmp_path)) == ["samples", "train.evs"]


def test_out_names_near_name_max_can_be_written(packed, tmp_path):
    """A legal OUT name near NAME_MAX (255 bytes) could never be written: its temporary name
    OUT.<pid>-<random>.partial (and the library's .NAME.<random>.new) passed the limit,
    "x...x.evs.123-abcdef.partial: File name too long". The temporary names now cut a long
    name and add a hash of it, keeping their start and end (CLI.md: leftovers are
    recognisable as OUT's *.partial)."""
    out, records = packed
    (tmp_path / "r.jsonl").write_text("[1, 2]\n")
    limit = os.pathconf(tmp_path, "PC_NAME_MAX")
    for base in ("x" * (limit - 10) + ".evs", "é" * ((limit - 4) // 2) + ".evs"):
        assert len(base.encode()) <= limit
        long = tmp_path / base
        run("copy", out, "-o", long, inprocess=True)
        assert len(evs.open(long)) == len(records)
        run("compress", long, "-o", long, "--force", inprocess=True)
        long.unlink()
        run("pack", tmp_path / "r.jsonl", "-o", long, inprocess=True)
        run("pack", tmp_path / "r.jsonl", "-o", long, "--append", inprocess=True)
        assert evs.open(long)[1] == [1, 2]
        long.unlink()
        with evs.Writer(long) as w:  # the library's own temporary name
            w.append([1])
        long.unlink()
        from evalue_store.files import temp_name  # imported here: the runs come first

        for prefix, suffix in (("", ".1234567-abcdef.partial"), (".", ".0123456789ab.new")):
            temp = os.path.basename(temp_name(str(long), prefix, suffix))
            assert len(temp.encode()) <= limit and temp.endswith(suffix), temp
            assert temp.startswith(prefix + base[:100]), temp
            other = temp_name(str(tmp_path / (base[:-5] + "y.evs")), prefix, suffix)
            assert os.path.basename(other) != temp
    assert sorted(os.listdir(tmp_path)) == ["r.jsonl", "samples", "train.evs"]
    assert temp_name(str(out), "", ".1-ab.partial") == f"{out}.1-ab.partial"  # as it was


def test_a_torn_file_of_a_name_near_name_max_can_be_recovered(tmp_path):
    """A torn tail is saved beside the file as NAME.tail-N before it is cut; for a name near
    NAME_MAX that side name passed the limit, so recover, pack --append and Writer(mode="a")
    of such a file all failed with 'File name too long', for good (found in session 15,
    after round 18's temporary-name fix). The side name is now cut as a temporary name is."""
    limit = os.pathconf(tmp_path, "PC_NAME_MAX")
    (tmp_path / "r.jsonl").write_text("[1, 2]\n")
    for base in ("x" * (limit - 4) + ".evs", "é" * ((limit - 4) // 2) + ".evs"):
        long = tmp_path / base
        torn = b"\x01" * 100  # not a record: the damaged bytes go to the side file
        for how in ("writer", "recover", "pack --append", "writer again"):
            with evs.Writer(long, mode="a") as w:
                w.append([len(w)])
            with open(long, "ab") as f:
                f.write(torn)
            if how.startswith("writer"):
                with evs.Writer(long, mode="a") as w:
                    side = w.salvage.side_file
            elif how == "recover":
                run("recover", long, inprocess=True)
            else:
                error = run("pack", tmp_path / "r.jsonl", "-o", long, "--append", inprocess=True)
                assert "damaged tail kept in" in error.stderr
            assert evs.open(long).verify().ok
        sides = sorted(n for n in os.listdir(tmp_path) if ".tail-" in n)
        assert len(sides) == 4 and all(len(n.encode()) <= limit for n in sides), sides
        assert os.path.basename(side) in sides and all(n.startswith(base[:50]) for n in sides)
        assert all((tmp_path / n).read_bytes() == torn for n in sides)
        assert len(evs.open(long)) == 5
        for n in sides:
            (tmp_path / n).unlink()
        long.unlink()


def _cannot_create(path: str) -> bool:
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL))
    except OSError:
        return os.path.isdir(os.path.dirname(path))
    os.unlink(path)
    return False


def test_out_errors_name_out_never_its_temporary_file(packed, tmp_path):
    """CLI.md: "OUT's folder must exist (`no such folder ...`, exit 2, before any work)".
    An OUT that is a link into a missing folder, or a name ending in '/', got
    "<...>.partial: No such file or directory", naming a temporary file the user never
    asked for; so did any error creating the temporary file (a read-only filesystem)."""
    out, _ = packed
    (tmp_path / "r.jsonl").write_text("[1, 2]\n")
    os.symlink("nowhere/x.evs", tmp_path / "link.evs")
    link, nowhere = tmp_path / "link.evs", tmp_path / "nowhere"
    for args in (
        ["copy", out],
        ["merge", out],
        ["compress", out],
        ["pack", tmp_path / "r.jsonl"],
        ["pack", tmp_path / "r.jsonl", "--append"],
    ):
        error = run(*args, "-o", link, code=2, inprocess=True).stderr
        assert f"{link}: no such folder {nowhere} (the link leads to {nowhere}/x.evs)" in error
        assert ".partial" not in error, error
    for name in ("out2.evs/", "nowhere/.."):  # pathlib would drop the '/'
        error = run("copy", out, "-o", f"{tmp_path}/{name}", code=2, inprocess=True).stderr
        assert "names a folder" in error and ".partial" not in error, error
    assert sorted(os.listdir(tmp_path)) == ["link.evs", "r.jsonl", "samples", "train.evs"]
    if _cannot_create("/sys/x.evs"):  # sysfs: EACCES, even for root
        error = run("copy", out, "-o", "/sys/x.evs", code=2, inprocess=True).stderr
        assert error.startswith("evalue-store: /sys/x.evs: "), error
        assert ".partial" not in error, error


def test_encode_errors_say_what_is_wrong_and_what_to_do(tmp_path):
    with evs.Writer(tmp_path / "e.evs") as w:
        for value, message in (
            (["a", "b"], "a list of strings is not an EValue kind: store each string as its own"),
            ([[1, 2], [3, 4]], "a nested list is not an EValue kind: store it as a tensor"),
            ([1, 2.5], "list mixes float, int: wrap it to choose a kind (evs.ListDouble"),
            ([1, "a"], "a list holds only bools, only ints, only floats, or tensors"),
        ):
            with pytest.raises(evs.EncodeError, match=re.escape(message)):
                w.append([value])
    src = tmp_path / "s.jsonl"
    src.write_text('[["a", "b"]]\n')
    error = run("pack", src, "-o", tmp_path / "s.evs", code=2, inprocess=True).stderr
    assert "not str (give each string its own value, or join them)" in error


def test_a_container_is_never_replaced_by_a_page_or_a_dictionary(tmp_path):
    """`stats F --html F` and `dictionary F -o F` once wrote over the only copy of F."""
    plain, packed = tmp_path / "p.evs", tmp_path / "p.evs.zst"
    with evs.Writer(plain) as w:
        w.extend(w1_record(i) for i in range(20))
    run("compress", plain, "-o", packed, "--dictionary", "-q", inprocess=True)
    before = {p: p.read_bytes() for p in (plain, packed)}
    page_error = run("stats", plain, "--html", plain, code=2, inprocess=True)
    assert "is an evalue_store container; an HTML page never replaces one" in page_error.stderr
    assert page_error.stdout == ""  # refused before the work
    for out in (plain, packed):
        error = run("dictionary", packed, "-o", out, "--force", code=2, inprocess=True).stderr
        assert "a dictionary never replaces one" in error
    assert {p: p.read_bytes() for p in (plain, packed)} == before
    dictionary = tmp_path / "d.dict"
    run("dictionary", packed, "-o", dictionary, inprocess=True)
    assert "use --force" in run("dictionary", packed, "-o", dictionary, code=2).stderr
    run("dictionary", packed, "-o", dictionary, "--force", inprocess=True)
    (tmp_path / "notes.txt").write_text("hello")
    error = run("dictionary", tmp_path / "notes.txt", "-o", tmp_path / "x", code=2).stderr
    assert "notes.txt: bad magic" in error  # not "holds no dictionary"
    assert "is a directory" in run("stats", plain, "--html", tmp_path, code=2).stderr
    assert sorted(os.listdir(tmp_path)) == ["d.dict", "notes.txt", "p.evs", "p.evs.zst"]


def test_compress_over_its_own_input_reports_both_sizes(tmp_path):
    src = tmp_path / "p.evs"
    with evs.Writer(src) as w:
        w.extend(w1_record(i) for i in range(50))
    size = os.path.getsize(src)
    text = run("compress", src, "-o", src, "--force", inprocess=True).stdout
    assert f"compressed {src} ({size:,} bytes) into {src} ({os.path.getsize(src):,} bytes" in text
    with evs.open(src) as ds:
        assert ds.compressed and len(ds) == 50


def test_pack_names_what_is_wrong_with_an_input(tmp_path):
    cases = {
        "empty.npz": (b"", "empty.npz: cannot read: empty file"),
        "text.npz": (b"hello", "text.npz: cannot read: not a .npz file"),
        "text.npy": (b"hello", "text.npy: cannot read: not a .npy file"),
    }
    for name, (data, message) in cases.items():
        (tmp_path / name).write_bytes(data)
        error = run("pack", tmp_path / name, "-o", tmp_path / "o.evs", code=2, inprocess=True)
        assert message in error.stderr and "pickle" not in error.stderr, error.stderr
    np.savez(tmp_path / "obj.npz", a=np.array([{"a": 1}], dtype=object))
    error = run("pack", tmp_path / "obj.npz", "-o", tmp_path / "o.evs", code=2).stderr
    assert "holds Python objects, which pack never unpickles" in error
    assert "allow_pickle" not in error  # numpy's advice names an API the CLI does not have
    (tmp_path / "folder").mkdir()
    error = run("pack", tmp_path / "folder", "-o", tmp_path / "o.evs", code=2).stderr
    assert "no input files to pack (it reads .npz, .npy" in error
    empty = tmp_path / "zero.evs"
    evs.Writer(empty).close()
    assert run("head", empty).stdout == f"{empty}: no records\n"


def _npy_of_code_points(path, units: list[int]) -> None:
    """A .npy of one 0-d '<U' string of these UCS-4 units, which numpy itself will not make."""
    header = "{'descr': '<U" + str(len(units)) + "', 'fortran_order': False, 'shape': (), }"
    header = header.ljust(64 - 10 - 1) + "\n"
    body = b"".join(u.to_bytes(4, "little") for u in units)
    path.write_bytes(
        b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode() + body
    )


def test_pack_refuses_strings_beyond_unicode_and_packs_an_empty_npz(tmp_path):
    """A 0-d string array whose UCS-4 units pass U+10FFFF: numpy made a broken str of 0xFFFFFFFF
    (pack wrote a String that is not UTF-8, which verify then refused) and raised SystemError
    for 0x110000 ('internal error'); both name the file now. An .npz of no arrays is a record
    of no values (it was refused for its empty field list). Attacker findings, session 10."""
    for unit in (0x110000, 0xFFFFFFFF):
        src = tmp_path / f"s{unit:x}.npy"
        _npy_of_code_points(src, [0x41, unit])
        error = run("pack", src, "-o", tmp_path / "o.evs", code=2, inprocess=True).stderr
        assert f"{src.name}: cannot read: a string with a code point beyond U+10FFFF" in error
        assert not (tmp_path / "o.evs").exists()
    _npy_of_code_points(tmp_path / "ok.npy", [0x41, 0x10FFFF])
    run("pack", tmp_path / "ok.npy", "-o", tmp_path / "ok.evs", inprocess=True)
    assert evs.open(tmp_path / "ok.evs")[0] == ["A\U0010ffff"]
    np.savez(tmp_path / "none.npz")
    run("pack", tmp_path / "none.npz", "-o", tmp_path / "none.evs", inprocess=True)
    with evs.open(tmp_path / "none.evs") as ds:
        assert list(ds) == [[]] and ds.fields is None and ds.verify().ok


def test_export_without_hard_links_still_never_overwrites(packed, tmp_path, monkeypatch):
    """Exports go to FAT sticks for Android devices: no link(2) there."""
    out, _ = packed

    def no_links(source, target):
        raise OSError(errno.EPERM, "Operation not permitted", source)

    monkeypatch.setattr(os, "link", no_links)
    folder = tmp_path / "stick"
    run("export", out, "--to", folder, "--format", "java", inprocess=True)
    assert sorted(os.listdir(folder)) == [f"{i:06d}.bin" for i in range(12)]
    error = run("export", out, "--to", folder, "--format", "java", code=2, inprocess=True).stderr
    assert "000000.bin: already exists; use --force to overwrite" in error
    assert len(os.listdir(folder)) == 12  # nothing left behind


def test_format_version_of_new_and_appended_outputs(packed, tmp_path):
    """docs/CLI.md: a new OUT is 1.1 unless --format-version 1.0; pack --append keeps OUT's
    version; copy converts between them, record bytes unchanged."""
    out, records = packed
    old, back = tmp_path / "old.evs", tmp_path / "back.evs"
    run("copy", out, "-o", old, "--format-version", "1.0", inprocess=True)
    run("pack", tmp_path / "samples", "-o", old, "--append", inprocess=True)
    run("copy", old, "-o", back, inprocess=True)
    zst = tmp_path / "old.evs.zst"
    run("compress", old, "-o", zst, "--format-version", "1.0", inprocess=True)
    with evs.open(out) as a, evs.open(old) as b, evs.open(back) as c, evs.open(zst) as z:
        assert [ds.header.version for ds in (a, b, c, z)] == ["1.1", "1.0", "1.1", "1.0"]
        assert len(b) == len(c) == len(z) == 2 * len(a)
        assert all(bytes(b.raw(i)) == bytes(c.raw(i)) == bytes(z.raw(i)) for i in range(len(b)))
        assert all(bytes(a.raw(i)) == bytes(b.raw(i)) for i in range(len(a)))
        assert b.verify().ok and c.verify().ok and z.verify().ok
    proc = run("copy", out, "-o", tmp_path / "x.evs", "--format-version", "2.0", code=2)
    assert "--format-version" in proc.stderr


def test_pack_refuses_an_npz_naming_an_array_twice(tmp_path):
    """A zip may hold a member name twice; numpy then reads the last member under that name,
    so pack stored [x2, y, x2] and the first x was lost, silently (attacker remark, round 18).
    Members a and a.npy name the same array too. Both are refused, naming the members."""

    def npy(array):
        out = io.BytesIO()
        np.save(out, array)
        return out.getvalue()

    cases = {
        "twice.npz": (["x.npy", "y", "x.npy"], "members x.npy and x.npy both name the array 'x'"),
        "suffix.npz": (["a", "a.npy"], "members a and a.npy both name the array 'a'"),
    }
    for file, (members, message) in cases.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # zipfile warns of the duplicate name
            with zipfile.ZipFile(tmp_path / file, "w") as z:
                for k, member in enumerate(members):
                    z.writestr(member, npy(np.arange(k + 1)))
        error = run("pack", tmp_path / file, "-o", tmp_path / "o.evs", code=2, inprocess=True)
        assert f"{file}: cannot read: {message}" in error.stderr
        assert not (tmp_path / "o.evs").exists()
