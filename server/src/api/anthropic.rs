//! `POST /v1/messages` (Anthropic's Messages API, what Claude Code and the
//! `anthropic` SDKs send) and `POST /v1/messages/count_tokens`.
//!
//! A request is rewritten into the chat form the chat template reads: `system`
//! first, `tool_use` blocks as the assistant's tool calls, `tool_result`
//! blocks as tool messages, earlier `thinking` blocks dropped (templates drop
//! past reasoning). The answer is the chat endpoint's output taken apart the
//! same way (reasoning, text, tool calls) and put in Anthropic's content
//! blocks: `thinking`, `text`, `tool_use`. Streams are Anthropic's named
//! events. `tool_choice` `any` / `tool` constrain the output to calls of the
//! tools (see `structured`). What this server cannot do gets 400 naming it:
//! images and documents, server tools. Errors on these routes are Anthropic's
//! error JSON.

use actix_web::{web, HttpResponse};
use serde::Deserialize;
use serde_json::{json, Value};

use super::chat::{chat_generation, encode_prompt, whole_output, ChatInput, OutputSplit, Piece, WholeOutput};
use super::error::ApiError;
use super::generation::{self, ChunkWriter};
use super::messages::{template_messages, ChatMessage};
use super::params::{fields, read_object, read_request, CommonParams, StopField};
use super::structured;
use super::AppState;
use crate::engine::{Event, FinishReason, Usage};
use crate::tokenizer::tool_calls::{StreamItem, ToolCall};

#[derive(Debug, Deserialize)]
struct MessagesRequest {
    messages: Vec<Message>,
    system: Option<TextField>,
    #[serde(default)]
    stop_sequences: Vec<String>,
    tools: Option<Vec<Tool>>,
    tool_choice: Option<ToolChoice>,
    thinking: Option<Thinking>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Role {
    User,
    Assistant,
}

#[derive(Debug, Deserialize)]
struct Message {
    role: Role,
    content: TextField,
}

/// A string, or a list of content blocks.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum TextField {
    Text(String),
    Blocks(Vec<Block>),
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Block {
    Text {
        text: String,
    },
    ToolUse {
        id: String,
        name: String,
        #[serde(default)]
        input: Value,
    },
    ToolResult {
        tool_use_id: String,
        #[serde(default)]
        content: Option<TextField>,
        #[serde(default)]
        is_error: bool,
    },
    Thinking {},
    RedactedThinking {},
    Image {},
    Document {},
    #[serde(other)]
    Other,
}

#[derive(Debug, Deserialize)]
struct Tool {
    name: String,
    description: Option<String>,
    input_schema: Option<Value>,
    /// Server tools (web search, code execution, ...) carry a `type`; client
    /// tools have none or `custom`.
    #[serde(rename = "type")]
    kind: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ToolChoice {
    Auto {
        #[serde(default)]
        disable_parallel_tool_use: bool,
    },
    None {},
    Any {
        #[serde(default)]
        disable_parallel_tool_use: bool,
    },
    Tool {
        name: String,
        #[serde(default)]
        disable_parallel_tool_use: bool,
    },
}

impl ToolChoice {
    /// The choice in OpenAI's terms (`any` is `required`, `tool` a named function).
    fn forced(&self) -> structured::ToolChoice {
        match self {
            ToolChoice::Auto { .. } => structured::ToolChoice::Auto,
            ToolChoice::None {} => structured::ToolChoice::None,
            ToolChoice::Any { .. } => structured::ToolChoice::Required,
            ToolChoice::Tool { name, .. } => structured::ToolChoice::Named(name.clone()),
        }
    }

    fn one_call(&self) -> bool {
        match self {
            ToolChoice::Auto { disable_parallel_tool_use } | ToolChoice::Any { disable_parallel_tool_use } | ToolChoice::Tool { disable_parallel_tool_use, .. } => {
                *disable_parallel_tool_use
            }
            ToolChoice::None {} => false,
        }
    }
}

#[derive(Debug, Deserialize)]
struct Thinking {
    #[serde(rename = "type")]
    kind: String,
}

impl TextField {
    /// The text of a system prompt or tool result (text blocks only).
    fn text(&self, field: &str) -> Result<String, ApiError> {
        match self {
            TextField::Text(t) => Ok(t.clone()),
            TextField::Blocks(blocks) => blocks
                .iter()
                .map(|b| match b {
                    Block::Text { text } => Ok(text.as_str()),
                    other => Err(unsupported_block(field, other)),
                })
                .collect(),
        }
    }
}

fn unsupported_block(field: &str, block: &Block) -> ApiError {
    let kind = match block {
        Block::Image {} => "image",
        Block::Document {} => "document",
        Block::ToolUse { .. } => "tool_use",
        Block::ToolResult { .. } => "tool_result",
        Block::Thinking {} | Block::RedactedThinking {} => "thinking",
        _ => "this kind of",
    };
    ApiError::bad_param(field, format!("{kind} content blocks are not supported in {field}: this server runs text models"))
}

/// The conversation in OpenAI's chat form, for the chat template.
fn chat_messages(req: &MessagesRequest) -> Result<Vec<ChatMessage>, ApiError> {
    let mut out: Vec<Value> = Vec::new();
    if let Some(system) = &req.system {
        out.push(json!({"role": "system", "content": system.text("system")?}));
    }
    for (i, m) in req.messages.iter().enumerate() {
        let field = format!("messages[{i}].content");
        let blocks = match &m.content {
            TextField::Text(t) => {
                let role = if matches!(m.role, Role::User) { "user" } else { "assistant" };
                out.push(json!({"role": role, "content": t}));
                continue;
            }
            TextField::Blocks(b) => b,
        };
        let mut text = String::new();
        let mut calls = Vec::new();
        for block in blocks {
            match (block, &m.role) {
                (Block::Text { text: t }, _) => text.push_str(t),
                (Block::ToolUse { id, name, input }, Role::Assistant) => {
                    calls.push(json!({"id": id, "type": "function", "function": {"name": name, "arguments": input}}))
                }
                (Block::ToolResult { tool_use_id, content, is_error }, Role::User) => {
                    let result = content.as_ref().map(|c| c.text(&field)).transpose()?.unwrap_or_default();
                    let result = if *is_error { format!("Error: {result}") } else { result };
                    out.push(json!({"role": "tool", "tool_call_id": tool_use_id, "content": result}));
                }
                // Past reasoning is not shown to the template again.
                (Block::Thinking {} | Block::RedactedThinking {}, Role::Assistant) => {}
                (other, _) => return Err(unsupported_block(&field, other)),
            }
        }
        match m.role {
            Role::User if !text.is_empty() => out.push(json!({"role": "user", "content": text})),
            Role::User => {}
            Role::Assistant if calls.is_empty() => out.push(json!({"role": "assistant", "content": text})),
            // "" rather than null: templates that add strings to the content fail on null.
            Role::Assistant => out.push(json!({"role": "assistant", "content": text, "tool_calls": calls})),
        }
    }
    serde_json::from_value(Value::Array(out)).map_err(|e| ApiError::bad_param("messages", format!("invalid messages: {e}")))
}

/// The tools in OpenAI's form for the template (None when the request has
/// none or says `tool_choice: none`).
fn chat_tools(req: &MessagesRequest) -> Result<Option<Value>, ApiError> {
    if matches!(req.tool_choice, Some(ToolChoice::None {})) {
        return Ok(None);
    }
    let Some(tools) = req.tools.as_ref().filter(|t| !t.is_empty()) else { return Ok(None) };
    let mut out = Vec::with_capacity(tools.len());
    for (i, t) in tools.iter().enumerate() {
        if let Some(kind) = t.kind.as_deref().filter(|k| *k != "custom") {
            return Err(ApiError::bad_param(&format!("tools[{i}]"), format!("server tool `{kind}` is not supported: only client tools with an input_schema")));
        }
        let parameters = t.input_schema.clone().unwrap_or_else(|| json!({"type": "object"}));
        out.push(json!({"type": "function", "function": {"name": t.name, "description": t.description, "parameters": parameters}}));
    }
    Ok(Some(Value::Array(out)))
}

/// `thinking: {type: enabled|disabled}` → the template's `enable_thinking`.
fn template_kwargs(req: &MessagesRequest) -> Option<Value> {
    let enabled = matches!(req.thinking.as_ref()?.kind.as_str(), "enabled" | "adaptive");
    Some(json!({"enable_thinking": enabled}))
}

struct Prepared {
    messages: Value,
    tools: Option<Value>,
    kwargs: Option<Value>,
}

fn prepare(req: &MessagesRequest) -> Result<Prepared, ApiError> {
    let messages = template_messages(&chat_messages(req)?)?;
    Ok(Prepared { messages, tools: chat_tools(req)?, kwargs: template_kwargs(req) })
}

pub async fn handle(payload: web::Payload, state: &AppState) -> Result<HttpResponse, ApiError> {
    let arriving = state.engine.arriving();
    let (body, mut common) = read_request(payload, state).await?;
    let req: MessagesRequest = fields(&body)?;
    if common.max_tokens.is_none() {
        return Err(ApiError::bad_param("max_tokens", "`max_tokens` is required"));
    }
    anthropic_defaults(&mut common, &req);
    let p = prepare(&req)?;
    let one_call = req.tool_choice.as_ref().is_some_and(ToolChoice::one_call);
    let choice = req.tool_choice.as_ref().map_or(structured::ToolChoice::Auto, ToolChoice::forced);
    let output = structured::wanted_output(&choice, p.tools.as_ref(), state.tool_format, !one_call, None)?;
    let chat = ChatInput { messages: p.messages, tools: p.tools, kwargs: p.kwargs, one_call };
    let (params, shape) = chat_generation(state, &common, chat, None, output, "tools").await?;
    let prompt_tokens = params.prompt.len();
    let rx = generation::submit(state, params, arriving)?;
    let id = generation::response_id("msg");
    if common.stream {
        let writer = MessageStream::new(id, state.models.id.clone(), prompt_tokens, OutputSplit::new(shape));
        return Ok(generation::sse_response(rx, writer, state));
    }
    let done = generation::collect(rx, state).await?;
    let out = whole_output(shape, done.text);
    let stop_reason = stop_reason(done.finish_reason, done.stop_sequence.is_some(), !out.calls.is_empty());
    Ok(HttpResponse::Ok().json(json!({
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": state.models.id,
        "content": content_blocks(out),
        "stop_reason": stop_reason,
        "stop_sequence": done.stop_sequence,
        "usage": usage(&done.usage),
    })))
}

/// Anthropic's names and defaults over the shared fields: `stop_sequences`,
/// and a temperature of 1 when none is given (OpenAI-style routes default to
/// greedy, as mlx_lm.server does).
fn anthropic_defaults(common: &mut CommonParams, req: &MessagesRequest) {
    if !req.stop_sequences.is_empty() {
        common.stop = Some(StopField::Many(req.stop_sequences.clone()));
    }
    common.temperature.get_or_insert(1.0);
}

fn content_blocks(out: WholeOutput) -> Vec<Value> {
    let mut blocks = Vec::new();
    if let Some(thought) = out.reasoning {
        blocks.push(json!({"type": "thinking", "thinking": thought, "signature": ""}));
    }
    if !out.content.is_empty() || out.calls.is_empty() {
        blocks.push(json!({"type": "text", "text": out.content}));
    }
    blocks.extend(out.calls.iter().map(tool_use_block));
    blocks
}

fn tool_use_block(call: &ToolCall) -> Value {
    let input: Value = serde_json::from_str(&call.arguments).unwrap_or_else(|_| json!({}));
    json!({"type": "tool_use", "id": call.id, "name": call.name, "input": input})
}

/// A cut answer is `max_tokens` even when it holds a call: the call may be
/// incomplete, and a client must not take the turn as done. One of the
/// request's `stop_sequences` ending it is `stop_sequence` (the response
/// names it), unless a tool call was made first.
fn stop_reason(finish: FinishReason, by_stop_sequence: bool, called: bool) -> &'static str {
    match (finish, by_stop_sequence, called) {
        (FinishReason::Length, _, _) => "max_tokens",
        (FinishReason::Stop, _, true) => "tool_use",
        (FinishReason::Stop, true, false) => "stop_sequence",
        (FinishReason::Stop, false, false) => "end_turn",
    }
}

fn usage(u: &Usage) -> Value {
    json!({
        "input_tokens": u.prompt_tokens - u.cached_tokens,
        "cache_read_input_tokens": u.cached_tokens,
        "cache_creation_input_tokens": 0,
        "output_tokens": u.completion_tokens,
    })
}

/// `POST /v1/messages/count_tokens`: the prompt's tokens, as the messages
/// route would render them.
pub async fn count_tokens(payload: web::Payload, state: &AppState) -> Result<HttpResponse, ApiError> {
    let body = read_object(payload, state).await?;
    let model: Option<String> = body.get("model").and_then(Value::as_str).map(str::to_string);
    state.check_model(model.as_deref())?;
    let req: MessagesRequest = fields(&body)?;
    let p = prepare(&req)?;
    let prompt = encode_prompt(state, p.messages, p.tools, p.kwargs).await?.ids;
    Ok(HttpResponse::Ok().json(json!({"input_tokens": prompt.len()})))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BlockKind {
    Thinking,
    Text,
}

/// Anthropic's stream: message_start, then per content block
/// content_block_start / _delta / _stop, then message_delta and message_stop.
struct MessageStream {
    id: String,
    model: String,
    prompt_tokens: usize,
    split: OutputSplit,
    /// The block being written (index, kind), if one is open.
    open: Option<(usize, BlockKind)>,
    next_index: usize,
    called: bool,
}

impl MessageStream {
    fn new(id: String, model: String, prompt_tokens: usize, split: OutputSplit) -> MessageStream {
        MessageStream { id, model, prompt_tokens, split, open: None, next_index: 0, called: false }
    }

    fn close(&mut self, out: &mut Vec<Value>) {
        if let Some((index, _)) = self.open.take() {
            out.push(json!({"type": "content_block_stop", "index": index}));
        }
    }

    /// The open block of `kind` (closing another kind first), and its index.
    fn block(&mut self, kind: BlockKind, out: &mut Vec<Value>) -> usize {
        if let Some((index, open)) = self.open {
            if open == kind {
                return index;
            }
        }
        self.close(out);
        let index = self.next_index;
        self.next_index += 1;
        let start = match kind {
            BlockKind::Thinking => json!({"type": "thinking", "thinking": "", "signature": ""}),
            BlockKind::Text => json!({"type": "text", "text": ""}),
        };
        out.push(json!({"type": "content_block_start", "index": index, "content_block": start}));
        self.open = Some((index, kind));
        index
    }

    fn pieces(&mut self, pieces: Vec<Piece>, out: &mut Vec<Value>) {
        for piece in pieces {
            match piece {
                Piece::Reasoning(t) => {
                    let index = self.block(BlockKind::Thinking, out);
                    out.push(json!({"type": "content_block_delta", "index": index, "delta": {"type": "thinking_delta", "thinking": t}}));
                }
                Piece::Item(StreamItem::Content(t)) if t.is_empty() => {}
                Piece::Item(StreamItem::Content(t)) => {
                    let index = self.block(BlockKind::Text, out);
                    out.push(json!({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": t}}));
                }
                Piece::Item(StreamItem::Call(call)) => {
                    self.close(out);
                    let index = self.next_index;
                    self.next_index += 1;
                    self.called = true;
                    let start = json!({"type": "tool_use", "id": call.id, "name": call.name, "input": {}});
                    out.push(json!({"type": "content_block_start", "index": index, "content_block": start}));
                    let delta = json!({"type": "input_json_delta", "partial_json": call.arguments});
                    out.push(json!({"type": "content_block_delta", "index": index, "delta": delta}));
                    out.push(json!({"type": "content_block_stop", "index": index}));
                }
            }
        }
    }
}

impl ChunkWriter for MessageStream {
    fn start(&mut self) -> Vec<Value> {
        let message = json!({
            "id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": [],
            "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": self.prompt_tokens, "output_tokens": 0},
        });
        vec![json!({"type": "message_start", "message": message})]
    }

    fn write(&mut self, event: Event) -> Vec<Value> {
        let mut out = Vec::new();
        match event {
            Event::Token { text, .. } => {
                let pieces = self.split.push(&text, false);
                self.pieces(pieces, &mut out);
            }
            Event::Done { text, finish_reason, stop_sequence, usage: u } => {
                let pieces = self.split.push(&text, true);
                self.pieces(pieces, &mut out);
                self.close(&mut out);
                let reason = stop_reason(finish_reason, stop_sequence.is_some(), self.called);
                let delta = json!({"stop_reason": reason, "stop_sequence": stop_sequence});
                out.push(json!({"type": "message_delta", "delta": delta, "usage": {"output_tokens": u.completion_tokens}}));
                out.push(json!({"type": "message_stop"}));
            }
            Event::Error(message) => out.push(error_event("api_error", &message)),
            // The Messages API has no progress event (its requests never ask).
            Event::Progress(_) => {}
        }
        out
    }

    fn cut(&mut self, message: &str) -> Vec<Value> {
        let mut out = Vec::new();
        self.close(&mut out);
        out.push(error_event("overloaded_error", message));
        out
    }

    fn frame(chunks: &[Value], _done: bool) -> web::Bytes {
        generation::named_events(chunks, |message| error_event("api_error", message))
    }
}

fn error_event(kind: &str, message: &str) -> Value {
    json!({"type": "error", "error": {"type": kind, "message": message}})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::chat::OutputShape;
    use crate::api::generation::testing::{feed_chars, THINK_SAY_CALL};
    use crate::tokenizer::tool_calls::ToolCallFormat;

    fn hermes() -> Option<ToolCallFormat> {
        Some(ToolCallFormat::Hermes)
    }

    fn request(v: Value) -> MessagesRequest {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_tool_conversation_becomes_chat_messages_with_calls_and_results() {
        let req = request(json!({
            "system": [{"type": "text", "text": "Be brief."}],
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "use the tool", "signature": "x"},
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "18C"}]}
            ],
            "tools": [{"name": "weather", "description": "d", "input_schema": {"type": "object"}}]
        }));
        let p = prepare(&req).unwrap();
        let m = p.messages.as_array().unwrap();
        assert_eq!((m[0]["role"].as_str(), m[0]["content"].as_str()), (Some("system"), Some("Be brief.")));
        assert_eq!(m[2]["content"], "Checking.");
        assert_eq!(m[2]["tool_calls"][0]["function"]["arguments"], json!({"city": "Paris"}));
        assert_eq!((m[3]["role"].as_str(), m[3]["tool_call_id"].as_str(), m[3]["content"].as_str()), (Some("tool"), Some("toolu_1"), Some("18C")));
        assert_eq!(p.tools.unwrap()[0]["function"]["parameters"], json!({"type": "object"}));
    }

    #[test]
    fn what_cannot_be_served_is_refused_naming_the_field() {
        let image = json!({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]});
        let e = prepare(&request(image)).err().unwrap();
        assert!(e.message.contains("image"), "{}", e.message);
        let tool = json!({"messages": [{"role": "user", "content": "x"}], "tools": [{"name": "f"}], "tool_choice": {"type": "tool", "name": "f"}});
        let choice = request(tool).tool_choice.unwrap();
        assert_eq!((choice.forced(), choice.one_call()), (structured::ToolChoice::Named("f".into()), false));
        let server_tool = json!({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "web_search_20250305", "name": "web_search"}]});
        assert!(prepare(&request(server_tool)).err().unwrap().message.contains("web_search_20250305"));
    }

    #[test]
    fn streams_are_named_events_with_thinking_text_and_tool_use_blocks() {
        let mut s = MessageStream::new("msg_1".into(), "m".into(), 7, OutputSplit::new(OutputShape { tools: hermes(), thinking: Some(false), ..Default::default() }));
        let events = feed_chars(&mut s, THINK_SAY_CALL);
        let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(kinds.first(), Some(&"message_start"));
        assert_eq!(&kinds[kinds.len() - 2..], ["message_delta", "message_stop"]);
        let starts: Vec<&Value> = events.iter().filter(|e| e["type"] == "content_block_start").collect();
        let block_types: Vec<&str> = starts.iter().map(|e| e["content_block"]["type"].as_str().unwrap()).collect();
        assert_eq!(block_types, ["thinking", "text", "tool_use"]);
        let thinking: String = events.iter().filter_map(|e| e["delta"]["thinking"].as_str()).collect();
        let said: String = events.iter().filter_map(|e| e["delta"]["text"].as_str()).collect();
        assert_eq!((thinking.as_str(), said.as_str()), ("plan", "Sure."));
        let args = events.iter().find_map(|e| e["delta"]["partial_json"].as_str()).unwrap();
        assert_eq!(serde_json::from_str::<Value>(args).unwrap(), json!({"a": 1}));
        assert_eq!(events[events.len() - 2]["delta"]["stop_reason"], "tool_use");
        let wire = String::from_utf8(MessageStream::frame(&events[..1], false).to_vec()).unwrap();
        assert!(wire.starts_with("event: message_start\ndata: {"), "{wire}");
    }

    #[test]
    fn a_cut_answer_is_max_tokens_even_with_a_call() {
        assert_eq!(super::stop_reason(FinishReason::Length, false, true), "max_tokens");
        assert_eq!(super::stop_reason(FinishReason::Stop, false, true), "tool_use");
        assert_eq!(super::stop_reason(FinishReason::Stop, false, false), "end_turn");
        assert_eq!(super::stop_reason(FinishReason::Stop, true, false), "stop_sequence");
    }
}
