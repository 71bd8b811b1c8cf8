//! The GPU path of TurboQuant decode steps: one kernel encodes each new
//! token's key and value into its row of the compressed cache and writes the
//! recent window with their rotated 16-bit form ([`encode_step`]); a split-K kernel
//! attends a query per row to the packed cache directly (the history is
//! never decoded; its first split also attends the unquantized sinks, its
//! last the recent window); the splits are combined and the output rotated
//! back by the last block of each (row, KV head) to finish, in the same
//! launch on CUDA ([`SplitCounts`]), by a merge kernel on Metal.
//! Sources are in `metal-kernels/` (`turbo_*.cu`; Metal twins beside them),
//! compiled by MLX at first use. On a GPU backend they are used where they
//! apply (8-bit affine or 4-bit codebook keys, 2-4-bit values, head dims
//! 64/128/256, up to 8 query heads per KV head and query heads × head dim ≤
//! 1024) once a start-up check found them agreeing with the MLX-ops path,
//! and a check of each shape (format, head dim, query heads per KV head) did
//! the first time that shape is asked for; everything else takes the MLX-ops
//! path.
//!
//! The same split-K layout and merge also serve two caches on CUDA that
//! MLX's CUDA attention has no fused decode kernel for: the 16-bit cache's
//! rows of other lengths in one batch ([`dense_attend`]; no fused kernel
//! takes an array mask at one query position), and the affine-quantized
//! cache of `--kv-bits` ([`affine_attend`]; its quantized matmuls refuse
//! attention's shapes), read as codes.

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::OnceLock;

use mlx_rs_safe::kernels::{gpu_backend, CustomKernel, KernelCall, KernelLanguage, KernelSource, TemplateArg};
use mlx_rs_safe::{ops, Array, Dtype};

use super::codec::{affine_group, Codec, KeyCode, SINKS};
use crate::error::{Error, Result};

/// (header, encode, attend) sources for CUDA, whose attention kernels merge
/// their own splits, and (header, encode, attend, merge) for Metal.
const CUDA: &[&str] = &[
    include_str!("../../../../metal-kernels/turbo_common.cuh"),
    include_str!("../../../../metal-kernels/turbo_encode.cu"),
    include_str!("../../../../metal-kernels/turbo_attend.cu"),
];
/// The 16-bit cache's split-K attention (CUDA only: MLX's Metal attention
/// takes an array mask in its fused kernel).
const DENSE_CUDA: &str = include_str!("../../../../metal-kernels/dense_attend.cu");
const METAL: &[&str] = &[
    include_str!("../../../../metal-kernels/turbo_common.metal"),
    include_str!("../../../../metal-kernels/turbo_encode.metal"),
    include_str!("../../../../metal-kernels/turbo_attend.metal"),
    include_str!("../../../../metal-kernels/turbo_merge.metal"),
];

/// The GPU language of this build's backend, if it runs custom kernels.
fn language() -> Option<KernelLanguage> {
    match gpu_backend() {
        Some("cuda") => Some(KernelLanguage::Cuda),
        Some("metal") => Some(KernelLanguage::Metal),
        _ => None,
    }
}

/// Threads of a Metal merge block (one per row and query head): 4 simdgroups.
const MERGE_THREADS: i32 = 128;

/// Threads of an attention block for `rep` query heads per KV head: 128 in
/// the CUDA kernel (turbo_attend.cu's THREADS); a set of 4 warps per 2 heads
/// in the Metal one (turbo_attend.metal's WPS, MAXH and NG).
fn attend_threads(lang: KernelLanguage, rep: i32) -> i32 {
    match lang {
        KernelLanguage::Cuda => 128,
        KernelLanguage::Metal => 128 * ((rep + 1) / 2),
    }
}

/// Whether `codec`'s vectors are encoded by the GPU kernel here.
pub fn encode_applies(codec: &Codec) -> bool {
    let f = codec.format;
    let key_ok = matches!(f.key, KeyCode::Affine8 | KeyCode::Codebook(4));
    key_ok && (2..=4).contains(&f.value_bits) && [64, 128, 256].contains(&codec.dim()) && usable()
}

/// Whether the kernels run here and agree with the MLX-ops path: checked
/// once, on small random data, the first time a TurboQuant cache asks. A
/// kernel that does not compile or disagrees is reported once and left
/// unused (the Metal twins have not run on an Apple GPU).
///
/// Only where the ops run on the GPU: a layer placed on the CPU
/// (`--gpu-layers`) takes the MLX-ops path.
pub fn usable() -> bool {
    static USABLE: OnceLock<bool> = OnceLock::new();
    if mlx_rs_safe::kernels::current_gpu_backend().is_none() {
        return false;
    }
    *USABLE.get_or_init(|| {
        let Some(lang) = language() else { return false };
        crate::kernel_check::passes(&format!("TurboQuant: the {lang:?} kernels"), "the MLX-ops path", self_check)
    })
}

/// Encodes and attends a few random positions with the kernels and with MLX
/// ops; None when they agree, else how they differ.
fn self_check() -> Result<Option<String>> {
    shape_check(super::TurboFormat { key: KeyCode::Affine8, value_bits: 3 }, 64, 2)
}

/// [`self_check`] for one shape: keys and values of `format` at head dim
/// `d`, `rep` query heads per KV head (float32 data).
fn shape_check(format: super::TurboFormat, d: i32, rep: i32) -> Result<Option<String>> {
    use mlx_rs_safe::random;
    let (hkv, len) = (2, 24);
    let codec = Codec::new(format, d, Dtype::Float32)?;
    let normal = |shape: &[i32], seed: u64| random::normal(shape, Dtype::Float32, 0.0, 1.0, &random::key(seed)?);
    let (k, v) = (normal(&[1, hkv, len, d], 1)?, normal(&[1, hkv, len, d], 2)?);
    let q = normal(&[1, hkv * rep, 1, d], 3)?;
    let rot = &codec.rotation;
    let rotated = |x: &Array, from: i32, to: i32| rot.apply(&ops::slice_axis(x, 2, from, to)?);
    let sinks = [rotated(&k, 0, SINKS)?, rotated(&v, 0, SINKS)?];
    // The last `held` positions read from an unquantized window: slots 3..11
    // of a buffer with older positions before them and room after (as
    // `recent.rs` keeps it: keys and values rotated, in one buffer).
    let (held, cut, scale) = (8, len - 8, (d as f32).powf(-0.5));
    let room = |x: Array| -> Result<Array> { Ok(ops::concatenate(&[&normal(&[1, hkv, 2, 3, d], 4)?, &x, &ops::zeros(&[1, hkv, 2, 4, d], Dtype::Float32)?], 3)?) };
    let win = room(ops::stack(&[&rotated(&k, cut, len)?, &rotated(&v, cut, len)?], 2)?)?;
    let [body, newest] = encode(&codec, &k, &v)?;
    let params = step_params(cut, scale, &[SINKS])?;
    let window_params = step_params(3 + held, scale, &[3])?;
    let window = Window { buffer: &win, params: &window_params };
    let got = second_launch(hkv, |counts| attend(&codec, &q, &sinks, &body, &params, cut, &window, counts))?;
    // The encode kernel's 16-bit form of the last position is its rotation.
    let want_newest = ops::stack(&[&rotated(&k, len - 1, len)?, &rotated(&v, len - 1, len)?], 2)?;
    let window_diff = max_difference(&newest, &want_newest)?;
    if window_diff > 1e-3 || !window_diff.is_finite() {
        return Ok(Some(format!("the rotated newest position differs by {window_diff}")));
    }
    // A decode step's form: the last position's rows as `encode` wrote them,
    // and the window with its held slots moved to the front, the position
    // after them, zeros after that.
    let last = |x: &Array| ops::slice_axis(x, 2, len - 1, len);
    let [step_rows, moved] = encode_step(&codec, &last(&k)?, &last(&v)?, &win, &window_moves(3, held)?)?;
    let as_f32 = |x: &Array| ops::astype(x, Dtype::Float32);
    let rows_diff = max_difference(&as_f32(&step_rows)?, &as_f32(&last(&body)?)?)?;
    let free = win.dim(3)? - held - 1;
    let want_window = ops::concatenate(&[&ops::slice_axis(&win, 3, 3, 3 + held)?, &want_newest, &ops::zeros(&[1, hkv, 2, free, d], Dtype::Float32)?], 3)?;
    let moved_diff = max_difference(&moved, &want_window)?;
    if rows_diff != 0.0 || moved_diff > 1e-3 || !moved_diff.is_finite() {
        return Ok(Some(format!("a decode step's encoding differs: rows by {rows_diff}, its window by {moved_diff}")));
    }
    // The reference: the same rows decoded by MLX ops up to the window, attended plainly.
    let (body_k, body_v) = codec.decode(&ops::slice_axis(&body, 2, SINKS, cut)?, Dtype::Float32)?;
    let keys = ops::concatenate(&[&sinks[0], &body_k, &rotated(&k, cut, len)?], 2)?;
    let vals = ops::concatenate(&[&sinks[1], &body_v, &rotated(&v, cut, len)?], 2)?;
    let (keys, vals) = (rot.invert(&keys)?, rot.invert(&vals)?);
    let want = mlx_rs_safe::fast::scaled_dot_product_attention(&q, &keys, &vals, (d as f32).powf(-0.5), mlx_rs_safe::fast::SdpaMask::None, None)?;
    let diff = max_difference(&got, &want)?;
    Ok((diff > 1e-2 || !diff.is_finite()).then(|| format!("max difference {diff}")))
}

/// The largest absolute difference between `a` and `b`'s elements.
fn max_difference(a: &Array, b: &Array) -> Result<f32> {
    Ok(ops::max_all(&ops::abs(&ops::subtract(a, b)?)?, false)?.item::<f32>()?)
}

/// Whether decode steps of `codec`'s format with `rep` query heads per KV head
/// run on the GPU kernels here: shapes the kernels take, once a check of
/// that very shape (format, head dim, query heads per KV head) agreed with
/// the MLX-ops path (each shape checked the first time it is asked for, so a
/// fault particular to one shape leaves that shape on the ops path).
pub fn applies(codec: &Codec, rep: i32) -> bool {
    // The attention block holds REP × D floats per warp in shared memory.
    encode_applies(codec) && (1..=8).contains(&rep) && rep * codec.dim() <= 1024 && shape_agrees(codec.format, codec.dim(), rep)
}

/// Whether [`shape_check`] passed for this shape (run once per shape).
fn shape_agrees(format: super::TurboFormat, d: i32, rep: i32) -> bool {
    static CHECKED: crate::kernel_check::CheckedOnce<(super::TurboFormat, i32, i32)> = crate::kernel_check::CheckedOnce::new();
    CHECKED.passes(
        (format, d, rep),
        || format!("TurboQuant: the kernels for {format:?} at head dim {d}, {rep} query heads per KV head"),
        "the MLX-ops path for that shape",
        || shape_check(format, d, rep),
    )
}

thread_local! {
    /// The kernels, made once per thread (MLX compiles each template
    /// instance once and caches it).
    static KERNELS: RefCell<HashMap<&'static str, CustomKernel>> = RefCell::new(HashMap::new());
}

/// The sources of `lang` ([`CUDA`], [`METAL`]): the built-in ones, or, for
/// kernel development on a GPU machine without rebuilding, the files of the
/// same names in the folder `MLX_SERVE_TURBO_KERNELS` names.
fn sources(lang: KernelLanguage) -> Result<Vec<Cow<'static, str>>> {
    let builtin = if lang == KernelLanguage::Cuda { CUDA } else { METAL };
    let mut out: Vec<Cow<'static, str>> = builtin.iter().map(|s| Cow::Borrowed(*s)).collect();
    let Some(dir) = std::env::var_os("MLX_SERVE_TURBO_KERNELS") else { return Ok(out) };
    let names = ["turbo_common", "turbo_encode", "turbo_attend", "turbo_merge"];
    for (i, name) in names.iter().take(builtin.len()).enumerate() {
        let ext = match (lang, i) {
            (KernelLanguage::Cuda, 0) => "cuh",
            (KernelLanguage::Cuda, _) => "cu",
            _ => "metal",
        };
        let path = std::path::Path::new(&dir).join(format!("{name}.{ext}"));
        let text = std::fs::read_to_string(&path).map_err(|e| Error::Startup(format!("MLX_SERVE_TURBO_KERNELS: {}: {e}", path.display())))?;
        out[i] = Cow::Owned(text);
    }
    Ok(out)
}

fn with_kernel<R>(name: &'static str, f: impl FnOnce(&CustomKernel) -> Result<R>) -> Result<R> {
    let lang = language().ok_or(Error::Internal("TurboQuant kernels without a GPU backend"))?;
    KERNELS.with(|cell| {
        let mut map = cell.borrow_mut();
        if !map.contains_key(name) {
            let sources = sources(lang)?;
            let source = |i: usize| sources.get(i).map(|s| s.as_ref()).ok_or(Error::Internal("a TurboQuant kernel this GPU language has no source for"));
            // On CUDA the attention kernels also count their finished splits
            // and merge them (`counts` in, `out` out).
            let cuda = lang == KernelLanguage::Cuda;
            let (inputs, outputs, source): (&[&str], &[&str], &str) = match name {
                "turbo_encode" => (&["k", "v", "signs", "kbounds", "kcent", "vbounds", "vcent"], &["o", "rkv"], source(1)?),
                "turbo_encode_step" => {
                    let inputs: &[&str] = &["k", "v", "signs", "kbounds", "kcent", "vbounds", "vcent", "win", "moves"];
                    (inputs, &["o", "nwin"], source(1)?)
                }
                "turbo_attend" | "turbo_attend_bounded" | "turbo_attend_four" if cuda => {
                    let inputs: &[&str] = &["q", "kv", "params", "signs", "kcent", "vcent", "sink_k", "sink_v", "win", "win_params", "counts"];
                    (inputs, &["part_o", "part_ml", "out"], source(2)?)
                }
                "turbo_attend" => {
                    let inputs: &[&str] = &["q", "kv", "params", "signs", "kcent", "vcent", "sink_k", "sink_v", "win", "win_params"];
                    (inputs, &["part_o", "part_ml"], source(2)?)
                }
                "dense_attend" => (&["q", "k", "v", "params", "ks", "kb", "vs", "vb", "counts"], &["part_o", "part_ml", "out"], DENSE_CUDA),
                _ => (&["part_o", "part_ml", "signs"], &["out"], source(3)?),
            };
            // The step's form of the encode kernel is the same source with
            // TURBO_ENCODE_STEP set (see turbo_encode.cu); the bounded
            // attention kernel, with TURBO_MIN_BLOCKS (turbo_common.cuh).
            let header = match name {
                "turbo_encode_step" => Cow::Owned(format!("#define TURBO_ENCODE_STEP 1\n{}", sources[0])),
                "turbo_attend_bounded" => Cow::Owned(format!("#define TURBO_MIN_BLOCKS {BOUNDED_BLOCKS}\n{}", sources[0])),
                "turbo_attend_four" => Cow::Owned(format!("#define TURBO_MIN_BLOCKS {FOUR_BLOCKS}\n{}", sources[0])),
                _ => Cow::Borrowed(sources[0].as_ref()),
            };
            let src = KernelSource { header: &header, ..KernelSource::new(name, inputs, outputs, source) };
            map.insert(name, CustomKernel::new(lang, &src)?);
        }
        let kernel = map.get(name).ok_or(Error::Internal("a TurboQuant kernel"))?;
        f(kernel)
    })
}

fn ints(args: &[(&str, i32)]) -> Vec<(String, TemplateArg)> {
    args.iter().map(|(k, v)| (k.to_string(), TemplateArg::Int(*v))).collect()
}

/// (KFMT, KBITS) of a key format.
fn key_code(codec: &Codec) -> (i32, i32) {
    match codec.format.key {
        KeyCode::Codebook(b) => (1, b as i32),
        _ => (0, 4),
    }
}

/// The rows of the positions of `k`, `v` [B, HKV, L, D] (not rotated),
/// [B, HKV, L, row bytes] uint8 (one block per vector pair), and the last
/// position's key and value rotated, [B, HKV, 2, 1, D] of the codec's dtype
/// (a decode step's entry in the recent window, in its layout).
pub fn encode(codec: &Codec, k: &Array, v: &Array) -> Result<[Array; 2]> {
    let s = k.shape();
    let (b, h, len, d) = (s[0], s[1], s[2], s[3]);
    let (kfmt, kbits) = key_code(codec);
    let t = codec.tables();
    let mut template = vec![("T".to_string(), TemplateArg::Dtype(codec.dtype))];
    template.extend(ints(&[("D", d), ("KFMT", kfmt), ("KBITS", kbits), ("KG", affine_group(d)), ("VBITS", codec.format.value_bits as i32)]));
    let call = KernelCall {
        outputs: vec![(vec![b, h, len, codec.row_bytes()], Dtype::Uint8), (vec![b, h, 2, 1, d], codec.dtype)],
        grid: (b * h * len * d, 1, 1),
        thread_group: (d, 1, 1),
        template,
        ..Default::default()
    };
    // The kernel reads k and v as the codec's dtype (that of its scales).
    let (k, v) = (ops::astype(k, codec.dtype)?, ops::astype(v, codec.dtype)?);
    let out = with_kernel("turbo_encode", |kern| {
        Ok(kern.apply(&[&k, &v, &t.signs, &t.key_bounds, &t.key_centroids, &t.value_bounds, &t.value_centroids], &call)?)
    })?;
    <[Array; 2]>::try_from(out).map_err(|_| Error::Internal("the TurboQuant encode kernel without its two outputs"))
}

/// A decode step's [`encode`] of one new position per row (`k`, `v` [B,
/// HKV, 1, D]) that also hands back the recent window's whole buffer after
/// the step (`window` before it, [B, HKV, 2, room, D] of the codec's dtype;
/// `moves` from [`window_moves`] for [`super::recent::Recent::step_moves`]):
/// the step's window update is this launch's, not a slice update of its own
/// (a graph node, ~15 µs of host time a layer). Returns the position's rows
/// [B, HKV, 1, row bytes] and the new window buffer.
pub fn encode_step(codec: &Codec, k: &Array, v: &Array, window: &Array, moves: &Array) -> Result<[Array; 2]> {
    let s = k.shape();
    let (b, h, d) = (s[0], s[1], s[3]);
    if s[2] != 1 || window.dtype() != codec.dtype {
        return Err(Error::Internal("a TurboQuant step encodes one position per row into a window of the codec's dtype"));
    }
    let (kfmt, kbits) = key_code(codec);
    let t = codec.tables();
    let mut template = vec![("T".to_string(), TemplateArg::Dtype(codec.dtype))];
    template.extend(ints(&[("D", d), ("KFMT", kfmt), ("KBITS", kbits), ("KG", affine_group(d)), ("VBITS", codec.format.value_bits as i32)]));
    let call = KernelCall {
        outputs: vec![(vec![b, h, 1, codec.row_bytes()], Dtype::Uint8), (window.shape(), codec.dtype)],
        grid: (b * h * (1 + window_copy_blocks(window)?) * d, 1, 1),
        thread_group: (d, 1, 1),
        template,
        ..Default::default()
    };
    let (k, v) = (ops::astype(k, codec.dtype)?, ops::astype(v, codec.dtype)?);
    let out = with_kernel("turbo_encode_step", |kern| {
        Ok(kern.apply(&[&k, &v, &t.signs, &t.key_bounds, &t.key_centroids, &t.value_bounds, &t.value_centroids, window, moves], &call)?)
    })?;
    <[Array; 2]>::try_from(out).map_err(|_| Error::Internal("the TurboQuant step encode kernel without its two outputs"))
}

/// Blocks a head's window buffer ([.., 2, room, D]) is copied by in
/// [`encode_step`], beside the block that encodes the head's new position:
/// enough that each thread of each (D threads) moves 8 pieces of 16 bytes
/// once (turbo_encode.cu), so the copy is one memory round trip, not a loop
/// of them in one block.
fn window_copy_blocks(window: &Array) -> Result<i32> {
    let bytes = 2 * window.dim(3)? as usize * window.dtype().size_of();
    Ok(bytes.div_ceil(8 * 16).max(1) as i32)
}

/// [`encode_step`]'s `moves` for a step whose window slots `src..src + keep`
/// move to `0..keep` and whose new position goes to slot `keep`, in GPU
/// memory as [`step_params`] puts its scalars (every layer reads one copy).
pub fn window_moves(src: i32, keep: i32) -> Result<Array> {
    in_device_memory(&[src, keep], &[0, 0])
}

/// Blocks a split-K attention call aims for: two per multiprocessor of an
/// H100. Measured there with an earlier TurboQuant kernel (Llama-3.1-8B
/// shape, 1 row, 32K and 64K positions): 256 blocks beat 384 and 768 (each
/// block rotates its queries and leaves a partial for the merge, so fewer,
/// longer splits paid off once the GPU was covered).
const BLOCKS: i32 = 256;
/// Blocks CUDA's attention kernel aims for at head dim 128 with up to 4 query
/// heads per KV head (`turbo_attend_four`: launch bounds of 4 blocks an SM,
/// [`FOUR_BLOCKS`]), where it takes 128 registers a thread and 48 KB of
/// shared memory, so 4 blocks share a multiprocessor: the splits of the
/// codes, which run long, in one wave of 4 an SM on a 132-SM H100 or H200
/// (the recent window's splits come on top and are short; one row of the
/// Llama-3.1-8B shape: 448 + 32 = 480 blocks). On an H200 (Nsight Compute,
/// BENCHMARKS.md, session 45) a launch took 61 µs at 64K positions instead
/// of 72 with [`BLOCKS`] (288 blocks: 2 warps a scheduler, waiting on their
/// own latency), and 39 instead of 43 at 32K; 544 (512 targeted, past one
/// wave) took 59-60 µs at 64K but 42 at 32K.
const BLOCKS_FOUR_PER_SM: i32 = 448;

/// `default`, or `MLX_SERVE_TURBO_BLOCKS` where it is set (kernel
/// development on a GPU machine, like `MLX_SERVE_TURBO_KERNELS`).
fn target_blocks(default: i32) -> i32 {
    static OVERRIDE: OnceLock<i32> = OnceLock::new();
    match *OVERRIDE.get_or_init(|| crate::kernel_check::tuned("MLX_SERVE_TURBO_BLOCKS", 0)) {
        0 => default,
        n => n,
    }
}
/// Positions a split takes at least, so the query's rotation at the start of
/// each block stays a small part of its work.
const MIN_SPLIT: i32 = 256;

/// Splits of each row's `positions` when `heads` (rows × KV heads) blocks
/// work on every split, aiming at `blocks` blocks over the positions (see
/// [`target_blocks`]; a caller's window splits come on top): at most 256 (a
/// merge thread per split).
fn splits(positions: i32, heads: i32, blocks: i32) -> i32 {
    let by_blocks = (target_blocks(blocks) + heads - 1) / heads.max(1);
    let by_len = (positions.max(1) + MIN_SPLIT - 1) / MIN_SPLIT;
    by_blocks.min(by_len).clamp(1, 256)
}

/// The attention kernel's scalars of a decode step as one int32 array in GPU
/// memory: [positions written, the scale's float bits, each row's first
/// position]. MLX keeps arrays written by the host in unified memory, where
/// every read from a kernel crosses the host link (on an H100 that made the
/// attention kernel wait most of its time for them); a GPU op's output of
/// more than 8 bytes is device memory, so the step copies them once there
/// and every layer's kernel reads that copy.
pub fn step_params(written: i32, scale: f32, pads: &[i32]) -> Result<Array> {
    in_device_memory(&[written, scale.to_bits() as i32], pads)
}

/// `head` then `rest` as one int32 array made by a GPU op (so in device
/// memory, as long as it holds more than 8 bytes: see [`step_params`]).
fn in_device_memory(head: &[i32], rest: &[i32]) -> Result<Array> {
    let head = Array::from_slice(head, &[head.len() as i32])?;
    let rest = Array::from_slice(rest, &[rest.len() as i32])?;
    Ok(ops::concatenate(&[&head, &rest], 0)?)
}

/// Blocks of the CUDA attention kernel an SM is to hold at head dim 128 with
/// more than 4 query heads per KV head (`turbo_attend_bounded`): there it
/// takes ~200 registers a thread, 2 blocks an SM, and at 32K positions waits
/// on its own latency; bounded to 3 (168 registers, a few spilled) it took
/// 56-57 µs a layer instead of 65 on an H200 (Qwen3-30B-A3B shape, BENCHMARKS.md).
const BOUNDED_BLOCKS: i32 = 3;

/// The launch bound of `turbo_attend_four` (head dim 128, at most 4 query
/// heads per KV head), which [`BLOCKS_FOUR_PER_SM`] counts on: ptxas gives
/// the kernel 128 registers built in, but 130 after the byte-index value
/// decode (session 46) without the bound, which would leave 3 blocks an SM.
const FOUR_BLOCKS: i32 = 4;

/// Splits (blocks per row and KV head) that attend the recent window, a slice
/// each: on CUDA a warp reads two of its 16-bit positions at a time (head dim
/// 128; `turbo_lane_attend` in turbo_common.cuh), so one block over the whole
/// window (128-192 positions) took longer than a split of 256 or more codes
/// on tensor cores and every layer waited for it.
const WINDOW_SPLITS: i32 = 4;

/// The recent window's part of a decode step (see `recent.rs`): its whole
/// buffer (rotated keys and values, [B, HKV, 2, capacity, D] of the codec's
/// dtype) and `params` from [`step_params`] over it (the end slot, the
/// scale, each row's first slot read): row b reads slots first_b..end.
pub struct Window<'a> {
    pub buffer: &'a Array,
    pub params: &'a Array,
}

/// Attention of `q` [B, HQ, 1, D] over the sinks [B, HKV, 4, D], the
/// body's rows (whole capacity; `params` from `step_params`: the positions
/// before `cut` and each row's first say which are read) and the recent
/// window (the positions from `cut` on, the kernel's last split); the output
/// in `q`'s dtype. `counts`: the cache's [`SplitCounts`] for its rows (read
/// on CUDA only).
#[allow(clippy::too_many_arguments)]
pub fn attend(codec: &Codec, q: &Array, sinks: &[Array; 2], rows: &Array, params: &Array, cut: i32, window: &Window, counts: &Array) -> Result<Array> {
    let qs = q.shape();
    let (b, hq, d) = (qs[0], qs[1], qs[3]);
    let hkv = sinks[0].dim(1)?;
    let rep = hq / hkv;
    let (kfmt, kbits) = key_code(codec);
    let lang = language().ok_or(Error::Internal("TurboQuant kernels without a GPU backend"))?;
    let cuda = lang == KernelLanguage::Cuda;
    // The kernel for the shape and the blocks it aims for: at head dim 128 on
    // CUDA, bounded to 3 blocks an SM past 4 query heads per KV head; with
    // at most 4, to 4.
    let (name, blocks) = match (cuda, d, rep) {
        (true, 128, r) if r > 4 => ("turbo_attend_bounded", BLOCKS),
        (true, 128, _) => ("turbo_attend_four", BLOCKS_FOUR_PER_SM),
        _ => ("turbo_attend", BLOCKS),
    };
    // The merge takes at most 256 splits; the window takes the last ones.
    let ns = splits(cut - SINKS, b * hkv, blocks).min(256 - WINDOW_SPLITS) + WINDOW_SPLITS;
    let threads = attend_threads(lang, rep);
    let t = codec.tables();
    let mut template = vec![("T".to_string(), TemplateArg::Dtype(q.dtype())), ("S".to_string(), TemplateArg::Dtype(codec.dtype))];
    template.extend(ints(&[
        ("D", d),
        ("REP", rep),
        ("KFMT", kfmt),
        ("KBITS", kbits),
        ("KG", affine_group(d)),
        ("VBITS", codec.format.value_bits as i32),
        ("WS", WINDOW_SPLITS),
    ]));
    if window.buffer.dtype() != codec.dtype {
        return Err(Error::Internal("the recent window's dtype is not the codec's"));
    }
    let inputs = [q, rows, params, &t.signs, &t.key_centroids, &t.value_centroids, &sinks[0], &sinks[1], window.buffer, window.params];
    if cuda {
        let call = split_call([b, hq, hkv, ns, d], threads, template, Some(q.dtype()));
        return launch_merged(name, &inputs, counts, b * hkv, &call);
    }
    let call = split_call([b, hq, hkv, ns, d], threads, template, None);
    let parts = with_kernel(name, |kern| Ok(kern.apply(&inputs, &call)?))?;
    merge(&parts, q.dtype(), &t.signs)
}

/// A split-K attention kernel's launch: a block of `threads` per row, KV head
/// and split, writing the partials (`part_o` [B, HQ, NS, D], `part_ml` [B,
/// HQ, NS, 2], float32) and, where the kernel merges them itself (`merged`:
/// the output's dtype), the attention [B, HQ, 1, D].
fn split_call([b, hq, hkv, ns, d]: [i32; 5], threads: i32, template: Vec<(String, TemplateArg)>, merged: Option<Dtype>) -> KernelCall {
    let mut outputs = vec![(vec![b, hq, ns, d], Dtype::Float32), (vec![b, hq, ns, 2], Dtype::Float32)];
    outputs.extend(merged.map(|dtype| (vec![b, hq, 1, d], dtype)));
    KernelCall {
        outputs,
        grid: (b * hkv * ns * threads, 1, 1),
        thread_group: (threads, 1, 1),
        template,
        ..Default::default()
    }
}

/// A self-merging (CUDA) split-K launch of kernel `name` over `inputs` and
/// the cache's `counts` (one per group of the launch: `groups`, rows × KV
/// heads): the merged attention, its third output after the partials.
fn launch_merged(name: &'static str, inputs: &[&Array], counts: &Array, groups: i32, call: &KernelCall) -> Result<Array> {
    if counts.size() < groups as usize {
        return Err(Error::Internal("split counters for fewer rows than the query's"));
    }
    let inputs: Vec<&Array> = inputs.iter().copied().chain([counts]).collect();
    let outputs = with_kernel(name, |kern| Ok(kern.apply(&inputs, call)?))?;
    outputs.into_iter().nth(2).ok_or(Error::Internal("a split-K attention kernel without its merged output"))
}

/// The counters of a cache's CUDA split-K attention launches, one per (row,
/// KV head): each split adds one as it finishes and the last to finish merges
/// the group's splits and sets its counter back to zero
/// (`turbo_merge_if_last` in turbo_common.cuh), so the array is all zeros
/// between launches and no merge kernel (a graph node, ~15 µs of host time a
/// layer) runs. A cache keeps one for all its launches, made at the first and
/// again when its rows change; a copy of a cache starts its own, so launches
/// that could overlap never count in one array.
#[derive(Default)]
pub struct SplitCounts(Option<Array>);

impl Clone for SplitCounts {
    fn clone(&self) -> SplitCounts {
        SplitCounts(None)
    }
}

/// Counters made at least: MLX keeps arrays of 8 bytes or less in unified
/// memory, where a kernel's atomics would cross the host link.
const MIN_COUNTS: i32 = 64;

impl SplitCounts {
    /// The zeroed counters for `groups` (rows × KV heads) of a launch.
    pub fn for_groups(&mut self, groups: i32) -> Result<Array> {
        if let Some(c) = self.0.as_ref().filter(|c| c.size() == groups.max(MIN_COUNTS) as usize) {
            return Ok(c.clone());
        }
        let c = zero_counts(groups)?;
        self.0 = Some(c.clone());
        Ok(c)
    }
}

/// New counters for `groups` launches' groups, all zero.
fn zero_counts(groups: i32) -> Result<Array> {
    Ok(ops::zeros(&[groups.max(MIN_COUNTS)], Dtype::Uint32)?)
}

/// The result of `launch`'s second run on one array of counters for `groups`
/// (the first evaluated before it): what a cache's every later step relies
/// on, so the start-up checks see a launch that left its counters nonzero.
fn second_launch(groups: i32, launch: impl Fn(&Array) -> Result<Array>) -> Result<Array> {
    let counts = zero_counts(groups)?;
    mlx_rs_safe::eval(&[&launch(&counts)?])?;
    launch(&counts)
}

/// The splits' partials (`part_o`, `part_ml`) of a Metal launch merged into
/// [B, HQ, 1, D] of `dtype`, rotated back with `signs` (TurboQuant's rotated
/// basis). (CUDA's attention kernels merge their own splits.)
fn merge(parts: &[Array], dtype: Dtype, signs: &Array) -> Result<Array> {
    let [part_o, part_ml] = parts else { return Err(Error::Internal("attention partials without their two outputs")) };
    let s = part_o.shape();
    let (b, hq, d) = (s[0], s[1], s[3]);
    let mut template = vec![("T".to_string(), TemplateArg::Dtype(dtype))];
    template.extend(ints(&[("D", d), ("ROT", 1)]));
    let merge = KernelCall {
        outputs: vec![(vec![b, hq, 1, d], dtype)],
        grid: (b * hq * MERGE_THREADS, 1, 1),
        thread_group: (MERGE_THREADS, 1, 1),
        template,
        ..Default::default()
    };
    let out = with_kernel("turbo_merge", |kern| Ok(kern.apply(&[part_o, part_ml, signs], &merge)?))?;
    out.into_iter().next().ok_or(Error::Internal("the attention merge kernel returned nothing"))
}

/// Whether decode attention of `q` [B, HQ, 1, D] over `kv_heads` heads fits
/// dense_attend.cu: one query, 1-8 query heads per KV head, head dims
/// 64/128/256, a 16-bit or float32 query.
fn split_attend_fits(q: &Array, kv_heads: i32) -> bool {
    let s = q.shape();
    let (hq, d) = (s[1], s[3]);
    matches!(q.dtype(), Dtype::Bfloat16 | Dtype::Float16 | Dtype::Float32)
        && s[2] == 1
        && kv_heads > 0
        && hq % kv_heads == 0
        && (1..=8).contains(&(hq / kv_heads))
        && [64, 128, 256].contains(&d)
}

/// Whether decode attention of `q` [B, HQ, 1, D] over a 16-bit (or float32)
/// cache of `kv_heads` heads in `q`'s dtype runs on [`dense_attend`] here: CUDA
/// (unless `MLX_SERVE_DENSE_KERNEL=0`), head dims 64/128/256, 1-8 query heads
/// per KV head, once a start-up check found it agreeing with MLX's attention.
pub fn dense_applies(q: &Array, kv_heads: i32, cache_dtype: Dtype) -> bool {
    q.dtype() == cache_dtype && split_attend_fits(q, kv_heads) && dense_usable()
}

/// Whether decode attention of `q` over an affine-quantized cache
/// (`--kv-bits`) of `kv_heads` heads, `bits`-bit codes in groups of
/// `group_size` with scales of `scales_dtype`, runs on [`affine_attend`] here:
/// CUDA (unless `MLX_SERVE_AFFINE_KERNEL=0`), 8- or 4-bit codes, groups of
/// 32/64/128, scales of the query's dtype, the shapes of [`dense_applies`],
/// once a start-up check found it agreeing with MLX's attention over the
/// dequantized cache.
pub fn affine_applies(q: &Array, kv_heads: i32, group_size: i32, bits: i32, scales_dtype: Dtype) -> bool {
    q.dtype() == scales_dtype
        && [4, 8].contains(&bits)
        && [32, 64, 128].contains(&group_size)
        && q.dim(-1).is_ok_and(|d| d % group_size == 0)
        && split_attend_fits(q, kv_heads)
        && affine_usable()
}

/// Whether the dense kernel runs here, is not turned off
/// (`MLX_SERVE_DENSE_KERNEL=0`, to compare with MLX's masked attention) and
/// agrees with MLX's attention (checked once, like [`usable`]).
fn dense_usable() -> bool {
    static USABLE: OnceLock<bool> = OnceLock::new();
    if mlx_rs_safe::kernels::current_gpu_backend() != Some("cuda") {
        return false;
    }
    *USABLE.get_or_init(|| {
        crate::kernel_check::serves(
            "MLX_SERVE_DENSE_KERNEL",
            "16-bit decode attention of rows of other lengths uses MLX's masked attention",
            "16-bit decode attention: the CUDA kernel",
            "MLX's attention",
            || split_attend_check(None),
        )
    })
}

/// Whether the kernel runs here over affine codes, is not turned off
/// (`MLX_SERVE_AFFINE_KERNEL=0`) and agrees with MLX's attention over the
/// dequantized cache for 8- and 4-bit codes (checked once).
fn affine_usable() -> bool {
    static USABLE: OnceLock<bool> = OnceLock::new();
    if mlx_rs_safe::kernels::current_gpu_backend() != Some("cuda") {
        return false;
    }
    *USABLE.get_or_init(|| {
        let instead = "--kv-bits decode attention dequantizes each layer's history for MLX's attention";
        let check = || Ok(split_attend_check(Some((64, 8)))?.or(split_attend_check(Some((32, 4)))?));
        crate::kernel_check::serves("MLX_SERVE_AFFINE_KERNEL", instead, "--kv-bits decode attention: the CUDA kernel", "dequantizing for MLX's attention", check)
    })
}

/// Rows of other lengths attended by the kernel and by MLX's attention with
/// the mask that left padding needs (`quant`: affine codes of (group size,
/// bits), dequantized for MLX's); None when they agree.
fn split_attend_check(quant: Option<(i32, i32)>) -> Result<Option<String>> {
    let (d, hkv, rep, cap, written) = (64, 2, 4, 320, 300);
    let pads = [0, 37, 299];
    let (got, want) = against_reference(d, hkv, rep, cap, written, &pads, Dtype::Float32, quant)?;
    let diff = max_difference(&got, &want)?;
    // Loose enough for MLX's float32 matmuls, which run as TF32 on CUDA.
    Ok((diff > 1e-2 || !diff.is_finite()).then(|| format!("max difference {diff}")))
}

/// (kernel, reference) outputs for random data: `pads.len()` rows whose first
/// valid positions are `pads`, `written` positions of a `cap`-position buffer,
/// held as they are or (`quant`) as affine codes of (group size, bits), which
/// the reference dequantizes.
#[allow(clippy::too_many_arguments)]
pub fn against_reference(d: i32, hkv: i32, rep: i32, cap: i32, written: i32, pads: &[i32], dtype: Dtype, quant: Option<(i32, i32)>) -> Result<(Array, Array)> {
    use mlx_rs_safe::{quantized, random};
    let b = pads.len() as i32;
    let normal = |shape: &[i32], seed: u64| -> Result<Array> { Ok(ops::astype(&random::normal(shape, Dtype::Float32, 0.0, 1.0, &random::key(seed)?)?, dtype)?) };
    let (k, v) = (normal(&[b, hkv, cap, d], 11)?, normal(&[b, hkv, cap, d], 12)?);
    let q = normal(&[b, hkv * rep, 1, d], 13)?;
    let scale = (d as f32).powf(-0.5);
    let params = step_params(written, scale, pads)?;
    let (got, k, v) = match quant {
        None => (second_launch(b * hkv, |counts| dense_attend(&q, &k, &v, &params, written, counts))?, k, v),
        Some((group, bits)) => {
            let codes = |x: &Array| -> Result<[Array; 3]> {
                let (packed, scales, biases) = quantized::quantize(x, group, bits)?;
                Ok([packed, scales, biases])
            };
            let (kc, vc) = (codes(&k)?, codes(&v)?);
            let got = second_launch(b * hkv, |counts| affine_attend(&q, &kc, &vc, &params, written, group, bits, counts))?;
            let back = |[packed, scales, biases]: &[Array; 3]| quantized::dequantize(packed, scales, Some(biases), group, bits);
            (got, back(&kc)?, back(&vc)?)
        }
    };
    let keys = ops::arange(0.0, written as f64, 1.0, Dtype::Int32)?;
    let first = Array::from_slice(pads, &[b, 1, 1, 1])?;
    let mask = ops::greater_equal(&keys, &first)?;
    let (kw, vw) = (ops::slice_axis(&k, 2, 0, written)?, ops::slice_axis(&v, 2, 0, written)?);
    let want = mlx_rs_safe::fast::scaled_dot_product_attention(&q, &kw, &vw, scale, mlx_rs_safe::fast::SdpaMask::Array(&mask), None)?;
    Ok((got, want))
}

/// Attention of `q` [B, HQ, 1, D] over the whole buffers `k`, `v` [B, HKV,
/// CAP, D] of a 16-bit (or float32) cache, of which `params` (from
/// [`step_params`]: positions written, scale, each row's first position) say
/// which positions are valid; the output in `q`'s dtype. No mask: each row
/// starts at its own first position. `counts`: the cache's [`SplitCounts`].
pub fn dense_attend(q: &Array, k: &Array, v: &Array, params: &Array, written: i32, counts: &Array) -> Result<Array> {
    if k.dtype() != q.dtype() || v.dtype() != q.dtype() {
        return Err(Error::Internal("16-bit decode attention: the cache's dtype is not the query's"));
    }
    // The scales and biases are not read at 16 bits: the keys and values stand in.
    split_attend(q, [k, v, k, k, v, v], params, written, (32, 0), counts)
}

/// [`dense_attend`] over an affine-quantized cache: `keys` and `values` are
/// the whole buffers' (packed codes, scales, biases), `bits`-bit codes in
/// groups of `group_size`, read as codes (nothing dequantized).
#[allow(clippy::too_many_arguments)]
pub fn affine_attend(q: &Array, keys: &[Array], values: &[Array], params: &Array, written: i32, group_size: i32, bits: i32, counts: &Array) -> Result<Array> {
    let ([kq, ks, kb], [vq, vs, vb]) = (keys, values) else {
        return Err(Error::Internal("--kv-bits attention without codes, scales and biases"));
    };
    if ks.dtype() != q.dtype() || vs.dtype() != q.dtype() {
        return Err(Error::Internal("--kv-bits decode attention: the cache's scales are not of the query's dtype"));
    }
    split_attend(q, [kq, vq, ks, kb, vs, vb], params, written, (group_size, bits), counts)
}

/// dense_attend.cu over (k, v, ks, kb, vs, vb) with codes (GS, BITS) (BITS
/// 0: 16-bit keys and values), which merges its own splits.
fn split_attend(q: &Array, kv: [&Array; 6], params: &Array, written: i32, (group_size, bits): (i32, i32), counts: &Array) -> Result<Array> {
    let qs = q.shape();
    let (b, hq, d) = (qs[0], qs[1], qs[3]);
    if params.dim(0)? - 2 != b {
        return Err(Error::Internal("the step's parameters name other rows than the query's"));
    }
    let hkv = kv[0].dim(1)?;
    let rep = hq / hkv;
    let (unroll, query_shared) = lane_loop(rep);
    let mut template = vec![("T".to_string(), TemplateArg::Dtype(q.dtype()))];
    template.extend(ints(&[("D", d), ("REP", rep), ("BITS", bits), ("GS", group_size), ("U", unroll), ("QS", query_shared as i32)]));
    let call = split_call([b, hq, hkv, splits(written, b * hkv, DENSE_BLOCKS), d], DENSE_THREADS, template, Some(q.dtype()));
    let [k, v, ks, kb, vs, vb] = kv;
    launch_merged("dense_attend", &[q, k, v, params, ks, kb, vs, vb], counts, b * hkv, &call)
}

/// Threads of a dense attention block (dense_attend.cu's THREADS).
const DENSE_THREADS: i32 = 128;

/// `dense_attend`'s lane loop for `rep` query heads a KV head: the positions
/// a lane reads an iteration (`U` in turbo_common.cuh's `turbo_lane_attend`:
/// their loads in flight together, one softmax correction for all), and
/// whether the query is read from shared memory rather than kept in
/// registers (`QSHARED`: past 4 query heads, their coordinates alone take 64
/// registers a thread). Up to 4 query heads: 2 positions, the query in
/// registers (123 registers, 4 blocks an SM; 4 positions took 144, 3
/// blocks); past 4: 4 positions, their rows in the registers the query
/// leaves (186, 2 blocks an SM as before). On an H200 (BENCHMARKS.md,
/// session 49) the 16-bit attention of 4 rows of other lengths at 64K took
/// 3.1-3.3 ms for 8 layers of either the Llama-3.1-8B or the Qwen3-30B-A3B
/// shape, against 5.6 and 5.3 with one position a lane and the next loaded
/// meanwhile. `MLX_SERVE_DENSE_UNROLL` and `MLX_SERVE_DENSE_QUERY_REGS` (the
/// most query heads kept in registers) set them on a GPU machine (kernel
/// development, like `MLX_SERVE_TURBO_BLOCKS`).
fn lane_loop(rep: i32) -> (i32, bool) {
    static KNOBS: OnceLock<(i32, i32)> = OnceLock::new();
    let (unroll, regs) = *KNOBS.get_or_init(|| {
        let unroll = crate::kernel_check::tuned("MLX_SERVE_DENSE_UNROLL", 0);
        (if [1, 2, 4].contains(&unroll) { unroll } else { 0 }, crate::kernel_check::tuned("MLX_SERVE_DENSE_QUERY_REGS", 4))
    });
    let query_shared = rep > regs;
    let unroll = match unroll {
        0 if query_shared => 4,
        0 => 2,
        n => n,
    };
    (unroll, query_shared)
}
/// Blocks a `dense_attend` call aims for: with 512 instead of 256 the Llama
/// shape's 4 rows at 64K took 3.2 ms instead of 4.2 (H200, BENCHMARKS.md,
/// session 49; the A3B shape's 3.3 either way).
const DENSE_BLOCKS: i32 = 512;

#[cfg(test)]
mod split_counts_tests {
    use super::*;

    #[test]
    fn a_caches_split_counters_are_zeros_kept_for_its_rows_and_not_shared_by_a_copy() {
        let mut counts = SplitCounts::default();
        let first = counts.for_groups(8).unwrap();
        // At least 64 (MLX keeps tiny arrays in unified memory), all zero.
        assert_eq!((first.size(), first.dtype()), (64, Dtype::Uint32));
        assert_eq!(ops::max_all(&ops::astype(&first, Dtype::Float32).unwrap(), false).unwrap().item::<f32>().unwrap(), 0.0);
        // Kept while 64 cover the rows; remade for more.
        counts.for_groups(40).unwrap();
        assert_eq!(counts.0.as_ref().map(Array::size), Some(64));
        assert_eq!(counts.for_groups(96).unwrap().size(), 96);
        assert_eq!(counts.0.as_ref().map(Array::size), Some(96));
        // A copy of a cache counts in an array of its own, made at its first launch.
        assert!(counts.clone().0.is_none());
    }
}
