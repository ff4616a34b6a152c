// framework/optimizer.h - AdamW over a model's parameters and the learning-rate schedules.
//
// Why our own wrapper rather than torch::optim::AdamW: the step must be a fused multi-tensor
// kernel (at::_fused_adamw_, vectorised on CPU; on CUDA the recipe's ops backend's AdamW step
// where it provides one) instead of a per-parameter loop of small ops, we need optional fp32
// master weights for bf16 parameters, and the state must serialise by parameter *name* so
// checkpoints survive reordering.
#pragma once

#include <qrun/sdk/ops.h>

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace torch::serialize {
class InputArchive;
class OutputArchive;
}  // namespace torch::serialize

namespace qrun {

struct AdamWOptions {
  double lr = 1e-5;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool master_weights = false;  // keep fp32 copies of low-precision parameters
};

class AdamW {
 public:
  AdamW(std::vector<std::pair<std::string, at::Tensor>> params, AdamWOptions opt);

  // One update with learning rate `lr` from the gradients in .grad(); parameters without a
  // gradient are skipped. Optional one-element fp32 device tensors, read by the kernel so that no
  // host read precedes the update: `grad_scale` divides every gradient (gradient clipping passes
  // max(1, norm / max_norm)); where `found_inf` is nonzero the update is skipped (parameters,
  // moments and step counts unchanged).
  void step(double lr, const at::Tensor& grad_scale = {}, const at::Tensor& found_inf = {});
  // Runs the updates of CUDA parameters with an ops backend's AdamW step (sdk ops.h AdamWStep)
  // instead of LibTorch's fused kernel. `provider` names it in reports.
  void use_kernel(op::AdamWStep::Fn fn, std::string provider);
  // "libtorch _fused_adamw_" or the provider given to use_kernel.
  const std::string& kernel_name() const { return kernel_name_; }
  void zero_grad();
  // Calls of step(), updates skipped through found_inf included (the per-parameter step counts
  // in the state count the updates applied).
  int64_t steps_taken() const { return steps_; }

  void save(torch::serialize::OutputArchive& ar) const;
  // Throws UserError when the archive does not match these parameters.
  void load(torch::serialize::InputArchive& ar);
  // The same from any source: `read(key, shape)` returns the tensor saved under `key` (the names
  // save() writes), or an undefined tensor when there is none.
  void load(const std::function<at::Tensor(const std::string& key, at::IntArrayRef shape)>& read);

 private:
  struct Slot {
    std::string name;
    at::Tensor param;   // the model's parameter
    at::Tensor master;  // fp32 copy when master weights are on, else == param
    at::Tensor exp_avg, exp_avg_sq, step;
  };
  void copy_to_params(const std::vector<size_t>& idx);

  std::vector<Slot> slots_;
  AdamWOptions opt_;
  op::AdamWStep::Fn kernel_;
  std::string kernel_name_ = "libtorch _fused_adamw_";
  int64_t steps_ = 0;
};

enum class ScheduleKind { Constant, Linear, Cosine };

// lr(step) for step = 0, 1, ...: linear warm-up from 0 over `warmup` steps, then constant, linear
// decay or cosine decay to min_ratio * peak at `total` steps.
double schedule_lr(ScheduleKind kind, double peak, int64_t step, int64_t warmup, int64_t total,
                   double min_ratio);

}  // namespace qrun
