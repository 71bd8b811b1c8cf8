//! The tokenizer a GGUF file describes (`tokenizer.ggml.*`), as the
//! tokenizer.json that Hugging Face ships for the same model:
//! - `gpt2`: byte-level BPE with the vocabulary and merges as stored, and the
//!   pre-tokenizer that `tokenizer.ggml.pre` names;
//! - `llama`: SentencePiece BPE (Llama 2, Mistral, Gemma, Phi-3): merges
//!   derived from the pieces' scores as transformers' converter derives them,
//!   byte fallback, "▁" for spaces.
//!
//! Control tokens (type 3) become special added tokens and user-defined ones
//! (type 4) plain added tokens, as llama.cpp's converter made them from them.

use std::collections::HashMap;

use serde_json::{json, Value};

use super::Metadata;
use crate::error::Result;
use crate::tokenizer::TemplateTokens;

/// What the tokenizer files of a model folder would hold.
pub struct TokenizerParts {
    /// tokenizer.json's text.
    pub json: String,
    pub tokens: TemplateTokens,
    pub chat_template: Option<String>,
    /// End of generation: eos, and end-of-turn tokens where named.
    pub eos_ids: Vec<u32>,
}

const NORMAL: i64 = 1;
const CONTROL: i64 = 3;
const USER_DEFINED: i64 = 4;
const UNKNOWN: i64 = 2;

/// Llama 3's split: contractions, letters, 1-3 digits, punctuation, newlines.
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen 2's: Llama 3's with every digit alone.
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

fn byte_level(use_regex: bool) -> Value {
    json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex})
}

fn split(pattern: &str) -> Value {
    json!({"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": false})
}

/// The pre-tokenizer (and normalizer) of a `gpt2` vocabulary's `pre` kind.
fn gpt2_pre(meta: &Metadata, pre: &str) -> Result<(Value, Value)> {
    Ok(match pre {
        "default" | "gpt2" | "gpt-2" | "olmo" => (byte_level(true), Value::Null),
        // Every digit alone, then GPT-2's split.
        "smollm" => (json!({"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": true}, byte_level(true)]}), Value::Null),
        "llama-bpe" | "llama3" => (json!({"type": "Sequence", "pretokenizers": [split(LLAMA3_SPLIT), byte_level(false)]}), Value::Null),
        "qwen2" => (json!({"type": "Sequence", "pretokenizers": [split(QWEN2_SPLIT), byte_level(false)]}), json!({"type": "NFC"})),
        other => {
            return Err(meta.error(format!(
                "tokenizer.ggml.pre {other:?} is not a pre-tokenizer this build knows (default, gpt2, smollm, llama-bpe, qwen2, olmo)"
            )))
        }
    })
}

/// SentencePiece BPE merges from piece scores: every split of a piece into two
/// pieces of the vocabulary is a merge, ranked by the whole piece's score
/// (higher first), ties in vocabulary order — transformers' SentencePiece
/// extractor's order, and SentencePiece's own: its BPE joins first the
/// adjacent pair whose join is the best-scored piece.
///
/// Ranked as ids, turned into strings once: a 262k vocabulary (Gemma 3) has
/// ~500k merges.
fn spm_merges(vocab: &[&str], ids: &HashMap<&str, usize>, scores: &[f64], types: &[i64]) -> Vec<Value> {
    let mut merges: Vec<(f64, u32, u32)> = Vec::new();
    for (id, piece) in vocab.iter().enumerate() {
        if types[id] != NORMAL {
            continue;
        }
        let first = merges.len();
        for (cut, _) in piece.char_indices().skip(1) {
            let (l, r) = piece.split_at(cut);
            if let Some(&li) = ids.get(l) {
                if let Some(&ri) = ids.get(r) {
                    merges.push((scores[id], li as u32, ri as u32));
                }
            }
        }
        merges[first..].sort_unstable_by_key(|&(_, l, r)| (l, r));
    }
    // Stable: equal scores keep vocabulary order.
    merges.sort_by(|a, b| b.0.total_cmp(&a.0));
    merges.into_iter().map(|(_, l, r)| json!([vocab[l as usize], vocab[r as usize]])).collect()
}

/// `text` as a literal in an Oniguruma pattern (the tokenizers crate's regexes).
fn regex_literal(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// A SentencePiece normalizer: spaces as "▁", with the dummy "▁" before the
/// text when `prefix`.
///
/// SentencePiece puts the "▁" before the whole text and then splits off its
/// user-defined symbols, which never merge: "<start_of_turn>user" is "▁",
/// "<start_of_turn>", "user". Those symbols are added tokens matched in the
/// normalized text ("normalized": true: a symbol "a b" is "a▁b" there), but
/// the tokenizers crate normalizes the symbols themselves with the same
/// normalizer to match them, and Prepend would make "<start_of_turn>" the
/// pattern "▁<start_of_turn>", which then swallows the "▁" of a preceding
/// space and misses the symbol right after a word. So the prefix is taken off
/// again from a text that is exactly one symbol: the symbols' patterns stay
/// themselves, and only a text (or a run between control tokens) that is
/// nothing but one user-defined symbol loses SentencePiece's lone "▁" before it.
fn spm_normalizer(prefix: bool, user_defined: &[&str]) -> Value {
    let replace = json!({"type": "Replace", "pattern": {"String": " "}, "content": "▁"});
    if !prefix {
        return replace;
    }
    let mut normalizers = vec![json!({"type": "Prepend", "prepend": "▁"}), replace];
    if !user_defined.is_empty() {
        let symbols: Vec<String> = user_defined.iter().map(|t| regex_literal(&t.replace(' ', "▁"))).collect();
        let pattern = format!("\\A▁(?=(?:{})\\z)", symbols.join("|"));
        normalizers.push(json!({"type": "Replace", "pattern": {"Regex": pattern}, "content": ""}));
    }
    json!({"type": "Sequence", "normalizers": normalizers})
}

/// BOS/EOS added around a sequence, as the post-processor adds them: each a
/// (text, id) pair.
fn post_processor(bos: Option<(&str, usize)>, eos: Option<(&str, usize)>) -> Value {
    let mut single = Vec::new();
    let mut pair = Vec::new();
    let mut special = serde_json::Map::new();
    let mut add = |token: Option<(&str, usize)>, single: &mut Vec<Value>, pair: &mut Vec<Value>| {
        if let Some((text, id)) = token {
            single.push(json!({"SpecialToken": {"id": text, "type_id": 0}}));
            pair.push(json!({"SpecialToken": {"id": text, "type_id": 0}}));
            special.insert(text.into(), json!({"id": text, "ids": [id], "tokens": [text]}));
        }
    };
    add(bos, &mut single, &mut pair);
    single.push(json!({"Sequence": {"id": "A", "type_id": 0}}));
    pair.push(json!({"Sequence": {"id": "A", "type_id": 0}}));
    add(eos, &mut single, &mut pair);
    pair.push(json!({"Sequence": {"id": "B", "type_id": 1}}));
    json!({"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": special})
}

pub fn build(meta: &Metadata) -> Result<TokenizerParts> {
    let model = meta.opt_str("tokenizer.ggml.model")?.ok_or_else(|| meta.error("missing metadata tokenizer.ggml.model (the file has no tokenizer)"))?;
    let vocab = meta.strings("tokenizer.ggml.tokens")?.ok_or_else(|| meta.error("missing metadata tokenizer.ggml.tokens"))?;
    let n = vocab.len();
    let types: Vec<i64> = match meta.numbers("tokenizer.ggml.token_type")? {
        Some(t) if t.len() == n => t.iter().map(|&x| x as i64).collect(),
        Some(t) => return Err(meta.error(format!("tokenizer.ggml.token_type has {} entries for {n} tokens", t.len()))),
        None => vec![1; n],
    };
    let token = |key: &str| -> Result<Option<usize>> {
        match meta.opt_int(key)? {
            Some(id) if (id as usize) < n => Ok(Some(id as usize)),
            Some(id) => Err(meta.error(format!("{key} {id} is not a token id (the vocabulary has {n})"))),
            None => Ok(None),
        }
    };
    let bos = token("tokenizer.ggml.bos_token_id")?;
    let eos = token("tokenizer.ggml.eos_token_id")?;
    let unk = token("tokenizer.ggml.unknown_token_id")?;
    let pad = token("tokenizer.ggml.padding_token_id")?;
    let spm = match model.as_str() {
        "gpt2" => false,
        "llama" => true,
        other => return Err(meta.error(format!("tokenizer.ggml.model {other:?} is not supported (gpt2 byte-level BPE and llama SentencePiece BPE are)"))),
    };
    let add_bos = meta.opt_bool("tokenizer.ggml.add_bos_token")?.unwrap_or(spm);
    let add_eos = meta.opt_bool("tokenizer.ggml.add_eos_token")?.unwrap_or(false);
    let ids: HashMap<&str, usize> = vocab.iter().enumerate().map(|(i, t)| (*t, i)).collect();

    let added: Vec<Value> = (0..n)
        .filter(|&i| matches!(types[i], CONTROL | USER_DEFINED) || (spm && types[i] == UNKNOWN))
        .map(|i| {
            json!({"id": i, "content": vocab[i], "single_word": false, "lstrip": false, "rstrip": false,
                   "normalized": types[i] == USER_DEFINED, "special": types[i] != USER_DEFINED})
        })
        .collect();
    let vocab_map: serde_json::Map<String, Value> = vocab.iter().enumerate().map(|(i, t)| (t.to_string(), json!(i))).collect();
    let post = {
        let b = bos.filter(|_| add_bos).map(|i| (vocab[i], i));
        let e = eos.filter(|_| add_eos).map(|i| (vocab[i], i));
        if b.is_some() || e.is_some() {
            post_processor(b, e)
        } else {
            Value::Null
        }
    };
    let (mut tokenizer, merges) = if spm {
        let scores = meta.numbers("tokenizer.ggml.scores")?.ok_or_else(|| meta.error("missing metadata tokenizer.ggml.scores (a llama tokenizer ranks its pieces by score)"))?;
        if scores.len() != n {
            return Err(meta.error(format!("tokenizer.ggml.scores has {} entries for {n} tokens", scores.len())));
        }
        let prefix = meta.opt_bool("tokenizer.ggml.add_space_prefix")?.unwrap_or(true);
        let user_defined: Vec<&str> = (0..n).filter(|&i| types[i] == USER_DEFINED).map(|i| vocab[i]).collect();
        let normalizer = spm_normalizer(prefix, &user_defined);
        let mut decoders = vec![
            json!({"type": "Replace", "pattern": {"String": "▁"}, "content": " "}),
            json!({"type": "ByteFallback"}),
            json!({"type": "Fuse"}),
        ];
        if prefix {
            decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
        }
        let tokenizer = json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
            "normalizer": normalizer, "pre_tokenizer": null, "post_processor": post,
            "decoder": {"type": "Sequence", "decoders": decoders},
            "model": {"type": "BPE", "dropout": null, "unk_token": unk.map(|i| vocab[i]), "continuing_subword_prefix": null,
                      "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true, "ignore_merges": false}
        });
        (tokenizer, spm_merges(&vocab, &ids, &scores, &types))
    } else {
        let merges = meta.strings("tokenizer.ggml.merges")?.ok_or_else(|| meta.error("missing metadata tokenizer.ggml.merges (a gpt2 tokenizer needs its merges)"))?;
        let merges: Vec<Value> = merges
            .iter()
            .map(|m| m.split_once(' ').map(|(a, b)| json!([a, b])).ok_or_else(|| meta.error(format!("tokenizer.ggml.merges entry {m:?} is not two tokens"))))
            .collect::<Result<_>>()?;
        let pre = meta.opt_str("tokenizer.ggml.pre")?.unwrap_or_else(|| "default".into());
        let (pre_tokenizer, normalizer) = gpt2_pre(meta, &pre)?;
        let tokenizer = json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
            "normalizer": normalizer, "pre_tokenizer": pre_tokenizer,
            "post_processor": if post.is_null() { json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": true}) } else { post },
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
            "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                      "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false}
        });
        (tokenizer, merges)
    };
    // Moved in, not written in json! above, which serializes a copy of what
    // it is given: a 262k vocabulary (Gemma 3) has ~500k merges.
    tokenizer["model"]["vocab"] = Value::Object(vocab_map);
    tokenizer["model"]["merges"] = Value::Array(merges);
    let text = |i: Option<usize>| i.map(|i| vocab[i].to_string());
    let mut eos_ids: Vec<u32> = eos.into_iter().map(|i| i as u32).collect();
    for key in ["tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"] {
        if let Some(id) = token(key)? {
            eos_ids.push(id as u32);
        }
    }
    Ok(TokenizerParts {
        json: tokenizer.to_string(),
        tokens: TemplateTokens { bos_token: text(bos), eos_token: text(eos), pad_token: text(pad), unk_token: text(unk) },
        chat_template: meta.opt_str("tokenizer.chat_template")?,
        eos_ids,
    })
}
