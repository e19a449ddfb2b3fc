//! `edgelimit` command line: composes the library; no logic of its own.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use edgelimit::bootstrap::{self, cli, ServerConfig};

/// mimalloc rather than glibc malloc: per-thread free lists without arena lock contention
/// between the runtime's threads; measured A/B in README Performance.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "edgelimit",
    version,
    about = "Envoy-compatible external rate-limit server"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gRPC server.
    Serve {
        /// Server configuration file (YAML). Without one, every setting has its default.
        #[arg(long, short)]
        config: Option<PathBuf>,
        /// Overrides `listen`.
        #[arg(long)]
        listen: Option<std::net::SocketAddr>,
        /// Overrides `admin_listen`.
        #[arg(long)]
        admin_listen: Option<std::net::SocketAddr>,
        /// Overrides `policy_dir`.
        #[arg(long)]
        policy_dir: Option<PathBuf>,
        /// Overrides `redis.url` (and so selects the Redis backend).
        #[arg(long, env = "EDGELIMIT_REDIS_URL")]
        redis_url: Option<String>,
        /// Log as JSON lines.
        #[arg(long)]
        log_json: bool,
        /// Configure from envoyproxy/ratelimit's environment variables (RUNTIME_ROOT,
        /// REDIS_URL, ...) plus EDGELIMIT_HMAC_SECRET_FILE or EDGELIMIT_HMAC_SECRET, instead
        /// of a configuration file. See the README's migration guide.
        #[arg(long, env = "EDGELIMIT_REFERENCE_ENV", conflicts_with = "config")]
        reference_env: bool,
    },
    /// Validate a policy directory (for CI): prints `file:line:column: field: message` per
    /// error and exits 1, or a one-line summary and exits 0.
    Check {
        /// Policy directory.
        dir: PathBuf,
        /// Server configuration whose `policies` options (e.g. `merge_domains`) apply.
        #[arg(long, short)]
        config: Option<PathBuf>,
    },
    /// Show which rule a descriptor matches and what it enforces, without any backend.
    Explain {
        /// Policy directory (default: the configuration's `policy_dir`).
        #[arg(long)]
        policy_dir: Option<PathBuf>,
        /// Server configuration whose `policies` options apply.
        #[arg(long, short)]
        config: Option<PathBuf>,
        /// The request's domain.
        #[arg(long)]
        domain: String,
        /// Descriptor entries in order, as `key=value`.
        entries: Vec<String>,
    },
    /// Live view of a running server from its admin endpoint: decisions per second per
    /// policy and result, denial ratio, backend health, latency. Refreshes until Ctrl-C.
    Top {
        /// The server's `admin_listen` address, e.g. `127.0.0.1:9090`.
        #[arg(long, default_value = "127.0.0.1:9090")]
        admin: String,
        /// Time between refreshes, e.g. `1s`, `500ms`.
        #[arg(long, default_value = "1s", value_parser = parse_interval)]
        interval: std::time::Duration,
        /// Stop after this many refreshes (default: run until interrupted).
        #[arg(long)]
        iterations: Option<u64>,
        /// Policies shown at most, busiest first; the others are summed on one line.
        #[arg(long, default_value_t = bootstrap::top::DEFAULT_ROWS)]
        rows: usize,
    },
}

fn parse_interval(text: &str) -> Result<std::time::Duration, String> {
    let d = bootstrap::duration::parse_duration(text)?;
    if d < std::time::Duration::from_millis(100) {
        return Err("the interval must be at least 100ms".into());
    }
    Ok(d)
}

fn top(
    admin: String,
    interval: std::time::Duration,
    iterations: Option<u64>,
    rows: usize,
) -> ExitCode {
    let stdout = std::io::stdout();
    let options = bootstrap::top::TopOptions {
        addr: admin,
        interval,
        iterations,
        rows: rows.max(1),
        // Redraw in place only on a terminal; piped output gets one frame after another.
        clear: std::io::IsTerminal::is_terminal(&stdout),
    };
    match bootstrap::top::run(&options, &mut stdout.lock()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn load_config(path: Option<&PathBuf>) -> Result<ServerConfig, ExitCode> {
    match path {
        Some(path) => ServerConfig::load(path).map_err(|e| {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }),
        None => Ok(ServerConfig::default()),
    }
}

fn check(dir: PathBuf, config: Option<PathBuf>) -> ExitCode {
    let config = match load_config(config.as_ref()) {
        Ok(c) => c,
        Err(code) => return code,
    };
    match cli::check(&dir, &bootstrap::load_options(&config)) {
        Ok(summary) => {
            println!("{summary}");
            ExitCode::SUCCESS
        }
        Err(errors) => {
            for error in &errors {
                println!("{error}");
            }
            eprintln!("{} error(s) in {}", errors.len(), dir.display());
            ExitCode::FAILURE
        }
    }
}

fn explain(
    policy_dir: Option<PathBuf>,
    config: Option<PathBuf>,
    domain: String,
    entries: Vec<String>,
) -> ExitCode {
    let mut config = match load_config(config.as_ref()) {
        Ok(c) => c,
        Err(code) => return code,
    };
    if let Some(dir) = policy_dir {
        config.policy_dir = dir;
    }
    let entries = match cli::parse_entries(&entries) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    match bootstrap::load_policies(&config) {
        Ok(set) => {
            print!("{}", cli::explain(&set, &domain, &entries));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Installs the log subscriber; `EDGELIMIT_LOG`, when set, replaces `log.level` and is held to
/// the same rules (a typo would silence every line).
fn init_logging(config: &ServerConfig) -> Result<(), String> {
    let level = match std::env::var("EDGELIMIT_LOG") {
        Ok(env) => {
            bootstrap::log_filter::validate(&env).map_err(|e| format!("EDGELIMIT_LOG: {e}"))?;
            env
        }
        Err(_) => config.log.level.clone(),
    };
    let filter = tracing_subscriber::EnvFilter::try_new(&level)
        .map_err(|e| format!("log.level: `{level}`: {e}"))?;
    // Colours only on a terminal: escape codes in container logs and files are noise.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout())
        && std::env::var_os("NO_COLOR").is_none();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi);
    if config.log.json {
        builder.json().init();
    } else {
        builder.init();
    }
    Ok(())
}

/// SIGTERM or SIGINT. The handlers are installed here, before the server starts, so a
/// signal during startup is not lost (nor kills the process with the default action).
#[cfg(unix)]
fn shutdown_signal() -> std::io::Result<impl std::future::Future<Output = ()> + Send + 'static> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {},
            _ = int.recv() => {},
        }
        tracing::info!("shutdown requested; finishing in-flight requests");
    })
}

#[cfg(not(unix))]
fn shutdown_signal() -> std::io::Result<impl std::future::Future<Output = ()> + Send + 'static> {
    Ok(async {
        let _ = tokio::signal::ctrl_c().await;
        tracing::info!("shutdown requested; finishing in-flight requests");
    })
}

/// Whether the binary was started under the reference's name (`/bin/ratelimit`, as Envoy
/// Gateway and the reference's manifests run it): then it configures itself from the
/// reference's environment, as `serve --reference-env` does, and takes no arguments.
fn invoked_as_reference() -> bool {
    std::env::args_os()
        .next()
        .map(PathBuf::from)
        .and_then(|p| p.file_name().map(|n| n == "ratelimit"))
        .unwrap_or(false)
}

fn main() -> ExitCode {
    let cli = if invoked_as_reference() {
        Cli::parse_from(["edgelimit", "serve", "--reference-env"])
    } else {
        Cli::parse()
    };
    match cli.command {
        Command::Check { dir, config } => check(dir, config),
        Command::Explain {
            policy_dir,
            config,
            domain,
            entries,
        } => explain(policy_dir, config, domain, entries),
        Command::Top {
            admin,
            interval,
            iterations,
            rows,
        } => top(admin, interval, iterations, rows),
        Command::Serve {
            config,
            listen,
            admin_listen,
            policy_dir,
            redis_url,
            log_json,
            reference_env,
        } => {
            let mut warning = None;
            let mut server_config =
                match config {
                    Some(path) => match ServerConfig::load(&path) {
                        Ok(c) => c,
                        Err(e) => {
                            eprintln!("error: {e}");
                            return ExitCode::from(2);
                        }
                    },
                    None if reference_env => {
                        // Non-UTF-8 variables cannot be reference settings; they are skipped.
                        match bootstrap::refenv::from_vars(std::env::vars_os().filter_map(
                            |(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)),
                        )) {
                            Ok(r) => {
                                warning = r.warning;
                                r.config
                            }
                            Err(e) => {
                                eprintln!("error: {e}");
                                return ExitCode::from(2);
                            }
                        }
                    }
                    None => ServerConfig::default(),
                };
            if let Some(listen) = listen {
                server_config.listen = listen;
            }
            if let Some(admin) = admin_listen {
                server_config.admin_listen = admin;
            }
            if let Some(dir) = policy_dir {
                server_config.policy_dir = dir;
            }
            if redis_url.is_some() {
                server_config.redis.url = redis_url;
            }
            server_config.log.json |= log_json;
            if let Err(e) = init_logging(&server_config) {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
            if let Some(warning) = warning {
                tracing::warn!("{warning}");
            }
            let runtime = match tokio::runtime::Runtime::new() {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("error: cannot start the async runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let served = runtime.block_on(async {
                let shutdown = shutdown_signal()?;
                bootstrap::serve(server_config, shutdown, None).await
            });
            match served {
                Ok(()) => ExitCode::SUCCESS,
                // Once, on stderr (a log line on stdout as well would print it twice where
                // both streams are collected, as in a container).
                Err(e) => {
                    eprintln!("error: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
