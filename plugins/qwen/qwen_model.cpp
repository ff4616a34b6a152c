// plugins/qwen: the `qwen` model - the Qwen3.5 hybrid text decoder (Gated DeltaNet layers and
// gated full-attention layers, SwiGLU MLP) in LibTorch, with Hugging Face checkpoint IO; through
// the same code the Qwen3.5-MoE text model (sparse MoE MLPs) and Qwen3-Next (fused in_proj_qkvz /
// in_proj_ba projections, MoE MLPs on the layers its config selects).
//
// Spec: shared/design/qwen35-model.md (section numbers below refer to it). The model owns its
// parameters under their HF causal-LM names (`model.layers.3.self_attn.q_proj.weight`,
// `lm_head.weight` only when untied; MoE experts fused as transformers holds them, Note [Expert
// parameters]) and never hard-codes a backend: every attention, linear attention, conv, norm,
// activation and loss goes through the ModelKernels the recipe names.
//
// Numerics (section 2.8): parameters are stored in placement.param_dtype except
// linear_attn.A_log and linear_attn.norm.weight, which stay fp32 as published; activations run in
// placement.compute_dtype (weights are cast on use when the two differ). Softmaxes, RoPE angles
// and logits use at least fp32: with fp64 parameters and compute (the parity tests' mode) every
// step runs in fp64, A_log and the gated-norm weight included.
//
// Batches (sdk batch.h): packed [T] or padded [B, S]; labels are unshifted and the model shifts
// them inside each sample using seq_idx, so nothing is predicted across a sample boundary.
//
// Note [Layer recompute]: with activation_checkpointing: full each decoder layer runs inside a
// custom autograd Function whose forward runs the layer without recording a graph and whose
// backward reruns it with grad enabled and differentiates it (the reentrant scheme of
// torch.utils.checkpoint). The layer is deterministic (no dropout), so recompute is exact.
#include "safetensors.h"

#include <qrun/sdk/error.h>
#include <qrun/sdk/log.h>
#include <qrun/sdk/model.h>
#include <qrun/sdk/plugin.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <set>
#include <sstream>

namespace qrun {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// ---------------------------------------------------------------------------------------------
// Configuration (section 1)

// The architectures one plugin serves (section 2): Qwen3.5 dense (separate GDN projections, SwiGLU
// MLP), Qwen3.5-MoE (same GDN, every MLP a sparse MoE) and Qwen3-Next (fused in_proj_qkvz /
// in_proj_ba, MoE MLP on the layers decoder_sparse_step / mlp_only_layers select), and, as a second
// family, plain Qwen3 dense models (full attention only: no output gate, plain-weight RMSNorms,
// full rotary by default).
enum class Family { Qwen35, Qwen35Moe, Next, Qwen3 };

struct QwenConfig {
  std::string model_type = "qwen3_5_text";
  Family family = Family::Qwen35;
  int64_t hidden = 0, layers = 0, n_q = 0, n_kv = 0, d_h = 0;
  int64_t n_k = 0, n_v = 0, d_k = 0, d_v = 0, conv_k = 4, inter = 0, vocab = 0;
  double eps = 1e-6, rope_theta = 1e7, partial_rotary = 0.25;
  bool tied = false;
  std::vector<bool> full;  // per layer: true = full attention, false = Gated DeltaNet
  int64_t max_pos = 262144;
  json extra;              // token ids etc. copied into a saved config.json
  // Sparse MoE MLP (Qwen3.5-MoE, Qwen3-Next), section 2.6.
  int64_t experts = 0, top_k = 0, moe_inter = 0, shared_inter = 0;
  bool norm_topk = true;
  std::vector<bool> moe;   // per layer: true = sparse MoE MLP, false = dense SwiGLU
  json source;             // the checkpoint's config.json as read (null for presets)

  bool fused_gdn() const { return family == Family::Next; }
  // Qwen3: attention without the output gate, RMSNorm weights stored plainly (y = w * n).
  bool attn_gate() const { return family != Family::Qwen3; }
  bool zero_centred() const { return family != Family::Qwen3; }
  const char* family_name() const {
    return family == Family::Next        ? "qwen3_next"
           : family == Family::Qwen35Moe ? "qwen3_5_moe"
           : family == Family::Qwen3     ? "qwen3"
                                         : "qwen3_5";
  }
  int64_t rot_dim() const { return static_cast<int64_t>(static_cast<double>(d_h) * partial_rotary); }
  int64_t key_dim() const { return n_k * d_k; }
  int64_t value_dim() const { return n_v * d_v; }
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }
  int64_t num_full() const { return std::count(full.begin(), full.end(), true); }
  int64_t num_linear() const { return layers - num_full(); }
};

std::vector<bool> interval_layers(int64_t n, int64_t interval) {
  std::vector<bool> f(n);
  for (int64_t i = 0; i < n; ++i) f[i] = ((i + 1) % interval) == 0;
  return f;
}

QwenConfig preset_config(const std::string& name) {
  QwenConfig c;
  auto set = [&](int64_t H, int64_t L, int64_t nq, int64_t nkv, int64_t dh, int64_t nk, int64_t nv,
                 int64_t dk, int64_t I, int64_t V, bool tied) {
    c.hidden = H; c.layers = L; c.n_q = nq; c.n_kv = nkv; c.d_h = dh; c.n_k = nk; c.n_v = nv;
    c.d_k = dk; c.d_v = dk; c.inter = I; c.vocab = V; c.tied = tied;
  };
  if (name == "0.8b") set(1024, 24, 8, 2, 256, 16, 16, 128, 3584, 248320, true);
  else if (name == "2b") set(2048, 24, 8, 2, 256, 16, 16, 128, 6144, 248320, true);
  else if (name == "4b") set(2560, 32, 16, 4, 256, 16, 32, 128, 9216, 248320, true);
  else if (name == "9b") set(4096, 32, 16, 4, 256, 16, 32, 128, 12288, 248320, false);
  else if (name == "27b") set(5120, 64, 24, 4, 256, 16, 48, 128, 17408, 248320, false);
  else if (name == "tiny") set(64, 4, 4, 2, 32, 2, 4, 16, 128, 512, false);
  // The embedded demo: tiny layers, but the Qwen3 tokenizer's vocabulary (151,936 rows, tied).
  else if (name == "demo") set(128, 4, 4, 2, 32, 2, 4, 32, 256, 151936, true);
  else QRUN_ASSERT(false, "unknown preset {}", name);
  c.full = interval_layers(c.layers, 4);
  c.moe.assign(c.layers, false);
  return c;
}

const json* jfind(const json& j, const char* key) {
  auto it = j.find(key);
  return (it == j.end() || it->is_null()) ? nullptr : &*it;
}

int64_t jint(const json& j, const char* key, const std::string& file, std::optional<int64_t> def = {}) {
  const json* v = jfind(j, key);
  if (v == nullptr) {
    QRUN_CHECK(def.has_value(), "config {}: required field '{}' is missing", file, key);
    return *def;
  }
  QRUN_CHECK(v->is_number_integer() && v->get<int64_t>() > 0,
             "config {}: field '{}' must be a positive integer, got {}", file, key, v->dump());
  return v->get<int64_t>();
}

double jnum(const json& j, const char* key, const std::string& file, double def) {
  const json* v = jfind(j, key);
  if (v == nullptr) return def;
  QRUN_CHECK(v->is_number(), "config {}: field '{}' must be a number, got {}", file, key, v->dump());
  return v->get<double>();
}

QwenConfig parse_config(const std::string& file) {
  std::ifstream in(file);
  QRUN_CHECK(in.good(), "checkpoint config {} cannot be read (a Hugging Face checkpoint directory "
             "holds config.json next to its *.safetensors)", file);
  std::stringstream ss;
  ss << in.rdbuf();
  json top = json::parse(ss.str(), nullptr, false);
  QRUN_CHECK(!top.is_discarded() && top.is_object(), "config {}: not a valid JSON object", file);
  const json* tc = jfind(top, "text_config");
  const json& t = (tc != nullptr && tc->is_object()) ? *tc : top;
  std::string mt = top.value("model_type", std::string());
  std::string tmt = t.value("model_type", mt);
  static const std::map<std::string, Family> ok = {
      {"qwen3_5", Family::Qwen35},        {"qwen3_5_text", Family::Qwen35},
      {"qwen3_5_moe", Family::Qwen35Moe}, {"qwen3_5_moe_text", Family::Qwen35Moe},
      {"qwen3_next", Family::Next},       {"qwen3", Family::Qwen3}};
  QRUN_CHECK(ok.count(mt) > 0 || (mt.empty() && ok.count(tmt) > 0),
             "config {}: unknown model_type '{}'; the qwen model supports qwen3_5, qwen3_5_text, "
             "qwen3_5_moe, qwen3_5_moe_text, qwen3_next and qwen3", file, mt);
  QwenConfig c;
  c.model_type = tmt.empty() ? mt : tmt;
  c.family = ok.at(mt.empty() ? tmt : mt);
  QRUN_CHECK(ok.count(c.model_type) > 0 && ok.at(c.model_type) == c.family,
             "config {}: text_config.model_type '{}' does not belong to model_type '{}'", file,
             c.model_type, mt);
  c.source = top;
  c.hidden = jint(t, "hidden_size", file);
  c.layers = jint(t, "num_hidden_layers", file);
  c.n_q = jint(t, "num_attention_heads", file);
  c.n_kv = jint(t, "num_key_value_heads", file, c.n_q);
  c.d_h = jint(t, "head_dim", file, c.hidden / c.n_q);
  if (c.family != Family::Qwen3) {
    c.n_k = jint(t, "linear_num_key_heads", file);
    c.n_v = jint(t, "linear_num_value_heads", file);
    c.d_k = jint(t, "linear_key_head_dim", file);
    c.d_v = jint(t, "linear_value_head_dim", file);
    c.conv_k = jint(t, "linear_conv_kernel_dim", file, 4);
  } else {
    c.n_k = c.n_v = 1;  // no linear-attention layers; 1 keeps the head checks below trivial
    const json* sw = jfind(t, "use_sliding_window");
    QRUN_CHECK(sw == nullptr || !sw->is_boolean() || !sw->get<bool>(),
               "config {}: use_sliding_window is true; sliding-window attention is not supported by "
               "the qwen model (the attention kernels are causal over the whole sample)", file);
    const json* ab = jfind(t, "attention_bias");
    QRUN_CHECK(ab == nullptr || !ab->is_boolean() || !ab->get<bool>(),
               "config {}: attention_bias is true; attention biases are not supported by the qwen "
               "model (no published Qwen3 checkpoint uses them)", file);
  }
  // Qwen3.5-MoE has no dense MLP; Qwen3-Next uses intermediate_size on its dense layers only.
  if (c.family != Family::Qwen35Moe) c.inter = jint(t, "intermediate_size", file);
  c.vocab = jint(t, "vocab_size", file);
  c.max_pos = jint(t, "max_position_embeddings", file, 262144);
  c.eps = jnum(t, "rms_norm_eps", file, 1e-6);
  QRUN_CHECK(c.n_q % c.n_kv == 0 && c.n_v % c.n_k == 0,
             "config {}: heads must divide: num_attention_heads {} / num_key_value_heads {}, "
             "linear_num_value_heads {} / linear_num_key_heads {}", file, c.n_q, c.n_kv, c.n_v, c.n_k);
  // Rope: rope_parameters (transformers v5) or plain fields (older configs).
  const json* rp = jfind(t, "rope_parameters");
  if (rp == nullptr) rp = jfind(t, "rope_scaling");
  // Defaults as transformers: Qwen3 rotates the whole head with theta 10000 unless told otherwise.
  const bool qwen3 = c.family == Family::Qwen3;
  c.rope_theta = jnum(t, "rope_theta", file, qwen3 ? 10000.0 : 1e7);
  c.partial_rotary = jnum(t, "partial_rotary_factor", file, qwen3 ? 1.0 : 0.25);
  if (rp != nullptr && rp->is_object()) {
    c.rope_theta = jnum(*rp, "rope_theta", file, c.rope_theta);
    c.partial_rotary = jnum(*rp, "partial_rotary_factor", file, c.partial_rotary);
    std::string type = rp->value("rope_type", std::string("default"));
    QRUN_CHECK(type == "default", "config {}: rope_type '{}' is not supported (only 'default')",
               file, type);
  }
  QRUN_CHECK(c.partial_rotary > 0 && c.partial_rotary <= 1 && c.rot_dim() % 2 == 0,
             "config {}: partial_rotary_factor {} gives an odd or empty rotary dim for head_dim {}",
             file, c.partial_rotary, c.d_h);
  // tie_word_embeddings: the top-level field first (section 1.1).
  if (const json* tw = jfind(top, "tie_word_embeddings")) c.tied = tw->get<bool>();
  else if (const json* tw2 = jfind(t, "tie_word_embeddings")) c.tied = tw2->get<bool>();
  if (const json* lt = jfind(t, "layer_types")) {
    QRUN_CHECK(lt->is_array() && static_cast<int64_t>(lt->size()) == c.layers,
               "config {}: layer_types must list {} layers", file, c.layers);
    for (const auto& e : *lt) {
      std::string s = e.is_string() ? e.get<std::string>() : e.dump();
      if ((s == "linear_attention" || s == "mamba") && !qwen3) c.full.push_back(false);
      else if (s == "full_attention" || s == "attention") c.full.push_back(true);
      else fail("config {}: unknown layer type '{}' (expected {})", file, s,
                qwen3 ? "full_attention" : "linear_attention or full_attention");
    }
  } else {
    c.full = qwen3 ? std::vector<bool>(c.layers, true)
                   : interval_layers(c.layers, jint(t, "full_attention_interval", file, 4));
  }
  for (const char* k : {"bos_token_id", "eos_token_id", "pad_token_id"})
    if (const json* v = jfind(t, k)) c.extra[k] = *v;
  c.moe.assign(c.layers, false);
  if (c.family != Family::Qwen35 && c.family != Family::Qwen3) {
    // Section 2.6 (HF-N Qwen3NextSparseMoeBlock / decoder layer, Qwen3_5MoeSparseMoeBlock).
    c.experts = jint(t, "num_experts", file);
    c.top_k = jint(t, "num_experts_per_tok", file);
    c.moe_inter = jint(t, "moe_intermediate_size", file);
    c.shared_inter = jint(t, "shared_expert_intermediate_size", file);
    QRUN_CHECK(c.top_k <= c.experts, "config {}: num_experts_per_tok {} exceeds num_experts {}",
               file, c.top_k, c.experts);
    if (c.family == Family::Next) {
      if (const json* v = jfind(t, "norm_topk_prob")) {
        QRUN_CHECK(v->is_boolean(), "config {}: field 'norm_topk_prob' must be true or false, got {}",
                   file, v->dump());
        c.norm_topk = v->get<bool>();
      }
      const int64_t step = jint(t, "decoder_sparse_step", file, 1);
      std::set<int64_t> dense_only;
      if (const json* v = jfind(t, "mlp_only_layers")) {
        QRUN_CHECK(v->is_array(), "config {}: field 'mlp_only_layers' must be a list of layer "
                   "indices, got {}", file, v->dump());
        for (const auto& e : *v) {
          QRUN_CHECK(e.is_number_integer(), "config {}: mlp_only_layers entry {} is not a layer "
                     "index", file, e.dump());
          dense_only.insert(e.get<int64_t>());
        }
      }
      for (int64_t i = 0; i < c.layers; ++i)
        c.moe[i] = dense_only.count(i) == 0 && (i + 1) % step == 0;
    } else {
      c.moe.assign(c.layers, true);  // Qwen3_5MoeDecoderLayer: always the sparse block, top-k renormalised
    }
    if (const json* v = jfind(t, "output_router_logits"); v != nullptr && v->is_boolean() && v->get<bool>())
      log_warn("qwen: config {} sets output_router_logits; qrun trains with the cross-entropy loss "
               "only (no router load-balancing loss)", file);
  }
  return c;
}

// A model named by a local directory or a hub id in the local Hugging Face cache (offline). The
// cache layout (huggingface_hub): <root>/models--org--name/refs/<branch or tag> holds a commit
// hash, snapshots/<hash>/ holds the files (symlinks into blobs/). `revision` is a branch or tag
// (looked up under refs/) or a commit hash (a snapshots/ folder).
std::string resolve_model_dir(const std::string& name, const std::string& revision) {
  if (fs::is_directory(name)) return name;
  static const std::regex hub_id("^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$");
  QRUN_CHECK(!fs::exists(name), "model path {} exists but is not a directory", name);
  QRUN_CHECK(std::regex_match(name, hub_id),
             "model path {} does not exist (give a checkpoint directory or a hub id org/name)", name);
  std::vector<std::string> roots;
  if (const char* c = std::getenv("HF_HUB_CACHE")) roots.push_back(c);
  if (const char* h = std::getenv("HF_HOME")) roots.push_back(std::string(h) + "/hub");
  if (const char* x = std::getenv("XDG_CACHE_HOME")) roots.push_back(std::string(x) + "/huggingface/hub");
  if (const char* home = std::getenv("HOME")) roots.push_back(std::string(home) + "/.cache/huggingface/hub");
  std::string repo = "models--" + std::regex_replace(name, std::regex("/"), "--");
  QRUN_CHECK(!revision.empty() && revision.find("..") == std::string::npos,
             "model revision '{}' is not a branch, tag or commit hash", revision);
  for (const auto& r : roots) {
    fs::path d = fs::path(r) / repo;
    if (!fs::is_directory(d / "snapshots")) continue;
    std::ifstream ref(d / "refs" / revision);
    std::string commit;
    if (ref >> commit) {
      QRUN_CHECK(fs::is_directory(d / "snapshots" / commit),
                 "model '{}': {} names commit {} but {} is missing (an interrupted download? "
                 "run `hf download {} --revision {}` again)", name,
                 (d / "refs" / revision).string(), commit, (d / "snapshots" / commit).string(),
                 name, revision);
      return (d / "snapshots" / commit).string();
    }
    if (fs::is_directory(d / "snapshots" / revision)) return (d / "snapshots" / revision).string();
    std::vector<std::string> have;
    for (const auto& e : fs::directory_iterator(d / "snapshots"))
      if (e.is_directory()) have.push_back(e.path().filename().string());
    std::sort(have.begin(), have.end());
    fail("model '{}' is in the Hugging Face cache ({}) but revision '{}' is not: no refs/{} and no "
         "snapshot of that name (snapshots: {}); download it with `hf download {} "
         "--revision {}` or set model.revision", name, d.string(), revision, revision,
         have.empty() ? std::string("none") : fmt::format("{}", fmt::join(have, ", ")), name, revision);
  }
  fail("model '{}' is not a local directory and is not in the Hugging Face cache (looked in {}); "
       "download it first, e.g. `hf download {}`, or set model.path to a checkpoint "
       "directory", name, fmt::join(roots, ", "), name);
}

// ---------------------------------------------------------------------------------------------
// Checkpoint reading

struct CkptTensor {
  std::shared_ptr<safetensors::File> file;
  const safetensors::TensorInfo* info = nullptr;
};

c10::ScalarType st_dtype(const std::string& d, bool& ok) {
  ok = true;
  if (d == "F32") return at::kFloat;
  if (d == "BF16") return at::kBFloat16;
  if (d == "F16") return at::kHalf;
  if (d == "F64") return at::kDouble;
  ok = false;
  return at::kFloat;
}

std::string st_name(c10::ScalarType t) {
  switch (t) {
    case at::kFloat: return "F32";
    case at::kBFloat16: return "BF16";
    case at::kHalf: return "F16";
    case at::kDouble: return "F64";
    default: QRUN_ASSERT(false, "cannot save dtype {}", c10::toString(t));
  }
  return "";
}

// name -> tensor over all files of a checkpoint directory.
std::map<std::string, CkptTensor> open_checkpoint(const std::string& dir) {
  std::map<std::string, CkptTensor> out;
  fs::path index = fs::path(dir) / "model.safetensors.index.json";
  std::vector<std::string> files;
  if (fs::exists(index)) {
    std::ifstream in(index);
    std::stringstream ss;
    ss << in.rdbuf();
    json j = json::parse(ss.str(), nullptr, false);
    QRUN_CHECK(!j.is_discarded() && j.is_object() && j.contains("weight_map") &&
                   j["weight_map"].is_object(),
               "checkpoint index {} is not valid JSON with a weight_map object", index.string());
    std::set<std::string> names;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      QRUN_CHECK(it.value().is_string(), "checkpoint index {}: entry '{}' is not a file name",
                 index.string(), it.key());
      std::string f = it.value().get<std::string>();
      QRUN_CHECK(f.find('/') == std::string::npos && f.find("..") == std::string::npos,
                 "checkpoint index {}: file name '{}' must be a plain name in the directory",
                 index.string(), f);
      names.insert(f);
    }
    files.assign(names.begin(), names.end());
  } else if (fs::exists(fs::path(dir) / "model.safetensors")) {
    files.push_back("model.safetensors");
  } else {
    fail("checkpoint {} has neither model.safetensors nor model.safetensors.index.json", dir);
  }
  for (const auto& f : files) {
    auto file = std::make_shared<safetensors::File>(safetensors::open((fs::path(dir) / f).string()));
    for (const auto& t : file->header.tensors) out[t.name] = CkptTensor{file, &t};
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Activation checkpointing, see Note [Layer recompute].

struct LayerClosure : torch::CustomClassHolder {
  std::function<at::Tensor(const at::Tensor&)> fn;
  std::vector<at::Tensor> params;  // the leaves the layer reads (those that require grad)
};

struct CheckpointedLayer : public torch::autograd::Function<CheckpointedLayer> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, at::Tensor x,
                            at::TensorList params, c10::intrusive_ptr<LayerClosure> closure) {
    (void)params;
    ctx->saved_data["closure"] = c10::IValue::make_capsule(closure);
    ctx->save_for_backward({x});
    at::NoGradGuard no_grad;
    return closure->fn(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    auto closure =
        c10::static_intrusive_pointer_cast<LayerClosure>(ctx->saved_data["closure"].toCapsule());
    at::Tensor x = ctx->get_saved_variables()[0];
    const bool x_grad = x.requires_grad();
    at::Tensor xd = x.detach().requires_grad_(x_grad);
    at::Tensor y;
    {
      at::AutoGradMode enable(true);
      y = closure->fn(xd);
    }
    std::vector<at::Tensor> inputs;
    if (x_grad) inputs.push_back(xd);
    inputs.insert(inputs.end(), closure->params.begin(), closure->params.end());
    auto grads = torch::autograd::grad({y}, inputs, {grad_out[0]}, /*retain_graph=*/false,
                                       /*create_graph=*/false, /*allow_unused=*/true);
    torch::autograd::variable_list out;
    size_t gi = 0;
    out.push_back(x_grad ? grads[gi++] : at::Tensor());
    for (size_t i = 0; i < closure->params.size(); ++i) out.push_back(grads[gi++]);
    out.push_back(at::Tensor());  // the closure
    return out;
  }
};

// ---------------------------------------------------------------------------------------------
// Unit boundaries (sdk model.h, Note [Parameter units]): an identity on a unit's output whose
// backward tells the sharding that unit u's backward is about to run.

struct UnitExitFn : public torch::autograd::Function<UnitExitFn> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, int64_t unit,
                            int64_t hooks) {
    ctx->saved_data["unit"] = unit;
    ctx->saved_data["hooks"] = hooks;
    return x;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    auto* hooks = reinterpret_cast<UnitHooks*>(static_cast<intptr_t>(ctx->saved_data["hooks"].toInt()));
    hooks->before_backward(static_cast<size_t>(ctx->saved_data["unit"].toInt()));
    return {grad[0], at::Tensor(), at::Tensor()};
  }
};

// ---------------------------------------------------------------------------------------------
// The model

enum class Init { Normal, Zeros, Ones, ALog, Conv };

struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;
  Init init;
  bool fp32;  // kept in fp32 whatever param_dtype is
};

struct Layer {
  bool full = false, moe = false;
  at::Tensor in_norm, post_norm, gate, up, down;                              // dense SwiGLU MLP
  at::Tensor router, ex_gate_up, ex_down, sh_gate, sh_up, sh_down, sh_gate_w; // sparse MoE MLP
  at::Tensor q_proj, k_proj, v_proj, o_proj, q_norm, k_norm;                 // full attention
  at::Tensor qkv, z, b, a, conv, dt_bias, A_log, gnorm, out;                  // Gated DeltaNet
  at::Tensor qkvz, ba;                                                        // ... fused (Qwen3-Next)
  std::vector<at::Tensor> all;
};

// Note [Expert parameters]: the experts of a MoE layer are two parameters in transformers'
// in-memory layout and names, `mlp.experts.gate_up_proj` [E, 2I, H] (gate rows first, then up)
// and `mlp.experts.down_proj` [E, H, I]: one tensor per layer for the optimizer, gradients that
// compare by name with transformers. Checkpoints (published ones and what transformers 5.17's
// save_pretrained writes) hold one tensor per expert and projection,
// `mlp.experts.{e}.{gate,up,down}_proj.weight`; load() gathers them and save() splits them back.

// Per-forward state the layers share (RoPE tables, padding mask).
struct FwdCtx {
  SeqInfo seq;
  at::Tensor cos, sin;   // [.., rot_dim] in compute dtype
  at::Tensor pad_mask;   // padded only: [B, S, 1] in compute dtype
};

class QwenModel final : public Model {
 public:
  explicit QwenModel(const Config& cfg) {
    QRUN_CHECK(!(cfg.has("path") && cfg.get_string("preset") != "none"),
               "{}: give either `path` (a checkpoint) or `preset`, not both", cfg.path());
    if (cfg.has("path")) {
      // (Configs built in code, not by the recipe validator, may lack the defaulted field.)
      dir_ = resolve_model_dir(cfg.get_string("path"),
                               cfg.has("revision") ? cfg.get_string("revision") : std::string("main"));
      try {
        c_ = parse_config((fs::path(dir_) / "config.json").string());
      } catch (Error& e) {
        e.add_context(fmt::format("while reading the model config ({})", cfg.location("path")));
        throw;
      }
    } else {
      QRUN_CHECK(cfg.get_string("preset") != "none",
                 "{}: give `path` (a Hugging Face checkpoint directory or hub id) or `preset` "
                 "(0.8b, 2b, 4b, 9b, 27b, tiny, demo)", cfg.path());
      preset_ = cfg.get_string("preset");
      c_ = preset_config(preset_);
    }
    int64_t nl = cfg.get_int("num_layers");
    if (nl > 0) {
      if (dir_.empty()) {
        c_.layers = nl;
        c_.full = interval_layers(nl, 4);
        c_.moe.assign(nl, false);
      } else {
        QRUN_CHECK(nl <= c_.layers, "{}: num_layers {} exceeds the checkpoint's {} layers",
                   cfg.location("num_layers"), nl, c_.layers);
        c_.layers = nl;
        c_.full.resize(nl);
        c_.moe.resize(nl);
      }
    }
    ac_ = cfg.get_string("activation_checkpointing") == "full";
    shard_bytes_ = cfg.get_int("save_shard_bytes");
  }

  void build(const ModelKernels& k, const ModelPlacement& p) override {
    // sdk model.h: a null kernel means the recipe named none and no default is installed.
    auto need = [](const void* p, const char* kind, const char* ref) {
      QRUN_CHECK(p != nullptr, "the qwen model needs a {} kernel: set kernels.{} in the recipe "
                 "(e.g. {}, from the reference-kernels plugin)", kind, kind, ref);
    };
    need(k.attention, "attention", "sdpa");
    need(k.linear_attention, "linear_attention", "gdn-reference");
    need(k.conv1d, "conv1d", "conv-reference");
    need(k.ops, "ops", "reference");
    QRUN_ASSERT(!built_, "qwen model built twice");
    k_ = k;
    // The operations this model calls, resolved once (a missing one is a UserError naming it).
    rms_norm_ = k.ops->get<op::RmsNorm>();
    add_rms_norm_ = k.ops->get<op::AddRmsNorm>();
    gated_rms_norm_ = k.ops->get<op::GatedRmsNorm>();
    swiglu_ = k.ops->get<op::SwiGlu>();
    swiglu_packed_ = k.ops->get<op::SwiGluPacked>();
    qk_norm_rope_ = k.ops->get<op::QkNormRope>();
    linear_cross_entropy_ = k.ops->get<op::LinearCrossEntropy>();
    place_ = p;
    std::vector<ParamSpec> specs = param_specs();
    if (dir_.empty()) init_random(specs);
    else load_checkpoint(specs);
    bind();
    built_ = true;
    log_info("qwen: {}", summary().description);
  }

  ModelOutput forward(const Batch& batch, bool return_logits) override {
    QRUN_ASSERT(built_, "qwen model used before build()");
    const SeqInfo& seq = batch.seq;
    const bool padded = batch.layout == Layout::Padded;
    QRUN_CHECK(batch.input_ids.dim() == (padded ? 2 : 1),
               "qwen: input_ids must be [T] (packed) or [B, S] (padded), got {}",
               batch.input_ids.sizes());
    const auto cdt = place_.compute_dtype;
    FwdCtx ctx;
    ctx.seq = seq;
    // RoPE tables (section 2.4 step 4): angles in fp32, cos/sin cast to the activation dtype.
    at::Tensor ang = batch.position_ids.to(acc()).unsqueeze(-1) * inv_freq_.to(acc());
    at::Tensor emb = at::cat({ang, ang}, -1);
    ctx.cos = emb.cos().to(cdt).unsqueeze(-2);
    ctx.sin = emb.sin().to(cdt).unsqueeze(-2);
    if (padded) {
      QRUN_CHECK(seq.attention_mask.defined(), "qwen: a padded batch needs seq.attention_mask");
      ctx.pad_mask = seq.attention_mask.to(cdt).unsqueeze(-1);
    }
    // Note [Parameter units] (sdk model.h): unit 0 the embedding (and the head when tied), unit
    // 1 + i layer i, the last unit the head; the hooks are no-ops without a sharding that needs them.
    const size_t head_unit = c_.tied ? 0 : layers_.size() + 1;
    before_forward(0);
    at::Tensor x = at::embedding(w(embed_), batch.input_ids);
    if (!c_.tied) after_forward(0);
    x = unit_exit(x, 0);
    for (size_t i = 0; i < layers_.size(); ++i) {
      before_forward(1 + i);
      if (ac_ && at::GradMode::is_enabled()) {
        auto closure = c10::make_intrusive<LayerClosure>();
        closure->fn = [this, i, ctx](const at::Tensor& h) { return layer_forward(i, h, ctx); };
        for (const auto& t : layers_[i].all)
          if (t.requires_grad()) closure->params.push_back(t);
        std::vector<at::Tensor> ps = closure->params;
        x = CheckpointedLayer::apply(x, at::TensorList(ps), closure);
      } else {
        x = layer_forward(i, x, ctx);
      }
      after_forward(1 + i);
      x = unit_exit(x, 1 + i);
    }
    if (head_unit != 0) before_forward(head_unit);
    x = rms_norm_(x, norm_, c_.eps, c_.zero_centred());
    at::Tensor W = w(c_.tied ? embed_ : lm_head_);
    at::Tensor targets = shifted_targets(batch);
    ModelOutput out;
    out.loss_sum = linear_cross_entropy_(x.reshape({-1, c_.hidden}), W, targets.reshape({-1}));
    // The collator's exact host count (batch.h): no device->host read inside the step.
    out.loss_tokens = batch.loss_tokens;
    if (return_logits) out.logits = at::linear(x, W).to(acc());  // fp32 (fp64 in the fp64 mode)
    after_forward(head_unit);
    out.loss_sum = unit_exit(out.loss_sum, head_unit);
    return out;
  }

  std::vector<ParamUnit> units() const override {
    std::vector<ParamUnit> u;
    ParamUnit embed{"embed", {"model.embed_tokens.weight"}};
    if (c_.tied) embed.params.push_back("model.norm.weight");  // the head shares the embedding's unit
    u.push_back(embed);
    for (int64_t i = 0; i < c_.layers; ++i) {
      ParamUnit l{fmt::format("layers.{}", i), {}};
      const std::string prefix = fmt::format("model.layers.{}.", i);
      for (const auto& [n, p] : params_)
        if (n.rfind(prefix, 0) == 0) l.params.push_back(n);
      u.push_back(l);
    }
    if (!c_.tied) u.push_back({"head", {"model.norm.weight", "lm_head.weight"}});
    return u;
  }

  void set_unit_hooks(UnitHooks* hooks) override { hooks_ = hooks; }

  std::vector<std::pair<std::string, at::Tensor>> named_parameters() override { return params_; }

  // Note [Save layout]: a model loaded from a checkpoint is saved in that checkpoint's layout, so
  // the folder is a drop-in replacement: its config.json as read (only num_hidden_layers,
  // layer_types and dtype updated), its key prefix (`model.language_model.` for the image-text
  // checkpoints), and its mtp.* / visual.* tensors copied byte for byte from the mmap'd source.
  // Preset-built models are written as the text-only causal LM of their family.
  void save(const std::string& dir, const std::map<std::string, at::Tensor>& values) override {
    QRUN_ASSERT(built_, "qwen model saved before build()");
    std::error_code ec;
    QRUN_CHECK(dir_.empty() || !fs::equivalent(dir, dir_, ec),
               "qwen: cannot save into {}, the checkpoint the model was loaded from (its mtp/visual "
               "tensors are read from those files while saving); save into a new directory", dir);
    const char* dtype = place_.param_dtype == at::kBFloat16 ? "bfloat16"
                        : place_.param_dtype == at::kHalf   ? "float16"
                        : place_.param_dtype == at::kDouble ? "float64"
                                                            : "float32";
    json c;
    if (!c_.source.is_null()) {
      c = c_.source;
      json& t = (c.contains("text_config") && c["text_config"].is_object()) ? c["text_config"] : c;
      t["num_hidden_layers"] = c_.layers;
      if (t.contains("layer_types") && t["layer_types"].is_array() &&
          static_cast<int64_t>(t["layer_types"].size()) > c_.layers)
        t["layer_types"].erase(t["layer_types"].begin() + c_.layers, t["layer_types"].end());
      for (json* o : {&c, &t}) {
        if (o->contains("torch_dtype")) (*o)["torch_dtype"] = dtype;
        if (o == &c || o->contains("dtype")) (*o)["dtype"] = dtype;
      }
    } else {
      c = preset_config_json();
      c["dtype"] = dtype;
    }
    write_text((fs::path(dir) / "config.json").string(), c.dump(2));

    // The tensors to write: parameters under their checkpoint names (experts split per Note
    // [Expert parameters]), then the pass-through tensors.
    struct Out {
      std::string name;
      at::Tensor t;                 // a parameter (or a slice of one), on the CPU
      const CkptTensor* raw = nullptr;
      int64_t nbytes() const {
        return raw ? static_cast<int64_t>(raw->info->end - raw->info->begin)
                   : t.numel() * static_cast<int64_t>(t.element_size());
      }
    };
    auto ckpt_name = [&](const std::string& n) {
      return n.rfind("model.", 0) == 0 ? prefix_ + n.substr(6) : n;
    };
    std::vector<Out> outs;
    for (const auto& [name, p] : params_) {
      auto given = values.find(name);
      QRUN_ASSERT(values.empty() || given != values.end(), "qwen save: no value given for {}", name);
      at::Tensor t = (values.empty() ? p.detach() : given->second).to(at::kCPU);
      const bool gate_up = name.ends_with(".mlp.experts.gate_up_proj");
      if (gate_up || name.ends_with(".mlp.experts.down_proj")) {
        const std::string base = ckpt_name(name.substr(0, name.rfind('.') + 1));
        const int64_t I = t.size(1) / 2;
        for (int64_t e = 0; e < t.size(0); ++e) {
          if (gate_up) {
            outs.push_back({fmt::format("{}{}.gate_proj.weight", base, e), t[e].narrow(0, 0, I).contiguous()});
            outs.push_back({fmt::format("{}{}.up_proj.weight", base, e), t[e].narrow(0, I, I).contiguous()});
          } else {
            outs.push_back({fmt::format("{}{}.down_proj.weight", base, e), t[e].contiguous()});
          }
        }
      } else {
        outs.push_back({ckpt_name(name), t.contiguous()});
      }
    }
    for (const auto& raw : passthrough_) outs.push_back({raw.info->name, at::Tensor(), &raw});

    // Shards of at most save_shard_bytes (a tensor larger than that gets a shard of its own).
    std::vector<std::vector<size_t>> shards(1);
    int64_t cur = 0, total = 0;
    for (size_t i = 0; i < outs.size(); ++i) {
      const int64_t nb = outs[i].nbytes();
      if (cur > 0 && cur + nb > shard_bytes_) {
        shards.emplace_back();
        cur = 0;
      }
      shards.back().push_back(i);
      cur += nb;
      total += nb;
    }
    json weight_map = json::object();
    const size_t n = shards.size();
    for (size_t s = 0; s < n; ++s) {
      std::string fname = fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, n);
      std::vector<safetensors::WriteTensor> ts;
      for (size_t i : shards[s]) {
        const Out& o = outs[i];
        if (o.raw != nullptr) {
          const auto& info = *o.raw->info;
          ts.push_back({o.name, info.dtype, info.shape, o.raw->file->tensor_data(info),
                        static_cast<size_t>(info.end - info.begin)});
        } else {
          ts.push_back({o.name, st_name(o.t.scalar_type()), o.t.sizes().vec(), o.t.data_ptr(),
                        static_cast<size_t>(o.nbytes())});
        }
        weight_map[o.name] = fname;
      }
      safetensors::write_file((fs::path(dir) / fname).string(), ts, {{"format", "pt"}});
    }
    json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    write_text((fs::path(dir) / "model.safetensors.index.json").string(), index.dump(2));
  }

  double train_flops_per_token(const std::vector<int64_t>& seq_lens) const override {
    // Section 7.2: dense matmuls + causal attention scores + chunked GDN core; x3 for training.
    const double H = c_.hidden, Lf = c_.num_full(), Ll = c_.num_linear(), L = c_.layers;
    // MLP: dense layers 3HI; MoE layers count the active experts only: router HE, top_k experts
    // 3H·I_moe each, the shared expert 3H·I_shared and its gate H (spec: Qwen3-Next-80B-A3B 24.42).
    const double L_moe = static_cast<double>(std::count(c_.moe.begin(), c_.moe.end(), true));
    const double mlp = (L - L_moe) * 3.0 * H * c_.inter +
                       L_moe * (H * c_.experts + c_.top_k * 3.0 * H * c_.moe_inter +
                                3.0 * H * c_.shared_inter + H);
    const double q_rows = c_.attn_gate() ? 2.0 : 1.0;  // query (+ output gate) rows per head dim
    const double n_mm = c_.vocab * H + Lf * H * ((q_rows + 1.0) * c_.n_q * c_.d_h + 2.0 * c_.n_kv * c_.d_h) +
                        Ll * H * (2.0 * c_.n_k * c_.d_k + 3.0 * c_.n_v * c_.d_v + 2.0 * c_.n_v) + mlp;
    double tokens = 0, pairs = 0;
    for (int64_t s : seq_lens) {
      tokens += s;
      pairs += 0.5 * static_cast<double>(s) * (s + 1);
    }
    const double s_bar = tokens > 0 ? pairs / tokens : 0.0;
    const double C = 64;
    const double f_att = Lf * 4.0 * c_.n_q * c_.d_h * s_bar;
    const double f_gdn = Ll * c_.n_v *
                         (2.0 * C * (3.0 * c_.d_k + 2.0 * c_.d_v) + 6.0 * c_.d_k * c_.d_v +
                          (2.0 / 3.0) * C * C);
    return 3.0 * (2.0 * n_mm + f_att + f_gdn);
  }

  // What autograd keeps per token (Note [Activation estimate]): an estimate for the memory model.
  double activation_bytes_per_token(bool checkpointing, int b) const override {
    // Note [Activation estimate]: per token, in elements of the activation dtype, what the
    // backward holds of one layer: its input and the norms' outputs (3 H), the attention layer's
    // q/gate, k, v projections, normalised and rotated q/k, output and gated output
    // (2 n_q d_h + 4 n_kv d_h + 3 n_q d_h), or the Gated DeltaNet layer's projections, conv
    // output, kernel inputs and outputs, gated norm (3 conv_dim + 4 value_dim + 4 n_v), and the
    // MLP's gate, up and SwiGLU output (3 I); plus the fused gated delta rule's kept prep, about
    // 33 KiB per token at 48 value heads (linear in the heads). With checkpointing only each
    // layer's input stays (H per layer), plus one layer's full set while it is recomputed.
    const double H = c_.hidden, I = c_.inter, Lf = c_.num_full(), Ll = c_.num_linear();
    const double attn = 3 * H + 2 * c_.n_q * c_.d_h + 4 * c_.n_kv * c_.d_h + 3 * c_.n_q * c_.d_h + 3 * I;
    const double gdn = 3 * H + 3 * c_.conv_dim() + 4 * c_.value_dim() + 4 * c_.n_v + 3 * I;
    const double prep = 33.0 * 1024 / 48 * c_.n_v;  // bytes
    const double per_layer_attn = attn * b, per_layer_gdn = gdn * b + prep;
    if (!checkpointing) return Lf * per_layer_attn + Ll * per_layer_gdn;
    return (Lf + Ll) * H * b + std::max(per_layer_attn, per_layer_gdn);
  }

  std::vector<KernelUse> kernel_uses() const override {
    std::vector<KernelUse> u;
    if (c_.num_full() > 0) {
      KernelUse a;
      a.kind = Attention::kKind;
      a.heads = c_.n_q, a.kv_heads = c_.n_kv, a.head_dim = c_.d_h;
      a.what = fmt::format("the {} full-attention layers", c_.num_full());
      u.push_back(a);
    }
    if (c_.num_linear() > 0) {
      KernelUse g;
      g.kind = LinearAttention::kKind;
      g.heads = c_.n_k, g.kv_heads = c_.n_v, g.head_dim = c_.d_k, g.value_dim = c_.d_v;
      g.what = fmt::format("the {} Gated DeltaNet layers", c_.num_linear());
      u.push_back(g);
      KernelUse cv;
      cv.kind = Conv1d::kKind;
      cv.channels = c_.conv_dim(), cv.width = c_.conv_k;
      cv.what = "the Gated DeltaNet layers' q/k/v conv";
      u.push_back(cv);
    }
    KernelUse o;
    o.kind = Ops::kKind;
    o.channels = c_.hidden, o.head_dim = c_.d_h, o.value_dim = c_.vocab;
    o.what = "norms, SwiGLU and the loss";
    u.push_back(o);
    return u;
  }

  ModelSummary summary() const override {
    ModelSummary s;
    s.family = c_.family_name();
    s.num_layers = c_.layers;
    s.hidden_size = c_.hidden;
    s.vocab_size = c_.vocab;
    int64_t n = 0;
    for (const auto& p : params_) n += p.second.numel();
    if (params_.empty()) {
      for (const auto& sp : param_specs()) {
        int64_t e = 1;
        for (int64_t d : sp.shape) e *= d;
        n += e;
      }
    }
    s.num_parameters = n;
    const int64_t n_moe = std::count(c_.moe.begin(), c_.moe.end(), true);
    s.description = fmt::format(
        "{}, {} layers ({} GDN + {} attn{}), hidden {}, {} params, {} embeddings, from {}",
        c_.family == Family::Next        ? "Qwen3-Next hybrid"
        : c_.family == Family::Qwen35Moe ? "Qwen3.5-MoE hybrid"
        : c_.family == Family::Qwen3     ? "Qwen3 dense"
                                         : "Qwen3.5 hybrid",
        c_.layers, c_.num_linear(), c_.num_full(),
        n_moe > 0 ? fmt::format("; {} MoE MLPs, {} experts, top {}", n_moe, c_.experts, c_.top_k) : "",
        c_.hidden, n, c_.tied ? "tied" : "untied", dir_.empty() ? "preset " + preset_ : dir_);
    return s;
  }

 private:
  // config.json of a preset-built model: the text-only Qwen3_5ForCausalLM layout (keys `model.*`).
  json preset_config_json() const {
    json c;
    c["architectures"] = {"Qwen3_5ForCausalLM"};
    c["model_type"] = "qwen3_5_text";
    c["hidden_size"] = c_.hidden;
    c["intermediate_size"] = c_.inter;
    c["num_hidden_layers"] = c_.layers;
    c["num_attention_heads"] = c_.n_q;
    c["num_key_value_heads"] = c_.n_kv;
    c["head_dim"] = c_.d_h;
    c["linear_num_key_heads"] = c_.n_k;
    c["linear_num_value_heads"] = c_.n_v;
    c["linear_key_head_dim"] = c_.d_k;
    c["linear_value_head_dim"] = c_.d_v;
    c["linear_conv_kernel_dim"] = c_.conv_k;
    std::vector<std::string> lt;
    for (bool f : c_.full) lt.push_back(f ? "full_attention" : "linear_attention");
    c["layer_types"] = lt;
    c["rms_norm_eps"] = c_.eps;
    c["vocab_size"] = c_.vocab;
    c["max_position_embeddings"] = c_.max_pos;
    c["tie_word_embeddings"] = c_.tied;
    c["hidden_act"] = "silu";
    c["attention_bias"] = false;
    c["rope_parameters"] = {{"rope_type", "default"},
                            {"rope_theta", c_.rope_theta},
                            {"partial_rotary_factor", c_.partial_rotary}};
    for (auto it = c_.extra.begin(); it != c_.extra.end(); ++it) c[it.key()] = it.value();
    return c;
  }

  static void write_text(const std::string& path, const std::string& text) {
    std::ofstream out(path, std::ios::trunc);
    out << text << "\n";
    QRUN_CHECK(out.good(), "cannot write {}", path);
  }

  std::vector<ParamSpec> param_specs() const {
    std::vector<ParamSpec> s;
    const int64_t H = c_.hidden;
    s.push_back({"model.embed_tokens.weight", {c_.vocab, H}, Init::Normal, false});
  const Init norm_init = c_.zero_centred() ? Init::Zeros : Init::Ones;
    for (int64_t i = 0; i < c_.layers; ++i) {
      std::string p = fmt::format("model.layers.{}.", i);
      s.push_back({p + "input_layernorm.weight", {H}, norm_init, false});
      if (c_.full[i]) {
        s.push_back({p + "self_attn.q_proj.weight", {(c_.attn_gate() ? 2 : 1) * c_.n_q * c_.d_h, H},
                     Init::Normal, false});
        s.push_back({p + "self_attn.k_proj.weight", {c_.n_kv * c_.d_h, H}, Init::Normal, false});
        s.push_back({p + "self_attn.v_proj.weight", {c_.n_kv * c_.d_h, H}, Init::Normal, false});
        s.push_back({p + "self_attn.o_proj.weight", {H, c_.n_q * c_.d_h}, Init::Normal, false});
        s.push_back({p + "self_attn.q_norm.weight", {c_.d_h}, norm_init, false});
        s.push_back({p + "self_attn.k_norm.weight", {c_.d_h}, norm_init, false});
      } else if (c_.fused_gdn()) {
        s.push_back({p + "linear_attn.in_proj_qkvz.weight", {c_.conv_dim() + c_.value_dim(), H},
                     Init::Normal, false});
        s.push_back({p + "linear_attn.in_proj_ba.weight", {2 * c_.n_v, H}, Init::Normal, false});
      } else {
        s.push_back({p + "linear_attn.in_proj_qkv.weight", {c_.conv_dim(), H}, Init::Normal, false});
        s.push_back({p + "linear_attn.in_proj_z.weight", {c_.value_dim(), H}, Init::Normal, false});
        s.push_back({p + "linear_attn.in_proj_b.weight", {c_.n_v, H}, Init::Normal, false});
        s.push_back({p + "linear_attn.in_proj_a.weight", {c_.n_v, H}, Init::Normal, false});
      }
      if (!c_.full[i]) {
        s.push_back({p + "linear_attn.conv1d.weight", {c_.conv_dim(), 1, c_.conv_k}, Init::Conv, false});
        s.push_back({p + "linear_attn.dt_bias", {c_.n_v}, Init::Ones, false});
        s.push_back({p + "linear_attn.A_log", {c_.n_v}, Init::ALog, true});
        s.push_back({p + "linear_attn.norm.weight", {c_.d_v}, Init::Ones, true});
        s.push_back({p + "linear_attn.out_proj.weight", {H, c_.value_dim()}, Init::Normal, false});
      }
      s.push_back({p + "post_attention_layernorm.weight", {H}, norm_init, false});
      if (c_.moe[i]) {
        // See Note [Expert parameters].
        const int64_t E = c_.experts, I = c_.moe_inter, S = c_.shared_inter;
        s.push_back({p + "mlp.gate.weight", {E, H}, Init::Normal, false});
        s.push_back({p + "mlp.experts.gate_up_proj", {E, 2 * I, H}, Init::Normal, false});
        s.push_back({p + "mlp.experts.down_proj", {E, H, I}, Init::Normal, false});
        s.push_back({p + "mlp.shared_expert.gate_proj.weight", {S, H}, Init::Normal, false});
        s.push_back({p + "mlp.shared_expert.up_proj.weight", {S, H}, Init::Normal, false});
        s.push_back({p + "mlp.shared_expert.down_proj.weight", {H, S}, Init::Normal, false});
        s.push_back({p + "mlp.shared_expert_gate.weight", {1, H}, Init::Normal, false});
      } else {
        s.push_back({p + "mlp.gate_proj.weight", {c_.inter, H}, Init::Normal, false});
        s.push_back({p + "mlp.up_proj.weight", {c_.inter, H}, Init::Normal, false});
        s.push_back({p + "mlp.down_proj.weight", {H, c_.inter}, Init::Normal, false});
      }
    }
    s.push_back({"model.norm.weight", {H}, norm_init, false});
    if (!c_.tied) s.push_back({"lm_head.weight", {c_.vocab, H}, Init::Normal, false});
    return s;
  }

  // fp32 parameters stay fp32, or fp64 when the parameters are fp64 (the parity tests' mode).
  at::TensorOptions opts(const ParamSpec& sp) const {
    const auto keep = place_.param_dtype == at::kDouble ? at::kDouble : at::kFloat;
    return at::TensorOptions().device(place_.device).dtype(sp.fp32 ? keep : place_.param_dtype);
  }

  // Random initialisation on the target device: drawing a 27B model on the CPU and copying it
  // takes minutes, on the GPU a second. The generator is the device's own, seeded with the run's
  // seed (so CPU and CUDA runs of one seed start from different, but each reproducible, weights).
  void init_random(const std::vector<ParamSpec>& specs) {
    at::Generator gen;
    if (place_.device.is_cpu()) {
      gen = at::make_generator<at::CPUGeneratorImpl>(place_.seed);
    } else {
      gen = at::globalContext().defaultGenerator(place_.device).clone();
      gen.set_current_seed(place_.seed);
    }
    for (const auto& sp : specs) {
      at::Tensor t = at::empty(sp.shape, at::TensorOptions().dtype(at::kFloat).device(place_.device));
      switch (sp.init) {
        case Init::Normal: t.normal_(0.0, 0.02, gen); break;
        case Init::Zeros: t.zero_(); break;
        case Init::Ones: t.fill_(1.0); break;
        case Init::ALog: t.uniform_(0.01, 16.0, gen).log_(); break;
        case Init::Conv: {
          double bound = 1.0 / std::sqrt(static_cast<double>(c_.conv_k));
          t.uniform_(-bound, bound, gen);
          break;
        }
      }
      params_.emplace_back(sp.name, t.to(opts(sp)).requires_grad_(true));
    }
  }

  void load_checkpoint(const std::vector<ParamSpec>& specs) {
    std::map<std::string, CkptTensor> ck;
    try {
      ck = open_checkpoint(dir_);
    } catch (Error& e) {
      e.add_context(fmt::format("while loading checkpoint {}", dir_));
      throw;
    }
    prefix_ = "model.";
    for (const auto& kv : ck)
      if (kv.first.rfind("model.language_model.", 0) == 0) prefix_ = "model.language_model.";
    std::set<std::string> used;
    // A checkpoint tensor as a CPU tensor in its own dtype (a view of the mmap when aligned).
    auto read = [&](const std::string& key, const std::vector<int64_t>& shape) {
      auto it = ck.find(key);
      QRUN_CHECK(it != ck.end(), "checkpoint {}: tensor '{}' is missing (expected shape {})", dir_,
                 key, shape);
      used.insert(key);
      const auto& info = *it->second.info;
      const std::string& file = it->second.file->map->path();
      QRUN_CHECK(info.shape == shape, "checkpoint {}: tensor '{}' has shape {} but the config "
                 "implies {}", file, key, info.shape, shape);
      bool ok = false;
      c10::ScalarType dt = st_dtype(info.dtype, ok);
      QRUN_CHECK(ok, "checkpoint {}: tensor '{}' has dtype {}, expected a floating dtype "
                 "(F32, BF16, F16, F64)", file, key, info.dtype);
      const uint8_t* ptr = it->second.file->tensor_data(info);
      const size_t es = c10::elementSize(dt);
      if (reinterpret_cast<uintptr_t>(ptr) % es == 0)
        return at::from_blob(const_cast<uint8_t*>(ptr), shape, at::TensorOptions().dtype(dt));
      at::Tensor src = at::empty(shape, at::TensorOptions().dtype(dt));
      std::memcpy(src.data_ptr(), ptr, info.end - info.begin);
      return src;
    };
    auto hub_key = [&](const std::string& name) {
      return name.rfind("model.", 0) == 0 ? prefix_ + name.substr(6) : name;
    };
    for (const auto& sp : specs) {
      at::Tensor t;
      const bool gate_up = sp.name.ends_with(".mlp.experts.gate_up_proj");
      if (gate_up || sp.name.ends_with(".mlp.experts.down_proj")) {
        // See Note [Expert parameters]: one checkpoint tensor per expert and projection.
        const std::string base = hub_key(sp.name.substr(0, sp.name.rfind('.') + 1));
        const int64_t E = sp.shape[0];
        t = at::empty(sp.shape, opts(sp));
        at::NoGradGuard no_grad;
        for (int64_t e = 0; e < E; ++e) {
          if (gate_up) {
            const int64_t I = sp.shape[1] / 2, H = sp.shape[2];
            t[e].narrow(0, 0, I).copy_(read(fmt::format("{}{}.gate_proj.weight", base, e), {I, H}));
            t[e].narrow(0, I, I).copy_(read(fmt::format("{}{}.up_proj.weight", base, e), {I, H}));
          } else {
            t[e].copy_(read(fmt::format("{}{}.down_proj.weight", base, e), {sp.shape[1], sp.shape[2]}));
          }
        }
      } else {
        t = read(hub_key(sp.name), sp.shape).to(opts(sp), /*non_blocking=*/false, /*copy=*/true);
      }
      params_.emplace_back(sp.name, t.requires_grad_(true));
    }
    int64_t skipped_extra = 0, skipped_layers = 0;
    std::vector<std::string> unexpected;
    static const std::regex layer_re("^model\\.(language_model\\.)?layers\\.([0-9]+)\\.");
    for (const auto& kv : ck) {
      const std::string& k = kv.first;
      if (used.count(k)) continue;
      std::smatch m;
      if (k.rfind("mtp.", 0) == 0 || k.rfind("model.visual.", 0) == 0 || k.rfind("visual.", 0) == 0) {
        ++skipped_extra;
        passthrough_.push_back(kv.second);  // written back unchanged by save()
      } else if (std::regex_search(k, m, layer_re) && std::stoll(m[2]) >= c_.layers) {
        ++skipped_layers;
      } else if (k == "lm_head.weight" && c_.tied) {
        // tied checkpoints may carry a copy of the embedding
      } else {
        unexpected.push_back(k);
      }
    }
    if (skipped_extra > 0)
      log_info("qwen: skipped {} mtp.* / visual.* tensors of {} (not part of the text model; "
               "save() writes them back unchanged)",
               skipped_extra, dir_);
    if (skipped_layers > 0)
      log_info("qwen: skipped {} tensors of layers >= {} (num_layers override)", skipped_layers,
               c_.layers);
    if (!unexpected.empty())
      log_warn("qwen: {} unexpected tensors in {} ignored, e.g. {}", unexpected.size(), dir_,
               unexpected.front());
  }

  // Binds the named parameters to the per-layer structs.
  void bind() {
    std::map<std::string, at::Tensor> m(params_.begin(), params_.end());
    auto get = [&](const std::string& n) {
      auto it = m.find(n);
      QRUN_ASSERT(it != m.end(), "parameter {} not created", n);
      return it->second;
    };
    embed_ = get("model.embed_tokens.weight");
    norm_ = get("model.norm.weight");
    if (!c_.tied) lm_head_ = get("lm_head.weight");
    layers_.clear();
    for (int64_t i = 0; i < c_.layers; ++i) {
      Layer L;
      std::string p = fmt::format("model.layers.{}.", i);
      L.full = c_.full[i];
      L.in_norm = get(p + "input_layernorm.weight");
      L.post_norm = get(p + "post_attention_layernorm.weight");
      L.moe = c_.moe[i];
      if (L.moe) {
        L.router = get(p + "mlp.gate.weight");
        L.ex_gate_up = get(p + "mlp.experts.gate_up_proj");
        L.ex_down = get(p + "mlp.experts.down_proj");
        L.sh_gate = get(p + "mlp.shared_expert.gate_proj.weight");
        L.sh_up = get(p + "mlp.shared_expert.up_proj.weight");
        L.sh_down = get(p + "mlp.shared_expert.down_proj.weight");
        L.sh_gate_w = get(p + "mlp.shared_expert_gate.weight");
      } else {
        L.gate = get(p + "mlp.gate_proj.weight");
        L.up = get(p + "mlp.up_proj.weight");
        L.down = get(p + "mlp.down_proj.weight");
      }
      if (L.full) {
        L.q_proj = get(p + "self_attn.q_proj.weight");
        L.k_proj = get(p + "self_attn.k_proj.weight");
        L.v_proj = get(p + "self_attn.v_proj.weight");
        L.o_proj = get(p + "self_attn.o_proj.weight");
        L.q_norm = get(p + "self_attn.q_norm.weight");
        L.k_norm = get(p + "self_attn.k_norm.weight");
      } else {
        if (c_.fused_gdn()) {
          L.qkvz = get(p + "linear_attn.in_proj_qkvz.weight");
          L.ba = get(p + "linear_attn.in_proj_ba.weight");
        } else {
          L.qkv = get(p + "linear_attn.in_proj_qkv.weight");
          L.z = get(p + "linear_attn.in_proj_z.weight");
          L.b = get(p + "linear_attn.in_proj_b.weight");
          L.a = get(p + "linear_attn.in_proj_a.weight");
        }
        L.conv = get(p + "linear_attn.conv1d.weight");
        L.dt_bias = get(p + "linear_attn.dt_bias");
        L.A_log = get(p + "linear_attn.A_log");
        L.gnorm = get(p + "linear_attn.norm.weight");
        L.out = get(p + "linear_attn.out_proj.weight");
      }
      for (const auto& kv : params_)
        if (kv.first.rfind(p, 0) == 0) L.all.push_back(kv.second);
      layers_.push_back(std::move(L));
    }
    const int64_t rot = c_.rot_dim();
    at::Tensor exponent = at::arange(0, rot, 2, at::TensorOptions().dtype(at::kLong)).to(at::kFloat) /
                          static_cast<double>(rot);
    inv_freq_ = (1.0 / at::pow(c_.rope_theta, exponent)).to(place_.device);
    if (c_.fused_gdn()) {
      // Section 2.5, Qwen3-Next layout: in_proj_qkvz rows are grouped per key head g as
      // [q_g (d_k) | k_g (d_k) | v_g (r*d_v) | z_g (r*d_v)], in_proj_ba rows as [b_g (r) | a_g (r)];
      // value head g*r + j is the j-th of group g. These row gathers turn the fused weights into the
      // Qwen3.5 ones ([q | k | v] head-major, z, b, a), so both layouts share one forward. Gathering
      // weight rows costs O(rows x H) per step, independent of the number of tokens.
      const int64_t nk = c_.n_k, dk = c_.d_k, rv = (c_.n_v / c_.n_k) * c_.d_v, r = c_.n_v / c_.n_k;
      const int64_t group = 2 * dk + 2 * rv;
      std::vector<int64_t> qkv, z, b, a;
      for (int part = 0; part < 3; ++part)
        for (int64_t g = 0; g < nk; ++g) {
          const int64_t off = part == 0 ? 0 : part == 1 ? dk : 2 * dk, len = part == 2 ? rv : dk;
          for (int64_t j = 0; j < len; ++j) qkv.push_back(g * group + off + j);
        }
      for (int64_t g = 0; g < nk; ++g)
        for (int64_t j = 0; j < rv; ++j) z.push_back(g * group + 2 * dk + rv + j);
      for (int64_t g = 0; g < nk; ++g)
        for (int64_t j = 0; j < r; ++j) {
          b.push_back(g * 2 * r + j);
          a.push_back(g * 2 * r + r + j);
        }
      auto idx = [&](const std::vector<int64_t>& v) {
        return at::tensor(v, at::TensorOptions().dtype(at::kLong)).to(place_.device);
      };
      perm_qkv_ = idx(qkv);
      perm_z_ = idx(z);
      perm_b_ = idx(b);
      perm_a_ = idx(a);
    }
  }

  void before_forward(size_t u) const {
    if (hooks_) hooks_->before_forward(u);
  }
  void after_forward(size_t u) const {
    if (hooks_) hooks_->after_forward(u);
  }
  at::Tensor unit_exit(const at::Tensor& x, size_t u) const {
    if (!hooks_ || !at::GradMode::is_enabled() || !x.requires_grad()) return x;
    return UnitExitFn::apply(x, static_cast<int64_t>(u), static_cast<int64_t>(reinterpret_cast<intptr_t>(hooks_)));
  }

  // Accumulation dtype of softmaxes and RoPE angles: fp32, or fp64 when computing in fp64.
  c10::ScalarType acc() const { return place_.compute_dtype == at::kDouble ? at::kDouble : at::kFloat; }

  // A weight in the compute dtype (a no-op when the parameter is stored in it).
  at::Tensor w(const at::Tensor& t) const {
    return t.scalar_type() == place_.compute_dtype ? t : t.to(place_.compute_dtype);
  }

  static std::vector<int64_t> lead_shape(const at::Tensor& x, std::initializer_list<int64_t> tail) {
    std::vector<int64_t> s(x.sizes().begin(), x.sizes().end() - 1);
    s.insert(s.end(), tail.begin(), tail.end());
    return s;
  }

  at::Tensor attention(const Layer& L, const at::Tensor& h, const FwdCtx& ctx) const {
    const int64_t nq = c_.n_q, nkv = c_.n_kv, dh = c_.d_h;
    const bool zc = c_.zero_centred();
    at::Tensor q, gate;
    if (c_.attn_gate()) {
      at::Tensor qg = at::linear(h, w(L.q_proj)).view(lead_shape(h, {nq, 2 * dh}));
      q = qg.narrow(-1, 0, dh);
      gate = qg.narrow(-1, dh, dh).reshape(lead_shape(h, {nq * dh}));
    } else {
      q = at::linear(h, w(L.q_proj)).view(lead_shape(h, {nq, dh}));
    }
    // Section 2.4 steps 3-4: per-head RMSNorm, then RoPE on the first rot_dim() dims.
    q = qk_norm_rope_(q, L.q_norm, c_.eps, zc, ctx.cos, ctx.sin);
    at::Tensor k = qk_norm_rope_(at::linear(h, w(L.k_proj)).view(lead_shape(h, {nkv, dh})), L.k_norm,
                                 c_.eps, zc, ctx.cos, ctx.sin);
    at::Tensor v = at::linear(h, w(L.v_proj)).view(lead_shape(h, {nkv, dh}));
    at::Tensor o = k_.attention->forward(q, k, v, ctx.seq, 1.0 / std::sqrt(static_cast<double>(dh)));
    o = o.reshape(lead_shape(h, {nq * dh}));
    if (gate.defined()) o = o * at::sigmoid(gate);
    return at::linear(o, w(L.o_proj));
  }

  at::Tensor gated_delta_net(const Layer& L, const at::Tensor& h_in, const FwdCtx& ctx) const {
    at::Tensor h = ctx.pad_mask.defined() ? h_in * ctx.pad_mask : h_in;
    at::Tensor Wqkv, Wz, Wb, Wa;
    if (c_.fused_gdn()) {
      at::Tensor qkvz = w(L.qkvz), ba = w(L.ba);
      Wqkv = qkvz.index_select(0, perm_qkv_);
      Wz = qkvz.index_select(0, perm_z_);
      Wb = ba.index_select(0, perm_b_);
      Wa = ba.index_select(0, perm_a_);
    } else {
      Wqkv = w(L.qkv);
      Wz = w(L.z);
      Wb = w(L.b);
      Wa = w(L.a);
    }
    at::Tensor qkv = at::linear(h, Wqkv);
    at::Tensor z = at::linear(h, Wz).view(lead_shape(h, {c_.n_v, c_.d_v}));
    GatedDeltaInputs in;
    in.b = at::linear(h, Wb);
    in.a = at::linear(h, Wa);
    at::Tensor conv_w = w(L.conv).view({c_.conv_dim(), c_.conv_k});
    at::Tensor y = k_.conv1d->forward(qkv, conv_w, ctx.seq, Activation::SiLU);
    const int64_t kd = c_.key_dim();
    in.q = y.narrow(-1, 0, kd).view(lead_shape(h, {c_.n_k, c_.d_k}));
    in.k = y.narrow(-1, kd, kd).view(lead_shape(h, {c_.n_k, c_.d_k}));
    in.v = y.narrow(-1, 2 * kd, c_.value_dim()).view(lead_shape(h, {c_.n_v, c_.d_v}));
    in.A_log = L.A_log;
    in.dt_bias = L.dt_bias;
    GatedDeltaOptions opt;
    opt.qk_l2norm = true;
    at::Tensor o = k_.linear_attention->forward(in, ctx.seq, opt);
    o = gated_rms_norm_(o, z, L.gnorm, c_.eps);
    return at::linear(o.reshape(lead_shape(h, {c_.value_dim()})), w(L.out));
  }

  at::Tensor layer_forward(size_t i, const at::Tensor& x, const FwdCtx& ctx) const {
    const Layer& L = layers_[i];
    at::Tensor h = rms_norm_(x, L.in_norm, c_.eps, c_.zero_centred());
    at::Tensor mixed = L.full ? attention(L, h, ctx) : gated_delta_net(L, h, ctx);
    // r = x + mixed, h = post_attention_layernorm(r), in one op where a backend fuses them.
    auto [h2, r] = add_rms_norm_(mixed, x, L.post_norm, c_.eps, c_.zero_centred());
    if (L.moe) return r + sparse_moe(L, h2);
    at::Tensor m = at::linear(swiglu_(at::linear(h2, w(L.gate)), at::linear(h2, w(L.up))), w(L.down));
    return r + m;
  }

  // Section 2.6, sparse MoE MLP: softmax router (in at least fp32) over E experts, the top-k
  // probabilities (renormalised when norm_topk_prob), each token's k experts as SwiGLU MLPs
  // weighted by them, plus the shared SwiGLU expert scaled by sigmoid(shared_expert_gate(x)).
  // Plain tensor ops: the (token, slot) pairs are sorted by expert, each expert runs once on its
  // tokens (index_select), and the weighted outputs are summed back with one index_add. Every
  // token is routed, padding included (as transformers does); padding never reaches the loss.
  at::Tensor sparse_moe(const Layer& L, const at::Tensor& h) const {
    const int64_t H = c_.hidden, K = c_.top_k, E = c_.experts, I = c_.moe_inter;
    at::Tensor x = h.reshape({-1, H});
    at::Tensor shared = at::linear(
        swiglu_(at::linear(x, w(L.sh_gate)), at::linear(x, w(L.sh_up))), w(L.sh_down));
    shared = shared * at::sigmoid(at::linear(x, w(L.sh_gate_w)));
    at::Tensor probs = at::softmax(at::linear(x, w(L.router)).to(acc()), -1);
    auto [top_w, top_i] = at::topk(probs, K, -1);
    if (c_.norm_topk) top_w = top_w / top_w.sum(-1, true);
    top_w = top_w.to(x.scalar_type());
    at::Tensor flat_e = top_i.reshape({-1});
    at::Tensor order = at::argsort(flat_e, /*stable=*/true, 0, false);
    at::Tensor tok = order.div(K, "floor");
    at::Tensor weight = top_w.reshape({-1}).index_select(0, order);
    at::Tensor counts = at::bincount(flat_e, {}, E).to(at::kCPU);
    const int64_t* cnt = counts.data_ptr<int64_t>();
    // unbind (not indexing per expert): its backward stacks the expert gradients once.
    std::vector<at::Tensor> gate_up = w(L.ex_gate_up).unbind(0), down = w(L.ex_down).unbind(0);
    std::vector<at::Tensor> ys;
    int64_t off = 0;
    for (int64_t e = 0; e < E; ++e) {
      if (cnt[e] == 0) continue;
      at::Tensor xs = x.index_select(0, tok.narrow(0, off, cnt[e]));
      at::Tensor gu = at::linear(xs, gate_up[e]);
      ys.push_back(at::linear(swiglu_packed_(gu), down[e]));
      off += cnt[e];
    }
    at::Tensor routed = at::zeros_like(x);
    if (!ys.empty()) routed = routed.index_add(0, tok, at::cat(ys) * weight.unsqueeze(-1));
    return (routed + shared).view(h.sizes());
  }

  // Target of token t = label of token t+1 of the same sample (batch.h); -100 elsewhere.
  static at::Tensor shifted_targets(const Batch& b) {
    at::Tensor labels = b.labels;
    at::Tensor sid = b.seq.seq_idx;
    if (!sid.defined()) {
      // Derive it from cu_seqlens_host (the single source of truth).
      const auto& cu = b.seq.cu_seqlens_host;
      std::vector<int32_t> v(labels.numel(), -1);
      const int64_t width = labels.size(-1);
      for (size_t i = 0; i + 1 < cu.size(); ++i)
        for (int64_t t = cu[i]; t < cu[i + 1]; ++t) {
          int64_t pos = b.layout == Layout::Packed ? t : static_cast<int64_t>(i) * width + (t - cu[i]);
          if (pos < static_cast<int64_t>(v.size())) v[pos] = static_cast<int32_t>(i);
        }
      sid = at::tensor(v, at::TensorOptions().dtype(at::kInt)).view(labels.sizes()).to(labels.device());
    }
    const int64_t n = labels.size(-1);
    if (n <= 1) return at::full_like(labels, kIgnoreIndex);
    at::Tensor next_lab = at::cat({labels.narrow(-1, 1, n - 1),
                                   at::full_like(labels.narrow(-1, 0, 1), kIgnoreIndex)}, -1);
    at::Tensor next_sid = at::cat({sid.narrow(-1, 1, n - 1), at::full_like(sid.narrow(-1, 0, 1), -1)}, -1);
    at::Tensor ok = next_sid.eq(sid) & sid.ge(0);
    return at::where(ok, next_lab, at::full_like(next_lab, kIgnoreIndex));
  }

  QwenConfig c_;
  std::string dir_, preset_;
  bool ac_ = false;
  int64_t shard_bytes_ = 0;
  bool built_ = false;
  ModelKernels k_;
  UnitHooks* hooks_ = nullptr;  // sdk model.h, Note [Parameter units]
  op::RmsNorm::Fn rms_norm_;
  op::AddRmsNorm::Fn add_rms_norm_;
  op::GatedRmsNorm::Fn gated_rms_norm_;
  op::SwiGlu::Fn swiglu_;
  op::SwiGluPacked::Fn swiglu_packed_;
  op::QkNormRope::Fn qk_norm_rope_;
  op::LinearCrossEntropy::Fn linear_cross_entropy_;
  ModelPlacement place_;
  std::vector<std::pair<std::string, at::Tensor>> params_;
  at::Tensor embed_, norm_, lm_head_, inv_freq_;
  at::Tensor perm_qkv_, perm_z_, perm_b_, perm_a_;  // Qwen3-Next fused-layout row gathers (bind())
  std::string prefix_ = "model.";                   // key prefix of the text model in the checkpoint
  std::vector<CkptTensor> passthrough_;             // mtp.* / visual.* tensors save() copies through
  std::vector<Layer> layers_;
};

void register_all(Registrar& r) {
  Schema s{
      Field::path("path").doc("Hugging Face checkpoint directory or hub id (local cache, offline)"),
      Field::string("revision", "main").doc(
          "for a hub id: branch or tag (refs/ in the cache) or commit hash (snapshots/)"),
      Field::choice("preset", "none", {"none", "0.8b", "2b", "4b", "9b", "27b", "tiny", "demo"})
          .doc("published size with random initialisation, used when no path is given"),
      Field::integer("num_layers", 0).min(0).doc(
          "keep only the first N layers (0: all); per-layer shapes stay those of the model"),
      Field::choice("activation_checkpointing", "none", {"none", "full"})
          .doc("recompute each decoder layer in backward (full) or keep activations (none)"),
      Field::integer("save_shard_bytes", int64_t{4} << 30).min(1).doc(
          "largest safetensors shard written by save()"),
  };
  r.add<Model>("qwen", "Qwen3.5 / Qwen3.5-MoE / Qwen3-Next hybrid text models (Gated DeltaNet + "
               "gated attention, dense or MoE MLP) and Qwen3 dense models, HF checkpoints",
               s, [](const Config& c) { return std::make_unique<QwenModel>(c); });
}

}  // namespace
}  // namespace qrun

QRUN_PLUGIN("qwen", "0.1.0", qrun::register_all)
