// tests/fla-gated-delta/test_fla_gated_delta.cpp - the `fla-gated-delta` linear_attention plugin.
//
//   fla_gdn_test cpu   [plugin dir]  CI: the plugin loads (ABI descriptor, registration) and
//                                    refuses CPU tensors with a clear UserError; `qrun check`
//                                    reports it as unsupported on a machine without CUDA.
//   fla_gdn_test gpu   [plugin dir]  GPU machine (exit 77 + "SKIP:" without CUDA): clear errors for
//                                    fp32 / odd head sizes; strided views, budget padding and the
//                                    boundary cache; `qrun check linear_attention/fla-gated-delta`
//                                    (bf16 grid); the qwen model (0.8b preset cut to 4 layers, bf16)
//                                    packed == one-by-one == padded with this backend and close to
//                                    gdn-reference; a few AdamW steps with each backend.
//   fla_gdn_test bench [plugin dir]  layer timings at the 27B head config (not a test).
//
// It links only framework/{check,registry,text}.cpp and LibTorch (no Boost/yaml/spdlog) and loads
// the plugin libraries with dlopen, so it also builds and runs on the GPU machines, which lack
// those libraries. The plugin dir holds libqrun-{fla-gated-delta,reference-kernels,qwen}.so.
#include "check.h"
#include "registry.h"
#include "support/batches.h"

#include "gated_delta.h"

#include <qrun/sdk/kernels.h>
#include <qrun/sdk/model.h>
#include <qrun/sdk/plugin.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/optim/adamw.h>
#include <torch/cuda.h>

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

using namespace qrun;

namespace {

int g_failures = 0;
// The reverse pass `backward_operands: auto` took in unit_gpu ("fp16" or "bf16x2"; it depends on
// the GPU, see kernels/gated_delta/gated_delta.h), so that `qrun check` can force the other one.
std::string g_auto_backward;

void expect(bool ok, const std::string& what) {
  std::printf("  [%s] %s\n", ok ? "ok" : "FAIL", what.c_str());
  std::fflush(stdout);
  if (!ok) ++g_failures;
}

// Not framework/plugin_loader.cpp: it needs Boost.DLL's libraries, which the GPU machine lacks
// (this test also builds there from device/CMakeLists.txt); the descriptor checks are the same.
struct Reg : Registrar {
  Registry& reg;
  std::shared_ptr<PluginOrigin> origin = std::make_shared<PluginOrigin>();
  explicit Reg(Registry& r) : reg(r) {}
  void add_component(ComponentInfo info) override { reg.add(std::move(info), origin); }
  LogSink log_sink() const override { return &qrun::detail::stderr_sink; }
};

// dlopen + the descriptor checks the host makes (ABI, LibTorch, C++ ABI), then registration.
bool load(Registry& r, const std::string& path, const char* expect_name) {
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    std::printf("dlopen %s: %s\n", path.c_str(), dlerror());
    return false;
  }
  auto fn = reinterpret_cast<qrun_plugin_entry_fn>(dlsym(h, QRUN_ENTRY_SYMBOL));
  if (!fn) {
    std::printf("%s: no %s symbol\n", path.c_str(), QRUN_ENTRY_SYMBOL);
    return false;
  }
  const qrun_plugin_descriptor_t* d = fn();
  const bool ok = d->abi_version == QRUN_ABI_VERSION &&
                  std::strcmp(d->torch_version, TORCH_VERSION) == 0 &&
                  d->cxx11_abi == _GLIBCXX_USE_CXX11_ABI && std::strcmp(d->name, expect_name) == 0;
  if (!ok) {
    std::printf("%s: descriptor mismatch (abi %u, torch %s, name %s)\n", path.c_str(),
                d->abi_version, d->torch_version, d->name);
    return false;
  }
  Reg reg(r);
  reg.origin->path = path;
  reg.origin->name = d->name;
  d->register_components(&reg);
  return true;
}

SeqInfo packed_seq(const std::vector<int64_t>& lens, const at::Device& dev) {
  SeqInfo s;
  s.layout = Layout::Packed;
  s.cu_seqlens_host = {0};
  for (int64_t l : lens) {
    s.cu_seqlens_host.push_back(s.cu_seqlens_host.back() + l);
    s.max_seqlen = std::max(s.max_seqlen, l);
  }
  s.cu_seqlens = at::tensor(s.cu_seqlens_host, at::kLong).to(at::kInt).to(dev);
  return s;
}

struct Inputs {
  at::Tensor q, k, v, a, b, A_log, dt_bias;
  std::vector<at::Tensor> all() const { return {q, k, v, a, b, A_log, dt_bias}; }
  GatedDeltaInputs gdn() const { return {q, k, v, a, b, A_log, dt_bias}; }
};

Inputs random_inputs(int64_t T, int64_t H, int64_t HV, int64_t D, const at::Device& dev,
                     c10::ScalarType dt, uint64_t seed) {
  auto g = at::make_generator<at::CPUGeneratorImpl>(seed);
  Inputs in;
  in.q = at::randn({T, H, D}, g).to(dev, dt);
  in.k = at::randn({T, H, D}, g).to(dev, dt);
  in.v = at::randn({T, HV, D}, g).to(dev, dt);
  in.a = at::randn({T, HV}, g).to(dev, dt);
  in.b = at::randn({T, HV}, g).to(dev, dt);
  in.A_log = (at::rand({HV}, g) * 7.5 + 0.5).log().to(dev);
  in.dt_bias = (at::randn({HV}, g) * 0.5).to(dev);
  for (at::Tensor* t : {&in.q, &in.k, &in.v, &in.a, &in.b, &in.A_log, &in.dt_bias})
    t->requires_grad_(true);
  return in;
}

// Norm-wise relative difference.
double nrel(const at::Tensor& a, const at::Tensor& b) {
  at::Tensor x = a.detach().to(at::kDouble).cpu(), y = b.detach().to(at::kDouble).cpu();
  const double den = y.norm().item<double>();
  const double e = (x - y).norm().item<double>() / std::max(den, 1e-30);
  return std::isnan(e) ? INFINITY : e;
}

template <class F>
std::string user_error_of(F&& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.message();
  } catch (const std::exception& e) {
    return std::string("<not a UserError> ") + e.what();
  }
  return "<no error>";
}

bool contains(const std::string& s, const char* what) { return s.find(what) != std::string::npos; }

// ------------------------------------------------------------------------------------------------

int test_cpu(Registry& r) {
  std::printf("fla-gated-delta CPU test\n");
  auto fla = r.create<LinearAttention>("fla-gated-delta", Config("kernels.linear_attention", {}));
  expect(fla != nullptr, "linear_attention/fla-gated-delta is registered and created");
  Inputs in = random_inputs(5, 1, 1, 128, at::Device(at::kCPU), at::kBFloat16, 1);
  std::string msg = user_error_of([&] { fla->forward(in.gdn(), packed_seq({5}, at::kCPU), {}); });
  std::printf("  CPU tensors -> %s\n", msg.c_str());
  expect(contains(msg, "CUDA only") && contains(msg, "gdn-reference") && contains(msg, "cpu"),
         "CPU tensors give a UserError naming CUDA and the gdn-reference alternative");
  if (!at::hasCUDA()) {
    int rc = run_check({"linear_attention/fla-gated-delta"}, r);
    expect(rc == 2, "without CUDA, `qrun check linear_attention/fla-gated-delta` reports every "
                    "setting unsupported and fails (rc 2)");
  }
  return g_failures == 0 ? 0 : 1;
}

// ------------------------------------------------------------------------------------------------

struct Grads {
  at::Tensor out;
  std::vector<at::Tensor> g;
};

Grads run(LinearAttention& la, const Inputs& in, const SeqInfo& seq, const at::Tensor& w) {
  for (const auto& t : in.all()) t.mutable_grad() = at::Tensor();
  at::Tensor o = la.forward(in.gdn(), seq, {});
  (o.to(at::kFloat) * w).sum().backward();
  Grads r{o.detach()};
  for (const auto& t : in.all()) r.g.push_back(t.grad().defined() ? t.grad().clone() : at::Tensor());
  return r;
}

double worst(const Grads& x, const Grads& y) {
  double e = nrel(x.out, y.out);
  for (size_t i = 0; i < x.g.size(); ++i) e = std::max(e, nrel(x.g[i], y.g[i]));
  return e;
}

void unit_gpu(Registry& r) {
  const at::Device cuda(at::kCUDA, 0);
  auto fla = r.create<LinearAttention>("fla-gated-delta", Config("kernels.linear_attention", {}));
  auto ref = r.create<LinearAttention>("gdn-reference",
                                       Config("kernels.linear_attention", {{"chunk_size", int64_t{64}}}));
  std::printf("unit checks on CUDA\n");
  {
    Inputs f32 = random_inputs(9, 1, 2, 128, cuda, at::kFloat, 2);
    std::string m = user_error_of([&] { fla->forward(f32.gdn(), packed_seq({9}, cuda), {}); });
    std::printf("  fp32 q/k/v -> %s\n", m.c_str());
    expect(contains(m, "bfloat16") && contains(m, "gdn-reference") && contains(m, "Float"),
           "fp32 q/k/v give a UserError naming bfloat16 and gdn-reference");
    Inputs d64 = random_inputs(9, 1, 2, 64, cuda, at::kBFloat16, 2);
    m = user_error_of([&] { fla->forward(d64.gdn(), packed_seq({9}, cuda), {}); });
    std::printf("  K = V = 64 -> %s\n", m.c_str());
    expect(contains(m, "K = V = 128"), "head dim 64 gives a UserError naming the supported size");
  }
  // Strided views (as the model slices q/k/v out of the conv output) == contiguous inputs.
  {
    const int64_t T = 300, H = 2, HV = 4, D = 128;
    auto g = at::make_generator<at::CPUGeneratorImpl>(3);
    at::Tensor big = at::randn({T, 2 * H * D + HV * D}, g).to(cuda, at::kBFloat16).requires_grad_(true);
    at::Tensor ab = at::randn({T, 2 * HV + 3}, g).to(cuda, at::kBFloat16).requires_grad_(true);
    Inputs s = random_inputs(T, H, HV, D, cuda, at::kBFloat16, 4);
    s.q = big.narrow(1, 0, H * D).view({T, H, D});
    s.k = big.narrow(1, H * D, H * D).view({T, H, D});
    s.v = big.narrow(1, 2 * H * D, HV * D).view({T, HV, D});
    s.a = ab.narrow(1, 0, HV);
    s.b = ab.narrow(1, HV + 3, HV);
    Inputs c = s;
    for (at::Tensor* t : {&c.q, &c.k, &c.v, &c.a, &c.b})
      *t = t->detach().contiguous().requires_grad_(true);
    SeqInfo seq = packed_seq({100, 37, 163}, cuda);
    at::Tensor w = at::randn({T, HV, D}, g).to(cuda);
    at::Tensor o1 = fla->forward(s.gdn(), seq, {});
    (o1.to(at::kFloat) * w).sum().backward();
    Grads gc = run(*fla, c, seq, w);
    at::Tensor gbig = big.grad(), gab = ab.grad();
    double e = nrel(o1, gc.out);
    e = std::max(e, nrel(gbig.narrow(1, 0, H * D).view({T, H, D}), gc.g[0]));
    e = std::max(e, nrel(gbig.narrow(1, 2 * H * D, HV * D).view({T, HV, D}), gc.g[2]));
    e = std::max(e, nrel(gab.narrow(1, HV + 3, HV), gc.g[4]));
    expect(e == 0, fmt::format("strided views give bitwise the results of contiguous inputs (diff {:.2e})", e));
  }
  // Packed stream with budget padding after the last sample; boundary cache switching batches.
  {
    const int64_t T = 200, H = 1, HV = 3, D = 128;
    Inputs in = random_inputs(T, H, HV, D, cuda, at::kBFloat16, 5);
    at::Tensor w = at::randn({T, HV, D}, at::make_generator<at::CPUGeneratorImpl>(6)).to(cuda);
    SeqInfo s1 = packed_seq({70, 60, 50}, cuda);   // 20 tokens of budget padding
    SeqInfo s2 = packed_seq({200}, cuda);
    Grads f1 = run(*fla, in, s1, w);
    Grads f2 = run(*fla, in, s2, w);
    Grads f1b = run(*fla, in, s1, w);  // cache must switch back
    Grads r1 = run(*ref, in, s1, w), r2 = run(*ref, in, s2, w);
    const double tail = f1.out.narrow(0, 180, 20).abs().max().item<double>() +
                        f1.g[0].narrow(0, 180, 20).abs().max().item<double>() +
                        f1.g[3].narrow(0, 180, 20).abs().max().item<double>();
    expect(tail == 0, "tokens after the last sample get o = 0 and zero gradients");
    const double e1 = worst(f1, r1), e2 = worst(f2, r2), e3 = worst(f1b, f1);
    // Both sides store bf16 outputs and gradients (~1.5e-3 norm-wise rounding each, 4e-3 seen);
    // a boundary bug shows as O(1).
    expect(e1 < 1e-2 && e2 < 1e-2 && e3 == 0,
           fmt::format("budget padding / one long sample / cached plan switching: norm-wise diff "
                       "vs gdn-reference {:.2e}, {:.2e} (bound 1e-2); repeat {:.2e}", e1, e2, e3));
    // Gradients w.r.t. fp32 a/b (accepted as is).
    Inputs f = in;
    f.a = in.a.detach().to(at::kFloat).requires_grad_(true);
    f.b = in.b.detach().to(at::kFloat).requires_grad_(true);
    Grads ff = run(*fla, f, s1, w), rf = run(*ref, f, s1, w);
    expect(worst(ff, rf) < 5e-3, fmt::format("fp32 a and b: diff vs gdn-reference {:.2e}", worst(ff, rf)));
    // forward_operands: bf16x2 (the recipe option) against the default fp16 forward: the outputs
    // differ by the fp16 operand rounding only; the backward's prep (kept from the fp16 forward,
    // computed by the backward after the bf16x2 one) and everything after it are the same, so
    // the gradients are bitwise the same.
    auto fla_x = r.create<LinearAttention>(
        "fla-gated-delta", Config("kernels.linear_attention", {{"forward_operands", std::string("bf16x2")}}));
    Grads fx = run(*fla_x, in, s1, w);
    const double eo = nrel(fx.out, f1.out), ex = nrel(fx.out, r1.out);
    double eg = 0;
    for (size_t i = 0; i < fx.g.size(); ++i) eg = std::max(eg, nrel(fx.g[i], f1.g[i]));
    expect(eo < 3e-3 && ex < 1e-2 && eg == 0,
           fmt::format("forward_operands bf16x2: o vs the fp16 forward {:.2e} (bound 3e-3), vs gdn-reference "
                       "{:.2e}; gradients identical (diff {:.2e})", eo, ex, eg));
    // backward_operands: each reverse pass forced (auto picks by GPU and batch size: fp16 on
    // sm_90, elsewhere bf16x2 for this small batch): gradients against gdn-reference, fp16 against
    // bf16x2, and auto bitwise one of the two
    Grads gb[2];
    const char* modes[2] = {"fp16", "bf16x2"};
    for (int i = 0; i < 2; ++i) {
      auto fb = r.create<LinearAttention>(
          "fla-gated-delta", Config("kernels.linear_attention", {{"backward_operands", std::string(modes[i])}}));
      gb[i] = run(*fb, in, s1, w);
      expect(worst(gb[i], r1) < 1e-2, fmt::format("backward_operands {}: gradients vs gdn-reference {:.2e} (bound 1e-2)",
                                                  modes[i], worst(gb[i], r1)));
    }
    const double a16 = worst(gb[0], f1), a2 = worst(gb[1], f1);
    g_auto_backward = a16 == 0 ? "fp16" : a2 == 0 ? "bf16x2" : "";
    expect(worst(gb[0], gb[1]) < 5e-3 && !g_auto_backward.empty(),
           fmt::format("backward_operands: fp16 vs bf16x2 gradients {:.2e} (bound 5e-3); auto is bitwise "
                       "one of them (vs fp16 {:.2e}, vs bf16x2 {:.2e}): {}",
                       worst(gb[0], gb[1]), a16, a2, g_auto_backward.empty() ? "neither" : g_auto_backward));
    // keep_prep (on by default: the forward's prep kept for the backward) off gives bitwise the
    // same gradients, and so does a second backward through the same graph (retain_graph), which
    // reads the kept workspace again.
    auto fnk = r.create<LinearAttention>("fla-gated-delta", Config("kernels.linear_attention", {{"keep_prep", false}}));
    Grads gk = run(*fnk, in, s1, w);
    for (const auto& t : in.all()) t.mutable_grad() = at::Tensor();
    at::Tensor loss = (fla->forward(in.gdn(), s1, {}).to(at::kFloat) * w).sum();
    auto ga = torch::autograd::grad({loss}, in.all(), {}, /*retain_graph=*/true, false, /*allow_unused=*/true);
    auto gz = torch::autograd::grad({loss}, in.all(), {}, /*retain_graph=*/false, false, /*allow_unused=*/true);
    double er = 0;
    for (size_t i = 0; i < ga.size(); ++i) er = std::max({er, nrel(ga[i], gz[i]), nrel(ga[i], f1.g[i])});
    expect(worst(gk, f1) == 0 && er == 0,
           fmt::format("keep_prep: false gives the default's gradients bitwise (diff {:.2e}); a second "
                       "backward through the same graph too (diff {:.2e})", worst(gk, f1), er));
  }
}

// ------------------------------------------------------------------------------------------------
// The qwen model with this backend.

// Samples whose labels are their ids, as a batch on `dev`.
Batch packed_on(const std::vector<at::Tensor>& ids, const at::Device& dev) {
  std::vector<test::Sample> s;
  for (const auto& x : ids) s.push_back({x, x});
  return test::packed_batch(s).to(dev);
}

Batch padded_on(const std::vector<at::Tensor>& ids, const at::Device& dev) {
  std::vector<test::Sample> s;
  for (const auto& x : ids) s.push_back({x, x});
  return test::padded_batch(s).to(dev);
}

struct ModelKit {
  std::unique_ptr<Model> model;
  std::unique_ptr<Attention> att;
  std::unique_ptr<LinearAttention> gdn;
  std::unique_ptr<Conv1d> conv;
  std::unique_ptr<Ops> ops;
  OpTable table;
};

// The 0.8b preset (Gated DeltaNet heads 16 x 128, as in every Qwen3.5 size) cut to 4 layers:
// 3 GDN layers + 1 full-attention layer, bf16 parameters and compute, seed 3.
ModelKit make_model(Registry& r, const std::string& gdn_backend) {
  ModelKit k;
  Config mc("model", {{"preset", std::string("0.8b")}, {"num_layers", int64_t{4}},
                      {"activation_checkpointing", std::string("none")},
                      {"save_shard_bytes", int64_t{1} << 30}});
  k.model = r.create<Model>("qwen", mc);
  k.att = r.create<Attention>("sdpa", Config("a", {}));
  k.gdn = gdn_backend == "gdn-reference"
              ? r.create<LinearAttention>(gdn_backend, Config("g", {{"chunk_size", int64_t{64}}}))
              : r.create<LinearAttention>(gdn_backend, Config("g", {}));
  k.conv = r.create<Conv1d>("conv-reference", Config("c", {}));
  k.ops = r.create<Ops>("reference", Config("o", {}));
  k.ops->provide(k.table, "reference");
  ModelPlacement p;
  p.device = at::Device(at::kCUDA, 0);
  p.param_dtype = at::kBFloat16;
  p.compute_dtype = at::kBFloat16;
  p.seed = 3;
  k.model->build(ModelKernels{k.att.get(), k.gdn.get(), k.conv.get(), &k.table}, p);
  return k;
}

struct ModelRun {
  double loss = 0;
  std::vector<at::Tensor> grads;  // fp32, CPU
};

ModelRun model_step(Model& m, const std::vector<Batch>& batches) {
  for (auto& [n, t] : m.named_parameters()) t.mutable_grad() = at::Tensor();
  ModelRun out;
  for (const auto& b : batches) {
    ModelOutput o = m.forward(b);
    o.loss_sum.backward();
    out.loss += o.loss_sum.item<double>();
  }
  for (auto& [n, t] : m.named_parameters())
    out.grads.push_back(t.grad().defined() ? t.grad().to(at::kFloat).cpu() : at::zeros_like(t, at::kFloat).cpu());
  return out;
}

// Worst norm-wise gradient difference over the parameters, the decay parameters (A_log, dt_bias)
// apart: their gradients are sums whose terms cancel to a small value, so in a bf16 model they
// move with the bf16 rounding of everything upstream (and gdn-reference's chunked fp32 backward
// rounds differently, see framework/check.cpp Note [Summed gradients]). They are checked
// exactly at the op level by `qrun check`; here they are reported and held to a loose bound.
struct Worst {
  double other = 0, decay = 0;
  std::string other_name, decay_name;
};
Worst worst_grad(Model& m, const ModelRun& x, const ModelRun& y) {
  Worst w;
  auto params = m.named_parameters();
  for (size_t i = 0; i < x.grads.size(); ++i) {
    const double d = nrel(x.grads[i], y.grads[i]);
    const std::string& n = params[i].first;
    const bool decay = n.ends_with(".A_log") || n.ends_with(".dt_bias");
    double& e = decay ? w.decay : w.other;
    if (d > e || std::isnan(d)) {
      e = std::isnan(d) ? INFINITY : d;
      (decay ? w.decay_name : w.other_name) = n;
    }
  }
  return w;
}

void model_gpu(Registry& r) {
  const at::Device cuda(at::kCUDA, 0);
  std::printf("qwen model (0.8b preset, 4 layers, bf16, CUDA)\n");
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  std::vector<at::Tensor> samples;
  for (int64_t L : {1, 2, 3, 63, 64, 65, 200, 129, 700})
    samples.push_back(at::randint(248320, {L}, gen, at::kLong));
  ModelKit fla = make_model(r, "fla-gated-delta");
  ModelKit ref = make_model(r, "gdn-reference");
  ModelRun packed = model_step(*fla.model, {packed_on(samples, cuda)});
  std::vector<Batch> alone;
  for (const auto& s : samples) alone.push_back(packed_on({s}, cuda));
  ModelRun one = model_step(*fla.model, alone);
  ModelRun padded = model_step(*fla.model, {padded_on(samples, cuda)});
  ModelRun refp = model_step(*ref.model, {packed_on(samples, cuda)});
  std::printf("  loss sum: packed %.6f, one by one %.6f, padded %.6f; gdn-reference packed %.6f\n",
              packed.loss, one.loss, padded.loss, refp.loss);
  // bf16 end to end: both sides round every activation to bf16, in different orders (other
  // matmul shapes, another GDN implementation), so they agree to bf16 noise, not bitwise.
  auto lrel = [](double a, double b) { return std::abs(a - b) / std::abs(b); };
  // Bounds: a boundary or gradient bug moves gradients by O(1). Same backend, other batch layout:
  // 5e-2 (measured 1.6e-2 on H200); across backends every GDN output rounds differently, and the
  // norm weights' gradients (sums over all tokens) amplify it: 1e-1 (measured 4.6e-2).
  auto judge = [&](const char* what, const ModelRun& x, const ModelRun& y, double bound) {
    Worst w = worst_grad(*fla.model, x, y);
    const double l = lrel(x.loss, y.loss);
    expect(l < 5e-3 && w.other < bound && w.decay < 0.5,
           fmt::format("{}: loss {:.2e} (bound 5e-3); worst grad {:.3g} ({}) (bound {:.0e}); decay "
                       "params {:.3g} ({}) (bound 0.5)", what, l, w.other, w.other_name, bound,
                       w.decay, w.decay_name));
  };
  judge("packed == one-by-one with fla-gated-delta", packed, one, 5e-2);
  judge("padded == packed with fla-gated-delta", padded, packed, 5e-2);
  judge("fla-gated-delta == gdn-reference (packed)", packed, refp, 1e-1);

  // A few AdamW steps from the same initialisation on the same batches.
  std::printf("training: 8 AdamW steps (lr 3e-4), same init and batches, fla-gated-delta vs gdn-reference\n");
  std::vector<Batch> batches;
  for (int i = 0; i < 8; ++i) {
    std::vector<at::Tensor> s;
    for (int64_t L : {300, 64, 129, 500, 17}) s.push_back(at::randint(4096, {L}, gen, at::kLong));
    batches.push_back(packed_on(s, cuda));
  }
  std::vector<double> losses[2];
  for (int which = 0; which < 2; ++which) {
    ModelKit fresh = make_model(r, which == 0 ? "fla-gated-delta" : "gdn-reference");
    std::vector<at::Tensor> params;
    for (auto& [n, t] : fresh.model->named_parameters()) params.push_back(t);
    torch::optim::AdamW opt(params, torch::optim::AdamWOptions(3e-4).weight_decay(0.0));
    for (const auto& b : batches) {
      opt.zero_grad();
      ModelOutput o = fresh.model->forward(b);
      (o.loss_sum / static_cast<double>(o.loss_tokens)).backward();
      opt.step();
      losses[which].push_back(o.loss_sum.item<double>() / static_cast<double>(o.loss_tokens));
    }
  }
  double worst_step = 0;
  for (size_t i = 0; i < losses[0].size(); ++i) {
    std::printf("  step %zu: loss fla-gated-delta %.5f, gdn-reference %.5f\n", i + 1, losses[0][i],
                losses[1][i]);
    worst_step = std::max(worst_step, lrel(losses[0][i], losses[1][i]));
  }
  expect(worst_step < 1e-2 && losses[0].back() < losses[0].front(),
         fmt::format("per-step losses agree to {:.2e} relative (bound 1e-2) and fall", worst_step));
}

// ------------------------------------------------------------------------------------------------

int test_gpu(Registry& r, bool with_check) {
  if (!at::hasCUDA()) {
    std::printf("SKIP: no CUDA device (fla-gated-delta runs on CUDA only; CI has no GPU)\n");
    return 77;
  }
  {
    // The kernels' library as these plugins were built with it (the same CMake target): on sm_90 it
    // must run the sm_90a forms. A build for plain sm_90 (as LibTorch's CMake flags gave until
    // session 19) runs everything, correctly but on the slower mma.sync forms.
    const qrun::gdn::GdnDeviceInfo di = qrun::gdn::gdn_device_info();
    std::printf("device sm_%d; the kernels' sm_90a (wgmma) forms: %s\n", di.sm, di.wgmma ? "yes" : "no");
    if (di.sm == 90) expect(di.wgmma, "on sm_90 the kernels run their sm_90a (wgmma) forms (the build has sm_90a code)");
  }
  unit_gpu(r);
  if (with_check) {
    // QRUN_FLA_CHECK_SEED=<n> replays one seed of the check (it prints the seed it drew)
    const char* seed = std::getenv("QRUN_FLA_CHECK_SEED");
    int rc = run_check({"linear_attention/fla-gated-delta", "--seed", seed ? seed : "random"}, r);
    expect(rc == 0, seed ? fmt::format("qrun check linear_attention/fla-gated-delta (seed {})", seed)
                         : std::string("qrun check linear_attention/fla-gated-delta (fresh seed)"));
    // Once more with the reverse pass that `backward_operands: auto` does not take on this GPU
    // (unit_gpu found which one it takes), on the same packed and padded layouts.
    const std::string other = std::string("backward_operands=") + (g_auto_backward == "fp16" ? "bf16x2" : "fp16");
    rc = run_check({"linear_attention/fla-gated-delta", "--seed", seed ? seed : "random", "--set", other}, r);
    expect(rc == 0, "qrun check linear_attention/fla-gated-delta --set " + other);
  }
  model_gpu(r);
  std::printf("fla-gated-delta GPU test: %s\n", g_failures == 0 ? "PASS" : "FAIL");
  return g_failures == 0 ? 0 : 1;
}

// Layer timings: forward and forward+backward of one GDN core at the 27B head config.
int bench(Registry& r) {
  if (!at::hasCUDA()) {
    std::printf("SKIP: no CUDA device\n");
    return 77;
  }
  const at::Device cuda(at::kCUDA, 0);
  const int64_t H = 16, HV = 48, D = 128;
  std::printf("| backend | batch | forward ms | forward+backward ms |\n|---|---|---|---|\n");
  for (const char* name : {"fla-gated-delta", "gdn-reference"}) {
    auto la = std::string(name) == "gdn-reference"
                  ? r.create<LinearAttention>(name, Config("g", {{"chunk_size", int64_t{64}}}))
                  : r.create<LinearAttention>(name, Config("g", {}));
    for (auto lens : std::vector<std::vector<int64_t>>{{8192}, {2048, 2048, 2048, 2048}}) {
      int64_t T = 0;
      for (int64_t l : lens) T += l;
      Inputs in = random_inputs(T, H, HV, D, cuda, at::kBFloat16, 7);
      SeqInfo seq = packed_seq(lens, cuda);
      at::Tensor dO = at::randn({T, HV, D}, cuda).to(at::kBFloat16);
      const int iters = std::string(name) == "gdn-reference" ? 3 : 20;
      auto time = [&](bool bwd) {
        std::vector<double> ms;
        for (int i = 0; i < iters + 2; ++i) {
          torch::cuda::synchronize();
          auto t0 = std::chrono::steady_clock::now();
          if (bwd) {
            at::Tensor o = la->forward(in.gdn(), seq, {});
            torch::autograd::grad({o}, {in.q, in.k, in.v, in.a, in.b, in.A_log, in.dt_bias}, {dO});
          } else {
            at::NoGradGuard ng;
            la->forward(in.gdn(), seq, {});
          }
          torch::cuda::synchronize();
          auto t1 = std::chrono::steady_clock::now();
          if (i >= 2) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
        }
        std::sort(ms.begin(), ms.end());
        return ms[ms.size() / 2];
      };
      const double f = time(false), fb = time(true);
      std::printf("| %s | %s | %.3f | %.3f |\n", name, lens.size() == 1 ? "1x8192" : "4x2048 packed", f, fb);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "cpu";
  const std::string dir = argc > 2 ? argv[2] : QRUN_TEST_PLUGIN_DIR;
  Registry r;
  bool ok = load(r, dir + "/libqrun-fla-gated-delta.so", "fla-gated-delta");
  expect(ok, "libqrun-fla-gated-delta.so loads (descriptor: ABI, LibTorch, C++ ABI, name)");
  if (!ok) return 1;
  ok = load(r, dir + "/libqrun-reference-kernels.so", "reference-kernels");
  if (mode != "cpu") ok = ok && load(r, dir + "/libqrun-qwen.so", "qwen");
  if (!ok) return 1;
  try {
    if (mode == "cpu") return test_cpu(r);
    if (mode == "gpu") return test_gpu(r, true);
    if (mode == "gpu-nocheck") return test_gpu(r, false);
    if (mode == "bench") return bench(r);
  } catch (const std::exception& e) {
    std::printf("FAIL: unexpected exception: %s\n", e.what());
    return 1;
  }
  std::printf("unknown mode '%s' (cpu, gpu, gpu-nocheck, bench)\n", mode.c_str());
  return 2;
}
