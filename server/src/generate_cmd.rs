//! `mlx-serve generate`: one prompt, streamed to stdout (or one JSON object),
//! with mlx_lm.generate's statistics.

use std::io::Write;
use std::sync::Arc;
use std::time::Instant;

use mlx_rs_safe::memory;
use serde::Serialize;
use serde_json::json;
use tokio::sync::mpsc::unbounded_channel;

use crate::cli::GenerateArgs;
use crate::engine::{Engine, EngineConfig, Event, FinishReason, Generation, Request, SamplingParams, TokenLogprob};
use crate::error::{Error, Result};
use crate::hub;
use crate::kv::KvCompression;
use crate::metrics::Metrics;
use crate::models;
use crate::tokenizer::Tokenizer;
use crate::experts::ExpertCounters;

#[derive(Debug, Serialize)]
pub struct GenerateReport {
    pub prompt_tokens: usize,
    pub generated_token_ids: Vec<u32>,
    pub text: String,
    pub finish_reason: &'static str,
    pub prompt_tps: f64,
    pub generation_tps: f64,
    pub ttft_ms: f64,
    pub peak_memory_bytes: usize,
    /// With --stream-experts: the expert cache's counters (as /health shows
    /// them) when the first token came and at the end: totals since the load,
    /// so a warm-up run is included.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub experts: Option<serde_json::Value>,
    /// With --logprobs: per generated token, its log-probability and the
    /// most likely alternatives ({token, logprob, top: [[token, logprob]]}).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generated_logprobs: Option<Vec<serde_json::Value>>,
}

/// The prompt's token ids, as mlx_lm.generate builds them.
pub fn prompt_tokens(tok: &Tokenizer, args: &GenerateArgs) -> Result<Vec<u32>> {
    let mut prompt = args.prompt.replace("\\n", "\n").replace("\\t", "\t");
    if prompt == "-" {
        prompt.clear();
        std::io::stdin()
            .read_line(&mut prompt)
            .map_err(|e| Error::Config(format!("reading the prompt from stdin: {e}")))?;
    }
    if !args.ignore_chat_template && tok.has_chat_template() {
        let mut messages = Vec::new();
        if let Some(sys) = &args.system_prompt {
            messages.push(json!({"role": "system", "content": sys}));
        }
        messages.push(json!({"role": "user", "content": prompt}));
        tok.encode_chat(&serde_json::Value::Array(messages), None)
    } else {
        tok.encode(&prompt, true)
    }
}

/// One generation through the engine, as the server runs it: the request
/// goes in, events come out, one turn at a time.
struct Run {
    ids: Vec<u32>,
    logprobs: Vec<TokenLogprob>,
    text: String,
    finish: FinishReason,
    /// From the start to the first token (or the end).
    ttft: f64,
    total: f64,
    /// The expert counters when the first token came (the prefill's share).
    experts_at_first_token: Option<serde_json::Value>,
}

fn generate_once(engine: &mut Engine, params: Generation, experts: Option<&ExpertCounters>, mut on_text: impl FnMut(&str)) -> Result<Run> {
    let (tx, mut rx) = unbounded_channel();
    let start = Instant::now();
    engine.submit(Request { params, arrived: start, events: tx });
    let mut run = Run { ids: Vec::new(), logprobs: Vec::new(), text: String::new(), finish: FinishReason::Length, ttft: 0.0, total: 0.0, experts_at_first_token: None };
    let mut first = None;
    loop {
        engine.step();
        while let Ok(event) = rx.try_recv() {
            first.get_or_insert_with(|| {
                run.experts_at_first_token = experts.map(ExpertCounters::summary);
                start.elapsed()
            });
            match event {
                Event::Token { token, text, logprob } => {
                    run.ids.push(token);
                    run.logprobs.extend(logprob);
                    on_text(&text);
                    run.text.push_str(&text);
                }
                Event::Done { text, finish_reason, .. } => {
                    on_text(&text);
                    run.text.push_str(&text);
                    run.finish = finish_reason;
                    run.total = start.elapsed().as_secs_f64();
                    run.ttft = first.map(|d| d.as_secs_f64()).unwrap_or(run.total);
                    return Ok(run);
                }
                Event::Error(message) => return Err(Error::Engine(message)),
                // Never sent: this generation does not ask for progress.
                Event::Progress(_) => {}
            }
        }
        if engine.is_idle() {
            return Err(Error::Internal("the engine finished without ending the generation"));
        }
    }
}

pub fn run(args: &GenerateArgs) -> Result<GenerateReport> {
    crate::app::init_logging(&args.log_level)?;
    let load = args.load.options()?;
    let kv_compression = match &args.turbo_kv {
        Some(preset) => Some(KvCompression::turbo(preset, args.turbo_kv_prefill_threshold)?),
        None => args.kv_bits.map(|bits| KvCompression::affine(bits, args.kv_group_size, args.quantized_kv_start)).transpose()?,
    };
    let (model, _) = crate::cli::model_or_default(args.model.as_deref())?;
    let dir = hub::resolve(&model, &hub::HubOptions::from_env())?;
    let model = models::load_with(&dir, &load)?.model;
    let tok = Arc::new(Tokenizer::load(&dir, None)?);
    let prompt = prompt_tokens(&tok, args)?;
    let sampling = SamplingParams {
        temperature: args.temp,
        top_p: args.top_p,
        top_k: args.top_k,
        min_p: args.min_p,
        repetition_penalty: args.repetition_penalty,
        repetition_context_size: args.repetition_context_size,
        seed: args.seed,
        xtc_probability: args.xtc_probability,
        xtc_threshold: args.xtc_threshold,
        xtc_special_tokens: if args.xtc_probability > 0.0 { tok.xtc_special_tokens()? } else { Vec::new() },
        ..Default::default()
    };
    sampling.validate()?;
    let config = EngineConfig {
        prefill_size: args.load.prefill_size(args.prefill_size),
        max_concurrency: 1,
        prompt_concurrency: 1,
        max_queue: 1,
        prompt_cache_bytes: 0,
        kv_compression,
        // As mlx_lm.generate: no memory plan, no context bound.
        kv_tokens: usize::MAX,
        context: None,
    };
    let mut engine = Engine::new(model, tok, config, Arc::new(Metrics::new()))?;
    let params = |sampling: SamplingParams| Generation {
        prompt: prompt.clone(),
        sampling,
        max_tokens: args.max_tokens,
        stop: Vec::new(),
        logprobs: args.logprobs.map(usize::from),
        ignore_eos: args.ignore_eos,
        keep_special_tokens: false,
        guide: None,
        progress: false,
        checkpoints: Vec::new(),
    };
    if args.warmup {
        // The whole generation once: MLX's GPU backends compile kernels per
        // shape as the cache grows, which a fresh process would otherwise pay
        // inside the timed run (a long-running Python process has them already).
        generate_once(&mut engine, params(SamplingParams { seed: Some(0), ..Default::default() }), None, |_| {})?;
    }
    memory::reset_peak_memory()?;
    let mut out = std::io::stdout();
    let counters = load.experts.as_ref().map(|e| &e.counters);
    let run = generate_once(&mut engine, params(sampling), counters, |text| {
        if !args.json {
            let _ = out.write_all(text.as_bytes());
            let _ = out.flush();
        }
    })?;
    let decode_time = (run.total - run.ttft).max(1e-9);
    Ok(GenerateReport {
        prompt_tokens: prompt.len(),
        finish_reason: run.finish.as_str(),
        prompt_tps: prompt.len() as f64 / run.ttft.max(1e-9),
        // As mlx_lm.generate counts it: tokens generated over the time since the first.
        generation_tps: run.ids.len() as f64 / decode_time,
        ttft_ms: run.ttft * 1e3,
        peak_memory_bytes: memory::peak_memory()?,
        generated_logprobs: args.logprobs.map(|_| {
            run.logprobs.iter().map(|l| json!({"token": l.token, "logprob": l.logprob, "top": l.top})).collect()
        }),
        generated_token_ids: run.ids,
        text: run.text,
        experts: counters.map(|c| serde_json::json!({"after_prefill": run.experts_at_first_token, "at_end": c.summary()})),
    })
}
