//! Reductions, softmax and scans against hand-computed values.

use mlx_rs_safe::{ops, Array, Dtype, Error};

fn f(a: &Array) -> Vec<f32> {
    a.to_vec::<f32>().unwrap()
}

fn u(a: &Array) -> Vec<u32> {
    a.to_vec::<u32>().unwrap()
}

fn close(got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() <= tol, "{got:?} vs {want:?}");
    }
}

/// [[1, 2, 3], [4, 5, 6]]
fn m23() -> Array {
    Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap()
}

#[test]
fn sum_over_axes_keepdims_and_all() {
    let a = m23();
    let s0 = ops::sum(&a, &[0], false).unwrap();
    assert_eq!((s0.shape(), f(&s0)), (vec![3], vec![5.0, 7.0, 9.0]));
    let s1 = ops::sum(&a, &[-1], true).unwrap();
    assert_eq!((s1.shape(), f(&s1)), (vec![2, 1], vec![6.0, 15.0]));
    let both = ops::sum(&a, &[0, 1], false).unwrap();
    assert_eq!((both.shape(), f(&both)), (vec![], vec![21.0]));
    // No axes: nothing reduced.
    assert_eq!(ops::sum(&a, &[], false).unwrap().shape(), vec![2, 3]);
    let all = ops::sum_all(&a, false).unwrap();
    assert_eq!((all.shape(), all.item::<f32>().unwrap()), (vec![], 21.0));
    assert_eq!(ops::sum_all(&a, true).unwrap().shape(), vec![1, 1]);
    // Integer sums stay integer.
    let i = Array::from_vec(&[1i32, 2, 3]).unwrap();
    assert_eq!(ops::sum_all(&i, false).unwrap().item::<i32>().unwrap(), 6);
}

#[test]
fn mean_max_min_prod() {
    let a = m23();
    assert_eq!(f(&ops::mean(&a, &[1], false).unwrap()), vec![2.0, 5.0]);
    assert_eq!(
        f(&ops::mean(&a, &[-2], false).unwrap()),
        vec![2.5, 3.5, 4.5]
    );
    assert_eq!(
        ops::mean_all(&a, false).unwrap().item::<f32>().unwrap(),
        3.5
    );
    assert_eq!(f(&ops::max(&a, &[0], false).unwrap()), vec![4.0, 5.0, 6.0]);
    let mk = ops::max(&a, &[1], true).unwrap();
    assert_eq!((mk.shape(), f(&mk)), (vec![2, 1], vec![3.0, 6.0]));
    assert_eq!(ops::max_all(&a, false).unwrap().item::<f32>().unwrap(), 6.0);
    assert_eq!(f(&ops::min(&a, &[-1], false).unwrap()), vec![1.0, 4.0]);
    assert_eq!(ops::min_all(&a, false).unwrap().item::<f32>().unwrap(), 1.0);
    assert_eq!(f(&ops::prod(&a, &[1], false).unwrap()), vec![6.0, 120.0]);
    assert_eq!(
        ops::prod_all(&a, false).unwrap().item::<f32>().unwrap(),
        720.0
    );
    let v = Array::from_vec(&[1.0f32, 2.0, 3.0, 4.0]).unwrap();
    close(&f(&ops::var(&v, &[0], false, 0).unwrap()), &[1.25], 1e-6);
    close(
        &f(&ops::var(&v, &[0], false, 1).unwrap()),
        &[5.0 / 3.0],
        1e-6,
    );
    close(
        &f(&ops::std(&v, &[-1], true, 0).unwrap()),
        &[1.25f32.sqrt()],
        1e-6,
    );
}

#[test]
fn logsumexp_is_log_of_sum_of_exp() {
    let (l2, l3) = (2f32.ln(), 3f32.ln());
    let a = Array::from_slice(&[0.0f32, l3, l2, l2], &[2, 2]).unwrap();
    close(
        &f(&ops::logsumexp(&a, &[1], false).unwrap()),
        &[4f32.ln(), 4f32.ln()],
        1e-6,
    );
    close(
        &f(&ops::logsumexp(&a, &[0], false).unwrap()),
        &[3f32.ln(), 5f32.ln()],
        1e-6,
    );
    close(
        &f(&ops::logsumexp_all(&a, false).unwrap()),
        &[8f32.ln()],
        1e-6,
    );
    // Stable for large inputs: log(2 e^1000) = 1000 + ln 2.
    let big = Array::from_vec(&[1000.0f32, 1000.0]).unwrap();
    close(
        &f(&ops::logsumexp(&big, &[0], false).unwrap()),
        &[1000.0 + l2],
        1e-3,
    );
}

#[test]
fn all_and_any() {
    let a = Array::from_slice(&[true, false, true, true], &[2, 2]).unwrap();
    let al = ops::all(&a, &[1], false).unwrap();
    assert_eq!(al.dtype(), Dtype::Bool);
    assert_eq!(al.to_vec::<bool>().unwrap(), vec![false, true]);
    assert_eq!(
        ops::any(&a, &[0], false).unwrap().to_vec::<bool>().unwrap(),
        vec![true, true]
    );
    let n = Array::from_slice(&[0.0f32, 0.0, 0.0, 2.0], &[2, 2]).unwrap();
    let an = ops::any(&n, &[-1], true).unwrap();
    assert_eq!(
        (an.shape(), an.to_vec::<bool>().unwrap()),
        (vec![2, 1], vec![false, true])
    );
    assert!(!ops::all_all(&a, false).unwrap().item::<bool>().unwrap());
    assert!(ops::any_all(&a, false).unwrap().item::<bool>().unwrap());
}

#[test]
fn argmax_argmin_first_on_ties() {
    let a = Array::from_slice(&[1.0f32, 9.0, 3.0, 7.0, 2.0, 7.0], &[2, 3]).unwrap();
    let am = ops::argmax(&a, 1, false).unwrap();
    assert_eq!(am.dtype(), Dtype::Uint32);
    assert_eq!(u(&am), vec![1, 0]);
    assert_eq!(u(&ops::argmax(&a, -2, false).unwrap()), vec![1, 0, 1]);
    let ak = ops::argmax(&a, -1, true).unwrap();
    assert_eq!((ak.shape(), u(&ak)), (vec![2, 1], vec![1, 0]));
    assert_eq!(u(&ops::argmin(&a, 1, false).unwrap()), vec![0, 1]);
    assert_eq!(u(&ops::argmin(&a, 0, false).unwrap()), vec![0, 1, 0]);
    assert_eq!(
        ops::argmax_all(&a, false).unwrap().item::<u32>().unwrap(),
        1
    );
    assert_eq!(
        ops::argmin_all(&a, false).unwrap().item::<u32>().unwrap(),
        0
    );
}

#[test]
fn softmax_over_axes() {
    let l3 = 3f32.ln();
    let a = Array::from_slice(&[0.0f32, l3, 0.0, 0.0], &[2, 2]).unwrap();
    close(
        &f(&ops::softmax(&a, &[-1], false).unwrap()),
        &[0.25, 0.75, 0.5, 0.5],
        1e-6,
    );
    // Over axis 0: column 0 is [0, 0], column 1 is [ln3, 0].
    close(
        &f(&ops::softmax(&a, &[0], true).unwrap()),
        &[0.5, 0.75, 0.5, 0.25],
        1e-6,
    );
    close(
        &f(&ops::softmax(&a, &[0, 1], false).unwrap()),
        &[1.0 / 6.0, 0.5, 1.0 / 6.0, 1.0 / 6.0],
        1e-6,
    );
    close(
        &f(&ops::softmax_all(&a, false).unwrap()),
        &[1.0 / 6.0, 0.5, 1.0 / 6.0, 1.0 / 6.0],
        1e-6,
    );
    // -inf gets exactly zero weight; precise on float16 keeps the dtype.
    let h = ops::astype(
        &Array::from_vec(&[f32::NEG_INFINITY, 0.0, l3]).unwrap(),
        Dtype::Float16,
    )
    .unwrap();
    let sh = ops::softmax(&h, &[0], true).unwrap();
    assert_eq!(sh.dtype(), Dtype::Float16);
    close(
        &f(&ops::astype(&sh, Dtype::Float32).unwrap()),
        &[0.0, 0.25, 0.75],
        1e-3,
    );
}

#[test]
fn cumulative_scans() {
    let v = Array::from_vec(&[1.0f32, 2.0, 3.0, 4.0]).unwrap();
    assert_eq!(
        f(&ops::cumsum(&v, 0, false, true).unwrap()),
        vec![1.0, 3.0, 6.0, 10.0]
    );
    assert_eq!(
        f(&ops::cumsum(&v, 0, false, false).unwrap()),
        vec![0.0, 1.0, 3.0, 6.0]
    );
    assert_eq!(
        f(&ops::cumsum(&v, -1, true, true).unwrap()),
        vec![10.0, 9.0, 7.0, 4.0]
    );
    assert_eq!(
        f(&ops::cumsum(&v, 0, true, false).unwrap()),
        vec![9.0, 7.0, 4.0, 0.0]
    );
    let m = Array::from_slice(&[1i32, 2, 3, 4, 5, 6], &[2, 3]).unwrap();
    let c0 = ops::cumsum(&m, 0, false, true).unwrap();
    assert_eq!(c0.to_vec::<i32>().unwrap(), vec![1, 2, 3, 5, 7, 9]);
    let c1 = ops::cumsum(&m, -1, false, true).unwrap();
    assert_eq!(c1.to_vec::<i32>().unwrap(), vec![1, 3, 6, 4, 9, 15]);
    assert_eq!(
        f(&ops::cumprod(&v, 0, false, true).unwrap()),
        vec![1.0, 2.0, 6.0, 24.0]
    );
    let w = Array::from_vec(&[1.0f32, 3.0, 2.0, 5.0]).unwrap();
    assert_eq!(
        f(&ops::cummax(&w, 0, false, true).unwrap()),
        vec![1.0, 3.0, 3.0, 5.0]
    );
    let z = Array::from_vec(&[0.0f32, 0.0, 0.0]).unwrap();
    close(
        &f(&ops::logcumsumexp(&z, 0, false, true).unwrap()),
        &[0.0, 2f32.ln(), 3f32.ln()],
        1e-6,
    );
}

#[test]
fn bad_axis_errs_then_recovers() {
    let a = m23();
    for err in [
        ops::sum(&a, &[2], false).unwrap_err(),
        ops::mean(&a, &[-3], true).unwrap_err(),
        ops::argmax(&a, 5, false).unwrap_err(),
        ops::softmax(&a, &[3], false).unwrap_err(),
        ops::cumsum(&a, 2, false, true).unwrap_err(),
    ] {
        assert!(matches!(err, Error::Mlx(_)), "{err:?}");
        assert!(err.to_string().to_lowercase().contains("axis"), "{err}");
    }
    // Duplicate axes are rejected too.
    assert!(ops::sum(&a, &[0, 0], false).is_err());
    assert_eq!(f(&ops::sum(&a, &[1], false).unwrap()), vec![6.0, 15.0]);
}
