#!/usr/bin/python3
"""Checks the benchmark charts without a browser: scripts/bench-chart.py's
SVG parses as SVG, it is plain (no script, nothing external), and its points
are the JSON's, placed where their values say.

    chart_test.py            the fixtures here and bench/results/issue15/*.json
    chart_test.py --e2e      also the --chart flags of the real benchmarks
                             (EVOKE_BENCH and EVOKE_RECOVERY_BENCH: their paths)

The expected points are worked out here from the JSON, independently of the
chart script: for evoke-bench's JSON, one per case of 1 thread and 1 block
per request (the size sweep), and per op and block size the best of the
same-run memcpy, Redis and cudaMemcpy figures; for Google Benchmark's JSON,
one per iteration run, (candidates, p50_ms).
"""

import glob
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import unittest
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SCRIPT = os.path.join(ROOT, "scripts", "bench-chart.py")
RESULTS = os.path.join(ROOT, "bench", "results", "issue15")
NS = "{http://www.w3.org/2000/svg}"
E2E = "--e2e" in sys.argv


def expected_points(doc):
    """{(panel, series, kind, x, y)} the chart must hold, as a sorted list."""
    points = []
    if "cases" in doc:
        best = {}
        for c in doc["cases"]:
            if c["threads"] != 1 or c["batch"] != 1:
                continue
            points.append((c["op"], c["path"], "path", float(c["block_bytes"]), float(c["gbps"])))
            for name, field in (("memcpy", "memcpy_gbps"), ("redis", "redis_gbps"),
                                ("cudaMemcpy", "cuda_memcpy_gbps")):
                if c.get(field) is not None:
                    key = (c["op"], name, float(c["block_bytes"]))
                    best[key] = max(best.get(key, -1.0), float(c[field]))
        points += [(op, name, "baseline", x, y) for (op, name, x), y in best.items()]
    else:
        for b in doc["benchmarks"]:
            if b.get("run_type", "iteration") != "iteration":
                continue
            family = b["name"].split("/")[0]
            points.append(("RecoveryIndex::Search, k = 8", family,
                           "baseline" if "Baseline" in family else "path",
                           float(b["candidates"]), float(b["p50_ms"])))
    return sorted(points)


def sign(v, tolerance=1e-9):
    return 0 if abs(v) <= tolerance else (1 if v > 0 else -1)


def check_chart(doc, svg_text):
    """Raises AssertionError unless `svg_text` is a plain SVG chart of `doc`."""
    try:
        root = ET.fromstring(svg_text)
    except ET.ParseError as e:
        raise AssertionError(f"the SVG does not parse: {e}") from None
    assert root.tag == NS + "svg", f"root element is {root.tag}, not svg"
    width, height = float(root.get("width")), float(root.get("height"))
    assert root.get("viewBox") == f"0 0 {root.get('width')} {root.get('height')}", \
        f"viewBox {root.get('viewBox')!r} does not match the size"
    for el in root.iter():
        tag = el.tag.replace(NS, "")
        assert el.tag.startswith(NS), f"element {el.tag} is outside the SVG namespace"
        assert tag not in ("script", "foreignObject", "image", "style", "a"), \
            f"<{tag}> in a plain chart"
        for attr, value in el.attrib.items():
            assert "href" not in attr and not attr.startswith("on"), f"{tag} has {attr}"
            assert "url(" not in value, f"{tag}'s {attr} refers to {value}"

    circles = [c for c in root.iter(NS + "circle") if c.get("class") == "point"]
    actual = sorted((c.get("data-panel"), c.get("data-series"), c.get("data-kind"),
                     float(c.get("data-x")), float(c.get("data-y"))) for c in circles)
    expected = expected_points(doc)
    assert len(actual) == len(expected), \
        f"{len(actual)} points in the chart, {len(expected)} rows in the JSON"
    for a, e in zip(actual, expected):
        assert a == e, f"chart point {a} != JSON {e}"
    for c in circles:
        title = c.find(NS + "title")
        assert title is not None and title.text, "a point has no <title> tooltip"

    # Every series is one polyline through its points, in x order; baselines
    # are dashed and lines of paths are not; each has a legend entry.
    legend = {t.get("data-series") for t in root.iter(NS + "text")
              if t.get("class") == "legend-entry"}
    series = {}
    for c in circles:
        series.setdefault((c.get("data-panel"), c.get("data-series")), []).append(c)
    lines = [p for p in root.iter(NS + "polyline") if p.get("class") == "series"]
    assert len(lines) == len(series), f"{len(lines)} lines for {len(series)} series"
    for line in lines:
        key = (line.get("data-panel"), line.get("data-series"))
        assert key in series, f"line {key} has no points"
        assert key[1] in legend, f"series {key[1]} is not in the legend"
        mine = sorted(series[key], key=lambda c: float(c.get("data-x")))
        coords = [tuple(float(v) for v in xy.split(",")) for xy in line.get("points").split()]
        assert coords == [(float(c.get("cx")), float(c.get("cy"))) for c in mine], \
            f"line {key} does not go through its points in x order"
        dashed = line.get("stroke-dasharray") is not None
        assert dashed == (line.get("data-kind") == "baseline"), f"line {key}: dash is wrong"
    if "cases" in doc:
        for name in ("memcpy", "redis"):
            if any(c.get(f"{name}_gbps") is not None for c in doc["cases"]
                   if c["threads"] == 1 and c["batch"] == 1):
                assert name in legend, f"baseline {name} is missing"

    # Geometry, per panel: inside the plot area; a bigger x is further right
    # and a bigger y higher up; and both axes are logarithmic, so the pixel is
    # affine in log(value): fitted on two points, it predicts every other.
    for panel in root.iter(NS + "g"):
        if panel.get("class") != "panel":
            continue
        area = next(r for r in panel.iter(NS + "rect") if r.get("class") == "plot-area")
        left, top = float(area.get("x")), float(area.get("y"))
        right, bottom = left + float(area.get("width")), top + float(area.get("height"))
        assert 0 <= left < right <= width and 0 <= top < bottom <= height, "plot area outside"
        pts = [(float(c.get("data-x")), float(c.get("data-y")), float(c.get("cx")),
                float(c.get("cy"))) for c in panel.iter(NS + "circle")
               if c.get("class") == "point"]
        assert pts, f"panel {panel.get('data-panel')} has no points"
        for x, y, cx, cy in pts:
            assert left - 0.01 <= cx <= right + 0.01 and top - 0.01 <= cy <= bottom + 0.01, \
                f"point ({x}, {y}) at ({cx}, {cy}) is outside the plot area"
        for a in pts:
            for b in pts:
                assert sign(a[2] - b[2], 0.01) == sign(math.log(a[0] / b[0])), \
                    f"x {a[0]} at {a[2]} px against x {b[0]} at {b[2]} px"
                assert sign(b[3] - a[3], 0.01) == sign(math.log(a[1] / b[1])), \
                    f"y {a[1]} at {a[3]} px against y {b[1]} at {b[3]} px"
        for i, name in ((0, "x"), (1, "y")):
            lo = min(pts, key=lambda p: p[i])
            hi = max(pts, key=lambda p: p[i])
            if hi[i] == lo[i]:
                continue
            scale = (hi[i + 2] - lo[i + 2]) / math.log(hi[i] / lo[i])
            for p in pts:
                predicted = lo[i + 2] + scale * math.log(p[i] / lo[i])
                assert abs(predicted - p[i + 2]) < 0.05, \
                    f"{name} {p[i]} at {p[i + 2]} px, its axis puts it at {predicted:.2f} px"


def run_script(json_path, svg_path):
    return subprocess.run([sys.executable, SCRIPT, json_path, "-o", svg_path],
                          capture_output=True, text=True, timeout=60)


class ChartTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)

    def chart_of(self, json_path):
        svg = os.path.join(self.tmp.name, os.path.basename(json_path) + ".svg")
        r = run_script(json_path, svg)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(svg, encoding="utf-8") as f:
            return f.read()

    def check_file(self, json_path):
        with open(json_path, encoding="utf-8") as f:
            doc = json.load(f)
        text = self.chart_of(json_path)
        check_chart(doc, text)
        return doc, text

    def test_evoke_bench_fixture(self):
        doc, text = self.check_file(os.path.join(HERE, "evoke_bench_fixture.json"))
        # 15 sweep cases (a 2-thread and a batched case left out) and the
        # baselines per op (save + load): memcpy 3 + 3, Redis 3 + 3, cudaMemcpy
        # 2 + 0 (one point per size: the best).
        self.assertEqual(len(re.findall(r'<circle class="point"', text)), 15 + 6 + 6 + 2)
        self.assertIn('data-series="cudaMemcpy" data-kind="baseline" data-x="1048576" '
                      'data-y="25.0"', text)
        # The best of the same-run memcpy figures at 1 MiB for save: 20.0
        # (cuda's case), not 19.5 or 18.9.
        self.assertIn('data-panel="save" data-series="memcpy" data-kind="baseline" '
                      'data-x="1048576" data-y="20.0"', text)
        self.assertIn(doc["command"], text)

    def test_recovery_fixture(self):
        _, text = self.check_file(os.path.join(HERE, "recovery_bench_fixture.json"))
        self.assertEqual(len(re.findall(r'<circle class="point"', text)), 9)
        self.assertIn('data-p99="199.692"', text)

    def test_committed_results(self):
        """The charts in bench/results/issue15: the committed SVG and one drawn
        again from its JSON both hold the JSON's numbers."""
        found = sorted(glob.glob(os.path.join(RESULTS, "*.json")))
        self.assertGreaterEqual(len(found), 2, f"no results in {RESULTS}")
        for json_path in found:
            with self.subTest(json=os.path.basename(json_path)):
                doc, _ = self.check_file(json_path)
                svg_path = json_path[:-5] + ".svg"
                self.assertTrue(os.path.exists(svg_path), f"{svg_path} is missing")
                with open(svg_path, encoding="utf-8") as f:
                    check_chart(doc, f.read())

    def test_check_fails_on_a_wrong_chart(self):
        """The check is not a rubber stamp: each of these breaks it."""
        path = os.path.join(HERE, "evoke_bench_fixture.json")
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        text = self.chart_of(path)
        # A value that is not the JSON's.
        bad_value = text.replace('data-x="16777216" data-y="9.5"', 'data-x="16777216" data-y="9.6"')
        # A point drawn where its value is not (moved 20 px up).
        m = re.search(r'(data-series="shm" data-kind="path" data-x="1048576" data-y="5.5" '
                      r'cx="[0-9.]+" cy=")([0-9.]+)"', text)
        self.assertIsNotNone(m)
        moved = text.replace(m.group(0), f'{m.group(1)}{float(m.group(2)) - 20}"')
        # A point left out; a script; a baseline drawn solid.
        missing = re.sub(r'<circle class="point"[^>]*data-series="inline"[^>]*>.*?</circle>', "",
                         text, count=1)
        script = text.replace("</svg>", "<script>alert(1)</script></svg>")
        solid = re.sub(r'(data-series="redis" data-kind="baseline" points="[^"]*" fill="none" '
                       r'stroke="[^"]*" stroke-width="2") stroke-dasharray="6 4"', r"\1", text,
                       count=1)
        for name, wrong in (("value", bad_value), ("moved", moved), ("missing", missing),
                            ("script", script), ("solid", solid), ("truncated", text[:-20])):
            with self.subTest(wrong=name):
                self.assertNotEqual(wrong, text)
                with self.assertRaises(AssertionError):
                    check_chart(doc, wrong)
        # And a JSON changed after the chart was drawn.
        doc["cases"][0]["gbps"] += 0.0001
        with self.assertRaises(AssertionError):
            check_chart(doc, text)

    def test_bad_input_names_the_field(self):
        cases = {
            "neither.json": ({"rows": []}, "field 'cases'"),
            "no_gbps.json": ({"cases": [{"op": "save", "path": "shm", "block_bytes": 65536,
                                         "threads": 1, "batch": 1}]}, "cases[0]: field 'gbps'"),
            "bool.json": ({"cases": [{"op": "save", "path": "shm", "block_bytes": True,
                                      "threads": 1, "batch": 1, "gbps": 1.0}]},
                          "cases[0]: field 'block_bytes' has the wrong type"),
            "zero_gbps.json": ({"cases": [{"op": "save", "path": "shm", "block_bytes": 65536,
                                           "threads": 1, "batch": 1, "gbps": 0.0}]},
                               "cases[0]: field 'gbps' must be a positive number"),
            "text_redis.json": ({"cases": [{"op": "save", "path": "shm", "block_bytes": 65536,
                                            "threads": 1, "batch": 1, "gbps": 1.0,
                                            "redis_gbps": "fast"}]},
                                "cases[0]: field 'redis_gbps' must be a positive number"),
            "sweepless.json": ({"cases": [{"op": "save", "path": "shm", "block_bytes": 65536,
                                           "threads": 2, "batch": 1, "gbps": 1.0}]},
                               "threads 1 and batch 1"),
            "zero_p50.json": ({"benchmarks": [{"name": "BM_X/1000", "candidates": 1000,
                                               "p50_ms": 0}]}, "must be positive"),
        }
        for name, (doc, message) in cases.items():
            with self.subTest(name=name):
                path = os.path.join(self.tmp.name, name)
                with open(path, "w", encoding="utf-8") as f:
                    json.dump(doc, f)
                svg = path + ".svg"
                r = run_script(path, svg)
                self.assertEqual(r.returncode, 1)
                self.assertIn(message, r.stderr)
                self.assertFalse(os.path.exists(svg))
        r = run_script(os.path.join(self.tmp.name, "absent.json"), "x.svg")
        self.assertEqual(r.returncode, 1)
        self.assertIn("absent.json", r.stderr)


@unittest.skipUnless(E2E, "run with --e2e")
class BenchChartFlagTest(unittest.TestCase):
    """The benchmarks' --chart flags write the chart of the JSON they wrote."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)

    def run_bench(self, env_name, args):
        binary = os.environ.get(env_name)
        self.assertTrue(binary and os.access(binary, os.X_OK), f"${env_name} is not a program")
        json_path = os.path.join(self.tmp.name, "r.json")
        svg_path = os.path.join(self.tmp.name, "r.svg")
        r = subprocess.run([binary, *args, "--json", json_path, "--chart", svg_path],
                           capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        with open(json_path, encoding="utf-8") as f:
            doc = json.load(f)
        with open(svg_path, encoding="utf-8") as f:
            text = f.read()
        check_chart(doc, text)
        return doc, text

    def test_evoke_bench_chart(self):
        # ("save+load ..." does not contain "save shm ..." or "save inline ...".)
        doc, text = self.run_bench("EVOKE_BENCH", ["--only", "save inline 1M 1 1,save shm 64K 1 1",
                                                   "--case-mib", "4"])
        self.assertEqual([(c["op"], c["path"], c["block_bytes"]) for c in doc["cases"]],
                         [("save", "inline", 1048576), ("save", "shm", 65536)])
        self.assertIn("--case-mib 4", doc["command"])
        self.assertRegex(doc["date"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
        self.assertIn('data-series="memcpy"', text)

    def test_bad_chart_flag_fails_before_the_run(self):
        for env_name, label in (("EVOKE_BENCH", "evoke-bench"),
                                ("EVOKE_RECOVERY_BENCH", "evoke_recovery_bench")):
            with self.subTest(program=label):
                r = subprocess.run([os.environ.get(env_name, "/nonexistent"), "--chart",
                                    "/nonexistent-dir/x.svg"],
                                   capture_output=True, text=True, timeout=60)
                self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
                self.assertIn(f"{label}: --chart: directory /nonexistent-dir does not exist",
                              r.stderr)
                self.assertNotIn("Benchmark", r.stdout)

    def test_recovery_bench_chart(self):
        doc, _ = self.run_bench("EVOKE_RECOVERY_BENCH",
                                ["--benchmark_filter=/1000/", "--benchmark_min_time=0.01"])
        self.assertEqual(len(doc["benchmarks"]), 3)
        self.assertIn("--benchmark_filter=/1000/", doc["context"]["command"])


if __name__ == "__main__":
    unittest.main(argv=[a for a in sys.argv if a != "--e2e"])
