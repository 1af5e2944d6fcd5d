"""The source articles' own code for the end-to-end tests test_articles*.py (docs/articles.md): their
fenced Python blocks read from the article files at run time, the definitions a case needs located by
name and exec'd with the known bugs patched (PATCHES), and posenc run on .npy files. Importing it
skips the test (exit 77) without the articles, numpy or torch."""
import ast
import contextlib
import functools
import glob
import math
import os
import re
import types
import typing

from harness import ARGS, case_dir, run, articles_required, skip

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


GEN = torch.Generator().manual_seed(20240601)


def randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=GEN, dtype=torch.float64).to(dtype)


# “位置编码”'s RoPE module (its two bugs patched), built for head dimension D.
def rope000(D, theta=10000, dtype=torch.float32):
    with default_dtype(dtype):
        return load(0, "RoPE", patches=["000-rope-bracket", "000-rope-repeat"])["RoPE"](D, theta)
