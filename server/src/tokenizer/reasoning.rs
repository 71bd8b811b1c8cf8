//! Reasoning in model output: `<think>…</think>` (Qwen3, DeepSeek-R1 and the
//! templates that copy them), or Gemma 4's `<|channel>thought…<channel|>`,
//! split from the answer, for the chat API's `reasoning_content` /
//! `reasoning` fields.
//!
//! Reasoning is the text between an opening marker at the very start of the
//! output (only whitespace before it) and the first closing one; a template
//! whose prompt already ends inside an open block (DeepSeek-R1's, Qwen3's
//! thinking variants) starts the output in reasoning. An unclosed block is all
//! reasoning (the model ran out of tokens while thinking). A marker later in
//! an answer is the answer's text. As with tool calls, the whole-text split is
//! the streaming one fed in one piece, so streamed and whole answers agree.

/// How a model opens and closes its reasoning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThinkMarkers {
    pub start: &'static str,
    pub end: &'static str,
}

impl Default for ThinkMarkers {
    fn default() -> ThinkMarkers {
        THINK_TAGS
    }
}

/// `<think>…</think>`.
pub const THINK_TAGS: ThinkMarkers = ThinkMarkers { start: "<think>", end: "</think>" };
/// Gemma 4's thought channel (mlx-lm reads it so where the vocabulary has its tokens).
pub const GEMMA4_THOUGHT: ThinkMarkers = ThinkMarkers { start: super::gemma4::THOUGHT_START, end: super::gemma4::THOUGHT_END };

/// Whether a model writes reasoning blocks: its chat template handles their end.
pub fn template_thinks(chat_template: &str, markers: ThinkMarkers) -> bool {
    chat_template.contains(markers.end)
}

/// Where a thinking template's rendered prompt leaves the model: Some(true)
/// inside an open `<think>`; None right after a closed block (thinking turned
/// off: Qwen3's `enable_thinking: false` renders an empty one), so the output
/// has no reasoning and a grammar must not offer a block; Some(false) where
/// the model may open a block of its own.
pub fn prompt_thinking(prompt: &str, markers: ThinkMarkers) -> Option<bool> {
    if prompt.trim_end().ends_with(markers.end) {
        return None;
    }
    Some(match (prompt.rfind(markers.start), prompt.rfind(markers.end)) {
        (Some(open), Some(close)) => open > close,
        (Some(_), None) => true,
        _ => false,
    })
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    Reasoning(String),
    Content(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Nothing but whitespace yet: a `<think>` may still open.
    Start,
    Reasoning,
    /// Just after `</think>`: the whitespace that separates it from the answer is dropped.
    AfterReasoning,
    Content,
}

pub struct ReasoningSplit {
    markers: ThinkMarkers,
    state: State,
    /// Text held back: it may be the start of a tag.
    held: String,
}

impl ReasoningSplit {
    pub fn new(markers: ThinkMarkers, starts_in_reasoning: bool) -> ReasoningSplit {
        ReasoningSplit { markers, state: if starts_in_reasoning { State::Reasoning } else { State::Start }, held: String::new() }
    }

    /// The parts of `text` (appended to what came before) that are settled.
    pub fn push(&mut self, text: &str) -> Vec<Part> {
        self.held.push_str(text);
        let ThinkMarkers { start, end } = self.markers;
        let mut out = Vec::new();
        loop {
            match self.state {
                State::Start => {
                    let trimmed = self.held.trim_start();
                    if let Some(rest) = trimmed.strip_prefix(start) {
                        self.held = rest.to_string();
                        self.state = State::Reasoning;
                    } else if trimmed.is_empty() || start.starts_with(trimmed) {
                        return out;
                    } else {
                        self.state = State::Content;
                    }
                }
                State::Reasoning => match self.held.find(end) {
                    Some(at) => {
                        push(&mut out, Part::Reasoning(self.held[..at].to_string()));
                        self.held = self.held[at + end.len()..].to_string();
                        self.state = State::AfterReasoning;
                    }
                    None => {
                        let keep = partial_tag_len(&self.held, end);
                        let settled = self.held[..self.held.len() - keep].to_string();
                        self.held.drain(..settled.len());
                        push(&mut out, Part::Reasoning(settled));
                        return out;
                    }
                },
                State::AfterReasoning => {
                    let rest = self.held.trim_start();
                    if rest.is_empty() {
                        self.held.clear();
                        return out;
                    }
                    self.held = rest.to_string();
                    self.state = State::Content;
                }
                State::Content => {
                    push(&mut out, Part::Content(std::mem::take(&mut self.held)));
                    return out;
                }
            }
        }
    }

    /// What is still held, at the end of the output.
    pub fn finish(&mut self) -> Vec<Part> {
        let held = std::mem::take(&mut self.held);
        let mut out = Vec::new();
        match self.state {
            State::Reasoning => push(&mut out, Part::Reasoning(held)),
            // Whitespace, or an unfinished "<thi": the answer's text.
            State::Start | State::Content => push(&mut out, Part::Content(held)),
            State::AfterReasoning => {}
        }
        out
    }
}

/// The reasoning (None when there was none) and the answer of a whole output.
pub fn split_whole(text: &str, markers: ThinkMarkers, starts_in_reasoning: bool) -> (Option<String>, String) {
    let mut split = ReasoningSplit::new(markers, starts_in_reasoning);
    let mut parts = split.push(text);
    parts.extend(split.finish());
    let (mut reasoning, mut content) = (None::<String>, String::new());
    for p in parts {
        match p {
            Part::Reasoning(t) => reasoning.get_or_insert_with(String::new).push_str(&t),
            Part::Content(t) => content.push_str(&t),
        }
    }
    if starts_in_reasoning || text.trim_start().starts_with(markers.start) {
        reasoning.get_or_insert_with(String::new);
    }
    (reasoning, content)
}

fn push(out: &mut Vec<Part>, part: Part) {
    match &part {
        Part::Reasoning(t) | Part::Content(t) if t.is_empty() => {}
        _ => out.push(part),
    }
}

/// Bytes at the end of `text` that begin `tag` (and could be completed by what comes next).
fn partial_tag_len(text: &str, tag: &str) -> usize {
    (1..tag.len().min(text.len() + 1))
        .rev()
        .find(|&n| text.is_char_boundary(text.len() - n) && tag.starts_with(&text[text.len() - n..]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn streamed(pieces: &[&str], starts: bool) -> (String, String) {
        let mut s = ReasoningSplit::new(THINK_TAGS, starts);
        let mut parts: Vec<Part> = pieces.iter().flat_map(|p| s.push(p)).collect();
        parts.extend(s.finish());
        let (mut r, mut c) = (String::new(), String::new());
        for p in parts {
            match p {
                Part::Reasoning(t) => r.push_str(&t),
                Part::Content(t) => c.push_str(&t),
            }
        }
        (r, c)
    }

    #[test]
    fn a_leading_think_block_is_reasoning_and_the_rest_is_the_answer_however_it_is_cut() {
        let text = "\n<think>\nLet me add: 2+2=4.\n</think>\n\nThe answer is 4.";
        for cut in 1..text.len() {
            if !text.is_char_boundary(cut) {
                continue;
            }
            let (r, c) = streamed(&[&text[..cut], &text[cut..]], false);
            assert_eq!((r.as_str(), c.as_str()), ("\nLet me add: 2+2=4.\n", "The answer is 4."), "cut at {cut}");
        }
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let pieces: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(streamed(&pieces, false), ("\nLet me add: 2+2=4.\n".into(), "The answer is 4.".into()));
        assert_eq!(split_whole(text, THINK_TAGS, false), (Some("\nLet me add: 2+2=4.\n".into()), "The answer is 4.".into()));
    }

    #[test]
    fn a_prompt_that_opens_thinking_starts_the_output_in_reasoning() {
        assert_eq!(prompt_thinking("<|im_start|>assistant\n<think>\n", THINK_TAGS), Some(true));
        assert_eq!(prompt_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n", THINK_TAGS), None);
        assert_eq!(prompt_thinking("<think>a</think>b<|im_end|><|im_start|>assistant\n", THINK_TAGS), Some(false));
        assert_eq!(prompt_thinking("<|im_start|>assistant\n", THINK_TAGS), Some(false));
        assert_eq!(split_whole("hmm, 4.</think>Four.", THINK_TAGS, true), (Some("hmm, 4.".into()), "Four.".into()));
        // Out of tokens while thinking: all reasoning, no answer.
        assert_eq!(split_whole("still thinking", THINK_TAGS, true), (Some("still thinking".into()), String::new()));
        assert_eq!(split_whole("<think>still thinking</thi", THINK_TAGS, false), (Some("still thinking</thi".into()), String::new()));
    }

    #[test]
    fn gemma4_thought_channels_are_reasoning() {
        let text = "<|channel>thought\nThe user wants 4.<channel|>It is 4.";
        assert_eq!(split_whole(text, GEMMA4_THOUGHT, false), (Some("\nThe user wants 4.".into()), "It is 4.".into()));
        assert_eq!(split_whole("<think>x</think>y", GEMMA4_THOUGHT, false), (None, "<think>x</think>y".into()));
        assert_eq!(prompt_thinking("<start_of_turn>model\n<|channel>thought\n", GEMMA4_THOUGHT), Some(true));
    }

    #[test]
    fn text_without_a_leading_think_is_all_answer() {
        assert_eq!(split_whole("Plain answer.", THINK_TAGS, false), (None, "Plain answer.".into()));
        assert_eq!(split_whole("Use <think> tags like </think> this.", THINK_TAGS, false), (None, "Use <think> tags like </think> this.".into()));
        assert_eq!(split_whole("<thi", THINK_TAGS, false), (None, "<thi".into()));
        assert_eq!(split_whole("  ", THINK_TAGS, false), (None, "  ".into()));
        // An empty think block (Qwen3 with thinking off) leaves the answer alone.
        assert_eq!(split_whole("<think>\n\n</think>\n\nHi", THINK_TAGS, false), (Some("\n\n".into()), "Hi".into()));
    }
}
