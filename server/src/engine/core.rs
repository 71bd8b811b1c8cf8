//! The engine: owns the model and every MLX array, and generates for the
//! requests submitted to it with continuous batching. It is driven one turn at
//! a time with [`Engine::step`] — by the engine thread for the server, directly
//! by `mlx-serve generate` and by the tests — so every path runs the same
//! prefill, sampling and pipelining. Each turn:
//! 1. admits waiting requests while slots are free (prompt-cache lookup),
//! 2. runs one decode step of the batch (every decoding sequence in one model
//!    call), handing tokens to their sequences,
//! 3. moves sequences whose prefill finished into the batch (and then ends
//!    the turn, so their first step is not delayed by another prompt), or
//! 4. prefills up to `prefill_size` prompt tokens of the admitted requests
//!    (several short prompts, or one chunk of a long one); whole short
//!    prompts starting from nothing share one left-padded model call where
//!    the model's caches allow (`prompt_concurrency`).
//!
//! So a long prompt never stalls the running sequences for more than a chunk,
//! and a burst of short requests joins the batch together.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mlx_rs_safe::{async_eval, eval, memory, Array};

use super::batch::{DecodeBatch, Joining, StepHostTime};
use super::token_mask::{MaskRows, KEPT_ROWS_BYTES};
use super::policy::Policy;
use super::request::{Event, PromptProgress, Request};
use super::sampler::Sampler;
use super::sequence::Sequence;
use super::stats::EngineSnapshot;
use crate::error::Result;
use crate::kv::{KvCompression, ModelCache, Phase, PromptCache};
use crate::metrics::Metrics;
use crate::models::LanguageModel;
use crate::tokenizer::Tokenizer;

#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Prompt tokens per prefill chunk.
    pub prefill_size: usize,
    /// Sequences generating (or prefilling) at once.
    pub max_concurrency: usize,
    /// Whole prompts prefilled together in one model call, at most (1: each
    /// alone).
    pub prompt_concurrency: usize,
    /// Requests waiting for a slot before new ones are refused.
    pub max_queue: usize,
    /// Bytes of KV the prompt cache keeps (0 = off).
    pub prompt_cache_bytes: usize,
    /// How sequences' caches are compressed as they grow (`--kv-bits`).
    pub kv_compression: Option<KvCompression>,
    /// Tokens of KV the running sequences may hold together (each reserves
    /// its prompt plus its max_tokens; `usize::MAX`: no bound).
    pub kv_tokens: usize,
    /// A sequence ends (finish_reason "length") when it holds this many
    /// tokens.
    pub context: Option<usize>,
}

/// A request whose prompt is being prefilled, chunk by chunk.
struct Prefill {
    seq: Sequence,
    cache: ModelCache,
    /// Prompt tokens already in `cache`.
    done: usize,
    started: Instant,
    /// The `processed` count last sent as progress (when the request asks).
    reported: usize,
}

impl Prefill {
    /// Prompt tokens still to prefill: all but the last, which is the first
    /// decode step's input (as in mlx-lm).
    fn remaining(&self) -> usize {
        self.seq.request.params.prompt.len().saturating_sub(self.done + 1)
    }

    /// Tokens from here to the next checkpoint (where the prefill must stop
    /// to keep the prompt's KV), if one lies ahead.
    fn to_checkpoint(&self) -> Option<usize> {
        self.seq.request.params.checkpoints.iter().filter(|&&c| c > self.done).min().map(|c| c - self.done)
    }

    /// Sends the prompt's progress if the request asks for it and it moved.
    /// The last prompt token is the first decode step's input, so a prompt
    /// with nothing left to prefill counts as read whole.
    fn report_progress(&mut self) {
        let total = self.seq.request.params.prompt.len();
        let processed = if self.remaining() == 0 { total } else { self.done };
        if !self.seq.request.params.progress || processed == self.reported {
            return;
        }
        self.reported = processed;
        let elapsed_ms = self.started.elapsed().as_millis() as u64;
        self.seq.send(Event::Progress(PromptProgress { total, cached: self.seq.cached_tokens, processed, elapsed_ms }));
    }
}

pub struct Engine {
    model: Box<dyn LanguageModel>,
    tokenizer: Arc<Tokenizer>,
    config: EngineConfig,
    policy: Policy,
    metrics: Arc<Metrics>,
    /// Requests submitted and not yet admitted (shared with the thread's handle,
    /// which bounds the queue with it).
    waiting: Arc<AtomicUsize>,
    queue: VecDeque<Request>,
    /// Admitted requests being prefilled, oldest first.
    prefill: VecDeque<Prefill>,
    /// Prefilled sequences about to join the batch.
    ready: Vec<Joining>,
    batch: Option<DecodeBatch>,
    /// Grammar mask rows kept on the device across steps and requests.
    kept_masks: MaskRows,
    prompt_cache: PromptCache,
    /// Decode turns run, to clear MLX's buffer cache every CLEAR_CACHE_EVERY of them.
    decode_turns: u64,
    /// The first model computation that failed since the last look (see
    /// `take_step_failure`).
    step_failure: Option<String>,
    /// Keep each prompt's KV in the prompt cache as its prefill ends: for
    /// models whose cache cannot be cut back to a shorter prefix.
    checkpoint_prompt_end: bool,
}

/// Decode steps between clearing MLX's buffer cache: each step's buffers differ in size
/// (the caches grow by one position, batches are rebuilt as sequences come and go), so
/// the cache keeps collecting sizes it will not reuse (mlx-lm clears every 256 or 512).
const CLEAR_CACHE_EVERY: u64 = 256;

/// `tokens` as a [1, L] int32 model input.
fn token_row(tokens: &[u32]) -> Result<Array> {
    let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
    Ok(Array::from_slice(&ids, &[1, ids.len() as i32])?)
}

/// The prompt length of the warm-up's compressed decode step: past
/// TurboQuant's 4 sinks and 128-token recent window, so the step reads codes.
pub const WARM_HISTORY: usize = 256;

/// What [`Engine::warm_up`] ran.
#[derive(Debug, Clone, Copy)]
pub struct WarmUp {
    /// How long it took.
    pub took: Duration,
    /// Whether it also ran a decode step over a compressed history.
    pub compressed_step: bool,
}

impl Engine {
    /// An engine over `model`; its KV compression is fitted to the model's
    /// head dimension (an error when the model cannot take it).
    pub fn new(model: Box<dyn LanguageModel>, tokenizer: Arc<Tokenizer>, config: EngineConfig, metrics: Arc<Metrics>) -> Result<Engine> {
        Engine::with_queue_counter(model, tokenizer, config, metrics, Arc::new(AtomicUsize::new(0)))
    }

    /// An engine whose waiting requests are also counted in `waiting`.
    pub(super) fn with_queue_counter(
        model: Box<dyn LanguageModel>,
        tokenizer: Arc<Tokenizer>,
        mut config: EngineConfig,
        metrics: Arc<Metrics>,
        waiting: Arc<AtomicUsize>,
    ) -> Result<Engine> {
        let layout = model.kv_layout();
        config.kv_compression = config.kv_compression.map(|c| c.for_model(layout.head_dim, layout.attention_sinks, layout.fixed_kv)).transpose()?;
        if config.kv_compression.as_ref().is_some_and(|c| c.affine_bits().is_some()) && !crate::kv::quantized_matmuls_run() {
            log::warn!(
                "--kv-bits on CUDA: MLX has no quantized matmuls for attention here, so decode steps read the codes in mlx-serve's kernel \
                 (0.75x the 16-bit cache's decode speed at 32K tokens on an H200) and prefill chunks dequantize each layer's history; \
                 --turbo-kv balanced is smaller and decodes faster than the 16-bit cache at long contexts"
            );
        }
        Ok(Engine {
            model,
            tokenizer,
            policy: Policy {
                max_concurrency: config.max_concurrency.max(1),
                prefill_size: config.prefill_size.max(1),
                kv_tokens: config.kv_tokens,
                // Prompts share a call only where every layer's cache can be left-padded.
                prompts_together: if ModelCache::padded_prompts(&layout.kinds, &[0]).is_some() { config.prompt_concurrency.max(1) } else { 1 },
            },
            prompt_cache: PromptCache::new(config.prompt_cache_bytes),
            config,
            metrics,
            waiting,
            queue: VecDeque::new(),
            prefill: VecDeque::new(),
            ready: Vec::new(),
            batch: None,
            kept_masks: MaskRows::new(KEPT_ROWS_BYTES),
            decode_turns: 0,
            step_failure: None,
            checkpoint_prompt_end: !layout.restores_any_prefix(),
        })
    }

    /// The configuration in force (the compression fitted to the model).
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Whether whole prompts admitted together share prefill calls (the
    /// model's caches can be left-padded and --prompt-concurrency allows).
    pub fn prefills_prompts_together(&self) -> bool {
        self.policy.prompts_together > 1
    }

    /// Runs the model once over prompts of every power-of-two length up to a
    /// prefill chunk, and drops what it computed. On a GPU, MLX compiles a
    /// kernel on the first use of each variant — its quantized matmuls have
    /// variants by the number of rows — and a request would otherwise wait
    /// for it: on an H100 a Gemma-4-26B-A4B server's first prompt-cache hit
    /// (a ~230-token prefill) waited 124 s for three such kernels. With KV
    /// compression, also one decode step over a compressed history
    /// ([`Engine::warm_up_compressed`]).
    pub fn warm_up(&mut self) -> Result<WarmUp> {
        let started = Instant::now();
        let kinds = self.model.kv_layout().kinds;
        let mut n = self.policy.prefill_size;
        while n >= 1 {
            let mut cache = ModelCache::new(&kinds)?;
            let logits = self.model.forward(&token_row(&vec![1; n])?, &mut cache)?;
            eval(&[&logits])?;
            n /= 2;
        }
        let compressed_step = self.warm_up_compressed()?;
        memory::clear_cache()?;
        Ok(WarmUp { took: started.elapsed(), compressed_step })
    }

    /// Where the KV cache compresses as decoding starts (TurboQuant, and
    /// `--kv-bits` past its start), one decode step after a prompt of
    /// [`WARM_HISTORY`] tokens compressed as a request's would be: the
    /// compressed cache's kernels (encode, attention, and their per-shape
    /// start-up check) compile now, not in the first request (on an H200 a
    /// Llama-3.1-8B `balanced` server's first request waited 33 s for them).
    /// Whether it ran such a step.
    fn warm_up_compressed(&mut self) -> Result<bool> {
        let Some(policy) = self.config.kv_compression.as_ref() else { return Ok(false) };
        let mut cache = ModelCache::new(&self.model.kv_layout().kinds)?;
        let logits = self.model.forward(&token_row(&vec![1; WARM_HISTORY])?, &mut cache)?;
        eval(&[&logits])?;
        if cache.compress(Some(policy), Phase::Decode)? == 0 {
            return Ok(false);
        }
        let logits = self.model.forward(&token_row(&[1])?, &mut cache)?;
        eval(&[&logits])?;
        Ok(true)
    }

    /// Queues a request; its events arrive on `request.events` as turns run.
    pub fn submit(&mut self, request: Request) {
        self.waiting.fetch_add(1, Ordering::SeqCst);
        self.enqueue(request);
    }

    /// Queues a request already counted in the waiting counter.
    pub(super) fn enqueue(&mut self, request: Request) {
        self.queue.push_back(request);
    }

    /// Sequences decoding, prefilling or about to join.
    fn running(&self) -> usize {
        self.batch.as_ref().map(|b| b.seqs.len()).unwrap_or(0) + self.ready.len() + self.prefill.len()
    }

    /// Nothing queued or running: a turn would do nothing.
    pub fn is_idle(&self) -> bool {
        self.queue.is_empty() && self.running() == 0
    }

    /// Why a model computation of the turns since the last call failed (the
    /// requests it served have ended with the error). One process carries
    /// on; the ranks of a distributed group cannot (a failed collective
    /// leaves them out of step), so they stop on it.
    pub fn take_step_failure(&mut self) -> Option<String> {
        self.step_failure.take()
    }

    fn note_step_failure(&mut self, e: &impl std::fmt::Display) {
        self.step_failure.get_or_insert_with(|| e.to_string());
    }

    /// One turn (see the module doc). The time of each part goes to the
    /// metrics (`mlx_serve_engine_seconds_total`), so a benchmark can say
    /// where a wave's wall time went.
    pub fn step(&mut self) {
        let start = Instant::now();
        self.admit();
        let start = self.lap("admit", start);
        let (handing, host) = self.decode();
        // The tokens' hand-off was counted on its own ("tokens").
        let start = self.lap("decode", start + handing);
        // The step's host time by part goes in after the decode part that
        // holds it: a client whose last token was handed over may read
        // /metrics before this turn ends, and must not see the parts of a
        // step whose decode time is not yet counted.
        if let Some(h) = host {
            self.metrics.record_decode_host(h.build, h.launch, h.wait);
        }
        if !self.ready.is_empty() {
            // No prefill this turn: the sequences joining now get their first
            // token at the next step, not after another prompt's chunk.
            self.place_ready();
            self.lap("join", start);
        } else {
            self.prefill_chunk();
            self.lap("prefill", start);
        }
        if self.is_idle() {
            self.settle();
        }
    }

    /// Waits for the device work still queued when the engine goes idle: a
    /// decode step queued ahead (pipelining) for rows that all ended holds
    /// the batch's KV and activations until it runs. The snapshot taken after
    /// this turn is the last one until the next request, so without the wait
    /// /health and /metrics would go on reporting those buffers as live.
    fn settle(&self) {
        if let Err(e) = mlx_rs_safe::synchronize() {
            log::warn!("engine: waiting for the last queued work failed: {e}");
        }
    }

    /// Records the time since `since` as `part` of the turn; returns now.
    fn lap(&self, part: &'static str, since: Instant) -> Instant {
        let now = Instant::now();
        self.metrics.record_engine_time(part, now.duration_since(since).as_secs_f64());
        now
    }

    /// Drops the queued requests whose clients went away, wherever they wait:
    /// left for their turn they would hold places in the queue (--max-queue)
    /// and use up admissions while every slot is busy. (In a distributed
    /// group a request's channel closes on the same turn on every rank.)
    fn drop_abandoned(&mut self) {
        let before = self.queue.len();
        self.queue.retain(|r| !r.events.is_closed());
        for _ in self.queue.len()..before {
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            self.metrics.record_cancelled();
        }
    }

    /// Tokens of KV each running sequence reserves.
    fn reserved_tokens(&self) -> Vec<usize> {
        let batch = self.batch.iter().flat_map(|b| b.seqs.iter());
        let joining = self.ready.iter().map(|j| &j.seq);
        let prefilling = self.prefill.iter().map(|p| &p.seq);
        batch.chain(joining).chain(prefilling).map(Sequence::reserved_tokens).collect()
    }

    /// Starts prefilling waiting requests while slots are free and their KV
    /// fits the pool, oldest first.
    fn admit(&mut self) {
        self.drop_abandoned();
        let admissions = self.policy.admissions(self.running(), self.queue.len());
        let mut reserved = self.reserved_tokens();
        for _ in 0..admissions {
            let Some(front) = self.queue.front() else { return };
            let need = Sequence::reservation(&front.params, self.config.context);
            if !self.policy.fits(&reserved, need) {
                return;
            }
            let Some(request) = self.queue.pop_front() else { return };
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            if request.params.prompt.is_empty() {
                let _ = request.events.send(Event::Error("the prompt is empty".into()));
                continue;
            }
            self.metrics.add_prompt_tokens(request.params.prompt.len() as u64);
            let sampler = match Sampler::new(request.params.sampling.clone()) {
                Ok(s) => s,
                Err(e) => {
                    let _ = request.events.send(Event::Error(e.to_string()));
                    continue;
                }
            };
            let hit = match self.lookup_prompt_cache(&request.params.prompt) {
                Ok(hit) => hit,
                Err(e) => {
                    let _ = request.events.send(Event::Error(e.to_string()));
                    continue;
                }
            };
            let (cache, cached, source) = match hit {
                Some(h) => (h.cache, h.cached_tokens, h.entry),
                None => match ModelCache::new(&self.model.kv_layout().kinds) {
                    Ok(c) => (c, 0, None),
                    Err(e) => {
                        let _ = request.events.send(Event::Error(e.to_string()));
                        continue;
                    }
                },
            };
            let mut seq = Sequence::new(request, sampler, &self.tokenizer, cached, self.config.context);
            reserved.push(seq.reserved_tokens());
            seq.cache_source = source;
            self.prefill.push_back(Prefill { seq, cache, done: cached, started: Instant::now(), reported: cached });
        }
    }

    fn lookup_prompt_cache(&mut self, prompt: &[u32]) -> Result<Option<crate::kv::PromptCacheHit>> {
        if self.config.prompt_cache_bytes == 0 {
            return Ok(None);
        }
        let hit = self.prompt_cache.lookup(prompt, |n| self.policy.takes_hit(n, prompt.len()))?;
        self.metrics.record_prompt_cache_lookup(hit.as_ref().map(|h| h.cached_tokens as u64).unwrap_or(0));
        Ok(hit)
    }

    /// Prefills this turn's share of the admitted prompts (the policy's plan),
    /// oldest first. Prompts whose prefill is done become ready to join.
    ///
    /// Whole prompts with nothing prefilled yet go in groups of one model call
    /// each (the policy's `prefill_groups`), the rest a call each. Every call
    /// is queued before the turn waits for any: the host builds the next
    /// call's graph while the device runs the one before. A failure the wait
    /// reports ends the prompts prefilled this turn, whose work it cannot
    /// tell apart.
    fn prefill_chunk(&mut self) {
        let before = self.prefill.len();
        self.prefill.retain(|p| p.seq.is_connected());
        for _ in self.prefill.len()..before {
            self.metrics.record_cancelled();
        }
        let remaining: Vec<usize> = self.prefill.iter().map(Prefill::remaining).collect();
        let burst = self.batch.is_none() && self.prefill.iter().all(|p| p.done == 0);
        let plan = self.policy.prefill(&remaining, burst);
        let sizes: Vec<usize> = self
            .prefill
            .iter()
            .enumerate()
            .map(|(i, p)| plan.get(i).map_or(0, |&n| p.to_checkpoint().map_or(n, |c| n.min(c))))
            .collect();
        // Whole prompts starting from nothing may share a model call.
        let whole: Vec<usize> = (0..sizes.len())
            .filter(|&i| sizes[i] > 0 && self.prefill[i].done == 0 && sizes[i] == self.prefill[i].remaining())
            .collect();
        let mut slots: Vec<Option<Prefill>> = std::mem::take(&mut self.prefill).into_iter().map(Some).collect();
        let groups = self.policy.prefill_groups(&whole.iter().map(|&i| sizes[i]).collect::<Vec<_>>(), burst);
        let mut shared = vec![false; slots.len()];
        for group in groups {
            let members: Vec<usize> = group.iter().map(|&g| whole[g]).collect();
            let mut together: Vec<Prefill> = members.iter().filter_map(|&i| slots[i].take()).collect();
            let lengths: Vec<usize> = members.iter().map(|&i| sizes[i]).collect();
            match self.queue_prefill_together(&mut together, &lengths) {
                Ok(()) => {
                    for (&i, p) in members.iter().zip(together) {
                        slots[i] = Some(p);
                        shared[i] = true;
                    }
                }
                Err(e) => {
                    self.note_step_failure(&e);
                    for mut p in together {
                        p.seq.fail(&e.to_string());
                    }
                }
            }
        }
        let mut staged = Vec::with_capacity(slots.len());
        for (i, slot) in slots.into_iter().enumerate() {
            let Some(mut p) = slot else { continue };
            let n = sizes[i];
            if n > 0 && !shared[i] {
                if let Err(e) = self.queue_prefill(&mut p, n) {
                    self.note_step_failure(&e);
                    p.seq.fail(&e.to_string());
                    continue;
                }
            }
            staged.push((p, n > 0));
        }
        let states: Vec<Array> = staged.iter().filter(|(_, ran)| *ran).flat_map(|(p, _)| p.cache.state()).collect();
        if !states.is_empty() {
            // A chunk's temporaries (attention scores over the whole prompt so far) are the
            // largest buffers the engine allocates; kept in MLX's cache they would pile up, a
            // different size per chunk, until the device is full (mlx-lm clears here too).
            let began = std::time::Instant::now();
            let waited = eval(&states.iter().collect::<Vec<_>>()).and_then(|()| {
                let computed = began.elapsed();
                memory::clear_cache()?;
                // Which of the two a chunk's end spends its time in (a streamed MoE's
                // chunk ends with its last layers' reads; clearing frees every cached
                // buffer, each a free call on a GPU): unmeasured on a GPU so far.
                log::debug!("prefill chunk: waited {:.1} ms for its cache, cleared MLX's buffer cache in {:.1} ms", computed.as_secs_f64() * 1e3, (began.elapsed() - computed).as_secs_f64() * 1e3);
                Ok(())
            });
            if let Err(e) = waited {
                let e = crate::error::Error::from(e);
                self.note_step_failure(&e);
                staged.retain_mut(|(p, ran)| {
                    if *ran {
                        p.seq.fail(&e.to_string());
                    }
                    !*ran
                });
            }
        }
        let mut kept = VecDeque::with_capacity(staged.len());
        for (mut p, ran) in staged {
            if ran && p.seq.request.params.checkpoints.contains(&p.done) {
                self.keep_checkpoint(&p);
            }
            p.report_progress();
            // Admission refused empty prompts, so there is a last token.
            if let (0, Some(&next)) = (p.remaining(), p.seq.request.params.prompt.last()) {
                if self.checkpoint_prompt_end && p.done > p.seq.cached_tokens {
                    // The prompt's KV as it is now: the next turn of a chat starts
                    // with this prompt, though maybe not with this answer (a
                    // template that drops the reasoning re-renders it), and this
                    // cache cannot be cut back to it from a longer entry.
                    self.keep_checkpoint(&p);
                }
                // Decoding starts: what compresses then (TurboQuant) does so now.
                match p.cache.compress(self.config.kv_compression.as_ref(), Phase::Decode) {
                    Ok(n) => self.metrics.record_kv_compressions("decode", n as u64),
                    Err(e) => {
                        self.note_step_failure(&e);
                        p.seq.fail(&e.to_string());
                        continue;
                    }
                }
                self.ready.push(Joining { seq: p.seq, cache: p.cache, next });
            } else {
                kept.push_back(p);
            }
        }
        self.prefill = kept;
    }

    /// Queues the model over the next `n` prompt tokens of `p` (the caller
    /// waits for it).
    fn queue_prefill(&self, p: &mut Prefill, n: usize) -> Result<()> {
        let chunk = token_row(&p.seq.request.params.prompt[p.done..p.done + n])?;
        // The whole prompt's room at once (a store the compression made after
        // the last chunk is a new one: it is told again).
        p.cache.reserve(p.seq.request.params.prompt.len(), self.config.kv_compression.as_ref());
        self.model.forward(&chunk, &mut p.cache)?;
        let converted = p.cache.compress(self.config.kv_compression.as_ref(), Phase::Prefill)?;
        self.metrics.record_kv_compressions("prefill", converted as u64);
        async_eval(&p.cache.state().iter().collect::<Vec<_>>())?;
        p.done += n;
        self.metrics.record_prefill_call(1);
        Ok(())
    }

    /// Queues one model call over the whole prompts of `together` (each
    /// `lengths[i]` tokens, nothing prefilled yet), left-padded to the
    /// longest as mlx-lm's batched prefill pads them, then hands each prompt
    /// a cache of its own rows (the caller waits). A burst of short prompts
    /// costs one call instead of one each: on a GPU a call over a short
    /// prompt is mostly launch cost and idle compute (8 prompts of ~128
    /// tokens: 1.7x faster together on an H200, bench/prefill_probe.py).
    fn queue_prefill_together(&self, together: &mut [Prefill], lengths: &[usize]) -> Result<()> {
        let longest = lengths.iter().copied().max().unwrap_or(0);
        let pads: Vec<i32> = lengths.iter().map(|&n| (longest - n) as i32).collect();
        let mut ids: Vec<i32> = Vec::with_capacity(together.len() * longest);
        for (p, &n) in together.iter().zip(lengths) {
            // Padding positions hold any token: attention never reads them.
            ids.extend(std::iter::repeat_n(0, longest - n));
            ids.extend(p.seq.request.params.prompt[..n].iter().map(|&t| t as i32));
        }
        let tokens = Array::from_slice(&ids, &[together.len() as i32, longest as i32])?;
        let kinds = self.model.kv_layout().kinds;
        let mut cache = ModelCache::padded_prompts(&kinds, &pads).ok_or(crate::error::Error::Internal("prompts shared a call on caches that cannot be padded"))?;
        self.model.forward(&tokens, &mut cache)?;
        for ((p, row), &n) in together.iter_mut().zip(cache.split_rows()?).zip(lengths) {
            p.cache = row;
            let converted = p.cache.compress(self.config.kv_compression.as_ref(), Phase::Prefill)?;
            self.metrics.record_kv_compressions("prefill", converted as u64);
            async_eval(&p.cache.state().iter().collect::<Vec<_>>())?;
            p.done += n;
        }
        self.metrics.record_prefill_call(together.len() as u64);
        Ok(())
    }

    /// Prefilled sequences join the batch.
    fn place_ready(&mut self) {
        let mut joining = std::mem::take(&mut self.ready).into_iter();
        let result = match self.batch.as_mut() {
            Some(batch) => batch.join(joining.collect()),
            None => match joining.next() {
                Some(first) => DecodeBatch::new(first).and_then(|mut b| {
                    let rest: Vec<Joining> = joining.collect();
                    let joined = if rest.is_empty() { Ok(()) } else { b.join(rest) };
                    self.batch = Some(b);
                    joined
                }),
                None => Ok(()),
            },
        };
        if let Err(e) = result {
            // The batch's arrays are in an unknown state: end its sequences.
            log::error!("engine: joining the batch failed: {e}");
            self.note_step_failure(&e);
            if let Some(mut b) = self.batch.take() {
                b.fail_all(&e.to_string());
            }
        }
    }

    /// One decode step of the batch. Returns the time its tokens' hand-off
    /// to their sequences took (recorded as "tokens") and the step's host
    /// time by part (None: no step ran, or it failed).
    fn decode(&mut self) -> (Duration, Option<StepHostTime>) {
        let Some(batch) = self.batch.as_mut() else { return (Duration::ZERO, None) };
        self.decode_turns += 1;
        if self.decode_turns.is_multiple_of(CLEAR_CACHE_EVERY) {
            if let Err(e) = memory::clear_cache() {
                log::warn!("engine: {e}");
            }
        }
        let pipeline = self.ready.is_empty();
        let tokenizer = self.tokenizer.clone();
        let metrics = self.metrics.clone();
        metrics.record_decode_step(batch.seqs.len() as u64);
        let kept_masks = &mut self.kept_masks;
        // The host's per-token work, counted apart from the step ("tokens").
        let mut handing = Duration::ZERO;
        let result = batch.step(self.model.as_ref(), self.config.kv_compression.as_ref(), pipeline, kept_masks, |seq, token, logprobs| {
            if !seq.is_connected() {
                metrics.record_cancelled();
                seq.finished = true;
                return Ok(true);
            }
            let start = Instant::now();
            let ended = seq.accept(token, logprobs, &tokenizer, &metrics);
            handing += start.elapsed();
            ended
        });
        metrics.record_engine_time("tokens", handing.as_secs_f64());
        metrics.record_kv_compressions("decode", std::mem::take(&mut batch.compressed) as u64);
        let mut host = None;
        match result {
            Ok(outcome) => {
                host = Some(outcome.host);
                if let Some(m) = outcome.masks {
                    metrics.record_grammar_masks(m.seconds, m.rows.uploaded as u64, m.rows.reused as u64);
                }
                for (seq, kv) in outcome.ended {
                    self.keep_in_prompt_cache(&seq, kv);
                }
            }
            Err(e) => {
                log::error!("engine: decode step failed: {e}");
                batch.fail_all(&e.to_string());
                self.note_step_failure(&e);
            }
        }
        if self.batch.as_ref().is_some_and(DecodeBatch::is_empty) {
            self.batch = None;
        }
        (handing, host)
    }

    /// Stores the KV of a prompt's first tokens, at a checkpoint.
    fn keep_checkpoint(&mut self, p: &Prefill) {
        if self.config.prompt_cache_bytes == 0 {
            return;
        }
        let tokens = p.seq.request.params.prompt[..p.done].to_vec();
        let stored = p.cache.snapshot(0).and_then(|kv| self.prompt_cache.insert(tokens, kv, None));
        if let Err(e) = stored {
            log::warn!("prompt cache: {e}");
        }
    }

    /// Stores a finished sequence's KV for later requests sharing its tokens.
    fn keep_in_prompt_cache(&mut self, seq: &Sequence, kv: crate::kv::KvSnapshot) {
        if self.config.prompt_cache_bytes == 0 {
            return;
        }
        // Keep exactly the fed tokens' KV (with the last sampled token's when
        // a step queued ahead fed it: a recurrent state cannot be cut back).
        let tokens = seq.held_history(kv.len().max(0) as usize).to_vec();
        let n = tokens.len() as i32;
        if kv.servable(n) != n {
            return;
        }
        let stored = kv.prefix(n).and_then(|kv| self.prompt_cache.insert(tokens, kv, seq.cache_source));
        if let Err(e) = stored {
            log::warn!("prompt cache: {e}");
        }
    }

    /// Ends every queued and running request with `message`.
    pub fn abandon_all(&mut self, message: &str) {
        for r in self.queue.drain(..) {
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            let _ = r.events.send(Event::Error(message.to_string()));
        }
        for mut p in self.prefill.drain(..) {
            p.seq.fail(message);
        }
        for mut j in self.ready.drain(..) {
            j.seq.fail(message);
        }
        if let Some(mut b) = self.batch.take() {
            b.fail_all(message);
        }
    }

    /// What the engine holds now, and MLX's memory.
    pub fn snapshot(&self) -> EngineSnapshot {
        let active = memory::active_memory().unwrap_or(0);
        EngineSnapshot {
            running: self.running(),
            kv_bytes: self.batch.as_ref().map(DecodeBatch::kv_bytes).unwrap_or(0),
            kv_tokens: self.batch.as_ref().map(DecodeBatch::kv_tokens).unwrap_or(0),
            prompt_cache_bytes: self.prompt_cache.nbytes(),
            active_memory: active,
            // After a reset MLX reads 0 until the next allocation; the peak is never below what is live.
            peak_memory: memory::peak_memory().unwrap_or(0).max(active),
            cache_memory: memory::cache_memory().unwrap_or(0),
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        // A decode step may still be running (queued with async_eval ahead of
        // its tokens): wait for it, so no MLX stream thread is still freeing
        // its buffers when the process exits after the engine.
        self.settle();
    }
}
