// tests/model/test_util.h - helpers shared by the model and kernel tests: the plugin registry,
// batch builders (packed and padded, per batch.h), safetensors -> tensor loading, error metrics.
#pragma once

#include "plugin_loader.h"
#include "registry.h"
#include "safetensors.h"
#include "support/batches.h"

#include <qrun/sdk/batch.h>
#include <qrun/sdk/kernels.h>
#include <qrun/sdk/model.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace qrun::test {

inline Registry& registry() {
  static Registry* r = [] {
    auto* reg = new Registry();
    bool ok1 = load_plugin(*reg, QRUN_TEST_REF_PLUGIN);
    bool ok2 = load_plugin(*reg, QRUN_TEST_QWEN_PLUGIN);
    for (const auto& f : reg->failures()) fmt::print(stderr, "plugin failure {}: {}\n", f.path, f.reason);
    QRUN_ASSERT(ok1 && ok2, "test plugins failed to load");
    return reg;
  }();
  return *r;
}

struct Kernels {
  std::unique_ptr<Attention> attention;
  std::unique_ptr<LinearAttention> linear_attention;
  std::unique_ptr<Conv1d> conv1d;
  std::unique_ptr<Ops> ops;
  OpTable table;  // ops' operations (sdk ops.h)
  ModelKernels view() const {
    return ModelKernels{attention.get(), linear_attention.get(), conv1d.get(), &table};
  }
};

inline Config empty_config(const std::string& path) { return Config(path, {}); }

inline Kernels reference_kernels() {
  Kernels k;
  auto& r = registry();
  k.attention = r.create<Attention>("sdpa", empty_config("kernels.attention"));
  k.linear_attention = r.create<LinearAttention>(
      "gdn-reference", Config("kernels.linear_attention", {{"chunk_size", int64_t{64}}}));
  k.conv1d = r.create<Conv1d>("conv-reference", empty_config("kernels.conv1d"));
  k.ops = r.create<Ops>("reference", empty_config("kernels.ops"));
  k.ops->provide(k.table, "reference");
  return k;
}

inline Config model_config(std::map<std::string, Value> v) {
  std::map<std::string, Value> d = {{"preset", std::string("none")},
                                    {"num_layers", int64_t{0}},
                                    {"activation_checkpointing", std::string("none")},
                                    {"revision", std::string("main")},
                                    {"save_shard_bytes", int64_t{4} << 30}};
  for (auto& kv : v) d[kv.first] = kv.second;
  return Config("model", d);
}

inline std::map<std::string, at::Tensor> load_safetensors(const std::string& path) {
  auto f = safetensors::open(path);
  std::map<std::string, at::Tensor> out;
  for (const auto& t : f.header.tensors) {
    c10::ScalarType dt = t.dtype == "F32" ? at::kFloat
                         : t.dtype == "F64" ? at::kDouble
                         : t.dtype == "I64" ? at::kLong
                         : t.dtype == "BF16" ? at::kBFloat16
                                             : at::kInt;
    at::Tensor x = at::empty(t.shape, dt);
    std::memcpy(x.data_ptr(), f.tensor_data(t), t.end - t.begin);
    out[t.name] = x;
  }
  return out;
}

// max |a - b| / max |b| (relative to the reference's scale).
inline double rel_err(const at::Tensor& a, const at::Tensor& b) {
  at::Tensor af = a.detach().to(at::kDouble), bf = b.detach().to(at::kDouble);
  double den = bf.abs().max().item<double>();
  return (af - bf).abs().max().item<double>() / std::max(den, 1e-30);
}

inline double abs_err(const at::Tensor& a, const at::Tensor& b) {
  return (a.detach().to(at::kDouble) - b.detach().to(at::kDouble)).abs().max().item<double>();
}

}  // namespace qrun::test
