"""RoPE, sinusoidal PE and config.json reading, with autograd."""
import json

import torch
from torch.autograd.function import once_differentiable

from . import _C
from ._common import check_bool, check_int, check_tensor, config_text, text

# Hugging Face rope_scaling fields and the RopeParams keys they set.
_SCALING_KEYS = {
    "rope_type": "rope_type", "type": "rope_type", "factor": "factor",
    "original_max_position_embeddings": "original_max_position", "beta_fast": "beta_fast",
    "beta_slow": "beta_slow", "truncate": "truncate", "mscale": "mscale", "mscale_all_dim": "mscale_all_dim",
    "low_freq_factor": "low_freq_factor", "high_freq_factor": "high_freq_factor",
    "short_factor": "short_factor", "long_factor": "long_factor", "attention_factor": "attention_factor",
}


def rope_params(layout=None, rotary_dim=None, theta=10000.0, scaling=None, config=None, seq_len=None,
                angles="accurate"):
    """(keys as text, config.json text or "") for _C.rope."""
    params = {}
    cfg = ""
    if config is not None:
        for name, value, default in (("theta", theta, 10000.0), ("scaling", scaling, None),
                                     ("rotary_dim", rotary_dim, None)):
            if value != default:
                raise ValueError(f"{name}: given with config (the config sets it)")
        cfg = config_text(config)
    else:
        params["theta"] = text("theta", theta)
        if rotary_dim is not None:
            check_int("rotary_dim", rotary_dim)
            params["rotary_dim"] = text("rotary_dim", rotary_dim)
        if scaling is not None:
            if not isinstance(scaling, dict):
                raise TypeError(f"scaling: expected a rope_scaling dict, got {type(scaling).__name__}")
            for k, v in scaling.items():
                if k not in _SCALING_KEYS:
                    raise ValueError(f"scaling.{k}: not a rope_scaling field posenc reads (known: "
                                     + ", ".join(sorted(_SCALING_KEYS)) + ")")
                name = _SCALING_KEYS[k]
                params[name] = "longrope" if name == "rope_type" and v == "su" else text(f"scaling.{k}", v)
    if layout is not None:  # else the config's layout, or the library's default: half
        params["layout"] = text("layout", layout)
    params["angles"] = text("angles", angles)
    if seq_len is not None:
        check_int("seq_len", seq_len)
        params["seq_len"] = text("seq_len", seq_len)
    return params, cfg


class _RopeFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, positions, offset, params, cfg, inplace):
        ctx.rope = (positions, offset, params, cfg)
        ctx.has_k = k is not None
        q_out, k_out = _C.rope(q, k, positions, offset, params, cfg, False, inplace)
        if inplace:
            ctx.mark_dirty(*([q, k] if k is not None else [q]))
        return (q_out, k_out) if k is not None else q_out

    @staticmethod
    @once_differentiable
    def backward(ctx, dq, dk=None):
        positions, offset, params, cfg = ctx.rope
        if ctx.has_k and (dq is None or dk is None):
            raise RuntimeError("posenc.rope_qk: the backward needs the gradients of both outputs")
        dq, dk = _C.rope(dq, dk if ctx.has_k else None, positions, offset, params, cfg, True, False)
        return dq, dk, None, None, None, None, None


def _positions(positions, offset):
    check_tensor("positions", positions, positions=True, optional=True)
    check_int("offset", offset)
    return positions


def rope(x, positions=None, *, offset=0, layout=None, rotary_dim=None, theta=10000.0, scaling=None, config=None,
         seq_len=None, angles="accurate", inplace=False):
    """Rotates x [B, L, H, D] by RoPE at positions (int [L] or [B, L]) + offset, or offset + l.

    layout: "half" (pairs k, k + r/2; the default) or "interleaved" (pairs 2k, 2k + 1); with config the
    config's layout (half, interleaved for DeepSeek's rope_interleave) unless given. scaling: a Hugging
    Face rope_scaling dict; config: a config.json (dict or path) instead of theta/scaling/rotary_dim.
    Differentiable in x (the backward applies R(-m)).
    """
    check_tensor("x", x)
    check_bool("inplace", inplace)
    params, cfg = rope_params(layout, rotary_dim, theta, scaling, config, seq_len, angles)
    try:
        return _RopeFn.apply(x, None, _positions(positions, offset), offset, params, cfg, inplace)
    except ValueError as e:  # the extension names x q (and, in place, q_out)
        message = str(e)
        for name in ("q: ", "q_out: "):
            if message.startswith(name):
                raise ValueError("x: " + message[len(name):]) from None
        raise


def rope_qk(q, k, positions=None, *, offset=0, layout=None, rotary_dim=None, theta=10000.0, scaling=None,
            config=None, seq_len=None, angles="accurate", inplace=False):
    """Rotates q [B, L, Hq, D] and k [B, L, Hk, D] in one pass (as rope); returns (q_rot, k_rot)."""
    check_tensor("q", q)
    check_tensor("k", k)
    check_bool("inplace", inplace)
    params, cfg = rope_params(layout, rotary_dim, theta, scaling, config, seq_len, angles)
    return _RopeFn.apply(q, k, _positions(positions, offset), offset, params, cfg, inplace)


def rope_config(config, seq_len=None):
    """A config.json's RoPE (dict or path) as `posenc rope-config` prints it; inv_freq a float64 tensor,
    inv_freq_hf a float32 tensor (transformers' float32 values)."""
    check_int("seq_len", seq_len, optional=True)
    try:
        out = json.loads(_C.rope_config(config_text(config), 0 if seq_len is None else seq_len))
    except ValueError as e:  # a field of the config is named after it, as rope(config=...) names it
        message = str(e)
        if message.startswith(("config", "seq_len")):
            raise
        raise ValueError("config: " + message) from None
    out["inv_freq"] = torch.tensor(out["inv_freq"], dtype=torch.float64)
    out["inv_freq_hf"] = torch.tensor(out["inv_freq_hf"], dtype=torch.float32)
    return out


class _SinusoidalFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, positions, offset, base):
        ctx.args = (positions, offset, base)
        return _C.sinusoidal(x, positions, offset, base, False)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        positions, offset, base = ctx.args
        return _C.sinusoidal(dy, positions, offset, base, True), None, None, None


def sinusoidal(x, positions=None, *, offset=0, base=10000.0):
    """x [B, L, D] + PE(positions), PE[p, 2i] = sin(p / base^(2i/D)), PE[p, 2i+1] = cos(...)."""
    check_tensor("x", x)
    if isinstance(base, bool) or not isinstance(base, (int, float)):
        raise TypeError(f"base: expected a number, got {type(base).__name__}")
    return _SinusoidalFn.apply(x, _positions(positions, offset), offset, float(base))
