#!/usr/bin/python3
"""posenc attention with a NaN or inf in q, k or v, end to end, against PyTorch's plain attention.

    /usr/bin/python3 tests/e2e/test_attention_nan.py --posenc PATH/TO/posenc [--articles ...] [-k NAME]

The oracle is softmax(scale·q·kᵀ, masked_fill(−inf) when causal)·v in torch (float64, autograd for
the gradients), grouped heads by repeating k and v. Each case runs `posenc attention nope` on .npy
files, once at a size the library hands to its reference (B·Hq·M·N < 2^14) and once at one it hands
to the fused kernel, and checks that the outputs (and gradients) are NaN exactly where torch's are,
and close to them elsewhere. A NaN in q used to come out as a row of zeros with lse −inf; a NaN in k
was dropped from the fused kernel's softmax. The backward is compared without a mask: with one,
torch's dense products also send a NaN through the masked pairs (0·NaN), which posenc does not
(posenc/attention.h) — the unit tests (tests/test_attention_nan.cc) hold that case against the rule.

Each case prints one line (PASS/FAIL); the last line is exactly "N passed, M failed"; exit 1 if any
case failed, 77 (skip) when numpy or torch is missing (tests/e2e/harness.py).
"""
import sys

from harness import case, close, load, main, run, skip

try:
    import numpy as np
    import torch
except ImportError as e:
    skip(str(e))

RNG = np.random.default_rng(20261123)
SMALL = (2, 8, 8, 4, 2, 16)     # B, M, N, Hq, Hkv, D: 2·4·8·8 pairs, the reference
FUSED = (2, 130, 130, 4, 2, 16)  # 2·4·130·130 ≥ 2^14 pairs, the fused kernel (two key blocks)


def oracle(q, k, v, causal, dout=None):
    """out, lse (and dq, dk, dv given dout) in torch float64; q [B, M, Hq, D], k, v [B, N, Hkv, D]."""
    B, M, Hq, D = q.shape
    N, Hkv = k.shape[1], k.shape[2]
    tq, tk, tv = (torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in (q, k, v))
    kk = tk.repeat_interleave(Hq // Hkv, dim=2)
    vv = tv.repeat_interleave(Hq // Hkv, dim=2)
    s = torch.einsum("bmhd,bnhd->bhmn", tq, kk) / D ** 0.5
    if causal:  # key j sits at j, query i at N − M + i
        qp = torch.arange(M)[:, None] + (N - M)
        s = s.masked_fill(torch.arange(N)[None, :] > qp, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    out = torch.einsum("bhmn,bnhd->bmhd", torch.softmax(s, dim=-1), vv)
    if dout is None:
        return out.detach().numpy(), lse.detach().numpy()
    out.backward(torch.tensor(dout, dtype=torch.float64))
    return out.detach().numpy(), lse.detach().numpy(), tq.grad.numpy(), tk.grad.numpy(), tv.grad.numpy()


def same_nans(got, want, what):
    """NaN exactly where want has NaN, the rest close (float32 tolerances). Returns the NaN count."""
    nan = np.isnan(want)
    assert (np.isnan(got) == nan).all(), (
        f"{what}: NaN at {np.argwhere(np.isnan(got) != nan)[:3].tolist()} differs "
        f"(got {int(np.isnan(got).sum())} NaNs, want {int(nan.sum())})")
    close(np.where(nan, 0, got), np.where(nan, 0, want), what, atol=1e-5, rtol=1e-4)
    return int(nan.sum())


def inputs(shape):
    B, M, N, Hq, Hkv, D = shape
    return (RNG.standard_normal((B, M, Hq, D)).astype(np.float32),
            RNG.standard_normal((B, N, Hkv, D)).astype(np.float32),
            RNG.standard_normal((B, N, Hkv, D)).astype(np.float32))


def forward(d, q, k, v, causal):
    args = ["attention", "nope", "--q", d.save("q.npy", q), "--k", d.save("k.npy", k), "--v", d.save("v.npy", v),
            "--out", d.out("o.npy"), "--lse", d.out("l.npy")] + (["--causal"] if causal else [])
    run(*args)
    return load(d.out("o.npy"), "float32"), load(d.out("l.npy"), "float64")


def check_forward(d, where, value, causal):
    counts = []
    for shape in (SMALL, FUSED):
        q, k, v = inputs(shape)
        x = {"q": q, "k": k, "v": v}[where]
        x[0, 3, 1, 5] = value  # batch row 0, token 3, head 1, dimension 5
        out, lse = forward(d, q, k, v, causal)
        want_out, want_lse = oracle(q, k, v, causal)
        n = same_nans(out, want_out, f"out {shape}")
        if np.isinf(value):  # torch's logsumexp says +inf; posenc's NaN row has lse NaN (attention.h)
            row_nan = np.isnan(out).all(axis=-1).transpose(0, 2, 1)  # [B, Hq, M]
            assert (np.isnan(lse) == row_nan).all(), f"{shape}: lse NaN not exactly at the NaN rows"
            assert (np.isinf(want_lse) == row_nan).all()
        else:
            same_nans(lse, want_lse, f"lse {shape}")
        assert n > 0, f"{shape}: no NaN in out"
        counts.append(n)
    return f"NaNs in out: {counts[0]} (reference path), {counts[1]} (fused)"


@case("a NaN in q makes its row NaN (out, lse), not a row of zeros")
def nan_in_q(d):
    return check_forward(d, "q", np.nan, False)


@case("a NaN in q, causal")
def nan_in_q_causal(d):
    return check_forward(d, "q", np.nan, True)


@case("a NaN in k makes NaN every row that sees that key, and only those (causal)")
def nan_in_k_causal(d):
    return check_forward(d, "k", np.nan, True)


@case("a NaN in k, no mask")
def nan_in_k(d):
    return check_forward(d, "k", np.nan, False)


@case("a NaN in v reaches its own dimension of every row (no mask: torch's P·v would send it through masked pairs too)")
def nan_in_v(d):
    return check_forward(d, "v", np.nan, False)


@case("+inf in q: a +inf logit makes the row NaN, as torch's softmax does")
def inf_in_q(d):
    return check_forward(d, "q", np.inf, False)


@case("backward with a NaN in q, k or v: dq, dk, dv NaN where torch's are")
def backward(d):
    counts = []
    for where in ("q", "k", "v"):
        for shape in (SMALL, FUSED):
            q, k, v = inputs(shape)
            dout = RNG.standard_normal(q.shape).astype(np.float32)
            {"q": q, "k": k, "v": v}[where][1, 4, 1, 2] = np.nan
            run("attention", "nope", "--q", d.save("q.npy", q), "--k", d.save("k.npy", k), "--v", d.save("v.npy", v),
                "--out", d.out("o.npy"), "--grad-out", d.save("do.npy", dout), "--grad-q", d.out("dq.npy"),
                "--grad-k", d.out("dk.npy"), "--grad-v", d.out("dv.npy"))
            _, _, wq, wk, wv = oracle(q, k, v, False, dout)
            n = 0
            for name, want in (("dq", wq), ("dk", wk), ("dv", wv)):
                n += same_nans(load(d.out(name + ".npy"), "float32"), want, f"{name} ({where}, {shape})")
            assert n > 0, f"{where} {shape}: no NaN in the gradients"
            counts.append(n)
    return f"NaNs in dq+dk+dv: {counts}"


@case("causal rows that see no key stay 0 with lse −inf beside a NaN")
def masked_rows(d):
    # M > N: query i sits at N − M + i, so the first M − N queries see no key
    B, M, N, Hq, Hkv, D = 2, 140, 130, 4, 2, 16
    q, k, v = inputs((B, M, N, Hq, Hkv, D))
    q[0, 2, 1, 5] = np.nan   # a row that sees no key
    k[0, 0, 0, 5] = np.nan   # seen by every query from M − N on
    out, lse = forward(d, q, k, v, True)
    assert (out[:, : M - N] == 0).all(), "rows with no key: out not 0"
    assert np.isneginf(lse[:, :, : M - N]).all(), "rows with no key: lse not -inf"
    want_out, want_lse = oracle(q, k, v, True)
    same_nans(out[:, M - N:], want_out[:, M - N:], "out")
    return f"{int(np.isnan(out).sum())} NaNs, rows 0..{M - N - 1} zero"


sys.exit(main(folder="dir"))
