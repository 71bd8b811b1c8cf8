//! Affine quantization: error bounds, matmuls on quantized weights, the MoE
//! gathered variants, and the Hadamard transform.

use mlx_rs_safe::quantized::{
    dequantize, dequantize_with, gather_mm, gather_qmm, gather_qmm_with, hadamard_transform, quantize, quantize_with,
    quantized_matmul, quantized_matmul_with, QuantMode, QuantSpec,
};
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

    // n = 8, two rows: H8[i][j] = (-1)^popcount(i & j), scaled by 1/√8.
    let x8 = weights(2, 8, 11);
    let got = hadamard_transform(&arr(&x8, &[2, 8]), None).unwrap().to_vec::<f32>().unwrap();
    for r in 0..2 {
        for i in 0..8usize {
            let expect: f32 = (0..8usize)
                .map(|j| if (i & j).count_ones() % 2 == 0 { x8[r * 8 + j] } else { -x8[r * 8 + j] })
                .sum::<f32>()
                / 8f32.sqrt();
            assert!((got[r * 8 + i] - expect).abs() < 1e-5, "row {r} #{i}: {} vs {expect}", got[r * 8 + i]);
        }
    }
}

#[test]
fn mxfp4_holds_e2m1_values_exactly_and_has_no_biases() {
    // Every group has max |x| = 6 (e2m1's largest), so its power-of-two scale is
    // 1 and each value below is representable: the round trip is exact.
    let grid = [0.0f32, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
    let w: Vec<f32> = (0..4 * 64)
        .map(|i| if i % 32 == 0 { 6.0 } else if i % 3 == 0 { -grid[i % 8] } else { grid[(i * 5) % 8] })
        .collect();
    let spec = QuantSpec::default_for(QuantMode::Mxfp4);
    assert_eq!((spec.group_size, spec.bits, spec.mode.as_str()), (32, 4, "mxfp4"));
    let (q, s, b) = quantize_with(&arr(&w, &[4, 64]), spec).unwrap();
    assert!(b.is_none());
    assert_eq!(q.shape(), vec![4, 64 * 4 / 32]);
    assert_eq!(s.shape(), vec![4, 2]);
    let back = dequantize_with(&q, &s, None, spec, Some(mlx_rs_safe::Dtype::Float32)).unwrap();
    assert_eq!(back.to_vec::<f32>().unwrap(), w);
    // Scales are e8m0 bytes; without a dtype the float modes dequantize to bf16.
    assert_eq!((q.dtype(), s.dtype()), (mlx_rs_safe::Dtype::Uint32, mlx_rs_safe::Dtype::Uint8));
    assert_eq!(dequantize_with(&q, &s, None, spec, None).unwrap().dtype(), mlx_rs_safe::Dtype::Bfloat16);

    // Matmul on the packed weight equals matmul with the dequantized one.
    let x = weights(2, 64, 12);
    let xa = arr(&x, &[2, 64]);
    let got = quantized_matmul_with(&xa, &q, &s, None, true, spec).unwrap().to_vec::<f32>().unwrap();
    for t in 0..2 {
        for o in 0..4 {
            let expect: f32 = (0..64).map(|k| x[t * 64 + k] * w[o * 64 + k]).sum();
            assert!((got[t * 4 + o] - expect).abs() < 1e-3, "{t},{o}: {} vs {expect}", got[t * 4 + o]);
        }
    }
}

#[test]
fn mxfp8_error_is_within_e4m3_precision() {
    let w = weights(4, 64, 13);
    let spec = QuantSpec::default_for(QuantMode::Mxfp8);
    let (q, s, b) = quantize_with(&arr(&w, &[4, 64]), spec).unwrap();
    assert!(b.is_none());
    let back = dequantize_with(&q, &s, None, spec, Some(mlx_rs_safe::Dtype::Float32)).unwrap().to_vec::<f32>().unwrap();
    for (g, (orig, deq)) in w.chunks(32).zip(back.chunks(32)).enumerate() {
        let amax = orig.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        for (o, d) in orig.iter().zip(deq) {
            // e4m3 has 3 mantissa bits: rounding is off by at most 1/16 of the
            // value; values tiny next to the group max may sit in the subnormals.
            assert!((o - d).abs() <= o.abs() / 16.0 + amax / 512.0, "group {g}: {o} -> {d}");
        }
    }
}

#[test]
fn affine_spec_variants_agree_with_the_plain_functions() {
    let w = arr(&weights(8, 64, 14), &[8, 64]);
    let spec = QuantSpec::affine(32, 8);
    assert!(spec.mode.has_biases() && !QuantMode::Nvfp4.has_biases());
    let (q1, s1, b1) = quantize(&w, 32, 8).unwrap();
    let (q2, s2, b2) = quantize_with(&w, spec).unwrap();
    let b2 = b2.unwrap();
    assert_eq!(q1.to_vec::<u32>().unwrap(), q2.to_vec::<u32>().unwrap());
    assert_eq!(s1.to_vec::<f32>().unwrap(), s2.to_vec::<f32>().unwrap());
    assert_eq!(b1.to_vec::<f32>().unwrap(), b2.to_vec::<f32>().unwrap());
    let stacked = ops::reshape(&w, &[2, 4, 64]).unwrap();
    let (q, s, b) = quantize(&stacked, 32, 8).unwrap();
    let x = arr(&weights(3, 64, 15), &[3, 1, 64]);
    let idx = Array::from_slice(&[1u32, 0, 1], &[3]).unwrap();
    let plain = gather_qmm(&x, &q, &s, Some(&b), None, Some(&idx), true, 32, 8, false).unwrap();
    let with = gather_qmm_with(&x, &q, &s, Some(&b), None, Some(&idx), true, spec, false).unwrap();
    assert_eq!(plain.to_vec::<f32>().unwrap(), with.to_vec::<f32>().unwrap());
}

#[test]
fn bad_group_sizes_and_shapes_are_errors() {
    let w = arr(&weights(4, 48, 8), &[4, 48]);
    let err = quantize(&w, 64, 4).unwrap_err().to_string();
    assert!(err.starts_with("mlx: "), "{err}");
    let (q, s, b) = quantize(&arr(&weights(4, 64, 9), &[4, 64]), 64, 4).unwrap();
    let x = arr(&weights(2, 32, 10), &[2, 32]);
    assert!(quantized_matmul(&x, &q, &s, Some(&b), true, 64, 4).is_err());
    // Affine without biases, and an unsupported bit width for a float mode.
    assert!(dequantize(&q, &s, None, 64, 4).and_then(|a| a.eval()).is_err());
    let fp = QuantSpec { group_size: 32, bits: 3, mode: QuantMode::Mxfp4 };
    assert!(quantize_with(&arr(&weights(2, 64, 16), &[2, 64]), fp).is_err());
    // The process carries on.
    assert_eq!(dequantize(&q, &s, Some(&b), 64, 4).unwrap().shape(), vec![4, 64]);
}
