//! [`PacingService`]: one request's loop. Wait for the partition's turn
//! (through [`Wait::until`](crate::wait::Wait::until), the one wait loop),
//! send, learn from the response, and retry only an idempotent request
//! with an empty body, only when retries are on, after a backoff
//! (`backoff.rs`).

use super::announce::Announcement;
use super::backoff::Backoff;
use super::layer::{count, PacingError, PacingLayer, Shared};
use super::partition::Partition;
use crate::clock::Clock;
use http::{Method, Request, Response};
use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower_service::Service;

/// The service a [`PacingLayer`](super::PacingLayer) wraps around an HTTP
/// client. Its future is boxed (one allocation per request: a network
/// call's cost dwarfs it).
///
/// ```
/// use ratewall::client::PacingLayer;
/// use tower_layer::Layer;
///
/// let layer = PacingLayer::builder().build().unwrap();
/// let client = tower::service_fn(|_req: http::Request<String>| async {
///     Ok::<_, std::convert::Infallible>(http::Response::new(()))
/// });
/// let paced = layer.layer(client);
/// println!("{paced:?}");
/// ```
pub struct PacingService<S, K, C: Clock> {
    inner: S,
    shared: Arc<Shared<K, C>>,
}

impl<S: Clone, K, C: Clock> Clone for PacingService<S, K, C> {
    fn clone(&self) -> Self {
        PacingService {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: fmt::Debug, K, C: Clock> fmt::Debug for PacingService<S, K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PacingService")
            .field("inner", &self.inner)
            .field("partitions", &self.shared.partitions)
            .finish_non_exhaustive()
    }
}

impl<S, K, C: Clock> tower_layer::Layer<S> for PacingLayer<K, C> {
    type Service = PacingService<S, K, C>;

    fn layer(&self, inner: S) -> Self::Service {
        PacingService {
            inner,
            shared: Arc::clone(&self.shared),
        }
    }
}

/// What a paced call returns.
type Paced<R, E> = Pin<Box<dyn Future<Output = Result<Response<R>, PacingError<E>>> + Send>>;

impl<S, B, R, K, C> Service<Request<B>> for PacingService<S, K, C>
where
    S: Service<Request<B>, Response = Response<R>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send,
    B: http_body::Body + Default + Send + 'static,
    R: Send + 'static,
    K: Hash + Eq + Clone + Send + Sync + 'static,
    C: Clock + Clone + 'static,
{
    type Response = Response<R>;
    type Error = PacingError<S::Error>;
    type Future = Paced<R, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(PacingError::Inner)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        // The ready service goes with this call; the clone stays for the next.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(paced(Arc::clone(&self.shared), inner, req))
    }
}

/// GET, HEAD, OPTIONS, PUT, DELETE, TRACE (RFC 9110 §9.2.2).
fn is_idempotent(method: &Method) -> bool {
    [
        Method::GET,
        Method::HEAD,
        Method::OPTIONS,
        Method::PUT,
        Method::DELETE,
        Method::TRACE,
    ]
    .contains(method)
}

/// A request the layer can send again: its head, and a body known empty.
struct Replay {
    method: Method,
    uri: http::Uri,
    version: http::Version,
    headers: http::HeaderMap,
    extensions: http::Extensions,
}

impl Replay {
    /// `Some` if the request may be retried: retries on, an idempotent
    /// method, and a body known to be empty (sent again as `B::default()`).
    fn of<B: http_body::Body>(
        parts: &http::request::Parts,
        body: &B,
        retries: u32,
    ) -> Option<Self> {
        let empty = body.is_end_stream() || body.size_hint().exact() == Some(0);
        (retries > 0 && empty && is_idempotent(&parts.method)).then(|| Replay {
            method: parts.method.clone(),
            uri: parts.uri.clone(),
            version: parts.version,
            headers: parts.headers.clone(),
            extensions: parts.extensions.clone(),
        })
    }

    fn request<B: Default>(&self) -> Request<B> {
        let mut req = Request::new(B::default());
        *req.method_mut() = self.method.clone();
        *req.uri_mut() = self.uri.clone();
        *req.version_mut() = self.version;
        *req.headers_mut() = self.headers.clone();
        *req.extensions_mut() = self.extensions.clone();
        req
    }
}

/// One request: wait for the turn, send, learn, maybe retry.
async fn paced<S, B, R, K, C>(
    shared: Arc<Shared<K, C>>,
    mut inner: S,
    req: Request<B>,
) -> Result<Response<R>, PacingError<S::Error>>
where
    S: Service<Request<B>, Response = Response<R>>,
    B: http_body::Body + Default,
    K: Hash + Eq + Clone,
    C: Clock + Clone,
{
    let (parts, body) = req.into_parts();
    let key = (shared.key)(&parts);
    let replay = Replay::of(&parts, &body, shared.retries);
    let mut req = Request::from_parts(parts, body);
    let mut retried = 0;
    let mut backoff = Backoff::default();
    loop {
        let partition = shared.partitions.partition(&key);
        turn(&shared, &partition).await?;
        let sent = partition.send(shared.partitions.clock().now());
        let response = inner.call(req).await.map_err(PacingError::Inner)?;
        let said = Announcement::read(response.status(), response.headers());
        // What is left, as the response says it, may miss the requests
        // sent after this one and not answered yet: `learn` reads them.
        partition.learn(shared.partitions.clock().now(), &said, Some(&sent));
        drop(sent);
        shared.refusals.record(&said);
        let refused = said.too_many_requests || said.unavailable;
        match &replay {
            Some(replay) if refused && retried < shared.retries => {
                retried += 1;
                count(&shared.retried);
                partition.record_retry();
                // Back off before the retry's turn (which then waits out
                // whatever pause is left): never again at once, however
                // short the upstream's `Retry-After`.
                drop(response);
                tokio::time::sleep(backoff.wait(retried)).await;
                req = replay.request();
                std::future::poll_fn(|cx| inner.poll_ready(cx))
                    .await
                    .map_err(PacingError::Inner)?;
            }
            _ => return Ok(response),
        }
    }
}

/// Waits until `partition` admits one request: not paused, and one unit
/// of its pace free. A request that waited at all counts one wait.
async fn turn<K, C, E>(
    shared: &Shared<K, C>,
    partition: &Partition<C>,
) -> Result<(), PacingError<E>>
where
    K: Hash + Eq + Clone,
    C: Clock + Clone,
{
    let clock = shared.partitions.clock();
    let mut waited = false;
    let admitted = shared
        .wait
        .until(|| {
            let decision = partition.admit(clock.now(), shared.rate, clock);
            if !decision.is_allowed() && !waited {
                waited = true;
                partition.record_wait();
                count(&shared.waits);
            }
            decision
        })
        .await;
    match admitted {
        Ok(_) => Ok(()),
        Err(e) => Err(PacingError::Deadline {
            last: e.last_decision(),
            paused_for: partition.paused_for(clock.now()),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::{AtomicU64, Ordering as O};
    use http::StatusCode;
    use tower::ServiceExt;
    use tower_layer::Layer;

    /// A client that answers every request with `status` and counts calls.
    fn upstream(
        status: StatusCode,
        calls: Arc<AtomicU64>,
    ) -> impl Service<
        Request<String>,
        Response = Response<()>,
        Error = std::convert::Infallible,
        Future = impl Send,
    > + Clone
           + Send
           + 'static {
        tower::service_fn(move |_req: Request<String>| {
            calls.fetch_add(1, O::SeqCst);
            let mut res = Response::new(());
            *res.status_mut() = status;
            // "Retry at once": the layer backs off all the same.
            res.headers_mut()
                .insert("retry-after", http::HeaderValue::from_static("0"));
            async move { Ok(res) }
        })
    }

    async fn calls_for(method: Method, body: &str, status: StatusCode, retries: u32) -> u64 {
        let calls = Arc::new(AtomicU64::new(0));
        let layer = PacingLayer::builder().retries(retries).build().unwrap();
        let svc = layer.layer(upstream(status, calls.clone()));
        let req = Request::builder()
            .method(method)
            .uri("http://api.example.com/x")
            .body(body.to_owned())
            .unwrap();
        let start = tokio::time::Instant::now();
        let res = svc.oneshot(req).await.unwrap();
        let took = start.elapsed();
        assert_eq!(res.status(), status);
        let made = calls.load(O::SeqCst) - 1;
        assert_eq!(layer.retries_made(), made);
        // Every refusal counted by its status, retried or not.
        let sent = made + 1;
        let refused = layer.refusals();
        let want = match status {
            StatusCode::TOO_MANY_REQUESTS => (sent, 0),
            StatusCode::SERVICE_UNAVAILABLE => (0, sent),
            _ => (0, 0),
        };
        assert_eq!((refused.too_many_requests, refused.unavailable), want);
        // Each retry backed off at least its floor, at most twice it (and
        // tokio's millisecond tick).
        let retries = u32::try_from(made).unwrap();
        let least: std::time::Duration = (1..=retries).map(super::super::backoff::floor).sum();
        let tick = std::time::Duration::from_millis(1);
        assert!(
            took >= least && took <= 2 * least + tick * retries,
            "{took:?}"
        );
        calls.load(O::SeqCst)
    }

    // Paused: the backoffs (1 s, 2 s, 4 s at least) take no wall time.
    #[tokio::test(start_paused = true)]
    async fn retries_only_idempotent_empty_requests_after_429_or_503_and_at_most_n_times() {
        let too_many = StatusCode::TOO_MANY_REQUESTS;
        let unavailable = StatusCode::SERVICE_UNAVAILABLE;
        // (method, body, status, retries, calls expected, why)
        let cases = [
            (Method::GET, "", too_many, 3, 4, "retried 3 times"),
            (Method::DELETE, "", unavailable, 2, 3, "retried twice"),
            (Method::GET, "", too_many, 0, 1, "off by default"),
            (Method::POST, "", too_many, 3, 1, "not idempotent"),
            (Method::PATCH, "", too_many, 3, 1, "not idempotent"),
            (Method::PUT, "body", too_many, 3, 1, "a body to replay"),
            (Method::GET, "", StatusCode::OK, 3, 1, "not refused"),
            (
                Method::GET,
                "",
                StatusCode::BAD_GATEWAY,
                3,
                1,
                "not a 429 or 503",
            ),
        ];
        for (method, body, status, retries, want, why) in cases {
            assert_eq!(
                calls_for(method, body, status, retries).await,
                want,
                "{why}"
            );
        }
    }

    #[tokio::test]
    async fn partitions_by_authority_or_by_the_key_function() {
        let calls = Arc::new(AtomicU64::new(0));
        let by_host = PacingLayer::builder().build().unwrap();
        let by_path = PacingLayer::builder()
            .key_fn(|parts| parts.uri.path().to_owned())
            .build()
            .unwrap();
        for uri in ["http://a.example:8080/one", "http://b.example/two", "/two"] {
            let req = |uri: &str| {
                Request::builder()
                    .uri(uri)
                    .header("host", "b.example")
                    .body(String::new())
                    .unwrap()
            };
            let a = by_host.layer(upstream(StatusCode::OK, calls.clone()));
            let b = by_path.layer(upstream(StatusCode::OK, calls.clone()));
            a.oneshot(req(uri)).await.unwrap();
            b.oneshot(req(uri)).await.unwrap();
        }
        let mut hosts: Vec<String> = by_host.views().into_iter().map(|(k, _)| k).collect();
        hosts.sort();
        assert_eq!(hosts, ["a.example:8080", "b.example"]);
        let mut paths: Vec<String> = by_path.views().into_iter().map(|(k, _)| k).collect();
        paths.sort();
        assert_eq!(paths, ["/one", "/two"]);
        assert_eq!(calls.load(O::SeqCst), 6);
    }

    #[tokio::test]
    async fn errors_say_what_to_change_and_the_inner_error_is_kept() {
        let failing = tower::service_fn(|_req: Request<String>| async {
            Err::<Response<()>, _>(std::io::Error::other("refused"))
        });
        let layer = PacingLayer::builder().build().unwrap();
        let err = layer
            .layer(failing)
            .oneshot(Request::new(String::new()))
            .await
            .unwrap_err();
        assert!(matches!(&err, PacingError::Inner(e) if e.to_string() == "refused"));
        assert!(std::error::Error::source(&err).is_some());
        let deadline: PacingError<std::io::Error> = PacingError::Deadline {
            last: None,
            paused_for: Some(std::time::Duration::from_secs(3)),
        };
        assert!(deadline.to_string().contains("pause of 3s"), "{deadline}");
    }
}
