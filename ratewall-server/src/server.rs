//! The running server: gRPC (`ShouldRateLimit`, `grpc.health.v1`) on one
//! address, HTTP (`/json`, `/healthcheck`, `/metrics`) on another, the
//! configuration directory polled for changes, and a drain on shutdown.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use axum::Router;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::{Config, ConfigError, LoadOptions};
use crate::json;
use crate::service::{RequestError, Service, ServiceOptions};
use crate::stats::{self, Answer, CallStats, Transport};

/// What keeps a server from starting.
#[derive(Debug)]
#[non_exhaustive]
pub enum StartError {
    /// The configuration directory does not load.
    Config(ConfigError),
    /// A limit cannot be built (a policy outside ratewall's bounds, or one
    /// Redis cannot run).
    Limit(crate::store::LimitError),
    /// An address cannot be bound.
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        error: std::io::Error,
    },
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartError::Config(e) => write!(f, "the configuration does not load: {e}"),
            StartError::Limit(e) => write!(f, "a limit cannot be built: {e}"),
            StartError::Bind { addr, error } => write!(f, "cannot listen on {addr}: {error}"),
        }
    }
}

impl std::error::Error for StartError {}

/// Configures and starts a [`RunningServer`].
///
/// ```no_run
/// use ratewall_server::ServerBuilder;
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let server = ServerBuilder::new("examples/config")
///     .grpc_addr("127.0.0.1:8081".parse()?)
///     .http_addr("127.0.0.1:8080".parse()?)
///     .start()
///     .await?;
/// println!("gRPC on {}", server.grpc_addr());
/// server.shutdown(std::time::Duration::from_secs(10)).await; // drains the calls in flight
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct ServerBuilder {
    config_dir: PathBuf,
    grpc_addr: SocketAddr,
    http_addr: SocketAddr,
    options: ServiceOptions,
    load_options: LoadOptions,
    poll: Duration,
}

impl ServerBuilder {
    /// A server reading the files under `config_dir`, on envoyproxy/ratelimit's
    /// default ports (gRPC 8081, HTTP 8080, all interfaces).
    pub fn new(config_dir: impl AsRef<Path>) -> ServerBuilder {
        ServerBuilder {
            config_dir: config_dir.as_ref().to_path_buf(),
            grpc_addr: SocketAddr::from(([0, 0, 0, 0], 8081)),
            http_addr: SocketAddr::from(([0, 0, 0, 0], 8080)),
            options: ServiceOptions::default(),
            load_options: LoadOptions::default(),
            poll: Duration::from_secs(2),
        }
    }

    /// Where gRPC listens (port 0: any free port, see
    /// [`RunningServer::grpc_addr`]).
    #[must_use]
    pub fn grpc_addr(mut self, addr: SocketAddr) -> Self {
        self.grpc_addr = addr;
        self
    }

    /// Where HTTP (`/json`, `/healthcheck`, `/metrics`) listens.
    #[must_use]
    pub fn http_addr(mut self, addr: SocketAddr) -> Self {
        self.http_addr = addr;
        self
    }

    /// How the service counts and answers.
    #[must_use]
    pub fn options(mut self, options: ServiceOptions) -> Self {
        self.options = options;
        self
    }

    /// How the configuration directory is read (domains merged across
    /// files, dot files skipped).
    #[must_use]
    pub fn load_options(mut self, options: LoadOptions) -> Self {
        self.load_options = options;
        self
    }

    /// How often the configuration directory is checked for changes (2 s
    /// by default).
    #[must_use]
    pub fn reload_every(mut self, every: Duration) -> Self {
        self.poll = every.max(Duration::from_millis(10));
        self
    }

    /// Loads the configuration, binds both addresses and starts serving.
    ///
    /// The first server of a process installs a Prometheus recorder as the
    /// `metrics` facade's global recorder (for the library's Redis metrics
    /// in `/metrics`), unless the program installed one before: then those
    /// metrics go to the program's recorder, and `/metrics` has the
    /// server's own.
    pub async fn start(self) -> Result<RunningServer, StartError> {
        // Before any limit is built: the library registers its handles then.
        let _ = stats::library_metrics();
        let (fingerprint, config) = load(&self.config_dir, &self.load_options);
        let config = config.map_err(StartError::Config)?;
        let service = Arc::new(Service::new(config, self.options).map_err(StartError::Limit)?);
        let calls = Arc::new(CallStats::default());
        let bind = |addr| async move {
            TcpListener::bind(addr)
                .await
                .map_err(|error| StartError::Bind { addr, error })
        };
        let grpc_listener = bind(self.grpc_addr).await?;
        let http_listener = bind(self.http_addr).await?;
        let grpc_addr = grpc_listener
            .local_addr()
            .map_err(|error| StartError::Bind {
                addr: self.grpc_addr,
                error,
            })?;
        let http_addr = http_listener
            .local_addr()
            .map_err(|error| StartError::Bind {
                addr: self.http_addr,
                error,
            })?;
        let (stop_tx, stop_rx) = watch::channel(false);
        let stopped = |mut rx: watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|s| *s).await;
        };

        let (health, health_service) = tonic_health::server::health_reporter();
        health.set_serving::<RateLimitServiceServer<Grpc>>().await;
        let grpc = Grpc {
            service: Arc::clone(&service),
            calls: Arc::clone(&calls),
        };
        let grpc_task = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(health_service)
                .add_service(RateLimitServiceServer::new(grpc))
                .serve_with_incoming_shutdown(
                    // No Nagle delay: an answer is one small write, and
                    // waiting for the peer's delayed ACK cost 40 ms a call
                    // at low rates (measured with the load generator).
                    tonic::transport::server::TcpIncoming::from(grpc_listener)
                        .with_nodelay(Some(true)),
                    stopped(stop_rx.clone()),
                ),
        );
        let http = Router::new()
            .route("/json", post(json_call))
            .route("/healthcheck", get(healthcheck))
            .route("/metrics", get(metrics))
            .with_state(Http {
                service: Arc::clone(&service),
                calls: Arc::clone(&calls),
                stopping: stop_rx.clone(),
            });
        let http_stop = stopped(stop_rx.clone());
        let http_task = tokio::spawn(async move {
            // No Nagle delay here either (see the gRPC listener).
            let http_listener = http_listener.tap_io(|tcp| {
                let _ = tcp.set_nodelay(true);
            });
            axum::serve(http_listener, http)
                .with_graceful_shutdown(http_stop)
                .await
        });
        let reload_task = tokio::spawn(poll_config(
            self.config_dir.clone(),
            self.load_options.clone(),
            fingerprint,
            self.poll,
            Arc::clone(&service),
            Arc::clone(&calls),
            stop_rx,
        ));
        tracing::info!(%grpc_addr, %http_addr, config_dir = %self.config_dir.display(), "ratewall-server serving");
        Ok(RunningServer {
            grpc_addr,
            http_addr,
            service,
            stop: stop_tx,
            grpc_task,
            http_task,
            reload_task,
            health,
        })
    }
}

/// A started server; [`shutdown`](Self::shutdown) drains and stops it.
#[derive(Debug)]
pub struct RunningServer {
    grpc_addr: SocketAddr,
    http_addr: SocketAddr,
    service: Arc<Service>,
    stop: watch::Sender<bool>,
    grpc_task: JoinHandle<Result<(), tonic::transport::Error>>,
    http_task: JoinHandle<std::io::Result<()>>,
    reload_task: JoinHandle<()>,
    health: tonic_health::server::HealthReporter,
}

impl RunningServer {
    /// The address gRPC listens on.
    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc_addr
    }

    /// The address HTTP listens on.
    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    /// The service answering calls.
    pub fn service(&self) -> &Arc<Service> {
        &self.service
    }

    /// Stops taking new connections, lets the calls in flight finish, and
    /// returns when both listeners are closed, or after `drain` at most
    /// (connections still open then are dropped: a client that does not
    /// answer the server's GOAWAY cannot hold it). gRPC health and
    /// `/healthcheck` answer "not serving" from the start of the drain.
    pub async fn shutdown(self, drain: Duration) {
        self.health
            .set_not_serving::<RateLimitServiceServer<Grpc>>()
            .await;
        let _ = self.stop.send(true);
        let (grpc_abort, http_abort) =
            (self.grpc_task.abort_handle(), self.http_task.abort_handle());
        let drained = tokio::time::timeout(drain, async {
            if let Ok(Err(e)) = self.grpc_task.await {
                tracing::warn!(error = %e, "gRPC server ended with an error");
            }
            if let Ok(Err(e)) = self.http_task.await {
                tracing::warn!(error = %e, "HTTP server ended with an error");
            }
        })
        .await;
        if drained.is_err() {
            tracing::warn!(?drain, "connections still open after the drain: closed");
            grpc_abort.abort();
            http_abort.abort();
        }
        let _ = self.reload_task.await;
        tracing::info!("ratewall-server stopped");
    }
}

/// The gRPC face of the service.
#[derive(Debug, Clone)]
struct Grpc {
    service: Arc<Service>,
    calls: Arc<CallStats>,
}

#[tonic::async_trait]
impl RateLimitService for Grpc {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        let start = Instant::now();
        let answer = self.service.should_rate_limit(request.get_ref()).await;
        let (kind, result) = match answer {
            Ok(r) => (answer_of(&r), Ok(tonic::Response::new(r))),
            Err(e @ RequestError::StoreUnavailable { .. }) => (
                Answer::Error,
                Err(tonic::Status::unavailable(e.to_string())),
            ),
            Err(e) => (
                Answer::Error,
                Err(tonic::Status::invalid_argument(e.to_string())),
            ),
        };
        self.calls.record(Transport::Grpc, kind, start.elapsed());
        result
    }
}

fn answer_of(r: &RateLimitResponse) -> Answer {
    if r.overall_code == Code::OverLimit as i32 {
        Answer::OverLimit
    } else {
        Answer::Ok
    }
}

#[derive(Clone)]
struct Http {
    service: Arc<Service>,
    calls: Arc<CallStats>,
    stopping: watch::Receiver<bool>,
}

/// `POST /json`: 200 with the answer, 429 when over the limit, 400 for a
/// request that does not read or is refused.
async fn json_call(State(http): State<Http>, body: Bytes) -> Response {
    let start = Instant::now();
    let request = match json::parse_request(&body) {
        Ok(r) => r,
        Err(e) => {
            http.calls
                .record(Transport::Json, Answer::Error, start.elapsed());
            return (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response();
        }
    };
    match http.service.should_rate_limit(&request).await {
        Ok(r) => {
            let answer = answer_of(&r);
            http.calls.record(Transport::Json, answer, start.elapsed());
            let status = match answer {
                Answer::OverLimit => StatusCode::TOO_MANY_REQUESTS,
                _ => StatusCode::OK,
            };
            (status, axum::Json(json::response_json(&r))).into_response()
        }
        Err(e) => {
            http.calls
                .record(Transport::Json, Answer::Error, start.elapsed());
            (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response()
        }
    }
}

/// `GET /healthcheck`: `OK` while serving, 500 once draining.
async fn healthcheck(State(http): State<Http>) -> Response {
    if *http.stopping.borrow() {
        (StatusCode::INTERNAL_SERVER_ERROR, "draining\n").into_response()
    } else {
        (StatusCode::OK, "OK").into_response()
    }
}

/// `GET /metrics`: Prometheus text.
async fn metrics(State(http): State<Http>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        stats::render(&http.service, &http.calls),
    )
        .into_response()
}

/// What the configuration files held when last read (a hash of every
/// path and text): a reload happens when it changes, and a file that stays
/// broken is reported once.
type Fingerprint = u64;

fn fingerprint(files: &[(String, String)]) -> Fingerprint {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    files.hash(&mut h);
    h.finish()
}

/// Reads the directory: its fingerprint, and the configuration it holds.
fn load(dir: &Path, options: &LoadOptions) -> (Option<Fingerprint>, Result<Config, ConfigError>) {
    match Config::read_dir(dir, options) {
        Ok(files) => (
            Some(fingerprint(&files)),
            Config::from_sources_with(&files, options),
        ),
        Err(e) => (None, Err(e)),
    }
}

/// Re-reads the directory every `every`: a configuration that changed
/// and loads replaces the serving one in one step; one that does not load
/// is logged once (until it changes again) and the old one keeps serving.
async fn poll_config(
    dir: PathBuf,
    options: LoadOptions,
    mut seen: Option<Fingerprint>,
    every: Duration,
    service: Arc<Service>,
    calls: Arc<CallStats>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let read = {
            let (dir, options) = (dir.clone(), options.clone());
            tokio::task::spawn_blocking(move || load(&dir, &options)).await
        };
        let Ok((at, loaded)) = read else { continue };
        if at.is_some() && at == seen {
            continue;
        }
        // A directory that cannot be read is retried without a second
        // report until it reads.
        let report = at.is_some() || seen.is_some();
        seen = at;
        let failed = |e: &dyn std::fmt::Display| {
            // Relaxed: a statistic.
            calls.reload_errors.fetch_add(1, Ordering::Relaxed);
            tracing::error!(error = %e, "configuration not reloaded; the previous configuration keeps serving");
        };
        match loaded {
            Ok(config) => match service.replace_config(config) {
                Ok(()) => {
                    // Relaxed: a statistic.
                    calls.reloads.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(config_dir = %dir.display(), "configuration reloaded");
                }
                Err(e) => failed(&e),
            },
            Err(e) if report => failed(&e),
            Err(_) => {}
        }
    }
}
