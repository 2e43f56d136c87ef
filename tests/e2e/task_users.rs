//! Who a task runs as, as a Nomad user expects it: an `exec` task with no `user` runs as
//! a uid of its own from `user { dynamic_range }` (more in `dynamic_users`); `root` is
//! refused at submit unless the operator's `user { denylist }` allows it; and such a task
//! can do what ordinary programs do: write `/dev/null`, share files with the alloc's
//! other tasks through `/alloc/data`, whatever their users.

use berth_harness::AgentProcess;
use berth_model::status::ClientStatus;

fn job(name: &str, tasks: &str) -> String {
    format!(
        "job \"{name}\" {{\n  type = \"batch\"\n  group \"g\" {{\n    restart {{\n      attempts = 0\n    }}\n{tasks}  }}\n}}\n"
    )
}

fn task(name: &str, extra: &str, script: &str) -> String {
    format!(
        "    task \"{name}\" {{\n      driver = \"exec\"\n{extra}      config {{\n        command = \"/bin/sh\"\n        args = [\"-c\", {}]\n      }}\n    }}\n",
        serde_json::to_string(script).unwrap()
    )
}

async fn run(
    agent: &AgentProcess,
    name: &str,
    source: &str,
) -> berth_client::alloc_runner::AllocStatus {
    let submitted = agent.submit(&format!("{name}.hcl"), source).await.unwrap();
    agent.finished(&submitted.alloc_ids[0]).await
}

fn stdout(status: &berth_client::alloc_runner::AllocStatus, task: &str) -> String {
    std::fs::read_to_string(status.alloc_dir.join(format!("alloc/logs/{task}.stdout.0")))
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_task_without_user_runs_as_its_own_uid_and_uses_dev_null_and_its_dirs() {
    let mut agent = AgentProcess::new();
    agent.start().await;
    let script = "id -u; echo quiet > /dev/null && echo wrote-null; \
                  head -c 4 /dev/zero | wc -c; \
                  echo mine > /local/f && echo wrote-local; \
                  echo mine > /tmp/f && echo wrote-tmp; \
                  echo mine > /secrets/f && echo wrote-secrets; \
                  ls -ld /dev/null /dev/zero /dev/full /dev/random /dev/urandom /dev/tty | cut -c1-10";
    let source = job("plain", &task("t", "", script));
    let status = run(&agent, "plain", &source).await;
    let out = stdout(&status, "t");
    let (uid, rest) = out.split_once('\n').unwrap_or_default();
    let uid: u32 = uid.parse().unwrap_or_default();
    assert!((80_000..=89_999).contains(&uid), "{status:#?}");
    assert_eq!(
        rest,
        "wrote-null\n4\nwrote-local\nwrote-tmp\nwrote-secrets\n\
         crw-rw-rw-\ncrw-rw-rw-\ncrw-rw-rw-\ncrw-rw-rw-\ncrw-rw-rw-\ncrw-rw-rw-\n",
        "{status:#?}"
    );
    assert_eq!(status.client_status, ClientStatus::Complete);
}

#[tokio::test(flavor = "multi_thread")]
async fn tasks_of_different_users_hand_files_to_each_other_through_alloc_data() {
    let mut agent = AgentProcess::new();
    agent.start().await;
    let prestart =
        "      user = \"daemon\"\n      lifecycle {\n        hook = \"prestart\"\n      }\n";
    let tasks = [
        task(
            "first",
            prestart,
            "echo from-daemon > /alloc/data/handed && echo tmp > /alloc/tmp/handed && echo done",
        ),
        task(
            "second",
            "",
            "id -u; cat /alloc/data/handed /alloc/tmp/handed; echo reply > /alloc/data/reply && echo replied; \
             rm /alloc/data/handed 2>/dev/null || echo cannot-remove-daemons-file",
        ),
    ]
    .concat();
    let status = run(&agent, "handoff", &job("handoff", &tasks)).await;
    assert_eq!(stdout(&status, "first"), "done\n", "{status:#?}");
    let out = stdout(&status, "second");
    let (uid, rest) = out.split_once('\n').unwrap_or_default();
    assert!(
        uid.parse::<u32>().is_ok_and(|uid| uid >= 80_000),
        "{status:#?}"
    );
    assert_eq!(
        rest, "from-daemon\ntmp\nreplied\ncannot-remove-daemons-file\n",
        "{status:#?}"
    );
    assert_eq!(status.client_status, ClientStatus::Complete);
}

#[tokio::test(flavor = "multi_thread")]
async fn root_is_refused_at_submit_unless_the_operators_denylist_allows_it() {
    let mut agent = AgentProcess::new();
    agent.start().await;
    for user in ["root", "0"] {
        let source = job(
            "rooted",
            &task("t", &format!("      user = \"{user}\"\n"), "id -u"),
        );
        let Err(berth_api::client::ClientError::Api(error, _)) =
            agent.submit("rooted.hcl", &source).await
        else {
            panic!("a job asking for user {user:?} was accepted");
        };
        let expected = format!(
            "task \"t\": user \"{user}\" is denied for driver \"exec\" on this agent (the agent \
             config's user {{ denylist }} names \"root\")"
        );
        assert!(
            error.problems.iter().any(|p| p.contains(&expected)),
            "{error:?}"
        );
    }

    let mut open = AgentProcess::with_config("user {\n  denylist = []\n}\n");
    open.start().await;
    let source = job("rooted", &task("t", "      user = \"root\"\n", "id -u"));
    let status = run(&open, "rooted", &source).await;
    assert_eq!(stdout(&status, "t"), "0\n", "{status:#?}");

    // The operator's checked drivers decide where the list applies.
    let mut unchecked = AgentProcess::with_config("user {\n  checked_drivers = [\"java\"]\n}\n");
    unchecked.start().await;
    let status = run(&unchecked, "rooted", &source).await;
    assert_eq!(stdout(&status, "t"), "0\n", "{status:#?}");
}

/// `berth run` keeps task dirs under its data dir, which a root task may fill with setuid
/// files: the data dir is the agent's alone (0700), as `berth agent`'s.
#[test]
fn berth_run_makes_its_data_dir_private() {
    let scratch = tempfile::tempdir().unwrap();
    let data = scratch.path().join("data");
    // An existing data dir, made as umask has it, is fixed too.
    std::fs::create_dir(&data).unwrap();
    std::os::unix::fs::symlink(crate::support::cache_dir(), data.join("component-cache")).unwrap();
    let jobspec = scratch.path().join("once.hcl");
    std::fs::write(&jobspec, job("once", &task("t", "", "echo once"))).unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_berth"))
        .arg("run")
        .arg("--data-dir")
        .arg(&data)
        .arg(&jobspec)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&data).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o700);
}

/// A task may be named `alloc` (or `tasks`, or after anything else berth keeps in the alloc
/// dir): its directory lives in a namespace of its own, so its root is not built inside
/// the shared `/alloc` the other tasks see, and their files there are untouched.
#[tokio::test(flavor = "multi_thread")]
async fn a_task_named_alloc_does_not_disturb_its_group() {
    let mut agent = AgentProcess::new();
    agent.start().await;
    let prestart = "      lifecycle {\n        hook = \"prestart\"\n      }\n";
    let tasks = [
        task(
            "main",
            prestart,
            "echo kept > /alloc/data/mine && echo local > /local/mine && echo done",
        ),
        task(
            "alloc",
            "",
            "cat /alloc/data/mine; echo own > /local/own; ls /alloc | tr '\\n' ' '; echo",
        ),
        task("tasks", "", "ls /local | tr '\\n' ' '; echo"),
    ]
    .concat();
    let status = run(&agent, "named-alloc", &job("named-alloc", &tasks)).await;
    assert_eq!(stdout(&status, "main"), "done\n", "{status:#?}");
    // `/alloc` holds the shared dirs only: no `bin`, `etc`, `local` of a task's root.
    assert_eq!(
        stdout(&status, "alloc"),
        "kept\ndata logs tmp \n",
        "{status:#?}"
    );
    assert_eq!(stdout(&status, "tasks"), "\n", "{status:#?}");
    assert_eq!(status.client_status, ClientStatus::Complete, "{status:#?}");
    let shared: Vec<String> = std::fs::read_dir(status.alloc_dir.join("alloc"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    assert_eq!(shared, ["data", "logs", "tmp"]);
    assert_eq!(
        std::fs::read_to_string(status.alloc_dir.join("tasks/main/local/mine")).unwrap(),
        "local\n"
    );
    assert_eq!(
        std::fs::read_to_string(status.alloc_dir.join("tasks/alloc/local/own")).unwrap(),
        "own\n"
    );
}
