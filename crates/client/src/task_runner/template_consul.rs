//! What templates read from Consul, as consul-template reads it for Nomad: keys
//! (`key`, `keyExists`, `keyOrDefault`, `ls`, `safeLs`, `tree`, `safeTree`) and
//! services (`service`, `services`), through the agent's `consul` block and its token
//! (Consul's ACLs decide what a template sees: a key the token may not read is
//! Consul's refusal, a service it may not read is no instances).
//!
//! Each read is a [`ConsulRead`], answered once per render and recorded, so the watcher
//! asks Consul the same question again while the task runs ([`answer`]) and renders
//! again when the answer changed. Where consul-template blocks a render until a key
//! exists (`key`, `safeLs`, `safeTree`), berth fails it, naming the key: the task's
//! restart policy tries again.

use std::collections::BTreeMap;
use std::time::Duration;

use berth_template::{CallError, Value};

use crate::consul::api::{ConsulApi, ConsulError, HealthEntry, KvEntry};

/// The most distinct Consul reads one render of a template makes (each is asked again
/// while the task runs).
const MAX_READS: usize = 64;

/// The most bytes of keys and values one render reads from Consul.
const MAX_BYTES: usize = 16 << 20;

/// How long a render waits for one answer (the Consul client's own deadline is 10 s).
const ANSWER_WAIT: Duration = Duration::from_secs(12);

/// How long a render waits for all its answers together.
const RENDER_WAIT: Duration = Duration::from_secs(15);

/// One question a template asked Consul.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum ConsulRead {
    Key(String),
    /// Every key under a prefix (`ls` and `tree` pick from it).
    Prefix(String),
    Service {
        name: String,
        tag: Option<String>,
        /// Only instances whose checks all pass (consul-template's default).
        passing: bool,
    },
    Services,
}

/// Consul's answer to a read, as templates see it.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Answer {
    /// A key's value; `None`: no such key.
    Key(Option<String>),
    /// Every key under a prefix: the full key and its value.
    Prefix(Vec<(String, String)>),
    Service(Value),
    Services(Value),
}

impl Answer {
    /// About how many bytes it holds: its text, and a little for each value.
    fn size(&self) -> usize {
        match self {
            Answer::Key(value) => value.as_ref().map_or(0, String::len),
            Answer::Prefix(pairs) => pairs.iter().map(|(k, v)| k.len() + v.len() + 16).sum(),
            Answer::Service(value) | Answer::Services(value) => value_bytes(value),
        }
    }
}

/// The bytes of text in `value`, and 16 for each value in it.
fn value_bytes(value: &Value) -> usize {
    16 + match value {
        Value::Str(text) => text.len(),
        Value::List(items) => items.iter().map(value_bytes).sum(),
        Value::Map(map) => map.iter().map(|(k, v)| k.len() + value_bytes(v)).sum(),
        Value::Object(object) => object.fields.values().map(value_bytes).sum(),
        _ => 0,
    }
}

/// What the watcher compares of an answer (or of Consul's refusal): a digest, so that
/// it keeps a number per question, not the answers.
pub(super) fn digest(answer: &Result<Answer, ConsulError>) -> u64 {
    use std::hash::Hasher as _;
    struct Hashing(std::collections::hash_map::DefaultHasher);
    impl std::fmt::Write for Hashing {
        fn write_str(&mut self, text: &str) -> std::fmt::Result {
            self.0.write(text.as_bytes());
            Ok(())
        }
    }
    let mut hashing = Hashing(std::collections::hash_map::DefaultHasher::new());
    let _ = std::fmt::Write::write_fmt(&mut hashing, format_args!("{answer:?}"));
    hashing.0.finish()
}

/// A key or prefix as a template names it, without its leading `/`; one with an empty,
/// `.` or `..` segment is refused (Consul's router would redirect it, and a proxy in
/// front of Consul might resolve it to another endpoint).
fn checked_key(key: &str, prefix: bool) -> Result<String, CallError> {
    let key = key.trim_start_matches('/');
    let inner = if prefix {
        key.strip_suffix('/').unwrap_or(key)
    } else {
        key
    };
    let bad = !inner.is_empty()
        && inner
            .split('/')
            .any(|segment| segment.is_empty() || segment == "." || segment == "..");
    if bad || (!prefix && key.is_empty()) {
        return Err(format!("{key:?} is not a Consul key (no empty, . or .. parts)").into());
    }
    Ok(key.to_string())
}

/// Asks Consul `read`: for a render, and for the watcher that asks again.
pub(super) async fn answer(api: &ConsulApi, read: &ConsulRead) -> Result<Answer, ConsulError> {
    let text = |entry: &KvEntry| entry.text();
    match read {
        ConsulRead::Key(key) => match api.key(key).await? {
            Some(entry) => Ok(Answer::Key(Some(text(&entry)?))),
            None => Ok(Answer::Key(None)),
        },
        ConsulRead::Prefix(prefix) => {
            let entries = api.keys_under(prefix).await?;
            let mut pairs = Vec::with_capacity(entries.len());
            for entry in &entries {
                pairs.push((entry.key.clone(), text(entry)?));
            }
            Ok(Answer::Prefix(pairs))
        }
        ConsulRead::Service { name, tag, passing } => {
            let entries = api.service_health(name, tag.as_deref(), *passing).await?;
            let mut instances: Vec<&HealthEntry> = entries.iter().collect();
            // consul-template's order: by node, then by service ID.
            instances
                .sort_by(|a, b| (&a.node.node, &a.service.id).cmp(&(&b.node.node, &b.service.id)));
            Ok(Answer::Service(Value::list(
                instances.into_iter().map(health_value).collect(),
            )))
        }
        ConsulRead::Services => {
            let names = api.catalog_services().await?;
            Ok(Answer::Services(Value::list(
                names
                    .into_iter()
                    .map(|(name, tags)| {
                        Value::object(
                            "CatalogSnippet",
                            BTreeMap::from([
                                ("Name", Value::str(name)),
                                (
                                    "Tags",
                                    Value::list(tags.into_iter().map(Value::str).collect()),
                                ),
                            ]),
                        )
                    })
                    .collect(),
            )))
        }
    }
}

/// The worst status of an instance's checks, as consul-template aggregates it.
fn aggregated_status(entry: &HealthEntry) -> &'static str {
    let has = |status: &str| entry.checks.iter().any(|c| c.status == status);
    if has("critical") {
        "critical"
    } else if has("maintenance") {
        "maintenance"
    } else if has("warning") {
        "warning"
    } else {
        "passing"
    }
}

/// A service instance as consul-template's `service` hands it out (`HealthService`).
fn health_value(entry: &HealthEntry) -> Value {
    let strings = |map: &Option<BTreeMap<String, String>>| {
        Value::Map(std::sync::Arc::new(
            map.iter()
                .flatten()
                .map(|(k, v)| (k.clone(), Value::str(v.as_str())))
                .collect(),
        ))
    };
    let address = if entry.service.address.is_empty() {
        entry.node.address.clone()
    } else {
        entry.service.address.clone()
    };
    let mut tags: Vec<String> = Vec::new();
    for tag in entry.service.tags.iter().flatten() {
        if !tags.contains(tag) {
            tags.push(tag.clone());
        }
    }
    let checks = entry
        .checks
        .iter()
        .map(|check| {
            Value::object(
                "HealthCheck",
                BTreeMap::from([
                    ("CheckID", Value::str(check.check_id.as_str())),
                    ("Name", Value::str(check.name.as_str())),
                    ("Status", Value::str(check.status.as_str())),
                    ("Output", Value::str(check.output.as_str())),
                    ("ServiceID", Value::str(check.service_id.as_str())),
                ]),
            )
        })
        .collect();
    Value::object(
        "HealthService",
        BTreeMap::from([
            ("Node", Value::str(entry.node.node.as_str())),
            ("NodeID", Value::str(entry.node.id.as_str())),
            ("NodeAddress", Value::str(entry.node.address.as_str())),
            ("NodeDatacenter", Value::str(entry.node.datacenter.as_str())),
            ("NodeTaggedAddresses", strings(&entry.node.tagged_addresses)),
            ("NodeMeta", strings(&entry.node.meta)),
            ("ServiceMeta", strings(&entry.service.meta)),
            ("Address", Value::str(address)),
            ("ID", Value::str(entry.service.id.as_str())),
            ("Name", Value::str(entry.service.service.as_str())),
            (
                "Tags",
                Value::list(tags.into_iter().map(Value::str).collect()),
            ),
            ("Checks", Value::list(checks)),
            ("Status", Value::str(aggregated_status(entry))),
            ("Port", Value::Int(i64::from(entry.service.port))),
            (
                "Namespace",
                Value::str(entry.service.namespace.clone().unwrap_or_default()),
            ),
        ]),
    )
}

/// The Consul reads of one render: each question asked once, all of them recorded.
pub(super) struct ConsulReads {
    /// `None`: the agent has no `consul` block.
    api: Option<ConsulApi>,
    runtime: tokio::runtime::Handle,
    answered: BTreeMap<ConsulRead, Answer>,
    /// What each question got (an answer or Consul's refusal), as the watcher compares
    /// it: the render's own view is the watcher's starting point.
    pub(super) seen: BTreeMap<ConsulRead, u64>,
    /// `ls` and `tree` made once per prefix; a template that asks again gets the same.
    listings: BTreeMap<(bool, String), Value>,
    bytes: usize,
    /// One deadline for all of a render's questions.
    deadline: std::time::Instant,
}

impl ConsulReads {
    pub(super) fn new(api: Option<ConsulApi>, runtime: tokio::runtime::Handle) -> ConsulReads {
        ConsulReads {
            api,
            runtime,
            answered: BTreeMap::new(),
            seen: BTreeMap::new(),
            listings: BTreeMap::new(),
            bytes: 0,
            deadline: std::time::Instant::now() + RENDER_WAIT,
        }
    }

    /// Answers `function` (one of [`crate::consul::TEMPLATE_READS`]) called with `args`. Blocks: it
    /// runs on the render thread.
    pub(super) fn call(&mut self, function: &str, args: &[Value]) -> Result<Value, CallError> {
        match (function, args) {
            ("key", [Value::Str(key)]) => match self.key(key)? {
                Some(value) => Ok(Value::str(value)),
                None => Err(format!(
                    "key {key:?} is not in Consul (consul-template would wait for it; berth \
                     fails the render: keyOrDefault gives a default)"
                )
                .into()),
            },
            ("keyExists", [Value::Str(key)]) => Ok(Value::Bool(self.key(key)?.is_some())),
            ("keyOrDefault", [Value::Str(key), default]) => Ok(match self.key(key)? {
                Some(value) => Value::str(value),
                None => default.clone(),
            }),
            ("ls" | "safeLs" | "tree" | "safeTree", [Value::Str(prefix)]) => {
                self.listing(function, prefix)
            }
            ("service", [Value::Str(query)]) => self.service(query, None),
            ("service", [Value::Str(query), Value::Str(statuses)]) => {
                self.service(query, Some(statuses))
            }
            ("services", []) => match self.ask(ConsulRead::Services)? {
                Answer::Services(value) => Ok(value),
                _ => Err("Consul answered another question".into()),
            },
            ("key" | "keyExists", _) => Err("takes one key, as key \"app/config\"".into()),
            ("keyOrDefault", _) => {
                Err("takes a key and a default, as keyOrDefault \"app/port\" \"8080\"".into())
            }
            ("ls" | "safeLs" | "tree" | "safeTree", _) => {
                Err("takes one key prefix, as tree \"app/config\"".into())
            }
            ("service", _) => Err(
                "takes a service, as service \"web\" or \"tag.web\", and optionally the \
                 statuses to keep, as \"any\" or \"passing,warning\""
                    .into(),
            ),
            ("services", _) => Err("takes no arguments in berth (one datacenter)".into()),
            (other, _) => Err(format!("berth has no answer for {other}").into()),
        }
    }

    fn key(&mut self, key: &str) -> Result<Option<String>, CallError> {
        match self.ask(ConsulRead::Key(checked_key(key, false)?))? {
            Answer::Key(value) => Ok(value),
            _ => Err("Consul answered another question".into()),
        }
    }

    /// `ls` (the keys right under the prefix) and `tree` (every key under it), each a
    /// list of pairs with `Key` relative to the prefix; the `safe` forms fail on none.
    fn listing(&mut self, function: &str, prefix: &str) -> Result<Value, CallError> {
        let prefix = checked_key(prefix, true)?;
        let top_only = matches!(function, "ls" | "safeLs");
        let listed = match self.listings.get(&(top_only, prefix.clone())) {
            Some(listed) => listed.clone(),
            None => {
                let listed = self.list(&prefix, top_only)?;
                self.listings
                    .insert((top_only, prefix.clone()), listed.clone());
                listed
            }
        };
        let empty = matches!(&listed, Value::List(items) if items.is_empty());
        if empty && function.starts_with("safe") {
            return Err(format!(
                "no keys under {prefix:?} in Consul (consul-template would wait for them; \
                 berth fails the render)"
            )
            .into());
        }
        Ok(listed)
    }

    /// The pairs under `prefix`: right under it (`top_only`), or all of them.
    fn list(&mut self, prefix: &str, top_only: bool) -> Result<Value, CallError> {
        let Answer::Prefix(pairs) = self.ask(ConsulRead::Prefix(prefix.to_string()))? else {
            return Err("Consul answered another question".into());
        };
        let folder = if prefix.is_empty() || prefix.ends_with('/') {
            prefix.to_string()
        } else {
            format!("{prefix}/")
        };
        let listed: Vec<Value> = pairs
            .iter()
            .filter_map(|(key, value)| {
                let relative = key.strip_prefix(&folder)?;
                // Folders (keys ending in /) are not pairs; ls keeps the top level.
                if relative.is_empty() || relative.ends_with('/') {
                    return None;
                }
                if top_only && relative.contains('/') {
                    return None;
                }
                Some(Value::object(
                    "KeyPair",
                    BTreeMap::from([
                        ("Key", Value::str(relative)),
                        ("Path", Value::str(key.as_str())),
                        ("Value", Value::str(value.as_str())),
                    ]),
                ))
            })
            .collect();
        Ok(Value::list(listed))
    }

    /// `service "[tag.]name"`, keeping the passing instances, or those of `statuses`
    /// (`"any"`, or a list such as `"passing,warning"`).
    fn service(&mut self, query: &str, statuses: Option<&str>) -> Result<Value, CallError> {
        if let Some((_, datacenter)) = query.split_once('@') {
            return Err(format!(
                "datacenter {datacenter:?}: berth reads the local datacenter's services only"
            )
            .into());
        }
        let (tag, name) = match query.rsplit_once('.') {
            Some((tag, name)) => (Some(tag.to_string()), name.to_string()),
            None => (None, query.to_string()),
        };
        let keep: Option<Vec<String>> = match statuses.map(str::trim) {
            None => None,
            Some("any") => Some(Vec::new()),
            Some(list) => {
                let wanted: Vec<String> = list.split(',').map(|s| s.trim().to_string()).collect();
                let known = ["passing", "warning", "critical", "maintenance"];
                if let Some(bad) = wanted.iter().find(|s| !known.contains(&s.as_str())) {
                    return Err(format!(
                        "status {bad:?}: the statuses are any, passing, warning, critical and \
                         maintenance"
                    )
                    .into());
                }
                Some(wanted)
            }
        };
        let passing = keep.is_none();
        let Answer::Service(Value::List(instances)) =
            self.ask(ConsulRead::Service { name, tag, passing })?
        else {
            return Err("Consul answered another question".into());
        };
        let Some(keep) = keep.filter(|k| !k.is_empty()) else {
            return Ok(Value::List(instances));
        };
        let status_of = |instance: &Value| match instance {
            Value::Object(object) => match object.fields.get("Status") {
                Some(Value::Str(status)) => status.to_string(),
                _ => String::new(),
            },
            _ => String::new(),
        };
        Ok(Value::list(
            instances
                .iter()
                .filter(|instance| keep.contains(&status_of(instance)))
                .cloned()
                .collect(),
        ))
    }

    /// Asks Consul `read`, once per render.
    fn ask(&mut self, read: ConsulRead) -> Result<Answer, CallError> {
        if let Some(answer) = self.answered.get(&read) {
            return Ok(answer.clone());
        }
        let Some(api) = self.api.clone() else {
            return Err("it reads Consul, and this agent has no consul block".into());
        };
        if self.seen.len() >= MAX_READS {
            return Err(format!("a template asks Consul at most {MAX_READS} questions").into());
        }
        let (sender, receiver) = std::sync::mpsc::sync_channel(1);
        let asked = read.clone();
        self.runtime.spawn(async move {
            let _ = sender.send(answer(&api, &asked).await);
        });
        let wait = ANSWER_WAIT.min(
            self.deadline
                .saturating_duration_since(std::time::Instant::now()),
        );
        let answer = receiver.recv_timeout(wait).map_err(|_| {
            CallError(format!(
                "Consul did not answer within {ANSWER_WAIT:?} (a render waits at most \
                 {RENDER_WAIT:?} for all its questions)"
            ))
        })?;
        self.seen.insert(read.clone(), digest(&answer));
        let answer = answer.map_err(|e| CallError(e.to_string()))?;
        self.bytes += answer.size();
        if self.bytes > MAX_BYTES {
            return Err(format!("a template reads at most {MAX_BYTES} bytes from Consul").into());
        }
        self.answered.insert(read, answer.clone());
        Ok(answer)
    }
}

#[cfg(test)]
pub(in crate::task_runner) mod tests {
    use super::*;
    use berth_testkit::consul::{ConsulDouble, Policy};

    /// Renders `text` against `consul` with `token`, as a task's template does.
    fn render(consul: &ConsulDouble, token: &str, text: &str) -> Result<String, String> {
        let api = ConsulApi::new(consul.address(), Some(token.to_string()));
        let runtime = runtime();
        let mut reads = ConsulReads::new(Some(api), runtime);
        struct Reads<'a>(&'a mut ConsulReads);
        impl berth_template::Data for Reads<'_> {
            fn call(&mut self, function: &str, args: &[Value]) -> Result<Value, CallError> {
                self.0.call(function, args)
            }
        }
        let template =
            berth_template::Template::parse(text, &berth_template::Delimiters::default())
                .map_err(|e| e.to_string())?;
        // Off the test runtime's threads: the reads block, as on the render thread.
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    template
                        .render(
                            &mut Reads(&mut reads),
                            &berth_template::RenderOptions::default(),
                        )
                        .map_err(|e| e.to_string())
                })
                .join()
                .expect("the render thread")
        })
    }

    /// A runtime for what the render thread hands the agent's (Consul's answers).
    pub(in crate::task_runner) fn runtime() -> tokio::runtime::Handle {
        static RUNTIME: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
        RUNTIME
            .get_or_init(|| tokio::runtime::Runtime::new().expect("a test runtime"))
            .handle()
            .clone()
    }

    fn double() -> ConsulDouble {
        let runtime = runtime();
        let consul = runtime.block_on(ConsulDouble::start());
        consul.add_token(
            "templates",
            Policy {
                service_read: vec!["db".into()],
                key_read: vec!["app/".into()],
                ..Policy::default()
            },
        );
        consul.put_key("app/port", "5432");
        consul.put_key("app/hosts/a", "10.0.0.1");
        consul.put_key("app/hosts/b", "10.0.0.2");
        consul.put_key("app/hosts/deep/c", "10.0.0.3");
        consul.put_key("secret/password", "hunter2");
        consul.add_service("db-1", "db");
        consul.add_service("db-2", "db");
        consul.add_service("vault-1", "vault");
        consul.add_check("db-2-alive", "db-2");
        consul
    }

    #[test]
    fn keys_and_services_read_as_consul_template_reads_them() {
        let consul = double();
        let ok = |text: &str| render(&consul, "templates", text).unwrap();
        assert_eq!(ok(r#"{{ key "app/port" }}"#), "5432");
        assert_eq!(ok(r#"{{ key "/app/port" }}"#), "5432");
        assert_eq!(ok(r#"{{ keyOrDefault "app/none" "7" }}"#), "7");
        assert_eq!(
            ok(r#"{{ keyExists "app/port" }} {{ keyExists "app/none" }}"#),
            "true false"
        );
        assert_eq!(
            ok(r#"{{ range ls "app/hosts" }}{{ .Key }}={{ .Value }};{{ end }}"#),
            "a=10.0.0.1;b=10.0.0.2;"
        );
        assert_eq!(
            ok(r#"{{ range tree "app/hosts/" }}{{ .Key }}={{ .Value }};{{ end }}"#),
            "a=10.0.0.1;b=10.0.0.2;deep/c=10.0.0.3;"
        );
        assert_eq!(
            ok(r#"{{ range safeTree "app/hosts" }}{{ .Path }};{{ end }}"#),
            "app/hosts/a;app/hosts/b;app/hosts/deep/c;"
        );
        assert_eq!(
            ok(r#"{{ range safeLs "app" }}{{ .Key }};{{ end }}"#),
            "port;"
        );
        // consul-template's reshapers, on what Consul answered.
        assert_eq!(
            ok(r#"{{ $t := tree "app" | explode }}{{ $t.port }} {{ $t.hosts.deep.c }}"#),
            "5432 10.0.0.3"
        );
        assert_eq!(
            ok(
                r#"{{ range $dir, $pairs := tree "app" | byKey }}{{ $dir }}:{{ len $pairs }};{{ end }}"#
            ),
            "hosts:3;"
        );
        assert_eq!(
            ok(r#"{{ range service "db" }}{{ .ID }}@{{ .Node }}/{{ .Status }};{{ end }}"#),
            "db-1@double/passing;db-2@double/passing;"
        );
        // Consul's ACLs decide: a service the token may not read has no instances, and
        // the catalog lists only what it may read.
        assert_eq!(ok(r#"{{ len (service "vault") }}"#), "0");
        assert_eq!(ok(r#"{{ range services }}{{ .Name }};{{ end }}"#), "db;");
        // A failing check: gone from the default (passing) list, there with "any".
        consul.set_check_status("db-2-alive", "critical");
        assert_eq!(
            ok(r#"{{ range service "db" }}{{ .ID }};{{ end }}"#),
            "db-1;"
        );
        assert_eq!(
            ok(r#"{{ range service "db" "any" }}{{ .ID }}={{ .Status }};{{ end }}"#),
            "db-1=passing;db-2=critical;"
        );
        assert_eq!(
            ok(r#"{{ range service "db" "critical" }}{{ .ID }};{{ end }}"#),
            "db-2;"
        );
    }

    #[test]
    fn what_consul_refuses_or_lacks_fails_the_render_saying_so() {
        let consul = double();
        let error = |token: &str, text: &str| render(&consul, token, text).unwrap_err();
        let refused = error("templates", r#"{{ key "secret/password" }}"#);
        assert!(
            refused
                .contains("Consul refused reading key \"secret/password\": 403: Permission denied"),
            "{refused}"
        );
        assert!(refused.contains("lacks permission 'key:read' on \"secret/password\""));
        let missing = error("templates", r#"{{ key "app/none" }}"#);
        assert!(
            missing.contains("key \"app/none\" is not in Consul"),
            "{missing}"
        );
        let empty = error("templates", r#"{{ safeLs "app/nothing" }}"#);
        assert!(empty.contains("no keys under \"app/nothing\""), "{empty}");
        let unknown = error("not-a-token", r#"{{ key "app/port" }}"#);
        assert!(unknown.contains("403: ACL not found"), "{unknown}");
        for key in ["app/../secret/password", "app//port", "app/./port", ""] {
            let refused = error("templates", &format!("{{{{ key {key:?} }}}}"));
            assert!(refused.contains("is not a Consul key"), "{key}: {refused}");
        }
        let status = error("templates", r#"{{ service "db" "sick" }}"#);
        assert!(status.contains("status \"sick\""), "{status}");
        // Without a consul block, the render says so.
        let runtime = runtime();
        let mut reads = ConsulReads::new(None, runtime);
        let none = reads.call("key", &[Value::str("app/port")]).unwrap_err();
        assert_eq!(
            none.0,
            "it reads Consul, and this agent has no consul block"
        );
    }
}
