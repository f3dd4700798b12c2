"""The worker side: measures one adapter on one workload, inside its own process.

Phases: generate the records, write them (repeated; and as columns, for formats with a
columnar write), drop the records, then open, random get, batched get_many, get_batch (a
batch as stacked columns, for formats with one), sequential scan (each repeated), and
optionally check every record. Peak RSS
is taken per phase from the kernel's high-water mark (VmHWM), which is reset between phases.
"""

from __future__ import annotations

import gc
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .adapters import Adapter, Unavailable, load_adapter
from .workloads import Data, Workload, check_record, touch


@dataclass(frozen=True)
class Settings:
    repeats: int  # timed repetitions of each phase (medians are reported)
    budget_s: float  # a phase stops repeating (and a pass stops early) past this many seconds
    max_reads: int  # random reads per pass at most (a prefix of a random permutation)


FULL = Settings(repeats=2, budget_s=15.0, max_reads=200_000)
QUICK = Settings(repeats=2, budget_s=1.0, max_reads=2_000)

# Which phases run: every phase for W1-W3; the scaling points need fewer.
PHASES = {
    "all": ("write", "write_columns", "open", "get", "get_many", "get_batch", "scan"),
    "open_get": ("write", "open", "get"),  # scaling by record count
    "write": ("write",),  # scaling by record size
}


def _status_kb(key: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def rss_mb() -> float:
    kb = _status_kb("VmRSS")
    if kb is None:
        import psutil

        return psutil.Process().memory_info().rss / 2**20
    return kb / 1024


def peak_rss_mb() -> float:
    kb = _status_kb("VmHWM")
    if kb is None:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return kb / 1024


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def tree_bytes(path: Path) -> tuple[int, int, int]:
    """(apparent bytes, allocated bytes, file count) of a file or directory tree."""
    paths = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    apparent = allocated = 0
    for p in paths:
        st = p.stat()
        apparent += st.st_size
        allocated += st.st_blocks * 512
    return apparent, allocated, len(paths)


def _median(values: list[float]) -> float:
    return float(np.median(values))


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()


def _passes(settings: Settings, run: Callable[[float], dict[str, float]]) -> list[dict[str, float]]:
    """Run a timed pass ``repeats`` times, fewer if the passes together exceed the budget."""
    results: list[dict[str, float]] = []
    start = time.perf_counter()
    for _ in range(settings.repeats):
        results.append(run(settings.budget_s))
        if time.perf_counter() - start > settings.budget_s:
            break
    return results


def _latency_pass(
    fetch: Callable[[Any], Iterable[Any]], keys: list[Any], per_key: int, budget_s: float
) -> dict[str, float]:
    """Time ``fetch(key)`` plus touching what it returns, for each key until the budget."""
    times: list[int] = []
    sink = 0.0
    clock = time.perf_counter_ns
    deadline = clock() + int(budget_s * 1e9)
    for key in keys:
        t0 = clock()
        for record in fetch(key):
            sink += touch(record)
        t1 = clock()
        times.append(t1 - t0)
        if t1 > deadline:
            break
    arr = np.asarray(times, dtype=np.float64) / 1e3 / per_key  # µs per record
    return {
        "p50_us": float(np.percentile(arr, 50)),
        "p99_us": float(np.percentile(arr, 99)),
        "rec_s": 1e6 / float(arr.mean()),
        "count": float(len(times) * per_key),
    }


def _scan_pass(adapter: Adapter, budget_s: float) -> dict[str, float]:
    sink = 0.0
    count = 0
    t0 = time.perf_counter()
    deadline = t0 + budget_s
    for record in adapter.scan():
        sink += touch(record)
        count += 1
        if count % 256 == 0 and time.perf_counter() > deadline:
            break
    elapsed = time.perf_counter() - t0
    return {"rec_s": count / elapsed, "count": float(count)}


def measure(
    name: str,
    workload: Workload,
    settings: Settings,
    work_dir: Path,
    check: bool,
    phases: str = "all",
) -> dict[str, Any]:
    result: dict[str, Any] = {
        "adapter": name,
        "workload": workload.name,
        "n": workload.n,
        "loadavg_1m_start": os.getloadavg()[0],  # the box is shared: a high value flags noise
    }
    try:
        t0 = time.perf_counter()
        adapter = load_adapter(name, workload.fields)
        result["import_s"] = time.perf_counter() - t0
    except Unavailable as exc:
        return {**result, "status": "unavailable", "reason": str(exc)}
    result.update(zero_copy=adapter.zero_copy, notes=adapter.notes, status="ok")
    evs = sys.modules.get("evalue_store")
    if evs is not None:
        result["evalue_store_from"] = str(Path(evs.__file__).parent)
    path = work_dir / f"{name}-{workload.name}-{os.getpid()}"  # other runs may share work_dir
    try:
        _measure(adapter, workload, settings, path, check, PHASES[phases], result)
    except Unavailable as exc:
        return {**result, "status": "unavailable", "reason": str(exc)}
    finally:
        _remove(path)
    return result


def _measure(
    adapter: Adapter,
    workload: Workload,
    settings: Settings,
    path: Path,
    check: bool,
    phases: tuple[str, ...],
    result: dict[str, Any],
) -> None:
    n = workload.n
    result["rss_start_mb"] = rss_mb()
    data = Data(workload)
    payload = data.payload_bytes()
    result["payload_mb"] = payload / 2**20
    result["rss_after_generate_mb"] = rss_mb()
    reset_peak_rss()

    # Write: each repetition into a fresh path; the last one is kept for reading.
    write_times: list[float] = []
    start = time.perf_counter()
    for rep in range(settings.repeats):
        _remove(path)
        gc.collect()
        t0 = time.perf_counter()
        adapter.write(iter(data), path)
        write_times.append(time.perf_counter() - t0)
        if rep + 1 < settings.repeats and time.perf_counter() - start > settings.budget_s:
            break
    write_s = _median(write_times)
    apparent, allocated, files = tree_bytes(path)
    result.update(
        write_s=write_s,
        write_repeats=len(write_times),
        write_rec_s=n / write_s,
        write_mb_s=payload / 2**20 / write_s,
        file_mb=apparent / 2**20,
        disk_mb=allocated / 2**20,
        files=files,
        peak_rss_write_mb=peak_rss_mb(),
    )
    if "write_columns" in phases and adapter.columnar:
        _measure_columns(adapter, data, settings, path, result)
    del data
    gc.collect()
    if "open" not in phases:
        result["loadavg_1m_end"] = os.getloadavg()[0]
        return

    # Read phases, with a fresh peak-RSS window.
    result["rss_before_read_mb"] = rss_mb()
    reset_peak_rss()
    open_times: list[float] = []
    for rep in range(settings.repeats):
        t0 = time.perf_counter()
        adapter.open(path)
        open_times.append(time.perf_counter() - t0)
        if rep + 1 < settings.repeats:
            adapter.close()
    result["open_ms"] = _median(open_times) * 1e3

    rng = np.random.default_rng(workload.seed + 1000)
    order = [int(i) for i in rng.permutation(n)[: settings.max_reads]]
    gets = _passes(
        settings, lambda budget: _latency_pass(lambda i: (adapter.get(i),), order, 1, budget)
    )
    result.update(
        get_p50_us=_median([p["p50_us"] for p in gets]),
        get_p99_us=_median([p["p99_us"] for p in gets]),
        get_rec_s=_median([p["rec_s"] for p in gets]),
        get_reads=int(sum(p["count"] for p in gets)),
        get_passes=len(gets),
    )
    if "get_many" in phases:
        _measure_batches(adapter, workload, settings, order, result)
    if "get_batch" in phases and adapter.batched:
        _measure_get_batch(adapter, workload, settings, order, result)
    if "scan" in phases:
        _measure_scan(adapter, workload, settings, payload, result)
    result.update(peak_rss_read_mb=peak_rss_mb(), loadavg_1m_end=os.getloadavg()[0])
    adapter.close()

    if check:
        result["check"] = check_adapter(adapter, workload, path)


def _measure_batches(
    adapter: Adapter,
    workload: Workload,
    settings: Settings,
    order: list[int],
    result: dict[str, Any],
) -> None:
    size = min(workload.batch_size, workload.n)
    batches = [order[j : j + size] for j in range(0, len(order) - size + 1, size)]
    many = _passes(settings, lambda budget: _latency_pass(adapter.get_many, batches, size, budget))
    result.update(
        batch_size=size,
        batch_us_per_rec=_median([p["p50_us"] for p in many]),
        batch_p99_us_per_rec=_median([p["p99_us"] for p in many]),
        batch_rec_s=_median([p["rec_s"] for p in many]),
        batch_reads=int(sum(p["count"] for p in many)),
    )


def _measure_columns(
    adapter: Adapter, data: Data, settings: Settings, path: Path, result: dict[str, Any]
) -> None:
    """The columnar write: the same records given as columns, into a scratch path (the
    record-by-record write's file is the one read afterwards), with the format's default
    settings and with the other choice of fsync, alternately, in turns of either order (in
    issue13_s10, with the default always first, the floor's fsynced write measured 2.7x
    faster than its unsynced one): ``columns_write_rec_s`` (the default),
    ``columns_write_fsync_rec_s`` and ``columns_write_nofsync_rec_s`` (one of them the
    default's)."""
    scratch = path.with_name(path.name + "-columns")
    default = "fsync" if adapter.columns_fsync else "nofsync"
    pair = (default, "nofsync" if adapter.columns_fsync else "fsync")
    times: dict[str, list[float]] = {"fsync": [], "nofsync": []}
    start = time.perf_counter()
    for turn in range(max(2, settings.repeats)):
        for variant in pair if turn % 2 == 0 else pair[::-1]:
            _remove(scratch)
            os.sync()  # the last copy's writeback and freed blocks do not weigh on this one
            gc.collect()
            t0 = time.perf_counter()
            adapter.write_columns(
                data.columns, scratch, None if variant == default else (variant == "fsync")
            )
            times[variant].append(time.perf_counter() - t0)
        if turn % 2 == 1 and time.perf_counter() - start > settings.budget_s:
            break
    _remove(scratch)
    n = data.workload.n
    for variant, taken in times.items():
        result[f"columns_write_{variant}_rec_s"] = n / _median(taken)
    result["columns_write_rec_s"] = result[f"columns_write_{default}_rec_s"]
    result["columns_default"] = default


def touch_batch(batch: list) -> float:
    """As ``touch``, for a batch: a few elements of each stacked array, each list's length."""
    acc = 0.0
    for column in batch:
        if isinstance(column, np.ndarray):
            flat = column.reshape(-1)
            acc += float(flat[0]) + float(flat[-1]) if flat.size else 0.0
        else:
            acc += len(column)
    return acc


def _measure_get_batch(
    adapter: Adapter,
    workload: Workload,
    settings: Settings,
    order: list[int],
    result: dict[str, Any],
) -> None:
    size = min(workload.batch_size, workload.n)
    batches = [order[j : j + size] for j in range(0, len(order) - size + 1, size)]

    def one_pass(budget_s: float) -> dict[str, float]:
        times: list[float] = []
        deadline = time.perf_counter() + budget_s
        sink = 0.0
        for indices in batches:
            t0 = time.perf_counter()
            sink += touch_batch(adapter.get_batch(indices))
            times.append(time.perf_counter() - t0)
            if time.perf_counter() > deadline:
                break
        return {"p50_us": float(np.percentile(times, 50)) * 1e6 / size}

    passes = _passes(settings, one_pass)
    result["get_batch_us_per_rec"] = _median([p["p50_us"] for p in passes])


def _measure_scan(
    adapter: Adapter, workload: Workload, settings: Settings, payload: int, result: dict[str, Any]
) -> None:
    n = workload.n
    scans = _passes(settings, lambda budget: _scan_pass(adapter, budget))
    scan_rec_s = _median([p["rec_s"] for p in scans])
    result.update(
        scan_rec_s=scan_rec_s,
        scan_mb_s=scan_rec_s * payload / n / 2**20,
        scan_records=int(sum(p["count"] for p in scans)),
        scan_complete=all(int(p["count"]) == n for p in scans),
    )


def check_adapter(adapter: Adapter, workload: Workload, path: Path) -> str:
    """'ok', or the first few differences between what was written and what comes back."""
    data = Data(workload)
    problems: list[str] = []
    adapter.open(path)
    try:
        for i in range(workload.n):
            problem = check_record(data.record(i), adapter.get(i), f"get({i})")
            if problem:
                problems.append(problem)
        order = [int(i) for i in np.random.default_rng(7).permutation(workload.n)]
        size = min(workload.batch_size, workload.n)
        for j in range(0, workload.n, size):
            indices = order[j : j + size]
            got = adapter.get_many(indices)
            if len(got) != len(indices):
                problems.append(f"get_many: {len(got)} records for {len(indices)} indices")
                continue
            for i, record in zip(indices, got):
                problem = check_record(data.record(i), record, f"get_many[{i}]")
                if problem:
                    problems.append(problem)
        for j in range(0, workload.n, size) if adapter.batched else ():
            indices = order[j : j + size]
            batch = adapter.get_batch(indices)
            for row, i in enumerate(indices):
                record = [
                    int(column[row]) if f.kind == "int" else column[row]
                    for f, column in zip(workload.fields, batch)
                ]
                problem = check_record(data.record(i), record, f"get_batch[{i}]")
                if problem:
                    problems.append(problem)
        count = 0
        for i, record in enumerate(adapter.scan()):
            count += 1
            if i >= workload.n:
                continue
            problem = check_record(data.record(i), record, f"scan[{i}]")
            if problem:
                problems.append(problem)
        if count != workload.n:
            problems.append(f"scan: {count} records, expected {workload.n}")
    finally:
        adapter.close()
    if not problems:
        return "ok"
    return f"{len(problems)} problems; first: " + " | ".join(problems[:3])
