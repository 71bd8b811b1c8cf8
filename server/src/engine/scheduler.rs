//! The engine thread: owns the model and every MLX array, takes requests from
//! a channel and runs continuous batching. Each turn of its loop:
//! 1. admits waiting requests while slots are free (prompt-cache lookup),
//! 2. runs one decode step of every group (all batched sequences in one model
//!    call), handing tokens to their sequences,
//! 3. moves sequences whose prefill finished into the batch (and then ends
//!    the turn, so their first step is not delayed by another prompt), or
//! 4. prefills up to `prefill_size` prompt tokens of the admitted requests
//!    (several short prompts, or one chunk of a long one),
//! so a long prompt never stalls the running sequences for more than a chunk,
//! and a burst of short requests joins the batch together.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use mlx_rs_safe::{eval, memory, Array};

use super::generate::{maybe_quantize, token_array};
use super::group::{DecodeGroup, KvQuantization};
use super::request::{Event, Request};
use super::sampler::Sampler;
use super::sequence::Sequence;
use crate::error::{Error, Result};
use crate::kv::{KvCache, KvRows, PromptCache};
use crate::metrics::Metrics;
use crate::models::LanguageModel;
use crate::tokenizer::Tokenizer;

#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Prompt tokens per prefill chunk.
    pub prefill_size: usize,
    /// Sequences generating (or prefilling) at once.
    pub max_concurrency: usize,
    /// Requests waiting for a slot before new ones are refused.
    pub max_queue: usize,
    /// Bytes of KV the prompt cache keeps (0 = off).
    pub prompt_cache_bytes: usize,
    pub kv_quant: Option<KvQuantization>,
}

/// Figures the engine publishes after each turn, so HTTP handlers can report
/// them without touching MLX.
#[derive(Debug, Default)]
pub struct EngineStats {
    pub active_memory: AtomicUsize,
    pub peak_memory: AtomicUsize,
    pub cache_memory: AtomicUsize,
    pub running: AtomicUsize,
    pub kv_bytes: AtomicUsize,
    pub prompt_cache_bytes: AtomicUsize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubmitError {
    /// `max_queue` requests are already waiting.
    QueueFull,
    /// The engine thread has stopped.
    Stopped,
}

enum Command {
    Generate(Request),
    Shutdown,
}

pub struct EngineHandle {
    tx: Sender<Command>,
    /// Requests submitted and not yet admitted.
    waiting: Arc<AtomicUsize>,
    max_queue: usize,
    pub stats: Arc<EngineStats>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl EngineHandle {
    /// Starts the engine thread, which loads the model with `load`; returns
    /// once the model is loaded (or failed to load).
    pub fn spawn(
        load: Box<dyn FnOnce() -> Result<Box<dyn LanguageModel>> + Send>,
        tokenizer: Arc<Tokenizer>,
        config: EngineConfig,
        metrics: Arc<Metrics>,
    ) -> Result<EngineHandle> {
        let (tx, rx) = mpsc::channel();
        let (ready_tx, ready_rx) = mpsc::channel();
        let waiting = Arc::new(AtomicUsize::new(0));
        let stats = Arc::new(EngineStats::default());
        let max_queue = config.max_queue;
        let (w, s) = (waiting.clone(), stats.clone());
        let thread = std::thread::Builder::new()
            .name("mlx-engine".into())
            .spawn(move || {
                let model = match load() {
                    Ok(m) => {
                        let _ = ready_tx.send(Ok(()));
                        m
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                Scheduler::new(model, tokenizer, config, metrics, w, s).run(rx);
            })
            .map_err(|e| Error::InvalidRequest(format!("cannot start the engine thread: {e}")))?;
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(EngineHandle { tx, waiting, max_queue, stats, thread: Mutex::new(Some(thread)) }),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(Error::InvalidRequest("the engine thread stopped while loading the model".into())),
        }
    }

    /// Queues a request; its events arrive on `request.events`.
    pub fn submit(&self, request: Request) -> std::result::Result<(), SubmitError> {
        if self.waiting.fetch_add(1, Ordering::SeqCst) >= self.max_queue {
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            return Err(SubmitError::QueueFull);
        }
        self.tx.send(Command::Generate(request)).map_err(|_| {
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            SubmitError::Stopped
        })
    }

    /// Requests waiting for a slot.
    pub fn queued(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }

    /// Stops the engine: what is still queued or running ends with an error.
    pub fn shutdown(&self) {
        let _ = self.tx.send(Command::Shutdown);
        let thread = self.thread.lock().map(|mut t| t.take()).unwrap_or(None);
        if let Some(t) = thread {
            let _ = t.join();
        }
    }
}

/// A request whose prompt is being prefilled, chunk by chunk.
struct Prefill {
    seq: Sequence,
    caches: Vec<Box<dyn KvCache>>,
    /// Prompt tokens already in `caches`.
    done: usize,
}

struct Scheduler {
    model: Box<dyn LanguageModel>,
    tokenizer: Arc<Tokenizer>,
    config: EngineConfig,
    metrics: Arc<Metrics>,
    waiting: Arc<AtomicUsize>,
    stats: Arc<EngineStats>,
    queue: VecDeque<Request>,
    /// Admitted requests being prefilled, oldest first.
    prefill: VecDeque<Prefill>,
    /// Prefilled sequences about to join a group, with their caches and the
    /// (last prompt) token they feed first.
    ready: Vec<(Sequence, Vec<Box<dyn KvCache>>, u32)>,
    groups: Vec<DecodeGroup>,
    prompt_cache: PromptCache,
    /// Decode turns run, to clear MLX's buffer cache every CLEAR_CACHE_EVERY of them.
    decode_turns: u64,
}

/// Decode steps between clearing MLX's buffer cache: each step's buffers differ in size
/// (the caches grow by one position, batches are rebuilt as sequences come and go), so
/// the cache keeps collecting sizes it will not reuse (mlx-lm clears every 256 or 512).
const CLEAR_CACHE_EVERY: u64 = 256;

impl Scheduler {
    fn new(
        model: Box<dyn LanguageModel>,
        tokenizer: Arc<Tokenizer>,
        config: EngineConfig,
        metrics: Arc<Metrics>,
        waiting: Arc<AtomicUsize>,
        stats: Arc<EngineStats>,
    ) -> Scheduler {
        Scheduler {
            model,
            tokenizer,
            prompt_cache: PromptCache::new(config.prompt_cache_bytes),
            decode_turns: 0,
            config,
            metrics,
            waiting,
            stats,
            queue: VecDeque::new(),
            prefill: VecDeque::new(),
            ready: Vec::new(),
            groups: Vec::new(),
        }
    }

    fn running(&self) -> usize {
        self.groups.iter().map(|g| g.seqs.len()).sum::<usize>() + self.ready.len() + self.prefill.len()
    }

    fn idle(&self) -> bool {
        self.queue.is_empty() && self.running() == 0
    }

    fn run(mut self, rx: Receiver<Command>) {
        loop {
            // Block only when there is nothing to do.
            if self.idle() {
                self.publish();
                match rx.recv() {
                    Ok(Command::Generate(r)) => self.queue.push_back(r),
                    Ok(Command::Shutdown) | Err(_) => break,
                }
            }
            let mut stop = false;
            loop {
                match rx.try_recv() {
                    Ok(Command::Generate(r)) => self.queue.push_back(r),
                    Ok(Command::Shutdown) => stop = true,
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => {
                        stop = true;
                        break;
                    }
                }
            }
            if stop {
                break;
            }
            self.turn();
            self.publish();
        }
        self.abandon_all("the server is shutting down");
    }

    fn turn(&mut self) {
        self.admit();
        self.decode();
        if !self.ready.is_empty() {
            // No prefill this turn: the sequences joining now get their first
            // token at the next step, not after another prompt's chunk.
            self.place_ready();
            return;
        }
        self.prefill_chunk();
    }

    /// Starts prefilling waiting requests while slots are free.
    fn admit(&mut self) {
        while self.running() < self.config.max_concurrency {
            let Some(request) = self.queue.pop_front() else { return };
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            if request.events.is_closed() {
                self.metrics.record_cancelled();
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
            let hit = if self.config.prompt_cache_bytes > 0 {
                match self.prompt_cache.lookup(&request.params.prompt) {
                    Ok(hit) => hit,
                    Err(e) => {
                        let _ = request.events.send(Event::Error(e.to_string()));
                        continue;
                    }
                }
            } else {
                None
            };
            let cached = hit.as_ref().map(|h| h.cached_tokens).unwrap_or(0);
            let source = hit.as_ref().and_then(|h| h.entry);
            if self.config.prompt_cache_bytes > 0 {
                self.metrics.record_prompt_cache_lookup(cached as u64);
            }
            let caches = hit.map(|h| h.caches).unwrap_or_else(|| self.model.new_caches());
            let mut seq = Sequence::new(request, sampler, &self.tokenizer, cached);
            seq.cache_source = source;
            self.prefill.push_back(Prefill { seq, caches, done: cached });
        }
    }

    /// Prefills chunks of admitted prompts, oldest request first, until about
    /// `prefill_size` tokens went through. Each prompt is cut into chunks of
    /// `prefill_size` from its start whatever else runs, so its KV (and its
    /// quantization, with --kv-bits) is the same as mlx-lm's. All but a
    /// prompt's last token go through here (the last one is the sequence's
    /// first decode step, as in mlx-lm).
    fn prefill_chunk(&mut self) {
        let chunk = self.config.prefill_size.max(1);
        let mut budget = chunk;
        while budget > 0 {
            let Some(mut p) = self.prefill.pop_front() else { return };
            if !p.seq.is_connected() {
                self.metrics.record_cancelled();
                continue;
            }
            let prompt_len = p.seq.request.params.prompt.len();
            let n = (prompt_len - p.done - 1).min(chunk);
            if n > 0 {
                if let Err(e) = self.prefill_tokens(&mut p, n) {
                    p.seq.fail(&e.to_string());
                    continue;
                }
                budget = budget.saturating_sub(n);
            }
            if p.done + 1 == prompt_len {
                let last = p.seq.request.params.prompt[prompt_len - 1];
                self.ready.push((p.seq, p.caches, last));
            } else {
                self.prefill.push_front(p);
            }
        }
    }

    /// Runs the model over the next `n` prompt tokens of `p`.
    fn prefill_tokens(&self, p: &mut Prefill, n: usize) -> Result<()> {
        let chunk = token_array(&p.seq.request.params.prompt[p.done..p.done + n])?;
        self.model.forward(&chunk, &mut p.caches)?;
        if let Some(q) = self.config.kv_quant {
            maybe_quantize(&mut p.caches, q.bits, q.group_size, q.start)?;
        }
        let state: Vec<Array> = p.caches.iter().flat_map(|c| c.state()).collect();
        eval(&state.iter().collect::<Vec<_>>())?;
        p.done += n;
        // A chunk's temporaries (attention scores over the whole prompt so far) are the
        // largest buffers the engine allocates; kept in MLX's cache they would pile up, a
        // different size per chunk, until the device is full (mlx-lm clears here too).
        memory::clear_cache()?;
        Ok(())
    }

    /// Prefilled sequences join the batch (or a group of their own when their
    /// caches cannot be batched).
    fn place_ready(&mut self) {
        let mut joining = Vec::new();
        for (seq, caches, next) in std::mem::take(&mut self.ready) {
            let rows = if self.config.kv_quant.is_some() { Ok(None) } else { KvRows::from_caches(&caches) };
            match rows {
                Ok(Some(rows)) => joining.push((seq, rows, next)),
                Ok(None) => match DecodeGroup::single(seq, caches, next, self.config.kv_quant) {
                    Ok(g) => self.groups.push(g),
                    Err(e) => eprintln!("mlx-serve: engine: {e}"),
                },
                Err(e) => {
                    let mut seq = seq;
                    seq.fail(&e.to_string());
                }
            }
        }
        if joining.is_empty() {
            return;
        }
        let result = match self.groups.iter_mut().find(|g| g.is_batched() && !g.has_pending()) {
            Some(g) => g.join(joining),
            None => DecodeGroup::batch(joining).map(|g| self.groups.push(g)),
        };
        if let Err(e) = result {
            // The batch's arrays are in an unknown state: end its sequences.
            let message = e.to_string();
            for g in self.groups.iter_mut().filter(|g| g.is_batched()) {
                g.fail_all(&message);
            }
        }
    }

    /// One decode step of every group.
    fn decode(&mut self) {
        self.decode_turns += 1;
        if self.decode_turns % CLEAR_CACHE_EVERY == 0 {
            if let Err(e) = memory::clear_cache() {
                eprintln!("mlx-serve: engine: {e}");
            }
        }
        let pipeline = self.ready.is_empty();
        let tokenizer = self.tokenizer.clone();
        let metrics = self.metrics.clone();
        for group in self.groups.iter_mut() {
            metrics.record_decode_step(group.seqs.len() as u64);
            let result = group.step(self.model.as_ref(), pipeline, |seq, token, logprobs| {
                if !seq.is_connected() {
                    metrics.record_cancelled();
                    seq.finished = true;
                    return Ok(true);
                }
                seq.accept(token, logprobs, &tokenizer, &metrics)
            });
            match result {
                Ok(ended) => {
                    for (seq, kv) in ended {
                        if let (Some(kv), true) = (kv, self.config.prompt_cache_bytes > 0) {
                            let tokens = seq.cached_history().to_vec();
                            let source = seq.cache_source;
                            let stored = kv.prefix(tokens.len() as i32).and_then(|kv| self.prompt_cache.insert(tokens, kv, source));
                            if let Err(e) = stored {
                                eprintln!("mlx-serve: prompt cache: {e}");
                            }
                        }
                    }
                }
                Err(e) => group.fail_all(&e.to_string()),
            }
        }
        self.groups.retain(|g| !g.is_empty());
    }

    fn abandon_all(&mut self, message: &str) {
        for r in self.queue.drain(..) {
            let _ = r.events.send(Event::Error(message.to_string()));
        }
        for mut p in self.prefill.drain(..) {
            p.seq.fail(message);
        }
        for (mut seq, _, _) in self.ready.drain(..) {
            seq.fail(message);
        }
        for g in self.groups.iter_mut() {
            g.fail_all(message);
        }
    }

    fn publish(&self) {
        let s = &self.stats;
        let kv: usize = self.groups.iter().map(|g| g.kv_bytes()).sum();
        s.running.store(self.running(), Ordering::Relaxed);
        s.kv_bytes.store(kv, Ordering::Relaxed);
        s.prompt_cache_bytes.store(self.prompt_cache.nbytes(), Ordering::Relaxed);
        let active = memory::active_memory().unwrap_or(0);
        // After a reset MLX reads 0 until the next allocation; the peak is never below what is live.
        let peak = memory::peak_memory().unwrap_or(0).max(active);
        s.active_memory.store(active, Ordering::Relaxed);
        s.peak_memory.store(peak, Ordering::Relaxed);
        s.cache_memory.store(memory::cache_memory().unwrap_or(0), Ordering::Relaxed);
        self.metrics.set_mlx_memory(active as i64, peak as i64);
        self.metrics.set_running(self.running() as i64);
        self.metrics.set_queued(self.waiting.load(Ordering::Relaxed) as i64);
        self.metrics.set_kv_bytes(kv as i64);
        self.metrics.set_prompt_cache_bytes(self.prompt_cache.nbytes() as i64);
    }
}
