// tests/model/test_util.h - helpers shared by the model and kernel tests: the plugin registry,
// batch builders (packed and padded, per batch.h), safetensors -> tensor loading, error metrics.
#pragma once

#include "plugin_loader.h"
#include "registry.h"
#include "safetensors.h"

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
  ModelKernels view() const {
    return ModelKernels{attention.get(), linear_attention.get(), conv1d.get(), ops.get()};
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

struct Sample {
  at::Tensor ids;     // int64 [L]
  at::Tensor labels;  // int64 [L]
};

inline Batch packed_batch(const std::vector<Sample>& s) {
  Batch b;
  b.layout = Layout::Packed;
  std::vector<at::Tensor> ids, labels, pos;
  std::vector<int64_t> cu = {0};
  std::vector<int32_t> sid;
  for (size_t i = 0; i < s.size(); ++i) {
    int64_t L = s[i].ids.size(0);
    ids.push_back(s[i].ids);
    labels.push_back(s[i].labels);
    pos.push_back(at::arange(L, at::kLong));
    cu.push_back(cu.back() + L);
    for (int64_t t = 0; t < L; ++t) sid.push_back(static_cast<int32_t>(i));
    b.seq.max_seqlen = std::max(b.seq.max_seqlen, L);
    b.loss_tokens += s[i].labels.narrow(0, 1, std::max<int64_t>(L - 1, 0)).ne(-100).sum().item<int64_t>();
  }
  b.input_ids = at::cat(ids);
  b.labels = at::cat(labels);
  b.position_ids = at::cat(pos);
  b.seq.layout = Layout::Packed;
  b.seq.cu_seqlens_host = cu;
  b.seq.cu_seqlens = at::tensor(cu, at::kLong).to(at::kInt);
  b.seq.seq_idx = at::tensor(sid, at::TensorOptions().dtype(at::kInt));
  b.real_tokens = cu.back();
  return b;
}

inline Batch padded_batch(const std::vector<Sample>& s) {
  Batch b;
  b.layout = Layout::Padded;
  int64_t B = static_cast<int64_t>(s.size()), S = 1;
  for (const auto& x : s) S = std::max(S, x.ids.size(0));
  b.input_ids = at::zeros({B, S}, at::kLong);
  b.labels = at::full({B, S}, -100, at::kLong);
  b.position_ids = at::zeros({B, S}, at::kLong);
  b.seq.attention_mask = at::zeros({B, S}, at::kBool);
  b.seq.seq_idx = at::full({B, S}, -1, at::kInt);
  std::vector<int64_t> cu = {0};
  for (int64_t i = 0; i < B; ++i) {
    int64_t L = s[i].ids.size(0);
    b.input_ids[i].narrow(0, 0, L).copy_(s[i].ids);
    b.labels[i].narrow(0, 0, L).copy_(s[i].labels);
    b.position_ids[i].narrow(0, 0, L).copy_(at::arange(L, at::kLong));
    b.seq.attention_mask[i].narrow(0, 0, L).fill_(true);
    b.seq.seq_idx[i].narrow(0, 0, L).fill_(static_cast<int32_t>(i));
    cu.push_back(cu.back() + L);
    b.seq.max_seqlen = std::max(b.seq.max_seqlen, L);
  }
  b.seq.layout = Layout::Padded;
  b.seq.cu_seqlens_host = cu;
  b.seq.cu_seqlens = at::tensor(cu, at::kLong).to(at::kInt);
  b.real_tokens = cu.back();
  b.padding_tokens = B * S - cu.back();
  return b;
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
