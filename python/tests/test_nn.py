"""posenc.nn: RotaryEmbedding against the rotation written here, Attention's parameters and their
initialisation, and a 2-layer model trained 200 steps with posenc.nn.Attention(encoding="alibi")
against the same model in eager torch (ALiBi's bias materialised, softmax attention written here)
from the same initialisation: the losses agree within 1e-3 at every step in float32."""
import math

import pytest
import torch
from torch import nn

import posenc
import posenc.nn as pnn


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def test_rotary_embedding_matches_rotate_half():
    B, L, H, D = 2, 7, 3, 16
    q, k = torch.randn(B, L, H, D, dtype=torch.float64), torch.randn(B, L, 1, D, dtype=torch.float64)
    inv = 1.0 / 500.0 ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
    pos = torch.arange(L, dtype=torch.float64) + 5
    ang = torch.cat([pos[:, None] * inv[None, :]] * 2, dim=-1)[None, :, None, :]
    want_q = q * ang.cos() + rotate_half(q) * ang.sin()
    want_k = k * ang.cos() + rotate_half(k) * ang.sin()
    got_q, got_k = pnn.RotaryEmbedding(D, theta=500.0)(q, k, offset=5)
    torch.testing.assert_close(got_q, want_q, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got_k, want_k, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="head dim"):
        pnn.RotaryEmbedding(8)(q, k)


def test_attention_parameters_and_initialisation():
    H, D = 4, 8
    torch.manual_seed(0)
    names = lambda m: sorted(n for n, _ in m.named_parameters())
    assert names(pnn.Attention(H, D, "alibi")) == []
    learned = pnn.Attention(H, D, "alibi", variant="learned")
    assert names(learned) == ["weights"] and torch.equal(learned.weights, torch.zeros(2, H))
    t5 = pnn.Attention(H, D, "t5", num_buckets=64)
    assert t5.weights.shape == (64, H) and 0.05 < t5.weights.std().item() < 0.15
    xl = pnn.Attention(H, D, "xl", rel_dim=6)
    assert names(xl) == ["rel_proj", "u", "v_bias"] and xl.rel_proj.shape == (H, D, 6)
    assert torch.equal(xl.u, torch.zeros(H, D))
    ker = pnn.Attention(H, D, "kerple")
    torch.testing.assert_close(ker.r1, torch.tensor([0.25, 0.5, 0.75, 1.0]))
    torch.testing.assert_close(ker.r2, torch.tensor([0.5, 1.0, 1.5, 2.0]))
    fire = pnn.Attention(H, D, "fire", max_len=100, fire_width=16)
    assert fire.mlp_w1.shape == (16,) and fire.mlp_w2.shape == (H, 16)
    assert fire.c.item() == pytest.approx(0.1) and fire.threshold.item() == 100.0
    assert torch.equal(fire.mlp_b2, torch.zeros(H))
    cope = pnn.Attention(H, D, "cope", max_len=10)
    assert cope.table.shape == (10, D)
    mixed = pnn.Attention(H, D, "rope2d", variant="mixed")
    # head h's frequencies point along 2π(h + ½)/H with magnitude θ^(−4j/D), θ = 10
    f = mixed.freqs.detach().double()
    for h in range(H):
        a = 2 * math.pi * (h + 0.5) / H
        torch.testing.assert_close(f[:, h, 0], torch.tensor([math.cos(a), math.sin(a)], dtype=torch.float64),
                                   rtol=1e-6, atol=1e-6)
        assert f[:, h, 1].norm().item() == pytest.approx(10 ** (-4 / D), rel=1e-6)


def test_rotary_embedding_takes_the_config_layout():
    """DeepSeek-V3's config asks for interleaved pairs: the module rotates as rope_qk(config=) does."""
    cfg = {"model_type": "deepseek_v3", "rope_theta": 1e4, "qk_rope_head_dim": 8, "hidden_size": 64,
           "num_attention_heads": 2, "max_position_embeddings": 64}
    q, k = torch.randn(1, 5, 2, 8, dtype=torch.float64), torch.randn(1, 5, 1, 8, dtype=torch.float64)
    want = posenc.rope_qk(q, k, layout="interleaved", theta=1e4)
    for got, w in zip(pnn.RotaryEmbedding(8, config=cfg)(q, k), want):
        torch.testing.assert_close(got, w, rtol=0, atol=0)
    half = pnn.RotaryEmbedding(8, config=cfg, layout="half")(q, k)[0]  # a layout given wins
    torch.testing.assert_close(half, posenc.rope_qk(q, k, theta=1e4)[0], rtol=0, atol=0)


def test_modules_check_their_arguments_when_built():
    def raises(exc, start, f):
        with pytest.raises(exc) as info:
            f()
        assert str(info.value).startswith(start) and "\n" not in str(info.value), str(info.value)
    raises(ValueError, "head_dim: expected an integer >= 1", lambda: pnn.RotaryEmbedding(0))
    raises(ValueError, "rotary_dim", lambda: pnn.RotaryEmbedding(7))
    raises(ValueError, "theta: expected a finite number > 0", lambda: pnn.RotaryEmbedding(8, theta=-1.0))
    raises(ValueError, "layout: expected interleaved or half", lambda: pnn.RotaryEmbedding(8, layout="x"))
    raises(ValueError, "scaling.bogus", lambda: pnn.RotaryEmbedding(8, scaling={"bogus": 1}))
    raises(TypeError, "config: expected a dict or the path", lambda: pnn.RotaryEmbedding(8, config=3))
    for name in ("heads", "head_dim", "max_len", "fire_width", "rel_dim"):
        args = {"heads": 2, "head_dim": 8}
        args[name] = 0
        raises(ValueError, f"{name}: expected an integer >= 1", lambda: pnn.Attention(encoding="xl", **args))
    raises(TypeError, "rel_dim: expected an integer", lambda: pnn.Attention(2, 8, "xl", rel_dim=2.5))
    raises(ValueError, "encoding: unknown encoding 'bogus'", lambda: pnn.Attention(2, 8, "bogus"))
    raises(TypeError, "encoding: expected a name", lambda: pnn.Attention(2, 8, 5))
    raises(TypeError, "causal: expected a bool", lambda: pnn.Attention(2, 8, causal="no"))
    raises(TypeError, "dtype: expected a floating torch.dtype", lambda: pnn.Attention(2, 8, dtype=torch.int32))
    raises(TypeError, "num_buckets: expected an integer", lambda: pnn.Attention(2, 8, "t5", num_buckets=3.7))
    raises(ValueError, "rotary_dim: expected a multiple of 4", lambda: pnn.Attention(2, 6, "rope2d", variant="mixed"))
    raises(ValueError, "weights: expected an initial value of shape [32, 2]",
           lambda: pnn.Attention(2, 8, "t5", weights=torch.zeros(31, 2)))
    raises(ValueError, "weights: alibi learns no such tensor", lambda: pnn.Attention(2, 8, "alibi", weights=torch.zeros(2, 2)))
    # a learned tensor given is the parameter's initial value
    init = torch.full((32, 2), 0.25)
    t5 = pnn.Attention(2, 8, "t5", weights=init)
    assert isinstance(t5.weights, nn.Parameter) and torch.equal(t5.weights.detach(), init)
    assert [n for n, _ in t5.named_buffers()] == []


def test_attention_gradients_reach_parameters():
    m = pnn.Attention(2, 8, "t5", num_buckets=8, dtype=torch.float64)
    q, k, v = (torch.randn(1, 5, 2, 8, dtype=torch.float64) for _ in range(3))
    m(q, k, v).square().sum().backward()
    assert m.weights.grad is not None and m.weights.grad.abs().sum() > 0


# ---- training parity -------------------------------------------------------------------------------
VOCAB, C, H, LAYERS, L, BATCH = 32, 32, 4, 2, 24, 8


def alibi_slopes(heads):
    """Press et al.'s slopes for a power-of-two head count: 2^(−8(h+1)/H)."""
    return torch.tensor([2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)])


def eager_alibi_attention(q, k, v):
    """softmax(q·kᵀ/√D − m_h·|i − j|, causal)·v for q, k, v [B, L, H, D], written out."""
    B, T, Hh, D = q.shape
    s = torch.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(D)
    i = torch.arange(T)
    dist = (i[:, None] - i[None, :]).abs().to(q.dtype)
    s = s - alibi_slopes(Hh).to(q.dtype)[None, :, None, None] * dist
    s = s.masked_fill(i[None, :] > i[:, None], float("-inf"))
    return torch.einsum("bhij,bjhd->bihd", torch.softmax(s, dim=-1), v)


class Block(nn.Module):
    def __init__(self, attend):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.qkv, self.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.mlp = nn.Sequential(nn.Linear(C, 4 * C), nn.GELU(), nn.Linear(4 * C, C))
        self.attend = attend

    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(B, T, 3, H, C // H).unbind(2)
        x = x + self.proj(self.attend(q, k, v).reshape(B, T, C))
        return x + self.mlp(self.ln2(x))


class TinyModel(nn.Module):
    def __init__(self, attend):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, C)
        self.blocks = nn.ModuleList([Block(attend) for _ in range(LAYERS)])
        self.head = nn.Linear(C, VOCAB)

    def forward(self, tokens):
        x = self.emb(tokens)
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def train(model, batches):
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for tokens in batches:
        logits = model(tokens[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_training_parity_alibi_float32():
    torch.manual_seed(1)
    theirs = TinyModel(pnn.Attention(H, C // H, "alibi", causal=True))
    eager = TinyModel(eager_alibi_attention)
    eager.load_state_dict(theirs.state_dict())
    gen = torch.Generator().manual_seed(2)
    # a learnable stream: each token is the previous one plus a per-sequence step, mod VOCAB
    start = torch.randint(0, VOCAB, (200, BATCH, 1), generator=gen)
    step = torch.randint(1, 4, (200, BATCH, 1), generator=gen)
    batches = list((start + step * torch.arange(L + 1)) % VOCAB)
    got, want = train(theirs, batches), train(eager, batches)
    diffs = [abs(a - b) for a, b in zip(got, want)]
    assert max(diffs) < 1e-3, f"largest loss difference {max(diffs):.3g} at step {diffs.index(max(diffs))}"
    assert want[-1] < 0.5 * want[0]  # it learned: the comparison covers a trajectory, not a plateau
