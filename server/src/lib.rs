//! mlx-serve: models, engine and OpenAI-compatible HTTP API over MLX.
#![forbid(unsafe_code)]

pub mod api;
pub mod app;
pub mod cli;
pub mod engine;
pub mod error;
pub mod experts;
pub mod generate_cmd;
pub mod gguf;
pub mod http_server;
pub mod kernel_check;
pub mod hub;
pub mod kv;
pub mod memory_plan;
pub mod metrics;
pub mod models;
pub mod pacer;
pub mod quality;
pub mod structured;
pub mod system_info;
pub mod tokenizer;
