// GPU test of the wgmma wrappers (gdn_wgmma.cuh) in the way gdn_bwd_chunk_kernel uses them: four
// warpgroups, warpgroup g computing columns [8*NT*g, 8*NT*(g+1)) of D[64][R] = A[64][32] B^T, with
// A a swizzled [64][32] plane and B a swizzled [R][32] plane, both read through K-major
// descriptors (desc_rows, two k16 steps). The accumulators are checked in the mma.m16n8 fragment
// layout the kernel relies on. Small integers make every product exact in bf16 and fp32, so the
// comparison is exact. Exits 77 (skipped) without a GPU that runs sm_90a code.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <random>
#include <vector>

#include "gdn_wgmma.cuh"

namespace wg = qrun::gdn::detail::wg;

namespace {
constexpr int M = 64, KD = 32;

template <int NT, int R>
__global__ void wg_product(const float* A, const float* B, float* D, int* ran) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __shared__ __align__(1024) __nv_bfloat16 As[M * KD], Bs[R * KD];
  for (int i = threadIdx.x; i < M * KD; i += blockDim.x) As[wg::sw64(i / KD, i % KD)] = __float2bfloat16(A[i]);
  for (int i = threadIdx.x; i < R * KD; i += blockDim.x) Bs[wg::sw64(i / KD, i % KD)] = __float2bfloat16(B[i]);
  wg::fence_smem();
  __syncthreads();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, w = warp & 3, g = warp >> 2;
  float d[NT][4] = {};
  const uint64_t db = wg::desc_rows(Bs, 8 * NT * g), da = wg::desc_rows(As, 0);
  wg::fence();
#pragma unroll
  for (int k = 0; k < KD / 16; ++k) wg::mma_ss(d, wg::desc_add(da, k * wg::kKStep), wg::desc_add(db, k * wg::kKStep));
  wg::commit();
  wg::wait<0>();
  wg::pin(d);
  for (int n = 0; n < NT; ++n)
    for (int e = 0; e < 4; ++e) {
      const int r = 16 * w + (lane >> 2) + 8 * (e >> 1), c = 8 * NT * g + 8 * n + 2 * (lane & 3) + (e & 1);
      D[r * R + c] = d[n][e];
    }
  if (threadIdx.x == 0) *ran = 1;
#endif
}

template <int NT, int R>
bool run_case(std::mt19937& rng) {
  std::uniform_int_distribution<int> u(-4, 4);
  std::vector<float> a(M * KD), b(R * KD), d(M * R, -1e30f), ref(M * R, 0.f);
  for (auto& x : a) x = (float)u(rng);
  for (auto& x : b) x = (float)u(rng);
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < R; ++n) {
      float s = 0.f;
      for (int k = 0; k < KD; ++k) s += a[m * KD + k] * b[n * KD + k];
      ref[m * R + n] = s;
    }
  float *dA, *dB, *dD;
  int* dran;
  cudaMalloc(&dA, a.size() * 4);
  cudaMalloc(&dB, b.size() * 4);
  cudaMalloc(&dD, d.size() * 4);
  cudaMalloc(&dran, 4);
  cudaMemcpy(dA, a.data(), a.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(dB, b.data(), b.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(dD, d.data(), d.size() * 4, cudaMemcpyHostToDevice);
  cudaMemset(dran, 0, 4);
  wg_product<NT, R><<<1, 512>>>(dA, dB, dD, dran);
  const cudaError_t err = cudaDeviceSynchronize();
  int ran = 0;
  cudaMemcpy(d.data(), dD, d.size() * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(&ran, dran, 4, cudaMemcpyDeviceToHost);
  cudaFree(dA);
  cudaFree(dB);
  cudaFree(dD);
  cudaFree(dran);
  int bad = 0;
  for (int i = 0; i < M * R; ++i) bad += d[i] != ref[i];
  const bool ok = err == cudaSuccess && ran && bad == 0;
  std::printf("%s m64n%d, B plane of %d rows, 4 warpgroups: %d of %d elements differ%s%s\n", ok ? "ok  " : "FAIL",
              8 * NT, R, bad, M * R, ran ? "" : " (the sm_90a code path was not compiled)",
              err == cudaSuccess ? "" : cudaGetErrorString(err));
  return ok;
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
    // aQ, aKs, aW: B = S0 or dS_C planes [128][32]; aPD, aT: B = Delta or v planes [64][32]
    ok &= run_case<4, 128>(rng);
    ok &= run_case<2, 64>(rng);
  }
  std::printf("%s\n", ok ? "all wgmma products exact" : "wgmma test FAILED");
  return ok ? 0 : 1;
}
