// framework/check.cpp - see check.h. One harness for every kind: a case is a set of random
// inputs (token-major ones are sliced per sample, the others - weights - are shared) and a call of
// the component; the harness derives the per-sample reference, the packed and padded runs and
// their gradients from that description.
#include "check.h"

#include <qrun/sdk/kernels.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <functional>

namespace qrun {
namespace {

struct Input {
  at::Tensor value;   // packed: [T, ...] when token_major, else any shape
  bool token_major = true;
  bool differentiable = true;
};

// Calls the component on inputs laid out for `seq` (packed [T, ...] or padded [B, S, ...]).
using Call = std::function<at::Tensor(Component&, const std::vector<at::Tensor>&, const SeqInfo&)>;

struct Case {
  std::string name;
  std::vector<int64_t> lens;  // empty: no sample structure (ops)
  std::vector<Input> inputs;
  Call call;
};

struct Tol {
  double fwd, bwd;
};

struct Row {
  std::string name, layout;
  double fwd = 0, bwd = 0;
  bool pass = false;
  std::string error;
};

double rel(const at::Tensor& a, const at::Tensor& b) {
  at::Tensor af = a.detach().to(at::kDouble).cpu(), bf = b.detach().to(at::kDouble).cpu();
  if (af.sizes() != bf.sizes()) return INFINITY;
  if (bf.numel() == 0) return 0.0;
  double den = std::max(bf.abs().max().item<double>(), 1e-12);
  double e = (af - bf).abs().max().item<double>() / den;
  return std::isnan(e) ? INFINITY : e;
}

SeqInfo make_seq(const std::vector<int64_t>& lens, Layout layout, const at::Device& dev) {
  SeqInfo s;
  s.layout = layout;
  s.cu_seqlens_host = {0};
  for (int64_t l : lens) s.cu_seqlens_host.push_back(s.cu_seqlens_host.back() + l);
  s.cu_seqlens = at::tensor(s.cu_seqlens_host, at::kLong).to(at::kInt).to(dev);
  for (int64_t l : lens) s.max_seqlen = std::max(s.max_seqlen, l);
  if (layout == Layout::Packed) {
    std::vector<int32_t> idx;
    for (size_t i = 0; i < lens.size(); ++i)
      for (int64_t t = 0; t < lens[i]; ++t) idx.push_back(static_cast<int32_t>(i));
    s.seq_idx = at::tensor(idx, at::TensorOptions().dtype(at::kInt)).to(dev);
  } else {
    const int64_t B = static_cast<int64_t>(lens.size()), S = std::max<int64_t>(s.max_seqlen, 1);
    at::Tensor mask = at::zeros({B, S}, at::kBool);
    at::Tensor idx = at::full({B, S}, -1, at::kInt);
    for (int64_t i = 0; i < B; ++i) {
      mask[i].narrow(0, 0, lens[i]).fill_(true);
      idx[i].narrow(0, 0, lens[i]).fill_(static_cast<int32_t>(i));
    }
    s.attention_mask = mask.to(dev);
    s.seq_idx = idx.to(dev);
  }
  return s;
}

// Packed [T, ...] -> padded [B, S, ...] (zeros at padding) and back.
at::Tensor to_padded(const at::Tensor& x, const std::vector<int64_t>& lens) {
  int64_t S = 1;
  for (int64_t l : lens) S = std::max(S, l);
  std::vector<at::Tensor> rows;
  int64_t off = 0;
  for (int64_t l : lens) {
    at::Tensor r = x.narrow(0, off, l);
    std::vector<int64_t> pad_shape(x.sizes().begin(), x.sizes().end());
    pad_shape[0] = S - l;
    rows.push_back(at::cat({r, at::zeros(pad_shape, x.options())}, 0));
    off += l;
  }
  return at::stack(rows, 0);
}
at::Tensor from_padded(const at::Tensor& x, const std::vector<int64_t>& lens) {
  std::vector<at::Tensor> parts;
  for (size_t i = 0; i < lens.size(); ++i) parts.push_back(x[static_cast<int64_t>(i)].narrow(0, 0, lens[i]));
  return at::cat(parts, 0);
}

struct Result {
  at::Tensor out;                 // packed layout
  std::vector<at::Tensor> grads;  // per input (packed layout for token-major ones)
};

std::vector<at::Tensor> leaves(const std::vector<Input>& in, c10::ScalarType dt) {
  std::vector<at::Tensor> v;
  for (const auto& i : in) {
    at::Tensor t = i.value.detach().clone();
    if (t.is_floating_point()) t = t.to(dt);
    if (i.differentiable) t.requires_grad_(true);
    v.push_back(t);
  }
  return v;
}

std::vector<at::Tensor> grads_of(const at::Tensor& loss, const std::vector<at::Tensor>& xs) {
  std::vector<at::Tensor> req;
  for (const auto& x : xs)
    if (x.requires_grad()) req.push_back(x);
  std::vector<at::Tensor> g = req.empty() ? std::vector<at::Tensor>{}
                                          : torch::autograd::grad({loss}, req, {}, false, false, true);
  std::vector<at::Tensor> out;
  size_t j = 0;
  for (const auto& x : xs) {
    if (!x.requires_grad()) {
      out.emplace_back();
      continue;
    }
    at::Tensor gi = g[j++];
    out.push_back(gi.defined() ? gi : at::zeros_like(x));
  }
  return out;
}

// The reference, one sample at a time (the meaning of "packed equals unpacked"), in fp32.
Result reference_alone(Component& ref, const Case& c, const at::Tensor& w, const at::Device& dev) {
  Result r;
  std::vector<at::Tensor> outs;
  std::vector<at::Tensor> shared;
  std::vector<std::vector<at::Tensor>> tok_grads(c.inputs.size());
  std::vector<at::Tensor> shared_grads(c.inputs.size());
  int64_t off = 0;
  for (int64_t l : c.lens) {
    std::vector<at::Tensor> xs;
    for (const auto& in : c.inputs) {
      at::Tensor t = in.token_major ? in.value.narrow(0, off, l) : in.value;
      t = t.detach().clone().to(dev);
      if (t.is_floating_point()) t = t.to(at::kFloat);
      if (in.differentiable) t.requires_grad_(true);
      xs.push_back(t);
    }
    at::Tensor o = c.call(ref, xs, make_seq({l}, Layout::Packed, dev));
    outs.push_back(o.detach());
    auto g = grads_of((o.to(at::kFloat) * w.narrow(0, off, l)).sum(), xs);
    for (size_t i = 0; i < c.inputs.size(); ++i) {
      if (!g[i].defined()) continue;
      if (c.inputs[i].token_major) tok_grads[i].push_back(g[i]);
      else shared_grads[i] = shared_grads[i].defined() ? shared_grads[i] + g[i] : g[i];
    }
    off += l;
  }
  r.out = at::cat(outs, 0);
  for (size_t i = 0; i < c.inputs.size(); ++i)
    r.grads.push_back(c.inputs[i].token_major ? (tok_grads[i].empty() ? at::Tensor() : at::cat(tok_grads[i], 0))
                                              : shared_grads[i]);
  return r;
}

Result run_layout(Component& comp, const Case& c, const at::Tensor& w, Layout layout,
                  c10::ScalarType dt, const at::Device& dev) {
  std::vector<Input> in = c.inputs;
  for (auto& i : in) i.value = i.value.to(dev);
  std::vector<at::Tensor> xs = leaves(in, dt);
  std::vector<at::Tensor> call_xs;
  for (size_t i = 0; i < xs.size(); ++i)
    call_xs.push_back(layout == Layout::Padded && in[i].token_major ? to_padded(xs[i], c.lens) : xs[i]);
  at::Tensor o = c.call(comp, call_xs, make_seq(c.lens, layout, dev));
  if (layout == Layout::Padded) o = from_padded(o, c.lens);
  Result r;
  r.out = o.detach();
  r.grads = grads_of((o.to(at::kFloat) * w).sum(), xs);
  return r;
}

// ops: no sample structure; backend and reference on the same tensors.
Result run_plain(Component& comp, const Case& c, const at::Tensor& w_or_undef, c10::ScalarType dt,
                 const at::Device& dev) {
  std::vector<Input> in = c.inputs;
  for (auto& i : in) i.value = i.value.to(dev);
  std::vector<at::Tensor> xs = leaves(in, dt);
  at::Tensor o = c.call(comp, xs, SeqInfo{});
  at::Tensor w = w_or_undef.defined() ? w_or_undef : at::ones_like(o, o.options().dtype(at::kFloat));
  Result r;
  r.out = o.detach();
  r.grads = grads_of((o.to(at::kFloat) * w).sum(), xs);
  return r;
}

void compare(const Result& got, const Result& ref, Row& row) {
  row.fwd = rel(got.out, ref.out);
  row.bwd = 0;
  for (size_t i = 0; i < ref.grads.size(); ++i) {
    if (!ref.grads[i].defined()) continue;
    if (!got.grads[i].defined()) {
      row.bwd = INFINITY;
      continue;
    }
    row.bwd = std::max(row.bwd, rel(got.grads[i], ref.grads[i]));
  }
}

// ------------------------------------------------------------------------------------------
// The grids.

at::Tensor rnd(std::vector<int64_t> shape, at::Generator& g, double scale = 1.0) {
  return at::randn(shape, g, at::kFloat) * scale;
}

const std::vector<std::vector<int64_t>> kLensGrid = {{1, 2, 3, 63, 64, 65, 200}, {17}, {128, 5, 70}};

std::string lens_str(const std::vector<int64_t>& l) { return fmt::format("[{}]", fmt::join(l, ",")); }

std::vector<Case> attention_cases(at::Generator& g) {
  std::vector<Case> cs;
  for (auto [hq, hkv, d] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{4, 2, 32}, {4, 4, 16}, {6, 1, 64}})
    for (const auto& lens : kLensGrid) {
      int64_t T = 0;
      for (int64_t l : lens) T += l;
      Case c;
      c.name = fmt::format("Hq={} Hkv={} D={} lens={}", hq, hkv, d, lens_str(lens));
      c.lens = lens;
      c.inputs = {{rnd({T, hq, d}, g)}, {rnd({T, hkv, d}, g)}, {rnd({T, hkv, d}, g)}};
      double scale = 1.0 / std::sqrt(static_cast<double>(d));
      c.call = [scale](Component& k, const std::vector<at::Tensor>& x, const SeqInfo& s) {
        return static_cast<Attention&>(k).forward(x[0], x[1], x[2], s, scale);
      };
      cs.push_back(std::move(c));
    }
  return cs;
}

std::vector<Case> gdn_cases(at::Generator& g) {
  std::vector<Case> cs;
  for (auto [h, hv, kd, vd] : std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>>{
           {2, 2, 16, 16}, {2, 6, 16, 8}, {1, 3, 32, 32}})
    for (const auto& lens : kLensGrid) {
      int64_t T = 0;
      for (int64_t l : lens) T += l;
      Case c;
      c.name = fmt::format("H={} HV={} K={} V={} lens={}", h, hv, kd, vd, lens_str(lens));
      c.lens = lens;
      at::Tensor A_log = (at::rand({hv}, g) * 7.5 + 0.5).log();
      c.inputs = {{rnd({T, h, kd}, g)}, {rnd({T, h, kd}, g)}, {rnd({T, hv, vd}, g)},
                  {rnd({T, hv}, g)},    {rnd({T, hv}, g)},    {A_log, false, true},
                  {rnd({hv}, g, 0.5), false, true}};
      c.call = [](Component& k, const std::vector<at::Tensor>& x, const SeqInfo& s) {
        GatedDeltaInputs in{x[0], x[1], x[2], x[3], x[4], x[5].to(at::kFloat), x[6]};
        return static_cast<LinearAttention&>(k).forward(in, s, GatedDeltaOptions{});
      };
      cs.push_back(std::move(c));
    }
  return cs;
}

std::vector<Case> conv_cases(at::Generator& g) {
  std::vector<Case> cs;
  for (auto [ch, w] : std::vector<std::pair<int64_t, int64_t>>{{24, 4}, {10, 2}})
    for (bool silu : {true, false})
      for (const auto& lens : kLensGrid) {
        int64_t T = 0;
        for (int64_t l : lens) T += l;
        Case c;
        c.name = fmt::format("C={} W={} act={} lens={}", ch, w, silu ? "silu" : "none", lens_str(lens));
        c.lens = lens;
        c.inputs = {{rnd({T, ch}, g)}, {rnd({ch, w}, g, 0.5), false, true}};
        c.call = [silu](Component& k, const std::vector<at::Tensor>& x, const SeqInfo& s) {
          return static_cast<Conv1d&>(k).forward(x[0], x[1], s, silu ? Activation::SiLU : Activation::None);
        };
        cs.push_back(std::move(c));
      }
  return cs;
}

std::vector<Case> ops_cases(at::Generator& g) {
  std::vector<Case> cs;
  const int64_t T = 77;
  for (bool zc : {true, false}) {
    Case c;
    c.name = fmt::format("rms_norm zero_centred={} [77, 64]", zc);
    c.inputs = {{rnd({T, 64}, g)}, {rnd({64}, g, 0.3), false, true}};
    c.call = [zc](Component& k, const std::vector<at::Tensor>& x, const SeqInfo&) {
      return static_cast<Ops&>(k).rms_norm(x[0], x[1], 1e-6, zc);
    };
    cs.push_back(std::move(c));
  }
  {
    Case c;
    c.name = "gated_rms_norm [77, 6, 16] (fp32 weight)";
    c.inputs = {{rnd({T, 6, 16}, g)}, {rnd({T, 6, 16}, g)}, {rnd({16}, g, 0.3) + 1.0, false, true}};
    c.call = [](Component& k, const std::vector<at::Tensor>& x, const SeqInfo&) {
      return static_cast<Ops&>(k).gated_rms_norm(x[0], x[1], x[2].to(at::kFloat), 1e-6);
    };
    cs.push_back(std::move(c));
  }
  {
    Case c;
    c.name = "swiglu [77, 96]";
    c.inputs = {{rnd({T, 96}, g)}, {rnd({T, 96}, g)}};
    c.call = [](Component& k, const std::vector<at::Tensor>& x, const SeqInfo&) {
      return static_cast<Ops&>(k).swiglu(x[0], x[1]);
    };
    cs.push_back(std::move(c));
  }
  for (int64_t V : {512, 1000}) {
    Case c;
    c.name = fmt::format("linear_cross_entropy_sum [77, 64] x [{}, 64]", V);
    at::Tensor targets = at::randint(V, {T}, g, at::kLong);
    targets.narrow(0, 0, 10).fill_(kIgnoreIndex);
    c.inputs = {{rnd({T, 64}, g)}, {rnd({V, 64}, g, 0.1), false, true}, {targets, true, false}};
    c.call = [](Component& k, const std::vector<at::Tensor>& x, const SeqInfo&) {
      return static_cast<Ops&>(k).linear_cross_entropy_sum(x[0], x[1], x[2]);
    };
    cs.push_back(std::move(c));
  }
  return cs;
}

const char* reference_of(const std::string& kind) {
  if (kind == Attention::kKind) return "sdpa";
  if (kind == LinearAttention::kKind) return "gdn-reference";
  if (kind == Conv1d::kKind) return "conv-reference";
  if (kind == Ops::kKind) return "reference";
  return nullptr;
}

Config default_config(const RegistryEntry& e, const std::string& path) {
  std::map<std::string, Value> v;
  for (const auto& f : e.info.schema.fields()) {
    QRUN_CHECK(!f.required, "{} '{}' has a required field '{}'; `qrun check` can only run "
               "components whose fields all have defaults", e.info.kind, e.info.name, f.name);
    v[f.name] = f.default_value;
  }
  return Config(path, v);
}

std::unique_ptr<Component> create(const Registry& r, const std::string& kind, const std::string& name) {
  const RegistryEntry& e = r.get(kind, name);
  auto c = e.info.factory(default_config(e, "check." + kind));
  QRUN_ASSERT(c != nullptr, "factory of {} '{}' returned null", kind, name);
  return c;
}

bool check_one(const std::string& kind, const std::string& name, const Registry& registry) {
  const char* ref_name = reference_of(kind);
  if (ref_name == nullptr) {
    fmt::print("qrun check: kind '{}' has no conformance suite (kinds: attention, linear_attention, "
               "conv1d, ops)\n", kind);
    return false;
  }
  if (registry.find(kind, name) == nullptr) {
    fmt::print("qrun check: {}\n", registry.unknown_message(kind, name));
    return false;
  }
  if (registry.find(kind, ref_name) == nullptr) {
    fmt::print("qrun check: the reference {}/{} is not installed (plugin reference-kernels)\n", kind,
               ref_name);
    return false;
  }
  std::unique_ptr<Component> backend, ref;
  try {
    backend = create(registry, kind, name);
    ref = create(registry, kind, ref_name);
  } catch (const std::exception& e) {
    fmt::print("qrun check {}/{}: cannot create the component: {}\n", kind, name, e.what());
    return false;
  }

  struct Setting {
    at::Device dev;
    c10::ScalarType dt;
    Tol tol;
  };
  std::vector<Setting> settings = {{at::Device(at::kCPU), at::kFloat, {1e-4, 1e-3}}};
  if (at::hasCUDA()) {
    settings.push_back({at::Device(at::kCUDA, 0), at::kFloat, {1e-3, 1e-2}});
    settings.push_back({at::Device(at::kCUDA, 0), at::kBFloat16, {3e-2, 6e-2}});
  }
  bool all_ok = true;
  int total = 0, passed = 0;
  double worst_fwd = 0, worst_bwd = 0;
  for (const auto& st : settings) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(1234);
    std::vector<Case> cases = kind == Attention::kKind          ? attention_cases(gen)
                              : kind == LinearAttention::kKind ? gdn_cases(gen)
                              : kind == Conv1d::kKind          ? conv_cases(gen)
                                                               : ops_cases(gen);
    fmt::print("\nqrun check {}/{} vs {} on {} ({}), tolerance fwd {:.0e} grad {:.0e}\n", kind, name,
               ref_name, st.dev.str(), c10::toString(st.dt), st.tol.fwd, st.tol.bwd);
    fmt::print("{:<58} {:<7} {:>10} {:>10}  {}\n", "case", "layout", "fwd err", "grad err", "result");
    for (const auto& c : cases) {
      std::vector<Row> rows;
      // Inputs as the backend will see them (bf16 rounding applied to the reference too).
      Case cr = c;
      for (auto& in : cr.inputs)
        if (in.value.is_floating_point()) in.value = in.value.to(st.dt).to(at::kFloat);
      try {
        if (c.lens.empty()) {
          Result want = run_plain(*ref, cr, at::Tensor(), at::kFloat, st.dev);
          at::Tensor w = at::randn(want.out.sizes(), gen, at::kFloat).to(st.dev);
          want = run_plain(*ref, cr, w, at::kFloat, st.dev);
          Row row{c.name, "-"};
          compare(run_plain(*backend, cr, w, st.dt, st.dev), want, row);
          rows.push_back(row);
        } else {
          int64_t T = 0;
          for (int64_t l : c.lens) T += l;
          // Output shape: from one reference run on the first sample.
          std::vector<int64_t> wshape;
          {
            at::NoGradGuard no_grad;
            std::vector<at::Tensor> xs;
            for (const auto& in : cr.inputs)
              xs.push_back((in.token_major ? in.value.narrow(0, 0, c.lens[0]) : in.value).to(st.dev));
            wshape = c.call(*ref, xs, make_seq({c.lens[0]}, Layout::Packed, st.dev)).sizes().vec();
          }
          wshape[0] = T;
          at::Tensor w = at::randn(wshape, gen, at::kFloat).to(st.dev);
          Result want = reference_alone(*ref, cr, w, st.dev);
          for (Layout layout : {Layout::Packed, Layout::Padded}) {
            Row row{c.name, layout_name(layout)};
            compare(run_layout(*backend, cr, w, layout, st.dt, st.dev), want, row);
            rows.push_back(row);
          }
        }
      } catch (const std::exception& e) {
        Row row{c.name, "-"};
        row.fwd = row.bwd = INFINITY;
        row.error = e.what();
        rows.push_back(row);
      }
      for (auto& row : rows) {
        row.pass = row.error.empty() && row.fwd <= st.tol.fwd && row.bwd <= st.tol.bwd;
        ++total;
        passed += row.pass;
        all_ok = all_ok && row.pass;
        worst_fwd = std::max(worst_fwd, row.fwd);
        worst_bwd = std::max(worst_bwd, row.bwd);
        fmt::print("{:<58} {:<7} {:>10.2e} {:>10.2e}  {}\n", row.name, row.layout, row.fwd, row.bwd,
                   row.pass ? "pass" : "FAIL");
        if (!row.error.empty()) fmt::print("    error: {}\n", row.error);
      }
    }
  }
  fmt::print("{}/{}: {}/{} passed; worst fwd err {:.2e}, worst grad err {:.2e}\n", kind, name, passed,
             total, worst_fwd, worst_bwd);
  return all_ok;
}

}  // namespace

int run_check(const std::vector<std::string>& args, const Registry& registry) {
  if (args.empty()) {
    fmt::print("usage: qrun check <kind>/<name> [<kind>/<name> ...]\n"
               "  kinds: attention, linear_attention, conv1d, ops\n");
    return 2;
  }
  bool ok = true;
  for (const auto& a : args) {
    auto slash = a.find('/');
    if (slash == std::string::npos) {
      fmt::print("qrun check: '{}' is not <kind>/<name> (e.g. linear_attention/gdn-reference)\n", a);
      ok = false;
      continue;
    }
    ok = check_one(a.substr(0, slash), a.substr(slash + 1), registry) && ok;
  }
  fmt::print("\nqrun check: {}\n", ok ? "all passed" : "FAILED");
  return ok ? 0 : 2;
}

}  // namespace qrun
