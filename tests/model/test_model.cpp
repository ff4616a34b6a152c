// tests/model/test_model.cpp - the qwen model plugin: parity with Hugging Face transformers
// (fixtures from gen_fixtures.py), save -> transformers round trip, packed == unpacked, activation
// checkpointing, bad checkpoints (exact messages), FLOPs and parameter counts of the presets.
#include "test_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <torch/csrc/autograd/autograd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>

namespace fs = std::filesystem;
using namespace qrun;
using namespace qrun::test;

namespace {

// A new empty directory. (Not std::filesystem::remove_all: libtorch.so exports a copy of it
// that crashes on non-empty directories when it wins symbol resolution.)
void fresh_dir(const std::string& d) {
  ASSERT_EQ(std::system(fmt::format("rm -rf '{}'", d).c_str()), 0);
  fs::create_directories(d);
}

std::string fixture(const std::string& name) { return std::string(QRUN_TEST_FIXTURE_DIR) + "/" + name; }

std::unique_ptr<Model> make_model(const Config& c, const Kernels& k, uint64_t seed = 1) {
  auto m = registry().create<Model>("qwen", c);
  ModelPlacement p;
  p.seed = seed;
  m->build(k.view(), p);
  return m;
}

std::vector<at::Tensor> grads_of(Model& m) {
  std::vector<at::Tensor> g;
  for (auto& [n, p] : m.named_parameters()) g.push_back(p.grad().defined() ? p.grad().clone() : at::zeros_like(p));
  return g;
}

void zero_grads(Model& m) {
  for (auto& [n, p] : m.named_parameters())
    if (p.grad().defined()) p.mutable_grad() = at::Tensor();
}

std::vector<Sample> random_samples(const std::vector<int64_t>& lens, int64_t vocab, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  std::vector<Sample> s;
  for (int64_t L : lens) {
    Sample x;
    x.ids = at::randint(vocab, {L}, gen, at::kLong);
    x.labels = x.ids.clone();
    at::Tensor drop = at::rand({L}, gen) < 0.2;
    x.labels.masked_fill_(drop, -100);
    s.push_back(x);
  }
  return s;
}

// ------------------------------------------------------------------------------------------
// Parity with transformers (fixtures written by gen_fixtures.py, one sample at a time in HF), in
// fp32 and in fp64 (model, inputs and every accumulation in float64 on both sides).
//
// Tolerances (issue #3): logits relative error <= 1e-5, loss absolute error <= 1e-5, every
// gradient relative error <= 1e-4. One exception, fp32 only: the fixture with transformers'
// default decay initialisation (strong_decay, see gen_fixtures.py) has A_log / dt_bias gradients
// that are near-zero sums of O(1) terms; there each is bounded by max(1e-4, 3 x its measured fp32
// noise, i.e. transformers fp32 vs fp64). In fp64 that fixture, like every other, meets 1e-4 on
// every tensor (measured ~1e-10), which shows the fp32 deviation is rounding, not a formula.

struct ParityCase {
  const char* fixture;
  bool fp64;
};

std::string parity_name(const ::testing::TestParamInfo<ParityCase>& i) {
  return std::string(i.param.fixture) + (i.param.fp64 ? "_fp64" : "_fp32");
}

class HfParity : public ::testing::TestWithParam<ParityCase> {};

TEST_P(HfParity, PackedAndPaddedMatchTransformers) {
  const ParityCase pc = GetParam();
  const std::string dir = fixture(pc.fixture);
  if (!fs::exists(dir + "/ref.safetensors")) GTEST_FAIL() << "missing fixture " << dir << " (run model_fixtures)";
  auto ref = load_safetensors(dir + "/ref.safetensors");
  const std::string P = pc.fp64 ? "fp64." : "fp32.";
  const bool strong_decay = ref.at("strong_decay").item<double>() > 0.5;
  Kernels k = reference_kernels();
  auto m = registry().create<Model>("qwen", model_config({{"path", dir + "/ckpt"}}));
  ModelPlacement place;
  place.param_dtype = place.compute_dtype = pc.fp64 ? at::kDouble : at::kFloat;
  m->build(k.view(), place);
  std::vector<Sample> samples;
  for (int i = 0; ref.count(fmt::format("input_ids.{}", i)); ++i)
    samples.push_back({ref[fmt::format("input_ids.{}", i)], ref[fmt::format("labels.{}", i)]});
  ASSERT_GE(samples.size(), 2u);
  int64_t n_ref_grads = 0;
  for (const auto& kv : ref) n_ref_grads += kv.first.rfind(P + "grad.", 0) == 0;

  double worst_logit = 0, worst_grad = 0, loss_err = 0, worst_decay = 0;
  std::string worst_grad_name;
  for (Layout layout : {Layout::Packed, Layout::Padded}) {
    zero_grads(*m);
    Batch b = layout == Layout::Packed ? packed_batch(samples) : padded_batch(samples);
    ModelOutput out = m->forward(b, /*return_logits=*/true);
    at::Tensor loss = out.loss_sum / static_cast<double>(out.loss_tokens);
    const double le = abs_err(loss.reshape({1}), ref[P + "loss"]);
    loss_err = std::max(loss_err, le);
    EXPECT_LE(le, 1e-5) << layout_name(layout);
    for (size_t i = 0; i < samples.size(); ++i) {
      const int64_t L = samples[i].ids.size(0);
      at::Tensor lg = layout == Layout::Packed
                          ? out.logits.narrow(0, b.seq.cu_seqlens_host[i], L)
                          : out.logits[static_cast<int64_t>(i)].narrow(0, 0, L);
      double e = rel_err(lg, ref[fmt::format("{}logits.{}", P, i)]);
      worst_logit = std::max(worst_logit, e);
      EXPECT_LE(e, 1e-5) << layout_name(layout) << " sample " << i;
    }
    loss.backward();
    int64_t checked = 0;
    for (auto& [name, p] : m->named_parameters()) {
      auto it = ref.find(P + "grad." + name);
      ASSERT_TRUE(it != ref.end()) << "no reference gradient for " << name;
      ASSERT_TRUE(p.grad().defined()) << name;
      EXPECT_EQ(p.grad().scalar_type(), pc.fp64 ? at::kDouble : at::kFloat) << name;
      const double e = rel_err(p.grad(), it->second);
      const bool decay = name.ends_with(".A_log") || name.ends_with(".dt_bias");
      double tol = 1e-4;
      if (!pc.fp64 && strong_decay && decay) {
        const double noise = ref.at("noise." + name).item<double>();
        tol = std::max(1e-4, 3 * noise);
        worst_decay = std::max(worst_decay, e);
      } else if (e > worst_grad) {
        worst_grad = e;
        worst_grad_name = name;
      }
      EXPECT_LE(e, tol) << layout_name(layout) << " grad " << name;
      ++checked;
    }
    EXPECT_EQ(checked, n_ref_grads) << "every parameter transformers has must be compared";
  }
  std::printf("[parity %s %s] logits rel err %.3g, loss abs err %.3g, worst grad rel err %.3g (%s)%s\n",
              pc.fixture, pc.fp64 ? "fp64" : "fp32", worst_logit, loss_err, worst_grad,
              worst_grad_name.c_str(),
              strong_decay && !pc.fp64 ? fmt::format("; A_log/dt_bias (noise-bounded) {:.3g}", worst_decay).c_str() : "");
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, HfParity,
    ::testing::Values(ParityCase{"gqa2_r1_untied", false}, ParityCase{"gqa2_r1_untied", true},
                      ParityCase{"gqa4_r3_tied_vlm", false}, ParityCase{"gqa4_r3_tied_vlm", true},
                      ParityCase{"mha_r3_untied_vlm", false}, ParityCase{"mha_r3_untied_vlm", true},
                      ParityCase{"next_r2_moe", false}, ParityCase{"next_r2_moe", true},
                      ParityCase{"next_r1_step2_tied", false}, ParityCase{"next_r1_step2_tied", true},
                      ParityCase{"moe35_r3_vlm", false}, ParityCase{"moe35_r3_vlm", true},
                      ParityCase{"qwen3_gqa2_tied", false}, ParityCase{"qwen3_gqa2_tied", true}),
    parity_name);

// ------------------------------------------------------------------------------------------
// Round trip: qrun save -> transformers loads -> same logits; qrun reload -> same parameters.

// Logits of `ids` from transformers loading `dir` as `expected_class` (hf_logits.py).
at::Tensor hf_logits(const std::string& dir, const at::Tensor& ids, const std::string& expected_class) {
  std::ofstream(dir + "/ids.txt") << fmt::format("{}", fmt::join(std::vector<int64_t>(
      ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + ids.numel()), " "));
  std::string cmd = fmt::format("{} {}/hf_logits.py {} {}/ids.txt {}/hf_logits.safetensors {}",
                                QRUN_PYTHON, QRUN_TEST_SRC_DIR, dir, dir, dir, expected_class);
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  auto hf = load_safetensors(dir + "/hf_logits.safetensors");
  fs::remove(dir + "/ids.txt");
  fs::remove(dir + "/hf_logits.safetensors");
  return hf.at("logits");
}

// Every tensor of a checkpoint directory: name -> (dtype, shape, raw bytes).
std::map<std::string, std::tuple<std::string, std::vector<int64_t>, std::string>> raw_tensors(const std::string& dir) {
  std::map<std::string, std::tuple<std::string, std::vector<int64_t>, std::string>> out;
  for (auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".safetensors") continue;
    auto f = safetensors::open(e.path().string());
    for (const auto& t : f.header.tensors)
      out[t.name] = {t.dtype, t.shape, std::string(reinterpret_cast<const char*>(f.tensor_data(t)), t.end - t.begin)};
  }
  return out;
}

nlohmann::json read_json(const std::string& file) {
  std::ifstream in(file);
  return nlohmann::json::parse(in);
}

TEST(QwenModel, SaveLoadsInTransformersWithSameLogits) {
  Kernels k = reference_kernels();
  // Qwen3.5 (sharded source, untied), Qwen3-Next (fused GDN, MoE experts split per expert on
  // save, tied) and Qwen3 dense, all in the causal-LM layout.
  const std::map<std::string, std::string> cls = {{"gqa2_r1_untied", "Qwen3_5ForCausalLM"},
                                                  {"next_r1_step2_tied", "Qwen3NextForCausalLM"},
                                                  {"qwen3_gqa2_tied", "Qwen3ForCausalLM"}};
  for (const auto& [name, hf_class] : cls) {
    std::string src = fixture(name) + "/ckpt";
    auto m = make_model(model_config({{"path", src}, {"save_shard_bytes", int64_t{100000}}}), k);
    // Move the weights away from the fixture's values so the test sees what save() wrote.
    {
      at::NoGradGuard ng;
      for (auto& [n, p] : m->named_parameters()) p.add_(0.01);
    }
    std::string out = std::string(QRUN_TEST_FIXTURE_DIR) + "/roundtrip_" + name;
    fresh_dir(out);
    m->save(out);
    int shards = 0;
    for (auto& e : fs::directory_iterator(out)) shards += e.path().extension() == ".safetensors";
    EXPECT_GT(shards, 1);
    // The same tensor names as the source checkpoint (per-expert keys for the MoE).
    auto src_keys = raw_tensors(src), out_keys = raw_tensors(out);
    std::vector<std::string> a, b;
    for (auto& kv : src_keys) a.push_back(kv.first);
    for (auto& kv : out_keys) b.push_back(kv.first);
    EXPECT_EQ(a, b);
    auto s = random_samples({37}, 512, 5);
    ModelOutput o = m->forward(packed_batch(s), true);
    double e = rel_err(o.logits, hf_logits(out, s[0].ids, hf_class));
    std::printf("[roundtrip %s] transformers logits rel err %.3g\n", name.c_str(), e);
    EXPECT_LE(e, 1e-5);
    // qrun reload.
    auto m2 = make_model(model_config({{"path", out}}), k);
    auto p1 = m->named_parameters(), p2 = m2->named_parameters();
    ASSERT_EQ(p1.size(), p2.size());
    for (size_t i = 0; i < p1.size(); ++i) {
      EXPECT_EQ(p1[i].first, p2[i].first);
      EXPECT_TRUE(at::equal(p1[i].second, p2[i].second)) << p1[i].first;
    }
  }
}

// Note [Save layout] in qwen_model.cpp: an image-text-to-text checkpoint saves as one.
TEST(QwenModel, SaveKeepsTheImageTextLayout) {
  Kernels k = reference_kernels();
  const std::string src = fixture("vlm_full") + "/ckpt";
  auto m = make_model(model_config({{"path", src}, {"save_shard_bytes", int64_t{200000}}}), k);
  {
    at::NoGradGuard ng;
    for (auto& [n, p] : m->named_parameters()) p.add_(0.01);
  }
  const std::string out = std::string(QRUN_TEST_FIXTURE_DIR) + "/roundtrip_vlm_full";
  fresh_dir(out);
  m->save(out);
  // The config is the source's, unchanged (nothing changed: same layers, same dtype).
  EXPECT_EQ(read_json(out + "/config.json"), read_json(src + "/config.json"));
  // Same tensor names; visual.* and mtp.* byte for byte; text weights moved.
  auto a = raw_tensors(src), b = raw_tensors(out);
  ASSERT_EQ(a.size(), b.size());
  int copied = 0, moved = 0;
  for (const auto& [name, t] : a) {
    auto it = b.find(name);
    ASSERT_TRUE(it != b.end()) << name << " missing from the saved checkpoint";
    if (name.starts_with("model.visual.") || name.starts_with("mtp.")) {
      EXPECT_TRUE(t == it->second) << name << " not copied byte for byte";
      ++copied;
    } else {
      EXPECT_TRUE(name.starts_with("model.language_model.") || name == "lm_head.weight") << name;
      moved += std::get<2>(t) != std::get<2>(it->second);
    }
  }
  EXPECT_EQ(copied, 22);  // 21 visual tensors + mtp.fc.weight (gen_fixtures.py)
  EXPECT_GT(moved, 0);
  // transformers loads it as the original class and gives qrun's logits.
  auto s = random_samples({29}, 512, 6);
  ModelOutput o = m->forward(packed_batch(s), true);
  double e = rel_err(o.logits, hf_logits(out, s[0].ids, "Qwen3_5ForConditionalGeneration"));
  std::printf("[roundtrip vlm_full] Qwen3_5ForConditionalGeneration logits rel err %.3g, %d tensors copied through\n",
              e, copied);
  EXPECT_LE(e, 1e-5);

  // Saving over the source (whose mmap'd tensors it copies) is refused, not a crash.
  std::string msg;
  try {
    m->save(src);
  } catch (const UserError& e) {
    msg = e.message();
  }
  EXPECT_EQ(msg, fmt::format("qwen: cannot save into {}, the checkpoint the model was loaded from (its "
                             "mtp/visual tensors are read from those files while saving); save into a "
                             "new directory", src));

  // A num_layers cut updates the config (and only that), and drops the cut layers' tensors.
  auto cut = make_model(model_config({{"path", src}, {"num_layers", int64_t{2}}}), k);
  const std::string out2 = std::string(QRUN_TEST_FIXTURE_DIR) + "/roundtrip_vlm_cut";
  fresh_dir(out2);
  cut->save(out2);
  nlohmann::json want = read_json(src + "/config.json");
  want["text_config"]["num_hidden_layers"] = 2;
  want["text_config"]["layer_types"] = {"linear_attention", "linear_attention"};
  EXPECT_EQ(read_json(out2 + "/config.json"), want);
  auto c = raw_tensors(out2);
  for (const auto& kv : c) EXPECT_EQ(kv.first.find("layers.2."), std::string::npos) << kv.first;
  EXPECT_EQ(c.count("model.visual.patch_embed.proj.weight"), 1u);

  // A preset-built model keeps the causal-LM layout.
  auto p = make_model(model_config({{"preset", std::string("tiny")}}), k);
  const std::string out3 = std::string(QRUN_TEST_FIXTURE_DIR) + "/save_preset";
  fresh_dir(out3);
  p->save(out3);
  EXPECT_EQ(read_json(out3 + "/config.json")["architectures"][0], "Qwen3_5ForCausalLM");
  for (const auto& kv : raw_tensors(out3))
    EXPECT_TRUE(kv.first.starts_with("model.layers.") || kv.first.starts_with("model.embed_tokens") ||
                kv.first == "model.norm.weight" || kv.first == "lm_head.weight") << kv.first;
}

// ------------------------------------------------------------------------------------------
// Packed == each sample alone; padded == packed; activation checkpointing changes nothing.

class PackedEqualsUnpacked : public ::testing::TestWithParam<std::string> {};

// The preset (Qwen3.5 dense), Qwen3-Next (fused GDN + MoE) and Qwen3.5-MoE: a packed batch and a
// padded batch equal each sample run alone; activation checkpointing changes nothing.
TEST_P(PackedEqualsUnpacked, AndCheckpointing) {
  const std::string src = GetParam();
  Kernels k = reference_kernels();
  auto cfg = [&](const char* ac) {
    return src == "tiny" ? model_config({{"preset", src}, {"activation_checkpointing", std::string(ac)}})
                         : model_config({{"path", fixture(src) + "/ckpt"}, {"activation_checkpointing", std::string(ac)}});
  };
  auto m = make_model(cfg("none"), k, 3);
  auto samples = random_samples({1, 2, 3, 63, 64, 65, 200}, 512, 11);
  // Each sample alone: sum of loss sums, summed gradients.
  zero_grads(*m);
  double alone_loss = 0;
  int64_t alone_tokens = 0;
  for (const auto& s : samples) {
    ModelOutput o = m->forward(packed_batch({s}));
    alone_loss += o.loss_sum.item<double>();
    alone_tokens += o.loss_tokens;
    o.loss_sum.backward();
  }
  auto g_alone = grads_of(*m);
  auto check = [&](const char* what, const ModelOutput& o, const std::vector<at::Tensor>& g) {
    EXPECT_EQ(o.loss_tokens, alone_tokens) << what;
    EXPECT_NEAR(o.loss_sum.item<double>(), alone_loss, 1e-4 * std::abs(alone_loss)) << what;
    double worst = 0;
    for (size_t i = 0; i < g.size(); ++i) worst = std::max(worst, rel_err(g[i], g_alone[i]));
    EXPECT_LE(worst, 1e-4) << what;
    std::printf("[%s %s] loss %.6f vs alone %.6f, worst grad rel err %.3g\n", src.c_str(), what,
                o.loss_sum.item<double>(), alone_loss, worst);
  };
  zero_grads(*m);
  ModelOutput packed = m->forward(packed_batch(samples));
  packed.loss_sum.backward();
  check("packed", packed, grads_of(*m));
  zero_grads(*m);
  ModelOutput padded = m->forward(padded_batch(samples));
  padded.loss_sum.backward();
  check("padded", padded, grads_of(*m));

  // Activation checkpointing: same model weights (same seed or checkpoint), recompute in backward.
  auto mac = make_model(cfg("full"), k, 3);
  ModelOutput oac = mac->forward(packed_batch(samples));
  oac.loss_sum.backward();
  check("activation checkpointing", oac, grads_of(*mac));
}

INSTANTIATE_TEST_SUITE_P(Models, PackedEqualsUnpacked,
                         ::testing::Values("tiny", "next_r2_moe", "moe35_r3_vlm"));

// ------------------------------------------------------------------------------------------
// Bad checkpoints: each a UserError with the file and the tensor named.

struct Ckpt {
  std::map<std::string, std::pair<safetensors::TensorInfo, std::vector<uint8_t>>> tensors;
};

Ckpt read_ckpt(const std::string& file) {
  Ckpt c;
  auto f = safetensors::open(file);
  for (const auto& t : f.header.tensors)
    c.tensors[t.name] = {t, std::vector<uint8_t>(f.tensor_data(t), f.tensor_data(t) + (t.end - t.begin))};
  return c;
}

void write_ckpt(const std::string& file, const Ckpt& c) {
  std::vector<safetensors::WriteTensor> ts;
  for (const auto& [n, v] : c.tensors)
    ts.push_back({n, v.first.dtype, v.first.shape, v.second.data(), v.second.size()});
  safetensors::write_file(file, ts, {{"format", "pt"}});
}

std::string copy_fixture(const std::string& name) {
  std::string src = fixture("gqa4_r3_tied_vlm") + "/ckpt";
  std::string dst = std::string(QRUN_TEST_FIXTURE_DIR) + "/bad_" + name;
  fresh_dir(dst);
  for (auto& e : fs::directory_iterator(src)) fs::copy(e.path(), dst + "/" + e.path().filename().string());
  return dst;
}

std::string build_error(const std::string& dir) {
  Kernels k = reference_kernels();
  try {
    make_model(model_config({{"path", dir}}), k);
  } catch (const UserError& e) {
    return e.message();
  } catch (const std::exception& e) {
    return std::string("NOT A USER ERROR: ") + e.what();
  }
  return "no error";
}

std::string build_error_with(const std::string& dir, int64_t num_layers) {
  try {
    registry().create<Model>("qwen", model_config({{"path", dir}, {"num_layers", num_layers}}));
  } catch (const UserError& e) {
    return e.message();
  }
  return "no error";
}

const std::string kA = "model.language_model.layers.0.linear_attn.A_log";

TEST(QwenModel, BadCheckpointMissingTensor) {
  std::string d = copy_fixture("missing");
  Ckpt c = read_ckpt(d + "/model.safetensors");
  c.tensors.erase(kA);
  write_ckpt(d + "/model.safetensors", c);
  EXPECT_EQ(build_error(d), fmt::format("checkpoint {}: tensor '{}' is missing (expected shape [6])", d, kA));
}

TEST(QwenModel, BadCheckpointWrongShape) {
  std::string d = copy_fixture("shape");
  Ckpt c = read_ckpt(d + "/model.safetensors");
  auto& t = c.tensors["model.language_model.layers.1.self_attn.k_proj.weight"];
  t.first.shape = {t.first.shape[1], t.first.shape[0]};
  write_ckpt(d + "/model.safetensors", c);
  EXPECT_EQ(build_error(d),
            fmt::format("checkpoint {}/model.safetensors: tensor "
                        "'model.language_model.layers.1.self_attn.k_proj.weight' has shape [64, 32] "
                        "but the config implies [32, 64]", d));
}

TEST(QwenModel, BadCheckpointWrongDtype) {
  std::string d = copy_fixture("dtype");
  Ckpt c = read_ckpt(d + "/model.safetensors");
  c.tensors[kA].first.dtype = "I32";
  write_ckpt(d + "/model.safetensors", c);
  EXPECT_EQ(build_error(d), fmt::format("checkpoint {}/model.safetensors: tensor '{}' has dtype I32, "
                                        "expected a floating dtype (F32, BF16, F16, F64)", d, kA));
}

TEST(QwenModel, BadCheckpointTruncated) {
  std::string d = copy_fixture("truncated");
  std::string f = d + "/model.safetensors";
  auto size = fs::file_size(f);
  fs::resize_file(f, size - 100);
  std::string msg = build_error(d);
  EXPECT_NE(msg.find(fmt::format("safetensors file {}: tensor '", f)), std::string::npos) << msg;
  EXPECT_NE(msg.find("run past the end of the data"), std::string::npos) << msg;
  fs::resize_file(f, 5);
  EXPECT_EQ(build_error(d), fmt::format("safetensors file {}: truncated (5 bytes; a header needs at least 8)", f));
}

TEST(QwenModel, BadCheckpointHeaderLies) {
  std::string d = copy_fixture("lies");
  std::string f = d + "/model.safetensors";
  // A header whose only tensor claims more bytes than its shape needs.
  std::string hdr = R"({"model.language_model.norm.weight":{"dtype":"F32","shape":[64],"data_offsets":[0,512]}})";
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((hdr.size() >> (8 * i)) & 0xff);
  bytes += hdr + std::string(512, '\0');
  std::ofstream(f, std::ios::binary | std::ios::trunc) << bytes;
  EXPECT_EQ(build_error(d), fmt::format("safetensors file {}: tensor 'model.language_model.norm.weight' "
                                        "data_offsets [0, 512] span 512 bytes but F32 [64] needs 256", f));
}

TEST(QwenModel, BadConfigUnknownModelType) {
  std::string d = copy_fixture("model_type");
  std::ofstream(d + "/config.json", std::ios::trunc) << R"({"model_type": "llama", "hidden_size": 64})";
  EXPECT_EQ(build_error(d), fmt::format("config {}/config.json: unknown model_type 'llama'; the qwen "
                                        "model supports qwen3_5, qwen3_5_text, qwen3_5_moe, "
                                        "qwen3_5_moe_text, qwen3_next and qwen3", d));
}

// Qwen3-Next / MoE checkpoints: the same kind of messages for their own fields and tensors.
std::string copy_fixture_from(const std::string& src_name, const std::string& name) {
  std::string src = fixture(src_name) + "/ckpt";
  std::string dst = std::string(QRUN_TEST_FIXTURE_DIR) + "/bad_" + name;
  fresh_dir(dst);
  for (auto& e : fs::directory_iterator(src)) fs::copy(e.path(), dst + "/" + e.path().filename().string());
  return dst;
}

TEST(QwenModel, BadMoeCheckpoints) {
  // A missing expert tensor names the per-expert hub key.
  std::string d = copy_fixture_from("next_r2_moe", "expert");
  Ckpt c = read_ckpt(d + "/model.safetensors");
  const std::string key = "model.layers.3.mlp.experts.3.up_proj.weight";
  ASSERT_EQ(c.tensors.erase(key), 1u);
  write_ckpt(d + "/model.safetensors", c);
  EXPECT_EQ(build_error(d), fmt::format("checkpoint {}: tensor '{}' is missing (expected shape [32, 64])", d, key));
  // Config fields.
  auto edit = [&](const std::string& name, const std::function<void(nlohmann::json&)>& f) {
    std::string dd = copy_fixture_from("next_r2_moe", name);
    nlohmann::json j = read_json(dd + "/config.json");
    f(j);
    std::ofstream(dd + "/config.json", std::ios::trunc) << j.dump(2);
    return dd;
  };
  d = edit("no_experts", [](nlohmann::json& j) { j.erase("num_experts"); });
  EXPECT_EQ(build_error(d), fmt::format("config {}/config.json: required field 'num_experts' is missing", d));
  d = edit("topk", [](nlohmann::json& j) { j["num_experts_per_tok"] = 5; });
  EXPECT_EQ(build_error(d), fmt::format("config {}/config.json: num_experts_per_tok 5 exceeds num_experts 4", d));
  d = edit("mlp_only", [](nlohmann::json& j) { j["mlp_only_layers"] = "2"; });
  EXPECT_EQ(build_error(d), fmt::format("config {}/config.json: field 'mlp_only_layers' must be a list of "
                                        "layer indices, got \"2\"", d));
  // A text_config of another family.
  d = copy_fixture_from("moe35_r3_vlm", "text_type");
  nlohmann::json j = read_json(d + "/config.json");
  j["text_config"]["model_type"] = "qwen3_5_text";
  std::ofstream(d + "/config.json", std::ios::trunc) << j.dump(2);
  EXPECT_EQ(build_error(d), fmt::format("config {}/config.json: text_config.model_type 'qwen3_5_text' does "
                                        "not belong to model_type 'qwen3_5_moe'", d));
}

TEST(QwenModel, MissingModelSaysWhereItLooked) {
  setenv("HF_HUB_CACHE", "/nonexistent/hub", 1);
  std::string msg;
  try {
    registry().create<Model>("qwen", model_config({{"path", std::string("Qwen/Qwen3.5-0.8B")}}));
  } catch (const UserError& e) {
    msg = e.message();
  }
  unsetenv("HF_HUB_CACHE");
  EXPECT_NE(msg.find("looked in /nonexistent/hub"), std::string::npos) << msg;
  EXPECT_NE(msg.find("hf download Qwen/Qwen3.5-0.8B"), std::string::npos) << msg;
}

// A Hugging Face hub cache as huggingface_hub lays it out: blobs/ holds the files, snapshots/<commit>/
// symlinks into it, refs/<branch or tag> holds a commit hash.
std::string make_hub_cache(const std::string& root, const std::string& repo,
                           const std::vector<std::pair<std::string, std::string>>& snapshots,
                           const std::map<std::string, std::string>& refs) {
  fresh_dir(root);
  const std::string d = root + "/models--" + repo.substr(0, repo.find('/')) + "--" + repo.substr(repo.find('/') + 1);
  fs::create_directories(d + "/blobs");
  fs::create_directories(d + "/refs");
  for (const auto& [commit, src] : snapshots) {
    fs::create_directories(d + "/snapshots/" + commit);
    for (auto& e : fs::directory_iterator(src)) {
      const std::string blob = commit + "-" + e.path().filename().string();  // stands in for the sha256
      fs::copy_file(e.path(), d + "/blobs/" + blob);
      fs::create_symlink("../../blobs/" + blob, d + "/snapshots/" + commit + "/" + e.path().filename().string());
    }
  }
  for (const auto& [ref, commit] : refs) std::ofstream(d + "/refs/" + ref) << commit;  // no newline, as the hub writes it
  return d;
}

TEST(QwenModel, LoadsAHubIdFromTheLocalCache) {
  Kernels k = reference_kernels();
  const std::string root = std::string(QRUN_TEST_FIXTURE_DIR) + "/hub_cache";
  const std::string a = "0123456789abcdef0123456789abcdef01234567", b = "fedcba9876543210fedcba9876543210fedcba98";
  const std::string repo_dir = make_hub_cache(root + "/hub", "test-org/tiny-qwen",
                                              {{a, fixture("gqa2_r1_untied") + "/ckpt"},
                                               {b, fixture("next_r1_step2_tied") + "/ckpt"}},
                                              {{"main", a}, {"v1", b}});
  auto direct = make_model(model_config({{"path", fixture("gqa2_r1_untied") + "/ckpt"}}), k);
  auto load = [&](const std::string& rev) {
    return make_model(model_config({{"path", std::string("test-org/tiny-qwen")}, {"revision", rev}}), k);
  };
  auto family = [](Model& m) { return m.summary().family; };
  std::string msg;
  {
    setenv("HF_HUB_CACHE", (root + "/hub").c_str(), 1);
    auto m = load("main");  // refs/main -> snapshot a
    EXPECT_EQ(family(*m), "qwen3_5");
    auto p1 = m->named_parameters(), p2 = direct->named_parameters();
    ASSERT_EQ(p1.size(), p2.size());
    for (size_t i = 0; i < p1.size(); ++i) EXPECT_TRUE(at::equal(p1[i].second, p2[i].second)) << p1[i].first;
    EXPECT_EQ(family(*load("v1")), "qwen3_next");  // a tag under refs/
    EXPECT_EQ(family(*load(b)), "qwen3_next");     // a commit hash
    try {
      load("nope");
    } catch (const UserError& e) {
      msg = e.message();
    }
    unsetenv("HF_HUB_CACHE");
  }
  EXPECT_EQ(msg, fmt::format("model 'test-org/tiny-qwen' is in the Hugging Face cache ({}) but revision "
                             "'nope' is not: no refs/nope and no snapshot of that name (snapshots: {}, {}); "
                             "download it with `hf download test-org/tiny-qwen --revision "
                             "nope` or set model.revision", repo_dir, a, b));
  // HF_HOME: the cache is HF_HOME/hub.
  setenv("HF_HOME", root.c_str(), 1);
  EXPECT_EQ(family(*load("main")), "qwen3_5");
  // A ref naming a snapshot that is not there (an interrupted download).
  std::ofstream(repo_dir + "/refs/main", std::ios::trunc) << "00000000000000000000000000000000deadbeef";
  msg.clear();
  try {
    load("main");
  } catch (const UserError& e) {
    msg = e.message();
  }
  unsetenv("HF_HOME");
  EXPECT_NE(msg.find("refs/main names commit 00000000000000000000000000000000deadbeef but"), std::string::npos) << msg;
  EXPECT_NE(msg.find("is missing (an interrupted download?"), std::string::npos) << msg;
}

TEST(QwenModel, MissingKernelNamesTheRecipeKey) {
  Kernels k = reference_kernels();
  ModelKernels mk = k.view();
  mk.conv1d = nullptr;
  auto m = registry().create<Model>("qwen", model_config({{"preset", std::string("tiny")}}));
  std::string msg;
  try {
    m->build(mk, ModelPlacement{});
  } catch (const UserError& e) {
    msg = e.message();
  }
  EXPECT_EQ(msg, "the qwen model needs a conv1d kernel: set kernels.conv1d in the recipe "
                 "(e.g. conv-reference, from the reference-kernels plugin)");
}

TEST(QwenModel, NumLayersOverrideCutsACheckpoint) {
  Kernels k = reference_kernels();
  auto m = make_model(model_config({{"path", fixture("gqa2_r1_untied") + "/ckpt"},
                                    {"num_layers", int64_t{2}}}), k);
  EXPECT_EQ(m->summary().num_layers, 2);
  for (auto& [n, p] : m->named_parameters()) EXPECT_EQ(n.find("layers.2."), std::string::npos) << n;
  ModelOutput o = m->forward(packed_batch(random_samples({5, 9}, 512, 2)));
  EXPECT_TRUE(std::isfinite(o.loss_sum.item<double>()));
  EXPECT_EQ(build_error_with(fixture("gqa2_r1_untied") + "/ckpt", 9),
            fmt::format("model.num_layers (default): num_layers 9 exceeds the checkpoint's 4 layers"));
}

// ------------------------------------------------------------------------------------------
// FLOPs (spec section 7.2 table, S = 8192, causal) and parameter counts (section 7.1).

TEST(QwenModel, PresetFlopsAndParameterCounts) {
  struct Row { const char* preset; double gflops; int64_t params; };
  const Row rows[] = {{"0.8b", 5.27, 0}, {"2b", 12.05, 0}, {"4b", 27.26, 0},
                      {"9b", 49.65, 8953803264}, {"27b", 159.83, 26895998464}};
  for (const auto& r : rows) {
    auto m = registry().create<Model>("qwen", model_config({{"preset", std::string(r.preset)}}));
    double g = m->train_flops_per_token({8192}) / 1e9;
    EXPECT_NEAR(g, r.gflops, 0.006) << r.preset;
    if (r.params) EXPECT_EQ(m->summary().num_parameters, r.params) << r.preset;
  }
  // Qwen3-Next-80B-A3B (spec section 1.3 / 7.2): 79.67B parameters, 24.42 GFLOP/token counting
  // the router, the 10 active experts and the shared expert only.
  {
    const std::string d = std::string(QRUN_TEST_FIXTURE_DIR) + "/next80b_config";
    fresh_dir(d);
    std::ofstream(d + "/config.json") << R"({"model_type": "qwen3_next", "hidden_size": 2048,
      "num_hidden_layers": 48, "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
      "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
      "linear_value_head_dim": 128, "intermediate_size": 5120, "vocab_size": 151936,
      "num_experts": 512, "num_experts_per_tok": 10, "moe_intermediate_size": 512,
      "shared_expert_intermediate_size": 512, "decoder_sparse_step": 1, "mlp_only_layers": [],
      "norm_topk_prob": true, "tie_word_embeddings": false})";
    auto m = registry().create<Model>("qwen", model_config({{"path", d}}));
    EXPECT_NEAR(m->train_flops_per_token({8192}) / 1e9, 24.42, 0.006);
    EXPECT_EQ(m->summary().num_parameters, 79674391296);
    EXPECT_EQ(m->summary().family, "qwen3_next");
  }
  auto cut = registry().create<Model>("qwen", model_config({{"preset", std::string("27b")},
                                                            {"num_layers", int64_t{8}}}));
  EXPECT_EQ(cut->summary().num_layers, 8);
}

}  // namespace
