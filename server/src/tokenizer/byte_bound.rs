//! How many bytes of text one token can stand for, read from tokenizer.json,
//! so that a prompt too long for the context is refused from its length alone,
//! before tokenizing it (which peaks at ~90 bytes of memory per byte of text).
//!
//! The bound holds when every byte of the text ends up inside some token:
//! a byte-level alphabet or byte fallback (no unknown token that could swallow
//! a run of text), pre-tokenizers that drop nothing, and normalizers whose
//! worst shrinking is known. Then `tokens >= bytes / (longest token × shrink)`.
//! Tokenizers outside that (BERT-style whitespace splitting, stripping
//! normalizers, unknown components) get no bound.

use serde_json::Value;

fn kind(v: &Value) -> Option<&str> {
    v.get("type").and_then(Value::as_str)
}

/// The most a normalizer can shrink text (bytes in per byte out), if bounded.
fn normalizer_shrink(n: &Value) -> Option<usize> {
    if n.is_null() {
        return Some(1);
    }
    match kind(n)? {
        "Sequence" => n.get("normalizers")?.as_array()?.iter().try_fold(1, |acc, n| Some(acc * normalizer_shrink(n)?)),
        "Prepend" | "ByteLevel" => Some(1),
        // Composition and singleton mappings: three code points become one
        // Hangul syllable, KELVIN SIGN (3 bytes) becomes `K`.
        "NFC" | "NFD" | "Lowercase" => Some(3),
        // Compatibility mappings also take 4-byte mathematical letters to ASCII.
        "NFKC" | "NFKD" => Some(4),
        "Replace" => {
            let pattern = n.get("pattern")?.get("String")?.as_str()?;
            let content = n.get("content")?.as_str()?;
            (!content.is_empty()).then(|| pattern.len().div_ceil(content.len()).max(1))
        }
        // Strip, StripAccents, BertNormalizer, Precompiled, Nmt, regex
        // replacements: they can delete text without bound.
        _ => None,
    }
}

/// Whether a pre-tokenizer keeps every byte of the text.
fn keeps_all_text(p: &Value) -> bool {
    if p.is_null() {
        return true;
    }
    match kind(p) {
        Some("Sequence") => p.get("pretokenizers").and_then(Value::as_array).is_some_and(|v| v.iter().all(keeps_all_text)),
        Some("ByteLevel" | "Metaspace" | "Digits" | "Punctuation" | "UnicodeScripts") => true,
        Some("Split") => p.get("behavior").and_then(Value::as_str) != Some("Removed"),
        // Whitespace, WhitespaceSplit, BertPreTokenizer drop the whitespace.
        _ => false,
    }
}

fn has_byte_level(v: &Value) -> bool {
    match kind(v) {
        Some("ByteLevel") => true,
        Some("Sequence") => ["pretokenizers", "decoders"]
            .iter()
            .filter_map(|k| v.get(*k).and_then(Value::as_array))
            .any(|parts| parts.iter().any(has_byte_level)),
        _ => false,
    }
}

/// The most bytes of input text a single token of `tokenizer_json` (the parsed
/// tokenizer.json) stands for, when that is bounded.
pub fn max_bytes_per_token(tokenizer_json: &Value) -> Option<usize> {
    let model = tokenizer_json.get("model")?;
    let pre = tokenizer_json.get("pre_tokenizer").unwrap_or(&Value::Null);
    // A byte-level vocabulary spells each byte as one character.
    let byte_level = has_byte_level(pre) || tokenizer_json.get("decoder").is_some_and(has_byte_level);
    let byte_fallback = model.get("byte_fallback").and_then(Value::as_bool) == Some(true);
    if !(byte_level || byte_fallback) || !keeps_all_text(pre) {
        return None;
    }
    let shrink = normalizer_shrink(tokenizer_json.get("normalizer").unwrap_or(&Value::Null))?;
    // Elsewhere a token's UTF-8 length bounds what it covers: `▁` (3 bytes)
    // and `<0x41>` (6) stand for one byte each.
    let span = |token: &str| if byte_level { token.chars().count() } else { token.len() };
    let vocab: Vec<&str> = match (kind(model), model.get("vocab")?) {
        (Some("BPE"), Value::Object(v)) => v.keys().map(String::as_str).collect(),
        (Some("Unigram"), Value::Array(v)) => v.iter().filter_map(|e| e.get(0).and_then(Value::as_str)).collect(),
        _ => return None,
    };
    let added = tokenizer_json.get("added_tokens").and_then(Value::as_array).into_iter().flatten();
    let added = added.filter_map(|t| t.get("content").and_then(Value::as_str));
    let longest = vocab.into_iter().chain(added).map(span).max()?;
    Some(longest.max(1) * shrink)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn bpe(extra: Value) -> Value {
        let mut t = json!({
            "model": {"type": "BPE", "vocab": {"a": 0, "ĠĠĠĠ": 1, "hello": 2}, "merges": []},
            "added_tokens": [{"id": 3, "content": "<|im_start|>"}],
            "pre_tokenizer": {"type": "ByteLevel"},
            "normalizer": null,
        });
        for (k, v) in extra.as_object().unwrap() {
            t[k] = v.clone();
        }
        t
    }

    #[test]
    fn byte_level_tokens_count_characters_and_added_tokens_count() {
        // <|im_start|> (12 bytes) is the longest; ĠĠĠĠ is 4 bytes of text, not 8.
        assert_eq!(max_bytes_per_token(&bpe(json!({}))), Some(12));
        assert_eq!(max_bytes_per_token(&bpe(json!({"added_tokens": []}))), Some(5));
    }

    #[test]
    fn normalizers_that_can_shrink_text_widen_the_bound() {
        let nfc = json!({"normalizer": {"type": "NFC"}});
        assert_eq!(max_bytes_per_token(&bpe(nfc)), Some(36));
        let llama2 = json!({"normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"}, {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
            "pre_tokenizer": null, "model": {"type": "BPE", "byte_fallback": true, "vocab": {"▁the": 0, "<0x41>": 1}}, "added_tokens": []});
        assert_eq!(max_bytes_per_token(&bpe(llama2)), Some(6));
    }

    #[test]
    fn tokenizers_that_can_drop_text_have_no_bound() {
        assert_eq!(max_bytes_per_token(&bpe(json!({"normalizer": {"type": "BertNormalizer"}}))), None);
        assert_eq!(max_bytes_per_token(&bpe(json!({"normalizer": {"type": "Strip"}}))), None);
        assert_eq!(max_bytes_per_token(&bpe(json!({"pre_tokenizer": {"type": "Whitespace"}}))), None);
        let unk = json!({"pre_tokenizer": null, "model": {"type": "BPE", "unk_token": "<unk>", "vocab": {"a": 0}}});
        assert_eq!(max_bytes_per_token(&bpe(unk)), None, "an unknown token can stand for any run of text");
        let wordpiece = json!({"model": {"type": "WordPiece", "vocab": {"a": 0}}});
        assert_eq!(max_bytes_per_token(&bpe(wordpiece)), None);
    }
}
