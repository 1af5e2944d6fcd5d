#!/usr/bin/python3
"""posenc study, plot and check end to end: what they write, what they refuse, and that the study's
worker processes change nothing in the numbers.

    /usr/bin/python3 tests/e2e/test_study.py --posenc PATH/TO/posenc [--articles IGNORED] [-k NAME]

The study runs here on a small generated corpus with a few steps (seconds, not minutes): the checks
are about the command (results.json's shape, the CSV, the picture, `learned` reported as null past
its table, two workers giving the numbers of one, bad input refused with one line and no output),
not about which encoding extrapolates — that is the README's main job. PNGs are decoded here (zlib +
the PNG filters) and must be real pictures: the stated size and more than a handful of colours.

Each case prints one line (PASS/FAIL); the last line is exactly "N passed, M failed"; exit 1 if any
case failed (tests/e2e/harness.py).
"""
import csv
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import zlib

from harness import POSENC, case, expect_error, main, run


def png_pixels(path):
    """(width, height, set of distinct pixels) of an 8-bit, non-interlaced PNG."""
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    at, idat, ihdr = 8, b"", None
    while at < len(data):
        n, kind = struct.unpack(">I4s", data[at:at + 8])
        body = data[at + 8:at + 8 + n]
        assert zlib.crc32(kind + body) == struct.unpack(">I", data[at + 8 + n:at + 12 + n])[0], "bad chunk CRC"
        if kind == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        at += 12 + n
    w, h, depth, color, _, _, interlace = ihdr
    assert depth == 8 and interlace == 0, f"unexpected PNG format {ihdr}"
    bpp = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}[color]
    raw, stride = zlib.decompress(idat), w * bpp
    prev, pixels = bytearray(stride), set()
    for y in range(h):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for x in range(stride):
            a = line[x - bpp] if x >= bpp else 0
            b, c = prev[x], prev[x - bpp] if x >= bpp else 0
            if f == 1:
                line[x] = (line[x] + a) & 255
            elif f == 2:
                line[x] = (line[x] + b) & 255
            elif f == 3:
                line[x] = (line[x] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        if y % 4 == 0:  # every fourth row is plenty to count colours
            pixels.update(bytes(line[i:i + bpp]) for i in range(0, stride, bpp))
        prev = line
    return w, h, pixels


def assert_picture(path, w=None, h=None, colours=6):
    pw, ph, px = png_pixels(path)
    assert (w is None or pw == w) and (h is None or ph == h), f"{path}: {pw}x{ph}, expected {w}x{h}"
    assert len(px) >= colours, f"{path}: only {len(px)} distinct colours — not a real picture"


def corpus(d):
    """~60 KB of text with structure a tiny model can learn a little of."""
    words = ["the", "word", "was", "with", "and", "in", "beginning", "light", "day", "night", "God"]
    out, x = [], 7
    for i in range(12000):
        x = (x * 1103515245 + 12345) % (1 << 31)
        out.append(words[x % len(words)])
        if i % 13 == 12:
            out.append(f"{i % 97}.\n")
    p = os.path.join(d, "corpus.txt")
    with open(p, "w") as f:
        f.write(" ".join(out))
    return p


SMALL = ["--train-len", 16, "--steps", 12, "--batch", 4, "--eval-tokens", 512]


def study(d, out, *extra):
    return run("study", "--corpus", corpus(d), *SMALL, "--out", out, *extra)


@case
def study_writes_results_csv_and_picture(d):
    out = os.path.join(d, "out")
    r = study(d, out, "--encodings", "nope,learned,alibi,rope", "--threads", "2")
    j = json.load(open(os.path.join(out, "results.json")))
    assert j["train_len"] == 16, j["train_len"]
    assert [e["encoding"] for e in j["encodings"]] == ["nope", "learned", "alibi", "rope"]
    for e in j["encodings"]:
        assert [p["len"] for p in e["eval"]] == [16, 32, 64, 128, 256], e["eval"]
        for p in e["eval"]:
            if e["encoding"] == "learned" and p["len"] > 16:
                assert p["ppl"] is None, f"learned has a perplexity past its table: {p}"
            else:
                # a dozen steps: finite, above 1 (it may still be worse than uniform over 256 bytes)
                assert p["ppl"] is not None and 1 < p["ppl"] < math.inf, p
    rows = list(csv.DictReader(open(os.path.join(out, "results.csv"))))
    assert len(rows) == 4 * 5 and rows[0].keys() >= {"encoding", "len", "ppl"}, rows[:2]
    learned = [r_ for r_ in rows if r_["encoding"] == "learned"]
    assert [r_["ppl"] == "" for r_ in learned] == [False, True, True, True, True], learned
    by = {(e["encoding"], p["len"]): p["ppl"] for e in j["encodings"] for p in e["eval"]}
    for r_ in rows:
        if r_["ppl"]:
            assert abs(float(r_["ppl"]) - by[(r_["encoding"], int(r_["len"]))]) < 1e-3, r_
    assert_picture(os.path.join(out, "ppl_vs_length.png"), 960, 640)
    # the table on stdout: one row per encoding, '-' where learned cannot run
    table = {line.split()[0]: line.split() for line in r.stdout.splitlines() if line.split()}
    assert table["learned"][2:6] == ["-"] * 4, table["learned"]
    assert set(os.listdir(out)) == {"results.json", "results.csv", "ppl_vs_length.png"}, os.listdir(out)


@case
def study_workers_give_the_numbers_of_one_thread(d):
    a, b = os.path.join(d, "a"), os.path.join(d, "b")
    study(d, a, "--encodings", "sinusoidal,alibi,t5", "--threads", "1")
    study(d, b, "--encodings", "sinusoidal,alibi,t5", "--threads", "2")
    ja, jb = (json.load(open(os.path.join(x, "results.json"))) for x in (a, b))
    for ea, eb in zip(ja["encodings"], jb["encodings"]):
        assert ea["encoding"] == eb["encoding"]
        assert ea["eval"] == eb["eval"], f"{ea['encoding']}: {ea['eval']} != {eb['eval']}"
        assert ea["final_train_loss"] == eb["final_train_loss"]
    for f in ("results.json", "results.csv"):  # nothing of how it ran: the same bytes
        assert open(os.path.join(a, f), "rb").read() == open(os.path.join(b, f), "rb").read(), f


@case
def study_seeds_give_mean_and_sd(d):
    one, three = os.path.join(d, "one"), os.path.join(d, "three")
    study(d, one, "--encodings", "alibi,learned", "--threads", "2", "--seed", "2")
    r = study(d, three, "--encodings", "alibi,learned", "--threads", "2", "--seeds", "3")
    j1, j3 = (json.load(open(os.path.join(x, "results.json"))) for x in (one, three))
    assert j3["seeds"] == 3 and "ppl_sd" not in j1["encodings"][0]["eval"][0], j1
    for e in j3["encodings"]:
        assert e["seeds"] == [1, 2, 3], e["seeds"]
        for p in e["eval"]:
            vals = p["ppl_seeds"]
            if e["encoding"] == "learned" and p["len"] > 16:
                assert vals == [None] * 3 and p["ppl"] is None and p["ppl_sd"] is None, p
                continue
            mean = sum(vals) / 3
            sd = math.sqrt(sum((v - mean) ** 2 for v in vals) / 2)
            assert abs(p["ppl"] - mean) <= 1e-12 * mean and abs(p["ppl_sd"] - sd) <= 1e-9 * mean, (p, mean, sd)
            assert len(set(vals)) == 3, f"the seeds gave equal values: {vals}"
    # the second seed of three is the run with --seed 2
    e1 = {e["encoding"]: e for e in j1["encodings"]}
    for e in j3["encodings"]:
        assert [p["ppl_seeds"][1] for p in e["eval"]] == [p["ppl"] for p in e1[e["encoding"]]["eval"]], e
    rows = list(csv.DictReader(open(os.path.join(three, "results.csv"))))
    assert rows[0].keys() == {"encoding", "len", "ppl", "ppl_sd"}, rows[0]
    assert "±" in r.stdout and "3 seeds" in r.stdout, r.stdout
    assert_picture(os.path.join(three, "ppl_vs_length.png"), 960, 640)


def plan_and_run(d, plan, *flags, parallel=2):
    """--plan into `plan`, then every line of jobs.txt run by xargs -P as a cluster would."""
    r = run("study", "--corpus", corpus(d), *SMALL, *flags, "--plan", plan)
    lines = open(os.path.join(plan, "jobs.txt")).read().splitlines()
    for line in lines:
        assert line.startswith(POSENC + " study ") and "--job " in line and "--out " + plan in line, line
    subprocess.run(["xargs", "-P", str(parallel), "-I{}", "sh", "-c", "{}"], stdin=open(os.path.join(plan, "jobs.txt")),
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd="/", timeout=600)
    return r, lines


@case
def study_plan_and_merge_match_a_local_run_bit_for_bit(d):
    flags = ["--encodings", "alibi,rope", "--seeds", "2"]
    local, plan, merged = (os.path.join(d, x) for x in ("local", "plan", "merged"))
    study(d, local, *flags, "--threads", "2")
    _, lines = plan_and_run(d, plan, *flags)
    assert len(lines) == 4, lines
    sb = open(os.path.join(plan, "slurm.sbatch")).read()
    assert "#SBATCH --array=1-4\n" in sb and "SLURM_ARRAY_TASK_ID" in sb, sb
    assert sorted(os.listdir(os.path.join(plan, "jobs"))) == ["alibi-s1.json", "alibi-s2.json", "rope-s1.json",
                                                               "rope-s2.json"]
    r = run("study", "--merge", plan, "--out", merged)
    for f in ("results.json", "results.csv", "ppl_vs_length.png"):
        assert open(os.path.join(local, f), "rb").read() == open(os.path.join(merged, f), "rb").read(), f
    assert "±" in r.stdout, r.stdout


@case
def study_merge_refuses_missing_and_duplicate_jobs(d):
    plan, out = os.path.join(d, "plan"), os.path.join(d, "out")
    plan_and_run(d, plan, "--encodings", "alibi,nope")
    jobs = os.path.join(plan, "jobs")
    os.rename(os.path.join(jobs, "nope-s1.json"), os.path.join(d, "nope-s1.json"))
    line = expect_error(["study", "--merge", plan, "--out", out], "--merge", [out])
    assert "1 of 2 jobs have no file" in line and "nope-s1" in line, line
    os.rename(os.path.join(d, "nope-s1.json"), os.path.join(jobs, "nope-s1.json"))
    shutil.copy(os.path.join(jobs, "alibi-s1.json"), os.path.join(jobs, "again.json"))
    line = expect_error(["study", "--merge", plan, "--out", out], "--merge", [out])
    assert "duplicate" in line and "alibi-s1" in line, line
    os.remove(os.path.join(jobs, "again.json"))
    run("study", "--merge", plan, "--out", out)
    expect_error(["study", "--merge", plan, "--out", out, "--steps", 3], "--steps")
    expect_error(["study", "--corpus", corpus(d), *SMALL, "--plan", plan, "--out", out], "--out")
    expect_error(["study", "--corpus", corpus(d), *SMALL, "--job", "frob-s1", "--out", plan], "--job")
    expect_error(["study", "--corpus", corpus(d), *SMALL, "--seeds", 0, "--out", out], "--seeds")


@case
def study_extend_compares_rope_schemes(d):
    out = os.path.join(d, "out")
    r = study(d, out, "--extend", "--threads", "2")  # 12 steps, fine-tunes of one step
    j = json.load(open(os.path.join(out, "results.json")))
    schemes = ["linear", "ntk", "dynamic", "yarn", "llama3"]
    names = [e["encoding"] for e in j["encodings"]]
    assert names == ["rope", *schemes, "rope+ft", *[s + "+ft" for s in schemes]], names
    by = {e["encoding"]: e["eval"] for e in j["encodings"]}
    for name, ev in by.items():
        assert [p["len"] for p in ev] == [16, 32, 64, 128, 256], ev
        assert all(1 < p["ppl"] < math.inf for p in ev), (name, ev)
    base = by["rope"][0]["ppl"]
    for s in schemes:  # at the training length every scheme's factor is 1: the trained model itself
        assert abs(by[s][0]["ppl"] - base) <= 1e-6 * base, (s, by[s][0], base)
        assert by[s][4]["ppl"] != by["rope"][4]["ppl"], f"{s} changed nothing at 16 L"
    for s in schemes:  # the fine-tunes differ from the model they start from
        assert by[s + "+ft"][2]["ppl"] != by[s][2]["ppl"], s
    assert "yarn+ft" in r.stdout
    expect_error(["study", "--corpus", corpus(d), *SMALL, "--extend", "--encodings", "alibi", "--out", out],
                 "--encodings")



@case
def study_extend_scores_passkey_by_depth(d):
    out = os.path.join(d, "out")
    run("study", "--extend", "--task", "passkey", "--train-len", 16, "--steps", 10, "--batch", 4, "--threads", "2",
        "--eval-examples", 4, "--out", out)
    j = json.load(open(os.path.join(out, "results.json")))
    assert j["task"] == "passkey", j
    names = [e["encoding"] for e in j["encodings"]]
    assert names[:2] == ["rope", "linear"] and names[-1] == "llama3+ft" and len(names) == 12, names
    for e in j["encodings"]:  # per length: the random placement, then depths 0 .. 1
        assert [(p["len"], p.get("depth")) for p in e["eval"]] == \
            [(16 * m, dd) for m in (1, 2, 4, 8, 16) for dd in (None, 0, 0.25, 0.5, 0.75, 1)], e["eval"]
        assert all(0 <= p["acc"] <= 1 for p in e["eval"]), e
    # the trained RoPE, evaluated as it is, is the study's rope on the task (the same training)
    plain = os.path.join(d, "plain")
    run("study", "--task", "passkey", "--encodings", "rope", "--train-len", 16, "--steps", 10, "--batch", 4,
        "--eval-examples", 4, "--threads", "2", "--out", plain)
    jp = json.load(open(os.path.join(plain, "results.json")))
    assert jp["encodings"][0]["eval"] == j["encodings"][0]["eval"], (jp["encodings"][0]["eval"], j["encodings"][0])
    rows = list(csv.DictReader(open(os.path.join(plain, "results.csv"))))
    assert list(rows[0].keys()) == ["encoding", "len", "depth", "ppl", "acc"], rows[0]
    assert [r_["depth"] for r_ in rows[:6]] == ["", "0", "0.25", "0.5", "0.75", "1"], rows[:6]


@case
def study_task_reports_accuracy(d):
    out = os.path.join(d, "out")
    run("study", "--task", "copy", "--encodings", "alibi,learned", "--train-len", 16, "--steps", 8,
        "--batch", 4, "--threads", "2", "--out", out)
    j = json.load(open(os.path.join(out, "results.json")))
    assert j["task"] == "copy"
    for e in j["encodings"]:
        for p in e["eval"]:
            if e["encoding"] == "learned" and p["len"] > 16:
                assert p["acc"] is None and p["ppl"] is None, p
            else:
                assert 0 <= p["acc"] <= 1 and p["ppl"] > 1, p
    assert_picture(os.path.join(out, "acc_vs_length.png"), 960, 640)


@case
def study_refuses_bad_input(d):
    c, out = corpus(d), os.path.join(d, "never")
    base = ["study", "--corpus", c, *SMALL, "--out", out]
    expect_error(base + ["--encodings", "nope,frob"], "--encodings", [out])
    expect_error(base + ["--encodings", "rope,rope"], "--encodings", [out])
    expect_error(base + ["--encodings", ""], "--encodings", [out])
    expect_error(base + ["--threads", 0], "--threads", [out])
    expect_error(base + ["--threads", "two"], "--threads", [out])
    expect_error(base + ["--steps", 0], "--steps", [out])
    expect_error(base + ["--train-len", 1], "--train-len", [out])
    expect_error(base + ["--preset", "huge"], "--preset", [out])
    expect_error(base + ["--task", "juggling"], "--task", [out])
    expect_error(base + ["--eval-examples", 8], "--eval-examples", [out])  # the corpus has --eval-tokens
    line = expect_error(["study", "--corpus", c, "--train-len", 16, "--steps", 12, "--batch", 4, "--eval-tokens", 200,
                         "--out", out], "--eval-tokens", [out])  # below 16 × 16: was raised silently
    assert "longest evaluation length 256" in line, line
    line = expect_error(base + ["--eval-tokens", 600], "--eval-tokens", [out])
    assert "once" in line, line
    expect_error(["study", "--corpus", os.path.join(d, "missing.txt"), *SMALL, "--out", out], "--corpus", [out])
    tiny = os.path.join(d, "tiny.txt")
    open(tiny, "w").write("too short")
    expect_error(["study", "--corpus", tiny, *SMALL, "--out", out], "--corpus", [out])
    afile = os.path.join(d, "afile")
    open(afile, "w").write("x")
    expect_error(["study", "--corpus", c, *SMALL, "--out", afile], "--out")
    assert "does not exist" in expect_error(["study", "--corpus", c, *SMALL, "--out", os.path.join(d, "nodir", "sub")],
                                            "--out")
    assert "not a directory" in expect_error(["study", "--corpus", c, *SMALL, "--out", os.path.join(afile, "sub")],
                                             "--out")
    assert open(afile).read() == "x"
    # a directory that cannot be made (even as root: /proc takes no new entries) fails before training
    if os.path.isdir("/proc/self"):
        expect_error(["study", "--corpus", c, *SMALL, "--out", "/proc/posenc-study-out"], "--out")


@case
def plot_draws_every_picture(d):
    whats = run("plot", "--help").stdout.splitlines()[0].split(": ", 1)[1].split(", ")
    assert set(whats) == {"sinusoid-matrix", "sine-waves", "rope-decay", "alibi-bias", "t5-buckets",
                          "cope-positions"}, whats
    for w in whats:
        p = os.path.join(d, w + ".png")
        run("plot", w, "--out", p)
        assert_picture(p)
    expect_error(["plot", "spiral", "--out", os.path.join(d, "s.png")], "WHAT", [os.path.join(d, "s.png")])
    expect_error(["plot", "rope-decay", "--dim", 3, "--out", os.path.join(d, "r.png")], "--dim",
                 [os.path.join(d, "r.png")])
    r = os.path.join(d, "r.png")
    expect_error(["plot", "sine-waves", "--dim", 7, "--out", r], "--dim", [r])
    expect_error(["plot", "cope-positions", "--text", "", "--out", r], "--text", [r])  # not the default sentence
    expect_error(["plot", "cope-positions", "--text", "caf\u00e9 au lait", "--out", r], "--text", [r])
    expect_error(["plot", "rope-decay", "--len", 1 << 20, "--dim", 4096, "--out", r], "--len", [r])  # minutes of work
    expect_error(["plot", "sine-waves", "--out", os.path.join(d, "r.jpg")], "--out", [os.path.join(d, "r.jpg")])
    run("plot", "cope-positions", "--text", "a b 'c' d", "--out", r)
    assert_picture(r)


@case
def check_lists_every_encoding(d):
    out = os.path.join(d, "out")
    study(d, out, "--encodings", "alibi", "--threads", "1")
    r = run("check", "--study", out, "--len", 64, "--dim", 16)
    names = [e["name"] for e in json.loads(run("list", "--json").stdout)]
    rows = {line.split()[0]: line for line in r.stdout.splitlines()[1:] if line.strip()}
    assert list(rows) == names, f"check's rows {list(rows)} are not the catalogue {names}"
    assert "at 256 vs 16" in rows["alibi"], rows["alibi"]           # read from the study
    assert "not in the study" in rows["rope"], rows["rope"]
    assert rows["sinusoidal"].split()[1] == "yes:" and rows["nope"].split()[1] == "no:", rows


if __name__ == "__main__":
    sys.exit(main(folder="path", prefix="posenc-study-"))
