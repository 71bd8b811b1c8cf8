//! Parity with mlx-lm 0.32.2: tiny random-weight models built by mlx-lm itself
//! (parity/make_fixture.py), greedy-decoded by mlx-lm and by our engine. Same
//! weights → the same token ids, and first-step log-probabilities within a
//! stated tolerance.
//!
//! Needs the Python reference (scripts/reference-env.sh → vendor/pyref, or
//! MLX_SERVE_PYTHON); without it the tests fail and say so.

mod common;


use common::engine::{check_parity_of, drive, drive_with, engine, engine_with_prompt_cache, reference};
use common::configs::{gemma3, gemma4, gemma4_moe, gpt_oss, llama, mixtral, olmoe, phi3, phi3_longrope, qwen2, qwen2_moe, qwen3, qwen3_5, qwen3_5_moe, qwen3_moe, qwen3_next, spec};
use common::fixture;
use mlx_serve::metrics;
use mlx_serve::models;
use serde_json::{json, Value};

/// Greedy-decodes the fixture's prompt with the engine, alone and in a batch
/// of four prompts of different lengths arriving at different turns, and
/// compares every sequence with mlx-lm's tokens for it.
fn check_parity(name: &str, spec: Value, logprob_tol: f32) {
    let dir = fixture(name, &spec);
    check_parity_of(name, &dir, &dir, &spec, &models::LoadOptions::default(), logprob_tol);
}

// Tolerance: the engine runs the same MLX ops in the same order as mlx-lm, so
// the log-probabilities agree to float rounding; 1e-3 leaves room for a
// different but equivalent reduction order.
const TOL: f32 = 1e-3;

#[test]
fn llama_bf16_greedy_matches_mlx_lm() {
    check_parity("llama_bf16", spec(llama(), "bfloat16", None), TOL);
}

/// Repetition, presence and frequency penalties, each over its own window of
/// the newest tokens (prompt included), as mlx-lm's logits processors apply
/// them: the same greedy tokens alone and for each sequence of a batch.
#[test]
fn penalties_over_their_windows_give_mlx_lms_tokens() {
    let penalties = json!({"repetition_penalty": 1.3, "repetition_context_size": 20, "presence_penalty": 0.7,
                           "presence_context_size": 15, "frequency_penalty": 0.3, "frequency_context_size": 25});
    let mut s = spec(llama(), "float32", None);
    s["penalties"] = penalties.clone();
    let dir = fixture("llama_fp32_penalties", &s);
    let r = reference(&dir);
    let with_penalties = |_: usize, g: &mut mlx_serve::engine::Generation| {
        g.sampling.repetition_penalty = 1.3;
        g.sampling.repetition_context_size = 20;
        g.sampling.presence_penalty = 0.7;
        g.sampling.presence_context_size = 15;
        g.sampling.frequency_penalty = 0.3;
        g.sampling.frequency_context_size = 25;
    };
    let mut prompts: Vec<(&[u32], usize)> = vec![(&r.prompt, r.tokens.len())];
    prompts.extend(r.batch.iter().map(|(p, t)| (p.as_slice(), t.len())));
    let expected: Vec<&Vec<u32>> = std::iter::once(&r.tokens).chain(r.batch.iter().map(|(_, t)| t)).collect();
    let (mut alone, _) = engine(&dir, &dir, &s, &models::LoadOptions::default());
    let out = drive_with(&mut alone, &prompts[..1], &[0], None, with_penalties);
    assert_eq!(&out[0].tokens, expected[0], "alone: tokens differ from mlx-lm's with {penalties}");
    let (mut batched, _) = engine(&dir, &dir, &s, &models::LoadOptions::default());
    let outs = drive_with(&mut batched, &prompts, &[0, 2, 3, 6], None, with_penalties);
    for (i, (out, want)) in outs.iter().zip(&expected).enumerate() {
        assert_eq!(&out.tokens, *want, "sequence {i} of the batch differs from mlx-lm's tokens with {penalties}");
    }
    // The penalties changed the output: greedy without them gives other tokens.
    let (mut plain, _) = engine(&dir, &dir, &s, &models::LoadOptions::default());
    assert_ne!(&drive(&mut plain, &prompts[..1], &[0], None)[0].tokens, expected[0], "the penalties changed nothing");
}

#[test]
fn llama_4bit_with_llama3_rope_and_tied_embeddings_matches_mlx_lm() {
    let mut c = llama();
    c["tie_word_embeddings"] = json!(true);
    c["rope_scaling"] = json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0, "original_max_position_embeddings": 64});
    check_parity("llama_q4_llama3rope", spec(c, "bfloat16", Some(json!({"bits": 4, "group_size": 64}))), TOL);
}

#[test]
fn qwen2_bf16_greedy_matches_mlx_lm() {
    let c = qwen2(true);
    check_parity("qwen2_bf16", spec(c, "bfloat16", None), TOL);
}

#[test]
fn qwen2_4bit_greedy_matches_mlx_lm() {
    let c = qwen2(false);
    check_parity("qwen2_q4", spec(c, "bfloat16", Some(json!({"bits": 4, "group_size": 64}))), TOL);
}

#[test]
fn qwen3_bf16_greedy_matches_mlx_lm() {
    let c = qwen3(16, true);
    check_parity("qwen3_bf16", spec(c, "bfloat16", None), TOL);
}

#[test]
fn qwen3_8bit_greedy_matches_mlx_lm() {
    let c = qwen3(32, false);
    check_parity("qwen3_q8", spec(c, "bfloat16", Some(json!({"bits": 8, "group_size": 32}))), TOL);
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


#[test]
fn mixtral_4bit_greedy_matches_mlx_lm() {
    check_parity("mixtral_q4", spec(mixtral(), "bfloat16", Some(json!({"bits": 4, "group_size": 64}))), TOL);
}

#[test]
fn mixtral_fp32_greedy_matches_mlx_lm() {
    check_parity("mixtral_fp32", spec(mixtral(), "float32", None), TOL);
}


#[test]
fn qwen2_moe_with_shared_expert_fp32_matches_mlx_lm() {
    check_parity("qwen2_moe_fp32", spec(qwen2_moe(), "float32", None), TOL);
}

#[test]
fn qwen2_moe_4bit_greedy_matches_mlx_lm() {
    check_parity("qwen2_moe_q4", spec(qwen2_moe(), "bfloat16", Some(json!({"bits": 4, "group_size": 64}))), TOL);
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
    let mut c = llama();
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

// --kv-bits 8 from the 560th token on: the 600-token prompt is quantized during
// its prefill, the 530-token one in the middle of decoding, the short ones
// never — so the batch holds quantized and plain rows in one model call.
#[test]
fn llama_with_8bit_kv_from_token_560_batches_quantized_and_plain_rows() {
    let mut sp = llama_kv8();
    sp["quantized_kv_start"] = json!(560);
    check_parity("llama_bf16_kv8_from560", sp, TOL);
}

#[test]
fn qwen3_with_4bit_kv_cache_matches_mlx_lm() {
    let c = qwen3(64, false);
    let mut sp = spec(c, "bfloat16", Some(json!({"bits": 4, "group_size": 64})));
    sp["kv_bits"] = json!(4);
    check_parity("qwen3_q4_kv4", sp, TOL);
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

// The next turn of a conversation (prompt + answer + more) restores every layer
// from the prompt cache, the sliding-window layers from the windows they hold,
// and decodes what a fresh engine decodes for the whole prompt.
#[test]
fn gemma3_sliding_windows_come_back_from_the_prompt_cache_for_the_next_turn() {
    let sp = spec(gemma3(), "bfloat16", None);
    let dir = fixture("gemma3_bf16", &sp);
    let r = reference(&dir);
    let load = models::LoadOptions::default();
    let (mut cached, metrics) = engine_with_prompt_cache(&dir, &dir, &sp, &load, 1 << 30);
    let first = drive(&mut cached, &[(&r.prompt, r.tokens.len())], &[0], None);
    assert_eq!(first[0].tokens, r.tokens);
    let mut next_turn = r.prompt.clone();
    next_turn.extend(&r.tokens[..r.tokens.len() - 1]);
    next_turn.extend(&r.batch[2].0[..20]);
    let reused = drive(&mut cached, &[(&next_turn, 32)], &[0], None);
    let text = metrics.render();
    let hit = metrics::counter_value(&text, "mlx_serve_prompt_cache_tokens_total").unwrap();
    assert_eq!(hit as usize, r.prompt.len() + r.tokens.len() - 1, "the whole first turn comes from the prompt cache");
    let (mut fresh, _) = engine(&dir, &dir, &sp, &load);
    let whole = drive(&mut fresh, &[(&next_turn, 32)], &[0], None);
    assert_eq!(reused[0].tokens, whole[0].tokens, "a restored sliding-window cache decodes differently");
}


// gpt-oss: learned attention sinks in every softmax, sliding and full layers,
// YaRN rope, router and expert biases, the clamped SwiGLU. MoE in fp32 (MLX's
// CPU GatherMM is float32-only), affine 4-bit, and mxfp4 as mlx-community
// ships it (its router stays 8-bit affine: the model's quant_predicate).
#[test]
fn gpt_oss_fp32_greedy_matches_mlx_lm() {
    check_parity("gpt_oss_fp32", spec(gpt_oss(), "float32", None), TOL);
}

#[test]
fn gpt_oss_4bit_greedy_matches_mlx_lm() {
    check_parity("gpt_oss_q4", spec(gpt_oss(), "bfloat16", Some(json!({"bits": 4, "group_size": 64}))), TOL);
}

#[test]
fn gpt_oss_mxfp4_greedy_matches_mlx_lm() {
    check_parity("gpt_oss_mxfp4", spec(gpt_oss(), "bfloat16", Some(json!({"bits": 4, "group_size": 32, "mode": "mxfp4"}))), TOL);
}

// Gemma 4: KV-shared layers attending to earlier layers' caches (rotating and
// full), two head sizes, proportional rope, per-layer inputs, soft-capped logits.
// In float32: in bfloat16 the sequence alone gives mlx-lm's 64 tokens too, but
// batched rows (other matmul shapes) flip a near-tie after 22 tokens.
#[test]
fn gemma4_with_kv_sharing_and_per_layer_inputs_matches_mlx_lm() {
    check_parity("gemma4_fp32", spec(gemma4(), "float32", None), TOL);
}

// Gemma 4's MoE block beside the MLP, values equal to keys on full layers; in
// 4-bit (MLX's CPU GatherMM is float32-only), its router 8-bit.
#[test]
fn gemma4_moe_4bit_matches_mlx_lm() {
    check_parity("gemma4_moe_q4", spec(gemma4_moe(), "bfloat16", Some(json!({"bits": 4, "group_size": 32}))), TOL);
}

// Qwen3-Next: Gated DeltaNet layers (convolution + recurrent state, the
// gated delta rule as mlx-lm's ops path runs it on the CPU) beside gated full
// attention; MoE with a shared expert, one dense layer. 4-bit (MoE on CPU).
#[test]
fn qwen3_next_4bit_matches_mlx_lm() {
    check_parity("qwen3_next_q4", spec(qwen3_next(), "bfloat16", Some(json!({"bits": 4, "group_size": 32}))), TOL);
}

// Qwen3.5 (dense), a `qwen3_5` checkpoint through its text model, in bf16
// and 4-bit.
#[test]
fn qwen3_5_bf16_matches_mlx_lm() {
    check_parity("qwen3_5_bf16", spec(qwen3_5(), "bfloat16", None), TOL);
}

#[test]
fn qwen3_5_4bit_matches_mlx_lm() {
    check_parity("qwen3_5_q4", spec(qwen3_5(), "bfloat16", Some(json!({"bits": 4, "group_size": 32}))), TOL);
}

// Qwen3.5-MoE: a MoE with a shared expert on every layer, its gates 8-bit.
#[test]
fn qwen3_5_moe_4bit_matches_mlx_lm() {
    check_parity("qwen3_5_moe_q4", spec(qwen3_5_moe(), "bfloat16", Some(json!({"bits": 4, "group_size": 32}))), TOL);
}

// A checkpoint (the end of a chat's system prompt) keeps the prompt's KV as the
// prefill passes it: a sliding window cannot be cut back to a shorter prefix,
// so without one the next question after the same system prompt starts over.
// With it, the shared part comes from the cache and decodes as a fresh engine.
#[test]
fn a_checkpoint_lets_sliding_window_layers_reuse_a_shared_system_prompt() {
    let sp = spec(gemma3(), "bfloat16", None);
    let dir = fixture("gemma3_bf16", &sp);
    let r = reference(&dir);
    let system = &r.prompt[..300]; // longer than the 128-token window
    let ask = |question: &[u32]| -> Vec<u32> { system.iter().chain(question).copied().collect() };
    // The first question is long: its prompt spans two prefill chunks, so the
    // state kept at its end (the last chunk and the window before it) cannot
    // serve the system prompt alone.
    let (first, second) = (ask(&r.batch[0].0[..400]), ask(&r.batch[1].0[..60]));
    let load = models::LoadOptions::default();
    let cached_after = |checkpoint: bool| -> (usize, Vec<u32>) {
        let (mut e, metrics) = engine_with_prompt_cache(&dir, &dir, &sp, &load, 1 << 30);
        let at = |_: usize, g: &mut mlx_serve::engine::Generation| {
            if checkpoint {
                g.checkpoints = vec![system.len()];
            }
        };
        drive_with(&mut e, &[(&first, 8)], &[0], None, at);
        let before = metrics::counter_value(&metrics.render(), "mlx_serve_prompt_cache_tokens_total").unwrap_or(0.0);
        let out = drive_with(&mut e, &[(&second, 8)], &[0], None, at);
        let after = metrics::counter_value(&metrics.render(), "mlx_serve_prompt_cache_tokens_total").unwrap();
        ((after - before) as usize, out[0].tokens.clone())
    };
    let (hit, tokens) = cached_after(true);
    assert_eq!(hit, system.len(), "the system prompt did not come from the cache");
    let (mut fresh, _) = engine(&dir, &dir, &sp, &load);
    assert_eq!(tokens, drive(&mut fresh, &[(&second, 8)], &[0], None)[0].tokens, "a restored checkpoint decodes differently");
    let (hit, _) = cached_after(false);
    assert!(hit < system.len(), "without a checkpoint {hit} tokens were reused: the test shows nothing");
}

// A recurrent state can be restored only at the length it was stored at.
// The prompt cache keeps each prompt's state as its prefill ends, and each
// finished sequence's: the next turn of a chat hits the first even when the
// template re-renders the answer (here: other tokens in its place), and the
// second when it does not. Each restored state decodes as a fresh engine.
#[test]
fn qwen3_5_multi_turn_chats_reuse_recurrent_states() {
    let sp = spec(qwen3_5(), "bfloat16", None);
    let dir = fixture("qwen3_5_bf16", &sp);
    let r = reference(&dir);
    let load = models::LoadOptions::default();
    let (mut e, metrics) = engine_with_prompt_cache(&dir, &dir, &sp, &load, 1 << 30);
    let cached = || metrics::counter_value(&metrics.render(), "mlx_serve_prompt_cache_tokens_total").unwrap_or(0.0) as usize;
    let first: Vec<u32> = r.prompt[..200].to_vec();
    let answer = drive(&mut e, &[(&first, 8)], &[0], None)[0].tokens.clone();
    let fresh = |prompt: &[u32]| drive(&mut engine(&dir, &dir, &sp, &load).0, &[(prompt, 8)], &[0], None)[0].tokens.clone();

    // The answer re-rendered otherwise: only the prompt's own state serves.
    let rerendered: Vec<u32> = first.iter().chain(&r.batch[0].0[..30]).copied().collect();
    let before = cached();
    let out = drive(&mut e, &[(&rerendered, 8)], &[0], None)[0].tokens.clone();
    assert_eq!(cached() - before, first.len() - 1, "the first prompt's state did not serve the next turn");
    assert_eq!(out, fresh(&rerendered), "a restored prompt state decodes differently");

    // The answer as generated: the finished sequence's state serves.
    let continued: Vec<u32> = first.iter().chain(&answer).chain(&r.batch[1].0[..20]).copied().collect();
    let before = cached();
    let out = drive(&mut e, &[(&continued, 8)], &[0], None)[0].tokens.clone();
    let hit = cached() - before;
    assert!(hit >= first.len() + answer.len() - 1, "the finished sequence's state did not serve ({hit} tokens)");
    assert_eq!(out, fresh(&continued), "a restored finished state decodes differently");
}

// The original openai/gpt-oss layout: experts alone in mxfp4 as `_blocks`
// bytes and `_scales`, gate and up interleaved row by row in one
// `gate_up_proj` stack with its bias, `quantization_config` saying
// `quant_method: mxfp4`. Made here from a fixture whose experts alone mlx-lm
// quantized, and decoded as mlx-lm decodes that fixture.
#[test]
fn gpt_oss_in_openais_layout_is_split_at_load() {
    let sp = spec(gpt_oss(), "bfloat16", Some(json!({"bits": 4, "group_size": 32, "mode": "mxfp4", "only": "experts"})));
    let dir = fixture("gpt_oss_mxfp4_experts", &sp);
    let openai = dir.parent().unwrap().join("gpt_oss_openai_layout");
    let _ = std::fs::remove_dir_all(&openai);
    std::fs::create_dir_all(&openai).unwrap();
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(dir.join(f), openai.join(f)).unwrap();
    }
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    config.as_object_mut().unwrap().remove("quantization");
    config["quantization_config"] = json!({"quant_method": "mxfp4"});
    std::fs::write(openai.join("config.json"), config.to_string()).unwrap();
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    // Rows of gate and up, interleaved: [E, R, ..] twice -> [E, 2R, ..].
    let interleave = |gate: &safetensors::tensor::TensorView, up: &safetensors::tensor::TensorView| -> Vec<u8> {
        let row = gate.data().len() / (gate.shape()[0] * gate.shape()[1]);
        let mut out = Vec::with_capacity(2 * gate.data().len());
        for (g, u) in gate.data().chunks(row).zip(up.data().chunks(row)) {
            out.extend_from_slice(g);
            out.extend_from_slice(u);
        }
        out
    };
    let mut out: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    for (name, view) in st.tensors() {
        let Some((stem, part)) = name.rsplit_once('.') else { continue };
        let Some(layer) = stem.strip_suffix(".mlp.experts.gate_proj").or_else(|| stem.strip_suffix(".mlp.experts.down_proj")) else {
            if !stem.ends_with(".mlp.experts.up_proj") {
                out.push((name.clone(), view.dtype(), view.shape().to_vec(), view.data().to_vec()));
            }
            continue;
        };
        let down = stem.ends_with("down_proj");
        let target = format!("{layer}.mlp.experts.{}", if down { "down_proj" } else { "gate_up_proj" });
        let (data, mut shape) = if down {
            (view.data().to_vec(), view.shape().to_vec())
        } else {
            let up = st.tensor(&format!("{layer}.mlp.experts.up_proj.{part}")).unwrap();
            let mut shape = view.shape().to_vec();
            shape[1] *= 2;
            (interleave(&view, &up), shape)
        };
        match part {
            // Packed words back to their bytes, 16 per group of 32 values.
            "weight" => {
                let groups = shape[2] / 4;
                shape.truncate(2);
                shape.extend([groups, 16]);
                out.push((format!("{target}_blocks"), safetensors::Dtype::U8, shape, data));
            }
            "scales" => out.push((format!("{target}_scales"), safetensors::Dtype::U8, shape, data)),
            "bias" => out.push((format!("{target}_bias"), view.dtype(), shape, data)),
            other => panic!("unexpected expert tensor part {other}"),
        }
    }
    let views: Vec<(String, safetensors::tensor::TensorView)> = out
        .iter()
        .map(|(n, d, s, b)| (n.clone(), safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, &openai.join("model.safetensors")).unwrap();
    check_parity_of("gpt-oss, openai's layout", &dir, &openai, &sp, &models::LoadOptions::default(), TOL);
}

// Fused qkv / gate_up, longrope scaling (input scale ≠ 1 since 8192 > 512).
#[test]
fn phi3_bf16_with_longrope_matches_mlx_lm() {
    check_parity("phi3_bf16_longrope", spec(phi3_longrope(), "bfloat16", None), TOL);
}

#[test]
fn phi3_4bit_with_partial_rotary_matches_mlx_lm() {
    check_parity("phi3_q4_partial", spec(phi3(Value::Null, 0.5), "bfloat16", Some(json!({"bits": 4, "group_size": 64}))), TOL);
}

// --quantize 4 at load on the float model equals mlx-lm's quantize_model on the
// same float weights (both fixtures start from the same seeded initialisation).
#[test]
fn quantizing_at_load_matches_mlx_lm_quantize_model() {
    let float_dir = fixture("llama_bf16", &spec(llama(), "bfloat16", None));
    let q_spec = spec(llama(), "bfloat16", Some(json!({"bits": 4, "group_size": 64})));
    let q_dir = fixture("llama_q4", &q_spec);
    let load = models::LoadOptions { quantize: Some(models::quant::QuantSpec::affine(64, 4)), ..Default::default() };
    check_parity_of("llama_bf16 --quantize 4", &q_dir, &float_dir, &q_spec, &load, TOL);
    // An already-quantized model is refused.
    let err = models::load_with(&q_dir, &load).err().unwrap().to_string();
    assert!(err.contains("already quantized"), "{err}");
}

/// The server's batched path against mlx-lm: the fixture's prompt, sent three
/// times at once beside two other prompts (so rows of different lengths share
/// the batch), decodes to mlx-lm's greedy text in every copy.
fn check_server_parity(name: &str, spec: Value, flags: &[&str]) {
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
    let texts = server.completions_at_once(&bodies);
    for i in [0, 2, 4] {
        assert_eq!(texts[i], expected_text, "{name}: request {i} through the server differs from mlx-lm");
    }
    let m = server.metrics();
    let rows = metrics::counter_value(&m, "mlx_serve_decode_rows_total").unwrap();
    let steps = metrics::counter_value(&m, "mlx_serve_decode_steps_total").unwrap();
    assert!(rows / steps > 1.5, "{name}: mean batch size {} — the requests did not share a batch", rows / steps);
}

// Qwen3.5-MoE's recurrent states batched by the server with other requests
// (rows joining and leaving a batch carry their states).
#[test]
fn qwen3_5_moe_through_the_batching_server_matches_mlx_lm() {
    check_server_parity("qwen3_5_moe_q4", spec(qwen3_5_moe(), "bfloat16", Some(json!({"bits": 4, "group_size": 32}))), &[]);
}

// Prompts arriving together may share a prefill call (a GPU's default; the CPU's is 1).
#[test]
fn llama_bf16_through_the_batching_server_matches_mlx_lm() {
    check_server_parity("llama_bf16", spec(llama(), "bfloat16", None), &["--prompt-concurrency", "8"]);
}

#[test]
fn qwen3_moe_4bit_through_the_batching_server_matches_mlx_lm() {
    let mut c = qwen3_moe();
    c["mlp_only_layers"] = json!([0]);
    check_server_parity("qwen3_moe_q4", spec(c, "bfloat16", Some(json!({"bits": 4, "group_size": 64}))), &[]);
}

#[test]
fn gemma3_with_sliding_windows_through_the_server_matches_mlx_lm() {
    // Rotating caches batch like the others.
    check_server_parity("gemma3_bf16", spec(gemma3(), "bfloat16", None), &[]);
}

// gpt-oss through the batching server (rotating and full caches, sinks, mxfp4
// experts in one batch); TurboQuant, whose kernels have no sinks, is refused at
// start-up naming the way out.
#[test]
fn gpt_oss_through_the_batching_server_matches_mlx_lm() {
    let sp = spec(gpt_oss(), "bfloat16", Some(json!({"bits": 4, "group_size": 32, "mode": "mxfp4"})));
    check_server_parity("gpt_oss_mxfp4", sp.clone(), &[]);
    let dir = fixture("gpt_oss_mxfp4", &sp);
    let out = std::process::Command::new(common::server::binary())
        .args(["--model", dir.to_str().unwrap(), "--port", "0", "--turbo-kv", "balanced"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("learned sinks") && err.contains("--kv-bits"), "{err}");
}

// Through the server: a chat's system prompt is a checkpoint for a model with
// sliding windows, so the next question after it reuses it even once the first
// answer has moved every window past it (150 tokens > the 128-token window).
#[test]
fn chats_sharing_a_system_prompt_reuse_it_on_a_sliding_window_model() {
    let dir = fixture("gemma3_bf16", &spec(gemma3(), "bfloat16", None));
    let server = common::server::TestServer::start(&dir, &["--prompt-cache-bytes", "100000000"]);
    let system = "the model reads the cache of every layer. ".repeat(40);
    let chat = |question: &str, max_tokens: usize| -> Value {
        let body = json!({"messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
                          "max_tokens": max_tokens, "ignore_eos": true});
        let reply = server.post_json("/v1/chat/completions", &body);
        assert_eq!(reply.status, 200, "{}", reply.body);
        serde_json::from_str(&reply.body).unwrap()
    };
    // The system prompt's end, as the server finds it: where the system message
    // before an empty user turn stops agreeing with the whole prompt.
    let ids = |messages: Value, generation: bool| -> Vec<u64> {
        let r = server.post_json("/tokenize", &json!({"messages": messages, "add_generation_prompt": generation}));
        serde_json::from_value(serde_json::from_str::<Value>(&r.body).unwrap()["tokens"].clone()).unwrap()
    };
    let head = ids(json!([{"role": "system", "content": system}, {"role": "user", "content": ""}]), false);
    let whole = ids(json!([{"role": "system", "content": system}, {"role": "user", "content": "and the window"}]), true);
    let end = head.iter().zip(&whole).take_while(|(a, b)| a == b).count();
    assert!(end > 128, "the system prompt ({end} tokens) must outlast the window");
    chat("what does it read", 150);
    let second = chat("and the window", 4);
    assert_eq!(second["usage"]["prompt_tokens_details"]["cached_tokens"], json!(end), "{second}");
}

// Gemma 4's experts in Hugging Face's layout (one fused `gate_up_proj` stack
// per layer, `experts.down_proj`), as mlx-lm's sanitize reads them: the fp32
// MoE fixture rewritten so gives the same tokens.
#[test]
fn gemma4_experts_in_the_hugging_face_layout_are_split_at_load() {
    let sp = spec(gemma4_moe(), "float32", None);
    let dir = fixture("gemma4_moe_fp32", &sp);
    let hf = dir.parent().unwrap().join("gemma4_moe_fp32_hf_layout");
    let _ = std::fs::remove_dir_all(&hf);
    std::fs::create_dir_all(&hf).unwrap();
    for f in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(dir.join(f), hf.join(f)).unwrap();
    }
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut out: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for (name, view) in st.tensors() {
        let layer = name.strip_suffix(".experts.switch_glu.gate_proj.weight");
        if let Some(prefix) = layer {
            // [E, inter, h] gate then up, per expert, along the rows.
            let up = st.tensor(&format!("{prefix}.experts.switch_glu.up_proj.weight")).unwrap();
            let (shape, per_expert) = (view.shape().to_vec(), view.data().len() / view.shape()[0]);
            let mut fused = Vec::with_capacity(2 * view.data().len());
            for e in 0..shape[0] {
                fused.extend_from_slice(&view.data()[e * per_expert..(e + 1) * per_expert]);
                fused.extend_from_slice(&up.data()[e * per_expert..(e + 1) * per_expert]);
            }
            out.push((format!("{prefix}.experts.gate_up_proj"), vec![shape[0], 2 * shape[1], shape[2]], fused));
        } else if name.ends_with(".experts.switch_glu.up_proj.weight") {
            continue;
        } else if let Some(prefix) = name.strip_suffix(".experts.switch_glu.down_proj.weight") {
            out.push((format!("{prefix}.experts.down_proj"), view.shape().to_vec(), view.data().to_vec()));
        } else {
            out.push((name.clone(), view.shape().to_vec(), view.data().to_vec()));
        }
    }
    let views: Vec<(String, safetensors::tensor::TensorView)> = out
        .iter()
        .map(|(n, s, d)| (n.clone(), safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), d).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, &hf.join("model.safetensors")).unwrap();
    check_parity_of("gemma4 MoE, HF expert layout", &dir, &hf, &sp, &models::LoadOptions::default(), TOL);
}

// A Qwen3.5-MoE checkpoint as Hugging Face publishes it: tensors under
// `model.language_model.`, convolution weights [channels, 1, kernel], the
// (1 + w) norms stored as w, the experts' gate and up fused in one stack, a
// vision tower and a multi-token-prediction head beside. Made from an fp32
// fixture (MLX's CPU GatherMM is float32-only) and decoded as mlx-lm decodes it.
#[test]
fn qwen3_5_moe_in_the_hugging_face_layout_is_read_as_mlx_lm_reads_it() {
    let sp = spec(qwen3_5_moe(), "float32", None);
    let dir = fixture("qwen3_5_moe_fp32", &sp);
    let hf = dir.parent().unwrap().join("qwen3_5_moe_fp32_hf_layout");
    let _ = std::fs::remove_dir_all(&hf);
    std::fs::create_dir_all(&hf).unwrap();
    for f in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(dir.join(f), hf.join(f)).unwrap();
    }
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let floats = |d: &[u8]| -> Vec<f32> { d.chunks(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect() };
    let raw = |v: Vec<f32>| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
    let norms = [".input_layernorm.weight", ".post_attention_layernorm.weight", "model.norm.weight", ".q_norm.weight", ".k_norm.weight"];
    let mut out: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for (name, view) in st.tensors() {
        let hf_name = match name.strip_prefix("language_model.model.") {
            Some(rest) => format!("model.language_model.{rest}"),
            None => name.strip_prefix("language_model.").unwrap_or(&name).to_string(),
        };
        let (shape, data) = (view.shape().to_vec(), view.data().to_vec());
        if let Some(prefix) = hf_name.strip_suffix(".switch_mlp.gate_proj.weight") {
            let up = st.tensor(&name.replace("gate_proj", "up_proj")).unwrap();
            let per_expert = data.len() / shape[0];
            let mut fused = Vec::with_capacity(2 * data.len());
            for e in 0..shape[0] {
                fused.extend_from_slice(&data[e * per_expert..(e + 1) * per_expert]);
                fused.extend_from_slice(&up.data()[e * per_expert..(e + 1) * per_expert]);
            }
            out.push((format!("{prefix}.experts.gate_up_proj"), vec![shape[0], 2 * shape[1], shape[2]], fused));
        } else if hf_name.ends_with(".switch_mlp.up_proj.weight") {
            continue;
        } else if let Some(prefix) = hf_name.strip_suffix(".switch_mlp.down_proj.weight") {
            out.push((format!("{prefix}.experts.down_proj"), shape, data));
        } else if hf_name.ends_with("conv1d.weight") {
            // [channels, kernel, 1] → [channels, 1, kernel]: the same bytes.
            out.push((hf_name, vec![shape[0], 1, shape[1]], data));
        } else if norms.iter().any(|n| hf_name.ends_with(n)) {
            out.push((hf_name, shape, raw(floats(&data).iter().map(|w| w - 1.0).collect())));
        } else {
            out.push((hf_name, shape, data));
        }
    }
    for extra in ["mtp.fc.weight", "model.visual.patch_embed.weight"] {
        out.push((extra.to_string(), vec![2, 2], raw(vec![f32::NAN; 4])));
    }
    let views: Vec<(String, safetensors::tensor::TensorView)> = out
        .iter()
        .map(|(n, s, d)| (n.clone(), safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), d).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, &hf.join("model.safetensors")).unwrap();
    check_parity_of("qwen3_5_moe, HF layout", &dir, &hf, &sp, &models::LoadOptions::default(), TOL);
}

// A `gemma4` checkpoint (the multimodal wrapper mlx-lm writes: weights under
// `language_model.`, the config under `text_config`, per-layer quantization
// keyed by those names) runs through its text tower.
#[test]
fn gemma4_multimodal_checkpoints_run_their_text_tower() {
    let mut text = gemma4_moe();
    text.as_object_mut().unwrap().remove("model_type");
    let config = json!({"model_type": "gemma4", "text_config": text, "vocab_size": 512});
    check_parity("gemma4_wrapper_q4", spec(config, "bfloat16", Some(json!({"bits": 4, "group_size": 32}))), TOL);
}

// Gemma 4 through the batching server; KV compression, which its KV-shared
// layers cannot read, is refused at start-up saying why.
#[test]
fn gemma4_through_the_batching_server_matches_mlx_lm() {
    let sp = spec(gemma4(), "float32", None);
    check_server_parity("gemma4_fp32", sp.clone(), &[]);
    let dir = fixture("gemma4_fp32", &sp);
    for flags in [["--kv-bits", "8"], ["--turbo-kv", "balanced"]] {
        let out = std::process::Command::new(common::server::binary())
            .args(["--model", dir.to_str().unwrap(), "--port", "0"])
            .args(flags)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains("KV sharing"), "{flags:?}: {err}");
    }
}

#[test]
fn llama_with_8bit_kv_cache_through_the_server_matches_mlx_lm() {
    let flags = ["--kv-bits", "8", "--kv-group-size", "32", "--quantized-kv-start", "0"];
    check_server_parity("llama_bf16_kv8", llama_kv8(), &flags);
}

