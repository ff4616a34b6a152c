// framework/data_commands.cpp - see data_commands.h.
#include "data_commands.h"

#include "recipe.h"
#include "text.h"

#include <qrun/sdk/data.h>

#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>

namespace qrun {
namespace {

// Drops the leading verb words ("tokenize", "data inspect") when present.
std::vector<std::string> strip_verbs(const std::vector<std::string>& args,
                                     const std::vector<std::string>& verbs) {
  size_t i = 0;
  while (i < args.size() && i < verbs.size() && args[i] == verbs[i]) i++;
  return {args.begin() + static_cast<long>(i), args.end()};
}

// Builds a component from `name` and a few settings given on the command line, validated against
// its schema like a recipe section (defaults filled in).
template <typename T>
std::unique_ptr<T> make_component(const Registry& reg, const std::string& name,
                                  const std::map<std::string, std::string>& settings,
                                  const std::string& where) {
  const RegistryEntry& e = reg.get(T::kKind, name);
  YAML::Node node(YAML::NodeType::Map);
  for (const auto& [k, v] : settings) node[k] = v;
  std::vector<Diagnostic> diags;
  Config cfg = validate_settings(where, e.info.schema, node, where, diags);
  if (!diags.empty()) throw RecipeError(where, diags);
  return reg.create<T>(name, cfg);
}

std::string ids_json(const std::vector<int32_t>& v) {
  return nlohmann::json(v).dump();
}

// Parses one --chat input line into messages; throws UserError("stdin:line N: ...").
std::vector<Message> parse_conversation(const std::string& line, int64_t n) {
  auto bad = [&](const std::string& why) {
    return UserError(fmt::format("stdin:line {}: {}", n, why));
  };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {
    throw bad(fmt::format("invalid JSON: {}", e.what()));
  }
  const nlohmann::json* msgs = &j;
  if (j.is_object()) {
    auto it = j.find("messages");
    if (it == j.end()) throw bad("missing 'messages'");
    msgs = &*it;
  }
  if (!msgs->is_array()) throw bad("expected {\"messages\": [{\"role\", \"content\"}, ...]} or a list of messages");
  std::vector<Message> out;
  for (size_t i = 0; i < msgs->size(); i++) {
    const auto& m = (*msgs)[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content") ||
        !m["content"].is_string())
      throw bad(fmt::format("message {} is not {{\"role\": string, \"content\": string}}", i));
    out.push_back(Message{m["role"].get<std::string>(), m["content"].get<std::string>()});
  }
  return out;
}

std::map<std::string, std::string> parse_flags(const std::string& command,
                                               const std::vector<std::string>& args,
                                               const std::vector<std::string>& value_opts,
                                               const std::vector<std::string>& flag_opts,
                                               std::vector<std::string>* positional,
                                               std::vector<std::string>* overrides) {
  std::map<std::string, std::string> out;
  std::vector<std::string> known = value_opts;
  known.insert(known.end(), flag_opts.begin(), flag_opts.end());
  for (size_t i = 0; i < args.size(); i++) {
    std::string a = args[i], value;
    bool has_value = false;
    if (a.rfind("--", 0) == 0 && a.find('=') != std::string::npos) {
      value = a.substr(a.find('=') + 1);
      a = a.substr(0, a.find('='));
      has_value = true;
    }
    if (overrides && a == "--set") {
      QRUN_CHECK(has_value || i + 1 < args.size(), "{}: --set needs key.path=value", command);
      overrides->push_back(has_value ? value : args[++i]);
      continue;
    }
    if (a.rfind("-", 0) == 0 && a.size() > 1) {
      bool takes = std::find(value_opts.begin(), value_opts.end(), a) != value_opts.end();
      bool flag = std::find(flag_opts.begin(), flag_opts.end(), a) != flag_opts.end();
      QRUN_CHECK(takes || flag, "{}: unknown option '{}'{}; allowed: {}", command, a,
                 did_you_mean(a, known), join(known));
      if (flag) {
        out[a] = "true";
        continue;
      }
      QRUN_CHECK(has_value || i + 1 < args.size(), "{}: {} needs a value", command, a);
      out[a] = has_value ? value : args[++i];
      continue;
    }
    QRUN_CHECK(positional != nullptr, "{}: unexpected argument '{}'", command, a);
    positional->push_back(a);
  }
  return out;
}

int64_t parse_count(const std::string& command, const std::string& opt, const std::string& v) {
  char* end = nullptr;
  long long n = std::strtoll(v.c_str(), &end, 10);
  QRUN_CHECK(end && *end == '\0' && !v.empty() && n >= 0, "{}: {} expects a count >= 0, got '{}'",
             command, opt, v);
  return n;
}

}  // namespace

int run_tokenize(const std::vector<std::string>& raw_args, const Registry& reg) {
  auto args = strip_verbs(raw_args, {"tokenize"});
  const std::string cmd = "tokenize";
  auto opt = parse_flags(cmd, args,
                         {"--tokenizer", "--loss-on", "--component", "--chat-format"},
                         {"--chat", "--no-special", "--help"}, nullptr, nullptr);
  if (opt.count("--help")) {
    std::printf(
        "usage: qrun tokenize --tokenizer DIR [--chat] [--loss-on assistant|all]\n"
        "                     [--component hf-tokenizer] [--chat-format chatml] [--no-special]\n"
        "reads text lines (or JSONL conversations with --chat) on stdin; writes one JSON line per\n"
        "input: {\"ids\": [...]} and with --chat also \"labels\" (-100 = no loss) and \"mask\"\n");
    return 0;
  }
  QRUN_CHECK(opt.count("--tokenizer"),
             "tokenize: --tokenizer DIR is required (a folder with tokenizer.json, e.g. "
             "data/tokenizers/qwen3)");
  std::string tok_name = opt.count("--component") ? opt["--component"] : "hf-tokenizer";
  auto tok = make_component<Tokenizer>(reg, tok_name, {{"path", opt["--tokenizer"]}}, "--tokenizer");
  bool chat = opt.count("--chat") > 0;
  bool parse_special = opt.count("--no-special") == 0;
  LossOn loss_on = LossOn::Assistant;
  if (opt.count("--loss-on")) {
    const std::string& l = opt["--loss-on"];
    QRUN_CHECK(l == "assistant" || l == "all", "tokenize: --loss-on is assistant or all, got '{}'", l);
    loss_on = l == "all" ? LossOn::All : LossOn::Assistant;
  }
  std::unique_ptr<ChatFormat> fmt;
  if (chat)
    fmt = make_component<ChatFormat>(reg, opt.count("--chat-format") ? opt["--chat-format"] : "chatml",
                                     {}, "--chat-format");
  std::string line;
  int64_t n = 0;
  while (std::getline(std::cin, line)) {
    n++;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    try {
      if (!chat) {
        std::cout << "{\"ids\":" << ids_json(tok->encode(line, parse_special)) << "}\n";
        continue;
      }
      if (line.find_first_not_of(" \t") == std::string::npos) continue;
      auto conv = parse_conversation(line, n);
      Example e = fmt->render(conv, *tok, loss_on);
      std::vector<int32_t> mask(e.labels.size());
      for (size_t i = 0; i < mask.size(); i++) mask[i] = e.labels[i] != kIgnoreIndex;
      std::cout << "{\"ids\":" << ids_json(e.input_ids) << ",\"labels\":" << ids_json(e.labels)
                << ",\"mask\":" << ids_json(mask) << "}\n";
    } catch (Error& e) {
      if (e.message().rfind("stdin:line", 0) != 0) e.add_context(fmt::format("at stdin:line {}", n));
      throw;
    }
  }
  std::cout.flush();
  return 0;
}

int run_data_inspect(const std::vector<std::string>& raw_args, const Registry& reg) {
  auto args = strip_verbs(raw_args, {"data", "inspect"});
  const std::string cmd = "data inspect";
  std::vector<std::string> pos, overrides;
  auto opt = parse_flags(cmd, args, {"-n", "--max-batches"}, {"--ids", "--help"}, &pos, &overrides);
  if (opt.count("--help")) {
    std::printf(
        "usage: qrun data inspect <recipe.yaml> [-n N] [--set key=value]... [--max-batches K] [--ids]\n"
        "prints the first N examples (default 3) with tokens and loss masks (trained text in [[ ]]),\n"
        "then the collator statistics over epoch 0 (or its first K batches)\n");
    return 0;
  }
  QRUN_CHECK(pos.size() == 1, "data inspect: expected one recipe, got {}; usage: qrun data inspect "
             "<recipe.yaml> [-n N] [--set key=value]",
             pos.size());
  int64_t n = opt.count("-n") ? parse_count(cmd, "-n", opt["-n"]) : 3;
  int64_t max_batches = opt.count("--max-batches") ? parse_count(cmd, "--max-batches", opt["--max-batches"]) : -1;
  bool show_ids = opt.count("--ids") > 0;

  Recipe r = load_recipe(pos[0], overrides, reg);
  QRUN_CHECK(r.component("data.dataset") != nullptr,
             "{}: the recipe names no data.dataset, so there is nothing to inspect", r.file);
  auto make = [&](const std::string& path) -> const ComponentSpec& {
    const ComponentSpec* c = r.component(path);
    QRUN_ASSERT(c != nullptr, "component '{}' was not resolved", path);
    return *c;
  };
  auto create = [&]<typename T>(const std::string& path, T*) {
    const ComponentSpec& c = make(path);
    try {
      return reg.create<T>(c.name, c.config);
    } catch (Error& e) {
      e.add_context(fmt::format("while creating {} '{}' ({})", path, c.name, r.file));
      throw;
    }
  };
  auto tok = create("data.tokenizer", static_cast<Tokenizer*>(nullptr));
  auto chat = create("data.chat_format", static_cast<ChatFormat*>(nullptr));
  auto dataset = create("data.dataset", static_cast<Dataset*>(nullptr));
  auto collator = create("data.collator", static_cast<Collator*>(nullptr));
  DataContext ctx{tok.get(), chat.get(), static_cast<uint64_t>(r.section("run").get_int("seed"))};

  std::printf("recipe %s: tokenizer %s, chat_format %s, dataset %s, collator %s, seed %llu\n",
              r.file.c_str(), make("data.tokenizer").name.c_str(), make("data.chat_format").name.c_str(),
              make("data.dataset").name.c_str(), make("data.collator").name.c_str(),
              static_cast<unsigned long long>(ctx.seed));
  std::printf("legend: text with loss (labels != -100) is shown between [[ and ]]\n");
  {
    auto stream = dataset->open(ctx, 0, "");
    for (int64_t i = 0; i < n; i++) {
      auto e = stream->next();
      if (!e) {
        std::printf("(the epoch has only %lld examples)\n", static_cast<long long>(i));
        break;
      }
      int64_t trained = 0, targets = 0;
      for (size_t t = 0; t < e->labels.size(); t++) {
        trained += e->labels[t] != kIgnoreIndex;
        targets += t > 0 && e->labels[t] != kIgnoreIndex;
      }
      std::printf("\n--- example %lld (row id %lld): %zu tokens, %lld with loss, %lld targets after "
                  "the shift\n",
                  static_cast<long long>(i), static_cast<long long>(e->id), e->input_ids.size(),
                  static_cast<long long>(trained), static_cast<long long>(targets));
      std::string text;
      size_t t = 0;
      while (t < e->input_ids.size()) {
        bool on = e->labels[t] != kIgnoreIndex;
        size_t u = t;
        std::vector<int32_t> run;
        while (u < e->input_ids.size() && (e->labels[u] != kIgnoreIndex) == on) run.push_back(e->input_ids[u++]);
        std::string piece = tok->decode(run, false);
        text += on ? "[[" + piece + "]]" : piece;
        t = u;
      }
      std::printf("%s\n", text.c_str());
      if (show_ids) {
        std::printf("ids:  %s\n", ids_json(e->input_ids).c_str());
        std::string mask;
        for (int32_t l : e->labels) mask += l != kIgnoreIndex ? '1' : '0';
        std::printf("mask: %s\n", mask.c_str());
      }
    }
  }

  auto t0 = std::chrono::steady_clock::now();
  auto stream = dataset->open(ctx, 0, "");
  int64_t batches = 0, samples = 0, real = 0, pad = 0, loss = 0, min_b = -1, max_b = 0, max_seq = 0;
  while (max_batches < 0 || batches < max_batches) {
    auto b = collator->next(*stream);
    if (!b) break;
    batches++;
    samples += b->num_seqs();
    real += b->real_tokens;
    pad += b->padding_tokens;
    loss += b->loss_tokens;
    int64_t tokens = b->real_tokens + b->padding_tokens;
    min_b = min_b < 0 ? tokens : std::min(min_b, tokens);
    max_b = std::max(max_b, tokens);
    max_seq = std::max(max_seq, b->seq.max_seqlen);
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("\ncollator %s over epoch 0%s:\n", make("data.collator").name.c_str(),
              max_batches >= 0 ? fmt::format(" (first {} batches)", max_batches).c_str() : "");
  std::printf("  batches            %lld\n", static_cast<long long>(batches));
  std::printf("  samples            %lld (%.1f per batch)\n", static_cast<long long>(samples),
              batches ? double(samples) / batches : 0.0);
  std::printf("  tokens             %lld real + %lld padding\n", static_cast<long long>(real),
              static_cast<long long>(pad));
  std::printf("  padding fraction   %.2f%%\n", real + pad ? 100.0 * pad / (real + pad) : 0.0);
  std::printf("  tokens per batch   mean %.0f, min %lld, max %lld (real mean %.0f)\n",
              batches ? double(real + pad) / batches : 0.0, static_cast<long long>(std::max<int64_t>(min_b, 0)),
              static_cast<long long>(max_b), batches ? double(real) / batches : 0.0);
  std::printf("  longest sample     %lld tokens\n", static_cast<long long>(max_seq));
  std::printf("  loss tokens        %lld (%.1f%% of real)\n", static_cast<long long>(loss),
              real ? 100.0 * loss / real : 0.0);
  std::printf("  skipped rows       %lld\n", static_cast<long long>(stream->skipped_rows()));
  std::printf("  load time          %.2f s (%.0f tokens/s)\n", secs, secs > 0 ? real / secs : 0.0);
  return 0;
}

}  // namespace qrun
