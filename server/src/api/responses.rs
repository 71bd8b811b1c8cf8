//! `POST /v1/responses` (OpenAI's Responses API, what Codex sends) and
//! `GET /v1/responses/{id}`.
//!
//! `input` (a string, or message / `function_call` / `function_call_output`
//! items) and `instructions` become chat messages for the template, after the
//! conversation of `previous_response_id` when given; the answer is the chat
//! output taken apart (reasoning, text, tool calls) as `reasoning`, `message`
//! and `function_call` output items, whole or as the API's streaming events.
//! Stored responses (`store`, default true) live in a bounded in-memory store.
//! `text.format` `json_schema` / `json_object` and `tool_choice` `required` or
//! a named function constrain the output (see `structured`). What this server
//! cannot do gets 400 naming it: non-function tools, images and files,
//! `background`, `conversation`, `prompt`, `truncation: auto`.

use std::sync::Arc;

use actix_web::{web, HttpResponse};
use serde::Deserialize;
use serde_json::{json, Value};

use super::chat::{chat_generation, nested_tool, whole_output, ChatInput, OutputSplit, Piece, WholeOutput};
use super::error::ApiError;
use super::generation::{self, ChunkWriter};
use super::messages::{template_messages, ChatMessage};
use super::params::{fields, read_request};
use super::response_store::{ResponseStore, Stored};
use super::structured::{self, ToolChoice};
use super::AppState;
use crate::engine::{Event, FinishReason, Usage};
use crate::tokenizer::tool_calls::{StreamItem, ToolCall};

#[derive(Debug, Deserialize)]
struct ResponsesRequest {
    input: InputField,
    instructions: Option<String>,
    max_output_tokens: Option<i64>,
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    previous_response_id: Option<String>,
    store: Option<bool>,
    text: Option<Value>,
    reasoning: Option<Value>,
    background: Option<bool>,
    conversation: Option<Value>,
    prompt: Option<Value>,
    truncation: Option<String>,
    metadata: Option<Value>,
    /// false: at most one function call is returned.
    parallel_tool_calls: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum InputField {
    Text(String),
    Items(Vec<Value>),
}

/// 400 for the fields this server cannot honour.
fn refuse_unsupported(req: &ResponsesRequest) -> Result<(), ApiError> {
    let refuse = |param: &str, what: &str| Err(ApiError::bad_param(param, format!("{what} is not supported by this server")));
    if req.background == Some(true) {
        return refuse("background", "background mode");
    }
    if req.conversation.as_ref().is_some_and(|c| !c.is_null()) {
        return refuse("conversation", "`conversation` (use previous_response_id)");
    }
    if req.prompt.as_ref().is_some_and(|p| !p.is_null()) {
        return refuse("prompt", "a stored prompt template");
    }
    if req.truncation.as_deref().is_some_and(|t| t != "disabled") {
        return refuse("truncation", "truncation `auto`");
    }
    Ok(())
}

/// The text of a message's content: a string, or input_text / output_text parts.
fn content_text(content: &Value, param: &str) -> Result<String, ApiError> {
    match content {
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => parts
            .iter()
            .enumerate()
            .map(|(i, p)| match p["type"].as_str() {
                Some("input_text" | "output_text" | "text") => Ok(p["text"].as_str().unwrap_or_default()),
                other => Err(ApiError::bad_param(
                    &format!("{param}[{i}].type"),
                    format!("content of type {} is not supported: this server runs text models", other.unwrap_or("(none)")),
                )),
            })
            .collect(),
        _ => Err(ApiError::bad_param(param, "content must be a string or a list of parts")),
    }
}

/// `input` as chat messages.
fn input_messages(input: &InputField) -> Result<Vec<Value>, ApiError> {
    let items = match input {
        InputField::Text(t) => return Ok(vec![json!({"role": "user", "content": t})]),
        InputField::Items(items) => items,
    };
    let mut out: Vec<Value> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let param = format!("input[{i}]");
        match item["type"].as_str() {
            None | Some("message") => {
                let role = item["role"].as_str().ok_or_else(|| ApiError::bad_param(&format!("{param}.role"), "a message needs a role"))?;
                if !["user", "assistant", "system", "developer"].contains(&role) {
                    return Err(ApiError::bad_param(&format!("{param}.role"), format!("unknown role {role:?}")));
                }
                out.push(json!({"role": role, "content": content_text(&item["content"], &format!("{param}.content"))?}));
            }
            Some("function_call") => {
                let call = json!({"id": item["call_id"], "type": "function",
                                  "function": {"name": item["name"], "arguments": item["arguments"]}});
                match out.last_mut() {
                    Some(last) if last["role"] == "assistant" => {
                        if !last["tool_calls"].is_array() {
                            last["tool_calls"] = json!([]);
                        }
                        if let Some(calls) = last["tool_calls"].as_array_mut() {
                            calls.push(call);
                        }
                    }
                    // "" rather than null: templates that add strings to the content fail on null.
                    _ => out.push(json!({"role": "assistant", "content": "", "tool_calls": [call]})),
                }
            }
            Some("function_call_output") => {
                let output = match &item["output"] {
                    Value::String(s) => s.clone(),
                    other => content_text(other, &format!("{param}.output"))?,
                };
                out.push(json!({"role": "tool", "tool_call_id": item["call_id"], "content": output}));
            }
            // Earlier reasoning is not shown to the template again.
            Some("reasoning") => {}
            Some(other) => return Err(ApiError::bad_param(&format!("{param}.type"), format!("input items of type {other} are not supported"))),
        }
    }
    Ok(out)
}

/// Function tools in the chat form (None: no tools, or `tool_choice: none`).
fn chat_tools(req: &ResponsesRequest, choice: &ToolChoice) -> Result<Option<Value>, ApiError> {
    if *choice == ToolChoice::None {
        return Ok(None);
    }
    let Some(tools) = req.tools.as_ref().filter(|t| !t.is_empty()) else { return Ok(None) };
    let mut out = Vec::with_capacity(tools.len());
    for (i, t) in tools.iter().enumerate() {
        match t["type"].as_str() {
            Some("function") => {}
            other => {
                return Err(ApiError::bad_param(&format!("tools[{i}].type"), format!("tools of type {} are not supported: only function tools", other.unwrap_or("(none)"))))
            }
        }
        if t["name"].as_str().is_none() {
            return Err(ApiError::bad_param(&format!("tools[{i}].name"), "a function tool needs a name"));
        }
        out.push(nested_tool(t));
    }
    Ok(Some(Value::Array(out)))
}

/// `reasoning.effort` → the template's `enable_thinking` (`none` / `minimal`: off).
fn template_kwargs(req: &ResponsesRequest) -> Option<Value> {
    let effort = req.reasoning.as_ref()?["effort"].as_str()?;
    Some(json!({"enable_thinking": !matches!(effort, "none" | "minimal")}))
}

fn to_chat(messages: &[Value]) -> Result<Value, ApiError> {
    let typed: Vec<ChatMessage> = serde_json::from_value(Value::Array(messages.to_vec())).map_err(|e| ApiError::bad_param("input", format!("invalid input: {e}")))?;
    template_messages(&typed)
}

/// What a response echoes of its request.
#[derive(Clone)]
struct Echo {
    id: String,
    created_at: u64,
    model: String,
    instructions: Option<String>,
    max_output_tokens: Option<i64>,
    previous_response_id: Option<String>,
    tools: Value,
    tool_choice: Value,
    temperature: f32,
    top_p: f32,
    store: bool,
    metadata: Value,
    parallel_tool_calls: bool,
    /// The request's `text` (its output format).
    text: Value,
}

impl Echo {
    fn response(&self, status: &str, output: &[Value], usage: Option<&Usage>, incomplete: bool) -> Value {
        json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": null,
            "incomplete_details": if incomplete { json!({"reason": "max_output_tokens"}) } else { Value::Null },
            "instructions": self.instructions,
            "max_output_tokens": self.max_output_tokens,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": self.parallel_tool_calls,
            "previous_response_id": self.previous_response_id,
            "reasoning": {"effort": null, "summary": null},
            "store": self.store,
            "temperature": self.temperature,
            "text": self.text,
            "tool_choice": self.tool_choice,
            "tools": self.tools,
            "top_p": self.top_p,
            "truncation": "disabled",
            "usage": usage.map(usage_json),
            "metadata": self.metadata,
        })
    }
}

fn usage_json(u: &Usage) -> Value {
    json!({
        "input_tokens": u.prompt_tokens,
        "input_tokens_details": {"cached_tokens": u.cached_tokens},
        "output_tokens": u.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": u.prompt_tokens + u.completion_tokens,
    })
}

fn reasoning_item(id: &str, text: &str) -> Value {
    json!({"type": "reasoning", "id": id, "summary": [], "content": [{"type": "reasoning_text", "text": text}]})
}

fn message_item(id: &str, text: &str, status: &str) -> Value {
    let content = if status == "completed" { json!([output_text(text)]) } else { json!([]) };
    json!({"type": "message", "id": id, "status": status, "role": "assistant", "content": content})
}

fn output_text(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

fn call_item(call: &ToolCall, arguments: &str, status: &str) -> Value {
    json!({"type": "function_call", "id": format!("fc_{}", call.id), "call_id": call.id, "name": call.name, "arguments": arguments, "status": status})
}

/// The assistant's turn in chat form, for the next response's conversation.
fn assistant_message(content: &str, calls: &[ToolCall]) -> Value {
    let mut m = json!({"role": "assistant", "content": content});
    if !calls.is_empty() {
        m["tool_calls"] = calls.iter().map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}})).collect();
    }
    m
}

fn whole_items(out: &WholeOutput) -> Vec<Value> {
    let mut items = Vec::new();
    if let Some(thought) = &out.reasoning {
        items.push(reasoning_item(&generation::response_id("rs"), thought));
    }
    if !out.content.is_empty() || out.calls.is_empty() {
        items.push(message_item(&generation::response_id("msg"), &out.content, "completed"));
    }
    items.extend(out.calls.iter().map(|c| call_item(c, &c.arguments, "completed")));
    items
}

pub async fn handle(payload: web::Payload, state: &AppState) -> Result<HttpResponse, ApiError> {
    let arriving = state.engine.arriving();
    let (body, mut common) = read_request(payload, state).await?;
    let req: ResponsesRequest = fields(&body)?;
    refuse_unsupported(&req)?;
    if common.max_tokens.is_none() {
        common.max_tokens = req.max_output_tokens;
    }
    let earlier = match &req.previous_response_id {
        Some(id) => {
            let found = state.responses.get(id);
            let missing = || ApiError::not_found(format!("Previous response with id '{id}' not found."), "previous_response_not_found");
            found.ok_or_else(missing)?.messages.as_ref().clone()
        }
        None => Vec::new(),
    };
    let mut conversation = earlier;
    conversation.extend(input_messages(&req.input)?);
    let mut prompt_messages = Vec::with_capacity(conversation.len() + 1);
    if let Some(i) = req.instructions.as_ref().filter(|i| !i.is_empty()) {
        prompt_messages.push(json!({"role": "system", "content": i}));
    }
    prompt_messages.extend(conversation.iter().cloned());
    let choice = ToolChoice::openai(req.tool_choice.as_ref())?;
    let tools = chat_tools(&req, &choice)?;
    let text_format = req.text.as_ref().map(|t| &t["format"]);
    let schema = structured::format_schema(text_format, "text.format")?;
    let one_call = req.parallel_tool_calls == Some(false);
    let output = structured::wanted_output(&choice, tools.as_ref(), state.tool_format, !one_call, schema)?;
    let chat = ChatInput { messages: to_chat(&prompt_messages)?, tools, kwargs: template_kwargs(&req), one_call };
    let (params, shape) = chat_generation(state, &common, chat, None, output, "text.format.schema").await?;
    let echo = Echo {
        id: generation::response_id("resp"),
        created_at: generation::unix_now(),
        model: state.models.id.clone(),
        instructions: req.instructions.clone(),
        max_output_tokens: req.max_output_tokens,
        previous_response_id: req.previous_response_id.clone(),
        tools: req.tools.clone().map_or(json!([]), Value::Array),
        tool_choice: req.tool_choice.clone().unwrap_or(json!("auto")),
        temperature: params.sampling.temperature,
        top_p: params.sampling.top_p,
        store: req.store.unwrap_or(true),
        metadata: req.metadata.clone().unwrap_or(json!({})),
        parallel_tool_calls: !one_call,
        text: req.text.clone().filter(|t| !t.is_null()).unwrap_or(json!({"format": {"type": "text"}})),
    };
    let rx = generation::submit(state, params, arriving)?;
    let keep = echo.store.then(|| Keep { store: state.responses.clone(), conversation });
    if common.stream {
        let writer = ResponseStream::new(echo, OutputSplit::new(shape), keep);
        return Ok(generation::sse_response(rx, writer, state));
    }
    let done = generation::collect(rx, state).await?;
    let out = whole_output(shape, done.text);
    let incomplete = done.finish_reason == FinishReason::Length;
    let response = echo.response(if incomplete { "incomplete" } else { "completed" }, &whole_items(&out), Some(&done.usage), incomplete);
    if let Some(keep) = keep {
        keep.save(&echo.id, assistant_message(&out.content, &out.calls), &response);
    }
    Ok(HttpResponse::Ok().json(response))
}

/// `GET /v1/responses/{id}`: a stored response.
pub fn retrieve(state: &AppState, id: &str) -> Result<HttpResponse, ApiError> {
    let stored = state.responses.get(id).ok_or_else(|| ApiError::not_found(format!("Response with id '{id}' not found."), "response_not_found"))?;
    Ok(HttpResponse::Ok().json(stored.response.as_ref()))
}

/// Where a finished response goes, with the conversation that led to it.
struct Keep {
    store: Arc<ResponseStore>,
    conversation: Vec<Value>,
}

impl Keep {
    fn save(self, id: &str, assistant: Value, response: &Value) {
        let mut messages = self.conversation;
        messages.push(assistant);
        self.store.put(id.to_string(), Stored { messages: Arc::new(messages), response: Arc::new(response.clone()) });
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OpenKind {
    Reasoning,
    Message,
}

/// The Responses API's stream: response.created / in_progress, then per output
/// item output_item.added, its deltas and done events, output_item.done, and
/// response.completed (or .incomplete) with the whole response.
struct ResponseStream {
    echo: Echo,
    split: OutputSplit,
    keep: Option<Keep>,
    sequence: u64,
    /// Finished output items.
    items: Vec<Value>,
    /// The item being written: its kind, id and text so far.
    open: Option<(OpenKind, String, String)>,
    /// For the stored conversation.
    content: String,
    calls: Vec<ToolCall>,
}

impl ResponseStream {
    fn new(echo: Echo, split: OutputSplit, keep: Option<Keep>) -> ResponseStream {
        ResponseStream { echo, split, keep, sequence: 0, items: Vec::new(), open: None, content: String::new(), calls: Vec::new() }
    }

    fn event(&mut self, mut e: Value) -> Value {
        e["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        e
    }

    fn close(&mut self, out: &mut Vec<Value>) {
        let Some((kind, id, text)) = self.open.take() else { return };
        let index = self.items.len();
        let item = match kind {
            OpenKind::Reasoning => {
                let e = json!({"type": "response.reasoning_text.done", "item_id": id, "output_index": index, "content_index": 0, "text": text});
                out.push(self.event(e));
                reasoning_item(&id, &text)
            }
            OpenKind::Message => {
                let e = json!({"type": "response.output_text.done", "item_id": id, "output_index": index, "content_index": 0, "text": text, "logprobs": []});
                out.push(self.event(e));
                let e = json!({"type": "response.content_part.done", "item_id": id, "output_index": index, "content_index": 0, "part": output_text(&text)});
                out.push(self.event(e));
                message_item(&id, &text, "completed")
            }
        };
        let e = json!({"type": "response.output_item.done", "output_index": index, "item": item});
        out.push(self.event(e));
        self.items.push(item);
    }

    /// Appends `text` to an open item of `kind`, opening one first if needed.
    fn append(&mut self, kind: OpenKind, text: String, out: &mut Vec<Value>) {
        if self.open.as_ref().is_some_and(|(k, _, _)| *k != kind) {
            self.close(out);
        }
        let index = self.items.len();
        if self.open.is_none() {
            let id = generation::response_id(if kind == OpenKind::Reasoning { "rs" } else { "msg" });
            let item = match kind {
                OpenKind::Reasoning => json!({"type": "reasoning", "id": id, "summary": [], "content": []}),
                OpenKind::Message => message_item(&id, "", "in_progress"),
            };
            let e = json!({"type": "response.output_item.added", "output_index": index, "item": item});
            out.push(self.event(e));
            if kind == OpenKind::Message {
                let e = json!({"type": "response.content_part.added", "item_id": id, "output_index": index, "content_index": 0, "part": output_text("")});
                out.push(self.event(e));
            }
            self.open = Some((kind, id, String::new()));
        }
        let Some((_, id, so_far)) = self.open.as_mut() else { return };
        so_far.push_str(&text);
        let id = id.clone();
        let e = match kind {
            OpenKind::Reasoning => json!({"type": "response.reasoning_text.delta", "item_id": id, "output_index": index, "content_index": 0, "delta": text}),
            OpenKind::Message => json!({"type": "response.output_text.delta", "item_id": id, "output_index": index, "content_index": 0, "delta": text, "logprobs": []}),
        };
        out.push(self.event(e));
    }

    fn call(&mut self, call: ToolCall, out: &mut Vec<Value>) {
        self.close(out);
        let index = self.items.len();
        let e = json!({"type": "response.output_item.added", "output_index": index, "item": call_item(&call, "", "in_progress")});
        out.push(self.event(e));
        let item_id = format!("fc_{}", call.id);
        let e = json!({"type": "response.function_call_arguments.delta", "item_id": item_id, "output_index": index, "delta": call.arguments});
        out.push(self.event(e));
        let e = json!({"type": "response.function_call_arguments.done", "item_id": item_id, "output_index": index, "arguments": call.arguments, "name": call.name});
        out.push(self.event(e));
        let item = call_item(&call, &call.arguments, "completed");
        let e = json!({"type": "response.output_item.done", "output_index": index, "item": item});
        out.push(self.event(e));
        self.items.push(item);
        self.calls.push(call);
    }

    fn pieces(&mut self, pieces: Vec<Piece>, out: &mut Vec<Value>) {
        for piece in pieces {
            match piece {
                Piece::Reasoning(t) => self.append(OpenKind::Reasoning, t, out),
                Piece::Item(StreamItem::Content(t)) if t.is_empty() => {}
                Piece::Item(StreamItem::Content(t)) => {
                    self.content.push_str(&t);
                    self.append(OpenKind::Message, t, out)
                }
                Piece::Item(StreamItem::Call(call)) => self.call(call, out),
            }
        }
    }
}

impl ChunkWriter for ResponseStream {
    fn start(&mut self) -> Vec<Value> {
        let created = json!({"type": "response.created", "response": self.echo.response("in_progress", &[], None, false)});
        let progress = json!({"type": "response.in_progress", "response": self.echo.response("in_progress", &[], None, false)});
        vec![self.event(created), self.event(progress)]
    }

    fn write(&mut self, event: Event) -> Vec<Value> {
        let mut out = Vec::new();
        match event {
            Event::Token { text, .. } => {
                let pieces = self.split.push(&text, false);
                self.pieces(pieces, &mut out);
            }
            Event::Done { text, finish_reason, usage, .. } => {
                let pieces = self.split.push(&text, true);
                self.pieces(pieces, &mut out);
                if self.items.is_empty() && self.open.is_none() {
                    // An empty answer is still one (empty) message.
                    self.append(OpenKind::Message, String::new(), &mut out);
                }
                self.close(&mut out);
                let incomplete = finish_reason == FinishReason::Length;
                let (status, kind) = if incomplete { ("incomplete", "response.incomplete") } else { ("completed", "response.completed") };
                let response = self.echo.response(status, &self.items, Some(&usage), incomplete);
                if let Some(keep) = self.keep.take() {
                    keep.save(&self.echo.id, assistant_message(&self.content, &self.calls), &response);
                }
                let e = json!({"type": kind, "response": response});
                out.push(self.event(e));
            }
            Event::Error(message) => {
                let e = json!({"type": "error", "code": "server_error", "message": message, "param": null});
                out.push(self.event(e));
            }
            // The Responses API has no progress event (its requests never ask).
            Event::Progress(_) => {}
        }
        out
    }

    fn cut(&mut self, message: &str) -> Vec<Value> {
        let e = json!({"type": "error", "code": "server_shutting_down", "message": message, "param": null});
        vec![self.event(e)]
    }

    fn frame(chunks: &[Value], _done: bool) -> web::Bytes {
        generation::named_events(chunks, |message| json!({"type": "error", "code": "server_error", "message": message, "param": null}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::chat::OutputShape;
    use crate::api::generation::testing::{feed_chars, THINK_SAY_CALL};
    use crate::tokenizer::tool_calls::ToolCallFormat;

    fn request(v: Value) -> ResponsesRequest {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn input_items_become_chat_messages_with_calls_and_outputs() {
        let req = request(json!({"input": [
            {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
            {"type": "function_call", "call_id": "c1", "name": "w", "arguments": "{\"city\":\"Paris\"}"},
            {"type": "function_call_output", "call_id": "c1", "output": "18C"},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "It is 18C."}]}
        ]}));
        let m = input_messages(&req.input).unwrap();
        assert_eq!(m.len(), 4);
        assert_eq!(m[0], json!({"role": "user", "content": "Weather?"}));
        assert_eq!(m[1]["tool_calls"][0]["id"], "c1");
        assert_eq!((m[2]["role"].as_str(), m[2]["content"].as_str()), (Some("tool"), Some("18C")));
        let chat = to_chat(&m).unwrap();
        assert_eq!(chat[1]["tool_calls"][0]["function"]["arguments"], json!({"city": "Paris"}));
        assert_eq!(input_messages(&request(json!({"input": "hi"})).input).unwrap(), vec![json!({"role": "user", "content": "hi"})]);
    }

    #[test]
    fn what_cannot_be_served_is_refused_naming_the_field() {
        let cases = [
            (json!({"input": "x", "background": true}), "background"),
            (json!({"input": "x", "truncation": "auto"}), "truncation"),
        ];
        for (body, param) in cases {
            let e = refuse_unsupported(&request(body)).unwrap_err();
            assert!(e.body()["error"]["param"] == param, "{param}: {}", e.message);
        }
        let e = chat_tools(&request(json!({"input": "x", "tools": [{"type": "web_search"}]})), &ToolChoice::Auto).unwrap_err();
        assert_eq!(e.body()["error"]["param"], "tools[0].type");
        let none = request(json!({"input": "x", "tools": [{"type": "function", "name": "f"}], "tool_choice": "none"}));
        assert_eq!(chat_tools(&none, &ToolChoice::None).unwrap(), None);
        let e = input_messages(&request(json!({"input": [{"role": "user", "content": [{"type": "input_image"}]}]})).input).unwrap_err();
        assert_eq!(e.body()["error"]["param"], "input[0].content[0].type");
    }

    #[test]
    fn the_stream_numbers_its_events_and_ends_with_the_whole_response() {
        let echo = Echo {
            id: "resp_1".into(), created_at: 1, model: "m".into(), instructions: None, max_output_tokens: None,
            previous_response_id: None, tools: json!([]), tool_choice: json!("auto"), temperature: 0.0, top_p: 1.0,
            store: false, metadata: json!({}), parallel_tool_calls: true, text: json!({"format": {"type": "text"}}),
        };
        let mut s = ResponseStream::new(echo, OutputSplit::new(OutputShape { tools: Some(ToolCallFormat::Hermes), thinking: Some(false), ..Default::default() }), None);
        let events = feed_chars(&mut s, THINK_SAY_CALL);
        for (i, e) in events.iter().enumerate() {
            assert_eq!(e["sequence_number"], i, "{e}");
        }
        let last = events.last().unwrap();
        assert_eq!(last["type"], "response.completed");
        let kinds: Vec<&str> = last["response"]["output"].as_array().unwrap().iter().map(|i| i["type"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["reasoning", "message", "function_call"]);
        assert_eq!(last["response"]["output"][1]["content"][0]["text"], "Sure.");
        assert_eq!(last["response"]["output"][2]["arguments"], "{\"a\":1}");
        let text: String = events.iter().filter(|e| e["type"] == "response.output_text.delta").map(|e| e["delta"].as_str().unwrap()).collect();
        assert_eq!(text, "Sure.");
    }
}
