//! The Responses API's memory: each stored response's conversation (the chat
//! messages it saw and wrote, for `previous_response_id`) and its response
//! object (for `GET /v1/responses/{id}`). Bounded by count and bytes; the
//! oldest go first.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use serde_json::Value;

/// Responses kept at most.
const MAX_RESPONSES: usize = 1024;
/// Bytes of JSON kept at most (conversations grow turn by turn).
const MAX_BYTES: usize = 64 << 20;

#[derive(Debug, Clone)]
pub struct Stored {
    /// The conversation in chat form, `instructions` not included (they do
    /// not carry over to the next response).
    pub messages: Arc<Vec<Value>>,
    pub response: Arc<Value>,
}

#[derive(Default)]
struct Inner {
    by_id: HashMap<String, (Stored, usize)>,
    order: VecDeque<String>,
    bytes: usize,
}

#[derive(Default)]
pub struct ResponseStore {
    inner: Mutex<Inner>,
}

impl ResponseStore {
    pub fn get(&self, id: &str) -> Option<Stored> {
        self.lock().by_id.get(id).map(|(s, _)| s.clone())
    }

    pub fn put(&self, id: String, stored: Stored) {
        let size = stored.messages.iter().map(|m| m.to_string().len()).sum::<usize>() + stored.response.to_string().len();
        let mut inner = self.lock();
        if let Some((_, old)) = inner.by_id.insert(id.clone(), (stored, size)) {
            inner.bytes -= old;
            inner.order.retain(|k| k != &id);
        }
        inner.order.push_back(id);
        inner.bytes += size;
        while inner.order.len() > MAX_RESPONSES || (inner.bytes > MAX_BYTES && inner.order.len() > 1) {
            let Some(oldest) = inner.order.pop_front() else { break };
            if let Some((_, n)) = inner.by_id.remove(&oldest) {
                inner.bytes -= n;
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn stored(n: usize) -> Stored {
        Stored { messages: Arc::new(vec![json!({"role": "user", "content": "x".repeat(n)})]), response: Arc::new(json!({})) }
    }

    #[test]
    fn the_oldest_responses_go_first_past_the_count_or_the_bytes() {
        let store = ResponseStore::default();
        for i in 0..MAX_RESPONSES + 5 {
            store.put(format!("r{i}"), stored(10));
        }
        assert!(store.get("r4").is_none() && store.get("r5").is_some());
        store.put("big".into(), stored(MAX_BYTES / 2));
        store.put("bigger".into(), stored(MAX_BYTES / 2));
        assert!(store.get("big").is_none() && store.get("bigger").is_some(), "the byte bound evicts the oldest");
        assert!(store.get(&format!("r{}", MAX_RESPONSES + 4)).is_none());
    }
}
