//! `mlx-serve generate` end to end: the binary on a tiny mlx-lm-built model.

mod common;

use std::process::Command;

use serde_json::{json, Value};

fn model() -> std::path::PathBuf {
    let config = json!({"model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
                        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-6,
                        "vocab_size": 512, "rope_theta": 1000000.0, "tie_word_embeddings": true,
                        "max_position_embeddings": 2048});
    common::fixture("cli_qwen3", &json!({"config": config, "dtype": "bfloat16", "quantize": null,
                                         "prompt_tokens": 8, "max_tokens": 4, "seed": 3}))
}

fn generate(args: &[&str]) -> std::process::Output {
    let bin = std::env::var("MLX_SERVE_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_mlx-serve").into());
    Command::new(bin).arg("generate").args(args).output().unwrap()
}

fn json_report(args: &[&str]) -> Value {
    let out = generate(args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn json_report_has_every_field_and_honours_max_tokens() {
    let m = model();
    let m = m.to_str().unwrap();
    let r = json_report(&["--model", m, "--prompt", "the model", "--max-tokens", "12", "--ignore-eos", "--json"]);
    for field in ["prompt_tokens", "prompt_tps", "generation_tps", "ttft_ms", "peak_memory_bytes"] {
        assert!(r[field].is_number(), "{field} missing in {r}");
    }
    assert_eq!(r["generated_token_ids"].as_array().unwrap().len(), 12);
    assert_eq!(r["finish_reason"], "length");
    assert!(r["text"].is_string());
    // The chat template wrapped the prompt: more tokens than the raw text has.
    let raw = json_report(&["--model", m, "--prompt", "the model", "--max-tokens", "1", "--ignore-chat-template", "--json"]);
    assert!(r["prompt_tokens"].as_u64() > raw["prompt_tokens"].as_u64(), "{r} vs {raw}");
}

/// `--logprobs N`: each generated token's log-probability with the N most
/// likely tokens of its step, the chosen one among them under greedy decoding.
#[test]
fn logprobs_name_each_token_and_its_most_likely_alternatives() {
    let m = model();
    let r = json_report(&["--model", m.to_str().unwrap(), "--prompt", "the model", "--max-tokens", "6", "--ignore-eos", "--json", "--logprobs", "3"]);
    let ids = r["generated_token_ids"].as_array().unwrap();
    let lps = r["generated_logprobs"].as_array().unwrap_or_else(|| panic!("no generated_logprobs in {r}"));
    assert_eq!(lps.len(), ids.len());
    for (lp, id) in lps.iter().zip(ids) {
        assert_eq!(&lp["token"], id);
        let top = lp["top"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        let values: Vec<f64> = top.iter().map(|t| t[1].as_f64().unwrap()).collect();
        assert!(values.windows(2).all(|w| w[0] >= w[1]), "most likely first: {top:?}");
        assert!(values[0] <= 0.0 && (lp["logprob"].as_f64().unwrap() - values[0]).abs() < 1e-6, "greedy takes the most likely: {lp}");
    }
    let plain = json_report(&["--model", m.to_str().unwrap(), "--prompt", "x", "--max-tokens", "1", "--json"]);
    assert!(plain.get("generated_logprobs").is_none(), "only when asked: {plain}");
    let out = generate(&["--model", m.to_str().unwrap(), "--logprobs", "2"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("--json"), "--logprobs needs --json");
}

#[test]
fn the_same_seed_reproduces_a_sampled_generation() {
    let m = model();
    let m = m.to_str().unwrap();
    let args = ["--model", m, "--prompt", "cache", "--max-tokens", "16", "--ignore-eos", "--temp", "1.0", "--seed", "11", "--json"];
    let a = json_report(&args);
    assert_eq!(a["generated_token_ids"], json_report(&args)["generated_token_ids"]);
    let mut other = args;
    other[10] = "12";
    assert_ne!(a["generated_token_ids"], json_report(&other)["generated_token_ids"]);
}

#[test]
fn streaming_text_output_ends_with_the_statistics() {
    let m = model();
    let out = generate(&["--model", m.to_str().unwrap(), "--prompt", "hello", "--max-tokens", "5", "--ignore-eos"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Prompt:") && text.contains("Generation: 5 tokens") && text.contains("Peak memory:"), "{text}");
}

#[test]
fn bad_arguments_fail_cleanly() {
    let out = generate(&["--model", "/nonexistent/model", "--prompt", "x"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/model"), "{}", String::from_utf8_lossy(&out.stderr));
    let m = model();
    let out = generate(&["--model", m.to_str().unwrap(), "--temp=-1"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("temperature must be >= 0"));
    let out = generate(&["--model", m.to_str().unwrap(), "--kv-bits", "7"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--kv-bits must be one of"));
}
