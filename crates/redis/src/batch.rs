//! Batching across requests: while earlier program calls are in flight, the requests that
//! arrive meanwhile wait here and go to Redis together, as one call of the batch program
//! (`lua/lib/batch.lua`), which decides each of them on its own, atomically, in order — the
//! same as one composite call per request, one after the other. Redis parses, dispatches and
//! replies once per batch instead of once per request.
//!
//! No request waits for a batch to fill: with fewer than `window` calls in flight a request
//! is sent at once, alone, exactly as without batching. Only when the window is full do
//! requests queue, and the first call to complete takes up to `max_members` of them. A queued
//! request whose budget has passed is answered without being sent (nothing consumed). Each
//! member carries its own deadline to Redis, past which the program does nothing for it, and
//! times out at its own reply deadline as a single command would (indeterminate: it may have
//! run). The batch's reply is awaited until the latest member's reply deadline, so a member that queued late still gets its answer (consumed or not) when
//! the batch's earliest member has already timed out.
//!
//! A batch fails as one command does: no connection (nothing sent), a lost connection
//! (indeterminate for every member still waiting: any of them may have run), an error reply.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use ::redis::Value;
use tokio::runtime::Handle;
use tokio::sync::oneshot;

use edgelimit_contract::{IndeterminateCause, UnavailableCause};

use crate::classify::{classify, Failure};
use crate::connections::Connections;
use crate::programs::{batch_invocation, BatchMember, Programs};

/// What a request gets back from its batch: the reply its own call would have had (an array
/// of its checks' replies, or one reply for a request of one limit), or the batch's failure;
/// and when the batch completed.
pub type Answer = (Result<Value, Failure>, Instant);

struct Waiting {
    member: BatchMember,
    /// The request had one limit: its reply is unwrapped from the member's array.
    single: bool,
    /// Past its budget it is answered without being sent.
    send_by: Instant,
    /// Once sent, its reply is awaited until then (`admission::reply_deadline`).
    reply_by: Instant,
    answer: oneshot::Sender<Answer>,
}

#[derive(Default)]
struct Queue {
    in_flight: usize,
    waiting: VecDeque<Waiting>,
}

pub struct Batcher {
    queue: Mutex<Queue>,
    /// Program calls in flight at once before requests queue.
    window: usize,
    max_members: usize,
    connections: Arc<Connections>,
    programs: Arc<Programs>,
    io: Handle,
    size: metrics::Histogram,
}

/// A call in flight outside a batch; releasing it (on drop) sends what queued meanwhile.
pub struct Slot {
    batcher: Arc<Batcher>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        Batcher::release(&self.batcher);
    }
}

impl Batcher {
    pub fn new(
        window: usize,
        max_members: usize,
        connections: Arc<Connections>,
        programs: Arc<Programs>,
        io: Handle,
    ) -> Arc<Self> {
        Arc::new(Self {
            queue: Mutex::new(Queue::default()),
            window: window.max(1),
            max_members: max_members.max(1),
            connections,
            programs,
            io,
            size: metrics::histogram!(edgelimit_metrics::REDIS_BATCH_REQUESTS),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        // The queue holds no invariant a panic elsewhere could break half-way.
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A turn to send alone, when fewer than `window` calls are in flight.
    pub fn try_alone(this: &Arc<Self>) -> Option<Slot> {
        let mut queue = this.lock();
        if queue.in_flight < this.window {
            queue.in_flight += 1;
            Some(Slot {
                batcher: this.clone(),
            })
        } else {
            None
        }
    }

    /// Queues a request for the next batch and waits for its answer.
    pub async fn queue(
        this: &Arc<Self>,
        member: BatchMember,
        single: bool,
        send_by: Instant,
        reply_by: Instant,
    ) -> Answer {
        let (answer, answered) = oneshot::channel();
        let start = {
            let mut queue = this.lock();
            queue.waiting.push_back(Waiting {
                member,
                single,
                send_by,
                reply_by,
                answer,
            });
            // A call completed between the caller's try and now: nobody would take the queue.
            if queue.in_flight < this.window {
                queue.in_flight += 1;
                Some(this.take(&mut queue))
            } else {
                None
            }
        };
        if let Some(batch) = start {
            this.io.spawn(Self::run(this.clone(), batch));
        }
        answered.await.unwrap_or((
            Err(Failure::Indeterminate(IndeterminateCause::ConnectionLost)),
            Instant::now(),
        ))
    }

    fn take(&self, queue: &mut Queue) -> Vec<Waiting> {
        let n = queue.waiting.len().min(self.max_members);
        queue.waiting.drain(..n).collect()
    }

    /// A call completed: its turn passes to what queued meanwhile, or is given back.
    fn release(this: &Arc<Self>) {
        if let Some(batch) = this.pass_turn() {
            this.io.spawn(Self::run(this.clone(), batch));
        }
    }

    /// The next batch for a turn that just ended, or none (and the turn is given back).
    fn pass_turn(&self) -> Option<Vec<Waiting>> {
        let mut queue = self.lock();
        if queue.waiting.is_empty() {
            queue.in_flight = queue.in_flight.saturating_sub(1);
            None
        } else {
            Some(self.take(&mut queue))
        }
    }

    /// Sends batches on the I/O thread until the queue is empty, then gives the turn back.
    async fn run(this: Arc<Self>, mut batch: Vec<Waiting>) {
        loop {
            this.send(batch).await;
            match this.pass_turn() {
                Some(more) => batch = more,
                None => return,
            }
        }
    }

    async fn send(&self, batch: Vec<Waiting>) {
        let now = Instant::now();
        let (late, batch): (Vec<_>, Vec<_>) = batch.into_iter().partition(|w| w.send_by <= now);
        for waiting in late {
            let _ = waiting.answer.send((
                Err(Failure::Unavailable(UnavailableCause::ExpiredInQueue)),
                now,
            ));
        }
        if batch.is_empty() {
            return;
        }
        self.size.record(batch.len() as f64);
        let Some(live) = self.connections.pick() else {
            let failure = Failure::Unavailable(UnavailableCause::ConnectFailed);
            for waiting in batch {
                let _ = waiting.answer.send((Err(failure), now));
            }
            return;
        };
        let mut members = Vec::with_capacity(batch.len());
        let mut deadlines = Vec::with_capacity(batch.len());
        let mut waiters = Vec::with_capacity(batch.len());
        for waiting in batch {
            members.push(waiting.member);
            deadlines.push(waiting.reply_by);
            waiters.push(Some((waiting.single, waiting.answer)));
        }
        let program = self.programs.batch();
        let call = async {
            let members: Vec<&BatchMember> = members.iter().collect();
            let mut with_source = false;
            loop {
                let cmd = batch_invocation(program, with_source, &members);
                let mut link = live.link.clone();
                match link.send(&cmd).await.and_then(Value::extract_error) {
                    Ok(value) => return Ok(value),
                    Err(error)
                        if !with_source
                            && error.kind()
                                == ::redis::ErrorKind::Server(
                                    ::redis::ServerErrorKind::NoScript,
                                ) =>
                    {
                        program.noscript_resends().increment(1);
                        with_source = true;
                    }
                    Err(error) => {
                        let failure = classify(&error);
                        if live.link.broken_by(&error) {
                            self.connections.mark_broken(&live);
                        }
                        tracing::debug!(%error, ?failure, "redis batch failed");
                        return Err(failure);
                    }
                }
            }
        };
        tokio::pin!(call);
        // Members time out one by one at their own deadlines, earliest first; the reply is
        // awaited until the last of them.
        let mut by_deadline: Vec<usize> = (0..deadlines.len()).collect();
        by_deadline.sort_by_key(|&i| deadlines[i]);
        let mut result = Err(Failure::Indeterminate(IndeterminateCause::Timeout));
        for (n, &i) in by_deadline.iter().enumerate() {
            match tokio::time::timeout_at(deadlines[i].into(), call.as_mut()).await {
                Ok(reply) => {
                    result = reply;
                    break;
                }
                Err(_) => {
                    if let Some((_, answer)) = waiters[i].take() {
                        let _ = answer.send((
                            Err(Failure::Indeterminate(IndeterminateCause::Timeout)),
                            Instant::now(),
                        ));
                    }
                    if n + 1 == by_deadline.len() {
                        self.connections.suspect(&live);
                    }
                }
            }
        }
        let finished = Instant::now();
        program
            .latency()
            .record(finished.saturating_duration_since(now).as_secs_f64());
        let waiting = waiters.into_iter();
        match result {
            Ok(Value::Array(replies)) if replies.len() == members.len() => {
                for (waiter, reply) in waiting.zip(replies) {
                    let Some((single, answer)) = waiter else {
                        continue;
                    };
                    let reply = match reply {
                        Value::Array(mut one) if single && one.len() == 1 => one.remove(0),
                        other => other,
                    };
                    let _ = answer.send((Ok(reply), finished));
                }
            }
            // A refusal of the whole batch (or a reply of the wrong shape): each member parses
            // it as its own and finds it incompatible.
            Ok(other) => {
                for (_, answer) in waiting.flatten() {
                    let _ = answer.send((Ok(other.clone()), finished));
                }
            }
            Err(failure) => {
                for (_, answer) in waiting.flatten() {
                    let _ = answer.send((Err(failure), finished));
                }
            }
        }
    }
}
