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
use crate::agent::{Agent, SubmitError, Submitted, Submitter};
use crate::jobspec::eval::VariableInputs;

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
    #[serde(rename = "Variables", default, skip_serializing_if = "String::is_empty")]
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
fn nomad_inputs(
    file: &str,
    flags: &std::collections::BTreeMap<String, String>,
) -> VariableInputs {
    VariableInputs {
        env: Vec::new(),
        files: if file.trim().is_empty() {
            Vec::new()
        } else {
            vec![("Variables".to_string(), file.to_string())]
        },
        args: flags
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    }
}

/// `POST /v1/jobs/parse`: the jobspec, with its variables, as Nomad's job JSON.
pub async fn parse(body: Bytes) -> Result<axum::Json<Value>, NomadError> {
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
    let job = crate::jobspec::parse_with(&name, &request.job_hcl, &inputs)
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
pub fn to_submit(body: &Value) -> Result<ToSubmit, NomadError> {
    if let Some(chosen) = matching_submission(body) {
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

fn matching_submission(body: &Value) -> Option<ToSubmit> {
    let submission: JobSubmission = serde_json::from_value(body.get("Submission")?.clone()).ok()?;
    if !matches!(submission.format.as_str(), "hcl2" | "") || submission.source.is_empty() {
        return None;
    }
    let requested = body.get("Job")?;
    let (source_name, variables) = submission.inputs();
    let parsed = crate::jobspec::parse_with(&source_name, &submission.source, &variables).ok()?;
    let from_source = shapes::job(&parsed, None);
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

/// A refused submit as Nomad answers it: 400 with the reason, 404 for an unknown job.
pub fn submit_error(error: SubmitError) -> NomadError {
    match error {
        SubmitError::Invalid(invalid) => bad_request(invalid.to_string()),
        SubmitError::Refused(why) => bad_request(why),
        SubmitError::Lookup(lookup) => NomadError::from(lookup),
        other @ SubmitError::State(_) => {
            NomadError(StatusCode::INTERNAL_SERVER_ERROR, other.to_string())
        }
    }
}

/// The submitter of a request: the operator on the Unix socket.
pub fn submitter_of(submitter: Option<Extension<Submitter>>) -> Submitter {
    submitter.map_or(Submitter::Operator, |Extension(s)| s)
}
