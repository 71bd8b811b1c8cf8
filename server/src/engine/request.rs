//! What travels between the HTTP side and the engine thread: a validated,
//! tokenized request in; token events out, over the request's own channel.

use std::time::Instant;

use tokio::sync::mpsc::UnboundedSender;

use super::sampler::SamplingParams;
use super::stop::FinishReason;
use crate::structured::Guide;

/// What to generate: a validated, tokenized prompt and how to continue it.
/// (Serialized for the other ranks of a distributed group, its guide apart:
/// see `lockstep`.)
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Generation {
    pub prompt: Vec<u32>,
    pub sampling: SamplingParams,
    pub max_tokens: usize,
    /// Strings that end the generation (not included in the output).
    pub stop: Vec<String>,
    /// Return each token's log-probability and this many alternatives.
    pub logprobs: Option<usize>,
    /// Keep generating past end-of-sequence tokens (benchmarks).
    pub ignore_eos: bool,
    /// Leave special tokens in the text: a tool-call format whose markers are
    /// special tokens (Mistral's `[TOOL_CALLS]`) must see them.
    pub keep_special_tokens: bool,
    /// The grammar the output must follow (structured output, forced tool calls).
    #[serde(skip)]
    pub guide: Option<Guide>,
    /// Send an [`Event::Progress`] after each prefill chunk (llama-server's
    /// `return_progress`: a long prompt shows it is being read).
    pub progress: bool,
    /// Prompt positions whose KV the prompt cache keeps as the prefill passes
    /// them (the end of a chat's system prompt): for models whose caches
    /// cannot be cut back to an earlier position (sliding windows), the only
    /// way a later request sharing just that prefix can reuse it.
    #[serde(default)]
    pub checkpoints: Vec<usize>,
}

/// A generation on its way to the engine.
pub struct Request {
    pub params: Generation,
    pub arrived: Instant,
    /// Where the engine sends this request's events. When the receiver is
    /// dropped (the client went away), the engine stops the sequence.
    pub events: UnboundedSender<Event>,
}

/// A token's log-probability, with the most likely alternatives at its step.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub token: u32,
    pub logprob: f32,
    /// (token, logprob), most likely first.
    pub top: Vec<(u32, f32)>,
}

/// Token counts of a finished request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens whose KV came from the prompt cache.
    pub cached_tokens: usize,
}

/// How far a request's prompt has been read (prefilled) into the KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PromptProgress {
    /// Prompt tokens.
    pub total: usize,
    /// Of them, taken from the prompt cache.
    pub cached: usize,
    /// Of them, in the KV cache now (cached ones included): `total` once the
    /// prompt is read.
    pub processed: usize,
    /// Milliseconds since the prefill began.
    pub elapsed_ms: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Prefill progress, before the first token (only when the request asks).
    Progress(PromptProgress),
    /// One generated token and the text it completes (possibly empty: the
    /// detokenizer holds back incomplete characters, the stop matcher a
    /// possible stop string's start).
    Token { token: u32, text: String, logprob: Option<TokenLogprob> },
    /// The end: the remaining text, why it ended, and the stop string that
    /// ended it if one did (Anthropic's `stop_sequence`).
    Done { text: String, finish_reason: FinishReason, stop_sequence: Option<String>, usage: Usage },
    /// The request failed inside the engine; the server keeps serving.
    Error(String),
}
