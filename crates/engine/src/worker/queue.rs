//! The requests waiting for admission: each a group of sequences sharing a prompt
//! ([`Pending`]), counted once per submission in the queue's bound ([`QueueSlot`]), taken
//! in turn request by request ([`WaitQueue::admission_order`]), and dropped when their
//! clients left, their deadline passed or everything is aborted.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use super::stats::EngineStats;
use crate::running::Followers;
use crate::scheduler::WaitingView;
use crate::sequence::{EventSender, SequenceEvent, SequenceRequest};

/// A request waiting for admission: its first sequence and the choices that share its
/// prompt.
pub(super) struct Pending {
    pub request: Box<SequenceRequest>,
    pub events: EventSender,
    pub followers: Followers,
    /// The submission this group belongs to, shared by its groups: it counts once in
    /// the waiting queue's bound, until its last group leaves the queue.
    pub slot: Arc<QueueSlot>,
}

/// One submission's place in the waiting queue's count: dropped with the last of its
/// groups to leave the queue (admitted, abandoned, late, aborted, or never delivered).
pub(super) struct QueueSlot {
    stats: Arc<EngineStats>,
    /// The submission's number, which its sequences carry while they run.
    pub request: u64,
}

/// Numbers submissions ([`QueueSlot::request`]).
static NEXT_REQUEST: AtomicU64 = AtomicU64::new(0);

impl QueueSlot {
    /// The next submission's place, counted in `stats` (the caller has counted it).
    pub fn new(stats: Arc<EngineStats>) -> Arc<Self> {
        Arc::new(Self {
            stats,
            request: NEXT_REQUEST.fetch_add(1, Ordering::Relaxed),
        })
    }
}

impl Drop for QueueSlot {
    fn drop(&mut self) {
        self.stats.leave_queue();
    }
}

impl Pending {
    /// What the scheduler sees of it.
    pub fn view(&self) -> WaitingView {
        WaitingView {
            need: self.request.kv_need()
                + self
                    .followers
                    .iter()
                    .map(|(r, _)| r.kv_need())
                    .sum::<usize>(),
            sequences: 1 + self.followers.len(),
            request: self.slot.request,
        }
    }

    /// Whether every one of its sequences' clients went away.
    pub fn is_abandoned(&self) -> bool {
        self.events.is_closed() && self.followers.iter().all(|(_, e)| e.is_closed())
    }

    /// Whether its deadline has passed.
    pub fn is_late(&self, now: Instant) -> bool {
        self.request.deadline.is_some_and(|d| now >= d)
    }

    /// Sends `event` to every sequence of the request.
    pub fn end(self, event: SequenceEvent) {
        for (_, events) in &self.followers {
            events.send(event.clone());
        }
        self.events.send(event);
    }
}

/// The waiting queue, oldest group first.
#[derive(Default)]
pub(super) struct WaitQueue(VecDeque<Pending>);

impl WaitQueue {
    /// Groups waiting.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether none waits.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Queues a group behind the others.
    pub fn push(&mut self, pending: Pending) {
        self.0.push_back(pending);
    }

    /// Ends every waiting group with `event`.
    pub fn end_all(&mut self, event: SequenceEvent) {
        for pending in self.0.drain(..) {
            pending.end(event.clone());
        }
    }

    /// Drops the groups whose clients all went away; how many.
    pub fn drop_abandoned(&mut self) -> usize {
        let before = self.0.len();
        self.0.retain(|p| !p.is_abandoned());
        before - self.0.len()
    }

    /// Ends the groups whose deadline has passed by `now` ([`SequenceEvent::TimedOut`]);
    /// how many.
    pub fn end_late(&mut self, now: Instant) -> u64 {
        let (keep, gone): (VecDeque<Pending>, VecDeque<Pending>) =
            self.0.drain(..).partition(|p| !p.is_late(now));
        self.0 = keep;
        let late = gone.len() as u64;
        for pending in gone {
            pending.end(SequenceEvent::TimedOut);
        }
        late
    }

    /// Indices into the queue in admission order: the first group of every waiting
    /// request (oldest first), then the second of each, and so on.
    pub fn admission_order(&self) -> Vec<usize> {
        let mut requests: Vec<Vec<usize>> = Vec::new();
        let mut index: HashMap<*const QueueSlot, usize> = HashMap::new();
        for (i, pending) in self.0.iter().enumerate() {
            let r = *index.entry(Arc::as_ptr(&pending.slot)).or_insert_with(|| {
                requests.push(Vec::new());
                requests.len() - 1
            });
            requests[r].push(i);
        }
        let mut order = Vec::with_capacity(self.0.len());
        let mut round = 0;
        while order.len() < self.0.len() {
            order.extend(requests.iter().filter_map(|groups| groups.get(round)));
            round += 1;
        }
        order
    }

    /// The scheduler's view of the groups at `order`'s indices.
    pub fn views(&self, order: &[usize]) -> Vec<WaitingView> {
        order.iter().map(|&i| self.0[i].view()).collect()
    }

    /// Takes the groups at indices `taken` (each once) out of the queue, in that order;
    /// the others keep theirs.
    pub fn take(&mut self, taken: impl IntoIterator<Item = usize>) -> Vec<Pending> {
        let mut queue: Vec<Option<Pending>> = self.0.drain(..).map(Some).collect();
        let out = taken
            .into_iter()
            .map(|i| queue[i].take().expect("each group is taken once"))
            .collect();
        self.0 = queue.into_iter().flatten().collect();
        out
    }
}
