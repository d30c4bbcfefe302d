#!/usr/bin/python3
"""bench-chart.py: draw a benchmark's JSON as a plain SVG chart.

    scripts/bench-chart.py RESULTS.json -o CHART.svg

Two inputs are understood:

  * evoke-bench's --json: throughput (GB/s) against block size (log2 axis),
    one panel per op (save, load, save+load), one line per data path, for
    the cases of 1 thread and 1 block per request (the size sweep). The
    memcpy, Redis and cudaMemcpy baselines of the same run are dashed lines;
    every case measured its own baseline, so a baseline's point at a size is
    the best (highest) of that op's same-run measurements at that size, the
    hardest one to beat.
  * Google Benchmark's JSON (--benchmark_out), as evoke_recovery_bench
    writes it: p50 latency (ms) against candidate blocks, both on log10
    axes, one line per benchmark family; families named "...Baseline" are
    dashed.

The SVG is plain (no script, no external font or link). Every data point is
a <circle class="point"> that carries its numbers machine-readably
(data-panel, data-series, data-x, data-y; data-y is the JSON's number
written back with Python's repr, so it parses to the same float) and a
<title> tooltip, so that a test can check the chart against the JSON
without a browser. Python 3 standard library only.
"""

import argparse
import json
import math
import sys
from xml.sax.saxutils import escape, quoteattr

# Layout, in pixels.
PANEL_W, PANEL_H = 360, 280  # One panel's plot area.
MARGIN_L, MARGIN_R, MARGIN_T, MARGIN_B = 70, 40, 80, 60
PANEL_GAP = 70
LEGEND_ROW = 20

# Fixed colours per series, so the same path has the same colour in every
# chart; anything else takes the next of the spare ones.
COLOURS = {
    "inline": "#1f77b4",
    "shm": "#d62728",
    "shm-rpc": "#ff7f0e",
    "cuda": "#2ca02c",
    "memcpy": "#555555",
    "redis": "#9467bd",
    "cudaMemcpy": "#8c564b",
    "BM_RecoverSearch": "#d62728",
    "BM_RecoverSearchOneThread": "#ff7f0e",
    "BM_RecoverScalarBaseline": "#555555",
}
SPARE = ["#17becf", "#bcbd22", "#e377c2", "#7f7f7f", "#1f77b4", "#d62728"]
PATH_ORDER = ["inline", "shm", "shm-rpc", "cuda"]
OP_ORDER = ["save", "load", "save+load"]


class ChartError(Exception):
    """Bad input: the message names the field."""


def fmt_bytes(n):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def fmt_count(n):
    for unit, div in (("M", 1_000_000), ("k", 1000)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return f"{n:g}"


def fmt_num(v):
    if v == 0:
        return "0"
    if abs(v) >= 100:
        return f"{v:.0f}"
    if abs(v) >= 1:
        return f"{v:.3g}"
    return f"{v:.2g}"


class Axis:
    """Maps values to pixels on a linear, log2 or log10 scale."""

    def __init__(self, lo, hi, scale, pixel_lo, pixel_hi):
        if scale != "linear" and lo <= 0:
            raise ChartError(f"a value of {lo} cannot go on a log axis")
        self.scale = scale
        self.lo, self.hi = self._t(lo), self._t(hi)
        if self.hi == self.lo:
            self.lo, self.hi = self.lo - 1, self.hi + 1
        self.pixel_lo, self.pixel_hi = pixel_lo, pixel_hi

    def _t(self, v):
        if self.scale == "log2":
            return math.log2(v)
        if self.scale == "log10":
            return math.log10(v)
        return v

    def __call__(self, v):
        f = (self._t(v) - self.lo) / (self.hi - self.lo)
        return round(self.pixel_lo + f * (self.pixel_hi - self.pixel_lo), 2)


def log_range(values, base):
    lo = base ** math.floor(math.log(min(values), base) + 1e-9)
    hi = base ** math.ceil(math.log(max(values), base) - 1e-9)
    if hi <= lo:
        hi = lo * base
    return lo, hi


def log10_ticks(lo, hi):
    """Ticks at 1, 2 and 5 times each power of ten of [lo, hi] (only the
    powers of ten when the range spans more than three decades)."""
    steps = (1, 2, 5) if math.log10(hi / lo) <= 3 else (1,)
    ticks = []
    e = math.floor(math.log10(lo) + 1e-9)
    while 10 ** e <= hi * (1 + 1e-9):
        for m in steps:
            v = m * 10.0 ** e
            if lo * (1 - 1e-9) <= v <= hi * (1 + 1e-9):
                ticks.append((v, fmt_num(v)))
        e += 1
    return ticks


class Svg:
    """A minimal SVG writer."""

    def __init__(self, width, height):
        self.width, self.height = width, height
        self.parts = []

    def add(self, s):
        self.parts.append(s)

    def text(self, x, y, s, anchor="start", size=12, weight="normal", rotate=None, cls=None):
        extra = f' transform="rotate({rotate} {x} {y})"' if rotate is not None else ""
        c = f' class="{cls}"' if cls else ""
        self.add(f'<text x="{x}" y="{y}" font-size="{size}" font-weight="{weight}" '
                 f'text-anchor="{anchor}"{extra}{c}>{escape(s)}</text>')

    def line(self, x1, y1, x2, y2, stroke="#000", width=1, dash=None):
        d = f' stroke-dasharray="{dash}"' if dash else ""
        self.add(f'<line x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" stroke="{stroke}" '
                 f'stroke-width="{width}"{d}/>')

    def render(self):
        head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.width}" '
                f'height="{self.height}" viewBox="0 0 {self.width} {self.height}" '
                f'font-family="sans-serif">')
        body = "\n".join(self.parts)
        return (f'<?xml version="1.0" encoding="UTF-8"?>\n{head}\n'
                f'<rect x="0" y="0" width="{self.width}" height="{self.height}" fill="#fff"/>\n'
                f"{body}\n</svg>\n")


class Series:
    def __init__(self, name, label, baseline, points):
        self.name = name          # data-series
        self.label = label        # Legend text.
        self.baseline = baseline  # Dashed.
        self.points = sorted(points, key=lambda p: p["x"])  # {x, y, tip, extra}


def draw_panel(svg, index, left, top, title, series, x_axis, y_axis, x_ticks, y_ticks,
               x_label, y_label):
    """Draws one panel: frame, grid, ticks, labels, then every series."""
    right, bottom = left + PANEL_W, top + PANEL_H
    svg.add(f'<g class="panel" data-panel={quoteattr(title)} data-index="{index}">')
    svg.add(f'<rect class="plot-area" x="{left}" y="{top}" width="{PANEL_W}" '
            f'height="{PANEL_H}" fill="none" stroke="#000"/>')
    for v, label in y_ticks:
        y = y_axis(v)
        svg.line(left, y, right, y, stroke="#e0e0e0")
        svg.line(left - 4, y, left, y)
        svg.text(left - 7, y + 4, label, anchor="end", size=11)
    for v, label in x_ticks:
        x = x_axis(v)
        svg.line(x, top, x, bottom, stroke="#e0e0e0")
        svg.line(x, bottom, x, bottom + 4)
        if label:
            svg.text(x, bottom + 17, label, anchor="middle", size=11)
    svg.text(left + PANEL_W / 2, top - 10, title, anchor="middle", size=13, weight="bold")
    svg.text(left + PANEL_W / 2, bottom + 40, x_label, anchor="middle", size=12)
    svg.text(left - 52, top + PANEL_H / 2, y_label, anchor="middle", size=12, rotate=-90)
    for s in series:
        colour = series_colour(s.name)
        dash = ' stroke-dasharray="6 4"' if s.baseline else ""
        coords = [(x_axis(p["x"]), y_axis(p["y"])) for p in s.points]
        pts = " ".join(f"{x},{y}" for x, y in coords)
        kind = "baseline" if s.baseline else "path"
        svg.add(f'<polyline class="series" data-panel={quoteattr(title)} '
                f'data-series={quoteattr(s.name)} data-kind="{kind}" points="{pts}" '
                f'fill="none" stroke="{colour}" stroke-width="2"{dash}/>')
        fill = "#fff" if s.baseline else colour
        for p, (x, y) in zip(s.points, coords):
            extra = "".join(f" data-{k}={quoteattr(str(v))}" for k, v in p.get("extra", {}).items())
            svg.add(f'<circle class="point" data-panel={quoteattr(title)} '
                    f'data-series={quoteattr(s.name)} data-kind="{kind}" '
                    f'data-x="{p["x"]!r}" data-y="{p["y"]!r}"{extra} cx="{x}" cy="{y}" r="3.5" '
                    f'fill="{fill}" stroke="{colour}" stroke-width="1.5">'
                    f'<title>{escape(p["tip"])}</title></circle>')
    svg.add("</g>")


_spare_of = {}


def series_colour(name):
    if name in COLOURS:
        return COLOURS[name]
    if name not in _spare_of:
        _spare_of[name] = SPARE[len(_spare_of) % len(SPARE)]
    return _spare_of[name]


def draw_legend(svg, top, entries):
    """One row of legend entries (name, label, baseline), wrapped to the width."""
    x, y = MARGIN_L, top
    svg.add('<g class="legend">')
    for name, label, baseline in entries:
        width = 52 + 7 * len(label)
        if x + width > svg.width - MARGIN_R:
            x, y = MARGIN_L, y + LEGEND_ROW
        colour = series_colour(name)
        dash = "6 4" if baseline else None
        svg.line(x, y - 4, x + 28, y - 4, stroke=colour, width=2, dash=dash)
        fill = "#fff" if baseline else colour
        svg.add(f'<circle cx="{x + 14}" cy="{y - 4}" r="3.5" fill="{fill}" stroke="{colour}" '
                f'stroke-width="1.5"/>')
        svg.add(f'<text class="legend-entry" data-series={quoteattr(name)} x="{x + 34}" '
                f'y="{y}" font-size="12">{escape(label)}</text>')
        x += width
    svg.add("</g>")
    return y


def wrap(text, width):
    """`text` in lines that fit `width` pixels of 11 px text (~6.2 px a
    character), broken between words."""
    limit = max(20, int((width - MARGIN_L - MARGIN_R) / 6.2))
    lines, line = [], ""
    for word in text.split(" "):
        if line and len(line) + 1 + len(word) > limit:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return lines + ([line] if line else [])


def header(svg, title, lines):
    """The title and the subtitle's lines; returns the top of the panels."""
    svg.text(MARGIN_L, 24, title, size=15, weight="bold")
    for i, line in enumerate(lines):
        svg.text(MARGIN_L, 44 + 14 * i, line, size=11, cls="subtitle")
    return MARGIN_T + 14 * max(0, len(lines) - 1)


def layout(n_panels, legend_rows, n_lines=1):
    width = MARGIN_L + n_panels * PANEL_W + (n_panels - 1) * PANEL_GAP + MARGIN_R
    height = (MARGIN_T + 14 * max(0, n_lines - 1) + PANEL_H + MARGIN_B + 10
              + legend_rows * LEGEND_ROW)
    return width, height


# ------------------------------------------------------------ evoke-bench

def require(obj, key, where, kinds):
    if key not in obj:
        raise ChartError(f"{where}: field '{key}' is missing")
    v = obj[key]
    # JSON true/false are Python bools, which are ints too: never a number here.
    if isinstance(v, bool) or not isinstance(v, kinds):
        raise ChartError(f"{where}: field '{key}' has the wrong type ({type(v).__name__})")
    return v


def sweep_rows(doc):
    """The cases the size chart draws: 1 thread, 1 block per request."""
    cases = require(doc, "cases", "evoke-bench JSON", list)
    rows = []
    for i, c in enumerate(cases):
        where = f"cases[{i}]"
        if not isinstance(c, dict):
            raise ChartError(f"{where}: not an object")
        if require(c, "threads", where, int) != 1 or require(c, "batch", where, int) != 1:
            continue
        rows.append({
            "op": require(c, "op", where, str),
            "path": require(c, "path", where, str),
            "block_bytes": require(c, "block_bytes", where, int),
            "gbps": float(require(c, "gbps", where, (int, float))),
            "memcpy_gbps": c.get("memcpy_gbps"),
            "redis_gbps": c.get("redis_gbps"),
            "cuda_memcpy_gbps": c.get("cuda_memcpy_gbps"),
            "ratio_memcpy": c.get("ratio_memcpy"),
        })
        # Both axes are logarithmic: every value drawn must be positive.
        for key in ("block_bytes", "gbps", "memcpy_gbps", "redis_gbps", "cuda_memcpy_gbps"):
            v = rows[-1][key]
            if v is None and key not in ("block_bytes", "gbps"):
                continue  # No such baseline in this case.
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
                raise ChartError(f"{where}: field '{key}' must be a positive number (got {v!r})")
    if not rows:
        raise ChartError("evoke-bench JSON: no case in 'cases' has threads 1 and batch 1 "
                         "(the size sweep); nothing to draw")
    return rows


def ordered(values, order):
    return [v for v in order if v in values] + sorted(v for v in values if v not in order)


BASELINES = [("memcpy", "memcpy_gbps", "memcpy (same run)"),
             ("redis", "redis_gbps", "Redis 7 SET/GET (same run)"),
             ("cudaMemcpy", "cuda_memcpy_gbps", "cudaMemcpyAsync (same run)")]


def evoke_series(rows):
    """Per op: the path lines and the baseline lines (best per size)."""
    panels = []
    for op in ordered({r["op"] for r in rows}, OP_ORDER):
        mine = [r for r in rows if r["op"] == op]
        series = []
        for path in ordered({r["path"] for r in mine}, PATH_ORDER):
            points = [{"x": r["block_bytes"], "y": r["gbps"],
                       "tip": f"{op} {path} {fmt_bytes(r['block_bytes'])}: {r['gbps']:.3f} GB/s"
                              + (f" ({r['ratio_memcpy']:.2f}x memcpy)"
                                 if isinstance(r.get("ratio_memcpy"), (int, float)) else "")}
                      for r in mine if r["path"] == path]
            series.append(Series(path, path, False, points))
        for name, field, label in BASELINES:
            best = {}
            for r in mine:
                v = r[field]
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    best[r["block_bytes"]] = max(best.get(r["block_bytes"], v), float(v))
            if best:
                points = [{"x": x, "y": y,
                           "tip": f"{op} {name} {fmt_bytes(x)}: {y:.3f} GB/s "
                                  f"(best same-run measurement)"}
                          for x, y in best.items()]
                series.append(Series(name, label, True, points))
        panels.append((op, series))
    return panels


def evoke_chart(doc, source):
    panels = evoke_series(sweep_rows(doc))
    xs = [p["x"] for _, ss in panels for s in ss for p in s.points]
    ys = [p["y"] for _, ss in panels for s in ss for p in s.points]
    x_lo, x_hi = log_range(xs, 2)
    # Throughputs span decades (Redis and gRPC against memcpy): log10.
    y_lo, y_hi = log_range(ys, 10)
    entries = []
    for _, ss in panels:
        for s in ss:
            if (s.name, s.label, s.baseline) not in entries:
                entries.append((s.name, s.label, s.baseline))
    width, _ = layout(len(panels), 1)
    rows = legend_rows(entries, width)
    command = str(doc.get("command") or "evoke-bench")
    when = doc.get("date") or ""
    lines = wrap(command + (" (--quick)" if doc.get("quick") and "--quick" not in command else "")
                 + (f" ({when})" if when else ""), width)
    width, height = layout(len(panels), rows, len(lines))
    svg = Svg(width, height)
    top = header(svg, "evoke-bench: throughput against block size (1 thread, 1 block per request)",
                 lines)
    # Ticks at every power of two of the range, labelled at most ~7 times.
    exps = list(range(int(math.log2(x_lo)), int(math.log2(x_hi)) + 1))
    step = max(1, math.ceil(len(exps) / 7))
    x_ticks = [(1 << e, fmt_bytes(1 << e) if (e - exps[0]) % step == 0 else "") for e in exps]
    y_ticks = log10_ticks(y_lo, y_hi)
    for i, (op, series) in enumerate(panels):
        left = MARGIN_L + i * (PANEL_W + PANEL_GAP)
        x_axis = Axis(x_lo, x_hi, "log2", left, left + PANEL_W)
        y_axis = Axis(y_lo, y_hi, "log10", top + PANEL_H, top)
        draw_panel(svg, i, left, top, op, series, x_axis, y_axis, x_ticks, y_ticks,
                   "block size (log2)", "throughput (GB/s, log10)")
    draw_legend(svg, top + PANEL_H + MARGIN_B + 10, entries)
    return svg.render()


def legend_rows(entries, width):
    rows, x = 1, MARGIN_L
    for _, label, _ in entries:
        w = 52 + 7 * len(label)
        if x + w > width - MARGIN_R:
            rows, x = rows + 1, MARGIN_L
        x += w
    return rows


# ------------------------------------------------------------ Google Benchmark

FAMILY_LABELS = {
    "BM_RecoverSearch": "Search (calling thread + pool)",
    "BM_RecoverSearchOneThread": "Search, one thread",
    "BM_RecoverScalarBaseline": "scalar f32 scan (baseline, same run)",
}


def gbench_rows(doc):
    benchmarks = require(doc, "benchmarks", "Google Benchmark JSON", list)
    rows = []
    for i, b in enumerate(benchmarks):
        where = f"benchmarks[{i}]"
        if not isinstance(b, dict):
            raise ChartError(f"{where}: not an object")
        if b.get("run_type", "iteration") != "iteration" or b.get("error_occurred"):
            continue
        name = require(b, "name", where, str)
        family = name.split("/")[0]
        if "candidates" in b:
            x = float(require(b, "candidates", where, (int, float)))
        else:
            try:
                x = float(name.split("/")[1])
            except (IndexError, ValueError):
                raise ChartError(f"{where}: field 'candidates' is missing and name '{name}' "
                                 "has no numeric argument") from None
        y = float(require(b, "p50_ms", where, (int, float)))
        if x <= 0 or y <= 0:
            raise ChartError(f"{where}: 'candidates' and 'p50_ms' must be positive for a log "
                             f"axis (got {x}, {y})")
        rows.append({"family": family, "x": x, "y": y, "p99": b.get("p99_ms")})
    if not rows:
        raise ChartError("Google Benchmark JSON: no iteration in 'benchmarks' to draw")
    return rows


def recovery_chart(doc, source):
    rows = gbench_rows(doc)
    families = []
    for r in rows:
        if r["family"] not in families:
            families.append(r["family"])
    series = []
    for f in families:
        points = []
        for r in rows:
            if r["family"] != f:
                continue
            tip = f"{f} {fmt_count(int(r['x']))} candidates: p50 {r['y']:.4g} ms"
            extra = {}
            if isinstance(r["p99"], (int, float)):
                tip += f", p99 {r['p99']:.4g} ms"
                extra["p99"] = repr(float(r["p99"]))
            points.append({"x": r["x"], "y": r["y"], "tip": tip, "extra": extra})
        series.append(Series(f, FAMILY_LABELS.get(f, f), "Baseline" in f, points))
    x_lo, x_hi = log_range([r["x"] for r in rows], 10)
    y_lo, y_hi = log_range([r["y"] for r in rows], 10)
    entries = [(s.name, s.label, s.baseline) for s in series]
    width, _ = layout(1, 1)
    width = max(width, 620)
    rows_n = legend_rows(entries, width)
    context = doc.get("context", {}) if isinstance(doc.get("context"), dict) else {}
    command = str(context.get("command") or context.get("executable") or "evoke_recovery_bench")
    when = context.get("date", "")
    lines = wrap(command + (f" ({when})" if when else ""), width)
    _, height = layout(1, rows_n, len(lines))
    svg = Svg(width, height)
    top = header(svg, "Recovery query: p50 latency against candidate blocks", lines)
    x_ticks = []
    e = round(math.log10(x_lo))
    while 10 ** e <= x_hi * (1 + 1e-9):
        x_ticks.append((10 ** e, fmt_count(10 ** e)))
        e += 1
    y_ticks = log10_ticks(y_lo, y_hi)
    left = MARGIN_L
    x_axis = Axis(x_lo, x_hi, "log10", left, left + PANEL_W)
    y_axis = Axis(y_lo, y_hi, "log10", top + PANEL_H, top)
    draw_panel(svg, 0, left, top, "RecoveryIndex::Search, k = 8", series, x_axis, y_axis,
               x_ticks, y_ticks, "candidate blocks (log10)", "p50 latency (ms, log10)")
    draw_legend(svg, top + PANEL_H + MARGIN_B + 10, entries)
    return svg.render()


def chart(doc, source="input"):
    """The SVG text for a parsed benchmark JSON document."""
    if not isinstance(doc, dict):
        raise ChartError(f"{source}: the JSON is not an object")
    if "cases" in doc:
        return evoke_chart(doc, source)
    if "benchmarks" in doc:
        return recovery_chart(doc, source)
    raise ChartError(f"{source}: neither evoke-bench's JSON (field 'cases') nor Google "
                     "Benchmark's (field 'benchmarks')")


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("json", help="evoke-bench --json or Google Benchmark JSON output")
    parser.add_argument("-o", "--output", help="SVG to write (default: the JSON's name, .svg)")
    args = parser.parse_args(argv)
    out = args.output or (args.json[:-5] if args.json.endswith(".json") else args.json) + ".svg"
    try:
        with open(args.json, encoding="utf-8") as f:
            doc = json.load(f)
        svg = chart(doc, args.json)
    except (OSError, ValueError, ChartError) as e:
        print(f"bench-chart: {args.json}: {e}", file=sys.stderr)
        return 1
    with open(out, "w", encoding="utf-8") as f:
        f.write(svg)
    print(f"bench-chart: wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
