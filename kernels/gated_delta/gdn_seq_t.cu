// The fast forward's sequential kernel with the recurrent state held in registers as MMA operands
// (v20). One block of 4 warps per (sequence, value head, 64-wide V slice); warp w owns the 16
// value columns 16w..16w+15 of the slice and computes everything transposed:
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
// barrier. (The fp16 plane kernel it replaced, gdn_state16 of v14-v19 in gdn_seq.cu, spent ~1,270
// warp instructions per warp and step on 128 MMAs: plane stores, ldmatrix of its own state and five
// barriers; ncu, v18.)
//
// Operands and numerics are those of that plane kernel: fp16 K/Q copies, T and P planes
// and fp16 roundings of S, Y, D and D' (gdn_mma16.cuh), fp32 accumulation and state, the same
// range check (F16 guard) reported through p.f16_bad. The row factors come from prep
// (p.fx, p.fq, p.dec), so the step evaluates no exponential but e^{gam_L}.
#include "gdn_common.cuh"
#include "gdn_kernels.cuh"
#include "gdn_mma16.cuh"

namespace qrun::gdn::detail {
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

// One chunk's shared operands (a buffer; two of them alternate by chunk parity).
struct TBuf {
  __nv_bfloat16 *K, *Q, *T, *P, *V;  // K, Q, T, P: fp16 bits; V: raw bf16
  float *fb, *fx, *fq, *dec, *gl;
};
constexpr size_t kTBufBytes = (size_t)(2 * kKQ + 2 * kPL + kVT) * 2 + (kNVec * C + 32) * sizeof(float);  // (gam_L padded to 128 bytes)
static_assert(kTBufBytes % 128 == 0, "buffers stay 128-byte aligned");

__device__ __forceinline__ TBuf tbuf(unsigned char* base, int b) {
  TBuf t;
  __nv_bfloat16* e = reinterpret_cast<__nv_bfloat16*>(base + b * kTBufBytes);
  t.K = e;
  t.Q = t.K + kKQ;
  t.T = t.Q + kKQ;
  t.P = t.T + kPL;
  t.V = t.P + kPL;
  float* f = reinterpret_cast<float*>(t.V + kVT);
  t.fb = f;
  t.fx = f + C;
  t.fq = f + 2 * C;
  t.dec = f + 3 * C;
  t.gl = f + 4 * C;
  return t;
}

// Issues the cp.async copies of chunk g's operands into buffer b (rows >= L zero-filled; v by
// plain stores when its rows are not 16-byte aligned). The caller commits. Thread tid copies the
// same columns of rows tid/16 + 8i (q/k) and tid/8 + 16i (T, P, v) in every chunk, so the
// swizzled destinations are fixed offsets plus multiples of a row block.
__device__ __forceinline__ void t_load(const TBuf& b, const KParams& p, int h, int hv, int v0, const ChunkGeo& g) {
  const int tid = threadIdx.x;
  {  // q/k: 8 rows per pass, 16 pieces of 8 per row
    // (row offsets inside a chunk in 32 bits: 63 rows x H x 128 elements)
    const int r0 = tid >> 4, c8 = (tid & 15) * 8, d0 = swz<DK>(r0, c8);
    const int rst = p.H * DK;  // row stride of the fp16 q/k copies
    const int64_t off = (g.t0 * p.H + h) * (int64_t)DK + c8;
    const __half* kh = static_cast<const __half*>(p.kh) + off;
    const __half* qh = static_cast<const __half*>(p.qh) + off;
#pragma unroll
    for (int i = 0; i < C / 8; ++i) {
      const int r = r0 + 8 * i;
      const bool ok = r < g.L;
      const int ro = ok ? r * rst : 0;
      cp_async16(b.K + d0 + 8 * i * DK, kh + ro, ok ? 16 : 0);
      cp_async16(b.Q + d0 + 8 * i * DK, qh + ro, ok ? 16 : 0);
    }
  }
  const int r0 = tid >> 3, c8 = (tid & 7) * 8;  // T, P, v: 16 rows per pass, 8 pieces per row
  {
    const int d0 = swz<C>(r0, c8);
    const int64_t pl = (g.c * p.HV + hv) * (int64_t)kPL + tid * 8;
#pragma unroll
    for (int i = 0; i < C / 16; ++i) {
      cp_async16(b.T + d0 + 16 * i * C, p.Tp + pl + i * 16 * C, 16);
      cp_async16(b.P + d0 + 16 * i * C, p.Pp + pl + i * 16 * C, 16);
    }
  }
  static_assert(kTV == 64, "v rows are 8 pieces of 8");
  const __nv_bfloat16* vb = bf16_at(p.v, g.t0 * p.v_st + (int64_t)hv * p.v_sh + v0);
  if (p.vec_v) {
#pragma unroll
    for (int i = 0; i < C / 16; ++i) {
      const int r = r0 + 16 * i;
      const bool ok = r < g.L;
      cp_async16(b.V + r * kTLD + c8, vb + (ok ? r * p.v_st : 0) + c8, ok ? 16 : 0);
    }
  } else {
    const __nv_bfloat16 z = __float2bfloat16_rn(0.f);
    for (int i = tid; i < C * kTV; i += kTThreads) {
      const int r = i / kTV, cc = i % kTV;
      b.V[r * kTLD + cc] = r < g.L ? vb[r * p.v_st + cc] : z;
    }
  }
  {  // row factors (0 beyond L): threads 0-63 beta and fx, 64-127 fq and dec; thread 0 gam_L
    const int r = tid & (C - 1);
    const bool ok = r < g.L;
    const int64_t i = (g.t0 + (ok ? r : 0)) * p.HV + hv;
    if (tid < C) {
      cp_async4(b.fb + r, p.bet + i, ok ? 4 : 0);
      cp_async4(b.fx + r, p.fx + i, ok ? 4 : 0);
    } else {
      cp_async4(b.fq + r, p.fq + i, ok ? 4 : 0);
      cp_async4(b.dec + r, p.dec + i, ok ? 4 : 0);
    }
    if (tid == 0) cp_async4(b.gl, p.gam + (g.t0 + g.L - 1) * p.HV + hv, 4);
  }
}

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

}  // namespace

size_t seq_t_smem_bytes() { return 2 * kTBufBytes + (size_t)2 * kVT * 2; }
int seq_t_slices() { return kTNS; }

__global__ void __launch_bounds__(kTThreads, 1) gdn_state16t_kernel(KParams p) {
  extern __shared__ __align__(128) unsigned char smraw[];
  const int64_t bid = blockIdx.x;
  const SeqBlock sb = seq_block(p, bid, kTNS);
  const int vs = sb.vs, hv = sb.hv, h = sb.h;
  const int64_t n = sb.n;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gq = lane >> 2, tq = lane & 3;
  const int v0 = vs * kTV, j0 = 16 * warp;  // the block's first value column; the warp's strip
  __nv_bfloat16* const Ob = reinterpret_cast<__nv_bfloat16*>(smraw + 2 * kTBufBytes);  // [2][64][kTLD]
  const int64_t KV = (int64_t)DK * DV;
  // o leaves through shared memory as 16-byte row pieces, one step later (after the barrier)
  const bool stage_o = p.vec_o;
  __nv_bfloat16* const obase = static_cast<__nv_bfloat16*>(p.o) + (int64_t)hv * p.o_sh + v0;
  const auto flush_o = [&](const __nv_bfloat16* ob, int64_t t0, int L) {
#pragma unroll
    for (int i = 0; i < C * kTV / 8 / kTThreads; ++i) {
      const int v = tid + i * kTThreads, r = v / (kTV / 8), c8 = (v % (kTV / 8)) * 8;
      if (r < L) *reinterpret_cast<uint4*>(obase + (t0 + r) * p.o_st + c8) = *reinterpret_cast<const uint4*>(ob + r * kTLD + c8);
    }
  };

  // S^T: rows j (the warp's 16 columns of S), 16 n8 tiles over i = 0..127.
  // Lane element (nn, e): j = gq + 8 (e >> 1), i = 8 nn + 2 tq + (e & 1).
  float st[16][4];
  {
    const float* h0 = p.h0 ? p.h0 + (n * p.HV + hv) * KV + v0 + j0 : nullptr;
#pragma unroll
    for (int nn = 0; nn < 16; ++nn)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        st[nn][e] = h0 ? h0[(int64_t)(8 * nn + 2 * tq + (e & 1)) * DV + gq + 8 * (e >> 1)] : 0.f;
  }
  AbsMaxH2 mS, mY, mD;  // F16 guard: largest |x| of the S, Y and D (and D') operands

  const int64_t bos = p.cu[n], eos = p.cu[n + 1];
  const int64_t c_beg = p.coff[n], c_end = p.coff[n + 1];
  if (c_beg < c_end) t_load(tbuf(smraw, (int)(c_beg & 1)), p, h, hv, v0, chunk_geo(c_beg, c_beg, bos, eos));
  cp_async_commit();
  for (int64_t c = c_beg; c < c_end; ++c) {
    const ChunkGeo g = chunk_geo(c, c_beg, bos, eos);
    const int L = g.L;
    const TBuf b = tbuf(smraw, (int)(c & 1));
    cp_async_wait<0>();
    __syncthreads();  // chunk c's operands landed; everyone is done with chunk c-1's buffer and o tile
    if (stage_o && c > c_beg) {
      const ChunkGeo gp = chunk_geo(c - 1, c_beg, bos, eos);
      flush_o(Ob + ((c - 1) & 1) * kVT, gp.t0, gp.L);
    }
    if (c + 1 < c_end) t_load(tbuf(smraw, (int)((c + 1) & 1)), p, h, hv, v0, chunk_geo(c + 1, c_beg, bos, eos));
    cp_async_commit();

    // X^T = S^T K^T and O1^T = S^T Q^T: A = S^T from registers, B = K / Q rows ([n][k] storage)
    float x[8][4], o[8][4];
    zero_acc(x);
    zero_acc(o);
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
    // Y^T as A fragments (k = chunk row r): v^T tiles by transposed ldmatrix land in the
    // accumulator layout (lane: rows j = gq, gq + 8; columns r = 8 nn + 2 tq, +1)
    uint32_t ya[4][4];
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      uint32_t va[4];
      ldsm_x4_t(va, b.V + at_off(kTLD, j0, 16 * kk, lane));
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const int nn = 2 * kk + u, r = 8 * nn + 2 * tq;
        const float2 fb = *reinterpret_cast<const float2*>(b.fb + r);
        const float2 fx = *reinterpret_cast<const float2*>(b.fx + r);
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const uint32_t vv = va[2 * u + hh];
          const float y0 = r < L ? fb.x * bf_lo(vv) - fx.x * x[nn][2 * hh] : 0.f;
          const float y1 = r + 1 < L ? fb.y * bf_hi(vv) - fx.y * x[nn][2 * hh + 1] : 0.f;
          ya[kk][2 * u + hh] = pack_h2(y0, y1);
          mY.add(ya[kk][2 * u + hh]);
        }
      }
    }
    // D^T = Y^T T^T (T[r'][r] = 0 for r's 16-block above r''s: skipped)
    float d[8][4];
    zero_acc(d);
    mma_lower_t(d, ya, b.T, lane);
    // D (rows >= L selected to 0) and D' = diag(dec) D as A fragments
    uint32_t da[4][4], dpa[4][4];
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const int nn = 2 * kk + u, r = 8 * nn + 2 * tq;
        const float2 dc = *reinterpret_cast<const float2*>(b.dec + r);
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const float d0 = r < L ? d[nn][2 * hh] : 0.f, d1 = r + 1 < L ? d[nn][2 * hh + 1] : 0.f;
          const float e0 = dc.x * d0, e1 = dc.y * d1;
          da[kk][2 * u + hh] = pack_h2(d0, d1);
          dpa[kk][2 * u + hh] = pack_h2(e0, e1);
          mD.add(da[kk][2 * u + hh]);
          mD.add(dpa[kk][2 * u + hh]);
        }
      }
    // O^T = O1^T diag(e^gam rsQ) + D^T P^T (P lower triangular including the diagonal)
#pragma unroll
    for (int nn = 0; nn < 8; ++nn) {
      const float2 fq = *reinterpret_cast<const float2*>(b.fq + 8 * nn + 2 * tq);
      o[nn][0] *= fq.x;
      o[nn][1] *= fq.y;
      o[nn][2] *= fq.x;
      o[nn][3] *= fq.y;
    }
    mma_lower_t(o, da, b.P, lane);
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
  }
  cp_async_wait<0>();
  if (stage_o && c_beg < c_end) {  // the last chunk's o tile
    __syncthreads();
    const ChunkGeo gp = chunk_geo(c_end - 1, c_beg, bos, eos);
    flush_o(Ob + ((c_end - 1) & 1) * kVT, gp.t0, gp.L);
  }
  if (p.ht) {
    float* ht = p.ht + (n * p.HV + hv) * KV + v0 + j0;
#pragma unroll
    for (int nn = 0; nn < 16; ++nn)
#pragma unroll
      for (int e = 0; e < 4; ++e) ht[(int64_t)(8 * nn + 2 * tq + (e & 1)) * DV + gq + 8 * (e >> 1)] = st[nn][e];
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

}  // namespace qrun::gdn::detail
