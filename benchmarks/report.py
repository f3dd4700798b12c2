"""Machine facts and the markdown report."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from .adapters import FLOOR, OURS, REFERENCES

PACKAGES = (
    "numpy",
    "evalue_store",
    "zstandard",
    "lmdb",
    "mosaicml-streaming",
    "array-record",
    "datasets",
    "pyarrow",
    "webdataset",
    "safetensors",
    "psutil",
    "torch",
)

# (key, column title, higher is better)
METRICS: tuple[tuple[str, str, bool], ...] = (
    ("write_rec_s", "write rec/s", True),
    ("write_mb_s", "write MB/s", True),
    ("file_mb", "size MB", False),
    ("open_ms", "open ms", False),
    ("get_p50_us", "get p50 µs", False),
    ("get_p99_us", "get p99 µs", False),
    ("batch_us_per_rec", "get_many µs/rec", False),
    ("get_batch_us_per_rec", "get_batch µs/rec", False),
    ("columns_write_rec_s", "columnar write rec/s", True),
    ("scan_rec_s", "scan rec/s", True),
)
RATIO_METRICS = tuple(m for m in METRICS if m[0] != "write_mb_s")


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).resolve().parent,
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip()


def _filesystem(path: Path) -> str | None:
    """The mount type of the filesystem holding ``path`` (Linux), for context."""
    try:
        best = ("", "")
        target = str(path.resolve())
        with open("/proc/mounts") as f:
            for line in f:
                _dev, mount, fstype, *_ = line.split()
                if target.startswith(mount) and len(mount) > len(best[0]):
                    best = (mount, fstype)
        return best[1] or None
    except OSError:
        return None


def machine_facts(work_dir: Path) -> dict[str, Any]:
    try:
        import psutil

        ram_gib: float | None = psutil.virtual_memory().total / 2**30
    except ImportError:
        ram_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "ram_gib": round(ram_gib, 1) if ram_gib else None,
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "packages": {name: _version(name) for name in PACKAGES},
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty_src": bool(_git("status", "--porcelain", "--", "../src")),
        "work_dir_fs": _filesystem(work_dir),
        "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE"),
        "loadavg_start": os.getloadavg(),
        "cache": "warm: files are read right after being written (page cache not dropped)",
    }


def _fmt(value: float) -> str:
    if value >= 1000:
        return f"{value:,.0f}"
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def _ratio(value: float, ref: float, higher_better: bool) -> str:
    if not value or not ref:
        return "–"
    return f"{(ref / value if higher_better else value / ref):.2f}"


def _best(rows: list[dict[str, Any]], key: str, higher_better: bool) -> float | None:
    values = [r[key] for r in rows if r.get(key)]
    if not values:
        return None
    return max(values) if higher_better else min(values)


def workload_markdown(section: dict[str, Any]) -> str:
    rows: list[dict[str, Any]] = section["results"]
    ok = [r for r in rows if r.get("status") == "ok"]
    floor = next((r for r in ok if r["adapter"] == FLOOR), None)
    peers = [r for r in ok if r["adapter"] not in REFERENCES and r["adapter"] not in OURS]
    lines = [f"## {section['workload']}: {section['description']}", ""]
    lines.append(
        f"{section['n']:,} records, {section['payload_mb']:.1f} MB of raw field bytes"
        if section.get("payload_mb")
        else f"{section['n']:,} records"
    )
    lines.append("")

    header = ["format", "zero-copy", *[title for _, title, _ in METRICS], "read peak RSS MB"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in ok:
        cells = [r["adapter"], "yes" if r.get("zero_copy") else "no"]
        cells += [_fmt(r[key]) if r.get(key) is not None else "–" for key, _, _ in METRICS]
        cells.append(_fmt(r["peak_rss_read_mb"]))
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")

    titles = [title for _, title, _ in RATIO_METRICS]
    for label, ref_rows in (("the floor", [floor] if floor else []), ("the best peer", peers)):
        if not ref_rows:
            continue
        lines.append(
            f"Ratio against {label} (per column; 1.00 = as good, 2.00 = twice as slow or big"
            + (
                "; peers: every format but the floor, floor_copy and evalue_store)"
                if peers is ref_rows
                else ")"
            )
        )
        lines.append("")
        lines += ["| format | " + " | ".join(titles) + " |", "|" + "---|" * (len(titles) + 1)]
        if ref_rows is peers:
            cells = ["*(best peer)*"]
            for key, _, higher in RATIO_METRICS:
                best = _best(ref_rows, key, higher)
                cells.append(next((r["adapter"] for r in ref_rows if r.get(key) == best), "–"))
            lines.append("| " + " | ".join(cells) + " |")
        for r in ok:
            cells = [r["adapter"]]
            for key, _, higher in RATIO_METRICS:
                ref = _best(ref_rows, key, higher)
                cells.append(_ratio(r.get(key) or 0.0, ref or 0.0, higher))
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")

    lines += columns_markdown(ok, floor)
    others = [r for r in rows if r.get("status") != "ok"]
    if others:
        lines.append("Not measured:")
        lines.append("")
        for r in others:
            lines.append(f"- {r['adapter']}: {r['status']}: {r.get('reason', '')}")
        lines.append("")
    checks = [r for r in ok if "check" in r]
    if checks:
        lines.append(
            "Check (every record via get, get_many and scan equals what was written): "
            + ", ".join(f"{r['adapter']} {r['check']}" for r in checks)
        )
        lines.append("")
    notes = [r for r in ok if r.get("notes")]
    if notes:
        lines.append("Notes: " + "; ".join(f"{r['adapter']}: {r['notes']}" for r in notes))
        lines.append("")
    return "\n".join(lines)


def columns_markdown(ok: list[dict[str, Any]], floor: dict[str, Any] | None) -> list[str]:
    """The columnar writes with and without fsync, and our ratios to the floor: issue 13's
    figure (our default, which fsyncs, against the floor's np.save, which does not) and the
    two like-for-like ones."""
    rows = [r for r in ok if r.get("columns_write_fsync_rec_s")]
    if not rows or floor is None or not floor.get("columns_write_fsync_rec_s"):
        return []
    lines = [
        "Columnar write rec/s (`write_columns`), by whether the data is fsynced before the "
        "write returns (evalue_store: `Writer(durable=...)`, default True; floor: `np.save` "
        "per column, default without fsync, or each file and the directory fsynced)",
        "",
        "| format | default | fsynced | not fsynced |",
        "|---|---|---|---|",
    ]
    for r in rows:
        default = "fsynced" if r.get("columns_default") == "fsync" else "not fsynced"
        cells = [
            r["adapter"],
            f"{_fmt(r['columns_write_rec_s'])} ({default})",
            _fmt(r["columns_write_fsync_rec_s"]),
            _fmt(r["columns_write_nofsync_rec_s"]),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines += [
        "| ratio to the floor (rec/s; 1.00 = as fast) | "
        + " | ".join(r["adapter"] for r in rows if r["adapter"] in OURS)
        + " |",
        "|" + "---|" * (1 + sum(r["adapter"] in OURS for r in rows)),
    ]
    for label, ours, theirs in (
        ("issue 13's target (≥ 1.0x): default vs floor default (fsync vs none)", "", ""),
        ("like for like, both fsynced", "fsync_", "fsync_"),
        ("like for like, neither fsynced", "nofsync_", "nofsync_"),
    ):
        key, ref = f"columns_write_{ours}rec_s", floor[f"columns_write_{theirs}rec_s"]
        cells = [f"{r[key] / ref:.2f}" for r in rows if r["adapter"] in OURS]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append("")
    return lines


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    versions = ", ".join(f"{k} {v}" for k, v in m["packages"].items() if v)
    lines = [
        f"# Benchmark `{report['name']}` ({report['mode']})",
        "",
        f"{report['created']} · {m['cpu_count']} cores ({m['cpu_model']}), {m['ram_gib']} GiB, "
        f"Python {m['python']}, {m['platform']} · load average at start "
        f"{', '.join(f'{x:.2f}' for x in m['loadavg_start'])}, at end "
        f"{', '.join(f'{x:.2f}' for x in report.get('loadavg_end', ()))} · commit "
        f"{(m['git_commit'] or '?')[:10]}",
        "",
        f"Versions: {versions}. evalue_store measured: "
        f"{report.get('settings', {}).get('library', 'installed package')}.",
        "",
        "Figures are medians over repeated runs, each format in its own process, warm page "
        "cache. Write MB/s counts raw field bytes. get = one random record (random "
        "permutation), touching every field (two tensor elements, the int, the string's "
        "length); get_many = a random batch, per record; scan = sequential, per record. "
        "Read peak RSS includes the interpreter, the format's imports and the pages of "
        "memory-mapped files that were touched (the kernel maps 64 KiB around each touch).",
        "",
    ]
    for section in report["workloads"].values():
        lines.append(workload_markdown(section))
    if "scaling" in report:
        lines.append(scaling_markdown(report["scaling"], report["name"]))
    return "\n".join(lines)


# (series, result key, title, PNG suffix): the scaling curves
CURVES = (
    ("records", "open_ms", "open ms", "open"),
    ("records", "get_p50_us", "random get p50 µs", "get"),
    ("sizes_results", "write_mb_s", "write MB/s", "write"),
)


def _png(name: str, suffix: str) -> str:
    return f"{name}_scaling_{suffix}.png"


def scaling_markdown(scaling: dict[str, Any], name: str) -> str:
    lines = [
        "## Scaling",
        "",
        "Open and random get by record count (records of [int64[4], float32[2], int, str]); "
        "write MB/s by record size (records of one uint8 tensor; "
        f"{', '.join(f'{s:,} B' for s in scaling['sizes'])}). One run per point: open is the "
        "median of repeated opens, get the median over random reads. A record-count point is "
        f"skipped when writing it would take over {scaling['write_limit_s']:.0f} s, "
        "extrapolated from the format's previous point.",
        "",
    ]
    notes: dict[str, str] = {}
    for series, key, title, suffix in CURVES:
        table = scaling[series]
        points = scaling["counts" if series == "records" else "sizes"]
        label = "records" if series == "records" else "record bytes"
        adapters = list(table)
        lines += [f"### {title} by {label}", ""]
        lines.append(f"| {label} | " + " | ".join(adapters) + " |")
        lines.append("|" + "---|" * (len(adapters) + 1))
        for point in points:
            cells = [f"{point:,}"]
            for adapter in adapters:
                r = table[adapter].get(str(point))
                if r is None:
                    cells.append("")
                elif r["status"] == "ok":
                    cells.append(_fmt(r[key]))
                else:
                    cells.append(r["status"])
                    notes[f"{adapter} {r['workload']}"] = f"{r['status']}: {r.get('reason', '')}"
            lines.append("| " + " | ".join(cells) + " |")
        lines += ["", f"![{title}]({_png(name, suffix)})", ""]
    if notes:
        lines += ["Points not measured:", ""]
        lines += [f"- {where}: {why}" for where, why in notes.items()]
        lines.append("")
    return "\n".join(lines)


def plot_scaling(report: dict[str, Any], results_dir: Path) -> None:
    """One PNG per scaling curve, beside the results (skipped without matplotlib)."""
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed (bench extra): no scaling plots")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scaling = report["scaling"]
    colors = plt.get_cmap("tab20").colors  # 20 distinct colours: one per format
    markers = "osD^vP*Xh<>p"
    for series, key, title, suffix in CURVES:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for k, (adapter, row) in enumerate(scaling[series].items()):
            ok = [(int(p), r[key]) for p, r in row.items() if r["status"] == "ok" and key in r]
            if ok:
                ax.plot(
                    *zip(*ok),
                    "-" if adapter in OURS or adapter == FLOOR else "--",
                    marker=markers[k % len(markers)],
                    color=colors[k % len(colors)],
                    label=adapter,
                    linewidth=2.5 if adapter in OURS else 1,
                )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("records" if series == "records" else "record size (bytes)")
        ax.set_ylabel(title)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        fig.savefig(results_dir / _png(report["name"], suffix), dpi=100)
        plt.close(fig)


# Display names for the README table, in its row order.
README_NAMES = {
    "floor": "numpy memmap floor (hand-written)",
    "floor_copy": "floor + one np.copyto of each tensor (one memory pass)",
    "evalue_store": "**evalue_store**",
    "evalue_store_noverify": "**evalue_store** `verify=False`",
    "evalue_store_zstd": "**evalue_store** zstd",
    "lmdb_raw": "LMDB, raw bytes",
    "lmdb_pickle": "LMDB + pickle",
    "array_record": "ArrayRecord",
    "array_record_zstd": "ArrayRecord zstd (group_size:1)",
    "mds": "MosaicML MDS",
    "mds_zstd": "MosaicML MDS zstd",
    "hf_datasets": "HF datasets (Arrow)",
    "safetensors": "safetensors (one file)",
    "webdataset": "webdataset (tar shards + wids)",
    "npz": "one .npz per record",
}


def readme_table(report: dict[str, Any], workload: str) -> str:
    """The README's table for one workload, straight from a results file (``--readme``)."""
    section = report["workloads"][workload]
    rows = {r["adapter"]: r for r in section["results"] if r.get("status") == "ok"}
    payload = section["payload_mb"]
    lines = [
        "| format | write rec/s | size | open ms | get µs | get_many µs/rec | scan rec/s "
        "| zero-copy |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for adapter, label in README_NAMES.items():
        r = rows.get(adapter)
        if r is None:
            continue
        zero_copy = "yes" if r["zero_copy"] else "no"
        if adapter == "evalue_store_zstd":
            zero_copy = "views of frames"
        cells = [
            label,
            _fmt(r["write_rec_s"]),
            f"{r['file_mb'] / payload:.2f}x",
            _fmt(r["open_ms"]),
            _fmt(r["get_p50_us"]),
            _fmt(r["batch_us_per_rec"]),
            _fmt(r["scan_rec_s"]),
            zero_copy,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def readme_ratios(report: dict[str, Any], workload: str) -> str:
    """evalue_store's figures as ratios against the floor and the best peer (``--readme``):
    time and size ratios above 1 are worse, rate ratios (write, scan) below 1 are worse."""
    section = report["workloads"][workload]
    ok = [r for r in section["results"] if r.get("status") == "ok"]
    floor = next((r for r in ok if r["adapter"] == FLOOR), None)
    peers = [r for r in ok if r["adapter"] not in REFERENCES and r["adapter"] not in OURS]
    # size is left out: the main table gives it against the raw bytes, and the smallest
    # peer file is a compressed one, which says little about a plain container
    metrics = [m for m in RATIO_METRICS if m[0] not in ("get_p99_us", "file_mb")]
    lines = [
        "| evalue_store vs | " + " | ".join(title for _, title, _ in metrics) + " |",
        "|" + "---|" * (len(metrics) + 1),
    ]
    best_names = []
    for key, _, higher in metrics:
        best = _best(peers, key, higher)
        best_names.append(next((r["adapter"] for r in peers if r.get(key) == best), "–"))
    for r in ok:
        if r["adapter"] not in OURS:
            continue
        for label, refs in (("floor", [floor] if floor else []), ("best peer", peers)):
            cells = []
            for key, _, higher in metrics:
                value, ref = r.get(key) or 0.0, _best(refs, key, higher) or 0.0
                ratio = (value / ref) if value and ref else 0.0
                cells.append(f"{ratio:.2f}x" if ratio else "–")
            name = README_NAMES[r["adapter"]]
            lines.append(f"| {name} / {label} | " + " | ".join(cells) + " |")
    lines.append("| *best peer* | " + " | ".join(best_names) + " |")
    return "\n".join(lines)
