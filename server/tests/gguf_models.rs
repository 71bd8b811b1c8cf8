//! GGUF model files: every supported family's parity fixture, written as
//! llama.cpp lays out a GGUF file (parity/hf_to_gguf.py: renamed tensors,
//! permuted q/k rows, Gemma's 1 + w norms, rope factors as tensors, Q4_1
//! blocks, the tokenizer as tokenizer.ggml.*), loads through `--model
//! FILE.gguf` and decodes mlx-lm's greedy tokens for the original folder.
//! The GGUF tokenizer encodes, decodes and renders chats as the folder's.
//! Damaged or unsupported files give errors naming the file and the field.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use common::engine::{drive, engine, reference};
use common::configs::{gemma3, llama, mixtral, olmoe, phi3_longrope, qwen2, qwen2_moe, qwen3, qwen3_moe, spec};
use common::{fixture, python, repo};
use mlx_serve::models;
use mlx_serve::tokenizer::Tokenizer;
use serde_json::{json, Value};

/// The fixture `name` as a GGUF file beside its folder.
fn as_gguf(dir: &Path) -> PathBuf {
    convert(dir, &[])
}

/// Written once per test run (tests sharing a fixture share its file: one
/// writes it while the others wait, so none reads a file being rewritten).
fn convert(dir: &Path, extra: &[&Path]) -> PathBuf {
    static WRITTEN: Mutex<BTreeSet<PathBuf>> = Mutex::new(BTreeSet::new());
    let mut written = WRITTEN.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let out = dir.with_extension(if extra.is_empty() { "gguf" } else { "q5_0.gguf" });
    if written.insert(out.clone()) {
        let run = Command::new(python()).arg(repo().join("parity/hf_to_gguf.py")).arg(dir).arg(&out).args(extra).output().unwrap();
        assert!(run.status.success(), "hf_to_gguf.py failed:\n{}", String::from_utf8_lossy(&run.stderr));
    }
    out
}


/// The GGUF copy of fixture `name` (its tokenizer and weights) decodes
/// mlx-lm's greedy tokens for the folder.
fn check_gguf(name: &str, spec: Value) {
    let dir = fixture(name, &spec);
    let gguf = as_gguf(&dir);
    let r = reference(&dir);
    let (mut e, _) = engine(&gguf, &gguf, &spec, &models::LoadOptions::default());
    let out = drive(&mut e, &[(&r.prompt, r.tokens.len())], &[0], None);
    assert_eq!(out[0].tokens, r.tokens, "{name}: the GGUF file decodes other tokens than mlx-lm on the folder");
    eprintln!("{name}: GGUF file gives mlx-lm's {} tokens", r.tokens.len());
}


// Q4_1 blocks (MLX 4-bit, group 32, float16 scales), embedding included; q/k
// rows permuted in their quantized form.
#[test]
fn llama_q4_1_gguf_matches_mlx_lm() {
    check_gguf("gguf_llama_f16_q4g32", spec(llama(), "float16", Some(json!({"bits": 4, "group_size": 32}))));
}

// Llama 3.1's rope scaling, which a GGUF file holds as rope_freqs factors.
#[test]
fn llama_with_llama3_rope_as_freq_factors_matches_mlx_lm() {
    let mut c = llama();
    c["rope_scaling"] = json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0, "original_max_position_embeddings": 64});
    check_gguf("gguf_llama_f32_llama3rope", spec(c, "float32", None));
}

#[test]
fn qwen2_bf16_gguf_matches_mlx_lm() {
    check_gguf("qwen2_bf16", spec(qwen2(true), "bfloat16", None));
}

#[test]
fn qwen3_bf16_gguf_matches_mlx_lm() {
    check_gguf("qwen3_bf16", spec(qwen3(16, true), "bfloat16", None));
}

#[test]
fn gemma3_bf16_gguf_matches_mlx_lm() {
    check_gguf("gemma3_bf16", spec(gemma3(), "bfloat16", None));
}

#[test]
fn phi3_bf16_with_longrope_gguf_matches_mlx_lm() {
    check_gguf("phi3_bf16_longrope", spec(phi3_longrope(), "bfloat16", None));
}

// MoE families in float32 (MLX's CPU gather_mm takes nothing else).
#[test]
fn qwen3_moe_fp32_gguf_matches_mlx_lm() {
    check_gguf("qwen3_moe_fp32", spec(qwen3_moe(), "float32", None));
}

#[test]
fn qwen2_moe_fp32_gguf_matches_mlx_lm() {
    check_gguf("qwen2_moe_fp32", spec(qwen2_moe(), "float32", None));
}

// Mixtral is llama in GGUF (q/k permuted), with experts.
#[test]
fn mixtral_fp32_gguf_matches_mlx_lm() {
    check_gguf("mixtral_fp32", spec(mixtral(), "float32", None));
}

#[test]
fn olmoe_fp32_gguf_matches_mlx_lm() {
    check_gguf("olmoe_fp32", spec(olmoe(), "float32", None));
}

// The tokenizer a GGUF file describes is the folder's: same ids for plain
// text, special tokens and non-ASCII text, same decoding, same chat prompt.
#[test]
fn the_gguf_tokenizer_is_the_folders() {
    let dir = fixture("qwen3_bf16", &spec(qwen3(16, true), "bfloat16", None));
    let gguf = as_gguf(&dir);
    let (a, b) = (Tokenizer::load(&dir, None).unwrap(), Tokenizer::load(&gguf, None).unwrap());
    for text in ["the model token server, 42 résumé 東京 🙂 ✓\n\n  spaces", "<|im_start|>user\nhello<|im_end|>", ""] {
        let ids = a.encode(text, true).unwrap();
        assert_eq!(b.encode(text, true).unwrap(), ids, "{text:?}");
        assert_eq!(b.decode(&ids, false).unwrap(), a.decode(&ids, false).unwrap());
        assert_eq!(b.decode(&ids, true).unwrap(), a.decode(&ids, true).unwrap());
    }
    let chat = json!([{"role": "user", "content": "hello"}]);
    assert_eq!(b.encode_chat(&chat, None).unwrap(), a.encode_chat(&chat, None).unwrap());
    assert_eq!(b.eos_ids(), a.eos_ids());
}

// Q5_0 blocks, which MLX cannot hold: dequantized to bfloat16 at load, the
// file decodes what a folder of those bfloat16 values decodes; with
// --quantize 4 both quantize to the same arrays and decode alike too.
#[test]
fn a_block_type_mlx_lacks_is_dequantized_and_can_be_requantized() {
    let dir = fixture("gguf_llama_f32", &spec(llama(), "float32", None));
    let folder = dir.with_extension("dequantized");
    let gguf = convert(&dir, &[Path::new("q5_0"), &folder]);
    let r = reference(&dir);
    let prompt = &r.prompt[..40];
    let tokens = |model: &Path, load: models::LoadOptions| {
        let (mut e, _) = engine(&dir, model, &spec(llama(), "float32", None), &load);
        drive(&mut e, &[(prompt, 24)], &[0], None).remove(0).tokens
    };
    let plain = tokens(&gguf, models::LoadOptions::default());
    assert_eq!(plain, tokens(&folder, models::LoadOptions::default()), "the dequantized GGUF differs from its values in a folder");
    let q4 = || models::LoadOptions { quantize: Some(models::quant::QuantSpec::affine(32, 4)), ..Default::default() };
    let requantized = tokens(&gguf, q4());
    assert_eq!(requantized, tokens(&folder, q4()), "--quantize 4 on the GGUF differs from it on the folder");
    assert_ne!(plain, requantized, "--quantize changed nothing");
}

// A split file (llama.cpp's gguf-split: three shards, the metadata in the
// first) loads from any of its shards or from its folder; a missing shard is
// named.
#[test]
fn a_split_gguf_file_loads_from_any_shard() {
    let sp = spec(llama(), "float16", Some(json!({"bits": 4, "group_size": 32})));
    let dir = fixture("gguf_llama_f16_q4g32", &sp);
    let shards = dir.with_extension("shards");
    let _ = std::fs::remove_dir_all(&shards);
    std::fs::create_dir_all(&shards).unwrap();
    let run = Command::new(python()).arg(repo().join("parity/hf_to_gguf.py")).arg(&dir).arg(shards.join("m.gguf")).args(["split", "3"]).output().unwrap();
    assert!(run.status.success(), "hf_to_gguf.py failed:\n{}", String::from_utf8_lossy(&run.stderr));
    let r = reference(&dir);
    let second = shards.join("m-00002-of-00003.gguf");
    for model in [&second, &shards] {
        let (mut e, _) = engine(model, model, &sp, &models::LoadOptions::default());
        let out = drive(&mut e, &[(&r.prompt, r.tokens.len())], &[0], None);
        assert_eq!(out[0].tokens, r.tokens, "{}: the split file decodes other tokens than mlx-lm", model.display());
    }
    std::fs::remove_file(shards.join("m-00003-of-00003.gguf")).unwrap();
    let e = models::load(&shards.join("m-00001-of-00003.gguf")).err().unwrap().to_string();
    assert!(e.contains("m-00003-of-00003.gguf"), "{e}");
}
