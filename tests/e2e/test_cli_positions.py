#!/usr/bin/python3
"""posenc apply and table at the edges of their ranges, end to end, against numpy and Python's math.

    /usr/bin/python3 tests/e2e/test_cli_positions.py --posenc PATH/TO/posenc [--articles ...] [-k NAME]

Positions are bounded by 2^53 (include/posenc/view.h): a larger --offset (or one whose last token
passes 2^53, or overflows int64) or --positions value is an error for every encoding apply runs
(rope, sinusoidal, rope2d, mrope, xpos) and for table; positions up to 2^53 rotate exactly. Tiny
bases (--theta, --base 1e-300) and huge rope2d mixed --freqs give finite angles far beyond the fast
kernels' reduction: the output must be cos and sin of those double angles (Python's math, on the
same double angle) and keep the rotation's norms; frequencies whose angles could overflow are errors
naming the flag. xPos's scale ζ^(±(m − c)/s) beyond the output dtype's range is an error naming
--offset / --positions with the limit; float64 works wherever the scale is finite in float64. apply
names exactly the dtypes it reads (float32, float64, float16) and works on float16. Every error:
exit 2, one stderr line "posenc: ..." naming the flag, nothing on stdout, no output left behind.
Each posenc run may take 60 s.

Each case prints one line (PASS/FAIL); the last line is exactly "N passed, M failed"; exit 1 if any
case failed, 77 (skip) when numpy is missing (tests/e2e/harness.py).
"""
import math
import os
import sys

from harness import case, close, expect_error, load, main, run, skip

try:
    import numpy as np
except ImportError:
    skip("numpy is not importable by this python")

RNG = np.random.default_rng(20250301)
TWO53 = 2 ** 53
FLT_MAX = float(np.finfo(np.float32).max)


def randn(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def cos_sin(phi):
    """cos and sin of every double angle in phi, by Python's math (exact argument reduction)."""
    phi = np.asarray(phi, dtype=np.float64)
    c = np.vectorize(math.cos, otypes=[np.float64])(phi) if phi.size else phi
    s = np.vectorize(math.sin, otypes=[np.float64])(phi) if phi.size else phi
    return c, s


def rotate(x, phi, scale=1.0, layout="half"):
    """x [..., D] float64; pair k of the first r = 2·phi.shape[-1] dims rotated by phi[..., k] and
    multiplied by scale (broadcast like phi). interleaved: (2k, 2k+1); half: (k, k + r/2)."""
    x = np.asarray(x, dtype=np.float64)
    half = phi.shape[-1]
    c, s = cos_sin(phi)
    c, s = c * scale, s * scale
    if layout == "interleaved":
        a, b = x[..., 0:2 * half:2], x[..., 1:2 * half:2]
    else:
        a, b = x[..., :half], x[..., half:2 * half]
    y = x.copy()
    ya, yb = a * c - b * s, a * s + b * c
    if layout == "interleaved":
        y[..., 0:2 * half:2], y[..., 1:2 * half:2] = ya, yb
    else:
        y[..., :half], y[..., half:2 * half] = ya, yb
    return y


def rope_inv(theta, r):
    """RoFormer's ω_k = 1 / theta^(2k/r), each by math.pow as rope_math.h forms it: 1.0 / pow(theta, (2k)/r)."""
    return np.array([1.0 / math.pow(theta, (2.0 * k) / r) for k in range(r // 2)])


def pair_norms(y, layout="half"):
    y = np.asarray(y, dtype=np.float64)
    D = y.shape[-1]
    if layout == "interleaved":
        return np.hypot(y[..., 0::2], y[..., 1::2])
    return np.hypot(y[..., :D // 2], y[..., D // 2:])


# The five encodings apply runs with positions: the flags each needs besides --in/--out, and the
# shape of its --positions ([A, L] for A components, [L] for one).
ROTARY = {
    "rope": ([], 1),
    "rope2d": ([], 2),
    "mrope": (["--mrope-section", "4,2,2"], 3),
    "xpos": (["--role", "query"], 1),
}


def inputs(d, dtype=np.float32):
    """x4 [2, 8, 4, 16] (rotary) and e3 [2, 8, 16] (sinusoidal), saved."""
    return d.save("x4.npy", randn(2, 8, 4, 16, dtype=dtype)), d.save("e3.npy", randn(2, 8, 16, dtype=dtype))


def every_apply(d, x4, e3):
    """(name, argument list) of apply for every position-taking encoding, output o.npy."""
    out = d.out("o.npy")
    runs = [(enc, ["apply", enc, "--in", x4, "--out", out, *flags]) for enc, (flags, _) in ROTARY.items()]
    runs.append(("sinusoidal", ["apply", "sinusoidal", "--in", e3, "--out", out]))
    return runs, out


# ------------------------------------------------------------------------------------------------
# positions beyond 2^53
# ------------------------------------------------------------------------------------------------

@case
def apply_refuses_offsets_beyond_2_53(d):
    """--offset 2^60, 2^63 − 1 (offset + l overflows int64), 2^53 − 6 (the last of 8 tokens at 2^53 + 1)."""
    x4, e3 = inputs(d)
    runs, out = every_apply(d, x4, e3)
    seen = 0
    for off in (2 ** 60, 2 ** 63 - 1, TWO53 - 6):
        for enc, args in runs:
            line = expect_error([*args, "--offset", off], "--offset", [out])
            assert "2^53" in line, f"{enc} --offset {off}: {line}"
            seen += 1
    # Gradients too: neither output written.
    dy, dx = d.save("dy.npy", randn(2, 8, 4, 16)), d.out("dx.npy")
    expect_error(["apply", "rope", "--in", x4, "--out", out, "--offset", 2 ** 60, "--grad-out", dy,
                  "--grad-in", dx], "--offset", [out, dx])
    return f"{seen} refusals"


@case
def apply_refuses_positions_beyond_2_53(d):
    """--positions files holding 2^57, 2^60, 2^63 − 1 (int64) and 2^53 + 1."""
    x4, e3 = inputs(d)
    runs, out = every_apply(d, x4, e3)
    seen = 0
    for big in (2 ** 57, 2 ** 60, 2 ** 63 - 1, TWO53 + 1):
        for enc, args in runs:
            axes = ROTARY[enc][1] if enc in ROTARY else 1
            ids = np.tile(np.arange(8, dtype=np.int64), (axes, 1))
            ids[-1, 5] = big
            p = d.save("p.npy", ids[0] if axes == 1 else ids)
            line = expect_error([*args, "--positions", p], "--positions", [out])
            assert "2^53" in line, f"{enc} {big}: {line}"
            seen += 1
    return f"{seen} refusals"


@case
def table_refuses_offsets_beyond_2_53(d):
    out = d.out("t.npy")
    for enc, extra in (("sinusoidal", []), ("rope", []), ("mrope", ["--mrope-section", "2,1,1"]),
                       ("xpos", []), ("rope2d", [])):
        expect_error(["table", enc, "--dim", 8, "--length", 4, "--offset", 2 ** 60, *extra, "--out", out],
                     "--offset", [out])


@case
def table_reaches_2_53(d):
    """--length 8 --offset 2^53 − 7: the last row at 2^53, accepted by every table; rope's angles
    (theta 256, D = 8: ω_k = 4^−k) are the exact doubles; --offset 2^53 − 6 is refused."""
    out = d.out("t.npy")
    for enc, extra in (("sinusoidal", []), ("rope", ["--theta", 256]), ("mrope", ["--mrope-section", "2,1,1"]),
                       ("xpos", []), ("rope2d", [])):
        run("table", enc, "--dim", 8, "--length", 8, "--offset", TWO53 - 7, *extra, "--out", out)
        if enc == "rope":
            pos = np.arange(TWO53 - 7, TWO53 + 1, dtype=np.float64)
            close(load(out, "float64"), pos[:, None] * np.ldexp(1.0, -2 * np.arange(4))[None, :], "rope angles at 2^53",
                  atol=0, rtol=0)
        os.remove(out)
        line = expect_error(["table", enc, "--dim", 8, "--length", 8, "--offset", TWO53 - 6, *extra, "--out", out],
                            "--offset", [out])
        assert "2^53" in line, f"{enc}: {line}"


@case
def rope_up_to_2_53_is_exact(d):
    """Positions 2^53 − 7 .. 2^53 (the last allowed), theta 256, D = 8: ω_k = 4^−k, so the angles are
    exact doubles; float32 (fast path) and float64 both give cos, sin of them, and norms are kept."""
    x = randn(2, 8, 3, 8)
    for dtype, tol in ((np.float32, dict(atol=2e-6, rtol=2e-6)), (np.float64, dict(atol=1e-12, rtol=1e-12))):
        xin = d.save("x.npy", x.astype(dtype))
        out = d.out("y.npy")
        run("apply", "rope", "--in", xin, "--out", out, "--theta", 256, "--offset", TWO53 - 7)
        pos = np.arange(TWO53 - 7, TWO53 + 1, dtype=np.float64)  # exact: integers below 2^53 + 1
        phi = pos[:, None] * np.ldexp(1.0, -2 * np.arange(4))[None, :]  # [8, 4], exact
        want = rotate(x.astype(dtype).astype(np.float64), phi[None, :, None, :])
        close(load(out, np.dtype(dtype).name), want, "rope at 2^53", **tol)
    # One more position is refused.
    expect_error(["apply", "rope", "--in", xin, "--out", d.out("z.npy"), "--theta", 256, "--offset", TWO53 - 6],
                 "--offset", [d.out("z.npy")])


# ------------------------------------------------------------------------------------------------
# tiny bases and huge frequencies
# ------------------------------------------------------------------------------------------------

@case
def rope_tiny_theta_rotates_by_the_double_angles(d):
    """--theta 1e-300: ω_k up to 1e262, angles up to 7e262 (finite): cos, sin of those doubles."""
    x = randn(2, 8, 4, 16)
    xin, out = d.save("x.npy", x), d.out("y.npy")
    run("apply", "rope", "--in", xin, "--out", out, "--theta", "1e-300")
    phi = np.arange(8, dtype=np.float64)[:, None] * rope_inv(1e-300, 16)[None, :]
    got = load(out, "float32")
    assert np.isfinite(got).all(), "non-finite output"
    close(got, rotate(x, phi[None, :, None, :]), "rope theta 1e-300", atol=2e-6, rtol=2e-6)
    close(pair_norms(got), pair_norms(x), "pair norms", atol=2e-6, rtol=2e-6)
    return f"largest angle {phi.max():.3g}"


@case
def sinusoidal_tiny_base_adds_the_double_angles(d):
    """--base 1e-300: w_i = base^(−2i/D) by math.pow, PE = sin, cos of p·w_i (doubles up to ~1e263)."""
    x = randn(2, 8, 16)
    xin, out = d.save("x.npy", x), d.out("y.npy")
    run("apply", "sinusoidal", "--in", xin, "--out", out, "--base", "1e-300")
    w = np.array([math.pow(1e-300, -2.0 * i / 16) for i in range(8)])
    c, s = cos_sin(np.arange(8, dtype=np.float64)[:, None] * w[None, :])
    pe = np.zeros((8, 16))
    pe[:, 0::2], pe[:, 1::2] = s, c
    got = load(out, "float32")
    close(got, x.astype(np.float64) + pe[None], "sinusoidal base 1e-300", atol=2e-6, rtol=2e-6)
    # The table writes the same rows, in float32 and float64.
    for dtype in ("float32", "float64"):
        t = d.out(f"t_{dtype}.npy")
        run("table", "sinusoidal", "--dim", 16, "--length", 8, "--base", "1e-300", "--dtype", dtype, "--out", t)
        close(load(t, dtype), pe, f"table {dtype}", atol=1e-6 if dtype == "float32" else 1e-12, rtol=0)


@case
def overflowing_frequencies_name_their_flag(d):
    x4, e3 = inputs(d)
    out = d.out("o.npy")
    # hf computes ω_k in float32, where 1e-300 is 0: ω_k = inf.
    expect_error(["apply", "rope", "--in", x4, "--out", out, "--theta", "1e-300", "--angles", "hf"], "--theta", [out])
    expect_error(["table", "rope", "--dim", 16, "--length", 4, "--theta", "1e-300", "--angles", "hf", "--out", out],
                 "--theta", [out])
    inv = d.save("inv.npy", np.array([1.0, 1e300, 0.5, 0.25, 0.1, 0.1, 0.1, 0.1]))
    expect_error(["apply", "rope", "--in", x4, "--out", out, "--inv-freq", inv], "--inv-freq", [out])
    ff = d.save("ff.npy", np.array([1.0, 1e-300, 1, 1, 1, 1, 1, 1]))
    expect_error(["apply", "rope", "--in", x4, "--out", out, "--freq-factors", ff], "--freq-factors", [out])
    # base^(−62/64) at base 1e-310 is ~1e300 > 2^969.
    e64 = d.save("e64.npy", randn(1, 4, 64))
    line = expect_error(["apply", "sinusoidal", "--in", e64, "--out", out, "--base", "1e-310"], "--base", [out])
    assert "2^969" in line, line
    expect_error(["table", "sinusoidal", "--dim", 64, "--length", 4, "--base", "1e-310", "--out", out], "--base", [out])
    return line


@case
def rope2d_mixed_huge_frequency_is_computed_or_refused(d):
    """--freqs with θˣ = 1e30 (its θʸ 0, so each angle is one rounded product x·1e30) and −3e20."""
    H, half = 4, 8
    x = randn(2, 8, H, 16)
    f = RNG.uniform(-0.5, 0.5, (2, H, half))
    f[0, 0, 0], f[1, 0, 0] = 1e30, 0.0
    f[0, 2, 5], f[1, 2, 5] = -3e20, 0.0
    pos = np.stack([np.arange(8) % 3, np.arange(8) // 3]).astype(np.int64)  # [2, L]: x, y
    xin, fin, pin, out = d.save("x.npy", x), d.save("f.npy", f), d.save("p.npy", pos), d.out("y.npy")
    run("apply", "rope2d", "--variant", "mixed", "--freqs", fin, "--positions", pin, "--in", xin, "--out", out)
    px, py = pos[0].astype(np.float64), pos[1].astype(np.float64)
    phi = px[:, None, None] * f[0][None] + py[:, None, None] * f[1][None]  # [L, H, half]
    got = load(out, "float32")
    close(got, rotate(x, phi[None]), "rope2d mixed, freqs up to 1e30", atol=2e-6, rtol=2e-6)
    close(pair_norms(got), pair_norms(x), "pair norms", atol=2e-6, rtol=2e-6)
    # 1e300 could overflow x·θ at |x| <= 2^53: refused.
    f[0, 1, 1] = 1e300
    fbad = d.save("fbad.npy", f)
    bad_out = d.out("bad.npy")
    line = expect_error(["apply", "rope2d", "--variant", "mixed", "--freqs", fbad, "--positions", pin, "--in", xin,
                         "--out", bad_out], "--freqs", [bad_out])
    return line


# ------------------------------------------------------------------------------------------------
# xPos's scale
# ------------------------------------------------------------------------------------------------

def xpos_key_limit(dmax, s=512.0, gamma=0.4):
    """The largest m − c whose key scale exp(−(m − c)·ln ζ_0/s) (xpos_math.h's ρ, in double) stays <= dmax."""
    rate = math.log((0 + gamma) / (1 + gamma)) / s
    lim = int(math.log(dmax) / -rate)
    while math.exp((lim + 1) * -rate) <= dmax:
        lim += 1
    while math.exp(lim * -rate) > dmax:
        lim -= 1
    return lim


def xpos_query_underflow_limit(dmin, s=512.0, gamma=0.4):
    """The largest m − c whose query scale exp((m − c)·ln ζ_0/s) stays >= dmin (the smallest normal)."""
    rate = math.log((0 + gamma) / (1 + gamma)) / s
    lim = int(math.log(dmin) / rate)
    while math.exp((lim + 1) * rate) >= dmin:
        lim += 1
    while math.exp(lim * rate) < dmin:
        lim -= 1
    return lim


def xpos_scale(pos, c, r, role, s=512.0, gamma=0.4):
    """ρ [L, r/2] = ζ_k^(±(m − c)/s), ζ_k = (2k/r + γ)/(1 + γ) (+ query, − key)."""
    zeta = (2.0 * np.arange(r // 2) / r + gamma) / (1 + gamma)
    e = (np.asarray(pos, dtype=np.float64) - c)[:, None] / s * (1 if role == "query" else -1)
    return zeta[None, :] ** e


@case
def xpos_scale_beyond_the_dtype_is_an_error_with_the_limit(d):
    """Keys at 100000 .. 100007 (c = 50004): the scale ζ_0^(−50003/512) ≈ e^122 exceeds float32."""
    x = randn(2, 8, 4, 16)
    x32, out = d.save("x32.npy", x), d.out("y.npy")
    lim = xpos_key_limit(FLT_MAX)
    line = expect_error(["apply", "xpos", "--in", x32, "--out", out, "--offset", 100000, "--role", "key"],
                        "--offset", [out])
    assert "float32" in line and f"m <= c + {lim} = {50004 + lim}" in line, line
    # The same positions given as ids, and the backward.
    p = d.save("p.npy", np.arange(100000, 100008, dtype=np.int64))
    expect_error(["apply", "xpos", "--in", x32, "--out", out, "--positions", p, "--role", "key"], "--positions", [out])
    dy, dx = d.save("dy.npy", x), d.out("dx.npy")
    expect_error(["apply", "xpos", "--in", x32, "--out", out, "--offset", 100000, "--role", "key", "--grad-out", dy,
                  "--grad-in", dx], "--offset", [out, dx])
    # float64 holds e^122: the rotation times the scale, as torchscale's XPOS (interleaved pairs).
    x64 = d.save("x64.npy", x.astype(np.float64))
    run("apply", "xpos", "--in", x64, "--out", out, "--offset", 100000, "--role", "key")
    pos = np.arange(100000, 100008)
    phi = pos[:, None].astype(np.float64) * rope_inv(10000.0, 16)[None, :]
    rho = xpos_scale(pos, 50004, 16, "key")[None, :, None, :]  # up to e^122
    want = rotate(x.astype(np.float64), phi[None, :, None, :], rho)
    per_dim = np.repeat(rho, 2, axis=-1)  # interleaved: pair k is dims 2k, 2k + 1
    close(load(out, "float64") / per_dim, want / per_dim, "xpos keys in float64 (over ρ)", atol=1e-9, rtol=1e-9)
    # Queries there scale down past float32's smallest normal (to 0: the vector's direction lost):
    # refused with that side's limit, which the scale at c + lim still meets and one further does not.
    qout = d.out("q.npy")
    ulim = xpos_query_underflow_limit(2.0 ** -126)
    line_q = expect_error(["apply", "xpos", "--in", x32, "--out", qout, "--offset", 100000, "--role", "query"],
                          "--offset", [qout])
    assert "underflows float32" in line_q and f"m <= c + {ulim} = {50004 + ulim}" in line_q, line_q
    xq = d.save("xq.npy", randn(1, 1, 1, 16))
    run("apply", "xpos", "--in", xq, "--out", qout, "--offset", ulim, "--role", "query", "--center", 0)
    got = load(qout, "float32")
    assert np.all(np.abs(got) > 0), got
    os.remove(qout)
    expect_error(["apply", "xpos", "--in", xq, "--out", qout, "--offset", ulim + 1, "--role", "query", "--center", 0],
                 "--offset", [qout])
    # The limit itself: keys at c + lim (c = 0 by --center) work, one further does not.
    # (|x| <= 0.5: a rotated pair then stays within the scale, which alone is what the check bounds)
    x1v = randn(1, 1, 1, 16)
    x1 = d.save("x1.npy", 0.5 * x1v / np.abs(x1v).max())
    run("apply", "xpos", "--in", x1, "--out", out, "--offset", lim, "--role", "key", "--center", 0)
    assert np.isfinite(load(out, "float32")).all()
    bad_out = d.out("bad.npy")
    expect_error(["apply", "xpos", "--in", x1, "--out", bad_out, "--offset", lim + 1, "--role", "key", "--center", 0],
                 "--offset", [bad_out])
    return line


@case
def xpos_table_scale_checks_its_dtype(d):
    out = d.out("t.npy")
    args = ["table", "xpos", "--dim", 16, "--length", 8, "--offset", 100000, "--role", "key", "--out", out]
    for part in ("scale", "cos", "sin"):
        line = expect_error([*args, "--part", part, "--dtype", "float32"], "--offset", [out])
        assert "float32" in line, line
    run(*args, "--part", "scale", "--dtype", "float64")
    pos = np.arange(100000, 100008)
    close(load(out, "float64"), xpos_scale(pos, 50004, 16, "key"), "xpos key scale table", atol=0, rtol=1e-9)
    run(*args, "--part", "angle", "--dtype", "float32")  # the angles have no scale to overflow
    close(load(out, "float32"), pos[:, None] * rope_inv(10000.0, 16)[None, :], "xpos angles", dtype="float32")
    p = d.save("p.npy", np.arange(100000, 100008, dtype=np.int64))
    bad_out = d.out("bad.npy")
    expect_error(["table", "xpos", "--dim", 16, "--positions", p, "--role", "key", "--part", "scale", "--dtype",
                  "float32", "--out", bad_out], "--positions", [bad_out])


# ------------------------------------------------------------------------------------------------
# the dtypes apply reads
# ------------------------------------------------------------------------------------------------

@case
def apply_names_the_dtypes_it_reads_and_runs_float16(d):
    out = d.out("o.npy")
    xi = d.save("xi.npy", np.zeros((2, 8, 4, 16), dtype=np.int32))
    line = expect_error(["apply", "rope", "--in", xi, "--out", out], "--in", [out])
    assert "expected float32, float64 or float16 data, got int32" in line, line
    x16 = randn(2, 8, 4, 16, dtype=np.float16)
    x64 = x16.astype(np.float64)
    dyi = d.save("dyi.npy", np.zeros((2, 8, 4, 16), dtype=np.int32))
    line = expect_error(["apply", "rope", "--in", d.save("x16.npy", x16), "--out", out, "--grad-out", dyi,
                         "--grad-in", d.out("dx.npy")], "--grad-out", [out, d.out("dx.npy")])
    assert "float16" in line, line
    xin = d.save("x16.npy", x16)
    pos = np.arange(8, dtype=np.float64)
    tol = dict(atol=2e-3, rtol=2e-3)  # float16 storage: 2^-11 relative
    # rope (interleaved), mrope (text positions: RoPE in the half layout), xpos (c = 4), rope2d axial
    # (x = y = l, theta 100), each against numpy.
    phi = pos[:, None] * rope_inv(10000.0, 16)[None, :]
    cases = {
        "rope": ([], rotate(x64, phi[None, :, None, :])),
        "mrope": (["--mrope-section", "4,2,2"], rotate(x64, phi[None, :, None, :], layout="half")),
        "xpos": (["--role", "query"],
                 rotate(x64, phi[None, :, None, :], xpos_scale(pos, 4, 16, "query")[None, :, None, :])),
        "rope2d": ([], rotate(x64, np.concatenate([pos[:, None] * rope_inv(100.0, 8)[None, :]] * 2,
                                                  axis=1)[None, :, None, :])),
    }
    for enc, (flags, want) in cases.items():
        run("apply", enc, "--in", xin, "--out", out, *flags)
        close(load(out, "float16"), want, f"{enc} float16", **tol)
    e16 = randn(2, 8, 16, dtype=np.float16)
    run("apply", "sinusoidal", "--in", d.save("e16.npy", e16), "--out", out)
    w = np.array([math.pow(10000.0, -2.0 * i / 16) for i in range(8)])
    c, s = cos_sin(pos[:, None] * w[None, :])
    pe = np.zeros((8, 16))
    pe[:, 0::2], pe[:, 1::2] = s, c
    close(load(out, "float16"), e16.astype(np.float64) + pe[None], "sinusoidal float16", **tol)
    run("apply", "nope", "--in", xin, "--out", out)
    close(load(out, "float16"), x64, "nope float16", atol=0, rtol=0)


if __name__ == "__main__":
    sys.exit(main(folder="dir", prefix="posenc-pos-", timeout=60))
