//! `POST /v1/chat/completions`: messages through the chat template (with the
//! request's `chat_template_kwargs`), the answer as one object or as
//! `chat.completion.chunk` SSE events, a leading `<think>` block split out as
//! `reasoning_content` (and `reasoning`, as other servers name it) when the
//! template thinks, tool calls read out of the text in the model family's
//! format.

use std::sync::Arc;

use actix_web::{web, HttpResponse};
use serde::Deserialize;
use serde_json::{json, Value};

use super::error::ApiError;
use super::generation::{self, error_chunk, progress_json, token_text, usage_json, with_cut_error, ChunkWriter};
use super::messages::{template_messages, ChatMessage};
use super::params::{fields, read_request};
use super::shutdown::CUT_FINISH_REASON;
use super::structured::{self, ToolChoice};
use super::AppState;
use super::params::CommonParams;
use crate::engine::{Event, Generation, TokenLogprob};
use crate::structured::Output;
use crate::tokenizer::harmony::{HarmonyPart, HarmonySplit};
use crate::tokenizer::reasoning::{self, Part, ReasoningSplit, ThinkMarkers};
use crate::tokenizer::qwen_xml::ParamTypes;
use crate::tokenizer::tool_calls::{self, StreamItem, ToolCall, ToolCallFormat, ToolCallStream};
use crate::tokenizer::{ChatRender, Tokenizer};

#[derive(Debug, Deserialize)]
struct ChatRequest {
    messages: Vec<ChatMessage>,
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    #[serde(default)]
    logprobs: bool,
    top_logprobs: Option<i64>,
    chat_template_kwargs: Option<Value>,
    /// false: at most one tool call is returned.
    parallel_tool_calls: Option<bool>,
    response_format: Option<Value>,
}

/// A request's `chat_template_kwargs`: extra variables for the chat template
/// (e.g. `{"enable_thinking": false}`), as an object.
pub(super) fn template_kwargs(kwargs: Option<Value>) -> Result<Option<Value>, ApiError> {
    match kwargs {
        None | Some(Value::Null) => Ok(None),
        Some(v @ Value::Object(_)) => Ok(Some(v)),
        Some(_) => Err(ApiError::bad_param("chat_template_kwargs", "chat_template_kwargs must be an object of template variables")),
    }
}

/// A tool in the Responses API's flat shape (`{"type": "function", "name",
/// "parameters"}`, which some clients send to chat completions too) nested
/// as chat templates and the tool-call grammar read tools, its own keys kept
/// and `parameters` an empty object schema where it has none (the API's
/// meaning of leaving it out); others as sent. The one rule for flat tools:
/// the Responses endpoint nests its tools with it too.
pub(super) fn nested_tool(tool: &Value) -> Value {
    match tool.as_object() {
        Some(flat) if !flat.contains_key("function") && flat.contains_key("name") => {
            let mut function: serde_json::Map<String, Value> = flat.iter().filter(|(k, _)| *k != "type").map(|(k, v)| (k.clone(), v.clone())).collect();
            if function.get("parameters").is_none_or(Value::is_null) {
                function.insert("parameters".into(), json!({"type": "object"}));
            }
            json!({"type": "function", "function": function})
        }
        _ => tool.clone(),
    }
}

/// The tools passed to the template, unless tool_choice is "none".
fn active_tools(req: &ChatRequest, choice: &ToolChoice) -> Result<Option<Value>, ApiError> {
    let Some(tools) = &req.tools else { return Ok(None) };
    let tools: Vec<Value> = tools.iter().map(nested_tool).collect();
    for (i, t) in tools.iter().enumerate() {
        if t.get("function").and_then(|f| f.get("name")).and_then(Value::as_str).is_none() {
            return Err(ApiError::bad_param(&format!("tools[{i}]"), format!("tools[{i}] needs function.name")));
        }
    }
    if *choice == ToolChoice::None || tools.is_empty() {
        return Ok(None);
    }
    Ok(Some(Value::Array(tools)))
}

fn logprob_entry(tokenizer: &Tokenizer, lp: &TokenLogprob) -> Value {
    let item = |id: u32, logprob: f32| {
        let text = token_text(tokenizer, id);
        json!({"token": text, "logprob": logprob, "bytes": text.as_bytes()})
    };
    let mut entry = item(lp.token, lp.logprob);
    entry["top_logprobs"] = Value::Array(lp.top.iter().map(|&(id, l)| item(id, l)).collect());
    entry
}

fn tool_call_json(call: &ToolCall) -> Value {
    json!({"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}})
}

pub async fn handle(payload: web::Payload, state: &AppState) -> Result<HttpResponse, ApiError> {
    let arriving = state.engine.arriving();
    let (body, common) = read_request(payload, state).await?;
    let req: ChatRequest = fields(&body)?;
    // -1 is mlx_lm.server's "none"; a count alone asks for log-probabilities
    // there too (OpenAI wants logprobs: true beside it).
    let top = match (req.logprobs, req.top_logprobs.filter(|&n| n != -1)) {
        (_, Some(n)) if !(0..=20).contains(&n) => {
            return Err(ApiError::bad_param("top_logprobs", format!("top_logprobs must be between 0 and 20 (or -1: none), got {n}")))
        }
        (true, n) => Some(n.unwrap_or(0) as usize),
        (false, Some(n)) if n > 0 => Some(n as usize),
        (false, _) => None,
    };
    let messages = template_messages(&req.messages)?;
    let choice = ToolChoice::openai(req.tool_choice.as_ref())?;
    let tools = active_tools(&req, &choice)?;
    let kwargs = template_kwargs(req.chat_template_kwargs)?;
    let schema = structured::format_schema(req.response_format.as_ref(), "response_format")?;
    let one_call = req.parallel_tool_calls == Some(false);
    let output = structured::wanted_output(&choice, tools.as_ref(), state.tool_format, !one_call, schema)?;
    let chat = ChatInput { messages, tools, kwargs, one_call };
    let (params, shape) = chat_generation(state, &common, chat, top, output, "response_format.json_schema.schema").await?;
    let rx = generation::submit(state, params, arriving)?;
    let meta = Meta { id: generation::response_id("chatcmpl"), created: generation::unix_now(), model: state.models.id.clone() };
    if common.stream {
        let writer = ChatStream {
            meta,
            tokenizer: state.tokenizer.clone(),
            split: OutputSplit::new(shape),
            calls: 0,
            include_usage: common.include_usage(),
        };
        return Ok(generation::sse_response(rx, writer, state));
    }
    let done = generation::collect(rx, state).await?;
    let (message, finish) = chat_message(shape, done.text, done.finish_reason.as_str());
    let logprobs = match top {
        Some(_) => json!({"content": done.logprobs.iter().map(|lp| logprob_entry(&state.tokenizer, lp)).collect::<Vec<_>>()}),
        None => Value::Null,
    };
    Ok(HttpResponse::Ok().json(json!({
        "id": meta.id,
        "object": "chat.completion",
        "created": meta.created,
        "model": meta.model,
        "choices": [{"index": 0, "message": message, "logprobs": logprobs, "finish_reason": finish}],
        "usage": usage_json(&done.usage),
    })))
}

/// A chat prompt: its ids, Some(whether the output starts inside `<think>`)
/// when the template thinks and the prompt leaves thinking on
/// (`reasoning::prompt_thinking`), and the positions whose KV the prompt
/// cache should keep on the way (the end of the system prompt, where the
/// model needs checkpoints).
pub(super) struct ChatPrompt {
    pub ids: Vec<u32>,
    pub thinking: Option<bool>,
    pub checkpoints: Vec<usize>,
}

/// A chat request's conversation, as every chat route hands it on.
pub(super) struct ChatInput {
    /// Template-ready messages.
    pub messages: Value,
    /// The active tools (None: none, or `tool_choice: none`).
    pub tools: Option<Value>,
    /// Extra chat template variables.
    pub kwargs: Option<Value>,
    /// Only the first tool call is kept.
    pub one_call: bool,
}

/// What a chat request asks the engine for, and how its output is taken
/// apart: the prompt (see `encode_prompt`), the output shape with the prompt's
/// thinking, the checkpoints and special tokens that shape needs, and the
/// grammar `output` asks for (errors naming `format_param`).
pub(super) async fn chat_generation(
    state: &AppState,
    common: &CommonParams,
    chat: ChatInput,
    logprobs: Option<usize>,
    output: Option<Output>,
    format_param: &'static str,
) -> Result<(Generation, OutputShape), ApiError> {
    let shape = OutputShape::of(state, chat.tools.as_ref(), chat.one_call);
    let ChatPrompt { ids, thinking, checkpoints } = encode_prompt(state, chat.messages, chat.tools, chat.kwargs).await?;
    let shape = OutputShape { thinking, ..shape };
    let mut params = common.generation(state, ids, logprobs)?;
    params.checkpoints = checkpoints;
    params.keep_special_tokens = shape.keeps_special_tokens();
    params.guide = structured::guide(state, output, thinking, format_param).await?;
    Ok((params, shape))
}

/// The prompt of template-ready `messages` (checked against the context
/// before tokenizing).
pub(super) async fn encode_prompt(state: &AppState, messages: Value, tools: Option<Value>, kwargs: Option<Value>) -> Result<ChatPrompt, ApiError> {
    let (tokenizer, limit, checkpoints) = (state.tokenizer.clone(), state.prompt_limit, state.prompt_checkpoints);
    let text_bytes = messages_bytes(&messages);
    let (ids, opens_thinking, checkpoints) = state
        .tokenize_pool
        .run(text_bytes, move || {
            let how = ChatRender { tools: tools.as_ref(), add_generation_prompt: true, kwargs: kwargs.as_ref() };
            let mut opens = None;
            let markers = tokenizer.think_markers();
            let ids = tokenizer.encode_chat_checked(&messages, &how, |text| {
                opens = reasoning::prompt_thinking(text, markers);
                limit.check_text(text.len(), "messages")
            })?;
            let checkpoints = match checkpoints {
                true => system_prompt_end(&tokenizer, &messages, &how, &ids).into_iter().collect(),
                false => Vec::new(),
            };
            Ok::<_, ApiError>((ids, opens, checkpoints))
        })
        .await?;
    let thinks = state.tokenizer.thinks();
    Ok(ChatPrompt { ids, thinking: opens_thinking.filter(|_| thinks), checkpoints })
}

/// Where the leading system messages end in `prompt` (mlx-lm's system
/// segment): those messages rendered before an empty user turn, compared token
/// by token with the whole prompt. None without system messages, or where the
/// shared part is empty or the whole prompt.
fn system_prompt_end(tokenizer: &Tokenizer, messages: &Value, how: &ChatRender, prompt: &[u32]) -> Option<usize> {
    let messages = messages.as_array()?;
    let n = messages.iter().take_while(|m| m["role"] == "system").count();
    if n == 0 {
        return None;
    }
    let mut head = messages[..n].to_vec();
    head.push(json!({"role": "user", "content": ""}));
    let how = ChatRender { tools: how.tools, add_generation_prompt: false, kwargs: how.kwargs };
    let ids = tokenizer.encode_chat_checked(&Value::Array(head), &how, |_| Ok::<(), crate::error::Error>(())).ok()?;
    let end = ids.iter().zip(prompt).take_while(|(a, b)| a == b).count();
    (end > 0 && end < prompt.len()).then_some(end)
}

/// Bytes of text in the messages (what the template renders, roughly).
pub(super) fn messages_bytes(messages: &Value) -> usize {
    match messages {
        Value::String(s) => s.len(),
        Value::Array(items) => items.iter().map(messages_bytes).sum(),
        Value::Object(fields) => fields.values().map(messages_bytes).sum(),
        _ => 0,
    }
}

/// The assistant message of a whole answer: its reasoning split out and tool
/// calls read out of the rest as `shape` says, and the finish reason that goes
/// with it.
fn chat_message(shape: OutputShape, text: String, finish: &'static str) -> (Value, &'static str) {
    let WholeOutput { reasoning: thought, content, calls } = whole_output(shape, text);
    let mut message = json!({"role": "assistant", "content": content});
    if let Some(thought) = thought {
        message["reasoning_content"] = json!(thought);
        message["reasoning"] = json!(thought);
    }
    if calls.is_empty() {
        return (message, finish);
    }
    if content.trim().is_empty() {
        message["content"] = Value::Null;
    }
    message["tool_calls"] = Value::Array(calls.iter().map(tool_call_json).collect());
    (message, calls_finish(finish))
}

/// The finish reason of an answer that holds tool calls: `tool_calls` where
/// it stopped, `length` where it was cut (as mlx_lm.server: a cut answer must
/// not look complete).
fn calls_finish(finish: &'static str) -> &'static str {
    if finish == "stop" {
        "tool_calls"
    } else {
        finish
    }
}

/// A whole answer taken apart: its reasoning (when the template thinks), its
/// text, and the tool calls read out of it (when a format is active).
pub(super) struct WholeOutput {
    pub reasoning: Option<String>,
    pub content: String,
    pub calls: Vec<ToolCall>,
}

/// How a request's output is taken apart.
#[derive(Debug, Clone, Default)]
pub(super) struct OutputShape {
    /// The tool-call format, when the request has tools and the model's format is known.
    pub tools: Option<ToolCallFormat>,
    /// Some(whether the output starts inside a reasoning block) when the template thinks.
    pub thinking: Option<bool>,
    /// How the model's reasoning block opens and closes.
    pub think: ThinkMarkers,
    /// `parallel_tool_calls: false`: only the first tool call is kept.
    pub one_call: bool,
    /// The model writes Harmony messages (gpt-oss): channels give reasoning,
    /// content and tool calls, in place of `thinking` and `tools`.
    pub harmony: bool,
    /// The tools' parameter types, for a format whose values are bare text (Qwen XML, GLM).
    pub param_types: Option<Arc<ParamTypes>>,
}

impl OutputShape {
    /// The shape of a request to `state`'s model with `tools` (Some when they
    /// are active); `thinking` is the rendered prompt's to say.
    pub fn of(state: &AppState, tools: Option<&Value>, one_call: bool) -> OutputShape {
        let format = tools.and(state.tool_format);
        let param_types = match (format, tools) {
            (Some(ToolCallFormat::QwenXml | ToolCallFormat::Glm47), Some(t)) => Some(Arc::new(ParamTypes::from_tools(t))),
            _ => None,
        };
        OutputShape { tools: format, thinking: None, think: state.tokenizer.think_markers(), one_call, harmony: state.harmony, param_types }
    }

    /// Whether the output must keep its special tokens: they are the markers
    /// the split reads (Harmony's headers, Mistral's `[TOOL_CALLS]`, Gemma 4's
    /// call blocks and thought channel).
    pub fn keeps_special_tokens(&self) -> bool {
        let gemma_thinks = self.thinking.is_some() && self.think == reasoning::GEMMA4_THOUGHT;
        self.harmony || matches!(self.tools, Some(ToolCallFormat::Mistral | ToolCallFormat::Gemma4)) || gemma_thinks
    }
}

pub(super) fn whole_output(shape: OutputShape, text: String) -> WholeOutput {
    if shape.harmony {
        // The streaming split fed in one piece, so streamed and whole answers agree.
        let mut split = OutputSplit::new(shape);
        let (mut reasoning, mut content, mut calls) = (None::<String>, String::new(), Vec::new());
        for piece in split.push(&text, true) {
            match piece {
                Piece::Reasoning(t) => reasoning.get_or_insert_with(String::new).push_str(&t),
                Piece::Item(StreamItem::Content(t)) => content.push_str(&t),
                Piece::Item(StreamItem::Call(c)) => calls.push(c),
            }
        }
        return WholeOutput { reasoning, content, calls };
    }
    let (reasoning, text) = match shape.thinking {
        Some(starts_inside) => reasoning::split_whole(&text, shape.think, starts_inside),
        None => (None, text),
    };
    match shape.tools {
        Some(f) => {
            let mut parsed = tool_calls::parse_with(f, &text, shape.param_types.clone());
            if shape.one_call {
                parsed.tool_calls.truncate(1);
            }
            WholeOutput { reasoning, content: parsed.content, calls: parsed.tool_calls }
        }
        None => WholeOutput { reasoning, content: text, calls: Vec::new() },
    }
}

/// What a streamed piece of output becomes: reasoning, or content / a tool call.
pub(super) enum Piece {
    Reasoning(String),
    Item(StreamItem),
}

impl From<HarmonyPart> for Piece {
    fn from(part: HarmonyPart) -> Piece {
        match part {
            HarmonyPart::Reasoning(t) => Piece::Reasoning(t),
            HarmonyPart::Content(t) => Piece::Item(StreamItem::Content(t)),
            HarmonyPart::Call(c) => Piece::Item(StreamItem::Call(c)),
        }
    }
}

/// The streaming twin of [`whole_output`]: text in, pieces out.
pub(super) struct OutputSplit {
    /// Present for Harmony output: splits it by channel (in place of the two below).
    harmony: Option<HarmonySplit>,
    /// Present when the template thinks: splits `<think>` text out.
    reasoning: Option<ReasoningSplit>,
    /// Present when the request has tools and the model's format is known.
    tools: Option<ToolCallStream>,
    one_call: bool,
    calls: usize,
}

impl OutputSplit {
    pub fn new(shape: OutputShape) -> OutputSplit {
        OutputSplit {
            harmony: shape.harmony.then(HarmonySplit::new),
            reasoning: shape.thinking.map(|starts| ReasoningSplit::new(shape.think, starts)),
            tools: shape.tools.map(|f| ToolCallStream::with_types(f, shape.param_types.clone())),
            one_call: shape.one_call,
            calls: 0,
        }
    }

    /// The settled pieces after `text`; `finish` flushes what is held.
    pub fn push(&mut self, text: &str, finish: bool) -> Vec<Piece> {
        let out = match self.harmony.as_mut() {
            Some(h) => {
                let mut parts = h.push(text);
                if finish {
                    parts.extend(h.finish());
                }
                parts.into_iter().map(Piece::from).collect()
            }
            None => self.split_text(text, finish),
        };
        self.keep_calls(out)
    }

    /// Reasoning, then tool calls, split out of `text`.
    fn split_text(&mut self, text: &str, finish: bool) -> Vec<Piece> {
        let parts = match self.reasoning.as_mut() {
            Some(r) => {
                let mut parts = r.push(text);
                if finish {
                    parts.extend(r.finish());
                }
                parts
            }
            None => vec![Part::Content(text.to_string())],
        };
        let mut out = Vec::new();
        for part in parts {
            match (part, self.tools.as_mut()) {
                (Part::Reasoning(t), _) => out.push(Piece::Reasoning(t)),
                (Part::Content(t), Some(tools)) => out.extend(tools.push(&t).into_iter().map(Piece::Item)),
                (Part::Content(t), None) => out.push(Piece::Item(StreamItem::Content(t))),
            }
        }
        if let (true, Some(tools)) = (finish, self.tools.as_mut()) {
            out.extend(tools.finish().into_iter().map(Piece::Item));
        }
        out
    }

    /// `out` with only the first tool call where one is asked for.
    fn keep_calls(&mut self, mut out: Vec<Piece>) -> Vec<Piece> {
        if self.one_call {
            let calls = &mut self.calls;
            out.retain(|p| match p {
                Piece::Item(StreamItem::Call(_)) => {
                    *calls += 1;
                    *calls == 1
                }
                _ => true,
            });
        }
        out
    }
}

struct Meta {
    id: String,
    created: u64,
    model: String,
}

/// `chat.completion.chunk` events.
struct ChatStream {
    meta: Meta,
    tokenizer: Arc<Tokenizer>,
    split: OutputSplit,
    /// Tool calls sent so far (their `index`).
    calls: usize,
    include_usage: bool,
}

impl ChatStream {
    fn chunk(&self, delta: Value, logprobs: Value, finish_reason: Value) -> Value {
        let mut c = json!({
            "id": self.meta.id,
            "object": "chat.completion.chunk",
            "created": self.meta.created,
            "model": self.meta.model,
            "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}],
        });
        if self.include_usage {
            c["usage"] = Value::Null;
        }
        c
    }

    /// Chunks for a piece of text (through the reasoning split and the
    /// tool-call parser when active).
    fn text_chunks(&mut self, items: Vec<Piece>, mut logprobs: Value, out: &mut Vec<Value>) {
        for item in items {
            let delta = match item {
                Piece::Reasoning(text) => json!({"reasoning_content": text, "reasoning": text}),
                Piece::Item(StreamItem::Content(text)) if text.is_empty() => continue,
                Piece::Item(StreamItem::Content(text)) => json!({"content": text}),
                Piece::Item(StreamItem::Call(call)) => {
                    let mut c = tool_call_json(&call);
                    c["index"] = json!(self.calls);
                    self.calls += 1;
                    json!({"tool_calls": [c]})
                }
            };
            out.push(self.chunk(delta, std::mem::take(&mut logprobs), Value::Null));
        }
        // A token whose text is held back still reports its log-probability.
        if !logprobs.is_null() {
            out.push(self.chunk(json!({"content": ""}), logprobs, Value::Null));
        }
    }
}

impl ChunkWriter for ChatStream {
    fn start(&mut self) -> Vec<Value> {
        vec![self.chunk(json!({"role": "assistant", "content": ""}), Value::Null, Value::Null)]
    }

    fn write(&mut self, event: Event) -> Vec<Value> {
        let mut out = Vec::new();
        match event {
            Event::Token { text, logprob, .. } => {
                let logprobs = match &logprob {
                    Some(lp) => json!({"content": [logprob_entry(&self.tokenizer, lp)]}),
                    None => Value::Null,
                };
                let items = self.split.push(&text, false);
                self.text_chunks(items, logprobs, &mut out);
            }
            Event::Done { text, finish_reason, usage, .. } => {
                let items = self.split.push(&text, true);
                self.text_chunks(items, Value::Null, &mut out);
                let reason = if self.calls > 0 { calls_finish(finish_reason.as_str()) } else { finish_reason.as_str() };
                out.push(self.chunk(json!({}), Value::Null, json!(reason)));
                if self.include_usage {
                    out.push(json!({
                        "id": self.meta.id,
                        "object": "chat.completion.chunk",
                        "created": self.meta.created,
                        "model": self.meta.model,
                        "choices": [],
                        "usage": usage_json(&usage),
                    }));
                }
            }
            Event::Error(message) => out.push(error_chunk(&message)),
            Event::Progress(p) => {
                let mut c = self.chunk(json!({}), Value::Null, Value::Null);
                c["prompt_progress"] = progress_json(&p);
                out.push(c);
            }
        }
        out
    }

    fn cut(&mut self, message: &str) -> Vec<Value> {
        vec![with_cut_error(self.chunk(json!({}), Value::Null, json!(CUT_FINISH_REASON)), message)]
    }
}

/// The tool-call format in effect: the `--tool-call-parser` flag, else the
/// one the chat template shows.
pub fn tool_format(flag: Option<&str>, tokenizer: &Tokenizer) -> crate::error::Result<Option<ToolCallFormat>> {
    match flag {
        Some(name) => ToolCallFormat::from_name(name).map(Some).map_err(crate::error::Error::Config),
        None => Ok(tokenizer.chat_template_source().and_then(ToolCallFormat::detect)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{FinishReason, Usage};

    #[test]
    fn flat_tools_are_nested_with_their_own_keys_and_an_empty_schema_where_they_have_none() {
        let flat = json!({"type": "function", "name": "f", "description": "d", "strict": true});
        assert_eq!(nested_tool(&flat), json!({"type": "function", "function": {"name": "f", "description": "d", "strict": true, "parameters": {"type": "object"}}}));
        let with_schema = json!({"type": "function", "name": "g", "parameters": {"type": "object", "properties": {"x": {"type": "number"}}}});
        assert_eq!(nested_tool(&with_schema)["function"]["parameters"], with_schema["parameters"]);
        let nested = json!({"type": "function", "function": {"name": "h"}});
        assert_eq!(nested_tool(&nested), nested, "nested tools go to the template as sent");
    }

    /// ChatStream reads token texts from its tokenizer only for log-probabilities.
    fn tokenizer() -> Arc<Tokenizer> {
        Arc::new(Tokenizer::two_words())
    }

    fn stream(format: Option<ToolCallFormat>) -> ChatStream {
        thinking_stream(format, None)
    }

    fn thinking_stream(format: Option<ToolCallFormat>, thinking: Option<bool>) -> ChatStream {
        ChatStream {
            meta: Meta { id: "chatcmpl-x".into(), created: 1, model: "m".into() },
            tokenizer: tokenizer(),
            split: OutputSplit::new(OutputShape { tools: format, thinking, ..Default::default() }),
            calls: 0,
            include_usage: false,
        }
    }

    fn token(text: &str) -> Event {
        Event::Token { token: 0, text: text.into(), logprob: None }
    }

    fn done() -> Event {
        Event::Done { text: String::new(), finish_reason: FinishReason::Stop, stop_sequence: None, usage: Usage::default() }
    }

    #[test]
    fn hermes_tool_calls_stream_as_tool_call_deltas_with_finish_reason_tool_calls() {
        let mut s = stream(Some(ToolCallFormat::Hermes));
        let text = "Let me look.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
        let mut chunks = Vec::new();
        // Split into small pieces, as tokens arrive.
        let chars: Vec<char> = text.chars().collect();
        for piece in chars.chunks(3) {
            chunks.extend(s.write(token(&piece.iter().collect::<String>())));
        }
        chunks.extend(s.write(done()));
        let deltas: Vec<&Value> = chunks.iter().map(|c| &c["choices"][0]["delta"]).collect();
        let content: String = deltas.iter().filter_map(|d| d["content"].as_str()).collect();
        assert_eq!(content, "Let me look.");
        let calls: Vec<&Value> = deltas.iter().filter_map(|d| d.get("tool_calls")).collect();
        assert_eq!(calls.len(), 1);
        let call = &calls[0][0];
        assert_eq!(call["index"], 0);
        assert_eq!(call["type"], "function");
        assert!(call["id"].as_str().unwrap().starts_with("call_"));
        assert_eq!(call["function"]["name"], "get_weather");
        let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
        assert_eq!(args, json!({"city": "Paris"}));
        assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "tool_calls");
    }

    #[test]
    fn without_tools_the_same_text_is_plain_content() {
        let mut s = stream(None);
        let mut chunks = s.write(token("<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>"));
        chunks.extend(s.write(done()));
        assert!(chunks.iter().all(|c| c["choices"][0]["delta"].get("tool_calls").is_none()));
        assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "stop");
    }

    #[test]
    fn whole_answers_carry_tool_calls_and_null_content() {
        let text = "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>";
        let (msg, finish) = chat_message(OutputShape { tools: Some(ToolCallFormat::Hermes), ..Default::default() }, text.into(), "stop");
        assert_eq!(finish, "tool_calls");
        assert!(msg["content"].is_null());
        assert_eq!(msg["tool_calls"][0]["function"]["name"], "add");
        assert_eq!(msg["tool_calls"][0]["function"]["arguments"], "{\"a\":1,\"b\":2}");
        let (msg, finish) = chat_message(OutputShape { tools: Some(ToolCallFormat::Hermes), ..Default::default() }, "no calls here".into(), "length");
        assert_eq!((msg["content"].as_str(), finish), (Some("no calls here"), "length"));
        assert!(msg.get("tool_calls").is_none());
        // A call in an answer cut at max_tokens: still `length`, as mlx_lm.server says.
        let (msg, finish) = chat_message(OutputShape { tools: Some(ToolCallFormat::Hermes), ..Default::default() }, text.into(), "length");
        assert_eq!((msg["tool_calls"][0]["function"]["name"].as_str(), finish), (Some("add"), "length"));
    }

    #[test]
    fn think_blocks_stream_as_reasoning_deltas_before_content_and_tool_calls() {
        let mut s = thinking_stream(Some(ToolCallFormat::Hermes), Some(false));
        let text = "<think>\nThe user wants weather.\n</think>\n\nChecking.<tool_call>\n{\"name\": \"w\", \"arguments\": {}}\n</tool_call>";
        let chars: Vec<char> = text.chars().collect();
        let mut chunks = Vec::new();
        for piece in chars.chunks(2) {
            chunks.extend(s.write(token(&piece.iter().collect::<String>())));
        }
        chunks.extend(s.write(done()));
        let deltas: Vec<&Value> = chunks.iter().map(|c| &c["choices"][0]["delta"]).collect();
        let reasoning: String = deltas.iter().filter_map(|d| d["reasoning_content"].as_str()).collect();
        let also: String = deltas.iter().filter_map(|d| d["reasoning"].as_str()).collect();
        let content: String = deltas.iter().filter_map(|d| d["content"].as_str()).collect();
        assert_eq!(reasoning, "\nThe user wants weather.\n");
        assert_eq!(also, reasoning);
        assert_eq!(content, "Checking.");
        assert!(deltas.iter().any(|d| d.get("tool_calls").is_some()));
        // Reasoning comes first: no content delta before the last reasoning one.
        let last_reasoning = deltas.iter().rposition(|d| d.get("reasoning_content").is_some()).unwrap();
        let first_content = deltas.iter().position(|d| d["content"].as_str().is_some_and(|c| !c.is_empty())).unwrap();
        assert!(last_reasoning < first_content);

        let (msg, _) = chat_message(OutputShape { thinking: Some(true), ..Default::default() }, "hmm</think>\n4".into(), "stop");
        assert_eq!((msg["reasoning_content"].as_str(), msg["reasoning"].as_str(), msg["content"].as_str()), (Some("hmm"), Some("hmm"), Some("4")));
        let (msg, _) = chat_message(OutputShape { thinking: Some(false), ..Default::default() }, "4".into(), "stop");
        assert!(msg.get("reasoning_content").is_none(), "{msg}");
    }

    #[test]
    fn without_parallel_tool_calls_only_the_first_call_is_kept_whole_or_streamed() {
        let call = |n: &str| format!("<tool_call>{{\"name\": \"{n}\", \"arguments\": {{}}}}</tool_call>");
        let text = format!("{}{}", call("first"), call("second"));
        let shape = OutputShape { tools: Some(ToolCallFormat::Hermes), one_call: true, ..Default::default() };
        let out = whole_output(shape.clone(), text.clone());
        assert_eq!(out.calls.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["first"]);
        let all = whole_output(OutputShape { one_call: false, ..shape.clone() }, text.clone());
        assert_eq!(all.calls.len(), 2);
        let mut split = OutputSplit::new(shape);
        let mut pieces: Vec<Piece> = text.chars().flat_map(|c| split.push(&c.to_string(), false)).collect();
        pieces.extend(split.push("", true));
        let names: Vec<String> = pieces
            .iter()
            .filter_map(|p| match p {
                Piece::Item(StreamItem::Call(c)) => Some(c.name.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(names, ["first"]);
    }

    // gpt-oss's Harmony channels: analysis → reasoning deltas, final → content,
    // a message to functions.NAME → a tool call; streamed token by token (the
    // markers arrive as whole special tokens) and whole alike.
    #[test]
    fn harmony_channels_become_reasoning_content_and_tool_calls() {
        let shape = OutputShape { harmony: true, ..Default::default() };
        assert!(shape.keeps_special_tokens());
        let tokens = [
            "<|channel|>", "analysis", "<|message|>", "Need", " weather.", "<|end|>", "<|start|>", "assistant", "<|channel|>",
            "commentary to=functions.get_weather ", "<|constrain|>", "json", "<|message|>", "{\"city\":", " \"Paris\"}",
        ];
        let mut s = ChatStream {
            meta: Meta { id: "chatcmpl-x".into(), created: 1, model: "m".into() },
            tokenizer: tokenizer(),
            split: OutputSplit::new(shape.clone()),
            calls: 0,
            include_usage: false,
        };
        let mut chunks = Vec::new();
        for t in tokens {
            chunks.extend(s.write(token(t)));
        }
        chunks.extend(s.write(done()));
        let deltas: Vec<&Value> = chunks.iter().map(|c| &c["choices"][0]["delta"]).collect();
        let reasoning: String = deltas.iter().filter_map(|d| d["reasoning_content"].as_str()).collect();
        let content: String = deltas.iter().filter_map(|d| d["content"].as_str()).collect();
        assert_eq!((reasoning.as_str(), content.as_str()), ("Need weather.", ""));
        let calls: Vec<&Value> = deltas.iter().filter_map(|d| d.get("tool_calls")).collect();
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0][0]["function"]["name"], "get_weather");
        assert_eq!(calls[0][0]["function"]["arguments"], "{\"city\":\"Paris\"}");
        assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "tool_calls");

        let (msg, finish) = chat_message(shape.clone(), tokens.concat(), "stop");
        assert_eq!((msg["reasoning_content"].as_str(), finish), (Some("Need weather."), "tool_calls"));
        assert!(msg["content"].is_null(), "{msg}");
        let (msg, finish) = chat_message(shape, "<|channel|>analysis<|message|>2+2<|end|><|start|>assistant<|channel|>final<|message|>4".into(), "stop");
        assert_eq!((msg["reasoning"].as_str(), msg["content"].as_str(), finish), (Some("2+2"), Some("4"), "stop"));
    }
}
