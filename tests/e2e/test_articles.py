#!/usr/bin/python3
"""The five source articles' own code (docs/articles.md) as the oracle for the posenc CLI.

    /usr/bin/python3 tests/e2e/test_articles.py --posenc PATH/TO/posenc --articles PATH/TO/shared/seeds

The articles are named by title below (docs/articles.md); their files are 000_*.txt .. 004_*.txt.
Nothing from the articles is copied into this repository: at run time the fenced ```python (and
“Positional Encoding”'s ```py) blocks are read from the article files, the definitions a case needs
are located by their `def`/`class` name (ast), and only those definitions are exec'd in a namespace
holding torch, numpy and math. Where an article's code has a bug, the smallest textual fix is
applied at run time and named in the case's line (see PATCHES). Code that is not runnable as is
(“Position Embedding”'s ALiBi fragments use `self.` and `.cuda()`) is run after two mechanical
rewrites, explained in alibi_lines().

Each case prints one line (PASS with what it measured, or FAIL); the last line is exactly "N passed,
M failed"; exit 1 if any case failed, 2 without --articles, 77 (skip) with a one-line reason when the
articles, numpy or torch are missing (tests/e2e/harness.py). Each posenc run may take 60 s.
docs/articles.md lists every discrepancy between the articles and the papers that these cases pin.
"""
import ast
import contextlib
import functools
import glob
import math
import os
import re
import sys
import types
import typing

from harness import ARGS, case, case_dir, close, expect_error, main, run, articles_required, skip

articles_required()  # the folder holding the source articles 000_*.txt .. 004_*.txt
if not os.path.isdir(ARGS.articles) or not glob.glob(os.path.join(ARGS.articles, "00[0-4]_*.txt")):
    skip(f"source articles not found in {ARGS.articles}")
try:
    import numpy as np
except ImportError:
    skip("numpy is not importable by this python")
try:
    import torch
except ImportError:
    skip("torch is not importable by this python (the articles' code needs it)")

torch.set_num_threads(2)

# ------------------------------------------------------------------------------------------------
# Reading the articles' code
# ------------------------------------------------------------------------------------------------

# The known bugs, each fixed by the smallest textual patch (old must occur exactly once, so an article
# that changes makes the case fail loudly instead of silently testing something else).
PATCHES = {
    # “位置编码”, RoPE._forward_l: the `]` closing the list belongs before `, dim=-1`
    # (as written it is a SyntaxError).
    "000-rope-bracket": ("torch.zeros_like(pos), dim=-1\n        ])",
                         "torch.zeros_like(pos)\n        ], dim=-1)"),
    # “位置编码”, RoPE._forward_l: `repeat_interleave(2)` without dim flattens the [L, D/2] angles to
    # [L·D], so diagonal_scatter raises ("expected src to have a size equal to the slice of self");
    # the main diagonal of each [D, D] matrix needs cos repeated along the last dimension.
    "000-rope-repeat": ("torch.cos(pos).repeat_interleave(2)",
                        "torch.cos(pos).repeat_interleave(2, dim=-1)"),
    # “Position Embedding”, PositionalEncoding.forward: the buffer is [1, max_len, D] (rearrange '... -> 1 ...'),
    # so `[:x.shape[1]]` slices the batch axis (a no-op) and x + pe fails to broadcast unless
    # L == max_len. The rows to take are those of axis 1.
    "002-pe-slice": ("self.positional_encodings[:x.shape[1]]",
                     "self.positional_encodings[:, :x.shape[1]]"),
}


def article_text(num):
    files = sorted(glob.glob(os.path.join(ARGS.articles, f"{num:03d}_*.txt")))
    if not files:
        raise AssertionError(f"article {num:03d} not found in {ARGS.articles}")
    with open(files[0], encoding="utf-8") as f:
        return f.read()


@functools.lru_cache(maxsize=None)
def code_blocks(num):
    """The fenced python code blocks of article num, in order (```python, ```python hl_lines=..., ```py)."""
    return [m.group(2) for m in re.finditer(r"^```(python|py)\b[^\n]*\n(.*?)^```", article_text(num), re.S | re.M)]


def block_defining(num, name):
    hits = [b for b in code_blocks(num) if re.search(rf"^\s*(def|class)\s+{name}\b", b, re.M)]
    if len(hits) != 1:
        raise AssertionError(f"article {num:03d}: expected one code block defining {name}, found {len(hits)}")
    return hits[0]


def patched(text, patches):
    for key in patches:
        old, new = PATCHES[key]
        if text.count(old) != 1:
            raise AssertionError(f"patch {key} no longer applies (the article changed?)")
        text = text.replace(old, new)
    return text


def definition(num, name, patches=()):
    """Source of the top-level def/class `name` in article num's code, after the named patches."""
    text = patched(block_defining(num, name), patches)
    for node in ast.parse(text).body:  # raises SyntaxError when a needed patch is missing
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
            return ast.get_source_segment(text, node)
    raise AssertionError(f"article {num:03d}: {name} is not a top-level definition")


def rearrange(tensor, pattern):
    """Stand-in for einops.rearrange (not installed): “Position Embedding” only uses '... -> 1 ...'."""
    if pattern.replace(" ", "") != "...->1...":
        raise NotImplementedError(f"rearrange pattern {pattern!r}")
    return tensor.unsqueeze(0)


def namespace():
    return {"torch": torch, "nn": torch.nn, "np": np, "numpy": np, "math": math,
            "functools": functools, "Tuple": typing.Tuple, "rearrange": rearrange}


def load(num, *names, patches=()):
    """exec the named definitions of one article (in order) in a fresh namespace; return the namespace."""
    ns = namespace()
    for name in names:
        exec(compile(definition(num, name, patches), f"<article {num:03d}: {name}>", "exec"), ns)
    return ns


def alibi_lines(part, heads, maxpos):
    """Run one of “Position Embedding”'s three ALiBi fragments and return its namespace.

    The fragments are module-level statements written for a model's __init__ (`self.alibi = ...`) on
    a GPU (`.cuda()`), so not runnable as is. Two mechanical rewrites make them run unchanged
    otherwise: `.cuda()` is dropped and `self.` is dropped (attributes become local names).
    `utils.fill_with_neg_inf` is fairseq's helper: t.float().fill_(float('-inf')).type_as(t).
    part: 'symmetric' | 'nonsymmetric' | 'learned'. The learned fragment is split after its two
    Parameters are created, so the namespace also holds them as w_left / w_right (seeded init).
    """
    block = block_defining(2, "get_slopes")
    marks = {"symmetric": ("context_position", "# 2.Nonsymmetric"),
             "nonsymmetric": ("# 2.Nonsymmetric", "# 3.Nonsymmetric"),
             "learned": ("# 3.Nonsymmetric", "# when appling")}
    start, end = marks[part]
    i = block.index(start)
    text = block[i:block.index(end, i)].replace(".cuda()", "").replace("self.", "")
    ns = load(2, "get_slopes")
    ns.update(attn_heads=heads, maxpos=maxpos,
              utils=types.SimpleNamespace(fill_with_neg_inf=lambda t: t.float().fill_(float("-inf")).type_as(t)))
    if part == "learned":
        k = text.index("slopes_left = -torch.sigmoid")
        exec(compile(text[:k], "<“Position Embedding”: learned ALiBi params>", "exec"), ns)
        ns["w_left"], ns["w_right"] = ns["slopes_left"], ns["slopes_right"]
        text = text[k:]
    exec(compile(text, f"<“Position Embedding”: {part} ALiBi>", "exec"), ns)
    return ns


@contextlib.contextmanager
def default_dtype(dt):
    old = torch.get_default_dtype()
    torch.set_default_dtype(dt)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


# ------------------------------------------------------------------------------------------------
# Running posenc
# ------------------------------------------------------------------------------------------------

_counter = [0]  # numbers the files of a case


def npy(array):
    """Save an array (numpy or torch) to a fresh .npy file in the case's folder; return its path."""
    if isinstance(array, torch.Tensor):
        array = array.detach().cpu().numpy()
    _counter[0] += 1
    return case_dir().save(f"in{_counter[0]}.npy", np.ascontiguousarray(array))


def out_path(stem):
    _counter[0] += 1
    return case_dir().out(f"{stem}{_counter[0]}.npy")


def posenc(*args, outs=("--out",)):
    """Run posenc with args (numbers are str()'d); outputs are the flags in `outs` (paths filled in).
    Returns the arrays written to those outputs, in order (one array when there is one output)."""
    paths = [out_path(flag.strip("-").replace("-", "_")) for flag in outs]
    run(*args, *(a for flag, p in zip(outs, paths) for a in (flag, p)))
    arrays = [np.load(p) for p in paths]
    return arrays[0] if len(arrays) == 1 else arrays


# close(got, want, what=, rtol=, atol=) (tests/e2e/harness.py) takes torch tensors as well as arrays:
# |got − want| ≤ atol + rtol·|want| elementwise, no NaN, ±inf required at the same places; it returns
# the largest |got − want| over the finite entries.

# Tolerances. F32: posenc's float32 output or an article that computes in float32 (the articles'
# angles are float32 products, so keep positions modest: the angle's rounding grows with it).
# F64: both sides in double.
F32 = dict(rtol=1e-5, atol=1e-5)
F64 = dict(rtol=1e-12, atol=1e-12)


def tol(*dtypes):
    return F32 if any(str(d) in ("float32", "torch.float32") for d in dtypes) else F64


# ------------------------------------------------------------------------------------------------
# Cases
# ------------------------------------------------------------------------------------------------

GEN = torch.Generator().manual_seed(20240601)


def randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=GEN, dtype=torch.float64).to(dtype)


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

def rope000(D, theta=10000, dtype=torch.float32):
    with default_dtype(dtype):
        return load(0, "RoPE", patches=["000-rope-bracket", "000-rope-repeat"])["RoPE"](D, theta)


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
    sys.exit(main(prefix="posenc-articles-", timeout=60))
