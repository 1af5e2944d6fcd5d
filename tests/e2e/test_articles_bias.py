#!/usr/bin/python3
"""The five source articles' own code (docs/articles.md) as the oracle for the posenc CLI: ALiBi's
slopes and its symmetric, nonsymmetric and learned lines, T5's buckets, and attention with them (the
sinusoids and RoPE: test_articles.py; the reading of the articles and the patches: article_code.py).

    /usr/bin/python3 tests/e2e/test_articles_bias.py --posenc PATH/TO/posenc --articles PATH/TO/shared/seeds

Each case prints one line (PASS with what it measured, or FAIL); the last line is exactly "N passed,
M failed"; exit 1 if any case failed, 2 without --articles, 77 (skip) with a one-line reason when the
articles, numpy or torch are missing (tests/e2e/harness.py). Each posenc run may take 60 s.
"""
import math
import sys

from article_code import F32, alibi_lines, default_dtype, load, npy, out_path, posenc, randn, rope000, tol
from harness import case, close, expect_error, main
import numpy as np
import torch


# ---- ALiBi ---------------------------------------------------------------------------------------

HEADS = [1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32]


@case("“Position Embedding” get_slopes vs bias alibi (slope = −B[h,0,0] with --q-offset 0 --k-offset 1, and −B[h,0,1] with "
      "--q-offset 0) for H in " + str(HEADS))
def _():
    get_slopes = load(2, "get_slopes")["get_slopes"]
    worst = 0.0
    for H in HEADS:
        B = posenc("bias", "alibi", "--heads", H, "--q-len", 1, "--k-len", 1, "--q-offset", 0, "--k-offset", 1)
        want = np.array(get_slopes(H))
        worst = max(worst, close(-B[:, 0, 0], want, **tol(B.dtype), what=f"H={H} slopes"))
        B2 = posenc("bias", "alibi", "--heads", H, "--q-len", 1, "--k-len", 2, "--q-offset", 0)
        close(-B2[:, 0, 1], want, **tol(B2.dtype), what=f"H={H} slopes from B[h,0,1]")
    return f"max err {worst:.1e}"


@case("“Position Embedding” symmetric ALiBi lines (−slope·|j−i|) vs bias alibi --variant symmetric, incl. offsets")
def _():
    worst = 0.0
    for H in HEADS:
        ns = alibi_lines("symmetric", H, 40)
        A = ns["alibi"][0]  # [H, 40, 40], float32 (torch.Tensor slopes)
        B = posenc("bias", "alibi", "--variant", "symmetric", "--heads", H, "--q-len", 40, "--k-len", 40)
        worst = max(worst, close(B, A, **F32, what=f"H={H}"))
        # The article's comment says "只有forward" (only one direction); the code's bias is symmetric.
        assert np.array_equal(B, np.swapaxes(B, 1, 2)), "symmetric bias expected"
        Bo = posenc("bias", "alibi", "--heads", H, "--q-len", 7, "--k-len", 12, "--q-offset", 20, "--k-offset", 5,
                    "--dtype", "float32")
        assert Bo.dtype == np.float32, Bo.dtype
        worst = max(worst, close(Bo, A[:, 20:27, 5:17], **F32, what=f"H={H} offsets, float32"))
    # A tensor-parallel shard holding heads 4..7 of 8 passes its slopes (the article's, for 8 heads).
    A = alibi_lines("symmetric", 8, 16)["alibi"][0]
    S = np.array(load(2, "get_slopes")["get_slopes"](8)[4:8])
    Bs = posenc("bias", "alibi", "--heads", 4, "--q-len", 16, "--k-len", 16, "--slopes", npy(S))
    worst = max(worst, close(Bs, A[4:8], **F32, what="--slopes shard"))
    return f"max err {worst:.1e}; bias == its transpose; --slopes shard ok"


@case("“Position Embedding” nonsymmetric ALiBi lines (triu/tril −inf masks, slopes of H/2 repeated) vs --variant nonsymmetric")
def _():
    worst = 0.0
    for H in [h for h in HEADS if h % 2 == 0]:
        ns = alibi_lines("nonsymmetric", H, 32)
        A = (ns["alibi"] + ns["nonsym_mask"])[0]  # [H, 32, 32]
        B = posenc("bias", "alibi", "--variant", "nonsymmetric", "--heads", H, "--q-len", 32, "--k-len", 32)
        worst = max(worst, close(B, A, **F32, what=f"H={H}"))
        Bo = posenc("bias", "alibi", "--variant", "nonsymmetric", "--heads", H, "--q-len", 5, "--k-len", 9,
                    "--q-offset", 12, "--k-offset", 10)
        worst = max(worst, close(Bo, A[:, 12:17, 10:19], **F32, what=f"H={H} offsets"))
    # Odd H: the article's lines silently build 2·(H//2) heads (H − 1); posenc refuses odd H.
    ns = alibi_lines("nonsymmetric", 5, 4)
    assert (ns["alibi"] + ns["nonsym_mask"]).shape[1] == 4
    o = out_path("refused")
    err = expect_error(["bias", "alibi", "--variant", "nonsymmetric", "--heads", 5, "--q-len", 4, "--k-len", 4,
                        "--out", o], "--heads", [o])
    return f"max err {worst:.1e} (−inf at the same places); odd H: article builds H−1 heads, posenc: {err!r}"


@case("“Position Embedding” learned ALiBi lines (−sigmoid(w), triu(right) + tril(left)) vs --variant learned, and dW vs autograd")
def _():
    worst, worst_g = 0.0, 0.0
    for H in [1, 4, 6, 8]:
        torch.manual_seed(100 + H)  # the article initialises w ~ N(−2, 1)
        ns = alibi_lines("learned", H, 24)
        A, wl, wr = ns["alibi"], ns["w_left"], ns["w_right"]  # A [H, 24, 24]
        W = torch.stack([wl, wr]).detach()  # row 0 = left (past, j < i), row 1 = right (future, j > i)
        dB = randn(H, 24, 24)
        (A * dB).sum().backward()
        B, dW = posenc("bias", "alibi", "--variant", "learned", "--heads", H, "--q-len", 24, "--k-len", 24,
                       "--weights", npy(W), "--grad-out", npy(dB), outs=("--out", "--grad-weights"))
        worst = max(worst, close(B, A, **F32, what=f"H={H} bias"))
        worst_g = max(worst_g, close(dW, torch.stack([wl.grad, wr.grad]), rtol=1e-5, atol=1e-4, what=f"H={H} dW"))
        Bo = posenc("bias", "alibi", "--variant", "learned", "--heads", H, "--q-len", 6, "--k-len", 10,
                    "--q-offset", 14, "--k-offset", 3, "--weights", npy(W))
        worst = max(worst, close(Bo, A[:, 14:20, 3:13], **F32, what=f"H={H} offsets"))
    return f"bias max err {worst:.1e}, dW max err {worst_g:.1e}"


# ---- T5 ------------------------------------------------------------------------------------------

def t5_bucket(relative_position, bidirectional=True, num_buckets=32, max_distance=128):
    """OURS (the articles describe T5 but give no code): Mesh TensorFlow's _relative_position_bucket as
    ported to Hugging Face T5, in torch, with the log term in float32 as both do.
    relative_position = key − query (long tensor)."""
    relative_buckets = torch.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        relative_buckets += (relative_position > 0).to(torch.long) * num_buckets
        relative_position = torch.abs(relative_position)
    else:
        relative_position = -torch.min(relative_position, torch.zeros_like(relative_position))
    max_exact = num_buckets // 2
    is_small = relative_position < max_exact
    if_large = max_exact + (torch.log(relative_position.float() / max_exact)
                            / math.log(max_distance / max_exact) * (num_buckets - max_exact)).to(torch.long)
    if_large = torch.min(if_large, torch.full_like(if_large, num_buckets - 1))
    return relative_buckets + torch.where(is_small, relative_position, if_large)


@case("T5 buckets (our HF _relative_position_bucket, float32 log) vs bias t5, distances to ±1000, and dW")
def _():
    H = 3
    geoms = [(24, 24, 0, 0), (8, 1100, 1000, 0), (8, 1100, 0, 0), (16, 64, 0, 940), (16, 64, 980, 0)]
    msg = []
    for bidir, nb, md in [(True, 32, 128), (False, 32, 128), (True, 64, 256), (False, 16, 64), (True, 8, 20),
                          (False, 128, 1000)]:
        W = randn(nb, H)
        W64 = W.double().requires_grad_(True)  # the gradient reference sums thousands of terms: in double
        checked = 0
        for M, N, qo, ko in geoms:
            rel = (torch.arange(ko, ko + N)[None, :] - torch.arange(qo, qo + M)[:, None])  # key − query
            bucket = t5_bucket(rel, bidir, nb, md)
            want = W64[bucket].permute(2, 0, 1)  # [H, M, N]
            dB = randn(H, M, N)
            W64.grad = None
            (want * dB.double()).sum().backward()
            B, dW = posenc("bias", "t5", "--heads", H, "--q-len", M, "--k-len", N, "--q-offset", qo,
                           "--k-offset", ko, "--bidirectional", str(bidir).lower(), "--num-buckets", nb,
                           "--max-distance", md, "--weights", npy(W), "--grad-out", npy(dB),
                           outs=("--out", "--grad-weights"))
            close(B, want, rtol=0, atol=0, what=f"bias (bidirectional={bidir}, nb={nb}, md={md}, geom={M, N, qo, ko})")
            close(dW, W64.grad, **F32, what=f"dW (bidirectional={bidir}, nb={nb}, md={md})")
            checked += M * N
        msg.append(f"{'bi' if bidir else 'uni'}/{nb}/{md}")
    return f"bias exact and dW for {', '.join(msg)} (bi/uni, num_buckets, max_distance); {checked} (query, key) pairs each"


# ---- attention with the articles' encodings inside ---------------------------------------------

def softmax_attention(q, k, v, bias, scale):
    """Plain attention (ours): q [B, M, H, D], k, v [B, N, H, D], bias [H, M, N] (−inf = masked)."""
    logits = torch.einsum("bmhd,bnhd->bhmn", q, k) * scale + bias
    return torch.einsum("bhmn,bnhd->bmhd", torch.softmax(logits, dim=-1), v)


@case("attention rope --causal vs “位置编码” RoPE (float64) on q, k + softmax attention; dQ, dK, dV by autograd")
def _():
    B, L, H, D = 2, 14, 3, 16
    q, k, v = (randn(B, L, H, D, dtype=torch.float64).requires_grad_(True) for _ in range(3))
    dO = randn(B, L, H, D, dtype=torch.float64)
    with default_dtype(torch.float64):
        r = rope000(D, dtype=torch.float64)
        causal = torch.triu(torch.full((L, L), float("-inf")), 1)
        out = softmax_attention(r(q), r(k), v, causal, 1 / math.sqrt(D))
    (out * dO).sum().backward()
    got, dq, dk, dv = posenc("attention", "rope", "--layout", "interleaved", "--causal", "--q", npy(q), "--k", npy(k),
                             "--v", npy(v), "--grad-out", npy(dO), outs=("--out", "--grad-q", "--grad-k", "--grad-v"))
    e = [close(got, out, rtol=1e-10, atol=1e-10, what="out")]
    for name, g, w in (("dQ", dq, q.grad), ("dK", dk, k.grad), ("dV", dv, v.grad)):
        e.append(close(g, w, rtol=1e-10, atol=1e-10, what=name))
    return f"out err {e[0]:.1e}, grads err {max(e[1:]):.1e}"


@case("attention alibi nonsymmetric / learned vs “Position Embedding”'s ALiBi lines + its mask added to the logits; learned dW")
def _():
    B, L, H, D = 2, 12, 4, 8
    q, k, v = (randn(B, L, H, D, dtype=torch.float64) for _ in range(3))
    ns = alibi_lines("nonsymmetric", H, L)
    bias = (ns["alibi"] + ns["nonsym_mask"])[0].double()  # "attn_weights += nonsym_mask[...]"
    want = softmax_attention(q, k, v, bias, 1 / math.sqrt(D))
    got = posenc("attention", "alibi", "--variant", "nonsymmetric", "--q", npy(q), "--k", npy(k), "--v", npy(v))
    e1 = close(got, want, **F32)  # the article's slopes are float32 (torch.Tensor)
    torch.manual_seed(5)
    ns = alibi_lines("learned", H, L)
    wl, wr = ns["w_left"], ns["w_right"]
    dO = randn(B, L, H, D, dtype=torch.float64)
    out = softmax_attention(q, k, v, ns["alibi"].double(), 1 / math.sqrt(D))
    (out * dO).sum().backward()
    W = torch.stack([wl, wr]).detach()
    got, dW = posenc("attention", "alibi", "--variant", "learned", "--weights", npy(W), "--q", npy(q), "--k", npy(k),
                     "--v", npy(v), "--grad-out", npy(dO), outs=("--out", "--grad-weights"))
    e2 = close(got, out, **F32)
    e3 = close(dW, torch.stack([wl.grad, wr.grad]), rtol=1e-5, atol=1e-5, what="dW")
    return f"nonsymmetric err {e1:.1e}; learned err {e2:.1e}, dW err {e3:.1e}"

if __name__ == "__main__":
    sys.exit(main(prefix="posenc-articles-bias-", timeout=60))
