//! The agent's metrics: one registry per agent, on the `metrics` facade, read two ways
//! from the same recordings: as Prometheus' text exposition (by
//! `metrics-exporter-prometheus`) and as Nomad's JSON (go-metrics' in-memory sink:
//! `Gauges`, `Counters`, `Samples`), which `GET /v1/metrics` serves.
//!
//! A [`Metrics`] is made once per agent process (the CLI makes it with the runtime) and
//! handed down: the runtime records driver and hook calls and the log messages a plugin
//! dropped past its budget, the CSI client its RPCs, the agent its gauges. It is never
//! installed as the process's global recorder, so the tests, which run many
//! agents in one process, each read their own agent's figures and nothing clashes.
//!
//! Names follow Nomad where Nomad has the metric (`nomad.client.allocations.running`);
//! berth's own are `berth.*`. Times are milliseconds, as go-metrics records them.
//!
//! Counters and samples aggregate over the agent's lifetime (go-metrics aggregates over
//! a ten-second interval): `Rate` is per second of that lifetime.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Label, Level,
    Metadata, Recorder, SharedString, Unit,
};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};
use metrics_util::registry::{Registry, Storage};
use serde::Serialize;

/// Every call into a driver or hook: a sample in milliseconds, labelled `kind` (`driver`
/// or `hook`), `plugin`, `call` and `outcome` (`ok` or `error`).
pub const PLUGIN_CALL: &str = "berth.plugin.call";
/// Log messages a driver or hook sent past its per-call budget, which were dropped: a
/// counter labelled `plugin`.
pub const PLUGIN_LOG_DROPPED: &str = "berth.plugin.log_dropped";
/// Every CSI RPC (its retries included): a sample in milliseconds, labelled `plugin`,
/// `method` and `code` (`OK` or the gRPC code it failed with).
pub const CSI_RPC: &str = "berth.csi.rpc";

static METADATA: Metadata<'static> =
    Metadata::new("berth::telemetry", Level::INFO, Some("berth::telemetry"));

/// How many samples are recorded between two upkeeps of the Prometheus recorder, which
/// holds each raw sample until it is folded into its summary: an agent nobody scrapes
/// keeps at most this many.
const SAMPLES_PER_UPKEEP: u64 = 4096;

/// One agent's metrics. Cheap to clone; every clone records into the same registry.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

/// Each recording goes to both recorders (metrics-util's `Fanout` would do it, but it
/// holds its recorders as `Box<dyn Recorder + Sync>`, which is not `Send`).
struct Inner {
    prometheus: PrometheusRecorder,
    prometheus_handle: PrometheusHandle,
    aggregates: AggregateRecorder,
    started: Instant,
    samples: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Self {
        let prometheus = PrometheusBuilder::new().build_recorder();
        Metrics {
            inner: Arc::new(Inner {
                prometheus_handle: prometheus.handle(),
                prometheus,
                aggregates: AggregateRecorder(Registry::new(AggregateStorage)),
                started: Instant::now(),
                samples: AtomicU64::new(0),
            }),
        }
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

fn key(name: &'static str, labels: &[(&'static str, &str)]) -> Key {
    Key::from_parts(
        name,
        labels
            .iter()
            .map(|(label, value)| Label::new(*label, value.to_string()))
            .collect::<Vec<_>>(),
    )
}

impl Metrics {
    fn increment(&self, name: &'static str, labels: &[(&'static str, &str)], by: u64) {
        let key = key(name, labels);
        for recorder in self.recorders() {
            recorder.register_counter(&key, &METADATA).increment(by);
        }
    }

    fn sample(&self, name: &'static str, labels: &[(&'static str, &str)], elapsed: Duration) {
        let key = key(name, labels);
        let millis = elapsed.as_secs_f64() * 1000.0;
        for recorder in self.recorders() {
            recorder.register_histogram(&key, &METADATA).record(millis);
        }
        if self.inner.samples.fetch_add(1, Ordering::Relaxed) % SAMPLES_PER_UPKEEP
            == SAMPLES_PER_UPKEEP - 1
        {
            self.inner.prometheus_handle.run_upkeep();
        }
    }

    fn recorders(&self) -> [&dyn Recorder; 2] {
        [&self.inner.prometheus, &self.inner.aggregates]
    }

    /// Sets a gauge (labels as Nomad gives its client gauges: `node_id`, `datacenter`).
    pub fn set_gauge(&self, name: &'static str, labels: &[(&'static str, &str)], value: f64) {
        let key = key(name, labels);
        for recorder in self.recorders() {
            recorder.register_gauge(&key, &METADATA).set(value);
        }
    }

    /// One call into a driver or hook (`kind`), how long it took and whether it failed.
    pub fn plugin_call(
        &self,
        kind: &'static str,
        plugin: &str,
        call: &str,
        elapsed: Duration,
        ok: bool,
    ) {
        let outcome = if ok { "ok" } else { "error" };
        self.sample(
            PLUGIN_CALL,
            &[
                ("kind", kind),
                ("plugin", plugin),
                ("call", call),
                ("outcome", outcome),
            ],
            elapsed,
        );
    }

    /// One CSI RPC, with the code it ended with (`OK` when it succeeded).
    pub fn csi_rpc(&self, plugin: &str, method: &str, code: &str, elapsed: Duration) {
        self.sample(
            CSI_RPC,
            &[("plugin", plugin), ("method", method), ("code", code)],
            elapsed,
        );
    }

    /// Log messages `plugin` sent past its budget in one call, which were dropped.
    pub fn log_dropped(&self, plugin: &str, dropped: u64) {
        self.increment(PLUGIN_LOG_DROPPED, &[("plugin", plugin)], dropped);
    }

    /// Log messages dropped so far, by plugin name.
    pub fn log_drops(&self) -> BTreeMap<String, u64> {
        let mut drops = BTreeMap::new();
        self.inner.aggregates.0.visit_counters(|key, aggregate| {
            if key.name() != PLUGIN_LOG_DROPPED {
                return;
            }
            if let Some(plugin) = key.labels().find(|l| l.key() == "plugin") {
                // A counter's sum is a whole number of messages.
                *drops.entry(plugin.value().to_string()).or_default() +=
                    aggregate.read().sum as u64;
            }
        });
        drops
    }

    /// How long this registry has been recording (the agent's uptime).
    pub fn uptime(&self) -> Duration {
        self.inner.started.elapsed()
    }

    /// Prometheus' text exposition format (version 0.0.4).
    pub fn prometheus_text(&self) -> String {
        self.inner.prometheus_handle.render()
    }

    /// go-metrics' in-memory summary, Nomad's `GET /v1/metrics` JSON.
    pub fn summary(&self) -> MetricsSummary {
        let interval = self.uptime().as_secs_f64().max(1e-3);
        let labels = |key: &Key| -> BTreeMap<String, String> {
            key.labels()
                .map(|l| (l.key().to_string(), l.value().to_string()))
                .collect()
        };
        let mut gauges = Vec::new();
        self.inner.aggregates.0.visit_gauges(|key, gauge| {
            gauges.push(GaugeValue {
                name: key.name().to_string(),
                value: f64::from_bits(gauge.load(Ordering::Relaxed)),
                labels: labels(key),
            });
        });
        let mut counters = Vec::new();
        self.inner.aggregates.0.visit_counters(|key, aggregate| {
            counters.push(aggregate.read().value(key.name(), labels(key), interval));
        });
        let mut samples = Vec::new();
        self.inner.aggregates.0.visit_histograms(|key, aggregate| {
            samples.push(aggregate.read().value(key.name(), labels(key), interval));
        });
        // The registry's order is its hash's; a reader wants the same order every time.
        gauges.sort_by(|a, b| (&a.name, &a.labels).cmp(&(&b.name, &b.labels)));
        counters.sort_by(|a, b| (&a.name, &a.labels).cmp(&(&b.name, &b.labels)));
        samples.sort_by(|a, b| (&a.name, &a.labels).cmp(&(&b.name, &b.labels)));
        MetricsSummary {
            timestamp: chrono::Utc::now()
                .format("%Y-%m-%d %H:%M:%S %z UTC")
                .to_string(),
            gauges,
            points: Vec::new(),
            counters,
            samples,
        }
    }
}

/// go-metrics' `MetricsSummary`, as Nomad's `GET /v1/metrics` answers.
#[derive(Debug, Clone, Serialize)]
pub struct MetricsSummary {
    #[serde(rename = "Timestamp")]
    pub timestamp: String,
    #[serde(rename = "Gauges")]
    pub gauges: Vec<GaugeValue>,
    /// go-metrics' key/value points: berth records none.
    #[serde(rename = "Points")]
    pub points: Vec<serde_json::Value>,
    #[serde(rename = "Counters")]
    pub counters: Vec<SampledValue>,
    #[serde(rename = "Samples")]
    pub samples: Vec<SampledValue>,
}

#[derive(Debug, Clone, Serialize)]
pub struct GaugeValue {
    #[serde(rename = "Name")]
    pub name: String,
    #[serde(rename = "Value")]
    pub value: f64,
    #[serde(rename = "Labels")]
    pub labels: BTreeMap<String, String>,
}

/// A counter or a sample, aggregated.
#[derive(Debug, Clone, Serialize)]
pub struct SampledValue {
    #[serde(rename = "Name")]
    pub name: String,
    #[serde(rename = "Count")]
    pub count: u64,
    #[serde(rename = "Rate")]
    pub rate: f64,
    #[serde(rename = "Sum")]
    pub sum: f64,
    #[serde(rename = "Min")]
    pub min: f64,
    #[serde(rename = "Max")]
    pub max: f64,
    #[serde(rename = "Mean")]
    pub mean: f64,
    #[serde(rename = "Stddev")]
    pub stddev: f64,
    #[serde(rename = "Labels")]
    pub labels: BTreeMap<String, String>,
}

/// go-metrics' `AggregateSample`: what it keeps of a counter's increments or of a
/// sample's values.
#[derive(Debug, Clone, Copy, Default)]
struct Aggregate {
    count: u64,
    sum: f64,
    sum_of_squares: f64,
    min: f64,
    max: f64,
}

impl Aggregate {
    fn ingest(&mut self, value: f64) {
        if !value.is_finite() {
            return;
        }
        if self.count == 0 || value < self.min {
            self.min = value;
        }
        if self.count == 0 || value > self.max {
            self.max = value;
        }
        self.count += 1;
        self.sum += value;
        self.sum_of_squares += value * value;
    }

    fn value(&self, name: &str, labels: BTreeMap<String, String>, interval: f64) -> SampledValue {
        let count = self.count as f64;
        let mean = if self.count == 0 {
            0.0
        } else {
            self.sum / count
        };
        // go-metrics' sample standard deviation.
        let stddev = if self.count < 2 {
            0.0
        } else {
            ((self.sum_of_squares - self.sum * self.sum / count) / (count - 1.0))
                .max(0.0)
                .sqrt()
        };
        SampledValue {
            name: name.to_string(),
            count: self.count,
            rate: self.sum / interval,
            sum: self.sum,
            min: self.min,
            max: self.max,
            mean,
            stddev,
            labels,
        }
    }
}

/// An aggregate shared by every handle of one key.
#[derive(Debug, Default)]
struct AggregateCell(Mutex<Aggregate>);

impl AggregateCell {
    fn read(&self) -> Aggregate {
        *self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn ingest(&self, value: f64) {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .ingest(value);
    }
}

impl CounterFn for AggregateCell {
    fn increment(&self, value: u64) {
        self.ingest(value as f64);
    }

    fn absolute(&self, value: u64) {
        // berth sets no counter outright; were one set, its increments since are what a
        // go-metrics counter holds.
        let mut aggregate = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let grown = value as f64 - aggregate.sum;
        if grown > 0.0 {
            aggregate.ingest(grown);
        }
    }
}

impl HistogramFn for AggregateCell {
    fn record(&self, value: f64) {
        self.ingest(value);
    }
}

/// A gauge: an `f64`'s bits.
#[derive(Debug, Default)]
struct GaugeCell(AtomicU64);

impl GaugeCell {
    fn load(&self, ordering: Ordering) -> u64 {
        self.0.load(ordering)
    }

    fn update(&self, change: impl Fn(f64) -> f64) {
        let _ = self
            .0
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |bits| {
                Some(change(f64::from_bits(bits)).to_bits())
            });
    }
}

impl GaugeFn for GaugeCell {
    fn increment(&self, value: f64) {
        self.update(|current| current + value);
    }

    fn decrement(&self, value: f64) {
        self.update(|current| current - value);
    }

    fn set(&self, value: f64) {
        self.0.store(value.to_bits(), Ordering::Release);
    }
}

struct AggregateStorage;

impl Storage<Key> for AggregateStorage {
    type Counter = Arc<AggregateCell>;
    type Gauge = Arc<GaugeCell>;
    type Histogram = Arc<AggregateCell>;

    fn counter(&self, _: &Key) -> Self::Counter {
        Arc::default()
    }

    fn gauge(&self, _: &Key) -> Self::Gauge {
        Arc::default()
    }

    fn histogram(&self, _: &Key) -> Self::Histogram {
        Arc::default()
    }
}

/// Records into the aggregates that the JSON summary reads.
struct AggregateRecorder(Registry<Key, AggregateStorage>);

impl Recorder for AggregateRecorder {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.0.get_or_create_counter(key, Arc::clone))
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(self.0.get_or_create_gauge(key, Arc::clone))
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(self.0.get_or_create_histogram(key, Arc::clone))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both readings come from the same recordings, and two registries in one process
    /// share nothing.
    #[test]
    fn one_recording_reads_as_prometheus_text_and_as_nomads_json() {
        let metrics = Metrics::default();
        let other = Metrics::default();
        metrics.plugin_call(
            "driver",
            "exec",
            "start-task",
            Duration::from_millis(4),
            true,
        );
        metrics.plugin_call(
            "driver",
            "exec",
            "start-task",
            Duration::from_millis(8),
            true,
        );
        metrics.log_dropped("noisy", 7);
        metrics.log_dropped("noisy", 3);
        metrics.set_gauge(
            "nomad.client.allocations.running",
            &[("node_id", "n1"), ("datacenter", "dc1")],
            2.0,
        );

        let summary = metrics.summary();
        let call = summary
            .samples
            .iter()
            .find(|s| s.name == PLUGIN_CALL)
            .expect("the call sample");
        assert_eq!(call.count, 2);
        assert!((call.sum - 12.0).abs() < 0.01, "{call:?}");
        assert!((call.min - 4.0).abs() < 0.01 && (call.max - 8.0).abs() < 0.01);
        assert!((call.mean - 6.0).abs() < 0.01);
        assert!((call.stddev - 8f64.sqrt()).abs() < 0.01, "{call:?}");
        assert_eq!(call.labels["plugin"], "exec");
        assert_eq!(call.labels["outcome"], "ok");
        let dropped = &summary.counters[0];
        assert_eq!(
            (dropped.name.as_str(), dropped.sum),
            (PLUGIN_LOG_DROPPED, 10.0)
        );
        assert_eq!(summary.gauges[0].value, 2.0);
        assert_eq!(
            metrics.log_drops(),
            BTreeMap::from([("noisy".to_string(), 10)])
        );

        let text = metrics.prometheus_text();
        assert!(
            text.contains(r#"berth_plugin_log_dropped{plugin="noisy"} 10"#),
            "{text}"
        );
        assert!(
            text.contains(r#"nomad_client_allocations_running{node_id="n1",datacenter="dc1"} 2"#),
            "{text}"
        );
        assert!(text.contains("berth_plugin_call_count{"), "{text}");

        assert!(other.log_drops().is_empty());
        assert!(other.summary().samples.is_empty());
    }
}
