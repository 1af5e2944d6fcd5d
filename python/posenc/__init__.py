"""posenc: the positional encodings of transformers for PyTorch CPU tensors, with autograd.

Tensors use flash-attn's layout [B, L, H, D]. See docs/python.md.
"""
from . import _C
from ._attention import attention, bias
from ._common import check_int as _check_int
from ._rope import rope, rope_config, rope_qk, sinusoidal

__version__ = _C.version()

__all__ = ["attention", "bias", "encodings", "get_num_threads", "rope", "rope_config", "rope_qk",
           "set_num_threads", "sinusoidal"]


def encodings():
    """The registry's encoding names ("nope", "learned", "sinusoidal", "rope", "alibi", ...)."""
    return [e["name"] for e in _C.registry()]


def set_num_threads(n):
    """Threads of posenc's kernels: n >= 1 sets the count, n <= 0 restores OpenMP's default."""
    _check_int("n", n)
    if int(n) >= 2 ** 31:
        raise ValueError(f"n: expected a thread count below 2^31, got {int(n)}")
    _C.set_num_threads(max(int(n), 0))


def get_num_threads():
    """The thread count posenc's kernels use now."""
    return _C.get_num_threads()
