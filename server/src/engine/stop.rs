//! Stop conditions: end-of-sequence ids, stop strings matched across token
//! boundaries (text that might begin a stop string is held back, never
//! streamed past it), and the token budget.

use std::collections::BTreeSet;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// An eos token or a stop string.
    Stop,
    /// max_tokens reached.
    Length,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

pub struct StopMatcher {
    eos: BTreeSet<u32>,
    /// Stop strings that name a special token (never in the decoded text):
    /// matched by the token's id.
    stop_tokens: Vec<(u32, String)>,
    stops: Vec<String>,
    /// Text received but not yet released (could be the start of a stop string).
    held: String,
}

/// What to do with a chunk of generated text.
#[derive(Debug, PartialEq, Eq)]
pub struct StopOutcome {
    /// Text safe to emit now.
    pub emit: String,
    /// The stop string that ends generation here (not emitted itself).
    pub stop: Option<String>,
}

impl StopMatcher {
    /// A matcher of `stops`; those `special_id` names as special tokens are
    /// matched by id.
    pub fn new(eos: BTreeSet<u32>, stops: Vec<String>, special_id: impl Fn(&str) -> Option<u32>) -> StopMatcher {
        let (mut stop_tokens, mut texts) = (Vec::new(), Vec::new());
        for stop in stops.into_iter().filter(|s| !s.is_empty()) {
            match special_id(&stop) {
                Some(id) => stop_tokens.push((id, stop)),
                None => texts.push(stop),
            }
        }
        StopMatcher { eos, stop_tokens, stops: texts, held: String::new() }
    }

    pub fn is_eos(&self, token: u32) -> bool {
        self.eos.contains(&token)
    }

    /// The stop string `token` is, if it is one of the special tokens named as stops.
    pub fn stop_token(&self, token: u32) -> Option<&str> {
        self.stop_tokens.iter().find(|(id, _)| *id == token).map(|(_, s)| s.as_str())
    }

    /// Feeds newly decoded text.
    pub fn push(&mut self, text: &str) -> StopOutcome {
        self.held.push_str(text);
        // The earliest match; of those starting there, the first listed.
        let found = self.stops.iter().filter_map(|s| self.held.find(s.as_str()).map(|pos| (pos, s))).min_by_key(|&(pos, _)| pos);
        if let Some((pos, stop)) = found {
            let stop = stop.clone();
            let emit = self.held[..pos].to_string();
            self.held.clear();
            return StopOutcome { emit, stop: Some(stop) };
        }
        // Hold back the longest suffix that is a proper prefix of a stop string.
        let keep = self
            .stops
            .iter()
            .map(|s| longest_suffix_prefix(&self.held, s))
            .max()
            .unwrap_or(0);
        let cut = self.held.len() - keep;
        let emit = self.held[..cut].to_string();
        self.held.drain(..cut);
        StopOutcome { emit, stop: None }
    }

    /// Releases held text when generation ends for another reason.
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

/// Length of the longest suffix of `text` that is a proper prefix of `stop`.
fn longest_suffix_prefix(text: &str, stop: &str) -> usize {
    let max = (stop.len() - 1).min(text.len());
    (1..=max)
        .rev()
        .find(|&n| text.is_char_boundary(text.len() - n) && stop.starts_with(&text[text.len() - n..]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matcher(stops: &[&str]) -> StopMatcher {
        StopMatcher::new(BTreeSet::from([2]), stops.iter().map(|s| s.to_string()).collect(), |s| (s == "<|end|>").then_some(7))
    }

    #[test]
    fn a_stop_naming_a_special_token_matches_its_id_not_text() {
        let mut m = matcher(&["<|end|>", "x"]);
        assert_eq!(m.stop_token(7), Some("<|end|>"));
        assert_eq!(m.stop_token(2), None);
        assert_eq!(m.push("a <|end|> b").emit, "a <|end|> b", "the special token's text is not a text stop");
        assert_eq!(m.push("x").stop.as_deref(), Some("x"));
    }

    #[test]
    fn stop_string_split_across_chunks_is_never_emitted() {
        let mut m = matcher(&["</end>"]);
        assert_eq!(m.push("hello </"), StopOutcome { emit: "hello ".into(), stop: None });
        assert_eq!(m.push("en"), StopOutcome { emit: "".into(), stop: None });
        assert_eq!(m.push("d> tail"), StopOutcome { emit: "".into(), stop: Some("</end>".into()) });
    }

    #[test]
    fn false_start_is_released_once_it_cannot_match() {
        let mut m = matcher(&["STOP"]);
        assert_eq!(m.push("a ST").emit, "a ");
        assert_eq!(m.push("AR").emit, "STAR");
        assert_eq!(m.push("x").emit, "x");
        assert_eq!(m.flush(), "");
    }

    #[test]
    fn earliest_of_several_stops_wins_and_eos_is_recognised() {
        let mut m = matcher(&["bb", "a"]);
        let out = m.push("xxbba");
        assert_eq!(out, StopOutcome { emit: "xx".into(), stop: Some("bb".into()) });
        assert!(m.is_eos(2) && !m.is_eos(3));
    }

    #[test]
    fn multibyte_text_is_cut_on_char_boundaries() {
        let mut m = matcher(&["é!"]);
        assert_eq!(m.push("café").emit, "caf");
        assert_eq!(m.flush(), "é");
    }
}
