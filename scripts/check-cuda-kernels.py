"""Compiles the CUDA kernels of metal-kernels/ with NVRTC (no GPU needed), wrapped
as MLX's cuda_kernel wraps them: the same generated signature, template
constants and includes, with MLX's utils.cuh replaced by the stand-in that
compile-once compiles our kernels with (patches/src/cuda_kernel_cache.cpp):
a kernel that compiles here is one MLX's kernel cache can keep. Catches
compile errors before a kernel reaches the GPU machine.

usage: python scripts/check-cuda-kernels.py NVRTC_LIB INCLUDE_DIR...
  NVRTC_LIB    libnvrtc.so (PyPI: nvidia-cuda-nvrtc-cu12)
  INCLUDE_DIR  CUDA headers: nvidia-cuda-runtime-cu12's include, nvidia-cuda-cccl-cu12's include
env CHECK_ONLY=name,name  compiles only those kernels' instances (all 336 take ~15 minutes on 2 cores)
"""

import ctypes, itertools, os, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KERNELS = ROOT / "metal-kernels"


def utils_stub():
    """The stand-in for MLX's utils.cuh that compile-once compiles our kernels
    with (patches/src/cuda_kernel_cache.cpp, between its stub markers): the
    types of the signature MLX generates, MAX_NDIM from MLX's shipped config.h."""
    text = (ROOT / "patches/src/cuda_kernel_cache.cpp").read_text()
    return text.split('R"stub(', 1)[1].split(')stub"', 1)[0]


# MLX's shipped headers (config.h), as MLX's compiler passes them.
MLX_INCLUDE = ROOT / "vendor/mlx/mlx/include"

CTYPE = {"f32": "float", "f16": "__half", "bf16": "__nv_bfloat16", "u8": "uint8_t", "u32": "uint32_t", "i32": "int32_t"}


def wrap(name, header, body, inputs, outputs, template):
    src = '#include "mlx/backend/cuda/device/utils.cuh"\n#include <cooperative_groups.h>\n' + header + "\nnamespace mlx::core::cu {\n__global__ void " + name + "(\n"
    params = []
    for n, t in inputs:
        params.append(f"    const {CTYPE[t]}* {n}")
        if f"{n}_shape" in body:
            params.append(f"    const __grid_constant__ Shape {n}_shape")
        if f"{n}_ndim" in body:
            params.append(f"    const __grid_constant__ int {n}_ndim")
    for n, t in outputs:
        params.append(f"    {CTYPE[t]}* {n}")
    src += ",\n".join(params) + ") {\n"
    for k, v in template.items():
        src += f"  using {k} = {CTYPE[v[1:]]};\n" if isinstance(v, str) and v.startswith("@") else f"  constexpr int {k} = {v};\n"
    return src + body + "\n}\n}\n"


def compile_one(lib, includes, name, src, arch="compute_90"):
    """(NVRTC's result, its log, the PTX when it compiled) of one wrapped kernel source."""
    prog = ctypes.c_void_p()
    headers = (ctypes.c_char_p * 1)(utils_stub().encode())
    include_names = (ctypes.c_char_p * 1)(b"mlx/backend/cuda/device/utils.cuh")
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), f"{name}.cu".encode(), 1, headers, include_names) == 0
    opts = [f"--gpu-architecture={arch}".encode(), b"-std=c++17", b"-default-device"] + [f"-I{i}".encode() for i in [MLX_INCLUDE, *includes]]
    arr = (ctypes.c_char_p * len(opts))(*opts)
    res = lib.nvrtcCompileProgram(prog, len(opts), arr)
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    buf = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, buf)
    ptx = b""
    if res == 0:
        lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
        out = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetPTX(prog, out)
        ptx = out.value
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return res, buf.value.decode(errors="replace"), ptx


def turbo_attend_io(t):
    """turbo_attend's (inputs, outputs) for element type t ("bf16", "f16", "f32"), as kernels.rs names them."""
    return ([("q", t), ("kv", "u8"), ("params", "i32"), ("signs", "f32"), ("kcent", "f32"), ("vcent", "f32"), ("sink_k", t), ("sink_v", t),
             ("win", t), ("win_params", "i32"), ("counts", "u32")],
            [("part_o", "f32"), ("part_ml", "f32"), ("out", t)])

def quant_matmul_io(t, form, gather, template):
    """quant_matmul's (inputs, outputs, defines) for element type t, form (0 plain, 1 gated
    (QMM_GLU), 2 with a residual (QMM_RESIDUAL, dense only), 3 and 4: plain and gated, normed
    (QMM_NORM, dense only)) and gather (QMM_GATHER), as quant_kernel.rs names them; adds the
    constants those forms take to `template` (the norm's eps, the gather's rows a pair)."""
    glu, residual, norm = int(form in (1, 4)), int(form == 2), int(form >= 3)
    if gather:
        template.setdefault("DIV", 8)
    if norm:
        template.setdefault("EPS_BITS", 925353388)  # 1e-5
    weight = [("w", "u32"), ("scales", t), ("biases", t)]
    up = [("w_up", "u32"), ("scales_up", t), ("biases_up", t)] if glu else []
    inputs = [("x", t)] + ([("nw", t)] if norm else []) + weight + up + ([("res", t)] if residual else []) + ([("idx", "u32")] if gather else [])
    defines = f"#define QMM_GATHER {gather}\n#define QMM_GLU {glu}\n#define QMM_RESIDUAL {residual}\n#define QMM_NORM {norm}\n"
    return inputs, [("y", t)], defines


def main():
    lib = ctypes.CDLL(sys.argv[1])
    includes = sys.argv[2:]
    header = (KERNELS / "turbo_common.cuh").read_text()
    failures = 0
    cases = []
    for t, (d, kfmt, kbits, vbits) in itertools.product(["@bf16", "@f16", "@f32"], [(64, 0, 4, 4), (128, 0, 4, 3), (256, 0, 4, 3), (256, 1, 4, 3), (128, 1, 4, 3)]):
        kg = min(d, 128)
        common = {"T": t, "D": d, "KFMT": kfmt, "KBITS": kbits, "KG": kg, "VBITS": vbits}
        encode_in = [("k", t[1:]), ("v", t[1:]), ("signs", "f32"), ("kbounds", "f32"), ("kcent", "f32"), ("vbounds", "f32"), ("vcent", "f32")]
        cases.append(("turbo_encode", encode_in, [("o", "u8"), ("rkv", t[1:])], common))
        # A decode step's form (kernels.rs `encode_step`): the whole window out.
        cases.append(("turbo_encode", encode_in + [("win", t[1:]), ("moves", "i32")], [("o", "u8"), ("nwin", t[1:])], common,
                      "#define TURBO_ENCODE_STEP 1\n" + header))
        for rep in [1, 4, 8]:
            if rep * d > 1024:
                continue
            cases.append(("turbo_attend", *turbo_attend_io(t[1:]), dict(common, REP=rep, S=t, WS=4)))
            if d == 128:
                # kernels.rs `turbo_attend_bounded` (more than 4 query heads a KV head) and
                # `turbo_attend_four`: launch bounds through the header.
                bound = 3 if rep > 4 else 4
                cases.append(("turbo_attend", *turbo_attend_io(t[1:]), dict(common, REP=rep, S=t, WS=4), f"#define TURBO_MIN_BLOCKS {bound}\n" + header))
    for t, d, rep, (bits, gs) in itertools.product(["@bf16", "@f16", "@f32"], [64, 128, 256], [1, 4, 8], [(0, 32), (8, 64), (4, 32), (8, 128)]):
        if bits and d % gs:
            continue  # affine_applies: a row is whole scale groups
        codes = "u32" if bits else t[1:]
        inputs = [("q", t[1:]), ("k", codes), ("v", codes), ("params", "i32")] + [(n, t[1:]) for n in ("ks", "kb", "vs", "vb")] + [("counts", "u32")]
        cases.append(("dense_attend", inputs, [("part_o", "f32"), ("part_ml", "f32"), ("out", t[1:])], {"T": t, "D": d, "REP": rep, "BITS": bits, "GS": gs, "U": 4 if rep > 4 else 2, "QS": int(rep > 4)}))  # kernels.rs `lane_loop`
    for t, (dk, dv, hk, hv) in itertools.product(["@bf16", "@f16", "@f32"], [(128, 128, 16, 32), (64, 32, 2, 4), (256, 64, 4, 4), (32, 32, 2, 4)]):
        inputs = [("q", t[1:]), ("k", t[1:]), ("v", t[1:]), ("g", "f32"), ("beta", t[1:]), ("state_in", "f32")]
        cases.append(("gated_delta", inputs, [("y", t[1:]), ("state_out", "f32")], {"InT": t, "Dk": dk, "Dv": dv, "Hk": hk, "Hv": hv}))
    # router_kernel.rs: the experts and top-k of the MoE families (Mixtral, Qwen2-MoE, OLMoE,
    # Qwen3-MoE, Qwen3-Next), either router order, scores normalized or not.
    for t, (e, k), first, norm, high in itertools.product(["@bf16", "@f16", "@f32"], [(8, 2), (60, 4), (128, 8), (512, 10)], [0, 1], [0, 1], [0, 1]):
        cases.append(("moe_router", [("logits", t[1:])], [("inds", "u32"), ("scores", t[1:])], {"T": t, "E": e, "K": k, "SOFTMAX_FIRST": first, "NORM": norm, "TIE_HIGH": high}))
    qmm_header = (KERNELS / "quant_matmul.cuh").read_text()
    for t, bits, gs, rt, mt, wk, gather, form in itertools.product(["@bf16", "@f16"], [4, 8], [32, 64, 128], [1, 2], [1, 4], [1, 8], [0, 1], [0, 1, 2, 3, 4]):
        if gather and (mt > 1 or form >= 2) or form in (1, 4) and rt > 1:
            continue  # gathers: one row tile, no residual or norm; gated: one feature tile
        template = {"T": t, "BITS": bits, "GS": gs, "RT": rt, "MT": mt, "WK": wk}
        inputs, outputs, defines = quant_matmul_io(t[1:], form, gather, template)
        cases.append(("quant_matmul", inputs, outputs, template, defines + qmm_header))
    only = [n for n in os.environ.get("CHECK_ONLY", "").split(",") if n]
    cases = [c for c in cases if not only or c[0] in only]
    for name, inputs, outputs, template, *own in cases:
        body = (KERNELS / f"{name}.cu").read_text()
        own_header = own[0] if own else header if name.startswith(("turbo_", "dense_")) else ""
        res, log, _ = compile_one(lib, includes, name, wrap(name, own_header, body, inputs, outputs, template))
        if res != 0 or "warning" in log:
            failures += res != 0
            print(f"== {name} {template}\n{log}")
    print(f"{len(cases)} kernel instances compiled, {failures} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
