#!/usr/bin/env python3
"""Writes chat-template parity fixtures with transformers' apply_chat_template.

usage: gen_chat.py TOKENIZER_DIR OUT_DIR

OUT_DIR/chat.jsonl: 1,200 generated conversations (fixed seed; system optional, 1-8 turns,
unicode content, <think> blocks, reasoning_content, tool messages, conversations ending with a
user turn, add_generation_prompt with and without enable_thinking=False). Each line:
{"messages", "add_generation_prompt", "enable_thinking" (or null), "ids"} where ids is
AutoTokenizer.from_pretrained(dir).apply_chat_template(messages, tokenize=True, ...)["input_ids"].
Also OUT_DIR/decode.jsonl: random id sequences with HF `tokenizers` decode (U+FFFD repair parity).
If TOKENIZER_DIR/tokenizer.json is absent, writes OUT_DIR/ABSENT and exits 0.
"""
import json
import os
import random
import sys

sys.dont_write_bytecode = True  # keep __pycache__ out of the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_strings  # noqa: E402

SEED = 4242


def content(r):
    k = r.random()
    if k < 0.05:
        return ""
    s = "".join(gen_strings.piece(r) + (r.choice(gen_strings.WS) if r.random() < 0.4 else "")
                for _ in range(r.randint(1, 4)))
    if r.random() < 0.1:
        s = r.choice(["\n", "\n\n", " ", "\n \n", "  "]) + s
    if r.random() < 0.1:
        s = s + r.choice(["\n", "\n\n", " "])
    return s


def assistant_msg(r):
    c = content(r)
    k = r.random()
    msg = {"role": "assistant", "content": c}
    if k < 0.2:
        msg["content"] = f"<think>{r.choice(['', chr(10), chr(10) * 2])}{content(r)}" \
                         f"{r.choice(['', chr(10)])}</think>{r.choice(['', chr(10), chr(10) * 2])}{c}"
    elif k < 0.25:
        msg["content"] = f"{content(r)}</think>{c}"
    elif k < 0.3:
        msg["content"] = f"<think>a</think>b<think>c</think>{c}"
    elif k < 0.4:
        msg["reasoning_content"] = content(r)
    return msg


def conversation(r):
    msgs = []
    if r.random() < 0.5:
        msgs.append({"role": "system", "content": content(r)})
    turns = r.randint(1, 8)
    for t in range(turns):
        msgs.append({"role": "user", "content": content(r)})
        if r.random() < 0.1:
            # tool round trip: assistant, tool result(s), assistant
            msgs.append(assistant_msg(r))
            for _ in range(r.randint(1, 3)):
                msgs.append({"role": "tool", "content": content(r)})
        if r.random() < 0.05:
            msgs.append({"role": "user",
                         "content": "<tool_response>" + content(r) + "</tool_response>"})
        if r.random() < 0.03:
            msgs.append({"role": "system", "content": content(r)})
        if t == turns - 1 and r.random() < 0.1:
            break  # ends with a user turn
        msgs.append(assistant_msg(r))
    return msgs


def main():
    tok_dir, out_dir = sys.argv[1], sys.argv[2]
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(tok_dir, "tokenizer.json")
    if not os.path.exists(path):
        with open(os.path.join(out_dir, "ABSENT"), "w") as f:
            f.write(f"{path} is absent\n")
        print(f"{path} is absent; fixtures not generated")
        return
    from transformers import AutoTokenizer
    from tokenizers import Tokenizer
    tok = AutoTokenizer.from_pretrained(tok_dir)
    r = random.Random(SEED)
    gen_strings.EN = gen_strings.words_en(r)
    tmp = os.path.join(out_dir, "chat.jsonl.tmp")
    n = 1200
    with open(tmp, "w", encoding="utf-8") as f:
        for i in range(n):
            msgs = conversation(r)
            agp = r.random() < 0.15
            et = None
            kwargs = {}
            if agp and r.random() < 0.5:
                et = False
                kwargs["enable_thinking"] = False
            res = tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=agp, **kwargs)
            ids = res["input_ids"] if hasattr(res, "keys") else res
            ids = [int(x) for x in ids]
            f.write(json.dumps({"messages": msgs, "add_generation_prompt": agp,
                                "enable_thinking": et, "ids": ids},
                               ensure_ascii=False, separators=(",", ":")) + "\n")
    os.replace(tmp, os.path.join(out_dir, "chat.jsonl"))
    print(f"wrote {n} conversations to {os.path.join(out_dir, 'chat.jsonl')}")

    # decode parity on random id sequences (partial UTF-8 bytes, special tokens)
    raw = Tokenizer.from_file(path)
    vs = raw.get_vocab_size(with_added_tokens=True)
    tmp = os.path.join(out_dir, "decode.jsonl.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for i in range(3000):
            ids = [r.randrange(vs) if r.random() < 0.5 else r.randrange(256) for _ in range(r.randint(1, 12))]
            if r.random() < 0.2:
                ids.append(r.randrange(151643, 151669))
            f.write(json.dumps({"ids": ids, "decoded": raw.decode(ids, skip_special_tokens=False),
                                "decoded_skip": raw.decode(ids, skip_special_tokens=True)},
                               ensure_ascii=False, separators=(",", ":")) + "\n")
    os.replace(tmp, os.path.join(out_dir, "decode.jsonl"))
    print(f"wrote 3000 id sequences to {os.path.join(out_dir, 'decode.jsonl')}")


if __name__ == "__main__":
    main()
