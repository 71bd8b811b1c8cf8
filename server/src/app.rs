//! `mlx-serve` (serve): resolves the model, starts the engine thread, and runs
//! the HTTP API until SIGINT/SIGTERM.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use actix_web::{web, App, HttpServer};
use serde_json::Value;

use crate::api::{self, generation, AppState, KvFootprint};
use crate::cli::ServeArgs;
use crate::engine::{EngineConfig, EngineHandle};
use crate::error::{Error, Result};
use crate::kv::{bytes_per_token, KvCompression};
use crate::metrics::Metrics;
use crate::system_info::SystemInfo;
use crate::tokenizer::Tokenizer;
use crate::{hub, models};

fn init_logging(level: &str) -> Result<()> {
    let filter: log::LevelFilter = match level {
        "error" | "warn" | "info" | "debug" | "trace" | "off" => level.parse().unwrap_or(log::LevelFilter::Info),
        other => return Err(Error::Config(format!("--log-level must be one of error, warn, info, debug (got {other:?})"))),
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
/// or /metrics. The engine thread does the reset (every MLX call happens there) and
/// publishes its stats at once, also when idle.
async fn reset_peak_memory_on_sigusr1(state: web::Data<AppState>) {
    use tokio::signal::unix::{signal, SignalKind};
    let mut usr1 = match signal(SignalKind::user_defined1()) {
        Ok(s) => s,
        Err(e) => return log::warn!("SIGUSR1 (peak-memory reset) is not available: {e}"),
    };
    while usr1.recv().await.is_some() {
        if state.engine.reset_peak_memory().is_err() {
            log::warn!("SIGUSR1: the engine has stopped");
        }
    }
}

/// The compression policy the flags ask for, checked.
fn kv_compression(args: &ServeArgs) -> Result<Option<KvCompression>> {
    if let Some(preset) = &args.turbo_kv {
        return KvCompression::turbo(preset, args.turbo_kv_prefill_threshold).map(Some);
    }
    args.kv_bits.map(|bits| KvCompression::affine(bits, args.kv_group_size, args.quantized_kv_start)).transpose()
}

/// The KV cache's settings as metrics (they do not change while serving).
fn state_metrics_kv(metrics: &Metrics, compression: Option<&KvCompression>, footprint: &KvFootprint) {
    let kind = match compression {
        None => "none".to_string(),
        Some(c) => match (c.turbo_preset(), c.affine_bits()) {
            (Some(p), _) => format!("turbo-{}", p.name()),
            (None, Some(bits)) => format!("affine-{bits}bit"),
            (None, None) => "none".to_string(),
        },
    };
    metrics.set_kv_format(&kind, footprint.bytes_per_token);
}

/// Loads the model and serves until SIGINT/SIGTERM.
pub fn serve(args: ServeArgs) -> Result<()> {
    init_logging(&args.log_level)?;
    let kv_compression = kv_compression(&args)?;
    if args.max_concurrency == 0 {
        return Err(Error::Config("--max-concurrency must be at least 1".into()));
    }
    let dir = hub::resolve(&args.model, &hub::HubOptions::from_env())?;
    let template = match &args.chat_template {
        Some(path) => Some(std::fs::read_to_string(path).map_err(|e| Error::model_file(path, format!("cannot read the chat template: {e}")))?),
        None => None,
    };
    let tokenizer = Arc::new(Tokenizer::load(&dir, template.as_deref())?);
    let tool_format = api::tool_format(args.tool_call_parser.as_deref(), &tokenizer)?;
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
        kv_compression,
    };
    let metrics = Arc::new(Metrics::new());
    log::info!("loading {} from {}", args.model, dir.display());
    let load_dir = dir.clone();
    let layout = Arc::new(Mutex::new(None));
    let loaded_layout = layout.clone();
    let engine = EngineHandle::spawn(
        Box::new(move || {
            let (model, _) = models::load(&load_dir)?;
            *loaded_layout.lock().unwrap_or_else(|e| e.into_inner()) = Some(model.kv_layout());
            Ok(model)
        }),
        tokenizer.clone(),
        engine_config,
        metrics.clone(),
    )?;
    // Set by the loader before the engine reported the model loaded.
    let layout = layout.lock().unwrap_or_else(|e| e.into_inner()).take().ok_or(Error::Internal("the model's KV layout"))?;
    // The policy in force: fitted to the model's head dimension.
    let kv_compression = engine.config.kv_compression;
    let kv_footprint = KvFootprint {
        bytes_per_token: bytes_per_token(kv_compression.as_ref(), &layout.kinds, layout.kv_heads, layout.head_dim),
        fp16_bytes_per_token: bytes_per_token(None, &layout.kinds, layout.kv_heads, layout.head_dim),
    };
    log::info!(
        "KV cache: {:.0} bytes per token ({:.2}x of 16-bit){}",
        kv_footprint.bytes_per_token,
        kv_footprint.bytes_per_token / kv_footprint.fp16_bytes_per_token,
        kv_compression.and_then(|c| c.turbo_preset()).map(|p| format!(", TurboQuant {}", p.name())).unwrap_or_default()
    );
    state_metrics_kv(&metrics, kv_compression.as_ref(), &kv_footprint);
    let state = web::Data::new(AppState {
        tokenizer,
        metrics,
        model_id: args.model.clone(),
        model_dir: PathBuf::from(&dir),
        context_length: context_length(&config),
        vocab_size,
        default_max_tokens: args.max_tokens,
        max_body_bytes: args.max_body_bytes,
        api_key: args.api_key.clone().filter(|k| !k.is_empty()),
        tool_format,
        system,
        config: engine.config.clone(),
        kv_footprint,
        created: generation::unix_now(),
        engine,
    });
    let app_state = state.clone();
    let (host, port) = (args.host.clone(), args.port);
    let served = actix_web::rt::System::new().block_on(async move {
        actix_web::rt::spawn(reset_peak_memory_on_sigusr1(app_state.clone()));
        let server = HttpServer::new(move || App::new().app_data(app_state.clone()).configure(api::routes))
            .bind((host.as_str(), port))
            .map_err(|e| Error::Startup(format!("cannot listen on {host}:{port}: {e}")))?
            .shutdown_timeout(10);
        for addr in server.addrs() {
            // Tests and scripts read this line to find a port chosen with --port 0.
            eprintln!("mlx-serve: listening on http://{addr}");
        }
        server.run().await.map_err(|e| Error::Startup(format!("server error: {e}")))
    });
    log::info!("shutting down");
    state.engine.shutdown();
    served
}
