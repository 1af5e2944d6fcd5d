#!/usr/bin/python3
"""The posenc command's bad inputs, every class of them: non-zero exit (2), exactly one stderr line
"posenc: ..." naming the flag, nothing on stdout, and no output file left behind (nor a temporary).

    /usr/bin/python3 tests/e2e/test_cli_errors.py --posenc PATH/TO/posenc [--articles IGNORED] [-k NAME]

Each case prints one line (PASS/FAIL); the last line is exactly "N passed, M failed"; exit 1 if any
case failed, 77 (skip) when numpy is missing (tests/e2e/harness.py).
"""
import glob
import os
import sys

from cli_reference import randn, write_raw_npy
from harness import case, expect_error, main
import numpy as np


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
    # attention: a head dimension of 0 (q's, or k's and v's), head counts that do not divide, mismatched
    # shapes and dtypes
    z4 = d.save("z4.npy", randn(1, 3, 2, 0))
    expect_error(["attention", "nope", "--q", z4, "--k", z4, "--v", z4, "--out", o], "--q", [o])
    expect_error(["attention", "nope", "--q", x4, "--k", z4, "--v", z4, "--out", o], "--k", [o])
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
    sys.exit(main(folder="dir", prefix="posenc-cli-errors-", timeout=60))
