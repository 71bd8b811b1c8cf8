//! The OpenAI-compatible HTTP API (actix-web). Handlers validate, tokenize and
//! hand requests to the engine thread over a channel; they never touch MLX.

mod chat;
mod completions;
pub mod error;
mod generation;
mod params;

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer, ResponseError};
use mlx_rs_safe::memory;
use serde_json::{json, Value};

use crate::cli::ServeArgs;
use crate::engine::group::KvQuantization;
use crate::engine::{EngineConfig, EngineHandle, EngineStats};
use crate::error::{Error, Result};
use crate::metrics::{self, Metrics};
use crate::system_info::SystemInfo;
use crate::tokenizer::tool_calls::ToolCallFormat;
use crate::tokenizer::Tokenizer;
use crate::{hub, models};
use error::ApiError;

/// What every handler shares.
pub struct AppState {
    pub engine: EngineHandle,
    pub tokenizer: Arc<Tokenizer>,
    pub metrics: Arc<Metrics>,
    /// The name clients use for the model (`--model` as given).
    pub model_id: String,
    pub model_dir: PathBuf,
    /// Prompt + completion tokens the model takes (config.json), if stated.
    pub context_length: Option<usize>,
    /// Token ids below this are valid.
    pub vocab_size: usize,
    pub default_max_tokens: usize,
    pub max_body_bytes: usize,
    pub api_key: Option<String>,
    pub tool_format: Option<ToolCallFormat>,
    pub system: SystemInfo,
    pub config: EngineConfig,
    pub created: u64,
}

impl AppState {
    /// 401 unless the request carries the API key (when one is set).
    fn authorize(&self, req: &HttpRequest) -> std::result::Result<(), ApiError> {
        let Some(key) = &self.api_key else { return Ok(()) };
        let given = req
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        match given {
            Some(g) if g == key => Ok(()),
            Some(_) => Err(ApiError::unauthorized("Incorrect API key provided")),
            None => Err(ApiError::unauthorized("Missing API key: send it as `Authorization: Bearer <key>`")),
        }
    }

    /// 404 for a model this server does not serve (no model named is fine).
    pub fn check_model(&self, model: Option<&str>) -> std::result::Result<(), ApiError> {
        match model {
            None | Some("") | Some("default_model") => Ok(()),
            Some(m) if m == self.model_id || PathBuf::from(m) == self.model_dir => Ok(()),
            Some(m) => Err(ApiError::model_not_found(m, &self.model_id)),
        }
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

async fn chat_completions(req: HttpRequest, payload: web::Payload, state: web::Data<AppState>) -> HttpResponse {
    let start = Instant::now();
    let res = match state.authorize(&req) {
        Ok(()) => chat::handle(payload, &state).await,
        Err(e) => Err(e),
    };
    state.finish(&req, "/v1/chat/completions", start, res)
}

async fn completions(req: HttpRequest, payload: web::Payload, state: web::Data<AppState>) -> HttpResponse {
    let start = Instant::now();
    let res = match state.authorize(&req) {
        Ok(()) => completions::handle(payload, &state).await,
        Err(e) => Err(e),
    };
    state.finish(&req, "/v1/completions", start, res)
}

fn model_card(state: &AppState) -> Value {
    json!({"id": state.model_id, "object": "model", "created": state.created, "owned_by": "mlx-serve"})
}

async fn list_models(req: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    let start = Instant::now();
    let res = state.authorize(&req).map(|()| HttpResponse::Ok().json(json!({"object": "list", "data": [model_card(&state)]})));
    state.finish(&req, "/v1/models", start, res)
}

async fn get_model(req: HttpRequest, path: web::Path<String>, state: web::Data<AppState>) -> HttpResponse {
    let start = Instant::now();
    let res = state
        .authorize(&req)
        .and_then(|()| state.check_model(Some(path.as_str())))
        .map(|()| HttpResponse::Ok().json(model_card(&state)));
    state.finish(&req, "/v1/models/{model}", start, res)
}

async fn health(req: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    let start = Instant::now();
    let s = &state.engine.stats;
    let body = json!({
        "status": "ok",
        "model": state.model_id,
        "mlx_version": state.system.mlx_version,
        "backend": state.system.backend,
        "device": state.system.default_device,
        "device_name": state.system.device_name,
        "memory": {
            "active_bytes": s.active_memory.load(Ordering::Relaxed),
            "peak_bytes": s.peak_memory.load(Ordering::Relaxed),
            "cache_bytes": s.cache_memory.load(Ordering::Relaxed),
        },
        "engine": {
            "running": s.running.load(Ordering::Relaxed),
            "queued": state.engine.queued(),
            "max_concurrency": state.config.max_concurrency,
            "kv_cache_bytes": s.kv_bytes.load(Ordering::Relaxed),
            "prompt_cache_bytes": s.prompt_cache_bytes.load(Ordering::Relaxed),
        },
        "capabilities": {
            "chat_completions": state.tokenizer.has_chat_template(),
            "completions": true,
            "streaming": true,
            "logprobs": true,
            "tools": state.tool_format.map(ToolCallFormat::name),
            "continuous_batching": true,
            "prompt_cache": state.config.prompt_cache_bytes > 0,
            "kv_bits": state.config.kv_quant.map(|q| q.bits),
            "context_length": state.context_length,
        },
    });
    state.finish(&req, "/health", start, Ok(HttpResponse::Ok().json(body)))
}

async fn metrics_text(req: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    let start = Instant::now();
    let res = HttpResponse::Ok().content_type(metrics::CONTENT_TYPE).body(state.metrics.render());
    state.finish(&req, "/metrics", start, Ok(res))
}

async fn unknown_route(req: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    let start = Instant::now();
    let e = ApiError::not_found(format!("Unknown route: {} {}", req.method(), req.path()), "unknown_url");
    // One label for every unknown path: scanners must not grow the metrics.
    state.finish(&req, "unmatched", start, Err(e))
}

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/health", web::get().to(health))
        .route("/metrics", web::get().to(metrics_text))
        .route("/v1/models", web::get().to(list_models))
        .route("/v1/models/{model:.*}", web::get().to(get_model))
        .route("/v1/chat/completions", web::post().to(chat_completions))
        .route("/v1/completions", web::post().to(completions))
        .default_service(web::to(unknown_route));
}

fn init_logging(level: &str) -> Result<()> {
    let filter: log::LevelFilter = match level {
        "error" | "warn" | "info" | "debug" | "trace" | "off" => level.parse().unwrap_or(log::LevelFilter::Info),
        other => {
            return Err(Error::InvalidRequest(format!(
                "--log-level must be one of error, warn, info, debug (got {other:?})"
            )))
        }
    };
    // A second init (tests starting several servers in one process) is harmless.
    let _ = env_logger::Builder::new().filter_level(filter).format_target(false).try_init();
    Ok(())
}

/// config.json's context length: max_position_embeddings, where stated.
fn context_length(config: &Value) -> Option<usize> {
    let from = |c: &Value| c.get("max_position_embeddings").and_then(Value::as_u64).map(|v| v as usize);
    from(config).or_else(|| config.get("text_config").and_then(from))
}

/// `kill -USR1 PID` zeroes MLX's peak-memory counter, as writing 5 to /proc/PID/clear_refs does
/// for the RSS high-water mark, so a benchmark can read the peak of one phase from /health
/// or /metrics. MLX's reset takes the allocator's lock, so it is safe beside the engine thread.
async fn reset_peak_memory_on_sigusr1(stats: Arc<EngineStats>, metrics: Arc<Metrics>) {
    use tokio::signal::unix::{signal, SignalKind};
    let mut usr1 = match signal(SignalKind::user_defined1()) {
        Ok(s) => s,
        Err(e) => return log::warn!("SIGUSR1 (peak-memory reset) is not available: {e}"),
    };
    while usr1.recv().await.is_some() {
        match memory::reset_peak_memory().and_then(|()| memory::active_memory()) {
            Ok(active) => {
                // Until the engine's next turn publishes, both show what is live now.
                metrics.set_mlx_memory(active as i64, active as i64);
                stats.peak_memory.store(active, Ordering::Relaxed);
                log::info!("SIGUSR1: MLX peak memory reset");
            }
            Err(e) => log::warn!("SIGUSR1: cannot reset MLX peak memory: {e}"),
        }
    }
}

/// Loads the model and serves until SIGINT/SIGTERM.
pub fn serve(args: ServeArgs) -> Result<()> {
    init_logging(&args.log_level)?;
    if let Some(bits) = args.kv_bits {
        if ![2, 3, 4, 5, 6, 8].contains(&bits) {
            return Err(Error::InvalidRequest(format!("--kv-bits must be one of 2, 3, 4, 5, 6, 8; got {bits}")));
        }
    }
    if args.max_concurrency == 0 {
        return Err(Error::InvalidRequest("--max-concurrency must be at least 1".into()));
    }
    let dir = hub::resolve(&args.model, &hub::HubOptions::from_env())?;
    let template = match &args.chat_template {
        Some(path) => Some(std::fs::read_to_string(path).map_err(|e| Error::model_file(path, format!("cannot read the chat template: {e}")))?),
        None => None,
    };
    let tokenizer = Arc::new(Tokenizer::load(&dir, template.as_deref())?);
    let tool_format = chat::tool_format(args.tool_call_parser.as_deref(), &tokenizer)?;
    let config_path = dir.join("config.json");
    let config: Value = std::fs::read_to_string(&config_path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .ok_or_else(|| Error::model_file(&config_path, "missing or not valid JSON"))?;
    let tokenizer_vocab = tokenizer.inner().get_vocab_size(true);
    let vocab_size = match config.get("vocab_size").and_then(Value::as_u64) {
        Some(v) => tokenizer_vocab.min(v as usize),
        None => tokenizer_vocab,
    };
    let system = SystemInfo::collect()?;
    let engine_config = EngineConfig {
        prefill_size: args.prefill_size.max(1),
        max_concurrency: args.max_concurrency,
        max_queue: args.max_queue,
        prompt_cache_bytes: args.prompt_cache_bytes,
        kv_quant: args.kv_bits.map(|bits| KvQuantization { bits, group_size: args.kv_group_size, start: args.quantized_kv_start }),
    };
    let metrics = Arc::new(Metrics::new());
    log::info!("loading {} from {}", args.model, dir.display());
    let load_dir = dir.clone();
    let engine = EngineHandle::spawn(
        Box::new(move || models::load(&load_dir).map(|(m, _)| m)),
        tokenizer.clone(),
        engine_config.clone(),
        metrics.clone(),
    )?;
    let state = web::Data::new(AppState {
        engine,
        tokenizer,
        metrics,
        model_id: args.model.clone(),
        model_dir: dir,
        context_length: context_length(&config),
        vocab_size,
        default_max_tokens: args.max_tokens,
        max_body_bytes: args.max_body_bytes,
        api_key: args.api_key.clone().filter(|k| !k.is_empty()),
        tool_format,
        system,
        config: engine_config,
        created: generation::unix_now(),
    });
    let app_state = state.clone();
    let (stats, metrics) = (state.engine.stats.clone(), state.metrics.clone());
    let (host, port) = (args.host.clone(), args.port);
    let served = actix_web::rt::System::new().block_on(async move {
        actix_web::rt::spawn(reset_peak_memory_on_sigusr1(stats, metrics));
        let server = HttpServer::new(move || App::new().app_data(app_state.clone()).configure(routes))
            .bind((host.as_str(), port))
            .map_err(|e| Error::InvalidRequest(format!("cannot listen on {host}:{port}: {e}")))?
            .shutdown_timeout(10);
        for addr in server.addrs() {
            // Tests and scripts read this line to find a port chosen with --port 0.
            eprintln!("mlx-serve: listening on http://{addr}");
        }
        server.run().await.map_err(|e| Error::InvalidRequest(format!("server error: {e}")))
    });
    log::info!("shutting down");
    state.engine.shutdown();
    served
}
