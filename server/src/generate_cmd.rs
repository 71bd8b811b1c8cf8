//! `mlx-serve generate`: one prompt, streamed to stdout (or one JSON object),
//! with mlx_lm.generate's statistics.

use std::io::Write;
use std::time::Instant;

use mlx_rs_safe::memory;
use serde::Serialize;
use serde_json::json;

use crate::cli::GenerateArgs;
use crate::engine::{FinishReason, GenerateOptions, Generator, Sampler, SamplingParams, StopMatcher};
use crate::error::Result;
use crate::hub;
use crate::models;
use crate::tokenizer::Tokenizer;

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
}

/// The prompt's token ids, as mlx_lm.generate builds them.
pub fn prompt_tokens(tok: &Tokenizer, args: &GenerateArgs) -> Result<Vec<u32>> {
    let mut prompt = args.prompt.replace("\\n", "\n").replace("\\t", "\t");
    if prompt == "-" {
        prompt.clear();
        std::io::stdin()
            .read_line(&mut prompt)
            .map_err(|e| crate::error::Error::InvalidRequest(format!("reading the prompt from stdin: {e}")))?;
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

pub fn run(args: &GenerateArgs) -> Result<GenerateReport> {
    let load = models::LoadOptions {
        quantize: args.quantize.map(|bits| models::quant::QuantParams { bits, group_size: args.quantize_group_size }),
    };
    let dir = hub::resolve(&args.model, &hub::HubOptions::from_env())?;
    let (model, _config) = models::load_with(&dir, &load)?;
    let tok = Tokenizer::load(&dir, None)?;
    let prompt = prompt_tokens(&tok, args)?;
    let sampler = Sampler::new(SamplingParams {
        temperature: args.temp,
        top_p: args.top_p,
        top_k: args.top_k,
        min_p: args.min_p,
        repetition_penalty: args.repetition_penalty,
        repetition_context_size: args.repetition_context_size,
        seed: args.seed,
        ..Default::default()
    })?;
    let opts = GenerateOptions {
        prefill_size: args.prefill_size,
        max_tokens: args.max_tokens,
        kv_bits: args.kv_bits,
        kv_group_size: args.kv_group_size,
        quantized_kv_start: args.quantized_kv_start,
    };

    if args.warmup {
        // The whole generation once: MLX's GPU backends compile kernels per
        // shape as the cache grows, which a fresh process would otherwise pay
        // inside the timed run (a long-running Python process has them already).
        let mut g = Generator::new(model.as_ref(), &prompt, Sampler::greedy(), &opts)?;
        while g.next_token()?.is_some() {}
    }
    memory::reset_peak_memory()?;
    let start = Instant::now();
    let mut gen = Generator::new(model.as_ref(), &prompt, sampler, &opts)?;
    let mut stop = StopMatcher::new(if args.ignore_eos { Default::default() } else { tok.eos_ids().clone() }, vec![]);
    let mut detok = tok.new_detokenizer();
    let mut ids = Vec::new();
    let mut text = String::new();
    let mut ttft = None;
    let mut finish = FinishReason::Length;
    let mut out = std::io::stdout();
    while let Some(step) = gen.next_token()? {
        ttft.get_or_insert_with(|| start.elapsed());
        if stop.is_eos(step.token) {
            finish = FinishReason::Stop;
            break;
        }
        ids.push(step.token);
        let piece = stop.push(&detok.push(tok.inner(), step.token)?);
        text.push_str(&piece.emit);
        if !args.json {
            let _ = out.write_all(piece.emit.as_bytes());
            let _ = out.flush();
        }
        if piece.stopped {
            finish = FinishReason::Stop;
            break;
        }
    }
    let tail = stop.push(&detok.finish(tok.inner())?).emit + &stop.flush();
    text.push_str(&tail);
    if !args.json {
        let _ = out.write_all(tail.as_bytes());
    }
    let total = start.elapsed().as_secs_f64();
    let ttft = ttft.map(|d| d.as_secs_f64()).unwrap_or(total);
    let decode_time = (total - ttft).max(1e-9);
    Ok(GenerateReport {
        prompt_tokens: prompt.len(),
        finish_reason: finish.as_str(),
        prompt_tps: prompt.len() as f64 / ttft.max(1e-9),
        // As mlx_lm.generate counts it: tokens generated over the time since the first.
        generation_tps: ids.len() as f64 / decode_time,
        ttft_ms: ttft * 1e3,
        peak_memory_bytes: memory::peak_memory()?,
        generated_token_ids: ids,
        text,
    })
}
