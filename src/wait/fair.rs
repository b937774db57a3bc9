//! Fair waiting (feature `wait`): waiters admitted in arrival order.
//!
//! A queue is a tokio `Mutex<()>`, whose waiters are served first in,
//! first out. Only the waiter holding it (the head) tries the limiter; the
//! others wait their turn without trying, so a stream of small requests
//! cannot overtake a large one, and a release wakes one waiter, not all.
//! Dropping a waiting future leaves the queue (tokio's lock is
//! cancellation-safe) and, at the head, hands the turn on.

use super::{Attempt, Wait, WaitError, Waited};
use crate::sync::{lock, Mutex};
use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;
use tokio::time::Instant;

type Queue = tokio::sync::Mutex<()>;

/// Waits on one limiter in arrival order. Opt-in: share one `FairQueue`
/// among the callers of one limiter (or one set of limits) and wait through
/// it instead of [`Wait::until`].
///
/// # Example
///
/// ```
/// use ratewall::wait::{FairQueue, Wait};
/// use ratewall::{Rate, TokenBucket};
/// use std::sync::Arc;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let bucket = Arc::new(TokenBucket::new(Rate::per_second(1000).burst(4))?);
/// let queue = Arc::new(FairQueue::new());
/// // A large request is served in its turn, before smaller ones that came later.
/// let big = queue.until(&Wait::new(), || bucket.check_n(4)).await?;
/// let small = queue.until(&Wait::new(), || bucket.check_n(1)).await?;
/// assert!(big.is_allowed() && small.is_allowed());
/// println!("{queue:?}");
/// # Ok(()) }
/// ```
#[derive(Default)]
pub struct FairQueue {
    queue: Queue,
}

impl FairQueue {
    /// An empty queue.
    ///
    /// ```
    /// # use ratewall::wait::FairQueue;
    /// let queue = FairQueue::new();
    /// # drop(queue);
    /// ```
    pub fn new() -> Self {
        FairQueue::default()
    }

    /// [`Wait::until`] in this queue's order: waits for the turns of the
    /// waiters that came earlier, then tries `attempt` until admitted. The
    /// timeout counts from this call, the time in the queue included.
    ///
    /// ```
    /// # use ratewall::wait::{FairQueue, Wait};
    /// # use ratewall::{Rate, TokenBucket};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let bucket = TokenBucket::new(Rate::per_second(1000).burst(1)).unwrap();
    /// let queue = FairQueue::new();
    /// assert!(queue.until(&Wait::new(), || bucket.check()).await.unwrap().is_allowed());
    /// # }
    /// ```
    pub async fn until<A: Attempt>(
        &self,
        wait: &Wait,
        mut attempt: impl FnMut() -> A,
    ) -> Waited<A> {
        self.until_async(wait, || std::future::ready(attempt()))
            .await
    }

    /// [`until`](Self::until) for a try that is itself async (a Redis
    /// check).
    ///
    /// ```
    /// # use ratewall::wait::{FairQueue, Wait};
    /// # use ratewall::{Rate, TokenBucket};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let bucket = TokenBucket::new(Rate::per_second(1000).burst(1)).unwrap();
    /// let queue = FairQueue::new();
    /// let d = queue.until_async(&Wait::new(), || async { bucket.check() }).await.unwrap();
    /// assert!(d.is_allowed());
    /// # }
    /// ```
    pub async fn until_async<F, Fut>(&self, wait: &Wait, attempt: F) -> Waited<Fut::Output>
    where
        F: FnMut() -> Fut,
        Fut: Future,
        Fut::Output: Attempt,
    {
        in_turn(&self.queue, wait, attempt).await
    }
}

impl fmt::Debug for FairQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FairQueue")
            .field("busy", &self.queue.try_lock().is_err())
            .finish()
    }
}

/// The one fair wait: take the queue's turn (within the deadline), then run
/// the wait loop while holding it.
async fn in_turn<F, Fut>(queue: &Queue, wait: &Wait, attempt: F) -> Waited<Fut::Output>
where
    F: FnMut() -> Fut,
    Fut: Future,
    Fut::Output: Attempt,
{
    let deadline = wait.deadline_from(Instant::now());
    let _turn = match deadline {
        Some(d) => tokio::time::timeout_at(d, queue.lock())
            .await
            .map_err(|_| WaitError::Deadline { last: None })?,
        None => queue.lock().await,
    };
    wait.run(deadline, attempt).await
}

/// Waits per key in arrival order: one FIFO queue per key that has waiters,
/// so a key's large request is not starved by its small ones, and keys do
/// not wait for each other. Memory is bounded: at most `max_keys` keys have
/// their own queue at once (a queue is dropped with its key's last waiter);
/// the waiters of further keys share one overflow queue (still in arrival
/// order, but behind each other).
///
/// # Example
///
/// ```
/// use ratewall::wait::{FairKeys, Wait};
/// use ratewall::{KeyedTokenBucket, Rate};
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let per_host = KeyedTokenBucket::<String>::builder(Rate::per_second(1000).burst(2)).build()?;
/// let queues = FairKeys::<String>::new(10_000);
/// let wait = Wait::new().timeout(Duration::from_secs(1));
/// let host = "api.example.com".to_string();
/// let d = queues.until(&host, &wait, || per_host.check_key_n(&host, 2)).await?;
/// assert!(d.is_allowed());
/// assert_eq!(queues.queued_keys(), 0); // nobody waits: no queue kept
/// # Ok(()) }
/// ```
pub struct FairKeys<K> {
    queues: Mutex<HashMap<K, Arc<Queue>>>,
    overflow: Arc<Queue>,
    max_keys: usize,
}

impl<K: Hash + Eq + Clone> FairKeys<K> {
    /// Per-key queues for at most `max_keys` keys at once (0: every key
    /// shares the overflow queue, a single fair queue).
    ///
    /// ```
    /// # use ratewall::wait::FairKeys;
    /// let queues = FairKeys::<u64>::new(1024);
    /// assert_eq!(queues.max_keys(), 1024);
    /// ```
    pub fn new(max_keys: usize) -> Self {
        FairKeys {
            queues: Mutex::new(HashMap::new()),
            overflow: Arc::new(Queue::new(())),
            max_keys,
        }
    }

    /// The most keys with their own queue at once.
    ///
    /// ```
    /// # use ratewall::wait::FairKeys;
    /// assert_eq!(FairKeys::<u64>::new(8).max_keys(), 8);
    /// ```
    pub fn max_keys(&self) -> usize {
        self.max_keys
    }

    /// Keys that have their own queue now (those with a waiter).
    ///
    /// ```
    /// # use ratewall::wait::FairKeys;
    /// assert_eq!(FairKeys::<u64>::new(8).queued_keys(), 0);
    /// ```
    pub fn queued_keys(&self) -> usize {
        lock(&self.queues).len()
    }

    /// [`Wait::until`] in `key`'s arrival order (see [`FairQueue::until`]).
    ///
    /// ```
    /// # use ratewall::wait::{FairKeys, Wait};
    /// # use ratewall::{KeyedTokenBucket, Rate};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let l = KeyedTokenBucket::<u32>::builder(Rate::per_second(1000)).build().unwrap();
    /// let queues = FairKeys::new(100);
    /// assert!(queues.until(&1, &Wait::new(), || l.check_key(&1)).await.unwrap().is_allowed());
    /// # }
    /// ```
    pub async fn until<A: Attempt>(
        &self,
        key: &K,
        wait: &Wait,
        mut attempt: impl FnMut() -> A,
    ) -> Waited<A> {
        self.until_async(key, wait, || std::future::ready(attempt()))
            .await
    }

    /// [`until`](Self::until) for a try that is itself async (a Redis
    /// check).
    ///
    /// ```
    /// # use ratewall::wait::{FairKeys, Wait};
    /// # use ratewall::{KeyedTokenBucket, Rate};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let l = KeyedTokenBucket::<u32>::builder(Rate::per_second(1000)).build().unwrap();
    /// let queues = FairKeys::new(100);
    /// let d = queues.until_async(&1, &Wait::new(), || async { l.check_key(&1) }).await.unwrap();
    /// assert!(d.is_allowed());
    /// # }
    /// ```
    pub async fn until_async<F, Fut>(&self, key: &K, wait: &Wait, attempt: F) -> Waited<Fut::Output>
    where
        F: FnMut() -> Fut,
        Fut: Future,
        Fut::Output: Attempt,
    {
        let place = self.enter(key);
        in_turn(&place.queue, wait, attempt).await
        // `place` drops here (or when the future is dropped): the key's queue
        // goes with its last waiter.
    }

    /// `key`'s queue, made if it has none and there is room.
    fn enter(&self, key: &K) -> Place<'_, K> {
        let mut queues = lock(&self.queues);
        if let Some(q) = queues.get(key) {
            return Place {
                keys: self,
                key: Some(key.clone()),
                queue: Arc::clone(q),
            };
        }
        if queues.len() >= self.max_keys {
            return Place {
                keys: self,
                key: None,
                queue: Arc::clone(&self.overflow),
            };
        }
        let queue = Arc::new(Queue::new(()));
        queues.insert(key.clone(), Arc::clone(&queue));
        Place {
            keys: self,
            key: Some(key.clone()),
            queue,
        }
    }
}

impl<K> fmt::Debug for FairKeys<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FairKeys")
            .field("queued_keys", &lock(&self.queues).len())
            .field("max_keys", &self.max_keys)
            .finish()
    }
}

/// A waiter's place in its key's queue; leaving removes the queue if this
/// was its last waiter.
struct Place<'a, K: Hash + Eq> {
    keys: &'a FairKeys<K>,
    /// `None` for the overflow queue.
    key: Option<K>,
    queue: Arc<Queue>,
}

impl<K: Hash + Eq> Drop for Place<'_, K> {
    fn drop(&mut self) {
        let Some(key) = &self.key else { return };
        let mut queues = lock(&self.keys.queues);
        // Every clone of a key's queue is made under this lock, so the count
        // is exact here: 2 is the map's and ours.
        if Arc::strong_count(&self.queue) == 2 {
            queues.remove(key);
        }
    }
}
