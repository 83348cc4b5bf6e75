//! `kubectl dlock`: the operator actions of docs/operations.md as one command each, with the
//! request id generated, the annotation written as the runbook shows it, the action's end awaited
//! by watching the object's status, and its outcome printed (non-zero exit when it failed); plus
//! `status` and `locks` to read what the operator and lock-server report.
//!
//! - [`cli`]: the arguments; [`request`]: the annotations, from the operator's own request types;
//! - [`outcome`]: how a command ended, as an exit code and lines; [`status`]: the status view;
//! - [`locks`]: lock-server's list of held locks; [`forward`]: the port-forward to it, through the
//!   API server (no kubectl needed); [`complete`]: shell completion; this module: the Kubernetes
//!   calls.

pub mod cli;
pub mod complete;
pub mod forward;
pub mod locks;
pub mod outcome;
pub mod request;
pub mod status;

use std::time::Duration;

use chrono::Utc;
use dlock_operator::builders::credentials::admin_secret_name;
use dlock_operator::builders::{HTTP_PORT_NAME, LOCK_SERVER, Owner};
use dlock_operator::crd::actions::{ActionStatus, RequestError};
use dlock_operator::crd::{LockService, PaymentStack};
use futures::TryStreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Config};

use crate::cli::{ActionArgs, Cli, Command, LocksArgs, Output, RestoreArgs, RevokeArgs, StatusArgs, Target};
use crate::outcome::{EXIT_ERROR, EXIT_USAGE, Outcome, describe};
use crate::request::Annotation;

/// Why a command could not do its work.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Usage(String),
    #[error("{kind} {namespace}/{name} does not exist")]
    NotFound {
        kind: &'static str,
        namespace: String,
        name: String,
    },
    #[error("the operator would refuse this request: {0}")]
    Request(#[from] RequestError),
    #[error("kubeconfig: {0}")]
    Config(String),
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("watching the object: {0}")]
    Watch(String),
    #[error("lock-server: {0}")]
    LockServer(String),
}

impl Error {
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Usage(_) | Error::NotFound { .. } | Error::Request(_) => EXIT_USAGE,
            Error::Config(_) | Error::Kube(_) | Error::Watch(_) | Error::LockServer(_) => EXIT_ERROR,
        }
    }
}

/// Runs one command. Read-only commands print as they go; an action's outcome is for [`report`].
pub async fn run(cli: Cli) -> Result<Outcome, Error> {
    if let Command::Completion(args) = &cli.command {
        print!("{}", complete::script(args.shell));
        return Ok(Outcome::Shown);
    }
    let (client, namespace) = connect(cli.context.as_deref(), cli.namespace.as_deref()).await?;
    match cli.command {
        Command::Revoke(args) => revoke(client, &namespace, args).await,
        Command::Restore(args) => restore(client, &namespace, args).await,
        Command::Status(args) => show_status(client, &namespace, args).await,
        Command::Locks(args) => list_locks(client, &namespace, args).await,
        Command::Completion(_) => Ok(Outcome::Shown),
    }
}

/// The last lines of an action command: its outcome on stdout, or why it is not known yet.
pub fn report(outcome: &Outcome) {
    match outcome {
        Outcome::Requested { id } => println!("{id}"),
        Outcome::Finished(a) => println!("{}", describe(a)),
        Outcome::TimedOut { id, last } => {
            let state = last
                .as_ref()
                .map_or("not seen by the operator yet".to_owned(), describe);
            eprintln!(
                "{id}: still running when --timeout ran out ({state}); follow it with `kubectl dlock status`"
            );
        }
        Outcome::Shown => {}
    }
}

/// A client for the context (the current one by default) and the namespace to work in.
async fn connect(context: Option<&str>, namespace: Option<&str>) -> Result<(Client, String), Error> {
    let config = match context {
        Some(c) => {
            let options = KubeConfigOptions {
                context: Some(c.to_owned()),
                ..KubeConfigOptions::default()
            };
            let kubeconfig = Kubeconfig::read().map_err(|e| Error::Config(e.to_string()))?;
            Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .map_err(|e| Error::Config(e.to_string()))?
        }
        None => Config::infer().await.map_err(|e| Error::Config(e.to_string()))?,
    };
    let namespace = namespace.map_or_else(|| config.default_namespace.clone(), str::to_owned);
    Ok((Client::try_from(config)?, namespace))
}

async fn lock_service(api: &Api<LockService>, namespace: &str, name: &str) -> Result<LockService, Error> {
    api.get_opt(name).await?.ok_or_else(|| Error::NotFound {
        kind: "LockService",
        namespace: namespace.to_owned(),
        name: name.to_owned(),
    })
}

async fn revoke(client: Client, namespace: &str, args: RevokeArgs) -> Result<Outcome, Error> {
    let api: Api<LockService> = Api::namespaced(client, namespace);
    lock_service(&api, namespace, &args.lock_service).await?;
    let requested_by = args
        .requested_by
        .or_else(|| std::env::var("USER").ok())
        .filter(|u| !u.is_empty())
        .ok_or_else(|| Error::Usage("--requested-by is needed: $USER is not set".into()))?;
    let id = args
        .action
        .id
        .clone()
        .unwrap_or_else(|| request::new_id("r", Utc::now(), &mut rand::rng()));
    let annotation = request::revoke(id, &args.key, &args.reason, &requested_by)?;
    act(&api, namespace, &args.lock_service, &annotation, &args.action).await
}

async fn restore(client: Client, namespace: &str, args: RestoreArgs) -> Result<Outcome, Error> {
    let api: Api<LockService> = Api::namespaced(client, namespace);
    lock_service(&api, namespace, &args.lock_service).await?;
    let id = args
        .action
        .id
        .clone()
        .unwrap_or_else(|| request::new_id("ff", Utc::now(), &mut rand::rng()));
    let annotation = request::restore(id, args.margin)?;
    act(&api, namespace, &args.lock_service, &annotation, &args.action).await
}

/// Writes the request (as `kubectl annotate --overwrite` would) and, with `--wait`, follows it.
async fn act(
    api: &Api<LockService>,
    namespace: &str,
    name: &str,
    annotation: &Annotation,
    args: &ActionArgs,
) -> Result<Outcome, Error> {
    let patch = serde_json::json!({"metadata": {"annotations": {annotation.key: annotation.value}}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    eprintln!(
        "requested on LockService {namespace}/{name}: {}='{}'",
        annotation.key, annotation.value
    );
    if !args.wait {
        return Ok(Outcome::Requested {
            id: annotation.id.clone(),
        });
    }
    wait_for(api, name, &annotation.id, args.timeout).await
}

/// The action `id` of LockService `name`, when its status has it.
fn action_of(ls: &LockService, id: &str) -> Option<ActionStatus> {
    ls.status
        .as_ref()
        .and_then(|s| s.actions.iter().find(|a| a.id == id))
        .cloned()
}

/// Watches the LockService until action `id` is `Succeeded` or `Failed`, printing each new phase
/// and step on stderr; [`Outcome::TimedOut`] after `timeout`.
pub async fn wait_for(
    api: &Api<LockService>,
    name: &str,
    id: &str,
    timeout: Duration,
) -> Result<Outcome, Error> {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut seen: Option<ActionStatus> = None;
    let follow = async {
        let mut objects = std::pin::pin!(watcher(api.clone(), config).applied_objects());
        while let Some(ls) = objects
            .try_next()
            .await
            .map_err(|e| Error::Watch(e.to_string()))?
        {
            let Some(a) = action_of(&ls, id) else { continue };
            if seen.as_ref().map(|s| (s.phase, s.step)) != Some((a.phase, a.step)) {
                eprintln!("  {}", describe(&a).lines().next().unwrap_or_default());
            }
            let done = a.phase.is_final();
            seen = Some(a.clone());
            if done {
                return Ok(a);
            }
        }
        Err(Error::Watch("the watch ended".into()))
    };
    match tokio::time::timeout(timeout, follow).await {
        Ok(Ok(a)) => Ok(Outcome::Finished(a)),
        Ok(Err(e)) => Err(e),
        Err(_) => Ok(Outcome::TimedOut {
            id: id.to_owned(),
            last: seen,
        }),
    }
}

async fn show_status(client: Client, namespace: &str, args: StatusArgs) -> Result<Outcome, Error> {
    let target = Target::parse(&args.name).map_err(Error::Usage)?;
    let lsvcs: Api<LockService> = Api::namespaced(client.clone(), namespace);
    let stacks: Api<PaymentStack> = Api::namespaced(client, namespace);
    let (ls, ps) = match &target {
        Target::LockService(n) => (Some(lock_service(&lsvcs, namespace, n).await?), None),
        Target::PaymentStack(n) => (
            None,
            Some(stacks.get_opt(n).await?.ok_or_else(|| Error::NotFound {
                kind: "PaymentStack",
                namespace: namespace.to_owned(),
                name: n.clone(),
            })?),
        ),
        Target::Either(n) => {
            let (ls, ps) = (lsvcs.get_opt(n).await?, stacks.get_opt(n).await?);
            if ls.is_none() && ps.is_none() {
                return Err(Error::NotFound {
                    kind: "LockService or PaymentStack",
                    namespace: namespace.to_owned(),
                    name: n.clone(),
                });
            }
            (ls, ps)
        }
    };
    let mut views = Vec::new();
    if let Some(ls) = &ls {
        let name = ls.metadata.name.clone().unwrap_or_default();
        views.push(status::View {
            kind: "LockService",
            namespace: namespace.to_owned(),
            fencing_of: Some((name.clone(), ls.status.clone())),
            name,
            status: ls.status.clone(),
        });
    }
    if let Some(ps) = &ps {
        let name = ps.metadata.name.clone().unwrap_or_default();
        let ls_name = ps.spec.lock_service_ref.name.clone();
        let its_ls = lsvcs.get_opt(&ls_name).await?;
        views.push(status::View {
            kind: "PaymentStack",
            namespace: namespace.to_owned(),
            name,
            status: ps.status.clone(),
            fencing_of: Some((ls_name, its_ls.and_then(|l| l.status))),
        });
    }
    match args.output {
        Output::Table => {
            for v in &views {
                print!("{}", v.render());
            }
        }
        Output::Json => println!("{}", status::json(&views)),
    }
    Ok(Outcome::Shown)
}

async fn list_locks(client: Client, namespace: &str, args: LocksArgs) -> Result<Outcome, Error> {
    let lsvcs: Api<LockService> = Api::namespaced(client.clone(), namespace);
    let ls = lock_service(&lsvcs, namespace, &args.lock_service).await?;
    let owner = Owner::of(&ls).ok_or_else(|| Error::Usage("the LockService has no uid yet".into()))?;
    // The list is lock-server's admin route: its token, from the Secret the operator generated.
    let token = admin_token(&client, namespace, &admin_secret_name(&owner)).await?;
    // No credential reaches a Service through the API server's proxy (the API server consumes the
    // Authorization header), so lock-server is reached the way `kubectl port-forward` reaches it
    // (the API server's pods/portforward, made here: no kubectl needed), for as long as `forward`
    // lives.
    // HTTPS (`spec.tls`, on by default): lock-server's certificate is checked against the
    // namespace's CA, for the Service's name, also through the port-forward.
    let service = owner.child(LOCK_SERVER);
    let ca = if ls.spec.tls.https() {
        Some(ca_bundle(&client, namespace).await?)
    } else {
        None
    };
    let (base, connect_to, forward) = match args.lock_server_url {
        Some(url) => (url, None, None),
        None => {
            let f = forward::to_service(&client, namespace, &service, HTTP_PORT_NAME)
                .await
                .map_err(|e| {
                    Error::LockServer(format!("port-forward to Service {namespace}/{service}: {e}"))
                })?;
            match ca {
                Some(_) => (
                    format!("https://{service}.{namespace}.svc:{}", f.port()),
                    Some(f.addr()),
                    Some(f),
                ),
                None => (format!("http://{}", f.addr()), None, Some(f)),
            }
        }
    };
    let items = locks::list(&base, &token, &args.prefix, ca.as_deref(), connect_to)
        .await
        .map_err(|e| {
            // The HTTP client only sees a closed connection when the forward failed; say why.
            let why = forward
                .as_ref()
                .and_then(forward::Forward::last_error)
                .map(|f| format!(" (port-forward: {f})"))
                .unwrap_or_default();
            Error::LockServer(format!("{e}{why}"))
        })?;
    drop(forward);
    match args.output {
        Output::Table => print!("{}", locks::render(&items)),
        Output::Json => println!(
            "{}",
            locks::json(namespace, &args.lock_service, &args.prefix, &items)
        ),
    }
    Ok(Outcome::Shown)
}

/// The namespace's CA certificate (ConfigMap `dlock-ca-bundle`, which the operator publishes).
async fn ca_bundle(client: &Client, namespace: &str) -> Result<String, Error> {
    use dlock_operator::builders::tls::{CA_BUNDLE, CA_BUNDLE_KEY};
    let api: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client.clone(), namespace);
    let cm = api.get(CA_BUNDLE).await.map_err(|e| {
        Error::LockServer(format!(
            "lock-server serves HTTPS; its CA is in ConfigMap {namespace}/{CA_BUNDLE}: {e}"
        ))
    })?;
    cm.data.and_then(|mut d| d.remove(CA_BUNDLE_KEY)).ok_or_else(|| {
        Error::LockServer(format!(
            "ConfigMap {namespace}/{CA_BUNDLE} has no {CA_BUNDLE_KEY}"
        ))
    })
}

/// lock-server's admin token from its Secret (reading it needs `get` on that Secret).
async fn admin_token(client: &Client, namespace: &str, secret: &str) -> Result<String, Error> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let s = api.get(secret).await.map_err(|e| {
        Error::LockServer(format!(
            "the list needs lock-server's admin token, from Secret {namespace}/{secret}: {e}"
        ))
    })?;
    s.data
        .and_then(|d| d.get("token").cloned())
        .and_then(|b| String::from_utf8(b.0).ok())
        .filter(|t| !t.is_empty())
        .ok_or_else(|| Error::LockServer(format!("Secret {namespace}/{secret} has no key token")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_map_to_exit_codes() {
        assert_eq!(Error::Usage("x".into()).exit_code(), 2);
        assert_eq!(
            Error::NotFound {
                kind: "LockService",
                namespace: "n".into(),
                name: "x".into()
            }
            .exit_code(),
            2
        );
        assert_eq!(Error::Watch("x".into()).exit_code(), 4);
        assert_eq!(Error::LockServer("x".into()).exit_code(), 4);
    }
}
