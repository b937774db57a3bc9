//! `ratewall-server`: flags (or the same from the environment), then serve
//! until SIGTERM or Ctrl-C, draining the calls in flight.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use ratewall::redis::{FailurePolicy, RedisBackend};
use ratewall_server::config::LoadOptions;
use ratewall_server::{ResponseHeaders, ServerBuilder, ServiceOptions};

/// An Envoy rate limit service (gRPC ShouldRateLimit) on ratewall, reading
/// envoyproxy/ratelimit's YAML configuration.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Flags {
    /// The configuration directory: every regular file under it is read as
    /// YAML, whatever its extension (as envoyproxy/ratelimit reads it), and
    /// read again when one changes.
    #[arg(long, env = "RATEWALL_CONFIG_DIR")]
    config_dir: PathBuf,
    /// Where gRPC (ShouldRateLimit, grpc.health.v1) listens.
    #[arg(long, env = "RATEWALL_GRPC_ADDR", default_value = "0.0.0.0:8081")]
    grpc_addr: SocketAddr,
    /// Where HTTP (/json, /healthcheck, /metrics) listens.
    #[arg(long, env = "RATEWALL_HTTP_ADDR", default_value = "0.0.0.0:8080")]
    http_addr: SocketAddr,
    /// The most counters one limit keeps in memory (least recently used
    /// forgotten past it).
    #[arg(long, env = "RATEWALL_MAX_KEYS_PER_LIMIT", default_value_t = 100_000)]
    max_keys_per_limit: usize,
    /// Answer OK to every call whatever the limits say (they still count).
    #[arg(long, env = "RATEWALL_SHADOW_MODE")]
    shadow_mode: bool,
    /// All or nothing across a request's descriptors: a request refused by
    /// one limit takes nothing from the others (envoyproxy/ratelimit
    /// counts each on its own).
    #[arg(long, env = "RATEWALL_ALL_OR_NOTHING")]
    all_or_nothing: bool,
    /// Rate-limit fields for Envoy to add to its response: `off`, `draft03`
    /// (envoyproxy/ratelimit's RateLimit-Limit/-Remaining/-Reset of the
    /// most constrained descriptor) or `ietf` (RateLimit and
    /// RateLimit-Policy, one item per counted descriptor).
    #[arg(long, env = "RATEWALL_RESPONSE_HEADERS", default_value = "off", value_parser = ["off", "draft03", "ietf"])]
    response_headers: String,
    /// Count in Redis, shared by every replica: `redis://host:6379` (or
    /// `rediss://` for TLS); several URLs separated by commas name the nodes
    /// of a Redis Cluster. Without it, limits count in memory.
    #[arg(long, env = "RATEWALL_REDIS_URL")]
    redis_url: Option<String>,
    /// A PEM file of the CA that signed Redis's certificate (`rediss://`
    /// with a private CA); the platform's trust store otherwise.
    #[arg(long, env = "RATEWALL_REDIS_TLS_CA")]
    redis_tls_ca: Option<PathBuf>,
    /// A PEM certificate for mutual TLS with Redis (with `--redis-tls-key`).
    #[arg(long, env = "RATEWALL_REDIS_TLS_CERT", requires = "redis_tls_key")]
    redis_tls_cert: Option<PathBuf>,
    /// The PEM private key of `--redis-tls-cert`.
    #[arg(long, env = "RATEWALL_REDIS_TLS_KEY", requires = "redis_tls_cert")]
    redis_tls_key: Option<PathBuf>,
    /// What a call gets when Redis cannot answer: `open` (admitted),
    /// `closed` (gRPC UNAVAILABLE: Envoy's failure_mode_deny decides) or
    /// `fallback-share N` (limited here at 1/N of each limit, N replicas).
    #[arg(long, env = "RATEWALL_REDIS_ON_FAILURE", default_value = "open")]
    redis_on_failure: String,
    /// The most time a Redis call may take before it counts as failed, in
    /// milliseconds.
    #[arg(long, env = "RATEWALL_REDIS_TIMEOUT_MS", default_value_t = 50)]
    redis_timeout_ms: u64,
    /// The most checks sent to Redis in one script call (concurrent calls'
    /// descriptors are batched; 1 turns batching off).
    #[arg(long, env = "RATEWALL_REDIS_MAX_BATCH", default_value_t = 128)]
    redis_max_batch: usize,
    /// How many batches may wait on Redis at once.
    #[arg(long, env = "RATEWALL_REDIS_BATCHES_IN_FLIGHT", default_value_t = 2)]
    redis_batches_in_flight: usize,
    /// Keys per limit remembered as denied until their retry time, answered
    /// without a Redis call (0: none).
    #[arg(long, env = "RATEWALL_REDIS_DENY_CACHE", default_value_t = 10_000)]
    redis_deny_cache: usize,
    /// Files naming the same domain add to it instead of being an error
    /// (envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG).
    #[arg(long, env = "RATEWALL_MERGE_DOMAINS")]
    merge_domains: bool,
    /// Skip files and directories whose name starts with `.` (set it for a
    /// Kubernetes ConfigMap mount, whose `..data` copies would otherwise
    /// repeat every domain; envoyproxy/ratelimit's RUNTIME_IGNOREDOTFILES).
    #[arg(long, env = "RATEWALL_IGNORE_DOT_FILES")]
    ignore_dot_files: bool,
    /// On SIGTERM, how long calls in flight may take to finish before the
    /// connections still open are closed, in milliseconds.
    #[arg(long, env = "RATEWALL_DRAIN_MS", default_value_t = 10_000)]
    drain_ms: u64,
    /// Threads answering calls (0: one per CPU).
    #[arg(long, env = "RATEWALL_WORKER_THREADS", default_value_t = 0)]
    worker_threads: usize,
    /// Answer OK without limiting (a benchmark's floor: the transport alone).
    #[arg(long, hide = true)]
    answer_ok_without_limiting: bool,
    /// How often the configuration directory is checked, in milliseconds.
    #[arg(long, env = "RATEWALL_RELOAD_MS", default_value_t = 2000)]
    reload_ms: u64,
}

fn main() -> ExitCode {
    let flags = Flags::parse();
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if flags.worker_threads > 0 {
        runtime.worker_threads(flags.worker_threads);
    }
    match runtime.enable_all().build() {
        Ok(rt) => rt.block_on(serve(flags)),
        Err(e) => {
            eprintln!("ratewall-server: cannot start the runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(flags: Flags) -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("RATEWALL_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        // The log on stderr; stdout carries only the line naming the addresses.
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    let stop = stop_signal();
    let mut options = ServiceOptions::default()
        .max_keys_per_limit(flags.max_keys_per_limit)
        .global_shadow_mode(flags.shadow_mode)
        .answer_ok_without_limiting(flags.answer_ok_without_limiting)
        .all_or_nothing(flags.all_or_nothing)
        .response_headers(match flags.response_headers.as_str() {
            "draft03" => ResponseHeaders::Draft03,
            "ietf" => ResponseHeaders::Ietf,
            _ => ResponseHeaders::Off,
        });
    if let Some(url) = &flags.redis_url {
        match redis_options(&flags, url) {
            Ok((backend, on_failure)) => {
                options = options.redis(backend, on_failure, flags.redis_deny_cache);
            }
            Err(e) => {
                eprintln!("ratewall-server: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    let server = ServerBuilder::new(&flags.config_dir)
        .grpc_addr(flags.grpc_addr)
        .http_addr(flags.http_addr)
        .reload_every(Duration::from_millis(flags.reload_ms))
        .options(options)
        .load_options(
            LoadOptions::default()
                .merge_domains(flags.merge_domains)
                .ignore_dot_files(flags.ignore_dot_files),
        )
        .start()
        .await;
    let server = match server {
        Ok(s) => s,
        Err(e) => {
            eprintln!("ratewall-server: {e}");
            return ExitCode::FAILURE;
        }
    };
    // One line on stdout naming both addresses (port 0 picks a free one).
    println!(
        "ratewall-server serving grpc={} http={}",
        server.grpc_addr(),
        server.http_addr()
    );
    stop.await;
    tracing::info!("stopping: draining calls in flight");
    server.shutdown(Duration::from_millis(flags.drain_ms)).await;
    ExitCode::SUCCESS
}

/// The Redis backend and failure policy the flags ask for.
fn redis_options(flags: &Flags, url: &str) -> Result<(RedisBackend, FailurePolicy), String> {
    let on_failure = match flags.redis_on_failure.trim() {
        "open" => FailurePolicy::Open,
        "closed" => FailurePolicy::Closed,
        other => match other.strip_prefix("fallback-share").map(str::trim) {
            Some(n) => match n.parse::<u32>() {
                Ok(instances) if instances > 0 => FailurePolicy::FallbackShare { instances },
                _ => return Err(format!("--redis-on-failure {other:?}: `fallback-share N` takes the number of replicas, at least 1")),
            },
            None => {
                return Err(format!(
                    "--redis-on-failure {other:?}: use `open`, `closed` or `fallback-share N`"
                ))
            }
        },
    };
    let urls: Vec<&str> = url
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .collect();
    let builder = if urls.len() > 1 {
        RedisBackend::cluster_builder(urls)
    } else {
        RedisBackend::builder(url.trim())
    };
    let read = |flag: &str, path: &PathBuf| {
        std::fs::read(path).map_err(|e| format!("{flag} {}: {e}", path.display()))
    };
    let mut builder = builder;
    if let Some(ca) = &flags.redis_tls_ca {
        builder = builder.tls_root_certificate(read("--redis-tls-ca", ca)?);
    }
    if let (Some(cert), Some(key)) = (&flags.redis_tls_cert, &flags.redis_tls_key) {
        builder = builder.tls_client_certificate(
            read("--redis-tls-cert", cert)?,
            read("--redis-tls-key", key)?,
        );
    }
    let backend = builder
        .timeout(Duration::from_millis(flags.redis_timeout_ms.max(1)))
        .max_batch(flags.redis_max_batch)
        .batches_in_flight(flags.redis_batches_in_flight)
        .build()
        .map_err(|e| format!("--redis-url: {e}"))?;
    Ok((backend, on_failure))
}

/// SIGTERM or Ctrl-C: the handlers are installed when this is called (so
/// before the addresses are announced), and the future waits for either.
fn stop_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    let term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    let ctrl_c = tokio::signal::ctrl_c();
    async move {
        #[cfg(unix)]
        if let Some(mut term) = term {
            tokio::select! {
                _ = ctrl_c => {}
                _ = term.recv() => {}
            }
            return;
        }
        let _ = ctrl_c.await;
    }
}
