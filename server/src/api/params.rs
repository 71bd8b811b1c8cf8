//! Request bodies: read within the size limit, parsed into typed structs (a
//! wrong type names its field), and the sampling fields both generation
//! endpoints share, validated into what the engine takes.

use std::collections::HashMap;

use std::time::Duration;

use actix_web::http::header;
use actix_web::{mime, web, HttpRequest};
use futures_util::StreamExt;
use serde::de::DeserializeOwned;
use serde::Deserialize;

use super::error::ApiError;
use super::{AppState, SamplingDefaults};
use crate::engine::{Generation, SamplingParams};
use crate::tokenizer::Tokenizer;

/// Reads the whole body, refusing it past `limit` bytes (413) or when it has
/// not all arrived by `deadline` (408: a client trickling a body, or sending
/// an endless chunked one, must not hold a connection and its buffer forever).
async fn read_body(mut payload: web::Payload, limit: usize, timeout: Duration) -> Result<web::BytesMut, ApiError> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut body = web::BytesMut::new();
    loop {
        let chunk = match tokio::time::timeout_at(deadline, payload.next()).await {
            Ok(Some(chunk)) => chunk,
            Ok(None) => return Ok(body),
            Err(_) => return Err(ApiError::body_timeout(timeout.as_secs())),
        };
        let chunk = chunk.map_err(|e| ApiError::bad_request(format!("could not read the request body: {e}")))?;
        if body.len() + chunk.len() > limit {
            return Err(ApiError::too_large(limit));
        }
        body.extend_from_slice(&chunk);
    }
}

/// 415 unless the request says its body is JSON (`application/json`, or a
/// `+json` type). Besides telling a client what we read, this stops a web
/// page from posting to the API: browsers send such a Content-Type across
/// origins only after a CORS preflight, which the server answers only for
/// `--cors-origin` origins.
pub fn require_json(req: &HttpRequest) -> Result<(), ApiError> {
    let header = req.headers().get(header::CONTENT_TYPE).map(|v| v.to_str().unwrap_or("(not text)"));
    let is_json = header.and_then(|h| h.parse::<mime::Mime>().ok()).is_some_and(|m| {
        m.type_() == mime::APPLICATION && (m.subtype() == mime::JSON || m.suffix() == Some(mime::JSON))
    });
    if is_json {
        Ok(())
    } else {
        Err(ApiError::not_json(header))
    }
}

/// The body as a JSON object (400 when it is not one).
fn parse_object(body: &[u8]) -> Result<serde_json::Value, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad_request("the request body is empty; expected a JSON object"));
    }
    let value: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))?;
    if !value.is_object() {
        return Err(ApiError::bad_request("the request body must be a JSON object"));
    }
    Ok(value)
}

/// Reads typed fields out of the body object; a missing or wrongly typed
/// field is named in the error (`param`).
pub fn fields<T: DeserializeOwned>(body: &serde_json::Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(body).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let message = inner.to_string();
        // "missing field `messages`" names its field only in the message.
        let missing = message.strip_prefix("missing field `").and_then(|m| m.split('`').next());
        match (path.as_str(), missing) {
            (".", Some(field)) => ApiError::bad_param(field, format!("`{field}` is required")),
            (".", None) => ApiError::bad_request(format!("invalid request: {message}")),
            (_, Some(field)) => {
                let param = format!("{path}.{field}");
                ApiError::bad_param(&param, format!("`{param}` is required"))
            }
            _ => ApiError::bad_param(&path, format!("invalid value for `{path}`: {message}")),
        }
    })
}

/// The body, read within the server's size and time limits, as a JSON object.
pub async fn read_object(payload: web::Payload, state: &AppState) -> Result<serde_json::Value, ApiError> {
    parse_object(&read_body(payload, state.max_body_bytes, state.body_timeout).await?)
}

/// A generation request's body: the whole JSON object (for the endpoint's own
/// fields) and the shared fields, with the model and `n` checked.
pub async fn read_request(payload: web::Payload, state: &AppState) -> Result<(serde_json::Value, CommonParams), ApiError> {
    let body = read_object(payload, state).await?;
    let common: CommonParams = fields(&body)?;
    state.check_model(common.model.as_deref())?;
    common.check_n()?;
    Ok((body, common))
}

/// `stop`: one string or a list.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum StopField {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// Fields shared by chat and text completions.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct CommonParams {
    pub model: Option<String>,
    pub max_tokens: Option<i64>,
    pub max_completion_tokens: Option<i64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i32>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub repetition_context_size: Option<usize>,
    pub presence_penalty: Option<f32>,
    pub presence_context_size: Option<usize>,
    pub frequency_penalty: Option<f32>,
    pub frequency_context_size: Option<usize>,
    pub logit_bias: Option<HashMap<String, f32>>,
    pub seed: Option<u64>,
    /// XTC sampling (mlx_lm.server's fields).
    pub xtc_probability: Option<f32>,
    pub xtc_threshold: Option<f32>,
    pub stop: Option<StopField>,
    pub n: Option<i64>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    /// Generate past end-of-sequence tokens (benchmarks; also mlx-lm's name).
    #[serde(default)]
    pub ignore_eos: bool,
    /// Streams report the prompt's prefill progress (llama-server's name).
    #[serde(default)]
    pub return_progress: bool,
}

impl CommonParams {
    /// The sampling parameters, validated (400 naming the field otherwise).
    /// Fields the request leaves out take the server's `defaults`.
    pub fn sampling(&self, vocab_size: usize, tokenizer: &Tokenizer, defaults: &SamplingDefaults) -> Result<SamplingParams, ApiError> {
        let mut p = SamplingParams { temperature: defaults.temperature, top_p: defaults.top_p, top_k: defaults.top_k, min_p: defaults.min_p, ..Default::default() };
        if let Some(t) = self.temperature {
            if !(0.0..=2.0).contains(&t) {
                return Err(ApiError::bad_param("temperature", format!("temperature must be between 0 and 2, got {t}")));
            }
            p.temperature = t;
        }
        if let Some(v) = self.top_p {
            p.top_p = v;
        }
        if let Some(v) = self.top_k {
            p.top_k = v;
        }
        if let Some(v) = self.min_p {
            p.min_p = v;
        }
        if let Some(v) = self.repetition_penalty {
            p.repetition_penalty = v;
        }
        if let Some(v) = self.repetition_context_size {
            p.repetition_context_size = v;
        }
        if let Some(v) = self.presence_penalty {
            p.presence_penalty = v;
        }
        if let Some(v) = self.frequency_penalty {
            p.frequency_penalty = v;
        }
        if let Some(v) = self.presence_context_size {
            p.presence_context_size = v;
        }
        if let Some(v) = self.frequency_context_size {
            p.frequency_context_size = v;
        }
        p.seed = self.seed;
        if let Some(v) = self.xtc_probability {
            p.xtc_probability = v;
        }
        if let Some(v) = self.xtc_threshold {
            p.xtc_threshold = v;
        }
        if p.xtc_probability > 0.0 {
            p.xtc_special_tokens = tokenizer.xtc_special_tokens().map_err(|e| ApiError::internal(e.to_string()))?;
        }
        for (token, bias) in self.logit_bias.iter().flatten() {
            let id: u32 = token
                .parse()
                .ok()
                .filter(|&id: &u32| (id as usize) < vocab_size)
                .ok_or_else(|| ApiError::bad_param("logit_bias", format!("logit_bias key {token:?} is not a token id below {vocab_size}")))?;
            if !(-100.0..=100.0).contains(bias) {
                return Err(ApiError::bad_param("logit_bias", format!("logit_bias values must be between -100 and 100, got {bias}")));
            }
            p.logit_bias.insert(id, *bias);
        }
        p.validate()?;
        Ok(p)
    }

    pub fn stop_strings(&self) -> Result<Vec<String>, ApiError> {
        let stops = match &self.stop {
            None => Vec::new(),
            Some(StopField::One(s)) => vec![s.clone()],
            Some(StopField::Many(v)) => v.clone(),
        };
        if stops.len() > 16 {
            return Err(ApiError::bad_param("stop", format!("at most 16 stop sequences, got {}", stops.len())));
        }
        Ok(stops.into_iter().filter(|s| !s.is_empty()).collect())
    }

    /// Checks `n` (only one choice is generated).
    fn check_n(&self) -> Result<(), ApiError> {
        match self.n {
            None | Some(1) => Ok(()),
            Some(n) => Err(ApiError::bad_param("n", format!("only n=1 is supported, got {n}"))),
        }
    }

    /// Tokens to generate: the request's max_completion_tokens / max_tokens, or
    /// the server default trimmed to what fits the context. A requested
    /// amount that does not fit is an error that says both numbers.
    pub fn max_tokens(&self, default: usize, prompt_tokens: usize, context: Option<usize>) -> Result<usize, ApiError> {
        let (field, asked) = match (self.max_completion_tokens, self.max_tokens) {
            (Some(v), _) => ("max_completion_tokens", Some(v)),
            (None, Some(v)) => ("max_tokens", Some(v)),
            _ => ("max_tokens", None),
        };
        if let Some(v) = asked {
            if v < 1 {
                return Err(ApiError::bad_param(field, format!("{field} must be at least 1, got {v}")));
            }
        }
        let Some(context) = context else {
            return Ok(asked.map(|v| v as usize).unwrap_or(default));
        };
        if prompt_tokens >= context {
            return Err(ApiError::bad_param(
                "messages",
                format!("This model's maximum context length is {context} tokens; the prompt has {prompt_tokens} tokens"),
            ));
        }
        match asked {
            Some(v) if prompt_tokens + v as usize > context => Err(ApiError::bad_param(
                field,
                format!(
                    "This model's maximum context length is {context} tokens. However, you requested {} tokens ({prompt_tokens} in the prompt, {v} in the completion)",
                    prompt_tokens + v as usize
                ),
            )),
            Some(v) => Ok(v as usize),
            None => Ok(default.min(context - prompt_tokens)),
        }
    }

    /// What the engine generates for `prompt`, every field validated.
    pub fn generation(&self, state: &AppState, prompt: Vec<u32>, logprobs: Option<usize>) -> Result<Generation, ApiError> {
        Ok(Generation {
            max_tokens: self.max_tokens(state.default_max_tokens, prompt.len(), state.context_length)?,
            sampling: self.sampling(state.vocab_size, &state.tokenizer, &state.default_sampling)?,
            stop: self.stop_strings()?,
            logprobs,
            ignore_eos: self.ignore_eos,
            keep_special_tokens: false,
            guide: None,
            progress: self.stream && self.return_progress,
            checkpoints: Vec::new(),
            prompt,
        })
    }

    pub fn include_usage(&self) -> bool {
        self.stream_options.as_ref().is_some_and(|o| o.include_usage)
    }
}
