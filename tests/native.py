"""Builds the C++ reader (cpp/) with the system compiler, once per source state: the
binaries go to a temporary directory named by a hash of the sources, flags and compiler,
so every test (and benchmark) of a session, and later sessions, reuse them."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CPP = ROOT / "cpp"
CXX = os.environ.get("CXX", "g++")
WARNINGS = ["-std=c++17", "-Wall", "-Wextra", "-Werror"]
VARIANTS = {
    "release": ["-O2", "-DNDEBUG"],
    "asan": ["-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all"],
}
# program name -> its source files besides the library's
PROGRAMS = {
    "evs_dump": ["tools/evs_dump.cc"],
    "fuzz_replay": ["fuzz/fuzz_reader.cc"],
    "unit": ["tests/unit.cc"],
    "evs_bench": ["tools/evs_bench.cc"],
}


def sources() -> list[Path]:
    return sorted(p for p in CPP.rglob("*") if p.suffix in (".cc", ".h") and p.is_file())


def _key(extra: list[str], cxx: str = CXX) -> str:
    digest = hashlib.sha256()
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout
    digest.update(version.encode() + repr((WARNINGS, VARIANTS, PROGRAMS, extra)).encode())
    for path in sources():
        digest.update(str(path.relative_to(CPP)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def build(variant: str = "release") -> Path:
    """The directory holding every program of PROGRAMS built as ``variant``."""
    flags = WARNINGS + VARIANTS[variant] + ["-I", str(CPP / "include")]
    return _cached(f"{variant}-{_key(flags)}", lambda work: _compile(work, flags, PROGRAMS, []))


def executorch_root() -> Path | None:
    """The installed ExecuTorch wheel's package directory, if it ships headers and runtime."""
    spec = importlib.util.find_spec("executorch")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(list(spec.submodule_search_locations)[0])
    if not (root / "include" / "executorch" / "extension" / "module" / "module.h").exists():
        return None
    return root if (root / "lib" / "libexecutorch.so").exists() else None


def build_executorch() -> Path:
    """cpp/examples/ (train_xor, train_batches) linked against the wheel's libexecutorch.so
    and its CPU kernels (the flags its lib/cmake/executorch/executorch-config.cmake gives
    consumers)."""
    root = executorch_root()
    assert root is not None, "the executorch wheel (headers and libexecutorch.so) is missing"
    include = root / "include"
    flags = WARNINGS + VARIANTS["release"] + ["-I", str(CPP / "include")]
    flags += ["-isystem", str(include)]
    flags += ["-isystem", str(include / "executorch/runtime/core/portable_type/c10")]
    flags += ["-DC10_USING_CUSTOM_GENERATED_MACROS", "-DET_EVENT_TRACER_ENABLED"]
    lib = root / "lib"
    libs = [f"-L{lib}", "-Wl,--no-as-needed", "-lexecutorch_kernels_optimized", "-lexecutorch"]
    libs += ["-Wl,--as-needed", f"-Wl,-rpath,{lib}"]  # the kernels register themselves
    programs = {
        "train_xor": ["examples/train_xor.cc"],
        "train_batches": ["examples/train_batches.cc"],
    }
    key = _key(flags + libs + [str(lib)])
    return _cached(f"et-{key}", lambda work: _compile(work, flags, programs, libs))


def build_libfuzzer() -> Path:
    """cpp/fuzz/fuzz_reader.cc as a real libFuzzer binary (clang's -fsanitize=fuzzer, with
    AddressSanitizer and UBSan), ``fuzz_reader`` in the returned directory."""
    clang = shutil.which(os.environ.get("FUZZ_CXX", "clang++"))
    assert clang is not None, "clang++ is missing (Debian: apt-get install clang)"
    flags = WARNINGS + ["-O1", "-g", "-fsanitize=fuzzer,address,undefined"]
    flags += ["-fno-sanitize-recover=all", "-DEVS_LIBFUZZER", "-I", str(CPP / "include")]
    programs = {"fuzz_reader": ["fuzz/fuzz_reader.cc"]}
    key = _key(flags, clang)
    return _cached(f"libfuzzer-{key}", lambda work: _compile(work, flags, programs, [], clang))


def _compile(work: Path, flags: list[str], programs: dict, libs: list[str], cxx=CXX) -> None:
    objects = []
    for src in sorted((CPP / "src").glob("*.cc")):
        obj = work / (src.stem + ".o")
        _run([cxx, *flags, "-c", str(src), "-o", str(obj)])
        objects.append(str(obj))
    for name, extra in programs.items():
        srcs = [str(CPP / s) for s in extra]
        _run([cxx, *flags, *srcs, *objects, *libs, "-o", str(work / name)])


def _cached(name: str, make) -> Path:
    out = Path(tempfile.gettempdir()) / f"evalue-store-cpp-{name}"
    if (out / "done").exists():
        return out
    work = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    make(work)
    (work / "done").write_text("")
    try:
        work.rename(out)
    except OSError:  # built meanwhile by another process: keep theirs
        shutil.rmtree(work, ignore_errors=True)
    return out


def _run(cmd: list[str]) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stdout}{done.stderr}")


def sanitizer_env() -> dict[str, str]:
    """Environment for the asan programs: any report fails the run."""
    env = dict(os.environ)
    env["ASAN_OPTIONS"] = "detect_leaks=1:abort_on_error=0:exitcode=99"
    env["UBSAN_OPTIONS"] = "print_stacktrace=1:halt_on_error=1:exitcode=98"
    return env
