//! The agent's events for Nomad's event stream (`GET /v1/event/stream`): a job
//! registered or deregistered, an alloc placed or changed, this node registered. Each
//! carries the change index it happened at and a snapshot of the object then.
//!
//! Bounded both ways: the last [`KEPT`] events are kept for a reader that asks from an
//! index (`?index=`), and live readers share one broadcast of [`LIVE`] slots. A reader
//! that falls more than that behind is told how many it missed
//! ([`Received::Missed`]) and never makes the agent hold more.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::sync::broadcast;

use super::JobStatus;
use crate::alloc_runner::AllocStatus;
use berth_jobspec::Job;

/// Events kept for readers that ask from an index.
pub const KEPT: usize = 256;
/// Events a live reader may be behind before it misses some.
pub const LIVE: usize = 1024;

/// Nomad's topics that berth has events for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topic {
    Job,
    Allocation,
    Node,
}

impl Topic {
    pub fn name(self) -> &'static str {
        match self {
            Topic::Job => "Job",
            Topic::Allocation => "Allocation",
            Topic::Node => "Node",
        }
    }
}

/// The object an event is about, as it was when the event happened.
#[derive(Debug, Clone)]
pub enum Payload {
    Job { status: JobStatus, job: Arc<Job> },
    Allocation(Box<AllocStatus>),
    Node,
}

#[derive(Debug, Clone)]
pub struct ClusterEvent {
    /// The change index after the change.
    pub index: u64,
    pub topic: Topic,
    /// Nomad's event type: `JobRegistered`, `JobDeregistered`, `AllocationUpdated`,
    /// `AllocationUpdateDesiredStatus`, `NodeRegistration`.
    pub kind: &'static str,
    /// The id of the object (a job's, an alloc's, the node's).
    pub key: String,
    /// Other keys a reader may filter on: an alloc's job.
    pub filter_keys: Vec<String>,
    pub payload: Payload,
}

/// What a live reader gets next.
#[derive(Debug)]
pub enum Received {
    Event(Arc<ClusterEvent>),
    /// The reader fell behind and this many events were dropped for it.
    Missed(u64),
    /// The agent is gone.
    Closed,
}

pub struct EventHub {
    kept: Mutex<VecDeque<Arc<ClusterEvent>>>,
    live: broadcast::Sender<Arc<ClusterEvent>>,
}

impl Default for EventHub {
    fn default() -> Self {
        EventHub {
            kept: Mutex::new(VecDeque::with_capacity(KEPT)),
            live: broadcast::Sender::new(LIVE),
        }
    }
}

/// A reader of the events: those kept from its index, then live ones.
pub struct Subscription {
    backlog: VecDeque<Arc<ClusterEvent>>,
    live: broadcast::Receiver<Arc<ClusterEvent>>,
}

impl Subscription {
    pub async fn next(&mut self) -> Received {
        if let Some(event) = self.backlog.pop_front() {
            return Received::Event(event);
        }
        match self.live.recv().await {
            Ok(event) => Received::Event(event),
            Err(broadcast::error::RecvError::Lagged(missed)) => Received::Missed(missed),
            Err(broadcast::error::RecvError::Closed) => Received::Closed,
        }
    }
}

impl EventHub {
    pub fn publish(&self, event: ClusterEvent) {
        let event = Arc::new(event);
        // Kept and sent under one lock, so a new reader sees each event once: in its
        // backlog or live.
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        if kept.len() == KEPT {
            kept.pop_front();
        }
        kept.push_back(event.clone());
        let _ = self.live.send(event);
    }

    /// Events from `from_index` on (those still kept), then every new one; with no
    /// index, only new ones.
    pub fn subscribe(&self, from_index: Option<u64>) -> Subscription {
        let kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        let backlog = match from_index {
            None => VecDeque::new(),
            Some(from) => kept.iter().filter(|e| e.index >= from).cloned().collect(),
        };
        Subscription {
            backlog,
            live: self.live.subscribe(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node_event(index: u64) -> ClusterEvent {
        ClusterEvent {
            index,
            topic: Topic::Node,
            kind: "NodeRegistration",
            key: "n".into(),
            filter_keys: Vec::new(),
            payload: Payload::Node,
        }
    }

    #[tokio::test]
    async fn a_reader_gets_kept_events_from_its_index_then_live_ones_each_once() {
        let hub = EventHub::default();
        for index in 1..=3 {
            hub.publish(node_event(index));
        }
        let mut from_two = hub.subscribe(Some(2));
        let mut from_now = hub.subscribe(None);
        hub.publish(node_event(4));
        let mut seen = Vec::new();
        for _ in 0..3 {
            match from_two.next().await {
                Received::Event(event) => seen.push(event.index),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(seen, [2, 3, 4]);
        assert!(matches!(from_now.next().await, Received::Event(e) if e.index == 4));
    }

    #[tokio::test]
    async fn a_slow_reader_is_told_what_it_missed_and_memory_stays_bounded() {
        let hub = EventHub::default();
        let mut slow = hub.subscribe(None);
        let total = (LIVE + 10) as u64;
        for index in 1..=total {
            hub.publish(node_event(index));
        }
        assert_eq!(hub.kept.lock().unwrap().len(), KEPT);
        assert!(matches!(slow.next().await, Received::Missed(10)));
        assert!(matches!(slow.next().await, Received::Event(e) if e.index == 11));
    }
}
