//! The client-keys target: **one client, one key**. Requests carrying
//! hostile header lines (the key header repeated, sent in another case,
//! empty, with commas or spaces, next to a tier header sent once or twice,
//! and other headers) go through the real tower layer, and each answer is
//! compared with a model written from the documented rules:
//!
//! - exactly one line of the key header: that value's bucket decides (a
//!   listed premium value gets the premium tier, else one `x-plan: pro`
//!   line the pro tier, else the rule's own policy), `200` or `429`;
//! - no line: `when_missing` decides (`200` for skip, `401` for reject);
//! - two lines or more: `400`, and no bucket changes.
//!
//! So no sequence of requests gets any value more than its tier's limit
//! per window, however its lines are arranged. The rule is keyed by the
//! header alone or by a composite of the client's address and the header
//! (one peer address: the same buckets).

use arbitrary::{Arbitrary, Unstructured};
use http::{HeaderName, HeaderValue, Request, Response, StatusCode};
use ratewall::http::{Key, Missing, RateLimitLayer, Rule};
use ratewall::{ManualClock, Policy, Window};
use std::collections::HashMap;
use std::convert::Infallible;
use std::future::{ready, Future, Ready};
use std::net::SocketAddr;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;
use tower_layer::Layer;
use tower_service::Service;

/// Requests per input, so one input stays fast.
const MAX_REQUESTS: usize = 200;
/// The rule's own limit per window; the pro tier has twice, premium three
/// times.
const LIMIT: u64 = 3;
const WINDOW: Duration = Duration::from_secs(3600);

/// Values that recur, so limits are met; `Raw` bytes reach the rest.
const VALUES: [&[u8]; 8] = [b"k0", b"k1", b"gold", b"", b"k0, k1", b" k0", b"K0", b"pro"];

#[derive(Arbitrary, Debug)]
enum Value {
    Known(u8),
    Raw(Vec<u8>),
}

impl Value {
    fn bytes(&self) -> Vec<u8> {
        match self {
            Value::Known(i) => VALUES[usize::from(*i) % VALUES.len()].to_vec(),
            Value::Raw(b) => b.iter().take(24).copied().collect(),
        }
    }
}

#[derive(Arbitrary, Debug)]
enum Name {
    /// `x-api-key`, the rule's key.
    Key,
    /// `X-API-Key`: the same header (names are case-insensitive).
    KeyUpper,
    /// `x-plan`, the tier header.
    Plan,
    /// A header no rule reads.
    Other,
}

#[derive(Arbitrary, Debug)]
struct Line {
    name: Name,
    value: Value,
}

#[derive(Arbitrary, Debug)]
enum Step {
    Request(Vec<Line>),
    /// The next fixed window: every bucket is full again.
    NextWindow,
}

#[derive(Arbitrary, Debug)]
struct Input {
    composite: bool,
    reject_missing: bool,
    steps: Vec<Step>,
}

/// The inner service: every request that reaches it is answered 200.
#[derive(Clone, Copy, Debug)]
struct Ok200;

impl Service<Request<()>> for Ok200 {
    type Response = Response<()>;
    type Error = Infallible;
    type Future = Ready<Result<Response<()>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<()>) -> Self::Future {
        ready(Ok(Response::new(())))
    }
}

/// Which tier the model puts a request in, and its limit.
fn tier(key: &[u8], plans: &[&[u8]], premium: bool) -> (&'static str, u64) {
    if premium && key == b"gold" {
        ("premium", 3 * LIMIT)
    } else if plans == [b"pro".as_slice()] {
        ("pro", 2 * LIMIT)
    } else {
        ("own", LIMIT)
    }
}

pub fn run_client_keys(data: &[u8]) {
    let Ok(input) = Input::arbitrary_take_rest(Unstructured::new(data)) else {
        return;
    };
    let clock = ManualClock::new();
    let header = Key::header("x-api-key");
    let key = if input.composite {
        Key::composite([Key::ip(), header])
    } else {
        header
    };
    let missing = if input.reject_missing {
        Missing::Reject(StatusCode::UNAUTHORIZED)
    } else {
        Missing::Skip
    };
    let mut rule = Rule::new("api", key, Policy::fixed_window(Window::new(LIMIT, WINDOW)))
        .when_missing(missing)
        .tier("pro", Policy::fixed_window(Window::new(2 * LIMIT, WINDOW)))
        .tier_by_header("x-plan");
    // Listed keys need a rule keyed by the header alone.
    let premium = !input.composite;
    if premium {
        rule = rule
            .tier(
                "premium",
                Policy::fixed_window(Window::new(3 * LIMIT, WINDOW)),
            )
            .tier_keys("premium", ["gold"]);
    }
    let layer = RateLimitLayer::builder()
        .clock(clock.clone())
        .rule(rule)
        .build()
        .expect("the rule is valid");
    let mut service = layer.layer(Ok200);
    let mut used: HashMap<(&'static str, Vec<u8>), u64> = HashMap::new();
    let peer = SocketAddr::from(([192, 0, 2, 1], 40_000));

    for step in input.steps.iter().take(MAX_REQUESTS) {
        let lines = match step {
            Step::NextWindow => {
                clock.advance(WINDOW);
                used.clear();
                continue;
            }
            Step::Request(lines) => lines,
        };
        let mut req = Request::new(());
        req.extensions_mut().insert(peer);
        let (mut keys, mut plans) = (Vec::new(), Vec::new());
        for line in lines.iter().take(8) {
            let bytes = line.value.bytes();
            // A value the wire cannot carry never reaches the layer.
            let Ok(value) = HeaderValue::from_bytes(&bytes) else {
                continue;
            };
            let name = match line.name {
                Name::Key => "x-api-key",
                Name::KeyUpper => "X-API-Key",
                Name::Plan => "x-plan",
                Name::Other => "x-other",
            };
            match line.name {
                Name::Key | Name::KeyUpper => keys.push(bytes),
                Name::Plan => plans.push(bytes),
                Name::Other => {}
            }
            let name = HeaderName::from_bytes(name.as_bytes()).expect("a valid name");
            req.headers_mut().append(name, value);
        }
        let want = match keys.as_slice() {
            [] if input.reject_missing => StatusCode::UNAUTHORIZED,
            [] => StatusCode::OK,
            [key] => {
                let plans: Vec<&[u8]> = plans.iter().map(Vec::as_slice).collect();
                let (tier, limit) = tier(key, &plans, premium);
                let n = used.entry((tier, key.clone())).or_insert(0);
                if *n < limit {
                    *n += 1;
                    StatusCode::OK
                } else {
                    StatusCode::TOO_MANY_REQUESTS
                }
            }
            _ => StatusCode::BAD_REQUEST,
        };
        let got = answer(&mut service, req);
        assert_eq!(
            got, want,
            "key lines {keys:?}, plan lines {plans:?}: the layer answered {got}, the model {want}"
        );
    }
}

/// A waker that does nothing (`Waker::noop` is newer than the crate's
/// minimum Rust).
struct NoWake;

impl Wake for NoWake {
    fn wake(self: Arc<Self>) {}
}

/// The layer's answer: a local rule answers without waiting, so one poll
/// with a no-op waker is enough.
fn answer<S, F, B>(service: &mut S, req: Request<()>) -> StatusCode
where
    S: Service<Request<()>, Response = Response<B>, Error = Infallible, Future = F>,
    F: Future<Output = Result<Response<B>, Infallible>>,
{
    let waker = Waker::from(Arc::new(NoWake));
    let mut cx = Context::from_waker(&waker);
    assert!(service.poll_ready(&mut cx).is_ready());
    match pin!(service.call(req)).poll(&mut cx) {
        Poll::Ready(Ok(res)) => res.status(),
        Poll::Ready(Err(e)) => match e {},
        Poll::Pending => panic!("a local rule's answer must not wait"),
    }
}
