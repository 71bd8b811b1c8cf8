//! The server's engine driven in process, turn by turn, with the server's
//! request/event protocol: what the parity and TurboQuant tests run.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use mlx_serve::engine::{Engine, EngineConfig, Event, Generation, Request, SamplingParams, TokenLogprob};
use mlx_serve::kv::KvCompression;
use mlx_serve::metrics::Metrics;
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
    let (model, _) = models::load_with(model_dir, load).unwrap();
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
        max_queue: 16,
        prompt_cache_bytes,
        kv_compression,
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
    let mut streams: Vec<Option<UnboundedReceiver<Event>>> = prompts.iter().map(|_| None).collect();
    let mut outputs: Vec<Output> = prompts.iter().map(|_| Output::default()).collect();
    for turn in 0..10_000 {
        for (i, (&(prompt, max_tokens), &at)) in prompts.iter().zip(arrivals).enumerate() {
            if at == turn {
                let (tx, rx) = unbounded_channel();
                let params = Generation {
                    prompt: prompt.to_vec(),
                    sampling: SamplingParams { seed: Some(0), ..Default::default() },
                    max_tokens,
                    stop: Vec::new(),
                    logprobs,
                    ignore_eos: true,
                    keep_special_tokens: false,
                };
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
