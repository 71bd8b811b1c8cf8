//! Tool (function) calls in model output, for the OpenAI `tool_calls` response field.
//!
//! Models announce a call with text that differs by family; we recognise the three
//! formats that mlx-lm and vLLM parse:
//! - `Hermes` (Qwen2/2.5/3, Hermes, ...): `<tool_call>{"name": .., "arguments": {..}}</tool_call>`
//!   blocks anywhere in the text; the text outside them is content.
//! - `Llama3Json` (Llama 3.1–3.3): the whole output is `{"name": .., "parameters": {..}}`
//!   objects separated by `;`, maybe after `<|python_tag|>`; anything else is content.
//! - `Mistral`: content, then `[TOOL_CALLS]` and either a JSON array of calls (tokenizers
//!   before v11) or `name[ARGS]{..}` per call, each after its own `[TOOL_CALLS]` (v11+).
//! - `QwenXml` (Qwen3-Coder, Qwen3.5): `<tool_call>` blocks as Hermes, each holding
//!   `<function=NAME>` with `<parameter=P>value</parameter>` lines (see `qwen_xml`).
//! - `Gemma4`: `<|tool_call>call:NAME{..}<tool_call|>` blocks, the arguments in Gemma's
//!   literal syntax (see `gemma4`).
//! - `Glm47` (GLM-4.5/4.6/4.7): `<tool_call>NAME` blocks with `<arg_key>`/`<arg_value>`
//!   pairs (see `glm`).
//!
//! Whole-text parsing is the streaming parser fed in one piece, so a streamed response
//! and a non-streamed one of the same text can never disagree. Text that looks like a
//! call but does not parse stays content, markers included: the client then sees what
//! the model wrote instead of losing it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Deserializer, Value};

use super::gemma4;
use super::glm;
use super::qwen_xml::{self, ParamTypes};

pub(crate) const HERMES_START: &str = "<tool_call>";
pub(crate) const HERMES_END: &str = "</tool_call>";
pub(crate) const MISTRAL_CALLS: &str = "[TOOL_CALLS]";
const MISTRAL_ARGS: &str = "[ARGS]";
const MISTRAL_CALL_ID: &str = "[CALL_ID]";
const PYTHON_TAG: &str = "<|python_tag|>";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolCallFormat {
    Hermes,
    Llama3Json,
    Mistral,
    QwenXml,
    Gemma4,
    Glm47,
}

impl ToolCallFormat {
    /// The names `from_name` accepts, in the order `--help` should list them.
    pub const NAMES: [&'static str; 6] = ["hermes", "llama3_json", "mistral", "qwen3_coder", "gemma4", "glm47"];

    /// Picks the format from the chat template source text; None when the template
    /// shows no tool support. A template renders earlier assistant tool calls the way
    /// the model was trained to write them, so its markers name the output format.
    pub fn detect(chat_template: &str) -> Option<ToolCallFormat> {
        let t = chat_template;
        if t.contains(gemma4::CALL_START) && t.contains(gemma4::CALL_END) {
            Some(ToolCallFormat::Gemma4)
        // GLM's template writes `<tool_call>` too; its argument tags tell (mlx-lm checks the same).
        } else if t.contains(glm::ARG_KEY) {
            Some(ToolCallFormat::Glm47)
        // Qwen3-Coder's template also writes `<tool_call>`: the function tag tells.
        } else if t.contains(HERMES_START) && t.contains(qwen_xml::FUNCTION_START) {
            Some(ToolCallFormat::QwenXml)
        } else if t.contains(HERMES_START) {
            Some(ToolCallFormat::Hermes)
        } else if t.contains(MISTRAL_CALLS) || t.contains("[AVAILABLE_TOOLS]") {
            Some(ToolCallFormat::Mistral)
        } else if t.contains(PYTHON_TAG)
            || t.contains("Environment: ipython")
            // Llama 3.2's "Respond in the format {"name": function name, "parameters": ...}".
            || (t.contains("<|start_header_id|>") && t.contains("\"parameters\""))
        {
            Some(ToolCallFormat::Llama3Json)
        } else {
            None
        }
    }

    /// Parses a `--tool-call-parser` value.
    pub fn from_name(name: &str) -> Result<ToolCallFormat, String> {
        match name {
            "hermes" => Ok(ToolCallFormat::Hermes),
            "llama3_json" => Ok(ToolCallFormat::Llama3Json),
            "mistral" => Ok(ToolCallFormat::Mistral),
            "qwen3_coder" => Ok(ToolCallFormat::QwenXml),
            "gemma4" => Ok(ToolCallFormat::Gemma4),
            "glm47" => Ok(ToolCallFormat::Glm47),
            other => {
                Err(format!("unknown tool-call parser {other:?}; valid names: {}", Self::NAMES.join(", ")))
            }
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ToolCallFormat::Hermes => "hermes",
            ToolCallFormat::Llama3Json => "llama3_json",
            ToolCallFormat::Mistral => "mistral",
            ToolCallFormat::QwenXml => "qwen3_coder",
            ToolCallFormat::Gemma4 => "gemma4",
            ToolCallFormat::Glm47 => "glm47",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// `call_` and 24 alphanumerics, unique within the process.
    pub id: String,
    pub name: String,
    /// Compact JSON text of the arguments object, as OpenAI sends it.
    pub arguments: String,
}

impl ToolCall {
    /// A call with a fresh id.
    pub fn new(name: impl Into<String>, arguments: impl Into<String>) -> ToolCall {
        ToolCall { id: next_call_id(), name: name.into(), arguments: arguments.into() }
    }
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct ParsedOutput {
    /// The text outside tool calls, verbatim (the separators around calls included, so it
    /// can be whitespace only: callers may treat that as no content).
    pub content: String,
    pub tool_calls: Vec<ToolCall>,
}

/// Whole-text parse, for non-streaming responses. Never fails: text that does not
/// parse as a call is content.
pub fn parse(format: ToolCallFormat, text: &str) -> ParsedOutput {
    parse_with(format, text, None)
}

/// [`parse`] with the request's parameter types (the XML format's values are bare text).
pub fn parse_with(format: ToolCallFormat, text: &str, types: Option<Arc<ParamTypes>>) -> ParsedOutput {
    let mut stream = ToolCallStream::with_types(format, types);
    let mut items = stream.push(text);
    items.extend(stream.finish());
    let mut out = ParsedOutput::default();
    for item in items {
        match item {
            StreamItem::Content(s) => out.content.push_str(&s),
            StreamItem::Call(c) => out.tool_calls.push(c),
        }
    }
    out
}

#[derive(Debug, Clone, PartialEq)]
pub enum StreamItem {
    Content(String),
    Call(ToolCall),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Ordinary text, watched for the format's start marker (Llama: none, all content).
    Text,
    /// Block formats (Hermes, Qwen XML, Gemma 4), after the block's start marker: the
    /// call body until its end marker.
    InCall,
    /// Everything from here on is call text, parsed at finish(): Mistral after
    /// `[TOOL_CALLS]` (calls follow one another with nothing to close them), Llama output
    /// that opens like a call (only the whole text tells whether it is one).
    Tail,
    /// Llama, before the first non-whitespace text, or while that text is still a
    /// prefix of `<|python_tag|>`.
    LlamaStart,
}

/// Streaming parser: text deltas in, content and completed calls out. Content is
/// released as soon as it cannot be the start of a marker; only a possible marker
/// prefix at its end (`<tool`, `[TOOL_`) is held back.
#[derive(Debug, Clone)]
pub struct ToolCallStream {
    format: ToolCallFormat,
    state: State,
    /// Text received but not yet given out.
    buf: String,
    /// The request's parameter types, for the XML format.
    types: Option<Arc<ParamTypes>>,
}

impl ToolCallStream {
    pub fn new(format: ToolCallFormat) -> Self {
        ToolCallStream::with_types(format, None)
    }

    pub fn with_types(format: ToolCallFormat, types: Option<Arc<ParamTypes>>) -> Self {
        ToolCallStream { format, state: initial_state(format), buf: String::new(), types }
    }

    /// The call in a block body, in this stream's format.
    fn block_call(&self, body: &str) -> Option<ToolCall> {
        match self.format {
            ToolCallFormat::QwenXml => qwen_xml::call(body, self.types.as_deref()).or_else(|| hermes_call(body)),
            ToolCallFormat::Gemma4 => gemma4::call(body),
            ToolCallFormat::Glm47 => glm::call(body, self.types.as_deref()).or_else(|| hermes_call(body)),
            _ => hermes_call(body),
        }
    }

    /// Takes the next delta; returns the content and calls it completes.
    pub fn push(&mut self, delta: &str) -> Vec<StreamItem> {
        self.buf.push_str(delta);
        let mut out = Vec::new();
        // Each pass either stops or consumes a marker and changes state, so this ends.
        loop {
            match self.state {
                State::LlamaStart => {
                    let t = self.buf.trim_start();
                    if t.starts_with('{') || t.starts_with(PYTHON_TAG) {
                        self.state = State::Tail;
                    } else if t.is_empty() || PYTHON_TAG.starts_with(t) {
                        break;
                    } else {
                        self.state = State::Text;
                    }
                }
                State::Text => {
                    let Some(marker) = start_marker(self.format) else {
                        push_content(&mut out, std::mem::take(&mut self.buf));
                        break;
                    };
                    if let Some(i) = self.buf.find(marker) {
                        push_content(&mut out, take_front(&mut self.buf, i));
                        take_front(&mut self.buf, marker.len());
                        self.state = match block_markers(self.format) {
                            Some(_) => State::InCall,
                            None => State::Tail,
                        };
                    } else {
                        let keep = held_len(&self.buf, marker);
                        let ready = self.buf.len().saturating_sub(keep);
                        push_content(&mut out, take_front(&mut self.buf, ready));
                        break;
                    }
                }
                State::InCall => {
                    let (start, end) = block_markers(self.format).unwrap_or((HERMES_START, HERMES_END));
                    let Some(j) = self.buf.find(end) else { break };
                    let body = take_front(&mut self.buf, j);
                    take_front(&mut self.buf, end.len());
                    match self.block_call(&body) {
                        Some(call) => out.push(StreamItem::Call(call)),
                        None => push_content(&mut out, format!("{start}{body}{end}")),
                    }
                    self.state = State::Text;
                }
                State::Tail => break,
            }
        }
        out
    }

    /// Ends the stream: gives out what is held, parsing buffered call text. The stream is
    /// then as new.
    pub fn finish(&mut self) -> Vec<StreamItem> {
        let text = std::mem::take(&mut self.buf);
        let state = std::mem::replace(&mut self.state, initial_state(self.format));
        let mut out = Vec::new();
        match (state, self.format) {
            // An unclosed block is still a call when its body is one whole call object, as
            // vLLM reads it (a model that ends on the object, a stop string eating the tag).
            (State::InCall, format) => match self.block_call(&text) {
                Some(call) => out.push(StreamItem::Call(call)),
                None => push_content(&mut out, format!("{}{text}", block_markers(format).map_or(HERMES_START, |m| m.0))),
            },
            (State::Tail, ToolCallFormat::Mistral) => mistral_tail(&text, &mut out),
            (State::Tail, ToolCallFormat::Llama3Json) => match llama_calls(&text) {
                Some(calls) => out.extend(calls.into_iter().map(StreamItem::Call)),
                None => push_content(&mut out, text),
            },
            _ => push_content(&mut out, text),
        }
        out
    }
}

fn initial_state(format: ToolCallFormat) -> State {
    match format {
        ToolCallFormat::Llama3Json => State::LlamaStart,
        _ => State::Text,
    }
}

fn start_marker(format: ToolCallFormat) -> Option<&'static str> {
    match format {
        ToolCallFormat::Mistral => Some(MISTRAL_CALLS),
        ToolCallFormat::Llama3Json => None,
        block => block_markers(block).map(|m| m.0),
    }
}

/// The start and end markers of a format whose calls come in closed blocks.
pub(crate) fn block_markers(format: ToolCallFormat) -> Option<(&'static str, &'static str)> {
    match format {
        ToolCallFormat::Hermes | ToolCallFormat::QwenXml | ToolCallFormat::Glm47 => Some((HERMES_START, HERMES_END)),
        ToolCallFormat::Gemma4 => Some((gemma4::CALL_START, gemma4::CALL_END)),
        ToolCallFormat::Mistral | ToolCallFormat::Llama3Json => None,
    }
}

/// Appends content, merging with a preceding content item, never adding an empty one.
fn push_content(out: &mut Vec<StreamItem>, text: String) {
    if text.is_empty() {
        return;
    }
    match out.last_mut() {
        Some(StreamItem::Content(prev)) => prev.push_str(&text),
        _ => out.push(StreamItem::Content(text)),
    }
}

/// Removes and returns `buf[..at]`. Callers pass the start or end of an ASCII marker
/// found in `buf`, always a char boundary; anything else takes nothing rather than panic.
fn take_front(buf: &mut String, at: usize) -> String {
    if !buf.is_char_boundary(at) {
        return String::new();
    }
    let rest = buf.split_off(at); // cannot panic: `at` is a char boundary (checked above)
    std::mem::replace(buf, rest)
}

/// Length of the longest end of `text` that is a proper prefix of `marker`, which the
/// next delta may complete. Markers are ASCII, so that end starts on a char boundary.
fn held_len(text: &str, marker: &str) -> usize {
    (1..marker.len())
        .rev()
        .find(|&k| marker.get(..k).is_some_and(|prefix| text.ends_with(prefix)))
        .unwrap_or(0)
}

/// The JSON value at the start of `text` (after whitespace) and the text after it.
fn leading_json(text: &str) -> Option<(Value, &str)> {
    let mut values = Deserializer::from_str(text).into_iter::<Value>();
    let value = values.next()?.ok()?;
    Some((value, text.get(values.byte_offset()..)?))
}

/// `{"name": .., "arguments"|"parameters": ..}`, or that object under a `"function"`
/// key as in OpenAI's own message format; None when `v` is not a call.
fn call_from_object(v: &Value) -> Option<ToolCall> {
    let obj = v.as_object()?;
    if let (None, Some(inner @ Value::Object(_))) = (obj.get("name"), obj.get("function")) {
        return call_from_object(inner);
    }
    let name = obj.get("name")?.as_str()?.trim();
    if name.is_empty() {
        return None;
    }
    let arguments = arguments_text(obj.get("arguments").or_else(|| obj.get("parameters")))?;
    Some(ToolCall::new(name, arguments))
}

/// Compact JSON text of the arguments: an object; a string holding an object's JSON text
/// (some Hermes fine-tunes encode the arguments twice); nothing or null for a call that
/// takes none. Anything else is no call, since OpenAI arguments are always an object.
fn arguments_text(args: Option<&Value>) -> Option<String> {
    match args {
        None | Some(Value::Null) => Some("{}".to_string()),
        Some(v @ Value::Object(_)) => Some(v.to_string()),
        Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
            Ok(v @ Value::Object(_)) => Some(v.to_string()),
            _ => None,
        },
        Some(_) => None,
    }
}

/// The call in a Hermes block body: exactly one JSON call object.
fn hermes_call(body: &str) -> Option<ToolCall> {
    call_from_object(&serde_json::from_str::<Value>(body.trim()).ok()?)
}

/// The calls of a whole Llama 3 output: `[<|python_tag|>]obj(;obj)*[;]`; None unless
/// all of the text is calls.
fn llama_calls(text: &str) -> Option<Vec<ToolCall>> {
    let trimmed = text.trim_start();
    let mut rest = trimmed.strip_prefix(PYTHON_TAG).unwrap_or(trimmed);
    let mut calls = Vec::new();
    loop {
        // Parsing value by value, not splitting on ';', keeps a ';' inside a string whole.
        let (value, after) = leading_json(rest)?;
        calls.push(call_from_object(&value)?);
        let after = after.trim_start();
        if after.is_empty() {
            return Some(calls);
        }
        rest = after.strip_prefix(';')?;
        if rest.trim().is_empty() {
            return Some(calls);
        }
    }
}

/// Mistral text after the first `[TOOL_CALLS]`: each `[TOOL_CALLS]`-separated segment
/// gives its calls, or, when it does not parse, stays content with its marker.
fn mistral_tail(tail: &str, out: &mut Vec<StreamItem>) {
    for segment in tail.split(MISTRAL_CALLS) {
        match mistral_segment(segment) {
            // A marker with no call after it is not a call either.
            Some(calls) if !calls.is_empty() => out.extend(calls.into_iter().map(StreamItem::Call)),
            _ => push_content(out, format!("{MISTRAL_CALLS}{segment}")),
        }
    }
}

fn mistral_segment(segment: &str) -> Option<Vec<ToolCall>> {
    let s = segment.trim();
    if s.starts_with('[') || s.starts_with('{') {
        // Before v11: a JSON array of call objects (a lone object is accepted too).
        return match serde_json::from_str::<Value>(s).ok()? {
            Value::Array(items) => items.iter().map(call_from_object).collect(),
            one => Some(vec![call_from_object(&one)?]),
        };
    }
    // v11+: `name[ARGS]{..}`, `name[CALL_ID]id[ARGS]{..}`, or `name{..}` where the
    // decoder dropped the special tokens; several in a row are accepted.
    let mut calls = Vec::new();
    let mut rest = s;
    while !rest.is_empty() {
        let brace = rest.find('{')?;
        let (head, json) = match rest.find(MISTRAL_ARGS) {
            Some(a) if a < brace => (rest.get(..a)?, rest.get(a + MISTRAL_ARGS.len()..)?),
            _ => (rest.get(..brace)?, rest.get(brace..)?),
        };
        let name = head.split(MISTRAL_CALL_ID).next().unwrap_or(head).trim();
        // A function name, not prose that happens to precede a brace.
        let is_name = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.');
        if name.is_empty() || !name.chars().all(is_name) {
            return None;
        }
        let (args, after) = leading_json(json)?;
        if !args.is_object() {
            return None;
        }
        calls.push(ToolCall::new(name, args.to_string()));
        rest = after.trim_start();
    }
    Some(calls)
}

/// `call_` and 24 alphanumerics. Process-unique without a random source: the first 11
/// characters spell out, in full, a bijective mix of (time-based seed + counter), so two
/// calls in one process never share them; the rest only adds look.
fn next_call_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    static SEED: OnceLock<u64> = OnceLock::new();
    let seed = *SEED.get_or_init(|| {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        mix(nanos ^ (u64::from(std::process::id()) << 40))
    });
    let first = mix(seed.wrapping_add(COUNTER.fetch_add(1, Ordering::Relaxed)));
    let second = mix(first ^ seed.rotate_left(29));
    let third = mix(second);
    let mut id = String::with_capacity(29);
    id.push_str("call_");
    push_base62(&mut id, first, 11); // 62^11 > 2^64: the whole word, hence unique
    push_base62(&mut id, second, 11);
    push_base62(&mut id, third, 2);
    id
}

/// splitmix64's finalizer: a bijection on u64 that scatters neighbouring inputs.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn push_base62(out: &mut String, mut word: u64, digits: usize) {
    for _ in 0..digits {
        let d = (word % 62) as u8; // < 62: fits, and picks one of the three ranges below
        out.push(char::from(match d {
            0..=9 => b'0' + d,
            10..=35 => b'A' + (d - 10),
            _ => b'a' + (d - 36),
        }));
        word /= 62;
    }
}

#[cfg(test)]
mod tests {
    use super::ToolCallFormat::{Gemma4, Glm47, Hermes, Llama3Json, Mistral, QwenXml};
    use super::*;

    /// (name, arguments) of each call: ids differ between runs by design.
    fn calls(out: &ParsedOutput) -> Vec<(&str, &str)> {
        out.tool_calls.iter().map(|c| (c.name.as_str(), c.arguments.as_str())).collect()
    }

    /// Content and (name, arguments) pairs of a stream fed `chunks`.
    fn run_stream(format: ToolCallFormat, chunks: &[&str]) -> (String, Vec<(String, String)>) {
        run_stream_with(format, None, chunks)
    }

    /// The calls of `text` streamed a character at a time.
    fn streamed_by_chars(format: ToolCallFormat, types: Option<Arc<ParamTypes>>, text: &str) -> Vec<(String, String)> {
        let chars: Vec<String> = text.chars().map(String::from).collect();
        run_stream_with(format, types, &chars.iter().map(String::as_str).collect::<Vec<_>>()).1
    }

    fn run_stream_with(format: ToolCallFormat, types: Option<Arc<ParamTypes>>, chunks: &[&str]) -> (String, Vec<(String, String)>) {
        let mut stream = ToolCallStream::with_types(format, types);
        let mut items = Vec::new();
        for chunk in chunks {
            items.extend(stream.push(chunk));
        }
        items.extend(stream.finish());
        let (mut content, mut found) = (String::new(), Vec::new());
        for item in items {
            match item {
                StreamItem::Content(s) => {
                    assert!(!s.is_empty(), "empty content item");
                    content.push_str(&s);
                }
                StreamItem::Call(c) => found.push((c.name, c.arguments)),
            }
        }
        (content, found)
    }

    fn owned(out: &ParsedOutput) -> (String, Vec<(String, String)>) {
        let pairs = calls(out).into_iter().map(|(n, a)| (n.to_string(), a.to_string())).collect();
        (out.content.clone(), pairs)
    }

    /// Cuts `text` at the given byte offsets, moved back to char boundaries.
    fn cut<'a>(text: &'a str, cuts: &[usize]) -> Vec<&'a str> {
        let mut pieces = Vec::new();
        let mut start = 0;
        for &c in cuts {
            let mut c = c.min(text.len());
            while !text.is_char_boundary(c) {
                c -= 1;
            }
            if c > start {
                pieces.push(&text[start..c]);
                start = c;
            }
        }
        pieces.push(&text[start..]);
        pieces
    }

    /// Deterministic pseudo-random numbers for chunkings and fuzz inputs.
    struct Lcg(u64);
    impl Lcg {
        fn below(&mut self, n: usize) -> usize {
            self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((self.0 >> 33) as usize) % n.max(1)
        }
    }

    /// Streams `text` as 1-char deltas, as two pieces split at every byte offset, and in
    /// random chunkings; each must give parse()'s content and calls.
    fn assert_stream_matches_parse(format: ToolCallFormat, text: &str) {
        let expected = owned(&parse(format, text));
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let deltas: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(run_stream(format, &deltas), expected, "1-char deltas of {text:?}");
        for i in 0..=text.len() {
            assert_eq!(run_stream(format, &cut(text, &[i])), expected, "split at {i} of {text:?}");
        }
        let mut rng = Lcg(text.len() as u64);
        for _ in 0..50 {
            let mut cuts: Vec<usize> = (0..rng.below(8)).map(|_| rng.below(text.len() + 1)).collect();
            cuts.sort_unstable();
            assert_eq!(run_stream(format, &cut(text, &cuts)), expected, "chunks {cuts:?} of {text:?}");
        }
    }

    const WEATHER: &str = r#"{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}"#;

    #[test]
    fn hermes_single_call_has_compact_ordered_arguments_and_no_content() {
        let out = parse(Hermes, &format!("<tool_call>\n{WEATHER}\n</tool_call>"));
        assert_eq!(out.content, "");
        assert_eq!(calls(&out), [("get_weather", r#"{"city":"Paris","unit":"celsius"}"#)]);
    }

    #[test]
    fn hermes_multiple_calls_keep_text_outside_blocks_as_content() {
        let text = "Let me check.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}}\n</tool_call>\n\
                    <tool_call>\n{\"name\": \"b\", \"arguments\": {}}\n</tool_call>\nDone.";
        let out = parse(Hermes, text);
        assert_eq!(out.content, "Let me check.\n\n\nDone.");
        assert_eq!(calls(&out), [("a", r#"{"x":1}"#), ("b", "{}")]);
    }

    #[test]
    fn hermes_arguments_given_as_json_string_pass_through_compacted() {
        let text = r#"<tool_call>{"name": "f", "arguments": "{\"q\": \"rust\", \"n\": 3}"}</tool_call>"#;
        assert_eq!(calls(&parse(Hermes, text)), [("f", r#"{"q":"rust","n":3}"#)]);
    }

    #[test]
    fn hermes_accepts_parameters_key_missing_arguments_and_function_wrapper() {
        let text = r#"<tool_call>{"name": "p", "parameters": {"a": true}}</tool_call><tool_call>{"name": "now"}</tool_call><tool_call>{"type": "function", "function": {"name": "w", "arguments": {"k": null}}}</tool_call>"#;
        assert_eq!(
            calls(&parse(Hermes, text)),
            [("p", r#"{"a":true}"#), ("now", "{}"), ("w", r#"{"k":null}"#)]
        );
    }

    #[test]
    fn hermes_malformed_blocks_stay_content_verbatim() {
        for text in [
            "<tool_call>{\"name\": \"f\", \"arguments\": {</tool_call> ok",
            "<tool_call>{\"name\": \"f\", \"arguments\": \"not json\"}</tool_call>",
            "<tool_call>{\"name\": \"f\", \"arguments\": [1, 2]}</tool_call>",
            "<tool_call>{\"arguments\": {}}</tool_call>",
            "<tool_call>{\"name\": \"f\"} trailing</tool_call>",
            "<tool_call>{\"name\": \"f\", \"argu", // cut off by max_tokens
        ] {
            let out = parse(Hermes, text);
            assert_eq!(out.content, text);
            assert!(out.tool_calls.is_empty(), "{text:?}");
        }
        // A bad block does not spoil a good one after it.
        let out = parse(Hermes, "<tool_call>{oops}</tool_call>\n<tool_call>{\"name\": \"g\"}</tool_call>");
        assert_eq!(out.content, "<tool_call>{oops}</tool_call>\n");
        assert_eq!(calls(&out), [("g", "{}")]);
    }

    #[test]
    fn hermes_unclosed_block_holding_one_whole_call_is_a_call() {
        let out = parse(Hermes, &format!("Sure.\n<tool_call>\n{WEATHER}\n"));
        assert_eq!(out.content, "Sure.\n");
        assert_eq!(calls(&out), [("get_weather", r#"{"city":"Paris","unit":"celsius"}"#)]);
    }

    #[test]
    fn text_without_markers_is_all_content_in_every_format() {
        let text = "Plain answer: [1] <b>x</b> {not json} ; done";
        for format in [Hermes, Llama3Json, Mistral, QwenXml] {
            assert_eq!(parse(format, text), ParsedOutput { content: text.into(), tool_calls: vec![] });
        }
    }

    #[test]
    fn llama_single_call_with_parameters_or_arguments_and_python_tag() {
        let out = parse(Llama3Json, "\n{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}\n");
        assert_eq!(out.content, "");
        assert_eq!(calls(&out), [("get_weather", r#"{"city":"Paris"}"#)]);
        let out = parse(Llama3Json, "<|python_tag|>{\"name\": \"f\", \"arguments\": {\"x\": [1, 2]}}");
        assert_eq!((out.content.as_str(), calls(&out)), ("", vec![("f", r#"{"x":[1,2]}"#)]));
    }

    #[test]
    fn llama_multiple_calls_split_on_semicolons_outside_strings() {
        let text = r#"{"name": "f", "parameters": {"q": "a; b"}}; {"name": "g", "parameters": {}};"#;
        let out = parse(Llama3Json, text);
        assert_eq!(out.content, "");
        assert_eq!(calls(&out), [("f", r#"{"q":"a; b"}"#), ("g", "{}")]);
    }

    #[test]
    fn llama_output_that_is_not_wholly_calls_is_content() {
        for text in [
            r#"Here it is: {"name": "f", "parameters": {}}"#,
            r#"{"name": "f", "parameters": {}} and some words"#,
            r#"{"name": "f", "parameters": {}}; {"answer": 42}"#,
            r#"{"answer": 42}"#,
            r#"{"name": "f", "parameters": {"#,
            "<|python_tag|>brave_search.call(query=\"x\")",
            "<|python_tag|>",
        ] {
            assert_eq!(parse(Llama3Json, text), ParsedOutput { content: text.into(), tool_calls: vec![] });
        }
    }

    #[test]
    fn mistral_array_format_single_and_multiple_with_content_before() {
        let out = parse(Mistral, r#"[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]"#);
        assert_eq!((out.content.as_str(), calls(&out)), ("", vec![("get_weather", r#"{"city":"Paris"}"#)]));
        let text = r#"Sure.[TOOL_CALLS][{"name": "a", "arguments": {"x": 1}, "id": "abc123def"}, {"name": "b", "arguments": {}}]"#;
        let out = parse(Mistral, text);
        assert_eq!(out.content, "Sure.");
        assert_eq!(calls(&out), [("a", r#"{"x":1}"#), ("b", "{}")]);
    }

    #[test]
    fn mistral_v11_name_args_format_with_and_without_special_tokens() {
        let text = r#"Checking.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{}"#;
        let out = parse(Mistral, text);
        assert_eq!(out.content, "Checking.");
        assert_eq!(calls(&out), [("get_weather", r#"{"city":"Paris"}"#), ("get_time", "{}")]);
        let out = parse(Mistral, r#"[TOOL_CALLS]f[CALL_ID]a1b2c3d4e[ARGS]{"a": 1}"#);
        assert_eq!(calls(&out), [("f", r#"{"a":1}"#)]);
        let out = parse(Mistral, r#"[TOOL_CALLS]f{"a": 1}g{"b": 2}"#);
        assert_eq!(calls(&out), [("f", r#"{"a":1}"#), ("g", r#"{"b":2}"#)]);
    }

    #[test]
    fn mistral_malformed_call_text_stays_content_verbatim() {
        for text in [
            r#"[TOOL_CALLS][{"name": "a", "#,
            "[TOOL_CALLS] I cannot call tools {really}",
            r#"[TOOL_CALLS]f[ARGS]{"a": 1} and prose"#,
            r#"[TOOL_CALLS]f[ARGS]"not an object""#,
            "[TOOL_CALLS]",
            "[TOOL_CALLS] []",
        ] {
            assert_eq!(parse(Mistral, text), ParsedOutput { content: text.into(), tool_calls: vec![] });
        }
        let out = parse(Mistral, r#"A[TOOL_CALLS]bad{[TOOL_CALLS]ok[ARGS]{}"#);
        assert_eq!((out.content.as_str(), calls(&out)), ("A[TOOL_CALLS]bad{", vec![("ok", "{}")]));
    }

    #[test]
    fn streaming_equals_parse_for_every_split_of_every_sample() {
        let samples: &[(ToolCallFormat, &str)] = &[
            (Hermes, "Let me look.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}}\n</tool_call>\n<tool_call>{\"name\": \"b\", \"arguments\": \"{}\"}</tool_call> bye"),
            (Hermes, "<tools are great> and <tool_call>{bad}</tool_call> <tool_call>{\"name\": \"f\"}"),
            (Hermes, "héllo 🌍 <tool_call>{\"name\": \"日本\", \"arguments\": {\"q\": \"ü€\"}}</tool_call> fin ✓<tool"),
            (Llama3Json, "  <|python_tag|>{\"name\": \"f\", \"parameters\": {\"q\": \"a;b\"}}; {\"name\": \"g\", \"parameters\": {}}"),
            (Llama3Json, "<|py is not a tag, é {\"name\": \"f\"}"),
            (Llama3Json, " {\"name\": \"f\", \"parameters\": {}} trailing"),
            (Mistral, "Voilà [a](b) [TOOL_CALLS]get_weather[ARGS]{\"city\": \"Zürich\"}[TOOL_CALLS]t[ARGS]{}"),
            (Mistral, "[TOOL[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {\"x\": \"🌍\"}}]"),
        ];
        for &(format, text) in samples {
            assert_stream_matches_parse(format, text);
        }
        // The samples exercise calls, not only the content fallback.
        let counts: Vec<usize> = samples.iter().map(|&(f, t)| parse(f, t).tool_calls.len()).collect();
        assert_eq!(counts, [2, 1, 1, 2, 0, 0, 2, 1]);
    }

    #[test]
    fn streaming_equals_parse_on_random_marker_soup() {
        let atoms = [
            "<tool_call>",
            "</tool_call>",
            "<tool",
            "</tool",
            "{\"name\": \"f\"}",
            "{",
            "}",
            ";",
            " ",
            "\n",
            "[TOOL_CALLS]",
            "[TOOL_",
            "[ARGS]",
            "[CALL_ID]",
            "h",
            "<|python_tag|>",
            "<|py",
            "🌍",
            "[",
            "<",
            "\"",
            "x{}",
        ];
        let hermes = [
            "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"é\": 1}}\n</tool_call>",
            "<tool_call>{\"name\": \"g\"}</tool_call>",
        ];
        let mistral =
            ["[TOOL_CALLS]f[ARGS]{\"a\": \"🌍\"}", "[TOOL_CALLS][{\"name\": \"g\", \"arguments\": {}}]"];
        let llama = ["{\"name\": \"f\", \"parameters\": {\"a\": \";\"}}", " {\"name\": \"g\"} "];
        let (mut rng, mut found) = (Lcg(7), 0);
        for _ in 0..300 {
            let soup = |rng: &mut Lcg, n: usize| -> String {
                (0..rng.below(n)).map(|_| atoms[rng.below(atoms.len())]).collect()
            };
            // Random text, and well-formed calls in each format with random text around them
            // (for Llama, calls only: text around them makes the whole output content).
            let noise = soup(&mut rng, 12);
            let mut h = String::new();
            let mut m = soup(&mut rng, 4);
            let mut l = if rng.below(2) == 0 { String::new() } else { "<|python_tag|>".to_string() };
            for i in 0..1 + rng.below(3) {
                h += &soup(&mut rng, 4);
                h += hermes[rng.below(2)];
                m += mistral[rng.below(2)];
                l += if i > 0 { ";" } else { "" };
                l += llama[rng.below(2)];
            }
            h += &soup(&mut rng, 4);
            for (format, text) in [
                (Hermes, &noise),
                (Llama3Json, &noise),
                (Mistral, &noise),
                (Hermes, &h),
                (Mistral, &m),
                (Llama3Json, &l),
            ] {
                assert_stream_matches_parse(format, text);
                found += parse(format, text).tool_calls.len();
            }
        }
        assert!(found > 1000, "the samples should hold calls, not only content: {found}");
    }

    #[test]
    fn hermes_stream_releases_content_early_and_calls_at_close_tag() {
        let mut s = ToolCallStream::new(Hermes);
        assert_eq!(s.push("Hello "), [StreamItem::Content("Hello ".into())]);
        assert_eq!(s.push("<tool_call>{\"name\": \"f\", "), []);
        assert_eq!(s.push("\"arguments\": {}}"), []);
        let items = s.push("</tool_call>\nmore");
        assert!(
            matches!(&items[..], [StreamItem::Call(c), StreamItem::Content(t)] if c.name == "f" && t == "\nmore")
        );
        assert_eq!(s.finish(), []);
    }

    #[test]
    fn marker_prefix_is_held_then_released_when_no_marker_follows() {
        let mut s = ToolCallStream::new(Hermes);
        assert_eq!(s.push("Tools? 🌍<tool"), [StreamItem::Content("Tools? 🌍".into())]);
        assert_eq!(s.push("s are great"), [StreamItem::Content("<tools are great".into())]);
        assert_eq!(s.push(" <"), [StreamItem::Content(" ".into())]);
        assert_eq!(s.finish(), [StreamItem::Content("<".into())]);

        let mut s = ToolCallStream::new(Mistral);
        assert_eq!(s.push("see [TOOL"), [StreamItem::Content("see ".into())]);
        assert_eq!(s.push("S] list"), [StreamItem::Content("[TOOLS] list".into())]);
    }

    #[test]
    fn llama_stream_buffers_call_like_output_and_streams_the_rest() {
        let mut s = ToolCallStream::new(Llama3Json);
        assert_eq!(s.push("  "), []);
        assert_eq!(s.push("{\"name\": \"f\", "), []);
        assert_eq!(s.push("\"parameters\": {}}"), []);
        assert!(matches!(&s.finish()[..], [StreamItem::Call(c)] if c.name == "f" && c.arguments == "{}"));

        let mut s = ToolCallStream::new(Llama3Json);
        assert_eq!(s.push("<|py"), []);
        assert_eq!(s.push("thon_tag|>{\"name\": \"g\"}"), []);
        assert!(matches!(&s.finish()[..], [StreamItem::Call(c)] if c.name == "g"));

        let mut s = ToolCallStream::new(Llama3Json);
        assert_eq!(s.push(" <"), []);
        assert_eq!(s.push("b>bold"), [StreamItem::Content(" <b>bold".into())]);
        assert_eq!(s.push(" {x}"), [StreamItem::Content(" {x}".into())]);
        assert_eq!(s.finish(), []);
    }

    #[test]
    fn detect_reads_the_template_markers() {
        let qwen = r#"{{- "<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>" }}"#;
        assert_eq!(ToolCallFormat::detect(qwen), Some(Hermes));
        assert_eq!(
            ToolCallFormat::detect(r#"{%- if message.tool_calls %}{{- "[TOOL_CALLS][" }}"#),
            Some(Mistral)
        );
        assert_eq!(ToolCallFormat::detect("{{- '[AVAILABLE_TOOLS]' + tools|tojson }}"), Some(Mistral));
        assert_eq!(ToolCallFormat::detect(r#"{{- "Environment: ipython\n" }}"#), Some(Llama3Json));
        assert_eq!(ToolCallFormat::detect(r#"{{- "<|python_tag|>" + tool_call.name }}"#), Some(Llama3Json));
        let llama32 = r#"<|start_header_id|>user<|end_header_id|>{{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}"#;
        assert_eq!(ToolCallFormat::detect(llama32), Some(Llama3Json));
        assert_eq!(
            ToolCallFormat::detect("<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>"),
            None
        );
        assert_eq!(ToolCallFormat::detect("<|start_header_id|>{{ message['role'] }}<|end_header_id|>"), None);
        assert_eq!(ToolCallFormat::detect(""), None);
        // Qwen3-Coder writes <tool_call> too; its function tag tells the formats apart.
        let coder = "{{- '<tool_call>\\n<function=' + tool_call.name + '>\\n' }}";
        assert_eq!(ToolCallFormat::detect(coder), Some(QwenXml));
    }

    #[test]
    fn qwen_xml_calls_stream_as_they_parse_whole() {
        let tools = serde_json::json!([{"type": "function", "function": {"name": "add", "parameters": {"properties": {"a": {"type": "integer"}, "b": {"type": "number"}}}}}]);
        let types = Some(Arc::new(ParamTypes::from_tools(&tools)));
        let text = "Adding.\n<tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\n<parameter=b>\n2.5\n</parameter>\n</function>\n</tool_call>";
        let whole = parse_with(QwenXml, text, types.clone());
        assert_eq!(whole.content, "Adding.\n");
        assert_eq!(calls(&whole), [("add", r#"{"a":1,"b":2.5}"#)]);
        assert_eq!(streamed_by_chars(QwenXml, types, text), [("add".to_string(), r#"{"a":1,"b":2.5}"#.to_string())]);
        // A JSON body in the same block is still read (a model mixing the two).
        assert_eq!(calls(&parse(QwenXml, "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>")), [("f", "{}")]);
    }

    #[test]
    fn glm_calls_stream_as_they_parse_whole() {
        let tools = serde_json::json!([{"type": "function", "function": {"name": "get_weather", "parameters": {"properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}]);
        let types = Some(Arc::new(ParamTypes::from_tools(&tools)));
        let text = "Checking.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>";
        let whole = parse_with(Glm47, text, types.clone());
        assert_eq!(whole.content, "Checking.\n");
        assert_eq!(calls(&whole), [("get_weather", r#"{"city":"Paris","days":2}"#)]);
        assert_eq!(streamed_by_chars(Glm47, types, text), [("get_weather".to_string(), r#"{"city":"Paris","days":2}"#.to_string())]);
        // GLM's template (which also writes <tool_call>) is told apart by its argument tags.
        let glm = "{{ '<tool_call>' + tc.name }}{% for k, v in tc.arguments.items() %}<arg_key>{{ k }}</arg_key>\n<arg_value>{{ v }}</arg_value>{% endfor %}</tool_call>";
        assert_eq!(ToolCallFormat::detect(glm), Some(Glm47));
    }

    #[test]
    fn gemma4_calls_stream_as_they_parse_whole_and_broken_ones_stay_text() {
        let text = "Checking.<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>,days:2}<tool_call|><|tool_call>call:ping{}<tool_call|>";
        let whole = parse(Gemma4, text);
        assert_eq!(whole.content, "Checking.");
        let want = [("get_weather", r#"{"city":"Paris","days":2}"#), ("ping", "{}")];
        assert_eq!(calls(&whole), want);
        let want_owned: Vec<(String, String)> = want.iter().map(|(n, a)| (n.to_string(), a.to_string())).collect();
        for cut in 1..text.len() {
            assert_eq!(run_stream(Gemma4, &[&text[..cut], &text[cut..]]), ("Checking.".to_string(), want_owned.clone()), "cut at {cut}");
        }
        let broken = "<|tool_call>call:f{a:<tool_call|> then text";
        assert_eq!(parse(Gemma4, broken), ParsedOutput { content: broken.into(), tool_calls: vec![] });
        assert_eq!(ToolCallFormat::detect("{{ '<|tool_call>call:' + name }}...<tool_call|>"), Some(Gemma4));
    }

    #[test]
    fn from_name_round_trips_and_lists_valid_names_on_error() {
        for format in [Hermes, Llama3Json, Mistral, QwenXml, Gemma4, Glm47] {
            assert_eq!(ToolCallFormat::from_name(format.name()), Ok(format));
        }
        let err = ToolCallFormat::from_name("qwen").unwrap_err();
        assert!(err.contains("\"qwen\"") && err.contains("hermes, llama3_json, mistral"), "{err}");
    }

    #[test]
    fn ids_are_call_prefix_and_24_alphanumerics_and_unique() {
        let ids: Vec<String> = (0..10_000).map(|_| ToolCall::new("f", "{}").id).collect();
        for id in &ids {
            let tail = id.strip_prefix("call_").expect("call_ prefix");
            assert_eq!(tail.len(), 24, "{id}");
            assert!(tail.bytes().all(|b| b.is_ascii_alphanumeric()), "{id}");
        }
        let unique: std::collections::HashSet<&String> = ids.iter().collect();
        assert_eq!(unique.len(), ids.len());
        let out =
            parse(Hermes, "<tool_call>{\"name\": \"a\"}</tool_call><tool_call>{\"name\": \"a\"}</tool_call>");
        assert_ne!(out.tool_calls[0].id, out.tool_calls[1].id);
    }
}
