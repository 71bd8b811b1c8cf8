//! Shape manipulation, slicing and gather/scatter against hand-computed values.

use half::bf16;
use mlx_rs_safe::{ops, Array, Dtype, Error};

fn i(a: &Array) -> Vec<i32> {
    a.to_vec::<i32>().unwrap()
}

fn iv(v: &[i32]) -> Array {
    Array::from_vec(v).unwrap()
}

/// 0..n as int32 with `shape`.
fn range(shape: &[i32]) -> Array {
    let n: i32 = shape.iter().product();
    Array::from_slice(&(0..n).collect::<Vec<_>>(), shape).unwrap()
}

#[test]
fn transposes_and_axis_moves() {
    let a = range(&[1, 2, 3]);
    let t = ops::transpose_axes(&a, &[2, 0, 1]).unwrap();
    assert_eq!((t.shape(), i(&t)), (vec![3, 1, 2], vec![0, 3, 1, 4, 2, 5]));
    let s = ops::swapaxes(&a, 0, -1).unwrap();
    assert_eq!((s.shape(), i(&s)), (vec![3, 2, 1], vec![0, 3, 1, 4, 2, 5]));
    let m = ops::moveaxis(&a, 1, 2).unwrap();
    assert_eq!((m.shape(), i(&m)), (vec![1, 3, 2], vec![0, 3, 1, 4, 2, 5]));
    let r = ops::reshape(&a, &[3, -1]).unwrap();
    assert_eq!((r.shape(), i(&r)), (vec![3, 2], vec![0, 1, 2, 3, 4, 5]));
    // A transposed view made contiguous reads in the new row-major order.
    let c = ops::contiguous(&ops::transpose(&r).unwrap(), false).unwrap();
    assert_eq!((c.shape(), i(&c)), (vec![2, 3], vec![0, 2, 4, 1, 3, 5]));
    assert!(ops::transpose_axes(&a, &[0, 1]).is_err());
}

#[test]
fn expand_squeeze_flatten() {
    let v = iv(&[7, 8]);
    let e = ops::expand_dims(&v, &[0, -1]).unwrap();
    assert_eq!((e.shape(), i(&e)), (vec![1, 2, 1], vec![7, 8]));
    assert_eq!(ops::squeeze(&e, &[0]).unwrap().shape(), vec![2, 1]);
    assert_eq!(ops::squeeze(&e, &[-1]).unwrap().shape(), vec![1, 2]);
    assert_eq!(ops::squeeze_all(&e).unwrap().shape(), vec![2]);
    let err = ops::squeeze(&e, &[1]).unwrap_err();
    assert!(matches!(err, Error::Mlx(_)), "{err:?}");
    let a = range(&[2, 3, 4]);
    assert_eq!(ops::flatten(&a, 1, 2).unwrap().shape(), vec![2, 12]);
    let f = ops::flatten(&a, 0, -1).unwrap();
    assert_eq!((f.shape(), i(&f)[..3].to_vec()), (vec![24], vec![0, 1, 2]));
    assert_eq!(ops::unflatten(&f, 0, &[4, -1]).unwrap().shape(), vec![4, 6]);
}

#[test]
fn broadcast_concatenate_stack() {
    let row = iv(&[1, 2, 3]);
    let b = ops::broadcast_to(&row, &[2, 3]).unwrap();
    assert_eq!((b.shape(), i(&b)), (vec![2, 3], vec![1, 2, 3, 1, 2, 3]));
    assert!(ops::broadcast_to(&row, &[2, 2]).is_err());
    let top = Array::from_slice(&[1i32, 2], &[1, 2]).unwrap();
    let rest = Array::from_slice(&[3i32, 4, 5, 6], &[2, 2]).unwrap();
    let c = ops::concatenate(&[&top, &rest], 0).unwrap();
    assert_eq!((c.shape(), i(&c)), (vec![3, 2], vec![1, 2, 3, 4, 5, 6]));
    let side = Array::from_slice(&[9i32, 9], &[2, 1]).unwrap();
    let c = ops::concatenate(&[&rest, &side], -1).unwrap();
    assert_eq!((c.shape(), i(&c)), (vec![2, 3], vec![3, 4, 9, 5, 6, 9]));
    assert!(ops::concatenate(&[&top, &side], 0).is_err());
    let (x, y) = (iv(&[1, 2]), iv(&[3, 4]));
    let s0 = ops::stack(&[&x, &y], 0).unwrap();
    assert_eq!((s0.shape(), i(&s0)), (vec![2, 2], vec![1, 2, 3, 4]));
    let s1 = ops::stack(&[&x, &y], -1).unwrap();
    assert_eq!((s1.shape(), i(&s1)), (vec![2, 2], vec![1, 3, 2, 4]));
}

#[test]
fn splits() {
    let a = range(&[6]);
    let parts = ops::split_sections(&a, &[2, 5], 0).unwrap();
    let got: Vec<Vec<i32>> = parts.iter().map(i).collect();
    assert_eq!(got, vec![vec![0, 1], vec![2, 3, 4], vec![5]]);
    let parts = ops::split(&a, 3, -1).unwrap();
    let got: Vec<Vec<i32>> = parts.iter().map(i).collect();
    assert_eq!(got, vec![vec![0, 1], vec![2, 3], vec![4, 5]]);
    let m = range(&[2, 4]);
    let halves = ops::split(&m, 2, 1).unwrap();
    assert_eq!(halves[1].shape(), vec![2, 2]);
    assert_eq!(i(&halves[1]), vec![2, 3, 6, 7]);
    // 6 does not divide into 4 equal parts.
    let err = ops::split(&a, 4, 0).unwrap_err();
    assert!(err.to_string().starts_with("mlx: "), "{err}");
    assert_eq!(ops::split(&a, 2, 0).unwrap().len(), 2);
    // Into a fixed number of parts, to destructure; positions for another count are refused.
    let [x, y, z] = ops::split_sections_into(&a, &[2, 5], 0).unwrap();
    assert_eq!((i(&x), i(&y), i(&z)), (vec![0, 1], vec![2, 3, 4], vec![5]));
    let err = ops::split_sections_into::<2>(&a, &[2, 5], 0).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    assert_eq!(err.to_string(), "invalid argument: 2 split positions give 3 parts, not 2");
    let [x, y] = ops::split_into(&m, 1).unwrap();
    assert_eq!((i(&x), i(&y)), (vec![0, 1, 4, 5], vec![2, 3, 6, 7]));
    assert!(ops::split_into::<4>(&a, 0).unwrap_err().to_string().starts_with("mlx: "));
}

#[test]
fn slice_and_slice_update() {
    let a = range(&[3, 4]);
    let s = ops::slice(&a, &[0, 1], &[3, 4], &[2, 2]).unwrap();
    assert_eq!((s.shape(), i(&s)), (vec![2, 2], vec![1, 3, 9, 11]));
    // Negative start counts from the end; an over-long stop is clamped.
    let s = ops::slice(&a, &[-1, 0], &[3, 100], &[1, 1]).unwrap();
    assert_eq!(i(&s), vec![8, 9, 10, 11]);
    // Negative stride walks backwards.
    let s = ops::slice(&a, &[0, 3], &[1, -5], &[1, -1]).unwrap();
    assert_eq!(i(&s), vec![3, 2, 1, 0]);
    let z = ops::zeros(&[3, 4], Dtype::Int32).unwrap();
    let upd = Array::from_slice(&[5i32, 6], &[1, 2]).unwrap();
    let u = ops::slice_update(&z, &upd, &[1, 1], &[2, 3], &[1, 1]).unwrap();
    assert_eq!(i(&u), vec![0, 0, 0, 0, 0, 5, 6, 0, 0, 0, 0, 0]);
    // A scalar update broadcasts over the strided region.
    let u = ops::slice_update(&z, &Array::scalar(1i32), &[0, 0], &[3, 4], &[2, 3]).unwrap();
    assert_eq!(i(&u), vec![1, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 1]);
    // One entry per axis is required.
    let err = ops::slice(&a, &[0], &[1], &[1]).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
}

#[test]
fn pad_repeat_tile_tri() {
    let v = iv(&[1, 2]);
    let p = ops::pad(&v, &[0], &[1], &[2], &Array::scalar(9i32)).unwrap();
    assert_eq!(i(&p), vec![9, 1, 2, 9, 9]);
    let m = Array::from_slice(&[1i32, 2, 3, 4], &[2, 2]).unwrap();
    let p = ops::pad(&m, &[-1], &[0], &[1], &Array::scalar(0i32)).unwrap();
    assert_eq!((p.shape(), i(&p)), (vec![2, 3], vec![1, 2, 0, 3, 4, 0]));
    assert!(matches!(
        ops::pad(&v, &[0], &[1, 1], &[1], &Array::scalar(0i32)),
        Err(Error::InvalidArgument(_))
    ));
    assert_eq!(i(&ops::repeat(&v, 2, 0).unwrap()), vec![1, 1, 2, 2]);
    assert_eq!(
        i(&ops::repeat(&m, 2, 1).unwrap()),
        vec![1, 1, 2, 2, 3, 3, 4, 4]
    );
    assert_eq!(i(&ops::tile(&v, &[3]).unwrap()), vec![1, 2, 1, 2, 1, 2]);
    let t = ops::tile(&Array::from_slice(&[1i32, 2], &[1, 2]).unwrap(), &[2, 1]).unwrap();
    assert_eq!((t.shape(), i(&t)), (vec![2, 2], vec![1, 2, 1, 2]));
    let ones = ops::ones(&[3, 3], Dtype::Int32).unwrap();
    assert_eq!(
        i(&ops::tril(&ones, 0).unwrap()),
        vec![1, 0, 0, 1, 1, 0, 1, 1, 1]
    );
    assert_eq!(
        i(&ops::tril(&ones, -1).unwrap()),
        vec![0, 0, 0, 1, 0, 0, 1, 1, 0]
    );
    assert_eq!(
        i(&ops::triu(&ones, 1).unwrap()),
        vec![0, 1, 1, 0, 0, 1, 0, 0, 0]
    );
}

#[test]
fn view_reinterprets_bytes() {
    let a = Array::from_vec(&[1.0f32, -2.0]).unwrap();
    let u = ops::view(&a, Dtype::Uint32).unwrap();
    assert_eq!(u.to_vec::<u32>().unwrap(), vec![0x3f80_0000, 0xc000_0000]);
    let b = ops::view(&a, Dtype::Uint8).unwrap();
    assert_eq!(
        (b.shape(), b.to_vec::<u8>().unwrap()),
        (vec![8], vec![0, 0, 0x80, 0x3f, 0, 0, 0, 0xc0])
    );
    let h = Array::from_vec(&[bf16::from_f32(1.0), bf16::from_f32(-2.0)]).unwrap();
    assert_eq!(
        ops::view(&h, Dtype::Uint16)
            .unwrap()
            .to_vec::<u16>()
            .unwrap(),
        vec![0x3f80, 0xc000]
    );
    let w = ops::view(&h, Dtype::Float32).unwrap();
    assert_eq!(w.shape(), vec![1]);
    assert_eq!(
        ops::astype(&a, Dtype::Int32)
            .unwrap()
            .to_vec::<i32>()
            .unwrap(),
        vec![1, -2]
    );
}

#[test]
fn take_and_along_axis() {
    let a = range(&[3, 4]);
    let rows = ops::take(&a, &iv(&[2, 0]), 0).unwrap();
    assert_eq!(
        (rows.shape(), i(&rows)),
        (vec![2, 4], vec![8, 9, 10, 11, 0, 1, 2, 3])
    );
    let idx = Array::from_slice(&[0i32, 3], &[1, 2]).unwrap();
    let cols = ops::take(&a, &idx, -1).unwrap();
    assert_eq!(
        (cols.shape(), i(&cols)),
        (vec![3, 1, 2], vec![0, 3, 4, 7, 8, 11])
    );
    // Negative indices count from the end of the axis.
    assert_eq!(i(&ops::take(&a, &iv(&[-1]), 1).unwrap()), vec![3, 7, 11]);
    let flat = ops::take_all(&a, &Array::from_slice(&[5u32, 11], &[2, 1]).unwrap()).unwrap();
    assert_eq!((flat.shape(), i(&flat)), (vec![2, 1], vec![5, 11]));
    let b = Array::from_slice(&[10i32, 20, 30, 40, 50, 60], &[2, 3]).unwrap();
    let ix = Array::from_slice(&[2i32, 0], &[2, 1]).unwrap();
    let t = ops::take_along_axis(&b, &ix, 1).unwrap();
    assert_eq!((t.shape(), i(&t)), (vec![2, 1], vec![30, 40]));
    let z = ops::zeros(&[2, 3], Dtype::Int32).unwrap();
    let ix = Array::from_slice(&[1i32, 2], &[2, 1]).unwrap();
    let vals = Array::from_slice(&[7i32, 8], &[2, 1]).unwrap();
    assert_eq!(
        i(&ops::put_along_axis(&z, &ix, &vals, -1).unwrap()),
        vec![0, 7, 0, 0, 0, 8]
    );
    assert_eq!(
        i(&ops::put_along_axis(&z, &ix, &Array::scalar(1i32), 1).unwrap()),
        vec![0, 1, 0, 0, 0, 1]
    );
    let dup = Array::from_slice(&[1i32, 1, 0, 0], &[2, 2]).unwrap();
    let acc = ops::scatter_add_axis(&z, &dup, &Array::scalar(3i32), 1).unwrap();
    assert_eq!(i(&acc), vec![0, 6, 0, 6, 0, 0]);
}

#[test]
fn gather_and_scatter() {
    let a = range(&[3, 4]);
    // Single elements a[0, 1] and a[2, 3].
    let g = ops::gather(&a, &[&iv(&[0, 2]), &iv(&[1, 3])], &[0, 1], &[1, 1]).unwrap();
    assert_eq!((g.shape(), i(&g)), (vec![2, 1, 1], vec![1, 11]));
    // Whole rows 2 and 0.
    let g = ops::gather(&a, &[&iv(&[2, 0])], &[0], &[1, 4]).unwrap();
    assert_eq!(
        (g.shape(), i(&g)),
        (vec![2, 1, 4], vec![8, 9, 10, 11, 0, 1, 2, 3])
    );
    // 2x2 windows starting at column 1 and 2 (row 0 since axis 0 is not indexed).
    let g = ops::gather(&a, &[&iv(&[1, 2])], &[1], &[2, 2]).unwrap();
    assert_eq!(
        (g.shape(), i(&g)),
        (vec![2, 2, 2], vec![1, 2, 5, 6, 2, 3, 6, 7])
    );

    let z = ops::zeros(&[4], Dtype::Int32).unwrap();
    let upd = Array::from_slice(&[5i32, 6], &[2, 1]).unwrap();
    assert_eq!(
        i(&ops::scatter(&z, &[&iv(&[1, 3])], &upd, &[0]).unwrap()),
        vec![0, 5, 0, 6]
    );
    let twice = ops::scatter_add(&z, &[&iv(&[1, 1])], &upd, &[0]).unwrap();
    assert_eq!(i(&twice), vec![0, 11, 0, 0]);
    let z2 = ops::zeros(&[3, 2], Dtype::Int32).unwrap();
    let row = Array::from_slice(&[7i32, 8], &[1, 1, 2]).unwrap();
    assert_eq!(
        i(&ops::scatter(&z2, &[&iv(&[2])], &row, &[0]).unwrap()),
        vec![0, 0, 0, 0, 7, 8]
    );
    let cell = Array::from_slice(&[4i32], &[1, 1, 1]).unwrap();
    let s = ops::scatter_add(&z2, &[&iv(&[1]), &iv(&[-1])], &cell, &[0, 1]).unwrap();
    assert_eq!(i(&s), vec![0, 0, 0, 4, 0, 0]);
}

#[test]
fn index_errors_then_recover() {
    let a = range(&[3, 4]);
    let err = ops::gather(&a, &[&iv(&[0])], &[0, 1], &[1, 1]).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    let err = ops::take(&a, &iv(&[0]), 2).unwrap_err();
    assert!(
        matches!(err, Error::Mlx(_)) && err.to_string().to_lowercase().contains("axis"),
        "{err}"
    );
    let err = ops::take(&a, &Array::from_vec(&[0.5f32]).unwrap(), 0).unwrap_err();
    assert!(err.to_string().starts_with("mlx: "), "{err}");
    let err = ops::swapaxes(&a, 0, 3).unwrap_err();
    assert!(err.to_string().to_lowercase().contains("axis"), "{err}");
    assert_eq!(i(&ops::take(&a, &iv(&[1]), 0).unwrap()), vec![4, 5, 6, 7]);
}
