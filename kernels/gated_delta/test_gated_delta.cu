// GPU conformance test of the gated delta kernels against the fp64 CPU reference fed the same
// bf16-rounded inputs. Prints "SKIP: ..." and exits 77 when no CUDA device is usable.
// Every run draws fresh random inputs (the seed is printed; QRUN_GDN_SEED=<n> replays one; the
// check_strong cases and the precision sentinel use fixed seeds),
// poisons outputs and the workspace with NaN bytes before each launch, and fails on any NaN or a
// relative error ||x - ref|| / ||ref|| above 2e-3 for the output and every gradient.
// QRUN_GDN_QUICK=1 runs a reduced grid (used under compute-sanitizer). The forward runs on fp16
// operands (the default fast forward) except in the cases that ask for bf16x2 or that drive the
// fp16 range guard into its bf16x2 fallback; each case checks which forward and backward ran.
// Each case also runs the kept-prep pair (a forward that keeps its prep, the backward from it,
// twice) and requires it bit for bit equal to the recomputing pair (see run_case).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gated_delta.h"
#include "reference.h"

using namespace qrun::gdn;

#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      std::fprintf(stderr, "CUDA error %s at %s:%d: %s\n", #x, __FILE__, __LINE__,          \
                   cudaGetErrorString(e_));                                                \
      std::exit(2);                                                                        \
    }                                                                                      \
  } while (0)

namespace {

constexpr double kTol = 2e-3;

struct Case {
  std::string name;
  std::vector<int32_t> lens;
  int H = 1, HV = 1;
  int gate_kind = 1;  // 0: near 0, 1: logsigmoid(randn)/16, 2: strongly negative, 3: check's strong
  uint64_t seed = 0;  // nonzero: this fixed seed instead of one derived from the run's base seed
  bool l2 = false, gate_fused = false, beta_sigmoid = false, beta_f32 = false;
  bool h0 = false, dht = false, strided = false;
  int pad = 0;  // extra elements per token row of the fused q|k|v buffer (odd: no 16-byte loads)
  int opad = 0;  // extra elements per token row of o: 1 = 2-byte stores, 2 = 4-byte pairs (no staged rows)
  int gpad = 0;  // extra elements per token row of dq, dk, dv: 1 = element stores, 2 = pairs
  DType grad = DType::F32;
  bool bf16x2_fwd = false;  // the bf16x2 forward (fast_forward = false) instead of fp16 operands
  // the backward path, forced (Auto would pick bf16x2 for these small batches)
  GdnProblem::BwdPath bwd = GdnProblem::BwdPath::Fp16;
  float do_scale = 1.f;     // dO, d_final_state ~ do_scale * N(0, 1) (the fast backward scales its
                            // gradient operands itself: any scale must pass without a fallback)
  float qk_scale = 1.f;     // q, k scaled (far from 1 it drives prep's fp16 q/k copies out of range)
  float v_scale = 1.f;      // v ~ v_scale * N(0, 1): far from 1 it drives fp16 out of range
  bool want_fallback = false;  // the fast forward must fall back (true) / must not (false)
  bool want_bwd_fallback = false;  // likewise the fast backward (only prep's checks apply to it)
  int tiny_seq = -1;  // >= 0: this sequence's v is scaled by 2^-16 (only it falls back; its o is
                      // also compared on its own, where a norm over all rows would not see it)
  int tiny_head = -1;  // >= 0: likewise for this value head in every sequence (only it falls back,
                       // not the rest of its key head's group)
  bool zero_tails = false;  // the last two thirds of every sequence are right padding as a padded
                            // batch feeds it: q, k, v, g, a, beta and dO zero there
  double sentinel = 0;  // > 0: dk and dg (da) must also be within this (a precision sentinel)
};

float bf16r(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

template <class T>
T* dalloc(size_t n) {
  T* p = nullptr;
  CK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)));
  return p;
}
template <class T>
T* upload(const std::vector<T>& h) {
  T* p = dalloc<T>(h.size());
  if (!h.empty()) CK(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}
std::vector<__nv_bfloat16> to_bf16(const std::vector<float>& x) {
  std::vector<__nv_bfloat16> r(x.size());
  for (size_t i = 0; i < x.size(); ++i) r[i] = __float2bfloat16_rn(x[i]);
  return r;
}
std::vector<double> dl(const std::vector<float>& x) { return std::vector<double>(x.begin(), x.end()); }

std::vector<double> download(const void* p, size_t n, DType dt) {
  std::vector<double> r(n);
  if (dt == DType::F32) {
    std::vector<float> h(n);
    if (n) CK(cudaMemcpy(h.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; ++i) r[i] = h[i];
  } else {
    std::vector<__nv_bfloat16> h(n);
    if (n) CK(cudaMemcpy(h.data(), p, n * 2, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; ++i) r[i] = __bfloat162float(h[i]);
  }
  return r;
}

struct Err {
  double rel = 0;
  size_t nans = 0;
};
Err compare(const std::vector<double>& x, const std::vector<double>& ref) {
  Err e;
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (!std::isfinite(x[i])) { ++e.nans; continue; }
    num += (x[i] - ref[i]) * (x[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  e.rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  return e;
}

// worst: the largest relative error of the fp32 outputs judged against kTol (a summed gradient
// that passes on the size of its terms instead is left out; its line shows tm); worst_b: of the
// bf16-stored outputs, the largest error beyond their storage rounding (judged against 1e-3).
int run_case(const Case& cs, uint64_t seed, double& worst, double& worst_b) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd;
  std::uniform_real_distribution<float> ud(0.f, 1.f);
  const int H = cs.H, HV = cs.HV, K = 128, V = 128;
  std::vector<int32_t> cu = {0};
  for (int l : cs.lens) cu.push_back(cu.back() + l);
  const int64_t T = cu.back(), N = (int64_t)cs.lens.size();
  const float ks = cs.l2 ? 1.f : 1.f / std::sqrt((float)K);

  std::vector<float> q(T * H * K), k(T * H * K), v(T * HV * V), g(T * HV), a(T * HV), beta(T * HV),
      A_log(HV), dt_bias(HV), dO(T * HV * V);
  for (auto& x : q) x = bf16r(nd(rng) * ks * cs.qk_scale);
  for (auto& x : k) x = bf16r(nd(rng) * ks * cs.qk_scale);
  for (auto& x : v) x = bf16r(nd(rng) * cs.v_scale);
  if (cs.tiny_seq >= 0)
    for (int64_t i = (int64_t)cu[cs.tiny_seq] * HV * V; i < (int64_t)cu[cs.tiny_seq + 1] * HV * V; ++i) v[i] *= 0x1p-16f;
  if (cs.tiny_head >= 0)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t e = 0; e < V; ++e) v[(t * HV + cs.tiny_head) * V + e] *= 0x1p-16f;
  for (auto& x : dO) x = bf16r(nd(rng) * cs.do_scale);
  for (auto& x : g) {
    if (cs.gate_kind == 0) x = -1e-3f * ud(rng);
    else if (cs.gate_kind == 1) x = -std::log1p(std::exp(-nd(rng))) / 16.f;
    else x = -2.f - 18.f * ud(rng);
  }
  // fused gate g = -exp(A_log) softplus(a + dt_bias): near 0 (kind 0), moderate with ~5% of tokens
  // in the softplus identity branch (a + dt_bias > 20) (kind 1), strongly negative, g in about
  // [-2, -25] (kind 2). (Far stronger gates make dg ~ e^g underflow fp32: the exact gradient is
  // then below what fp32 can represent and a relative error is meaningless.)
  // Kind 3 is the "strong" gate construction of `qrun check` (framework/check.cpp, Note [GDN grid]):
  // A_log = log U(8, 16), a ~ N(3, 1), dt_bias ~ N(0, 0.5^2), all bf16-rounded as the check feeds
  // them: g ~ -25 .. -50 for most tokens, so exp(g) underflows within a chunk, and dA_log / ddt_bias
  // are dominated by the rare tokens with weaker gates (g ~ -5 .. -12). This shape has failed
  // through the plugin (dA_log 7.3e-3 beyond storage); see the check_strong cases in main().
  for (int h = 0; h < HV; ++h) {
    if (cs.gate_kind == 3) {
      A_log[h] = bf16r(std::log(8.f + 8.f * ud(rng)));
      dt_bias[h] = bf16r(0.5f * nd(rng));
      continue;
    }
    A_log[h] = cs.gate_kind == 2 ? std::log(1.f + 3.f * ud(rng)) : std::log(0.01f + 2.f * ud(rng));
    dt_bias[h] = cs.gate_kind == 0 ? -8.f + nd(rng) : (cs.gate_kind == 2 ? 0.3f * nd(rng) : nd(rng));
  }
  for (auto& x : a) {
    if (cs.gate_kind == 3) x = bf16r(3.f + nd(rng));
    else if (cs.gate_kind == 2) x = bf16r(2.f + 4.f * ud(rng));
    else if (cs.gate_kind == 1 && ud(rng) < 0.05f) x = bf16r(20.5f + 1.5f * ud(rng));
    else x = bf16r(nd(rng));
  }
  for (auto& x : beta) x = cs.beta_sigmoid ? nd(rng) : ud(rng);
  if (!cs.beta_f32)
    for (auto& x : beta) x = bf16r(x);
  if (cs.zero_tails)
    for (int64_t i = 0; i < N; ++i)
      for (int64_t t = cu[i] + (cs.lens[i] + 2) / 3; t < cu[i + 1]; ++t) {
        std::fill_n(&q[t * H * K], H * K, 0.f);
        std::fill_n(&k[t * H * K], H * K, 0.f);
        std::fill_n(&v[t * HV * V], HV * V, 0.f);
        std::fill_n(&dO[t * HV * V], HV * V, 0.f);
        std::fill_n(&g[t * HV], HV, 0.f);
        std::fill_n(&a[t * HV], HV, 0.f);
        std::fill_n(&beta[t * HV], HV, 0.f);
      }
  std::vector<float> h0, dht;
  if (cs.h0) { h0.resize(N * HV * K * V); for (auto& x : h0) x = 0.3f * nd(rng); }
  if (cs.dht) { dht.resize(N * HV * K * V); for (auto& x : dht) x = nd(rng) * cs.do_scale; }

  // reference
  ref::Inputs in;
  in.T = T; in.H = H; in.HV = HV; in.K = K; in.V = V; in.cu = cu;
  in.q = dl(q); in.k = dl(k); in.v = dl(v);
  in.gate_fused = cs.gate_fused; in.g = dl(g); in.a = dl(a); in.A_log = dl(A_log); in.dt_bias = dl(dt_bias);
  in.beta_sigmoid = cs.beta_sigmoid; in.beta = dl(beta);
  in.l2norm = cs.l2; in.h0 = dl(h0);
  const auto t_ref0 = std::chrono::steady_clock::now();
  const ref::Fwd rf = ref::forward(in);
  const std::vector<double> dO_d = dl(dO), dht_d = dl(dht);
  const ref::Grads rg = ref::backward(in, dO_d, cs.dht ? &dht_d : nullptr);
  const double t_ref = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_ref0).count();

  // device inputs
  ChunkTables tabs = gdn_build_chunk_tables(cu.data(), N);
  int32_t* d_cu = upload(cu);
  int32_t* d_tab = upload(tabs.chunk_table);
  int32_t* d_off = upload(tabs.chunk_offsets);
  GdnProblem p;
  p.total_tokens = T; p.num_seqs = N; p.num_chunks = tabs.num_chunks; p.H = H; p.HV = HV;
  p.cu_seqlens = d_cu; p.chunk_table = d_tab; p.chunk_offsets = d_off;
  __nv_bfloat16* d_qkv = nullptr;
  if (cs.strided) {  // one fused [T, q|k|v] buffer, like the conv output
    const int64_t W = 2 * H * K + HV * V + cs.pad;
    std::vector<float> buf(T * W);
    for (int64_t t = 0; t < T; ++t) {
      for (int i = 0; i < H * K; ++i) { buf[t * W + i] = q[t * H * K + i]; buf[t * W + H * K + i] = k[t * H * K + i]; }
      for (int i = 0; i < HV * V; ++i) buf[t * W + 2 * H * K + i] = v[t * HV * V + i];
    }
    d_qkv = upload(to_bf16(buf));
    p.q = d_qkv; p.k = d_qkv + H * K; p.v = d_qkv + 2 * H * K;
    p.q_st = p.k_st = p.v_st = W; p.q_sh = p.k_sh = K; p.v_sh = V;
  } else {
    p.q = upload(to_bf16(q)); p.k = upload(to_bf16(k)); p.v = upload(to_bf16(v));
    p.q_st = p.k_st = (int64_t)H * K; p.q_sh = p.k_sh = K;
    p.v_st = (int64_t)HV * V; p.v_sh = V;
  }
  p.gate_fused = cs.gate_fused;
  float* d_g = upload(g);
  __nv_bfloat16* d_a = upload(to_bf16(a));
  float* d_Alog = upload(A_log);
  float* d_dt = upload(dt_bias);
  p.g = d_g; p.g_st = HV; p.a = d_a; p.a_dtype = DType::BF16; p.a_st = HV; p.A_log = d_Alog; p.dt_bias = d_dt;
  void* d_beta = cs.beta_f32 ? (void*)upload(beta) : (void*)upload(to_bf16(beta));
  p.beta = d_beta; p.beta_dtype = cs.beta_f32 ? DType::F32 : DType::BF16; p.beta_st = HV;
  p.beta_sigmoid = cs.beta_sigmoid;
  p.qk_l2norm = cs.l2;
  float* d_h0 = cs.h0 ? upload(h0) : nullptr;
  p.initial_state = d_h0;
  p.fast_forward = !cs.bf16x2_fwd;
  p.backward_path = cs.bwd;
  const bool bf16x2_bwd = cs.bwd == GdnProblem::BwdPath::Bf16x2;

  const size_t ws_f = gdn_fwd_workspace_bytes(p), ws_b = gdn_bwd_workspace_bytes(p);
  void* ws = dalloc<char>(std::max(ws_f, ws_b));
  const size_t nO = T * HV * V, nS = N * HV * K * V;
  const int64_t o_st = (int64_t)HV * V + cs.opad;
  const size_t nOb = T * o_st;
  __nv_bfloat16* d_o = dalloc<__nv_bfloat16>(nOb);
  float* d_ht = dalloc<float>(nS);
  CK(cudaMemset(ws, 0xff, std::max(ws_f, ws_b)));
  CK(cudaMemset(d_o, 0xff, nOb * 2));
  CK(cudaMemset(d_ht, 0xff, nS * 4));
  GdnFwdOut fo;
  fo.o = d_o; fo.o_st = o_st; fo.o_sh = V; fo.final_state = d_ht;
  int32_t* d_fell = upload(std::vector<int32_t>{-1});
  fo.fell_back = d_fell;
  gdn_forward(p, fo, ws, ws_f, nullptr);
  CK(cudaDeviceSynchronize());
  int32_t fell = -1;
  CK(cudaMemcpy(&fell, d_fell, 4, cudaMemcpyDeviceToHost));
  cudaFree(d_fell);
  // which forward ran: fp16 operands, fp16 then the bf16x2 fallback, or bf16x2 by request. A
  // sequence of a few tokens with beta ~ U(0, 1) may legitimately fall back (one token with
  // beta < 1e-4 makes all of its Y tiny), so such cases accept either.
  bool short_seq = false;
  for (int l : cs.lens) short_seq = short_seq || (l > 0 && l < 16);
  const bool either = !cs.want_fallback && short_seq && !cs.beta_sigmoid;
  const bool fwd_ok = cs.bf16x2_fwd ? fell == 0 : either || fell == (cs.want_fallback && T > 0 ? 1 : 0);

  // backward
  const size_t gsz = cs.grad == DType::F32 ? 4 : 2;
  GdnBwdIO io;
  __nv_bfloat16* d_dO = upload(to_bf16(dO));
  float* d_dht = cs.dht ? upload(dht) : nullptr;
  io.dO = d_dO; io.do_st = (int64_t)HV * V; io.do_sh = V; io.d_final_state = d_dht;
  io.grad_dtype = cs.grad;
  // gradient rows of H*K (HV*V) elements plus cs.gpad elements of padding that must stay untouched
  const int64_t qk_st = (int64_t)H * K + cs.gpad, v_st = (int64_t)HV * V + cs.gpad;
  io.dq = dalloc<char>(T * qk_st * gsz); io.dq_st = qk_st; io.dq_sh = K;
  io.dk = dalloc<char>(T * qk_st * gsz); io.dk_st = qk_st; io.dk_sh = K;
  io.dv = dalloc<char>(T * v_st * gsz); io.dv_st = v_st; io.dv_sh = V;
  io.dg = dalloc<float>(T * HV); io.dbeta = dalloc<float>(T * HV);
  io.dA_log = dalloc<float>(HV); io.ddt_bias = dalloc<float>(HV);
  io.d_initial_state = dalloc<float>(nS);
  CK(cudaMemset(ws, 0xff, std::max(ws_f, ws_b)));
  const auto poison_grads = [&] {
    CK(cudaMemset(io.dq, 0xff, T * qk_st * gsz)); CK(cudaMemset(io.dk, 0xff, T * qk_st * gsz));
    CK(cudaMemset(io.dv, 0xff, T * v_st * gsz));
    CK(cudaMemset(io.dg, 0xff, T * HV * 4)); CK(cudaMemset(io.dbeta, 0xff, T * HV * 4));
    CK(cudaMemset(io.dA_log, 0xff, HV * 4)); CK(cudaMemset(io.ddt_bias, 0xff, HV * 4));
    CK(cudaMemset(io.d_initial_state, 0xff, nS * 4));
  };
  poison_grads();
  int32_t* d_fell_b = upload(std::vector<int32_t>{-1});
  io.fell_back = d_fell_b;
  gdn_backward(p, io, ws, ws_b, nullptr);
  CK(cudaDeviceSynchronize());
  int32_t fell_b = -1;
  CK(cudaMemcpy(&fell_b, d_fell_b, 4, cudaMemcpyDeviceToHost));
  cudaFree(d_fell_b);
  const bool bwd_ok = fell_b == (!bf16x2_bwd && cs.want_bwd_fallback && T > 0 ? 1 : 0);

  // terms (summed gradients only): the sizes of the sums' terms, see the judging loop below
  struct Item {
    const char* name; std::vector<double> got; const std::vector<double>* ref; bool bf16;
    const std::vector<double>* terms = nullptr;
  };
  const bool gb = cs.grad == DType::BF16;
  std::vector<Item> items;
  std::vector<double> o_rows = download(d_o, nOb, DType::BF16), o_all(nO);
  size_t o_pad_written = 0;  // the padding keeps its 0xffff fill (NaN) unless a store strayed there
  for (int64_t t = 0; t < T; ++t) {
    std::copy_n(o_rows.begin() + t * o_st, HV * V, o_all.begin() + t * HV * V);
    for (int e = 0; e < cs.opad; ++e) o_pad_written += !std::isnan(o_rows[t * o_st + HV * V + e]);
  }
  items.push_back({"o", o_all, &rf.o, true});
  items.push_back({"ht", download(d_ht, nS, DType::F32), &rf.ht, false});
  std::vector<double> o_tiny_ref;
  if (cs.tiny_seq >= 0) {
    const size_t b = (size_t)cu[cs.tiny_seq] * HV * V, e = (size_t)cu[cs.tiny_seq + 1] * HV * V;
    o_tiny_ref.assign(rf.o.begin() + b, rf.o.end() - (rf.o.size() - e));
    std::vector<double> got(items[0].got.begin() + b, items[0].got.begin() + e);
    items.push_back({"o[tiny seq]", got, &o_tiny_ref, true});
  }
  std::vector<double> o_head_ref, o_head_got;
  if (cs.tiny_head >= 0) {
    for (int64_t t = 0; t < T; ++t)
      for (int64_t e = 0; e < V; ++e) {
        const size_t i = (size_t)(t * HV + cs.tiny_head) * V + e;
        o_head_ref.push_back(rf.o[i]);
        o_head_got.push_back(items[0].got[i]);
      }
    items.push_back({"o[tiny head]", o_head_got, &o_head_ref, true});
  }
  // the rows without their padding (which keeps its NaN fill unless a store strayed there)
  size_t g_pad_written = 0;
  const auto grad_rows = [&](const void* d, int64_t width, int64_t st) {
    const std::vector<double> all = download(d, T * st, cs.grad);
    std::vector<double> rows(T * width);
    for (int64_t t = 0; t < T; ++t) {
      std::copy_n(all.begin() + t * st, width, rows.begin() + t * width);
      for (int64_t e = width; e < st; ++e) g_pad_written += !std::isnan(all[t * st + e]);
    }
    return rows;
  };
  const auto bwd_items = [&] {
    std::vector<Item> r;
    r.push_back({"dq", grad_rows(io.dq, (int64_t)H * K, qk_st), &rg.dq, gb});
    r.push_back({"dk", grad_rows(io.dk, (int64_t)H * K, qk_st), &rg.dk, gb});
    r.push_back({"dv", grad_rows(io.dv, (int64_t)HV * V, v_st), &rg.dv, gb});
    r.push_back({cs.gate_fused ? "da" : "dg", download(io.dg, T * HV, DType::F32), &rg.dg, false});
    r.push_back({cs.beta_sigmoid ? "db" : "dbeta", download(io.dbeta, T * HV, DType::F32), &rg.dbeta, false});
    if (cs.gate_fused) {
      r.push_back({"dA_log", download(io.dA_log, HV, DType::F32), &rg.dA_log, false, &rg.dA_log_terms});
      r.push_back({"ddt_bias", download(io.ddt_bias, HV, DType::F32), &rg.ddt_bias, false, &rg.ddt_bias_terms});
    }
    r.push_back({"dh0", download(io.d_initial_state, nS, DType::F32), &rg.dh0, false});
    return r;
  };
  const size_t n_fwd_items = items.size();
  for (auto& it : bwd_items()) items.push_back(std::move(it));
  bool ok = fwd_ok && bwd_ok;
  std::string line = cs.bf16x2_fwd ? " fwd=bf16x2" : fell == 1 ? " fwd=fp16->fallback" : " fwd=fp16";
  if (!fwd_ok) line += cs.want_fallback ? "(fallback expected!)" : "(unexpected fallback!)";
  line += bf16x2_bwd ? " bwd=bf16x2" : fell_b == 1 ? " bwd=fp16->fallback" : " bwd=fp16";
  if (!bwd_ok) line += cs.want_bwd_fallback ? "(fallback expected!)" : "(unexpected fallback!)";
  char buf[160];
  if (o_pad_written) {
    ok = false;
    std::snprintf(buf, sizeof buf, " o padding written (%zu elements)!", o_pad_written);
    line += buf;
  }
  if (g_pad_written) {
    ok = false;
    std::snprintf(buf, sizeof buf, " gradient row padding written (%zu elements)!", g_pad_written);
    line += buf;
  }
  const auto judge = [&](const std::vector<Item>& its, std::string& ln) {
   bool all = true;
   for (const auto& it : its) {
    const Err e = compare(it.got, *it.ref);
    // bf16-stored outputs: storage rounding alone costs ~1.65e-3 relative (RMS), and on a few
    // hundred elements (one short sequence) that floor itself scatters by +-0.15e-3. They also
    // pass when they match the bf16-rounded reference to 2e-4 (rr: the bf16x2 paths), or when the
    // error beyond the storage rounding (quadrature: ||got - ref||^2 - ||bf16(ref) - ref||^2) is
    // <= 1e-3, half the tolerance (the fp16 forward, whose own error is ~4e-4); rr is printed.
    double rr = -1, beyond = -1;
    if (it.bf16) {
      std::vector<double> rref(it.ref->size());
      for (size_t i = 0; i < rref.size(); ++i) rref[i] = bf16r((float)(*it.ref)[i]);
      rr = compare(it.got, rref).rel;
      const double floor = compare(rref, *it.ref).rel;
      beyond = std::sqrt(std::max(0.0, e.rel * e.rel - floor * floor));
    }
    // Summed gradients (dA_log, ddt_bias: sums over every token of a value head) also pass when
    // their error is within kTol / 10 of the size of their terms (||got - ref|| / ||sum |term|||;
    // tm is printed). Strong decays cancel them: hv3_strong_decay_fused at base seed
    // 492719188151425077 gives ddt_bias 2.1e-3 relative to a value ~100x below its terms, with
    // the per-token da at 1.7e-5 (the same with either state recompute).
    double tm = -1;
    if (it.terms) {
      double num = 0, den = 0;
      for (size_t i = 0; i < it.got.size(); ++i) {
        num += (it.got[i] - (*it.ref)[i]) * (it.got[i] - (*it.ref)[i]);
        den += (*it.terms)[i] * (*it.terms)[i];
      }
      tm = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
    }
    const bool tight = cs.sentinel > 0 && (!std::strcmp(it.name, "dk") || !std::strcmp(it.name, "da") ||
                                           !std::strcmp(it.name, "dg"));
    const bool pass = e.nans == 0 && (e.rel <= kTol || (rr >= 0 && rr <= 2e-4) || (beyond >= 0 && beyond <= 1e-3) ||
                                      (tm >= 0 && tm <= kTol / 10)) &&
                      (!tight || e.rel <= cs.sentinel);
    all = all && pass;
    if (e.nans) worst = 1e30;
    else if (it.bf16) worst_b = std::max(worst_b, beyond);
    else if (!(tm >= 0 && e.rel > kTol)) worst = std::max(worst, e.rel);  // (else judged by tm)
    if (e.nans) std::snprintf(buf, sizeof buf, " %s=NaNx%zu", it.name, e.nans);
    else if (rr >= 0) std::snprintf(buf, sizeof buf, " %s=%.1e(r%.0e)%s", it.name, e.rel, rr, pass ? "" : "!");
    else if (tm >= 0 && e.rel > kTol) std::snprintf(buf, sizeof buf, " %s=%.1e(tm%.0e)%s", it.name, e.rel, tm, pass ? "" : "!");
    else std::snprintf(buf, sizeof buf, " %s=%.1e%s%s", it.name, e.rel, tight ? "(sentinel)" : "", pass ? "" : "!");
    ln += buf;
   }
   return all;
  };
  ok = judge(items, line) && ok;

  // Kept prep (GdnFwdOut::keep_for_backward, GdnBwdIO::forward_workspace; Note [Kept prep]): the
  // forward again, keeping its prep in a workspace of its own, must give the same o and final
  // state bit for bit; the backward from it (its own workspace only gdn_bwd_workspace_bytes(p,
  // true)) must give the recomputing backward's gradients bit for bit when nothing fell back
  // (the same prep, the same flags), else pass on its own; and a second backward from the same
  // workspace (retain_graph) the first one's, bit for bit.
  if (!cs.bf16x2_fwd && T > 0) {
    const auto same = [](const std::vector<double>& x, const std::vector<double>& y) {
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i)
        if (!(x[i] == y[i] || (std::isnan(x[i]) && std::isnan(y[i])))) return false;
      return true;
    };
    void* fws = dalloc<char>(ws_f);
    CK(cudaMemset(fws, 0xff, ws_f));
    CK(cudaMemset(d_o, 0xff, nOb * 2));
    CK(cudaMemset(d_ht, 0xff, nS * 4));
    GdnFwdOut fk = fo;
    fk.fell_back = nullptr;
    fk.keep_for_backward = true;
    gdn_forward(p, fk, fws, ws_f, nullptr);
    CK(cudaDeviceSynchronize());
    std::string kl = " | kept prep:";
    std::vector<double> ok_rows = download(d_o, nOb, DType::BF16);
    const bool fwd_same = same(ok_rows, o_rows) && same(download(d_ht, nS, DType::F32), items[1].got);
    kl += fwd_same ? " fwd same" : " fwd DIFFERS!";
    const size_t ws_k = gdn_bwd_workspace_bytes(p, true);
    std::vector<Item> first;
    bool bwd_same = true, again_same = true;
    for (int rep = 0; rep < 2; ++rep) {
      CK(cudaMemset(ws, 0xff, ws_k));
      poison_grads();
      GdnBwdIO ik = io;
      ik.fell_back = nullptr;
      ik.forward_workspace = fws;
      gdn_backward(p, ik, ws, ws_k, nullptr);
      CK(cudaDeviceSynchronize());
      std::vector<Item> got = bwd_items();
      if (rep == 0) {
        for (size_t i = 0; i < got.size(); ++i) bwd_same = bwd_same && same(got[i].got, items[n_fwd_items + i].got);
        first = std::move(got);
      } else {
        for (size_t i = 0; i < got.size(); ++i) again_same = again_same && same(got[i].got, first[i].got);
      }
    }
    cudaFree(fws);
    if (bwd_same) {
      kl += " bwd same";
    } else if (fell == 1) {  // the forward's fallback flags reached the backward: judged on its own
      kl += " bwd (fallback flags) ";
      bwd_same = judge(first, kl);
    } else {
      kl += " bwd DIFFERS!";
    }
    kl += again_same ? ", again same" : ", again DIFFERS!";
    ok = ok && fwd_same && bwd_same && again_same;
    line += kl;
  }
  std::printf("%s %-28s T=%-6lld N=%-4lld H=%d HV=%d seed=%llu ref=%.1fs |%s\n", ok ? "PASS" : "FAIL",
              cs.name.c_str(), (long long)T, (long long)N, H, HV, (unsigned long long)seed, t_ref,
              line.c_str());
  std::fflush(stdout);

  cudaFree(d_cu); cudaFree(d_tab); cudaFree(d_off);
  if (d_qkv) cudaFree(d_qkv); else { cudaFree((void*)p.q); cudaFree((void*)p.k); cudaFree((void*)p.v); }
  cudaFree(d_g); cudaFree(d_a); cudaFree(d_Alog); cudaFree(d_dt); cudaFree(d_beta);
  if (d_h0) cudaFree(d_h0);
  cudaFree(ws); cudaFree(d_o); cudaFree(d_ht); cudaFree(d_dO);
  if (d_dht) cudaFree(d_dht);
  cudaFree(io.dq); cudaFree(io.dk); cudaFree(io.dv); cudaFree(io.dg); cudaFree(io.dbeta);
  cudaFree(io.dA_log); cudaFree(io.ddt_bias); cudaFree(io.d_initial_state);
  return ok ? 0 : 1;
}

}  // namespace

int main() {
  int ndev = 0;
  const cudaError_t e = cudaGetDeviceCount(&ndev);
  if (e != cudaSuccess || ndev == 0) {
    std::printf("SKIP: no CUDA device (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "device count is 0");
    return 77;
  }
  const char* se = std::getenv("QRUN_GDN_SEED");
  const uint64_t base = se ? std::strtoull(se, nullptr, 10) : std::random_device{}() ^ ((uint64_t)std::random_device{}() << 32);
  const bool quick = std::getenv("QRUN_GDN_QUICK") != nullptr;
  std::mt19937_64 lrng(base);
  auto rnd_lens = [&](int n, int lo, int hi) {
    std::vector<int32_t> l(n);
    for (auto& x : l) x = lo + (int)(lrng() % (uint64_t)(hi - lo + 1));
    return l;
  };
  std::vector<Case> cases;
  auto add = [&](Case c) { cases.push_back(std::move(c)); };
  {
    Case c; c.name = "quick_mixed_all_fused"; c.lens = {1, 2, 3, 63, 64, 65, 130}; c.H = 2; c.HV = 4;
    c.l2 = c.gate_fused = c.beta_sigmoid = c.h0 = c.dht = true; add(c);
  }
  // The shape and gates of the `qrun check linear_attention/fla-gated-delta` case "H=2 HV=4
  // gates=strong lens=[1,2,3,63,64,65,200]" (fused gate with A_log/dt_bias, beta sigmoid, q/k
  // l2norm; no initial state, no final-state gradient), at fixed seeds so that a regression of
  // the decay-parameter gradients (da, dA_log, ddt_bias vs fp64 at 2e-3) shows here and not only
  // through the plugin. The inputs come from this test's generator, not torch's, so the check's
  // seed does not replay here; several seeds give several draws of the rare weak-gate tokens that
  // dominate dA_log.
  for (uint64_t sd : {1795954147ull, 11ull, 12ull, 13ull, 14ull, 15ull}) {
    Case c; c.name = "check_strong_s" + std::to_string(sd); c.lens = {1, 2, 3, 63, 64, 65, 200};
    c.H = 2; c.HV = 4; c.gate_kind = 3; c.l2 = c.gate_fused = c.beta_sigmoid = true; c.seed = sd; add(c);
    if (quick) break;
  }
  // the bf16x2 fallback of the fast forward (in the quick grid too, so the sanitizers see the
  // bf16x2 forward kernels run in full)
  { Case c; c.name = "fwd_fallback_huge_v"; c.lens = {100, 64, 1}; c.H = 1; c.HV = 2; c.l2 = true;
    c.v_scale = 0x1p17f; c.want_fallback = true; add(c); }
  // o rows that allow no 16-byte stores (the fast forward's unstaged path; sanitizers too)
  { Case c; c.name = "quick_o_rows_pairs"; c.lens = {1, 65, 130}; c.H = 1; c.HV = 2; c.l2 = true; c.opad = 2; add(c); }
  // q/k far below fp16's range (l2norm on): prep's fp16 copies are flagged, and both directions
  // fall back (the sanitizers see the bf16x2 backward run in full)
  { Case c; c.name = "fallback_tiny_qk"; c.lens = {200, 65, 1}; c.H = 2; c.HV = 4; c.l2 = true; c.gate_fused = true;
    c.dht = true; c.qk_scale = 0x1p-16f; c.want_fallback = c.want_bwd_fallback = true; add(c); }
  // gradients far below fp16's range: the fast backward's own operand scaling (sanitizers too)
  { Case c; c.name = "quick_bwd_tiny_dO"; c.lens = {1, 65, 130}; c.H = 1; c.HV = 2; c.l2 = true; c.dht = true;
    c.do_scale = 0x1p-40f; add(c); }
  // right padding (zero inputs and dO after each sample, as the plugin runs a padded batch)
  // (near-0 gates: with the default ones the state decays below fp32's range over the long tails,
  // and the final state's relative error against the fp64 reference means nothing; the zero k
  // rows, whose l2norm scale is 1/sqrt(1e-6), are what these cases exercise)
  { Case c; c.name = "quick_zero_tails_fused"; c.lens = {200, 200, 200, 64}; c.H = 2; c.HV = 4; c.gate_kind = 0;
    c.l2 = c.gate_fused = c.beta_sigmoid = c.zero_tails = true; c.dht = true; add(c); }
  { Case c; c.name = "quick_zero_tails_plain"; c.lens = {300, 130, 65}; c.H = 1; c.HV = 2; c.l2 = true;
    c.zero_tails = true; add(c); }
  // gradient rows with element stores (sanitizers too)
  { Case c; c.name = "quick_grad_rows_scalar"; c.lens = {1, 65, 130}; c.H = 1; c.HV = 3; c.l2 = true; c.gpad = 1;
    c.grad = DType::BF16; add(c); }
  // one sequence of several key heads: on sm_90a the recompute starts beside the reverse pass and
  // bwd_chunk takes the first key heads' groups first (Note [The recompute beside the reverse
  // pass] in gated_delta.cu; sanitizers too)
  { Case c; c.name = "quick_one_seq_early_heads"; c.lens = {700}; c.H = 4; c.HV = 8;
    c.l2 = c.gate_fused = c.beta_sigmoid = c.h0 = c.dht = true; add(c); }
  if (!quick) {
    { Case c; c.name = "one_seq_early_heads_strong"; c.lens = {2500}; c.H = 3; c.HV = 9; c.gate_kind = 2; c.l2 = true;
      c.dht = true; add(c); }
    // ... with every pair flagged: both passes skip them, the fallback runs first
    { Case c; c.name = "one_seq_fallback_tiny_qk"; c.lens = {700}; c.H = 2; c.HV = 4; c.l2 = true; c.gate_fused = true;
      c.dht = true; c.qk_scale = 0x1p-16f; c.want_fallback = c.want_bwd_fallback = true; add(c); }
    for (int L : {1, 2, 3, 63, 64, 65, 127, 200}) {
      Case c; c.name = "single_L" + std::to_string(L); c.lens = {L}; c.H = 1; c.HV = 1; add(c);
    }
    { Case c; c.name = "tiny_many_seqs"; c.lens = rnd_lens(300, 0, 5); c.H = 1; c.HV = 2; c.l2 = true; add(c); }
    { Case c; c.name = "mixed_hv2_fused_states"; c.lens = {63, 64, 65, 1, 2, 3, 130, 1000};
      c.H = 2; c.HV = 4; c.l2 = c.gate_fused = c.beta_sigmoid = c.h0 = c.dht = true; add(c); }
    { Case c; c.name = "hv3_strong_decay"; c.lens = rnd_lens(12, 1, 700); c.H = 1; c.HV = 3; c.gate_kind = 2; c.l2 = true; add(c); }
    { Case c; c.name = "hv3_strong_decay_fused"; c.lens = rnd_lens(6, 1, 500); c.H = 1; c.HV = 3; c.gate_kind = 2;
      c.gate_fused = true; c.beta_sigmoid = true; add(c); }
    { Case c; c.name = "gate_near0_long"; c.lens = {4096}; c.H = 1; c.HV = 1; c.gate_kind = 0; c.l2 = true; add(c); }
    { Case c; c.name = "gate_near0_noL2_f32beta"; c.lens = {777, 190}; c.H = 1; c.HV = 2; c.gate_kind = 0; c.beta_f32 = true; c.dht = true; add(c); }
    { Case c; c.name = "strided_qkv_bf16grads"; c.lens = rnd_lens(5, 1, 300); c.H = 2; c.HV = 6; c.l2 = true;
      c.gate_fused = true; c.beta_sigmoid = true; c.strided = true; c.grad = DType::BF16; add(c); }
    { Case c; c.name = "strided_unaligned_scalar"; c.lens = rnd_lens(4, 1, 200); c.H = 1; c.HV = 3; c.l2 = true;
      c.strided = true; c.pad = 3; c.h0 = true; add(c); }
    // o rows that allow no 16-byte (staged) stores: 4-byte pairs, then 2-byte scalars, in both forwards
    { Case c; c.name = "o_rows_pairs"; c.lens = rnd_lens(3, 1, 300); c.H = 1; c.HV = 3; c.gate_fused = true; c.opad = 2; add(c); }
    { Case c; c.name = "o_rows_scalar"; c.lens = rnd_lens(3, 1, 300); c.H = 1; c.HV = 2; c.gate_fused = true; c.opad = 1; add(c); }
    { Case c; c.name = "o_rows_scalar_bf16x2"; c.lens = rnd_lens(3, 1, 300); c.H = 1; c.HV = 2; c.opad = 1;
      c.bf16x2_fwd = true; add(c); }
    // gradient rows (dq, dk, dv) that allow no pair stores, then 4-byte pairs (rows not 16-byte aligned)
    { Case c; c.name = "grad_rows_scalar"; c.lens = rnd_lens(3, 1, 300); c.H = 2; c.HV = 6; c.l2 = true; c.gpad = 1; add(c); }
    { Case c; c.name = "grad_rows_pairs_bf16"; c.lens = rnd_lens(3, 1, 300); c.H = 1; c.HV = 3; c.gate_fused = true;
      c.gpad = 2; c.grad = DType::BF16; add(c); }
    { Case c; c.name = "empty_seqs_only"; c.lens = {0, 0}; c.H = 1; c.HV = 2; c.gate_fused = true; c.h0 = c.dht = true; add(c); }
    { Case c; c.name = "random_fresh"; c.lens = rnd_lens(1 + (int)(lrng() % 20), 0, 400); c.H = 1 + (int)(lrng() % 2);
      c.HV = c.H * (1 + (int)(lrng() % 3)); c.gate_kind = (int)(lrng() % 3); c.l2 = lrng() & 1; c.gate_fused = lrng() & 1;
      c.beta_sigmoid = lrng() & 1; c.h0 = lrng() & 1; c.dht = lrng() & 1; add(c); }
    { Case c; c.name = "many_seqs_hv3_fused_states"; c.lens = rnd_lens(3000, 1, 9); c.H = 2; c.HV = 6; c.gate_kind = 2;
      c.l2 = c.gate_fused = c.beta_sigmoid = c.h0 = c.dht = true; add(c); }
    // The same regime (initial states and final-state gradients dominating sequences of 1-9
    // tokens) at a fixed seed and fixed lengths, with a precision sentinel on dk and da. The
    // reverse pass and recompute with hi/lo operands give dk 4.6-4.9e-6 and da 0.9-1.1e-5 here;
    // single fp16 planes in their place give dk 2.1e-4, da 2.8e-4 and dA_log up to 2.0e-3,
    // which the case above caught at one seed of three. The sentinel fails such a change at any seed.
    { std::mt19937_64 frng(24);
      Case c; c.name = "states_precision_sentinel"; c.lens.resize(3000);
      for (auto& x : c.lens) x = 1 + (int)(frng() % 9);
      c.H = 2; c.HV = 6; c.gate_kind = 2; c.l2 = c.gate_fused = c.beta_sigmoid = c.h0 = c.dht = true;
      c.seed = 18286844429249184137ull; c.sentinel = 1e-4; add(c); }
    // the fast forward's fp16 range guard (gated_delta.h): v far above or below fp16's comfortable
    // range must fall back to bf16x2 and still pass; a moderate scale must not; the bf16x2
    // forward by request
    { Case c; c.name = "fwd_fallback_tiny_v"; c.lens = {300, 5}; c.H = 1; c.HV = 2; c.l2 = true; c.gate_fused = true;
      c.v_scale = 0x1p-16f; c.want_fallback = true; add(c); }
    { Case c; c.name = "fwd_fallback_one_seq"; c.lens = {200, 130, 64, 1000}; c.H = 1; c.HV = 3; c.l2 = true;
      c.gate_fused = c.beta_sigmoid = true; c.tiny_seq = 1; c.want_fallback = true; add(c); }
    // one value head of a key head's group flagged: the fallback prep redoes it alone
    { Case c; c.name = "fwd_fallback_one_head"; c.lens = {200, 130, 64, 1}; c.H = 2; c.HV = 6; c.l2 = true;
      c.gate_fused = true; c.tiny_head = 4; c.want_fallback = true; add(c); }
    // more flagged items than the fallback prep's grid (3 blocks per SM): its blocks walk several
    { Case c; c.name = "fwd_fallback_many_items"; c.lens = {14000, 3000}; c.H = 1; c.HV = 2; c.l2 = true;
      c.v_scale = 0x1p17f; c.want_fallback = true; add(c); }
    { Case c; c.name = "fwd_fp16_small_v"; c.lens = {200, 65}; c.H = 1; c.HV = 2; c.l2 = true; c.v_scale = 0x1p-5f; add(c); }
    { Case c; c.name = "fwd_bf16x2_mixed_fused"; c.lens = {63, 64, 65, 1, 2, 3, 130, 1000};
      c.H = 2; c.HV = 4; c.l2 = c.gate_fused = c.beta_sigmoid = c.h0 = c.dht = true; c.bf16x2_fwd = true; add(c); }
    // the fast backward at gradient scales far outside fp16's range (no fallback: it scales its
    // operands itself), and the bf16x2 backward by request
    { Case c; c.name = "bwd_huge_dO"; c.lens = {300, 65, 1}; c.H = 1; c.HV = 3; c.l2 = true; c.gate_fused = true;
      c.dht = c.h0 = true; c.do_scale = 0x1p40f; add(c); }
    { Case c; c.name = "bwd_tiny_dO_long"; c.lens = {3000}; c.H = 1; c.HV = 2; c.gate_kind = 0; c.l2 = true;
      c.do_scale = 0x1p-60f; add(c); }
    { Case c; c.name = "bwd_bf16x2_mixed_fused"; c.lens = {63, 64, 65, 1, 2, 3, 130, 1000};
      c.H = 2; c.HV = 4; c.l2 = c.gate_fused = c.beta_sigmoid = c.h0 = c.dht = true; c.bwd = GdnProblem::BwdPath::Bf16x2; add(c); }
    // right padding on the bf16x2 backward too
    { Case c; c.name = "zero_tails_bf16x2"; c.lens = {200, 200, 200, 64}; c.H = 2; c.HV = 4; c.gate_kind = 0;
      c.l2 = c.gate_fused = c.beta_sigmoid = c.zero_tails = true; c.bwd = GdnProblem::BwdPath::Bf16x2; add(c); }
    { Case c; c.name = "total_32k_4x8192"; c.lens = {8192, 8192, 8192, 8192}; c.H = 1; c.HV = 2;
      c.l2 = c.gate_fused = c.beta_sigmoid = true; add(c); }
  }
  // QRUN_GDN_CASE=a|b|... runs only the cases whose names contain one of the substrings, at the
  // seeds they get in the full run (with the same QRUN_GDN_SEED, a failing case replays alone)
  const char* only = std::getenv("QRUN_GDN_CASE");
  const auto selected = [&](const std::string& name) {
    if (!only) return true;
    const std::string sel = only;
    for (size_t b = 0, e; b <= sel.size(); b = e + 1) {
      e = sel.find('|', b);
      if (e == std::string::npos) e = sel.size();
      if (e > b && name.find(sel.substr(b, e - b)) != std::string::npos) return true;
    }
    return false;
  };
  int fails = 0, ran = 0;
  double worst = 0, worst_b = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    if (!selected(cases[i].name)) continue;
    fails += run_case(cases[i], cases[i].seed ? cases[i].seed : base + 7919 * i, worst, worst_b);
    ++ran;
  }
  if (ran == 0) {
    std::printf("FAILED: no case matches QRUN_GDN_CASE=%s\n", only ? only : "");
    return 1;
  }
  std::printf("%s: %d of %d case(s) failed; worst rel err %.2e (tol %.0e), bf16-stored outputs %.2e beyond "
              "their storage rounding (tol 1e-03); base seed %llu\n",
              fails ? "FAILED" : "ALL PASSED", fails, ran, worst, kTol, worst_b, (unsigned long long)base);
  return fails ? 1 : 0;
}
