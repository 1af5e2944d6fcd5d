"""The study's model (include/posenc/model.h) written independently in PyTorch.

Used by scripts/train_speed.py (tokens per second, PyTorch against posenc in one run) and by
tests/e2e/test_train_torch.py (replays a posenc training run from its initial checkpoint and batches
and compares the losses). Covers nope, learned, sinusoidal, rope (the checkpoint's layout, half or
interleaved; theta 10000, whole head), alibi (symmetric, the paper's slope rule) and t5 (a learned
bias per layer over the decoder's unidirectional buckets), each written from the papers' formulas.

Runs with Debian's /usr/bin/python3 (python3-torch, python3-numpy); never a runtime dependency.
"""
import ctypes
import json
import math
import os
import struct

import numpy as np
import torch
import torch.nn.functional as F

SUPPORTED = ("nope", "learned", "sinusoidal", "rope", "alibi", "t5")


def load(path):
    """(config, Model) from a posenc checkpoint."""
    params, meta = read_safetensors(path)
    cfg = json.loads(meta["posenc.config"])
    return cfg, Model(cfg, params)


def set_threads(n):
    """torch.set_num_threads(n), with OpenBLAS (where torch's BLAS is OpenBLAS) at one thread.

    Debian's torch calls BLAS through libblas.so.3, which libopenblas-dev points at OpenBLAS's pthread
    build. That build keeps a thread pool of its own, sized to every core and deaf to
    torch.set_num_threads. Left alone, a "one-thread" torch runs its matrix products on two cores
    (1024×64 by 64×768 here: 147 GFLOP/s at cpu/wall 1.99, against 95 at 1.00 with OpenBLAS at one
    thread), and at two threads the two pools contend for the same two cores: the study's model
    trained at 15–17k tokens/s against 41–47k with OpenBLAS at one thread, and 36–47k with torch at
    one thread and OpenBLAS at two. So torch's own pool gets the n threads. Returns whether OpenBLAS
    was found in the process (loaded with torch, never here)."""
    torch.set_num_threads(n)
    try:
        blas = ctypes.CDLL("libopenblas.so.0", mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except OSError:
        return False
    blas.openblas_set_num_threads(ctypes.c_int(1))
    return True


def read_safetensors(path):
    """(tensors by name as float32 torch tensors, metadata dict) of a safetensors file."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", {})
    out = {}
    for name, t in header.items():
        assert t["dtype"] == "F32", t
        b, e = t["data_offsets"]
        out[name] = torch.from_numpy(np.frombuffer(data[b:e], dtype="<f4").copy().reshape(t["shape"]))
    return out, meta


def alibi_slopes(h):
    """Press et al. 2022: 2^(-8i/n) for i = 1..n when n is a power of two; otherwise the closest power
    of two below, then every other slope of twice that many."""
    def pow2(n):
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]
    if math.log2(h).is_integer():
        return pow2(h)
    p = 2 ** math.floor(math.log2(h))
    return pow2(p) + pow2(2 * p)[0::2][: h - p]


def t5_buckets(rel, num_buckets, max_distance):
    """Raffel et al. 2020 (Mesh TensorFlow's _relative_position_bucket), unidirectional as in a
    decoder: n = max(query − key, 0); exact buckets below num_buckets/2, then logarithmic up to
    max_distance (the log evaluated in float32), the last bucket beyond. rel = key − query."""
    n = torch.clamp(-rel, min=0)
    exact = num_buckets // 2
    logn = torch.log(torch.clamp(n, min=1).to(torch.float32) / exact)
    large = exact + (logn / math.log(max_distance / exact) * (num_buckets - exact)).to(torch.long)
    return torch.where(n < exact, n, torch.clamp(large, max=num_buckets - 1))


class Model(torch.nn.Module):
    def __init__(self, cfg, params):
        super().__init__()
        self.cfg = cfg
        enc = cfg["encoding"]
        if enc not in SUPPORTED:
            raise ValueError(f"encoding {enc} is not written in torch_model.py")
        C, F_, V = cfg["d_model"], cfg["d_ff"], cfg["vocab"]
        shapes = {"tok_emb": (V, C), "lnf.g": (C,), "lnf.b": (C,)}
        if enc == "learned":
            shapes["pos_emb"] = (cfg["max_len"], C)
        for l in range(cfg["n_layers"]):
            p = f"layers.{l}."
            shapes.update({p + "ln1.g": (C,), p + "ln1.b": (C,), p + "attn.wqkv": (C, 3 * C),
                           p + "attn.bqkv": (3 * C,), p + "attn.wo": (C, C), p + "attn.bo": (C,),
                           p + "ln2.g": (C,), p + "ln2.b": (C,), p + "mlp.w1": (C, F_),
                           p + "mlp.b1": (F_,), p + "mlp.w2": (F_, C), p + "mlp.b2": (C,)})
            if enc == "t5":
                shapes[p + "attn.t5_bias"] = (cfg["t5"]["num_buckets"], cfg["n_heads"])
        self.p = torch.nn.ParameterDict()
        for name, shape in shapes.items():  # the parameters of a posenc checkpoint, checked by shape
            if tuple(params[name].shape) != shape:
                raise ValueError(f"{name}: shape {tuple(params[name].shape)}, expected {shape}")
            self.p[name.replace(".", "__")] = torch.nn.Parameter(params[name].clone())

    def w(self, name):
        return self.p[name.replace(".", "__")]

    def forward(self, tokens):
        cfg = self.cfg
        B, L = tokens.shape
        C, H = cfg["d_model"], cfg["n_heads"]
        D = C // H
        enc = cfg["encoding"]
        x = self.w("tok_emb")[tokens] * math.sqrt(C)
        pos = torch.arange(L, dtype=torch.float64)
        if enc == "learned":
            x = x + self.w("pos_emb")[:L]
        elif enc == "sinusoidal":
            i = torch.arange(0, C, 2, dtype=torch.float64)
            ang = pos[:, None] / (cfg["sinusoid_base"] ** (i / C))[None, :]
            pe = torch.stack([torch.sin(ang), torch.cos(ang)], dim=-1).reshape(L, C)
            x = x + pe.to(torch.float32)
        if enc == "rope":
            k = torch.arange(D // 2, dtype=torch.float64)
            theta = cfg["rope"]["theta"] ** (-2.0 * k / D)
            ang = pos[:, None] * theta[None, :]
            cos, sin = torch.cos(ang).to(torch.float32), torch.sin(ang).to(torch.float32)
        mask = torch.ones(L, L, dtype=torch.bool).tril()
        bias = None
        if enc == "alibi":
            dist = (pos[:, None] - pos[None, :]).abs().to(torch.float32)
            slopes = torch.tensor(alibi_slopes(H), dtype=torch.float32)
            bias = -slopes[:, None, None] * dist[None]
        if enc == "t5":
            ids = torch.arange(L)
            buckets = t5_buckets(ids[None, :] - ids[:, None], cfg["t5"]["num_buckets"], cfg["t5"]["max_distance"])
        for l in range(cfg["n_layers"]):
            p = f"layers.{l}."
            a = F.layer_norm(x, (C,), self.w(p + "ln1.g"), self.w(p + "ln1.b"), 1e-5)
            qkv = (a @ self.w(p + "attn.wqkv") + self.w(p + "attn.bqkv")).view(B, L, 3, H, D)
            q, k_, v = (qkv[:, :, j].transpose(1, 2) for j in range(3))  # [B, H, L, D]
            if enc == "rope":
                def rot(t):
                    if cfg["rope"]["layout"] == "interleaved":  # pairs (2k, 2k+1)
                        t2 = t.reshape(B, H, L, D // 2, 2)
                        a0, a1 = t2[..., 0], t2[..., 1]
                        return torch.stack([a0 * cos - a1 * sin, a0 * sin + a1 * cos], dim=-1).reshape(B, H, L, D)
                    a0, a1 = t[..., : D // 2], t[..., D // 2:]  # half: pairs (k, k + D/2)
                    return torch.cat([a0 * cos - a1 * sin, a0 * sin + a1 * cos], dim=-1)
                q, k_ = rot(q), rot(k_)
            s = (q @ k_.transpose(-1, -2)) / math.sqrt(D)
            if bias is not None:
                s = s + bias
            if enc == "t5":
                s = s + self.w(p + "attn.t5_bias")[buckets].permute(2, 0, 1)  # [H, L, L]
            s = s.masked_fill(~mask, float("-inf"))
            o = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, L, C)
            x = x + o @ self.w(p + "attn.wo") + self.w(p + "attn.bo")
            m = F.layer_norm(x, (C,), self.w(p + "ln2.g"), self.w(p + "ln2.b"), 1e-5)
            h = F.gelu(m @ self.w(p + "mlp.w1") + self.w(p + "mlp.b1"))
            x = x + h @ self.w(p + "mlp.w2") + self.w(p + "mlp.b2")
        f = F.layer_norm(x, (C,), self.w("lnf.g"), self.w("lnf.b"), 1e-5)
        return f @ self.w("tok_emb").t()


def decayed(name):
    """The parameters AdamW decays in posenc: the projection matrices."""
    return name.endswith(("attn__wqkv", "attn__wo", "mlp__w1", "mlp__w2"))


def lr_at(step, lr, warmup, total, min_ratio=0.1):
    """posenc's schedule (src/model/adamw.cc): linear warm-up, then cosine to min_ratio·lr."""
    if warmup > 0 and step < warmup:
        return lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def make_optimizer(model, lr, weight_decay=0.1):
    dec = [p for n, p in model.p.items() if decayed(n)]
    rest = [p for n, p in model.p.items() if not decayed(n)]
    return torch.optim.AdamW([{"params": dec, "weight_decay": weight_decay},
                              {"params": rest, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.95), eps=1e-8)


def train_step(model, opt, tokens, targets, lr, clip=1.0):
    """One step like posenc's: mean cross-entropy, global-norm clipping, AdamW at this lr."""
    for g in opt.param_groups:
        g["lr"] = lr
    opt.zero_grad(set_to_none=True)
    logits = model(tokens)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    loss.backward()
    params = [p for p in model.parameters()]
    norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in params))
    if clip > 0 and norm > clip:
        for p in params:
            p.grad.mul_(clip / norm)
    opt.step()
    return loss.item()
