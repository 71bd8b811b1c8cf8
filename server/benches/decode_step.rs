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
//!       [--passes 1] [--ragged] [--turbo-kv PRESET] [--engine-loop] [--alternate]
//!       [--warm-prompt N] [--fused on,off] [--direct on,off] [--launch-thread off,on] [--host-profile HZ]
//!       [--graph-ops]
//!
//! Each row count first runs one untimed pass of the same length, so every
//! kernel and CUDA graph the timed passes need (the cache grows every 256
//! positions) is compiled and instantiated before timing; `--passes` timed
//! passes follow. `--warm-prompt N` makes that pass's prompt N tokens: at
//! long contexts the prefill takes most of a pass (a 64K-token prompt over a
//! minute on the Qwen3-30B-A3B shape on an H200), and a timed pass's own
//! steps one at a time come before its pipelined ones, so what compiles per
//! cache length compiles there. Besides the medians, a line per pass gives
//! the pipelined steps' spread (p50, p90, max) and the steps over 3x the
//! median.
//!
//! `--engine-loop` pipelines as the engine does (engine/batch.rs): sampling
//! is a graph of its own, queued before the next model call.
//!
//! `--ragged` gives row r a prompt 8·r tokens shorter than `--prompt`, as
//! sequences of other lengths share a batch in the server: the joined cache
//! is left-padded and attention takes an array mask (which, on CUDA, no fused
//! MLX attention kernel takes at one query position).
//!
//! `--turbo-kv` compresses the cache when decoding starts, as the engine
//! does (the prompt stays under the prefill threshold). A list such as
//! `--turbo-kv fp16,balanced` (`fp16`: the 16-bit cache) runs the
//! configurations in turn within each pass, in one process on one loaded
//! model, and ends with each one's median tok/s and the median of the
//! passes' ratios to the first: a lent GPU machine's host speed drifts by
//! tens of percent between passes and processes (a decode step is bound by
//! it), and passes run back to back share the drift.
//!
//! `--fused on,off` does the same for the quantized-matmul kernel's fused
//! forms (gate, up and swiglu in one launch; the residual added by the
//! output and down projections: `quant_kernel::set_fused`), for each
//! `--turbo-kv` configuration.
//!
//! `--direct on,off` does the same for the direct calls of CUDA custom
//! kernels (an instance's calls after its first through MLX's
//! precompiled-kernel path: `mlx_rs_safe::kernels::set_direct_calls`); `off`
//! is MLX's own call, which rebuilds the instance's source text each call
//! (MLX compiles an instance's module itself when the warm-up pass first
//! meets it that way).
//!
//! `--launch-thread off,on` does the same for where the pipelined steps are
//! launched: `on` hands each built step to a thread of its own, which
//! launches it (`async_eval`) and then reads the step before's token, while
//! this thread builds the next step's graph. A pipelined step then costs the
//! longer of building and launching instead of their sum, if MLX builds one
//! graph while it encodes another (an experiment: the engine launches on the
//! thread that builds; on an H200 it lost, 0.66x at one row and 0.73x at
//! eight, BENCHMARKS.md session 55). Its pipelined launch and wait columns are the
//! launcher's; the step column is the builder's. So that two threads can
//! share its work, the whole bench runs on a stream made for any thread
//! (`Stream::new_any_thread`): MLX's streams are otherwise their thread's own.
//!
//! `--host-profile HZ` samples the process's threads HZ times a second of
//! CPU time over each row count's timed passes (their prefills too, a small
//! share) and prints each busy thread's functions by samples, where they ran
//! and beneath them (`common::host_profile`): which of MLX's functions a
//! step's building and launching spend their time in, on a machine without
//! perf.
//!
//! `--graph-ops` prints, for each timed pass, its first step's graph: the
//! operations by MLX primitive and the arrays it reads (`mlx_rs_safe::graph`).
//! MLX's host time per step grows with the operations it walks and
//! encodes, so their count says what a change to the step's graph saves on
//! any machine, where timings on a lent one drift.
//!
//! `--alternate` adds one no-op (the tokens plus zero) in front of every
//! other step's graph. On CUDA, MLX keys each committed CUDA graph by its
//! nodes and updates the executable graph of the same key in place; with the
//! no-op, consecutive steps' graphs have other keys (every graph boundary
//! moves by one node), so a step never updates the graphs of the step still
//! running before it. Comparing the two shows what that in-place update costs.
//!
//! Run it once with `MLX_SERVE_QMM_KERNEL=0` and once without to compare
//! MLX's quantized kernels with ours (the switch is read once a process).

mod common;
use common::host_profile::HostProfile;
use common::{arg, list, median, Res};

use std::path::PathBuf;
use std::time::Instant;

use mlx_rs_safe::{async_eval, eval, memory, ops, with_stream, Array, Stream};
use mlx_serve::kv::{KvCompression, ModelCache, Phase};
use mlx_serve::models::{self, LanguageModel};



/// Tokens a prefill chunk takes.
const PREFILL_CHUNK: usize = 2048;

fn median_ms(v: Vec<f64>) -> f64 {
    median(v) * 1e3
}

fn mean_ms(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64 * 1e3
}

fn max_ms(v: &[f64]) -> f64 {
    v.iter().copied().fold(0.0, f64::max) * 1e3
}

/// Step `i`'s input: `tokens`, or with `alternate` on odd steps `tokens + 0`
/// (one more node, so the step's CUDA graphs differ from its neighbours').
fn step_input(tokens: &Array, i: usize, alternate: bool) -> Res<Array> {
    if alternate && i % 2 == 1 {
        Ok(ops::add(tokens, &Array::from_slice(&[0i32], &[1])?)?)
    } else {
        Ok(tokens.clone())
    }
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

/// Where the host's time goes in pipelined steps, each a Vec of seconds per
/// step: building the step's graph (in the engine's order, queueing the
/// sampling too), launching it, waiting for the previous token, and the
/// whole step.
#[derive(Default)]
struct Phases {
    build: Vec<f64>,
    launch: Vec<f64>,
    wait: Vec<f64>,
    step: Vec<f64>,
}

impl Phases {
    fn push(&mut self, start: Instant, launched: Instant, waited: Instant) {
        let now = Instant::now();
        self.record((launched - start).as_secs_f64(), (waited - launched).as_secs_f64(), (now - waited).as_secs_f64(), (now - start).as_secs_f64());
    }

    fn record(&mut self, build: f64, launch: f64, wait: f64, step: f64) {
        self.build.push(build);
        self.launch.push(launch);
        self.wait.push(wait);
        self.step.push(step);
    }
}

/// `steps` steps, each (model + greedy pick) one graph queued before the
/// previous step's token is read.
fn pipelined(model: &dyn LanguageModel, tokens: &Array, cache: &mut ModelCache, steps: usize, alternate: bool) -> Res<Phases> {
    let mut phases = Phases::default();
    let mut pending = step(model, tokens, cache)?;
    async_eval(&[&pending])?;
    for i in 1..=steps {
        let start = Instant::now();
        let next = step(model, &step_input(&pending, i, alternate)?, cache)?;
        let launched = Instant::now();
        async_eval(&[&next])?;
        let waited = Instant::now();
        pending.to_vec::<i32>()?;
        phases.push(start, launched, waited);
        pending = next;
    }
    pending.to_vec::<i32>()?;
    Ok(phases)
}

/// `steps` steps as `pipelined`, each launched on a thread of its own (see
/// `--launch-thread` above): at most one built step waits for the launcher,
/// which launches step i and then reads step i-1's token while this thread
/// builds step i+1. `stream` is this thread's current stream, one made for
/// any thread (`main`): a thread's own stream cannot be evaluated on by
/// another, and the model's compiled graphs keep the stream they were
/// traced on, so the whole bench runs on it.
fn pipelined_on_thread(model: &dyn LanguageModel, tokens: &Array, cache: &mut ModelCache, steps: usize, alternate: bool, stream: &Stream) -> Res<Phases> {
    let on_launcher = stream.clone();
    let mut phases = Phases::default();
    let mut pending = step(model, tokens, cache)?;
    std::thread::scope(|scope| -> Res<()> {
        let (to_launcher, built) = std::sync::mpsc::sync_channel::<Array>(1);
        let (to_builder, reports) = std::sync::mpsc::channel::<(f64, f64)>();
        let launcher = scope.spawn(move || with_stream(&on_launcher, || -> Result<(), String> {
            let mut previous: Option<Array> = None;
            for next in built {
                let t = Instant::now();
                async_eval(&[&next]).map_err(|e| e.to_string())?;
                let launch = t.elapsed().as_secs_f64();
                if let Some(p) = &previous {
                    p.to_vec::<i32>().map_err(|e| e.to_string())?;
                }
                // The builder reads this step's times unless it has stopped on an error of its own.
                let _ = to_builder.send((launch, t.elapsed().as_secs_f64() - launch));
                previous = Some(next);
            }
            if let Some(p) = previous {
                p.to_vec::<i32>().map_err(|e| e.to_string())?;
            }
            // Queued work finished before the thread lets go of it (mlx_rs_safe::synchronize).
            mlx_rs_safe::synchronize().map_err(|e| e.to_string())
        }));
        // A send or receive fails only when the launcher has stopped: its own error says why.
        let mut built_all = || -> Res<()> {
            to_launcher.send(pending.clone())?;
            for i in 1..=steps {
                let start = Instant::now();
                let next = step(model, &step_input(&pending, i, alternate)?, cache)?;
                let build = start.elapsed().as_secs_f64();
                to_launcher.send(next.clone())?;
                let (launch, wait) = reports.recv()?;
                phases.record(build, launch, wait, start.elapsed().as_secs_f64());
                pending = next;
            }
            Ok(())
        };
        let built_all = built_all();
        drop(to_launcher);
        launcher.join().map_err(|_| "the launcher thread panicked")??;
        built_all
    })?;
    Ok(phases)
}

/// `steps` steps in the engine's order (engine/batch.rs): the previous
/// model call's sampling (log-probabilities and argmax over the vocabulary)
/// is queued as a graph of its own, the next model call is built from its
/// tokens and queued, then the sampled tokens are read.
fn pipelined_as_engine(model: &dyn LanguageModel, tokens: &Array, cache: &mut ModelCache, rows: i32, steps: usize, alternate: bool) -> Res<Phases> {
    let forward = |input: &Array, cache: &mut ModelCache| -> Res<Array> {
        let logits = model.forward(input, cache)?;
        let v = logits.dim(-1)?;
        Ok(ops::reshape(&logits, &[rows, v])?)
    };
    let mut phases = Phases::default();
    let mut logits = forward(tokens, cache)?;
    async_eval(&[&logits])?;
    for i in 1..=steps {
        let start = Instant::now();
        let logprobs = ops::subtract(&logits, &ops::logsumexp(&logits, &[-1], true)?)?;
        let picked = ops::astype(&ops::argmax(&logprobs, -1, false)?, mlx_rs_safe::Dtype::Uint32)?;
        async_eval(&[&picked, &logprobs])?;
        logits = forward(&step_input(&ops::reshape(&picked, &[-1, 1])?, i, alternate)?, cache)?;
        let launched = Instant::now();
        async_eval(&[&logits])?;
        let waited = Instant::now();
        picked.to_vec::<u32>()?;
        phases.push(start, launched, waited);
    }
    eval(&[&logits])?;
    Ok(phases)
}

/// What a pass runs: `steps` decode steps after a `prompt`-token prefill.
#[derive(Clone, Copy)]
struct Pass<'a> {
    prompt: i32,
    steps: usize,
    turbo: Option<&'a KvCompression>,
    /// The quantized-matmul kernel's fused forms on or off (None: as set).
    fused: Option<bool>,
    /// Direct calls of CUDA custom kernels on or off (None: as set).
    direct: Option<bool>,
    /// Print the first step's graph (operations by primitive).
    graph: bool,
    ragged: bool,
    alternate: bool,
    engine_loop: bool,
    /// The stream every thread works on, when a thread of its own launches the pipelined steps.
    launch_thread: Option<&'a Stream>,
}

/// Timings of a pass over `rows` sequences, printed when `report` (with
/// `label` after the row count) and then its pipelined tok/s returned.
fn run(model: &dyn LanguageModel, rows: i32, pass: &Pass, report: bool, label: &str) -> Res<Option<f64>> {
    let Pass { prompt, steps, turbo, fused, direct, graph, ragged, alternate, engine_loop, launch_thread } = *pass;
    if let Some(on) = fused {
        models::quant_kernel::set_fused(on);
    }
    if let Some(on) = direct {
        mlx_rs_safe::kernels::set_direct_calls(on);
    }
    let row_prompt = |r: i32| if ragged { (prompt - 8 * r).max(1) } else { prompt };
    let kinds = model.kv_layout().kinds;
    // Each row prefilled on its own, then joined, as the engine batches.
    let (mut cache, first) = prefill_row(model, &kinds, 0, prompt)?;
    let mut last = vec![first];
    for r in 1..rows {
        let (row_cache, picked) = prefill_row(model, &kinds, r, row_prompt(r))?;
        cache.extend([row_cache])?;
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
        let next = step(model, &step_input(&tokens, i, alternate)?, &mut cache)?;
        let b = t.elapsed().as_secs_f64();
        if graph && report && i == 0 {
            let g = mlx_rs_safe::graph::graph_ops(&[&next])?;
            let each: Vec<String> = g.by_primitive.iter().map(|(name, n)| format!("{name} {n}")).collect();
            println!("| {rows}{label} | one step's graph: {} ops over {} inputs; {} |", g.total(), g.inputs, each.join(", "));
        }
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
    // Pipelined: queue step i+1, then read step i's token.
    let t = Instant::now();
    let p = if engine_loop {
        pipelined_as_engine(model, &tokens, &mut cache, rows, steps, alternate)?
    } else if let Some(stream) = launch_thread {
        pipelined_on_thread(model, &tokens, &mut cache, steps, alternate, stream)?
    } else {
        pipelined(model, &tokens, &mut cache, steps, alternate)?
    };
    let (p_build, p_launch, p_wait, p_step) = (p.build, p.launch, p.wait, p.step);
    let piped = t.elapsed().as_secs_f64() / (steps + 1) as f64;
    if !report {
        memory::clear_cache()?;
        return Ok(None);
    }
    println!(
        "| {rows}{label} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} / {:.2} / {:.2} | {:.2} / {:.2} / {:.2} | {:.2} / {:.2} | {:.0} |",
        median_ms(build),
        median_ms(launch),
        median_ms(single),
        piped * 1e3,
        median_ms(p_build.clone()),
        median_ms(p_launch.clone()),
        median_ms(p_wait.clone()),
        mean_ms(&p_build),
        mean_ms(&p_launch),
        mean_ms(&p_wait),
        max_ms(&p_launch),
        max_ms(&p_wait),
        rows as f64 / piped
    );
    let median = median_ms(p_step.clone());
    let mut sorted = p_step.clone();
    sorted.sort_by(|a, b| a.total_cmp(b));
    let slow: Vec<String> = p_step
        .iter()
        .enumerate()
        .filter(|(_, &v)| v * 1e3 > 3.0 * median)
        .take(12)
        .map(|(i, v)| format!("{}:{:.1}", i + 1, v * 1e3))
        .collect();
    println!(
        "|   | pipelined step ms p50 {:.2} p90 {:.2} max {:.2}; {} of {} steps over 3x the median (step:ms) {} |",
        median,
        sorted[sorted.len() * 9 / 10] * 1e3,
        sorted[sorted.len() - 1] * 1e3,
        p_step.iter().filter(|&&v| v * 1e3 > 3.0 * median).count(),
        p_step.len(),
        slow.join(" ")
    );
    memory::clear_cache()?;
    Ok(Some(rows as f64 / piped))
}

fn main() -> Res<()> {
    // Everything on a stream made for any thread (see `pipelined_on_thread`).
    let stream = Stream::new_any_thread(mlx_rs_safe::current_device()?);
    with_stream(&stream, || bench(&stream))
}

fn bench(stream: &Stream) -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dir = args
        .iter()
        .find(|a| !a.starts_with("--") && !a.chars().all(|c| c.is_ascii_digit() || c == ','))
        .map(PathBuf::from)
        .ok_or("usage: decode_step MODEL_DIR [--rows 1,8] [--prompt 128] [--steps 64]")?;
    let rows: Vec<i32> = list(&args, "--rows", "1,8")?;
    let prompt: i32 = arg(&args, "--prompt", 128)?;
    let steps: usize = arg(&args, "--steps", 64)?;
    let kv_names: String = arg(&args, "--turbo-kv", String::new())?;
    let alternate = args.iter().any(|a| a == "--alternate");
    let ragged = args.iter().any(|a| a == "--ragged");
    let engine_loop = args.iter().any(|a| a == "--engine-loop");
    let passes: usize = arg(&args, "--passes", 1)?;
    let warm_prompt: i32 = arg(&args, "--warm-prompt", prompt)?;
    let fused = on_off(&args, "--fused")?;
    let direct = on_off(&args, "--direct")?;
    let threaded = on_off(&args, "--launch-thread")?;
    let profile_hz: i32 = arg(&args, "--host-profile", 0)?;
    let graph = args.iter().any(|a| a == "--graph-ops");
    let model = models::load(&dir)?.model;
    let mut configs: Vec<Config> = Vec::new();
    for name in kv_names.split(',').map(str::trim) {
        let turbo = match name {
            "" | "fp16" => None,
            preset => {
                let layout = model.kv_layout();
                Some(KvCompression::turbo(preset, i32::MAX)?.for_model(layout.head_dim, layout.attention_sinks, layout.fixed_kv)?)
            }
        };
        for &f in &fused {
            for &d in &direct {
                for &t in &threaded {
                    let kv = if name.is_empty() { "fp16" } else { name };
                    let mut label = kv.to_string();
                    if let Some(on) = f {
                        label += if on { " fused on" } else { " fused off" };
                    }
                    if let Some(on) = d {
                        label += if on { " direct on" } else { " direct off" };
                    }
                    if let Some(on) = t {
                        label += if on { " launch thread" } else { " one thread" };
                    }
                    configs.push(Config { label, turbo, fused: f, direct: d, launch_thread: t == Some(true) });
                }
            }
        }
    }
    let names: Vec<&str> = configs.iter().map(|c| c.label.as_str()).collect();
    println!(
        "{} (quantized matmul kernel: {}; KV cache: {}{}; consecutive steps' graphs: {}{})",
        dir.display(),
        if models::quant_kernel::in_use() { "ours" } else { "MLX's" },
        if configs.len() > 1 { format!("{}, in turn each pass", names.join(", ")) } else if kv_names.is_empty() { "16-bit".to_string() } else { kv_names.clone() },
        if ragged { ", rows of other lengths (left-padded)" } else { "" },
        if alternate { "alternating" } else { "alike" },
        if engine_loop { "; pipelined as the engine: sampling its own graph" } else { "" }
    );
    println!("| rows | build ms | launch ms | step ms (one at a time) | step ms (pipelined) | pipelined: build / launch / wait ms (medians) | (means) | pipelined: launch / wait max ms | tok/s pipelined |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let base = Pass { prompt, steps, turbo: None, fused: None, direct: None, graph, ragged, alternate, engine_loop, launch_thread: None };
    fn pass_of<'a>(c: &'a Config, base: Pass<'a>, stream: &'a Stream) -> Pass<'a> {
        Pass { turbo: c.turbo.as_ref(), fused: c.fused, direct: c.direct, launch_thread: c.launch_thread.then_some(stream), ..base }
    }
    let label = |name: &str| if configs.len() > 1 { format!(" {name}") } else { String::new() };
    for &r in &rows {
        // The first pass compiles the GPU kernels this row count uses, for
        // every cache length the timed passes reach.
        for c in &configs {
            run(model.as_ref(), r, &Pass { prompt: warm_prompt, ..pass_of(c, base, stream) }, false, "")?;
        }
        let mut tps: Vec<Vec<f64>> = vec![Vec::new(); configs.len()];
        let profile = if profile_hz > 0 { Some(HostProfile::start(profile_hz)?) } else { None };
        for _ in 0..passes {
            for (i, c) in configs.iter().enumerate() {
                tps[i].extend(run(model.as_ref(), r, &pass_of(c, base, stream), true, &label(&c.label))?);
            }
        }
        if let Some(profile) = profile {
            println!("\n{r} row(s), the timed passes' host profile:");
            // Building a step's graph (the model's forward) and MLX's launch of it.
            profile.print(25, &["forward", "mlx::core::async_eval"])?;
            println!();
        }
        if configs.len() > 1 && passes > 0 {
            print_pairs(r, &names, &tps);
        }
    }
    Ok(())
}

/// One configuration of a pass: its name, its compression (None: the
/// 16-bit cache), whether the fused kernel forms and direct kernel calls are
/// on (None: as set) and whether a thread of its own launches the pipelined
/// steps.
struct Config {
    label: String,
    turbo: Option<KvCompression>,
    fused: Option<bool>,
    direct: Option<bool>,
    launch_thread: bool,
}

/// The on/off list after `flag` (`--fused on,off`): `[None]` (as set) when absent.
fn on_off(args: &[String], flag: &str) -> Res<Vec<Option<bool>>> {
    let names: String = arg(args, flag, String::new())?;
    if names.is_empty() {
        return Ok(vec![None]);
    }
    names
        .split(',')
        .map(|f| match f.trim() {
            "on" => Ok(Some(true)),
            "off" => Ok(Some(false)),
            other => Err(format!("{flag} takes on and off, not {other}").into()),
        })
        .collect()
}

/// Each configuration's median pipelined tok/s over the passes, and the
/// median of each pass's ratio to the first configuration's run beside it.
fn print_pairs(rows: i32, names: &[&str], tps: &[Vec<f64>]) {
    for (name, runs) in names.iter().zip(tps) {
        let ratios: Vec<f64> = runs.iter().zip(&tps[0]).map(|(x, base)| x / base).collect();
        let shown: Vec<String> = runs.iter().map(|x| format!("{x:.0}")).collect();
        println!(
            "|   | {rows} row(s), {name}: median {:.1} tok/s over {} passes ({}); median ratio to {} in the same pass {:.2}x |",
            median(runs.clone()),
            runs.len(),
            shown.join(", "),
            names[0],
            median(ratios)
        );
    }
}
