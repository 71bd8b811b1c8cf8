//! `POST /v1/completions`: a raw prompt (text or token ids), the answer as one
//! `text_completion` object or as SSE chunks; `echo` and legacy `logprobs`.

use std::sync::Arc;

use actix_web::{web, HttpResponse};
use serde::Deserialize;
use serde_json::{json, Value};

use super::error::ApiError;
use super::generation::{self, error_chunk, progress_json, token_text, usage_json, with_cut_error, ChunkWriter};
use super::params::{fields, read_request};
use super::prompt_limit::PromptLimit;
use super::shutdown::CUT_FINISH_REASON;
use super::AppState;
use crate::engine::{Event, TokenLogprob};
use crate::tokenizer::Tokenizer;

/// `prompt`: text, token ids, or a one-element list of either.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum PromptField {
    Text(String),
    Tokens(Vec<i64>),
    Texts(Vec<String>),
    TokenLists(Vec<Vec<i64>>),
}

#[derive(Debug, Deserialize)]
struct CompletionRequest {
    prompt: PromptField,
    #[serde(default)]
    echo: bool,
    logprobs: Option<LogprobsField>,
    top_logprobs: Option<i64>,
}

/// `logprobs`: OpenAI's legacy count of alternatives, or mlx_lm.server's
/// flag with the count in `top_logprobs` (-1 or absent: none).
#[derive(Debug, Deserialize)]
#[serde(untagged, expecting = "a number of alternatives (0 to 20), or true / false with the number in top_logprobs")]
enum LogprobsField {
    Count(i64),
    Flag(bool),
}

/// The prompt's token ids (text is encoded with the tokenizer's special
/// tokens, as mlx_lm.server does) and its text, for `echo`. A prompt that
/// cannot fit the context is refused before it is encoded or decoded.
fn prompt_tokens(prompt: &PromptField, tokenizer: &Tokenizer, vocab_size: usize, limit: PromptLimit) -> Result<(Vec<u32>, String), ApiError> {
    let ids = |ids: &[i64]| -> Result<(Vec<u32>, String), ApiError> {
        limit.check_tokens(ids.len(), "prompt")?;
        let ids = ids
            .iter()
            .map(|&t| {
                u32::try_from(t)
                    .ok()
                    .filter(|&t| (t as usize) < vocab_size)
                    .ok_or_else(|| ApiError::bad_param("prompt", format!("token id {t} is outside the vocabulary (0..{vocab_size})")))
            })
            .collect::<Result<Vec<u32>, _>>()?;
        let text = tokenizer.decode(&ids, false)?;
        Ok((ids, text))
    };
    let text = |t: &str| -> Result<(Vec<u32>, String), ApiError> {
        limit.check_text(t.len(), "prompt")?;
        Ok((tokenizer.encode(t, true)?, t.to_string()))
    };
    let one = |n: usize| -> Result<(), ApiError> {
        if n == 1 {
            Ok(())
        } else {
            Err(ApiError::bad_param("prompt", format!("only one prompt per request is supported, got {n}")))
        }
    };
    let (tokens, text) = match prompt {
        PromptField::Text(t) => text(t)?,
        PromptField::Tokens(t) => ids(t)?,
        PromptField::Texts(v) => {
            one(v.len())?;
            text(&v[0])?
        }
        PromptField::TokenLists(v) => {
            one(v.len())?;
            ids(&v[0])?
        }
    };
    if tokens.is_empty() {
        return Err(ApiError::bad_param("prompt", "the prompt is empty"));
    }
    Ok((tokens, text))
}

impl PromptField {
    /// Bytes of prompt text (ids count as the few bytes each takes in JSON).
    fn bytes(&self) -> usize {
        match self {
            PromptField::Text(t) => t.len(),
            PromptField::Texts(v) => v.iter().map(String::len).sum(),
            PromptField::Tokens(ids) => ids.len() * 4,
            PromptField::TokenLists(v) => v.iter().map(|ids| ids.len() * 4).sum(),
        }
    }
}

/// The legacy `logprobs` object for some tokens, text offsets counted from
/// `offset` characters.
fn legacy_logprobs(tokenizer: &Tokenizer, lps: &[TokenLogprob], mut offset: usize) -> Value {
    let mut tokens = Vec::new();
    let mut token_logprobs = Vec::new();
    let mut top = Vec::new();
    let mut offsets = Vec::new();
    for lp in lps {
        let text = token_text(tokenizer, lp.token);
        offsets.push(offset);
        offset += text.chars().count();
        tokens.push(text);
        token_logprobs.push(lp.logprob);
        let alternatives: serde_json::Map<String, Value> =
            lp.top.iter().map(|&(id, l)| (token_text(tokenizer, id), json!(l))).collect();
        top.push(Value::Object(alternatives));
    }
    json!({"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets})
}

pub async fn handle(payload: web::Payload, state: &AppState) -> Result<HttpResponse, ApiError> {
    let arriving = state.engine.arriving();
    let (body, common) = read_request(payload, state).await?;
    let req: CompletionRequest = fields(&body)?;
    let (top, field) = match req.logprobs {
        None | Some(LogprobsField::Flag(false)) => (None, "logprobs"),
        Some(LogprobsField::Count(n)) => (Some(n), "logprobs"),
        Some(LogprobsField::Flag(true)) => (Some(req.top_logprobs.filter(|&n| n != -1).unwrap_or(0)), "top_logprobs"),
    };
    let top = match top {
        Some(n) if !(0..=20).contains(&n) => return Err(ApiError::bad_param(field, format!("{field} must be between 0 and 20, got {n}"))),
        n => n.map(|n| n as usize),
    };
    let (tokenizer, vocab_size, limit) = (state.tokenizer.clone(), state.vocab_size, state.prompt_limit);
    let prompt_bytes = req.prompt.bytes();
    let (prompt, prompt_text) =
        state.tokenize_pool.run(prompt_bytes, move || prompt_tokens(&req.prompt, &tokenizer, vocab_size, limit)).await?;
    let params = common.generation(state, prompt, top)?;
    let rx = generation::submit(state, params, arriving)?;
    let echo = if req.echo { prompt_text } else { String::new() };
    let (id, created) = (generation::response_id("cmpl"), generation::unix_now());
    if common.stream {
        let writer = CompletionStream {
            id,
            created,
            model: state.models.id.clone(),
            tokenizer: state.tokenizer.clone(),
            echo: Some(echo),
            chars: 0,
            include_usage: common.include_usage(),
        };
        return Ok(generation::sse_response(rx, writer, state));
    }
    let done = generation::collect(rx, state).await?;
    let logprobs = match top {
        Some(_) => legacy_logprobs(&state.tokenizer, &done.logprobs, echo.chars().count()),
        None => Value::Null,
    };
    Ok(HttpResponse::Ok().json(json!({
        "id": id,
        "object": "text_completion",
        "created": created,
        "model": state.models.id,
        "choices": [{"index": 0, "text": echo + &done.text, "logprobs": logprobs, "finish_reason": done.finish_reason.as_str()}],
        "usage": usage_json(&done.usage),
    })))
}

/// `text_completion` chunks.
struct CompletionStream {
    id: String,
    created: u64,
    model: String,
    tokenizer: Arc<Tokenizer>,
    /// The prompt text to send first (`echo`), until sent.
    echo: Option<String>,
    /// Characters sent so far (log-probability text offsets).
    chars: usize,
    include_usage: bool,
}

impl CompletionStream {
    fn chunk(&mut self, text: String, logprobs: Value, finish_reason: Value) -> Value {
        self.chars += text.chars().count();
        let mut c = json!({
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}],
        });
        if self.include_usage {
            c["usage"] = Value::Null;
        }
        c
    }
}

impl ChunkWriter for CompletionStream {
    fn start(&mut self) -> Vec<Value> {
        match self.echo.take() {
            Some(text) if !text.is_empty() => vec![self.chunk(text, Value::Null, Value::Null)],
            _ => Vec::new(),
        }
    }

    fn write(&mut self, event: Event) -> Vec<Value> {
        match event {
            Event::Token { text, logprob, .. } => {
                if text.is_empty() && logprob.is_none() {
                    return Vec::new();
                }
                let logprobs = match &logprob {
                    Some(lp) => legacy_logprobs(&self.tokenizer, std::slice::from_ref(lp), self.chars),
                    None => Value::Null,
                };
                vec![self.chunk(text, logprobs, Value::Null)]
            }
            Event::Done { text, finish_reason, usage, .. } => {
                let mut out = vec![self.chunk(text, Value::Null, json!(finish_reason.as_str()))];
                if self.include_usage {
                    out.push(json!({
                        "id": self.id,
                        "object": "text_completion",
                        "created": self.created,
                        "model": self.model,
                        "choices": [],
                        "usage": usage_json(&usage),
                    }));
                }
                out
            }
            Event::Error(message) => vec![error_chunk(&message)],
            Event::Progress(p) => {
                let mut c = self.chunk(String::new(), Value::Null, Value::Null);
                c["prompt_progress"] = progress_json(&p);
                vec![c]
            }
        }
    }

    fn cut(&mut self, message: &str) -> Vec<Value> {
        vec![with_cut_error(self.chunk(String::new(), Value::Null, json!(CUT_FINISH_REASON)), message)]
    }
}
