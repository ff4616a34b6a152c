// plugin.cpp - registers the chat data components (libqrun-chat-data.so).
#include <qrun/sdk/plugin.h>

#include "chat_dataset.h"
#include "collators.h"
#include "hf_format.h"

namespace {

void register_all(qrun::Registrar& r) {
  using namespace qrun::chatdata;
  r.add<qrun::Tokenizer>("hf-tokenizer",
                         "Hugging Face tokenizer.json (byte-level BPE, as Qwen); exact HF ids",
                         hf_tokenizer_schema(), [](const qrun::Config& c) {
                           return std::make_unique<HfTokenizer>(c.get_string("path"));
                         });
  r.add<qrun::ChatFormat>("chatml", "Qwen3 ChatML template; loss on assistant turns or all tokens",
                          chatml_schema(),
                          [](const qrun::Config&) { return std::make_unique<ChatMlFormat>(); });
  r.add<qrun::Dataset>("chat",
                       "chat rows from JSONL/parquet files or the HF cache; threaded, resumable",
                       chat_dataset_schema(), [](const qrun::Config& c) {
                         return std::make_unique<ChatDataset>(chat_dataset_options(c));
                       });
  r.add<qrun::Collator>("padded-collator", "[B,S] rows padded to the batch maximum (baseline)",
                        padded_collator_schema(), [](const qrun::Config& c) {
                          return std::make_unique<PaddedCollator>(collator_options(c, false));
                        });
  r.add<qrun::Collator>("packed-collator",
                        "1-D packing under a token budget (greedy or best-fit-decreasing)",
                        packed_collator_schema(), [](const qrun::Config& c) {
                          return std::make_unique<PackedCollator>(collator_options(c, true));
                        });
}

}  // namespace

QRUN_PLUGIN("chat-data", "0.1.0", register_all)
