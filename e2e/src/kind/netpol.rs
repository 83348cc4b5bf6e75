//! Packet-level checks of the NetworkPolicies (step netpol of `tests/kind.rs`): TCP connections
//! opened from inside pods, through the Services' cluster IPs as the stack's own calls go, and
//! whether the network plugin let them through.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{AttachParams, DeleteParams, PostParams};
use tokio::io::AsyncReadExt;

use super::{log, wait_until};

/// What one connection attempt came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// The TCP handshake completed.
    Connected,
    /// Refused (kube-router rejects what no policy admits) or reset.
    Refused,
    /// No answer within [`CONNECT_TIMEOUT_S`] (a plugin that drops instead of rejecting).
    TimedOut,
}

impl Reach {
    pub fn connected(self) -> bool {
        self == Reach::Connected
    }
}

impl fmt::Display for Reach {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Reach::Connected => "connected",
            Reach::Refused => "refused",
            Reach::TimedOut => "timed out",
        })
    }
}

/// How long one attempt may take.
pub const CONNECT_TIMEOUT_S: u32 = 5;

/// The attempt, run by bash inside the pod (every dlock image has it): the name must resolve first
/// (an unresolved name is a mistake of the test, never a verdict on the policy), then bash's
/// `/dev/tcp` opens the connection under `timeout`.
const CONNECT_SCRIPT: &str = r#"
getent hosts "$1" >/dev/null || { echo unresolved; exit 0; }
timeout "$3" bash -c 'exec 3<>"/dev/tcp/$0/$1"' "$1" "$2" 2>/dev/null
case $? in 0) echo connected ;; 124) echo timeout ;; *) echo refused ;; esac
"#;

/// A pod connections are opened from.
#[derive(Clone)]
pub struct Source {
    /// What it stands for, in the report (`outsider`, `payout-executor`, ...).
    pub label: String,
    pub pods: Api<Pod>,
    pub pod: String,
}

impl fmt::Debug for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (pod {})", self.label, self.pod)
    }
}

/// A Service port connections are opened to.
#[derive(Debug, Clone)]
pub struct Target {
    pub label: String,
    /// `<service>.<namespace>.svc`
    pub host: String,
    pub port: u16,
}

impl Target {
    pub fn service(label: &str, service: &str, ns: &str, port: u16) -> Target {
        Target {
            label: label.to_owned(),
            host: format!("{service}.{ns}.svc"),
            port,
        }
    }
}

/// Opens one TCP connection from inside `from` to `to` (exec in the pod's first container).
pub async fn connect(from: &Source, to: &Target) -> Reach {
    let command = vec![
        "bash".to_owned(),
        "-c".to_owned(),
        CONNECT_SCRIPT.to_owned(),
        "connect".to_owned(),
        to.host.clone(),
        to.port.to_string(),
        CONNECT_TIMEOUT_S.to_string(),
    ];
    let params = AttachParams::default().stdout(true).stderr(false);
    let mut process = from
        .pods
        .exec(&from.pod, command, &params)
        .await
        .unwrap_or_else(|e| panic!("exec in {from:?}: {e}"));
    let mut out = String::new();
    if let Some(mut stdout) = process.stdout() {
        stdout
            .read_to_string(&mut out)
            .await
            .unwrap_or_else(|e| panic!("read the output of exec in {from:?}: {e}"));
    }
    process
        .join()
        .await
        .unwrap_or_else(|e| panic!("exec in {from:?}: {e}"));
    match out.trim() {
        "connected" => Reach::Connected,
        "refused" => Reach::Refused,
        "timeout" => Reach::TimedOut,
        "unresolved" => panic!("{} does not resolve in {from:?}", to.host),
        other => panic!("unexpected output of the connection attempt in {from:?}: {other:?}"),
    }
}

/// One expected outcome: whether `from` may open a connection to `to`.
#[derive(Debug, Clone)]
pub struct Expect {
    pub from: Source,
    pub to: Target,
    pub allowed: bool,
}

/// A connection that did not come out as expected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wrong {
    pub from: String,
    pub to: String,
    pub reach: Reach,
}

/// The outcome of [`check`]: a table of every attempt, and the ones that were not as expected.
#[derive(Debug, Clone)]
pub struct Checked {
    pub table: String,
    pub wrong: Vec<Wrong>,
}

impl Checked {
    pub fn passed(&self) -> bool {
        self.wrong.is_empty()
    }

    /// Whether `from` got through to `to` although it should not have.
    pub fn let_through(&self, from: &str, to: &str) -> bool {
        self.wrong
            .iter()
            .any(|w| w.from == from && w.to == to && w.reach.connected())
    }
}

impl fmt::Display for Checked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for w in &self.wrong {
            writeln!(f, "WRONG: {} -> {}: {}", w.from, w.to, w.reach)?;
        }
        f.write_str(&self.table)
    }
}

/// Every connection of `expected`, tried once.
pub async fn check(expected: &[Expect]) -> Checked {
    let mut table = String::new();
    let mut wrong = Vec::new();
    for e in expected {
        let reach = connect(&e.from, &e.to).await;
        let ok = reach.connected() == e.allowed;
        table.push_str(&format!(
            "\n  {:<17} -> {:<17} {:<10} (should be {}){}",
            e.from.label,
            e.to.label,
            reach.to_string(),
            if e.allowed { "allowed" } else { "denied" },
            if ok { "" } else { "  WRONG" }
        ));
        if !ok {
            wrong.push(Wrong {
                from: e.from.label.clone(),
                to: e.to.label.clone(),
                reach,
            });
        }
    }
    Checked { table, wrong }
}

/// A pod that carries none of the stack's labels (only `app.kubernetes.io/name: <name>`), running
/// `image` (a dlock image: bash, getent, timeout), sleeping; Running when this returns. Delete it
/// with [`delete_outsider`].
pub async fn start_outsider(
    pods: &Api<Pod>,
    name: &str,
    image: &str,
    timeout: std::time::Duration,
) -> Source {
    let mut pod = Pod {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/name".to_owned(),
                name.to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "probe".into(),
                image: Some(image.to_owned()),
                image_pull_policy: Some("Never".into()),
                command: Some(vec!["sleep".into(), "3600".into()]),
                ..Container::default()
            }],
            restart_policy: Some("Never".into()),
            // `sleep` ignores SIGTERM: nothing to wait for at deletion.
            termination_grace_period_seconds: Some(0),
            ..PodSpec::default()
        }),
        ..Pod::default()
    };
    // The namespace enforces the "restricted" standard, for the checks' pods too: the same
    // settings the operator gives its own pods.
    if let Some(spec) = pod.spec.as_mut() {
        dlock_operator::builders::security::restrict(spec);
    }
    pods.create(&PostParams::default(), &pod)
        .await
        .unwrap_or_else(|e| panic!("create pod {name}: {e}"));
    wait_until(
        pods,
        name,
        &format!("pod {name} to run"),
        timeout,
        |p: Option<&Pod>| p.and_then(|p| p.status.as_ref()?.phase.as_deref()) == Some("Running"),
    )
    .await;
    log(format!(
        "pod {name} runs {image} without any of the stack's labels"
    ));
    Source {
        label: "outsider".into(),
        pods: pods.clone(),
        pod: name.to_owned(),
    }
}

pub async fn delete_outsider(source: &Source) {
    source
        .pods
        .delete(&source.pod, &DeleteParams::default().grace_period(0))
        .await
        .unwrap_or_else(|e| panic!("delete pod {}: {e}", source.pod));
}
