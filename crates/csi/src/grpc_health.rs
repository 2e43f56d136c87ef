//! The gRPC health checking protocol's client (`grpc.health.v1.Health/Check`), for the
//! `grpc` checks berth runs itself. It lives in this crate because this crate is where
//! berth speaks gRPC as a client (with the etcd client): callers see plain types.

use std::net::SocketAddr;
use std::time::Duration;

use berth_proto::health as pb;
use tonic::transport::{Endpoint, Uri};

/// What a service said of its health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Serving {
    Serving,
    NotServing,
    /// The server does not know the service asked about.
    ServiceUnknown,
    Unknown,
}

/// Why no answer came.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HealthCheckError {
    #[error("connecting to {address}: {reason}")]
    Connect { address: SocketAddr, reason: String },
    #[error("the health check answered {code}: {message}")]
    Status { code: String, message: String },
    #[error("no answer within {0:?}")]
    TimedOut(Duration),
}

/// Asks the server at `address` (plaintext gRPC) how `service` is ("": the server as a
/// whole), within `timeout`.
pub async fn check(
    address: SocketAddr,
    service: &str,
    timeout: Duration,
) -> Result<Serving, HealthCheckError> {
    let asked = async {
        // The URI is required by tonic and never used: the connector dials the address.
        let channel = Endpoint::from_static("http://grpc-check.invalid")
            .connect_timeout(timeout)
            .connect_with_connector(tower::service_fn(move |_: Uri| async move {
                let stream = tokio::net::TcpStream::connect(address).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }))
            .await
            .map_err(|e| HealthCheckError::Connect {
                address,
                reason: root_cause(&e),
            })?;
        let mut client = pb::health_client::HealthClient::new(channel);
        let request = pb::HealthCheckRequest {
            service: service.to_string(),
        };
        let answer = client
            .check(request)
            .await
            .map_err(|status| HealthCheckError::Status {
                code: format!("{:?}", status.code()),
                message: status.message().chars().take(512).collect(),
            })?;
        use pb::health_check_response::ServingStatus;
        Ok(match answer.into_inner().status() {
            ServingStatus::Serving => Serving::Serving,
            ServingStatus::NotServing => Serving::NotServing,
            ServingStatus::ServiceUnknown => Serving::ServiceUnknown,
            ServingStatus::Unknown => Serving::Unknown,
        })
    };
    tokio::time::timeout(timeout, asked)
        .await
        .map_err(|_| HealthCheckError::TimedOut(timeout))?
}

fn root_cause(error: &(dyn std::error::Error + 'static)) -> String {
    let mut current = error;
    while let Some(source) = current.source() {
        current = source;
    }
    current.to_string()
}
