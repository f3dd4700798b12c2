"""The ``stats --html`` page: self-contained, tables and inline SVG histograms, no scripts."""

from __future__ import annotations

import html
import os

from .render import bin_label, num


def svg_histogram(stats: dict, width: int = 480, height: int = 120) -> str:
    """An inline SVG bar chart of every bin; each bar's tooltip gives its range and count."""
    hist = stats["histogram"]
    counts = hist["counts"]
    if not counts:
        return "<p>(no finite values)</p>"
    top = max(counts)
    step = width / len(counts)
    base = height + 16  # 16 px above the bars for the "max" label
    bars = []
    for k, c in enumerate(counts):
        h = height * c / top
        label = bin_label(hist["edges"][k], hist["edges"][k + 1], hist["integer"])
        bars.append(
            f'<rect x="{k * step:.2f}" y="{base - h:.2f}" width="{max(step - 1, 1):.2f}" '
            f'height="{h:.2f}"><title>{html.escape(label)}: {c:,}</title></rect>'
        )
    low, high = html.escape(num(stats["min"])), html.escape(num(stats["max"]))
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{base + 16}" '
        f'viewBox="0 0 {width} {base + 16}" role="img">'
        f'<text x="0" y="11">bar height: count (max {top:,})</text>'
        f'<g class="bars">{"".join(bars)}</g>'
        f'<text x="0" y="{base + 13}">{low}</text>'
        f'<text x="{width}" y="{base + 13}" text-anchor="end">{high}</text></svg>'
    )


def html_numbers(stats: dict | None, what: str) -> str:
    if stats is None:
        return ""
    cells = "".join(
        f"<td>{html.escape(num(stats[k]))}</td>"
        for k in ("count", "min", "mean", "max", "nan", "posinf", "neginf")
    )
    return (
        f"<h3>{html.escape(what)}</h3><table><tr><th>count</th><th>min</th><th>mean</th>"
        f"<th>max</th><th>NaN</th><th>+Inf</th><th>-Inf</th></tr><tr>{cells}</tr></table>"
        f"{svg_histogram(stats)}"
    )


def html_counter(title: str, counts: dict) -> str:
    if not counts:
        return ""
    rows = "".join(
        f"<tr><td>{html.escape(str(k))}</td><td>{v:,}</td></tr>" for k, v in counts.items()
    )
    return f"<table><tr><th>{html.escape(title)}</th><th>count</th></tr>{rows}</table>"


HTML_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; max-width: 60em; }
table { border-collapse: collapse; margin: 0.5em 1em 0.5em 0; display: inline-table;
        vertical-align: top; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.6em; text-align: right; }
th { background: #f3f3f3; }
section { border-top: 1px solid #ddd; margin-top: 1.5em; }
svg { display: block; margin: 0.5em 0; font-size: 11px; }
svg .bars rect { fill: #4a7bb7; }
"""


def stats_html(report: dict) -> str:
    """A self-contained page: the stats tables and inline SVG histograms, no scripts."""
    title = f"evalue-store stats: {os.path.basename(report['file'])}"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{HTML_STYLE}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f"<p>{html.escape(report['file'])}: {report['records']:,} records, "
        f"{report['records_read']:,} read, {report['unreadable_records']:,} unreadable.</p>",
        *(f"<p>problem: {html.escape(problem)}</p>" for problem in report["problems"]),
        "<section><h2>Record bytes</h2>",
        html_numbers(report["record_bytes"], "frame + payload bytes, every record"),
        "</section>",
    ]
    for pos in report["positions"]:
        title = f"Field {pos['field']} (position {pos['position']})" if pos.get("field") else ""
        title = html.escape(title or f"Position {pos['position']}")
        parts.append(f"<section><h2>{title}</h2><div>")
        parts.append(html_counter("kind", pos["kinds"]))
        parts.append(html_counter("dtype", pos["dtypes"]))
        shapes = dict(pos["shapes"])
        if pos["other_shapes"]:
            shapes["other"] = pos["other_shapes"]
        parts.append(html_counter("shape", shapes))
        parts.append("</div>")
        if len(pos["shapes"]) > 1:
            parts.append(html_numbers(pos["elements"], "elements per value"))
        parts.append(html_numbers(pos["values"], "values"))
        parts.append(html_numbers(pos["string_lengths"], "string length"))
        parts.append("</section>")
    parts.append("</body></html>\n")
    return "\n".join(parts)
