//! TurboQuant attention against references: the attention a store computes in
//! the rotated basis equals plain attention over the decoded cache (its math
//! is exact), and stays close to attention over the uncompressed keys and
//! values, on random and on outlier-heavy data, for the head dimensions,
//! grouped-query ratios and lengths models use.

use mlx_rs_safe::{fast, ops, random, Array, Dtype};

use super::{Codec, TurboFormat, SINKS};
use crate::kv::{values, AttendArgs, AttentionMask, KvKind, LayerCache, StepMemo, TurboPreset};

fn normal(shape: &[i32], seed: u64) -> Array {
    random::normal(shape, Dtype::Float32, 0.0, 1.0, &random::key(seed).unwrap()).unwrap()
}

/// Keys (and values) with a few channels 20x larger than the rest, as real
/// models' keys have; without the rotation one codebook could not fit both.
fn with_outliers(x: &Array, dim: i32) -> Array {
    let scale: Vec<f32> = (0..dim).map(|j| if j % 17 == 3 { 20.0 } else { 1.0 }).collect();
    ops::multiply(x, &Array::from_slice(&scale, &[dim]).unwrap()).unwrap()
}

struct Case {
    dim: i32,
    gqa: i32,
    len: i32,
    outliers: bool,
}

/// (turbo output, exact output, reference over the decoded cache) of one
/// decode step after `len - 1` prefilled positions.
fn outputs(format: TurboFormat, c: &Case, seed: u64) -> (Array, Array, Array) {
    let kv_heads = 2;
    let (d, len) = (c.dim, c.len);
    let mut k = normal(&[1, kv_heads, len, d], seed);
    let mut v = normal(&[1, kv_heads, len, d], seed + 1);
    if c.outliers {
        k = with_outliers(&k, d);
        v = with_outliers(&v, d);
    }
    let q = normal(&[1, kv_heads * c.gqa, 1, d], seed + 2);
    let args = AttendArgs { scale: (d as f32).powf(-0.5), window: None, sinks: None, keep: false };
    let at = |a: &Array, from: i32, to: i32| ops::slice_axis(a, 2, from, to).unwrap();
    let mut cache = LayerCache::new(&KvKind::Dense).unwrap();
    let prompt_q = normal(&[1, kv_heads * c.gqa, len - 1, d], seed + 3);
    cache.attend(&prompt_q, &at(&k, 0, len - 1), &at(&v, 0, len - 1), &args, &StepMemo::default()).unwrap();
    cache.compress(|_, _| Some(KvKind::Turbo(format))).unwrap();
    let turbo = cache.attend(&q, &at(&k, len - 1, len), &at(&v, len - 1, len), &args, &StepMemo::default()).unwrap();
    let exact = fast::scaled_dot_product_attention(&q, &k, &v, args.scale, fast::SdpaMask::None, None).unwrap();
    let row = cache.row(0).unwrap();
    let held = row.columns[2].dim(2).unwrap();
    assert_eq!(held, super::recent::window().min(len - SINKS), "the window holds the newest positions");
    // Unquantized and rotated (on a GPU the newest by the encode kernel, whose
    // float32 rotation rounds apart from MLX's).
    let codec = Codec::new(format, d, row.columns[0].dtype()).unwrap();
    let rotated = |x: &Array| codec.rotation.apply(&at(x, len - held, len)).unwrap();
    assert!(relative_error(&row.columns[2], &rotated(&k)) < 1e-5, "the window holds its keys unquantized");
    assert!(relative_error(&row.columns[3], &rotated(&v)) < 1e-5, "and its values");
    (turbo, exact, stored_attention(&cache, format, &q, args.scale))
}

/// The reference for a one-row TurboQuant `cache`'s last step: the cache as
/// stored, decoded and rotated back, attended plainly by `q` — the sinks, the
/// body's codes before the recent window, the window.
fn stored_attention(cache: &LayerCache, format: TurboFormat, q: &Array, scale: f32) -> Array {
    let row = cache.row(0).unwrap();
    let [sink_k, sink_v, recent_k, recent_v, body] = &row.columns[..] else { panic!("a TurboQuant row has five columns") };
    let codec = Codec::new(format, q.dim(3).unwrap(), row.columns[0].dtype()).unwrap();
    let coded = body.dim(2).unwrap() - recent_k.dim(2).unwrap();
    let (body_k, body_v) = codec.decode(&ops::slice_axis(body, 2, 0, coded).unwrap(), Dtype::Float32).unwrap();
    let keys = ops::concatenate(&[sink_k, &body_k, recent_k], 2).unwrap();
    let vals = ops::concatenate(&[sink_v, &body_v, recent_v], 2).unwrap();
    let (keys, vals) = (codec.rotation.invert(&keys).unwrap(), codec.rotation.invert(&vals).unwrap());
    fast::scaled_dot_product_attention(q, &keys, &vals, scale, fast::SdpaMask::None, None).unwrap()
}

fn relative_error(a: &Array, b: &Array) -> f32 {
    let (a, b) = (values(a), values(b));
    let num: f32 = a.iter().zip(&b).map(|(x, y)| (x - y).powi(2)).sum();
    let den: f32 = b.iter().map(|y| y * y).sum();
    (num / den).sqrt()
}

fn cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for dim in [64, 128, 256] {
        // Lengths across the GPU kernel's 128-position tiles and its splits.
        for (gqa, len) in [(1, SINKS + 2), (2, 63), (4, 257), (8, 600), (4, 1500)] {
            for outliers in [false, true] {
                cases.push(Case { dim, gqa, len, outliers });
            }
        }
    }
    cases
}

#[test]
fn attention_in_the_rotated_basis_equals_attention_over_the_decoded_cache() {
    for preset in TurboPreset::ALL {
        for (i, c) in cases().iter().enumerate() {
            // Values take 4 bits at head dims up to 64 (the engine's policy), 3 above.
            let format = preset.format(3, 8, if c.dim <= 64 { 4 } else { 3 });
            let (turbo, _, reference) = outputs(format, c, 100 + i as u64);
            let err = relative_error(&turbo, &reference);
            assert!(err < 1e-4, "{preset:?} d={} gqa={} len={}: {err}", c.dim, c.gqa, c.len);
        }
    }
}

#[test]
fn attention_stays_close_to_uncompressed_attention() {
    // Relative L2 error of one decode step's output against fp32 attention over
    // the original keys and values. The value codebook's 3 bits dominate: a
    // unit vector keeps 3.5% of its squared norm as error, √0.0345 ≈ 0.19 of
    // its length, and the output of attention is a mix of such vectors. Keys
    // with 20x outlier channels sharpen the softmax, so key error counts more:
    // 8-bit keys barely notice, 4-bit and 3-bit+QJL keys do (the brief's
    // finding that QJL loses at equal bits). A broken rotation or norm gives
    // errors near 1 or more.
    let mut mean_outlier_error = Vec::new();
    for preset in TurboPreset::ALL {
        let format = preset.format(3, 8, 3);
        let (bound_plain, bound_outliers) = match preset {
            TurboPreset::Balanced => (0.25, 0.25),
            TurboPreset::Compact => (0.3, 0.6),
            TurboPreset::Paper => (0.3, 0.8),
        };
        let mut outlier_errors = Vec::new();
        for (i, c) in cases().iter().enumerate() {
            let (turbo, exact, _) = outputs(format, c, 200 + i as u64);
            let err = relative_error(&turbo, &exact);
            let bound = if c.outliers { bound_outliers } else { bound_plain };
            assert!(err < bound, "{preset:?} d={} gqa={} len={} outliers={}: {err}", c.dim, c.gqa, c.len, c.outliers);
            if c.outliers {
                outlier_errors.push(err);
            }
        }
        mean_outlier_error.push(outlier_errors.iter().sum::<f32>() / outlier_errors.len() as f32);
    }
    assert!(
        mean_outlier_error[0] < mean_outlier_error[1] && mean_outlier_error[1] < mean_outlier_error[2],
        "with outliers, balanced < compact < paper: {mean_outlier_error:?}"
    );
}

#[test]
fn the_gpu_kernels_pass_their_start_up_check_wherever_a_gpu_backend_runs_them() {
    // On CUDA (and Metal, where the twins have not yet run) the kernels must
    // agree with the MLX-ops path; on the CPU there are none.
    let gpu = mlx_rs_safe::kernels::gpu_backend();
    assert_eq!(super::kernels::usable(), gpu.is_some(), "backend {gpu:?}");
}

#[test]
fn every_shape_the_presets_use_passes_its_own_start_up_check_on_a_gpu() {
    // Each (format, head dim, query heads per KV head) is checked against the
    // MLX-ops path the first time a cache asks for it: on a GPU backend every
    // shape the kernels take must pass; on the CPU none runs on them.
    let gpu = mlx_rs_safe::kernels::gpu_backend().is_some();
    let mut shapes = 0;
    for d in [64, 128, 256] {
        let value_bits = if d <= 64 { 4 } else { 3 };
        for format in [TurboPreset::Balanced.format(0, 10, value_bits), TurboPreset::Compact.format(2, 10, value_bits)] {
            let codec = Codec::new(format, d, Dtype::Bfloat16).unwrap();
            for rep in [1, 4, 8].into_iter().filter(|r| r * d <= 1024) {
                assert_eq!(super::kernels::applies(&codec, rep), gpu, "{format:?}, head dim {d}, {rep} query heads per KV head");
                shapes += 1;
            }
        }
    }
    assert_eq!(shapes, 16);
}

/// The largest difference between the split-K kernel and MLX's masked
/// attention (over the dequantized codes with `quant`) for random rows of 2
/// KV heads whose first positions are `pads`, in a buffer with 64 positions
/// of room past the `written` ones.
fn split_attend_difference(d: i32, rep: i32, written: i32, pads: &[i32], dtype: Dtype, quant: Option<(i32, i32)>) -> f32 {
    let (got, want) = super::kernels::against_reference(d, 2, rep, written + 64, written, pads, dtype, quant).unwrap();
    assert_eq!(got.shape(), want.shape());
    let (got, want) = (ops::astype(&got, Dtype::Float32).unwrap(), ops::astype(&want, Dtype::Float32).unwrap());
    ops::max_all(&ops::abs(&ops::subtract(&got, &want).unwrap()).unwrap(), false).unwrap().item::<f32>().unwrap()
}

#[test]
fn the_16_bit_decode_attention_kernel_equals_masked_attention_on_cuda() {
    // Rows of other lengths (left-padded), attended by the CUDA kernel from each
    // row's own first position and by MLX's attention with the array mask:
    // head dims 64/128/256, 1/4/8 query heads per KV head, float32/bfloat16/
    // float16, a buffer with room past the positions written, lengths that
    // take one split and many (whether or not MLX_SERVE_DENSE_KERNEL=0 keeps
    // the engine off it). Elsewhere the kernel is not used.
    let cuda = mlx_rs_safe::kernels::gpu_backend() == Some("cuda");
    if !cuda {
        let q = normal(&[2, 4, 1, 64], 1);
        assert!(!super::kernels::dense_applies(&q, 2, Dtype::Float32), "used only on CUDA");
        return;
    }
    let mut checked = 0;
    let shapes = [
        (64, 1, 40, vec![0, 7, 39]),
        (128, 4, 2000, vec![0, 300, 1999, 1024]),
        (256, 8, 700, vec![5, 0]),
        (128, 8, 4100, vec![4099, 17, 0]),
        // More splits than the merge loads at once (16 at head dim 64, 8 at 256).
        (64, 4, 5000, vec![0, 2500]),
        (256, 8, 3300, vec![0, 1700]),
    ];
    for (d, rep, written, pads) in shapes {
        for (dtype, tol) in [(Dtype::Float32, 1e-2), (Dtype::Bfloat16, 3e-2), (Dtype::Float16, 1e-2)] {
            let diff = split_attend_difference(d, rep, written, &pads, dtype, None);
            assert!(diff < tol, "head dim {d}, {rep} query heads per KV head, {written} positions, {dtype:?}: differs by {diff}");
            checked += 1;
        }
    }
    assert_eq!(checked, 18);
}

#[test]
fn the_kv_bits_decode_attention_kernel_equals_attention_over_the_dequantized_cache_on_cuda() {
    // `--kv-bits` codes read by the CUDA kernel from each row's own first
    // position, against MLX's attention over the same codes dequantized, with
    // the array mask: 8- and 4-bit codes, groups of 32/64/128, head dims
    // 64/128/256, 1/4/8 query heads per KV head, float32/bfloat16 scales,
    // lengths that take one split and many. Elsewhere the kernel is not used.
    if mlx_rs_safe::kernels::gpu_backend() != Some("cuda") {
        let q = normal(&[2, 4, 1, 64], 1);
        assert!(!super::kernels::affine_applies(&q, 2, 64, 8, Dtype::Float32), "used only on CUDA");
        return;
    }
    let mut checked = 0;
    let shapes = [
        (64, 1, 40, vec![0, 7, 39], (32, 8)),
        (128, 4, 2000, vec![0, 300, 1999, 1024], (64, 8)),
        (256, 8, 700, vec![5, 0], (128, 4)),
        (128, 8, 4100, vec![4099, 17, 0], (32, 4)),
        (256, 4, 3300, vec![0, 1700], (64, 8)),
    ];
    for (d, rep, written, pads, quant) in shapes {
        for (dtype, tol) in [(Dtype::Float32, 1e-2), (Dtype::Bfloat16, 3e-2)] {
            let diff = split_attend_difference(d, rep, written, &pads, dtype, Some(quant));
            assert!(diff < tol, "head dim {d}, {rep} query heads per KV head, {written} positions, {quant:?}, {dtype:?}: differs by {diff}");
            checked += 1;
        }
    }
    assert_eq!(checked, 10);
}

#[test]
fn split_attention_launches_leave_their_counters_zero_on_cuda() {
    // The kernels count finished splits per (row, KV head) in the cache's
    // array and the last split of each group merges and zeroes its counter:
    // the same array serves launch after launch, each giving the first one's
    // result, and is all zeros after each (16-bit attention, lengths of one
    // split and of many); a TurboQuant cache's steps, each reusing its
    // counters, each equal attention over the cache as stored. Elsewhere no
    // launch counts.
    if mlx_rs_safe::kernels::gpu_backend() != Some("cuda") {
        return;
    }
    let zeros = |c: &Array| ops::max_all(&ops::astype(c, Dtype::Float32).unwrap(), false).unwrap().item::<f32>().unwrap() == 0.0;
    for (written, pads) in [(40, vec![0, 7, 39]), (4100, vec![4099, 17, 0])] {
        let (b, hkv, rep, d) = (pads.len() as i32, 2, 4, 128);
        let q = normal(&[b, hkv * rep, 1, d], 1);
        let (k, v) = (normal(&[b, hkv, written + 64, d], 2), normal(&[b, hkv, written + 64, d], 3));
        let params = super::kernels::step_params(written, (d as f32).powf(-0.5), &pads).unwrap();
        let counts = super::kernels::SplitCounts::default().for_groups(b * hkv).unwrap();
        let mut outs: Vec<Array> = Vec::new();
        for launch in 0..3 {
            let out = super::kernels::dense_attend(&q, &k, &v, &params, written, &counts).unwrap();
            mlx_rs_safe::eval(&[&out, &counts]).unwrap();
            assert!(zeros(&counts), "16-bit, {written} positions: counters left nonzero by launch {launch}");
            if let Some(first) = outs.first() {
                assert!(zeros(&ops::abs(&ops::subtract(first, &out).unwrap()).unwrap()), "16-bit, {written} positions: launch {launch} differs");
            }
            outs.push(out);
        }
    }
    let format = TurboPreset::Balanced.format(3, 8, 3);
    // 13 splits: more than the merge loads at once at head dim 128 (12).
    let (d, gqa, len) = (128, 4, 3300);
    let args = AttendArgs { scale: (d as f32).powf(-0.5), window: None, sinks: None, keep: false };
    let mut cache = LayerCache::new(&KvKind::Dense).unwrap();
    cache.attend(&normal(&[1, 2 * gqa, len, d], 40), &normal(&[1, 2, len, d], 41), &normal(&[1, 2, len, d], 42), &args, &StepMemo::default()).unwrap();
    cache.compress(|_, _| Some(KvKind::Turbo(format))).unwrap();
    for step in 0..3u64 {
        let q = normal(&[1, 2 * gqa, 1, d], 50 + step);
        let got = cache.attend(&q, &normal(&[1, 2, 1, d], 60 + step), &normal(&[1, 2, 1, d], 70 + step), &args, &StepMemo::default()).unwrap();
        let err = relative_error(&got, &stored_attention(&cache, format, &q, args.scale));
        assert!(err < 1e-2, "TurboQuant step {step}: {err} from attention over the cache as stored");
    }
}

#[test]
fn a_steps_kernel_scalars_are_the_positions_the_scale_and_each_rows_first_position() {
    // One int32 array: [positions written, the scale's float bits, each row's
    // first position], as turbo_attend.cu and its Metal twin read it.
    let params = super::kernels::step_params(300, 0.125, &[4, 17, 9]).unwrap();
    assert_eq!(params.dtype(), Dtype::Int32);
    assert_eq!(params.to_vec::<i32>().unwrap(), vec![300, 0.125f32.to_bits() as i32, 4, 17, 9]);
}

#[test]
fn a_row_attends_alike_alone_and_beside_a_shorter_row() {
    // Alone (or beside rows of its length) a row's keys are one unpadded
    // sequence and attention runs in causal mode; beside a shorter row the
    // batch is left-padded and a mask array says what each row sees. Both
    // must give the same output, for a decode step and for a prefill chunk
    // attending to the compressed history.
    let (kv_heads, gqa, d) = (2, 2, 64);
    let format = TurboPreset::Balanced.format(3, 8, 4);
    let args = AttendArgs { scale: (d as f32).powf(-0.5), window: None, sinks: None, keep: false };
    let compressed = |len: i32, seed: u64| {
        let mut cache = LayerCache::new(&KvKind::Dense).unwrap();
        let kv = |s| normal(&[1, kv_heads, len, d], s);
        cache.attend(&normal(&[1, kv_heads * gqa, len, d], seed), &kv(seed + 1), &kv(seed + 2), &args, &StepMemo::default()).unwrap();
        cache.compress(|_, _| Some(KvKind::Turbo(format))).unwrap();
        cache.row(0).unwrap()
    };
    let (long, short) = (compressed(40, 10), compressed(21, 20));
    for n in [1, 6] {
        let q = |seed| normal(&[1, kv_heads * gqa, n, d], seed);
        let kv = |seed| normal(&[1, kv_heads, n, d], seed);
        let (qa, ka, va) = (q(30), kv(31), kv(32));
        let (qb, kb, vb) = (q(40), kv(41), kv(42));
        let mut alone = KvKind::Turbo(format).store(std::slice::from_ref(&long)).unwrap();
        let one = alone.attend(&qa, &ka, &va, &args, &StepMemo::default()).unwrap();
        let mut batch = KvKind::Turbo(format).store(&[long.clone(), short.clone()]).unwrap();
        let cat = |a: &Array, b: &Array| ops::concatenate(&[a, b], 0).unwrap();
        let both = batch.attend(&cat(&qa, &qb), &cat(&ka, &kb), &cat(&va, &vb), &args, &StepMemo::default()).unwrap();
        let first = ops::slice_axis(&both, 0, 0, 1).unwrap();
        let err = relative_error(&first, &one);
        assert!(err < 1e-5, "{n} new tokens: {err}");
    }
}

#[test]
fn a_chunk_attending_the_history_block_by_block_equals_one_call() {
    // The CPU's attention past one block of history: the online softmax over
    // sinks, history blocks (across and within block boundaries) and the
    // chunk's own causal keys gives what one attention call over them all does,
    // the history's newest positions read unquantized (the recent window).
    // On the CPU, where the blocks run (a GPU's float32 matmuls may be TF32).
    let cpu = mlx_rs_safe::Stream::default_for(mlx_rs_safe::Device::Cpu).unwrap();
    mlx_rs_safe::with_stream(&cpu, blocks_equal_one_call);
}

fn blocks_equal_one_call() {
    for (dim, gqa, history, n, block) in [(64, 1, 100, 8, 16), (128, 4, 333, 5, 64), (64, 2, 40, 12, 40), (256, 8, 70, 3, 256)] {
        let kv_heads = 2;
        let format = TurboPreset::Balanced.format(2, 8, 3);
        let codec = Codec::new(format, dim, Dtype::Float32).unwrap();
        let rotated = |seed| codec.rotation.apply(&with_outliers(&normal(&[1, kv_heads, SINKS + history + n, dim], seed), dim)).unwrap();
        let (k, v) = (rotated(1), rotated(2));
        let part = |x: &Array, from: i32, to: i32| ops::slice_axis(x, 2, from, to).unwrap();
        let (sinks, chunk) = ([part(&k, 0, SINKS), part(&v, 0, SINKS)], [part(&k, SINKS + history, SINKS + history + n), part(&v, SINKS + history, SINKS + history + n)]);
        let cut = SINKS + history - history / 4;
        let rows = codec.encode(&part(&k, SINKS, cut), &part(&v, SINKS, cut)).unwrap();
        let exact = [part(&k, cut, SINKS + history), part(&v, cut, SINKS + history)];
        let q = normal(&[1, kv_heads * gqa, n, dim], 3);
        let scale = (dim as f32).powf(-0.5);
        let blocks = super::blocked::attend(&codec, &q, [&sinks[0], &sinks[1]], &rows, [&exact[0], &exact[1]], Some([&chunk[0], &chunk[1]]), &AttentionMask::Causal, scale, block).unwrap();
        let (hk, hv) = codec.decode(&rows, Dtype::Float32).unwrap();
        let keys = ops::concatenate(&[&sinks[0], &hk, &exact[0], &chunk[0]], 2).unwrap();
        let vals = ops::concatenate(&[&sinks[1], &hv, &exact[1], &chunk[1]], 2).unwrap();
        let one_call = fast::scaled_dot_product_attention(&q, &keys, &vals, scale, fast::SdpaMask::Causal, None).unwrap();
        let err = relative_error(&blocks, &one_call);
        assert!(err < 1e-5, "d={dim} gqa={gqa} history={history} chunk={n} block={block}: {err}");
    }
}

#[test]
fn history_blocks_bound_their_scores_and_stay_a_few_hundred_positions_at_least() {
    use super::blocked::Shape;
    let shape = |rows, query_heads, kv_heads, head_dim, queries| Shape { rows, query_heads, kv_heads, head_dim, queries };
    // 8 MiB of float32 scores and decoded keys and values: 4 query heads x
    // 512 queries and 2 KV heads of 64 take 9216 bytes a position.
    assert_eq!(shape(1, 4, 2, 64, 512).block(), (8 << 20) / 9216);
    assert_eq!(shape(1, 4, 2, 64, 512).block_bytes(), 9216 * ((8 << 20) / 9216));
    // A decode step's rows each take their own scores and history.
    assert_eq!(shape(1, 32, 8, 128, 1).block(), (8 << 20) / (4 * (32 + 2048)));
    assert_eq!(shape(2, 32, 8, 128, 1).block(), (8 << 20) / (2 * 4 * (32 + 2048)));
    // Never fewer than 256 positions: then a block holds more.
    assert_eq!(shape(1, 128, 8, 128, 2048).block(), 256);
    assert_eq!(shape(1, 128, 8, 128, 2048).block_bytes(), 256 * 4 * (128 * 2048 + 2048));
}

#[test]
fn a_row_lacking_its_window_or_body_is_an_error_not_a_panic() {
    let format = TurboFormat { key: super::KeyCode::Affine8, value_bits: 3 };
    let a = ops::zeros(&[1, 1, SINKS, 64], Dtype::Float32).unwrap();
    for n in 0..5 {
        let row = crate::kv::KvRow { kind: KvKind::Turbo(format), offset: SINKS, columns: vec![a.clone(); n] };
        assert!(super::TurboStore::from_rows(&[row.clone()], format).is_err(), "{n} columns");
        assert!(super::prefix(&row, SINKS).is_err(), "{n} columns");
    }
}
