#!/usr/bin/env bash
# Packs what the GPU machine needs to run this checkout's release binary and test
# executables against MLX's CUDA build: .device/bin/ gets mlx-serve, every test
# executable of `cargo test --release` and libmlxc.so (found through $ORIGIN).
# MLX's CUDA bundle comes from ../shared/tools/cuda-bundle.sh (same .device/).
#
# On the GPU machine (device tool, carry [".device"]):
#   source .device/cuda-env.sh && .device/run-tests.sh   (unpacks .device/bin.tar.xz)
set -euo pipefail
cd "$(dirname "$0")/.."
out=.device
mkdir -p "$out/bin"
rm -f "$out"/bin/*
cargo build --release
cargo test --release --no-run --message-format=json 2>/dev/null |
  python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["executable"])' >"$out/tests.txt"
while read -r exe; do cp "$exe" "$out/bin/"; done <"$out/tests.txt"
cp target/release/mlx-serve vendor/mlxc/lib/libmlxc.so "$out/bin/"
pwd >"$out/built-at"
# The benchmark suite records which commit the binary was built from (no git there).
echo "$(git rev-parse --short HEAD)$(git status --porcelain --untracked-files=no | grep -q . && echo -dirty)" >"$out/commit"
# Debug line tables are not needed there; compressed, the binaries fit beside MLX's
# CUDA bundle in the 64 MiB a call carries (the GPU machine unpacks bin.tar.xz first).
strip --strip-debug "$out"/bin/*
tar -C "$out" -cJf "$out/bin.tar.xz" bin && rm -rf "$out/bin"
cat >"$out/run-tests.sh" <<'RUN'
#!/usr/bin/env bash
# Runs every packed test executable; prints a summary line per executable.
cd "$(dirname "$0")/.."
[ -d .device/bin ] || tar -C .device -xJf .device/bin.tar.xz
# The tests find the repository at the path it had where they were built.
built_at=$(cat .device/built-at)
[ -e "$built_at" ] || { mkdir -p "$(dirname "$built_at")" && ln -s "$PWD" "$built_at"; }
export MLX_SERVE_PYTHON=${MLX_SERVE_PYTHON:-python3}
export MLX_SERVE_BIN=$PWD/.device/bin/mlx-serve
fail=0
for t in .device/bin/*-*; do
  [ -x "$t" ] || continue
  case "$t" in *.so) continue ;; esac
  echo "== $t"
  "$t" "$@" || fail=1
done
exit $fail
RUN
chmod +x "$out/run-tests.sh"
du -sh "$out"
