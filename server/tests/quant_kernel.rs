//! The decode kernel for affine-quantized matmul (`metal-kernels/quant_matmul.cu`)
//! against MLX's quantized_matmul and gather_qmm: every bit width, group size
//! and dtype it takes, 1 to 32 rows, feature counts that are and are not
//! multiples of its tiles, dense and gathered (both broadcast forms and the
//! sorted one), and its gated (gate, up and swiglu), residual and normed
//! forms. On a machine without CUDA the kernel must decline every call,
//! so the callers run MLX's op; that part runs everywhere.

use mlx_rs_safe::kernels::gpu_backend;
use mlx_rs_safe::quantized::{self, QuantMode, QuantSpec};
use mlx_rs_safe::{ops, random, Array, Dtype};
use mlx_serve::models::quant_kernel::{self, disagreement, Tiles, MAX_ROWS, MIN_ROWS};

fn normal(shape: &[i32], seed: u64, dtype: Dtype) -> Array {
    let a = random::normal(shape, Dtype::Float32, 0.0, 1.0, &random::key(seed).unwrap()).unwrap();
    ops::astype(&a, dtype).unwrap()
}

/// Quantized weights [lead..., n, k] of random normal values.
fn weights(lead: &[i32], n: i32, k: i32, spec: QuantSpec, dtype: Dtype, seed: u64) -> (Array, Array, Array) {
    let w = normal(&[lead, &[n, k]].concat(), seed, dtype);
    quantized::quantize(&w, spec.group_size, spec.bits).unwrap()
}

/// Whether this machine runs the kernel; on CUDA it must (unless turned off).
fn on_cuda() -> bool {
    if gpu_backend() != Some("cuda") {
        eprintln!("skipped: the quantized-matmul kernel runs on CUDA only");
        return false;
    }
    if std::env::var("MLX_SERVE_QMM_KERNEL").is_ok_and(|v| v == "0") {
        eprintln!("skipped: MLX_SERVE_QMM_KERNEL=0");
        return false;
    }
    assert!(
        quant_kernel::in_use(),
        "the kernel is not in use on CUDA: {:?}",
        quant_kernel::self_check()
    );
    true
}

/// This process's share of a test's cases. On CUDA each kernel instance
/// compiles with NVRTC at its first use, seconds each, one after another
/// while the GPU idles, so one test's loop took minutes on the GPU machine;
/// with `MLX_SERVE_TEST_SHARD=K/N` a process takes cases K, K+N, K+2N, ...
/// so that N processes share a test (bench/quant_kernel_gpu.sh runs them at
/// once). Unset, a process takes every case.
struct Shard {
    k: usize,
    n: usize,
    next: usize,
}

impl Shard {
    fn from_env() -> Shard {
        let Ok(v) = std::env::var("MLX_SERVE_TEST_SHARD") else {
            return Shard { k: 0, n: 1, next: 0 };
        };
        let parsed = v.split_once('/').and_then(|(k, n)| Some((k.parse().ok()?, n.parse().ok()?)));
        match parsed {
            Some((k, n)) if k < n => Shard { k, n, next: 0 },
            _ => panic!("MLX_SERVE_TEST_SHARD={v}: expected K/N with 0 <= K < N"),
        }
    }

    /// Whether the next case is this process's.
    fn mine(&mut self) -> bool {
        self.next += 1;
        (self.next - 1) % self.n == self.k
    }
}

#[test]
fn shards_take_every_case_once() {
    for n in 1..5 {
        let mut taken = vec![0; 11];
        for k in 0..n {
            let mut shard = Shard { k, n, next: 0 };
            for t in taken.iter_mut() {
                *t += shard.mine() as i32;
            }
        }
        assert_eq!(taken, vec![1; 11], "{n} shards");
    }
}

fn check(what: &str, got: &Array, want: &Array) {
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    if let Some(why) = disagreement(got, want).unwrap() {
        panic!("{what}: {why}");
    }
    eprintln!("{what}: agrees");
}

#[test]
fn dense_matches_mlx() {
    if !on_cuda() {
        return;
    }
    let (mut cases, mut shard) = (0, Shard::from_env());
    for dtype in [Dtype::Bfloat16, Dtype::Float16] {
        for bits in [4, 8] {
            for gs in [32, 64, 128] {
                if !shard.mine() {
                    continue;
                }
                let spec = QuantSpec::affine(gs, bits);
                let big = dtype == Dtype::Bfloat16 && gs == 64;
                let shapes: &[(i32, i32, &[i32])] = if big {
                    &[(1000, 768, &[1, 17]), (4096, 4096, &[1, 32]), (48, 1024, &[2])]
                } else {
                    &[(1000, 768, &[1, 17])]
                };
                for &(n, k, rows) in shapes {
                    let (w, s, b) = weights(&[], n, k, spec, dtype, (bits * gs) as u64);
                    for &m in rows {
                        let x = normal(&[m, 1, k], m as u64, dtype);
                        let want = quantized::quantized_matmul(&x, &w, &s, Some(&b), true, gs, bits).unwrap();
                        let tiles = Tiles::choose(m, n, k, bits, 1);
                        let got = quant_kernel::matmul_tiled(&x, &w, &s, Some(&b), spec, tiles).unwrap();
                        check(&format!("{dtype:?} {bits}-bit group {gs}, {m}x{k} @ {n}x{k}"), &got, &want);
                        cases += 1;
                    }
                }
            }
        }
    }
    eprintln!("{cases} products agree");
}

/// After a kernel instance's first call, its calls go straight to its own
/// compiled module (mlx-rs-safe's `kernel_direct`: MLX's precompiled-kernel
/// path, the source text no longer rebuilt at each call), counted in the
/// kernel cache's stats. Calls of one instance with new inputs, and inputs
/// of other dimension counts (each its own direct kernel: their shapes are
/// its arguments), agree with MLX.
#[test]
fn later_calls_go_direct_and_agree() {
    if !on_cuda() {
        return;
    }
    if !mlx_rs_safe::kernels::kernel_cache_enabled() {
        eprintln!("skipped: MLX_SERVE_KERNEL_CACHE=0 (no direct calls without the kernel cache)");
        return;
    }
    let (gs, bits) = (64, 4);
    let spec = QuantSpec::affine(gs, bits);
    let (n, k) = (1000, 768);
    let (w, s, b) = weights(&[], n, k, spec, Dtype::Bfloat16, 11);
    let tiles = Tiles::choose(3, n, k, bits, 1);
    for (seed, shape) in [(1, vec![3, 1, k]), (2, vec![3, 1, k]), (3, vec![3, k]), (4, vec![1, 3, 1, k]), (5, vec![3, k])] {
        let x = normal(&shape, seed, Dtype::Bfloat16);
        let want = quantized::quantized_matmul(&x, &w, &s, Some(&b), true, gs, bits).unwrap();
        let got = quant_kernel::matmul_tiled(&x, &w, &s, Some(&b), spec, tiles).unwrap();
        check(&format!("x {shape:?}, seed {seed}"), &got, &want);
    }
    let stats = mlx_rs_safe::kernels::kernel_cache_stats();
    assert!(stats.direct > 0, "no instance called directly: {stats:?}");
}

/// The dense products the kernel takes by itself: those of 1 to 32 rows.
#[test]
fn decode_batches_take_the_kernel() {
    if !on_cuda() {
        return;
    }
    let spec = QuantSpec::affine(64, 4);
    let (w, s, b) = weights(&[], 1024, 512, spec, Dtype::Bfloat16, 2);
    assert_eq!(MIN_ROWS, 1, "one sequence's decode step takes the kernel");
    for (rows, takes) in [
        (1, true),
        (8, true),
        (MAX_ROWS, true),
        (MAX_ROWS + 1, false),
    ] {
        let x = normal(&[rows, 1, 512], 1, Dtype::Bfloat16);
        let got = quant_kernel::matmul(&x, &w, &s, Some(&b), spec).unwrap();
        assert_eq!(got.is_some(), takes, "{rows} rows");
        if let Some(got) = got {
            check(
                &format!("{rows} rows"),
                &got,
                &quantized::quantized_matmul(&x, &w, &s, Some(&b), true, 64, 4).unwrap(),
            );
        }
    }
}

#[test]
fn every_tiling_matches_mlx() {
    if !on_cuda() {
        return;
    }
    let spec = QuantSpec::affine(64, 4);
    let (n, k) = (520, 2048);
    let (w, s, b) = weights(&[], n, k, spec, Dtype::Bfloat16, 7);
    let mut shard = Shard::from_env();
    for (rows, mt) in [(5, 1), (13, 2), (30, 4)] {
        let x = normal(&[rows, k], 3, Dtype::Bfloat16);
        let want = quantized::quantized_matmul(&x, &w, &s, Some(&b), true, 64, 4).unwrap();
        for rt in [1, 2] {
            for wk in [1, 2, 4, 8, 16] {
                if !shard.mine() {
                    continue;
                }
                let what = format!("{rows} rows, rt {rt} mt {mt} wk {wk}");
                match quant_kernel::matmul_tiled(&x, &w, &s, Some(&b), spec, Tiles { rt, mt, wk }) {
                    Ok(got) => check(&what, &got, &want),
                    // Too many registers or too much shared memory for a block.
                    Err(_) => assert!(rt * mt >= 8 && wk == 16, "{what} refused"),
                }
            }
        }
    }
}

/// The tilings the model's products get (a pure choice: runs everywhere).
/// Llama-3.1-8B's one-row products aim at the target warps; its vocabulary's
/// head, whose blocks alone exceed it, still splits each block's reduction
/// four ways; a gathered call of as many blocks does not.
#[test]
fn tilings_aim_at_the_target_warps() {
    let one_row = |n, k| Tiles::choose(1, n, k, 4, 1);
    assert_eq!(one_row(4096, 4096), Tiles { rt: 1, mt: 1, wk: 16 });
    assert_eq!(one_row(4096, 14336), Tiles { rt: 1, mt: 1, wk: 16 });
    assert_eq!(Tiles::choose_for(1, 14336, 4096, 4, 1, true), Tiles { rt: 1, mt: 1, wk: 8 });
    assert_eq!(one_row(128256, 4096), Tiles { rt: 1, mt: 1, wk: 4 });
    assert_eq!(Tiles::choose(16, 128256, 4096, 4, 1), Tiles { rt: 2, mt: 2, wk: 4 });
    // A reduction of two k-blocks splits at most two ways.
    assert_eq!(one_row(128256, 256), Tiles { rt: 1, mt: 1, wk: 2 });
    // 512 pairs of 48 blocks each: already past the target with one warp a block.
    assert_eq!(Tiles::choose(1, 768, 2048, 4, 512), Tiles { rt: 1, mt: 1, wk: 1 });
}

#[test]
fn gathered_matches_mlx() {
    if !on_cuda() {
        return;
    }
    let (experts, n, k, top) = (16, 768, 2048, 4);
    let mut shard = Shard::from_env();
    for dtype in [Dtype::Bfloat16, Dtype::Float16] {
        for bits in [4, 8] {
            if !shard.mine() {
                continue;
            }
            let spec = QuantSpec::affine(64, bits);
            let (w, s, b) = weights(&[experts], n, k, spec, dtype, bits as u64);
            let (wd, sd, bd) = weights(&[experts], k, n, spec, dtype, 10 + bits as u64);
            for batch in [1, 8] {
                let key = random::key(batch as u64).unwrap();
                let idx = random::randint(&Array::scalar(0i32), &Array::scalar(experts), &[batch, 1, top], Dtype::Uint32, &key).unwrap();
                // Gate/up form: each row through each of its experts.
                let x = normal(&[batch, 1, 1, 1, k], 20 + batch as u64, dtype);
                let want = quantized::gather_qmm(&x, &w, &s, Some(&b), None, Some(&idx), true, 64, bits, false).unwrap();
                let got = quant_kernel::gather(&x, &w, &s, Some(&b), &idx, spec)
                    .unwrap()
                    .expect("the kernel applies");
                check(&format!("{dtype:?} {bits}-bit, batch {batch}, broadcast rows"), &got, &want);
                // Down form: a row per (row, expert).
                let h = normal(&[batch, 1, top, 1, n], 30 + batch as u64, dtype);
                let want = quantized::gather_qmm(&h, &wd, &sd, Some(&bd), None, Some(&idx), true, 64, bits, false).unwrap();
                let got = quant_kernel::gather(&h, &wd, &sd, Some(&bd), &idx, spec)
                    .unwrap()
                    .expect("the kernel applies");
                check(&format!("{dtype:?} {bits}-bit, batch {batch}, a row per pair"), &got, &want);
                // Sorted form: rows reordered by expert, flat indices.
                let flat = ops::flatten(&idx, 0, -1).unwrap();
                let order = ops::argsort(&flat, 0).unwrap();
                let sorted = ops::take(&flat, &order, 0).unwrap();
                let xs = ops::take(&ops::reshape(&h, &[-1, 1, n]).unwrap(), &order, 0).unwrap();
                let want = quantized::gather_qmm(&xs, &wd, &sd, Some(&bd), None, Some(&sorted), true, 64, bits, true).unwrap();
                let got = quant_kernel::gather(&xs, &wd, &sd, Some(&bd), &sorted, spec)
                    .unwrap()
                    .expect("the kernel applies");
                check(&format!("{dtype:?} {bits}-bit, batch {batch}, sorted"), &got, &want);
            }
        }
    }
}

/// What the kernel does not take goes back to the caller (None), on every
/// machine: on one without CUDA, everything.
#[test]
fn unsupported_calls_fall_back() {
    let cuda = quant_kernel::in_use();
    let spec = QuantSpec::affine(64, 4);
    let (w, s, b) = weights(&[], 64, 256, spec, Dtype::Bfloat16, 1);
    let x = normal(&[2, 256], 2, Dtype::Bfloat16);
    let applies = |x: &Array, w: &Array, s: &Array, b: Option<&Array>, spec: QuantSpec| quant_kernel::matmul(x, w, s, b, spec).unwrap().is_some();
    assert_eq!(applies(&x, &w, &s, Some(&b), spec), cuda, "a supported call");
    // One row (a single sequence's decode step) takes it too (MIN_ROWS = 1).
    assert_eq!(applies(&normal(&[1, 256], 3, Dtype::Bfloat16), &w, &s, Some(&b), spec), cuda, "one row");
    // Too many rows (prefill), float32 activations, no biases, 3 bits, mxfp4.
    assert!(!applies(&normal(&[MAX_ROWS + 1, 256], 3, Dtype::Bfloat16), &w, &s, Some(&b), spec));
    let x32 = ops::astype(&x, Dtype::Float32).unwrap();
    let (w32, s32, b32) = weights(&[], 64, 256, spec, Dtype::Float32, 1);
    assert!(!applies(&x32, &w32, &s32, Some(&b32), spec));
    assert!(!applies(&x, &w, &s, None, spec));
    let (w3, s3, b3) = weights(&[], 64, 256, QuantSpec::affine(64, 3), Dtype::Bfloat16, 1);
    assert!(!applies(&x, &w3, &s3, Some(&b3), QuantSpec::affine(64, 3)));
    let mx = QuantSpec::default_for(QuantMode::Mxfp4);
    let (wm, sm, _) = quantized::quantize_with(&normal(&[64, 256], 4, Dtype::Bfloat16), mx).unwrap();
    assert!(!applies(&x, &wm, &sm, None, mx));
    // Gathered: indices that do not match x's leading axes.
    let (ws, ss, bs) = weights(&[4], 64, 256, spec, Dtype::Bfloat16, 5);
    let idx = Array::from_slice(&[0u32, 1, 2, 3, 0, 1], &[2, 3]).unwrap();
    let gathered = |x: &Array| quant_kernel::gather(x, &ws, &ss, Some(&bs), &idx, spec).unwrap().is_some();
    assert_eq!(gathered(&normal(&[2, 1, 1, 256], 6, Dtype::Bfloat16)), cuda, "broadcast rows");
    assert!(!gathered(&normal(&[3, 1, 1, 256], 6, Dtype::Bfloat16)), "3 rows for 2 index rows");
    assert!(!gathered(&normal(&[2, 3, 2, 256], 6, Dtype::Bfloat16)), "x rows of 2");
}

/// mlx-lm's swiglu(gate, up) = silu(gate) * up, op for op (each op rounds to
/// the inputs' dtype, as MLX's compiled swiglu does).
fn swiglu(gate: &Array, up: &Array) -> Array {
    let silu = ops::multiply(gate, &ops::sigmoid(gate).unwrap()).unwrap();
    ops::multiply(&silu, up).unwrap()
}

/// `got` equals `want` bit for bit.
fn check_exact(what: &str, got: &Array, want: &Array) {
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    let diff = ops::abs(&ops::subtract(&ops::astype(got, Dtype::Float32).unwrap(), &ops::astype(want, Dtype::Float32).unwrap()).unwrap()).unwrap();
    let worst = ops::max_all(&diff, false).unwrap().item::<f32>().unwrap();
    assert_eq!(worst, 0.0, "{what}: differs from the separate products by up to {worst}");
}

fn packed<'a>(w: &'a (Array, Array, Array)) -> quant_kernel::Packed<'a> {
    quant_kernel::Packed { w: &w.0, scales: &w.1, biases: Some(&w.2) }
}

/// The gated form (gate, up and swiglu in one launch) equals the kernel's
/// two products with the same split followed by swiglu exactly, and MLX's
/// quantized_matmul and swiglu within 16-bit rounding: every dtype, bit
/// width and group size at 1, 17 and 32 rows, every split for one of them.
#[test]
fn gated_dense_matches_separate_products() {
    if !on_cuda() {
        return;
    }
    let (mut cases, mut shard) = (0, Shard::from_env());
    for dtype in [Dtype::Bfloat16, Dtype::Float16] {
        for bits in [4, 8] {
            for gs in [32, 64, 128] {
                if !shard.mine() {
                    continue;
                }
                let spec = QuantSpec::affine(gs, bits);
                let (n, k) = (1000, 768);
                let gate = weights(&[], n, k, spec, dtype, 40 + bits as u64);
                let up = weights(&[], n, k, spec, dtype, 50 + bits as u64);
                // Each kernel instance compiles with NVRTC on first use (seconds
                // each): every split only for one dtype, bit width and group size.
                let splits: &[i32] = if dtype == Dtype::Bfloat16 && bits == 4 && gs == 64 { &[1, 2, 4, 8] } else { &[] };
                for m in [1, 17, 32] {
                    let x = normal(&[m, 1, k], 60 + m as u64, dtype);
                    let what = format!("{dtype:?} {bits}-bit group {gs}, {m} rows");
                    let mlx = |w: &(Array, Array, Array)| quantized::quantized_matmul(&x, &w.0, &w.1, Some(&w.2), true, gs, bits).unwrap();
                    let got = quant_kernel::swiglu_matmul(&x, None, packed(&gate), packed(&up), spec).unwrap().expect("the gated kernel applies");
                    check(&format!("{what} against MLX"), &got, &swiglu(&mlx(&gate), &mlx(&up)));
                    let chosen = Tiles::choose_for(m, n, k, bits, 1, true);
                    for &wk in [chosen.wk].iter().chain(splits) {
                        let tiles = Tiles { wk, ..chosen };
                        let got = quant_kernel::swiglu_matmul_tiled(&x, None, packed(&gate), packed(&up), spec, tiles).unwrap();
                        let one = |w: &(Array, Array, Array)| quant_kernel::matmul_tiled(&x, &w.0, &w.1, Some(&w.2), spec, tiles).unwrap();
                        check_exact(&format!("{what}, wk {wk}"), &got, &swiglu(&one(&gate), &one(&up)));
                        cases += 1;
                    }
                }
            }
        }
    }
    eprintln!("{cases} gated products equal the separate ones");
}

/// The gathered gated form against the kernel's two gathered products and
/// swiglu (exactly) and MLX's gather_qmm and swiglu (within rounding): rows
/// broadcast to their experts, and the sorted form.
#[test]
fn gated_gather_matches_separate_products() {
    if !on_cuda() {
        return;
    }
    let (experts, n, k, top) = (16, 768, 2048, 8);
    let mut shard = Shard::from_env();
    for dtype in [Dtype::Bfloat16, Dtype::Float16] {
        for bits in [4, 8] {
            if !shard.mine() {
                continue;
            }
            let spec = QuantSpec::affine(64, bits);
            let gate = weights(&[experts], n, k, spec, dtype, 70 + bits as u64);
            let up = weights(&[experts], n, k, spec, dtype, 80 + bits as u64);
            for batch in [1, 8] {
                let key = random::key(90 + batch as u64).unwrap();
                let idx = random::randint(&Array::scalar(0i32), &Array::scalar(experts), &[batch, 1, top], Dtype::Uint32, &key).unwrap();
                let x = normal(&[batch, 1, 1, 1, k], 100 + batch as u64, dtype);
                let what = format!("{dtype:?} {bits}-bit, batch {batch}");
                let mlx = |x: &Array, idx: &Array, w: &(Array, Array, Array), sorted: bool| {
                    quantized::gather_qmm(x, &w.0, &w.1, Some(&w.2), None, Some(idx), true, 64, bits, sorted).unwrap()
                };
                let got = quant_kernel::swiglu_gather(&x, packed(&gate), packed(&up), &idx, spec).unwrap().expect("the gated kernel applies");
                check(&format!("{what}, broadcast rows, against MLX"), &got, &swiglu(&mlx(&x, &idx, &gate, false), &mlx(&x, &idx, &up, false)));
                let tiles = Tiles::choose_for(1, n, k, bits, batch * top, true);
                let one = |x: &Array, idx: &Array, w: &(Array, Array, Array), per_row: i32| {
                    quant_kernel::gather_tiled(x, &w.0, &w.1, Some(&w.2), idx, per_row, spec, tiles).unwrap()
                };
                let exact = quant_kernel::swiglu_gather_tiled(&x, packed(&gate), packed(&up), &idx, top, spec, tiles).unwrap();
                check_exact(&format!("{what}, broadcast rows"), &exact, &swiglu(&one(&x, &idx, &gate, top), &one(&x, &idx, &up, top)));
                // Sorted: a row per (row, expert), ordered by expert.
                let flat = ops::flatten(&idx, 0, -1).unwrap();
                let order = ops::argsort(&flat, 0).unwrap();
                let sorted = ops::take(&flat, &order, 0).unwrap();
                let rows = ops::floor_divide(&order, &ops::astype(&Array::scalar(top), order.dtype()).unwrap()).unwrap();
                let xs = ops::take(&ops::reshape(&x, &[-1, 1, k]).unwrap(), &rows, 0).unwrap();
                let got = quant_kernel::swiglu_gather(&xs, packed(&gate), packed(&up), &sorted, spec).unwrap().expect("the gated kernel applies");
                check(&format!("{what}, sorted, against MLX"), &got, &swiglu(&mlx(&xs, &sorted, &gate, true), &mlx(&xs, &sorted, &up, true)));
                check_exact(&format!("{what}, sorted"), &got, &swiglu(&one(&xs, &sorted, &gate, 1), &one(&xs, &sorted, &up, 1)));
            }
        }
    }
}

/// What the gated form does not take goes back to the caller (None), on
/// every machine: on one without CUDA, everything.
#[test]
fn unsupported_gated_calls_fall_back() {
    let cuda = quant_kernel::in_use() && std::env::var("MLX_SERVE_QMM_FUSED").map_or(true, |v| v != "0");
    let spec = QuantSpec::affine(64, 4);
    let gate = weights(&[], 64, 256, spec, Dtype::Bfloat16, 1);
    let up = weights(&[], 64, 256, spec, Dtype::Bfloat16, 2);
    let x = normal(&[4, 256], 3, Dtype::Bfloat16);
    let applies = |x: &Array, up: &(Array, Array, Array)| quant_kernel::swiglu_matmul(x, None, packed(&gate), packed(up), spec).unwrap().is_some();
    assert_eq!(applies(&x, &up), cuda, "a supported call");
    assert!(!applies(&normal(&[MAX_ROWS + 1, 256], 3, Dtype::Bfloat16), &up), "too many rows");
    assert!(!applies(&x, &weights(&[], 32, 256, spec, Dtype::Bfloat16, 2)), "up of another shape");
    let x32 = ops::astype(&x, Dtype::Float32).unwrap();
    assert!(!applies(&x32, &up), "float32 activations");
    let ge = weights(&[4], 64, 256, spec, Dtype::Bfloat16, 5);
    let ue = weights(&[4], 64, 256, spec, Dtype::Bfloat16, 6);
    let idx = Array::from_slice(&[0u32, 1, 2, 3, 0, 1], &[2, 3]).unwrap();
    let gathered = |x: &Array| quant_kernel::swiglu_gather(x, packed(&ge), packed(&ue), &idx, spec).unwrap().is_some();
    assert_eq!(gathered(&normal(&[2, 1, 1, 256], 6, Dtype::Bfloat16)), cuda, "broadcast rows");
    assert!(!gathered(&normal(&[3, 1, 1, 256], 6, Dtype::Bfloat16)), "3 rows for 2 index rows");
}

/// The residual form (residual + x @ Wᵀ in one launch) equals the kernel's
/// product with the same tiling followed by MLX's add exactly, and MLX's
/// quantized_matmul and add within 16-bit rounding.
#[test]
fn residual_form_matches_product_then_add() {
    if !on_cuda() {
        return;
    }
    let (mut cases, mut shard) = (0, Shard::from_env());
    for dtype in [Dtype::Bfloat16, Dtype::Float16] {
        for bits in [4, 8] {
            for gs in [32, 64, 128] {
                if !shard.mine() {
                    continue;
                }
                let spec = QuantSpec::affine(gs, bits);
                let (n, k) = (1000, 768);
                let w = weights(&[], n, k, spec, dtype, 110 + bits as u64);
                for m in [1, 17] {
                    let x = normal(&[m, 1, k], 120 + m as u64, dtype);
                    let residual = normal(&[m, 1, n], 130 + m as u64, dtype);
                    let what = format!("{dtype:?} {bits}-bit group {gs}, {m} rows");
                    let got = quant_kernel::matmul_add(&x, packed(&w), &residual, spec).unwrap().expect("the residual form applies");
                    let mlx = quantized::quantized_matmul(&x, &w.0, &w.1, Some(&w.2), true, gs, bits).unwrap();
                    check(&format!("{what} against MLX"), &got, &ops::add(&residual, &mlx).unwrap());
                    let tiles = Tiles::choose(m, n, k, bits, 1);
                    let product = quant_kernel::matmul_tiled(&x, &w.0, &w.1, Some(&w.2), spec, tiles).unwrap();
                    check_exact(&what, &got, &ops::add(&residual, &product).unwrap());
                    cases += 1;
                }
            }
        }
    }
    eprintln!("{cases} products with a residual equal product then add");
}

/// What the residual form does not take goes back to the caller (None).
#[test]
fn unsupported_residual_calls_fall_back() {
    let cuda = quant_kernel::in_use() && std::env::var("MLX_SERVE_QMM_FUSED").map_or(true, |v| v != "0");
    let spec = QuantSpec::affine(64, 4);
    let w = weights(&[], 64, 256, spec, Dtype::Bfloat16, 1);
    let x = normal(&[4, 1, 256], 3, Dtype::Bfloat16);
    let applies = |x: &Array, r: &Array| quant_kernel::matmul_add(x, packed(&w), r, spec).unwrap().is_some();
    assert_eq!(applies(&x, &normal(&[4, 1, 64], 4, Dtype::Bfloat16)), cuda, "a supported call");
    assert!(!applies(&x, &normal(&[4, 1, 32], 4, Dtype::Bfloat16)), "a residual of another shape");
    assert!(!applies(&x, &normal(&[1, 64], 4, Dtype::Bfloat16)), "a broadcast residual");
    assert!(!applies(&x, &normal(&[4, 1, 64], 4, Dtype::Float16)), "a residual of another dtype");
    assert!(!applies(&normal(&[MAX_ROWS + 1, 256], 3, Dtype::Bfloat16), &normal(&[MAX_ROWS + 1, 64], 4, Dtype::Bfloat16)), "too many rows");
}

/// x with values whose squares sum exactly in float in any order (halves
/// from -2 to 1.5): the kernel's row sums equal MLX's rms_norm's, so its
/// normed form must equal rms_norm then the product bit for bit.
fn exact_sum_rows(shape: &[i32], seed: u64, dtype: Dtype) -> Array {
    let key = random::key(seed).unwrap();
    let ints = random::randint(&Array::scalar(-4i32), &Array::scalar(4i32), shape, Dtype::Int32, &key).unwrap();
    ops::astype(&ops::divide(&ops::astype(&ints, Dtype::Float32).unwrap(), &Array::scalar(2.0f32)).unwrap(), dtype).unwrap()
}

/// The normed forms (rms_norm(x) taken by the product itself, plain and
/// gated) against MLX's rms_norm followed by MLX's products within 16-bit
/// rounding, and, on rows whose squares sum exactly, against MLX's rms_norm
/// followed by the kernel's own products with the same split bit for bit.
#[test]
fn normed_forms_match_rms_norm_then_product() {
    if !on_cuda() {
        return;
    }
    let (n, k, eps) = (1000, 768, 1e-5f32);
    let mut shard = Shard::from_env();
    for dtype in [Dtype::Bfloat16, Dtype::Float16] {
        for bits in [4, 8] {
            if !shard.mine() {
                continue;
            }
            let spec = QuantSpec::affine(64, bits);
            let w = weights(&[], n, k, spec, dtype, 140 + bits as u64);
            let up = weights(&[], n, k, spec, dtype, 150 + bits as u64);
            let nw = normal(&[k], 160, dtype);
            let norm = quant_kernel::Norm { weight: &nw, eps };
            for m in [1, 17] {
                let what = format!("{dtype:?} {bits}-bit, {m} rows");
                let rms = |x: &Array| mlx_rs_safe::fast::rms_norm(x, Some(&nw), eps).unwrap();
                let mlx = |x: &Array, w: &(Array, Array, Array)| quantized::quantized_matmul(x, &w.0, &w.1, Some(&w.2), true, 64, bits).unwrap();
                let x = normal(&[m, 1, k], 170 + m as u64, dtype);
                let got = quant_kernel::matmul_normed(&x, norm, packed(&w), spec).unwrap().expect("the normed form applies");
                check(&format!("{what}, normed, against MLX"), &got, &mlx(&rms(&x), &w));
                let got = quant_kernel::swiglu_matmul(&x, Some(norm), packed(&w), packed(&up), spec).unwrap().expect("the gated form applies");
                check(&format!("{what}, normed and gated, against MLX"), &got, &swiglu(&mlx(&rms(&x), &w), &mlx(&rms(&x), &up)));
                let x = exact_sum_rows(&[m, 1, k], 180 + m as u64, dtype);
                let tiles = Tiles::choose(m, n, k, bits, 1);
                let got = quant_kernel::matmul_normed_tiled(&x, norm, packed(&w), spec, tiles).unwrap();
                check_exact(&format!("{what}, normed"), &got, &quant_kernel::matmul_tiled(&rms(&x), &w.0, &w.1, Some(&w.2), spec, tiles).unwrap());
                let tiles = Tiles::choose_for(m, n, k, bits, 1, true);
                let got = quant_kernel::swiglu_matmul_tiled(&x, Some(norm), packed(&w), packed(&up), spec, tiles).unwrap();
                let want = quant_kernel::swiglu_matmul_tiled(&rms(&x), None, packed(&w), packed(&up), spec, tiles).unwrap();
                check_exact(&format!("{what}, normed and gated"), &got, &want);
            }
        }
    }
}

/// What the normed forms do not take goes back to the caller (None).
#[test]
fn unsupported_normed_calls_fall_back() {
    let cuda = quant_kernel::in_use() && std::env::var("MLX_SERVE_QMM_FUSED").map_or(true, |v| v != "0");
    let spec = QuantSpec::affine(64, 4);
    let w = weights(&[], 64, 256, spec, Dtype::Bfloat16, 1);
    let x = normal(&[4, 1, 256], 3, Dtype::Bfloat16);
    let applies = |nw: &Array| quant_kernel::matmul_normed(&x, quant_kernel::Norm { weight: nw, eps: 1e-5 }, packed(&w), spec).unwrap().is_some();
    assert_eq!(applies(&normal(&[256], 4, Dtype::Bfloat16)), cuda, "a supported call");
    assert!(!applies(&normal(&[128], 4, Dtype::Bfloat16)), "a norm of another width");
    assert!(!applies(&normal(&[256], 4, Dtype::Float32)), "a norm of another dtype");
    let gated = |nw: &Array| quant_kernel::swiglu_matmul(&x, Some(quant_kernel::Norm { weight: nw, eps: 1e-5 }), packed(&w), packed(&w), spec).unwrap().is_some();
    assert_eq!(gated(&normal(&[256], 4, Dtype::Bfloat16)), cuda, "a supported gated call");
    assert!(!gated(&normal(&[255], 4, Dtype::Bfloat16)), "a gated call with a norm of another width");
}
