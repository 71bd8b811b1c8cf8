//! Incremental detokenization: turns a growing list of token ids into text
//! deltas, never emitting a broken UTF-8 sequence.
//!
//! Byte-level BPE vocabularies split multi-byte characters across tokens, so
//! decoding one token at a time would print U+FFFD. We keep a window of recent
//! tokens, decode the window, and emit only text past what was emitted before,
//! holding it back while it still ends in a replacement character (the rest of
//! the character has not been generated yet). Decoding a window rather than a
//! single token also keeps the spaces that SentencePiece-style decoders add or
//! strip depending on the previous token.

use tokenizers::Tokenizer;

use crate::error::{Error, Result};

pub struct StreamingDetokenizer {
    tokens: Vec<u32>,
    /// Start of the window whose decoded text is the reference for the next delta.
    prefix_offset: usize,
    /// End of what has been emitted.
    read_offset: usize,
    skip_special_tokens: bool,
}

impl StreamingDetokenizer {
    pub fn new(skip_special_tokens: bool) -> StreamingDetokenizer {
        StreamingDetokenizer { tokens: Vec::new(), prefix_offset: 0, read_offset: 0, skip_special_tokens }
    }

    /// Adds a token; returns the text it completes (possibly empty).
    pub fn push(&mut self, tokenizer: &Tokenizer, token: u32) -> Result<String> {
        self.tokens.push(token);
        let decode = |ids: &[u32]| {
            tokenizer.decode(ids, self.skip_special_tokens).map_err(|e| Error::Tokenizer(e.to_string()))
        };
        let prefix = decode(&self.tokens[self.prefix_offset..self.read_offset])?;
        let full = decode(&self.tokens[self.prefix_offset..])?;
        if full.len() > prefix.len() && !full.ends_with('\u{FFFD}') && full.is_char_boundary(prefix.len()) {
            let delta = full[prefix.len()..].to_string();
            self.prefix_offset = self.read_offset;
            self.read_offset = self.tokens.len();
            Ok(delta)
        } else {
            Ok(String::new())
        }
    }

    /// Text still held back at the end of generation (an incomplete character is
    /// emitted as decoded, replacement character included, as mlx-lm does).
    pub fn finish(&mut self, tokenizer: &Tokenizer) -> Result<String> {
        let decode = |ids: &[u32]| {
            tokenizer.decode(ids, self.skip_special_tokens).map_err(|e| Error::Tokenizer(e.to_string()))
        };
        let prefix = decode(&self.tokens[self.prefix_offset..self.read_offset])?;
        let full = decode(&self.tokens[self.prefix_offset..])?;
        self.prefix_offset = self.tokens.len();
        self.read_offset = self.tokens.len();
        Ok(if full.len() > prefix.len() && full.is_char_boundary(prefix.len()) {
            full[prefix.len()..].to_string()
        } else {
            String::new()
        })
    }
}
