"""Compiles one instance of a CUDA kernel of metal-kernels/ for sm_90a without a GPU and
shows what the GPU would run: registers, shared memory and spills (ptxas), and the
instruction mix of each loop of its SASS (nvdisasm). Kernel work between GPU calls: a
change's instruction count per loop iteration shows before any device time is spent.

The kernel is wrapped as MLX wraps it (scripts/check-cuda-kernels.py's `wrap`), compiled
to PTX by NVRTC, then to SASS by ptxas. Tools from PyPI wheels (unzip them anywhere):
nvidia-cuda-nvrtc-cu12 (libnvrtc), nvidia-cuda-runtime-cu12 and nvidia-cuda-cccl-cu12
(headers), nvidia-cuda-nvcc-cu12 (ptxas), nvidia-cuda-nvdisasm (nvdisasm); or CUDA 13's,
as the GPU machine's MLX uses (nvidia-cuda-nvrtc, -runtime, -cccl, -nvcc ==13.0.*, all under
nvidia/cu13/: --include nvidia/cu13/include --include nvidia/cu13/include/cccl; an unzipped
ptxas needs its execute bit). With CUDA 13.0's the counts are the H200's (session 45: 128
registers for turbo_attend's Llama instance, 130 for an edit of it, as ncu read them there).

usage: python scripts/kernel-sass.py --nvrtc LIB --ptxas BIN --nvdisasm BIN --include DIR [--include DIR]
           [--template '{"D": 128, "REP": 4}'] [--source FILE] [--min-blocks N] [--sass OUT.sass] [turbo_attend]
The template starts from turbo_attend's Llama-3.1-8B `balanced` instance (bf16, head dim
128, 4 query heads per KV head, 8-bit keys, 3-bit values); --template overrides entries.
--min-blocks compiles it with launch bounds for N blocks a multiprocessor, as kernels.rs's
`turbo_attend_four` (4, the Llama instance as it runs) and `turbo_attend_bounded` (3)
(TURBO_MIN_BLOCKS in turbo_common.cuh). quant_matmul starts from the gated, normed
instance a Llama-3.1-8B step runs at one row; its template also takes FORM (0 plain, 1
gated, 2 with a residual, 3 and 4 plain and gated normed) and GATHER (0 or 1). A block
of 32 * WK threads fits an SM's 64K registers at up to 65536 / (32 * WK) a thread.
"""

import argparse, collections, ctypes, importlib.util, json, re, subprocess, tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("check", ROOT / "scripts" / "check-cuda-kernels.py")
check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check)

def qmm_io(t, template):
    """quant_matmul's inputs, outputs and header for the template's FORM and GATHER (as
    check-cuda-kernels.py's `quant_matmul_io` takes them), which it carries for this script only."""
    form, gather = template.pop("FORM"), template.pop("GATHER")
    inputs, outputs, defines = check.quant_matmul_io(t, form, gather, template)
    return inputs, outputs, defines + (check.KERNELS / "quant_matmul.cuh").read_text()


def turbo_header(min_blocks):
    header = (check.KERNELS / "turbo_common.cuh").read_text()
    return f"#define TURBO_MIN_BLOCKS {min_blocks}\n{header}" if min_blocks else header


# Each kernel's (inputs, outputs, header) for an element type, template and --min-blocks,
# and its default template.
KERNELS = {
    "turbo_attend": (lambda t, tpl, mb: (*check.turbo_attend_io(t), turbo_header(mb)),
                     {"T": "@bf16", "S": "@bf16", "D": 128, "REP": 4, "KFMT": 0, "KBITS": 4, "KG": 128, "VBITS": 3, "WS": 4}),
    "dense_attend": (lambda t, tpl, mb: ([("q", t), ("k", t), ("v", t), ("params", "i32")] + [(n, t) for n in ("ks", "kb", "vs", "vb")] + [("counts", "u32")],
                                         [("part_o", "f32"), ("part_ml", "f32"), ("out", t)], turbo_header(mb)),
                     {"T": "@bf16", "D": 128, "REP": 4, "BITS": 0, "GS": 32, "U": 2, "QS": 0}),
    # The Llama-3.1-8B decode step's gate/up product at one row (quant_kernel.rs `Tiles`).
    "quant_matmul": (lambda t, tpl, mb: qmm_io(t, tpl), {"T": "@bf16", "BITS": 4, "GS": 64, "RT": 1, "MT": 1, "WK": 8, "FORM": 4, "GATHER": 0}),
}


def loops(sass):
    """The instruction count, and (first, last, opcodes) of each backward branch's body,
    largest first."""
    labels, ins = {}, []
    for line in sass.splitlines():
        if m := re.match(r"^(\.L_x_\d+):", line):
            labels[m.group(1)] = len(ins)
        elif m := re.match(r"^\s+/\*[0-9a-f]{4,}\*/\s+(.*?);", line):
            ins.append(m.group(1))
    ops = [re.sub(r"^@!?U?P\w+\s+", "", t).split()[0].split(".")[0] for t in ins]
    found = []
    for j, text in enumerate(ins):
        if (m := re.search(r"BRA.*`\((\.L_x_\d+)\)", text)) and labels.get(m.group(1), len(ins)) <= j:
            first = labels[m.group(1)]
            found.append((first, j, ops[first:j + 1]))
    return len(ins), sorted(found, key=lambda f: -len(f[2]))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kernel", nargs="?", default="turbo_attend", choices=sorted(KERNELS))
    ap.add_argument("--nvrtc", required=True)
    ap.add_argument("--ptxas", required=True)
    ap.add_argument("--nvdisasm", required=True)
    ap.add_argument("--include", action="append", required=True)
    ap.add_argument("--template", default="{}")
    ap.add_argument("--source", help="the kernel body (default: metal-kernels/KERNEL.cu)")
    ap.add_argument("--min-blocks", type=int, help="launch bounds for this many blocks a multiprocessor")
    ap.add_argument("--sass", help="also write the SASS here")
    a = ap.parse_args()
    io, template = KERNELS[a.kernel]
    template = dict(template, **json.loads(a.template))
    inputs, outputs, header = io(template["T"][1:], template, a.min_blocks)
    body = Path(a.source).read_text() if a.source else (check.KERNELS / f"{a.kernel}.cu").read_text()
    src = check.wrap(a.kernel, header, body, inputs, outputs, template)
    # NVRTC opens its builtins library by name: loaded first from beside it, it is found.
    for builtins in Path(a.nvrtc).parent.glob("libnvrtc-builtins.so*"):
        ctypes.CDLL(str(builtins), mode=ctypes.RTLD_GLOBAL)
        break
    # sm_90a, as MLX compiles for a Hopper GPU (its spills differ from sm_90's).
    res, log, ptx = check.compile_one(ctypes.CDLL(a.nvrtc), a.include, a.kernel, src, arch="compute_90a")
    if res != 0:
        raise SystemExit(log)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "k.ptx").write_bytes(ptx)
        info = subprocess.run([a.ptxas, "-arch=sm_90a", "-v", "-o", f"{tmp}/k.cubin", f"{tmp}/k.ptx"], capture_output=True, text=True, check=True)
        sass = subprocess.run([a.nvdisasm, "-c", f"{tmp}/k.cubin"], capture_output=True, text=True, check=True).stdout
    print(json.dumps(template))
    for line in info.stderr.splitlines():
        if "registers" in line or "spill" in line:
            print(line.strip())
    if a.sass:
        Path(a.sass).write_text(sass)
    total, found = loops(sass)
    print(f"{total} instructions; the largest backward-branch spans (loops, and the spans of shuffles'")
    print("divergence fallbacks, which jump back over whole loops):")
    show = lambda first, last, body: print(f"loop {first}..{last}: {len(body)} instructions;",
                                           ", ".join(f"{op} {n}" for op, n in collections.Counter(body).most_common(12)))
    for span in sorted(found[:8]):
        show(*span)
    # The attention kernels' chunk loop is the smallest span holding their
    # tensor-core instructions: its count is the instructions a chunk takes.
    mma = sorted((span for span in found if "HMMA" in span[2]), key=lambda f: len(f[2]))
    if mma:
        print("the smallest span with tensor-core instructions (HMMA):")
        show(*mma[0])


if __name__ == "__main__":
    main()
