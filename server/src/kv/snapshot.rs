//! One sequence's KV, every layer, as the prompt cache keeps it: each layer's
//! row in its own kind's format (plain, quantized, a rotating window), so a
//! later request can start from a prefix of it.

use mlx_rs_safe::{eval, ops, Array};

use super::store::KvRow;
use crate::error::Result;

#[derive(Clone)]
pub struct KvSnapshot {
    pub layers: Vec<KvRow>,
}

impl KvSnapshot {
    /// Tokens the sequence had seen.
    pub fn len(&self) -> i32 {
        self.layers.first().map(|r| r.offset).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn nbytes(&self) -> usize {
        self.layers.iter().map(KvRow::nbytes).sum()
    }

    /// The longest prefix of at most `n` tokens every layer can restore.
    pub fn servable(&self, n: i32) -> i32 {
        self.layers.iter().map(|r| r.servable(n)).min().unwrap_or(0)
    }

    /// The first `n` tokens of every layer (`n` from [`Self::servable`]).
    pub fn prefix(&self, n: i32) -> Result<KvSnapshot> {
        Ok(KvSnapshot { layers: self.layers.iter().map(|r| r.prefix(n)).collect::<Result<_>>()? })
    }

    /// Copies of the arrays, computed now, so they stop sharing (and keeping
    /// alive) the buffer of the batch they were sliced from. Left lazy, a copy
    /// would hold on to its whole source buffer until first used.
    pub fn detached(&self) -> Result<KvSnapshot> {
        let mut layers = Vec::with_capacity(self.layers.len());
        for r in &self.layers {
            let columns = r.columns.iter().map(|c| Ok(ops::contiguous(c, false)?)).collect::<Result<Vec<Array>>>()?;
            layers.push(KvRow { kind: r.kind, offset: r.offset, columns });
        }
        let arrays: Vec<&Array> = layers.iter().flat_map(|r: &KvRow| r.columns.iter()).collect();
        eval(&arrays)?;
        Ok(KvSnapshot { layers })
    }
}
