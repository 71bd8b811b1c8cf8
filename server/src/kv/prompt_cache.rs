//! The prompt cache: the KV of finished sequences, kept so that a later request
//! starting with the same tokens (the next turn of a chat, a shared system
//! prompt) skips prefilling them. Bounded by bytes, least recently used first out.

use super::{KvSnapshot, ModelCache};
use crate::error::Result;

struct Entry {
    id: u64,
    tokens: Vec<u32>,
    kv: KvSnapshot,
    nbytes: usize,
    last_used: u64,
}

pub struct PromptCache {
    entries: Vec<Entry>,
    max_bytes: usize,
    bytes: usize,
    clock: u64,
    next_id: u64,
}

/// Caches holding a prefix of a prompt.
pub struct PromptCacheHit {
    pub cache: ModelCache,
    /// Prompt tokens already in `caches`.
    pub cached_tokens: usize,
    /// The entry they came from, when they are most of it (see
    /// [`PromptCache::insert`]); a hit on a shared template start is not.
    pub entry: Option<u64>,
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl PromptCache {
    pub fn new(max_bytes: usize) -> PromptCache {
        PromptCache { entries: Vec::new(), max_bytes, bytes: 0, clock: 0, next_id: 0 }
    }

    pub fn nbytes(&self) -> usize {
        self.bytes
    }

    /// A cache holding the longest cached prefix of `prompt`. At most all but
    /// the last prompt token come from the cache: the model must still run on
    /// at least one token to produce the next token's logits. An entry whose
    /// cache cannot be cut at any length (a rotating window that moved on)
    /// offers only the prefixes it can restore. A hit the caller would not
    /// `take` (by its tokens) is no hit: nothing is restored for it and its
    /// entry is not counted as used.
    pub fn lookup(&mut self, prompt: &[u32], take: impl Fn(usize) -> bool) -> Result<Option<PromptCacheHit>> {
        let limit = prompt.len().saturating_sub(1);
        let best = self
            .entries
            .iter_mut()
            .map(|e| (e.kv.servable(common_prefix(&e.tokens, prompt).min(limit) as i32) as usize, e))
            .max_by_key(|(n, e)| (*n, e.last_used));
        let Some((n, entry)) = best else { return Ok(None) };
        if n == 0 || !take(n) {
            return Ok(None);
        }
        self.clock += 1;
        entry.last_used = self.clock;
        let kv = entry.kv.prefix(n as i32)?;
        let source = (2 * n >= entry.tokens.len()).then_some(entry.id);
        Ok(Some(PromptCacheHit { cache: ModelCache::restore(&kv)?, cached_tokens: n, entry: source }))
    }

    /// Keeps `kv`, the KV of `tokens`. An entry that is a prefix of `tokens` is
    /// superseded, and so is `source`, the entry the sequence started from: the
    /// new one holds the prefix it was used for, so a conversation (or a document
    /// asked one question after another) keeps one entry, not one per turn, as
    /// in mlx-lm, whose lookup takes the entry out. If `tokens` is itself a
    /// prefix of an entry, nothing new is learnt. Both only where the longer
    /// entry can restore the shorter one's tokens: a sliding window that moved
    /// on cannot, so a checkpoint (a system prompt's KV) stays beside the turns
    /// that started from it. Least recently used entries go until the new one
    /// fits; one larger than the whole budget is not kept.
    pub fn insert(&mut self, tokens: Vec<u32>, kv: KvSnapshot, source: Option<u64>) -> Result<()> {
        if tokens.is_empty() || kv.len() as usize != tokens.len() {
            return Ok(());
        }
        self.clock += 1;
        let n = tokens.len();
        if let Some(e) = self.entries.iter_mut().find(|e| e.tokens.starts_with(&tokens) && e.kv.servable(n as i32) as usize == n) {
            e.last_used = self.clock;
            return Ok(());
        }
        let nbytes = kv.nbytes();
        if nbytes > self.max_bytes {
            return Ok(());
        }
        let mut freed = 0;
        self.entries.retain(|e| {
            let covered = kv.servable(e.tokens.len().min(n) as i32) as usize == e.tokens.len().min(n);
            let superseded = covered && (tokens.starts_with(&e.tokens) || Some(e.id) == source);
            if superseded {
                freed += e.nbytes;
            }
            !superseded
        });
        self.bytes -= freed;
        while self.bytes + nbytes > self.max_bytes {
            let Some(oldest) = self.entries.iter().enumerate().min_by_key(|(_, e)| e.last_used).map(|(i, _)| i) else {
                break;
            };
            self.bytes -= self.entries.swap_remove(oldest).nbytes;
        }
        // A copy: the rows may be slices of a batch buffer, which would
        // otherwise stay alive (and uncounted) as long as the entry.
        let kv = kv.detached()?;
        self.next_id += 1;
        self.entries.push(Entry { id: self.next_id, tokens, kv, nbytes, last_used: self.clock });
        self.bytes += nbytes;
        Ok(())
    }
}
