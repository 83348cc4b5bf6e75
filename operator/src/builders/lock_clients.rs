//! Lock clients (docs/security.md, "Lock clients in a cluster"): who may use a LockService's lock
//! API, as lock-server's clients file says (`DLOCK_CLIENTS_FILE`, services/lock-server/src/clients.rs).
//!
//! - Secret `<stack>-lock-client` (one per PaymentStack): its executors' token, key `token`. Created
//!   once with a random token and never rewritten by reconcile, like the other generated
//!   credentials; the executors read it by `secretKeyRef` (`DLOCK_LOCK_TOKEN`).
//! - Secret `<lsvc>-lock-clients` (one per LockService): the clients file, key `clients.json`, built
//!   on every reconcile from the stacks' Secrets (and the LockService's own clients, if it names a
//!   Secret of them), mounted read-only into lock-server. lock-server reads the file only at
//!   start-up, so its pod template carries a hash of the file ([`CLIENTS_ANNOTATION`]): a new set of
//!   clients rolls it.
//!
//! Each stack's executors open their sessions with owner ids `<stack>/<pod name>` and their client
//! owns the prefix `<stack>/`. Object names cannot contain `/` (owner ids may: any printable
//! character), so `<a>/` is a prefix of `<b>/` only when `a == b`: the stacks `pay` and `pay-x` get
//! `pay/` and `pay-x/`, and no session can belong to two stacks.
//!
//! Nothing here ever shows a token: [`ClientToken`] and [`ClientsFile`] print `<redacted>`.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{
    EnvVar, PodSpec, PodTemplateSpec, Secret, SecretVolumeSource, Volume, VolumeMount,
};
use serde_json::{Value, json};

use super::credentials::random_token;
use super::{LOCK_SERVER, Owner, PAYOUT_EXECUTOR, env, pod_name_env, secret_env, security, short_hash};

/// Key of the token in `<stack>-lock-client`.
pub const KEY_TOKEN: &str = "token";
/// Key of the clients file in `<lsvc>-lock-clients` (and the default key of a LockService's own
/// clients Secret).
pub const KEY_FILE: &str = "clients.json";
/// Key, in `<lsvc>-lock-clients`, of the token of the placeholder client a file without any other
/// client gets ([`clients_file`]); kept so that the file, and lock-server, stay as they are.
pub const KEY_RESERVE: &str = "reserve-token";
/// lock-server's pod-template annotation: a hash of the clients file it was started with.
pub const CLIENTS_ANNOTATION: &str = "dlock.dev/lock-clients";
/// Where lock-server's pods find the clients file.
pub const CLIENTS_VOLUME: &str = "lock-clients";
pub const CLIENTS_DIR: &str = "/etc/dlock/lock-clients";
/// lock-server reads the file's path here (services/lock-server/src/config.rs).
pub const CLIENTS_FILE_ENV: &str = "DLOCK_CLIENTS_FILE";
/// payout-executor reads its lock client token here (services/payout-executor/src/config.rs).
pub const LOCK_TOKEN_ENV: &str = "DLOCK_LOCK_TOKEN";
/// payout-executor's owner id (its workers append `-w<n>`).
pub const OWNER_ID_ENV: &str = "PAYOUT_EXECUTOR_OWNER_ID";
/// The pod's name (downward API), only for the kubelet to expand into [`OWNER_ID_ENV`].
pub const POD_NAME_ENV: &str = "POD_NAME";
/// Ends every stack's owner prefix; no object name contains it.
pub const OWNER_SEPARATOR: char = '/';
/// What the executors lock: `account:<id>` (`dlock_common::grant::account_key`), and nothing else.
pub const KEY_PREFIXES: [&str; 1] = ["account:"];
/// What the executors do on the lock API: sessions, acquire, renew, release. They never read or
/// watch a key (payout-executor calls nothing else of `dlock-client`).
pub const OPERATIONS: [&str; 1] = ["lock"];
/// The placeholder client's name and owner prefix: no stack's client is named so, and no stack's
/// owner prefix starts with `/`.
pub const RESERVE_CLIENT: &str = "reserved";
const RESERVE_OWNER_PREFIX: &str = "/";
/// Prefix of the clients named after stacks (a stack may be named `unknown`, which lock-server
/// reserves for itself).
const STACK_CLIENT_PREFIX: &str = "paymentstack-";
/// lock-server's shortest accepted token.
pub const MIN_TOKEN_BYTES: usize = 32;

/// A lock client token. `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct ClientToken(String);

impl std::fmt::Debug for ClientToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClientToken(<redacted>)")
    }
}

impl ClientToken {
    /// 48 random alphanumerics (~285 bits), in lock-server's shape (32 or more visible ASCII bytes).
    pub fn generate() -> Self {
        Self(random_token(48))
    }

    /// The token under `key` of `secret`, when it has lock-server's shape.
    pub fn from_secret(secret: &Secret, key: &str) -> Option<Self> {
        let bytes = &secret.data.as_ref()?.get(key)?.0;
        let text = std::str::from_utf8(bytes).ok()?;
        (text.len() >= MIN_TOKEN_BYTES && text.bytes().all(|b| b.is_ascii_graphic()))
            .then(|| Self(text.to_owned()))
    }

    fn bytes(&self) -> ByteString {
        ByteString(self.0.as_bytes().to_vec())
    }
}

/// `<stack>-lock-client`.
pub fn client_secret_name(stack: &Owner) -> String {
    stack.child("lock-client")
}

/// A fresh `<stack>-lock-client` with a random token (created once, never rewritten).
pub fn client_secret(stack: &Owner) -> Secret {
    Secret {
        metadata: stack.meta(client_secret_name(stack), PAYOUT_EXECUTOR),
        type_: Some("Opaque".into()),
        data: Some(BTreeMap::from([(
            KEY_TOKEN.to_owned(),
            ClientToken::generate().bytes(),
        )])),
        ..Secret::default()
    }
}

/// The name of a stack's client in the clients file (lock-server's metrics label and log field).
pub fn client_name(stack: &str) -> String {
    format!("{STACK_CLIENT_PREFIX}{stack}")
}

/// The owner ids a stack's client owns: `<stack>/`.
pub fn owner_prefix(stack: &str) -> String {
    format!("{stack}{OWNER_SEPARATOR}")
}

/// The executors' owner id, `<stack>/<pod name>`, as the kubelet expands it from [`POD_NAME_ENV`].
/// At most 36 + 1 + 63 characters, with `-w64` well inside lock-server's 128.
pub fn executor_owner_id(stack: &str) -> String {
    format!("{}$({POD_NAME_ENV})", owner_prefix(stack))
}

/// What payout-executor needs to be a stack's lock client: its token by `secretKeyRef`, and an owner
/// id under the stack's prefix (the pod's name, from the downward API, makes it unique per pod).
pub fn executor_env(stack: &str, secret: &str) -> Vec<EnvVar> {
    vec![
        secret_env(LOCK_TOKEN_ENV, secret, KEY_TOKEN),
        pod_name_env(POD_NAME_ENV),
        // After POD_NAME: the kubelet expands `$(NAME)` only from variables defined before.
        env(OWNER_ID_ENV, executor_owner_id(stack)),
    ]
}

/// `<lsvc>-lock-clients`.
pub fn clients_secret_name(lock_service: &str) -> String {
    format!("{lock_service}-lock-clients")
}

/// One stack's client, as its `<stack>-lock-client` Secret says.
#[derive(Debug, Clone, PartialEq)]
pub struct StackClient {
    pub stack: String,
    pub token: ClientToken,
}

/// Why a clients file could not be built. Names clients and fields, never a token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ClientsError(pub String);

/// A built clients file. `Debug` never shows its text (it holds every client's token).
#[derive(Clone, PartialEq)]
pub struct ClientsFile {
    text: String,
    /// The hash lock-server's pod template carries.
    pub checksum: String,
    /// The stacks whose clients it lists, by name.
    pub stacks: Vec<String>,
    /// The names of the LockService's own clients it lists.
    pub own: Vec<String>,
    /// Only the placeholder client: nobody can use the lock API.
    pub reserved_only: bool,
    reserve: ClientToken,
}

impl std::fmt::Debug for ClientsFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientsFile")
            .field("text", &"<redacted>")
            .field("checksum", &self.checksum)
            .field("stacks", &self.stacks)
            .field("own", &self.own)
            .field("reserved_only", &self.reserved_only)
            .finish()
    }
}

impl ClientsFile {
    /// The file's text, for the Secret only.
    pub fn text(&self) -> &str {
        &self.text
    }
}

/// The owner prefixes a client entry owns (lock-server's default: its name).
fn owner_prefixes_of(entry: &Value) -> Vec<String> {
    match entry.get("ownerPrefixes") {
        Some(Value::Array(list)) => list
            .iter()
            .filter_map(|p| p.as_str().map(str::to_owned))
            .collect(),
        _ => entry
            .get("name")
            .and_then(Value::as_str)
            .map(|n| vec![n.to_owned()])
            .unwrap_or_default(),
    }
}

/// The clients of a LockService's own Secret (`spec.lockServer.clientsSecretRef`), in the clients
/// file's format. Only what the merge needs is checked here (each entry an object with a name, its
/// owner prefixes strings); lock-server checks the rest at start-up.
fn own_clients(text: &str) -> Result<Vec<Value>, ClientsError> {
    // serde_json's syntax errors give a position, never the text around it.
    let value: Value = serde_json::from_str(text)
        .map_err(|e| ClientsError(format!("not a clients file ({{\"clients\": [...]}}): {e}")))?;
    let Some(Value::Array(clients)) = value.get("clients") else {
        return Err(ClientsError(
            "not a clients file: it needs a `clients` list".into(),
        ));
    };
    for (i, c) in clients.iter().enumerate() {
        let named = c
            .get("name")
            .and_then(Value::as_str)
            .is_some_and(|n| !n.is_empty());
        if !named {
            return Err(ClientsError(format!("client #{}: no name", i + 1)));
        }
        if let Some(p) = c.get("ownerPrefixes")
            && !p.as_array().is_some_and(|l| l.iter().all(Value::is_string))
        {
            return Err(ClientsError(format!(
                "client #{}: ownerPrefixes must be a list of strings",
                i + 1
            )));
        }
    }
    Ok(clients.clone())
}

/// The clients file of a LockService: one client per stack (in name order), then the LockService's
/// own clients (`own`, the text of its clients Secret), each as given. A file without any client
/// gets a placeholder one instead, whose token (`reserve`) nobody is given: lock-server refuses an
/// empty file, and no file at all would open the lock API to anyone who can reach it.
///
/// Refused (nothing is written, lock-server keeps its file): own clients that cannot be read, a
/// name given twice, or owner prefixes that overlap (one a prefix of another), which lock-server
/// would refuse at start-up.
pub fn clients_file(
    stacks: &[StackClient],
    own: Option<&str>,
    reserve: &ClientToken,
) -> Result<ClientsFile, ClientsError> {
    let mut stacks: Vec<&StackClient> = stacks.iter().collect();
    stacks.sort_by(|a, b| a.stack.cmp(&b.stack));
    let mut entries: Vec<Value> = stacks
        .iter()
        .map(|s| {
            json!({
                "name": client_name(&s.stack),
                "token": s.token.0,
                "keyPrefixes": KEY_PREFIXES,
                "ownerPrefixes": [owner_prefix(&s.stack)],
                "operations": OPERATIONS,
            })
        })
        .collect();
    let own = match own {
        Some(text) => own_clients(text)?,
        None => Vec::new(),
    };
    let own_names: Vec<String> = own
        .iter()
        .filter_map(|c| c.get("name").and_then(Value::as_str).map(str::to_owned))
        .collect();
    entries.extend(own);
    let reserved_only = entries.is_empty();
    if reserved_only {
        entries.push(json!({
            "name": RESERVE_CLIENT,
            "token": reserve.0,
            "keyPrefixes": KEY_PREFIXES,
            "ownerPrefixes": [RESERVE_OWNER_PREFIX],
            "operations": ["read"],
        }));
    }
    // What lock-server would refuse at start-up, refused here instead, naming the clients.
    let name = |e: &Value| {
        e.get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    for (i, a) in entries.iter().enumerate() {
        for b in &entries[..i] {
            if name(a) == name(b) {
                return Err(ClientsError(format!("client {:?} is given twice", name(a))));
            }
            for pa in owner_prefixes_of(a) {
                if let Some(pb) = owner_prefixes_of(b)
                    .into_iter()
                    .find(|pb| pa.starts_with(pb.as_str()) || pb.starts_with(pa.as_str()))
                {
                    return Err(ClientsError(format!(
                        "the owner prefix {pa:?} of client {:?} overlaps {pb:?} of client {:?} (one is a prefix of the other)",
                        name(a),
                        name(b)
                    )));
                }
            }
        }
    }
    let text = json!({ "clients": entries }).to_string();
    Ok(ClientsFile {
        checksum: short_hash(text.as_bytes()),
        text,
        stacks: stacks.iter().map(|s| s.stack.clone()).collect(),
        own: own_names,
        reserved_only,
        reserve: reserve.clone(),
    })
}

/// `<lsvc>-lock-clients`: the file, and the placeholder's token (kept whether it is used or not).
/// Applied on every reconcile, before lock-server's Deployment.
pub fn clients_secret(lock_service: &Owner, file: &ClientsFile) -> Secret {
    let mut metadata = lock_service.meta(clients_secret_name(&lock_service.name), LOCK_SERVER);
    // The hash of what it holds, so that the next reconcile can tell a changed file.
    metadata.annotations = Some(BTreeMap::from([(
        CLIENTS_ANNOTATION.to_owned(),
        file.checksum.clone(),
    )]));
    Secret {
        metadata,
        type_: Some("Opaque".into()),
        data: Some(BTreeMap::from([
            (KEY_FILE.to_owned(), ByteString(file.text.as_bytes().to_vec())),
            (KEY_RESERVE.to_owned(), file.reserve.bytes()),
        ])),
        ..Secret::default()
    }
}

/// Mounts the clients file into lock-server's pod (read-only, mode 0440 for the pod's group),
/// names it in [`CLIENTS_FILE_ENV`], and puts its hash in the pod template's annotations.
pub fn serve_clients(template: &mut PodTemplateSpec, lock_service: &str, file: &ClientsFile) {
    template
        .metadata
        .get_or_insert_with(Default::default)
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(CLIENTS_ANNOTATION.into(), file.checksum.clone());
    let Some(pod) = template.spec.as_mut() else {
        return;
    };
    mount_clients(pod, lock_service);
}

fn mount_clients(pod: &mut PodSpec, lock_service: &str) {
    // The Secret's files belong to the pod's fsGroup (mode 0440): lock-server's user reads them,
    // nobody else in the pod would.
    pod.security_context
        .get_or_insert_with(Default::default)
        .fs_group
        .get_or_insert(security::NONROOT_UID);
    pod.volumes.get_or_insert_with(Vec::new).push(Volume {
        name: CLIENTS_VOLUME.into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(clients_secret_name(lock_service)),
            items: Some(vec![k8s_openapi::api::core::v1::KeyToPath {
                key: KEY_FILE.into(),
                path: KEY_FILE.into(),
                mode: None,
            }]),
            default_mode: Some(0o440),
            ..SecretVolumeSource::default()
        }),
        ..Volume::default()
    });
    if let Some(c) = pod.containers.first_mut() {
        c.volume_mounts.get_or_insert_with(Vec::new).push(VolumeMount {
            name: CLIENTS_VOLUME.into(),
            mount_path: CLIENTS_DIR.into(),
            read_only: Some(true),
            ..VolumeMount::default()
        });
        c.env
            .get_or_insert_with(Vec::new)
            .push(env(CLIENTS_FILE_ENV, format!("{CLIENTS_DIR}/{KEY_FILE}")));
    }
}
