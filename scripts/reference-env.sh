#!/usr/bin/env bash
# The Python reference for parity tests and benchmarks: mlx-lm and MLX at the
# versions pinned in versions.env (and the official openai and anthropic
# clients, which the server tests drive the server with; gguf, with which the GGUF tests write and
# read files; Playwright, with which the chat page's test drives Chromium), in a virtual
# environment at vendor/pyref.
# Idempotent: returns at once when the pinned versions are installed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/versions.env"
venv="$root/vendor/pyref"
stamp="$venv/.installed-mlx-lm-$MLX_LM_VERSION-mlx-$MLX_VERSION-openai-$OPENAI_VERSION-anthropic-$ANTHROPIC_VERSION-gguf-$GGUF_VERSION-playwright-$PLAYWRIGHT_VERSION"
[ -f "$stamp" ] && exit 0
rm -rf "$venv"
python3 -m venv "$venv"
if [ "$(uname -s)" = Darwin ]; then mlx="mlx==$MLX_VERSION"; else mlx="mlx[cpu]==$MLX_VERSION"; fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check "mlx-lm==$MLX_LM_VERSION" "$mlx" "openai==$OPENAI_VERSION" "anthropic==$ANTHROPIC_VERSION" "gguf==$GGUF_VERSION" "playwright==$PLAYWRIGHT_VERSION"
"$venv/bin/python" -c "import mlx.core as mx, mlx_lm; assert mx.__version__ == '$MLX_VERSION', mx.__version__"
touch "$stamp"
