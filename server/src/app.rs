//! `mlx-serve` (serve): resolves the model, starts the engine thread, and runs
//! the HTTP API (`http_server`) until SIGINT/SIGTERM.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::web;
use mlx_rs_safe::distributed::Group;
use serde::Deserialize;

use crate::api::auth::ApiKey;
use crate::api::host_check::AllowedHosts;
use crate::api::prompt_limit::PromptLimit;
use crate::api::shutdown::Shutdown;
use crate::api::tokenize_pool::TokenizePool;
use crate::api::{self, generation, AppState, KvFootprint};
use crate::cli::ServeArgs;
use crate::engine::{follow, Engine, EngineConfig, EngineHandle};
use crate::error::{Error, Result};
use crate::experts::CacheBudget;
use crate::kv::{bytes_per_token, KvCompression};
use crate::memory_plan::{self, Machine, MemoryPlan, Wants};
use crate::metrics::Metrics;
use crate::system_info::SystemInfo;
use crate::tokenizer::Tokenizer;
use crate::models::ModelFiles;
use crate::{http_server, hub, models};

pub(crate) fn init_logging(level: &str) -> Result<()> {
    let filter: log::LevelFilter = match level {
        "error" | "warn" | "info" | "debug" | "trace" | "off" => level.parse().unwrap_or(log::LevelFilter::Info),
        other => return Err(Error::Config(format!("--log-level must be one of error, warn, info, debug, trace, off (got {other:?})"))),
    };
    // A second init (tests starting several servers in one process) is harmless.
    // Trace is this crate's own (the expert-streaming timeline); other crates
    // (the HTTP stack) stop at debug.
    let _ = env_logger::Builder::new().filter_level(filter.min(log::LevelFilter::Debug)).filter_module("mlx_serve", filter).format_target(false).try_init();
    Ok(())
}

/// What the server reads from config.json itself (the model reads the rest);
/// a field of the wrong type is an error that names it.
#[derive(Debug, Deserialize)]
struct ServingFields {
    max_position_embeddings: Option<usize>,
    vocab_size: Option<usize>,
    text_config: Option<TextFields>,
}

#[derive(Debug, Deserialize)]
struct TextFields {
    max_position_embeddings: Option<usize>,
}

impl ServingFields {
    /// The context length: max_position_embeddings, where stated.
    fn context_length(&self) -> Option<usize> {
        self.max_position_embeddings.or_else(|| self.text_config.as_ref()?.max_position_embeddings)
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

/// What the flags fix of the memory plan.
fn plan_wants(args: &ServeArgs, kv_compression: Option<KvCompression>) -> Result<Wants> {
    Ok(Wants {
        budget: args.memory_budget.as_deref().map(|b| CacheBudget::parse_for("--memory-budget", "of the memory there is", b)).transpose()?,
        gpu_layers: args.load.gpu_layers,
        stream_experts: args.load.stream_experts,
        expert_cache: args.load.expert_cache_bytes.as_deref().map(CacheBudget::parse).transpose()?,
        kv_compression,
        context: args.context_length,
        prompt_cache_bytes: args.prompt_cache_bytes.map(|b| b as u64),
        max_sequences: args.max_concurrency,
        prefill_size: args.load.prefill_size(args.prefill_size),
    })
}

/// The memory plan for what this process holds of the model `files` holds
/// (all of it, or its rank's share) on this machine.
fn plan_for(files: &ModelFiles, machine: &Machine, wants: &Wants, sharding: &models::Sharding) -> Result<MemoryPlan> {
    let fields: ServingFields = files.config().parse()?;
    memory_plan::plan(machine, &files.shape()?.share(sharding)?, fields.context_length(), wants)
}

/// `--chat-template`'s template: the file it names, or the text itself (as
/// mlx_lm.server takes it) when it names no file and reads as Jinja.
fn chat_template_text(value: &str) -> Result<String> {
    let path = std::path::Path::new(value);
    if path.is_file() {
        return std::fs::read_to_string(path).map_err(|e| Error::model_file(path, format!("cannot read the chat template: {e}")));
    }
    if value.contains("{%") || value.contains("{{") {
        return Ok(value.to_string());
    }
    Err(Error::model_file(path, "--chat-template names no file, and is not a Jinja template either"))
}

/// The distributed group this process was started in (MLX's environment, as
/// `mlx.launch` sets it), and how the model is split over it (`Whole` for a
/// process started alone).
fn join_group(args: &ServeArgs) -> Result<models::Sharding> {
    let backend = match args.distributed_backend.as_str() {
        "any" => None,
        b @ ("ring" | "nccl" | "jaccl" | "mpi") => Some(b),
        other => return Err(Error::Config(format!("--distributed-backend must be any, ring, nccl, jaccl or mpi (got {other:?})"))),
    };
    let tensor = match args.distributed.as_str() {
        // mlx_lm.server's --pipeline asks for pipeline mode.
        _ if args.mlx_lm.pipeline => false,
        "tensor" => true,
        "pipeline" => false,
        other => return Err(Error::Config(format!("--distributed must be tensor or pipeline (got {other:?})"))),
    };
    // None: auto, by what the backend can do.
    let transfer = match args.pipeline_transfer.as_str() {
        "auto" => None,
        "send" => Some(models::Transfer::Send),
        "gather" => Some(models::Transfer::Gather),
        other => return Err(Error::Config(format!("--pipeline-transfer must be auto, send or gather (got {other:?})"))),
    };
    // Started as a rank (or with a backend named): a group that cannot form
    // is an error, not a silent group of one.
    let strict = backend.is_some() || std::env::var_os("MLX_RANK").is_some();
    // MLX reads a missing hostfile as empty JSON; say which file it was.
    if let Some(hostfile) = std::env::var_os("MLX_HOSTFILE") {
        std::fs::metadata(&hostfile).map_err(|e| Error::Startup(format!("cannot read MLX_HOSTFILE {}: {e}", hostfile.to_string_lossy())))?;
    }
    let group = Group::init(backend, strict).map_err(|e| Error::Startup(format!("cannot join the distributed group: {e}")))?;
    if group.size() < 2 {
        return Ok(models::Sharding::Whole);
    }
    // The engine thread runs the collectives; it must not be MLX's main
    // thread, or a rank lost mid-collective could block it beyond the
    // watchdog's sight (see `claim_main_thread`).
    mlx_rs_safe::distributed::claim_main_thread()?;
    log::info!(
        "rank {} of {}: {} parallelism{}",
        group.rank(),
        group.size(),
        if tensor { "tensor" } else { "pipeline" },
        if group.rank() == 0 { ", serving HTTP" } else { ", following rank 0" }
    );
    if tensor {
        return Ok(models::Sharding::Tensor(group));
    }
    let transfer = match transfer {
        Some(models::Transfer::Gather) => models::Transfer::Gather,
        Some(models::Transfer::Send) | None if models::point_to_point_works(&group)? => models::Transfer::Send,
        Some(models::Transfer::Send) => {
            return Err(Error::Config(
                "--pipeline-transfer send: this distributed backend cannot send arrays between ranks; use gather or auto".into(),
            ))
        }
        None => models::Transfer::Gather,
    };
    log::info!("pipeline stages hand on by {}", if transfer == models::Transfer::Send { "send" } else { "all-gather" });
    Ok(models::Sharding::Pipeline(group, transfer))
}

/// `--plan`: prints the memory plan without reading the weights.
pub fn print_plan(args: &ServeArgs) -> Result<()> {
    init_logging(&args.log_level)?;
    let (model, _) = crate::cli::model_or_default(args.model.as_deref())?;
    let dir = hub::resolve(&model, &hub::HubOptions::from_env())?;
    let files = ModelFiles::open(&dir, args.load.options()?.quantize)?;
    let plan = plan_for(&files, &Machine::detect()?, &plan_wants(args, kv_compression(args)?)?, &models::Sharding::Whole)?;
    println!("{}", plan.describe());
    println!("{}", serde_json::to_string_pretty(&plan).map_err(|e| Error::Startup(e.to_string()))?);
    Ok(())
}

/// Loads the model and serves until SIGINT/SIGTERM.
pub fn serve(args: ServeArgs) -> Result<()> {
    if args.plan {
        return print_plan(&args);
    }
    init_logging(&args.log_level)?;
    // Freed MLX buffers go back to the system, so the process stays within
    // the memory plan (see map_blocks_from).
    mlx_rs_safe::process_heap::map_blocks_from(1 << 20);
    args.mlx_lm.check()?;
    let defaults = crate::engine::SamplingParams { temperature: args.temp, top_p: args.top_p, top_k: args.top_k, min_p: args.min_p, ..Default::default() };
    defaults.validate().map_err(|e| Error::Config(format!("the default sampling flags: {e}")))?;
    let wants = plan_wants(&args, kv_compression(&args)?)?;
    if args.max_concurrency == 0 {
        return Err(Error::Config("--max-concurrency must be at least 1".into()));
    }
    if args.prompt_concurrency == Some(0) {
        return Err(Error::Config("--prompt-concurrency must be at least 1".into()));
    }
    let (model, model_id) = crate::cli::model_or_default(args.model.as_deref())?;
    let dir = hub::resolve(&model, &hub::HubOptions::from_env())?;
    let template = args.chat_template.as_deref().map(chat_template_text).transpose()?;
    let mut tokenizer = Tokenizer::load(&dir, template.as_deref())?;
    tokenizer.set_default_template_kwargs(args.chat_template_args.clone());
    let tokenizer = Arc::new(tokenizer);
    let tool_format = api::tool_format(args.tool_call_parser.as_deref(), &tokenizer)?;
    let harmony = tokenizer.chat_template_source().is_some_and(crate::tokenizer::harmony::template_speaks_harmony);
    let system = SystemInfo::collect()?;
    let machine = Machine::detect()?;
    let mut load_options = args.load.options()?;
    load_options.sharding = join_group(&args)?;
    let group = load_options.sharding.group().cloned();
    let distributed = match &load_options.sharding {
        models::Sharding::Whole => None,
        models::Sharding::Tensor(g) => Some(api::Distributed { mode: "tensor", ranks: g.size() }),
        models::Sharding::Pipeline(g, _) => Some(api::Distributed { mode: "pipeline", ranks: g.size() }),
    };
    let mut metrics = Metrics::new();
    let expert_counters = load_options.experts.as_ref().map(|e| e.counters.clone());
    if let Some(c) = &expert_counters {
        metrics.register_experts(c);
    }
    let metrics = Arc::new(metrics);
    log::info!("loading {model_id} from {}", dir.display());
    let load_dir = dir.clone();
    let (prefill_size, max_concurrency, max_queue) = (args.load.prefill_size(args.prefill_size), args.max_concurrency, args.max_queue);
    let prompt_concurrency = args.prompt_concurrency.unwrap_or(if machine.backend == memory_plan::Backend::Cpu { 1 } else { 8 });
    // The loader plans the memory from the opened files, loads as planned,
    // and hands back what the server reads of the model: its KV layout, its
    // config and the plan.
    let loaded = Arc::new(Mutex::new(None));
    let handed_back = loaded.clone();
    let planning_group = group.clone();
    let mut load = move || -> Result<(Box<dyn models::LanguageModel>, EngineConfig)> {
        let files = ModelFiles::open(&load_dir, load_options.quantize)?;
        let plan = plan_for(&files, &machine, &wants, &load_options.sharding)?;
        // Every rank's engine runs the tightest of the ranks' plans (lockstep).
        let plan = match &planning_group {
            Some(g) => plan.agreed(g)?,
            None => plan,
        };
        log::info!("{}", plan.describe());
        // MLX frees its buffer cache rather than grow past the budget.
        mlx_rs_safe::memory::set_memory_limit(plan.mlx_memory_limit() as usize)?;
        crate::pacer::set_in_flight_limit(plan.prompt_products_bytes());
        load_options.placement = plan.gpu_layers.map(models::Placement::gpu_layers).unwrap_or_default();
        if let Some(e) = load_options.experts.as_mut() {
            e.budget = plan.expert_cache_bytes.map(CacheBudget::Bytes);
        }
        let model = files.load(&load_options)?;
        let config = EngineConfig {
            prefill_size,
            max_concurrency,
            prompt_concurrency,
            max_queue,
            prompt_cache_bytes: plan.prompt_cache_bytes as usize,
            kv_compression: plan.kv_compression,
            kv_tokens: plan.kv_tokens as usize,
            context: Some(plan.context as usize),
        };
        *handed_back.lock().unwrap_or_else(|e| e.into_inner()) = Some((model.model.kv_layout(), model.config, plan));
        Ok((model.model, config))
    };
    let group = match group {
        // Ranks other than 0 run rank 0's turns until it stops; no HTTP.
        // Like rank 0's, their engine runs on a thread of its own, not on
        // MLX's main thread (see `join_group`).
        Some(g) if g.rank() > 0 => {
            let rank = g.rank();
            let engine_thread = std::thread::Builder::new()
                .name("mlx-engine".into())
                .spawn(move || -> Result<()> {
                    let (model, config) = load()?;
                    let engine = Engine::new(model, tokenizer.clone(), config, metrics)?;
                    follow(engine, &g, &crate::structured::Grammars::new(tokenizer));
                    Ok(())
                })
                .map_err(|e| Error::Startup(format!("cannot start the engine thread: {e}")))?;
            engine_thread.join().map_err(|_| Error::Internal("the engine thread panicked"))??;
            log::info!("rank {rank}: rank 0 stopped the group");
            return Ok(());
        }
        group => group,
    };
    let engine = EngineHandle::spawn(Box::new(load), tokenizer.clone(), metrics.clone(), group)?;
    // Set by the loader before the engine reported the model loaded.
    let (layout, config, plan) = loaded.lock().unwrap_or_else(|e| e.into_inner()).take().ok_or(Error::Internal("the model's KV layout and config"))?;
    // Errors name the file the config came from: config.json, or the GGUF file.
    let config_path = crate::gguf::locate(&dir)?.unwrap_or_else(|| dir.join("config.json"));
    let fields: ServingFields = models::ConfigFile { value: &config, path: &config_path }.parse()?;
    let tokenizer_vocab = tokenizer.inner().get_vocab_size(true);
    let vocab_size = fields.vocab_size.map_or(tokenizer_vocab, |v| tokenizer_vocab.min(v));
    // The policy in force: fitted to the model's head dimension.
    let kv_compression = engine.config.kv_compression;
    let kv_footprint = KvFootprint {
        bytes_per_token: bytes_per_token(kv_compression.as_ref(), &layout.kinds, layout.kv_heads, layout.head_dim, plan.kv_element_bits),
        fp16_bytes_per_token: bytes_per_token(None, &layout.kinds, layout.kv_heads, layout.head_dim, plan.kv_element_bits),
    };
    log::info!(
        "KV cache: {:.0} bytes per token ({:.2}x of 16-bit){}",
        kv_footprint.bytes_per_token,
        kv_footprint.bytes_per_token / kv_footprint.fp16_bytes_per_token,
        kv_compression.and_then(|c| c.turbo_preset()).map(|p| format!(", TurboQuant {}", p.name())).unwrap_or_default()
    );
    state_metrics_kv(&metrics, kv_compression.as_ref(), &kv_footprint);
    let context_length = Some(plan.context as usize);
    let prompt_limit = PromptLimit { context: context_length, max_bytes_per_token: tokenizer.max_bytes_per_token() };
    match prompt_limit.max_text_bytes() {
        Some(max) => log::info!("prompts over {max} bytes are refused before tokenizing (they cannot fit the context)"),
        None => log::info!("no byte bound for this model's prompts: each is tokenized before its length is checked"),
    }
    // Sliding-window and recurrent caches cannot be cut back to a shorter
    // prefix: chat prompts then keep their system prompt's KV as it is prefilled.
    let prompt_checkpoints = engine.config.prompt_cache_bytes > 0 && !layout.restores_any_prefix();
    let state = web::Data::new(AppState {
        experts: expert_counters,
        distributed,
        responses: Arc::default(),
        grammars: Arc::new(crate::structured::Grammars::new(tokenizer.clone())),
        tokenizer,
        metrics,
        models: api::model_names::ModelNames::new(&model_id, &dir, &args.served_model_name),
        context_length,
        memory_plan: plan,
        prompt_limit,
        vocab_size,
        default_max_tokens: args.max_tokens,
        default_sampling: api::SamplingDefaults { temperature: args.temp, top_p: args.top_p, top_k: args.top_k, min_p: args.min_p },
        max_body_bytes: args.max_body_bytes,
        body_timeout: Duration::from_secs(args.body_timeout_secs.max(1)),
        api_key: ApiKey::new(args.api_key.clone()),
        allowed_hosts: AllowedHosts::new(&args.allowed_host, &args.host),
        tokenize_pool: TokenizePool::new(TokenizePool::default_size()),
        shutdown: Shutdown::default(),
        tool_format,
        harmony,
        prompt_checkpoints,
        system,
        config: engine.config.clone(),
        kv_footprint,
        created: generation::unix_now(),
        engine,
    });
    let served = http_server::run(state.clone(), &args);
    log::info!("shutting down");
    // Whatever is still queued or running ends here (its clients are gone).
    state.engine.shutdown();
    served?;
    match state.shutdown.cut_requests() {
        0 => Ok(()),
        cut => Err(Error::CutAtShutdown(cut)),
    }
}
