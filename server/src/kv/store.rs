//! The interface every cache kind implements, and the kinds there are.
//!
//! A store holds one layer's keys and values for a batch of sequences (rows)
//! in its own format and reads them in its own attention: dense arrays and
//! MLX's fused attention, affine-quantized triples and quantized matmuls, a
//! rotating window. Everything outside a store sees only what this trait says:
//! rows go in and out as [`KvRow`]s, attention goes through [`KvStore::attend`].
//! A new kind is a new store file and one arm in [`KvKind`].

use mlx_rs_safe::Array;

use super::affine::AffineStore;
use super::dense::DenseStore;
use super::mask::StepMemo;
use super::recurrent::RecurrentStore;
use super::rotating::RotatingStore;
use super::turbo::{self, TurboFormat, TurboStore};
use crate::error::{Error, Result};

/// A kind of cache and its parameters: two stores of equal kinds can hold
/// their rows together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvKind {
    /// Keys and values as computed, every position kept (mlx-lm's KVCache).
    Dense,
    /// Affine-quantized keys and values (`--kv-bits`; mlx-lm's QuantizedKVCache).
    Affine { group_size: i32, bits: i32 },
    /// The last `max_size` positions of a sliding-window layer (RotatingKVCache).
    Rotating { max_size: i32 },
    /// TurboQuant: rotated, codebook- or affine-coded keys and values (`--turbo-kv`).
    Turbo(TurboFormat),
    /// A linear-attention layer's convolution and recurrent state (Qwen3.5's
    /// Gated DeltaNet; mlx-lm's ArraysCache): no keys or values, `state_bytes`
    /// per sequence whatever its length (the window at 16 bits, the float32
    /// matrix), for the memory plan.
    Recurrent { state_bytes: u32 },
}

/// One sequence's keys and values in one layer, in its kind's format: what a
/// store gives out when a row leaves a batch (for the prompt cache or another
/// batch) and takes in when one joins.
#[derive(Clone)]
pub struct KvRow {
    pub kind: KvKind,
    /// Tokens the sequence has seen (a rotating row keeps fewer).
    pub offset: i32,
    /// The kind's arrays, [1, kv_heads, positions, X] each; none before the first token.
    pub columns: Vec<Array>,
}

/// Attention settings of one layer.
#[derive(Debug, Clone, Copy)]
pub struct AttendArgs<'a> {
    pub scale: f32,
    /// A sliding-window layer attends to this many positions at most.
    pub window: Option<i32>,
    /// Learned attention sinks (gpt-oss): one logit per query head [heads]
    /// that joins each softmax's denominator and attends to nothing.
    pub sinks: Option<&'a Array>,
    /// Keep what this call attends to for a later layer that shares this
    /// layer's keys and values (Gemma 4); otherwise nothing is held past it.
    pub keep: bool,
}

/// How a store returns to where it was before an append.
pub enum UndoPoint {
    /// Drop what was appended since the rows stood at these offsets (stores
    /// that keep every position; nothing if nothing was appended).
    Rewind(Vec<i32>),
    /// Put back the store's state as it was (a recurrent state; a sliding
    /// window whose write overwrites a kept position): its own record, whose
    /// arrays are the earlier arrays themselves, not copies.
    Restore(Box<dyn std::any::Any + Send>),
}

/// Drops what `store` appended since its rows stood at `before`.
pub fn rewind(store: &mut (impl KvStore + ?Sized), before: &[i32]) -> Result<()> {
    let now = store.offsets();
    let n = now.first().zip(before.first()).map_or(0, |(a, b)| a - b);
    if now.len() != before.len() || now.iter().zip(before).any(|(a, b)| a - b != n) || n < 0 {
        return Err(Error::Internal("a cache's rows moved unevenly since its undo point"));
    }
    if n > 0 && store.trim(n)? != n {
        return Err(Error::Internal("a cache could not drop the positions it was to undo"));
    }
    Ok(())
}

pub trait KvStore: Send {
    fn kind(&self) -> KvKind;
    /// Sequences held.
    fn rows(&self) -> usize;
    /// Tokens each row has seen: the position of its next token.
    fn offsets(&self) -> Vec<i32>;
    /// Appends `keys`/`values` ([B, kv_heads, L, head_dim], rows in this
    /// store's order) and returns attention of `queries` ([B, heads, L,
    /// head_dim]) over every row's cached positions and the new ones.
    fn attend(&mut self, queries: &Array, keys: &Array, values: &Array, args: &AttendArgs, masks: &StepMemo) -> Result<Array>;
    /// Row `b` as a [`KvRow`] of this store's kind.
    fn row(&self, b: usize) -> Result<KvRow>;
    /// Drops the newest `n` positions of every row; returns how many went.
    fn trim(&mut self, n: i32) -> Result<i32>;
    /// Taken before `n` positions are appended to every row: what [`undo`]
    /// needs to leave the rows as they were, as a decode step that ran on
    /// guessed experts is undone (`models::speculative_step`). None where it
    /// cannot be.
    ///
    /// [`undo`]: KvStore::undo
    fn undo_point(&self, n: i32) -> Option<UndoPoint>;
    /// Returns to `point` (taken by [`KvStore::undo_point`] before the append).
    fn undo(&mut self, point: &UndoPoint) -> Result<()> {
        match point {
            UndoPoint::Rewind(before) => rewind(self, before),
            UndoPoint::Restore(..) => Err(Error::Internal("a saved state given to a cache that keeps positions")),
        }
    }
    /// These rows converted to `target` (the compression hook: a dense store
    /// becomes affine today), or None when this kind does not convert to it.
    fn compress(&self, target: &KvKind) -> Result<Option<Box<dyn KvStore>>>;
    /// The arrays holding the cache, to evaluate.
    fn state(&self) -> Vec<Array>;
    /// What the last `attend` call attended to, when it was asked to keep it
    /// (`AttendArgs::keep`): for a layer sharing this layer's keys and values
    /// (Gemma 4's KV-shared layers). None otherwise, and for kinds that keep
    /// nothing.
    fn last_attended(&self) -> Option<&super::sdpa::Attended> {
        None
    }
    /// The state of a linear-attention layer, which its model updates
    /// itself; None for the kinds attention reads.
    fn recurrent(&mut self) -> Option<&mut RecurrentStore> {
        None
    }
    /// Bytes held.
    fn nbytes(&self) -> usize;

    /// Makes room for `positions` in all at the next growth (one sequence's
    /// prompt, prefilled chunk by chunk); kinds of a bounded size ignore it.
    fn reserve(&mut self, _positions: i32) {}
}

impl KvKind {
    /// Whether the layer keeps every position (full attention, compressed or
    /// not), as against a sliding window or a recurrent state.
    pub fn keeps_every_position(&self) -> bool {
        matches!(self, KvKind::Dense | KvKind::Affine { .. } | KvKind::Turbo(_))
    }

    /// A store of this kind holding `rows` (all of this kind), left-padded to
    /// the longest.
    pub fn store(&self, rows: &[KvRow]) -> Result<Box<dyn KvStore>> {
        Ok(match *self {
            KvKind::Dense => Box::new(DenseStore::from_rows(rows)?),
            KvKind::Affine { group_size, bits } => Box::new(AffineStore::from_rows(rows, group_size, bits)?),
            KvKind::Rotating { max_size } => Box::new(RotatingStore::from_rows(rows, max_size)?),
            KvKind::Turbo(format) => Box::new(TurboStore::from_rows(rows, format)?),
            KvKind::Recurrent { state_bytes } => Box::new(RecurrentStore::from_rows(rows, state_bytes)?),
        })
    }

    /// A store of this kind for `rows` sequences without tokens (a TurboQuant
    /// cache is made by compressing a prompt, never empty).
    pub fn empty_store(&self, rows: usize) -> Result<Box<dyn KvStore>> {
        Ok(match *self {
            KvKind::Dense => Box::new(DenseStore::empty(rows)),
            KvKind::Affine { group_size, bits } => Box::new(AffineStore::empty(rows, group_size, bits)),
            KvKind::Rotating { max_size } => Box::new(RotatingStore::empty(rows, max_size)),
            KvKind::Recurrent { state_bytes } => Box::new(RecurrentStore::empty(rows, state_bytes)),
            KvKind::Turbo(_) => return Err(Error::Internal("a TurboQuant cache starts from a compressed prompt")),
        })
    }

    /// A store of this kind for sequences without tokens whose prompts arrive
    /// left-padded to the longest, `left_pad[b]` positions for row b (several
    /// prompts prefilled in one call); None for the kinds that cannot take
    /// padding ahead of a row's tokens (a sliding window, a recurrent state,
    /// a compressed store, which starts from a prefilled one).
    pub fn padded_store(&self, left_pad: &[i32]) -> Option<Box<dyn KvStore>> {
        match self {
            KvKind::Dense => Some(Box::new(DenseStore::padded_ahead(left_pad.to_vec()))),
            KvKind::Affine { .. } | KvKind::Rotating { .. } | KvKind::Turbo(_) | KvKind::Recurrent { .. } => None,
        }
    }
}

impl KvRow {
    /// The longest prefix of at most `n` tokens this row can restore: any
    /// length for kinds that keep every position; a rotating row, only where
    /// the window before that length is still held.
    pub fn servable(&self, n: i32) -> i32 {
        match self.kind {
            KvKind::Rotating { max_size } => super::rotating::servable(self, n, max_size),
            KvKind::Turbo(_) => turbo::servable(self, n),
            KvKind::Recurrent { .. } => super::recurrent::servable(self, n),
            KvKind::Dense | KvKind::Affine { .. } => n.min(self.offset),
        }
    }

    /// The first `n` tokens (`n` must be [`Self::servable`]).
    pub fn prefix(&self, n: i32) -> Result<KvRow> {
        match self.kind {
            KvKind::Rotating { max_size } => super::rotating::prefix(self, n, max_size),
            KvKind::Turbo(_) => turbo::prefix(self, n),
            KvKind::Recurrent { .. } => super::recurrent::prefix(self, n),
            // Positions are tokens: the first n of every column (quantization
            // groups run along the last axis, so a prefix of codes is the
            // quantized prefix).
            KvKind::Dense | KvKind::Affine { .. } => Ok(KvRow {
                kind: self.kind,
                offset: n,
                columns: self
                    .columns
                    .iter()
                    .map(|c| Ok(mlx_rs_safe::ops::slice_axis(c, 2, 0, n)?))
                    .collect::<Result<_>>()?,
            }),
        }
    }

    pub fn nbytes(&self) -> usize {
        self.columns.iter().map(Array::nbytes).sum()
    }
}
