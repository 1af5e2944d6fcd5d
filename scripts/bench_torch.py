#!/usr/bin/python3
"""posenc's kernels against the PyTorch code people run today, one thread each, in one run.

    /usr/bin/python3 scripts/bench_torch.py [--posenc build/posenc] [--articles ../shared/seeds]
                                            [--repeats 5] [--no-attention] [--threads 1]

--threads N (with --no-attention) gives both sides N threads for RoPE instead: torch's own pool
(its elementwise ops; its OpenBLAS stays at one thread, which RoPE does not call) and posenc bench
--threads N. Everything below says one thread, the default.

A program, not a test (it only prints). Needs /usr/bin/python3 with torch and numpy.

RoPE on q and k of shape [1, 4096, 32, 128] float32, torch.set_num_threads(1) and its BLAS (Debian's
OpenBLAS, whose pthread pool ignores torch.set_num_threads) at one thread too
(torch_model.set_threads):
  * the articles' own code, read at run time from the source articles (nothing is copied into this
    repository; the code blocks are located by their def name, as tests/e2e/test_articles.py does):
    the Llama-style complex form of “Position Embedding” (docs/articles.md; precompute_freqs_cis
    once, not timed, as Llama does at initialisation; apply_rotary_emb timed) and its element-wise
    rotary_position_embedding (it builds its table inside every call; it takes [B, H, L, D], so it gets transposed views);
  * our own Hugging Face style rotate_half (cos/sin cached as [L, D], not timed, as HF caches them).
  against `posenc bench --filter 'rope.forward' --threads 1 --json` (interleaved pairs for the complex
  and element-wise forms, the half layout for rotate_half). Bytes are counted as posenc bench counts
  them: q and k read and written, 4·numel·4 bytes, whatever temporaries torch makes on the way.

Attention (unless --no-attention): PyTorch eager attention with a symmetric ALiBi bias (slopes from
get_slopes of “Position Embedding”) and a causal mask, 8 heads, d = 64, float32, one thread, L in
{1024, 2048, 4096} (2048 is the issue's example; posenc's bench rows are at 1024 and 4096): scores = q·kᵀ/√d +
bias (the [H, L, L] bias and mask precomputed once, not timed), softmax, ·v; the backward by
autograd (dq, dk, dv). Useful GFLOP/s as posenc counts them (4·H·L²·d, halved for causal; backward
2.5× the forward), against `posenc bench --filter 'attention.* alibi' --threads 1 --json`.

Timings: one warm-up call, then the median of --repeats calls. Every torch op allocates its output
afresh; glibc hands blocks this large to mmap and back to the kernel on free, so each call would
page-fault all its temporaries in again (very slow on a VM that returns freed pages to the host). So
that torch is timed at its best, the script re-runs itself with glibc told to keep freed memory
(MALLOC_MMAP_MAX_=0, MALLOC_TRIM_THRESHOLD_ huge; posenc bench runs with the caller's environment, and
pre-touches its buffers anyway); --default-malloc times torch as a default process runs it.
"""
import argparse
import ast
import glob
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--posenc", default=os.path.join(HERE, "..", "build", "posenc"), help="the posenc binary")
ap.add_argument("--articles", default=os.path.join(HERE, "..", "..", "shared", "seeds"),
                help="the folder holding the source articles 000_*.txt .. 004_*.txt")
ap.add_argument("--repeats", type=int, default=5, help="timed calls per measurement (median)")
ap.add_argument("--no-attention", action="store_true", help="RoPE only")
ap.add_argument("--threads", type=int, default=1, help="threads for torch and for posenc (default 1)")
ap.add_argument("--default-malloc", action="store_true",
                help="time torch with glibc's default malloc settings (see above)")
ARGS = ap.parse_args()

CALLER_ENV = dict(os.environ)
if not ARGS.default_malloc and "POSENC_BENCH_TORCH_ENV" not in os.environ:
    env = dict(os.environ, MALLOC_MMAP_MAX_="0", MALLOC_TRIM_THRESHOLD_=str(1 << 60),
               POSENC_BENCH_TORCH_ENV=json.dumps(CALLER_ENV))
    os.execve(sys.executable, [sys.executable] + sys.argv, env)
if "POSENC_BENCH_TORCH_ENV" in os.environ:
    CALLER_ENV = json.loads(os.environ["POSENC_BENCH_TORCH_ENV"])

try:
    import numpy as np  # noqa: F401  (torch wants it for some ops; also states the requirement)
    import torch
except ImportError as e:
    sys.exit(f"bench_torch.py: {e} (run with /usr/bin/python3, which has torch and numpy)")

sys.path.insert(0, HERE)
import torch_model  # noqa: E402  (its set_threads: torch's pool and its OpenBLAS pool at one thread)

if ARGS.threads < 1:
    sys.exit(f"bench_torch.py: --threads: expected a positive count, got {ARGS.threads}")
if ARGS.threads > 1 and not ARGS.no_attention:
    sys.exit("bench_torch.py: --threads: more than one thread times RoPE only; add --no-attention")
BLAS_PINNED = torch_model.set_threads(ARGS.threads)
THREADS = f"{ARGS.threads} thread" + ("s" if ARGS.threads > 1 else "")
torch.manual_seed(0)


# ---- the articles' code, read at run time (the approach of tests/e2e/test_articles.py) -----------

def article_text(num):
    files = sorted(glob.glob(os.path.join(ARGS.articles, f"{num:03d}_*.txt")))
    if not files:
        sys.exit(f"bench_torch.py: article {num:03d} not found in {ARGS.articles} (--articles)")
    with open(files[0], encoding="utf-8") as f:
        return f.read()


def definition(num, name):
    """Source of the top-level def `name` in article num's fenced python code."""
    fence = r"^```(python|py)\b[^\n]*\n(.*?)^```"
    blocks = [m.group(2) for m in re.finditer(fence, article_text(num), re.S | re.M)]
    hits = [b for b in blocks if re.search(rf"^\s*(def|class)\s+{name}\b", b, re.M)]
    if len(hits) != 1:
        sys.exit(f"bench_torch.py: expected one code block of article {num:03d} defining {name}, "
                 f"found {len(hits)}")
    for node in ast.parse(hits[0]).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
            return ast.get_source_segment(hits[0], node)
    sys.exit(f"bench_torch.py: article {num:03d}: {name} is not a top-level definition")


def load(num, *names):
    import typing
    ns = {"torch": torch, "math": math, "Tuple": typing.Tuple}
    for name in names:
        exec(compile(definition(num, name), f"<article {num:03d}: {name}>", "exec"), ns)
    return ns


# ---- timing ----------------------------------------------------------------------------------------

def median_seconds(fn):
    with torch.no_grad():
        fn()
        samples = []
        for _ in range(max(1, ARGS.repeats)):
            t = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def median_seconds_grad(fn):
    fn()
    samples = []
    for _ in range(max(1, ARGS.repeats)):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def posenc_rows(filt):
    argv = [ARGS.posenc, "bench", "--filter", filt, "--threads", str(ARGS.threads), "--json"]
    r = subprocess.run(argv, capture_output=True, text=True, env=CALLER_ENV)
    if r.returncode != 0:
        sys.exit(f"bench_torch.py: {' '.join(argv)} exited {r.returncode}: {r.stderr.strip()}")
    return [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]


def pick(rows, **want):
    hits = [r for r in rows if all(r.get(k) == v for k, v in want.items())]
    return hits[0] if hits else None


# ---- RoPE ----------------------------------------------------------------------------------------

def bench_rope():
    B, L, H, D = 1, 4096, 32, 128
    q, k = torch.randn(B, L, H, D), torch.randn(B, L, H, D)
    gb = 4 * q.numel() * 4 / 1e9  # q, k read and written, float32

    llama = load(2, "precompute_freqs_cis", "reshape_for_broadcast", "apply_rotary_emb")
    freqs = llama["precompute_freqs_cis"](D, L)  # once, as Llama does
    t_complex = median_seconds(lambda: llama["apply_rotary_emb"](q, k, freqs))

    elem = load(2, "rotary_position_embedding")["rotary_position_embedding"]
    qt, kt = q.transpose(1, 2), k.transpose(1, 2)  # it takes [B, H, L, D]
    t_elem = median_seconds(lambda: elem(qt, kt))

    # OURS (not from the articles, which give no half-layout code): HF Llama / GPT-NeoX rotate_half
    # with the cos/sin cache built once.
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
    emb = torch.cat([torch.outer(torch.arange(L, dtype=torch.float32), inv_freq)] * 2, dim=-1)
    cos, sin = emb.cos()[None, :, None, :], emb.sin()[None, :, None, :]

    def rotate_half(x):
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
        return torch.cat((-x2, x1), dim=-1)

    t_half = median_seconds(lambda: (q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin))

    rows = posenc_rows("rope.forward")
    shape = "[1, 4096, 32, 128]"
    inter = pick(rows, kernel="rope.forward.qk.interleaved", dtype="float32", shape=shape)
    half = pick(rows, kernel="rope.forward.qk.half", dtype="float32", shape=shape)
    if not inter or not half:
        sys.exit("bench_torch.py: posenc bench gave no rope.forward.qk.{interleaved,half} float32 rows")

    print(f"RoPE q+k {[B, L, H, D]} float32, {THREADS}; GB/s = 4·numel·4 bytes / s (as posenc bench)")
    print(f"{'implementation':58s} {'seconds':>9s} {'GB/s':>7s}  {'posenc':>7s} {'speedup':>8s}")
    for name, t, ref in [("torch “Position Embedding” apply_rotary_emb (complex, Llama)", t_complex, inter),
                         ("torch “Position Embedding” rotary_position_embedding (element-wise)", t_elem, inter),
                         ("torch rotate_half (HF style, ours)", t_half, half)]:
        print(f"{name:58s} {t:9.4f} {gb / t:7.2f}  {ref['throughput']:7.2f} {t / ref['seconds']:7.1f}x")
    for r in (inter, half):
        print(f"posenc {r['kernel']:51s} {r['seconds']:9.4f} {r['throughput']:7.2f}  "
              f"(memcpy of the same bytes: {r['baseline_throughput']:.2f} GB/s, ratio {r['ratio']:.2f})")
    for r in rows:
        if r not in (inter, half):
            print(f"  also: {r['kernel']} {r['dtype']} {r['shape']}: {r['throughput']:.2f} GB/s, "
                  f"ratio to memcpy {r['ratio']:.2f}")


# ---- attention with ALiBi ---------------------------------------------------------------------------

def bench_attention():
    H, D = 8, 64
    slopes = torch.tensor(load(2, "get_slopes")["get_slopes"](H), dtype=torch.float32)
    rows = posenc_rows(r"attention\.(forward|backward) alibi .* float32")
    print()
    print(f"Attention, ALiBi symmetric + causal, H={H}, d={D}, float32, {THREADS}; useful GFLOP/s = "
          "4·H·L²·d/2 (backward 2.5x)")
    print(f"{'':10s} {'L':>5s} {'torch s':>9s} {'GFLOP/s':>8s}  {'posenc s':>9s} {'GFLOP/s':>8s} "
          f"{'speedup':>8s}")
    for L in (1024, 2048, 4096):
        q, k, v = (torch.randn(1, H, L, D) for _ in range(3))
        i = torch.arange(L)
        dist = (i[None, :] - i[:, None]).abs().float()
        bias = -slopes[:, None, None] * dist[None] + torch.triu(torch.full((L, L), float("-inf")), 1)[None]
        scale = 1 / math.sqrt(D)

        def fwd(q=q, k=k, v=v, bias=bias):
            return torch.softmax(q @ k.transpose(-1, -2) * scale + bias, dim=-1) @ v

        t_f = median_seconds(fwd)
        qg, kg, vg = (x.clone().requires_grad_(True) for x in (q, k, v))
        dout = torch.randn(1, H, L, D)

        def bwd(qg=qg, kg=kg, vg=vg, bias=bias, dout=dout):
            out = torch.softmax(qg @ kg.transpose(-1, -2) * scale + bias, dim=-1) @ vg
            qg.grad = kg.grad = vg.grad = None
            out.backward(dout)

        t_b = median_seconds_grad(bwd)  # forward + backward by autograd (posenc's backward recomputes too)
        useful = 4 * H * L * L * D / 2
        shape = f"[1, {L}, {H}, {D}]"
        for kern, t, flops in (("forward", t_f, useful), ("backward", t_b, 2.5 * useful)):
            r = pick(rows, kernel=f"attention.{kern}", shape=shape)
            ps = (f"{r['seconds']:9.4f} {r['throughput']:8.2f} {t / r['seconds']:7.1f}x" if r
                  else "        -        -        -  (posenc bench's rows are at L = 1024 and 4096)")
            print(f"{kern:10s} {L:5d} {t:9.4f} {flops / t / 1e9:8.2f}  {ps}")
        del bias, dist


def main():
    if not os.access(ARGS.posenc, os.X_OK):
        sys.exit(f"bench_torch.py: posenc binary not found or not executable: {ARGS.posenc} (--posenc)")
    malloc = "glibc default" if ARGS.default_malloc else "freed memory kept (MALLOC_MMAP_MAX_=0)"
    blas = "its OpenBLAS at one thread" if BLAS_PINNED else "its BLAS is not OpenBLAS"
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()} ({blas}), malloc: {malloc}")
    bench_rope()
    if not ARGS.no_attention:
        bench_attention()


if __name__ == "__main__":
    main()
