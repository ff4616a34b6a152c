#!/usr/bin/env python3
"""Round-trip helper: load a checkpoint that qrun saved with transformers (Qwen3_5ForCausalLM via
AutoModelForCausalLM), run one sample and write its fp32 logits [T, V] to a safetensors file.

usage: hf_logits.py CKPT_DIR IDS_TXT OUT.safetensors
"""
import sys

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM


def main():
    ckpt, ids_txt, out = sys.argv[1:4]
    torch.set_num_threads(2)
    ids = torch.tensor([int(x) for x in open(ids_txt).read().split()], dtype=torch.long)
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32, attn_implementation="eager")
    assert type(model).__name__ == "Qwen3_5ForCausalLM", type(model).__name__
    with torch.no_grad():
        logits = model(input_ids=ids[None]).logits[0].float().contiguous()
    save_file({"logits": logits}, out)


if __name__ == "__main__":
    main()
