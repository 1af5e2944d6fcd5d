#!/usr/bin/python3
"""The posenc command's attention end to end: every encoding, float32 and float64, causal or not, with
lse, against numpy's attention (cli_reference.py), and its gradients against central differences of
a random-projection loss.

    /usr/bin/python3 tests/e2e/test_cli_attention.py --posenc PATH/TO/posenc [--articles IGNORED] [-k NAME]

Each case prints one line (PASS/FAIL); the last line is exactly "N passed, M failed"; exit 1 if any
case failed, 77 (skip) when numpy is missing (tests/e2e/harness.py).
"""
import sys

from cli_reference import attention, randn, RNG
from harness import case, close, load, main, numeric_grad, run
import numpy as np


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


if __name__ == "__main__":
    sys.exit(main(folder="dir", prefix="posenc-cli-attention-", timeout=60))
