// framework/data_commands.h - the data tools: `qrun tokenize` and `qrun data inspect`.
//
// Both reach the data components only through the registry (the host never includes plugins), so
// they work with any tokenizer / chat_format / dataset / collator a plugin provides.
#pragma once

#include "registry.h"

#include <string>
#include <vector>

namespace qrun {

// qrun tokenize --tokenizer DIR [--chat] [--loss-on assistant|all] [--component NAME]
//                [--chat-format NAME] [--no-special]
// Reads stdin: text lines (or, with --chat, JSONL conversations {"messages": [...]}) and writes
// one JSON line per input: {"ids": [...]} (with --chat also "labels" and "mask", 1 = trained).
// `args` may start with "tokenize". Returns the exit code; throws qrun::Error on bad input.
int run_tokenize(const std::vector<std::string>& args, const Registry& registry);

// qrun data inspect <recipe.yaml> [-n N] [--set k=v]... [--max-batches K] [--ids]
// Prints the first N examples (default 3) with their tokens and loss masks, then streams epoch 0
// through the collator and prints its statistics: batches, samples, padding fraction, tokens per
// batch, loss tokens, skipped rows, load speed. `args` may start with "data" "inspect".
int run_data_inspect(const std::vector<std::string>& args, const Registry& registry);

}  // namespace qrun
