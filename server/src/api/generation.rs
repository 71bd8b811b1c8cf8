//! What both generation endpoints do with the engine: submit a prepared
//! request, then either collect its events into one answer or turn them into
//! an SSE stream, chunk by chunk as the endpoint formats them.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use actix_web::{web, HttpResponse};
use futures_util::stream;
use serde_json::{json, Value};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use super::error::{ApiError, SHUTTING_DOWN};
use super::AppState;
use crate::engine::{Arriving, Event, FinishReason, Generation, PromptProgress, Request, SubmitError, TokenLogprob, Usage};
use crate::tokenizer::Tokenizer;

/// Queues `params` with the engine; its events arrive on the returned
/// receiver. `arriving` (taken when the request began, see
/// [`crate::engine::EngineHandle::arriving`]) ends here, submitted or not.
pub fn submit(state: &AppState, params: Generation, arriving: Arriving) -> Result<UnboundedReceiver<Event>, ApiError> {
    let _arriving = arriving;
    if state.shutdown.is_cut() {
        state.shutdown.record_cut();
        return Err(ApiError::shutting_down());
    }
    if let Some(why) = state.engine.failure.get() {
        return Err(ApiError::engine_stopped(Some(why)));
    }
    let (tx, rx) = unbounded_channel();
    match state.engine.submit(Request { params, arrived: Instant::now(), events: tx }) {
        Ok(()) => Ok(rx),
        Err(SubmitError::QueueFull) => Err(ApiError::overloaded(state.engine.queued())),
        Err(SubmitError::Stopped) => Err(ApiError::engine_stopped(state.engine.failure.get())),
    }
}

/// Everything a request produced.
pub struct Collected {
    pub text: String,
    pub logprobs: Vec<TokenLogprob>,
    pub finish_reason: FinishReason,
    /// The stop string that ended it, if one did.
    pub stop_sequence: Option<String>,
    pub usage: Usage,
}

/// Waits for the whole generation; 503 if the shutdown cuts it first or the
/// engine stopped under it (its distributed group broke down). (A client
/// that disconnects drops this future, and with it the receiver: the engine
/// stops the sequence at its next step.)
pub async fn collect(mut rx: UnboundedReceiver<Event>, state: &AppState) -> Result<Collected, ApiError> {
    let shutdown = &state.shutdown;
    let failed = |message: &str| match state.engine.failure.get() {
        Some(why) => ApiError::engine_stopped(Some(why)),
        None => ApiError::internal(message),
    };
    let mut text = String::new();
    let mut logprobs = Vec::new();
    loop {
        let event = tokio::select! {
            event = rx.recv() => event,
            () = shutdown.cut() => {
                shutdown.record_cut();
                return Err(ApiError::shutting_down());
            }
            why = state.engine.failure.wait() => return Err(ApiError::engine_stopped(Some(why))),
        };
        match event {
            Some(Event::Token { text: t, logprob, .. }) => {
                text.push_str(&t);
                logprobs.extend(logprob);
            }
            Some(Event::Done { text: t, finish_reason, stop_sequence, usage }) => {
                text.push_str(&t);
                return Ok(Collected { text, logprobs, finish_reason, stop_sequence, usage });
            }
            Some(Event::Error(message)) => return Err(failed(&message)),
            // Asked for by streams only.
            Some(Event::Progress(_)) => {}
            None => return Err(failed("the engine dropped the request")),
        }
    }
}

/// Formats one endpoint's stream: each event becomes zero or more JSON chunks.
pub trait ChunkWriter: Unpin + 'static {
    /// Chunks sent before any token (the chat role).
    fn start(&mut self) -> Vec<Value>;
    fn write(&mut self, event: Event) -> Vec<Value>;
    /// The last chunks of a stream the shutdown cuts: a finish_reason
    /// (`shutdown::CUT_FINISH_REASON`) and the error `message`.
    fn cut(&mut self, message: &str) -> Vec<Value>;

    /// The bytes of `chunks` on the wire (`done`: the stream's last). OpenAI's
    /// form: `data: <chunk>` events and a final `data: [DONE]`.
    fn frame(chunks: &[Value], done: bool) -> web::Bytes
    where
        Self: Sized,
    {
        sse(chunks, done)
    }
}

enum Phase {
    Start,
    Running,
    Ended,
}

/// Anthropic's and the Responses API's framing: `event: <type>` before each
/// chunk's `data:`, and no `[DONE]`. A chunk without a `type` (the stream's
/// own failure, in OpenAI's error shape) goes out as `as_error` makes it.
pub fn named_events(chunks: &[Value], as_error: impl Fn(&str) -> Value) -> web::Bytes {
    let mut out = String::new();
    for c in chunks {
        let event = match c["type"].as_str() {
            Some(_) => c.clone(),
            None => as_error(c["error"]["message"].as_str().unwrap_or("the stream failed")),
        };
        out.push_str(&format!("event: {}\ndata: {}\n\n", event["type"].as_str().unwrap_or("error"), event));
    }
    web::Bytes::from(out)
}

fn sse(chunks: &[Value], done: bool) -> web::Bytes {
    let mut out = String::new();
    for c in chunks {
        out.push_str("data: ");
        out.push_str(&c.to_string());
        out.push_str("\n\n");
    }
    if done {
        out.push_str("data: [DONE]\n\n");
    }
    web::Bytes::from(out)
}

/// An SSE response fed by the engine's events. When the client goes away,
/// actix drops this stream and with it the receiver: the engine notices and
/// stops the sequence. When the shutdown cuts it, or the engine stops under
/// it (its distributed group broke down), it ends with the writer's cut
/// chunks, saying why, and `[DONE]`.
pub fn sse_response<W: ChunkWriter>(rx: UnboundedReceiver<Event>, writer: W, state: &AppState) -> HttpResponse {
    let (shutdown, failure) = (state.shutdown.clone(), state.engine.failure.clone());
    let body = stream::unfold((rx, writer, Phase::Start), move |(mut rx, mut writer, phase)| {
        let (shutdown, failure) = (shutdown.clone(), failure.clone());
        async move {
            match phase {
                Phase::Start => {
                    let chunks = writer.start();
                    Some((Ok::<_, actix_web::Error>(W::frame(&chunks, false)), (rx, writer, Phase::Running)))
                }
                Phase::Running => loop {
                    let event = tokio::select! {
                        event = rx.recv() => event,
                        () = shutdown.cut() => {
                            shutdown.record_cut();
                            let chunks = writer.cut(SHUTTING_DOWN);
                            return Some((Ok(W::frame(&chunks, true)), (rx, writer, Phase::Ended)));
                        }
                        why = failure.wait() => {
                            let chunks = writer.cut(&format!("the engine has stopped: {why}"));
                            return Some((Ok(W::frame(&chunks, true)), (rx, writer, Phase::Ended)));
                        }
                    };
                    let Some(event) = event else {
                        let err = json!({"error": {"message": "the engine dropped the request", "type": "server_error"}});
                        return Some((Ok(W::frame(&[err], true)), (rx, writer, Phase::Ended)));
                    };
                    let last = matches!(event, Event::Done { .. } | Event::Error(_));
                    let chunks = writer.write(event);
                    if last {
                        return Some((Ok(W::frame(&chunks, true)), (rx, writer, Phase::Ended)));
                    }
                    if !chunks.is_empty() {
                        return Some((Ok(W::frame(&chunks, false)), (rx, writer, Phase::Running)));
                    }
                },
                Phase::Ended => None,
            }
        }
    });
    HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header(("Cache-Control", "no-cache"))
        .insert_header(("X-Accel-Buffering", "no"))
        .streaming(body)
}

/// The error chunk of a stream that failed after it started.
pub fn error_chunk(message: &str) -> Value {
    json!({"error": {"message": message, "type": "server_error", "param": null, "code": null}})
}

/// `chunk` (a finish chunk) with the error of a stream cut by the shutdown.
pub fn with_cut_error(mut chunk: Value, message: &str) -> Value {
    chunk["error"] = json!({"message": message, "type": "server_error", "param": null, "code": "server_shutting_down"});
    chunk
}

/// A token as text, for log-probability reports.
pub fn token_text(tokenizer: &Tokenizer, id: u32) -> String {
    tokenizer.decode(&[id], false).unwrap_or_default()
}

/// llama-server's `prompt_progress` object, which OpenAI-style stream chunks
/// carry beside their (empty) choice.
pub fn progress_json(p: &PromptProgress) -> Value {
    json!({"total": p.total, "cache": p.cached, "processed": p.processed, "time_ms": p.elapsed_ms})
}

pub fn usage_json(u: &Usage) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    })
}

pub fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// A response id with the given prefix ("chatcmpl", "cmpl").
pub fn response_id(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    format!("{prefix}-{:08x}{:08x}", nanos, COUNTER.fetch_add(1, Ordering::Relaxed))
}

/// For the stream writers' tests.
#[cfg(test)]
pub(super) mod testing {
    use super::*;
    use crate::engine::{FinishReason, Usage};

    /// Output with reasoning, text and a Hermes tool call.
    pub const THINK_SAY_CALL: &str = "<think>plan</think>Sure.<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}}</tool_call>";

    /// Every event `writer` makes of `text` arriving a character per token,
    /// then the end (finish Stop, 9 tokens).
    pub fn feed_chars<W: ChunkWriter>(writer: &mut W, text: &str) -> Vec<Value> {
        let mut events = writer.start();
        for c in text.chars() {
            events.extend(writer.write(Event::Token { token: 0, text: c.to_string(), logprob: None }));
        }
        let usage = Usage { prompt_tokens: 7, completion_tokens: 9, cached_tokens: 0 };
        events.extend(writer.write(Event::Done { text: String::new(), finish_reason: FinishReason::Stop, stop_sequence: None, usage }));
        events
    }
}
