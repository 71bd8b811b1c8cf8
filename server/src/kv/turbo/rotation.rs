//! The randomized Hadamard rotation R(x) = s2 ⊙ H(s1 ⊙ x) / √d, and its
//! inverse Rᵀ(y) = s1 ⊙ H(s2 ⊙ y) / √d (H is symmetric, H·H = d·I). After it,
//! the coordinates of a vector are close to independent and Gaussian whatever
//! the outliers of the original, so one fixed scalar codebook fits every
//! channel. A third sign vector s3 makes the independent sketch S(x) =
//! H(s3 ⊙ x) / √d of the QJL residual (`paper` preset).
//!
//! The signs are fixed by a seeded generator (the same in every process and on
//! every backend): a cache compressed by one run is read by the next.

use mlx_rs_safe::{ops, quantized, Array};

use super::f32s;
use crate::error::Result;

#[derive(Clone)]
pub struct Rotation {
    pub dim: i32,
    /// ±1 as float32, [dim] each.
    pub s1: Array,
    pub s2: Array,
    pub s3: Array,
    /// The same signs on the host (kernels take them as inputs too).
    pub signs: [Vec<f32>; 3],
}

/// SplitMix64: a tiny, well-mixed generator, enough for fixed sign vectors.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn signs(dim: i32, which: u64) -> Vec<f32> {
    let mut state = 0x7E57_0000_0000_0000 ^ ((dim as u64) << 8) ^ which;
    (0..dim).map(|_| if splitmix(&mut state) & 1 == 0 { 1.0 } else { -1.0 }).collect()
}

impl Rotation {
    /// The rotation for head dimension `dim` (a power of two).
    pub fn new(dim: i32) -> Result<Rotation> {
        let signs = [signs(dim, 1), signs(dim, 2), signs(dim, 3)];
        let arr = |v: &[f32]| Array::from_slice(v, &[dim]);
        Ok(Rotation { dim, s1: arr(&signs[0])?, s2: arr(&signs[1])?, s3: arr(&signs[2])?, signs })
    }

    /// H(x)/√d over the last axis, in float32.
    fn hadamard(&self, x: &Array) -> Result<Array> {
        Ok(quantized::hadamard_transform(x, Some(1.0 / (self.dim as f32).sqrt()))?)
    }

    /// R(x) over the last axis, float32.
    pub fn apply(&self, x: &Array) -> Result<Array> {
        let h = self.hadamard(&ops::multiply(&f32s(x)?, &self.s1)?)?;
        Ok(ops::multiply(&h, &self.s2)?)
    }

    /// Rᵀ(y) over the last axis, float32.
    pub fn invert(&self, y: &Array) -> Result<Array> {
        let h = self.hadamard(&ops::multiply(&f32s(y)?, &self.s2)?)?;
        Ok(ops::multiply(&h, &self.s1)?)
    }

    /// The QJL sketch S(x) = H(s3 ⊙ x)/√d.
    pub fn sketch(&self, x: &Array) -> Result<Array> {
        self.hadamard(&ops::multiply(&f32s(x)?, &self.s3)?)
    }

    /// Sᵀ(z) = s3 ⊙ H(z)/√d.
    pub fn sketch_transpose(&self, z: &Array) -> Result<Array> {
        Ok(ops::multiply(&self.hadamard(&f32s(z)?)?, &self.s3)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::values;
    use mlx_rs_safe::{random, Dtype};

    #[test]
    fn the_rotation_is_orthogonal_and_inverts_exactly() {
        for dim in [64, 128, 256] {
            let r = Rotation::new(dim).unwrap();
            // Rotating the identity's rows gives R; R·Rᵀ = I.
            let eye = ops::identity(dim, Dtype::Float32).unwrap();
            let rows = r.apply(&eye).unwrap();
            let gram = ops::matmul(&rows, &ops::transpose(&rows).unwrap()).unwrap();
            let err = values(&ops::abs(&ops::subtract(&gram, &eye).unwrap()).unwrap()).into_iter().fold(0.0f32, f32::max);
            // float32 matmuls run as TF32 on CUDA (~1e-3 relative).
            let tol = if mlx_rs_safe::kernels::gpu_backend() == Some("cuda") { 2e-3 } else { 1e-5 };
            assert!(err < tol, "d={dim}: R Rᵀ differs from I by {err}");
            let x = random::normal(&[3, dim], Dtype::Float32, 0.0, 1.0, &random::key(dim as u64).unwrap()).unwrap();
            let back = r.invert(&r.apply(&x).unwrap()).unwrap();
            let err = values(&ops::abs(&ops::subtract(&back, &x).unwrap()).unwrap()).into_iter().fold(0.0f32, f32::max);
            assert!(err < 1e-5, "d={dim}: Rᵀ R x differs from x by {err}");
            let s = r.sketch_transpose(&r.sketch(&x).unwrap()).unwrap();
            let err = values(&ops::abs(&ops::subtract(&s, &x).unwrap()).unwrap()).into_iter().fold(0.0f32, f32::max);
            assert!(err < 1e-5, "d={dim}: the sketch is orthogonal too");
        }
    }

    #[test]
    fn signs_are_fixed_and_differ_between_the_three_vectors() {
        let a = Rotation::new(128).unwrap();
        let b = Rotation::new(128).unwrap();
        assert_eq!(a.signs, b.signs);
        assert_ne!(a.signs[0], a.signs[1]);
        assert_ne!(a.signs[1], a.signs[2]);
        let plus = a.signs[0].iter().filter(|&&s| s > 0.0).count();
        assert!((40..=88).contains(&plus), "{plus} of 128 signs are +1");
    }
}
