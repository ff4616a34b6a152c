// The fast forward's sequential kernel with the recurrent state held in registers as MMA operands.
// One block per (sequence, value head, 64-wide V slice): 4 compute warps, where warp w owns the
// 16 value columns 16w..16w+15 of the slice and computes everything transposed, and 4 producer
// warps that copy the chunk operands in and the o tiles out:
//
//   X^T  = S^T K^T,  O1^T = S^T Q^T                      (16 x 64 each, k = 128)
//   Y^T  = (V^T - X^T diag(e^gam rsK)) diag(beta)        (elementwise; rows >= L selected to 0)
//   D^T  = Y^T T^T                                       (16 x 64, k = 64; T block lower triangular)
//   O^T  = O1^T diag(e^gam rsQ) + D^T P^T                (P block lower triangular)
//   S^T <- e^{gam_L} S^T + D^T diag(e^{gam_L - gam} rsK) K   (16 x 128, k = 64)
//
// Why transposed: the accumulator fragment of an m16n8 MMA, packed to fp16 pairs, is exactly the
// A fragment of the next m16n8k16 MMA over the same columns (the FlashAttention-2 register reuse).
// S^T, Y^T and D^T therefore never leave registers: no shared-memory operand planes, no barrier
// between the phases of a step, and every warp works on its own columns. The only shared data are
// the chunk's K, Q, T, P, v and row factors, double-buffered by cp.async, so a chunk step has one
// barrier. (A plane form of this kernel, its fp16 state stored as shared-memory operand planes,
// spent ~1,270 warp instructions per warp and step on 128 MMAs: plane stores, ldmatrix of its own
// state and five barriers; ncu.)
//
// On sm_90a the four compute warps are one warpgroup and every product is a wgmma with A
// from registers: the same fragments, as the m64 A operand of the warpgroup, and B read from
// shared memory once per block instead of by every warp's ldmatrix: measurably faster than the
// mma.sync form, and the producer warps gain more on top.
//
// Operands and numerics are those of that plane kernel: fp16 K/Q copies, T and P planes
// and fp16 roundings of S, Y, D and D' (gdn_mma16.cuh), fp32 accumulation and state, the same
// range check (F16 guard) reported through p.f16_bad. The row factors come from prep
// (p.fx, p.fq, p.dec), so the step evaluates no exponential but e^{gam_L}.
//
// The backward's reverse pass (gdn_dh16t_kernel, below) has the same shape, with the state
// gradient dS^T in registers and its fp16 operands scaled per product.
#include "gdn_common.cuh"
#include "gdn_kernels.cuh"
#include "gdn_mma16.cuh"
#include "gdn_wgmma.cuh"

// The products on wgmma (sm_90a): A = the warpgroup's registers (the forward's S^T, Y^T, D^T,
// D'^T; the reverse pass's and the recompute's likewise), B = the chunk's K, Q, T, P tiles read
// from shared memory once per block instead of once per warp by ldmatrix. Other architectures
// build the mma.sync form, over the same buffers (padded and aligned for the wgmma tiles on every
// architecture).
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define GDN_WGMMA 1
#else
#define GDN_WGMMA 0
#endif

namespace qrun::gdn::detail {
GDN_PH_DECL
GDN_PH_HOST(gdn_debug_phases_seqt)
namespace {

constexpr int kTW = 4;              // warps per block
constexpr int kTThreads = 32 * kTW;
constexpr int kTV = 16 * kTW;       // V columns per block
constexpr int kTNS = DV / kTV;      // blocks per (sequence, value head)
constexpr int kTLD = kTV + 8;       // row stride (elements) of the v and o tiles (conflict-free)
constexpr int kKQ = C * DK;         // a swizzled [64][128] fp16 tile
constexpr int kPL = C * C;          // a swizzled [64][64] fp16 plane
constexpr int kVT = C * kTLD;       // a [64][kTLD] bf16 tile
constexpr int kNVec = 4;            // row vectors: beta, fx, fq, dec ([64] floats each), then gam_L

// What a register-state block computes: the forward (o, final state) or the backward's reverse
// pass (dhs, dDl, dh0).
enum { kFwd = 0, kDh = 1 };

// One chunk's shared operands (a buffer; two of them alternate by chunk parity). Per kind:
// kFwd K, Q, T, P, v; kDh K, Q, T, P, dO (in V's place). K and Q are swizzled [64][128] tiles,
// except on wgmma: in the forward they share two [128][64] column blocks (K rows 0-63, Q rows
// 64-127; the 128-byte swizzle of gdn_wgmma.cuh), so that each block is one wgmma B operand; in
// the reverse pass each is two [64][64] column blocks (kCBd elements apart).
struct TBuf {
  __nv_bfloat16 *K, *Q, *T, *P, *V;  // K, Q, T, P: fp16 bits; V: raw bf16
  float *fb, *fx, *fq, *dec, *gl;
};
// (gam_L padded to 128 bytes; the buffer to 1024, the wgmma tiles' alignment)
constexpr size_t kTBufBytes =
    ((size_t)(2 * kKQ + 2 * kPL + kVT) * 2 + (kNVec * C + 32) * sizeof(float) + 1023) / 1024 * 1024;
constexpr int kCB = 2 * C * 64;   // the wgmma forward's K/Q column block: [128 rows][64] elements
constexpr int kCBd = C * 64;      // the wgmma reverse pass's K and q column block: [64 rows][64]
// The forward's operand buffers: chunk c + kFB - 1's copies are issued at the top of step c.
// (Three buffers measured slower than two with the wgmma kernel: forward 0.504 against 0.464 ms
// at 1x8192.)
constexpr int kFB = 2;
static_assert(kFB >= 2, "at least double-buffered");

template <int KIND>
__device__ __forceinline__ TBuf tbuf(unsigned char* base, int b) {
  TBuf t;
  __nv_bfloat16* e = reinterpret_cast<__nv_bfloat16*>(base + b * kTBufBytes);
  t.K = e;
  e += kKQ;
  t.Q = KIND == kFwd && GDN_WGMMA ? t.K + C * 64 : e;
  e += kKQ;
  t.T = e;
  e += kPL;
  t.P = e;
  e += kPL;
  t.V = e;
  float* f = reinterpret_cast<float*>(t.V + kVT);
  t.fb = f;
  t.fx = f + C;
  t.fq = f + 2 * C;
  t.dec = f + 3 * C;
  t.gl = f + 4 * C;
  return t;
}

// cp.async copies of the chunk's fp16 copies of k (or q) and, with BOTH, also q (key head h) into
// swizzled [64][128] tiles (CBS > 0: the rows of [rows][64] column blocks CBS elements apart, the
// wgmma layout, see TBuf), rows >= L zero-filled: 8 rows per pass, 16 pieces of 8 per row. The
// caller commits.
template <bool BOTH, int CBS = 0>
__device__ __forceinline__ void ld_h16(__nv_bfloat16* d0p, const void* s0, __nv_bfloat16* d1p, const void* s1,
                                       const KParams& p, int h, const ChunkGeo& g, int tid = threadIdx.x) {
  // (row offsets inside a chunk in 32 bits: 63 rows x H x 128 elements)
  const int r0 = tid >> 4, c8 = (tid & 15) * 8;
  const int d0 = CBS > 0 ? (c8 >> 6) * CBS + swz<64>(r0, c8 & 63) : swz<DK>(r0, c8);
  constexpr int kRow = CBS > 0 ? 64 : DK;  // elements between rows
  const int rst = p.H * DK;  // row stride of the fp16 q/k copies
  const int64_t off = (g.t0 * p.H + h) * (int64_t)DK + c8;
  const __half* src0 = static_cast<const __half*>(s0) + off;
  const __half* src1 = BOTH ? static_cast<const __half*>(s1) + off : nullptr;
#pragma unroll
  for (int i = 0; i < C / 8; ++i) {
    const int r = r0 + 8 * i;
    const bool ok = r < g.L;
    const int ro = ok ? r * rst : 0;
    cp_async16(d0p + d0 + 8 * i * kRow, src0 + ro, ok ? 16 : 0);
    if constexpr (BOTH) cp_async16(d1p + d0 + 8 * i * kRow, src1 + ro, ok ? 16 : 0);
  }
}

// The raw [64][64] slice (columns v0..) of v or dO into V (row stride kTLD; rows >= L zero; plain
// stores when its rows are not 16-byte aligned), and the row factors (0 beyond L): threads 0-63
// beta and fx, 64-127 fq (FQ) and dec; thread 0 gam_L. The caller commits.
template <bool FQ>
__device__ __forceinline__ void ld_slice_rows(__nv_bfloat16* V, float* fb, float* fx, float* fq, float* dec, float* gl,
                                              const KParams& p, const void* xs, int64_t x_st, int64_t x_sh, int vec,
                                              int hv, int v0, const ChunkGeo& g, int tid) {
  static_assert(kTV == 64, "v rows are 8 pieces of 8");
  const int r0 = tid >> 3, c8 = (tid & 7) * 8;  // 16 rows per pass, 8 pieces per row
  const __nv_bfloat16* vb = bf16_at(xs, g.t0 * x_st + (int64_t)hv * x_sh + v0);
  if (vec) {
#pragma unroll
    for (int i = 0; i < C / 16; ++i) {
      const int r = r0 + 16 * i;
      const bool ok = r < g.L;
      cp_async16(V + r * kTLD + c8, vb + (ok ? r * x_st : 0) + c8, ok ? 16 : 0);
    }
  } else {
    const __nv_bfloat16 z = __float2bfloat16_rn(0.f);
    for (int i = tid; i < C * kTV; i += kTThreads) {
      const int r = i / kTV, cc = i % kTV;
      V[r * kTLD + cc] = r < g.L ? vb[r * x_st + cc] : z;
    }
  }
  const int r = tid & (C - 1);
  const bool ok = r < g.L;
  const int64_t i = (g.t0 + (ok ? r : 0)) * p.HV + hv;
  if (tid < C) {
    cp_async4(fb + r, p.bet + i, ok ? 4 : 0);
    cp_async4(fx + r, p.fx + i, ok ? 4 : 0);
  } else {
    if constexpr (FQ) cp_async4(fq + r, p.fq + i, ok ? 4 : 0);
    cp_async4(dec + r, p.dec + i, ok ? 4 : 0);
  }
  if (tid == 0) cp_async4(gl, p.gam + (g.t0 + g.L - 1) * p.HV + hv, 4);
}

// Issues the cp.async copies of chunk g's operands into buffer b (rows >= L zero-filled; v / dO by
// plain stores when its rows are not 16-byte aligned). The caller commits. Thread tid copies the
// same columns of rows tid/16 + 8i (q/k) and tid/8 + 16i (T, P, v) in every chunk, so the
// swizzled destinations are fixed offsets plus multiples of a row block.
// (tid: the copying thread's index among kTThreads; the forward's producer warpgroup passes its own)
template <int KIND>
__device__ __forceinline__ void t_load(const TBuf& b, const KParams& p, int h, int hv, int v0, const ChunkGeo& g,
                                       int tid = threadIdx.x) {
  constexpr int kCBS = GDN_WGMMA ? (KIND == kFwd ? kCB : kCBd) : 0;
  ld_h16<true, kCBS>(b.K, p.kh, b.Q, p.qh, p, h, g, tid);
  const int r0 = tid >> 3, c8 = (tid & 7) * 8;  // T, P: 16 rows per pass, 8 pieces per row
  {
    const int d0 = swz<C>(r0, c8);
    // (the forward's planes: p.Tp, p.Pp at stride C*C, or the backward's places when the forward
    // keeps its prep for the backward: gated_delta.cu make_params)
    const int64_t pl = (g.c * p.HV + hv) * p.tp16_st + tid * 8;
    const __nv_bfloat16* Tsrc = p.T16;
    const __nv_bfloat16* Psrc = p.P16;
#pragma unroll
    for (int i = 0; i < C / 16; ++i) {
      cp_async16(b.T + d0 + 16 * i * C, Tsrc + pl + i * 16 * C, 16);
      cp_async16(b.P + d0 + 16 * i * C, Psrc + pl + i * 16 * C, 16);
    }
  }
  // v (the forward) or dO (the reverse pass), and the row factors
  if (KIND == kDh) ld_slice_rows<true>(b.V, b.fb, b.fx, b.fq, b.dec, b.gl, p, p.dO, p.do_st, p.do_sh, p.vec_do, hv, v0, g, tid);
  else ld_slice_rows<true>(b.V, b.fb, b.fx, b.fq, b.dec, b.gl, p, p.v, p.v_st, p.v_sh, p.vec_v, hv, v0, g, tid);
}

#if !GDN_WGMMA
// acc (16 x 64, 8 n8 tiles) += A M^T for a 64 x 64 fp16 plane M that is zero in every 16 x 16
// block above the diagonal (T, P): A's k-block kk meets only M's blocks np >= kk of that column.
__device__ __forceinline__ void mma_lower_t(float (&acc)[8][4], const uint32_t (&a)[4][4], const __nv_bfloat16* M, int lane) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
#pragma unroll
    for (int np = kk; np < 4; ++np) {
      uint32_t bm[4];
      ldsm_x4(bm, M + bn_off_sw<C>(16 * kk, 16 * np, lane));
      mma_f16(acc[2 * np], a[kk], bm[0], bm[1]);
      mma_f16(acc[2 * np + 1], a[kk], bm[2], bm[3]);
    }
}
#endif

#if GDN_WGMMA
// acc (16 x 64 per warp) += A M^T on wgmma, k = 128 (A: 8 k16 steps), M's 64 rows K-major in two
// column blocks CBS elements apart (k16 step kk: column block kk / 4, +32 B per step inside it).
// The caller fences and commits.
// (BF: bf16 A and M, else fp16; likewise below)
template <int CBS, bool BF = false>
__device__ __forceinline__ void mma_rows_t_wg(float (&acc)[8][4], const uint32_t (&a)[8][4], const __nv_bfloat16* M) {
  const uint64_t dM = wg::desc128_k(M);
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) wg::mma_rs<8, 0, 0, BF>(acc, a[kk], wg::desc_add(dM, (kk >> 2) * CBS * 2 + (kk & 3) * 32));
}

// acc (16 x 64 per warp) += A M^T on wgmma for a 64 x 64 fp16 plane M that is zero in every
// 16 x 16 block above the diagonal (T, P), B = M through a K-major descriptor (k16 step kk: +32 B
// in its rows). The zero blocks are multiplied too: skipping them (N = 64 - 16kk at tiles
// 2kk..7) made ptxas serialize every wgmma of the kernel (the suffixes of one accumulator array
// cannot all meet the register alignment). The caller fences, commits and waits.
template <bool BF = false>
__device__ __forceinline__ void mma_lower_wg(float (&acc)[8][4], const uint32_t (&a)[4][4], const __nv_bfloat16* M) {
  const uint64_t dM = wg::desc128_k(M);
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) wg::mma_rs<8, 0, 0, BF>(acc, a[kk], wg::desc_add(dM, 32 * kk));
}
#endif

// bf16 halves of a packed pair as floats
__device__ __forceinline__ float bf_lo(uint32_t x) { return __uint_as_float(x << 16); }
__device__ __forceinline__ float bf_hi(uint32_t x) { return __uint_as_float(x & 0xffff0000u); }

// Transposes a warp's 8x8 matrix of 16-bit pairs: the lane holding (row gq, cols 2tq, 2tq+1)
// gets (row gq, cols 2tq, 2tq+1) of the transpose.
__device__ __forceinline__ uint32_t movmatrix_t(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

__device__ __forceinline__ uint32_t pack_bf2(float x, float y) {
  __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
  return *reinterpret_cast<uint32_t*>(&h);
}

#if !GDN_WGMMA
// B (16 x 16 tiles, k-block kk, n-blocks np <= kk) of a 64 x 64 fp16 plane M stored [k][n] that is
// zero in every 16 x 16 block above the diagonal (T, P): acc (16 x 64) += A M, A's k-block kk
// meeting only M's blocks np <= kk of its row.
__device__ __forceinline__ void mma_lower_kn(float (&acc)[8][4], const uint32_t (&a)[4][4], const __nv_bfloat16* M, int lane) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
#pragma unroll
    for (int np = 0; np <= kk; ++np) {
      uint32_t bm[4];
      ldsm_x4_t(bm, M + b_off_sw<C>(16 * kk, 16 * np, lane));
      mma_f16(acc[2 * np], a[kk], bm[0], bm[1]);
      mma_f16(acc[2 * np + 1], a[kk], bm[2], bm[3]);
    }
}

// acc (16 x 128, 16 n8 tiles) += A M for a swizzled [64][128] fp16 tile M stored [k][n] (K, Q rows).
__device__ __forceinline__ void mma_rows_kn(float (&acc)[16][4], const uint32_t (&a)[4][4], const __nv_bfloat16* M, int lane) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
#pragma unroll
    for (int np = 0; np < 8; ++np) {
      uint32_t bm[4];
      ldsm_x4_t(bm, M + b_off_sw<DK>(16 * kk, 16 * np, lane));
      mma_f16(acc[2 * np], a[kk], bm[0], bm[1]);
      mma_f16(acc[2 * np + 1], a[kk], bm[2], bm[3]);
    }
}

#else
// mma_lower_kn and mma_rows_kn on wgmma: B = M stored [k][n] (rows k), MN-major through the
// 128-byte swizzle, k16 step kk = rows 16kk.. (+2 KB); M a [64][64] plane (T, P) or a K / q tile of
// two [64][64] column blocks (kCBd elements apart). The caller fences, commits and waits.
__device__ __forceinline__ void mma_lower_kn_wg(float (&acc)[8][4], const uint32_t (&a)[4][4], const __nv_bfloat16* M) {
  const uint64_t dM = wg::desc128_mn(M, kCBd * 2);
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) wg::mma_rs<8, 0, 1>(acc, a[kk], wg::desc_add(dM, 2048 * kk));
}
template <bool BF = false>
__device__ __forceinline__ void mma_rows_kn_wg(float (&acc)[16][4], const uint32_t (&a)[4][4], const __nv_bfloat16* M) {
  const uint64_t dM = wg::desc128_mn(M, kCBd * 2);
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) wg::mma_rs<16, 0, 1, BF>(acc, a[kk], wg::desc_add(dM, 2048 * kk));
}
#endif

// Y^T = diag(fb) V^T - X^T diag(fx) of the forward and of the recompute (rows r >= L selected to
// 0), in A-fragment order (k = chunk row r): put(kk, i, y0, y1) gets the pair of k-block kk,
// register i. The v^T tiles come by transposed ldmatrix in the accumulator layout of X^T (lane:
// rows j = gq, gq + 8; columns r = 8 nn + 2 tq, +1).
// A warp's transposed state strip (16 columns j of a [K][V] fp32 state, lane element (nn, e):
// j = gq + 8 (e >> 1), i = 8 nn + 2 tq + (e & 1)) from / to m, which points at the strip's first
// column; a null m loads zeros.
__device__ __forceinline__ void state_t_load(float (&st)[16][4], const float* m, int lane) {
  const int gq = lane >> 2, tq = lane & 3;
#pragma unroll
  for (int nn = 0; nn < 16; ++nn)
#pragma unroll
    for (int e = 0; e < 4; ++e) st[nn][e] = m ? m[(int64_t)(8 * nn + 2 * tq + (e & 1)) * DV + gq + 8 * (e >> 1)] : 0.f;
}
__device__ __forceinline__ void state_t_store(float* m, const float (&st)[16][4], int lane) {
  const int gq = lane >> 2, tq = lane & 3;
#pragma unroll
  for (int nn = 0; nn < 16; ++nn)
#pragma unroll
    for (int e = 0; e < 4; ++e) m[(int64_t)(8 * nn + 2 * tq + (e & 1)) * DV + gq + 8 * (e >> 1)] = st[nn][e];
}

template <class Put>
__device__ __forceinline__ void y_frags(const float (&x)[8][4], const __nv_bfloat16* V, const float* fbv, const float* fxv,
                                        int j0, int L, int lane, Put put) {
  const int tq = lane & 3;
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    uint32_t va[4];
    ldsm_x4_t(va, V + at_off(kTLD, j0, 16 * kk, lane));
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int nn = 2 * kk + u, r = 8 * nn + 2 * tq;
      const float2 fb = *reinterpret_cast<const float2*>(fbv + r);
      const float2 fx = *reinterpret_cast<const float2*>(fxv + r);
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const uint32_t vv = va[2 * u + hh];
        const float y0 = r < L ? fb.x * bf_lo(vv) - fx.x * x[nn][2 * hh] : 0.f;
        const float y1 = r + 1 < L ? fb.y * bf_hi(vv) - fx.y * x[nn][2 * hh + 1] : 0.f;
        put(kk, 2 * u + hh, y0, y1);
      }
    }
  }
}

// D^T (rows r >= L selected to 0) and D'^T = D^T diag(dec) in A-fragment order: put(kk, i, d0,
// d1, e0, e1) gets the pairs of k-block kk, register i (n8 tile 2 kk + i / 2, elements 2 (i % 2),
// +1 of d).
template <class Put>
__device__ __forceinline__ void d_frags(const float (&d)[8][4], const float* dec, int L, int lane, Put put) {
  const int tq = lane & 3;
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int nn = 2 * kk + u, r = 8 * nn + 2 * tq;
      const float2 dc = *reinterpret_cast<const float2*>(dec + r);
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const float d0 = r < L ? d[nn][2 * hh] : 0.f, d1 = r + 1 < L ? d[nn][2 * hh + 1] : 0.f;
        put(kk, 2 * u + hh, d0, d1, dc.x * d0, dc.y * d1);
      }
    }
}

// A fragments (k-block kk = 16-column block of the chunk rows r) of a warp's transposed 16 x 64
// accumulator tile X^T, as fp16 pairs of f(nn, e, x): n8 tiles 2kk and 2kk+1 are exactly the A
// fragment of k-block kk.
template <class F>
__device__ __forceinline__ void pack_a16(uint32_t (&a)[4][4], const float (&x)[8][4], F f) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
#pragma unroll
    for (int u = 0; u < 2; ++u)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int nn = 2 * kk + u;
        a[kk][2 * u + hh] = pack_h2(f(nn, 2 * hh, x[nn][2 * hh]), f(nn, 2 * hh + 1, x[nn][2 * hh + 1]));
      }
}

// stmatrix, transposed: lanes 8m..8m+7 give the row addresses of matrix m (16 bytes each); reg m is
// matrix m's fragment (lane: row gq, columns 2tq, 2tq+1), stored as its transpose.
__device__ __forceinline__ void stsm_x4_t(void* p, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1,%2,%3,%4};\n" ::"r"(smem_u32(p)), "r"(a),
               "r"(b), "r"(c), "r"(d)
               : "memory");
}

// Per-warp staging of the plane stores: [2 planes][32 rows][16 columns] bf16 (2 KB), the two
// 16-byte halves of a row swapped on rows 4-7 mod 8 (conflict-free stmatrix rows).
constexpr int kStageEl = 2 * 32 * 16;
__device__ __forceinline__ int stage_off(int plane, int r, int half) {
  return plane * 512 + r * 16 + ((half ^ ((r >> 2) & 1)) << 3);
}

// Stores a warp's transposed fp32 tile M^T (rows: its 16 value columns; NN n8 tiles over M's rows
// i) as the hi/lo bf16 planes of M in the backward's [2][rows][BV] slice layout (slice_planes),
// columns cw..cw+15 of the 32-wide slice. 32 rows at a time go through the warp's staging area
// (transposed by stmatrix) and leave as 16-byte pieces, two per 32-byte sector: 4-byte fragment
// stores straight to global memory cost 0.45 ms at 1x8192 (measured).
template <int NN>
__device__ __forceinline__ void store_planes_t(__nv_bfloat16* dst, const float (&a)[NN][4], int cw, int lane,
                                               __nv_bfloat16* stage) {
  static_assert(NN % 4 == 0, "32-row rounds");
  constexpr int rows = 8 * NN;
  const int m = lane >> 3, c = lane & 7;  // this lane's stmatrix row address: matrix m, row c
#pragma unroll
  for (int rd = 0; rd < NN / 4; ++rd) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int nn = 4 * rd + q;
      uint32_t hi0, lo0, hi1, lo1;
      split2(a[nn][0], a[nn][1], hi0, lo0);  // rows j = gq (columns i = 8 nn + 2 tq, +1)
      split2(a[nn][2], a[nn][3], hi1, lo1);  // rows j = gq + 8
      // matrices: (hi, j 0-7), (hi, j 8-15), (lo, j 0-7), (lo, j 8-15); stored rows i = 8q + c
      stsm_x4_t(stage + stage_off(m >> 1, 8 * q + c, m & 1), hi0, hi1, lo0, lo1);
    }
    __syncwarp();
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      const int pc = lane + 32 * t, pl = pc >> 6, r = (pc >> 1) & 31, half = pc & 1;
      *reinterpret_cast<uint4*>(dst + pl * rows * BV + (32 * rd + r) * BV + cw + 8 * half) =
          *reinterpret_cast<const uint4*>(stage + stage_off(pl, r, half));
    }
    __syncwarp();
  }
}

// Power-of-two scale mu (and 1/mu) that brings a largest magnitude m into [2^14, 2^15): the
// reverse pass's fp16 operands are gradients, which have no fixed range, so each product's A
// operand is scaled by its own warp's largest magnitude right before it is packed (the product
// is unscaled in fp32). Exact: a power of two commutes with rounding. Clamped so that mu and
// 1/mu stay normal (m = 0 or subnormal: any scale will do; NaN stays NaN).
struct Pow2 {
  float mu, inv;
};
__device__ __forceinline__ Pow2 pow2_scale(float m) {
  int b = 268 - (int)((__float_as_uint(m) >> 23) & 0xffu);
  b = b < 2 ? 2 : b > 252 ? 252 : b;
  return {__uint_as_float((uint32_t)b << 23), __uint_as_float((uint32_t)(254 - b) << 23)};
}

// The register-state layout's first value column j0 of warp w in the backward's 32-wide slices:
// slice and column offset inside it.
__device__ __forceinline__ void bwd_slice(int v0, int j0, int& vsl, int& cw) {
  vsl = (v0 + j0) / BV;
  cw = (v0 + j0) % BV;
}

}  // namespace

// (+1 KB: the kernel aligns its buffers to 1024 bytes itself)
size_t seq_t_smem_bytes() { return kFB * kTBufBytes + (size_t)2 * kVT * 2 + 1024; }
int seq_t_slices() { return kTNS; }

// Warp-specialized: warps 0-3 (one warpgroup) compute, warps 4-7 copy (the chunk operands in
// by cp.async, the staged o tiles out), so that the compute warps issue no address arithmetic. Both
// run the same chunk loop and meet at its one barrier per step (the same instruction for all: a
// named barrier at different places in the two roles' code would need the slower non-.aligned
// barrier.sync, 0.012 ms at 1x8192).
__global__ void __launch_bounds__(2 * kTThreads, 1) gdn_state16t_kernel(KParams p) {
  extern __shared__ __align__(128) unsigned char smraw0[];
  // the 128-byte swizzle of the wgmma tiles works on absolute shared-memory addresses
  unsigned char* const smraw = smraw0 + ((1024u - (smem_u32(smraw0) & 1023u)) & 1023u);
  const int64_t bid = blockIdx.x;
  const SeqBlock sb = seq_block(p, bid, kTNS);
  const int vs = sb.vs, hv = sb.hv, h = sb.h;
  const int64_t n = sb.n;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gq = lane >> 2, tq = lane & 3;
  const bool producer = tid >= kTThreads;  // (warp-uniform)
  const int ptid = tid - kTThreads;        // a producer's index among the producers
  const int v0 = vs * kTV, j0 = 16 * warp;  // the block's first value column; the warp's strip
  __nv_bfloat16* const Ob = reinterpret_cast<__nv_bfloat16*>(smraw + kFB * kTBufBytes);  // [2][64][kTLD]
  const int64_t KV = (int64_t)DK * DV;
  // o leaves through shared memory as 16-byte row pieces, one step later (after the barrier)
  const bool stage_o = p.vec_o;
  __nv_bfloat16* const obase = static_cast<__nv_bfloat16*>(p.o) + (int64_t)hv * p.o_sh + v0;
  const auto flush_o = [&](const __nv_bfloat16* ob, int64_t t0, int L) {
#pragma unroll
    for (int i = 0; i < C * kTV / 8 / kTThreads; ++i) {
      const int v = ptid + i * kTThreads, r = v / (kTV / 8), c8 = (v % (kTV / 8)) * 8;
      if (r < L) *reinterpret_cast<uint4*>(obase + (t0 + r) * p.o_st + c8) = *reinterpret_cast<const uint4*>(ob + r * kTLD + c8);
    }
  };

  // S^T: rows j (the warp's 16 columns of S), 16 n8 tiles over i = 0..127.
  // Lane element (nn, e): j = gq + 8 (e >> 1), i = 8 nn + 2 tq + (e & 1).
  float st[16][4];
  // (consumers only: a producer's j0 lies beyond the slice)
  state_t_load(st, p.h0 && !producer ? p.h0 + (n * p.HV + hv) * KV + v0 + j0 : nullptr, lane);
  AbsMaxH2 mS, mY, mD;  // F16 guard: largest |x| of the S, Y and D (and D') operands

  const int64_t bos = p.cu[n], eos = p.cu[n + 1];
  const int64_t c_beg = p.coff[n], c_end = p.coff[n + 1];
  if (producer) {
#pragma unroll
    for (int i = 0; i < kFB - 1; ++i) {
      if (c_beg + i < c_end) t_load<kFwd>(tbuf<kFwd>(smraw, i), p, h, hv, v0, chunk_geo(c_beg + i, c_beg, bos, eos), ptid);
      cp_async_commit();
    }
  }
  int bi = 0;  // chunk c's buffer
  GDN_PH_START
  for (int64_t c = c_beg; c < c_end; ++c, bi = bi + 1 == kFB ? 0 : bi + 1) {
    if (producer) {
      cp_async_wait<kFB - 2>();  // chunk c (every step commits one group, possibly empty)
#if GDN_WGMMA
      wg::fence_smem();  // this thread's cp.async writes, visible to wgmma's reads after the barrier
#endif
    }
    // Chunk c's operands have landed; the consumers are done with chunk c-1's buffer and have
    // staged chunk c-1's o tile.
    __syncthreads();
    if (producer) {
      if (stage_o && c > c_beg) {
        const ChunkGeo gp = chunk_geo(c - 1, c_beg, bos, eos);
        flush_o(Ob + ((c - 1) & 1) * kVT, gp.t0, gp.L);
      }
      if (c + kFB - 1 < c_end)  // into chunk c-1's buffer
        t_load<kFwd>(tbuf<kFwd>(smraw, bi == 0 ? kFB - 1 : bi - 1), p, h, hv, v0, chunk_geo(c + kFB - 1, c_beg, bos, eos), ptid);
      cp_async_commit();
      continue;
    }
    const ChunkGeo g = chunk_geo(c, c_beg, bos, eos);
    const int L = g.L;
    const TBuf b = tbuf<kFwd>(smraw, bi);
    GDN_PH(0);

    // X^T = S^T K^T and O1^T = S^T Q^T: A = S^T from registers, B = K / Q rows ([n][k] storage)
    float x[8][4], o[8][4];
    zero_acc(x);
    zero_acc(o);
#if GDN_WGMMA
    // (K-major B: column block kk / 4, k16 step kk % 4 inside the 128-byte rows; Q rows 64 on)
    {
      uint32_t a[8][4];
#pragma unroll
      for (int kk = 0; kk < 8; ++kk)
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          a[kk][2 * u] = pack_h2(st[2 * kk + u][0], st[2 * kk + u][1]);
          a[kk][2 * u + 1] = pack_h2(st[2 * kk + u][2], st[2 * kk + u][3]);
          mS.add(a[kk][2 * u]);
          mS.add(a[kk][2 * u + 1]);
        }
      wg::pin(x);
      wg::pin(o);
      wg::pin(a);
      wg::fence();
      // two groups: Y needs X only, O1 finishes meanwhile
      mma_rows_t_wg<kCB>(x, a, b.K);
      wg::commit();
      mma_rows_t_wg<kCB>(o, a, b.Q);
      wg::commit();
      wg::wait<1>();
      wg::pin(x);
    }
#else
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
      uint32_t a[4];
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        a[2 * u] = pack_h2(st[2 * kk + u][0], st[2 * kk + u][1]);
        a[2 * u + 1] = pack_h2(st[2 * kk + u][2], st[2 * kk + u][3]);
        mS.add(a[2 * u]);
        mS.add(a[2 * u + 1]);
      }
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        uint32_t bk[4], bq[4];
        ldsm_x4(bk, b.K + bn_off_sw<DK>(16 * kk, 16 * np, lane));
        ldsm_x4(bq, b.Q + bn_off_sw<DK>(16 * kk, 16 * np, lane));
        mma_f16(x[2 * np], a, bk[0], bk[1]);
        mma_f16(x[2 * np + 1], a, bk[2], bk[3]);
        mma_f16(o[2 * np], a, bq[0], bq[1]);
        mma_f16(o[2 * np + 1], a, bq[2], bq[3]);
      }
    }
#endif
    // Y^T as A fragments (k = chunk row r)
    uint32_t ya[4][4];
    y_frags(x, b.V, b.fb, b.fx, j0, L, lane, [&](int kk, int i, float y0, float y1) {
      ya[kk][i] = pack_h2(y0, y1);
      mY.add(ya[kk][i]);
    });
    GDN_PH(1);
    // D^T = Y^T T^T (T[r'][r] = 0 for r's 16-block above r''s: skipped)
    float d[8][4];
    zero_acc(d);
#if GDN_WGMMA
    wg::pin(d);
    wg::pin(ya);
    wg::fence();
    mma_lower_wg(d, ya, b.T);
    wg::commit();
    wg::wait<0>();  // (O1 too)
    wg::pin(d);
    wg::pin(o);
#else
    mma_lower_t(d, ya, b.T, lane);
#endif
    // D (rows >= L selected to 0) and D' = diag(dec) D as A fragments
    uint32_t da[4][4], dpa[4][4];
    d_frags(d, b.dec, L, lane, [&](int kk, int i, float d0, float d1, float e0, float e1) {
      da[kk][i] = pack_h2(d0, d1);
      dpa[kk][i] = pack_h2(e0, e1);
      mD.add(da[kk][i]);
      mD.add(dpa[kk][i]);
    });
    GDN_PH(2);
#if GDN_WGMMA
    // S^T <- e^{gam_L} S^T + D'^T K, issued first: the next step waits for it (B = K rows 16kk..,
    // MN-major: n = key, column blocks kCB apart)
    {
      const float eg = expf(*b.gl);
#pragma unroll
      for (int nn = 0; nn < 16; ++nn)
#pragma unroll
        for (int e = 0; e < 4; ++e) st[nn][e] *= eg;
      wg::pin(st);
      wg::pin(dpa);
      wg::fence();
      const uint64_t dKt = wg::desc128_mn(b.K, kCB * 2);
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) wg::mma_rs<16, 0, 1>(st, dpa[kk], wg::desc_add(dKt, kk * 16 * 128));
      wg::commit();
    }
#endif
    // O^T = O1^T diag(e^gam rsQ) + D^T P^T (P lower triangular including the diagonal)
#pragma unroll
    for (int nn = 0; nn < 8; ++nn) {
      const float2 fq = *reinterpret_cast<const float2*>(b.fq + 8 * nn + 2 * tq);
      o[nn][0] *= fq.x;
      o[nn][1] *= fq.y;
      o[nn][2] *= fq.x;
      o[nn][3] *= fq.y;
    }
#if !GDN_WGMMA
    mma_lower_t(o, da, b.P, lane);
#else
    wg::pin(o);
    wg::pin(da);
    wg::fence();
    mma_lower_wg(o, da, b.P);
    wg::commit();
    wg::wait<0>();
    wg::pin(o);
    wg::pin(st);
#endif
    GDN_PH(3);
    // o rows: each 8x8 block (rows j, columns r) transposed in registers, so that the lane holds
    // the bf16 pair (row r = 8 nn + gq, columns j = 8 hh + 2 tq, +1)
    uint32_t ot[8][2];
#pragma unroll
    for (int nn = 0; nn < 8; ++nn)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh)
        ot[nn][hh] = movmatrix_t(pack_bf2(p.scale * o[nn][2 * hh], p.scale * o[nn][2 * hh + 1]));
    if (stage_o) {
      __nv_bfloat16* ob = Ob + (c & 1) * kVT + gq * kTLD + j0 + 2 * tq;
#pragma unroll
      for (int nn = 0; nn < 8; ++nn)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) *reinterpret_cast<uint32_t*>(ob + 8 * nn * kTLD + 8 * hh) = ot[nn][hh];
    } else {
#pragma unroll
      for (int nn = 0; nn < 8; ++nn)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int r = 8 * nn + gq;
          if (r >= L) continue;
          __nv_bfloat16* dst = obase + (g.t0 + r) * p.o_st + j0 + 8 * hh + 2 * tq;
          if (p.pair_o) {
            *reinterpret_cast<uint32_t*>(dst) = ot[nn][hh];
          } else {
            const __nv_bfloat162 pr = *reinterpret_cast<const __nv_bfloat162*>(&ot[nn][hh]);
            dst[0] = pr.x;
            dst[1] = pr.y;
          }
        }
    }
    GDN_PH(4);
#if !GDN_WGMMA
    // S^T <- e^{gam_L} S^T + D'^T K   (B = K as stored, [k][n]: transposed ldmatrix)
    const float eg = expf(*b.gl);
#pragma unroll
    for (int nn = 0; nn < 16; ++nn)
#pragma unroll
      for (int e = 0; e < 4; ++e) st[nn][e] *= eg;
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
#pragma unroll
      for (int np = 0; np < 8; ++np) {
        uint32_t bk[4];
        ldsm_x4_t(bk, b.K + b_off_sw<DK>(16 * kk, 16 * np, lane));
        mma_f16(st[2 * np], dpa[kk], bk[0], bk[1]);
        mma_f16(st[2 * np + 1], dpa[kk], bk[2], bk[3]);
      }
#endif
  }
  if (producer) cp_async_wait<0>();
  __syncthreads();  // the last o tile is staged
  if (producer) {
    if (stage_o && c_beg < c_end) {
      const ChunkGeo gp = chunk_geo(c_end - 1, c_beg, bos, eos);
      flush_o(Ob + ((c_end - 1) & 1) * kVT, gp.t0, gp.L);
    }
  } else if (p.ht) {
    state_t_store(p.ht + (n * p.HV + hv) * KV + v0 + j0, st, lane);
  }
  // range check of this block's fp16 operands over the whole sequence
  __shared__ unsigned bmax[3];
  __syncthreads();
  if (tid < 3) bmax[tid] = 0;
  __syncthreads();
  const float m0 = mS.warp_max(), m1 = mY.warp_max(), m2 = mD.warp_max();
  if (lane == 0) {
    atomicMax(&bmax[0], __float_as_uint(m0));
    atomicMax(&bmax[1], __float_as_uint(m1));
    atomicMax(&bmax[2], __float_as_uint(m2));
  }
  __syncthreads();
  if (tid == 0 && !(f16_range_ok(__uint_as_float(bmax[0])) && f16_range_ok(__uint_as_float(bmax[1])) &&
                    f16_range_ok(__uint_as_float(bmax[2])))) {
    p.f16_bad[n * p.HV + hv] = 1;
    p.f16_bad[p.N * p.HV] = 1;
  }
}

// The reverse pass's step barrier: its producer and compute warps reach it from different code,
// so it is the non-.aligned form (a __syncthreads there would be undefined).
__device__ __forceinline__ void step_barrier() { asm volatile("barrier.sync 0;\n" ::: "memory"); }
// The reverse pass's producer warps' loop over the chunks c from c_first down to c_stop, their
// first copies issued by the caller: at each step, wait for their own copies, make them visible
// to wgmma, meet the compute warps at the step's barrier, then issue the copies that
// copy_after(c) names.
template <class F>
__device__ __forceinline__ void producer_steps(int64_t c_first, int64_t c_stop, F&& copy_after) {
  for (int64_t c = c_first; c >= c_stop; --c) {
    cp_async_wait<0>();
#if GDN_WGMMA
    wg::fence_smem();  // this thread's cp.async writes, visible to wgmma's reads after the barrier
#endif
    step_barrier();  // chunk c's operands landed; everyone is done with the other buffer
    copy_after(c);
  }
  cp_async_wait<0>();
}

// A producer warpgroup (warps 4-7) issues the reverse pass's chunk copies, which cost the compute
// warps about a fifth of each step (phase clocks). Every thread may take up to 255 registers, so
// the block has an SM to itself: on sm_90a nothing runs beside the reverse pass (the recompute
// runs after it). The producers took the 1x8192 pair of the two passes from 0.845 to 0.820 ms,
// 4x2048 from 0.603 to 0.593. Keeping the block at 128 registers per thread (setmaxnreg 24/232
// or 40/216) to fit beside a recompute block was slower than no producers (backward 4x2048
// 2.43-2.46 against 2.29 ms): the producers spilled and the compute warps waited for them at the
// step's barrier.
constexpr int kDhThreads = 2 * kTThreads;

// The backward's reverse pass with the gradient state in registers (the transposed layout of
// gdn_state16t_kernel; dh_body in gdn_seq.cu is the bf16x2 form and has the derivation). dS^T: rows j
// (the warp's 16 value columns), k = 128 columns. Per chunk, last to first:
//   dhs  <- dS (leaving the chunk)
//   dDelta^T = (dS^T K^T) diag(dec) + s dO^T P            (rows >= L selected to 0) -> dDl
//   Z^T = -(dDelta^T T) diag(fx),  dO'^T = s dO^T diag(fq)
//   dS^T <- e^{gam_L} dS^T + dO'^T Q + Z^T K
// Every product's A operand (dS^T, dO^T, dDelta^T, and Z^T with dO'^T) is scaled by a power of two
// chosen from its warp's largest magnitude right before it is packed to fp16 (pow2_scale), and the
// fp32 result unscaled: gradients have no fixed range, so this needs no guard and no fallback.
// The B operands (fp16 K, Q, T, P from prep) are range-checked by prep. K, Q, T, P, dO and the
// row factors are double-buffered, so a step has one barrier (a single-buffered q tile, waited
// for in the middle of the step, made the backward on fp16 operands 2.64 against 2.57 ms at
// 1x8192, 2.31 against 2.29 at 4x2048). On sm_90a the recompute (gdn_rec16t_kernel) runs after
// this kernel. Elsewhere the bf16x2 recompute (gdn_state_kernel) is launched right after it as its
// programmatic dependent (the two passes are independent, see gdn_backward) and leaves out its
// unused q tile.
__global__ void __launch_bounds__(kDhThreads, 1) gdn_dh16t_kernel(KParams p) {
  // let a dependent recompute launch now (gdn_state_kernel, where gdn_rec16t_kernel does not run):
  // it takes the SM room this grid leaves
  asm volatile("griddepcontrol.launch_dependents;");
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, tq = lane & 3;
  const bool producer = tid >= kTThreads;             // (warp-uniform)
  const int ptid = producer ? tid - kTThreads : tid;  // the copying thread's index
  GDN_PH_START  // (phase clocks 8-15 of gdn_debug_phases_seqt)
  extern __shared__ __align__(128) unsigned char smraw0[];
  // (the wgmma tiles' 128-byte swizzle works on absolute shared-memory addresses)
  unsigned char* const smraw = smraw0 + ((1024u - (smem_u32(smraw0) & 1023u)) & 1023u);
  const SeqBlock sb = seq_block(p, blockIdx.x, kTNS);
  const int vs = sb.vs, hv = sb.hv, h = sb.h;
  const int64_t n = sb.n;
  const int v0 = vs * kTV, j0 = 16 * warp;
  const int64_t bos = p.cu[n], eos = p.cu[n + 1];
  const int64_t c_beg = p.coff[n], c_end = p.coff[n + 1];
  // Note [The recompute beside the reverse pass] (gated_delta.cu): the flagged pairs were redone
  // by the fallback before this launch; every block counts itself finished in p.dh_done
  const auto finished = [&] {
    __threadfence();
    atomicAdd(p.dh_done, 1);
  };
  if (p.skip_if && p.skip_if[n * p.HV + hv]) {  // (uniform over the block)
    if (p.dh_done && tid == 0) finished();
    return;
  }
  // step c's copies: chunk c-1's operands, into the other buffer
  const auto copies = [&](int64_t c) {
    if (c > c_beg) t_load<kDh>(tbuf<kDh>(smraw, (int)((c - 1) & 1)), p, h, hv, v0, chunk_geo(c - 1, c_beg, bos, eos), ptid);
    cp_async_commit();
  };
  const auto first_copies = [&] {  // chunk c_end-1's operands
    if (c_beg < c_end) t_load<kDh>(tbuf<kDh>(smraw, (int)((c_end - 1) & 1)), p, h, hv, v0, chunk_geo(c_end - 1, c_beg, bos, eos), ptid);
    cp_async_commit();
  };
  if (producer) {  // the producers: the copies, and the barrier of each step
    first_copies();
    producer_steps(c_end - 1, c_beg, copies);
    return;
  }
  __nv_bfloat16* const stage = reinterpret_cast<__nv_bfloat16*>(smraw + 2 * kTBufBytes) + warp * kStageEl;
  const int64_t KV = (int64_t)DK * DV;
  int vsl, cw;
  bwd_slice(v0, j0, vsl, cw);
  float st[16][4];  // dS^T (state_t_load's layout)
  state_t_load(st, p.dht ? p.dht + (n * p.HV + hv) * KV + v0 + j0 : nullptr, lane);
  for (int64_t c = c_end - 1; c >= c_beg; --c) {
    const ChunkGeo g = chunk_geo(c, c_beg, bos, eos);
    const int L = g.L;
    const TBuf b = tbuf<kDh>(smraw, (int)(c & 1));
    step_barrier();  // chunk c's operands landed; everyone is done with chunk c+1's buffer
    GDN_PH(15);
    GDN_PH(8);
    // The step's first two products are independent: X^T = dS^T K^T (A = mu_S dS^T) and
    // Y^T = dO^T P (A = mu_O dO^T). On wgmma they run as one group, and the dS planes leaving
    // chunk c are stored later, under the T product.
    Pow2 sS;
    {
      AbsMax m;
#pragma unroll
      for (int nn = 0; nn < 16; ++nn)
#pragma unroll
        for (int e = 0; e < 4; ++e) m.add(st[nn][e]);
      sS = pow2_scale(m.warp_max());
    }
    // dO^T: transposed ldmatrix gives its A fragments as bf16 pairs (rows j, k = chunk rows r)
    uint32_t va[4][4];
    AbsMax mO;
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      ldsm_x4_t(va[kk], b.V + at_off(kTLD, j0, 16 * kk, lane));
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        mO.add(bf_lo(va[kk][i]));
        mO.add(bf_hi(va[kk][i]));
      }
    }
    // element (nn, e) of dO^T in the accumulator layout (as pack_a16 visits it)
    const auto dO_at = [&](int nn, int e) {
      const uint32_t w = va[nn >> 1][2 * (nn & 1) + (e >> 1)];
      return (e & 1) ? bf_hi(w) : bf_lo(w);
    };
    const Pow2 sO = pow2_scale(mO.warp_max());
    float x[8][4], y[8][4];
    zero_acc(x);
    zero_acc(y);
    uint32_t oa[4][4];
    pack_a16(oa, y, [&](int nn, int e, float) { return sO.mu * dO_at(nn, e); });
    // (dS^T's k-block kk: n8 tiles 2kk, 2kk+1 of the state)
    const auto pack_s = [&](uint32_t (&a)[4], int kk) {
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        a[2 * u] = pack_h2(sS.mu * st[2 * kk + u][0], sS.mu * st[2 * kk + u][1]);
        a[2 * u + 1] = pack_h2(sS.mu * st[2 * kk + u][2], sS.mu * st[2 * kk + u][3]);
      }
    };
    auto* const dhs_c = p.dhs + slice_planes(c, p.HV, hv, vsl, DK);  // dS leaving chunk c
    GDN_PH(9);
#if GDN_WGMMA
    {  // (X: K-major B, column block kk / 4, k16 step kk % 4 inside the 128-byte rows)
      uint32_t a[8][4];
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) pack_s(a[kk], kk);
      wg::pin(x);
      wg::pin(y);
      wg::pin(a);
      wg::pin(oa);
      wg::fence();
      mma_rows_t_wg<kCBd>(x, a, b.K);
      mma_lower_kn_wg(y, oa, b.P);
      wg::commit();
      wg::wait<0>();
      wg::pin(x);
      wg::pin(y);
    }
#else
    store_planes_t<16>(dhs_c, st, cw, lane, stage);
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
      uint32_t a[4];
      pack_s(a, kk);
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        uint32_t bk[4];
        ldsm_x4(bk, b.K + bn_off_sw<DK>(16 * kk, 16 * np, lane));
        mma_f16(x[2 * np], a, bk[0], bk[1]);
        mma_f16(x[2 * np + 1], a, bk[2], bk[3]);
      }
    }
    mma_lower_kn(y, oa, b.P, lane);
#endif
    GDN_PH(10);
    // dDelta^T (rows >= L selected to 0), its planes, and its A fragments (mu_D)
    AbsMax mD;
#pragma unroll
    for (int nn = 0; nn < 8; ++nn) {
      const int r = 8 * nn + 2 * tq;
      const float2 dc = *reinterpret_cast<const float2*>(b.dec + r);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float dv = (e & 1) ? dc.y : dc.x;
        // (unscaled products first: a scale times a row factor alone may overflow, and inf * 0 is NaN)
        x[nn][e] = r + (e & 1) < L ? dv * (sS.inv * x[nn][e]) + p.scale * (sO.inv * y[nn][e]) : 0.f;
        mD.add(x[nn][e]);
      }
    }
    const Pow2 sD = pow2_scale(mD.warp_max());
    uint32_t da[4][4];
    pack_a16(da, x, [&](int, int, float v) { return sD.mu * v; });
    GDN_PH(11);
    // Z^T = -(dDelta^T T) diag(fx) (the dDelta planes stored meanwhile); dO'^T = s dO^T diag(fq);
    // one scale mu_U for both
    zero_acc(y);
    auto* const dDl_c = p.dDl + slice_planes(c, p.HV, hv, vsl, C);
#if GDN_WGMMA
    wg::pin(y);
    wg::pin(da);
    wg::fence();
    mma_lower_kn_wg(y, da, b.T);
    wg::commit();
    store_planes_t<8>(dDl_c, x, cw, lane, stage);
    // the dS planes leaving chunk c too (253 registers, no spills; backward 2.113 ms against 2.123
    // with the store before the X/Y group at 1x8192, 1.895 against 1.910 at 4x2048, over three
    // paired rounds. Under the X/Y group instead it spilled 400 B: x, y, a and oa are all live
    // there)
    store_planes_t<16>(dhs_c, st, cw, lane, stage);
    wg::wait<0>();
    wg::pin(y);
#else
    store_planes_t<8>(dDl_c, x, cw, lane, stage);
    mma_lower_kn(y, da, b.T, lane);
#endif
    GDN_PH(12);
    // (dO' elements s fq_r dO: formed twice, for the scale and for the pack, instead of kept)
    const auto dO2_at = [&](int nn, int e) {
      const float2 fq = *reinterpret_cast<const float2*>(b.fq + 8 * nn + 2 * tq);
      return p.scale * ((e & 1) ? fq.y : fq.x) * dO_at(nn, e);
    };
    AbsMax mU;
#pragma unroll
    for (int nn = 0; nn < 8; ++nn) {
      const int r = 8 * nn + 2 * tq;
      const float2 fx = *reinterpret_cast<const float2*>(b.fx + r);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        y[nn][e] = -((e & 1) ? fx.y : fx.x) * (sD.inv * y[nn][e]);
        mU.add(y[nn][e]);
        mU.add(dO2_at(nn, e));
      }
    }
    const Pow2 sU = pow2_scale(mU.warp_max());
    uint32_t za[4][4];
    pack_a16(za, y, [&](int, int, float v) { return sU.mu * v; });
    pack_a16(oa, y, [&](int nn, int e, float) { return sU.mu * dO2_at(nn, e); });
    // dS^T <- e^{gam_L} dS^T + (dO'^T Q + Z^T K) / mu_U
    float u[16][4];
    zero_acc(u);
#if GDN_WGMMA
    wg::pin(u);
    wg::pin(za);
    wg::pin(oa);
    wg::fence();
    mma_rows_kn_wg(u, za, b.K);
    mma_rows_kn_wg(u, oa, b.Q);
    wg::commit();
    GDN_PH(13);
    wg::wait<0>();
    wg::pin(u);
#else
    mma_rows_kn(u, za, b.K, lane);
    mma_rows_kn(u, oa, b.Q, lane);
#endif
    const float eg = expf(*b.gl);
#pragma unroll
    for (int nn = 0; nn < 16; ++nn)
#pragma unroll
      for (int e = 0; e < 4; ++e) st[nn][e] = eg * st[nn][e] + sU.inv * u[nn][e];
    GDN_PH(14);
  }
  cp_async_wait<0>();
  if (p.dh0) state_t_store(p.dh0 + (n * p.HV + hv) * KV + v0 + j0, st, lane);
  if (p.dh_done) {  // the compute warps' stores, then one count (the pattern of a grid barrier)
    asm volatile("bar.sync 1, %0;" ::"n"(kTThreads) : "memory");
    if (tid == 0) finished();
  }
}

// ---- The backward's state recompute in the transposed register-state form, on bf16x2 wgmma
// (sm_90a, where rec16t_runs() in gated_delta.cu) ----
// It computes what gdn_state_kernel's mode 2 does (S entering each chunk and Delta, as the hi/lo
// planes bwd_chunk multiplies) per 64-wide slice with 4 warps, the state transposed in registers
// as in gdn_state16t_kernel, and every product in the bf16x2 precision of state_body (gdn_seq.cu):
// A = hi and lo bf16 fragments of S^T, Y^T and Delta'^T
// from registers; B = raw bf16 k (exact), T's hi/lo planes from prep. Per chunk c:
//   hs   <- S^T (entering c, split hi/lo)
//   X^T   = S^T K^T                       (k raw; S hi + lo: 2 products)
//   Y^T   = (diag(beta) V^T - X^T diag(fx))  rows >= L selected to 0   (fx = beta e^gam rsK)
//   D^T   = Y^T T^T                       (hi.hi + hi.lo + lo.hi)
//   Dl   <- D^T (rows >= L selected to 0)
//   S^T  <- e^{gam_L} S^T + (D^T diag(dec)) K   (dec = e^{gam_L - gam} rsK; hi + lo)
// The row factors are prep16's (p.fx, p.dec), as for the reverse pass. Operands double-buffered,
// one barrier per step. Launched after the reverse pass, not beside it (gdn_backward). At 1x8192:
// 0.40 ms alone against 0.63 for gdn_state_kernel. Other architectures: not launched (the body
// traps).
constexpr int kRecVecF = 3 * C + 32;  // fb, fx, dec [64] each, then gam_L (padded to 128 bytes)
constexpr size_t kRecBuf = ((size_t)(kKQ + 2 * kPL + kVT) * 2 + kRecVecF * sizeof(float) + 1023) / 1024 * 1024;
struct RBuf {
  __nv_bfloat16 *K, *T, *V;  // raw k (two [64][64] column blocks, 128-byte swizzle), T hi/lo, raw v
  float *fb, *fx, *dec, *gl;
};
__device__ __forceinline__ RBuf rbuf(unsigned char* base, int b) {
  RBuf r;
  r.K = reinterpret_cast<__nv_bfloat16*>(base + b * kRecBuf);
  r.T = r.K + kKQ;
  r.V = r.T + 2 * kPL;
  r.fb = reinterpret_cast<float*>(r.V + kVT);
  r.fx = r.fb + C;
  r.dec = r.fx + C;
  r.gl = r.dec + C;
  return r;
}
// chunk g's operands into buffer b (rows >= L zero-filled); the caller commits
__device__ __forceinline__ void rec_load(const RBuf& b, const KParams& p, int h, int hv, int v0, const ChunkGeo& g, int tid) {
  {  // raw k rows of key head h: rows tid/16 + 8i, 8 columns at (tid % 16) * 8
    const __nv_bfloat16* kb = bf16_at(p.k, g.t0 * p.k_st + (int64_t)h * p.k_sh);
    if (p.vec_k) {
      const int r0 = tid >> 4, c8 = (tid & 15) * 8;
      const int d0 = (c8 >> 6) * kCBd + swz<64>(r0, c8 & 63);
#pragma unroll
      for (int i = 0; i < C / 8; ++i) {
        const int r = r0 + 8 * i;
        const bool ok = r < g.L;
        cp_async16(b.K + d0 + 8 * i * 64, kb + (ok ? r : 0) * p.k_st + c8, ok ? 16 : 0);
      }
    } else {
      const __nv_bfloat16 z = __float2bfloat16_rn(0.f);
      for (int i = tid; i < C * DK; i += kTThreads) {
        const int r = i / DK, cc = i % DK;
        b.K[(cc >> 6) * kCBd + swz<64>(r, cc & 56) + (cc & 7)] = r < g.L ? kb[r * p.k_st + cc] : z;
      }
    }
  }
  {  // T's hi and lo planes ([2][64][64] per (chunk, value head) from prep): 8 pieces of 8 a row
    const __nv_bfloat16* ts = p.Tp + (g.c * p.HV + hv) * (int64_t)(2 * C * C);
#pragma unroll
    for (int i = 0; i < 2 * C * C / 8 / kTThreads; ++i) {
      const int v = tid + i * kTThreads, pl = v >> 9, r = (v >> 3) & 63, c8 = (v & 7) * 8;
      cp_async16(b.T + pl * kPL + swz<C>(r, c8), ts + v * 8, 16);
    }
  }
  // the raw v slice and the row factors (no fq: the recompute forms no o)
  ld_slice_rows<false>(b.V, b.fb, b.fx, nullptr, b.dec, b.gl, p, p.v, p.v_st, p.v_sh, p.vec_v, hv, v0, g, tid);
}

// No producer warpgroup here (unlike the reverse pass): with one, 256 threads and one block per
// SM, the recompute gives up the second block per SM that the 128-thread form has at 4x2048 (384
// blocks), and it gained about 1 % at one shape only (H200, backward on fp16 operands: 1x8192
// 2.317 / 2.312 ms against 2.332 / 2.354, 4x2048 2.129 / 2.132 against 2.129 / 2.107).
constexpr int kRecThreads = kTThreads;
// Note [Beside the recompute] (gated_delta.cu): with p.ready set, every block adds 1 to
// p.ready[c * H + h] (h: its key head) once its planes of chunk c are stored, at every 8th chunk
// of its sequence and at the last (the step barrier, then one thread's fence and atomic: the
// pattern of a grid barrier), and 1 to p.ready[-1] when it has finished.
// bwd_chunk, the programmatic dependent, waits for p.ready[c * H + h] to count every block of
// the key head's value heads. A pair flagged in p.skip_if was recomputed by the bf16x2 fallback before this launch:
// its blocks store nothing and publish every chunk at once.
__device__ __forceinline__ void rec_publish(const KParams& p, int64_t c, int h) {
  __threadfence();
  atomicAdd(p.ready + (c < 0 ? c : c * p.H + h), 1);
}
__global__ void __launch_bounds__(kRecThreads, 2) gdn_rec16t_kernel(KParams p) {
#if GDN_WGMMA
  // bwd_chunk may launch now, on the SMs this grid leaves (it waits on p.ready, never on the grid)
  asm volatile("griddepcontrol.launch_dependents;");
  extern __shared__ __align__(128) unsigned char smraw0[];
  unsigned char* const smraw = smraw0 + ((1024u - (smem_u32(smraw0) & 1023u)) & 1023u);
  const SeqBlock sb = seq_block(p, blockIdx.x, kTNS);
  const int vs = sb.vs, hv = sb.hv, h = sb.h;
  const int64_t n = sb.n;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int v0 = vs * kTV, j0 = 16 * warp;
  const int64_t bos = p.cu[n], eos = p.cu[n + 1];
  const int64_t c_beg = p.coff[n], c_end = p.coff[n + 1];
  if (p.skip_if && p.skip_if[n * p.HV + hv]) {  // (uniform over the block)
    if (p.ready && tid == 0) {
      for (int64_t c = c_beg; c < c_end; ++c)
        if (((c - c_beg) & 7) == 7 || c == c_end - 1) rec_publish(p, c, h);
      rec_publish(p, -1, h);
    }
    return;
  }
  // chunk c's operands into buffer c & 1 (thread index ltid of the copying threads), committed
  const auto load = [&](int64_t c, int ltid) {
    if (c < c_end) rec_load(rbuf(smraw, (int)(c & 1)), p, h, hv, v0, chunk_geo(c, c_beg, bos, eos), ltid);
    cp_async_commit();
  };
  __nv_bfloat16* const stage = reinterpret_cast<__nv_bfloat16*>(smraw + 2 * kRecBuf) + warp * kStageEl;
  const int64_t KV = (int64_t)DK * DV;
  int vsl, cw;
  bwd_slice(v0, j0, vsl, cw);
  float st[16][4];  // S^T (state_t_load's layout)
  state_t_load(st, p.h0 ? p.h0 + (n * p.HV + hv) * KV + v0 + j0 : nullptr, lane);
  load(c_beg, tid);
  for (int64_t c = c_beg; c < c_end; ++c) {
    const ChunkGeo g = chunk_geo(c, c_beg, bos, eos);
    const int L = g.L;
    const RBuf b = rbuf(smraw, (int)(c & 1));
    cp_async_wait<0>();
    wg::fence_smem();  // this thread's cp.async writes, visible to wgmma's reads after the barrier
    __syncthreads();  // chunk c's operands landed; everyone is done with chunk c-1's buffer
    if (p.ready && tid == 0 && c > c_beg && ((c - 1 - c_beg) & 7) == 7) rec_publish(p, c - 1, h);
    load(c + 1, tid);
    store_planes_t<16>(p.hs + slice_planes(c, p.HV, hv, vsl, DK), st, cw, lane, stage);  // S entering c
    // X^T = S^T K^T: A = S^T's hi and lo fragments (k-block kk: n8 tiles 2kk, 2kk+1 of the state)
    float x[8][4];
    zero_acc(x);
    {
      uint32_t ah[8][4], al[8][4];
#pragma unroll
      for (int kk = 0; kk < 8; ++kk)
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          split2(st[2 * kk + u][0], st[2 * kk + u][1], ah[kk][2 * u], al[kk][2 * u]);
          split2(st[2 * kk + u][2], st[2 * kk + u][3], ah[kk][2 * u + 1], al[kk][2 * u + 1]);
        }
      wg::pin(x);
      wg::pin(ah);
      wg::pin(al);
      wg::fence();
      mma_rows_t_wg<kCBd, true>(x, al, b.K);
      mma_rows_t_wg<kCBd, true>(x, ah, b.K);
      wg::commit();
      wg::wait<0>();
      wg::pin(x);
    }
    // Y^T as hi/lo A fragments (k = chunk row r)
    uint32_t yh[4][4], yl[4][4];
    y_frags(x, b.V, b.fb, b.fx, j0, L, lane,
            [&](int kk, int i, float y0, float y1) { split2(y0, y1, yh[kk][i], yl[kk][i]); });
    // D^T = Y^T T^T: hi.hi + hi.lo + lo.hi (T's planes K-major as stored, rows r')
    float d[8][4];
    zero_acc(d);
    wg::pin(d);
    wg::pin(yh);
    wg::pin(yl);
    wg::fence();
    mma_lower_wg<true>(d, yl, b.T);
    mma_lower_wg<true>(d, yh, b.T + kPL);
    mma_lower_wg<true>(d, yh, b.T);
    wg::commit();
    wg::wait<0>();
    wg::pin(d);
    // Delta (rows >= L selected to 0, in d for its planes) and Delta' = diag(dec) Delta as hi/lo
    // A fragments
    uint32_t ph[4][4], pl[4][4];
    d_frags(d, b.dec, L, lane, [&](int kk, int i, float d0, float d1, float e0, float e1) {
      const int nn = 2 * kk + (i >> 1), hh = i & 1;
      d[nn][2 * hh] = d0;
      d[nn][2 * hh + 1] = d1;
      split2(e0, e1, ph[kk][i], pl[kk][i]);
    });
    // S^T <- e^{gam_L} S^T + Delta'^T K (K MN-major: n = key), the Delta planes stored meanwhile
    const float eg = expf(*b.gl);
#pragma unroll
    for (int nn = 0; nn < 16; ++nn)
#pragma unroll
      for (int e = 0; e < 4; ++e) st[nn][e] *= eg;
    wg::pin(st);
    wg::pin(ph);
    wg::pin(pl);
    wg::fence();
    mma_rows_kn_wg<true>(st, pl, b.K);
    mma_rows_kn_wg<true>(st, ph, b.K);
    wg::commit();
    store_planes_t<8>(p.Dl + slice_planes(c, p.HV, hv, vsl, C), d, cw, lane, stage);
    wg::wait<0>();
    wg::pin(st);
  }
  cp_async_wait<0>();
  if (p.ready) {  // the last chunk: the compute warps' stores, then one publication; then finished
    asm volatile("bar.sync 1, %0;" ::"n"(kTThreads) : "memory");
    if (tid == 0) {
      if (c_end > c_beg) rec_publish(p, c_end - 1, h);
      rec_publish(p, -1, h);
    }
  }
#else
  __trap();  // (launched only where rec16t_runs(): gdn_backward)
#endif
}
size_t rec16t_smem_bytes() { return 2 * kRecBuf + (size_t)kTW * kStageEl * 2 + 1024; }
int rec16t_threads() { return kRecThreads; }
// Whether the current device's image has gdn_rec16t_kernel's body (wgmma): the device pass's value
// of gdn_rec16t_built.
#if GDN_WGMMA
__device__ int gdn_rec16t_built = 1;
#else
__device__ int gdn_rec16t_built = 0;
#endif
cudaError_t rec16t_built(bool& built) {
  int v = 0;
  const cudaError_t e = cudaMemcpyFromSymbol(&v, gdn_rec16t_built, sizeof v);
  built = v != 0;
  return e;
}

int dh16t_threads() { return kDhThreads; }

// bytes of dynamic shared memory of gdn_dh16t_kernel: two operand buffers, the four compute warps'
// staging areas
size_t dh16t_smem_bytes() {
  return 2 * kTBufBytes + (size_t)kTW * kStageEl * 2 + 1024;
}

}  // namespace qrun::gdn::detail
