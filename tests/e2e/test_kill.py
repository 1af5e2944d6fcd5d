#!/usr/bin/python3
"""Writes lose nothing (docs/reliability.md, Writes): `posenc train --save` and `posenc study` killed
with SIGKILL at random points leave the previous file of the same name intact.

    /usr/bin/python3 tests/e2e/test_kill.py --posenc PATH/TO/posenc [--articles IGNORED] [-k NAME]

Each case writes a first good output, computes the output a complete second run writes (elsewhere),
then starts that second run on the first one's name again and again, killing it (its whole process
group: the study's workers and gnuplot too) at times drawn from a seeded RNG as fractions of a run's
length (the shortest complete run so far): a third anywhere, a third in its last 30 %, a third in
its last 8 %, where the writing happens. After every kill each destination file must be
byte-identical to the first output or equal to the complete second one (results.json: the same JSON
but for its timings), never a mix, never partial; and nothing but the destinations and hidden
temporaries (".NAME.posenc-tmp-PID-N") may be in the folder. A temporary can remain (a killed
process cannot clean up): the rule is that the next complete write of that name removes it, which
the last step checks. Four more runs per case are killed as soon as a temporary of an output
appears (while it writes). Each case returns how many runs were killed, and how many of those left a
new temporary of an output (killed while writing). Each case prints one line (PASS/FAIL); the last
line is exactly "N passed, M failed"; exit 1 if any case failed (tests/e2e/harness.py).
"""
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

from harness import POSENC, case, main, run, skip

TRAIN = ["--encoding", "alibi", "--steps", "8", "--batch", "2", "--train-len", "16", "--threads", "1", "--d-model", "192",
         "--d-ff", "768", "--log-every", "8"]  # a checkpoint of 3.6 MB: its writing takes a while
STUDY = ["--encodings", "nope,alibi", "--steps", "4", "--batch", "2", "--train-len", "16", "--threads", "1"]


def corpus(d):
    """~30 KB of generated text."""
    words = ["the", "word", "was", "with", "and", "in", "beginning", "light", "day", "night"]
    out, x = [], 7
    for i in range(6000):
        x = (x * 1103515245 + 12345) % (1 << 31)
        out.append(words[x % len(words)] + ("\n" if i % 13 == 12 else " "))
    return d.write("corpus.txt", "".join(out))


def read(path):
    with open(path, "rb") as f:
        return f.read()


TIMINGS = ("tokens_per_second", "train_seconds")  # the study's results.json measures its own speed


def canonical(name, data):
    """What must match between two complete runs: the bytes, but for results.json its parsed JSON
    without the timings (a partial file does not parse)."""
    if not name.endswith(".json"):
        return data

    def strip(x):
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k not in TIMINGS}
        return [strip(v) for v in x] if isinstance(x, list) else x
    try:
        return strip(json.loads(data))
    except ValueError:
        return None


def killed_run(args, delay):
    """posenc with args in its own process group, the group killed with SIGKILL after delay seconds
    (or left to finish first). Returns (whether it was killed, the seconds it ran)."""
    t = time.time()
    p = subprocess.Popen([POSENC, *map(str, args)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    try:
        p.wait(timeout=delay)
        assert p.returncode == 0, f"posenc {' '.join(map(str, args))} exited {p.returncode}"
        return False, time.time() - t
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        return True, delay


def killed_while_writing(args, folder, names):
    """posenc with args, killed (its process group, SIGKILL) as soon as a temporary of one of `names`
    appears in folder: during its writing. Returns whether it was killed before it ended."""
    p = subprocess.Popen([POSENC, *map(str, args)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    prefixes = tuple("." + n + ".posenc-tmp-" for n in names)
    while p.poll() is None:
        if any(e.startswith(prefixes) for e in os.listdir(folder)):
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            return True
        time.sleep(0.0002)
    assert p.returncode == 0, f"posenc {' '.join(map(str, args))} exited {p.returncode}"
    return False


def fractions(rng, n):
    """n kill times as fractions of a run: a third anywhere, a third in its last 30 %, a third in its
    last 8 % (where the writing happens)."""
    return [rng.uniform(*[(0.0, 1.0), (0.7, 1.0), (0.92, 1.0)][i % 3]) for i in range(n)]


def leftovers(folder, names):
    """Entries of folder other than the destinations `names`, split into (hidden temporaries, others)."""
    temps, others = [], []
    for e in sorted(os.listdir(folder)):
        if e in names:
            continue
        # the destinations' temporaries, the study's gnuplot script's, the command's probe of the folder
        is_temp = any(e.startswith("." + n + ".posenc-tmp-") for n in [*names, "plot.gp", "posenc-probe"])
        (temps if is_temp else others).append(e)
    return temps, others


def kill_trials(make_args, folder, names, first, second, seed, trials):
    """The trials of one case; first and second: {name: bytes}. Returns (kills, kills that left a new
    temporary: those that hit the writing)."""
    _, full = killed_run(make_args(), 600)  # a complete run: its length (shortened below when one ends sooner)
    for n in names:  # the complete run wrote the second output: put the first one back
        with open(os.path.join(folder, n), "wb") as f:
            f.write(first[n])
    rng = random.Random(seed)
    kills = in_writing = 0
    before = set()
    for u in fractions(rng, trials) + [None] * 4:  # then 4 kills as the writing starts
        delay = 0.0 if u is None else u * full
        if u is None:
            killed = killed_while_writing(make_args(), folder, names)
        else:
            killed, ran = killed_run(make_args(), delay)
            full = full if killed else min(full, ran)
        kills += killed
        for n in names:
            got = read(os.path.join(folder, n))
            assert got == first[n] or canonical(n, got) == canonical(n, second[n]), \
                f"{n} after a kill at {delay:.2f} s is neither output ({len(got)} bytes)"
            with open(os.path.join(folder, n), "wb") as f:  # the next trial starts from the first output
                f.write(first[n])
        temps, others = leftovers(folder, names)
        assert not others, f"after a kill at {delay:.2f} s: {others}"
        in_writing += any(not t.startswith(".posenc-probe.") for t in set(temps) - before)
        before = set(temps)
    run(*make_args())  # a complete write removes the temporaries the killed runs left
    temps, others = leftovers(folder, names)
    assert not temps and not others, f"after a complete run: {temps + others}"
    for n in names:
        assert canonical(n, read(os.path.join(folder, n))) == canonical(n, second[n]), f"{n}: the complete run's output differs"
    return kills, in_writing


@case("train --save killed at random points leaves the previous checkpoint whole")
def train_save(d):
    c = corpus(d)
    os.mkdir(d.out("run"))
    os.mkdir(d.out("ref"))
    dest, ref = d.out("run/model.safetensors"), d.out("ref/model.safetensors")
    run("train", *TRAIN, "--corpus", c, "--seed", 1, "--save", dest)
    run("train", *TRAIN, "--corpus", c, "--seed", 2, "--save", ref)
    first, second = {"model.safetensors": read(dest)}, {"model.safetensors": read(ref)}
    assert first != second
    kills, temps = kill_trials(lambda: ["train", *TRAIN, "--corpus", c, "--seed", 2, "--save", dest],
                               d.out("run"), ["model.safetensors"], first, second, 28, 20)
    assert kills >= 12, f"only {kills} of 24 runs were killed before they ended"
    return f"{kills} kills, {temps} of them while writing"


@case("study killed at random points leaves the previous results whole")
def study_out(d):
    if shutil.which("gnuplot") is None:
        skip("the study's plot needs gnuplot")
    c = corpus(d)
    out, ref = d.out("study"), d.out("ref")
    names = ["results.json", "results.csv", "ppl_vs_length.png"]
    run("study", *STUDY, "--corpus", c, "--seed", 1, "--out", out)
    run("study", *STUDY, "--corpus", c, "--seed", 2, "--out", ref)
    assert sorted(os.listdir(out)) == sorted(names), os.listdir(out)
    first = {n: read(os.path.join(out, n)) for n in names}
    second = {n: read(os.path.join(ref, n)) for n in names}
    assert first["results.json"] != second["results.json"]
    kills, temps = kill_trials(lambda: ["study", *STUDY, "--corpus", c, "--seed", 2, "--out", out],
                               out, names, first, second, 29, 16)
    assert kills >= 10, f"only {kills} of 20 runs were killed before they ended"
    return f"{kills} kills, {temps} of them while writing"


if __name__ == "__main__":
    sys.exit(main(folder="dir", timeout=120))
