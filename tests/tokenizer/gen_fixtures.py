#!/usr/bin/env python3
"""ctest fixture setup: writes all HF reference files (gen_strings.py + gen_chat.py).

usage: gen_fixtures.py TOKENIZER_DIR OUT_DIR
Skips regeneration when OUT_DIR/STAMP matches the inputs (script and tokenizer file contents).
"""
import hashlib
import os
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
tok_dir, out_dir = sys.argv[1], sys.argv[2]
os.makedirs(out_dir, exist_ok=True)
h = hashlib.sha256()
for p in ("gen_strings.py", "gen_chat.py", "gen_fixtures.py"):
    with open(os.path.join(here, p), "rb") as f:
        h.update(f.read())
for p in ("tokenizer.json", "tokenizer_config.json"):
    fp = os.path.join(tok_dir, p)
    if os.path.exists(fp):
        with open(fp, "rb") as f:
            h.update(f.read())
    else:
        h.update(b"absent")
stamp = os.path.join(out_dir, "STAMP")
if os.path.exists(stamp) and open(stamp).read() == h.hexdigest():
    print("fixtures up to date")
    sys.exit(0)
for script in ("gen_strings.py", "gen_chat.py"):
    subprocess.run([sys.executable, os.path.join(here, script), tok_dir, out_dir], check=True)
with open(stamp, "w") as f:
    f.write(h.hexdigest())
