//! What every handler is given: the repository, the metrics, the admin token and the grant signer.
//! Passed explicitly through axum's `State`; there are no globals.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::clients::Clients;
use crate::config::{Config, QueueFaults};
use crate::metrics::Metrics;
use crate::owners::Owners;
use crate::signing::Signer;
use crate::store::{Backend, Feeds};

/// Cloned for every request (axum's `State`, the middleware): one reference count, not one per
/// field.
#[derive(Debug, Clone)]
pub struct AppState(Arc<Shared>);

#[derive(Debug, Clone)]
struct Shared {
    repo: Backend,
    metrics: Arc<Metrics>,
    admin_token: Option<Arc<str>>,
    /// The lock clients of the clients file; `None`: the lock API is open to anyone who reaches it.
    clients: Option<Arc<Clients>>,
    /// The owners the clients' checks read, remembered ([`crate::owners`]).
    owners: Arc<Owners>,
    signer: Option<Arc<Signer>>,
    max_wait: Duration,
    watch_max: Duration,
    queue_faults: QueueFaults,
    feeds: Arc<Feeds>,
    /// Fired when the server shuts down: waits answer and watch streams end, so that the graceful
    /// drain is not held up by them.
    closing: CancellationToken,
}

impl AppState {
    /// A state over a backend (the server builds it from the configuration; a negative control passes
    /// a deliberately broken one).
    pub fn with_backend(backend: Backend, admin_token: Option<String>) -> Self {
        Self(Arc::new(Shared {
            metrics: Arc::new(Metrics::with_store(Some(&backend))),
            repo: backend,
            // An empty token is never a valid credential; treat it as "not configured".
            admin_token: admin_token.filter(|t| !t.is_empty()).map(Arc::from),
            clients: None,
            owners: Arc::default(),
            signer: None,
            max_wait: Duration::from_millis(dlock_wire::lock::MAX_WAIT_MS.unsigned_abs()),
            watch_max: Duration::from_secs(300),
            queue_faults: QueueFaults::NONE,
            feeds: Arc::new(Feeds::default()),
            closing: CancellationToken::new(),
        }))
    }

    /// For the builders below: the state is built before the server shares it.
    fn shared(&mut self) -> &mut Shared {
        Arc::make_mut(&mut self.0)
    }

    /// Waits and watches end when `closing` fires (the server's shutdown).
    pub fn with_closing(mut self, closing: CancellationToken) -> Self {
        self.shared().closing = closing;
        self
    }

    pub fn closing(&self) -> &CancellationToken {
        &self.0.closing
    }

    /// The configured limits of waits and watches (and a negative control's broken queue), and the
    /// lock clients.
    pub fn with_config(mut self, config: &Config) -> Self {
        let shared = self.shared();
        shared.max_wait = config.max_wait;
        shared.watch_max = config.watch_max;
        shared.queue_faults = config.queue_faults;
        shared.clients = config.clients.clone().map(Arc::new);
        if let Some(clients) = &config.clients {
            self.metrics().declare_clients(clients.names());
        }
        self
    }

    /// The lock clients, when a clients file is configured.
    pub fn clients(&self) -> Option<&Clients> {
        self.0.clients.as_deref()
    }

    /// The owners of sessions and grants, as the clients' checks read them.
    pub fn owners(&self) -> &Owners {
        &self.0.owners
    }

    /// The longest a blocking acquire waits here.
    pub fn max_wait(&self) -> Duration {
        self.0.max_wait
    }

    /// How long one watch stream stays open.
    pub fn watch_max(&self) -> Duration {
        self.0.watch_max
    }

    pub fn queue_faults(&self) -> QueueFaults {
        self.0.queue_faults
    }

    /// The watch feeds of this process.
    pub fn feeds(&self) -> &Feeds {
        &self.0.feeds
    }

    /// Signs every grant with `signer` (`None`: grants go out unsigned).
    pub fn with_signer(mut self, signer: Option<Signer>) -> Self {
        self.shared().signer = signer.map(Arc::new);
        self
    }

    pub fn signer(&self) -> Option<&Signer> {
        self.0.signer.as_deref()
    }

    /// The store the handlers use (PostgreSQL or etcd).
    pub fn repo(&self) -> &Backend {
        &self.0.repo
    }

    pub fn metrics(&self) -> &Metrics {
        &self.0.metrics
    }

    pub fn admin_token(&self) -> Option<&str> {
        self.0.admin_token.as_deref()
    }
}
