//! The controllers' one error type. Configuration problems a human must fix are not errors: they
//! become a `Degraded` status (see [`crate::controller::verdict::Blocked`]); these are the failures
//! worth a retry.

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API call failed: {0}")]
    Kube(#[from] kube::Error),
    #[error("the object has no name, namespace or uid yet")]
    MissingObjectKey,
    /// A step of a reconcile failed at the Kubernetes API; the step is named.
    #[error("{step}: Kubernetes API call failed: {source}")]
    Step {
        step: &'static str,
        #[source]
        source: kube::Error,
    },
    /// A call to lock-server (an action step) failed.
    #[error("{step}: {message}")]
    LockServer { step: &'static str, message: String },
    /// A certificate could not be made or read (HTTPS, `controller::tls`).
    #[error("certificates: {0}")]
    Certificate(String),
    /// The namespace's CA bundle cannot be used to build a client.
    #[error("the CA bundle ConfigMap: {0}")]
    Bundle(String),
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
            Error::Kube(source) | Error::Step { source, .. } => kube_label(source),
            Error::LockServer { .. } => "lock_server",
            Error::MissingObjectKey => "missing_object_key",
            Error::Serialize { .. } => "serialize",
            Error::Certificate(_) => "certificate",
            Error::Bundle(_) => "ca_bundle",
        }
    }
}

impl Error {
    pub fn step(step: &'static str, source: kube::Error) -> Error {
        Error::Step { step, source }
    }
}

fn kube_label(source: &kube::Error) -> &'static str {
    match source {
        kube::Error::Api(status) if status.code == 409 => "conflict",
        kube::Error::Api(status) if status.code == 403 => "forbidden",
        kube::Error::Api(status) if status.code == 422 => "invalid",
        kube::Error::Api(_) => "api_error",
        _ => "api_unreachable",
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Names the step of an API failure (the other errors name themselves).
pub fn at(step: &'static str) -> impl Fn(Error) -> Error {
    move |e| match e {
        Error::Kube(source) => Error::step(step, source),
        other => other,
    }
}
