// cuda-probe: a test profiler whose run start launches the plugin's own CUDA kernel and logs the
// architecture it was built for (tests/example: the out-of-tree CUDA build seam).
#include <qrun/sdk.h>

#include <cuda_runtime.h>

int cuda_probe_run();

namespace {

class CudaProbe final : public qrun::Profiler {
 public:
  void on_run_start(const std::string&) override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
      qrun::log_info("cuda-probe: no CUDA device");
      return;
    }
    const int code = cuda_probe_run();
    qrun::log_info("cuda-probe: kernel ran as sm_{}{}", code / 10, code % 10 == 1 ? "a" : "");
  }
  void on_step_begin(int64_t) override {}
  void on_step_end(const qrun::StepRecord&) override {}
  void on_run_end() override {}
};

void register_probe(qrun::Registrar& r) {
  r.add<qrun::Profiler>("cuda-probe", "launches its own CUDA kernel at run start (tests)",
                        qrun::Schema{},
                        [](const qrun::Config&) { return std::make_unique<CudaProbe>(); });
}

}  // namespace

QRUN_PLUGIN("cuda-probe", "1.0.0", register_probe)
