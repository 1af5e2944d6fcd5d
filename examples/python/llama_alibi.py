"""Llama-3.1's RoPE (read from its config.json) on q and k, a causal ALiBi attention, and its backward."""
import pathlib, sys, torch, posenc
config = sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parents[2] / "tests/data/rope/llama-3.1-8b.json"
q = torch.randn(2, 16, 8, 128, requires_grad=True)  # [B, L, Hq, D]
k, v = (torch.randn(2, 16, 2, 128, requires_grad=True) for _ in range(2))  # [B, L, Hkv, D]: grouped heads
q_rot, k_rot = posenc.rope_qk(q, k, config=config)  # rope_scaling llama3, theta 500000, layout half
out = posenc.attention(q_rot, k_rot, v, "alibi", causal=True)
out.square().sum().backward()
print(f"out {tuple(out.shape)} |dq| {q.grad.norm():.4f} |dk| {k.grad.norm():.4f} |dv| {v.grad.norm():.4f}")
