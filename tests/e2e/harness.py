"""What the end-to-end tests share (imported by tests/e2e/test_*.py; not a test itself).

Every e2e test takes one command line, `--posenc PATH [--seeds DIR] [-k NAME]`, registers its cases
with @case, and ends with `sys.exit(main())`: each case prints one line (PASS/FAIL with the failing
line), the last line is exactly "N passed, M failed", and the exit status is 1 if any case failed
(77, ctest's skip, where an oracle is missing: skip()). A case takes no argument, or a fresh
temporary folder: `Dir` (save/out/write helpers) or its plain path, as main()'s `folder` says.

The CLI's error contract is checked in one place, expect_error(): exit 2, exactly one stderr line
"posenc: ..." naming the flag, nothing on stdout, no named output left behind and no temporary.
"""
import argparse
import glob
import os
import subprocess
import sys
import tempfile
import time
import traceback

_ap = argparse.ArgumentParser(description=(sys.modules["__main__"].__doc__ or "").splitlines()[0]
                              if getattr(sys.modules["__main__"], "__doc__", None) else None)
_ap.add_argument("--posenc", required=True, help="the posenc binary")
_ap.add_argument("--seeds", default="", help="the seed articles (used by the tests that need them)")
_ap.add_argument("-k", default="", help="run only the cases whose name contains this string")
ARGS = _ap.parse_args()
POSENC = os.path.abspath(ARGS.posenc)

CASES = []


def case(fn):
    CASES.append(fn)
    return fn


def skip(reason):
    print(f"SKIP: {reason}")
    sys.exit(77)


class Dir:
    """A fresh folder per case: save() writes an .npy input, write() a text file, out() names an output."""

    def __init__(self, path):
        self.path = path

    def save(self, name, arr):
        import numpy as np  # only the tests that save arrays need numpy
        p = os.path.join(self.path, name)
        np.save(p, arr)
        return p

    def write(self, name, text):
        p = os.path.join(self.path, name)
        with open(p, "w") as f:
            f.write(text)
        return p

    def out(self, name):
        return os.path.join(self.path, name)


def run(*args, ok=True, timeout=300):
    """posenc with these arguments; raises unless it exits 0 (when ok)."""
    r = subprocess.run([POSENC, *map(str, args)], capture_output=True, text=True, timeout=timeout)
    if ok and r.returncode != 0:
        raise AssertionError(f"posenc {' '.join(map(str, args))} exited {r.returncode}: {r.stderr.strip()}")
    return r


def expect_error(args, flag, outputs=(), code=2):
    """Bad input: exit `code`, one stderr line 'posenc: ...' naming `flag`, nothing on stdout, none of
    `outputs` left behind, no temporary beside them. Returns the line."""
    r = run(*args, ok=False)
    lines = r.stderr.splitlines()
    assert r.returncode == code, f"exit {r.returncode}, expected {code}; stderr: {r.stderr!r}"
    assert len(lines) == 1, f"expected one stderr line, got {len(lines)}: {r.stderr!r}"
    assert lines[0].startswith("posenc: "), f"stderr does not start with 'posenc: ': {lines[0]!r}"
    assert flag in lines[0], f"stderr does not name {flag}: {lines[0]!r}"
    assert r.stdout == "", f"stdout written on an error: {r.stdout!r}"
    for o in outputs:
        assert not os.path.exists(o), f"{o} exists after a failed run"
        assert not glob.glob(os.path.join(os.path.dirname(o) or ".", ".*posenc-tmp*")), "temporary left behind"
    return lines[0]


def main(folder=None, prefix="posenc-e2e-"):
    """Runs the registered cases; folder: None (no argument), "dir" (a Dir) or "path" (a str)."""
    if not os.access(POSENC, os.X_OK):
        print(f"FAIL: the posenc binary {POSENC} is not executable")
        print("0 passed, 1 failed")
        return 1
    passed = failed = 0
    t0 = time.time()
    for fn in CASES:
        if ARGS.k and ARGS.k not in fn.__name__:
            continue
        with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
            t = time.time()
            try:
                if folder is None:
                    fn()
                else:
                    fn(Dir(tmp) if folder == "dir" else tmp)
                passed += 1
                print(f"PASS {fn.__name__} ({time.time() - t:.1f} s)")
            except Exception as e:  # noqa: BLE001 - report every failure, keep going
                failed += 1
                where = traceback.extract_tb(e.__traceback__)[-1]
                print(f"FAIL {fn.__name__}: {type(e).__name__}: {e} (line {where.lineno})")
            sys.stdout.flush()
    print(f"# {time.time() - t0:.1f} s")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0
