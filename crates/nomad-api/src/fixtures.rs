//! The types against the contract fixtures (Nomad's documented answers): each fixture's
//! response reads as its type, and reading it and writing it back loses no field the
//! fixture has, except those [`NOT_NAMED`] lists with why.

use serde::Serialize;
use serde::de::DeserializeOwned;

use berth_testkit::nomad_fixtures::{differences, fixture, fixture_names, generic, named_keys};

use crate::agent::AgentSelf;
use crate::allocs::{Allocation, AllocationListStub};
use crate::csi::CsiVolume;
use crate::jobs::{
    Job, JobDispatchResponse, JobListStub, JobPlanResponse, JobRegisterResponse, JobSummary,
};
use crate::nodes::Node;
use crate::stats::AllocResourceUsage;

/// Fields of Nomad's documented answers these types do not name (so berth neither
/// sends them nor reads them), with why: the list the contract test of the live answers
/// leaves out too.
const NOT_NAMED: &[(&str, &[&str], &str)] = berth_testkit::nomad_fixtures::NOT_IN_BERTH;

/// Reads fixture `name`'s response as `T`, writes it back, and returns the fixture's
/// fields that did not come back.
fn round_trip<T: Serialize + DeserializeOwned>(name: &str) -> Vec<String> {
    let response = fixture(name)["Response"].clone();
    let typed: T = serde_json::from_value(response.clone())
        .unwrap_or_else(|e| panic!("fixture {name} does not read as its type: {e}"));
    let written = serde_json::to_value(&typed).expect("the types write as JSON");
    let mut found = Vec::new();
    differences("", &response, &written, &[], &mut found);
    let not_named: Vec<&str> = NOT_NAMED
        .iter()
        .filter(|(fixture, _, _)| *fixture == name)
        .flat_map(|(_, fields, _)| fields.iter().copied())
        .collect();
    let names = named_keys(&response);
    found
        .into_iter()
        .filter_map(|problem| {
            let (path, why) = problem.split_once(": ").unwrap_or((&problem, ""));
            let path = generic(path, &names);
            let left_out = not_named
                .iter()
                .any(|field| path == *field || path.starts_with(&format!("{field}.")));
            (!left_out).then(|| format!("{name}: {path}: {why}"))
        })
        .collect()
}

#[test]
fn every_fixture_reads_as_its_type_and_writes_back_whole() {
    type Check = fn(&str) -> Vec<String>;
    let checks: &[(&str, Check)] = &[
        ("alloc_stats", round_trip::<AllocResourceUsage>),
        ("allocation_read", round_trip::<Allocation>),
        ("allocations_list", round_trip::<Vec<AllocationListStub>>),
        ("csi_volume_read", round_trip::<CsiVolume>),
        ("job_dispatch", round_trip::<JobDispatchResponse>),
        ("job_parse_request", round_trip::<Job>),
        ("job_plan", round_trip::<JobPlanResponse>),
        ("job_read", round_trip::<Job>),
        ("job_register_request", round_trip::<JobRegisterResponse>),
        ("job_summary", round_trip::<JobSummary>),
        ("jobs_list", round_trip::<Vec<JobListStub>>),
        ("node_read", round_trip::<Node>),
    ];
    // The metrics answer is berth-telemetry's (Nomad's go-metrics JSON), not an api type.
    let not_api_types = ["metrics"];
    let mut problems = Vec::new();
    for name in fixture_names() {
        match checks.iter().find(|(fixture, _)| *fixture == name) {
            Some((_, check)) => problems.extend(check(&name)),
            None => assert!(
                not_api_types.contains(&name.as_str()),
                "fixture {name} is held to no type: add it to this test"
            ),
        }
    }
    assert!(
        problems.is_empty(),
        "the types lose fields of Nomad's documented answers:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_agent_self_keys_are_lower_case_as_nomad_writes_them() {
    let written = serde_json::to_value(AgentSelf::default()).unwrap();
    assert!(written.get("config").is_some() && written.get("member").is_some());
}

#[test]
fn lists_and_maps_go_wrote_as_null_read_as_empty() {
    let job: Job = serde_json::from_value(serde_json::json!({
        "ID": "web",
        "Constraints": null,
        "Meta": null,
        "TaskGroups": [{"Name": "g", "Tasks": [{"Name": "t", "Env": null, "Config": null}]}],
    }))
    .unwrap();
    assert_eq!(job.id, "web");
    assert!(job.constraints.is_empty() && job.meta.is_empty());
    assert!(job.task_groups[0].tasks[0].env.is_empty());
}
