// framework/check.cpp - see check.h. One harness for every kind: a case is a set of random
// inputs (token-major ones are sliced per sample, the others - weights - are shared) and a call of
// the component; the harness derives the per-sample reference, the packed and padded runs and
// their gradients from that description.
#include "check.h"

#include "kernel_backend.h"
#include "text.h"

#include <qrun/sdk/kernels.h>
#include <qrun/sdk/ops.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <set>

namespace qrun {
namespace {

struct Input {
  at::Tensor value;   // packed: [T, ...] when token_major, else any shape
  bool token_major = true;
  bool differentiable = true;
  std::string name;   // shown as the worst gradient; "x<i>" when empty
};

// Calls the component on inputs laid out for `seq` (packed [T, ...] or padded [B, S, ...]).
using Call = std::function<at::Tensor(Component&, const std::vector<at::Tensor>&, const SeqInfo&)>;

// Per input, the magnitude its gradient is judged against (Note [Summed gradients]); an
// undefined tensor means the gradient's own reference value. Given the inputs and the reference
// gradients (fp64).
using GradScales = std::function<std::vector<at::Tensor>(const std::vector<Input>&,
                                                         const std::vector<at::Tensor>&)>;

struct Case {
  std::string name;
  std::string op;             // ops: the operation (op::X::kName) the case calls
  std::vector<int64_t> lens;  // empty: no sample structure (ops)
  std::vector<Input> inputs;
  Call call;
  GradScales grad_scales;  // optional
};

struct Tol {
  double fwd, bwd;
};

// Note [Error metrics]
// fp32 settings: max |got - ref| / max |ref| (a normalised max error).
// Reduced-precision settings (bf16): the result of a bf16 backend is stored in bf16, which alone
// moves each element by up to half a bf16 ulp (2^-9..2^-8 relative) - more than the 2e-3 the
// kernels are held to, on a single element. So the error there is the part BEYOND that storage
// rounding, norm-wise: || max(|got - ref| - ulp(got)/2, 0) ||_2 / ||ref||_2, with ref the fp64
// reference on the same (bf16-rounded) inputs and the same (bf16-rounded) cotangent. A backend
// that computes in fp32 and rounds once scores ~0; one that loses precision inside (bf16
// accumulation, TF32 products) shows it. The raw norm-wise error ||got - ref|| / ||ref||
// (storage rounding included, ~1.5e-3 for bf16) is printed beside it.
enum class Metric { MaxNormalised, BeyondStorageNormwise };

// Note [fp64 judge]: every backend is judged against its kind's reference run in fp64 on the same
// inputs (rounded to the setting's dtype first) and the same cotangent. An fp32 judge is not good
// enough: the gradients of the GDN decay parameters (a, A_log, dt_bias) are sums whose O(1) terms
// cancel to a small true value, and gdn-reference's own fp32 chunked autograd leaves noise larger
// than that value (measured on the H200: with an fp32 judge, three different kernel versions all
// scored exactly 7.27e-3 on dA_log for one seed - the judge's error, not theirs - while the
// kernels' own test against an fp64 CPU reference measured <= 8e-5). The reference-kernels
// plugin computes in fp64 when given fp64 tensors.
constexpr c10::ScalarType kJudgeDtype = at::kDouble;

struct Err {
  double e = 0;    // the metric
  double raw = 0;  // BeyondStorageNormwise: the plain norm-wise error; else = e
};

// `scale` (optional, same shape as ref): the magnitudes to normalise by instead of |ref|.
Err rel(const at::Tensor& got, const at::Tensor& ref, Metric m = Metric::MaxNormalised,
        const at::Tensor& scale = at::Tensor()) {
  at::Tensor af = got.detach().to(at::kDouble).cpu(), bf = ref.detach().to(at::kDouble).cpu();
  if (af.sizes() != bf.sizes()) return {INFINITY, INFINITY};
  if (bf.numel() == 0) return {0.0, 0.0};
  const at::Tensor mag =
      scale.defined() ? at::maximum(scale.detach().to(at::kDouble).cpu(), bf.abs()) : bf.abs();
  auto finite = [](double e) { return std::isnan(e) ? INFINITY : e; };
  if (m == Metric::MaxNormalised) {
    double den = std::max(mag.max().item<double>(), 1e-12);
    double e = finite((af - bf).abs().max().item<double>() / den);
    return {e, e};
  }
  const double den = mag.norm().item<double>();
  at::Tensor d = (af - bf).abs();
  auto ratio = [&](const at::Tensor& x) -> double {
    const double n = x.norm().item<double>();
    if (std::isnan(n)) return INFINITY;
    if (den == 0) return n == 0 ? 0.0 : INFINITY;
    return n / den;
  };
  const double raw = ratio(d);
  // Precision bits p of the stored result: half an ulp of x in [2^e, 2^(e+1)) is 2^(e-p).
  const int p = got.scalar_type() == at::kBFloat16 ? 8 : got.scalar_type() == at::kHalf ? 11 : 0;
  if (p > 0) {
    at::Tensor mag = af.abs();
    at::Tensor half_ulp = at::where(mag > 0, at::exp2(at::floor(at::log2(mag)) - p),
                                    at::zeros({}, mag.options()));
    d = at::clamp_min(d - half_ulp, 0.0);
  }
  return {ratio(d), raw};
}

struct Row {
  std::string name, layout;
  double fwd = 0, bwd = 0;          // the setting's metric
  double fwd_raw = 0, bwd_raw = 0;  // see Note [Error metrics]
  std::string worst_grad;           // input whose gradient has the largest error
  bool pass = false;
  std::string error;
};

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

// fp32 parameters (A_log, the gated norm's weight) stay fp64 in the fp64 judge.
at::Tensor at_least_fp32(const at::Tensor& t) {
  return t.scalar_type() == at::kDouble ? t : t.to(at::kFloat);
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

// The reference, one sample at a time (the meaning of "packed equals unpacked"), in the dtype of
// the cotangent `w` (fp64: Note [fp64 judge]).
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
      if (t.is_floating_point()) t = t.to(w.scalar_type());
      if (in.differentiable) t.requires_grad_(true);
      xs.push_back(t);
    }
    at::Tensor o = c.call(ref, xs, make_seq({l}, Layout::Packed, dev));
    outs.push_back(o.detach());
    auto g = grads_of((o.to(w.scalar_type()) * w.narrow(0, off, l)).sum(), xs);
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
  const auto acc = w.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  Result r;
  r.out = o.detach();
  r.grads = grads_of((o.to(acc) * w.to(acc)).sum(), xs);
  return r;
}

void compare(const Result& got, const Result& ref, const std::vector<Input>& inputs, Metric m,
             Row& row, const GradScales& grad_scales = nullptr) {
  const std::vector<at::Tensor> scales =
      grad_scales ? grad_scales(inputs, ref.grads) : std::vector<at::Tensor>(ref.grads.size());
  Err f = rel(got.out, ref.out, m);
  row.fwd = f.e;
  row.fwd_raw = f.raw;
  row.bwd = row.bwd_raw = 0;
  for (size_t i = 0; i < ref.grads.size(); ++i) {
    if (!ref.grads[i].defined()) continue;
    Err g = got.grads[i].defined() ? rel(got.grads[i], ref.grads[i], m, scales[i])
                                   : Err{INFINITY, INFINITY};
    if (g.e > row.bwd || row.worst_grad.empty())
      row.worst_grad = inputs[i].name.empty() ? fmt::format("x{}", i) : inputs[i].name;
    row.bwd = std::max(row.bwd, g.e);
    row.bwd_raw = std::max(row.bwd_raw, g.raw);
  }
}

// ------------------------------------------------------------------------------------------
// The grids.

at::Tensor rnd(std::vector<int64_t> shape, at::Generator& g, double scale = 1.0) {
  return at::randn(shape, g, at::kFloat) * scale;
}

const std::vector<std::vector<int64_t>> kLensGrid = {{1, 2, 3, 63, 64, 65, 200}, {17}, {128, 5, 70}};

std::string lens_str(const std::vector<int64_t>& l) { return fmt::format("[{}]", fmt::join(l, ",")); }

// The production shapes (`big`, on CUDA): 27B's full attention (24 query / 4 kv heads of 256) on
// a chat-like 8,192-token batch and on many tiny samples.
const std::vector<int64_t> kChatLens = {900, 3000, 17, 1, 2048, 2226};

std::vector<int64_t> tiny_lens(at::Generator& g) {
  std::vector<int64_t> tiny;
  at::Tensor r = at::randint(1, 9, {300}, g, at::kLong);
  for (int64_t i = 0; i < 300; ++i) {
    tiny.push_back(r[i].item<int64_t>());
    if (i % 100 == 50) tiny.push_back(64 + i % 3);
  }
  return tiny;
}

std::vector<Case> attention_cases(at::Generator& g, bool big) {
  std::vector<Case> cs;
  std::vector<std::tuple<int64_t, int64_t, int64_t>> shapes = {{4, 2, 32}, {4, 4, 16}, {6, 1, 64}};
  if (big) shapes.emplace_back(24, 4, 256);
  for (auto [hq, hkv, d] : shapes) {
    std::vector<std::vector<int64_t>> grid = kLensGrid;
    if (d == 256) grid = {{1, 2, 3, 63, 64, 65, 200}, tiny_lens(g), kChatLens};
    for (const auto& lens : grid) {
      int64_t T = 0;
      for (int64_t l : lens) T += l;
      Case c;
      c.name = fmt::format("Hq={} Hkv={} D={} lens={}", hq, hkv, d,
                           lens.size() > 20 ? fmt::format("{} tiny", lens.size()) : lens_str(lens));
      c.lens = lens;
      c.inputs = {{rnd({T, hq, d}, g), true, true, "q"}, {rnd({T, hkv, d}, g), true, true, "k"},
                  {rnd({T, hkv, d}, g), true, true, "v"}};
      double scale = 1.0 / std::sqrt(static_cast<double>(d));
      c.call = [scale](Component& k, const std::vector<at::Tensor>& x, const SeqInfo& s) {
        return static_cast<Attention&>(k).forward(x[0], x[1], x[2], s, scale);
      };
      cs.push_back(std::move(c));
    }
  }
  return cs;
}

// Note [GDN grid]: K = V = 128, the head size of every Qwen3.5 / Qwen3-Next Gated DeltaNet layer
// (and the only one the fused CUDA kernels take). HV/H of 1, 2 and 3; sample lengths 1, 2, 3, 63,
// 64, 65 and other non-multiples of 64; gates of three kinds (g = -exp(A_log) softplus(a + dt_bias)):
//   normal  A_log = log U(0.5, 8), a ~ N(0, 1)      g ~ -0.3 .. -10 per token
//   near-0  A_log = log U(1e-4, 1e-3)               g ~ -1e-3 (state barely decays)
//   strong  A_log = log U(8, 16), a ~ N(3, 1)        g ~ -25 .. -50 (exp(g) underflows in a chunk)
// On CUDA (`big`) also many tiny samples in one batch, a 32,768-token batch and longer samples
// with strong and near-0 gates (too slow for the fp64 judge on CI's CPUs).
enum class Gates { Normal, Near0, Strong };

Case gdn_case(at::Generator& g, int64_t h, int64_t hv, const std::vector<int64_t>& lens,
              Gates gates, const std::string& label) {
  const int64_t kd = 128, vd = 128;
  int64_t T = 0;
  for (int64_t l : lens) T += l;
  Case c;
  const char* gname = gates == Gates::Normal ? "normal" : gates == Gates::Near0 ? "near-0" : "strong";
  c.name = fmt::format("H={} HV={} gates={} lens={}", h, hv, gname, label);
  c.lens = lens;
  double lo = 0.5, hi = 8.0, a_shift = 0.0;
  if (gates == Gates::Near0) lo = 1e-4, hi = 1e-3;
  if (gates == Gates::Strong) lo = 8.0, hi = 16.0, a_shift = 3.0;
  at::Tensor A_log = (at::rand({hv}, g) * (hi - lo) + lo).log();
  c.inputs = {{rnd({T, h, kd}, g), true, true, "q"},
              {rnd({T, h, kd}, g), true, true, "k"},
              {rnd({T, hv, vd}, g), true, true, "v"},
              {rnd({T, hv}, g) + a_shift, true, true, "a"},
              {rnd({T, hv}, g), true, true, "b"},
              {A_log, false, true, "A_log"},
              {rnd({hv}, g, 0.5), false, true, "dt_bias"}};
  // Note [Summed gradients]: dA_log and ddt_bias are sums over every token of every sample:
  // with x = a + dt_bias and g = -exp(A_log) softplus(x), ddt_bias[h] = sum_t da[t,h] and
  // dA_log[h] = sum_t dg[t,h] g[t,h] = sum_t da[t,h] softplus(x)/sigmoid(x). Their terms often
  // cancel to a value far below their size (a head whose gates barely matter), and then any
  // fp32 evaluation - the reference's own included - is off by ~1e-6 of the terms' size, which
  // can be 1e-2 of the tiny sum (seen on the H200: seed 1795955231, one head, 203 tokens). So these
  // two are judged against the size of their terms, sum_t |term| (>= |sum|), the usual error
  // bound of a sum; the per-token gradient da itself is judged element-wise as usual.
  c.grad_scales = [](const std::vector<Input>& in, const std::vector<at::Tensor>& ref_grads) {
    std::vector<at::Tensor> sc(in.size());
    const at::Tensor da = ref_grads[3].detach().to(at::kDouble).cpu();                     // [T, HV]
    const at::Tensor x = (in[3].value.to(at::kDouble) + in[6].value.to(at::kDouble)).cpu();  // [T, HV]
    sc[6] = da.abs().sum(0);
    sc[5] = (da.abs() * at::softplus(x) / at::sigmoid(x)).sum(0);
    return sc;
  };
  c.call = [](Component& k, const std::vector<at::Tensor>& x, const SeqInfo& s) {
    GatedDeltaInputs in{x[0], x[1], x[2], x[3], x[4], at_least_fp32(x[5]), x[6]};
    return static_cast<LinearAttention&>(k).forward(in, s, GatedDeltaOptions{});
  };
  return c;
}

std::vector<Case> gdn_cases(at::Generator& g, bool big) {
  std::vector<Case> cs;
  for (auto [h, hv] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {2, 4}, {1, 3}})
    for (const auto& lens : kLensGrid) cs.push_back(gdn_case(g, h, hv, lens, Gates::Normal, lens_str(lens)));
  const std::vector<int64_t> edge = {1, 2, 3, 63, 64, 65, 200};
  cs.push_back(gdn_case(g, 1, 3, edge, Gates::Near0, lens_str(edge)));
  cs.push_back(gdn_case(g, 2, 4, edge, Gates::Strong, lens_str(edge)));
  if (big) {
    // Many tiny samples: 300 of length 1..8, with a few chunk-edge lengths between them.
    const std::vector<int64_t> tiny = tiny_lens(g);
    cs.push_back(gdn_case(g, 2, 4, tiny, Gates::Normal, fmt::format("{} tiny", tiny.size())));
    // 32,768 tokens in one batch.
    const std::vector<int64_t> longest = {16384, 8191, 4097, 2048, 1024, 1023, 1};
    cs.push_back(gdn_case(g, 2, 6, longest, Gates::Normal, lens_str(longest)));
    cs.push_back(gdn_case(g, 1, 3, {4095, 129}, Gates::Strong, "[4095,129]"));
    cs.push_back(gdn_case(g, 1, 2, {1000, 3000}, Gates::Near0, "[1000,3000]"));
  }
  return cs;
}

std::vector<Case> conv_cases(at::Generator& g, bool big) {
  std::vector<Case> cs;
  std::vector<std::pair<int64_t, int64_t>> shapes = {{24, 4}, {10, 2}};
  if (big) shapes.emplace_back(10240, 4);  // 27B's Gated DeltaNet conv: 2*16*128 + 48*128 channels
  for (auto [ch, w] : shapes)
    for (bool silu : {true, false}) {
      std::vector<std::vector<int64_t>> grid = kLensGrid;
      if (ch == 10240) {
        if (!silu) continue;
        grid = {{1, 2, 3, 63, 64, 65, 200}, tiny_lens(g), kChatLens};
      }
      for (const auto& lens : grid) {
        int64_t T = 0;
        for (int64_t l : lens) T += l;
        Case c;
        c.name = fmt::format("C={} W={} act={} lens={}", ch, w, silu ? "silu" : "none",
                             lens.size() > 20 ? fmt::format("{} tiny", lens.size()) : lens_str(lens));
        c.lens = lens;
        c.inputs = {{rnd({T, ch}, g), true, true, "x"}, {rnd({ch, w}, g, 0.5), false, true, "weight"}};
        c.call = [silu](Component& k, const std::vector<at::Tensor>& x, const SeqInfo& s) {
          return static_cast<Conv1d&>(k).forward(x[0], x[1], s, silu ? Activation::SiLU : Activation::None);
        };
        cs.push_back(std::move(c));
      }
    }
  return cs;
}

// The operations of an ops backend (only its own: the check judges what it provides), built once
// per component by check_one.
using OpTables = std::map<const Component*, OpTable>;

template <class Op>
const typename Op::Fn& op_of(OpTables& tables, Component& k) {
  auto it = tables.find(&k);
  if (it == tables.end()) {
    OpTable t;
    static_cast<Ops&>(k).provide(t, "checked");
    it = tables.emplace(&k, std::move(t)).first;
  }
  return it->second.get<Op>();
}

// Small shapes everywhere; on CUDA (`big`) also the 27B shapes: norms at hidden 5,120 over 8,192
// tokens, the q/k norm with RoPE over 24 heads of 256, the gated norm over 48 heads of 128,
// SwiGLU at 17,408, the loss over vocab 248,320 (3,000 rows: more than one token chunk of a fused
// loss).
std::vector<Case> ops_cases(at::Generator& g, bool big, OpTables& tables) {
  std::vector<Case> cs;
  auto add = [&](std::string name, std::string op, std::vector<Input> inputs, Call call) {
    Case c;
    c.name = std::move(name);
    c.op = std::move(op);
    c.inputs = std::move(inputs);
    c.call = std::move(call);
    cs.push_back(std::move(c));
  };
  const int64_t T = 77;
  struct Sizes {
    int64_t T, H, heads, D, G, DV, I, N, V;
  };
  std::vector<Sizes> sizes = {{77, 64, 6, 16, 6, 16, 96, 77, 512}};
  if (big) sizes.push_back({8192, 5120, 24, 256, 48, 128, 17408, 3000, 248320});
  for (const Sizes& z : sizes) {
    const std::string at_ = z.T == T ? "" : " (27B)";
    for (bool zc : {true, false}) {
      add(fmt::format("rms_norm zero_centred={} [{}, {}]{}", zc, z.T, z.H, at_), op::RmsNorm::kName,
          {{rnd({z.T, z.H}, g), true, true, "x"}, {rnd({z.H}, g, 0.3), false, true, "weight"}},
          [zc, &tables](Component& k, const std::vector<at::Tensor>& x, const SeqInfo&) {
            return op_of<op::RmsNorm>(tables, k)(x[0], x[1], 1e-6, zc);
          });
    }
    add(fmt::format("add_rms_norm [{}, {}]{}", z.T, z.H, at_), op::AddRmsNorm::kName,
        {{rnd({z.T, z.H}, g), true, true, "x"}, {rnd({z.T, z.H}, g), true, true, "residual"},
         {rnd({z.H}, g, 0.3), false, true, "weight"}},
        [&tables](Component& k, const std::vector<at::Tensor>& x, const SeqInfo&) {
          auto [y, s] = op_of<op::AddRmsNorm>(tables, k)(x[0], x[1], x[2], 1e-6, true);
          return at::cat({y, s}, -1);  // both outputs judged, both with a cotangent
        });
    add(fmt::format("gated_rms_norm [{}, {}, {}] (fp32 weight){}", z.T, z.G, z.DV, at_), op::GatedRmsNorm::kName,
        {{rnd({z.T, z.G, z.DV}, g), true, true, "x"}, {rnd({z.T, z.G, z.DV}, g), true, true, "z"},
         {rnd({z.DV}, g, 0.3) + 1.0, false, true, "weight"}},
        [&tables](Component& k, const std::vector<at::Tensor>& x, const SeqInfo&) {
          return op_of<op::GatedRmsNorm>(tables, k)(x[0], x[1], at_least_fp32(x[2]), 1e-6);
        });
    add(fmt::format("swiglu [{}, {}]{}", z.T, z.I, at_), op::SwiGlu::kName,
        {{rnd({z.T, z.I}, g), true, true, "gate"}, {rnd({z.T, z.I}, g), true, true, "up"}},
        [&tables](Component& k, const std::vector<at::Tensor>& x, const SeqInfo&) {
          return op_of<op::SwiGlu>(tables, k)(x[0], x[1]);
        });
    add(fmt::format("swiglu_packed [{}, 2x{}]{}", z.T, z.I, at_), op::SwiGluPacked::kName,
        {{rnd({z.T, 2 * z.I}, g), true, true, "gate_up"}},
        [&tables](Component& k, const std::vector<at::Tensor>& x, const SeqInfo&) {
          return op_of<op::SwiGluPacked>(tables, k)(x[0]);
        });
    // q/k norm + RoPE: rotary tables of positions 0..T-1 (theta 1e7, R = D/4 as Qwen3.5), the
    // query a strided view of a [T, heads, 2D] query/gate projection (as the model passes it).
    {
      const int64_t R = z.D / 4;
      at::Tensor pos = at::arange(z.T, at::kDouble).unsqueeze(-1);
      at::Tensor inv = 1.0 / at::pow(1e7, at::arange(0, R, 2, at::kDouble) / static_cast<double>(R));
      at::Tensor ang = at::cat({pos * inv, pos * inv}, -1).unsqueeze(-2);  // [T, 1, R]
      for (bool view : {false, true})
        add(fmt::format("qk_norm_rope [{}, {}, {}] rot {}{}{}", z.T, z.heads, z.D, R,
                        view ? " (strided view)" : "", at_),
            op::QkNormRope::kName,
            {{rnd({z.T, z.heads, view ? 2 * z.D : z.D}, g), true, true, "x"},
             {rnd({z.D}, g, 0.3), false, true, "weight"},
             {ang.cos().to(at::kFloat), true, false, "cos"},
             {ang.sin().to(at::kFloat), true, false, "sin"}},
            [view, D = z.D, &tables](Component& k, const std::vector<at::Tensor>& x, const SeqInfo&) {
              at::Tensor q = view ? x[0].narrow(-1, 0, D) : x[0];
              return op_of<op::QkNormRope>(tables, k)(q, x[1], 1e-6, true, x[2], x[3]);
            });
    }
    for (int64_t V : z.V == 512 ? std::vector<int64_t>{512, 1000} : std::vector<int64_t>{z.V}) {
      at::Tensor targets = at::randint(V, {z.N}, g, at::kLong);
      targets.narrow(0, 0, std::min<int64_t>(10, z.N)).fill_(kIgnoreIndex);
      const int64_t H = z.V == 512 ? 64 : z.H;
      add(fmt::format("linear_cross_entropy_sum [{}, {}] x [{}, {}]{}", z.N, H, V, H, at_),
          op::LinearCrossEntropy::kName,
          {{rnd({z.N, H}, g), true, true, "hidden"}, {rnd({V, H}, g, 0.1 / std::sqrt(H / 64.0)), false, true, "weight"},
           {targets, true, false, "targets"}},
          [&tables](Component& k, const std::vector<at::Tensor>& x, const SeqInfo&) {
            return op_of<op::LinearCrossEntropy>(tables, k)(x[0], x[1], x[2]);
          });
    }
  }
  // The optimizer step (not differentiated: the result is the updated parameters, moments and
  // step counts, one after another). Tensors of awkward sizes cut from one buffer, so that most
  // start at a misaligned offset and end in a short tile, between sizes of whole 8-element vectors;
  // on CUDA also a longer list (a [4096, 5120] projection among 299 smaller tensors).
  // g and m are O(1), v >= 0.25 and lr large, so that every term of the update shows through the
  // bf16 rounding of the result.
  std::vector<std::vector<int64_t>> lists = {{1, 7, 4095, 4096, 4097, 8, 65537, 16, 3}};
  if (big) {
    std::vector<int64_t> many = {4096 * 5120, 5120};
    for (int i = 0; i < 298; ++i) many.push_back(1 + (i * 7919) % 20000);
    lists.push_back(many);
  }
  struct Guard {
    const char* name;
    double scale, inf;  // scale 0: no grad_scale; inf < 0: no found_inf
  };
  for (const auto& sizes : lists)
    for (Guard gd : {Guard{"", 0, -1}, Guard{", grad_scale 2.5", 2.5, 0}, Guard{", found_inf", 2.5, 1}}) {
      if (sizes.size() > 100 && gd.inf > 0) continue;
      int64_t n = 0;
      for (int64_t k : sizes) n += k;
      add(fmt::format("adamw_step {} tensors of {} elements{}", sizes.size(), n, gd.name), op::AdamWStep::kName,
          {{rnd({n}, g), false, false, "params"}, {rnd({n}, g), false, false, "grads"},
           {rnd({n}, g), false, false, "exp_avgs"}, {rnd({n}, g).abs() + 0.25, false, false, "exp_avg_sqs"}},
          [sizes, gd, &tables](Component& k, const std::vector<at::Tensor>& x, const SeqInfo&) {
            at::Tensor P = x[0].clone(), M = x[2].clone(), V = x[3].clone();
            const auto f32 = x[0].options().dtype(at::kFloat);
            at::Tensor steps = (at::arange(static_cast<int64_t>(sizes.size()), f32) * 3).remainder(11);
            std::vector<at::Tensor> ps = P.split_with_sizes(sizes), gs = x[1].split_with_sizes(sizes),
                                    ms = M.split_with_sizes(sizes), vs = V.split_with_sizes(sizes), st;
            for (int64_t i = 0; i < steps.numel(); ++i) st.push_back(steps[i]);
            at::Tensor scale = gd.scale > 0 ? at::full({}, gd.scale, f32) : at::Tensor();
            at::Tensor inf = gd.inf >= 0 ? at::full({}, gd.inf, f32) : at::Tensor();
            op_of<op::AdamWStep>(tables, k)(ps, gs, ms, vs, st, 0.3, 0.9, 0.95, 0.1, 1e-8, scale, inf);
            return at::cat({P, M, V, steps.to(P.scalar_type())});
          });
    }
  // The gradient norm's square sum over the same awkward lists (fp64 result).
  for (const auto& sizes : lists) {
    int64_t n = 0;
    for (int64_t k : sizes) n += k;
    add(fmt::format("square_sum {} tensors of {} elements", sizes.size(), n), op::SquareSum::kName,
        {{rnd({n}, g), false, false, "tensors"}},
        [sizes, &tables](Component& k, const std::vector<at::Tensor>& x, const SeqInfo&) {
          return op_of<op::SquareSum>(tables, k)(x[0].split_with_sizes(sizes)).reshape({1});
        });
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

using Settings = std::vector<std::pair<std::string, std::string>>;  // --set key=value, in order

// The component's config: the schema defaults, with `settings` (scalar values spelled as in a
// recipe, checked like one: parse_scalar) in their place. Throws UserError listing every bad
// setting.
Config check_config(const RegistryEntry& e, const std::string& path, const Settings& settings) {
  std::map<std::string, Value> v;
  std::vector<std::string> names;
  for (const auto& f : e.info.schema.fields()) {
    QRUN_CHECK(!f.required, "{} '{}' has a required field '{}'; `qrun check` can only run "
               "components whose fields all have defaults", e.info.kind, e.info.name, f.name);
    v[f.name] = f.default_value;
    names.push_back(f.name);
  }
  std::vector<std::string> problems;
  for (const auto& [key, text] : settings) {
    const std::string label = fmt::format("--set {}={}", key, text);
    const Field* f = e.info.schema.find(key);
    if (f == nullptr) {
      problems.push_back(fmt::format("{}: {} '{}' has no setting '{}'{}; allowed: {}", label, e.info.kind,
                                     e.info.name, key, did_you_mean(key, names),
                                     names.empty() ? "(none)" : join(names)));
      continue;
    }
    if (f->type == FieldType::IntList || f->type == FieldType::FloatList || f->type == FieldType::StringList) {
      problems.push_back(fmt::format("{}: '{}' is a {}; lists are set in a recipe", label, key, field_type_name(f->type)));
      continue;
    }
    std::string why;
    Value x = parse_scalar(*f, f->type, text, label, why);
    if (why.empty()) v[key] = std::move(x);
    else problems.push_back(why);
  }
  if (!problems.empty()) throw UserError(join(problems, "\n"));
  return Config(path, v);
}

std::unique_ptr<Component> create(const Registry& r, const std::string& kind, const std::string& name,
                                  const Settings& settings = {}) {
  const RegistryEntry& e = r.get(kind, name);
  Config cfg = check_config(e, "check." + kind, settings);
  auto c = e.info.factory(cfg);
  QRUN_ASSERT(c != nullptr, "factory of {} '{}' returned null", kind, name);
  return c;
}

struct Options {
  std::string device;  // "", "cpu" or "cuda"
  std::string dtype;   // "", "Float" or "BFloat16" (c10 names)
  uint64_t seed = 1234;
  Settings settings;   // for the backend(s) under test
};

bool check_one(const std::string& kind, const std::string& name, const Registry& registry,
               const Options& opts) {
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
    backend = create(registry, kind, name, opts.settings);
    ref = create(registry, kind, ref_name);
  } catch (const UserError& e) {
    fmt::print("qrun check {}/{}: {}\n", kind, name, e.what());
    return false;
  } catch (const std::exception& e) {
    fmt::print("qrun check {}/{}: cannot create the component: {}\n", kind, name, e.what());
    return false;
  }

  struct Setting {
    at::Device dev;
    c10::ScalarType dt;
    Tol tol;
    Metric metric;
  };
  // bf16: 2e-3 for every kind, forward and every gradient, beyond the bf16 storage rounding,
  // unless the backend states another bound (KernelBackend::bf16_tolerance, with its reason).
  const KernelBackend* kb_tol = as_backend(kind, backend.get());
  const auto stated = kb_tol ? kb_tol->bf16_tolerance() : std::pair<double, double>{2e-3, 2e-3};
  const Tol bf16_tol = Tol{stated.first, stated.second};
  std::vector<Setting> all = {{at::Device(at::kCPU), at::kFloat, {1e-4, 1e-3}, Metric::MaxNormalised}};
  if (at::hasCUDA()) {
    all.push_back({at::Device(at::kCUDA, 0), at::kFloat, {1e-3, 1e-2}, Metric::MaxNormalised});
    all.push_back({at::Device(at::kCUDA, 0), at::kBFloat16, bf16_tol, Metric::BeyondStorageNormwise});
  }
  std::vector<Setting> settings;
  for (const auto& st : all)
    if ((opts.device.empty() || opts.device == st.dev.str().substr(0, opts.device.size())) &&
        (opts.dtype.empty() || opts.dtype == c10::toString(st.dt)))
      settings.push_back(st);
  if (settings.empty()) {
    fmt::print("qrun check {}/{}: no setting matches --device '{}' --dtype '{}' on this machine "
               "(CUDA {})\n", kind, name, opts.device, opts.dtype,
               at::hasCUDA() ? "available" : "not available");
    return false;
  }
  const bool explicit_setting = !opts.device.empty() || !opts.dtype.empty();
  bool all_ok = true;
  int total = 0, passed = 0, ran = 0;
  double worst_fwd = 0, worst_bwd = 0;
  std::vector<std::string> skipped;
  OpTables tables;
  std::vector<std::string> not_provided;  // ops the backend leaves to the reference
  if (kind == Ops::kKind) {
    OpTable own;
    static_cast<Ops&>(*backend).provide(own, name);
    OpTable all;
    static_cast<Ops&>(*ref).provide(all, ref_name);
    std::set<std::string> mine;
    for (const auto& [op, p] : own.providers()) mine.insert(op);
    for (const auto& [op, p] : all.providers())
      if (!mine.count(op)) not_provided.push_back(op);
    if (mine.empty()) {
      fmt::print("qrun check ops/{}: the backend provides no operation\n", name);
      return false;
    }
  }
  for (const auto& st : settings) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(opts.seed);
    // The 27B shapes on CUDA, unless QRUN_CHECK_SMALL is set (for compute-sanitizer runs).
    const bool big = st.dev.is_cuda() && std::getenv("QRUN_CHECK_SMALL") == nullptr;
    std::vector<Case> cases = kind == Attention::kKind          ? attention_cases(gen, big)
                              : kind == LinearAttention::kKind ? gdn_cases(gen, big)
                              : kind == Conv1d::kKind          ? conv_cases(gen, big)
                                                               : ops_cases(gen, big, tables);
    if (!not_provided.empty())
      std::erase_if(cases, [&](const Case& c) {
        return std::find(not_provided.begin(), not_provided.end(), c.op) != not_provided.end();
      });
    const std::string where = fmt::format("{} ({})", st.dev.str(), c10::toString(st.dt));
    // Note [What a backend can run] (sdk kernels.h): the backend's own answer for this setting.
    if (!explicit_setting) {
      KernelUse use;
      use.kind = kind;
      use.device = st.dev.type();
      use.dtype = st.dt;
      const KernelBackend* kb = as_backend(kind, backend.get());
      const std::string why = kb ? kb->unsupported(use) : std::string();
      if (!why.empty()) {
        fmt::print("\nqrun check {}/{} on {}: not supported by the backend, skipped:\n  {}\n", kind,
                   name, where, why);
        skipped.push_back(where);
        continue;
      }
    }
    // Note [Unsupported settings]: a backend may support only some devices or dtypes (a CUDA
    // kernel, a bf16-only kernel). One call on the first case's first sample tells: if it refuses
    // the setting with a UserError (a clear "not supported" message), the setting is listed as
    // unsupported with that message instead of failing every row. A setting asked for with
    // --device/--dtype is never skipped, and a check in which no setting ran fails.
    if (!explicit_setting && !cases.empty()) {
      const Case& c = cases.front();
      try {
        at::NoGradGuard no_grad;
        std::vector<at::Tensor> xs;
        for (const auto& in : c.inputs) {
          at::Tensor t = c.lens.empty() || !in.token_major ? in.value : in.value.narrow(0, 0, c.lens[0]);
          t = t.to(st.dev);
          if (t.is_floating_point()) t = t.to(st.dt);
          xs.push_back(t);
        }
        SeqInfo seq = c.lens.empty() ? SeqInfo{} : make_seq({c.lens[0]}, Layout::Packed, st.dev);
        (void)c.call(*backend, xs, seq);
      } catch (const UserError& e) {
        fmt::print("\nqrun check {}/{} on {}: not supported by the backend, skipped:\n  {}\n", kind,
                   name, where, e.message());
        skipped.push_back(where);
        continue;
      } catch (const std::exception&) {
        // Anything else is a failure and shows up in the rows below.
      }
    }
    ++ran;
    const bool normwise = st.metric == Metric::BeyondStorageNormwise;
    std::string with;  // the --set settings, as given
    for (const auto& [k, v] : opts.settings) with += fmt::format("{}{}={}", with.empty() ? " with " : ", ", k, v);
    fmt::print("\nqrun check {}/{}{} vs {} on {}, seed {}, tolerance fwd {:.0e} grad {:.0e}{}\n", kind,
               name, with, ref_name, where, opts.seed, st.tol.fwd, st.tol.bwd,
               normwise ? "\n  error = norm-wise, beyond the bf16 storage rounding of the result "
                          "(raw norm-wise error beside it; framework/check.cpp Note [Error metrics])"
                        : ", error = max|got-ref|/max|ref|");
    fmt::print("  the reference runs in fp64 on the same (rounded) inputs (Note [fp64 judge])\n");
    if (normwise)
      fmt::print("{:<58} {:<7} {:>9} {:>9} {:>9} {:>9}  {:<8} {}\n", "case", "layout", "fwd err",
                 "raw", "grad err", "raw", "worst", "result");
    else
      fmt::print("{:<58} {:<7} {:>10} {:>10}  {:<8} {}\n", "case", "layout", "fwd err", "grad err",
                 "worst", "result");
    for (const auto& c : cases) {
      std::vector<Row> rows;
      Component& judge = *ref;
      // Inputs as the backend will see them (bf16 rounding applied to the reference too).
      Case cr = c;
      for (auto& in : cr.inputs)
        if (in.value.is_floating_point()) in.value = in.value.to(st.dt).to(at::kFloat);
      // The cotangent too: the backend's loss (o.float() * w).sum() hands it w rounded to o's
      // dtype, so the reference gets exactly that w.
      auto cotangent = [&](std::vector<int64_t> shape) {
        return at::randn(shape, gen, at::kFloat).to(st.dt).to(at::kFloat).to(st.dev);
      };
      try {
        if (c.lens.empty()) {
          Result want = run_plain(judge, cr, at::Tensor(), kJudgeDtype, st.dev);
          at::Tensor w = cotangent(want.out.sizes().vec());
          want = run_plain(judge, cr, w.to(kJudgeDtype), kJudgeDtype, st.dev);
          Row row{c.name, "-"};
          compare(run_plain(*backend, cr, w, st.dt, st.dev), want, cr.inputs, st.metric, row,
                  cr.grad_scales);
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
            wshape = c.call(judge, xs, make_seq({c.lens[0]}, Layout::Packed, st.dev)).sizes().vec();
          }
          wshape[0] = T;
          at::Tensor w = cotangent(wshape);
          Result want = reference_alone(judge, cr, w.to(kJudgeDtype), st.dev);
          for (Layout layout : {Layout::Packed, Layout::Padded}) {
            Row row{c.name, layout_name(layout)};
            compare(run_layout(*backend, cr, w, layout, st.dt, st.dev), want, cr.inputs, st.metric,
                    row, cr.grad_scales);
            rows.push_back(row);
          }
        }
      } catch (const std::exception& e) {
        Row row{c.name, "-"};
        row.fwd = row.bwd = row.fwd_raw = row.bwd_raw = INFINITY;
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
        if (normwise)
          fmt::print("{:<58} {:<7} {:>9.2e} {:>9.2e} {:>9.2e} {:>9.2e}  {:<8} {}\n", row.name,
                     row.layout, row.fwd, row.fwd_raw, row.bwd, row.bwd_raw, row.worst_grad,
                     row.pass ? "pass" : "FAIL");
        else
          fmt::print("{:<58} {:<7} {:>10.2e} {:>10.2e}  {:<8} {}\n", row.name, row.layout, row.fwd,
                     row.bwd, row.worst_grad, row.pass ? "pass" : "FAIL");
        if (!row.error.empty()) fmt::print("    error: {}\n", row.error);
      }
    }
  }
  if (ran == 0) {
    fmt::print("{}/{}: FAILED: the backend supports none of the settings tried ({})\n", kind, name,
               fmt::join(skipped, ", "));
    return false;
  }
  fmt::print("{}/{}: {}/{} passed; worst fwd err {:.2e}, worst grad err {:.2e}{}{}\n", kind, name,
             passed, total, worst_fwd, worst_bwd,
             skipped.empty() ? "" : fmt::format("; not supported, skipped: {}", fmt::join(skipped, ", ")),
             not_provided.empty() ? ""
                                  : fmt::format("; left to the reference (not provided): {}",
                                                fmt::join(not_provided, ", ")));
  return all_ok;
}

}  // namespace

int run_check(const std::vector<std::string>& args, const Registry& registry) {
  const char* usage =
      "usage: qrun check <kind>/<name> [<kind>/<name> ...] [--device cpu|cuda] "
      "[--dtype fp32|bf16] [--seed N|random] [--set key=value ...]\n"
      "  kinds: attention, linear_attention, conv1d, ops\n"
      "  --set: a setting of the backend(s) under test, as in a recipe (e.g. backward_operands=fp16)\n";
  Options opts;
  std::vector<std::string> names;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--set") {
      const size_t eq = i + 1 < args.size() ? args[i + 1].find('=') : std::string::npos;
      if (eq == std::string::npos || eq == 0) {
        fmt::print("qrun check: --set needs key=value (a setting of the backend, e.g. "
                   "backward_operands=fp16)\n{}", usage);
        return 2;
      }
      const std::string& kv = args[++i];
      opts.settings.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
      continue;
    }
    if (a == "--device" || a == "--dtype" || a == "--seed") {
      if (i + 1 >= args.size()) {
        fmt::print("qrun check: {} needs a value\n{}", a, usage);
        return 2;
      }
      const std::string& v = args[++i];
      if (a == "--device") {
        if (v != "cpu" && v != "cuda") {
          fmt::print("qrun check: --device '{}' is not cpu or cuda\n", v);
          return 2;
        }
        opts.device = v;
      } else if (a == "--dtype") {
        if (v == "fp32" || v == "float32") opts.dtype = c10::toString(at::kFloat);
        else if (v == "bf16" || v == "bfloat16") opts.dtype = c10::toString(at::kBFloat16);
        else {
          fmt::print("qrun check: --dtype '{}' is not fp32 or bf16\n", v);
          return 2;
        }
      } else if (v == "random") {
        opts.seed = static_cast<uint64_t>(std::time(nullptr));
      } else {
        char* end = nullptr;
        opts.seed = std::strtoull(v.c_str(), &end, 10);
        if (v.empty() || *end != '\0') {
          fmt::print("qrun check: --seed '{}' is not a number or 'random'\n", v);
          return 2;
        }
      }
      continue;
    }
    names.push_back(a);
  }
  if (names.empty()) {
    fmt::print("{}", usage);
    return 2;
  }
  bool ok = true;
  for (const auto& a : names) {
    auto slash = a.find('/');
    if (slash == std::string::npos) {
      fmt::print("qrun check: '{}' is not <kind>/<name> (e.g. linear_attention/gdn-reference)\n", a);
      ok = false;
      continue;
    }
    ok = check_one(a.substr(0, slash), a.substr(slash + 1), registry, opts) && ok;
  }
  fmt::print("\nqrun check: {}\n", ok ? "all passed" : "FAILED");
  return ok ? 0 : 2;
}

}  // namespace qrun
