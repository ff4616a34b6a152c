#!/usr/bin/env python3
"""make_demo_data.py - writes the demo chat dataset: data/demo/chat.jsonl and data/demo/eval.jsonl.

Deterministic (seeded `random.Random`, no other input): the same files on every machine, so they
can be committed and regenerated. Conversations are templated tasks a tiny model can learn
(arithmetic, capitals, word reversal, sorting, counting letters), with a realistic spread of
lengths: mostly short single turns, a tail of multi-turn dialogues and long "answer each"
lists, and a system prompt on about a third of them. Rows: {"messages": [{"role", "content"}]}.

    python scripts/make_demo_data.py [--out data/demo] [--train 6000] [--eval 300] [--seed 0]
"""
import argparse
import json
import os
import random

CAPITALS = {
    "France": "Paris", "Germany": "Berlin", "Italy": "Rome", "Spain": "Madrid",
    "Portugal": "Lisbon", "Japan": "Tokyo", "China": "Beijing", "India": "New Delhi",
    "Brazil": "Brasilia", "Argentina": "Buenos Aires", "Canada": "Ottawa", "Mexico": "Mexico City",
    "Egypt": "Cairo", "Kenya": "Nairobi", "Nigeria": "Abuja", "Australia": "Canberra",
    "Russia": "Moscow", "Poland": "Warsaw", "Sweden": "Stockholm", "Norway": "Oslo",
    "Finland": "Helsinki", "Denmark": "Copenhagen", "Greece": "Athens", "Turkey": "Ankara",
    "Iran": "Tehran", "Iraq": "Baghdad", "Thailand": "Bangkok", "Vietnam": "Hanoi",
    "Indonesia": "Jakarta", "Peru": "Lima", "Chile": "Santiago", "Colombia": "Bogota",
    "Austria": "Vienna", "Switzerland": "Bern", "Belgium": "Brussels", "Netherlands": "Amsterdam",
    "Ireland": "Dublin", "Hungary": "Budapest", "Czechia": "Prague", "Romania": "Bucharest",
    "Ukraine": "Kyiv", "Morocco": "Rabat", "Ghana": "Accra", "Ethiopia": "Addis Ababa",
    "South Korea": "Seoul", "Philippines": "Manila", "Pakistan": "Islamabad", "Cuba": "Havana",
    "New Zealand": "Wellington", "Iceland": "Reykjavik",
}
WORDS = ("apple river planet garden window silver orange pencil rocket forest castle mirror "
         "button dragon candle pocket ladder violin marble harbor tunnel jacket meadow parrot "
         "lantern puzzle summer winter autumn spring breeze thunder island desert valley "
         "engine bridge market school doctor teacher number letter").split()
SYSTEMS = [
    "You are a helpful assistant.",
    "You are a concise assistant. Answer in one sentence when you can.",
    "You are a patient math tutor. Show the result clearly.",
    "You are a geography assistant.",
    "You answer questions accurately and briefly.",
]


def arithmetic(r):
    a, b = r.randint(0, 999), r.randint(0, 999)
    op = r.choice("+-*")
    if op == "*":
        a, b = r.randint(0, 99), r.randint(0, 99)
    res = {"+": a + b, "-": a - b, "*": a * b}[op]
    q = r.choice(["What is {a} {op} {b}?", "Compute {a} {op} {b}.", "Calculate {a} {op} {b}, please.",
                  "{a} {op} {b} = ?"]).format(a=a, op=op, b=b)
    return q, f"{a} {op} {b} = {res}.", res


def capital(r):
    c = r.choice(list(CAPITALS))
    q = r.choice(["What is the capital of {c}?", "Name the capital city of {c}.",
                  "Which city is the capital of {c}?"]).format(c=c)
    return q, f"The capital of {c} is {CAPITALS[c]}.", c


def reverse(r):
    w = r.choice(WORDS)
    q = r.choice(["Reverse the word '{w}'.", "Spell '{w}' backwards.",
                  "What is '{w}' written in reverse?"]).format(w=w)
    return q, f"'{w}' reversed is '{w[::-1]}'.", w


def sort_numbers(r):
    xs = [r.randint(0, 99) for _ in range(r.randint(3, 12))]
    q = "Sort these numbers from smallest to largest: " + ", ".join(map(str, xs)) + "."
    return q, "Sorted: " + ", ".join(map(str, sorted(xs))) + ".", xs


def count_letters(r):
    w = r.choice(WORDS)
    ch = r.choice(sorted(set(w)))
    n = w.count(ch)
    return (f"How many times does the letter '{ch}' appear in '{w}'?",
            f"The letter '{ch}' appears {n} time{'s' if n != 1 else ''} in '{w}'.", w)


TASKS = [arithmetic, capital, reverse, sort_numbers, count_letters]


def single(r):
    q, a, _ = r.choice(TASKS)(r)
    return [{"role": "user", "content": q}, {"role": "assistant", "content": a}]


def multi_turn(r):
    msgs = []
    for _ in range(r.randint(2, 6)):
        task = r.choice(TASKS)
        q, a, x = task(r)
        msgs += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
        if task is arithmetic and r.random() < 0.5:
            k = r.randint(2, 9)
            msgs += [{"role": "user", "content": f"And that times {k}?"},
                     {"role": "assistant", "content": f"{x} * {k} = {x * k}."}]
        elif task is capital and r.random() < 0.5:
            msgs += [{"role": "user", "content": "Thanks! Which country was that again?"},
                     {"role": "assistant", "content": f"That was {x}."}]
    return msgs


def answer_each(r):
    n = r.choice([4, 6, 8, 12, 16, 24, 32, 48, 64, 96])
    items = [r.choice(TASKS)(r) for _ in range(n)]
    q = "Answer each question on its own line.\n" + "\n".join(
        f"{i + 1}. {q}" for i, (q, _, _) in enumerate(items))
    a = "\n".join(f"{i + 1}. {a}" for i, (_, a, _) in enumerate(items))
    return [{"role": "user", "content": q}, {"role": "assistant", "content": a}]


def conversation(r):
    u = r.random()
    msgs = single(r) if u < 0.6 else multi_turn(r) if u < 0.93 else answer_each(r)
    if r.random() < 0.33:
        msgs = [{"role": "system", "content": r.choice(SYSTEMS)}] + msgs
    return {"messages": msgs}


def write(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "data", "demo"))
    ap.add_argument("--train", type=int, default=6000)
    ap.add_argument("--eval", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    r = random.Random(a.seed)
    write(os.path.join(a.out, "chat.jsonl"), [conversation(r) for _ in range(a.train)])
    r = random.Random(a.seed + 1)
    write(os.path.join(a.out, "eval.jsonl"), [conversation(r) for _ in range(a.eval)])
    for name in ("chat.jsonl", "eval.jsonl"):
        p = os.path.join(a.out, name)
        print(f"wrote {os.path.normpath(p)} ({os.path.getsize(p) / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
