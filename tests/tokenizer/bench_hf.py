#!/usr/bin/env python3
"""Tokenizer throughput: Hugging Face tokenizers batch encode vs qrun's bench_tokenizer.

usage: bench_hf.py TOKENIZER_DIR [BENCH_TOKENIZER_BINARY] [--mb 20]
Writes a corpus (fixed seed: English prose, code, Chinese, mixed unicode documents; about 20 MB)
to /tmp/qrun_tok_bench_corpus.jsonl, then for 1 and 2 threads (RAYON_NUM_THREADS, each in a fresh
process) runs HF `Tokenizer.encode_batch(texts, add_special_tokens=False)`: one warm-up pass,
best of 3 timed passes (wall-clock and process CPU time, all threads); then runs the qrun binary
on the same corpus if given.
"""
import argparse
import json
import os
import random
import subprocess
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # keep __pycache__ out of the source tree
sys.path.insert(0, here)


def make_corpus(path, mb):
    import gen_strings as g
    r = random.Random(7)
    g.EN = g.words_en(r)
    texts, size = [], 0
    while size < mb * 1e6:
        k = r.random()
        if k < 0.5:  # English prose paragraphs
            t = "\n\n".join(g.rand_en(r, r.randint(40, 200)) + "." for _ in range(r.randint(1, 6)))
        elif k < 0.7:  # code
            t = "".join(r.choice(g.CODE) for _ in range(r.randint(3, 30)))
        elif k < 0.85:  # Chinese
            t = g.rand_zh(r, r.randint(100, 800))
        else:  # mixed
            t = " ".join(g.piece(r) for _ in range(r.randint(10, 60)))
        texts.append(t)
        size += len(t.encode())
    with open(path, "w", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps(t, ensure_ascii=False) + "\n")
    return len(texts), size


def hf_worker(tok_dir, corpus):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json"))
    texts = [json.loads(l) for l in open(corpus, encoding="utf-8") if l.strip()]
    nbytes = sum(len(t.encode()) for t in texts)
    ntok = sum(len(e.ids) for e in tok.encode_batch(texts, add_special_tokens=False))
    best, best_cpu = 1e30, 1e30
    for _ in range(3):
        s, c = time.perf_counter(), time.process_time()
        tok.encode_batch(texts, add_special_tokens=False)
        best = min(best, time.perf_counter() - s)
        best_cpu = min(best_cpu, time.process_time() - c)
    print(f"hf   threads={os.environ.get('RAYON_NUM_THREADS')} tokens={ntok} wall={best:.3f} s "
          f"tokens/s={ntok / best:.0f} MB/s={nbytes / best / 1e6:.2f} | cpu={best_cpu:.3f} s "
          f"tokens/cpu-s={ntok / best_cpu:.0f}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tok_dir")
    ap.add_argument("binary", nargs="?")
    ap.add_argument("--mb", type=float, default=20)
    ap.add_argument("--corpus", default="/tmp/qrun_tok_bench_corpus.jsonl")
    ap.add_argument("--worker", action="store_true")
    a = ap.parse_args()
    if a.worker:
        hf_worker(a.tok_dir, a.corpus)
        return
    n, size = make_corpus(a.corpus, a.mb)
    print(f"corpus: {n} texts, {size / 1e6:.1f} MB -> {a.corpus}", flush=True)
    for nt in (1, 2):
        env = dict(os.environ, RAYON_NUM_THREADS=str(nt), TOKENIZERS_PARALLELISM="true")
        subprocess.run([sys.executable, __file__, a.tok_dir, "--corpus", a.corpus, "--worker"],
                       env=env, check=True)
    if a.binary:
        subprocess.run([a.binary, a.tok_dir, a.corpus, "1", "2"], check=True)


if __name__ == "__main__":
    main()
