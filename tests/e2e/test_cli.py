#!/usr/bin/python3
"""The posenc command end to end: .npy files in, .npy files out, checked against numpy.

    /usr/bin/python3 tests/e2e/test_cli.py --posenc PATH/TO/posenc --articles PATH/TO/shared/seeds [-k NAME]

Every expectation is computed here, independently, in numpy from the formulas in the headers
(include/posenc/*.h): the sinusoid, RoPE in both layouts, the learned table and its scatter-add
gradient, ALiBi's slope rule and its three variants, T5's buckets (float32 log, as Mesh TensorFlow and
Hugging Face), KERPLE's two kernels, Sandwich's sum of cosines, FIRE's MLP on the normalised log
distance, attention with every one of them, and gradients by central differences of a
random-projection loss. Then every class of bad input: non-zero exit (2), exactly one stderr line
"posenc: ..." naming the flag, nothing on stdout, and no output file left behind (nor a temporary).
Each posenc run may take 60 s.

Each case prints one line (PASS/FAIL); the last line is exactly "N passed, M failed"; exit 1 if any
case failed, 77 (skip) when numpy is missing (tests/e2e/harness.py).
"""
import glob
import json
import math
import os
import sys

from harness import ARGS, case, close, expect_error, load, main, numeric_grad, run, skip

try:
    import numpy as np
except ImportError:
    skip("numpy is not importable by this python")

RNG = np.random.default_rng(20240607)


# ------------------------------------------------------------------------------------------------
# numpy references, from the formulas in include/posenc/*.h
# ------------------------------------------------------------------------------------------------

def sinusoid(pos, D, base=10000.0):
    pos = np.asarray(pos, dtype=np.float64)
    i = np.arange(D // 2)
    ang = pos[..., None] / base ** (2.0 * i / D)
    pe = np.zeros(pos.shape + (D,))
    pe[..., 0::2] = np.sin(ang)
    pe[..., 1::2] = np.cos(ang)
    return pe


def expand_pos(pos, B, L):
    pos = np.asarray(pos, dtype=np.int64)
    return np.broadcast_to(pos, (B, L)) if pos.ndim == 1 else pos


def rope(x, pos, theta=10000.0, r=0, layout="half"):
    """x [B, L, H, D]; pos [B, L] (or [L], or [L] per sequence shared)."""
    x = np.asarray(x, dtype=np.float64)
    B, L, H, D = x.shape
    r = r or D
    pos = expand_pos(pos, B, L).astype(np.float64)
    k = np.arange(r // 2)
    ang = pos[..., None] * theta ** (-2.0 * k / r)  # [B, L, r/2]
    c, s = np.cos(ang)[:, :, None, :], np.sin(ang)[:, :, None, :]
    a, b = (2 * k, 2 * k + 1) if layout == "interleaved" else (k, k + r // 2)
    y = x.copy()
    y[..., a] = x[..., a] * c - x[..., b] * s
    y[..., b] = x[..., a] * s + x[..., b] * c
    return y


def alibi_slopes(n):
    """The ALiBi authors' get_slopes (github.com/ofirpress/attention_with_linear_biases)."""
    def pow2(n):
        start = 2 ** (-2 ** -(math.log2(n) - 3))
        return [start * start ** i for i in range(n)]
    if math.log2(n).is_integer():
        return pow2(n)
    c = 2 ** math.floor(math.log2(n))
    return pow2(c) + alibi_slopes(2 * c)[0::2][:n - c]


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def rel(M, N, qo, ko):
    """key − query, [M, N]."""
    return (ko + np.arange(N))[None, :] - (qo + np.arange(M))[:, None]


def alibi_bias(variant, H, M, N, qo=None, ko=0, slopes=None, w=None):
    qo = ko + N - M if qo is None else qo  # attention's alignment: the last M of N positions
    r = rel(M, N, qo, ko).astype(np.float64)
    if variant == "learned":
        past, fut = sigmoid(w[0])[:, None, None], sigmoid(w[1])[:, None, None]
        return np.where(r < 0, past * r, np.where(r > 0, -fut * r, 0.0))
    if variant == "symmetric":
        m = np.asarray(slopes if slopes is not None else alibi_slopes(H))[:, None, None]
        return -m * np.abs(r)[None]
    m = np.asarray(slopes if slopes is not None else alibi_slopes(H // 2) * 2)[:, None, None]
    b = -m * np.abs(r)[None]
    past = np.arange(H)[:, None, None] < H // 2
    allowed = (r == 0) | ((r < 0) & past) | ((r > 0) & ~past)
    return np.where(allowed, b, -np.inf)


def alibi_learned_dw(dB, H, M, N, qo, ko, w):
    r = rel(M, N, qo, ko).astype(np.float64)
    past = (dB * np.where(r < 0, -r, 0)).sum(axis=(1, 2))
    fut = (dB * np.where(r > 0, r, 0)).sum(axis=(1, 2))
    s0, s1 = sigmoid(w[0]), sigmoid(w[1])
    return np.stack([-s0 * (1 - s0) * past, -s1 * (1 - s1) * fut])


def t5_buckets(r, bidirectional=True, num_buckets=32, max_distance=128):
    """Hugging Face T5Attention._relative_position_bucket in numpy, the log term in float32."""
    r = np.asarray(r, dtype=np.int64)
    out = np.zeros_like(r)
    nb = num_buckets
    if bidirectional:
        nb //= 2
        out += (r > 0).astype(np.int64) * nb
        n = np.abs(r)
    else:
        n = -np.minimum(r, 0)
    max_exact = nb // 2
    with np.errstate(divide="ignore"):
        lg = np.log(n.astype(np.float32) / np.float32(max_exact))
    large = max_exact + (lg / np.float32(math.log(max_distance / max_exact)) *
                         np.float32(nb - max_exact)).astype(np.float32)
    large = np.where(n < max_exact, 0, large)  # avoid casting -inf
    large = np.minimum(large.astype(np.int64), nb - 1)
    return out + np.where(n < max_exact, n, large)


def t5_bias(W, M, N, qo=None, ko=0, **p):
    qo = ko + N - M if qo is None else qo  # attention's alignment: the last M of N positions
    bk = t5_buckets(rel(M, N, qo, ko), **p)  # [M, N]
    return np.transpose(W[bk], (2, 0, 1))    # [H, M, N]


def kerple_bias(r1, r2, M, N, qo=None, ko=0, kernel="log"):
    """KERPLE (Chi et al. 2022): −r1·log(1 + r2|m−n|) or −r1·|m−n|^r2, [H, M, N]."""
    qo = ko + N - M if qo is None else qo  # attention's alignment: the last M of N positions
    d = np.abs(rel(M, N, qo, ko)).astype(np.float64)[None]
    r1, r2 = np.asarray(r1, np.float64)[:, None, None], np.asarray(r2, np.float64)[:, None, None]
    return -r1 * (d ** r2) if kernel == "power" else -r1 * np.log(1 + r2 * d)


def sandwich_bias(H, M, N, qo=None, ko=0, sinusoid_dim=128, base=10000.0):
    """Sandwich (Chi et al. 2023): (p_mᵀp_n − d/2)·H/(8(h+1)), p the sinusoid of frequencies base^(−2k/d), k = 1…d/2."""
    qo = ko + N - M if qo is None else qo  # attention's alignment: the last M of N positions
    qp, kp = qo + np.arange(M), ko + np.arange(N)
    w = base ** (-2.0 * np.arange(1, sinusoid_dim // 2 + 1) / sinusoid_dim)
    def emb(pos):
        e = np.zeros((len(pos), sinusoid_dim))
        e[:, 0::2] = np.sin(pos[:, None] * w)
        e[:, 1::2] = np.cos(pos[:, None] * w)
        return e
    ip = emb(qp) @ emb(kp).T - sinusoid_dim / 2
    return np.stack([ip * H / (8.0 * (h + 1)) for h in range(H)])


def fire_bias(mlp_w1, mlp_b1, mlp_w2, mlp_b2, c, threshold, M, N, qo=None, ko=0):
    """FIRE (Li et al. 2023): f(log(c|i−j| + 1)/log(c·max(L, i) + 1)), f = w2·relu(w1 x + b1) + b2, [H, M, N]."""
    qo = ko + N - M if qo is None else qo  # attention's alignment: the last M of N positions
    qp = (qo + np.arange(M)).astype(np.float64)
    d = np.abs(rel(M, N, qo, ko)).astype(np.float64)
    c, L = float(np.asarray(c).reshape(-1)[0]), float(np.asarray(threshold).reshape(-1)[0])
    x = np.log(c * d + 1) / np.log(c * np.maximum(L, qp) + 1)[:, None]
    hid = np.maximum(x[..., None] * np.asarray(mlp_w1, np.float64) + np.asarray(mlp_b1, np.float64), 0.0)
    return np.einsum("mnk,hk->hmn", hid, np.asarray(mlp_w2, np.float64)) + np.asarray(mlp_b2, np.float64)[:, None, None]


def softmax_rows(logits):
    """Softmax over the last axis; a row with every entry −inf gives zeros."""
    mx = np.max(logits, axis=-1, keepdims=True)
    mx = np.where(np.isfinite(mx), mx, 0.0)
    e = np.exp(logits - mx)
    s = e.sum(axis=-1, keepdims=True)
    return np.where(s > 0, e / np.where(s > 0, s, 1.0), 0.0)


def attention(enc, q, k, v, causal=False, scale=None, q_offset=None, k_offset=0, theta=10000.0,
              rotary_dim=0, layout="half", variant="symmetric", slopes=None, weights=None,
              bidirectional=True, num_buckets=32, max_distance=128, u=None, v_bias=None, rel_proj=None,
              table=None, kernel="log", r1=None, r2=None, sinusoid_dim=128, base=10000.0, mlp_w1=None,
              mlp_b1=None, mlp_w2=None, mlp_b2=None, c=None, threshold=None, lse=False):
    q, k, v = (np.asarray(t, dtype=np.float64) for t in (q, k, v))
    B, M, Hq, D = q.shape
    N, Hkv = k.shape[1], k.shape[2]
    g = Hq // Hkv
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    q_offset = k_offset + N - M if q_offset is None else q_offset
    qpos, kpos = q_offset + np.arange(M), k_offset + np.arange(N)
    if enc == "rope":
        q = rope(q, qpos, theta, rotary_dim, layout)
        k = rope(k, kpos, theta, rotary_dim, layout)
    kk, vv = np.repeat(k, g, axis=2), np.repeat(v, g, axis=2)  # query head h reads kv head h // g
    dots = np.einsum("bmhd,bnhd->bhmn", q, kk)
    mask = np.where(kpos[None, :] > qpos[:, None], -np.inf, 0.0) if causal else np.zeros((M, N))
    if enc == "xl":
        delta = qpos[:, None] - kpos[None, :]             # query − key
        R = rel_proj.shape[2]
        s = sinusoid(delta, R)                            # [M, N, R]
        r = np.einsum("hdr,mnr->hmnd", rel_proj, s)       # r_h(δ) [Hq, M, N, D]
        content = np.einsum("bmhd,bnhd->bhmn", q + u[None, None], kk)
        position = np.einsum("bmhd,hmnd->bhmn", q + v_bias[None, None], r)
        logits = (content + position) * scale + mask
    elif enc == "cope":
        a = scale * dots + mask
        gate = np.where(np.isinf(a), 0.0, sigmoid(np.where(np.isinf(a), 0.0, a)))
        p = np.minimum(np.cumsum(gate[..., ::-1], axis=-1)[..., ::-1], table.shape[0] - 1)
        lo = np.floor(p).astype(np.int64)
        hi = np.ceil(p).astype(np.int64)
        frac = p - lo
        qe = np.einsum("bmhd,pd->bhmp", q, table)         # q_i · e[p] for every p
        z = (1 - frac) * np.take_along_axis(qe, lo, axis=-1) + frac * np.take_along_axis(qe, hi, axis=-1)
        logits = a + z
    else:
        logits = scale * dots + mask
        if enc == "alibi":
            logits = logits + alibi_bias(variant, Hq, M, N, q_offset, k_offset, slopes, weights)[None]
        elif enc == "t5":
            logits = logits + t5_bias(weights, M, N, q_offset, k_offset, bidirectional=bidirectional,
                                      num_buckets=num_buckets, max_distance=max_distance)[None]
        elif enc == "kerple":
            logits = logits + kerple_bias(r1, r2, M, N, q_offset, k_offset, kernel)[None]
        elif enc == "sandwich":
            logits = logits + sandwich_bias(Hq, M, N, q_offset, k_offset, sinusoid_dim, base)[None]
        elif enc == "fire":
            logits = logits + fire_bias(mlp_w1, mlp_b1, mlp_w2, mlp_b2, c, threshold, M, N, q_offset, k_offset)[None]
    pr = softmax_rows(logits)
    out = np.einsum("bhmn,bnhd->bmhd", pr, vv)
    if lse:
        with np.errstate(divide="ignore"):
            mx = np.max(logits, axis=-1)
            safe = np.where(np.isfinite(mx), mx, 0.0)
            return out, np.log(np.exp(logits - safe[..., None]).sum(-1)) + safe
    return out


def randn(*shape, dtype=np.float64):
    return RNG.standard_normal(shape).astype(dtype)


# ------------------------------------------------------------------------------------------------
# list, help, tour
# ------------------------------------------------------------------------------------------------

@case
def list_plain_and_json(d):
    plain = run("list").stdout.splitlines()
    items = json.loads(run("list", "--json").stdout)
    names = [e["name"] for e in items]
    assert names[:8] == ["nope", "learned", "sinusoidal", "rope", "alibi", "t5", "xl", "cope"], names
    assert len(plain) == len(items) + 1, plain
    for e, line in zip(items, plain[1:]):
        assert line.split()[0] == e["name"] and line.split()[1] == e["kind"], line
        assert set(e) == {"name", "kind", "summary", "paper", "params"}, e.keys()
        for p in e["params"]:
            assert set(p) == {"name", "type", "default", "choices", "help", "learned"}, p.keys()
    # the columns are aligned: every row's summary starts at the same offset
    col = plain[0].index("SUMMARY")
    assert all(line[col - 2:col] == "  " for line in plain[1:] if len(line) > col), plain
    rope_params = {p["name"]: p for p in items[3]["params"]}
    assert rope_params["layout"]["choices"] == ["half", "interleaved"], rope_params
    assert rope_params["layout"]["default"] == "half", rope_params
    assert rope_params["theta"]["default"] == "10000", rope_params


@case
def help_exits_zero(d):
    for args in (["--help"], ["apply", "--help"], ["attention", "--help"], ["bias", "--help"], ["table", "-h"]):
        r = run(*args)
        assert "Usage" in r.stdout, (args, r.stdout[:200])
    # parameter flags come from the registry, each with its help
    h = run("attention", "--help").stdout
    for flag in ("--rotary-dim", "--layout", "--variant", "--num-buckets", "--v-bias", "--rel-proj",
                 "--grad-weights", "--grad-table", "--grad-u", "--grad-v-bias", "--grad-rel-proj"):
        assert flag in h, flag


@case
def tour_computes_the_examples(d):
    out = run("tour").stdout
    # “三角函数式位置编码” (docs/articles.md): getPositionEncoding(seq_len=4, d=4, n=100)
    want = sinusoid(np.arange(4), 4, 100.0)
    if ARGS.articles and glob.glob(os.path.join(ARGS.articles, "003_*.txt")):
        # the article's own function, read from its file
        text = open(glob.glob(os.path.join(ARGS.articles, "003_*.txt"))[0], encoding="utf-8").read()
        start = text.index("def getPositionEncoding")
        src = text[start:text.index("return P", start) + len("return P")]
        ns = {"np": np}
        exec(src, ns)
        close(ns["getPositionEncoding"](seq_len=4, d=4, n=100), want, "the article's getPositionEncoding vs formula")
    for row in want:
        assert " ".join(f"{x:11.8f}" for x in row) in out, f"tour lacks the row {row}"
    assert "2^-8" in out and "2^-0.5" in out, "ALiBi slopes for 8 and 12 heads"
    for name in ("nope", "rope", "我妈想你了"):
        assert name in out, name
    assert len(out.splitlines()) < 80, "the tour should stay short"


# ------------------------------------------------------------------------------------------------
# .npy I/O
# ------------------------------------------------------------------------------------------------

def write_raw_npy(path, header_dict, data_bytes, version=(1, 0)):
    h = header_dict.encode("latin1")
    pre = 10 if version == (1, 0) else 12
    h = h + b" " * ((64 - (pre + len(h) + 1) % 64) % 64) + b"\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY" + bytes(version))
        f.write(len(h).to_bytes(2 if version == (1, 0) else 4, "little"))
        f.write(h)
        f.write(data_bytes)


@case
def npy_versions_and_byte_orders(d):
    x = randn(1, 3, 4)
    # format 2.0 and 3.0, written by numpy itself
    for ver in ((2, 0), (3, 0)):
        p = d.out(f"x{ver[0]}.npy")
        with open(p, "wb") as f:
            np.lib.format.write_array(f, x, version=ver)
        run("apply", "nope", "--in", p, "--out", d.out(f"y{ver[0]}.npy"))
        close(load(d.out(f"y{ver[0]}.npy"), np.float64), x, f"version {ver}")
    # '|' and '=' byte orders on a little-endian host; Python 2 style 'L' in the shape
    for order in ("|", "="):
        p = d.out("o.npy")
        write_raw_npy(p, "{'descr': '%sf8', 'fortran_order': False, 'shape': (1L, 3L, 4L), }" % order,
                      x.astype("<f8").tobytes())
        run("apply", "nope", "--in", p, "--out", d.out("yo.npy"))
        close(load(d.out("yo.npy")), x, f"byte order {order}")
    # output header: version 1.0, 64-byte aligned data, loads with numpy, keeps dtype and shape
    raw = open(d.out("y2.npy"), "rb").read()
    assert raw[:8] == b"\x93NUMPY\x01\x00", raw[:8]
    hl = int.from_bytes(raw[8:10], "little")
    assert (10 + hl) % 64 == 0, hl
    # 0-d ... 6-d C-order arrays, and empty ones, round-trip (nope is the identity)
    for nd in (0, 1, 2, 5, 6):
        a = randn(*([2] * nd)).astype(np.float32)
        run("apply", "nope", "--in", d.save("nd.npy", a), "--out", d.out("ndy.npy"))
        close(load(d.out("ndy.npy"), np.float32), a, f"{nd}-d")
    run("apply", "nope", "--in", d.save("e.npy", np.zeros((2, 0, 3))), "--out", d.out("ey.npy"))
    assert load(d.out("ey.npy"), np.float64).shape == (2, 0, 3)


@case
def npy_output_replaces_existing_file(d):
    x = randn(1, 2, 4)
    o = d.save("y.npy", np.zeros(3))
    run("apply", "nope", "--in", d.save("x.npy", x), "--out", o)
    close(load(o), x, "replaced")
    assert not glob.glob(os.path.join(d.path, ".*posenc-tmp*")), os.listdir(d.path)


# ------------------------------------------------------------------------------------------------
# table, apply
# ------------------------------------------------------------------------------------------------

@case
def table_sinusoidal(d):
    run("table", "sinusoidal", "--length", 7, "--dim", 6, "--out", d.out("t.npy"))
    close(load(d.out("t.npy"), np.float64), sinusoid(np.arange(7), 6), "base 10000")
    run("table", "sinusoidal", "--length", 4, "--dim", 4, "--base", 100, "--out", d.out("t.npy"))
    close(load(d.out("t.npy")), sinusoid(np.arange(4), 4, 100.0), "the article's example, base 100")
    run("table", "sinusoidal", "--length", 5, "--dim", 8, "--offset", 1000, "--dtype", "float32",
        "--out", d.out("t32.npy"))
    close(load(d.out("t32.npy"), np.float32), sinusoid(np.arange(1000, 1005), 8), "offset, float32",
          atol=1e-6, rtol=1e-6)


@case
def apply_sinusoidal(d):
    for dt in (np.float32, np.float64):
        x = randn(2, 5, 6, dtype=dt)
        run("apply", "sinusoidal", "--in", d.save("x.npy", x), "--out", d.out("y.npy"), "--offset", 3)
        close(load(d.out("y.npy"), dt), x + sinusoid(np.arange(3, 8), 6)[None], f"offset {dt}", dtype=dt)
        pos = np.array([[0, 4, 4, 9, 2], [7, 1, 0, 3, 3]], dtype=np.int64)
        dy = randn(2, 5, 6, dtype=dt)
        run("apply", "sinusoidal", "--in", d.out("x.npy"), "--out", d.out("y.npy"), "--base", 50,
            "--positions", d.save("p.npy", pos), "--grad-out", d.save("dy.npy", dy), "--grad-in", d.out("dx.npy"))
        close(load(d.out("y.npy"), dt), x + sinusoid(pos, 6, 50.0), f"positions [B, L] {dt}", dtype=dt)
        close(load(d.out("dx.npy"), dt), dy, "dx = dy", dtype=dt)


@case
def apply_rope_layouts_dims_positions(d):
    B, L, H, D = 2, 5, 3, 8
    for dt in (np.float32, np.float64):
        x = randn(B, L, H, D, dtype=dt)
        xp = d.save("x.npy", x)
        for layout in ("interleaved", "half"):
            for r in (0, 4, 8):
                for posarg, pos in (
                        (["--offset", 11], np.arange(11, 11 + L)),
                        (["--positions", d.save("p32.npy", np.array([3, 0, 9, 9, 1000], np.int32))],
                         np.array([3, 0, 9, 9, 1000])),
                        (["--positions", d.save("p64.npy", np.array([[0, 1, 2, 3, 4], [50, 40, 30, 20, 123456]],
                                                                      np.int64))],
                         np.array([[0, 1, 2, 3, 4], [50, 40, 30, 20, 123456]]))):
                    run("apply", "rope", "--in", xp, "--out", d.out("y.npy"), "--layout", layout,
                        "--rotary-dim", r, "--theta", 500, *posarg)
                    want = rope(x, expand_pos(pos, B, L), 500.0, r, layout)
                    close(load(d.out("y.npy"), dt), want, f"{layout} r={r} {posarg[0]} {dt}", dtype=dt)
    # layouts really differ, and dimensions past r pass through
    x = randn(1, 3, 1, 8)
    run("apply", "rope", "--in", d.save("x.npy", x), "--out", d.out("a.npy"), "--rotary-dim", 4, "--offset", 5,
        "--layout", "interleaved")
    run("apply", "rope", "--in", d.out("x.npy"), "--out", d.out("b.npy"), "--rotary-dim", 4, "--offset", 5,
        "--layout", "half")
    a, b = load(d.out("a.npy")), load(d.out("b.npy"))
    assert np.abs(a - b).max() > 1e-3, "interleaved and half gave the same result"
    close(a[..., 4:], x[..., 4:], "pass-through dims")
    # backward: dx is dy rotated by −m·θ (the transpose of the rotation)
    dy = randn(1, 3, 1, 8)
    run("apply", "rope", "--in", d.out("x.npy"), "--out", d.out("a.npy"), "--layout", "half", "--offset", 5,
        "--grad-out", d.save("dy.npy", dy), "--grad-in", d.out("dx.npy"))
    close(load(d.out("dx.npy")), rope(dy, -np.arange(5, 8), layout="half"), "rope backward")


@case
def apply_learned_and_table_gradient(d):
    B, L, D, max_len = 2, 6, 4, 10
    for dt in (np.float32, np.float64):
        x, E, dy = randn(B, L, D, dtype=dt), randn(max_len, D, dtype=dt), randn(B, L, D, dtype=dt)
        pos = np.array([[1, 1, 1, 9, 0, 3], [9, 2, 1, 0, 0, 5]], np.int32)  # repeated positions
        run("apply", "learned", "--in", d.save("x.npy", x), "--table", d.save("E.npy", E),
            "--positions", d.save("p.npy", pos), "--out", d.out("y.npy"),
            "--grad-out", d.save("dy.npy", dy), "--grad-in", d.out("dx.npy"), "--grad-table", d.out("dE.npy"))
        close(load(d.out("y.npy"), dt), x.astype(np.float64) + E[pos], f"y {dt}", dtype=dt)
        close(load(d.out("dx.npy"), dt), dy, f"dx {dt}", dtype=dt)
        dE = np.zeros((max_len, D))
        np.add.at(dE, pos.reshape(-1), dy.reshape(-1, D).astype(np.float64))
        close(load(d.out("dE.npy"), dt), dE, f"dE scatter-add {dt}", dtype=dt)
    # positions [L] with --offset-free default, and only --grad-table
    x, E = randn(1, 4, 3), randn(5, 3)
    run("apply", "learned", "--in", d.save("x.npy", x), "--table", d.save("E.npy", E), "--out", d.out("y.npy"),
        "--offset", 1, "--grad-out", d.save("dy.npy", x), "--grad-table", d.out("dE2.npy"))
    close(load(d.out("y.npy")), x + E[1:5][None], "offset 1")
    close(load(d.out("dE2.npy")), np.vstack([np.zeros((1, 3)), x[0]]), "dE with offset")


@case
def apply_float16_storage(d):
    # float16 .npy ('<f2') is read and written as the library's float16 storage; the math is not
    x = randn(1, 4, 2, 8).astype(np.float16)
    run("apply", "rope", "--in", d.save("x.npy", x), "--out", d.out("y.npy"), "--offset", 100)
    close(load(d.out("y.npy"), np.float16), rope(x, np.arange(100, 104)), "rope float16", atol=4e-3, rtol=4e-3)


@case
def apply_nope_is_identity(d):
    x = randn(2, 3, 4, dtype=np.float32)
    run("apply", "nope", "--in", d.save("x.npy", x), "--out", d.out("y.npy"), "--grad-out", d.save("dy.npy", x),
        "--grad-in", d.out("dx.npy"))
    close(load(d.out("y.npy"), np.float32), x, "y = x", dtype=np.float32)
    close(load(d.out("dx.npy"), np.float32), x, "dx = dy", dtype=np.float32)


# ------------------------------------------------------------------------------------------------
# bias
# ------------------------------------------------------------------------------------------------

@case
def bias_alibi_variants(d):
    assert alibi_slopes(8) == [2.0 ** -(i + 1) for i in range(8)]
    for H, M, N, qo, ko in ((8, 5, 5, 0, 0), (12, 3, 7, 4, 0), (6, 4, 4, 100, 98), (3, 1, 9, 8, 0)):
        args = ["--heads", H, "--q-len", M, "--k-len", N, "--q-offset", qo, "--k-offset", ko]
        run("bias", "alibi", *args, "--out", d.out("b.npy"))
        close(load(d.out("b.npy"), np.float64), alibi_bias("symmetric", H, M, N, qo, ko), f"symmetric H={H}")
        if H % 2 == 0:
            run("bias", "alibi", *args, "--variant", "nonsymmetric", "--out", d.out("b.npy"))
            got = load(d.out("b.npy"))
            close(got, alibi_bias("nonsymmetric", H, M, N, qo, ko), f"nonsymmetric H={H}")
            assert np.isneginf(got).any(), "nonsymmetric masks"
        s = RNG.uniform(0.01, 1.0, H).astype(np.float32)
        run("bias", "alibi", *args, "--slopes", d.save("s.npy", s), "--out", d.out("b32.npy"))
        close(load(d.out("b32.npy"), np.float32), alibi_bias("symmetric", H, M, N, qo, ko, slopes=s),
              "caller slopes, float32", dtype=np.float32)
    # learned: bias and the weights' gradient
    H, M, N, qo, ko = 4, 5, 6, 3, 1
    for dt in (np.float32, np.float64):
        w, dB = randn(2, H, dtype=dt), randn(H, M, N, dtype=dt)
        run("bias", "alibi", "--variant", "learned", "--heads", H, "--q-len", M, "--k-len", N, "--q-offset", qo,
            "--k-offset", ko, "--weights", d.save("w.npy", w), "--out", d.out("b.npy"),
            "--grad-out", d.save("dB.npy", dB), "--grad-weights", d.out("dw.npy"))
        close(load(d.out("b.npy"), dt), alibi_bias("learned", H, M, N, qo, ko, w=w.astype(np.float64)),
              f"learned {dt}", dtype=dt)
        want = alibi_learned_dw(dB.astype(np.float64), H, M, N, qo, ko, w.astype(np.float64))
        close(load(d.out("dw.npy"), dt), want, f"learned dW {dt}", dtype=dt)
    # ... and the analytic gradient agrees with central differences
    w, dB = randn(2, H), randn(H, M, N)
    fd = numeric_grad(lambda: float((alibi_bias("learned", H, M, N, qo, ko, w=w) * dB).sum()), w)
    close(alibi_learned_dw(dB, H, M, N, qo, ko, w), fd, "dW formula vs differences", atol=1e-6, rtol=1e-5)


@case
def bias_t5_buckets(d):
    # the buckets of the T5 code for a few distances (bidirectional, 32, 128)
    r = np.array([-200, -128, -64, -16, -8, -7, -1, 0, 1, 7, 8, 16, 64, 128, 200])
    assert list(t5_buckets(r)) == [15, 15, 14, 10, 8, 7, 1, 0, 17, 23, 24, 26, 30, 31, 31], list(t5_buckets(r))
    for bidir, nb, md, M, N, qo, ko in ((True, 32, 128, 9, 300, 150, 0), (False, 16, 40, 5, 80, 70, 0),
                                        (True, 8, 20, 4, 4, 0, 50)):
        H = 3
        W = randn(nb, H, dtype=np.float32)
        dB = randn(H, M, N, dtype=np.float32)
        run("bias", "t5", "--heads", H, "--q-len", M, "--k-len", N, "--q-offset", qo, "--k-offset", ko,
            "--bidirectional", str(bidir).lower(), "--num-buckets", nb, "--max-distance", md,
            "--weights", d.save("W.npy", W), "--out", d.out("b.npy"),
            "--grad-out", d.save("dB.npy", dB), "--grad-weights", d.out("dW.npy"))
        bk = t5_buckets(rel(M, N, qo, ko), bidir, nb, md)
        close(load(d.out("b.npy"), np.float32), t5_bias(W, M, N, qo, ko, bidirectional=bidir, num_buckets=nb,
                                                         max_distance=md), f"t5 bias {bidir} {nb} {md}",
              dtype=np.float32)
        dW = np.zeros((nb, H))
        for h in range(H):
            np.add.at(dW[:, h], bk.reshape(-1), dB[h].reshape(-1).astype(np.float64))
        close(load(d.out("dW.npy"), np.float32), dW, f"t5 dW {bidir}", atol=1e-4, rtol=1e-5)


@case
def bias_kerple_sandwich_fire(d):
    # KERPLE: both kernels, float32 and float64, offsets; gradients vs central differences in numpy
    for kernel in ("log", "power"):
        for dt in (np.float32, np.float64):
            H, M, N, qo, ko = 3, 4, 9, 5, 0
            r1 = RNG.uniform(0.1, 2.0, H).astype(dt)
            r2 = RNG.uniform(0.1, 1.9, H).astype(dt)
            dB = randn(H, M, N, dtype=dt)
            run("bias", "kerple", "--kernel", kernel, "--heads", H, "--q-len", M, "--k-len", N, "--q-offset", qo,
                "--k-offset", ko, "--r1", d.save("r1.npy", r1), "--r2", d.save("r2.npy", r2), "--out", d.out("b.npy"),
                "--grad-out", d.save("dB.npy", dB), "--grad-r1", d.out("dr1.npy"), "--grad-r2", d.out("dr2.npy"))
            a1, a2, g = r1.astype(np.float64), r2.astype(np.float64), dB.astype(np.float64)
            close(load(d.out("b.npy"), dt), kerple_bias(a1, a2, M, N, qo, ko, kernel), f"kerple {kernel} {dt}", dtype=dt)
            for name, arr in (("r1", a1), ("r2", a2)):
                fd = numeric_grad(lambda: float((kerple_bias(a1, a2, M, N, qo, ko, kernel) * g).sum()), arr)
                close(load(d.out(f"d{name}.npy"), dt), fd, f"kerple {kernel} d{name} {dt}",
                      atol=1e-4 if dt == np.float32 else 1e-6, rtol=1e-4 if dt == np.float32 else 1e-6)
    # Sandwich: the sinusoids' inner product, any dtype by --dtype, several dims and bases
    for H, M, N, qo, ko, dim, base in ((8, 5, 7, 0, 0, 128, 10000.0), (3, 1, 20, 19, 0, 8, 100.0),
                                        (4, 6, 6, 1000, 990, 16, 10000.0)):
        run("bias", "sandwich", "--heads", H, "--q-len", M, "--k-len", N, "--q-offset", qo, "--k-offset", ko,
            "--sinusoid-dim", dim, "--base", base, "--out", d.out("s.npy"))
        close(load(d.out("s.npy"), np.float64), sandwich_bias(H, M, N, qo, ko, dim, base), f"sandwich {dim} {base}",
              atol=1e-9, rtol=1e-9)
    run("bias", "sandwich", "--heads", 2, "--q-len", 3, "--k-len", 3, "--dtype", "float32", "--out", d.out("s32.npy"))
    close(load(d.out("s32.npy"), np.float32), sandwich_bias(2, 3, 3), "sandwich float32", dtype=np.float32)
    # FIRE: queries on both sides of L, keys on both sides of the queries; every gradient
    H, M, N, qo, ko, W = 2, 6, 10, 2, 0, 5
    t = {"mlp_w1": randn(W) * 1.5, "mlp_b1": randn(W) * 0.7, "mlp_w2": randn(H, W) * 0.8, "mlp_b2": randn(H) * 0.5,
         "c": np.array([0.3]), "threshold": np.array([4.5])}
    dB = randn(H, M, N)
    args = ["bias", "fire", "--heads", H, "--q-len", M, "--k-len", N, "--q-offset", qo, "--k-offset", ko,
            "--out", d.out("f.npy"), "--grad-out", d.save("dB.npy", dB)]
    for name, arr in t.items():
        flag = name.replace("_", "-")
        args += ["--" + flag, d.save(name + ".npy", arr), "--grad-" + flag, d.out("d" + name + ".npy")]
    run(*args)
    close(load(d.out("f.npy"), np.float64), fire_bias(**t, M=M, N=N, qo=qo, ko=ko), "fire bias")
    for name, arr in t.items():
        fd = numeric_grad(lambda: float((fire_bias(**t, M=M, N=N, qo=qo, ko=ko) * dB).sum()), arr)
        close(load(d.out("d" + name + ".npy"), np.float64), fd, f"fire d{name}", atol=1e-6, rtol=1e-5)
    # float32 tensors give a float32 bias (mlp-w2's dtype)
    t32 = {k_: v_.astype(np.float32) for k_, v_ in t.items()}
    args = ["bias", "fire", "--heads", H, "--q-len", M, "--k-len", N, "--out", d.out("f32.npy")]
    for name, arr in t32.items():
        args += ["--" + name.replace("_", "-"), d.save(name + "32.npy", arr)]
    run(*args)
    close(load(d.out("f32.npy"), np.float32), fire_bias(**{k_: v_.astype(np.float64) for k_, v_ in t32.items()},
                                                          M=M, N=N), "fire float32", dtype=np.float32)


# ------------------------------------------------------------------------------------------------
# attention
# ------------------------------------------------------------------------------------------------

def run_attention(d, enc, q, k, v, *extra, tensors=(), lse=False, **ref_kw):
    args = ["attention", enc, "--q", d.save("q.npy", q), "--k", d.save("k.npy", k), "--v", d.save("v.npy", v),
            "--out", d.out("o.npy")]
    for flag, arr in tensors:
        args += [flag, d.save(flag.strip("-") + ".npy", arr)]
    if lse:
        args += ["--lse", d.out("lse.npy")]
    run(*args, *extra)
    got = load(d.out("o.npy"), q.dtype)
    want = attention(enc, q, k, v, lse=lse, **ref_kw)
    if lse:
        want, want_lse = want
        # float32 inputs: the kernels sum in float32 (lse carries its rounding)
        close(load(d.out("lse.npy"), np.float64), want_lse, f"{enc} lse", dtype=q.dtype)
    close(got, want, f"attention {enc} {extra}", dtype=q.dtype)
    return got


@case
def attention_nope_rope(d):
    for dt in (np.float32, np.float64):
        q, k, v = randn(2, 5, 2, 8, dtype=dt), randn(2, 5, 2, 8, dtype=dt), randn(2, 5, 2, 8, dtype=dt)
        run_attention(d, "nope", q, k, v, lse=True)
        run_attention(d, "nope", q, k, v, "--causal", "--scale", 0.3, causal=True, scale=0.3)
        run_attention(d, "rope", q, k, v, "--causal", causal=True)
    # GQA (4 query heads over 2 kv heads), half layout, partial rotary dim, theta
    q, k, v = randn(2, 6, 4, 8), randn(2, 6, 2, 8), randn(2, 6, 2, 8)
    run_attention(d, "rope", q, k, v, "--causal", "--layout", "half", "--rotary-dim", 4, "--theta", 100,
                  causal=True, layout="half", rotary_dim=4, theta=100.0)
    # decode: one query against N keys sits at position N − 1
    q1 = randn(2, 1, 4, 8)
    run_attention(d, "rope", q1, k, v, "--causal", causal=True)
    run_attention(d, "nope", q1, k, v, "--causal", causal=True)
    # offsets: a shard of queries against a shard of keys
    q3 = randn(1, 3, 4, 8)
    run_attention(d, "rope", q3, k[:1], v[:1], "--causal", "--q-offset", 20, "--k-offset", 16,
                  causal=True, q_offset=20, k_offset=16)
    # rows whose keys are all in the future give zeros
    o = run_attention(d, "nope", q3, k[:1], v[:1], "--causal", "--q-offset", 2, "--k-offset", 4,
                      causal=True, q_offset=2, k_offset=4)
    assert np.all(o[:, :2] == 0), "fully masked rows"
    # permutation: nope is equivariant to a permutation of the tokens, rope is not
    perm = np.array([0, 2, 3, 1, 4, 5])
    x = randn(1, 6, 1, 8)
    for enc, same in (("nope", True), ("rope", False)):
        a = run_attention(d, enc, x, x, x)
        b = run_attention(d, enc, x[:, perm], x[:, perm], x[:, perm])
        assert np.allclose(a[:, perm], b) == same, f"{enc}: permutation equivariance should be {same}"


@case
def attention_alibi_t5(d):
    q, k, v = randn(1, 5, 4, 8), randn(1, 7, 2, 8), randn(1, 7, 2, 8)
    run_attention(d, "alibi", q, k, v, "--causal", causal=True)
    run_attention(d, "alibi", q, k, v, "--variant", "nonsymmetric", variant="nonsymmetric")
    s = RNG.uniform(0.1, 1, 4)
    run_attention(d, "alibi", q, k, v, "--q-offset", 1, "--k-offset", 3, tensors=[("--slopes", s)],
                  slopes=s, q_offset=1, k_offset=3)
    w = randn(2, 4)
    run_attention(d, "alibi", q, k, v, "--variant", "learned", "--causal", tensors=[("--weights", w)],
                  variant="learned", weights=w, causal=True)
    for dt in (np.float32, np.float64):
        W = randn(32, 4, dtype=dt)
        qq, kk, vv = q.astype(dt), k.astype(dt), v.astype(dt)
        run_attention(d, "t5", qq, kk, vv, "--causal", tensors=[("--weights", W)], weights=W, causal=True)
    W = randn(8, 4)
    run_attention(d, "t5", q, k, v, "--bidirectional", "false", "--num-buckets", 8, "--max-distance", 12,
                  "--k-offset", 30, tensors=[("--weights", W)], weights=W, bidirectional=False, num_buckets=8,
                  max_distance=12, k_offset=30)
    q1, W = randn(1, 1, 4, 8), randn(32, 4)
    run_attention(d, "t5", q1, k, v, "--causal", tensors=[("--weights", W)], weights=W, causal=True)


@case
def attention_xl_cope(d):
    B, M, N, Hq, Hkv, D, R = 2, 4, 6, 2, 1, 4, 6
    q, k, v = randn(B, M, Hq, D), randn(B, N, Hkv, D), randn(B, N, Hkv, D)
    u, vb, W = randn(Hq, D), randn(Hq, D), randn(Hq, D, R) * 0.5
    for causal in ([], ["--causal"]):
        run_attention(d, "xl", q, k, v, *causal, tensors=[("--u", u), ("--v-bias", vb), ("--rel-proj", W)],
                      u=u, v_bias=vb, rel_proj=W, causal=bool(causal))
    f32 = [t.astype(np.float32) for t in (q, k, v, u, vb, W)]
    run_attention(d, "xl", *f32[:3], "--q-offset", 7, tensors=[("--u", f32[3]), ("--v-bias", f32[4]),
                                                                ("--rel-proj", f32[5])],
                  u=f32[3].astype(np.float64), v_bias=f32[4].astype(np.float64), rel_proj=f32[5].astype(np.float64),
                  q_offset=7)
    for npos in (3, 8):
        E = randn(npos, D)
        for causal in ([], ["--causal"]):
            run_attention(d, "cope", q, k, v, *causal, tensors=[("--table", E)], table=E, causal=bool(causal))
    E = randn(5, D, dtype=np.float32)
    run_attention(d, "cope", *(t.astype(np.float32) for t in (q, k, v)), "--causal", "--scale", 0.7,
                  tensors=[("--table", E)], table=E.astype(np.float64), causal=True, scale=0.7)


@case
def attention_kerple_sandwich_fire(d):
    q, k, v = randn(2, 5, 4, 8), randn(2, 7, 2, 8), randn(2, 7, 2, 8)
    r1, r2 = RNG.uniform(0.1, 2, 4), RNG.uniform(0.1, 1.9, 4)
    for kernel in ("log", "power"):
        for causal in ([], ["--causal"]):
            run_attention(d, "kerple", q, k, v, "--kernel", kernel, *causal, tensors=[("--r1", r1), ("--r2", r2)],
                          kernel=kernel, r1=r1, r2=r2, causal=bool(causal))
    run_attention(d, "kerple", q[:, :1], k, v, "--causal", tensors=[("--r1", r1), ("--r2", r2)], r1=r1, r2=r2,
                  causal=True)  # decode
    for causal in ([], ["--causal"]):
        run_attention(d, "sandwich", q, k, v, *causal, causal=bool(causal))
    run_attention(d, "sandwich", q, k, v, "--sinusoid-dim", 8, "--base", 100, "--q-offset", 3, "--k-offset", 1,
                  sinusoid_dim=8, base=100.0, q_offset=3, k_offset=1)
    fire = {"--mlp-w1": randn(6) * 1.5, "--mlp-b1": randn(6) * 0.7, "--mlp-w2": randn(4, 6) * 0.8,
            "--mlp-b2": randn(4) * 0.5, "--c": np.array([0.2]), "--threshold": np.array([4.5])}
    kw = {f.strip("-").replace("-", "_"): a for f, a in fire.items()}
    for causal in ([], ["--causal"]):
        run_attention(d, "fire", q, k, v, *causal, tensors=list(fire.items()), causal=bool(causal), **kw)
    run_attention(d, "fire", q, k, v, "--q-offset", 40, "--k-offset", 37, "--causal", tensors=list(fire.items()),
                  q_offset=40, k_offset=37, causal=True, **kw)
    f32 = [t.astype(np.float32) for t in (q, k, v)]
    run_attention(d, "fire", *f32, "--causal", tensors=[(f, a.astype(np.float32)) for f, a in fire.items()],
                  causal=True, **{n: a.astype(np.float32).astype(np.float64) for n, a in kw.items()})


def check_attention_grads(d, enc, q, k, v, params, extra=(), **kw):
    """CLI gradients vs central differences of L = Σ R ⊙ attention(...) in numpy (float64)."""
    R = randn(*q.shape)
    args = ["attention", enc, "--q", d.save("q.npy", q), "--k", d.save("k.npy", k), "--v", d.save("v.npy", v),
            "--out", d.out("o.npy"), "--grad-out", d.save("R.npy", R), "--grad-q", d.out("dq.npy"),
            "--grad-k", d.out("dk.npy"), "--grad-v", d.out("dv.npy"), *extra]
    for flag, (name, arr) in params.items():
        args += [flag, d.save(name + ".npy", arr), "--grad-" + flag[2:], d.out("d" + name + ".npy")]
    run(*args)
    ref_kw = dict(kw)
    for flag, (name, arr) in params.items():
        ref_kw[name] = arr

    def loss():
        return float((attention(enc, q, k, v, **ref_kw) * R).sum())
    for name, arr in (("q", q), ("k", k), ("v", v), *((n, a) for n, a in params.values())):
        got = load(d.out("d" + name + ".npy"), np.float64)
        close(got, numeric_grad(loss, arr), f"{enc} d{name}", atol=2e-6, rtol=2e-5)


@case
def attention_backward_finite_differences(d):
    q, k, v = randn(1, 3, 4, 4), randn(1, 5, 2, 4), randn(1, 5, 2, 4)
    check_attention_grads(d, "rope", q, k, v, {}, ["--causal", "--rotary-dim", 2, "--layout", "half",
                                                   "--q-offset", 4], causal=True, rotary_dim=2, layout="half",
                          q_offset=4)
    check_attention_grads(d, "rope", q, k, v, {}, ["--theta", 30], theta=30.0)
    check_attention_grads(d, "cope", q, k, v, {"--table": ("table", randn(4, 4))}, ["--causal"], causal=True)
    check_attention_grads(d, "cope", q, k, v, {"--table": ("table", randn(7, 4))})
    check_attention_grads(d, "xl", q, k, v, {"--u": ("u", randn(4, 4)), "--v-bias": ("v_bias", randn(4, 4)),
                                             "--rel-proj": ("rel_proj", randn(4, 4, 4) * 0.5)}, ["--causal"],
                          causal=True)
    check_attention_grads(d, "alibi", q, k, v, {"--weights": ("weights", randn(2, 4))},
                          ["--variant", "learned", "--causal"], variant="learned", causal=True)
    check_attention_grads(d, "t5", q, k, v, {"--weights": ("weights", randn(32, 4))}, ["--k-offset", 9],
                          k_offset=9)
    for kernel in ("log", "power"):
        check_attention_grads(d, "kerple", q, k, v, {"--r1": ("r1", RNG.uniform(0.2, 1.5, 4)),
                                                     "--r2": ("r2", RNG.uniform(0.2, 1.8, 4))},
                              ["--kernel", kernel, "--causal"], kernel=kernel, causal=True)
    check_attention_grads(d, "sandwich", q, k, v, {}, ["--sinusoid-dim", 8, "--base", 100], sinusoid_dim=8, base=100.0)
    fire = {"--mlp-w1": ("mlp_w1", randn(5) * 1.5), "--mlp-b1": ("mlp_b1", randn(5) * 0.7),
            "--mlp-w2": ("mlp_w2", randn(4, 5) * 0.8), "--mlp-b2": ("mlp_b2", randn(4) * 0.5),
            "--c": ("c", np.array([0.3])), "--threshold": ("threshold", np.array([4.5]))}
    check_attention_grads(d, "fire", q, k, v, fire, ["--causal", "--q-offset", 3], causal=True, q_offset=3)
    check_attention_grads(d, "fire", q, k, v, fire)


# ------------------------------------------------------------------------------------------------
# bad input: one line naming the flag, exit 2, nothing written
# ------------------------------------------------------------------------------------------------

@case
def errors_usage(d):
    o = d.out("o.npy")
    x = d.save("x.npy", randn(1, 3, 2, 4))
    expect_error(["frob"], "frob")
    expect_error([], "command")
    expect_error(["apply", "foo", "--in", x, "--out", o], "ENC", [o])                        # unknown encoding
    expect_error(["apply", "--in", x, "--out", o], "ENC", [o])                               # missing ENC
    expect_error(["apply", "alibi", "--in", x, "--out", o], "ENC", [o])                      # wrong command
    expect_error(["attention", "learned", "--q", x, "--k", x, "--v", x, "--out", o], "ENC", [o])
    expect_error(["apply", "rope", "--in", x, "--out", o, "--frob", "1"], "--frob", [o])     # unknown flag
    expect_error(["apply", "rope", "--in", x, "--out", o, "stray"], "stray", [o])
    expect_error(["apply", "rope", "--in", x], "--out", [])                                 # missing flag
    expect_error(["apply", "rope", "--out", o], "--in", [o])
    expect_error(["table", "sinusoidal", "--dim", 4, "--out", o], "--length", [o])
    expect_error(["bias", "alibi", "--heads", 2, "--q-len", 2, "--out", o], "--k-len", [o])
    # a flag of another encoding
    expect_error(["bias", "alibi", "--heads", 2, "--q-len", 2, "--k-len", 2, "--theta", 5, "--out", o], "--theta", [o])
    expect_error(["apply", "sinusoidal", "--in", x, "--out", o, "--theta", 5], "--theta", [o])
    expect_error(["apply", "rope", "--in", x, "--out", o, "--base", 5], "--base", [o])
    expect_error(["attention", "alibi", "--q", x, "--k", x, "--v", x, "--out", o, "--rotary-dim", 2], "--rotary-dim", [o])
    expect_error(["attention", "nope", "--q", x, "--k", x, "--v", x, "--out", o, "--table", x], "--table", [o])
    # values that do not parse
    expect_error(["table", "sinusoidal", "--length", "4x", "--dim", 4, "--out", o], "--length", [o])
    expect_error(["table", "sinusoidal", "--length", 4, "--dim", 4, "--base", "abc", "--out", o], "--base", [o])
    expect_error(["table", "sinusoidal", "--length", 4, "--dim", 4, "--dtype", "float16", "--out", o], "--dtype", [o])
    expect_error(["apply", "rope", "--in", x, "--out", o, "--theta", "1e400"], "--theta", [o])
    expect_error(["apply", "rope", "--in", x, "--out", o, "--layout", "diagonal"], "--layout", [o])
    expect_error(["apply", "rope", "--in", x, "--out", o, "--offset", "two"], "--offset", [o])
    expect_error(["attention", "nope", "--q", x, "--k", x, "--v", x, "--out", o, "--scale", "big"], "--scale", [o])
    expect_error(["attention", "nope", "--q", x, "--k", x, "--v", x, "--out", o, "--q-offset", "1.5"], "--q-offset", [o])
    expect_error(["attention", "alibi", "--q", x, "--k", x, "--v", x, "--out", o, "--variant", "wide"], "--variant", [o])
    w = d.save("w.npy", randn(32, 2))
    expect_error(["bias", "t5", "--heads", 2, "--q-len", 2, "--k-len", 2, "--weights", w, "--bidirectional", "maybe",
                  "--out", o], "--bidirectional", [o])
    # values out of range
    expect_error(["table", "sinusoidal", "--length", 4, "--dim", 5, "--out", o], "--dim", [o])
    expect_error(["table", "sinusoidal", "--length", 0, "--dim", 4, "--out", o], "--length", [o])
    expect_error(["bias", "alibi", "--heads", 0, "--q-len", 2, "--k-len", 2, "--out", o], "--heads", [o])
    expect_error(["bias", "t5", "--heads", 2, "--q-len", 2, "--k-len", 2, "--weights", w, "--num-buckets", 3,
                  "--out", o], "--num-buckets", [o])
    expect_error(["attention", "nope", "--q", x, "--k", x, "--v", x, "--out", o, "--scale", -1], "--scale", [o])
    expect_error(["apply", "rope", "--in", x, "--out", o, "--theta", 0], "--theta", [o])


@case
def errors_shapes_dtypes_and_encodings(d):
    o, g = d.out("o.npy"), d.out("g.npy")
    x4 = d.save("x4.npy", randn(1, 3, 2, 4))
    x3 = d.save("x3.npy", randn(1, 3, 4))
    xi = d.save("xi.npy", np.ones((1, 3, 2, 4), np.int32))
    x32 = d.save("x32.npy", randn(1, 3, 2, 4, dtype=np.float32))
    expect_error(["apply", "rope", "--in", x3, "--out", o], "--in", [o])                    # wrong ndim
    expect_error(["apply", "sinusoidal", "--in", x4, "--out", o], "--in", [o])
    expect_error(["apply", "rope", "--in", xi, "--out", o], "--in", [o])                    # int data
    expect_error(["apply", "rope", "--in", x4, "--out", o, "--rotary-dim", 3], "--rotary-dim", [o])  # odd
    expect_error(["apply", "rope", "--in", x4, "--out", o, "--rotary-dim", 6], "--rotary-dim", [o])  # > D
    expect_error(["apply", "sinusoidal", "--in", d.save("odd.npy", randn(1, 3, 5)), "--out", o], "--in", [o])
    # positions: dtype, shape, negative, with --offset
    pf = d.save("pf.npy", np.arange(3, dtype=np.float64))
    expect_error(["apply", "rope", "--in", x4, "--out", o, "--positions", pf], "--positions", [o])
    expect_error(["apply", "rope", "--in", x4, "--out", o, "--positions", d.save("p4.npy", np.arange(4))],
                 "--positions", [o])
    expect_error(["apply", "rope", "--in", x4, "--out", o, "--positions", d.save("pn.npy", np.array([0, -1, 2]))],
                 "--positions", [o])
    expect_error(["apply", "rope", "--in", x4, "--out", o, "--positions", d.save("p3.npy", np.arange(3)),
                  "--offset", 2], "--offset", [o])
    # learned: positions outside the table, table width, missing table
    E = d.save("E.npy", randn(5, 4))
    expect_error(["apply", "learned", "--in", x3, "--table", E, "--out", o, "--positions",
                  d.save("pbig.npy", np.array([0, 5, 1], np.int32))], "--positions", [o])
    expect_error(["apply", "learned", "--in", x3, "--table", E, "--out", o, "--offset", 3], "--offset", [o])
    expect_error(["apply", "learned", "--in", x3, "--table", d.save("E3.npy", randn(5, 3)), "--out", o], "--table", [o])
    expect_error(["apply", "learned", "--in", x3, "--out", o], "--table", [o])
    # attention: head counts that do not divide, mismatched shapes and dtypes
    expect_error(["attention", "nope", "--q", d.save("q3.npy", randn(1, 3, 3, 4)), "--k", x4, "--v", x4, "--out", o],
                 "--k", [o])
    expect_error(["attention", "nope", "--q", x4, "--k", d.save("k8.npy", randn(1, 3, 2, 8)), "--v", x4, "--out", o],
                 "--k", [o])
    expect_error(["attention", "nope", "--q", x4, "--k", x4, "--v", d.save("v5.npy", randn(1, 5, 2, 4)), "--out", o],
                 "--v", [o])
    expect_error(["attention", "nope", "--q", x4, "--k", x32, "--v", x4, "--out", o], "--k", [o])
    expect_error(["attention", "nope", "--q", x3, "--k", x4, "--v", x4, "--out", o], "--q", [o])
    expect_error(["attention", "rope", "--q", x4, "--k", x4, "--v", x4, "--out", o, "--rotary-dim", 5], "--rotary-dim", [o])
    expect_error(["attention", "alibi", "--q", x4, "--k", x4, "--v", x4, "--out", o, "--slopes",
                  d.save("s3.npy", np.ones(3))], "--slopes", [o])
    expect_error(["attention", "alibi", "--q", x4, "--k", x4, "--v", x4, "--out", o, "--variant", "learned"],
                 "--weights", [o])
    expect_error(["attention", "t5", "--q", x4, "--k", x4, "--v", x4, "--out", o], "--weights", [o])
    expect_error(["attention", "t5", "--q", x4, "--k", x4, "--v", x4, "--out", o, "--weights",
                  d.save("w31.npy", randn(31, 2))], "--weights", [o])
    expect_error(["attention", "xl", "--q", x4, "--k", x4, "--v", x4, "--out", o, "--u", d.save("u.npy", randn(2, 4)),
                  "--v-bias", d.save("vb.npy", randn(2, 4))], "--rel-proj", [o])
    expect_error(["attention", "xl", "--q", x4, "--k", x4, "--v", x4, "--out", o, "--u", d.out("u.npy"),
                  "--v-bias", d.save("vb3.npy", randn(3, 4)), "--rel-proj", d.save("W.npy", randn(2, 4, 4))],
                 "--v-bias", [o])
    expect_error(["attention", "cope", "--q", x4, "--k", x4, "--v", x4, "--out", o], "--table", [o])
    expect_error(["attention", "cope", "--q", x4, "--k", x4, "--v", x4, "--out", o, "--table", d.save("e5.npy", randn(3, 5))],
                 "--table", [o])
    # bias: t5 without weights, alibi learned without weights, nonsymmetric with odd heads
    expect_error(["bias", "t5", "--heads", 2, "--q-len", 2, "--k-len", 2, "--out", o], "--weights", [o])
    expect_error(["bias", "alibi", "--variant", "learned", "--heads", 2, "--q-len", 2, "--k-len", 2, "--out", o],
                 "--weights", [o])
    expect_error(["bias", "alibi", "--variant", "nonsymmetric", "--heads", 3, "--q-len", 2, "--k-len", 2, "--out", o],
                 "--heads", [o])
    expect_error(["bias", "alibi", "--heads", 4, "--q-len", 2, "--k-len", 2, "--slopes", d.out("s3.npy"), "--out", o],
                 "--slopes", [o])
    # gradients: an incoherent set, or the wrong shape
    dy = d.save("dy.npy", randn(1, 3, 2, 4))
    expect_error(["apply", "rope", "--in", x4, "--out", o, "--grad-in", g], "--grad-in", [o, g])
    expect_error(["apply", "rope", "--in", x4, "--out", o, "--grad-out", dy], "--grad-out", [o])
    expect_error(["apply", "rope", "--in", x4, "--out", o, "--grad-out", x3, "--grad-in", g], "--grad-out", [o, g])
    expect_error(["apply", "sinusoidal", "--in", x3, "--out", o, "--grad-out", x3, "--grad-in", g, "--grad-table", d.out("t.npy")],
                 "--grad-table", [o, g, d.out("t.npy")])
    expect_error(["attention", "nope", "--q", x4, "--k", x4, "--v", x4, "--out", o, "--grad-q", g], "--grad-q", [o, g])
    expect_error(["attention", "nope", "--q", x4, "--k", x4, "--v", x4, "--out", o, "--grad-out", dy], "--grad-out", [o])
    expect_error(["attention", "nope", "--q", x4, "--k", x4, "--v", x4, "--out", o, "--grad-out", x3, "--grad-v", g],
                 "--grad-out", [o, g])
    expect_error(["attention", "alibi", "--q", x4, "--k", x4, "--v", x4, "--out", o, "--grad-out", dy, "--grad-q", g,
                  "--grad-weights", d.out("gw.npy")], "--grad-weights", [o, g, d.out("gw.npy")])
    expect_error(["bias", "alibi", "--variant", "learned", "--heads", 2, "--q-len", 2, "--k-len", 2,
                  "--weights", d.save("w2.npy", randn(2, 2)), "--out", o, "--grad-weights", g], "--grad-weights", [o, g])
    expect_error(["bias", "t5", "--heads", 2, "--q-len", 2, "--k-len", 2, "--weights", d.save("w32.npy", randn(32, 2)),
                  "--out", o, "--grad-out", d.save("dB.npy", randn(2, 2, 3)), "--grad-weights", g], "--grad-out", [o, g])
    # kerple, sandwich, fire
    r_ok, r_neg = d.save("rok.npy", np.array([0.5, 1.0])), d.save("rneg.npy", np.array([0.5, -1.0]))
    kb = ["bias", "kerple", "--heads", 2, "--q-len", 2, "--k-len", 3]
    expect_error(kb + ["--r1", r_ok, "--out", o], "--r2", [o])                                   # required
    expect_error(kb + ["--r1", r_neg, "--r2", r_ok, "--out", o], "--r1", [o])                     # > 0
    expect_error(kb + ["--r1", r_ok, "--r2", d.save("r25.npy", np.array([0.5, 2.5])), "--kernel", "power",
                       "--out", o], "--r2", [o])                                                  # power: ≤ 2
    expect_error(kb + ["--r1", d.save("r3.npy", np.ones(3)), "--r2", r_ok, "--out", o], "--r1", [o])  # shape
    expect_error(kb + ["--r1", r_ok, "--r2", r_ok, "--kernel", "cubic", "--out", o], "--kernel", [o])
    d.save("dB23.npy", randn(2, 2, 3))
    expect_error(kb + ["--r1", r_ok, "--r2", r_ok, "--out", o, "--grad-out", d.save("dB24.npy", randn(2, 2, 4)),
                       "--grad-r1", g], "--grad-out", [o, g])                                      # dB shape
    line = expect_error(kb + ["--r1", r_ok, "--r2", r_ok, "--out", o, "--grad-out", d.out("dB23.npy")], "--grad-out", [o])
    assert "--grad-r1" in line, line                                                             # says what to add
    expect_error(kb + ["--r1", r_ok, "--r2", r_ok, "--out", o, "--grad-weights", g], "--grad-weights", [o, g])
    sb = ["bias", "sandwich", "--heads", 2, "--q-len", 2, "--k-len", 3]
    expect_error(sb + ["--sinusoid-dim", 7, "--out", o], "--sinusoid-dim", [o])
    expect_error(sb + ["--base", 0, "--out", o], "--base", [o])
    expect_error(sb + ["--out", o, "--grad-out", d.out("dB23.npy")], "--grad-out", [o])            # nothing to learn
    expect_error(sb + ["--r1", r_ok, "--out", o], "--r1", [o])                                   # kerple's flag
    fire = {"--mlp-w1": randn(3), "--mlp-b1": randn(3), "--mlp-w2": randn(2, 3), "--mlp-b2": randn(2),
            "--c": np.array([0.1]), "--threshold": np.array([8.0])}
    fb = ["bias", "fire", "--heads", 2, "--q-len", 2, "--k-len", 3, "--out", o]
    files = {f: d.save("fire" + f.strip("-") + ".npy", a) for f, a in fire.items()}
    def with_fire(**change):
        args = list(fb)
        for f, path in files.items():
            key = f.strip("-").replace("-", "_")
            if key in change:
                if change[key] is None:
                    continue
                path = d.save("bad_" + key + ".npy", change[key])
            args += [f, path]
        return args
    expect_error(with_fire(c=None), "--c", [o])                                                  # required
    expect_error(with_fire(c=np.array([-0.1])), "--c", [o])                                     # > 0
    expect_error(with_fire(threshold=np.array([0.0])), "--threshold", [o])                      # > 0
    expect_error(with_fire(mlp_w2=randn(3, 3)), "--mlp-w2", [o])                                # [H, W]
    expect_error(with_fire(mlp_b1=randn(4)), "--mlp-b1", [o])                                   # [W]
    expect_error(with_fire(c=np.array([0.1, 0.2])), "--c", [o])                                 # [1]
    x4 = d.out("x4.npy")
    ab = ["attention", "fire", "--q", x4, "--k", x4, "--v", x4, "--out", o]
    expect_error(ab + [a for f, p in files.items() if f != "--threshold" for a in (f, p)], "--threshold", [o])
    expect_error(["attention", "kerple", "--q", x4, "--k", x4, "--v", x4, "--out", o, "--r1", r_ok, "--r2", r_neg],
                 "--r2", [o])
    expect_error(["attention", "sandwich", "--q", x4, "--k", x4, "--v", x4, "--out", o, "--c", files["--c"]],
                 "--c", [o])
    expect_error(["attention", "kerple", "--q", x4, "--k", x4, "--v", x4, "--out", o, "--r1", r_ok, "--r2", r_ok,
                  "--grad-out", d.save("dy4.npy", randn(1, 3, 2, 4)), "--grad-q", g, "--grad-r1",
                  d.out("gr1.npy"), "--grad-mlp-w1", d.out("gw1.npy")], "--grad-mlp-w1",
                 [o, g, d.out("gr1.npy"), d.out("gw1.npy")])
    expect_error(["apply", "kerple", "--in", x4, "--out", o], "ENC", [o])                       # not an apply encoding
    expect_error(["table", "sandwich", "--length", 4, "--dim", 4, "--out", o], "ENC", [o])


@case
def errors_files(d):
    o, g = d.out("o.npy"), d.out("g.npy")
    x4 = randn(1, 3, 2, 4)
    good = d.save("x4.npy", x4)
    # missing file
    expect_error(["apply", "rope", "--in", d.out("missing.npy"), "--out", o], "--in", [o])
    # not an .npy file
    txt = d.out("notes.npy")
    open(txt, "w").write("hello, this is not numpy\n")
    expect_error(["attention", "nope", "--q", good, "--k", txt, "--v", good, "--out", o], "--k", [o])
    open(d.out("empty.npy"), "wb").close()
    expect_error(["apply", "rope", "--in", d.out("empty.npy"), "--out", o], "--in", [o])
    # truncated data and truncated header
    raw = open(good, "rb").read()
    open(d.out("trunc.npy"), "wb").write(raw[:-5])
    expect_error(["attention", "nope", "--q", d.out("trunc.npy"), "--k", good, "--v", good, "--out", o], "--q", [o])
    open(d.out("trunch.npy"), "wb").write(raw[:40])
    expect_error(["attention", "nope", "--q", good, "--k", good, "--v", d.out("trunch.npy"), "--out", o], "--v", [o])
    # malformed headers
    for i, hdr in enumerate(("{'descr': '<f8', 'fortran_order': False, 'shape': (1, 3, 2, 4) ",
                             "{'descr': '<f8', 'fortran_order': Nope, 'shape': (1, 3, 2, 4), }",
                             "{'descr': '<f8', 'shape': (1, 3, 2, 4), }",
                             "{'descr': '<f8', 'fortran_order': False, 'shape': (1, -3, 2, 4), }",
                             "[1, 2, 3]")):
        p = d.out(f"bad{i}.npy")
        write_raw_npy(p, hdr, x4.tobytes())
        line = expect_error(["apply", "rope", "--in", p, "--out", o], "--in", [o])
        assert "header" in line, line
    # unsupported dtypes, big-endian, structured; Fortran order
    for name, arr in (("c8.npy", x4.astype(np.complex64)), ("be.npy", x4.astype(">f8")),
                      ("u8.npy", np.ones((1, 3, 2, 4), np.uint8)),
                      ("st.npy", np.zeros(3, dtype=[("a", "<f8"), ("b", "<i4")]))):
        line = expect_error(["apply", "rope", "--in", d.save(name, arr), "--out", o], "--in", [o])
        assert "dtype" in line, line
    line = expect_error(["apply", "rope", "--in", d.save("fo.npy", np.asfortranarray(x4)), "--out", o], "--in", [o])
    assert "Fortran" in line or "fortran" in line, line
    # too many dimensions
    expect_error(["apply", "nope", "--in", d.save("7d.npy", np.zeros([1] * 7)), "--out", o], "--in", [o])
    # a directory as an input
    expect_error(["apply", "rope", "--in", d.path, "--out", o], "--in", [o])
    # unwritable outputs: no such folder, a folder, two flags naming one file
    expect_error(["apply", "rope", "--in", good, "--out", d.out("no/such/dir/o.npy")], "--out", [d.out("no/such/dir/o.npy")])
    expect_error(["apply", "rope", "--in", good, "--out", d.path], "--out", [])
    if os.geteuid() != 0:  # root writes anywhere
        ro = d.out("ro")
        os.mkdir(ro, 0o555)
        expect_error(["apply", "rope", "--in", good, "--out", os.path.join(ro, "o.npy")], "--out",
                     [os.path.join(ro, "o.npy")])
    expect_error(["apply", "rope", "--in", good, "--out", o, "--grad-out", good, "--grad-in", o], "--grad-in", [o])
    # all-or-nothing: one bad output path means no output at all
    expect_error(["attention", "nope", "--q", good, "--k", good, "--v", good, "--out", o, "--grad-out", good,
                  "--grad-q", g, "--grad-k", d.out("nodir/dk.npy")], "--grad-k", [o, g])
    # an existing output is left untouched by a failed run
    keep = d.save("keep.npy", np.arange(3.0))
    before = open(keep, "rb").read()
    expect_error(["apply", "rope", "--in", good, "--out", keep, "--rotary-dim", 3], "--rotary-dim", [])
    assert open(keep, "rb").read() == before, "a failed run changed an existing output"
    assert sorted(os.listdir(d.path)) == sorted(set(os.listdir(d.path))), "listing"
    assert not glob.glob(os.path.join(d.path, ".*posenc-tmp*")), "temporaries left behind"


if __name__ == "__main__":
    sys.exit(main(folder="dir", prefix="posenc-cli-", timeout=60))
