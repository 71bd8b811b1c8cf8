//! The OpenAI-compatible HTTP API (actix-web). Handlers validate, tokenize and
//! hand requests to the engine thread over a channel; they never touch MLX.

mod anthropic;
pub mod auth;
mod chat;
pub use chat::tool_format;
mod completions;
pub mod cors;
pub mod error;
pub(crate) mod generation;
pub mod host_check;
mod messages;
pub mod model_names;
mod params;
pub mod prompt_limit;
pub mod response_store;
mod responses;
pub mod shutdown;
mod structured;
mod tokenize;
pub mod tokenize_pool;
mod web_page;

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_web::{web, HttpRequest, HttpResponse, ResponseError};
use serde_json::{json, Value};

use crate::engine::{EngineConfig, EngineHandle};
use crate::metrics::{self, Metrics};
use crate::system_info::SystemInfo;
use crate::tokenizer::tool_calls::ToolCallFormat;
use crate::tokenizer::Tokenizer;
use auth::{Access, ApiKey};
use error::{ApiError, ErrorStyle};
use host_check::AllowedHosts;
use model_names::ModelNames;
use prompt_limit::PromptLimit;
use shutdown::Shutdown;
use tokenize_pool::TokenizePool;

/// What every handler shares.
/// The server's sampling defaults (mlx_lm.server's --temp, --top-p, --top-k, --min-p).
#[derive(Debug, Clone, Copy)]
pub struct SamplingDefaults {
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: i32,
    pub min_p: f32,
}

pub struct AppState {
    pub engine: EngineHandle,
    pub tokenizer: Arc<Tokenizer>,
    pub metrics: Arc<Metrics>,
    /// The names clients use for the model.
    pub models: ModelNames,
    /// Prompt + completion tokens the model takes (config.json), if stated.
    pub context_length: Option<usize>,
    /// What the memory plan chose (/health shows it).
    pub memory_plan: crate::memory_plan::MemoryPlan,
    /// Token ids below this are valid.
    pub vocab_size: usize,
    /// What a prompt may hold, checked before tokenizing.
    pub prompt_limit: PromptLimit,
    pub default_max_tokens: usize,
    /// Sampling for requests that do not set it (--temp, --top-p, --top-k, --min-p).
    pub default_sampling: SamplingDefaults,
    pub max_body_bytes: usize,
    /// How long a client may take to send a request body.
    pub body_timeout: Duration,
    pub api_key: ApiKey,
    pub allowed_hosts: AllowedHosts,
    pub tokenize_pool: TokenizePool,
    pub shutdown: Shutdown,
    pub tool_format: Option<ToolCallFormat>,
    /// The model writes Harmony messages (gpt-oss): its output is split by channel.
    pub harmony: bool,
    /// Chat prompts mark where their system prompt ends, for the prompt cache
    /// to keep (the model has sliding-window layers).
    pub prompt_checkpoints: bool,
    pub system: SystemInfo,
    pub config: EngineConfig,
    pub kv_footprint: KvFootprint,
    /// Stored Responses API responses (`previous_response_id`, GET by id).
    pub responses: Arc<response_store::ResponseStore>,
    /// Compiles structured-output grammars against the model's vocabulary.
    pub grammars: Arc<crate::structured::Grammars>,
    /// With --stream-experts: the expert cache's counters.
    pub experts: Option<crate::experts::ExpertCounters>,
    /// The group the model is shared over, when it is (/health shows it).
    pub distributed: Option<Distributed>,
    pub created: u64,
}

/// How the model is shared over a distributed group: `mode` "tensor" or
/// "pipeline", over `ranks` processes (this one is rank 0).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Distributed {
    pub mode: &'static str,
    pub ranks: usize,
}

/// The KV cache's nominal bytes per token, as configured and at 16 bits.
#[derive(Debug, Clone, Copy)]
pub struct KvFootprint {
    pub bytes_per_token: f64,
    pub fp16_bytes_per_token: f64,
}

impl AppState {
    /// 404 for a model this server does not serve (no model named is fine).
    pub fn check_model(&self, model: Option<&str>) -> std::result::Result<(), ApiError> {
        self.models.check(model)
    }

    /// The response (or the error's), counted in the metrics and logged.
    fn finish(&self, req: &HttpRequest, endpoint: &str, start: Instant, res: std::result::Result<HttpResponse, ApiError>) -> HttpResponse {
        let res = match res {
            Ok(r) => r,
            Err(e) => {
                log::debug!("{endpoint}: {e}");
                e.error_response()
            }
        };
        let status = res.status().as_u16();
        self.metrics.record_request(endpoint, status);
        log::info!("{} {} {} {:.1} ms", req.method(), req.path(), status, start.elapsed().as_secs_f64() * 1e3);
        res
    }
}

/// A POST endpoint taking JSON: the API key and the Content-Type are checked,
/// then `handler` reads the body and answers.
/// Its errors are `style`'s JSON.
async fn json_post<'a, Fut>(
    req: &HttpRequest,
    payload: web::Payload,
    state: &'a AppState,
    (endpoint, style): (&str, ErrorStyle),
    handler: impl FnOnce(web::Payload, &'a AppState) -> Fut,
) -> HttpResponse
where
    Fut: std::future::Future<Output = std::result::Result<HttpResponse, ApiError>> + 'a,
{
    let start = Instant::now();
    let res = match state.api_key.require(req).and_then(|()| params::require_json(req)) {
        Ok(()) => handler(payload, state).await,
        Err(e) => Err(e),
    };
    state.finish(req, endpoint, start, res.map_err(|e| e.in_style(style)))
}

async fn chat_completions(req: HttpRequest, payload: web::Payload, state: web::Data<AppState>) -> HttpResponse {
    json_post(&req, payload, &state, ("/v1/chat/completions", ErrorStyle::OpenAi), chat::handle).await
}

async fn completions(req: HttpRequest, payload: web::Payload, state: web::Data<AppState>) -> HttpResponse {
    json_post(&req, payload, &state, ("/v1/completions", ErrorStyle::OpenAi), completions::handle).await
}

async fn tokenize_text(req: HttpRequest, payload: web::Payload, state: web::Data<AppState>) -> HttpResponse {
    json_post(&req, payload, &state, ("/tokenize", ErrorStyle::OpenAi), tokenize::tokenize).await
}

async fn detokenize_ids(req: HttpRequest, payload: web::Payload, state: web::Data<AppState>) -> HttpResponse {
    json_post(&req, payload, &state, ("/detokenize", ErrorStyle::OpenAi), tokenize::detokenize).await
}

async fn create_response(req: HttpRequest, payload: web::Payload, state: web::Data<AppState>) -> HttpResponse {
    json_post(&req, payload, &state, ("/v1/responses", ErrorStyle::OpenAi), responses::handle).await
}

async fn get_response(req: HttpRequest, path: web::Path<String>, state: web::Data<AppState>) -> HttpResponse {
    let start = Instant::now();
    let res = state.api_key.require(&req).and_then(|()| responses::retrieve(&state, path.as_str()));
    state.finish(&req, "/v1/responses/{id}", start, res)
}

async fn anthropic_messages(req: HttpRequest, payload: web::Payload, state: web::Data<AppState>) -> HttpResponse {
    json_post(&req, payload, &state, ("/v1/messages", ErrorStyle::Anthropic), anthropic::handle).await
}

async fn anthropic_count_tokens(req: HttpRequest, payload: web::Payload, state: web::Data<AppState>) -> HttpResponse {
    json_post(&req, payload, &state, ("/v1/messages/count_tokens", ErrorStyle::Anthropic), anthropic::count_tokens).await
}

fn model_card(state: &AppState, name: &str) -> Value {
    json!({"id": name, "object": "model", "created": state.created, "owned_by": "mlx-serve"})
}

/// Every name the model answers to, the served id first (as vLLM lists each
/// `--served-model-name`).
async fn list_models(req: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    let start = Instant::now();
    let res = state.api_key.require(&req).map(|()| {
        let data: Vec<Value> = state.models.names.iter().map(|n| model_card(&state, n)).collect();
        HttpResponse::Ok().json(json!({"object": "list", "data": data}))
    });
    state.finish(&req, "/v1/models", start, res)
}

async fn get_model(req: HttpRequest, path: web::Path<String>, state: web::Data<AppState>) -> HttpResponse {
    let start = Instant::now();
    let res = state
        .api_key
        .require(&req)
        .and_then(|()| state.check_model(Some(path.as_str())))
        .map(|()| HttpResponse::Ok().json(model_card(&state, path.as_str())));
    state.finish(&req, "/v1/models/{model}", start, res)
}

/// `GET /health`: with `--api-key`, a request without credentials gets only
/// `{"status": "ok"}` (a liveness probe); the details need the key.
async fn health(req: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    let start = Instant::now();
    let res = state.api_key.access(&req).map(|access| match access {
        Access::Granted => HttpResponse::Ok().json(health_details(&state)),
        Access::Anonymous => HttpResponse::Ok().json(json!({"status": "ok"})),
    });
    state.finish(&req, "/health", start, res)
}

fn health_details(state: &AppState) -> Value {
    let s = state.engine.stats.read();
    json!({
        "status": "ok",
        "model": state.models.id,
        "mlx_version": state.system.mlx_version,
        "backend": state.system.backend,
        "device": state.system.default_device,
        "device_name": state.system.device_name,
        "memory": {
            "active_bytes": s.active_memory,
            "peak_bytes": s.peak_memory,
            "cache_bytes": s.cache_memory,
        },
        "engine": {
            "running": s.running,
            "queued": state.engine.queued(),
            "max_concurrency": state.config.max_concurrency,
            // Prompt tokens a prefill chunk, and whole prompts a shared call.
            "prefill_size": state.config.prefill_size,
            "prompt_concurrency": state.config.prompt_concurrency,
            "kv_cache_bytes": s.kv_bytes,
            "kv_cache_tokens": s.kv_tokens,
            "prompt_cache_bytes": s.prompt_cache_bytes,
        },
        "kv_cache": {
            "bytes_per_token": state.kv_footprint.bytes_per_token,
            "fp16_bytes_per_token": state.kv_footprint.fp16_bytes_per_token,
            "ratio_to_fp16": state.kv_footprint.bytes_per_token / state.kv_footprint.fp16_bytes_per_token,
            // What the running sequences' caches hold per token they have seen
            // (allocation steps and sliding windows included).
            "held_bytes_per_token": (s.kv_tokens > 0).then(|| s.kv_bytes as f64 / s.kv_tokens as f64),
            // TurboQuant keeps each sequence's newest tokens at 16 bits too.
            "recent_tokens": state.config.kv_compression.and_then(|c| c.turbo_preset()).map(|_| crate::kv::turbo::RECENT),
        },
        "capabilities": {
            "chat_completions": true,
            // Without one, chats are a plain "USER: …" transcript (mlx_lm.server's).
            "chat_template": state.tokenizer.has_chat_template(),
            "completions": true,
            "streaming": true,
            "logprobs": true,
            "tools": state.tool_format.map(ToolCallFormat::name),
            "continuous_batching": true,
            "prompt_cache": state.config.prompt_cache_bytes > 0,
            "kv_bits": state.config.kv_compression.and_then(|c| c.affine_bits()),
            "turbo_kv": state.config.kv_compression.and_then(|c| c.turbo_preset()).map(|p| p.name()),
            "context_length": state.context_length,
            "stream_experts": state.experts.is_some(),
        },
        "experts": state.experts.as_ref().map(|e| e.summary()),
        "distributed": state.distributed,
        "memory_plan": state.memory_plan,
    })
}

async fn metrics_text(req: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    let start = Instant::now();
    let res = state.api_key.require(&req).map(|()| {
        state.metrics.observe_engine(&state.engine.stats.read(), state.engine.queued());
        let kernels = mlx_rs_safe::kernels::kernel_cache_stats();
        if kernels != Default::default() {
            state.metrics.observe_kernel_cache(&kernels);
        }
        HttpResponse::Ok().content_type(metrics::CONTENT_TYPE).body(state.metrics.render())
    });
    state.finish(&req, "/metrics", start, res)
}

async fn unknown_route(req: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    let start = Instant::now();
    let e = ApiError::not_found(format!("Unknown route: {} {}", req.method(), req.path()), "unknown_url");
    // One label for every unknown path: scanners must not grow the metrics.
    state.finish(&req, "unmatched", start, Err(e))
}

pub fn routes(cfg: &mut web::ServiceConfig) {
    // HEAD too, for link checkers and uptime probes (actix sends the headers only).
    cfg.route("/", web::get().to(web_page::index))
        .route("/", web::head().to(web_page::index))
        .route("/web/{file}", web::get().to(web_page::asset))
        .route("/health", web::get().to(health))
        .route("/metrics", web::get().to(metrics_text))
        .route("/v1/models", web::get().to(list_models))
        .route("/v1/models/{model:.*}", web::get().to(get_model))
        .route("/v1/chat/completions", web::post().to(chat_completions))
        // mlx_lm.server's alias, for clients whose base URL has no /v1.
        .route("/chat/completions", web::post().to(chat_completions))
        .route("/v1/completions", web::post().to(completions))
        .route("/tokenize", web::post().to(tokenize_text))
        .route("/detokenize", web::post().to(detokenize_ids))
        .route("/v1/responses", web::post().to(create_response))
        .route("/v1/responses/{id}", web::get().to(get_response))
        .route("/v1/messages", web::post().to(anthropic_messages))
        .route("/v1/messages/count_tokens", web::post().to(anthropic_count_tokens))
        .default_service(web::to(unknown_route));
}
