// CPU fp64 reference of the causal depthwise conv1d (causal_conv1d.h has the math): a plain token
// loop, forward and its explicit adjoint. The GPU test judges the kernels against it; its own
// test (test_reference.cpp, CPU, in CI) checks the adjoint against central finite differences.
#pragma once

#include <cstdint>
#include <vector>

namespace qrun::conv1d {

struct RefProblem {
  int64_t T = 0, C = 0;
  int W = 4;
  bool silu = true;
  std::vector<int32_t> seq_idx;  // [T]; empty: one sample
};

// x [T, C], w [C, W] -> y [T, C].
std::vector<double> reference_forward(const RefProblem& p, const std::vector<double>& x,
                                      const std::vector<double>& w);
// dy [T, C] -> dx [T, C], dw [C, W].
void reference_backward(const RefProblem& p, const std::vector<double>& x,
                        const std::vector<double>& w, const std::vector<double>& dy,
                        std::vector<double>& dx, std::vector<double>& dw);

}  // namespace qrun::conv1d
