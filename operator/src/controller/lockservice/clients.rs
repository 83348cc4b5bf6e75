//! The reads behind lock-server's clients file ([`crate::builders::lock_clients`] builds it): the
//! PaymentStacks that use this LockService and each one's `<stack>-lock-client` Secret, the
//! LockService's own clients Secret (`spec.lockServer.clientsSecretRef`), and the clients Secret as
//! last written (the placeholder token it keeps, and the hash of the file it holds).
//!
//! Tokens are read into [`ClientToken`]s, which never print; nothing here logs a Secret's data.

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::Api;

use crate::builders::Owner;
use crate::builders::lock_clients::{
    self, CLIENTS_ANNOTATION, ClientToken, ClientsFile, KEY_RESERVE, KEY_TOKEN, StackClient,
};
use crate::context::Context;
use crate::crd::{LockService, PaymentStack};
use crate::error::{Error, Result};
use crate::reasons::{EventNote, Reason};

/// What the clients file is built from.
#[derive(Debug, Clone, Default)]
pub struct ClientInputs {
    /// The stacks whose lock client Secret exists, with their tokens.
    pub stacks: Vec<StackClient>,
    /// Stacks that use this LockService but whose `<stack>-lock-client` Secret does not exist (yet),
    /// or is not the stack's own: left out of the file until it is.
    pub waiting: Vec<String>,
    /// `spec.lockServer.clientsSecretRef`: the text under its key, or why it cannot be read.
    pub own: Option<std::result::Result<String, String>>,
    /// The placeholder client's token kept in `<lsvc>-lock-clients`.
    pub reserve: Option<ClientToken>,
    /// The hash of the file `<lsvc>-lock-clients` holds now.
    pub written: Option<String>,
}

fn step(what: &'static str) -> impl FnOnce(kube::Error) -> Error {
    move |e| Error::step(what, e)
}

/// Whether `secret` is controlled by the object of `uid`: a Secret of the expected name that
/// someone else made is not a stack's credential.
fn controlled_by(secret: &Secret, uid: Option<&str>) -> bool {
    uid.is_some_and(|uid| {
        secret
            .owner_references()
            .iter()
            .any(|r| r.uid == uid && r.controller == Some(true))
    })
}

/// `stacks`: the PaymentStacks that use this LockService, sorted by name. A stack on its way out
/// keeps its client until it is gone: its executors may still be draining.
pub async fn observe(
    ctx: &Context,
    ls: &LockService,
    owner: &Owner,
    stacks: &[PaymentStack],
) -> Result<ClientInputs> {
    let ns = &owner.namespace;
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    let mut inputs = ClientInputs::default();
    for ps in stacks {
        let Some(stack) = Owner::of(ps) else { continue };
        let name = lock_clients::client_secret_name(&stack);
        let secret = secrets
            .get_opt(&name)
            .await
            .map_err(step("read a PaymentStack's lock client Secret"))?;
        let token = secret
            .as_ref()
            .filter(|s| controlled_by(s, ps.uid().as_deref()))
            .and_then(|s| ClientToken::from_secret(s, KEY_TOKEN));
        match token {
            Some(token) => inputs.stacks.push(StackClient {
                stack: stack.name,
                token,
            }),
            None => inputs.waiting.push(stack.name),
        }
    }
    if let Some(r) = &ls.spec.lock_server.clients_secret_ref {
        let own = secrets
            .get_opt(&r.name)
            .await
            .map_err(step("read the LockService's lock clients Secret"))?;
        inputs.own = Some(match own {
            None => Err(format!(
                "spec.lockServer.clientsSecretRef: Secret {} does not exist",
                r.name
            )),
            Some(s) => s
                .data
                .as_ref()
                .and_then(|d| d.get(&r.key))
                .ok_or_else(|| {
                    format!(
                        "spec.lockServer.clientsSecretRef: Secret {} has no key {}",
                        r.name, r.key
                    )
                })
                .and_then(|v| {
                    String::from_utf8(v.0.clone()).map_err(|_| {
                        format!(
                            "spec.lockServer.clientsSecretRef: Secret {} key {} is not UTF-8",
                            r.name, r.key
                        )
                    })
                })
                .map_err(|m| format!("{m}; lock-server keeps the clients it runs with")),
        });
    }
    let written = secrets
        .get_opt(&lock_clients::clients_secret_name(&owner.name))
        .await
        .map_err(step("read lock-server's clients Secret"))?;
    if let Some(w) = written.filter(|w| controlled_by(w, ls.uid().as_deref())) {
        inputs.reserve = ClientToken::from_secret(&w, KEY_RESERVE);
        inputs.written = w.annotations().get(CLIENTS_ANNOTATION).cloned();
    }
    Ok(inputs)
}

/// The Event of a clients file that differs from the one written before: which stacks it serves,
/// and which it waits for. Names only, never a token. Pure: the apply step logs and publishes it.
pub fn changed(file: &ClientsFile, inputs: &ClientInputs) -> Option<EventNote> {
    if inputs.written.as_deref() == Some(file.checksum.as_str()) {
        return None;
    }
    let list = |names: &[String]| {
        if names.is_empty() {
            "none".to_owned()
        } else {
            names.join(", ")
        }
    };
    let mut note = format!(
        "lock-server's clients file now lists the lock clients of PaymentStacks: {}",
        list(&file.stacks)
    );
    if !file.own.is_empty() {
        note.push_str(&format!("; own clients: {}", file.own.join(", ")));
    }
    if file.reserved_only {
        note.push_str(" (no client can use the lock API yet)");
    }
    if !inputs.waiting.is_empty() {
        note.push_str(&format!(
            "; waiting for the lock client Secret of: {}",
            inputs.waiting.join(", ")
        ));
    }
    note.push_str("; lock-server rolls to read it");
    Some(EventNote {
        reason: Reason::LockClientsChanged,
        warning: false,
        note,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Told once per new file, naming stacks and never a token.
    #[test]
    fn a_new_file_is_told_once_by_name() {
        let pay = StackClient {
            stack: "pay".into(),
            token: ClientToken::generate(),
        };
        let file =
            lock_clients::clients_file(std::slice::from_ref(&pay), None, &ClientToken::generate()).unwrap();
        let mut inputs = ClientInputs {
            stacks: vec![pay],
            waiting: vec!["pay-x".into()],
            ..ClientInputs::default()
        };
        let e = changed(&file, &inputs).expect("a new file");
        assert_eq!(e.reason, Reason::LockClientsChanged);
        assert!(
            e.note.contains("PaymentStacks: pay;")
                && e.note.contains("waiting for the lock client Secret of: pay-x"),
            "{}",
            e.note
        );
        let token: serde_json::Value = serde_json::from_str(file.text()).unwrap();
        assert!(!e.note.contains(token["clients"][0]["token"].as_str().unwrap()));
        inputs.written = Some(file.checksum.clone());
        assert_eq!(changed(&file, &inputs), None, "the same file again");
    }
}
