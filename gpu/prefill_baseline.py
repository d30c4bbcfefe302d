"""Re-prefill baseline for evoke's headline measurement (issue #4).

A Llama-3.1-8B-shaped decoder (32 layers, hidden 4096, 32 query heads, 8 KV
heads, head_dim 128, FFN 14336, vocab 128256) with random bf16 weights runs a
forward pass over 2048 tokens on the GPU: RMSNorm, RoPE (theta 500000), SDPA
attention (causal, grouped-query), SwiGLU MLP, LM head. Timed with CUDA
events after warm-up; prints the median of several runs as JSON. This is what
re-prefilling an evicted 2048-token span costs on this GPU, to compare with
saving and loading its KV through evoked.

  python3 gpu/prefill_baseline.py [--tokens 2048] [--runs 7]
"""
import argparse
import json
import statistics

import torch
import torch.nn.functional as F


def rope(x, positions, theta=500000.0):
    # x: [batch, heads, tokens, 128], NEOX (half-split) pairing as in HF Llama.
    half = x.shape[-1] // 2
    inv = 1.0 / (theta ** (torch.arange(0, half, device=x.device, dtype=torch.float32) / half))
    ang = positions[:, None].float() * inv[None, :]
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class Layer(torch.nn.Module):
    def __init__(self, d=4096, hq=32, hkv=8, hd=128, ffn=14336):
        super().__init__()
        self.hq, self.hkv, self.hd = hq, hkv, hd
        self.norm1 = torch.nn.RMSNorm(d)
        self.q = torch.nn.Linear(d, hq * hd, bias=False)
        self.k = torch.nn.Linear(d, hkv * hd, bias=False)
        self.v = torch.nn.Linear(d, hkv * hd, bias=False)
        self.o = torch.nn.Linear(hq * hd, d, bias=False)
        self.norm2 = torch.nn.RMSNorm(d)
        self.gate = torch.nn.Linear(d, ffn, bias=False)
        self.up = torch.nn.Linear(d, ffn, bias=False)
        self.down = torch.nn.Linear(ffn, d, bias=False)

    def forward(self, x, positions):
        b, t, _ = x.shape
        h = self.norm1(x)
        q = self.q(h).view(b, t, self.hq, self.hd).transpose(1, 2)
        k = self.k(h).view(b, t, self.hkv, self.hd).transpose(1, 2)
        v = self.v(h).view(b, t, self.hkv, self.hd).transpose(1, 2)
        q, k = rope(q, positions), rope(k, positions)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, -1))
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Model(torch.nn.Module):
    def __init__(self, layers=32, vocab=128256, d=4096):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d)
        self.layers = torch.nn.ModuleList(Layer() for _ in range(layers))
        self.norm = torch.nn.RMSNorm(d)
        self.head = torch.nn.Linear(d, vocab, bias=False)

    def forward(self, tokens):
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x, positions)
        return self.head(self.norm(x))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--runs", type=int, default=7)
    args = p.parse_args()
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Model().to(torch.bfloat16)
    for param in model.parameters():
        torch.nn.init.normal_(param, std=0.02)
    model.eval()
    tokens = torch.randint(0, 128256, (1, args.tokens), device="cuda")
    times = []
    with torch.inference_mode():
        for i in range(args.runs + 2):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            model(tokens)
            end.record()
            torch.cuda.synchronize()
            if i >= 2:  # Warm-up.
                times.append(start.elapsed_time(end))
    params = sum(p.numel() for p in model.parameters())
    print(json.dumps({
        "tokens": args.tokens,
        "prefill_ms_median": statistics.median(times),
        "prefill_ms_all": times,
        "params": params,
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
    }))


if __name__ == "__main__":
    main()
