"""Fused attention with a positional encoding, and the logit biases, with autograd."""
import functools

import torch
from torch.autograd.function import once_differentiable

from . import _C
from ._common import FLOAT_DTYPES, check_bool, check_int, check_tensor, key, text



@functools.lru_cache(maxsize=None)
def _registry():
    return {e["name"]: e for e in _C.registry()}


def kind(encoding):
    """The registry's kind of an encoding ("rotary", "logit_bias", ...), or None for an unknown name."""
    e = _registry().get(encoding)
    return e["kind"] if e else None


def learned_tensors(encoding):
    """The names of the encoding's tensors that have a gradient (T5's weights, CoPE's table, ...)."""
    e = _registry().get(encoding)
    return tuple(key(p["name"]) for p in e["params"] if p["learned"]) if e else ()


def split_params(encoding, params):
    """(keys as text, tensors by name) from keyword parameters; rope={...} adds RoPE keys."""
    texts, tensors = {}, {}
    for name, value in params.items():
        if name == "rope":
            if not isinstance(value, dict):
                raise TypeError(f"rope: expected a dict of RoPE keys, got {type(value).__name__}")
            for k, v in value.items():
                texts[key(k)] = text(f"rope.{k}", v)
        elif isinstance(value, torch.Tensor):
            check_tensor(name, value, positions=name in ("q_positions", "k_positions"))
            tensors[key(name)] = value
        else:
            texts[key(name)] = text(name, value)
    return texts, tensors


class _AttentionFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, encoding, params, names, q, k, v, *tensors):
        out, lse = _C.attention_forward(q, k, v, encoding, params, dict(zip(names, tensors)))
        ctx.args = (encoding, params, names)
        ctx.save_for_backward(q, k, v, out, lse, *tensors)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    @once_differentiable
    def backward(ctx, dout, _dlse):
        encoding, params, names = ctx.args
        q, k, v, out, lse, *tensors = ctx.saved_tensors
        learned = learned_tensors(encoding)
        grad_names = [n for i, n in enumerate(names) if ctx.needs_input_grad[6 + i] and n in learned]
        tensors = dict(zip(names, tensors))
        # the forward's out and lse read where the fused kernels run, not computed again (FlashAttention's)
        dq, dk, dv, grads = _C.attention_backward_saved(q, k, v, out, lse, dout, encoding, params, tensors, grad_names)
        return (None, None, None, dq, dk, dv, *[grads.get(n) for n in names])


def attention(q, k, v, encoding="nope", *, causal=False, scale=None, q_offset=None, k_offset=0, return_lse=False,
              keys_rotated=False, bf16_rate=True, **params):
    """softmax(scale·q·kᵀ + encoding + mask)·v for q [B, M, Hq, D], k, v [B, N, Hkv, D] (Hq a multiple of Hkv).

    params: the encoding's keys (variant=, num_buckets=, kernel=, ...) and tensors (slopes=, weights=,
    table=, u=, v_bias=, rel_proj=, r1=, r2=, mlp_w1=, ..., freqs=, q_positions=, k_positions=) under the
    CLI's names; rope={...} RoPE's keys for rope, mrope, xpos and rope2d. Differentiable in q, k, v and
    the learned tensors. return_lse: also the float64 log-sum-exp [B, Hq, M] (not differentiable).
    keys_rotated: k already carries its rotation (a cache of rotated keys; rotary encodings): q only
    is rotated. bf16_rate: bfloat16 q, k, v take the forward's and backward's products on bfloat16
    pairs where the CPU multiplies them (AMX; AVX512_BF16 on AMD; P, dS rounded to bfloat16); False
    keeps the float32 products, the same results everywhere.
    """
    if not (type(q) is torch.Tensor and type(k) is torch.Tensor and type(v) is torch.Tensor and
            q.dtype in FLOAT_DTYPES and k.dtype in FLOAT_DTYPES and v.dtype in FLOAT_DTYPES):
        for name, t in (("q", q), ("k", k), ("v", v)):  # else the extension checks the device
            check_tensor(name, t)
    if not isinstance(encoding, str):
        raise TypeError(f"encoding: expected a name (str), got {type(encoding).__name__}")
    texts, tensors = split_params(encoding, params)
    for name, flag in (("causal", causal), ("keys_rotated", keys_rotated), ("bf16_rate", bf16_rate),
                       ("return_lse", return_lse)):
        check_bool(name, flag)
    if causal:
        texts["causal"] = "true"
    if keys_rotated:
        texts["keys_rotated"] = "true"
    if not bf16_rate:
        texts["bf16_rate"] = "false"
    if type(k_offset) is not int or k_offset:  # 0 is the library's default
        check_int("k_offset", k_offset)
        texts["k_offset"] = text("k_offset", k_offset)
    if q_offset is not None:
        check_int("q_offset", q_offset)
        texts["q_offset"] = text("q_offset", q_offset)
    if scale is not None:
        texts["scale"] = text("scale", scale)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad or
                                    any(t.requires_grad for t in tensors.values())):
        names = list(tensors)
        out, lse = _AttentionFn.apply(encoding, texts, names, q, k, v, *[tensors[n] for n in names])
    else:  # nothing to differentiate (inference, a decode step): no autograd node
        out, lse = _C.attention_forward(q, k, v, encoding, texts, tensors, return_lse)
    return (out, lse) if return_lse else out


class _BiasFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, call, names, *tensors):
        ctx.call, ctx.names = call, names
        ctx.save_for_backward(*tensors)
        return _C.bias(*call, dict(zip(names, tensors)))

    @staticmethod
    @once_differentiable
    def backward(ctx, dbias):
        tensors = ctx.saved_tensors
        learned = learned_tensors(ctx.call[0])
        grad_names = [n for i, n in enumerate(ctx.names) if ctx.needs_input_grad[2 + i] and n in learned]
        if not grad_names:  # only tensors without a gradient (alibi's given slopes) asked for one
            return (None, None, *[None for _ in ctx.names])
        grads = _C.bias_backward(*ctx.call, dict(zip(ctx.names, tensors)), dbias, grad_names)
        return (None, None, *[grads.get(n) for n in ctx.names])


def bias(encoding, heads, q_len, k_len, *, causal=False, q_offset=None, k_offset=0, **params):
    """The logit bias [heads, q_len, k_len] of alibi, t5, kerple, sandwich or fire; query i at q_offset + i
    (default k_offset + k_len − q_len), key j at k_offset + j; −inf where masked (causal, or a head that
    may not look). Differentiable in the learned tensors."""
    if not isinstance(encoding, str):
        raise TypeError(f"encoding: expected a name (str), got {type(encoding).__name__}")
    for name, value in (("heads", heads), ("q_len", q_len), ("k_len", k_len), ("k_offset", k_offset)):
        check_int(name, value)
    check_int("q_offset", q_offset, optional=True)
    check_bool("causal", causal)
    q_off = k_offset + k_len - q_len if q_offset is None else q_offset
    texts, tensors = split_params(encoding, params)
    names = list(tensors)
    call = (encoding, heads, q_len, k_len, q_off, k_offset, causal, texts)
    return _BiasFn.apply(call, names, *[tensors[n] for n in names])
