// qrun fused row-wise and element-wise kernels of a transformer layer: launch API.
//
// What is fused, and why by hand: LibTorch runs each of these as a chain of ATen kernels
// (RMSNorm with a (1 + w) weight and a residual add is 7 kernels forward; the gated norm of a
// Gated DeltaNet layer 9; SwiGLU 3; the query/key norm with partial rotary embedding about 12),
// each a full pass over the activations. No well-kept library ships Qwen3.5's variants (the
// zero-centred weight, the norm-then-gate order, the partial rotary): each kernel below is one
// pass (two for a backward) over its rows, with fp32 statistics and one rounding at the end.
// The cross-entropy row kernel is the middle of the fused linear cross-entropy (the plugin runs
// the GEMMs with cuBLAS through LibTorch).
//
// Conventions: plain C++ header (no torch or CUDA types); tensors are raw device pointers with
// element strides; "rows" are addressed as row r = (o, i) with o = r / inner, i = r % inner and
// address base + o * ld_outer + i * ld_inner, the row's own elements contiguous (inner = 1 for
// plain 2-D rows). Every launch is asynchronous on `stream`, allocates nothing, never
// synchronises, and is deterministic (fixed reduction orders, no atomics). Bad arguments throw
// std::invalid_argument before any launch; a failed launch throws std::runtime_error.
#pragma once

#include <cstddef>
#include <cstdint>

struct CUstream_st;

namespace qrun::fops {

enum class DType { F32, BF16, F16 };

// A [rows, cols] operand, rows addressed in two levels (see above).
struct Rows {
  const void* ptr = nullptr;
  int64_t ld_outer = 0;  // elements between consecutive outer rows
  int64_t ld_inner = 0;  // elements between consecutive inner rows (unused when inner == 1)
};
struct MutRows {
  void* ptr = nullptr;
  int64_t ld_outer = 0;
  int64_t ld_inner = 0;
};

// ----------------------------------------------------------------------------------------------
// RMSNorm, optionally after a residual add, optionally followed by partial rotary embedding.
//   s = x (+ residual, rounded to x's dtype)      n = s * rstd, rstd = rsqrt(mean(s^2) + eps)
//   y = n * w'  with w' = 1 + w (zero_centred) or w, in fp32, then rounded
//   rope (rot > 0): for d < rot/2 = h:  y[d] = y~[d] cos[d] - y~[d+h] sin[d],
//                                       y[d+h] = y~[d+h] cos[d+h] + y~[d] sin[d+h]
//     with y~ the fp32 normalised product; cos/sin [outer rows, rot] (one row per outer row,
//     shared by its inner rows: per token, over heads).
struct NormArgs {
  int64_t outer = 0, inner = 1, cols = 0;
  DType dtype = DType::BF16;  // x, residual, y, s, cos, sin
  Rows x, residual;           // residual.ptr == nullptr: no add
  const void* w = nullptr;    // [cols]
  DType w_dtype = DType::F32;
  bool zero_centred = true;
  float eps = 1e-6f;
  int rot = 0;                // rotary dims (even, <= cols), 0: none
  const void* cos = nullptr;  // [outer, rot], row stride ld_rope
  const void* sin = nullptr;
  int64_t ld_rope = 0;
};
// y: [rows, cols]; s: the sum (written when residual is given); rstd: fp32 [rows].
void norm_forward(const NormArgs& a, MutRows y, MutRows s, float* rstd, CUstream_st* stream);

// Backward of norm_forward. x is the normalised input (s when a residual was added). dy: the
// gradient of y; ds (optional): a gradient flowing into s from elsewhere (the residual stream),
// added to dx. dx: the gradient of s (= of x and of residual). dw: [cols] in w's dtype.
size_t norm_backward_workspace_bytes(const NormArgs& a);
void norm_backward(const NormArgs& a, const float* rstd, Rows dy, Rows ds, MutRows dx, void* dw,
                   void* workspace, CUstream_st* stream);

// ----------------------------------------------------------------------------------------------
// Gated RMSNorm (Gated DeltaNet output): nb = round(x * rstd) to x's dtype,
// y = (w * nb) * silu(z), fp32 products, rounded. x, z, y: [rows, cols] in `dtype`; w [cols].
struct GatedNormArgs {
  int64_t rows = 0, cols = 0;
  DType dtype = DType::BF16;
  Rows x, z;
  const void* w = nullptr;
  DType w_dtype = DType::F32;
  float eps = 1e-6f;
};
void gated_norm_forward(const GatedNormArgs& a, MutRows y, float* rstd, CUstream_st* stream);
size_t gated_norm_backward_workspace_bytes(const GatedNormArgs& a);
void gated_norm_backward(const GatedNormArgs& a, const float* rstd, Rows dy, MutRows dx, MutRows dz,
                         void* dw, void* workspace, CUstream_st* stream);

// ----------------------------------------------------------------------------------------------
// SwiGLU: y = silu(g) * u over [rows, cols]; g and u rows may live in one buffer (the two halves
// of a gate/up GEMM output). Backward: dg = dy * u * silu'(g), du = dy * silu(g).
struct SwiGluArgs {
  int64_t rows = 0, cols = 0;
  DType dtype = DType::BF16;
  Rows g, u;
};
void swiglu_forward(const SwiGluArgs& a, MutRows y, CUstream_st* stream);
void swiglu_backward(const SwiGluArgs& a, Rows dy, MutRows dg, MutRows du, CUstream_st* stream);

// ----------------------------------------------------------------------------------------------
// Cross-entropy over rows of logits, in place: logits [rows, V] (row stride ld, `dtype`), targets
// int64 [rows] (-100: ignored). loss[r] = logsumexp(row) - row[target] in fp32 (0 for ignored
// rows); the row is overwritten with d loss[r] / d logits = softmax(row) - onehot(target) (zeros
// for ignored rows), rounded to `dtype`.
void cross_entropy_rows(void* logits, int64_t rows, int64_t V, int64_t ld, DType dtype,
                        const int64_t* targets, float* loss, CUstream_st* stream);

// ----------------------------------------------------------------------------------------------
// AdamW over every tensor of a model in one launch (sdk ops.h AdamWStep has the formula, fp32
// math). Per tensor: p, g, m, v of n elements in `dtype`, contiguous; step a fp32 count. Why by
// hand: LibTorch's fused AdamW (at::_fused_adamw_) cuts the tensors into launches of at most 320
// chunks of 65,536 elements - 195 launches for the 4 B parameters of the 27B cut to 4 layers,
// which moved 2.0 TB/s on the H100 - where this is one grid-strided launch over tiles of all the
// tensors with 16-byte accesses, and one tiny launch that advances the step counts.
struct AdamWTensor {
  void* p = nullptr;
  const void* g = nullptr;
  void* m = nullptr;
  void* v = nullptr;
  float* step = nullptr;
  int64_t n = 0;
  int64_t first_tile = 0;  // tiles of the tensors before this one (sum of list_tiles(n))
};
struct AdamWArgs {
  DType dtype = DType::BF16;
  float lr = 0, beta1 = 0.9f, beta2 = 0.999f, weight_decay = 0, eps = 1e-8f;
  const float* grad_scale = nullptr;  // device scalar dividing every gradient; null: 1
  const float* found_inf = nullptr;   // device scalar; nonzero: no update, no step advanced
};
// Tiles of a tensor of n elements in the multi-tensor kernels (AdamW, square_sum).
int64_t list_tiles(int64_t n);
// `tensors`: a DEVICE array of `count` descriptors in tile order; total_tiles = the last one's
// first_tile + list_tiles(n).
void adamw_step(const AdamWArgs& a, const AdamWTensor* tensors, int count, int64_t total_tiles,
                CUstream_st* stream);

// The sum of squares of every element of a list of tensors (the gradient norm before clipping),
// in fp64, deterministic for a given GPU (fixed grid, fixed order). Why by hand: LibTorch's
// _foreach_norm is again one launch per 20 M elements plus the per-tensor norms' sum.
struct SumTensor {
  const void* p = nullptr;
  int64_t n = 0;
  int64_t first_tile = 0;
};
size_t square_sum_workspace_bytes();
// `tensors`: a DEVICE array as for adamw_step; `out`: one fp64 on the device.
void square_sum(DType dtype, const SumTensor* tensors, int count, int64_t total_tiles, double* out,
                void* workspace, CUstream_st* stream);

}  // namespace qrun::fops
