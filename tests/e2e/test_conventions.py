#!/usr/bin/python3
"""One set of conventions on every surface (docs/conventions.md), end to end.

    /usr/bin/python3 tests/e2e/test_conventions.py --posenc PATH/TO/posenc [--seeds DIR] [-k NAME]

Checked:
  * alignment: posenc bias puts M queries at the last M of N key positions (q_offset = k_offset +
    N - M) as posenc attention does; for every bias encoding and variant, M < N, M = N, M > N,
    causal or not, with and without --q-offset / --k-offset, the bias posenc bias writes is the bias
    posenc attention adds: with q = 0 the logits are the bias alone, v = one-hot rows give the
    softmax P [M, N] and --lse the row's log-sum-exp, so log P + lse recovers the bias, and the
    masked entries (-inf) are exactly those of P = 0. ALiBi's bias is also checked against its
    formula with the alignment written here, and --causal's gradient against dB masked by hand;
  * layout: apply rope, rope2d, mrope and xpos without --layout equal --layout half, and rope's
    default equals numpy's rotate_half (transformers' form) and differs from interleaved;
  * M-RoPE configs: rope-config of a Qwen2-VL-7B-like config prints mrope_section, theta, head_dim;
    apply mrope --config against M-RoPE written here (transformers' apply_multimodal_rotary_pos_emb:
    cat(freqs, freqs) split by mrope_section * 2); "rope_type": "mrope" and Qwen2.5-VL's "default"
    with a section read alike; --mrope-section or --theta beside --config refused; a config without
    a section refused for mrope;
  * configs of models without RoPE (BERT, GPT-2): rope-config, apply rope --config, attention rope
    --config: one stderr line naming the argument, "this model has no rotary embedding (model_type
    bert)", exit 2.

Each case prints one line (PASS/FAIL); the last line is exactly "N passed, M failed"; exit 1 if any
case failed, 77 (skip) when numpy is missing.
"""
import json
import os
import sys

from harness import case, close, expect_error, load, main, run, skip

try:
    import numpy as np
except ImportError:
    skip("numpy is not importable by this python")

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "rope")
RNG = np.random.default_rng(20251125)
H = 4  # heads of every bias case


# ------------------------------------------------------------------------------------------------
# The bias encodings and their parameters (one set per variant)
# ------------------------------------------------------------------------------------------------

def bias_variants(d):
    """[(name, [flags])] covering every bias encoding and variant."""
    w_alibi = d.save("w_alibi.npy", RNG.standard_normal((2, H)))
    w_t5 = d.save("w_t5.npy", RNG.standard_normal((8, H)))
    r1 = d.save("r1.npy", RNG.uniform(0.2, 1.5, H))
    r2 = d.save("r2.npy", RNG.uniform(0.2, 1.5, H))
    W = 5
    fire = ["--mlp-w1", d.save("w1.npy", RNG.standard_normal(W)),
            "--mlp-b1", d.save("b1.npy", RNG.standard_normal(W)),
            "--mlp-w2", d.save("w2.npy", RNG.standard_normal((H, W))),
            "--mlp-b2", d.save("b2.npy", RNG.standard_normal(H)),
            "--c", d.save("c.npy", np.array([0.7])), "--threshold", d.save("L.npy", np.array([3.0]))]
    return [
        ("alibi", ["--variant", "symmetric"]),
        ("alibi", ["--variant", "nonsymmetric"]),
        ("alibi", ["--variant", "learned", "--weights", w_alibi]),
        ("t5", ["--num-buckets", 8, "--max-distance", 16, "--weights", w_t5]),
        ("t5", ["--num-buckets", 8, "--max-distance", 16, "--bidirectional", "false", "--weights", w_t5]),
        ("kerple", ["--kernel", "log", "--r1", r1, "--r2", r2]),
        ("kerple", ["--kernel", "power", "--r1", r1, "--r2", r2]),
        ("sandwich", ["--sinusoid-dim", 16]),
        ("fire", fire),
    ]


# (M, N) and the offsets: none (the default alignment), --k-offset only, both
SHAPES = [(3, 7), (5, 5), (7, 3)]
OFFSETS = [[], ["--k-offset", 4], ["--q-offset", 2, "--k-offset", 5], ["--q-offset", 9]]


def attention_bias(d, enc, flags, M, N, geo):
    """The bias posenc attention adds, recovered as log P + lse from q = 0 and one-hot v.
    Returns (bias [H, M, N] with -inf where P = 0, lse [H, M])."""
    D = max(N, 2)
    q = np.zeros((1, M, H, D))
    k = RNG.standard_normal((1, N, H, D))
    v = np.zeros((1, N, H, D))
    for j in range(N):
        v[0, j, :, j] = 1.0
    run("attention", enc, "--q", d.save("q.npy", q), "--k", d.save("k.npy", k), "--v", d.save("v.npy", v),
        "--out", d.out("o.npy"), "--lse", d.out("lse.npy"), *geo, *flags)
    o, lse = load(d.out("o.npy")), load(d.out("lse.npy"))
    p = np.transpose(o[0, :, :, :N], (1, 0, 2))  # [H, M, N]
    with np.errstate(divide="ignore"):
        b = np.log(p) + lse[0][:, :, None]
    b[p == 0] = -np.inf
    return b, lse[0]


@case("posenc bias = the bias posenc attention adds: every bias encoding, M <>= N, causal, offsets")
def bias_equals_attention(d):
    n = 0
    for enc, flags in bias_variants(d):
        for M, N in SHAPES:
            for causal in (False, True):
                for off in OFFSETS:
                    geo = off + (["--causal"] if causal else [])
                    what = f"{enc} {flags[:2]} M={M} N={N} {geo}"
                    run("bias", enc, "--heads", H, "--q-len", M, "--k-len", N, *geo, *flags, "--out", d.out("b.npy"))
                    b = load(d.out("b.npy"))
                    assert b.shape == (H, M, N) and b.dtype == np.float64, (what, b.shape, b.dtype)
                    a, lse = attention_bias(d, enc, flags, M, N, geo)
                    masked = np.isneginf(b)
                    assert np.array_equal(masked, np.isneginf(a)), f"{what}: masks differ\n{masked}\n{np.isneginf(a)}"
                    assert np.array_equal(masked.all(axis=2), np.isneginf(lse)), f"{what}: fully masked rows"
                    ok = ~masked
                    err = np.abs(a[ok] - b[ok]) / (1 + np.abs(b[ok]))
                    assert err.size == 0 or err.max() <= 1e-9, f"{what}: max rel err {err.max()}"
                    n += 1
    return f"{n} combinations"


@case("posenc bias: default q_offset = k_offset + N - M and --causal against ALiBi's formula")
def bias_alignment_formula(d):
    slopes = np.array([2.0 ** (-8 * (h + 1) / H) for h in range(H)])
    for M, N in SHAPES:
        for ko in (0, 3):
            for causal in (False, True):
                geo = (["--k-offset", ko] if ko else []) + (["--causal"] if causal else [])
                run("bias", "alibi", "--heads", H, "--q-len", M, "--k-len", N, *geo, "--out", d.out("b.npy"))
                got = load(d.out("b.npy"))
                qp = ko + N - M + np.arange(M)  # the queries: the last M key positions
                kp = ko + np.arange(N)
                want = -slopes[:, None, None] * np.abs(qp[:, None] - kp[None, :])[None]
                if causal:
                    want = np.where((kp[None, :] > qp[:, None])[None], -np.inf, want)
                assert np.array_equal(np.isneginf(got), np.isneginf(want)), (M, N, ko, causal)
                fin = np.isfinite(want)
                close(got[fin], want[fin], f"alibi M={M} N={N} k_offset={ko} causal={causal}", atol=1e-12)
                # the default equals the explicit offset
                run("bias", "alibi", "--heads", H, "--q-len", M, "--k-len", N, *geo, "--q-offset", ko + N - M,
                    "--out", d.out("e.npy"))
                assert np.array_equal(load(d.out("e.npy")), got), (M, N, ko, causal)
    # with q_offset = 0 given, query 0 sits at key 0 (M < N): the bias differs from the default
    run("bias", "alibi", "--heads", H, "--q-len", 2, "--k-len", 5, "--q-offset", 0, "--out", d.out("z.npy"))
    run("bias", "alibi", "--heads", H, "--q-len", 2, "--k-len", 5, "--out", d.out("y.npy"))
    assert not np.array_equal(load(d.out("z.npy")), load(d.out("y.npy")))


@case("posenc bias --causal: the gradient of a learned bias sees only the unmasked entries of dB")
def bias_causal_gradient(d):
    M, N = 4, 6
    w = d.save("w.npy", RNG.standard_normal((8, H)))
    db = RNG.standard_normal((H, M, N))
    qp = N - M + np.arange(M)
    mask = (np.arange(N)[None, :] > qp[:, None])[None]
    flags = ["--num-buckets", 8, "--weights", w, "--heads", H, "--q-len", M, "--k-len", N]
    run("bias", "t5", *flags, "--causal", "--out", d.out("b.npy"), "--grad-out", d.save("db.npy", db),
        "--grad-weights", d.out("dw.npy"))
    run("bias", "t5", *flags, "--out", d.out("b2.npy"), "--grad-out", d.save("dbm.npy", np.where(mask, 0.0, db)),
        "--grad-weights", d.out("dw2.npy"))
    close(load(d.out("dw.npy")), load(d.out("dw2.npy")), "t5 dW with --causal", atol=1e-12)
    assert np.abs(load(d.out("dw.npy"))).max() > 0


# ------------------------------------------------------------------------------------------------
# Layout: half by default
# ------------------------------------------------------------------------------------------------

def rotate_half_rope(x, pos, theta=10000.0):
    """transformers' form: x·cos + rotate_half(x)·sin, cos/sin of cat(freqs, freqs)."""
    D = x.shape[-1]
    inv = 1.0 / theta ** (np.arange(0, D, 2) / D)
    f = np.outer(pos, inv)
    emb = np.concatenate([f, f], axis=-1)[None, :, None, :]
    rh = np.concatenate([-x[..., D // 2:], x[..., : D // 2]], axis=-1)
    return x * np.cos(emb) + rh * np.sin(emb)


@case("layout: apply rope, rope2d, mrope, xpos without --layout = --layout half (rope: numpy rotate_half)")
def layout_default_half(d):
    B, L, Hh, D = 1, 6, 2, 8
    x = RNG.standard_normal((B, L, Hh, D))
    xp = d.save("x.npy", x)
    run("apply", "rope", "--in", xp, "--offset", 3, "--out", d.out("def.npy"))
    run("apply", "rope", "--in", xp, "--offset", 3, "--layout", "half", "--out", d.out("half.npy"))
    run("apply", "rope", "--in", xp, "--offset", 3, "--layout", "interleaved", "--out", d.out("il.npy"))
    got = load(d.out("def.npy"))
    assert np.array_equal(got, load(d.out("half.npy")))
    close(got, rotate_half_rope(x, 3 + np.arange(L)), "rope default vs rotate_half", atol=1e-12)
    assert np.abs(got - load(d.out("il.npy"))).max() > 1e-2, "half and interleaved should differ"
    p2 = d.save("p2.npy", RNG.integers(0, 5, (2, L)))
    p3 = d.save("p3.npy", RNG.integers(0, 5, (3, L)))
    for enc, extra in (("rope2d", ["--positions", p2]), ("mrope", ["--positions", p3, "--mrope-section", "2,1,1"]),
                       ("xpos", ["--role", "key"])):
        run("apply", enc, "--in", xp, *extra, "--out", d.out("a.npy"))
        run("apply", enc, "--in", xp, *extra, "--layout", "half", "--out", d.out("b.npy"))
        run("apply", enc, "--in", xp, *extra, "--layout", "interleaved", "--out", d.out("c.npy"))
        assert np.array_equal(load(d.out("a.npy")), load(d.out("b.npy"))), enc
        assert not np.array_equal(load(d.out("a.npy")), load(d.out("c.npy"))), enc
    # list --json names half as the default of every rotary encoding's --layout
    for e in json.loads(run("list", "--json").stdout):
        for p in e["params"]:
            if p["name"] == "layout":
                assert p["default"] == "half", (e["name"], p)


# ------------------------------------------------------------------------------------------------
# M-RoPE configs
# ------------------------------------------------------------------------------------------------

def mrope_hf(x, pos, section, theta):
    """transformers' Qwen2-VL apply_multimodal_rotary_pos_emb, written for one sequence: pos [3, L];
    freqs per row, cat(freqs, freqs), split by mrope_section * 2, chunk i from row i % 3."""
    D = x.shape[-1]
    inv = 1.0 / theta ** (np.arange(0, D, 2, dtype=np.float64) / D)
    freqs = pos.astype(np.float64)[:, :, None] * inv[None, None, :]  # [3, L, D/2]
    emb = np.concatenate([freqs, freqs], axis=-1)  # [3, L, D]
    cut = np.cumsum(section * 2)[:-1]
    chunks = np.split(emb, cut, axis=-1)
    ang = np.concatenate([c[i % 3] for i, c in enumerate(chunks)], axis=-1)[None, :, None, :]  # [1, L, 1, D]
    rh = np.concatenate([-x[..., D // 2:], x[..., : D // 2]], axis=-1)
    return x * np.cos(ang) + rh * np.sin(ang)


@case("rope-config and apply mrope --config: Qwen2-VL-7B-like config against transformers' M-RoPE")
def mrope_config(d):
    path = os.path.join(DATA, "qwen2-vl-7b.json")
    o = json.loads(run("rope-config", path).stdout)
    assert o["mrope_section"] == [16, 24, 24], o
    assert (o["rope_type"], o["layout"], o["head_dim"], o["rotary_dim"], o["theta"]) == \
        ("default", "half", 128, 128, 1e6), o
    assert o["model_type"] == "qwen2_vl" and o["max_position_embeddings"] == 32768, o
    close(np.array(o["inv_freq"]), 1.0 / 1e6 ** (np.arange(0, 128, 2) / 128), "inv_freq", atol=0, rtol=1e-14)
    L = 9
    x = RNG.standard_normal((1, L, 2, 128))
    # a text run, then a 1 x 2 x 3 grid, as get_rope_index builds them
    pos = np.array([[0, 1, 2, 3, 3, 3, 3, 3, 3], [0, 1, 2, 3, 3, 3, 4, 4, 4], [0, 1, 2, 3, 4, 5, 3, 4, 5]])
    want = mrope_hf(x, pos, [16, 24, 24], 1e6)
    xp, pp = d.save("x.npy", x), d.save("p.npy", pos)
    run("apply", "mrope", "--config", path, "--in", xp, "--positions", pp, "--out", d.out("y.npy"))
    close(load(d.out("y.npy")), want, "apply mrope --config", atol=1e-12)
    # the same as the flags the config stands for
    run("apply", "mrope", "--mrope-section", "16,24,24", "--theta", 1e6, "--in", xp, "--positions", pp,
        "--out", d.out("z.npy"))
    assert np.array_equal(load(d.out("y.npy")), load(d.out("z.npy")))
    # "rope_type": "mrope", and Qwen2.5-VL's saved form ("default" with mrope_section), read alike
    cfg = json.load(open(path))
    for sc in ({"rope_type": "mrope", "mrope_section": [16, 24, 24]},
               {"type": "default", "rope_type": "default", "mrope_section": [16, 24, 24]}):
        c = dict(cfg, rope_scaling=sc)
        p2 = d.write("c.json", json.dumps(c))
        assert json.loads(run("rope-config", p2).stdout)["mrope_section"] == [16, 24, 24], sc
        run("apply", "mrope", "--config", p2, "--in", xp, "--positions", pp, "--out", d.out("w.npy"))
        assert np.array_equal(load(d.out("w.npy")), load(d.out("y.npy"))), sc
    # attention mrope --config takes it too (q and k rotated as above): compare with flags
    q, k, v = (RNG.standard_normal((1, L, 2, 128)) for _ in range(3))
    args = ["attention", "mrope", "--q", d.save("q.npy", q), "--k", d.save("k.npy", k), "--v", d.save("v.npy", v),
            "--q-positions", pp, "--k-positions", pp, "--causal"]
    run(*args, "--config", path, "--out", d.out("o1.npy"))
    run(*args, "--mrope-section", "16,24,24", "--theta", 1e6, "--out", d.out("o2.npy"))
    assert np.array_equal(load(d.out("o1.npy")), load(d.out("o2.npy")))
    # flags the config sets are refused beside it; a config without a section is not M-RoPE
    o_ = d.out("bad.npy")
    expect_error(["apply", "mrope", "--config", path, "--mrope-section", "16,24,24", "--in", xp, "--positions", pp,
                  "--out", o_], "--mrope-section", [o_])
    expect_error(["apply", "mrope", "--config", path, "--theta", 10000, "--in", xp, "--positions", pp, "--out", o_],
                 "--theta", [o_])
    line = expect_error(["apply", "mrope", "--config", os.path.join(DATA, "llama-3.1-8b.json"), "--in", xp,
                         "--positions", pp, "--out", o_], "--config", [o_])
    assert "mrope_section" in line, line
    expect_error(["apply", "mrope", "--config", path, "--in", d.save("x64.npy", x[..., :64]), "--positions", pp,
                  "--out", o_], "--in", [o_])
    bad = d.write("bad.json", json.dumps(dict(cfg, rope_scaling={"type": "mrope", "mrope_section": [16, 24, 20]})))
    line = expect_error(["rope-config", bad], "rope_scaling.mrope_section")
    assert "64" in line, line
    bad = d.write("bad2.json", json.dumps(dict(cfg, rope_scaling={"type": "mrope"})))
    expect_error(["rope-config", bad], "rope_scaling.mrope_section")


# ------------------------------------------------------------------------------------------------
# Models without RoPE
# ------------------------------------------------------------------------------------------------

@case("configs without rotary embeddings (BERT, GPT-2): one error line naming the argument")
def no_rotary(d):
    x = d.save("x.npy", RNG.standard_normal((1, 3, 2, 64)))
    o = d.out("y.npy")
    for name, mt in (("bert-base.json", "bert"), ("gpt2.json", "gpt2")):
        path = os.path.join(DATA, name)
        want = f"this model has no rotary embedding (model_type {mt})"
        line = expect_error(["rope-config", path], "CONFIG")
        assert want in line and line.startswith("posenc: CONFIG: "), line
        line = expect_error(["apply", "rope", "--config", path, "--in", x, "--out", o], "--config", [o])
        assert want in line and line.startswith("posenc: --config: "), line
        line = expect_error(["attention", "rope", "--config", path, "--q", x, "--k", x, "--v", x, "--out", o],
                            "--config", [o])
        assert want in line, line
    # position_embedding_type decides for a model type not in the list; "rotary" models are read
    p = d.write("abs.json", json.dumps({"model_type": "somebert", "position_embedding_type": "relative_key",
                                        "hidden_size": 64, "num_attention_heads": 2}))
    line = expect_error(["rope-config", p], "CONFIG")
    assert "no rotary embedding (model_type somebert, position_embedding_type relative_key)" in line, line
    p = d.write("rot.json", json.dumps({"model_type": "esm", "position_embedding_type": "rotary",
                                        "rope_theta": 10000.0, "hidden_size": 64, "num_attention_heads": 2}))
    assert json.loads(run("rope-config", p).stdout)["rotary_dim"] == 32


if __name__ == "__main__":
    sys.exit(main(folder="dir"))
