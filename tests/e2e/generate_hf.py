"""Loads a checkpoint qrun saved with transformers and generates a few tokens from a chat prompt.

Usage: generate_hf.py MODEL_DIR TOKENIZER_DIR. Prints the generated text; exits non-zero if the
checkpoint does not load or the generated ids are not valid tokens."""
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

model_dir, tok_dir = sys.argv[1], sys.argv[2]
tok = AutoTokenizer.from_pretrained(tok_dir)
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
model.eval()
prompt = tok.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}],
                                 tokenize=False, add_generation_prompt=True)
ids = tok(prompt, return_tensors="pt").input_ids
with torch.no_grad():
    out = model.generate(ids, max_new_tokens=12, do_sample=False)
new = out[0, ids.shape[1]:]
assert new.numel() > 0, "nothing generated"
assert int(new.max()) < len(tok), "generated an id outside the tokenizer"
print("generated:", repr(tok.decode(new)))
