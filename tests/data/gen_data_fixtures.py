#!/usr/bin/env python3
"""gen_data_fixtures.py OUT_DIR - writes the chat dataset test files (JSONL, parquet, HF cache).

Deterministic. Files:
  good.jsonl / good.parquet      the same 2,000 conversations (parquet: row groups of 128 rows)
  big/part-0.jsonl, part-1.jsonl a folder dataset (1,500 + 1,700 rows) for order/resume tests
  bad_<case>.jsonl               one valid row, then the malformed row of <case> (row 2)
  mixed_bad.jsonl                20 valid rows with every malformed case interleaved
  bad_<case>.parquet             parquet malformed rows (null messages, null content, ...)
  truncated.parquet, notparquet.parquet, nomessages.parquet
  hub/datasets--acme--chat/...   an HF hub cache snapshot with train/test parquet shards
  expected.json                  the malformed cases and their exact messages
"""
import json
import os
import random
import sys

import pyarrow as pa
import pyarrow.parquet as pq

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
r = random.Random(1234)
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi".split()


def text(n):
    return " ".join(r.choice(WORDS) for _ in range(n))


def conv(i):
    msgs = []
    if i % 3 == 0:
        msgs.append({"role": "system", "content": "You are helpful."})
    # chat-like length mix: mostly short, a long tail
    turns = 1 + (i % 4 == 0) * r.randint(1, 4)
    for _ in range(turns):
        n = int(r.lognormvariate(3.0, 1.0)) + 1
        msgs.append({"role": "user", "content": f"q{i} " + text(min(n, 400))})
        n = int(r.lognormvariate(3.5, 1.0)) + 1
        msgs.append({"role": "assistant", "content": f"a{i} " + text(min(n, 600))})
    return {"messages": msgs}


rows = [conv(i) for i in range(2000)]


def write_jsonl(path, rows_or_lines):
    with open(path, "wb") as f:
        for x in rows_or_lines:
            f.write(x if isinstance(x, bytes) else (json.dumps(x) + "\n").encode())


write_jsonl(os.path.join(out, "good.jsonl"), rows)
MSG_T = pa.list_(pa.struct([("content", pa.string()), ("role", pa.string())]))
pq.write_table(pa.table({"prompt": [m["messages"][0]["content"] for m in rows],
                         "messages": pa.array([m["messages"] for m in rows], type=MSG_T)}),
               os.path.join(out, "good.parquet"), row_group_size=128)

os.makedirs(os.path.join(out, "big"), exist_ok=True)
write_jsonl(os.path.join(out, "big", "part-0.jsonl"), [conv(i) for i in range(1500)])
# a blank line in the middle and at the end: not rows
part1 = [conv(i) for i in range(1500, 3200)]
with open(os.path.join(out, "big", "part-1.jsonl"), "w") as f:
    for k, x in enumerate(part1):
        f.write(json.dumps(x) + "\n")
        if k == 10:
            f.write("   \n")
    f.write("\n")

ok = json.dumps(rows[0]).encode() + b"\n"
cases = {
    "invalid_json": (b'{"messages": [}\n', "invalid JSON: "),
    "not_object": (b'[1, 2]\n', "row is not a JSON object"),
    "missing_messages": (b'{"msgs": []}\n', "missing 'messages'"),
    "messages_not_list": (b'{"messages": "hi"}\n', "'messages' is not a list (got string)"),
    "message_not_object": (b'{"messages": [3]}\n', "message 0 is not an object (got number)"),
    "missing_role": (b'{"messages": [{"content": "x"}]}\n', "message 0: missing 'role'"),
    "unknown_role": (b'{"messages": [{"role": "user", "content": "x"}, {"role": "bot", "content": "y"}]}\n',
                     "message 1: unknown role 'bot' (allowed: system, user, assistant, tool)"),
    "role_not_string": (b'{"messages": [{"role": 1, "content": "x"}]}\n',
                        "message 0: 'role' is not a string (got number)"),
    "missing_content": (b'{"messages": [{"role": "user"}]}\n', "message 0: missing 'content'"),
    "content_not_string": (b'{"messages": [{"role": "user", "content": ["a"]}]}\n',
                           "message 0: 'content' is not a string (got list)"),
    "content_null": (b'{"messages": [{"role": "user", "content": null}]}\n',
                     "message 0: 'content' is not a string (got null)"),
    "invalid_utf8": (b'{"messages": [{"role": "user", "content": "ab\xff"}]}\n', "invalid UTF-8 at byte 45"),
    "empty": (b'{"messages": []}\n', "empty conversation"),
    "no_assistant": (b'{"messages": [{"role": "user", "content": "x"}]}\n', "no assistant turn"),
}
expected = {"jsonl": {}, "parquet": {}}
for name, (line, msg) in cases.items():
    write_jsonl(os.path.join(out, f"bad_{name}.jsonl"), [ok, line])
    expected["jsonl"][name] = msg
with open(os.path.join(out, "mixed_bad.jsonl"), "wb") as f:
    k = 0
    for name, (line, _) in cases.items():
        f.write(json.dumps(rows[k]).encode() + b"\n")
        f.write(line)
        k += 1
    for j in range(k, 20):
        f.write(json.dumps(rows[j]).encode() + b"\n")
expected["mixed_valid"] = 20
expected["mixed_bad"] = len(cases)

good_msgs = rows[0]["messages"]
pcases = {
    "null_messages": (None, "missing 'messages'"),
    "null_content": ([{"role": "user", "content": None}], "message 0: 'content' is not a string (got null)"),
    "unknown_role": ([{"role": "robot", "content": "x"}],
                     "message 0: unknown role 'robot' (allowed: system, user, assistant, tool)"),
    "empty": ([], "empty conversation"),
    "no_assistant": ([{"role": "user", "content": "x"}], "no assistant turn"),
}
for name, (msgs, msg) in pcases.items():
    pq.write_table(pa.table({"messages": pa.array([good_msgs, msgs], type=MSG_T)}),
                   os.path.join(out, f"bad_{name}.parquet"))
    expected["parquet"][name] = msg
BIN_T = pa.list_(pa.struct([("role", pa.binary()), ("content", pa.binary())]))
pq.write_table(pa.table({"messages": pa.array(
    [[{"role": b"user", "content": b"x"}, {"role": b"assistant", "content": b"ok\xc3"}]], type=BIN_T)}),
    os.path.join(out, "bad_invalid_utf8.parquet"))
expected["parquet"]["invalid_utf8"] = "message 1: content is not valid UTF-8 at byte 2"

data = open(os.path.join(out, "good.parquet"), "rb").read()
open(os.path.join(out, "truncated.parquet"), "wb").write(data[: len(data) // 2])
open(os.path.join(out, "notparquet.parquet"), "wb").write(b"this is not a parquet file\n" * 10)
pq.write_table(pa.table({"text": ["a", "b"]}), os.path.join(out, "nomessages.parquet"))

snap = os.path.join(out, "hub", "datasets--acme--chat", "snapshots", "0123abcd")
os.makedirs(os.path.join(snap, "data"), exist_ok=True)
os.makedirs(os.path.join(out, "hub", "datasets--acme--chat", "refs"), exist_ok=True)
open(os.path.join(out, "hub", "datasets--acme--chat", "refs", "main"), "w").write("0123abcd")
# As huggingface_hub lays it out: snapshot files are symlinks into blobs/.
blobs = os.path.join(out, "hub", "datasets--acme--chat", "blobs")
os.makedirs(blobs, exist_ok=True)
for split, lo, hi in (("train", 0, 300), ("test", 300, 350)):
    blob = os.path.join(blobs, f"blob-{split}")
    pq.write_table(pa.table({"messages": pa.array([m["messages"] for m in rows[lo:hi]], type=MSG_T)}),
                   blob, row_group_size=64)
    link = os.path.join(snap, "data", f"{split}-00000-of-00001.parquet")
    if os.path.lexists(link):
        os.remove(link)
    os.symlink(os.path.relpath(blob, os.path.dirname(link)), link)
expected["hub_train_rows"] = 300
expected["hub_test_rows"] = 50

json.dump(expected, open(os.path.join(out, "expected.json"), "w"), indent=1)
print("wrote fixtures to", out)
