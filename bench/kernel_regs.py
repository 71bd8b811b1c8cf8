"""Registers, spills and shared memory of a CUDA custom kernel, compiled here
(no GPU needed) the way MLX's CUDA backend compiles one: the source wrapped
in MLX's generated signature and template constants, NVRTC with MLX's flags
(--device-as-default-execution-space, compute_90a), then ptxas -v. A kernel's
registers decide how many of its blocks share a multiprocessor (the
TurboQuant attention kernel must stay at 128 a thread for 4 blocks an SM:
BENCHMARKS.md, session 45), so a variant can be checked for that before it
costs a GPU call. Checked against the H200 (session 45): 128 registers for
the built-in Llama-shaped kernel and 130 for an edited one, as ncu's
launch__registers_per_thread read there; the bounded A3B-shaped one 168 with
116 bytes spilled, as session 34's ptxas there.

Needs CUDA 13's PyPI wheels, as the GPU machine's MLX (mlx-cuda-13) compiles
with: nvidia-cuda-nvrtc, nvidia-cuda-nvcc (ptxas), nvidia-cuda-runtime and
nvidia-cuda-cccl (headers), ==13.0.*, installed or unpacked under --cuda (the
folder holding their `nvidia/`; an unpacked ptxas needs its execute bit). CUDA
12's (-cu12, one folder per package) work too.

usage: python3 bench/kernel_regs.py [--cuda DIR] [--arch sm_90a] [--kernels DIR]
           [--shape llama|a3b|smollm2|gemma3|all] [--min-blocks N] [--sass PREFIX]
  prints one line per TurboQuant attention kernel instance of the shape:
  registers, spill bytes, static shared memory, and the blocks an SM holds
  by registers (65536 a multiprocessor, allocated per warp in units of 256).
"""
import argparse
import ctypes
import pathlib
import re
import subprocess
import sys
import tempfile

# The stand-in for MLX's device header: what the generated signature names.
MLX_UTILS = """
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda/std/array>
#include <cuda/std/cstdint>
namespace mlx::core::cu {
using Shape = cuda::std::array<int32_t, 10>;
using Strides = cuda::std::array<int64_t, 10>;
}
"""
DEFAULT_HEADER = '#include "mlx/backend/cuda/device/utils.cuh"\n#include <cooperative_groups.h>\n'
CTYPE = {"bf16": "__nv_bfloat16", "f16": "__half", "f32": "float", "u8": "uint8_t", "i32": "int32_t", "u32": "uint32_t"}

# The CUDA attention kernel's interface (server/src/kv/turbo/kernels.rs).
ATTEND_INPUTS = [("q", "T"), ("kv", "u8"), ("params", "i32"), ("signs", "f32"), ("kcent", "f32"), ("vcent", "f32"),
                 ("sink_k", "T"), ("sink_v", "T"), ("win", "T"), ("win_params", "i32"), ("counts", "u32")]
ATTEND_OUTPUTS = [("part_o", "f32"), ("part_ml", "f32"), ("out", "T")]
# (kernel name, template constants): the balanced preset's kernels (8-bit
# affine keys in groups of the head dim, 3-bit values) for two model shapes.
SHAPES = {
    "llama": [("turbo_attend", dict(T="bf16", S="bf16", D=128, REP=4, KFMT=0, KBITS=4, KG=128, VBITS=3, WS=4))],
    "a3b": [("turbo_attend_bounded", dict(T="bf16", S="bf16", D=128, REP=8, KFMT=0, KBITS=4, KG=128, VBITS=3, WS=4))],
    # SmolLM2-135M (head dim 64, 3 query heads a KV head: 4-bit values) and
    # Gemma-3-270M (head dim 256, 4 a KV head), the real models of the tests.
    "smollm2": [("turbo_attend", dict(T="bf16", S="bf16", D=64, REP=3, KFMT=0, KBITS=4, KG=64, VBITS=4, WS=4))],
    "gemma3": [("turbo_attend", dict(T="bf16", S="bf16", D=256, REP=4, KFMT=0, KBITS=4, KG=128, VBITS=3, WS=4))],
}


def signature(name, body, inputs, outputs, template):
    dtype = lambda t: CTYPE[template[t]] if t in template else CTYPE[t]
    lines = []
    for n, t in inputs:
        lines.append(f"    const {dtype(t)}* {n},")
        if f"{n}_shape" in body:
            lines.append(f"    const __grid_constant__ Shape {n}_shape,")
        if f"{n}_strides" in body:
            lines.append(f"    const __grid_constant__ Strides {n}_strides,")
        if f"{n}_ndim" in body:
            lines.append(f"    const __grid_constant__ int {n}_ndim,")
    for i, (n, t) in enumerate(outputs):
        lines.append(f"    {dtype(t)}* {n}" + (") {" if i == len(outputs) - 1 else ","))
    consts = [f"  using {k} = {CTYPE[v]};" if isinstance(v, str) else f"  constexpr int {k} = {v};" for k, v in template.items()]
    return f"__global__ void {name}(\n" + "\n".join(lines) + "\n" + "\n".join(consts) + "\n"


def nvrtc_ptx(lib, source, arch, includes):
    headers = [MLX_UTILS.encode()]
    names = [b"mlx/backend/cuda/device/utils.cuh"]
    prog = ctypes.c_void_p()
    H = ctypes.c_char_p * 1
    check = lambda r, what: r == 0 or sys.exit(f"nvrtc {what}: error {r}")
    check(lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"kernel.cu", 1, H(*headers), H(*names)), "create")
    opts = [b"--device-as-default-execution-space", f"--gpu-architecture=compute_{arch[3:]}".encode()] + [f"--include-path={i}".encode() for i in includes]
    r = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    if r != 0:
        sys.exit(f"nvrtc compile failed:\n{log.value.decode()}")
    lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
    ptx = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetPTX(prog, ptx)
    return ptx.value.decode()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cuda", default="/tmp/nvx13", help="folder holding the wheels' nvidia/ (installed: site-packages)")
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--kernels", default="metal-kernels", help="folder with turbo_common.cuh and turbo_attend.cu")
    ap.add_argument("--shape", default="all", choices=[*SHAPES, "all"])
    ap.add_argument("--min-blocks", type=int, help="compile the unbounded instances with launch bounds for this many blocks an SM "
                    "(turbo_common.cuh's TURBO_MIN_BLOCKS, as the bounded kernel's 3)")
    ap.add_argument("--sass", help="also write each instance's SASS (nvdisasm) to SASS.<shape>.txt")
    a = ap.parse_args()
    nv = pathlib.Path(a.cuda) / "nvidia"
    # CUDA 13's wheels share nvidia/cu13/; CUDA 12's have a folder each.
    cu13 = (nv / "cu13").is_dir()
    libdir = nv / ("cu13/lib" if cu13 else "cuda_nvrtc/lib")
    # NVRTC opens its builtins library by name: loaded first, it is found.
    ctypes.CDLL(str(next(libdir.glob("libnvrtc-builtins.so*"))), mode=ctypes.RTLD_GLOBAL)
    lib = ctypes.CDLL(str(next(libdir.glob("libnvrtc.so*"))))
    ptxas = nv / ("cu13/bin/ptxas" if cu13 else "cuda_nvcc/bin/ptxas")
    includes = [nv / "cu13/include", nv / "cu13/include/cccl"] if cu13 else [nv / "cuda_runtime/include", nv / "cuda_cccl/include"]
    kdir = pathlib.Path(a.kernels)
    header = (kdir / "turbo_common.cuh").read_text()
    body = (kdir / "turbo_attend.cu").read_text()
    for shape in SHAPES if a.shape == "all" else [a.shape]:
        for name, template in SHAPES[shape]:
            bound = 3 if name == "turbo_attend_bounded" else a.min_blocks
            head = f"#define TURBO_MIN_BLOCKS {bound}\n{header}" if bound else header
            src = (DEFAULT_HEADER + head + "namespace mlx::core::cu {\nnamespace cg = cooperative_groups;\n"
                   + signature(name, body + head, ATTEND_INPUTS, ATTEND_OUTPUTS, template) + body + "\n}\n}\n")
            ptx = nvrtc_ptx(lib, src, a.arch, includes)
            with tempfile.TemporaryDirectory() as tmp:
                p = pathlib.Path(tmp) / "k.ptx"
                p.write_text(ptx)
                out = subprocess.run([str(ptxas), f"-arch={a.arch}", "-v", str(p), "-o", str(pathlib.Path(tmp) / "k.cubin")],
                                     capture_output=True, text=True)
                info = out.stderr
                if out.returncode != 0:
                    sys.exit(f"ptxas failed:\n{info}")
                if a.sass:
                    sass = subprocess.run([str(ptxas.parent / "nvdisasm"), "-c", str(pathlib.Path(tmp) / "k.cubin")], capture_output=True, text=True)
                    pathlib.Path(f"{a.sass}.{shape}.txt").write_text(sass.stdout + sass.stderr)
            regs = int(re.search(r"Used (\d+) registers", info).group(1))
            spill = re.search(r"(\d+) bytes spill stores", info)
            smem = re.search(r"(\d+) bytes smem", info)
            warps = 128 // 32
            per_warp = (regs * 32 + 255) // 256 * 256
            blocks = 65536 // (per_warp * warps)
            print(f"{shape}: {name} {template}: {regs} registers, {spill.group(1) if spill else 0} bytes spilled, "
                  f"{smem.group(1) if smem else '?'} bytes static shared; {blocks} blocks an SM by registers")


if __name__ == "__main__":
    main()
