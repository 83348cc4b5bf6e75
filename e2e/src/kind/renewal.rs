//! The renewal step of `tests/kind.rs`: every certificate of the stack renewed on request
//! (`dlock.dev/renew-certificates`) while a batch of payouts is being paid. What it proves is what
//! docs/operations.md promises of a renewal: the operator writes new certificates into the same
//! Secrets, each server's pod presents the new one on its next handshake without restarting (the
//! managed databases too: their sidecar reloads PostgreSQL), the clients (which trust the
//! unchanged CA) go on calling, and every payout of the batch is posted.
//! A value that is not a valid request renews nothing and says so in a Warning Event.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use dlock_operator::builders::tls::{LOCKDB, PAYDB};
use dlock_operator::builders::{
    LABEL_COMPONENT, LABEL_INSTANCE, LOCK_SERVER, Owner, PAYMENT_RESOURCE, PAYOUT_EXECUTOR, RAIL_PROXY,
    RAIL_STUB,
};
use dlock_operator::crd::tls::ANNOTATION_RENEW_CERTIFICATES;
use dlock_operator::crd::{LockService, PaymentStack};
use k8s_openapi::api::core::v1::{Event, Pod, Secret};
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client, Resource};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use serde::de::DeserializeOwned;

use super::{KindEnv, Payments, ca_bundle, forward_to, log, poll};

/// One served component of one object: its certificate Secret and its pods.
struct Served {
    instance: String,
    component: &'static str,
    secret: String,
    /// The Service's in-cluster name, which the certificate carries.
    host: String,
    /// A managed PostgreSQL (TLS after its protocol's SSLRequest, on 5432), not an HTTPS server.
    postgres: bool,
}

/// The DER of a Secret's `tls.crt` (the certificate the operator wrote).
async fn secret_der(secrets: &Api<Secret>, name: &str) -> Vec<u8> {
    let s = secrets
        .get(name)
        .await
        .unwrap_or_else(|e| panic!("get Secret {name}: {e}"));
    let pem = s
        .data
        .and_then(|mut d| d.remove("tls.crt"))
        .unwrap_or_else(|| panic!("Secret {name} has no tls.crt"));
    CertificateDer::from_pem_slice(&pem.0)
        .unwrap_or_else(|e| panic!("Secret {name}: tls.crt is not a PEM certificate: {e}"))
        .to_vec()
}

/// Name, uid and restart count of each pod of one component: what must not change while the
/// certificates are renewed.
async fn pods_of(pods: &Api<Pod>, instance: &str, component: &str) -> BTreeMap<String, (String, i32)> {
    let lp = ListParams::default().labels(&format!(
        "{LABEL_INSTANCE}={instance},{LABEL_COMPONENT}={component}"
    ));
    pods.list(&lp)
        .await
        .unwrap_or_else(|e| panic!("list {component} pods: {e}"))
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| {
            let restarts = p
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .map(|cs| cs.iter().map(|c| c.restart_count).sum())
                .unwrap_or(0);
            (
                p.metadata.name.unwrap_or_default(),
                (p.metadata.uid.unwrap_or_default(), restarts),
            )
        })
        .collect()
}

/// The certificate a PostgreSQL server on 127.0.0.1:`port` presents: its protocol's SSLRequest,
/// then a TLS handshake verified against `ca_pem` for `host` (blocking: a few round trips).
fn postgres_presented(port: u16, ca_pem: &str, host: &str) -> Result<Vec<u8>, String> {
    use std::io::{Read, Write};
    let config = crate::lockapi::trusting(ca_pem)?;
    let name = rustls::pki_types::ServerName::try_from(host.to_owned()).map_err(|e| e.to_string())?;
    let mut tcp = std::net::TcpStream::connect(("127.0.0.1", port)).map_err(|e| format!("connect: {e}"))?;
    tcp.set_read_timeout(Some(Duration::from_secs(10))).ok();
    // SSLRequest: length 8, code 80877103.
    tcp.write_all(&[0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f])
        .map_err(|e| format!("SSLRequest: {e}"))?;
    let mut answer = [0u8; 1];
    tcp.read_exact(&mut answer)
        .map_err(|e| format!("SSLRequest's answer: {e}"))?;
    if answer[0] != b'S' {
        return Err(format!(
            "the server declined TLS (answered {:?})",
            answer[0] as char
        ));
    }
    let mut conn = rustls::ClientConnection::new(config, name).map_err(|e| e.to_string())?;
    while conn.is_handshaking() {
        conn.complete_io(&mut tcp)
            .map_err(|e| format!("TLS handshake: {e}"))?;
    }
    conn.peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.to_vec())
        .ok_or_else(|| "no certificate presented".to_owned())
}

/// The certificate pod `pod` presents on a new handshake, through its own port-forward, verified
/// against the namespace's CA for the Service's name.
async fn presented(
    env: &KindEnv,
    ca: &reqwest::Certificate,
    ca_pem: &str,
    pod: &str,
    s: &Served,
) -> Result<Vec<u8>, String> {
    let host = s.host.as_str();
    if s.postgres {
        let fwd = forward_to(env, &format!("pod/{pod}"), 5432).await;
        let (port, ca_pem, host) = (fwd.port, ca_pem.to_owned(), host.to_owned());
        return tokio::task::spawn_blocking(move || postgres_presented(port, &ca_pem, &host))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("{pod}: {e}"));
    }
    let fwd = forward_to(env, &format!("pod/{pod}"), 8080).await;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .tls_built_in_root_certs(false)
        .add_root_certificate(ca.clone())
        .resolve(host, SocketAddr::from(([127, 0, 0, 1], fwd.port)))
        .tls_info(true)
        .no_proxy()
        .build()
        .map_err(|e| format!("an HTTPS client: {e}"))?;
    let resp = http
        .get(format!("https://{host}:{}/healthz", fwd.port))
        .send()
        .await
        .map_err(|e| format!("GET /healthz of {pod}: {e:?}"))?;
    resp.extensions()
        .get::<reqwest::tls::TlsInfo>()
        .and_then(|i| i.peer_certificate())
        .map(<[u8]>::to_vec)
        .ok_or_else(|| format!("{pod} presented no certificate"))
}

/// Sets the renew annotation of `name`.
async fn request_renewal<K>(api: &Api<K>, name: &str, value: &str)
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let patch = serde_json::json!({"metadata": {"annotations": {ANNOTATION_RENEW_CERTIFICATES: value}}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_or_else(|e| panic!("annotate {name}: {e}"));
}

fn handled_of(tls: Option<&dlock_operator::crd::TlsStatus>) -> Option<String> {
    tls.and_then(|t| t.last_handled_renew_request.clone())
}

/// The step: see the module's doc. `run` names the batch paid meanwhile.
pub async fn renew_while_paying(env: &KindEnv, client: &Client, pay: &Payments, run: &str) {
    let ns = &env.ns;
    let lsvcs: Api<LockService> = Api::namespaced(client.clone(), ns);
    let pstacks: Api<PaymentStack> = Api::namespaced(client.clone(), ns);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let ls = lsvcs.get(&env.lsvc).await.expect("the LockService");
    let ps = pstacks.get(&env.pstack).await.expect("the PaymentStack");
    let ls_owner = Owner::of(&ls).expect("the LockService's owner");
    let ps_owner = Owner::of(&ps).expect("the PaymentStack's owner");
    // The four HTTPS servers and the two managed databases (TLS only, reloaded by their sidecar).
    let served: Vec<Served> = [(&ls_owner, LOCK_SERVER), (&ls_owner, LOCKDB)]
        .into_iter()
        .chain([PAYMENT_RESOURCE, RAIL_PROXY, RAIL_STUB, PAYDB].map(|c| (&ps_owner, c)))
        .map(|(o, component)| Served {
            instance: o.name.clone(),
            component,
            secret: o.tls_secret(component),
            host: format!("{}.{ns}.svc", o.child(component)),
            postgres: matches!(component, LOCKDB | PAYDB),
        })
        .collect();
    let ca_pem = ca_bundle(client, ns).await;
    let ca = reqwest::Certificate::from_pem(ca_pem.as_bytes()).expect("the CA bundle");

    let mut before = Vec::new();
    let mut watched = BTreeMap::new();
    for s in &served {
        let der = secret_der(&secrets, &s.secret).await;
        let running = pods_of(&pods, &s.instance, s.component).await;
        assert!(!running.is_empty(), "no {} pod", s.component);
        for pod in running.keys() {
            let now = presented(env, &ca, &ca_pem, pod, s)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            assert!(
                now == der,
                "{pod} does not present its Secret {}'s certificate",
                s.secret
            );
        }
        watched.insert(s.component, running);
        before.push(der);
    }
    let executors = pods_of(&pods, &ps_owner.name, PAYOUT_EXECUTOR).await;
    let handled_before = handled_of(ps.status.as_ref().and_then(|s| s.tls.as_ref()));

    // An invalid value: a Warning Event, nothing renewed, nothing echoed.
    request_renewal(&pstacks, &env.pstack, "not a token!").await;
    let events: Api<Event> = Api::namespaced(client.clone(), ns);
    poll("the RenewRequestInvalid Event", env.timeout, async || {
        let list = events
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        list.items
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some("RenewRequestInvalid")
                    && e.involved_object.name.as_deref() == Some(env.pstack.as_str())
            })
            .then_some(())
            .ok_or_else(|| "no Event yet".to_owned())
    })
    .await;
    for (s, der) in served.iter().zip(&before) {
        assert!(
            secret_der(&secrets, &s.secret).await == *der,
            "an invalid request renewed {}",
            s.secret
        );
    }
    let ps = pstacks.get(&env.pstack).await.expect("the PaymentStack");
    assert_eq!(
        handled_of(ps.status.as_ref().and_then(|s| s.tls.as_ref())),
        handled_before
    );
    log("an invalid renew request renewed nothing (Warning Event RenewRequestInvalid)");

    // The batch, then the request while the executors are paying it.
    let n = env.payouts;
    pay.create_batch(run, 1, n).await;
    let token = format!("kind-{}", chrono::Utc::now().timestamp());
    request_renewal(&lsvcs, &env.lsvc, &token).await;
    request_renewal(&pstacks, &env.pstack, &token).await;
    log(format!("{n} payouts created; renewal requested ({token})"));
    poll(
        "both objects to echo the renew request",
        env.timeout,
        async || {
            let ls = lsvcs.get(&env.lsvc).await.map_err(|e| e.to_string())?;
            let ps = pstacks.get(&env.pstack).await.map_err(|e| e.to_string())?;
            let handled = (
                handled_of(ls.status.as_ref().and_then(|s| s.tls.as_ref())),
                handled_of(ps.status.as_ref().and_then(|s| s.tls.as_ref())),
            );
            (handled == (Some(token.clone()), Some(token.clone())))
                .then_some(())
                .ok_or_else(|| format!("lastHandledRenewRequest {handled:?}"))
        },
    )
    .await;
    let mut after = Vec::new();
    for (s, old) in served.iter().zip(&before) {
        let der = secret_der(&secrets, &s.secret).await;
        assert!(der != *old, "Secret {} still holds the old certificate", s.secret);
        after.push(der);
    }
    // The kubelet updates the mounted Secrets within its sync period; each server then presents
    // the new certificate on the next handshake.
    for (s, der) in served.iter().zip(&after) {
        for pod in watched[s.component].keys() {
            poll(
                &format!("{pod} to present the renewed certificate"),
                env.timeout,
                async || match presented(env, &ca, &ca_pem, pod, s).await? {
                    now if now == *der => Ok(()),
                    _ => Err("still the old certificate".to_owned()),
                },
            )
            .await;
        }
    }
    log("every server presents its renewed certificate");
    pay.await_posted(run, n, env.timeout).await;
    pay.check_batch(run).await.unwrap_or_else(|e| panic!("{e}"));
    // Nothing restarted: the servers re-read their files, the clients trust the same CA.
    for s in &served {
        assert_eq!(
            pods_of(&pods, &s.instance, s.component).await,
            watched[s.component],
            "{} pods were replaced or restarted by the renewal",
            s.component
        );
    }
    assert_eq!(
        pods_of(&pods, &ps_owner.name, PAYOUT_EXECUTOR).await,
        executors,
        "executor pods were replaced or restarted by the renewal"
    );
    log(format!(
        "{n} payouts of {run} posted through the renewal of {} certificates; no pod restarted",
        served.len()
    ));
}
