// The two sequential (per sequence, value head and 32-wide V slice) passes of the chunked gated
// delta rule, on bf16 tensor cores (mma.m16n8k16 + ldmatrix, "bf16x2" split of fp32 operands, see
// gdn_mma16.cuh):
//   state_body  forward over chunks: Delta = T (diag(beta) V - diag(beta e^gam) K S), O, S
//               update; optionally stores S at each chunk start and Delta (for the backward)
//   dh_body     reverse over chunks: dS_C of each chunk (dhs), dDelta (dDl), d initial state
// (the stored S, Delta, dS_C and dDelta are the hi/lo planes as bwd_chunk multiplies them, copied
// out of shared memory: copy_planes_out)
// Kernels: gdn_state_kernel (the forward; also the fast forward's fallback) and gdn_state_dh_kernel
// (the backward's h recompute and reverse pass in one launch). The fast forward's fp16 state
// kernel, with the state in registers as MMA operands, is in gdn_seq_t.cu.
// The recurrent state (S or dS) lives in fp32 registers for the whole sequence; each chunk step
// writes its bf16 hi/lo planes to shared memory as the next step's MMA operand. q, k, v and dO are
// raw bf16 in shared memory (exact operands; l2norm scales and gates are applied outside the
// products). T and P arrive pre-split (hi/lo planes) from gdn_prep_kernel.
#include "gdn_common.cuh"
#include "gdn_kernels.cuh"
#include "gdn_mma16.cuh"

namespace qrun::gdn::detail {
GDN_PH_DECL
GDN_PH_HOST(gdn_debug_phases_seq)

namespace {

constexpr int kSeqThreads = 256;   // 8 warps; 2 blocks per SM
constexpr int LDS = BV + 8;        // row stride (bf16) of the [rows][BV] planes (conflict-free ldmatrix)
constexpr int KQ_EL = C * DK;      // one swizzled [64][128] bf16 tile
constexpr int TP_EL = C * C;       // one swizzled [64][64] bf16 plane
constexpr int SP_EL = DK * LDS;    // one [128][LDS] plane
constexpr int CP_EL = C * LDS;     // one [64][LDS] plane

struct SeqSmem {
  __nv_bfloat16 *Kb, *Qb, *Tp, *Pp, *Xb, *Sp, *Yp, *Dp;
  float *gam, *bet, *rsK, *rsQ;  // [2][64] each (double-buffered by chunk parity)
  float* dec;                     // [64]
};

__device__ __forceinline__ SeqSmem seq_smem(void* base) {
  SeqSmem s;
  __nv_bfloat16* b = static_cast<__nv_bfloat16*>(base);
  s.Kb = b;                 // [64][128] swizzled, raw k
  s.Tp = s.Kb + KQ_EL;      // [2][64][64] swizzled
  s.Pp = s.Tp + 2 * TP_EL;  // [2][64][64] swizzled
  s.Xb = s.Pp + 2 * TP_EL;  // [64][LDS] raw v (fwd) or dO (bwd) slice
  s.Sp = s.Xb + CP_EL;      // [2][128][LDS] state planes
  s.Yp = s.Sp + 2 * SP_EL;  // [2][64][LDS]
  s.Dp = s.Yp + 2 * CP_EL;  // [2][64][LDS]
  float* f = reinterpret_cast<float*>(s.Dp + 2 * CP_EL);
  s.gam = f;
  s.bet = f + 2 * C;
  s.rsK = f + 4 * C;
  s.rsQ = f + 6 * C;
  s.dec = f + 8 * C;
  // raw q, last: the h recompute (state_body without o) never touches it and is launched without
  // it (seq_smem_bytes_noq), which leaves room for the reverse pass's double-buffered q tile beside
  // it on the SM
  s.Qb = reinterpret_cast<__nv_bfloat16*>(f + 9 * C);
  return s;
}

}  // namespace

// bytes of dynamic shared memory of the sequential kernels (seq_smem)
size_t seq_smem_bytes() {
  return (2 * KQ_EL + 4 * TP_EL + CP_EL + 2 * SP_EL + 4 * CP_EL) * 2 + 9 * C * sizeof(float);
}
static_assert(9 * C * sizeof(float) % 128 == 0, "the q tile after the row vectors stays 128-byte aligned");
// (state_body without o: the layout up to the q tile)
size_t seq_smem_bytes_noq() { return seq_smem_bytes() - (size_t)KQ_EL * 2; }

// Piecewise chunk loads (cp.async where alignment allows, zero-filled rows >= L), so that each
// shared buffer is refilled for the next chunk as soon as its last reader is done. Completion:
// cp_async_wait<N>() + __syncthreads() by the caller; the scalar fallbacks are plain stores made
// visible by the same barrier.

// T or P planes of chunk g (workspace, always 16-byte aligned): 2 x [64][64] = 1024 x 16 B
__device__ __forceinline__ void ld_planes(__nv_bfloat16* dst, const __nv_bfloat16* src_all,
                                          const KParams& p, int hv, const ChunkGeo& g) {
  const __nv_bfloat16* src = src_all + (g.c * p.HV + hv) * (int64_t)(2 * C * C);
#pragma unroll
  for (int i = 0; i < 2 * TP_EL / 8 / kSeqThreads; ++i) {
    const int v = threadIdx.x + i * kSeqThreads, pl = v >> 9, r = (v >> 3) & 63, c8 = v & 7;
    cp_async16(dst + pl * TP_EL + swz<C>(r, c8 * 8), src + v * 8, 16);
  }
}
// raw [64][128] q or k tile of key head h (swizzled)
__device__ __forceinline__ void ld_qk(__nv_bfloat16* dst, const void* src_all, int64_t st,
                                      int64_t sh, int vec, int h, const ChunkGeo& g) {
  const __nv_bfloat16* base = bf16_at(src_all, g.t0 * st + (int64_t)h * sh);
  if (vec) {
#pragma unroll
    for (int i = 0; i < KQ_EL / 8 / kSeqThreads; ++i) {
      const int v = threadIdx.x + i * kSeqThreads, r = v >> 4, c8 = v & 15;
      const int rr = r < g.L ? r : 0;
      cp_async16(dst + swz<DK>(r, c8 * 8), base + rr * st + c8 * 8, r < g.L ? 16 : 0);
    }
  } else {
    const __nv_bfloat16 z = __float2bfloat16_rn(0.f);
    for (int i = threadIdx.x; i < C * DK; i += kSeqThreads) {
      const int r = i / DK, cc = i % DK;
      dst[swz_el<DK>(r, cc)] = r < g.L ? base[r * st + cc] : z;
    }
  }
}
// raw [64][BV] slice of v or dO
__device__ __forceinline__ void ld_x(__nv_bfloat16* dst, const void* src_all, int64_t st, int64_t sh,
                                     int vec, int hv, int v0, const ChunkGeo& g) {
  const __nv_bfloat16* base = bf16_at(src_all, g.t0 * st + (int64_t)hv * sh + v0);
  if (vec) {
    constexpr int NXV = C * BV / 8;
    for (int v = threadIdx.x; v < NXV; v += kSeqThreads) {
      const int r = v / (BV / 8), c8 = v % (BV / 8);
      const int rr = r < g.L ? r : 0;
      cp_async16(dst + r * LDS + c8 * 8, base + rr * st + c8 * 8, r < g.L ? 16 : 0);
    }
  } else {
    const __nv_bfloat16 z = __float2bfloat16_rn(0.f);
    for (int i = threadIdx.x; i < C * BV; i += kSeqThreads) {
      const int r = i / BV, cc = i % BV;
      dst[r * LDS + cc] = r < g.L ? base[r * st + cc] : z;
    }
  }
}
// gamma (rows >= L repeat row L-1), beta (0 beyond L), l2norm scales (0 beyond L) into buffer b
__device__ __forceinline__ void ld_vecs(const SeqSmem& s, int b, const KParams& p, int h, int hv,
                                        const ChunkGeo& g) {
  const int r = threadIdx.x;
  if (r < C) {
    const bool ok = r < g.L;
    const int64_t t = g.t0 + (ok ? r : g.L - 1);
    cp_async4(s.gam + b * C + r, p.gam + t * p.HV + hv, 4);
    cp_async4(s.bet + b * C + r, p.bet + t * p.HV + hv, ok ? 4 : 0);
    if (p.l2norm) {
      cp_async4(s.rsK + b * C + r, p.rk + t * p.H + h, ok ? 4 : 0);
      cp_async4(s.rsQ + b * C + r, p.rq + t * p.H + h, ok ? 4 : 0);
    } else {
      s.rsK[b * C + r] = ok ? 1.f : 0.f;
      s.rsQ[b * C + r] = ok ? 1.f : 0.f;
    }
  }
}


// Writes the split planes of a warp's m16 x (8*NT) fp32 accumulator tile at (r0, c0) of a
// [rows][LDS] plane pair (hi at P, lo at P + plane). f(row, col, value) -> value to store.
template <int NT, class F>
__device__ __forceinline__ void store_planes(__nv_bfloat16* P, int plane, const float (&acc)[NT][4],
                                             int r0, int c0, F f) {
  for_pairs<NT>(r0, c0, [&](int r, int cc, int n, int hh) {
    uint32_t hi, lo;
    split2(f(r, cc, acc[n][2 * hh]), f(r, cc + 1, acc[n][2 * hh + 1]), hi, lo);
    *reinterpret_cast<uint32_t*>(P + r * LDS + cc) = hi;
    *reinterpret_cast<uint32_t*>(P + plane + r * LDS + cc) = lo;
  });
}

// Copies the hi/lo plane pair of a [ROWS][LDS] shared operand (the 32-wide V slice the block
// works on) to the backward's [2][ROWS][BV] workspace layout (slice_planes) with 16-byte stores:
// the block's own planes are exactly what bwd_chunk multiplies, and whole-sector stores from
// shared memory cost far less than per-lane fragment stores. Between barriers that keep P intact.
template <int ROWS, int LDS>
__device__ __forceinline__ void copy_planes_out(__nv_bfloat16* dst, const __nv_bfloat16* P, int plane) {
  static_assert(BV == 32 && (2 * ROWS * BV / 8) % kSeqThreads == 0, "4 pieces of 16 bytes per row");
#pragma unroll
  for (int i = 0; i < 2 * ROWS * BV / 8 / kSeqThreads; ++i) {
    const int v = threadIdx.x + i * kSeqThreads, pl = v / (4 * ROWS), r = (v >> 2) % ROWS, c8 = (v & 3) * 8;
    *reinterpret_cast<uint4*>(dst + v * 8) = *reinterpret_cast<const uint4*>(P + pl * plane + r * LDS + c8);
  }
}

// acc[NT] (n8 tiles at n0, n0+8, ...) += A(16x16 tiles over KD) * B, A from a raw swizzled bf16
// [rows][LDA] matrix (row-major [m][k]: TRANS_A = false; stored [k][m]: TRANS_A = true), B from
// the hi/lo planes of a [k][LDS] matrix.
template <int KD, int LDA, bool TRANS_A, int NT>
__device__ __forceinline__ void mma_raw_split(float (&acc)[NT][4], const __nv_bfloat16* A, int m0,
                                              const __nv_bfloat16* B, int plane, int n0) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int k0 = 0; k0 < KD; k0 += 16) {
    uint32_t a[4];
    if constexpr (TRANS_A)
      ldsm_x4_t(a, A + at_off_sw<LDA>(m0, k0, lane));
    else
      ldsm_x4(a, A + a_off_sw<LDA>(m0, k0, lane));
#pragma unroll
    for (int nh = 0; nh < NT / 2; ++nh) {
      uint32_t bh[4], bl[4];
      ldsm_x4_t(bh, B + b_off(LDS, k0, n0 + 16 * nh, lane));
      ldsm_x4_t(bl, B + plane + b_off(LDS, k0, n0 + 16 * nh, lane));
      mma_bf16(acc[2 * nh], a, bh[0], bh[1]);
      mma_bf16(acc[2 * nh + 1], a, bh[2], bh[3]);
      mma_bf16(acc[2 * nh], a, bl[0], bl[1]);
      mma_bf16(acc[2 * nh + 1], a, bl[2], bl[3]);
    }
  }
}

// acc[2] += A * B over K = 64, A = hi/lo planes of a swizzled [64][64] matrix (TRANS_A: A = M^T),
// B = hi/lo planes of a [64][LDS] matrix (split x split: 3 MMAs per tile).
template <bool TRANS_A>
__device__ __forceinline__ void mma_split_split(float (&acc)[2][4], const __nv_bfloat16* A, int m0,
                                                const __nv_bfloat16* B, int n0) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int k0 = 0; k0 < C; k0 += 16) {
    uint32_t ah[4], al[4], bh[4], bl[4];
    const int ao = TRANS_A ? at_off_sw<C>(m0, k0, lane) : a_off_sw<C>(m0, k0, lane);
    if constexpr (TRANS_A) {
      ldsm_x4_t(ah, A + ao);
      ldsm_x4_t(al, A + TP_EL + ao);
    } else {
      ldsm_x4(ah, A + ao);
      ldsm_x4(al, A + TP_EL + ao);
    }
    ldsm_x4_t(bh, B + b_off(LDS, k0, n0, lane));
    ldsm_x4_t(bl, B + CP_EL + b_off(LDS, k0, n0, lane));
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      mma_bf16(acc[n], al, bh[2 * n], bh[2 * n + 1]);
      mma_bf16(acc[n], ah, bl[2 * n], bl[2 * n + 1]);
      mma_bf16(acc[n], ah, bh[2 * n], bh[2 * n + 1]);
    }
  }
}

// acc[2] += A * B over K = 64, A = hi/lo planes of a swizzled [64][64] matrix used transposed,
// B = a raw bf16 [64][LDS] matrix (2 MMAs per tile).
__device__ __forceinline__ void mma_splitT_raw(float (&acc)[2][4], const __nv_bfloat16* A, int m0,
                                               const __nv_bfloat16* B, int n0) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int k0 = 0; k0 < C; k0 += 16) {
    uint32_t ah[4], al[4], b[4];
    const int ao = at_off_sw<C>(m0, k0, lane);
    ldsm_x4_t(ah, A + ao);
    ldsm_x4_t(al, A + TP_EL + ao);
    ldsm_x4_t(b, B + b_off(LDS, k0, n0, lane));
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      mma_bf16(acc[n], al, b[2 * n], b[2 * n + 1]);
      mma_bf16(acc[n], ah, b[2 * n], b[2 * n + 1]);
    }
  }
}

template <int NT>
__device__ __forceinline__ void zero4(float (&a)[NT][4]) {
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) a[n][e] = 0.f;
}

// Per-lane element (row, col) of accumulator element e of n8 tile n, tile origin (r0, c0).
#define GDN_FRAG_RC(r0, c0, n, e) \
  const int r = (r0) + gq + (((e) >> 1) << 3); const int j = (c0) + (n) * 8 + 2 * tq + ((e) & 1)

// The recurrent state (S or dS) of a block: this warp's 16 rows x the V slice, fp32 accumulator
// fragments. Loaded from a [N,HV,K,V] state tensor (zero when null) into registers and the MMA
// planes; stored back at the end (null: not wanted).
__device__ __forceinline__ void seq_state_load(float (&st)[BV / 8][4], const float* src, int64_t off, int srow,
                                               const SeqSmem& s) {
  const int lane = threadIdx.x & 31, gq = lane >> 2, tq = lane & 3;
#pragma unroll
  for (int nn = 0; nn < BV / 8; ++nn)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      GDN_FRAG_RC(srow, 0, nn, e);
      st[nn][e] = src ? src[off + (int64_t)r * DV + j] : 0.f;
    }
  const auto id = [](int, int, float x) { return x; };
  store_planes(s.Sp, SP_EL, st, srow, 0, id);
}
__device__ __forceinline__ void seq_state_store(float* dst, int64_t off, const float (&st)[BV / 8][4], int srow) {
  if (!dst) return;
  const int lane = threadIdx.x & 31, gq = lane >> 2, tq = lane & 3;
#pragma unroll
  for (int nn = 0; nn < BV / 8; ++nn)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      GDN_FRAG_RC(srow, 0, nn, 2 * hh);
      *reinterpret_cast<float2*>(dst + off + (int64_t)r * DV + j) = make_float2(st[nn][2 * hh], st[nn][2 * hh + 1]);
    }
}

// Sequential forward, one block of 8 warps per (sequence, value head, 32-wide V slice), 2 blocks
// per SM. Warp w: chunk tiles rows 16*(w&3), cols 16*(w>>2); state rows 16*w (all 32 columns).
// mode bits: 1 = write o (+ final state), 2 = write hs / Dl (for the backward).
// Per chunk: P1 X = K S, O1 = Q S -> Y = diag(beta)(V - diag(e^gam rsK) X)   [sync]
//            P2 Delta = T Y                                                   [sync]
//            P3 O = s (diag(e^gam rsQ) O1 + P Delta);  P4 S = e^{gam_L} S + K^T diag(dec) Delta
// Loads are pipelined: q, v, T and the row vectors of chunk c+1 are in flight while chunk c
// computes (each buffer is refilled right after the barrier that ends its last use); k and P are
// loaded at the top of the step (P is first needed in P3). cp.async groups, oldest first:
// [K_c] [P_c] [Q,X,vec_{c+1}] [T_{c+1}].
__device__ __forceinline__ void state_body(const KParams& p, int mode, int64_t bid, const SeqSmem& s) {
  constexpr int NTC = 2, NTS = 4;  // n8 tiles of a warp's 16 x 16 chunk tile / 16 x 32 state rows
  const SeqBlock sb = seq_block(p, bid, NVS);
  const int vs = sb.vs, hv = sb.hv, h = sb.h;
  const int64_t n = sb.n;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gq = lane >> 2, tq = lane & 3;
  const int wr = warp & 3, cw = 16 * (warp >> 2);  // chunk tile row block, first column
  const int v0 = vs * BV;
  const bool want_o = (mode & 1) && p.o;
  const bool want_h = (mode & 2) != 0;
  const int64_t KV = (int64_t)DK * DV;
  const int srow = 16 * warp;  // state rows of this warp
  GDN_PH_START

  float st[NTS][4];
  seq_state_load(st, p.h0, (n * p.HV + hv) * KV + v0, srow, s);

  const int64_t bos = p.cu[n], eos = p.cu[n + 1];
  const int64_t c_beg = p.coff[n], c_end = p.coff[n + 1];
  if (c_beg < c_end) {  // prologue: q, x, vectors, T of the first chunk
    const ChunkGeo g = chunk_geo(c_beg, c_beg, bos, eos);
    if (want_o) ld_qk(s.Qb, p.q, p.q_st, p.q_sh, p.vec_q, h, g);
    ld_x(s.Xb, p.v, p.v_st, p.v_sh, p.vec_v, hv, v0, g);
    ld_vecs(s, (int)(c_beg & 1), p, h, hv, g);
    cp_async_commit();
    ld_planes(s.Tp, p.Tp, p, hv, g);
    cp_async_commit();
  }
  for (int64_t c = c_beg; c < c_end; ++c) {
    const ChunkGeo g = chunk_geo(c, c_beg, bos, eos);
    const int64_t t0 = g.t0;
    const int L = g.L, b = (int)(c & 1);
    const float* gam = s.gam + b * C;
    const float* bet = s.bet + b * C;
    const float* rsK = s.rsK + b * C;
    const float* rsQ = s.rsQ + b * C;
    __syncthreads();  // previous chunk fully done with Kb, Pp, Sp
    GDN_PH(0);
    ld_qk(s.Kb, p.k, p.k_st, p.k_sh, p.vec_k, h, g);
    cp_async_commit();
    if (want_o) ld_planes(s.Pp, p.Pp, p, hv, g);
    cp_async_commit();
    // S at the chunk start (its planes, written by the last P4 or the load)
    if (want_h) copy_planes_out<DK, LDS>(p.hs + slice_planes(c, p.HV, hv, vs, DK), s.Sp, SP_EL);
    cp_async_wait<1>();  // all but P_c
    __syncthreads();
    GDN_PH(1);
    if (c + 1 < c_end) {  // L2 prefetch of what the next step loads first: its k tile and P planes
      const ChunkGeo g1 = chunk_geo(c + 1, c_beg, bos, eos);
      if (tid < 128) {
        const int r = tid >> 1;
        if (r < g1.L) prefetch_l2(bf16_at(p.k, (g1.t0 + r) * p.k_st + (int64_t)h * p.k_sh + (tid & 1) * 64));
      } else if (want_o) {  // threads 128..255, 64 elements each: both planes
        prefetch_l2(p.Pp + (g1.c * p.HV + hv) * (int64_t)(2 * C * C) + (tid - 128) * 64);
      }
    }
    const float gl = gam[L - 1];
    if (tid < C) s.dec[tid] = tid < L ? expf(gl - gam[tid]) * rsK[tid] : 0.f;  // decay x l2norm scale
    // P1
    float aO[NTC][4];
    {
      float aX[NTC][4];
      zero4(aX);
      zero4(aO);
#pragma unroll
      for (int k0 = 0; k0 < DK; k0 += 16) {
        uint32_t ak[4], aq[4], bh[4], bl[4];
        ldsm_x4(ak, s.Kb + a_off_sw<DK>(16 * wr, k0, lane));
        if (want_o) ldsm_x4(aq, s.Qb + a_off_sw<DK>(16 * wr, k0, lane));
        ldsm_x4_t(bh, s.Sp + b_off(LDS, k0, cw, lane));
        ldsm_x4_t(bl, s.Sp + SP_EL + b_off(LDS, k0, cw, lane));
#pragma unroll
        for (int nn = 0; nn < 2; ++nn) {
          mma_bf16(aX[nn], ak, bl[2 * nn], bl[2 * nn + 1]);
          mma_bf16(aX[nn], ak, bh[2 * nn], bh[2 * nn + 1]);
          if (want_o) {
            mma_bf16(aO[nn], aq, bl[2 * nn], bl[2 * nn + 1]);
            mma_bf16(aO[nn], aq, bh[2 * nn], bh[2 * nn + 1]);
          }
        }
      }
      // per-row factors of this lane's two rows (16wr + gq, +8); r & 8 selects
      const int r0 = 16 * wr + gq;
      const float f0 = expf(gam[r0]) * rsK[r0], f1 = expf(gam[r0 + 8]) * rsK[r0 + 8];
      const float b0 = bet[r0], b1 = bet[r0 + 8];  // (loaded once: the plane stores between
                                                   // the elements keep the compiler from reusing loads)
      const auto fy = [&](int r, int j, float x) {
        const float vv = __bfloat162float(s.Xb[r * LDS + j]);
        return r < L ? ((r & 8) ? b1 : b0) * (vv - ((r & 8) ? f1 : f0) * x) : 0.f;
      };
      store_planes(s.Yp, CP_EL, aX, 16 * wr, cw, fy);
    }
    __syncthreads();
    GDN_PH(2);
    // Qb, Xb and the other vector buffer are free: prefetch chunk c+1
    if (c + 1 < c_end) {
      const ChunkGeo g1 = chunk_geo(c + 1, c_beg, bos, eos);
      if (want_o) ld_qk(s.Qb, p.q, p.q_st, p.q_sh, p.vec_q, h, g1);
      ld_x(s.Xb, p.v, p.v_st, p.v_sh, p.vec_v, hv, v0, g1);
      ld_vecs(s, b ^ 1, p, h, hv, g1);
    }
    cp_async_commit();
    {  // P2: Delta = T Y
      float aD[NTC][4];
      zero4(aD);
      mma_split_split<false>(aD, s.Tp, 16 * wr, s.Yp, cw);
      __syncthreads();  // Y planes are reused for Delta' = diag(dec) Delta; Tp is free
      GDN_PH(3);
      if (c + 1 < c_end) ld_planes(s.Tp, p.Tp, p, hv, chunk_geo(c + 1, c_beg, bos, eos));
      cp_async_commit();
      const auto mask = [&](int r, int, float x) { return r < L ? x : 0.f; };
      const float d0 = s.dec[16 * wr + gq], d1 = s.dec[16 * wr + gq + 8];  // (this lane's two rows)
      const auto fdec = [&](int r, int, float x) { return r < L ? ((r & 8) ? d1 : d0) * x : 0.f; };
      store_planes(s.Dp, CP_EL, aD, 16 * wr, cw, mask);
      store_planes(s.Yp, CP_EL, aD, 16 * wr, cw, fdec);
    }
    cp_async_wait<2>();  // P_c landed (the two prefetch groups may still be in flight)
    __syncthreads();
    GDN_PH(4);
    // Delta (rows >= L zero) for the backward: the next writer of Dp is P2 of c+1
    if (want_h) copy_planes_out<C, LDS>(p.Dl + slice_planes(c, p.HV, hv, vs, C), s.Dp, CP_EL);
    if (want_o) {  // P3: O = s (e^gam rsQ O1 + P Delta)
      const int r0 = 16 * wr + gq;
      const float f0 = expf(gam[r0]) * rsQ[r0], f1 = expf(gam[r0 + 8]) * rsQ[r0 + 8];
#pragma unroll
      for (int nn = 0; nn < NTC; ++nn)
#pragma unroll
        for (int e = 0; e < 4; ++e) aO[nn][e] *= (e & 2) ? f1 : f0;
      mma_split_split<false>(aO, s.Pp, 16 * wr, s.Dp, cw);
      __nv_bfloat16* o = static_cast<__nv_bfloat16*>(p.o);
#pragma unroll
      for (int nn = 0; nn < NTC; ++nn)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          GDN_FRAG_RC(16 * wr, cw, nn, 2 * hh);
          if (r >= L) continue;
          const int64_t off = (t0 + r) * p.o_st + (int64_t)hv * p.o_sh + v0 + j;
          const float x0 = p.scale * aO[nn][2 * hh], x1 = p.scale * aO[nn][2 * hh + 1];
          if (p.pair_o) {
            *reinterpret_cast<__nv_bfloat162*>(o + off) = __floats2bfloat162_rn(x0, x1);
          } else {
            o[off] = __float2bfloat16_rn(x0);
            o[off + 1] = __float2bfloat16_rn(x1);
          }
        }
    }
    GDN_PH(5);
    {  // P4: S = e^{gam_L} S + K^T Delta'
      const float eg = expf(gl);
#pragma unroll
      for (int nn = 0; nn < NTS; ++nn)
#pragma unroll
        for (int e = 0; e < 4; ++e) st[nn][e] *= eg;
      mma_raw_split<C, DK, true, NTS>(st, s.Kb, srow, s.Yp, CP_EL, 0);
      // P1 of this chunk was the last reader of the old planes (two barriers ago)
      const auto id = [](int, int, float x) { return x; };
      store_planes(s.Sp, SP_EL, st, srow, 0, id);
      GDN_PH(6);
    }
  }
  cp_async_wait<0>();
  seq_state_store((mode & 1) ? p.ht : nullptr, (n * p.HV + hv) * KV + v0, st, srow);
}

// Reverse sequential pass, same block shape. dS = gradient w.r.t. the state leaving the chunk.
// Per chunk: 1. dDelta = diag(dec) K dS + s P^T dO (stored: dDl); dO' = s diag(e^gam rsQ) dO [sync]
//            2. Z = -diag(beta e^gam rsK) T^T dDelta                                        [sync]
//            3. dS <- e^{gam_L} dS + Q^T dO' + K^T Z
// Pipelined like state_body: P, dO, vectors and T of chunk c-1 are prefetched while chunk c
// computes; k and q are loaded at the top (q is first needed in step 3).
// cp.async groups, oldest first: [K_c] [Q_c] [P,X,vec_{c-1}] [T_{c-1}].
__device__ __forceinline__ void dh_body(const KParams& p, int64_t bid, const SeqSmem& s) {
  const SeqBlock sb = seq_block(p, bid, NVS);
  const int vs = sb.vs, hv = sb.hv, h = sb.h;
  const int64_t n = sb.n;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gq = lane >> 2, tq = lane & 3;
  const int wr = warp & 3, wc = warp >> 2;
  const int v0 = vs * BV;
  const int64_t KV = (int64_t)DK * DV;
  const int srow = 16 * warp;
  GDN_PH_START

  const auto id = [](int, int, float x) { return x; };
  float st[4][4];
  seq_state_load(st, p.dht, (n * p.HV + hv) * KV + v0, srow, s);

  const int64_t bos = p.cu[n], eos = p.cu[n + 1];
  const int64_t c_beg = p.coff[n], c_end = p.coff[n + 1];
  if (c_beg < c_end) {  // prologue: P, dO, vectors, T of the last chunk
    const ChunkGeo g = chunk_geo(c_end - 1, c_beg, bos, eos);
    ld_planes(s.Pp, p.Pp, p, hv, g);
    ld_x(s.Xb, p.dO, p.do_st, p.do_sh, p.vec_do, hv, v0, g);
    ld_vecs(s, (int)((c_end - 1) & 1), p, h, hv, g);
    cp_async_commit();
    ld_planes(s.Tp, p.Tp, p, hv, g);
    cp_async_commit();
  }
  for (int64_t c = c_end - 1; c >= c_beg; --c) {
    const ChunkGeo g = chunk_geo(c, c_beg, bos, eos);
    const int L = g.L, b = (int)(c & 1);
    const float* gam = s.gam + b * C;
    const float* bet = s.bet + b * C;
    const float* rsK = s.rsK + b * C;
    const float* rsQ = s.rsQ + b * C;
    __syncthreads();  // previous chunk fully done with Kb, Qb, Sp
    GDN_PH(8);
    ld_qk(s.Kb, p.k, p.k_st, p.k_sh, p.vec_k, h, g);
    cp_async_commit();
    ld_qk(s.Qb, p.q, p.q_st, p.q_sh, p.vec_q, h, g);
    cp_async_commit();
    // dS leaving the chunk (its planes, written by the last step 3 or the load)
    copy_planes_out<DK, LDS>(p.dhs + slice_planes(c, p.HV, hv, vs, DK), s.Sp, SP_EL);
    cp_async_wait<1>();  // all but Q_c
    __syncthreads();
    GDN_PH(9);
    if (c - 1 >= c_beg) {  // L2 prefetch of the k and q tiles the next (earlier) chunk loads first
      const ChunkGeo g1 = chunk_geo(c - 1, c_beg, bos, eos);
      const int r = (tid & 127) >> 1;
      if (r < g1.L)
        prefetch_l2(tid < 128 ? bf16_at(p.k, (g1.t0 + r) * p.k_st + (int64_t)h * p.k_sh + (tid & 1) * 64)
                              : bf16_at(p.q, (g1.t0 + r) * p.q_st + (int64_t)h * p.q_sh + (tid & 1) * 64));
    }
    const float gl = gam[L - 1];
    if (tid < C) s.dec[tid] = tid < L ? expf(gl - gam[tid]) * rsK[tid] : 0.f;
    __syncthreads();
    GDN_PH(10);
    {  // 1. dDelta
      float a1[2][4], a2[2][4];
      zero4(a1);
      zero4(a2);
      mma_raw_split<DK, DK, false, 2>(a1, s.Kb, 16 * wr, s.Sp, SP_EL, 16 * wc);
      mma_splitT_raw(a2, s.Pp, 16 * wr, s.Xb, 16 * wc);
      const float d0 = s.dec[16 * wr + gq], d1 = s.dec[16 * wr + gq + 8];  // (this lane's two rows)
#pragma unroll
      for (int nn = 0; nn < 2; ++nn)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          GDN_FRAG_RC(16 * wr, 16 * wc, nn, e);
          (void)j;
          a1[nn][e] = r < L ? ((e & 2) ? d1 : d0) * a1[nn][e] + p.scale * a2[nn][e] : 0.f;
        }
      store_planes(s.Dp, CP_EL, a1, 16 * wr, 16 * wc, id);
      // dO' = s e^gam rsQ dO (this warp's own elements of the raw dO slice)
      const int r0 = 16 * wr + gq;
      const float f0 = p.scale * expf(gam[r0]) * rsQ[r0], f1 = p.scale * expf(gam[r0 + 8]) * rsQ[r0 + 8];
      store_planes(s.Yp, CP_EL, a2, 16 * wr, 16 * wc, [&](int r, int j, float) {
        return r < L ? ((r & 8) ? f1 : f0) * __bfloat162float(s.Xb[r * LDS + j]) : 0.f;
      });
    }
    __syncthreads();
    GDN_PH(11);
    // dDelta for bwd_chunk (step 2 below reads the planes too; Z overwrites them after its barrier)
    copy_planes_out<C, LDS>(p.dDl + slice_planes(c, p.HV, hv, vs, C), s.Dp, CP_EL);
    // Pp, Xb and the other vector buffer are free: prefetch chunk c-1
    if (c - 1 >= c_beg) {
      const ChunkGeo g1 = chunk_geo(c - 1, c_beg, bos, eos);
      ld_planes(s.Pp, p.Pp, p, hv, g1);
      ld_x(s.Xb, p.dO, p.do_st, p.do_sh, p.vec_do, hv, v0, g1);
      ld_vecs(s, b ^ 1, p, h, hv, g1);
    }
    cp_async_commit();
    {  // 2. Z = -diag(beta e^gam rsK) T^T dDelta
      float az[2][4];
      zero4(az);
      mma_split_split<true>(az, s.Tp, 16 * wr, s.Dp, 16 * wc);
      __syncthreads();  // dDelta planes are reused for Z; Tp is free
      GDN_PH(12);
      if (c - 1 >= c_beg) ld_planes(s.Tp, p.Tp, p, hv, chunk_geo(c - 1, c_beg, bos, eos));
      cp_async_commit();
      const int r0 = 16 * wr + gq;
      const float f0 = -bet[r0] * expf(gam[r0]) * rsK[r0], f1 = -bet[r0 + 8] * expf(gam[r0 + 8]) * rsK[r0 + 8];
      store_planes(s.Dp, CP_EL, az, 16 * wr, 16 * wc, [&](int r, int, float x) {
        return r < L ? ((r & 8) ? f1 : f0) * x : 0.f;
      });
    }
    cp_async_wait<2>();  // Q_c landed
    __syncthreads();
    GDN_PH(13);
    {  // 3. dS = e^gl dS + Q^T dO' + K^T Z
      const float eg = expf(gl);
#pragma unroll
      for (int nn = 0; nn < 4; ++nn)
#pragma unroll
        for (int e = 0; e < 4; ++e) st[nn][e] *= eg;
      mma_raw_split<C, DK, true, 4>(st, s.Qb, srow, s.Yp, CP_EL, 0);
      mma_raw_split<C, DK, true, 4>(st, s.Kb, srow, s.Dp, CP_EL, 0);
      store_planes(s.Sp, SP_EL, st, srow, 0, id);
      GDN_PH(14);
    }
  }
  cp_async_wait<0>();
  seq_state_store(p.dh0, (n * p.HV + hv) * KV + v0, st, srow);
}

// As the fast backward's recompute it is the programmatic dependent of the reverse pass
// (gdn_dh16t_kernel) and waits for it before exiting; launched normally, the wait returns at once.
__global__ void __launch_bounds__(kSeqThreads, 2) gdn_state_kernel(KParams p, int mode) {
  if (p.run_if && !p.run_if[blockIdx.x / NVS]) return;  // fallback launch: only flagged (n, hv)s
  extern __shared__ __align__(128) unsigned char smraw[];
  state_body(p, mode, blockIdx.x, seq_smem(smraw));
  asm volatile("griddepcontrol.wait;" ::: "memory");
}

// Backward: the h recompute (state_body, mode 2) and the dh pass are independent, so they share
// one launch: blocks [0, nstate) recompute h, the rest run the reverse pass. Each alone fills only
// part of the machine (N*HV*4 blocks, two per SM).
__global__ void __launch_bounds__(kSeqThreads, 2) gdn_state_dh_kernel(KParams p, int64_t nstate) {
  extern __shared__ __align__(128) unsigned char smraw[];
  const int64_t bid = blockIdx.x;
  // fallback launch (after the fast backward): only flagged (n, hv)s
  if (p.run_if && !p.run_if[(bid < nstate ? bid : bid - nstate) / NVS]) return;
  if (bid < nstate)
    state_body(p, 2, bid, seq_smem(smraw));
  else
    dh_body(p, bid - nstate, seq_smem(smraw));
}

}  // namespace qrun::gdn::detail
