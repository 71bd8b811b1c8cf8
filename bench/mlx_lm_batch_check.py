"""Does mlx-lm's own batch give the tokens mlx-lm gives each sequence alone?

The parity suite holds our engine's batched rows to mlx-lm's single-sequence
greedy tokens (parity/make_fixture.py writes them). Where a batched row of ours
differs on a backend, this asks the same of mlx-lm: it decodes the fixture's
prompts together with its BatchGenerator and compares each row with the
reference. If mlx-lm's batch differs too, the backend's batched kernels round
differently from its single-row ones (a near-tie flips), not our engine.

usage: python mlx_lm_batch_check.py FIXTURE_DIR [FIXTURE_DIR ...]
Prints one JSON line per fixture: for each row, the first position where the
batch differs from the reference (null: identical).
"""

import json
import sys
from pathlib import Path

import mlx.core as mx
from mlx_lm.generate import BatchGenerator
from mlx_lm.utils import load


def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def check(fixture: Path):
    reference = json.loads((fixture / "reference.json").read_text())
    spec = reference["spec"]
    model, _ = load(str(fixture))
    rows = [(reference["prompt"], reference["tokens"])]
    rows += [(b["prompt"], b["tokens"]) for b in reference["batch"]]
    gen = BatchGenerator(model, stop_tokens=None, prefill_step_size=spec.get("prefill_size", 512))
    uids = gen.insert([p for p, _ in rows], [len(t) for _, t in rows])
    out = {uid: [] for uid in uids}
    while responses := gen.next_generated():
        for r in responses:
            out[r.uid].append(int(r.token))
    gen.close()
    got = [out[uid] for uid in uids]
    return {
        "fixture": fixture.name,
        "device": str(mx.default_device()),
        "rows": len(rows),
        "first_difference": [first_difference(g, want) for g, (_, want) in zip(got, rows)],
    }


if __name__ == "__main__":
    for d in sys.argv[1:]:
        print(json.dumps(check(Path(d))), flush=True)
