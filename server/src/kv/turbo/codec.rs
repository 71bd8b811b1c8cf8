//! TurboQuant formats and their encoding and decoding with MLX ops — the
//! reference on every backend, the CPU path, and what GPU kernels are tested
//! against. All of it works in the rotated basis: callers rotate keys, values
//! and queries once (see `rotation.rs`) and rotate attention's output back.
//!
//! Per token and head, a format stores one row of bytes (one array, so a
//! decode step appends a position with one update): the key's and the
//! value's code columns, then their scales and norms, each column's elements
//! in its own type, the row rounded up to 4 bytes. Codes first keeps every
//! column aligned to its type's size and the code words to 4 bytes, as the
//! GPU kernels read them. The columns (byte-aligned, so no code spans bytes):
//! - a codebook vector: `bits` per coordinate (4-bit as nibbles; 3-bit as a
//!   2-bit plane then a 1-bit plane; 2-bit as 4 per byte) and an fp16 norm,
//!   corrected so that the decoded vector has the original length;
//! - 8-bit affine keys: MLX's affine quantization of the rotated key, one group
//!   per head (at most 128 wide);
//! - QJL keys: a codebook vector, the signs of the sketched residual (1 bit per
//!   coordinate) and the residual's fp16 norm.

use mlx_rs_safe::{ops, quantized, Array, Dtype};

use super::codebook::Codebook;
use super::f32s;
use super::rotation::Rotation;
use crate::error::Result;

/// Tokens at the start of each sequence kept unquantized (attention sinks).
pub const SINKS: i32 = 4;

/// How keys are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyCode {
    /// 8-bit affine quantization of the rotated key.
    Affine8,
    /// A Lloyd-Max codebook of this many bits per coordinate, and the norm.
    Codebook(u8),
    /// A codebook vector plus a 1-bit QJL sketch of the residual (the paper's
    /// inner-product quantizer).
    CodebookQjl(u8),
}

/// One layer's TurboQuant format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TurboFormat {
    pub key: KeyCode,
    /// Codebook bits per value coordinate.
    pub value_bits: u8,
}

impl TurboFormat {
    /// The columns of a row at head dimension `dim` (type, elements), the
    /// key's then the value's; `scale` is the type of affine keys' scales
    /// and biases (the model's).
    fn columns(&self, dim: i32, scale: Dtype) -> Vec<(Dtype, i32)> {
        let bytes = |bits: u8| dim * bits as i32 / 8;
        let mut cols = match self.key {
            KeyCode::Affine8 => vec![(Dtype::Uint32, dim / 4), (scale, dim / affine_group(dim)), (scale, dim / affine_group(dim))],
            KeyCode::Codebook(b) => vec![(Dtype::Uint8, bytes(b)), (Dtype::Float16, 1)],
            KeyCode::CodebookQjl(b) => vec![(Dtype::Uint8, bytes(b)), (Dtype::Float16, 1), (Dtype::Uint8, bytes(1)), (Dtype::Float16, 1)],
        };
        cols.extend([(Dtype::Uint8, bytes(self.value_bits)), (Dtype::Float16, 1)]);
        cols
    }

    /// How many of `columns` hold the key.
    fn key_columns(&self) -> usize {
        match self.key {
            KeyCode::Affine8 => 3,
            KeyCode::Codebook(_) => 2,
            KeyCode::CodebookQjl(_) => 4,
        }
    }

    /// Bytes of the key's columns.
    fn key_bytes(&self, dim: i32, scale: Dtype) -> i32 {
        self.columns(dim, scale)[..self.key_columns()].iter().map(|&(t, n)| n * t.size_of() as i32).sum()
    }

    /// Where each of `columns` starts in a row (codes, then floats, each in
    /// the columns' order), and the row's bytes, padding included.
    fn placement(&self, dim: i32, scale: Dtype) -> (Vec<i32>, i32) {
        let cols = self.columns(dim, scale);
        let mut at = vec![0; cols.len()];
        let mut end = 0;
        for floats in [false, true] {
            for (i, &(t, n)) in cols.iter().enumerate() {
                if t.is_floating() == floats {
                    at[i] = end;
                    end += n * t.size_of() as i32;
                }
            }
        }
        (at, (end + 3) / 4 * 4)
    }

    /// Bytes of one stored position, padding included.
    pub fn row_bytes(&self, dim: i32, scale: Dtype) -> i32 {
        self.placement(dim, scale).1
    }

    /// Bits stored per dimension for keys and for values at head dimension
    /// `dim`, norms and scales included (16-bit scales; the row's padding
    /// counted with the values).
    pub fn bits_per_dim(&self, dim: i32) -> (f64, f64) {
        let key = self.key_bytes(dim, Dtype::Float16);
        let row = self.row_bytes(dim, Dtype::Float16);
        (8.0 * key as f64 / dim as f64, 8.0 * (row - key) as f64 / dim as f64)
    }
}

/// The affine group of 8-bit keys: the whole head, at most 128 (MLX's largest).
pub fn affine_group(dim: i32) -> i32 {
    dim.min(128)
}

/// What encodes and decodes one head dimension's vectors in a format, for
/// a model of one dtype (that of affine keys' scales and of the sinks).
pub struct Codec {
    pub format: TurboFormat,
    pub rotation: Rotation,
    pub dtype: Dtype,
    key_book: Option<Codebook>,
    value_book: Codebook,
    /// The codebooks' centroids as arrays, for decoding.
    key_centroids: Option<Array>,
    value_centroids: Array,
    tables: Tables,
}

/// The rotation's signs and the codebooks as the GPU kernels take them
/// (float32; a one-element placeholder where the format has no key codebook).
pub struct Tables {
    /// s1, s2, s3: [3 × D].
    pub signs: Array,
    pub key_bounds: Array,
    pub key_centroids: Array,
    pub value_bounds: Array,
    pub value_centroids: Array,
}

fn scalar(v: f32) -> Array {
    Array::scalar(v)
}

/// `sqrt(sum(x², -1))`, keeping the axis.
fn norm(x: &Array) -> Result<Array> {
    Ok(ops::sqrt(&ops::sum(&ops::square(x)?, &[-1], true)?)?)
}

/// `x` with its last axis split into groups of `n`: [..., D] → [..., D/n, n].
fn groups(x: &Array, n: i32) -> Result<Array> {
    let mut shape = x.shape();
    let d = shape.pop().unwrap_or(0);
    shape.extend([d / n, n]);
    Ok(ops::reshape(x, &shape)?)
}

/// Packs `n`-bit fields (values below 2^n, uint8 [..., D]) `8/n` to a byte.
fn pack_fields(x: &Array, n: u8) -> Result<Array> {
    let per = 8 / n as i32;
    let shifts: Vec<u8> = (0..per).map(|i| (i as u8) * n).collect();
    let shifted = ops::left_shift(&groups(x, per)?, &Array::from_vec(&shifts)?)?;
    // The fields do not overlap, so their sum is their bitwise or.
    Ok(ops::astype(&ops::sum(&shifted, &[-1], false)?, Dtype::Uint8)?)
}

/// The `n`-bit fields of packed bytes ([..., B] → [..., B·8/n]).
fn unpack_fields(x: &Array, n: u8) -> Result<Array> {
    let per = 8 / n as i32;
    let shifts: Vec<u8> = (0..per).map(|i| (i as u8) * n).collect();
    let fields = ops::right_shift(&ops::expand_dims(x, &[-1])?, &Array::from_vec(&shifts)?)?;
    let fields = ops::bitwise_and(&fields, &Array::scalar((1u8 << n) - 1))?;
    let mut shape = x.shape();
    let last = shape.pop().unwrap_or(0);
    shape.push(last * per);
    Ok(ops::reshape(&fields, &shape)?)
}

/// Codes (uint8, each below 2^bits, [..., D]) packed byte-aligned.
pub fn pack(codes: &Array, bits: u8) -> Result<Array> {
    match bits {
        3 => {
            let low = pack_fields(&ops::bitwise_and(codes, &Array::scalar(3u8))?, 2)?;
            let high = pack_fields(&ops::right_shift(codes, &Array::scalar(2u8))?, 1)?;
            Ok(ops::concatenate(&[&low, &high], -1)?)
        }
        b => pack_fields(codes, b),
    }
}

/// The codes of `dim` coordinates packed by [`pack`].
pub fn unpack(packed: &Array, bits: u8, dim: i32) -> Result<Array> {
    match bits {
        3 => {
            let low = unpack_fields(&ops::slice_axis(packed, -1, 0, dim / 4)?, 2)?;
            let high = unpack_fields(&ops::slice_axis(packed, -1, dim / 4, dim / 4 + dim / 8)?, 1)?;
            Ok(ops::bitwise_or(&low, &ops::left_shift(&high, &Array::scalar(2u8))?)?)
        }
        b => unpack_fields(packed, b),
    }
}

impl Codec {
    pub fn new(format: TurboFormat, dim: i32, dtype: Dtype) -> Result<Codec> {
        let key_book = match format.key {
            KeyCode::Affine8 => None,
            KeyCode::Codebook(b) | KeyCode::CodebookQjl(b) => Some(Codebook::new(b, dim)?),
        };
        let value_book = Codebook::new(format.value_bits, dim)?;
        let key_centroids = key_book.as_ref().map(|b| Array::from_vec(&b.centroids)).transpose()?;
        let rotation = Rotation::new(dim)?;
        let placeholder = [0.0f32];
        let tables = Tables {
            signs: Array::from_vec(&rotation.signs.concat())?,
            key_bounds: Array::from_vec(key_book.as_ref().map(|b| b.boundaries.as_slice()).unwrap_or(&placeholder))?,
            key_centroids: Array::from_vec(key_book.as_ref().map(|b| b.centroids.as_slice()).unwrap_or(&placeholder))?,
            value_bounds: Array::from_vec(&value_book.boundaries)?,
            value_centroids: Array::from_vec(&value_book.centroids)?,
        };
        Ok(Codec {
            value_centroids: Array::from_vec(&value_book.centroids)?,
            key_centroids,
            key_book,
            value_book,
            rotation,
            dtype,
            format,
            tables,
        })
    }

    /// The tables the GPU kernels take.
    pub fn tables(&self) -> &Tables {
        &self.tables
    }

    pub fn dim(&self) -> i32 {
        self.rotation.dim
    }

    /// Bytes of one stored position.
    pub fn row_bytes(&self) -> i32 {
        self.format.row_bytes(self.dim(), self.dtype)
    }

    /// The rows ([..., row_bytes] uint8) of rotated keys `kr` and values `vr`
    /// ([..., D]).
    pub fn encode(&self, kr: &Array, vr: &Array) -> Result<Array> {
        let mut cols = self.encode_keys(kr)?;
        cols.extend(self.encode_values(vr)?);
        let (at, row) = self.format.placement(self.dim(), self.dtype);
        let mut placed: Vec<(i32, Array)> = Vec::with_capacity(cols.len() + 1);
        for (c, &start) in cols.iter().zip(&at) {
            placed.push((start, ops::view(c, Dtype::Uint8)?));
        }
        placed.sort_by_key(|(start, _)| *start);
        let used: i32 = placed.iter().map(|(_, b)| b.shape().last().copied().unwrap_or(0)).sum();
        if used < row {
            let mut shape = kr.shape();
            if let Some(last) = shape.last_mut() {
                *last = row - used;
            }
            placed.push((used, ops::zeros(&shape, Dtype::Uint8)?));
        }
        Ok(ops::concatenate(&placed.iter().map(|(_, b)| b).collect::<Vec<_>>(), -1)?)
    }

    /// Rotated keys and values from their rows, as `dtype`.
    pub fn decode(&self, rows: &Array, dtype: Dtype) -> Result<(Array, Array)> {
        if rows.size() == 0 {
            // No positions (a history all in the recent window): MLX cannot
            // reshape an empty array's columns.
            let mut shape = rows.shape();
            if let Some(last) = shape.last_mut() {
                *last = self.dim();
            }
            let empty = ops::zeros(&shape, dtype)?;
            return Ok((empty.clone(), empty));
        }
        let last = rows.shape().len().saturating_sub(1) as i32;
        let (at, _) = self.format.placement(self.dim(), self.dtype);
        let mut cols = Vec::new();
        for ((t, n), start) in self.format.columns(self.dim(), self.dtype).into_iter().zip(at) {
            cols.push(ops::view(&ops::slice_axis(rows, last, start, start + n * t.size_of() as i32)?, t)?);
        }
        let nk = self.format.key_columns();
        Ok((self.decode_keys(&cols[..nk], dtype)?, self.decode_values(&cols[nk..], dtype)?))
    }

    /// Codebook codes and corrected norms of rotated vectors `x` (float32):
    /// (codes uint8 [..., D], norms float32 [..., 1], the decoded vectors).
    fn quantize(&self, book: &Codebook, centroids: &Array, x: &Array) -> Result<(Array, Array, Array)> {
        let n = norm(x)?;
        let unit = ops::divide(x, &ops::maximum(&n, &scalar(1e-20))?)?;
        // The code is the number of boundaries below the coordinate: one
        // comparison per boundary, never a [..., D, 2^bits - 1] tensor.
        let mut codes = ops::zeros(&unit.shape(), Dtype::Uint8)?;
        for &b in &book.boundaries {
            codes = ops::add(&codes, &ops::astype(&ops::greater(&unit, &scalar(b))?, Dtype::Uint8)?)?;
        }
        let direction = ops::take(centroids, &codes, 0)?;
        // Corrected norm: the decoded vector has the original length.
        let corrected = ops::divide(&n, &ops::maximum(&norm(&direction)?, &scalar(1e-20))?)?;
        let decoded = ops::multiply(&direction, &corrected)?;
        Ok((codes, corrected, decoded))
    }

    fn norm_column(n: &Array) -> Result<Array> {
        Ok(ops::astype(n, Dtype::Float16)?)
    }

    /// The key columns of rotated keys `kr` ([..., D]).
    fn encode_keys(&self, kr: &Array) -> Result<Vec<Array>> {
        let kr = f32s(kr)?;
        match (self.format.key, &self.key_book, &self.key_centroids) {
            (KeyCode::Codebook(bits), Some(book), Some(c)) => {
                let (codes, n, _) = self.quantize(book, c, &kr)?;
                Ok(vec![pack(&codes, bits)?, Self::norm_column(&n)?])
            }
            (KeyCode::CodebookQjl(bits), Some(book), Some(c)) => {
                let (codes, n, decoded) = self.quantize(book, c, &kr)?;
                let residual = ops::subtract(&kr, &decoded)?;
                let gamma = norm(&residual)?;
                let signs = ops::astype(&ops::greater(&self.rotation.sketch(&residual)?, &scalar(0.0))?, Dtype::Uint8)?;
                Ok(vec![pack(&codes, bits)?, Self::norm_column(&n)?, pack(&signs, 1)?, Self::norm_column(&gamma)?])
            }
            _ => {
                let (q, s, b) = quantized::quantize(&ops::astype(&kr, self.dtype)?, affine_group(self.dim()), 8)?;
                Ok(vec![q, s, b])
            }
        }
    }

    /// The value columns of rotated values `vr` ([..., D]).
    fn encode_values(&self, vr: &Array) -> Result<Vec<Array>> {
        let (codes, n, _) = self.quantize(&self.value_book, &self.value_centroids, &f32s(vr)?)?;
        Ok(vec![pack(&codes, self.format.value_bits)?, Self::norm_column(&n)?])
    }

    /// Rotated keys from their columns, as `dtype`.
    fn decode_keys(&self, cols: &[Array], dtype: Dtype) -> Result<Array> {
        let d = self.dim();
        let k = match (self.format.key, &self.key_centroids) {
            (KeyCode::Codebook(bits), Some(c)) => {
                ops::multiply(&ops::take(c, &unpack(&cols[0], bits, d)?, 0)?, &f32s(&cols[1])?)?
            }
            (KeyCode::CodebookQjl(bits), Some(c)) => {
                let mse = ops::multiply(&ops::take(c, &unpack(&cols[0], bits, d)?, 0)?, &f32s(&cols[1])?)?;
                // z ∈ {±1}: the residual's direction is √(π/2)/√d · γ · Sᵀz.
                let z = ops::subtract(&ops::multiply(&f32s(&unpack(&cols[2], 1, d)?)?, &scalar(2.0))?, &scalar(1.0))?;
                let qjl = std::f32::consts::FRAC_PI_2.sqrt() / (d as f32).sqrt();
                let correction = ops::multiply(&self.rotation.sketch_transpose(&z)?, &ops::multiply(&f32s(&cols[3])?, &scalar(qjl))?)?;
                ops::add(&mse, &correction)?
            }
            _ => quantized::dequantize(&cols[0], &cols[1], Some(&cols[2]), affine_group(d), 8)?,
        };
        Ok(ops::astype(&k, dtype)?)
    }

    /// Rotated values from their columns, as `dtype`.
    fn decode_values(&self, cols: &[Array], dtype: Dtype) -> Result<Array> {
        let codes = unpack(&cols[0], self.format.value_bits, self.dim())?;
        let v = ops::multiply(&ops::take(&self.value_centroids, &codes, 0)?, &f32s(&cols[1])?)?;
        Ok(ops::astype(&v, dtype)?)
    }
}

#[cfg(test)]
mod tests {
    use super::super::codebook::expected_mse;
    use super::*;
    use crate::kv::values;
    use mlx_rs_safe::random;

    #[test]
    fn packing_round_trips_every_width() {
        for bits in [1u8, 2, 3, 4] {
            let codes: Vec<u8> = (0..256u32).map(|i| ((i * 37 + 11) % (1 << bits)) as u8).collect();
            let a = Array::from_slice(&codes, &[2, 128]).unwrap();
            let packed = pack(&a, bits).unwrap();
            assert_eq!(packed.shape(), vec![2, 128 * bits as i32 / 8], "{bits}-bit packing is byte-aligned");
            assert_eq!(unpack(&packed, bits, 128).unwrap().to_vec::<u8>().unwrap(), codes, "{bits} bits");
        }
    }

    #[test]
    fn a_row_holds_every_column_and_decodes_as_they_do() {
        let formats = [KeyCode::Affine8, KeyCode::Codebook(4), KeyCode::CodebookQjl(3)];
        for (key, dim, dtype) in [(0, 128, Dtype::Bfloat16), (1, 64, Dtype::Float16), (2, 128, Dtype::Float32), (0, 256, Dtype::Float32), (0, 64, Dtype::Bfloat16)] {
            let codec = Codec::new(TurboFormat { key: formats[key], value_bits: 3 }, dim, dtype).unwrap();
            let x = |seed| random::normal(&[2, 3, dim], Dtype::Float32, 0.0, 1.0, &random::key(seed).unwrap()).unwrap();
            let (kr, vr) = (x(1), x(2));
            let rows = codec.encode(&kr, &vr).unwrap();
            assert_eq!(rows.shape(), vec![2, 3, codec.row_bytes()]);
            assert_eq!(codec.row_bytes() % 4, 0);
            let (k, v) = codec.decode(&rows, Dtype::Float32).unwrap();
            let want_k = codec.decode_keys(&codec.encode_keys(&kr).unwrap(), Dtype::Float32).unwrap();
            let want_v = codec.decode_values(&codec.encode_values(&vr).unwrap(), Dtype::Float32).unwrap();
            assert_eq!(values(&k), values(&want_k), "{:?} d={dim} {dtype:?}", formats[key]);
            assert_eq!(values(&v), values(&want_v), "{:?} d={dim} {dtype:?}", formats[key]);
        }
        // What a position costs: 8.25 + 3.25 bits per dimension for `balanced`
        // at d = 128 (its 182 bytes padded to 184): 0.359x of 16-bit.
        let balanced = TurboFormat { key: KeyCode::Affine8, value_bits: 3 };
        assert_eq!(balanced.row_bytes(128, Dtype::Bfloat16), 184);
        assert_eq!(balanced.bits_per_dim(128), (8.25, 3.25));
    }

    /// The mean squared error of encoding random unit vectors, per vector.
    fn distortion(codec: &Codec, dim: i32) -> f64 {
        let x = random::normal(&[4096, dim], Dtype::Float32, 0.0, 1.0, &random::key(7).unwrap()).unwrap();
        let x = ops::divide(&x, &norm(&x).unwrap()).unwrap();
        let xr = codec.rotation.apply(&x).unwrap();
        let back = codec.decode_values(&codec.encode_values(&xr).unwrap(), Dtype::Float32).unwrap();
        let err = ops::sum(&ops::square(&ops::subtract(&back, &xr).unwrap()).unwrap(), &[-1], false).unwrap();
        values(&ops::mean(&err, &[0], false).unwrap())[0] as f64
    }

    #[test]
    fn encode_decode_distortion_is_the_papers() {
        for (bits, dim) in [(3u8, 128), (4, 128), (2, 128), (3, 64), (3, 256)] {
            let codec = Codec::new(TurboFormat { key: KeyCode::Affine8, value_bits: bits }, dim, Dtype::Float32).unwrap();
            let mse = distortion(&codec, dim);
            // The corrected norm trades a little MSE for an unbiased length; the
            // Gaussian table fits the sphere to within a few percent at d ≥ 64.
            let want = expected_mse(bits);
            assert!(mse > 0.8 * want && mse < 1.25 * want, "{bits}-bit d={dim}: {mse} vs {want}");
        }
    }

    #[test]
    fn zero_vectors_encode_to_zero() {
        let codec = Codec::new(TurboFormat { key: KeyCode::CodebookQjl(3), value_bits: 3 }, 64, Dtype::Float32).unwrap();
        let z = ops::zeros(&[2, 64], Dtype::Float32).unwrap();
        let v = codec.decode_values(&codec.encode_values(&z).unwrap(), Dtype::Float32).unwrap();
        let k = codec.decode_keys(&codec.encode_keys(&z).unwrap(), Dtype::Float32).unwrap();
        assert!(values(&v).iter().chain(values(&k).iter()).all(|x| x.abs() < 1e-6 && x.is_finite()));
    }

    #[test]
    fn qjl_keys_recover_the_residuals_inner_product_at_the_right_scale() {
        // 3-bit + QJL decodes to the 3-bit vector plus the sketch's estimate of
        // the residual; that estimate must be unbiased: regressed on the true
        // ⟨q, residual⟩ over many keys its slope is 1 (a mis-scaled sketch —
        // SwiftLM's is 11x too small at d = 128 — gives 0.09).
        let dim = 128;
        let qjl = Codec::new(TurboFormat { key: KeyCode::CodebookQjl(3), value_bits: 3 }, dim, Dtype::Float32).unwrap();
        let plain = Codec::new(TurboFormat { key: KeyCode::Codebook(3), value_bits: 3 }, dim, Dtype::Float32).unwrap();
        let k = random::normal(&[4096, dim], Dtype::Float32, 0.0, 1.0, &random::key(3).unwrap()).unwrap();
        let q = random::normal(&[1, dim], Dtype::Float32, 0.0, 1.0, &random::key(4).unwrap()).unwrap();
        let dot = |keys: &Array| values(&ops::matmul(keys, &ops::transpose(&q).unwrap()).unwrap());
        let decoded = |c: &Codec| {
            let kr = c.rotation.apply(&k).unwrap();
            c.rotation.invert(&c.decode_keys(&c.encode_keys(&kr).unwrap(), Dtype::Float32).unwrap()).unwrap()
        };
        let (exact, with_qjl, mse_only) = (dot(&k), dot(&decoded(&qjl)), dot(&decoded(&plain)));
        let (mut ct, mut tt) = (0.0f64, 0.0f64);
        for i in 0..exact.len() {
            let truth = (exact[i] - mse_only[i]) as f64;
            ct += (with_qjl[i] - mse_only[i]) as f64 * truth;
            tt += truth * truth;
        }
        let slope = ct / tt;
        assert!((0.85..1.15).contains(&slope), "the QJL correction's slope on the true residual is {slope}");
        let err = |est: &[f32]| est.iter().zip(&exact).map(|(e, x)| ((e - x) as f64).powi(2)).sum::<f64>();
        assert!(err(&with_qjl) < err(&mse_only), "the sketch should lower the inner-product error");
    }
}
