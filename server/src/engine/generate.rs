//! Token generation for one sequence, step for step as mlx-lm's `generate_step`:
//! the prompt is prefilled in chunks of `prefill_size` (all but its last token),
//! then each step runs the model on one token. The next step is queued with
//! `async_eval` before the current token is handed out, so the device computes
//! while the host detokenizes; nothing in the layer loop waits on the device.

use mlx_rs_safe::{async_eval, eval, memory, ops, Array, Dtype};

use super::sampler::Sampler;
use crate::error::{Error, Result};
use crate::kv::KvCache;
use crate::models::LanguageModel;

#[derive(Debug, Clone)]
pub struct GenerateOptions {
    /// Prompt tokens per prefill step.
    pub prefill_size: usize,
    /// Tokens to generate at most.
    pub max_tokens: usize,
    /// Quantize the KV cache to this many bits (4 or 8) once it holds
    /// `quantized_kv_start` tokens.
    pub kv_bits: Option<i32>,
    pub kv_group_size: i32,
    pub quantized_kv_start: i32,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions { prefill_size: 512, max_tokens: 256, kv_bits: None, kv_group_size: 64, quantized_kv_start: 5000 }
    }
}

/// mlx-lm's `maybe_quantize_kv_cache`: swaps each cache that has reached
/// `start` tokens for its quantized form.
pub(crate) fn maybe_quantize(caches: &mut [Box<dyn KvCache>], bits: i32, group_size: i32, start: i32) -> Result<()> {
    for c in caches.iter_mut() {
        if c.offset() >= start {
            if let Some(q) = c.to_quantized(group_size, bits)? {
                *c = q;
            }
        }
    }
    Ok(())
}

fn quantize_kv(caches: &mut [Box<dyn KvCache>], opts: &GenerateOptions) -> Result<()> {
    match opts.kv_bits {
        Some(bits) => maybe_quantize(caches, bits, opts.kv_group_size, opts.quantized_kv_start),
        None => Ok(()),
    }
}

/// One generated token and the log-probabilities it was drawn from.
pub struct StepOutput {
    pub token: u32,
    /// [vocab] float log-probabilities of this step (after logits processors).
    pub logprobs: Array,
}

pub struct Generator<'m> {
    model: &'m dyn LanguageModel,
    caches: Vec<Box<dyn KvCache>>,
    sampler: Sampler,
    /// Tokens seen so far (prompt + generated), for penalties.
    history: Vec<u32>,
    pending: Option<(Array, Array)>,
    produced: usize,
    opts: GenerateOptions,
}

/// `tokens` as a [1, L] int32 model input.
pub(crate) fn token_array(tokens: &[u32]) -> Result<Array> {
    let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
    Ok(Array::from_slice(&ids, &[1, ids.len() as i32])?)
}

/// The id in a one-element uint32 token array (cast in `step`). Reading it must
/// not enqueue any op: that op would run after the next step queued meanwhile,
/// and the host would wait for that whole step (no more overlap).
fn token_id(token: &Array) -> Result<u32> {
    Ok(token.item::<u32>()?)
}

impl<'m> Generator<'m> {
    /// Prefills `prompt` and queues the first decode step.
    pub fn new(
        model: &'m dyn LanguageModel,
        prompt: &[u32],
        sampler: Sampler,
        opts: &GenerateOptions,
    ) -> Result<Generator<'m>> {
        if prompt.is_empty() {
            return Err(Error::InvalidRequest("the prompt is empty".into()));
        }
        if let Some(bits) = opts.kv_bits {
            if ![2, 3, 4, 5, 6, 8].contains(&bits) {
                return Err(Error::InvalidRequest(format!("kv_bits must be one of 2, 3, 4, 5, 6, 8; got {bits}")));
            }
        }
        let mut caches = model.new_caches();
        let prefill = opts.prefill_size.max(1);
        let mut done = 0;
        while prompt.len() - done > 1 {
            let n = prefill.min(prompt.len() - done - 1);
            model.forward(&token_array(&prompt[done..done + n])?, &mut caches)?;
            quantize_kv(&mut caches, opts)?;
            let state: Vec<Array> = caches.iter().flat_map(|c| c.state()).collect();
            eval(&state.iter().collect::<Vec<_>>())?;
            done += n;
            // As mlx-lm: a chunk's temporaries are not reused at the next chunk's sizes.
            memory::clear_cache()?;
        }
        let mut g = Generator {
            model,
            caches,
            sampler,
            history: prompt.to_vec(),
            pending: None,
            produced: 0,
            opts: opts.clone(),
        };
        if g.opts.max_tokens > 0 {
            let first = g.step(&token_array(&prompt[done..])?)?;
            async_eval(&[&first.0, &first.1])?;
            g.pending = Some(first);
        }
        Ok(g)
    }

    /// Runs the model on `input` ([1, L] ids) and samples: (token [1], logprobs [vocab]).
    fn step(&mut self, input: &Array) -> Result<(Array, Array)> {
        let logits = self.model.forward(input, &mut self.caches)?;
        quantize_kv(&mut self.caches, &self.opts)?;
        let shape = logits.shape();
        let (l, v) = (shape[1], shape[2]);
        // logits[:, -1, :]
        let last = ops::reshape(&ops::slice(&logits, &[0, l - 1, 0], &[1, l, v], &[1, 1, 1])?, &[1, v])?;
        let last = self.sampler.process_logits(&self.history, &last)?;
        let logprobs = ops::subtract(&last, &ops::logsumexp(&last, &[-1], true)?)?;
        // The id is cast inside the step's graph, so reading it back later adds
        // no new work behind the next step already queued on the stream.
        let token = ops::astype(&self.sampler.sample(&logprobs)?, Dtype::Uint32)?;
        Ok((token, ops::reshape(&logprobs, &[v])?))
    }

    /// KV bytes held by this sequence.
    pub fn kv_bytes(&self) -> usize {
        self.caches.iter().map(|c| c.nbytes()).sum()
    }

    /// The next token, or `None` after `max_tokens`.
    pub fn next_token(&mut self) -> Result<Option<StepOutput>> {
        let Some((token, logprobs)) = self.pending.take() else {
            return Ok(None);
        };
        self.produced += 1;
        let more = self.produced < self.opts.max_tokens;
        // Without history-dependent logits processors, the next step is queued
        // on the still-lazy token before this one is read back (mlx-lm's
        // pipelining); with them, the host needs the token first.
        if more && !self.sampler.uses_history() {
            let next = self.step(&ops::reshape(&token, &[1, 1])?)?;
            async_eval(&[&next.0, &next.1])?;
            self.pending = Some(next);
        }
        let id = token_id(&token)?;
        self.history.push(id);
        if self.produced % 256 == 0 {
            memory::clear_cache()?; // mlx-lm's generate_step clears at the same interval
        }
        if more && self.sampler.uses_history() {
            let next = self.step(&token_array(&[id])?)?;
            async_eval(&[&next.0, &next.1])?;
            self.pending = Some(next);
        }
        Ok(Some(StepOutput { token: id, logprobs }))
    }
}
