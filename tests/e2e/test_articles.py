#!/usr/bin/python3
"""The five source articles' own code (docs/articles.md) as the oracle for the posenc CLI: the
sinusoids and RoPE (the biases and attention: test_articles_bias.py; the reading of the articles:
article_code.py).

    /usr/bin/python3 tests/e2e/test_articles.py --posenc PATH/TO/posenc --articles PATH/TO/shared/seeds

The articles are named by title below (docs/articles.md); their files are 000_*.txt .. 004_*.txt.
Nothing from the articles is copied into this repository: at run time the fenced ```python (and
“Positional Encoding”'s ```py) blocks are read from the article files, the definitions a case needs
are located by their `def`/`class` name (ast), and only those definitions are exec'd in a namespace
holding torch, numpy and math. Where an article's code has a bug, the smallest textual fix is
applied at run time and named in the case's line (article_code.PATCHES). Code that is not runnable
as is (“Position Embedding”'s ALiBi fragments use `self.` and `.cuda()`) is run after two
mechanical rewrites, explained in article_code.alibi_lines().

Each case prints one line (PASS with what it measured, or FAIL); the last line is exactly "N passed,
M failed"; exit 1 if any case failed, 2 without --articles, 77 (skip) with a one-line reason when the
articles, numpy or torch are missing (tests/e2e/harness.py). Each posenc run may take 60 s.
docs/articles.md lists every discrepancy between the articles and the papers that these cases pin.
"""
import re
import sys

from article_code import F32, F64, GEN, article_text, default_dtype, load, npy, posenc, randn, rope000, tol
from harness import case, close, main
import numpy as np
import torch


# ---- sinusoidal ---------------------------------------------------------------------------------

@case("“三角函数式位置编码” getPositionEncoding(seq_len=4, d=4, n=100) vs table sinusoidal --base 100, and the printed output")
def _():
    P = load(3, "getPositionEncoding")["getPositionEncoding"](seq_len=4, d=4, n=100)
    e64 = close(posenc("table", "sinusoidal", "--length", 4, "--dim", 4, "--base", 100, "--dtype", "float64"), P, **F64)
    e32 = close(posenc("table", "sinusoidal", "--length", 4, "--dim", 4, "--base", 100, "--dtype", "float32"), P, **F32)
    # The article prints the matrix (```bash block after the code), to 8 decimals.
    printed = re.search(r"```bash\n(\[\[.*?\]\])\n```", article_text(3), re.S).group(1)
    rows = [[float(v) for v in row.split()] for row in re.findall(r"\[([^\[\]]+)\]", printed)]
    e_p = close(P, np.array(rows), rtol=0, atol=5.1e-9, what="article's printed matrix")
    return f"float64 err {e64:.1e}, float32 err {e32:.1e}; printed matrix reproduced to {e_p:.1e}"


@case("“三角函数式位置编码” getPositionEncoding(seq_len=100, d=512, n=10000) vs table sinusoidal (float64, float32)")
def _():
    P = load(3, "getPositionEncoding")["getPositionEncoding"](seq_len=100, d=512, n=10000)
    e64 = close(posenc("table", "sinusoidal", "--length", 100, "--dim", 512, "--dtype", "float64"), P, **F64)
    e32 = close(posenc("table", "sinusoidal", "--length", 100, "--dim", 512, "--dtype", "float32"), P, **F32)
    return f"float64 err {e64:.1e}, float32 err {e32:.1e}"


@case("“三角函数式位置编码” getPositionEncoding rows 700..763 vs table sinusoidal --offset 700 (d=64, n=10000)")
def _():
    P = load(3, "getPositionEncoding")["getPositionEncoding"](seq_len=764, d=64, n=10000)[700:]
    e = close(posenc("table", "sinusoidal", "--length", 64, "--dim", 64, "--offset", 700, "--dtype", "float64"),
              P, rtol=1e-12, atol=1e-12)
    return f"err {e:.1e}"


@case("“Position Embedding” sinusoidal_embedding(128, 64) vs table sinusoidal (float32)")
def _():
    pe = load(2, "sinusoidal_embedding")["sinusoidal_embedding"](128, 64)  # [1, 128, 64], float32
    assert tuple(pe.shape) == (1, 128, 64), pe.shape
    e = close(posenc("table", "sinusoidal", "--length", 128, "--dim", 64, "--dtype", "float32"), pe[0], **F32)
    return f"err {e:.1e}"


@case("“Position Embedding” PositionalEncoding (patched 002-pe-slice) vs apply sinusoidal; unpatched fails unless L == max_len")
def _():
    D, max_len = 32, 48
    x = randn(3, 20, D)
    Pbug = load(2, "PositionalEncoding")["PositionalEncoding"](D, 0.0, max_len=max_len).eval()
    try:
        Pbug(x)
    except RuntimeError:
        pass
    else:
        raise AssertionError("the unpatched forward was expected to fail for L < max_len")
    x_full = randn(3, max_len, D)
    e_full = close(posenc("apply", "sinusoidal", "--in", npy(x_full)), Pbug(x_full), **F32)
    Pfix = load(2, "PositionalEncoding", patches=["002-pe-slice"])["PositionalEncoding"](D, 0.0, max_len=max_len).eval()
    e = close(posenc("apply", "sinusoidal", "--in", npy(x)), Pfix(x), **F32)
    x64 = x.double()
    e64 = close(posenc("apply", "sinusoidal", "--in", npy(x64)), Pfix(x64), **F32)
    return f"L=max_len err {e_full:.1e}; patched L=20 float32 err {e:.1e}, float64 err {e64:.1e}"


@case("“Positional Encoding” PositionalEncoding vs apply sinusoidal (float32, float64); its comment's formula is not the code's")
def _():
    D, L = 64, 40
    PE = load(4, "PositionalEncoding")["PositionalEncoding"]
    m = PE(D, L, 0.0).eval()
    x = randn(2, L, D)
    e32 = close(posenc("apply", "sinusoidal", "--in", npy(x)), m(x), **F32)
    x64 = x.double()
    e64 = close(posenc("apply", "sinusoidal", "--in", npy(x64)), m(x64), **F32)  # the buffer is float32
    xs = randn(2, 7, D)  # a prefix shorter than seq_len
    es = close(posenc("apply", "sinusoidal", "--in", npy(xs)), m(xs), **F32)
    # The code's comment reads "sin(position * (10000 ** (2i / d_model))"; the code (and the paper)
    # divide by 10000^(2i/d_model). Show the buffer is the latter and not the former.
    p, i2 = torch.arange(L, dtype=torch.float64)[:, None], torch.arange(0, D, 2, dtype=torch.float64)
    comment = torch.sin(p * 10000 ** (i2 / D))
    assert (m.pe[0, :, 0::2].double() - comment).abs().max() > 0.5, "the comment's formula unexpectedly matches"
    close(m.pe[0, :, 0::2], torch.sin(p / 10000 ** (i2 / D)), **F32)
    return f"float32 err {e32:.1e}, float64 err {e64:.1e}, L=7 err {es:.1e}"


@case("“位置编码” SinusoidPE: 10000^(j/d) for every column j — even columns = paper, odd columns differ")
def _():
    D, L = 32, 256
    SP = load(0, "SinusoidPE")["SinusoidPE"]
    tokens = torch.zeros(1, L, dtype=torch.long)  # x: [N, L]; only its length is used
    with default_dtype(torch.float64):
        art = SP(D)(tokens)[0]  # [L, D], float64
    paper = posenc("table", "sinusoidal", "--length", L, "--dim", D, "--dtype", "float64")
    e_even = close(paper[:, 0::2], art[:, 0::2], **F64, what="even columns")
    close(paper[0], art[0], **F64, what="row 0 (position 0)")
    diff = np.abs(paper[:, 1::2] - art[:, 1::2].numpy()).max(axis=0)
    assert (diff > 1e-4).all(), f"odd columns expected to differ from the paper, max |diff| per column {diff}"
    # Exactly what the article computes: column j uses 10000^(−j/D), which is the paper's table of
    # width 2D at column 2j (sin) or 2j+1 (cos): posenc's own table pins the article's formula.
    wide = posenc("table", "sinusoidal", "--length", L, "--dim", 2 * D, "--dtype", "float64")
    cols = [2 * j + (j % 2) for j in range(D)]
    e_art = close(wide[:, cols], art, **F64, what="article vs posenc width-2D columns 2j+(j mod 2)")
    return (f"even columns err {e_even:.1e}; odd columns 1..{D-1} differ by up to {diff.max():.2f} "
            f"(column 1: {diff[0]:.2f}, column {D-1}: {diff[-1]:.1e}); article = 2D-wide table "
            f"columns 2j+(j mod 2) to {e_art:.1e}")


@case("“位置编码” AbsolutePE (nn.Embedding) vs apply learned --table, with --grad-table / --grad-in")
def _():
    N, L, D, max_len = 3, 10, 16, 12
    torch.manual_seed(7)
    m = load(0, "AbsolutePE")["AbsolutePE"](max_len, D)
    E = m.pe.weight
    x = randn(N, L, D).requires_grad_(True)
    tokens = torch.zeros(N, L, dtype=torch.long)
    y = x + m(tokens)  # AbsolutePE returns [1, L, D], broadcast over the batch
    dy = randn(N, L, D)
    (y * dy).sum().backward()
    got_y, got_dx, got_dE = posenc("apply", "learned", "--in", npy(x), "--table", npy(E), "--grad-out", npy(dy),
                                   outs=("--out", "--grad-in", "--grad-table"))
    e = close(got_y, y, **F32)
    e_dx = close(got_dx, x.grad, **F32, what="dX")
    e_dE = close(got_dE, E.grad, **F32, what="dE")
    return f"Y err {e:.1e}, dX err {e_dx:.1e}, dE err {e_dE:.1e}"


# ---- RoPE ----------------------------------------------------------------------------------------

@case("“位置编码” RoPE rotation matrices (patched 000-rope-bracket, 000-rope-repeat) vs apply rope interleaved")
def _():
    # Without the two patches the article's RoPE does not run (SyntaxError, then diagonal_scatter's
    # size error); both are checked here so that a fixed article is noticed.
    try:
        load(0, "RoPE")
        raise AssertionError("“位置编码”'s RoPE unexpectedly parses without the bracket patch")
    except SyntaxError:
        pass
    R = load(0, "RoPE", patches=["000-rope-bracket"])["RoPE"](8)
    try:
        R(torch.zeros(1, 3, 1, 8))
        raise AssertionError("“位置编码”'s RoPE unexpectedly runs without the repeat_interleave patch")
    except RuntimeError:
        pass
    msg = []
    for dtype, theta, (B, L, H, D) in [(torch.float32, 10000, (2, 24, 3, 16)),
                                        (torch.float64, 10000, (2, 24, 3, 16)),
                                        (torch.float64, 500000, (1, 40, 2, 64))]:
        x = randn(B, L, H, D, dtype=dtype)
        with default_dtype(dtype):  # float64: the article's own code, run with torch's default dtype float64
            want = rope000(D, theta, dtype)(x)
        got = posenc("apply", "rope", "--layout", "interleaved", "--theta", theta, "--in", npy(x))
        msg.append(f"{str(dtype)[6:]} theta={theta} err {close(got, want, **tol(dtype)):.1e}")
    return "; ".join(msg)


@case("“位置编码” RoPE with m = 1..L (the text's range; the code's is 0..L-1) = apply rope --offset 1")
def _():
    B, L, H, D = 2, 12, 2, 16
    x = randn(B, L, H, D, dtype=torch.float64)
    with default_dtype(torch.float64):
        r = rope000(D, dtype=torch.float64)
        rot = r._forward_l(L + 1)[1:]  # the article's matrices for m = 1..L
        want = torch.einsum("lde,nlhe->nlhd", rot, x)  # the article's forward, with those matrices
    e1 = close(posenc("apply", "rope", "--layout", "interleaved", "--in", npy(x), "--offset", 1), want, **F64)
    got0 = posenc("apply", "rope", "--layout", "interleaved", "--in", npy(x))
    assert np.abs(got0 - want.numpy()).max() > 1e-3, "offset 0 should differ from m = 1..L"
    return f"--offset 1 err {e1:.1e}"


def llama_rope(x, D, positions, n=None):
    """“Position Embedding”'s precompute_freqs_cis + apply_rotary_emb on x [B, L, H, D] at the given positions."""
    ns = load(2, "precompute_freqs_cis", "reshape_for_broadcast", "apply_rotary_emb")
    table = ns["precompute_freqs_cis"](D, n if n is not None else int(positions.max()) + 1)
    if positions.dim() == 1:
        return ns["apply_rotary_emb"](x, x, table[positions])[0]
    return torch.stack([ns["apply_rotary_emb"](x[b:b + 1], x[b:b + 1], table[positions[b]])[0][0]
                        for b in range(x.shape[0])])


@case("“Position Embedding” apply_rotary_emb (complex, Llama) vs apply rope interleaved: offsets, --positions, float64 input")
def _():
    B, L, H, D = 2, 20, 4, 32
    msg = []
    x = randn(B, L, H, D)
    e = close(posenc("apply", "rope", "--layout", "interleaved", "--in", npy(x)), llama_rope(x, D, torch.arange(L)),
              **F32)
    msg.append(f"float32 err {e:.1e}")
    x64 = x.double()  # the article computes in complex64 and casts back: float32 accuracy
    e = close(posenc("apply", "rope", "--layout", "interleaved", "--in", npy(x64)),
              llama_rope(x64, D, torch.arange(L)), **F32)
    msg.append(f"float64 input err {e:.1e}")
    # Llama's decode step: freqs_cis[start_pos : start_pos + L]
    e = close(posenc("apply", "rope", "--layout", "interleaved", "--in", npy(x), "--offset", 30),
              llama_rope(x, D, torch.arange(30, 30 + L)), **F32)
    msg.append(f"--offset 30 err {e:.1e}")
    pos = torch.randint(0, 64, (L,), generator=GEN)
    e = close(posenc("apply", "rope", "--layout", "interleaved", "--in", npy(x), "--positions", npy(pos)),
              llama_rope(x, D, pos), **F32)
    msg.append(f"--positions [L] err {e:.1e}")
    pos2 = torch.randint(0, 64, (B, L), generator=GEN)
    e = close(posenc("apply", "rope", "--layout", "interleaved", "--in", npy(x), "--positions", npy(pos2.int())),
              llama_rope(x, D, pos2), **F32)
    msg.append(f"--positions [B,L] int32 err {e:.1e}")
    return ", ".join(msg)


@case("“Position Embedding” apply_rotary_emb on the first R dims vs apply rope --rotary-dim R (rest passes through)")
def _():
    B, L, H, D, R = 2, 16, 2, 48, 16
    x = randn(B, L, H, D)
    want = x.clone()
    want[..., :R] = llama_rope(x[..., :R].contiguous(), R, torch.arange(L))
    e = close(posenc("apply", "rope", "--layout", "interleaved", "--rotary-dim", R, "--in", npy(x)), want, **F32)
    return f"err {e:.1e}"


@case("“Position Embedding” rotary_position_embedding (element-wise; takes (batch, heads, seq, dim)) vs apply rope interleaved")
def _():
    B, L, H, D = 2, 24, 3, 32
    f = load(2, "rotary_position_embedding")["rotary_position_embedding"]
    q, k = randn(B, L, H, D), randn(B, L, H, D)
    qr, kr = f(q.transpose(1, 2), k.transpose(1, 2))  # posenc's layout is [B, L, H, D]
    eq = close(posenc("apply", "rope", "--layout", "interleaved", "--in", npy(q)), qr.transpose(1, 2), **F32, what="q")
    ek = close(posenc("apply", "rope", "--layout", "interleaved", "--in", npy(k)), kr.transpose(1, 2), **F32, what="k")
    # Fed posenc's layout directly, the article would treat L as heads and H as positions.
    qw, _ = f(q, k)
    assert (qw - qr.transpose(1, 2)).abs().max() > 1e-3, "the transpose should matter"
    return f"q err {eq:.1e}, k err {ek:.1e}"


def rotate_half_rope(x, positions, R, theta=10000.0):
    """OURS, not the articles' (they give no half-layout code): Hugging Face Llama / GPT-NeoX style.
    x [B, L, H, D]; the first R dims rotate as halves (k, k + R/2), the rest pass through."""
    dt = x.dtype
    inv_freq = 1.0 / (theta ** (torch.arange(0, R, 2, dtype=torch.float64) / R))
    freqs = positions.to(torch.float64)[:, None] * inv_freq[None, :]   # [L, R/2]
    emb = torch.cat((freqs, freqs), dim=-1)                             # [L, R]
    cos, sin = emb.cos()[None, :, None, :], emb.sin()[None, :, None, :]

    def rotate_half(t):
        t1, t2 = t[..., : t.shape[-1] // 2], t[..., t.shape[-1] // 2:]
        return torch.cat((-t2, t1), dim=-1)

    xr, xp = x[..., :R].double(), x[..., R:]
    return torch.cat(((xr * cos + rotate_half(xr) * sin).to(dt), xp), dim=-1)


@case("half layout vs our own rotate_half (HF Llama style; not from the articles): float32/float64, --rotary-dim")
def _():
    msg = []
    for dtype, (B, L, H, D), R, off in [(torch.float32, (2, 20, 3, 32), 32, 0),
                                         (torch.float64, (2, 20, 3, 32), 32, 0),
                                         (torch.float64, (1, 16, 2, 64), 24, 100)]:
        x = randn(B, L, H, D, dtype=dtype)
        want = rotate_half_rope(x, torch.arange(off, off + L), R)
        got = posenc("apply", "rope", "--layout", "half", "--rotary-dim", R, "--offset", off, "--in", npy(x))
        msg.append(f"{str(dtype)[6:]} R={R} offset={off} err {close(got, want, **tol(dtype)):.1e}")
    return "; ".join(msg)


@case("“位置编码”'s 'Llama splits halves' vs “Position Embedding”'s Llama code (adjacent pairs): half = interleaved up to a permutation")
def _():
    B, L, H, D = 2, 12, 2, 16
    x = randn(B, L, H, D)
    perm = torch.tensor([k for p in range(D // 2) for k in (p, p + D // 2)])  # half index of interleaved slot
    inv = torch.argsort(perm)
    want = llama_rope(x[..., perm].contiguous(), D, torch.arange(L))[..., inv]
    half = posenc("apply", "rope", "--layout", "half", "--in", npy(x))
    inter = posenc("apply", "rope", "--layout", "interleaved", "--in", npy(x))
    e = close(half, want, **F32)
    assert np.abs(half - inter).max() > 1e-2, "the two layouts should differ on the same input"
    return f"“Position Embedding” on permuted dims = posenc half, err {e:.1e}"


@case("rope gradient: apply rope --grad-out/--grad-in vs torch autograd of “Position Embedding” apply_rotary_emb")
def _():
    msg = []
    for dtype in (torch.float32, torch.float64):
        B, L, H, D = 2, 16, 3, 32
        x = randn(B, L, H, D, dtype=dtype).requires_grad_(True)
        dy = randn(B, L, H, D, dtype=dtype)
        y = llama_rope(x, D, torch.arange(5, 5 + L))
        (y * dy).sum().backward()
        got_y, got_dx = posenc("apply", "rope", "--layout", "interleaved", "--in", npy(x), "--offset", 5,
                               "--grad-out", npy(dy), outs=("--out", "--grad-in"))
        close(got_y, y, **F32)
        msg.append(f"{str(dtype)[6:]} dX err {close(got_dx, x.grad, **F32, what='dX'):.1e}")
    return ", ".join(msg)

if __name__ == "__main__":
    sys.exit(main(prefix="posenc-articles-", timeout=60))
