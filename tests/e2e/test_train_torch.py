#!/usr/bin/python3
"""posenc's training run replayed in PyTorch: the golden losses of a few steps at a fixed seed.

    /usr/bin/python3 tests/e2e/test_train_torch.py --posenc PATH/TO/posenc [--articles IGNORED] [-k NAME]

For each encoding that scripts/torch_model.py writes independently (nope, learned, sinusoidal,
rope, alibi, t5), two cases. ENC: `posenc train` runs a few steps on one thread from a fixed seed,
saving its initial checkpoint (safetensors) and the exact token windows it drew; the PyTorch model
loads that checkpoint, trains on the same windows with torch.optim.AdamW under posenc's schedule and
clipping, and its loss at every step must equal posenc's to relative 2e-5, and the final parameters
to 3e-5 (float32 in both, summed in different orders; measured: ~1e-7 and ~2e-6). "ENC on 2
threads": posenc trains the same run on two threads (the batch in two shards), twice: the two runs
must print the same losses to the last digit and write the same checkpoint, and agree with the
PyTorch replay (made once per encoding, by whichever case comes first) to the same tolerances.

Each case prints one line (PASS with the losses and differences, or FAIL); the last line is exactly
"N passed, M failed"; exit 1 if any case failed, 77 (skip) without torch or numpy
(tests/e2e/harness.py).
"""
import json
import os
import sys

from harness import case, main, run, skip

try:
    import numpy as np
    import torch
except ImportError as e:
    skip(str(e))

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
import torch_model  # noqa: E402

torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)

STEPS, BATCH, LEN, LR, WARMUP = 6, 3, 24, 3e-3, 2
TEXT = " ".join(f"In the beginning {i} was the word, and the word {i * 7 % 13} was with the count."
                for i in range(200))


def train(d, enc, threads, save, extra=()):
    """posenc train of enc on `threads` threads, the checkpoint to `save`; the losses it printed."""
    r = run("train", "--encoding", enc, "--steps", STEPS, "--batch", BATCH, "--train-len", LEN,
            "--d-model", 32, "--heads", 4, "--d-ff", 64, "--layers", 2, "--lr", LR, "--warmup", WARMUP,
            "--threads", threads, "--seed", 5, "--corpus", d.write("corpus.txt", TEXT), "--save", save, *extra)
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    # the summary: tokens per second over the steps after the first (reported apart)
    t = lines[-1]
    after = t["seconds"] - t["first_step_seconds"]
    assert t["steps"] == STEPS and 0 < t["first_step_seconds"] < t["seconds"], t
    assert abs(t["tokens_per_second"] * after / ((STEPS - 1) * BATCH * LEN) - 1) < 1e-6, t
    return [x["loss"] for x in lines if "loss" in x]


_replays = {}


def replay(d, enc):
    """posenc's one-thread run of enc and its PyTorch replay, once per encoding: posenc's losses, the
    replay's losses, the replayed model, and posenc's final parameters."""
    if enc not in _replays:
        init, final, batches = (d.out(f"{enc}.{x}") for x in ("init.safetensors", "final.safetensors", "b.npy"))
        want = train(d, enc, 1, final, ("--init-out", init, "--dump-batches", batches))
        cfg, model = torch_model.load(init)
        opt = torch_model.make_optimizer(model, LR)
        b = torch.from_numpy(np.load(batches).astype(np.int64))
        got = []
        for s in range(STEPS):
            lr = torch_model.lr_at(s, LR, WARMUP, STEPS)
            got.append(torch_model.train_step(model, opt, b[s, :, :-1], b[s, :, 1:], lr))
        params, _ = torch_model.read_safetensors(final)
        _replays[enc] = want, got, model, params
    return _replays[enc]


def max_rel(got, want):
    return max(abs(g - w) / abs(w) for g, w in zip(got, want))


def max_diff(model, params):
    return max((model.w(n) - t).abs().max().item() for n, t in params.items())


def register(enc):
    @case(enc)
    def one_thread(d):
        want, got, model, params = replay(d, enc)
        rel, dmax = max_rel(got, want), max_diff(model, params)
        detail = (f"losses {['%.5f' % x for x in want]}, torch max rel diff {rel:.2e}, "
                  f"final params max |diff| {dmax:.2e}")
        assert len(got) == len(want) == STEPS and rel <= 2e-5 and dmax <= 3e-5, detail
        return detail

    @case(f"{enc} on 2 threads")
    def two_threads(d):
        # reproducible run to run, and the same training as the replay
        _, got, model, _ = replay(d, enc)
        saves = [d.out(f"{enc}.final.safetensors.2.{i}") for i in range(2)]
        want2 = [train(d, enc, 2, s) for s in saves]
        rel2 = max_rel(got, want2[0])
        params2, _ = torch_model.read_safetensors(saves[0])
        dmax2 = max_diff(model, params2)
        same = want2[0] == want2[1] and open(saves[0], "rb").read() == open(saves[1], "rb").read()
        detail = (f"two runs identical: {same}, torch max rel diff {rel2:.2e}, "
                  f"final params max |diff| {dmax2:.2e}")
        assert len(want2[0]) == STEPS and same and rel2 <= 2e-5 and dmax2 <= 3e-5, detail
        return detail


for enc in torch_model.SUPPORTED:
    register(enc)

if __name__ == "__main__":
    sys.exit(main(folder="dir", prefix="posenc-train-torch-"))
