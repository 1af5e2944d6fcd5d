#!/usr/bin/python3
"""`posenc bench`'s interface end to end: what its rows say, never how fast anything is.

    /usr/bin/python3 tests/e2e/test_bench.py --posenc PATH/TO/posenc [--articles ...] [-k NAME]

Benchmarks are programs, not tests: nothing here compares a time or a rate with anything. The cases
run the cheapest rows (a RoPE decode step, attention at L = 1024, the memory rows at a tiny L) and
check the contract of posenc/bench.h: the JSON fields, that the derived numbers follow from the
measured ones by the documented formulas (bytes and useful FLOPs, ratio, vs_nope, speedup, io_mb), the
thread counts, and the one-line errors for bad flags.

Each case prints one line (PASS/FAIL); the last line is exactly "N passed, M failed"; exit 1 if any
case failed (tests/e2e/harness.py).
"""
import json
import math
import sys

from harness import case, main, run
import harness

REQUIRED = {"kernel": str, "encoding": str, "shape": str, "dtype": str, "threads": int, "seconds": float,
            "throughput": float, "unit": str, "baseline": str, "baseline_throughput": float, "ratio": float}


def bench(*args):
    r = run("bench", *args)
    rows = []
    for line in r.stdout.splitlines():
        row = json.loads(line)  # with --json, every stdout line is one JSON object
        assert isinstance(row, dict), f"not a JSON object: {line!r}"
        rows.append(row)
    return rows


def check_fields(row, required=REQUIRED):
    for key, typ in required.items():
        assert key in row, f"{row.get('kernel')}: no field {key!r} in {row}"
        ok = isinstance(row[key], (int, float)) and not isinstance(row[key], bool) if typ is float \
            else isinstance(row[key], typ) and not isinstance(row[key], bool)
        assert ok, f"{key}: {row[key]!r} is not {typ.__name__}"
    for key in ("seconds", "throughput"):
        assert math.isfinite(row[key]) and row[key] > 0, f"{key} = {row[key]!r}"


def near(a, b, what, rel=1e-9):
    assert abs(a - b) <= rel * max(abs(a), abs(b)), f"{what}: {a!r} != {b!r}"


def expect_error(args, flag):
    harness.expect_error(["bench", *args], flag)


@case
def elementwise_row_fields_bytes_and_threads():
    rows = bench("--filter", r"^rope\.decode\.qk\.half rope \[1, 1, 32, 128\] float32$", "--json")
    assert [r["threads"] for r in rows] == [1, 2], f"default threads: {[r['threads'] for r in rows]}, expected 1 then 2"
    for r in rows:
        check_fields(r)
        assert (r["kernel"], r["encoding"], r["shape"], r["dtype"]) == \
            ("rope.decode.qk.half", "rope", "[1, 1, 32, 128]", "float32"), r
        assert (r["unit"], r["baseline"]) == ("GB/s", "memcpy"), r
        # q and k read and written: 4 · 32·128 · 4 bytes per call.
        near(r["throughput"], 4 * 32 * 128 * 4 / r["seconds"] / 1e9, "throughput = bytes / seconds")
        near(r["ratio"], r["throughput"] / r["baseline_throughput"], "ratio")
        assert "vs_nope" not in r and "peak_extra_mb" not in r, r
    rows = bench("--filter", r"^rope\.decode\.qk\.half .* bfloat16$", "--threads", 3, "--json")
    assert [(r["dtype"], r["threads"]) for r in rows] == [("bfloat16", 3)], rows
    near(rows[0]["throughput"], 4 * 32 * 128 * 2 / rows[0]["seconds"] / 1e9, "bfloat16 bytes")


@case
def table_output_has_a_header_and_one_line_per_row():
    r = run("bench", "--filter", r"^rope\.decode\.qk\.half .* float32$", "--threads", "1")
    lines = r.stdout.splitlines()
    assert len(lines) == 2 and lines[0].split()[:4] == ["kernel", "encoding", "shape", "dtype"], lines
    assert lines[1].startswith("rope.decode.qk.half"), lines


@case
def attention_rows_useful_flops_sgemm_and_vs_nope():
    rows = bench("--filter", r"^attention\.forward (nope|rope) \[1, 1024, 8, 64\] float32$", "--threads", 1,
                 "--json")
    assert [r["encoding"] for r in rows] == ["nope", "rope"], [r["encoding"] for r in rows]
    for r in rows:
        check_fields(r)
        assert (r["kernel"], r["unit"], r["baseline"], r["threads"]) == \
            ("attention.forward", "GFLOP/s", "sgemm", 1), r
        assert r["path"] in ("fused", "reference"), r
        # Useful FLOPs: 4·B·H·M·N·d, halved for causal.
        near(r["throughput"], 4 * 8 * 1024 * 1024 * 64 / 2 / r["seconds"] / 1e9, "useful GFLOP/s")
        near(r["ratio"], r["throughput"] / r["baseline_throughput"], "ratio")
    near(rows[0]["vs_nope"], 1.0, "nope vs itself")
    near(rows[0]["nope_seconds"], rows[0]["seconds"], "nope's own seconds")
    near(rows[1]["vs_nope"], rows[1]["seconds"] / rows[1]["nope_seconds"], "vs_nope = seconds / nope_seconds")
    # nope is timed beside each encoding, whether or not nope's own row was asked for.
    rows = bench("--filter", r"^attention\.backward t5 \[1, 1024, 8, 64\] float32$", "--threads", 2, "--json")
    assert len(rows) == 1 and rows[0]["threads"] == 2, rows
    check_fields(rows[0])
    assert rows[0]["nope_seconds"] > 0, rows[0]
    near(rows[0]["vs_nope"], rows[0]["seconds"] / rows[0]["nope_seconds"], "vs_nope without nope's row")
    near(rows[0]["throughput"], 2.5 * 4 * 8 * 1024 * 1024 * 64 / 2 / rows[0]["seconds"] / 1e9, "backward: 2.5x")
    # More than one thread: the same call and the baseline on one thread, timed in the same rounds.
    r = rows[0]
    assert r["one_thread_seconds"] > 0 and r["baseline_speedup"] > 0, r
    near(r["speedup"], r["one_thread_seconds"] / r["seconds"], "speedup = one_thread_seconds / seconds")
    # ... and one-thread rows have none of it.
    one = bench("--filter", r"^attention\.forward nope \[1, 1024, 8, 64\] float32$", "--threads", 1, "--json")
    assert len(one) == 1 and not {"one_thread_seconds", "speedup", "baseline_speedup"} & one[0].keys(), one


@case
def memory_rows_in_a_child_process():
    L = 256
    rows = bench("--memory", "--memory-length", L, "--filter", "nope", "--threads", 1, "--json")
    assert [r["kernel"] for r in rows] == ["attention.forward", "attention.backward"], rows
    for r, tensors in zip(rows, (4, 7)):  # q, k, v, out / q, k, v, dout, dq, dk, dv
        check_fields(r, {k: t for k, t in REQUIRED.items() if not k.startswith(("baseline", "ratio"))})
        assert r["shape"] == f"[1, {L}, 8, 64]" and r["threads"] == 1, r
        assert r["baseline"] is None and r["ratio"] is None, r
        near(r["io_mb"], tensors * L * 8 * 64 * 4 / 2**20, "io_mb = inputs + outputs")
        assert isinstance(r["peak_extra_mb"], (int, float)) and r["peak_extra_mb"] >= 0, r
    # --memory-dtype: the same rows with 16-bit q, k, v and outputs (half the bytes)
    rows = bench("--memory", "--memory-length", L, "--memory-dtype", "bfloat16", "--filter", "backward nope",
                 "--threads", 1, "--json")
    assert len(rows) == 1 and rows[0]["dtype"] == "bfloat16", rows
    near(rows[0]["io_mb"], 7 * L * 8 * 64 * 2 / 2**20, "io_mb of bfloat16 tensors")


@case
def bad_flags_are_one_line_errors():
    expect_error(["--filter", "(", "--json"], "--filter")
    expect_error(["--filter", "no such case", "--json"], "--filter")
    expect_error(["--filter", "no such case"], "--filter")  # the table's header is not printed either
    expect_error(["--threads", 0], "--threads")
    expect_error(["--threads", "two"], "--threads")
    expect_error(["--memory-length", 64], "--memory-length")
    expect_error(["--memory", "--memory-length", 0], "--memory-length")
    expect_error(["--memory-dtype", "bfloat16"], "--memory-dtype")
    expect_error(["--memory", "--memory-dtype", "int8"], "--memory-dtype")
    expect_error(["--memory", "--filter", "no such case"], "--filter")


if __name__ == "__main__":
    sys.exit(main())
