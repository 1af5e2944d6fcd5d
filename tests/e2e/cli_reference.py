"""numpy references for the posenc command's end-to-end tests (test_cli*.py), written here from the
formulas in include/posenc/*.h: the sinusoid, RoPE in both layouts, ALiBi's slopes and variants, T5's
buckets (float32 log, as Mesh TensorFlow and Hugging Face), KERPLE, Sandwich, FIRE and attention with
every one of them, in float64."""
import math

from harness import skip

try:
    import numpy as np
except ImportError:
    skip("numpy is not importable by this python")

RNG = np.random.default_rng(20240607)


def sinusoid(pos, D, base=10000.0):
    pos = np.asarray(pos, dtype=np.float64)
    i = np.arange(D // 2)
    ang = pos[..., None] / base ** (2.0 * i / D)
    pe = np.zeros(pos.shape + (D,))
    pe[..., 0::2] = np.sin(ang)
    pe[..., 1::2] = np.cos(ang)
    return pe


def expand_pos(pos, B, L):
    pos = np.asarray(pos, dtype=np.int64)
    return np.broadcast_to(pos, (B, L)) if pos.ndim == 1 else pos


def rope(x, pos, theta=10000.0, r=0, layout="half"):
    """x [B, L, H, D]; pos [B, L] (or [L], or [L] per sequence shared)."""
    x = np.asarray(x, dtype=np.float64)
    B, L, H, D = x.shape
    r = r or D
    pos = expand_pos(pos, B, L).astype(np.float64)
    k = np.arange(r // 2)
    ang = pos[..., None] * theta ** (-2.0 * k / r)  # [B, L, r/2]
    c, s = np.cos(ang)[:, :, None, :], np.sin(ang)[:, :, None, :]
    a, b = (2 * k, 2 * k + 1) if layout == "interleaved" else (k, k + r // 2)
    y = x.copy()
    y[..., a] = x[..., a] * c - x[..., b] * s
    y[..., b] = x[..., a] * s + x[..., b] * c
    return y


def alibi_slopes(n):
    """The ALiBi authors' get_slopes (github.com/ofirpress/attention_with_linear_biases)."""
    def pow2(n):
        start = 2 ** (-2 ** -(math.log2(n) - 3))
        return [start * start ** i for i in range(n)]
    if math.log2(n).is_integer():
        return pow2(n)
    c = 2 ** math.floor(math.log2(n))
    return pow2(c) + alibi_slopes(2 * c)[0::2][:n - c]


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def rel(M, N, qo, ko):
    """key − query, [M, N]."""
    return (ko + np.arange(N))[None, :] - (qo + np.arange(M))[:, None]


def alibi_bias(variant, H, M, N, qo=None, ko=0, slopes=None, w=None):
    qo = ko + N - M if qo is None else qo  # attention's alignment: the last M of N positions
    r = rel(M, N, qo, ko).astype(np.float64)
    if variant == "learned":
        past, fut = sigmoid(w[0])[:, None, None], sigmoid(w[1])[:, None, None]
        return np.where(r < 0, past * r, np.where(r > 0, -fut * r, 0.0))
    if variant == "symmetric":
        m = np.asarray(slopes if slopes is not None else alibi_slopes(H))[:, None, None]
        return -m * np.abs(r)[None]
    m = np.asarray(slopes if slopes is not None else alibi_slopes(H // 2) * 2)[:, None, None]
    b = -m * np.abs(r)[None]
    past = np.arange(H)[:, None, None] < H // 2
    allowed = (r == 0) | ((r < 0) & past) | ((r > 0) & ~past)
    return np.where(allowed, b, -np.inf)


def alibi_learned_dw(dB, H, M, N, qo, ko, w):
    r = rel(M, N, qo, ko).astype(np.float64)
    past = (dB * np.where(r < 0, -r, 0)).sum(axis=(1, 2))
    fut = (dB * np.where(r > 0, r, 0)).sum(axis=(1, 2))
    s0, s1 = sigmoid(w[0]), sigmoid(w[1])
    return np.stack([-s0 * (1 - s0) * past, -s1 * (1 - s1) * fut])


def t5_buckets(r, bidirectional=True, num_buckets=32, max_distance=128):
    """Hugging Face T5Attention._relative_position_bucket in numpy, the log term in float32."""
    r = np.asarray(r, dtype=np.int64)
    out = np.zeros_like(r)
    nb = num_buckets
    if bidirectional:
        nb //= 2
        out += (r > 0).astype(np.int64) * nb
        n = np.abs(r)
    else:
        n = -np.minimum(r, 0)
    max_exact = nb // 2
    with np.errstate(divide="ignore"):
        lg = np.log(n.astype(np.float32) / np.float32(max_exact))
    large = max_exact + (lg / np.float32(math.log(max_distance / max_exact)) *
                         np.float32(nb - max_exact)).astype(np.float32)
    large = np.where(n < max_exact, 0, large)  # avoid casting -inf
    large = np.minimum(large.astype(np.int64), nb - 1)
    return out + np.where(n < max_exact, n, large)


def t5_bias(W, M, N, qo=None, ko=0, **p):
    qo = ko + N - M if qo is None else qo  # attention's alignment: the last M of N positions
    bk = t5_buckets(rel(M, N, qo, ko), **p)  # [M, N]
    return np.transpose(W[bk], (2, 0, 1))    # [H, M, N]


def kerple_bias(r1, r2, M, N, qo=None, ko=0, kernel="log"):
    """KERPLE (Chi et al. 2022): −r1·log(1 + r2|m−n|) or −r1·|m−n|^r2, [H, M, N]."""
    qo = ko + N - M if qo is None else qo  # attention's alignment: the last M of N positions
    d = np.abs(rel(M, N, qo, ko)).astype(np.float64)[None]
    r1, r2 = np.asarray(r1, np.float64)[:, None, None], np.asarray(r2, np.float64)[:, None, None]
    return -r1 * (d ** r2) if kernel == "power" else -r1 * np.log(1 + r2 * d)


def sandwich_bias(H, M, N, qo=None, ko=0, sinusoid_dim=128, base=10000.0):
    """Sandwich (Chi et al. 2023): (p_mᵀp_n − d/2)·H/(8(h+1)), p the sinusoid of frequencies base^(−2k/d), k = 1…d/2."""
    qo = ko + N - M if qo is None else qo  # attention's alignment: the last M of N positions
    qp, kp = qo + np.arange(M), ko + np.arange(N)
    w = base ** (-2.0 * np.arange(1, sinusoid_dim // 2 + 1) / sinusoid_dim)
    def emb(pos):
        e = np.zeros((len(pos), sinusoid_dim))
        e[:, 0::2] = np.sin(pos[:, None] * w)
        e[:, 1::2] = np.cos(pos[:, None] * w)
        return e
    ip = emb(qp) @ emb(kp).T - sinusoid_dim / 2
    return np.stack([ip * H / (8.0 * (h + 1)) for h in range(H)])


def fire_bias(mlp_w1, mlp_b1, mlp_w2, mlp_b2, c, threshold, M, N, qo=None, ko=0):
    """FIRE (Li et al. 2023): f(log(c|i−j| + 1)/log(c·max(L, i) + 1)), f = w2·relu(w1 x + b1) + b2, [H, M, N]."""
    qo = ko + N - M if qo is None else qo  # attention's alignment: the last M of N positions
    qp = (qo + np.arange(M)).astype(np.float64)
    d = np.abs(rel(M, N, qo, ko)).astype(np.float64)
    c, L = float(np.asarray(c).reshape(-1)[0]), float(np.asarray(threshold).reshape(-1)[0])
    x = np.log(c * d + 1) / np.log(c * np.maximum(L, qp) + 1)[:, None]
    hid = np.maximum(x[..., None] * np.asarray(mlp_w1, np.float64) + np.asarray(mlp_b1, np.float64), 0.0)
    return np.einsum("mnk,hk->hmn", hid, np.asarray(mlp_w2, np.float64)) + np.asarray(mlp_b2, np.float64)[:, None, None]


def softmax_rows(logits):
    """Softmax over the last axis; a row with every entry −inf gives zeros."""
    mx = np.max(logits, axis=-1, keepdims=True)
    mx = np.where(np.isfinite(mx), mx, 0.0)
    e = np.exp(logits - mx)
    s = e.sum(axis=-1, keepdims=True)
    return np.where(s > 0, e / np.where(s > 0, s, 1.0), 0.0)


def attention(enc, q, k, v, causal=False, scale=None, q_offset=None, k_offset=0, theta=10000.0,
              rotary_dim=0, layout="half", variant="symmetric", slopes=None, weights=None,
              bidirectional=True, num_buckets=32, max_distance=128, u=None, v_bias=None, rel_proj=None,
              table=None, kernel="log", r1=None, r2=None, sinusoid_dim=128, base=10000.0, mlp_w1=None,
              mlp_b1=None, mlp_w2=None, mlp_b2=None, c=None, threshold=None, lse=False):
    q, k, v = (np.asarray(t, dtype=np.float64) for t in (q, k, v))
    B, M, Hq, D = q.shape
    N, Hkv = k.shape[1], k.shape[2]
    g = Hq // Hkv
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    q_offset = k_offset + N - M if q_offset is None else q_offset
    qpos, kpos = q_offset + np.arange(M), k_offset + np.arange(N)
    if enc == "rope":
        q = rope(q, qpos, theta, rotary_dim, layout)
        k = rope(k, kpos, theta, rotary_dim, layout)
    kk, vv = np.repeat(k, g, axis=2), np.repeat(v, g, axis=2)  # query head h reads kv head h // g
    dots = np.einsum("bmhd,bnhd->bhmn", q, kk)
    mask = np.where(kpos[None, :] > qpos[:, None], -np.inf, 0.0) if causal else np.zeros((M, N))
    if enc == "xl":
        delta = qpos[:, None] - kpos[None, :]             # query − key
        R = rel_proj.shape[2]
        s = sinusoid(delta, R)                            # [M, N, R]
        r = np.einsum("hdr,mnr->hmnd", rel_proj, s)       # r_h(δ) [Hq, M, N, D]
        content = np.einsum("bmhd,bnhd->bhmn", q + u[None, None], kk)
        position = np.einsum("bmhd,hmnd->bhmn", q + v_bias[None, None], r)
        logits = (content + position) * scale + mask
    elif enc == "cope":
        a = scale * dots + mask
        gate = np.where(np.isinf(a), 0.0, sigmoid(np.where(np.isinf(a), 0.0, a)))
        p = np.minimum(np.cumsum(gate[..., ::-1], axis=-1)[..., ::-1], table.shape[0] - 1)
        lo = np.floor(p).astype(np.int64)
        hi = np.ceil(p).astype(np.int64)
        frac = p - lo
        qe = np.einsum("bmhd,pd->bhmp", q, table)         # q_i · e[p] for every p
        z = (1 - frac) * np.take_along_axis(qe, lo, axis=-1) + frac * np.take_along_axis(qe, hi, axis=-1)
        logits = a + z
    else:
        logits = scale * dots + mask
        if enc == "alibi":
            logits = logits + alibi_bias(variant, Hq, M, N, q_offset, k_offset, slopes, weights)[None]
        elif enc == "t5":
            logits = logits + t5_bias(weights, M, N, q_offset, k_offset, bidirectional=bidirectional,
                                      num_buckets=num_buckets, max_distance=max_distance)[None]
        elif enc == "kerple":
            logits = logits + kerple_bias(r1, r2, M, N, q_offset, k_offset, kernel)[None]
        elif enc == "sandwich":
            logits = logits + sandwich_bias(Hq, M, N, q_offset, k_offset, sinusoid_dim, base)[None]
        elif enc == "fire":
            logits = logits + fire_bias(mlp_w1, mlp_b1, mlp_w2, mlp_b2, c, threshold, M, N, q_offset, k_offset)[None]
    pr = softmax_rows(logits)
    out = np.einsum("bhmn,bnhd->bmhd", pr, vv)
    if lse:
        with np.errstate(divide="ignore"):
            mx = np.max(logits, axis=-1)
            safe = np.where(np.isfinite(mx), mx, 0.0)
            return out, np.log(np.exp(logits - safe[..., None]).sum(-1)) + safe
    return out


def randn(*shape, dtype=np.float64):
    return RNG.standard_normal(shape).astype(dtype)


# A .npy file written byte by byte: the header dict as given, padded to 64 bytes, then data_bytes.
def write_raw_npy(path, header_dict, data_bytes, version=(1, 0)):
    h = header_dict.encode("latin1")
    pre = 10 if version == (1, 0) else 12
    h = h + b" " * ((64 - (pre + len(h) + 1) % 64) % 64) + b"\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY" + bytes(version))
        f.write(len(h).to_bytes(2 if version == (1, 0) else 4, "little"))
        f.write(h)
        f.write(data_bytes)
