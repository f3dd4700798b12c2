"""The C++ reader (cpp/, issue 15 item 2) against the Python reader: every fixture, the fuzz
corpus, damaged and mutated files must read the same (every value, bit for bit) or be
refused by both. Built with the system compiler (-Wall -Wextra -Werror), and run under
AddressSanitizer + UBSan for the hostile inputs (tests/native.py caches the build)."""

from __future__ import annotations

import json
import random
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import evalue_store as evs
from evalue_store import java
from evalue_store.zstd import is_compressed
from tests import native
from tests.cpp_compare import CORPUS, FIXTURES, assert_same, cpp_dump, tool, variants
from tests.test_damage import build, rewrite_footer
from tests.test_hostile import mutate


@pytest.fixture(scope="session")
def release() -> Path:
    return native.build("release")


@pytest.fixture(scope="session")
def asan() -> Path:
    return native.build("asan")


# ------------------------------------------------------------------------------ tests


def test_builds_warning_free_and_unit_checks_pass(release):
    """-Wall -Wextra -Werror (the build fails otherwise); checksum check values (CRC-32
    0xCBF43926, CRC-32C 0xE3069283), hardware and table CRC-32C agree, strict JSON rules."""
    done = subprocess.run([str(release / "unit")], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.endswith("ok\n"), done.stdout


def test_unit_checks_pass_under_sanitizers(asan):
    done = subprocess.run(
        [str(asan / "unit")], capture_output=True, text=True, env=native.sanitizer_env()
    )
    assert done.returncode == 0 and done.stdout.endswith("ok\n"), done.stdout + done.stderr


def _describe(value):
    """An evs_dump value in tests/test_fixtures.py's ``describe`` form (the golden file)."""
    if isinstance(value, dict) and "dtype" in value:
        rank = len(value["shape"])
        return {
            "dtype": value["dtype"],
            "shape": value["shape"],
            "strides_c": value["order"] == list(range(rank)),
            "hex": value["hex"],
        }
    if isinstance(value, dict) and "f64" in value:
        return {"float": struct.unpack("<d", bytes.fromhex(value["f64"]))[0].hex()}
    if isinstance(value, dict) and "str" in value:
        return bytes.fromhex(value["str"]).decode("utf-8")
    if isinstance(value, dict) and "bytes" in value:
        return {"bytes": value["bytes"]}
    if isinstance(value, list):
        return [_describe(v) for v in value]
    return value


@pytest.mark.parametrize("version, checksum", [("1.0", "crc32"), ("1.1", "crc32c")])
def test_fixture_matches_the_golden_file_and_the_python_reader(release, asan, version, checksum):
    path = FIXTURES / f"plain-v{version}.evs"
    expected = json.loads((FIXTURES / f"expected-v{version}.json").read_text())
    (doc,) = cpp_dump(release, [path])
    assert doc["commit"] == 3 and doc["scan"] == {"count": len(expected), "error": None}
    assert doc["checksum"] == checksum
    assert doc["aligned"] is True  # a mapping starts on a page: tensors aligned as in the file
    assert json.loads(bytes.fromhex(doc["metadata"])) == {"fixture": path.name}
    assert [_describe(r) for r in doc["values"]] == expected
    assert_same(asan, [path])
    assert_same(asan, [path], verify=False)


@pytest.mark.parametrize("version", ["1.0", "1.1"])
def test_compressed_fixture_is_refused_with_a_clear_error(asan, tmp_path, version):
    """The C++ reader reads plain files only; decompressed with the zstd CLI (what the
    error says to do) the same file reads like the plain fixture."""
    compressed = FIXTURES / f"zstd-v{version}.evs.zst"
    (doc,) = assert_same(asan, [compressed])
    assert "evalue-store decompress" in doc["open"]["error"] and "zstd -d" in doc["open"]["error"]
    plain = tmp_path / "fixture.evs"
    subprocess.run(["zstd", "-q", "-d", str(compressed), "-o", str(plain)], check=True)
    (doc,) = assert_same(asan, [plain])
    (want,) = cpp_dump(asan, [FIXTURES / f"plain-v{version}.evs"])
    assert doc["values"] == want["values"] and doc["records"] == 24


def test_a_file_written_compressed_today_is_refused_as_compressed(asan, tmp_path):
    """cpp/README: compressed files are refused with kCompressed and a message saying to
    decompress them; new ones start with the layout frame (FRAMES.md layout 2). Both ways
    the message gives work on a file with a trained dictionary, whose plain `zstd -d` (all
    the message said) fails (attacker finding, session 13, round 15, C03)."""
    path = tmp_path / "new.evs.zst"
    rng = np.random.default_rng(0)
    with evs.Writer(path, compression="zstd") as w:
        for i in range(2000):
            w.append([rng.integers(0, 50, 128), i, "the quick brown fox " * 3])
    assert path.read_bytes()[:4] == bytes.fromhex("5B2A4D18") and evs.read_dictionary(path)
    (doc,) = cpp_dump(asan, [path])
    error = doc["open"]["error"]
    assert "evalue-store decompress" in error and "-D" in error and "bad magic" not in error
    cli = [sys.executable, "-m", "evalue_store"]
    subprocess.run([*cli, "decompress", str(path), "-o", str(tmp_path / "a.evs")], check=True)
    subprocess.run([*cli, "dictionary", str(path), "-o", str(tmp_path / "d.dict")], check=True)
    subprocess.run(
        [
            "zstd",
            "-q",
            "-d",
            "-D",
            str(tmp_path / "d.dict"),
            str(path),
            "-o",
            str(tmp_path / "b.evs"),
        ],
        check=True,
    )
    for plain in ("a.evs", "b.evs"):
        (doc,) = cpp_dump(asan, [tmp_path / plain])
        assert doc["records"] == 2000


def test_java_golden_values_packed_read_the_same(asan, tmp_path):
    """Every Java golden vector (tests/fixtures/java), decoded by evs.java and written to a
    container, reads the same in C++ (what an app's EValue[] becomes on device)."""
    vectors = sorted((FIXTURES / "java").glob("*.bin"))
    assert len(vectors) >= 40
    path = tmp_path / "java.evs"
    with evs.Writer(path) as w:
        for vector in vectors:
            value = java.loads(vector.read_bytes())
            if isinstance(value, np.ndarray):
                value = value.astype(value.dtype.newbyteorder("<"))
            w.append([value])
    (doc,) = assert_same(asan, [path])
    assert doc["records"] == len(vectors) and doc["scan"]["error"] is None


def every_kind_records() -> list[list]:
    """Values of every kind and dtype, dim orders, empty and scalar tensors, lists."""
    rng = np.random.default_rng(3)
    records = []
    for dt in [
        "u1",
        "i1",
        "<i2",
        "<i4",
        "<i8",
        "<f2",
        "<f4",
        "<f8",
        "<c8",
        "<c16",
        "?",
        "<u2",
        "<u4",
        "<u8",
    ]:
        base = (rng.random((2, 3, 4, 5)) * 100).astype(dt)
        scalar = np.asarray(base[0, 0, 0, 0])
        records.append([base, base.transpose(0, 2, 3, 1), base[:, :, :0], scalar])
    bf = np.arange(6, dtype="<u2").view(evs.BFLOAT16).reshape(2, 3)
    records.append([bf, bf.T, np.zeros((0, 3), "<f4"), np.ones((1, 1, 1), "<f4")])
    records.append(
        [
            None,
            True,
            False,
            0,
            -(2**63),
            2**63 - 1,
            0.1,
            float("nan"),
            -0.0,
            float("inf"),
            "",
            "héllo \u0000 😀",
            b"\x00\xff raw",
        ]
    )
    records.append(
        [
            [True, False],
            [1.5, -2.0],
            [1, -(2**63)],
            [np.arange(3), np.eye(2)],
            [None, np.arange(2, dtype="<i4"), None],
            [],
            [np.zeros((0,))],
        ]
    )
    records.append([])
    return records


@pytest.mark.parametrize("alignment", [8, 64, 4096])
def test_every_kind_reads_the_same(asan, tmp_path, alignment):
    path = tmp_path / "kinds.evs"
    with evs.Writer(path, alignment=alignment, metadata={"a": [1, 2.5, None, "é"]}) as w:
        for k, record in enumerate(every_kind_records()):
            w.append(record)
            if k % 5 == 4:
                w.commit()
    (doc,) = assert_same(asan, [path])
    assert doc["records"] == len(every_kind_records())
    channels_last = doc["values"][0][1]
    assert channels_last["order"] == [0, 3, 1, 2] and channels_last["shape"] == [2, 4, 5, 3]


def _corpus_inputs(tmp_path: Path, target: str) -> tuple[list[Path], list[Path]]:
    """tests/fuzz_corpus/<target> inputs as files (tools/fuzz.py's input form): (checked
    with verify on, checked with verify off)."""
    fuzz = tool("fuzz")
    on, off = [], []
    for k, src in enumerate(sorted((CORPUS / target).iterdir())):
        if src.name.endswith(".md"):
            continue
        body, _, verify = fuzz.container_input(src.read_bytes())
        path = tmp_path / f"{target}-{k}.evs"
        path.write_bytes(body)
        (on if verify else off).append(path)
    return on, off


@pytest.mark.parametrize("target", ["container", "recover"])
def test_fuzz_corpus_reads_and_refuses_like_python(asan, tmp_path, target):
    """Every kept fuzz input (seeds, coverage corpus, hostile headers, crashers) under the
    sanitizers: the same values and the same refusals as the Python reader."""
    on, off = _corpus_inputs(tmp_path, target)
    assert len(on) + len(off) >= 100
    docs = assert_same(asan, on) + assert_same(asan, off, verify=False)
    opened = sum(d["open"] == "ok" for d in docs)
    refused = sum(d["open"] != "ok" for d in docs)
    assert opened >= 20 and refused >= 20  # the corpus exercises both


def test_truncations_and_bit_flips_read_like_python(asan, tmp_path):
    """tests/test_damage.py's damage: the file cut at every byte (a crash at any instant:
    the last whole commit, the tail, a torn header), and bit flips anywhere."""
    path = tmp_path / "full.evs"
    build(path, metadata={"k": "v"})
    data = path.read_bytes()
    cuts = variants(tmp_path, "cut", [data[:n] for n in range(len(data) + 1)])
    docs = assert_same(asan, cuts)
    assert {d["records"] for d in docs if d["open"] == "ok"} == {0, 3, 5, 9}
    rng = random.Random(1)
    flips = []
    for pos in rng.sample(range(len(data)), 600):
        flipped = bytearray(data)
        flipped[pos] ^= 1 << rng.randrange(8)
        flips.append(bytes(flipped))
    paths = variants(tmp_path, "flip", flips)
    docs = assert_same(asan, paths)
    assert sum(d["open"] != "ok" for d in docs) > 10
    assert sum("error" in json.dumps(d["values"]) for d in docs if d["open"] == "ok") > 10
    assert_same(asan, paths[:200], verify=False)


def test_hostile_footers_segments_entries_and_dims_are_refused_like_python(asan, tmp_path):
    """tests/test_damage.py's signed lies: footers, segments, index entries, tensor dims."""
    from dataclasses import replace

    from evalue_store.container import ENTRY, FRAME, Segment, crc32

    base = tmp_path / "h.evs"
    build(base)
    ds = evs.open(base)
    commit = ds.commit
    ds.close()
    blobs = []
    seg = commit.segments[-1]
    changes = [
        {"record_count": 10**12},
        {"metadata_length": 1 << 40, "metadata_offset": 128},
        {"prev_footer": 1 << 50},
        {"number": 1},
        {"metadata_crc": 7},
        {"segments": commit.segments[:-1] + (Segment(seg.offset, 1 << 60, seg.crc, 0),)},
        {"segments": commit.segments[:-1] + (Segment(seg.offset + 1, seg.count, seg.crc, 0),)},
        {"segments": commit.segments[:-1] + (Segment(1 << 62, seg.count, seg.crc, 0),)},
        {"segments": commit.segments + commit.segments[-1:], "record_count": 13},
    ]
    for change in changes:
        path = tmp_path / "h2.evs"
        path.write_bytes(base.read_bytes())
        rewrite_footer(path, **change)
        blobs.append(path.read_bytes())
    # index entries and tensor dims: consistent, signed lies inside records
    with evs.Writer(path, metadata={"x": 1}) as w:
        w.append([np.arange(4, dtype=np.int64)])
        w.append([np.arange(4) + 1])
    ds = evs.open(path)
    entries, segment = ds.entries().copy(), ds.commit.segments[0].offset
    ds.close()
    original = path.read_bytes()
    offset, length = int(entries["offset"][0]), int(entries["length"][0])
    for bad_offset, bad_length in [
        (1 << 40, length),
        (offset + 8, length),
        (offset, 1 << 62),
        (int(entries["offset"][1]), length),
    ]:
        data = bytearray(original)
        ENTRY.pack_into(data, segment, bad_offset, bad_length, int(entries["crc"][0]), 0)
        blobs.append(bytes(data))
    for dim in (1 << 40, 1 << 62, (1 << 64) - 1, 0):
        data = bytearray(original)
        payload = bytearray(data[offset + 16 : offset + 16 + length])
        struct.pack_into("<Q", payload, 8, dim)
        crc = crc32(payload)
        data[offset + 16 : offset + 16 + length] = payload
        FRAME.pack_into(data, offset, b"EVR1", crc, length)
        ENTRY.pack_into(data, segment, offset, length, crc, 0)
        blobs.append(bytes(data))
    blobs += [b"", b"\x89EVS", b"PK\x03\x04" + bytes(100), random.Random(2).randbytes(4096)]
    docs = assert_same(asan, variants(tmp_path, "lie", blobs))
    assert all(d["open"] != "ok" for d in docs[: len(changes)])
    assert replace  # dataclasses.replace is what rewrite_footer re-signs with


def test_metadata_edge_cases_are_read_the_same(release, tmp_path):
    """FORMAT.md section 7 rule 2, for both readers: nesting at most 512 deep; no byte order
    mark; a repeated key is not rejected; a number rounding to an infinite double is, one
    underflowing to 0 is not."""
    from tests.test_spec_rules import nested_metadata, replace_metadata

    texts = {
        json.dumps(nested_metadata(512)).encode(): True,
        json.dumps(nested_metadata(513)).encode(): False,
        b"\xef\xbb\xbf{}": False,
        b'{"a": 1, "a": 2}': True,
        b'{"a": 1e-400}': True,
        b'{"a": 1.7976931348623157e308}': True,
        b'{"a": 1.7976931348623159e308}': False,
    }
    paths = []
    for k, text in enumerate(texts):
        path = tmp_path / f"m{k}.evs"
        with evs.Writer(path) as w:
            w.append([1])
        replace_metadata(path, text)
        paths.append(path)
    docs = assert_same(release, paths)
    assert [not isinstance(d["metadata"], dict) for d in docs] == list(texts.values())


def test_random_mutations_of_fixtures_read_like_python(asan, tmp_path):
    """Fixtures and seeds mutated (tests/test_hostile.py's operations), half of them
    re-signed (tools/fuzz.py's fix_checksums) so the damage reaches the inner parsers."""
    fuzz = tool("fuzz")
    seeds = [(FIXTURES / "plain-v1.0.evs").read_bytes()]
    seeds += [
        fuzz.container_input(p.read_bytes())[0] for p in sorted(CORPUS.glob("container/seed-*"))
    ]
    seeds = [s for s in seeds if s and not is_compressed(s[:8])]
    rng = random.Random(15)
    ops_kinds = ["flip", "set", "insert", "delete", "truncate", "duplicate", "u64"]
    big = [0, 1, 2**31 - 1, 2**32 - 1, 2**40, 2**62, 2**64 - 1]
    blobs = []
    for k in range(400):
        ops = [
            (rng.choice(ops_kinds), rng.randrange(1 << 16), rng.randrange(256), rng.choice(big))
            for _ in range(rng.randint(1, 6))
        ]
        blob = bytearray(mutate(rng.choice(seeds), ops))
        blobs.append(bytes(fuzz.fix_checksums(blob) if k % 2 else blob))
    docs = assert_same(asan, variants(tmp_path, "mut", blobs))
    assert sum(d["open"] == "ok" for d in docs) > 50


def test_fuzz_target_replays_the_corpus_under_sanitizers(asan):
    """The libFuzzer target (cpp/fuzz/fuzz_reader.cc; clang builds it with -fsanitize=fuzzer)
    built as a replay tool: every kept input of every container-shaped target, and 40 random
    mutations of each (a fuzzer's operations, without clang's coverage guidance)."""
    files = [p for t in ("container", "recover") for p in sorted((CORPUS / t).iterdir())]
    done = subprocess.run(
        [str(asan / "fuzz_replay"), "--mutate", "40", *map(str, files)],
        capture_output=True,
        text=True,
        env=native.sanitizer_env(),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == f"replayed {len(files)} inputs, {40 * len(files)} mutants\n"


def test_libfuzzer_run_of_the_fuzz_target_finds_nothing(tmp_path):
    """A real coverage-guided libFuzzer run (clang -fsanitize=fuzzer, with ASan and UBSan)
    of cpp/fuzz/fuzz_reader.cc from the kept corpus, 20 s (tools/fuzz_cpp.py runs longer
    campaigns): no crash, sanitizer report, leak, hang or oversized allocation."""
    result = tool("fuzz_cpp").campaign(20, tmp_path)
    assert result["returncode"] == 0 and not result["crashes"], result["log"][-3000:]
    assert result["runs"] > 1000 and result["coverage"] > 300, result["log"][-3000:]


def test_benchmark_script_measures_reads(tmp_path):
    """benchmarks/cpp_reader.py's read part runs (no timing is asserted)."""
    from benchmarks.cpp_reader import read_overhead

    report = read_overhead(tmp_path, 300)
    for name in ("xor_2_values_v1.0", "mixed_4_values_v1.1"):
        assert report[name]["ns_per_record"] > 0 and report[name]["frame_bytes"] > 100
