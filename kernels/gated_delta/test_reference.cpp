// CPU tests of the double-precision reference (runs in CI, no GPU):
//  1. chunked (C = 64) forward == token-loop forward (output and final state);
//  2. token-loop adjoint == central finite differences on tiny shapes, for every gradient,
//     with and without the fused l2norm / gate / sigmoid options, across chunk-sized segments.
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>

#include "reference.h"

using namespace qrun::gdn;

static ref::Inputs make(std::mt19937_64& rng, std::vector<int32_t> lens, int H, int HV, int K, int V,
                        bool l2, bool gate, bool sig, bool h0, double gmin) {
  std::normal_distribution<double> nd;
  std::uniform_real_distribution<double> ud(0, 1);
  ref::Inputs in;
  in.cu = {0};
  for (int l : lens) in.cu.push_back(in.cu.back() + l);
  in.T = in.cu.back();
  in.H = H; in.HV = HV; in.K = K; in.V = V;
  in.l2norm = l2; in.gate_fused = gate; in.beta_sigmoid = sig;
  const double ks = l2 ? 1.0 : 1.0 / std::sqrt((double)K);
  in.q.resize(in.T * H * K); in.k.resize(in.T * H * K); in.v.resize(in.T * HV * V);
  for (auto& x : in.q) x = nd(rng) * ks;
  for (auto& x : in.k) x = nd(rng) * ks;
  for (auto& x : in.v) x = nd(rng);
  in.g.resize(in.T * HV); in.a.resize(in.T * HV); in.beta.resize(in.T * HV);
  for (auto& x : in.g) x = gmin * ud(rng);
  for (auto& x : in.a) x = nd(rng);
  for (auto& x : in.beta) x = sig ? nd(rng) : ud(rng);
  in.A_log.resize(HV); in.dt_bias.resize(HV);
  for (auto& x : in.A_log) x = std::log(1.0 + 4 * ud(rng));
  for (auto& x : in.dt_bias) x = nd(rng);
  if (h0) { in.h0.resize(in.N() * HV * K * V); for (auto& x : in.h0) x = 0.3 * nd(rng); }
  return in;
}

static double rel(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) { num += (a[i] - b[i]) * (a[i] - b[i]); den += b[i] * b[i]; }
  return std::sqrt(num / std::max(den, 1e-300));
}

int main() {
  std::mt19937_64 rng(std::random_device{}());
  int fails = 0;
  // 1. chunked vs token loop
  struct CC { std::vector<int32_t> lens; int H, HV; bool l2, gate, sig, h0; double gmin; };
  std::vector<CC> cc = {
      {{1, 2, 3, 63, 64, 65, 130}, 1, 2, true, false, false, true, -0.1},
      {{200}, 2, 6, false, true, true, false, 0},
      {{70, 0, 5}, 1, 3, true, false, true, true, -8.0},
      {{129}, 1, 1, true, false, false, false, -1e-4},
  };
  for (auto& c : cc) {
    auto in = make(rng, c.lens, c.H, c.HV, 16, 8, c.l2, c.gate, c.sig, c.h0, c.gmin);
    auto a = ref::forward(in, 4), b = ref::forward_chunked(in, 4);
    const double eo = rel(b.o, a.o), eh = rel(b.ht, a.ht);
    const bool ok = eo < 1e-10 && eh < 1e-10;
    std::printf("%s chunked-vs-loop T=%lld HV=%d: o %.2e ht %.2e\n", ok ? "PASS" : "FAIL", (long long)in.T, c.HV, eo, eh);
    fails += !ok;
  }
  // 2. finite differences
  struct FC { std::vector<int32_t> lens; int H, HV; bool l2, gate, sig, h0; double gmin; };
  std::vector<FC> fc = {
      {{3, 1, 70}, 1, 2, false, false, false, true, -0.5},
      {{5, 66}, 1, 2, true, true, true, true, 0},
      {{4, 2}, 2, 2, true, false, true, false, -3.0},
  };
  for (auto& c : fc) {
    auto in = make(rng, c.lens, c.H, c.HV, 4, 3, c.l2, c.gate, c.sig, c.h0, c.gmin);
    std::normal_distribution<double> nd;
    std::vector<double> Wo(in.T * in.HV * in.V), Wh(in.N() * in.HV * in.K * in.V);
    for (auto& x : Wo) x = nd(rng);
    for (auto& x : Wh) x = nd(rng);
    auto loss = [&](const ref::Inputs& x) {
      auto f = ref::forward(x, 1);
      double s = 0;
      for (size_t i = 0; i < Wo.size(); ++i) s += f.o[i] * Wo[i];
      for (size_t i = 0; i < Wh.size(); ++i) s += f.ht[i] * Wh[i];
      return s;
    };
    auto gr = ref::backward(in, Wo, &Wh, 1);
    auto fd = [&](std::vector<double> ref::Inputs::*field) {
      ref::Inputs x = in;
      std::vector<double> d((x.*field).size());
      const double eps = 1e-6;
      for (size_t i = 0; i < d.size(); ++i) {
        const double s0 = (x.*field)[i];
        (x.*field)[i] = s0 + eps; const double lp = loss(x);
        (x.*field)[i] = s0 - eps; const double lm = loss(x);
        (x.*field)[i] = s0;
        d[i] = (lp - lm) / (2 * eps);
      }
      return d;
    };
    struct Chk { const char* name; std::vector<double> ref::Inputs::*f; const std::vector<double>* an; };
    std::vector<Chk> chk = {{"dq", &ref::Inputs::q, &gr.dq}, {"dk", &ref::Inputs::k, &gr.dk},
                            {"dv", &ref::Inputs::v, &gr.dv},
                            {c.gate ? "da" : "dg", c.gate ? &ref::Inputs::a : &ref::Inputs::g, &gr.dg},
                            {c.sig ? "db" : "dbeta", &ref::Inputs::beta, &gr.dbeta}};
    if (c.gate) { chk.push_back({"dA_log", &ref::Inputs::A_log, &gr.dA_log}); chk.push_back({"ddt_bias", &ref::Inputs::dt_bias, &gr.ddt_bias}); }
    if (c.h0) chk.push_back({"dh0", &ref::Inputs::h0, &gr.dh0});
    if (c.gate) {
      // the summed gradients' term sizes: sum_t |da_t| for ddt_bias (its terms are the da the
      // finite differences check), and at least |dA_log| for dA_log
      bool ok = gr.ddt_bias_terms.size() == (size_t)c.HV && gr.dA_log_terms.size() == (size_t)c.HV;
      for (int h = 0; ok && h < c.HV; ++h) {
        double s = 0;
        for (int64_t t = 0; t < in.T; ++t) s += std::abs(gr.dg[t * c.HV + h]);
        ok = std::abs(gr.ddt_bias_terms[h] - s) <= 1e-12 * s && gr.dA_log_terms[h] >= std::abs(gr.dA_log[h]) &&
             gr.dA_log_terms[h] > 0;
      }
      std::printf("%s terms of dA_log, ddt_bias T=%lld HV=%d\n", ok ? "PASS" : "FAIL", (long long)in.T, c.HV);
      fails += !ok;
    }
    for (auto& k : chk) {
      const double e = rel(*k.an, fd(k.f));
      const bool ok = e < 1e-6;
      std::printf("%s fd %-8s T=%lld l2=%d gate=%d sig=%d: rel %.2e\n", ok ? "PASS" : "FAIL", k.name,
                  (long long)in.T, c.l2, c.gate, c.sig, e);
      fails += !ok;
    }
  }
  std::printf("%s: %d failure(s)\n", fails ? "FAILED" : "ALL PASSED", fails);
  return fails ? 1 : 0;
}
