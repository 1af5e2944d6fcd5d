#!/usr/bin/python3
"""The CLI's error messages: each names the flag the user gave, the one that is wrong, in the user's
terms (no library argument names, no source files).

    /usr/bin/python3 tests/e2e/test_cli_messages.py --posenc PATH/TO/posenc [--articles ...] [-k NAME]

Every bad input must give exit 2, exactly one stderr line "posenc: FLAG: ...", nothing on stdout and
no output file (harness.expect_error); here the line must also START with the flag that is wrong
(expect_error only asks that the flag appear somewhere, and a product of sizes names several): sizes
too large name the factor out of range, a NaN or ±inf in a learned tensor names its flag, an option
of another encoding says which encodings take it, a --study folder that is not there is an error.
The inputs just inside the new bounds still run, and their values are checked against numpy here.
Each posenc run may take 60 s.

Each case prints one line (PASS/FAIL); the last line is exactly "N passed, M failed"; exit 1 if any
case failed, 77 (skip) when numpy is missing (tests/e2e/harness.py).
"""
import os
import subprocess
import sys

from harness import POSENC, case, close, expect_error, load, main, run, skip

try:
    import numpy as np
except ImportError:
    skip("numpy is not importable by this python")

RNG = np.random.default_rng(20250311)
BIG = 100000000000  # 1e11: any single size this large is a typo


def randn(*shape, dtype=np.float64):
    return RNG.standard_normal(shape).astype(dtype)


def names_first(args, flag, outputs=(), also=(), never=()):
    """expect_error, and the line is 'posenc: FLAG: ...' (FLAG first), holds every string of `also`
    and none of `never`. Returns the line."""
    line = expect_error(args, flag, outputs)
    assert line.startswith(f"posenc: {flag}: "), f"does not name {flag} first: {line!r}"
    for s in also:
        assert s in line, f"{s!r} missing from {line!r}"
    for s in never:
        assert s not in line, f"{s!r} in {line!r}"
    return line


# ------------------------------------------------------------------------------------------------
# 1. a product of sizes too large names the factor out of range
# ------------------------------------------------------------------------------------------------

@case
def bias_size_names_the_factor_out_of_range(d):
    o = d.out("o.npy")
    base = ["bias", "alibi", "--out", o]
    names_first(base + ["--heads", BIG, "--q-len", 3, "--k-len", 4], "--heads", [o],
                also=["--heads × --q-len × --k-len", f"{BIG} × 3 × 4"])
    names_first(base + ["--heads", 2, "--q-len", BIG, "--k-len", 4], "--q-len", [o])
    names_first(base + ["--heads", 2, "--q-len", 3, "--k-len", BIG], "--k-len", [o])
    # no factor alone is absurd, their product is (2^36 > 2^34): all three are shown
    names_first(base + ["--heads", 4096, "--q-len", 4096, "--k-len", 4096], "--heads", [o],
                also=["--heads × --q-len × --k-len = 4096 × 4096 × 4096"])
    for enc, extra in [("sandwich", []), ("t5", ["--weights", d.save("w.npy", randn(32, 2))])]:
        names_first(["bias", enc, "--heads", 2, "--q-len", BIG, "--k-len", 4, "--out", o, *extra], "--q-len", [o])


@case
def table_size_names_the_factor_out_of_range(d):
    o = d.out("o.npy")
    # sinusoidal: --dim alone is out of range (a dimension beyond 2^20), and --length in the product
    names_first(["table", "sinusoidal", "--length", 4, "--dim", BIG, "--out", o], "--dim", [o], also=["2^20"])
    names_first(["table", "sinusoidal", "--length", BIG, "--dim", 4, "--out", o], "--length", [o],
                also=["--length × --dim"])
    names_first(["table", "sinusoidal", "--length", 2 ** 25, "--dim", 1024, "--out", o], "--length", [o],
                also=[f"--length × --dim = {2 ** 25} × 1024"])
    # rope: the head dimension is bounded before its frequencies are allocated
    names_first(["table", "rope", "--length", 4, "--dim", BIG, "--out", o], "--dim", [o])
    names_first(["table", "rope", "--length", BIG, "--dim", 8, "--out", o], "--length", [o],
                also=["--length × --dim/2"])
    names_first(["table", "rope", "--length", BIG, "--dim", 8, "--rotary-dim", 4, "--out", o], "--length", [o],
                also=["--length × --rotary-dim/2"])
    # rope2d, mrope, xpos: refused before the library allocates positions and angles for BIG rows
    names_first(["table", "xpos", "--length", BIG, "--dim", 8, "--out", o], "--length", [o])
    names_first(["table", "mrope", "--length", BIG, "--dim", 8, "--mrope-section", "2,1,1", "--out", o],
                "--length", [o])
    names_first(["table", "rope2d", "--length", BIG, "--dim", 8, "--out", o], "--length", [o])
    names_first(["table", "xpos", "--length", 4, "--dim", BIG, "--out", o], "--dim", [o])
    # rope2d mixed's initialisation: H × r/2 frequencies
    names_first(["table", "rope2d", "--variant", "mixed", "--part", "init", "--heads", 2 ** 20, "--dim", 2 ** 20,
                 "--out", o], "--heads", [o], also=["--heads × --dim/2"])


@case
def sizes_just_inside_still_run(d):
    """The bounds refuse typos, not real sizes: a sinusoidal table at D = 2^20 (one row) and a long
    one, against numpy's sinusoid."""
    o = d.out("t.npy")
    for L, D in [(1, 2 ** 20), (3, 2 ** 20), (5000, 16)]:
        run("table", "sinusoidal", "--length", L, "--dim", D, "--offset", 7, "--out", o)
        pos = 7 + np.arange(L, dtype=np.float64)
        ang = pos[:, None] / 10000.0 ** (2.0 * np.arange(D // 2) / D)
        want = np.empty((L, D))
        want[:, 0::2], want[:, 1::2] = np.sin(ang), np.cos(ang)
        close(load(o, "float64"), want, f"sinusoidal L={L} D={D}")


# ------------------------------------------------------------------------------------------------
# 2. sizes that make an allocation explode are bounded and named
# ------------------------------------------------------------------------------------------------

def sandwich_ref(H, M, N, dim, base=10000.0):
    """Σ_{k=1}^{d/2} cos(r·base^(−2k/d)) − d/2, times H/(8(h+1)), r = key − query (query i at N − M + i)."""
    r = (np.arange(N)[None, :] - (N - M + np.arange(M))[:, None]).astype(np.float64)
    w = base ** (-2.0 * np.arange(1, dim // 2 + 1) / dim)
    s = np.cos(r[..., None] * w).sum(-1) - dim / 2
    return np.stack([s * H / (8.0 * (h + 1)) for h in range(H)])


@case
def sandwich_sinusoid_dim_is_bounded(d):
    o = d.out("o.npy")
    for dim in [BIG, 2 ** 16 + 2]:
        names_first(["bias", "sandwich", "--sinusoid-dim", dim, "--heads", 2, "--q-len", 3, "--k-len", 4,
                     "--out", o], "--sinusoid-dim", [o], also=["65536"], never=["memory"])
    x = d.save("x.npy", randn(1, 3, 2, 4))
    names_first(["attention", "sandwich", "--q", x, "--k", x, "--v", x, "--sinusoid-dim", BIG, "--out", o],
                "--sinusoid-dim", [o])
    # the bound itself still runs, and is right
    run("bias", "sandwich", "--sinusoid-dim", 2 ** 16, "--heads", 2, "--q-len", 2, "--k-len", 3, "--out", o)
    close(load(o, "float64"), sandwich_ref(2, 2, 3, 2 ** 16), "sandwich at d = 2^16", atol=1e-9, rtol=1e-9)


# ------------------------------------------------------------------------------------------------
# 3. table's rotary options say which encodings take them
# ------------------------------------------------------------------------------------------------

@case
def table_options_of_other_encodings(d):
    o = d.out("o.npy")
    p = d.save("p.npy", np.arange(4))
    no_source = ["rotary.h", ".cc", ".h)"]
    for enc, extra in [("rope", ["--dim", 8]), ("sinusoidal", ["--dim", 8])]:
        base = ["table", enc, "--length", 4, *extra, "--out", o]
        names_first(base + ["--role", "key"], "--role", [o], also=["xpos", f"{enc}'s table"], never=no_source)
        names_first(["table", enc, *extra, "--positions", p, "--out", o], "--positions", [o],
                    also=["rope2d, mrope and xpos"], never=no_source)
        names_first(base + ["--heads", 2], "--heads", [o], also=["rope2d --variant mixed --part init"],
                    never=no_source)
        names_first(base + ["--seed", 3], "--seed", [o], also=["--part init"], never=no_source)
    names_first(["table", "sinusoidal", "--length", 4, "--dim", 8, "--part", "cos", "--out", o], "--part", [o],
                also=["sinusoidal"], never=["only rope's"])
    # within the rotary tables: --role is xpos's, --heads is --part init's
    names_first(["table", "rope2d", "--length", 4, "--dim", 8, "--role", "key", "--out", o], "--role", [o],
                also=["xpos", "rope2d's table"])
    names_first(["table", "mrope", "--length", 4, "--dim", 8, "--mrope-section", "2,1,1", "--heads", 2,
                 "--out", o], "--heads", [o], also=["--part init"])
    # and xpos does take --role: the key's scale is the query's inverse (ρ^(−n/γ) vs ρ^(n/γ))
    q, k = d.out("q.npy"), d.out("k.npy")
    run("table", "xpos", "--length", 5, "--dim", 8, "--part", "scale", "--out", q)
    run("table", "xpos", "--length", 5, "--dim", 8, "--part", "scale", "--role", "key", "--out", k)
    close(load(q) * load(k), np.ones((5, 4)), "xpos query scale × key scale")


# ------------------------------------------------------------------------------------------------
# 4. NaN and ±inf in learned tensors are refused, naming the flag
# ------------------------------------------------------------------------------------------------

def with_bad(a, at, bad):
    a = a.copy()
    a[at] = bad
    return a


@case
def bias_learned_tensors_must_be_finite(d):
    o, H = d.out("o.npy"), 2
    geo = ["--heads", H, "--q-len", 3, "--k-len", 4, "--out", o]
    for bad in [np.nan, np.inf, -np.inf]:
        for dtype in [np.float64, np.float32]:
            w = d.save("w.npy", with_bad(randn(2, H, dtype=dtype), (1, 0), bad))
            names_first(["bias", "alibi", "--variant", "learned", "--weights", w, *geo], "--weights", [o],
                        also=["finite", "[1, 0]"])
            t = d.save("t.npy", with_bad(randn(32, H, dtype=dtype), (17, 1), bad))
            names_first(["bias", "t5", "--weights", t, *geo], "--weights", [o], also=["finite", "[17, 1]"])
        # the gradient run refuses them too (and writes neither output)
        g, dw = d.save("g.npy", randn(H, 3, 4)), d.out("dw.npy")
        w = d.save("w.npy", with_bad(randn(2, H), (0, 1), bad))
        names_first(["bias", "alibi", "--variant", "learned", "--weights", w, *geo, "--grad-out", g,
                     "--grad-weights", dw], "--weights", [o, dw])
        # kerple and fire refused them before; they still do
        r1, r2 = d.save("r1.npy", np.array([0.5, bad])), d.save("r2.npy", np.array([0.5, 0.5]))
        names_first(["bias", "kerple", "--r1", r1, "--r2", r2, *geo], "--r1", [o])
        fire = {n: d.save(f"{n}.npy", a) for n, a in [("mlp-w1", randn(4)), ("mlp-b1", with_bad(randn(4), 2, bad)),
                                                      ("mlp-w2", randn(H, 4)), ("mlp-b2", randn(H)),
                                                      ("c", np.array([0.1])), ("threshold", np.array([16.0]))]}
        names_first(["bias", "fire", *[x for n, p in fire.items() for x in (f"--{n}", p)], *geo], "--mlp-b1", [o])
    # finite weights, however large, still run: σ saturates (numpy: the bias −σ(w)·|r|)
    w = np.array([[800.0, -800.0], [-5.0, 1e300]])
    run("bias", "alibi", "--variant", "learned", "--weights", d.save("w.npy", w), *geo)
    r = (np.arange(4)[None, :] - (1 + np.arange(3))[:, None]).astype(np.float64)  # queries at 1..3 (N − M = 1)
    sig = 1 / (1 + np.exp(-np.clip(w, -700, 700)))
    want = np.stack([np.where(r < 0, sig[0, h] * r, -sig[1, h] * r) for h in range(H)])
    close(load(o, "float64"), want, "alibi learned with saturated weights")


@case
def attention_learned_tensors_must_be_finite(d):
    o = d.out("o.npy")
    B, M, H, D, R = 1, 3, 2, 4, 4
    x = d.save("x.npy", randn(B, M, H, D))
    qkv = ["--q", x, "--k", x, "--v", x, "--out", o]
    for bad in [np.nan, np.inf, -np.inf]:
        w = d.save("w.npy", with_bad(randn(2, H), (1, 1), bad))
        names_first(["attention", "alibi", "--variant", "learned", "--weights", w, *qkv], "--weights", [o],
                    also=["finite"])
        t = d.save("t.npy", with_bad(randn(32, H), (0, 0), bad))
        names_first(["attention", "t5", "--weights", t, *qkv], "--weights", [o])
        u, vb, W = randn(H, D), randn(H, D), randn(H, D, R)
        for flag, arrs in [("--u", (with_bad(u, (1, 2), bad), vb, W)), ("--v-bias", (u, with_bad(vb, (0, 3), bad), W)),
                           ("--rel-proj", (u, vb, with_bad(W, (1, 0, 2), bad)))]:
            files = [d.save(f"xl{i}.npy", a) for i, a in enumerate(arrs)]
            names_first(["attention", "xl", "--u", files[0], "--v-bias", files[1], "--rel-proj", files[2], *qkv],
                        flag, [o], also=["finite"])
        e = d.save("e.npy", with_bad(randn(6, D), (5, 1), bad))
        names_first(["attention", "cope", "--table", e, *qkv], "--table", [o], also=["[5, 1]"])
        # and their gradients are never computed from them
        g, dq = d.save("g.npy", randn(B, M, H, D)), d.out("dq.npy")
        names_first(["attention", "cope", "--table", e, *qkv, "--grad-out", g, "--grad-q", dq], "--table", [o, dq])


# ------------------------------------------------------------------------------------------------
# 5. check --study: a folder the user names must be there
# ------------------------------------------------------------------------------------------------

@case
def check_study_must_exist_when_given(d):
    missing = os.path.join(d.path, "nonexist")
    names_first(["check", "--study", missing, "--len", 40, "--dim", 8], "--study", also=["no such directory"])
    f = d.save("f.npy", np.zeros(3))
    names_first(["check", "--study", f, "--len", 40, "--dim", 8], "--study", also=["not a directory"])
    # a folder the user names without a study in it is an error too
    empty = os.path.join(d.path, "empty")
    os.mkdir(empty)
    names_first(["check", "--study", empty, "--len", 40, "--dim", 8], "--study", also=["no results.json"])
    # no --study, no study-out in the working folder: the default, as before (exit 0)
    r = subprocess.run([POSENC, "check", "--len", "40", "--dim", "8"], cwd=d.path, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and r.stderr == "", (r.returncode, r.stderr)
    assert "no study in study-out" in r.stdout, r.stdout
    # and check's ranges say what they got
    names_first(["check", "--len", 5], "--len", also=["got 5"])
    names_first(["check", "--dim", 7], "--dim", also=["got 7"])


@case
def check_study_results_are_validated_before_output(d):
    """A malformed results.json is one line naming --study and the field, with nothing on stdout (the
    table is built whole first); a well-formed one gives last/first perplexity."""
    def study(name, text):
        folder = os.path.join(d.path, name)
        os.mkdir(folder)
        with open(os.path.join(folder, "results.json"), "w") as f:
            f.write(text)
        return folder
    rope = lambda ev: '{"encodings": [{"encoding": "rope", "eval": %s}]}' % ev
    bad = [("empty_eval", rope("[]"), '"eval"'),
           ("no_eval", '{"encodings": [{"encoding": "rope"}]}', '"eval"'),
           ("ppl_string", rope('[{"len": 64, "ppl": "x"}]'), '"ppl"'),
           ("ppl_negative", rope('[{"len": 64, "ppl": -1}]'), '"ppl"'),
           ("ppl_missing", rope('[{"len": 64}]'), '"ppl"'),
           ("len_float", rope('[{"len": 6.5, "ppl": 3}]'), '"len"'),
           ("eval_string", rope('"x"'), '"eval"'),
           ("row_string", rope('["x"]'), '"len"'),
           ("name_number", '{"encodings": [{"encoding": 5, "eval": []}]}', '"encoding"'),
           ("encodings_string", '{"encodings": "x"}', '"encodings"'),
           ("top_array", '[1, 2]', '"encodings"'),
           ("not_json", '{"encodings": [', "not valid JSON")]
    for name, text, field in bad:
        names_first(["check", "--study", study(name, text), "--len", 40, "--dim", 8], "--study", also=[field])
    folder = os.path.join(d.path, "dir_json")
    os.makedirs(os.path.join(folder, "results.json"))
    names_first(["check", "--study", folder, "--len", 40, "--dim", 8], "--study", also=["not a regular file"])
    good = study("good", '{"encodings": [{"encoding": "rope", "eval": [{"len": 64, "ppl": 4.0}, {"len": 256, "ppl": 10.0}]},'
                         ' {"encoding": "learned", "eval": [{"len": 64, "ppl": 5.0}, {"len": 256, "ppl": null}]},'
                         ' {"encoding": "not-ours", "eval": [{"len": 64, "ppl": 1.0}]}]}')
    rows = {l.split()[0]: l for l in run("check", "--study", good, "--len", 40, "--dim", 8).stdout.splitlines()[1:]}
    assert "2.5x ppl at 256 vs 64" in rows["rope"], rows["rope"]
    assert "cannot run at 256" in rows["learned"], rows["learned"]
    assert "not in the study" in rows["alibi"], rows["alibi"]


@case
def stdout_that_cannot_be_written_is_an_error(d):
    """Output that never reached stdout (here /dev/full, as on a full disk) is exit 1 with one line
    naming stdout, for the commands that print to it, --help included; the same runs to a pipe exit 0."""
    if not os.path.exists("/dev/full"):
        return "no /dev/full here"
    for args in (["list"], ["list", "--json"], ["tour"], ["--help"], ["rope-config", "--help"],
                 ["check", "--len", "40", "--dim", "8"]):
        with open("/dev/full", "w") as full:
            r = subprocess.run([POSENC, *args], stdout=full, stderr=subprocess.PIPE, text=True, timeout=60)
        lines = r.stderr.splitlines()
        assert r.returncode == 1, (args, r.returncode, r.stderr)
        assert len(lines) == 1 and lines[0].startswith("posenc: stdout: "), (args, r.stderr)
        ok = subprocess.run([POSENC, *args], capture_output=True, text=True, timeout=60)
        assert ok.returncode == 0 and ok.stdout and not ok.stderr, (args, ok.returncode, ok.stderr)


@case
def flags_outside_commands_and_flag_values_are_named(d):
    names_first(["--bogus"], "--bogus", also=["unknown flag"])
    names_first(["--bogus=3", "list"], "--bogus")
    names_first(["--version", "list"], "--version")
    assert run("--version").stdout.startswith("posenc ")
    names_first(["list", "--json=3"], "--json", also=["takes no value"])
    names_first(["bench", "--memory=0"], "--memory", also=["takes no value"])
    names_first(["bench", "--filter", ""], "--filter", also=["empty"])
    # M-RoPE ids past 2^34 values, or past this machine's memory, name --segments (not a bare "out of memory")
    o = d.out("ids.npy")
    names_first(["mrope-positions", "--segments", "text:3,text:20000000000", "--out", o], "--segments", [o],
                also=["2^34"])
    names_first(["mrope-positions", "--segments", "image:100000x100000x100000", "--out", o], "--segments", [o])
    # CLI11's own wordings, in the "posenc: FLAG: ..." shape; a boolean flag given twice; a flag taken for a path
    x = d.save("x.npy", randn(1, 4, 2, 8, dtype=np.float32))
    names_first(["apply", "rope", "--in", x], "--out", also=["is required"])
    names_first(["apply", "rope", "--in", x, "--out", o, "--theta"], "--theta", also=["expected a value"])
    names_first(["list", "--json", "--json"], "--json", also=["given 2 times"])
    names_first(["apply", "rope", "--in", x, "--out", "--theta"], "--out", also=["looks like a flag"])
    assert not os.path.exists(os.path.join(d.path, "--theta"))
    # an empty input may declare any D: D past 2^20 is refused before per-dimension tables are sized
    z = os.path.join(d.path, "z.npy")
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 0, 2, 1073741824), }"
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    with open(z, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode())
    names_first(["apply", "rope", "--in", z, "--out", o], "--in", [o], also=["2^20"])
    names_first(["attention", "nope", "--q", z, "--k", z, "--v", z, "--out", o], "--q", [o], also=["2^20"])
    # a config read from a device without end stops at 16 MiB
    if os.path.exists("/dev/zero"):
        names_first(["rope-config", "/dev/zero"], "CONFIG", also=["16 MiB"])
    # a byte of the input quoted in a message (here the .npy magic, 0x93) is shown escaped, not sent raw
    r = subprocess.run([POSENC, "rope-config", x], capture_output=True, timeout=60)
    assert r.returncode == 2 and b"\\x93" in r.stderr and b"\x93" not in r.stderr, r.stderr
    r.stderr.decode("utf-8")  # the line is UTF-8


@case
def errors_name_the_flag_that_caused_them(d):
    x, o = d.save("x.npy", randn(1, 8, 2, 8, dtype=np.float32)), d.out("y.npy")
    # a tensor this variant does not read: in the command line's words
    names_first(["apply", "rope2d", "--variant", "axial", "--freqs", d.save("f.npy", randn(2, 2, 2)), "--in", x,
                 "--out", o], "--freqs", [o], also=["leave that flag out"], never=["view"])
    # --theta beside --inv-freq would be ignored
    inv = d.save("inv.npy", np.ones(4))
    names_first(["apply", "rope", "--inv-freq", inv, "--theta", 5, "--in", x, "--out", o], "--theta", [o])
    # a learned table shorter than the input; a start past its end within it stays --offset's
    x3 = d.save("x3.npy", randn(1, 8, 16, dtype=np.float32))
    names_first(["apply", "learned", "--table", d.save("t4.npy", randn(4, 16, dtype=np.float32)), "--in", x3,
                 "--out", o], "--table", [o], also=["4 rows", "8 positions"])
    names_first(["apply", "learned", "--table", d.save("t8.npy", randn(8, 16, dtype=np.float32)), "--offset", 2,
                 "--in", x3, "--out", o], "--offset", [o])
    tn = randn(8, 16, dtype=np.float32)
    tn[2, 3] = np.nan
    names_first(["apply", "learned", "--table", d.save("tn.npy", tn), "--in", x3, "--out", o], "--table", [o],
                also=["finite", "row 2"])
    # an xPos scale base so small that no position but c fits float32 is the scale base's fault
    for role in ("query", "key"):
        names_first(["apply", "xpos", "--role", role, "--scale-base", "1e-300", "--in", x, "--out", o],
                    "--scale-base", [o])
    # but a position far from c with the default scale base is the position's
    names_first(["apply", "xpos", "--role", "key", "--offset", 100000, "--in", x, "--out", o], "--offset", [o])
    # a gradient asked of an ALiBi without parameters says which variant has them
    b, g = d.out("b.npy"), d.save("g.npy", randn(2, 4, 4))
    names_first(["bias", "alibi", "--heads", 2, "--q-len", 4, "--k-len", 4, "--out", b, "--grad-out", g],
                "--grad-out", [b], also=["no learned parameters", "--variant learned"])
    # attention scores past float32: NaN rows before; now --scale (or --q) is named
    q, k, v = (d.save(f"{n}.npy", randn(1, 4, 2, 8, dtype=np.float32)) for n in "qkv")
    names_first(["attention", "nope", "--q", q, "--k", k, "--v", v, "--scale", "1e308", "--out", o], "--scale", [o])
    big = d.save("big.npy", (randn(1, 4, 2, 8) * 1e20).astype(np.float32))
    names_first(["attention", "nope", "--q", big, "--k", big, "--v", v, "--out", o], "--q", [o])
    ok = d.out("ok.npy")
    run("attention", "nope", "--q", q, "--k", k, "--v", v, "--scale", "1e30", "--out", ok)
    assert np.isfinite(load(ok, "float32")).all()
    # a float32 table cannot hold angles past 3.4e38 (it wrote inf); float64 can
    t = d.out("t.npy")
    names_first(["table", "rope", "--theta", "1e-308", "--dtype", "float32", "--length", 4, "--dim", 8, "--out", t],
                "--dtype", [t], also=["float64"])
    run("table", "rope", "--theta", "1e-308", "--length", 4, "--dim", 8, "--out", t)
    assert np.isfinite(load(t, "float64")).all()
    os.remove(t)
    # FIRE's MLP overflowing to +inf names its parameters
    W, H = 4, 2
    fire = ["--mlp-b1", d.save("b1.npy", np.zeros(W)), "--mlp-w2", d.save("w2.npy", np.ones((H, W))),
            "--mlp-b2", d.save("b2.npy", np.zeros(H)), "--c", d.save("c.npy", np.ones(1)),
            "--threshold", d.save("th.npy", np.ones(1)), "--heads", H, "--q-len", 4, "--k-len", 4]
    names_first(["bias", "fire", "--mlp-w1", d.save("w1.npy", np.full(W, 1e308)), *fire, "--out", b], "--mlp-w1", [b],
                also=["+inf"])
    names_first(["bias", "fire", "--mlp-w1", d.save("w1f.npy", np.ones(W, dtype=np.float32)), *fire, "--out", b],
                "--mlp-w1", [b], also=["like --mlp-w2"])  # one dtype for the MLP
    # flags that would be ignored: nope's positions, rope2d mixed's --theta beside --freqs, an empty
    # list (it read as no list), --attention-factor for angles, --eval-tokens with --task
    names_first(["apply", "nope", "--offset", 3, "--in", x, "--out", o], "--offset", [o])
    names_first(["apply", "rope2d", "--variant", "mixed", "--freqs", d.save("fm.npy", randn(2, 2, 2)), "--theta", 5,
                 "--in", x, "--out", o], "--theta", [o])
    names_first(["apply", "rope", "--inv-freq", d.save("e0.npy", np.zeros(0)), "--in", x, "--out", o],
                "--inv-freq", [o], also=["empty"])
    names_first(["table", "rope", "--length", 4, "--dim", 8, "--attention-factor", 2, "--out", t], "--attention-factor",
                [t])
    names_first(["study", "--task", "copy", "--eval-tokens", 512, "--out", d.out("st")], "--eval-tokens")
    # finite inputs whose rotation leaves the dtype: an error (it wrote inf); an inf already in --in
    # passes through as in any float computation
    names_first(["apply", "rope", "--attention-factor", "1e39", "--in", x, "--out", o], "--attention-factor", [o])
    big = d.save("big16.npy", np.full((1, 8, 2, 16), 60000, dtype=np.float16))
    names_first(["apply", "rope", "--in", big, "--out", o], "--in", [o], also=["float16"])
    xi = randn(1, 8, 2, 8, dtype=np.float32)
    xi[0, 0, 0, 0] = np.inf
    run("apply", "rope", "--in", d.save("xinf.npy", xi), "--out", o)
    assert np.isinf(load(o, "float32")).any()
    os.remove(o)
    names_first(["bench", "--memory", "--memory-dtype", ""], "--memory-dtype")
    # attention's dO keeps q's dtype (as apply's dY keeps X's); a query offset beside query positions
    # without --causal would be ignored
    g64 = d.save("g64.npy", randn(1, 4, 2, 8))
    names_first(["attention", "nope", "--q", q, "--k", k, "--v", v, "--grad-out", g64, "--grad-q", d.out("gq.npy"),
                 "--out", o], "--grad-out", [o], also=["float32 like --q"])
    qp = d.save("qp.npy", np.arange(8, dtype=np.int64).reshape(2, 4))
    names_first(["attention", "rope2d", "--q", q, "--k", k, "--v", v, "--q-positions", qp, "--k-positions", qp,
                 "--q-offset", 3, "--out", o], "--q-offset", [o])
    # booleans say every spelling they take
    names_first(["apply", "rope", "--rope-type", "yarn", "--factor", 2, "--original-max-position", 4,
                 "--truncate", "maybe", "--in", x, "--out", o], "--truncate", [o], also=["yes/no"])


# ------------------------------------------------------------------------------------------------
# 6. flags, not library names
# ------------------------------------------------------------------------------------------------

@case
def messages_name_flags_not_library_arguments(d):
    o = d.out("o.npy")
    # r2's dtype is compared with --r1, not with the library's "r1"
    r1, r2 = d.save("r1.npy", np.array([0.5, 1.0])), d.save("r2.npy", np.array([0.5, 1.0], np.float32))
    geo = ["--heads", 2, "--q-len", 3, "--k-len", 4, "--out", o]
    names_first(["bias", "kerple", "--r1", r1, "--r2", r2, *geo], "--r2", [o], also=["like --r1"])
    # --grad-out in another dtype than the bias: named, with the flag the dtype came from
    g32, dw = d.save("g32.npy", randn(2, 3, 4, dtype=np.float32)), d.out("dw.npy")
    w = d.save("w.npy", randn(32, 2))
    names_first(["bias", "t5", "--weights", w, *geo, "--grad-out", g32, "--grad-weights", dw], "--grad-out",
                [o, dw], also=["--weights"], never=["dbias", "dweights"])
    # q, k in different dtypes: "--k: expected float64 like --q"
    x, x32 = d.save("x.npy", randn(1, 3, 2, 4)), d.save("x32.npy", randn(1, 3, 2, 4, dtype=np.float32))
    names_first(["attention", "nope", "--q", x, "--k", x32, "--v", x, "--out", o], "--k", [o], also=["like --q"])
    # an odd head dimension without --rotary-dim: D is what the user gave, not --rotary-dim
    names_first(["table", "rope", "--length", 4, "--dim", 5, "--out", o], "--dim", [o], never=["--rotary-dim"])
    names_first(["table", "xpos", "--length", 4, "--dim", 5, "--out", o], "--dim", [o], never=["--rotary-dim"])
    names_first(["table", "rope2d", "--length", 4, "--dim", 6, "--out", o], "--dim", [o], never=["--rotary-dim"])
    x5 = d.save("x5.npy", randn(1, 3, 2, 5))
    names_first(["attention", "rope", "--q", x5, "--k", x5, "--v", x5, "--out", o], "--q", [o],
                never=["--rotary-dim"])
    for enc, extra in (("rope", []), ("rope2d", []), ("xpos", ["--role", "query"])):
        names_first(["apply", enc, "--in", x5, "--out", o, *extra], "--in", [o], also=["head dimension"],
                    never=["--rotary-dim"])
    # when the user does give --rotary-dim, it is the one named
    names_first(["table", "rope", "--length", 4, "--dim", 8, "--rotary-dim", 3, "--out", o], "--rotary-dim", [o])
    names_first(["apply", "rope", "--in", x5, "--out", o, "--rotary-dim", 3], "--rotary-dim", [o])


if __name__ == "__main__":
    sys.exit(main(folder="dir", prefix="posenc-msg-", timeout=60))
