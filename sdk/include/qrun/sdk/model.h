// qrun/sdk/model.h - the model kind: builds the network, loads and saves Hugging Face checkpoints,
// reports FLOPs per token.
//
// Lifecycle: the host creates the model component from its Config (recipe `model:` section), then
// calls build() once with the kernel components the recipe names and the run's placement. From then
// on the model owns its parameters (HF names, HF shapes) and the host drives forward/backward.
// Added in SDK 1.
#pragma once

#include <qrun/sdk/batch.h>
#include <qrun/sdk/component.h>
#include <qrun/sdk/kernels.h>
#include <qrun/sdk/ops.h>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace qrun {

// The backends a model calls. Not owned: the host keeps them alive longer than the model.
// A pointer is null when the recipe names no such kernel and its default is not installed; a
// model that needs it throws a UserError from build() naming the recipe key (kernels.<kind>).
// `ops` is the table of operations the host composed from the reference ops and the recipe's
// kernels.ops backend (ops.h, Note [Ops per operation]); a model takes the operations it calls
// from it in build() and throws the table's UserError for one that is missing.
struct ModelKernels {
  Attention* attention = nullptr;
  LinearAttention* linear_attention = nullptr;
  Conv1d* conv1d = nullptr;
  const OpTable* ops = nullptr;
};

struct ModelPlacement {
  c10::Device device = c10::Device(c10::kCPU);
  c10::ScalarType param_dtype = c10::kFloat;    // storage dtype of the parameters
  c10::ScalarType compute_dtype = c10::kFloat;  // activations
  uint64_t seed = 0;                            // for random initialisation
};

struct ModelOutput {
  at::Tensor loss_sum;      // 0-dim fp32: summed cross-entropy over the batch's loss tokens
  int64_t loss_tokens = 0;  // how many targets the sum covers
  at::Tensor logits;        // only when asked for: [.., V] in fp32
};

struct ModelSummary {
  std::string family;       // e.g. "qwen3_5"
  int64_t num_layers = 0;
  int64_t hidden_size = 0;
  int64_t vocab_size = 0;
  int64_t num_parameters = 0;
  std::string description;  // one line for logs ("Qwen3.5 hybrid, 8 layers (6 GDN + 2 attn), ...")
};

// Note [Parameter units] (added in SDK 4): a model groups its parameters into units in execution
// order - the embedding, each decoder layer, the head (the final norm and the output projection;
// with tied embeddings the embedding's unit holds the head too) - and calls a sharding's hooks at
// the units' boundaries, so that an fsdp2 sharding can gather a unit's parameters just before
// they are used and free them after:
//   * forward: before_forward(u) before unit u reads any parameter, after_forward(u) after its
//     last use in the forward;
//   * backward: before_backward(u) before autograd runs any of unit u's backward (the model puts
//     an identity autograd node on the unit's output whose backward calls it; with activation
//     checkpointing, before the unit's recompute).
// The end of a unit's backward is seen by the sharding itself (its parameters' gradients are
// accumulated). Between the hooks the unit's parameters are the model's own tensors, in their
// registered shapes; outside them their storage may be empty.
struct ParamUnit {
  std::string name;                 // "embed", "layers.3", "head"
  std::vector<std::string> params;  // names from named_parameters(), in that order
};

class UnitHooks {
 public:
  virtual ~UnitHooks() = default;
  virtual void before_forward(size_t unit) = 0;
  virtual void after_forward(size_t unit) = 0;
  virtual void before_backward(size_t unit) = 0;
};

class Model : public Component {
 public:
  static constexpr const char* kKind = "model";

  // Creates parameters (from the checkpoint the config names, or a size preset with random
  // initialisation) on placement.device. Throws UserError for a bad checkpoint, naming the file
  // and tensor.
  virtual void build(const ModelKernels& kernels, const ModelPlacement& placement) = 0;

  // Forward pass over a batch already on the model's device. Differentiable w.r.t. parameters().
  virtual ModelOutput forward(const Batch& batch, bool return_logits = false) = 0;

  // Parameters with their Hugging Face names, in a stable order.
  virtual std::vector<std::pair<std::string, at::Tensor>> named_parameters() = 0;

  // Writes a Hugging Face checkpoint (config.json, sharded safetensors + index) into `dir`,
  // which the caller created; the caller makes the whole checkpoint atomic. `values` (SDK 4), when
  // not empty, holds every parameter's full value by name (CPU tensors, gathered by a sharding that
  // splits the model's own across ranks) and is written instead of the model's tensors.
  virtual void save(const std::string& dir, const std::map<std::string, at::Tensor>& values = {}) = 0;

  // Training FLOPs per token (forward + backward = 3x forward) for a batch with these sample
  // lengths, per the model's FLOP model; used for MFU.
  virtual double train_flops_per_token(const std::vector<int64_t>& seq_lens) const = 0;

  virtual ModelSummary summary() const = 0;

  // Added in SDK 3. The kernel calls the model will make, one per (kind, shape), with kind and
  // the shape facts of kernels.h's KernelUse filled in (the host adds device, dtype and layout).
  // Answerable right after construction, before build(): the host checks the recipe's backends
  // against it before loading any weight (kernels.h, Note [What a backend can run]).
  virtual std::vector<KernelUse> kernel_uses() const { return {}; }

  // Added in SDK 4. Bytes of activations held for the backward per token of a micro-batch, with
  // `checkpointing` (each layer recomputed) or not, at `bytes_per_element` for the activations;
  // NaN when the model cannot say. For the memory model printed at a run's start.
  virtual double activation_bytes_per_token(bool checkpointing, int bytes_per_element) const {
    (void)checkpointing;
    (void)bytes_per_element;
    return std::nan("");
  }

  // Added in SDK 4 (Note [Parameter units]). Empty: the model has no units (an fsdp2 sharding
  // refuses it; none and ddp need none).
  virtual std::vector<ParamUnit> units() const { return {}; }
  // The hooks to call from now on (null: none). Not owned; set after build().
  virtual void set_unit_hooks(UnitHooks* hooks) { (void)hooks; }
};

}  // namespace qrun
