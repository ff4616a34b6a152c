#!/usr/bin/env python3
"""Writes tokenizer parity fixtures: varied strings with Hugging Face `tokenizers` ids.

usage: gen_strings.py TOKENIZER_DIR OUT_DIR

OUT_DIR/strings.jsonl  >= 10,000 strings (fixed seed): English, Chinese, Arabic, code, emoji, long
                       whitespace runs, digits, special-token text, \\r\\n, tabs, combining marks
                       that NFC composes, random code points from every plane.
OUT_DIR/sweep.jsonl    every Unicode scalar value below U+40000 and in U+E0000..U+E0FFF, every
                       61st above (planes 4-13 unassigned, 15-16 private use) in a few
                       contexts, 16 code points per string: regex property and NFC table parity.
Each line: {"text", "ids" (special tokens parsed), "ids_plain" (HF encode_special_tokens=True),
"decoded" (HF decode(ids), only when it differs from text), "nfc" (HF's normalizer leaves the text
unchanged)}.
If TOKENIZER_DIR/tokenizer.json is absent, writes OUT_DIR/ABSENT and exits 0 (the C++ test
then skips, saying so).
"""
import json
import os
import random
import sys

SEED = 20261129


def words_en(r):
    base = ("the of and to in is was he for it with as his on be at by I this had not are but from or "
            "have an they which one you were her all she there would their we him been has when who "
            "will more no if out so said what up its about into than them can only other new some "
            "could time these two may then do first any my now such like our over man me even most "
            "made after also did many before must through back years where much your way well down "
            "should because each just those people Mr how too little state good very make world still "
            "own see men work long get here between both life being under never day same another know "
            "while last might us great old year off come since against go came right used take three "
            "HELLO World Tokenizer GPU CUDA LLaMA Qwen3 fine-tuning don't can't it's we're they've I'm "
            "you'll she'd IT'S DON'T O'Neil rock'n'roll naïve café résumé coöperate").split()
    return base


EN = None
PUNCT = list(".,;:!?-()[]{}\"'`/\\@#$%^&*_=+<>|~")
CJK = [chr(c) for c in range(0x4E00, 0x9FA6)]
CJK_PUNCT = list("，。！？、；：“”‘’（）《》【】…—·")
ARABIC_LETTERS = [chr(c) for c in range(0x0621, 0x064B)]
ARABIC_MARKS = [chr(c) for c in range(0x064B, 0x0653)]
ARABIC_DIGITS = [chr(c) for c in range(0x0660, 0x066A)]
EMOJI = ["😀", "😂", "🥲", "👍", "👍🏽", "❤️", "🔥", "🚀", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇫🇷", "🇯🇵", "✨",
         "🤖", "🧑🏿‍💻", "☕", "1️⃣", "#️⃣", "©", "™", "🫠", "\U0001FAE8"]
SPECIAL = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>",
           "</tool_call>", "<tool_response>", "</tool_response>", "<|fim_prefix|>", "<|vision_pad|>",
           "<|im_start", "im_end|>", "<|im_start|><|im_end|>", "<<|im_end|>>", "<|im_end|>\n",
           "<|IM_START|>", "< |im_start| >", "<thinking>", "<|endoftext|><|endoftext|>"]
WS = [" ", "  ", "   ", "\t", "\n", "\r\n", "\r", "\n\n", " \n", "\t\t", "\u00a0", "\u3000", "\u2003",
      "\u2028", "\u0085", "\x0b", "\x0c", "\u200b", "\u180e", "\ufeff"]
COMBINING = ["e\u0301", "a\u0308", "o\u0302\u0323", "o\u0323\u0302", "A\u030a", "\u212b", "\u2126",
             "n\u0303", "c\u0327", "u\u031b\u0301", "\u1100\u1161\u11a8", "\u1112\u1161\u11ab",
             "\u0915\u093c", "\u05d0\u05b7", "\u0041\u0300\u0316", "\u0041\u0316\u0300",
             "\u1e0b\u0323", "\u0071\u0307\u0323", "\u00c5", "\u0130", "\u304b\u3099",
             "\u30cf\u309a", "\u0627\u0653", "\u0648\u0654", "\u2000", "\u2001", "\uf900",
             "\U0002f800", "\u0344", "\u0958", "\u1f71"]
CODE = [
    "def f(x):\n    return x * 2\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}\n",
    "#include <vector>\nint main() { std::vector<int> v{1,2,3}; return v.size(); }\n",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
    "{\"key\": [1, 2.5, -3e10, null, true], \"nested\": {\"a\": \"b\"}}",
    "x = [i**2 for i in range(10) if i % 2 == 0]  # squares\n",
    "if (a && b || !c) { return ptr->next; } else { throw std::runtime_error(\"x\"); }",
    "<html><body><div class=\"x\">Hello &amp; bye</div></body></html>",
    "    \n        \n    pass\n",
    "fn main() -> Result<(), Box<dyn Error>> { println!(\"{:?}\", 42_u64); Ok(()) }",
    "$ git commit -m 'fix: tokenizer' && ./build.sh --jobs=2 2>&1 | tee log.txt",
    "```python\nimport numpy as np\narr = np.zeros((3, 4), dtype=np.float32)\n```",
    "a_b_c = 0x1F; b = 0b1010; c = 1_000_000; d = 3.14159e-10",
    "\t\tif x:\r\n\t\t\ty()\r\n",
]


def rand_en(r, n):
    s = []
    for _ in range(n):
        w = r.choice(EN)
        if r.random() < 0.1:
            w = w.capitalize()
        s.append(w)
        if r.random() < 0.15:
            s[-1] += r.choice(PUNCT)
    return " ".join(s)


def rand_zh(r, n):
    out = []
    for _ in range(n):
        out.append(r.choice(CJK))
        if r.random() < 0.1:
            out.append(r.choice(CJK_PUNCT))
        if r.random() < 0.03:
            out.append(str(r.randint(0, 2026)))
        if r.random() < 0.03:
            out.append(" " + r.choice(EN) + " ")
    return "".join(out)


def rand_ar(r, n):
    words = []
    for _ in range(n):
        w = "".join(r.choice(ARABIC_LETTERS) for _ in range(r.randint(1, 7)))
        if r.random() < 0.3:
            w = "".join(c + (r.choice(ARABIC_MARKS) if r.random() < 0.4 else "") for c in w)
        if r.random() < 0.1:
            w = "".join(r.choice(ARABIC_DIGITS) for _ in range(r.randint(1, 4)))
        words.append(w)
    return " ".join(words) + r.choice(["", ".", "؟", "،"])


def rand_cp(r):
    while True:
        plane = r.random()
        if plane < 0.5:
            c = r.randint(0, 0xFFFF)
        elif plane < 0.8:
            c = r.randint(0x10000, 0x2FFFF)
        elif plane < 0.9:
            c = r.randint(0x30000, 0x3FFFF)
        else:
            c = r.choice([r.randint(0xE0000, 0xE01EF), r.randint(0xF0000, 0x10FFFF)])
        if not (0xD800 <= c <= 0xDFFF):
            return chr(c)


def rand_ws(r):
    return "".join(r.choice(WS) for _ in range(r.randint(1, 6))) * r.choice([1, 1, 2, 10, 40])


def rand_digits(r):
    k = r.random()
    if k < 0.3:
        return str(r.randint(0, 10 ** r.randint(1, 30)))
    if k < 0.5:
        return f"{r.uniform(-1e6, 1e6):.{r.randint(0, 8)}f}"
    if k < 0.7:
        return " ".join(str(r.randint(0, 999)) for _ in range(r.randint(2, 8)))
    if k < 0.85:
        return "".join(r.choice("0123456789٠١٢٣٤٥٦٧٨٩０１２３①②ⅫⅣ¹²³½") for _ in range(r.randint(1, 20)))
    return f"{r.randint(1, 31)}/{r.randint(1, 12)}/{r.randint(1900, 2100)} {r.randint(0, 23)}:{r.randint(0, 59):02d}"


def piece(r):
    k = r.randrange(11)
    if k == 0:
        return rand_en(r, r.randint(1, 30))
    if k == 1:
        return rand_zh(r, r.randint(1, 40))
    if k == 2:
        return rand_ar(r, r.randint(1, 12))
    if k == 3:
        return r.choice(CODE)
    if k == 4:
        return "".join(r.choice(EMOJI) for _ in range(r.randint(1, 6)))
    if k == 5:
        return rand_ws(r)
    if k == 6:
        return rand_digits(r)
    if k == 7:
        return r.choice(SPECIAL)
    if k == 8:
        return "".join(r.choice(COMBINING) for _ in range(r.randint(1, 5)))
    if k == 9:
        return "".join(rand_cp(r) for _ in range(r.randint(1, 12)))
    return "".join(r.choice(PUNCT) for _ in range(r.randint(1, 8)))


def gen_strings(r, n):
    out = ["", " ", "\n", "a", "<|im_start|>", "hello world", "Hello,  world!\r\n", "'s", "'S",
           "don't DON'T", " " * 1000, "\n" * 100, "\t" * 50 + "x", "1234567890" * 20,
           "a" * 3000, "ab" * 2000, "的" * 500, "😀" * 200, "e\u0301" * 50, "x" + "\u0301" * 40,
           " \u0301", "\r\n\r\n  \r\n", "<|im_start|>user\nhi<|im_end|>\n",
           "<think>\n\n</think>\n\n", "<|endoftext|>" * 3]
    while len(out) < n:
        k = r.random()
        if k < 0.6:
            s = "".join(piece(r) + (r.choice(WS) if r.random() < 0.5 else "")
                        for _ in range(r.randint(1, 6)))
        elif k < 0.95:
            s = piece(r)
        else:  # long document
            s = "".join(piece(r) + r.choice(WS) for _ in range(r.randint(50, 200)))
        out.append(s)
    return out


def gen_sweep():
    # Planes 4-13 are unassigned and 15-16 private use: every 61st code point suffices there.
    cps = [c for c in range(0x110000)
           if not (0xD800 <= c <= 0xDFFF)
           and (c < 0x40000 or 0xE0000 <= c <= 0xE0FFF or c % 61 == 0)]
    out = []
    for i in range(0, len(cps), 16):
        parts = []
        for c in cps[i:i + 16]:
            ch = chr(c)
            parts.append(f" {ch}a{ch}1{ch}{ch} '{ch}\n")
        out.append("".join(parts))
    return out


def main():
    tok_dir, out_dir = sys.argv[1], sys.argv[2]
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(tok_dir, "tokenizer.json")
    if not os.path.exists(path):
        with open(os.path.join(out_dir, "ABSENT"), "w") as f:
            f.write(f"{path} is absent\n")
        print(f"{path} is absent; fixtures not generated")
        return
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(path)
    plain = Tokenizer.from_file(path)
    plain.encode_special_tokens = True
    global EN
    r = random.Random(SEED)
    EN = words_en(r)
    for name, texts in (("strings.jsonl", gen_strings(r, 12000)), ("sweep.jsonl", gen_sweep())):
        encs = tok.encode_batch(texts, add_special_tokens=False)
        ids = [e.ids for e in encs]
        if name == "strings.jsonl":
            ids_plain = [e.ids for e in plain.encode_batch(texts, add_special_tokens=False)]
        else:
            ids_plain = [None] * len(texts)
        decoded = tok.decode_batch(ids, skip_special_tokens=False)
        tmp = os.path.join(out_dir, name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            for t, i, p, d in zip(texts, ids, ids_plain, decoded):
                rec = {"text": t, "ids": i}
                if d != t:
                    rec["decoded"] = d
                rec["nfc"] = tok.normalizer.normalize_str(t) == t
                if p is not None:
                    rec["ids_plain"] = p
                f.write(json.dumps(rec, ensure_ascii=False, separators=(",", ":")) + "\n")
        os.replace(tmp, os.path.join(out_dir, name))
        print(f"wrote {len(texts)} strings to {os.path.join(out_dir, name)}")


if __name__ == "__main__":
    main()
