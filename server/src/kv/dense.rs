//! The dense cache: keys and values as the model computed them, every position
//! kept (mlx-lm's KVCache, and BatchKVCache for several rows).

use mlx_rs_safe::{quantized, Array};

use super::affine::AffineStore;
use super::mask::StepMemo;
use super::padded::PaddedRows;
use super::sdpa::Attended;
use super::store::{AttendArgs, KvKind, KvRow, KvStore, UndoPoint};
use super::turbo::{kernels, TurboStore};
use crate::error::{Error, Result};

pub struct DenseStore {
    /// Columns: keys, values.
    rows: PaddedRows,
    /// What the last attention call attended to (for KV-shared layers).
    last: Option<Attended>,
}

impl DenseStore {
    pub fn empty(rows: usize) -> DenseStore {
        DenseStore { rows: PaddedRows::empty(rows), last: None }
    }

    /// One sequence over views of another cache's row (see [`PaddedRows::over_row`]).
    pub fn over_row(columns: Vec<Array>) -> DenseStore {
        DenseStore { rows: PaddedRows::over_row(columns), last: None }
    }

    /// Rows whose first writes are padding (see [`PaddedRows::padded_ahead`]).
    pub fn padded_ahead(left_pad: Vec<i32>) -> DenseStore {
        DenseStore { rows: PaddedRows::padded_ahead(left_pad), last: None }
    }

    pub fn from_rows(rows: &[KvRow]) -> Result<DenseStore> {
        let columns: Vec<Vec<Array>> = rows.iter().map(|r| r.columns.clone()).collect();
        Ok(DenseStore { rows: PaddedRows::from_rows(&columns)?, last: None })
    }

    /// Whether some row starts after position 0 (rows of other lengths), so
    /// MLX's attention would need an array mask.
    fn padded(&self) -> bool {
        self.rows.left_pad().iter().any(|&p| p > 0)
    }

    /// One new token per row attending from each row's own first position,
    /// without a mask (the CUDA kernel, `kernels::dense_attend`).
    fn attend_unmasked(&mut self, queries: &Array, keys: &Array, values: &Array, args: &AttendArgs, masks: &StepMemo) -> Result<Array> {
        self.rows.append(&[keys.clone(), values.clone()])?;
        self.last = None;
        let counts = self.rows.split_counts()?;
        let rows = &self.rows;
        let params = rows.step_params(args.scale, masks)?;
        let [k, v] = rows.buffers() else { return Err(Error::Internal("a dense cache without its key and value columns")) };
        kernels::dense_attend(queries, k, v, &params, rows.written(), &counts)
    }
}

impl KvStore for DenseStore {
    fn kind(&self) -> KvKind {
        KvKind::Dense
    }

    fn rows(&self) -> usize {
        self.rows.rows()
    }

    fn offsets(&self) -> Vec<i32> {
        self.rows.offsets()
    }

    fn attend(&mut self, queries: &Array, keys: &Array, values: &Array, args: &AttendArgs, masks: &StepMemo) -> Result<Array> {
        let n = queries.shape()[2];
        if n == 1 && self.padded() && args.window.is_none() && args.sinks.is_none() && !args.keep && kernels::dense_applies(queries, keys.dim(1)?, keys.dtype()) {
            return self.attend_unmasked(queries, keys, values, args, masks);
        }
        let rows = &self.rows;
        let mask = masks.get(rows.mask_key("dense", n, args.window), || rows.mask(n, args.window))?;
        let kv = self.rows.append(&[keys.clone(), values.clone()])?;
        Attended { keys: kv[0].clone(), values: kv[1].clone(), mask }.attend_keeping(queries, args, &mut self.last)
    }

    fn last_attended(&self) -> Option<&Attended> {
        self.last.as_ref()
    }

    fn row(&self, b: usize) -> Result<KvRow> {
        Ok(KvRow { kind: KvKind::Dense, offset: self.rows.offset(b)?, columns: self.rows.row(b)? })
    }

    fn trim(&mut self, n: i32) -> Result<i32> {
        Ok(self.rows.trim(n))
    }

    fn undo_point(&self, _n: i32) -> Option<UndoPoint> {
        Some(UndoPoint::Rewind(self.offsets()))
    }

    /// To affine: the whole buffers quantized, as mlx-lm's `KVCache.to_quantized`.
    /// To TurboQuant: rotated and encoded, each row's first tokens kept as sinks.
    fn compress(&self, target: &KvKind) -> Result<Option<Box<dyn KvStore>>> {
        match *target {
            KvKind::Affine { group_size, bits } => {
                let mut columns = Vec::with_capacity(6);
                for c in self.rows.buffers() {
                    let (q, s, b) = quantized::quantize(c, group_size, bits)?;
                    columns.extend([q, s, b]);
                }
                Ok(Some(Box::new(AffineStore::over(self.rows.with_buffers(columns, 0), group_size, bits))))
            }
            KvKind::Turbo(format) => Ok(Some(Box::new(TurboStore::from_dense(&self.rows, format)?))),
            KvKind::Dense | KvKind::Rotating { .. } | KvKind::Recurrent { .. } => Ok(None),
        }
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
