//! Sorting, top-k and array creation against hand-computed values.

use mlx_rs_safe::{ops, Array, Dtype, Error};

fn f(a: &Array) -> Vec<f32> {
    a.to_vec::<f32>().unwrap()
}

fn u(a: &Array) -> Vec<u32> {
    a.to_vec::<u32>().unwrap()
}

fn sorted(mut v: Vec<f32>) -> Vec<f32> {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v
}

fn fv(v: &[f32]) -> Array {
    Array::from_vec(v).unwrap()
}

#[test]
fn sort_and_argsort() {
    let m = Array::from_slice(&[3.0f32, 1.0, 2.0, 0.0, 5.0, 4.0], &[2, 3]).unwrap();
    assert_eq!(
        f(&ops::sort(&m, -1).unwrap()),
        vec![1.0, 2.0, 3.0, 0.0, 4.0, 5.0]
    );
    assert_eq!(
        f(&ops::sort(&m, 0).unwrap()),
        vec![0.0, 1.0, 2.0, 3.0, 5.0, 4.0]
    );
    let idx = ops::argsort(&m, 1).unwrap();
    assert_eq!(idx.dtype(), Dtype::Uint32);
    assert_eq!(u(&idx), vec![1, 2, 0, 0, 2, 1]);
    assert_eq!(u(&ops::argsort(&m, -2).unwrap()), vec![1, 0, 0, 0, 1, 1]);
    // Stable: equal keys keep their order.
    assert_eq!(
        u(&ops::argsort(&fv(&[2.0, 1.0, 2.0, 1.0]), 0).unwrap()),
        vec![1, 3, 0, 2]
    );
}

#[test]
fn partition_and_topk() {
    let v = fv(&[5.0, 1.0, 4.0, 2.0, 3.0]);
    let p = f(&ops::partition(&v, 2, 0).unwrap());
    assert_eq!(p[2], 3.0);
    assert_eq!(sorted(p[..2].to_vec()), vec![1.0, 2.0]);
    assert_eq!(sorted(p[3..].to_vec()), vec![4.0, 5.0]);
    let ip = u(&ops::argpartition(&v, -1, 0).unwrap());
    assert_eq!(ip[4], 0, "index of the largest, 5.0");
    let mut rest = ip[..4].to_vec();
    rest.sort();
    assert_eq!(rest, vec![1, 2, 3, 4]);
    let t = ops::topk(&v, 2, 0).unwrap();
    assert_eq!((t.shape(), sorted(f(&t))), (vec![2], vec![4.0, 5.0]));
    let m = Array::from_slice(&[1.0f32, 9.0, 8.0, 7.0, 2.0, 3.0], &[3, 2]).unwrap();
    let t = ops::topk(&m, 1, 0).unwrap();
    assert_eq!((t.shape(), f(&t)), (vec![1, 2], vec![8.0, 9.0]));
    let t = ops::topk(&m, 1, -1).unwrap();
    assert_eq!((t.shape(), f(&t)), (vec![3, 1], vec![9.0, 8.0, 3.0]));
}

#[test]
fn sort_errors_then_recover() {
    let v = fv(&[5.0, 1.0, 4.0]);
    let err = ops::topk(&v, 4, 0).unwrap_err();
    assert!(matches!(err, Error::Mlx(_)), "{err:?}");
    let err = ops::sort(&v, 1).unwrap_err();
    assert!(err.to_string().to_lowercase().contains("axis"), "{err}");
    assert!(ops::partition(&v, 3, 0).is_err());
    assert!(matches!(
        ops::topk(&v, usize::MAX, 0),
        Err(Error::InvalidArgument(_))
    ));
    assert_eq!(f(&ops::sort(&v, 0).unwrap()), vec![1.0, 4.0, 5.0]);
}

#[test]
fn constant_fills() {
    let z = ops::zeros(&[2, 3], Dtype::Float32).unwrap();
    assert_eq!((z.shape(), f(&z)), (vec![2, 3], vec![0.0; 6]));
    let o = ops::ones(&[3], Dtype::Int32).unwrap();
    assert_eq!(o.to_vec::<i32>().unwrap(), vec![1, 1, 1]);
    let fl = ops::full(&[2, 2], &Array::scalar(1.5f32), Dtype::Float32).unwrap();
    assert_eq!(f(&fl), vec![1.5; 4]);
    // The value broadcasts, and is cast to the dtype (truncating to int).
    let fl = ops::full(&[2, 2], &fv(&[1.7, -2.7]), Dtype::Int32).unwrap();
    assert_eq!(fl.to_vec::<i32>().unwrap(), vec![1, -2, 1, -2]);
    let src = Array::from_slice(&[7i32, 8, 9, 10], &[2, 2]).unwrap();
    let zl = ops::zeros_like(&src).unwrap();
    assert_eq!((zl.shape(), zl.dtype()), (vec![2, 2], Dtype::Int32));
    assert_eq!(zl.to_vec::<i32>().unwrap(), vec![0; 4]);
    assert_eq!(
        ops::ones_like(&src).unwrap().to_vec::<i32>().unwrap(),
        vec![1; 4]
    );
    let e = ops::zeros(&[0, 3], Dtype::Float32).unwrap();
    assert_eq!((e.size(), f(&e)), (0, vec![]));
    let err = ops::zeros(&[-1], Dtype::Float32).unwrap_err();
    assert!(matches!(err, Error::Mlx(_)), "{err:?}");
    assert!(ops::full(&[2], &fv(&[1.0, 2.0, 3.0]), Dtype::Float32).is_err());
    assert_eq!(f(&ops::ones(&[1], Dtype::Float32).unwrap()), vec![1.0]);
}

#[test]
fn ranges() {
    let a = ops::arange(0.0, 5.0, 1.0, Dtype::Int32).unwrap();
    assert_eq!(a.to_vec::<i32>().unwrap(), vec![0, 1, 2, 3, 4]);
    assert_eq!(
        f(&ops::arange(1.0, 2.0, 0.25, Dtype::Float32).unwrap()),
        vec![1.0, 1.25, 1.5, 1.75]
    );
    let d = ops::arange(5.0, 0.0, -2.0, Dtype::Int32).unwrap();
    assert_eq!(d.to_vec::<i32>().unwrap(), vec![5, 3, 1]);
    assert_eq!(
        ops::arange(3.0, 1.0, 1.0, Dtype::Float32).unwrap().size(),
        0
    );
    let l = ops::linspace(0.0, 1.0, 5, Dtype::Float32).unwrap();
    assert_eq!(f(&l), vec![0.0, 0.25, 0.5, 0.75, 1.0]);
    assert_eq!(
        f(&ops::linspace(2.0, -2.0, 3, Dtype::Float32).unwrap()),
        vec![2.0, 0.0, -2.0]
    );
    assert!(matches!(
        ops::linspace(0.0, 1.0, usize::MAX, Dtype::Float32),
        Err(Error::InvalidArgument(_))
    ));
}

#[test]
fn identity_like_matrices() {
    let e = ops::eye(2, 3, 1, Dtype::Float32).unwrap();
    assert_eq!(
        (e.shape(), f(&e)),
        (vec![2, 3], vec![0.0, 1.0, 0.0, 0.0, 0.0, 1.0])
    );
    let e = ops::eye(3, 2, -1, Dtype::Int32).unwrap();
    assert_eq!(e.to_vec::<i32>().unwrap(), vec![0, 0, 1, 0, 0, 1]);
    let id = ops::identity(3, Dtype::Float32).unwrap();
    assert_eq!(f(&id), vec![1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0]);
    let t = ops::tri(2, 3, 0, Dtype::Float32).unwrap();
    assert_eq!(f(&t), vec![1.0, 0.0, 0.0, 1.0, 1.0, 0.0]);
    assert!(ops::eye(-1, 2, 0, Dtype::Float32).is_err());
}
