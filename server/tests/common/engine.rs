//! The server's engine driven in process, turn by turn, with the server's
//! request/event protocol: what the parity and TurboQuant tests run.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use mlx_serve::engine::{Engine, EngineConfig, Event, Generation, Request, SamplingParams, TokenLogprob};
use mlx_serve::kv::KvCompression;
use mlx_serve::metrics::{self, Metrics};
use mlx_serve::models;
use mlx_serve::tokenizer::Tokenizer;
use serde_json::Value;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

/// mlx-lm's greedy tokens for the fixture's prompts.
pub struct Reference {
    pub prompt: Vec<u32>,
    pub tokens: Vec<u32>,
    /// null marks a non-finite reference value (JSON has no infinities).
    pub first_logprobs: Vec<Option<f32>>,
    /// More prompts (other lengths), each with mlx-lm's tokens decoded alone.
    pub batch: Vec<(Vec<u32>, Vec<u32>)>,
}

pub fn reference(dir: &Path) -> Reference {
    let r: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap()).unwrap();
    let ids = |v: &Value| -> Vec<u32> { serde_json::from_value(v.clone()).unwrap() };
    Reference {
        prompt: ids(&r["prompt"]),
        tokens: ids(&r["tokens"]),
        first_logprobs: serde_json::from_value(r["first_logprobs"].clone()).unwrap(),
        batch: r["batch"].as_array().unwrap().iter().map(|b| (ids(&b["prompt"]), ids(&b["tokens"]))).collect(),
    }
}

/// The engine the server runs, in process, over the model in `model_dir`,
/// with the fixture's prefill size and KV settings.
pub fn engine(tokenizer_dir: &Path, model_dir: &Path, spec: &Value, load: &models::LoadOptions) -> (Engine, Arc<Metrics>) {
    engine_with_prompt_cache(tokenizer_dir, model_dir, spec, load, 0)
}

pub fn engine_with_prompt_cache(
    tokenizer_dir: &Path,
    model_dir: &Path,
    spec: &Value,
    load: &models::LoadOptions,
    prompt_cache_bytes: usize,
) -> (Engine, Arc<Metrics>) {
    let model = models::load_with(model_dir, load).unwrap().model;
    let tokenizer = Arc::new(Tokenizer::load(tokenizer_dir, None).unwrap());
    let kv_compression = match (spec["kv_bits"].as_i64(), spec["turbo_kv"].as_str()) {
        (Some(bits), _) => {
            let group = spec["kv_group_size"].as_i64().unwrap_or(64) as i32;
            Some(KvCompression::affine(bits as i32, group, spec["quantized_kv_start"].as_i64().unwrap_or(0) as i32).unwrap())
        }
        (None, Some(preset)) => Some(KvCompression::turbo(preset, spec["turbo_kv_prefill_threshold"].as_i64().unwrap_or(8192) as i32).unwrap()),
        (None, None) => None,
    };
    let config = EngineConfig {
        prefill_size: spec["prefill_size"].as_u64().unwrap_or(512) as usize,
        max_concurrency: 8,
        prompt_concurrency: 8,
        max_queue: 16,
        prompt_cache_bytes,
        kv_compression,
        kv_tokens: usize::MAX,
        context: None,
    };
    let metrics = Arc::new(Metrics::new());
    (Engine::new(model, tokenizer, config, metrics.clone()).unwrap(), metrics)
}

/// What one request produced.
#[derive(Default)]
pub struct Output {
    pub tokens: Vec<u32>,
    pub first: Option<TokenLogprob>,
    pub done: bool,
}

/// Greedy requests for `prompts`, each submitted at its turn in `arrivals`,
/// run until all are done. With `logprobs`, each token comes with the whole
/// distribution.
pub fn drive(engine: &mut Engine, prompts: &[(&[u32], usize)], arrivals: &[usize], logprobs: Option<usize>) -> Vec<Output> {
    drive_with(engine, prompts, arrivals, logprobs, |_, _| {})
}

/// [`drive`], with `edit` given each request's parameters (and its index) before it is sent.
pub fn drive_with(
    engine: &mut Engine,
    prompts: &[(&[u32], usize)],
    arrivals: &[usize],
    logprobs: Option<usize>,
    edit: impl Fn(usize, &mut Generation),
) -> Vec<Output> {
    let mut streams: Vec<Option<UnboundedReceiver<Event>>> = prompts.iter().map(|_| None).collect();
    let mut outputs: Vec<Output> = prompts.iter().map(|_| Output::default()).collect();
    for turn in 0..10_000 {
        for (i, (&(prompt, max_tokens), &at)) in prompts.iter().zip(arrivals).enumerate() {
            if at == turn {
                let (tx, rx) = unbounded_channel();
                let mut params = Generation {
                    prompt: prompt.to_vec(),
                    sampling: SamplingParams { seed: Some(0), ..Default::default() },
                    max_tokens,
                    stop: Vec::new(),
                    logprobs,
                    ignore_eos: true,
                    keep_special_tokens: false,
                    guide: None,
                    progress: false,
                    checkpoints: Vec::new(),
                };
                edit(i, &mut params);
                engine.submit(Request { params, arrived: Instant::now(), events: tx });
                streams[i] = Some(rx);
            }
        }
        engine.step();
        for (rx, out) in streams.iter_mut().zip(outputs.iter_mut()) {
            while let Some(event) = rx.as_mut().and_then(|rx| rx.try_recv().ok()) {
                match event {
                    Event::Token { token, logprob, .. } => {
                        if out.first.is_none() {
                            out.first = logprob;
                        }
                        out.tokens.push(token);
                    }
                    Event::Done { .. } => out.done = true,
                    Event::Error(e) => panic!("the engine failed: {e}"),
                    Event::Progress(_) => panic!("progress sent to a request that did not ask"),
                }
            }
        }
        if arrivals.iter().all(|&a| a <= turn) && outputs.iter().all(|o| o.done) {
            assert!(engine.is_idle(), "every request ended but the engine is not idle");
            return outputs;
        }
    }
    panic!("the requests did not finish in 10000 turns");
}

/// Compares our engine on the model in `model_dir` (loaded with `load`) with the
/// reference of fixture `reference_dir`.
pub fn check_parity_of(
    name: &str,
    reference_dir: &Path,
    model_dir: &Path,
    spec: &Value,
    load: &models::LoadOptions,
    logprob_tol: f32,
) {
    let r = reference(reference_dir);
    let prefill = spec["prefill_size"].as_u64().unwrap_or(512) as usize;
    assert!(r.prompt.len() > prefill, "the prompt must span several prefill chunks");
    assert!(r.tokens.len() >= 64);
    // A reference that repeats one token would hide most mistakes.
    let distinct: BTreeSet<_> = r.tokens.iter().collect();
    assert!(distinct.len() >= 8, "{name}: the fixture's greedy output is degenerate ({} distinct tokens)", distinct.len());

    let (mut alone, _) = engine(reference_dir, model_dir, spec, load);
    let vocab = r.first_logprobs.len();
    let out = drive(&mut alone, &[(&r.prompt, r.tokens.len())], &[0], Some(vocab));
    assert_eq!(out[0].tokens, r.tokens, "{name}: greedy tokens differ from mlx-lm");
    let first = out[0].first.as_ref().expect("log-probabilities were asked for");
    let mut lp = vec![f32::NEG_INFINITY; vocab];
    for &(token, logprob) in &first.top {
        lp[token as usize] = logprob;
    }
    let max_diff = lp
        .iter()
        .zip(&r.first_logprobs)
        .map(|(a, b)| match b {
            Some(b) => (a - b).abs(),
            None if !a.is_finite() => 0.0,
            None => f32::INFINITY,
        })
        .fold(0.0f32, f32::max);
    eprintln!("{name}: {} tokens identical, first-step logprob max diff {max_diff}", out[0].tokens.len());
    assert!(max_diff <= logprob_tol, "{name}: first-step logprobs differ by {max_diff} > {logprob_tol}");

    let (mut batched, metrics) = engine(reference_dir, model_dir, spec, load);
    let mut prompts: Vec<(&[u32], usize)> = vec![(&r.prompt, r.tokens.len())];
    prompts.extend(r.batch.iter().map(|(p, t)| (p.as_slice(), t.len())));
    let outs = drive(&mut batched, &prompts, &[0, 2, 3, 6], None);
    let expected = std::iter::once(&r.tokens).chain(r.batch.iter().map(|(_, t)| t));
    for (i, (out, want)) in outs.iter().zip(expected).enumerate() {
        assert_eq!(&out.tokens, want, "{name}: sequence {i} of the batch differs from mlx-lm's tokens for it alone");
    }
    let text = metrics.render();
    let rows = metrics::counter_value(&text, "mlx_serve_decode_rows_total").unwrap();
    let steps = metrics::counter_value(&text, "mlx_serve_decode_steps_total").unwrap();
    assert!(rows / steps > 2.0, "{name}: mean batch size {} — the sequences did not share the batch", rows / steps);
    eprintln!("{name}: 4 batched sequences identical to mlx-lm, mean batch size {:.2}", rows / steps);

    // The other prompts arriving together: the whole ones that fit a chunk
    // are prefilled in one call, left-padded, where the model's caches allow.
    let (mut together, metrics) = engine(reference_dir, model_dir, spec, load);
    let prompts: Vec<(&[u32], usize)> = r.batch.iter().map(|(p, t)| (p.as_slice(), t.len())).collect();
    let outs = drive(&mut together, &prompts, &vec![0; prompts.len()], None);
    for (i, (out, (_, want))) in outs.iter().zip(&r.batch).enumerate() {
        assert_eq!(&out.tokens, want, "{name}: prompt {i}, prefilled beside the others, differs from mlx-lm's tokens for it alone");
    }
    let text = metrics.render();
    let calls = metrics::counter_value(&text, "mlx_serve_prefill_calls_total").unwrap();
    let prompts_prefilled = metrics::counter_value(&text, "mlx_serve_prefill_prompts_total").unwrap();
    if together.prefills_prompts_together() {
        assert!(prompts_prefilled > calls, "{name}: no prompts shared a prefill call ({prompts_prefilled} in {calls} calls)");
    }
    eprintln!("{name}: {} prompts arriving together identical to mlx-lm, {prompts_prefilled} prompts or chunks in {calls} prefill calls", prompts.len());
}
