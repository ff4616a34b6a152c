// tests/model/test_kernels.cpp - the reference backends against independent oracles:
// gdn-reference (chunked) vs a token-loop recurrence of the gated delta rule (spec section 2.5),
// conv-reference vs an explicit tap loop, ops/reference (norms, gated norm, SwiGLU, the fused
// linear cross-entropy) vs scalar fp64 formulas and their central finite differences, the
// reference AdamW step vs LibTorch's fused AdamW; packed == each sample alone == padded for every
// reference kind (via `qrun check`, framework/check.cpp), and a deliberately leaky backend fails
// the check, also when only a `qrun check --set` setting makes it leak.
#include "check.h"
#include "test_util.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include <torch/csrc/autograd/autograd.h>

using namespace qrun;
using namespace qrun::test;

namespace {

const std::vector<int64_t> kLens = {1, 2, 3, 63, 64, 65, 200};

SeqInfo packed_seq(const std::vector<int64_t>& lens) {
  std::vector<Sample> s;
  for (int64_t L : lens) s.push_back({at::zeros({L}, at::kLong), at::zeros({L}, at::kLong)});
  return packed_batch(s).seq;
}

// Token loop: S_t = e^{g_t} S_{t-1}; d = beta (v - S~^T k); S_t = S~ + k d^T; o = S_t^T q.
at::Tensor gdn_loop(const GatedDeltaInputs& in, const std::vector<int64_t>& lens) {
  const int64_t H = in.q.size(1), K = in.q.size(2), HV = in.v.size(1), V = in.v.size(2);
  at::Tensor q = in.q.to(at::kFloat), k = in.k.to(at::kFloat);
  q = q * at::rsqrt(q.pow(2).sum(-1, true) + 1e-6) / std::sqrt(static_cast<double>(K));
  k = k * at::rsqrt(k.pow(2).sum(-1, true) + 1e-6);
  q = q.repeat_interleave(HV / H, 1);
  k = k.repeat_interleave(HV / H, 1);
  at::Tensor g = -at::exp(in.A_log) * at::softplus(in.a.to(at::kFloat) + in.dt_bias);
  at::Tensor beta = at::sigmoid(in.b.to(at::kFloat));
  std::vector<at::Tensor> outs;
  int64_t t0 = 0;
  for (int64_t L : lens) {
    at::Tensor S = at::zeros({HV, K, V});
    for (int64_t t = t0; t < t0 + L; ++t) {
      S = S * g[t].exp().view({HV, 1, 1});
      at::Tensor m = at::matmul(S.transpose(1, 2), k[t].unsqueeze(-1)).squeeze(-1);  // [HV, V]
      at::Tensor d = beta[t].unsqueeze(-1) * (in.v[t].to(at::kFloat) - m);
      S = S + k[t].unsqueeze(-1) * d.unsqueeze(1);
      outs.push_back(at::matmul(S.transpose(1, 2), q[t].unsqueeze(-1)).squeeze(-1));
    }
    t0 += L;
  }
  return at::stack(outs, 0);
}

TEST(ReferenceKernels, GdnChunkedMatchesTokenLoop) {
  at::manual_seed(0);
  const int64_t T = 398, H = 2, HV = 4, K = 16, V = 8;
  GatedDeltaInputs in;
  in.q = at::randn({T, H, K}).requires_grad_();
  in.k = at::randn({T, H, K}).requires_grad_();
  in.v = at::randn({T, HV, V}).requires_grad_();
  in.a = at::randn({T, HV}).requires_grad_();
  in.b = at::randn({T, HV}).requires_grad_();
  in.A_log = (at::rand({HV}) * 2 - 1).requires_grad_();
  in.dt_bias = at::randn({HV}).requires_grad_();
  std::vector<at::Tensor> inputs = {in.q, in.k, in.v, in.a, in.b, in.A_log, in.dt_bias};
  SeqInfo seq = packed_seq(kLens);
  auto gdn = registry().create<LinearAttention>(
      "gdn-reference", Config("k", {{"chunk_size", int64_t{64}}}));
  at::Tensor o = gdn->forward(in, seq, GatedDeltaOptions{});
  at::Tensor ref = gdn_loop(in, kLens);
  double fe = rel_err(o, ref);
  EXPECT_LE(fe, 1e-5);
  at::Tensor w = at::randn_like(ref);
  auto g1 = torch::autograd::grad({(o * w).sum()}, inputs);
  auto g2 = torch::autograd::grad({(ref * w).sum()}, inputs);
  double worst = 0;
  for (size_t i = 0; i < g1.size(); ++i) {
    double e = rel_err(g1[i], g2[i]);
    worst = std::max(worst, e);
    EXPECT_LE(e, 1e-4) << "input " << i;
  }
  std::printf("[gdn chunked vs loop] fwd rel err %.3g, worst grad rel err %.3g\n", fe, worst);
}

TEST(ReferenceKernels, ConvMatchesTapLoop) {
  at::manual_seed(1);
  const int64_t T = 398, C = 6, W = 4;
  at::Tensor x = at::randn({T, C});
  at::Tensor wt = at::randn({C, W});
  SeqInfo seq = packed_seq(kLens);
  auto conv = registry().create<Conv1d>("conv-reference", Config("k", {}));
  at::Tensor y = conv->forward(x, wt, seq, Activation::SiLU);
  at::Tensor ref = at::zeros({T, C});
  int64_t t0 = 0;
  for (int64_t L : kLens) {
    for (int64_t t = 0; t < L; ++t)
      for (int64_t j = 0; j < W; ++j) {
        int64_t src = t - (W - 1) + j;
        if (src >= 0) ref[t0 + t] += wt.select(1, j) * x[t0 + src];
      }
    t0 += L;
  }
  EXPECT_LE(rel_err(y, at::silu(ref)), 1e-6);
}

// ops/reference against scalar fp64 formulas written out element by element (no ATen in the
// oracle): the output must match to rounding, and the autograd gradient of sum(out * w) must match
// the oracle's central finite differences input by input. `qrun check ops/reference` compares the
// reference with itself; this test is what makes the reference trustworthy.
using Flat = std::vector<double>;
using OpOracle = std::function<Flat(const std::vector<Flat>&)>;

Flat flat(const at::Tensor& t) {
  at::Tensor c = t.detach().to(at::kDouble).contiguous();
  return Flat(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

// inputs: the op's differentiable tensors (fp64); extra: tensors passed through unchanged.
void expect_matches_oracle(const char* what, const std::vector<at::Tensor>& inputs,
                           const std::function<at::Tensor(const std::vector<at::Tensor>&)>& op,
                           const OpOracle& oracle) {
  std::vector<at::Tensor> leaves;
  std::vector<Flat> xs;
  for (const auto& t : inputs) {
    leaves.push_back(t.detach().clone().requires_grad_());
    xs.push_back(flat(t));
  }
  at::Tensor out = op(leaves);
  const Flat want = oracle(xs);
  const Flat got = flat(out);
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 1e-30, worst = 0;
  for (double v : want) scale = std::max(scale, std::abs(v));
  for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - want[i]));
  EXPECT_LE(worst / scale, 1e-12) << what << ": forward";

  at::Tensor w = at::randn(out.sizes(), at::kDouble);
  const Flat wf = flat(w);
  auto grads = torch::autograd::grad({(out * w).sum()}, leaves);
  auto objective = [&](const std::vector<Flat>& x) {
    Flat o = oracle(x);
    double acc = 0;
    for (size_t i = 0; i < o.size(); ++i) acc += o[i] * wf[i];
    return acc;
  };
  for (size_t a = 0; a < xs.size(); ++a) {
    const Flat g = flat(grads[a]);
    double gscale = 1e-30, gworst = 0;
    for (size_t i = 0; i < xs[a].size(); ++i) {
      std::vector<Flat> xp = xs, xm = xs;
      const double h = 1e-6 * std::max(1.0, std::abs(xs[a][i]));
      xp[a][i] += h;
      xm[a][i] -= h;
      const double fd = (objective(xp) - objective(xm)) / (2 * h);
      gscale = std::max(gscale, std::abs(fd));
      gworst = std::max(gworst, std::abs(g[i] - fd));
    }
    EXPECT_LE(gworst / gscale, 1e-6) << what << ": gradient of input " << a;
  }
}

// y[t, d] = x[t, d] / sqrt(mean_d x^2 + eps) * (w[d] or 1 + w[d])
Flat rms_norm_oracle(const Flat& x, const Flat& w, int64_t D, double eps, bool zero_centred) {
  Flat y(x.size());
  for (size_t r = 0; r < x.size() / D; ++r) {
    double ss = 0;
    for (int64_t d = 0; d < D; ++d) ss += x[r * D + d] * x[r * D + d];
    const double inv = 1.0 / std::sqrt(ss / D + eps);
    for (int64_t d = 0; d < D; ++d)
      y[r * D + d] = x[r * D + d] * inv * (zero_centred ? 1.0 + w[d] : w[d]);
  }
  return y;
}

double silu(double v) { return v / (1.0 + std::exp(-v)); }

TEST(ReferenceKernels, OpsMatchFp64Formulas) {
  at::manual_seed(3);
  auto ops_backend = registry().create<Ops>("reference", Config("k", {}));
  OpTable ops;
  ops_backend->provide(ops, "reference");
  const int64_t T = 5, D = 8, H = 3, V = 11;
  const double eps = 1e-6;
  for (bool zc : {true, false}) {
    expect_matches_oracle(
        zc ? "rms_norm (zero-centred)" : "rms_norm", {at::randn({T, D}, at::kDouble), at::randn({D}, at::kDouble) * 0.3},
        [&](const std::vector<at::Tensor>& x) { return ops.get<op::RmsNorm>()(x[0], x[1], eps, zc); },
        [&](const std::vector<Flat>& x) { return rms_norm_oracle(x[0], x[1], D, eps, zc); });
  }
  // y = w * rms_norm(x) * silu(z), per head of D.
  expect_matches_oracle(
      "gated_rms_norm",
      {at::randn({T, H, D}, at::kDouble), at::randn({T, H, D}, at::kDouble), at::randn({D}, at::kDouble) + 1.0},
      [&](const std::vector<at::Tensor>& x) { return ops.get<op::GatedRmsNorm>()(x[0], x[1], x[2], eps); },
      [&](const std::vector<Flat>& x) {
        Flat y = rms_norm_oracle(x[0], x[2], D, eps, false);
        for (size_t i = 0; i < y.size(); ++i) y[i] *= silu(x[1][i]);
        return y;
      });
  expect_matches_oracle(
      "swiglu", {at::randn({T, D}, at::kDouble), at::randn({T, D}, at::kDouble)},
      [&](const std::vector<at::Tensor>& x) { return ops.get<op::SwiGlu>()(x[0], x[1]); },
      [&](const std::vector<Flat>& x) {
        Flat y(x[0].size());
        for (size_t i = 0; i < y.size(); ++i) y[i] = silu(x[0][i]) * x[1][i];
        return y;
      });
  // swiglu_packed: row t of [T, 2D] holds gate (d < D) then up.
  expect_matches_oracle(
      "swiglu_packed", {at::randn({T, 2 * D}, at::kDouble)},
      [&](const std::vector<at::Tensor>& x) { return ops.get<op::SwiGluPacked>()(x[0]); },
      [&](const std::vector<Flat>& x) {
        Flat y(T * D);
        for (int64_t t = 0; t < T; ++t)
          for (int64_t d = 0; d < D; ++d) y[t * D + d] = silu(x[0][t * 2 * D + d]) * x[0][t * 2 * D + D + d];
        return y;
      });
  // add_rms_norm: s = x + r, y = rms_norm(s); both outputs (y then s, concatenated).
  expect_matches_oracle(
      "add_rms_norm",
      {at::randn({T, D}, at::kDouble), at::randn({T, D}, at::kDouble), at::randn({D}, at::kDouble) * 0.3},
      [&](const std::vector<at::Tensor>& x) {
        auto [y, sum] = ops.get<op::AddRmsNorm>()(x[0], x[1], x[2], eps, true);
        return at::cat({y, sum}, -1);
      },
      [&](const std::vector<Flat>& x) {
        Flat sum(T * D);
        for (int64_t i = 0; i < T * D; ++i) sum[i] = x[0][i] + x[1][i];
        Flat y = rms_norm_oracle(sum, x[2], D, eps, true), out;
        for (int64_t t = 0; t < T; ++t) {
          out.insert(out.end(), y.begin() + t * D, y.begin() + (t + 1) * D);
          out.insert(out.end(), sum.begin() + t * D, sum.begin() + (t + 1) * D);
        }
        return out;
      });
  // qk_norm_rope: per head rms_norm, then for d < R/2: y[d] = n[d] c[d] - n[d+R/2] s[d],
  // y[d+R/2] = n[d+R/2] c[d+R/2] + n[d] s[d+R/2]; dims >= R unchanged. cos/sin [T, 1, R].
  {
    const int64_t R = 4;
    at::Tensor cs = at::randn({T, 1, R}, at::kDouble), sn = at::randn({T, 1, R}, at::kDouble);
    const Flat cf = flat(cs), sf = flat(sn);
    expect_matches_oracle(
        "qk_norm_rope", {at::randn({T, H, D}, at::kDouble), at::randn({D}, at::kDouble) * 0.3},
        [&](const std::vector<at::Tensor>& x) { return ops.get<op::QkNormRope>()(x[0], x[1], eps, true, cs, sn); },
        [&](const std::vector<Flat>& x) {
          Flat n = rms_norm_oracle(x[0], x[1], D, eps, true), y = n;
          for (int64_t t = 0; t < T; ++t)
            for (int64_t h = 0; h < H; ++h) {
              const int64_t b = (t * H + h) * D;
              for (int64_t d = 0; d < R / 2; ++d) {
                y[b + d] = n[b + d] * cf[t * R + d] - n[b + d + R / 2] * sf[t * R + d];
                y[b + d + R / 2] = n[b + d + R / 2] * cf[t * R + d + R / 2] + n[b + d] * sf[t * R + d + R / 2];
              }
            }
          return y;
        });
  }
  // sum over rows with a target of (logsumexp_v(h . W_v) - h . W_target); ignored rows add 0.
  at::Tensor targets = at::randint(V, {T}, at::kLong);
  targets[1] = kIgnoreIndex;
  const std::vector<int64_t> tg(targets.data_ptr<int64_t>(), targets.data_ptr<int64_t>() + T);
  expect_matches_oracle(
      "linear_cross_entropy_sum", {at::randn({T, D}, at::kDouble), at::randn({V, D}, at::kDouble) * 0.5},
      [&](const std::vector<at::Tensor>& x) { return ops.get<op::LinearCrossEntropy>()(x[0], x[1], targets); },
      [&](const std::vector<Flat>& x) {
        double loss = 0;
        for (int64_t t = 0; t < T; ++t) {
          if (tg[t] == kIgnoreIndex) continue;
          Flat logit(V, 0.0);
          double mx = -INFINITY;
          for (int64_t v = 0; v < V; ++v) {
            for (int64_t d = 0; d < D; ++d) logit[v] += x[0][t * D + d] * x[1][v * D + d];
            mx = std::max(mx, logit[v]);
          }
          double se = 0;
          for (int64_t v = 0; v < V; ++v) se += std::exp(logit[v] - mx);
          loss += mx + std::log(se) - logit[tg[t]];
        }
        return Flat{loss};
      });
}

// The reference AdamW step (the formula, one tensor at a time) against LibTorch's fused AdamW,
// and its square sum against _foreach_norm, which the host runs when the recipe's ops backend
// has no kernels of its own: fp32, three tensors,
// four steps with a gradient scale, a skipped step (found_inf) and weight decay.
TEST(ReferenceKernels, AdamWStepAndSquareSumMatchLibTorch) {
  at::manual_seed(5);
  auto ops_backend = registry().create<Ops>("reference", Config("k", {}));
  OpTable ops;
  ops_backend->provide(ops, "reference");
  const std::vector<int64_t> sizes = {1, 33, 130};
  std::vector<at::Tensor> p, m, v, st, p2, m2, v2, st2;
  for (int64_t n : sizes) {
    p.push_back(at::randn({n}));
    m.push_back(at::zeros({n}));
    v.push_back(at::zeros({n}));
    st.push_back(at::zeros({}));
    p2.push_back(p.back().clone());
    m2.push_back(at::zeros({n}));
    v2.push_back(at::zeros({n}));
    st2.push_back(at::zeros({}));
  }
  const double lr = 3e-2, b1 = 0.9, b2 = 0.95, wd = 0.1, eps = 1e-8;
  for (const auto& [scale, inf] : std::vector<std::pair<double, double>>{{1, 0}, {2.5, 0}, {2.5, 1}, {4, 0}}) {
    std::vector<at::Tensor> g;
    for (int64_t n : sizes) g.push_back(at::randn({n}));
    const at::Tensor s = at::full({}, scale, at::kFloat), f = at::full({}, inf, at::kFloat);
    const double sq = ops.get<op::SquareSum>()(g).item<double>();
    EXPECT_NEAR(sq, at::stack(at::_foreach_norm(g, 2, at::kDouble)).pow(2).sum().item<double>(), 1e-9 * sq) << "square_sum";
    ops.get<op::AdamWStep>()(p, g, m, v, st, lr, b1, b2, wd, eps, s, f);
    at::_foreach_add_(st2, 1.0);
    at::_fused_adamw_(p2, g, m2, v2, {}, st2, lr, b1, b2, wd, eps, false, false, s, f);
    at::_foreach_sub_(st2, std::vector<at::Tensor>(st2.size(), f));
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    EXPECT_TRUE(at::allclose(p[i], p2[i], 1e-5, 1e-6)) << "params " << i << ": " << (p[i] - p2[i]).abs().max().item<double>();
    EXPECT_TRUE(at::allclose(m[i], m2[i], 1e-5, 1e-7)) << "exp_avg " << i;
    EXPECT_TRUE(at::allclose(v[i], v2[i], 1e-5, 1e-8)) << "exp_avg_sq " << i;
    EXPECT_EQ(st[i].item<float>(), 3.f) << "step count " << i << " (one of four steps skipped)";
    EXPECT_EQ(st2[i].item<float>(), 3.f);
  }
}

TEST(ReferenceKernels, CheckPassesForEveryReference) {
  for (const char* b : {"attention/sdpa", "linear_attention/gdn-reference", "conv1d/conv-reference",
                        "ops/reference"}) {
    EXPECT_EQ(run_check({b}, registry()), 0) << b;
  }
  EXPECT_EQ(run_check({"conv1d/no-such"}, registry()), 2);
}

// A conv that ignores sample boundaries (the classic packing bug) must fail `qrun check`.
class LeakyConv final : public Conv1d {
 public:
  at::Tensor forward(const at::Tensor& x, const at::Tensor& w, const SeqInfo& seq,
                     Activation act) override {
    const int64_t C = w.size(0), W = w.size(1);
    at::Tensor xs = x.reshape({-1, C}).t().unsqueeze(0);  // whole stream as one sequence
    at::Tensor y = at::conv1d(at::constant_pad_nd(xs, {W - 1, 0}), w.unsqueeze(1), std::nullopt,
                              at::IntArrayRef{1}, at::IntArrayRef{0}, at::IntArrayRef{1}, C);
    if (act == Activation::SiLU) y = at::silu(y);
    (void)seq;
    return y.squeeze(0).t().reshape(x.sizes());
  }
};

// Registers a test conv1d backend beside the reference plugin's.
void add_test_conv(Registry& reg, const std::string& name, const std::string& summary, Schema schema,
                   std::function<std::unique_ptr<Component>(const Config&)> factory) {
  ComponentInfo info;
  info.kind = Conv1d::kKind;
  info.name = name;
  info.summary = summary;
  info.schema = std::move(schema);
  info.factory = std::move(factory);
  auto origin = std::make_shared<PluginOrigin>();
  origin->path = "<test>";
  origin->name = "test";
  reg.add(std::move(info), origin);
}

TEST(ReferenceKernels, CheckFailsForLeakyBackend) {
  Registry reg;
  load_plugin(reg, QRUN_TEST_REF_PLUGIN);
  add_test_conv(reg, "leaky", "test: ignores sample boundaries", Schema{},
                [](const Config&) -> std::unique_ptr<Component> { return std::make_unique<LeakyConv>(); });
  EXPECT_EQ(run_check({"conv1d/leaky"}, reg), 2);
}

// `qrun check --set key=value` reaches the backend under test, validated like a recipe section:
// a conv whose setting `leak` makes it ignore sample boundaries passes by default and fails with
// --set leak=true; bad settings stop with exit code 2.
TEST(ReferenceKernels, CheckPassesSettingsToTheBackend) {
  Registry reg;
  load_plugin(reg, QRUN_TEST_REF_PLUGIN);
  add_test_conv(reg, "maybe-leaky", "test: leaks across sample boundaries when asked to",
                Schema{Field::boolean("leak", false)}, [&reg](const Config& c) -> std::unique_ptr<Component> {
                  if (c.get_bool("leak")) return std::make_unique<LeakyConv>();
                  return reg.create<Conv1d>("conv-reference", Config("k", {}));
                });
  EXPECT_EQ(run_check({"conv1d/maybe-leaky", "--device", "cpu"}, reg), 0);
  EXPECT_EQ(run_check({"conv1d/maybe-leaky", "--device", "cpu", "--set", "leak=false"}, reg), 0);
  EXPECT_EQ(run_check({"conv1d/maybe-leaky", "--device", "cpu", "--set", "leak=true"}, reg), 2);
  EXPECT_EQ(run_check({"conv1d/maybe-leaky", "--set", "leak=perhaps"}, reg), 2);  // not a bool
  EXPECT_EQ(run_check({"conv1d/maybe-leaky", "--set", "leek=true"}, reg), 2);     // unknown key
  EXPECT_EQ(run_check({"conv1d/maybe-leaky", "--set", "leak"}, reg), 2);          // no value
  EXPECT_EQ(run_check({"conv1d/maybe-leaky", "--set"}, reg), 2);
  EXPECT_EQ(run_check({"conv1d/maybe-leaky", "--set", "leak=[true]"}, reg), 2);   // a list
  EXPECT_EQ(run_check({"linear_attention/gdn-reference", "--device", "cpu", "--set", "chunk_size=0"}, registry()),
            2);  // out of range
}

}  // namespace
