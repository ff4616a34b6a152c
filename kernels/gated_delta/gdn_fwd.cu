// Forward-direction kernels of the chunked gated delta rule:
//   gdn_prep_kernel         per (chunk, key head) and each value head of its group: gate + chunk
//                           cumsum, beta, A, T = (I+A)^-1, P = (Q K^T) .* Gamma (lower incl. diagonal)
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

constexpr int kPrepThreads = 256;
// three blocks per SM: 80 registers (the group's raw products stay in registers across its value
// heads). Two (127 registers) measured 0.03 ms slower, four (64, with spills) no faster.
constexpr int kPrepMinBlocks = 3;

// raw bf16 q/k (exact operands) instead of fp32 copies, and T's fp32 tile in the k tile's place
// (k is dead once the products are formed): 56 KB per block
static_assert(C * LDKB * 2 == C * LDC * sizeof(float), "the fp32 T tile exactly replaces the raw k tile");
size_t prep_smem_bytes() { return (size_t)2 * C * LDKB * 2 + (C * LDC + 3 * 256 + 4 * C) * sizeof(float); }

// One distance step of the blocked inverse (see prep_group): T_{j+D, j} for j < 4 - D, two
// warps per block (8 columns each, so 6, 4 and 2 of the 8 warps work in the three steps). X (the
// per-warp 16x8 scratch, 6 x 128 floats) holds the intermediate sum.
template <int D>
__device__ __forceinline__ void inv_merge(const float* As, float* Ts, float* X, int warp) {
  if (warp < 2 * (4 - D)) {
    const int j = warp >> 1, i = j + D, c0 = 16 * j + 8 * (warp & 1);
    float acc[1][4];
    zero_acc(acc);
    warp_mma<1, 16 * D>(acc, [&](int m, int k) { return As[(16 * i + m) * LDC + 16 * j + k]; },
                        [&](int k, int n) { return Ts[(16 * j + k) * LDC + c0 + n]; });
    float* Xw = X + 128 * warp;
    for_frag(acc, [&](int r, int c, float& x) { Xw[r * 8 + c] = x; });
    __syncwarp();
    zero_acc(acc);
    warp_mma<1, 16>(acc, [&](int m, int k) { return Ts[(16 * i + m) * LDC + 16 * i + k]; },
                    [&](int k, int n) { return Xw[k * 8 + n]; });
    for_frag(acc, [&](int r, int c, float& x) { Ts[(16 * i + r) * LDC + c0 + c] = -x; });
  }
  __syncthreads();
}

// Prep of one (chunk c, key head h) group: the raw products K K^T and Q K^T (and the q/k loads
// behind them) do not depend on the value head, so they are formed once, kept in registers, and
// gated for each of the group's G value heads in turn (one block per (chunk, value head) would
// form them G times). With p.run_if set (the fallback), only the flagged (sequence, value head)s
// are redone.
//
// Modes: kPrepHL (the bf16x2 paths) writes T and P as hi/lo bf16 planes (p.Tp, p.Pp).
// kPrepF16 (the fast forward, gdn_mma16.cuh) writes T and P as one fp16 plane each (p.T16, p.P16),
// plus fp16 copies of the chunk's raw q/k rows (exact: a bf16 value converts exactly to fp16
// inside the checked range, up to 2^-25 below 2^-17) and the row factors for the register-state
// kernels. The q/k tiles are range-checked; T (unit diagonal) and P only for overflow: a P whose
// entries are all tiny comes from q.k cancelling, next to which 2^-25 is nothing.
// kPrepB16 (the fast backward) writes everything kPrepF16 does plus T's hi/lo planes (p.Tp), which
// bwd_chunk multiplies.
enum { kPrepHL = 0, kPrepF16 = 1, kPrepB16 = 2 };
template <int MODE>
__device__ __forceinline__ void prep_group(const KParams& p, float* sm, int64_t c, int h) {
  constexpr bool F16 = MODE != kPrepHL;  // fp16 T, P, q/k copies and row factors
  constexpr bool HLT = MODE != kPrepF16;  // T's hi/lo planes
  __nv_bfloat16* Kb = reinterpret_cast<__nv_bfloat16*>(sm);  // [C][LDKB] raw
  __nv_bfloat16* Qb = Kb + C * LDKB;
  __nv_bfloat16* Ps = Qb;  // once the products are in registers: P hi/lo planes, swizzled [2][64][64]
  float* As = reinterpret_cast<float*>(Qb + C * LDKB);
  float* Ts = reinterpret_cast<float*>(Kb);  // likewise in the k tile's place (needs no zeroing: the
                                             // inverse writes every block on and below the
                                             // diagonal, the plane store writes those above as 0)
  float* scr = As + C * LDC;  // 768: the inverse's scratch
  float* rsK = scr + 3 * 256;
  float* rsQ = rsK + C;
  float* gam = rsQ + C;
  float* bet = gam + C;

  int n, L;
  int64_t t0;
  chunk_info(p, c, n, t0, L);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gq = lane >> 2, tq = lane & 3;
  const int wr = warp & 3, wc = warp >> 2;
  __shared__ unsigned amax[3];  // F16: largest |x| of the fp16 T, P and q/k copies
  if (F16 && tid == 0) amax[2] = 0;

  // raw q/k (exact bf16 operands of KK^T and QK^T); l2norm scales formed here from the tiles
  // (qk_row_scales) and applied after the products
  load_qk_tiles<kPrepThreads, QkRows, false>(p, Kb, Qb, rsK, rsQ, t0, h, L);
  cp_async_wait_all();
  __syncthreads();
  float kk[4][4], qk[4][4];  // this warp's 16 x 32 tiles of K K^T and Q K^T
  zero_acc(kk);
  zero_acc(qk);
  mma_raw_rows<4, DK, LDKB>(kk, Kb, 16 * wr, Kb, 32 * wc);
  mma_raw_rows<4, DK, LDKB>(qk, Qb, 16 * wr, Kb, 32 * wc);
  if (!F16 || !p.l2norm) qk_row_scales<kPrepThreads>(p, Kb, Qb, rsK, rsQ, t0, h, L);  // (read after the barrier below)
  if (F16) {  // fp16 q/k rows of key head h (rows >= L are never read), and with the norm the row
              // scales from the same reads (row_scale_piece; rows >= L of the tiles are zero)
    static_assert(kQkPieces % kPrepThreads == 0, "uniform rounds: row_scale_piece shuffles");
    AbsMax m;
    for (int v = tid; v < kQkPieces; v += kPrepThreads) {
      int isq, r, c8;
      const uint4 u = *reinterpret_cast<const uint4*>(qk_piece(Kb, Qb, v, isq, r, c8));
      if (p.l2norm) row_scale_piece(p, u, isq, r, rsK, rsQ, t0, h, L);
      if (r >= L) continue;
      const __nv_bfloat16* src = reinterpret_cast<const __nv_bfloat16*>(&u);
      uint32_t out[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {  // raw values: exact in fp16 when the range check passes
        const float x0 = __bfloat162float(src[2 * j]), x1 = __bfloat162float(src[2 * j + 1]);
        m.add(x0);
        m.add(x1);
        out[j] = pack_h2(x0, x1);
      }
      __half* dst = static_cast<__half*>(isq ? p.qh : p.kh) + ((t0 + r) * p.H + h) * DK + c8;
      *reinterpret_cast<uint4*>(dst) = make_uint4(out[0], out[1], out[2], out[3]);
    }
    const float wm = m.warp_max();
    if (lane == 0) atomicMax(&amax[2], __float_as_uint(wm));
  }
  __syncthreads();  // the q/k tiles are dead (Ts and Ps take their place); amax[2] is final
  if (F16 && tid == 0 && !f16_range_ok(__uint_as_float(amax[2]))) {  // the copies serve the whole group
    for (int j = 0; j < p.G; ++j) p.f16_bad[(int64_t)n * p.HV + h * p.G + j] = 1;
    p.f16_bad[p.N * p.HV] = 1;
  }

  constexpr int NPL = F16 ? 1 : 2;  // planes of P
  for (int hv = h * p.G; hv < (h + 1) * p.G; ++hv) {
    if (p.run_if && !p.run_if[(int64_t)n * p.HV + hv]) continue;  // (uniform over the block)
    __syncthreads();  // the previous head is done with gam, bet, As, Ts, Ps and amax[0..1]
    if (F16 && tid < 2) amax[tid] = 0;
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
    __syncthreads();
    if (warp == 0) {  // chunk cumsum: lane owns rows 2*lane, 2*lane+1; fixed-order warp scan
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
      if constexpr (F16) {  // the row factors of the register-state kernel (gdn_seq_t.cu)
        const float eg = expf(gam[tid]);
        p.fx[i] = bet[tid] * eg * rsK[tid];
        p.fq[i] = eg * rsQ[tid];
        p.dec[i] = expf(gam[L - 1] - gam[tid]) * rsK[tid];
      }
    }
    {  // A = strictly-lower beta_r (k_r.k_j) Gamma_rj and P = lower-incl-diag (q_r.k_j) Gamma_rj:
       // one exponential per element serves both; the row and column factors are loaded once per
       // lane (its fragments span two rows and eight columns)
      float gr[2], fa[2], fp[2];
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int r = 16 * wr + gq + 8 * hh;
        gr[hh] = gam[r];
        fa[hh] = bet[r] * rsK[r];
        fp[hh] = rsQ[r];
      }
      AbsMax m;
#pragma unroll
      for (int nn = 0; nn < 4; ++nn) {
        const int j = 32 * wc + nn * 8 + 2 * tq;
        const float2 kc = *reinterpret_cast<const float2*>(rsK + j), gc = *reinterpret_cast<const float2*>(gam + j);
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int r = 16 * wr + gq + 8 * hh;
          float a[2], v[2];
#pragma unroll
          for (int u = 0; u < 2; ++u) {
            // exp(gam_r - gam_j) is formed for every element and selected away where r < j (there
            // it may overflow): never multiplied by a mask
            const float e = expf(gr[hh] - (u ? gc.y : gc.x)), kj = u ? kc.y : kc.x;
            a[u] = (r > j + u && r < L) ? fa[hh] * kj * kk[nn][2 * hh + u] * e : 0.f;
            v[u] = (r >= j + u && r < L) ? fp[hh] * kj * qk[nn][2 * hh + u] * e : 0.f;
          }
          *reinterpret_cast<float2*>(As + r * LDC + j) = make_float2(a[0], a[1]);
          if constexpr (F16) {
            m.add(v[0]);
            m.add(v[1]);
            *reinterpret_cast<uint32_t*>(Ps + swz_el<C>(r, j)) = pack_h2(v[0], v[1]);
          } else {
            uint32_t hi, lo;
            split2(v[0], v[1], hi, lo);
            *reinterpret_cast<uint32_t*>(Ps + swz_el<C>(r, j)) = hi;
            *reinterpret_cast<uint32_t*>(Ps + C * C + swz_el<C>(r, j)) = lo;
          }
        }
      }
      if constexpr (F16) {
        const float wm = m.warp_max();
        if (lane == 0) atomicMax(&amax[1], __float_as_uint(wm));
      }
    }
    __syncthreads();
    if (warp >= 2) {  // P planes to global as 16-byte rows (warps 0-1 start the inverse meanwhile)
      __nv_bfloat16* P = F16 ? p.P16 + (c * p.HV + hv) * p.tp16_st : p.Pp + (c * p.HV + hv) * (int64_t)(2 * C * C);
      for (int v = tid - 64; v < NPL * C * C / 8; v += kPrepThreads - 64) {
        const int pl = v >> 9, r = (v >> 3) & 63, c8 = (v & 7) * 8;
        *reinterpret_cast<uint4*>(P + v * 8) = *reinterpret_cast<const uint4*>(Ps + pl * C * C + swz<C>(r, c8));
      }
    }
    // T = (I + A)^-1: the four 16x16 diagonal blocks by forward substitution (one lane per column,
    // the column in registers), then the off-diagonal blocks by distance d = i - j:
    //   T_ij = -T_ii X,  X = sum_{k=j}^{i-1} A_ik T_kj   (two warps per block, 3xTF32 products)
    if (warp < 2) {
      const int b0 = 16 * (2 * warp + (lane >> 4)), cl = lane & 15;
      float t[16];
#pragma unroll
      for (int r = 0; r < 16; ++r) {
        const float* arow = As + (b0 + r) * LDC + b0;
        float x0 = (r == cl) ? 1.f : 0.f, x1 = 0.f;  // two chains (even / odd j)
#pragma unroll
        for (int j = 0; j < r; ++j) {
          if (j & 1) x1 -= arow[j] * t[j];
          else x0 -= arow[j] * t[j];
        }
        t[r] = x0 + x1;
      }
#pragma unroll
      for (int r = 0; r < 16; ++r) Ts[(b0 + r) * LDC + b0 + cl] = t[r];
    }
    __syncthreads();
    inv_merge<1>(As, Ts, scr, warp);
    inv_merge<2>(As, Ts, scr, warp);
    inv_merge<3>(As, Ts, scr, warp);
    __nv_bfloat16* Tpg = p.Tp + (c * p.HV + hv) * (int64_t)(2 * C * C);  // hi/lo planes
    __nv_bfloat16* T16g = F16 ? p.T16 + (c * p.HV + hv) * p.tp16_st : nullptr;  // the fp16 plane
    AbsMax m;
    for (int i = 8 * tid; i < C * C; i += 8 * kPrepThreads) {  // 8 elements: 16-byte stores per plane
      const float* src = Ts + (i >> 6) * LDC + (i & 63);
      const bool upper = ((i & 63) >> 4) > ((i >> 6) >> 4);  // a 16 x 16 block above the diagonal: zero
      const float4 z = make_float4(0.f, 0.f, 0.f, 0.f);
      const float4 a = upper ? z : *reinterpret_cast<const float4*>(src), b = upper ? z : *reinterpret_cast<const float4*>(src + 4);
      if constexpr (F16) {
        for (float x : {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w}) m.add(x);
        *reinterpret_cast<uint4*>(T16g + i) = make_uint4(pack_h2(a.x, a.y), pack_h2(a.z, a.w), pack_h2(b.x, b.y), pack_h2(b.z, b.w));
      }
      if constexpr (HLT) {
        uint4 hi, lo;
        split2(a.x, a.y, hi.x, lo.x);
        split2(a.z, a.w, hi.y, lo.y);
        split2(b.x, b.y, hi.z, lo.z);
        split2(b.z, b.w, hi.w, lo.w);
        *reinterpret_cast<uint4*>(Tpg + i) = hi;
        *reinterpret_cast<uint4*>(Tpg + C * C + i) = lo;
      }
    }
    if constexpr (F16) {
      const float wm = m.warp_max();
      if (lane == 0) atomicMax(&amax[0], __float_as_uint(wm));
      __syncthreads();
      if (tid == 0 && !(__uint_as_float(amax[0]) < 0x1p15f && __uint_as_float(amax[1]) < 0x1p15f)) {
        p.f16_bad[(int64_t)n * p.HV + hv] = 1;
        p.f16_bad[p.N * p.HV] = 1;
      }
    }
  }
}

// grid NT * H: block (c, h) = bid (c-major)
__global__ void __launch_bounds__(kPrepThreads, kPrepMinBlocks) gdn_prep_kernel(KParams p) {
  extern __shared__ __align__(16) float sm[];
  prep_group<kPrepHL>(p, sm, blockIdx.x / p.H, (int)(blockIdx.x % p.H));
}
// The fast forward's fallback prep, on a small grid (the full one cost 0.011 ms at 1x8192 even
// when nothing was flagged): nothing to do unless some pair was flagged (the flag one past the
// pairs); then the blocks walk the groups and redo only the flagged (sequence, value head)s.
__global__ void __launch_bounds__(kPrepThreads, kPrepMinBlocks) gdn_prep_fallback_kernel(KParams p) {
  extern __shared__ __align__(16) float sm[];
  if (!p.run_if[p.N * p.HV]) return;
  for (int64_t bid = blockIdx.x; bid < p.NT * p.H; bid += gridDim.x) {
    const int64_t c = bid / p.H;
    const int h = (int)(bid % p.H);
    const int* flag = p.run_if + (int64_t)p.ctab[2 * c] * p.HV + h * p.G;
    bool any = false;
    for (int j = 0; j < p.G; ++j) any |= flag[j] != 0;
    if (!any) continue;
    prep_group<kPrepHL>(p, sm, c, h);
    __syncthreads();  // the next group reuses the shared memory
  }
}
__global__ void __launch_bounds__(kPrepThreads, kPrepMinBlocks) gdn_prep16_kernel(KParams p) {
  extern __shared__ __align__(16) float sm[];
  prep_group<kPrepF16>(p, sm, blockIdx.x / p.H, (int)(blockIdx.x % p.H));
}
__global__ void __launch_bounds__(kPrepThreads, kPrepMinBlocks) gdn_prep16b_kernel(KParams p) {
  extern __shared__ __align__(16) float sm[];
  prep_group<kPrepB16>(p, sm, blockIdx.x / p.H, (int)(blockIdx.x % p.H));
}

}  // namespace qrun::gdn::detail
