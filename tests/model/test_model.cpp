// tests/model/test_model.cpp - the qwen model plugin: parity with Hugging Face transformers
// (fixtures from gen_fixtures.py), save -> transformers round trip, packed == unpacked, activation
// checkpointing, bad checkpoints (exact messages), FLOPs and parameter counts of the presets.
#include "test_util.h"

#include <gtest/gtest.h>

#include <torch/csrc/autograd/autograd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

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
// Parity with transformers (fixtures written by gen_fixtures.py, one sample at a time in HF).

class HfParity : public ::testing::TestWithParam<std::string> {};

TEST_P(HfParity, PackedAndPaddedMatchTransformers) {
  const std::string dir = fixture(GetParam());
  if (!fs::exists(dir + "/ref.safetensors")) GTEST_FAIL() << "missing fixture " << dir << " (run model_fixtures)";
  auto ref = load_safetensors(dir + "/ref.safetensors");
  Kernels k = reference_kernels();
  auto m = make_model(model_config({{"path", dir + "/ckpt"}}), k);
  std::vector<Sample> samples;
  for (int i = 0; ref.count(fmt::format("input_ids.{}", i)); ++i)
    samples.push_back({ref[fmt::format("input_ids.{}", i)], ref[fmt::format("labels.{}", i)]});
  ASSERT_GE(samples.size(), 2u);

  double worst_logit = 0, worst_grad = 0, loss_err = 0;
  int over_1e4 = 0;
  double worst_other = 0;
  std::string worst_other_name;
  std::string worst_grad_name;
  for (Layout layout : {Layout::Packed, Layout::Padded}) {
    zero_grads(*m);
    Batch b = layout == Layout::Packed ? packed_batch(samples) : padded_batch(samples);
    ModelOutput out = m->forward(b, /*return_logits=*/true);
    at::Tensor loss = out.loss_sum / static_cast<double>(out.loss_tokens);
    loss_err = std::max(loss_err, abs_err(loss.reshape({1}), ref["loss"]));
    EXPECT_LE(abs_err(loss.reshape({1}), ref["loss"]), 1e-5) << layout_name(layout);
    for (size_t i = 0; i < samples.size(); ++i) {
      const int64_t L = samples[i].ids.size(0);
      at::Tensor lg = layout == Layout::Packed
                          ? out.logits.narrow(0, b.seq.cu_seqlens_host[i], L)
                          : out.logits[static_cast<int64_t>(i)].narrow(0, 0, L);
      double e = rel_err(lg, ref[fmt::format("logits.{}", i)]);
      worst_logit = std::max(worst_logit, e);
      EXPECT_LE(e, 1e-5) << layout_name(layout) << " sample " << i;
    }
    loss.backward();
    int checked = 0;
    for (auto& [name, p] : m->named_parameters()) {
      auto it = ref.find("grad." + name);
      ASSERT_TRUE(it != ref.end()) << "no reference gradient for " << name;
      ASSERT_TRUE(p.grad().defined()) << name;
      double e = rel_err(p.grad(), it->second);
      // The fp32 rounding noise transformers itself shows for this tensor (gen_fixtures.py):
      // above 1e-4 only on the decay path (A_log, dt_bias, in_proj_a), whose gradients cancel.
      double noise = ref.at("noise." + name).item<double>();
      double tol = std::max(1e-4, 3 * noise);
      if (e > worst_grad) {
        worst_grad = e;
        worst_grad_name = fmt::format("{}, HF fp32 noise {:.3g}", name, noise);
      }
      // The decay path: g = -exp(A_log) * softplus(a + dt_bias), a = in_proj_a(x).
      const bool decay = name.ends_with(".A_log") || name.ends_with(".dt_bias") ||
                         name.ends_with(".in_proj_a.weight");
      if (e > 1e-4) {
        ++over_1e4;
        EXPECT_TRUE(decay) << name << ": only the decay path (A_log, dt_bias, in_proj_a) may exceed 1e-4";
      }
      if (!decay && e > worst_other) {
        worst_other = e;
        worst_other_name = name;
      }
      EXPECT_LE(e, tol) << layout_name(layout) << " grad " << name << " (HF fp32 noise " << noise << ")";
      ++checked;
    }
    EXPECT_EQ(2 * checked, static_cast<int>(ref.size() - 1 - 3 * samples.size()));
  }
  std::printf("[parity %s] worst logits rel err %.3g, loss abs err %.3g, worst grad rel err %.3g (%s), "
              "%d grads over 1e-4 (decay path only); worst other grad rel err %.3g (%s)\n",
              GetParam().c_str(), worst_logit, loss_err, worst_grad, worst_grad_name.c_str(), over_1e4,
              worst_other, worst_other_name.c_str());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HfParity,
                         ::testing::Values("gqa2_r1_untied", "gqa4_r3_tied_vlm", "mha_r3_untied_vlm"));

// ------------------------------------------------------------------------------------------
// Round trip: qrun save -> transformers loads -> same logits; qrun reload -> same parameters.

TEST(QwenModel, SaveLoadsInTransformersWithSameLogits) {
  Kernels k = reference_kernels();
  for (bool tied : {false, true}) {
    std::string src = fixture(tied ? "gqa4_r3_tied_vlm" : "gqa2_r1_untied") + "/ckpt";
    auto m = make_model(model_config({{"path", src}, {"save_shard_bytes", int64_t{100000}}}), k);
    // Move the weights away from the fixture's values so the test sees what save() wrote.
    {
      at::NoGradGuard ng;
      for (auto& [n, p] : m->named_parameters()) p.add_(0.01);
    }
    std::string out = std::string(QRUN_TEST_FIXTURE_DIR) + (tied ? "/roundtrip_tied" : "/roundtrip_untied");
    fresh_dir(out);
    m->save(out);
    int shards = 0;
    for (auto& e : fs::directory_iterator(out)) shards += e.path().extension() == ".safetensors";
    EXPECT_GT(shards, 1);
    auto s = random_samples({37}, 512, 5);
    Batch b = packed_batch(s);
    ModelOutput o = m->forward(b, true);
    // transformers side.
    std::ofstream(out + "/ids.txt") << fmt::format("{}", fmt::join(std::vector<int64_t>(
        s[0].ids.data_ptr<int64_t>(), s[0].ids.data_ptr<int64_t>() + 37), " "));
    std::string cmd = fmt::format("{} {}/hf_logits.py {} {}/ids.txt {}/hf_logits.safetensors",
                                  QRUN_PYTHON, QRUN_TEST_SRC_DIR, out, out, out);
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    auto hf = load_safetensors(out + "/hf_logits.safetensors");
    double e = rel_err(o.logits, hf["logits"]);
    std::printf("[roundtrip %s] transformers logits rel err %.3g\n", tied ? "tied" : "untied", e);
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

// ------------------------------------------------------------------------------------------
// Packed == each sample alone; padded == packed; activation checkpointing changes nothing.

TEST(QwenModel, PackedEqualsUnpackedAndCheckpointing) {
  Kernels k = reference_kernels();
  auto m = make_model(model_config({{"preset", std::string("tiny")}}), k, 3);
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
    std::printf("[%s] loss %.6f vs alone %.6f, worst grad rel err %.3g\n", what,
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

  // Activation checkpointing: same model weights (same seed), recompute in backward.
  auto mac = make_model(model_config({{"preset", std::string("tiny")},
                                      {"activation_checkpointing", std::string("full")}}), k, 3);
  ModelOutput oac = mac->forward(packed_batch(samples));
  oac.loss_sum.backward();
  check("activation checkpointing", oac, grads_of(*mac));
}

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
                                        "expected a floating dtype (F32, BF16, F16)", d, kA));
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
                                        "model supports qwen3_5 and qwen3_5_text", d));
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
  EXPECT_NE(msg.find("huggingface-cli download Qwen/Qwen3.5-0.8B"), std::string::npos) << msg;
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
  auto cut = registry().create<Model>("qwen", model_config({{"preset", std::string("27b")},
                                                            {"num_layers", int64_t{8}}}));
  EXPECT_EQ(cut->summary().num_layers, 8);
}

}  // namespace
