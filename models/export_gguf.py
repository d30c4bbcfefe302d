#!/usr/bin/python3
"""Exports a train.py checkpoint to GGUF (llama.cpp's LLM_ARCH_LLAMA layout),
and writes reference logits that llama.cpp's must match.

  PYTHONPATH=build/_deps/llama.cpp/src/gguf-py \\
    models/export_gguf.py --ckpt RUN/latest.pt --vocab RUN/vocab.txt \\
      --out models/evoke-recall.gguf --reference models/evoke-recall.ref

The tokenizer is llama.cpp's WPM ("bert") over the word vocabulary of
eval/tasks.h: each word is stored as "\\u2581word", so llama.cpp tokenizes
space-separated task text into exactly the generator's ids; <unk>, <s>, </s>
are ids 0, 1, 2. BOS is added, SEP is not.

The reference file holds one generated evaluation session's tokens and the
PyTorch logits of its last `--ref-positions` positions (see
models/reference_format.md); evoke_model_logits_test compares llama.cpp's
logits on the same tokens with them.
"""

import argparse
import hashlib
import json
import os
import struct
import subprocess
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_model import Config, Llama, gguf_tensors  # noqa: E402

import gguf  # noqa: E402  (llama.cpp's gguf-py, on PYTHONPATH)


def write_gguf(model, cfg, words, path, name):
    w = gguf.GGUFWriter(path + ".tmp", "llama")
    w.add_name(name)
    w.add_context_length(cfg.n_ctx_train)
    w.add_embedding_length(cfg.n_embd)
    w.add_block_count(cfg.n_layer)
    w.add_feed_forward_length(cfg.n_ff)
    w.add_head_count(cfg.n_head)
    w.add_head_count_kv(cfg.n_head_kv)
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_rope_freq_base(cfg.rope_freq_base)
    w.add_layer_norm_rms_eps(cfg.rms_eps)
    w.add_vocab_size(cfg.n_vocab)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("bert")
    specials = {"<unk>", "<s>", "</s>"}
    w.add_token_list([wd if wd in specials else "\u2581" + wd for wd in words])
    w.add_token_types([gguf.TokenType.CONTROL if wd in specials else gguf.TokenType.NORMAL
                       for wd in words])
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_sep_token_id(2)
    w.add_pad_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_sep_token(False)
    for tname, arr in gguf_tensors(model):
        w.add_tensor(tname, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(path + ".tmp", path)


def write_reference(model, taskgen, length, positions, path):
    """Tokens of eval session (multifact, seed 0) and the logits of its last
    `positions` positions: 'EVREFLG1', u32 n_tokens, u32 positions, u32
    n_vocab, i32 tokens[n_tokens], f32 logits[positions][n_vocab]."""
    shard = path + ".shard"
    subprocess.run([taskgen, "--split", "eval", "--tasks", "multifact", "--length", str(length),
                    "--first-seed", "0", "--count", "1", "--out", shard], check=True)
    with open(shard, "rb") as f:
        f.read(16)
        tokens = np.frombuffer(f.read(length * 2), dtype="<u2").astype(np.int64)
    os.unlink(shard)
    with torch.no_grad():
        logits = model(torch.from_numpy(tokens)[None])[0, -positions:].numpy().astype(np.float32)
    with open(path + ".tmp", "wb") as f:
        f.write(b"EVREFLG1")
        f.write(struct.pack("<III", length, positions, logits.shape[1]))
        f.write(tokens.astype("<i4").tobytes())
        f.write(logits.astype("<f4").tobytes())
    os.replace(path + ".tmp", path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--vocab", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--name", default="evoke-recall")
    ap.add_argument("--reference", help="also write reference logits here")
    ap.add_argument("--taskgen", help="evoke-taskgen (for --reference)")
    ap.add_argument("--ref-length", type=int, default=1024)
    ap.add_argument("--ref-positions", type=int, default=64)
    args = ap.parse_args()

    ck = torch.load(args.ckpt)
    cfg = Config.from_dict(ck["config"])
    model = Llama(cfg)
    model.load_state_dict(ck["model"])
    model.eval()
    with open(args.vocab) as f:
        words = f.read().splitlines()
    if len(words) != cfg.n_vocab:
        sys.exit(f"export_gguf.py: {args.vocab} has {len(words)} words, the model {cfg.n_vocab}")
    write_gguf(model, cfg, words, args.out, args.name)
    with open(args.out, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    print(f"{args.out}: {os.path.getsize(args.out)} bytes, sha256 {digest}")
    print(json.dumps(ck["config"], sort_keys=True))
    if args.reference:
        if not args.taskgen:
            sys.exit("export_gguf.py: --reference needs --taskgen")
        write_reference(model, args.taskgen, args.ref_length, args.ref_positions, args.reference)
        print(f"{args.reference}: reference logits of {args.ref_positions} positions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
