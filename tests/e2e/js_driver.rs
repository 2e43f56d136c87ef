//! A task driver written in JavaScript (`tests/fixtures/js-driver`), built with
//! componentize-js as the guide in `plugins-sdk/README.md` says, loaded from a plugin dir
//! and run by `berth run`: its exports' shape, BigInt `u64`s, string enums, and an
//! `Error` it throws reaching the user as the driver's message.

use std::process::Command;

use crate::support;

#[test]
fn a_driver_written_in_javascript_runs_a_task_and_its_thrown_errors_reach_the_user() {
    let dir = tempfile::Builder::new()
        .prefix("berth-js-driver")
        .tempdir_in("/tmp")
        .unwrap();
    let plugins = dir.path().join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    std::fs::copy(support::js_driver(), plugins.join("jsecho.wasm")).unwrap();
    // Its 12 MB compile is kept with the suite's other compiled components.
    std::os::unix::fs::symlink(support::cache_dir(), dir.path().join("component-cache")).unwrap();
    let berth = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_berth"))
            .arg("--plugin-dir")
            .arg(&plugins)
            .arg("--data-dir")
            .arg(dir.path())
            .args(args)
            .current_dir(dir.path())
            .output()
            .unwrap()
    };

    let listed = berth(&["driver", "inspect", "jsecho", "--json"]);
    let stderr = String::from_utf8_lossy(&listed.stderr);
    assert!(listed.status.success(), "{stderr}");
    let shown: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(shown["world"], "berth:driver@0.2.1", "{shown:#}");
    assert_eq!(shown["capabilities"]["fs_isolation"], "chroot", "{shown:#}");
    assert_eq!(
        shown["capabilities"]["spawn_isolation"],
        serde_json::json!(["chroot"]),
        "{shown:#}"
    );
    assert_eq!(
        shown["config_schema"],
        serde_json::json!([{"name": "message", "hcl_type": "string", "required": true}]),
        "{shown:#}"
    );
    assert_eq!(shown["health"], "healthy (ready)", "{shown:#}");

    let job = |config: &str| {
        format!(
            "job \"js\" {{\n  type = \"batch\"\n  group \"g\" {{\n    restart {{\n      attempts = 0\n      mode = \"fail\"\n    }}\n    task \"say\" {{\n      driver = \"jsecho\"\n      config {{\n        {config}\n      }}\n    }}\n  }}\n}}\n"
        )
    };
    std::fs::write(
        dir.path().join("js.hcl"),
        job("message = \"hello from javascript\""),
    )
    .unwrap();
    let ran = berth(&["run", "js.hcl"]);
    let stdout = String::from_utf8_lossy(&ran.stdout);
    assert!(
        ran.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&ran.stderr)
    );
    assert!(stdout.contains("\nhello from javascript\n"), "{stdout}");
    assert!(stdout.contains("Complete"), "{stdout}");

    // An `Error` thrown in validateTaskConfig is the problem the user reads, at the line.
    std::fs::write(dir.path().join("typo.hcl"), job("mesage = \"hi\"")).unwrap();
    let refused = berth(&["job", "validate", "typo.hcl"]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("typo.hcl:11:9: job.js.group.g.task.say.config: driver \"jsecho\" (")
            && stderr.contains("): unknown field `mesage`; this driver's config has: `message`"),
        "{stderr}"
    );
    // An Error thrown past the guide's `guarded` aborts the engine; berth says what to throw.
    std::fs::write(dir.path().join("empty.hcl"), job("message = \"\"")).unwrap();
    let aborted = berth(&["job", "validate", "empty.hcl"]);
    let stderr = String::from_utf8_lossy(&aborted.stderr);
    assert_eq!(aborted.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(
            "crashed: the JavaScript engine aborted (expected a string, received [object]): an \
             export that returns a result must throw its error value, for berth's calls a \
             string (`throw String(error.message)`)"
        ),
        "{stderr}"
    );
}
