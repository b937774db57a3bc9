//! [`PacingService`]: one request's loop. Wait for the partition's turn
//! (through [`Wait::until`](crate::wait::Wait::until), the one wait loop),
//! send, learn from the response, and retry only an idempotent request
//! with an empty body, only when retries are on.

use super::announce::Announcement;
use super::layer::{PacingError, Shared};
use super::partition::Partition;
use crate::clock::Clock;
use http::{Method, Request, Response, StatusCode};
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

impl<S, K, C: Clock> PacingService<S, K, C> {
    pub(crate) fn new(inner: S, shared: Arc<Shared<K, C>>) -> Self {
        PacingService { inner, shared }
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
    loop {
        let partition = shared.partitions.partition(&key);
        turn(&shared, &partition).await?;
        let response = inner.call(req).await.map_err(PacingError::Inner)?;
        let said = Announcement::read(response.status(), response.headers());
        partition.learn(shared.partitions.clock().now(), &said);
        if said.too_many_requests {
            Shared::<K, C>::count(&shared.too_many_requests);
        }
        let status = response.status();
        let refused =
            status == StatusCode::TOO_MANY_REQUESTS || status == StatusCode::SERVICE_UNAVAILABLE;
        match &replay {
            Some(replay) if refused && retried < shared.retries => {
                retried += 1;
                Shared::<K, C>::count(&shared.retried);
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
                Shared::<K, C>::count(&shared.waits);
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
