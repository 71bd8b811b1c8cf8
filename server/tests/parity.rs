//! Parity with mlx-lm 0.32.2: tiny random-weight models built by mlx-lm itself
//! (parity/make_fixture.py), greedy-decoded by mlx-lm and by our engine. Same
//! weights → the same token ids, and first-step log-probabilities within a
//! stated tolerance.
//!
//! Needs the Python reference (scripts/reference-env.sh → vendor/pyref, or
//! MLX_SERVE_PYTHON); without it the tests fail and say so.

mod common;

use common::fixture;
use mlx_serve::engine::{GenerateOptions, Generator, Sampler};
use mlx_serve::models;
use serde_json::{json, Value};

/// Greedy-decodes the fixture's prompt with our engine and compares with mlx-lm.
fn check_parity(name: &str, spec: Value, logprob_tol: f32) {
    let dir = fixture(name, &spec);
    check_parity_of(name, &dir, &dir, &spec, &models::LoadOptions::default(), logprob_tol);
}

/// Compares our engine on the model in `model_dir` (loaded with `load`) with the
/// reference of fixture `reference_dir`.
fn check_parity_of(
    name: &str,
    reference_dir: &std::path::Path,
    model_dir: &std::path::Path,
    spec: &Value,
    load: &models::LoadOptions,
    logprob_tol: f32,
) {
    let dir = reference_dir;
    let reference: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap()).unwrap();
    let prompt: Vec<u32> = serde_json::from_value(reference["prompt"].clone()).unwrap();
    let expected: Vec<u32> = serde_json::from_value(reference["tokens"].clone()).unwrap();
    // null marks a non-finite reference value (JSON has no infinities).
    let expected_lp: Vec<Option<f32>> = serde_json::from_value(reference["first_logprobs"].clone()).unwrap();

    let (model, _) = models::load_with(model_dir, load).unwrap();
    let opts = GenerateOptions {
        prefill_size: spec["prefill_size"].as_u64().unwrap_or(512) as usize,
        max_tokens: expected.len(),
        kv_bits: spec["kv_bits"].as_i64().map(|b| b as i32),
        kv_group_size: spec["kv_group_size"].as_i64().unwrap_or(64) as i32,
        // The fixture quantizes from the first token on (quantized_kv_start=0).
        quantized_kv_start: 0,
    };
    assert!(prompt.len() > opts.prefill_size, "the prompt must span several prefill chunks");
    let mut gen = Generator::new(model.as_ref(), &prompt, Sampler::greedy(), &opts).unwrap();
    let mut got = Vec::new();
    let mut first_lp = None;
    while let Some(step) = gen.next_token().unwrap() {
        if first_lp.is_none() {
            let lp = mlx_rs_safe::ops::astype(&step.logprobs, mlx_rs_safe::Dtype::Float32).unwrap();
            first_lp = Some(lp.to_vec::<f32>().unwrap());
        }
        got.push(step.token);
    }
    assert!(expected.len() >= 64);
    assert_eq!(got, expected, "{name}: greedy tokens differ from mlx-lm");
    // A reference that repeats one token would hide most mistakes.
    let distinct: std::collections::BTreeSet<_> = expected.iter().collect();
    assert!(distinct.len() >= 8, "{name}: the fixture's greedy output is degenerate ({} distinct tokens)", distinct.len());

    let lp = first_lp.unwrap();
    assert_eq!(lp.len(), expected_lp.len());
    let max_diff = lp
        .iter()
        .zip(&expected_lp)
        .map(|(a, b)| match b {
            Some(b) => (a - b).abs(),
            None if !a.is_finite() => 0.0,
            None => f32::INFINITY,
        })
        .fold(0.0f32, f32::max);
    eprintln!("{name}: {} tokens identical, first-step logprob max diff {max_diff}", got.len());
    assert!(max_diff <= logprob_tol, "{name}: first-step logprobs differ by {max_diff} > {logprob_tol}");
}

fn base_llama() -> Value {
    json!({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
           "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "vocab_size": 512,
           "rope_theta": 10000.0, "tie_word_embeddings": false, "max_position_embeddings": 2048})
}

fn spec(config: Value, dtype: &str, quantize: Option<Value>) -> Value {
    json!({"config": config, "dtype": dtype, "quantize": quantize, "prompt_tokens": 600,
           "max_tokens": 64, "prefill_size": 512, "seed": 0})
}

// Tolerance: the engine runs the same MLX ops in the same order as mlx-lm, so
// the log-probabilities agree to float rounding; 1e-3 leaves room for a
// different but equivalent reduction order.
const TOL: f32 = 1e-3;

#[test]
fn llama_bf16_greedy_matches_mlx_lm() {
    check_parity("llama_bf16", spec(base_llama(), "bfloat16", None), TOL);
}

#[test]
fn llama_4bit_with_llama3_rope_and_tied_embeddings_matches_mlx_lm() {
    let mut c = base_llama();
    c["tie_word_embeddings"] = json!(true);
    c["rope_scaling"] = json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0, "original_max_position_embeddings": 64});
    check_parity("llama_q4_llama3rope", spec(c, "bfloat16", Some(json!({"bits": 4, "group_size": 64}))), TOL);
}

#[test]
fn qwen2_bf16_greedy_matches_mlx_lm() {
    let c = json!({"model_type": "qwen2", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
                   "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-6, "vocab_size": 512,
                   "rope_theta": 1000000.0, "tie_word_embeddings": true, "max_position_embeddings": 2048});
    check_parity("qwen2_bf16", spec(c, "bfloat16", None), TOL);
}

#[test]
fn qwen2_4bit_greedy_matches_mlx_lm() {
    let c = json!({"model_type": "qwen2", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
                   "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-6, "vocab_size": 512,
                   "rope_theta": 1000000.0, "tie_word_embeddings": false, "max_position_embeddings": 2048});
    check_parity("qwen2_q4", spec(c, "bfloat16", Some(json!({"bits": 4, "group_size": 64}))), TOL);
}

#[test]
fn qwen3_bf16_greedy_matches_mlx_lm() {
    let c = json!({"model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
                   "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-6,
                   "vocab_size": 512, "rope_theta": 1000000.0, "tie_word_embeddings": true,
                   "max_position_embeddings": 2048});
    check_parity("qwen3_bf16", spec(c, "bfloat16", None), TOL);
}

#[test]
fn qwen3_8bit_greedy_matches_mlx_lm() {
    let c = json!({"model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
                   "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "rms_norm_eps": 1e-6,
                   "vocab_size": 512, "rope_theta": 1000000.0, "tie_word_embeddings": false,
                   "max_position_embeddings": 2048});
    check_parity("qwen3_q8", spec(c, "bfloat16", Some(json!({"bits": 8, "group_size": 32}))), TOL);
}

fn qwen3_moe() -> Value {
    json!({"model_type": "qwen3_moe", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-6,
           "vocab_size": 512, "rope_theta": 1000000.0, "tie_word_embeddings": false,
           "max_position_embeddings": 2048, "num_experts": 8, "num_experts_per_tok": 2,
           "decoder_sparse_step": 1, "mlp_only_layers": [], "moe_intermediate_size": 64,
           "norm_topk_prob": true})
}

// MoE with more experts than top-k: the prefill routes ≥ 64 rows (the sorted
// gather path), decode steps route 2 (the unsorted path).
// Unquantized MoE runs in float32: MLX's CPU gather_mm supports nothing else
// (mlx-lm itself fails on a bf16 one: "[GatherMM::eval] Currently only supports float32").
#[test]
fn qwen3_moe_fp32_greedy_matches_mlx_lm() {
    check_parity("qwen3_moe_fp32", spec(qwen3_moe(), "float32", None), TOL);
}

#[test]
fn qwen3_moe_4bit_with_a_dense_layer_matches_mlx_lm() {
    let mut c = qwen3_moe();
    c["mlp_only_layers"] = json!([0]);
    check_parity("qwen3_moe_q4", spec(c, "bfloat16", Some(json!({"bits": 4, "group_size": 64}))), TOL);
}

fn mixtral() -> Value {
    json!({"model_type": "mixtral", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 64,
           "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "vocab_size": 512,
           "num_local_experts": 6, "num_experts_per_tok": 2, "rope_theta": 1000000.0})
}

#[test]
fn mixtral_4bit_greedy_matches_mlx_lm() {
    check_parity("mixtral_q4", spec(mixtral(), "bfloat16", Some(json!({"bits": 4, "group_size": 64}))), TOL);
}

#[test]
fn mixtral_fp32_greedy_matches_mlx_lm() {
    check_parity("mixtral_fp32", spec(mixtral(), "float32", None), TOL);
}

fn qwen2_moe() -> Value {
    json!({"model_type": "qwen2_moe", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
           "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-6, "vocab_size": 512,
           "num_experts": 6, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
           "shared_expert_intermediate_size": 96, "tie_word_embeddings": false})
}

#[test]
fn qwen2_moe_with_shared_expert_fp32_matches_mlx_lm() {
    check_parity("qwen2_moe_fp32", spec(qwen2_moe(), "float32", None), TOL);
}

#[test]
fn qwen2_moe_4bit_greedy_matches_mlx_lm() {
    check_parity("qwen2_moe_q4", spec(qwen2_moe(), "bfloat16", Some(json!({"bits": 4, "group_size": 64}))), TOL);
}

fn olmoe() -> Value {
    json!({"model_type": "olmoe", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 64,
           "num_attention_heads": 4, "num_key_value_heads": 4, "rms_norm_eps": 1e-5, "vocab_size": 512,
           "num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": false,
           "tie_word_embeddings": false})
}

#[test]
fn olmoe_4bit_greedy_matches_mlx_lm() {
    check_parity("olmoe_q4", spec(olmoe(), "bfloat16", Some(json!({"bits": 4, "group_size": 64}))), TOL);
}

#[test]
fn olmoe_fp32_greedy_matches_mlx_lm() {
    check_parity("olmoe_fp32", spec(olmoe(), "float32", None), TOL);
}

// --kv-bits 8: the cache is quantized after the first prefill chunk, so the
// second chunk and every decode step attend through quantized matmuls.
fn llama_kv8() -> Value {
    let mut c = base_llama();
    c["num_attention_heads"] = json!(2);
    c["num_key_value_heads"] = json!(1);
    let mut sp = spec(c, "bfloat16", None);
    sp["kv_bits"] = json!(8);
    sp["kv_group_size"] = json!(32);
    sp
}

#[test]
fn llama_with_8bit_kv_cache_matches_mlx_lm() {
    check_parity("llama_bf16_kv8", llama_kv8(), TOL);
}

#[test]
fn qwen3_with_4bit_kv_cache_matches_mlx_lm() {
    let c = json!({"model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
                   "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "rms_norm_eps": 1e-6,
                   "vocab_size": 512, "rope_theta": 1000000.0, "tie_word_embeddings": false,
                   "max_position_embeddings": 2048});
    let mut sp = spec(c, "bfloat16", Some(json!({"bits": 4, "group_size": 64})));
    sp["kv_bits"] = json!(4);
    check_parity("qwen3_q4_kv4", sp, TOL);
}

fn gemma3() -> Value {
    json!({"model_type": "gemma3_text", "hidden_size": 64, "num_hidden_layers": 4, "intermediate_size": 128,
           "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 32, "rms_norm_eps": 1e-6,
           "vocab_size": 512, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
           "query_pre_attn_scalar": 32, "sliding_window": 128, "sliding_window_pattern": 2,
           "max_position_embeddings": 2048})
}

// Sliding-window layers with a window (128) far shorter than the prompt (600):
// rotating caches, windowed masks during prefill, round-robin writes when decoding.
#[test]
fn gemma3_bf16_with_sliding_window_shorter_than_the_prompt_matches_mlx_lm() {
    check_parity("gemma3_bf16", spec(gemma3(), "bfloat16", None), TOL);
}

// (No --kv-bits case: mlx-lm cannot quantize rotating caches at all — "RotatingKVCache
// Quantization NYI" — so there is no reference; we leave sliding layers unquantized.)
#[test]
fn gemma3_4bit_greedy_matches_mlx_lm() {
    check_parity("gemma3_q4", spec(gemma3(), "bfloat16", Some(json!({"bits": 4, "group_size": 32}))), TOL);
}

fn phi3(rope_scaling: Value, partial: f64) -> Value {
    json!({"model_type": "phi3", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
           "num_attention_heads": 2, "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "vocab_size": 512,
           "rope_theta": 10000.0, "rope_scaling": rope_scaling, "partial_rotary_factor": partial,
           "max_position_embeddings": 8192, "original_max_position_embeddings": 512,
           "tie_word_embeddings": false})
}

// Fused qkv / gate_up, longrope scaling (input scale ≠ 1 since 8192 > 512).
#[test]
fn phi3_bf16_with_longrope_matches_mlx_lm() {
    let factors: Vec<f64> = (0..16).map(|i| 1.0 + i as f64 * 0.25).collect();
    let scaling = json!({"type": "longrope", "short_factor": vec![1.0; 16], "long_factor": factors});
    check_parity("phi3_bf16_longrope", spec(phi3(scaling, 1.0), "bfloat16", None), TOL);
}

#[test]
fn phi3_4bit_with_partial_rotary_matches_mlx_lm() {
    check_parity("phi3_q4_partial", spec(phi3(Value::Null, 0.5), "bfloat16", Some(json!({"bits": 4, "group_size": 64}))), TOL);
}

// --quantize 4 at load on the float model equals mlx-lm's quantize_model on the
// same float weights (both fixtures start from the same seeded initialisation).
#[test]
fn quantizing_at_load_matches_mlx_lm_quantize_model() {
    let float_dir = fixture("llama_bf16", &spec(base_llama(), "bfloat16", None));
    let q_spec = spec(base_llama(), "bfloat16", Some(json!({"bits": 4, "group_size": 64})));
    let q_dir = fixture("llama_q4", &q_spec);
    let load = models::LoadOptions { quantize: Some(models::quant::QuantParams { bits: 4, group_size: 64 }) };
    check_parity_of("llama_bf16 --quantize 4", &q_dir, &float_dir, &q_spec, &load, TOL);
    // An already-quantized model is refused.
    let err = models::load_with(&q_dir, &load).err().unwrap().to_string();
    assert!(err.contains("already quantized"), "{err}");
}

/// The server's batched path against mlx-lm: the fixture's prompt, sent three
/// times at once beside two other prompts (so rows of different lengths share
/// the batch), decodes to mlx-lm's greedy text in every copy.
fn check_server_parity(name: &str, spec: Value, batched: bool, flags: &[&str]) {
    let dir = fixture(name, &spec);
    let reference: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap()).unwrap();
    let prompt: Vec<u32> = serde_json::from_value(reference["prompt"].clone()).unwrap();
    let expected: Vec<u32> = serde_json::from_value(reference["tokens"].clone()).unwrap();
    let tok = mlx_serve::tokenizer::Tokenizer::load(&dir, None).unwrap();
    let expected_text = tok.decode(&expected, true).unwrap();
    let mut args = vec!["--prefill-size", "512", "--prompt-cache-bytes", "0"];
    args.extend_from_slice(flags);
    let server = common::server::TestServer::start(&dir, &args);
    let bodies = [
        json!({"prompt": prompt, "max_tokens": expected.len(), "ignore_eos": true}),
        json!({"prompt": "the model", "max_tokens": 40, "ignore_eos": true}),
        json!({"prompt": prompt, "max_tokens": expected.len(), "ignore_eos": true}),
        json!({"prompt": &prompt[..100], "max_tokens": 30, "ignore_eos": true}),
        json!({"prompt": prompt, "max_tokens": expected.len(), "ignore_eos": true}),
    ];
    let texts: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = bodies
            .iter()
            .map(|b| {
                let server = &server;
                scope.spawn(move || {
                    let r = server.post_json("/v1/completions", b);
                    assert_eq!(r.status, 200, "{}", r.body);
                    r.json()["choices"][0]["text"].as_str().unwrap().to_string()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for i in [0, 2, 4] {
        assert_eq!(texts[i], expected_text, "{name}: request {i} through the server differs from mlx-lm");
    }
    let m = server.metrics();
    let rows = mlx_serve::metrics::counter_value(&m, "mlx_serve_decode_rows_total").unwrap();
    let steps = mlx_serve::metrics::counter_value(&m, "mlx_serve_decode_steps_total").unwrap();
    if batched {
        assert!(rows / steps > 1.5, "{name}: mean batch size {} — the requests did not share a batch", rows / steps);
    } else {
        assert_eq!(rows, steps, "{name}: caches that cannot be batched decode one sequence per step");
    }
}

#[test]
fn llama_bf16_through_the_batching_server_matches_mlx_lm() {
    check_server_parity("llama_bf16", spec(base_llama(), "bfloat16", None), true, &[]);
}

#[test]
fn qwen3_moe_4bit_through_the_batching_server_matches_mlx_lm() {
    let mut c = qwen3_moe();
    c["mlp_only_layers"] = json!([0]);
    check_server_parity("qwen3_moe_q4", spec(c, "bfloat16", Some(json!({"bits": 4, "group_size": 64}))), true, &[]);
}

#[test]
fn gemma3_with_sliding_windows_through_the_server_matches_mlx_lm() {
    // Rotating caches are not batched: these sequences decode interleaved.
    check_server_parity("gemma3_bf16", spec(gemma3(), "bfloat16", None), false, &[]);
}

#[test]
fn llama_with_8bit_kv_cache_through_the_server_matches_mlx_lm() {
    let flags = ["--kv-bits", "8", "--kv-group-size", "32", "--quantized-kv-start", "0"];
    check_server_parity("llama_bf16_kv8", llama_kv8(), false, &flags);
}
