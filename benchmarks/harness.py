"""Command line: runs every (workload, adapter) pair in its own subprocess and writes
``<results-dir>/<name>.json`` and ``<name>.md``. See README.md in this folder."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .adapters import ADAPTERS, FLOOR, OURS
from .workloads import (
    QUICK_SCALING_COUNTS,
    QUICK_SCALING_SIZES,
    SCALING_COUNTS,
    SCALING_SIZES,
    WORKLOADS,
    Data,
    Workload,
    get_workload,
)

HERE = Path(__file__).resolve().parent
RUN = HERE / "run.py"
WORK = HERE / "work"
SCALING = "scaling"  # the pseudo-workload name that selects the scaling curves
# A scaling point is skipped when writing it would take longer than this (extrapolated from
# the format's previous point), so that slow formats do not hold the run for hours.
SCALING_WRITE_LIMIT_S = 150.0
QUICK_SCALING_WRITE_LIMIT_S = 20.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true", help="small sizes, few repeats (smoke test)")
    p.add_argument(
        "--check",
        action="store_true",
        help="also verify that every record read back equals what was written",
    )
    p.add_argument(
        "--workloads",
        help="comma-separated; 'scaling' = the open/get curves by record count and the write "
        "curve by record size (default: W1,W2,W3,scaling; with --quick: W1,W2,W3, so that "
        "it stays under two minutes)",
    )
    p.add_argument(
        "--adapters",
        default=",".join(ADAPTERS),
        help="comma-separated (default: all, in report order)",
    )
    p.add_argument("--name", help="results file name (default: 'quick' or 'full')")
    p.add_argument(
        "--results-dir",
        type=Path,
        help="default: benchmarks/results, or benchmarks/work/results with --quick",
    )
    p.add_argument(
        "--rounds",
        type=int,
        help="runs of every adapter, interleaved; figures are medians over rounds "
        "(default: 3, quick: 1)",
    )
    p.add_argument("--repeats", type=int, help="timed repetitions per phase within a run")
    p.add_argument(
        "--library",
        choices=("head", "worktree"),
        help="evalue_store to measure: 'head' = src/ as committed at HEAD, exported once so "
        "that commits landing during a long run do not change it (default for full runs); "
        "'worktree' = the installed (editable) package as it is (default with --quick)",
    )
    p.add_argument("--budget", type=float, help="seconds after which a phase stops repeating")
    p.add_argument("--timeout", type=float, help="seconds allowed per subprocess")
    p.add_argument(
        "--render",
        type=Path,
        metavar="JSON",
        help="only rewrite the markdown report of an existing results file",
    )
    p.add_argument(
        "--readme",
        type=Path,
        metavar="JSON",
        help="only print the README's table for each workload of an existing results file",
    )
    p.add_argument("--worker", help=argparse.SUPPRESS)  # adapter name, in the subprocess
    p.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--phases", default="all", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def settings_for(args: argparse.Namespace) -> Any:
    from .measure import FULL, QUICK, Settings

    base = QUICK if args.quick else FULL
    return Settings(
        repeats=args.repeats or base.repeats,
        budget_s=args.budget if args.budget is not None else base.budget_s,
        max_reads=base.max_reads,
    )


def worker_main(args: argparse.Namespace) -> int:
    from .measure import measure

    workload = get_workload(args.workloads, args.quick)
    WORK.mkdir(parents=True, exist_ok=True)
    result = measure(args.worker, workload, settings_for(args), WORK, args.check, args.phases)
    args.out.write_text(json.dumps(result, indent=1))
    return 0


def export_head_library() -> tuple[Path, str]:
    """Export src/ as committed at HEAD into benchmarks/work, with its compiled extension
    built there (from the committed setup.py and cpp/); returns (path, commit)."""
    repo = HERE.parent
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True
    ).stdout.strip()
    target = WORK / f"library-{commit[:12]}"
    if not (target / "done").exists():
        target.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(
            ["git", "archive", "--format=tar", commit, "src", "cpp", "setup.py", "pyproject.toml"]
            + ["README.md", "MANIFEST.in"],
            cwd=repo,
            capture_output=True,
            check=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
        build = [sys.executable, "setup.py", "-q", "build_ext", "--inplace"]
        subprocess.run(build, cwd=target, capture_output=True, check=True)
        (target / "done").write_text(commit)
    return target / "src", commit


def run_one(
    args: argparse.Namespace,
    adapter: str,
    workload: str,
    check: bool,
    library: Path | None = None,
    phases: str = "all",
) -> dict[str, Any]:
    out = WORK / f"result-{os.getpid()}-{adapter}-{workload}.json"
    cmd = [
        sys.executable,
        str(RUN),
        "--worker",
        adapter,
        "--workloads",
        workload,
        "--out",
        str(out),
        "--phases",
        phases,
    ]
    cmd += ["--quick"] if args.quick else []
    cmd += ["--check"] if check else []
    for option in ("repeats", "budget"):
        if getattr(args, option) is not None:
            cmd += [f"--{option}", str(getattr(args, option))]
    timeout = args.timeout or (120 if args.quick else 1800)
    base = {"adapter": adapter, "workload": workload}
    t0 = time.perf_counter()
    try:
        env = dict(os.environ)
        if library is not None:  # put the exported evalue_store ahead of the installed one
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (str(library), env.get("PYTHONPATH", "")) if p
            )
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {**base, "status": "error", "reason": f"timed out after {timeout:.0f} s"}
    wall = time.perf_counter() - t0
    if proc.returncode != 0 or not out.exists():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return {
            **base,
            "status": "error",
            "reason": f"exit code {proc.returncode}: " + " / ".join(tail),
        }
    result = json.loads(out.read_text())
    out.unlink()
    result["wall_s"] = wall
    return result


def combine(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One result from an adapter's runs: the median of every figure over the runs that
    worked (all runs are kept under "runs"); the first failure if none worked."""
    ok = [r for r in runs if r["status"] == "ok"]
    if not ok:
        return {**runs[0], "runs": runs if len(runs) > 1 else []}
    out = dict(ok[0])
    for key, value in ok[0].items():
        if isinstance(value, float):
            out[key] = statistics.median(r[key] for r in ok)
    out["runs"] = runs if len(runs) > 1 else []
    failed = [f"{r['status']}: {r.get('reason', '')}" for r in runs if r["status"] != "ok"]
    if failed:
        out["failed_runs"] = failed
    return out


def _summary(r: dict[str, Any]) -> str:
    if r["status"] != "ok":
        return f"{r['status']}: {r.get('reason', '')}"
    text = (
        f"write {r['write_rec_s']:,.0f} rec/s, get p50 {r['get_p50_us']:.1f} µs, "
        f"get_many {r['batch_us_per_rec']:.1f} µs/rec, scan {r['scan_rec_s']:,.0f} rec/s "
        f"({r['wall_s']:.1f} s)"
    )
    if "get_batch_us_per_rec" in r:
        text += f", get_batch {r['get_batch_us_per_rec']:.2f} µs/rec"
    if "columns_write_rec_s" in r:
        text += f", columnar write {r['columns_write_rec_s']:,.0f} rec/s"
    if "check" in r:
        text += f", check {r['check']}"
    return text


def _approx_bytes(workload: Workload) -> int:
    """Raw bytes of a workload, counting 10 per string: enough to extrapolate write times."""
    per_record = sum(10 if f.kind == "str" else f.nbytes for f in workload.fields)
    return workload.n * per_record


def _skip_reason(previous: dict[str, Any] | None, workload: Workload, limit_s: float) -> str:
    """Why a scaling point is not run ('' if it is), judging from the format's previous one."""
    if previous is None:
        return ""
    if previous["status"] != "ok":
        return f"failed at {previous['workload']}"
    expected = previous["write_s"] * _approx_bytes(workload) / previous["approx_bytes"]
    if expected > limit_s:
        return (
            f"writing would take ~{expected:,.0f} s (limit {limit_s:.0f} s; "
            f"{previous['workload']} took {previous['write_s']:.1f} s)"
        )
    return ""


def run_scaling(
    args: argparse.Namespace, adapters: list[str], library: Path | None
) -> dict[str, Any]:
    """Every adapter at every scaling point, smallest first, one run each."""
    counts = QUICK_SCALING_COUNTS if args.quick else SCALING_COUNTS
    sizes = QUICK_SCALING_SIZES if args.quick else SCALING_SIZES
    limit_s = QUICK_SCALING_WRITE_LIMIT_S if args.quick else SCALING_WRITE_LIMIT_S
    out: dict[str, Any] = {
        "counts": list(counts),
        "sizes": list(sizes),
        "write_limit_s": limit_s,
        "records": {},
        "sizes_results": {},
    }
    for key, points, prefix, phases in (
        ("records", counts, "S", "open_get"),
        ("sizes_results", sizes, "B", "write"),
    ):
        for adapter in adapters:
            row: dict[str, Any] = {}
            out[key][adapter] = row
            previous: dict[str, Any] | None = None
            for point in points:
                wname = f"{prefix}{point}"
                workload = get_workload(wname, args.quick)
                # Only the record-count series can grow past any budget: a size point
                # writes a fixed volume (workloads.SIZE_BYTES), and extrapolating one from
                # the previous by bytes overestimates formats whose cost is per record.
                budget = limit_s if key == "records" else float("inf")
                reason = _skip_reason(previous, workload, budget)
                if reason:
                    result = {"adapter": adapter, "workload": wname, "status": "skipped"}
                    result["reason"] = reason
                else:
                    result = run_one(args, adapter, wname, False, library, phases)
                    result["approx_bytes"] = _approx_bytes(workload)
                row[str(point)] = result
                print(f"scaling {wname:10} {adapter:22} {_scaling_summary(result)}", flush=True)
                if result["status"] == "unavailable":
                    break
                if result["status"] != "skipped":
                    previous = result
    return out


def _scaling_summary(r: dict[str, Any]) -> str:
    if r["status"] != "ok":
        return f"{r['status']}: {r.get('reason', '')}"
    text = f"write {r['write_mb_s']:,.1f} MB/s"
    if "open_ms" in r:
        text += f", open {r['open_ms']:.3f} ms, get p50 {r['get_p50_us']:.1f} µs"
    return text + f" ({r['wall_s']:.1f} s)"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker_main(args)
    from .report import machine_facts, markdown, plot_scaling

    if args.readme:
        from .report import readme_ratios, readme_table

        report = json.loads(args.readme.read_text())
        for wname in report["workloads"]:
            print(f"{wname}:\n\n{readme_table(report, wname)}\n")
            print(f"{readme_ratios(report, wname)}\n")
        return 0
    if args.render:
        report = json.loads(args.render.read_text())
        args.render.with_suffix(".md").write_text(markdown(report))
        if "scaling" in report:
            plot_scaling(report, args.render.parent)
        return 0

    default_workloads = [*WORKLOADS] if args.quick else [*WORKLOADS, SCALING]
    workloads = [w for w in (args.workloads or ",".join(default_workloads)).split(",") if w]
    adapters = [a for a in args.adapters.split(",") if a]
    unknown = [w for w in workloads if w not in WORKLOADS and w != SCALING] + [
        a for a in adapters if a not in ADAPTERS
    ]
    if unknown:
        print(f"unknown workload or adapter: {', '.join(unknown)}", file=sys.stderr)
        return 2
    name = args.name or ("quick" if args.quick else "full")
    results_dir = args.results_dir or (WORK / "results" if args.quick else HERE / "results")
    WORK.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "name": name,
        "mode": "quick" if args.quick else "full",
        "created": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "settings": vars(settings_for(args)),
        "machine": machine_facts(WORK),
        "workloads": {},
    }
    rounds = args.rounds or (1 if args.quick else 3)
    report["settings"]["rounds"] = rounds
    library: Path | None = None
    if (args.library or ("worktree" if args.quick else "head")) == "head":
        try:
            library, commit = export_head_library()
        except (OSError, subprocess.CalledProcessError) as exc:
            print(f"cannot export HEAD's src/ ({exc}); measuring the installed package")
        else:
            report["settings"]["library"] = f"src/ at commit {commit}"
    report["settings"].setdefault("library", "installed package (working tree)")
    results_dir.mkdir(parents=True, exist_ok=True)

    def save() -> None:  # after every workload, so that a long run that dies keeps its results
        report["loadavg_end"] = os.getloadavg()
        (results_dir / f"{name}.json").write_text(json.dumps(report, indent=1) + "\n")
        (results_dir / f"{name}.md").write_text(markdown(report))
        if "scaling" in report:
            plot_scaling(report, results_dir)

    failed = False
    for wname in workloads:
        if wname == SCALING:
            report["scaling"] = run_scaling(args, adapters, library)
            failed |= any(
                point["status"] == "error"
                for adapter in (FLOOR, *OURS)
                for series in ("records", "sizes_results")
                for point in report["scaling"][series].get(adapter, {}).values()
            )
            save()
            continue
        workload = get_workload(wname, args.quick)
        runs: dict[str, list[dict[str, Any]]] = {a: [] for a in adapters}
        for k in range(rounds):
            # Rounds interleave the adapters (each round starting one further on), so that a
            # burst of load from elsewhere on the machine lands on one run of several formats
            # rather than on every run of one format.
            for adapter in adapters[k % len(adapters) :] + adapters[: k % len(adapters)]:
                if runs[adapter] and runs[adapter][-1]["status"] == "unavailable":
                    continue  # once is enough
                result = run_one(args, adapter, wname, args.check and k == 0, library)
                runs[adapter].append(result)
                print(f"{wname} round {k + 1}/{rounds} {adapter:22} {_summary(result)}", flush=True)
        results = [combine(runs[a]) for a in adapters]
        failed |= any(
            r["status"] == "error" or r.get("failed_runs") or r.get("check", "ok") != "ok"
            for r in results
        )
        payload = next((r["payload_mb"] for r in results if r.get("payload_mb")), None)
        report["workloads"][wname] = {
            "workload": wname,
            "description": workload.description,
            "n": workload.n,
            "fields": [vars(f) for f in workload.fields],
            "payload_mb": payload or Data(workload).payload_bytes() / 2**20,
            "results": results,
        }
        save()
    if library is not None:
        shutil.rmtree(library.parent, ignore_errors=True)
    save()
    print(f"wrote {results_dir / name}.json and .md")
    if failed:
        print("FAILED: an adapter errored or returned different records", file=sys.stderr)
        return 1
    return 0
