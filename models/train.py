#!/usr/bin/python3
"""Trains the shipped model (models/README.md) on the CPU, resumably.

Sessions come from evoke-taskgen (eval/tasks.h, the generator evoke-eval
uses), training split, in a curriculum of lengths. The loss is next-token
cross-entropy weighted towards answer tokens: answers carry weight 1, all
other tokens together half the answers' total (they teach the grammar and
the fact template; the answers teach retrieval).

A stage ends after its step budget, or early once the held-out exact match
at that length reaches --advance-at. Checkpoints (model, optimizer, stage,
step, RNG) go to --ckpt-dir every --ckpt-every steps and at the end; a run
started with the same --ckpt-dir resumes from the latest.

  models/train.py --taskgen build/eval/evoke-taskgen --ckpt-dir /var/tmp/evoke-train
  models/train.py --quick ...   # CI: a tiny model for a few minutes; exits 1
                                # unless the loss fell
"""

import argparse
import csv
import json
import math
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_model import Config, Llama  # noqa: E402

# length:batch:max steps[:tasks]: a curriculum from short to long contexts,
# starting with dense recall drills (tasks separated by '+'; default all four).
ALL_TASKS = "niah,multifact,agentic,recall"
DEFAULT_STAGES = ("128:32:6000:recall,256:16:3000,512:8:3000,1024:4:3000,2048:2:3000,"
                  "4096:1:4000")
QUICK_STAGES = "128:16:60"


def parse_stages(text):
    stages = []
    for part in text.split(","):
        fields = part.split(":")
        length, batch, steps = (int(x) for x in fields[:3])
        tasks = fields[3].replace("+", ",") if len(fields) > 3 else ALL_TASKS
        stages.append((length, batch, steps, tasks))
    return stages


def read_shard(path):
    with open(path, "rb") as f:
        head = f.read(16)
        if head[:8] != b"EVTKSHD1":
            raise ValueError(f"{path}: not an evoke-taskgen shard")
        count, length = np.frombuffer(head[8:16], dtype="<u4")
        tokens = np.frombuffer(f.read(int(count) * int(length) * 2), dtype="<u2")
        roles = np.frombuffer(f.read(int(count) * int(length)), dtype="u1")
    return tokens.reshape(count, length).astype(np.int64), roles.reshape(count, length)


def role_runs(roles, role):
    """[first, last) of every maximal run of `role` in one session's roles
    (2: the answers, 1: the facts)."""
    spans, i, n = [], 0, len(roles)
    while i < n:
        if roles[i] == role:
            j = i
            while j < n and roles[j] == role:
                j += 1
            spans.append((i, j))
            i = j
        else:
            i += 1
    return spans


def generate(taskgen, split, length, first_seed, count, tmpdir, tasks=ALL_TASKS):
    path = os.path.join(tmpdir, f"{split}-{length}-{first_seed}-{count}.bin")
    subprocess.run([taskgen, "--split", split, "--tasks", tasks, "--length", str(length),
                    "--first-seed", str(first_seed), "--count", str(count), "--out", path],
                   check=True)
    tokens, roles = read_shard(path)
    os.unlink(path)
    return tokens, roles


def weighted_loss(logits, tokens, roles, first_weight=1.0):
    """Next-token CE; answer tokens weigh 1 (the first of each answer, the one
    that needs the lookup, first_weight), the rest together half the answers."""
    target = tokens[:, 1:]
    role = torch.from_numpy(roles[:, 1:].astype(np.int64))
    ce = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), target.reshape(-1),
                         reduction="none").view_as(target)
    is_answer = role == 2
    answer = is_answer.float()
    if first_weight != 1.0:
        first = is_answer & ~torch.from_numpy(roles[:, :-1] == 2)
        answer = answer + (first_weight - 1.0) * first.float()
    n_answer = answer.sum().clamp(min=1.0)
    other = 1.0 - is_answer.float()
    w = answer + other * (0.5 * n_answer / other.sum().clamp(min=1.0))
    loss = (ce * w).sum() / w.sum()
    answer_ce = (ce * is_answer.float()).sum() / is_answer.float().sum().clamp(min=1.0)
    return loss, answer_ce


@torch.no_grad()
def exact_match(model, tokens, roles, chunk):
    """Fraction of answers (maximal runs of role 2) whose every token is the
    argmax given the true prefix (teacher forcing = greedy decoding, since an
    answer token is only ever preceded by true tokens up to its first error)."""
    logits = model(torch.from_numpy(tokens), chunk=chunk)
    pred = logits[:, :-1].argmax(-1).numpy()
    ok = pred == tokens[:, 1:]
    role = roles[:, 1:]
    spans = [(b, i, j) for b in range(tokens.shape[0]) for i, j in role_runs(role[b], 2)]
    hits = sum(bool(ok[b, i:j].all()) for b, i, j in spans)
    return hits / max(len(spans), 1), len(spans)


def make_optimizer(model, lr, weight_decay):
    """AdamW with weight decay on the matrices only. Decaying the RMSNorm
    gains (and biases) pulls them towards 0: the first recipe did, the gains
    fell from 1 to 0.15-0.3 and attention logits could no longer exceed
    about 0.5, so no head could attend sharply (previous-token heads peaked
    at 0.3-0.4, the retrieval head put 15-19% on the right fact) and exact
    match stalled near 45%."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.95))


def lr_at(step, warmup, base_lr, stage_step=0, stage_steps=1, min_ratio=1.0):
    """Linear warmup over the first steps of the run, then per stage a cosine
    from base_lr down to min_ratio * base_lr (min_ratio 1: constant)."""
    frac = min(1.0, stage_step / max(stage_steps, 1))
    cosine = min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * frac))
    return base_lr * min(1.0, (step + 1) / warmup) * cosine


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--taskgen", required=True, help="path to evoke-taskgen")
    ap.add_argument("--ckpt-dir", required=True)
    ap.add_argument("--stages", default=DEFAULT_STAGES, help="length:batch:steps,...")
    ap.add_argument("--config", default="{}", help="JSON overrides of llama_model.Config")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--first-answer-weight", type=float, default=1.0,
                    help="loss weight of each answer's first token (the lookup)")
    ap.add_argument("--min-lr-ratio", type=float, default=0.1,
                    help="each stage's learning rate decays by a cosine to this ratio")
    ap.add_argument("--weight-decay", type=float, default=0.05)
    ap.add_argument("--advance-at", type=float, default=0.97,
                    help="held-out exact match that ends a stage early")
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--eval-sessions", type=int, default=48)
    ap.add_argument("--ckpt-every", type=int, default=100)
    ap.add_argument("--chunk", type=int, default=512, help="attention query chunk")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-minutes", type=float, default=0, help="stop (checkpointed) after this")
    ap.add_argument("--init-from", help="start a new run from this checkpoint's weights")
    ap.add_argument("--quick", action="store_true",
                    help="CI: a tiny model, a few minutes; exit 1 unless the loss fell")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    os.makedirs(args.ckpt_dir, exist_ok=True)
    overrides = json.loads(args.config)
    stages = parse_stages(QUICK_STAGES if args.quick else args.stages)
    if args.quick:
        overrides = {"n_embd": 64, "n_layer": 2, "n_head": 2, "n_head_kv": 1, "n_ff": 128,
                     **overrides}
        args.eval_every = 1000000
        args.warmup = 10
    vocab_path = os.path.join(args.ckpt_dir, "vocab.txt")
    subprocess.run([args.taskgen, "--vocab", vocab_path], check=True)
    with open(vocab_path) as f:
        n_vocab = len(f.read().splitlines())
    cfg = Config(n_vocab=n_vocab, n_ctx_train=max(s[0] for s in stages), **overrides)

    torch.manual_seed(args.seed)
    model = Llama(cfg)
    opt = make_optimizer(model, args.lr, args.weight_decay)
    state = {"stage": 0, "stage_step": 0, "step": 0, "seed_cursor": 0, "tokens": 0,
             "seconds": 0.0}
    latest = os.path.join(args.ckpt_dir, "latest.pt")
    if args.init_from and not os.path.exists(latest):
        ck = torch.load(args.init_from)
        if ck["config"]["n_embd"] != cfg.n_embd or ck["config"]["n_layer"] != cfg.n_layer:
            sys.exit(f"train.py: --init-from {args.init_from} holds another shape")
        model.load_state_dict(ck["model"])
        print(f"weights from {args.init_from} (step {ck['state']['step']})", flush=True)
    if os.path.exists(latest):
        ck = torch.load(latest)
        # The curriculum may be extended on resume: the trained context
        # (n_ctx_train, written to the GGUF) follows the stages given now.
        # (Checkpoints from before qk_bias existed have none.)
        if ({"qk_bias": False, **ck["config"], "n_ctx_train": cfg.n_ctx_train}
                != json.loads(cfg.to_json())):
            sys.exit(f"train.py: {latest} holds another config: {ck['config']}")
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        state = ck["state"]
        torch.set_rng_state(ck["rng"])
        print(f"resumed at step {state['step']} (stage {state['stage']}, "
              f"{state['tokens']} tokens, {state['seconds'] / 3600:.2f} h)", flush=True)

    log_path = os.path.join(args.ckpt_dir, "log.csv")
    new_log = not os.path.exists(log_path)
    log = open(log_path, "a", newline="")
    writer = csv.writer(log)
    if new_log:
        writer.writerow(["step", "stage", "length", "tokens", "seconds", "loss", "answer_ce",
                         "heldout_em", "lr"])

    def save():
        ck = {"config": json.loads(cfg.to_json()), "model": model.state_dict(),
              "opt": opt.state_dict(), "state": state, "rng": torch.get_rng_state()}
        torch.save(ck, latest + ".tmp")
        os.replace(latest + ".tmp", latest)

    first_loss = None
    last_losses = []
    started = time.time()
    tmpdir = tempfile.mkdtemp(prefix="evoke-train-")
    heldout = {}
    while state["stage"] < len(stages):
        length, batch, max_steps, tasks = stages[state["stage"]]
        if (length, tasks) not in heldout:
            # Held-out sessions of the training split (seeds far above any
            # training seed; evoke-eval uses the eval split, never seen here)
            # of the stage's retrieval tasks (copy drills have no answers).
            probe_tasks = ",".join(t for t in tasks.split(",") if t != "copy") or "recall"
            heldout[(length, tasks)] = generate(args.taskgen, "train", length, 1 << 40,
                                                args.eval_sessions, tmpdir, probe_tasks)
        pool_tokens, pool_roles = generate(args.taskgen, "train", length, state["seed_cursor"],
                                           batch * 50, tmpdir, tasks)
        state["seed_cursor"] += batch * 50
        for i in range(0, pool_tokens.shape[0], batch):
            if state["stage_step"] >= max_steps:
                break
            t0 = time.time()
            toks = torch.from_numpy(pool_tokens[i:i + batch])
            model.train()
            logits = model(toks, chunk=args.chunk)
            loss, answer_ce = weighted_loss(logits, toks, pool_roles[i:i + batch],
                                             args.first_answer_weight)
            lr = lr_at(state["step"], args.warmup, args.lr, state["stage_step"], max_steps,
                       args.min_lr_ratio)
            for g in opt.param_groups:
                g["lr"] = lr
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            state["step"] += 1
            state["stage_step"] += 1
            state["tokens"] += toks.numel()
            state["seconds"] += time.time() - t0
            lv = float(loss)
            if first_loss is None:
                first_loss = lv
            last_losses = (last_losses + [lv])[-10:]
            em = ""
            if state["step"] % args.eval_every == 0:
                model.eval()
                em, _ = exact_match(model, *heldout[(length, tasks)], args.chunk)
            writer.writerow([state["step"], state["stage"], length, state["tokens"],
                             f"{state['seconds']:.1f}", f"{lv:.4f}", f"{float(answer_ce):.4f}",
                             em if em == "" else f"{em:.4f}", f"{lr:.2e}"])
            if state["step"] % 10 == 0 or em != "":
                log.flush()
                tps = toks.numel() / max(time.time() - t0, 1e-9)
                print(f"step {state['step']} L={length} loss {lv:.3f} answer_ce "
                      f"{float(answer_ce):.3f} {tps:.0f} tok/s"
                      + (f" heldout_em {em:.3f}" if em != "" else ""), flush=True)
            if state["step"] % args.ckpt_every == 0:
                save()
            if em != "" and em >= args.advance_at:
                state["stage_step"] = max_steps
            if args.max_minutes and time.time() - started > 60 * args.max_minutes:
                save()
                print("stopping at --max-minutes (checkpointed)", flush=True)
                return 0
        if state["stage_step"] >= max_steps:
            state["stage"] += 1
            state["stage_step"] = 0
            save()
    save()
    log.close()
    if args.quick:
        first10 = first_loss
        last10 = sum(last_losses) / len(last_losses)
        print(f"quick: first loss {first10:.3f}, mean of the last 10 {last10:.3f}")
        if not last10 < 0.8 * first10:
            print("quick: the loss did not fall by 20%", file=sys.stderr)
            return 1
    print("training complete", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
