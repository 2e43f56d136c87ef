//! Jobspecs built to take the agent down: one that nests past the evaluator's stack, and
//! expensive ones sent by several clients at once. The agent refuses the first with an
//! error naming the bound and its line, evaluates the others on its own threads (the
//! operator's socket is answered meanwhile), and stays up. In a cluster, the same
//! source written straight into the store is skipped and reported by every agent.

use std::io::{Read as _, Write as _};
use std::time::{Duration, Instant};

use berth_harness::AgentProcess;
use serde_json::{Value, json};

use crate::nomad_api::http;

/// The issue's jobspec: `meta { x = [[1]][*]…[*] }` with `count` splats (2,200 aborted
/// the agent).
fn splats(name: &str, count: usize) -> String {
    format!(
        "job \"{name}\" {{\n  meta {{\n    x = [[1]]{}\n  }}\n  group \"g\" {{\n    task \"t\" {{\n      driver = \"mock\"\n    }}\n  }}\n}}\n",
        "[*]".repeat(count)
    )
}

const FINE: &str =
    "job \"fine\" {\n  group \"g\" {\n    task \"t\" {\n      driver = \"mock\"\n    }\n  }\n}\n";

const NESTING_ERROR: &str = "nested more than 128 levels deep";

#[tokio::test(flavor = "multi_thread")]
async fn three_thousand_splats_are_refused_and_the_agent_answers_the_next_request() {
    let mut agent = AgentProcess::new();
    agent.start().await;
    let port = agent.port();
    let deep = splats("deep", 3000);

    // `POST /v1/jobs/parse`: a 400 naming the bound and the line.
    let body = json!({ "JobHCL": deep }).to_string();
    let (status, _, answer) =
        tokio::task::spawn_blocking(move || http(port, "POST", "/v1/jobs/parse", "", &body))
            .await
            .unwrap();
    assert_eq!(status, 400, "{answer}");
    assert!(answer.contains(NESTING_ERROR), "{answer}");
    assert!(answer.contains("berth allows 128"), "{answer}");
    assert!(answer.contains(":3:"), "the line of the chain: {answer}");

    // As a register's `Submission.Source` (the JSON job is what is registered when the
    // source does not give it; here the JSON names no group, so it is refused).
    let register = json!({
        "Job": { "ID": "deep", "Name": "deep", "TaskGroups": [] },
        "Submission": { "Source": deep, "Format": "hcl2" },
    })
    .to_string();
    let (status, _, answer) =
        tokio::task::spawn_blocking(move || http(port, "POST", "/v1/jobs", "", &register))
            .await
            .unwrap();
    assert!(status == 400 || status == 500, "{status}: {answer}");

    // berth's own submit: the same error.
    let refused = agent.submit("deep.hcl", &deep).await.unwrap_err();
    assert!(
        format!("{refused:?}").contains(NESTING_ERROR),
        "{refused:?}"
    );

    // Still up, and answering.
    let (status, _, answer) =
        tokio::task::spawn_blocking(move || http(port, "GET", "/v1/agent/health", "", ""))
            .await
            .unwrap();
    assert_eq!(status, 200, "{answer}\n{}", agent.output());
    let fine = json!({ "JobHCL": FINE }).to_string();
    let (status, _, answer) =
        tokio::task::spawn_blocking(move || http(port, "POST", "/v1/jobs/parse", "", &fine))
            .await
            .unwrap();
    assert_eq!(status, 200, "{answer}");
}

/// The issue's expensive jobspec: `length(distinct(L))` of 1,024 lists of 1,000
/// numbers that differ at their ends, about 2 MB.
fn expensive(name: &str) -> String {
    let inner = vec!["1"; 1000].join(",");
    let lists: Vec<String> = (0..1024).map(|i| format!("[{inner},{i}]")).collect();
    format!(
        "job \"{name}\" {{\n  meta {{\n    n = length(distinct([{}]))\n  }}\n  group \"g\" {{\n    task \"t\" {{\n      driver = \"mock\"\n    }}\n  }}\n}}\n",
        lists.join(",")
    )
}

/// `GET /v1/agent/health` on the agent's Unix socket: how long the answer took.
fn health_on_socket(socket: &std::path::Path) -> (Duration, String) {
    on_socket(socket, "GET", "/v1/agent/health", "")
}

/// One request on the agent's Unix socket: how long the answer took, and the answer.
fn on_socket(socket: &std::path::Path, method: &str, path: &str, body: &str) -> (Duration, String) {
    let started = Instant::now();
    let mut stream = std::os::unix::net::UnixStream::connect(socket).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: berth\r\nConnection: close\r\nContent-Type: \
         application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    (started.elapsed(), answer)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_operators_socket_answers_within_100_ms_while_four_clients_send_expensive_jobspecs() {
    let mut agent = AgentProcess::production(|port, dir| {
        format!(
            "http {{\n  address = \"127.0.0.1:{port}\"\n  token_file = \"{}/api-token\"\n}}\n",
            dir.display()
        )
    });
    agent.start().await;
    let port = agent.port();
    let token = std::fs::read_to_string(agent.path().join("api-token"))
        .unwrap()
        .trim()
        .to_string();
    let socket = agent.socket();
    // Quiet: the socket's usual answer time.
    let (quiet, answer) = health_on_socket(&socket);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");

    let load_for = Duration::from_secs(8);
    let clients: Vec<_> = (0..4)
        .map(|client| {
            let token = token.clone();
            let body = json!({ "JobHCL": expensive(&format!("e{client}")) }).to_string();
            assert!(body.len() > 2_000_000);
            std::thread::spawn(move || {
                let started = Instant::now();
                let mut answered = Vec::new();
                while started.elapsed() < load_for {
                    let (status, _, answer) = http(port, "POST", "/v1/jobs/parse", &token, &body);
                    answered.push((status, answer.chars().take(300).collect::<String>()));
                }
                answered
            })
        })
        .collect();
    // Let the clients' bodies arrive and their evaluations start.
    std::thread::sleep(Duration::from_millis(500));
    let mut slowest = Duration::ZERO;
    let mut slowest_parse = Duration::ZERO;
    let mut asked = 0;
    let started = Instant::now();
    // The operator's own jobspec: evaluated in the operator's lane, never behind theirs.
    let small = json!({ "JobHCL": "job \"mine\" {\n  group \"g\" {\n    task \"t\" {\n      driver = \"mock\"\n    }\n  }\n}\n" }).to_string();
    while started.elapsed() < load_for - Duration::from_secs(1) {
        let socket = socket.clone();
        let small = small.clone();
        let ((took, answer), (parse_took, parsed)) = tokio::task::spawn_blocking(move || {
            (
                health_on_socket(&socket),
                on_socket(&socket, "POST", "/v1/jobs/parse", &small),
            )
        })
        .await
        .unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(parsed.starts_with("HTTP/1.1 200"), "{parsed}");
        slowest = slowest.max(took);
        slowest_parse = slowest_parse.max(parse_took);
        asked += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut parsed = 0;
    for client in clients {
        for (status, answer) in client.join().unwrap() {
            assert!(status == 200 || status == 400, "{status}: {answer}");
            parsed += 1;
        }
    }
    eprintln!(
        "health on the socket: {quiet:?} quiet, at most {slowest:?} over {asked} requests (the \
         operator's parse at most {slowest_parse:?}) while four clients had {parsed} expensive \
         jobspecs answered"
    );
    assert!(parsed >= 4, "every client was answered at least once");
    assert!(
        slowest < Duration::from_millis(100),
        "the operator waited {slowest:?}"
    );
    assert!(
        slowest_parse < Duration::from_millis(500),
        "the operator's jobspec waited {slowest_parse:?} behind the clients'"
    );
}

/// A record no submit would have accepted, written straight into the cluster's store (as
/// an agent with other bounds, or anyone with the store's credentials, could): the
/// scheduler on whichever agent leads skips it, every agent reports it as dead with its
/// problem and logs it once, none crashes, and the cluster goes on placing other jobs.
#[tokio::test(flavor = "multi_thread")]
async fn a_poisoned_record_in_the_store_is_skipped_and_reported_by_every_agent() {
    use berth_testkit::etcd::EtcdServer;
    let etcd = EtcdServer::start();
    let mut agents: Vec<AgentProcess> = ["node-a", "node-b", "node-c"]
        .iter()
        .map(|name| crate::cluster::member(&etcd, name))
        .collect();
    for agent in &mut agents {
        agent.start().await;
    }
    let poisoned = berth_cluster::state::ClusterJob {
        id: "deep".into(),
        source_name: "deep.hcl".into(),
        source: splats("deep", 3000),
        variables: Default::default(),
        submitted_ms: 1,
        stopped: false,
        may_run_plugins: false,
        child_of: None,
        by_operator: false,
        owner: None,
        typed: None,
    };
    // Typed records this agent cannot take: one a newer berth stored, one damaged. Their
    // sources would evaluate; they are not read instead (a job means what it was stored
    // as), and are reported.
    let fine_source = |id: &str| {
        format!(
            "job \"{id}\" {{\n  group \"g\" {{\n    task \"t\" {{\n      driver = \"mock\"\n    }}\n  }}\n}}\n"
        )
    };
    let typed = |id: &str, schema: u32, job: Value| berth_cluster::state::ClusterJob {
        id: id.into(),
        source_name: format!("{id}.hcl"),
        source: fine_source(id),
        typed: Some(berth_cluster::typed::TypedJob { schema, job }),
        ..poisoned.clone()
    };
    let records = vec![
        ("deep", poisoned.clone()),
        (
            "future",
            typed("future", berth_cluster::typed::JOB_SCHEMA + 1, json!({})),
        ),
        (
            "damaged",
            typed(
                "damaged",
                berth_cluster::typed::JOB_SCHEMA,
                json!({"groups": 7}),
            ),
        ),
    ];
    let access =
        berth_cluster::etcd_access::EtcdAccess::from_settings(&etcd.settings("/berth")).unwrap();
    tokio::task::spawn_blocking(move || {
        let store = berth_cluster::etcd::Etcd::connect(&access).unwrap();
        for (id, record) in records {
            let client = store.clone();
            let value = serde_json::to_vec(&record).unwrap();
            store
                .block(async move { client.put(&format!("/e2e/jobs/{id}"), value, 0).await })
                .unwrap();
        }
    })
    .await
    .unwrap();

    // The cluster still places a job submitted after it (the scheduler went through a
    // round with the poisoned record in it).
    agents[1]
        .submit(
            "fine.hcl",
            "job \"fine\" {\n  group \"g\" {\n    count = 3\n    task \"t\" {\n      driver = \"exec\"\n      config {\n        command = \"/bin/sleep\"\n        args    = [\"600\"]\n      }\n      resources {\n        cpu    = 50\n        memory = 16\n      }\n    }\n  }\n}\n",
        )
        .await
        .unwrap();
    crate::cluster::wait_allocs(
        &agents[2],
        "fine",
        "3 running allocs",
        Duration::from_secs(30),
        |all| {
            crate::cluster::running_per_node(all)
                .values()
                .sum::<usize>()
                == 3
        },
    )
    .await;

    for round in 0..2 {
        for agent in &agents {
            let job: Value = agent.client().get("/v1/job/deep").await.unwrap();
            assert_eq!(job["Status"], "dead", "{job}");
            let why = job["StatusDescription"].as_str().unwrap_or_default();
            assert!(
                why.contains("cannot be evaluated") && why.contains(NESTING_ERROR),
                "{why}"
            );
            let listed: Value = agent.client().get("/v1/jobs").await.unwrap();
            assert!(
                listed
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|j| j["ID"] == "deep" && j["Status"] == "dead"),
                "{listed}"
            );
            let allocs = crate::cluster::allocs(agent, "deep").await;
            assert!(allocs.is_empty(), "round {round}: {allocs:?}");
            let newer = format!(
                "the job was stored by a newer berth (job schema {}",
                berth_cluster::typed::JOB_SCHEMA + 1
            );
            for (id, said) in [
                ("future", newer.as_str()),
                ("damaged", "the stored job cannot be read: invalid type"),
            ] {
                let job: Value = agent.client().get(&format!("/v1/job/{id}")).await.unwrap();
                assert_eq!(job["Status"], "dead", "{job}");
                let why = job["StatusDescription"].as_str().unwrap_or_default();
                assert!(why.contains(said), "{id}: {why}");
                assert!(crate::cluster::allocs(agent, id).await.is_empty());
            }
        }
    }
    for agent in &agents {
        let me: berth_api::AgentSelf = agent.client().get("/v1/berth/agent/self").await.unwrap();
        assert!(!me.drivers.is_empty());
        let output = agent.output();
        for id in ["deep", "future", "damaged"] {
            let logged = output
                .lines()
                .filter(|l| {
                    l.contains("a job recorded in the cluster cannot be evaluated")
                        && l.contains(&format!("job={id} "))
                })
                .count();
            assert_eq!(logged, 1, "{id} logged once per record version:\n{output}");
        }
    }
}

/// Locals built on locals: each nests its predecessor 60 levels deeper, 40 of them, so
/// each expression is shallow but the value is 2,400 levels deep (5.7 KB; shaping it as
/// JSON on an async worker overflowed its stack and aborted the agent).
fn deep_locals(name: &str) -> String {
    let mut locals = String::from("locals {\n  l0 = 1\n");
    for i in 1..=40 {
        locals.push_str(&format!(
            "  l{i} = {}local.l{}{}\n",
            "[".repeat(60),
            i - 1,
            "]".repeat(60)
        ));
    }
    locals.push_str("}\n");
    format!(
        "{locals}job \"{name}\" {{\n  group \"g\" {{\n    task \"t\" {{\n      driver = \"exec\"\n      config {{\n        command = \"/bin/true\"\n        x = local.l40\n      }}\n    }}\n  }}\n}}\n"
    )
}

/// A `for` over a literal list of 1,024 whose body is a tuple of `width` names: no
/// function builds anything, yet evaluating it builds `1,024 × width` values (at
/// 100,000 wide it took 8 s of CPU, past the 2 s budget, and was answered 200).
fn looped_tuple(name: &str, width: usize) -> String {
    let list: Vec<String> = (0..1024).map(|i| i.to_string()).collect();
    format!(
        "job \"{name}\" {{\n  meta {{\n    x = \"${{length([for i in [{}] : length([{}])])}}\"\n  }}\n  group \"g\" {{\n    task \"t\" {{\n      driver = \"mock\"\n    }}\n  }}\n}}\n",
        list.join(","),
        vec!["i"; width].join(",")
    )
}

/// What the attack review of the evaluation bounds found: values nested deep through
/// locals, and loops whose bodies build without calling a function. Each is refused
/// at once, naming its bound, and the agent answers the next request.
#[tokio::test(flavor = "multi_thread")]
async fn deep_locals_and_loops_that_build_without_functions_are_refused_at_once() {
    let mut agent = AgentProcess::new();
    agent.start().await;
    let port = agent.port();
    for (jobspec, bound) in [
        (deep_locals("deep"), "more than 64 levels deep"),
        (
            looped_tuple("wide", 100_000),
            "would build more than 16 MiB",
        ),
        (looped_tuple("mem", 10_000), "would build more than 16 MiB"),
    ] {
        let body = json!({ "JobHCL": jobspec }).to_string();
        let started = Instant::now();
        let (status, _, answer) =
            tokio::task::spawn_blocking(move || http(port, "POST", "/v1/jobs/parse", "", &body))
                .await
                .unwrap();
        assert_eq!(status, 400, "{answer}\n{}", agent.output());
        assert!(answer.contains(bound), "{answer}");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
    }
    // A loop of the same shape within the bounds still evaluates.
    let fine = json!({ "JobHCL": looped_tuple("small", 100) }).to_string();
    let (status, _, answer) =
        tokio::task::spawn_blocking(move || http(port, "POST", "/v1/jobs/parse", "", &fine))
            .await
            .unwrap();
    assert_eq!(status, 200, "{answer}");
    assert!(answer.contains("\"x\":\"1024\""), "{answer}");
}

/// A jobspec of a few hundred bytes that evaluates to a job of megabytes (a thousand
/// tasks from a dynamic block, each with 2 KB of env): refused at submit with its size,
/// instead of a record the store cannot take; the agent keeps serving.
#[tokio::test(flavor = "multi_thread")]
async fn a_small_source_that_evaluates_to_a_huge_job_is_refused_with_its_size() {
    let mut agent = AgentProcess::new();
    agent.start().await;
    let source = r#"job "wide" {
  group "g" {
    dynamic "task" {
      for_each = range(1000)
      labels   = ["t${task.value}"]
      content {
        driver = "mock"
        config {
          run_for = "1h"
        }
        env {
          PADDING = format("%2000s", "x")
        }
      }
    }
  }
}
"#;
    assert!(source.len() < 1024);
    let refused = agent
        .submit("wide.hcl", source)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("once evaluated; a cluster keeps at most 1024 KiB of one job"),
        "{refused}"
    );
    let fine = "job \"fine\" {\n  group \"g\" {\n    task \"t\" {\n      driver = \"mock\"\n    }\n  }\n}\n";
    agent.submit("fine.hcl", fine).await.unwrap();
}
