//! Where a decode step's time goes, for a real model: the host time to build
//! a step's graph (`forward` + greedy pick), the host time `async_eval` takes
//! to encode and launch it, and the wall time per step with steps pipelined
//! as the engine runs them (step i+1 built and queued before step i's token
//! is read) and one at a time (the GPU's time plus the host's). A step is
//! host-bound when build + launch reaches the pipelined time; pipelined, the
//! host's own split (build, launch, waiting for the previous token) shows
//! whether queueing ahead makes building or launching slower.
//!
//!   cargo bench --bench decode_step -- MODEL_DIR [--rows 1,8] [--prompt 128] [--steps 64]
//!       [--turbo-kv PRESET]
//!
//! `--turbo-kv` compresses the cache when decoding starts, as the engine
//! does (the prompt stays under the prefill threshold).
//!
//! Run it once with `MLX_SERVE_QMM_KERNEL=0` and once without to compare
//! MLX's quantized kernels with ours (the switch is read once a process).

mod common;
use common::{arg, list, Res};

use std::path::PathBuf;
use std::time::Instant;

use mlx_rs_safe::{async_eval, eval, memory, ops, Array};
use mlx_serve::kv::{KvCompression, ModelCache, Phase};
use mlx_serve::models::{self, LanguageModel};



/// Tokens a prefill chunk takes.
const PREFILL_CHUNK: usize = 2048;

fn median_ms(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2] * 1e3
}

/// A step's graph: the model over `tokens` ([rows, 1]) and the greedy pick,
/// [rows, 1] int32, ready to feed the next step.
fn step(model: &dyn LanguageModel, tokens: &Array, cache: &mut ModelCache) -> Res<Array> {
    let logits = model.forward(tokens, cache)?;
    let picked = ops::argmax(&logits, -1, false)?;
    Ok(ops::astype(&picked, mlx_rs_safe::Dtype::Int32)?)
}

/// Row `r`'s cache after a `prompt`-token prefill, in chunks as the engine
/// prefills (one pass over a long prompt would take every position's logits
/// at once), and its next token ([1, 1]).
fn prefill_row(model: &dyn LanguageModel, kinds: &[mlx_serve::kv::KvKind], r: i32, prompt: i32) -> Res<(ModelCache, Array)> {
    let ids: Vec<i32> = (0..prompt).map(|i| 1 + ((r * prompt + i) * 7919) % 1000).collect();
    let mut cache = ModelCache::new(kinds)?;
    let mut picked = None;
    for at in (0..prompt).step_by(PREFILL_CHUNK) {
        let end = (at + PREFILL_CHUNK as i32).min(prompt);
        let p = step(model, &Array::from_slice(&ids[at as usize..end as usize], &[1, end - at])?, &mut cache)?;
        eval(&[&p])?;
        picked = Some(ops::slice(&p, &[0, end - at - 1], &[1, end - at], &[1, 1])?);
    }
    Ok((cache, picked.ok_or("an empty prompt")?))
}

/// Timings of `steps` decode steps of `rows` sequences after a `prompt`-token prefill.
fn run(model: &dyn LanguageModel, rows: i32, prompt: i32, steps: usize, turbo: Option<&KvCompression>, report: bool) -> Res<()> {
    let kinds = model.kv_layout().kinds;
    // Each row prefilled on its own, then joined, as the engine batches.
    let (mut cache, first) = prefill_row(model, &kinds, 0, prompt)?;
    let mut last = vec![first];
    for r in 1..rows {
        let (row_cache, picked) = prefill_row(model, &kinds, r, prompt)?;
        cache.extend(row_cache)?;
        last.push(picked);
    }
    let mut tokens = ops::concatenate(&last.iter().collect::<Vec<_>>(), 0)?;
    eval(&[&tokens])?;
    if turbo.is_some() {
        cache.compress(turbo, Phase::Decode)?;
        eval(&cache.state().iter().collect::<Vec<_>>())?;
    }
    // One at a time: build, launch, wait.
    let (mut single, mut build, mut launch) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..steps + 4 {
        let t = Instant::now();
        let next = step(model, &tokens, &mut cache)?;
        let b = t.elapsed().as_secs_f64();
        async_eval(&[&next])?;
        let l = t.elapsed().as_secs_f64() - b;
        next.to_vec::<i32>()?;
        if i >= 4 {
            single.push(t.elapsed().as_secs_f64());
            build.push(b);
            launch.push(l);
        }
        tokens = next;
    }
    // Pipelined, as the engine decodes: queue step i+1, then read step i.
    // Where the host's time goes: building, launching, waiting for the token.
    let (mut p_build, mut p_launch, mut p_wait) = (Vec::new(), Vec::new(), Vec::new());
    let t = Instant::now();
    let mut pending = step(model, &tokens, &mut cache)?;
    async_eval(&[&pending])?;
    for _ in 0..steps {
        let s = Instant::now();
        let next = step(model, &pending, &mut cache)?;
        p_build.push(s.elapsed().as_secs_f64());
        let s = Instant::now();
        async_eval(&[&next])?;
        p_launch.push(s.elapsed().as_secs_f64());
        let s = Instant::now();
        pending.to_vec::<i32>()?;
        p_wait.push(s.elapsed().as_secs_f64());
        pending = next;
    }
    pending.to_vec::<i32>()?;
    let piped = t.elapsed().as_secs_f64() / (steps + 1) as f64;
    if !report {
        return Ok(memory::clear_cache()?);
    }
    println!(
        "| {rows} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} / {:.2} / {:.2} | {:.0} |",
        median_ms(build),
        median_ms(launch),
        median_ms(single),
        piped * 1e3,
        median_ms(p_build),
        median_ms(p_launch),
        median_ms(p_wait),
        rows as f64 / piped
    );
    memory::clear_cache()?;
    Ok(())
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dir = args
        .iter()
        .find(|a| !a.starts_with("--") && !a.chars().all(|c| c.is_ascii_digit() || c == ','))
        .map(PathBuf::from)
        .ok_or("usage: decode_step MODEL_DIR [--rows 1,8] [--prompt 128] [--steps 64]")?;
    let rows: Vec<i32> = list(&args, "--rows", "1,8")?;
    let prompt: i32 = arg(&args, "--prompt", 128)?;
    let steps: usize = arg(&args, "--steps", 64)?;
    let turbo_name: String = arg(&args, "--turbo-kv", String::new())?;
    let model = models::load(&dir)?.model;
    let turbo = match turbo_name.as_str() {
        "" => None,
        preset => {
            let layout = model.kv_layout();
            Some(KvCompression::turbo(preset, i32::MAX)?.for_model(layout.head_dim, layout.attention_sinks, layout.fixed_kv)?)
        }
    };
    println!(
        "{} (quantized matmul kernel: {}; KV cache: {})",
        dir.display(),
        if models::quant_kernel::in_use() { "ours" } else { "MLX's" },
        if turbo_name.is_empty() { "16-bit" } else { &turbo_name }
    );
    println!("| rows | build ms | launch ms | step ms (one at a time) | step ms (pipelined) | pipelined: build / launch / wait ms | tok/s pipelined |");
    println!("|---|---|---|---|---|---|---|");
    for &r in &rows {
        // The first pass compiles the GPU kernels this row count uses.
        run(model.as_ref(), r, prompt, 8, turbo.as_ref(), false)?;
        run(model.as_ref(), r, prompt, steps, turbo.as_ref(), true)?;
    }
    Ok(())
}
