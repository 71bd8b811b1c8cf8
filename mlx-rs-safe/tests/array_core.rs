//! Array construction, dtype round trips, evaluation and error recovery.

use half::{bf16, f16};
use mlx_rs_safe::{ops, Array, Dtype, Error};

#[test]
fn from_slice_round_trips_shape_dtype_and_values() {
    let a = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap();
    assert_eq!(a.shape(), vec![2, 3]);
    assert_eq!(a.dtype(), Dtype::Float32);
    assert_eq!(a.size(), 6);
    assert_eq!(a.nbytes(), 24);
    assert_eq!(a.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
}

#[test]
fn every_element_type_round_trips() {
    fn check<T: mlx_rs_safe::Element + PartialEq + std::fmt::Debug>(v: &[T], d: Dtype) {
        let a = Array::from_vec(v).unwrap();
        assert_eq!(a.dtype(), d);
        assert_eq!(a.to_vec::<T>().unwrap(), v);
    }
    check(&[true, false, true], Dtype::Bool);
    check(&[0u8, 7, 255], Dtype::Uint8);
    check(&[0u16, 65535], Dtype::Uint16);
    check(&[1u32, 4_000_000_000], Dtype::Uint32);
    check(&[1u64, u64::MAX], Dtype::Uint64);
    check(&[-128i8, 127], Dtype::Int8);
    check(&[-32768i16, 32767], Dtype::Int16);
    check(&[-5i32, 1 << 30], Dtype::Int32);
    check(&[i64::MIN, i64::MAX], Dtype::Int64);
    // float64 exists on the CPU only (MLX's GPU backends reject it).
    let cpu = mlx_rs_safe::Stream::default_for(mlx_rs_safe::Device::Cpu).unwrap();
    mlx_rs_safe::with_stream(&cpu, || check(&[1.5f64, -2.25], Dtype::Float64));
    check(&[f16::from_f32(0.5), f16::from_f32(-1024.0)], Dtype::Float16);
    check(&[bf16::from_f32(3.0), bf16::from_f32(-0.125)], Dtype::Bfloat16);
}

#[test]
fn float_to_half_types_and_back_rounds_as_ieee() {
    let a = Array::from_vec(&[1.0f32, 0.1, 65504.0, 1e-8]).unwrap();
    let h = ops::astype(&a, Dtype::Float16).unwrap();
    let hv = h.to_vec::<f16>().unwrap();
    let expect: Vec<f16> = [1.0f32, 0.1, 65504.0, 1e-8].iter().map(|&x| f16::from_f32(x)).collect();
    assert_eq!(hv, expect);
    let b = ops::astype(&a, Dtype::Bfloat16).unwrap();
    let bv = b.to_vec::<bf16>().unwrap();
    let expect: Vec<bf16> = [1.0f32, 0.1, 65504.0, 1e-8].iter().map(|&x| bf16::from_f32(x)).collect();
    assert_eq!(bv, expect);
    let back = ops::astype(&b, Dtype::Float32).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(back, expect.iter().map(|x| x.to_f32()).collect::<Vec<_>>());
}

#[test]
fn wrong_dtype_read_is_an_error() {
    let a = Array::from_vec(&[1i32, 2]).unwrap();
    match a.to_vec::<f32>() {
        Err(Error::DtypeMismatch { actual, requested }) => {
            assert_eq!((actual, requested), (Dtype::Int32, Dtype::Float32))
        }
        other => panic!("expected dtype mismatch, got {other:?}"),
    }
}

#[test]
fn data_length_must_match_shape() {
    let err = Array::from_slice(&[1.0f32, 2.0, 3.0], &[2, 2]).unwrap_err();
    assert!(err.to_string().contains("4 elements"), "{err}");
    assert!(Array::from_slice(&[1.0f32], &[-1]).is_err());
}

#[test]
fn shape_mismatch_is_an_err_with_mlx_message_and_next_op_works() {
    let a = Array::from_slice(&[1.0f32; 6], &[2, 3]).unwrap();
    let b = Array::from_slice(&[1.0f32; 4], &[2, 2]).unwrap();
    let err = ops::matmul(&a, &b).unwrap_err();
    let msg = err.to_string();
    assert!(msg.starts_with("mlx: "), "{msg}");
    assert!(msg.contains("matmul"), "{msg}");
    let err = ops::add(&a, &b).unwrap_err();
    assert!(err.to_string().contains("broadcast"), "{err}");
    // The process is alive and the next op works.
    let c = ops::add(&a, &a).unwrap();
    assert_eq!(c.to_vec::<f32>().unwrap(), vec![2.0; 6]);
    let err = ops::reshape(&a, &[4, 2]).unwrap_err();
    assert!(err.to_string().contains("reshape"), "{err}");
}

#[test]
fn clone_shares_and_scalar_item() {
    let a = Array::scalar(42i32);
    let b = a.clone();
    drop(a);
    assert_eq!(b.item::<i32>().unwrap(), 42);
    assert_eq!(b.shape(), Vec::<i32>::new());
    let v = Array::from_vec(&[1.0f32, 2.0]).unwrap();
    assert!(v.item::<f32>().is_err());
}

#[test]
fn transposed_views_read_back_in_row_major_order() {
    let a = Array::from_slice(&[1i32, 2, 3, 4, 5, 6], &[2, 3]).unwrap();
    let t = ops::transpose(&a).unwrap();
    assert_eq!(t.shape(), vec![3, 2]);
    assert_eq!(t.to_vec::<i32>().unwrap(), vec![1, 4, 2, 5, 3, 6]);
}

#[test]
fn display_uses_mlx_printout() {
    let a = Array::from_vec(&[1i32, 2]).unwrap();
    assert_eq!(format!("{a}"), "array([1, 2], dtype=int32)");
}

#[test]
fn views_read_back_as_their_own_elements_in_row_major_order() {
    let a = Array::from_slice(&(0..24).collect::<Vec<i32>>(), &[2, 3, 4]).unwrap();
    // A contiguous view at an offset (rows 1..3 of the second block): read in place.
    let rows = ops::slice(&a, &[1, 1, 0], &[2, 3, 4], &[1, 1, 1]).unwrap();
    assert_eq!(rows.to_vec::<i32>().unwrap(), (16..24).collect::<Vec<i32>>());
    // Strided views need a copy and still come out in order.
    let cols = ops::slice(&a, &[0, 0, 1], &[2, 3, 4], &[1, 1, 2]).unwrap();
    assert_eq!(cols.to_vec::<i32>().unwrap(), vec![1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23]);
    let wide = ops::broadcast_to(&Array::from_slice(&[7i32, 8], &[2, 1]).unwrap(), &[2, 3]).unwrap();
    assert_eq!(wide.to_vec::<i32>().unwrap(), vec![7, 7, 7, 8, 8, 8]);
    let row = ops::slice(&a, &[1, 2, 3], &[2, 3, 4], &[1, 1, 1]).unwrap();
    assert_eq!(row.item::<i32>().unwrap(), 23);
}
