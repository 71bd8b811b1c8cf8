//! The memory plan: from the memory this machine gives the server, the
//! model's weight bytes and its KV bytes per token, what fits — the GPU
//! layers, the expert cache (`--stream-experts`), the KV format, the KV pool
//! the running sequences share, the context, the prompt cache. Flags a person
//! sets win; the plan fills in the rest and never exceeds the budget.
//!
//! Pure arithmetic over [`Machine`] and [`ModelShape`]: tested with simulated
//! memory sizes; `machine` reads the real ones.

pub mod machine;

use serde::Serialize;

pub use machine::{Backend, Machine, PrefillAttention};

use mlx_rs_safe::distributed::Group;
use mlx_rs_safe::Array;

use crate::error::{Error, Result};
use crate::experts::CacheBudget;
use crate::kv::turbo::blocked;
use crate::kv::{bytes_per_token, KvCompression, KvKind};
use crate::models::{KvLayout, ModelShape};

/// Memory kept free of plans for MLX's working buffers (a prefill chunk's
/// activations, logits): a twentieth of the budget, at least 256 MiB; and
/// for the GPU runtime's own (`runtime`).
fn reserve(budget: u64, runtime: u64) -> u64 {
    (budget / 20).max(256 << 20) + runtime
}

/// Of the reserve, what the process holds outside MLX's allocator (code,
/// tokenizer, HTTP buffers: ~20 MiB measured) with room to spare: MLX's own
/// limit is the budget less this, so its buffer cache never crowds it out.
const RUNTIME_BYTES: u64 = 128 << 20;

/// Tokens of KV the GPU must hold beside its layers' weights before layers
/// move to the CPU: a working context.
const MIN_KV_TOKENS: u64 = 4096;
/// The prompt cache takes at most a quarter of the KV pool unless told.
const PROMPT_CACHE_SHARE: u64 = 4;
const PROMPT_CACHE_DEFAULT: u64 = 2 << 30;
/// Prompt tokens a TurboQuant sequence holds at 16 bits before it is
/// compressed (its prefill threshold) when the plan picks TurboQuant.
const PLANNED_TURBO_THRESHOLD: i32 = 4096;
/// Unfused attention's scores, as MLX holds them (the scores and the softmax
/// over them, partly in place): 1.07-1.09x one [heads, chunk, context] array
/// measured on the CPU (bench/kv_working_set.py), with room to spare.
const SCORES_COPIES: f64 = 1.25;
/// A history decoded for attention (TurboQuant's prefill chunks): the keys
/// and values decoded, then joined with the sinks and the chunk's own; 1.85x
/// one decoded copy measured on the CPU, with room to spare. A quantized
/// cache dequantized for attention (CUDA) is counted alike.
const DECODED_HISTORY_COPIES: f64 = 2.0;

/// What the flags fix; None: the plan chooses.
#[derive(Debug, Clone, Default)]
pub struct Wants {
    /// `--memory-budget`: bytes, or a share of what the machine has.
    pub budget: Option<CacheBudget>,
    pub gpu_layers: Option<usize>,
    /// `--stream-experts`, with `--expert-cache-bytes` when given.
    pub stream_experts: bool,
    pub expert_cache: Option<CacheBudget>,
    /// `--kv-bits` / `--turbo-kv`.
    pub kv_compression: Option<KvCompression>,
    /// `--context-length`.
    pub context: Option<usize>,
    /// `--prompt-cache-bytes`.
    pub prompt_cache_bytes: Option<u64>,
    /// `--max-concurrency`: sequences that may hold a recurrent state at once
    /// (0: one).
    pub max_sequences: usize,
    /// `--prefill-size`: prompt tokens a prefill chunk attends at once (0: one).
    pub prefill_size: usize,
}

/// The plan: printed at start-up, shown by /health and `--plan`.
#[derive(Debug, Clone, Serialize)]
pub struct MemoryPlan {
    /// Bytes the plan may use on the device that runs the model.
    pub budget_bytes: u64,
    /// Where the budget came from.
    pub budget_source: String,
    /// Kept for MLX's working buffers and the GPU runtime.
    pub reserve_bytes: u64,
    /// Weights held on the device (the first `gpu_layers` layers and the
    /// embedding; all of them where the CPU runs the model).
    pub device_weight_bytes: u64,
    /// Weights of the layers on the CPU, in host memory.
    pub host_weight_bytes: u64,
    /// Decoder layers on the GPU, of `layers` (None: no GPU, or all of them).
    pub gpu_layers: Option<usize>,
    pub layers: usize,
    /// The expert slot pools' bytes (`--stream-experts`).
    pub expert_cache_bytes: Option<u64>,
    /// fp16, kv8 (affine 8-bit), turbo-balanced or turbo-compact.
    pub kv_format: String,
    pub kv_bytes_per_token: f64,
    /// Bits of an uncompressed KV element (the model's activations: 32 for
    /// float32 models, else 16).
    pub kv_element_bits: u32,
    /// Tokens of KV the running sequences share (each reserves its prompt
    /// plus its max_tokens).
    pub kv_tokens: u64,
    /// Longest sequence (prompt + generated tokens).
    pub context: u64,
    /// What one layer's attention holds beside the cache while it attends to
    /// a whole context: grows with the context where the attention is
    /// unfused or reads a decoded history; fixed where it reads the history
    /// a block at a time.
    pub attention_working_bytes: u64,
    /// Of that, bytes per token of the context (the rest is fixed).
    pub attention_working_bytes_per_token: f64,
    pub prompt_cache_bytes: u64,
    /// The recurrent states of the running sequences (linear-attention
    /// layers: a fixed size per sequence, whatever its length).
    pub recurrent_state_bytes: u64,
    /// The settings the flags fixed.
    pub from_flags: Vec<&'static str>,
    /// Of the reserve, the GPU runtime's.
    pub runtime_bytes: u64,
    #[serde(skip)]
    pub kv_compression: Option<KvCompression>,
    /// The KV formats the plan tried, least compressed first (the one
    /// chosen among them), for ranks agreeing on one ([`Self::agreed`]).
    #[serde(skip)]
    kv_ladder: Vec<KvChoice>,
}

/// A KV format the plan can choose, and what a token costs in it.
#[derive(Debug, Clone)]
struct KvChoice {
    name: String,
    compression: Option<KvCompression>,
    bytes_per_token: f64,
}

impl MemoryPlan {
    /// The limit for MLX's allocator (its live buffers and its cache): the
    /// budget less what the runtime holds outside it (both within the reserve).
    pub fn mlx_memory_limit(&self) -> u64 {
        self.budget_bytes - self.runtime_bytes - RUNTIME_BYTES
    }

    /// Of the working buffers (the reserve less the runtime's), the share a
    /// prompt's products may keep waiting on the device on CUDA at once
    /// (dequantized weights, MoE layers' rows, unfused attention's scores:
    /// `pacer`): a quarter, beside the chunk's activations.
    pub fn prompt_products_bytes(&self) -> u64 {
        self.reserve_bytes.saturating_sub(self.runtime_bytes + RUNTIME_BYTES) / 4
    }

    /// Everything the plan lets the server hold on the device at once.
    pub fn device_total(&self) -> u64 {
        let kv_on_device = self.kv_bytes_per_token * self.kv_tokens as f64 * self.device_share();
        let states_on_device = self.recurrent_state_bytes as f64 * self.device_share();
        self.device_weight_bytes
            + self.expert_cache_bytes.unwrap_or(0)
            + kv_on_device.ceil() as u64
            + states_on_device.ceil() as u64
            + self.prompt_cache_bytes
            + self.attention_working_bytes
            + self.reserve_bytes
    }

    /// The share of each token's KV held on the device (its layers' share).
    fn device_share(&self) -> f64 {
        match self.gpu_layers {
            Some(n) if self.layers > 0 => n as f64 / self.layers as f64,
            _ => 1.0,
        }
    }

    /// One line per choice, for the log and `--plan`.
    pub fn describe(&self) -> String {
        let gib = |b: u64| format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64);
        let mut lines = vec![
            format!("memory plan: budget {} ({}), {} kept for working buffers", gib(self.budget_bytes), self.budget_source, gib(self.reserve_bytes)),
            format!("  weights: {} on the device, {} in host memory", gib(self.device_weight_bytes), gib(self.host_weight_bytes)),
        ];
        if let Some(n) = self.gpu_layers {
            lines.push(format!("  GPU layers: {n} of {} (the rest and the output head on the CPU)", self.layers));
        }
        if let Some(b) = self.expert_cache_bytes {
            lines.push(format!("  expert cache: {}", gib(b)));
        }
        lines.push(format!(
            "  KV cache: {} at {:.0} bytes per token; {} tokens shared by the running sequences; context {}",
            self.kv_format, self.kv_bytes_per_token, self.kv_tokens, self.context
        ));
        if self.attention_working_bytes > 0 {
            lines.push(format!("  attention's working memory at the whole context: {}", gib(self.attention_working_bytes)));
        }
        if self.recurrent_state_bytes > 0 {
            lines.push(format!("  recurrent states: {} for the running sequences", gib(self.recurrent_state_bytes)));
        }
        lines.push(format!("  prompt cache: {}", gib(self.prompt_cache_bytes)));
        lines.push(format!(
            "  planned use: {} of {}{}",
            gib(self.device_total()),
            gib(self.budget_bytes),
            if self.from_flags.is_empty() { String::new() } else { format!("; set by flags: {}", self.from_flags.join(", ")) }
        ));
        lines.join("\n")
    }
}

/// A history block's scores and decoded keys and values as MLX holds them
/// (the scores and their exponentials, partly in place), with room to spare:
/// on the CPU, llama-tiny `balanced` held 23 MB of working memory at 8K and
/// at 16K tokens with 8.4 MB blocks, prefill activations included.
const BLOCK_COPIES: f64 = 2.0;

/// What one layer's attention holds beside the cache while it attends to
/// the context.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Working {
    /// Bytes per token of the context.
    per_token: f64,
    /// Bytes whatever the context's length.
    fixed: f64,
}

impl Working {
    fn at(&self, context: f64) -> f64 {
        self.per_token * context + self.fixed
    }
}

/// Attention's working memory in `compression`, as `attention` attends a
/// prefill chunk of `chunk` tokens or a decode step of `sequences` rows: the
/// scores where it is not one fused kernel (not `fused`, and a quantized
/// cache attended by quantized matmuls), and the history decoded for it
/// (TurboQuant's; a quantized cache where the device has no quantized
/// matmuls). Both grow with the context, except TurboQuant's where the
/// history is attended a block at a time (`blocked_history`): its prompt's
/// first `prefill_threshold` tokens held at 16 bits attend as the 16-bit
/// cache does, and past them one block's float32 scores and decoded keys and
/// values are held. Layers that hold a bounded window or a
/// recurrent state add nothing that grows. A fused device that attends
/// chunks over short histories through composed ops (`unfused_keys`: CUDA)
/// holds those chunks' scores over at most that many keys of `context`.
fn attention_working(attention: PrefillAttention, layout: &KvLayout, element_bits: u32, compression: Option<&KvCompression>, chunk: usize, sequences: usize, context: u64) -> Working {
    if !layout.kinds.iter().any(|k| matches!(k, KvKind::Dense)) {
        return Working::default();
    }
    let element = element_bits as f64 / 8.0;
    let chunk = chunk.max(1);
    let scores_per_token = SCORES_COPIES * layout.query_heads as f64 * chunk as f64 * element;
    let decoded_per_token = |bytes: f64| DECODED_HISTORY_COPIES * 2.0 * layout.kv_heads as f64 * layout.head_dim as f64 * bytes;
    let (by_matmuls, decoded) = match compression {
        Some(KvCompression::Turbo { prefill_threshold, .. }) if attention.blocked_history => {
            // A prompt's chunk, or a decode step of every running sequence.
            let shape = |rows: usize, queries: usize| blocked::Shape {
                rows: rows.min(i32::MAX as usize) as i32,
                query_heads: layout.query_heads,
                kv_heads: layout.kv_heads,
                head_dim: layout.head_dim,
                queries: queries.min(i32::MAX as usize) as i32,
            };
            let widest = shape(1, chunk).block_bytes().max(shape(sequences, 1).block_bytes());
            let block = BLOCK_COPIES * widest as f64;
            let unfused_prompt = if attention.fused { 0.0 } else { scores_per_token * (*prefill_threshold).max(0) as f64 };
            return Working { per_token: 0.0, fixed: unfused_prompt.max(block) };
        }
        Some(KvCompression::Affine { .. }) => (attention.quantized_matmuls, !attention.quantized_matmuls),
        Some(KvCompression::Turbo { .. }) => (false, true),
        None => (false, false),
    };
    let scores = if !attention.fused || by_matmuls { scores_per_token } else { 0.0 };
    let history = if decoded { decoded_per_token(element) } else { 0.0 };
    // A fused device's chunks of several tokens over short histories (up to
    // `unfused_keys`, within the context) hold the scores of those keys.
    let short_keys = attention.unfused_keys.max(0).min(context.min(i32::MAX as u64) as i32);
    let short_history_scores = if scores == 0.0 && chunk > 1 { scores_per_token * short_keys as f64 } else { 0.0 };
    Working { per_token: scores + history, fixed: short_history_scores }
}

/// The KV formats the plan tries, least compressed first. The 8-bit affine
/// cache only where the device attends it by quantized matmuls: on CUDA it
/// is dequantized at every step (a third of the 16-bit cache's decode speed
/// at 32K tokens on an H100), and TurboQuant's `balanced`, smaller still, is
/// read by kernels at the 16-bit cache's speed.
fn kv_candidates(head_dim: i32, sinks: bool, fixed: Option<&str>, quantized_matmuls: bool) -> Vec<(&'static str, Option<KvCompression>)> {
    let mut out = vec![("fp16", None)];
    if fixed.is_some() {
        return out;
    }
    let group = if head_dim % 64 == 0 { 64 } else { 32 };
    if head_dim % group == 0 && quantized_matmuls {
        out.push(("kv8", KvCompression::affine(8, group, 0).ok()));
    }
    for preset in ["balanced", "compact"] {
        if let Ok(c) = KvCompression::turbo(preset, PLANNED_TURBO_THRESHOLD).and_then(|c| c.for_model(head_dim, sinks, None)) {
            out.push(if preset == "balanced" { ("turbo-balanced", Some(c)) } else { ("turbo-compact", Some(c)) });
        }
    }
    out
}

/// The name of an explicit compression, as the plan reports it.
fn kv_name(c: &KvCompression) -> String {
    match (c.turbo_preset(), c.affine_bits()) {
        (Some(p), _) => format!("turbo-{}", p.name()),
        (None, Some(bits)) => format!("kv{bits}"),
        _ => "fp16".into(),
    }
}

/// Plans `shape` on `machine` as `wants` asks; an error says what does not fit.
pub fn plan(machine: &Machine, shape: &ModelShape, model_context: Option<usize>, wants: &Wants) -> Result<MemoryPlan> {
    if wants.context == Some(0) {
        return Err(Error::Config("--context-length must be at least 1".into()));
    }
    let mut from_flags = Vec::new();
    let (budget, budget_source) = match wants.budget {
        Some(b) => {
            from_flags.push("--memory-budget");
            let bytes = match b {
                CacheBudget::Bytes(n) => n,
                CacheBudget::Share(s) => (machine.device_bytes as f64 * s) as u64,
            };
            (bytes, format!("--memory-budget, of {:.2} GiB of {}", machine.device_bytes as f64 / (1u64 << 30) as f64, machine.device_source))
        }
        None => (machine.device_bytes, machine.device_source.clone()),
    };
    let reserve = reserve(budget, machine.runtime_bytes);
    let w = &shape.weights;
    let layout = &shape.kv_layout;
    let layers = w.layers.len().max(layout.kinds.len());
    // A float32 model's uncompressed cache holds 32-bit values.
    let element_bits = w.activation_bits;
    let fp16_bpt = bytes_per_token(None, &layout.kinds, layout.kv_heads, layout.head_dim, element_bits);
    let gib = |b: u64| format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64);
    let too_small = |what: String| {
        Error::Config(format!(
            "the model does not fit the memory plan's budget of {} ({budget_source}): {what}; give more (--memory-budget), or use --gpu-layers, --stream-experts or a quantized model",
            gib(budget)
        ))
    };

    // Which layers the GPU holds: where the machine has a GPU with memory of its own.
    let resident = |range: std::ops::Range<usize>| w.resident(range, wants.stream_experts);
    let min_kv = |share: f64| (fp16_bpt * MIN_KV_TOKENS as f64 * share) as u64;
    let gpu_layers = match (wants.gpu_layers, machine.host_bytes) {
        (Some(n), _) => {
            from_flags.push("--gpu-layers");
            // As many as the model has, or more: all of them.
            (n < layers).then_some(n)
        }
        (None, Some(_)) => {
            let fits = |n: usize| w.other + resident(0..n) + reserve + min_kv(n as f64 / layers.max(1) as f64) <= budget;
            let n = (0..=layers).rev().find(|&n| fits(n)).unwrap_or(0);
            (n < layers).then_some(n)
        }
        (None, None) => None,
    };
    let on_gpu = gpu_layers.unwrap_or(layers);
    let device_weights = w.other + resident(0..on_gpu);
    let host_weights = resident(on_gpu..layers);
    if let (Some(host), true) = (machine.host_bytes, host_weights > 0) {
        if host_weights + reserve > host {
            return Err(too_small(format!("the {} layers on the CPU need {} of host memory, {} is available", layers - on_gpu, gib(host_weights), gib(host))));
        }
    }
    if device_weights + reserve > budget {
        return Err(too_small(format!("its weights take {}", gib(device_weights))));
    }
    let mut left = budget - device_weights - reserve;

    // The expert cache: as told, else half of what the resident weights leave.
    let expert_cache_bytes = wants.stream_experts.then(|| match wants.expert_cache {
        Some(b) => {
            from_flags.push("--expert-cache-bytes");
            match b {
                CacheBudget::Bytes(n) => n,
                CacheBudget::Share(s) => (w.routed_experts() as f64 * s) as u64,
            }
        }
        None => (left / 2).min(w.routed_experts()),
    });
    left = left.saturating_sub(expert_cache_bytes.unwrap_or(0));

    // The prompt cache: as told, else a quarter of the KV memory, at most 2 GiB.
    let prompt_cache_bytes = match wants.prompt_cache_bytes {
        Some(b) => {
            from_flags.push("--prompt-cache-bytes");
            b
        }
        None => (left / PROMPT_CACHE_SHARE).min(PROMPT_CACHE_DEFAULT),
    };
    left = left.saturating_sub(prompt_cache_bytes);

    // The running sequences' recurrent states (hybrid models): fixed per sequence.
    let per_sequence: u64 = layout.kinds.iter().map(|k| if let KvKind::Recurrent { state_bytes } = k { *state_bytes as u64 } else { 0 }).sum();
    let recurrent_state_bytes = per_sequence * wants.max_sequences.max(1) as u64;
    let states_on_device = (recurrent_state_bytes as f64 * on_gpu as f64 / layers.max(1) as f64) as u64;
    if states_on_device > left {
        return Err(too_small(format!("the recurrent states of {} sequences take {}", wants.max_sequences.max(1), gib(recurrent_state_bytes))));
    }
    left -= states_on_device;

    // The KV format: as told, else the least compressed one that holds one
    // whole context; the pool is what is left (on the device for the GPU
    // layers' share of each token, in host memory for the rest).
    let device_share = on_gpu as f64 / layers.max(1) as f64;
    let host_left = machine.host_bytes.map(|h| h.saturating_sub(host_weights + reserve + (recurrent_state_bytes - states_on_device)));
    let target = wants.context.or(model_context).unwrap_or(MIN_KV_TOKENS as usize) as u64;
    // Tokens `room` bytes hold at `per_token` bytes each beside attention's
    // working memory, `working` bytes per token of the longest sequence
    // (at most `target` tokens long; one layer attends at a time).
    let fit = |room: f64, per_token: f64, working: f64| -> f64 {
        let (room, per_token) = (room.max(0.0), per_token.max(f64::MIN_POSITIVE));
        let beside_target = (room - working * target as f64) / per_token;
        if beside_target >= target as f64 {
            beside_target
        } else {
            room / (per_token + working)
        }
    };
    // Attention's working memory per token of context, with the device's
    // attention and (layers past --gpu-layers) the CPU's.
    let attention = machine.prefill_attention(layout.head_dim, element_bits);
    let working = |c: Option<&KvCompression>| attention_working(attention, layout, element_bits, c, wants.prefill_size, wants.max_sequences.max(1), target);
    let working_on_host = |c: Option<&KvCompression>| attention_working(PrefillAttention::CPU, layout, element_bits, c, wants.prefill_size, wants.max_sequences.max(1), target);
    let pool_tokens = |bpt: f64, transient: f64, c: Option<&KvCompression>| -> u64 {
        let on_device = match on_gpu {
            0 => f64::INFINITY,
            _ => {
                let w = working(c);
                fit(left as f64 - transient * device_share - w.fixed, bpt * device_share, w.per_token)
            }
        };
        let on_host = match host_left {
            Some(h) if device_share < 1.0 => {
                let w = working_on_host(c);
                fit(h as f64 - transient * (1.0 - device_share) - w.fixed, bpt * (1.0 - device_share), w.per_token)
            }
            _ => f64::INFINITY,
        };
        on_device.min(on_host).floor() as u64
    };
    if wants.context.is_some() {
        from_flags.push("--context-length");
    }
    let candidates = match wants.kv_compression {
        Some(c) => {
            from_flags.push("--kv-bits/--turbo-kv");
            let c = c.for_model(layout.head_dim, layout.attention_sinks, layout.fixed_kv)?;
            vec![(kv_name(&c), Some(c))]
        }
        None => kv_candidates(layout.head_dim, layout.attention_sinks, layout.fixed_kv, attention.quantized_matmuls).into_iter().map(|(n, c)| (n.to_string(), c)).collect(),
    };
    let sized: Vec<(String, Option<KvCompression>, f64, u64)> = candidates
        .into_iter()
        .map(|(name, c)| {
            // An affine cache holds 16 bits until --quantized-kv-start: a
            // shorter sequence takes 16-bit bytes, so the pool is sized at those.
            let bpt = match c {
                Some(KvCompression::Affine { start, .. }) if start > 0 => fp16_bpt,
                _ => bytes_per_token(c.as_ref(), &layout.kinds, layout.kv_heads, layout.head_dim, element_bits),
            };
            // A TurboQuant prompt shorter than its threshold is held at 16 bits until
            // decoding starts, and every sequence keeps its newest tokens at 16 bits too.
            let transient = match c {
                Some(KvCompression::Turbo { prefill_threshold, .. }) => {
                    fp16_bpt * (prefill_threshold.max(0) as f64 + crate::kv::turbo::ROOM as f64 * wants.max_sequences.max(1) as f64)
                }
                _ => 0.0,
            };
            (name, c, bpt, pool_tokens(bpt, transient, c.as_ref()))
        })
        .collect();
    // None holds a whole context: the one that holds the most.
    let chosen = sized.iter().find(|(.., tokens)| *tokens >= target).or_else(|| sized.iter().max_by_key(|(.., tokens)| *tokens)).cloned();
    let Some((kv_format, kv_compression, kv_bpt, kv_tokens)) = chosen else {
        return Err(Error::Internal("the memory plan has no KV format to try"));
    };
    if kv_tokens < 2 {
        // What ate the memory may be the prompt TurboQuant holds uncompressed,
        // or attention's working memory: say which, and what moves it.
        let beside = match working(kv_compression.as_ref()).fixed {
            0.0 => String::new(),
            fixed => format!(" and {} of attention's working memory", gib(fixed as u64)),
        };
        let why = match &kv_compression {
            Some(KvCompression::Turbo { prefill_threshold, .. }) => format!(
                "no memory is left for the KV cache ({kv_bpt:.0} bytes per token) beside a prompt of {prefill_threshold} tokens held at 16 bits before TurboQuant compresses it ({}), the newest {} tokens each of {} sequences keeps at 16 bits ({}){beside}; a lower --turbo-kv-prefill-threshold, --prefill-size or --max-concurrency leaves more",
                gib((fp16_bpt * *prefill_threshold as f64) as u64),
                crate::kv::turbo::RECENT,
                wants.max_sequences.max(1),
                gib((fp16_bpt * crate::kv::turbo::ROOM as f64 * wants.max_sequences.max(1) as f64) as u64)
            ),
            _ => format!("no memory is left for the KV cache ({kv_bpt:.0} bytes per token){beside}"),
        };
        return Err(too_small(why));
    }
    let context = target.min(kv_tokens);
    // The device's (its layers attend there); the CPU's layers hold theirs in host memory.
    let device_working = match on_gpu {
        0 => Working::default(),
        _ => working(kv_compression.as_ref()),
    };
    Ok(MemoryPlan {
        budget_bytes: budget,
        budget_source,
        reserve_bytes: reserve,
        device_weight_bytes: device_weights,
        host_weight_bytes: host_weights,
        gpu_layers,
        layers,
        expert_cache_bytes,
        kv_format,
        kv_bytes_per_token: kv_bpt,
        kv_element_bits: element_bits,
        kv_tokens,
        context,
        attention_working_bytes: device_working.at(context as f64).ceil() as u64,
        attention_working_bytes_per_token: device_working.per_token,
        prompt_cache_bytes,
        recurrent_state_bytes,
        from_flags,
        runtime_bytes: machine.runtime_bytes,
        kv_compression,
        kv_ladder: sized.into_iter().map(|(name, compression, bytes_per_token, _)| KvChoice { name, compression, bytes_per_token }).collect(),
    })
}

/// The tightest of the ranks' plans, each `[KV format's place in the
/// ladder, KV tokens, context, prompt cache KiB]`: the most compressed
/// format, the fewest tokens, the shortest context, the smallest cache.
fn tightest(ranks: &[[i32; 4]]) -> Option<[i32; 4]> {
    let first = *ranks.first()?;
    Some(ranks.iter().fold(first, |t, r| [t[0].max(r[0]), t[1].min(r[1]), t[2].min(r[2]), t[3].min(r[3])]))
}

impl MemoryPlan {
    /// The plan this rank's engine runs with in `group`. Each rank plans
    /// what it holds (its layers, its share of the heads), so the ranks'
    /// plans can differ (an uneven split of layers, other machines); but
    /// their engines admit, end and keep prompts alike, turn by turn, so
    /// every rank takes the tightest of them: the most compressed KV format
    /// any rank chose (all try the same ones in the same order), the fewest
    /// KV tokens, the shortest context and the smallest prompt cache. Each
    /// rank's own plan holds that much in that format.
    pub fn agreed(self, group: &Group) -> Result<MemoryPlan> {
        let all = group.all_gather(&Array::from_slice(&self.terms(), &[1, 4])?)?.to_vec::<i32>()?;
        let ranks: Vec<[i32; 4]> = all.chunks_exact(4).map(|r| [r[0], r[1], r[2], r[3]]).collect();
        self.adopt(tightest(&ranks).ok_or(Error::Internal("a group of no ranks"))?)
    }

    /// What ranks agree on: `[KV format's place in the ladder, KV tokens,
    /// context, prompt cache KiB]` (a format the flags fixed is the ladder's
    /// only rung: place 0 on every rank).
    fn terms(&self) -> [i32; 4] {
        let clamp = |v: u64| v.min(i32::MAX as u64) as i32;
        [self.kv_place() as i32, clamp(self.kv_tokens), clamp(self.context), clamp(self.prompt_cache_bytes >> 10)]
    }

    fn kv_place(&self) -> usize {
        self.kv_ladder.iter().position(|c| c.name == self.kv_format).unwrap_or(0)
    }

    /// This plan with the group's `terms` (each at most this rank's own: the
    /// KiB and the clamp round down).
    fn adopt(mut self, [place, kv_tokens, context, prompt_cache_kib]: [i32; 4]) -> Result<MemoryPlan> {
        if place as usize != self.kv_place() {
            let choice = self.kv_ladder.get(place as usize).ok_or(Error::Internal("the ranks' KV formats differ in number"))?;
            self.kv_format = choice.name.clone();
            self.kv_compression = choice.compression;
            self.kv_bytes_per_token = choice.bytes_per_token;
        }
        self.kv_tokens = kv_tokens as u64;
        self.context = context as u64;
        self.prompt_cache_bytes = (prompt_cache_kib as u64) << 10;
        Ok(self)
    }
}

#[cfg(test)]
mod tests;
