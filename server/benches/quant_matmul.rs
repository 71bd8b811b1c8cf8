//! Quantized matmul at decode batch sizes: GB/s of weights read by MLX's
//! quantized_matmul / gather_qmm and by the decode kernel
//! (`metal-kernels/quant_matmul.cu`), for the weight shapes of Llama-3.1-8B
//! and Qwen3-30B-A3B, in one run. A product is timed inside a graph of many
//! products over distinct copies of its weights (more bytes than the GPU's
//! L2 cache holds, as a model's layers are), one evaluation per graph: the
//! time per product includes its launch, as in a decode step. The median of
//! the timed graphs, after warm-up graphs (the GPU compiles its kernels).
//!
//!   cargo bench --bench quant_matmul -- [--rows 1,2,4,8,16] [--bits 4] [--group-size 64] [--graphs 9]
//!       [--wk 1,2,4,8,16]
//!
//! `--wk` adds a line for each dense product with each listed number of warps
//! splitting a block's reduction (the model's tiling otherwise, `Tiles::choose`;
//! a split the tiling cannot take is an error): which split a shape's
//! one-row product wants, as a step's kernels time it under Nsight Compute.
//!
//! Prints a Markdown table. Meant for a CUDA machine: elsewhere the kernel
//! columns are empty.

mod common;
use common::{arg, list, Res};

use std::time::Instant;

use mlx_rs_safe::quantized::{self, QuantSpec};
use mlx_rs_safe::{async_eval, eval, fast, ops, random, Array, Dtype};
use mlx_serve::models::quant_kernel;



/// A weight shape: `experts` stacked matrices of n x k (1: a dense layer),
/// `top_k` of them used per row.
struct Case {
    model: &'static str,
    name: &'static str,
    n: i32,
    k: i32,
    experts: i32,
    top_k: i32,
}

const CASES: &[Case] = &[
    Case {
        model: "Llama-3.1-8B",
        name: "q/o_proj",
        n: 4096,
        k: 4096,
        experts: 1,
        top_k: 1,
    },
    Case {
        model: "Llama-3.1-8B",
        name: "k/v_proj",
        n: 1024,
        k: 4096,
        experts: 1,
        top_k: 1,
    },
    Case {
        model: "Llama-3.1-8B",
        name: "gate/up_proj",
        n: 14336,
        k: 4096,
        experts: 1,
        top_k: 1,
    },
    Case {
        model: "Llama-3.1-8B",
        name: "down_proj",
        n: 4096,
        k: 14336,
        experts: 1,
        top_k: 1,
    },
    Case {
        model: "Llama-3.1-8B",
        name: "lm_head",
        n: 128256,
        k: 4096,
        experts: 1,
        top_k: 1,
    },
    Case {
        model: "Qwen3-30B-A3B",
        name: "q_proj",
        n: 4096,
        k: 2048,
        experts: 1,
        top_k: 1,
    },
    Case {
        model: "Qwen3-30B-A3B",
        name: "k/v_proj",
        n: 512,
        k: 2048,
        experts: 1,
        top_k: 1,
    },
    Case {
        model: "Qwen3-30B-A3B",
        name: "o_proj",
        n: 2048,
        k: 4096,
        experts: 1,
        top_k: 1,
    },
    Case {
        model: "Qwen3-30B-A3B",
        name: "experts gate/up",
        n: 768,
        k: 2048,
        experts: 128,
        top_k: 8,
    },
    Case {
        model: "Qwen3-30B-A3B",
        name: "experts down",
        n: 2048,
        k: 768,
        experts: 128,
        top_k: 8,
    },
];

struct Weights {
    w: Array,
    scales: Array,
    biases: Array,
    bytes: usize,
}

fn weights(c: &Case, spec: QuantSpec, seed: u64) -> Res<Weights> {
    let shape: Vec<i32> = if c.experts > 1 { vec![c.experts, c.n, c.k] } else { vec![c.n, c.k] };
    let f = random::normal(&shape, Dtype::Bfloat16, 0.0, 0.02, &random::key(seed)?)?;
    let (w, scales, biases) = quantized::quantize(&f, spec.group_size, spec.bits)?;
    eval(&[&w, &scales, &biases])?;
    let bytes = w.nbytes() + scales.nbytes() + biases.nbytes();
    Ok(Weights { w, scales, biases, bytes })
}

/// Median seconds per product of `graphs` timed evaluations of `products`:
/// (building the graph on the host, the whole graph built and evaluated).
fn time(graphs: usize, products: usize, mut build: impl FnMut() -> Res<Vec<Array>>) -> Res<(f64, f64)> {
    let (mut host, mut total) = (Vec::with_capacity(graphs), Vec::with_capacity(graphs));
    for i in 0..graphs + 2 {
        let t = Instant::now();
        let out = build()?;
        let built = t.elapsed().as_secs_f64();
        eval(&out.iter().collect::<Vec<_>>())?;
        if i >= 2 {
            host.push(built);
            total.push(t.elapsed().as_secs_f64());
        }
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2] / products as f64
    };
    Ok((median(host), median(total)))
}

/// The decode kernel on a dense product whatever its row count (the model's
/// threshold is `quant_kernel::MIN_ROWS`), tiled as the model tiles it, or
/// with `wk` warps splitting each block's reduction instead.
fn dense_kernel(x: &Array, w: &Array, scales: &Array, biases: &Array, spec: QuantSpec, wk: Option<i32>) -> Res<Array> {
    let shape = x.shape();
    let rows = shape[..shape.len() - 1].iter().product();
    let mut tiles = quant_kernel::Tiles::choose(rows, w.dim(0)?, shape[shape.len() - 1], spec.bits, 1);
    if let Some(wk) = wk {
        tiles.wk = wk;
    }
    Ok(quant_kernel::matmul_tiled(x, w, scales, Some(biases), spec, tiles)?)
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rows: Vec<i32> = list(&args, "--rows", "1,2,4,8,16")?;
    let bits: i32 = arg(&args, "--bits", 4)?;
    let group: i32 = arg(&args, "--group-size", 64)?;
    let graphs: usize = arg(&args, "--graphs", 9)?;
    let wks: Vec<i32> = if args.iter().any(|a| a == "--wk") { list(&args, "--wk", "")? } else { Vec::new() };
    let spec = QuantSpec::affine(group, bits);
    let kernel = quant_kernel::in_use();
    if args.iter().any(|a| a == "--host-profile") {
        return host_profile(spec, kernel);
    }
    if args.iter().any(|a| a == "--step") {
        return decode_step(spec, kernel, &rows, graphs);
    }
    println!(
        "backend {:?}; decode kernel in use: {kernel}; {bits}-bit, group {group}, bfloat16",
        mlx_rs_safe::kernels::gpu_backend()
    );
    println!("GB/s = bytes of weights (values, scales, biases) a product reads / its time; median of {graphs} graphs\n");
    println!("| model | weight | n x k | rows | MLX us | MLX GB/s | kernel us | kernel GB/s | speed-up | host us MLX / kernel |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for c in CASES {
        let one = weights(c, spec, 1)?;
        // Copies enough to overflow the L2 cache (50 MB on an H100) several times.
        let copies = (256usize << 20).div_ceil(one.bytes).max(2);
        let mut sets = vec![one];
        for i in 1..copies {
            sets.push(weights(c, spec, 1 + i as u64)?);
        }
        for &m in &rows {
            let x = random::normal(&[m, 1, c.k], Dtype::Bfloat16, 0.0, 1.0, &random::key(100)?)?;
            let (xg, idx, bytes) = if c.experts > 1 {
                let mut idx = Vec::with_capacity((m * c.top_k) as usize);
                let mut state = 12345u64;
                for _ in 0..m {
                    let mut chosen: Vec<u32> = Vec::new();
                    while chosen.len() < c.top_k as usize {
                        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                        let e = ((state >> 33) % c.experts as u64) as u32;
                        if !chosen.contains(&e) {
                            chosen.push(e);
                        }
                    }
                    idx.extend(chosen);
                }
                let mut distinct = idx.clone();
                distinct.sort();
                distinct.dedup();
                let per_expert = sets[0].bytes / c.experts as usize;
                let xg = ops::reshape(&x, &[m, 1, 1, 1, c.k])?;
                (Some(xg), Some(Array::from_slice(&idx, &[m, 1, c.top_k])?), distinct.len() * per_expert)
            } else {
                (None, None, sets[0].bytes)
            };
            let mlx = time(graphs, sets.len(), || {
                sets.iter()
                    .map(|s| match (&xg, &idx) {
                        (Some(xg), Some(idx)) => Ok(quantized::gather_qmm(
                            xg,
                            &s.w,
                            &s.scales,
                            Some(&s.biases),
                            None,
                            Some(idx),
                            true,
                            group,
                            bits,
                            false,
                        )?),
                        _ => Ok(quantized::quantized_matmul(&x, &s.w, &s.scales, Some(&s.biases), true, group, bits)?),
                    })
                    .collect()
            })?;
            let ours = if kernel {
                Some(time(graphs, sets.len(), || {
                    sets.iter()
                        .map(|s| {
                            let y = match (&xg, &idx) {
                                (Some(xg), Some(idx)) => quant_kernel::gather(xg, &s.w, &s.scales, Some(&s.biases), idx, spec)?,
                                _ => Some(dense_kernel(&x, &s.w, &s.scales, &s.biases, spec, None)?),
                            };
                            y.ok_or_else(|| "the kernel declined".into())
                        })
                        .collect()
                })?)
            } else {
                None
            };
            let gbs = |t: f64| bytes as f64 / t / 1e9;
            let (mlx_host, mlx) = mlx;
            let (ours_us, ours_gbs, speedup, ours_host) = match ours {
                Some((h, t)) => (
                    format!("{:.1}", t * 1e6),
                    format!("{:.0}", gbs(t)),
                    format!("{:.2}x", mlx / t),
                    format!("{:.1}", h * 1e6),
                ),
                None => ("-".into(), "-".into(), "-".into(), "-".into()),
            };
            let shape = if c.experts > 1 {
                format!("{} x {}x{} (top {})", c.experts, c.n, c.k, c.top_k)
            } else {
                format!("{}x{}", c.n, c.k)
            };
            println!(
                "| {} | {} | {shape} | {m} | {:.1} | {:.0} | {ours_us} | {ours_gbs} | {speedup} | {:.1} / {ours_host} |",
                c.model,
                c.name,
                mlx * 1e6,
                gbs(mlx),
                mlx_host * 1e6
            );
            // The same dense product with other reduction splits (`--wk`).
            for &wk in wks.iter().filter(|_| kernel && c.experts == 1) {
                let (h, t) = time(graphs, sets.len(), || {
                    sets.iter().map(|s| dense_kernel(&x, &s.w, &s.scales, &s.biases, spec, Some(wk))).collect()
                })?;
                println!("| {} | {} (wk {wk}) | {shape} | {m} | - | - | {:.1} | {:.0} | {:.2}x | - / {:.1} |", c.model, c.name, t * 1e6, gbs(t), mlx / t, h * 1e6);
            }
        }
    }
    Ok(())
}

/// Host microseconds to add one product to a graph (nothing evaluated), and
/// of its parts: where a decode step's graph-building time goes.
fn host_profile(spec: QuantSpec, kernel: bool) -> Res<()> {
    let c = &CASES[0];
    let s = weights(c, spec, 1)?;
    let x = random::normal(&[1, 1, c.k], Dtype::Bfloat16, 0.0, 1.0, &random::key(100)?)?;
    /// Mean host microseconds of one call of `f` (its result dropped unevaluated).
    fn per<T>(mut f: impl FnMut() -> Res<T>) -> Res<f64> {
        let reps = 2000;
        for _ in 0..50 {
            std::hint::black_box(f()?);
        }
        let t = Instant::now();
        for _ in 0..reps {
            std::hint::black_box(f()?);
        }
        Ok(t.elapsed().as_secs_f64() * 1e6 / reps as f64)
    }
    let (g, b) = (spec.group_size, spec.bits);
    println!("| step (one {}x{} product, 1 row) | host us |", c.n, c.k);
    println!("|---|---|");
    println!(
        "| MLX quantized_matmul | {:.2} |",
        per(|| Ok(quantized::quantized_matmul(&x, &s.w, &s.scales, Some(&s.biases), true, g, b)?))?
    );
    println!("| MLX reshape | {:.2} |", per(|| Ok(ops::reshape(&x, &[1, c.k])?))?);
    println!("| quant_kernel::in_use | {:.2} |", per(|| Ok(quant_kernel::in_use()))?);
    println!("| x.shape() + dtype | {:.2} |", per(|| Ok((x.shape(), x.dtype(), s.w.ndim())))?);
    if kernel {
        let tiles = quant_kernel::Tiles::choose(1, c.n, c.k, b, 1);
        println!(
            "| kernel launch alone (matmul_tiled) | {:.2} |",
            per(|| Ok(quant_kernel::matmul_tiled(&x, &s.w, &s.scales, Some(&s.biases), spec, tiles)?))?
        );
        println!(
            "| quant_kernel::matmul declining (1 row) | {:.2} |",
            per(|| Ok(quant_kernel::matmul(&x, &s.w, &s.scales, Some(&s.biases), spec)?))?
        );
    }
    Ok(())
}

/// The matmuls of a Llama-3.1-8B decode step (32 layers of q, k, v, o, gate,
/// up, down, 4-bit, with the norms, residuals and SwiGLU between them, no
/// attention), one graph per step, by MLX's kernels and by the decode kernel:
/// host time to build a step, wall time per step evaluated one at a time,
/// and per step when each step is built while the previous one runs (as the
/// engine pipelines decoding).
fn decode_step(spec: QuantSpec, kernel: bool, rows: &[i32], steps: usize) -> Res<()> {
    let shapes = [
        (4096, 4096),
        (1024, 4096),
        (1024, 4096),
        (4096, 4096),
        (14336, 4096),
        (14336, 4096),
        (4096, 14336),
    ];
    let mut layers = Vec::new();
    for l in 0..32u64 {
        let mut ws = Vec::new();
        for (i, &(n, k)) in shapes.iter().enumerate() {
            let c = Case {
                model: "",
                name: "",
                n,
                k,
                experts: 1,
                top_k: 1,
            };
            ws.push(weights(&c, spec, 1000 + l * 10 + i as u64)?);
        }
        layers.push(ws);
    }
    let bytes: usize = layers.iter().flatten().map(|w| w.bytes).sum();
    println!("| rows | path | host build ms | step ms (one at a time) | step ms (pipelined) | GB/s pipelined |");
    println!("|---|---|---|---|---|---|");
    for &m in rows {
        let x = random::normal(&[m, 1, 4096], Dtype::Bfloat16, 0.0, 1.0, &random::key(5)?)?;
        for path in ["MLX", "kernel"] {
            if path == "kernel" && !kernel {
                continue;
            }
            let mm = |h: &Array, w: &Weights| -> Res<Array> {
                Ok(match path {
                    "MLX" => quantized::quantized_matmul(h, &w.w, &w.scales, Some(&w.biases), true, spec.group_size, spec.bits)?,
                    _ => dense_kernel(h, &w.w, &w.scales, &w.biases, spec, None)?,
                })
            };
            let step = |x: &Array| -> Res<Vec<Array>> {
                let mut h = x.clone();
                let mut outs = Vec::new();
                for ws in &layers {
                    let n = fast::rms_norm(&h, None, 1e-5)?;
                    let (q, k, v) = (mm(&n, &ws[0])?, mm(&n, &ws[1])?, mm(&n, &ws[2])?);
                    outs.push(k);
                    outs.push(v);
                    h = ops::add(&h, &mm(&q, &ws[3])?)?;
                    let n = fast::rms_norm(&h, None, 1e-5)?;
                    let (g, u) = (mm(&n, &ws[4])?, mm(&n, &ws[5])?);
                    let a = ops::multiply(&ops::multiply(&g, &ops::sigmoid(&g)?)?, &u)?;
                    h = ops::add(&h, &mm(&a, &ws[6])?)?;
                }
                outs.push(h);
                Ok(outs)
            };
            let (mut build, mut single) = (Vec::new(), Vec::new());
            for i in 0..steps + 2 {
                let t = Instant::now();
                let out = step(&x)?;
                let b = t.elapsed().as_secs_f64();
                eval(&out.iter().collect::<Vec<_>>())?;
                if i >= 2 {
                    build.push(b);
                    single.push(t.elapsed().as_secs_f64());
                }
            }
            // Pipelined: step i+1 is built and queued before step i is waited for.
            let t = Instant::now();
            let mut prev = step(&x)?;
            async_eval(&prev.iter().collect::<Vec<_>>())?;
            for _ in 0..steps * 3 {
                let next = step(&prev[prev.len() - 1])?;
                async_eval(&next.iter().collect::<Vec<_>>())?;
                eval(&prev.iter().collect::<Vec<_>>())?;
                prev = next;
            }
            eval(&prev.iter().collect::<Vec<_>>())?;
            let piped = t.elapsed().as_secs_f64() / (steps * 3 + 1) as f64;
            let median = |mut v: Vec<f64>| {
                v.sort_by(|a, b| a.total_cmp(b));
                v[v.len() / 2] * 1e3
            };
            println!(
                "| {m} | {path} | {:.2} | {:.2} | {:.2} | {:.0} |",
                median(build),
                median(single),
                piped * 1e3,
                bytes as f64 / piped / 1e9
            );
        }
    }
    Ok(())
}
