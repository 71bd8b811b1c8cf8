//! Affine quantization: error bounds, matmuls on quantized weights, the MoE
//! gathered variants, and the Hadamard transform.

use mlx_rs_safe::quantized::{dequantize, gather_mm, gather_qmm, hadamard_transform, quantize, quantized_matmul};
use mlx_rs_safe::{ops, Array};

fn weights(rows: usize, cols: usize, seed: u32) -> Vec<f32> {
    // A deterministic spread of values in about [-1, 1].
    let mut x = seed.wrapping_mul(2654435761).wrapping_add(12345);
    (0..rows * cols)
        .map(|_| {
            x = x.wrapping_mul(1103515245).wrapping_add(12345);
            ((x >> 8) % 2001) as f32 / 1000.0 - 1.0
        })
        .collect()
}

fn arr(v: &[f32], shape: &[i32]) -> Array {
    Array::from_slice(v, shape).unwrap()
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// MLX's affine scheme (mlx/ops.cpp, affine_quantize): per group, step
/// s = (max - min) / (2^bits - 1), then the step is nudged so that the endpoint of
/// larger magnitude (the bias) is an exact multiple of it: s' = edge / round(edge / s).
/// Values within the grid are off by at most s'/2; the far end of the range may
/// fall up to (max - min) - levels·|s'| outside it.
#[test]
fn quantize_dequantize_error_is_within_half_a_step_per_group() {
    let (rows, cols) = (8usize, 256usize);
    let w = weights(rows, cols, 1);
    for &(bits, group) in &[(4, 64), (8, 64), (4, 32), (8, 32)] {
        let (q, s, b) = quantize(&arr(&w, &[8, 256]), group, bits).unwrap();
        assert_eq!(q.shape(), vec![8, 256 * bits / 32]);
        assert_eq!(s.shape(), vec![8, 256 / group]);
        let back = dequantize(&q, &s, Some(&b), group, bits).unwrap().to_vec::<f32>().unwrap();
        let scales = s.to_vec::<f32>().unwrap();
        let levels = ((1 << bits) - 1) as f32;
        for (g, (orig, deq)) in w.chunks(group as usize).zip(back.chunks(group as usize)).enumerate() {
            let lo = orig.iter().cloned().fold(f32::INFINITY, f32::min);
            let hi = orig.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let step = (hi - lo) / levels;
            let edge = if lo.abs() > hi.abs() { lo } else { hi };
            let nudged = (edge / (edge / step).round()).abs();
            assert!((scales[g].abs() - nudged).abs() <= 1e-3 * nudged, "bits {bits} #{g}: scale {} vs {nudged}", scales[g]);
            let clip = ((hi - lo) - levels * nudged).max(0.0);
            let bound = nudged / 2.0 + clip + 1e-3 * nudged;
            let err = max_abs_diff(orig, deq);
            assert!(err <= bound, "bits {bits} group {group} #{g}: error {err} > {bound}");
            // And never worse than a whole unnudged step.
            assert!(err <= step * 1.01, "bits {bits} group {group} #{g}: error {err} > step {step}");
        }
    }
}

#[test]
fn quantized_matmul_equals_matmul_with_the_dequantized_weight() {
    let w = weights(32, 128, 2);
    let x = weights(3, 128, 3);
    let (q, s, b) = quantize(&arr(&w, &[32, 128]), 64, 4).unwrap();
    let xa = arr(&x, &[3, 128]);
    let got = quantized_matmul(&xa, &q, &s, Some(&b), true, 64, 4).unwrap().to_vec::<f32>().unwrap();
    let deq = dequantize(&q, &s, Some(&b), 64, 4).unwrap();
    let expect = ops::matmul(&xa, &ops::transpose(&deq).unwrap()).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(got.len(), 3 * 32);
    // The reference matmul runs in TF32 on a GPU (10-bit mantissa): allow for it there.
    let on_gpu = mlx_rs_safe::Device::default_device().unwrap() == mlx_rs_safe::Device::Gpu;
    let scale = expect.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let tol = if on_gpu { 2e-3 * scale } else { 1e-3 };
    assert!(max_abs_diff(&got, &expect) < tol, "{} (tolerance {tol})", max_abs_diff(&got, &expect));
}

#[test]
fn gather_qmm_equals_a_loop_over_experts() {
    // 4 experts of [16 out, 64 in]; 5 tokens each routed to one expert.
    let (e, out, inp) = (4usize, 16usize, 64usize);
    let w = weights(e * out, inp, 4);
    let (q, s, b) = quantize(&arr(&w, &[4, 16, 64]), 32, 8).unwrap();
    let x = weights(5, inp, 5);
    let routes = [2u32, 0, 3, 2, 1];
    let xa = arr(&x, &[5, 1, 64]);
    let idx = Array::from_slice(&routes, &[5]).unwrap();
    let got = gather_qmm(&xa, &q, &s, Some(&b), None, Some(&idx), true, 32, 8, false).unwrap();
    assert_eq!(got.shape(), vec![5, 1, 16]);
    let got = got.to_vec::<f32>().unwrap();
    for (t, &r) in routes.iter().enumerate() {
        let pick = |a: &Array| ops::take(a, &Array::from_slice(&[r], &[1]).unwrap(), 0).unwrap();
        let (qe, se, be) = (pick(&q), pick(&s), pick(&b));
        let xt = arr(&x[t * inp..(t + 1) * inp], &[1, 64]);
        let one = quantized_matmul(&xt, &ops::squeeze(&qe, &[0]).unwrap(), &ops::squeeze(&se, &[0]).unwrap(),
            Some(&ops::squeeze(&be, &[0]).unwrap()), true, 32, 8).unwrap().to_vec::<f32>().unwrap();
        let diff = max_abs_diff(&got[t * out..(t + 1) * out], &one);
        assert!(diff < 1e-4, "token {t} (expert {r}): {diff}");
    }
}

#[test]
fn gather_mm_equals_per_expert_matmul() {
    let a = weights(3, 8, 6);
    let bmat = weights(2 * 8, 4, 7);
    let aa = arr(&a, &[3, 1, 8]);
    let ba = arr(&bmat, &[2, 8, 4]);
    let routes = [1u32, 0, 1];
    let got = gather_mm(&aa, &ba, None, Some(&Array::from_slice(&routes, &[3]).unwrap()), false)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    for (t, &r) in routes.iter().enumerate() {
        for c in 0..4 {
            let expect: f32 = (0..8).map(|k| a[t * 8 + k] * bmat[r as usize * 32 + k * 4 + c]).sum();
            assert!((got[t * 4 + c] - expect).abs() < 1e-5);
        }
    }
}

#[test]
fn hadamard_transform_matches_the_sylvester_matrix() {
    let x = [1.0f32, 2.0, -1.0, 0.5];
    let h = [[1.0f32, 1.0, 1.0, 1.0], [1.0, -1.0, 1.0, -1.0], [1.0, 1.0, -1.0, -1.0], [1.0, -1.0, -1.0, 1.0]];
    let got = hadamard_transform(&arr(&x, &[1, 4]), None).unwrap().to_vec::<f32>().unwrap();
    for i in 0..4 {
        let expect: f32 = (0..4).map(|j| h[i][j] * x[j]).sum::<f32>() / 2.0;
        assert!((got[i] - expect).abs() < 1e-6, "{i}: {} vs {expect}", got[i]);
    }
    let unscaled = hadamard_transform(&arr(&x, &[1, 4]), Some(1.0)).unwrap().to_vec::<f32>().unwrap();
    assert!((unscaled[0] - 2.5).abs() < 1e-6);
}

#[test]
fn bad_group_sizes_and_shapes_are_errors() {
    let w = arr(&weights(4, 48, 8), &[4, 48]);
    let err = quantize(&w, 64, 4).unwrap_err().to_string();
    assert!(err.starts_with("mlx: "), "{err}");
    let (q, s, b) = quantize(&arr(&weights(4, 64, 9), &[4, 64]), 64, 4).unwrap();
    let x = arr(&weights(2, 32, 10), &[2, 32]);
    assert!(quantized_matmul(&x, &q, &s, Some(&b), true, 64, 4).is_err());
    // The process carries on.
    assert_eq!(dequantize(&q, &s, Some(&b), 64, 4).unwrap().shape(), vec![4, 64]);
}
