//! One control plane: the same scenarios on a lone agent and on a three-node cluster on
//! a real etcd, asserting the same API answers apart from ids, times and indexes.
//!
//! The lone agent is node `a` in datacenter `scenario`. The cluster's node `a` is the
//! one node of its three in that datacenter (`b` and `c` are in `elsewhere`), and every
//! job runs in `scenario` only. So on both planes each scenario has exactly one node it
//! can use, and the answers can be the same, while on the cluster each request is taken
//! by member `b` (which runs nothing), the leader (any of the three) schedules, and `a`
//! runs the allocs. Both planes run each step at the same time.
//!
//! The cases: a static port another job holds, resources exhausted, infeasible
//! constraints and volumes, `job plan` of a new and of a changed job, purge then
//! resubmit, a system job, a failed alloc rescheduled, a periodic launch missed
//! while every agent was down, made once they are back, a template's change script
//! run inside its task when a service joins the catalog, a task that brings an
//! artifact, gets an identity and is restarted once by its failing script check, and
//! `alloc exec` into that task (on the cluster asked of `b`, carried to `a`).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use berth_harness::AgentProcess;
use berth_testkit::etcd::EtcdServer;
use serde_json::{Value, json};

/// A plane: its agents, the last of which takes the requests.
struct Plane {
    name: &'static str,
    agents: Vec<AgentProcess>,
    _etcd: Option<EtcdServer>,
}

/// The plugin dir every agent of both planes loads: a driver that spawns unconfined,
/// which no agent's operator allows.
fn plugin_dir() -> &'static std::path::Path {
    static DIR: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = berth_harness::binaries::target_tmp()
            .join(format!("scenario-plugins-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(
            berth_builtin::test_components::UNDECLARED_SPAWN,
            dir.join("undeclared_spawn.wasm"),
        )
        .unwrap();
        dir
    })
}

fn agent(name: &str, datacenter: &str, cluster: &str) -> AgentProcess {
    // The artifact case's server is on loopback, which agents deny by default; the
    // reserved port case's port is kept from allocs.
    let config = format!(
        "name = \"{name}\"\ndatacenter = \"{datacenter}\"\n{cluster}\
         plugin_dir = {:?}\n\
         artifact {{\n  denied_networks = []\n}}\n\
         reserved {{\n  reserved_ports = \"24690-24691\"\n}}\n",
        plugin_dir().display().to_string()
    );
    AgentProcess::production(move |_, _| config)
}

/// A task that brings its artifact, gets its identity, and is restarted once by its
/// script check: the check fails until the task's second start makes it pass.
fn equipped(artifact_url: &str, sum: &str) -> String {
    format!(
        r#"job "equipped" {{
  datacenters = ["scenario"]
  group "g" {{
    restart {{
      attempts = 2
      delay    = "0s"
      mode     = "fail"
    }}
    task "t" {{
      driver = "exec"
      artifact {{
        source = "{artifact_url}"
        options {{
          checksum = "sha256:{sum}"
        }}
      }}
      identity {{
        env = true
      }}
      config {{
        command = "/bin/sh"
        args    = ["-c", "if [ -f local/once ]; then touch local/ready; fi; touch local/once; exec sleep 300"]
      }}
      service {{
        name     = "equipped"
        provider = "nomad"
        check {{
          name     = "ready"
          type     = "script"
          command  = "/bin/sh"
          args     = ["-c", "test -n \"$NOMAD_TOKEN\" && test -f /local/hello.txt && test -f /local/ready"]
          interval = "1s"
          timeout  = "2s"
          check_restart {{
            limit = 1
            grace = "2s"
          }}
        }}
      }}
      resources {{
        cpu    = 20
        memory = 32
      }}
    }}
  }}
}}
"#
    )
}

/// An alloc's status as the planes are compared on: a `running` alloc whose tasks have
/// not all started yet (its status says running a moment before its task's `Started`
/// reaches the cluster) is still starting.
fn settled_status(alloc: &Value) -> String {
    let status = alloc["ClientStatus"].as_str().unwrap_or_default();
    let starting = alloc["TaskStates"].as_object().is_some_and(|tasks| {
        tasks.values().any(|t| {
            t["State"] != "running"
                || !t["Events"]
                    .as_array()
                    .is_some_and(|events| events.iter().any(|e| e["Type"] == "Started"))
        })
    });
    if status == "running" && starting {
        "running, its tasks starting".to_string()
    } else {
        status.to_string()
    }
}

impl Plane {
    fn lone() -> Plane {
        Plane {
            name: "lone agent",
            agents: vec![agent("a", "scenario", "")],
            _etcd: None,
        }
    }

    fn cluster() -> Plane {
        let etcd = EtcdServer::start();
        let cluster = format!(
            "cluster {{\n  store = \"etcd\"\n  endpoints = [\"{}\"]\n  prefix = \"/scenarios\"\n  \
             heartbeat_ttl = \"3s\"\n}}\n",
            etcd.endpoint()
        );
        Plane {
            name: "three-node cluster",
            agents: vec![
                agent("a", "scenario", &cluster),
                agent("c", "elsewhere", &cluster),
                agent("b", "elsewhere", &cluster),
            ],
            _etcd: Some(etcd),
        }
    }

    async fn start(&mut self) {
        for agent in &mut self.agents {
            agent.start().await;
        }
    }

    fn api(&self) -> &AgentProcess {
        self.agents.last().unwrap()
    }

    async fn get(&self, path: &str) -> Value {
        self.api()
            .client()
            .get(path)
            .await
            .unwrap_or_else(|e| panic!("{}: GET {path}: {e}\n{}", self.name, self.output()))
    }

    fn output(&self) -> String {
        self.agents
            .iter()
            .map(|a| a.output())
            .collect::<Vec<_>>()
            .join("\n----\n")
    }

    /// Submits a jobspec as the operator and waits for its evaluation.
    async fn submit(&self, name: &str, source: &str) {
        let submitted = self
            .api()
            .submit(&format!("{name}.hcl"), source)
            .await
            .unwrap_or_else(|e| panic!("{}: submit {name}: {e}\n{}", self.name, self.output()));
        self.evaluated(&submitted.eval_id).await;
    }

    /// Waits until evaluation `id` is complete.
    async fn evaluated(&self, id: &str) {
        self.until(&format!("evaluation {id} completes"), || async {
            let eval = self.get(&format!("/v1/evaluation/{id}")).await;
            (eval["Status"] == "complete").then_some(())
        })
        .await;
    }

    /// Polls `done` until it gives a value, for 30 s at most.
    async fn until<T, F: std::future::Future<Output = Option<T>>>(
        &self,
        what: &str,
        done: impl Fn() -> F,
    ) -> T {
        let deadline = Instant::now() + Duration::from_secs(31);
        loop {
            if let Some(found) = done().await {
                return found;
            }
            assert!(
                Instant::now() < deadline,
                "{}: {what}: not within 30 s\n{}",
                self.name,
                self.output()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until job `id`'s allocs, by name, have these client statuses.
    async fn allocs_are(&self, id: &str, wanted: &[(&str, &str)]) {
        let mut wanted: Vec<(String, String)> = wanted
            .iter()
            .map(|(n, s)| (n.to_string(), s.to_string()))
            .collect();
        wanted.sort();
        let seen = std::sync::Mutex::new(Vec::new());
        let what = format!("job {id}'s allocs are {wanted:?}");
        tokio::time::timeout(
            Duration::from_secs(30),
            self.until(&what, || async {
                let allocs = self.get(&format!("/v1/job/{id}/allocations")).await;
                *seen.lock().unwrap() = allocs
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|a| format!("{} {} {}", a["Name"], a["ClientStatus"], a["DesiredStatus"]))
                    .collect::<Vec<_>>();
                let mut now: Vec<(String, String)> = allocs
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|a| {
                        let name = a["Name"].as_str().unwrap_or_default().to_string();
                        (name, settled_status(a))
                    })
                    .collect();
                now.sort();
                (now == wanted).then_some(())
            }),
        )
        .await
        .unwrap_or_else(|_| {
            panic!(
                "{}: {what}: last seen {:?}",
                self.name,
                seen.lock().unwrap()
            )
        });
    }

    /// What a user sees of job `id`: the job, its summary, its allocs (by name) and its
    /// evaluations (oldest first).
    async fn observe(&self, id: &str) -> Value {
        let escaped = id.replace('/', "%2F");
        let mut allocs = self.get(&format!("/v1/job/{escaped}/allocations")).await;
        sort_by(&mut allocs, |a| {
            format!("{} {} {}", a["Name"], a["ClientStatus"], a["DesiredStatus"])
        });
        let mut evals = self.get(&format!("/v1/job/{escaped}/evaluations")).await;
        sort_by(&mut evals, |e| {
            format!("{:020}", e["CreateIndex"].as_u64().unwrap_or(0))
        });
        json!({
            "job": self.get(&format!("/v1/job/{escaped}")).await,
            "summary": self.get(&format!("/v1/job/{escaped}/summary")).await,
            "allocs": allocs,
            "evaluations": evals,
        })
    }

    /// `POST /v1/job/:id/plan` of a jobspec, as Nomad's CLI sends it: the job JSON
    /// with its source.
    async fn plan(&self, source: &str) -> Value {
        let client = self.api().client();
        let job: Value = client
            .post(
                "/v1/jobs/parse",
                &json!({"JobHCL": source, "Canonicalize": true}),
            )
            .await
            .unwrap();
        let id = job["ID"].as_str().unwrap().to_string();
        client
            .post(
                &format!("/v1/job/{id}/plan"),
                &json!({
                    "Job": job,
                    "Diff": true,
                    "Submission": {"Source": source, "Format": "hcl2"},
                }),
            )
            .await
            .unwrap()
    }
}

fn sort_by(list: &mut Value, key: impl Fn(&Value) -> String) {
    if let Some(items) = list.as_array_mut() {
        items.sort_by_key(|item| key(item));
    }
}

/// A job of the mock driver in datacenter `scenario`: `group` holds the group's extra
/// lines, `task` the task's.
fn job(id: &str, kind: &str, group: &str, task: &str, run_for: &str) -> String {
    format!(
        "job \"{id}\" {{\n  type        = \"{kind}\"\n  datacenters = [\"scenario\"]\n  \
         group \"g\" {{\n{group}\n    task \"t\" {{\n      driver = \"mock\"\n      \
         config {{\n        run_for = \"{run_for}\"\n      }}\n      resources {{\n        \
         cpu    = 20\n        memory = 16\n      }}\n{task}\n    }}\n  }}\n}}\n"
    )
}

const PORT: &str = "    network {\n      port \"http\" {\n        static = 24680\n      }\n    }";

const FLAKY: &str = r#"job "flaky" {
  type        = "batch"
  datacenters = ["scenario"]
  reschedule {
    attempts       = 1
    interval       = "1h"
    delay          = "5s"
    delay_function = "constant"
  }
  group "g" {
    restart {
      attempts = 0
      mode     = "fail"
    }
    task "fail" {
      driver = "exec"
      config {
        command = "/bin/false"
      }
      resources {
        cpu    = 20
        memory = 16
      }
    }
  }
}
"#;

/// A batch task whose template's env (`env = true`) fills `${APP_GREETING}` in its args.
const TEMPLATE_ENV: &str = r#"job "greeted" {
  type        = "batch"
  datacenters = ["scenario"]
  reschedule {
    attempts  = 0
    unlimited = false
  }
  group "g" {
    restart {
      attempts = 0
      mode     = "fail"
    }
    task "t" {
      driver = "exec"
      config {
        command = "/bin/sh"
        args    = ["-c", "echo \"$0\"", "config=${APP_GREETING}"]
      }
      template {
        data        = "APP_GREETING=hello from the template\n"
        destination = "local/app.env"
        env         = true
      }
      resources {
        cpu    = 20
        memory = 16
      }
    }
  }
}
"#;

/// A task whose template ranges over the catalog's `scdb`, with a change script.
const WATCHER: &str = r#"job "watcher" {
  datacenters = ["scenario"]
  group "g" {
    task "t" {
      driver = "exec"
      config {
        command = "/bin/sleep"
        args    = ["300"]
      }
      template {
        data        = "{{ range nomadService \"scdb\" }}{{ .Name }} {{ end }}"
        destination = "local/servers"
        change_mode = "script"
        change_script {
          command = "/bin/sh"
          args    = ["-c", "cat /local/servers"]
        }
        splay = "0s"
        wait {
          min = "0s"
          max = "1s"
        }
      }
      resources {
        cpu    = 20
        memory = 32
      }
    }
  }
}
"#;

/// The event messages of task `t` of job `id`'s first alloc, oldest first.
/// A submission the plane must refuse: its status, error and problems.
async fn refused(plane: &Plane, name: &str, source: &str) -> Value {
    match plane.api().submit(name, source).await {
        Err(berth_api::client::ClientError::Api(error, status)) => {
            json!({ "status": status.as_u16(), "error": error.error, "problems": error.problems })
        }
        other => panic!("{}: {name} was not refused: {other:?}", plane.name),
    }
}

async fn task_events(plane: &Plane, id: &str) -> Vec<String> {
    let allocs = plane.get(&format!("/v1/job/{id}/allocations")).await;
    let Some(alloc) = allocs.as_array().and_then(|a| a.first()) else {
        return Vec::new();
    };
    let alloc = plane
        .get(&format!(
            "/v1/allocation/{}",
            alloc["ID"].as_str().unwrap_or_default()
        ))
        .await;
    alloc["TaskStates"]["t"]["Events"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            format!(
                "{}: {}",
                e["Type"].as_str().unwrap_or_default(),
                e["DisplayMessage"].as_str().unwrap_or_default()
            )
        })
        .collect()
}

/// Seconds since the epoch.
fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Runs every case on `plane`; what each showed, by case.
async fn run(plane: &mut Plane) -> BTreeMap<&'static str, Value> {
    let mut seen = BTreeMap::new();
    plane.start().await;

    // A static port another job holds: the second job waits, its evaluation naming the
    // collision.
    plane
        .submit("holder", &job("holder", "service", PORT, "", "1h"))
        .await;
    plane
        .allocs_are("holder", &[("holder.g[0]", "running")])
        .await;
    plane
        .submit("clasher", &job("clasher", "service", PORT, "", "1h"))
        .await;
    seen.insert("static port clash", plane.observe("clasher").await);
    // A static port the operator reserved on the node: the job waits the same way.
    let reserved = PORT.replace("24680", "24691");
    plane
        .submit("squatter", &job("squatter", "service", &reserved, "", "1h"))
        .await;
    seen.insert("reserved port", plane.observe("squatter").await);

    // More memory than the node has: accepted, pending, "Resources exhausted".
    let huge = job("huge", "service", "", "", "1h").replace("memory = 16", "memory = 1000000");
    plane.submit("huge", &huge).await;
    seen.insert("resources exhausted", plane.observe("huge").await);

    // A constraint no node meets, and a host volume no node has.
    let windows = job(
        "windows",
        "service",
        "    constraint {\n      attribute = \"${attr.kernel.name}\"\n      value     = \"windows\"\n    }",
        "",
        "1h",
    );
    plane.submit("windows", &windows).await;
    seen.insert("infeasible constraint", plane.observe("windows").await);
    let novolume = job(
        "novolume",
        "service",
        "    volume \"data\" {\n      type   = \"host\"\n      source = \"nowhere\"\n    }",
        "",
        "1h",
    );
    plane.submit("novolume", &novolume).await;
    seen.insert("infeasible volume", plane.observe("novolume").await);

    // A typo in a driver's config: refused at submit by the driver, at the field's line,
    // with the field it meant (the cluster's submit and its placing node check alike).
    let typo = TEMPLATE_ENV.replace("command = ", "comand = ");
    seen.insert(
        "driver config typo",
        refused(plane, "typo.hcl", &typo).await,
    );

    // A driver that spawns its tasks unconfined, which this agent's operator has not
    // allowed: refused at submit, at the task's driver line (the cluster's nodes also
    // report the driver unusable, so nothing would be placed on them).
    let unconfined = "job \"unconfined\" {\n  type        = \"batch\"\n  datacenters = [\"scenario\"]\n  \
                      group \"g\" {\n    task \"t\" {\n      driver = \"undeclared_spawn\"\n    }\n  }\n}\n";
    seen.insert(
        "driver that spawns unconfined",
        refused(plane, "unconfined.hcl", unconfined).await,
    );

    // Plans: a new job, a changed one (one more alloc, which the port forbids), and
    // one that fits nowhere. Nothing is registered.
    let mut plans = serde_json::Map::new();
    plans.insert(
        "new".into(),
        plane.plan(&job("fresh", "service", "", "", "1h")).await,
    );
    let wider = job("holder", "service", PORT, "", "1h")
        .replace("group \"g\" {\n", "group \"g\" {\n    count = 2\n");
    plans.insert("changed".into(), plane.plan(&wider).await);
    plans.insert(
        "exhausted".into(),
        plane.plan(&huge.replace("huge", "huger")).await,
    );
    seen.insert("job plan", Value::Object(plans));

    // Purge, then submit again at once: the new job runs, the old alloc is stopped.
    let cycle = job("cycle", "service", "", "", "1h");
    plane.submit("cycle", &cycle).await;
    plane
        .allocs_are("cycle", &[("cycle.g[0]", "running")])
        .await;
    let purged: Value = plane
        .api()
        .client()
        .delete("/v1/job/cycle?purge=true")
        .await
        .unwrap();
    plane.evaluated(purged["EvalID"].as_str().unwrap()).await;
    plane.submit("cycle", &cycle).await;
    // The old alloc is complete, or already forgotten with the purged job (when a round
    // ran between the purge and the resubmit): either is right, so only the live allocs
    // are compared.
    plane
        .until(
            "the resubmitted job runs one alloc, the old one ended",
            || async {
                let allocs = plane.get("/v1/job/cycle/allocations").await;
                let statuses: Vec<String> = allocs.as_array()?.iter().map(settled_status).collect();
                let running = statuses.iter().filter(|s| *s == "running").count();
                let ended = statuses.iter().all(|s| s == "running" || s == "complete");
                (running == 1 && ended).then_some(())
            },
        )
        .await;
    let mut cycle_seen = plane.observe("cycle").await;
    if let Some(allocs) = cycle_seen["allocs"].as_array_mut() {
        allocs.retain(|a| a["ClientStatus"] == "running");
    }
    if let Some(seen) = cycle_seen.as_object_mut() {
        seen.remove("summary");
    }
    seen.insert("purge and resubmit", cycle_seen);

    // A system job: one alloc on the one node in its datacenter.
    plane
        .submit("everywhere", &job("everywhere", "system", "", "", "1h"))
        .await;
    plane
        .allocs_are("everywhere", &[("everywhere.g[0]", "running")])
        .await;
    seen.insert("system job", plane.observe("everywhere").await);

    // A docker job: its image pulled from a registry into the node's store, and run.
    let registry = berth_testkit::registry::Registry::start();
    let layout = berth_testkit::registry::OciLayout::new();
    layout.busybox(
        "base",
        &[],
        &berth_testkit::registry::ImageSpec {
            entrypoint: &["/bin/sh", "-c"],
            cmd: &["test -f /data/from-image && test -d /local && echo ran"],
            ..Default::default()
        },
    );
    registry.push(&layout, "base", "scenario/busybox:1");
    let container = format!(
        "job \"container\" {{\n  type        = \"batch\"\n  datacenters = [\"scenario\"]\n  \
         group \"g\" {{\n    restart {{\n      attempts = 0\n      mode = \"fail\"\n    }}\n    \
         task \"t\" {{\n      driver = \"docker\"\n      config {{\n        \
         image = \"{}/scenario/busybox:1\"\n      }}\n      resources {{\n        \
         cpu    = 20\n        memory = 16\n      }}\n    }}\n  }}\n}}\n",
        registry.address
    );
    plane.submit("container", &container).await;
    plane
        .allocs_are("container", &[("container.g[0]", "complete")])
        .await;
    // The registry's address differs between the planes: the job's own record is not
    // compared, what became of it is.
    let events: Vec<String> = task_events(plane, "container")
        .await
        .into_iter()
        .map(|event| event.replace(&registry.address, "<registry>"))
        .collect();
    seen.insert("docker job", json!({ "events": events }));

    // A failed alloc is placed again after the delay, once; then the job is dead.
    plane.submit("flaky", FLAKY).await;
    plane
        .allocs_are(
            "flaky",
            &[("flaky.g[0]", "failed"), ("flaky.g[0]", "failed")],
        )
        .await;
    plane
        .until("flaky is dead", || async {
            (plane.get("/v1/job/flaky").await["Status"] == "dead").then_some(())
        })
        .await;
    seen.insert("reschedule", plane.observe("flaky").await);

    // A periodic launch due while every agent is down is made once they are back.
    let due = unix_now() + 8;
    let nightly = job("nightly", "batch", "", "", "0s").replace(
        "  group \"g\"",
        &format!(
            "  periodic {{\n    crons            = [\"{} * * * * * *\"]\n    \
             prohibit_overlap = true\n  }}\n  group \"g\"",
            due % 60
        ),
    );
    plane.submit("nightly", &nightly).await;
    for agent in &mut plane.agents {
        agent.kill9();
    }
    while unix_now() < due + 2 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    plane.start().await;
    let child = format!("nightly/periodic-{due}");
    let wanted = format!("{child}.g[0]");
    plane
        .until("the missed launch is made and completes", || async {
            let allocs = plane
                .api()
                .client()
                .get::<Value>(&format!(
                    "/v1/job/{}/allocations",
                    child.replace('/', "%2F")
                ))
                .await
                .ok()?;
            let done = allocs
                .as_array()?
                .iter()
                .any(|a| a["Name"] == wanted.as_str() && a["ClientStatus"] == "complete");
            // And its job dead: the alloc's end is in the node's own view a moment
            // before its report reaches the cluster, which the job's status reads.
            let job = plane
                .api()
                .client()
                .get::<Value>(&format!("/v1/job/{}", child.replace('/', "%2F")))
                .await
                .ok()?;
            (done && job["Status"] == "dead").then_some(())
        })
        .await;
    let children = plane.get("/v1/jobs?prefix=nightly%2F").await;
    seen.insert(
        "missed periodic launch",
        json!({
            "children": children,
            "child": plane.observe(&child).await,
            "parent": plane.observe("nightly").await,
        }),
    );
    // A template's change script runs inside its task when a service of another job
    // joins the catalog: the same catalog, the same watcher, on both planes.
    plane.submit("watcher", WATCHER).await;
    plane
        .until("the watcher's task starts", || async {
            let events = task_events(plane, "watcher").await;
            events
                .iter()
                .any(|e| e.starts_with("Started"))
                .then_some(())
        })
        .await;
    let service = "    network {\n      port \"db\" {}\n    }\n    service {\n      name     = \"scdb\"\n      port     = \"db\"\n      provider = \"nomad\"\n    }";
    plane
        .submit("scdb", &job("scdb", "service", service, "", "1h"))
        .await;
    let ran = "Template successfully ran script /bin/sh with arguments: [\"-c\", \"cat /local/servers\"]. Exit code: 0";
    let events = plane
        .until("the change script runs", || async {
            let events = task_events(plane, "watcher").await;
            events.iter().any(|e| e.ends_with(ran)).then_some(events)
        })
        .await;
    seen.insert("template change script", json!(events));
    // A template's env fills a name in the driver config; a template may not set
    // berth's own variables (its identity's token among them), and the task fails
    // saying so.
    plane.submit("greeted", TEMPLATE_ENV).await;
    plane
        .allocs_are("greeted", &[("greeted.g[0]", "complete")])
        .await;
    let allocs = plane.get("/v1/job/greeted/allocations").await;
    let alloc = allocs[0]["ID"].as_str().unwrap_or_default().to_string();
    // Read from the node that runs it (`a`, in datacenter "scenario"): an agent serves
    // the files of its own allocs only. The fs endpoints are not yet relayed to the
    // alloc's node, as `alloc exec` is.
    let stdout = plane.agents[0]
        .client()
        .get_bytes(&format!(
            "/v1/client/fs/cat/{alloc}?path=alloc/logs/t.stdout.0"
        ))
        .await
        .unwrap_or_else(|e| panic!("{}: the task's stdout: {e}", plane.name));
    let forger = TEMPLATE_ENV
        .replace("job \"greeted\"", "job \"forger\"")
        .replace("APP_GREETING=", "NOMAD_TOKEN=");
    plane.submit("forger", &forger).await;
    plane
        .allocs_are("forger", &[("forger.g[0]", "failed")])
        .await;
    let failure: Vec<String> = task_events(plane, "forger")
        .await
        .into_iter()
        .filter(|e| e.contains("NOMAD_TOKEN"))
        .collect();
    seen.insert(
        "template env in driver config",
        json!({ "stdout": String::from_utf8_lossy(&stdout), "refused": failure }),
    );
    // An artifact, an identity and a script check that restarts its task once: the same
    // hooks on both planes, and the cluster's keyring (a lone agent's one-node one).
    let server = berth_testkit::file_server::FileServer::start();
    let text = b"hello from the artifact\n";
    let sum: String = {
        use sha2::Digest as _;
        sha2::Sha256::digest(text)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    };
    let url = server.serve(
        "/hello.txt",
        vec![berth_testkit::file_server::Answer::body(&text[..])],
    );
    plane.submit("equipped", &equipped(&url, &sum)).await;
    let kept = ["Downloading Artifacts", "Restart Signaled", "Started"];
    let events = plane
        .until(
            "the check restarts the task once, and it runs again",
            || async {
                let events = task_events(plane, "equipped").await;
                let started = events.iter().filter(|e| e.starts_with("Started")).count();
                (started == 2).then_some(events)
            },
        )
        .await;
    let kept: Vec<&String> = events
        .iter()
        .filter(|e| kept.iter().any(|k| e.starts_with(k)))
        .collect();
    let jwks = plane.get("/.well-known/jwks.json").await;
    // `alloc exec` into it, asked of the agent that takes the requests: on the cluster
    // that is `b`, which carries the session to `a`.
    let allocs = plane.get("/v1/job/equipped/allocations").await;
    let alloc = allocs[0]["ID"].as_str().unwrap_or_default().to_string();
    let script = "cat /local/hello.txt; test -n \"$NOMAD_TOKEN\" && echo has-token; \
                  echo oops >&2; exit 3";
    let (stdout, stderr, exit) = crate::alloc_exec::exec_once(
        &plane.api().client(),
        &alloc,
        "t",
        &["/bin/sh", "-c", script],
    )
    .await;
    seen.insert(
        "alloc exec",
        json!({ "stdout": stdout, "stderr": stderr, "exit": exit }),
    );
    seen.insert(
        "artifact, identity and check",
        json!({
            "events": kept,
            "jwks": jwks["keys"].as_array().map(|keys| {
                keys.iter().map(|k| json!([k["kty"], k["crv"], k["alg"]])).collect::<Vec<_>>()
            }),
        }),
    );
    seen
}

/// `value` without what differs between any two runs: ids (UUIDs) and launch times in
/// child ids become placeholders; indexes, times and the node's own fields go.
fn normal(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(key, _)| !volatile(key))
                .map(|(key, value)| (key.clone(), normal(value)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(normal).collect()),
        Value::String(text) => Value::String(without_ids(text)),
        other => other.clone(),
    }
}

/// Fields whose values are a run's own: store indexes, clock times, durations measured.
fn volatile(key: &str) -> bool {
    key.ends_with("Index")
        || key.ends_with("Time")
        || key.ends_with("At")
        || matches!(key, "LastContact" | "Time" | "SubmitTime" | "Version")
}

/// `text` with each UUID as `<id>`, each `periodic-<unix time>` as `periodic-<time>`,
/// and the second of the periodic job's cron (each plane's is its own) as `<second>`.
fn without_ids(text: &str) -> String {
    let cron = regex::Regex::new("^[0-9]+ (\\* ){5}\\*$").unwrap();
    if cron.is_match(text) {
        return "<second> * * * * * *".into();
    }
    let uuid =
        regex::Regex::new("[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}").unwrap();
    let launch = regex::Regex::new("periodic-[0-9]+").unwrap();
    let text = uuid.replace_all(text, "<id>");
    launch.replace_all(&text, "periodic-<time>").into_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lone_agent_and_a_three_node_cluster_answer_every_scenario_alike() {
    let mut lone = Plane::lone();
    let mut cluster = Plane::cluster();
    let (alone, clustered) = tokio::join!(run(&mut lone), run(&mut cluster));
    let mut differ = Vec::new();
    for (case, seen) in &alone {
        let (one, three) = (normal(seen), normal(&clustered[case]));
        if one != three {
            differ.push(format!(
                "{case}:\nlone agent: {}\nthree-node cluster: {}",
                serde_json::to_string_pretty(&one).unwrap(),
                serde_json::to_string_pretty(&three).unwrap()
            ));
        }
    }
    assert!(differ.is_empty(), "{}", differ.join("\n\n"));
    // The answers say what each case is about (the same wrong answer twice would pass
    // the comparison).
    let seen =
        |case: &str, path: &[&str]| path.iter().fold(&alone[case], |v, key| &v[*key]).clone();
    let failed = |case: &str| seen(case, &["evaluations"])[0]["FailedTGAllocs"]["g"].clone();
    assert_eq!(
        failed("static port clash")["DimensionExhausted"],
        json!({"network: reserved port collision 24680": 1})
    );
    assert_eq!(seen("static port clash", &["job", "Status"]), "pending");
    let typo = seen("driver config typo", &[]);
    assert_eq!(typo["status"], 400, "{typo:#}");
    let problem = typo["problems"][0].as_str().unwrap_or_default();
    assert!(
        problem.starts_with("typo.hcl:16:9: job.greeted.group.g.task.t.config: driver \"exec\" (built-in): invalid exec config: unknown field `comand`")
            && problem.ends_with("(did you mean `command`?)"),
        "{typo:#}"
    );
    let unconfined = seen("driver that spawns unconfined", &[]);
    assert_eq!(unconfined["status"], 400, "{unconfined:#}");
    let problem = unconfined["problems"][0].as_str().unwrap_or_default();
    assert!(
        problem.contains(
            ".task.t.driver: task \"t\": driver \"undeclared_spawn\" runs its tasks unconfined"
        ) && problem.contains("allow_unconfined = true }"),
        "{unconfined:#}"
    );
    let templated = seen("template env in driver config", &[]);
    assert_eq!(
        templated["stdout"], "config=hello from the template\n",
        "{templated:#}"
    );
    assert!(
        templated["refused"].as_array().into_iter().flatten().any(|event| {
            event.as_str().unwrap_or_default().contains(
                "\"NOMAD_TOKEN\": NOMAD_* and BERTH_* variables are set by berth; a template may not set them",
            )
        }),
        "{templated:#}"
    );
    assert_eq!(
        failed("reserved port")["DimensionExhausted"],
        json!({"network: reserved port collision 24691": 1})
    );
    assert_eq!(seen("reserved port", &["job", "Status"]), "pending");
    assert_eq!(
        failed("resources exhausted")["DimensionExhausted"],
        json!({"memory": 1})
    );
    let why = seen("resources exhausted", &["evaluations"])[0]["StatusDescription"].clone();
    assert!(
        why.as_str()
            .unwrap()
            .contains("Resources exhausted: memory (")
            && why.as_str().unwrap().contains(" MiB free)"),
        "{why}"
    );
    assert_eq!(
        failed("infeasible constraint")["ConstraintFiltered"],
        json!({"constraint ${attr.kernel.name} = \"windows\"": 1})
    );
    assert_eq!(
        failed("infeasible volume")["ConstraintFiltered"],
        json!({"missing host volume \"nowhere\"": 1})
    );
    let plans = seen("job plan", &[]);
    assert_eq!(
        plans["new"]["Annotations"]["DesiredTGUpdates"]["g"]["Place"],
        1
    );
    let changed = &plans["changed"];
    assert_eq!(
        changed["Annotations"]["DesiredTGUpdates"]["g"]["DestructiveUpdate"], 1,
        "{changed:#}"
    );
    assert_eq!(
        changed["FailedTGAllocs"]["g"]["DimensionExhausted"],
        json!({"network: reserved port collision 24680": 1}),
        "{changed:#}"
    );
    assert_eq!(
        plans["exhausted"]["FailedTGAllocs"]["g"]["DimensionExhausted"],
        json!({"memory": 1})
    );
    assert_eq!(seen("purge and resubmit", &["job", "Status"]), "running");
    assert_eq!(seen("system job", &["allocs"]).as_array().unwrap().len(), 1);
    let flaky = seen("reschedule", &["allocs"]);
    let events = flaky
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a["RescheduleTracker"]["Events"].as_array())
        .map(Vec::len)
        .sum::<usize>();
    assert_eq!(events, 1, "{flaky:#}");
    let script = seen("template change script", &[]);
    let messages: Vec<&str> = script
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        messages.contains(&"Task Hook: Template re-rendered: local/servers"),
        "{messages:?}"
    );
    assert_eq!(
        seen("missed periodic launch", &["children"])
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        seen("docker job", &["events"])
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .filter(|e| e.starts_with("Started") || e.starts_with("Terminated"))
            .collect::<Vec<_>>(),
        [
            "Started: Task started by client",
            "Terminated: Exit Code: 0"
        ]
    );
    assert_eq!(
        seen("artifact, identity and check", &[]),
        json!({
            "events": [
                "Downloading Artifacts: Client is downloading artifacts",
                "Started: Task started by client",
                "Restart Signaled: healthcheck: check \"ready\" unhealthy",
                "Started: Task started by client",
            ],
            // The current key, and the next one, published a period early.
            "jwks": [["OKP", "Ed25519", "EdDSA"], ["OKP", "Ed25519", "EdDSA"]],
        })
    );
    assert_eq!(
        seen("alloc exec", &[]),
        json!({
            "stdout": "hello from the artifact\nhas-token\n",
            "stderr": "oops\n",
            "exit": 3,
        })
    );
}
