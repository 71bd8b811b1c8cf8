//! Random sampling with explicit keys: determinism, ranges and loose statistics.
//!
//! Every draw uses a fixed key, so the statistical checks are deterministic; their
//! bounds are still several standard errors wide so a change of generator cannot
//! make them flaky.

use mlx_rs_safe::{ops, random, Array, Dtype, Error};

fn f(a: &Array) -> Vec<f32> {
    a.to_vec::<f32>().unwrap()
}

fn mean_std(v: &[f32]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().map(|&x| x as f64).sum::<f64>() / n;
    let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n;
    (mean, var.sqrt())
}

#[test]
fn keys_are_seed_words_and_split_into_distinct_keys() {
    let k = random::key(5).unwrap();
    assert_eq!((k.shape(), k.dtype()), (vec![2], Dtype::Uint32));
    assert_eq!(k.to_vec::<u32>().unwrap(), vec![0, 5]);
    assert_eq!(
        random::key((1 << 32) + 7).unwrap().to_vec::<u32>().unwrap(),
        vec![1, 7]
    );
    let ks = random::split(&k, 3).unwrap();
    assert_eq!(ks.shape(), vec![3, 2]);
    let v = ks.to_vec::<u32>().unwrap();
    let rows: Vec<[u32; 2]> = v.chunks(2).map(|c| [c[0], c[1]]).collect();
    for (i, r) in rows.iter().enumerate() {
        assert_ne!(*r, [0, 5]);
        for s in &rows[i + 1..] {
            assert_ne!(r, s);
        }
    }
    // Splitting is deterministic, and split2 gives the two rows of split(key, 2).
    assert_eq!(random::split(&k, 3).unwrap().to_vec::<u32>().unwrap(), v);
    let (a, b) = random::split2(&k).unwrap();
    let two = random::split(&k, 2).unwrap().to_vec::<u32>().unwrap();
    assert_eq!(a.to_vec::<u32>().unwrap(), two[..2].to_vec());
    assert_eq!(b.to_vec::<u32>().unwrap(), two[2..].to_vec());
    assert_ne!(two[..2], two[2..]);
}

#[test]
fn same_key_same_values_different_key_different_values() {
    let k1 = random::key(1).unwrap();
    let k2 = random::key(2).unwrap();
    let a = f(&random::normal(&[64], Dtype::Float32, 0.0, 1.0, &k1).unwrap());
    let b = f(&random::normal(&[64], Dtype::Float32, 0.0, 1.0, &k1).unwrap());
    let c = f(&random::normal(&[64], Dtype::Float32, 0.0, 1.0, &k2).unwrap());
    assert_eq!(a, b);
    assert_ne!(a, c);
    let (lo, hi) = (Array::scalar(0.0f32), Array::scalar(1.0f32));
    let u1 = f(&random::uniform(&lo, &hi, &[64], Dtype::Float32, &k1).unwrap());
    let u2 = f(&random::uniform(&lo, &hi, &[64], Dtype::Float32, &k1).unwrap());
    let u3 = f(&random::uniform(&lo, &hi, &[64], Dtype::Float32, &k2).unwrap());
    assert_eq!(u1, u2);
    assert_ne!(u1, u3);
}

#[test]
fn uniform_stays_in_half_open_range() {
    let k = random::key(7).unwrap();
    let (lo, hi) = (Array::scalar(2.0f32), Array::scalar(5.0f32));
    let v = f(&random::uniform(&lo, &hi, &[10_000], Dtype::Float32, &k).unwrap());
    assert!(v.iter().all(|&x| (2.0..5.0).contains(&x)));
    let (mean, std) = mean_std(&v);
    // Uniform(2, 5): mean 3.5, std 3/sqrt(12) ~ 0.866; standard error of the mean ~ 0.009.
    assert!((mean - 3.5).abs() < 0.05, "{mean}");
    assert!((std - 0.866).abs() < 0.05, "{std}");
    // Per-column bounds broadcast against the shape.
    let lo = Array::from_vec(&[0.0f32, 10.0]).unwrap();
    let hi = Array::from_vec(&[1.0f32, 11.0]).unwrap();
    let m = f(&random::uniform(&lo, &hi, &[1000, 2], Dtype::Float32, &k).unwrap());
    assert!(m
        .chunks(2)
        .all(|r| (0.0..1.0).contains(&r[0]) && (10.0..11.0).contains(&r[1])));
}

#[test]
fn normal_moments() {
    let k = random::key(11).unwrap();
    let v = f(&random::normal(&[10_000], Dtype::Float32, 0.0, 1.0, &k).unwrap());
    let (mean, std) = mean_std(&v);
    // Standard errors: 0.01 for the mean, ~0.007 for the std.
    assert!(mean.abs() < 0.05, "{mean}");
    assert!((std - 1.0).abs() < 0.05, "{std}");
    let w = f(&random::normal(&[10_000], Dtype::Float32, 3.0, 2.0, &k).unwrap());
    let (mean, std) = mean_std(&w);
    assert!((mean - 3.0).abs() < 0.1, "{mean}");
    assert!((std - 2.0).abs() < 0.1, "{std}");
    let h = random::normal(&[4], Dtype::Bfloat16, 0.0, 1.0, &k).unwrap();
    assert_eq!(h.dtype(), Dtype::Bfloat16);
}

#[test]
fn randint_bernoulli_gumbel() {
    let k = random::key(3).unwrap();
    let r = random::randint(
        &Array::scalar(0i32),
        &Array::scalar(10i32),
        &[10_000],
        Dtype::Int32,
        &k,
    )
    .unwrap()
    .to_vec::<i32>()
    .unwrap();
    let mut counts = [0usize; 10];
    for &x in &r {
        assert!((0..10).contains(&x), "{x}");
        counts[x as usize] += 1;
    }
    // Each value expected 1000 times (std ~ 30).
    assert!(
        counts.iter().all(|&c| (850..1150).contains(&c)),
        "{counts:?}"
    );
    let b = random::bernoulli(&Array::scalar(0.3f32), &[10_000], &k).unwrap();
    assert_eq!(b.dtype(), Dtype::Bool);
    let ones = b.to_vec::<bool>().unwrap().iter().filter(|&&x| x).count() as f64 / 10_000.0;
    assert!((ones - 0.3).abs() < 0.03, "{ones}");
    // p = 0 and p = 1 are certain.
    let p = Array::from_vec(&[0.0f32, 1.0]).unwrap();
    let b = random::bernoulli(&p, &[100, 2], &k)
        .unwrap()
        .to_vec::<bool>()
        .unwrap();
    assert!(b.chunks(2).all(|r| !r[0] && r[1]));
    // Standard Gumbel: mean is the Euler-Mascheroni constant 0.5772, std pi/sqrt(6) ~ 1.283.
    let g = f(&random::gumbel(&[10_000], Dtype::Float32, &k).unwrap());
    let (mean, std) = mean_std(&g);
    assert!((mean - 0.5772).abs() < 0.07, "{mean}");
    assert!((std - 1.2825).abs() < 0.07, "{std}");
}

#[test]
fn categorical_respects_impossible_and_frequencies() {
    let k = random::key(42).unwrap();
    let ninf = f32::NEG_INFINITY;
    let logits = Array::from_vec(&[ninf, 0.0, ninf]).unwrap();
    let one = random::categorical(&logits, 0, &k).unwrap();
    assert_eq!((one.shape(), one.dtype()), (vec![], Dtype::Uint32));
    assert_eq!(one.item::<u32>().unwrap(), 1);
    let many = random::categorical_n(&logits, -1, 1000, &k).unwrap();
    assert_eq!(many.shape(), vec![1000]);
    assert!(many.to_vec::<u32>().unwrap().iter().all(|&i| i == 1));
    // A batch of two distributions over the last axis: each row's only finite logit wins.
    let rows = Array::from_slice(&[0.0f32, ninf, ninf, ninf, ninf, 5.0], &[2, 3]).unwrap();
    let picks = random::categorical_n(&rows, 1, 50, &k).unwrap();
    assert_eq!(picks.shape(), vec![2, 50]);
    let p = picks.to_vec::<u32>().unwrap();
    assert!(p[..50].iter().all(|&i| i == 0) && p[50..].iter().all(|&i| i == 2));
    // softmax([ln 1, ln 2, ln 7]) = [0.1, 0.2, 0.7]; standard errors <= 0.0033 at 20k.
    let logits = Array::from_vec(&[0.0f32, 2f32.ln(), 7f32.ln()]).unwrap();
    let s = random::categorical_n(&logits, 0, 20_000, &k)
        .unwrap()
        .to_vec::<u32>()
        .unwrap();
    let mut counts = [0usize; 3];
    for &i in &s {
        counts[i as usize] += 1;
    }
    for (c, want) in counts.iter().zip([0.1, 0.2, 0.7]) {
        let got = *c as f64 / 20_000.0;
        assert!((got - want).abs() < 0.02, "{counts:?}");
    }
    // Unnormalised logits give the same distribution: shifting by a constant
    // changes nothing, draw for draw.
    let shifted = ops::add(&logits, &Array::scalar(100.0f32)).unwrap();
    let t = random::categorical_n(&shifted, 0, 20_000, &k)
        .unwrap()
        .to_vec::<u32>()
        .unwrap();
    let agree = s.iter().zip(&t).filter(|(a, b)| a == b).count();
    assert!(agree > 19_000, "{agree}");
}

#[test]
fn bad_arguments_err_then_recover() {
    let k = random::key(0).unwrap();
    let (lo, hi) = (Array::scalar(0.0f32), Array::scalar(1.0f32));
    let err = random::uniform(&lo, &hi, &[4], Dtype::Int32, &k).unwrap_err();
    assert!(matches!(err, Error::Mlx(_)), "{err:?}");
    assert!(err.to_string().contains("uniform"), "{err}");
    let logits = Array::from_vec(&[0.0f32, 1.0]).unwrap();
    let err = random::categorical(&logits, 1, &k).unwrap_err();
    assert!(err.to_string().starts_with("mlx: "), "{err}");
    let bad_key = Array::from_vec(&[1.0f32, 2.0, 3.0]).unwrap();
    assert!(random::normal(&[2], Dtype::Float32, 0.0, 1.0, &bad_key).is_err());
    assert!(matches!(
        random::split(&k, usize::MAX),
        Err(Error::InvalidArgument(_))
    ));
    let v = f(&random::uniform(&lo, &hi, &[4], Dtype::Float32, &k).unwrap());
    assert!(v.iter().all(|&x| (0.0..1.0).contains(&x)));
}
