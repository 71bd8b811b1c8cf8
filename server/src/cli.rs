//! Command-line interface (clap). Each subcommand maps to a typed config.

use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "mlx-serve", version, about = "OpenAI-compatible LLM inference server on MLX")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print what MLX sees on this machine (version, backend, device, memory) as JSON.
    Info,
    /// Generate text from a prompt, as mlx_lm.generate does.
    Generate(GenerateArgs),
}

#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// A local model folder (config.json, tokenizer, safetensors) or a Hugging
    /// Face repo id, downloaded into the HF cache (HF_ENDPOINT, HF_TOKEN,
    /// HF_HUB_CACHE/HF_HOME and HF_HUB_OFFLINE apply).
    #[arg(long)]
    pub model: String,
    /// The prompt ("-" reads standard input).
    #[arg(long, default_value = "hello")]
    pub prompt: String,
    #[arg(long, default_value_t = 100)]
    pub max_tokens: usize,
    /// Sampling temperature (0 = greedy).
    #[arg(long, default_value_t = 0.0)]
    pub temp: f32,
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    #[arg(long, default_value_t = 0)]
    pub top_k: i32,
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f32,
    #[arg(long, default_value_t = 1.0)]
    pub repetition_penalty: f32,
    #[arg(long, default_value_t = 20)]
    pub repetition_context_size: usize,
    #[arg(long)]
    pub seed: Option<u64>,
    /// Prompt tokens per prefill step.
    #[arg(long, default_value_t = 512)]
    pub prefill_size: usize,
    /// Quantize an unquantized model's weights at load to this many bits (4 or 8).
    #[arg(long)]
    pub quantize: Option<i32>,
    /// Group size for --quantize.
    #[arg(long, default_value_t = 64)]
    pub quantize_group_size: i32,
    /// Quantize the KV cache to this many bits (e.g. 4 or 8).
    #[arg(long)]
    pub kv_bits: Option<i32>,
    /// Group size of the KV cache quantization.
    #[arg(long, default_value_t = 64)]
    pub kv_group_size: i32,
    /// Start quantizing the KV cache once it holds this many tokens.
    #[arg(long, default_value_t = 5000)]
    pub quantized_kv_start: i32,
    /// Use the prompt as raw text, without the chat template.
    #[arg(long)]
    pub ignore_chat_template: bool,
    /// System prompt placed before the user message in the chat template.
    #[arg(long)]
    pub system_prompt: Option<String>,
    /// Generate past end-of-sequence tokens, up to max_tokens (benchmarks).
    #[arg(long)]
    pub ignore_eos: bool,
    /// Run the generation once untimed first (GPU kernels compile on first use
    /// of each shape), as benchmarks do for both engines.
    #[arg(long)]
    pub warmup: bool,
    /// Print one JSON object (ids, text, timings, memory) instead of streaming text.
    #[arg(long)]
    pub json: bool,
}
