//! mx.compile over Rust functions: same results as the uncompiled graph.

use mlx_rs_safe::compile::Compiled;
use mlx_rs_safe::{ops, Array, Dtype, Result};

fn swiglu(x: &[Array]) -> Result<Vec<Array>> {
    let silu = ops::multiply(&x[0], &ops::sigmoid(&x[0])?)?;
    Ok(vec![ops::multiply(&silu, &x[1])?])
}

fn failing(_: &[Array]) -> Result<Vec<Array>> {
    Err(mlx_rs_safe::Error::InvalidArgument("nope".into()))
}

#[test]
fn compiled_function_matches_the_plain_graph_for_several_shapes() {
    let f = Compiled::new(swiglu, true).unwrap();
    for n in [7, 64, 1000] {
        let g: Vec<f32> = (0..n).map(|i| (i as f32 - n as f32 / 2.0) / 50.0).collect();
        let u: Vec<f32> = (0..n).map(|i| ((i % 5) as f32) - 2.0).collect();
        let (ga, ua) = (Array::from_vec(&g).unwrap(), Array::from_vec(&u).unwrap());
        let ga = ops::astype(&ga, Dtype::Bfloat16).unwrap();
        let ua = ops::astype(&ua, Dtype::Bfloat16).unwrap();
        let got = f.call(&[&ga, &ua]).unwrap();
        let want = swiglu(&[ga.clone(), ua.clone()]).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].dtype(), Dtype::Bfloat16);
        let got = ops::astype(&got[0], Dtype::Float32).unwrap().to_vec::<f32>().unwrap();
        let want = ops::astype(&want[0], Dtype::Float32).unwrap().to_vec::<f32>().unwrap();
        assert_eq!(got, want, "n = {n}");
    }
}

#[test]
fn an_error_inside_the_function_is_an_err() {
    let f = Compiled::new(failing, false).unwrap();
    let a = Array::from_vec(&[1.0f32]).unwrap();
    assert!(f.call(&[&a]).is_err());
    // MLX goes on working.
    assert_eq!(ops::add(&a, &a).unwrap().item::<f32>().unwrap(), 2.0);
}
