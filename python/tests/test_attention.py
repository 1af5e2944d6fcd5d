"""posenc.attention and posenc.bias: gradcheck for every encoding and learned tensor, parity with eager
softmax attention written here (ALiBi, T5, CoPE), low precision against float64."""
import math

import pytest
import torch

import posenc

B, M, N, HQ, HKV, D = 1, 3, 4, 2, 1, 8


def rand(*shape, positive=False, grad=False):
    t = torch.randn(*shape, dtype=torch.float64)
    if positive:
        t = t.abs() + 0.5
    return t.requires_grad_(grad)


def cases():
    """(id, encoding, keyword parameters, names of the learned tensors among them)."""
    pos2 = (torch.tensor([[0, 1, 1], [2, 0, 1]]), torch.tensor([[0, 1, 2, 0], [1, 1, 0, 2]]))
    pos3 = (torch.tensor([[1, 2, 3], [0, 1, 1], [2, 0, 1]]), torch.tensor([[0, 1, 2, 3], [1, 0, 1, 0], [0, 2, 1, 1]]))
    return [
        ("nope", "nope", {}, []),
        ("rope", "rope", {"rope": {"theta": 100.0}}, []),
        ("alibi", "alibi", {"slopes": rand(HQ, positive=True)}, []),
        ("alibi-nonsym", "alibi", {"variant": "nonsymmetric"}, []),
        ("alibi-learned", "alibi", {"variant": "learned", "weights": rand(2, HQ, grad=True)}, ["weights"]),
        ("t5", "t5", {"num_buckets": 8, "max_distance": 16, "weights": rand(8, HQ, grad=True)}, ["weights"]),
        ("xl", "xl", {"u": rand(HQ, D, grad=True), "v_bias": rand(HQ, D, grad=True),
                      "rel_proj": rand(HQ, D, 4, grad=True)}, ["u", "v_bias", "rel_proj"]),
        ("cope", "cope", {"table": rand(3, D, grad=True)}, ["table"]),
        ("kerple-log", "kerple", {"r1": rand(HQ, positive=True, grad=True), "r2": rand(HQ, positive=True, grad=True)},
         ["r1", "r2"]),
        ("kerple-power", "kerple", {"kernel": "power", "r1": rand(HQ, positive=True, grad=True),
                                    "r2": (torch.rand(HQ, dtype=torch.float64) + 0.5).requires_grad_()}, ["r1", "r2"]),
        ("sandwich", "sandwich", {"sinusoid_dim": 8}, []),
        ("fire", "fire", {"mlp_w1": rand(3, grad=True), "mlp_b1": rand(3, grad=True), "mlp_w2": rand(HQ, 3, grad=True),
                          "mlp_b2": rand(HQ, grad=True), "c": torch.tensor([1.3], dtype=torch.float64).requires_grad_(),
                          "threshold": torch.tensor([2.5], dtype=torch.float64).requires_grad_()},
         ["mlp_w1", "mlp_b1", "mlp_w2", "mlp_b2", "c", "threshold"]),
        ("rope2d-axial", "rope2d", {"q_positions": pos2[0], "k_positions": pos2[1]}, []),
        ("rope2d-mixed", "rope2d", {"variant": "mixed", "freqs": rand(2, HQ, D // 2, grad=True),
                                    "q_positions": pos2[0], "k_positions": pos2[1]}, ["freqs"]),
        ("mrope", "mrope", {"mrope_section": [2, 1, 1], "q_positions": pos3[0], "k_positions": pos3[1]}, []),
        ("xpos", "xpos", {"scale_base": 64}, []),
    ]


CASES = cases()


def test_every_encoding_of_the_registry_is_covered():
    inside = set(posenc.encodings()) - {"learned", "sinusoidal"}
    assert {c[1] for c in CASES} == inside


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_gradcheck(case, causal):
    _, encoding, params, learned = case
    torch.manual_seed(0)
    q, k, v = rand(B, M, HQ, D, grad=True), rand(B, N, HKV, D, grad=True), rand(B, N, HKV, D, grad=True)
    fixed = {n: t for n, t in params.items() if n not in learned}

    def f(q, k, v, *ts):
        return posenc.attention(q, k, v, encoding, causal=causal, **fixed, **dict(zip(learned, ts)))

    assert torch.autograd.gradcheck(f, (q, k, v, *[params[n] for n in learned]))


def eager(q, k, v, bias, causal, q_offset, scale=None):
    """softmax(scale q kᵀ + bias + mask) v for q [B, M, H, D], k, v with H heads; bias [H, M, N]."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    logits = torch.einsum("bmhd,bnhd->bhmn", q, k) * scale + bias
    if causal:
        qp = q_offset + torch.arange(q.shape[1])
        logits = logits.masked_fill(torch.arange(k.shape[1])[None, :] > qp[:, None], float("-inf"))
    return torch.einsum("bhmn,bnhd->bmhd", logits.softmax(-1), v), torch.logsumexp(logits, -1)


def alibi_reference(heads, qp, kp):
    slopes = torch.tensor([2 ** (-8 * (h + 1) / heads) for h in range(heads)], dtype=torch.float64)
    return -slopes[:, None, None] * (qp[:, None] - kp[None, :]).abs()[None].to(torch.float64)


def t5_bucket(rel, num_buckets, max_distance):
    """Mesh TensorFlow's _relative_position_bucket, bidirectional, as transformers writes it."""
    num_buckets //= 2
    ret = (rel > 0).long() * num_buckets
    n = rel.abs()
    max_exact = num_buckets // 2
    large = max_exact + (torch.log(n.double() / max_exact) / math.log(max_distance / max_exact)
                         * (num_buckets - max_exact)).long()
    large = torch.clamp(large, max=num_buckets - 1)
    return ret + torch.where(n < max_exact, n, large)


def test_alibi_matches_eager_with_gqa_and_lse():
    q, k, v = rand(2, 5, 8, 16), rand(2, 7, 2, 16), rand(2, 7, 2, 16)
    out, lse = posenc.attention(q, k, v, "alibi", causal=True, return_lse=True)
    bias = alibi_reference(8, 2 + torch.arange(5), torch.arange(7))
    want, want_lse = eager(q, k.repeat_interleave(4, 2), v.repeat_interleave(4, 2), bias, True, 2)
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(lse, want_lse, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(posenc.bias("alibi", 8, 5, 7), bias, rtol=1e-14, atol=1e-14)


@pytest.mark.parametrize("case", cases(), ids=lambda c: c[0])
def test_inference_path_equals_the_autograd_path(case):
    """Without anything to differentiate posenc.attention calls the kernel directly (no autograd node):
    the same out and lse as the differentiable path, bit for bit, and lse only when asked."""
    _, encoding, params, _ = case
    q, k, v = rand(B, M, HQ, D, grad=True), rand(B, N, HKV, D), rand(B, N, HKV, D)
    out, lse = posenc.attention(q, k, v, encoding, causal=True, return_lse=True, **params)
    assert out.grad_fn is not None
    with torch.no_grad():
        out2, lse2 = posenc.attention(q, k, v, encoding, causal=True, return_lse=True, **params)
        out3 = posenc.attention(q, k, v, encoding, causal=True, **params)
    assert out2.grad_fn is None and isinstance(out3, torch.Tensor)
    assert torch.equal(out.detach(), out2) and torch.equal(lse, lse2) and torch.equal(out2, out3)


def test_t5_matches_eager_with_offsets():
    nb, md = 16, 128
    w = rand(nb, 4)
    q, k, v = rand(1, 40, 4, 8), rand(1, 50, 4, 8), rand(1, 50, 4, 8)
    out = posenc.attention(q, k, v, "t5", weights=w, num_buckets=nb, max_distance=md, q_offset=70, k_offset=3)
    rel = (3 + torch.arange(50))[None, :] - (70 + torch.arange(40))[:, None]
    bias = w[t5_bucket(rel, nb, md)].permute(2, 0, 1)
    torch.testing.assert_close(out, eager(q, k, v, bias, False, 70)[0], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(posenc.bias("t5", 4, 40, 50, q_offset=70, k_offset=3, weights=w, num_buckets=nb,
                                           max_distance=md), bias, rtol=0, atol=0)


def cope_reference(q, k, v, table, scale):
    """CoPE (Golovneva et al. 2024), causal, as the paper's code computes it, per head."""
    logits = torch.einsum("bmhd,bnhd->bhmn", q, k) * scale
    mask = torch.ones(q.shape[1], k.shape[1], dtype=torch.bool).tril()
    logits = logits.masked_fill(~mask, float("-inf"))
    gates = torch.sigmoid(logits)
    pos = gates.flip(-1).cumsum(-1).flip(-1).clamp(max=table.shape[0] - 1)
    floor, ceil = pos.floor().long(), pos.ceil().long()
    z = torch.einsum("bmhd,pd->bhmp", q, table)
    w = pos - floor
    logits = logits + z.gather(-1, ceil) * w + z.gather(-1, floor) * (1 - w)
    return torch.einsum("bhmn,bnhd->bmhd", logits.softmax(-1), v)


def test_cope_matches_the_papers_algorithm():
    q, k, v, table = rand(2, 6, 3, 8), rand(2, 6, 3, 8), rand(2, 6, 3, 8), rand(4, 8)
    out = posenc.attention(q, k, v, "cope", causal=True, table=table, scale=0.5)
    torch.testing.assert_close(out, cope_reference(q, k, v, table, 0.5), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2), (torch.float16, 4e-3)])
@pytest.mark.parametrize("encoding,params", [("nope", {}), ("rope", {}), ("alibi", {}),
                                             ("t5", {"weights": torch.randn(32, 4)})])
def test_low_precision_against_float64(encoding, params, dtype, tol):
    torch.manual_seed(1)
    q, k, v = torch.randn(2, 33, 4, 32), torch.randn(2, 40, 2, 32), torch.randn(2, 40, 2, 32)
    low = {n: t.to(dtype) for n, t in params.items()}
    want = posenc.attention(q.double(), k.double(), v.double(), encoding, causal=True,
                            **{n: t.to(dtype).double() for n, t in params.items()})
    got = posenc.attention(q.to(dtype), k.to(dtype), v.to(dtype), encoding, causal=True, **low)
    assert got.dtype == dtype
    assert (got.double() - want).abs().max().item() <= tol


def test_bf16_rate_key_reaches_the_library():
    # an unknown key would raise; what the key changes is tested in C++ (FastAttentionBf16RatePath)
    torch.manual_seed(2)
    q, k, v = (torch.randn(1, 200, 2, 64).to(torch.bfloat16) for _ in range(3))
    want = posenc.attention(q.double(), k.double(), v.double(), causal=True)
    got = posenc.attention(q, k, v, causal=True, bf16_rate=False)
    assert got.dtype == torch.bfloat16
    assert (got.double() - want).abs().max().item() <= 3e-2


def test_non_contiguous_inputs():
    q = rand(1, 4, 5, 8).transpose(1, 2)  # [B, M, H, D] viewed from [B, H, M, D]
    k, v = rand(1, 4, 6, 8).transpose(1, 2), rand(1, 4, 6, 8).transpose(1, 2)
    torch.testing.assert_close(posenc.attention(q, k, v, "alibi"),
                               posenc.attention(q.contiguous(), k.contiguous(), v.contiguous(), "alibi"), rtol=0, atol=0)


def test_low_level_entries_match_autograd():
    q, k, v = rand(1, 3, 2, 8, grad=True), rand(1, 4, 2, 8, grad=True), rand(1, 4, 2, 8, grad=True)
    w = rand(8, 2, grad=True)
    params = {"num_buckets": "8", "max_distance": "16", "causal": "true"}
    out, lse = posenc._C.attention_forward(q.detach(), k.detach(), v.detach(), "t5", params, {"weights": w.detach()})
    assert lse.dtype == torch.float64 and lse.shape == (1, 2, 3)
    auto = posenc.attention(q, k, v, "t5", causal=True, num_buckets=8, max_distance=16, weights=w)
    torch.testing.assert_close(out, auto, rtol=0, atol=0)
    dout = torch.randn_like(out)
    auto.backward(dout)
    # autograd's backward is attention_backward_saved, exactly; at this size (the reference's) it equals the
    # backward that computes the forward again, and the one from a shard's statistics agrees to rounding
    dq, dk, dv, g = posenc._C.attention_backward_saved(q.detach(), k.detach(), v.detach(), out, lse, dout, "t5",
                                                       params, {"weights": w.detach()}, ["weights"])
    for got, ref in ((dq, q.grad), (dk, k.grad), (dv, v.grad), (g["weights"], w.grad)):
        torch.testing.assert_close(got, ref, rtol=0, atol=0)
    dq, dk, dv, g = posenc._C.attention_backward(q.detach(), k.detach(), v.detach(), dout, "t5", params,
                                                 {"weights": w.detach()}, ["weights"])
    for got, ref in ((dq, q.grad), (dk, k.grad), (dv, v.grad), (g["weights"], w.grad)):
        torch.testing.assert_close(got, ref, rtol=0, atol=0)
    dq, dk, dv, g = posenc._C.attention_backward_from_stats(q.detach(), k.detach(), v.detach(), out, lse, dout, "t5",
                                                            params, {"weights": w.detach()}, ["weights"])
    for got, ref in ((dq, q.grad), (dk, k.grad), (dv, v.grad), (g["weights"], w.grad)):
        torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("encoding,params", [
    ("alibi", {"variant": "learned", "weights": rand(2, 3, grad=True)}),
    ("t5", {"num_buckets": 8, "max_distance": 16, "weights": rand(8, 3, grad=True)}),
    ("kerple", {"r1": rand(3, positive=True, grad=True), "r2": rand(3, positive=True, grad=True)}),
    ("fire", {"mlp_w1": rand(2, grad=True), "mlp_b1": rand(2, grad=True), "mlp_w2": rand(3, 2, grad=True),
              "mlp_b2": rand(3, grad=True), "c": torch.tensor([0.7], dtype=torch.float64, requires_grad=True),
              "threshold": torch.tensor([3.5], dtype=torch.float64, requires_grad=True)}),
])
def test_gradcheck_bias(encoding, params):
    names = list(params)
    learned = [n for n in names if isinstance(params[n], torch.Tensor)]
    fixed = {n: params[n] for n in names if n not in learned}
    assert torch.autograd.gradcheck(
        lambda *ts: posenc.bias(encoding, 3, 4, 5, **fixed, **dict(zip(learned, ts))), [params[n] for n in learned])


def test_bias_causal_mask_and_sandwich_formula():
    b = posenc.bias("sandwich", 2, 3, 3, causal=True, sinusoid_dim=4, base=100.0)
    d = (torch.arange(3)[:, None] - torch.arange(3)[None, :]).double()
    terms = sum(torch.cos(d / 100.0 ** (2 * kk / 4)) for kk in (1, 2)) - 2
    want = torch.stack([terms * 2 / (8 * (h + 1)) for h in range(2)])
    want = want.masked_fill(d < 0, float("-inf"))
    torch.testing.assert_close(b, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("encoding,params", [
    ("alibi", {}),
    ("rope", {"rope": {"rope_type": "dynamic", "factor": 2.0, "original_max_position": 4}}),
    ("cope", {"table": rand(4, 32)}),
    ("rope", {"rope": {"rope_type": "dynamic", "factor": 2.0, "original_max_position": 4, "seq_len": 200}}),
])
@pytest.mark.parametrize("length,dtype", [(6, torch.float64), (150, torch.float32)])
def test_autograd_backward_equals_the_library_backward(encoding, params, length, dtype):
    # the backward from the forward's kept out and lse against the library's plain backward: bit for bit at
    # the reference's size (float64); at the fused kernels' (float32), where the plain backward may take the
    # stored path (its Δ summed as Σ P·dP), within 1e-5 of the largest entry; also for cope and a RoPE
    # scheme that reads the call's own length
    q, k, v = (rand(1, length, 2, 32).to(dtype).requires_grad_() for _ in range(3))
    params = {n: t.to(dtype) if isinstance(t, torch.Tensor) else t for n, t in params.items()}
    out = posenc.attention(q, k, v, encoding, causal=True, **params)
    dout = torch.randn_like(out)
    out.backward(dout)
    texts = {"causal": "true"}
    texts.update({key: str(value) for key, value in params.get("rope", {}).items()})
    tensors = {n: t for n, t in params.items() if isinstance(t, torch.Tensor)}
    dq, dk, dv, _ = posenc._C.attention_backward(q.detach(), k.detach(), v.detach(), dout, encoding, texts, tensors, [])
    for got, ref in ((dq, q.grad), (dk, k.grad), (dv, v.grad)):
        atol = 0.0 if dtype == torch.float64 else 1e-5 * ref.abs().max().item()
        torch.testing.assert_close(got, ref, rtol=0, atol=atol)
