#!/usr/bin/python3
"""The PyTorch package posenc against eager torch, in one process and one run.

    PYTHONPATH=build/python /usr/bin/python3 scripts/bench_torch_ops.py [--repeats 5] [--threads 1 2]

A program, not a test (it only prints). For each thread count (torch.set_num_threads(n) with torch's
OpenBLAS pinned to one thread as scripts/torch_model.py does, and posenc.set_num_threads(n)):
  * attention, forward + backward (dq, dk, dv and the encoding's learned tensors), causal, B = 1,
    L = 2048, H = 8, D = 64, float32: posenc.attention against eager torch (q·kᵀ/√D + bias, the
    causal mask, softmax, ·v; autograd) — alibi (the [H, L, L] bias and mask precomputed, not timed),
    t5 (the bucket of every (i, j) precomputed, the bias W[bucket] gathered in the call so that W gets
    its gradient, as transformers' T5 does), rope (transformers' rotate_half on q and k, cos/sin cached);
  * RoPE of q and k [1, 4096, 32, 128] float32, forward: posenc.rope_qk against transformers'
    apply_rotary_pos_emb (rotate_half, cos/sin cached as [L, D], not timed);
  * the binding's per-call overhead: posenc.attention's forward on a decode-sized call (B = 1, M = 1,
    N = 128, H = 8, D = 64, rope, under torch.no_grad) against the same C ABI call
    (posenc_attention_forward, its parameters and tensors prepared once) made through ctypes from
    the extension's own copy of the library, the two alternating; the overhead is the median of the
    per-pair differences: the binding's cost (tensor checks, parameter text and parsing, the output's
    allocation), ctypes' own call cost (about 1 µs) left in the C side.
Each figure: one warm-up, then the median of --repeats rounds. As scripts/bench_torch.py does, the
script re-runs itself with glibc told to keep freed memory, so that torch's large temporaries are not
page-faulted in afresh on every call (torch timed at its best).
"""
import argparse
import ctypes
import json
import math
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--repeats", type=int, default=5, help="timed rounds per figure (median), at least 5")
ap.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="thread counts, each a pass")
ap.add_argument("--json", action="store_true", help="print the figures as one JSON object")
ap.add_argument("--only", choices=["attention", "rope", "overhead"], help="one of the three figures")
ARGS = ap.parse_args()
if ARGS.repeats < 5:
    sys.exit("bench_torch_ops.py: --repeats: at least 5")
if "POSENC_BENCH_KEEP_FREED" not in os.environ:
    env = dict(os.environ, MALLOC_MMAP_MAX_="0", MALLOC_TRIM_THRESHOLD_=str(1 << 60), POSENC_BENCH_KEEP_FREED="1")
    os.execve(sys.executable, [sys.executable] + sys.argv, env)

import torch  # noqa: E402

import posenc  # noqa: E402

sys.path.insert(0, HERE)
import torch_model  # noqa: E402

B, L, H, D = 1, 2048, 8, 64


def median_s(fn, repeats=None):
    fn()
    samples = []
    for _ in range(repeats or ARGS.repeats):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


# ---- attention ---------------------------------------------------------------------------------------

def alibi_slopes(n):
    return torch.tensor([2.0 ** (-8.0 * (h + 1) / n) for h in range(n)])


def t5_bucket(rel, num_buckets=32, max_distance=128):
    """transformers' T5 _relative_position_bucket, causal (bidirectional=False)."""
    rel = -torch.min(rel, torch.zeros_like(rel))
    exact = num_buckets // 2
    large = exact + (torch.log(rel.float() / exact) / math.log(max_distance / exact) * (num_buckets - exact)).long()
    large = torch.min(large, torch.full_like(large, num_buckets - 1))
    return torch.where(rel < exact, rel, large)


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def eager_attention(q, k, v, bias):
    """q, k, v [B, H, L, D]; bias [H, L, L] (−inf where masked)."""
    s = q @ k.transpose(-1, -2) / math.sqrt(D) + bias
    return torch.softmax(s, dim=-1) @ v


def attention_cases():
    i = torch.arange(L)
    mask = torch.zeros(L, L).masked_fill(i[None, :] > i[:, None], float("-inf"))
    alibi_bias = -alibi_slopes(H)[:, None, None] * (i[:, None] - i[None, :]).abs().float() + mask
    bucket = t5_bucket(i[None, :] - i[:, None])
    inv = 1.0 / 10000.0 ** (torch.arange(0, D, 2).float() / D)
    ang = torch.cat([i[:, None].float() * inv[None, :]] * 2, dim=-1)
    cos, sin = ang.cos(), ang.sin()
    w5 = (torch.randn(32, H) * 0.1).requires_grad_()

    def torch_alibi(q, k, v):
        return eager_attention(q, k, v, alibi_bias)

    def torch_t5(q, k, v):
        return eager_attention(q, k, v, w5[bucket].permute(2, 0, 1) + mask)

    def torch_rope(q, k, v):
        return eager_attention(q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin, v, mask)

    return [("alibi", {}, torch_alibi), ("t5", {"weights": w5, "num_buckets": 32, "max_distance": 128, "bidirectional": False},
                                         torch_t5), ("rope", {"rope": {"layout": "half"}}, torch_rope)]


def bench_attention():
    rows = {}
    for name, params, eager in attention_cases():
        q, k, v, g = (torch.randn(B, L, H, D) for _ in range(4))
        qp, kp, vp = (t.clone().requires_grad_() for t in (q, k, v))
        qt, kt, vt = (t.transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v))
        gt = g.transpose(1, 2).contiguous()
        learned = [t for t in params.values() if isinstance(t, torch.Tensor)]

        def run_posenc():
            for t in (qp, kp, vp, *learned):
                t.grad = None
            posenc.attention(qp, kp, vp, name, causal=True, **params).backward(g)

        def run_torch():
            for t in (qt, kt, vt, *learned):
                t.grad = None
            eager(qt, kt, vt).backward(gt)

        tp, tt = median_s(run_posenc), median_s(run_torch)
        rows[name] = {"posenc_s": tp, "torch_s": tt, "speedup": tt / tp}
    return rows


# ---- RoPE --------------------------------------------------------------------------------------------

def bench_rope():
    shape = (1, 4096, 32, 128)
    q, k = torch.randn(shape), torch.randn(shape)
    inv = 1.0 / 10000.0 ** (torch.arange(0, shape[3], 2).float() / shape[3])
    ang = torch.cat([torch.arange(shape[1]).float()[:, None] * inv[None, :]] * 2, dim=-1)
    cos, sin = ang.cos()[None, :, None, :], ang.sin()[None, :, None, :]

    def hf():
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin

    def ours():
        return posenc.rope_qk(q, k, layout="half")

    with torch.no_grad():
        tp, tt = median_s(ours), median_s(hf)
    return {"posenc_s": tp, "torch_s": tt, "speedup": tt / tp}


# ---- the binding's overhead on a decode step ---------------------------------------------------------

class CTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int), ("ndim", ctypes.c_int),
                ("shape", ctypes.c_int64 * 6), ("strides", ctypes.c_int64 * 6)]


def c_tensor(t, code):
    c = CTensor(t.data_ptr(), code, t.dim())
    for i in range(t.dim()):
        c.shape[i], c.strides[i] = t.size(i), t.stride(i)
    return c


def bench_overhead():
    q, k, v = torch.randn(1, 1, 8, 64), torch.randn(1, 128, 8, 64), torch.randn(1, 128, 8, 64)
    lib = ctypes.CDLL(posenc._C.__file__)
    lib.posenc_attention_params_new.restype = ctypes.c_void_p
    lib.posenc_attention_params_new.argtypes = [ctypes.c_char_p]
    lib.posenc_attention_params_set.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p]
    lib.posenc_attention_forward.argtypes = [ctypes.c_void_p] + [ctypes.POINTER(CTensor)] * 5
    p = lib.posenc_attention_params_new(b"rope")
    for key, val in ((b"causal", b"true"), (b"layout", b"half"), (b"k_offset", b"0")):
        assert lib.posenc_attention_params_set(p, key, val) == 0
    out, lse = torch.empty(1, 1, 8, 64), torch.empty(1, 8, 1, dtype=torch.float64)
    cq, ck, cv, co, cl = (c_tensor(t, 1 if t.dtype == torch.float64 else 0) for t in (q, k, v, out, lse))
    assert lib.posenc_attention_forward(p, cq, ck, cv, co, cl) == 0
    torch.testing.assert_close(out, posenc.attention(q, k, v, "rope", causal=True))
    fwd, args = lib.posenc_attention_forward, (p, cq, ck, cv, co, cl)
    # The two calls alternate, and the overhead is the median of the per-pair differences: drift in
    # the machine's speed (a shared VM) enters both calls of a pair.
    py, c, diff = [], [], []
    with torch.no_grad():
        for i in range(max(ARGS.repeats, 3000)):
            t0 = time.perf_counter()
            posenc.attention(q, k, v, "rope", causal=True)
            t1 = time.perf_counter()
            fwd(*args)
            t2 = time.perf_counter()
            if i:  # the first pair warms up
                py.append(t1 - t0), c.append(t2 - t1), diff.append((t1 - t0) - (t2 - t1))
    return {"python_us": statistics.median(py) * 1e6, "c_abi_us": statistics.median(c) * 1e6,
            "overhead_us": statistics.median(diff) * 1e6}


def main():
    report = {}
    for n in ARGS.threads:
        torch_model.set_threads(n)
        posenc.set_num_threads(n)
        att = bench_attention() if ARGS.only in (None, "attention") else {}
        rope = bench_rope() if ARGS.only in (None, "rope") else None
        over = bench_overhead() if ARGS.only in (None, "overhead") else None
        report[str(n)] = {"attention": att, "rope": rope, "overhead": over}
        if not ARGS.json:
            print(f"--- {n} thread{'s' if n > 1 else ''} (torch {torch.__version__}, posenc {posenc.__version__})")
            for name, r in att.items():
                print(f"attention {name:6s} fwd+bwd L={L} H={H} D={D} causal: posenc {r['posenc_s'] * 1e3:8.1f} ms"
                      f"  torch {r['torch_s'] * 1e3:8.1f} ms  {r['speedup']:5.2f}x")
            if rope:
                print(f"rope_qk [1, 4096, 32, 128]: posenc {rope['posenc_s'] * 1e3:.2f} ms  torch rotate_half "
                      f"{rope['torch_s'] * 1e3:.2f} ms  {rope['speedup']:.2f}x")
            if over:
                print(f"decode attention (M=1, N=128, H=8, D=64): python {over['python_us']:.1f} us  C ABI "
                      f"{over['c_abi_us']:.1f} us  binding overhead {over['overhead_us']:.1f} us")
    if ARGS.json:
        print(json.dumps(report))


if __name__ == "__main__":
    main()
