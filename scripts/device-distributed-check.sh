#!/usr/bin/env bash
# Distributed serving on a CUDA machine of one GPU: one process, then 2 ranks over ring
# (tensor, pipeline), then NCCL: a group of one chosen by `any`, and 2 ranks on the one GPU
# (NCCL refuses that). Prints each answer: the ranks' must equal the single process's.
#
# Here: ../shared/tools/cuda-bundle.sh; mkdir -p .device/bin && cp target/release/mlx-serve
#   vendor/mlxc/lib/libmlxc.so .device/bin/ && strip --strip-debug .device/bin/* &&
#   tar -C .device -cJf .device/bin.tar.xz bin && rm -r .device/bin &&
#   cp -r target/tmp/parity/distributed_llama_fp32 .device/model   (built by the distributed tests)
# There (device tool, carry [".device"]): bash scripts/device-distributed-check.sh
set -u
source .device/cuda-env.sh
tar -C .device -xJf .device/bin.tar.xz
B=.device/bin/mlx-serve; M=.device/model
nvidia-smi -L
ask() { curl -s -m 200 localhost:$1/v1/completions -H 'content-type: application/json' \
  -d '{"prompt":"the model","max_tokens":24,"ignore_eos":true}' | python3 -c 'import json,sys; print(repr(json.load(sys.stdin)["choices"][0]["text"]))'; }
wait_up() { for i in $(seq 1 400); do curl -s -m 1 localhost:$1/health >/dev/null && return 0; sleep 0.5; done; echo "no answer on $1"; return 1; }
t0=$(date +%s); el() { echo "   [$(( $(date +%s) - t0 )) s]"; }
echo "== single process"; $B --model $M --port 9000 --log-level warn > /tmp/single.log 2>&1 & P=$!
wait_up 9000 && ask 9000 && ask 9000; curl -s localhost:9000/health | python3 -c 'import json,sys; h=json.load(sys.stdin); print(h["backend"], h["device"])'; kill $P; wait $P 2>/dev/null; el
run2() { # mode backend port envs...
  local mode=$1 bk=$2 port=$3; shift 3
  for r in 1 0; do
    env "$@" MLX_RANK=$r $B --model $M --port $([ $r = 0 ] && echo $port || echo 0) \
      --distributed $mode --distributed-backend $bk --log-level info > /tmp/$mode-$bk-$r.log 2>&1 &
  done
}
echo '[["127.0.0.1:9311"],["127.0.0.1:9312"]]' > /tmp/hosts.json
echo "== tensor over ring, 2 ranks on the GPU"; run2 tensor ring 9003 MLX_HOSTFILE=/tmp/hosts.json
wait_up 9003 && ask 9003 && ask 9003; curl -s localhost:9003/health | python3 -c 'import json,sys; h=json.load(sys.stdin); print(h["device"], h["distributed"])'
tail -n 2 /tmp/tensor-ring-0.log; pkill -f "distributed tensor"; sleep 2; el
echo '[["127.0.0.1:9331"],["127.0.0.1:9332"]]' > /tmp/hosts.json
echo "== pipeline over ring, 2 ranks on the GPU"; run2 pipeline ring 9004 MLX_HOSTFILE=/tmp/hosts.json
wait_up 9004 && ask 9004; tail -n 2 /tmp/pipeline-ring-0.log; pkill -f "distributed pipeline"; sleep 2; el
echo '[["127.0.0.1:9361"],["127.0.0.1:9362"]]' > /tmp/hosts.json
echo "== pipeline over ring handing on by all-gather (NCCL's way), 2 ranks on the GPU"
run2 pipeline ring 9007 MLX_HOSTFILE=/tmp/hosts.json MLX_SERVE_PIPELINE_TRANSFER=gather
wait_up 9007 && ask 9007; grep -h "hand on" /tmp/pipeline-ring-0.log; pkill -f "distributed pipeline"; sleep 2; el
echo "== any backend, NCCL environment, world size 1"
MLX_RANK=0 MLX_WORLD_SIZE=1 NCCL_HOST_IP=127.0.0.1 NCCL_PORT=9341 NCCL_DEBUG=INFO timeout 120 $B --model $M --port 9005 --distributed tensor --log-level info > /tmp/nccl1.log 2>&1 & P=$!
wait_up 9005 && ask 9005; grep -m3 -h "NCCL INFO\|rank\|distributed" /tmp/nccl1.log; kill $P; wait $P 2>/dev/null; el
echo "== nccl, 2 ranks on the one GPU"; run2 tensor nccl 9006 MLX_WORLD_SIZE=2 NCCL_HOST_IP=127.0.0.1 NCCL_PORT=9351
sleep 40; curl -s -m 60 localhost:9006/health | head -c 200; echo; tail -n 4 /tmp/tensor-nccl-0.log /tmp/tensor-nccl-1.log; pkill -f "distributed tensor"; el
echo done
