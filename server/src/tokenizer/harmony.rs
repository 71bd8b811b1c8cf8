//! OpenAI's Harmony format (gpt-oss) in model output: messages of a header
//! (`<|start|>assistant`, `<|channel|>NAME`, an optional recipient
//! `to=functions.NAME` and `<|constrain|>json`) and a body after
//! `<|message|>`, each ended by `<|end|>`, `<|call|>` or `<|return|>` (the last
//! two also stop generation, so the output may simply end). The chat API gets
//! the `analysis` channel as reasoning, `final` (and recipient-less
//! `commentary`, the preambles shown to users) as content, and a message to
//! `functions.NAME` as a tool call whose arguments are its body.
//!
//! The markers are special tokens: the output is detokenized keeping them.
//! As with the other splits, a whole answer is the stream fed in one piece.

use super::tool_calls::ToolCall;

const START: &str = "<|start|>";
const CHANNEL: &str = "<|channel|>";
const MESSAGE: &str = "<|message|>";
/// What ends a message's body: its end markers, or the next message's header.
const BODY_ENDS: [&str; 5] = ["<|end|>", "<|call|>", "<|return|>", START, CHANNEL];
const MARKERS: [&str; 7] = ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|call|>", "<|return|>", "<|constrain|>"];

/// Whether a chat template writes Harmony messages (gpt-oss's does).
pub fn template_speaks_harmony(chat_template: &str) -> bool {
    chat_template.contains(CHANNEL) && chat_template.contains(MESSAGE)
}

#[derive(Debug, Clone, PartialEq)]
pub enum HarmonyPart {
    Reasoning(String),
    Content(String),
    Call(ToolCall),
}

/// What a message's body is, from its header.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Body {
    Reasoning,
    Content,
    /// A call of function `name`: the body is collected whole.
    Call { name: String, arguments: String },
}

pub struct HarmonySplit {
    /// None while reading a header.
    body: Option<Body>,
    /// Text not yet settled: a header in progress, or a body's tail that may
    /// be the start of a marker.
    held: String,
}

impl Default for HarmonySplit {
    fn default() -> Self {
        HarmonySplit::new()
    }
}

impl HarmonySplit {
    pub fn new() -> HarmonySplit {
        HarmonySplit { body: None, held: String::new() }
    }

    /// The settled parts after `text`.
    pub fn push(&mut self, text: &str) -> Vec<HarmonyPart> {
        self.held.push_str(text);
        let mut out = Vec::new();
        loop {
            match self.body.take() {
                None => {
                    let Some(at) = self.held.find(MESSAGE) else {
                        // Text that cannot be a header (no marker where one must
                        // begin) is an answer written without one.
                        if !self.held.is_empty() && !could_start_header(&self.held) {
                            self.body = Some(Body::Content);
                            continue;
                        }
                        return out;
                    };
                    self.body = Some(read_header(&self.held[..at]));
                    self.held.drain(..at + MESSAGE.len());
                }
                Some(mut body) => {
                    let end = BODY_ENDS.iter().filter_map(|m| self.held.find(m).map(|at| (at, *m))).min();
                    // Up to the end marker, or all but a tail that may begin one.
                    let settled = end.map_or(self.held.len() - marker_prefix_len(&self.held), |(at, _)| at);
                    let text: String = self.held.drain(..settled).collect();
                    emit(&mut body, text, &mut out);
                    let Some((_, marker)) = end else {
                        self.body = Some(body);
                        return out;
                    };
                    if let Body::Call { name, arguments } = body {
                        out.push(HarmonyPart::Call(ToolCall::new(name, compact_json(&arguments))));
                    }
                    // A header marker begins the next message's header; end markers go.
                    if marker != START && marker != CHANNEL {
                        self.held.drain(..marker.len());
                    }
                }
            }
        }
    }

    /// Flushes what is held at the end of the output: a body's tail, a call
    /// whose `<|call|>` stopped generation, or a header that never opened a
    /// body (text, if it holds no marker).
    pub fn finish(&mut self) -> Vec<HarmonyPart> {
        let mut out = Vec::new();
        let held = std::mem::take(&mut self.held);
        match self.body.take() {
            Some(mut body) => {
                emit(&mut body, held, &mut out);
                if let Body::Call { name, arguments } = body {
                    out.push(HarmonyPart::Call(ToolCall::new(name, compact_json(&arguments))));
                }
            }
            None if !held.is_empty() && !MARKERS.iter().any(|m| held.contains(m)) => out.push(HarmonyPart::Content(held)),
            None => {}
        }
        out
    }
}

/// Body text of `body`: streamed out, or collected for a call.
fn emit(body: &mut Body, text: String, out: &mut Vec<HarmonyPart>) {
    if text.is_empty() {
        return;
    }
    match body {
        Body::Reasoning => out.push(HarmonyPart::Reasoning(text)),
        Body::Content => out.push(HarmonyPart::Content(text)),
        Body::Call { arguments, .. } => arguments.push_str(&text),
    }
}

/// The kind of body a header opens.
fn read_header(header: &str) -> Body {
    let word_after = |key: &str| {
        header.find(key).map(|at| {
            let rest = &header[at + key.len()..];
            rest.split(|c: char| c.is_whitespace() || c == '<').next().unwrap_or("").to_string()
        })
    };
    if let Some(name) = word_after("to=").and_then(|r| r.strip_prefix("functions.").map(str::to_string)) {
        return Body::Call { name, arguments: String::new() };
    }
    match word_after(CHANNEL).as_deref() {
        Some("analysis") => Body::Reasoning,
        _ => Body::Content,
    }
}

/// Whether `text` (a header in progress) may still be one: it starts, after
/// whitespace, with a marker or a marker's beginning.
fn could_start_header(text: &str) -> bool {
    let t = text.trim_start();
    t.is_empty() || MARKERS.iter().any(|m| t.starts_with(m) || m.starts_with(t))
}

/// Bytes at the end of `text` that may begin a marker.
fn marker_prefix_len(text: &str) -> usize {
    let Some(at) = text.rfind('<') else { return 0 };
    let tail = &text[at..];
    if MARKERS.iter().any(|m| m.starts_with(tail)) {
        tail.len()
    } else {
        0
    }
}

/// The arguments as compact JSON when they parse, else as written.
fn compact_json(text: &str) -> String {
    match serde_json::from_str::<serde_json::Value>(text.trim()) {
        Ok(v) => v.to_string(),
        Err(_) => text.trim().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn whole(text: &str) -> Vec<HarmonyPart> {
        let mut s = HarmonySplit::new();
        let mut out = s.push(text);
        out.extend(s.finish());
        merge(out)
    }

    /// Every split of `text` into two pieces, and one char at a time, gives
    /// what the whole text gives.
    fn check_streams_alike(text: &str) {
        let want = whole(text);
        let cuts: Vec<usize> = (0..=text.len()).filter(|&i| text.is_char_boundary(i)).collect();
        for &cut in &cuts {
            let mut s = HarmonySplit::new();
            let mut out = s.push(&text[..cut]);
            out.extend(s.push(&text[cut..]));
            out.extend(s.finish());
            assert_eq!(without_ids(merge(out)), without_ids(want.clone()), "split at {cut}");
        }
        let mut s = HarmonySplit::new();
        let mut out = Vec::new();
        for c in text.chars() {
            out.extend(s.push(&c.to_string()));
        }
        out.extend(s.finish());
        assert_eq!(without_ids(merge(out)), without_ids(want), "char by char");
    }

    /// Adjacent reasoning (or content) pieces joined.
    fn merge(parts: Vec<HarmonyPart>) -> Vec<HarmonyPart> {
        let mut out: Vec<HarmonyPart> = Vec::new();
        for p in parts {
            match (out.last_mut(), p) {
                (Some(HarmonyPart::Reasoning(a)), HarmonyPart::Reasoning(b)) => a.push_str(&b),
                (Some(HarmonyPart::Content(a)), HarmonyPart::Content(b)) => a.push_str(&b),
                (_, p) => out.push(p),
            }
        }
        out
    }

    fn without_ids(parts: Vec<HarmonyPart>) -> Vec<HarmonyPart> {
        parts
            .into_iter()
            .map(|p| match p {
                HarmonyPart::Call(c) => HarmonyPart::Call(ToolCall { id: String::new(), ..c }),
                p => p,
            })
            .collect()
    }

    fn call(name: &str, args: &str) -> HarmonyPart {
        HarmonyPart::Call(ToolCall { id: String::new(), name: name.into(), arguments: args.into() })
    }

    #[test]
    fn analysis_is_reasoning_and_final_is_content() {
        let text = "<|channel|>analysis<|message|>The user asks 2+2. Easy.<|end|><|start|>assistant<|channel|>final<|message|>4";
        assert_eq!(whole(text), vec![HarmonyPart::Reasoning("The user asks 2+2. Easy.".into()), HarmonyPart::Content("4".into())]);
        check_streams_alike(text);
        // <|return|> ends the answer when generation went on past it.
        assert_eq!(whole("<|channel|>final<|message|>done<|return|>"), vec![HarmonyPart::Content("done".into())]);
    }

    #[test]
    fn a_message_to_a_function_is_a_tool_call_with_compact_arguments() {
        let text = "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>";
        assert_eq!(without_ids(whole(text)), vec![HarmonyPart::Reasoning("Need weather.".into()), call("get_weather", r#"{"city":"Paris"}"#)]);
        check_streams_alike(text);
        // The recipient before the channel; <|call|> stopped generation, so it is missing.
        let text = "<|start|>assistant to=functions.lookup<|channel|>commentary json<|message|>{\"q\": 1}";
        assert_eq!(without_ids(whole(text)), vec![call("lookup", r#"{"q":1}"#)]);
        check_streams_alike(text);
        // Two calls in a row; arguments that are not JSON pass as written.
        let text = "<|channel|>commentary to=functions.a<|message|>{}<|call|><|start|>assistant<|channel|>commentary to=functions.b<|message|>not json<|call|>";
        assert_eq!(without_ids(whole(text)), vec![call("a", "{}"), call("b", "not json")]);
    }

    #[test]
    fn preambles_and_text_without_headers_are_content() {
        let text = "<|channel|>commentary<|message|>Let me check.<|end|><|start|>assistant<|channel|>final<|message|>It is sunny.";
        assert_eq!(whole(text), vec![HarmonyPart::Content("Let me check.It is sunny.".into())]);
        assert_eq!(whole("plain answer < 3"), vec![HarmonyPart::Content("plain answer < 3".into())]);
        check_streams_alike("plain answer < 3");
        // A body's '<' that is no marker is text.
        let text = "<|channel|>final<|message|>a <b> c <|x";
        assert_eq!(whole(text), vec![HarmonyPart::Content("a <b> c <|x".into())]);
        check_streams_alike(text);
        // Unfinished reasoning (the token budget ran out) stays reasoning.
        assert_eq!(whole("<|channel|>analysis<|message|>thinking..."), vec![HarmonyPart::Reasoning("thinking...".into())]);
        assert_eq!(whole("<|channel|>analy"), vec![]);
    }

    #[test]
    fn gpt_oss_templates_are_recognised() {
        assert!(template_speaks_harmony("{{- '<|start|>assistant<|channel|>final<|message|>' }}"));
        assert!(!template_speaks_harmony("{{- '<|im_start|>assistant\n' }}"));
    }
}
