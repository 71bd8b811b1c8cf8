#!/usr/bin/env bash
# The several-GPU run (issue 18): builds random-weight models with real shapes and runs
# bench/multi_gpu_bench.py on each (mlx-serve and mlx_lm.server on 1 GPU, then tensor and
# pipeline parallel over NCCL). On the GPU machine, from the project root:
#
# Here: ../shared/tools/cuda-bundle.sh; mkdir -p .device/bin && cp target/release/mlx-serve
#   vendor/mlxc/lib/libmlxc.so .device/bin/ && strip --strip-debug .device/bin/* &&
#   tar -C .device -cJf .device/bin.tar.xz bin && rm -r .device/bin
# There (device tool, kind nvidia-h200-x2, carry [".device"]): bash bench/multi_gpu.sh SHAPE...
#   SHAPE = llama-3.1-8b (4-bit, bf16 scales) | qwen3-30b-a3b (4-bit MoE)
#   env: GPUS (default 2), CONFIGS (multi_gpu_bench.py's --configs), OUT (where the JSON goes)
set -uo pipefail
source .device/cuda-env.sh
[ -x .device/bin/mlx-serve ] || tar -C .device -xJf .device/bin.tar.xz
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/multi-gpu}; MODELS=${MODELS:-/tmp/multi-gpu-models}
mkdir -p "$OUT" "$MODELS" ~/.cache/huggingface/hub
echo "== machine"; date -u
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; nvidia-smi topo -m
python3 -c 'import mlx.core as mx, mlx_lm; print("mlx", mx.__version__, "mlx-lm", mlx_lm.__version__)'
status=0
for shape in "$@"; do
  dir=$MODELS/$shape-4bit
  t0=$SECONDS
  # Each in its own process: MLX's buffer cache would keep GPU memory the servers need.
  case $shape in
    qwen3-30b-a3b) python3 bench/make_moe_model.py "$shape" "$dir" ;;
    *) python3 bench/make_model.py "$shape" "$dir" --dtype bfloat16 --bits 4 ;;
  esac || { status=1; continue; }
  echo "== $shape: made in $((SECONDS - t0)) s, $(du -sh "$dir" | cut -f1)"
  (cd bench && python3 multi_gpu_bench.py --model "$dir" --mlx-serve ../.device/bin/mlx-serve --python python3 \
     --gpus "${GPUS:-2}" ${CONFIGS:+--configs "$CONFIGS"} --out "$OUT/multi-gpu-$shape-4bit.json") || status=1
  echo "== $shape: took $((SECONDS - t0)) s"
done
exit $status
