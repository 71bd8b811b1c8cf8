//! fast:: kernels against the same math written out in plain Rust.

use mlx_rs_safe::fast::{self, SdpaMask};
use mlx_rs_safe::{ops, Array, Dtype};

fn arr(v: &[f32], shape: &[i32]) -> Array {
    Array::from_slice(v, shape).unwrap()
}

/// Element-wise closeness. On a GPU, MLX runs float32 matmuls in TF32 (10-bit
/// mantissa), so results there are held to 2e-3 relative instead of `tol`.
fn close(a: &[f32], b: &[f32], tol: f32) {
    assert_eq!(a.len(), b.len());
    let on_gpu = mlx_rs_safe::Device::default_device().unwrap() == mlx_rs_safe::Device::Gpu;
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        let t = if on_gpu { tol.max(2e-3 * y.abs().max(0.1)) } else { tol };
        assert!((x - y).abs() <= t, "element {i}: {x} vs {y}");
    }
}

fn seq(n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|i| ((i * 37 % 17) as f32 - 8.0) * scale).collect()
}

#[test]
fn rms_norm_matches_the_formula() {
    let x = seq(2 * 8, 0.3);
    let w: Vec<f32> = (0..8).map(|i| 0.5 + i as f32 * 0.1).collect();
    let out = fast::rms_norm(&arr(&x, &[2, 8]), Some(&arr(&w, &[8])), 1e-5).unwrap().to_vec::<f32>().unwrap();
    let mut expect = Vec::new();
    for row in x.chunks(8) {
        let ms = row.iter().map(|v| v * v).sum::<f32>() / 8.0;
        let r = 1.0 / (ms + 1e-5).sqrt();
        expect.extend(row.iter().zip(&w).map(|(v, w)| v * r * w));
    }
    close(&out, &expect, 1e-5);
}

#[test]
fn layer_norm_matches_the_formula() {
    let x = seq(3 * 4, 0.7);
    let w = [1.0f32, 2.0, 0.5, -1.0];
    let b = [0.1f32, 0.0, -0.2, 0.3];
    let out = fast::layer_norm(&arr(&x, &[3, 4]), Some(&arr(&w, &[4])), Some(&arr(&b, &[4])), 1e-5)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let mut expect = Vec::new();
    for row in x.chunks(4) {
        let mean = row.iter().sum::<f32>() / 4.0;
        let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / 4.0;
        expect.extend(row.iter().enumerate().map(|(i, v)| (v - mean) / (var + 1e-5).sqrt() * w[i] + b[i]));
    }
    close(&out, &expect, 1e-5);
}

/// Rotary embedding of x [L, D] at positions offset.., written out.
fn rope_ref(x: &[f32], l: usize, d: usize, traditional: bool, base: f32, offset: usize) -> Vec<f32> {
    rope_ref_partial(x, l, d, d, traditional, base, 1.0, offset)
}

/// The first `dims` of `d` features rotated (the rest pass through), angle
/// (position · `scale`) · base^(-2i/dims).
#[allow(clippy::too_many_arguments)]
fn rope_ref_partial(x: &[f32], l: usize, d: usize, dims: usize, traditional: bool, base: f32, scale: f32, offset: usize) -> Vec<f32> {
    let mut out = x.to_vec();
    for p in 0..l {
        for i in 0..dims / 2 {
            let theta = (p + offset) as f32 * scale * base.powf(-2.0 * i as f32 / dims as f32);
            let (a, b) = if traditional { (2 * i, 2 * i + 1) } else { (i, i + dims / 2) };
            let (xa, xb) = (x[p * d + a], x[p * d + b]);
            out[p * d + a] = xa * theta.cos() - xb * theta.sin();
            out[p * d + b] = xa * theta.sin() + xb * theta.cos();
        }
    }
    out
}

#[test]
fn rope_rotates_pairs_by_position_in_both_layouts() {
    let (l, d) = (3, 8);
    let x = seq(l * d, 0.25);
    for traditional in [false, true] {
        for offset in [0, 5] {
            let out = fast::rope(&arr(&x, &[1, 1, l as i32, d as i32]), d as i32, traditional, Some(10000.0), 1.0, offset, None)
                .unwrap()
                .to_vec::<f32>()
                .unwrap();
            close(&out, &rope_ref(&x, l, d, traditional, 10000.0, offset as usize), 1e-4);
        }
    }
    // Frequencies given explicitly equal the base they come from.
    let freqs: Vec<f32> = (0..d / 2).map(|i| 10000f32.powf(2.0 * i as f32 / d as f32)).collect();
    let out = fast::rope(&arr(&x, &[1, 1, l as i32, d as i32]), d as i32, false, None, 1.0, 2, Some(&arr(&freqs, &[4])))
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    close(&out, &rope_ref(&x, l, d, false, 10000.0, 2), 1e-4);
}

/// softmax(q kᵀ · scale + mask) v for one head: q [L, D], k/v [S, D].
#[allow(clippy::too_many_arguments)]
fn attention_ref(q: &[f32], k: &[f32], v: &[f32], l: usize, s: usize, d: usize, scale: f32, mask: impl Fn(usize, usize) -> f32) -> Vec<f32> {
    let mut out = vec![0.0; l * d];
    for i in 0..l {
        let logits: Vec<f32> = (0..s)
            .map(|j| (0..d).map(|c| q[i * d + c] * k[j * d + c]).sum::<f32>() * scale + mask(i, j))
            .collect();
        let m = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let e: Vec<f32> = logits.iter().map(|x| (x - m).exp()).collect();
        let z: f32 = e.iter().sum();
        for c in 0..d {
            out[i * d + c] = (0..s).map(|j| e[j] / z * v[j * d + c]).sum();
        }
    }
    out
}

#[test]
fn sdpa_matches_softmax_attention_with_causal_and_array_masks() {
    let (l, s, d) = (3usize, 5usize, 4usize);
    let q = seq(l * d, 0.2);
    let k: Vec<f32> = seq(s * d + 3, 0.15)[3..].to_vec();
    let v: Vec<f32> = seq(s * d + 7, 0.1)[7..].to_vec();
    let (qa, ka, va) = (arr(&q, &[1, 1, 3, 4]), arr(&k, &[1, 1, 5, 4]), arr(&v, &[1, 1, 5, 4]));
    let scale = 0.5;

    let none = fast::scaled_dot_product_attention(&qa, &ka, &va, scale, SdpaMask::None, None).unwrap();
    close(&none.to_vec::<f32>().unwrap(), &attention_ref(&q, &k, &v, l, s, d, scale, |_, _| 0.0), 1e-5);

    // Causal aligns the queries with the last keys: query i sees keys ≤ i + (s - l).
    let causal = fast::scaled_dot_product_attention(&qa, &ka, &va, scale, SdpaMask::Causal, None).unwrap();
    let expect = attention_ref(&q, &k, &v, l, s, d, scale, |i, j| if j <= i + s - l { 0.0 } else { f32::NEG_INFINITY });
    close(&causal.to_vec::<f32>().unwrap(), &expect, 1e-5);

    let add: Vec<f32> = (0..l * s).map(|i| (i % 4) as f32 * -0.5).collect();
    let masked = fast::scaled_dot_product_attention(&qa, &ka, &va, scale, SdpaMask::Array(&arr(&add, &[3, 5])), None).unwrap();
    close(&masked.to_vec::<f32>().unwrap(), &attention_ref(&q, &k, &v, l, s, d, scale, |i, j| add[i * s + j]), 1e-5);

    let keep: Vec<bool> = (0..l * s).map(|i| i % 3 != 1).collect();
    let bool_mask = Array::from_slice(&keep, &[3, 5]).unwrap();
    let masked = fast::scaled_dot_product_attention(&qa, &ka, &va, scale, SdpaMask::Array(&bool_mask), None).unwrap();
    let expect = attention_ref(&q, &k, &v, l, s, d, scale, |i, j| if keep[i * s + j] { 0.0 } else { f32::NEG_INFINITY });
    close(&masked.to_vec::<f32>().unwrap(), &expect, 1e-5);
}

#[test]
fn rope_partial_dims_position_scale_and_array_offset() {
    let (l, d) = (4, 8);
    let x = seq(l * d, 0.2);
    let xa = arr(&x, &[1, 1, l as i32, d as i32]);
    for traditional in [false, true] {
        // Only the first 4 features rotate; positions are scaled by 0.5.
        let out = fast::rope(&xa, 4, traditional, Some(500.0), 0.5, 3, None).unwrap().to_vec::<f32>().unwrap();
        close(&out, &rope_ref_partial(&x, l, d, 4, traditional, 500.0, 0.5, 3), 1e-4);
        for (p, row) in out.chunks(d).enumerate() {
            assert_eq!(&row[4..], &x[p * d + 4..(p + 1) * d], "features past dims are untouched");
        }
        // The offset as an array gives what the integer offset gives.
        let off = Array::scalar(7i32);
        let dynamic = fast::rope_dynamic(&xa, d as i32, traditional, Some(10000.0), 1.0, &off, None)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        close(&dynamic, &rope_ref(&x, l, d, traditional, 10000.0, 7), 1e-4);
    }
}

#[test]
fn norms_without_affine_parameters() {
    let x = seq(2 * 6, 0.4);
    let xa = arr(&x, &[2, 6]);
    let rms = fast::rms_norm(&xa, None, 1e-6).unwrap().to_vec::<f32>().unwrap();
    let ln = fast::layer_norm(&xa, None, None, 1e-6).unwrap().to_vec::<f32>().unwrap();
    for (r, row) in x.chunks(6).enumerate() {
        let ms = row.iter().map(|v| v * v).sum::<f32>() / 6.0;
        let mean = row.iter().sum::<f32>() / 6.0;
        let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / 6.0;
        for (i, v) in row.iter().enumerate() {
            assert!((rms[r * 6 + i] - v / (ms + 1e-6).sqrt()).abs() < 1e-5);
            assert!((ln[r * 6 + i] - (v - mean) / (var + 1e-6).sqrt()).abs() < 1e-5);
        }
    }
}

#[test]
fn attention_sinks_join_the_softmax_denominator() {
    // 2 heads, one sink logit each: p_j = e^(s_j) / (e^sink + Σ e^(s_k)).
    let (h, l, s, d) = (2usize, 2usize, 3usize, 4usize);
    let q = seq(h * l * d, 0.2);
    let k = seq(h * s * d + 2, 0.1)[2..].to_vec();
    let v = seq(h * s * d + 9, 0.3)[9..].to_vec();
    let sinks = [0.7f32, -1.5];
    let out = fast::scaled_dot_product_attention(
        &arr(&q, &[1, 2, 2, 4]),
        &arr(&k, &[1, 2, 3, 4]),
        &arr(&v, &[1, 2, 3, 4]),
        0.5,
        SdpaMask::Causal,
        Some(&arr(&sinks, &[2])),
    )
    .unwrap()
    .to_vec::<f32>()
    .unwrap();
    for hh in 0..h {
        let (qh, kh, vh) = (&q[hh * l * d..][..l * d], &k[hh * s * d..][..s * d], &v[hh * s * d..][..s * d]);
        for i in 0..l {
            let logits: Vec<f32> = (0..s)
                .map(|j| if j <= i + s - l { (0..d).map(|c| qh[i * d + c] * kh[j * d + c]).sum::<f32>() * 0.5 } else { f32::NEG_INFINITY })
                .collect();
            let m = logits.iter().cloned().fold(sinks[hh], f32::max);
            let z = (sinks[hh] - m).exp() + logits.iter().map(|x| (x - m).exp()).sum::<f32>();
            for c in 0..d {
                let expect: f32 = (0..s).map(|j| (logits[j] - m).exp() / z * vh[j * d + c]).sum();
                let got = out[(hh * l + i) * d + c];
                assert!((got - expect).abs() < 1e-5, "head {hh} query {i} feature {c}: {got} vs {expect}");
            }
        }
    }
}

#[test]
fn grouped_kv_heads_share_keys_between_query_heads() {
    // 4 query heads over 2 kv heads: heads 0,1 use kv 0; heads 2,3 use kv 1.
    let (l, s, d) = (2usize, 3usize, 4usize);
    let q = seq(4 * l * d, 0.1);
    let k = seq(2 * s * d, 0.2);
    let v = seq(2 * s * d + 5, 0.3)[5..].to_vec();
    let out = fast::scaled_dot_product_attention(
        &arr(&q, &[1, 4, 2, 4]),
        &arr(&k, &[1, 2, 3, 4]),
        &arr(&v, &[1, 2, 3, 4]),
        0.5,
        SdpaMask::None,
        None,
    )
    .unwrap()
    .to_vec::<f32>()
    .unwrap();
    for h in 0..4 {
        let kv = h / 2;
        let expect = attention_ref(
            &q[h * l * d..(h + 1) * l * d],
            &k[kv * s * d..(kv + 1) * s * d],
            &v[kv * s * d..(kv + 1) * s * d],
            l,
            s,
            d,
            0.5,
            |_, _| 0.0,
        );
        close(&out[h * l * d..(h + 1) * l * d], &expect, 1e-5);
    }
}

#[test]
fn mismatched_shapes_are_errors_and_the_next_call_works() {
    let q = arr(&seq(8, 0.1), &[1, 1, 2, 4]);
    let k = arr(&seq(9, 0.1), &[1, 1, 3, 3]);
    assert!(fast::scaled_dot_product_attention(&q, &k, &k, 1.0, SdpaMask::None, None).is_err());
    let w = arr(&[1.0; 3], &[3]);
    let err = fast::rms_norm(&q, Some(&w), 1e-5).unwrap_err().to_string();
    assert!(err.starts_with("mlx: "), "{err}");
    let ok = fast::rms_norm(&ops::astype(&q, Dtype::Float32).unwrap(), None, 1e-5).unwrap();
    assert_eq!(ok.shape(), vec![1, 1, 2, 4]);
    // A bias of the wrong length, and more query heads than a multiple of kv heads.
    assert!(fast::layer_norm(&q, None, Some(&w), 1e-5).is_err());
    let q3 = arr(&seq(3 * 8, 0.1), &[1, 3, 2, 4]);
    let k2 = arr(&seq(2 * 8, 0.1), &[1, 2, 2, 4]);
    let err = fast::scaled_dot_product_attention(&q3, &k2, &k2, 1.0, SdpaMask::None, None).unwrap_err();
    assert!(err.to_string().starts_with("mlx: "), "{err}");
    assert!(ok.to_vec::<f32>().is_ok());
}
