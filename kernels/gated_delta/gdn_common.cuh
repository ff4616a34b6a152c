// Shared device helpers for the gated delta kernels: 3xTF32 warp MMA on shared-memory operands,
// fragment iteration, loads/stores of bf16/fp32 scalars. (bf16 tensor-core helpers: gdn_mma16.cuh)
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace qrun::gdn::detail {

// Debug aid, off by default (build with -DQRUN_GDN_PHASES): thread 0 of every block adds the
// clock64 cycles since its previous mark to a per-phase counter of the translation unit; bench
// prints the split (gdn_debug_phases_*). Thread 0 passes every barrier, so a phase includes the
// waits of the block's slowest warp.
#ifdef QRUN_GDN_PHASES
#define GDN_PH_DECL static __device__ unsigned long long gdn_phase_clk[32];
#define GDN_PH_START long long gdn_ph_t_ = clock64();
#define GDN_PH(n)                                                                       \
  do {                                                                                  \
    if (threadIdx.x == 0) {                                                             \
      const long long t_ = clock64();                                                   \
      atomicAdd(&gdn_phase_clk[n], (unsigned long long)(t_ - gdn_ph_t_));              \
      gdn_ph_t_ = t_;                                                                   \
    }                                                                                   \
  } while (0)
#define GDN_PH_HOST(name)                                                               \
  void name(unsigned long long* out) {                                                  \
    static const unsigned long long zero[32] = {};                                      \
    if (out) cudaMemcpyFromSymbol(out, gdn_phase_clk, sizeof(zero));                    \
    else cudaMemcpyToSymbol(gdn_phase_clk, zero, sizeof(zero));                         \
  }
#else
#define GDN_PH_DECL
#define GDN_PH_START
#define GDN_PH(n) do {} while (0)
#define GDN_PH_HOST(name)
#endif

constexpr int C = 64;     // chunk
constexpr int DK = 128;   // K
constexpr int DV = 128;   // V
constexpr int BV = 32;    // V slice of the sequential kernels
constexpr int NVS = DV / BV;
constexpr int LDK = DK + 4;   // smem row strides (floats)
constexpr int LDC = C + 4;
constexpr int LDV = BV + 4;

__device__ __forceinline__ uint32_t to_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}
__device__ __forceinline__ void split_tf32(float x, uint32_t& hi, uint32_t& lo) {
  hi = to_tf32(x);
  lo = to_tf32(x - __uint_as_float(hi));
}
__device__ __forceinline__ void mma_tf32(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// acc (a 16 x 8*NT8 tile, mma.m16n8 C-fragment layout) += A(16 x KD) * B(KD x 8*NT8) as 3xTF32
// (fp32 operands split into two TF32 halves, low*low dropped). A(m, k) and B(k, n) are callables
// returning fp32 (normally shared-memory reads) with tile-local indices. KD must be a multiple of
// 8. AX / BX: the A / B values are exactly representable in TF32 (e.g. raw bf16 inputs), so their
// low split part is zero and its MMA is skipped. The kernels call it only with raw
// operands (KK^T, QK^T: one exact TF32 MMA per tile); everything else runs on bf16 planes
// (gdn_mma16.cuh).
template <int NT8, int KD, bool AX = false, bool BX = false, class FA, class FB>
__device__ __forceinline__ void warp_mma(float (&acc)[NT8][4], FA A, FB B) {
  const int lane = threadIdx.x & 31, gq = lane >> 2, tq = lane & 3;
#pragma unroll 2
  for (int k0 = 0; k0 < KD; k0 += 8) {
    uint32_t ah[4], al[4];
    if constexpr (AX) {
      ah[0] = to_tf32(A(gq, k0 + tq));
      ah[1] = to_tf32(A(gq + 8, k0 + tq));
      ah[2] = to_tf32(A(gq, k0 + tq + 4));
      ah[3] = to_tf32(A(gq + 8, k0 + tq + 4));
    } else {
      split_tf32(A(gq, k0 + tq), ah[0], al[0]);
      split_tf32(A(gq + 8, k0 + tq), ah[1], al[1]);
      split_tf32(A(gq, k0 + tq + 4), ah[2], al[2]);
      split_tf32(A(gq + 8, k0 + tq + 4), ah[3], al[3]);
    }
#pragma unroll
    for (int n = 0; n < NT8; ++n) {
      uint32_t bh0, bl0 = 0, bh1, bl1 = 0;
      if constexpr (BX) {
        bh0 = to_tf32(B(k0 + tq, n * 8 + gq));
        bh1 = to_tf32(B(k0 + tq + 4, n * 8 + gq));
      } else {
        split_tf32(B(k0 + tq, n * 8 + gq), bh0, bl0);
        split_tf32(B(k0 + tq + 4, n * 8 + gq), bh1, bl1);
      }
      if constexpr (!AX) mma_tf32(acc[n], al, bh0, bh1);
      if constexpr (!BX) mma_tf32(acc[n], ah, bl0, bl1);
      mma_tf32(acc[n], ah, bh0, bh1);
    }
  }
}

template <int NT8>
__device__ __forceinline__ void zero_acc(float (&acc)[NT8][4]) {
#pragma unroll
  for (int n = 0; n < NT8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[n][e] = 0.f;
}

// Calls f(row, col, value&) for every accumulator element of the calling lane (tile-local).
template <int NT8, class F>
__device__ __forceinline__ void for_frag(float (&acc)[NT8][4], F f) {
  const int lane = threadIdx.x & 31, gq = lane >> 2, tq = lane & 3;
#pragma unroll
  for (int n = 0; n < NT8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) f(gq + ((e >> 1) << 3), n * 8 + 2 * tq + (e & 1), acc[n][e]);
}

// Calls g(row, col, n, hh) for each of the lane's element pairs of a warp's m16 x (8*NT)
// accumulator tile at (r0, c0): acc[n][2hh], acc[n][2hh+1] sit at (row, col), (row, col + 1).
template <int NT, class G>
__device__ __forceinline__ void for_pairs(int r0, int c0, G g) {
  const int lane = threadIdx.x & 31, gq = lane >> 2, tq = lane & 3;
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) g(r0 + gq + 8 * hh, c0 + n * 8 + 2 * tq, n, hh);
}

// Row sums of (acc .* X(row, col)) over the tile's columns: returns the sums for rows gq and gq+8
// reduced over the 4 lanes of the quad (every lane of the quad gets the result).
template <int NT8, class FX>
__device__ __forceinline__ void frag_rowdot(float (&acc)[NT8][4], FX X, float& r0, float& r1) {
  const int lane = threadIdx.x & 31, gq = lane >> 2, tq = lane & 3;
  r0 = 0.f; r1 = 0.f;
#pragma unroll
  for (int n = 0; n < NT8; ++n) {
    const int c = n * 8 + 2 * tq;
    r0 += acc[n][0] * X(gq, c) + acc[n][1] * X(gq, c + 1);
    r1 += acc[n][2] * X(gq + 8, c) + acc[n][3] * X(gq + 8, c + 1);
  }
  r0 += __shfl_xor_sync(0xffffffffu, r0, 1);
  r0 += __shfl_xor_sync(0xffffffffu, r0, 2);
  r1 += __shfl_xor_sync(0xffffffffu, r1, 1);
  r1 += __shfl_xor_sync(0xffffffffu, r1, 2);
}

__device__ __forceinline__ void st_any(void* p, int dtype, int64_t i, float v) {
  if (dtype == 1)
    static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
  else
    static_cast<float*>(p)[i] = v;
}

// Stores a warp's m16 x (8*NT8) fp32 accumulator tile at rows r0.., columns c0.. of a gradient
// matrix whose element (r, c) is base[off + r * st + c] (dtype 1: bf16, 0: fp32): as element
// pairs when `pair` (pointer, strides and off allow 4- or 8-byte stores), else one element at a
// time; rows >= L are skipped.
template <int NT8>
__device__ __forceinline__ void store_grad_rows(void* base, int dtype, int64_t off, int64_t st,
                                                const float (&acc)[NT8][4], int r0, int c0, int L, bool pair) {
  const int lane = threadIdx.x & 31, gq = lane >> 2, tq = lane & 3;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int r = r0 + gq + 8 * hh;
    if (r >= L) continue;
#pragma unroll
    for (int n = 0; n < NT8; ++n) {
      const int64_t o = off + r * st + c0 + n * 8 + 2 * tq;
      const float x0 = acc[n][2 * hh], x1 = acc[n][2 * hh + 1];
      if (pair && dtype == 1) {
        *reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(base) + o) = __floats2bfloat162_rn(x0, x1);
      } else if (pair) {
        *reinterpret_cast<float2*>(static_cast<float*>(base) + o) = make_float2(x0, x1);
      } else {
        st_any(base, dtype, o, x0);
        st_any(base, dtype, o + 1, x1);
      }
    }
  }
}

__device__ __forceinline__ float ld_bf16(const void* p, int64_t i) {
  return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
}
__device__ __forceinline__ float ld_any(const void* p, int dtype, int64_t i) {
  return dtype == 1 ? ld_bf16(p, i) : static_cast<const float*>(p)[i];
}

}  // namespace qrun::gdn::detail
