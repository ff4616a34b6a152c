// tests/unit - unit tests of the host's small modules: edit distance and suggestions, the
// registry's conflict handling, Config access rules, --set parsing.
#include "bench.h"
#include "distributed.h"
#include "optimizer.h"
#include "recipe.h"
#include "registry.h"
#include "session.h"
#include "text.h"

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cmath>

namespace {

class Dummy : public qrun::Component {};

qrun::ComponentInfo info(const std::string& kind, const std::string& name) {
  return qrun::ComponentInfo{kind, name, "s", qrun::Schema{},
                             [](const qrun::Config&) -> std::unique_ptr<qrun::Component> {
                               return std::make_unique<Dummy>();
                             }};
}

TEST(Text, EditDistance) {
  EXPECT_EQ(qrun::edit_distance("", ""), 0u);
  EXPECT_EQ(qrun::edit_distance("abc", ""), 3u);
  EXPECT_EQ(qrun::edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(qrun::edit_distance("tokens_per_btach", "tokens_per_batch"), 1u);  // transposition
  EXPECT_EQ(qrun::edit_distance("sdap", "sdpa"), 1u);
}

TEST(Text, SuggestsOnlyPlausibleTypos) {
  std::vector<std::string> keys = {"tokens_per_batch", "strategy", "window"};
  EXPECT_EQ(qrun::nearest("tokens_per_btach", keys), "tokens_per_batch");
  EXPECT_EQ(qrun::nearest("stratgy", keys), "strategy");
  EXPECT_EQ(qrun::nearest("completely_unrelated", keys), "");
  EXPECT_EQ(qrun::did_you_mean("windw", keys), " (did you mean 'window'?)");
  EXPECT_EQ(qrun::did_you_mean("zzz", {}), "");
}

TEST(Registry, ConflictNamesBothOriginsAndOnlyBlocksThatName) {
  qrun::Registry r;
  auto a = std::make_shared<qrun::PluginOrigin>(qrun::PluginOrigin{"/a.so", "a", "1", "x", 0});
  auto b = std::make_shared<qrun::PluginOrigin>(qrun::PluginOrigin{"/b.so", "b", "1", "y", 0});
  r.add(info("collator", "packed"), a);
  r.add(info("collator", "packed"), b);
  r.add(info("collator", "padded"), b);
  try {
    r.get("collator", "packed");
    FAIL() << "expected a conflict";
  } catch (const qrun::UserError& e) {
    EXPECT_EQ(e.message(),
              "collator 'packed' is registered by more than one plugin: a (/a.so) and b (/b.so); "
              "remove one of the libraries from the plugin path");
  }
  EXPECT_NO_THROW(r.get("collator", "padded"));
  EXPECT_EQ(r.names("collator"), (std::vector<std::string>{"packed", "padded"}));
}

TEST(Registry, UnknownNameSuggestsAndListsFailures) {
  qrun::Registry r;
  auto a = std::make_shared<qrun::PluginOrigin>(qrun::PluginOrigin{"/a.so", "a", "1", "x", 0});
  r.add(info("attention", "sdpa"), a);
  EXPECT_EQ(r.unknown_message("attention", "sdap"),
            "unknown attention 'sdap' (did you mean 'sdpa'?); installed: sdpa");
  EXPECT_EQ(r.unknown_message("ops", "fused"), "unknown ops 'fused'; no ops is installed");
  r.add_failure({"/bad.so", "boom"});
  EXPECT_EQ(r.unknown_message("ops", "fused"),
            "unknown ops 'fused'; no ops is installed; note: 1 plugin library failed to load: "
            "/bad.so (boom)");
}

TEST(ConfigAccess, TypedGettersAndInternalErrorsForPluginBugs) {
  qrun::Config c("data.collator", {{"n", int64_t{3}}, {"x", 0.5}, {"s", std::string("a")}},
                 {{"n", "r.yaml:3:4"}});
  EXPECT_EQ(c.get_int("n"), 3);
  EXPECT_DOUBLE_EQ(c.get_float("n"), 3.0);  // an int is a valid float
  EXPECT_EQ(c.get_string("s"), "a");
  EXPECT_EQ(c.location("n"), "r.yaml:3:4");
  EXPECT_EQ(c.location("x"), "data.collator.x (default)");
  EXPECT_THROW(c.get_int("missing"), qrun::InternalError);
  EXPECT_THROW(c.get_int("s"), qrun::InternalError);
}

TEST(Overrides, ParseAndReject) {
  auto [p, v] = qrun::parse_override("data.collator.tokens_per_batch=4096");
  EXPECT_EQ(p, "data.collator.tokens_per_batch");
  EXPECT_EQ(v, "4096");
  EXPECT_EQ(qrun::parse_override("a=b=c").second, "b=c");
  EXPECT_THROW(qrun::parse_override("novalue"), qrun::UserError);
  EXPECT_THROW(qrun::parse_override("=3"), qrun::UserError);
  EXPECT_THROW(qrun::parse_override("a..b=3"), qrun::UserError);
  EXPECT_THROW(qrun::parse_override(".a=3"), qrun::UserError);
}

TEST(Layering, FrameworkNeverIncludesPlugins) {
  // The host knows plugins only through the registry (docs/ARCHITECTURE.md).
  std::string cmd = std::string("grep -rnE '#include[[:space:]]*[<\"][^>\"]*plugins/' ") +
                    FRAMEWORK_DIR + " > /dev/null";
  EXPECT_NE(std::system(cmd.c_str()), 0) << "framework/ includes a header from plugins/";
}

}  // namespace

// MFU's peak: the device table by name, most specific entry first; unknown devices get none.
TEST(DevicePeak, KnownDevicesByName) {
  std::string label;
  EXPECT_DOUBLE_EQ(qrun::known_peak_tflops("NVIDIA H100 80GB HBM3", &label), 989.4);
  EXPECT_EQ(label, "H100 SXM");
  EXPECT_DOUBLE_EQ(qrun::known_peak_tflops("NVIDIA H100 PCIe"), 756.0);
  EXPECT_DOUBLE_EQ(qrun::known_peak_tflops("NVIDIA H100 NVL"), 835.0);
  EXPECT_DOUBLE_EQ(qrun::known_peak_tflops("NVIDIA H200", &label), 989.4);
  EXPECT_EQ(label, "H200");
  EXPECT_DOUBLE_EQ(qrun::known_peak_tflops("NVIDIA GH200 480GB", &label), 989.4);
  EXPECT_EQ(label, "GH200");
  EXPECT_DOUBLE_EQ(qrun::known_peak_tflops("NVIDIA A100-SXM4-80GB"), 312.0);
  EXPECT_TRUE(std::isnan(qrun::known_peak_tflops("NVIDIA GeForce GTX 1080")));
  EXPECT_TRUE(std::isnan(qrun::known_peak_tflops("")));
}

TEST(BenchProfile, KernelGroups) {
  EXPECT_EQ(qrun::kernel_group("nvjet_tst_128x256_64x4_2x1_v_bz_coopA_TNT"), "GEMM (cuBLAS)");
  EXPECT_EQ(qrun::kernel_group("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64"), "GEMM (cuBLAS)");
  EXPECT_EQ(qrun::kernel_group("void qrun::gdn::gdn_bwd_chunk_kernel<64>(qrun::gdn::Params)"), "gated delta rule");
  EXPECT_EQ(qrun::kernel_group("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>"),
            "optimizer (AdamW)");
  EXPECT_EQ(qrun::kernel_group("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add>"),
            "element-wise and copies");
  EXPECT_EQ(qrun::kernel_group("void at::native::(anonymous namespace)::cunn_SoftMaxForward<8>"), "softmax / loss");
  EXPECT_EQ(qrun::kernel_group("void at::native::reduce_kernel<512, 1>"), "reductions and norms");
  EXPECT_EQ(qrun::kernel_group("pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<256>>"), "attention (fused)");
  EXPECT_EQ(qrun::kernel_group("void qrun::conv1d::(anonymous namespace)::bwd_kernel<__nv_bfloat16, __nv_bfloat16, 4, 8>"),
            "conv1d");
  EXPECT_EQ(qrun::kernel_group("void qrun::fops::(anonymous namespace)::ce_rows_kernel<__nv_bfloat16, 8>"),
            "ops (fused: norms, SwiGLU, loss rows)");
  EXPECT_EQ(qrun::kernel_group("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL"), "communication (NCCL)");
  EXPECT_EQ(qrun::kernel_group("some_new_kernel"), "other");
}

// Launch environments (framework/distributed.h): torchrun's and SLURM's variables, and the
// messages of launches that do not add up.
TEST(LaunchEnv, TorchrunSlurmAndSingle) {
  qrun::DistributedEnv e = qrun::read_launch_env({});
  EXPECT_EQ(e.world_size, 1);
  EXPECT_FALSE(e.distributed());
  e = qrun::read_launch_env({{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "3"}, {"LOCAL_WORLD_SIZE", "4"},
                             {"MASTER_ADDR", "node7"}, {"MASTER_PORT", "29511"}});
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_rank, 3);
  EXPECT_EQ(e.local_world_size, 4);
  EXPECT_EQ(e.master_addr, "node7");
  EXPECT_EQ(e.master_port, 29511);
  EXPECT_EQ(e.source, "torchrun");
  e = qrun::read_launch_env({{"SLURM_PROCID", "9"}, {"SLURM_NTASKS", "16"}, {"SLURM_LOCALID", "1"},
                             {"SLURM_TASKS_PER_NODE", "8(x2)"}, {"SLURM_JOB_NODELIST", "gpu[03-04,07],cpu1"}});
  EXPECT_EQ(e.rank, 9);
  EXPECT_EQ(e.world_size, 16);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 8);
  EXPECT_EQ(e.master_addr, "gpu03");
  EXPECT_EQ(e.master_port, 29500);
  EXPECT_EQ(e.source, "SLURM");
  EXPECT_EQ(qrun::first_slurm_host("a1,b2"), "a1");
  EXPECT_EQ(qrun::first_slurm_host("node[7,9-12]"), "node7");
  EXPECT_EQ(qrun::first_slurm_host("solo"), "solo");
}

TEST(LaunchEnv, InconsistentLaunchesAreUserErrors) {
  auto message = [](const std::map<std::string, std::string>& v) {
    try {
      qrun::read_launch_env(v);
    } catch (const qrun::UserError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({{"WORLD_SIZE", "4"}}).find("WORLD_SIZE=4 is set but RANK is not"), std::string::npos);
  EXPECT_NE(message({{"RANK", "4"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "0"}}).find("RANK=4 is not an integer in [0, 3]"),
            std::string::npos);
  EXPECT_NE(message({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}}).find("needs MASTER_ADDR and MASTER_PORT"),
            std::string::npos);
  EXPECT_NE(message({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}, {"MASTER_ADDR", "h"},
                     {"MASTER_PORT", "http"}}).find("MASTER_PORT=http is not an integer"),
            std::string::npos);
}

// The share of a global batch each rank runs: equal counts, tokens balanced, the same on every rank.
TEST(RankShare, BalancedAndComplete) {
  std::vector<qrun::Batch> micro(8);
  const int64_t tokens[] = {900, 100, 800, 200, 700, 300, 600, 400};
  for (size_t i = 0; i < micro.size(); ++i) micro[i].real_tokens = tokens[i];
  std::vector<int> owner(micro.size(), -1);
  std::vector<int64_t> load(4, 0);
  for (int r = 0; r < 4; ++r)
    for (size_t i : qrun::rank_share(micro, r, 4)) {
      EXPECT_EQ(owner[i], -1) << "batch " << i << " given twice";
      owner[i] = r;
      load[r] += micro[i].real_tokens;
    }
  for (size_t i = 0; i < micro.size(); ++i) EXPECT_GE(owner[i], 0) << "batch " << i << " given to no rank";
  for (int r = 0; r < 4; ++r) EXPECT_EQ(load[r], 1000) << "rank " << r;
}

// AdamW (the fused kernel) against the update written out in fp64, one element at a time: plain
// steps, the clipping scale it divides the gradients by, and an update skipped through found_inf
// (nothing moves, the step count included); with fp32 parameters and with bf16 parameters plus
// fp32 masters.
TEST(AdamW, MatchesTheFormulaWithGradScaleAndFoundInf) {
  for (bool master : {false, true}) {
    const auto dt = master ? at::kBFloat16 : at::kFloat;
    at::manual_seed(3);
    at::Tensor p = at::randn({37}, at::kDouble).to(dt).set_requires_grad(true);
    qrun::AdamWOptions o;
    o.beta1 = 0.9, o.beta2 = 0.95, o.eps = 1e-8, o.weight_decay = 0.1, o.master_weights = master;
    qrun::AdamW opt({{"w", p}}, o);
    std::vector<double> x(37), m(37, 0.0), v(37, 0.0);
    at::Tensor p0 = p.detach().to(at::kDouble).contiguous();
    for (int i = 0; i < 37; ++i) x[i] = p0[i].item<double>();
    int t = 0;
    const double lr = 1e-2;
    // (gradient scale, skipped) per step: no scale, clipped by 4, skipped, no scale again.
    const std::vector<std::pair<double, bool>> plan = {{1.0, false}, {4.0, false}, {2.0, true}, {1.0, false}};
    for (const auto& [scale, skip] : plan) {
      at::Tensor g = at::randn({37}, at::kDouble);
      p.mutable_grad() = g.to(dt);
      at::Tensor gd = g.to(dt).to(at::kDouble);  // the gradient as the kernel sees it
      opt.step(lr, scale == 1.0 ? at::Tensor() : at::full({}, scale, at::kFloat),
               at::full({}, skip ? 1.0 : 0.0, at::kFloat));
      opt.zero_grad();
      if (skip) continue;
      ++t;
      for (int i = 0; i < 37; ++i) {
        const double gi = gd[i].item<double>() / scale;
        x[i] *= 1.0 - lr * o.weight_decay;
        m[i] = o.beta1 * m[i] + (1 - o.beta1) * gi;
        v[i] = o.beta2 * v[i] + (1 - o.beta2) * gi * gi;
        const double mh = m[i] / (1 - std::pow(o.beta1, t)), vh = v[i] / (1 - std::pow(o.beta2, t));
        x[i] -= lr * mh / (std::sqrt(vh) + o.eps);
      }
      if (!master) {  // fp32 parameters: the kernel's result within fp32 rounding of the formula
        at::Tensor got = p.detach().to(at::kDouble);
        for (int i = 0; i < 37; ++i) EXPECT_NEAR(got[i].item<double>(), x[i], 2e-6) << "step " << t << " element " << i;
      }
    }
    at::Tensor got = p.detach().to(at::kDouble);
    // bf16 parameters are rounded fp32 masters: within one bf16 rounding of the formula.
    for (int i = 0; i < 37; ++i)
      EXPECT_NEAR(got[i].item<double>(), x[i], master ? std::abs(x[i]) * 4e-3 + 1e-6 : 2e-6)
          << (master ? "bf16 with masters" : "fp32") << ", element " << i;
    EXPECT_EQ(opt.steps_taken(), 4);
  }
}
