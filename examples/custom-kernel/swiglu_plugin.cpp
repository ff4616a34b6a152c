// example-swiglu: an `ops` backend that provides one operation, SwiGLU, from its own CUDA kernel
// (swiglu_kernel.cu). In a run every other operation comes from the reference ops (qrun's sdk
// ops.h, Note [Ops per operation]); `qrun check ops/example-swiglu` judges the SwiGLU cases
// against the reference in fp64 and says which operations it leaves to the reference.
#include <qrun/sdk.h>

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime.h>
#include <torch/csrc/autograd/custom_function.h>

int example_swiglu_forward(bool bf16, const void* g, const void* u, void* y, int64_t n, cudaStream_t s);
int example_swiglu_backward(bool bf16, const void* g, const void* u, const void* dy, void* dg, void* du, int64_t n,
                            cudaStream_t s);

namespace {

void check_launch(int err) {
  QRUN_CHECK(err == 0, "example-swiglu: kernel launch failed: {}", cudaGetErrorString(static_cast<cudaError_t>(err)));
}

// Autograd: forward saves its inputs, backward runs the backward kernel (qrun's sdk kernels.h,
// Note [Kernel backend contract]: the current stream, the caching allocator, no host sync).
struct SwiGluFn : public torch::autograd::Function<SwiGluFn> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up) {
    c10::cuda::CUDAGuard guard(gate.device());
    at::Tensor g = gate.contiguous(), u = up.contiguous(), y = at::empty_like(g);
    check_launch(example_swiglu_forward(g.scalar_type() == at::kBFloat16, g.data_ptr(), u.data_ptr(), y.data_ptr(),
                                        g.numel(), at::cuda::getCurrentCUDAStream()));
    ctx->save_for_backward({g, u});
    return y;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    auto s = ctx->get_saved_variables();
    c10::cuda::CUDAGuard guard(s[0].device());
    at::Tensor dy = grad[0].to(s[0].scalar_type()).contiguous(), dg = at::empty_like(s[0]), du = at::empty_like(s[1]);
    check_launch(example_swiglu_backward(s[0].scalar_type() == at::kBFloat16, s[0].data_ptr(), s[1].data_ptr(),
                                         dy.data_ptr(), dg.data_ptr(), du.data_ptr(), s[0].numel(),
                                         at::cuda::getCurrentCUDAStream()));
    return {dg, du};
  }
};

class ExampleSwiGlu final : public qrun::Ops {
 public:
  // Answered before any weight is loaded: `qrun validate` and the run's start use it.
  std::string unsupported(const qrun::KernelUse& u) const override {
    if (u.device != c10::DeviceType::CUDA) return "this backend runs on CUDA only";
    if (u.dtype != at::kBFloat16 && u.dtype != at::kFloat) return "it takes bf16 or fp32 activations";
    return {};
  }
  void provide(qrun::OpTable& t, const std::string& provider) override {
    t.provide<qrun::op::SwiGlu>(
        [](const at::Tensor& gate, const at::Tensor& up) {
          QRUN_CHECK(gate.is_cuda() && gate.sizes() == up.sizes() && gate.scalar_type() == up.scalar_type(),
                     "example-swiglu: gate and up must be CUDA tensors of one shape and dtype");
          return SwiGluFn::apply(gate, up);
        },
        provider);
  }
};

void register_all(qrun::Registrar& r) {
  r.add<qrun::Ops>("example-swiglu", "SwiGLU from the example's own CUDA kernel (the other ops: reference)",
                   qrun::Schema{}, [](const qrun::Config&) { return std::make_unique<ExampleSwiGlu>(); });
}

}  // namespace

QRUN_PLUGIN("example-swiglu", "1.0.0", register_all)
