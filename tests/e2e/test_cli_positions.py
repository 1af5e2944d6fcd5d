#!/usr/bin/python3
"""posenc apply and table at the edges of their ranges, end to end, against numpy and Python's math.

    /usr/bin/python3 tests/e2e/test_cli_positions.py --posenc PATH/TO/posenc [--seeds ...] [-k NAME]

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


def rotate(x, phi, scale=1.0, layout="interleaved"):
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


def pair_norms(y, layout="interleaved"):
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


if __name__ == "__main__":
    sys.exit(main(folder="dir", prefix="posenc-pos-", timeout=60))
