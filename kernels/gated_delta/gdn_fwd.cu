// Forward-direction kernels of the chunked gated delta rule:
//   gdn_l2norm_rstd_kernel  per (token, key head) rstd of q and k (optional)
//   gdn_prep_kernel         per (chunk, value head): gate + chunk cumsum, beta, A, T = (I+A)^-1,
//                           P = (Q K^T) .* Gamma (lower incl. diagonal)
//   gdn_state_kernel        per (sequence, value head, 32-wide V slice), sequential over chunks:
//                           Delta = T (diag(beta) V - diag(beta e^gamma) K S), O, S update;
//                           optionally stores S at each chunk start and Delta (for the backward)
#include "gdn_common.cuh"
#include "gdn_kernels.cuh"

namespace qrun::gdn::detail {

__device__ __forceinline__ void chunk_info(const KParams& p, int64_t c, int& n, int64_t& t0,
                                           int& L) {
  n = p.ctab[2 * c];
  const int ci = p.ctab[2 * c + 1];
  const int64_t bos = p.cu[n], eos = p.cu[n + 1];
  t0 = bos + (int64_t)ci * C;
  const int64_t rem = eos - t0;
  L = rem < C ? (int)rem : C;
}

__global__ void gdn_l2norm_rstd_kernel(KParams p) {
  const int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (w >= 2 * p.T * p.H) return;
  const bool isk = w >= p.T * p.H;
  const int64_t r = isk ? w - p.T * p.H : w;
  const int64_t t = r / p.H;
  const int h = (int)(r % p.H);
  const void* src = isk ? p.k : p.q;
  const int64_t base = t * (isk ? p.k_st : p.q_st) + (int64_t)h * (isk ? p.k_sh : p.q_sh);
  float s = 0.f;
  for (int c = lane; c < DK; c += 32) {
    const float x = ld_bf16(src, base + c);
    s += x * x;
  }
#pragma unroll
  for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (lane == 0) (isk ? p.rk : p.rq)[r] = rsqrtf(s + 1e-6f);
}

constexpr int kPrepThreads = 256;

__global__ void __launch_bounds__(kPrepThreads) gdn_prep_kernel(KParams p) {
  extern __shared__ float sm[];
  float* Ks = sm;
  float* Qs = Ks + C * LDK;
  float* As = Qs + C * LDK;
  float* Ts = As + C * LDC;
  float* scr = Ts + C * LDC;  // 768
  float* gam = scr + 3 * 256;
  float* bet = gam + C;

  const int64_t bid = blockIdx.x;
  const int hv = (int)(bid % p.HV);
  const int64_t c = bid / p.HV;
  const int h = hv / p.G;
  int n, L;
  int64_t t0;
  chunk_info(p, c, n, t0, L);
  const int tid = threadIdx.x, warp = tid >> 5;

  if (tid < C) {
    float gv = 0.f, bv = 0.f;
    if (tid < L) {
      const int64_t t = t0 + tid;
      if (p.gate_fused) {
        const float x = ld_any(p.a, p.a_dt, t * p.a_st + hv) + p.dt_bias[hv];
        const float sp = x > 20.f ? x : log1pf(expf(x));
        gv = -expf(p.A_log[hv]) * sp;
      } else {
        gv = p.g[t * p.g_st + hv];
      }
      const float b = ld_any(p.beta, p.beta_dt, t * p.beta_st + hv);
      bv = p.beta_sigmoid ? 1.f / (1.f + expf(-b)) : b;
    }
    gam[tid] = gv;
    bet[tid] = bv;
  }
  // raw q/k (exact in TF32, so KK^T and QK^T need one MMA each); l2norm scales applied after
  float* rsK = scr;
  float* rsQ = scr + C;
  load_tile_bf16<DK, kPrepThreads>(Ks, LDK, bf16_at(p.k, t0 * p.k_st + (int64_t)h * p.k_sh), p.k_st, L,
                                   nullptr, 0, p.vec_k);
  load_tile_bf16<DK, kPrepThreads>(Qs, LDK, bf16_at(p.q, t0 * p.q_st + (int64_t)h * p.q_sh), p.q_st, L,
                                   nullptr, 0, p.vec_q);
  if (tid < C) {
    const bool ok = tid < L;
    rsK[tid] = ok ? (p.l2norm ? p.rk[(t0 + tid) * p.H + h] : 1.f) : 0.f;
    rsQ[tid] = ok ? (p.l2norm ? p.rq[(t0 + tid) * p.H + h] : 1.f) : 0.f;
  }
  for (int i = tid; i < C * LDC; i += blockDim.x) Ts[i] = 0.f;
  __syncthreads();
  if (tid == 0) {
    float s = 0.f;
    for (int r = 0; r < C; ++r) { s += gam[r]; gam[r] = s; }  // padded rows add 0
  }
  __syncthreads();
  if (tid < L) {
    const int64_t i = (t0 + tid) * p.HV + hv;
    p.gam[i] = gam[tid];
    p.bet[i] = bet[tid];
  }
  const int wr = warp & 3, wc = warp >> 2;
  {  // A = strictly-lower beta_r (k_r.k_j) Gamma_rj
    float acc[4][4];
    zero_acc(acc);
    warp_mma<4, DK, true, true>(acc, [&](int m, int k) { return Ks[(16 * wr + m) * LDK + k]; },
                                [&](int k, int nn) { return Ks[(32 * wc + nn) * LDK + k]; });
    for_frag(acc, [&](int r, int j, float& x) {
      r += 16 * wr; j += 32 * wc;
      As[r * LDC + j] = (r > j && r < L) ? bet[r] * rsK[r] * rsK[j] * x * expf(gam[r] - gam[j]) : 0.f;
    });
  }
  {  // P = lower-incl-diag (q_r.k_j) Gamma_rj
    float acc[4][4];
    zero_acc(acc);
    warp_mma<4, DK, true, true>(acc, [&](int m, int k) { return Qs[(16 * wr + m) * LDK + k]; },
                                [&](int k, int nn) { return Ks[(32 * wc + nn) * LDK + k]; });
    float* P = p.Pm + (c * p.HV + hv) * (int64_t)(C * C);
    for_frag(acc, [&](int r, int j, float& x) {
      r += 16 * wr; j += 32 * wc;
      P[r * C + j] = (r >= j && r < L) ? rsQ[r] * rsK[j] * x * expf(gam[r] - gam[j]) : 0.f;
    });
  }
  __syncthreads();
  // T = (I + A)^-1: 16x16 diagonal blocks by forward substitution, then block merges.
  if (warp < 4) {
    const int lane = tid & 31, b0 = 16 * warp;
    if (lane < 16) {
      const int cc = b0 + lane;
      for (int r = 0; r < 16; ++r) {
        float x = (r == lane) ? 1.f : 0.f;
        for (int j = 0; j < r; ++j) x -= As[(b0 + r) * LDC + b0 + j] * Ts[(b0 + j) * LDC + cc];
        Ts[(b0 + r) * LDC + cc] = x;
        __syncwarp(0xffffu);
      }
    }
  }
  __syncthreads();
  for (int d = 1; d < 4; ++d) {
    const int nb = 4 - d;
    // X_ij = sum_{k=j}^{i-1} A_ik T_kj   (i = j + d)
    for (int e = tid; e < nb * 256; e += blockDim.x) {
      const int j = e >> 8, i = j + d, r = (e >> 4) & 15, cc = e & 15;
      float x = 0.f;
      for (int m = 16 * j; m < 16 * i; ++m) x += As[(16 * i + r) * LDC + m] * Ts[m * LDC + 16 * j + cc];
      scr[e] = x;
    }
    __syncthreads();
    for (int e = tid; e < nb * 256; e += blockDim.x) {
      const int j = e >> 8, i = j + d, r = (e >> 4) & 15, cc = e & 15;
      float x = 0.f;
      for (int m = 0; m < 16; ++m) x += Ts[(16 * i + r) * LDC + 16 * i + m] * scr[(j << 8) + (m << 4) + cc];
      Ts[(16 * i + r) * LDC + 16 * j + cc] = -x;
    }
    __syncthreads();
  }
  float* Tg = p.Tm + (c * p.HV + hv) * (int64_t)(C * C);
  for (int i = tid; i < C * C; i += blockDim.x) Tg[i] = Ts[(i >> 6) * LDC + (i & 63)];
}

constexpr int kStateThreads = 256;

// Sequential forward over chunks, one block of 8 warps per (sequence, value head, 32-wide V slice);
// sized for two blocks per SM. Warp w owns rows 16*(w&3) and columns 16*(w>>2) of the 64 x 32
// chunk tiles, and rows 16*w of the 128 x 32 state slice. mode bits: 1 = write o (+ final state), 2 = write hs/Dl (for the backward).
// Per chunk, three phases separated by barriers:
//   1. X = K S and (mode 1) O1 = diag(e^gam) Q S;  Y = diag(beta)(V - diag(e^gam) X) (in place in Vs)
//   2. Delta = T Y
//   3. O = s (O1 + P Delta);  S = e^{gam_L} S + (diag(e^{gam_L - gam}) K)^T Delta
__global__ void __launch_bounds__(kStateThreads, 2) gdn_state_kernel(KParams p, int mode) {
  extern __shared__ float sm[];
  float* Ss = sm;                                                   // [DK][LDV]
  __nv_bfloat16* Kb = reinterpret_cast<__nv_bfloat16*>(Ss + DK * LDV);  // [C][LDB]
  __nv_bfloat16* Qb = Kb + C * LDB;
  float* Ts = reinterpret_cast<float*>(Qb + C * LDB);               // [C][LDC]
  float* Ps = Ts + C * LDC;
  float* Vs = Ps + C * LDC;                                         // [C][LDV] (V, then Y)
  float* Ds = Vs + C * LDV;                                         // [C][LDV]
  float* gam = Ds + C * LDV;
  float* bet = gam + C;
  float* dec = bet + C;
  float* rsK = dec + C;
  float* rsQ = rsK + C;

  const int64_t bid = blockIdx.x;
  const int vs = (int)(bid % NVS);
  const int64_t rest = bid / NVS;
  const int hv = (int)(rest % p.HV);
  const int64_t n = rest / p.HV;
  const int h = hv / p.G;
  const int tid = threadIdx.x, warp = tid >> 5, wr = warp & 3, wc = warp >> 2;
  const int v0 = vs * BV;
  const bool want_o = (mode & 1) && p.o;
  const bool want_h = (mode & 2) != 0;
  const int64_t KV = (int64_t)DK * DV;

  for (int i = tid; i < DK * BV; i += blockDim.x) {
    const int r = i / BV, cc = i % BV;
    Ss[r * LDV + cc] = p.h0 ? p.h0[(n * p.HV + hv) * KV + (int64_t)r * DV + v0 + cc] : 0.f;
  }
  // raw bf16 values (exact in TF32); the l2norm row scales are applied outside the products
  auto Kr = [&](int r, int c) { return __bfloat162float(Kb[r * LDB + c]); };
  auto Qr = [&](int r, int c) { return __bfloat162float(Qb[r * LDB + c]); };
  const int64_t bos = p.cu[n], eos = p.cu[n + 1];
  const int64_t c_beg = p.coff[n], c_end = p.coff[n + 1];
  for (int64_t c = c_beg; c < c_end; ++c) {
    const int64_t t0 = bos + (c - c_beg) * C;
    const int L = (int)((eos - t0) < C ? (eos - t0) : C);
    __syncthreads();  // previous chunk fully done with smem
    load_chunk<kStateThreads>(p, h, hv, c, t0, L, want_o, want_o, p.v, p.v_st, p.v_sh, p.vec_v, v0,
                              Kb, rsK, Qb, rsQ, Ts, Ps, Vs, gam, bet);
    if (want_h) {
      float* hg = p.hs + (c * p.HV + hv) * KV;
      for (int i = tid; i < DK * BV; i += blockDim.x) {
        const int r = i / BV, cc = i % BV;
        hg[(int64_t)r * DV + v0 + cc] = Ss[r * LDV + cc];
      }
    }
    __syncthreads();
    const float gl = gam[L - 1];
    if (tid < C) dec[tid] = tid < L ? expf(gl - gam[tid]) * rsK[tid] : 0.f;  // decay x l2norm scale
    // phase 1
    float aO[2][4];
    {
      float acc[2][4];
      zero_acc(acc);
      warp_mma<2, DK, true>(acc, [&](int m, int k) { return Kr(16 * wr + m, k); },
                            [&](int k, int nn) { return Ss[k * LDV + 16 * wc + nn]; });
      if (want_o) {
        zero_acc(aO);
        warp_mma<2, DK, true>(aO, [&](int m, int k) { return Qr(16 * wr + m, k); },
                              [&](int k, int nn) { return Ss[k * LDV + 16 * wc + nn]; });
        for_frag(aO, [&](int r, int j, float& x) { r += 16 * wr; x *= expf(gam[r]) * rsQ[r]; });
      }
      for_frag(acc, [&](int r, int j, float& x) {
        r += 16 * wr;
        j += 16 * wc;
        Vs[r * LDV + j] = r < L ? bet[r] * (Vs[r * LDV + j] - expf(gam[r]) * rsK[r] * x) : 0.f;
      });
    }
    __syncthreads();
    {  // phase 2: Delta = T Y
      float acc[2][4];
      zero_acc(acc);
      warp_mma<2, C>(acc, [&](int m, int k) { return Ts[(16 * wr + m) * LDC + k]; },
                     [&](int k, int nn) { return Vs[k * LDV + 16 * wc + nn]; });
      for_frag(acc, [&](int r, int j, float& x) {
        r += 16 * wr;
        j += 16 * wc;
        const float d = r < L ? x : 0.f;
        Ds[r * LDV + j] = d;
        if (want_h && r < L) p.Dl[((t0 + r) * p.HV + hv) * DV + v0 + j] = d;
      });
    }
    __syncthreads();
    // phase 3
    if (want_o) {
      warp_mma<2, C>(aO, [&](int m, int k) { return Ps[(16 * wr + m) * LDC + k]; },
                     [&](int k, int nn) { return Ds[k * LDV + 16 * wc + nn]; });
      __nv_bfloat16* o = static_cast<__nv_bfloat16*>(p.o);
      for_frag(aO, [&](int r, int j, float& x) {
        r += 16 * wr;
        j += 16 * wc;
        if (r < L) o[(t0 + r) * p.o_st + (int64_t)hv * p.o_sh + v0 + j] = __float2bfloat16_rn(p.scale * x);
      });
    }
    const float eg = expf(gl);
    {
      const int rb = 16 * warp;
      float acc[4][4];
      for_frag(acc, [&](int r, int j, float& x) { x = eg * Ss[(rb + r) * LDV + j]; });
      warp_mma<4, C, true>(acc, [&](int m, int k) { return Kr(k, rb + m); },
                           [&](int k, int nn) { return Ds[k * LDV + nn] * dec[k]; });
      for_frag(acc, [&](int r, int j, float& x) { Ss[(rb + r) * LDV + j] = x; });
    }
  }
  __syncthreads();
  if (p.ht && (mode & 1)) {
    for (int i = tid; i < DK * BV; i += blockDim.x) {
      const int r = i / BV, cc = i % BV;
      p.ht[(n * p.HV + hv) * KV + (int64_t)r * DV + v0 + cc] = Ss[r * LDV + cc];
    }
  }
}

}  // namespace qrun::gdn::detail
