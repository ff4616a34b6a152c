// Forward-direction kernels of the chunked gated delta rule:
//   gdn_l2norm_rstd_kernel  per (token, key head) rstd of q and k (optional)
//   gdn_prep_kernel         per (chunk, value head): gate + chunk cumsum, beta, A, T = (I+A)^-1,
//                           P = (Q K^T) .* Gamma (lower incl. diagonal)
// (the sequential gdn_state_kernel is in gdn_seq.cu)
#include "gdn_common.cuh"
#include "gdn_kernels.cuh"
#include "gdn_mma16.cuh"

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
constexpr int LDKB = DK + 8;  // raw bf16 q/k row stride

// raw bf16 q/k (exact operands) instead of fp32 copies: 72 KB, so three blocks fit per SM
size_t prep_smem_bytes() { return (size_t)2 * C * LDKB * 2 + (2 * C * LDC + 3 * 256 + 2 * C) * sizeof(float); }

__global__ void __launch_bounds__(kPrepThreads) gdn_prep_kernel(KParams p) {
  extern __shared__ __align__(16) float sm[];
  __nv_bfloat16* Kb = reinterpret_cast<__nv_bfloat16*>(sm);  // [C][LDKB] raw
  __nv_bfloat16* Qb = Kb + C * LDKB;
  float* As = reinterpret_cast<float*>(Qb + C * LDKB);
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
  {
    const __nv_bfloat16* kbase = bf16_at(p.k, t0 * p.k_st + (int64_t)h * p.k_sh);
    const __nv_bfloat16* qbase = bf16_at(p.q, t0 * p.q_st + (int64_t)h * p.q_sh);
    if (p.vec_k && p.vec_q) {
      for (int v = tid; v < C * DK / 8; v += kPrepThreads) {
        const int r = v >> 4, c8 = (v & 15) * 8;
        const int rr = r < L ? r : 0;
        cp_async16(Kb + r * LDKB + c8, kbase + rr * p.k_st + c8, r < L ? 16 : 0);
        cp_async16(Qb + r * LDKB + c8, qbase + rr * p.q_st + c8, r < L ? 16 : 0);
      }
      cp_async_commit();
    } else {
      const __nv_bfloat16 z = __float2bfloat16_rn(0.f);
      for (int i = tid; i < C * DK; i += kPrepThreads) {
        const int r = i / DK, cc = i % DK;
        Kb[r * LDKB + cc] = r < L ? kbase[r * p.k_st + cc] : z;
        Qb[r * LDKB + cc] = r < L ? qbase[r * p.q_st + cc] : z;
      }
    }
  }
  if (tid < C) {
    const bool ok = tid < L;
    rsK[tid] = ok ? (p.l2norm ? p.rk[(t0 + tid) * p.H + h] : 1.f) : 0.f;
    rsQ[tid] = ok ? (p.l2norm ? p.rq[(t0 + tid) * p.H + h] : 1.f) : 0.f;
  }
  for (int i = tid; i < C * LDC; i += blockDim.x) Ts[i] = 0.f;
  cp_async_wait_all();
  __syncthreads();
  if (warp == 0) {  // chunk cumsum: lane owns rows 2*lane, 2*lane+1; fixed-order warp scan
    const int lane = tid & 31;
    const float a0 = gam[2 * lane], a1 = gam[2 * lane + 1];
    float sc = a0 + a1;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const float y = __shfl_up_sync(0xffffffffu, sc, o);
      if (lane >= o) sc += y;
    }
    const float ex = sc - (a0 + a1);  // exclusive prefix of this lane's pair
    gam[2 * lane] = ex + a0;          // padded rows add 0
    gam[2 * lane + 1] = ex + a0 + a1;
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
    warp_mma<4, DK, true, true>(acc, [&](int m, int k) { return __bfloat162float(Kb[(16 * wr + m) * LDKB + k]); },
                                [&](int k, int nn) { return __bfloat162float(Kb[(32 * wc + nn) * LDKB + k]); });
    for_frag(acc, [&](int r, int j, float& x) {
      r += 16 * wr; j += 32 * wc;
      As[r * LDC + j] = (r > j && r < L) ? bet[r] * rsK[r] * rsK[j] * x * expf(gam[r] - gam[j]) : 0.f;
    });
  }
  {  // P = lower-incl-diag (q_r.k_j) Gamma_rj
    float acc[4][4];
    zero_acc(acc);
    warp_mma<4, DK, true, true>(acc, [&](int m, int k) { return __bfloat162float(Qb[(16 * wr + m) * LDKB + k]); },
                                [&](int k, int nn) { return __bfloat162float(Kb[(32 * wc + nn) * LDKB + k]); });
    __nv_bfloat16* P = p.Pp + (c * p.HV + hv) * (int64_t)(2 * C * C);  // hi/lo planes
    for_frag(acc, [&](int r, int j, float& x) {
      r += 16 * wr; j += 32 * wc;
      const float v = (r >= j && r < L) ? rsQ[r] * rsK[j] * x * expf(gam[r] - gam[j]) : 0.f;
      const __nv_bfloat16 hi = __float2bfloat16_rn(v);
      P[r * C + j] = hi;
      P[C * C + r * C + j] = __float2bfloat16_rn(v - __bfloat162float(hi));
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
  __nv_bfloat16* Tpg = p.Tp + (c * p.HV + hv) * (int64_t)(2 * C * C);  // hi/lo planes
  for (int i = tid; i < C * C; i += blockDim.x) {
    const float v = Ts[(i >> 6) * LDC + (i & 63)];
    const __nv_bfloat16 hi = __float2bfloat16_rn(v);
    Tpg[i] = hi;
    Tpg[C * C + i] = __float2bfloat16_rn(v - __bfloat162float(hi));
  }
}

}  // namespace qrun::gdn::detail
