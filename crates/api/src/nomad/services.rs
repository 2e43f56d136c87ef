//! Nomad's service catalog from the cluster store: the services of provider "nomad"
//! every node runs (`nomad service list`, `nomad service info NAME`), as the
//! templates' `nomadService` reads them.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use super::{NomadError, with_index};
use berth_client::agent::Agent;
use berth_nomad_api::services::{
    ServiceRegistration, ServiceRegistrationListStub, ServiceRegistrationStub,
};

fn unavailable(error: impl std::fmt::Display) -> NomadError {
    NomadError(StatusCode::SERVICE_UNAVAILABLE, error.to_string())
}

/// `GET /v1/services`
pub async fn list(State(agent): State<Arc<Agent>>) -> Result<Response, NomadError> {
    let cluster = agent.cluster().clone();
    let (names, index) = berth_sys::blocking::run(move || {
        Ok::<_, berth_cluster::ClusterError>((cluster.service_names()?, cluster.revision()?))
    })
    .map_err(unavailable)?;
    let stub = ServiceRegistrationListStub {
        namespace: "default".into(),
        services: names
            .into_iter()
            .map(|n| ServiceRegistrationStub {
                service_name: n.name,
                tags: n.tags,
            })
            .collect(),
    };
    let body = if stub.services.is_empty() {
        Vec::new()
    } else {
        vec![stub]
    };
    Ok(with_index(Json(body).into_response(), index.max(0) as u64))
}

/// `GET /v1/service/:name`
pub async fn read(
    State(agent): State<Arc<Agent>>,
    Path(name): Path<String>,
) -> Result<Response, NomadError> {
    let cluster = agent.cluster().clone();
    let (records, index) = berth_sys::blocking::run(move || {
        Ok::<_, berth_cluster::ClusterError>((cluster.services_named(&name)?, cluster.revision()?))
    })
    .map_err(unavailable)?;
    let index = index.max(0) as u64;
    let body: Vec<ServiceRegistration> = records
        .into_iter()
        .map(|record| ServiceRegistration {
            create_index: index,
            modify_index: index,
            ..record
        })
        .collect();
    Ok(with_index(Json(body).into_response(), index))
}
