"""posenc.distributed.ring_attention with 2 and 4 processes (gloo on 127.0.0.1) against single-process
posenc.attention on the whole sequence: out, dq, dk, dv and the parameter gradients, for rope, alibi, t5
and fire, causal and not; float64 (the reference path, to 1e-10) and float32 at shard sizes where the
fused kernel runs (B·Hq·Lq·Lk >= 2^14); cope refused. Every run is bounded in time: a hang fails."""
import datetime
import os
import socket
import time
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import posenc
from posenc.distributed import ring_attention

TIMEOUT_S = 120


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def encoding_params(encoding, heads, gen):
    """posenc.attention's keyword parameters for the encoding; the learned tensors require grad."""
    def learned(*shape, scale=1.0, positive=False):
        t = torch.randn(*shape, generator=gen, dtype=torch.float64) * scale
        return (t.abs() + 0.5 if positive else t).requires_grad_()
    if encoding == "rope":
        return {"rope": {"theta": 500.0}}
    if encoding == "alibi":
        return {"variant": "learned", "weights": learned(2, heads)}
    if encoding == "t5":
        return {"num_buckets": 16, "max_distance": 64, "weights": learned(16, heads, scale=0.5)}
    if encoding == "fire":
        return {"mlp_w1": learned(5), "mlp_b1": learned(5), "mlp_w2": learned(heads, 5, scale=0.5),
                "mlp_b2": learned(heads), "c": torch.tensor([0.3], dtype=torch.float64).requires_grad_(),
                "threshold": torch.tensor([40.5], dtype=torch.float64).requires_grad_()}
    return {}


def worker(rank, world, port, encoding, causal, dtype, shape, result_dir):
    try:
        torch.set_num_threads(1)
        posenc.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=TIMEOUT_S))
        check(rank, world, encoding, causal, dtype, shape)
        dist.barrier()
        dist.destroy_process_group()
    except Exception:
        with open(os.path.join(result_dir, f"rank{rank}.err"), "w") as f:
            f.write(traceback.format_exc())
        raise


def check(rank, world, encoding, causal, dtype, shape):
    B, lq, lk, HQ, HKV, D = shape
    M, N = world * lq, world * lk
    gen = torch.Generator().manual_seed(7)  # the same whole tensors on every process
    q = torch.randn(B, M, HQ, D, generator=gen, dtype=torch.float64).to(dtype)
    k = torch.randn(B, N, HKV, D, generator=gen, dtype=torch.float64).to(dtype)
    v = torch.randn(B, N, HKV, D, generator=gen, dtype=torch.float64).to(dtype)
    g = torch.randn(B, M, HQ, D, generator=gen, dtype=torch.float64).to(dtype)
    params = encoding_params(encoding, HQ, gen)
    learned = {n: t for n, t in params.items() if isinstance(t, torch.Tensor) and t.requires_grad}

    # the whole sequence in this process
    qw, kw, vw = (t.clone().requires_grad_() for t in (q, k, v))
    out_w = posenc.attention(qw, kw, vw, encoding, causal=causal, **params)
    (out_w * g).sum().backward()
    want = {"dq": qw.grad, "dk": kw.grad, "dv": vw.grad, **{n: t.grad.clone() for n, t in learned.items()}}
    for t in learned.values():
        t.grad = None

    # this process's shards
    qs, ks, vs = (t[:, rank * n:(rank + 1) * n].clone().requires_grad_()
                  for t, n in ((q, lq), (k, lk), (v, lk)))
    out = ring_attention(qs, ks, vs, encoding=encoding, causal=causal, **params)
    (out * g[:, rank * lq:(rank + 1) * lq]).sum().backward()
    got = {"dq": qs.grad, "dk": ks.grad, "dv": vs.grad, **{n: t.grad for n, t in learned.items()}}
    tol = dict(rtol=1e-10, atol=1e-10) if dtype == torch.float64 else dict(rtol=2e-4, atol=2e-4)
    torch.testing.assert_close(out, out_w[:, rank * lq:(rank + 1) * lq].detach(), **tol)
    for name in ("dq",):
        torch.testing.assert_close(got[name], want[name][:, rank * lq:(rank + 1) * lq], **tol, msg=name)
    for name in ("dk", "dv"):
        torch.testing.assert_close(got[name], want[name][:, rank * lk:(rank + 1) * lk], **tol, msg=name)
    # A parameter gradient can cancel to about 0 over the rows (FIRE's b2: Σ_j dl_ij = 0): tolerances
    # scale with the encoding's largest parameter gradient.
    scale = max([want[n].abs().max().item() for n in learned] + [1e-3])
    for name in learned:
        torch.testing.assert_close(got[name] / scale, want[name] / scale, **tol, msg=name)
    assert want["dk"].abs().max() > 1e-3  # not a vacuous comparison


def run(world, encoding, causal, dtype, shape, tmp_path):
    """Spawns `world` processes; fails on any exception, or when they are not done in TIMEOUT_S."""
    port = free_port()
    ctx = mp.start_processes(worker, args=(world, port, encoding, causal, dtype, shape, str(tmp_path)),
                             nprocs=world, join=False, start_method="spawn")
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while not ctx.join(timeout=1):
            if time.monotonic() > deadline:
                pytest.fail(f"ring attention with {world} processes did not finish in {TIMEOUT_S} s")
    except mp.ProcessRaisedException as e:
        errs = "".join(p.read_text() for p in sorted(tmp_path.glob("rank*.err")))
        pytest.fail(f"a process failed:\n{errs or e}")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()


ENCODINGS = ["rope", "alibi", "t5", "fire"]


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_ring_float64_equals_whole(world, causal, encoding, tmp_path):
    run(world, encoding, causal, torch.float64, (2, 5, 5, 4, 2, 8), tmp_path)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_ring_float32_fused_equals_whole(causal, encoding, tmp_path):
    # B·Hq·Lq·Lk = 1·4·64·64 = 2^14 per shard: the fused kernel, forward and backward
    run(2, encoding, causal, torch.float32, (1, 64, 64, 4, 2, 32), tmp_path)


def mismatch_worker(rank, world, port, which, result_dir):
    """Rank 1's shard one row longer (q or k): every rank must raise the one-line ValueError."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=TIMEOUT_S))
    lq, lk = (3 + rank, 4) if which == "q" else (3, 4 + rank)
    try:
        ring_attention(torch.zeros(1, lq, 2, 8), torch.zeros(1, lk, 2, 8), torch.zeros(1, lk, 2, 8), encoding="alibi")
        message = "no error"
    except ValueError as e:
        message = str(e)
    with open(os.path.join(result_dir, f"rank{rank}.msg"), "w") as f:
        f.write(message)
    dist.destroy_process_group()


@pytest.mark.parametrize("which", ["q", "k"])
def test_shards_of_other_shapes_refused_on_every_rank(which, tmp_path):
    ctx = mp.start_processes(mismatch_worker, args=(2, free_port(), which, str(tmp_path)), nprocs=2, join=False,
                             start_method="spawn")
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while not ctx.join(timeout=1):
            assert time.monotonic() < deadline, "the processes did not finish"
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
    for rank in range(2):
        message = (tmp_path / f"rank{rank}.msg").read_text()
        assert message.startswith(f"{which}_shard: expected the same shape") and "\n" not in message, message


def test_bad_arguments_name_the_argument():
    q = torch.zeros(1, 2, 2, 8)
    with pytest.raises(ValueError, match="^v_shard: expected float32 like q_shard, got float64$"):
        ring_attention(q, q, q.double())
    with pytest.raises(TypeError, match="^causal: expected a bool"):
        ring_attention(q, q, q, causal="false")


def test_cope_refused():
    with pytest.raises(ValueError, match="cope"):
        ring_attention(torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 1, 4), encoding="cope",
                       table=torch.zeros(3, 4))
