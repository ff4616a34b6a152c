// The kernel of the cuda-probe test plugin: reports the architecture it was compiled for, with
// the arch-specific feature flag of sm_90a, and uses a C++20 feature in device code.
#include <cuda_runtime.h>

#include <concepts>

namespace {
template <std::integral T>
__device__ T arch_code() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  return static_cast<T>(__CUDA_ARCH__ / 10 * 10 + 1);  // 901: sm_90a
#elif defined(__CUDA_ARCH__)
  return static_cast<T>(__CUDA_ARCH__ / 10 * 10);
#else
  return 0;
#endif
}
__global__ void probe(int* out) { *out = arch_code<int>(); }
}  // namespace

// The architecture code the probe ran with (e.g. 901 for sm_90a), or -1 with a CUDA error.
int cuda_probe_run() {
  int* d = nullptr;
  int h = -1;
  if (cudaMalloc(&d, sizeof(int)) != cudaSuccess) return -1;
  probe<<<1, 1>>>(d);
  if (cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost) != cudaSuccess) h = -1;
  cudaFree(d);
  return h;
}
