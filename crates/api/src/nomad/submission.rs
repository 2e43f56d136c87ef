//! A jobspec's source beside its job JSON: `POST /v1/jobs/parse` with the jobspec's
//! variables, and the `Submission` of `PUT /v1/jobs`, as Nomad's CLI sends them.
//!
//! Nomad's job JSON cannot say everything a berth jobspec says (services, a
//! `csi_plugin`, ports, hooks, a template's every option): `register.rs` warns about
//! what it drops. Nomad's `JobRegisterRequest` carries the source it came from
//! (`Submission: {Source, Format, VariableFlags, Variables}`), and berth registers that
//! source when, parsed with its variables, it gives exactly the job JSON of the request:
//! the JSON stays the authority, and the source only restores what the JSON could not
//! carry. A `Submission` that does not match is ignored, and the JSON is converted.
//!
//! Both requests also take `Berth: {SourceName, Variables}`, which Nomad's tools never
//! send: the file name for berth's messages, and the variables as berth's CLI read them
//! (`NOMAD_VAR_*`, each `-var-file`, each `-var`, kept apart for Nomad's precedence).

use axum::Extension;
use axum::body::Bytes;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{NomadError, bad_request, shapes};
use berth_client::agent::{Agent, SubmitError, Submitted, Submitter};
use berth_hcl::eval::VariableInputs;

/// The file name a source without one is given in messages.
const UNNAMED: &str = "job.nomad.hcl";

/// berth's addition to a parse or a register: where the source came from and its
/// variables as berth's CLI read them.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct BerthSource {
    #[serde(rename = "SourceName", default)]
    pub source_name: String,
    #[serde(rename = "Variables", default)]
    pub variables: VariableInputs,
}

/// `POST /v1/jobs/parse`'s body: Nomad's `JobsParseRequest`, and berth's addition.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct ParseRequest {
    #[serde(rename = "JobHCL")]
    pub job_hcl: String,
    /// A variables file's content (Nomad's field).
    #[serde(
        rename = "Variables",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub variables: String,
    #[serde(rename = "Canonicalize", default)]
    pub canonicalize: bool,
    #[serde(rename = "Berth", default, skip_serializing_if = "Option::is_none")]
    pub berth: Option<BerthSource>,
}

/// Nomad's `JobSubmission`, and berth's addition.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct JobSubmission {
    #[serde(rename = "Source", default)]
    pub source: String,
    /// `hcl2` (or `json`, which berth does not read: the job JSON is the job then).
    #[serde(rename = "Format", default)]
    pub format: String,
    /// `-var` flags (Nomad's field).
    #[serde(rename = "VariableFlags", default)]
    pub variable_flags: std::collections::BTreeMap<String, String>,
    /// A variables file's content (Nomad's field).
    #[serde(rename = "Variables", default)]
    pub variables: String,
    #[serde(rename = "Berth", default, skip_serializing_if = "Option::is_none")]
    pub berth: Option<BerthSource>,
}

/// `PUT /v1/jobs`'s body as berth's CLI sends it: Nomad's `JobRegisterRequest` (the job,
/// and the source it came from). The agent reads the job as JSON (`register.rs`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct JobRegisterRequest {
    #[serde(rename = "Job")]
    pub job: berth_nomad_api::jobs::Job,
    #[serde(rename = "Submission", skip_serializing_if = "Option::is_none")]
    pub submission: Option<JobSubmission>,
}

/// `POST /v1/job/:id/plan`'s body as berth's CLI sends it: Nomad's `JobPlanRequest`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct JobPlanRequest {
    #[serde(rename = "Job")]
    pub job: berth_nomad_api::jobs::Job,
    /// Whether the answer carries the job's diff against the running version.
    #[serde(rename = "Diff")]
    pub diff: bool,
    #[serde(rename = "Submission", skip_serializing_if = "Option::is_none")]
    pub submission: Option<JobSubmission>,
}

impl JobSubmission {
    /// The source's name and its variables: berth's own when given, else Nomad's fields.
    fn inputs(&self) -> (String, VariableInputs) {
        if let Some(berth) = &self.berth {
            return (name_or_default(&berth.source_name), berth.variables.clone());
        }
        (
            UNNAMED.to_string(),
            nomad_inputs(&self.variables, &self.variable_flags),
        )
    }
}

fn name_or_default(name: &str) -> String {
    if name.is_empty() {
        UNNAMED.to_string()
    } else {
        name.to_string()
    }
}

/// Nomad's variables (a file's content and `-var` flags) as berth's inputs.
fn nomad_inputs(file: &str, flags: &std::collections::BTreeMap<String, String>) -> VariableInputs {
    VariableInputs {
        env: Vec::new(),
        files: if file.trim().is_empty() {
            Vec::new()
        } else {
            vec![("Variables".to_string(), file.to_string())]
        },
        args: flags.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
    }
}

/// `POST /v1/jobs/parse`: the jobspec, with its variables, as Nomad's job JSON.
pub async fn parse(body: Bytes) -> Result<axum::Json<berth_nomad_api::jobs::Job>, NomadError> {
    let request: ParseRequest = serde_json::from_slice(&body)
        .map_err(|e| bad_request(format!("Failed to decode request: {e}")))?;
    let (name, mut inputs) = match &request.berth {
        Some(berth) => (name_or_default(&berth.source_name), berth.variables.clone()),
        None => (UNNAMED.to_string(), VariableInputs::default()),
    };
    if !request.variables.trim().is_empty() {
        inputs
            .files
            .push(("Variables".to_string(), request.variables.clone()));
    }
    let job = berth_jobspec::parse_with_async(&name, &request.job_hcl, &inputs)
        .await
        .map_err(|e| bad_request(e.to_string()))?;
    Ok(axum::Json(shapes::job(&job, None)))
}

/// Fields of a job JSON the server sets: left out when a submission's job is compared
/// with the request's.
const SERVER_FIELDS: &[&str] = &[
    "Status",
    "StatusDescription",
    "Stop",
    "Stable",
    "Version",
    "SubmitTime",
    "CreateIndex",
    "ModifyIndex",
    "JobModifyIndex",
];

fn without_server_fields(job: &Value) -> Value {
    let mut job = job.clone();
    if let Value::Object(fields) = &mut job {
        for name in SERVER_FIELDS {
            fields.remove(*name);
        }
    }
    job
}

/// What a register submits: the source, its name and its variables, and the warnings
/// of a conversion from JSON.
pub struct ToSubmit {
    pub id: String,
    pub source_name: String,
    pub source: String,
    pub variables: VariableInputs,
    pub warnings: Vec<String>,
}

/// The job of a register's body: its `Submission` when that source gives exactly the
/// request's job JSON, else the JSON converted to HCL (see the module doc).
pub async fn to_submit(body: &Value) -> Result<ToSubmit, NomadError> {
    if let Some(chosen) = matching_submission(body).await {
        return Ok(chosen);
    }
    let converted = super::register::job_hcl(body).map_err(|e| bad_request(e.to_string()))?;
    Ok(ToSubmit {
        source_name: format!("{}.json", converted.id),
        id: converted.id,
        source: converted.hcl,
        variables: VariableInputs::default(),
        warnings: converted.warnings,
    })
}

async fn matching_submission(body: &Value) -> Option<ToSubmit> {
    let submission: JobSubmission = serde_json::from_value(body.get("Submission")?.clone()).ok()?;
    if !matches!(submission.format.as_str(), "hcl2" | "") || submission.source.is_empty() {
        return None;
    }
    let requested = body.get("Job")?;
    let (source_name, variables) = submission.inputs();
    let parsed = berth_jobspec::parse_with_async(&source_name, &submission.source, &variables)
        .await
        .ok()?;
    let from_source = serde_json::to_value(shapes::job(&parsed, None)).ok()?;
    if without_server_fields(&from_source) != without_server_fields(requested) {
        tracing::debug!(
            job = %parsed.name,
            "a register's Submission does not give its job JSON: the JSON is registered"
        );
        return None;
    }
    Some(ToSubmit {
        id: parsed.name,
        source_name,
        source: submission.source,
        variables,
        warnings: Vec::new(),
    })
}

/// Submits what [`to_submit`] chose, as `submitter`.
pub async fn submit(
    agent: &Agent,
    submitter: Submitter,
    chosen: &ToSubmit,
) -> Result<Submitted, NomadError> {
    agent
        .submit_as(
            submitter,
            &chosen.source_name,
            &chosen.source,
            &chosen.variables,
        )
        .await
        .map_err(submit_error)
}

/// A refused submit as Nomad answers it: 400 with the reason, 403 for another's job,
/// 404 for an unknown job.
pub fn submit_error(error: SubmitError) -> NomadError {
    match error {
        SubmitError::Invalid(invalid) => bad_request(invalid.to_string()),
        SubmitError::Refused(why) => bad_request(why),
        SubmitError::Lookup(lookup) => NomadError::from(lookup),
        SubmitError::NotOwner(refused) => NomadError::from(refused),
        other @ SubmitError::State(_) => {
            NomadError(StatusCode::INTERNAL_SERVER_ERROR, other.to_string())
        }
        // The cluster store is away: nothing was submitted; the client may try again.
        SubmitError::Cluster(error) => {
            NomadError(StatusCode::SERVICE_UNAVAILABLE, error.to_string())
        }
    }
}

/// The submitter of a request: the operator on the Unix socket.
pub fn submitter_of(submitter: Option<Extension<Submitter>>) -> Submitter {
    submitter.map_or(Submitter::Operator, |Extension(s)| s)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// The jobspecs of the repository (examples and test fixtures) that parse without
    /// the CLI's help (`file()` is inlined by the CLI, so those are left out).
    fn repository_jobspecs() -> Vec<(String, String)> {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let mut found = Vec::new();
        for dir in ["examples", "examples/csi", "tests/fixtures/jobspecs"] {
            let Ok(entries) = std::fs::read_dir(root.join(dir)) else {
                continue;
            };
            for entry in entries.flatten() {
                let path = entry.path();
                let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                    continue;
                };
                if !name.ends_with(".hcl") || name == "agent.hcl" || name == "volume.hcl" {
                    continue;
                }
                let source = std::fs::read_to_string(&path).unwrap();
                if berth_jobspec_hcl::parse(name, &source).is_ok() {
                    found.push((format!("{dir}/{name}"), source));
                }
            }
        }
        found
    }

    /// What the CLI sends: parse, then register the parsed job with its source.
    fn cli_register(name: &str, source: &str, variables: &VariableInputs) -> Value {
        let parsed = berth_jobspec_hcl::parse_with(name, source, variables).unwrap();
        let job = shapes::job(&parsed, None);
        json!({
            "Job": job,
            "Submission": JobSubmission {
                source: source.to_string(),
                format: "hcl2".into(),
                variable_flags: variables.args.iter().cloned().collect(),
                variables: String::new(),
                berth: Some(BerthSource {
                    source_name: name.to_string(),
                    variables: variables.clone(),
                }),
            },
        })
    }

    /// Every jobspec of the repository survives parse → JSON → register unchanged: the
    /// job registered is the job parsed, services, plugins and templates included.
    #[tokio::test]
    async fn every_repository_jobspec_survives_parse_json_register_unchanged() {
        let jobspecs = repository_jobspecs();
        assert!(jobspecs.len() >= 10, "found only {}", jobspecs.len());
        for (name, source) in &jobspecs {
            let body = cli_register(name, source, &VariableInputs::default());
            let chosen = to_submit(&body).await.unwrap();
            assert_eq!(&chosen.source, source, "{name}");
            assert_eq!(&chosen.source_name, name, "{name}");
            assert!(chosen.warnings.is_empty(), "{name}: {:?}", chosen.warnings);
            let registered = berth_jobspec_hcl::parse_with(
                &chosen.source_name,
                &chosen.source,
                &chosen.variables,
            )
            .unwrap();
            let parsed = berth_jobspec_hcl::parse(name, source).unwrap();
            assert_eq!(
                format!("{registered:?}"),
                format!("{parsed:?}"),
                "{name} changed on the way"
            );
        }
    }

    const EVERYTHING: &str = r#"
variable "image_dir" { type = string }
variable "replicas" {
  type    = number
  default = 1
}
job "everything" {
  group "g" {
    count = var.replicas
    volume "data" {
      type      = "host"
      source    = "scratch"
      read_only = false
    }
    network {
      port "http" {}
    }
    service {
      name = "web"
      port = "http"
    }
    task "plugin" {
      driver = "exec"
      config {
        command = "${var.image_dir}/csi-hostpath"
      }
      csi_plugin {
        id        = "hostpath"
        type      = "monolith"
        mount_dir = "/csi"
      }
      template {
        data        = "port={{ env \"NOMAD_PORT_http\" }}"
        destination = "local/app.conf"
      }
      volume_mount {
        volume      = "data"
        destination = "/data"
      }
    }
  }
}
"#;

    /// A job with the CLI's `-var`s, a `csi_plugin` task, a template, a service and a
    /// volume registers as parsed, with its variables; the JSON alone would have lost
    /// the service and the plugin (which is why the CLI sends its source).
    #[tokio::test]
    async fn a_job_with_vars_a_plugin_a_template_a_service_and_a_volume_registers_as_parsed() {
        let variables = VariableInputs {
            args: vec![
                ("image_dir".into(), "/opt/bin".into()),
                ("replicas".into(), "2".into()),
            ],
            ..Default::default()
        };
        let body = cli_register("everything.hcl", EVERYTHING, &variables);
        let chosen = to_submit(&body).await.unwrap();
        assert_eq!(chosen.source, EVERYTHING);
        assert_eq!(chosen.variables.args, variables.args);
        let registered =
            berth_jobspec_hcl::parse_with(&chosen.source_name, &chosen.source, &chosen.variables)
                .unwrap();
        let group = &registered.groups[0];
        assert_eq!(group.count, 2);
        assert_eq!(group.services.len(), 1);
        let task = &group.tasks[0];
        assert!(task.csi_plugin.is_some());
        assert_eq!(task.config["command"], json!("/opt/bin/csi-hostpath"));
        assert_eq!(task.templates.len(), 1);
        assert_eq!(task.volume_mounts.len(), 1);

        // The JSON alone cannot carry the service or the plugin.
        let converted = super::super::register::job_hcl(&body).unwrap();
        let from_json = berth_jobspec_hcl::parse("everything.json", &converted.hcl).unwrap();
        assert!(from_json.groups[0].services.is_empty());
        assert!(from_json.groups[0].tasks[0].csi_plugin.is_none());
    }

    /// The job JSON is the authority: a `Submission` whose source does not give the
    /// request's job (here, a count changed after parsing) is ignored, and the JSON is
    /// what is registered.
    #[tokio::test]
    async fn a_submission_that_does_not_give_the_requests_job_is_ignored() {
        let variables = VariableInputs {
            args: vec![("image_dir".into(), "/opt/bin".into())],
            ..Default::default()
        };
        let mut body = cli_register("everything.hcl", EVERYTHING, &variables);
        body["Job"]["TaskGroups"][0]["Count"] = json!(7);
        let chosen = to_submit(&body).await.unwrap();
        assert_eq!(chosen.source_name, "everything.json");
        assert_ne!(chosen.source, EVERYTHING);
        let registered =
            berth_jobspec_hcl::parse_with(&chosen.source_name, &chosen.source, &chosen.variables)
                .unwrap();
        assert_eq!(registered.groups[0].count, 7);
        assert!(registered.groups[0].services.is_empty());

        // A source in another format is not read either.
        let mut body = cli_register("everything.hcl", EVERYTHING, &variables);
        body["Submission"]["Format"] = json!("json");
        assert_eq!(
            to_submit(&body).await.unwrap().source_name,
            "everything.json"
        );
    }
}
