"""Resources (docs/reliability.md): sizes beyond the limits raise ValueError naming the tensor before
anything is allocated; an allocation that fails inside posenc raises MemoryError, never ends the
interpreter (an output torch cannot allocate raises MemoryError too).

Expanded tensors (stride 0) describe large shapes over a few bytes, as a caller's can. The
allocation failure is forced in child interpreters under an address-space limit (RLIMIT_AS) a few
MiB above what they hold: rope attention over 2^16 tokens needs 32 MiB of rotation tables, of which
the tighter limits leave only part.
"""
import os
import subprocess
import sys
import time

import pytest
import torch

import posenc


def test_a_tensor_beyond_the_limit_is_refused_at_once():
    row = torch.ones(1, 1, 1, 8)
    q = row.expand(1, 2**41, 1, 8)  # 2^44 elements over 32 bytes
    t = time.perf_counter()
    with pytest.raises(ValueError) as info:
        posenc._C.attention_forward(q, row, row, "nope", {}, {})
    assert time.perf_counter() - t < 0.5
    assert str(info.value) == "q: shape [1, 2199023255552, 1, 8] has more than 2^40 elements (POSENC_MAX_ELEMENTS)"


def test_a_head_dimension_beyond_the_limit_is_refused():
    x = torch.ones(1, 1, 1, 8192)
    with pytest.raises(ValueError, match=r"^q: head dimension D = 8192 is beyond the limit 4096 \(2\^12\)$"):
        posenc.attention(x, x, x)


CHILD = r"""
import resource, sys, torch, posenc
posenc.set_num_threads(1)
L, D = 2**16, 64
row = torch.full((1, 1, 1, D), 0.5)
x = row.expand(1, L, 1, D)
posenc._C.attention_forward(x[:, :8], x[:, :8], x[:, :8], "rope", {}, {})  # everything imported, warmed up
vm = int([l.split()[1] for l in open("/proc/self/status") if l.startswith("VmSize:")][0])
lim = (vm + int(sys.argv[1])) * 1024
resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
try:
    posenc._C.attention_forward(x, x, x, "rope", {}, {})
    print("ok")
except MemoryError as e:  # posenc's allocations, or torch's of the output
    print("MemoryError:", e)
"""


def test_an_allocation_failure_is_memory_error():
    seen = []
    for extra_kib in (0, 24 * 1024, 256 * 1024):
        r = subprocess.run([sys.executable, "-c", CHILD, str(extra_kib)], capture_output=True, text=True,
                           timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"))
        assert r.returncode == 0, f"extra {extra_kib} KiB: exit {r.returncode}: {r.stderr[-500:]}"
        line = r.stdout.strip()
        assert line in ("ok", "MemoryError: out of memory"), line
        seen.append(line)
    assert seen[0] == "MemoryError: out of memory", seen
    assert seen[-1] == "ok", seen
