"""Checks the JSON (and PNG) that `qrun bench` / `qrun compare` wrote (tests/bench).
Usage: check_reports.py bench|synthetic|same|diverged FILE.json [FILE.png]"""
import json, math, struct, sys

SUMMARY = ["tokens_per_s", "mfu", "step_time_median_s", "step_time_p90_s", "gpu_kernels_per_step",
           "cpu_ops_per_step", "gpu_busy", "peak_gpu_allocated_mib", "peak_gpu_reserved_mib",
           "padding_fraction", "first_step_s", "model_build_s", "train_flops_per_token"]
GPU_ONLY = ["mfu", "gpu_kernels_per_step", "gpu_busy", "peak_gpu_allocated_mib", "peak_gpu_reserved_mib"]


def png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path}: not a PNG"
    assert head[12:16] == b"IHDR", f"{path}: no IHDR chunk first"
    return struct.unpack(">II", head[16:24])


def check_bench(b, steps=3, warmup=1):
    for k in ["kind", "recipe", "label", "qrun", "device", "model", "kernels", "data", "precision",
              "steps", "warmup", "plugins", "per_step", "summary", "profile"]:
        assert k in b, f"bench report lacks '{k}'"
    assert b["kind"] == "bench"
    assert b["qrun"]["commit"], "no commit"
    assert b["device"]["name"] == "cpu" and b["device"]["driver"] is None and b["device"]["cuda_runtime"] is None
    assert b["device"]["peak_tflops"] is None
    assert all(p["build_id"] for p in b["plugins"]) and any(p["name"] == "qwen" for p in b["plugins"])
    assert len(b["per_step"]) == steps + warmup
    assert [s["warmup"] for s in b["per_step"]] == [True] * warmup + [False] * steps
    s = b["summary"]
    for k in SUMMARY:
        assert k in s, f"summary lacks '{k}'"
    for k in GPU_ONLY:
        assert s[k] is None, f"{k} must be null on CPU, not {s[k]!r}"
    for k in ["tokens_per_s", "step_time_median_s", "step_time_p90_s", "cpu_ops_per_step",
              "padding_fraction", "first_step_s", "train_flops_per_token"]:
        assert isinstance(s[k], (int, float)) and math.isfinite(s[k]), f"{k} = {s[k]!r}"
    assert s["tokens_per_s"] > 0 and s["cpu_ops_per_step"] > 0
    assert s["step_time_p90_s"] >= s["step_time_median_s"]
    assert all(math.isfinite(x["loss"]) for x in b["per_step"])


def main():
    mode, path = sys.argv[1], sys.argv[2]
    with open(path) as f:
        j = json.load(f)
    if mode in ("bench", "synthetic"):
        check_bench(j)
        if mode == "bench":
            assert j["profile"] is None and "profile_note" in j, "CPU: profile null with a reason"
            assert j["data"]["synthetic"] is None and j["data"]["dataset"] == "chat"
        else:
            assert j["data"]["dataset"] == "synthetic" and j["data"]["synthetic"] == "chat"
            lens = [x["real_tokens"] for x in j["per_step"]]
            assert all(0 < n <= 512 for n in lens), lens
    else:
        assert j["kind"] == "compare"
        check_bench(j["a"])
        check_bench(j["b"])
        n = j["numerics"]
        assert n["same_batches"] is True
        if mode == "same":
            assert n["verdict"] == "same" and n["first_divergent_step"] is None
            assert all(d == 0.0 for d in n["loss_abs_diff"]), n["loss_abs_diff"]
            assert all(d == 0.0 for d in n["grad_norm_rel_diff"]), n["grad_norm_rel_diff"]
            # Timings are not asserted (CI machines are shared): only that each ratio is reported.
            for k in ["tokens_per_s", "step_time_median_s"]:
                assert j["ratios"][k] > 0 and math.isfinite(j["ratios"][k]), (k, j["ratios"][k])
            assert j["ratios"]["cpu_ops_per_step"] == 1.0
        else:
            assert n["verdict"] == "diverged" and n["first_divergent_step"] == 1, n
            assert n["max_loss_abs_diff"] > n["tolerance"]["loss_abs"]
    if len(sys.argv) > 3:
        w, h = png_size(sys.argv[3])
        assert (w, h) == (1600, 900), f"{sys.argv[3]}: {w}x{h}, want 1600x900"
    print(f"{mode}: ok")


if __name__ == "__main__":
    main()
