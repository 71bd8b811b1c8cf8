//! Decode-step attention per KV-cache format, apart from the rest of the
//! model: the layers of one model shape, each holding a random cache of N
//! tokens, take one new token (keys and values appended, attention read) as
//! the engine's decode step does; the time per step is the median over the
//! timed steps, after warm-up steps (the GPU compiles its kernels then). For
//! TurboQuant it also times the attention kernels alone (no new token) and
//! the new token's encoding alone, and gives the bytes of cache a step reads
//! per second.
//!
//!   cargo bench --bench kv_attend -- [--contexts 4096,16384] [--formats fp16,balanced,compact]
//!       [--layers 32] [--kv-heads 8] [--heads 32] [--head-dim 128] [--rows 1] [--steps 30]
//!       [--repeats 1] [--ragged]
//!
//! `--ragged` gives row r a history 8·r tokens shorter, as sequences of
//! other lengths share a batch in the server: the 16-bit cache is then
//! left-padded and read by our kernel (`dense_attend`) on CUDA instead of
//! MLX's fused attention (`MLX_SERVE_DENSE_KERNEL=0`: MLX's masked one).
//!
//! With --repeats N every format is timed N times, the formats in turn (the
//! 16-bit cache's own speed drifts from run to run on a lent GPU), and each
//! row gives the median; the first format is the ratio's base.
//!
//! Prints a Markdown table. Meant for a GPU machine: on the CPU the
//! TurboQuant rows take the MLX-ops path and the kernel columns are empty.

mod common;
use common::{arg, median, Res};

use std::time::Instant;

use mlx_rs_safe::{eval, ops, random, Array, Dtype};
use mlx_serve::kv::turbo::{kernels, Codec, RECENT, ROOM, SINKS};
use mlx_serve::kv::{AttendArgs, KvKind, KvRow, KvStore, StepMemo, TurboPreset};


struct Shape {
    layers: usize,
    kv_heads: i32,
    heads: i32,
    head_dim: i32,
    rows: i32,
    /// Row r holds 8·r positions fewer (`--ragged`).
    ragged: bool,
}


fn normal(shape: &[i32], seed: u64) -> Res<Array> {
    Ok(random::normal(shape, Dtype::Bfloat16, 0.0, 1.0, &random::key(seed)?)?)
}

/// Median milliseconds of `steps` calls of `step` (each evaluated), after
/// `warmup`: (building the graph, the whole step).
fn time(warmup: usize, steps: usize, mut step: impl FnMut() -> Res<Vec<Array>>) -> Res<(f64, f64)> {
    for _ in 0..warmup {
        let out = step()?;
        eval(&out.iter().collect::<Vec<_>>())?;
    }
    let (mut build, mut total) = (Vec::with_capacity(steps), Vec::with_capacity(steps));
    for _ in 0..steps {
        let t = Instant::now();
        let out = step()?;
        build.push(t.elapsed().as_secs_f64() * 1e3);
        eval(&out.iter().collect::<Vec<_>>())?;
        total.push(t.elapsed().as_secs_f64() * 1e3);
    }
    Ok((median(build), median(total)))
}

/// The layers' caches of `ctx` tokens in `format` (None: 16-bit).
fn caches(s: &Shape, ctx: i32, preset: Option<TurboPreset>) -> Res<Vec<Box<dyn KvStore>>> {
    let mut out = Vec::with_capacity(s.layers);
    for layer in 0..s.layers {
        let shape = [s.rows, s.kv_heads, ctx, s.head_dim];
        let (k, v) = (normal(&shape, 10 + 2 * layer as u64)?, normal(&shape, 11 + 2 * layer as u64)?);
        let rows: Vec<KvRow> = (0..s.rows)
            .map(|b| {
                let len = if s.ragged { ctx - 8 * b } else { ctx };
                let row = |x: &Array| -> Res<Array> { Ok(ops::slice_axis(&ops::slice_axis(x, 0, b, b + 1)?, 2, ctx - len, ctx)?) };
                Ok(KvRow { kind: KvKind::Dense, offset: len, columns: vec![row(&k)?, row(&v)?] })
            })
            .collect::<Res<_>>()?;
        let dense = KvKind::Dense.store(&rows)?;
        let store = match preset {
            None => dense,
            Some(p) => {
                let kind = KvKind::Turbo(p.format(layer, s.layers, 3));
                dense.compress(&kind)?.ok_or("the dense cache did not convert")?
            }
        };
        eval(&store.state().iter().collect::<Vec<_>>())?;
        out.push(store);
    }
    Ok(out)
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let s = Shape {
        layers: arg(&args, "--layers", 32)?,
        kv_heads: arg(&args, "--kv-heads", 8)?,
        heads: arg(&args, "--heads", 32)?,
        head_dim: arg(&args, "--head-dim", 128)?,
        rows: arg(&args, "--rows", 1)?,
        ragged: args.iter().any(|a| a == "--ragged"),
    };
    if s.ragged && s.rows < 2 {
        return Err("--ragged needs --rows 2 or more".into());
    }
    let steps: usize = arg(&args, "--steps", 30)?;
    let repeats: usize = arg::<usize>(&args, "--repeats", 1)?.max(1);
    let contexts: String = arg(&args, "--contexts", "4096,16384,32768,65536".to_string())?;
    let formats: String = arg(&args, "--formats", "fp16,balanced,compact".to_string())?;
    let contexts: Vec<i32> = contexts.split(',').map(str::parse).collect::<Result<_, _>>()?;
    println!("backend {:?}; TurboQuant kernels in use: {}", mlx_rs_safe::kernels::gpu_backend(), kernels::usable());
    println!(
        "{} layers, {} rows{}, {} query heads, {} KV heads of {}; bfloat16; median of {steps} steps, of {repeats} repeats taking the formats in turn\n",
        s.layers,
        s.rows,
        if s.ragged { " of other lengths (row r 8·r positions shorter)" } else { "" },
        s.heads,
        s.kv_heads,
        s.head_dim
    );
    println!("| context | format | step ms | graph ms | vs fp16 | KV MB read | GB/s | kernels ms (graph) | encode ms (graph) |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let scale = (s.head_dim as f32).powf(-0.5);
    let attend_args = AttendArgs { scale, window: None, sinks: None, keep: false };
    let q = normal(&[s.rows, s.heads, 1, s.head_dim], 1)?;
    let (k1, v1) = (normal(&[s.rows, s.kv_heads, 1, s.head_dim], 2)?, normal(&[s.rows, s.kv_heads, 1, s.head_dim], 3)?);
    for &ctx in &contexts {
        let names: Vec<&str> = formats.split(',').collect();
        // Every repeat times each format in turn, so drift on the machine falls
        // on all of them; a row shows the median over the repeats.
        let mut runs: Vec<Vec<(f64, f64)>> = vec![Vec::new(); names.len()];
        let mut kv_bytes = vec![0usize; names.len()];
        let mut kernel_cols = vec![(String::new(), String::new()); names.len()];
        for repeat in 0..repeats {
            for (i, name) in names.iter().enumerate() {
                let preset = if *name == "fp16" { None } else { Some(TurboPreset::parse(name)?) };
                let mut layers = caches(&s, ctx, preset)?;
                kv_bytes[i] = layers.iter().map(|l| l.nbytes()).sum();
                let memo = StepMemo::default();
                runs[i].push(time(5, steps, || {
                    memo.clear();
                    layers.iter_mut().map(|l| Ok(l.attend(&q, &k1, &v1, &attend_args, &memo)?)).collect()
                })?);
                drop(layers);
                // KV_ATTEND_FORCE_KERNELS=1 times the kernels even where the start-up
                // check rejected them (kernel experiments: the output is not checked).
                let force = std::env::var_os("KV_ATTEND_FORCE_KERNELS").is_some();
                if let Some(p) = preset.filter(|_| repeat == 0 && (force || kernels::usable())) {
                    // The kernels alone, over freshly encoded columns of the same size per layer.
                    let codec = Codec::new(p.format(2, s.layers, 3), s.head_dim, Dtype::Bfloat16)?;
                    let shape = [s.rows, s.kv_heads, ctx, s.head_dim];
                    let sink_shape = [s.rows, s.kv_heads, SINKS, s.head_dim];
                    let mut sets = Vec::with_capacity(s.layers);
                    for layer in 0..s.layers as u64 {
                        let [rows, _] = kernels::encode(&codec, &normal(&shape, 100 + layer)?, &normal(&shape, 200 + layer)?)?;
                        let sinks = [normal(&sink_shape, 300 + layer)?, normal(&sink_shape, 400 + layer)?];
                        // Each layer's cache counts its attention's splits apart.
                        let counts = kernels::SplitCounts::default().for_groups(s.rows * s.kv_heads)?;
                        eval(&[&rows, &sinks[0], &sinks[1], &counts])?;
                        sets.push((rows, sinks, counts));
                    }
                    // The newest RECENT positions read from a full window, the rest from codes.
                    let cut = ctx - RECENT;
                    let params = kernels::step_params(cut, scale, &vec![SINKS; s.rows as usize])?;
                    let win = normal(&[s.rows, s.kv_heads, 2, ROOM, s.head_dim], 500)?;
                    let window_params = kernels::step_params(ROOM, scale, &vec![ROOM - RECENT; s.rows as usize])?;
                    eval(&[&params, &win, &window_params])?;
                    let window = kernels::Window { buffer: &win, params: &window_params };
                    let step = time(5, steps, || sets.iter().map(|(rows, sinks, counts)| Ok(kernels::attend(&codec, &q, sinks, rows, &params, cut, &window, counts)?)).collect())?;
                    let kern = format!("{:.3} ({:.3})", step.1, step.0);
                    // A decode step's encoding: the new position's rows and the window with it.
                    let moves = kernels::window_moves(0, RECENT)?;
                    let step = time(5, steps, || {
                        let mut out = Vec::new();
                        for _ in 0..s.layers {
                            out.extend(kernels::encode_step(&codec, &k1, &v1, &win, &moves)?);
                        }
                        Ok(out)
                    })?;
                    kernel_cols[i] = (kern, format!("{:.3} ({:.3})", step.1, step.0));
                }
            }
        }
        let medians: Vec<(f64, f64)> = runs.into_iter().map(|r| (median(r.iter().map(|x| x.0).collect()), median(r.iter().map(|x| x.1).collect()))).collect();
        for (i, name) in names.iter().enumerate() {
            let (graph, ms) = medians[i];
            let (kern, enc) = &kernel_cols[i];
            println!(
                "| {ctx} | {name} | {ms:.3} | {graph:.3} | {:.2}x | {:.0} | {:.0} | {kern} | {enc} |",
                medians[0].1 / ms,
                kv_bytes[i] as f64 / 1e6,
                kv_bytes[i] as f64 / 1e6 / ms
            );
        }
    }
    Ok(())
}
