"""evalue_store.java against the bytes ExecuTorch Android's Java EValue really wrote.

The vectors are kept in the repository (tests/fixtures/java, copied from the shared
shared/vectors/executorch-java set), so a clone alone runs every test. EVS_JAVA_VECTORS names
another directory with the same manifest layout (the held-back set), tested as well. The
in-repo copy is checked against SHA-256 sums of the shared set (fixtures/java_shared.sha256),
and so is the shared set itself where it sits beside the repository.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import struct
import subprocess
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from evalue_store import BFLOAT16, EncodeError, FormatError, ListInt, String, Tensor, java
from evalue_store.java import dumps, dumps_record, iter_record_slices, loads, loads_record

# ----------------------------------------------------------------------------- vectors


IN_REPO_VECTORS = Path(__file__).resolve().parent / "fixtures" / "java"
SHARED_VECTORS = Path(__file__).resolve().parents[2] / "shared" / "vectors" / "executorch-java"


def _vector_dirs() -> list[Path]:
    """The in-repo vectors, plus the EVS_JAVA_VECTORS directory when that is set."""
    override = os.environ.get("EVS_JAVA_VECTORS")
    return [IN_REPO_VECTORS] + ([Path(override)] if override else [])


def _read_manifest(directory: Path) -> dict[str, Any]:
    path = directory / "manifest.json"
    if not path.is_file():
        pytest.fail(
            f"Java EValue vectors not found: {path} does not exist. The in-repo copy is "
            "tests/fixtures/java; EVS_JAVA_VECTORS, if set, must name a vector directory.",
            pytrace=False,
        )
    return json.loads(path.read_text(encoding="utf-8"))


def _vector_params() -> list[Any]:
    # Collected at import; a missing directory becomes one failing case, never a skip.
    params = []
    for k, directory in enumerate(_vector_dirs()):
        prefix = "" if k == 0 else "extra-"
        try:
            entries = json.loads((directory / "manifest.json").read_text(encoding="utf-8"))
        except OSError:
            params.append(pytest.param((directory, None), id=f"{prefix}vectors-missing"))
            continue
        params += [pytest.param((directory, e), id=prefix + e["name"]) for e in entries["vectors"]]
    return params


VECTORS = _vector_params()

# Canonical NaN bits the manifest promises, per itemsize.
CANONICAL_NAN = {2: 0x7E00, 4: 0x7FC00000, 8: 0x7FF8000000000000}


def _vector_bytes(vector: tuple[Path, dict[str, Any] | None]) -> tuple[bytes, dict[str, Any]]:
    directory, entry = vector
    if entry is None:
        _read_manifest(directory)  # fails with the explanation
    return (directory / entry["file"]).read_bytes(), entry


def _manifest_float(item: Any) -> float:
    specials = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf"), "-0.0": -0.0}
    if isinstance(item, str):
        return specials[item]
    return float(item)


def _manifest_value(spec: dict[str, Any]) -> Any:
    kind = spec["type"]
    if kind == "none":
        return None
    if kind == "bool":
        return spec["value"]
    if kind == "int":
        return int(spec["value"])
    if kind == "double":
        return _manifest_float(spec["value"])
    if kind == "string":
        return spec["value"]
    assert kind == "tensor", f"unknown manifest value type {kind!r}"
    dtype = np.dtype(spec["dtype"])
    if dtype.kind == "f":
        floats = [_manifest_float(x) for x in spec["values"]]
        flat = np.array(floats, np.float64).astype(dtype)
        _bits(flat)[np.isnan(flat)] = CANONICAL_NAN[dtype.itemsize]
    else:
        flat = np.array([int(x) for x in spec["values"]], dtype)
    return flat.reshape(spec["shape"])


# ----------------------------------------------------------------------------- helpers


def _bits(array: np.ndarray) -> np.ndarray:
    """The array's raw bit patterns as unsigned ints, so NaN payloads and -0.0 compare."""
    order = array.dtype.byteorder if array.dtype.byteorder in "<>" else "="
    return array.view(np.dtype(f"u{array.dtype.itemsize}").newbyteorder(order))


def _double_bits(value: float) -> bytes:
    return struct.pack(">d", value)


def assert_same(actual: Any, expected: Any) -> None:
    """Equality that sees types, dtypes, NaN payloads and the sign of zero."""
    if isinstance(expected, np.ndarray):
        assert isinstance(actual, np.ndarray)
        assert actual.dtype.name == expected.dtype.name
        assert actual.dtype == actual.dtype.newbyteorder(">"), "decoded tensors are big-endian"
        assert actual.shape == expected.shape
        assert np.array_equal(_bits(actual), _bits(expected))
    elif isinstance(expected, float):
        assert type(actual) is float and _double_bits(actual) == _double_bits(expected)
    else:
        assert type(actual) is type(expected) and actual == expected


def _reference_tensor_bytes(array: np.ndarray) -> bytes:
    """Java's tensor layout built element by element, independently of the codec."""
    codes = {
        "uint8": 0,
        "int8": 1,
        "int32": 3,
        "int64": 4,
        "float16": 5,
        "float32": 6,
        "float64": 7,
    }
    fmt = {1: "B", 2: "H", 4: "I", 8: "Q"}[array.dtype.itemsize]
    head = struct.pack(f">BBB{array.ndim}i", 1, codes[array.dtype.name], array.ndim, *array.shape)
    return head + b"".join(struct.pack(">" + fmt, int(x)) for x in _bits(array).ravel(order="C"))


def _error(data: Any, **kwargs: Any) -> FormatError:
    with pytest.raises(FormatError) as info:
        loads(data, **kwargs)
    return info.value


# ----------------------------------------------------------------------------- vector tests


@pytest.mark.parametrize("directory", _vector_dirs(), ids=str)
def test_manifest_is_complete(directory: Path) -> None:
    manifest = _read_manifest(directory)
    assert manifest["vectors"], "manifest lists no vectors"
    assert manifest["count"] == len(manifest["vectors"])
    for entry in manifest["vectors"]:
        assert (directory / entry["file"]).is_file(), entry["file"]


def test_in_repo_vectors_are_tracked_by_git() -> None:
    """A clone gets the vectors only if .gitignore lets them be committed."""
    repo = IN_REPO_VECTORS.parents[2]
    if not (repo / ".git").exists():
        pytest.skip("not a git checkout")
    names = sorted(p.name for p in IN_REPO_VECTORS.iterdir())
    ignored = subprocess.run(
        ["git", "check-ignore", "--no-index", *names],
        cwd=IN_REPO_VECTORS,
        capture_output=True,
        text=True,
    )
    assert ignored.returncode == 1 and not ignored.stdout, ignored.stdout


def _digests(directory: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in directory.iterdir()
        if p.is_file()
    }


def test_in_repo_vectors_are_the_shared_set() -> None:
    """The in-repo copy is the shared set byte for byte: every file against the SHA-256 sums
    taken of the shared set when it was copied (fixtures/java_shared.sha256, the format
    `sha256sum -c` reads), and, where the shared set sits beside the repository, the shared
    set against the same sums (a changed shared set must be copied again)."""
    pinned = {}
    for line in (IN_REPO_VECTORS.parent / "java_shared.sha256").read_text().splitlines():
        digest, name = line.split("  ", 1)
        pinned[name] = digest
    assert len(pinned) >= 50, "the sums list lost its vectors"
    assert _digests(IN_REPO_VECTORS) == pinned
    if SHARED_VECTORS.is_dir():
        assert _digests(SHARED_VECTORS) == pinned, f"{SHARED_VECTORS} changed: copy it again"


def test_missing_vector_directory_fails_loudly(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("EVS_JAVA_VECTORS", str(tmp_path / "nowhere"))
    assert _vector_dirs() == [IN_REPO_VECTORS, tmp_path / "nowhere"]
    with pytest.raises(pytest.fail.Exception, match="EVS_JAVA_VECTORS"):
        _read_manifest(_vector_dirs()[1])


@pytest.mark.parametrize("entry", VECTORS)
def test_vector_decodes_and_reencodes_byte_exact(entry: tuple[Path, Any]) -> None:
    raw, entry = _vector_bytes(entry)
    assert len(raw) == entry["length"]
    assert hashlib.sha256(raw).hexdigest() == entry["sha256"]
    value = loads(raw)
    assert_same(value, _manifest_value(entry["value"]))
    assert dumps(value) == raw
    assert dumps(_manifest_value(entry["value"])) == raw


@pytest.mark.parametrize("entry", VECTORS)
def test_vector_truncated_anywhere_is_rejected(entry: tuple[Path, Any]) -> None:
    raw, _ = _vector_bytes(entry)
    for cut in range(len(raw)):
        error = _error(raw[:cut])
        assert error.offset is not None and error.offset <= cut


@pytest.mark.parametrize("entry", VECTORS)
def test_vector_mutations_only_raise_format_error(entry: tuple[Path, Any]) -> None:
    raw, entry = _vector_bytes(entry)
    rng = random.Random(entry["name"])
    for _ in range(150):
        data = bytearray(raw)
        for _ in range(rng.randint(1, 3)):
            spot = rng.randrange(len(data) + 1)
            op = rng.randrange(4)
            if op == 0 and spot < len(data):
                data[spot] = rng.randrange(256)
            elif op == 1 and spot < len(data):
                data[spot] ^= 1 << rng.randrange(8)
            elif op == 2:
                data.insert(spot, rng.randrange(256))
            elif spot < len(data):
                del data[spot]
        _accepts_only_canonical(bytes(data))


def _accepts_only_canonical(data: bytes) -> None:
    """Whatever loads accepts, dumps writes back identically; anything else is FormatError."""
    for mode in ("str", "bytes"):
        try:
            value = loads(data, strings=mode)
        except FormatError:
            continue
        assert dumps(value) == data


# ----------------------------------------------------------------------------- writer


def test_scalar_layouts() -> None:
    assert dumps(None) == b"\x00"
    assert dumps(True) == b"\x05\x01"
    assert dumps(False) == b"\x05\x00"
    assert dumps(np.bool_(True)) == b"\x05\x01"
    assert dumps(-2) == bytes.fromhex("04fffffffffffffffe")
    assert dumps(np.int8(5)) == bytes.fromhex("040000000000000005")
    assert dumps(1.5) == bytes.fromhex("033ff8000000000000")
    assert dumps(np.float32(0.5)) == bytes.fromhex("033fe0000000000000")
    assert dumps("") == b"\x02\x00\x00\x00\x00"
    assert dumps("a\x00\U0001f600") == bytes.fromhex("02000000066100f09f9880")
    assert dumps(b"\xff\xc0\x80") == bytes.fromhex("0200000003ffc080")  # bytes go as-is
    assert dumps(String(bytearray(b"x"))) == bytes.fromhex("020000000178")


def test_tensor_layout_ignores_byte_order_and_memory_layout() -> None:
    base = np.arange(24, dtype=np.int32).reshape(2, 3, 4) - 7
    expected = _reference_tensor_bytes(base)
    variants = [
        base.astype("<i4"),
        base.astype(">i4"),
        np.asfortranarray(base),
        np.ascontiguousarray(base[::-1])[::-1],
        base.transpose(2, 0, 1).transpose(1, 2, 0),
        Tensor(base.astype(">i4")),
    ]
    for variant in variants:
        assert dumps(variant) == expected
    assert dumps(Tensor(np.float32(2.0))) == bytes.fromhex("0106" + "00" + "40000000")


def test_float_bit_patterns_pass_through() -> None:
    for bits in (0x7FC00001, 0x7F800001, 0xFFC00000, 0x80000000, 0x00000001):
        array = np.array([bits], "<u4").view("<f4")
        assert dumps(array)[-4:] == bits.to_bytes(4, "big")
        assert _bits(loads(dumps(array)))[0] == bits
    half = np.array([0x7C01, 0x8000, 0x0001], "<u2").view("<f2")
    assert dumps(half)[-6:] == bytes.fromhex("7c0180000001")
    for pattern in ("7ff0000000000001", "fff8000000000abc", "8000000000000000", "0000000000000001"):
        value = struct.unpack(">d", bytes.fromhex(pattern))[0]
        assert dumps(value) == bytes.fromhex("03" + pattern)
        assert _double_bits(loads(dumps(value))) == bytes.fromhex(pattern)


@pytest.mark.parametrize(
    "dtype", ["int16", "uint16", "uint32", "uint64", "bool", "complex64", "complex128", BFLOAT16]
)
def test_writer_rejects_dtypes_java_cannot_hold(dtype: Any) -> None:
    array = np.zeros(3, dtype)
    name = "bfloat16" if dtype is BFLOAT16 else np.dtype(dtype).name
    with pytest.raises(EncodeError, match=f"dtype {name} "):
        dumps(array)


def test_writer_rejects_values_java_cannot_hold() -> None:
    for value in ([1, 2], ListInt([1]), (1.5, 2.5), [np.zeros(2)]):
        with pytest.raises(EncodeError, match="list kinds"):
            dumps(value)
    with pytest.raises(EncodeError, match="int64"):
        dumps(1 << 63)
    for text in ("\ud800", "a\ud83d", "\udfffz"):
        with pytest.raises(EncodeError, match="not valid Unicode"):
            dumps(text)
    with pytest.raises(EncodeError):
        dumps(object())


def test_writer_rejects_dims_and_sizes_beyond_java() -> None:
    # Views with huge shapes but no memory: the checks must run before any copy.
    with pytest.raises(EncodeError, match="dim 2147483648"):
        dumps(np.empty((0, 2**31), np.float32))
    with pytest.raises(EncodeError, match="dim 4294967301"):
        dumps(np.empty((2**32 + 5, 0), np.uint8))
    with pytest.raises(EncodeError, match="dim 2147483648"):
        dumps(np.broadcast_to(np.float32(0), (2**31,)))
    with pytest.raises(EncodeError, match="2147483640 bytes"):
        dumps(np.broadcast_to(np.uint8(0), (2**31 - 15,)))
    with pytest.raises(EncodeError, match="byte\\[\\]"):
        dumps(np.broadcast_to(np.float64(0), (2**28,)))
    assert dumps(np.empty((0, 2**31 - 1), np.float64)) == bytes.fromhex("010702000000007fffffff")


# ----------------------------------------------------------------------------- reader strictness

F32_5 = bytes.fromhex("01060100000005")
GOOD_F32_5 = F32_5 + b"\x00" * 20


@pytest.mark.parametrize(
    ("data", "offset", "reason"),
    [
        (b"", 0, "empty input"),
        (b"\x09", 0, "unknown EValue tag 9"),
        (b"\x06\x00", 0, "unknown EValue tag 6"),
        (b"\xff", 0, "unknown EValue tag 255"),
        (b"\x80\x00", 0, "unknown EValue tag 128"),
        (b"\x04\x00\x00\x00", 1, "truncated Int payload"),
        (b"\x03", 1, "truncated Double payload"),
        (b"\x05", 1, "truncated Bool payload"),
        (b"\x05\x02", 1, "Bool byte is 2"),
        (b"\x05\xff", 1, "Bool byte is 255"),
        (b"\x02\x00\x00", 1, "truncated String length"),
        (b"\x02\xff\xff\xff\xff", 1, "negative String length -1"),
        (b"\x02\x00\x00\x00\x03ab", 5, "truncated String bytes"),
        (b"\x02\x00\x00\x00\x02\xc0\x80", 5, "invalid UTF-8"),
        (b"\x02\x00\x00\x00\x02a\xff", 6, "invalid UTF-8"),
        (b"\x02\x00\x00\x00\x03\xed\xa0\x80", 5, "invalid UTF-8"),  # UTF-8 of a lone surrogate
        (b"\x02\x00\x00\x00\x04\xf0\x9f\x98", 5, "truncated String bytes"),
        (b"\x02\x00\x00\x00\x03\xf0\x9f\x98", 5, "invalid UTF-8"),
        (b"\x00\x00", 1, "1 trailing bytes after the NONE"),
        (b"\x05\x01\x05\x01", 2, "2 trailing bytes after the BOOL"),
        (b"\x04" + bytes(8) + b"\x07", 9, "1 trailing bytes after the INT"),
        (b"\x02\x00\x00\x00\x01a!", 6, "trailing bytes after the STRING"),
        (b"\x01", 1, "truncated tensor header"),
        (b"\x01\x06", 1, "truncated tensor header"),
        (b"\x01\x0b\x00\x01", 1, "dtype code 11 (bool"),
        (b"\x01\x02\x00\x00\x01", 1, "dtype code 2 (int16"),
        (b"\x01\x0f\x00\x00\x01", 1, "dtype code 15 (bfloat16"),
        (b"\x01\xff\x00", 1, "dtype code 255"),
        (b"\x01\x06\x80", 2, "rank byte 128"),
        (b"\x01\x06\xff" + bytes(1020), 2, "rank byte 255"),
        (b"\x01\x06\x02\x00\x00\x00\x01\x00", 3, "truncated tensor dims"),
        (b"\x01\x06\x02\x00\x00\x00\x01\xff\xff\xff\xff", 7, "negative tensor dim -1 (axis 1)"),
        (b"\x01\x06\x01\x80\x00\x00\x00", 3, "negative tensor dim -2147483648"),
        (F32_5 + bytes(8), 7, "truncated tensor data"),
        (F32_5 + bytes(22), 27, "2 trailing bytes after tensor data"),
        (F32_5 + bytes(24), 27, "4 trailing bytes after tensor data"),
        (b"\x01\x00\x01\x00\x00\x00\x02" + b"\x00\x06\x01\x00", 9, "2 trailing bytes"),
    ],
)
def test_reader_rejects(data: bytes, offset: int, reason: str) -> None:
    error = _error(data)
    assert error.offset == offset
    assert reason in error.reason
    assert f"offset {offset}" in str(error)


def test_reader_accepts_what_it_should() -> None:
    assert_same(loads(GOOD_F32_5), np.zeros(5, ">f4"))
    assert loads(b"\x05\x00") is False
    assert loads(b"\x02\x00\x00\x00\x02\xc0\x80", strings="bytes") == b"\xc0\x80"
    assert loads(b"\x02\x00\x00\x00\x02ab", strings="bytes") == b"ab"
    assert loads(b"\x02\x00\x00\x00\x04\xf0\x9f\x98\x80") == "\U0001f600"
    assert_same(loads(b"\x01\x06\x00\x00\x00\x00\x00"), np.zeros((), ">f4"))


def test_uint8_tensor_is_exactly_its_data_unlike_java() -> None:
    # Java's reader would return the header bytes first; the correct value is just the data.
    value = loads(bytes.fromhex("0100010000000300ff7f"))
    assert value.dtype == np.uint8 and value.tolist() == [0, 255, 127]
    value = loads(bytes.fromhex("010101000000028001"))
    assert value.dtype == np.int8 and value.tolist() == [-128, 1]


def test_shapes_numpy_cannot_represent_are_format_errors() -> None:
    deep = struct.pack(">BBB", 1, 0, 65) + struct.pack(">65i", *([1] * 65)) + b"\x07"
    assert "not numpy" in _error(deep).reason
    huge_empty = struct.pack(">BBB", 1, 6, 3) + struct.pack(">3i", 0, 2**31 - 1, 2**31 - 1)
    assert "not numpy" in _error(huge_empty).reason


def test_hostile_headers_allocate_nothing() -> None:
    hostile = [
        (
            struct.pack(">BBB", 1, 7, 127) + struct.pack(">127i", *[2**31 - 1] * 127) + bytes(64),
            511,
        ),
        (b"\x02\x7f\xff\xff\xff" + b"abc", 5),
    ]
    tracemalloc.start()
    try:
        for data, offset in hostile:
            assert _error(data).offset == offset
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 200_000


def test_reader_input_types() -> None:
    raw = dumps(np.arange(6, dtype=np.int64).reshape(2, 3))
    for form in (raw, bytearray(raw), memoryview(raw), np.frombuffer(raw, np.uint8).copy()):
        assert_same(loads(form), np.arange(6, dtype=">i8").reshape(2, 3))
    with pytest.raises(TypeError):
        loads(raw.decode("latin-1"))
    with pytest.raises(TypeError):
        loads(np.frombuffer(raw, np.uint8).astype(np.float32))
    with pytest.raises(TypeError):
        loads(np.frombuffer(raw + raw, np.uint8)[::2])
    with pytest.raises(ValueError, match="strings"):
        loads(raw, strings="latin-1")


def test_tensors_are_zero_copy_views() -> None:
    source = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    buffer = np.frombuffer(dumps(source), np.uint8).copy()
    value = loads(buffer)
    assert np.shares_memory(value, buffer)
    assert value.dtype == np.dtype(">f4") and np.array_equal(value, source)
    buffer[-4:] = np.frombuffer(struct.pack(">f", 9.0), np.uint8)
    assert value[2, 3] == 9.0
    assert not loads(dumps(source)).flags.writeable  # bytes input stays immutable

    record = np.frombuffer(dumps_record([source, "x", source[0]]), np.uint8).copy()
    first, _, third = loads_record(record)
    assert np.shares_memory(first, record) and np.shares_memory(third, record)


# ----------------------------------------------------------------------------- records


def _i32(number: int) -> bytes:
    return struct.pack(">i", number)


def test_record_layout() -> None:
    record = dumps_record([None, True, "é"])
    assert record == (
        b"EVJ1"
        + _i32(3)
        + _i32(1)
        + b"\x00"
        + _i32(2)
        + b"\x05\x01"
        + _i32(7)
        + b"\x02"
        + _i32(2)
        + "é".encode()
    )
    assert loads_record(record) == [None, True, "é"]
    assert [bytes(s) for s in iter_record_slices(record)] == [b"\x00", b"\x05\x01", dumps("é")]
    assert dumps_record([]) == b"EVJ1" + _i32(0)
    assert loads_record(b"EVJ1" + _i32(0)) == []
    assert loads_record(dumps_record((b"\xff",)), strings="bytes") == [b"\xff"]


def test_record_writer_errors(monkeypatch) -> None:
    with pytest.raises(TypeError):
        dumps_record(np.zeros(3))
    with pytest.raises(TypeError):
        dumps_record("abc")
    with pytest.raises(EncodeError, match="record value 1: .*list kinds"):
        dumps_record([1, [1, 2]])
    # Each value fits Java's byte[] but the record does not (limit shrunk to keep this cheap).
    monkeypatch.setattr(java, "JAVA_MAX_ARRAY", 40)
    assert len(dumps("x" * 30)) == 35
    with pytest.raises(EncodeError, match="serialized record would be 47 bytes"):
        dumps_record(["x" * 30])


ONE_NONE = b"EVJ1" + _i32(1) + _i32(1) + b"\x00"


@pytest.mark.parametrize(
    ("data", "offset", "reason"),
    [
        (b"EVJ", 0, "truncated record header"),
        (b"EVJ2" + _i32(0), 0, "bad record magic"),
        (b"EVJ1" + _i32(-1), 4, "negative record count"),
        (b"EVJ1" + _i32(2**31 - 1) + bytes(4), 4, "record count 2147483647"),
        (b"EVJ1" + _i32(2) + _i32(1) + b"\x00", 4, "record count 2"),
        (b"EVJ1" + _i32(1) + _i32(0) + b"\x00", 8, "length 0"),
        (b"EVJ1" + _i32(1) + _i32(-5) + b"\x00", 8, "length -5"),
        (b"EVJ1" + _i32(1) + _i32(2**31 - 1) + b"\x00", 12, "truncated record value 0"),
        (b"EVJ1" + _i32(1) + _i32(2) + b"\x00", 12, "truncated record value 0"),
        (b"EVJ1" + _i32(2) + _i32(1) + b"\x00" + _i32(1) + b"\x00" + b"\x00", 18, "1 trailing"),
        (ONE_NONE + b"\x00", 13, "1 trailing bytes after the record"),
        (b"EVJ1" + _i32(1) + _i32(2) + b"\x05\x02", 13, "record value 0: Bool byte is 2"),
        (b"EVJ1" + _i32(1) + _i32(2) + b"\x00\x00", 13, "record value 0: 1 trailing"),
    ],
)
def test_record_reader_rejects(data: bytes, offset: int, reason: str) -> None:
    with pytest.raises(FormatError) as info:
        loads_record(data)
    assert info.value.offset == offset
    assert reason in info.value.reason


def test_record_slices_check_header_eagerly_and_allocate_nothing() -> None:
    tracemalloc.start()
    try:
        with pytest.raises(FormatError, match="record count"):
            iter_record_slices(b"EVJ1" + _i32(2**31 - 1) + bytes(4))  # 12 bytes, no next()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 200_000
    with pytest.raises(FormatError, match="trailing"):
        list(iter_record_slices(ONE_NONE + b"\x01"))


# ----------------------------------------------------------------------------- properties

JAVA_DTYPE_NAMES = ["uint8", "int8", "int32", "int64", "float16", "float32", "float64"]
SPECIAL_BITS = {
    1: [0x00, 0x80, 0x7F, 0xFF],
    2: [0x7E00, 0x7C01, 0xFE00, 0x8000, 0x0001, 0x7C00, 0xFFFF],
    4: [0x7FC00000, 0x7F800001, 0xFFC00001, 0x80000000, 0x00000001, 0x7F800000],
    8: [0x7FF8000000000000, 0x7FF0000000000001, 0xFFF8000000000123, 1 << 63, 1, 0x7FF << 52],
}


@st.composite
def tensors(draw: st.DrawFn) -> np.ndarray:
    """Arrays of the 7 Java dtypes, any bit patterns, either byte order, assorted layouts."""
    dtype = np.dtype(draw(st.sampled_from(JAVA_DTYPE_NAMES)))
    size = dtype.itemsize
    elements = st.integers(0, 2 ** (8 * size) - 1) | st.sampled_from(SPECIAL_BITS[size])
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=4))
    bits = draw(hnp.arrays(np.dtype(f"u{size}"), shape, elements=elements))
    order = draw(st.sampled_from("<>"))
    array = bits.astype(bits.dtype.newbyteorder(order)).view(dtype.newbyteorder(order))
    layout = draw(st.sampled_from(["C", "F", "reversed", "transposed"]))
    if layout == "F":
        array = np.asfortranarray(array)
    elif layout == "reversed" and array.ndim:
        array = array[::-1]
    elif layout == "transposed":
        array = array.T
    return array


NAN_DOUBLES = st.integers(0, 2**52 - 1).map(
    lambda m: struct.unpack(">d", struct.pack(">Q", (0xFFF << 52) | m | 1))[0]
)
CHARS = st.sampled_from(["\x00", "a", "é", "世", "\U0001f600", "\U0010ffff"]) | st.characters(
    codec="utf-8"
)
TEXT = st.text(CHARS)
VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(),
    NAN_DOUBLES,
    TEXT,
    st.binary(max_size=40),
    tensors(),
)


def _expected(value: Any, strings: str) -> Any:
    if isinstance(value, str) and strings == "bytes":
        return value.encode("utf-8")
    return value


@settings(max_examples=600, deadline=None)
@given(VALUES)
def test_values_round_trip(value: Any) -> None:
    data = dumps(value)
    if isinstance(value, np.ndarray):
        assert data == _reference_tensor_bytes(value)
    modes = ["bytes"] if isinstance(value, bytes) else ["str", "bytes"]
    for mode in modes:
        back = loads(data, strings=mode)
        assert_same(back, _expected(value, mode))
        assert dumps(back) == data


@settings(max_examples=200, deadline=None)
@given(st.lists(VALUES, max_size=6))
def test_records_round_trip(values: list[Any]) -> None:
    record = dumps_record(values)
    assert [bytes(s) for s in iter_record_slices(record)] == [dumps(v) for v in values]
    back = loads_record(record, strings="bytes")
    assert len(back) == len(values)
    for got, value in zip(back, values):
        assert_same(got, _expected(value, "bytes"))


@settings(max_examples=600, deadline=None)
@given(st.binary(max_size=40), st.sampled_from([b"", b"\x01", b"\x01\x06", b"\x02", b"\x05"]))
def test_arbitrary_bytes_only_raise_format_error(tail: bytes, head: bytes) -> None:
    _accepts_only_canonical(head + tail)
    try:
        values = loads_record(b"EVJ1" + tail)
    except FormatError:
        return
    assert dumps_record(values) == b"EVJ1" + tail
