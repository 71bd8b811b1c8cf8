//! Elementwise math ops against hand-computed values.

use mlx_rs_safe::{ops, Array, Dtype, Error};

fn f(a: &Array) -> Vec<f32> {
    a.to_vec::<f32>().unwrap()
}

fn b(a: &Array) -> Vec<bool> {
    a.to_vec::<bool>().unwrap()
}

fn close(got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() <= tol, "{got:?} vs {want:?}");
    }
}

fn fv(v: &[f32]) -> Array {
    Array::from_vec(v).unwrap()
}

fn m23() -> Array {
    Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap()
}

#[test]
fn arithmetic_broadcasts_rows() {
    let a = m23();
    let row = fv(&[10.0, 20.0, 30.0]);
    let s = ops::add(&a, &row).unwrap();
    assert_eq!(s.shape(), vec![2, 3]);
    assert_eq!(f(&s), vec![11.0, 22.0, 33.0, 14.0, 25.0, 36.0]);
    assert_eq!(
        f(&ops::subtract(&row, &a).unwrap()),
        vec![9.0, 18.0, 27.0, 6.0, 15.0, 24.0]
    );
    let col = Array::from_slice(&[2.0f32, 3.0], &[2, 1]).unwrap();
    assert_eq!(
        f(&ops::multiply(&a, &col).unwrap()),
        vec![2.0, 4.0, 6.0, 12.0, 15.0, 18.0]
    );
    assert_eq!(
        f(&ops::divide(&a, &col).unwrap()),
        vec![0.5, 1.0, 1.5, 4.0 / 3.0, 5.0 / 3.0, 2.0]
    );
    // A 0-d scalar broadcasts against anything.
    let two = Array::scalar(2.0f32);
    assert_eq!(
        f(&ops::power(&a, &two).unwrap()),
        vec![1.0, 4.0, 9.0, 16.0, 25.0, 36.0]
    );
    assert_eq!(
        f(&ops::power(&two, &fv(&[3.0, -1.0])).unwrap()),
        vec![8.0, 0.5]
    );
}

#[test]
fn integer_division_remainder_and_extrema() {
    let a = Array::from_vec(&[7i32, -7, 7, -7]).unwrap();
    let d = Array::from_vec(&[2i32, 2, -2, -2]).unwrap();
    // True division of ints gives float32.
    let q = ops::divide(&a, &d).unwrap();
    assert_eq!(q.dtype(), Dtype::Float32);
    assert_eq!(f(&q), vec![3.5, -3.5, -3.5, 3.5]);
    let fd = ops::floor_divide(&a, &d).unwrap();
    assert_eq!(fd.dtype(), Dtype::Int32);
    assert_eq!(fd.to_vec::<i32>().unwrap(), vec![3, -4, -4, 3]);
    // Remainder takes the divisor's sign (numpy `%`).
    let r = ops::remainder(&a, &Array::from_vec(&[3i32, 3, -3, -3]).unwrap()).unwrap();
    assert_eq!(r.to_vec::<i32>().unwrap(), vec![1, 2, -2, -1]);
    let x = fv(&[1.0, 5.0, 3.0]);
    let y = fv(&[4.0, 2.0, 3.0]);
    assert_eq!(f(&ops::maximum(&x, &y).unwrap()), vec![4.0, 5.0, 3.0]);
    assert_eq!(f(&ops::minimum(&x, &y).unwrap()), vec![1.0, 2.0, 3.0]);
    // Mixed int/float promotes to float.
    let m = ops::maximum(
        &Array::from_vec(&[1i32, 9]).unwrap(),
        &Array::scalar(2.5f32),
    )
    .unwrap();
    assert_eq!(m.dtype(), Dtype::Float32);
    assert_eq!(f(&m), vec![2.5, 9.0]);
}

#[test]
fn bitwise_ops_and_shifts_pack_small_integers() {
    let a = Array::from_vec(&[0b1100u8, 0b1010, 3, 255]).unwrap();
    let b = Array::from_vec(&[0b1010u8, 0b0110, 1, 15]).unwrap();
    assert_eq!(ops::bitwise_and(&a, &b).unwrap().to_vec::<u8>().unwrap(), vec![0b1000, 0b0010, 1, 15]);
    assert_eq!(ops::bitwise_or(&a, &b).unwrap().to_vec::<u8>().unwrap(), vec![0b1110, 0b1110, 3, 255]);
    let shift = Array::from_vec(&[4u8, 2, 6, 4]).unwrap();
    assert_eq!(ops::left_shift(&b, &shift).unwrap().to_vec::<u8>().unwrap(), vec![0b1010_0000, 0b1_1000, 64, 240]);
    assert_eq!(ops::right_shift(&a, &shift).unwrap().to_vec::<u8>().unwrap(), vec![0, 0b10, 0, 15]);
}

#[test]
fn comparisons_and_logic_give_bools() {
    let x = fv(&[1.0, 2.0, 3.0]);
    let two = Array::scalar(2.0f32);
    let eq = ops::equal(&x, &two).unwrap();
    assert_eq!(eq.dtype(), Dtype::Bool);
    assert_eq!(b(&eq), vec![false, true, false]);
    assert_eq!(
        b(&ops::not_equal(&x, &two).unwrap()),
        vec![true, false, true]
    );
    assert_eq!(b(&ops::less(&x, &two).unwrap()), vec![true, false, false]);
    assert_eq!(
        b(&ops::less_equal(&x, &two).unwrap()),
        vec![true, true, false]
    );
    assert_eq!(
        b(&ops::greater(&x, &two).unwrap()),
        vec![false, false, true]
    );
    assert_eq!(
        b(&ops::greater_equal(&x, &two).unwrap()),
        vec![false, true, true]
    );
    let p = Array::from_vec(&[true, true, false, false]).unwrap();
    let q = Array::from_vec(&[true, false, true, false]).unwrap();
    assert_eq!(
        b(&ops::logical_and(&p, &q).unwrap()),
        vec![true, false, false, false]
    );
    assert_eq!(
        b(&ops::logical_or(&p, &q).unwrap()),
        vec![true, true, true, false]
    );
    assert_eq!(
        b(&ops::logical_not(&p).unwrap()),
        vec![false, false, true, true]
    );
    // Column vs row comparison broadcasts to a matrix.
    let col = Array::from_slice(&[1.0f32, 3.0], &[2, 1]).unwrap();
    let g = ops::greater(&col, &x).unwrap();
    assert_eq!(g.shape(), vec![2, 3]);
    assert_eq!(b(&g), vec![false, false, false, true, true, false]);
}

#[test]
fn where_selects_with_broadcasting() {
    let cond = Array::from_slice(&[true, false, false, true], &[2, 2]).unwrap();
    let x = fv(&[1.0, 2.0]);
    let y = Array::scalar(-1.0f32);
    let w = ops::where_(&cond, &x, &y).unwrap();
    assert_eq!(w.shape(), vec![2, 2]);
    assert_eq!(f(&w), vec![1.0, -1.0, -1.0, 2.0]);
}

#[test]
fn unary_functions() {
    let x = fv(&[-2.0, 0.0, 3.0]);
    assert_eq!(f(&ops::abs(&x).unwrap()), vec![2.0, 0.0, 3.0]);
    assert_eq!(f(&ops::negative(&x).unwrap()), vec![2.0, 0.0, -3.0]);
    assert_eq!(f(&ops::sign(&x).unwrap()), vec![-1.0, 0.0, 1.0]);
    assert_eq!(f(&ops::square(&x).unwrap()), vec![4.0, 0.0, 9.0]);
    let p = fv(&[4.0, 9.0, 0.25]);
    close(&f(&ops::sqrt(&p).unwrap()), &[2.0, 3.0, 0.5], 1e-6);
    close(&f(&ops::rsqrt(&p).unwrap()), &[0.5, 1.0 / 3.0, 2.0], 1e-6);
    close(
        &f(&ops::reciprocal(&p).unwrap()),
        &[0.25, 1.0 / 9.0, 4.0],
        1e-6,
    );
    let e = std::f32::consts::E;
    close(
        &f(&ops::exp(&fv(&[0.0, 1.0, -1.0])).unwrap()),
        &[1.0, e, 1.0 / e],
        1e-6,
    );
    close(
        &f(&ops::expm1(&fv(&[1e-5, 1.0])).unwrap()),
        &[1.000005e-5, e - 1.0],
        1e-6,
    );
    close(
        &f(&ops::log(&fv(&[1.0, e, e * e])).unwrap()),
        &[0.0, 1.0, 2.0],
        1e-6,
    );
    close(
        &f(&ops::log1p(&fv(&[0.0, 1e-6, e - 1.0])).unwrap()),
        &[0.0, 9.999995e-7, 1.0],
        1e-6,
    );
    close(
        &f(&ops::log2(&fv(&[8.0, 0.5])).unwrap()),
        &[3.0, -1.0],
        1e-6,
    );
    close(
        &f(&ops::log10(&fv(&[1000.0, 0.01])).unwrap()),
        &[3.0, -2.0],
        1e-6,
    );
    let h = std::f32::consts::FRAC_PI_2;
    close(
        &f(&ops::sin(&fv(&[0.0, h, -h])).unwrap()),
        &[0.0, 1.0, -1.0],
        1e-6,
    );
    close(
        &f(&ops::cos(&fv(&[0.0, 2.0 * h])).unwrap()),
        &[1.0, -1.0],
        1e-6,
    );
    close(
        &f(&ops::tanh(&fv(&[0.0, 1.0, -1.0])).unwrap()),
        &[0.0, 0.761_594_2, -0.761_594_2],
        1e-6,
    );
    close(
        &f(&ops::sigmoid(&fv(&[0.0, 3f32.ln(), -(3f32.ln())])).unwrap()),
        &[0.5, 0.75, 0.25],
        1e-6,
    );
    close(
        &f(&ops::erf(&fv(&[0.0, 1.0, -0.5])).unwrap()),
        &[0.0, 0.842_700_8, -0.520_499_9],
        1e-6,
    );
    close(
        &f(&ops::erfinv(&fv(&[0.0, 0.842_700_8])).unwrap()),
        &[0.0, 1.0],
        1e-4,
    );
    let r = fv(&[-1.5, -0.5, 0.5, 1.5, 2.5]);
    assert_eq!(f(&ops::floor(&r).unwrap()), vec![-2.0, -1.0, 0.0, 1.0, 2.0]);
    assert_eq!(f(&ops::ceil(&r).unwrap()), vec![-1.0, -0.0, 1.0, 2.0, 3.0]);
    // Half to even.
    assert_eq!(
        f(&ops::round(&r, 0).unwrap()),
        vec![-2.0, -0.0, 0.0, 2.0, 2.0]
    );
    close(
        &f(&ops::round(&fv(&[1.2345, -2.716]), 2).unwrap()),
        &[1.23, -2.72],
        1e-6,
    );
    close(
        &f(&ops::logaddexp(&fv(&[0.0, 1.0]), &fv(&[0.0, 1.0])).unwrap()),
        &[2f32.ln(), 1.0 + 2f32.ln()],
        1e-6,
    );
}

#[test]
fn nan_and_inf_tests() {
    let x = fv(&[1.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY]);
    assert_eq!(b(&ops::isnan(&x).unwrap()), vec![false, true, false, false]);
    assert_eq!(b(&ops::isinf(&x).unwrap()), vec![false, false, true, true]);
    assert_eq!(
        b(&ops::isfinite(&x).unwrap()),
        vec![true, false, false, false]
    );
    // exp(-inf) is exactly 0, log(0) is -inf.
    assert_eq!(f(&ops::exp(&fv(&[f32::NEG_INFINITY])).unwrap()), vec![0.0]);
    assert_eq!(f(&ops::log(&fv(&[0.0])).unwrap()), vec![f32::NEG_INFINITY]);
}

#[test]
fn clip_with_optional_bounds() {
    let x = fv(&[-2.0, 0.5, 3.0]);
    let lo = Array::scalar(0.0f32);
    let hi = Array::scalar(1.0f32);
    assert_eq!(
        f(&ops::clip(&x, Some(&lo), Some(&hi)).unwrap()),
        vec![0.0, 0.5, 1.0]
    );
    assert_eq!(
        f(&ops::clip(&x, Some(&lo), None).unwrap()),
        vec![0.0, 0.5, 3.0]
    );
    assert_eq!(
        f(&ops::clip(&x, None, Some(&hi)).unwrap()),
        vec![-2.0, 0.5, 1.0]
    );
    // Per-element bounds broadcast.
    let los = fv(&[-3.0, 1.0, 0.0]);
    assert_eq!(
        f(&ops::clip(&x, Some(&los), Some(&hi)).unwrap()),
        vec![-2.0, 1.0, 1.0]
    );
    // No bound at all is MLX's error, and the next op still works.
    let err = ops::clip(&x, None, None).unwrap_err();
    assert!(matches!(err, Error::Mlx(_)), "{err:?}");
    assert!(err.to_string().contains("a_min and a_max"), "{err}");
    assert_eq!(f(&ops::abs(&x).unwrap()), vec![2.0, 0.5, 3.0]);
}

#[test]
fn matmul_and_addmm() {
    let a = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2]).unwrap();
    let b2 = Array::from_slice(&[5.0f32, 6.0, 7.0, 8.0], &[2, 2]).unwrap();
    assert_eq!(
        f(&ops::matmul(&a, &b2).unwrap()),
        vec![19.0, 22.0, 43.0, 50.0]
    );
    // (2,3) @ (3,) -> (2,)
    let v = fv(&[1.0, 0.0, -1.0]);
    let mv = ops::matmul(&m23(), &v).unwrap();
    assert_eq!(mv.shape(), vec![2]);
    assert_eq!(f(&mv), vec![-2.0, -2.0]);
    // Batched: (2,1,2) @ (2,1) broadcasts the matrix over the batch.
    let batch = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 1, 2]).unwrap();
    let col = Array::from_slice(&[10.0f32, 1.0], &[2, 1]).unwrap();
    let bm = ops::matmul(&batch, &col).unwrap();
    assert_eq!(bm.shape(), vec![2, 1, 1]);
    assert_eq!(f(&bm), vec![12.0, 34.0]);
    let c = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2]).unwrap();
    let r = ops::addmm(&c, &a, &b2, 2.0, 0.5).unwrap();
    assert_eq!(f(&r), vec![38.5, 45.0, 87.5, 102.0]);
}

#[test]
fn mismatched_shapes_err_then_recover() {
    let a = m23();
    let b3 = Array::from_slice(&[1.0f32; 4], &[2, 2]).unwrap();
    let err = ops::multiply(&a, &b3).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.starts_with("mlx: ") && msg.contains("broadcast"),
        "{msg}"
    );
    let err = ops::where_(&Array::from_vec(&[true, false]).unwrap(), &a, &a).unwrap_err();
    assert!(err.to_string().contains("broadcast"), "{err}");
    let err = ops::addmm(&a, &a, &a, 1.0, 1.0).unwrap_err();
    assert!(err.to_string().starts_with("mlx: "), "{err}");
    assert_eq!(
        f(&ops::multiply(&a, &a).unwrap()),
        vec![1.0, 4.0, 9.0, 16.0, 25.0, 36.0]
    );
}
