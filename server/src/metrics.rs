//! The server's Prometheus metrics, served by `GET /metrics`.
//!
//! Every feature we ship proves it acts with a metric (DESIGN.md), so this is the one place that
//! names them. `Metrics` is shared by the HTTP handler threads and the engine thread: every
//! method takes `&self` and the handles inside are atomics (counters, gauges) or small locks
//! (histograms, the labelled request family) owned by `prometheus-client`.
//!
//! `render` writes the OpenMetrics text format, which is what `prometheus-client` encodes: counter
//! samples end in `_total`, a `# UNIT` line names seconds/bytes, and the text ends with `# EOF`.
//! Serve it with [`CONTENT_TYPE`]; under plain `text/plain` a Prometheus server would read the
//! `# TYPE mlx_serve_requests counter` line as naming a different family from the
//! `mlx_serve_requests_total` samples.

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};
use std::sync::atomic::AtomicU64;

use crate::engine::EngineSnapshot;

/// The `Content-Type` of [`Metrics::render`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Labels of `mlx_serve_kv_compressions_total`, `mlx_serve_engine_seconds_total`
/// and `mlx_serve_decode_host_seconds_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabels {
    phase: &'static str,
}

/// Labels of `mlx_serve_grammar_mask_rows_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MaskSourceLabels {
    source: &'static str,
}

/// Labels of `mlx_serve_kv_format_info`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FormatLabels {
    format: String,
}

/// Labels of `mlx_serve_cuda_kernels`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KernelSourceLabels {
    source: &'static str,
}

/// Labels of `mlx_serve_requests_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    endpoint: String,
    status: u16,
}

/// All server metrics, registered once under the `mlx_serve_` prefix.
#[derive(Debug)]
pub struct Metrics {
    /// Holds clones of the handles below (they share their values through an `Arc`);
    /// only `render` reads it, so it needs no lock of its own.
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    prompt_tokens: Counter,
    generated_tokens: Counter,
    time_to_first_token: Histogram,
    inter_token: Histogram,
    running_sequences: Gauge,
    queued_requests: Gauge,
    kv_cache_bytes: Gauge,
    kv_cache_tokens: Gauge,
    kv_format: Family<FormatLabels, Gauge>,
    cuda_kernels: Family<KernelSourceLabels, Gauge>,
    cuda_kernels_direct: Gauge,
    kv_bytes_per_token: Gauge<f64, AtomicU64>,
    kv_compressions: Family<PhaseLabels, Counter>,
    prompt_cache_bytes: Gauge,
    mlx_active_bytes: Gauge,
    mlx_peak_bytes: Gauge,
    prompt_cache_hits: Counter,
    prompt_cache_misses: Counter,
    prompt_cache_tokens: Counter,
    cancelled: Counter,
    decode_steps: Counter,
    decode_rows: Counter,
    prefill_calls: Counter,
    prefill_prompts: Counter,
    grammar_masks: Counter,
    grammar_mask_seconds: Counter<f64, AtomicU64>,
    grammar_mask_rows: Family<MaskSourceLabels, Counter>,
    engine_seconds: Family<PhaseLabels, Counter<f64, AtomicU64>>,
    decode_host_seconds: Family<PhaseLabels, Counter<f64, AtomicU64>>,
    group_turns: Counter,
    group_turn_bytes: Counter,
}

impl Metrics {
    /// Every metric at zero, registered under the `mlx_serve_` prefix.
    pub fn new() -> Metrics {
        // 1 ms doubling to 65.5 s: a short prompt on a warm cache up to a long prefill queued
        // behind others, with about 2x resolution everywhere in between.
        let time_to_first_token = Histogram::new(exponential_buckets(0.001, 2.0, 17));
        // 0.1 ms doubling to 6.55 s: a tiny model's decode step up to a stall behind a
        // large prefill chunk.
        let inter_token = Histogram::new(exponential_buckets(0.0001, 2.0, 17));

        let metrics = Metrics {
            registry: Registry::with_prefix("mlx_serve"),
            requests: Family::default(),
            prompt_tokens: Counter::default(),
            generated_tokens: Counter::default(),
            time_to_first_token,
            inter_token,
            running_sequences: Gauge::default(),
            queued_requests: Gauge::default(),
            kv_cache_bytes: Gauge::default(),
            kv_cache_tokens: Gauge::default(),
            kv_format: Family::default(),
            cuda_kernels: Family::default(),
            cuda_kernels_direct: Gauge::default(),
            kv_bytes_per_token: Gauge::default(),
            kv_compressions: Family::default(),
            prompt_cache_bytes: Gauge::default(),
            mlx_active_bytes: Gauge::default(),
            mlx_peak_bytes: Gauge::default(),
            prompt_cache_hits: Counter::default(),
            prompt_cache_misses: Counter::default(),
            prompt_cache_tokens: Counter::default(),
            cancelled: Counter::default(),
            decode_steps: Counter::default(),
            decode_rows: Counter::default(),
            prefill_calls: Counter::default(),
            prefill_prompts: Counter::default(),
            grammar_masks: Counter::default(),
            grammar_mask_seconds: Counter::default(),
            grammar_mask_rows: Family::default(),
            engine_seconds: Family::default(),
            decode_host_seconds: Family::default(),
            group_turns: Counter::default(),
            group_turn_bytes: Counter::default(),
        };
        metrics.registered()
    }

    /// Registers every handle. The encoder appends `_total` to counters and the unit to
    /// `register_with_unit` names, so the names here carry neither.
    fn registered(mut self) -> Metrics {
        let r = &mut self.registry;
        r.register(
            "requests",
            "Finished HTTP requests by endpoint and status code",
            self.requests.clone(),
        );
        r.register(
            "prompt_tokens",
            "Prompt tokens received",
            self.prompt_tokens.clone(),
        );
        r.register(
            "generated_tokens",
            "Tokens generated",
            self.generated_tokens.clone(),
        );
        r.register_with_unit(
            "time_to_first_token",
            "Time from request arrival to its first generated token",
            Unit::Seconds,
            self.time_to_first_token.clone(),
        );
        r.register_with_unit(
            "inter_token",
            "Time between two consecutive tokens of one sequence",
            Unit::Seconds,
            self.inter_token.clone(),
        );
        r.register(
            "running_sequences",
            "Sequences in the running batch",
            self.running_sequences.clone(),
        );
        r.register(
            "queued_requests",
            "Requests waiting to be admitted",
            self.queued_requests.clone(),
        );
        r.register_with_unit(
            "kv_cache",
            "Memory held by the KV caches of running sequences",
            Unit::Bytes,
            self.kv_cache_bytes.clone(),
        );
        r.register(
            "kv_cache_tokens",
            "Tokens held by the KV caches of running sequences (bytes / tokens = what a token costs)",
            self.kv_cache_tokens.clone(),
        );
        r.register(
            "kv_format",
            "The KV cache's format (16-bit, --kv-bits affine or a --turbo-kv preset): 1 for the one in use",
            self.kv_format.clone(),
        );
        r.register(
            "cuda_kernels",
            "CUDA custom kernel instances this process got, by source: loaded from MLX's kernel cache (compiled by an earlier process), compiled and kept there, or compiled by MLX alone (the cache could not keep them; the log says why)",
            self.cuda_kernels.clone(),
        );
        r.register(
            "cuda_kernels_direct",
            "CUDA custom kernel instances called directly after their first call (MLX's precompiled-kernel path: no source text rebuilt and hashed per call)",
            self.cuda_kernels_direct.clone(),
        );
        r.register(
            "kv_bytes_per_token",
            "Nominal KV cache bytes per token of the format in use (all layers)",
            self.kv_bytes_per_token.clone(),
        );
        r.register(
            "kv_compressions",
            "Sequences whose KV cache was compressed (--kv-bits, --turbo-kv), by when: during prefill (past the threshold) or when decoding started",
            self.kv_compressions.clone(),
        );
        r.register_with_unit(
            "prompt_cache",
            "Memory held by the prompt cache",
            Unit::Bytes,
            self.prompt_cache_bytes.clone(),
        );
        r.register_with_unit(
            "mlx_active_memory",
            "Memory held by live MLX arrays (weights, caches, temporaries)",
            Unit::Bytes,
            self.mlx_active_bytes.clone(),
        );
        r.register_with_unit(
            "mlx_peak_memory",
            "Most MLX memory held at once since start or since SIGUSR1 reset it",
            Unit::Bytes,
            self.mlx_peak_bytes.clone(),
        );
        r.register(
            "prompt_cache_hits",
            "Prompt cache lookups that reused at least one token",
            self.prompt_cache_hits.clone(),
        );
        r.register(
            "prompt_cache_misses",
            "Prompt cache lookups that reused nothing",
            self.prompt_cache_misses.clone(),
        );
        r.register(
            "prompt_cache_tokens",
            "Prompt tokens reused from the prompt cache instead of prefilled",
            self.prompt_cache_tokens.clone(),
        );
        r.register(
            "cancelled",
            "Sequences ended early because their client went away",
            self.cancelled.clone(),
        );
        r.register(
            "distributed_turns",
            "Turns rank 0 sent the other ranks of its distributed group, one before each engine step and one each idle second",
            self.group_turns.clone(),
        );
        r.register(
            "distributed_turn_bytes",
            "Bytes of those turns: the requests that arrived and those cancelled",
            self.group_turn_bytes.clone(),
        );
        r.register(
            "decode_steps",
            "Decode steps run (one model call each, for a whole batch)",
            self.decode_steps.clone(),
        );
        r.register(
            "decode_rows",
            "Sequence rows decoded, summed over steps (rows / steps = mean batch size)",
            self.decode_rows.clone(),
        );
        r.register(
            "prefill_calls",
            "Model calls that prefilled prompt tokens (one chunk of one prompt, or several whole prompts together)",
            self.prefill_calls.clone(),
        );
        r.register(
            "prefill_prompts",
            "Prompts (or chunks of one) those calls prefilled, summed (prompts / calls = mean prompts a call)",
            self.prefill_prompts.clone(),
        );
        r.register(
            "grammar_masks",
            "Decode steps whose logits were masked by a request's grammar (structured output, forced tool calls)",
            self.grammar_masks.clone(),
        );
        r.register_with_unit(
            "grammar_mask",
            "Host time computing grammar masks, while the steps' model calls ran",
            Unit::Seconds,
            self.grammar_mask_seconds.clone(),
        );
        r.register(
            "grammar_mask_rows",
            "Mask rows of constrained steps by how they reached the device: uploaded from the host, or reused (the same bits kept from an earlier step)",
            self.grammar_mask_rows.clone(),
        );
        r.register_with_unit(
            "engine",
            "Engine thread time by part of its turns: waiting, once woken at idle, for requests sent together that are still on their way (read and tokenized), admitting requests, decode steps (building and waiting for the batched model call and its sampling), handing the steps' tokens to their requests (detokenizing, stop strings, log-probabilities, streaming), joining prefilled sequences to the batch, prefilling prompts. What the wall clock has beyond their sum, the engine waited for work",
            Unit::Seconds,
            self.engine_seconds.clone(),
        );
        r.register_with_unit(
            "decode_host",
            "Decode steps' host time by what the engine thread did: building the steps' graphs (model call and sampling), launching them (MLX encoding and submitting their kernels), waiting for their tokens. With steps pipelined, the wait is the device's time beyond the host's: near zero where the host bounds the step",
            Unit::Seconds,
            self.decode_host_seconds.clone(),
        );
        self
    }

    /// One finished HTTP request: endpoint path label like "/v1/chat/completions", status code
    /// label "200".
    ///
    /// Each distinct endpoint is a series kept forever, so pass the matched route, not the raw
    /// request path (a scanner's random 404 paths would otherwise grow the series without bound).
    pub fn record_request(&self, endpoint: &str, status: u16) {
        let labels = RequestLabels {
            endpoint: endpoint.to_owned(),
            status,
        };
        self.requests.get_or_create(&labels).inc();
    }

    /// Prompt tokens of one admitted request.
    pub fn add_prompt_tokens(&self, n: u64) {
        self.prompt_tokens.inc_by(n);
    }

    /// Tokens sampled (one per sequence per decode step, or a batch of them at once).
    pub fn add_generated_tokens(&self, n: u64) {
        self.generated_tokens.inc_by(n);
    }

    /// Seconds from request arrival to its first generated token.
    pub fn observe_ttft(&self, seconds: f64) {
        observe_duration(&self.time_to_first_token, seconds);
    }

    /// Seconds between two consecutive tokens of one sequence.
    pub fn observe_inter_token(&self, seconds: f64) {
        observe_duration(&self.inter_token, seconds);
    }

    /// Sets the gauges from the engine's latest snapshot and the queue length,
    /// the figures /health reports too.
    pub fn observe_engine(&self, engine: &EngineSnapshot, queued: usize) {
        let gauge = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.running_sequences.set(gauge(engine.running));
        self.queued_requests.set(gauge(queued));
        self.kv_cache_bytes.set(gauge(engine.kv_bytes));
        self.kv_cache_tokens.set(gauge(engine.kv_tokens));
        self.prompt_cache_bytes.set(gauge(engine.prompt_cache_bytes));
        self.mlx_active_bytes.set(gauge(engine.active_memory));
        self.mlx_peak_bytes.set(gauge(engine.peak_memory));
    }

    /// How this process got its CUDA custom kernels so far (compile-once).
    pub fn observe_kernel_cache(&self, stats: &mlx_rs_safe::kernels::KernelCacheStats) {
        let gauge = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        for (source, n) in [("cache", stats.loaded), ("compiled_kept", stats.written), ("compiled_by_mlx", stats.failed)] {
            self.cuda_kernels.get_or_create(&KernelSourceLabels { source }).set(gauge(n));
        }
        self.cuda_kernels_direct.set(gauge(stats.direct));
    }

    /// The KV format in use and its nominal bytes per token (set once at start).
    pub fn set_kv_format(&self, format: &str, bytes_per_token: f64) {
        self.kv_format.get_or_create(&FormatLabels { format: format.to_owned() }).set(1);
        self.kv_bytes_per_token.set(bytes_per_token);
    }

    /// `n` sequences' caches were compressed in `phase` ("prefill" or "decode").
    pub fn record_kv_compressions(&self, phase: &'static str, n: u64) {
        if n > 0 {
            self.kv_compressions.get_or_create(&PhaseLabels { phase }).inc_by(n);
        }
    }

    /// A request looked up the prompt cache: reused `cached_tokens` (0 = miss).
    pub fn record_prompt_cache_lookup(&self, cached_tokens: u64) {
        if cached_tokens == 0 {
            self.prompt_cache_misses.inc();
        } else {
            self.prompt_cache_hits.inc();
            self.prompt_cache_tokens.inc_by(cached_tokens);
        }
    }

    /// Adds the expert-streaming metrics (`--stream-experts`).
    pub fn register_experts(&mut self, counters: &crate::experts::ExpertCounters) {
        counters.register(&mut self.registry);
    }

    /// One decode step (one model call) over `rows` sequences.
    pub fn record_decode_step(&self, rows: u64) {
        self.decode_steps.inc();
        self.decode_rows.inc_by(rows);
    }

    /// One model call that prefilled `prompts` prompts (or a chunk of one).
    pub fn record_prefill_call(&self, prompts: u64) {
        self.prefill_calls.inc();
        self.prefill_prompts.inc_by(prompts);
    }

    /// One decode step masked by grammars, whose masks took `seconds` on the host and
    /// whose rows were `uploaded` or `reused` on the device.
    pub fn record_grammar_masks(&self, seconds: f64, uploaded: u64, reused: u64) {
        self.grammar_masks.inc();
        self.grammar_mask_seconds.inc_by(seconds);
        self.grammar_mask_rows.get_or_create(&MaskSourceLabels { source: "uploaded" }).inc_by(uploaded);
        self.grammar_mask_rows.get_or_create(&MaskSourceLabels { source: "reused" }).inc_by(reused);
    }

    /// A decode step's host time: building, launching, waiting for its tokens.
    pub fn record_decode_host(&self, build: f64, launch: f64, wait: f64) {
        for (phase, seconds) in [("build", build), ("launch", launch), ("wait", wait)] {
            self.decode_host_seconds.get_or_create(&PhaseLabels { phase }).inc_by(seconds);
        }
    }

    /// The engine thread spent `seconds` in `part` of a turn ("gather",
    /// "admit", "decode", "tokens", "join" or "prefill").
    pub fn record_engine_time(&self, part: &'static str, seconds: f64) {
        self.engine_seconds.get_or_create(&PhaseLabels { phase: part }).inc_by(seconds);
    }

    /// A sequence ended early because its client went away.
    pub fn record_cancelled(&self) {
        self.cancelled.inc();
    }

    /// Rank 0 sent its group a turn of `bytes` bytes.
    pub fn record_group_turn(&self, bytes: u64) {
        self.group_turns.inc();
        self.group_turn_bytes.inc_by(bytes);
    }

    /// The OpenMetrics text exposition of every metric, ending with "# EOF\n".
    pub fn render(&self) -> String {
        let mut text = String::new();
        match encode(&mut text, &self.registry) {
            Ok(()) => text,
            // The encoder's only error is the writer's, and writing to a String cannot fail;
            // should that change, a scraper still gets a well-formed (empty) exposition.
            Err(_) => "# EOF\n".to_owned(),
        }
    }
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new()
    }
}

/// Durations come from `Instant`s and are finite and non-negative; anything else is a caller's
/// bug, and one NaN would turn the histogram's `_sum` into NaN for the server's whole life.
fn observe_duration(histogram: &Histogram, seconds: f64) {
    if seconds.is_finite() && seconds >= 0.0 {
        histogram.observe(seconds);
    }
}

/// The value of the first sample line of `text` (as `Metrics::render` writes it) whose name and
/// labels are exactly `name_with_labels`, e.g.
/// `mlx_serve_requests_total{endpoint="/v1/models",status="200"}` or
/// `mlx_serve_time_to_first_token_seconds_count`. `None` when no such line exists.
///
/// The name must be followed by the value's space, so `mlx_serve_requests_total` alone does not
/// match a labelled line, nor `mlx_serve_prompt_cache` the `mlx_serve_prompt_cache_bytes` one.
pub fn counter_value(text: &str, name_with_labels: &str) -> Option<f64> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            let rest = line.strip_prefix(name_with_labels)?.strip_prefix(' ')?;
            // A timestamp or an exemplar (" # {...}") may follow the value.
            rest.split(' ').next()?.parse().ok()
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Metrics>();
    }

    #[test]
    fn counters_render_the_sum_of_their_calls() {
        let m = Metrics::new();
        for n in [5, 7, 11] {
            m.add_prompt_tokens(n);
        }
        for _ in 0..4 {
            m.add_generated_tokens(1);
        }
        for _ in 0..3 {
            m.record_cancelled();
        }
        let text = m.render();
        assert_eq!(
            counter_value(&text, "mlx_serve_prompt_tokens_total"),
            Some(23.0)
        );
        assert_eq!(
            counter_value(&text, "mlx_serve_generated_tokens_total"),
            Some(4.0)
        );
        assert_eq!(counter_value(&text, "mlx_serve_cancelled_total"), Some(3.0));
        assert!(
            text.contains("\nmlx_serve_prompt_tokens_total 23\n"),
            "{text}"
        );
    }

    #[test]
    fn request_counter_renders_endpoint_and_status_labels() {
        let m = Metrics::new();
        m.record_request("/v1/models", 200);
        m.record_request("/v1/models", 200);
        m.record_request("/v1/chat/completions", 400);
        let text = m.render();
        assert!(
            text.contains("\nmlx_serve_requests_total{endpoint=\"/v1/models\",status=\"200\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "\nmlx_serve_requests_total{endpoint=\"/v1/chat/completions\",status=\"400\"} 1\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("# TYPE mlx_serve_requests counter\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "# HELP mlx_serve_requests Finished HTTP requests by endpoint and status code.\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn ttft_histogram_counts_sums_and_buckets_observations() {
        let m = Metrics::new();
        m.observe_ttft(0.25);
        m.observe_ttft(0.5);
        m.observe_ttft(100.0);
        let text = m.render();
        let ttft = "mlx_serve_time_to_first_token_seconds";
        assert_eq!(counter_value(&text, &format!("{ttft}_count")), Some(3.0));
        assert_eq!(counter_value(&text, &format!("{ttft}_sum")), Some(100.75));
        // Bounds are 0.001 * 2^i: 0.25 falls in le=0.256, 0.5 in le=0.512, 100 only in +Inf.
        assert_eq!(
            counter_value(&text, &format!("{ttft}_bucket{{le=\"0.128\"}}")),
            Some(0.0)
        );
        assert_eq!(
            counter_value(&text, &format!("{ttft}_bucket{{le=\"0.256\"}}")),
            Some(1.0)
        );
        assert_eq!(
            counter_value(&text, &format!("{ttft}_bucket{{le=\"0.512\"}}")),
            Some(2.0)
        );
        assert_eq!(
            counter_value(&text, &format!("{ttft}_bucket{{le=\"65.536\"}}")),
            Some(2.0)
        );
        assert_eq!(
            counter_value(&text, &format!("{ttft}_bucket{{le=\"+Inf\"}}")),
            Some(3.0)
        );
        assert!(text.contains(&format!("# UNIT {ttft} seconds\n")), "{text}");
    }

    #[test]
    fn inter_token_histogram_spans_a_tenth_of_a_millisecond_to_over_five_seconds() {
        let m = Metrics::new();
        m.observe_inter_token(0.00005);
        m.observe_inter_token(0.02);
        m.observe_inter_token(5.0);
        let text = m.render();
        let itl = "mlx_serve_inter_token_seconds";
        assert_eq!(counter_value(&text, &format!("{itl}_count")), Some(3.0));
        assert_eq!(counter_value(&text, &format!("{itl}_sum")), Some(5.02005));
        assert_eq!(
            counter_value(&text, &format!("{itl}_bucket{{le=\"0.0001\"}}")),
            Some(1.0)
        );
        assert_eq!(
            counter_value(&text, &format!("{itl}_bucket{{le=\"0.0256\"}}")),
            Some(2.0)
        );
        assert_eq!(
            counter_value(&text, &format!("{itl}_bucket{{le=\"6.5536\"}}")),
            Some(3.0)
        );
    }

    #[test]
    fn non_finite_or_negative_durations_are_not_observed() {
        let m = Metrics::new();
        m.observe_ttft(f64::NAN);
        m.observe_ttft(-1.0);
        m.observe_inter_token(f64::INFINITY);
        m.observe_ttft(0.5);
        let text = m.render();
        let ttft = "mlx_serve_time_to_first_token_seconds";
        assert_eq!(counter_value(&text, &format!("{ttft}_count")), Some(1.0));
        assert_eq!(counter_value(&text, &format!("{ttft}_sum")), Some(0.5));
        assert_eq!(
            counter_value(&text, "mlx_serve_inter_token_seconds_count"),
            Some(0.0)
        );
    }

    #[test]
    fn gauges_hold_the_last_engine_snapshot() {
        let m = Metrics::new();
        let first = EngineSnapshot { running: 3, kv_bytes: 1 << 20, prompt_cache_bytes: 7, ..Default::default() };
        m.observe_engine(&first, 9);
        // Beyond i32: KV caches of large models pass 4 GiB.
        let last = EngineSnapshot { running: 1, kv_bytes: 5_000_000_000, prompt_cache_bytes: 7, ..Default::default() };
        m.observe_engine(&last, 0);
        let text = m.render();
        assert_eq!(
            counter_value(&text, "mlx_serve_running_sequences"),
            Some(1.0)
        );
        assert_eq!(counter_value(&text, "mlx_serve_queued_requests"), Some(0.0));
        assert_eq!(counter_value(&text, "mlx_serve_kv_cache_bytes"), Some(5e9));
        assert_eq!(
            counter_value(&text, "mlx_serve_prompt_cache_bytes"),
            Some(7.0)
        );
        assert!(
            text.contains("\nmlx_serve_kv_cache_bytes 5000000000\n"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE mlx_serve_kv_cache_bytes gauge\n"),
            "{text}"
        );
    }

    #[test]
    fn cuda_kernels_are_counted_by_where_they_came_from() {
        let m = Metrics::new();
        let stats = mlx_rs_safe::kernels::KernelCacheStats { loaded: 7, written: 2, failed: 1, direct: 5, last_error: Some("x".into()) };
        m.observe_kernel_cache(&stats);
        let text = m.render();
        assert_eq!(counter_value(&text, "mlx_serve_cuda_kernels{source=\"cache\"}"), Some(7.0), "{text}");
        assert_eq!(counter_value(&text, "mlx_serve_cuda_kernels{source=\"compiled_kept\"}"), Some(2.0));
        assert_eq!(counter_value(&text, "mlx_serve_cuda_kernels{source=\"compiled_by_mlx\"}"), Some(1.0));
        assert_eq!(counter_value(&text, "mlx_serve_cuda_kernels_direct"), Some(5.0));
    }

    #[test]
    fn prompt_cache_lookups_split_into_hits_misses_and_reused_tokens() {
        let m = Metrics::new();
        m.record_prompt_cache_lookup(0);
        m.record_prompt_cache_lookup(100);
        m.record_prompt_cache_lookup(28);
        let text = m.render();
        assert_eq!(
            counter_value(&text, "mlx_serve_prompt_cache_hits_total"),
            Some(2.0)
        );
        assert_eq!(
            counter_value(&text, "mlx_serve_prompt_cache_misses_total"),
            Some(1.0)
        );
        assert_eq!(
            counter_value(&text, "mlx_serve_prompt_cache_tokens_total"),
            Some(128.0)
        );
    }

    #[test]
    fn counter_value_matches_whole_names_only() {
        let m = Metrics::new();
        m.record_request("/v1/models", 200);
        m.observe_engine(&EngineSnapshot { prompt_cache_bytes: 42, ..Default::default() }, 0);
        let text = m.render();
        let labelled = "mlx_serve_requests_total{endpoint=\"/v1/models\",status=\"200\"}";
        assert_eq!(counter_value(&text, labelled), Some(1.0));
        assert_eq!(counter_value(&text, "mlx_serve_requests_total"), None);
        assert_eq!(counter_value(&text, "mlx_serve_prompt_cache"), None);
        assert_eq!(counter_value(&text, "mlx_serve_no_such_metric_total"), None);
        assert_eq!(
            counter_value(
                &text,
                "mlx_serve_requests_total{endpoint=\"/v1/models\",status=\"500\"}"
            ),
            None
        );
        // HELP/TYPE/UNIT comments never count as samples.
        assert_eq!(counter_value(&text, "# TYPE"), None);
        assert_eq!(counter_value("", "mlx_serve_cancelled_total"), None);
    }

    #[test]
    fn concurrent_updates_from_eight_threads_add_up_exactly() {
        let m = Metrics::new();
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for _ in 0..1000 {
                        m.record_request("/v1/completions", 200);
                        m.add_generated_tokens(2);
                        m.record_prompt_cache_lookup(3);
                        m.observe_inter_token(0.5);
                    }
                });
            }
        });
        let text = m.render();
        let completions = "mlx_serve_requests_total{endpoint=\"/v1/completions\",status=\"200\"}";
        assert_eq!(counter_value(&text, completions), Some(8000.0));
        assert_eq!(
            counter_value(&text, "mlx_serve_generated_tokens_total"),
            Some(16000.0)
        );
        assert_eq!(
            counter_value(&text, "mlx_serve_prompt_cache_hits_total"),
            Some(8000.0)
        );
        assert_eq!(
            counter_value(&text, "mlx_serve_prompt_cache_tokens_total"),
            Some(24000.0)
        );
        assert_eq!(
            counter_value(&text, "mlx_serve_inter_token_seconds_count"),
            Some(8000.0)
        );
        // 0.5 is exact in binary, so the sum is exact whatever the order of additions.
        assert_eq!(
            counter_value(&text, "mlx_serve_inter_token_seconds_sum"),
            Some(4000.0)
        );
    }

    #[test]
    fn fresh_render_describes_every_metric_and_ends_with_eof() {
        let text = Metrics::default().render();
        assert!(text.ends_with("# EOF\n"), "{text}");
        // The encoder leaves out a labelled family with no series yet, so requests are
        // described from the first one recorded on (see the labels test).
        assert!(!text.contains("mlx_serve_requests"), "{text}");
        for family in [
            "mlx_serve_prompt_tokens",
            "mlx_serve_generated_tokens",
            "mlx_serve_time_to_first_token_seconds",
            "mlx_serve_inter_token_seconds",
            "mlx_serve_running_sequences",
            "mlx_serve_queued_requests",
            "mlx_serve_kv_cache_bytes",
            "mlx_serve_prompt_cache_bytes",
            "mlx_serve_prompt_cache_hits",
            "mlx_serve_prompt_cache_misses",
            "mlx_serve_prompt_cache_tokens",
            "mlx_serve_cancelled",
        ] {
            assert!(
                text.contains(&format!("# HELP {family} ")),
                "{family}: {text}"
            );
        }
        // Unlabelled series exist from the start, so a scraper sees 0 rather than no data.
        assert_eq!(counter_value(&text, "mlx_serve_cancelled_total"), Some(0.0));
        assert_eq!(
            counter_value(&text, "mlx_serve_running_sequences"),
            Some(0.0)
        );
    }
}
