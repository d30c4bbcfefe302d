#!/usr/bin/python3
"""Draws train.py's log.csv as an SVG: the training loss, the loss on answer
tokens (both smoothed over 20 steps) and the held-out exact match, against
training tokens, with the curriculum's stage boundaries marked.

  models/plot_loss.py RUN/log.csv models/loss.svg
"""

import csv
import math
import sys


def main():
    rows = list(csv.DictReader(open(sys.argv[1])))
    out = sys.argv[2]
    if not rows:
        sys.exit("plot_loss.py: empty log")
    tokens = [int(r["tokens"]) for r in rows]
    loss = [float(r["loss"]) for r in rows]
    answer = [float(r["answer_ce"]) for r in rows]
    em = [(int(r["tokens"]), float(r["heldout_em"]), int(r["length"])) for r in rows
          if r["heldout_em"]]

    def smooth(xs, k=20):
        out, acc = [], []
        for x in xs:
            acc = (acc + [x])[-k:]
            out.append(sum(acc) / len(acc))
        return out

    loss_s, answer_s = smooth(loss), smooth(answer)
    W, H, L, T, PW, PH = 760, 360, 60, 40, 620, 260
    xmax = max(tokens)
    ymax = max(max(loss_s), max(answer_s), math.log(10)) * 1.05

    def x(t):
        return L + PW * t / xmax

    def y_loss(v):
        return T + PH - PH * min(v, ymax) / ymax

    def y_em(v):
        return T + PH - PH * v

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
             'font-family="sans-serif" font-size="11">',
             '<rect width="100%" height="100%" fill="white"/>',
             f'<text x="{L}" y="20" font-size="13">Training loss and held-out exact match '
             f'({len(rows)} steps, {xmax / 1e6:.2f}M tokens)</text>',
             f'<rect x="{L}" y="{T}" width="{PW}" height="{PH}" fill="none" stroke="#888"/>']
    last_len = None
    for r in rows:
        if r["length"] != last_len:
            last_len = r["length"]
            xx = x(int(r["tokens"]))
            parts.append(f'<line x1="{xx:.1f}" x2="{xx:.1f}" y1="{T}" y2="{T + PH}" '
                         f'stroke="#ccc" stroke-dasharray="3 3"/>')
            parts.append(f'<text x="{xx + 2:.1f}" y="{T + 12}" fill="#888">L={last_len}</text>')
    for series, color, name in ((loss_s, "#1f77b4", "loss"),
                                (answer_s, "#ff7f0e", "answer-token CE")):
        pts = " ".join(f"{x(t):.1f},{y_loss(v):.1f}" for t, v in zip(tokens, series))
        parts.append(f'<polyline points="{pts}" fill="none" stroke="{color}" '
                     f'data-series="{name}"/>')
    yc = y_loss(math.log(10))
    parts.append(f'<line x1="{L}" x2="{L + PW}" y1="{yc:.1f}" y2="{yc:.1f}" stroke="#ff7f0e" '
                 'stroke-dasharray="2 4"/>')
    parts.append(f'<text x="{L + PW - 120}" y="{yc - 3:.1f}" fill="#ff7f0e">chance (ln 10)</text>')
    if em:
        pts = " ".join(f"{x(t):.1f},{y_em(v):.1f}" for t, v, _ in em)
        parts.append(f'<polyline points="{pts}" fill="none" stroke="#2ca02c" '
                     'data-series="heldout_em"/>')
    for i in range(5):
        v = ymax * i / 4
        parts.append(f'<text x="{L - 4}" y="{y_loss(v) + 4:.1f}" text-anchor="end">{v:.1f}</text>')
        parts.append(f'<text x="{L + PW + 4}" y="{y_em(i / 4) + 4:.1f}" fill="#2ca02c">'
                     f'{25 * i}%</text>')
    for i in range(5):
        t = xmax * i / 4
        parts.append(f'<text x="{x(t):.1f}" y="{T + PH + 15}" text-anchor="middle">'
                     f'{t / 1e6:.1f}M</text>')
    parts.append(f'<text x="{L}" y="{H - 12}">training tokens; blue: loss; orange: cross-entropy '
                 'on answer tokens; green: held-out exact match (right axis)</text>')
    parts.append("</svg>")
    with open(out, "w") as f:
        f.write("\n".join(parts) + "\n")


if __name__ == "__main__":
    main()
