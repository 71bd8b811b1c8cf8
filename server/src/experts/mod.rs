//! SSD expert streaming (`--stream-experts`): a MoE model's routed experts stay
//! on disk, indexed from the safetensors headers, and are read on demand into a
//! fixed pool of expert slots per layer; everything else is resident.
//!
//! - [`reader`]: the reader threads and the only path expert bytes take.
//! - [`slots`]: which expert each slot holds; what a step reads and evicts.
//! - [`budget`]: `--expert-cache-bytes` → slots per layer.
//! - [`counters`]: the metrics that prove reads happen.
//! - [`speculation`]: decode steps that run on the slots as they are and read
//!   every layer's router back once, at the end.
//!
//! The MoE layer that uses them is `models::streamed_switch`; the layer loop
//! that runs a step again when it guessed wrong is `models::speculative_step`.

pub mod budget;
pub mod counters;
pub mod reader;
pub mod slots;
pub mod speculation;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};

use mlx_rs_safe::Array;

pub use budget::CacheBudget;
pub use counters::ExpertCounters;
pub use reader::{ExpertReader, IoMode, PendingReads, ReadJob, Region};
pub use speculation::Speculation;

use crate::error::{Error, Result};

/// What `--stream-experts` and its flags ask for.
#[derive(Debug, Clone)]
pub struct ExpertOptions {
    /// `None`: half of what the memory MLX may use leaves after the resident weights.
    pub budget: Option<CacheBudget>,
    pub io: IoMode,
    pub readers: usize,
    /// Wide prefill chunks start the next layer's reads early (see `models::streamed_switch`).
    pub read_ahead: bool,
    /// When decode steps run on the experts the slots hold, checked at the
    /// end (`--expert-speculation`).
    pub speculate: Speculation,
    /// Decode steps read up to this many of the next layer's predicted experts
    /// early (`--expert-prefetch`; 0: off).
    pub prefetch: usize,
    pub counters: ExpertCounters,
}

/// A streamed MoE layer as the others see it: one that can start reading its
/// experts before its router has run, and check a speculative step's choice.
pub trait StreamedLayer: Send + Sync {
    /// Starts reading the experts of `predicted` (its router's picks for an
    /// earlier layer's input, see [`Self::predict`]) that the layer does not
    /// hold, the most picked first: all of them for a wide step, the
    /// `--expert-prefetch` most picked for a narrow one (a no-op when such
    /// reads are already under way, the layer holds every expert or, for a
    /// narrow step, stopped guessing).
    fn read_ahead(&self, predicted: &[u32], wide: bool) -> Result<()>;

    /// The experts this layer's router would pick for `x` (an earlier layer's
    /// MoE input, [..., D]), flat uint32, queued not evaluated; None when the
    /// layer takes no guesses (it holds every expert, has reads under way or,
    /// for a narrow step, stopped guessing).
    fn predict(&self, x: &Array, wide: bool) -> Result<Option<Array>>;

    /// A speculative step's router chose `ids` (row-major, token order): if
    /// the slots held them all, records the step's hits and returns true; if
    /// any was missing, changes nothing and returns false.
    fn confirm(&self, ids: &[u32]) -> Result<bool>;

    /// Before a speculative step runs again: starts reading the experts in
    /// `ids` (this layer's choice in the pass that failed) that the layer
    /// lacks, if they are at most `cap`, taking over reads begun ahead of its
    /// router; returns how many reads it started, or None when `ids` holds
    /// more experts than the layer has slots (no pass can run it on its
    /// slots alone: the step goes on per layer from there).
    fn read_for_replay(&self, ids: &[u32], cap: usize) -> Result<Option<usize>>;

    /// Waits for and drops the reads [`Self::read_for_replay`] started, for a
    /// speculative step that failed before installing them.
    fn abandon_replay(&self);

    /// Waits for the reads [`Self::read_for_replay`] started and writes them
    /// into the slots, so the step's next pass finds them there. They count
    /// as misses (and as read ahead and used) when a step uses them.
    fn install_for_replay(&self) -> Result<()>;

    /// Bytes of one expert's tensors.
    fn expert_bytes(&self) -> u64;
}

/// What a model's MoE layers share while streaming: the readers, how many
/// slots each layer's pool has, and the layers themselves (so that a prefill
/// chunk's layer can start the next one's reads).
pub struct ExpertStream {
    pub reader: ExpertReader,
    budget: CacheBudget,
    /// Bytes of every routed expert of the model.
    total_bytes: u64,
    layers: Mutex<BTreeMap<u32, Weak<dyn StreamedLayer>>>,
    read_ahead: bool,
    speculate: Speculation,
    /// The speculative step under way, if any.
    step: Mutex<Option<speculation::StepRecord>>,
    miss_rate: Mutex<speculation::MissRate>,
    /// `--expert-prefetch`: experts read ahead per layer and decode step.
    pub prefetch: usize,
    /// When the readers started: the origin of the trace log's timeline.
    started: std::time::Instant,
}

impl ExpertStream {
    /// Starts the readers over `files` for a model whose routed experts take
    /// `total_bytes` and the rest `resident_bytes`.
    pub fn start(opts: &ExpertOptions, files: &[PathBuf], total_bytes: u64, resident_bytes: u64) -> Result<ExpertStream> {
        if total_bytes == 0 {
            return Err(Error::Config("--stream-experts: the model has no routed experts to stream (not a mixture-of-experts model)".into()));
        }
        let budget = match opts.budget {
            Some(b) => b,
            None => {
                let limit = mlx_rs_safe::memory::memory_limit()? as u64;
                CacheBudget::Bytes(limit.saturating_sub(resident_bytes) / 2)
            }
        };
        let reader = ExpertReader::start(files, opts.io, opts.readers, opts.counters.clone())?;
        log::info!(
            "streaming experts: {:.2} GB of routed experts on disk, cache budget {}, {} reads, {} reader threads",
            total_bytes as f64 / 1e9,
            budget.describe(),
            reader.mode().name(),
            opts.readers.max(1)
        );
        Ok(ExpertStream {
            reader,
            budget,
            total_bytes,
            layers: Mutex::new(BTreeMap::new()),
            read_ahead: opts.read_ahead,
            speculate: opts.speculate,
            step: Mutex::new(None),
            miss_rate: Mutex::new(speculation::MissRate::default()),
            prefetch: opts.prefetch,
            started: std::time::Instant::now(),
        })
    }

    /// Milliseconds from the readers' start to `t` (the trace log's clock).
    pub fn millis_since_start(&self, t: std::time::Instant) -> f64 {
        t.saturating_duration_since(self.started).as_secs_f64() * 1e3
    }

    /// Slots of a layer of `experts` experts routing `top_k` per token; a
    /// budget that cannot hold one token's experts is refused.
    pub fn slots(&self, experts: usize, top_k: usize) -> Result<usize> {
        let slots = self.budget.slots(experts, self.total_bytes);
        if slots < top_k {
            let need = (self.total_bytes as f64 * top_k as f64 / experts as f64).ceil() as u64;
            return Err(Error::Config(format!(
                "--expert-cache-bytes {} leaves {slots} expert slot(s) per MoE layer, fewer than the {top_k} experts each token uses: give at least {need} bytes ({:.1}%)",
                self.budget.describe(),
                100.0 * top_k as f64 / experts as f64
            )));
        }
        Ok(slots)
    }

    /// Makes streamed layer `layer` known to [`ExpertStream::next_layer`].
    pub fn register(&self, layer: u32, target: Weak<dyn StreamedLayer>) {
        self.layers.lock().unwrap_or_else(|e| e.into_inner()).insert(layer, target);
    }

    /// Streamed layer `layer`, if it is one.
    pub fn layer(&self, layer: u32) -> Option<Arc<dyn StreamedLayer>> {
        let layers = self.layers.lock().unwrap_or_else(|e| e.into_inner());
        layers.get(&layer).and_then(Weak::upgrade)
    }

    /// The first streamed layer after `layer`, if any.
    pub fn next_layer(&self, layer: u32) -> Option<Arc<dyn StreamedLayer>> {
        let layers = self.layers.lock().unwrap_or_else(|e| e.into_inner());
        layers.range(layer + 1..).next().and_then(|(_, l)| l.upgrade())
    }

    /// Whether wide steps start the next layer's reads before its router runs.
    pub fn reads_ahead(&self) -> bool {
        self.read_ahead
    }
}
