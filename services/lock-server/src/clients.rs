//! Lock clients: who may use the lock API when a clients file is configured (`--clients-file`,
//! `DLOCK_CLIENTS_FILE`; docs/lock-api.md "Authentication").
//!
//! ```json
//! {"clients": [{"name": "payments", "token": "<secret, at least 32 bytes>",
//!               "keyPrefixes": ["account:"], "ownerPrefixes": ["payments-"],
//!               "operations": ["lock", "read", "watch"]}]}
//! ```
//!
//! Each client has a bearer token, the key prefixes it may touch, the owner id prefixes it may open
//! sessions for (default: its name) and the operations it may run. No two clients' owner prefixes
//! overlap (neither is a prefix of the other), so every session belongs to exactly one client: that
//! is what lets lock-server refuse a client the sessions and grants of another.
//!
//! The file is checked whole at start-up; a bad one stops the server with a message naming the client
//! and the field, never a token.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;
use subtle::ConstantTimeEq;

/// Shortest accepted client token, in bytes: 256 bits of a random token's text and more.
pub const MIN_TOKEN_BYTES: usize = 32;
/// Longest client name: it is a metrics label value and a log field.
pub const MAX_NAME_LEN: usize = 64;
/// The `client` label of refusals no configured client can be charged with.
pub const UNKNOWN_CLIENT: &str = "unknown";

/// What a client may do; each lock and session route needs exactly one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Operation {
    /// Open, heartbeat and close sessions; acquire, renew and release locks.
    Lock,
    /// `GET /v1/locks/{key}`.
    Read,
    /// `GET /v1/locks/{key}/watch`.
    Watch,
    /// `GET /v1/locks` (the listing; the admin token keeps working there too).
    List,
}

impl Operation {
    pub const ALL: [Operation; 4] = [
        Operation::Lock,
        Operation::Read,
        Operation::Watch,
        Operation::List,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Lock => "lock",
            Operation::Read => "read",
            Operation::Watch => "watch",
            Operation::List => "list",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|o| o.as_str() == s)
    }
}

impl std::fmt::Display for Operation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One configured client. Its token never leaves this module: [`Clients::authenticate`] compares it.
#[derive(Clone)]
pub struct Client {
    name: String,
    token: String,
    key_prefixes: Vec<String>,
    owner_prefixes: Vec<String>,
    operations: BTreeSet<Operation>,
}

// Hand-written so that the token never reaches a log.
impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("name", &self.name)
            .field("token", &"<redacted>")
            .field("key_prefixes", &self.key_prefixes)
            .field("owner_prefixes", &self.owner_prefixes)
            .field("operations", &self.operations)
            .finish()
    }
}

impl Client {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn may(&self, op: Operation) -> bool {
        self.operations.contains(&op)
    }

    pub fn operations(&self) -> impl Iterator<Item = Operation> + '_ {
        self.operations.iter().copied()
    }

    /// `key` starts with one of the client's key prefixes.
    pub fn owns_key(&self, key: &str) -> bool {
        self.key_prefixes.iter().any(|p| key.starts_with(p.as_str()))
    }

    /// `owner_id` starts with one of the client's owner prefixes: sessions (and grants) of that
    /// owner belong to this client and to no other.
    pub fn owns_owner(&self, owner_id: &str) -> bool {
        self.owner_prefixes
            .iter()
            .any(|p| owner_id.starts_with(p.as_str()))
    }

    pub fn key_prefixes(&self) -> &[String] {
        &self.key_prefixes
    }

    pub fn owner_prefixes(&self) -> &[String] {
        &self.owner_prefixes
    }
}

/// Every configured client.
#[derive(Debug, Clone)]
pub struct Clients {
    clients: Vec<Arc<Client>>,
}

/// Why a clients file was refused. Messages name the client and the field, never a token.
#[derive(Debug, thiserror::Error)]
pub enum ClientsError {
    #[error("cannot read the clients file {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the clients file is not valid: {0}")]
    Shape(String),
    #[error("the clients file is not valid: client {client}: {field}: {message}")]
    Field {
        /// The client's name as given, or its position (`#2`) when it has none.
        client: String,
        field: &'static str,
        message: String,
    },
}

/// The file as written; every client is read on its own, so that an error can name it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileShape {
    clients: Vec<serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct FileClient {
    name: String,
    // Read as a bare value and checked by hand: serde's type errors quote the value they got.
    token: serde_json::Value,
    key_prefixes: Vec<String>,
    #[serde(default)]
    owner_prefixes: Option<Vec<String>>,
    operations: Vec<String>,
}

fn field(client: &str, field: &'static str, message: impl Into<String>) -> ClientsError {
    ClientsError::Field {
        client: client.to_owned(),
        field,
        message: message.into(),
    }
}

/// A prefix of keys or owner ids: non-empty, no control characters or surrounding spaces, at most
/// as long as what it must be a prefix of.
fn check_prefixes(
    client: &str,
    name: &'static str,
    prefixes: &[String],
    max: usize,
) -> Result<(), ClientsError> {
    if prefixes.is_empty() {
        return Err(field(client, name, "must list at least one prefix"));
    }
    for p in prefixes {
        let bad = p.is_empty()
            || p.chars().count() > max
            || p.chars().any(char::is_control)
            || p.starts_with(char::is_whitespace);
        if bad {
            return Err(field(
                client,
                name,
                format!(
                    "{p:?} is not a prefix: 1..={max} characters without control characters or a leading space"
                ),
            ));
        }
    }
    Ok(())
}

impl Clients {
    /// Reads and checks the clients file at `path`.
    pub fn from_file(path: &Path) -> Result<Self, ClientsError> {
        let text = std::fs::read_to_string(path).map_err(|source| ClientsError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&text)
    }

    /// Parses and checks a clients file's text (see the module documentation).
    pub fn parse(text: &str) -> Result<Self, ClientsError> {
        // serde_json's syntax errors give a position, never the text around it.
        let shape: FileShape = serde_json::from_str(text).map_err(|e| ClientsError::Shape(e.to_string()))?;
        if shape.clients.is_empty() {
            return Err(ClientsError::Shape(
                "`clients` is empty: with a clients file nobody else can use the lock API".into(),
            ));
        }
        let mut clients: Vec<Arc<Client>> = Vec::with_capacity(shape.clients.len());
        for (i, value) in shape.clients.into_iter().enumerate() {
            let label = value
                .get("name")
                .and_then(serde_json::Value::as_str)
                .map_or_else(|| format!("#{}", i + 1), |n| format!("{n:?}"));
            let c: FileClient = serde_json::from_value(value).map_err(|e| ClientsError::Field {
                client: label.clone(),
                field: "(entry)",
                message: e.to_string(),
            })?;
            let client = Self::check(&label, c)?;
            if let Some(other) = clients.iter().find(|o| o.name == client.name) {
                return Err(field(&label, "name", format!("{:?} is given twice", other.name)));
            }
            if let Some(other) = clients
                .iter()
                .find(|o| token_matches(client.token.as_bytes(), o.token.as_bytes()))
            {
                return Err(field(
                    &label,
                    "token",
                    format!(
                        "the same token as client {:?}; every client needs its own",
                        other.name
                    ),
                ));
            }
            for other in &clients {
                for mine in &client.owner_prefixes {
                    if let Some(theirs) = other
                        .owner_prefixes
                        .iter()
                        .find(|t| mine.starts_with(t.as_str()) || t.starts_with(mine.as_str()))
                    {
                        return Err(field(
                            &label,
                            "ownerPrefixes",
                            format!(
                                "{mine:?} overlaps {theirs:?} of client {:?} (one is a prefix of the other), so a session could belong to both; make them disjoint",
                                other.name
                            ),
                        ));
                    }
                }
            }
            clients.push(Arc::new(client));
        }
        Ok(Self { clients })
    }

    fn check(label: &str, c: FileClient) -> Result<Client, ClientsError> {
        let name_ok = !c.name.is_empty()
            && c.name.len() <= MAX_NAME_LEN
            && c.name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
        if !name_ok {
            return Err(field(
                label,
                "name",
                format!("must be 1..={MAX_NAME_LEN} characters of A-Z a-z 0-9 - _ ."),
            ));
        }
        if c.name == UNKNOWN_CLIENT {
            return Err(field(
                label,
                "name",
                format!(
                    "{UNKNOWN_CLIENT:?} is reserved (it counts refusals of requests without a known token)"
                ),
            ));
        }
        let token = match c.token {
            serde_json::Value::String(t) => t,
            _ => return Err(field(label, "token", "must be a string")),
        };
        if token.len() < MIN_TOKEN_BYTES {
            return Err(field(
                label,
                "token",
                format!(
                    "is {} bytes long; at least {MIN_TOKEN_BYTES} are required",
                    token.len()
                ),
            ));
        }
        // It travels in an HTTP header: visible ASCII only (so no surrounding whitespace either).
        if !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(field(
                label,
                "token",
                "must be visible ASCII characters (no spaces, no control characters)",
            ));
        }
        check_prefixes(
            label,
            "keyPrefixes",
            &c.key_prefixes,
            dlock_common::validate::MAX_KEY_LEN,
        )?;
        let owner_prefixes = c.owner_prefixes.unwrap_or_else(|| vec![c.name.clone()]);
        check_prefixes(
            label,
            "ownerPrefixes",
            &owner_prefixes,
            dlock_common::validate::MAX_OWNER_LEN,
        )?;
        if c.operations.is_empty() {
            return Err(field(
                label,
                "operations",
                "must list at least one of lock, read, watch, list",
            ));
        }
        let mut operations = BTreeSet::new();
        for op in &c.operations {
            let op = Operation::parse(op).ok_or_else(|| {
                field(
                    label,
                    "operations",
                    format!("unknown operation {op:?} (one of lock, read, watch, list)"),
                )
            })?;
            operations.insert(op);
        }
        Ok(Client {
            name: c.name,
            token,
            key_prefixes: c.key_prefixes,
            owner_prefixes,
            operations,
        })
    }

    /// The client whose token `presented` is. Every client's token is compared, in constant time in
    /// its contents, whether or not an earlier one matched.
    pub fn authenticate(&self, presented: &[u8]) -> Option<&Arc<Client>> {
        let mut found = None;
        for c in &self.clients {
            if token_matches(presented, c.token.as_bytes()) && found.is_none() {
                found = Some(c);
            }
        }
        found
    }

    /// The configured names, in file order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.clients.iter().map(|c| c.name.as_str())
    }

    /// The client whose token equals `token` (a start-up check against the admin token).
    pub fn holding_token(&self, token: &str) -> Option<&str> {
        self.authenticate(token.as_bytes()).map(|c| c.name.as_str())
    }
}

/// Constant-time in the token's contents (only a length mismatch returns early, which reveals the
/// length and nothing else). Here rather than in `auth`, which builds on this module: the admin's
/// token is compared the same way.
pub(crate) fn token_matches(presented: &[u8], expected: &[u8]) -> bool {
    !expected.is_empty() && bool::from(presented.ct_eq(expected))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const T1: &str = "payments-token-0123456789abcdef0123456789";
    const T2: &str = "reports-token-0123456789abcdef0123456789ab";

    fn payments() -> serde_json::Value {
        json!({"name": "payments", "token": T1, "keyPrefixes": ["account:"],
               "ownerPrefixes": ["payments-"], "operations": ["lock", "read", "watch"]})
    }

    fn reports() -> serde_json::Value {
        json!({"name": "reports", "token": T2, "keyPrefixes": ["account:", "report:"],
               "operations": ["read", "list"]})
    }

    fn parse(clients: Vec<serde_json::Value>) -> Result<Clients, ClientsError> {
        Clients::parse(&json!({ "clients": clients }).to_string())
    }

    /// The refusal's text: it names the client and the field, and never a token.
    fn refused(clients: Vec<serde_json::Value>) -> String {
        let e = parse(clients).expect_err("must be refused").to_string();
        assert!(!e.contains(T1) && !e.contains(T2), "a token leaked: {e}");
        e
    }

    fn with(mut v: serde_json::Value, key: &str, value: serde_json::Value) -> serde_json::Value {
        v[key] = value;
        v
    }

    #[test]
    fn a_good_file_gives_each_client_its_rights() {
        let c = parse(vec![payments(), reports()]).unwrap();
        let p = c.authenticate(T1.as_bytes()).unwrap();
        assert_eq!(p.name(), "payments");
        assert!(p.may(Operation::Lock) && p.may(Operation::Watch) && !p.may(Operation::List));
        assert!(p.owns_key("account:42") && !p.owns_key("report:1") && !p.owns_key("acc"));
        assert!(p.owns_owner("payments-1") && !p.owns_owner("payment") && !p.owns_owner("reports"));
        let r = c.authenticate(T2.as_bytes()).unwrap();
        assert_eq!(r.name(), "reports");
        assert_eq!(
            r.owner_prefixes(),
            ["reports"],
            "ownerPrefixes defaults to the name"
        );
        assert!(c.authenticate(b"").is_none());
        assert!(c.authenticate(&T1.as_bytes()[1..]).is_none());
        assert!(c.authenticate(format!("{T1}x").as_bytes()).is_none());
        assert_eq!(c.names().collect::<Vec<_>>(), ["payments", "reports"]);
    }

    #[test]
    fn debug_never_shows_a_token() {
        let c = parse(vec![payments(), reports()]).unwrap();
        let text = format!("{c:?}");
        assert!(!text.contains(T1) && !text.contains(T2), "{text}");
        assert!(text.contains("payments") && text.contains("<redacted>"), "{text}");
    }

    #[test]
    fn each_bad_field_is_refused_naming_the_client_and_the_field() {
        let cases: Vec<(Vec<serde_json::Value>, &[&str])> = vec![
            (
                vec![with(payments(), "tokne", json!("x"))],
                &["\"payments\"", "unknown field `tokne`"],
            ),
            (
                vec![with(payments(), "operations", json!(["lock", "write"]))],
                &["\"payments\"", "operations", "unknown operation \"write\""],
            ),
            (
                vec![with(payments(), "operations", json!([]))],
                &["\"payments\"", "operations"],
            ),
            (vec![with(payments(), "name", json!(""))], &["name", "1..="]),
            (
                vec![with(payments(), "name", json!("unknown"))],
                &["name", "reserved"],
            ),
            (
                vec![payments(), with(reports(), "name", json!("payments"))],
                &["name", "given twice"],
            ),
            (
                vec![payments(), with(reports(), "token", json!(T1))],
                &["\"reports\"", "token", "same token as client \"payments\""],
            ),
            (
                vec![with(payments(), "token", json!("short-but-secret"))],
                &["\"payments\"", "token", "16 bytes long; at least 32"],
            ),
            (
                vec![with(payments(), "token", json!(12_345))],
                &["\"payments\"", "token", "must be a string"],
            ),
            (
                vec![with(payments(), "token", json!(format!(" {T1}")))],
                &["\"payments\"", "token", "visible ASCII"],
            ),
            (
                vec![with(payments(), "keyPrefixes", json!([]))],
                &["\"payments\"", "keyPrefixes", "at least one prefix"],
            ),
            (
                vec![with(payments(), "keyPrefixes", json!([""]))],
                &["\"payments\"", "keyPrefixes"],
            ),
            (
                vec![with(payments(), "ownerPrefixes", json!([]))],
                &["\"payments\"", "ownerPrefixes"],
            ),
            (
                vec![
                    payments(),
                    with(reports(), "ownerPrefixes", json!(["payments-batch"])),
                ],
                &[
                    "\"reports\"",
                    "ownerPrefixes",
                    "\"payments-batch\" overlaps \"payments-\" of client \"payments\"",
                ],
            ),
            (
                // The default (the name) counts: "pay" is a prefix of "payments-".
                vec![
                    payments(),
                    with(
                        with(reports(), "name", json!("pay")),
                        "ownerPrefixes",
                        json!(null),
                    ),
                ],
                &["\"pay\"", "ownerPrefixes", "overlaps"],
            ),
        ];
        for (clients, words) in cases {
            let e = refused(clients.clone());
            for w in words {
                assert!(e.contains(w), "{w:?} not in {e:?} (for {clients:?})");
            }
        }
    }

    #[test]
    fn the_file_itself_must_have_the_shape() {
        for (text, word) in [
            ("", "EOF"),
            ("{\"clients\": []}", "`clients` is empty"),
            ("{\"clients\": [], \"extra\": 1}", "unknown field `extra`"),
            ("[]", "expected struct FileShape"),
            ("{\"clients\": {}}", "invalid type: map"),
        ] {
            let e = Clients::parse(text).expect_err(text).to_string();
            assert!(e.contains(word), "{word:?} not in {e:?}");
        }
        let e = Clients::parse(&format!("{{\"clients\": [{{\"token\": \"{T1}\"}}]}}"))
            .expect_err("no name")
            .to_string();
        assert!(e.contains("client #1") && !e.contains(T1), "{e}");
    }
}
