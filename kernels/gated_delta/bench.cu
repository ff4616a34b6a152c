// Benchmark (not a test) of the gated delta kernels at the Qwen3.5-27B head configuration
// (H = 16 key heads, HV = 48 value heads, K = V = 128): one 8192-token sequence and 4 x 2048 packed.
// Times forward and backward with CUDA events (warm-up, median of N), prints achieved bandwidth
// (compulsory bytes: inputs read once, outputs written once) and FLOP rate (FLOP model of
// gated-delta-kernels.md §7: 176 k FLOP/token/value-head forward, 508 k backward), next to the
// published H200 figures for fla and FlashQLA at this configuration.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "gated_delta.h"

using namespace qrun::gdn;

#define CK(x)                                                                                  \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "CUDA error %s: %s\n", #x, cudaGetErrorString(e_));                \
      std::exit(2);                                                                            \
    }                                                                                          \
  } while (0)

template <class T>
T* dalloc(size_t n) {
  T* p;
  CK(cudaMalloc(&p, n * sizeof(T)));
  return p;
}

static void fill_bf16(__nv_bfloat16* d, size_t n, float scale, std::mt19937& rng) {
  std::normal_distribution<float> nd;
  std::vector<__nv_bfloat16> h(n);
  for (auto& x : h) x = __float2bfloat16_rn(nd(rng) * scale);
  CK(cudaMemcpy(d, h.data(), n * 2, cudaMemcpyHostToDevice));
}

#ifdef QRUN_GDN_PHASES
namespace qrun::gdn::detail {
void gdn_debug_phases_seq(unsigned long long* out);  // null: reset
void gdn_debug_phases_bwd(unsigned long long* out);
void gdn_debug_phases_seqt(unsigned long long* out);
}  // namespace qrun::gdn::detail
// Per-phase cycle split of one launch sequence (thread 0 of every block, summed over blocks).
static void print_phases(const char* what, const unsigned long long* c, int lo, int hi) {
  unsigned long long tot = 0;
  for (int i = lo; i < hi; ++i) tot += c[i];
  std::printf("  phases %-10s", what);
  for (int i = lo; i < hi; ++i) std::printf(" %d:%4.1f%%", i, tot ? 100.0 * c[i] / tot : 0.0);
  std::printf("  (total %.3g cycles)\n", (double)tot);
}
#endif

int main(int argc, char** argv) {
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    std::printf("no CUDA device\n");
    return 77;
  }
  const int iters = argc > 1 ? std::atoi(argv[1]) : 20;
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  const int H = 16, HV = 48, K = 128, V = 128;
  struct Cfg { const char* name; std::vector<int32_t> lens; bool fused; double pub_fla_f, pub_qla_f, pub_fla_b, pub_qla_b; };
  std::vector<Cfg> cfgs = {
      {"1x8192", {8192}, false, 0.665, 0.410, 2.2, 1.2},
      {"4x2048", {2048, 2048, 2048, 2048}, false, -1, -1, -1, -1},
      {"1x8192 fused(l2,gate,sig)", {8192}, true, -1, -1, -1, -1},
  };
  // QRUN_GDN_BENCH_CFG=i runs only config i; QRUN_GDN_BENCH_LENS=l1,l2,... runs one config of those
  // sequence lengths instead; QRUN_GDN_BENCH_WARM=n warm-ups (default 3; 0 for ncu).
  if (const char* e = std::getenv("QRUN_GDN_BENCH_LENS")) {
    static std::string name;
    Cfg c{nullptr, {}, false, -1, -1, -1, -1};
    for (const char* s = e; *s;) {
      char* end = nullptr;
      const long l = std::strtol(s, &end, 10);
      if (end == s || l < 0 || l > (1 << 24)) { std::fprintf(stderr, "bad QRUN_GDN_BENCH_LENS\n"); return 2; }
      c.lens.push_back((int32_t)l);
      s = *end == ',' ? end + 1 : end;
      if (*end && *end != ',') { std::fprintf(stderr, "bad QRUN_GDN_BENCH_LENS\n"); return 2; }
    }
    if (c.lens.empty()) { std::fprintf(stderr, "bad QRUN_GDN_BENCH_LENS\n"); return 2; }
    name = std::to_string(c.lens.size()) + " seqs (" + e + ")";
    if (name.size() > 26) name = std::to_string(c.lens.size()) + " seqs";
    c.name = name.c_str();
    cfgs = {c};
  } else if (const char* e = std::getenv("QRUN_GDN_BENCH_CFG")) {
    const int i = std::atoi(e);
    if (i < 0 || i >= (int)cfgs.size()) { std::fprintf(stderr, "bad QRUN_GDN_BENCH_CFG\n"); return 2; }
    cfgs = {cfgs[i]};
  }
  const int warm = std::getenv("QRUN_GDN_BENCH_WARM") ? std::atoi(std::getenv("QRUN_GDN_BENCH_WARM")) : 3;
  std::mt19937 rng(1234);
  std::printf("\n%-26s %9s %9s %9s %9s %9s %9s | %9s %9s | %9s %9s\n", "config", "fwd ms", "fwd GB/s",
              "fwd TF/s", "bwd ms", "bwd GB/s", "bwd TF/s", "fla fwd", "QLA fwd", "fla bwd", "QLA bwd");
  for (auto& cf : cfgs) {
    std::vector<int32_t> cu = {0};
    for (int l : cf.lens) cu.push_back(cu.back() + l);
    const int64_t T = cu.back(), N = (int64_t)cf.lens.size();
    ChunkTables tabs = gdn_build_chunk_tables(cu.data(), N);
    int32_t* d_cu = dalloc<int32_t>(cu.size());
    int32_t* d_tab = dalloc<int32_t>(tabs.chunk_table.size());
    int32_t* d_off = dalloc<int32_t>(tabs.chunk_offsets.size());
    CK(cudaMemcpy(d_cu, cu.data(), cu.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_tab, tabs.chunk_table.data(), tabs.chunk_table.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_off, tabs.chunk_offsets.data(), tabs.chunk_offsets.size() * 4, cudaMemcpyHostToDevice));
    auto* q = dalloc<__nv_bfloat16>(T * H * K);
    auto* k = dalloc<__nv_bfloat16>(T * H * K);
    auto* v = dalloc<__nv_bfloat16>(T * HV * V);
    auto* dO = dalloc<__nv_bfloat16>(T * HV * V);
    auto* o = dalloc<__nv_bfloat16>(T * HV * V);
    auto* a = dalloc<__nv_bfloat16>(T * HV);
    auto* beta = dalloc<__nv_bfloat16>(T * HV);
    float* g = dalloc<float>(T * HV);
    float* A_log = dalloc<float>(HV);
    float* dt = dalloc<float>(HV);
    fill_bf16(q, T * H * K, cf.fused ? 1.f : 0.0884f, rng);
    fill_bf16(k, T * H * K, cf.fused ? 1.f : 0.0884f, rng);
    fill_bf16(v, T * HV * V, 1.f, rng);
    fill_bf16(dO, T * HV * V, 1.f, rng);
    fill_bf16(a, T * HV, 1.f, rng);
    {
      std::normal_distribution<float> nd;
      std::uniform_real_distribution<float> ud(0.f, 1.f);
      std::vector<float> hg(T * HV), hA(HV), hd(HV);
      std::vector<__nv_bfloat16> hb(T * HV);
      for (auto& x : hg) x = -std::log1p(std::exp(-nd(rng))) / 16.f;  // logsigmoid(randn)/16
      for (auto& x : hb) x = __float2bfloat16_rn(cf.fused ? nd(rng) : ud(rng));
      for (auto& x : hA) x = std::log(1.f + 15.f * ud(rng));
      for (auto& x : hd) x = nd(rng);
      CK(cudaMemcpy(g, hg.data(), hg.size() * 4, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(beta, hb.data(), hb.size() * 2, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(A_log, hA.data(), HV * 4, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(dt, hd.data(), HV * 4, cudaMemcpyHostToDevice));
    }
    GdnProblem p;
    p.total_tokens = T; p.num_seqs = N; p.num_chunks = tabs.num_chunks; p.H = H; p.HV = HV;
    p.cu_seqlens = d_cu; p.chunk_table = d_tab; p.chunk_offsets = d_off;
    p.q = q; p.k = k; p.v = v;
    p.q_st = p.k_st = (int64_t)H * K; p.q_sh = p.k_sh = K; p.v_st = (int64_t)HV * V; p.v_sh = V;
    p.gate_fused = cf.fused; p.g = g; p.g_st = HV; p.a = a; p.a_st = HV; p.A_log = A_log; p.dt_bias = dt;
    p.beta = beta; p.beta_dtype = DType::BF16; p.beta_st = HV; p.beta_sigmoid = cf.fused;
    p.qk_l2norm = cf.fused;
    const size_t wsb = gdn_bwd_workspace_bytes(p);
    void* ws = dalloc<char>(wsb);
    GdnFwdOut fo;
    fo.o = o; fo.o_st = (int64_t)HV * V; fo.o_sh = V;
    GdnBwdIO io;
    io.dO = dO; io.do_st = (int64_t)HV * V; io.do_sh = V;
    io.grad_dtype = DType::BF16;
    io.dq = dalloc<__nv_bfloat16>(T * H * K); io.dq_st = (int64_t)H * K; io.dq_sh = K;
    io.dk = dalloc<__nv_bfloat16>(T * H * K); io.dk_st = (int64_t)H * K; io.dk_sh = K;
    io.dv = dalloc<__nv_bfloat16>(T * HV * V); io.dv_st = (int64_t)HV * V; io.dv_sh = V;
    io.dg = dalloc<float>(T * HV); io.dbeta = dalloc<float>(T * HV);
    io.dA_log = dalloc<float>(HV); io.ddt_bias = dalloc<float>(HV);
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    auto time_it = [&](auto fn) {
      for (int i = 0; i < warm; ++i) fn();
      CK(cudaDeviceSynchronize());
      std::vector<float> ms;
      for (int i = 0; i < iters; ++i) {
        CK(cudaEventRecord(e0));
        fn();
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float t;
        CK(cudaEventElapsedTime(&t, e0, e1));
        ms.push_back(t);
      }
      std::sort(ms.begin(), ms.end());
      return (double)ms[ms.size() / 2];
    };
    int32_t* fell = dalloc<int32_t>(1);
    fo.fell_back = fell;
    const double tf = time_it([&] { gdn_forward(p, fo, ws, wsb, nullptr); });
    int32_t fell_h = -1;
    CK(cudaMemcpy(&fell_h, fell, 4, cudaMemcpyDeviceToHost));
    p.fast_forward = false;  // the bf16x2 forward, for comparison
    const double tf_x = time_it([&] { gdn_forward(p, fo, ws, wsb, nullptr); });
    p.fast_forward = true;
    io.fell_back = fell;
    const double tb = time_it([&] { gdn_backward(p, io, ws, wsb, nullptr); });
    // the two backward paths forced (the reported one is BwdPath::Auto's choice)
    using Path = GdnProblem::BwdPath;
    p.backward_path = Path::Fp16;
    const double tb_16 = time_it([&] { gdn_backward(p, io, ws, wsb, nullptr); });
    int32_t fell_bh = -1;
    CK(cudaMemcpy(&fell_bh, fell, 4, cudaMemcpyDeviceToHost));
    p.backward_path = Path::Bf16x2;
    const double tb_x = time_it([&] { gdn_backward(p, io, ws, wsb, nullptr); });
    p.backward_path = Path::Auto;
    // the training pair: the forward keeps its prep (GdnFwdOut::keep_for_backward) and the
    // backward takes it from that workspace instead of launching its own (Note [Kept prep])
    const size_t wsf = gdn_fwd_workspace_bytes(p), wsk = gdn_bwd_workspace_bytes(p, true);
    void* fws = dalloc<char>(wsf);
    GdnFwdOut fk = fo;
    fk.fell_back = nullptr;
    fk.keep_for_backward = true;
    const double tf_k = time_it([&] { gdn_forward(p, fk, fws, wsf, nullptr); });
    GdnBwdIO ik = io;
    ik.fell_back = nullptr;
    ik.forward_workspace = fws;
    const double tb_k = time_it([&] { gdn_backward(p, ik, ws, wsk, nullptr); });
    CK(cudaGetLastError());
    fo.fell_back = nullptr;
    io.fell_back = nullptr;
    cudaFree(fell);
#ifdef QRUN_GDN_PHASES
    {
      using namespace qrun::gdn::detail;
      unsigned long long c[32];
      gdn_debug_phases_seq(nullptr);
      gdn_debug_phases_seqt(nullptr);
      gdn_forward(p, fo, ws, wsb, nullptr);
      CK(cudaDeviceSynchronize());
      gdn_debug_phases_seq(c);
      print_phases("state fwd", c, 0, 7);
      gdn_debug_phases_seqt(c);
      print_phases("state16t", c, 0, 5);
      gdn_debug_phases_seq(nullptr);
      gdn_debug_phases_bwd(nullptr);
      gdn_backward(p, io, ws, wsb, nullptr);
      CK(cudaDeviceSynchronize());
      gdn_debug_phases_seq(c);
      print_phases("state bwd", c, 0, 7);
      print_phases("dh", c, 8, 15);
      gdn_debug_phases_bwd(c);
      print_phases("bwd_chunk", c, 0, 16);  // (15: each item's prologue and slice-0 wait)
      // the fp16 reverse pass (gdn_dh16t_kernel: clocks 8-15 of the seqt set), whichever path auto takes
      p.backward_path = GdnProblem::BwdPath::Fp16;
      gdn_debug_phases_seqt(nullptr);
      gdn_backward(p, io, ws, wsb, nullptr);
      CK(cudaDeviceSynchronize());
      p.backward_path = GdnProblem::BwdPath::Auto;
      gdn_debug_phases_seqt(c);
      print_phases("dh16t", c, 8, 16);
    }
#endif
    const double th = (double)T * HV;
    // compulsory bytes: fwd reads q,k (bf16, per key head), v, g, beta; writes o.
    const double bytes_f = (double)T * H * K * 2 * 2 + th * V * 2 * 2 + th * (4 + 2);
    // bwd reads q,k,v,dO,g,beta; writes dq,dk (bf16), dv, dg, dbeta.
    const double bytes_b = (double)T * H * K * 2 * 4 + th * V * 2 * 3 + th * (4 + 2) + th * 8;
    const double fl_f = th * 176e3, fl_b = th * 508e3;
    auto pub = [](double x) { static char b[4][16]; static int i = 0; i = (i + 1) & 3;
      if (x < 0) std::snprintf(b[i], 16, "%9s", "-"); else std::snprintf(b[i], 16, "%9.3f", x); return b[i]; };
    std::printf("%-26s %9.3f %9.0f %9.1f %9.3f %9.0f %9.1f | %s %s | %s %s\n", cf.name, tf,
                bytes_f / tf * 1e-6, fl_f / tf * 1e-9, tb, bytes_b / tb * 1e-6, fl_b / tb * 1e-9,
                pub(cf.pub_fla_f), pub(cf.pub_qla_f), pub(cf.pub_fla_b), pub(cf.pub_qla_b));
    std::printf("%-26s fwd on fp16 operands%s; the bf16x2 forward (fast_forward = false): %.3f ms\n", "",
                fell_h ? " FELL BACK to bf16x2" : " (no fallback)", tf_x);
    std::printf("%-26s bwd reverse pass on fp16 operands (BwdPath::Fp16)%s: %.3f ms; bf16x2 (BwdPath::Bf16x2): %.3f ms\n", "",
                fell_bh ? " FELL BACK to bf16x2" : "", tb_16, tb_x);
    std::printf("%-26s kept prep (training; keep_for_backward, %.0f MB kept): fwd %.3f ms, bwd %.3f ms; fwd + bwd %.3f ms "
                "(recomputing: %.3f)\n", "", wsf / 1e6, tf_k, tb_k, tf_k + tb_k, tf + tb);
    std::fflush(stdout);
    cudaFree(d_cu); cudaFree(d_tab); cudaFree(d_off); cudaFree(q); cudaFree(k); cudaFree(v); cudaFree(dO);
    cudaFree(o); cudaFree(a); cudaFree(beta); cudaFree(g); cudaFree(A_log); cudaFree(dt); cudaFree(ws); cudaFree(fws);
    cudaFree(io.dq); cudaFree(io.dk); cudaFree(io.dv); cudaFree(io.dg); cudaFree(io.dbeta);
    cudaFree(io.dA_log); cudaFree(io.ddt_bias);
    cudaEventDestroy(e0); cudaEventDestroy(e1);
  }
  std::printf("\nPublished H200 figures (fla / FlashQLA) are for 1x8192 at H=16, HV=48 (bwd scaled from\n"
              "their 32-head figures); goal: fwd <= 0.45 ms, bwd <= 1.4 ms. Times exclude host-side\n"
              "table building; they include every launch of gdn_forward / gdn_backward. The table's\n"
              "bwd recomputes prep; the kept-prep line is the training pair the plugin runs.\n");
  return 0;
}
