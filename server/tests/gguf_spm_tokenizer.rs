//! The `llama` (SentencePiece BPE) tokenizer of a GGUF file encodes and
//! decodes as SentencePiece itself: parity/spm_gguf.py trains tiny
//! SentencePiece BPE models (byte fallback, user-defined symbols, with and
//! without the dummy "▁" prefix, as Llama 2 and Gemma), writes them as
//! llama.cpp's converter writes a GGUF vocabulary, and gives SentencePiece's
//! ids for texts with leading, trailing and repeated spaces, newlines, digits,
//! characters only bytes can spell and user-defined symbols inside the text.
//! A Gemma-sized (262k) vocabulary builds and loads.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Instant;

use common::{python, repo};
use mlx_serve::gguf::GgufModel;
use mlx_serve::tokenizer::Tokenizer;
use serde_json::Value;

/// parity/spm_gguf.py's GGUF files and reference (built once per run).
fn reference() -> &'static Value {
    static REFERENCE: OnceLock<Value> = OnceLock::new();
    REFERENCE.get_or_init(|| {
        let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("spm_gguf");
        let run = Command::new(python()).arg(repo().join("parity/spm_gguf.py")).arg(&out).output().unwrap();
        assert!(run.status.success(), "spm_gguf.py failed:\n{}", String::from_utf8_lossy(&run.stderr));
        serde_json::from_str(&std::fs::read_to_string(out.join("reference.json")).unwrap()).unwrap()
    })
}

fn ids(v: &Value) -> Vec<u32> {
    serde_json::from_value(v.clone()).unwrap()
}

/// Every text of case `name` encodes to BOS and SentencePiece's ids, and
/// BOS + those ids + EOS decodes (special tokens skipped) to SentencePiece's
/// decoding of them; so do ids a streaming decoder meets (bytes cut short,
/// lone "▁" pieces or a user-defined symbol first).
fn check(name: &str) {
    let r = &reference()[name];
    let tok = Tokenizer::load(&PathBuf::from(r["gguf"].as_str().unwrap()), None).unwrap();
    let (bos, eos) = (r["bos"].as_u64().unwrap() as u32, r["eos"].as_u64().unwrap() as u32);
    assert!(tok.eos_ids().contains(&eos), "{name}: eos {eos} not among {:?}", tok.eos_ids());
    let texts = r["texts"].as_array().unwrap();
    assert!(texts.len() >= 20, "{r}");
    let pieces = |ids: &[u32]| -> Vec<String> { ids.iter().map(|&i| tok.inner().id_to_token(i).unwrap_or_default()).collect() };
    let mut wrong = Vec::new();
    let mut lone = 0;
    for (i, text) in texts.iter().enumerate() {
        let text = text.as_str().unwrap();
        let sp = ids(&r["ids"][i]);
        let mut want = vec![bos];
        want.extend(&sp);
        // The one difference, where the text is nothing but one user-defined
        // symbol: SentencePiece puts its dummy "▁" before it, we (as
        // llama.cpp) give the symbol alone (see spm_normalizer).
        if name == "prefix" && r["user_defined"].as_array().unwrap().iter().any(|s| s == text) {
            assert_eq!(r["pieces"][i], serde_json::json!(["▁", text]));
            want.remove(1);
            lone += 1;
        }
        let got = tok.encode(text, true).unwrap();
        if got != want {
            wrong.push(format!("{text:?}\n  sentencepiece: {:?}\n  ours:          {:?}", pieces(&want), pieces(&got)));
        }
        let mut around = vec![bos];
        around.extend(&sp);
        around.push(eos);
        let decoded = tok.decode(&around, true).unwrap();
        if decoded != r["decoded"][i].as_str().unwrap() {
            wrong.push(format!("decode of {text:?}: sentencepiece {:?}, ours {decoded:?}", r["decoded"][i]));
        }
    }
    for (i, stream) in r["decode_only"].as_array().unwrap().iter().enumerate() {
        let decoded = tok.decode(&ids(stream), true).unwrap();
        if decoded != r["decode_only_text"][i].as_str().unwrap() {
            wrong.push(format!("decode of {:?}: sentencepiece {:?}, ours {decoded:?}", pieces(&ids(stream)), r["decode_only_text"][i]));
        }
    }
    assert!(wrong.is_empty(), "{name}: {} differences from SentencePiece:\n{}", wrong.len(), wrong.join("\n"));
    assert_eq!(lone, if name == "prefix" { 1 } else { 0 }, "{name}: the texts that are one user-defined symbol");
    eprintln!("{name}: {} texts encode and decode as SentencePiece ({} pieces, types {})", texts.len(), r["vocab_size"], r["types"]);
}

// Llama 2, Mistral, Phi-3: a "▁" before the text.
#[test]
fn a_llama_sentencepiece_vocabulary_encodes_as_sentencepiece() {
    check("prefix");
}

// Gemma: add_space_prefix false.
#[test]
fn a_vocabulary_without_space_prefix_encodes_as_sentencepiece() {
    check("noprefix");
}

// A Gemma-sized vocabulary (262k pieces, ~510k merges derived from the
// scores) builds and loads whole. (How long it takes is printed, not tested:
// speed belongs in benchmarks.)
#[test]
fn a_gemma_sized_vocabulary_builds_and_loads() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.gguf");
    let run = Command::new(python()).arg(repo().join("parity/spm_gguf.py")).args(["--synthetic", "262144"]).arg(&path).output().unwrap();
    assert!(run.status.success(), "spm_gguf.py failed:\n{}", String::from_utf8_lossy(&run.stderr));
    let start = Instant::now();
    let parts = GgufModel::open(&path).unwrap().tokenizer().unwrap();
    let build = start.elapsed();
    assert!(parts.json.len() > 10 << 20, "{} bytes of tokenizer.json", parts.json.len());
    let start = Instant::now();
    let tok = Tokenizer::load(&path, None).unwrap();
    let load = start.elapsed();
    assert_eq!(tok.inner().get_vocab_size(true), 262144);
    eprintln!("262144-piece SentencePiece vocabulary: tokenizer.json built in {build:.2?}, whole tokenizer loaded in {load:.2?}");
}
