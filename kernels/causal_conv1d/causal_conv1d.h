// qrun causal depthwise conv1d kernels: launch API.
//
// The short convolution of a Gated DeltaNet layer (Qwen3.5 / Qwen3-Next): every channel c of a
// token-major activation x [T, C] is convolved along the token axis with its own W taps, the last
// tap multiplying the current token, with zero left context at every sample start, then (optionally)
// SiLU:
//     z[t, c] = sum_{j=0}^{W-1} w[c, j] * x[t - (W-1) + j, c]   (taps outside t's sample read 0)
//     y[t, c] = silu(z[t, c])  or  z[t, c]
// Sample boundaries come from seq_idx (int32, one per token): a tap reads x[s] only when
// seq_idx[s] == seq_idx[t]; a token with seq_idx < 0 (padding) gets y = 0 and passes no gradient.
// Samples must be contiguous runs of tokens (a packed stream, or the rows of a padded [B, S, C]
// batch seen as B*S tokens: a row's first token then differs in seq_idx from the row before).
//
// Why written here: the layout is the model's own, [T, C] token-major, as the in_proj_qkv GEMM
// writes it; the published kernels (Dao-AILab causal-conv1d) take channel-major [B, C, T] and
// would need a transpose copy each way of a 10,240-channel activation. Plain C++ header, no torch
// or CUDA headers: the plugin, the test and the benchmark include it.
//
// Numerics: products and sums in fp32, one rounding to the output dtype. Backward recomputes z
// (nothing is saved but the inputs): dz = dy * silu'(z); dx[s] = sum_k w[k] dz[s + W-1 - k] over
// targets in s's sample; dw[c, j] = sum_t dz[t] x[t - (W-1) + j], summed per token tile in fp32 and
// then over tiles in a fixed order (deterministic, no atomics).
//
// Every launch is asynchronous on the given stream, allocates nothing and never synchronises.
// Bad arguments throw std::invalid_argument before any launch; a failed launch throws
// std::runtime_error with the CUDA error string.
#pragma once

#include <cstddef>
#include <cstdint>

struct CUstream_st;

namespace qrun::conv1d {

enum class DType { F32, BF16, F16 };

constexpr int kMaxWidth = 4;  // widths 1..4 (Qwen3.5 / Qwen3-Next use 4)

struct Problem {
  int64_t T = 0;      // tokens (rows of x)
  int64_t C = 0;      // channels
  int W = 4;          // taps, 1..kMaxWidth
  bool silu = true;
  DType x_dtype = DType::BF16;  // x, y, dy, dx
  DType w_dtype = DType::BF16;  // w, dw
  const void* x = nullptr;      // [T, C], row stride ldx elements, channels contiguous
  int64_t ldx = 0;
  const void* w = nullptr;      // [C, W] contiguous
  const int32_t* seq_idx = nullptr;  // [T] device; nullptr: all tokens form one sample
};

// y [T, C] (row stride ldy, x's dtype).
void forward(const Problem& p, void* y, int64_t ldy, CUstream_st* stream);

// Scratch for backward(): fp32 partial weight gradients, one [C, W] slice per token tile.
size_t backward_workspace_bytes(const Problem& p);

// dy [T, C] (row stride lddy) -> dx [T, C] (row stride lddx, x's dtype) and dw [C, W] (w's dtype,
// contiguous). `workspace` holds backward_workspace_bytes(p) bytes.
void backward(const Problem& p, const void* dy, int64_t lddy, void* dx, int64_t lddx, void* dw,
              void* workspace, CUstream_st* stream);

}  // namespace qrun::conv1d
