//! Batching: single-key calls made while earlier ones are on the wire go to
//! Redis together, as one script call (`lua/batch.lua`).
//!
//! # Protocol
//!
//! One mutex guards the queue and the count of batches in flight. A caller
//! that finds nothing in flight and nothing queued sends its call itself,
//! holding a slot; when it is done (or dropped), if calls queued meanwhile,
//! a runner inherits the slot. Otherwise a caller pushes its call and, if
//! fewer than `in_flight` batches are out, takes a slot and spawns a
//! **runner** task. A runner takes the queue (up to `max_batch` calls,
//! oldest first) when it runs and sends them in the same poll, so calls go
//! on the wire in the order they left the queue; it hands out the replies
//! and goes on, under its slot, until it finds the queue empty; then it
//! gives the slot back, under the same lock. So a queued call is always
//! either taken by a runner that holds a slot or finds a free slot itself:
//! none is stranded. The runner is a task of its own, so a caller that goes
//! away (a dropped request future) never takes the others' calls with it.
//!
//! A call alone is sent as its algorithm's own script (the same call as
//! without batching). A batch of several runs them in arrival order at one
//! server time; each gets the decision it would have got alone at that
//! time, and a failure of one (a key that holds another policy's state) is
//! that call's error only. On a Cluster, a batch is split by hash slot (a
//! script's keys must share one) and the parts are sent in parallel.
//!
//! Every call is bounded by the per-call timeout from the moment it is
//! made, queueing included. A call whose caller gave up before its batch
//! went out is not sent.

use super::connection::Link;
use super::fault::Fault;
use super::script::BATCH;
use super::wire::{batch_command, batch_entry, Call};
use super::RedisError;
use crate::decision::Decision;
use redis::cluster_routing::Slot;
use redis::Value;
use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::oneshot;

struct Queued {
    call: Call,
    reply: oneshot::Sender<Result<Decision, RedisError>>,
}

struct State {
    queue: VecDeque<Queued>,
    /// Runners alive; each holds one slot.
    running: usize,
}

/// The batching front of a backend's connection.
pub(crate) struct Batcher {
    link: Arc<Link>,
    state: Arc<Mutex<State>>,
    max_batch: usize,
    in_flight: usize,
}

impl Batcher {
    pub(crate) fn new(link: Arc<Link>, max_batch: usize, in_flight: usize) -> Self {
        Batcher {
            link,
            state: Arc::new(Mutex::new(State {
                queue: VecDeque::new(),
                running: 0,
            })),
            max_batch: max_batch.max(1),
            in_flight: in_flight.max(1),
        }
    }

    pub(crate) async fn call(&self, call: Call) -> Result<Decision, RedisError> {
        // The runner is spawned on the caller's runtime.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return Err(RedisError::NoRuntime);
        };
        if self.try_inline() {
            // Nothing was on the wire: send this call now, from this task,
            // holding a slot so that calls made meanwhile queue.
            let slot = InlineSlot {
                batcher: self,
                runtime,
            };
            let reply = self.link.send(&call).await;
            drop(slot);
            return reply;
        }
        let (tx, rx) = oneshot::channel();
        let spawn = {
            let mut state = lock(&self.state);
            state.queue.push_back(Queued { call, reply: tx });
            let free = state.running < self.in_flight;
            if free {
                state.running += 1;
            }
            free
        };
        if spawn {
            self.spawn_runner(&runtime);
        }
        match tokio::time::timeout(self.link.timeout(), rx).await {
            Ok(Ok(reply)) => reply,
            // The runner was dropped with the call (its runtime shut down).
            Ok(Err(_)) => Err(RedisError::Unavailable {
                retry_in: std::time::Duration::ZERO,
                cause: "the runtime running the call shut down".into(),
            }),
            Err(_) => Err(self.link.timed_out()),
        }
    }
}

impl Batcher {
    /// Takes a slot for an inline call if nothing is in flight or queued.
    fn try_inline(&self) -> bool {
        let mut state = lock(&self.state);
        let idle = state.running == 0 && state.queue.is_empty();
        if idle {
            state.running = 1;
        }
        idle
    }

    /// A runner for a slot already counted in `running`. It takes the
    /// queue when it first runs: calls leave the queue in the order they
    /// go on the wire (a batch taken here, but sent later by a task not yet
    /// started, could be overtaken by a running runner's next batch).
    fn spawn_runner(&self, runtime: &tokio::runtime::Handle) {
        let runner = Runner {
            link: self.link.clone(),
            // The slot's guard exists before the task does: a task dropped
            // before it first runs (its runtime shutting down) gives the
            // slot back too.
            slot: RunnerSlot {
                state: self.state.clone(),
                held: true,
            },
            state: self.state.clone(),
            max_batch: self.max_batch,
        };
        runtime.spawn(runner.run());
    }
}

/// The slot of a call sent inline. When the call ends (or its future is
/// dropped), the calls that queued meanwhile go to a runner that inherits
/// the slot; if none did, the slot is freed.
struct InlineSlot<'a> {
    batcher: &'a Batcher,
    runtime: tokio::runtime::Handle,
}

impl Drop for InlineSlot<'_> {
    fn drop(&mut self) {
        let b = self.batcher;
        let hand_on = {
            let mut state = lock(&b.state);
            let waiting = !state.queue.is_empty();
            if !waiting {
                state.running -= 1;
            }
            waiting
        };
        if hand_on {
            b.spawn_runner(&self.runtime);
        }
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    // The state stays consistent under a panic (each change is one push,
    // one drain or one counter step), so a poisoned lock is still usable.
    state.lock().unwrap_or_else(|e| e.into_inner())
}

/// Up to `max` queued calls, oldest first, leaving out those whose caller
/// gave up (timed out or dropped).
fn take(state: &mut State, max: usize) -> Vec<Queued> {
    let mut batch = Vec::with_capacity(state.queue.len().min(max));
    while batch.len() < max {
        let Some(q) = state.queue.pop_front() else {
            break;
        };
        if !q.reply.is_closed() {
            batch.push(q);
        }
    }
    batch
}

/// What calls must share to go in one script call: the hash slot on a
/// Cluster (and in the unit tests, the time they run at).
#[cfg(not(test))]
type Group = Option<Slot>;
#[cfg(test)]
type Group = (Option<Slot>, Option<u64>);

fn group(cluster: bool, call: &Call) -> Group {
    let slot = cluster.then(|| Slot::for_key(&call.key));
    #[cfg(test)]
    let slot = (slot, call.now_us);
    slot
}

struct Runner {
    link: Arc<Link>,
    slot: RunnerSlot,
    state: Arc<Mutex<State>>,
    max_batch: usize,
}

impl Runner {
    async fn run(mut self) {
        // `self.slot` gives the slot back if the task ends any other way
        // (its runtime shuts down), so the backend never runs out of slots.
        loop {
            let batch = {
                let mut state = lock(&self.state);
                let batch = take(&mut state, self.max_batch);
                if batch.is_empty() {
                    // Under the lock: a caller that pushes after this sees
                    // the free slot.
                    state.running -= 1;
                    self.slot.held = false;
                    return;
                }
                batch
            };
            // Sent in this poll (the connection queues the command before
            // the first await that can wait), so batches go on the wire in
            // the order they left the queue.
            self.send(batch).await;
            // Let the callers just answered run first: those that check
            // again queue now, and go out together in the next batch
            // instead of one of them alone, ahead of the rest.
            tokio::task::yield_now().await;
        }
    }

    async fn send(&self, batch: Vec<Queued>) {
        // One script call per hash slot on a Cluster: a script's keys must
        // share one slot (and in the unit tests, a batch runs at one time).
        let cluster = self.link.is_cluster();
        let mut groups: Vec<(Group, Vec<Queued>)> = Vec::new();
        for q in batch {
            let group = group(cluster, &q.call);
            match groups.iter_mut().find(|(g, _)| *g == group) {
                Some((_, g)) => g.push(q),
                None => groups.push((group, vec![q])),
            }
        }
        if groups.len() == 1 {
            let (_, g) = groups.pop().expect("one group");
            return self.send_one(g).await;
        }
        futures_util::future::join_all(groups.into_iter().map(|(_, g)| self.send_one(g))).await;
    }

    /// One script call for `batch` (keys on one server or one slot).
    async fn send_one(&self, mut batch: Vec<Queued>) {
        #[cfg(feature = "metrics")]
        self.link.metrics().batch(batch.len());
        if batch.len() == 1 {
            let q = batch.pop().expect("one call");
            let reply = self.link.send(&q.call).await;
            let _ = q.reply.send(reply);
            return;
        }
        let cmd = batch_command(&batch, |q| &q.call);
        let width: usize = batch.iter().map(|q| q.call.reply_width()).sum();
        // Each call's answer is read, and sent to its caller, inside the
        // breaker's accounting. A batch in which the store failed some calls
        // (an `OOM` on one key's write, say) counts as one failure; those
        // calls wait in `failed` for the breaker's `retry_in`, and the calls
        // it did decide keep their decisions. Nothing is allocated unless a
        // call failed.
        let mut failed: Vec<(Queued, String)> = Vec::new();
        let read = |reply: Value| match reply {
            Value::Array(items) if items.len() == width => {
                let mut items = items.into_iter();
                for q in batch.drain(..) {
                    let answer = match batch_entry(&q.call, &mut items) {
                        Ok(d) => Ok(d),
                        Err(Fault::Caller(message)) => Err(RedisError::Server { message }),
                        Err(Fault::Store(cause)) => {
                            failed.push((q, cause));
                            continue;
                        }
                    };
                    let _ = q.reply.send(answer);
                }
                match failed.first() {
                    Some((_, cause)) => Err(Fault::Store(cause.clone())),
                    None => Ok(()),
                }
            }
            other => Err(super::fault::bad_reply("batch", &other)),
        };
        let Err(e) = self.link.evalsha(&BATCH, &cmd, read).await else {
            return; // every call was answered
        };
        // No reply, or not the batch's: the calls not read fail alike.
        for q in batch {
            let _ = q.reply.send(Err(e.clone()));
        }
        // The breaker counted the batch's failure: when Redis is tried again.
        let retry_in = match e {
            RedisError::Unavailable { retry_in, .. } => retry_in,
            _ => std::time::Duration::ZERO,
        };
        for (q, cause) in failed {
            let _ = q
                .reply
                .send(Err(RedisError::Unavailable { retry_in, cause }));
        }
    }
}

/// A runner's slot, given back on drop unless already given back.
struct RunnerSlot {
    state: Arc<Mutex<State>>,
    held: bool,
}

impl Drop for RunnerSlot {
    fn drop(&mut self) {
        if self.held {
            lock(&self.state).running -= 1;
        }
    }
}

impl fmt::Debug for Batcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Batcher")
            .field("max_batch", &self.max_batch)
            .field("in_flight", &self.in_flight)
            .finish()
    }
}
