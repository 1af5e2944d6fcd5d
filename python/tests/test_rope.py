"""posenc.rope, rope_qk, rope_config and sinusoidal against torch code written here, and gradcheck."""
import math
import pathlib

import pytest
import torch

import posenc

DATA = pathlib.Path(__file__).resolve().parents[2] / "tests" / "data" / "rope"


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def hf_rope(x, pos, inv_freq, attention_factor=1.0):
    """transformers' apply_rotary_pos_emb (rotate_half) in float64 for x [B, L, H, D]."""
    freqs = pos.to(torch.float64)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos() * attention_factor, emb.sin() * attention_factor
    return x * cos[None, :, None, :] + rotate_half(x) * sin[None, :, None, :]


def default_inv_freq(theta, dim):
    return 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)


def test_half_layout_matches_rotate_half():
    x = torch.randn(2, 7, 3, 16, dtype=torch.float64)
    got = posenc.rope(x, theta=500.0)
    want = hf_rope(x, torch.arange(7), default_inv_freq(500.0, 16))
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_interleaved_layout_matches_complex_form():
    x = torch.randn(1, 5, 2, 8, dtype=torch.float64)
    pos = torch.tensor([3, 0, 9, 4, 100])
    got = posenc.rope(x, pos, layout="interleaved", offset=2)
    angles = (pos + 2).to(torch.float64)[:, None] * default_inv_freq(10000.0, 8)[None, :]
    xc = torch.view_as_complex(x.reshape(1, 5, 2, 4, 2).contiguous())
    want = torch.view_as_real(xc * torch.polar(torch.ones_like(angles), angles)[None, :, None, :]).reshape(x.shape)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_partial_rotary_dim_leaves_the_rest():
    x = torch.randn(1, 4, 2, 12, dtype=torch.float64)
    got = posenc.rope(x, rotary_dim=8)
    torch.testing.assert_close(got[..., :8], hf_rope(x[..., :8], torch.arange(4), default_inv_freq(1e4, 8)))
    assert torch.equal(got[..., 8:], x[..., 8:])


def test_rope_qk_equals_two_ropes_and_inplace():
    q = torch.randn(2, 6, 4, 8, dtype=torch.float32)
    k = torch.randn(2, 6, 2, 8, dtype=torch.float32)
    pos = torch.randint(0, 50, (2, 6))
    qr, kr = posenc.rope_qk(q, k, pos, theta=100.0)
    torch.testing.assert_close(qr, posenc.rope(q, pos, theta=100.0), rtol=0, atol=0)
    torch.testing.assert_close(kr, posenc.rope(k, pos, theta=100.0), rtol=0, atol=0)
    q2 = q.clone()
    out = posenc.rope(q2, pos, theta=100.0, inplace=True)
    assert out.data_ptr() == q2.data_ptr()
    torch.testing.assert_close(q2, qr, rtol=0, atol=0)


def test_non_contiguous_input():
    base = torch.randn(2, 3, 5, 8, dtype=torch.float64)  # [B, H, L, D]
    x = base.transpose(1, 2)  # [B, L, H, D] with strides
    assert not x.is_contiguous()
    torch.testing.assert_close(posenc.rope(x), posenc.rope(x.contiguous()), rtol=0, atol=0)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2), (torch.float16, 2e-3)])
def test_low_precision_against_float64(dtype, tol):
    x = torch.randn(2, 9, 3, 32, dtype=torch.float64)
    want = posenc.rope(x, theta=10000.0)
    got = posenc.rope(x.to(dtype), theta=10000.0)
    assert got.dtype == dtype
    err = (got.double() - want).abs().max().item()
    assert err <= tol * x.abs().max().item(), err


@pytest.mark.parametrize("layout,rotary_dim", [("half", None), ("interleaved", None), ("half", 4)])
def test_gradcheck_rope(layout, rotary_dim):
    x = torch.randn(1, 3, 2, 6, dtype=torch.float64, requires_grad=True)
    pos = torch.tensor([0, 5, 2])
    assert torch.autograd.gradcheck(lambda t: posenc.rope(t, pos, layout=layout, rotary_dim=rotary_dim), (x,))


def test_gradcheck_rope_qk_with_scaling():
    q = torch.randn(1, 3, 2, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 3, 1, 8, dtype=torch.float64, requires_grad=True)
    scaling = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}
    assert torch.autograd.gradcheck(lambda a, b: posenc.rope_qk(a, b, scaling=scaling, theta=100.0), (q, k))


def llama3_inv_freq(theta, dim, factor, low, high, old_len):
    """transformers' _compute_llama3_parameters in float64."""
    inv_freq = default_inv_freq(theta, dim)
    wavelen = 2 * math.pi / inv_freq
    low_wl, high_wl = old_len / low, old_len / high
    scaled = torch.where(wavelen > low_wl, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wl) & ~(wavelen > low_wl)
    return torch.where(medium, smoothed, scaled)


def yarn_inv_freq(theta, dim, factor, old_len, beta_fast=32.0, beta_slow=1.0):
    """transformers' _compute_yarn_parameters (truncate) in float64, and the attention factor."""
    def corr_dim(rot):
        return dim * math.log(old_len / (rot * 2 * math.pi)) / (2 * math.log(theta))
    low, high = max(math.floor(corr_dim(beta_fast)), 0), min(math.ceil(corr_dim(beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extra = 1 - ramp
    pos_freqs = theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    inv = (1 / (factor * pos_freqs)) * (1 - extra) + (1 / pos_freqs) * extra
    return inv, 0.1 * math.log(factor) + 1.0


def test_llama31_config():
    cfg = posenc.rope_config(DATA / "llama-3.1-8b.json")
    want = llama3_inv_freq(500000.0, 128, 8.0, 1.0, 4.0, 8192)
    assert cfg["rope_type"] == "llama3" and cfg["head_dim"] == 128 and cfg["layout"] == "half"
    torch.testing.assert_close(cfg["inv_freq"], want, rtol=1e-13, atol=0)
    x = torch.randn(1, 6, 2, 128, dtype=torch.float64)
    pos = torch.tensor([0, 1, 7, 100, 5000, 131000])
    torch.testing.assert_close(posenc.rope(x, pos, config=str(DATA / "llama-3.1-8b.json")), hf_rope(x, pos, want),
                               rtol=1e-9, atol=1e-9)


def test_qwen2_yarn_config_as_dict():
    import json
    config = json.loads((DATA / "qwen2.5-7b-instruct-yarn.json").read_text())
    inv, attention_factor = yarn_inv_freq(1e6, 3584 // 28, 4.0, 32768)
    cfg = posenc.rope_config(config)
    torch.testing.assert_close(cfg["inv_freq"], inv, rtol=1e-12, atol=0)
    assert cfg["attention_factor"] == pytest.approx(attention_factor, rel=1e-14)
    x = torch.randn(1, 4, 1, 128, dtype=torch.float64)
    pos = torch.tensor([0, 3, 40000, 120000])
    torch.testing.assert_close(posenc.rope(x, pos, config=config), hf_rope(x, pos, inv, attention_factor),
                               rtol=1e-9, atol=1e-9)


def sinusoid(pos, dim, base=10000.0):
    i = torch.arange(0, dim, 2, dtype=torch.float64)
    ang = pos.to(torch.float64)[:, None] / base ** (i / dim)[None, :]
    return torch.stack((ang.sin(), ang.cos()), dim=-1).reshape(len(pos), dim)


def test_sinusoidal_adds_the_table():
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    torch.testing.assert_close(posenc.sinusoidal(x, offset=3, base=100.0), x + sinusoid(torch.arange(3, 8), 8, 100.0))
    pos = torch.tensor([4, 0, 2, 2, 9], dtype=torch.int32)
    torch.testing.assert_close(posenc.sinusoidal(x, pos), x + sinusoid(pos, 8))


def test_gradcheck_sinusoidal():
    x = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: posenc.sinusoidal(t, offset=1), (x,))


def test_scaling_dict_equals_the_config_it_comes_from():
    x = torch.randn(1, 5, 2, 128, dtype=torch.float64)
    pos = torch.tensor([0, 9, 4000, 9000, 70000])
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
    torch.testing.assert_close(posenc.rope(x, pos, theta=500000.0, scaling=scaling),
                               hf_rope(x, pos, llama3_inv_freq(500000.0, 128, 8.0, 1.0, 4.0, 8192)), rtol=1e-9, atol=1e-9)
