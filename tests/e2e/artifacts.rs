//! Nomad's `artifact` and `max_run_duration`, end to end on a real agent: a tarball made
//! by tar(1), served over HTTP, checked against its checksum and unpacked before the
//! task starts, which runs what it brought; a wrong checksum, an archive made by Python's
//! tarfile that climbs out, and a server that never answers each fail the task with
//! Nomad's "Failed Artifact Download" under its restart policy, leaving nothing in its
//! directory; a batch task past its `max_run_duration` is killed and failed.

use std::path::Path;
use std::time::{Duration, Instant};

use berth_client::alloc_runner::AllocStatus;
use berth_harness::AgentProcess;
use berth_model::events::EventKind;
use berth_model::status::ClientStatus;
use berth_testkit::file_server::{Answer, FileServer};
use sha2::Digest;

fn sha256_of(bytes: &[u8]) -> String {
    let digest = sha2::Sha256::digest(bytes);
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// `app.tar.gz` as tar(1) and gzip make it: an executable and a config file.
fn release_tarball(dir: &Path) -> Vec<u8> {
    let tree = dir.join("release");
    std::fs::create_dir_all(tree.join("bin")).unwrap();
    std::fs::create_dir_all(tree.join("conf")).unwrap();
    std::fs::write(
        tree.join("bin/hello"),
        "#!/bin/sh\necho \"hello from the artifact, uid $(id -u)\"\n",
    )
    .unwrap();
    std::process::Command::new("chmod")
        .args(["0755"])
        .arg(tree.join("bin/hello"))
        .status()
        .unwrap();
    std::fs::write(tree.join("conf/app.conf"), "port = 8080\n").unwrap();
    let tarball = dir.join("app.tar.gz");
    let status = std::process::Command::new("tar")
        .arg("-czf")
        .arg(&tarball)
        .arg("-C")
        .arg(&tree)
        .args(["bin", "conf"])
        .status()
        .unwrap();
    assert!(status.success());
    std::fs::read(tarball).unwrap()
}

/// A tar Python's tarfile writes with an entry that climbs out to `target`.
fn escaping_tar(dir: &Path, target: &Path) -> Vec<u8> {
    let out = dir.join("evil.tar");
    let script = format!(
        "import io, tarfile\n\
         t = tarfile.open({out:?}, 'w')\n\
         i = tarfile.TarInfo('ok.txt'); i.size = 2; t.addfile(i, io.BytesIO(b'ok'))\n\
         i = tarfile.TarInfo('../../../../../../../..{target}'); i.size = 5\n\
         t.addfile(i, io.BytesIO(b'pwned'))\n\
         t.close()\n",
        out = out.display().to_string(),
        target = target.display(),
    );
    let status = std::process::Command::new("python3")
        .args(["-c", &script])
        .status()
        .unwrap();
    assert!(status.success());
    std::fs::read(out).unwrap()
}

fn events_of(status: &AllocStatus, task: &str) -> Vec<(EventKind, String)> {
    status.tasks[task]
        .events
        .iter()
        .map(|e| (e.kind, e.message.clone()))
        .collect()
}

fn local_dir(agent: &AgentProcess, alloc: &str) -> Vec<String> {
    let dir = agent
        .path()
        .join("data/allocs")
        .join(alloc)
        .join("tasks/t/local");
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn failing_job(name: &str, artifact: &str, attempts: u32) -> String {
    format!(
        r#"job "{name}" {{
  type = "batch"
  group "g" {{
    restart {{
      attempts = {attempts}
      delay    = "0s"
      mode     = "fail"
    }}
    task "t" {{
      driver = "exec"
      config {{
        command = "/bin/true"
      }}
      artifact {{
{artifact}
      }}
    }}
  }}
}}
"#
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn artifacts_are_fetched_checked_and_unpacked_or_refused_leaving_nothing() {
    let work = tempfile::tempdir().unwrap();
    let tarball = release_tarball(work.path());
    let sum = sha256_of(&tarball);
    let outside = work.path().join("escaped.txt");
    let server = FileServer::start();
    let base = server.base.clone();
    server.serve("/app.tar.gz", vec![Answer::body(tarball)]);
    server.serve("/motd.txt", vec![Answer::body(&b"welcome\n"[..])]);
    server.serve(
        "/evil.tar",
        vec![Answer::body(escaping_tar(work.path(), &outside))],
    );
    server.serve("/silent.tgz", vec![Answer::Silent]);

    let mut agent = AgentProcess::with_config(
        "artifact {\n  http_read_timeout = \"2s\"\n  denied_networks = [\"169.254.0.0/16\"]\n}\n",
    );
    agent.start().await;
    let good = agent
        .run_job(
            "fetch.hcl",
            &format!(
                r#"job "fetch" {{
  type = "batch"
  group "g" {{
    task "t" {{
      driver = "exec"
      config {{
        command = "/bin/sh"
        args    = ["-c", "/local/app/bin/hello; cat local/app/conf/app.conf; stat -c 'motd %u %a' local/motd.txt; echo me $(id -u)"]
      }}
      artifact {{
        source      = "{base}/app.tar.gz"
        destination = "local/app"
        options {{
          checksum = "sha256:{sum}"
        }}
      }}
      artifact {{
        source = "{base}/motd.txt"
        chown  = true
      }}
    }}
  }}
}}
"#
            ),
        )
        .await;
    let wrong_sum = agent
        .run_job(
            "wrong.hcl",
            &failing_job(
                "wrong",
                &format!(
                    "        source = \"{base}/app.tar.gz?checksum=sha256:{}\"",
                    "0".repeat(64)
                ),
                0,
            ),
        )
        .await;
    let escape = agent
        .run_job(
            "escape.hcl",
            &failing_job(
                "escape",
                &format!("        source = \"{base}/evil.tar\""),
                0,
            ),
        )
        .await;
    let started = Instant::now();
    let silent = agent
        .run_job(
            "silent.hcl",
            &failing_job(
                "silent",
                &format!("        source = \"{base}/silent.tgz\""),
                1,
            ),
        )
        .await;

    let status = agent.finished(&good).await;
    let stdout = agent.task_stdout(&good, "t");
    assert_eq!(
        status.client_status,
        ClientStatus::Complete,
        "{stdout}\n{status:#?}"
    );
    let me = stdout
        .lines()
        .find_map(|l| l.strip_prefix("me "))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert_eq!(
        stdout,
        format!("hello from the artifact, uid {me}\nport = 8080\nmotd {me} 644\nme {me}\n"),
        "the task ran what its artifact brought, and owns the chowned file"
    );
    assert_ne!(me, "0", "an exec task runs as a user of its own");
    let events = events_of(&status, "t");
    let downloading = events
        .iter()
        .position(|(k, _)| *k == EventKind::DownloadingArtifacts)
        .unwrap_or_else(|| panic!("{events:#?}"));
    let start = events
        .iter()
        .position(|(k, _)| *k == EventKind::Started)
        .unwrap();
    assert!(downloading < start, "{events:#?}");
    assert_eq!(local_dir(&agent, &good), ["app", "motd.txt"]);

    for (alloc, expected) in [
        (&wrong_sum, "checksum mismatch: expected sha256:0000"),
        (&escape, "entry \"../../../../../../../.."),
    ] {
        let status = agent.finished(alloc).await;
        assert_eq!(status.client_status, ClientStatus::Failed);
        let events = events_of(&status, "t");
        assert!(
            events
                .iter()
                .any(|(k, m)| *k == EventKind::ArtifactDownloadFailed && m.contains(expected)),
            "{expected}: {events:#?}"
        );
        assert!(events.iter().all(|(k, _)| *k != EventKind::Started));
        // Nothing of the download, nor of the unpack, nor a staging directory.
        assert_eq!(local_dir(&agent, alloc), Vec::<String>::new(), "{expected}");
    }
    assert!(!outside.exists(), "the escaping entry was written");

    // A server that never answers: the agent's http_read_timeout, then the restart
    // policy's one more try, then failed.
    let status = agent.finished(&silent).await;
    assert_eq!(status.client_status, ClientStatus::Failed);
    let events = events_of(&status, "t");
    let failures: Vec<&String> = events
        .iter()
        .filter(|(k, _)| *k == EventKind::ArtifactDownloadFailed)
        .map(|(_, m)| m)
        .collect();
    assert_eq!(failures.len(), 2, "{events:#?}");
    assert!(
        failures[0].ends_with("no answer within 2s (the agent's artifact http_read_timeout)"),
        "{}",
        failures[0]
    );
    assert!(events.iter().any(|(k, _)| *k == EventKind::NotRestarting));
    assert!(started.elapsed() >= Duration::from_secs(4));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_task_past_its_max_run_duration_is_killed_and_failed() {
    let mut agent = AgentProcess::new();
    agent.start().await;
    let job = |name: &str, seconds: u32| {
        format!(
            r#"job "{name}" {{
  type = "batch"
  group "g" {{
    restart {{
      attempts = 3
      delay    = "0s"
      mode     = "fail"
    }}
    task "t" {{
      driver           = "exec"
      max_run_duration = "2s"
      config {{
        command = "/bin/sleep"
        args    = ["{seconds}"]
      }}
    }}
  }}
}}
"#
        )
    };
    let started = Instant::now();
    let long = agent.run_job("long.hcl", &job("long", 300)).await;
    let short = agent.run_job("short.hcl", &job("short", 0)).await;
    let status = agent.finished(&long).await;
    let took = started.elapsed();
    assert_eq!(status.client_status, ClientStatus::Failed);
    let task = &status.tasks["t"];
    assert_eq!(
        task.restarts, 0,
        "another run would be stopped the same way"
    );
    assert!(
        task.events.iter().any(|e| e.kind == EventKind::Killing
            && e.message == "Task exceeded its max_run_duration of 2s; killing it"),
        "{:#?}",
        task.events
    );
    assert!(
        (Duration::from_secs(2)..Duration::from_secs(10)).contains(&took),
        "{took:?}"
    );
    // Within its limit, a task ends as it would without one.
    assert_eq!(
        agent.finished(&short).await.client_status,
        ClientStatus::Complete
    );
}
