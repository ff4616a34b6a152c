// bf16 tensor-core helpers for the sequential kernels: mma.m16n8k16 (bf16 in, fp32 accumulate),
// ldmatrix fragment loads, and the two-plane bf16 split of fp32 values.
//
// Precision scheme ("bf16x2"): an fp32 value x is stored as two bf16 planes hi = bf16(x),
// lo = bf16(x - hi), so hi + lo carries 16 significant bits (relative representation error
// <= 2^-17). Products of a raw bf16 operand (k, q, v, dO: exact in bf16) with a split operand take
// 2 MMAs (raw*hi + raw*lo); products of two split operands take 3 (hi*hi + hi*lo + lo*hi; the
// dropped lo*lo term is <= 2^-18 relative). Accumulation is fp32 throughout, and the recurrent
// state itself stays fp32 in registers (only its MMA operand copy is split).
//
// Fast forward operands ("f16"): the forward's state kernel may instead take every operand
// as ONE fp16 plane (11 significant bits: 8x the precision of a plain bf16 operand, 1 MMA per
// product instead of 2 or 3). fp16's range is narrow (normal 2^-14..65504), so every fp16 operand
// matrix is range-checked as it is written (F16Guard): the launcher then reruns the forward on the
// bf16x2 path whenever any operand was outside the safe range (gated_delta.cu Note [f16 guard]).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace qrun::gdn::detail {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// x4 ldmatrix: lane l supplies the row address of matrix l/8, row l%8.
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
// x2: lanes 0-15 supply the row addresses of matrices 0 and 1 (the others' are ignored).
__device__ __forceinline__ void ldsm_x2_t(uint32_t (&r)[2], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_u32(p)));
}

__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mma_f16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Packs (x, y) as one fp16x2 word (x in the low half).
__device__ __forceinline__ uint32_t pack_h2(float x, float y) {
  __half2 h = __floats2half2_rn(x, y);
  return *reinterpret_cast<uint32_t*>(&h);
}

// Range check of one fp16 operand matrix (in the state kernel: all of one operand over a whole
// sequence). A matrix whose largest magnitude m is 0 or in [2^-12, 2^15) converts with
// per-element error <= 2^-12 |x| + 2^-25 <= 2^-12 |x| + 2^-13 m (fp16 subnormals, below 2^-14,
// keep an absolute 2^-25): no overflow, and a norm-wise error at the level of fp16's own
// rounding. Anything else (overflow, a matrix of tiny scale, inf/NaN) is reported.
__device__ __forceinline__ bool f16_range_ok(float m) {
  return m == 0.f || (m >= 0x1p-12f && m < 0x1p15f);
}
// Running largest magnitude of the values a thread converts. max.NaN keeps a NaN (so it fails
// the check too) and takes |x| as an operand modifier: one instruction per value. The warp
// reduction compares bit patterns: non-negative floats order like their bits, and the canonical
// NaN sorts above inf.
struct AbsMax {
  float m = 0.f;
  __device__ __forceinline__ void add(float x) {
    asm("max.NaN.f32 %0, %0, %1;" : "+f"(m) : "f"(fabsf(x)));
  }
  __device__ __forceinline__ float warp_max() const {
    return __uint_as_float(__reduce_max_sync(0xffffffffu, __float_as_uint(m)));
  }
};
// The same over fp16 pairs as packed for the MMAs (the state kernel's operands), one instruction
// per pair: max.xorsign.abs keeps, per half, the larger magnitude (its sign is meaningless here)
// and .NaN keeps a NaN. It sees the fp16-rounded values: an overflow shows as inf (>= 2^15, fails
// like before), and a value just below a bound may round onto it (2^15 fails; 2^-12 passes: the
// error bound above holds to within one fp16 ulp there).
struct AbsMaxH2 {
  uint32_t m = 0;
  __device__ __forceinline__ void add(uint32_t h2) {
    asm("max.NaN.xorsign.abs.f16x2 %0, %0, %1;" : "+r"(m) : "r"(h2));
  }
  __device__ __forceinline__ float warp_max() const {
    const __half2 h = *reinterpret_cast<const __half2*>(&m);
    const float a = fabsf(__low2float(h)), b = fabsf(__high2float(h));
    AbsMax f;
    f.add(a);
    f.add(b);
    return f.warp_max();
  }
};

// Packs (x, y) as bf16x2 (x in the low half) hi and lo planes.
__device__ __forceinline__ void split2(float x, float y, uint32_t& hi, uint32_t& lo) {
  __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
  const float2 hf = __bfloat1622float2(h);
  __nv_bfloat162 l = __floats2bfloat162_rn(x - hf.x, y - hf.y);
  hi = *reinterpret_cast<uint32_t*>(&h);
  lo = *reinterpret_cast<uint32_t*>(&l);
}

// ---- fragment addresses (element offsets into a bf16 plane) for lane l ----
// The row address lane l gives an ldmatrix.x4, as (row, column) of the stored matrix, for each
// fragment kind; el(row, column) is the plane layout's element offset (row-major, swizzled, ...),
// passed as a lambda (a function pointer changed the generated code; lambdas give the SASS of
// the hand-expanded forms, instruction for instruction).
// 16x16 A tile at (m0, k0) of a row-major [m][k] matrix (ldsm_x4):
template <class El>
__device__ __forceinline__ int frag_a(El el, int m0, int k0, int l) {
  return el(m0 + (l & 7) + ((l >> 3) & 1) * 8, k0 + (l >> 4) * 8);
}
// 16x16 A tile at (m0, k0) of A = M^T where M is stored [k][m] (ldsm_x4_t):
template <class El>
__device__ __forceinline__ int frag_at(El el, int m0, int k0, int l) {
  return el(k0 + (l & 7) + (l >> 4) * 8, m0 + ((l >> 3) & 1) * 8);
}
// B (16 x 16 = two n8 tiles) at (k0, n0) of a matrix stored [k][n] (ldsm_x4_t):
// r[0], r[1] = tile n0; r[2], r[3] = tile n0 + 8.
template <class El>
__device__ __forceinline__ int frag_b(El el, int k0, int n0, int l) {
  return el(k0 + (l & 7) + ((l >> 3) & 1) * 8, n0 + (l >> 4) * 8);
}
// B (16 x 16 = two n8 tiles) at (k0, n0) of B where B^T is stored [n][k] (ldsm_x4):
// r[0], r[1] = tile n0; r[2], r[3] = tile n0 + 8.
template <class El>
__device__ __forceinline__ int frag_bn(El el, int k0, int n0, int l) {
  return el(n0 + (l & 7) + (l >> 4) * 8, k0 + ((l >> 3) & 1) * 8);
}

// Plain row-major [rows][ld] planes.
__device__ __forceinline__ int a_off(int ld, int m0, int k0, int l) {
  return frag_a([ld](int r, int c) { return r * ld + c; }, m0, k0, l);
}
__device__ __forceinline__ int at_off(int ld, int m0, int k0, int l) {
  return frag_at([ld](int r, int c) { return r * ld + c; }, m0, k0, l);
}
__device__ __forceinline__ int b_off(int ld, int k0, int n0, int l) {
  return frag_b([ld](int r, int c) { return r * ld + c; }, k0, n0, l);
}
__device__ __forceinline__ int bn_off(int ld, int k0, int n0, int l) {
  return frag_bn([ld](int r, int c) { return r * ld + c; }, k0, n0, l);
}

// acc (a 16 x 8*NT tile at (m0, n0), NT even) += A[m0:m0+16, :KD] * B[n0:n0+8NT, :KD]^T with A and
// B raw bf16 matrices of one layout el(row, column) (element offsets). Products of bf16 values are
// exact in fp32, so this is the exact raw x raw product (KK^T, QK^T) with fp32 accumulation.
template <int NT, int KD, class El>
__device__ __forceinline__ void mma_rows(float (&acc)[NT][4], const __nv_bfloat16* A, int m0, const __nv_bfloat16* B,
                                         int n0, El el) {
  static_assert(NT % 2 == 0 && KD % 16 == 0, "tile shape");
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int k0 = 0; k0 < KD; k0 += 16) {
    uint32_t a[4];
    ldsm_x4(a, A + frag_a(el, m0, k0, lane));
#pragma unroll
    for (int nh = 0; nh < NT / 2; ++nh) {
      uint32_t b[4];
      ldsm_x4(b, B + frag_bn(el, k0, n0 + 16 * nh, lane));
      mma_bf16(acc[2 * nh], a, b[0], b[1]);
      mma_bf16(acc[2 * nh + 1], a, b[2], b[3]);
    }
  }
}
// The same on row-major [rows][LD] matrices (not swizzled; LD*2 bytes a multiple of 16 and not of
// 128, e.g. 136 elements, keeps the 8 row addresses of an ldmatrix in distinct banks).
template <int NT, int KD, int LD>
__device__ __forceinline__ void mma_raw_rows(float (&acc)[NT][4], const __nv_bfloat16* A, int m0,
                                             const __nv_bfloat16* B, int n0) {
  mma_rows<NT, KD>(acc, A, m0, B, n0, [](int r, int c) { return r * LD + c; });
}

// 128-byte-swizzled planes (rows of a multiple of 64 bf16; 16-byte chunk index XOR (row & 7)):
// conflict-free ldmatrix without padding. Element (r, c) with c a multiple of 8:
template <int LD>
__device__ __forceinline__ int swz(int r, int c) {
  return r * LD + ((((c >> 3) ^ r) & 7) | ((c >> 3) & ~7)) * 8;
}
template <int LD>
__device__ __forceinline__ int a_off_sw(int m0, int k0, int l) {
  return frag_a([](int r, int c) { return swz<LD>(r, c); }, m0, k0, l);
}
template <int LD>
__device__ __forceinline__ int at_off_sw(int m0, int k0, int l) {
  return frag_at([](int r, int c) { return swz<LD>(r, c); }, m0, k0, l);
}
// B operand offsets in a swizzled plane: [k][n] storage (ldsm_x4_t) and [n][k] storage (ldsm_x4)
template <int LD>
__device__ __forceinline__ int b_off_sw(int k0, int n0, int l) {
  return frag_b([](int r, int c) { return swz<LD>(r, c); }, k0, n0, l);
}
template <int LD>
__device__ __forceinline__ int bn_off_sw(int k0, int n0, int l) {
  return frag_bn([](int r, int c) { return swz<LD>(r, c); }, k0, n0, l);
}
// element (r, c) of a swizzled plane, any c
template <int LD>
__device__ __forceinline__ int swz_el(int r, int c) {
  return swz<LD>(r, c & ~7) + (c & 7);
}

// Hint: fetch the 128-byte line holding p into L2 (no register or shared-memory destination), so
// that a later load of data needed one phase ahead does not pay the DRAM latency then.
__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
}

// A fragments (hi, lo) of the 16x16 tile at (m0, k0) of a hi/lo plane pair of a swizzled
// [64][64] bf16 matrix M (A = M, or A = M^T when A_T: transposed loads).
template <bool A_T>
__device__ __forceinline__ void ld_a_planes64(uint32_t (&ah)[4], uint32_t (&al)[4], const __nv_bfloat16* A,
                                              int m0, int k0, int lane) {
  if constexpr (A_T) {
    const int ao = at_off_sw<64>(m0, k0, lane);
    ldsm_x4_t(ah, A + ao);
    ldsm_x4_t(al, A + 64 * 64 + ao);
  } else {
    const int ao = a_off_sw<64>(m0, k0, lane);
    ldsm_x4(ah, A + ao);
    ldsm_x4(al, A + 64 * 64 + ao);
  }
}

// acc[2] (a 16 x 16 tile at (m0, n0)) += A * B over K = 64, both operands hi/lo plane pairs of
// swizzled [64][64] bf16 matrices (lo plane at +64*64), split x split = 3 MMAs per tile.
// A_T: A = M^T for the stored M (transposed loads); B_T: the stored matrix is B^T ([n][k]).
template <bool A_T, bool B_T>
__device__ __forceinline__ void mma_planes64(float (&acc)[2][4], const __nv_bfloat16* A, int m0,
                                             const __nv_bfloat16* B, int n0) {
  constexpr int PL = 64 * 64;
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int k0 = 0; k0 < 64; k0 += 16) {
    uint32_t ah[4], al[4], bh[4], bl[4];
    ld_a_planes64<A_T>(ah, al, A, m0, k0, lane);
    if constexpr (B_T) {
      const int bo = bn_off_sw<64>(k0, n0, lane);
      ldsm_x4(bh, B + bo);
      ldsm_x4(bl, B + PL + bo);
    } else {
      const int bo = b_off_sw<64>(k0, n0, lane);
      ldsm_x4_t(bh, B + bo);
      ldsm_x4_t(bl, B + PL + bo);
    }
#pragma unroll
    for (int t = 0; t < 2; ++t) {
      mma_bf16(acc[t], al, bh[2 * t], bh[2 * t + 1]);
      mma_bf16(acc[t], ah, bl[2 * t], bl[2 * t + 1]);
      mma_bf16(acc[t], ah, bh[2 * t], bh[2 * t + 1]);
    }
  }
}

// acc[4] (a 16 x 32 tile at (m0, n0)) += A * B over K = 64: A = hi/lo plane pair of a swizzled
// [64][64] bf16 matrix (A_T: its transpose), B = a raw bf16 [k][n] matrix of layout elb(row,
// column) (exact operand: 2 MMAs per tile).
template <bool A_T, class ElB>
__device__ __forceinline__ void mma_planes64_raw(float (&acc)[4][4], const __nv_bfloat16* A, int m0,
                                                 const __nv_bfloat16* B, int n0, ElB elb) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int k0 = 0; k0 < 64; k0 += 16) {
    uint32_t ah[4], al[4];
    ld_a_planes64<A_T>(ah, al, A, m0, k0, lane);
#pragma unroll
    for (int nh = 0; nh < 2; ++nh) {
      uint32_t b[4];
      ldsm_x4_t(b, B + frag_b(elb, k0, n0 + 16 * nh, lane));
#pragma unroll
      for (int t = 0; t < 2; ++t) {
        mma_bf16(acc[2 * nh + t], al, b[2 * t], b[2 * t + 1]);
        mma_bf16(acc[2 * nh + t], ah, b[2 * t], b[2 * t + 1]);
      }
    }
  }
}

// 16-byte async copy global -> shared; src_bytes = 0 zero-fills (src must still be a valid address).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
               "r"(src_bytes));
}
// The same, issued only where `on` (a predicated instruction, no branch: a branch around the
// copies made ptxas spill in bwd_chunk)
__device__ __forceinline__ void cp_async16_if(void* dst, const void* src, bool on) {
  asm volatile(
      "{\n\t.reg .pred q;\n\tsetp.ne.b32 q, %2, 0;\n\t@q cp.async.cg.shared.global [%0], [%1], 16;\n\t}\n" ::"r"(
          smem_u32(dst)),
      "l"(src), "r"((int)on));
}
// The same for data read once: L2 evicts it first (policy from l2_evict_first()).
__device__ __forceinline__ void cp_async16_once(void* dst, const void* src, int src_bytes, uint64_t pol) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(smem_u32(dst)), "l"(src),
               "r"(src_bytes), "l"(pol));
}
__device__ __forceinline__ uint64_t l2_evict_first() {
  uint64_t pol;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  return pol;
}
// 4-byte async copy global -> shared (row vectors); src_bytes = 0 zero-fills.
__device__ __forceinline__ void cp_async4(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
               "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }
// waits until at most N of this thread's committed groups are still in flight
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

}  // namespace qrun::gdn::detail
