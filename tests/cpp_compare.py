"""Comparing the C++ reader with the Python reader: evs_dump's canonical documents
(cpp/tools/evs_dump.cc) and the same form made from what ``evalue_store`` returns."""

from __future__ import annotations

import importlib.util
import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np

import evalue_store as evs
from evalue_store.zstd import is_compressed
from tests import native

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
CORPUS = ROOT / "tests" / "fuzz_corpus"
MAX_RECORDS = 10_000  # what tools/fuzz.py reads of a file, and evs_dump's default


def tool(name: str):
    spec = importlib.util.spec_from_file_location(f"evs_cpp_{name}", ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


# ------------------------------------------------------------------------------ canonical form


def canon(value):
    """The evs_dump form of a value the Python reader returned (see cpp/tools/evs_dump.cc)."""
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, float):
        return {"f64": struct.pack("<d", value).hex()}
    if isinstance(value, str):
        return {"str": value.encode("utf-8").hex()}
    if isinstance(value, bytes):
        return {"bytes": value.hex()}
    if isinstance(value, list):
        return [canon(v) for v in value]
    assert isinstance(value, np.ndarray)
    return {
        "dtype": "bfloat16" if value.dtype == evs.BFLOAT16 else value.dtype.name,
        "shape": list(value.shape),
        "strides": [s // value.itemsize for s in value.strides] if value.size else None,
        "hex": np.ascontiguousarray(value).tobytes().hex(),
    }


def _cpp_value(value):
    """A C++ value with what Python cannot tell (the dim order; strides of empty tensors)
    left out."""
    if isinstance(value, dict) and "dtype" in value:
        numel = int(np.prod(value["shape"], dtype=object))
        return {
            "dtype": value["dtype"],
            "shape": value["shape"],
            "strides": value["strides"] if numel else None,
            "hex": value["hex"],
        }
    if isinstance(value, list):
        return [_cpp_value(v) for v in value]
    return value


def python_dump(path: Path, verify: bool = True) -> dict:
    """What the Python reader makes of a file, in the comparable form of ``cpp_form``."""
    try:
        ds = evs.open(path, verify=verify)
    except evs.FormatError:
        return {"open": "error"}
    with ds:
        out: dict = {"open": "ok", "commit": ds.commit.number, "records": len(ds)}
        out["tail"] = ds.uncommitted_bytes
        try:
            out["metadata"] = ds.metadata
        except evs.FormatError:
            out["metadata"] = "error"
        values = []
        for i in range(min(len(ds), MAX_RECORDS)):
            try:
                values.append(canon(ds[i]))
            except evs.FormatError:
                values.append("error")
        out["values"] = values
        count, error = 0, None
        try:
            for _ in ds:
                count += 1
                if count == min(len(ds), MAX_RECORDS):
                    break
        except evs.FormatError:
            error = "error"
        out["scan"] = {"count": count, "error": error}
    return out


def cpp_form(doc: dict) -> dict:
    """An evs_dump document with errors reduced to "error" (messages differ by design)."""
    if doc["open"] != "ok":
        return {"open": "error"}
    out = {k: doc[k] for k in ("open", "commit", "records", "tail")}
    meta = doc["metadata"]
    out["metadata"] = "error" if isinstance(meta, dict) else json.loads(bytes.fromhex(meta))
    out["values"] = ["error" if isinstance(v, dict) else _cpp_value(v) for v in doc["values"]]
    scan = doc["scan"]
    out["scan"] = {"count": scan["count"], "error": None if scan["error"] is None else "error"}
    return out


def cpp_dump(binary: Path, paths: list[Path], verify: bool = True) -> list[dict]:
    """evs_dump's documents for ``paths`` (one process for all of them)."""
    cmd = [str(binary / "evs_dump"), *([] if verify else ["--no-verify"]), *map(str, paths)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=native.sanitizer_env())
    assert done.returncode in (0, 1), done.stderr[-3000:]
    docs = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(docs) == len(paths)
    return docs


def assert_same(binary: Path, paths: list[Path], verify: bool = True) -> list[dict]:
    """C++ and Python agree on every file of ``paths``; returns the C++ documents."""
    docs = cpp_dump(binary, paths, verify)
    for path, doc in zip(paths, docs):
        data = path.read_bytes()
        if is_compressed(data[:8]):
            assert doc["open"] != "ok" and doc["code"] == 2, path  # kCompressed, said clearly
            assert "zstd" in doc["open"]["error"]
            continue
        assert cpp_form(doc) == python_dump(path, verify), path
    return docs


def variants(tmp_path: Path, name: str, blobs: list[bytes]) -> list[Path]:
    paths = []
    for k, blob in enumerate(blobs):
        path = tmp_path / f"{name}-{k}.evs"
        path.write_bytes(blob)
        paths.append(path)
    return paths
