"""torch.nn modules over posenc's functions: RotaryEmbedding and the positional part of attention.

Attention registers the encoding's learned tensors as nn.Parameters, initialised as the study's
model does (apps/study/model.cc): T5's table N(0, 0.1); learned ALiBi's w 0 (slopes σ(0) = ½);
CoPE's table N(0, 0.02); XL's u, v 0 and its projection N(0, 0.02); KERPLE's r1 = (h + 1)/H,
r2 = 2(h + 1)/H; FIRE's first layer N(0, 1), second N(0, 0.02) with bias 0, c = 0.1 and L = max_len;
rope2d mixed's frequencies RoPE-Mixed's (theta 10, head directions 2π(h + ½)/H). See docs/distributed.md.
"""
import math

import torch
from torch import nn

from ._attention import attention, kind, learned_tensors
from ._common import check_bool, check_int
from ._rope import rope_qk

_KERPLE_MIN = 1e-2  # r1, r2 read as at least this (the authors' ε); power: r2 at most 2
_FIRE_MIN_C = 1e-3  # FIRE's c read as at least this; L at least 1


class RotaryEmbedding(nn.Module):
    """RoPE of q and k [B, L, H, D] (posenc.rope_qk); no parameters.

    head_dim: D (checked against the tensors); theta, layout ("half", the default: GPT-NeoX / Llama;
    "interleaved": RoFormer), scaling (a rope_scaling dict) or config (a config.json dict or path, which
    sets the rest, its layout too unless layout is given). Checked at construction (a rotation of one
    token), each error naming its argument.
    """

    def __init__(self, head_dim, theta=10000.0, layout=None, scaling=None, config=None):
        super().__init__()
        _check_size("head_dim", head_dim)
        self.head_dim, self.theta, self.layout, self.scaling, self.config = head_dim, theta, layout, scaling, config
        x = torch.zeros(1, 1, 1, head_dim, dtype=torch.float64)
        self.forward(x, x)

    def forward(self, q, k, positions=None, offset=0):
        """(q, k) rotated at positions (int [L] or [B, L]) + offset, or offset + l."""
        if q.shape[-1] != self.head_dim or k.shape[-1] != self.head_dim:
            raise ValueError(f"q, k: expected head dim {self.head_dim}, got {q.shape[-1]} and {k.shape[-1]}")
        if self.config is not None:
            return rope_qk(q, k, positions, offset=offset, layout=self.layout, config=self.config)
        return rope_qk(q, k, positions, offset=offset, layout=self.layout, theta=self.theta, scaling=self.scaling)

    def extra_repr(self):
        return f"head_dim={self.head_dim}, theta={self.theta}, layout={self.layout!r}"


def _check_size(name, value):
    check_int(name, value)
    if value < 1:
        raise ValueError(f"{name}: expected an integer >= 1, got {value}")


def _rope2d_mixed_freqs(heads, rotary_dim, theta=10.0):
    """RoPE-Mixed's frequencies [2, H, r/2]: magnitudes θ^(−4j/r), head h's direction 2π(h + ½)/H."""
    half, quarter = rotary_dim // 2, rotary_dim // 4
    f = torch.zeros(2, heads, half, dtype=torch.float64)
    for h in range(heads):
        a = 2 * math.pi * (h + 0.5) / heads
        for j in range(quarter):
            mu = 1.0 / theta ** (4 * j / rotary_dim)
            f[0, h, j], f[0, h, quarter + j] = mu * math.cos(a), mu * math.cos(a + math.pi / 2)
            f[1, h, j], f[1, h, quarter + j] = mu * math.sin(a), mu * math.sin(a + math.pi / 2)
    return f


class Attention(nn.Module):
    """softmax(scale·q·kᵀ + encoding + mask)·v (posenc.attention) with the encoding's learned tensors.

    heads: query heads H; head_dim: D. params: posenc.attention's keys (variant=, num_buckets=,
    kernel=, rope={...}, ...; a fixed tensor such as alibi's slopes= is kept as a buffer). For the
    learned tensors: max_len (cope's table rows, FIRE's L; default 512), fire_width (32), rel_dim (xl's
    R, default head_dim); a tensor given under a learned tensor's name (weights=, table=, ...) is its
    initial value, of the shape the default would have. forward(q [B, M, H, D], k, v [B, N, Hkv, D],
    **call) → [B, M, H, D]; call: q_offset, k_offset, scale, q_positions, k_positions.
    """

    def __init__(self, heads, head_dim, encoding="nope", causal=True, *, max_len=512, fire_width=32, rel_dim=None,
                 dtype=None, **params):
        super().__init__()
        for name, value in (("heads", heads), ("head_dim", head_dim), ("max_len", max_len),
                            ("fire_width", fire_width)):
            _check_size(name, value)
        if rel_dim is not None:
            _check_size("rel_dim", rel_dim)
        if not isinstance(encoding, str):
            raise TypeError(f"encoding: expected a name (str), got {type(encoding).__name__}")
        if kind(encoding) is None:
            raise ValueError(f"encoding: unknown encoding '{encoding}'")
        check_bool("causal", causal)
        if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise TypeError(f"dtype: expected a floating torch.dtype, got {dtype!r}")
        if "num_buckets" in params:
            _check_size("num_buckets", params["num_buckets"])
        self.heads, self.head_dim, self.encoding, self.causal = heads, head_dim, encoding, causal
        learned = set(learned_tensors(encoding))
        self.params, self._fixed, given = {}, [], {}
        for k, v in params.items():
            if isinstance(v, torch.Tensor) and k in learned:
                given[k] = v
            elif isinstance(v, torch.Tensor):
                self.register_buffer(k, v)
                self._fixed.append(k)
            else:
                self.params[k] = v
        dtype = dtype or torch.get_default_dtype()
        H, D = heads, head_dim
        new = {}
        if encoding == "t5":
            new["weights"] = torch.randn(int(params.get("num_buckets", 32)), H) * 0.1
        elif encoding == "alibi" and params.get("variant") == "learned":
            new["weights"] = torch.zeros(2, H)
        elif encoding == "cope":
            new["table"] = torch.randn(max_len, D) * 0.02
        elif encoding == "xl":
            new["u"], new["v_bias"] = torch.zeros(H, D), torch.zeros(H, D)
            new["rel_proj"] = torch.randn(H, D, rel_dim or D) * 0.02
        elif encoding == "kerple":
            steps = torch.arange(1, H + 1, dtype=torch.float64) / H
            new["r1"], new["r2"] = steps, 2 * steps
        elif encoding == "fire":
            new["mlp_w1"], new["mlp_b1"] = torch.randn(fire_width), torch.randn(fire_width)
            new["mlp_w2"], new["mlp_b2"] = torch.randn(H, fire_width) * 0.02, torch.zeros(H)
            new["c"], new["threshold"] = torch.tensor([0.1]), torch.tensor([float(max_len)])
        elif encoding == "rope2d" and params.get("variant") == "mixed":
            r = params.get("rope", {}).get("rotary_dim", D) or D
            check_int("rotary_dim", r)
            if r < 4 or r % 4 or r > D:
                raise ValueError(f"rotary_dim: expected a multiple of 4 in [4, D = {D}] for rope2d mixed "
                                 f"(pairs split between x and y), got {r}")
            new["freqs"] = _rope2d_mixed_freqs(H, r)
        for k, v in given.items():
            if k not in new:
                raise ValueError(f"{k}: {encoding} learns no such tensor with these parameters")
            if tuple(v.shape) != tuple(new[k].shape):
                raise ValueError(f"{k}: expected an initial value of shape {list(new[k].shape)}, got {list(v.shape)}")
            new[k] = v.detach().clone()
        self._learned = list(new)
        for k, v in new.items():
            self.register_parameter(k, nn.Parameter(v.to(dtype)))

    def _tensors(self):
        t = {k: getattr(self, k) for k in self._fixed + self._learned}
        if self.encoding == "kerple":
            t["r1"] = t["r1"].clamp(min=_KERPLE_MIN)
            hi = 2.0 if self.params.get("kernel") == "power" else None
            t["r2"] = t["r2"].clamp(min=_KERPLE_MIN, max=hi)
        if self.encoding == "fire":
            t["c"] = t["c"].clamp(min=_FIRE_MIN_C)
            t["threshold"] = t["threshold"].clamp(min=1.0)
        return t

    def forward(self, q, k, v, **call):
        return attention(q, k, v, self.encoding, causal=self.causal, **self.params, **self._tensors(), **call)

    def extra_repr(self):
        return f"heads={self.heads}, head_dim={self.head_dim}, encoding={self.encoding!r}, causal={self.causal}"
