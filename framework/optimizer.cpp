#include "optimizer.h"

#include <qrun/sdk/error.h>

#include <fmt/ranges.h>

#include <ATen/ATen.h>
#include <torch/serialize/archive.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <tuple>

namespace qrun {

AdamW::AdamW(std::vector<std::pair<std::string, at::Tensor>> params, AdamWOptions opt) : opt_(opt) {
  for (auto& [name, p] : params) {
    Slot s;
    s.name = name;
    s.param = p;
    s.master = (opt.master_weights && p.scalar_type() != at::kFloat)
                   ? p.detach().to(at::kFloat).clone()
                   : p;
    s.exp_avg = at::zeros_like(s.master, s.master.options().requires_grad(false));
    s.exp_avg_sq = at::zeros_like(s.master, s.master.options().requires_grad(false));
    s.step = at::zeros({}, s.master.options().dtype(at::kFloat).requires_grad(false));
    slots_.push_back(std::move(s));
  }
}

void AdamW::step(double lr, const at::Tensor& grad_scale, const at::Tensor& found_inf) {
  at::NoGradGuard no_grad;
  // Group by (device, dtype): the fused kernel takes one homogeneous list per call.
  std::map<std::tuple<int, int, int>, std::vector<size_t>> groups;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    if (!s.param.grad().defined()) continue;
    auto d = s.master.device();
    groups[{static_cast<int>(d.type()), d.index(), static_cast<int>(s.master.scalar_type())}].push_back(i);
  }
  for (auto& [key, idx] : groups) {
    std::vector<at::Tensor> p, g, m, v, st;
    for (size_t i : idx) {
      Slot& s = slots_[i];
      at::Tensor grad = s.param.grad();
      if (s.master.data_ptr() != s.param.data_ptr()) grad = grad.to(at::kFloat);
      p.push_back(s.master);
      g.push_back(grad);
      m.push_back(s.exp_avg);
      v.push_back(s.exp_avg_sq);
      st.push_back(s.step);
    }
    // The fused kernel reads the step count for bias correction but does not advance it; a
    // skipped update (found_inf) takes the increment back.
    auto on = [&](const at::Tensor& t) -> std::optional<at::Tensor> {
      if (!t.defined()) return std::nullopt;
      return t.to(p.front().device(), at::kFloat).reshape({});
    };
    const std::optional<at::Tensor> scale = on(grad_scale), inf = on(found_inf);
    const bool dense = std::all_of(p.begin(), p.end(), [](const at::Tensor& t) { return t.is_contiguous(); });
    if (kernel_ && p.front().is_cuda() && dense) {
      for (auto& t : g) t = t.contiguous();
      kernel_(p, g, m, v, st, lr, opt_.beta1, opt_.beta2, opt_.weight_decay, opt_.eps,
              scale.value_or(at::Tensor()), inf.value_or(at::Tensor()));
      copy_to_params(idx);
      continue;
    }
    at::_foreach_add_(st, 1.0);
    at::_fused_adamw_(p, g, m, v, /*max_exp_avg_sqs=*/{}, st, lr, opt_.beta1, opt_.beta2,
                      opt_.weight_decay, opt_.eps, /*amsgrad=*/false, /*maximize=*/false, scale, inf);
    if (inf) at::_foreach_sub_(st, std::vector<at::Tensor>(st.size(), *inf));
    copy_to_params(idx);
  }
  steps_++;
}

void AdamW::copy_to_params(const std::vector<size_t>& idx) {
  // Low-precision parameters take their new value from the fp32 masters (one multi-tensor copy).
  std::vector<at::Tensor> to, from;
  for (size_t i : idx) {
    Slot& s = slots_[i];
    if (s.master.data_ptr() != s.param.data_ptr()) to.push_back(s.param), from.push_back(s.master);
  }
  if (!to.empty()) at::_foreach_copy_(to, from);
}

void AdamW::use_kernel(op::AdamWStep::Fn fn, std::string provider) {
  kernel_ = std::move(fn);
  kernel_name_ = std::move(provider);
}

void AdamW::zero_grad() {
  for (auto& s : slots_)
    if (s.param.grad().defined()) s.param.mutable_grad() = at::Tensor();
}

void AdamW::save(torch::serialize::OutputArchive& ar) const {
  ar.write("adamw.steps", at::tensor({steps_}, at::kLong));
  for (const auto& s : slots_) {
    ar.write("adamw.exp_avg." + s.name, s.exp_avg);
    ar.write("adamw.exp_avg_sq." + s.name, s.exp_avg_sq);
    ar.write("adamw.step." + s.name, s.step);
    if (s.master.data_ptr() != s.param.data_ptr()) ar.write("adamw.master." + s.name, s.master);
  }
}

void AdamW::load(torch::serialize::InputArchive& ar) {
  load([&ar](const std::string& key, at::IntArrayRef) {
    at::Tensor t;
    return ar.try_read(key, t) ? t : at::Tensor();
  });
}

void AdamW::load(const std::function<at::Tensor(const std::string&, at::IntArrayRef)>& source) {
  at::NoGradGuard no_grad;
  auto read = [&](const std::string& key, at::Tensor& into) {
    at::Tensor t = source(key, into.sizes());
    QRUN_CHECK(t.defined(), "optimizer state has no entry '{}' (checkpoint of another model?)", key);
    QRUN_CHECK(t.sizes() == into.sizes(), "optimizer state '{}' has shape {}, expected {}", key,
               fmt::format("{}", fmt::join(t.sizes(), "x")), fmt::format("{}", fmt::join(into.sizes(), "x")));
    into.copy_(t);
  };
  at::Tensor steps = source("adamw.steps", at::IntArrayRef{1});
  QRUN_CHECK(steps.defined(), "checkpoint has no optimizer state");
  steps_ = steps.item<int64_t>();
  for (auto& s : slots_) {
    read("adamw.exp_avg." + s.name, s.exp_avg);
    read("adamw.exp_avg_sq." + s.name, s.exp_avg_sq);
    read("adamw.step." + s.name, s.step);
    if (s.master.data_ptr() != s.param.data_ptr()) read("adamw.master." + s.name, s.master);
  }
}

double schedule_lr(ScheduleKind kind, double peak, int64_t step, int64_t warmup, int64_t total,
                   double min_ratio) {
  if (warmup > 0 && step < warmup) return peak * static_cast<double>(step + 1) / static_cast<double>(warmup);
  if (kind == ScheduleKind::Constant || total <= warmup) return peak;
  double progress = std::min(1.0, static_cast<double>(step - warmup) / static_cast<double>(total - warmup));
  double floor = peak * min_ratio;
  if (kind == ScheduleKind::Linear) return floor + (peak - floor) * (1.0 - progress);
  return floor + (peak - floor) * 0.5 * (1.0 + std::cos(M_PI * progress));
}

}  // namespace qrun
