//! SSD expert streaming (`--stream-experts`): a MoE model's routed experts stay
//! on disk, indexed from the safetensors headers, and are read on demand into a
//! fixed pool of expert slots per layer; everything else is resident.
//!
//! - [`reader`]: the reader threads and the only path expert bytes take.
//! - [`slots`]: which expert each slot holds; what a step reads and evicts.
//! - [`budget`]: `--expert-cache-bytes` → slots per layer.
//! - [`counters`]: the metrics that prove reads happen.
//!
//! The MoE layer that uses them is `models::streamed_switch`.

pub mod budget;
pub mod counters;
pub mod reader;
pub mod slots;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};

use mlx_rs_safe::Array;

pub use budget::CacheBudget;
pub use counters::ExpertCounters;
pub use reader::{ExpertReader, IoMode, PendingReads, ReadJob, Region};

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
    /// Decode steps read up to this many of the next layer's predicted experts
    /// early (`--expert-prefetch`; 0: off).
    pub prefetch: usize,
    pub counters: ExpertCounters,
}

/// A streamed MoE layer as the others see it: one that can start reading its
/// experts before its router has run.
pub trait ReadAhead: Send + Sync {
    /// Starts reading every expert the layer does not hold (a no-op when such
    /// reads are already under way or the layer holds them all).
    fn read_ahead(&self) -> Result<()>;

    /// The experts this layer's router would pick for `x` (an earlier layer's
    /// MoE input, [..., D]), flat uint32, queued not evaluated; None when the
    /// layer takes no guesses (it holds every expert, has reads under way or
    /// stopped guessing).
    fn predict(&self, x: &Array) -> Result<Option<Array>>;

    /// Starts reading up to `cap` of `experts` (predicted) that the layer lacks.
    fn prefetch(&self, experts: &[u32], cap: usize) -> Result<()>;
}

/// What a model's MoE layers share while streaming: the readers, how many
/// slots each layer's pool has, and the layers themselves (so that a prefill
/// chunk's layer can start the next one's reads).
pub struct ExpertStream {
    pub reader: ExpertReader,
    budget: CacheBudget,
    /// Bytes of every routed expert of the model.
    total_bytes: u64,
    layers: Mutex<BTreeMap<u32, Weak<dyn ReadAhead>>>,
    read_ahead: bool,
    /// `--expert-prefetch`: experts read ahead per layer and decode step.
    pub prefetch: usize,
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
            prefetch: opts.prefetch,
        })
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

    /// Makes streamed layer `layer` known to [`ExpertStream::read_ahead_after`].
    pub fn register(&self, layer: u32, target: Weak<dyn ReadAhead>) {
        self.layers.lock().unwrap_or_else(|e| e.into_inner()).insert(layer, target);
    }

    /// The first streamed layer after `layer`, if any.
    pub fn next_layer(&self, layer: u32) -> Option<Arc<dyn ReadAhead>> {
        let layers = self.layers.lock().unwrap_or_else(|e| e.into_inner());
        layers.range(layer + 1..).next().and_then(|(_, l)| l.upgrade())
    }

    /// Starts the reads of the first streamed layer after `layer`, if any.
    pub fn read_ahead_after(&self, layer: u32) -> Result<()> {
        if !self.read_ahead {
            return Ok(());
        }
        self.next_layer(layer).map_or(Ok(()), |l| l.read_ahead())
    }
}
