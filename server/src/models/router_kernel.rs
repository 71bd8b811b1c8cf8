//! A mixture-of-experts router in one CUDA launch
//! (`metal-kernels/moe_router.cu`): the top-k experts of each row of the
//! router's logits and their mixing scores, where MLX's ops
//! ([`route_with_ops`]) take five launches a layer (softmax, argpartition,
//! take_along_axis, and for normalized scores a sum and a divide; the slice
//! of argpartition's last k is a view). A decode step on CUDA is bound by the
//! host's cost per launch (~7-10 µs each on the GPU machine: BENCHMARKS.md,
//! "Why mlx-serve generates slower"), and a Qwen3-30B-A3B-shaped model routes
//! 48 layers a step.
//!
//! The kernel runs where it fits (CUDA, the current device the GPU, bfloat16,
//! float16 or float32 logits, at most [`MAX_EXPERTS`] experts and
//! [`MAX_TOP_K`] chosen) once its check against the ops passed for the
//! instance asked for (dtype, experts, k, router order, normalized: at a
//! model's first routing, so the model's own instance is what is checked);
//! `MLX_SERVE_ROUTER_KERNEL=0` keeps the ops (to compare). It rounds as the
//! ops do (the softmax in float32 rounded to the logits' dtype, the sum
//! rounded before the divide), takes of equal values the expert
//! argpartition takes in a stable order (the higher for the last k, the
//! lower for the first k), and returns the experts largest first, where
//! argpartition leaves them in its own order: the weighted sum of the
//! experts' outputs then adds them in another order.
//! Metal keeps MLX's ops: not written for it (this is issue 15's CUDA work).

use std::sync::OnceLock;

use mlx_rs_safe::kernels::{gpu_backend, CustomKernel, KernelCall, KernelSource, TemplateArg};
use mlx_rs_safe::{ops, Array, Dtype};

use super::moe::{route_with_ops, Router};
use crate::error::{Error, Result};

const SOURCE: &str = include_str!("../../../metal-kernels/moe_router.cu");

/// The most experts a row may have: a lane holds E / 32 of them in registers
/// (Qwen3-Next has 512).
pub const MAX_EXPERTS: i32 = 512;
/// The most experts a row routes to (the kernel keeps the chosen in registers).
pub const MAX_TOP_K: i32 = 16;
/// Threads of a block: four warps, a row each.
const BLOCK: i32 = 128;

thread_local! {
    static KERNEL: Option<CustomKernel> = make_kernel();
}

fn make_kernel() -> Option<CustomKernel> {
    if gpu_backend() != Some("cuda") {
        return None;
    }
    CustomKernel::cuda(&KernelSource::new("moe_router", &["logits"], &["inds", "scores"], SOURCE))
        .map_err(|e| log::warn!("MoE router kernel: {e}"))
        .ok()
}

/// The experts each row of `logits` [..., E] routes to ([..., k] uint32) and
/// their scores ([..., k], the logits' dtype), as `router` and `norm` say, by
/// the kernel where it serves; None elsewhere (the caller runs
/// [`route_with_ops`]).
pub fn route(logits: &Array, router: Router, k: i32, norm: bool) -> Result<Option<(Array, Array)>> {
    if !fits(logits, k)? || !in_use() || !instance_agrees((logits.dtype(), logits.dim(-1)?, k, router, norm)) {
        return Ok(None);
    }
    launch(logits, router, k, norm).map(Some)
}

/// Whether the kernel takes these logits: a float dtype, rows to route, and
/// E and k within its bounds.
fn fits(logits: &Array, k: i32) -> Result<bool> {
    if logits.ndim() == 0 || logits.size() == 0 {
        return Ok(false);
    }
    let e = logits.dim(-1)?;
    Ok(matches!(logits.dtype(), Dtype::Bfloat16 | Dtype::Float16 | Dtype::Float32)
        && (1..=MAX_TOP_K).contains(&k)
        && k <= e
        && e <= MAX_EXPERTS)
}

/// Whether the kernel serves calls on this thread's device: CUDA, the GPU
/// current, not turned off.
fn in_use() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    mlx_rs_safe::kernels::current_gpu_backend().is_some()
        && *ON.get_or_init(|| {
            gpu_backend() == Some("cuda") && !crate::kernel_check::turned_off("MLX_SERVE_ROUTER_KERNEL", "the MoE router uses MLX's ops")
        })
}

/// A routing instance: the logits' dtype, the experts, k, the router order,
/// and whether the scores are normalized (one kernel instance each).
type Instance = (Dtype, i32, i32, Router, bool);

/// Whether the kernel agreed with the ops for this instance, checked the
/// first time it is asked for: a model routes with one, so its start-up pays
/// for compiling that one only (NVRTC, once a machine), and a fault
/// particular to one instance leaves that one on the ops.
fn instance_agrees(instance: Instance) -> bool {
    static CHECKED: crate::kernel_check::CheckedOnce<Instance> = crate::kernel_check::CheckedOnce::new();
    let (dtype, e, k, router, norm) = instance;
    CHECKED.passes(
        instance,
        || format!("MoE router: the CUDA kernel for {e} experts, top {k}, {dtype:?}, {router:?}{}", if norm { ", normalized" } else { "" }),
        "MLX's ops",
        || {
            let logits = random_logits(&[3, 5, e], dtype, e as u64)?;
            let (inds, scores) = launch(&logits, router, k, norm)?;
            disagreement(&logits, &inds, &scores, router, k, norm)
        },
    )
}

/// One launch: a warp a row.
fn launch(logits: &Array, router: Router, k: i32, norm: bool) -> Result<(Array, Array)> {
    let mut shape = logits.shape();
    let e = shape[shape.len() - 1];
    let rows = logits.size() / e as usize;
    let blocks = i32::try_from(rows.div_ceil((BLOCK / 32) as usize))
        .map_err(|_| Error::Config(format!("the MoE router kernel: {rows} rows are too many for one launch")))?;
    *shape.last_mut().expect("logits have an axis") = k;
    let softmax_first = matches!(router, Router::SoftmaxTopKLast | Router::SoftmaxTopKFirst);
    // argpartition's last k take the higher of equal values (a stable ascending order's).
    let tie_high = matches!(router, Router::SoftmaxTopKLast | Router::TopKLastThenSoftmax);
    let call = KernelCall {
        outputs: vec![(shape.clone(), Dtype::Uint32), (shape, logits.dtype())],
        grid: (blocks * BLOCK, 1, 1),
        thread_group: (BLOCK, 1, 1),
        template: vec![
            ("T".to_string(), TemplateArg::Dtype(logits.dtype())),
            ("E".to_string(), TemplateArg::Int(e)),
            ("K".to_string(), TemplateArg::Int(k)),
            ("SOFTMAX_FIRST".to_string(), TemplateArg::Int(softmax_first as i32)),
            ("NORM".to_string(), TemplateArg::Int(norm as i32)),
            ("TIE_HIGH".to_string(), TemplateArg::Int(tie_high as i32)),
        ],
        ..Default::default()
    };
    let mut out = KERNEL
        .with(|kern| match kern {
            Some(kern) => Ok(kern.apply(&[logits], &call)?),
            None => Err(Error::Internal("the MoE router kernel did not compile")),
        })?
        .into_iter();
    out.next().zip(out.next()).ok_or(Error::Internal("the MoE router kernel returned too few arrays"))
}

/// Router logits spread over several units, as a trained router's are, in
/// `dtype` (16-bit rounding still ties some: the check allows ties).
pub fn random_logits(shape: &[i32], dtype: Dtype, seed: u64) -> Result<Array> {
    use mlx_rs_safe::random;
    let normal = random::normal(shape, Dtype::Float32, 0.0, 3.0, &random::key(seed)?)?;
    Ok(ops::astype(&normal, dtype)?)
}

/// How the kernel's (`inds`, `scores`) for `logits` differ from the ops' or
/// None. Each row must choose k distinct experts whose values (what the
/// router ranks: the softmax of the logits, or the logits) are the ops'
/// chosen values within one rounding of the dtype (ties and near-ties may
/// choose another expert of that value), and its scores, sorted, must be the
/// ops' within a rounding (the two orders of the chosen experts differ).
pub fn disagreement(logits: &Array, inds: &Array, scores: &Array, router: Router, k: i32, norm: bool) -> Result<Option<String>> {
    let (want_inds, want_scores) = route_with_ops(logits, router, k, norm)?;
    let ranked = match router {
        Router::SoftmaxTopKLast | Router::SoftmaxTopKFirst => ops::softmax(logits, &[-1], true)?,
        Router::TopKThenSoftmax | Router::TopKLastThenSoftmax => logits.clone(),
    };
    let k = k as usize;
    // The experts first: the values below are read at them.
    let got_i = ops::astype(inds, Dtype::Uint32)?.to_vec::<u32>()?;
    let e = logits.dim(-1)? as u32;
    for (row, chose) in got_i.chunks(k).enumerate() {
        let mut distinct = chose.to_vec();
        distinct.sort_unstable();
        distinct.dedup();
        if distinct.len() != k || distinct.iter().any(|&x| x >= e) {
            return Ok(Some(format!("row {row} chose {chose:?}, not {k} distinct experts of {e}")));
        }
    }
    let floats = |a: &Array| -> Result<Vec<f32>> { Ok(ops::astype(a, Dtype::Float32)?.to_vec::<f32>()?) };
    let values = |i: &Array| floats(&ops::take_along_axis(&ranked, &ops::astype(i, Dtype::Uint32)?, -1)?);
    let (got_v, want_v) = (values(inds)?, values(&want_inds)?);
    let (got_s, want_s) = (floats(scores)?, floats(&want_scores)?);
    // One rounding of the dtype, relative (bfloat16 keeps 8 bits, float16 11).
    let rel = match logits.dtype() {
        Dtype::Float32 => 1e-5,
        Dtype::Float16 => 1.0 / 1024.0,
        _ => 1.0 / 128.0,
    };
    let sorted = |v: &[f32]| {
        let mut v = v.to_vec();
        v.sort_by(|a, b| b.total_cmp(a));
        v
    };
    for row in 0..got_i.len() / k {
        let at = row * k..(row + 1) * k;
        let far = |a: &[f32], b: &[f32], allowed: &dyn Fn(f32, f32) -> f32| {
            sorted(a).iter().zip(sorted(b)).find(|(x, y)| !((*x - y).abs() <= allowed(**x, *y))).map(|(x, y)| (*x, y))
        };
        if let Some((got, want)) = far(&got_v[at.clone()], &want_v[at.clone()], &|x, y| rel * x.abs().max(y.abs())) {
            return Ok(Some(format!("row {row} chose other experts (a value {got} where the ops chose {want})")));
        }
        if let Some((got, want)) = far(&got_s[at.clone()], &want_s[at], &|_, _| 2.0 * rel) {
            return Ok(Some(format!("row {row}'s scores differ ({got} where the ops give {want})")));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On CUDA the kernel chooses the ops' experts with their scores for every
    /// family's expert count and top-k, each router order, normalized or not,
    /// three dtypes, one row to many (four warps a block, blocks part-filled);
    /// elsewhere it does not serve and the caller runs the ops.
    #[test]
    fn the_router_kernel_routes_as_the_ops_do_on_cuda() {
        let logits = random_logits(&[2, 3, 64], Dtype::Float32, 1).unwrap();
        if gpu_backend() != Some("cuda") {
            assert!(route(&logits, Router::SoftmaxTopKLast, 8, true).unwrap().is_none());
            return;
        }
        let routers = [Router::SoftmaxTopKLast, Router::SoftmaxTopKFirst, Router::TopKThenSoftmax, Router::TopKLastThenSoftmax];
        let mut checked = 0;
        for (seed, (e, k)) in [(8, 2), (60, 4), (64, 8), (128, 8), (256, 8), (512, 10)].into_iter().enumerate() {
            for dtype in [Dtype::Bfloat16, Dtype::Float16, Dtype::Float32] {
                for shape in [vec![1, 1, e], vec![4, 1, e], vec![2, 37, e]] {
                    let logits = random_logits(&shape, dtype, 10 * seed as u64 + shape[1] as u64).unwrap();
                    for router in routers {
                        for norm in [false, true] {
                            let (inds, scores) = route(&logits, router, k, norm).unwrap().expect("the kernel serves on CUDA (else its check failed: the log says why)");
                            assert_eq!(inds.shape(), [&shape[..2], &[k]].concat());
                            assert_eq!(scores.dtype(), dtype);
                            let why = disagreement(&logits, &inds, &scores, router, k, norm).unwrap();
                            assert!(why.is_none(), "{e} experts, top {k}, {dtype:?}, {shape:?}, {router:?}, norm {norm}: {}", why.unwrap());
                            checked += 1;
                        }
                    }
                }
            }
        }
        eprintln!("{checked} routings agree with MLX's ops");
    }

    /// The start-up check's judge: the ops' own routing in another order
    /// agrees; a score off by more than a rounding, or another expert, does not.
    #[test]
    fn the_check_judges_experts_as_sets_and_scores_within_a_rounding() {
        let logits = random_logits(&[2, 3, 60], Dtype::Bfloat16, 4).unwrap();
        let (inds, scores) = route_with_ops(&logits, Router::SoftmaxTopKLast, 4, true).unwrap();
        let reversed = |a: &Array| ops::take(a, &Array::from_slice(&[3u32, 2, 1, 0], &[4]).unwrap(), -1).unwrap();
        let (r_inds, r_scores) = (reversed(&inds), reversed(&scores));
        let check = |i: &Array, s: &Array| disagreement(&logits, i, s, Router::SoftmaxTopKLast, 4, true).unwrap();
        assert_eq!(check(&r_inds, &r_scores), None);
        let off = ops::add(&r_scores, &ops::astype(&Array::scalar(0.05f32), Dtype::Bfloat16).unwrap()).unwrap();
        assert!(check(&r_inds, &off).unwrap().contains("scores differ"));
        let twice = ops::concatenate(&[&ops::slice_axis(&r_inds, -1, 0, 1).unwrap(), &ops::slice_axis(&r_inds, -1, 0, 3).unwrap()], -1).unwrap();
        assert!(check(&twice, &r_scores).unwrap().contains("distinct experts"));
        let past = ops::add(&r_inds, &ops::astype(&Array::scalar(60i32), Dtype::Uint32).unwrap()).unwrap();
        assert!(check(&past, &r_scores).unwrap().contains("distinct experts of 60"));
        // Each row's least chosen expert swapped for one the ops did not choose.
        let not_chosen = |row: &[u32]| (0..60u32).find(|x| !row.contains(x)).unwrap();
        let ids = r_inds.to_vec::<u32>().unwrap();
        let other: Vec<u32> = ids.chunks(4).flat_map(|row| [row[0], row[1], row[2], not_chosen(row)]).collect();
        let other = Array::from_slice(&other, &[2, 3, 4]).unwrap();
        assert!(check(&other, &r_scores).unwrap().contains("chose other experts"));
    }

    /// Shapes the kernel does not take go to the ops: more experts than it
    /// holds, a top-k past its registers, integer logits, no rows.
    #[test]
    fn the_router_kernel_leaves_what_it_does_not_fit_to_the_ops() {
        let big = random_logits(&[1, 1, MAX_EXPERTS + 1], Dtype::Float32, 2).unwrap();
        assert!(!fits(&big, 8).unwrap());
        let wide = random_logits(&[1, 1, 64], Dtype::Float32, 3).unwrap();
        assert!(!fits(&wide, MAX_TOP_K + 1).unwrap());
        assert!(!fits(&wide, 65).unwrap());
        assert!(fits(&wide, 8).unwrap());
        assert!(!fits(&ops::astype(&wide, Dtype::Int32).unwrap(), 8).unwrap());
        assert!(!fits(&ops::zeros(&[0, 64], Dtype::Float32).unwrap(), 8).unwrap());
        assert!(route(&big, Router::SoftmaxTopKLast, 8, false).unwrap().is_none());
    }
}
