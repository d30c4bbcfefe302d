#!/usr/bin/python3
"""Per-layer KV budgets on the shipped weights, in PyTorch with per-layer masks.

llama.cpp keeps one KV cache for all layers (a block leaves every layer at
once), so its upstream API cannot give layers different budgets. This tool
evaluates per-layer plans (uniform, PyramidKV, EvolKV-tuned) on the same
weights (read from the GGUF) in the training framework's forward pass: each
layer's attention is masked to what that layer's cache would hold under a
sliding-window policy with sinks (StreamingLLM per layer: the first --sinks
tokens and the last budget - sinks), so layer i of a token at t sees
positions s <= t with s < sinks or t - s < budget_i - sinks. Answers are
graded by exact match with teacher forcing, which equals greedy decoding for
exact match (an answer passes iff each of its tokens is the argmax given the
true tokens before it).

  models/layer_eval.py --model models/evoke-recall.gguf --taskgen build/eval/evoke-taskgen \\
      --tasks multifact --seeds 0-15 --context 2048 --plan uniform --mean 256

  --plan uniform | pyramid[:BETA] | FILE.json | -   (- : the budgets JSON on
  stdin, or in $EVOKE_BUDGETS_FILE, as evoke-tune --fitness-cmd passes it)

The last line printed is the mean exact match over all probes (evoke-tune's
fitness protocol); --json writes the details.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_model import load_gguf  # noqa: E402
from train import read_shard, role_runs  # noqa: E402


def pyramid_budgets(n_layers, mean, beta=20.0):
    """PyramidKV's linear schedule, as policy/layer_budgets.h PyramidBudgets:
    top mean/beta, bottom 2*mean - mean/beta, summing to n_layers*mean,
    non-increasing with depth."""
    if n_layers == 1 or not beta >= 1:
        return [mean] * n_layers
    top = mean / beta
    bottom = 2 * mean - top
    raw = [bottom + (top - bottom) * i / (n_layers - 1) for i in range(n_layers)]
    out = [int(x) for x in raw]
    short = n_layers * mean - sum(out)
    order = sorted(range(n_layers), key=lambda i: raw[i] - out[i], reverse=True)
    for i in order[:short]:
        out[i] += 1
    for i in range(1, n_layers):  # keep non-increasing after rounding
        if out[i] > out[i - 1]:
            out[i - 1], out[i] = out[i], out[i - 1]
    return out


def read_plan(spec, n_layers, mean):
    if spec == "uniform":
        return [mean] * n_layers, "uniform"
    if spec.startswith("pyramid"):
        beta = float(spec.split(":")[1]) if ":" in spec else 20.0
        return pyramid_budgets(n_layers, mean, beta), f"pyramid(beta={beta:g})"
    if spec == "-":
        path = os.environ.get("EVOKE_BUDGETS_FILE")
        text = open(path).read() if path else sys.stdin.read()
        return [int(b) for b in json.loads(text)["budgets"]], "json"
    return [int(b) for b in json.load(open(spec))["budgets"]], spec


def layer_masks(T, budgets, sinks):
    t = torch.arange(T)[:, None]
    s = torch.arange(T)[None, :]
    causal = s <= t
    return [causal & ((s < sinks) | (t - s < max(1, b - sinks))) for b in budgets]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--taskgen", required=True)
    ap.add_argument("--tasks", default="multifact")
    ap.add_argument("--seeds", default="0-15")
    ap.add_argument("--split", default="eval", choices=["eval", "train"])
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--plan", default="uniform")
    ap.add_argument("--mean", type=int, default=256, help="mean budget (uniform, pyramid)")
    ap.add_argument("--sinks", type=int, default=4)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    cfg, model = load_gguf(args.model)
    budgets, method = read_plan(args.plan, cfg.n_layer, args.mean)
    if len(budgets) != cfg.n_layer:
        sys.exit(f"layer_eval.py: --plan has {len(budgets)} budgets, the model {cfg.n_layer} "
                 "layers")
    first, last = (int(x) for x in (args.seeds.split("-") + [args.seeds])[:2])
    masks = layer_masks(args.context, budgets, args.sinks)
    per_task = {}
    with tempfile.TemporaryDirectory() as tmp:
        for task in args.tasks.split(","):
            shard = os.path.join(tmp, f"{task}.bin")
            subprocess.run([args.taskgen, "--split", args.split, "--tasks", task, "--length",
                            str(args.context), "--first-seed", str(first), "--count",
                            str(last - first + 1), "--out", shard], check=True)
            tokens, roles = read_shard(shard)
            hits = total = 0
            session_rates = []
            for b in range(0, tokens.shape[0], args.batch):
                toks = torch.from_numpy(tokens[b:b + args.batch])
                with torch.no_grad():
                    pred = model(toks, mask=masks).argmax(-1).numpy()
                for i in range(toks.shape[0]):
                    r = roles[b + i]
                    ok = pred[i, :-1] == tokens[b + i, 1:]
                    spans = role_runs(r, 2)
                    passed = sum(bool(ok[s - 1:e - 1].all()) for s, e in spans)
                    hits += passed
                    total += len(spans)
                    session_rates.append(passed / max(1, len(spans)))
            per_task[task] = {"passes": hits, "n": total, "sessions": len(session_rates),
                              "session_mean": float(np.mean(session_rates))}
    passes = sum(v["passes"] for v in per_task.values())
    n = sum(v["n"] for v in per_task.values())
    score = passes / max(1, n)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "plan": method, "budgets": budgets,
                       "mean_budget": sum(budgets) / len(budgets), "context": args.context,
                       "sinks": args.sinks, "seeds": [first, last], "split": args.split,
                       "tasks": per_task, "exact_match": score}, f, indent=1)
    print(f"plan {method} {budgets}: " + ", ".join(
        f"{t} {v['passes']}/{v['n']}" for t, v in per_task.items()), file=sys.stderr)
    print(f"{score:.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
