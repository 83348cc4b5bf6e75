//! How `kubectl dlock locks` reaches lock-server: a port-forward through the API server's
//! `pods/portforward` subresource, made by the plugin itself (what `kubectl port-forward
//! svc/NAME :http` does, without kubectl on PATH). The forward listens on a loopback port, so the
//! HTTP client connects to an address as it would to kubectl's forward, and the certificate is
//! still checked for the Service's name (`connect_to`).
//!
//! - [`Forward::serve`]: the loopback listener; each accepted connection gets a stream of its own
//!   from an opener and is copied both ways. Generic over the stream, so it is tested without a
//!   cluster.
//! - [`ready_pod`], [`target_port`]: the pod behind the Service and its port, as kubectl picks them.
//! - [`to_service`]: the three together against the API server.

use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

/// The last thing that went wrong with a forwarded connection, for the message of the request
/// that failed because of it (the HTTP client only sees a closed connection).
#[derive(Debug, Clone, Default)]
pub struct LastError(Arc<Mutex<Option<String>>>);

impl LastError {
    pub fn set(&self, message: String) {
        // A poisoned lock only means another connection's task panicked while setting it.
        let mut slot = self.0.lock().unwrap_or_else(|p| p.into_inner());
        *slot = Some(message);
    }

    pub fn get(&self) -> Option<String> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// A loopback port forwarded for as long as this lives (the listener and every connection's copy
/// end on drop).
#[derive(Debug)]
pub struct Forward {
    port: u16,
    errors: LastError,
    task: JoinHandle<()>,
}

impl Drop for Forward {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Forward {
    /// Listens on 127.0.0.1 (a free port) and serves every connection with a stream from `open`;
    /// `first`, when given, serves the first connection (a stream opened before, to fail early).
    pub async fn serve<O, F, S>(first: Option<S>, mut open: O, errors: LastError) -> std::io::Result<Forward>
    where
        O: FnMut() -> F + Send + 'static,
        F: Future<Output = Result<S, String>> + Send + 'static,
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let port = listener.local_addr()?.port();
        let slot = errors.clone();
        let task = tokio::spawn(async move {
            let mut first = first;
            // Dropping the set (the task aborted) aborts every connection's copy with it.
            let mut connections = JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok((tcp, _)) => {
                            let stream = first.take();
                            let opening = stream.is_none().then(&mut open);
                            let slot = slot.clone();
                            connections.spawn(async move {
                                let stream = match (stream, opening) {
                                    (Some(s), _) => Ok(s),
                                    (None, Some(opening)) => opening.await,
                                    (None, None) => Err("no stream to forward to".to_owned()),
                                };
                                match stream {
                                    Ok(s) => {
                                        if let Err(e) = pipe(tcp, s).await {
                                            slot.set(format!("forwarded connection: {e}"));
                                        }
                                    }
                                    // The client sees its connection closed; the reason is kept.
                                    Err(e) => slot.set(e),
                                }
                            });
                        }
                        Err(e) => {
                            slot.set(format!("accepting on 127.0.0.1:{port}: {e}"));
                            return;
                        }
                    },
                    // Finished connections are reaped, so a long listing does not accumulate them.
                    Some(_) = connections.join_next(), if !connections.is_empty() => {}
                }
            }
        });
        Ok(Forward { port, errors, task })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The loopback address the forward listens on.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// Why a forwarded connection failed last, if one did.
    pub fn last_error(&self) -> Option<String> {
        self.errors.get()
    }
}

/// Copies both ways until both sides have ended.
pub async fn pipe<S>(mut tcp: TcpStream, mut stream: S) -> std::io::Result<(u64, u64)>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    tokio::io::copy_bidirectional(&mut tcp, &mut stream).await
}

/// The pod a forward goes to: Running, Ready and not being deleted; the first by name of those,
/// so that the same pod is chosen while nothing changes.
pub fn ready_pod(pods: &[Pod]) -> Option<&Pod> {
    let mut ready: Vec<&Pod> = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| {
            let status = p.status.as_ref();
            status.and_then(|s| s.phase.as_deref()) == Some("Running")
                && status
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
        .collect();
    ready.sort_by_key(|p| p.name_any());
    ready.into_iter().next()
}

/// The pod's port behind the Service's port named `port_name`: the target port as a number, or
/// the pod's container port of that name (the operator's Services target the name `http`).
pub fn target_port(service: &Service, port_name: &str, pod: &Pod) -> Result<u16, String> {
    let svc = service.name_any();
    let ports = service
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .ok_or_else(|| format!("Service {svc} has no ports"))?;
    let port = ports
        .iter()
        .find(|p| p.name.as_deref() == Some(port_name))
        .ok_or_else(|| format!("Service {svc} has no port named {port_name}"))?;
    let number = match &port.target_port {
        None => port.port,
        Some(IntOrString::Int(n)) => *n,
        Some(IntOrString::String(name)) => pod
            .spec
            .iter()
            .flat_map(|s| s.containers.iter())
            .flat_map(|c| c.ports.iter().flatten())
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .map(|p| p.container_port)
            .ok_or_else(|| format!("pod {} has no container port named {name}", pod.name_any()))?,
    };
    u16::try_from(number).map_err(|_| format!("Service {svc}: {number} is not a port"))
}

/// The label selector of the Service's own `spec.selector`, as a string for the list call.
fn selector_of(service: &Service) -> Result<String, String> {
    let selector = service
        .spec
        .as_ref()
        .and_then(|s| s.selector.as_ref())
        .filter(|s| !s.is_empty())
        .ok_or_else(|| format!("Service {} selects no pods", service.name_any()))?;
    Ok(selector
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(","))
}

/// One port-forward stream to `pod`:`port`: the API server's `pods/portforward` (a WebSocket),
/// whose error channel, when the kubelet reports something, is kept in `errors`.
async fn open(
    pods: Api<Pod>,
    pod: String,
    port: u16,
    errors: LastError,
) -> Result<tokio::io::DuplexStream, String> {
    let mut forwarder = pods
        .portforward(&pod, &[port])
        .await
        .map_err(|e| format!("port-forward to pod {pod} port {port}: {e}"))?;
    let stream = forwarder
        .take_stream(port)
        .ok_or_else(|| format!("port-forward to pod {pod} gave no stream for port {port}"))?;
    if let Some(error) = forwarder.take_error(port) {
        tokio::spawn(async move {
            if let Some(message) = error.await {
                errors.set(format!("port-forward to pod {pod} port {port}: {message}"));
            }
        });
    }
    // The forwarder's task goes on without its handle, for as long as the stream is open.
    Ok(stream)
}

/// A loopback port forwarded to a ready pod of Service `service`'s port `port_name`. The first
/// stream is opened here, so that a forward that cannot work (no permission on
/// `pods/portforward`, a node the API server cannot reach) fails now, with its reason.
pub async fn to_service(
    client: &Client,
    namespace: &str,
    service: &str,
    port_name: &str,
) -> Result<Forward, String> {
    let services: Api<Service> = Api::namespaced(client.clone(), namespace);
    let svc = services
        .get_opt(service)
        .await
        .map_err(|e| format!("Service {namespace}/{service}: {e}"))?
        .ok_or_else(|| format!("Service {namespace}/{service} does not exist"))?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let selector = selector_of(&svc)?;
    let listed = pods
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(|e| format!("pods of Service {namespace}/{service} ({selector}): {e}"))?;
    let pod = ready_pod(&listed.items).ok_or_else(|| {
        format!(
            "no Running and Ready pod of Service {namespace}/{service} ({selector}; {} found)",
            listed.items.len()
        )
    })?;
    let port = target_port(&svc, port_name, pod)?;
    let name = pod.name_any();
    let errors = LastError::default();
    let first = open(pods.clone(), name.clone(), port, errors.clone()).await?;
    let opener_errors = errors.clone();
    Forward::serve(
        Some(first),
        move || open(pods.clone(), name.clone(), port, opener_errors.clone()),
        errors,
    )
    .await
    .map_err(|e| format!("listening on 127.0.0.1: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

    /// A "pod" at the far end of a duplex: answers every line with the line upper-cased, tagged
    /// with which stream it is.
    fn pod_stream(tag: usize) -> DuplexStream {
        let (near, mut far) = tokio::io::duplex(64 * 1024);
        tokio::spawn(async move {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = match far.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                let answer = format!("{tag}:{}", String::from_utf8_lossy(&buf[..n]).to_uppercase());
                if far.write_all(answer.as_bytes()).await.is_err() {
                    return;
                }
            }
        });
        near
    }

    async fn ask(addr: SocketAddr, line: &str) -> String {
        let mut tcp = TcpStream::connect(addr).await.unwrap();
        tcp.write_all(line.as_bytes()).await.unwrap();
        let mut buf = vec![0u8; 1024];
        let n = tcp.read(&mut buf).await.unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    #[tokio::test]
    async fn every_connection_gets_a_stream_of_its_own_copied_both_ways() {
        let opened = Arc::new(AtomicUsize::new(0));
        let counter = opened.clone();
        let forward = Forward::serve(
            Some(pod_stream(0)),
            move || {
                let tag = counter.fetch_add(1, Ordering::SeqCst) + 1;
                async move { Ok::<_, String>(pod_stream(tag)) }
            },
            LastError::default(),
        )
        .await
        .unwrap();
        assert_eq!(forward.addr().ip(), Ipv4Addr::LOCALHOST);
        // The first connection is served by the stream opened before; the next by new ones.
        assert_eq!(ask(forward.addr(), "hello").await, "0:HELLO");
        assert_eq!(ask(forward.addr(), "again").await, "1:AGAIN");
        assert_eq!(ask(forward.addr(), "third").await, "2:THIRD");
        assert_eq!(opened.load(Ordering::SeqCst), 2);
        // Two connections open at once each have their own stream.
        let (a, b) = tokio::join!(ask(forward.addr(), "x"), ask(forward.addr(), "y"));
        let mut tags = [
            a.split(':').next().unwrap().to_owned(),
            b.split(':').next().unwrap().to_owned(),
        ];
        tags.sort();
        assert_eq!(tags, ["3".to_owned(), "4".to_owned()], "{a} {b}");
        assert_eq!(forward.last_error(), None);
    }

    #[tokio::test]
    async fn a_stream_that_cannot_be_opened_closes_the_connection_and_says_why() {
        let forward = Forward::serve(
            None::<DuplexStream>,
            || async { Err::<DuplexStream, _>("pods \"x\" is forbidden".to_owned()) },
            LastError::default(),
        )
        .await
        .unwrap();
        let mut tcp = TcpStream::connect(forward.addr()).await.unwrap();
        let mut buf = Vec::new();
        // The connection ends without a byte (EOF or a reset), once the opener has failed.
        let read = tcp.read_to_end(&mut buf).await;
        assert!(read.is_err() || buf.is_empty(), "{read:?} {buf:?}");
        assert_eq!(forward.last_error().as_deref(), Some("pods \"x\" is forbidden"));
    }

    #[tokio::test]
    async fn the_listener_ends_with_the_forward() {
        let forward = Forward::serve(
            None::<DuplexStream>,
            || async { Ok::<_, String>(pod_stream(1)) },
            LastError::default(),
        )
        .await
        .unwrap();
        let addr = forward.addr();
        assert_eq!(ask(addr, "up").await, "1:UP");
        drop(forward);
        // The aborted task drops the listener; wait for that instead of sleeping a fixed time.
        let refused = async {
            loop {
                if TcpStream::connect(addr).await.is_err() {
                    return;
                }
                tokio::task::yield_now().await;
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(10), refused)
            .await
            .expect("the port is closed once the forward is dropped");
    }

    fn pod(name: &str, phase: &str, ready: &str, deleting: bool) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": name,
                "deletionTimestamp": deleting.then_some("2026-03-01T10:00:00Z"),
            },
            "spec": {"containers": [{"name": "lock-server", "ports": [{"name": "http", "containerPort": 8080}]}]},
            "status": {"phase": phase, "conditions": [{"type": "Ready", "status": ready}]},
        }))
        .unwrap()
    }

    #[test]
    fn the_pod_is_running_ready_and_not_terminating() {
        let pods = vec![
            pod("a-terminating", "Running", "True", true),
            pod("b-pending", "Pending", "False", false),
            pod("c-unready", "Running", "False", false),
            pod("e-ready", "Running", "True", false),
            pod("d-ready", "Running", "True", false),
        ];
        assert_eq!(ready_pod(&pods).map(|p| p.name_any()).as_deref(), Some("d-ready"));
        assert!(ready_pod(&pods[..3]).is_none());
        assert!(ready_pod(&[]).is_none());
    }

    fn service(target: serde_json::Value) -> Service {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "locks-lock-server"},
            "spec": {
                "selector": {"app.kubernetes.io/instance": "locks", "app.kubernetes.io/component": "lock-server"},
                "ports": [{"name": "metrics", "port": 9090}, {"name": "http", "port": 80, "targetPort": target}],
            },
        }))
        .unwrap()
    }

    #[test]
    fn the_port_is_the_services_target_as_the_pod_names_it() {
        let p = pod("d-ready", "Running", "True", false);
        // The operator's Services: targetPort is the container port's name.
        assert_eq!(
            target_port(&service(serde_json::json!("http")), "http", &p),
            Ok(8080)
        );
        assert_eq!(
            target_port(&service(serde_json::json!(8443)), "http", &p),
            Ok(8443)
        );
        assert!(target_port(&service(serde_json::json!("grpc")), "http", &p).is_err());
        assert!(target_port(&service(serde_json::json!("http")), "admin", &p).is_err());
        let svc = service(serde_json::json!("http"));
        assert_eq!(
            selector_of(&svc).as_deref(),
            Ok("app.kubernetes.io/component=lock-server,app.kubernetes.io/instance=locks")
        );
        let mut no_selector = svc.clone();
        no_selector.spec.as_mut().unwrap().selector = None;
        assert!(selector_of(&no_selector).is_err());
    }
}
