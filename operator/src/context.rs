//! The state every reconcile shares: the client, the Event recorder, metrics, the settings from the
//! operator's flags, lock-server's HTTP client, and the per-object failure counts of the backoff.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

use crate::builders::cnpg::{Cluster, Promotion};
use crate::builders::network_policies::Scraper;
use crate::metrics::Metrics;
use crate::reasons::Reason;

/// Settings the controllers take from the operator's flags.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The dlock image, for components whose spec names none.
    pub default_image: String,
    /// Namespace to watch; all when `None`.
    pub namespace: Option<String>,
    /// How often each LockService's fencing sequence is compared with its paydbs' high-water;
    /// `None` turns the check off.
    pub fencing_check_interval: Option<Duration>,
    /// The Prometheus the NetworkPolicies admit to the metrics ports; `None`: none is named.
    pub scraper: Option<Scraper>,
    /// How long a rotation of a namespace's CA trusts the new CA beside the old one before any
    /// certificate is signed by it (for clients outside the cluster that copied the bundle).
    pub ca_overlap: Duration,
}

/// State shared by every reconcile. Passed explicitly; no globals.
pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    pub metrics: Metrics,
    pub settings: Settings,
    /// HTTP client for lock-server's API (actions). Honours HTTP_PROXY / NO_PROXY like any client.
    pub http: reqwest::Client,
    /// Clients that trust one namespace's CA bundle (HTTPS), by the bundle's text.
    tls_clients: Mutex<HashMap<String, reqwest::Client>>,
    /// Consecutive failures per object, for the error policy's backoff.
    failures: Mutex<HashMap<String, u32>>,
    /// The last promotion seen under way per CloudNativePG Cluster (namespace, name), from the
    /// watch of the Clusters ([`crate::controller::run`]).
    promotions: Mutex<HashMap<(String, String), Promotion>>,
}

impl Context {
    pub fn new(client: Client, metrics: Metrics, settings: Settings, instance: Option<String>) -> Context {
        let reporter = Reporter {
            controller: crate::builders::FIELD_MANAGER.into(),
            instance,
        };
        Context {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            metrics,
            settings,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap_or_default(),
            tls_clients: Mutex::new(HashMap::new()),
            failures: Mutex::new(HashMap::new()),
            promotions: Mutex::new(HashMap::new()),
        }
    }

    /// Remembers the promotion a watched Cluster shows under way. Its phase lasts seconds: a
    /// reconcile that looks once can miss it, so the kind of the change it sees is taken from here.
    pub fn observe_cluster(&self, cluster: &Cluster) {
        let (Some(ns), Some(name)) = (cluster.metadata.namespace.clone(), cluster.metadata.name.clone())
        else {
            return;
        };
        if let Some(p) = cluster.status.as_ref().and_then(Promotion::under_way) {
            let mut promotions = self
                .promotions
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if promotions.get(&(ns.clone(), name.clone())) != Some(&p) {
                let kind = if p.switchover { "Switchover" } else { "Failover" };
                tracing::info!(event = "database_promotion_seen", namespace = %ns, cluster = %name, kind, from = %p.from, to = %p.to);
                promotions.insert((ns, name), p);
            }
        }
    }

    /// The last promotion seen under way on a Cluster.
    pub fn promotion(&self, namespace: &str, cluster: &str) -> Option<Promotion> {
        self.promotions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&(namespace.to_owned(), cluster.to_owned()))
            .cloned()
    }

    /// The client for a URL of lock-server's: [`Context::http`] for `http://`; for `https://`, one
    /// that trusts only the namespace's CA (ConfigMap `dlock-ca-bundle`), never the public roots.
    pub async fn http_for(&self, namespace: &str, url: &str) -> crate::error::Result<reqwest::Client> {
        use crate::builders::tls::{CA_BUNDLE, CA_BUNDLE_KEY};
        use crate::error::Error;
        if !url.starts_with("https://") {
            return Ok(self.http.clone());
        }
        let configmaps: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
            kube::Api::namespaced(self.client.clone(), namespace);
        let pem = configmaps
            .get_opt(CA_BUNDLE)
            .await
            .map_err(|e| Error::step("read the CA bundle ConfigMap", e))?
            .and_then(|cm| cm.data?.remove(CA_BUNDLE_KEY))
            .ok_or_else(|| Error::Bundle(format!("{namespace}/{CA_BUNDLE} has no {CA_BUNDLE_KEY} yet")))?;
        let mut clients = self
            .tls_clients
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(c) = clients.get(&pem) {
            return Ok(c.clone());
        }
        // Two certificates while the namespace's CA is rotated: the old one and its successor.
        let cas = reqwest::Certificate::from_pem_bundle(pem.as_bytes())
            .map_err(|e| Error::Bundle(e.to_string()))?;
        let mut builder = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .tls_built_in_root_certs(false);
        for ca in cas {
            builder = builder.add_root_certificate(ca);
        }
        let client = builder.build().map_err(|e| Error::Bundle(e.to_string()))?;
        // One entry per namespace's CA; a replaced CA leaves a stale entry, so keep the map small.
        if clients.len() >= 256 {
            clients.clear();
        }
        clients.insert(pem, client.clone());
        Ok(client)
    }

    /// Publishes an Event; failures are logged, never fatal (Events are explanations, not state).
    pub async fn publish(&self, regarding: &ObjectReference, type_: EventType, reason: Reason, note: String) {
        let ev = Event {
            type_,
            reason: reason.as_str().into(),
            note: Some(note),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&ev, regarding).await {
            tracing::warn!(event = "event_publish_failed", reason = reason.as_str(), error = %e);
        }
    }

    pub(crate) fn record_failure(&self, key: &str) -> u32 {
        let mut map = self
            .failures
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = map.entry(key.to_owned()).or_insert(0);
        *n = n.saturating_add(1);
        *n
    }

    pub(crate) fn record_success(&self, key: &str) {
        let mut map = self
            .failures
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        map.remove(key);
    }
}
