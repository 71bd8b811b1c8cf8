//! A model's cache for one sequence or a batch of them: one [`LayerCache`]
//! per layer, all holding the same rows in the same order. The engine
//! prefills a sequence in a cache of its own, then moves it into the decode
//! batch's cache; rows leave as [`KvSnapshot`]s for the prompt cache.

use mlx_rs_safe::{eval, Array};

use super::compression::{attention_ranks, CompressAt, KvCompression, Phase};
use super::layer::LayerCache;
use super::mask::StepMemo;
use super::snapshot::KvSnapshot;
use super::store::KvKind;
use crate::error::{Error, Result};

pub struct ModelCache {
    layers: Vec<LayerCache>,
    masks: StepMemo,
    /// Work the last forward pass queued that no cache array depends on (a
    /// pipeline stage handing its output on): evaluated with the state, so a
    /// prefill that evaluates only the cache still hands on.
    pending: Vec<Array>,
}

impl ModelCache {
    /// One sequence without tokens; `kinds` gives each layer's cache kind.
    pub fn new(kinds: &[KvKind]) -> Result<ModelCache> {
        Ok(ModelCache { layers: kinds.iter().map(LayerCache::new).collect::<Result<_>>()?, masks: StepMemo::default(), pending: Vec::new() })
    }

    /// Sequences without tokens for prompts prefilled together in one call,
    /// left-padded to the longest: row b's prompt comes after `left_pad[b]`
    /// positions of padding, which attention never reads. None when a layer's
    /// kind cannot hold padding ahead of a row (see [`KvKind::padded_store`]).
    pub fn padded_prompts(kinds: &[KvKind], left_pad: &[i32]) -> Option<ModelCache> {
        let layers = kinds.iter().map(|k| LayerCache::padded(k, left_pad)).collect::<Option<_>>()?;
        Some(ModelCache { layers, masks: StepMemo::default(), pending: Vec::new() })
    }

    /// Each sequence in a cache of its own, without padding (after a
    /// prefill of several prompts in one call): views of its rows where the
    /// kind allows (see [`LayerCache::row_cache`]), so the split holds no
    /// second copy of the prompts' KV (a row is copied when it joins the
    /// decode batch, as any prefilled sequence is). The call's pending work
    /// (see [`Self::keep_pending`]) goes with the first row, so whoever
    /// waits for the rows' state waits for it too.
    pub fn split_rows(&self) -> Result<Vec<ModelCache>> {
        (0..self.rows())
            .map(|b| {
                let layers = self.layers.iter().map(|l| l.row_cache(b)).collect::<Result<_>>()?;
                let pending = if b == 0 { self.pending.clone() } else { Vec::new() };
                Ok(ModelCache { layers, masks: StepMemo::default(), pending })
            })
            .collect()
    }

    /// One sequence holding a snapshot's tokens, ready to extend.
    pub fn restore(snapshot: &KvSnapshot) -> Result<ModelCache> {
        let layers = snapshot
            .layers
            .iter()
            .map(|row| LayerCache::from_rows(std::slice::from_ref(row)))
            .collect::<Result<_>>()?;
        Ok(ModelCache { layers, masks: StepMemo::default(), pending: Vec::new() })
    }

    /// Makes room for `positions` in all in each layer at its next growth:
    /// a prompt about to be prefilled chunk by chunk (its layers then grow
    /// once instead of once per chunk). A 16-bit store that `policy`
    /// converts during the prefill makes room only for what it holds before
    /// (a long TurboQuant prompt never holds its whole 16-bit KV).
    pub fn reserve(&mut self, positions: usize, policy: Option<&KvCompression>) {
        let positions = positions.min(i32::MAX as usize) as i32;
        let dense = policy.map_or(positions, |p| positions.min(p.converts_after()));
        self.layers.iter_mut().for_each(|l| l.reserve(|kind| if *kind == KvKind::Dense { dense } else { positions }));
    }

    /// Sequences held.
    pub fn rows(&self) -> usize {
        self.layers.first().map(LayerCache::rows).unwrap_or(0)
    }

    /// Tokens each sequence has seen.
    pub fn offsets(&self) -> Vec<i32> {
        self.layers.first().map(LayerCache::offsets).unwrap_or_default()
    }

    /// The layers for one forward pass, with a fresh mask memo they share.
    pub fn for_forward(&mut self) -> (&mut [LayerCache], &StepMemo) {
        self.masks.clear();
        self.pending.clear();
        (&mut self.layers, &self.masks)
    }

    /// Appends the sequences of `others` after these, in order: every layer's
    /// rows copied once into the joined layout, whatever the number joining
    /// (one at a time, each join would copy the rows before it again and
    /// wait for the device once a layer per join).
    pub fn extend(&mut self, others: impl IntoIterator<Item = ModelCache>) -> Result<()> {
        let mut joining: Vec<std::vec::IntoIter<LayerCache>> = Vec::new();
        for other in others {
            if other.layers.len() != self.layers.len() {
                return Err(Error::Internal("caches of different layer counts"));
            }
            joining.push(other.layers.into_iter());
        }
        if joining.is_empty() {
            return Ok(());
        }
        for l in self.layers.iter_mut() {
            let layer_of_each = joining.iter_mut().map(|o| o.next().ok_or(Error::Internal("caches of different layer counts"))).collect::<Result<Vec<_>>>()?;
            l.extend(layer_of_each)?;
            Self::settle(l)?;
        }
        Ok(())
    }

    /// Keeps the sequences `keep`, in that order.
    pub fn filter(&mut self, keep: &[usize]) -> Result<()> {
        self.layers.iter_mut().try_for_each(|l| {
            l.filter(keep)?;
            Self::settle(l)
        })
    }

    /// Computes a layer's rebuilt rows now. Joining or leaving a batch copies
    /// every row into new buffers; left lazy, the next step would copy every
    /// layer at once while the old buffers live, twice the batch's KV for a
    /// moment. A layer at a time, the old buffers go as the new ones come:
    /// one layer's KV beside the batch's.
    fn settle(layer: &LayerCache) -> Result<()> {
        let state = layer.state();
        Ok(eval(&state.iter().collect::<Vec<_>>())?)
    }

    /// Sequence `b`'s KV in every layer.
    pub fn snapshot(&self, b: usize) -> Result<KvSnapshot> {
        Ok(KvSnapshot { layers: self.layers.iter().map(|l| l.row(b)).collect::<Result<_>>()? })
    }

    /// Applies the compression policy to every sequence that has reached it;
    /// returns how many sequences converted (in any layer).
    pub fn compress(&mut self, policy: Option<&KvCompression>, phase: Phase) -> Result<usize> {
        let Some(policy) = policy else { return Ok(0) };
        let (ranks, layers) = attention_ranks(self.layers.iter().map(LayerCache::keeps_every_position));
        let mut converted = 0;
        for (l, layer) in self.layers.iter_mut().zip(ranks) {
            let at = CompressAt { layer, layers, phase };
            converted = converted.max(l.compress(|kind, tokens| policy.target(kind, tokens, at))?);
        }
        Ok(converted)
    }

    /// Drops the newest `n` positions of every sequence; returns how many went.
    pub fn trim(&mut self, n: i32) -> Result<i32> {
        let mut dropped = n;
        for l in self.layers.iter_mut() {
            dropped = dropped.min(l.trim(n)?);
        }
        Ok(dropped)
    }

    /// The arrays holding the cache, to evaluate after a prefill chunk.
    pub fn state(&self) -> Vec<Array> {
        self.layers.iter().flat_map(LayerCache::state).chain(self.pending.iter().cloned()).collect()
    }

    /// Keeps `work` of this forward pass to be evaluated with the state.
    pub fn keep_pending(&mut self, work: Array) {
        self.pending.push(work);
    }

    pub fn nbytes(&self) -> usize {
        self.layers.iter().map(LayerCache::nbytes).sum()
    }
}
