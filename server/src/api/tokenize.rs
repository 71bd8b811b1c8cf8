//! `POST /tokenize` and `POST /detokenize`: the model's tokenizer over HTTP,
//! in the shapes both vLLM and llama.cpp clients send. A prompt is text
//! (`prompt`, or llama.cpp's `content`) or chat `messages` rendered through
//! the chat template (with `tools`, `chat_template_kwargs`, and
//! `add_generation_prompt`, default true); the answer has the ids
//! (`tokens`), their `count` and the model's `max_model_len`, and with
//! `with_pieces` each id's text.

use actix_web::{web, HttpResponse};
use serde::Deserialize;
use serde_json::{json, Value};

use super::error::ApiError;
use super::messages::{template_messages, ChatMessage};
use super::params::{fields, read_object};
use super::AppState;
use crate::tokenizer::ChatRender;

#[derive(Debug, Deserialize)]
struct TokenizeRequest {
    model: Option<String>,
    prompt: Option<String>,
    content: Option<String>,
    messages: Option<Vec<ChatMessage>>,
    tools: Option<Vec<Value>>,
    /// vLLM's name; llama.cpp says `add_special`. Default: true for text, false
    /// for messages (the template writes the special tokens itself).
    add_special_tokens: Option<bool>,
    add_special: Option<bool>,
    add_generation_prompt: Option<bool>,
    chat_template_kwargs: Option<Value>,
    #[serde(default)]
    with_pieces: bool,
}

#[derive(Debug, Deserialize)]
struct DetokenizeRequest {
    model: Option<String>,
    tokens: Vec<i64>,
}

pub async fn tokenize(payload: web::Payload, state: &AppState) -> Result<HttpResponse, ApiError> {
    let body = read_object(payload, state).await?;
    let req: TokenizeRequest = fields(&body)?;
    state.check_model(req.model.as_deref())?;
    let text = match (&req.prompt, &req.content) {
        (Some(_), Some(_)) => return Err(ApiError::bad_param("content", "give `prompt` or `content`, not both")),
        (Some(t), None) | (None, Some(t)) => Some(t.clone()),
        (None, None) => None,
    };
    let tokenizer = state.tokenizer.clone();
    let ids = match (text, &req.messages) {
        (Some(_), Some(_)) => return Err(ApiError::bad_param("messages", "give a text prompt or `messages`, not both")),
        (None, None) => return Err(ApiError::bad_param("prompt", "`prompt` (or `content`) or `messages` is required")),
        (Some(text), None) => {
            let special = req.add_special_tokens.or(req.add_special).unwrap_or(true);
            state.tokenize_pool.run(text.len(), move || tokenizer.encode(&text, special)).await?
        }
        (None, Some(messages)) => {
            if req.add_special_tokens.or(req.add_special) == Some(true) {
                return Err(ApiError::bad_param("add_special_tokens", "messages are rendered by the chat template, which writes the special tokens: add_special_tokens must be false or absent"));
            }
            let messages = template_messages(messages)?;
            let tools = req.tools.clone().filter(|t| !t.is_empty()).map(Value::Array);
            let add_generation_prompt = req.add_generation_prompt.unwrap_or(true);
            let kwargs = super::chat::template_kwargs(req.chat_template_kwargs.clone())?;
            let bytes = super::chat::messages_bytes(&messages);
            state
                .tokenize_pool
                .run(bytes, move || {
                    let how = ChatRender { tools: tools.as_ref(), add_generation_prompt, kwargs: kwargs.as_ref() };
                    tokenizer.encode_chat_checked(&messages, &how, |_| Ok::<(), crate::error::Error>(()))
                })
                .await?
        }
    };
    let count = ids.len();
    let tokens = match req.with_pieces {
        true => {
            let tokenizer = state.tokenizer.clone();
            let pieces = move || ids.iter().map(|&id| Ok(json!({"id": id, "piece": tokenizer.decode(&[id], false)?}))).collect::<crate::error::Result<Vec<Value>>>();
            state.tokenize_pool.run(count * 4, pieces).await?
        }
        false => ids.iter().map(|&id| json!(id)).collect(),
    };
    Ok(HttpResponse::Ok().json(json!({"tokens": tokens, "count": count, "max_model_len": state.context_length})))
}

pub async fn detokenize(payload: web::Payload, state: &AppState) -> Result<HttpResponse, ApiError> {
    let body = read_object(payload, state).await?;
    let req: DetokenizeRequest = fields(&body)?;
    state.check_model(req.model.as_deref())?;
    let vocab = state.vocab_size;
    let ids = req
        .tokens
        .iter()
        .enumerate()
        .map(|(i, &t)| {
            u32::try_from(t)
                .ok()
                .filter(|&t| (t as usize) < vocab)
                .ok_or_else(|| ApiError::bad_param(&format!("tokens[{i}]"), format!("token id {t} is outside the vocabulary (0..{vocab})")))
        })
        .collect::<Result<Vec<u32>, _>>()?;
    let tokenizer = state.tokenizer.clone();
    let text = state.tokenize_pool.run(ids.len() * 4, move || tokenizer.decode(&ids, false)).await?;
    // vLLM answers `prompt`, llama.cpp `content`.
    Ok(HttpResponse::Ok().json(json!({"prompt": text, "content": text})))
}
