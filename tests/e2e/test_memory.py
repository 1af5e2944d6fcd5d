#!/usr/bin/python3
"""The command when memory runs out (docs/reliability.md, Errors): one line "posenc: out of memory",
exit 1, nothing on stdout, no output file and no temporary left, and the process ends.

    /usr/bin/python3 tests/e2e/test_memory.py --posenc PATH/TO/posenc [--articles IGNORED] [-k NAME]

The failure is forced with an address-space limit (RLIMIT_AS) of 64 MiB on a rope attention over
2^16 keys (inputs of 16 MiB). Each case prints one line (PASS/FAIL); the last line is exactly
"N passed, M failed"; exit 1 if any case failed (tests/e2e/harness.py).
"""
import glob
import os
import resource
import subprocess
import sys

from harness import POSENC, case, main, skip

try:
    import numpy as np
except ImportError:
    skip("numpy is not importable by this python")

# AddressSanitizer reserves terabytes of address space for its shadow: no RLIMIT_AS fits it.
with open(POSENC, "rb") as f:
    if b"__asan_init" in f.read():
        skip("an AddressSanitizer build cannot run under an address-space limit")


def limited(mib):
    def apply():
        resource.setrlimit(resource.RLIMIT_AS, (mib << 20, mib << 20))
    return apply


@case("out of memory is one line and exit 1")
def out_of_memory(d):
    rng = np.random.default_rng(28)
    q = d.save("q.npy", rng.standard_normal((1, 16, 1, 64), dtype=np.float32))
    k = d.save("k.npy", rng.standard_normal((1, 1 << 16, 1, 64), dtype=np.float32))
    out = d.out("o.npy")
    r = subprocess.run([POSENC, "attention", "rope", "--q", q, "--k", k, "--v", k, "--out", out],
                       capture_output=True, text=True, timeout=60, preexec_fn=limited(64))
    assert r.returncode == 1, f"exit {r.returncode}: {r.stderr!r}"
    assert r.stderr == "posenc: out of memory\n", repr(r.stderr)
    assert r.stdout == "", repr(r.stdout)
    assert not os.path.exists(out), "an output was written"
    assert not glob.glob(os.path.join(d.path, ".*posenc-tmp*")), "a temporary was left"


if __name__ == "__main__":
    sys.exit(main(folder="dir", timeout=60))
