//! The expert-streaming metrics: one set of handles shared by the reader
//! threads (bytes, reads), the MoE layers (hits, misses, stalls, syncs) and the
//! HTTP threads that render /metrics and /health.
//!
//! Every byte counted here was returned by a read system call in
//! [`super::reader`], the one place expert bytes come from; `/proc/self/io`'s
//! `read_bytes` (what the kernel fetched from the storage device) is reported
//! beside them so anyone can check the two agree.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};
use serde_json::{json, Value};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LayerLabels {
    layer: u32,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModeLabels {
    mode: &'static str,
}

#[derive(Clone, Debug, Default)]
pub struct ExpertCounters {
    /// Bytes of expert tensors delivered by reads; with `failed_bytes`,
    /// exactly (misses − prefetch used + prefetch issued) × expert size.
    pub(super) bytes_read: Counter,
    /// Bytes of expert tensors whose read failed (I/O error, a truncated
    /// file, NaN or infinity), each failing the request that needed it.
    pub(super) failed_bytes: Counter,
    /// Bytes the read calls asked the disk for: the tensors' bytes, widened to
    /// whole blocks for O_DIRECT. What `/proc/self/io` should show.
    pub(super) disk_bytes: Counter,
    pub(super) reads: Counter,
    hits: Family<LayerLabels, Counter>,
    misses: Family<LayerLabels, Counter>,
    hits_all: Counter,
    misses_all: Counter,
    stall_seconds: Counter<f64, AtomicU64>,
    /// Reader threads' time in read calls, summed over threads.
    pub(super) read_call_seconds: Counter<f64, AtomicU64>,
    /// Reader threads' time checking read bytes and copying them into MLX
    /// arrays, summed over threads.
    pub(super) array_seconds: Counter<f64, AtomicU64>,
    router_wait_seconds: Counter<f64, AtomicU64>,
    /// Bytes of read slabs advised to stay in host memory for the GPU to
    /// read in place (CUDA; 0 where host and GPU share memory, or none).
    pub(super) host_staged_bytes: Counter,
    host_syncs: Counter,
    prefetch_issued: Counter,
    prefetch_used: Counter,
    speculative_steps: Counter,
    speculative_passes: Counter,
    replayed_steps: Counter,
    resident_bytes: Gauge,
    capacity_bytes: Gauge,
    io_mode: Family<ModeLabels, Gauge>,
    mode: std::sync::Arc<std::sync::OnceLock<&'static str>>,
}

impl ExpertCounters {
    /// Adds every handle to `r` (the server's `mlx_serve_` registry).
    pub fn register(&self, r: &mut Registry) {
        r.register_with_unit(
            "expert_read",
            "Bytes of routed-expert tensors read from disk (with the failed ones, exactly (misses - prefetch used + prefetch issued) x expert size)",
            Unit::Bytes,
            self.bytes_read.clone(),
        );
        r.register_with_unit(
            "expert_failed_read",
            "Bytes of routed-expert tensors whose read failed (an I/O error, a truncated file, NaN or infinity); each failed the request that needed it",
            Unit::Bytes,
            self.failed_bytes.clone(),
        );
        r.register_with_unit(
            "expert_disk_read",
            "Bytes the expert reads asked the disk for (tensor bytes widened to whole blocks under O_DIRECT); compare with /proc/self/io read_bytes",
            Unit::Bytes,
            self.disk_bytes.clone(),
        );
        r.register("expert_reads", "Read system calls for expert tensors", self.reads.clone());
        r.register("expert_cache_hits", "Routed experts a step used that were already in the layer's slots", self.hits.clone());
        r.register("expert_cache_misses", "Routed experts a step used that had to be read from disk", self.misses.clone());
        r.register_with_unit(
            "expert_stall",
            "Time the model waited for expert reads",
            Unit::Seconds,
            self.stall_seconds.clone(),
        );
        r.register_with_unit(
            "expert_read_call",
            "Time the expert reader threads spent in read calls, summed over threads",
            Unit::Seconds,
            self.read_call_seconds.clone(),
        );
        r.register_with_unit(
            "expert_array",
            "Time the expert reader threads spent checking read bytes and copying them into MLX arrays, summed over threads",
            Unit::Seconds,
            self.array_seconds.clone(),
        );
        r.register_with_unit(
            "expert_router_wait",
            "Time streamed MoE layers waited for their router's choice to reach the host (the device work queued before it)",
            Unit::Seconds,
            self.router_wait_seconds.clone(),
        );
        r.register_with_unit(
            "expert_host_staged",
            "Bytes of expert reads kept in host memory for the GPU to read in place (CUDA managed memory advised host-preferred and GPU-mapped, so neither side's copy migrates its pages); 0 on the CPU and on Apple silicon's shared memory",
            Unit::Bytes,
            self.host_staged_bytes.clone(),
        );
        r.register(
            "expert_host_syncs",
            "Router read-backs to the host (one per speculative decode step, or one per streamed MoE layer and step without speculation; none once every layer holds every expert)",
            self.host_syncs.clone(),
        );
        r.register(
            "expert_speculative_steps",
            "Decode steps that ran on the experts the slots held, their routers read back once at the end",
            self.speculative_steps.clone(),
        );
        r.register(
            "expert_speculative_passes",
            "Passes of speculative decode steps over their layers (a step that lacked an expert runs again from that layer, its missing experts installed first)",
            self.speculative_passes.clone(),
        );
        r.register(
            "expert_replayed_steps",
            "Speculative decode steps that found a missing expert and ran again from its layer",
            self.replayed_steps.clone(),
        );
        r.register(
            "expert_prefetch_issued",
            "Experts read before their layer's router ran (the next layer's in a wide prefill chunk, a speculative step's misses before it runs again, --expert-prefetch guesses)",
            self.prefetch_issued.clone(),
        );
        r.register("expert_prefetch_used", "Experts read ahead that the layer then used (the rest were read in vain)", self.prefetch_used.clone());
        r.register_with_unit("expert_cache_resident", "Bytes of experts held in the slot pools", Unit::Bytes, self.resident_bytes.clone());
        r.register_with_unit("expert_cache_capacity", "Bytes of the slot pools (the cache budget in force)", Unit::Bytes, self.capacity_bytes.clone());
        r.register("expert_io_mode", "How expert reads reach the disk (1 on the mode in force)", self.io_mode.clone());
    }

    pub(super) fn set_io_mode(&self, mode: &'static str) {
        if self.mode.set(mode).is_ok() {
            self.io_mode.get_or_create(&ModeLabels { mode }).set(1);
        }
    }

    pub(crate) fn record_lookup(&self, layer: u32, hits: u64, misses: u64) {
        self.hits.get_or_create(&LayerLabels { layer }).inc_by(hits);
        self.misses.get_or_create(&LayerLabels { layer }).inc_by(misses);
        self.hits_all.inc_by(hits);
        self.misses_all.inc_by(misses);
    }

    pub(crate) fn record_stall(&self, seconds: f64) {
        add_seconds(&self.stall_seconds, seconds);
    }

    pub(crate) fn record_host_sync(&self) {
        self.host_syncs.inc();
    }

    pub(crate) fn record_router_wait(&self, seconds: f64) {
        add_seconds(&self.router_wait_seconds, seconds);
    }

    pub(crate) fn record_prefetch_issued(&self, experts: u64) {
        self.prefetch_issued.inc_by(experts);
    }

    /// A speculative pass begins: `pass` 1 begins a step, pass 2 a step's
    /// first run again.
    pub(crate) fn record_speculative_pass(&self, pass: u64) {
        self.speculative_passes.inc();
        if pass == 1 {
            self.speculative_steps.inc();
        } else if pass == 2 {
            self.replayed_steps.inc();
        }
    }

    /// A speculative step's first pass lacked an expert where no pass can
    /// hold them all: it runs again per layer from there.
    pub(crate) fn record_replay_per_layer(&self) {
        self.replayed_steps.inc();
    }

    pub(crate) fn record_prefetch_used(&self, experts: u64) {
        self.prefetch_used.inc_by(experts);
    }

    pub(crate) fn add_resident(&self, bytes: i64) {
        self.resident_bytes.inc_by(bytes);
    }

    pub(crate) fn add_capacity(&self, bytes: i64) {
        self.capacity_bytes.inc_by(bytes);
    }

    pub fn failed_read_bytes(&self) -> u64 {
        self.failed_bytes.get()
    }

    pub fn bytes_read(&self) -> u64 {
        self.bytes_read.get()
    }

    pub fn disk_bytes(&self) -> u64 {
        self.disk_bytes.get()
    }

    pub fn misses(&self) -> u64 {
        self.misses_all.get()
    }

    pub fn hits(&self) -> u64 {
        self.hits_all.get()
    }

    pub fn host_syncs(&self) -> u64 {
        self.host_syncs.get()
    }

    pub fn speculative_steps(&self) -> u64 {
        self.speculative_steps.get()
    }

    pub fn speculative_passes(&self) -> u64 {
        self.speculative_passes.get()
    }

    pub fn replayed_steps(&self) -> u64 {
        self.replayed_steps.get()
    }

    pub fn prefetch_issued(&self) -> u64 {
        self.prefetch_issued.get()
    }

    pub fn prefetch_used(&self) -> u64 {
        self.prefetch_used.get()
    }

    /// The /health section.
    pub fn summary(&self) -> Value {
        let (hits, misses) = (self.hits_all.get(), self.misses_all.get());
        json!({
            "io_mode": self.mode.get().copied(),
            "bytes_read": self.bytes_read.get(),
            "failed_read_bytes": self.failed_bytes.get(),
            "disk_bytes_read": self.disk_bytes.get(),
            "os_read_bytes": os_read_bytes(),
            "reads": self.reads.get(),
            "hits": hits,
            "misses": misses,
            "hit_rate": (hits + misses > 0).then(|| hits as f64 / (hits + misses) as f64),
            "stall_seconds": self.stall_seconds.get(),
            "read_call_seconds": self.read_call_seconds.get(),
            "array_seconds": self.array_seconds.get(),
            "router_wait_seconds": self.router_wait_seconds.get(),
            "host_staged_bytes": self.host_staged_bytes.get(),
            "host_syncs": self.host_syncs.get(),
            "speculative_steps": self.speculative_steps.get(),
            "speculative_passes": self.speculative_passes.get(),
            "replayed_steps": self.replayed_steps.get(),
            "prefetch_issued": self.prefetch_issued.get(),
            "prefetch_used": self.prefetch_used.get(),
            "resident_bytes": self.resident_bytes.get(),
            "capacity_bytes": self.capacity_bytes.get(),
        })
    }
}

pub(super) fn add_seconds(counter: &Counter<f64, AtomicU64>, seconds: f64) {
    if seconds.is_finite() && seconds >= 0.0 {
        counter.inc_by(seconds);
    }
}

/// This process's `read_bytes` from `/proc/self/io`: bytes the kernel fetched
/// from storage for it (page-cache hits not included). `None` off Linux.
pub fn os_read_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/io").ok()?;
    text.lines().find_map(|l| l.strip_prefix("read_bytes:")).and_then(|v| v.trim().parse().ok())
}
