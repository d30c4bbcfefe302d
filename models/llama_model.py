"""A small Llama in PyTorch, laid out exactly as llama.cpp's LLM_ARCH_LLAMA.

RoPE is llama.cpp's "normal" mode (LLAMA_ROPE_TYPE_NORM): each head's
consecutive pairs (x[2i], x[2i+1]) rotate by pos * base**(-2i/head_dim). So
the weights export to GGUF as they are, with no Q/K permutation (HF
checkpoints need one because they rotate halves instead).

Tensors and their GGUF names:
  tok_embeddings [V, d]          token_embd.weight
  layers[i].attn_norm [d]        blk.i.attn_norm.weight
  layers[i].wq [H*hd, d]         blk.i.attn_q.weight   (.bias [H*hd] with qk_bias)
  layers[i].wk [KV*hd, d]        blk.i.attn_k.weight   (.bias [KV*hd] with qk_bias)
  layers[i].wv [KV*hd, d]        blk.i.attn_v.weight
  layers[i].wo [d, H*hd]         blk.i.attn_output.weight
  layers[i].ffn_norm [d]         blk.i.ffn_norm.weight
  layers[i].w_gate [ff, d]       blk.i.ffn_gate.weight
  layers[i].w_up [ff, d]         blk.i.ffn_up.weight
  layers[i].w_down [d, ff]       blk.i.ffn_down.weight
  norm [d]                       output_norm.weight
  output [V, d]                  output.weight
(A torch Linear weight is [out, in], which is ggml's ne0 = in, ne1 = out.)

qk_bias adds a bias to the query and key projections, before RoPE, as
llama.cpp's LLM_ARCH_LLAMA applies its optional attn_q.bias / attn_k.bias.
Without it, a head can attend by position only through a direction that
every token's embedding shares, which the model must first learn; with it,
positional heads (the previous-token heads that retrieval is built on) have
a direct parameter. K stays a rotation of a position-free vector, so
re-anchoring a saved block by one RoPE rotation is still exact.
"""

import dataclasses
import json
import math

import torch
import torch.nn.functional as F


@dataclasses.dataclass
class Config:
    n_vocab: int = 512
    n_embd: int = 128
    n_layer: int = 4
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 384
    rope_freq_base: float = 100000.0
    rms_eps: float = 1e-5
    n_ctx_train: int = 4096
    qk_bias: bool = False

    @property
    def head_dim(self):
        return self.n_embd // self.n_head

    def to_json(self):
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @staticmethod
    def from_dict(d):
        return Config(**d)


def rms_norm(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rope_tables(cfg, positions):
    """cos, sin of shape [T, head_dim // 2] for integer positions [T]."""
    hd = cfg.head_dim
    inv = cfg.rope_freq_base ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    ang = positions.to(torch.float64)[:, None] * inv[None, :]
    return torch.cos(ang).float(), torch.sin(ang).float()


def apply_rope(x, cos, sin):
    """x: [B, heads, T, hd]; rotates pairs (2i, 2i+1)."""
    x0 = x[..., 0::2]
    x1 = x[..., 1::2]
    r0 = x0 * cos - x1 * sin
    r1 = x0 * sin + x1 * cos
    return torch.stack((r0, r1), dim=-1).flatten(-2)


class Layer(torch.nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d, hd = cfg.n_embd, cfg.head_dim
        self.cfg = cfg
        self.attn_norm = torch.nn.Parameter(torch.ones(d))
        self.wq = torch.nn.Linear(d, cfg.n_head * hd, bias=cfg.qk_bias)
        self.wk = torch.nn.Linear(d, cfg.n_head_kv * hd, bias=cfg.qk_bias)
        self.wv = torch.nn.Linear(d, cfg.n_head_kv * hd, bias=False)
        self.wo = torch.nn.Linear(cfg.n_head * hd, d, bias=False)
        self.ffn_norm = torch.nn.Parameter(torch.ones(d))
        self.w_gate = torch.nn.Linear(d, cfg.n_ff, bias=False)
        self.w_up = torch.nn.Linear(d, cfg.n_ff, bias=False)
        self.w_down = torch.nn.Linear(cfg.n_ff, d, bias=False)

    def attention(self, x, cos, sin, chunk, mask=None):
        cfg = self.cfg
        B, T, _ = x.shape
        hd = cfg.head_dim
        q = self.wq(x).view(B, T, cfg.n_head, hd).transpose(1, 2)
        k = self.wk(x).view(B, T, cfg.n_head_kv, hd).transpose(1, 2)
        v = self.wv(x).view(B, T, cfg.n_head_kv, hd).transpose(1, 2)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        rep = cfg.n_head // cfg.n_head_kv
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        scale = 1.0 / math.sqrt(hd)
        if mask is not None:
            # An explicit [T, T] boolean mask (True = may attend).
            s = torch.matmul(q, k.transpose(-1, -2)) * scale
            s = s.masked_fill(~mask, float("-inf"))
            out = torch.matmul(torch.softmax(s, dim=-1), v)
        else:
            # Causal attention by query chunks: chunk c sees keys [0, end_c),
            # so the masked upper triangle beyond each chunk is never computed.
            outs = []
            for start in range(0, T, chunk):
                end = min(T, start + chunk)
                s = torch.matmul(q[:, :, start:end], k[:, :, :end].transpose(-1, -2)) * scale
                causal = torch.ones(end - start, end, dtype=torch.bool).tril(diagonal=start)
                s = s.masked_fill(~causal, float("-inf"))
                outs.append(torch.matmul(torch.softmax(s, dim=-1), v[:, :, :end]))
            out = torch.cat(outs, dim=2)
        return self.wo(out.transpose(1, 2).reshape(B, T, cfg.n_head * hd))

    def forward(self, x, cos, sin, chunk, mask=None):
        x = x + self.attention(rms_norm(x, self.attn_norm, self.cfg.rms_eps), cos, sin, chunk, mask)
        h = rms_norm(x, self.ffn_norm, self.cfg.rms_eps)
        return x + self.w_down(F.silu(self.w_gate(h)) * self.w_up(h))


class Llama(torch.nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = torch.nn.Embedding(cfg.n_vocab, cfg.n_embd)
        self.layers = torch.nn.ModuleList(Layer(cfg) for _ in range(cfg.n_layer))
        self.norm = torch.nn.Parameter(torch.ones(cfg.n_embd))
        self.output = torch.nn.Linear(cfg.n_embd, cfg.n_vocab, bias=False)
        self.reset_parameters()

    def reset_parameters(self):
        # Matrices N(0, 0.02), the residual outputs scaled down by depth;
        # the qk_bias vectors keep PyTorch's Linear default (uniform in
        # +-1/sqrt(n_embd)), as the runs that chose qk_bias had them.
        std = 0.02
        for name, p in self.named_parameters():
            if p.dim() == 2:
                torch.nn.init.normal_(p, 0.0, std)
                if name.endswith("wo.weight") or name.endswith("w_down.weight"):
                    p.data /= math.sqrt(2 * self.cfg.n_layer)

    def forward(self, tokens, positions=None, chunk=512, mask=None):
        """tokens [B, T] -> logits [B, T, V]. positions: [T] (default 0..T-1).
        mask: None (causal), one [T, T] boolean mask (True = may attend) for
        every layer, or a list of them, one per layer."""
        T = tokens.shape[1]
        if positions is None:
            positions = torch.arange(T)
        cos, sin = rope_tables(self.cfg, positions)
        x = self.tok_embeddings(tokens)
        for i, layer in enumerate(self.layers):
            m = mask[i] if isinstance(mask, (list, tuple)) else mask
            x = layer(x, cos, sin, chunk, m)
        return self.output(rms_norm(x, self.norm, self.cfg.rms_eps))


def gguf_tensors(model):
    """(gguf name, float32 numpy array) for every tensor, in llama.cpp's order."""
    return [(n, t.detach().float().contiguous().numpy()) for n, t in gguf_parameters(model)]


def load_gguf(path):
    """(Config, Llama) from a GGUF this module exported (f32 tensors), through
    llama.cpp's gguf-py (on PYTHONPATH): the evaluation runs on the shipped
    weights themselves."""
    import numpy as np
    from gguf import GGUFReader

    r = GGUFReader(path)

    def val(key):
        return r.get_field(key).contents()

    cfg = Config(n_vocab=int(val("llama.vocab_size")), n_embd=int(val("llama.embedding_length")),
                 n_layer=int(val("llama.block_count")), n_head=int(val("llama.attention.head_count")),
                 n_head_kv=int(val("llama.attention.head_count_kv")),
                 n_ff=int(val("llama.feed_forward_length")),
                 rope_freq_base=float(val("llama.rope.freq_base")),
                 rms_eps=float(val("llama.attention.layer_norm_rms_epsilon")),
                 n_ctx_train=int(val("llama.context_length")),
                 qk_bias="blk.0.attn_q.bias" in {t.name for t in r.tensors})
    model = Llama(cfg)
    by_name = {t.name: t for t in r.tensors}
    with torch.no_grad():
        for name, param in gguf_parameters(model):
            t = by_name[name]
            arr = np.array(t.data, dtype=np.float32).reshape(param.shape)
            param.copy_(torch.from_numpy(arr))
    model.eval()
    return cfg, model


def gguf_parameters(model):
    """(gguf name, torch parameter) pairs, as gguf_tensors names them."""
    out = [("token_embd.weight", model.tok_embeddings.weight)]
    for i, l in enumerate(model.layers):
        out += [(f"blk.{i}.attn_norm.weight", l.attn_norm), (f"blk.{i}.attn_q.weight", l.wq.weight)]
        if l.wq.bias is not None:
            out += [(f"blk.{i}.attn_q.bias", l.wq.bias)]
        out += [(f"blk.{i}.attn_k.weight", l.wk.weight)]
        if l.wk.bias is not None:
            out += [(f"blk.{i}.attn_k.bias", l.wk.bias)]
        out += [(f"blk.{i}.attn_v.weight", l.wv.weight),
                (f"blk.{i}.attn_output.weight", l.wo.weight),
                (f"blk.{i}.ffn_norm.weight", l.ffn_norm),
                (f"blk.{i}.ffn_gate.weight", l.w_gate.weight),
                (f"blk.{i}.ffn_up.weight", l.w_up.weight),
                (f"blk.{i}.ffn_down.weight", l.w_down.weight)]
    out += [("output_norm.weight", model.norm), ("output.weight", model.output.weight)]
    return out
