"""What the end-to-end tests share (imported by tests/e2e/test_*.py; not a test itself).

Every e2e test takes one command line, `--posenc PATH [--articles DIR] [-k NAME]` (a test that
cannot run without the source articles says so with articles_required()), registers its cases with @case (named after
the function) or @case("a sentence"), and ends with `sys.exit(main())`: each case prints one line
(PASS with what the case returned, if anything; FAIL with the failing line), the last line is exactly
"N passed, M failed", and the exit status is 1 if any case failed (77, ctest's skip, where an oracle
is missing: skip()). Each case gets a fresh temporary folder: handed to it as a `Dir` (save/out/write
helpers) or its plain path, or not at all, as main()'s `folder` says; case_dir() is that Dir too,
for helpers the case does not pass it to.

The CLI's error contract is checked in one place, expect_error(): exit 2, exactly one stderr line
"posenc: ..." naming the flag, nothing on stdout, no named output left behind and no temporary.
Every posenc run has a time limit, main()'s `timeout` unless run() is given one.

For the tests that compare arrays (numpy is imported only inside these, so that a test without numpy
can still import this file): load() reads an .npy output and checks its dtype, close() compares
elementwise (shape, no NaN, ±inf only where expected, |got − want| ≤ atol + rtol·|want|) and returns
the largest difference, numeric_grad() takes central differences.
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
_ap.add_argument("--articles", default="",
                 help="the folder of the source articles 000_*.txt .. 004_*.txt (docs/articles.md), "
                      "for the tests that need them")
_ap.add_argument("-k", default="", help="run only the cases whose name contains this string")
ARGS = _ap.parse_args()
POSENC = os.path.abspath(ARGS.posenc)

CASES = []


def case(fn_or_name):
    """@case registers the function under its own name; @case("a sentence") under that sentence."""
    if isinstance(fn_or_name, str):
        def register(fn):
            CASES.append((fn_or_name, fn))
            return fn
        return register
    CASES.append((fn_or_name.__name__, fn_or_name))
    return fn_or_name


def articles_required():
    """--articles, or argparse's usage error (exit 2) where the command line lacks it."""
    if not ARGS.articles:
        _ap.error("the following arguments are required: --articles")
    return ARGS.articles


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


_timeout = [300]  # seconds a posenc run may take; main(timeout=...) sets it


_current = [None]  # the Dir of the case now running


def case_dir():
    """The Dir of the case now running (its fresh temporary folder)."""
    assert _current[0] is not None, "case_dir() outside a case"
    return _current[0]


def run(*args, ok=True, timeout=None):
    """posenc with these arguments; raises unless it exits 0 (when ok). timeout: main()'s unless given."""
    r = subprocess.run([POSENC, *map(str, args)], capture_output=True, text=True,
                       timeout=_timeout[0] if timeout is None else timeout)
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


def load(path, dtype=None):
    """The array in the .npy file `path`; with dtype, asserts that it is stored as that dtype."""
    import numpy as np
    a = np.load(path)
    if dtype is not None:
        assert a.dtype == np.dtype(dtype), f"{os.path.basename(path)}: dtype {a.dtype}, expected {dtype}"
    return a


def _as_float64(x):
    """numpy array, torch tensor (duck-typed: torch is not imported here) or sequence, as float64."""
    import numpy as np
    if hasattr(x, "detach"):
        x = x.detach().cpu()
        if x.is_complex():
            raise TypeError("complex tensor")
        x = x.numpy()
    x = np.asarray(x)
    if np.iscomplexobj(x):
        raise TypeError("complex array")
    return x.astype(np.float64)


def close(got, want, what="values", atol=None, rtol=None, dtype=None):
    """Asserts got ≈ want: the same shape, no NaN in either, ±inf exactly where want has the same ±inf,
    and |got − want| ≤ atol + rtol·|want| elsewhere. atol, rtol default to dtype's: float32 1e-5, 1e-4;
    anything else 1e-10, 1e-9. Returns the largest |got − want| over the finite entries."""
    import numpy as np
    got, want = _as_float64(got), _as_float64(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    f32 = dtype is not None and np.dtype(dtype) == np.float32
    atol = (1e-5 if f32 else 1e-10) if atol is None else atol
    rtol = (1e-4 if f32 else 1e-9) if rtol is None else rtol
    for name, a in (("got", got), ("want", want)):
        if np.isnan(a).any():
            idx = tuple(int(i) for i in np.argwhere(np.isnan(a))[0])
            raise AssertionError(f"{what}: NaN in {name}, first at {idx}")
    inf_w = np.isinf(want)
    wrong_inf = (np.isinf(got) != inf_w) | (inf_w & (got != want))
    if wrong_inf.any():
        idx = tuple(int(i) for i in np.argwhere(wrong_inf)[0])
        raise AssertionError(f"{what}: infinities differ, first at {idx}: got {got[idx]!r}, want {want[idx]!r}")
    fin = ~inf_w
    err = np.abs(np.where(fin, got, 0.0) - np.where(fin, want, 0.0))
    bad = ~(err <= atol + rtol * np.abs(np.where(fin, want, 0.0)))
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise AssertionError(f"{what}: {int(bad.sum())} of {bad.size} differ; first at {idx}: "
                             f"got {got[idx]!r}, want {want[idx]!r} (atol {atol:g}, rtol {rtol:g}); "
                             f"max |diff| {err.max():.3g}")
    return float(err.max()) if err.size else 0.0


def numeric_grad(f, x, eps=1e-6):
    """Central differences of the scalar f() with respect to every element of the array x (changed in
    place while f runs, restored after)."""
    import numpy as np
    g = np.zeros_like(x)
    it = np.nditer(x, flags=["multi_index"])
    for _ in it:
        i = it.multi_index
        old = x[i]
        x[i] = old + eps
        fp = f()
        x[i] = old - eps
        fm = f()
        x[i] = old
        g[i] = (fp - fm) / (2 * eps)
    return g


def main(folder=None, prefix="posenc-e2e-", timeout=300):
    """Runs the registered cases; folder: None (no argument), "dir" (a Dir) or "path" (a str);
    timeout: the seconds each posenc run may take."""
    _timeout[0] = timeout
    if not os.path.isfile(POSENC) or not os.access(POSENC, os.X_OK):
        print(f"FAIL: the posenc binary {POSENC} is not an executable file")
        print("0 passed, 1 failed")
        return 1
    passed = failed = 0
    t0 = time.time()
    for name, fn in CASES:
        if ARGS.k and ARGS.k not in name:
            continue
        with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
            _current[0] = d = Dir(tmp)
            t = time.time()
            try:
                detail = fn() if folder is None else fn(d if folder == "dir" else tmp)
                passed += 1
                print(f"PASS {name}{'' if detail is None else f': {detail}'} ({time.time() - t:.1f} s)")
            except Exception as e:  # noqa: BLE001 - report every failure, keep going
                failed += 1
                where = traceback.extract_tb(e.__traceback__)[-1]
                print(f"FAIL {name}: {type(e).__name__}: {e} (line {where.lineno})")
            finally:
                _current[0] = None
            sys.stdout.flush()
    print(f"# {time.time() - t0:.1f} s")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0
