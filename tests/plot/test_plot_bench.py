#!/usr/bin/env python3
"""test_plot_bench.py PLOT_BENCH WORKDIR - scripts/plot_bench.py on sample bench/compare JSONs.

Writes bench and compare JSONs (with and without a profile, GPU fields null as on a CPU machine),
runs the plotter as a subprocess and checks each output is a PNG of 1600x900 by reading its
signature and IHDR chunk (struct, not matplotlib). Bad inputs must exit 2 with a message naming
the file and no traceback.
"""
import copy
import json
import os
import struct
import subprocess
import sys
import unittest
import zlib

PLOTTER = WORKDIR = None
GPU_FIELDS = ("mfu", "gpu_kernels_per_step", "gpu_busy", "peak_gpu_allocated_mib")


def bench(label, scale=1.0, profile=True, gpu=True, loss_shift=0.0):
    steps = [{"step": i, "warmup": i < 2, "time_s": (0.5 if i < 2 else 0.12 + 0.005 * (i % 3)) * scale,
              "loss": 2.5 - 0.08 * i + loss_shift * i, "grad_norm": 1.0 + 0.01 * i,
              "real_tokens": 4000, "padding_tokens": 96} for i in range(12)]
    summary = {"tokens_per_s": 33000 / scale, "mfu": 0.41 / scale, "step_time_median_s": 0.125 * scale,
               "step_time_p90_s": 0.13 * scale, "gpu_kernels_per_step": 1850.0, "cpu_ops_per_step": 5400.0,
               "gpu_busy": 0.93, "peak_gpu_allocated_mib": 21000.0, "padding_fraction": 0.023,
               "first_step_s": 3.2 * scale}
    if not gpu:
        summary.update({k: None for k in GPU_FIELDS})
    prof = {"step_time_ms": 125.0 * scale, "groups": [
        {"group": "matmul", "time_ms": 70.0 * scale, "share": 0.56, "kernels": 700},
        {"group": "attention", "time_ms": 30.0 * scale, "share": 0.24, "kernels": 112},
        {"group": "norm", "time_ms": 10.0, "share": 0.08, "kernels": 300},
        {"group": "other", "time_ms": 15.0, "share": 0.12, "kernels": 738}],
        "top_kernels": [{"name": "sm90_gemm", "group": "matmul", "calls": 400, "time_ms": 50.0, "share": 0.4}]}
    if label == "b":
        prof["groups"].append({"group": "gated_delta", "time_ms": 8.0, "share": 0.06, "kernels": 48})
    return {"kind": "bench", "recipe": f"recipes/{label}.yaml", "label": f"run-{label}",
            "device": {"name": "NVIDIA H100 80GB HBM3" if gpu else None},
            "qrun": {"commit": "0123456789abcdef"},
            "per_step": steps, "summary": summary, "profile": prof if profile else None}


def compare(profile=True, diverged=False):
    a = bench("a", profile=profile)
    b = bench("b", scale=0.8, profile=profile, gpu=profile, loss_shift=0.01 if diverged else 0.0)
    la = [s["loss"] for s in a["per_step"]]
    lb = [s["loss"] for s in b["per_step"]]
    diff = [abs(x - y) for x, y in zip(la, lb)]
    ratios = {k: (b["summary"][k] / a["summary"][k]
                  if a["summary"][k] is not None and b["summary"][k] is not None else None)
              for k in a["summary"]}
    first = next((i for i, d in enumerate(diff) if d > 0.05), None)
    return {"kind": "compare", "a": a, "b": b, "ratios": ratios, "numerics": {
        "steps": list(range(12)), "loss_a": la, "loss_b": lb, "loss_abs_diff": diff,
        "grad_norm_a": [1.0] * 12, "grad_norm_b": [1.0] * 12, "grad_norm_rel_diff": [0.0] * 12,
        "tolerance": {"loss_abs": 0.05, "grad_norm_rel": 0.05},
        "verdict": "diverged" if first is not None else "same", "first_divergent_step": first}}


def png_size(path):
    """(width, height) from the PNG signature and the IHDR chunk, with its CRC checked."""
    with open(path, "rb") as f:
        head = f.read(33)
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path}: not a PNG signature"
    length, ctype = struct.unpack(">I4s", head[8:16])
    assert ctype == b"IHDR" and length == 13, f"{path}: first chunk is {ctype!r}/{length}, not IHDR"
    (crc,) = struct.unpack(">I", head[29:33])
    assert crc == zlib.crc32(head[12:29]) & 0xFFFFFFFF, f"{path}: IHDR CRC mismatch"
    return struct.unpack(">II", head[16:24])


def run(*args):
    return subprocess.run([sys.executable, PLOTTER, *args], capture_output=True, text=True, timeout=120)


class PlotBench(unittest.TestCase):
    def plot_ok(self, name, data, out=None):
        src = os.path.join(WORKDIR, name + ".json")
        with open(src, "w") as f:
            json.dump(data, f)
        want = out or os.path.join(WORKDIR, name + ".png")
        if os.path.exists(want):
            os.remove(want)
        r = run(src, *([out] if out else []))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertNotIn("Traceback", r.stderr)
        self.assertEqual(r.stdout.strip(), f"plot: {want} (1600x900)")
        self.assertEqual(png_size(want), (1600, 900))

    def plot_bad(self, name, text, reason):
        src = os.path.join(WORKDIR, name + ".json")
        with open(src, "w") as f:
            f.write(text)
        r = run(src)
        self.assertEqual(r.returncode, 2, f"{name}: {r.stdout}{r.stderr}")
        self.assertNotIn("Traceback", r.stderr)
        self.assertIn(src, r.stderr)
        self.assertIn(reason, r.stderr)
        self.assertFalse(os.path.exists(os.path.join(WORKDIR, name + ".png")))

    def test_bench_with_profile(self):
        self.plot_ok("bench_profile", bench("a"))

    def test_bench_cpu_nulls_no_profile(self):
        b = bench("a", profile=False, gpu=False)
        b["per_step"][3]["loss"] = None
        self.plot_ok("bench_cpu", b, out=os.path.join(WORKDIR, "explicit_out.png"))

    def test_compare_with_profiles(self):
        self.plot_ok("compare_profile", compare(profile=True, diverged=True))

    def test_compare_without_profiles(self):
        self.plot_ok("compare_noprofile", compare(profile=False))

    def test_bad_inputs(self):
        self.plot_bad("bad_syntax", '{"kind": "bench", "per_step": [', "not valid JSON")
        self.plot_bad("bad_kind", json.dumps({"kind": "train"}), "kind")
        self.plot_bad("bad_toplevel", "[1, 2]", "expected an object")
        no_steps = bench("a")
        del no_steps["per_step"]
        self.plot_bad("bad_missing", json.dumps(no_steps), "per_step")
        bad_time = bench("a")
        bad_time["per_step"][2]["time_s"] = "fast"
        self.plot_bad("bad_time", json.dumps(bad_time), "per_step[2].time_s")
        c = compare()
        del c["numerics"]
        self.plot_bad("bad_compare", json.dumps(c), "numerics")
        c = compare()
        c["numerics"]["loss_b"] = c["numerics"]["loss_b"][:3]
        self.plot_bad("bad_lengths", json.dumps(c), "length")
        c = copy.deepcopy(compare())
        c["b"]["profile"]["groups"][0] = {"group": 7, "time_ms": 1.0}
        self.plot_bad("bad_group", json.dumps(c), "b.profile.groups[0].group")

    def test_missing_file(self):
        missing = os.path.join(WORKDIR, "does_not_exist.json")
        r = run(missing)
        self.assertEqual(r.returncode, 2)
        self.assertNotIn("Traceback", r.stderr)
        self.assertIn(missing, r.stderr)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__.strip().splitlines()[0])
    PLOTTER, WORKDIR = sys.argv.pop(1), sys.argv.pop(1)
    os.makedirs(WORKDIR, exist_ok=True)
    unittest.main(verbosity=2)
