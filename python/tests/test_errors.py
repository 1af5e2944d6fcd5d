"""Bad arguments raise ValueError or TypeError with the library's one-line message naming the argument.

A CUDA tensor cannot be made on a machine without a GPU: the device check is exercised with tensors on
torch's `meta` device, which, like CUDA's, are not CPU tensors; it runs both in the package's Python
checks and in the extension's own (posenc._C), which the low-level entries reach directly.
"""
import math

import pytest
import torch

import posenc

Q, K = torch.randn(1, 3, 2, 8), torch.randn(1, 4, 2, 8)
META = torch.device("meta")


def raises(exc, start, f):
    with pytest.raises(exc) as info:
        f()
    message = str(info.value)
    assert "\n" not in message, message
    assert message.startswith(start), message
    return message


def test_shapes():
    raises(ValueError, "q: expected 4 dimensions", lambda: posenc.attention(Q[0], K, K))
    raises(ValueError, "weights: expected shape [32, 2]", lambda: posenc.attention(Q, K, K, "t5", weights=torch.randn(31, 2)))
    raises(ValueError, "positions: expected shape [3]", lambda: posenc.rope(Q, torch.tensor([0, 1])))
    raises(ValueError, "x: expected 3 dimensions", lambda: posenc.sinusoidal(Q))


def test_mismatched_heads():
    k = torch.randn(1, 4, 3, 8)
    raises(ValueError, "k: query heads Hq = 2 must be a multiple of key/value heads Hkv = 3",
           lambda: posenc.attention(Q, k, k))


def test_dtypes():
    raises(TypeError, "q: expected float32, float64, bfloat16 or float16, got int32", lambda: posenc.attention(Q.int(), K, K))
    raises(ValueError, "k: expected float32 like q, got float64", lambda: posenc.attention(Q, K.double(), K))
    raises(TypeError, "positions: expected int32 or int64", lambda: posenc.rope(Q, torch.tensor([0.5, 1, 2])))
    raises(TypeError, "x: expected a torch.Tensor, got str", lambda: posenc.rope("x"))
    raises(TypeError, "q: expected float32", lambda: posenc._C.attention_forward(Q.to(torch.complex64), K, K, "nope", {}, {}))


def test_devices():
    raises(ValueError, "q: expected a CPU tensor, got one on device 'meta'", lambda: posenc.attention(Q.to(META), K, K))
    raises(ValueError, "x: expected a CPU tensor", lambda: posenc.rope(Q.to(META)))
    raises(ValueError, "slopes: expected a CPU tensor",
           lambda: posenc.attention(Q, K, K, "alibi", slopes=torch.ones(2, device=META)))
    raises(ValueError, "v: expected a CPU tensor", lambda: posenc._C.attention_forward(Q, K, K.to(META), "nope", {}, {}))
    raises(ValueError, "table: expected a CPU tensor",
           lambda: posenc._C.attention_forward(Q, K, K, "cope", {}, {"table": torch.ones(4, 8, device=META)}))
    raises(ValueError, "q: expected a CPU tensor", lambda: posenc._C.rope(Q.to(META), None, None, 0, {}, "", False, False))


def test_values_and_names():
    raises(ValueError, "encoding: unknown encoding 'foo'", lambda: posenc.attention(Q, K, K, "foo"))
    raises(ValueError, "bogus: unknown key for alibi", lambda: posenc.attention(Q, K, K, "alibi", bogus=3))
    raises(ValueError, "scale: expected a finite value > 0", lambda: posenc.attention(Q, K, K, scale=-1.0))
    raises(ValueError, "theta: expected a finite number", lambda: posenc.attention(Q, K, K, "rope", rope={"theta": math.nan}))
    raises(ValueError, "rotary_dim: expected an even number", lambda: posenc.rope(Q, rotary_dim=3))
    raises(ValueError, "layout: expected interleaved or half", lambda: posenc.rope(Q, layout="diag"))
    raises(ValueError, "positions: positions must be >= 0", lambda: posenc.rope(Q, torch.tensor([0, 1, -5])))
    raises(ValueError, "scaling.factr: not a rope_scaling field", lambda: posenc.rope(Q, scaling={"factr": 8}))
    raises(ValueError, "r2: expected a finite value > 0",
           lambda: posenc.bias("kerple", 2, 3, 3, r1=torch.ones(2), r2=-torch.ones(2)))
    raises(ValueError, "encoding: 'rope' has no position-only bias", lambda: posenc.bias("rope", 2, 3, 3))
    raises(TypeError, "causal: expected a bool", lambda: posenc.attention(Q, K, K, causal="yes"))
    raises(TypeError, "bf16_rate: expected a bool", lambda: posenc.attention(Q, K, K, bf16_rate=1))
    raises(TypeError, "n: expected an integer", lambda: posenc.set_num_threads("a"))
    raises(ValueError, "n: expected a thread count below 2^31", lambda: posenc.set_num_threads(2 ** 31))
    raises(ValueError, "offset: expected an integer within int64", lambda: posenc.rope(Q, offset=2 ** 64))
    raises(ValueError, "k_offset: expected an integer within int64", lambda: posenc.bias("alibi", 2, 3, 3, k_offset=-2 ** 63 - 1))
    # every bool argument is a bool (1, "no" would read as true)
    raises(TypeError, "causal: expected a bool", lambda: posenc.bias("alibi", 2, 3, 3, causal=1))
    raises(TypeError, "return_lse: expected a bool", lambda: posenc.attention(Q, K, K, return_lse="no"))
    raises(TypeError, "inplace: expected a bool", lambda: posenc.rope(Q, inplace="no"))
    raises(TypeError, "inplace: expected a bool", lambda: posenc.rope_qk(Q, Q, inplace=0))
    # rope(x) names x
    raises(ValueError, "x: expected 4 dimensions", lambda: posenc.rope(Q[0]))
    # the attention's own keys given to bias would be ignored: refused
    for name in ("q-offset", "scale", "keys_rotated", "bf16_rate"):
        raises(ValueError, f"{name.replace('-', '_')}: unknown key for alibi, expected one of: variant",
               lambda: posenc.bias("alibi", 1, 2, 2, **{name: 1.0}))


def test_config_errors():
    bad = {"rope_theta": 1e4, "head_dim": 8, "rope_scaling": {"rope_type": "linear", "factor": -1}}
    raises(ValueError, "config: rope_scaling.factor: expected a number > 0", lambda: posenc.rope(Q, config=bad))
    raises(ValueError, "config: cannot read /nonexistent/config.json", lambda: posenc.rope_config("/nonexistent/config.json"))
    raises(ValueError, "config: head_dim 16 does not match", lambda: posenc.rope(Q, config={"rope_theta": 1e4, "head_dim": 16}))
    raises(ValueError, "theta: given with config", lambda: posenc.rope(Q, theta=5.0, config={"rope_theta": 1e4}))
    raises(TypeError, "config: expected a dict or the path", lambda: posenc.rope_config(3))
    raises(ValueError, "config: rope_scaling.factor: expected a number > 0", lambda: posenc.rope_config(bad))
    raises(ValueError, "config: not valid JSON", lambda: posenc.rope(Q, config=__file__))  # not "config: config: "
    raises(ValueError, "config: expected finite numbers",
           lambda: posenc.rope(Q, config={"rope_theta": math.inf, "head_dim": 8}))


def test_empty_tensors_compute_nothing():
    out, lse = posenc.attention(Q, K[:, :0], K[:, :0], return_lse=True)
    assert torch.equal(out, torch.zeros_like(Q)) and bool((lse == -math.inf).all())
    assert posenc.rope(torch.empty(0, 3, 2, 8)).shape == (0, 3, 2, 8)
    for q, k in ((torch.empty(0, 3, 2, 8), torch.empty(0, 3, 1, 8)), (Q[:, :0], Q[:, :0]), (Q[:, :, :0], Q)):
        qr, kr = posenc.rope_qk(q, k)
        assert qr.shape == q.shape and kr.shape == k.shape and torch.equal(kr, posenc.rope(k))
    # an empty batch, with shapes a decode step takes (M ≤ 16 queries), in every dtype
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        for m in (1, 16):
            q, kv = torch.randn(0, m, 4, 8, dtype=dtype), torch.randn(0, 5, 2, 8, dtype=dtype)
            out, lse = posenc.attention(q, kv, kv, "alibi", causal=True, return_lse=True)
            assert out.shape == q.shape and lse.shape == (0, 4, m)


def test_bias_given_slopes_take_no_gradient():
    """alibi's given slopes have no gradient: a backward through them leaves .grad None (no error)."""
    slopes = torch.rand(4, requires_grad=True)
    b = posenc.bias("alibi", 4, 3, 3, slopes=slopes)
    b.sum().backward()
    assert slopes.grad is None
    w = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)  # learned weights still get theirs
    posenc.bias("alibi", 4, 3, 3, variant="learned", weights=w).sum().backward()
    assert w.grad is not None and w.grad.shape == w.shape
