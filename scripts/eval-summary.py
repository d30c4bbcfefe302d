#!/usr/bin/python3
"""eval-summary.py MAIN.json [--claim-budget B] [--layers DIR]: the derived
figures of RESULTS.md from an evoke-eval JSON (scripts/eval-results.sh writes
it), and with --layers the per-layer plans' table from DIR/layers-*.json and
DIR/evolkv/heldout-*.json (models/layer_eval.py).

Prints, as Markdown:
  1. the claim check at one budget on multi-fact: every recovery-less policy
     at most 43%, every recovering one at least 48%, the best recovering one
     at least 40 points above the best recovery-less one with intervals over
     sessions that do not overlap; each line says held or not;
  2. InfLLM against EVOKE across budgets, per task (the crossover);
  3. where the needed block ranked among Recover's candidates at each
     recovery point (fact_rank): resident (not evicted), top 1, top 4, top 8,
     further, and the median rank of the evicted ones.
"""

import argparse
import glob
import json
import math
import os
import sys

RECOVERING = ("infllm", "evoke")
RECOVERY_LESS = ("recency", "streaming_llm", "h2o", "snapkv")


def pct(x):
    return f"{100 * x:.1f}%"


def interval(c):
    lo, hi = c["wilson_sessions"]
    return f"[{100 * lo:.1f}, {100 * hi:.1f}]"


def wilson(p, n, z=1.96):
    """Wilson 95% bounds of a mean p over n sessions, as evoke-eval reports them."""
    if n == 0:
        return 0.0, 1.0
    d = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / d
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return max(0.0, centre - half), min(1.0, centre + half)


def layers_table(out_dir):
    """Per-layer plans (uniform, PyramidKV, EvolKV) by mean budget and task."""
    runs = []
    for path in sorted(glob.glob(os.path.join(out_dir, "layers-*.json")) +
                       glob.glob(os.path.join(out_dir, "evolkv", "heldout-*.json"))):
        d = json.load(open(path))
        runs.append((d["mean_budget"], d["plan"], d["budgets"], d["tasks"], path))
    if not runs:
        return
    tasks = list(runs[0][3].keys())
    print("\n### Per-layer plans (PyTorch, per-layer masks)\n")
    print("| mean b | plan | layer budgets | " + " | ".join(tasks) + " |")
    print("|---:|---|---|" + "---|" * len(tasks))
    seen = set()
    for mean, plan, budgets, per_task, path in sorted(runs, key=lambda r: (r[0], r[1])):
        if (mean, plan, tuple(budgets)) in seen:
            continue  # evolkv.sh's uniform and PyramidKV rows repeat layers-*-256.
        seen.add((mean, plan, tuple(budgets)))
        cells = []
        for t in tasks:
            c = per_task.get(t)
            if c is None:
                cells.append("-")
                continue
            lo, hi = wilson(c["session_mean"], c["sessions"])
            cells.append(f"{pct(c['session_mean'])} [{100 * lo:.1f}, {100 * hi:.1f}]")
        name = "EvolKV (tuned)" if "evolkv" in path and "tuned" in path else plan
        print(f"| {mean:g} | {name} | {budgets} | " + " | ".join(cells) + " |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("json")
    ap.add_argument("--claim-budget", type=int, default=512)
    ap.add_argument("--layers", help="the directory of layers-*.json and evolkv/")
    args = ap.parse_args()
    d = json.load(open(args.json))
    cells = {(c["task"], c["policy"], c["budget"]): c for c in d["cells"]}
    budgets = sorted({c["budget"] for c in d["cells"] if c["budget"] > 0})
    tasks = []
    for c in d["cells"]:
        if c["task"] not in tasks:
            tasks.append(c["task"])

    b = args.claim_budget
    print(f"### The claim at b={b} on multifact ({d['context']}-token sessions)\n")
    rows = [(p, cells.get(("multifact", p, b))) for p in RECOVERY_LESS + RECOVERING]
    rows = [(p, c) for p, c in rows if c is not None]
    less = [(p, c) for p, c in rows if p in RECOVERY_LESS]
    rec = [(p, c) for p, c in rows if p in RECOVERING]
    if not less or not rec:
        print("(the JSON lacks the cells)")
        return 1
    for p, c in rows:
        print(f"- {p}: {pct(c['session_mean'])} {interval(c)}")
    best_less = max(less, key=lambda pc: pc[1]["session_mean"])
    best_rec = max(rec, key=lambda pc: pc[1]["session_mean"])
    checks = [
        ("every recovery-less policy <= 43%",
         all(c["session_mean"] <= 0.43 for _, c in less)),
        ("every recovering policy >= 48%", all(c["session_mean"] >= 0.48 for _, c in rec)),
        (f"best recovering ({best_rec[0]}) >= best recovery-less ({best_less[0]}) + 40 points",
         best_rec[1]["session_mean"] >= best_less[1]["session_mean"] + 0.40),
        ("their intervals over sessions do not overlap",
         best_rec[1]["wilson_sessions"][0] > best_less[1]["wilson_sessions"][1]),
    ]
    print()
    for what, held in checks:
        print(f"- {what}: **{'holds' if held else 'does not hold'}**")

    print("\n### InfLLM against EVOKE across budgets\n")
    print("| task | " + " | ".join(f"b={x}: InfLLM / EVOKE" for x in budgets) + " |")
    print("|---|" + "---|" * len(budgets))
    for t in tasks:
        parts = []
        for x in budgets:
            i, e = cells.get((t, "infllm", x)), cells.get((t, "evoke", x))
            if i is None or e is None:
                parts.append("-")
                continue
            lead = "EVOKE" if e["session_mean"] > i["session_mean"] else "InfLLM"
            parts.append(f"{pct(i['session_mean'])} / {pct(e['session_mean'])} ({lead})")
        print(f"| {t} | " + " | ".join(parts) + " |")

    print("\n### Rank of the needed block among Recover's candidates\n")
    print("| task | policy | b | probes | resident | top 1 | top 4 | top 8 | further | "
          "median rank (evicted) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for t in tasks:
        for p in RECOVERING:
            for x in budgets:
                c = cells.get((t, p, x))
                if c is None or not c["fact_rank"]:
                    continue
                ranks = []
                resident = 0
                for k, n in c["fact_rank"].items():
                    if k == "resident":
                        resident += n
                    else:
                        ranks += [int(k)] * n
                total = resident + len(ranks)
                ranks.sort()
                top = lambda k: sum(1 for r in ranks if r <= k)  # noqa: E731
                med = ranks[len(ranks) // 2] if ranks else "-"
                print(f"| {t} | {p} | {x} | {total} | {pct(resident / total)} | "
                      f"{pct(top(1) / total)} | {pct(top(4) / total)} | {pct(top(8) / total)} | "
                      f"{pct((len(ranks) - top(8)) / total)} | {med} |")
    if args.layers:
        layers_table(args.layers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
