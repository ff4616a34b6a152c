// Benchmark (not a test) of the causal conv1d kernels at the 27B layer's shape: 8,192 tokens of
// 10,240 channels (2 * 16 * 128 + 48 * 128), width 4, SiLU, bf16. CUDA events, 5 warm-ups,
// median of 50. Prints ms and the bandwidth of the compulsory bytes.
//   bench [T] [C]
#include "causal_conv1d.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

using namespace qrun::conv1d;

int main(int argc, char** argv) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("SKIP: no CUDA device\n");
    return 77;
  }
  const int64_t T = argc > 1 ? std::atoll(argv[1]) : 8192, C = argc > 2 ? std::atoll(argv[2]) : 10240;
  const int W = 4;
  void *x, *w, *y, *dy, *dx, *dw, *sid, *ws;
  cudaMalloc(&x, T * C * 2);
  cudaMalloc(&y, T * C * 2);
  cudaMalloc(&dy, T * C * 2);
  cudaMalloc(&dx, T * C * 2);
  cudaMalloc(&w, C * W * 2);
  cudaMalloc(&dw, C * W * 2);
  cudaMalloc(&sid, T * 4);
  cudaMemset(x, 0, T * C * 2);
  cudaMemset(dy, 0, T * C * 2);
  cudaMemset(w, 0, C * W * 2);
  std::vector<int32_t> s(T);
  for (int64_t t = 0; t < T; ++t) s[t] = static_cast<int32_t>(t / 900);  // samples of 900 tokens
  cudaMemcpy(sid, s.data(), T * 4, cudaMemcpyHostToDevice);
  Problem p;
  p.T = T, p.C = C, p.W = W, p.silu = true, p.x_dtype = DType::BF16, p.w_dtype = DType::BF16;
  p.x = x, p.ldx = C, p.w = w, p.seq_idx = static_cast<int32_t*>(sid);
  cudaMalloc(&ws, backward_workspace_bytes(p));
  auto time = [&](auto&& f) {
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    for (int i = 0; i < 5; ++i) f();
    std::vector<float> ms;
    for (int i = 0; i < 50; ++i) {
      cudaEventRecord(a);
      f();
      cudaEventRecord(b);
      cudaEventSynchronize(b);
      float m = 0;
      cudaEventElapsedTime(&m, a, b);
      ms.push_back(m);
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  };
  const float f = time([&] { forward(p, y, C, nullptr); });
  const float b = time([&] { backward(p, dy, C, dx, C, dw, ws, nullptr); });
  const double bytes_f = 2.0 * T * C * 2, bytes_b = 3.0 * T * C * 2;
  std::printf("causal_conv1d T=%lld C=%lld W=%d bf16 silu: forward %.4f ms (%.0f GB/s), backward %.4f ms (%.0f GB/s)\n",
              static_cast<long long>(T), static_cast<long long>(C), W, f, bytes_f / f / 1e6, b, bytes_b / b / 1e6);
  return 0;
}
