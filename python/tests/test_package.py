"""The package as a whole: version, registry, threads, the GIL-free kernels, and the example."""
import concurrent.futures
import os
import pathlib
import re
import runpy
import subprocess
import sys

import torch

import posenc
from test_attention import alibi_reference, eager
from test_rope import hf_rope, llama3_inv_freq

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "python" / "llama_alibi.py"


def test_version_is_the_projects():
    want = re.search(r"project\(posenc VERSION (\S+)", (ROOT / "CMakeLists.txt").read_text()).group(1)
    assert posenc.__version__ == want


def test_encodings_are_the_registrys():
    assert posenc.encodings() == ["nope", "learned", "sinusoidal", "rope", "alibi", "t5", "xl", "cope", "kerple",
                                  "sandwich", "fire", "rope2d", "mrope", "xpos"]


def test_threads_round_trip():
    before = posenc.get_num_threads()
    try:
        posenc.set_num_threads(3)
        assert posenc.get_num_threads() == 3
    finally:
        posenc.set_num_threads(0)
    assert posenc.get_num_threads() == before


def test_concurrent_calls_from_python_threads():
    torch.manual_seed(0)
    inputs = [(torch.randn(2, 64, 4, 32), torch.randn(2, 64, 4, 32), torch.randn(2, 64, 4, 32)) for _ in range(6)]
    serial = [posenc.attention(q, k, v, "alibi", causal=True) for q, k, v in inputs]
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        threaded = list(pool.map(lambda a: posenc.attention(*a, "alibi", causal=True), inputs))
    for a, b in zip(serial, threaded):
        assert torch.equal(a, b)


def test_example_gradients_against_eager_torch(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [str(EXAMPLE)])
    torch.manual_seed(0)
    g = runpy.run_path(str(EXAMPLE), run_name="__main__")
    assert capsys.readouterr().out.startswith("out (2, 16, 8, 128) |dq| ")
    q, k, v = (g[n].detach().double().requires_grad_() for n in ("q", "k", "v"))
    pos = torch.arange(16)
    inv = llama3_inv_freq(500000.0, 128, 8.0, 1.0, 4.0, 8192)
    qr, kr = hf_rope(q, pos, inv), hf_rope(k, pos, inv)
    out, _ = eager(qr, kr.repeat_interleave(4, 2), v.repeat_interleave(4, 2), alibi_reference(8, pos, pos), True, 0)
    out.square().sum().backward()
    for name, ref in (("q", q), ("k", k), ("v", v)):
        got = g[name].grad.double()
        assert (got - ref.grad).abs().max() <= 2e-3 * ref.grad.abs().max(), name


def test_example_runs_as_a_script(tmp_path):
    env = dict(os.environ)
    run = subprocess.run([sys.executable, str(EXAMPLE)], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    assert re.fullmatch(r"out \(2, 16, 8, 128\) \|dq\| [\d.]+ \|dk\| [\d.]+ \|dv\| [\d.]+\n", run.stdout)


def test_kernels_release_the_gil():
    """While a kernel runs on another thread, this thread keeps running Python: no long pause."""
    import threading
    import time
    posenc.set_num_threads(1)
    try:
        length, kernel = 512, 0.0
        while kernel < 0.25:  # a call long enough that a held GIL would stand out from scheduling noise
            length *= 2
            q = k = v = torch.randn(1, length, 4, 64)
            start = time.perf_counter()
            posenc.attention(q, k, v, "alibi")
            kernel = time.perf_counter() - start
        worker = threading.Thread(target=lambda: [posenc.attention(q, k, v, "alibi") for _ in range(2)])
        last, gap = time.perf_counter(), 0.0
        worker.start()
        while worker.is_alive():
            now = time.perf_counter()
            gap, last = max(gap, now - last), now
        worker.join()
    finally:
        posenc.set_num_threads(0)
    assert gap < kernel / 2, (gap, kernel)
