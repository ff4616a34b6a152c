// GPU test of the wgmma wrappers (gdn_wgmma.cuh) in the ways the kernels use them, with the
// accumulators checked in the mma.m16n8 fragment layout the kernels rely on. Small integers make
// every product exact in bf16/fp16 and fp32, so the comparisons are exact. Exits 77 (skipped)
// without a GPU that runs sm_90a code.
// - gdn_bwd_chunk_kernel: four warpgroups, warpgroup g computing columns [8*NT*g, 8*NT*(g+1)) of
//   D[64][R] = A[64][32] B^T, A a swizzled [64][32] plane and B a swizzled [R][32] plane, both
//   through K-major descriptors (desc_rows, two k16 steps). And its V loop's form: every
//   warpgroup computing all 128 columns of D[64][128] = A B^T as two m64n64 halves (mma_ss_n64
//   into tiles 0-7 and 8-15, B rows 64.. 4096 bytes on), each warpgroup's copy checked.
// - gdn_state16t_kernel (the forward): one warpgroup, fp16 A from registers, B in the 128-byte
//   swizzle: a [2][128][64] region of two column blocks (rows 0-63 "K", 64-127 "Q"), read K-major
//   as X = A1 K^T and O = A1 Q^T (k = 128, both column blocks) and MN-major as S = A2 K (n = 128,
//   k = 64: rows of K). The same three forms in bf16 (N = 64 and 128), as the backward's
//   register-state recompute (gdn_rec16t_kernel) uses them.
// - gdn_bwd_chunk_kernel's WY part: four warpgroups, warpgroup g computing columns
//   [8*NT*g, 8*NT*(g+1)) of D[64][NB] = A[64][KD] B[KD][NB], both operands in the 128-byte
//   swizzle as the kernel keeps them (wg::el128 column blocks): A K-major or stored transposed
//   (MN-major), B stored as B^T (K-major) or as B (MN-major, each warpgroup starting inside a
//   128-byte row), through the kernel's descriptor helpers (k128, mn128).
// - the same kernel's dV: every warpgroup D[64][32] = T^T dDelta, A = T stored [64][64] in the
//   128-byte swizzle (MN-major), B = a 64-byte-swizzled [64][32] plane read MN-major (desc64_mn),
//   each warpgroup's copy checked.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "gdn_wgmma.cuh"

namespace wg = qrun::gdn::detail::wg;

namespace {
constexpr int M = 64, KD = 32;

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// Commits and waits for the warpgroup's MMAs, then writes its accumulator tile (columns
// [col0, col0 + 8*NT)) into D[64][ld] in the mma.m16n8 fragment layout, and marks the sm_90a
// path as run.
template <int NT>
__device__ void finish(float (&d)[NT][4], float* D, int ld, int* ran, int col0) {
  wg::commit();
  wg::wait<0>();
  wg::pin(d);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, w = warp & 3;
  for (int n = 0; n < NT; ++n)
    for (int e = 0; e < 4; ++e) {
      const int r = 16 * w + (lane >> 2) + 8 * (e >> 1), c = col0 + 8 * n + 2 * (lane & 3) + (e & 1);
      D[r * ld + c] = d[n][e];
    }
  if (threadIdx.x == 0) *ran = 1;
}
#endif

template <int NT, int R>
__global__ void wg_product(const float* A, const float* B, float* D, int* ran) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __shared__ __align__(1024) __nv_bfloat16 As[M * KD], Bs[R * KD];
  for (int i = threadIdx.x; i < M * KD; i += blockDim.x) As[wg::sw64(i / KD, i % KD)] = __float2bfloat16(A[i]);
  for (int i = threadIdx.x; i < R * KD; i += blockDim.x) Bs[wg::sw64(i / KD, i % KD)] = __float2bfloat16(B[i]);
  wg::fence_smem();
  __syncthreads();
  const int g = threadIdx.x >> 7;  // (the warpgroup)
  float d[NT][4] = {};
  const uint64_t db = wg::desc_rows(Bs, 8 * NT * g), da = wg::desc_rows(As, 0);
  wg::fence();
#pragma unroll
  for (int k = 0; k < KD / 16; ++k) wg::mma_ss(d, wg::desc_add(da, k * wg::kKStep), wg::desc_add(db, k * wg::kKStep));
  finish(d, D, R, ran, 8 * NT * g);
#endif
}

// The V loop's form: D[64][128] per warpgroup (warpgroup g writes its copy at D + g * 64 * 128)
__global__ void wg_product_halves(const float* A, const float* B, float* D, int* ran) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int R = 128;
  __shared__ __align__(1024) __nv_bfloat16 As[M * KD], Bs[R * KD];
  for (int i = threadIdx.x; i < M * KD; i += blockDim.x) As[wg::sw64(i / KD, i % KD)] = __float2bfloat16(A[i]);
  for (int i = threadIdx.x; i < R * KD; i += blockDim.x) Bs[wg::sw64(i / KD, i % KD)] = __float2bfloat16(B[i]);
  wg::fence_smem();
  __syncthreads();
  float d[16][4] = {};
  const uint64_t db = wg::desc_rows(Bs, 0), da = wg::desc_rows(As, 0);
  wg::fence();
#pragma unroll
  for (int k = 0; k < KD / 16; ++k) {
    wg::mma_ss_n64<0>(d, wg::desc_add(da, k * wg::kKStep), wg::desc_add(db, k * wg::kKStep));
    wg::mma_ss_n64<8>(d, wg::desc_add(da, k * wg::kKStep), wg::desc_add(db, k * wg::kKStep + 64 * 64));
  }
  finish(d, D + (threadIdx.x >> 7) * M * R, R, ran, 0);
#endif
}

// The WY-part forms (see the top): A stored [64][KD] (TA = 0) or [KD][64] (TA = 1, KD = 64),
// B stored [NB][KD] (TB = 0) or [KD][NB] (TB = 1, KD = 64), each in wg::el128 column blocks.
template <int NT, int TA, int TB, int KD, int NB>
__global__ void wg_wy_product(const float* A, const float* B, float* D, int* ran) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert((TA == 0 || KD == 64) && (TB == 0 || KD == 64) && 4 * 8 * NT == NB, "shapes");
  __shared__ __align__(1024) __nv_bfloat16 As[M * KD], Bs[NB * KD];
  for (int i = threadIdx.x; i < M * KD; i += blockDim.x) {
    const int m = i / KD, k = i % KD;
    As[TA ? wg::el128(k, m) : wg::el128(m, k)] = __float2bfloat16(A[i]);
  }
  for (int i = threadIdx.x; i < KD * NB; i += blockDim.x) {  // B[k][n]
    const int k = i / NB, n = i % NB;
    Bs[TB ? wg::el128(k, n) : (k >> 6) * NB * 64 + wg::el128(n, k & 63)] = __float2bfloat16(B[i]);
  }
  wg::fence_smem();
  __syncthreads();
  const int g = threadIdx.x >> 7;  // (the warpgroup)
  float d[NT][4] = {};
  const uint64_t da = TA ? wg::mn128(As, 0) : wg::k128(As, 0), db = TB ? wg::mn128(Bs, 8 * NT * g) : wg::k128(Bs, 8 * NT * g);
  wg::fence();
#pragma unroll
  for (int kk = 0; kk < KD / 16; ++kk)
    wg::mma_ss<TA, TB>(d, wg::desc_add(da, TA ? kk * wg::kMn128Step : wg::k128_step(kk)),
                       wg::desc_add(db, TB ? kk * wg::kMn128Step : wg::k128_step(kk)));
  finish(d, D, NB, ran, 8 * NT * g);
#endif
}

// The dV form (see the top): A = M^T for M stored [64][64] (el128), B[64][32] a sw64 plane.
__global__ void wg_dv_product(const float* A, const float* B, float* D, int* ran) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __shared__ __align__(1024) __nv_bfloat16 As[64 * 64], Bs[64 * 32];
  for (int i = threadIdx.x; i < 64 * 64; i += blockDim.x) As[wg::el128(i % 64, i / 64)] = __float2bfloat16(A[i]);  // A[m][k] at M[k][m]
  for (int i = threadIdx.x; i < 64 * 32; i += blockDim.x) Bs[wg::sw64(i / 32, i % 32)] = __float2bfloat16(B[i]);
  wg::fence_smem();
  __syncthreads();
  float d[4][4] = {};
  const uint64_t da = wg::mn128(As, 0), db = wg::desc64_mn(Bs);
  wg::fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
    wg::mma_ss<1, 1>(d, wg::desc_add(da, kk * wg::kMn128Step), wg::desc_add(db, kk * wg::kMn64Step));
  finish(d, D + (threadIdx.x >> 7) * 64 * 32, 32, ran, 0);
#endif
}

// Host <-> device copies of float vectors (device buffers of the same size).
float* to_device(const std::vector<float>& v) {
  float* d = nullptr;
  cudaMalloc(&d, v.size() * sizeof(float));
  cudaMemcpy(d, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice);
  return d;
}
std::vector<float> to_host_free(float* d, size_t n) {
  std::vector<float> v(n);
  cudaMemcpy(v.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost);
  cudaFree(d);
  return v;
}
// The kernel's "ran" flag: 1 when its sm_90a code path was compiled and ran.
int* ran_flag() {
  int* d = nullptr;
  cudaMalloc(&d, sizeof(int));
  cudaMemset(d, 0, sizeof(int));
  return d;
}
int read_flag_free(int* d) {
  int r = 0;
  cudaMemcpy(&r, d, sizeof(int), cudaMemcpyDeviceToHost);
  cudaFree(d);
  return r;
}

// The forward's three uses of the RS form on one [2][128][64] region Bm (see the top); BF: the
// same in bf16 (the backward's bf16x2 recompute, gdn_rec16t_kernel, uses these forms).
template <bool BF>
__device__ __forceinline__ uint16_t bits16(float x) {
  if constexpr (BF) return __bfloat16_as_ushort(__float2bfloat16_rn(x));
  else return __half_as_ushort(__float2half_rn(x));
}
template <bool BF>
__global__ void wg_rs_forward(const float* A1, const float* A2, const float* Bm, float* X, float* O, float* S, int* ran) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __shared__ __align__(1024) uint16_t Bs[2 * 128 * 64];
  for (int i = threadIdx.x; i < 128 * 128; i += blockDim.x) {
    const int r = i / 128, c = i % 128;
    Bs[(c >> 6) * 128 * 64 + (r << 6) + ((((c & 63) >> 3) ^ r) & 7) * 8 + (c & 7)] = bits16<BF>(Bm[i]);
  }
  wg::fence_smem();
  __syncthreads();
  const int lane = threadIdx.x & 31, m0 = 16 * (threadIdx.x >> 5) + (lane >> 2), k0 = 2 * (lane & 3);
  // A fragments of k-step kk (the mma.m16n8k16 layout) from a row-major [64][ld] matrix
  auto frag = [&](const float* A, int ld, int kk, uint32_t (&a)[4]) {
    for (int e = 0; e < 4; ++e) {
      const int r = m0 + 8 * (e & 1), c = 16 * kk + k0 + 8 * (e >> 1);
      a[e] = bits16<BF>(A[r * ld + c]) | (uint32_t)bits16<BF>(A[r * ld + c + 1]) << 16;
    }
  };
  uint32_t a1[8][4], a2[4][4];
  for (int kk = 0; kk < 8; ++kk) frag(A1, 128, kk, a1[kk]);
  for (int kk = 0; kk < 4; ++kk) frag(A2, 64, kk, a2[kk]);
  float x[8][4] = {}, o[8][4] = {}, st[16][4] = {};
  const uint64_t dK = wg::desc128_k(Bs), dQ = wg::desc128_k(Bs + 64 * 64), dKt = wg::desc128_mn(Bs, 128 * 64 * 2);
  wg::fence();
  for (int kk = 0; kk < 8; ++kk) {
    const uint32_t off = (kk >> 2) * 128 * 64 * 2 + (kk & 3) * 32;
    wg::mma_rs<8, 0, 0, BF>(x, a1[kk], wg::desc_add(dK, off));
    wg::mma_rs<8, 0, 0, BF>(o, a1[kk], wg::desc_add(dQ, off));
  }
  for (int kk = 0; kk < 4; ++kk) wg::mma_rs<16, 0, 1, BF>(st, a2[kk], wg::desc_add(dKt, kk * 16 * 128));
  wg::commit();
  wg::wait<0>();
  wg::pin(x);
  wg::pin(o);
  wg::pin(st);
  for (int n = 0; n < 16; ++n)
    for (int e = 0; e < 4; ++e) {
      const int r = m0 + 8 * (e >> 1), c = 8 * n + k0 + (e & 1);
      if (n < 8) {
        X[r * 64 + c] = x[n][e];
        O[r * 64 + c] = o[n][e];
      }
      S[r * 128 + c] = st[n][e];
    }
  if (threadIdx.x == 0) *ran = 1;
#endif
}

template <bool BF>
bool run_forward_case(std::mt19937& rng) {
  std::uniform_int_distribution<int> u(-4, 4);
  std::vector<float> a1(64 * 128), a2(64 * 64), bm(128 * 128);
  for (auto& x : a1) x = (float)u(rng);
  for (auto& x : a2) x = (float)u(rng);
  for (auto& x : bm) x = (float)u(rng);
  std::vector<float> rx(64 * 64, 0.f), ro(64 * 64, 0.f), rs(64 * 128, 0.f);
  for (int m = 0; m < 64; ++m) {
    for (int n = 0; n < 64; ++n)
      for (int k = 0; k < 128; ++k) {
        rx[m * 64 + n] += a1[m * 128 + k] * bm[n * 128 + k];
        ro[m * 64 + n] += a1[m * 128 + k] * bm[(64 + n) * 128 + k];
      }
    for (int n = 0; n < 128; ++n)
      for (int k = 0; k < 64; ++k) rs[m * 128 + n] += a2[m * 64 + k] * bm[k * 128 + n];
  }
  const std::vector<float> poison_x(rx.size(), NAN), poison_s(rs.size(), NAN);
  float *dA1 = to_device(a1), *dA2 = to_device(a2), *dB = to_device(bm);
  float *dX = to_device(poison_x), *dO = to_device(poison_x), *dS = to_device(poison_s);
  int* dran = ran_flag();
  wg_rs_forward<BF><<<1, 128>>>(dA1, dA2, dB, dX, dO, dS, dran);
  const cudaError_t err = cudaDeviceSynchronize();
  const std::vector<float> x = to_host_free(dX, rx.size()), o = to_host_free(dO, ro.size()),
                           st = to_host_free(dS, rs.size());
  const int ran = read_flag_free(dran);
  for (float* q : {dA1, dA2, dB}) cudaFree(q);
  int bx = 0, bo = 0, bs = 0;
  for (size_t i = 0; i < x.size(); ++i) bx += x[i] != rx[i];
  for (size_t i = 0; i < o.size(); ++i) bo += o[i] != ro[i];
  for (size_t i = 0; i < st.size(); ++i) bs += st[i] != rs[i];
  const bool ok = err == cudaSuccess && ran && bx == 0 && bo == 0 && bs == 0;
  std::printf("%s %s RS forms, 128-byte swizzle: K-major X %d, O %d, MN-major S %d elements differ%s%s\n",
              ok ? "ok  " : "FAIL", BF ? "bf16" : "fp16", bx, bo, bs, ran ? "" : " (the sm_90a code path was not compiled)",
              err == cudaSuccess ? "" : cudaGetErrorString(err));
  return ok;
}

// Runs launch(dA, dB, dD, ran) (one block), compares D with ref exactly and prints one line.
template <class Launch>
bool run_and_compare(const std::vector<float>& a, const std::vector<float>& b, const std::vector<float>& ref,
                     Launch launch, const char* label) {
  std::vector<float> d(ref.size(), NAN);
  float *dA = to_device(a), *dB = to_device(b), *dD = to_device(d);
  int* dran = ran_flag();
  launch(dA, dB, dD, dran);
  const cudaError_t err = cudaDeviceSynchronize();
  d = to_host_free(dD, d.size());
  const int ran = read_flag_free(dran);
  cudaFree(dA);
  cudaFree(dB);
  int bad = 0;
  for (size_t i = 0; i < d.size(); ++i) bad += d[i] != ref[i];
  const bool ok = err == cudaSuccess && ran && bad == 0;
  std::printf("%s %s: %d of %zu elements differ%s%s\n", ok ? "ok  " : "FAIL", label, bad, d.size(),
              ran ? "" : " (the sm_90a code path was not compiled)", err == cudaSuccess ? "" : cudaGetErrorString(err));
  return ok;
}

// Operands of small random integers (exact in bf16, and their sums in fp32): A [rows][kd], B stored
// [n][kd] (b_nk) or [kd][n], and the reference D = A B, `copies` times over (one per warpgroup that
// computes the whole product).
struct Operands {
  std::vector<float> a, b, ref;
};
Operands random_case(std::mt19937& rng, int rows, int n, int kd, bool b_nk, int copies = 1) {
  std::uniform_int_distribution<int> u(-4, 4);
  Operands o{std::vector<float>(rows * kd), std::vector<float>(n * kd), std::vector<float>(copies * rows * n, 0.f)};
  for (auto& x : o.a) x = (float)u(rng);
  for (auto& x : o.b) x = (float)u(rng);
  for (int m = 0; m < rows; ++m)
    for (int j = 0; j < n; ++j) {
      float s = 0.f;
      for (int k = 0; k < kd; ++k) s += o.a[m * kd + k] * o.b[b_nk ? j * kd + k : k * n + j];
      for (int g = 0; g < copies; ++g) o.ref[(g * rows + m) * n + j] = s;
    }
  return o;
}

template <int NT, int R>
bool run_case(std::mt19937& rng) {
  const Operands o = random_case(rng, M, R, KD, true);
  char label[96];
  std::snprintf(label, sizeof label, "m64n%d, B plane of %d rows, 4 warpgroups", 8 * NT, R);
  return run_and_compare(o.a, o.b, o.ref, [](float* dA, float* dB, float* dD, int* ran) { wg_product<NT, R><<<1, 512>>>(dA, dB, dD, ran); },
                         label);
}

bool run_halves_case(std::mt19937& rng) {
  const Operands o = random_case(rng, M, 128, KD, true, 4);
  return run_and_compare(o.a, o.b, o.ref, [](float* dA, float* dB, float* dD, int* ran) { wg_product_halves<<<1, 512>>>(dA, dB, dD, ran); },
                         "m64n64 x 2 halves, B plane of 128 rows, every warpgroup at full width (the V loop)");
}

bool run_dv_case(std::mt19937& rng) {
  const Operands o = random_case(rng, 64, 32, 64, false, 4);
  return run_and_compare(o.a, o.b, o.ref, [](float* dA, float* dB, float* dD, int* ran) { wg_dv_product<<<1, 512>>>(dA, dB, dD, ran); },
                         "m64n32, A MN-major (128-byte swizzle), B MN-major 64-byte swizzle, every warpgroup (dV)");
}

template <int NT, int TA, int TB, int KD, int NB>
bool run_wy_case(std::mt19937& rng, const char* what) {
  const Operands o = random_case(rng, M, NB, KD, false);
  char label[160];
  std::snprintf(label, sizeof label, "m64n%d, 128-byte swizzle, A %s, B %s, k = %d (%s)", 8 * NT,
                TA ? "MN-major" : "K-major", TB ? "MN-major" : "K-major", KD, what);
  return run_and_compare(
      o.a, o.b, o.ref, [](float* dA, float* dB, float* dD, int* ran) { wg_wy_product<NT, TA, TB, KD, NB><<<1, 512>>>(dA, dB, dD, ran); },
      label);
}
}  // namespace

int main() {
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    std::printf("SKIP: no CUDA device (the wgmma wrappers need an sm_90 GPU)\n");
    return 77;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  if (prop.major != 9) {
    std::printf("SKIP: device is sm_%d%d; wgmma needs sm_90\n", prop.major, prop.minor);
    return 77;
  }
  std::mt19937 rng(12345);
  bool ok = true;
  for (int rep = 0; rep < 3; ++rep) {
    // the wrappers at the WY part's widths on [128][32] and [64][32] planes; the V loop's form
    ok &= run_case<4, 128>(rng);
    ok &= run_case<2, 64>(rng);
    ok &= run_halves_case(rng);
    ok &= run_forward_case<false>(rng);
    ok &= run_forward_case<true>(rng);
    ok &= run_wy_case<2, 0, 0, 128, 64>(rng, "K K^T, Q K^T, dW K^T, dT T^T");
    ok &= run_wy_case<4, 0, 1, 64, 128>(rng, "Pg K, Gsym K");
    ok &= run_wy_case<4, 1, 1, 64, 128>(rng, "Pg^T Q, T^T dW");
    ok &= run_wy_case<2, 1, 1, 64, 64>(rng, "T^T M1");
    ok &= run_dv_case(rng);
  }
  std::printf("%s\n", ok ? "all wgmma products exact" : "wgmma test FAILED");
  return ok ? 0 : 1;
}
