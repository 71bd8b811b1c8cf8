"""Writes variants of the CUDA TurboQuant attention kernel that each leave one
stage of its chunk loop out, for timing where a launch's time goes on a GPU
machine without hardware counters in the loop (the difference between a
variant's time and the full kernel's is that stage's share, overlap
included). Each variant is a folder for MLX_SERVE_TURBO_KERNELS; its output
is wrong by design, so time it with KV_ATTEND_FORCE_KERNELS=1 (kv_attend's
"kernels ms" column), never through the server.

  full       the kernel as built in (the same text, loaded from the folder)
  nocopy     no copies into the stages: the chunk loop computes on whatever
             the stages hold (the compute floor)
  nocompute  the copies and their waits only (the memory floor of the copy
             scheme)
  noscores   the score tiles' mma replaced by one add (their loads kept)
  novalues   no value tiles (step 3)

usage: python3 bench/turbo_variants.py OUT_DIR [--src metal-kernels]
"""
import argparse
import pathlib

FILES = ["turbo_common.cuh", "turbo_encode.cu", "turbo_attend.cu"]

LOOP_TOP = "  const int c = warp + WARPS * k;\n  const int limit = count - c * CH;"
FETCH_IF = "  if (c < nch) {\n    const size_t start = chunk_start(c);"
SCORE_MMA = "turbo_mma(sacc[s / KSG][n], a0, a1, a2, a3, qf[s][n][0], qf[s][n][1]);"
VALUES_FROM = "  // 3. Values of positions"
VALUES_TO = "  __syncwarp();\n}\nturbo_copy_wait<0>();"


def replace_once(text, old, new, what):
    if text.count(old) != 1:
        raise SystemExit(f"{what}: the anchor occurs {text.count(old)} times in turbo_attend.cu")
    return text.replace(old, new)


def variants(attend):
    out = {"full": attend}
    out["nocopy"] = replace_once(attend, FETCH_IF, FETCH_IF.replace("c < nch", "false && c < nch"), "nocopy")
    out["nocompute"] = replace_once(attend, LOOP_TOP, "  if (nch > 0) { __syncwarp(); continue; }\n" + LOOP_TOP, "nocompute")
    out["noscores"] = replace_once(attend, SCORE_MMA, "sacc[s / KSG][n][0] += __uint_as_float(a0 ^ a1 ^ a2 ^ a3);", "noscores")
    start = attend.find(VALUES_FROM)
    end = attend.find(VALUES_TO)
    if start < 0 or end < start:
        raise SystemExit("novalues: anchors not found in turbo_attend.cu")
    out["novalues"] = attend[:start] + attend[end:]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--src", default="metal-kernels")
    a = ap.parse_args()
    src = pathlib.Path(a.src)
    attend = (src / "turbo_attend.cu").read_text()
    for name, text in variants(attend).items():
        d = pathlib.Path(a.out) / name
        d.mkdir(parents=True, exist_ok=True)
        for f in FILES:
            (d / f).write_text(text if f == "turbo_attend.cu" else (src / f).read_text())
        print(d)


if __name__ == "__main__":
    main()
