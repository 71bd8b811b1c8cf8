//! The decode batch: every sequence past its prefill takes its decode steps
//! here, one model call per step for all of them, whatever their cache kinds.
//!
//! A step is queued with `async_eval` before the previous one's tokens are
//! read (mlx-lm's pipelining), unless a row's logits processors need the
//! previous token on the host, or sequences are waiting to join.

use mlx_rs_safe::{async_eval, ops, Array, Dtype};

use super::sequence::Sequence;
use crate::error::{Error, Result};
use crate::kv::{KvCompression, KvSnapshot, ModelCache, Phase};
use crate::models::LanguageModel;

/// The sampled tokens ([B] uint32) and log-probabilities ([B, vocab]) of a
/// queued step.
struct Pending {
    tokens: Array,
    logprobs: Array,
}

pub struct DecodeBatch {
    pub seqs: Vec<Sequence>,
    /// Row b holds `seqs[b]`.
    cache: ModelCache,
    /// [B, 1] ids to feed at the next step: each row's newest token.
    input: Array,
    pending: Option<Pending>,
    /// Rows compressed by decode steps (crossing --quantized-kv-start), not yet counted in the metrics.
    pub compressed: usize,
}

/// A sequence whose prompt is in its cache, ready to decode from `next`.
pub struct Joining {
    pub seq: Sequence,
    pub cache: ModelCache,
    pub next: u32,
}

fn ids_column(ids: &[u32]) -> Result<Array> {
    let ids: Vec<i32> = ids.iter().map(|&t| t as i32).collect();
    Ok(Array::from_slice(&ids, &[ids.len() as i32, 1])?)
}

impl DecodeBatch {
    /// A batch of the first sequence to decode.
    pub fn new(first: Joining) -> Result<DecodeBatch> {
        Ok(DecodeBatch { input: ids_column(&[first.next])?, seqs: vec![first.seq], cache: first.cache, pending: None, compressed: 0 })
    }

    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }

    pub fn kv_bytes(&self) -> usize {
        self.cache.nbytes()
    }

    /// Tokens the rows' caches hold.
    pub fn kv_tokens(&self) -> usize {
        self.cache.offsets().iter().map(|&o| o.max(0) as usize).sum()
    }

    /// Adds sequences (between steps: nothing pending).
    pub fn join(&mut self, joining: Vec<Joining>) -> Result<()> {
        if self.pending.is_some() {
            return Err(Error::Internal("sequences joined a batch with a step in flight"));
        }
        let mut next = Vec::with_capacity(joining.len());
        for j in joining {
            self.cache.extend(j.cache)?;
            self.seqs.push(j.seq);
            next.push(j.next);
        }
        self.input = ops::concatenate(&[&self.input, &ids_column(&next)?], 0)?;
        Ok(())
    }

    /// Queues one decode step for every row: the model call, the cache's
    /// compression policy, then sampling (one argmax for a batch of plain
    /// greedy rows, else each row's own sampler).
    fn queue_step(&mut self, model: &dyn LanguageModel, compression: Option<&KvCompression>) -> Result<()> {
        let logits = model.forward(&self.input, &mut self.cache)?;
        self.compressed += self.cache.compress(compression, Phase::Decode)?;
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
    /// that ended, with their KV for the prompt cache.
    pub fn step(
        &mut self,
        model: &dyn LanguageModel,
        compression: Option<&KvCompression>,
        pipeline: bool,
        mut accept: impl FnMut(&mut Sequence, u32, Option<&Array>) -> Result<bool>,
    ) -> Result<Vec<(Sequence, KvSnapshot)>> {
        if self.pending.is_none() {
            self.queue_step(model, compression)?;
        }
        let step = self.pending.take().ok_or(Error::Internal("no decode step queued"))?;
        self.input = ops::reshape(&step.tokens, &[-1, 1])?;
        if pipeline && self.can_pipeline() {
            self.queue_step(model, compression)?;
        }
        let ids = step.tokens.to_vec::<u32>()?;
        if ids.len() != self.seqs.len() {
            return Err(Error::Internal("a decode step sampled a token count other than its rows"));
        }
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

    /// Takes the rows in `ended` out of the batch, with their KV.
    fn remove(&mut self, ended: &[usize]) -> Result<Vec<(Sequence, KvSnapshot)>> {
        if ended.is_empty() {
            return Ok(Vec::new());
        }
        let snapshots = ended.iter().map(|&b| self.cache.snapshot(b)).collect::<Result<Vec<_>>>()?;
        let keep: Vec<usize> = (0..self.seqs.len()).filter(|b| !ended.contains(b)).collect();
        if !keep.is_empty() {
            self.cache.filter(&keep)?;
            let idx: Vec<i32> = keep.iter().map(|&b| b as i32).collect();
            let idx = Array::from_slice(&idx, &[idx.len() as i32])?;
            self.input = ops::take(&self.input, &idx, 0)?;
            if let Some(p) = self.pending.take() {
                self.pending = Some(Pending { tokens: ops::take(&p.tokens, &idx, 0)?, logprobs: ops::take(&p.logprobs, &idx, 0)? });
            }
        }
        let mut seqs: Vec<Option<Sequence>> = self.seqs.drain(..).map(Some).collect();
        let mut removed = Vec::with_capacity(ended.len());
        for (&b, kv) in ended.iter().zip(snapshots) {
            if let Some(seq) = seqs[b].take() {
                removed.push((seq, kv));
            }
        }
        self.seqs = seqs.into_iter().flatten().collect();
        Ok(removed)
    }

    /// Ends every row with `message` (an MLX error in this batch's step).
    pub fn fail_all(&mut self, message: &str) {
        for seq in self.seqs.iter_mut() {
            seq.fail(message);
        }
        self.seqs.clear();
        self.pending = None;
    }
}
