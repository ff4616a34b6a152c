// The example's kernel: SwiGLU, y = silu(g) * u, and its backward, one thread per element, fp32
// math. Plain launch functions (pointers, sizes, stream): the plugin binds them to tensors.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace {

__device__ float load(const float* p, int64_t i) { return p[i]; }
__device__ float load(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ void store(float* p, int64_t i, float v) { p[i] = v; }
__device__ void store(__nv_bfloat16* p, int64_t i, float v) { p[i] = __float2bfloat16_rn(v); }

template <typename T>
__global__ void swiglu_fwd(const T* g, const T* u, T* y, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float a = load(g, i);
    store(y, i, a / (1.f + expf(-a)) * load(u, i));
  }
}

template <typename T>
__global__ void swiglu_bwd(const T* g, const T* u, const T* dy, T* dg, T* du, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float a = load(g, i), b = load(u, i), d = load(dy, i), s = 1.f / (1.f + expf(-a));
    store(dg, i, d * b * s * (1.f + a * (1.f - s)));
    store(du, i, d * a * s);
  }
}

unsigned blocks(int64_t n) { return static_cast<unsigned>(n / 256 + 1 < 4096 ? n / 256 + 1 : 4096); }

}  // namespace

// bf16: true for bfloat16 tensors, false for float32. Returns the launch's CUDA error code.
int example_swiglu_forward(bool bf16, const void* g, const void* u, void* y, int64_t n, cudaStream_t s) {
  if (bf16)
    swiglu_fwd<<<blocks(n), 256, 0, s>>>(static_cast<const __nv_bfloat16*>(g), static_cast<const __nv_bfloat16*>(u),
                                         static_cast<__nv_bfloat16*>(y), n);
  else
    swiglu_fwd<<<blocks(n), 256, 0, s>>>(static_cast<const float*>(g), static_cast<const float*>(u),
                                         static_cast<float*>(y), n);
  return static_cast<int>(cudaGetLastError());
}

int example_swiglu_backward(bool bf16, const void* g, const void* u, const void* dy, void* dg, void* du, int64_t n,
                            cudaStream_t s) {
  if (bf16)
    swiglu_bwd<<<blocks(n), 256, 0, s>>>(static_cast<const __nv_bfloat16*>(g), static_cast<const __nv_bfloat16*>(u),
                                         static_cast<const __nv_bfloat16*>(dy), static_cast<__nv_bfloat16*>(dg),
                                         static_cast<__nv_bfloat16*>(du), n);
  else
    swiglu_bwd<<<blocks(n), 256, 0, s>>>(static_cast<const float*>(g), static_cast<const float*>(u),
                                         static_cast<const float*>(dy), static_cast<float*>(dg),
                                         static_cast<float*>(du), n);
  return static_cast<int>(cudaGetLastError());
}
