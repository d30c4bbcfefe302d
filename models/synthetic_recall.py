#!/usr/bin/python3
"""Can the model's architecture learn a lookup at all? A synthetic check.

Sequences of 128 tokens: 8 key-value pairs (keys out of 120 tokens, values
out of 10, 1-3 filler tokens after each pair), then queries that repeat a
key and are graded on its value. --gap 0 is `k v ... Q k -> v` (the value
right after the key); --gap 1 is `k is v ... Q k is -> v` (one token
between, like the tasks' `ADJ NOUN is D`); --gap0-steps N trains on gap 0
first; --value-len 3 gives values of three tokens (as the tasks' D D D);
--unmarked drops the query marker; --interleaved states each pair again
at a random later point, as a query (as the bind drills do). Prints the
answer accuracy every
100 steps: about 0.25-0.3 is a guess among the values in context, near 1 is
a lookup. models/README.md ("The barrier") reports what it showed.

  models/synthetic_recall.py --gap 0 --config '{"n_head": 8, "n_head_kv": 4, "qk_bias": true}'
"""

import argparse
import json
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_model import Config, Llama  # noqa: E402
from train import make_optimizer  # noqa: E402

VOCAB = 200
IS, QUERY = 1, 2
KEYS = (10, 130)
VALUES = (140, 150)
FILLER = (150, 200)


def batch(rng, sequences, length, pairs, gap, value_len=1, interleaved=False, unmarked=False):
    """`pairs` key-value pairs, then queries (`Q k [is] v`) until `length`;
    or, interleaved, each pair stated again unmarked at a random later point
    (as the bind drills of eval/tasks.h do). Values are `value_len` tokens,
    all graded."""
    sep = [IS] * gap
    tokens = np.zeros((sequences, length), np.int64)
    graded = np.zeros((sequences, length), np.float32)
    for b in range(sequences):
        keys = rng.choice(np.arange(*KEYS), size=pairs, replace=False)
        values = rng.integers(*VALUES, size=(pairs, value_len))
        seq, grade = [], []
        if interleaved:
            events = sorted([(rng.random() * 0.7, 0, i) for i in range(pairs)])
            events += [(rng.uniform(t, 1.0), 1, i) for t, _, i in events]
            for _, again, i in sorted(events):
                lead = [QUERY] if again and not unmarked else []
                seq += lead + [keys[i]] + sep + list(values[i])
                grade += [0] * (len(lead) + 1 + gap) + [again] * value_len
                n = int(rng.integers(1, 4))
                seq += list(rng.integers(*FILLER, size=n))
                grade += [0] * n
        else:
            for k, v in zip(keys, values):
                seq += [k] + sep + list(v) + list(rng.integers(*FILLER, size=rng.integers(1, 4)))
            grade = [0] * len(seq)
        while len(seq) < length:
            i = rng.integers(pairs)
            marker = FILLER[0] if unmarked else QUERY
            seq += [marker, keys[i]] + sep + list(values[i])
            grade += [0] * (2 + gap) + [1] * value_len
        tokens[b] = seq[:length]
        graded[b] = grade[:length]
    return torch.from_numpy(tokens), torch.from_numpy(graded)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gap", type=int, choices=(0, 1), default=0)
    ap.add_argument("--gap0-steps", type=int, default=0,
                    help="a curriculum: the first N steps with gap 0, then --gap")
    ap.add_argument("--value-len", type=int, default=1, help="tokens per value (all graded)")
    ap.add_argument("--interleaved", action="store_true",
                    help="each pair asked again at a random later point, as bind drills")
    ap.add_argument("--unmarked", action="store_true",
                    help="queries start with a filler token instead of the query marker")
    ap.add_argument("--config", default="{}", help="JSON overrides of llama_model.Config")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    model = Llama(Config(n_vocab=VOCAB, n_ctx_train=128, **json.loads(args.config)))
    opt = make_optimizer(model, args.lr, 0.05)
    started = time.time()
    for step in range(1, args.steps + 1):
        x, w = batch(rng, args.batch, 128, 8, 0 if step <= args.gap0_steps else args.gap,
                     args.value_len, args.interleaved, args.unmarked)
        for g in opt.param_groups:
            g["lr"] = args.lr * min(1.0, step / 200)
        logits = model(x)
        ce = F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), x[:, 1:].reshape(-1),
                             reduction="none").view(x.shape[0], -1)
        graded = w[:, 1:]
        loss = (ce * graded).sum() / graded.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 100 == 0:
            hit = (logits[:, :-1].argmax(-1) == x[:, 1:]).float()
            acc = float((hit * graded).sum() / graded.sum())
            print(f"step {step} loss {float(loss):.3f} accuracy {acc:.3f} "
                  f"{time.time() - started:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
