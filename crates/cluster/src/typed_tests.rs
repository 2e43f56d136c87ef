//! Jobs stored typed (`typed.rs`): each corpus job comes back as it was parsed, the
//! stored shape is the schema's, records written before typed jobs are read from their
//! source, and a newer or damaged typed job is refused and named.

use super::state::ClusterJob;
use super::typed::{JOB_SCHEMA, TypedJob};
use berth_jobspec::Job;

/// The jobspecs of the corpus that are accepted, parsed.
fn corpus() -> Vec<(String, Job)> {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/jobspecs");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let jobs: Vec<(String, Job)> = files
        .iter()
        .filter_map(|file| {
            let name = file.file_name()?.to_string_lossy().to_string();
            let source = std::fs::read_to_string(file).ok()?;
            Some((name.clone(), berth_jobspec_hcl::parse(&name, &source).ok()?))
        })
        .collect();
    assert!(jobs.len() >= 10, "{jobs:?}");
    jobs
}

fn record(id: &str, source: &str, typed: Option<TypedJob>) -> ClusterJob {
    ClusterJob {
        id: id.into(),
        source_name: format!("{id}.hcl"),
        source: source.into(),
        variables: Default::default(),
        submitted_ms: 0,
        stopped: false,
        may_run_plugins: false,
        child_of: None,
        by_operator: false,
        owner: None,
        typed,
    }
}

/// Every job of the corpus comes back from its stored form as it was parsed:
/// durations, locations (for the messages that name a line) and warnings included.
#[test]
fn every_corpus_job_comes_back_from_its_stored_form_unchanged() {
    for (name, job) in corpus() {
        let typed = TypedJob::of(&job).unwrap();
        let read = typed.read(&job.name, &name).unwrap().unwrap();
        assert_eq!(read, job, "{name}");
    }
}

/// The stored shape is the schema's: a change to `jobspec::Job` that changes it
/// fails here until `JOB_SCHEMA` is raised and its shape recorded below (records of
/// the old schema are then read from their source).
#[test]
fn the_stored_shape_is_the_one_of_job_schema() {
    fn paths(value: &serde_json::Value, at: &str, into: &mut std::collections::BTreeSet<String>) {
        match value {
            serde_json::Value::Object(map) => {
                for (key, value) in map {
                    let path = format!("{at}.{key}");
                    into.insert(path.clone());
                    // A driver's `config` and a `meta` are the job author's free-form
                    // maps: their keys are the corpus's, not the schema's.
                    if key != "config" && key != "meta" {
                        paths(value, &path, into);
                    }
                }
            }
            serde_json::Value::Array(items) => {
                for item in items {
                    paths(item, &format!("{at}[]"), into);
                }
            }
            _ => {}
        }
    }
    let mut all = std::collections::BTreeSet::new();
    for (_, job) in corpus() {
        paths(&TypedJob::of(&job).unwrap().job, "", &mut all);
    }
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(all.into_iter().collect::<Vec<_>>().join("\n"));
    let shape: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
    const SHAPES: &[(u32, &str)] = &[
        (1, "3349e255bd2f6878"),
        (2, "c22ad45232853cd4"),
        (3, "4d48172534b0b2fe"),
        (4, "bf37173bc8145f26"),
        // Schema 5 re-recorded, unchanged: the shape is now taken without the job
        // author's free-form maps (a driver's `config`, `meta`), over a corpus that
        // has the first jobs with volumes (the docker jobspecs).
        (5, "4c646c8c130e92b1"),
        // Over a corpus with a docker job whose host-mode ports have a `to`.
        (6, "140b2bc4888aa487"),
    ];
    let recorded = SHAPES.iter().find(|(schema, _)| *schema == JOB_SCHEMA);
    assert_eq!(
        recorded.map(|(_, shape)| *shape),
        Some(shape.as_str()),
        "the stored job's shape changed: raise JOB_SCHEMA and record ({}, {shape:?})",
        JOB_SCHEMA + 1
    );
}

/// A record as berth wrote it before jobs were stored typed (no `typed`) is read
/// by evaluating its source: its migration.
#[test]
fn a_record_written_before_typed_jobs_is_read_from_its_source() {
    let written_before = r#"{"id":"legacy","source_name":"legacy.hcl","source":"variable \"replicas\" {\n  type = number\n}\njob \"legacy\" {\n  group \"g\" {\n    count = var.replicas\n    task \"t\" {\n      driver = \"mock\"\n    }\n  }\n}\n","variables":{"args":[["replicas","3"]]},"submitted_ms":1795000000000,"stopped":false,"may_run_plugins":false}"#;
    let record: ClusterJob = serde_json::from_str(written_before).unwrap();
    assert!(record.typed.is_none());
    let job = record.spec().unwrap();
    assert_eq!((job.name.as_str(), job.groups[0].count), ("legacy", 3));
    // An older schema reads the same way.
    let older = ClusterJob {
        typed: Some(TypedJob {
            schema: 0,
            job: serde_json::json!({"shape": "of long ago"}),
        }),
        ..record
    };
    assert_eq!(older.spec().unwrap().groups[0].count, 3);
}

/// A record with its typed job is read without its source: here a source that
/// would not even parse.
#[test]
fn a_typed_job_is_read_without_evaluating_its_source() {
    let (_, job) = corpus().into_iter().next().unwrap();
    let record = record(
        &job.name,
        "this is { not HCL at all (typed-read)",
        TypedJob::of(&job),
    );
    assert_eq!(record.spec().unwrap().groups, job.groups);
}

/// A typed job of a newer schema, or one damaged, is refused with a reason that
/// names it; never read as something else, never a panic.
#[test]
fn a_newer_or_damaged_typed_job_is_refused_and_named() {
    let source =
        "job \"x\" {\n  group \"g\" {\n    task \"t\" {\n      driver = \"mock\"\n    }\n  }\n}\n";
    let newer = record(
        "future",
        &source.replace("\"x\"", "\"future\""),
        Some(TypedJob {
            schema: JOB_SCHEMA + 1,
            job: serde_json::json!({}),
        }),
    );
    let error = newer.spec().unwrap_err().to_string();
    assert!(
        error.contains(&format!(
            "job.future: the job was stored by a newer berth (job schema {}; this agent reads up to {JOB_SCHEMA})",
            JOB_SCHEMA + 1
        )),
        "{error}"
    );
    let damaged = record(
        "damaged",
        &source.replace("\"x\"", "\"damaged\""),
        Some(TypedJob {
            schema: JOB_SCHEMA,
            job: serde_json::json!({"name": 5, "groups": "many"}),
        }),
    );
    let error = damaged.spec().unwrap_err().to_string();
    assert!(
        error.contains("job.damaged: the stored job cannot be read: invalid type"),
        "{error}"
    );
}
