#!/usr/bin/python3
"""posenc's training run replayed in PyTorch: the golden losses of a few steps at a fixed seed.

    /usr/bin/python3 tests/e2e/test_train_torch.py --posenc PATH/TO/posenc [--seeds IGNORED]

For each encoding that scripts/torch_model.py writes independently (nope, learned, sinusoidal,
rope, alibi): `posenc train` runs a few steps on one thread from a fixed seed, saving its initial
checkpoint (safetensors) and the exact token windows it drew; the PyTorch model loads that checkpoint,
trains on the same windows with torch.optim.AdamW under posenc's schedule and clipping, and its loss at
every step must equal posenc's to relative 2e-5, and the final parameters to 3e-5 (float32 in both,
summed in different orders; measured: ~1e-7 and ~2e-6). Exit 77 (skip) without torch or numpy.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--posenc", required=True)
ap.add_argument("--seeds", default="")
ARGS = ap.parse_args()

try:
    import numpy as np
    import torch
except ImportError as e:
    print(f"SKIP: {e}")
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
import torch_model  # noqa: E402

torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)

STEPS, BATCH, LEN, LR, WARMUP = 6, 3, 24, 3e-3, 2
TEXT = " ".join(f"In the beginning {i} was the word, and the word {i * 7 % 13} was with the count."
                for i in range(200))

failed = 0
with tempfile.TemporaryDirectory() as tmp:
    corpus = os.path.join(tmp, "corpus.txt")
    with open(corpus, "w") as f:
        f.write(TEXT)
    for enc in torch_model.SUPPORTED:
        init, final, batches = (os.path.join(tmp, f"{enc}.{x}") for x in ("init.safetensors", "final.safetensors", "b.npy"))
        cmd = [ARGS.posenc, "train", "--encoding", enc, "--steps", str(STEPS), "--batch", str(BATCH),
               "--train-len", str(LEN), "--d-model", "32", "--heads", "4", "--d-ff", "64", "--layers", "2",
               "--lr", str(LR), "--warmup", str(WARMUP), "--threads", "1", "--seed", "5", "--corpus", corpus,
               "--init-out", init, "--save", final, "--dump-batches", batches]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            print(f"FAIL {enc}: posenc train exited {r.returncode}: {r.stderr.strip()}")
            failed += 1
            continue
        lines = [json.loads(x) for x in r.stdout.splitlines()]
        want = [x["loss"] for x in lines if "loss" in x]
        cfg, model = torch_model.load(init)
        opt = torch_model.make_optimizer(model, LR)
        b = torch.from_numpy(np.load(batches).astype(np.int64))
        got = []
        for s in range(STEPS):
            lr = torch_model.lr_at(s, LR, WARMUP, STEPS)
            got.append(torch_model.train_step(model, opt, b[s, :, :-1], b[s, :, 1:], lr))
        rel = max(abs(g - w) / abs(w) for g, w in zip(got, want))
        params, _ = torch_model.read_safetensors(final)
        dmax = max((model.w(n) - t).abs().max().item() for n, t in params.items())
        ok = len(got) == len(want) == STEPS and rel <= 2e-5 and dmax <= 3e-5
        print(f"{'PASS' if ok else 'FAIL'} {enc}: losses {['%.5f' % x for x in want]}, "
              f"torch max rel diff {rel:.2e}, final params max |diff| {dmax:.2e}")
        failed += not ok
print(f"{len(torch_model.SUPPORTED) - failed} passed, {failed} failed")
sys.exit(1 if failed else 0)
