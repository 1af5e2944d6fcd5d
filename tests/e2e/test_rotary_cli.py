#!/usr/bin/python3
"""posenc's rotary encodings beyond 1D RoPE (rope2d, mrope, xpos) end to end, against numpy.

    /usr/bin/python3 tests/e2e/test_rotary_cli.py --posenc PATH/TO/posenc [--articles ...] [-k NAME]

Every expectation is computed here in numpy, each in the form of its source: RoPE-ViT's complex
pairs (x rotations, then y rotations: compute_axial_cis; x·θˣ + y·θʸ: compute_mixed_cis),
transformers' M-RoPE (the cos/sin of cat(freqs, freqs) split by mrope_section * 2, Qwen3-VL's
interleaved slices, rotate_half), torchscale's XPOS (its scale table over arange(−⌈n/2⌉, ⌊n/2⌋),
duplicate_interleave, rotate_every_two), Qwen2-VL's get_rope_index worked by hand, and attention with
each as softmax over materialised logits. Gradients (dX, dQ, dK, dV, the mixed frequencies') by
central differences of a random-projection loss. Then bad inputs: exit 2, one stderr line
"posenc: ..." naming the flag, nothing on stdout, no output written (nor a temporary). Each posenc
run may take 120 s.

Each case prints one line (PASS/FAIL); the last line is exactly "N passed, M failed"; exit 1 if any
case failed, 77 (skip) when numpy is missing (tests/e2e/harness.py).
"""
import json
import math
import sys

from harness import case, close, expect_error, load, main, numeric_grad, run, skip

try:
    import numpy as np
except ImportError:
    skip("numpy is not importable by this python")

from cli_reference import softmax_rows  # noqa: E402 (after numpy's check)

RNG = np.random.default_rng(20240901)


def randn(*shape, dtype=np.float64):
    return RNG.standard_normal(shape).astype(dtype)


# ------------------------------------------------------------------------------------------------
# numpy references, each in its source's form
# ------------------------------------------------------------------------------------------------

def to_interleaved(x, r):
    """The half layout's pairs (k, k + r/2) moved to (2k, 2k + 1): the permutation between layouts."""
    y = x.copy()
    y[..., 0:r:2], y[..., 1:r:2] = x[..., :r // 2], x[..., r // 2:r]
    return y


def from_interleaved(y, r):
    x = y.copy()
    x[..., :r // 2], x[..., r // 2:r] = y[..., 0:r:2], y[..., 1:r:2]
    return x


def complex_rotate(x, phi, scale, r, layout):
    """x [..., D]: pairs as complex numbers (view_as_complex) times scale·e^{iφ} ([..., r/2])."""
    x = np.asarray(x, dtype=np.float64)
    if layout == "half":
        return from_interleaved(complex_rotate(to_interleaved(x, r), phi, scale, r, "interleaved"), r)
    z = x[..., 0:r:2] + 1j * x[..., 1:r:2]
    z = z * scale * np.exp(1j * phi)
    y = x.copy()
    y[..., 0:r:2], y[..., 1:r:2] = z.real, z.imag
    return y


def rope2d_phi(pos, r, theta=100.0, freqs=None):
    """pos [2, L] (x, y) → φ [L, r/2] (axial, compute_axial_cis) or [H, L, r/2] (mixed, freqs [2, H, r/2])."""
    px, py = pos[0].astype(np.float64), pos[1].astype(np.float64)
    if freqs is not None:
        return px[None, :, None] * freqs[0][:, None, :] + py[None, :, None] * freqs[1][:, None, :]
    f = 1.0 / theta ** (np.arange(0, r, 4)[: r // 4] / r)
    return np.concatenate([np.outer(px, f), np.outer(py, f)], axis=-1)


def rope2d(x, pos, r=0, layout="half", theta=100.0, freqs=None):
    """x [B, L, H, D], pos [2, L]."""
    r = r or x.shape[-1]
    phi = rope2d_phi(pos, r, theta, freqs)
    if freqs is None:
        phi = phi[None, :, None, :]                # [1, L, 1, r/2]
    else:
        phi = np.transpose(phi, (1, 0, 2))[None]   # [1, L, H, r/2]
    return complex_rotate(x, phi, 1.0, r, layout)


def mrope_phi(pos, r, section, interleaved, theta):
    """transformers: freqs [3, L, r/2] = pos·inv_freq; chunked: cat(freqs, freqs) split by section * 2,
    chunk i from row i % 3; interleaved: freqs[0] with [1 : 3 s_h : 3] from row 1, [2 : 3 s_w : 3] from
    row 2. Returns the per-pair angle [L, r/2]."""
    inv = 1.0 / theta ** (np.arange(0, r, 2) / r)
    freqs = pos.astype(np.float64)[:, :, None] * inv[None, None, :]
    if interleaved:
        ft = freqs[0].copy()
        for dim, off in ((1, 1), (2, 2)):
            idx = slice(off, section[dim] * 3, 3)
            ft[..., idx] = freqs[dim][..., idx]
        return ft
    emb = np.concatenate([freqs, freqs], axis=-1)
    chunks = np.split(emb, np.cumsum(section * 2)[:-1], axis=-1)
    full = np.concatenate([c[i % 3] for i, c in enumerate(chunks)], axis=-1)
    return full[..., : r // 2]


def mrope(x, pos, section, interleaved=False, layout="half", theta=10000.0):
    """x [B, L, H, D], pos [3, L]; half: q·cos + rotate_half(q)·sin on the first r dims."""
    r = x.shape[-1]
    phi = mrope_phi(pos, r, section, interleaved, theta)  # [L, r/2]
    if layout == "interleaved":
        return complex_rotate(x, phi[None, :, None, :], 1.0, r, "interleaved")
    emb = np.concatenate([phi, phi], axis=-1)[None, :, None, :]
    rh = np.concatenate([-x[..., r // 2:], x[..., : r // 2]], axis=-1)
    return x * np.cos(emb) + rh * np.sin(emb)


def xpos(x, offset=0, downscale=False, scale_base=512.0, layout="half", n=None):
    """torchscale's XPOS.forward(x, offset, downscale) for x [B, L, H, D] at positions offset .. offset+L−1:
    its tables over n = L + offset positions (or the given n ≥ that: the same centre for queries and keys
    of another length), rows offset .. offset + L − 1."""
    B, L, H, D = x.shape
    n = L + offset if n is None else n
    if layout == "half":
        return from_interleaved(xpos(to_interleaved(x, D), offset, downscale, scale_base, "interleaved", n), D)
    min_pos = -n // 2                      # torchscale's −(length + offset) // 2, i.e. −⌈n/2⌉
    zeta = (np.arange(0, D, 2) + 0.4 * D) / (1.4 * D)
    scale = zeta[None, :] ** (np.arange(min_pos, min_pos + n)[:, None] / scale_base)   # [n, D/2]
    inv = 1.0 / 10000 ** (np.arange(0, D // 2) / (D // 2))
    ang = np.arange(n)[:, None] * inv[None, :]
    rows = slice(offset, offset + L)
    sin, cos, scale = np.sin(ang)[rows], np.cos(ang)[rows], scale[rows]
    if downscale:
        scale = 1 / scale
    dup = lambda m: np.repeat(m, 2, axis=-1)  # duplicate_interleave
    sin, cos = dup(sin * scale)[None, :, None, :], dup(cos * scale)[None, :, None, :]
    rot = np.stack([-x[..., 1::2], x[..., 0::2]], axis=-1).reshape(x.shape)  # rotate_every_two
    return x * cos + rot * sin


def attention(q, k, v, qr, kr, causal=False, q_offset=None, k_offset=0):
    """q, k, v [B, M|N, H, D]; qr(q), kr(k_expanded) the rotations (k expanded to Hq heads first)."""
    B, M, Hq, D = q.shape
    N, Hkv = k.shape[1], k.shape[2]
    g = Hq // Hkv
    q_offset = k_offset + N - M if q_offset is None else q_offset
    qp, kp = q_offset + np.arange(M), k_offset + np.arange(N)
    kk, vv = np.repeat(k, g, axis=2), np.repeat(v, g, axis=2)
    qq, kk = qr(q), kr(kk)
    logits = np.einsum("bmhd,bnhd->bhmn", qq, kk) / math.sqrt(D)
    if causal:
        logits = logits + np.where(kp[None, :] > qp[:, None], -np.inf, 0.0)
    return np.einsum("bhmn,bnhd->bmhd", softmax_rows(logits), vv)


# ------------------------------------------------------------------------------------------------
# apply and table
# ------------------------------------------------------------------------------------------------

def grid_positions(L, W):
    l = np.arange(L)
    return np.stack([l % W, l // W]).astype(np.int64)


@case
def apply_rope2d_axial_and_mixed(d):
    B, L, H, D = 2, 6, 3, 12
    x = randn(B, L, H, D)
    pos = grid_positions(L, 3)
    for layout in ("interleaved", "half"):
        for r, theta in ((0, None), (8, 10.0)):
            args = ["apply", "rope2d", "--in", d.save("x.npy", x), "--positions", d.save("p.npy", pos),
                    "--layout", layout, "--out", d.out("y.npy")]
            if r:
                args += ["--rotary-dim", r]
            if theta:
                args += ["--theta", theta]
            run(*args)
            close(load(d.out("y.npy"), np.float64), rope2d(x, pos, r, layout, theta or 100.0), f"axial {layout} r={r}")
    # float32 in, float32 out; int32 positions
    run("apply", "rope2d", "--in", d.save("x32.npy", x.astype(np.float32)), "--positions",
        d.save("p32.npy", pos.astype(np.int32)), "--out", d.out("y32.npy"))
    close(load(d.out("y32.npy"), np.float32), rope2d(x.astype(np.float32).astype(np.float64), pos), "float32",
          atol=1e-5, rtol=1e-5)
    # mixed: learned frequencies, per head
    f = randn(2, H, D // 2) * 0.5
    run("apply", "rope2d", "--variant", "mixed", "--in", d.save("x.npy", x), "--positions", d.save("p.npy", pos),
        "--freqs", d.save("f.npy", f), "--out", d.out("y.npy"))
    close(load(d.out("y.npy")), rope2d(x, pos, freqs=f), "mixed")
    # [B, 2, L] positions: each row its own
    pb = np.stack([pos, pos[::-1] + 2])
    run("apply", "rope2d", "--in", d.save("x.npy", x), "--positions", d.save("pb.npy", pb), "--out", d.out("y.npy"))
    want = np.concatenate([rope2d(x[:1], pb[0]), rope2d(x[1:], pb[1])])
    close(load(d.out("y.npy")), want, "batched positions")


@case
def apply_rope2d_gradients(d):
    B, L, H, D = 1, 5, 2, 8
    x, R = randn(B, L, H, D), randn(B, L, H, D)
    pos = grid_positions(L, 2)
    f = randn(2, H, D // 2) * 0.5
    for layout in ("interleaved", "half"):
        run("apply", "rope2d", "--variant", "mixed", "--layout", layout, "--in", d.save("x.npy", x),
            "--positions", d.save("p.npy", pos), "--freqs", d.save("f.npy", f), "--out", d.out("y.npy"),
            "--grad-out", d.save("R.npy", R), "--grad-in", d.out("dx.npy"), "--grad-freqs", d.out("df.npy"))
        loss = lambda: float((rope2d(x, pos, layout=layout, freqs=f) * R).sum())
        close(load(d.out("dx.npy")), numeric_grad(loss, x), f"mixed dx {layout}", atol=1e-7, rtol=1e-6)
        close(load(d.out("df.npy")), numeric_grad(loss, f), f"mixed dfreqs {layout}", atol=1e-7, rtol=1e-6)
    run("apply", "rope2d", "--in", d.save("x.npy", x), "--positions", d.save("p.npy", pos), "--out",
        d.out("y.npy"), "--grad-out", d.save("R.npy", R), "--grad-in", d.out("dx.npy"))
    loss = lambda: float((rope2d(x, pos) * R).sum())
    close(load(d.out("dx.npy")), numeric_grad(loss, x), "axial dx", atol=1e-7, rtol=1e-6)


@case
def apply_mrope_chunked_interleaved_and_text(d):
    L, H, D = 9, 2, 24
    x = randn(1, L, H, D)
    pos = np.array([[0, 1, 2, 2, 2, 2, 2, 2, 5], [0, 1, 2, 2, 2, 3, 3, 3, 5], [0, 1, 2, 3, 4, 2, 3, 4, 5]])
    for interleaved, section in ((False, [2, 5, 5]), (True, [4, 4, 4])):
        for layout in ("half", "interleaved"):
            args = ["apply", "mrope", "--in", d.save("x.npy", x), "--positions", d.save("p.npy", pos),
                    "--mrope-section", ",".join(map(str, section)), "--theta", 1e6, "--layout", layout,
                    "--out", d.out("y.npy")]
            if interleaved:
                args += ["--variant", "interleaved"]
            run(*args)
            close(load(d.out("y.npy")), mrope(x, pos, section, interleaved, layout, 1e6),
                  f"mrope interleaved={interleaved} {layout}")
    # text (no positions: offset + l in every row) is RoPE in the half layout
    run("apply", "mrope", "--in", d.save("x.npy", x), "--offset", 7, "--mrope-section", "4,4,4", "--out", d.out("y.npy"))
    run("apply", "rope", "--in", d.save("x.npy", x), "--offset", 7, "--layout", "half", "--out", d.out("r.npy"))
    close(load(d.out("y.npy")), load(d.out("r.npy")), "mrope on text = rope", atol=1e-13, rtol=1e-13)
    # gradient
    R = randn(1, L, H, D)
    run("apply", "mrope", "--in", d.save("x.npy", x), "--positions", d.save("p.npy", pos), "--mrope-section", "2,5,5",
        "--out", d.out("y.npy"), "--grad-out", d.save("R.npy", R), "--grad-in", d.out("dx.npy"))
    loss = lambda: float((mrope(x, pos, [2, 5, 5]) * R).sum())
    close(load(d.out("dx.npy")), numeric_grad(loss, x), "mrope dx", atol=1e-7, rtol=1e-6)


@case
def apply_xpos_queries_keys_and_decode(d):
    H, D = 2, 16
    for L in (7, 8):
        x = randn(1, L, H, D)
        for role, down in (("query", False), ("key", True)):
            for layout in ("interleaved", "half"):
                run("apply", "xpos", "--role", role, "--layout", layout, "--in", d.save("x.npy", x),
                    "--out", d.out("y.npy"))
                close(load(d.out("y.npy")), xpos(x, 0, down, layout=layout), f"xpos {role} L={L} {layout}")
    # a decode step: torchscale's query at offset n − 1 uses the table of length n, as the keys do
    q = randn(1, 1, H, D)
    run("apply", "xpos", "--role", "query", "--in", d.save("q.npy", q), "--offset", 8, "--out", d.out("y.npy"))
    close(load(d.out("y.npy")), xpos(q, 8), "xpos decode")
    # scale base, gradient
    x, R = randn(1, 5, H, 8), randn(1, 5, H, 8)
    run("apply", "xpos", "--role", "key", "--scale-base", 16, "--in", d.save("x.npy", x), "--out", d.out("y.npy"),
        "--grad-out", d.save("R.npy", R), "--grad-in", d.out("dx.npy"))
    close(load(d.out("y.npy")), xpos(x, 0, True, 16.0), "xpos scale base 16")
    loss = lambda: float((xpos(x, 0, True, 16.0) * R).sum())
    close(load(d.out("dx.npy")), numeric_grad(loss, x), "xpos dx", atol=1e-7, rtol=1e-6)
    # the logit of a query at m and a key at n depends on m − n: shift both by 5 (same length → same centre)
    q, k = randn(1, 1, 1, 8), randn(1, 1, 1, 8)

    def logit(m, n, seq):
        run("apply", "xpos", "--role", "query", "--in", d.save("q.npy", q), "--offset", m, "--seq-len", seq,
            "--out", d.out("qy.npy"))
        run("apply", "xpos", "--role", "key", "--in", d.save("k.npy", k), "--offset", n, "--seq-len", seq,
            "--out", d.out("ky.npy"))
        return float((load(d.out("qy.npy")) * load(d.out("ky.npy"))).sum())
    a, b = logit(9, 4, 10), logit(14, 9, 40)
    assert abs(a - b) <= 1e-12 * (1 + abs(a)), (a, b)


@case
def tables(d):
    pos = grid_positions(6, 3)
    run("table", "rope2d", "--positions", d.save("p.npy", pos), "--dim", 8, "--out", d.out("t.npy"))
    close(load(d.out("t.npy")), rope2d_phi(pos, 8), "rope2d angle")
    run("table", "rope2d", "--positions", d.save("p.npy", pos), "--dim", 8, "--part", "sin", "--out", d.out("t.npy"))
    close(load(d.out("t.npy")), np.sin(rope2d_phi(pos, 8)), "rope2d sin")
    f = randn(2, 3, 4) * 0.4
    run("table", "rope2d", "--variant", "mixed", "--freqs", d.save("f.npy", f), "--positions", d.save("p.npy", pos),
        "--dim", 8, "--out", d.out("t.npy"))
    close(load(d.out("t.npy")), rope2d_phi(pos, 8, freqs=f), "rope2d mixed angle [H, L, r/2]")
    p3 = np.array([[0, 1, 2, 2, 5], [0, 1, 2, 3, 5], [0, 1, 3, 2, 5]])
    run("table", "mrope", "--positions", d.save("p3.npy", p3), "--dim", 12, "--mrope-section", "2,2,2",
        "--variant", "interleaved", "--part", "cos", "--out", d.out("t.npy"))
    close(load(d.out("t.npy")), np.cos(mrope_phi(p3, 12, [2, 2, 2], True, 10000.0)), "mrope cos")
    run("table", "xpos", "--length", 5, "--offset", 2, "--dim", 8, "--part", "scale", "--role", "key",
        "--out", d.out("t.npy"))
    zeta = (np.arange(0, 8, 2) + 3.2) / 11.2
    m = 2 + np.arange(5)
    close(load(d.out("t.npy")), zeta[None, :] ** (-(m[:, None] - 4) / 512.0), "xpos key scale, c = ⌈7/2⌉")
    # rope2d mixed's initialisation: per head an angle α, the first r/4 pairs along α, the rest along α + π/2
    run("table", "rope2d", "--variant", "mixed", "--part", "init", "--heads", 3, "--dim", 16, "--seed", 5,
        "--out", d.out("i.npy"))
    init = load(d.out("i.npy"))
    assert init.shape == (2, 3, 8), init.shape
    mu = 1.0 / 10.0 ** (np.arange(0, 16, 4) / 16)
    for h in range(3):
        a = math.atan2(init[1, h, 0], init[0, h, 0]) % (2 * math.pi)
        close(init[0, h], np.concatenate([mu * math.cos(a), mu * math.cos(a + math.pi / 2)]), "init x")
        close(init[1, h], np.concatenate([mu * math.sin(a), mu * math.sin(a + math.pi / 2)]), "init y")
    run("table", "rope2d", "--variant", "mixed", "--part", "init", "--heads", 3, "--dim", 16, "--seed", 5,
        "--out", d.out("j.npy"))
    assert np.array_equal(init, load(d.out("j.npy"))), "the same seed gives the same table"
    run("table", "rope2d", "--variant", "mixed", "--part", "init", "--heads", 3, "--dim", 16, "--seed", 6,
        "--out", d.out("j.npy"))
    assert not np.array_equal(init, load(d.out("j.npy"))), "another seed, other angles"


@case
def mrope_positions_qwen2vl(d):
    r = run("mrope-positions", "--segments", "text:2,image:1x2x3,text:2", "--out", d.out("p.npy"))
    assert json.loads(r.stdout) == {"length": 10, "next_position": 7, "rope_delta": -3}, r.stdout
    got = load(d.out("p.npy"), np.int64)
    want = [[0, 1, 2, 2, 2, 2, 2, 2, 5, 6], [0, 1, 2, 2, 2, 3, 3, 3, 5, 6], [0, 1, 2, 3, 4, 2, 3, 4, 5, 6]]
    assert got.tolist() == want, got
    # before the merge (Qwen2-VL: 2), a video of two frames, int32
    run("mrope-positions", "--segments", "text:1,video:2x4x6,text:1", "--spatial-merge", 2, "--dtype", "int32",
        "--out", d.out("v.npy"))
    v = load(d.out("v.npy"), np.int32)
    assert v[:, 0].tolist() == [0, 0, 0] and v[:, 1].tolist() == [1, 1, 1] and v[:, 12].tolist() == [2, 2, 3], v
    assert v[:, -1].tolist() == [4, 4, 4], v


# ------------------------------------------------------------------------------------------------
# attention
# ------------------------------------------------------------------------------------------------

@case
def attention_float32_products(d):
    """--float32-products: accepted with any dtype (it only changes bfloat16 inputs on CPUs with AMX),
    the fused path's result stays the reference's; given twice it is an error."""
    q, k, v = (randn(1, n, h, 8).astype(np.float32) for n, h in ((5, 2), (7, 1), (7, 1)))
    run(*attn_args(d, "nope", q, k, v, "--causal", "--float32-products"))
    ident = lambda x: x
    close(load(d.out("o.npy")), attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64),
                                          ident, ident, True), "nope --float32-products", atol=1e-5, rtol=1e-4)
    x = d.save("x.npy", q)
    expect_error(["attention", "nope", "--q", x, "--k", x, "--v", x, "--out", d.out("o1.npy"),
                  "--float32-products", "--float32-products"], "--float32-products", [d.out("o1.npy")])


def attn_args(d, enc, q, k, v, *extra):
    return ["attention", enc, "--q", d.save("q.npy", q), "--k", d.save("k.npy", k), "--v", d.save("v.npy", v),
            "--out", d.out("o.npy"), *extra]


@case
def attention_rotary(d):
    B, M, N, Hq, Hkv, D = 2, 5, 6, 4, 2, 8
    q, k, v = randn(B, M, Hq, D), randn(B, N, Hkv, D), randn(B, N, Hkv, D)
    qp, kp = grid_positions(M, 2) + 1, grid_positions(N, 3)
    for causal in ([], ["--causal"]):
        c = bool(causal)
        run(*attn_args(d, "rope2d", q, k, v, "--q-positions", d.save("qp.npy", qp), "--k-positions",
                       d.save("kp.npy", kp), *causal))
        close(load(d.out("o.npy")), attention(q, k, v, lambda x: rope2d(x, qp), lambda x: rope2d(x, kp), c),
              f"rope2d axial {causal}")
        f = randn(2, Hq, D // 2) * 0.5
        run(*attn_args(d, "rope2d", q, k, v, "--variant", "mixed", "--freqs", d.save("f.npy", f), "--q-positions",
                       d.save("qp.npy", qp), "--k-positions", d.save("kp.npy", kp), *causal))
        close(load(d.out("o.npy")),
              attention(q, k, v, lambda x: rope2d(x, qp, freqs=f), lambda x: rope2d(x, kp, freqs=f), c),
              f"rope2d mixed (keys per query head) {causal}")
        q3 = np.array([[3, 3, 3, 4, 4], [0, 1, 2, 0, 1], [0, 0, 1, 1, 2]])
        k3 = np.array([[0, 1, 1, 1, 1, 4], [0, 1, 1, 2, 2, 4], [0, 1, 2, 1, 2, 4]])
        run(*attn_args(d, "mrope", q, k, v, "--mrope-section", "2,1,1", "--q-positions", d.save("q3.npy", q3),
                       "--k-positions", d.save("k3.npy", k3), *causal))
        close(load(d.out("o.npy")),
              attention(q, k, v, lambda x: mrope(x, q3, [2, 1, 1]), lambda x: mrope(x, k3, [2, 1, 1]), c),
              f"mrope {causal}")
        # xpos: q at 10 + i as queries, k at 4 + j as keys, torchscale's tables of length 15 for both (one
        # centre; the attention's default is the middle of its positions, and the logits do not depend on it)
        run(*attn_args(d, "xpos", q, k, v, "--q-offset", 10, "--k-offset", 4, "--scale-base", 16, *causal))
        close(load(d.out("o.npy")),
              attention(q, k, v, lambda x: xpos(x, 10, False, 16.0, n=15), lambda x: xpos(x, 4, True, 16.0, n=15),
                        c, 10, 4),
              f"xpos {causal}")
    # mrope without positions is rope (half layout) in attention too
    run(*attn_args(d, "mrope", q, k, v, "--mrope-section", "2,1,1", "--causal"))
    o = load(d.out("o.npy"))
    run(*attn_args(d, "rope", q, k, v, "--layout", "half", "--causal"))
    close(o, load(d.out("o.npy")), "mrope on text = rope", atol=1e-13, rtol=1e-12)


@case
def attention_rotary_gradients(d):
    B, M, N, Hq, Hkv, D = 1, 3, 4, 2, 1, 8
    q, k, v, R = randn(B, M, Hq, D), randn(B, N, Hkv, D), randn(B, N, Hkv, D), randn(B, M, Hq, D)
    qp, kp = grid_positions(M, 2), grid_positions(N, 2) + 1
    f = randn(2, Hq, D // 2) * 0.5
    grads = ["--grad-out", d.save("R.npy", R), "--grad-q", d.out("dq.npy"), "--grad-k", d.out("dk.npy"),
             "--grad-v", d.out("dv.npy")]
    cases = [
        ("rope2d", ["--variant", "mixed", "--freqs", d.save("f.npy", f), "--grad-freqs", d.out("df.npy"),
                    "--q-positions", d.save("qp.npy", qp), "--k-positions", d.save("kp.npy", kp), "--causal"],
         lambda: attention(q, k, v, lambda x: rope2d(x, qp, freqs=f), lambda x: rope2d(x, kp, freqs=f), True), True),
        ("mrope", ["--mrope-section", "2,1,1", "--variant", "interleaved", "--q-positions",
                   d.save("q3.npy", np.stack([qp[0], qp[1], qp[0]])), "--k-positions",
                   d.save("k3.npy", np.stack([kp[0], kp[1], kp[1]]))],
         lambda: attention(q, k, v, lambda x: mrope(x, np.stack([qp[0], qp[1], qp[0]]), [2, 1, 1], True),
                           lambda x: mrope(x, np.stack([kp[0], kp[1], kp[1]]), [2, 1, 1], True)), False),
        ("xpos", ["--scale-base", 8, "--causal", "--q-offset", 2],
         lambda: attention(q, k, v, lambda x: xpos(x, 2, False, 8.0, n=5), lambda x: xpos(x, 0, True, 8.0, n=5),
                           True, 2, 0),
         False),
    ]
    for enc, extra, ref, mixed in cases:
        run(*attn_args(d, enc, q, k, v, *extra, *grads))
        loss = lambda: float((ref() * R).sum())
        for name, arr in (("q", q), ("k", k), ("v", v)) + ((("f", f),) if mixed else ()):
            close(load(d.out("d" + name + ".npy")), numeric_grad(loss, arr), f"{enc} d{name}", atol=2e-6, rtol=2e-5)


@case
def attention_keys_rotated(d):
    """--keys-rotated: k holds keys already rotated at their positions (numpy's rotation here); only q is
    rotated, and dk is the gradient with respect to those rotated keys."""
    B, M, N, Hq, Hkv, D = 1, 3, 7, 4, 2, 8
    q, k, v, R = randn(B, M, Hq, D), randn(B, N, Hkv, D), randn(B, N, Hkv, D), randn(B, M, Hq, D)
    qo, ko = 9, 5
    at = lambda pos: np.stack([pos, pos, pos])  # mrope with equal components is 1D RoPE (half layout)
    rot_q = lambda x: mrope(x, at(qo + np.arange(M)), [2, 1, 1])
    kr = mrope(k, at(ko + np.arange(N)), [2, 1, 1])
    ref = lambda: attention(q, kr, v, rot_q, lambda x: x, True, qo, ko)
    run(*attn_args(d, "rope", q, kr, v, "--layout", "half", "--keys-rotated", "--causal", "--q-offset", qo,
                   "--k-offset", ko, "--grad-out", d.save("R.npy", R), "--grad-q", d.out("dq.npy"), "--grad-k",
                   d.out("dk.npy"), "--grad-v", d.out("dv.npy")))
    close(load(d.out("o.npy")), ref(), "rope --keys-rotated")
    loss = lambda: float((ref() * R).sum())
    for name, arr in (("q", q), ("k", kr), ("v", v)):
        close(load(d.out("d" + name + ".npy")), numeric_grad(loss, arr), f"rope --keys-rotated d{name}",
              atol=2e-6, rtol=2e-5)
    # float32, the fused kernels' path (a decode step: one query)
    q1 = q[:, -1:].astype(np.float32)
    run(*attn_args(d, "rope", q1, kr.astype(np.float32), v.astype(np.float32), "--layout", "half",
                   "--keys-rotated", "--k-offset", ko))
    close(load(d.out("o.npy")), attention(q1.astype(np.float64), kr, v,
                                          lambda x: mrope(x, at(np.array([ko + N - 1])), [2, 1, 1]),
                                          lambda x: x, False, ko + N - 1, ko),
          "rope --keys-rotated float32 decode", atol=1e-5, rtol=1e-4)
    x = d.save("x.npy", randn(1, 4, 2, 8))
    expect_error(["attention", "alibi", "--q", x, "--k", x, "--v", x, "--out", d.out("o1.npy"), "--keys-rotated"],
                 "--keys-rotated", [d.out("o1.npy")])
    expect_error(["attention", "rope", "--q", x, "--k", x, "--v", x, "--out", d.out("o2.npy"), "--keys-rotated",
                  "--keys-rotated"], "--keys-rotated", [d.out("o2.npy")])


# ------------------------------------------------------------------------------------------------
# bad input
# ------------------------------------------------------------------------------------------------

@case
def errors(d):
    x = d.save("x.npy", randn(1, 4, 2, 8))
    y = d.out("y.npy")
    p1 = d.save("p1.npy", np.arange(4))
    p2 = d.save("p2.npy", grid_positions(4, 2))
    p3 = d.save("p3.npy", np.zeros((3, 4), np.int64))
    pf = d.save("pf.npy", np.zeros((2, 4)))
    expect_error(["apply", "rope2d", "--in", x, "--positions", p1, "--out", y], "--positions", [y])
    expect_error(["apply", "rope2d", "--in", x, "--positions", pf, "--out", y], "--positions", [y])
    expect_error(["apply", "rope2d", "--in", x, "--positions", p3, "--out", y], "--positions", [y])
    expect_error(["apply", "rope2d", "--in", x, "--rotary-dim", 6, "--out", y], "--rotary-dim", [y])
    expect_error(["apply", "rope2d", "--in", x, "--variant", "mixed", "--out", y], "--freqs", [y])
    expect_error(["apply", "rope2d", "--in", x, "--variant", "mixed", "--freqs", d.save("f.npy", randn(2, 3, 4)),
                  "--out", y], "--freqs", [y])
    expect_error(["apply", "rope2d", "--in", x, "--variant", "diagonal", "--out", y], "--variant", [y])
    expect_error(["apply", "rope2d", "--in", x, "--out", y, "--grad-out", x, "--grad-freqs", d.out("df.npy")],
                 "--grad-freqs", [y])
    expect_error(["apply", "mrope", "--in", x, "--out", y], "--mrope-section", [y])
    expect_error(["apply", "mrope", "--in", x, "--mrope-section", "1,1", "--out", y], "--mrope-section", [y])
    expect_error(["apply", "mrope", "--in", x, "--mrope-section", "1,1,x", "--out", y], "--mrope-section", [y])
    expect_error(["apply", "mrope", "--in", x, "--mrope-section", "0,2,2", "--variant", "interleaved", "--out", y],
                 "--mrope-section", [y])
    expect_error(["apply", "mrope", "--in", x, "--mrope-section", "2,1,1", "--positions", p2, "--out", y],
                 "--positions", [y])
    expect_error(["apply", "xpos", "--in", x, "--out", y], "--role", [y])
    expect_error(["apply", "xpos", "--in", x, "--role", "value", "--out", y], "--role", [y])
    expect_error(["apply", "xpos", "--in", x, "--role", "query", "--gamma", 0, "--out", y], "--gamma", [y])
    expect_error(["apply", "xpos", "--in", x, "--role", "query", "--scale-base", -2, "--out", y], "--scale-base", [y])
    expect_error(["apply", "rope", "--in", x, "--role", "query", "--out", y], "--role", [y])
    expect_error(["apply", "xpos", "--in", x, "--role", "key", "--mrope-section", "2,1,1", "--out", y],
                 "--mrope-section", [y])
    q = d.save("q.npy", randn(1, 4, 2, 8))
    o = d.out("o.npy")
    att = ["attention", "--q", q, "--k", q, "--v", q, "--out", o]
    expect_error([*att[:1], "xpos", *att[1:], "--q-positions", p1], "--q-positions", [o])
    expect_error([*att[:1], "mrope", *att[1:], "--mrope-section", "2,1,1", "--q-positions", p2], "--q-positions", [o])
    expect_error([*att[:1], "mrope", *att[1:], "--mrope-section", "2,1,1", "--k-positions", pf], "--k-positions", [o])
    expect_error([*att[:1], "rope2d", *att[1:], "--variant", "mixed"], "--freqs", [o])
    expect_error([*att[:1], "rope2d", *att[1:], "--freqs", d.save("f2.npy", randn(2, 2, 4))], "--freqs", [o])
    expect_error(["table", "rope2d", "--dim", 8, "--part", "init", "--heads", 2, "--out", o], "--part", [o])
    expect_error(["table", "rope2d", "--variant", "mixed", "--dim", 8, "--part", "init", "--out", o], "--heads", [o])
    expect_error(["table", "mrope", "--dim", 8, "--mrope-section", "2,1,1", "--out", o], "--length", [o])
    expect_error(["table", "mrope", "--dim", 8, "--mrope-section", "2,1,1", "--positions", p2, "--out", o],
                 "--positions", [o])
    expect_error(["table", "xpos", "--length", 4, "--dim", 8, "--part", "tan", "--out", o], "--part", [o])
    expect_error(["table", "sinusoidal", "--length", 4, "--dim", 8, "--role", "key", "--out", o], "--role", [o])
    expect_error(["mrope-positions", "--segments", "text:2,picture:1x2x2", "--out", o], "--segments", [o])
    expect_error(["mrope-positions", "--segments", "text:2,image:1x2", "--out", o], "--segments", [o])
    expect_error(["mrope-positions", "--segments", "image:1x3x4", "--spatial-merge", 2, "--out", o], "--segments", [o])
    expect_error(["mrope-positions", "--segments", "text:0", "--out", o], "--segments", [o])
    expect_error(["mrope-positions", "--segments", "text:3", "--spatial-merge", 0, "--out", o], "--spatial-merge", [o])
    expect_error(["mrope-positions", "--segments", "text:3", "--dtype", "float32", "--out", o], "--dtype", [o])


if __name__ == "__main__":
    sys.exit(main(folder="dir", prefix="posenc-rotary-", timeout=120))
