#!/usr/bin/env bash
# Packs what the GPU machine needs to run this checkout's release binary and test
# executables against MLX's CUDA build: .device/bin/ gets mlx-serve, every test
# executable of `cargo test --release` and libmlxc.so (found through $ORIGIN).
# With --bench it gets instead the executables the GPU scripts of bench/ name
# (bench/quant_kernel_gpu.sh, bench/turbo_profile.sh): mlx-serve, libmlxc.so, the
# library's unit tests as mlx_serve_lib, the quant_kernel, prompt_matmul, parity and
# expert_streaming tests, mlx-rs-safe's
# managed_memory test (the CUDA driver calls of streamed experts' staging), and the kv_attend,
# decode_step and quant_matmul benches (~19 MB packed; every test executable is
# several times that).
# MLX's CUDA bundle comes from ../shared/tools/cuda-bundle.sh (same .device/).
#
# On the GPU machine (device tool, carry [".device"]), from the repository root:
#   .device/run-tests.sh                  (every packed test executable)
#   source .device/prelude.sh; $B/...     (a command's own runs: MLX's CUDA environment, the
#                                          executables unpacked into $B, on the loader's path)
set -euo pipefail
cd "$(dirname "$0")/.."
out=.device
mkdir -p "$out/bin"
rm -f "$out"/bin/*
cargo build --release
# The executables cargo builds for `$@`, one a line.
executables() {
  cargo "$@" --message-format=json 2>/dev/null |
    python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["executable"])'
}
if [ "${1:-}" = --bench ]; then
  cp "$(executables test -p mlx-serve --release --no-run --lib)" "$out/bin/mlx_serve_lib"
  for test in quant_kernel prompt_matmul parity expert_streaming; do
    cp "$(executables test -p mlx-serve --release --no-run --test $test)" "$out/bin/$test"
  done
  cp "$(executables test -p mlx-rs-safe --release --no-run --test managed_memory)" "$out/bin/managed_memory"
  for bench in kv_attend decode_step quant_matmul; do
    cp "$(executables bench -p mlx-serve --no-run --bench $bench)" "$out/bin/$bench"
  done
  printf '%s\n' mlx_serve_lib quant_kernel prompt_matmul parity expert_streaming managed_memory >"$out/tests.txt"
else
  executables test --release --no-run >"$out/tests.txt"
  while read -r exe; do cp "$exe" "$out/bin/"; done <"$out/tests.txt"
fi
cp target/release/mlx-serve vendor/mlxc/lib/libmlxc.so "$out/bin/"
pwd >"$out/built-at"
# The benchmark suite records which commit the binary was built from (no git there).
echo "$(git rev-parse --short HEAD)$(git status --porcelain --untracked-files=no | grep -q . && echo -dirty)" >"$out/commit"
# Debug line tables are not needed there; compressed, the binaries fit beside MLX's
# CUDA bundle in the 64 MiB a call carries (the GPU machine unpacks bin.tar.xz first).
strip --strip-debug "$out"/bin/*
tar -C "$out" -cJf "$out/bin.tar.xz" bin && rm -rf "$out/bin"
cat >"$out/prelude.sh" <<'PRELUDE'
# Sourced from the repository root on the GPU machine before anything runs there:
# MLX's CUDA environment (cuda-env.sh), the packed executables unpacked into $B and
# put on the loader's path (libmlxc.so is among them), and the repository linked at
# the path it had where they were built (the tests find their fixtures there).
source .device/cuda-env.sh
[ -d .device/bin ] || tar -C .device -xJf .device/bin.tar.xz
built_at=$(cat .device/built-at)
[ -e "$built_at" ] || { mkdir -p "$(dirname "$built_at")" && ln -s "$PWD" "$built_at"; }
B=$PWD/.device/bin
export LD_LIBRARY_PATH=$B:${LD_LIBRARY_PATH:-} PYTHONUNBUFFERED=1
PRELUDE
cat >"$out/run-tests.sh" <<'RUN'
#!/usr/bin/env bash
# Runs every packed test executable (those .device/tests.txt names); prints a
# summary line per executable.
cd "$(dirname "$0")/.."
source .device/prelude.sh
export MLX_SERVE_PYTHON=${MLX_SERVE_PYTHON:-python3}
export MLX_SERVE_BIN=$PWD/.device/bin/mlx-serve
fail=0
while read -r exe; do
  t=.device/bin/$(basename "$exe")
  echo "== $t"
  "$t" "$@" || fail=1
done <.device/tests.txt
exit $fail
RUN
chmod +x "$out/run-tests.sh"
du -sh "$out"
