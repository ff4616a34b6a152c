// Kernel parameter block and kernel declarations shared by the gated delta launch code.
#pragma once
#include <cstdint>

#include "gdn_common.cuh"

namespace qrun::gdn::detail {

struct KParams {
  int64_t T, N, NT;
  int H, HV, G;
  const int32_t* cu;
  const int32_t* ctab;
  const int32_t* coff;
  const void* q; int64_t q_st, q_sh;
  const void* k; int64_t k_st, k_sh;
  const void* v; int64_t v_st, v_sh;
  int gate_fused;
  const float* g; int64_t g_st;
  const void* a; int a_dt; int64_t a_st;
  const float* A_log;
  const float* dt_bias;
  const void* beta; int beta_dt; int64_t beta_st;
  int beta_sigmoid;
  int l2norm;
  float scale;
  const float* h0;
  // workspace
  float* rq; float* rk;      // [T,H]
  float* gam; float* bet;    // [T,HV]
  float* Tm; float* Pm;      // [NT,HV,64,64]
  float* hs; float* dhs;     // [NT,HV,K,V]
  float* Dl; float* dDl;     // [T,HV,V]
  float* dqh; float* dkh;    // [T,HV,K]
  float* part;               // [NT,HV,2]
  // forward outputs
  void* o; int64_t o_st, o_sh;
  float* ht;
  // backward
  const void* dO; int64_t do_st, do_sh;
  const float* dht;
  int gdt;
  void* dq; int64_t dq_st, dq_sh;
  void* dk; int64_t dk_st, dk_sh;
  void* dv; int64_t dv_st, dv_sh;
  float* dg; float* dbeta; float* dA_log; float* ddt; float* dh0;
  // 16-byte vector loads allowed (pointer and strides aligned)
  int vec_q, vec_k, vec_v, vec_do;
};

__device__ __forceinline__ const __nv_bfloat16* bf16_at(const void* p, int64_t off) {
  return static_cast<const __nv_bfloat16*>(p) + off;
}

// Loads the [64 x 128] q or k tile of key head h starting at token t0 as fp32 (l2-normalised when
// p.l2norm), zero rows >= L.
template <int NTHR>
__device__ __forceinline__ void load_qk(float* dst, const KParams& p, bool isk, int h, int64_t t0,
                                        int L) {
  const void* src = isk ? p.k : p.q;
  const int64_t st = isk ? p.k_st : p.q_st, sh = isk ? p.k_sh : p.q_sh;
  const float* rs = p.l2norm ? (isk ? p.rk : p.rq) + t0 * p.H + h : nullptr;
  load_tile_bf16<DK, NTHR>(dst, LDK, bf16_at(src, t0 * st + (int64_t)h * sh), st, L, rs, p.H,
                           isk ? p.vec_k : p.vec_q);
}

// bf16 q/k tile kept raw in shared memory (half the footprint of fp32), row stride LDB elements
// (16-byte aligned rows), with the per-row l2norm scale in rs[64] (0 for rows >= L).
constexpr int LDB = DK + 8;

template <int NTHR>
__device__ __forceinline__ void load_qk_raw(__nv_bfloat16* dst, float* rs, const KParams& p,
                                            bool isk, int h, int64_t t0, int L) {
  const void* src = isk ? p.k : p.q;
  const int64_t st = isk ? p.k_st : p.q_st, sh = isk ? p.k_sh : p.q_sh;
  const __nv_bfloat16* base = bf16_at(src, t0 * st + (int64_t)h * sh);
  const float* rstd = p.l2norm ? (isk ? p.rk : p.rq) : nullptr;
  if (threadIdx.x < C) {
    const int r = threadIdx.x;
    rs[r] = r < L ? (rstd ? rstd[(t0 + r) * p.H + h] : 1.f) : 0.f;
  }
  if (isk ? p.vec_k : p.vec_q) {
    constexpr int VPR = DK / 8, NV = C * VPR, PER = (NV + NTHR - 1) / NTHR;
    uint4 buf[PER];
#pragma unroll
    for (int i = 0; i < PER; ++i) {
      const int v = threadIdx.x + i * NTHR, r = v / VPR, c8 = v % VPR;
      buf[i] = make_uint4(0u, 0u, 0u, 0u);
      if (v < NV && r < L) buf[i] = __ldg(reinterpret_cast<const uint4*>(base + r * st + c8 * 8));
    }
#pragma unroll
    for (int i = 0; i < PER; ++i) {
      const int v = threadIdx.x + i * NTHR, r = v / VPR, c8 = v % VPR;
      if (v < NV) *reinterpret_cast<uint4*>(dst + r * LDB + c8 * 8) = buf[i];
    }
  } else {
    for (int i = threadIdx.x; i < C * DK; i += NTHR) {
      const int r = i / DK, c = i % DK;
      dst[r * LDB + c] = r < L ? base[r * st + c] : __float2bfloat16_rn(0.f);
    }
  }
}

// Everything one step of a sequential kernel needs for chunk c, with all global loads issued
// before the first shared-memory store (one memory latency per chunk instead of one per tile):
// raw k (+ l2norm scales), optionally raw q, T, optionally P, a [64 x 32] bf16 slice X (v or dO)
// as fp32, gamma and beta. Falls back to the per-tile loaders when 16-byte loads are not allowed.
template <int NTHR>
__device__ __forceinline__ void load_chunk(const KParams& p, int h, int hv, int64_t c, int64_t t0,
                                           int L, bool want_q, bool want_p, const void* xsrc,
                                           int64_t x_st, int64_t x_sh, int vec_x, int v0,
                                           __nv_bfloat16* Kb, float* rsK, __nv_bfloat16* Qb,
                                           float* rsQ, float* Ts, float* Ps, float* Xs,
                                           float* gam, float* bet) {
  const int tid = threadIdx.x;
  const int64_t ct = (c * p.HV + hv) * (int64_t)(C * C);
  const __nv_bfloat16* xbase = bf16_at(xsrc, t0 * x_st + (int64_t)hv * x_sh + v0);
  const bool vec = p.vec_k && (!want_q || p.vec_q) && vec_x;
  float g_ = 0.f, b_ = 0.f, rk_ = 0.f, rq_ = 0.f;
  if (tid < C) {
    const int r = tid < L ? tid : L - 1;
    g_ = p.gam[(t0 + r) * p.HV + hv];
    if (tid < L) {
      b_ = p.bet[(t0 + r) * p.HV + hv];
      rk_ = p.l2norm ? p.rk[(t0 + r) * p.H + h] : 1.f;
      rq_ = p.l2norm ? p.rq[(t0 + r) * p.H + h] : 1.f;
    }
  }
  if (vec) {
    constexpr int NQK = C * DK / 8 / NTHR, NTP = C * C / 4 / NTHR;
    constexpr int NXV = C * BV / 8, NX = (NXV + NTHR - 1) / NTHR;
    static_assert((C * DK / 8) % NTHR == 0 && (C * C / 4) % NTHR == 0, "tile/threads mismatch");
    const __nv_bfloat16* kbase = bf16_at(p.k, t0 * p.k_st + (int64_t)h * p.k_sh);
    const __nv_bfloat16* qbase = bf16_at(p.q, t0 * p.q_st + (int64_t)h * p.q_sh);
    uint4 kb[NQK], qb[NQK], xb[NX];
    float4 tb[NTP], pb[NTP];
    const uint4 z4 = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
    for (int i = 0; i < NQK; ++i) {
      const int v = tid + i * NTHR, r = v >> 4, c8 = v & 15;
      kb[i] = r < L ? __ldg(reinterpret_cast<const uint4*>(kbase + r * p.k_st + c8 * 8)) : z4;
      qb[i] = (want_q && r < L) ? __ldg(reinterpret_cast<const uint4*>(qbase + r * p.q_st + c8 * 8)) : z4;
    }
#pragma unroll
    for (int i = 0; i < NTP; ++i) {
      const int v = tid + i * NTHR;
      tb[i] = __ldg(reinterpret_cast<const float4*>(p.Tm + ct) + v);
      pb[i] = want_p ? __ldg(reinterpret_cast<const float4*>(p.Pm + ct) + v) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int i = 0; i < NX; ++i) {
      const int v = tid + i * NTHR, r = v / (BV / 8), c8 = v % (BV / 8);
      xb[i] = (v < NXV && r < L) ? __ldg(reinterpret_cast<const uint4*>(xbase + r * x_st + c8 * 8)) : z4;
    }
#pragma unroll
    for (int i = 0; i < NQK; ++i) {
      const int v = tid + i * NTHR, r = v >> 4, c8 = v & 15;
      *reinterpret_cast<uint4*>(Kb + r * LDB + c8 * 8) = kb[i];
      if (want_q) *reinterpret_cast<uint4*>(Qb + r * LDB + c8 * 8) = qb[i];
    }
#pragma unroll
    for (int i = 0; i < NTP; ++i) {
      const int v = tid + i * NTHR, r = v >> 4, c4 = (v & 15) * 4;
      float* d = Ts + r * LDC + c4;
      d[0] = tb[i].x; d[1] = tb[i].y; d[2] = tb[i].z; d[3] = tb[i].w;
      if (want_p) {
        float* e = Ps + r * LDC + c4;
        e[0] = pb[i].x; e[1] = pb[i].y; e[2] = pb[i].z; e[3] = pb[i].w;
      }
    }
#pragma unroll
    for (int i = 0; i < NX; ++i) {
      const int v = tid + i * NTHR, r = v / (BV / 8), c8 = v % (BV / 8);
      if (v < NXV) {
        const __nv_bfloat162* h2 = reinterpret_cast<const __nv_bfloat162*>(&xb[i]);
        float* d = Xs + r * LDV + c8 * 8;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float2 f = __bfloat1622float2(h2[j]);
          d[2 * j] = f.x;
          d[2 * j + 1] = f.y;
        }
      }
    }
    if (tid < C) {
      rsK[tid] = rk_;
      if (want_q) rsQ[tid] = rq_;
    }
  } else {
    load_qk_raw<NTHR>(Kb, rsK, p, true, h, t0, L);
    if (want_q) load_qk_raw<NTHR>(Qb, rsQ, p, false, h, t0, L);
    load_tile_f32<C, C, NTHR>(Ts, LDC, p.Tm + ct, C, C);
    if (want_p) load_tile_f32<C, C, NTHR>(Ps, LDC, p.Pm + ct, C, C);
    load_tile_bf16<BV, NTHR>(Xs, LDV, xbase, x_st, L, nullptr, 0, vec_x);
  }
  if (tid < C) {
    gam[tid] = g_;
    bet[tid] = b_;
  }
}

}  // namespace qrun::gdn::detail
