//! mlx-serve: models, engine and OpenAI-compatible HTTP API over MLX.
#![forbid(unsafe_code)]
