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

use std::path::PathBuf;

pub use budget::CacheBudget;
pub use counters::ExpertCounters;
pub use reader::{ExpertReader, IoMode, ReadJob, Region};

use crate::error::{Error, Result};

/// What `--stream-experts` and its flags ask for.
#[derive(Debug, Clone)]
pub struct ExpertOptions {
    /// `None`: half of what the memory MLX may use leaves after the resident weights.
    pub budget: Option<CacheBudget>,
    pub io: IoMode,
    pub readers: usize,
    pub counters: ExpertCounters,
}

/// What a model's MoE layers share while streaming: the readers, and how many
/// slots each layer's pool has.
pub struct ExpertStream {
    pub reader: ExpertReader,
    budget: CacheBudget,
    /// Bytes of every routed expert of the model.
    total_bytes: u64,
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
        Ok(ExpertStream { reader, budget, total_bytes })
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
}
