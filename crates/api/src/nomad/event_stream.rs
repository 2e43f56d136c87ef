//! `GET /v1/event/stream`: Nomad's event stream, newline-delimited JSON. Each line is
//! `{"Index": N, "Events": [{"Topic", "Type", "Key", "Namespace", "FilterKeys", "Index",
//! "Payload": {"Job" | "Allocation" | "Node": ...}}]}`, and `{}` after [`HEARTBEAT`] with
//! nothing to send, as Nomad's.
//!
//! `?topic=Topic:Key` (repeatable; `Job:*`, `Allocation:<alloc id or job id>`, `*:*`; a
//! topic alone means every key) chooses the events; without it, every event. `?index=N`
//! starts with the events the agent still keeps from index `N` on (its last
//! [`berth_client::agent::event_hub::KEPT`]); without it, the stream starts now.
//!
//! berth's events: `JobRegistered` (a job submitted), `JobDeregistered` (stopped, and
//! again when purged), `AllocationUpdated` (an alloc placed, each task event, its end),
//! `AllocationUpdateDesiredStatus` (an alloc asked to stop), `NodeRegistration` (the
//! agent started). Payloads are the shapes of the other endpoints (`shapes.rs`), as the
//! object was when the event happened.
//!
//! A reader that falls [`berth_client::agent::event_hub::LIVE`] events behind gets a last line
//! `{"Error": "..."}` saying so and the stream ends: the agent never holds more for it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Query, State};
use axum::response::Response;

use super::cluster::{node_stub, this_node_record};
use super::shapes::{self, ThisNode};
use super::streams::{self, Ended, Feed};
use super::{NomadError, bad_request};
use berth_client::agent::Agent;
use berth_client::agent::event_hub::{ClusterEvent, Payload, Received, Subscription, Topic};
use berth_nomad_api::agent::{Event, EventPayload, EventStreamClosed, Events};
use berth_nomad_api::allocs::Allocation;

/// A line `{}` after this long with nothing sent, as Nomad's.
pub const HEARTBEAT: Duration = Duration::from_secs(10);

/// One `topic=` of the query: a topic name (or `*`) and a key (or `*`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct TopicFilter {
    topic: String,
    key: String,
}

impl TopicFilter {
    fn parse(text: &str) -> Result<TopicFilter, NomadError> {
        let (topic, key) = text.split_once(':').unwrap_or((text, "*"));
        if topic.is_empty() || key.is_empty() {
            return Err(bad_request(format!(
                "Invalid topic {text:?}: write it as Topic:Key, as Job:* or Allocation:<id>"
            )));
        }
        Ok(TopicFilter {
            topic: topic.to_string(),
            key: key.to_string(),
        })
    }

    fn matches(&self, event: &ClusterEvent, key: &str) -> bool {
        (self.topic == "*" || self.topic == event.topic.name())
            && (self.key == "*" || self.key == key || event.filter_keys.contains(&self.key))
    }
}

pub async fn stream(
    State(agent): State<Arc<Agent>>,
    Query(pairs): Query<Vec<(String, String)>>,
) -> Result<Response, NomadError> {
    let mut filters = Vec::new();
    let mut from_index = None;
    for (name, value) in &pairs {
        match name.as_str() {
            "topic" => filters.push(TopicFilter::parse(value)?),
            "index" if !value.is_empty() => {
                from_index = Some(value.parse::<u64>().map_err(|_| {
                    bad_request(format!("Invalid index: {value:?} is not a number"))
                })?);
            }
            // `namespace`, `region`, ...: berth is one node in one namespace.
            _ => {}
        }
    }
    if filters.is_empty() {
        filters.push(TopicFilter {
            topic: "*".into(),
            key: "*".into(),
        });
    }
    let subscription = agent.subscribe_changes(from_index);
    let reader = EventReader {
        agent: agent.clone(),
        filters,
        subscription,
    };
    streams::streamed(&agent, "application/json", move |feed| async move {
        let mut feed = feed;
        let ended = reader.run(&mut feed).await;
        tracing::debug!(%ended, "an event stream ended");
    })
}

struct EventReader {
    agent: Arc<Agent>,
    filters: Vec<TopicFilter>,
    subscription: Subscription,
}

impl EventReader {
    async fn run(mut self, feed: &mut Feed) -> Ended {
        let node = ThisNode::of(&self.agent);
        let mut last_sent = Instant::now();
        loop {
            let quiet_for = HEARTBEAT.saturating_sub(last_sent.elapsed());
            let next = tokio::time::timeout(quiet_for, self.subscription.next());
            let line = match feed.until_stopped(next).await {
                Err(ended) => return ended,
                Ok(Err(_quiet)) => "{}".to_string(),
                Ok(Ok(Received::Event(event))) => {
                    let key = match event.topic {
                        Topic::Node => node.id.clone(),
                        _ => event.key.clone(),
                    };
                    if !self.filters.iter().any(|f| f.matches(&event, &key)) {
                        continue;
                    }
                    let events = Events {
                        index: event.index,
                        events: vec![Event {
                            topic: event.topic.name().into(),
                            kind: event.kind.to_string(),
                            key,
                            namespace: shapes::NAMESPACE.into(),
                            filter_keys: event.filter_keys.clone(),
                            index: event.index,
                            payload: Some(self.payload(&event, &node)),
                        }],
                    };
                    serde_json::to_string(&events).unwrap_or_default()
                }
                Ok(Ok(Received::Missed(missed))) => {
                    let line = EventStreamClosed {
                        error: format!(
                            "this event stream fell {missed} events behind and is closed: ask \
                             again, with ?index= of the last event read to go on from the \
                             events the agent keeps"
                        ),
                    };
                    let line = serde_json::to_string(&line).unwrap_or_default();
                    let _ = feed.send(format!("{line}\n")).await;
                    return Ended::ClientStalled(Duration::ZERO);
                }
                Ok(Ok(Received::Closed)) => return Ended::ShuttingDown,
            };
            if let Err(ended) = feed.send(format!("{line}\n")).await {
                return ended;
            }
            last_sent = Instant::now();
        }
    }

    fn payload(&self, event: &ClusterEvent, node: &ThisNode) -> EventPayload {
        match &event.payload {
            Payload::Job { status, job } => {
                EventPayload::Job(Box::new(shapes::job(job, Some(status))))
            }
            Payload::Allocation(alloc) => {
                let value = match self.agent.job_of_alloc(alloc) {
                    Ok((status, job)) => shapes::allocation(alloc, &job, &status, node),
                    // Purged since: the alloc without its job.
                    Err(_) => Allocation {
                        stub: shapes::alloc_stub(alloc, berth_jobspec::JobType::Service, node),
                        job: None,
                    },
                };
                EventPayload::Allocation(Box::new(value))
            }
            Payload::Node => {
                EventPayload::Node(Box::new(node_stub(&this_node_record(&self.agent), "ready")))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topics_are_read_as_nomad_writes_them() {
        let filter = |text| TopicFilter::parse(text).unwrap();
        assert_eq!(
            filter("Job:*"),
            TopicFilter {
                topic: "Job".into(),
                key: "*".into()
            }
        );
        assert_eq!(filter("Allocation").key, "*");
        assert_eq!(filter("Allocation:abc").key, "abc");
        assert!(TopicFilter::parse(":x").is_err());
        assert!(TopicFilter::parse("Job:").is_err());
    }
}
