//! The engine's figures after each turn, in one snapshot that /health and
//! /metrics both read, so HTTP handlers report them without touching MLX.

use std::sync::Mutex;

/// What the engine holds and MLX's memory, as of the engine's last turn.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineSnapshot {
    /// Sequences decoding, prefilling or about to join the batch.
    pub running: usize,
    /// Bytes of the running sequences' KV caches.
    pub kv_bytes: usize,
    /// Tokens the decoding sequences' caches hold (all they have seen).
    pub kv_tokens: usize,
    pub prompt_cache_bytes: usize,
    /// MLX's allocator: live now, most live at once, held for reuse.
    pub active_memory: usize,
    pub peak_memory: usize,
    pub cache_memory: usize,
}

/// The latest snapshot, shared between the engine thread and the handlers.
#[derive(Debug, Default)]
pub struct EngineStats {
    latest: Mutex<EngineSnapshot>,
}

impl EngineStats {
    pub fn publish(&self, snapshot: EngineSnapshot) {
        // A poisoned lock only means a reader panicked mid-copy; the value is plain data.
        *self.latest.lock().unwrap_or_else(|e| e.into_inner()) = snapshot;
    }

    pub fn read(&self) -> EngineSnapshot {
        *self.latest.lock().unwrap_or_else(|e| e.into_inner())
    }
}
