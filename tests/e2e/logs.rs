//! Task logs in Nomad's shape: each task's stdout and stderr go through a log collector
//! (`berth __task-logmon`) into `alloc/logs/<task>.<stream>.<n>`, rotated at
//! `logs { max_file_size }` (MB) with at most `max_files` kept; `berth alloc logs` reads
//! across the files. The task can write into `alloc/logs/`: what it plants there is
//! never followed, by the collector or by the reader.

use berth_harness::AgentProcess;
use berth_model::status::ClientStatus;

fn log_files(dir: &std::path::Path, base: &str) -> Vec<(String, u64)> {
    let mut files: Vec<(String, u64)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_string_lossy().starts_with(base))
        .map(|e| {
            (
                e.file_name().into_string().unwrap(),
                e.metadata().unwrap().len(),
            )
        })
        .collect();
    files.sort();
    files
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tasks_logs_rotate_at_max_file_size_and_keep_max_files() {
    let mut agent = AgentProcess::new();
    agent.start().await;
    // About 2.7 MB of numbered lines, into files of 1 MiB, of which 2 are kept.
    let job = r#"job "chatty" {
  type = "batch"
  group "g" {
    task "t" {
      driver = "exec"
      config {
        command = "/usr/bin/seq"
        args    = ["1", "400000"]
      }
      logs {
        max_files     = 2
        max_file_size = 1
      }
    }
  }
}
"#;
    let submitted = agent.submit("chatty.hcl", job).await.unwrap();
    let id = &submitted.alloc_ids[0];
    let status = agent.finished(id).await;
    assert_eq!(status.client_status, ClientStatus::Complete);
    let logs = status.alloc_dir.join("alloc/logs");
    let files = log_files(&logs, "t.stdout.");
    assert_eq!(files.len(), 2, "{files:?}");
    assert!(files.iter().all(|(_, size)| *size <= 1 << 20), "{files:?}");
    assert_eq!(files[0].1, 1 << 20, "{files:?}");
    let kept: u64 = files.iter().map(|(_, size)| size).sum();

    let (code, out, err) = agent.cli(&["alloc", "logs", &id[..8], "t"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.len() as u64, kept, "the two kept files, whole");
    assert!(
        out.ends_with("\n399999\n400000\n"),
        "{}",
        &out[out.len() - 40..]
    );
    assert!(
        !out.starts_with("1\n2\n"),
        "the oldest output was rotated away"
    );
}

/// The task removes its log file and puts a symlink to a host file in its place, then
/// fails; its restart must not write into the host file, and `berth alloc logs` must not
/// read it. A root task (the logs are root's), on an agent that allows one.
#[tokio::test(flavor = "multi_thread")]
async fn a_task_cannot_turn_its_log_into_a_link_to_a_host_file() {
    let mut agent = AgentProcess::with_config("user {\n  denylist = []\n}\n");
    agent.start().await;
    let victim = agent.path().join("victim");
    std::fs::write(&victim, "host secret\n").unwrap();
    let script = format!(
        "if [ -e /local/again ]; then echo second run; exit 0; fi; touch /local/again; \
         echo first run; rm -f /alloc/logs/t.stdout.0; ln -s {} /alloc/logs/t.stdout.0; exit 1",
        victim.display()
    );
    let job = format!(
        r#"job "liar" {{
  type = "batch"
  group "g" {{
    restart {{
      attempts = 1
      delay    = "1s"
      mode     = "fail"
    }}
    task "t" {{
      driver = "exec"
      user   = "root"
      config {{
        command = "/bin/sh"
        args    = ["-c", {}]
      }}
    }}
  }}
}}
"#,
        serde_json::to_string(&script).unwrap()
    );
    let submitted = agent.submit("liar.hcl", &job).await.unwrap();
    let id = &submitted.alloc_ids[0];
    let status = agent.finished(id).await;
    assert_eq!(
        status.tasks["t"].restarts, 1,
        "{:#?}",
        status.tasks["t"].events
    );
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "host secret\n");
    let (code, out, err) = agent.cli(&["alloc", "logs", &id[..8], "t"]);
    assert_eq!(code, 0, "{err}");
    // The first run's line is gone with the file it removed, unless the collector
    // opened its file after the task had put its link there (under load it can start
    // after the task ran): it then skipped the link for the next file, `t.stdout.1`,
    // which the second run appends to. Never through the link.
    assert!(
        out == "second run\n" || out == "first run\nsecond run\n",
        "{out:?}"
    );
}
