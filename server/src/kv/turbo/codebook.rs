//! Lloyd-Max codebooks for one coordinate of a randomly rotated unit vector.
//! After a random rotation each coordinate of a unit vector in d dimensions is
//! close to N(0, 1/d), so the optimal scalar quantizer is the Lloyd-Max one for
//! the standard normal, scaled by 1/√d (TurboQuant's "MSE" quantizer). The
//! tables are pinned here and checked against a recomputation in the tests: a
//! table fit to the wrong spread doubles the error (llama-cpp-turboquant's
//! 4-bit table did, until its PR #197).

use crate::error::{Error, Result};

/// Positive halves of the N(0, 1) Lloyd-Max centroids (the tables are symmetric).
const HALF_2: [f32; 2] = [0.452_780, 1.510_418];
const HALF_3: [f32; 4] = [0.245_094, 0.756_005, 1.343_909, 2.151_946];
const HALF_4: [f32; 8] = [0.128_395, 0.388_048, 0.656_759, 0.942_340, 1.256_231, 1.618_046, 2.069_017, 2.732_59];

/// Mean squared error per coordinate of the N(0, 1) quantizer: the expected
/// squared error of a quantized unit vector (TurboQuant's D_mse).
#[cfg(test)]
pub fn expected_mse(bits: u8) -> f64 {
    match bits {
        2 => 0.117_482,
        3 => 0.034_548,
        _ => 0.009_501,
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Codebook {
    pub bits: u8,
    /// 2^bits centroids, ascending, for coordinates of a unit vector in `dim` dimensions.
    pub centroids: Vec<f32>,
    /// The 2^bits - 1 midpoints between neighbouring centroids: a coordinate's
    /// code is the number of boundaries below it.
    pub boundaries: Vec<f32>,
}

impl Codebook {
    pub fn new(bits: u8, dim: i32) -> Result<Codebook> {
        let half: &[f32] = match bits {
            2 => &HALF_2,
            3 => &HALF_3,
            4 => &HALF_4,
            other => return Err(Error::Config(format!("TurboQuant codebooks have 2, 3 or 4 bits, not {other}"))),
        };
        let scale = 1.0 / (dim as f32).sqrt();
        let centroids: Vec<f32> = half.iter().rev().map(|c| -c * scale).chain(half.iter().map(|c| c * scale)).collect();
        let boundaries = centroids.windows(2).map(|w| (w[0] + w[1]) / 2.0).collect();
        Ok(Codebook { bits, centroids, boundaries })
    }

    /// The normal-distribution table these centroids were scaled from.
    pub fn unit_normal_half(bits: u8) -> &'static [f32] {
        match bits {
            2 => &HALF_2,
            3 => &HALF_3,
            _ => &HALF_4,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pdf(x: f64) -> f64 {
        (-x * x / 2.0).exp() / (2.0 * std::f64::consts::PI).sqrt()
    }

    /// Φ(x) by Simpson's rule over the density (Rust has no erf; accurate to
    /// ~1e-12 on this smooth integrand).
    fn cdf(x: f64) -> f64 {
        if x.is_infinite() {
            return if x > 0.0 { 1.0 } else { 0.0 };
        }
        let n = 4_000;
        let h = x / n as f64;
        let mut s = pdf(0.0) + pdf(x);
        for i in 1..n {
            s += pdf(i as f64 * h) * if i % 2 == 1 { 4.0 } else { 2.0 };
        }
        0.5 + s * h / 3.0
    }

    /// Lloyd-Max for N(0, 1): boundaries at midpoints, centroids at the
    /// conditional means, iterated to a fixed point.
    fn lloyd_max(bits: u8) -> (Vec<f64>, f64) {
        let n = 1usize << bits;
        let mut c: Vec<f64> = (0..n).map(|i| -3.0 + 6.0 * (i as f64 + 0.5) / n as f64).collect();
        let edges = |c: &[f64]| -> Vec<f64> {
            let mut e = vec![f64::NEG_INFINITY];
            e.extend(c.windows(2).map(|w| (w[0] + w[1]) / 2.0));
            e.push(f64::INFINITY);
            e
        };
        let density = |x: f64| if x.is_infinite() { 0.0 } else { pdf(x) };
        for _ in 0..300 {
            let e = edges(&c);
            c = (0..n).map(|i| (density(e[i]) - density(e[i + 1])) / (cdf(e[i + 1]) - cdf(e[i]))).collect();
        }
        // MSE = E[x²] - Σ P_i c_i² for centroids at conditional means.
        let e = edges(&c);
        let mse = 1.0 - (0..n).map(|i| (cdf(e[i + 1]) - cdf(e[i])) * c[i] * c[i]).sum::<f64>();
        (c, mse)
    }

    #[test]
    fn pinned_tables_equal_lloyd_max_recomputed_for_the_normal_distribution() {
        for bits in [2u8, 3, 4] {
            let (c, mse) = lloyd_max(bits);
            let half = &c[c.len() / 2..];
            for (pinned, computed) in Codebook::unit_normal_half(bits).iter().zip(half) {
                assert!((*pinned as f64 - computed).abs() < 2e-4, "{bits}-bit centroid {pinned} vs {computed}");
            }
            assert!((mse - expected_mse(bits)).abs() < 2e-4, "{bits}-bit mse {mse}");
        }
    }

    #[test]
    fn codebooks_scale_with_the_dimension_and_stay_symmetric() {
        let cb = Codebook::new(3, 128).unwrap();
        assert_eq!(cb.centroids.len(), 8);
        assert_eq!(cb.boundaries.len(), 7);
        assert!((cb.centroids[7] - 2.151_946 / 128f32.sqrt()).abs() < 1e-6);
        assert!(cb.centroids.iter().zip(cb.centroids.iter().rev()).all(|(a, b)| (a + b).abs() < 1e-7));
        assert!(cb.boundaries[3].abs() < 1e-7);
        assert!(Codebook::new(5, 128).is_err());
    }
}
