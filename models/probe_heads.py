#!/usr/bin/python3
"""Where the model's attention heads look, on held-out sessions.

For each answer's first token (the one that needs the lookup: the position
of "is" in a restated fact, or of ":" after "answer"), the attention mass
every head puts on the first value token of the right fact, and on the
first value tokens of all other facts. For each fact's first value token,
the mass on the three tokens before it ("is", the key's noun, the key's
adjective): the heads that build a fact's key. A model that retrieves has a
head with most of its mass on the right fact; one that only knows where
values are spreads it over all of them. This is how the first recipe's
failure was found (models/README.md, "Training status").

  models/probe_heads.py --taskgen build/eval/evoke-taskgen --ckpt RUN/latest.pt
  PYTHONPATH=build/_deps/llama.cpp/src/gguf-py \\
    models/probe_heads.py --taskgen build/eval/evoke-taskgen --gguf models/evoke-recall.gguf
"""

import argparse
import math
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_model import Config, Llama, apply_rope, load_gguf, rms_norm, rope_tables  # noqa: E402
from train import read_shard  # noqa: E402


def attention_maps(model, tokens):
    """Per layer, the attention probabilities [B, heads, T, T]."""
    cfg = model.cfg
    B, T = tokens.shape
    cos, sin = rope_tables(cfg, torch.arange(T))
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    maps = []
    with torch.no_grad():
        x = model.tok_embeddings(tokens)
        for layer in model.layers:
            h = rms_norm(x, layer.attn_norm, cfg.rms_eps)
            hd = cfg.head_dim
            q = apply_rope(layer.wq(h).view(B, T, cfg.n_head, hd).transpose(1, 2), cos, sin)
            k = apply_rope(layer.wk(h).view(B, T, cfg.n_head_kv, hd).transpose(1, 2), cos, sin)
            k = k.repeat_interleave(cfg.n_head // cfg.n_head_kv, dim=1)
            s = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
            maps.append(torch.softmax(s.masked_fill(~causal, float("-inf")), -1).numpy())
            x = layer(x, cos, sin, 512)
    return maps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--taskgen", required=True)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--ckpt", help="a train.py checkpoint")
    src.add_argument("--gguf", help="an exported model (gguf-py on PYTHONPATH)")
    ap.add_argument("--tasks", default="recall")
    ap.add_argument("--length", type=int, default=128)
    ap.add_argument("--sessions", type=int, default=32)
    ap.add_argument("--split", default="eval")
    args = ap.parse_args()
    torch.set_num_threads(1)

    if args.ckpt:
        ck = torch.load(args.ckpt)
        model = Llama(Config.from_dict(ck["config"]))
        model.load_state_dict(ck["model"])
        model.eval()
    else:
        _, model = load_gguf(args.gguf)
    cfg = model.cfg
    with tempfile.TemporaryDirectory() as tmp:
        vocab_path = os.path.join(tmp, "vocab.txt")
        shard = os.path.join(tmp, "s.bin")
        subprocess.run([args.taskgen, "--vocab", vocab_path], check=True)
        subprocess.run([args.taskgen, "--split", args.split, "--tasks", args.tasks, "--length",
                        str(args.length), "--first-seed", "0", "--count", str(args.sessions),
                        "--out", shard], check=True)
        words = {w: i for i, w in enumerate(open(vocab_path).read().split("\n"))}
        tokens, roles = read_shard(shard)
    maps = attention_maps(model, torch.from_numpy(tokens))

    lookup = np.zeros((cfg.n_layer, cfg.n_head, 2))
    build = np.zeros((cfg.n_layer, cfg.n_head, 3))
    n_lookup = n_facts = 0
    T = tokens.shape[1]
    for b in range(tokens.shape[0]):
        t = tokens[b]
        # "the code for ADJ NOUN is D D D ." (agentic tool results use other
        # templates and are not probed here).
        facts = [(t[i + 2], t[i + 3], i + 5) for i in range(T - 7)
                 if t[i] == words["code"] and t[i + 1] == words["for"] and t[i + 4] == words["is"]]
        for _, _, d in facts:
            for layer in range(cfg.n_layer):
                build[layer] += maps[layer][b, :, d, d - 3:d][:, ::-1]
            n_facts += 1
        for i in range(1, T - 1):
            if roles[b, i + 1] != 2 or roles[b, i] == 2:
                continue
            adj, noun = (t[i - 2], t[i - 1]) if t[i] == words["is"] else (t[i - 4], t[i - 3])
            right = [d for a, n, d in facts if a == adj and n == noun and d < i - 5]
            if not right:
                continue
            others = [d for a, n, d in facts if d < i - 5 and d != right[0]]
            for layer in range(cfg.n_layer):
                p = maps[layer][b, :, i]
                lookup[layer, :, 0] += p[:, right[0]]
                lookup[layer, :, 1] += p[:, others].sum(-1) if others else 0.0
            n_lookup += 1

    print(f"{n_lookup} lookups, {n_facts} facts, {args.sessions} {args.tasks} sessions "
          f"of {args.length} tokens ({args.split} split)")
    print("layer head | lookup: right fact  other facts | fact value: is    noun  adjective")
    for layer in range(cfg.n_layer):
        for h in range(cfg.n_head):
            r, o = lookup[layer, h] / max(n_lookup, 1)
            a, n, j = build[layer, h] / max(n_facts, 1)
            print(f"{layer:5d} {h:4d} | {r:18.3f} {o:12.3f} | {a:15.3f} {n:5.3f} {j:10.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
