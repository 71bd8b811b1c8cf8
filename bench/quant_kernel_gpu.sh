#!/usr/bin/env bash
# Issue 15's measurements on the GPU machine, in one call: the quantized-matmul kernel's tests,
# a real decode step with MLX's kernels and with ours, and the HTTP server against mlx_lm.server.
# Run from the project root after `source .device/cuda-env.sh`, with the binaries of
# `cargo build --release`, `cargo test --release --no-run --test quant_kernel` and
# `cargo bench --no-run --bench decode_step` under $BIN_DIR named mlx-serve, quant_kernel and
# decode_step (and libmlxc.so beside them); for `dense`, also `cargo test --release --lib
# --no-run`'s mlx_serve executable as mlx_serve_lib (`scripts/device-bundle.sh --bench`
# packs all of them).
#
# usage: bash bench/quant_kernel_gpu.sh STAGE...
#   tests   server/tests/quant_kernel.rs against MLX (dense, every tiling, gathered, fallbacks),
#           each test in SHARDS (default 4) processes at once
#   steps   benches/decode_step.rs on Llama-3.1-8B and Qwen3-30B-A3B 4-bit, rows 1,2,4,8,16,
#           once with MLX_SERVE_QMM_KERNEL=0 and once with the kernel; then 8 Llama rows of
#           one length and of other lengths (--ragged) at 128 and 4096 prompt tokens
#   server  bench/server_bench.py, Llama-3.1-8B 4-bit, 1 and 8 streams, mlx-serve vs mlx_lm.server
#   router  the MoE router kernel (models/router_kernel.rs): its test against MLX's ops (the
#           library's unit tests, packed as mlx_serve_lib), then decode_step on Qwen3-30B-A3B
#           4-bit at 1 and 8 rows with MLX_SERVE_ROUTER_KERNEL=0 and 1 in turn, twice
#   parity  the parity suite's tests whose mlx-lm reference can be compared on CUDA (the float32
#           MoE fixtures with MLX_ENABLE_TF32=0, as MLX runs float32 matmuls as TF32 otherwise;
#           the 16-bit dense ones), each alone with every kernel on, three at a time; those that
#           fail run again with every kernel off (a test failing both ways differs by MLX's CUDA
#           arithmetic, not ours). Needs the parity test packed as parity (`--bench` does).
#   dense   the 16-bit decode attention kernel for rows of other lengths (on by default;
#           MLX_SERVE_DENSE_KERNEL=0 turns it off): its test (the library's unit tests, packed as
#           mlx_serve_lib), then 8 rows of other lengths at 128 and 4 at 8192 prompt tokens with
#           it off and on, then the server's 8 streams (with it, the default)
# env: BIN_DIR (default .device/bin), MODELS (default /tmp/bench-models), OUT (default /tmp/qmm-out)
set -uo pipefail
BIN_DIR=${BIN_DIR:-.device/bin}
MODELS=${MODELS:-/tmp/bench-models}
OUT=${OUT:-/tmp/qmm-out}
mkdir -p "$MODELS" "$OUT" ~/.cache/huggingface/hub
export LD_LIBRARY_PATH=$PWD/$BIN_DIR:${LD_LIBRARY_PATH:-}

echo "== machine"
date -u
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
grep -m1 'model name' /proc/cpuinfo; nproc

# Models are built in child processes: MLX's buffer cache would otherwise keep their memory.
model() {
  local dir=$MODELS/$1
  if [ ! -f "$dir/config.json" ]; then
    case $1 in
      llama-3.1-8b-4bit) python3 bench/make_model.py llama-3.1-8b "$dir" --dtype bfloat16 --bits 4 >/dev/null ;;
      qwen3-30b-a3b-4bit) python3 bench/make_moe_model.py qwen3-30b-a3b "$dir" >/dev/null ;;
    esac
  fi
  echo "$dir"
}

status=0
for stage in "$@"; do
  echo "== $stage"
  case $stage in
    tests)
      # One process a test and shard, all at once: each compiles its kernel instances with
      # NVRTC one after another while the GPU idles (one process took over 280 s; five at once
      # 262 s, dense_matches_mlx alone: H200, session 34), so the tests' loops are split over
      # SHARDS processes each (MLX_SERVE_TEST_SHARD=K/N; tests without a loop of kernel
      # instances run whole in every shard). Summaries print after all have ended.
      shards=${SHARDS:-4}
      tests=$("$BIN_DIR/quant_kernel" --list 2>&1 | sed -n 's/: test$//p')
      [ -n "$tests" ] || { "$BIN_DIR/quant_kernel" --list 2>&1 | tail -3; status=1; }
      for t in $tests; do
        for k in $(seq 0 $((shards - 1))); do
          MLX_SERVE_TEST_SHARD=$k/$shards timeout 600 "$BIN_DIR/quant_kernel" --exact "$t" --nocapture \
            >"$OUT/quant-kernel-$t-$k.txt" 2>&1 &
        done
      done
      wait
      for t in $tests; do
        echo "-- $t: $(cat "$OUT"/quant-kernel-$t-*.txt | grep -c agrees) products agree over $shards shards"
        cat "$OUT"/quant-kernel-$t-*.txt | grep -E "panicked|differs" | head -5
        for k in $(seq 0 $((shards - 1))); do
          grep -q "test result: ok" "$OUT/quant-kernel-$t-$k.txt" || { echo "   shard $k did not pass"; status=1; }
        done
      done ;;
    steps)
      for m in llama-3.1-8b-4bit qwen3-30b-a3b-4bit; do
        dir=$(model $m)
        for kernel in 0 1; do
          echo "-- $m, MLX_SERVE_QMM_KERNEL=$kernel"
          MLX_SERVE_QMM_KERNEL=$kernel timeout 600 "$BIN_DIR/decode_step" "$dir" --rows 1,2,4,8,16 --prompt 128 --steps 64 2>&1 | tail -11 || status=1
        done
      done
      # Rows of other lengths, as the server batches them: a left-padded cache, attention with an array mask.
      echo "-- llama-3.1-8b-4bit, 8 rows of other lengths, prompt 128 and 4096"
      timeout 300 "$BIN_DIR/decode_step" "$(model llama-3.1-8b-4bit)" --rows 8 --prompt 128 --steps 64 --ragged 2>&1 | tail -2 || status=1
      timeout 300 "$BIN_DIR/decode_step" "$(model llama-3.1-8b-4bit)" --rows 8 --prompt 4096 --steps 64 2>&1 | tail -2 || status=1
      timeout 300 "$BIN_DIR/decode_step" "$(model llama-3.1-8b-4bit)" --rows 8 --prompt 4096 --steps 64 --ragged 2>&1 | tail -2 || status=1 ;;
    server)
      dir=$(model llama-3.1-8b-4bit)
      python3 bench/server_bench.py --model "$dir" --mlx-serve "$BIN_DIR/mlx-serve" --python python3 \
        --concurrency 1,8 --prompt-tokens 128 --gen-tokens 128 --rounds 1 --label "$(cat "$BIN_DIR/../commit" 2>/dev/null)" \
        --out "$OUT/server-llama-3.1-8b-4bit.json" 2>&1 | tail -40 || status=1 ;;
    dense)
      timeout 300 "$BIN_DIR/mlx_serve_lib" the_16_bit_decode_attention_kernel --test-threads 1 2>&1 | grep -E "^test |test result|differs" || status=1
      dir=$(model llama-3.1-8b-4bit)
      for on in 0 1 0 1; do
        echo "-- MLX_SERVE_DENSE_KERNEL=$on"
        MLX_SERVE_DENSE_KERNEL=$on timeout 300 "$BIN_DIR/decode_step" "$dir" --rows 8 --prompt 128 --steps 64 --engine-loop --ragged 2>&1 | tail -2 || status=1
        MLX_SERVE_DENSE_KERNEL=$on timeout 300 "$BIN_DIR/decode_step" "$dir" --rows 4 --prompt 8192 --steps 32 --engine-loop --ragged 2>&1 | tail -2 || status=1
      done
      python3 bench/server_bench.py --model "$dir" --mlx-serve "$BIN_DIR/mlx-serve" --python python3 \
        --concurrency 1,8 --prompt-tokens 128 --gen-tokens 128 --rounds 1 --label "$(cat "$BIN_DIR/../commit" 2>/dev/null) dense kernel" \
        --out "$OUT/server-llama-3.1-8b-4bit-dense.json" 2>&1 | tail -40 || status=1 ;;
    parity)
      export MLX_SERVE_PYTHON=${MLX_SERVE_PYTHON:-python3} MLX_SERVE_BIN=$PWD/$BIN_DIR/mlx-serve
      float32="qwen3_moe_fp32_greedy_matches_mlx_lm mixtral_fp32_greedy_matches_mlx_lm olmoe_fp32_greedy_matches_mlx_lm
        qwen2_moe_with_shared_expert_fp32_matches_mlx_lm gpt_oss_fp32_greedy_matches_mlx_lm"
      # llama_bf16's two tests share a fixture, built under one process's lock: first and last.
      bf16="llama_bf16_greedy_matches_mlx_lm qwen3_bf16_greedy_matches_mlx_lm qwen2_bf16_greedy_matches_mlx_lm
        phi3_bf16_with_longrope_matches_mlx_lm llama_bf16_through_the_batching_server_matches_mlx_lm"
      parity() {  # parity TAG TEST...: each test alone, three at a time; prints the failures
        local tag=$1; shift
        printf '%s\n' "$@" | xargs -P 3 -I{} sh -c "timeout 240 $BIN_DIR/parity --exact {} --test-threads 1 >$OUT/parity-$tag-{}.txt 2>&1"
        for t in "$@"; do
          grep -q "test result: ok. 1 passed" "$OUT/parity-$tag-$t.txt" && echo "$tag ok     $t" && continue
          echo "$tag FAILED $t"; grep -A1 -E "panicked" "$OUT/parity-$tag-$t.txt" | head -2
          grep -E "^ *(left|right):" "$OUT/parity-$tag-$t.txt" | head -2
          echo "$t" >>"$OUT/parity-$tag-failed"
        done
      }
      # Every kernel and stacked projection of ours off.
      all_off() {
        MLX_SERVE_DENSE_KERNEL=0 MLX_SERVE_QMM_KERNEL=0 MLX_SERVE_QMM_FUSED=0 MLX_SERVE_STACK_PROJECTIONS=0 \
          MLX_SERVE_GDN_KERNEL=0 MLX_SERVE_TURBO_KERNELS=0 MLX_SERVE_AFFINE_KERNEL=0 MLX_SERVE_ROUTER_KERNEL=0 \
          MLX_SERVE_PROMPT_MATMUL=0 parity off "$@"
      }
      failed_of() { for t in "$@"; do grep -qx "$t" "$OUT/parity-on-failed" 2>/dev/null && echo "$t"; done; }
      rm -f "$OUT"/parity-*-failed
      MLX_ENABLE_TF32=0 parity on $float32
      parity on $bf16
      if [ -s "$OUT/parity-on-failed" ]; then
        status=1
        failed=$(failed_of $float32); [ -n "$failed" ] && MLX_ENABLE_TF32=0 all_off $failed
        failed=$(failed_of $bf16); [ -n "$failed" ] && all_off $failed
      fi ;;
    router)
      timeout 300 "$BIN_DIR/mlx_serve_lib" router_kernel --test-threads 1 --nocapture 2>&1 | grep -E "^test |test result|routings agree|panicked|disagrees" || status=1
      dir=$(model qwen3-30b-a3b-4bit)
      for on in 0 1 0 1; do
        echo "-- MLX_SERVE_ROUTER_KERNEL=$on"
        MLX_SERVE_ROUTER_KERNEL=$on timeout 300 "$BIN_DIR/decode_step" "$dir" --rows 1,8 --prompt 128 --steps 64 2>&1 | tail -6 || status=1
      done ;;
    *) echo "unknown stage $stage"; status=1 ;;
  esac
done
exit $status
