"""The Android hand-off (issue 15 item 3, docs/ANDROID.md): an app's EValue[] becomes EVJ1
bytes (java/org/evaluestore/Evj1.java, compiled and run here with javac), `evalue-store pack`
puts them into a container, and the C++ reader reads that container as it would on device."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from evalue_store import java
from tests import native
from tests.cpp_compare import assert_same, cpp_dump

ROOT = Path(__file__).resolve().parent.parent
N = 12


def expected(i: int) -> list:
    a, b = (i >> 1) & 1, i & 1
    return [
        np.array([[a, b]], np.float32),
        np.array([a ^ b], np.int64),
        f"sample {i} é😀",
        0.25 * i,
        i % 3 == 0,
        -1 - i,
        None,
    ]


@pytest.fixture(scope="module")
def app_records(tmp_path_factory) -> Path:
    """The EVJ1 files the Java helper writes (what an app would upload)."""
    if shutil.which("javac") is None or shutil.which("java") is None:
        pytest.skip("no JDK (javac): .ci/run installs default-jdk-headless")
    work = tmp_path_factory.mktemp("java")
    source = ROOT / "java" / "org" / "evaluestore" / "Evj1.java"
    subprocess.run(["javac", "-d", str(work / "classes"), str(source)], check=True)
    out = work / "records"
    cmd = ["java", "-cp", str(work / "classes"), "org.evaluestore.Evj1", str(out), str(N)]
    subprocess.run(cmd, check=True)
    return out


def same_values(got: list, want: list) -> bool:
    if len(got) != len(want):
        return False
    for g, w in zip(got, want):
        if isinstance(w, np.ndarray):
            if g.shape != w.shape or g.astype(w.dtype).tobytes() != w.tobytes():
                return False
        elif type(g) is not type(w) or g != w:
            return False
    return True


def test_java_helper_writes_what_evs_java_writes_and_reads(app_records):
    files = sorted(app_records.glob("*.bin"))
    assert len(files) == N
    for i, path in enumerate(files):
        data = path.read_bytes()
        assert same_values(java.loads_record(data), expected(i)), i
        want = expected(i)
        want[:2] = [a.astype(a.dtype.newbyteorder(">")) for a in want[:2]]
        assert java.dumps_record(want) == data, i  # byte for byte


def test_packed_app_records_read_the_same_in_cpp(app_records, tmp_path):
    asan = native.build("asan")
    container = tmp_path / "app.evs"
    cli = [sys.executable, "-m", "evalue_store", "pack", str(app_records), "-o", str(container)]
    subprocess.run(cli, check=True, capture_output=True)
    (doc,) = assert_same(asan, [container])  # and the Python reader agrees on every value
    assert doc["records"] == N
    for i, values in enumerate(doc["values"]):
        x, y, note, weight, seen, ident, none = values
        a, b = (i >> 1) & 1, i & 1
        assert x["dtype"] == "float32" and x["shape"] == [1, 2]
        assert bytes.fromhex(x["hex"]) == np.array([a, b], "<f4").tobytes()
        assert y["dtype"] == "int64" and bytes.fromhex(y["hex"]) == np.int64(a ^ b).tobytes()
        assert bytes.fromhex(note["str"]).decode() == f"sample {i} é😀"
        assert ident == -1 - i and seen == (i % 3 == 0) and none is None
        assert weight == {"f64": np.float64(0.25 * i).tobytes().hex()}
    assert cpp_dump(asan, [container])[0]["scan"]["error"] is None


def test_java_helper_refuses_what_it_cannot_write_faithfully(app_records, tmp_path):
    """JAVA.md section 3: a writer MUST refuse, rather than write something read otherwise.
    Evj1 wrote a tensor whose element count overflowed a long (2^90 elements wrapped to 0,
    so 'data != shape' passed) and a lone surrogate as '?' (attacker findings, session 12,
    eleventh run, C07, C08)."""
    source = tmp_path / "Refusals.java"
    source.write_text(
        """
import org.evaluestore.Evj1;
public class Refusals {
  static void expect(Runnable r, String what) {
    try { r.run(); System.out.println("WROTE " + what); }
    catch (IllegalArgumentException e) {
      System.out.println("REFUSED " + what + ": " + e.getMessage());
    }
  }
  public static void main(String[] a) {
    long big = 1L << 30;
    expect(() -> Evj1.tensor(new float[0], new long[] {big, big, big}), "2^90 elements");
    expect(() -> Evj1.tensor(new long[0], new long[] {0, big, big, 8}), "size rule");
    expect(() -> Evj1.string("a\\uD800b"), "lone surrogate");
    expect(() -> Evj1.tensor(new float[0], new long[] {0, big, big}), "empty, in the rule");
    expect(() -> Evj1.string("\\uD83D\\uDE00"), "a surrogate pair");
  }
}
"""
    )
    classes = app_records.parent / "classes"
    subprocess.run(["javac", "-cp", str(classes), "-d", str(tmp_path), str(source)], check=True)
    cp = f"{classes}:{tmp_path}"
    out = subprocess.run(["java", "-cp", cp, "Refusals"], capture_output=True, text=True)
    lines = out.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "REFUSED 2^90 elements",
        "REFUSED size rule",
        "REFUSED lone surrogate",
        "WROTE empty, in the rule",
        "WROTE a surrogate pair",
    ], out.stdout + out.stderr
