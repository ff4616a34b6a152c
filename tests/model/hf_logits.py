#!/usr/bin/env python3
"""Round-trip helper: load a checkpoint that qrun saved with transformers, as the class its
config.json names (architectures[0]), run one sample and write its fp32 logits [T, V] to a
safetensors file. Fails unless that class is EXPECTED_CLASS.

usage: hf_logits.py CKPT_DIR IDS_TXT OUT.safetensors EXPECTED_CLASS
"""
import json
import os
import sys

import torch
from safetensors.torch import save_file

import transformers


def main():
    ckpt, ids_txt, out, expected = sys.argv[1:5]
    torch.set_num_threads(2)
    ids = torch.tensor([int(x) for x in open(ids_txt).read().split()], dtype=torch.long)
    arch = json.load(open(os.path.join(ckpt, "config.json")))["architectures"][0]
    assert arch == expected, f"config.json names {arch}, expected {expected}"
    model = getattr(transformers, arch).from_pretrained(ckpt, dtype=torch.float32,
                                                        attn_implementation="eager")
    assert type(model).__name__ == expected, type(model).__name__
    with torch.no_grad():
        logits = model(input_ids=ids[None]).logits[0].float().contiguous()
    save_file({"logits": logits}, out)


if __name__ == "__main__":
    main()
