//! A decode group: sequences that take their decode steps together. Sequences
//! with plain dense caches share one group whose caches are [`BatchKvCache`]s
//! (one model call per step for all of them); a sequence whose caches cannot be
//! batched (rotating windows, quantized KV) is a group of its own.
//!
//! A step is queued with `async_eval` before the previous one's tokens are
//! read (mlx-lm's pipelining), unless a row's logits processors need the
//! previous token on the host, or sequences are waiting to join.

use mlx_rs_safe::{async_eval, ops, Array, Dtype};

use super::generate::maybe_quantize;
use super::sequence::Sequence;
use crate::error::{Error, Result};
use crate::kv::{BatchKvCache, KvCache, KvRows, KvSnapshot};
use crate::models::LanguageModel;

/// KV bits settings applied to unbatched sequences after each step.
#[derive(Debug, Clone, Copy)]
pub struct KvQuantization {
    pub bits: i32,
    pub group_size: i32,
    pub start: i32,
}

/// The sampled tokens ([B] uint32) and log-probabilities ([B, vocab]) of a
/// queued step.
struct Pending {
    tokens: Array,
    logprobs: Array,
}

pub struct DecodeGroup {
    /// Per layer: `BatchKvCache`s when `batched`, else the one sequence's caches.
    caches: Vec<Box<dyn KvCache>>,
    pub seqs: Vec<Sequence>,
    batched: bool,
    /// [B, 1] ids to feed at the next step: each row's newest token.
    input: Array,
    pending: Option<Pending>,
    kv_quant: Option<KvQuantization>,
}

fn batch_caches(rows: &[KvRows]) -> Result<Vec<Box<dyn KvCache>>> {
    let layers = rows.first().map(|r| r.layers.len()).unwrap_or(0);
    (0..layers)
        .map(|l| {
            let layer: Vec<(Array, Array)> = rows.iter().map(|r| r.layers[l].clone()).collect();
            Ok(Box::new(BatchKvCache::from_rows(&layer)?) as Box<dyn KvCache>)
        })
        .collect()
}

fn ids_column(ids: &[u32]) -> Result<Array> {
    let ids: Vec<i32> = ids.iter().map(|&t| t as i32).collect();
    Ok(Array::from_slice(&ids, &[ids.len() as i32, 1])?)
}

impl DecodeGroup {
    /// A group of one sequence over its own caches; `next` is the token to feed.
    pub fn single(seq: Sequence, caches: Vec<Box<dyn KvCache>>, next: u32, kv_quant: Option<KvQuantization>) -> Result<DecodeGroup> {
        Ok(DecodeGroup { caches, seqs: vec![seq], batched: false, input: ids_column(&[next])?, pending: None, kv_quant })
    }

    /// A batch of sequences with their KV rows and the token each feeds next.
    pub fn batch(joining: Vec<(Sequence, KvRows, u32)>) -> Result<DecodeGroup> {
        let mut rows = Vec::with_capacity(joining.len());
        let mut next = Vec::with_capacity(joining.len());
        let mut seqs = Vec::with_capacity(joining.len());
        for (seq, r, t) in joining {
            seqs.push(seq);
            rows.push(r);
            next.push(t);
        }
        Ok(DecodeGroup { caches: batch_caches(&rows)?, seqs, batched: true, input: ids_column(&next)?, pending: None, kv_quant: None })
    }

    pub fn is_batched(&self) -> bool {
        self.batched
    }

    pub fn has_pending(&self) -> bool {
        self.pending.is_some()
    }

    pub fn kv_bytes(&self) -> usize {
        self.caches.iter().map(|c| c.nbytes()).sum()
    }

    /// Row `b`'s KV for every layer, without padding.
    fn rows_of(&mut self, b: usize) -> Result<Option<KvRows>> {
        if !self.batched {
            return KvRows::from_caches(&self.caches);
        }
        let mut layers = Vec::with_capacity(self.caches.len());
        for c in self.caches.iter_mut() {
            let batch = c
                .as_any_mut()
                .downcast_mut::<BatchKvCache>()
                .ok_or_else(|| Error::InvalidRequest("internal: a batched group holds a non-batch cache".into()))?;
            layers.push(batch.row(b)?);
        }
        Ok(Some(KvRows { layers }))
    }

    /// Row `b`'s KV as the prompt cache keeps it (also quantized or unbatched).
    fn snapshot_of(&mut self, b: usize) -> Result<Option<KvSnapshot>> {
        if !self.batched {
            return KvSnapshot::from_caches(&self.caches);
        }
        Ok(self.rows_of(b)?.map(KvSnapshot::Dense))
    }

    /// Adds sequences to a batched group (between steps: nothing pending).
    pub fn join(&mut self, joining: Vec<(Sequence, KvRows, u32)>) -> Result<()> {
        if !self.batched || self.pending.is_some() {
            return Err(Error::InvalidRequest("internal: join needs a batched group between steps".into()));
        }
        let mut rows = Vec::with_capacity(self.seqs.len() + joining.len());
        for b in 0..self.seqs.len() {
            rows.extend(self.rows_of(b)?);
        }
        let mut next = Vec::with_capacity(joining.len());
        for (seq, r, t) in joining {
            self.seqs.push(seq);
            rows.push(r);
            next.push(t);
        }
        self.caches = batch_caches(&rows)?;
        self.input = ops::concatenate(&[&self.input, &ids_column(&next)?], 0)?;
        Ok(())
    }

    /// Queues one decode step for every row.
    pub fn queue_step(&mut self, model: &dyn LanguageModel) -> Result<()> {
        let logits = model.forward(&self.input, &mut self.caches)?;
        if let Some(q) = self.kv_quant {
            maybe_quantize(&mut self.caches, q.bits, q.group_size, q.start)?;
        }
        let v = logits.dim(-1)?;
        let b = self.seqs.len() as i32;
        let logits = ops::reshape(&logits, &[b, v])?;
        let (tokens, logprobs) = if self.seqs.iter().all(|s| s.sampler.is_plain_greedy()) {
            let logprobs = ops::subtract(&logits, &ops::logsumexp(&logits, &[-1], true)?)?;
            (ops::argmax(&logprobs, -1, false)?, logprobs)
        } else {
            let mut tokens = Vec::with_capacity(self.seqs.len());
            let mut rows = Vec::with_capacity(self.seqs.len());
            for (i, seq) in self.seqs.iter_mut().enumerate() {
                let i = i as i32;
                let row = ops::slice(&logits, &[i, 0], &[i + 1, v], &[1, 1])?;
                let row = seq.sampler.process_logits(&seq.history, &row)?;
                let lp = ops::subtract(&row, &ops::logsumexp(&row, &[-1], true)?)?;
                tokens.push(seq.sampler.sample(&lp)?);
                rows.push(lp);
            }
            (ops::concatenate(&tokens.iter().collect::<Vec<_>>(), 0)?, ops::concatenate(&rows.iter().collect::<Vec<_>>(), 0)?)
        };
        // Cast inside the step's graph: reading the ids back adds no op behind
        // the next step, which may be queued meanwhile.
        let tokens = ops::astype(&tokens, Dtype::Uint32)?;
        async_eval(&[&tokens, &logprobs])?;
        self.pending = Some(Pending { tokens, logprobs });
        Ok(())
    }

    /// Whether the next step may be queued before this step's tokens are read.
    fn can_pipeline(&self) -> bool {
        !self.seqs.iter().any(|s| s.sampler.uses_history())
    }

    /// Runs one step: queues it if needed, queues the following one where
    /// allowed (`pipeline`), then hands each row its token. Returns the rows
    /// that ended, with their KV when it can go into the prompt cache.
    pub fn step(
        &mut self,
        model: &dyn LanguageModel,
        pipeline: bool,
        mut accept: impl FnMut(&mut Sequence, u32, Option<&Array>) -> Result<bool>,
    ) -> Result<Vec<(Sequence, Option<KvSnapshot>)>> {
        if self.pending.is_none() {
            self.queue_step(model)?;
        }
        let Some(step) = self.pending.take() else {
            return Err(Error::InvalidRequest("internal: no step queued".into()));
        };
        self.input = ops::reshape(&step.tokens, &[-1, 1])?;
        if pipeline && self.can_pipeline() {
            self.queue_step(model)?;
        }
        let ids = step.tokens.to_vec::<u32>()?;
        let mut ended = Vec::new();
        for (b, seq) in self.seqs.iter_mut().enumerate() {
            let row = if seq.request.params.logprobs.is_some() {
                let b = b as i32;
                let v = step.logprobs.dim(-1)?;
                Some(ops::reshape(&ops::slice(&step.logprobs, &[b, 0], &[b + 1, v], &[1, 1])?, &[v])?)
            } else {
                None
            };
            if accept(seq, ids[b], row.as_ref())? {
                ended.push(b);
            }
        }
        self.remove(&ended)
    }

    /// Takes the rows in `ended` out of the group (their KV rows come along).
    fn remove(&mut self, ended: &[usize]) -> Result<Vec<(Sequence, Option<KvSnapshot>)>> {
        if ended.is_empty() {
            return Ok(Vec::new());
        }
        let mut out = Vec::with_capacity(ended.len());
        for &b in ended {
            out.push(self.snapshot_of(b)?);
        }
        let keep: Vec<usize> = (0..self.seqs.len()).filter(|b| !ended.contains(b)).collect();
        if self.batched && !keep.is_empty() {
            let mut rows = Vec::with_capacity(keep.len());
            for &b in &keep {
                rows.extend(self.rows_of(b)?);
            }
            self.caches = batch_caches(&rows)?;
            let idx: Vec<i32> = keep.iter().map(|&b| b as i32).collect();
            let idx = Array::from_slice(&idx, &[idx.len() as i32])?;
            self.input = ops::take(&self.input, &idx, 0)?;
            if let Some(p) = self.pending.take() {
                self.pending = Some(Pending { tokens: ops::take(&p.tokens, &idx, 0)?, logprobs: ops::take(&p.logprobs, &idx, 0)? });
            }
        }
        let mut seqs: Vec<Option<Sequence>> = self.seqs.drain(..).map(Some).collect();
        let mut removed = Vec::with_capacity(ended.len());
        for (&b, rows) in ended.iter().zip(out) {
            if let Some(seq) = seqs[b].take() {
                removed.push((seq, rows));
            }
        }
        self.seqs = seqs.into_iter().flatten().collect();
        Ok(removed)
    }

    /// Ends every row with `message` (an MLX error in this group's step).
    pub fn fail_all(&mut self, message: &str) {
        for seq in self.seqs.iter_mut() {
            seq.fail(message);
        }
        self.seqs.clear();
        self.pending = None;
    }

    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }
}
