#!/usr/bin/python3
"""RoPE of released models end to end: posenc rope-config / table rope / apply / attention --config.

    /usr/bin/python3 tests/e2e/test_rope_config.py --posenc PATH/TO/posenc [--articles DIR] [-k NAME]

The oracle is written here from the facts of Hugging Face transformers 4.56 (modeling_rope_utils.py
after PR #40320, and the config classes of Llama, Qwen2, DeepSeek-V3, Phi-3 and GPT-NeoX), as
PyTorch tensors: in float32 exactly as transformers evaluates them (its inv_freq, operation order
included), and the same formulas in float64 (the exact values). The configs are the hand-written
copies of published config.json files in tests/data/rope/. Checked:
  * rope-config: rotary_dim, attention_factor (<= 1e-6) and inv_freq against transformers' float32
    (<= 2e-6 relative) and against float64 (<= 1e-12); inv_freq_hf against transformers' float32
    values (at most one float32 ulp apart, the exact-match count reported);
  * hf angles: posenc table rope --angles hf equals inv_freq[None, :, None].float() @
    position_ids[:, None, :].float() bit for bit, at positions 1e5 .. 4e6 and around 2^24;
  * accurate angles: within 1e-6 rad of long-double angles at 1e5 .. 4e6 and 2^24, in the table and
    through the fast float32 path of posenc apply;
  * apply and attention --config against numpy (rotate_half or interleaved pairs, cos and sin times
    the attention factor);
  * bad configs and flags: exit 2, one stderr line naming the field or flag, no output written.

Each case prints one line (PASS/FAIL); the last line is exactly "N passed, M failed"; exit 1 if any
case failed, 77 (skip) when numpy or torch is missing.
"""
import json
import math
import os
import sys

from harness import case, expect_error, main, run, skip

try:
    import numpy as np
except ImportError:
    skip("numpy is not importable by this python")
try:
    import torch
except ImportError:
    skip("torch is not importable by this python")

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "rope")
RNG = np.random.default_rng(20250830)
torch.set_num_threads(1)


def config(name):
    path = os.path.join(DATA, name)
    with open(path) as f:
        return path, json.load(f)


def rope_config(path, seq_len=None):
    args = ["rope-config", path] + (["--seq-len", seq_len] if seq_len is not None else [])
    return json.loads(run(*args).stdout)


# ------------------------------------------------------------------------------------------------
# The oracle: transformers 4.56's RoPE parameters, written from its code's facts.
# ------------------------------------------------------------------------------------------------

def hf_geometry(cfg):
    """(theta, head_dim, dim, rope_type, rope_scaling) as transformers' config classes give them."""
    mt = cfg.get("model_type")
    if mt == "gpt_neox":  # GPTNeoXConfig: rope_theta = rotary_emb_base, partial_rotary_factor = rotary_pct
        theta, prf = cfg["rotary_emb_base"], cfg["rotary_pct"]
    else:
        theta, prf = cfg["rope_theta"], cfg.get("partial_rotary_factor", 1.0)
    if mt == "deepseek_v3":  # DeepseekV3Config: head_dim = qk_rope_head_dim
        head_dim = cfg["qk_rope_head_dim"]
    else:
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    dim = int(head_dim * prf)
    rs = cfg.get("rope_scaling")
    rope_type = "default" if rs is None else rs.get("rope_type", rs.get("type"))
    if mt == "phi3" and rope_type in ("su", "yarn"):  # Phi3Config's backward compatibility
        rope_type = "longrope"
    return theta, head_dim, dim, rope_type, rs


def hf_rope(cfg, seq_len=None, dtype=torch.float32):
    """transformers' (inv_freq, attention_factor) for a call of length seq_len (None: at init).
    dtype float32 is transformers itself; float64 is the same formula's exact value."""
    theta, head_dim, dim, rope_type, rs = hf_geometry(cfg)
    max_pos = cfg.get("max_position_embeddings")

    def arange_over_dim():
        return torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=dtype) / dim

    def default_inv(base):
        return 1.0 / (base ** arange_over_dim())

    af = 1.0
    if rope_type == "default":
        inv = default_inv(theta)
    elif rope_type == "linear":
        inv = default_inv(theta)
        inv /= rs["factor"]
    elif rope_type == "dynamic":
        factor = rs["factor"]
        if seq_len is None or seq_len <= max_pos:
            # inside the window the forward's update never recomputes: the values of __init__
            base = theta * ((factor * max_pos / max_pos) - (factor - 1)) ** (dim / (dim - 2))
            inv = default_inv(base)
        else:
            # the forward's update: seq_len = torch.max(position_ids) + 1, an int64 tensor
            sl = torch.maximum(torch.tensor(seq_len), torch.tensor(max_pos))
            if dtype == torch.float64:
                sl = sl.to(torch.float64)
            base = theta * ((factor * sl / max_pos) - (factor - 1)) ** (dim / (dim - 2))
            inv = 1.0 / (base ** arange_over_dim())
    elif rope_type == "yarn":
        factor = rs["factor"]  # >= 4.56: the explicit factor
        original = rs.get("original_max_position_embeddings") or max_pos
        mscale, mscale_all_dim = rs.get("mscale"), rs.get("mscale_all_dim")

        def get_mscale(scale, m=1):
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        af = rs.get("attention_factor")
        if af is None:
            af = get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim) if mscale and mscale_all_dim \
                else get_mscale(factor)
        beta_fast, beta_slow = rs.get("beta_fast") or 32, rs.get("beta_slow") or 1

        def correction_dim(rot):
            return (dim * math.log(original / (rot * 2 * math.pi))) / (2 * math.log(theta))

        low, high = correction_dim(beta_fast), correction_dim(beta_slow)
        if rs.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001
        ramp = torch.clamp((torch.arange(dim // 2, dtype=dtype) - low) / (high - low), 0, 1)
        pos_freqs = theta ** (torch.arange(0, dim, 2).to(dtype=dtype) / dim)
        extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
        extrapolation_factor = 1 - ramp
        inv = interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor
    elif rope_type == "llama3":
        inv = default_inv(theta)
        factor, low, high = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old = rs["original_max_position_embeddings"]
        low_wl, high_wl = old / low, old / high
        wavelen = 2 * math.pi / inv
        inv_l = torch.where(wavelen > low_wl, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * inv_l / factor + smooth * inv_l
        medium = ~(wavelen < high_wl) * ~(wavelen > low_wl)
        inv = torch.where(medium, smoothed, inv_l)
    elif rope_type == "longrope":
        if "original_max_position_embeddings" in cfg:
            original = cfg["original_max_position_embeddings"]
            factor = max_pos / original
        else:
            original, factor = max_pos, rs.get("factor")
        af = rs.get("attention_factor")
        if af is None:
            af = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
        ext = torch.tensor(rs["long_factor"] if seq_len and seq_len > original else rs["short_factor"], dtype=dtype)
        inv = 1.0 / (ext * theta ** arange_over_dim())
    else:
        raise ValueError(rope_type)
    return inv.to(dtype), float(af), dim, head_dim


def ulps_apart(a32, b32):
    a = np.asarray(a32, dtype=np.float32).view(np.int32).astype(np.int64)
    b = np.asarray(b32, dtype=np.float32).view(np.int32).astype(np.int64)
    return np.abs(a - b)


CONFIGS = [  # (file, call lengths to ask about)
    ("llama-3.1-8b.json", [None]),
    ("qwen2.5-7b-instruct-yarn.json", [None]),
    ("deepseek-v3.json", [None]),
    ("phi-3-128k.json", [None, 4096, 4097, 131072]),
    ("pythia-410m.json", [None]),
    ("codellama-7b.json", [None]),
    ("llama-2-7b-dynamic.json", [None, 1000, 4096, 4097, 10000, 100000]),
    ("llama-2-7b-32k-linear.json", [None]),
    ("gpt-oss-20b.json", [None]),
]
REPORT = []


@case
def rope_config_matches_transformers(d):
    for name, lengths in CONFIGS:
        path, cfg = config(name)
        for n in lengths:
            what = f"{name} seq_len={n}"
            got = rope_config(path, n)
            want32, af, dim, head_dim = hf_rope(cfg, n, torch.float32)
            want64, af64, _, _ = hf_rope(cfg, n, torch.float64)
            assert got["rotary_dim"] == dim, f"{what}: rotary_dim {got['rotary_dim']} != {dim}"
            assert got["head_dim"] == head_dim, f"{what}: head_dim {got['head_dim']} != {head_dim}"
            inv = np.array(got["inv_freq"])
            assert inv.shape == (dim // 2,), f"{what}: {inv.shape}"
            rel32 = np.max(np.abs(inv - want32.double().numpy()) / want32.double().numpy())
            rel64 = np.max(np.abs(inv - want64.numpy()) / want64.numpy())
            assert rel32 <= 2e-6, f"{what}: inv_freq vs transformers' float32: relative error {rel32:.3g}"
            assert rel64 <= 1e-12, f"{what}: inv_freq vs the float64 formula: relative error {rel64:.3g}"
            assert abs(got["attention_factor"] - af) <= 1e-6 * af, f"{what}: attention_factor {got['attention_factor']} != {af}"
            assert af == af64
            hf = np.array(got["inv_freq_hf"])
            assert np.all(hf.astype(np.float32).astype(np.float64) == hf), f"{what}: inv_freq_hf not float32 values"
            apart = ulps_apart(hf, want32.numpy())
            assert apart.max() <= 1, f"{what}: inv_freq_hf {apart.max()} ulps from transformers' float32"
            REPORT.append(f"{what}: inv_freq rel err {rel32:.2g} (float32) {rel64:.2g} (float64); "
                          f"inv_freq_hf equal to transformers' float32 in {int((apart == 0).sum())}/{apart.size}")
    for line in REPORT:
        print("   ", line)


@case
def rope_config_fields(d):
    path, _ = config("deepseek-v3.json")
    o = rope_config(path)
    assert (o["rope_type"], o["layout"], o["rotary_dim"], o["theta"]) == ("yarn", "interleaved", 64, 10000.0), o
    assert o["factor"] == 40 and o["original_max_position"] == 4096 and o["attention_factor"] == 1.0, o
    m = 0.1 * math.log(40) + 1
    assert any(f"{m * m:.6g}" in n for n in o["notes"]), o["notes"]  # DeepSeek's softmax scale factor
    path, _ = config("qwen2.5-7b-instruct-yarn.json")
    o = rope_config(path)
    assert o["layout"] == "half" and o["factor"] == 4.0 and abs(o["attention_factor"] - (1 + 0.1 * math.log(4))) < 1e-15, o
    assert any("explicit factor" in n for n in o["notes"]), o["notes"]
    path, _ = config("phi-3-128k.json")
    assert rope_config(path, 4096)["longrope_factors"] == "short"
    assert rope_config(path, 4097)["longrope_factors"] == "long"
    assert abs(rope_config(path)["attention_factor"] - math.sqrt(17 / 12)) < 1e-15
    path, _ = config("llama-2-7b-dynamic.json")
    assert rope_config(path, 4096)["scaled_theta"] == 10000.0
    assert abs(rope_config(path, 8192)["scaled_theta"] - 10000 * 3 ** (128 / 126)) < 1e-8


# ------------------------------------------------------------------------------------------------
# Angles
# ------------------------------------------------------------------------------------------------

WINDOWS = [100000, 999968, 4000000 - 32, (1 << 24) - 32]


def torch_angles(inv32, first, length):
    """transformers' freqs = inv_freq[None, :, None].float() @ position_ids[:, None, :].float()."""
    pos = torch.arange(first, first + length, dtype=torch.int64)[None, :]
    inv_expanded = inv32[None, :, None].float().expand(1, -1, 1)
    freqs = (inv_expanded.float() @ pos[:, None, :].float()).transpose(1, 2)
    return freqs[0].numpy()  # [length, dim/2] float32


@case
def hf_angles_are_the_float32_matmul_bit_for_bit(d):
    for name in ("llama-3.1-8b.json", "qwen2.5-7b-instruct-yarn.json", "phi-3-128k.json"):
        path, cfg = config(name)
        dim = hf_rope(cfg)[2]
        for first in WINDOWS:
            # posenc's float32 frequencies for this call (longrope: its length picks the list)
            mine32 = torch.tensor(np.array(rope_config(path, first + 64)["inv_freq_hf"], dtype=np.float32))
            inv32 = hf_rope(cfg, first + 64, torch.float32)[0]
            inv_file = d.save("inv.npy", inv32.numpy())
            want = torch_angles(inv32, first, 64)  # transformers' own float32 inv_freq, given outright
            run("table", "rope", "--dim", dim, "--inv-freq", inv_file, "--angles", "hf", "--offset", first,
                "--length", 64, "--out", d.out("a.npy"))
            got = np.load(d.out("a.npy"))
            assert got.dtype == np.float64 and got.shape == want.shape, (got.dtype, got.shape)
            assert np.all(got == want.astype(np.float64)), \
                f"{name} at {first}: {int((got != want).sum())} angles differ from the float32 matmul"
            # posenc's own float32 inv_freq through --config: the same product of its inv_freq_hf
            run("table", "rope", "--config", path, "--angles", "hf", "--offset", first, "--length", 64,
                "--out", d.out("b.npy"))
            got = np.load(d.out("b.npy"))
            assert np.all(got == torch_angles(mine32, first, 64).astype(np.float64)), f"{name} at {first} (--config)"
        # and those angles really are float32-rounded: far from the exact ones at 4e6
        run("table", "rope", "--config", path, "--angles", "hf", "--offset", 4000000 - 32, "--length", 64,
            "--out", d.out("c.npy"))
        exact = np.arange(4000000 - 32, 4000000 + 32, dtype=np.longdouble)[:, None] * \
            hf_rope(cfg, 4000000 + 32, torch.float64)[0].numpy().astype(np.longdouble)[None, :]
        assert np.max(np.abs(np.load(d.out("c.npy")) - exact)) > 1e-2, "hf angles at 4e6 should show float32's rounding"


def exact_angles(cfg, first, length, seq_len=None):
    inv64 = hf_rope(cfg, seq_len, torch.float64)[0].numpy().astype(np.longdouble)
    return np.arange(first, first + length, dtype=np.longdouble)[:, None] * inv64[None, :]


@case
def accurate_angles_within_1e6_rad(d):
    for name in ("llama-3.1-8b.json", "qwen2.5-7b-instruct-yarn.json", "codellama-7b.json", "phi-3-128k.json"):
        path, cfg = config(name)
        _, _, dim, head_dim = hf_rope(cfg)
        worst_table = worst_fast = 0.0
        for first in WINDOWS:
            n = first + 64
            run("table", "rope", "--config", path, "--offset", first, "--length", 64, "--seq-len", n,
                "--out", d.out("a.npy"))
            got = np.load(d.out("a.npy")).astype(np.longdouble)
            worst_table = max(worst_table, float(np.max(np.abs(got - exact_angles(cfg, first, 64, n)))))
            # the fast float32 path: (1, 0) pairs rotate to a·(cos, sin) of the angle
            x = np.zeros((1, 64, 1, head_dim), dtype=np.float32)
            x[..., : dim // 2] = 1.0  # rotate_half layout: pair k = (k, k + dim/2)
            run("apply", "rope", "--config", path, "--in", d.save("x.npy", x), "--offset", first, "--out", d.out("y.npy"))
            y = np.load(d.out("y.npy")).astype(np.float64)
            ang = np.arctan2(y[0, :, 0, dim // 2: dim], y[0, :, 0, : dim // 2])
            diff = np.angle(np.exp(1j * (ang - exact_angles(cfg, first, 64, n).astype(np.float64) % (2 * np.pi))))
            worst_fast = max(worst_fast, float(np.max(np.abs(diff))))
        REPORT.append(f"{name}: accurate angles at 1e5..2^24: table {worst_table:.2g} rad, fast float32 path {worst_fast:.2g} rad")
        print("   ", REPORT[-1])
        assert worst_table <= 1e-6, f"{name}: table angles off by {worst_table}"
        assert worst_fast <= 1e-6, f"{name}: fast path angles off by {worst_fast}"


# ------------------------------------------------------------------------------------------------
# apply and attention --config
# ------------------------------------------------------------------------------------------------

def rotate(x, angles, af, layout, dim):
    """x [B, L, H, D] float64; angles [L, dim/2]: transformers' rotate_half form, or interleaved pairs."""
    c, s = af * np.cos(angles)[None, :, None, :], af * np.sin(angles)[None, :, None, :]
    y = x.copy()
    if layout == "half":
        a, b = x[..., : dim // 2], x[..., dim // 2: dim]
        y[..., : dim // 2], y[..., dim // 2: dim] = a * c - b * s, a * s + b * c
    else:
        a, b = x[..., 0:dim:2], x[..., 1:dim:2]
        y[..., 0:dim:2], y[..., 1:dim:2] = a * c - b * s, a * s + b * c
    return y


@case
def apply_config_matches_numpy_in_both_angle_modes(d):
    for name in ("qwen2.5-7b-instruct-yarn.json", "deepseek-v3.json", "pythia-410m.json", "phi-3-128k.json",
                 "llama-2-7b-dynamic.json"):
        path, cfg = config(name)
        _, _, dim, head_dim = hf_rope(cfg)
        layout = "interleaved" if cfg.get("model_type") == "deepseek_v3" else "half"
        for first, L in ((3, 5), (5000, 7), (3000000, 4)):
            n = first + L
            x = RNG.standard_normal((2, L, 3, head_dim))
            inv32, af, _, _ = hf_rope(cfg, n, torch.float32)
            inv64 = hf_rope(cfg, n, torch.float64)[0].numpy()
            pos = np.arange(first, first + L)
            for angles, want_ang in (("accurate", pos[:, None] * inv64[None, :]),
                                     ("hf", torch_angles(torch.tensor(np.array(rope_config(path, n)["inv_freq_hf"],
                                                                               dtype=np.float32)), first, L).astype(np.float64))):
                run("apply", "rope", "--config", path, "--angles", angles, "--in", d.save("x.npy", x),
                    "--offset", first, "--out", d.out("y.npy"), "--grad-out", d.save("g.npy", x), "--grad-in", d.out("dx.npy"))
                want = rotate(x, want_ang, af, layout, dim)
                got = np.load(d.out("y.npy"))
                tol = 1e-9 if first < 1e6 else 1e-8  # np.cos of an angle near 3e6 vs the library's
                assert np.allclose(got, want, atol=tol, rtol=0), \
                    f"{name} {angles} at {first}: max diff {np.max(np.abs(got - want))}"
                back = rotate(x, -want_ang, af, layout, dim)
                assert np.allclose(np.load(d.out("dx.npy")), back, atol=tol, rtol=0), f"{name} {angles} backward"


@case
def attention_config_matches_numpy(d):
    path, cfg = config("qwen2.5-7b-instruct-yarn.json")
    _, _, dim, D = hf_rope(cfg)
    B, M, N, H = 1, 3, 6, 2
    q, k, v = (RNG.standard_normal((B, L, H, D)) for L in (M, N, N))
    inv64, af, _, _ = hf_rope(cfg, 40006, torch.float64)
    qpos, kpos = np.arange(40003, 40006), np.arange(40000, 40006)
    qr = rotate(q, qpos[:, None] * inv64.numpy()[None, :], af, "half", dim)
    kr = rotate(k, kpos[:, None] * inv64.numpy()[None, :], af, "half", dim)
    logits = np.einsum("bihd,bjhd->bhij", qr, kr) / math.sqrt(D)
    logits = np.where(kpos[None, None, None, :] > qpos[None, None, :, None], -np.inf, logits)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    want = np.einsum("bhij,bjhd->bihd", p, v)
    run("attention", "rope", "--config", path, "--q", d.save("q.npy", q), "--k", d.save("k.npy", k),
        "--v", d.save("v.npy", v), "--k-offset", 40000, "--causal", "--out", d.out("o.npy"))
    got = np.load(d.out("o.npy"))
    assert np.allclose(got, want, atol=1e-10, rtol=1e-9), f"max diff {np.max(np.abs(got - want))}"


@case
def bad_configs_and_flags_name_the_field(d):
    path, cfg = config("llama-3.1-8b.json")

    def variant(**changes):
        c = json.loads(json.dumps(cfg))
        for key, value in changes.items():
            if key.startswith("rs_"):
                if value is None:
                    c["rope_scaling"].pop(key[3:])
                else:
                    c["rope_scaling"][key[3:]] = value
            elif value is None:
                c.pop(key)
            else:
                c[key] = value
        return d.write("bad.json", json.dumps(c))

    expect_error(["rope-config", variant(rs_rope_type="llama4")], "rope_scaling.rope_type")
    expect_error(["rope-config", variant(rs_factor="8")], "rope_scaling.factor")
    expect_error(["rope-config", variant(rs_factor=None)], "rope_scaling.factor")
    expect_error(["rope-config", variant(rs_low_freq_factors=1.0)], "rope_scaling.low_freq_factors")
    expect_error(["rope-config", variant(rs_high_freq_factor=0.5)], "rope_scaling.high_freq_factor")
    expect_error(["rope-config", variant(rope_theta=None)], "rope_theta")
    expect_error(["rope-config", variant(rope_theta=-5)], "rope_theta")
    expect_error(["rope-config", variant(num_attention_heads=0)], "num_attention_heads")
    expect_error(["rope-config", variant(partial_rotary_factor=0.01)], "partial_rotary_factor")  # int(1.28) = 1
    expect_error(["rope-config", variant(rope_local_base_freq=10000.0)], "rope_local_base_freq")
    assert "not valid JSON" in expect_error(["rope-config", d.write("broken.json", "{\"rope_theta\": ")], "CONFIG")
    expect_error(["rope-config", d.out("missing.json")], "CONFIG")
    # a folder, a number beyond double, a head dimension past 2^20, frequencies beyond float32
    expect_error(["rope-config", d.path], "CONFIG")
    assert "given twice" in expect_error(["rope-config", d.write("dup.json", '{"rope_theta": 10000, "head_dim": 8, '
                                                               '"rope_theta": 500000}')], "rope_theta")
    assert "number overflow" in expect_error(["rope-config", d.write("huge.json", '{"rope_theta": 1e400, "head_dim": 8}')], "CONFIG")
    expect_error(["rope-config", variant(head_dim=1 << 32)], "head dimension <= 2^20")
    expect_error(["rope-config", variant(hidden_size=1 << 32, num_attention_heads=1)], "head dimension <= 2^20")
    assert "inv_freq_hf" in expect_error(["rope-config", variant(rope_theta=1e-100, rope_scaling=None)], "theta")
    expect_error(["rope-config", path, "--seq-len", "-3"], "--seq-len")
    x = d.save("x.npy", RNG.standard_normal((1, 2, 1, 64)))
    o = d.out("y.npy")
    expect_error(["apply", "rope", "--config", path, "--in", x, "--out", o], "--in", [o])  # D 64 != 128
    x128 = d.save("x128.npy", RNG.standard_normal((1, 2, 1, 128)))
    expect_error(["apply", "rope", "--config", path, "--theta", 10, "--in", x128, "--out", o], "--theta", [o])
    expect_error(["apply", "rope", "--config", path, "--rope-type", "yarn", "--in", x128, "--out", o], "--rope-type", [o])
    expect_error(["apply", "rope", "--config", variant(rs_factor=-1), "--in", x128, "--out", o], "rope_scaling.factor", [o])
    expect_error(["apply", "rope", "--config", path, "--seq-len", 1, "--in", x128, "--out", o], "--seq-len", [o])
    expect_error(["apply", "rope", "--rope-type", "yarn", "--factor", 4, "--in", x128, "--out", o], "--original-max-position", [o])
    expect_error(["apply", "rope", "--factor", 4, "--in", x128, "--out", o], "--factor", [o])
    expect_error(["apply", "rope", "--rope-type", "longrope", "--original-max-position", 8, "--short-factor",
                  d.save("sf.npy", np.ones(3)), "--long-factor", d.save("lf.npy", np.ones(64)), "--in", x128, "--out", o],
                 "--short-factor", [o])
    expect_error(["apply", "rope", "--angles", "fp32", "--in", x128, "--out", o], "--angles", [o])
    expect_error(["apply", "rope", "--inv-freq", d.save("i2.npy", np.ones((2, 32))), "--in", x128, "--out", o], "--inv-freq", [o])
    q = d.save("q.npy", RNG.standard_normal((1, 2, 2, 64)))
    expect_error(["attention", "rope", "--config", path, "--q", q, "--k", q, "--v", q, "--out", o], "--q", [o])
    expect_error(["table", "rope", "--length", 4, "--out", o], "--dim", [o])
    expect_error(["table", "rope", "--config", path, "--dim", 64, "--length", 4, "--out", o], "--dim", [o])
    expect_error(["table", "rope", "--dim", 8, "--length", 4, "--part", "tan", "--out", o], "--part", [o])
    expect_error(["table", "sinusoidal", "--dim", 8, "--length", 4, "--part", "cos", "--out", o], "--part", [o])


@case
def table_parts_and_flags_without_config(d):
    # --part cos / sin carry the attention factor; yarn from flags equals yarn from a config.
    path, cfg = config("qwen2.5-7b-instruct-yarn.json")
    inv64, af, dim, _ = hf_rope(cfg, None, torch.float64)
    flags = ["--dim", 128, "--theta", 1000000, "--rope-type", "yarn", "--factor", 4, "--original-max-position", 32768]
    run("table", "rope", *flags, "--offset", 7, "--length", 5, "--out", d.out("a.npy"))
    run("table", "rope", "--config", path, "--offset", 7, "--length", 5, "--out", d.out("b.npy"))
    a, b = np.load(d.out("a.npy")), np.load(d.out("b.npy"))
    assert np.array_equal(a, b)
    assert np.allclose(a, np.arange(7, 12)[:, None] * inv64.numpy()[None, :], atol=1e-12, rtol=0)
    run("table", "rope", *flags, "--offset", 7, "--length", 5, "--part", "cos", "--out", d.out("c.npy"))
    run("table", "rope", *flags, "--offset", 7, "--length", 5, "--part", "sin", "--out", d.out("s.npy"))
    assert np.allclose(np.load(d.out("c.npy")), af * np.cos(a), atol=1e-15)
    assert np.allclose(np.load(d.out("s.npy")), af * np.sin(a), atol=1e-15)
    # Pythia rotates a quarter of each head: the rest passes through apply unchanged.
    path, cfg = config("pythia-410m.json")
    x = RNG.standard_normal((1, 3, 2, 64))
    run("apply", "rope", "--config", path, "--in", d.save("x.npy", x), "--out", d.out("y.npy"))
    y = np.load(d.out("y.npy"))
    assert np.array_equal(y[..., 16:], x[..., 16:]) and not np.allclose(y[..., :16], x[..., :16])


if __name__ == "__main__":
    sys.exit(main(folder="dir", prefix="posenc-rope-"))
