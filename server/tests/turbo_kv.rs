//! TurboQuant KV (`--turbo-kv`) through the engine and the server: sequences
//! with compressed caches batch with each other and decode as they do alone,
//! prompts past the threshold are compressed while they are prefilled, the
//! prompt cache keeps compressed prefixes, and /health and /metrics show the
//! preset and what a token costs.

mod common;

use common::engine::{drive, engine, engine_with_prompt_cache, reference};
use common::fixture;
use common::server::TestServer;
use mlx_serve::metrics::counter_value;
use mlx_serve::models::LoadOptions;
use serde_json::{json, Value};

const FIXTURE: &str = "llama_bf16_head32";

fn llama() -> Value {
    // Head dimension 32: the smallest TurboQuant takes (8-bit keys are one affine group per head).
    json!({"config": {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
                      "num_attention_heads": 2, "num_key_value_heads": 1, "rms_norm_eps": 1e-5, "vocab_size": 512,
                      "rope_theta": 10000.0, "tie_word_embeddings": false, "max_position_embeddings": 2048},
           "dtype": "bfloat16", "quantize": null, "prompt_tokens": 600, "max_tokens": 64, "prefill_size": 512, "seed": 0})
}

fn with_turbo(preset: &str, threshold: i64) -> Value {
    let mut sp = llama();
    sp["turbo_kv"] = json!(preset);
    sp["turbo_kv_prefill_threshold"] = json!(threshold);
    sp
}

#[test]
fn turbo_sequences_batch_and_decode_as_they_do_alone_in_every_preset() {
    let dir = fixture(FIXTURE, &llama());
    let r = reference(&dir);
    let load = LoadOptions::default();
    for preset in ["balanced", "compact", "paper"] {
        let spec = with_turbo(preset, 8192);
        let mut prompts: Vec<(&[u32], usize)> = vec![(&r.prompt, 48)];
        prompts.extend(r.batch.iter().map(|(p, _)| (p.as_slice(), 48)));
        let alone: Vec<Vec<u32>> = prompts
            .iter()
            .map(|p| {
                let (mut e, _) = engine(&dir, &dir, &spec, &load);
                drive(&mut e, &[*p], &[0], None).remove(0).tokens
            })
            .collect();
        let (mut e, metrics) = engine(&dir, &dir, &spec, &load);
        let batched = drive(&mut e, &prompts, &[0, 2, 3, 6], None);
        for (i, (b, a)) in batched.iter().zip(&alone).enumerate() {
            assert_eq!(&b.tokens, a, "{preset}: sequence {i} decodes differently in the batch");
        }
        let text = metrics.render();
        let rows = counter_value(&text, "mlx_serve_decode_rows_total").unwrap();
        let steps = counter_value(&text, "mlx_serve_decode_steps_total").unwrap();
        assert!(rows / steps > 2.0, "{preset}: mean batch size {}", rows / steps);
        // Compressed caches answer differently from the 16-bit one, but not with noise:
        // most of the first tokens of the long prompt agree with mlx-lm's 16-bit ones.
        let same = alone[0].iter().zip(&r.tokens).take(16).filter(|(a, b)| a == b).count();
        eprintln!("{preset}: {same} of the first 16 tokens equal the 16-bit cache's");
    }
}

/// The GPU warm-up also runs one decode step over a compressed history (so the
/// compressed cache's kernels compile at start, not in the first request), and
/// leaves nothing behind: a request afterwards decodes as on an engine that
/// never warmed up.
#[test]
fn the_warm_up_decodes_a_step_over_a_compressed_cache_and_leaves_nothing_behind() {
    let dir = fixture(FIXTURE, &llama());
    let r = reference(&dir);
    let load = LoadOptions::default();
    let mut kv8 = llama();
    kv8["kv_bits"] = json!(8);
    kv8["kv_group_size"] = json!(32);
    for (name, spec, compressed) in
        [("16-bit", llama(), false), ("balanced", with_turbo("balanced", 8192), true), ("compact", with_turbo("compact", 8192), true), ("--kv-bits 8", kv8, true)]
    {
        let (mut cold, _) = engine(&dir, &dir, &spec, &load);
        let want = drive(&mut cold, &[(&r.prompt, 16)], &[0], None).remove(0).tokens;
        let (mut warm, metrics) = engine(&dir, &dir, &spec, &load);
        let w = warm.warm_up().unwrap();
        assert_eq!(w.compressed_step, compressed, "{name}");
        assert_eq!(drive(&mut warm, &[(&r.prompt, 16)], &[0], None).remove(0).tokens, want, "{name}: decodes otherwise after the warm-up");
        // The warm-up's own cache is not a request's: only the request's compression is
        // counted (TurboQuant's when decoding starts, `--kv-bits`' during its prefill).
        let text = metrics.render();
        let count = |phase: &str| counter_value(&text, &format!("mlx_serve_kv_compressions_total{{phase=\"{phase}\"}}")).unwrap_or(0.0);
        assert_eq!(count("prefill") + count("decode"), if compressed { 1.0 } else { 0.0 }, "{name}");
    }
}

#[test]
fn a_prompt_past_the_threshold_is_compressed_while_it_is_prefilled() {
    // The 600-token prompt prefills in chunks of 512 and 87. With a threshold
    // of 256 its cache is compressed after the first chunk (the second chunk
    // attends to the compressed history); with 8192, when decoding starts.
    let dir = fixture(FIXTURE, &llama());
    let r = reference(&dir);
    let load = LoadOptions::default();
    for (threshold, prefill, decode) in [(256, 1.0, None), (8192, 0.0, Some(1.0))] {
        let (mut e, metrics) = engine(&dir, &dir, &with_turbo("balanced", threshold), &load);
        let out = drive(&mut e, &[(&r.prompt, 16)], &[0], None).remove(0).tokens;
        assert_eq!(out.len(), 16);
        let text = metrics.render();
        let count = |phase: &str| counter_value(&text, &format!("mlx_serve_kv_compressions_total{{phase=\"{phase}\"}}"));
        assert_eq!(count("prefill").unwrap_or(0.0), prefill, "threshold {threshold}");
        assert_eq!(count("decode"), decode, "threshold {threshold}");
    }
}

#[test]
fn the_prompt_cache_keeps_compressed_prefixes() {
    let dir = fixture(FIXTURE, &llama());
    let r = reference(&dir);
    let load = LoadOptions::default();
    let run = |spec: &Value| {
        let (mut e, metrics) = engine_with_prompt_cache(&dir, &dir, spec, &load, 1 << 30);
        let first = drive(&mut e, &[(&r.prompt, 16)], &[0], None).remove(0).tokens;
        let stored = counter_value(&e_metrics(&e, &metrics), "mlx_serve_prompt_cache_bytes").unwrap_or(0.0);
        let mut next = r.prompt.clone();
        next.extend(&first[..15]);
        next.extend(&r.batch[2].0[..10]);
        let again = drive(&mut e, &[(&next, 8)], &[0], None).remove(0).tokens;
        let hit = counter_value(&metrics.render(), "mlx_serve_prompt_cache_tokens_total").unwrap();
        (stored, hit, again.len())
    };
    let (turbo_bytes, turbo_hit, n) = run(&with_turbo("balanced", 8192));
    let (plain_bytes, plain_hit, _) = run(&llama());
    assert_eq!(turbo_hit as usize, r.prompt.len() + 15, "the whole first turn came from the prompt cache");
    assert_eq!(plain_hit, turbo_hit);
    assert_eq!(n, 8);
    // Head dimension 32: 8-bit keys with a 32-wide group cost 9 bits, 4-bit values 4.5 bits,
    // against 32 bits for 16-bit keys and values; the newest 128 positions are kept at 16
    // bits as well.
    let window = mlx_serve::kv::turbo::RECENT as f64 * plain_bytes / plain_hit;
    assert!(turbo_bytes < 0.6 * plain_bytes + window, "the prompt cache keeps {turbo_bytes} bytes with TurboQuant, {plain_bytes} without");
}

/// The engine's /metrics text with its gauges set from its snapshot.
fn e_metrics(e: &mlx_serve::engine::Engine, metrics: &mlx_serve::metrics::Metrics) -> String {
    metrics.observe_engine(&e.snapshot(), 0);
    metrics.render()
}

#[test]
fn the_server_reports_the_preset_and_what_a_token_costs() {
    let dir = fixture(FIXTURE, &llama());
    let s = TestServer::start(&dir, &["--turbo-kv", "compact", "--prompt-cache-bytes", "0"]);
    let health = s.get("/health").json();
    assert_eq!(health["capabilities"]["turbo_kv"], "compact");
    assert!(health["capabilities"]["kv_bits"].is_null());
    let ratio = health["kv_cache"]["ratio_to_fp16"].as_f64().unwrap();
    // 2 layers, both "first or last two": 8-bit keys (9 bits at d = 32) and, at a head
    // dimension of 64 or less, 4-bit values (4.5 bits); a position's row of 54 bytes is
    // padded to 56: 14 bits per dimension.
    assert!((ratio - 14.0 / 32.0).abs() < 1e-9, "{ratio}");
    // ~300 prompt tokens and 1000 generated, seen past 1200: what the cache holds
    // per token is near the format's size — plus its allocation step (256
    // positions) and the newest 128 tokens it also keeps at 16 bits (in room for 192).
    let recent = health["kv_cache"]["recent_tokens"].as_f64().unwrap();
    assert_eq!(recent, 128.0);
    let prompt = "the model token server memory cache ".repeat(50);
    let body = json!({"prompt": prompt, "max_tokens": 1000, "ignore_eos": true});
    let fp16_per_token = health["kv_cache"]["fp16_bytes_per_token"].as_f64().unwrap();
    std::thread::scope(|scope| {
        let running = scope.spawn(|| s.post_json("/v1/completions", &body));
        // While it decodes, the cache holds compressed tokens: watched until
        // the request ends (a count of polls ran out first on a busy machine).
        let mut held = None;
        while !running.is_finished() {
            let h = s.get("/health").json();
            if let (Some(b), Some(t @ 1200..)) = (h["kv_cache"]["held_bytes_per_token"].as_f64(), h["engine"]["kv_cache_tokens"].as_u64()) {
                held = Some((b, t as f64));
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let done = running.join().unwrap();
        assert_eq!(done.status, 200, "{}", done.body);
        let (held, tokens) = held.expect("never saw the running sequence's cache past 1200 tokens");
        let nominal = ratio * fp16_per_token;
        let bound = nominal + (256.0 * nominal + 1.5 * recent * fp16_per_token) / tokens;
        assert!(held > nominal && held < bound, "held {held} bytes per token at {tokens}; nominal {nominal}, bound {bound}");
        assert!(held < 0.8 * fp16_per_token, "held {held} bytes per token; 16-bit {fp16_per_token}");
    });
    let m = s.metrics();
    assert_eq!(counter_value(&m, "mlx_serve_kv_format{format=\"turbo-compact\"}"), Some(1.0));
    let nominal = counter_value(&m, "mlx_serve_kv_bytes_per_token").unwrap();
    assert!((nominal - ratio * fp16_per_token).abs() < 1e-6);
}

#[test]
fn bad_turbo_flags_fail_at_start_with_a_clear_message() {
    let dir = fixture(FIXTURE, &llama());
    for (flags, expected) in [
        (vec!["--turbo-kv", "tiny"], "balanced, compact, paper"),
        (vec!["--turbo-kv", "--kv-bits", "8"], "cannot be used with"),
        (vec!["--turbo-kv", "balanced", "--turbo-kv-prefill-threshold", "1"], "--turbo-kv-prefill-threshold"),
    ] {
        let err = common::server::refused_start(&dir, &flags);
        assert!(err.contains(expected), "{flags:?}: {err}");
    }
}

// `kv-quality` on a base model (no chat template): the needle question is
// asked as text, so every format answers each trial, rather than the run
// stopping on the missing template.
#[test]
fn kv_quality_asks_a_base_model_for_the_needle_in_plain_text() {
    let dir = common::copy_of(&fixture(FIXTURE, &llama()), "kv_quality_base_model", "model");
    let config_path = dir.join("tokenizer_config.json");
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    config.as_object_mut().unwrap().remove("chat_template");
    std::fs::write(&config_path, config.to_string()).unwrap();
    let _ = std::fs::remove_file(dir.join("chat_template.jinja"));
    let text = dir.join("text.txt");
    std::fs::write(&text, "The quick brown fox jumps over the lazy dog. ".repeat(200)).unwrap();
    let out = std::process::Command::new(common::server::binary())
        .args(["kv-quality", "--model"])
        .arg(&dir)
        .arg("--text")
        .arg(&text)
        .args(["--tokens", "96", "--prefix", "64", "--formats", "fp16,balanced", "--niah-lengths", "160", "--niah-depths", "0.5", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "kv-quality failed: {}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let trials = report["needle_trials"].as_array().unwrap();
    assert_eq!(trials.len(), 1, "{report}");
    assert_eq!(trials[0]["answers"].as_array().unwrap().len(), 2, "{report}");
    assert!(trials[0]["tokens"].as_u64().unwrap() >= 160, "{report}");
    assert_eq!(report["formats"].as_array().unwrap().len(), 2, "{report}");
}

// A format `kv-quality` does not know is named with the ones it does.
#[test]
fn kv_quality_names_an_unknown_format_and_the_known_ones() {
    let dir = fixture(FIXTURE, &llama());
    for bad in ["fp32", "kvx"] {
        let out = std::process::Command::new(common::server::binary())
            .args(["kv-quality", "--model"])
            .arg(&dir)
            .args(["--text", "/dev/null", "--formats"])
            .arg(format!("fp16,{bad}"))
            .output()
            .unwrap();
        assert!(!out.status.success(), "{bad} was taken");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(&format!("unknown KV format \"{bad}\"")) && err.contains("balanced, compact and paper"), "{bad}: {err}");
    }
}
