//! `dlock-operator`: runs the LockService and PaymentStack controllers (as leader, when leader
//! election is on), serves `/metrics`, `/healthz`, `/readyz`, and stops cleanly on SIGTERM.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{ArgAction, Parser};
use dlock_operator::builders::network_policies::Scraper;
use dlock_operator::controller::{self, Context, Settings};
use dlock_operator::http::{self, Health, Readiness};
use dlock_operator::metrics::Metrics;
use dlock_operator::startup::{self, LeaseConfig};
use dlock_operator::telemetry;
use kube::Client;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Parser)]
#[command(
    name = "dlock-operator",
    version,
    about = "Kubernetes operator for dlock (LockService, PaymentStack)"
)]
struct Args {
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, env = "DLOCK_OPERATOR_LISTEN", default_value = "0.0.0.0:8080")]
    listen: SocketAddr,
    /// Namespace to watch; all namespaces when absent.
    #[arg(long, env = "DLOCK_OPERATOR_NAMESPACE")]
    namespace: Option<String>,
    /// dlock image (carrying lock-server, payment-resource, rail-proxy, rail-stub, payout-executor,
    /// dlock-migrate and /migrations) for components whose spec names none.
    #[arg(long, env = "DLOCK_IMAGE", default_value = concat!("dlock:", env!("CARGO_PKG_VERSION")))]
    image: String,
    /// Run the controllers only while holding the leader Lease (needed with more than one replica).
    #[arg(long, env = "DLOCK_OPERATOR_LEADER_ELECTION", default_value = "true", action = ArgAction::Set)]
    leader_election: bool,
    /// Name of the leader Lease.
    #[arg(
        long,
        env = "DLOCK_OPERATOR_LEASE_NAME",
        default_value = "dlock-operator-leader"
    )]
    lease_name: String,
    /// Namespace of the leader Lease; the pod's own namespace (from the client config) when absent.
    #[arg(long, env = "POD_NAMESPACE")]
    lease_namespace: Option<String>,
    /// This replica's identity in the Lease and in Events (the pod name in a cluster).
    #[arg(long, env = "POD_NAME")]
    pod_name: Option<String>,
    /// Seconds the leader Lease stays valid without renewal.
    #[arg(long, default_value_t = 15)]
    lease_duration_secs: u64,
    /// Seconds before expiry at which the leader renews.
    #[arg(long, default_value_t = 5)]
    lease_grace_secs: u64,
    /// Seconds to wait at start-up for the CRDs to be Established before exiting non-zero.
    #[arg(long, env = "DLOCK_OPERATOR_CRD_WAIT_SECS", default_value_t = 60)]
    crd_wait_secs: u64,
    /// Seconds between comparisons of each LockService's fencing sequence with its paydbs'
    /// high-water (a Job per check); 0 turns the check off.
    #[arg(long, env = "DLOCK_OPERATOR_FENCING_CHECK_SECS", default_value_t = 300)]
    fencing_check_secs: u64,
    /// The Prometheus that scrapes the dlock pods: labels of its namespaces (`k=v,k=v`). With
    /// --prometheus-pod-selector, the NetworkPolicies the operator builds admit those pods to the
    /// metrics ports only; neither given: no scraper is admitted.
    #[arg(long, env = "DLOCK_OPERATOR_PROMETHEUS_NAMESPACE_SELECTOR")]
    prometheus_namespace_selector: Option<String>,
    /// Labels of the Prometheus pods (`k=v,k=v`); empty: every pod of those namespaces.
    #[arg(long, env = "DLOCK_OPERATOR_PROMETHEUS_POD_SELECTOR")]
    prometheus_pod_selector: Option<String>,
    /// Seconds a rotation of a namespace's CA (a year before it ends) publishes the new CA beside
    /// the old one before any certificate is signed by it: the time clients outside the cluster
    /// have to fetch the bundle again. The clients inside are waited for anyway. 30 days.
    #[arg(long, env = "DLOCK_OPERATOR_CA_OVERLAP_SECS", default_value_t = 2_592_000)]
    ca_overlap_secs: u64,
}

/// Exit codes: 0 clean shutdown, 1 runtime failure, 2 CRDs missing, 3 leadership lost.
const EXIT_CRDS_MISSING: u8 = 2;
const EXIT_LEADERSHIP_LOST: u8 = 3;

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    telemetry::init();
    match run(args).await {
        Ok(code) => code,
        Err(e) => {
            tracing::error!(event = "operator_failed", error = %format!("{e:#}"));
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> anyhow::Result<ExitCode> {
    // Checked before anything starts: a typo in a selector must not leave Prometheus shut out.
    let scraper = Scraper::new(
        args.prometheus_namespace_selector.as_deref(),
        args.prometheus_pod_selector.as_deref(),
    )?;
    let client = Client::try_default().await?;
    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry);
    let health = Health::default();

    let shutdown = CancellationToken::new();
    {
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            dlock_common::serve::shutdown_signal().await;
            shutdown.cancel();
        });
    }
    let listener = dlock_common::serve::bind(args.listen).await?;
    let app = http::router(Arc::new(registry), health.clone());
    let server = {
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move { shutdown.cancelled().await })
                .await
        })
    };

    let code = operate(&args, client, metrics, scraper, &health, &shutdown).await?;
    health.set(Readiness::ShuttingDown);
    shutdown.cancel();
    let _ = server.await;
    tracing::info!(event = "stopped");
    Ok(code)
}

async fn operate(
    args: &Args,
    client: Client,
    metrics: Metrics,
    scraper: Option<Scraper>,
    health: &Health,
    shutdown: &CancellationToken,
) -> anyhow::Result<ExitCode> {
    let missing = tokio::select! {
        m = startup::wait_for_crds(&client, Duration::from_secs(args.crd_wait_secs)) => m,
        () = shutdown.cancelled() => return Ok(ExitCode::SUCCESS),
    };
    if !missing.is_empty() {
        tracing::error!(
            event = "crds_missing",
            crds = %missing.join(", "),
            waited_secs = args.crd_wait_secs,
            "CRDs are not installed or not Established; install crds/*.yaml (the Helm chart does) and restart"
        );
        return Ok(ExitCode::from(EXIT_CRDS_MISSING));
    }

    let identity = args
        .pod_name
        .clone()
        .unwrap_or_else(|| format!("dlock-operator-{}", std::process::id()));
    let settings = Settings {
        default_image: args.image.clone(),
        namespace: args.namespace.clone(),
        ca_overlap: Duration::from_secs(args.ca_overlap_secs),
        fencing_check_interval: (args.fencing_check_secs > 0)
            .then(|| std::time::Duration::from_secs(args.fencing_check_secs)),
        scraper,
    };
    let ctx = Arc::new(Context::new(
        client.clone(),
        metrics,
        settings,
        Some(identity.clone()),
    ));

    if !args.leader_election {
        tracing::warn!(event = "leader_election_disabled", "run a single replica only");
        health.set(Readiness::Leading);
        controller::run(ctx, cancelled(shutdown.clone())).await;
        return Ok(ExitCode::SUCCESS);
    }

    let lease = LeaseConfig {
        name: args.lease_name.clone(),
        namespace: args
            .lease_namespace
            .clone()
            .unwrap_or_else(|| client.default_namespace().to_owned()),
        identity: identity.clone(),
        duration_secs: args.lease_duration_secs,
        grace_secs: args.lease_grace_secs,
    };
    let manager = startup::lease_manager(client, &lease).await?;
    let (mut leader, lease_task) = manager.watch().await;
    health.set(Readiness::Standby);
    tracing::info!(event = "standing_by", lease = %lease.name, namespace = %lease.namespace, identity = %identity);

    let became_leader = tokio::select! {
        r = leader.wait_for(|is_leader| *is_leader) => r.is_ok(),
        () = shutdown.cancelled() => false,
    };
    let mut code = ExitCode::SUCCESS;
    if became_leader {
        tracing::info!(event = "leader_elected", identity = %identity);
        health.set(Readiness::Leading);
        let lost = CancellationToken::new();
        let stop = {
            let (shutdown, lost) = (shutdown.clone(), lost.clone());
            let mut leader = leader.clone();
            async move {
                tokio::select! {
                    () = shutdown.cancelled() => {}
                    _ = leader.wait_for(|is_leader| !*is_leader) => lost.cancel(),
                }
            }
        };
        controller::run(ctx, stop).await;
        if lost.is_cancelled() {
            // Another replica may already be reconciling: stop at once and let the pod restart.
            tracing::error!(event = "leadership_lost", identity = %identity);
            code = ExitCode::from(EXIT_LEADERSHIP_LOST);
        }
    }
    // Closing the channel makes the lease task release the Lease, so a standby takes over at once.
    drop(leader);
    match tokio::time::timeout(Duration::from_secs(5), lease_task).await {
        Ok(Ok(Ok(_))) => tracing::info!(event = "lease_released"),
        Ok(Ok(Err(e))) => tracing::warn!(event = "lease_release_failed", error = %e),
        Ok(Err(e)) => tracing::warn!(event = "lease_release_failed", error = %e),
        Err(_) => tracing::warn!(event = "lease_release_failed", error = "timed out"),
    }
    Ok(code)
}

async fn cancelled(token: CancellationToken) {
    token.cancelled().await;
}
