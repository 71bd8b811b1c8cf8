//! The model's vocabulary as llguidance sees it: every token id's bytes (from
//! tokenizer.json's vocabulary and decoder) in a token trie, and our own
//! tokenizer for the literals of a grammar.

use std::collections::BTreeSet;
use std::sync::Arc;

use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

use crate::tokenizer::Tokenizer;

struct Vocab {
    trie: TokTrie,
    tokenizer: Arc<Tokenizer>,
}

impl TokenizerEnv for Vocab {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        // Text that is not UTF-8 (a grammar literal cut inside a character) goes
        // through the trie's greedy tokenizing; the rest as the model tokenizes it.
        self.trie.tokenize_with_greedy_fallback(s, |text| self.tokenizer.encode(text, false).unwrap_or_default())
    }
}

/// The token environment of `tokenizer`: token bytes read from its
/// tokenizer.json form (byte-level BPE, or SentencePiece with byte fallback),
/// with every end-of-sequence id as an end token.
pub fn token_env(tokenizer: Arc<Tokenizer>) -> Result<TokEnv, String> {
    let json = tokenizer.inner().to_string(false).map_err(|e| e.to_string())?;
    let json: serde_json::Value = serde_json::from_str(&json).map_err(|e| e.to_string())?;
    let mut words = llguidance::token_bytes_from_tokenizer_json(&json).map_err(|e| e.to_string())?;
    let vocab = tokenizer.inner().get_vocab_size(true).max(words.len());
    words.resize(vocab, Vec::new());
    let eos: BTreeSet<u32> = tokenizer.eos_ids().iter().copied().filter(|&t| (t as usize) < vocab).collect();
    let eos: Vec<u32> = if eos.is_empty() {
        // No end token known: one id no text maps to stands in (the grammar then
        // ends by completing, never by an end token).
        words.push(Vec::new());
        vec![vocab as u32]
    } else {
        eos.into_iter().collect()
    };
    let info = TokRxInfo::new(words.len() as u32, eos[0]);
    let trie = TokTrie::from(&info, &words).with_eos_tokens(&eos);
    Ok(Arc::new(Vocab { trie, tokenizer }))
}
