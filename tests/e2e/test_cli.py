#!/usr/bin/python3
"""The posenc command end to end: .npy files in, .npy files out, checked against numpy.

    /usr/bin/python3 tests/e2e/test_cli.py --posenc PATH/TO/posenc --articles PATH/TO/shared/seeds [-k NAME]

list, help and the tour; .npy versions and byte orders; table, apply (the sinusoid, RoPE in both
layouts, dimensions and positions, the learned table and its scatter-add gradient, float16 storage)
and bias (ALiBi's slope rule and its three variants, T5's buckets, KERPLE's two kernels, Sandwich's sum
of cosines, FIRE's MLP on the normalised log distance), every expectation computed independently in
numpy from the formulas in the headers (cli_reference.py). Attention: test_cli_attention.py; bad
inputs: test_cli_errors.py. Each posenc run may take 60 s.

Each case prints one line (PASS/FAIL); the last line is exactly "N passed, M failed"; exit 1 if any
case failed, 77 (skip) when numpy is missing (tests/e2e/harness.py).
"""
import glob
import json
import os
import sys

from cli_reference import (RNG, alibi_bias, alibi_learned_dw, alibi_slopes, expand_pos, fire_bias, kerple_bias, randn, rel,
                           rope, sandwich_bias, sinusoid, t5_bias, t5_buckets, write_raw_npy)
from harness import ARGS, case, close, load, main, numeric_grad, run
import numpy as np


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


if __name__ == "__main__":
    sys.exit(main(folder="dir", prefix="posenc-cli-", timeout=60))
