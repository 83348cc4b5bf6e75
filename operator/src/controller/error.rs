//! The controllers' one error type. Configuration problems a human must fix are not errors: they
//! become a `Degraded` status (see [`super::status::Blocked`]); these are the failures worth a retry.

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API call failed: {0}")]
    Kube(#[from] kube::Error),
    #[error("the object has no name, namespace or uid yet")]
    MissingObjectKey,
    #[error("cannot serialize {what}: {source}")]
    Serialize {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
}

impl Error {
    /// Low-cardinality label for `dlock_operator_reconcile_failures_total{reason}`.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube(kube::Error::Api(status)) if status.code == 409 => "conflict",
            Error::Kube(kube::Error::Api(status)) if status.code == 403 => "forbidden",
            Error::Kube(kube::Error::Api(status)) if status.code == 422 => "invalid",
            Error::Kube(kube::Error::Api(_)) => "api_error",
            Error::Kube(_) => "api_unreachable",
            Error::MissingObjectKey => "missing_object_key",
            Error::Serialize { .. } => "serialize",
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
