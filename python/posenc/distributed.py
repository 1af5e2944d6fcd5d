"""Exact context-parallel (ring) attention over torch.distributed: docs/distributed.md.

Each of the R processes of a group holds one query shard and one key/value shard of a sequence, the
r-th shard of each (queries r·Lq … (r + 1)·Lq − 1 of the whole call, keys r·Lk …). The key/value
shards travel around the ring (send to r + 1, receive from r − 1, overlapped with the compute); each
process runs posenc's fused kernel on every shard at its global offsets and merges the partial
outputs by their log-sum-exp. The backward runs each shard under the merged (out, lse) and passes the
shard's dk, dv on with it, so that each returns to its owner complete; parameter gradients (partial
sums per process) are all-reduced. The result is posenc.attention on the whole sequence.
"""
import torch
import torch.distributed as dist

from . import _C
from ._attention import kind, learned_tensors, split_params
from ._common import FLOAT_DTYPES, check_bool, check_tensor, text

# A key's CoPE position counts the gates of every later key of its row: no shard holds them all.
_UNSHARDABLE = ("cope",)


def _ring(group):
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    glob = (lambda r: r) if group is None else (lambda r: dist.get_global_rank(group, r))
    return rank, world, glob((rank + 1) % world), glob((rank - 1) % world)


def _exchange(payload, nxt, prv, group):
    """Starts sending payload to the next process and receiving the previous one's: (buffer, waits)."""
    buf = torch.empty_like(payload)
    reqs = [dist.isend(payload, nxt, group=group), dist.irecv(buf, prv, group=group)]
    return buf, reqs


def _pack(*ts):
    return torch.cat([t.reshape(-1) for t in ts])


def _unpack(flat, like):
    out, at = [], 0
    for t in like:
        out.append(flat[at:at + t.numel()].view(t.shape))
        at += t.numel()
    return out


def _check_same_shapes(q, k, world, group):
    """Every process's shards of one shape and dtype (the ring sends fixed-size buffers, and the shards'
    positions follow from Lq and Lk): one small all-gather; every process raises the same error."""
    if world == 1:
        return
    mine = torch.tensor([*q.shape, *k.shape, FLOAT_DTYPES.index(q.dtype)], dtype=torch.int64)
    every = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(every, mine, group=group)
    def described(t):  # q's shape, k's shape, the dtype
        return [list(map(int, t[:4])), list(map(int, t[4:8])), str(FLOAT_DTYPES[int(t[8])])[6:]]
    first = described(every[0])
    for r, theirs in enumerate(every):
        for name, a, b in zip(("q_shard", "k_shard", "q_shard"), first, described(theirs)):
            if a != b:
                raise ValueError(f"{name}: expected the same shape and dtype on every process of the group, got "
                                 f"{a} on rank 0 and {b} on rank {r}")


def _shard_params(params, q_off, k_off):
    p = dict(params)
    p["q_offset"], p["k_offset"] = str(q_off), str(k_off)
    return p


def _visible(causal, q_off, lq, k_off):
    """Whether any key of a shard at k_off is visible to a query of [q_off, q_off + lq)."""
    return not causal or k_off <= q_off + lq - 1


class _RingFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, cfg, names, q, k, v, *tensors):
        encoding, params, causal, group, q_base = cfg
        rank, world, nxt, prv = _ring(group)
        lq, lk = q.shape[1], k.shape[1]
        q_off = q_base + rank * lq
        tens = dict(zip(names, tensors))
        acc = torch.zeros(q.shape, dtype=torch.float64)
        lse = torch.full((q.shape[0], q.shape[2], lq), float("-inf"), dtype=torch.float64)
        kv = _pack(k, v)
        for step in range(world):
            reqs = []
            if step + 1 < world:
                nxt_kv, reqs = _exchange(kv, nxt, prv, group)
            src = (rank - step) % world
            k_s, v_s = _unpack(kv, (k, v))
            if _visible(causal, q_off, lq, src * lk):
                o_s, l_s = _C.attention_forward(q, k_s, v_s, encoding, _shard_params(params, q_off, src * lk), tens)
                new = torch.logaddexp(lse, l_s)
                # weights of the running sum and of the shard (0 where a row has seen no key yet)
                w_old = torch.where(new == float("-inf"), torch.zeros_like(new), torch.exp(lse - new))
                w_new = torch.where(l_s == float("-inf"), torch.zeros_like(new), torch.exp(l_s - new))
                acc = acc * w_old.transpose(1, 2).unsqueeze(-1) + o_s.double() * w_new.transpose(1, 2).unsqueeze(-1)
                lse = new
            for r in reqs:
                r.wait()
            if reqs:
                kv = nxt_kv
        out = acc.to(q.dtype)
        ctx.cfg, ctx.names = cfg, names
        ctx.save_for_backward(q, k, v, out, lse, *tensors)
        return out

    @staticmethod
    def backward(ctx, dout):
        encoding, params, causal, group, q_base = ctx.cfg
        q, k, v, out, lse, *tensors = ctx.saved_tensors
        names = ctx.names
        rank, world, nxt, prv = _ring(group)
        lq, lk = q.shape[1], k.shape[1]
        q_off = q_base + rank * lq
        tens = dict(zip(names, tensors))
        learned = learned_tensors(encoding)
        grad_names = [n for i, n in enumerate(names) if ctx.needs_input_grad[5 + i] and n in learned]
        dout = dout.contiguous()
        dq = torch.zeros(q.shape, dtype=torch.float64)
        grads = {n: torch.zeros(tens[n].shape, dtype=torch.float64) for n in grad_names}
        # The shard (k, v) travels with its gradient accumulators (dk, dv): after `world` hops each
        # accumulator is back at its owner with every query shard's contribution.
        dk, dv = torch.zeros_like(k), torch.zeros_like(v)
        state = _pack(k, v, dk, dv)
        for step in range(world):
            src = (rank - step) % world
            k_s, v_s, dk_s, dv_s = _unpack(state, (k, v, dk, dv))
            if _visible(causal, q_off, lq, src * lk):
                dq_s, dk_p, dv_p, g = _C.attention_backward_from_stats(
                    q, k_s, v_s, out, lse, dout, encoding, _shard_params(params, q_off, src * lk), tens, grad_names)
                dq += dq_s
                dk_s += dk_p
                dv_s += dv_p
                for n in grad_names:
                    grads[n] += g[n]
            if world > 1:
                # the last hop carries only the accumulators home
                payload = state if step + 1 < world else _pack(dk_s, dv_s)
                state_next, reqs = _exchange(payload, nxt, prv, group)
                for r in reqs:
                    r.wait()
                state = state_next
        if world > 1:
            dk, dv = _unpack(state, (dk, dv))
        else:
            dk, dv = _unpack(state, (k, v, dk, dv))[2:]
        if world > 1:  # every process's queries contribute: the sum over the group
            for n in grad_names:
                dist.all_reduce(grads[n], group=group)
        return (None, None, dq.to(q.dtype), dk, dv, *[grads[n].to(tens[n].dtype) if n in grads else None
                                                      for n in names])


def ring_attention(q_shard, k_shard, v_shard, group=None, encoding="nope", causal=True, scale=None, **params):
    """posenc.attention over a sequence split across the processes of `group` (torch.distributed).

    q_shard [B, Lq, Hq, D], k_shard, v_shard [B, Lk, Hkv, D]: the r-th shards of the whole call's
    queries and keys (r = this process's rank in the group; every process the same Lq, Lk). Positions
    as posenc.attention on the whole sequence (N = R·Lk keys from 0, M = R·Lq queries from N − M):
    query i of shard r at N − M + r·Lq + i, key j at r·Lk + j. params: posenc.attention's (the
    encoding's keys and tensors, rope={...}); the learned tensors must be the same on every process,
    and their gradients come back summed over the group (the gradient of the sum of the processes'
    losses, already reduced: do not all-reduce them again). Differentiable in q, k, v and the learned
    tensors. Every encoding whose keys can be sharded: cope (ValueError), positions tensors
    (q_positions, k_positions: ValueError) are not.
    """
    for name, t in (("q_shard", q_shard), ("k_shard", k_shard), ("v_shard", v_shard)):
        check_tensor(name, t)
    if not isinstance(encoding, str):
        raise TypeError(f"encoding: expected a name (str), got {type(encoding).__name__}")
    if encoding in _UNSHARDABLE:
        raise ValueError(f"encoding: {encoding} cannot be split over its keys: the position of a key counts the "
                         "gates of every later key of the row, so no shard sees what its logits need")
    for name in ("q_positions", "k_positions", "q_offset", "k_offset"):
        if name in params:
            raise ValueError(f"{name}: ring_attention places the shards itself (query r·Lq + i, key r·Lk + j of "
                             f"the whole sequence); it takes no {name}")
    if q_shard.dim() != 4 or k_shard.dim() != 4 or v_shard.dim() != 4:
        raise ValueError("q_shard, k_shard, v_shard: expected 4 dimensions [B, L, H, D]")
    if k_shard.shape != v_shard.shape:
        raise ValueError(f"v_shard: expected k_shard's shape {tuple(k_shard.shape)}, got {tuple(v_shard.shape)}")
    for name, t in (("k_shard", k_shard), ("v_shard", v_shard)):  # before the shards are packed together
        if t.dtype != q_shard.dtype:
            raise ValueError(f"{name}: expected {str(q_shard.dtype)[6:]} like q_shard, got {str(t.dtype)[6:]}")
    check_bool("causal", causal)
    world = dist.get_world_size(group)
    _check_same_shapes(q_shard, k_shard, world, group)
    lq, lk = q_shard.shape[1], k_shard.shape[1]
    m, n = world * lq, world * lk
    if kind(encoding) == "rotary":  # a length-reading RoPE scheme sees the whole sequence's length
        rope = dict(params.get("rope", {}))
        if rope.get("rope_type", "default") in ("dynamic", "longrope") and "seq_len" not in rope:
            rope["seq_len"] = n  # the whole call's largest position + 1
            params = {**params, "rope": rope}
    texts, tensors = split_params(encoding, params)
    texts["causal"] = text("causal", causal)
    if scale is not None:
        texts["scale"] = text("scale", scale)
    names = list(tensors)
    cfg = (encoding, texts, bool(causal), group, n - m)
    q, k, v = (t.contiguous() for t in (q_shard, k_shard, v_shard))
    return _RingFn.apply(cfg, names, q, k, v, *[tensors[nm] for nm in names])
