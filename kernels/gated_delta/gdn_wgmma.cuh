// Hopper warpgroup MMA (wgmma.mma_async, sm_90a only), fp32 accumulators in registers:
// - the backward's chunk kernel: bf16 A and B from shared memory (64-byte swizzle, below);
// - the fast forward's register-state kernel: fp16 A from registers (the state), B from shared
//   memory with the 128-byte swizzle, K-major or MN-major (further below).
// Hand-written PTX wrappers: CUTLASS/CuTe would bring a large header dependency for a handful of
// instructions and one descriptor format (the kernels build with nvcc alone); test_gdn_wgmma
// checks every form used here against a CPU product, exactly.
//
// Operand layout: K-major planes of 32 bf16 columns with the 64-byte swizzle. Rows are dense
// (64 B, as in global memory); the 16-byte chunk j of row r lies at chunk j ^ ((r >> 1) & 3),
// i.e. address bits [4,6) ^= bits [7,9). The hardware applies the XOR to absolute shared-memory
// addresses, so every plane must start on a 512-byte boundary (one 8-row swizzle atom). ldmatrix's
// 8 row addresses of one 8x8 matrix, and a quarter warp's 16-byte copies of two whole rows, are
// then free of bank conflicts. (The unswizzled "interleaved" core-matrix layout measured 0.35 ms
// slower in the backward, docs/PERF.md.)
#pragma once
#include <cstdint>

#include "gdn_mma16.cuh"

namespace qrun::gdn::detail::wg {

// element offset of (r, c) in a swizzled [rows][32] plane
__host__ __device__ __forceinline__ int sw64(int r, int c) {
  return (r << 5) + ((((c >> 3) ^ (r >> 1)) & 3) << 3) + (c & 7);
}
// bytes between the two k16 steps of a plane (16 columns of the same rows)
constexpr uint32_t kKStep = 32;
// ldmatrix row addresses (element offsets, lane l) of the mma fragments in a swizzled plane:
// A (16 x 16 at (m0, k0), rows = M, ldsm_x4), B stored [n][k] (two n8 tiles at (k0, n0), ldsm_x4)
// and B stored [k][n] (two n8 tiles at (k0, n0), ldsm_x4_t).
struct Sw64El {  // (sw64 as the layout argument of the frag_* mappings)
  __device__ __forceinline__ int operator()(int r, int c) const { return sw64(r, c); }
};
__device__ __forceinline__ int a_off(int m0, int k0, int l) { return frag_a(Sw64El{}, m0, k0, l); }
__device__ __forceinline__ int bn_off(int k0, int n0, int l) { return frag_bn(Sw64El{}, k0, n0, l); }
__device__ __forceinline__ int b_off(int k0, int n0, int l) { return frag_b(Sw64El{}, k0, n0, l); }

// Matrix descriptor: start address, LBO, SBO (bytes; 16-byte units in the descriptor), no swizzle.
__device__ __forceinline__ uint64_t desc(const void* smem, uint32_t lbo, uint32_t sbo) {
  const uint32_t a = smem_u32(smem);
  return (uint64_t)((a & 0x3FFFF) >> 4) | ((uint64_t)((lbo & 0x3FFFF) >> 4) << 16) |
         ((uint64_t)((sbo & 0x3FFFF) >> 4) << 32);
}
// The K-major descriptor of the tile that starts at row r0 of a swizzled plane (r0 a multiple of
// 8): LBO unused (the 32 columns fit one atom; 16 by convention), SBO = 512 B between 8-row
// groups, layout type 2 (64-byte swizzle) in bits 62-63.
__device__ __forceinline__ uint64_t desc_rows(const __nv_bfloat16* plane, int r0) {
  return desc(plane + 32 * r0, 16, 512) | (2ull << 62);
}
// The same operand advanced by `bytes` (k steps, other planes: 16-byte aligned offsets). Only the
// low word changes: the start address field (bits 0-13, address >> 4) cannot carry out of it for
// shared memory below 256 KB, so a 32-bit add does (a 64-bit add would cost two instructions).
__device__ __forceinline__ uint64_t desc_add(uint64_t d, uint32_t bytes) {
  return (d & 0xFFFFFFFF00000000ull) | (uint32_t)((uint32_t)d + (bytes >> 4));
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || !defined(__CUDA_ARCH__)
// wgmma.fence: before the first MMA, and between a thread's own writes of A fragment or
// accumulator registers and an MMA that reads them.
__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Generic-proxy writes to shared memory (st.shared, cp.async) become visible to wgmma's (async
// proxy) reads only after this fence in the writing thread, then a barrier.
__device__ __forceinline__ void fence_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Ties accumulator registers to this point: after wait<>(), so that the compiler reads them only
// once the asynchronous MMAs have written them.
template <int NT>
__device__ __forceinline__ void pin(float (&d)[NT][4]) {
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[n][e])::"memory");
}
// ... and before wgmma::fence: ties the thread's own writes of accumulator and A fragment
// registers to that point, so that the compiler cannot sink them past the fence (it would then
// have to serialize the MMAs).
template <int NT>
__device__ __forceinline__ void pin(uint32_t (&a)[NT][4]) {
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(a[n][e])::"memory");
}

// D[64][8*NT] += A[64][16] B[16][8*NT] (bf16 x bf16 -> fp32), A and B in shared memory
// (descriptors da, db), K-major by default; TA = 1: A MN-major (stored as its transpose, rows k),
// TB = 1: B MN-major (stored rows k, n contiguous). Accumulator layout (warp w of the warpgroup):
// n8 tile n, element e at row 16w + lane/4 + 8*(e>>1), column 8n + 2*(lane%4) + (e&1), i.e. the
// mma.m16n8 C fragment of each n8 tile, so the accumulators are the fragments an mma.sync form of
// the product builds.
template <int TA = 0, int TB = 0>
__device__ __forceinline__ void mma_ss(float (&d)[2][4], uint64_t da, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, %11, %12;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3])
      : "l"(da), "l"(db), "r"(1), "n"(TA), "n"(TB));
}
template <int TA = 0, int TB = 0>
__device__ __forceinline__ void mma_ss(float (&d)[4][4], uint64_t da, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "%16, %17, p, 1, 1, %19, %20;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
      : "l"(da), "l"(db), "r"(1), "n"(TA), "n"(TB));
}
// The same at N = 64 into accumulator tiles O..O+7 of d, K-major operands (the backward's V
// loop: one product per warpgroup, at full width in two halves; m64n128 there made ptxas
// serialise the MMAs for want of registers, C7511).
#define GDN_WG_D(i) "+f"(d[O + i][0]), "+f"(d[O + i][1]), "+f"(d[O + i][2]), "+f"(d[O + i][3])
template <int O, int NTOT>
__device__ __forceinline__ void mma_ss_n64(float (&d)[NTOT][4], uint64_t da, uint64_t db) {
  static_assert(O >= 0 && O + 8 <= NTOT, "accumulator tiles");
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      " %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "%32, %33, p, 1, 1, 0, 0;\n}\n"
      : GDN_WG_D(0), GDN_WG_D(1), GDN_WG_D(2), GDN_WG_D(3), GDN_WG_D(4), GDN_WG_D(5), GDN_WG_D(6), GDN_WG_D(7)
      : "l"(da), "l"(db), "r"(1));
}
#undef GDN_WG_D
#endif

// ---- 128-byte swizzle, A from registers (the register-state kernels: fp16; N = 64 and 128 also bf16) ----
// Operand tiles of 64-element (128-byte) rows, the 16-byte chunk j of row r at chunk j ^ (r & 7)
// (swz<64> of gdn_mma16.cuh), every tile on a 1024-byte boundary (one 8-row swizzle atom). A
// wider matrix is a sequence of such [rows][64] tiles ("column blocks"). One tile serves both
// operand orientations:
// - K-major B (B[k][n] stored as rows n, k contiguous): 8-row groups 1024 B apart; a k16 step is
//   +32 B inside the row, a column block further is the next tile.
// - MN-major B (B[k][n] stored as rows k, n contiguous; the transposing form): 8-row groups along
//   k 1024 B apart (SBO), column blocks of 64 n `lbo` bytes apart (LBO).
__device__ __forceinline__ uint64_t desc128_k(const void* tile) { return desc(tile, 16, 1024) | (1ull << 62); }
__device__ __forceinline__ uint64_t desc128_mn(const void* tile, uint32_t lbo) {
  return desc(tile, lbo, 1024) | (1ull << 62);
}

// Matrices of 64 rows in 128-byte-swizzled column blocks ([64][64] tiles, kTile128 bytes apart;
// the backward's chunk kernel keeps its q/k tiles and WY planes so): the element offset of (r, c),
// and the shared-memory operands the kernel reads from them, each with the byte offset of its
// k16 step kk (descriptor + offset: desc_add).
constexpr uint32_t kTile128 = 64 * 64 * 2;
__host__ __device__ __forceinline__ int el128(int r, int c) {
  return (c >> 6) * 64 * 64 + r * 64 + ((((c >> 3) ^ r) & 7) << 3) + (c & 7);
}
// K-major operand: rows r0.. (a multiple of 8) of the matrix, k along its columns (all blocks).
__device__ __forceinline__ uint64_t k128(const void* m, int r0) {
  return desc128_k(static_cast<const char*>(m) + r0 * 128);
}
__host__ __device__ constexpr uint32_t k128_step(int kk) { return (kk >> 2) * kTile128 + (kk & 3) * 32; }
// MN-major operand: columns n0.. (a multiple of 8; n0 % 64 + the operand's width <= 64) of the
// matrix, k along its 64 rows. The start inside a 128-byte row is fine: the hardware swizzles
// absolute addresses (test_gdn_wgmma checks these forms).
__device__ __forceinline__ uint64_t mn128(const void* m, int n0) {
  return desc128_mn(static_cast<const char*>(m) + (n0 >> 6) * kTile128 + (n0 & 63) * 2, kTile128);
}
constexpr uint32_t kMn128Step = 16 * 128;
// MN-major operand from a 64-byte-swizzled [rows][32] plane (sw64 above: B[k][n] stored as rows k,
// the 32 n contiguous; one swizzle atom wide, so N <= 32 and LBO unused): 8-row groups along k
// 512 B apart (SBO), layout type 2. A k16 step is 16 rows further. (The backward's dV: B = dDelta.)
__device__ __forceinline__ uint64_t desc64_mn(const __nv_bfloat16* plane) { return desc(plane, 16, 512) | (2ull << 62); }
constexpr uint32_t kMn64Step = 16 * 64;

#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || !defined(__CUDA_ARCH__)
// D[64][8 NT] (accumulator tiles O..O+NT-1 of d) += A[64][16] B[16][8 NT], fp16 x fp16 -> fp32.
// A from registers: warp w of the warpgroup holds rows 16w..16w+15 as the mma.m16n8k16 A
// fragment. B through descriptor db, MN-major when TB = 1. The accumulator layout is that of
// mma_ss above. (Generated: one instruction form per N.)
#define GDN_WG_D(i) "+f"(d[O + i][0]), "+f"(d[O + i][1]), "+f"(d[O + i][2]), "+f"(d[O + i][3])
template <int O, int TB, int NTOT>
__device__ __forceinline__ void mma_rs_n16(float (&d)[NTOT][4], const uint32_t (&a)[4], uint64_t db) {
  static_assert(O >= 0 && O + 2 <= NTOT, "accumulator tiles");
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %14, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7}, "
      "{%8, %9, %10, %11}, %12, p, 1, 1, %13;\n}\n"
      : GDN_WG_D(0), GDN_WG_D(1)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "n"(TB), "r"(1));
}
template <int O, int TB, int NTOT>
__device__ __forceinline__ void mma_rs_n32(float (&d)[NTOT][4], const uint32_t (&a)[4], uint64_t db) {
  static_assert(O >= 0 && O + 4 <= NTOT, "accumulator tiles");
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %22, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "{%16, %17, %18, %19}, %20, p, 1, 1, %21;\n}\n"
      : GDN_WG_D(0), GDN_WG_D(1), GDN_WG_D(2), GDN_WG_D(3)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "n"(TB), "r"(1));
}
template <int O, int TB, int NTOT>
__device__ __forceinline__ void mma_rs_n48(float (&d)[NTOT][4], const uint32_t (&a)[4], uint64_t db) {
  static_assert(O >= 0 && O + 6 <= NTOT, "accumulator tiles");
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %30, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n48k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      " %16, %17, %18, %19, %20, %21, %22, %23}, "
      "{%24, %25, %26, %27}, %28, p, 1, 1, %29;\n}\n"
      : GDN_WG_D(0), GDN_WG_D(1), GDN_WG_D(2), GDN_WG_D(3), GDN_WG_D(4), GDN_WG_D(5)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "n"(TB), "r"(1));
}
// (N = 64 and 128 also in bf16 x bf16, BF: the backward's bf16x2 recompute)
#define GDN_WG_RS_N64(TY)                                                                                  \
  asm volatile(                                                                                            \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %38, 0;\n"                                                          \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY " "                                                 \
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"                              \
      " %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "                  \
      "{%32, %33, %34, %35}, %36, p, 1, 1, %37;\n}\n"                                                       \
      : GDN_WG_D(0), GDN_WG_D(1), GDN_WG_D(2), GDN_WG_D(3), GDN_WG_D(4), GDN_WG_D(5), GDN_WG_D(6), GDN_WG_D(7) \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "n"(TB), "r"(1))
template <int O, int TB, bool BF, int NTOT>
__device__ __forceinline__ void mma_rs_n64(float (&d)[NTOT][4], const uint32_t (&a)[4], uint64_t db) {
  static_assert(O >= 0 && O + 8 <= NTOT, "accumulator tiles");
  if constexpr (BF) GDN_WG_RS_N64("bf16.bf16");
  else GDN_WG_RS_N64("f16.f16");
}
#undef GDN_WG_RS_N64
#define GDN_WG_RS_N128(TY)                                                                                 \
  asm volatile(                                                                                            \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %70, 0;\n"                                                          \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY " "                                                \
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"                              \
      " %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"                    \
      " %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"                    \
      " %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "                  \
      "{%64, %65, %66, %67}, %68, p, 1, 1, %69;\n}\n"                                                       \
      : GDN_WG_D(0), GDN_WG_D(1), GDN_WG_D(2), GDN_WG_D(3), GDN_WG_D(4), GDN_WG_D(5), GDN_WG_D(6),         \
        GDN_WG_D(7), GDN_WG_D(8), GDN_WG_D(9), GDN_WG_D(10), GDN_WG_D(11), GDN_WG_D(12), GDN_WG_D(13),     \
        GDN_WG_D(14), GDN_WG_D(15)                                                                         \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "n"(TB), "r"(1))
template <int O, int TB, bool BF, int NTOT>
__device__ __forceinline__ void mma_rs_n128(float (&d)[NTOT][4], const uint32_t (&a)[4], uint64_t db) {
  static_assert(O >= 0 && O + 16 <= NTOT, "accumulator tiles");
  if constexpr (BF) GDN_WG_RS_N128("bf16.bf16");
  else GDN_WG_RS_N128("f16.f16");
}
#undef GDN_WG_RS_N128
#undef GDN_WG_D
// BF: bf16 A and B (N = 64 and 128 only), else fp16.
template <int NT, int O, int TB, bool BF = false, int NTOT>
__device__ __forceinline__ void mma_rs(float (&d)[NTOT][4], const uint32_t (&a)[4], uint64_t db) {
  static_assert(!BF || NT == 8 || NT == 16, "bf16 forms: N of 64 or 128");
  if constexpr (NT == 2) mma_rs_n16<O, TB>(d, a, db);
  else if constexpr (NT == 4) mma_rs_n32<O, TB>(d, a, db);
  else if constexpr (NT == 6) mma_rs_n48<O, TB>(d, a, db);
  else if constexpr (NT == 8) mma_rs_n64<O, TB, BF>(d, a, db);
  else if constexpr (NT == 16) mma_rs_n128<O, TB, BF>(d, a, db);
  else static_assert(NT == 2, "N of 16, 32, 48, 64 or 128");
}
#endif

}  // namespace qrun::gdn::detail::wg
