#!/usr/bin/python3
"""Where a model's first answer digit goes, on held-out sessions.

The first digit of an answer is the one that needs the lookup (the rest are
copied once the fact is found). For each answer, the model's distribution
over that digit (teacher forcing) is split by the facts in context whose
first digit it is: the right fact, a look-alike sharing the key's adjective
only, one sharing its noun only, or another fact. A model that matches keys
puts its mass on the right fact; one that only knows where values are
spreads it over all of them; one that matches a single key word favours
the look-alikes. This is how the barrier in models/README.md was measured.

  models/answer_diag.py --taskgen build/eval/evoke-taskgen --ckpt RUN/latest.pt
  models/answer_diag.py ... --tasks bind2   # the drills (eval/tasks.h)
"""

import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_model import Config, Llama  # noqa: E402
from train import read_shard, role_runs  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--taskgen", required=True)
    ap.add_argument("--ckpt", required=True, help="a train.py checkpoint")
    ap.add_argument("--tasks", default="recall")
    ap.add_argument("--length", type=int, default=128)
    ap.add_argument("--sessions", type=int, default=160)
    ap.add_argument("--split", default="eval")
    ap.add_argument("--first-seed", type=int, default=0)
    args = ap.parse_args()

    torch.set_num_threads(1)
    ck = torch.load(args.ckpt)
    model = Llama(Config.from_dict(ck["config"]))
    model.load_state_dict(ck["model"])
    model.eval()
    with tempfile.TemporaryDirectory() as tmp:
        vocab = os.path.join(tmp, "vocab.txt")
        subprocess.run([args.taskgen, "--vocab", vocab], check=True)
        words = open(vocab).read().splitlines()
        shard = os.path.join(tmp, "s.bin")
        subprocess.run([args.taskgen, "--split", args.split, "--tasks", args.tasks, "--length",
                        str(args.length), "--first-seed", str(args.first_seed), "--count",
                        str(args.sessions), "--out", shard], check=True)
        tokens, roles = read_shard(shard)
    digits = {i for i, w in enumerate(words) if w.isdigit()}
    joiners = {words.index(w) for w in ("is", "=")}
    structure = {words.index(w) for w in (":", "is", "(")}

    argmax = {}   # (answer kind, look-alike present, class of the argmax) -> count
    mass = {}     # class -> probabilities on facts' unambiguous first digits
    with torch.no_grad():
        for b0 in range(0, len(tokens), 16):
            batch = torch.from_numpy(tokens[b0:b0 + 16])
            probs = torch.softmax(model(batch)[:, :-1], -1).numpy()
            for bi in range(batch.shape[0]):
                tk, rl, p = tokens[b0 + bi], roles[b0 + bi], probs[bi]
                facts = []  # (first token, adjective, noun, digits)
                for i, j in role_runs(rl, 1):
                    value = tuple(x for x in tk[i:j] if x in digits)
                    # The key: the words before the value, less "is" / "="
                    # (recall facts "code for ADJ NOUN is"; bind drills
                    # "ADJ NOUN" or "NOUN", the adjective then None).
                    words_ = [x for x in tk[i:j] if x not in digits and x not in joiners]
                    if value and words_:
                        adjective = words_[-2] if len(words_) >= 2 else None
                        facts.append((i, adjective, words_[-1], value))
                for i, j in role_runs(rl, 2):
                    answer = tuple(tk[i:j])
                    before = [f for f in facts if f[0] < i]
                    right = [f for f in before if f[3] == answer]
                    if not right:
                        continue
                    adj, noun = right[-1][1], right[-1][2]

                    def cls(f):
                        if f[3] == answer:
                            return "right"
                        if f[1] == adj and f[2] != noun:
                            return "same-adjective"
                        if f[2] == noun and f[1] != adj:
                            return "same-noun"
                        return "other"

                    by_digit = {}
                    for f in before:
                        by_digit.setdefault(f[3][0], set()).add(cls(f))
                    q = p[i - 1]
                    top = int(q.argmax())
                    kind = words[tk[i - 1]]
                    if tk[i - 1] not in structure:
                        kind = "the key"  # Bind drills: the value follows the key.
                    look = any(cls(f).startswith("same") for f in before)
                    c = "/".join(sorted(by_digit[top])) if top in by_digit else "not a fact's digit"
                    key = (kind, "look-alike" if look else "no look-alike", c)
                    argmax[key] = argmax.get(key, 0) + 1
                    for digit, classes in by_digit.items():
                        if len(classes) == 1:
                            mass.setdefault(next(iter(classes)), []).append(float(q[digit]))

    total = sum(argmax.values())
    print(f"{total} answers, {args.sessions} {args.tasks} sessions of {args.length} tokens "
          f"({args.split} split)")
    print("first digit right, by the token before the answer:")
    for kind in sorted({k[0] for k in argmax}):
        for look in ("look-alike", "no look-alike"):
            n = sum(v for k, v in argmax.items() if k[:2] == (kind, look))
            r = sum(v for k, v in argmax.items() if k[:2] == (kind, look) and "right" in k[2])
            if n:
                print(f"  after '{kind}', {look} in context: {r}/{n} ({r / n:.2f})")
    print("mean probability on a fact's first digit (digits no two facts share), by fact:")
    for c, v in sorted(mass.items()):
        print(f"  {c:15s} {np.mean(v):.3f} over {len(v)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
