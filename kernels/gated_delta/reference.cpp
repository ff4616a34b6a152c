// CPU double-precision reference for the gated delta rule. See reference.h.
#include "reference.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <stdexcept>
#include <thread>

namespace qrun::gdn::ref {
namespace {

struct Pre {
  std::vector<double> qn, kn, rq, rk;  // normalised q/k [T,H,K], rstd [T,H]
  std::vector<double> ge, be;          // effective g, beta [T,HV]
  double s = 0;
};

double softplus_fwd(double x) { return x > 20.0 ? x : std::log1p(std::exp(x)); }
double softplus_grad(double x) { return x > 20.0 ? 1.0 : 1.0 / (1.0 + std::exp(-x)); }
double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

Pre preprocess(const Inputs& in) {
  Pre p;
  const int64_t T = in.T;
  const int H = in.H, HV = in.HV, K = in.K;
  p.s = in.scale > 0 ? in.scale : 1.0 / std::sqrt((double)K);
  p.qn = in.q; p.kn = in.k;
  p.rq.assign(T * H, 1.0); p.rk.assign(T * H, 1.0);
  if (in.l2norm) {
    for (int64_t r = 0; r < T * H; ++r) {
      double sq = 0, sk = 0;
      for (int c = 0; c < K; ++c) { sq += in.q[r * K + c] * in.q[r * K + c]; sk += in.k[r * K + c] * in.k[r * K + c]; }
      p.rq[r] = 1.0 / std::sqrt(sq + 1e-6); p.rk[r] = 1.0 / std::sqrt(sk + 1e-6);
      for (int c = 0; c < K; ++c) { p.qn[r * K + c] *= p.rq[r]; p.kn[r * K + c] *= p.rk[r]; }
    }
  }
  p.ge.resize(T * HV); p.be.resize(T * HV);
  for (int64_t t = 0; t < T; ++t)
    for (int hv = 0; hv < HV; ++hv) {
      int64_t i = t * HV + hv;
      p.ge[i] = in.gate_fused ? -std::exp(in.A_log[hv]) * softplus_fwd(in.a[i] + in.dt_bias[hv]) : in.g[i];
      p.be[i] = in.beta_sigmoid ? sigmoid(in.beta[i]) : in.beta[i];
    }
  return p;
}

template <class F>
void parallel_for(int64_t n, int threads, F f) {
  if (threads <= 0) threads = std::max(1u, std::thread::hardware_concurrency());
  threads = (int)std::min<int64_t>(threads, std::max<int64_t>(n, 1));
  std::atomic<int64_t> next{0};
  std::vector<std::thread> ts;
  for (int i = 0; i < threads; ++i)
    ts.emplace_back([&] { for (int64_t j; (j = next.fetch_add(1)) < n;) f(j); });
  for (auto& t : ts) t.join();
}

}  // namespace

Fwd forward(const Inputs& in, int threads) {
  const Pre p = preprocess(in);
  const int64_t T = in.T, N = in.N();
  const int H = in.H, HV = in.HV, K = in.K, V = in.V, G = HV / H;
  Fwd out;
  out.o.assign(T * HV * V, 0.0);
  out.ht.assign(N * HV * K * V, 0.0);
  parallel_for(N * HV, threads, [&](int64_t job) {
    const int64_t n = job / HV; const int hv = (int)(job % HV), h = hv / G;
    std::vector<double> S(K * V, 0.0), m(V), d(V);
    if (!in.h0.empty()) std::copy_n(&in.h0[(n * HV + hv) * K * V], K * V, S.begin());
    for (int64_t t = in.cu[n]; t < in.cu[n + 1]; ++t) {
      const double* q = &p.qn[(t * H + h) * K];
      const double* k = &p.kn[(t * H + h) * K];
      const double* v = &in.v[(t * HV + hv) * V];
      const double eg = std::exp(p.ge[t * HV + hv]), b = p.be[t * HV + hv];
      for (auto& x : S) x *= eg;
      std::fill(m.begin(), m.end(), 0.0);
      for (int i = 0; i < K; ++i) for (int j = 0; j < V; ++j) m[j] += S[i * V + j] * k[i];
      for (int j = 0; j < V; ++j) d[j] = b * (v[j] - m[j]);
      for (int i = 0; i < K; ++i) for (int j = 0; j < V; ++j) S[i * V + j] += k[i] * d[j];
      double* o = &out.o[(t * HV + hv) * V];
      for (int i = 0; i < K; ++i) for (int j = 0; j < V; ++j) o[j] += p.s * S[i * V + j] * q[i];
    }
    std::copy(S.begin(), S.end(), &out.ht[(n * HV + hv) * K * V]);
  });
  return out;
}

Fwd forward_chunked(const Inputs& in, int threads) {
  const Pre p = preprocess(in);
  const int64_t T = in.T, N = in.N();
  const int H = in.H, HV = in.HV, K = in.K, V = in.V, G = HV / H, C = 64;
  Fwd out;
  out.o.assign(T * HV * V, 0.0);
  out.ht.assign(N * HV * K * V, 0.0);
  parallel_for(N * HV, threads, [&](int64_t job) {
    const int64_t n = job / HV; const int hv = (int)(job % HV), h = hv / G;
    std::vector<double> S(K * V, 0.0);
    if (!in.h0.empty()) std::copy_n(&in.h0[(n * HV + hv) * K * V], K * V, S.begin());
    for (int64_t t0 = in.cu[n]; t0 < in.cu[n + 1]; t0 += C) {
      const int L = (int)std::min<int64_t>(C, in.cu[n + 1] - t0);
      auto q = [&](int r, int c) { return p.qn[((t0 + r) * H + h) * K + c]; };
      auto k = [&](int r, int c) { return p.kn[((t0 + r) * H + h) * K + c]; };
      auto v = [&](int r, int c) { return in.v[((t0 + r) * HV + hv) * V + c]; };
      std::vector<double> gam(L), beta(L);
      double acc = 0;
      for (int r = 0; r < L; ++r) { acc += p.ge[(t0 + r) * HV + hv]; gam[r] = acc; beta[r] = p.be[(t0 + r) * HV + hv]; }
      std::vector<double> A(L * L, 0.0), Tm(L * L, 0.0);
      for (int r = 0; r < L; ++r)
        for (int j = 0; j < r; ++j) {
          double kk = 0; for (int c = 0; c < K; ++c) kk += k(r, c) * k(j, c);
          A[r * L + j] = beta[r] * kk * std::exp(gam[r] - gam[j]);
        }
      for (int r = 0; r < L; ++r) {  // T = (I + A)^-1 by forward substitution
        for (int c = 0; c < L; ++c) {
          double x = (r == c) ? 1.0 : 0.0;
          for (int j = 0; j < r; ++j) x -= A[r * L + j] * Tm[j * L + c];
          Tm[r * L + c] = x;
        }
      }
      // Delta = T (diag(beta) V - diag(beta e^gam) K S)
      std::vector<double> Y(L * V), D(L * V, 0.0);
      for (int r = 0; r < L; ++r)
        for (int j = 0; j < V; ++j) {
          double ks = 0; for (int i = 0; i < K; ++i) ks += k(r, i) * S[i * V + j];
          Y[r * V + j] = beta[r] * (v(r, j) - std::exp(gam[r]) * ks);
        }
      for (int r = 0; r < L; ++r)
        for (int j = 0; j < L; ++j) {
          const double t = Tm[r * L + j]; if (t == 0) continue;
          for (int c = 0; c < V; ++c) D[r * V + c] += t * Y[j * V + c];
        }
      for (int r = 0; r < L; ++r) {
        double* o = &out.o[((t0 + r) * HV + hv) * V];
        for (int c = 0; c < V; ++c) {
          double x = 0; for (int i = 0; i < K; ++i) x += q(r, i) * S[i * V + c];
          o[c] = std::exp(gam[r]) * x;
        }
        for (int j = 0; j <= r; ++j) {
          double qk = 0; for (int i = 0; i < K; ++i) qk += q(r, i) * k(j, i);
          const double w = qk * std::exp(gam[r] - gam[j]);
          for (int c = 0; c < V; ++c) o[c] += w * D[j * V + c];
        }
        for (int c = 0; c < V; ++c) o[c] *= p.s;
      }
      const double gl = gam[L - 1];
      for (auto& x : S) x *= std::exp(gl);
      for (int r = 0; r < L; ++r) {
        const double w = std::exp(gl - gam[r]);
        for (int i = 0; i < K; ++i) for (int c = 0; c < V; ++c) S[i * V + c] += w * k(r, i) * D[r * V + c];
      }
    }
    std::copy(S.begin(), S.end(), &out.ht[(n * HV + hv) * K * V]);
  });
  return out;
}

Grads backward(const Inputs& in, const std::vector<double>& dO, const std::vector<double>* dht,
               int threads) {
  const Pre p = preprocess(in);
  const int64_t T = in.T, N = in.N();
  const int H = in.H, HV = in.HV, K = in.K, V = in.V, G = HV / H, C = 64;
  const size_t KV = (size_t)K * V;
  std::vector<double> dqn_h(T * HV * K, 0.0), dkn_h(T * HV * K, 0.0), dge(T * HV, 0.0), dbe(T * HV, 0.0);
  Grads gr;
  gr.dv.assign(T * HV * V, 0.0);
  gr.dh0.assign(N * HV * KV, 0.0);
  parallel_for(N * HV, threads, [&](int64_t job) {
    const int64_t n = job / HV; const int hv = (int)(job % HV), h = hv / G;
    const int64_t bos = in.cu[n], eos = in.cu[n + 1];
    auto qp = [&](int64_t t) { return &p.qn[(t * H + h) * K]; };
    auto kp = [&](int64_t t) { return &p.kn[(t * H + h) * K]; };
    auto vp = [&](int64_t t) { return &in.v[(t * HV + hv) * V]; };
    // forward with checkpoints at segment starts
    const int64_t nseg = (eos - bos + C - 1) / C;
    std::vector<double> ck(std::max<int64_t>(nseg, 1) * KV, 0.0);
    std::vector<double> S(KV, 0.0), m(V), d(V);
    if (!in.h0.empty()) std::copy_n(&in.h0[(n * HV + hv) * KV], KV, S.begin());
    auto step = [&](std::vector<double>& St, int64_t t, double* m_out, double* d_out) {
      const double* k = kp(t); const double* v = vp(t);
      const double eg = std::exp(p.ge[t * HV + hv]), b = p.be[t * HV + hv];
      for (auto& x : St) x *= eg;
      for (int j = 0; j < V; ++j) m_out[j] = 0;
      for (int i = 0; i < K; ++i) for (int j = 0; j < V; ++j) m_out[j] += St[i * V + j] * k[i];
      for (int j = 0; j < V; ++j) d_out[j] = b * (v[j] - m_out[j]);
      for (int i = 0; i < K; ++i) for (int j = 0; j < V; ++j) St[i * V + j] += k[i] * d_out[j];
    };
    for (int64_t sgi = 0; sgi < nseg; ++sgi) {
      std::copy(S.begin(), S.end(), &ck[sgi * KV]);
      for (int64_t t = bos + sgi * C; t < std::min(eos, bos + (sgi + 1) * C); ++t) step(S, t, m.data(), d.data());
    }
    std::vector<double> dS(KV, 0.0);
    if (dht) std::copy_n(&(*dht)[(n * HV + hv) * KV], KV, dS.begin());
    std::vector<double> St((C + 1) * KV), ms(C * V), ds(C * V), dd(V), dm(V), St_tilde(KV);
    for (int64_t sgi = nseg - 1; sgi >= 0; --sgi) {
      const int64_t t0 = bos + sgi * C; const int L = (int)std::min<int64_t>(C, eos - t0);
      std::vector<double> cur(ck.begin() + sgi * KV, ck.begin() + (sgi + 1) * KV);
      std::copy(cur.begin(), cur.end(), &St[0]);
      for (int i = 0; i < L; ++i) { step(cur, t0 + i, &ms[i * V], &ds[i * V]); std::copy(cur.begin(), cur.end(), &St[(i + 1) * KV]); }
      for (int i = L - 1; i >= 0; --i) {
        const int64_t t = t0 + i;
        const double* q = qp(t); const double* k = kp(t); const double* v = vp(t);
        const double* dot = &dO[(t * HV + hv) * V];
        const double eg = std::exp(p.ge[t * HV + hv]), b = p.be[t * HV + hv];
        const double* Sn = &St[(i + 1) * KV]; const double* Sp = &St[i * KV];
        double* dq = &dqn_h[(t * HV + hv) * K]; double* dk = &dkn_h[(t * HV + hv) * K];
        for (int a = 0; a < K; ++a) { double x = 0; for (int j = 0; j < V; ++j) x += Sn[a * V + j] * dot[j]; dq[a] = p.s * x; }
        for (int a = 0; a < K; ++a) for (int j = 0; j < V; ++j) dS[a * V + j] += p.s * q[a] * dot[j];
        std::fill(dd.begin(), dd.end(), 0.0);
        for (int a = 0; a < K; ++a) for (int j = 0; j < V; ++j) dd[j] += dS[a * V + j] * k[a];
        const double* dl = &ds[i * V]; const double* mm = &ms[i * V];
        for (int a = 0; a < K; ++a) { double x = 0; for (int j = 0; j < V; ++j) x += dS[a * V + j] * dl[j]; dk[a] = x; }
        double dbt = 0;
        for (int j = 0; j < V; ++j) { dbt += dd[j] * (v[j] - mm[j]); gr.dv[(t * HV + hv) * V + j] = b * dd[j]; dm[j] = -b * dd[j]; }
        dbe[t * HV + hv] = dbt;
        for (size_t e = 0; e < KV; ++e) St_tilde[e] = eg * Sp[e];
        for (int a = 0; a < K; ++a) for (int j = 0; j < V; ++j) dS[a * V + j] += k[a] * dm[j];
        for (int a = 0; a < K; ++a) { double x = 0; for (int j = 0; j < V; ++j) x += St_tilde[a * V + j] * dm[j]; dk[a] += x; }
        double dgt = 0;
        for (size_t e = 0; e < KV; ++e) dgt += St_tilde[e] * dS[e];
        dge[t * HV + hv] = dgt;
        for (auto& x : dS) x *= eg;
      }
    }
    std::copy(dS.begin(), dS.end(), &gr.dh0[(n * HV + hv) * KV]);
  });
  // group sums + l2norm backward
  gr.dq.assign(T * H * K, 0.0); gr.dk.assign(T * H * K, 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h) {
      std::vector<double> dqn(K, 0.0), dkn(K, 0.0);
      for (int j = 0; j < G; ++j) {
        const int hv = h * G + j;
        for (int c = 0; c < K; ++c) { dqn[c] += dqn_h[(t * HV + hv) * K + c]; dkn[c] += dkn_h[(t * HV + hv) * K + c]; }
      }
      const int64_t r = t * H + h;
      if (in.l2norm) {
        double sq = 0, sk = 0;
        for (int c = 0; c < K; ++c) { sq += dqn[c] * p.qn[r * K + c]; sk += dkn[c] * p.kn[r * K + c]; }
        for (int c = 0; c < K; ++c) {
          gr.dq[r * K + c] = p.rq[r] * (dqn[c] - sq * p.qn[r * K + c]);
          gr.dk[r * K + c] = p.rk[r] * (dkn[c] - sk * p.kn[r * K + c]);
        }
      } else {
        for (int c = 0; c < K; ++c) { gr.dq[r * K + c] = dqn[c]; gr.dk[r * K + c] = dkn[c]; }
      }
    }
  gr.dg.assign(T * HV, 0.0); gr.dbeta.assign(T * HV, 0.0);
  if (in.gate_fused) {
    gr.dA_log.assign(HV, 0.0); gr.ddt_bias.assign(HV, 0.0);
    gr.dA_log_terms.assign(HV, 0.0); gr.ddt_bias_terms.assign(HV, 0.0);
  }
  for (int64_t t = 0; t < T; ++t)
    for (int hv = 0; hv < HV; ++hv) {
      const int64_t i = t * HV + hv;
      if (in.gate_fused) {
        const double x = in.a[i] + in.dt_bias[hv];
        const double da = dge[i] * -std::exp(in.A_log[hv]) * softplus_grad(x);
        gr.dg[i] = da; gr.ddt_bias[hv] += da; gr.dA_log[hv] += dge[i] * p.ge[i];
        gr.ddt_bias_terms[hv] += std::abs(da); gr.dA_log_terms[hv] += std::abs(dge[i] * p.ge[i]);
      } else {
        gr.dg[i] = dge[i];
      }
      gr.dbeta[i] = in.beta_sigmoid ? dbe[i] * p.be[i] * (1.0 - p.be[i]) : dbe[i];
    }
  return gr;
}

}  // namespace qrun::gdn::ref
