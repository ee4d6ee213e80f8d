//! `ferrite`: an OpenAI-compatible completion server for GGUF models.
//!
//! `ferrite serve` loads a model and serves `POST /v1/completions`; `ferrite pull NAME`
//! fetches a known model into the cache.

mod auth;
mod error;
mod fetch;
mod routes;
mod state;
mod validate;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use ferrite_engine::gguf::GgufFile;
use ferrite_engine::sampling::SamplingParams;
use ferrite_engine::scheduler::SchedulerConfig;
use ferrite_engine::tokenizer::Tokenizer;
use ferrite_engine::{model, Engine, EngineConfig, EngineHandle, SequenceEvent, SequenceRequest};
use tracing_subscriber::EnvFilter;

use crate::state::AppState;

#[derive(Parser)]
#[command(
    name = "ferrite",
    version,
    about = "An OpenAI-compatible completion server for GGUF models"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve a model over HTTP.
    Serve(ServeArgs),
    /// Download known models into the cache ($FERRITE_HOME, default ~/.cache/ferrite).
    Pull {
        /// Model names (smollm2-135m, gemma3-270m).
        #[arg(required = true)]
        names: Vec<String>,
    },
}

#[derive(Args)]
struct ServeArgs {
    /// A GGUF path, a known model name, or a Hugging Face repo id (owner/repo[:file.gguf]).
    /// Default: smollm2-135m, fetched on first use.
    #[arg(long, env = "FERRITE_MODEL")]
    model: Option<String>,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1", env = "FERRITE_HOST")]
    host: String,
    /// Port to listen on.
    #[arg(long, default_value_t = 8080, env = "FERRITE_PORT")]
    port: u16,
    /// Names the model answers to in requests (repeatable); default: the model's name.
    #[arg(
        long = "served-model-name",
        env = "FERRITE_SERVED_MODEL_NAME",
        value_delimiter = ','
    )]
    served_model_names: Vec<String>,
    /// Longest prompt plus completion, in tokens; default: the model's training context.
    #[arg(long, env = "FERRITE_CTX_SIZE")]
    ctx_size: Option<usize>,
    /// Most sequences decoded together.
    #[arg(long, default_value_t = 64, env = "FERRITE_MAX_RUNNING")]
    max_running: usize,
    /// Most tokens in one forward step (prefill chunk size plus decodes).
    #[arg(long, default_value_t = 512, env = "FERRITE_MAX_STEP_TOKENS")]
    max_step_tokens: usize,
    /// KV cache positions that running sequences may reserve together.
    #[arg(long, default_value_t = 131_072, env = "FERRITE_KV_BUDGET")]
    kv_budget: usize,
    /// KV cache positions kept from finished sequences for prompts that start the same
    /// way (0 turns the prefix cache off).
    #[arg(long, default_value_t = 8192, env = "FERRITE_PREFIX_CACHE_POSITIONS")]
    prefix_cache_positions: usize,
    /// Drop request fields that no supported API documents instead of answering 400.
    #[arg(long, env = "FERRITE_IGNORE_UNKNOWN_FIELDS")]
    ignore_unknown_fields: bool,
    /// A key every route but /health, /ready and /metrics then needs, as `Authorization:
    /// Bearer KEY` or `x-api-key: KEY` (repeatable; the variable takes one).
    #[arg(long = "api-key", env = "FERRITE_API_KEY")]
    api_keys: Vec<String>,
    /// A file of API keys, one per line (`#` starts a comment line).
    #[arg(long, env = "FERRITE_API_KEY_FILE")]
    api_key_file: Option<std::path::PathBuf>,
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Pull { names } => {
            for name in names {
                fetch::pull(&name)?;
            }
            Ok(())
        }
        Command::Serve(args) => serve(args),
    }
}

fn serve(args: ServeArgs) -> Result<()> {
    let (path, name) = fetch::resolve(args.model.as_deref())?;
    let names = if args.served_model_names.is_empty() {
        vec![name]
    } else {
        args.served_model_names.clone()
    };
    let mut state = AppState::new(names, args.ignore_unknown_fields);
    state.api_keys = auth::ApiKeys::new(&args.api_keys, args.api_key_file.as_deref())?;
    if state.api_keys.is_enabled() {
        tracing::info!("API keys required on every route but /health, /ready and /metrics");
    }
    let state = Arc::new(state);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let addr: SocketAddr = format!("{}:{}", args.host, args.port)
            .parse()
            .with_context(|| format!("bad listen address {}:{}", args.host, args.port))?;
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding {addr}"))?;
        tracing::info!(%addr, model = %path.display(), "listening; loading the model");
        let loader_state = Arc::clone(&state);
        let loader = tokio::task::spawn_blocking(move || load_engine(&path, &args, &loader_state));
        let app = routes::router(Arc::clone(&state));
        let server = axum::serve(listener, app).with_graceful_shutdown(shutdown_signal());
        let (served, loaded) = tokio::join!(server, async {
            let engine = loader.await.context("the loader panicked")??;
            Ok::<_, anyhow::Error>(engine)
        });
        served.context("serving HTTP")?;
        tracing::info!("shutting down");
        loaded?.shutdown();
        Ok(())
    })
}

/// Loads the model, starts the engine, runs one warm-up request, then marks the server
/// ready. A model that fails to load ends the process with the error.
fn load_engine(path: &Path, args: &ServeArgs, state: &AppState) -> Result<Engine> {
    let started = std::time::Instant::now();
    let result = (|| {
        let mut gguf = GgufFile::open(path)?;
        let tokenizer = Tokenizer::from_gguf(&gguf.meta)?;
        let model = model::load(&mut gguf)?;
        Ok::<_, ferrite_engine::EngineError>((tokenizer, model))
    })();
    let (tokenizer, model) = match result {
        Ok(x) => x,
        Err(e) => {
            tracing::error!(error = %e, "cannot load the model");
            eprintln!("error: cannot load {}: {e}", path.display());
            std::process::exit(1);
        }
    };
    let info = model.info().clone();
    let context_length = args
        .ctx_size
        .unwrap_or(info.context_length)
        .min(info.context_length)
        .max(2);
    let config = EngineConfig {
        scheduler: SchedulerConfig {
            max_running: args.max_running.max(1),
            max_step_tokens: args.max_step_tokens.max(args.max_running).max(16),
            kv_budget: args.kv_budget,
        },
        context_length,
        prefix_cache_positions: args.prefix_cache_positions,
    };
    let engine = Engine::start(model, tokenizer, config);
    warm_up(&engine.handle())?;
    tracing::info!(
        architecture = %info.architecture,
        name = info.name.as_deref().unwrap_or("?"),
        context_length,
        seconds = started.elapsed().as_secs_f32(),
        "model loaded and warmed up; ready"
    );
    let _ = state.engine.set(engine.handle());
    Ok(engine)
}

/// Runs one short generation so the first real request does not pay for cold caches.
fn warm_up(engine: &EngineHandle) -> Result<()> {
    let bos = engine.tokenizer().bos().unwrap_or(0);
    let mut events = engine.submit(SequenceRequest::new(
        vec![bos],
        SamplingParams {
            temperature: 0.0,
            ..Default::default()
        },
        1,
    ))?;
    while let Some(event) = events.blocking_recv() {
        match event {
            SequenceEvent::Finished { .. } => return Ok(()),
            SequenceEvent::Failed(m) => anyhow::bail!("warm-up failed: {m}"),
            SequenceEvent::TimedOut => anyhow::bail!("warm-up timed out"),
            SequenceEvent::Token { .. } | SequenceEvent::PromptLogprobs(_) => {}
        }
    }
    anyhow::bail!("the engine stopped during warm-up")
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        if let Ok(mut s) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            s.recv().await;
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = terminate => {},
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// Every option of `ferrite serve` can also come from a `FERRITE_*` variable.
    #[test]
    fn every_serve_option_has_an_environment_variable() {
        let cli = Cli::command();
        let serve = cli.find_subcommand("serve").expect("the serve command");
        for arg in serve.get_arguments().filter(|a| a.get_long().is_some()) {
            let long = arg.get_long().unwrap();
            if long == "help" {
                continue;
            }
            let env = arg
                .get_env()
                .unwrap_or_else(|| panic!("--{long} has no variable"));
            let want = format!("FERRITE_{}", long.to_uppercase().replace('-', "_"));
            assert_eq!(env.to_str(), Some(want.as_str()), "--{long}");
        }
    }
}
