#!/usr/bin/env python3
"""bench_hf_loader.py TOKENIZER_DIR DATA.jsonl - the HF reference for bench_collate's loader line.

Reads the JSONL conversations, renders ChatML text in Python (json parsing and rendering timed
too, as the qrun loader does both) and encodes it with HF `tokenizers` encode_batch, 3 passes.
Run with RAYON_NUM_THREADS=2 for the 2-thread comparison.
"""
import json
import sys
import time

from tokenizers import Tokenizer

tok = Tokenizer.from_file(sys.argv[1] + "/tokenizer.json")
lines = open(sys.argv[2], encoding="utf-8").read().splitlines()
t0 = time.perf_counter()
tokens = rows = 0
for _ in range(3):
    texts = []
    for line in lines:
        msgs = json.loads(line)["messages"]
        text = ""
        for i, m in enumerate(msgs):
            body = m["content"]
            if m["role"] == "assistant" and i == len(msgs) - 1:
                body = "<think>\n\n</think>\n\n" + body
            text += f"<|im_start|>{m['role']}\n{body}<|im_end|>\n"
        texts.append(text)
    for enc in tok.encode_batch(texts, add_special_tokens=False):
        tokens += len(enc.ids)
    rows += len(texts)
sec = time.perf_counter() - t0
print(f"HF tokenizers encode_batch (+ json + render in Python): {rows} rows, {tokens} tokens in "
      f"{sec:.2f} s = {tokens / sec:.0f} tokens/s")
