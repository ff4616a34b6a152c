"""Reads a run directory's TensorBoard event file with tensorboard's own reader and checks that it
holds exactly the numbers of metrics.jsonl: one scalar series per numeric field ("train/<field>"
for step lines, "eval/<field without eval_>" ... see below), at the same steps, with the same
values (as float32, which is what simple_value stores).

usage: check_tensorboard.py RUN_DIR [--expect-eval]
Exit 0 and a summary line on success; an assertion message and exit 1 otherwise.
"""
import glob
import json
import math
import os
import sys

import numpy as np
from tensorboard.backend.event_processing import event_file_loader
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def main():
    run_dir = sys.argv[1]
    expect_eval = "--expect-eval" in sys.argv
    files = glob.glob(os.path.join(run_dir, "events.out.tfevents.*"))
    assert len(files) == 1, f"expected one event file in {run_dir}, found {files}"

    # The raw records: the first event is the file version, every record's CRCs are checked by
    # the loader (it raises on a corrupt record).
    events = list(event_file_loader.EventFileLoader(files[0]).Load())
    assert events, "no events"
    assert events[0].file_version == "brain.Event:2", events[0]

    # What metrics.jsonl says: step lines -> train/<key>, eval lines -> eval/<key>.
    want = {}
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            rec = json.loads(line)
            step = rec.pop("step")
            prefix = "eval/" if "eval_loss" in rec else "train/"
            for key, value in rec.items():
                if value is None:
                    continue
                want.setdefault(prefix + key, []).append((step, float(value)))
    assert "train/loss" in want and "train/lr" in want and "train/grad_norm" in want, sorted(want)
    if expect_eval:
        assert "eval/eval_loss" in want and "eval/eval_perplexity" in want, sorted(want)

    acc = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert tags == set(want), f"tags differ: only in TensorBoard {sorted(tags - set(want))}, " \
                              f"only in metrics.jsonl {sorted(set(want) - tags)}"
    points = 0
    for tag, series in want.items():
        got = [(e.step, e.value) for e in acc.Scalars(tag)]
        assert [s for s, _ in got] == [s for s, _ in series], f"{tag}: steps {got} vs {series}"
        for (step, v), (_, w) in zip(got, series):
            w32 = float(np.float32(w))
            assert v == w32 or (math.isnan(v) and math.isnan(w32)), f"{tag} step {step}: {v} != {w32}"
            points += 1
    print(f"tensorboard: {len(tags)} tags, {points} points equal metrics.jsonl ({os.path.basename(files[0])})")


if __name__ == "__main__":
    main()
