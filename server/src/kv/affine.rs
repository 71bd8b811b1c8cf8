//! The affine-quantized cache (`--kv-bits`): keys and values stored as MLX
//! quantized triples (packed uint32, scales, biases), read by quantized
//! matmuls — mlx-lm's QuantizedKVCache, here for a batch of rows. Where the
//! device has no quantized matmuls for attention (CUDA), a decode step reads
//! the codes in a kernel (`kernels::affine_attend`), and a prefill chunk
//! dequantizes one layer's history for MLX's attention (held at 16 bits
//! beside the cache for the call).

use mlx_rs_safe::{quantized, Array};

use super::mask::StepMemo;
use super::padded::PaddedRows;
use super::sdpa;
use super::store::{AttendArgs, KvKind, KvRow, KvStore, UndoPoint};
use super::turbo::kernels;
use crate::error::Result;

pub struct AffineStore {
    /// Columns: keys (packed, scales, biases), then values (packed, scales, biases).
    rows: PaddedRows,
    group_size: i32,
    bits: i32,
}

impl AffineStore {
    pub fn empty(rows: usize, group_size: i32, bits: i32) -> AffineStore {
        AffineStore { rows: PaddedRows::empty(rows), group_size, bits }
    }

    /// A store over quantized columns already laid out.
    pub fn over(rows: PaddedRows, group_size: i32, bits: i32) -> AffineStore {
        AffineStore { rows, group_size, bits }
    }

    pub fn from_rows(rows: &[KvRow], group_size: i32, bits: i32) -> Result<AffineStore> {
        let columns: Vec<Vec<Array>> = rows.iter().map(|r| r.columns.clone()).collect();
        Ok(AffineStore { rows: PaddedRows::from_rows(&columns)?, group_size, bits })
    }
}

impl KvStore for AffineStore {
    fn kind(&self) -> KvKind {
        KvKind::Affine { group_size: self.group_size, bits: self.bits }
    }

    fn rows(&self) -> usize {
        self.rows.rows()
    }

    fn offsets(&self) -> Vec<i32> {
        self.rows.offsets()
    }

    fn attend(&mut self, queries: &Array, keys: &Array, values: &Array, args: &AttendArgs, masks: &StepMemo) -> Result<Array> {
        let n = queries.shape()[2];
        let (kq, ks, kb) = quantized::quantize(keys, self.group_size, self.bits)?;
        let (vq, vs, vb) = quantized::quantize(values, self.group_size, self.bits)?;
        let on_kernel = n == 1
            && args.window.is_none()
            && args.sinks.is_none()
            && kernels::affine_applies(queries, keys.dim(1)?, self.group_size, self.bits, ks.dtype());
        if on_kernel {
            // Read as codes from the whole buffers, each row from its first position.
            self.rows.append(&[kq, ks, kb, vq, vs, vb])?;
            let params = self.rows.step_params(args.scale, masks)?;
            let counts = self.rows.split_counts()?;
            let c = self.rows.buffers();
            return kernels::affine_attend(queries, &c[..3], &c[3..], &params, self.rows.written(), self.group_size, self.bits, &counts);
        }
        let rows = &self.rows;
        let mask = masks.get(rows.mask_key("affine", n, args.window), || rows.mask(n, args.window))?;
        let c = self.rows.append(&[kq, ks, kb, vq, vs, vb])?;
        let attend = if sdpa::quantized_matmuls_run() { sdpa::quantized } else { sdpa::dequantized };
        attend(queries, &c[..3], &c[3..], args.scale, &mask, args.sinks, self.group_size, self.bits)
    }

    fn row(&self, b: usize) -> Result<KvRow> {
        Ok(KvRow { kind: self.kind(), offset: self.rows.offset(b)?, columns: self.rows.row(b)? })
    }

    fn trim(&mut self, n: i32) -> Result<i32> {
        Ok(self.rows.trim(n))
    }

    fn undo_point(&self, _n: i32) -> Option<UndoPoint> {
        Some(UndoPoint::Rewind(self.offsets()))
    }

    fn compress(&self, _target: &KvKind) -> Result<Option<Box<dyn KvStore>>> {
        Ok(None)
    }

    fn state(&self) -> Vec<Array> {
        self.rows.arrays()
    }

    fn nbytes(&self) -> usize {
        self.rows.nbytes()
    }

    fn reserve(&mut self, positions: i32) {
        self.rows.reserve(positions);
    }
}
