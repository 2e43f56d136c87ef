//! Templates that read Consul, end to end against the Consul double
//! (`berth_testkit::consul`): keys and a service's healthy instances rendered through
//! the agent's `consul` block and its token; rendered again when a key changes or an
//! instance's check fails; a key the token may not read fails the task with Consul's
//! refusal; and without a `consul` block such a template is refused at submit.

use std::time::{Duration, Instant};

use berth_harness::AgentProcess;
use berth_model::status::ClientStatus;
use berth_testkit::consul::{ConsulDouble, Policy};

const CONFIG: &str = r#"upstream {{ key "app/upstream" }}
port {{ keyOrDefault "app/port" "8080" }}
{{ range ls "app/limits" }}limit {{ .Key }} {{ .Value }}
{{ end }}{{ range service "db" }}server {{ .ID }} {{ .Address }}
{{ end }}"#;

fn job(data: &str) -> String {
    format!(
        r#"job "app" {{
  group "g" {{
    restart {{
      attempts = 0
    }}
    task "app" {{
      driver = "exec"
      template {{
        data        = {data}
        destination = "local/app.conf"
        change_mode = "noop"
        wait {{
          min = "0s"
          max = "1s"
        }}
      }}
      config {{
        command = "/bin/sleep"
        args    = ["300"]
      }}
    }}
  }}
}}
"#,
        data = serde_json::to_string(data).unwrap()
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_template_renders_consul_keys_and_services_and_again_when_they_change() {
    let consul = ConsulDouble::start().await;
    consul.add_token(
        "berth-templates",
        Policy {
            service_read: vec!["db".into()],
            key_read: vec!["app/".into()],
            ..Policy::default()
        },
    );
    consul.put_key("app/upstream", "10.0.0.9:80");
    consul.put_key("app/limits/rps", "100");
    consul.put_key("app/limits/burst", "20");
    consul.put_key("secret/password", "hunter2");
    consul.add_service("db-1", "db");
    consul.add_service("db-2", "db");
    consul.add_check("db-2-alive", "db-2");
    let mut agent = AgentProcess::with_config(&format!(
        "consul {{\n  address = \"{}\"\n  token = \"berth-templates\"\n}}\n",
        consul.address()
    ));
    agent.start().await;
    let alloc = agent.run_job("app.hcl", &job(CONFIG)).await;
    let file = agent
        .path()
        .join("data/allocs")
        .join(&alloc)
        .join("tasks/app/local/app.conf");
    let read = || std::fs::read_to_string(&file).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(30);
    while read().is_empty() {
        assert!(Instant::now() < deadline, "never rendered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        read(),
        "upstream 10.0.0.9:80\nport 8080\nlimit burst 20\nlimit rps 100\n\
         server db-1 127.0.0.1\nserver db-2 127.0.0.1\n"
    );
    // A key changes, and an instance's check fails: the file follows, polled (after
    // the watcher's first look, which comes as the task starts).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let changed = Instant::now();
    consul.put_key("app/port", "9090");
    consul.set_check_status("db-2-alive", "critical");
    let followed = |text: String| text.contains("port 9090\n") && !text.contains("db-2");
    while !followed(read()) {
        assert!(
            Instant::now() < changed + Duration::from_secs(30),
            "{}",
            read()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!("Consul's change rendered {:?} after it", changed.elapsed());
    // The file is written before its event is recorded.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let status = agent.alloc(&alloc).await;
        assert_eq!(status.client_status, ClientStatus::Running);
        let events = format!("{:#?}", status.tasks["app"].events);
        if events.contains("Template re-rendered: local/app.conf") {
            break;
        }
        assert!(Instant::now() < deadline, "{events}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // A key the token may not read: Consul's refusal fails the task, named.
    let denied = agent
        .run_job(
            "denied.hcl",
            &job("{{ key \"secret/password\" }}").replace("\"app\"", "\"denied\""),
        )
        .await;
    let status = agent.finished(&denied).await;
    assert_eq!(status.client_status, ClientStatus::Failed);
    let events = format!("{:#?}", status.tasks["denied"].events);
    assert!(
        events.contains(
            "Consul refused reading key \\\"secret/password\\\": 403: Permission denied: token \
             with AccessorID"
        ),
        "{events}"
    );
    let secret = agent
        .path()
        .join("data/allocs")
        .join(&denied)
        .join("tasks/denied/local/app.conf");
    assert!(secret.parent().unwrap().is_dir());
    assert!(!secret.exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_template_that_reads_consul_is_refused_without_a_consul_block_or_when_denied() {
    let mut agent = AgentProcess::new();
    agent.start().await;
    let Err(berth_api::client::ClientError::Api(error, _)) =
        agent.submit("app.hcl", &job(CONFIG)).await
    else {
        panic!("a template that reads Consul was accepted without a consul block");
    };
    assert_eq!(
        error.problems,
        [
            "app.hcl:8:7: job.app.group.g.task.app.template: local/app.conf: key reads Consul, \
          and this agent has no consul block (nomadService reads the services berth runs)"
        ]
    );

    // An operator whose Consul token reads more than jobs should see denies the
    // functions, as Nomad's client does.
    let consul = ConsulDouble::start().await;
    let mut denying = AgentProcess::with_config(&format!(
        "consul {{\n  address = \"{}\"\n}}\ntemplate {{\n  function_denylist = [\"key\", \"tree\"]\n}}\n",
        consul.address()
    ));
    denying.start().await;
    let Err(berth_api::client::ClientError::Api(error, _)) =
        denying.submit("app.hcl", &job(CONFIG)).await
    else {
        panic!("a denied function was accepted");
    };
    assert_eq!(
        error.problems,
        [
            "app.hcl:8:7: job.app.group.g.task.app.template: local/app.conf: template function \
          \"key\" is denied on this agent (its template { function_denylist })"
        ]
    );
    denying
        .submit(
            "ok.hcl",
            &job("{{ keyOrDefault \"app/x\" \"y\" }}").replace("\"app\"", "\"ok\""),
        )
        .await
        .unwrap();
}

/// After the agent restarts (killed with -9), a running task's templates are watched
/// again: a change made while the agent was down is rendered and signalled at once, and
/// so is the next one.
#[tokio::test(flavor = "multi_thread")]
async fn templates_are_watched_again_after_an_agent_restart() {
    let consul = ConsulDouble::start().await;
    consul.put_key("app/port", "8001");
    let mut agent = AgentProcess::with_config(&format!(
        "consul {{\n  address = \"{}\"\n}}\n",
        consul.address()
    ));
    agent.start().await;
    let template = |mode: &str| {
        format!(
            r#"      template {{
        data        = "port {{{{ key \"app/port\" }}}}\n"
        destination = "local/app.conf"
        {mode}
        wait {{
          min = "0s"
          max = "1s"
        }}
      }}"#
        )
    };
    let source = format!(
        r#"job "app" {{
  group "g" {{
    task "app" {{
      driver = "exec"
{signal}
      config {{
        command = "/bin/sh"
        args    = ["-c", "trap 'cat local/app.conf' HUP; echo start; while :; do sleep 0.1; done"]
      }}
    }}
    task "scripted" {{
      driver = "exec"
      env {{
        APP_MARK = "m1"
      }}
{script}
      config {{
        command = "/bin/sh"
        args    = ["-c", "id -u > local/task-uid; sleep 300"]
      }}
    }}
  }}
}}
"#,
        signal = template("change_mode = \"signal\"\n        change_signal = \"SIGHUP\""),
        script = template(
            "change_mode = \"script\"\n        change_script {\n          command = \"/bin/sh\"\n          \
             args = [\"-c\", \"echo \\\"$APP_MARK $(id -u) $(cat /local/app.conf)\\\" >> /local/ran\"]\n        }"
        ),
    );
    let alloc = agent.run_job("app.hcl", &source).await;
    let out = |agent: &AgentProcess| agent.task_stdout(&alloc, "app");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !out(&agent).contains("start") {
        assert!(Instant::now() < deadline, "never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    agent.kill9();
    consul.put_key("app/port", "8002");
    agent.start().await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !out(&agent).contains("port 8002") {
        if Instant::now() > deadline {
            let status = agent.alloc(&alloc).await;
            let log = agent.output();
            let from = (log.len().saturating_sub(4000)..=log.len())
                .find(|i| log.is_char_boundary(*i))
                .unwrap_or(0);
            let tail = &log[from..];
            panic!(
                "the change made while the agent was down: {}
{:#?}
...{tail}",
                out(&agent),
                status.tasks["app"].events
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    consul.put_key("app/port", "8003");
    while !out(&agent).contains("port 8003") {
        assert!(
            Instant::now() < deadline,
            "the change after the restart: {}",
            out(&agent)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The same task all along: recovered, never restarted.
    assert_eq!(out(&agent).matches("start").count(), 1, "{}", out(&agent));
    // The change script ran after the restart with the environment and user of the
    // task's start, which the agent recorded.
    let dir = agent
        .path()
        .join("data/allocs")
        .join(&alloc)
        .join("tasks/scripted/local");
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap_or_default();
    while !read("ran").contains("port 8003") {
        assert!(
            Instant::now() < deadline,
            "the script after the restart: {}",
            read("ran")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let uid = read("task-uid");
    assert!(
        read("ran").contains(&format!("m1 {} port 8003", uid.trim())),
        "{}",
        read("ran")
    );
}

/// The corpus's Consul jobspec, run as written against the Consul double: its KV and
/// the tagged, healthy instances of `db`.
#[tokio::test(flavor = "multi_thread")]
async fn the_corpus_consul_config_job_renders_its_keys_and_service() {
    let consul = ConsulDouble::start().await;
    consul.put_key("app/log_level", "debug");
    consul.put_key("app/limits/rps", "100");
    consul.put_key("app/limits/burst", "20");
    consul.add_service("db-1", "db");
    consul.register_as_another_client("db-1", &["primary"]);
    consul.add_service("db-2", "db");
    let mut agent = AgentProcess::with_config(&format!(
        "consul {{\n  address = \"{}\"\n}}\n",
        consul.address()
    ));
    agent.start().await;
    let source = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/jobspecs/template-consul-config.nomad.hcl"),
    )
    .unwrap();
    let alloc = agent.run_job("consul-config.hcl", &source).await;
    let file = agent
        .path()
        .join("data/allocs")
        .join(&alloc)
        .join("tasks/app/local/app.conf");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !file.exists() {
        assert!(Instant::now() < deadline, "never rendered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        "log_level = \"debug\"\nlimit_burst = 20\nlimit_rps = 100\ndb = \"127.0.0.1:0\"\n\n"
    );
}
