#!/usr/bin/python3
"""Training speed: the study's model in posenc and in PyTorch, same machine, same threads, one run.

    /usr/bin/python3 scripts/train_speed.py [--posenc build/posenc] [--encodings rope,alibi]
                                           [--threads 1,2] [--steps 60] [--batch 16] [--len 64]
                                           [--rounds 3] [--keep-freed-memory] [--corpus FILE]

For each encoding and thread count: `posenc train` trains the default study model (d_model 64,
2 layers, 4 heads, d_ff 256) and reports its tokens per second (optimisation steps only); then the
same model written independently in PyTorch (scripts/torch_model.py, eager mode), loaded from posenc's
initial checkpoint, trains on the very same windows (posenc's --dump-batches) with the same optimizer,
schedule and clipping, timed the same way after one warm-up step. The two alternate for --rounds
rounds (each round a fresh posenc run and a fresh PyTorch model from the same checkpoint), so that
a moment of load on a shared machine lands on both rather than on one; the table shows each side's
median over the rounds, the ratio of the medians, and the range of the per-round ratios. PyTorch
gets the thread count in its own pool and its BLAS (Debian's OpenBLAS) one thread: OpenBLAS's pthread
pool ignores torch.set_num_threads and would otherwise add cores of its own (torch_model.set_threads).

Every PyTorch op allocates its output afresh, and glibc's default malloc hands the larger blocks to
mmap and back to the kernel on free, so each step page-faults them in again (the system time of a
run). That is how a default PyTorch process trains, and the script's default. --keep-freed-memory
tells glibc (mallopt here, the MALLOC_ variables for posenc) to keep freed memory instead, as
bench_torch.py does by default: PyTorch at its best. Needs Debian's python3-torch and python3-numpy.
"""
import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_model  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--posenc", default="build/posenc")
ap.add_argument("--encodings", default="rope,alibi")
ap.add_argument("--threads", default="1,2")
ap.add_argument("--steps", type=int, default=60)
ap.add_argument("--batch", type=int, default=16)
ap.add_argument("--len", type=int, default=64)
ap.add_argument("--rounds", type=int, default=3, help="posenc and PyTorch runs, alternating (median)")
ap.add_argument("--keep-freed-memory", action="store_true",
                help="glibc keeps freed memory (no mmap, no trim) in both processes: PyTorch at its best")
ap.add_argument("--corpus", default="", help="text file (default: posenc's built-in corpus)")
a = ap.parse_args()

if a.rounds < 1 or a.steps < 2:
    sys.exit("train_speed.py: --rounds must be at least 1 and --steps at least 2")
blas_pinned = torch_model.set_threads(1)
env = dict(os.environ)
if a.keep_freed_memory:
    libc = ctypes.CDLL(None)
    M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc's <malloc.h>
    if not (libc.mallopt(M_MMAP_MAX, 0) and libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1)):
        sys.exit("train_speed.py: mallopt failed (--keep-freed-memory needs glibc)")
    env.update(MALLOC_MMAP_MAX_="0", MALLOC_TRIM_THRESHOLD_=str(2**31 - 1))
malloc = "freed memory kept" if a.keep_freed_memory else "glibc's default malloc"
print(f"{'encoding':<10} {'threads':>7} {'posenc tok/s':>13} {'torch tok/s':>12} {'ratio':>7}  "
      f"{'per round':>11}  (medians of {a.rounds} alternating rounds; torch {torch.__version__}, "
      f"{'its OpenBLAS at one thread' if blas_pinned else 'its BLAS is not OpenBLAS'}; {malloc})")
with tempfile.TemporaryDirectory() as tmp:
    for enc in a.encodings.split(","):
        for threads in (int(t) for t in a.threads.split(",")):
            init, batches = os.path.join(tmp, "init.safetensors"), os.path.join(tmp, "b.npy")
            cmd = [a.posenc, "train", "--encoding", enc, "--steps", str(a.steps), "--batch", str(a.batch),
                   "--train-len", str(a.len), "--threads", str(threads), "--log-every", str(a.steps),
                   "--init-out", init, "--dump-batches", batches] + (["--corpus", a.corpus] if a.corpus else [])
            ours_all, theirs_all = [], []
            for rnd in range(a.rounds):
                r = subprocess.run(cmd, capture_output=True, text=True, env=env)
                if r.returncode != 0:
                    sys.exit(f"posenc train failed: {r.stderr.strip()}")
                ours_all.append(json.loads(r.stdout.splitlines()[-1])["tokens_per_second"])
                torch_model.set_threads(threads)
                cfg, model = torch_model.load(init)
                opt = torch_model.make_optimizer(model, 3e-3)
                b = torch.from_numpy(np.load(batches).astype(np.int64))
                warm = min(50, a.steps // 10)
                torch_model.train_step(model, opt, b[0, :, :-1], b[0, :, 1:], torch_model.lr_at(0, 3e-3, warm, a.steps))
                t0 = time.perf_counter()
                for s in range(1, a.steps):
                    torch_model.train_step(model, opt, b[s, :, :-1], b[s, :, 1:], torch_model.lr_at(s, 3e-3, warm, a.steps))
                theirs_all.append((a.steps - 1) * a.batch * a.len / (time.perf_counter() - t0))
            ours, theirs = statistics.median(ours_all), statistics.median(theirs_all)
            per = [o / t for o, t in zip(ours_all, theirs_all)]
            print(f"{enc:<10} {threads:>7} {ours:>13.0f} {theirs:>12.0f} {ours / theirs:>7.2f}  "
                  f"{min(per):>5.2f}–{max(per):<5.2f}", flush=True)
