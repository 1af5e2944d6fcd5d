#!/usr/bin/python3
"""posenc's training run replayed in PyTorch: the golden losses of a few steps at a fixed seed.

    /usr/bin/python3 tests/e2e/test_train_torch.py --posenc PATH/TO/posenc [--seeds IGNORED]

For each encoding that scripts/torch_model.py writes independently (nope, learned, sinusoidal,
rope, alibi, t5): `posenc train` runs a few steps on one thread from a fixed seed, saving its initial
checkpoint (safetensors) and the exact token windows it drew; the PyTorch model loads that checkpoint,
trains on the same windows with torch.optim.AdamW under posenc's schedule and clipping, and its loss at
every step must equal posenc's to relative 2e-5, and the final parameters to 3e-5 (float32 in both,
summed in different orders; measured: ~1e-7 and ~2e-6). Then posenc trains the same run on two
threads (the batch in two shards), twice: the two runs must print the same losses to the last digit,
and agree with the PyTorch replay to the same tolerances. Exit 77 (skip) without torch or numpy.
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
        def train(threads, save, extra=()):
            return subprocess.run(
                [ARGS.posenc, "train", "--encoding", enc, "--steps", str(STEPS), "--batch", str(BATCH),
                 "--train-len", str(LEN), "--d-model", "32", "--heads", "4", "--d-ff", "64", "--layers", "2",
                 "--lr", str(LR), "--warmup", str(WARMUP), "--threads", str(threads), "--seed", "5",
                 "--corpus", corpus, "--save", save, *extra], capture_output=True, text=True)
        r = train(1, final, ("--init-out", init, "--dump-batches", batches))
        two = [train(2, final + f".2.{i}") for i in range(2)]
        bad = [x for x in [r] + two if x.returncode != 0]
        if bad:
            print(f"FAIL {enc}: posenc train exited {bad[0].returncode}: {bad[0].stderr.strip()}")
            failed += 1
            continue
        lines = [json.loads(x) for x in r.stdout.splitlines()]
        want = [x["loss"] for x in lines if "loss" in x]
        want2 = [[json.loads(x)["loss"] for x in t.stdout.splitlines() if "loss" in json.loads(x)] for t in two]
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
        # two threads: reproducible run to run, and the same training as the replay
        rel2 = max(abs(g - w) / abs(w) for g, w in zip(got, want2[0]))
        params2, _ = torch_model.read_safetensors(final + ".2.0")
        dmax2 = max((model.w(n) - t).abs().max().item() for n, t in params2.items())
        same = want2[0] == want2[1] and open(final + ".2.0", "rb").read() == open(final + ".2.1", "rb").read()
        ok2 = len(want2[0]) == STEPS and same and rel2 <= 2e-5 and dmax2 <= 3e-5
        print(f"{'PASS' if ok2 else 'FAIL'} {enc} on 2 threads: two runs identical: {same}, "
              f"torch max rel diff {rel2:.2e}, final params max |diff| {dmax2:.2e}")
        failed += (not ok) + (not ok2)
print(f"{2 * len(torch_model.SUPPORTED) - failed} passed, {failed} failed")
sys.exit(1 if failed else 0)
