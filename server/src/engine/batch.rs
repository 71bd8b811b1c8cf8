//! The decode batch: every sequence past its prefill takes its decode steps
//! here, one model call per step for all of them, whatever their cache kinds.
//!
//! A step's model call is queued with `async_eval` before the previous step's
//! tokens are read (mlx-lm's pipelining), unless sequences are waiting to join.
//! Its sampling is queued at the next turn, once the rows' previous tokens are
//! on the host: penalties read them, and a constrained row's grammar computes
//! the tokens it allows from them, on the host while the model call runs.

use std::time::Instant;

use mlx_rs_safe::{async_eval, ops, Array, Dtype};
use rayon::prelude::*;

use super::sequence::Sequence;
use super::token_mask::{self, MaskRows, RowSources};
use crate::structured::Guide;
use crate::error::{Error, Result};
use crate::kv::{KvCompression, KvSnapshot, ModelCache, Phase};
use crate::models::LanguageModel;

/// The logits ([B, vocab]) of a queued model call.
struct Pending {
    logits: Array,
}

pub struct DecodeBatch {
    pub seqs: Vec<Sequence>,
    /// Row b holds `seqs[b]`.
    cache: ModelCache,
    /// [B, 1] ids to feed at the next step: each row's newest token.
    input: Array,
    pending: Option<Pending>,
    /// The host time of the step under way.
    host: StepHostTime,
    /// Rows compressed by decode steps (crossing --quantized-kv-start), not yet counted in the metrics.
    pub compressed: usize,
}

/// What a step ended: the rows that finished, with their KV for the prompt
/// cache, its grammar masks' work (None: no row constrained), and where its
/// host time went.
pub struct StepOutcome {
    pub ended: Vec<(Sequence, KvSnapshot)>,
    pub masks: Option<MaskWork>,
    pub host: StepHostTime,
}

/// A decode step's host time by what the host did: building the graphs
/// (model call and sampling), launching them (`async_eval`: MLX encodes and
/// submits every kernel), and waiting for the tokens. With steps pipelined,
/// the wait is the device's time left once the host has queued the next
/// step: near zero when the host is the bound, the step's device time beyond
/// the host's when the device is.
#[derive(Debug, Clone, Copy, Default)]
pub struct StepHostTime {
    pub build: f64,
    pub launch: f64,
    pub wait: f64,
}

impl StepHostTime {
    /// Adds the time since `since` to `part`; returns now.
    fn lap(&mut self, part: fn(&mut StepHostTime) -> &mut f64, since: Instant) -> Instant {
        let now = Instant::now();
        *part(self) += now.duration_since(since).as_secs_f64();
        now
    }
}

/// A constrained step's masks: host seconds, and how their rows reached the device.
#[derive(Debug, Clone, Copy)]
pub struct MaskWork {
    pub seconds: f64,
    pub rows: RowSources,
}

/// The log-probabilities of the rows whose requests report them ([R, vocab]
/// float32, queued in the step's graph), and which batch row each is.
struct ReportedRows {
    values: Array,
    batch_rows: Vec<usize>,
}

/// [`ReportedRows`] read back to the host.
struct ReportedValues {
    values: Vec<f32>,
    vocab: usize,
    batch_rows: Vec<usize>,
}

impl ReportedRows {
    /// Queues the rows of `logprobs` ([B, vocab]) whose sequences asked for
    /// log-probabilities; None when none did.
    fn queue(seqs: &[Sequence], logprobs: &Array) -> Result<Option<ReportedRows>> {
        let batch_rows: Vec<usize> = seqs.iter().enumerate().filter(|(_, s)| s.request.params.logprobs.is_some()).map(|(b, _)| b).collect();
        if batch_rows.is_empty() {
            return Ok(None);
        }
        let idx: Vec<i32> = batch_rows.iter().map(|&b| b as i32).collect();
        let idx = Array::from_slice(&idx, &[idx.len() as i32])?;
        let values = ops::astype(&ops::take(logprobs, &idx, 0)?, Dtype::Float32)?;
        Ok(Some(ReportedRows { values, batch_rows }))
    }

    /// Waits for the rows (their step only) and copies them to the host.
    fn read(self) -> Result<ReportedValues> {
        let vocab = self.values.dim(-1)? as usize;
        Ok(ReportedValues { values: self.values.to_vec::<f32>()?, vocab, batch_rows: self.batch_rows })
    }
}

impl ReportedValues {
    /// Batch row `b`'s log-probabilities, if its request reports them.
    fn row(&self, b: usize) -> Option<&[f32]> {
        let i = self.batch_rows.iter().position(|&r| r == b)?;
        self.values.get(i * self.vocab..(i + 1) * self.vocab)
    }
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
        Ok(DecodeBatch { input: ids_column(&[first.next])?, seqs: vec![first.seq], cache: first.cache, pending: None, host: StepHostTime::default(), compressed: 0 })
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
        // The sequences are the batch's before anything can fail: a failed
        // join ends the whole batch (`fail_all`), these with the error too,
        // rather than dropping them unanswered.
        let mut caches = Vec::with_capacity(joining.len());
        let mut next = Vec::with_capacity(joining.len());
        for j in joining {
            self.seqs.push(j.seq);
            caches.push(j.cache);
            next.push(j.next);
        }
        if self.pending.is_some() {
            return Err(Error::Internal("sequences joined a batch with a step in flight"));
        }
        self.cache.extend(caches)?;
        self.input = ops::concatenate(&[&self.input, &ids_column(&next)?], 0)?;
        Ok(())
    }

    /// Queues the model call of one decode step for every row, and the cache's
    /// compression policy after it.
    fn queue_forward(&mut self, model: &dyn LanguageModel, compression: Option<&KvCompression>) -> Result<()> {
        let start = Instant::now();
        let logits = model.forward(&self.input, &mut self.cache)?;
        self.compressed += self.cache.compress(compression, Phase::Decode)?;
        let v = logits.dim(-1)?;
        let logits = ops::reshape(&logits, &[self.seqs.len() as i32, v])?;
        let built = self.host.lap(|h| &mut h.build, start);
        async_eval(&[&logits])?;
        self.host.lap(|h| &mut h.launch, built);
        self.pending = Some(Pending { logits });
        Ok(())
    }

    /// `logits` ([B, vocab]) masked by the rows' grammars, when a row follows
    /// one: the guides fill their rows' bits (in parallel when several do), the
    /// other rows allow every token; rows already on the device from `kept`
    /// are not uploaded again. A row whose grammar fails ends with the error
    /// (its step's token is then dropped). Returns the masks' work too.
    fn mask_logits(&mut self, logits: Array, kept: &mut MaskRows) -> Result<(Array, Option<MaskWork>)> {
        let guided = self.seqs.iter().filter(|s| s.guide.is_some()).count();
        if guided == 0 {
            return Ok((logits, None));
        }
        let start = Instant::now();
        let width = token_mask::words_per_row(logits.dim(-1)? as usize);
        let mut words = vec![u32::MAX; self.seqs.len() * width];
        let mut guides: Vec<_> = self.seqs.iter_mut().map(|s| s.guide.as_mut()).collect();
        let fill = |(row, guide): (&mut [u32], &mut Option<&mut Guide>)| guide.as_mut().and_then(|g| g.fill_allowed(row).err());
        // One row: no thread hand-off (a mask takes ~50 us).
        let failures: Vec<Option<String>> = if guided == 1 {
            words.chunks_mut(width).zip(guides.iter_mut()).map(fill).collect()
        } else {
            words.par_chunks_mut(width).zip(guides.par_iter_mut()).map(fill).collect()
        };
        for (seq, failure) in self.seqs.iter_mut().zip(failures) {
            if let Some(e) = failure {
                seq.fail(&format!("structured output: {e}"));
            }
        }
        let (rows, sources) = kept.device_rows(&words, width)?;
        let masked = token_mask::apply(&rows, &logits)?;
        Ok((masked, Some(MaskWork { seconds: start.elapsed().as_secs_f64(), rows: sources })))
    }

    /// Queues the sampling of a queued model call's `logits`: the rows' grammar
    /// masks, then one argmax for a batch of plain greedy rows, else each row's
    /// own sampler. Returns the tokens ([B] uint32), the float32
    /// log-probabilities of the rows that report them, and the masks' work
    /// (None: no row constrained).
    fn queue_sampling(&mut self, logits: Array, kept: &mut MaskRows) -> Result<(Array, Option<ReportedRows>, Option<MaskWork>)> {
        let start = Instant::now();
        let (logits, masks) = self.mask_logits(logits, kept)?;
        let v = logits.dim(-1)?;
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
        // Cast (and pick the reported rows) inside the step's graph: reading
        // them back then adds no op behind the next model call, queued
        // meanwhile, which the read would otherwise wait for.
        let tokens = ops::astype(&tokens, Dtype::Uint32)?;
        let reported = ReportedRows::queue(&self.seqs, &logprobs)?;
        let built = self.host.lap(|h| &mut h.build, start);
        match &reported {
            Some(r) => async_eval(&[&tokens, &r.values])?,
            None => async_eval(&[&tokens])?,
        }
        self.host.lap(|h| &mut h.launch, built);
        Ok((tokens, reported, masks))
    }

    /// Runs one step: queues its model call if needed and its sampling, queues
    /// the next model call where allowed (`pipeline`), then hands each row its
    /// token. Grammar masks reuse the rows in `kept_masks`.
    pub fn step(
        &mut self,
        model: &dyn LanguageModel,
        compression: Option<&KvCompression>,
        pipeline: bool,
        kept_masks: &mut MaskRows,
        mut accept: impl FnMut(&mut Sequence, u32, Option<&[f32]>) -> Result<bool>,
    ) -> Result<StepOutcome> {
        if self.pending.is_none() {
            self.queue_forward(model, compression)?;
        }
        let step = self.pending.take().ok_or(Error::Internal("no decode step queued"))?;
        let (tokens, reported, masks) = self.queue_sampling(step.logits, kept_masks)?;
        self.input = ops::reshape(&tokens, &[-1, 1])?;
        if pipeline {
            self.queue_forward(model, compression)?;
        }
        let waiting = Instant::now();
        let ids = tokens.to_vec::<u32>()?;
        if ids.len() != self.seqs.len() {
            return Err(Error::Internal("a decode step sampled a token count other than its rows"));
        }
        let reported = reported.map(ReportedRows::read).transpose()?;
        self.host.lap(|h| &mut h.wait, waiting);
        let host = std::mem::take(&mut self.host);
        let mut ended = Vec::new();
        for (b, seq) in self.seqs.iter_mut().enumerate() {
            let row = reported.as_ref().and_then(|r| r.row(b));
            if seq.finished || accept(seq, ids[b], row)? {
                ended.push(b);
            }
        }
        Ok(StepOutcome { ended: self.remove(&ended)?, masks, host })
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
                self.pending = Some(Pending { logits: ops::take(&p.logits, &idx, 0)? });
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
