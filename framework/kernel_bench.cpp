// framework/kernel_bench.cpp - see kernel_bench.h.
#include "kernel_bench.h"

#include "kernel_backend.h"
#include "session.h"
#include "text.h"

#include <qrun/sdk/kernels.h>
#include <qrun/sdk/ops.h>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/DeviceAccelerator.h>
#include <torch/cuda.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>

namespace qrun {
namespace {

struct Timing {
  double fwd_ms = NAN, step_ms = NAN;  // forward; forward + backward
  double peak_mib = NAN;               // peak memory above what the inputs hold, forward + backward
};

// One way of computing the operation: a forward over leaves (fresh each call); the benchmark
// backpropagates sum(out * cotangent) through it.
using Variant = std::function<at::Tensor(const std::vector<at::Tensor>&)>;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? NAN : v[v.size() / 2];
}

Timing time_variant(const Variant& f, const std::vector<at::Tensor>& inputs, int iters) {
  const at::Device dev = inputs.front().device();
  std::vector<at::Tensor> leaves;
  for (const auto& t : inputs) {
    at::Tensor l = t.detach();
    if (l.is_floating_point()) l.requires_grad_(true);
    leaves.push_back(l);
  }
  at::Tensor cot;
  auto fwd = [&] {
    at::NoGradGuard ng;
    return f(leaves);
  };
  // The backward straight from a random cotangent of the output's own dtype (no extra ops).
  auto step = [&] {
    at::Tensor o = f(leaves);
    if (!cot.defined()) cot = at::randn(o.sizes(), o.options());
    std::vector<at::Tensor> req;
    for (const auto& l : leaves)
      if (l.requires_grad()) req.push_back(l);
    torch::autograd::grad({o}, req, {cot}, false, false, true);
  };
  auto clock = [&](const std::function<void()>& g) {
    std::vector<double> ms;
    for (int i = 0; i < 2; ++i) g();  // warm-up: allocator pools, cuBLAS handles, plans
    torch::cuda::synchronize();
    for (int i = 0; i < iters; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      g();
      torch::cuda::synchronize();
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    return median(ms);
  };
  Timing t;
  t.fwd_ms = clock([&] { (void)fwd(); });
  t.step_ms = clock(step);
  torch::cuda::synchronize();
  at::accelerator::resetPeakStats(dev.index());
  auto stats = at::accelerator::getDeviceStats(dev.index());
  constexpr auto kAll = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  const double now = static_cast<double>(stats.allocated_bytes[kAll].current) / (1 << 20);
  step();
  torch::cuda::synchronize();
  t.peak_mib = peak_device_memory_mib(dev).first - now;
  return t;
}

struct Bench {
  std::string what;                                        // the case, with its shape
  std::vector<at::Tensor> inputs;                          // on the device
  std::vector<std::pair<std::string, Variant>> variants;   // the backend, the reference, anchors
};

at::Tensor rnd(std::vector<int64_t> s, const at::Device& d, c10::ScalarType dt, double scale = 1.0) {
  return (at::randn(s, at::TensorOptions().device(d)) * scale).to(dt);
}

SeqInfo packed_seq(const std::vector<int64_t>& lens, const at::Device& dev) {
  SeqInfo s;
  s.layout = Layout::Packed;
  s.cu_seqlens_host = {0};
  std::vector<int32_t> sid;
  for (size_t i = 0; i < lens.size(); ++i) {
    s.cu_seqlens_host.push_back(s.cu_seqlens_host.back() + lens[i]);
    s.max_seqlen = std::max(s.max_seqlen, lens[i]);
    sid.insert(sid.end(), lens[i], static_cast<int32_t>(i));
  }
  s.cu_seqlens = at::tensor(s.cu_seqlens_host, at::kLong).to(at::kInt).to(dev);
  s.seq_idx = at::tensor(sid, at::TensorOptions().dtype(at::kInt)).to(dev);
  return s;
}

// The 27B layer shapes: 8,192 tokens of a chat-like mix of sample lengths.
const std::vector<int64_t> kLens = {900, 3000, 17, 1, 2048, 2226};
constexpr int64_t kT = 8192;

std::vector<Bench> attention_benches(Attention& backend, Attention& ref, const at::Device& d) {
  SeqInfo seq = packed_seq(kLens, d);
  const double scale = 1.0 / 16.0;
  Bench b;
  b.what = "attention q [8192, 24, 256], kv [8192, 4, 256] bf16, samples 900/3000/17/1/2048/2226";
  b.inputs = {rnd({kT, 24, 256}, d, at::kBFloat16), rnd({kT, 4, 256}, d, at::kBFloat16),
              rnd({kT, 4, 256}, d, at::kBFloat16)};
  b.variants.emplace_back("backend", [&backend, seq, scale](const std::vector<at::Tensor>& x) {
    return backend.forward(x[0], x[1], x[2], seq, scale);
  });
  b.variants.emplace_back("reference (sdpa plugin, fp32 [L, L])", [&ref, seq, scale](const std::vector<at::Tensor>& x) {
    return ref.forward(x[0], x[1], x[2], seq, scale);
  });
  // What a LibTorch user writes for a packed batch: SDPA per sample (it picks flash, efficient
  // or cuDNN attention itself), kv heads expanded by enable_gqa.
  b.variants.emplace_back("LibTorch SDPA per sample", [seq, scale](const std::vector<at::Tensor>& x) {
    std::vector<at::Tensor> outs;
    for (int64_t i = 0; i < seq.num_seqs(); ++i) {
      const int64_t s0 = seq.cu_seqlens_host[i], n = seq.seq_len(i);
      auto h = [&](const at::Tensor& t) { return t.narrow(0, s0, n).transpose(0, 1).unsqueeze(0); };
      outs.push_back(at::scaled_dot_product_attention(h(x[0]), h(x[1]), h(x[2]), {}, 0.0, true, scale, true)
                         .squeeze(0)
                         .transpose(0, 1));
    }
    return at::cat(outs, 0);
  });
  return {b};
}

std::vector<Bench> conv_benches(Conv1d& backend, Conv1d& ref, const at::Device& d) {
  SeqInfo seq = packed_seq(kLens, d);
  Bench b;
  b.what = "conv1d x [8192, 10240] bf16, w [10240, 4], SiLU";
  b.inputs = {rnd({kT, 10240}, d, at::kBFloat16), rnd({10240, 4}, d, at::kBFloat16, 0.5)};
  b.variants.emplace_back("backend", [&backend, seq](const std::vector<at::Tensor>& x) {
    return backend.forward(x[0], x[1], seq, Activation::SiLU);
  });
  b.variants.emplace_back("reference (conv-reference)", [&ref, seq](const std::vector<at::Tensor>& x) {
    return ref.forward(x[0], x[1], seq, Activation::SiLU);
  });
  return {b};
}

std::vector<Bench> ops_benches(const OpTable& own, const OpTable& ref, const at::Device& d) {
  std::vector<Bench> out;
  const auto bf = at::kBFloat16;
  auto add = [&](const char* op, std::string what, std::vector<at::Tensor> in,
                 std::function<Variant(const OpTable&)> make) {
    bool mine = false;
    for (const auto& [name, p] : own.providers()) mine = mine || name == op;
    if (!mine) return;
    Bench b;
    b.what = std::move(what);
    b.inputs = std::move(in);
    b.variants.emplace_back("backend", make(own));
    b.variants.emplace_back("reference (ATen ops)", make(ref));
    out.push_back(std::move(b));
  };
  add(op::RmsNorm::kName, "rms_norm [8192, 5120] bf16, (1 + w)",
      {rnd({kT, 5120}, d, bf), rnd({5120}, d, bf, 0.1)}, [](const OpTable& t) -> Variant {
        auto f = t.get<op::RmsNorm>();
        return [f](const std::vector<at::Tensor>& x) { return f(x[0], x[1], 1e-6, true); };
      });
  add(op::AddRmsNorm::kName, "add_rms_norm [8192, 5120] bf16 (residual add + norm)",
      {rnd({kT, 5120}, d, bf), rnd({kT, 5120}, d, bf), rnd({5120}, d, bf, 0.1)}, [](const OpTable& t) -> Variant {
        auto f = t.get<op::AddRmsNorm>();
        return [f](const std::vector<at::Tensor>& x) {
          auto [y, s] = f(x[0], x[1], x[2], 1e-6, true);
          return at::cat({y, s}, -1);
        };
      });
  add(op::GatedRmsNorm::kName, "gated_rms_norm [8192, 48, 128] bf16, fp32 weight",
      {rnd({kT, 48, 128}, d, bf), rnd({kT, 48, 128}, d, bf), rnd({128}, d, at::kFloat, 0.1) + 1.0},
      [](const OpTable& t) -> Variant {
        auto f = t.get<op::GatedRmsNorm>();
        return [f](const std::vector<at::Tensor>& x) { return f(x[0], x[1], x[2], 1e-6); };
      });
  add(op::SwiGlu::kName, "swiglu [8192, 17408] bf16",
      {rnd({kT, 17408}, d, bf), rnd({kT, 17408}, d, bf)}, [](const OpTable& t) -> Variant {
        auto f = t.get<op::SwiGlu>();
        return [f](const std::vector<at::Tensor>& x) { return f(x[0], x[1]); };
      });
  {
    at::Tensor pos = at::arange(kT, at::TensorOptions().device(d).dtype(at::kFloat)).unsqueeze(-1);
    at::Tensor inv = 1.0 / at::pow(1e7, at::arange(0, 64, 2, at::TensorOptions().device(d).dtype(at::kFloat)) / 64.0);
    at::Tensor ang = at::cat({pos * inv, pos * inv}, -1).unsqueeze(-2);
    add(op::QkNormRope::kName, "qk_norm_rope [8192, 24, 256] bf16 (query half of [8192, 24, 512]), rope 64",
        {rnd({kT, 24, 512}, d, bf), rnd({256}, d, bf, 0.1), ang.cos().to(bf), ang.sin().to(bf)},
        [](const OpTable& t) -> Variant {
          auto f = t.get<op::QkNormRope>();
          return [f](const std::vector<at::Tensor>& x) { return f(x[0].narrow(-1, 0, 256), x[1], 1e-6, true, x[2], x[3]); };
        });
  }
  {
    at::Tensor targets = at::randint(248320, {kT}, at::TensorOptions().device(d).dtype(at::kLong));
    add(op::LinearCrossEntropy::kName, "linear_cross_entropy_sum [8192, 5120] x [248320, 5120] bf16",
        {rnd({kT, 5120}, d, bf), rnd({248320, 5120}, d, bf, 0.02), targets}, [](const OpTable& t) -> Variant {
          auto f = t.get<op::LinearCrossEntropy>();
          return [f](const std::vector<at::Tensor>& x) { return f(x[0], x[1], x[2]); };
        });
  }
  return out;
}

}  // namespace

int run_kernel_bench(const std::vector<std::string>& args, const Registry& registry) {
  const char* usage = "usage: qrun check --bench <kind>/<name> [--iters N]   (attention, conv1d or ops; CUDA)\n";
  std::string target;
  int iters = 10;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--bench") continue;
    if (args[i] == "--iters" && i + 1 < args.size()) {
      iters = std::max(1, std::atoi(args[++i].c_str()));
      continue;
    }
    if (!target.empty() || args[i].find('/') == std::string::npos) {
      fmt::print("{}", usage);
      return 2;
    }
    target = args[i];
  }
  if (target.empty()) {
    fmt::print("{}", usage);
    return 2;
  }
  const std::string kind = target.substr(0, target.find('/')), name = target.substr(target.find('/') + 1);
  if (!torch::cuda::is_available()) {
    fmt::print("qrun check --bench runs on CUDA only (the 27B shapes on a GPU); no CUDA device here\n");
    return 2;
  }
  const at::Device dev(at::kCUDA, 0);
  auto create = [&](const std::string& n) {
    const RegistryEntry& e = registry.get(kind, n);
    std::map<std::string, Value> v;
    for (const auto& f : e.info.schema.fields()) v[f.name] = f.default_value;
    return e.info.factory(Config("kernels." + kind, v));
  };
  std::unique_ptr<Component> backend, ref;
  std::vector<Bench> benches;
  OpTable own, all;
  try {
    if (kind == Attention::kKind) {
      backend = create(name), ref = create("sdpa");
      benches = attention_benches(static_cast<Attention&>(*backend), static_cast<Attention&>(*ref), dev);
    } else if (kind == Conv1d::kKind) {
      backend = create(name), ref = create("conv-reference");
      benches = conv_benches(static_cast<Conv1d&>(*backend), static_cast<Conv1d&>(*ref), dev);
    } else if (kind == Ops::kKind) {
      backend = create(name), ref = create("reference");
      static_cast<Ops&>(*backend).provide(own, name);
      static_cast<Ops&>(*ref).provide(all, "reference");
      benches = ops_benches(own, all, dev);
    } else {
      fmt::print("qrun check --bench: kind '{}' has no benchmark here (attention, conv1d, ops; the gated "
                 "delta rule's is kernels/gated_delta/bench)\n", kind);
      return 2;
    }
  } catch (const UserError& e) {
    fmt::print("qrun check --bench {}: {}\n", target, e.what());
    return 2;
  }
  fmt::print("qrun check --bench {} on {}: median of {} after 2 warm-ups, host clock around a device sync\n",
             target, device_info(dev, Config("train", {{"peak_tflops", 0.0}})).name, iters);
  fmt::print("{:<44} {:>10} {:>12} {:>14}\n", "variant", "fwd ms", "fwd+bwd ms", "peak extra MiB");
  for (const Bench& b : benches) {
    fmt::print("\n{}\n", b.what);
    for (const auto& [label, f] : b.variants) {
      try {
        Timing t = time_variant(f, b.inputs, iters);
        fmt::print("  {:<42} {:>10.3f} {:>12.3f} {:>14.0f}\n", label == "backend" ? name : label, t.fwd_ms,
                   t.step_ms, t.peak_mib);
      } catch (const std::exception& e) {
        fmt::print("  {:<42} failed: {}\n", label == "backend" ? name : label, std::string(e.what()).substr(0, std::string(e.what()).find('\n')));
      }
    }
  }
  return 0;
}

}  // namespace qrun
